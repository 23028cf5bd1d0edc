"""The matrix-engine GEMM rows (gemm.cl with "MMA": NVIDIA's mma.sync through inline
PTX) against float64 numpy references of what the engine multiplies.

On a device with the engines (NVIDIA, compute capability 8.0 and up: run the suite
with CLNN_TEST_DEVICE=gpu there) every row runs as it is. Elsewhere the same kernels
run with the engine emulated in OpenCL C ("EMULATE": the lanes of a warp exchange
their fragment registers through local memory): everything but the PTX instruction
is checked (tile layouts, loaders, split-K, epilogue), on fewer cases, since the
emulation is slow; the test that needs the planner to pick real engines skips there.
What needs no kernel at all (constraints, selection, plans, clang's NVPTX target) is
in tests/test_engines.py.
"""

import os
import sys
from unittest import mock

import numpy as np
import pytest

import clnn
from clnn import plans, programs, tuning
from conftest import CANARY, Guarded, guarded_input
from reference import conv2d_ref

RNG = np.random.default_rng(11)
U32 = 2.0 ** -24                 # float32's unit roundoff
# what each test kind multiplies: float32 on the TF32 rows, float16 and bfloat16 storage
# on the 16-bit ("f16") rows, whose instruction takes .bf16 operands for bfloat16
DTYPE = {"tf32": np.float32, "f16": np.float16, "bf16": clnn.bfloat16}
ROWS = {"tf32": "tf32", "f16": "f16", "bf16": "f16"}


def as_engine_sees(kind, x, truncated=False):
    """The operand as the engine multiplies it: float32 rounded to TF32 (10 mantissa
    bits, to nearest with ties away from zero, as cvt.rna.tf32.f32), or ``truncated``
    to them (a WGMMA row: wgmma reads the floats' top 19 bits from local memory), or
    the halves as they are. The references below multiply these in float64, so what is
    left to bound is float32 summation and the result's rounding: a kernel that
    rounded differently, or skipped the rounding, fails."""
    if kind != "tf32":
        return x                       # 16-bit values are exact in float32 and float64
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = ((u + np.uint32(0 if truncated else 0x1000)) &
         np.uint32(0xffffe000)).view(np.float32)
    return np.where(np.isfinite(x), r, x).astype(np.float32)


def ran_wgmma(records):
    """Whether a WGMMA row ran any of the profiled launches ``records``: a
    convolution's plain products (the data gradient's GEMM before col2im) may take
    one, and wgmma truncates TF32 operands where mma.sync rounds them."""
    return any(dict(r.params.get("tuning", ())).get("WGMMA") for r in records
               if r.entry == "clnn_gemm_tiled")


SIZES = [(1, 1, 1), (17, 13, 29), (129, 257, 33), (300, 200, 100), (64, 8, 1000),
         (7, 300, 64)]


def engine_rows(dev, kind, every=True):
    """The device's engine rows of ``kind``; where it has none, the table's mma.sync rows
    with the engine emulated that fit it (only the last, a 64x64 tile, unless ``every``;
    the WGMMA rows' emulated tests are wgmma_rows')."""
    rows = tuning.mma_rows(dev.facts, ROWS[kind])
    if rows:
        return rows
    size = np.dtype(DTYPE[kind]).itemsize
    emulated = [dict(r, EMULATE=True) for r in tuning.MMA_TABLE[("nvidia", "GPU")]
                if r["MMA"] == ROWS[kind] and not r.get("WGMMA")]
    # (those that fit the device emulated: the emulation's exchange buffers take local
    # memory too, more than 48 KiB for the big tiles, CLNN_TEST_FACTS=h100's limit)
    emulated = [r for r in emulated if not tuning.gemm_problems(r, dev.facts, size)]
    assert emulated, "no engine row fits this device emulated"
    return emulated if every else emulated[-1:]


def real_engines(dev, kind):
    if not tuning.mma_rows(dev.facts, kind):
        pytest.skip(f"{dev.name} has no {kind} matrix engines for the planner to choose "
                    f"(mma.sync: NVIDIA, compute capability 8.0 and up; this one reports "
                    f"{dev.facts.nv_compute_capability or 'none'})")


@pytest.fixture
def precision():
    """Set the float32 matmul precision for one test, restored afterwards."""
    old = tuning.get_float32_matmul_precision()
    yield tuning.set_float32_matmul_precision
    tuning.set_float32_matmul_precision(old)


def bound(dtype, scale, ref, K, stored=False):
    """What an engine product may differ from the float64 product of the operands the
    engine sees: float32 sums of K terms (a unit in the last place each: the engines'
    adders need not round to nearest), the result's rounding, and with ``stored`` one
    more rounding of partial results kept in dtype (a convolution's data gradient with
    few channels sums an unrolled gradient stored in the output's dtype, as
    conftest.error_bound allows every op)."""
    out = {np.dtype(np.float16): 2.0 ** -10, clnn.bfloat16: 2.0 ** -7}.get(np.dtype(dtype),
                                                                        2 * U32)
    return (2 * (K + 2) * U32 + (out if stored else 0.0)) * scale + out * np.abs(ref) + 1e-30


