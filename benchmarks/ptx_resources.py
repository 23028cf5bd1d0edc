"""Registers, spills and local memory of NVIDIA's GEMM and matrix-engine rows, from
ptxas, without a GPU.

    python benchmarks/ptx_resources.py [--arch sm_90] [--json FILE]
    python benchmarks/ptx_resources.py --device gpu     # NVIDIA's own OpenCL compiler

With --device naming an NVIDIA GPU, each row is built instead by the driver's OpenCL
compiler with -cl-nv-verbose (cl_nv_compiler_options), whose ptxas report gives the
registers and spills the kernels really run with.

Each row of GEMM_TABLE's and CONV_TABLE's NVIDIA entries (float32, as a GEMM X·Wᵀ and
as a forward convolution), of MMA_TABLE (TF32, float16; the float16 rows also with
ldmatrix) and the WGMMA candidates (tuning.WGMMA_CANDIDATES, for sm_90a) is rendered,
compiled by clang's NVPTX target with libclc's built-ins and assembled by ptxas
(clnn/ptx.py). Registers and spills are a proxy for what NVIDIA's
OpenCL compiler does, which writes its own PTX (on an H100 the engine rows used 125
to 167 registers there, none spilling); compare rows with each other, and before with
after a change of the template, not with the driver's numbers. The local memory is
exact. No timing: a row's speed needs a GPU (benchmarks/bench_gemm.py,
bench_engines.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import pyopencl as cl  # noqa: E402

from clnn import plans, programs, ptx, tuning  # noqa: E402


def rows():
    """(table, label, dtype, gemm.cl parameters)"""
    def params(row, dtype, conv="none", trans_b=True, vec=4):
        return {"dtype": dtype, "variant": "local", "trans_a": False, "trans_b": trans_b,
                "act": "none", "bias": "none", "conv": conv, "vec": vec, "vec_c": False,
                "partial": False, "tuning": tuning.template_tuning(row, dtype)}

    def label(row):
        extra = "".join(f" {k}={row[k]}" for k in ("WM", "WN", "LDSM", "ASYNC", "WGWAIT", "WGSWZ")
                        if k in row)
        return (f"{row['MWG']}x{row['NWG']}x{row['KWG']} {row['MDIMC']}x{row['NDIMC']}"
                f"{extra}")
    for row in tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")]:
        yield "GEMM_TABLE", label(row), row, params(row, "float32")
    for row in tuning.CONV_TABLE["vendor"][("nvidia", "GPU")]:
        yield "CONV_TABLE (fwd)", label(row), row, params(row, "float32", "fwd", False, 1)
    for row in tuning.MMA_TABLE[("nvidia", "GPU")]:
        dtype = "float32" if row["MMA"] == "tf32" else "float16"
        yield f"MMA_TABLE {row['MMA']}", label(row), row, params(row, dtype)
        base = row
        if row["MMA"] == "f16" and row["WN"] % 16 == 0:
            base = dict(row, LDSM=True)
            yield "MMA_TABLE f16 (LDSM)", label(base), base, params(base, dtype)
        if row["MMA"] == "tf32" or base.get("LDSM"):
            # tiles filled by cp.async (16-byte copies: operands aligned to 16 bytes),
            # the stage counts that fit an H100's 48 KiB
            size = 4 if dtype == "float32" else 2
            for stages in (2, 3, 4):
                cp = dict(base, ASYNC=stages)
                if not tuning.gemm_problems(cp, None, size) and \
                        plans.local_bytes(cp, size) <= 48 << 10:
                    yield (f"MMA_TABLE {row['MMA']} (ASYNC)", label(cp), cp,
                           params(cp, dtype, vec=16 // size))
    # Hopper's wgmma rows (untimed candidates, sm_90a), both tiles K-major
    for kind, dtype in (("f16", "float16"), ("tf32", "float32")):
        size = 4 if dtype == "float32" else 2
        for row in tuning.wgmma_rows(kind):
            yield f"WGMMA {kind}", label(row), row, params(row, dtype, vec=16 // size)


def driver_resources(dev, source, patched=False):
    """{entry: Resources} from the NVIDIA OpenCL compiler's -cl-nv-verbose build log;
    ``patched``: built as clnn builds a WGMMA row there (programs.PTX_PATCH_OPTION),
    the resources of the second build, from the patched PTX."""
    import warnings

    verbose = ["-cl-nv-verbose"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prg = cl.Program(dev.context, source).build(
            options=list(programs.BUILD_OPTIONS) + verbose +
            ([programs.PTX_PATCH_OPTION] if patched else []))
        if patched:
            prg = programs.rebuild_patched(dev, prg, verbose)
    return ptx.parse(prg.get_build_info(dev.context.devices[0], cl.program_build_info.LOG))


def main():
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--arch", default=ptx.ARCH, help="ptxas -arch (default sm_90)")
    args = ap.parse_args()
    dev = None
    if args.device:
        dev = _common.devices(args.device)[0]
        if "cl_nv_compiler_options" not in dev.context.devices[0].extensions:
            sys.exit(f"{dev.name} has no cl_nv_compiler_options (-cl-nv-verbose)")
        print(f"# {dev.name}, driver {dev.facts.driver_version}: its own compiler")
    elif None in ptx.tools():
        sys.exit("missing " + ptx.missing())
    else:
        print(f"# clang {ptx.tools()[0]}, libclc {ptx.tools()[1]}, ptxas {ptx.tools()[2]}, "
              f"-arch={args.arch}")
    print(f"{'table':24} {'row':36} {'regs':>5} {'spill B':>8} {'local B':>8} "
          f"{'planned':>8}")
    out = []
    for table, label, row, prm in rows():
        size = 2 if prm["dtype"] == "float16" else 4
        try:
            source = programs.render("gemm", prm)
            # a WGMMA row as clnn builds it on NVIDIA's compiler (ops/gemm.py,
            # WGMMA_OPTIONS): through its patched PTX
            patched = bool(row.get("WGMMA"))
            res = (driver_resources(dev, source, patched) if dev else
                   ptx.assemble(source, arch=args.arch, patched=patched))["clnn_gemm_tiled"]
        except (ptx.PTXError, cl.Error, RuntimeError, KeyError, ValueError) as e:
            # (pyopencl's build failure is a cl.Error, not a RuntimeError)
            print(f"{table:24} {label:36} {getattr(e, 'stage', 'build')} failed")
            out.append({"table": table, "row": row, "error": str(getattr(e, 'log', e))})
            continue
        planned = plans.local_bytes(row, size)
        print(f"{table:24} {label:36} {res.registers:5d} {res.spill_bytes:8d} "
              f"{res.local_bytes:8d} {planned:8d}")
        out.append({"table": table, "row": row, "registers": res.registers,
                    "spill_bytes": res.spill_bytes, "local_bytes": res.local_bytes,
                    "planned_local_bytes": planned})
    where = {"driver": dev.facts.driver_version, "device": dev.name} if dev else \
        {"arch": args.arch}
    print("results:", _common.write_json("ptx_resources", dict(where, rows=out), args.json))


if __name__ == "__main__":
    main()
