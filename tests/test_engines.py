"""The matrix-engine rows (MMA_TABLE, gemm.cl's mma.sync variant) without a GPU: their
constraints, when they are chosen (the device's compute capability, the dtype and the
float32 matmul precision), the planner's choices with an H100's facts, and every
rendered variant through clang's NVPTX target. The kernels themselves run in
tests/ops/test_gemm_mma.py (on PoCL with the engine emulated) and under Oclgrind
(test_oclgrind.py's "engines" battery)."""

import dataclasses
import shutil

import numpy as np
import pytest

import clnn
from clnn import plans, programs, tuner, tuning
from clnn.errors import ArgumentError
from conftest import gate
from test_plans import H100 as H100_NO_CC

H100 = dataclasses.replace(H100_NO_CC, nv_compute_capability=90)
A100 = dataclasses.replace(H100_NO_CC, name="NVIDIA A100-SXM4-40GB", compute_units=108,
                           nv_compute_capability=80)
TURING = dataclasses.replace(H100_NO_CC, name="Tesla T4", nv_compute_capability=75)
# the table's mma.sync rows (compute capability 8.0 and up), and its WGMMA rows (9.0)
ENGINES = [r for r in tuning.MMA_TABLE[("nvidia", "GPU")] if not r.get("WGMMA")]
WGMMA_TABLE = [r for r in tuning.MMA_TABLE[("nvidia", "GPU")] if r.get("WGMMA")]
SIZE = {"tf32": 4, "f16": 2}
CLANG = shutil.which("clang")
# the test device where it has no engines (PoCL; an NVIDIA GPU of compute capability
# 8.0 or newer has them, and the tests below that need a device without say so)
TEST_FACTS = clnn.device().facts
LACKING = () if tuning.mma_rows(TEST_FACTS, "tf32") else (TEST_FACTS,)


def needs_a_device_without_engines():
    if not LACKING:
        pytest.skip(f"{TEST_FACTS.name} has matrix engines: what a device without them "
                    f"does is checked on one (PoCL, CI's device)")


@pytest.fixture
def precision():
    old = tuning._precision["value"]
    yield tuning.set_float32_matmul_precision
    tuning._precision["value"] = old


def test_every_engine_row_fits_the_h100_and_no_other_device():
    for row in ENGINES:
        size = SIZE[row["MMA"]]
        assert tuning.gemm_problems(row, H100, size) == [], row
        assert tuning.gemm_problems(row, A100, size) == [], row
        assert any("compute capability" in p for p in tuning.gemm_problems(row, TURING, size))
        assert any("compute capability" in p
                   for p in tuning.gemm_problems(row, H100_NO_CC, size))
        other = 2 if size == 4 else 4
        assert any("serve" in p for p in tuning.gemm_problems(row, H100, other))
        assert plans.local_bytes(row, size) <= H100.local_mem_size


@pytest.mark.parametrize("change,why", [
    ({"WM": 24}, "multiple of 16"), ({"WN": 12}, "multiple of 16 and WN of 8"),
    ({"MDIMC": 4}, "32 work-items"), ({"KWG": 12}, "KWG must be a multiple"),
    ({"VWM": 2}, "VWM = VWN = 1"), ({"MMA": "bf16"}, "MMA must be one of"),
    ({"WM": None}, "warp blocks"), ({"speed": 20}, "speed"),
    ({"LDSM": True}, "LDSM (ldmatrix) serves float16"), ({"LDSM": 1}, "true or false"),
    ({"ASYNC": 5}, "ASYNC (a cp.async pipeline")])
def test_engine_row_constraints(change, why):
    row = dict(next(r for r in ENGINES if r["MMA"] == "tf32"), **change)
    row = {k: v for k, v in row.items() if v is not None}
    probs = tuning.gemm_problems(row, H100, 4)
    assert any(why in p for p in probs), probs


def test_ldmatrix_rows_fit_and_take_their_local_memory():
    """LDSM rows keep plain halves: rows of k, or rows of m (n) holding k, each padded by
    8 halves; the planner counts the larger layout, and every candidate fits an H100."""
    assert tuning.gemm_problems(LDSM, H100, 2) == []
    assert any("WN a multiple of 16" in p
               for p in tuning.gemm_problems(dict(LDSM, WN=8, MDIMC=32), H100, 2))
    k, m, n = LDSM["KWG"], LDSM["MWG"], LDSM["NWG"]
    assert plans.local_bytes(LDSM, 2) == 4 * (max(k * (m + 8), m * (k + 8)) +
                                              max(k * (n + 8), n * (k + 8)))
    from clnn import tuner
    ldsm = [r for r in tuner.engine_candidates(H100, "f16", False) if r.get("LDSM")]
    assert ldsm and all(plans.local_bytes(r, 2) <= H100.local_mem_size for r in ldsm)
    assert not any(r.get("LDSM") for r in tuner.engine_candidates(H100, "tf32", False))
    # the table's LDSM rows each have their cp.async pipeline and fit an H100; every
    # row of the table is a timed one (tuning.py says where)
    assert all(r.get("ASYNC") and not tuning.gemm_problems(r, H100, 2)
               for r in ENGINES if r.get("LDSM"))
    assert all(r["tuned"] for r in tuning.MMA_TABLE[("nvidia", "GPU")])


# the narrow float16 tile (one warp row of m16 fragments): out of the table, timed
# slower than the 64-row tiles on LeNet-5's steps (tuning.NARROW_F16)
NARROW = tuning.NARROW_F16