def stored(dev, x, align):
    """x on the device, inside a wider matrix when ``align``: at element offset
    ``align``, rows ``align`` times an odd number long, so that vector loads (and
    cp.async copies) of exactly ``align`` elements are what the alignment allows, and
    the matrix's last columns fill part of a vector."""
    if not align:
        return clnn.asarray(x, device=dev)
    rows, cols = x.shape
    ld = -(-(cols + 1) // align) * align
    ld += align * (1 - ld // align % 2)
    big = np.full((rows + 1, ld), np.nan, x.dtype)
    flat = big.reshape(-1)[align:align + rows * ld].reshape(rows, ld)
    flat[:, :cols] = x
    return clnn.asarray(big, device=dev).reshape(-1)[align:align + rows * ld] \
        .reshape(rows, ld)[:, :cols]


def check(dev, kind, row, M, N, K, ta, tb, alpha, beta, bias, act, align=0):
    dt = DTYPE[kind]
    a = RNG.standard_normal((K, M) if ta else (M, K)).astype(dt)
    b = RNG.standard_normal((N, K) if tb else (K, N)).astype(dt)
    c = RNG.standard_normal((M, N)).astype(dt)
    bv = RNG.standard_normal(N).astype(dt) if bias else None
    # out lives inside a canary-filled matrix: an offset and a row stride
    big = np.full((M + 2, N + 3), CANARY, dt)
    big[1:1 + M, 2:2 + N] = c if beta else np.nan
    out_big = clnn.asarray(big, device=dev)
    with tuning.override("gemm", row):
        clnn.gemm(stored(dev, a, align), stored(dev, b, align),
                  out=out_big[1:1 + M, 2:2 + N], alpha=alpha, beta=beta, trans_a=ta,
                  trans_b=tb, bias=None if bv is None else clnn.asarray(bv, device=dev),
                  activation=act)
    got_big = out_big.get()
    mask = np.ones(big.shape, bool)
    mask[1:1 + M, 2:2 + N] = False
    assert np.all(got_big[mask] == CANARY), "a canary around out was overwritten"
    wg = bool(row.get("WGMMA") or row.get("TF32T"))
    A64 = as_engine_sees(kind, a.T if ta else a, wg).astype(np.float64)
    B64 = as_engine_sees(kind, b.T if tb else b, wg).astype(np.float64)
    ref = alpha * (A64 @ B64)
    scale = abs(alpha) * (np.abs(A64) @ np.abs(B64))
    if beta:
        ref += beta * c.astype(np.float64)
        scale += abs(beta) * np.abs(c.astype(np.float64))
    if bv is not None:
        ref += bv
        scale += np.abs(bv.astype(np.float64))
    if act == "relu":
        ref = np.maximum(ref, 0.0)
    err = np.abs(got_big[1:1 + M, 2:2 + N].astype(np.float64) - ref)
    bd = bound(dt, scale, ref, K)
    assert np.all(err <= bd), (f"{kind} {row['MWG']}x{row['NWG']} {(M, N, K)} ta={ta} "
                               f"tb={tb}: max error/bound {np.max(err / bd):.3g}")


@pytest.mark.parametrize("kind", ["tf32", "f16", "bf16"])
@pytest.mark.parametrize("mnk", SIZES, ids=str)
def test_engine_rows_against_float64(dev, kind, mnk):
    for i, row in enumerate(engine_rows(dev, kind, every=False)):
        for ta in (False, True):
            for tb in (False, True):
                check(dev, kind, row, *mnk, ta, tb, alpha=-1.5 if i % 2 else 1.0,
                      beta=0.5 if (ta ^ tb) else 0.0, bias=ta, act="relu" if tb else None)


@pytest.mark.parametrize("kind", ["tf32", "f16"])
def test_every_engine_tile(dev, kind):
    """Each tile of the table, edges inside and out, plain (and, on real engines, once
    transposed: an emulated big tile takes PoCL up to a minute to compile)."""
    for row in engine_rows(dev, kind):
        check(dev, kind, row, row["MWG"] + 3, row["NWG"] - 5, 2 * row["KWG"] + 7, False,
              False, alpha=1.0, beta=0.0, bias=False, act=None)
        if not row.get("EMULATE"):
            check(dev, kind, row, 37, 41, 3 * row["KWG"], True, True, alpha=2.0,
                  beta=1.0, bias=True, act="relu")


@pytest.mark.parametrize("kind", ["tf32", "f16"])
def test_engine_split_k(dev, kind):
    row = dict(engine_rows(dev, kind, every=False)[-1], KSPLIT=3)
    for ta, tb in ((False, False), (True, True)):
        check(dev, kind, row, 67, 45, 1031, ta, tb, alpha=1.0, beta=-1.5, bias=True,
              act=None)


def test_the_precision_switch_chooses_tf32(dev, precision):
    """float32 GEMMs stay float32 under "highest" (the default) and take the TF32
    engines under "high" and "medium": each result is the float64 product of what it
    multiplied, float32 operands or TF32 ones, and the two differ on these data. (A
    product big enough for the engines to win in the planner's eyes by far: at 300 x
    200 a float32 tile's plan came within 1% of theirs, and won, on an H200.)"""
    real_engines(dev, "tf32")
    M, N = 1000, 700
    a = RNG.standard_normal((M, 512)).astype(np.float32)
    b = RNG.standard_normal((512, N)).astype(np.float32)
    # random data alone may not: TF32's rounding errors add up like a random walk, to
    # about float32's bound at K = 512 (this test failed so on an H200 before it ran
    # anything). Row 0 of A is 1 + 2^-12 (TF32: 1) and column 0 of B ones, so C(0, 0)
    # differs by 512 * 2^-12 = 1/8, four times float32's bound there
    a[0] = 1 + 2.0 ** -12
    b[:, 0] = 1
    exact = a.astype(np.float64) @ b
    tf32 = as_engine_sees("tf32", a).astype(np.float64) @ as_engine_sees("tf32", b)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b)
    bd = bound(np.float32, scale, exact, 512)
    assert np.any(np.abs(tf32 - exact) > 2 * bd)        # the data tell the two apart
    # (and of the operands truncated, should a WGMMA row take the product: NN products
    # on a Hopper may be copied along k for one)
    truncated = as_engine_sees("tf32", a, True).astype(np.float64) @ \
        as_engine_sees("tf32", b, True)
    for p in ("highest", "high", "medium"):
        precision(p)
        rows = tuning.gemm_rows(dev.facts, 4, np.float32, tuning.shape_class(M, N, 512))
        chosen = plans.best(dev.facts, rows, M, N, 512).params
        assert chosen.get("MMA") == (None if p == "highest" else "tf32"), (p, chosen)
        with clnn.profile() as prof:
            got = clnn.gemm(clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)).get()
        want = exact if p == "highest" else truncated if ran_wgmma(prof.records) else tf32
        assert np.all(np.abs(got - want) <= bd), p


