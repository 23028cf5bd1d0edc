"""The GPU rows assembled for an H100 without one (clnn/ptx.py: clang's NVPTX target with
libclc's built-ins, then NVIDIA's ptxas for sm_90).

The matrix-engine rows' inline PTX (mma.sync, ldmatrix) is text clang never reads: a
wrong operand, type or state space would otherwise first show on a GPU. Every engine
variant the NVPTX syntax gate renders (tests/test_engines.py) assembles here, and each
kernel's local memory, as ptxas counts it, is what the planner budgets for its row
(plans.local_bytes), so a row the planner thinks fits 48 KiB does."""

import pytest

from clnn import plans, programs, ptx, tuning
from conftest import gate
from test_engines import convt_engine_variants, engine_variants, wgmma_variants
from test_plans import H100

TOOLS = all(t is not None for t in ptx.tools())
needs_ptxas = gate("ptxas", TOOLS, missing="missing: " + ptx.missing())


def _row_of(params):
    t = dict(params["tuning"])
    return dict(t, variant="local")


@needs_ptxas
@pytest.mark.parametrize("params", list(engine_variants()))
def test_engine_kernels_assemble_for_sm_90(params):
    source = programs.render("gemm", params)
    try:
        res = ptx.assemble(source)
    except ptx.PTXError as e:
        pytest.fail(f"{e}\n" + programs.numbered(source))
    tiled = res["clnn_gemm_tiled"]
    row = _row_of(params)
    size = 4 if row["MMA"] == "tf32" else 2
    budget = plans.local_bytes(row, size)
    assert tiled.local_bytes <= H100.local_mem_size
    if row.get("LDSM") or row.get("ASYNC"):
        # the planner takes the larger of an operand's two layouts (it does not know
        # the transposes), and a cp.async row's stages (a convolution's loads through
        # registers take two buffers): never less than the kernel declares
        assert tiled.local_bytes <= budget
    else:
        assert tiled.local_bytes == budget, (tiled, budget)
    assert tiled.registers <= 255


def _gpu_gemm_rows():
    rows = tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")]
    conv = tuning.CONV_TABLE["vendor"][("nvidia", "GPU")]
    for kind, table in (("gemm", rows), ("conv", conv)):
        for i, row in enumerate(table):
            yield pytest.param(kind, row, id=f"{kind}-{i}-{row['MWG']}x{row['NWG']}")


@needs_ptxas
@pytest.mark.parametrize("kind,row", list(_gpu_gemm_rows()))
def test_nvidia_float32_rows_assemble_and_fit(kind, row):
    """NVIDIA's float32 tile rows, as GEMMs and as forward convolutions: ptxas's local
    memory is the planner's (at most), and within the H100's 48 KiB where the planner
    keeps the row."""
    params = {"dtype": "float32", "variant": "local", "trans_a": False, "trans_b": True,
              "act": "relu", "bias": "col" if kind == "gemm" else "row",
              "conv": "none" if kind == "gemm" else "fwd", "vec": 4, "vec_c": False,
              "partial": False, "tuning": tuning.template_tuning(row, "float32")}
    if kind == "conv":
        params.update(trans_b=False, vec=1)
    res = ptx.assemble(programs.render("gemm", params))
    tiled = res["clnn_gemm_tiled"]
    budget = plans.local_bytes(row, 4)
    if kind == "gemm":
        assert tiled.local_bytes == budget, (tiled, row)
    else:
        # a gathered operand's rows need no padding against transposing stores: the
        # planner, which does not know the loader, budgets the padded rows
        assert budget - 1024 <= tiled.local_bytes <= budget, (tiled, row)
    assert (tiled.local_bytes <= H100.local_mem_size) == \
        (not tuning.gemm_problems(row, H100, 4))


@needs_ptxas
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_direct_convolution_tiles_assemble_without_spills(dtype):
    """convt.cl (the GPU path's layers of up to 16 filters): its MB sums stay in
    registers at every width, and its local memory is the 16 KiB conv.py plans for."""
    import sys
    conv = sys.modules["clnn.ops.conv"]
    for mb in conv._CONVT_MB:
        res = ptx.assemble(programs.render("convt", dict(conv._CONVT, dtype=dtype,
                                                         act="relu", MB=mb)))
        r = res["clnn_convt_forward"]
        assert r.spill_bytes == 0 and r.stack_bytes == 0 and r.registers <= 64, (mb, r)
        assert r.local_bytes == (conv._CONVT["LW"] + conv._CONVT["LP"]) * 4


@needs_ptxas
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_direct_weight_gradient_assembles_without_spills(dtype):
    """convw.cl (the GPU path's weight gradients of up to 16 filters): UPT x S sums in
    registers at every width it is planned for, and the 32 KiB of local memory conv.py
    plans for."""
    import sys
    conv = sys.modules["clnn.ops.conv"]
    for upt in conv._CONVW_UPT:
        for s in (1, 5, 8):
            res = ptx.assemble(programs.render("convw", {"dtype": dtype, "S": s, "UPT": upt,
                                                         "T": 256, "LM": 8192}))
            r = res["clnn_convw_partial"]
            assert r.spill_bytes == 0 and r.stack_bytes == 0 and r.registers <= 64, \
                (upt, s, r)
            assert r.local_bytes == conv._CONVW["BYTES"]