@pytest.mark.parametrize("batch", [64, 1024])
def test_narrow_products_take_the_narrow_engine_tile_where_offered(batch):
    """LeNet-5's float16 convolutions: C3's forward (16 filters) and data gradient (6
    channels) as implicit GEMMs of batch * 10^2 columns take the narrow tile where it is
    offered with the table's, C1's weight gradient (6 x 25, K = batch * 784) too, split
    along K; the table alone (which an H200 ran faster) gives them 64-row tiles. Square
    products and a batch of dense rows keep the 64-row tiles or wider, and the row
    WGMMA rows fall back to is the 64x64 tile, not the narrow one."""
    table = tuning.conv_rows(H100, 2, np.float16)
    rows = (NARROW,) + tuple(table)
    for M, N, K in ((16, batch * 100, 150), (6, batch * 196, 400), (6, 25, batch * 784)):
        plan = plans.best(H100, rows, M, N, K, itemsize=2)
        assert plan.params == NARROW, (M, N, K, plan.params)
        assert plans.best(H100, table, M, N, K, itemsize=2).params["MWG"] >= 64
    assert plans.best(H100, rows, 6, 25, batch * 784, itemsize=2).splits > 1
    dense = (NARROW,) + tuple(tuning.gemm_rows(H100, 2, np.float16))
    for M, N, K in ((4096, 4096, 4096), (1024, 1024, 1024), (batch * 32, 1000, 1000),
                    (256, 256, 256), (batch, 120, 400), (33, 300, 75)):
        plan = plans.best(H100, dense, M, N, K, itemsize=2)
        assert plan.params.get("MMA") == "f16" and plan.params["MWG"] >= 64, (M, N, K)
    assert tuning.wgmma_fallback(tuning.wgmma_rows("f16")[0])["MWG"] == 64


def test_a_narrow_tile_serves_narrow_products_only():
    """The narrow row's MAXM (32) keeps it from the products the model would also give
    it on an estimated speed (256^3, a dense layer at batch 64: more work-groups); a
    row set whose every row has a MAXM below M is costed whole."""
    assert NARROW["MAXM"] == 32 and tuning.gemm_problems(NARROW, H100, 2) == []
    assert any("MAXM" in p for p in tuning.gemm_problems(dict(NARROW, MAXM=0), H100, 2))
    free = dict(NARROW)
    del free["MAXM"]
    rows = [NARROW] + list(tuning.gemm_rows(H100, 2, np.float16))
    for M, N, K in ((256, 256, 256), (64, 120, 400)):
        with_free = [free if r is NARROW else r for r in rows]
        assert plans.best(H100, with_free, M, N, K, itemsize=2).params == free
        assert plans.best(H100, rows, M, N, K, itemsize=2).params["MWG"] >= 64
    for M in (1, 16, 32):
        assert plans.best(H100, rows, M, 1 << 16, 400, itemsize=2).params == NARROW
    assert plans.best(H100, [NARROW], 64, 1 << 16, 400, itemsize=2).params == NARROW


@pytest.mark.parametrize("stages,ok", [(2, True), (3, True), (4, True), (1, False),
                                       (5, False), (True, False), (2.0, False),
                                       ("3", False)])