@pytest.mark.parametrize("kind", ["tf32", "f16", "bf16"])
@pytest.mark.parametrize("geom", [(3, 5, 11, 13, 7, 3, 1, 1), (2, 3, 29, 29, 64, 7, 2, 3),
                                  (4, 16, 9, 9, 33, 3, 1, 0)], ids=str)
def test_convolutions_on_the_engines(dev, kind, geom):
    """A layer's three convolutions (gemm.cl's implicit-GEMM loaders) on each engine row:
    float16 or bfloat16 storage, or float32 on the TF32 rows."""
    for row in engine_rows(dev, kind, every=False):
        check_conv(dev, kind, row, geom)


def check_conv(dev, kind, row, geom):
    if not dev.facts.fp64:
        pytest.skip("the reference runs in float64 on the device")
    N, C, H, W, M, R, st, pd = geom
    dt = DTYPE[kind]
    x = RNG.standard_normal((N, C, H, W)).astype(dt)
    w = RNG.standard_normal((M, C, R, R)).astype(dt)
    # (with no layer in convt.cl's direct tiles: here the engine's loaders are tested;
    # each pass profiled, to know whether a WGMMA row, which truncates, took its GEMM)
    with tuning.override("gemm", row), \
            mock.patch.object(sys.modules["clnn.ops.conv"], "TILE_DIRECT_MAXM", 0):
        with clnn.profile() as p_fwd:
            y = clnn.conv2d(clnn.asarray(x, device=dev), clnn.asarray(w, device=dev),
                            stride=st, padding=pd).get()
        dy = RNG.standard_normal(y.shape).astype(dt)
        with clnn.profile() as p_data:
            dx = clnn.conv2d_backward_data(clnn.asarray(dy, device=dev),
                                           clnn.asarray(w, device=dev), x.shape, stride=st,
                                           padding=pd).get()
        with clnn.profile() as p_weight:
            dw = clnn.conv2d_backward_weight(clnn.asarray(dy, device=dev),
                                             clnn.asarray(x, device=dev), w.shape,
                                             stride=st, padding=pd).get()
    got = [y, dx, dw]
    wg = [ran_wgmma(p.records) for p in (p_fwd, p_data, p_weight)]
    xe, we = as_engine_sees(kind, x, wg[0]), as_engine_sees(kind, w, wg[0])
    wde, dyd = as_engine_sees(kind, w, wg[1]), as_engine_sees(kind, dy, wg[1])
    xwe, dyw = as_engine_sees(kind, x, wg[2]), as_engine_sees(kind, dy, wg[2])

    def f64(v):
        return clnn.asarray(v.astype(np.float64), device=dev)

    def absf(v):
        return f64(np.abs(v.astype(np.float64)))
    # float64 references of the operands the engines see: clnn's float64 convolutions
    # (themselves tested against numpy's loops in test_conv.py), outside the override
    refs = [(clnn.conv2d(f64(xe), f64(we), stride=st, padding=pd),
             clnn.conv2d(absf(xe), absf(we), stride=st, padding=pd), C * R * R),
            (clnn.conv2d_backward_data(f64(dyd), f64(wde), x.shape, stride=st, padding=pd),
             clnn.conv2d_backward_data(absf(dyd), absf(wde), x.shape, stride=st, padding=pd),
             M * R * R),
            (clnn.conv2d_backward_weight(f64(dyw), f64(xwe), w.shape, stride=st, padding=pd),
             clnn.conv2d_backward_weight(absf(dyw), absf(xwe), w.shape, stride=st,
                                         padding=pd),
             N * y.shape[2] * y.shape[3])]
    for name, g, (r, s, k) in zip(("forward", "data gradient", "weight gradient"), got, refs):
        r, s = r.get(), s.get()
        err = np.abs(g.astype(np.float64) - r)
        bd = bound(dt, s, r, k, stored=True)
        assert np.all(err <= bd), f"{kind} {name} {geom}: max error/bound {np.max(err / bd):.3g}"


@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32"])
@pytest.mark.parametrize("geom", [(3, 1, 32, 32, 6, 5, 5, (1, 1), (0, 0)),
                                  (2, 6, 14, 14, 16, 5, 5, (1, 1), (0, 0)),
                                  (2, 16, 10, 10, 6, 5, 5, (1, 1), (4, 4)),
                                  (2, 40, 9, 11, 9, 3, 3, (2, 1), (1, 2)),
                                  (1, 3, 19, 41, 1, 2, 1, (1, 3), (1, 0))],
                         ids=["C1", "C3", "16-to-6-pad4", "blocks", "one-filter"])
