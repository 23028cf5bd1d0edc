"""dropout: the mask is the host's dropout_mask bit for bit, keeps 1 - p of the elements,
changes with the key, and its backward (the same call on the gradient) is exact."""

import numpy as np
import pytest

import clnn
from conftest import AWKWARD, Guarded, float_dtypes, guarded_input

RNG = np.random.default_rng(99)
DTYPES = pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)


@DTYPES
@pytest.mark.parametrize("n", AWKWARD[:-1] + [4099], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_dropout_applies_the_host_mask(dev, dtype, n, p):
    x = RNG.standard_normal(n).astype(dtype)
    key = clnn.dropout_key(5, 2, 11)
    out = Guarded(dev, (n,), dtype)
    clnn.dropout(guarded_input(dev, x), p, key, out=out.view)
    mask = clnn.dropout_mask((n,), p, key)
    # one multiplication, rounded once, in the kernel's arithmetic type
    acc = np.float64 if dtype == np.float64 else np.float32
    want = (x.astype(acc) * mask.astype(acc)).astype(dtype)
    np.testing.assert_array_equal(out.check(), want)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9])
def test_keep_rate_and_independence_of_keys(p):
    n = 200_000
    masks = [clnn.dropout_mask((n,), p, clnn.dropout_key(1, layer, step))
             for layer, step in ((0, 0), (0, 1), (1, 0))]
    sigma = np.sqrt(p * (1 - p) / n)
    for m in masks:
        assert abs((m == 0).mean() - p) < 5 * sigma
        assert np.all((m == 0) | (m == 1 / (1 - p)))
    # different steps and layers: independent masks (agreement as for independent draws)
    for a, b in ((0, 1), (0, 2), (1, 2)):
        agree = ((masks[a] == 0) == (masks[b] == 0)).mean()
        want = p * p + (1 - p) * (1 - p)
        assert abs(agree - want) < 5 * np.sqrt(want * (1 - want) / n)
    # neighbouring elements are not correlated
    d = (masks[0] == 0).astype(np.float64)
    assert abs(np.corrcoef(d[:-1], d[1:])[0, 1]) < 5 / np.sqrt(n)


def test_backward_is_the_same_mask_and_in_place_works(dev):
    x = RNG.standard_normal((6, 7)).astype(np.float32)
    dy = RNG.standard_normal((6, 7)).astype(np.float32)
    key = clnn.dropout_key(0, 0, 3)
    out = clnn.dropout(clnn.asarray(x), 0.4, key).get()
    DY = clnn.asarray(dy)
    assert clnn.dropout(DY, 0.4, key, out=DY) is DY          # in place
    dx = DY.get()
    # d out / d x = the mask: dx = dy where x was kept (scaled), 0 where dropped
    kept = out != 0
    np.testing.assert_array_equal(dx[~kept], 0)
    np.testing.assert_allclose(dx[kept] / dy[kept], out[kept] / x[kept], rtol=1e-6)
    assert clnn.dropout_key(1, 2, 3) != clnn.dropout_key(1, 3, 2)


def test_nan_stays_nan_like_pytorch(dev):
    x = np.full(64, np.nan, np.float32)
    assert np.all(np.isnan(clnn.dropout(clnn.asarray(x), 0.5, 7).get()))


def test_bad_arguments(dev):
    x = clnn.zeros((3, 4))
    for p in (1.0, -0.1, float("nan"), "0.5", None):
        with pytest.raises(clnn.ArgumentError):
            clnn.dropout(x, p, 1)
    for key in (-1, 2 ** 64, 1.5, True, None):
        with pytest.raises(clnn.ArgumentError):
            clnn.dropout(x, 0.5, key)
    with pytest.raises(clnn.ShapeError):
        clnn.dropout(x, 0.5, 1, out=clnn.zeros((4, 3)))


def test_key_at_shifts_the_mask(dev):
    """dropout_key_at(key, s) gives key's mask from element s on, on the device as on
    the host: how a data-parallel rank draws its shard's part of a global batch."""
    key, p = clnn.dropout_key(7, 2, 11), 0.3
    whole = clnn.dropout_mask((1000,), p, key)
    for start in (0, 1, 333, 999):
        shifted = clnn.dropout_key_at(key, start)
        np.testing.assert_array_equal(clnn.dropout_mask((1000 - start,), p, shifted),
                                      whole[start:])
        x = np.ones(1000 - start, np.float32)
        got = clnn.dropout(clnn.asarray(x), p, shifted).get()
        np.testing.assert_array_equal(got, whole[start:].astype(np.float32))
    # the shift wraps around 2**64 like the kernel's ulong arithmetic
    top = clnn.dropout_key_at(2 ** 64 - 1, 1)
    assert 0 <= top < 2 ** 64