def test_cp_async_rows_take_a_buffer_per_stage(stages, ok):
    """ASYNC rows (cp.async into a pipeline of 2 to 4 tiles) are float16 LDSM rows or
    TF32 rows with a local buffer per stage (TF32 tiles as LDSM keeps halves: rows of
    k padded by 8 floats or rows of m (n) holding k padded by 4, the larger counted);
    the tuner searches those that fit; the table has float16 ones, measured."""
    tf32 = ENGINES[2]
    k, m, n = tf32["KWG"], tf32["MWG"], tf32["NWG"]
    for row, size, per_stage in (
            (LDSM, 2, plans.local_bytes(LDSM, 2) // 2),
            (tf32, 4, 4 * (max(k * (m + 8), m * (k + 4)) + max(k * (n + 8), n * (k + 4))))):
        probs = tuning.gemm_problems(dict(row, ASYNC=stages), H100, size)
        assert (probs == []) == ok, probs
        if ok:
            assert plans.local_bytes(dict(row, ASYNC=stages), size) == stages * per_stage
    assert any("float16 rows with LDSM" in p
               for p in tuning.gemm_problems(dict(ENGINES[5], ASYNC=3), H100, 2))
    from clnn import tuner
    for kind, size in SIZE.items():
        for quick, counts in ((True, {2, 3}), (False, {2, 3, 4})):
            found = [r for r in tuner.engine_candidates(H100, kind, quick) if "ASYNC" in r]
            assert {r["ASYNC"] for r in found} == counts
            assert all(bool(r.get("LDSM")) == (kind == "f16") and
                       plans.local_bytes(r, size) <= H100.local_mem_size for r in found)
    assert {r["MMA"] for r in ENGINES if "ASYNC" in r} == {"f16"}
    plain = {"variant": "local", "MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 8, "NDIMC": 8}
    for extra in ({"LDSM": True}, {"ASYNC": 3}):
        assert any("serve matrix-engine rows" in p
                   for p in tuning.gemm_problems(dict(plain, **extra), H100, 4))


def test_the_precision_switch(precision, monkeypatch):
    tuning._precision["value"] = None
    monkeypatch.delenv(tuning.PRECISION_ENV, raising=False)
    assert clnn.get_float32_matmul_precision() == "highest"      # PyTorch's default
    for p in ("high", "medium", "highest"):
        clnn.set_float32_matmul_precision(p)
        assert clnn.get_float32_matmul_precision() == p
    for bad in ("low", "HIGH", None, 1):
        with pytest.raises(ArgumentError, match="highest"):
            clnn.set_float32_matmul_precision(bad)
    assert clnn.get_float32_matmul_precision() == "highest"     # unchanged by a refusal
    tuning._precision["value"] = None
    monkeypatch.setenv(tuning.PRECISION_ENV, "High")
    assert clnn.get_float32_matmul_precision() == "high"
    tuning._precision["value"] = None
    monkeypatch.setenv(tuning.PRECISION_ENV, "fast")
    with pytest.warns(RuntimeWarning, match="CLNN_FLOAT32_MATMUL_PRECISION"):
        assert clnn.get_float32_matmul_precision() == "highest"


def test_engines_are_chosen_only_where_allowed(precision):
    precision("highest")
    assert tuning.mma_kind(H100, np.float32) == "none"
    assert tuning.mma_kind(H100, np.float16) == "f16"       # float16 always may
    assert tuning.mma_kind(H100, clnn.bfloat16) == "f16"    # the 16-bit rows, .bf16
    assert tuning.gemm_rows(H100, 2, clnn.bfloat16)[0]["MMA"] == "f16"
    assert tuning.mma_kind(H100, np.float64) == "none"
    assert not any("MMA" in r for r in tuning.gemm_rows(H100, 4, np.float32))
    f16 = tuning.gemm_rows(H100, 2, np.float16)
    assert f16[0]["MMA"] == "f16" and {r.get("MMA") for r in f16} == {"f16", None}
    precision("high")
    assert tuning.mma_kind(H100, np.float32) == "tf32"
    rows = tuning.gemm_rows(H100, 4, np.float32, "NN-square-large")
    assert rows[0]["MMA"] == "tf32"
    assert rows is tuning.gemm_rows(H100, 4, np.float32, "NN-square-large")  # one tuple
    assert not any("MMA" in r for r in tuning.gemm_rows(H100, 8, np.float64))
    conv = tuning.conv_rows(H100, 4, np.float32, "conv-wgrad-large")
    assert conv[0]["MMA"] == "tf32"
    assert tuning.conv_vendor_rows(H100, 4)[0] in conv
    for facts in (TURING, H100_NO_CC) + LACKING:
        assert tuning.mma_kind(facts, np.float16) == "none"
        assert not any("MMA" in r for r in tuning.gemm_rows(facts, 4, np.float32))
    with tuning.override("gemm", tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")][0]):
        assert "MMA" not in tuning.gemm_rows(H100, 4, np.float32)[0]    # overrides rule


def test_emulated_rows_run_anywhere():
    row = dict(ENGINES[2], EMULATE=True)            # the 64x64 TF32 tile
    assert tuning.gemm_problems(row, H100_NO_CC, 4) == []
    assert tuning.gemm_problems(row, TURING, 4) == []
    assert plans.local_bytes(row) > plans.local_bytes(ENGINES[2])   # the exchange
    # on any device whose local memory holds the tiles and the emulation's exchange
    assert tuning.gemm_problems(row, TEST_FACTS, 4) == []
    assert any("EMULATE" in p for p in tuning.gemm_problems(dict(row, EMULATE=1), H100, 4))
    assert "clnn_mma_dot" not in programs.render("gemm", dict(
        next(engine_variants()).values[0], tuning=tuning.template_tuning(ENGINES[0])))
    src = programs.render("gemm", dict(next(engine_variants()).values[0],
                                       tuning=tuning.template_tuning(row)))
    assert not inline_asm(src) and "clnn_mma_dot" in src


def test_engine_rows_are_never_forced_where_they_cannot_run():
    needs_a_device_without_engines()
    dev = clnn.device()
    row = ENGINES[0]
    with tuning.override("gemm", row), pytest.raises(ArgumentError, match="compute capab"):
        clnn.gemm(clnn.asarray(np.ones((4, 4), np.float32)),
                  clnn.asarray(np.ones((4, 4), np.float32)))
    assert tuning.mma_rows(dev.facts, "tf32") == ()


@pytest.mark.parametrize("n", [2048, 4096, 8192])
def test_big_products_plan_on_the_engines(precision, n):
    precision("high")
    rows = tuning.gemm_rows(H100, 4, np.float32)
    plan = plans.best(H100, rows, n, n, n)
    assert plan.params.get("MMA") == "tf32" and plan.splits == 1
    assert (plan.params["MWG"], plan.params["NWG"]) == (128, 128)
    assert plan.local_size == (128, 1, 1)
    plan = plans.best(H100, tuning.gemm_rows(H100, 2, np.float16), n, n, n, itemsize=2)
    assert plan.params.get("MMA") == "f16"


def test_a_ten_column_product_keeps_a_tile_that_fits(precision):
    """A classifier's 10 outputs: the float32 skinny tiles waste less than any engine
    tile of 32 or more columns, and the planner weighs that."""
    precision("high")
    rows = tuning.gemm_rows(H100, 4, np.float32)
    plan = plans.best(H100, rows, 1000, 10, 1000)
    assert plan.params["NWG"] <= 64


# a float16 row with ldmatrix (LDSM), which the tuner searches but the table lacks, and
# the same filled by cp.async (ASYNC)
LDSM = dict(ENGINES[5], LDSM=True)
ASYNC = dict(LDSM, ASYNC=3)
ASYNC_TF32 = dict(ENGINES[2], ASYNC=3)
# the same without rounding its operands to TF32 (TF32T: the engine truncates them)
TF32T = dict(ASYNC_TF32, TF32T=True)


X86_F16C = "#if defined(CLNN_POCL) && defined(__x86_64__) && defined(__F16C__)"


def inline_asm(source):
    """Whether ``source`` has inline assembly besides _half.cl's F16C conversions (the
    block under X86_F16C, which only PoCL on x86 with F16C compiles): PTX."""
    head, sep, rest = source.partition(X86_F16C)
    if sep:
        assert "\n#else\n" in rest, "the F16C block ends in an #else"
        source = head + rest.split("\n#else\n", 1)[1]
    return "__asm__" in source


def test_inline_asm_sees_ptx_past_the_f16c_block():
    float16 = programs.render("gemm", {"dtype": "float16"})
    assert X86_F16C in float16 and "__asm__" in float16 and not inline_asm(float16)
    assert inline_asm(float16 + '\nvoid f(void) { __asm__("mma.sync"); }\n')
    assert not inline_asm(programs.render("gemm", {"dtype": "float32"}))


def engine_variants(emulate=False):
    """Every engine row with each loader, transpose and vector width; the 16-bit rows
    in float16, and in bfloat16 with two of them (the same kernel but for the
    conversions and the instruction's operand type)."""
    cases = (("none", False, False, 4, False), ("none", True, True, 4, True),
             ("none", False, True, 1, False), ("none", True, False, 2, False),
             ("fwd", False, False, 1, False), ("dgrad", False, False, 1, True),
             ("wgrad", False, False, 1, True))
    # cp.async rows: copies of 16, 8 and 4 bytes, and their row's register loads where
    # an operand allows no copy (halves one at a time, a convolution's gathered operand)
    copies = {"f16": (("none", False, False, 8, False), ("none", True, True, 8, True),
                      ("none", False, True, 4, False), ("none", True, False, 2, False),
                      ("none", False, False, 1, False), ("dgrad", False, False, 1, True)),
              "tf32": (("none", False, False, 4, False), ("none", True, True, 4, True),
                       ("none", False, True, 2, False), ("none", True, False, 1, False),
                       ("fwd", False, False, 1, False), ("wgrad", False, False, 1, True))}
    for i, row in enumerate(ENGINES + [LDSM, ASYNC, ASYNC_TF32, TF32T]):
        row = dict(row, EMULATE=True) if emulate else row
        mine = copies[row["MMA"]] if "ASYNC" in row else cases
        runs = [("float32", mine)] if row["MMA"] == "tf32" else \
            [("float16", mine), ("bfloat16", mine[1:2] + mine[5:6])]
        for dtype, conv, ta, tb, vec, partial in ((d,) + c for d, cs in runs for c in cs):
            params = {"dtype": dtype, "variant": "local", "trans_a": ta, "trans_b": tb,
                      "act": "relu", "bias": "row" if conv != "none" else "col",
                      "conv": conv, "vec": vec, "vec_c": False, "partial": partial,
                      "tuning": tuning.template_tuning(row, dtype)}
            yield pytest.param(params, id=f"{row['MMA']}-{i}-{conv}-{int(ta)}{int(tb)}-v{vec}"
                               f"{'-partial' if partial else ''}"
                               f"{'-ldsm' if row.get('LDSM') else ''}"
                               f"{'-async' if row.get('ASYNC') else ''}"
                               f"{'-bf16' if dtype == 'bfloat16' else ''}")


def nvptx_check(source):
    """clang's NVPTX target on a rendered engine kernel: OpenCL C 1.2, no fp16
    extension, no warnings."""
    from test_kernels_clang import clang_check
    res = clang_check(source, "float32", target="nvptx64-nvidia-cuda")
    assert res.returncode == 0, res.stderr + programs.numbered(source)


@gate("clang", CLANG is not None)
@pytest.mark.parametrize("params", list(engine_variants()))
def test_engine_kernels_compile_for_nvptx(params):
    """clang's NVPTX target takes the inline PTX's operands (SPIR has no such registers);
    the kernel otherwise as strict as the SPIR gate: OpenCL C 1.2, no fp16 extension,
    no warnings."""
    source = programs.render("gemm", params)
    assert "mma.sync.aligned" in source
    operands = {"float32": ".tf32.tf32.", "float16": ".f16.f16.",
                "bfloat16": ".bf16.bf16."}[params["dtype"]]
    assert f"row.col.f32{operands}f32" in source
    tiles = dict(params["tuning"])
    assert ("ldmatrix.sync.aligned" in source) == ("LDSM" in tiles)
    item = 4 if params["dtype"] == "float32" else 2
    assert ("cp.async.wait_group" in source) == \
        ("ASYNC" in tiles and params["conv"] == "none" and params["vec"] * item >= 4)
    nvptx_check(source)


@gate("clang", CLANG is not None)
@pytest.mark.parametrize("params", list(engine_variants(emulate=True))[::3])
def test_emulated_engine_kernels_are_portable_opencl_c(params):
    """The emulated engine is plain OpenCL C 1.2 (no PTX): the SPIR gate's checks."""
    portable_check(params)


def portable_check(params, stem="gemm"):
    """An emulated engine kernel rendered: no PTX, and the SPIR gate's checks, with and
    without the CPU defines."""
    from test_kernels_clang import clang_check
    source = programs.render(stem, params)
    assert not inline_asm(source)
    for defines in ((), ("CLNN_CPU",)):
        res = clang_check(source, params["dtype"], defines=defines)
        assert res.returncode == 0, res.stderr + programs.numbered(source)


def convt_engine_variants(emulate=False):
    """convt.cl's engine variant (conv.convt_params): 8 and 16 filters along n, each
    engine kind in each dtype it serves, with and without a fused activation."""
    from clnn.ops import conv
    for kind, dtypes in (("f16", ("float16", "bfloat16")), ("tf32", ("float32",))):
        for dtype in dtypes:
            for mb, act in ((8, "none"), (16, "relu")):
                eng = {"MMA": kind, "EMULATE": emulate}
                yield pytest.param(conv.convt_params(dtype, act, (mb, 1, eng)),
                                   id=f"{kind}-{dtype}-{mb}-{act}")


@gate("clang", CLANG is not None)
@pytest.mark.parametrize("params", list(convt_engine_variants()))
def test_direct_tiles_on_the_engines_compile_for_nvptx(params):
    """convt.cl's engine variant as strict as gemm.cl's engine rows (clang's NVPTX
    target: OpenCL C 1.2, no fp16 extension, no warnings), the instruction's operand
    types the dtype's."""
    source = programs.render("convt", params)
    operands = {"float32": "m16n8k8.row.col.f32.tf32.tf32.",
                "float16": "m16n8k16.row.col.f32.f16.f16.",
                "bfloat16": "m16n8k16.row.col.f32.bf16.bf16."}[params["dtype"]]
    assert f"mma.sync.aligned.{operands}f32" in source
    nvptx_check(source)


@gate("clang", CLANG is not None)
@pytest.mark.parametrize("params", list(convt_engine_variants(emulate=True)))
def test_direct_tiles_emulated_are_portable_opencl_c(params):
    """Emulated, convt.cl's engine variant is plain OpenCL C 1.2: the SPIR gate's
    checks, with and without the CPU defines."""
    portable_check(params, "convt")


def test_device_facts_read_the_compute_capability():
    dev = clnn.device()
    facts = dev.facts
    # PoCL has no cl_nv_device_attribute_query: 0; NVIDIA's driver reports major, minor
    if "cl_nv_device_attribute_query" in dev.context.devices[0].extensions:
        assert facts.nv_compute_capability >= 10
    else:
        assert facts.nv_compute_capability == 0
    assert "nv_compute_capability" in facts.as_dict()


# ---------------------------------------------------------------- tuning engine rows

def test_the_tuner_searches_engine_rows_where_the_device_has_them():
    from clnn import tuner
    assert tuner.device_formats(H100) == ["float32", "tf32", "float16"]
    assert tuner.device_formats(A100) == ["float32", "tf32", "float16"]
    # bfloat16 runs float16's rows: tuned where they are, when asked
    assert tuner.device_formats(H100, requested=True) == ["float32", "tf32", "float16",
                                                          "bfloat16"]
    for facts in (TURING, H100_NO_CC) + LACKING:
        assert tuner.device_formats(facts) == ["float32"]
        assert tuner.device_formats(facts, requested=True) == ["float32"]
    for kind, size in SIZE.items():
        quick = tuner.engine_candidates(H100, kind, True)
        full = tuner.engine_candidates(H100, kind, False)
        assert quick and len(full) > len(quick)
        assert all(r in full and r["MMA"] == kind for r in quick)
        for row in full:
            assert tuning.gemm_problems(row, H100, size) == [], row
        # the shipped rows are among the candidates: tuning can only match or beat them
        for row in ENGINES:
            if row["MMA"] == kind:
                # (less what only the planner reads: speed, MAXM)
                assert {k: v for k, v in row.items()
                        if k not in ("speed", "tuned", "MAXM")} in quick
        assert tuner.engine_candidates(TURING, kind, False) == []
        # a unit with less local memory gets only the tiles that fit it
        small = dataclasses.replace(A100, local_mem_size=32 << 10)
        assert all(plans.local_bytes(r, size) <= 32 << 10
                   for r in tuner.engine_candidates(small, kind, False))


@pytest.fixture
def db(tmp_path, monkeypatch):
    from test_tuning import write_db
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("CLNN_TUNING_DB", str(path))
    yield lambda entries: write_db(path, entries)
    tuning._db_cache["mtime"] = None


def test_tuned_engine_rows_serve_their_format_only(db, precision):
    """A TF32 winner is filed under "tf32" and serves float32 products only while TF32
    is allowed; an exact-float32 winner never serves a TF32 product; float16 winners
    serve float16; an entry under an engine key that is not that engine's row is not
    taken."""
    tf32 = dict(ENGINES[1], KWG=8)
    f16 = dict(ENGINES[4], KWG=16)
    f32 = tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")][3]
    db({tuning.db_key(H100, "tf32", "NN-square-large"): {"params": tf32},
        tuning.db_key(H100, "tf32", "conv-wgrad-large"): {"params": tf32},
        tuning.db_key(H100, "tf32", "NT-wide-small"): {"params": f32},
        tuning.db_key(H100, "float32", "NT-wide-large"): {"params": f32},
        tuning.db_key(H100, "float16", "NN-square-large"): {"params": f16}})
    precision("highest")
    assert "MMA" not in tuning.gemm_params(H100, 4, "float32", "NN-square-large")
    assert tuning.gemm_params(H100, 4, "float32", "NT-wide-large") == f32
    assert tuning.gemm_params(H100, 2, "float16", "NN-square-large") == f16
    precision("high")
    assert tuning.gemm_rows(H100, 4, "float32", "NN-square-large") == [tf32]
    assert tuning.conv_rows(H100, 4, "float32", "conv-wgrad-large") == [tf32]
    engines_and_table = tuning.gemm_rows(H100, 4, "float32", "NN-square-medium")
    # (an NT class's entry is a format's exact-float32 row: not taken; its engines
    # begin with the K-major WGMMA row)
    k_major = tuning.gemm_rows(H100, 4, "float32", "NT-wide-small")
    assert tuning.gemm_rows(H100, 4, "float32", "NT-wide-large") is k_major
    assert k_major[1:] == engines_and_table and k_major[0]["WGMMA"] and \
        k_major[0]["MMA"] == "tf32"
    assert tuning.gemm_rows(H100, 2, "float16", "NN-square-large") == [f16]
    assert tuning.gemm_rows(A100, 4, "float32", "NN-square-large")[0] == ENGINES[0]


def test_bfloat16_takes_float16_winners_until_it_has_its_own(db):
    """bfloat16 runs the float16 rows (another operand type in the same mma.sync), and
    is tuned only when asked: a class without a bfloat16 entry takes float16's winner,
    a bfloat16 entry comes first, and a float16 entry that is no engine row is not
    taken."""
    f16 = dict(ENGINES[4], KWG=16)
    bf16 = dict(ENGINES[4], KWG=32)
    f32 = tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")][3]
    table = tuning.gemm_rows(H100, 2, "bfloat16", "NT-wide-large")
    db({tuning.db_key(H100, "float16", "NN-square-large"): {"params": f16},
        tuning.db_key(H100, "float16", "NN-square-small"): {"params": f16},
        tuning.db_key(H100, "bfloat16", "NN-square-small"): {"params": bf16},
        tuning.db_key(H100, "float16", "NT-wide-large"): {"params": f32},
        tuning.db_key(H100, "float16", "conv-fwd-large"): {"params": f16}})
    assert tuning.gemm_params(H100, 2, clnn.bfloat16, "NN-square-large") == f16
    assert tuning.gemm_params(H100, 2, clnn.bfloat16, "NN-square-small") == bf16
    assert tuning.gemm_params(H100, 2, "float16", "NN-square-small") == f16
    assert tuning.gemm_rows(H100, 2, "bfloat16", "NT-wide-large") == table
    assert tuning.conv_rows(H100, 2, clnn.bfloat16, "conv-fwd-large") == [f16]
    # only bfloat16 borrows: float32 under TF32 never takes a float16 winner
    assert tuning.gemm_rows(H100, 4, "float32", "NN-square-large")[0] != f16


def test_tuning_a_format_the_device_lacks_is_refused():
    from clnn import tuner
    lacks = (("tf32", "no tf32 matrix engines"),
             ("bfloat16", "no bfloat16 matrix engines")) if LACKING else ()
    for fmt, why in lacks + (("int8", "unknown format"),):
        with pytest.raises(ArgumentError, match=why):
            tuner.tune(("gemm",), quick=True, progress=False, save=False,
                       log=lambda *a: None, formats=[fmt])


def test_the_tuner_times_engine_rows_in_their_format(monkeypatch, db, precision):
    """On PoCL the engine is emulated: the search runs a TF32 candidate at "high"
    against TF32-exact operands (checked against their float64 product), files the
    class as "tf32/...", and stores a winner only under the "tf32" key."""
    from clnn import tuner
    dev = clnn.device()
    row = dict(ENGINES[2], EMULATE=True)             # the 64x64 TF32 tile
    monkeypatch.setattr(tuner, "device_formats",
                        lambda f, requested=False: ["float32", "tf32"])
    monkeypatch.setattr(tuner, "engine_candidates", lambda f, k, q: [row])
    monkeypatch.setattr(tuner, "GEMM_CLASSES",
                        {"NN-square": {"small": ((40, 72, 24), (40, 72, 24))}})
    seen = []
    real = tuner._check_and_time

    def spy(run, read, ref, dev, repeats, tol=1e-4):
        seen.append((tuning.get_float32_matmul_precision(), tol,
                     tuning.forced("gemm") is not None))
        return real(run, read, ref, dev, repeats, tol)
    monkeypatch.setattr(tuner, "_check_and_time", spy)
    precision("highest")
    results = tuner.tune(("gemm",), quick=True, progress=False, log=lambda *a: None,
                         formats=["tf32"])
    assert list(results) == ["tf32/NN-square-small"]
    best, gflops, table_gflops = results["tf32/NN-square-small"]
    assert best == row and gflops > 0 and table_gflops > 0     # both passed the check
    assert {p for p, _, _ in seen} == {"high"} and any(f for _, _, f in seen)
    assert tuning.get_float32_matmul_precision() == "highest"  # put back
    stored = tuning.load_db()
    assert tuning.db_key(dev.facts, "float32", "NN-square-small") not in stored
    if gflops > table_gflops:
        assert stored[tuning.db_key(dev.facts, "tf32", "NN-square-small")]["params"] == row
    else:
        assert not stored


def test_the_tuner_times_bfloat16_engine_rows_under_their_own_key(monkeypatch, db,
                                                                  precision):
    """Asked for bfloat16, the search runs float16's engine rows (emulated on PoCL) on
    bfloat16 operands at bfloat16's tolerance, files the class as "bfloat16/...", and
    stores a winner under "bfloat16", never under "float16"."""
    from clnn import tuner
    dev = clnn.device()
    row = dict(next(r for r in ENGINES if r["MMA"] == "f16" and r["MWG"] == 64),
               EMULATE=True)
    row = {k: v for k, v in row.items() if k not in ("speed", "tuned")}
    monkeypatch.setattr(tuner, "device_formats",
                        lambda f, requested=False: ["float32"] + (["bfloat16"] if requested
                                                                  else []))
    monkeypatch.setattr(tuner, "engine_candidates", lambda f, k, q: [row] if k == "f16"
                        else [])
    monkeypatch.setattr(tuner, "GEMM_CLASSES",
                        {"NN-square": {"small": ((40, 72, 24), (40, 72, 24))}})
    seen = []
    real = tuner._check_and_time

    def spy(run, read, ref, dev, repeats, tol=1e-4):
        seen.append(tol)
        return real(run, read, ref, dev, repeats, tol)
    monkeypatch.setattr(tuner, "_check_and_time", spy)
    precision("highest")
    # the default formats leave bfloat16 out
    assert tuner.tune(("gemm",), quick=True, progress=False, save=False,
                      log=lambda *a: None, formats=None).keys() == {"NN-square-small"}
    seen.clear()
    results = tuner.tune(("gemm",), quick=True, progress=False, log=lambda *a: None,
                         formats=["bfloat16"])
    assert list(results) == ["bfloat16/NN-square-small"]
    best, gflops, table_gflops = results["bfloat16/NN-square-small"]
    assert best == row and gflops > 0 and table_gflops > 0     # both passed the check
    assert set(seen) == {tuner._TOLERANCE["bfloat16"]}
    stored = tuning.load_db()
    assert tuning.db_key(dev.facts, "float16", "NN-square-small") not in stored
    if gflops > table_gflops:
        assert stored[tuning.db_key(dev.facts, "bfloat16", "NN-square-small")]["params"] \
            == row
    else:
        assert not stored


@pytest.mark.parametrize("change,why", [
    ({"WM": 32}, "WM a multiple of 64"), ({"WN": 264}, "out of range"),
    ({"MDIMC": 4}, "128 work-items (a warpgroup)"), ({"LDSM": True}, "not by ldmatrix"),
    ({"ASYNC": None}, "cp.async pipeline (ASYNC)"), ({"WGMMA": 1}, "true or false"),
    ({"WGSWAP": "yes"}, "true or false"), ({"TF32T": True}, "TF32T (operands truncated"),
    ({"WGSWZ": True, "KWG": 48}, "WGSWZ (swizzled K-major tiles)")])
def test_wgmma_row_constraints(change, why):
    row = dict(tuning.wgmma_rows("f16")[0], **change)
    row = {k: v for k, v in row.items() if v is not None}
    probs = tuning.gemm_problems(row, H100, 2)
    assert any(why in p for p in probs), probs


def test_wgmma_rows_fit_an_h100_only():
    """The candidates fit an H100's 48 KiB unpadded (stages x KWG x (MWG + NWG)
    elements) and need compute capability 9.0 exactly unless emulated (an A100 has no
    wgmma, and sm_90a's instructions do not run on later GPUs). The table holds the
    timed ones: one per kind, a candidate in bands of 16 tile rows, for K-major
    products only; the tuner's search none."""
    for kind, size in (("f16", 2), ("tf32", 4)):
        a100 = dataclasses.replace(H100, nv_compute_capability=80)
        blackwell = dataclasses.replace(H100, nv_compute_capability=100)
        for row in tuning.wgmma_rows(kind):
            assert tuning.gemm_problems(row, H100, size) == []
            assert plans.local_bytes(row, size) == \
                row["ASYNC"] * row["KWG"] * (row["MWG"] + row["NWG"]) * size <= 49152
            for other in (a100, blackwell):
                assert any("compute capability 9.0" in p
                           for p in tuning.gemm_problems(row, other, size))
                assert tuning.gemm_problems(dict(row, EMULATE=True), other, size) == []
        assert not any(r.get("WGMMA") for r in tuner.engine_candidates(H100, kind, False))
        timed = [r for r in WGMMA_TABLE if r["MMA"] == kind]
        assert len(timed) == 1 and timed[0]["tuned"] and timed[0]["KMAJOR"]
        candidate = {k: v for k, v in timed[0].items()
                     if k not in ("GROUPM", "KMAJOR", "speed", "tuned")}
        assert candidate in tuning.wgmma_rows(kind)
        assert [r for r in tuning.mma_rows(H100, kind) if r.get("WGMMA")] == timed
        assert not any(r.get("WGMMA") for r in tuning.mma_rows(a100, kind) +
                       tuning.mma_rows(blackwell, kind))
    assert any("WGSWAP, WGSWAPT, WGWAIT and WGSWZ serve WGMMA" in p for p in
               tuning.gemm_problems(dict(ENGINES[0], WGSWAP=True), H100, 4))


def wgmma_variants():
    """Each WGMMA candidate in every transpose (float16 and bfloat16: K-major or
    transposed tiles; TF32 K-major, copied a float at a time where stored along m or
    n), with its widest copies, as a GEMM and as a split-K slice."""
    for kind, dtypes, vec in (("f16", ("float16", "bfloat16"), 8), ("tf32", ("float32",), 4)):
        for i, row in enumerate(tuning.wgmma_rows(kind)):
            for dtype in dtypes[:1] if i else dtypes:
                for ta, tb in ((False, False), (True, True), (False, True), (True, False)):
                    params = {"dtype": dtype, "variant": "local", "trans_a": ta,
                              "trans_b": tb, "act": "relu", "bias": "col", "conv": "none",
                              "vec": vec, "vec_c": False, "partial": ta and not tb,
                              "tuning": tuning.template_tuning(row, dtype)}
                    yield pytest.param(params, id=f"{kind}-{i}-{dtype}-{int(ta)}{int(tb)}")


@gate("clang", CLANG is not None)
@pytest.mark.parametrize("params", list(wgmma_variants()))
def test_wgmma_kernels_compile_for_nvptx(params):
    """The WGMMA rows as strict as the other engine rows (OpenCL C 1.2, no warnings),
    and, emulated, plain portable OpenCL C: the SPIR gate's checks."""
    source = programs.render("gemm", params)
    assert "wgmma.mma_async.sync.aligned" in source and "mma.sync.aligned" not in \
        source.replace("wgmma.mma_async.sync.aligned", "")
    nvptx_check(source)
    portable_check(dict(params, tuning=tuning.template_tuning(
        dict(dict(params["tuning"]), variant="local", EMULATE=True), params["dtype"])))


def test_wgmma_rows_build_through_their_patched_ptx_on_nvidia(monkeypatch):
    """NVIDIA's compiler builds for plain sm_90, where wgmma does not exist, even with
    -cl-nv-arch sm_90a: a WGMMA row on a device that reports its compute capability is
    built with programs.PTX_PATCH_OPTION (then again from its patched PTX); elsewhere,
    and for every other row, plainly, and a build error stands."""
    import importlib
    import types
    from clnn.errors import KernelBuildError
    G = importlib.import_module("clnn.ops.gemm")
    calls = []

    def fake(dev, stem, entry, prm, options=()):
        calls.append(tuple(options))
        if not options:
            raise KernelBuildError("wgmma.mma_async not supported on .target 'sm_90'")
        return "built"
    monkeypatch.setattr(programs, "get_kernel", fake)

    def device(cc=0, pocl=False):
        return types.SimpleNamespace(facts=types.SimpleNamespace(
            is_pocl=pocl, nv_compute_capability=cc))
    nv = device(90)
    row = tuning.wgmma_rows("f16")[0]
    assert G._tiled_kernel(nv, row, {}, "clnn_gemm_tiled") == "built"
    assert calls == [(programs.PTX_PATCH_OPTION,)]
    for dev, r in ((device(), row), (device(86), row), (nv, ENGINES[0]),
                   (nv, dict(row, EMULATE=True))):
        calls.clear()
        with pytest.raises(KernelBuildError):
            G._tiled_kernel(dev, r, {}, "clnn_gemm_tiled")
        assert calls == [()]
    # (an emulated row on PoCL builds unoptimised: its build, not its run, is the cost)
    calls.clear()
    assert G._tiled_kernel(device(pocl=True), dict(row, EMULATE=True), {},
                           "clnn_gemm_tiled") == "built"
    assert calls == [G.EMULATED_OPTIONS]


def test_k_major_products_take_the_wgmma_rows(precision):
    """With an H100's facts (compute capability 9.0): a large float16 or TF32 product
    whose A and B are both stored along k (NT: a dense layer's forward pass) is planned
    on the timed WGMMA row; the same product NN, TN or TT, a convolution, a small
    product, exact float32 and an A100 on mma.sync rows or the float32 table."""
    precision("high")
    for dt, size, kind in ((np.float16, 2, "f16"), (np.float32, 4, "tf32")):
        wg = next(r for r in WGMMA_TABLE if r["MMA"] == kind)
        for M, N, K in ((8192, 8192, 8192), (2048, 2048, 2048), (1000, 5000, 2000)):
            for ta, tb in ((False, True), (False, False), (True, False), (True, True)):
                klass = tuning.shape_class(M, N, K, ta, tb)
                p = plans.best(H100, tuning.gemm_rows(H100, size, dt, klass), M, N, K,
                               itemsize=size).params
                assert (p == wg) == (not ta and tb), (kind, M, N, K, ta, tb, p)
                assert p["MMA"] == kind
            p = plans.best(A100, tuning.gemm_rows(A100, size, dt, "NT-square-large"),
                           M, N, K, itemsize=size).params
            assert p["MMA"] == kind and not p.get("WGMMA")
        for conv in ("fwd", "wgrad"):
            rows = tuning.conv_rows(H100, size, dt, f"conv-{conv}-large")
            assert not any(r.get("WGMMA") for r in rows)
        small = plans.best(H100, tuning.gemm_rows(H100, size, dt, "NT-wide-small"),
                           64, 120, 400, itemsize=size).params
        assert not small.get("WGMMA")
    precision("highest")
    p = plans.best(H100, tuning.gemm_rows(H100, 4, np.float32, "NT-square-large"), 8192,
                   8192, 8192).params
    assert "MMA" not in p