def test_direct_tiles_on_the_engines(dev, kind, geom):
    """convt.cl's engine variant (the GPU path's layers of at most 16 filters where the
    rows are engine rows): the tile's positions along the engine's m, the filters along
    its n (8 or 16), a channel block's taps along k padded to the engine's. LeNet-5's C1
    (25 taps: a whole k step and a padded one) and C3 with its data gradient (the
    flipped pass from 16 to 6 channels, in blocks of 6, 6 and 4); 16 channels to 6
    filters padded by 4 (its data gradient a flipped pass with no padding); 40 channels
    in blocks at stride (2, 1) with padding; one filter, and tiles that P and Q leave
    partial; with bias, relu, offsets and canaries, against float64 of what the engine
    multiplies; each pass one launch of the engine variant (a strided data gradient
    takes the engine GEMM)."""
    if not dev.facts.fp64:
        pytest.skip("the reference runs in float64 on the device")
    N, C, H, W, M, R, S, st, pd = geom
    dt = DTYPE[kind]
    row = engine_rows(dev, kind, every=False)[0]
    x = RNG.standard_normal((N, C, H, W)).astype(dt)
    w = RNG.standard_normal((M, C, R, S)).astype(dt)
    b = RNG.standard_normal(M).astype(dt)
    xe, we = as_engine_sees(kind, x), as_engine_sees(kind, w)
    ref = conv2d_ref(xe.astype(np.float64), we.astype(np.float64), b.astype(np.float64),
                     st, pd)
    scale = conv2d_ref(np.abs(xe.astype(np.float64)), np.abs(we.astype(np.float64)),
                       np.abs(b.astype(np.float64)), st, pd)
    y = Guarded(dev, ref.shape, dt)
    dy = RNG.standard_normal(ref.shape).astype(dt)
    dx = Guarded(dev, x.shape, dt)
    wd = guarded_input(dev, w)
    with tuning.override("gemm", row), clnn.profile() as prof:
        clnn.conv2d(guarded_input(dev, x), wd, guarded_input(dev, b), stride=st,
                    padding=pd, out=y.view, activation="relu")
        clnn.conv2d_backward_data(guarded_input(dev, dy), wd, x.shape, stride=st,
                                  padding=pd, out=dx.view)
    got = y.check().astype(np.float64)
    bd = bound(dt, scale, ref, C * R * S)
    assert np.all(np.abs(got - np.maximum(ref, 0)) <= bd), \
        f"forward: max error/bound {np.max(np.abs(got - np.maximum(ref, 0)) / bd):.3g}"
    direct = [r for r in prof.records if r.entry == "clnn_convt_forward"]
    assert all(dict(r.params)["MMA"] == ROWS[kind] for r in direct)
    assert prof.records[0].entry == "clnn_convt_forward"
    dgrad = st == (1, 1) and C <= 16
    assert len(direct) == 1 + dgrad and (prof.records[1] in direct) == dgrad
    # the data gradient: the adjoint's float64 reference, as the forward pass's (of
    # truncated operands where a WGMMA row took a strided one's GEMM)
    wg = ran_wgmma(prof.records[1:])
    dye = as_engine_sees(kind, dy, wg).astype(np.float64)
    wde = as_engine_sees(kind, w, wg).astype(np.float64)
    eye = np.eye(C * H * W).reshape(C * H * W, C, H, W)
    jac = np.stack([conv2d_ref(e[None].repeat(1, 0), wde, None, st, pd)[0].ravel()
                    for e in eye], axis=1)
    jabs = np.abs(jac)
    for n in range(N):
        r = (dye[n].ravel() @ jac).reshape(C, H, W)
        sc = (np.abs(dye[n]).ravel() @ jabs).reshape(C, H, W)
        g = dx.check()[n].astype(np.float64)
        # (a strided one takes the engine GEMM, whose col2im sums partials stored in dt)
        bd = bound(dt, sc, r, M * R * S, stored=not dgrad)
        assert np.all(np.abs(g - r) <= bd), \
            f"data gradient: max error/bound {np.max(np.abs(g - r) / bd):.3g}"


@pytest.mark.parametrize("kind", ["f16", "tf32"])
def test_direct_tiles_on_the_engines_keep_infinities(dev, kind):
    """A block's k padded to the engine's (LeNet-5's C1: 25 taps in 32) reads no element
    of x: an infinite input makes infinite outputs, not NaN (0 x inf) where a padded k
    would have read it."""
    dt = DTYPE[kind]
    x = np.abs(RNG.standard_normal((1, 1, 12, 20))).astype(dt) + 1
    x[0, 0, 2, 3] = np.inf
    w = (np.abs(RNG.standard_normal((6, 1, 5, 5))) + 1).astype(dt)
    with tuning.override("gemm", engine_rows(dev, kind, every=False)[0]):
        got = clnn.conv2d(clnn.asarray(x, device=dev), clnn.asarray(w, device=dev)).get()
    want = conv2d_ref(x.astype(np.float64), w.astype(np.float64), None, (1, 1), (0, 0))
    assert np.array_equal(np.isinf(got), np.isinf(want)) and np.isinf(want).sum() == 6 * 12
    assert not np.isnan(got).any()


