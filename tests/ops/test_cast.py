"""cast: every pair of the device's float types, rounded once to nearest (numpy's
astype is the reference), awkward sizes with offsets and canaries; PyTorch's softmax
dtype= through it."""

import numpy as np
import pytest

import clnn
from conftest import AWKWARD, Guarded, float_dtypes, guarded_input

RNG = np.random.default_rng(8)


@pytest.mark.parametrize("src", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("dst", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("n", AWKWARD[:-1], ids=lambda n: f"n{n}")
def test_cast_rounds_like_numpy(dev, src, dst, n):
    x = (RNG.standard_normal(n) * 10.0 ** RNG.integers(-8, 8, n)).astype(src)
    if n > 2:
        x[:3] = [np.inf, -np.inf, np.nan]
    out = Guarded(dev, (n,), dst)
    assert clnn.cast(guarded_input(dev, x), dst, out=out.view) is out.view
    np.testing.assert_array_equal(out.check(), x.astype(dst))


def test_same_dtype_in_place_and_errors(dev):
    x = clnn.asarray(RNG.standard_normal((3, 4)).astype(np.float32))
    before = x.get()
    assert clnn.cast(x, np.float32, out=x) is x
    np.testing.assert_array_equal(x.get(), before)
    with pytest.raises(clnn.DTypeError):
        clnn.cast(x, np.int32)
    if dev.facts.fp64:
        with pytest.raises(clnn.ShapeError):
            clnn.cast(x, np.float64, out=clnn.zeros((4, 3), np.float64))
        y = clnn.cast(x, np.float64)
        assert y.dtype == np.float64 and np.array_equal(y.get(), before.astype(np.float64))
        z = RNG.standard_normal((2, 7)).astype(np.float32)
        got = clnn.log_softmax(clnn.asarray(z), axis=0, dtype=np.float64)
        zz = z.astype(np.float64)
        want = zz - np.log(np.exp(zz).sum(0, keepdims=True))
        assert got.dtype == np.float64
        np.testing.assert_allclose(got.get(), want, rtol=1e-12, atol=1e-12)
