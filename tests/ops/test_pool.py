import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import clnn
from clnn import tuning
from conftest import Guarded, assert_close, f64, float_dtypes, guarded_input
from reference import pool2d_ref

RNG = np.random.default_rng(41)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("mode", ["max", "avg"])
@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 3), C=st.integers(1, 4), H=st.integers(1, 12), W=st.integers(1, 12),
       kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3),
       ceil_mode=st.booleans(), data=st.data())
def test_pooling_forward_and_backward(dtype, mode, N, C, H, W, kh, kw, sh, sw, ceil_mode,
                                      data):
    dh, dw = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))) \
        if mode == "max" else (1, 1)
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1         # the dilated window
    ph = data.draw(st.integers(0, eh // 2))
    pw = data.draw(st.integers(0, ew // 2))
    options = dict(ceil_mode=ceil_mode)
    if mode == "max":
        options["dilation"] = (dh, dw)
    else:
        options["count_include_pad"] = data.draw(st.booleans())
        options["divisor_override"] = data.draw(st.sampled_from([None, 1, 3]))
    fwd = clnn.max_pool2d if mode == "max" else clnn.avg_pool2d
    bwd = clnn.max_pool2d_backward if mode == "max" else clnn.avg_pool2d_backward
    if eh > H + 2 * ph or ew > W + 2 * pw:
        with pytest.raises(clnn.ShapeError):
            fwd(clnn.zeros((N, C, H, W)), (kh, kw), (sh, sw), (ph, pw), **options)
        return
    # few distinct values, so max pooling meets ties
    x = RNG.integers(-3, 4, (N, C, H, W)).astype(dtype)
    ref_options = {k: v for k, v in options.items() if k != "dilation"}
    ref, backward, where = pool2d_ref(x, (kh, kw), (sh, sw), (ph, pw), mode, (dh, dw),
                                      **ref_options)
    X = guarded_input(clnn.device(), x)
    y = Guarded(clnn.device(), ref.shape, dtype)
    if mode == "max":
        idx = Guarded(clnn.device(), ref.shape, np.int32)
        got = fwd(X, (kh, kw), (sh, sw), (ph, pw), return_indices=True, out=y.view,
                  indices=idx.view, **options)
        assert got[0] is y.view and got[1] is idx.view
        np.testing.assert_array_equal(idx.check(), where)
    else:
        fwd(X, (kh, kw), (sh, sw), (ph, pw), out=y.view, **options)
    got = y.check()
    assert np.array_equal(np.isinf(got), np.isinf(ref))      # windows with no input
    assert_close(np.where(np.isinf(ref), 0, got), np.where(np.isinf(ref), 0, ref),
                 dtype, k=kh * kw)
    dy = RNG.standard_normal(ref.shape).astype(dtype)
    dx = Guarded(clnn.device(), x.shape, dtype)
    bwd(guarded_input(clnn.device(), dy), X, (kh, kw), (sh, sw), (ph, pw), out=dx.view,
        **options)
    k = -(-kh // sh) * -(-kw // sw)
    assert_close(dx.check(), backward(dy), dtype, k=k,
                 scale=np.maximum(backward(np.abs(dy)), 1))


def test_pytorch_output_sizes_and_divisors():
    """Examples worked from PyTorch's documented formulas: ceil_mode's extra window
    (and the one it must not add), count_include_pad and divisor_override."""
    x = clnn.asarray(np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5))
    assert clnn.max_pool2d(x, 2, ceil_mode=True).shape == (1, 1, 3, 3)
    assert clnn.max_pool2d(x, 2).shape == (1, 1, 2, 2)
    # (5 + 2 - 2) / 3 = 1.67 -> 2 up, but window 2 would start at 6 - 1 = 5 >= 5 + 1
    assert clnn.max_pool2d(clnn.zeros((1, 1, 5, 5)), 2, 3, 1, ceil_mode=True).shape[-1] == 2
    a = clnn.avg_pool2d(x, 3, 2, 1).get()[0, 0]
    assert a[0, 0] == (0 + 1 + 5 + 6) / 9                     # padding counts
    a = clnn.avg_pool2d(x, 3, 2, 1, count_include_pad=False).get()[0, 0]
    assert a[0, 0] == (0 + 1 + 5 + 6) / 4
    a = clnn.avg_pool2d(x, 2, ceil_mode=True).get()[0, 0]
    assert a[2, 2] == 24 / 1                                  # past the input: not counted
    assert clnn.avg_pool2d(x, 2, divisor_override=3).get()[0, 0, 0, 0] == (0 + 1 + 5 + 6) / 3
    m = clnn.max_pool2d(x, 2, dilation=2).get()[0, 0]
    assert m.shape == (2, 2) and m[0, 0] == 12                # taps 0, 2, 10, 12


def test_defaults_and_bad_input():
    x = clnn.asarray(RNG.standard_normal((1, 2, 4, 4)).astype(np.float32))
    assert clnn.max_pool2d(x, 2).shape == (1, 2, 2, 2)
    with pytest.raises(clnn.ShapeError):
        clnn.max_pool2d(x, 2, padding=2)
    with pytest.raises(clnn.ShapeError):
        clnn.avg_pool2d(x, 5)
    with pytest.raises(clnn.ShapeError):
        clnn.max_pool2d_backward(clnn.zeros((1, 2, 3, 3)), x, 2)
    with pytest.raises(clnn.ShapeError):        # half the dilated window (3) is 1
        clnn.max_pool2d(x, 2, dilation=2, padding=2)
    for bad in (dict(divisor_override=0), dict(divisor_override=1.5), dict(divisor_override=2**31),
                dict(count_include_pad=None), dict(ceil_mode=1)):
        with pytest.raises(clnn.ArgumentError):
            clnn.avg_pool2d(x, 2, **bad)
    with pytest.raises(clnn.ShapeError):
        clnn.max_pool2d(x, 2, dilation=0)
    with pytest.raises(clnn.DTypeError):
        clnn.max_pool2d(x, 2, return_indices=True, indices=clnn.zeros((1, 2, 2, 2)))


# (kernel, stride, padding, options): overlapping windows, windows that do not overlap
# (the row kernel's own path), dilation, ceil_mode past the input, the avg divisors
GENERAL = [((3, 2), (2, 2), (1, 0), {}), ((2, 2), (3, 2), (0, 1), {}),
           ((3, 3), (1, 2), (1, 1), {"ceil_mode": True}),
           ((2, 3), (2, 2), (1, 1), {"dilation": (2, 1), "ceil_mode": True}),
           ((3, 3), (2, 2), (1, 1), {"count_include_pad": False, "ceil_mode": True}),
           ((2, 2), (2, 2), (1, 0), {"divisor_override": 3})]


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("k,st,pad,dil", [(3, 2, 1, 1), ((3, 5), (2, 3), (1, 2), 1),
                                          (3, 1, 1, (1, 2)), (2, 1, 0, 1)])
def test_overlapping_max_windows_a_chunk_of_columns_at_a_time(k, st, pad, dil, dtype):
    """The CPU's backward pass over overlapping max windows (a work-item per row, 32
    columns at a time, each window's maximum from the forward kernel's indices): rows
    of 75 columns (three chunks, windows across their edges), ties and NaNs, with and
    without an activation's derivative; against the reference, and bitwise as the
    GPUs' gather per element, canaries intact."""
    x = RNG.integers(-3, 4, (2, 2, 9, 75)).astype(dtype)            # ties
    x[0, 1, 2, 31] = x[0, 1, 3, 32] = x[1, 0, 0, 0] = x[1, 1, 8, 74] = np.nan
    kk, ss, pp, dd = (v if isinstance(v, tuple) else (v, v) for v in (k, st, pad, dil))
    ref, backward, _ = pool2d_ref(x.astype(np.float64), kk, ss, pp, "max", dd)
    dy = RNG.standard_normal(ref.shape).astype(dtype)
    X, DY = guarded_input(clnn.device(), x), guarded_input(clnn.device(), dy)
    got = {}
    for per, forced in (("row", False), ("element", True)):
        with tuning.override("rows", {"wg": forced}), clnn.profile() as prof:
            dx = Guarded(clnn.device(), x.shape, dtype)
            clnn.max_pool2d_backward(DY, X, k, st, pad, dil, out=dx.view)
            got[per] = dx.check(), clnn.max_pool2d_backward(DY, X, k, st, pad, dil,
                                                            activation="relu").get()
        # (a work-item per row: the forward kernel's indices of the maxima first)
        first = ["clnn_pool_forward"] if per == "row" else []
        assert [r.entry for r in prof.records] == (first + ["clnn_pool_backward"]) * 2
    assert_close(got["row"][0], backward(dy.astype(np.float64)), dtype, k=4,
                 scale=np.maximum(backward(np.abs(dy.astype(np.float64))), 1))
    for a, b in zip(got["row"], got["element"]):
        np.testing.assert_array_equal(f64(a), f64(b))


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("mode", ["max", "avg"])
def test_general_kernels_per_element(mode, dtype):
    """GPUs run the general pooling kernels with a work-item per element (forced here
    with the GPUs' row-wise kernels): forward (with the max indices) and backward
    against the reference, bitwise as the CPUs' work-item per row, canaries intact."""
    fwd = clnn.max_pool2d if mode == "max" else clnn.avg_pool2d
    bwd = clnn.max_pool2d_backward if mode == "max" else clnn.avg_pool2d_backward
    x = RNG.integers(-3, 4, (2, 3, 9, 7)).astype(dtype)          # ties
    if mode == "max":
        x[0, 1, 2, 3] = x[1, 0, 0, 0] = np.nan
    for k, st, pad, opts in GENERAL:
        if mode == "max" and ("count_include_pad" in opts or "divisor_override" in opts):
            continue
        if mode == "avg" and "dilation" in opts:
            continue
        ref_opts = {key: v for key, v in opts.items() if key != "dilation"}
        ref, backward, where = pool2d_ref(x.astype(np.float64), k, st, pad, mode,
                                          opts.get("dilation", (1, 1)), **ref_opts)
        dy = RNG.standard_normal(ref.shape).astype(dtype)
        X, DY = guarded_input(clnn.device(), x), guarded_input(clnn.device(), dy)
        got = {}
        for per, forced in (("row", False), ("element", True)):
            with tuning.override("rows", {"wg": forced}):
                y, dx = Guarded(clnn.device(), ref.shape, dtype), \
                    Guarded(clnn.device(), x.shape, dtype)
                if mode == "max":
                    idx = Guarded(clnn.device(), ref.shape, np.int32)
                    fwd(X, k, st, pad, return_indices=True, out=y.view, indices=idx.view,
                        **opts)
                    np.testing.assert_array_equal(idx.check(), where)
                else:
                    fwd(X, k, st, pad, out=y.view, **opts)
                bwd(DY, X, k, st, pad, out=dx.view, **opts)
                got[per] = y.check(), dx.check()
        for a, b in zip(got["row"], got["element"]):
            np.testing.assert_array_equal(f64(a), f64(b))
        y_got, dx_got = got["element"]
        fin = np.isfinite(ref)                # NaN windows, and -inf where no tap lands
        assert np.array_equal(np.isnan(y_got), np.isnan(ref))
        assert np.array_equal(np.isinf(y_got), np.isinf(ref))
        assert_close(np.where(fin, y_got, 0), np.where(fin, ref, 0), dtype,
                     k=k[0] * k[1])
        assert_close(dx_got, backward(dy.astype(np.float64)), dtype, k=k[0] * k[1],
                     scale=np.maximum(backward(np.abs(dy.astype(np.float64))), 1))


@pytest.mark.parametrize("per", ["row", "element"])
@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("H,W", [(4, 4), (7, 9), (28, 28), (1 + 2 * 5, 2 * 8), (4, 17),
                                 (6, 11), (9, 15)])
def test_2x2_max_pooling_ties_and_nans(H, W, dtype, per):
    """2x2 windows with stride 2 have their own kernels (four windows along a row as
    vectors, a block at the right edge element by element, but for 16-bit storage on
    CPUs, where it overlaps the block before and only an odd W's last column goes
    element by element; a work-item per row of blocks on CPUs, per block on GPUs,
    forced here; rows of 5 and 7 windows, an odd column after them): the first
    maximum in row-major order wins, a NaN beats any number, rows and columns past the
    last window get no gradient; offsets and canaries around every array. Checked
    against the reference and against the general kernels."""
    import sys
    from unittest import mock
    x = RNG.integers(-2, 3, (2, 3, H, W)).astype(dtype)           # many ties
    x[0, 0, 0, 1] = x[1, 2, -1, -1] = x[1, 1, 0, 0] = np.nan
    x[1, 1, 0, 1] = np.nan                                          # two in one window
    ref, backward, _ = pool2d_ref(x, (2, 2), (2, 2), (0, 0), "max")
    dy = RNG.standard_normal(ref.shape).astype(dtype)
    X, DY = guarded_input(clnn.device(), x), guarded_input(clnn.device(), dy)
    y, dx = Guarded(clnn.device(), ref.shape, dtype), Guarded(clnn.device(), x.shape, dtype)
    with tuning.override("rows", {"wg": per == "element"}), clnn.profile() as prof:
        clnn.max_pool2d(X, 2, out=y.view)
        clnn.max_pool2d_backward(DY, X, 2, out=dx.view)
    assert [(r.entry, r.params["per"]) for r in prof.records] == \
        [("clnn_pool22_forward", per), ("clnn_pool22_backward", per)]
    fast = y.check(), dx.check()
    np.testing.assert_array_equal(f64(fast[0]), f64(ref.astype(dtype)))
    np.testing.assert_array_equal(f64(fast[1]), f64(backward(dy).astype(dtype)))
    pool = sys.modules["clnn.ops.pool"]
    with mock.patch.object(pool, "_is_22", lambda *a: False):
        general = clnn.max_pool2d(X, 2).get(), clnn.max_pool2d_backward(DY, X, 2).get()
    for a, b in zip(fast, general):
        np.testing.assert_array_equal(f64(a), f64(b))


@pytest.mark.parametrize("per", ["row", "element"])
@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("H,W", [(4, 4), (7, 9), (28, 28), (11, 16), (4, 17), (6, 11)])
@pytest.mark.parametrize("divisor", [None, 3, -5])
def test_2x2_average_pooling(H, W, dtype, per, divisor):
    """Average pooling over 2x2 windows with stride 2 takes the 2x2 kernels too (the
    window's four elements summed in row-major order and divided, as the general
    kernels do; divisor_override too): against float64 with canaries and offsets,
    rows and columns past the last window getting no gradient, and bitwise against
    the general kernels (with the activation's derivative too)."""
    import sys
    from unittest import mock
    x = RNG.standard_normal((2, 3, H, W)).astype(dtype)
    opts = {"divisor_override": divisor}
    ref, backward, _ = pool2d_ref(x.astype(np.float64), (2, 2), (2, 2), (0, 0), "avg",
                                  **opts)
    scale, _, _ = pool2d_ref(np.abs(x.astype(np.float64)), (2, 2), (2, 2), (0, 0), "avg",
                             **opts)
    dy = RNG.standard_normal(ref.shape).astype(dtype)
    X, DY = guarded_input(clnn.device(), x), guarded_input(clnn.device(), dy)
    y, dx = Guarded(clnn.device(), ref.shape, dtype), Guarded(clnn.device(), x.shape, dtype)
    with tuning.override("rows", {"wg": per == "element"}), clnn.profile() as prof:
        clnn.avg_pool2d(X, 2, out=y.view, **opts)
        clnn.avg_pool2d_backward(DY, X, 2, out=dx.view, **opts)
        fast_act = clnn.avg_pool2d_backward(DY, X, 2, activation="relu", **opts).get()
    assert [(r.entry, r.params["per"]) for r in prof.records] == \
        [("clnn_pool22_forward", per)] + [("clnn_pool22_backward", per)] * 2
    fast = y.check(), dx.check()
    # (a negative divisor makes the magnitudes' reference negative: its size counts)
    assert_close(fast[0], ref, dtype, k=4, scale=np.maximum(np.abs(scale), 1e-3))
    assert_close(fast[1], backward(dy.astype(np.float64)), dtype, k=1,
                 scale=np.maximum(np.abs(backward(np.abs(dy.astype(np.float64)))), 1e-3))
    pool = sys.modules["clnn.ops.pool"]
    with mock.patch.object(pool, "_is_22", lambda *a: False), \
            tuning.override("rows", {"wg": per == "element"}):
        general = (clnn.avg_pool2d(X, 2, **opts).get(),
                   clnn.avg_pool2d_backward(DY, X, 2, **opts).get(),
                   clnn.avg_pool2d_backward(DY, X, 2, activation="relu", **opts).get())
    for a, b in zip(fast + (fast_act,), general):
        np.testing.assert_array_equal(f64(a), f64(b))


def test_2x2_pooling_passes_every_half_through(dev):
    """The 2x2 kernels load and store float16 as vectors (on CPUs through clnn's own
    vector conversions): windows of four equal values give back every one of the
    65536 halves, subnormals, infinities and NaN included, and route dy to each
    window's first element."""
    if not dev.supports(np.float16):
        pytest.skip("no float16 on this device")
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    v = bits.view(np.float16)
    # two rows of windows (with one, the op's stride along H would be 1: not 2x2's path)
    x = np.repeat(np.repeat(v[None, :], 2, axis=1), 4, axis=0)[None, None]   # (1,1,4,2n)
    for y in clnn.max_pool2d(clnn.asarray(x), 2).get()[0, 0]:
        nan = np.isnan(v)
        assert np.array_equal(y[~nan].view(np.uint16), bits[~nan])
        assert np.all(np.isnan(y[nan]))
    dy = np.ones((1, 1, 2, v.size), np.float16)
    dx = clnn.max_pool2d_backward(clnn.asarray(dy), clnn.asarray(x), 2).get()[0, 0]
    assert np.array_equal(dx[0::2, 0::2], np.ones((2, v.size), np.float16))
    assert not dx[0::2, 1::2].any() and not dx[1::2].any()


def df_from_a(name, a, p):
    """f'(z) from the output a = f(z), float64 (the activations a pooling passes)."""
    a = a.astype(np.float64)
    return {"relu": lambda: (a > 0) * 1.0, "tanh": lambda: 1 - a * a,
            "sigmoid": lambda: a * (1 - a), "leaky_relu": lambda: np.where(a > 0, 1.0, p),
            "elu": lambda: np.where(a > 0, 1.0, a + p)}[name]()


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("act,param", [("relu", None), ("tanh", None), ("sigmoid", None),
                                       ("leaky_relu", 0.1), ("elu", 0.7)])
def test_backward_through_the_activation_below(act, param, dtype):
    """max_pool2d_backward and avg_pool2d_backward with ``activation=``: dx times the
    derivative of the activation whose output x is, in the pooling's pass (a network's
    convolution under a pooling layer); the 2x2 kernels (rows of 5 windows and an odd
    column: blocks and single windows) and the general ones, a work-item per row and
    per element. Against float64, and the two ops in turn (to rounding: the compilers
    contract the derivative's products into fused multiply-adds their own ways)."""
    from reference import f_ref
    p = {"leaky_relu": 0.1, "elu": 0.7}.get(act, 0.0)
    cases = [("max", 2, 2, 0, {}), ("max", (3, 2), 2, (1, 0), {}),
             ("avg", 2, 2, 0, {}), ("avg", 3, (1, 2), 1, {"count_include_pad": False})]
    for mode, k, s, pad, opts in cases:
        z = RNG.standard_normal((2, 3, 11, 11)) * 2
        x = f_ref(act, z, p).astype(dtype)
        bwd = clnn.max_pool2d_backward if mode == "max" else clnn.avg_pool2d_backward
        ref, backward, _ = pool2d_ref(x.astype(np.float64), pair(k), pair(s), pair(pad),
                                      mode, **opts)
        dy = RNG.standard_normal(ref.shape).astype(dtype)
        want = backward(dy.astype(np.float64)) * df_from_a(act, x, p)
        # (the derivative's own terms: 1 - a^2 and a + p cancel near a = 1 and -p)
        scale = backward(np.abs(dy.astype(np.float64))) * \
            (np.abs(df_from_a(act, x, p)) + np.abs(x.astype(np.float64)) + 1)
        X, DY = guarded_input(clnn.device(), x), guarded_input(clnn.device(), dy)
        for per in ("row", "element"):
            with tuning.override("rows", {"wg": per == "element"}), \
                    clnn.profile() as prof:
                dx = Guarded(clnn.device(), x.shape, dtype)
                bwd(DY, X, k, s, pad, out=dx.view, activation=act, activation_param=param,
                    **opts)
                two = clnn.activation_backward(act, bwd(DY, X, k, s, pad, **opts), a=X,
                                               param=param)
            # (a CPU's overlapping max windows: the forward kernel's indices first)
            first = ["clnn_pool_forward"] if (mode, k, per) == ("max", (3, 2), "row") else []
            entries = [r.entry for r in prof.records]
            assert entries[:len(first) + 1] == first + [
                "clnn_pool22_backward" if k == 2 else "clnn_pool_backward"] and \
                len(entries) == 3 + 2 * len(first)
            got = dx.check()
            assert_close(got, want, dtype, k=4, scale=np.maximum(scale, 1e-3))
            assert_close(got, two.get(), dtype, k=2, scale=np.maximum(scale, 1e-3))


def pair(v):
    return tuple(v) if isinstance(v, tuple) else (v, v)


def test_backward_through_an_activation_is_checked_first(dev):
    """An unknown activation, a bad parameter, or softplus with a threshold whose
    derivative needs z: a typed error, and the output as it was."""
    x = clnn.asarray(RNG.random((1, 2, 4, 4)).astype(np.float32), device=dev)
    dy = clnn.asarray(RNG.random((1, 2, 2, 2)).astype(np.float32), device=dev)
    out = Guarded(dev, (1, 2, 4, 4), np.float32, fill=np.ones((1, 2, 4, 4)))
    for act, param in (("swish", None), ("elu", -1.0), ("leaky_relu", float("nan")),
                       ("softplus", (1.0, 5.0))):
        for bwd in (clnn.max_pool2d_backward, clnn.avg_pool2d_backward):
            with pytest.raises(clnn.ArgumentError):
                bwd(dy, x, 2, out=out.view, activation=act, activation_param=param)
    dev.queue.finish()
    np.testing.assert_array_equal(out.check(), np.ones((1, 2, 4, 4), np.float32))
