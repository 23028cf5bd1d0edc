"""GEMM and GEMV against a float64 numpy reference.

Outputs live inside bigger canary-filled matrices (an offset and a row stride), inputs
are row-strided views with offsets, and every tile variant is forced in turn.
"""

import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import clnn
from clnn import tuning
from conftest import CANARY, eps, error_bound, float_dtypes, guarded_input
from reference import f_ref

RNG = np.random.default_rng(2024)

VARIANTS = {
    "cpu-default": tuning.GEMM_TABLE["type"]["CPU"],
    "cpu-4x32": {"variant": "reg", "MWI": 4, "NWI": 32, "VW": 8, "WGM": 16},
    # 512-bit tiles (CPUs whose code has them: elsewhere these skip), in registers only:
    # packing, epilogue (an accumulator's halves) and the direct kernel take 256 bits
    "cpu-512": tuning.GEMM_TABLE["lanes"][("CPU", 16)][0],
    "cpu-512-f64": tuning.GEMM_TABLE["lanes"][("CPU", 16)][1],
    "cpu-3x8-vw4": {"variant": "reg", "MWI": 3, "NWI": 8, "VW": 4, "WGM": 5},
    # the packed kernel's groups of row blocks walking the panels first (problems this
    # small otherwise walk the rows first)
    "cpu-panels-first": dict(tuning.GEMM_TABLE["type"]["CPU"], WGM=3, PANELS_FIRST=True),
    "cpu-scalar": {"variant": "reg", "MWI": 1, "NWI": 1, "VW": 1, "WGM": 1},
    "gpu-generic": tuning.GEMM_TABLE["type"]["GPU"],
    "gpu-default": tuning.GEMM_TABLE["default"],
    "gpu-odd": {"variant": "local", "MWG": 12, "NWG": 8, "KWG": 5, "MDIMC": 4, "NDIMC": 2},
    # NVIDIA's rows: 64x64 tiles of 8x8 vector blocks (inside tiles from 64 up), and
    # split-K forced into three slices on the small tile
    "gpu-nvidia-64": tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")][3],
    "gpu-nvidia-splitk": dict(tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")][-1], KSPLIT=3),
}
NVIDIA_BIG = tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")][0]
# sizes around every tile edge used above
EDGES = [1, 2, 3, 5, 7, 8, 9, 12, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65]


def skip_unless_fits(params, dtype=np.float32):
    """Skip where this device refuses the row (512-bit tiles on a CPU whose code has
    256-bit vectors), saying why."""
    problems = tuning.gemm_problems(params, clnn.device().facts, np.dtype(dtype).itemsize)
    if problems:
        pytest.skip(f"{params} does not fit {clnn.device().facts.name}: {problems}")


def host_view(shape, dtype, pad_rows=1, pad_cols=3, fill=None):
    """(big host matrix, slices) for an operand living inside a bigger matrix."""
    *batch, r, c = shape
    big = np.full(tuple(batch) + (r + 2 * pad_rows, c + 2 * pad_cols), CANARY, dtype=dtype)
    sl = (Ellipsis, slice(pad_rows, pad_rows + r), slice(pad_cols, pad_cols + c))
    if fill is not None:
        big[sl] = fill
    return big, sl


def device_view(host, sl):
    big = clnn.asarray(host)
    return big, big[sl]


def reference(a, b, c, alpha, beta, ta, tb, bias=None, act=None):
    A = np.swapaxes(a, -1, -2) if ta else a
    B = np.swapaxes(b, -1, -2) if tb else b
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    r = alpha * (A64 @ B64)
    scale = abs(alpha) * (np.abs(A64) @ np.abs(B64))
    if beta:
        r = r + beta * c.astype(np.float64)
        scale = scale + abs(beta) * np.abs(c.astype(np.float64))
    if bias is not None:
        r = r + bias.astype(np.float64)
        scale = scale + np.abs(bias.astype(np.float64))
    return r, scale


def check_gemm(M, N, K, ta, tb, alpha, beta, dtype, batch=None, bias=False, act=None):
    lead = (batch,) if batch else ()
    a = RNG.standard_normal(lead + ((K, M) if ta else (M, K))).astype(dtype)
    b = RNG.standard_normal(lead + ((N, K) if tb else (K, N))).astype(dtype)
    c = RNG.standard_normal(lead + (M, N)).astype(dtype)
    # bias: True for the (N,) row of a dense layer, or a shape that broadcasts (addmm's)
    bshape = bias if isinstance(bias, tuple) else (N,)
    bv = RNG.standard_normal(bshape).astype(dtype) if bias is not False else None
    _, A = device_view(*host_view(a.shape, dtype, fill=a))
    _, B = device_view(*host_view(b.shape, dtype, 2, 1, fill=b))
    c_host, c_sl = host_view(c.shape, dtype, 1, 2, fill=c if beta else np.nan)
    c_big, C = device_view(c_host, c_sl)
    r = clnn.gemm(A, B, out=C, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb,
                  bias=guarded_input(clnn.device(), bv) if bv is not None else None,
                  activation=act)
    assert r is C
    got_big = c_big.get()
    untouched = np.ones(got_big.shape, bool)
    untouched[c_sl] = False
    assert np.all(got_big[untouched] == CANARY), "a canary around out was overwritten"
    got = got_big[c_sl].astype(np.float64)
    ref, scale = reference(a, b, c, alpha, beta, ta, tb, bv)
    if act is not None:
        ref = f_ref(act, ref, 0.01 if act == "leaky_relu" else 1.0)
    bound = error_bound(dtype, K + 1, 4) * (scale + 1e-30) + (8 * eps(dtype) * np.abs(ref)
                                                            if act else 0)
    err = np.abs(got - ref)
    assert np.all(err <= bound), (f"max error {err.max()} vs bound "
                                  f"{bound.flat[np.argmax(err - bound)]} at "
                                  f"{np.unravel_index(np.argmax(err - bound), err.shape)}")


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@settings(max_examples=60, deadline=None)
@given(M=st.one_of(st.integers(1, 70), st.sampled_from(EDGES)),
       N=st.one_of(st.integers(1, 70), st.sampled_from(EDGES)),
       K=st.one_of(st.integers(1, 70), st.sampled_from(EDGES)),
       ta=st.booleans(), tb=st.booleans(),
       alpha=st.sampled_from([0.0, 1.0, -1.5]), beta=st.sampled_from([0.0, 1.0, -1.5]))
def test_gemm_variants(variant, M, N, K, ta, tb, alpha, beta):
    skip_unless_fits(VARIANTS[variant])
    with tuning.override("gemm", VARIANTS[variant]):
        check_gemm(M, N, K, ta, tb, alpha, beta, np.float32)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("mnk", [(1, 1, 1), (15, 17, 3), (97, 101, 103), (130, 67, 260)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gemm_dtypes_and_transposes(dtype, ta, tb, mnk):
    check_gemm(*mnk, ta, tb, 1.0, 0.0, dtype)


@pytest.mark.parametrize("variant", ["cpu-default", "gpu-generic"])
@pytest.mark.parametrize("act", [None] + list(clnn.ACTIVATIONS))
def test_fused_bias_and_activation(variant, act):
    with tuning.override("gemm", VARIANTS[variant]):
        check_gemm(33, 19, 45, False, True, 1.0, 0.0, np.float32, bias=True, act=act)
        check_gemm(7, 70, 9, True, False, -1.5, 1.0, np.float32, bias=True, act=act)


@pytest.mark.parametrize("variant", ["cpu-default", "gpu-generic", "gpu-nvidia-splitk"])
def test_bias_broadcasts_as_addmm(variant):
    """bias of shape (1, N), (M, 1), (), (1,), (1, 1): one value per column, per row, or
    one for all, in both GEMM variants, the vector stores and split-K's second pass."""
    with tuning.override("gemm", VARIANTS[variant]):
        for M, N, K in ((33, 19, 45), (64, 64, 64), (1, 7, 3)):
            for shape in ((1, N), (M, 1), (), (1,), (1, 1)):
                check_gemm(M, N, K, False, True, 1.0, 0.0, np.float32, bias=shape,
                           act="tanh")
                check_gemm(M, N, K, True, False, -1.5, 1.0, np.float32, bias=shape)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("variant", ["cpu-512-f64", "cpu-default", "cpu-3x8-vw4",
                                     {"variant": "reg", "MWI": 2, "NWI": 6, "VW": 2,
                                      "WGM": 3}], ids=["vw16", "vw8", "vw4", "vw2"])
def test_vector_epilogue(variant, dtype):
    """The CPU GEMM stores a vector of a row of C at once where it lies inside C (and
    element by element at the right edge): with bias per column, per row or one value,
    beta, activations, every dtype (float16's vector conversion on CPUs); a 512-bit
    accumulator as its two halves, each whole or element by element."""
    params = VARIANTS[variant] if isinstance(variant, str) else variant
    skip_unless_fits(params, dtype)
    with tuning.override("gemm", params):
        for M, N, K in ((33, 19, 45), (16, 64, 7), (5, 41, 3)):
            check_gemm(M, N, K, False, True, 1.0, 0.0, dtype, bias=(1, N), act="tanh")
            check_gemm(M, N, K, True, False, -1.5, 1.0, dtype, bias=(M, 1))
            check_gemm(M, N, K, False, False, 0.5, -1.0, dtype, bias=(), act="relu")


@pytest.mark.parametrize("act", ["tanh", "sigmoid"])
@pytest.mark.parametrize("variant", ["cpu-default", "cpu-scalar", "gpu-generic"])
def test_epilogue_exp_and_tanh_over_every_exponent(variant, act):
    """The fused epilogue's tanh and sigmoid (inline exp and tanh on PoCL, _activation.cl's
    clnn_expN and clnn_tanhN; the built-ins elsewhere) against float64 over float32
    values of every exponent, both signs: C = act(A B) with K = 1 and B all ones, so
    each output is act of one input exactly. Within 4 ulps wherever the result is a
    normal float; where exp overflows or underflows (sigmoid below -87: 0; tanh of
    large |x|: +-1), exact; inf and NaN as the float64 functions give them; tanh keeps
    the sign of zero. In vectors of the packed kernel's epilogue and lane by lane
    (scalar rows), and through the GPU tiles' scalar form."""
    skip_unless_fits(VARIANTS[variant])
    bits = np.arange(0, 2 ** 32, 4099, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 0.625, -0.625, 88.72283, 88.7229, -87.33654,
         -103.9, -104.1, 10.0, -10.0, 1e-30], np.float32)])
    x = x[:x.size // 64 * 64].reshape(-1, 64)       # (rows of 64: whole vectors)
    ones = np.ones((1, 1), np.float32)
    with tuning.override("gemm", VARIANTS[variant]):
        got = np.stack([clnn.gemm(clnn.asarray(col[:, None]), clnn.asarray(ones),
                                  activation=act).get()[:, 0] for col in x.T], 1)
    got = got.astype(np.float64)
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        ref = np.tanh(x64) if act == "tanh" else 1 / (1 + np.exp(-x64))
    normal = np.isfinite(ref) & (np.abs(ref) >= np.finfo(np.float32).tiny)
    ulp = np.spacing(np.abs(ref[normal]).astype(np.float32)).astype(np.float64)
    err = np.abs(got[normal] - ref[normal]) / ulp
    assert err.max() <= 4, f"{err.max()} ulps at x = {x[normal][err.argmax()]}"
    small = np.isfinite(ref) & ~normal           # sigmoid's denormal results: 0 or them
    assert np.all((got[small] == 0) | (np.abs(got[small] - ref[small]) <= 1e-44))
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    if act == "tanh":
        assert np.array_equal(np.signbit(got[x == 0]), np.signbit(x[x == 0]))
        assert np.all(got[np.abs(x) >= 10] == np.sign(x[np.abs(x) >= 10]))


@pytest.mark.parametrize("variant,dtype", [("cpu-default", t) for t in float_dtypes()]
                         + [("cpu-scalar", np.float32)],
                         ids=lambda v: v if isinstance(v, str) else np.dtype(v).name)
def test_direct_kernel_for_few_rows(variant, dtype):
    """Up to DIRECT_M rows of C with op(A) not transposed, the CPU variant reads A and B
    in place (clnn_gemm_direct, one launch), and so do products of up to DIRECT_FLOPS
    in float32, float64 and bfloat16 (LeNet-5's dense layers), and in float16 with B
    transposed up to DIRECT_ROWS_HALF rows: both B layouts, K past and short of a
    whole vector (float16 NN products convert A a vector of k at a time), N past a
    work-item's columns, every bias form, beta, activations, batches (B shared too),
    vectors of 8 (float32, float16), 4 (float64) and 1; one row more, in a bigger
    product, takes the packed kernels."""
    gemm_module = sys.modules["clnn.ops.gemm"]

    def top(tb):                # float16: fewer rows, by B's layout
        return gemm_module.DIRECT_M if dtype != np.float16 else \
            gemm_module.DIRECT_M_HALF[tb]

    def small(tb):              # 2.6 MFLOP
        return [(64, 121, 83)] if dtype != np.float16 or tb else []
    with tuning.override("gemm", VARIANTS[variant]):
        for tb in (False, True):
            for M, N, K in [(1, 1, 1), (1, 37, 21), (2, 5, 8), (min(3, top(tb)), 17, 3),
                            (top(tb), 33, 45)] + small(tb):
                with clnn.profile() as prof:
                    check_gemm(M, N, K, False, tb, 1.0, 0.0, dtype, bias=(1, N), act="tanh")
                    check_gemm(M, N, K, False, tb, -1.5, 1.0, dtype, bias=(M, 1))
                    if dtype != np.float16:        # (float16 builds slowly: two forms)
                        check_gemm(M, N, K, False, tb, 0.5, -1.0, dtype, bias=(),
                                   act="relu")
                        check_gemm(M, N, K, False, tb, 1.0, 0.0, dtype, batch=3)
                assert {r.entry for r in prof.records} == {"clnn_gemm_direct"}
        a = RNG.standard_normal((4, 9, 6)).astype(dtype)
        w = RNG.standard_normal((5, 6)).astype(dtype)
        got = clnn.gemm(clnn.asarray(a), clnn.asarray(w), trans_b=True).get()
        np.testing.assert_allclose(got, a.astype(np.float64) @ w.T, rtol=4 * eps(dtype),
                                   atol=8 * eps(dtype))
        # past both bounds: 2 (top + 1) N K > DIRECT_FLOPS, or float16; and a small
        # product of more than DIRECT_ROWS rows
        for tb in (False, True):
            n = 1 + int((gemm_module.DIRECT_FLOPS / (2 * (top(tb) + 1))) ** 0.5)
            with clnn.profile() as prof:
                check_gemm(top(tb) + 1, n, n, False, tb, 1.0, 0.0, dtype)
            assert "clnn_gemm_direct" not in {r.entry for r in prof.records}
        with clnn.profile() as prof:
            check_gemm(gemm_module.DIRECT_ROWS + 1, 3, 5, False, False, 1.0, 0.0, dtype)
            if dtype == np.float16:
                check_gemm(gemm_module.DIRECT_ROWS_HALF + 1, 3, 5, False, True, 1.0, 0.0,
                           dtype)
        assert "clnn_gemm_direct" not in {r.entry for r in prof.records}


@pytest.mark.parametrize("variant", ["cpu-default", "cpu-panels-first", "gpu-odd"])
def test_batched(variant):
    with tuning.override("gemm", VARIANTS[variant]):
        check_gemm(13, 21, 17, False, False, 1.0, 0.0, np.float32, batch=3)
        check_gemm(13, 21, 17, True, True, -1.5, 1.0, np.float32, batch=2)
        # one side shared by every batch
        a = RNG.standard_normal((4, 9, 6)).astype(np.float32)
        w = RNG.standard_normal((5, 6)).astype(np.float32)
        got = clnn.gemm(clnn.asarray(a), clnn.asarray(w), trans_b=True).get()
        np.testing.assert_allclose(got, a @ w.T, rtol=1e-5, atol=1e-5)
        got = clnn.gemm(clnn.asarray(w), clnn.asarray(a), trans_b=True).get()
        np.testing.assert_allclose(got, w @ np.swapaxes(a, 1, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["gpu-generic", "gpu-odd"])
def test_local_fast_path_when_sizes_divide_the_tiles(variant):
    p = VARIANTS[variant]
    M, N, K = 2 * p["MWG"], 3 * p["NWG"], 4 * p["KWG"]
    with tuning.override("gemm", p):
        for ta, tb in [(False, False), (True, True)]:
            check_gemm(M, N, K, ta, tb, -1.5, 1.0, np.float32, bias=True, act="relu")


@pytest.mark.parametrize("groupm", [2, 3, 64])
def test_tiles_walked_in_bands_of_rows(groupm):
    """GROUPM: work-groups take their tiles in bands of GROUPM rows of tiles, a column
    at a time. Every tile once (beta != 0: a tile done twice adds beta * C twice):
    bands cut short at the bottom, a band taller than the matrix, batches, split-K."""
    p = dict(VARIANTS["gpu-odd"], GROUPM=groupm)
    for extra in ({}, {"KSPLIT": 3}):
        with tuning.override("gemm", dict(p, **extra)):
            check_gemm(12 * 5 + 7, 8 * 4 + 3, 23, False, False, 1.0, 0.5, np.float32,
                       bias=True)
            check_gemm(12 * 2 + 1, 17, 11, True, True, -1.0, 1.0, np.float32, batch=3)


def test_tile_bands_serve_tiled_rows_only():
    assert tuning.gemm_problems(dict(VARIANTS["gpu-odd"], GROUPM=4)) == []
    assert any("GROUPM" in p for p in
               tuning.gemm_problems(dict(VARIANTS["cpu-4x32"], GROUPM=4)))
    assert any("GROUPM" in p for p in
               tuning.gemm_problems(dict(VARIANTS["gpu-odd"], GROUPM=0)))


@pytest.mark.parametrize("split,offset", [(None, 0), (None, 1), (None, 2), (3, 0), (5, 2)],
                         ids=["vec4", "vec1", "vec2", "vec4-split3", "vec2-split5"])
def test_nvidia_big_tile(split, offset):
    """The 128x128 tile with inside and edge tiles, vector loads 4, 2 or 1 wide as the
    operands' offsets allow, vector stores of C, split-K, batches."""
    p = dict(NVIDIA_BIG, KSPLIT=split) if split else NVIDIA_BIG
    rng = np.random.default_rng(offset)
    with tuning.override("gemm", p):
        for M, N, K, ta, tb in [(256, 260, 48, False, False), (130, 256, 64, True, True),
                                (128, 128, 35, False, True), (257, 129, 16, True, False)]:
            a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
            b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
            c = rng.standard_normal((M, N)).astype(np.float32)
            bias = rng.standard_normal(N).astype(np.float32)
            flat = clnn.asarray(np.concatenate([np.zeros(offset, np.float32), a.ravel()]))
            A = flat[offset:].reshape(a.shape)
            big = clnn.asarray(np.full(offset + c.size + 7, CANARY, np.float32))
            C = big[offset:offset + c.size].reshape(c.shape)
            C.set(c)
            clnn.gemm(A, clnn.asarray(b), out=C, alpha=0.5, beta=-1.0, trans_a=ta,
                      trans_b=tb, bias=clnn.asarray(bias), activation="tanh")
            ref = np.tanh(0.5 * (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
                          - c + bias)
            np.testing.assert_allclose(C.get(), ref, rtol=1e-4, atol=1e-4)
            rest = big.get()
            assert np.all(rest[:offset] == CANARY) and np.all(rest[offset + c.size:] == CANARY)
        check_gemm(130, 70, 33, False, True, 1.0, 0.0, np.float32, batch=3)


def test_split_k_is_bitwise_reproducible_and_leaves_out_alone_on_error():
    a = clnn.asarray(RNG.standard_normal((40, 3000)).astype(np.float32))
    b = clnn.asarray(RNG.standard_normal((3000, 50)).astype(np.float32))
    with tuning.override("gemm", VARIANTS["gpu-nvidia-splitk"]):
        first = clnn.gemm(a, b).get()
        for _ in range(3):
            assert clnn.gemm(a, b).get().tobytes() == first.tobytes()
    ref = a.get().astype(np.float64) @ b.get()
    np.testing.assert_allclose(first, ref, rtol=1e-4, atol=1e-3)


def test_k_zero_gives_beta_times_out():
    c = RNG.standard_normal((5, 4)).astype(np.float32)
    C = clnn.asarray(c)
    clnn.gemm(clnn.zeros((5, 0)), clnn.zeros((0, 4)), out=C, beta=-1.5)
    np.testing.assert_array_equal(C.get(), -1.5 * c)
    assert np.all(clnn.gemm(clnn.zeros((5, 0)), clnn.zeros((0, 4))).get() == 0)


@pytest.mark.parametrize("variant", ["cpu-default", "gpu-generic"])
def test_beta_zero_never_reads_out(variant):
    with tuning.override("gemm", VARIANTS[variant]):
        C = clnn.asarray(np.full((37, 29), np.nan, np.float32))
        a, b = RNG.standard_normal((37, 11)), RNG.standard_normal((11, 29))
        clnn.gemm(clnn.asarray(a.astype(np.float32)), clnn.asarray(b.astype(np.float32)),
                  out=C, beta=0.0)
        assert np.all(np.isfinite(C.get()))


def test_deterministic():
    a = clnn.asarray(RNG.standard_normal((300, 200)).astype(np.float32))
    b = clnn.asarray(RNG.standard_normal((200, 100)).astype(np.float32))
    first = clnn.gemm(a, b).get()
    for _ in range(3):
        assert clnn.gemm(a, b).get().tobytes() == first.tobytes()


class TestBadInput:
    def test_errors_leave_out_untouched(self):
        out = clnn.asarray(np.ones((4, 5), np.float32))
        a, b = clnn.zeros((4, 3)), clnn.zeros((3, 5))
        bad = [
            (clnn.ShapeError, lambda: clnn.gemm(a, clnn.zeros((4, 5)), out=out)),
            (clnn.ShapeError, lambda: clnn.gemm(a, b, out=clnn.zeros((5, 4)))),
            (clnn.ShapeError, lambda: clnn.gemm(clnn.zeros(3), b)),
            (clnn.ShapeError, lambda: clnn.gemm(a, b, out=out, bias=clnn.zeros(4))),
            (clnn.ShapeError, lambda: clnn.gemm(a, b, out=out, bias=clnn.zeros((4, 5)))),
            (clnn.ShapeError, lambda: clnn.gemm(a, b, out=out, bias=clnn.zeros((1, 4)))),
            (clnn.ShapeError, lambda: clnn.gemm(clnn.zeros((2, 4, 3)), clnn.zeros((3, 3, 5)))),
            (clnn.ShapeError, lambda: clnn.gemm(clnn.zeros((4, 6))[:, ::2], b, out=out)),
            (clnn.ArgumentError, lambda: clnn.gemm(a, b, beta=1.0)),
            (clnn.ArgumentError, lambda: clnn.gemm(a, b, out=out, alpha=float("nan"))),
            (clnn.ArgumentError, lambda: clnn.gemm(a, b, out=out, activation="gelu")),
            (clnn.ArgumentError, lambda: clnn.gemm(np.zeros((4, 3)), b, out=out)),
        ]
        if clnn.device().facts.fp64:
            bad.append((clnn.DTypeError,
                        lambda: clnn.gemm(a, clnn.zeros((3, 5), np.float64), out=out)))
        for err, call in bad:
            with pytest.raises(err):
                call()
            assert np.all(out.get() == 1)

    def test_out_overlapping_an_input_is_refused(self):
        big = clnn.asarray(np.ones((6, 6), np.float32))
        with pytest.raises(clnn.ShapeError, match="overlaps"):
            clnn.gemm(big[0:3, 0:3], big[0:3, 0:3], out=big[2:5, 2:5])
        assert np.all(big.get() == 1)

    def test_invalid_override_is_refused(self):
        with tuning.override("gemm", {"variant": "local", "MWG": 64, "NWG": 64, "KWG": 16,
                                      "MDIMC": 64, "NDIMC": 64}):
            dev = clnn.device()
            if 64 * 64 > dev.facts.max_work_group_size:
                with pytest.raises(clnn.ArgumentError, match="work-group"):
                    clnn.gemm(clnn.zeros((4, 3)), clnn.zeros((3, 5)))


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("trans", [False, True], ids=["N", "T"])
# (1100, 1000) is big enough that A^T takes the GEMM path on CPUs
@pytest.mark.parametrize("mk", [(1, 1), (7, 300), (513, 97), (1100, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gemv(dtype, trans, mk, kernels):
    M, K = mk
    a = RNG.standard_normal((K, M) if trans else (M, K)).astype(dtype)
    x = RNG.standard_normal(K).astype(dtype)
    y = RNG.standard_normal(M).astype(dtype)
    a_host, a_sl = host_view(a.shape, dtype, fill=a)
    _, A = device_view(a_host, a_sl)
    Y = clnn.asarray(y)
    clnn.gemv(A, clnn.asarray(x), Y, alpha=-1.5, beta=0.5, trans_a=trans)
    op = a.T if trans else a
    ref = -1.5 * (op.astype(np.float64) @ x) + 0.5 * y
    scale = 1.5 * (np.abs(op.astype(np.float64)) @ np.abs(x)) + 0.5 * np.abs(y)
    assert np.all(np.abs(Y.get() - ref) <= error_bound(dtype, K + 1, 4) * scale)
    with pytest.raises(clnn.ShapeError):
        clnn.gemv(A, clnn.zeros(K + 1, dtype), Y, trans_a=trans)


def test_big_tiles_with_gpu_sized_work_groups_on_pocl(tmp_path):
    """PoCL with POCL_MAX_WORK_GROUP_SIZE=256 runs the tile rows that need more local
    memory than the Oclgrind gate's 32 KiB (NVIDIA's 128x128 tiles), which that gate
    cannot run; the rest run there, under the same 256 work-items."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, POCL_MAX_WORK_GROUP_SIZE="256", CLNN_DEVICE="pocl",
               CLNN_BATTERY_ROWS="beyond-32k",
               PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, os.path.join(here, "oclgrind_battery.py"), "gemm"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "checked" in res.stdout


def test_packed_order_reads_the_smaller_operand_again():
    """_panels_first: the packed kernel's blocks of rows walk the panels (B re-read
    per block) where A is the larger operand and at least a quarter of the cache, the
    panels walk the rows (A re-read per panel, from the cache) otherwise."""
    import sys
    gemm_module = sys.modules["clnn.ops.gemm"]
    dev = clnn.device()
    cache = dev.facts.cache_size or gemm_module.PANELS_FIRST_CACHE
    first = gemm_module._panels_first
    assert first(dev, cache // 4, cache // 4)
    assert first(dev, cache, cache // 100)               # tall: 20000 x 256 x 512
    assert not first(dev, cache // 4 - 4, cache // 8)    # A small enough to re-read
    assert not first(dev, cache // 2, cache)             # B larger: a dense forward
    assert not first(dev, 1 << 20, 1 << 20)              # 512^3


def test_bounded_panels_split_batches_and_k(monkeypatch):
    """With a tiny panel budget the CPU variant packs a few batches, or a slice of K, at
    a time; results stay right. A bias and activation epilogue runs in the last slice's
    launch on the whole sum, alpha and beta in the first: sliced in every dtype, 16-bit
    C's slices summed in a float32 workspace (test_16bit_k_slices_round_once)."""
    import sys
    gemm_module = sys.modules["clnn.ops.gemm"]
    monkeypatch.setattr(gemm_module, "PANEL_BYTES", 4096)
    with tuning.override("gemm", VARIANTS["cpu-default"]):
        check_gemm(13, 21, 300, False, True, -1.5, 1.0, np.float32)
        check_gemm(13, 21, 170, True, False, 1.0, 0.0, np.float32, batch=5)
        check_gemm(9, 30, 200, False, False, 1.0, 0.0, np.float32, bias=True, act="tanh")
        monkeypatch.setattr(gemm_module, "DIRECT_FLOPS", 0)      # (23 rows: packed)
        for dtype, act, sliced in ((np.float32, "tanh", True), (np.float64, "relu", True),
                                   (np.float16, "sigmoid", True)):
            with clnn.profile() as prof:
                check_gemm(23, 30, 200, False, False, -1.5, 0.5, dtype, bias=True, act=act)
            packs = [r for r in prof.records if r.entry == "clnn_pack_a"]
            assert (len(packs) > 1) == sliced, (dtype, len(packs))


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("ta,batch", [(False, None), (True, None), (False, 3)])
def test_packed_blocks_of_rows(monkeypatch, dtype, ta, batch):
    """Where A's panels alone would take more than 3/4 of the panel workspace, the CPU
    variant packs blocks of rows at a time: rows of op(A) (transposed or not), of C and
    of a bias by rows, offset as matrices of their own; results stay right."""
    import sys
    gemm_module = sys.modules["clnn.ops.gemm"]
    monkeypatch.setattr(gemm_module, "PANEL_BYTES", 4096)
    monkeypatch.setattr(gemm_module, "DIRECT_FLOPS", 0)
    M, row = 200, VARIANTS["cpu-default"]
    with tuning.override("gemm", row), clnn.profile() as prof:
        check_gemm(M, 8, 300, ta, False, -1.5, 0.5, dtype, batch=batch, bias=(M, 1),
                   act="tanh")
    blocks = [r.global_size[1] for r in prof.records if r.entry == "clnn_pack_a"]
    assert blocks and max(blocks) < -(-M // row["MWI"]), blocks


@pytest.mark.parametrize("dtype", [t for t in float_dtypes() if t in (np.float16, clnn.bfloat16)],
                         ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("act,beta,bias,row", [("tanh", 0.0, True, "cpu-default"),
                                               (None, 0.5, False, "cpu-3x8-vw4"),
                                               ("relu", -1.0, (29, 1), "cpu-scalar")])
def test_16bit_k_slices_round_once(monkeypatch, dtype, act, beta, bias, row):
    """A plain GEMM with 16-bit C whose K is sliced adds the slices up in a float32
    workspace and rounds C once, with the epilogue, in clnn_gemm_splitk: the result is
    within one 16-bit rounding of the float64 value (plus float32's accumulation), a
    bound that partial sums rounded into C between the slices (11 here) break. Rows
    with vectors of 8 and 4 (the last pass's vector form, a partial last vector) and
    of 1 (its form by columns)."""
    import sys
    gemm_module = sys.modules["clnn.ops.gemm"]
    monkeypatch.setattr(gemm_module, "PANEL_BYTES", 4096)
    monkeypatch.setattr(gemm_module, "DIRECT_FLOPS", 0)
    M, N, K = 29, 30, 200
    a = RNG.standard_normal((M, K)).astype(dtype)
    b = RNG.standard_normal((N, K)).astype(dtype)
    c = RNG.standard_normal((M, N)).astype(dtype)
    bv = RNG.standard_normal(bias if isinstance(bias, tuple) else (N,)).astype(dtype) \
        if bias else None
    c_host, c_sl = host_view(c.shape, dtype, 1, 2, fill=c if beta else np.nan)
    c_big, C = device_view(c_host, c_sl)
    with tuning.override("gemm", VARIANTS[row]), clnn.profile() as prof:
        clnn.gemm(clnn.asarray(a), clnn.asarray(b), out=C, beta=beta, trans_b=True,
                  bias=clnn.asarray(bv) if bv is not None else None, activation=act)
        got_big = c_big.get()
    entries = [r.entry for r in prof.records]
    assert entries.count("clnn_pack_a") > 1 and entries.count("clnn_gemm_splitk") == 1
    untouched = np.ones(got_big.shape, bool)
    untouched[c_sl] = False
    assert np.all(got_big[untouched] == CANARY), "a canary around out was overwritten"
    ref, scale = reference(a, b, c, 1.0, beta, False, True, bv)
    if act is not None:
        ref = f_ref(act, ref, 1.0)
    bound = eps(dtype) * np.abs(ref) + error_bound(np.float32, K + 1, 4) * scale + 1e-6
    err = np.abs(got_big[c_sl].astype(np.float64) - ref)
    assert np.all(err <= bound), f"max error {err.max()}, {np.sum(err > bound)} elements over"
