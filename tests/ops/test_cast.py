"""cast: every pair of the device's float types, rounded once to nearest (numpy's
astype is the reference, except float64 -> bfloat16, which ml_dtypes rounds twice,
through float32), awkward sizes with offsets and canaries; PyTorch's softmax dtype=
through it."""

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
    # compared as float64, where numpy sees bfloat16's NaNs as NaNs
    np.testing.assert_array_equal(out.check().astype(np.float64),
                                  rounded_once(x, dst).astype(np.float64))


def rounded_once(x, dst):
    """``x`` rounded to ``dst`` once, to nearest even: numpy's astype, except float64 to
    bfloat16, where it is the nearest of the three bfloat16 values around ml_dtypes'
    double rounding (ties to the even bits)."""
    with np.errstate(over="ignore", invalid="ignore"):
        twice = x.astype(dst)
    if not (x.dtype == np.float64 and np.dtype(dst) == clnn.bfloat16):
        return twice
    bits = twice.view(np.uint16).astype(np.int64)
    # the neighbours in value: bits +-1 (away from and toward zero) within the sign's half
    cand = np.stack([bits - 1, bits, bits + 1]).clip(0, 0xffff).astype(np.uint16)
    vals = cand.view(clnn.bfloat16).astype(np.float64)
    with np.errstate(invalid="ignore"):
        dist = np.abs(vals - x)
        dist[~np.isfinite(dist)] = np.inf
        dist[np.signbit(vals) != np.signbit(x)] = np.inf   # bits - 1 below 0x8000: NaN
    best = np.lexsort([cand & 1, dist], axis=0)[0]   # nearest, then the even one
    out = cand[best, np.arange(x.size)].view(clnn.bfloat16)
    keep = ~np.isfinite(x) | ~np.isfinite(twice.astype(np.float64))   # inf, NaN, overflow
    out[keep] = twice[keep]
    return out


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
    every_16_bit_value_is_exact(np.float16)


def every_16_bit_value_is_exact(dtype):
    """All 65536 values of a 16-bit ``dtype`` to float32 exactly (NaNs as NaNs), and
    through an op's own load and store: a copy of each is bitwise the same."""
    every = np.arange(65536, dtype=np.uint16).view(dtype)
    back = clnn.cast(clnn.asarray(every), np.float32).get()
    want = every.astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(back), nan)
    np.testing.assert_array_equal(back[~nan].view(np.uint32), want[~nan].view(np.uint32))
    same = clnn.copy(clnn.asarray(every)).get()
    assert np.array_equal(same.view(np.uint16)[~nan], every.view(np.uint16)[~nan])


def test_bfloat16_conversions_are_exact_everywhere(dev):
    """float32 -> bfloat16 rounds to nearest even bit for bit with ml_dtypes (NaNs as
    NaNs) on every bfloat16, the midpoints, an ulp either side of them, the edge to
    inf and random bits; bfloat16 -> float32 is exact for all 65536; float64 ->
    bfloat16 rounds once (1 + 2^-8 + 2^-30 is 1 + 2^-7, not the tie's even 1)."""
    every = np.arange(65536, dtype=np.uint16).view(clnn.bfloat16)
    ev = every.astype(np.float64)
    fin = np.sort(ev[np.isfinite(ev)])
    mids = (fin[:-1] + fin[1:]) / 2
    f = np.concatenate([fin, mids]).astype(np.float32)
    up, down = np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))
    bits = RNG.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)
    payload = np.array([0x7f800001, 0x7fc00000, 0x7fbfffff, 0xff800001], np.uint32)
    special = np.array([0.0, -0.0, 3.4e38, np.finfo(np.float32).max, np.inf, -np.inf],
                       np.float32)
    x = np.concatenate([f, up, down, special, bits.view(np.float32),
                        payload.view(np.float32)])
    got = clnn.cast(clnn.asarray(x), clnn.bfloat16).get()
    want = x.astype(clnn.bfloat16)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    every_16_bit_value_is_exact(clnn.bfloat16)
    if dev.facts.fp64:
        tiny = np.array([2.0 ** -30, 2.0 ** -60])
        d = np.concatenate([mids + tiny[0] * np.abs(mids), mids - tiny[0] * np.abs(mids),
                            mids, mids + tiny[1] * np.abs(mids), [1 + 2 ** -8 + 2 ** -30]])
        got = clnn.cast(clnn.asarray(d), clnn.bfloat16).get()
        np.testing.assert_array_equal(got.view(np.uint16),
                                      rounded_once(d, clnn.bfloat16).view(np.uint16))
        assert got[-1].astype(np.float64) == 1 + 2 ** -7