def narrow_row(dev):
    """The narrow float16 tile (16 x 128, warp blocks of 16 x 32: products with few
    rows; tuning.NARROW_F16, out of the table), real where the device has the engines,
    emulated elsewhere."""
    row = tuning.NARROW_F16
    return row if tuning.mma_rows(dev.facts, "f16") else dict(row, EMULATE=True)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_narrow_rows(dev, kind):
    """Products of 1 to 33 rows (one tile row and a bit of the next, the four
    transposes, cp.async copies of 16 bytes and register loads, split-K) and LeNet-5's
    convolutions of 6 and 16 filters and channels, which the planner gives this tile."""
    row = narrow_row(dev)
    for i, (M, N, K, ta, tb, align) in enumerate((
            (1, 131, 40, False, False, 8), (6, 300, 75, True, False, 8),
            (16, 129, 33, False, True, 0), (17, 45, 70, True, True, 8),
            (33, 257, 96, False, False, 0))):
        check(dev, kind, row, M, N, K, ta, tb, alpha=1.0 if i % 2 else -0.5,
              beta=0.5 if tb else 0.0, bias=ta, act="relu" if i % 2 else None, align=align)
    check(dev, kind, dict(row, KSPLIT=3), 6, 25, 301, True, False, alpha=1.0, beta=-1.5,
          bias=True, act=None)
    for geom in ((3, 1, 12, 13, 6, 5, 1, 0), (2, 6, 9, 11, 16, 5, 1, 0)):
        check_conv(dev, kind, row, geom)


def ldsm_row(dev):
    """A float16 row with ldmatrix and tiles of plain halves (LDSM): not in the table
    (not yet timed on a GPU; the tuner searches such rows), real where the device has
    the engines, emulated elsewhere (the emulation reads what ldmatrix would give each
    lane from the row addresses the lanes pass, so the addresses are checked too)."""
    return dict(engine_rows(dev, "f16", every=False)[-1], LDSM=True)   # the 64x64 tile


def test_ldmatrix_rows(dev):
    """Each operand layout (rows of k, or rows of m and n holding k: the four
    transposes), tile edges, split-K and the convolution loaders."""
    row = ldsm_row(dev)
    for ta in (False, True):
        for tb in (False, True):
            check(dev, "f16", row, 37, 45, 70, ta, tb, alpha=1.0 if ta else -0.5,
                  beta=0.5 if tb else 0.0, bias=ta, act="relu" if tb else None)
    check(dev, "f16", row, 67, 61, 75, False, False, alpha=1.0, beta=0.0, bias=False,
          act=None)
    check(dev, "f16", dict(row, KSPLIT=3), 33, 17, 301, True, False, alpha=1.0,
          beta=-1.5, bias=True, act=None)
    check_conv(dev, "f16", row, (2, 3, 9, 11, 17, 3, 2, 1))


def async_row(dev, kind, stages):
    """A row whose tiles arrive by cp.async, ``stages`` of them in local memory (ASYNC):
    the smallest TF32 row, or the float16 row with ldmatrix. Not in the table (not yet
    timed on a GPU; the tuner searches such rows). Emulated, each work-item makes its
    copies only at the wait that lets them land, so a tile read too early reads the one
    before it."""
    base = ldsm_row(dev) if kind == "f16" else engine_rows(dev, kind, every=False)[-1]
    return dict(base, ASYNC=stages)


def tiled_params(row, run):
    """(vec, tuning) of each tiled GEMM kernel ``run`` builds (under ``row``'s
    override, which the caller puts in force)."""
    seen = []
    real = programs.get_kernel

    def spy(device, stem, entry, params, options=()):
        if entry == "clnn_gemm_tiled":
            seen.append((params["vec"], dict(params["tuning"])))
        return real(device, stem, entry, params, options)
    with mock.patch.object(programs, "get_kernel", spy):
        run()
    return seen


def vector_widths(row, run):
    """The vector widths (``vec``) of the tiled GEMM kernels ``run`` builds under
    ``row``'s override: which of them copy by cp.async (at least 4 bytes a copy)."""
    return [v for v, t in tiled_params(row, run) if t.get("ASYNC")]


@pytest.mark.parametrize("kind,stages", [("f16", 2), ("f16", 3), ("tf32", 2), ("tf32", 3)])
def test_cp_async_rows(dev, kind, stages):
    """Copies of 16, 8 and 4 bytes (operands whose offsets and rows allow vectors of 8,
    4 and 2 halves, or 4, 2 and 1 floats, the last vector of a row part outside the
    matrix: zero-filled), the four transposes, tile edges and split-K (two stages: one
    of each copy size, and convolutions); float16 too unaligned for a copy of 4 bytes
    falls back to the LDSM row's loads through registers."""
    row = async_row(dev, kind, stages)
    widths = (8, 4, 2) if kind == "f16" else (4, 2, 1)
    cases = [(37, 45, 75, ta, tb, widths[0]) for ta in (False, True) for tb in (False, True)]
    cases += [(67, 61, 130, False, False, widths[1]), (33, 17, 301, True, False, widths[2])]
    if stages == 2:
        cases = cases[:1] + cases[-2:]
    for i, (M, N, K, ta, tb, vec) in enumerate(cases):
        split = dict(row, KSPLIT=3) if i == len(cases) - 1 else row
        assert vector_widths(split, lambda: check(
            dev, kind, split, M, N, K, ta, tb, alpha=1.0 if ta else -0.5,
            beta=0.5 if tb else 0.0, bias=ta, act="relu" if i % 2 else None,
            align=vec if vec > 1 else 0)) == [vec]
    if kind == "f16":
        assert vector_widths(row, lambda: check(dev, kind, row, 20, 9, 33, False, False,
                                                alpha=1.0, beta=0.0, bias=False,
                                                act=None)) == [1]
    if stages == 2:
        # a layer's convolutions under the row: their gathered operands load through
        # registers, as the row without ASYNC loads them
        check_conv(dev, kind, row, (2, 3, 9, 11, 17, 3, 2, 1))


