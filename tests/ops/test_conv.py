"""Convolution forward and both gradients against the lecture's loops in float64."""

import contextlib
import dataclasses
import sys
import types
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import clnn
from clnn import tuning
from conftest import Guarded, eps, error_bound, f64, float_dtypes, guarded_input
from reference import conv2d_backward_ref, conv2d_general_ref, conv2d_ref, f_ref

RNG = np.random.default_rng(31)
conv_module = sys.modules["clnn.ops.conv"]
gemm_module = sys.modules["clnn.ops.gemm"]
GATHER = tuning.CONV_TABLE["type"]["CPU"]
GATHERED = dict(GATHER, WROWS=False)      # weight gradients too in conv.cl
# the GEMM row of a CPU without one of its own (panels of 6 x 16): tests that count
# panels force it, whatever row the device they run on has
CPU_GEMM = tuning.GEMM_TABLE["type"]["CPU"]
NV = tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")]
# (kernel to override, parameters, conv.py constants to patch)
VARIANTS = {
    "default": (None, None, {}),
    # conv.cl, gathered: each row at its own offset; rows along a line; the padding
    # read with bounds checks instead of from a padded copy; both data gradients;
    # narrow vectors and a single row per work-item; work-items that walk the rows
    # of a panel first (small problems walk the panels first); their weight gradients
    # too (GATHERED: not convwr.cl's pixel rows)
    "gather-flat": ("conv", dict(GATHERED, MWI=3, NWI=8, LINE=False, DGRAD="col2im"), {}),
    "gather-line": ("conv", dict(GATHERED, MWI=2, NWI=16, LINE=True, DGRAD="flip",
                                 PANELS_FIRST=False), {}),
    "gather-checked": ("conv", dict(GATHERED, MWI=3, NWI=8, DGRAD="flip"),
                       {"PAD_BYTES": 0}),
    "gather-vw4": ("conv", dict(GATHERED, MWI=1, NWI=4, VW=4, WG=1, DGRAD="col2im"),
                   {"PAD_BYTES": 0}),
    # three B vectors per k (panels of 24 columns, what 16 registers favour)
    "gather-nvw3": ("conv", dict(GATHERED, MWI=4, NWI=24, DGRAD="col2im"), {}),
    "gather-rows-first": ("conv", dict(GATHERED, MWI=3, NWI=8, LINE=False, DGRAD="col2im",
                                       PANELS_FIRST=False), {}),
    # 512-bit tiles (CPUs whose code has them; elsewhere these skip), on every width
    # of columns (WIDE_COLS 0): accumulators stored as halves, whole or lane by lane,
    # and as the data gradient's dcol vectors
    "gather-512": ("conv", dict(GATHERED, VW=16, REGS=32, DGRAD="col2im"),
                   {"WIDE_COLS": 0}),
    "gather-512-line": ("conv", dict(GATHERED, VW=16, REGS=32, LINE=True, DGRAD="flip",
                                     PANELS_FIRST=False), {"WIDE_COLS": 0}),
    # convpx.cl's pixel rows wherever a forward pass (the flipped data gradient
    # included) can take them: blocks of 4 positions by 3 channels, and of 2 x 4
    # positions by 6 channels (rows of 4 to 12 positions: overlapping last blocks)
    "pixels": ("conv", dict(GATHER, PIXELS=True, QV=1, VW=4, MB=3, DGRAD="flip"), {}),
    "pixels-wide": ("conv", dict(GATHER, PIXELS=True, QV=2, VW=4, MB=6, DGRAD="flip"), {}),
    # convwr.cl's weight gradient wherever it can take the layer (rows of 4 positions
    # or more at unit column stride), 2 filters a work-item
    "wgrad-rows": ("conv", dict(GATHER, WROWS=True, VW=4, WROWS_MB=2), {}),
    # gemm.cl's loaders: the CPU's packed panels, the GPU tiles (k tables and column
    # maps; the data gradient through col2im below 16 channels, else by stride phase).
    # "gpu" as a GPU runs it: up to 16 filters (here all of them) in convt.cl's direct
    # tiles, forward and at unit stride the data gradient; the others without them.
    "gemm-reg": ("gemm", tuning.GEMM_TABLE["type"]["CPU"], {}),
    "gpu": ("gemm", tuning.GEMM_TABLE["type"]["GPU"], {}),
    "gpu-odd": ("gemm", {"variant": "local", "MWG": 12, "NWG": 8, "KWG": 5, "MDIMC": 4,
                         "NDIMC": 2}, {"TILE_DIRECT_MAXM": 0}),
    "gpu-nvidia-phases": ("gemm", NV[3], {"COL2IM_CHANNELS": 0, "TILE_DIRECT_MAXM": 0}),
    "gpu-nvidia-splitk": ("gemm", dict(NV[-1], KSPLIT=3), {"TILE_DIRECT_MAXM": 0}),
    "gpu-odd-splitk-phases": ("gemm", {"variant": "local", "MWG": 12, "NWG": 8, "KWG": 5,
                                       "MDIMC": 4, "NDIMC": 2, "KSPLIT": 2},
                              {"COL2IM_CHANNELS": 0, "TILE_DIRECT_MAXM": 0}),
}


@contextlib.contextmanager
def variant_in_force(name):
    kernel, params, patches = VARIANTS[name]
    problems = tuning.gemm_problems(params, clnn.device().facts) if params else []
    if problems:
        pytest.skip(f"{name} does not fit {clnn.device().facts.name}: {problems}")
    with contextlib.ExitStack() as stack:
        if kernel:
            stack.enter_context(tuning.override(kernel, params))
        for attr, value in patches.items():
            stack.enter_context(mock.patch.object(conv_module, attr, value))
        yield


LENET = {"C1": (1, 32, 32, 6, 5, 5), "C3": (6, 14, 14, 16, 5, 5), "C5": (16, 5, 5, 120, 5, 5)}


def within(got, ref, scale, k, dtype):
    bound = error_bound(dtype, k + 1, 4) * (scale + 1e-30)
    err = np.abs(got - ref)
    assert np.all(err <= bound), f"max error {err.max()}, bound there {bound.flat[err.argmax()]}"


def check_conv(N, C, H, W, M, R, S, stride, padding, dtype=np.float32, act=None):
    x = RNG.standard_normal((N, C, H, W)).astype(dtype)
    w = RNG.standard_normal((M, C, R, S)).astype(dtype)
    b = RNG.standard_normal(M).astype(dtype)
    X, Wd, B = guarded_input(clnn.device(), x), guarded_input(clnn.device(), w), \
        guarded_input(clnn.device(), b)
    ref = conv2d_ref(x, w, b, stride, padding)
    scale = conv2d_ref(np.abs(x), np.abs(w), np.abs(b), stride, padding)
    y = Guarded(clnn.device(), ref.shape, dtype)
    clnn.conv2d(X, Wd, B, stride=stride, padding=padding, out=y.view, activation=act)
    if act == "relu":
        ref = np.maximum(ref, 0)
    within(y.check(), ref, scale, C * R * S, dtype)

    dy = RNG.standard_normal(ref.shape).astype(dtype)
    dx_ref, dw_ref = conv2d_backward_ref(dy, x, w, stride, padding)
    dx_scale, dw_scale = conv2d_backward_ref(np.abs(dy), np.abs(x), np.abs(w), stride,
                                             padding)
    dx = Guarded(clnn.device(), x.shape, dtype)
    clnn.conv2d_backward_data(guarded_input(clnn.device(), dy), Wd, x.shape, stride=stride,
                              padding=padding, out=dx.view)
    within(dx.check(), dx_ref, dx_scale, M * R * S, dtype)
    # with the bias gradient beside it (db=): in the same launches on the GPU path's
    # direct kernel (convw.cl), by bias_grad elsewhere
    dw, db = Guarded(clnn.device(), w.shape, dtype), Guarded(clnn.device(), b.shape, dtype)
    clnn.conv2d_backward_weight(guarded_input(clnn.device(), dy), X, w.shape, stride=stride,
                                padding=padding, out=dw.view, db=db.view)
    within(dw.check(), dw_ref, dw_scale, N * ref.shape[2] * ref.shape[3], dtype)
    within(db.check(), dy.astype(np.float64).sum(axis=(0, 2, 3)),
           np.abs(dy.astype(np.float64)).sum(axis=(0, 2, 3)),
           N * ref.shape[2] * ref.shape[3], dtype)


@pytest.mark.parametrize("variant", VARIANTS)
@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 5), C=st.integers(1, 5), M=st.integers(1, 5), H=st.integers(1, 12),
       W=st.integers(1, 12), R=st.integers(1, 5), S=st.integers(1, 5),
       sh=st.integers(1, 3), sw=st.integers(1, 3), ph=st.integers(0, 2), pw=st.integers(0, 2))
def test_conv_forward_and_gradients(variant, N, C, M, H, W, R, S, sh, sw, ph, pw):
    if R > H + 2 * ph or S > W + 2 * pw:
        with pytest.raises(clnn.ShapeError, match="bigger than the padded"):
            clnn.conv2d(clnn.zeros((N, C, H, W)), clnn.zeros((M, C, R, S)),
                        padding=(ph, pw))
        return
    with variant_in_force(variant):
        check_conv(N, C, H, W, M, R, S, (sh, sw), (ph, pw))


def test_work_item_order():
    """_panels_first: the gathered kernel walks the panels first where the packed B
    fits a core's L2 or is small beside the input (forward passes: the filters), and
    the rows of a panel first where B is as large as the input (a weight gradient's
    dy at every output position)."""
    first = conv_module._panels_first
    f32 = np.float32
    assert first(f32, 576 * 144, 32 * 64 * 58 * 58)          # 3x3 stride 2, 64 -> 128
    assert first(f32, 512 * 1032, 32 * 512 * 56 * 56)        # 1x1 stride 2, 512 -> 1024
    assert first(f32, 1152 * 264, 32 * 128 * 30 * 30)        # 3x3 28x28, 128 -> 256
    assert not first(f32, 2304 * 264, 32 * 256 * 16 * 16)    # 14x14x256: B 2.4 MB
    assert not first(f32, 4608 * 528, 32 * 512 * 9 * 9)      # 7x7x512: B 9.7 MB
    for mpad in (64, 72):                                    # 56x56x64 weight gradient
        assert not first(f32, 8 * 3136 * mpad, 8 * 64 * 58 * 58)
    assert not first(f32, 65536 * 32, 64 * 3 * 34 * 34)      # CIFAR's input layer's
    assert first(f32, 64 * 100 * 16, 64 * 6 * 14 * 14)       # B of 400 KB: in L2
    assert not first(np.float64, 200_000, 10)                # 1.6 MB of doubles


def test_weight_gradient_tiles_take_two_vectors():
    """A weight gradient's tiles take at most WGRAD_VECTORS B vectors per k (its B,
    dy^T, streams from the cache: 6 x 16 beat 4 x 24), where the forward pass over
    the same 120 filters takes three; both give the right sums, and the weight
    gradient's canaries stay."""
    tiles = conv_module._tiles
    assert tiles(GATHER, np.float32, 120, 3) == (4, 24, 8, False)
    assert tiles(GATHER, np.float32, 120, 3, vectors=2) == (6, 16, 8, False)
    assert tiles(GATHER, np.float32, 64, 7, vectors=2)[:2] == (4, 16)   # the stem's taps
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = RNG.standard_normal((120, 3, 3, 3)).astype(np.float32)
    dy = RNG.standard_normal((2, 120, 9, 8)).astype(np.float32)
    y_ref = conv2d_ref(x, w, None, (1, 1), (1, 1))
    _, dw_ref = conv2d_backward_ref(dy, x, w, (1, 1), (1, 1))
    X, Wd = clnn.asarray(x), clnn.asarray(w)
    dw = Guarded(clnn.device(), w.shape, np.float32)
    with tuning.override("conv", dict(GATHER, PIXELS=False, WROWS=False)), \
            clnn.profile() as prof:
        y = clnn.conv2d(X, Wd, padding=1)
        clnn.conv2d_backward_weight(clnn.asarray(dy), X, w.shape, padding=1, out=dw.view)
    nwi = [dict(r.params["tuning"])["NWI"] for r in ran(prof, "clnn_conv_gather")]
    assert nwi == [24, 16]
    np.testing.assert_allclose(y.get(), y_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw.check(), dw_ref, rtol=1e-4, atol=1e-4)