@needs_ptxas
@pytest.mark.parametrize("params", list(convt_engine_variants()))
def test_direct_tiles_on_the_engines_assemble_without_spills(params):
    """convt.cl's engine variant: the fragments and accumulators (2 x MB / 8 tiles of 4
    floats) stay in registers, and its local memory is what conv.tile_direct plans."""
    import sys
    conv = sys.modules["clnn.ops.conv"]
    r = ptx.assemble(programs.render("convt", params))["clnn_convt_forward"]
    assert r.spill_bytes == 0 and r.stack_bytes == 0 and r.registers <= 96, (params, r)
    kp, item = params["KP"], 4 if params["MMA"] == "tf32" else 2
    ws = 8 if params["MB"] == 8 else 24
    assert r.local_bytes == conv._CONVT["LP"] * item + kp * ws * item + kp * 4, r


def test_ptxas_reports_are_read_per_kernel():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'clnn_gemm_splitk' for 'sm_90'
ptxas info    : Function properties for clnn_gemm_splitk
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 28 registers, used 0 barriers
ptxas info    : Compiling entry function 'clnn_gemm_tiled' for 'sm_90'
ptxas info    : Function properties for clnn_gemm_tiled
    56 bytes stack frame, 52 bytes spill stores, 52 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 56 bytes cumulative stack size, 34816 bytes smem
"""
    got = ptx.parse(log)
    assert got["clnn_gemm_splitk"] == ptx.Resources(28, 0, 0, 0)
    assert got["clnn_gemm_tiled"] == ptx.Resources(255, 52, 34816, 56)


@needs_ptxas
def test_a_bad_ptx_operand_fails_the_check():
    """The gate can fail: an mma.sync given one B register too few."""
    params = next(iter(engine_variants())).values[0]
    source = programs.render("gemm", params)
    bad = source.replace("{%8,%9}", "{%8}", 1)
    assert bad != source
    with pytest.raises(ptx.PTXError) as e:
        ptx.assemble(bad)
    assert e.value.stage == "ptxas"



@needs_ptxas
@pytest.mark.parametrize("params", list(wgmma_variants()))
def test_wgmma_kernels_assemble_for_sm_90a(params):
    """The WGMMA rows (wgmma.mma_async through descriptors, fence.proxy.async, the
    wgmma fences and waits: PTX 8.0 for sm_90a) assemble, within 48 KiB and 255
    registers, and with the instructions the row asks for; rows of 64 accumulators a
    work-item without spills (clang's PTX spills some of the 128-accumulator TF32 rows,
    whose float-at-a-time copies need addresses too; NVIDIA's own compiler, which the
    driver runs, allocated fewer registers than clang for every row measured so far)."""
    source = programs.render("gemm", params)
    row = _row_of(params)
    shape = f"m64n{row['WN']}k{16 if row['MMA'] == 'f16' else 8}"
    assert f"wgmma.mma_async.sync.aligned.{shape}" in source
    try:
        res = ptx.assemble(source)
    except ptx.PTXError as e:
        pytest.fail(f"{e}\n" + programs.numbered(source))
    tiled = res["clnn_gemm_tiled"]
    size = 4 if row["MMA"] == "tf32" else 2
    assert tiled.local_bytes == plans.local_bytes(row, size) <= H100.local_mem_size
    assert tiled.registers <= 255, tiled
    if row["WN"] * (row["WM"] // 64) // 2 <= 64:
        assert tiled.spill_bytes == 0, tiled


def _patch_params():
    """One WGMMA row of each kind and storage, NN and NT (the transposes' copies differ)."""
    seen = set()
    for p in wgmma_variants():
        params = p.values[0]
        key = (params["dtype"], params["trans_b"])
        if not params["trans_a"] and key not in seen:
            seen.add(key)
            yield pytest.param(params, id=p.id)


@needs_ptxas
@pytest.mark.parametrize("params", list(_patch_params()))
def test_wgmma_rows_assemble_as_nvidias_compiler_builds_them(params):
    """As clnn builds a WGMMA row on NVIDIA's OpenCL (programs.PTX_PATCH_OPTION): with
    its wgmma instructions written as comments the kernel assembles for plain sm_90,
    which the same kernel unmarked does not; uncommented by programs.patch_ptx it
    assembles for sm_90a with the resources of the kernel built for sm_90a directly
    (the same instructions, operands and registers)."""
    source = programs.render("gemm", params)
    patched = ptx.assemble(source, patched=True)["clnn_gemm_tiled"]
    assert patched == ptx.assemble(source)["clnn_gemm_tiled"]
    text = source.replace("#ifdef CLNN_PTX_PATCH", "#if 0")      # unmarked, for sm_90
    with pytest.raises(ptx.PTXError, match="wgmma"):
        ptx.assemble(text, patched=True)


def test_patch_ptx_uncomments_the_marks_and_raises_target_and_version():
    mark = programs.PTX_MARK
    text = ("//\n.version 7.8\n.target sm_90, texmode_independent\n.address_size 64\n"
            f"\t{mark}wgmma.fence.sync.aligned;\n{mark}wgmma.commit_group.sync.aligned;\n"
            "\tmov.u32 %r1, %r2; // sm_90 in a comment\n")
    out = programs.patch_ptx(text, "sm_90a")
    assert out.splitlines() == [
        "//", ".version 8.0", ".target sm_90a, texmode_independent", ".address_size 64",
        "\twgmma.fence.sync.aligned;", "wgmma.commit_group.sync.aligned;",
        "\tmov.u32 %r1, %r2; // sm_90 in a comment"]
    newer = programs.patch_ptx(text.replace("7.8", "8.7"), "sm_100a")
    assert ".version 8.7\n.target sm_100a, texmode_independent" in newer    # never lowered
    with pytest.raises(ValueError, match="marked"):
        programs.patch_ptx(text.replace(mark, ""), "sm_90a")
    with pytest.raises(ValueError, match="target"):
        programs.patch_ptx(text.replace(".target", ".targets"), "sm_90a")