def wgmma_rows(dev, kind):
    """WGMMA rows (Hopper's wgmma.mma_async, tuning.WGMMA_CANDIDATES): every candidate,
    real, on a device of compute capability 9.0 with CLNN_TEST_WGMMA=1; otherwise
    emulated (each work-item reads its outputs' operands through the descriptors, as
    the hardware would), in smaller tiles that PoCL builds quickly: one warpgroup over
    64 x 64, and two wgmma tiles along m for one warpgroup (128 x 64), which exercise
    the same layouts, descriptors and accumulator places. Until a GPU has run them
    nothing chooses these rows, and a wrong descriptor can crash the process (without
    pytest-xdist, the whole GPU run): benchmarks/bench_engines.py --wgmma probes them
    in a process of its own first."""
    k = ROWS[kind]
    if dev.facts.nv_compute_capability >= 90 and os.environ.get("CLNN_TEST_WGMMA"):
        return tuning.wgmma_rows(k)
    kwg = 16 if k == "tf32" else 32
    small = {"variant": "local", "MMA": k, "MWG": 64, "NWG": 64, "KWG": kwg, "MDIMC": 8,
             "NDIMC": 16, "WM": 64, "WN": 64, "ASYNC": 3 if k == "tf32" else 2,
             "WGMMA": True, "EMULATE": True}
    # and wgmma batches left in flight across a step (WGWAIT 1), with copies that land
    # as late as they may (a tile read before it landed fails) and as early (EAGER: a
    # tile overwritten while a batch still reads it fails)
    # and K-major tiles swizzled in rows of 64 bytes, and of 128 and 32 (WGSWZ)
    return [small, dict(small, MWG=128, WM=128, ASYNC=2),
            dict(small, ASYNC=3, WGWAIT=1), dict(small, ASYNC=3, WGWAIT=1, EAGER=True),
            dict(small, WGSWZ=True), dict(small, WGSWZ=True, KWG=2 * kwg),
            dict(small, WGSWZ=True, KWG=kwg // 2, ASYNC=3)]


@pytest.mark.parametrize("kind", ["tf32", "f16", "bf16"])
def test_wgmma_rows(dev, kind):
    """Each WGMMA row: the four transposes (K-major tiles, and float16 tiles stored
    along m or n that the instruction transposes; TF32 operands stored along m or n
    copied a float at a time), copies of 16, 8 and 4 bytes, tile edges, split-K, the
    epilogue. TF32 operands are truncated to 19 bits, as wgmma reads them."""
    widths = (8, 4, 2) if kind != "tf32" else (4, 2, 1)
    r_size = np.dtype(DTYPE[kind]).itemsize
    rows = wgmma_rows(dev, kind)
    if kind == "bf16" and rows[0].get("EMULATE"):
        # bfloat16 differs from float16 only in its conversions and the instruction's
        # operand type: the first row, every case (each emulated row costs a cold
        # PoCL about 5 s of kernel builds)
        rows = rows[:1]
    for i, row in enumerate(rows):
        cases = [(37, 45, 75, ta, tb, widths[0]) for ta in (False, True)
                 for tb in (False, True)]
        cases += [(67, 61, 130, False, False, widths[1]), (33, 17, 301, True, False,
                                                           widths[2])]
        if kind == "tf32":
            # floats aligned to 8 still copy 4 at a time (16 bytes, cp.async's most)
            cases.append((40, 24, 48, False, True, 8))
        if i:
            cases = cases[1:2] + cases[-1:]
        for j, (M, N, K, ta, tb, vec) in enumerate(cases):
            r = dict(row, KSPLIT=3) if j == len(cases) - 1 else row
            seen = tiled_params(r, lambda: check(
                dev, kind, r, M, N, K, ta, tb, alpha=1.0 if ta else -0.5,
                beta=0.5 if tb else 0.0, bias=ta, act="relu" if j % 2 else None,
                align=vec if vec > 1 else 0))
            assert [(v, t.get("WGMMA")) for v, t in seen] == [(min(vec, 16 // r_size), True)]


def test_wgmma_rows_hand_other_launches_to_mma_sync(dev):
    """Where a WGMMA row cannot run (float16 too unaligned for 4-byte copies, a
    convolution's gathered operands), the table's mma.sync row of its kind does."""
    row = wgmma_rows(dev, "f16")[0]
    seen = tiled_params(row, lambda: check(dev, "f16", row, 20, 9, 33, False, False,
                                           alpha=1.0, beta=0.0, bias=False, act=None))
    assert len(seen) == 1 and not seen[0][1].get("WGMMA") and seen[0][1]["MMA"] == "f16"
    seen = tiled_params(row, lambda: check_conv(dev, "f16", row, (2, 3, 9, 11, 17, 3, 2, 1)))
    assert seen and not any(t.get("WGMMA") for _, t in seen)


def test_wgmma_rows_in_batches(dev):
    """A batched product (a batch stride per operand, B shared by every batch) on a
    WGMMA row: each batch's tiles land in its own output, canaries untouched."""
    row = wgmma_rows(dev, "f16")[0]
    a = RNG.standard_normal((3, 37, 40)).astype(np.float16)
    b = RNG.standard_normal((40, 24)).astype(np.float16)
    big = np.full((3 * 37 * 24 + 16,), CANARY, np.float16)
    out_big = clnn.asarray(big, device=dev)
    out = out_big[8:8 + 3 * 37 * 24].reshape(3, 37, 24)
    with tuning.override("gemm", row):
        seen = tiled_params(row, lambda: clnn.gemm(clnn.asarray(a, device=dev),
                                                   clnn.asarray(b, device=dev), out=out))
    assert [t.get("WGMMA") for _, t in seen] == [True]
    got = out_big.get()
    assert np.all(got[:8] == CANARY) and np.all(got[-8:] == CANARY)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    err = np.abs(got[8:-8].reshape(3, 37, 24).astype(np.float64) - ref)
    assert np.all(err <= bound(np.float16, scale, ref, 40))


@pytest.mark.parametrize("stages", [0, 2])
def test_tf32_rows_that_truncate(dev, stages):
    """TF32T: the mma.sync TF32 rows without their rounding (the engine reads the
    floats' top 19 bits, as the WGMMA rows' engine does), register-staged and by
    cp.async, every transpose and split-K, against float64 products of the truncated
    operands; a row that still rounded fails these."""
    base = engine_rows(dev, "tf32", every=False)[-1]
    row = dict(base, TF32T=True, **({"ASYNC": stages} if stages else {}))
    for ta in (False, True):
        for tb in (False, True):
            check(dev, "tf32", row, 37, 45, 75, ta, tb, alpha=1.0 if ta else -0.5,
                  beta=0.5 if tb else 0.0, bias=ta, act=None, align=4)
    check(dev, "tf32", dict(row, KSPLIT=3), 33, 17, 301, True, False, alpha=1.0,
          beta=-1.5, bias=True, act=None)


def test_a_wgmma_row_that_does_not_build_leaves_the_devices_plans(dev, monkeypatch):
    """A driver that builds no patched sm_90a PTX (the WGMMA row's build fails, here
    made to): the product still comes out right, on the rows that remain, with one
    RuntimeWarning; the device's facts say so (patched_ptx), its WGMMA rows are refused
    from then on, and the next product neither tries them nor warns."""
    import dataclasses
    import sys
    import warnings
    from clnn.errors import KernelBuildError
    G = sys.modules["clnn.ops.gemm"]
    # (the mma.sync row, real where the device has engines, emulated elsewhere, chosen
    # before the facts below claim engines; slowed in the planner's eyes, so that the
    # WGMMA row is its choice for a product PoCL runs emulated in a second)
    mma = dict(engine_rows(dev, "f16", every=False)[-1], speed=1.0)
    monkeypatch.setattr(dev, "facts", dataclasses.replace(
        dev.facts, nv_compute_capability=90, patched_ptx=True, compute_units=132))
    wg = next(r for r in tuning.MMA_TABLE[("nvidia", "GPU")]
              if r.get("WGMMA") and r["MMA"] == "f16")
    rows = (wg, mma)
    monkeypatch.setattr(tuning, "gemm_rows", lambda *args, **kw: rows)
    tried, real = [], G._tiled_kernel

    def driver(d, p, prm, entry):
        tried.append(bool(p.get("WGMMA")))
        if p.get("WGMMA"):
            raise KernelBuildError("ptxas: 'wgmma.mma_async' not supported on .target")
        return real(d, p, prm, entry)
    monkeypatch.setattr(G, "_tiled_kernel", driver)
    a = RNG.standard_normal((256, 512)).astype(np.float16)
    b = RNG.standard_normal((256, 512)).astype(np.float16)
    A, B = clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)
    with pytest.warns(RuntimeWarning, match="WGMMA row did not build"):
        got = clnn.gemm(A, B, trans_b=True).get()
    assert tried[0] is True and tried[-1] is False
    assert not dev.facts.patched_ptx
    assert any("patched PTX" in p for p in tuning.gemm_problems(wg, dev.facts, 2))
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    assert np.all(np.abs(got - ref) <= bound(np.float16, scale, ref, 512))
    tried.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clnn.gemm(B, A, trans_b=True)
    assert tried and not any(tried)


@pytest.mark.parametrize("kind", ["f16", "tf32", "bf16"])
def test_products_not_k_major_are_copied_along_k_for_a_wgmma_row(dev, monkeypatch, kind):
    """NN, TN and TT products on a device whose planner offers a K-major WGMMA row (for
    NT classes only, as the table's): where that row's plan beats the product's own by
    more than the copies cost, A (stored K x M) and B (stored K x N) are copied along k
    (transpose.cl, rows padded to 16 bytes) and the product runs NT on the WGMMA row,
    emulated here, with the output's offset, stride, epilogue and canaries as any
    product's; an NT product copies nothing, and neither does a small one."""
    import dataclasses
    monkeypatch.setattr(dev, "facts", dataclasses.replace(
        dev.facts, nv_compute_capability=90, compute_units=132))
    wg = dict(wgmma_rows(dev, ROWS[kind])[0], KMAJOR=True, speed=10.6, EMULATE=True)
    # (the mma.sync row slowed in the planner's eyes, so that the copies pay on
    # products PoCL runs emulated in a second or two)
    mma = dict(engine_rows(dev, kind, every=False)[-1], speed=0.25, EMULATE=True)
    nt_rows, other_rows = (wg, mma), (mma,)
    monkeypatch.setattr(tuning, "gemm_rows", lambda facts, size, dt, klass=None:
                        nt_rows if klass and klass.startswith("NT-") else other_rows)
    dt = DTYPE[kind]
    # (the last two: a product too small for the copies to pay, and 16-bit rows of A
    # too unaligned for the WGMMA row's copies, which would not take it anyway)
    for M, N, K, ta, tb in ((67, 190, 522, False, False), (130, 61, 515, True, False),
                            (45, 129, 516, True, True), (67, 190, 522, False, True),
                            (9, 7, 5, False, False), (67, 190, 523, False, False)):
        a = RNG.standard_normal((K, M) if ta else (M, K)).astype(dt)
        b = RNG.standard_normal((N, K) if tb else (K, N)).astype(dt)
        bv = RNG.standard_normal(N).astype(dt)
        big = np.full((M + 2, N + 3), CANARY, dt)
        out_big = clnn.asarray(big, device=dev)
        seen = []
        real = programs.get_kernel

        def spy(device, stem, entry, params, options=()):
            seen.append(entry if entry != "clnn_gemm_tiled" else
                        ("wgmma" if dict(params["tuning"]).get("WGMMA") else "mma"))
            return real(device, stem, entry, params, options)
        with mock.patch.object(programs, "get_kernel", spy):
            clnn.gemm(clnn.asarray(a, device=dev), clnn.asarray(b, device=dev),
                      out=out_big[1:1 + M, 2:2 + N], alpha=-0.5, trans_a=ta, trans_b=tb,
                      bias=clnn.asarray(bv, device=dev), activation="relu")
        odd = K % 2 and not ta and np.dtype(dt).itemsize == 2
        copies = int(ta) + int(not tb) if M * N * K > 1000 and not odd else 0
        want = ["clnn_transpose"] * copies + (["wgmma"] if copies or tb else ["mma"])
        assert [e for e in seen if e != "clnn_gemm_splitk"] == want, (M, N, K, ta, tb)
        got_big = out_big.get()
        mask = np.ones(big.shape, bool)
        mask[1:1 + M, 2:2 + N] = False
        assert np.all(got_big[mask] == CANARY)
        on_wg = "wgmma" in seen
        A64 = as_engine_sees(kind, a.T if ta else a, on_wg).astype(np.float64)
        B64 = as_engine_sees(kind, b.T if tb else b, on_wg).astype(np.float64)
        ref = np.maximum(-0.5 * (A64 @ B64) + bv.astype(np.float64), 0.0)
        scale = 0.5 * (np.abs(A64) @ np.abs(B64)) + np.abs(bv.astype(np.float64))
        err = np.abs(got_big[1:1 + M, 2:2 + N].astype(np.float64) - ref)
        assert np.all(err <= bound(dt, scale, ref, K)), (kind, M, N, K, ta, tb)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (True, True)])
def test_a_forced_row_keeps_its_product_where_wgmma_rows_are_offered(dev, monkeypatch,
                                                                      ta, tb):
    """tuning.override's row decides alone on a Hopper, NN, TN and TT too: the NT
    class's rows are not weighed against it (a forced CPU row, which has no K-major
    plan, raised KeyError 'KWG' there: 48 tests on an H200, 2026-11-28), nothing is
    copied along k, and the product comes out right between its canaries."""
    import dataclasses
    monkeypatch.setattr(dev, "facts", dataclasses.replace(
        dev.facts, nv_compute_capability=90, compute_units=132))
    M, N, K = 67, 190, 522
    a = RNG.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    b = RNG.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    big = np.full((M + 2, N + 3), CANARY, np.float32)
    out_big = clnn.asarray(big, device=dev)
    seen = []
    real = programs.get_kernel

    def spy(device, stem, entry, params, options=()):
        seen.append(entry)
        return real(device, stem, entry, params, options)
    with tuning.override("gemm", tuning.GEMM_TABLE["type"]["CPU"]), \
            mock.patch.object(programs, "get_kernel", spy):
        clnn.gemm(clnn.asarray(a, device=dev), clnn.asarray(b, device=dev),
                  out=out_big[1:1 + M, 2:2 + N], trans_a=ta, trans_b=tb)
    assert seen and "clnn_transpose" not in seen
    got_big = out_big.get()
    mask = np.ones(big.shape, bool)
    mask[1:1 + M, 2:2 + N] = False
    assert np.all(got_big[mask] == CANARY)
    A64 = (a.T if ta else a).astype(np.float64)
    B64 = (b.T if tb else b).astype(np.float64)
    err = np.abs(got_big[1:1 + M, 2:2 + N] - A64 @ B64)
    assert np.all(err <= 2 * K * np.finfo(np.float32).eps * (np.abs(A64) @ np.abs(B64)))


@pytest.mark.parametrize("kind", ["tf32", "f16"])
def test_convolutions_on_a_wgmma_row(dev, kind):
    """A WGMMA row forced (as the H200's first engine rows are chosen): the gathered
    products fall back to mma.sync, the data gradient's plain GEMM before col2im (fewer
    than 16 channels) runs on it, TF32 operands truncated there (on an H200 the test
    above failed so, 2026-11-28, its reference rounding them), emulated here."""
    check_conv(dev, kind, wgmma_rows(dev, kind)[0], (3, 5, 11, 13, 7, 3, 1, 1))
