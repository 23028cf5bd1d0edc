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


def _hard_floats():
    """float32 values where a conversion to half goes wrong if it can: every half and
    the midpoints between neighbours (ties: to even), one float32 ulp either side of
    each midpoint, the subnormal range and its edge, 65504 .. 65536 (the last finite
    half, the tie at 65520 that rounds to inf), zeros, infinities, NaNs with payloads,
    and random bit patterns."""
    halves = np.arange(0x7c00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = (halves[:-1] + halves[1:]) / 2
    f = np.concatenate([halves, mids]).astype(np.float32)
    up, down = np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(0))
    special = np.array([0.0, 2.0 ** -25, 2.0 ** -24 * 0.75, 2.0 ** -14, 65504, 65519.99,
                        65520, 65535.99, 65536, 1e30, np.inf, np.nan], np.float32)
    bits = RNG.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)
    payload = np.array([0x7f800001, 0x7fc00000, 0x7fbfffff], np.uint32).view(np.float32)
    x = np.concatenate([f, up, down, special, bits.view(np.float32), payload])
    return np.concatenate([x, -x])


def test_float16_conversions_are_exact_everywhere(dev):
    """float32 -> float16 rounds to nearest even on every value class (bit for bit with
    numpy, NaNs as NaNs); float16 -> float32 is exact for all 65536 halves. On a CPU
    these are clnn's own integer conversions (_half.cl), elsewhere the built-ins."""
    x = _hard_floats()
    got = clnn.cast(clnn.asarray(x), np.float16).get()
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    back = clnn.cast(clnn.asarray(every), np.float32).get()
    want = every.astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(back), nan)
    np.testing.assert_array_equal(back[~nan].view(np.uint32), want[~nan].view(np.uint32))
    # and through an op's own load and store: a copy of every half is bitwise the same
    same = clnn.copy(clnn.asarray(every)).get()
    assert np.array_equal(same.view(np.uint16)[~nan], every.view(np.uint16)[~nan])