def test_streamed_weight_gradient_tiles():
    """Where a weight gradient's B panels stream from memory and the row has 512-bit
    vectors, its tile takes them whole and the most rows (WGRAD_ROWS), one vector
    where two would leave a compute unit less than two work-items; elsewhere _tiles
    decides (None)."""
    wide = dict(GATHER, VW=16, REGS=32)
    tile = conv_module._wgrad_tile
    f32, f64 = np.float32, np.float64
    assert tile(wide, f32, 64, 147, 8 * 112 * 112, 2) == (10, 32, 16, False)   # the stem
    assert tile(wide, f32, 512, 256, 20 * 28 * 28, 2) == (10, 32, 16, False)
    assert tile(wide, f32, 32, 27, 64 * 32 * 32, 2) == (14, 16, 16, False)     # 27 taps
    assert tile(wide, f32, 32, 27, 64 * 32 * 32, 1) == (10, 32, 16, False)
    assert tile(wide, f32, 17, 400, 1 << 16, 2) == (10, 32, 16, False)
    assert tile(wide, f64, 64, 147, 8 * 112 * 112, 2) == (10, 16, 8, False)    # doubles
    assert tile(wide, f64, 6, 25, 64 * 28 * 28, 2) == (14, 8, 8, False)
    assert tile(wide, np.float16, 64, 147, 8 * 112 * 112, 2) == (10, 32, 16, False)
    # columns one 256-bit vector holds (LeNet C1's 6 filters), panels that stay in the
    # cache (LeNet C3's 400 KB at 16 lanes), 256-bit rows, tiles a row fixes
    assert tile(wide, f32, 6, 25, 64 * 28 * 28, 2) is None
    assert tile(wide, f32, 8, 25, 64 * 28 * 28, 2) is None
    assert tile(wide, f32, 16, 150, 64 * 10 * 10, 2) is None
    assert tile(wide, f32, 16, 150, conv_module.WGRAD_STREAM_BYTES // 64, 2) is not None
    assert tile(wide, f32, 16, 150, conv_module.WGRAD_STREAM_BYTES // 64 - 1, 2) is None
    assert tile(GATHER, f32, 64, 147, 8 * 112 * 112, 2) is None
    assert tile(dict(wide, NWI=16), f32, 64, 147, 8 * 112 * 112, 2) is None
    assert tile(dict(wide, MWI=4), f32, 64, 147, 8 * 112 * 112, 2) is None
    for cols in range(1, 70):
        for rows in (1, 9, 27, 147):
            t = tile(wide, f32, cols, rows, 1 << 20, 2)
            if t:
                mwi, nwi, vw, _ = t
                assert nwi % vw == 0 and mwi * (nwi // vw) + nwi // vw + 1 <= 32
                assert nwi // vw <= conv_module.WGRAD_VECTORS


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(3, 5, 11, 13, 37, 3, 3, 2, 1),     # two panels of 32
                                   (2, 1, 12, 9, 20, 3, 3, 1, 0)])     # 9 taps: one vector
def test_streamed_weight_gradient(shape, dtype):
    """The weight gradient through the streamed panels' tile (the threshold patched
    to 0, so small sizes take it): partial panels and row blocks, strides, padding,
    groups of images that add into dw (SCRATCH_BYTES small), alpha and beta, against
    float64 with canaries around dw."""
    N, C, H, W, M, R, S, st_, pd = shape
    wide = dict(GATHER, VW=16, REGS=32, PIXELS=False)
    if tuning.gemm_problems(wide, clnn.device().facts):
        pytest.skip(f"512-bit tiles do not fit {clnn.device().facts.name}")
    x = RNG.standard_normal((N, C, H, W)).astype(dtype)
    w = RNG.standard_normal((M, C, R, S)).astype(dtype)
    P, Q = (H + 2 * pd - R) // st_ + 1, (W + 2 * pd - S) // st_ + 1
    dy = RNG.standard_normal((N, M, P, Q)).astype(dtype)
    _, dw_ref = conv2d_backward_ref(dy, x, w, (st_, st_), (pd, pd))
    _, dw_scale = conv2d_backward_ref(np.abs(dy), np.abs(x), np.abs(w), (st_, st_),
                                      (pd, pd))
    dw = Guarded(clnn.device(), w.shape, dtype, fill=w)
    per_image = 32 * P * Q * (8 if np.dtype(dtype) == np.float64 else 4)
    with tuning.override("conv", wide), clnn.profile() as prof, \
            mock.patch.object(conv_module, "WGRAD_STREAM_BYTES", 0), \
            mock.patch.object(conv_module, "SCRATCH_BYTES", per_image):
        clnn.conv2d_backward_weight(guarded_input(clnn.device(), dy),
                                    guarded_input(clnn.device(), x), w.shape,
                                    stride=st_, padding=pd, out=dw.view, alpha=-0.5,
                                    beta=0.75)
        want = conv_module._wgrad_tile(wide, np.dtype(dtype), M, C * R * S, P * Q,
                                       clnn.device().facts.compute_units)
    assert want is not None
    gathers = ran(prof, "clnn_conv_gather")
    assert len(gathers) == N                                   # a group per image
    assert {dict(r.params["tuning"])["MWI"] for r in gathers} == {want[0]}
    assert {dict(r.params["tuning"])["NWI"] for r in gathers} == {want[1]}
    ref = 0.75 * w.astype(np.float64) - 0.5 * dw_ref
    within(dw.check(), ref, 0.5 * dw_scale + 0.75 * np.abs(w), N * P * Q + 1, dtype)


@pytest.mark.parametrize("dgrad", ["col2im", "flip"])
@pytest.mark.parametrize("layer", LENET)
def test_lenet5_layers(layer, dgrad):
    C, H, W, M, R, S = LENET[layer]
    with tuning.override("conv", dict(GATHER, DGRAD=dgrad)):
        check_conv(3, C, H, W, M, R, S, (1, 1), (0, 0), act="relu")


@pytest.mark.parametrize("shape", [(1, 32, 32, 6, 5, 5, 0), (6, 14, 14, 16, 5, 5, 0),
                                   (16, 5, 5, 120, 5, 5, 0), (8, 11, 13, 20, 3, 3, 1),
                                   (3, 7, 29, 5, 1, 7, 2)])
def test_gathered_tile_choice(shape):
    """The tiles the gathered path picks by itself (line lengths 1 to 29, one to four
    vectors of columns, 1x7 and 3x3 filters with padding)."""
    C, H, W, M, R, S, pad = shape
    check_conv(2, C, H, W, M, R, S, (1, 1), (pad, pad), act="relu")


@pytest.mark.parametrize("regs", [16, 32])
def test_gathered_tiles_fit_the_registers(regs):
    """Every tile the gathered path picks by itself keeps its accumulators, its B
    vectors and the broadcast A value within REGS vector registers (past them they
    spill on every k: 1.6-1.9x slower on the Zen 4), and its NWI depends on the
    columns alone (callers size the packed B before the row layout is known)."""
    p = dict(GATHER, REGS=regs)
    picked = set()
    for dt in (np.float32, np.float64, np.float16):
        for cols in list(range(1, 70)) + [120, 150, 256, 1000]:
            nwis = set()
            for line_len in (0, 1, 3, 5, 6, 7, 14, 28, 29, 56, 224):
                mwi, nwi, vw, line = conv_module._tiles(p, dt, cols, line_len)
                nvw = nwi // vw
                assert nwi % vw == 0 and 1 <= nvw <= 4
                assert mwi * nvw + nvw + 1 <= regs, (dt, cols, line_len, mwi, nwi)
                assert mwi >= 1 and (not line or mwi <= line_len)
                assert nwi < cols + nvw * vw        # no panel wider than it must be
                nwis.add(nwi)
                picked.add((mwi, nvw))
            assert len(nwis) == 1, (dt, cols, nwis)
    # wide layers get the tiles measured best with each budget
    assert conv_module._tiles(p, np.float32, 256, 56)[:2] == ((4, 24) if regs == 16
                                                              else (6, 32))
    # and 64 filters two vectors (three would pad them to 72: 5-8% slower)
    assert conv_module._tiles(p, np.float32, 64, 56)[:2] == ((6, 16) if regs == 16
                                                             else (6, 32))
    assert len(picked) > 4


def test_lines_that_blocks_do_not_divide():
    """A line of 14 rows in blocks of 4 computes 16: over a long sum the rows go at
    offsets of their own instead (each computed once), over a short one (LeNet C1's
    dcol, k = 6: their setup) and where the blocks divide the line, along the line."""
    tiles = conv_module._tiles
    assert tiles(GATHER, np.float32, 256, 14, k=2304) == (4, 24, 8, False)
    assert tiles(GATHER, np.float32, 256, 14, k=6)[3]
    assert tiles(GATHER, np.float32, 256, 56, k=2304) == (4, 24, 8, True)
    assert tiles(GATHER, np.float32, 25, 28, k=6)[3]
    # and both layouts give the right sums: a 14-wide layer with 20 filters (panels of
    # 24 columns, blocks of 4 rows), k = 6 * 9 along lines and 54 * 9 row by row
    # (GATHER's tiles, not those of the device's own row, which may budget other
    # registers)
    for C, line in ((6, True), (54, False)):
        with tuning.override("conv", GATHER), clnn.profile() as prof:
            check_conv(2, C, 14, 14, 20, 3, 3, (1, 1), (1, 1))
        forward = next(r for r in prof.records if r.entry == "clnn_conv_gather")
        assert forward.params["line"] == line
        assert dict(forward.params["tuning"])["NWI"] == 24


def ran(prof, entry):
    return [r for r in prof.records if r.entry == entry]


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
def test_pixel_rows(dtype):
    """convpx.cl's pixel rows as the library picks them, for the forward pass and the
    flipped data gradient (whose zero rows are skipped): a 3-channel 32x32 input layer,
    and LeNet C1's 28-wide output rows (their last block of 16 positions overlaps the
    one before), 6 and 5 filters (one panel, and a padded one) with bias and relu,
    inside canaries, every dtype (float64's vectors are 4 wide, 16-bit inputs a float
    copy)."""
    with tuning.override("conv", dict(GATHER, DGRAD="flip")):
        for shape in ((3, 32, 32, 6, 3, 3, 1), (1, 32, 32, 5, 5, 5, 0)):
            C, H, W, M, R, S, pad = shape
            with clnn.profile() as prof:
                check_conv(2, C, H, W, M, R, S, (1, 1), (pad, pad), dtype=dtype, act="relu")
            assert len(ran(prof, "clnn_conv_pixels")) == 2, shape
            assert ran(prof, "clnn_conv_pixels")[0].params["bias"] == "row"


@pytest.mark.parametrize("act", ["tanh", "sigmoid"])
@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
def test_pixel_rows_with_math_activations(act, dtype):
    """Pixel rows with an activation that calls math built-ins: each block's vectors,
    the last block's lanes (overlapping the block before: computed as a vector, only
    the new lanes stored) included, against float64 inside canaries: LeNet C1's rows
    of 28 as the library tiles them, and rows of 9 in blocks of 4 by 3 filters."""
    for (C, H, W, M, R, S), force in (((1, 32, 32, 6, 5, 5), {}),
                                      ((2, 5, 11, 4, 3, 3), dict(QV=1, VW=4, MB=3))):
        x = RNG.standard_normal((2, C, H, W)).astype(dtype)
        w = RNG.standard_normal((M, C, R, S)).astype(dtype)
        b = RNG.standard_normal(M).astype(dtype)
        z = conv2d_ref(x, w, b, (1, 1), (0, 0))
        scale = conv2d_ref(np.abs(x), np.abs(w), np.abs(b), (1, 1), (0, 0))
        y = Guarded(clnn.device(), z.shape, dtype)
        with tuning.override("conv", dict(GATHER, PIXELS=True, **force)), \
                clnn.profile() as prof:
            clnn.conv2d(guarded_input(clnn.device(), x), guarded_input(clnn.device(), w),
                        guarded_input(clnn.device(), b), out=y.view, activation=act)
        assert len(ran(prof, "clnn_conv_pixels")) == 1
        ref = f_ref(act, z, 1.0)
        bound = error_bound(dtype, C * R * S + 1, 4) * (scale + 1e-30) + \
            8 * eps(dtype) * np.maximum(np.abs(ref), 1e-3)
        got = y.check().astype(np.float64)
        assert np.all(np.abs(got - ref) <= bound), (act, M, np.abs(got - ref).max())


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
def test_pixel_rows_add_into_a_weight_gradient(dtype):
    """Pixel rows forced on a weight gradient, dw = alpha (the gradient) + beta dw: rows
    of 5 filter taps in blocks of 4 positions, so each row's last block overlaps the
    one before and stores only its last lane (lanes stored again would take beta
    twice), 3 filters a panel of 3 and one padded panel, inside canaries, every
    dtype."""
    dev = clnn.device()
    x = RNG.standard_normal((2, 3, 9, 8)).astype(dtype)
    v = RNG.standard_normal((4, 3, 3, 5)).astype(dtype)
    dy = RNG.standard_normal((2, 4, 7, 4)).astype(dtype)
    _, dw = conv2d_backward_ref(dy, x, v, (1, 1), (0, 0))
    scale = conv2d_backward_ref(np.abs(dy), np.abs(x), np.abs(v), (1, 1), (0, 0))[1]
    out = Guarded(dev, v.shape, dtype, fill=v)
    with tuning.override("conv", dict(GATHER, PIXELS=True, QV=1, VW=4, MB=3)), \
            clnn.profile() as prof:
        clnn.conv2d_backward_weight(guarded_input(dev, dy), guarded_input(dev, x), v.shape,
                                    out=out.view, alpha=-0.5, beta=0.75)
    assert len(ran(prof, "clnn_conv_pixels")) == 1
    v64 = v.astype(np.float64)
    within(out.check(), 0.75 * v64 - 0.5 * dw, 0.75 * np.abs(v64) + 0.5 * scale,
           2 * 7 * 4 + 1, dtype)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
def test_512_bit_pixel_rows(dtype):
    """Pixel rows of 512-bit vectors (a CPU whose code has them; elsewhere this skips)
    where an output row holds two of them, as the lanes row picks them: 34- and
    40-wide rows (a last block overlapping the one before, stored as halves whole
    and lane by lane), the forward pass and the flipped data gradient; rows of 28 take
    256-bit vectors of floats (two 512-bit ones would be 32 wide), and 512-bit ones of
    doubles (8 doubles: two are 16 wide)."""
    p = dict(GATHER, VW=16, REGS=32, DGRAD="flip")
    problems = tuning.gemm_problems(p, clnn.device().facts)
    if problems:
        pytest.skip(f"512-bit tiles do not fit {clnn.device().facts.name}: {problems}")
    wide = 16 if dtype != np.float64 else 8          # (8 doubles)
    with tuning.override("conv", p):
        for W, pad in ((34, 1), (40, 0)):
            with clnn.profile() as prof:
                check_conv(2, 3, 5, W, 6, 3, 3, (1, 1), (pad, pad), dtype=dtype, act="relu")
            px = ran(prof, "clnn_conv_pixels")
            assert len(px) == 2 and {dict(r.params["tuning"])["VW"] for r in px} == {wide}
        with clnn.profile() as prof:
            check_conv(2, 1, 32, 32, 6, 5, 5, (1, 1), (0, 0), dtype=dtype)
        forward = ran(prof, "clnn_conv_pixels")[0]      # (rows of 28)
        assert dict(forward.params["tuning"])["VW"] == 8


# (N, C, H, W, M, R, S, stride, padding, dilation, MB)
WROWS_SHAPES = {
    # LeNet C1: rows of 28, a last block overlapping the one before
    "C1": (3, 1, 32, 32, 6, 5, 5, (1, 1), (0, 0), (1, 1), None),
    # a padded copy (its zero rows skipped), 7 filters in panels of 3 (the last one
    # padded), rows of 13
    "padded": (2, 2, 11, 11, 7, 3, 5, (1, 1), (1, 3), (1, 1), 3),
    # a row stride of 2, one filter, a prime number of images
    "row-stride": (5, 3, 17, 9, 1, 2, 3, (2, 1), (0, 1), (1, 1), 1),
    # dilated taps, rows of 11 (a vector of floats and 3 lanes; of doubles 2 and 3):
    # 4 filters in registers against 2 taps, and 2 against 3 taps
    "dilated": (2, 2, 12, 14, 4, 3, 2, (1, 1), (1, 0), (2, 3), 4),
    "dilated-dy-first": (2, 1, 9, 20, 3, 2, 3, (1, 1), (0, 1), (1, 2), 2),
    # a row stride of 2 over 7-wide filters padded by 3 (rows of 17)
    "wide-filters": (2, 3, 11, 17, 4, 7, 7, (2, 1), (3, 3), (1, 1), 3),
}


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", WROWS_SHAPES)
@pytest.mark.parametrize("slices", [1, 3])
def test_weight_gradient_pixel_rows(monkeypatch, shape, slices, dtype):
    """convwr.cl's weight gradient forced onto layers it can take, against float64,
    inside canaries, at offsets, every dtype: dw = alpha (the gradient) + beta dw
    (a lane stored twice would take beta twice), and with beta 0 over NaN (never read);
    in one slice (the work-items write dw) and in slices of the output rows (partial
    sums that reduce3 adds in slice order)."""
    N, C, H, W, M, R, S, st, pd, dl, mb = WROWS_SHAPES[shape]
    dev = clnn.device()
    monkeypatch.setattr(conv_module, "WROWS_ITEMS", 64 if slices > 1 else 0)
    x = RNG.standard_normal((N, C, H, W)).astype(dtype)
    v = RNG.standard_normal((M, C, R, S)).astype(dtype)
    y, backward = conv2d_general_ref(x, v, None, st, pd, dl)
    dy = RNG.standard_normal(y.shape).astype(dtype)
    dw = backward(dy)[1]
    scale = conv2d_general_ref(np.abs(x), np.abs(v), None, st, pd, dl)[1](np.abs(dy))[1]
    k = N * y.shape[2] * y.shape[3]
    opts = dict(stride=st, padding=pd, dilation=dl)
    X, DY = guarded_input(dev, x), guarded_input(dev, dy)
    force = dict(GATHER, WROWS=True, VW=8, **({"WROWS_MB": mb} if mb else {}))
    v64 = v.astype(np.float64)
    with tuning.override("conv", force), clnn.profile() as prof:
        out = Guarded(dev, v.shape, dtype, fill=v)
        clnn.conv2d_backward_weight(DY, X, v.shape, out=out.view, alpha=-0.5, beta=0.75,
                                    **opts)
        within(out.check(), 0.75 * v64 - 0.5 * dw, 0.75 * np.abs(v64) + 0.5 * scale,
               k + 1, dtype)
        nan = Guarded(dev, v.shape, dtype, fill=np.full(v.shape, np.nan))
        clnn.conv2d_backward_weight(DY, X, v.shape, out=nan.view, alpha=2.0, **opts)
        first = nan.check()
        within(first, 2 * dw, 2 * scale, k, dtype)
        again = clnn.conv2d_backward_weight(DY, X, v.shape, **opts).get()
    rows = ran(prof, "clnn_conv_wgrad_rows")
    assert len(rows) == 3
    assert all(dict(r.params["tuning"])["MB"] == mb for r in rows if mb), shape
    # slices: a reduce3 after each, one launch per call in one slice
    assert len(ran(prof, "clnn_reduce")) == (3 if slices > 1 else 0)
    assert np.array_equal(f64(again) * 2, f64(first))


def test_weight_gradient_pixel_rows_where_they_pay():
    """_wgrad_rows: convwr.cl for layers with few filter rows whose output rows fill
    whole vectors (LeNet C1, input layers); the gathered kernel for many filter rows
    (C R past WROWS_MAX_CR), rows shorter than a whole vector (LeNet C3's 10 in
    256-bit vectors), rows that leave too many lanes empty, column strides and
    padding left to check; MB within the registers, the fewest panels first; slices
    enough for the cores, each within half of L2."""
    dev = clnn.device()
    f32 = np.dtype(np.float32)
    facts = dataclasses.replace(dev.facts, compute_units=2, l2_size=2 << 20)
    fake = types.SimpleNamespace(facts=facts)
    wide = dict(GATHER, VW=16, REGS=32)

    def plan(N, C, M, R, S, P, Q, Hg, Wg, p=wide, st=(1, 1), padded=False, dt=f32):
        return conv_module._wgrad_rows(p, fake, dt, N, C, M, R, S, P, Q, Hg, Wg, st,
                                       (1, 1), padded)

    assert plan(64, 1, 6, 5, 5, 28, 28, 32, 32) == (3, 16, 2, 896)      # LeNet C1
    assert plan(64, 3, 32, 3, 3, 32, 32, 34, 34)[:2] == (8, 16)         # CIFAR's input
    assert plan(64, 6, 16, 5, 5, 10, 10, 14, 14) is None                # C3
    assert plan(32, 16, 32, 3, 3, 28, 28, 30, 30) is None               # C R 48
    assert plan(64, 8, 8, 3, 3, 22, 22, 24, 24) is None                 # 22 of 32 lanes
    assert plan(64, 1, 6, 5, 5, 28, 28, 32, 32, st=(1, 2)) is None
    assert plan(64, 1, 6, 5, 5, 28, 28, 32, 32, padded=True) is None
    assert plan(64, 1, 6, 5, 5, 28, 28, 32, 32, p=dict(wide, WROWS=False)) is None
    assert plan(64, 6, 16, 5, 5, 10, 10, 14, 14, p=dict(wide, WROWS=True))[:2] == (4, 8)
    assert plan(64, 1, 6, 9, 9, 24, 24, 32, 32, p=dict(wide, WROWS=True)) is None  # S 9
    # the registers: MB S sums and the smaller operand within REGS - 3
    for regs in (16, 32):
        for S in range(1, 9):
            got = plan(8, 1, 24, 3, S, 30, 30, 30 + S, 30 + S,
                       p=dict(wide, REGS=regs, WROWS=True))
            if got is not None:
                assert got[0] * S + min(got[0], S) <= regs - 3
                assert (got[0] + 1) * S + min(got[0] + 1, S) > regs - 3 or \
                    -(-24 // (got[0] + 1)) == -(-24 // got[0])
    # slices of output rows: at least WROWS_ITEMS work-items a unit; a slice's dy and
    # input rows within half of L2 (VGG's 3 -> 64 at 224x224, rows of 226 columns)
    mb, _, G, rps = plan(64, 3, 32, 3, 3, 32, 32, 34, 34)
    assert G == -(-64 * 32 // rps) and G * 3 * 3 * -(-32 // mb) >= 8 * 2
    mb, _, G, rps = plan(8, 3, 64, 3, 3, 224, 224, 226, 226)
    per_row = 4 * (3 * 226 + 64 * 224)
    assert rps * per_row <= (2 << 20) // 2 < (rps + 1) * per_row
    assert G == -(-8 * 224 // rps)


def test_pixel_rows_where_they_pay():
    """_pixel_tile: pixel rows for small sums (input layers) and for output planes 4
    KiB apart (32x32 float32: the gathered kernel's stores of a work-item then share
    one cache set), the gathered kernel for long sums over other planes; never for a
    strided, checked-padding, dcol or too-short row; MB within the registers."""
    def pick(cols, Q, K, plane, dt=np.float32, p=GATHER, **kw):
        args = dict(padded=False, vstore=False)
        args.update(kw.pop("args", {}))
        steps = kw.pop("row_steps", (0, 1, 1))
        return conv_module._pixel_tile(p, dt, cols, (2, Q, Q), steps, (0, Q, 1, plane), K,
                                       **args)
    assert pick(32, 32, 27, 1024) == (4, 2, 8)                 # 3-channel input layer
    assert pick(32, 16, 288, 256) == (4, 2, 8)                 # 16x16, 32 -> 32
    assert pick(6, 28, 25, 784) == (6, 2, 8)                   # LeNet C1
    assert pick(64, 32, 576, 1024) is not None                 # 4 KiB planes
    assert pick(64, 56, 576, 3136) is None                     # 56x56x64
    assert pick(256, 14, 2304, 196) is None                    # rows of 14 < 16
    assert pick(32, 32, 27, 1024, dt=np.float64) == (4, 2, 4)  # rows of 8 doubles
    assert pick(32, 32, 27, 1024, row_steps=(0, 1, 2)) is None
    assert pick(32, 32, 27, 1024, args={"padded": True}) is None
    assert pick(32, 32, 27, 1024, args={"vstore": True}) is None
    assert pick(32, 32, 27, 1024, p=dict(GATHER, PIXELS=False)) is None
    assert pick(64, 56, 576, 3136, p=dict(GATHER, PIXELS=True)) is not None
    for regs in (16, 32):
        for cols in range(1, 80):
            mb, qv, _ = pick(cols, 32, 27, 1024, p=dict(GATHER, REGS=regs, PIXELS=True))
            assert mb * qv + qv + 1 <= regs
            assert -(-cols // mb) * mb < cols + mb


@pytest.mark.parametrize("dgrad", ["col2im", "flip"])
def test_padding_as_wide_as_the_filter(dgrad):
    """The flipped data gradient pads dy by R - 1 - ph, negative here: a crop, which
    it must leave to col2im (it once wrote before its padded copy's start)."""
    with tuning.override("conv", dict(GATHER, DGRAD=dgrad)):
        check_conv(1, 5, 2, 7, 1, 1, 1, (1, 1), (0, 1))
        check_conv(2, 3, 6, 5, 4, 3, 2, (1, 1), (3, 2))


_STRIDED = [(2, 9, 11, 13, 10, 3, 3, (2, 2), (1, 1)),     # ResNet's 3x3 stride 2, odd sizes
             (1, 3, 23, 21, 5, 7, 7, (2, 2), (3, 3)),      # a stem: 7x7 stride 2
             (2, 12, 10, 19, 8, 3, 2, (2, 3), (1, 0)),     # rows and columns apart
             (2, 5, 17, 9, 4, 4, 4, (3, 3), (1, 2)),       # stride 3, 4x4 taps
             (3, 4, 5, 30, 3, 3, 3, (2, 2), (0, 1)),       # rows of 15: two vectors
             (2, 6, 9, 33, 5, 1, 1, (2, 2), (0, 0)),       # 1x1: every other column 0
             (2, 5, 10, 23, 4, 3, 3, (2, 1), (1, 1))]      # unit stride along rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", _STRIDED, ids=str)
@pytest.mark.parametrize("groups", [False, True], ids=["one-group", "image-groups"])
def test_strided_dgrad_col2im_rows(monkeypatch, shape, dtype, groups):
    """A CPU's strided data gradient as dcol transposed (one batched GEMM of w^T and
    dy) and clnn_conv_col2im_rows (each dx row's columns phase by phase, dcol's runs
    as vectors, a run past dy's edges at both sides; stored as vectors at strides 1
    and 2, the two phases interleaved, element by element at a row's end and at
    stride 3): against float64 references with canaries around dx, every image in one
    group and an image a group."""
    N, C, H, W, M, R, S, (sh, sw), (ph, pw) = shape
    if groups:
        monkeypatch.setattr(conv_module, "SCRATCH_BYTES", 1)
    x = np.zeros((N, C, H, W), dtype)               # (the reference's shape only)
    w = RNG.standard_normal((M, C, R, S)).astype(dtype)
    dy = RNG.standard_normal((N, M, (H + 2 * ph - R) // sh + 1,
                              (W + 2 * pw - S) // sw + 1)).astype(dtype)
    dx_ref, _ = conv2d_backward_ref(dy, x, w, (sh, sw), (ph, pw))
    dx_scale, _ = conv2d_backward_ref(np.abs(dy), x, np.abs(w), (sh, sw), (ph, pw))
    dx = Guarded(clnn.device(), x.shape, dtype)
    with tuning.override("conv", GATHER), clnn.profile() as prof:
        clnn.conv2d_backward_data(guarded_input(clnn.device(), dy),
                                  guarded_input(clnn.device(), w), x.shape,
                                  stride=(sh, sw), padding=(ph, pw), out=dx.view)
    within(dx.check(), dx_ref, dx_scale, M * R * S, dtype)
    assert len(ran(prof, "clnn_conv_col2im_rows")) == (N if groups else 1)
    assert not ran(prof, "clnn_conv_col2im")


def test_strided_dgrad_col2im_rows_rule():
    """The rows col2im takes strided data gradients in float32 and float64 whose
    columns are at most 2 apart or whose taps overlap; 1x1 filters at stride 3, unit
    strides and 16-bit formats keep col2im."""
    rows = conv_module._col2im_rows
    f32, f64, f16 = (np.dtype(t) for t in (np.float32, np.float64, np.float16))
    assert rows(f32, 3, 3, (2, 2)) and rows(f64, 7, 7, (2, 2)) and rows(f32, 1, 3, (2, 2))
    assert rows(f32, 1, 1, (2, 2)) and rows(f32, 2, 2, (2, 2)) and rows(f32, 4, 4, (3, 3))
    assert not rows(f32, 1, 1, (3, 3)) and not rows(f32, 3, 3, (3, 3))
    assert not rows(f32, 3, 3, (1, 1)) and not rows(f16, 3, 3, (2, 2))
    with tuning.override("conv", GATHER), clnn.profile() as prof:
        check_conv(2, 6, 9, 11, 5, 1, 1, (3, 3), (0, 0))
    assert ran(prof, "clnn_conv_col2im") and not ran(prof, "clnn_conv_col2im_rows")


# (N, C, H, W, M, stride): 1x1 convolutions without padding, at strides that leave rows
# and columns out (their last ones too: 11 at stride 2, 10 at stride 3)
_POINTWISE = [(1, 1, 1, 1, 1, (1, 1)), (3, 5, 7, 11, 13, (1, 1)), (2, 17, 9, 11, 7, (2, 2)),
              (4, 3, 10, 6, 19, (3, 2)), (2, 6, 5, 10, 3, (1, 3))]


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", _POINTWISE, ids=str)
def test_pointwise_gemms(monkeypatch, shape, dtype):
    """A CPU's 1x1 convolutions as batched GEMMs of plain matrices, an image a batch
    (the bias and relu in the epilogue; at unit stride the data gradient as w^T dy), a
    strided one over clnn_conv_subsample's copy of its positions, as is its weight
    gradient (the gathered kernel over the copy): against float64 references with
    canaries around the outputs, inputs at offsets (the thresholds off: small shapes)."""
    monkeypatch.setattr(conv_module, "POINTWISE_MIN_COLS", 0)
    monkeypatch.setattr(conv_module, "POINTWISE_MIN_MACS", 0)
    N, C, H, W, M, st = shape
    dev = clnn.device()
    x = RNG.standard_normal((N, C, H, W)).astype(dtype)
    w = RNG.standard_normal((M, C, 1, 1)).astype(dtype)
    b = RNG.standard_normal(M).astype(dtype)
    X, Wd = guarded_input(dev, x), guarded_input(dev, w)
    ref = conv2d_ref(f64(x), f64(w), f64(b), st, (0, 0))
    scale = conv2d_ref(np.abs(f64(x)), np.abs(f64(w)), np.abs(f64(b)), st, (0, 0))
    y = Guarded(dev, ref.shape, dtype)
    dy = RNG.standard_normal(ref.shape).astype(dtype)
    dx_ref, dw_ref = conv2d_backward_ref(f64(dy), f64(x), f64(w), st, (0, 0))
    dx_scale, dw_scale = conv2d_backward_ref(np.abs(f64(dy)), np.abs(f64(x)),
                                             np.abs(f64(w)), st, (0, 0))
    dx, dw = Guarded(dev, x.shape, dtype), Guarded(dev, w.shape, dtype)
    with tuning.override("conv", GATHER), clnn.profile() as prof:
        clnn.conv2d(X, Wd, guarded_input(dev, b), stride=st, out=y.view, activation="relu")
        fwd = {r.entry for r in prof.records}
        clnn.conv2d_backward_data(guarded_input(dev, dy), Wd, x.shape, stride=st,
                                  out=dx.view)
        clnn.conv2d_backward_weight(guarded_input(dev, dy), X, w.shape, stride=st,
                                    out=dw.view)
    within(f64(y.check()), np.maximum(ref, 0), scale, C, dtype)
    within(f64(dx.check()), dx_ref, dx_scale, M, dtype)
    within(f64(dw.check()), dw_ref, dw_scale, N * ref.shape[2] * ref.shape[3], dtype)
    assert "clnn_conv_gather" not in fwd and "clnn_conv_pixels" not in fwd
    # the forward pass and the weight gradient each copy the strided positions once
    assert len(ran(prof, "clnn_conv_subsample")) == (0 if st == (1, 1) else 2)
    if st == (1, 1):     # the data gradient too is a GEMM (strided: dcol and col2im)
        assert not ran(prof, "clnn_conv_col2im") and len(ran(prof, "clnn_conv_gather")) == \
            len(ran(prof, "clnn_conv_pack"))            # (those the weight gradient ran)


@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 4), C=st.integers(1, 9), M=st.integers(1, 9), H=st.integers(1, 13),
       W=st.integers(1, 13), sh=st.integers(1, 3), sw=st.integers(1, 3))
def test_pointwise_gemms_on_random_shapes(N, C, M, H, W, sh, sw):
    """The 1x1 path (thresholds off) on random shapes and strides: forward with the
    bias and relu, both gradients and the bias gradient, against float64 with
    canaries (check_conv)."""
    with mock.patch.object(conv_module, "POINTWISE_MIN_COLS", 0), \
            mock.patch.object(conv_module, "POINTWISE_MIN_MACS", 0), \
            tuning.override("conv", GATHER), clnn.profile() as prof:
        check_conv(N, C, H, W, M, 1, 1, (sh, sw), (0, 0), act="relu")
    # the forward pass and the weight gradient copy a strided layer's positions; at
    # unit stride only the weight gradient runs the gathered kernel (a stride along an
    # axis of one output position comes back as the least that gives it: 1 where H or
    # W is 1)
    unit = conv_module.conv_geometry((N, C, H, W), (M, C, 1, 1), (sh, sw), 0)[9] == (1, 1)
    assert len(ran(prof, "clnn_conv_subsample")) == (0 if unit else 2)
    assert not unit or len(ran(prof, "clnn_conv_gather")) + \
        len(ran(prof, "clnn_conv_wgrad_rows")) == 1


def test_pointwise_gemms_rule(monkeypatch):
    """1x1 filters without padding on the gathered variant's devices, at any stride
    (dilation moves no tap of a 1x1 filter), images of 128 output positions or more,
    and for the passes that add launches 2^25 multiply-adds or more; the forward pass
    reads a strided input in place where its copy would pass PAD_BYTES; bitwise what
    the gathered kernel gave (each output the same sum in the same order of k)."""
    rule = conv_module._pointwise
    assert rule(GATHER, 1, 1, (0, 0), 128) and not rule(GATHER, 1, 1, (1, 0), 128)
    assert not rule(GATHER, 1, 3, (0, 0), 128) and not rule(GATHER, 3, 1, (0, 0), 128)
    assert not rule(CPU_GEMM, 1, 1, (0, 0), 128) and not rule(NV[0], 1, 1, (0, 0), 128)
    assert not rule(GATHER, 1, 1, (0, 0), 49)                   # 7x7 images
    assert rule(GATHER, 1, 1, (0, 0), 196, 1 << 25) and \
        not rule(GATHER, 1, 1, (0, 0), 196, (1 << 25) - 1)
    monkeypatch.setattr(conv_module, "POINTWISE_MIN_COLS", 0)
    x = RNG.standard_normal((3, 8, 9, 10)).astype(np.float32)
    w = RNG.standard_normal((16, 8, 1, 1)).astype(np.float32)
    ys, cap = {}, conv_module.PAD_BYTES
    with tuning.override("conv", GATHERED):
        for on, pad_bytes in ((True, cap), (True, 0), (False, None)):
            monkeypatch.setattr(conv_module, "POINTWISE_GEMM", on)
            if pad_bytes is not None:
                monkeypatch.setattr(conv_module, "PAD_BYTES", pad_bytes)
            with clnn.profile() as prof:
                ys[on, pad_bytes] = clnn.conv2d(clnn.asarray(x), clnn.asarray(w),
                                                stride=2).get()
            assert bool(ran(prof, "clnn_conv_gather")) == (not on or pad_bytes == 0)
    # bitwise where the GEMM is a CPU's packed one (a device with a GPU's facts, its
    # conv rows forced to the gathered variant, runs its tiled GEMM: to rounding)
    dev = clnn.device()
    packed = tuning.gemm_rows(dev.facts, 4, np.dtype(np.float32),
                              tuning.shape_class(16, 25, 8, batch=3))[0]["variant"] == "reg"
    for got in (ys[True, cap], ys[True, 0]):
        if packed:
            assert np.array_equal(got, ys[False, None])
        else:
            np.testing.assert_allclose(got, ys[False, None], rtol=1e-5, atol=1e-5)
    assert packed or not dev.facts.is_cpu
    # a weight gradient's copy follows PAD_BYTES alone, not the pool's budget: the copy
    # decides its image groups, so how it sums
    monkeypatch.setattr(conv_module, "POINTWISE_GEMM", True)
    monkeypatch.setattr(conv_module, "PAD_BYTES", cap)
    monkeypatch.setattr(conv_module, "POINTWISE_MIN_MACS", 0)
    monkeypatch.setattr(conv_module, "scratch_cap", lambda dev, n: 0)
    dy = clnn.asarray(RNG.standard_normal((3, 16, 5, 5)).astype(np.float32))
    with tuning.override("conv", GATHERED), clnn.profile() as prof:
        clnn.conv2d(clnn.asarray(x), clnn.asarray(w), stride=2)
        clnn.conv2d_backward_weight(dy, clnn.asarray(x), w.shape, stride=2)
    assert [r.entry for r in prof.records if r.entry in (
        "clnn_conv_subsample", "clnn_conv_gather")] == ["clnn_conv_gather"] + \
        ["clnn_conv_subsample", "clnn_conv_gather"]


def test_dgrad_method_follows_the_work():
    pick = conv_module._dgrad_method
    assert pick(16, 5, 5, 120, 1, 1, 5, 5) == "col2im"      # LeNet C5: 1x1 outputs
    assert pick(6, 14, 14, 16, 10, 10, 5, 5) == "flip"      # LeNet C3
    assert pick(64, 56, 56, 64, 56, 56, 3, 3) == "flip"     # same-size 3x3


def test_scratch_in_image_groups(monkeypatch):
    """With a tiny scratch bound the data gradient's dcol and the weight gradient's
    packed dy^T cover one image at a time (the weight gradient's later groups add
    into dw, after the first applied alpha and beta)."""
    monkeypatch.setattr(conv_module, "SCRATCH_BYTES", 1)
    with tuning.override("conv", dict(GATHER, DGRAD="col2im")):
        check_conv(3, 2, 7, 6, 3, 3, 2, (1, 2), (1, 0))
    check_weight_update(3, 2)


@pytest.mark.parametrize("split", [1, 3])
def test_gpu_col2im_in_image_groups(monkeypatch, split):
    """The GPU path's data gradient below 16 channels, dcol transposed an image a group
    (split-K's workspace taken once for all): against float64 with canaries."""
    monkeypatch.setattr(conv_module, "SCRATCH_BYTES", 1)
    monkeypatch.setattr(conv_module, "TILE_DIRECT_MAXM", 0)
    N, C, H, W, M, R, S, st, pd = 3, 2, 7, 6, 67, 3, 2, (2, 1), (1, 0)
    x = np.zeros((N, C, H, W), np.float32)
    w = RNG.standard_normal((M, C, R, S)).astype(np.float32)
    dy = RNG.standard_normal((N, M, (H + 2 * pd[0] - R) // st[0] + 1,
                              (W + 2 * pd[1] - S) // st[1] + 1)).astype(np.float32)
    dx_ref, _ = conv2d_backward_ref(dy, x, w, st, pd)
    dx_scale, _ = conv2d_backward_ref(np.abs(dy), x, np.abs(w), st, pd)
    dx = Guarded(clnn.device(), x.shape, np.float32)
    with tuning.override("gemm", dict(NV[-1], KSPLIT=split)), clnn.profile() as prof:
        clnn.conv2d_backward_data(guarded_input(clnn.device(), dy),
                                  guarded_input(clnn.device(), w), x.shape, stride=st,
                                  padding=pd, out=dx.view)
    within(dx.check(), dx_ref, dx_scale, M * R * S, np.float32)
    assert len(ran(prof, "clnn_conv_col2im_t")) == N
    assert bool(ran(prof, "clnn_gemm_splitk")) == (split > 1)


def wino_matrices(m):
    """|B^T|, |G|, |A^T| of F(m x m, 3x3) (winograd.cl's), float64."""
    if m == 2:
        mats = ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
                [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
                [[1, 1, 1, 0], [0, 1, -1, -1]])
    else:
        mats = ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                 [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
                [[1 / 4, 0, 0], [1 / 6, 1 / 6, 1 / 6], [1 / 6, 1 / 6, 1 / 6],
                 [1 / 24, 1 / 12, 1 / 6], [1 / 24, 1 / 12, 1 / 6], [0, 0, 1]],
                [[1, 1, 1, 1, 1, 0], [0, 1, 1, 2, 2, 0], [0, 1, 1, 4, 4, 0],
                 [0, 1, 1, 8, 8, 1]])
    return tuple(np.abs(np.array(a, dtype=np.float64)) for a in mats)


def _patches(x, pad, m, TH, TW):
    N, C, H, W = x.shape
    xp = np.zeros((N, C, m * TH + 2, m * TW + 2))
    xp[:, :, pad:pad + H, pad:pad + W] = np.abs(x.astype(np.float64))
    return np.lib.stride_tricks.sliding_window_view(xp, (m + 2, m + 2),
                                                    axis=(2, 3))[:, :, ::m, ::m]


def wino_scale(x, w, b, pad, m):
    """What F(m x m, 3x3) adds up, in magnitudes (float64): |A^T| (the sum over channels
    of |G| |g| |G^T| times |B^T| |d| |B|) |A|, plus |b|. Its rounding errors are bounded
    relative to this, not to the direct sums |x| * |w|: its transforms add and subtract
    several terms along each axis, with coefficients up to 8, before the products."""
    Bt, G, At = wino_matrices(m)
    N, C, H, W = x.shape
    P, Q = H + 2 * pad - 2, W + 2 * pad - 2
    TH, TW = -(-P // m), -(-Q // m)
    d = _patches(x, pad, m, TH, TW)
    u = np.einsum("ir,mcrs,js->mcij", G, np.abs(w.astype(np.float64)), G)
    v = np.einsum("ia,nctuab,jb->nctuij", Bt, d, Bt)
    y = np.einsum("pi,nmtuij,qj->nmtpuq", At, np.einsum("mcij,nctuij->nmtuij", u, v), At)
    y = y.reshape(N, -1, m * TH, m * TW)[:, :, :P, :Q]
    return y + (0 if b is None else np.abs(b.astype(np.float64))[None, :, None, None])


def wino_wgrad_scale(x, dy, pad, m):
    """wino_scale for the weight gradient: |G^T| (the sum over images and tiles of
    |A| |dy tile| |A^T| times |B^T| |d| |B|) |G|."""
    Bt, G, At = wino_matrices(m)
    N, M, P, Q = dy.shape
    TH, TW = -(-P // m), -(-Q // m)
    dq = np.zeros((N, M, m * TH, m * TW))
    dq[:, :, :P, :Q] = np.abs(dy.astype(np.float64))
    g = dq.reshape(N, M, TH, m, TW, m).transpose(0, 1, 2, 4, 3, 5)
    v = np.einsum("ia,nctuab,jb->nctuij", Bt, _patches(x, pad, m, TH, TW), Bt)
    y = np.einsum("ai,nmtuij,bj->nmtuab", At.T, g, At.T)
    z = np.einsum("nmtuij,nctuij->mcij", y, v)
    return np.einsum("ri,mcij,sj->mcrs", G.T, z, G.T)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(3, 5, 7, 9, 6, 1), (2, 4, 6, 6, 3, 0), (1, 2, 1, 4, 5, 2),
                                   (2, 3, 8, 5, 1, 2), (1, 1, 3, 3, 1, 0), (1, 3, 11, 10, 2, 1),
                                   (2, 19, 9, 10, 17, 1)])
def test_winograd(dtype, shape, m):
    """Winograd's F(m x m, 3x3) (winograd.cl), forced: the forward pass with bias and relu,
    the unit-stride data gradient (the filters turned) and the weight gradient (alpha
    and beta), on odd sizes (tiles past the output's edge, a 1-row input, channels and
    tiles over several GEMM panels and short of whole ones), paddings 0 to 2, inside
    canaries, in every dtype, against the float64 loops within the error bound of what
    Winograd adds up. dy's transform takes the packed GEMM's panels of 6 channels per
    work-item where a CPU vector holds 6 (floats; doubles: a channel per work-item)."""
    with tuning.override("gemm", CPU_GEMM):
        prof = _check_winograd(dtype, shape, m)
    assert {r.params["dyv"] for r in ran(prof, "clnn_wino_dy")} == \
        {1 if dtype == np.float64 else 6}


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape,m", [((2, 5, 9, 29, 6, 1), 4), ((1, 3, 6, 31, 4, 0), 4),
                                     ((2, 4, 5, 30, 3, 2), 4), ((1, 3, 5, 16, 4, 1), 2),
                                     ((2, 19, 3, 30, 17, 1), 4)])
def test_winograd_input_rows(monkeypatch, dtype, shape, m):
    """Where a forward pass's (or a flipped data gradient's) tile rows are whole CPU
    vectors of tiles (8 floats, 4 doubles), its input transform puts a row's tiles in
    the lanes and reads the input rows as vectors (clnn_wino_input_rows): edge vectors
    at both sides, paddings 0 to 2, rows past the input's bottom, channels over several
    panels; the outputs are bitwise those of clnn_wino_input (channels in the lanes).
    (Rows of one vector of tiles, which floats take in runs of tiles: the rows kernel
    forced with WINO_ROWS_MIN_VECTORS 1.)"""
    from clnn import programs
    lanes = 8 if programs.acc_dtype(np.dtype(dtype)) == np.float32 else 4
    monkeypatch.setattr(conv_module, "WINO_ROWS_MIN_VECTORS", 1)
    N, C, H, W, M, pad = shape
    prof = _check_winograd(dtype, shape, m)
    # the forward pass's tile rows (of its W + 2 pad - 2 outputs), the data gradient's
    # (of W)
    rows = [-(-q // m) % lanes == 0 for q in (W + 2 * pad - 2, W)]
    assert len(ran(prof, "clnn_wino_input_rows")) == sum(rows) >= 1, shape
    x = RNG.standard_normal((N, C, H, W)).astype(dtype)
    w = RNG.standard_normal((M, C, 3, 3)).astype(dtype)
    outs = []
    for rows in (True, False):
        monkeypatch.setattr(sys.modules["clnn.ops.conv"], "WINO_INPUT_ROWS", rows)
        with tuning.override("conv", dict(GATHER, WINO=True, WINO_M=m)):
            outs.append(clnn.conv2d(clnn.asarray(x), clnn.asarray(w), padding=pad).get())
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("shape,dilation", [((3, 19, 9, 10, 17, 1), (1, 1)),
                                            ((2, 9, 10, 13, 17, 3), (2, 3))])
@pytest.mark.parametrize("group_bytes", [None, 1], ids=["one-group", "image-groups"])
def test_winograd_float16_input_copy(monkeypatch, shape, dilation, group_bytes):
    """float16 input to the channel-lane input transform goes through a float copy of
    each group of images (WINO_X_COPY: clnn_cast's kernel, then clnn_wino_input reading
    floats) in the forward pass, the flipped data gradient and the weight gradient, one
    group or an image at a time, dilated phases too: bitwise the results of converting
    every load (a half converts to float exactly)."""
    N, C, H, W, M, pad = shape
    x = clnn.asarray(RNG.standard_normal((N, C, H, W)).astype(np.float16))
    w = clnn.asarray(RNG.standard_normal((M, C, 3, 3)).astype(np.float16))
    b = clnn.asarray(RNG.standard_normal(M).astype(np.float16))
    y = clnn.conv2d(x, w, padding=pad, dilation=dilation)
    dy = clnn.asarray(RNG.standard_normal(y.shape).astype(np.float16))
    if group_bytes:
        monkeypatch.setattr(conv_module, "WINO_GROUP_BYTES", group_bytes)
    results = {}
    for copy in (True, False):
        monkeypatch.setattr(conv_module, "WINO_X_COPY", copy)
        with tuning.override("conv", dict(GATHER, WINO=True, WINO_M=4, DGRAD="flip")), \
                clnn.profile() as prof:
            results[copy] = [
                clnn.conv2d(x, w, b, padding=pad, dilation=dilation,
                            activation="relu").get(),
                clnn.conv2d_backward_data(dy, w, x.shape, padding=pad,
                                          dilation=dilation).get(),
                clnn.conv2d_backward_weight(dy, x, w.shape, padding=pad,
                                            dilation=dilation).get()]
        inputs = ran(prof, "clnn_wino_input") + ran(prof, "clnn_wino_input_runs")
        assert len(inputs) >= 3 and {r.params["x_acc"] for r in inputs} == {copy}
        # one copy per group of images (an image at a time: N per op)
        copies = len(ran(prof, "clnn_cast"))
        assert copies == (0 if not copy else 3 * (N if group_bytes else 1))
    for a, b_ in zip(results[True], results[False]):
        assert np.array_equal(a, b_)


def test_winograd_bands_rule():
    """The channel-lane transforms split tile rows into bands until their work-items
    make WINO_BAND_GROUPS work-groups a compute unit, never more bands than rows."""
    dev = types.SimpleNamespace(facts=types.SimpleNamespace(compute_units=2))
    band = conv_module._wino_band
    assert conv_module.WINO_BAND_GROUPS == 2
    assert band(dev, 8, 4, 56) == (7, 32)      # one 224x224 image of 32 channels: 8 bands
    assert band(dev, 8, 8, 28) == (7, 32)      # two 112x112 images: 4 bands
    assert band(dev, 8, 5, 28) == (4, 35)      # 7 bands of 4 rows
    assert band(dev, 8, 32, 14) == (14, 32)    # the work-items fill the device: one band
    assert band(dev, 8, 1000, 3) == (3, 1000)
    assert band(dev, 8, 1, 3) == (1, 3)        # every row a band
    assert band(dev, 8, 1, 1) == (1, 1)
    dev.facts.compute_units = 16
    assert band(dev, 8, 32, 14) == (2, 224)


@pytest.mark.parametrize("shape,dilation,dtype", [
    ((2, 5, 17, 13, 6, 1), (1, 1), np.float32),
    ((1, 19, 14, 9, 17, 1), (1, 1), np.float32),
    ((2, 9, 26, 13, 7, 3), (2, 3), np.float32),
    ((1, 11, 13, 21, 9, 1), (1, 1), np.float16)], ids=str)
def test_winograd_tile_row_bands(monkeypatch, shape, dilation, dtype):
    """The channel-lane input transform and dy's transform in bands of tile rows (every
    row its own band, and halves with a shorter last one where the rows are odd) give
    bitwise the results of one band per work-item, for the forward pass, the flipped
    data gradient and the weight gradient (dilated phases, a float16 input through its
    float copy); the banded results against float64 references, canaries around them.
    (The forward passes' input transforms forced to channels in the lanes: they take
    runs of tiles, clnn_wino_input_runs, by default.)"""
    N, C, H, W, M, pad = shape
    x = clnn.asarray(RNG.standard_normal((N, C, H, W)).astype(dtype))
    w = clnn.asarray(RNG.standard_normal((M, C, 3, 3)).astype(dtype))
    y = clnn.conv2d(x, w, padding=pad, dilation=dilation)
    dy = clnn.asarray(RNG.standard_normal(y.shape).astype(dtype))
    monkeypatch.setattr(conv_module, "WINO_INPUT_ROWS", False)
    monkeypatch.setattr(conv_module, "WINO_INPUT_RUNS", False)
    modes = {"one": lambda th: th, "halves": lambda th: -(-th // 2), "rows": lambda th: 1}
    results, bands = {}, []

    def forced(rows):
        def band(dev, wg, items, TH):
            bands.append(TH)
            return rows(TH), items * -(-TH // rows(TH))
        return band

    for mode, tb in modes.items():
        monkeypatch.setattr(conv_module, "_wino_band", forced(tb))
        bands.clear()
        with tuning.override("conv", dict(GATHER, WINO=True, WINO_M=4, DGRAD="flip")), \
                clnn.profile() as prof:
            results[mode] = [
                clnn.conv2d(x, w, padding=pad, dilation=dilation).get(),
                clnn.conv2d_backward_data(dy, w, x.shape, padding=pad,
                                          dilation=dilation).get(),
                clnn.conv2d_backward_weight(dy, x, w.shape, padding=pad,
                                            dilation=dilation).get()]
        # three input transforms and one of dy a phase, each in its bands
        assert len(bands) == 4 * dilation[0] * dilation[1] == \
            len(ran(prof, "clnn_wino_input")) + len(ran(prof, "clnn_wino_dy"))
    assert max(bands) >= 3
    for banded in ("halves", "rows"):
        for a, b in zip(results[banded], results["one"]):
            assert np.array_equal(a, b)
    monkeypatch.undo()
    monkeypatch.setattr(conv_module, "WINO_BAND_GROUPS", 10 ** 6)    # the rule: a row each
    _check_winograd(dtype, shape, 4, dilation=dilation)


_RUNS = [((2, 5, 17, 13, 6, 1), (1, 1), np.float32),     # tile rows of 4: runs span 3
         ((3, 4, 11, 26, 9, 0), (1, 1), np.float32),     # rows of 6, 18 tiles an image
         ((1, 40, 6, 7, 3, 1), (1, 1), np.float32),      # 4 tiles: channels in 20 blocks
         ((2, 9, 26, 13, 7, 3), (2, 3), np.float32),     # dilated phases
         ((2, 5, 9, 33, 6, 2), (1, 1), np.float32),      # rows of 9
         ((1, 11, 13, 21, 9, 1), (1, 1), np.float16)]    # through the float copy


def test_winograd_run_channels_rule():
    """clnn_wino_input_runs splits the channels into blocks until its work-items make
    WINO_BAND_GROUPS work-groups a compute unit; all channels where the runs do."""
    dev = types.SimpleNamespace(facts=types.SimpleNamespace(compute_units=2))
    channels = conv_module._wino_run_channels
    assert channels(dev, 8, 98, 64) == 64      # 56x56, 4 images: 98 runs
    assert channels(dev, 8, 32, 64) == 64
    assert channels(dev, 8, 16, 64) == 32      # two blocks
    assert channels(dev, 8, 1, 40) == 2        # 32 work-items wanted: 20 blocks of 2
    assert channels(dev, 8, 1, 3) == 1
    dev.facts.compute_units = 16
    assert channels(dev, 8, 98, 64) == 22      # 3 blocks (294 work-items)
    # the rule: float sums into panels of whole vectors of tiles, or plain matrices
    runs, f32, f64 = conv_module._wino_runs, np.dtype(np.float32), np.dtype(np.float64)
    assert runs(f32, 32, (8, 32)) and runs(f32, 16, (6, 16)) and runs(f32, 1, None)
    assert not runs(f32, 12, (8, 12)) and not runs(f64, 32, (6, 32))
    assert not runs(f64, 1, None)
    # the rows kernel where runs could take a forward pass: rows of two vectors or more
    one, two = ({"TW": tw, "x": {"s2": 1}} for tw in (8, 16))
    rows = conv_module._wino_rows
    assert conv_module.WINO_ROWS_MIN_VECTORS == 2
    assert rows(f32, [one]) and not rows(f32, [one], True) and rows(f32, [two], True)
    assert rows(f64, [one], False) and not rows(f32, [one, one])
    assert not rows(f32, [{"TW": 12, "x": {"s2": 1}}])


@pytest.mark.parametrize("shape,dilation,dtype", _RUNS, ids=str)
def test_winograd_input_runs(monkeypatch, shape, dilation, dtype):
    """A forward pass's and a flipped data gradient's input transform in runs of a
    vector's lanes of tiles (clnn_wino_input_runs: runs across tile rows and images, a
    last run past the tiles, padded edges at every side, dilated phases, the channels
    split into blocks where the runs are few): bitwise the results of channels in the
    lanes (clnn_wino_input), and against float64 references with canaries."""
    N, C, H, W, M, pad = shape
    xh, wh = (RNG.standard_normal(s).astype(dtype) for s in ((N, C, H, W), (M, C, 3, 3)))
    x, w = clnn.asarray(xh), clnn.asarray(wh)
    dy = clnn.asarray(RNG.standard_normal(clnn.conv2d(x, w, padding=pad,
                                                      dilation=dilation).shape).astype(dtype))
    monkeypatch.setattr(conv_module, "WINO_INPUT_ROWS", False)
    wino = dict(GATHER, WINO=True, WINO_M=4, DGRAD="flip")
    results, blocks = {}, []
    channels = conv_module._wino_run_channels

    def counted(dev, wg, runs, C):
        blocks.append(-(-C // channels(dev, wg, runs, C)))
        return channels(dev, wg, runs, C)
    monkeypatch.setattr(conv_module, "_wino_run_channels", counted)
    for runs in (True, False):
        monkeypatch.setattr(conv_module, "WINO_INPUT_RUNS", runs)
        with tuning.override("conv", wino), clnn.profile() as prof:
            results[runs] = [clnn.conv2d(x, w, padding=pad, dilation=dilation).get(),
                             clnn.conv2d_backward_data(dy, w, x.shape, padding=pad,
                                                       dilation=dilation).get()]
        assert len(ran(prof, "clnn_wino_input_runs")) == \
            (2 * dilation[0] * dilation[1] if runs else 0)
    if C == 40:
        assert max(blocks) > 1          # one run of 4 tiles: the channels in blocks
    for a, b in zip(results[True], results[False]):
        assert np.array_equal(a, b)
    monkeypatch.undo()
    monkeypatch.setattr(conv_module, "WINO_INPUT_ROWS", False)
    _check_winograd(dtype, shape, 4, dilation=dilation)


# every shape in float32; the others' formats on one shape each (double lanes: 4)
_BY_ROWS = [((2, 3, 5, 27, 5, 1), t) for t in float_dtypes() if t == np.float64] + \
    [((2, 5, 9, 33, 6, 2), t) for t in float_dtypes() if np.dtype(t).itemsize == 2] + \
    [(s, np.float32) for s in ((2, 3, 5, 27, 5, 1), (1, 4, 6, 38, 3, 0), (2, 5, 9, 33, 6, 2),
                               (1, 3, 4, 5, 2, 1))]


@pytest.mark.parametrize("shape,dtype", _BY_ROWS,
                         ids=[f"{s}-{np.dtype(t).name}" for s, t in _BY_ROWS])
def test_winograd_output_by_rows(monkeypatch, shape, dtype):
    """The output transform by tile rows (each output row's run stored as vectors
    through the epilogue, a row's last work-item short of a vector, columns past the
    output's edge left alone) and by runs of any tiles (lane by lane): bitwise the same
    forward pass (bias and relu) and flipped data gradient; tile rows of 7, 9, 9 and 2
    in the forward pass, and the data gradient's; by rows against float64 references,
    in float32 also with a tanh (computed on whole vectors on CPUs)."""
    N, C, H, W, M, pad = shape
    xh, wh = (RNG.standard_normal(s).astype(dtype) for s in ((N, C, H, W), (M, C, 3, 3)))
    bh = RNG.standard_normal(M).astype(dtype)
    x, w, b = clnn.asarray(xh), clnn.asarray(wh), clnn.asarray(bh)
    y = clnn.conv2d(x, w, padding=pad)
    dy = clnn.asarray(RNG.standard_normal(y.shape).astype(dtype))
    wino = dict(GATHER, WINO=True, WINO_M=4, DGRAD="flip")
    results = {}
    for lanes in (10 ** 6, 0):          # no phase by rows; every one
        monkeypatch.setattr(conv_module, "WINO_OUTPUT_ROW_LANES", lanes)
        with tuning.override("conv", wino), clnn.profile() as prof:
            results[lanes] = [
                clnn.conv2d(x, w, b, padding=pad, activation="relu").get(),
                clnn.conv2d_backward_data(dy, w, x.shape, padding=pad).get()]
        assert len(ran(prof, "clnn_wino_output")) == 2
    for a, b_ in zip(results[0], results[10 ** 6]):
        assert np.array_equal(a, b_)
    if dtype == np.float32:
        with tuning.override("conv", wino):
            got = clnn.conv2d(x, w, b, padding=pad, activation="tanh").get()
        # tanh is 1-Lipschitz: the sums' bound holds after it, plus its own rounding
        within(got, np.tanh(conv2d_ref(f64(xh), f64(wh), f64(bh), (1, 1), (pad, pad))),
               wino_scale(f64(xh), f64(wh), f64(bh), pad, 4) + 1.0, C * 9, dtype)
    _check_winograd(dtype, shape, 4)


@pytest.mark.parametrize("shape", [(3, 5, 7, 9, 6, 1), (2, 19, 9, 10, 17, 1)])
def test_winograd_plain_gemms(shape):
    """Where the GEMM rows are not the packed CPU variant's (a forced tiled row), the
    transforms write plain matrices and run_gemm multiplies them: the same results
    (the forward passes' input transform in runs of tiles, a last run short of a
    vector stored lane by lane, the next channel's row right after it)."""
    with tuning.override("gemm", NV[0]):
        prof = _check_winograd(np.float32, shape, 4, packed=False)
    assert len(ran(prof, "clnn_wino_input_runs")) == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda t: np.dtype(t).name)
def test_winograd_narrow_panels(dtype):
    """Panels of 12 and 5 columns: channel vectors that straddle two panels go out lane
    by lane (clnn_wino_input's whole vectors only inside one). And A panels of 8, 5, 3
    and 2 rows: dy's transform takes a panel's channels per work-item (stored in runs of
    8, 4, 2 and 1) where a CPU vector holds them (8 floats, 4 doubles), else one
    channel; and panels of 4 rows (4 channels in floats and in doubles)."""
    lanes = 8 if dtype == np.float32 else 4
    for mwi, nwi, vw in ((5, 12, 4), (5, 5, 1), (3, 16, 8), (2, 8, 8), (8, 16, 8),
                         (4, 16, 8)):
        with tuning.override("gemm", dict(CPU_GEMM, MWI=mwi, NWI=nwi, VW=vw)):
            prof = _check_winograd(dtype, (2, 19, 9, 10, 17, 1), 4)
        assert {r.params["dyv"] for r in ran(prof, "clnn_wino_dy")} == \
            {mwi if mwi <= lanes else 1}


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape,dilation", [((2, 5, 9, 11, 6, 2), (2, 2)),
                                            ((1, 3, 12, 7, 4, 1), (3, 2)),
                                            ((2, 9, 10, 13, 17, 3), (2, 3)),
                                            ((1, 2, 5, 6, 3, 0), (2, 1))])
def test_winograd_dilated(dtype, shape, dilation):
    """Dilated 3x3 convolutions take Winograd phase by phase: output rows a, a + dh, ...
    are an undilated convolution of input rows (a - ph) mod dh, ... (odd sizes,
    paddings that are and are not multiples of the dilation, phases of different
    sizes, one that reads no input row)."""
    _check_winograd(dtype, shape, 4, dilation=dilation)


def _phase_scale(scale, x, pad, d, *rest):
    """A Winograd error scale (wino_scale, wino_wgrad_scale) for a convolution dilated
    by d with padding ``pad`` (an int or a pair): that of each output phase's undilated
    convolution over its input phase."""
    (dh, dw), (ph, pw) = d, (pad if isinstance(pad, tuple) else (pad, pad))
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    if scale is wino_wgrad_scale:
        dy, m = rest
        return sum(scale(xp[:, :, a::dh, b::dw], dy[:, :, a::dh, b::dw], 0, m)
                   for a in range(dh) for b in range(dw) if dy[:, :, a::dh, b::dw].size)
    w, bias, m = rest
    out = np.zeros((x.shape[0], w.shape[0], xp.shape[2] - 2 * dh, xp.shape[3] - 2 * dw))
    for a in range(dh):
        for b in range(dw):
            if out[:, :, a::dh, b::dw].size:
                out[:, :, a::dh, b::dw] = scale(xp[:, :, a::dh, b::dw], w, bias, 0, m)
    return out


def _check_winograd(dtype, shape, m, packed=True, dilation=(1, 1)):
    N, C, H, W, M, pad = shape
    dh, dw = dilation
    x = RNG.standard_normal((N, C, H, W)).astype(dtype)
    w = RNG.standard_normal((M, C, 3, 3)).astype(dtype)
    b = RNG.standard_normal(M).astype(dtype)
    f = np.float64
    ref, backward = conv2d_general_ref(x.astype(f), w.astype(f), b.astype(f), (1, 1),
                                       (pad, pad), dilation)
    dy = RNG.standard_normal(ref.shape).astype(dtype)
    dx_ref, dw_ref = backward(dy.astype(f))
    dev = clnn.device()
    X, Wd, B, DY = (guarded_input(dev, a) for a in (x, w, b, dy))
    y, dx = Guarded(dev, ref.shape, dtype), Guarded(dev, x.shape, dtype)
    dw_out = Guarded(dev, w.shape, dtype, fill=w)
    with tuning.override("conv", dict(GATHER, WINO=True, WINO_M=m, DGRAD="flip")), \
            clnn.profile() as prof:
        clnn.conv2d(X, Wd, B, padding=pad, dilation=dilation, out=y.view, activation="relu")
        clnn.conv2d_backward_data(DY, Wd, x.shape, padding=pad, dilation=dilation,
                                  out=dx.view)
        clnn.conv2d_backward_weight(DY, X, w.shape, padding=pad, dilation=dilation,
                                    out=dw_out.view, alpha=-0.5, beta=0.75)
    assert len(ran(prof, "clnn_wino_dw")) == 1
    assert len(ran(prof, "clnn_wino_output")) >= 2
    if not packed:                  # (dy's transform: a channel per work-item)
        assert {r.params["dyv"] for r in ran(prof, "clnn_wino_dy")} == {1}
    assert not ran(prof, "clnn_conv_gather") and not ran(prof, "clnn_conv_pixels")
    # packed: the transforms wrote the panels, nothing packed them again (where the
    # device's GEMMs are the packed CPU variant: a GPU's tiled GEMM takes plain matrices)
    packed = packed and bool(gemm_module.panel_widths(tuning.gemm_rows(dev.facts, 4)))
    assert bool(ran(prof, "clnn_gemm_packed")) == packed
    assert not ran(prof, "clnn_pack_a") and not ran(prof, "clnn_pack_b")
    w64 = w.astype(f)
    within(dw_out.check(), 0.75 * w64 - 0.5 * dw_ref,
           0.75 * np.abs(w64) + 0.5 * _phase_scale(wino_wgrad_scale, x, pad, dilation, dy, m),
           N * ref[0, 0].size, dtype)
    within(y.check(), np.maximum(ref, 0), _phase_scale(wino_scale, x, pad, dilation, w, b, m),
           C * 9, dtype)
    turned = w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1]
    within(dx.check(), dx_ref,
           _phase_scale(wino_scale, dy, (2 * dh - pad, 2 * dw - pad), dilation, turned, None,
                        m), M * 9,
           dtype)
    return prof


def test_winograd_choice_and_groups(monkeypatch):
    """The library takes Winograd's F(WINO_M x WINO_M, 3x3) by itself for 3x3 layers at
    unit stride (dilated ones too) where the two channel counts' harmonic mean reaches
    WINO_CHANNELS (not strided or 1x1 ones, nor narrow ones), for all three ops; images
    go in groups whose transforms fit WINO_GROUP_BYTES (one image's within
    SCRATCH_BYTES, else the gathered kernel), the forward pass bitwise as in one, the
    weight gradient's groups adding into one sum."""
    wino = conv_module._winograd
    assert wino(GATHER, 128, 128, 3, 3, (1, 1), (1, 1))
    assert wino(GATHER, 256, 512, 3, 3, (1, 1), (1, 1))
    assert wino(GATHER, 64, 128, 3, 3, (1, 1), (1, 1))
    assert wino(GATHER, 32, 64, 3, 3, (1, 1), (1, 1))           # harmonic mean 42.7
    assert wino(GATHER, 64, 32, 3, 3, (1, 1), (1, 1))
    assert wino(GATHER, 24, 96, 3, 3, (1, 1), (1, 1))           # 38.4
    assert not wino(GATHER, 32, 32, 3, 3, (1, 1), (1, 1))
    assert not wino(GATHER, 24, 64, 3, 3, (1, 1), (1, 1))       # 34.9
    assert not wino(GATHER, 16, 4096, 3, 3, (1, 1), (1, 1))     # 31.9
    assert not wino(GATHER, 256, 256, 3, 3, (2, 2), (1, 1))
    assert wino(GATHER, 256, 256, 3, 3, (1, 1), (2, 2))          # phase by phase
    assert not wino(GATHER, 256, 256, 1, 1, (1, 1), (1, 1))
    assert not wino(GATHER, 256, 256, 3, 3, (1, 1), (1, 1), groups=2)
    assert not wino(NV[0], 256, 256, 3, 3, (1, 1), (1, 1))          # GPU rows: not yet
    assert wino(dict(GATHER, WINO=True), 2, 3, 3, 3, (1, 1), (1, 1))
    assert wino(GATHER, 32, 64, 3, 3, (1, 1), (1, 1), wgrad=True)
    assert not wino(GATHER, 32, 32, 3, 3, (1, 1), (1, 1), wgrad=True)
    # AVX-512 code's row: its own thresholds, lower for weight gradients
    lanes = tuning.CONV_TABLE["lanes"][("CPU", 16)]
    assert (lanes["WINO_CHANNELS"], lanes["WINO_WGRAD_CHANNELS"]) == (26, 14)
    assert wino(lanes, 32, 32, 3, 3, (1, 1), (1, 1))
    assert wino(lanes, 24, 32, 3, 3, (1, 1), (1, 1))            # 27.4
    assert not wino(lanes, 16, 64, 3, 3, (1, 1), (1, 1))        # 25.6
    assert not wino(lanes, 16, 16, 3, 3, (1, 1), (1, 1))
    assert wino(lanes, 16, 16, 3, 3, (1, 1), (1, 1), wgrad=True)
    assert wino(lanes, 12, 32, 3, 3, (1, 1), (1, 1), wgrad=True)  # 17.5
    assert not wino(lanes, 8, 16, 3, 3, (1, 1), (1, 1), wgrad=True)  # 10.7
    assert not wino(dict(lanes, WINO=False), 64, 64, 3, 3, (1, 1), (1, 1), wgrad=True)
    assert conv_module._wino_tile(GATHER) == 4
    # an image whose transforms pass SCRATCH_BYTES takes the gathered kernel (at 56x56,
    # 256 channels: 36 x 14 x 14 x 512 floats, 14.5 MB; 224x224: 231 MB)
    f32 = np.float32
    assert wino(GATHER, 256, 256, 3, 3, (1, 1), (1, 1), dt=f32, P=56, Q=56)
    assert not wino(dict(GATHER, WINO=True), 256, 256, 3, 3, (1, 1), (1, 1), dt=f32,
                    P=224, Q=224)
    # the ops ask: with the threshold at 4 channels, a 4-channel layer's three ops take
    # it (F(4x4)), a 3-channel one's none
    monkeypatch.setattr(conv_module, "WINO_CHANNELS", 4)
    for c, n in ((3, 0), (4, 1)):
        x4 = clnn.asarray(RNG.standard_normal((2, c, 5, 6)).astype(np.float32))
        w4 = clnn.asarray(RNG.standard_normal((4, c, 3, 3)).astype(np.float32))
        dy4 = clnn.asarray(RNG.standard_normal((2, 4, 5, 6)).astype(np.float32))
        with tuning.override("conv", dict(GATHER, DGRAD="flip")), clnn.profile() as prof:
            clnn.conv2d(x4, w4, padding=1)
            clnn.conv2d_backward_data(dy4, w4, x4.shape, padding=1)
            clnn.conv2d_backward_weight(dy4, x4, w4.shape, padding=1)
        assert len(ran(prof, "clnn_wino_output")) == 2 * n
        assert len(ran(prof, "clnn_wino_dw")) == n
        assert all(r.params["m"] == 4 for r in ran(prof, "clnn_wino_input"))
    # and none of the three when one image's transforms (36 x 2 x 2 tiles x 8 channels
    # of floats, 4608 bytes) pass SCRATCH_BYTES
    monkeypatch.setattr(conv_module, "SCRATCH_BYTES", 4600)
    with tuning.override("conv", dict(GATHER, DGRAD="flip")), clnn.profile() as prof:
        clnn.conv2d(x4, w4, padding=1)
        clnn.conv2d_backward_data(dy4, w4, x4.shape, padding=1)
        clnn.conv2d_backward_weight(dy4, x4, w4.shape, padding=1)
    assert not [r for r in prof.records if r.entry.startswith("clnn_wino")]
    monkeypatch.undo()
    # a row's thresholds: a 4-channel layer's weight gradient alone takes it
    row = dict(GATHER, DGRAD="flip", WINO_CHANNELS=5, WINO_WGRAD_CHANNELS=4)
    with tuning.override("conv", row), clnn.profile() as prof:
        clnn.conv2d(x4, w4, padding=1)
        clnn.conv2d_backward_data(dy4, w4, x4.shape, padding=1)
        dw4 = clnn.conv2d_backward_weight(dy4, x4, w4.shape, padding=1)
    assert not ran(prof, "clnn_wino_output") and len(ran(prof, "clnn_wino_dw")) == 1
    _, backward = conv2d_general_ref(f64(x4.get()), f64(w4.get()), None, (1, 1), (1, 1))
    want = backward(f64(dy4.get()))[1]
    assert np.allclose(dw4.get(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())

    x = RNG.standard_normal((5, 3, 6, 7)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    dy = RNG.standard_normal((5, 4, 6, 7)).astype(np.float32)
    X, Wd, DY = clnn.asarray(x), clnn.asarray(w), clnn.asarray(dy)
    for m in (2, 4):
        with tuning.override("conv", dict(GATHER, WINO=True, WINO_M=m)):
            whole = clnn.conv2d(X, Wd, padding=1).get()
            # an image's transforms: (m + 2)^2 planes of (3 + 4) channels' tiles, floats:
            # groups of 2, 2 and 1
            image = (m + 2) ** 2 * 7 * (-(-6 // m)) * (-(-7 // m)) * 4
            monkeypatch.setattr(conv_module, "WINO_GROUP_BYTES", 2 * image + 5)
            with clnn.profile() as prof:
                y = clnn.conv2d(X, Wd, padding=1).get()
                dw = clnn.conv2d_backward_weight(DY, X, w.shape, padding=1).get()
        assert len(ran(prof, "clnn_wino_output")) == 3 and len(ran(prof, "clnn_wino_dy")) == 3
        assert y.tobytes() == whole.tobytes()
        within(y, conv2d_ref(x, w, None, (1, 1), (1, 1)), wino_scale(x, w, None, 1, m), 27,
               np.float32)
        # the weight gradient's groups add into one sum
        _, dw_ref = conv2d_backward_ref(dy, x, w, (1, 1), (1, 1))
        within(dw, dw_ref, wino_wgrad_scale(x, dy, 1, m), 5 * 42, np.float32)
        monkeypatch.undo()


def test_weight_gradient_groups_fit_half_the_cache(monkeypatch):
    """A weight gradient packs dy^T for a group of images whose input and packed dy^T
    fit half the device's cache (the rows-first kernel re-reads its panels and the
    input): 5 images of 2 channels at 7x7 padded to 9x9 and 3 filters (one panel of 8
    columns), with room for two, run in groups of 2, 2 and 1, alpha and beta applied
    once. (With room for the input alone the 5 would be one group.)"""
    dev = clnn.device()
    x = RNG.standard_normal((5, 2, 7, 7)).astype(np.float32)
    dy = RNG.standard_normal((5, 3, 7, 7)).astype(np.float32)
    v = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    _, dw = conv2d_backward_ref(dy, x, v, (1, 1), (1, 1))
    image = 2 * 9 * 9 * 4 + 8 * 7 * 7 * 4         # input and packed dy^T, bytes
    monkeypatch.setattr(dev, "facts", dataclasses.replace(dev.facts, cache_size=2 * 2 * image))
    V = Guarded(dev, v.shape, np.float32, fill=v)
    with tuning.override("conv", GATHER), clnn.profile() as prof:
        clnn.conv2d_backward_weight(clnn.asarray(dy), clnn.asarray(x), v.shape,
                                    out=V.view, padding=1, alpha=-0.5, beta=0.9)
    gathers = [r for r in prof.records if r.entry in ("clnn_conv_gather",
                                                       "clnn_conv_pixels")]
    assert [dict(r.params["tuning"])["NWI"] for r in gathers] == [8, 8, 8]
    np.testing.assert_allclose(V.check(), 0.9 * v - 0.5 * dw, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
def test_weight_gradient_groups_keep_their_panels_in_half_of_l2(monkeypatch, dtype):
    """With a core's L2 known (a CPU's), a weight gradient whose tile has
    WGRAD_L2_BLOCKS row blocks or more runs in groups of images whose panel of dy^T
    fits half of it: 5 images of 8 channels, 3x3 (72 taps, 9 blocks of 8), 3 filters
    (a panel of 8 columns), with room for two images' panels, run in groups of 2, 2
    and 1, alpha and beta applied once, the canaries intact. 16-bit weights stay one
    group (each group's sum added into dw would round to 16 bits again); so does
    every dtype where the L2 is unknown."""
    dev = clnn.device()
    x = RNG.standard_normal((5, 8, 7, 7)).astype(dtype)
    dy = RNG.standard_normal((5, 3, 7, 7)).astype(dtype)
    v = RNG.standard_normal((3, 8, 3, 3)).astype(dtype)
    _, dw = conv2d_backward_ref(dy, x, v, (1, 1), (1, 1))
    _, scale = conv2d_backward_ref(np.abs(dy), np.abs(x), np.abs(v), (1, 1), (1, 1))
    panel = 7 * 7 * 8 * (8 if np.dtype(dtype) == np.float64 else 4)
    wide = np.dtype(dtype).itemsize >= 4
    for l2, groups in ((2 * 2 * panel, 3 if wide else 1), (0, 1)):
        monkeypatch.setattr(dev, "facts", dataclasses.replace(dev.facts, cache_size=0,
                                                              l2_size=l2))
        V = Guarded(dev, v.shape, dtype, fill=v)
        with tuning.override("conv", dict(GATHER, MWI=8, NWI=8, LINE=False, WROWS=False)), \
                clnn.profile() as prof:
            clnn.conv2d_backward_weight(guarded_input(dev, dy), guarded_input(dev, x),
                                        v.shape, out=V.view, padding=1, alpha=-0.5,
                                        beta=0.75)
        assert len(ran(prof, "clnn_conv_gather")) == groups, l2
        within(V.check(), 0.75 * v.astype(np.float64) - 0.5 * dw,
               0.5 * scale + 0.75 * np.abs(v.astype(np.float64)), 5 * 7 * 7 + 1, dtype)


def test_l2_groups_only_where_they_help():
    """_l2_group: fewer images only with a known L2, float32 or float64 weights,
    enough row blocks to read the panel again, and an image's panel within half of
    L2."""
    dev = types.SimpleNamespace(facts=dataclasses.replace(clnn.device().facts,
                                                          l2_size=2 << 20))
    group = conv_module._l2_group
    assert group(dev, np.float32, 64, 1024 * 32, 29) == 8        # CIFAR's 128 KB panels
    assert group(dev, np.float32, 20, 784 * 32, 26) == 10        # the projection's
    assert group(dev, np.float64, 64, 1024 * 32, 29) == 4
    assert group(dev, np.float32, 4, 1024 * 32, 29) == 4         # never more
    assert group(dev, np.float32, 64, 1024 * 32, 7) == 64        # 7 row blocks
    assert group(dev, np.float32, 8, 12544 * 32, 15) == 8        # the stem: 1.6 MB each
    assert group(dev, np.float16, 64, 1024 * 32, 29) == 64
    assert group(dev, clnn.bfloat16, 64, 1024 * 32, 29) == 64
    dev.facts = dataclasses.replace(dev.facts, l2_size=0)
    assert group(dev, np.float32, 64, 1024 * 32, 29) == 64


@pytest.mark.parametrize("dtype", [np.float16, clnn.bfloat16], ids=["float16", "bfloat16"])
def test_16_bit_forward_copies_a_group_of_images_at_a_time(monkeypatch, dtype):
    """A 16-bit input's float copy covers at most CONVERT_BYTES of images: the forward
    pass then runs a group at a time into its part of y, bitwise as in one pass, with
    padding, strides and bias, and the canaries intact; the kernel reads the float copy
    (x_acc), not the 16-bit input once per tap."""
    x = RNG.standard_normal((7, 3, 9, 8)).astype(dtype)
    w = RNG.standard_normal((5, 3, 3, 2)).astype(dtype)
    b = RNG.standard_normal(5).astype(dtype)
    X, Wd, B = (guarded_input(clnn.device(), a) for a in (x, w, b))
    with tuning.override("conv", GATHER):
        with clnn.profile() as prof:
            whole = clnn.conv2d(X, Wd, B, stride=(2, 1), padding=(1, 2)).get()
        assert [r.params.get("x_acc") for r in prof.records
                if r.entry == "clnn_conv_gather"] == [True]
        # 3 images' copy is 3 * 3 * 11 * 12 * 4 bytes: groups of 3, 3 and 1
        monkeypatch.setattr(conv_module, "CONVERT_BYTES", 3 * 3 * 11 * 12 * 4 + 5)
        y = Guarded(clnn.device(), whole.shape, dtype)
        clnn.conv2d(X, Wd, B, stride=(2, 1), padding=(1, 2), out=y.view)
    assert y.check().tobytes() == whole.tobytes()
    f = np.float64
    ref = conv2d_ref(x.astype(f), w.astype(f), b.astype(f), (2, 1), (1, 2))
    within(whole, ref, conv2d_ref(np.abs(x.astype(f)), np.abs(w.astype(f)),
                                  np.abs(b.astype(f)), (2, 1), (1, 2)), 3 * 3 * 2, dtype)


@pytest.mark.parametrize("act,dtype", [(a, np.float32) for a in ("sigmoid", "elu", "softplus")]
                         + [("tanh", t) for t in float_dtypes()],
                         ids=lambda v: v if isinstance(v, str) else np.dtype(v).name)
def test_fused_activations(act, dtype):
    """The gathered forward pass applies its activation to a vector of filters at once
    where it calls math built-ins: LeNet's 6 filters (a vector of 8 with 2 unused
    lanes) and 13 (two vectors, the second mostly unused), with bias and padding,
    inside canaries (float64's vectors are 4 wide, float16's loads convert)."""
    for M, pad in ((6, 0), (13, 1)):
        x = RNG.standard_normal((3, 2, 9, 8)).astype(dtype)
        w = RNG.standard_normal((M, 2, 3, 3)).astype(dtype)
        b = RNG.standard_normal(M).astype(dtype)
        z = conv2d_ref(x, w, b, (1, 1), (pad, pad))
        scale = conv2d_ref(np.abs(x), np.abs(w), np.abs(b), (1, 1), (pad, pad))
        y = Guarded(clnn.device(), z.shape, dtype)
        clnn.conv2d(guarded_input(clnn.device(), x), guarded_input(clnn.device(), w),
                    guarded_input(clnn.device(), b), padding=pad, out=y.view, activation=act)
        ref = f_ref(act, z, 1.0)
        # the sum's error passes through a slope of at most 1; the activation rounds
        bound = error_bound(dtype, 2 * 9 + 1, 4) * (scale + 1e-30) + \
            8 * eps(dtype) * np.maximum(np.abs(ref), 1e-3)
        got = y.check().astype(np.float64)
        assert np.all(np.abs(got - ref) <= bound), (act, M, np.abs(got - ref).max())


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
def test_dtypes(dtype):
    check_conv(2, 3, 9, 8, 4, 3, 3, (2, 1), (1, 1), dtype=dtype)


@pytest.mark.parametrize("variant", ["gather-512", "gather-512-line"])
@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
def test_512_bit_tiles(variant, dtype):
    """The gathered kernel's 512-bit tiles in every dtype (8 doubles), their halves
    stored whole or lane by lane (6 and 13 filters: a partial first half, a whole one
    and a partial second), with bias and relu; the data gradient through dcol (stride
    2) and flipped (stride 1); 20 filters over two panels."""
    with variant_in_force(variant):
        for M in (6, 13, 20):
            for stride in ((2, 1), (1, 1)):
                check_conv(2, 3, 9, 8, M, 3, 3, stride, (1, 1), dtype=dtype, act="relu")


def test_deterministic():
    x = clnn.asarray(RNG.standard_normal((8, 6, 14, 14)).astype(np.float32))
    w = clnn.asarray(RNG.standard_normal((16, 6, 5, 5)).astype(np.float32))
    dy = clnn.asarray(RNG.standard_normal((8, 16, 10, 10)).astype(np.float32))
    first = (clnn.conv2d_backward_weight(dy, x, w.shape).get(),
             clnn.conv2d_backward_data(dy, w, x.shape).get())
    for _ in range(3):
        again = (clnn.conv2d_backward_weight(dy, x, w.shape).get(),
                 clnn.conv2d_backward_data(dy, w, x.shape).get())
        assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again))


def check_weight_update(N, C):
    """dw = alpha * dL/dw + beta * dw, the update step of a training loop."""
    x = RNG.standard_normal((N, C, 6, 6)).astype(np.float32)
    dy = RNG.standard_normal((N, 4, 4, 4)).astype(np.float32)
    v = RNG.standard_normal((4, C, 3, 3)).astype(np.float32)
    V = clnn.asarray(v)
    clnn.conv2d_backward_weight(clnn.asarray(dy), clnn.asarray(x), v.shape, out=V,
                                alpha=-0.5, beta=0.9)
    _, dw = conv2d_backward_ref(dy, x, v, (1, 1), (0, 0))
    np.testing.assert_allclose(V.get(), 0.9 * v - 0.5 * dw, rtol=1e-5, atol=1e-5)


def test_weight_gradient_accumulates_with_alpha_beta():
    check_weight_update(2, 3)


def test_bad_shapes():
    x, w = clnn.zeros((2, 3, 8, 8)), clnn.zeros((4, 3, 3, 3))
    out = Guarded(clnn.device(), (2, 4, 6, 6), np.float32, fill=np.ones((2, 4, 6, 6)))
    for call in [lambda: clnn.conv2d(x, clnn.zeros((4, 2, 3, 3)), out=out.view),
                 lambda: clnn.conv2d(x, clnn.zeros((4, 3, 9, 3)), out=out.view),
                 lambda: clnn.conv2d(x, w, clnn.zeros(3), out=out.view),
                 lambda: clnn.conv2d(x, w, stride=0, out=out.view),
                 lambda: clnn.conv2d(x, w, padding=-1, out=out.view),
                 lambda: clnn.conv2d(x, w, stride=2, out=out.view),
                 lambda: clnn.conv2d(clnn.zeros((2, 3, 8)), w),
                 lambda: clnn.conv2d_backward_data(clnn.zeros((2, 4, 5, 5)), w, x.shape),
                 lambda: clnn.conv2d_backward_weight(clnn.zeros((2, 4, 6, 6)), x,
                                                     (4, 3, 3, 3), beta=1.0)]:
        with pytest.raises(clnn.ShapeError):
            call()
        assert np.all(out.check() == 1)


def test_bounded_panels_split_columns(monkeypatch):
    """With a tiny panel budget the CPU variant packs a block of output columns (images
    and positions) at a time; the forward keeps its fused bias and activation."""
    import sys
    monkeypatch.setattr(sys.modules["clnn.ops.gemm"], "PANEL_BYTES", 2048)  # 16-column blocks
    with tuning.override("gemm", tuning.GEMM_TABLE["type"]["CPU"]):
        check_conv(3, 2, 9, 7, 5, 3, 3, (1, 2), (1, 0), act="relu")


@pytest.mark.parametrize("variant", ["gpu-nvidia-phases", "gpu-nvidia-splitk", "gpu"])
@pytest.mark.parametrize("shape", [(2, 20, 11, 9, 7, 3, 3, (2, 2), (1, 1)),
                                   (1, 3, 23, 19, 8, 7, 7, (2, 2), (3, 3)),
                                   (3, 17, 6, 7, 5, 1, 1, (2, 3), (0, 0)),
                                   (2, 4, 9, 9, 3, 2, 4, (3, 1), (1, 2))],
                         ids=["20ch-s2", "stem-like", "1x1-s2x3", "odd"])
def test_gpu_paths_on_strided_layers(variant, shape):
    """The tiled GPU path: phases of a strided data gradient (a 1x1 filter at stride 2
    leaves phases with no taps, which must come out zero), split-K weight gradients."""
    N, C, H, W, M, R, S, st, pad = shape
    with variant_in_force(variant):
        check_conv(N, C, H, W, M, R, S, st, pad)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(3, 1, 32, 32, 6, 5, 5, (1, 1), (0, 0)),
                                   (2, 6, 14, 14, 16, 5, 5, (1, 1), (0, 0)),
                                   (2, 37, 9, 11, 13, 3, 5, (2, 1), (1, 2)),
                                   (1, 23, 17, 3, 1, 3, 3, (1, 1), (2, 1)),
                                   (2, 3, 19, 41, 11, 2, 1, (1, 3), (1, 0))],
                         ids=["C1", "C3", "blocks", "one-filter", "odd"])
def test_gpu_direct_tiles(shape, dtype):
    """convt.cl (the GPU path's forward pass for up to 16 filters, and its data
    gradient at unit stride for up to 16 channels): LeNet-5's C1 and C3 (8 and 16
    sums a work-item), 37 channels in blocks of 4 with a 3x5 filter at stride (2, 1),
    one filter (the data gradient: 23 channels, over 16, goes the GEMM's way), tiles
    that P and Q leave partial, with bias, relu, padding, offsets and canaries; each
    pass in one launch."""
    N, C, H, W, M, R, S, st, pad = shape
    with variant_in_force("gpu"), clnn.profile() as prof:
        check_conv(N, C, H, W, M, R, S, st, pad, dtype=dtype, act="relu")
    entries = [r.entry for r in prof.records]
    assert entries[0] == "clnn_convt_forward"
    direct_dgrad = st == (1, 1) and C <= 16
    assert entries.count("clnn_convt_forward") == 1 + direct_dgrad
    assert (entries[1] == "clnn_convt_forward") == direct_dgrad


def test_gpu_direct_tiles_only_where_they_fit():
    """Past 16 filters, sums of more than 1024 terms, a patch past its local memory (an
    11x11 filter at stride 4: 39 x 71 inputs for a tile), more images than the grid's
    third axis takes, or a dilated filter, the tiled GEMM runs instead; 4, 8 or 16 sums
    a work-item, whichever holds the filters."""
    from clnn.ops import conv as conv_module
    dev = clnn.device()
    plan = conv_module.tile_direct
    assert plan(dev, np.float32, 2, 6, 16, 5, 5, (1, 1)) == (16, 6, None)
    assert plan(dev, np.float32, 2, 6, 6, 5, 5, (1, 1)) == (8, 6, None)
    assert plan(dev, np.float32, 2, 6, 3, 5, 5, (1, 1)) == (4, 6, None)
    assert plan(dev, np.float32, 2, 37, 13, 3, 5, (2, 1)) == (16, 4, None)   # 4 channels a block
    assert plan(dev, np.float32, 2, 6, 17, 5, 5, (1, 1)) is None
    assert plan(dev, np.float32, 2, 3, 8, 11, 11, (4, 4)) is None
    assert plan(dev, np.float32, 70000, 3, 8, 3, 3, (1, 1)) is None
    assert plan(dev, np.float32, 2, 113, 8, 3, 3, (1, 1)) == (8, 8, None)    # sums of 1017
    assert plan(dev, np.float32, 2, 114, 8, 3, 3, (1, 1)) is None      # and of 1026
    assert plan(dev, np.float32, 2, 1024, 8, 1, 1, (1, 1)) == (8, 12, None)  # 8 x 16 a patch
    # on the engines (a row with "MMA"): 8 or 16 filters along n, blocks of channels
    # whose taps fit KP (160 k for 16-bit operands, 96 for TF32); off with
    # TILE_DIRECT_ENGINES, and for rows without engines
    f16, tf32 = {"MMA": "f16"}, {"MMA": "tf32", "EMULATE": True}
    assert plan(dev, np.float16, 2, 1, 3, 5, 5, (1, 1), f16) == (8, 1, f16)
    assert plan(dev, np.float16, 2, 6, 16, 5, 5, (1, 1), f16) == (16, 6, f16)
    assert plan(dev, np.float16, 2, 16, 6, 5, 5, (1, 1), f16) == (8, 6, f16)
    assert plan(dev, np.float32, 2, 16, 6, 5, 5, (1, 1), tf32) == (8, 3, tf32)
    assert plan(dev, np.float16, 2, 3, 6, 13, 13, (1, 1), f16) is None     # 169 taps
    assert plan(dev, np.float32, 2, 6, 6, 5, 5, (1, 1), {"variant": "local"}) == \
        (8, 6, None)
    with mock.patch.object(conv_module, "TILE_DIRECT_ENGINES", False):
        assert plan(dev, np.float16, 2, 1, 3, 5, 5, (1, 1), f16) == (4, 1, None)
    x = clnn.asarray(RNG.standard_normal((1, 2, 9, 9)).astype(np.float32))
    with variant_in_force("gpu"), clnn.profile() as prof:
        check_conv(1, 2, 9, 9, 17, 3, 3, (1, 1), (1, 1))    # the data gradient only
        clnn.conv2d(x, clnn.zeros((3, 2, 3, 3)), dilation=2)
        clnn.conv2d_backward_data(clnn.zeros((1, 3, 5, 5)), clnn.zeros((3, 2, 3, 3)),
                                  (1, 2, 9, 9), dilation=2)
    assert [r.entry for r in prof.records].count("clnn_convt_forward") == 1


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(3, 1, 32, 32, 6, 5, 5, (1, 1), (0, 0)),
                                   (2, 6, 14, 14, 16, 5, 5, (1, 1), (0, 0)),
                                   (5, 9, 7, 6, 16, 3, 2, (2, 1), (1, 1)),
                                   (2, 20, 6, 5, 16, 3, 4, (1, 2), (2, 3)),
                                   (1, 3, 19, 41, 1, 2, 1, (1, 3), (1, 0)),
                                   (7, 2, 1, 1, 3, 1, 1, (1, 1), (0, 0))],
                         ids=["C1", "C3", "strided", "4-units-each", "one-filter", "1x1"])
def test_gpu_direct_weight_gradient(shape, dtype):
    """convw.cl (the GPU path's weight gradient for up to 16 filters): LeNet-5's C1 (30
    filter rows, 8 position slices each) and C3 (480 rows: 2 a work-item), 432 and 960
    rows (2 and 4 a work-item) at strides with padding, one filter, 1x1 images; more
    images than work-groups (5 and 7 on a 2-unit device: 2 a group), with offsets and
    canaries; two launches (partial sums, their sum). (C1 in float64, 45 KiB an image
    in double, takes the tiled GEMM.)"""
    N, C, H, W, M, R, S, st, pad = shape
    with variant_in_force("gpu"), clnn.profile() as prof:
        check_conv(N, C, H, W, M, R, S, st, pad, dtype=dtype)
    direct = [r.entry for r in prof.records][-2:] == ["clnn_convw_partial", "clnn_convw_sum"]
    assert direct == (dtype != np.float64 or C != 1 or M != 6)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
def test_gpu_direct_weight_gradient_alpha_beta(dtype):
    """dw = alpha (the gradient) + beta dw in the sum's epilogue, and the bias gradient
    db likewise where asked for; beta 0 never reads dw or db (NaN there stays out of the
    result). Without db the launches are the same two."""
    x = RNG.standard_normal((3, 4, 9, 8)).astype(dtype)
    v = RNG.standard_normal((6, 4, 3, 3)).astype(dtype)
    c = RNG.standard_normal(6).astype(dtype)
    dy = RNG.standard_normal((3, 6, 7, 6)).astype(dtype)
    _, dw = conv2d_backward_ref(dy, x, v, (1, 1), (0, 0))
    scale = conv2d_backward_ref(np.abs(dy), np.abs(x), np.abs(v), (1, 1), (0, 0))[1]
    d64 = dy.astype(np.float64)
    db, db_scale = d64.sum(axis=(0, 2, 3)), np.abs(d64).sum(axis=(0, 2, 3))
    X, DY = guarded_input(clnn.device(), x), guarded_input(clnn.device(), dy)
    with variant_in_force("gpu"), clnn.profile() as prof:
        out = Guarded(clnn.device(), v.shape, dtype, fill=v)
        bias = Guarded(clnn.device(), c.shape, dtype, fill=c)
        clnn.conv2d_backward_weight(DY, X, v.shape, out=out.view, alpha=-0.5, beta=0.75,
                                    db=bias.view)
        within(out.check(), 0.75 * v.astype(np.float64) - 0.5 * dw,
               0.75 * np.abs(v.astype(np.float64)) + 0.5 * scale, 3 * 7 * 6 + 1, dtype)
        within(bias.check(), 0.75 * c.astype(np.float64) - 0.5 * db,
               0.75 * np.abs(c.astype(np.float64)) + 0.5 * db_scale, 3 * 7 * 6 + 1, dtype)
        nan = Guarded(clnn.device(), v.shape, dtype, fill=np.full(v.shape, np.nan))
        nan_b = Guarded(clnn.device(), c.shape, dtype, fill=np.full(c.shape, np.nan))
        clnn.conv2d_backward_weight(DY, X, v.shape, out=nan.view, alpha=2.0, db=nan_b.view)
        within(nan.check(), 2 * dw, 2 * scale, 3 * 7 * 6, dtype)
        within(nan_b.check(), 2 * db, 2 * db_scale, 3 * 7 * 6, dtype)
        plain = Guarded(clnn.device(), v.shape, dtype)
        clnn.conv2d_backward_weight(DY, X, v.shape, out=plain.view)
        within(plain.check(), dw, scale, 3 * 7 * 6, dtype)
    assert [r.entry for r in prof.records] == ["clnn_convw_partial", "clnn_convw_sum"] * 3


@pytest.mark.parametrize("path", ["cpu", "gpu", "gpu-17-filters", "groups", "dilated",
                                  "unbatched", "empty"])
def test_bias_gradient_beside_the_weight_gradient(path):
    """conv2d_backward_weight(db=): the bias gradient, alpha * dy summed over the batch
    and positions + beta * db, on every path: in convw.cl's launches (the GPU path up to
    16 filters, unbatched too, and there only), by bias_grad after the GPU's GEMM (17
    filters), the CPU gather, the dilated GPU GEMM, the grouped kernels and an empty
    batch; dw as without it. A db that overlaps dy or dw is refused before anything runs."""
    N, C, H, W, M, G, dl = 3, 4, 9, 8, 6, 1, 1
    if path == "gpu-17-filters":
        M = 17
    elif path == "groups":
        G = 2
    elif path == "dilated":
        dl = 2
    elif path == "empty":
        N = 0
    x = RNG.standard_normal((N, C, H, W)).astype(np.float32)
    w = RNG.standard_normal((M, C // G, 3, 3)).astype(np.float32)
    c = RNG.standard_normal(M).astype(np.float32)
    dy = RNG.standard_normal((N, M, H - 2 * dl + 2, W - 2 * dl + 2)).astype(np.float32)
    d64 = dy.astype(np.float64)
    want = 0.5 * c - 2.0 * d64.sum(axis=(0, 2, 3))
    scale = 0.5 * np.abs(c) + 2.0 * np.abs(d64).sum(axis=(0, 2, 3))
    opts = dict(padding=1, dilation=dl, groups=G)
    X, DY = (guarded_input(clnn.device(), x), guarded_input(clnn.device(), dy)) if N else \
        (clnn.asarray(x), clnn.asarray(dy))
    if path == "unbatched":
        X, DY, x, dy = X[0], DY[0], x[:1], dy[:1]
        want = 0.5 * c - 2.0 * dy.astype(np.float64).sum(axis=(0, 2, 3))
    fused = path in ("gpu", "unbatched")
    with variant_in_force("gather-flat" if path == "cpu" else "gpu"), \
            clnn.profile() as prof:
        dw, db = Guarded(clnn.device(), w.shape, np.float32, fill=w), \
            Guarded(clnn.device(), c.shape, np.float32, fill=c)
        clnn.conv2d_backward_weight(DY, X, w.shape, out=dw.view, db=db.view, alpha=-2.0,
                                    beta=0.5, **opts)
        alone = clnn.conv2d_backward_weight(DY, X, w.shape, out=clnn.asarray(w), alpha=-2.0,
                                            beta=0.5, **opts)
    within(db.check(), want, scale, max(1, dy[:, 0].size), np.float32)
    np.testing.assert_array_equal(dw.check(), alone.get())
    entries = [r.entry for r in prof.records]
    assert ("clnn_convw_partial" in entries) == fused
    if fused:
        assert entries == ["clnn_convw_partial", "clnn_convw_sum"] * 2
    # overlaps: db within dy (an empty dy has no bytes to share), db within dw
    for other in (DY, dw.view)[0 if N else 1:]:
        with pytest.raises(clnn.ShapeError, match="overlaps"):
            clnn.conv2d_backward_weight(DY, X, w.shape, out=dw.view,
                                        db=other.reshape(-1)[1:M + 1], **opts)
    np.testing.assert_array_equal(dw.check(), alone.get())


def test_gpu_direct_weight_gradient_plans():
    """convw.cl's launch plans on an H100's facts: LeNet-5's C1 and C3 at batch 1024
    (4 images a group, 256 groups: two per unit) and at 64 (one image a group), and
    where it does not take a layer: more than 16 filters, sums past 1024 taps, filters
    wider than 8, an image past its 32 KiB, dilation, an empty batch, devices with less
    local memory or smaller work-groups, and WGRAD_DIRECT off."""
    import types
    from test_plans import H100
    from clnn.ops import conv as conv_module
    plan = conv_module.wgrad_direct
    gpu = types.SimpleNamespace(facts=H100)
    one = (1, 1)
    assert plan(gpu, np.float32, 1024, 1, 32, 32, 6, 5, 5, 28, 28, one, (0, 0)) == \
        {"S": 5, "UPT": 1, "T": 256, "LM": 8192, "PS": 8, "HP": 32, "WPL": 40, "IPG": 4,
         "G": 256}
    assert plan(gpu, np.float16, 1024, 6, 14, 14, 16, 5, 5, 10, 10, one, (0, 0)) == \
        {"S": 5, "UPT": 2, "T": 256, "LM": 8192, "PS": 1, "HP": 14, "WPL": 15, "IPG": 4,
         "G": 256}
    assert plan(gpu, np.float64, 64, 6, 14, 14, 16, 5, 5, 10, 10, one, (0, 0))["LM"] == 4096
    assert plan(gpu, np.float64, 64, 1, 32, 32, 6, 5, 5, 28, 28, one, (0, 0)) is None
    assert plan(gpu, np.float32, 64, 1, 32, 32, 6, 5, 5, 28, 28, one, (0, 0))["G"] == 64
    assert plan(gpu, np.float32, 1000, 1, 32, 32, 6, 5, 5, 28, 28, one, (0, 0))["G"] == 250
    assert plan(gpu, np.float32, 8, 1, 32, 32, 17, 5, 5, 28, 28, one, (0, 0)) is None
    assert plan(gpu, np.float32, 8, 42, 9, 9, 8, 5, 5, 5, 5, one, (0, 0)) is None  # 1050
    assert plan(gpu, np.float32, 8, 3, 9, 9, 8, 1, 9, 9, 1, one, (0, 0)) is None
    assert plan(gpu, np.float32, 8, 3, 64, 64, 8, 3, 3, 64, 64, one, one) is None
    assert plan(gpu, np.float32, 8, 1, 32, 32, 6, 5, 5, 24, 24, one, (0, 0),
                (2, 2)) is None
    assert plan(gpu, np.float32, 0, 1, 32, 32, 6, 5, 5, 28, 28, one, (0, 0)) is None
    for small in (dict(local_mem_size=16384), dict(max_work_group_size=128)):
        dev = types.SimpleNamespace(facts=dataclasses.replace(H100, **small))
        assert plan(dev, np.float32, 8, 1, 32, 32, 6, 5, 5, 28, 28, one, (0, 0)) is None
    with mock.patch.object(conv_module, "WGRAD_DIRECT", False):
        assert plan(gpu, np.float32, 8, 1, 32, 32, 6, 5, 5, 28, 28, one, (0, 0)) is None


def test_gpu_split_k_is_bitwise_reproducible():
    """Split-K sums its slices in a fixed order: the same call gives the same bits."""
    x = clnn.asarray(RNG.standard_normal((4, 5, 12, 12)).astype(np.float32))
    dy = clnn.asarray(RNG.standard_normal((4, 6, 10, 10)).astype(np.float32))
    with variant_in_force("gpu-nvidia-splitk"):
        first = clnn.conv2d_backward_weight(dy, x, (6, 5, 3, 3)).get()
        for _ in range(3):
            assert np.array_equal(clnn.conv2d_backward_weight(dy, x, (6, 5, 3, 3)).get(),
                                  first)


def test_pytorch_call_forms(dev):
    """Unbatched (C, H, W) arrays, empty batches and padding='same'/'valid' as PyTorch
    takes them; dilation and groups refused by name until clnn has them."""
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    X, Wd, B = clnn.asarray(x), clnn.asarray(w), clnn.asarray(b)
    full = clnn.conv2d(X, Wd, B, padding=1).get()
    one = clnn.conv2d(clnn.asarray(x[1]), Wd, B, padding="same")
    assert one.shape == (4, 7, 6)
    np.testing.assert_allclose(one.get(), full[1], rtol=1e-5, atol=1e-5)
    assert clnn.conv2d(X, Wd, padding="valid").shape == (2, 4, 5, 4)
    dy = RNG.standard_normal((4, 7, 6)).astype(np.float32)
    DY = clnn.asarray(dy)
    dx = clnn.conv2d_backward_data(DY, Wd, (3, 7, 6), padding="same")
    assert dx.shape == (3, 7, 6)
    dx4 = clnn.conv2d_backward_data(clnn.asarray(dy[None]), Wd, (1, 3, 7, 6), padding=1)
    np.testing.assert_array_equal(dx.get(), dx4.get()[0])
    dw = clnn.conv2d_backward_weight(DY, clnn.asarray(x[1]), w.shape, padding=1)
    dw4 = clnn.conv2d_backward_weight(clnn.asarray(dy[None]), clnn.asarray(x[1:2]), w.shape,
                                      padding=1)
    np.testing.assert_array_equal(dw.get(), dw4.get())
    # an empty batch: empty outputs, and a zero weight gradient (beta * out)
    E = clnn.zeros((0, 3, 7, 6))
    assert clnn.conv2d(E, Wd, B, padding=1).shape == (0, 4, 7, 6)
    assert clnn.conv2d_backward_data(clnn.zeros((0, 4, 7, 6)), Wd, (0, 3, 7, 6),
                                     padding=1).shape == (0, 3, 7, 6)
    g = clnn.asarray(np.ones(w.shape, np.float32))
    clnn.conv2d_backward_weight(clnn.zeros((0, 4, 7, 6)), E, w.shape, padding=1, out=g,
                                beta=0.5)
    assert np.all(g.get() == 0.5)
    for kw, what in ((dict(padding="same", stride=2), "stride 1"),
                     (dict(padding="full"), "padding"), (dict(groups=0), "groups")):
        with pytest.raises(clnn.ArgumentError, match=what):
            clnn.conv2d(X, Wd, **kw)
    with pytest.raises(clnn.ArgumentError, match="stride 1"):
        clnn.conv2d(X, clnn.zeros((4, 3, 2, 2)), padding="same", stride=2)
    with pytest.raises(clnn.ShapeError, match="divide"):
        clnn.conv2d(X, clnn.zeros((4, 1, 3, 3)), groups=3)    # 4 outputs in 3 groups


@pytest.mark.parametrize("N,C,H,W,M,R,S,st,pd,dl,G", [
    (2, 4, 9, 8, 4, 3, 3, (1, 1), (1, 1), (1, 1), 4),          # depthwise 3x3
    (1, 6, 7, 7, 6, 3, 3, (2, 2), (1, 1), (1, 1), 6),          # depthwise, stride 2
    (3, 4, 10, 9, 6, 3, 2, (2, 1), (2, 1), (2, 3), 2),         # grouped and dilated
    (2, 3, 11, 13, 5, 3, 3, (1, 1), (2, 2), (2, 2), 1),        # dilated only
    (1, 2, 5, 5, 4, 1, 1, (1, 1), (0, 0), (1, 1), 2),          # 1x1 grouped
    (2, 4, 6, 6, 8, 3, 3, (1, 1), (3, 3), (3, 3), 4),          # depth multiplier 2
    # rows long enough for the CPU weight gradient's vector lanes (and their tails),
    # contiguous and at stride 2
    (1, 3, 4, 29, 3, 3, 3, (1, 1), (1, 1), (1, 1), 3),
    (2, 2, 5, 41, 4, 3, 3, (2, 2), (1, 1), (1, 1), 2)],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
@pytest.mark.parametrize("wgrad", ["lanes", "tree"])
def test_grouped_and_dilated_convolution(dev, N, C, H, W, M, R, S, st, pd, dl, G, wgrad,
                                         monkeypatch):
    from reference import conv2d_general_ref
    monkeypatch.setattr(conv_module, "DIRECT_WGRAD", wgrad)
    for dtype in float_dtypes(dev):
        x = RNG.standard_normal((N, C, H, W)).astype(dtype)
        w = RNG.standard_normal((M, C // G, R, S)).astype(dtype)
        b = RNG.standard_normal(M).astype(dtype)
        ref, backward = conv2d_general_ref(x, w, b, st, pd, dl, G)
        opts = dict(stride=st, padding=pd, dilation=dl, groups=G)
        y = Guarded(dev, ref.shape, dtype)
        clnn.conv2d(guarded_input(dev, x), guarded_input(dev, w), guarded_input(dev, b),
                    out=y.view, activation="relu", **opts)
        tol = error_bound(dtype, (C // G) * R * S, 64)
        np.testing.assert_allclose(y.check(), np.maximum(ref, 0), rtol=tol, atol=tol * 4)
        dy = RNG.standard_normal(ref.shape).astype(dtype)
        dx_ref, dw_ref = backward(dy)
        dx = Guarded(dev, x.shape, dtype)
        clnn.conv2d_backward_data(guarded_input(dev, dy), guarded_input(dev, w), x.shape,
                                  out=dx.view, **opts)
        np.testing.assert_allclose(dx.check(), dx_ref, rtol=tol, atol=tol * 4 * M)
        dw = Guarded(dev, w.shape, dtype, fill=np.ones(w.shape))
        clnn.conv2d_backward_weight(guarded_input(dev, dy), guarded_input(dev, x), w.shape,
                                    out=dw.view, alpha=0.5, beta=2.0, **opts)
        k = N * ref.shape[2] * ref.shape[3]
        np.testing.assert_allclose(dw.check(), 0.5 * dw_ref + 2.0, rtol=tol * k,
                                   atol=tol * k * 4)


@pytest.mark.parametrize("R,S,dl,G", [(4, 4, (1, 1), 1), (2, 3, (1, 1), 1), (2, 2, (3, 1), 2),
                                      (4, 1, (1, 1), 3)],
                         ids=["4x4", "2x3", "2x2-dilated-grouped", "4x1-grouped"])
def test_padding_same_with_an_odd_total(dev, R, S, dl, G):
    """padding='same' whose total is odd pads the bottom and right one more, as
    PyTorch: the forward and both gradients against the float64 reference of the
    explicitly padded input, with canaries and offsets, every dtype, unbatched too."""
    from reference import conv2d_general_ref
    N, C, H, W, M = 2, 6, 7, 9, 6
    th, tw = dl[0] * (R - 1), dl[1] * (S - 1)
    for dtype in float_dtypes(dev):
        x = RNG.standard_normal((N, C, H, W)).astype(dtype)
        w = RNG.standard_normal((M, C // G, R, S)).astype(dtype)
        b = RNG.standard_normal(M).astype(dtype)
        xp = np.pad(x, ((0, 0), (0, 0), (th // 2, th - th // 2), (tw // 2, tw - tw // 2)))
        ref, backward = conv2d_general_ref(xp, w, b, (1, 1), (0, 0), dl, G)
        assert ref.shape == (N, M, H, W)
        opts = dict(padding="same", dilation=dl, groups=G)
        tol = error_bound(dtype, (C // G) * R * S, 64)
        y = Guarded(dev, ref.shape, dtype)
        clnn.conv2d(guarded_input(dev, x), guarded_input(dev, w), guarded_input(dev, b),
                    out=y.view, **opts)
        np.testing.assert_allclose(y.check(), ref, rtol=tol, atol=tol * 4)
        dy = RNG.standard_normal(ref.shape).astype(dtype)
        dxp, dw_ref = backward(dy)
        dx = Guarded(dev, x.shape, dtype)
        clnn.conv2d_backward_data(guarded_input(dev, dy), guarded_input(dev, w), x.shape,
                                  out=dx.view, **opts)
        np.testing.assert_allclose(dx.check(), dxp[:, :, th // 2:th // 2 + H,
                                                   tw // 2:tw // 2 + W],
                                   rtol=tol, atol=tol * 4 * M)
        dw = Guarded(dev, w.shape, dtype)
        clnn.conv2d_backward_weight(guarded_input(dev, dy), guarded_input(dev, x), w.shape,
                                    out=dw.view, **opts)
        k = N * H * W
        np.testing.assert_allclose(dw.check(), dw_ref, rtol=tol * k, atol=tol * k * 4)
        one = clnn.conv2d(clnn.asarray(x[0]), clnn.asarray(w), clnn.asarray(b), **opts)
        np.testing.assert_allclose(one.get(), ref[0], rtol=tol, atol=tol * 4)


def test_unbatched_pooling(dev):
    x = RNG.standard_normal((3, 6, 5)).astype(np.float32)
    X = clnn.asarray(x)
    y, idx = clnn.max_pool2d(X, 2, return_indices=True)
    y4, idx4 = clnn.max_pool2d(clnn.asarray(x[None]), 2, return_indices=True)
    assert y.shape == (3, 3, 2) and idx.shape == (3, 3, 2)
    np.testing.assert_array_equal(y.get(), y4.get()[0])
    np.testing.assert_array_equal(idx.get(), idx4.get()[0])
    dy = clnn.asarray(RNG.standard_normal((3, 3, 2)).astype(np.float32))
    assert clnn.avg_pool2d_backward(dy, X, 2).shape == (3, 6, 5)
    assert clnn.max_pool2d_backward(dy, X, 2).shape == (3, 6, 5)


@pytest.mark.parametrize("variant", ["default", "gather-flat", "gather-line", "gather-checked",
                                     "pixels", "gemm-reg", "gpu"])
@pytest.mark.parametrize("shape", [(2, 3, 11, 13, 5, 3, 3, (1, 1), (2, 2), (2, 2)),
                                   (2, 3, 12, 9, 4, 3, 2, (2, 1), (3, 1), (3, 2)),
                                   (1, 2, 9, 9, 3, 2, 2, (1, 1), (0, 0), (4, 3)),
                                   (2, 4, 10, 10, 3, 3, 3, (1, 1), (5, 5), (2, 2))],
                         ids=["d2", "strided-d3x2", "d4x3", "pad-past-extent"])
def test_dilation_in_the_implicit_gemm(variant, shape):
    """Dilation is the k steps of the CPU loaders (forward, weight gradient, the flipped
    data gradient at unit stride) and the GPU loaders' k tables (forward, weight
    gradient, the data gradient's one phase at unit stride); col2im and strided GPU data
    gradients hand dilated calls to the direct kernels. Every path against the float64
    reference."""
    from reference import conv2d_general_ref
    N, C, H, W, M, R, S, st, pd, dl = shape
    x = RNG.standard_normal((N, C, H, W)).astype(np.float32)
    w = RNG.standard_normal((M, C, R, S)).astype(np.float32)
    ref, backward = conv2d_general_ref(x, w, None, st, pd, dl, 1)
    dy = RNG.standard_normal(ref.shape).astype(np.float32)
    dx_ref, dw_ref = backward(dy)
    with variant_in_force(variant):
        opts = dict(stride=st, padding=pd, dilation=dl)
        y = Guarded(clnn.device(), ref.shape, np.float32)
        clnn.conv2d(guarded_input(clnn.device(), x), clnn.asarray(w), out=y.view, **opts)
        dx = clnn.conv2d_backward_data(clnn.asarray(dy), clnn.asarray(w), x.shape, **opts)
        dw = clnn.conv2d_backward_weight(clnn.asarray(dy), clnn.asarray(x), w.shape, **opts)
    tol = 1e-5 * C * R * S
    np.testing.assert_allclose(y.check(), ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx.get(), dx_ref, rtol=tol, atol=tol * M)
    np.testing.assert_allclose(dw.get(), dw_ref, rtol=tol * N * ref.shape[2] * ref.shape[3],
                               atol=1e-4 * np.abs(dw_ref).max())
