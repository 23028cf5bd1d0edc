"""Matrix engines: clnn's TF32 and float16 GEMMs (gemm.cl's mma.sync rows, NVIDIA
compute capability 8.0 and up) beside its float32 GEMM, and beside cuBLAS's TF32,
float16 and float32 through PyTorch CUDA on the same GPU, in one run.

    python benchmarks/bench_engines.py [--device gpu] [--sizes 1024,2048,4096,8192] [--each-row]

--each-row also times every engine row of the table forced, in kernel time, and the
float16 rows once more with ldmatrix (LDSM), and the float16 rows with ldmatrix and the
TF32 rows with tiles filled by cp.async (ASYNC), which only the tuner picks until timed.

TF32 is what clnn.set_float32_matmul_precision("high") turns on, float16 what a float16
GEMM takes. Each product is checked first against numpy's float64 product of the same
operands, with the format's bound (TF32: operands rounded to 10 mantissa bits; float16:
the result's rounding; both plus float32 sums). Times are wall-clock medians with a
synchronisation after every call (what a user waits for), on both sides. Without a
device that has engines (the first found, or --device) it says so and exits. Writes
benchmarks/results/bench_engines.json.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import clnn  # noqa: E402
from clnn import tuning  # noqa: E402
from clnn.tuner import median_kernel_time  # noqa: E402

DENSE = [("dense fwd X.W^T", 1000, 5000, 2000, False, True),
         ("dense dX = dY.W", 1000, 2000, 5000, False, False),
         ("dense dW = dY^T.X", 5000, 2000, 1000, True, False)]
FORMATS = {"float32": (np.float32, "highest", 0.0), "tf32": (np.float32, "high", 2.0 ** -10),
           "float16": (np.float16, "highest", 0.0)}


def check(name, got, a, b, ta, tb, fmt):
    A = (a.T if ta else a).astype(np.float64)
    B = (b.T if tb else b).astype(np.float64)
    K = A.shape[1]
    rows = slice(0, min(A.shape[0], 256))           # enough rows to catch a wrong tile
    ref = A[rows] @ B
    scale = np.abs(A[rows]) @ np.abs(B)
    out = 2.0 ** -10 if fmt == "float16" else 2.0 ** -23
    bound = (FORMATS[fmt][2] + 2 * (K + 2) * 2.0 ** -24) * scale + out * np.abs(ref)
    err = np.abs(np.asarray(got[rows], np.float64) - ref)
    if not np.all(err <= bound):
        raise SystemExit(f"{name} {fmt}: result differs from numpy's float64 product "
                         f"(max error/bound {np.max(err / (bound + 1e-30)):.3g})")


# more cp.async rows the tuner searches, timed at the largest size only (--each-row):
# more warps per tile, deeper pipelines where 48 KiB allow (not in the table)
EXTRA = {"f16": [dict(MWG=128, NWG=128, KWG=32, WM=64, WN=32, ASYNC=2),
                 dict(MWG=64, NWG=128, KWG=32, WM=32, WN=64, ASYNC=3),
                 dict(MWG=128, NWG=64, KWG=32, WM=64, WN=32, ASYNC=3),
                 dict(MWG=64, NWG=128, KWG=32, WM=32, WN=32, ASYNC=3),
                 dict(MWG=128, NWG=128, KWG=16, WM=64, WN=32, ASYNC=3),
                 dict(MWG=128, NWG=128, KWG=16, WM=64, WN=64, ASYNC=3)],
         "tf32": [dict(MWG=128, NWG=128, KWG=16, WM=64, WN=32, ASYNC=2),
                  dict(MWG=128, NWG=128, KWG=16, WM=32, WN=64, ASYNC=2),
                  dict(MWG=128, NWG=64, KWG=16, WM=64, WN=32, ASYNC=3),
                  dict(MWG=64, NWG=128, KWG=16, WM=32, WN=32, ASYNC=3),
                  dict(MWG=128, NWG=128, KWG=8, WM=64, WN=64, ASYNC=3),
                  dict(MWG=128, NWG=128, KWG=8, WM=64, WN=64, ASYNC=4)]}


def extra_rows(facts, kind):
    size = tuning.MMA_KINDS[kind][1]
    for e in EXTRA[kind]:
        warps = (e["MWG"] // e["WM"]) * (e["NWG"] // e["WN"])
        row = dict({"variant": "local", "MMA": kind, "MDIMC": 2 * warps, "NDIMC": 16},
                   **e, **({"LDSM": True} if kind == "f16" else {}))
        if not tuning.gemm_problems(row, facts, size):
            yield row


def each_row(dev, sizes, repeats, rng):
    out = []
    print("# each engine row forced (kernel time), TFLOP/s")
    for n in sizes:
        for kind, dt in (("tf32", np.float32), ("f16", np.float16)):
            a = rng.standard_normal((n, n), dtype=np.float32).astype(dt)
            b = rng.standard_normal((n, n), dtype=np.float32).astype(dt)
            A, B = clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)
            C = clnn.empty((n, n), dt, device=dev)
            rows = list(tuning.mma_rows(dev.facts, kind))
            # the float16 rows again with ldmatrix (LDSM); those and the TF32 rows again
            # with tiles filled by cp.async, 3 stages or, where 3 do not fit, 2 (ASYNC):
            # not yet timed, not in the table
            size = 4 if kind == "tf32" else 2
            base = [dict(r, LDSM=True) for r in rows] if kind == "f16" else rows
            more = [r for r in base if kind == "f16"]
            for r in base:
                fits = [dict(r, ASYNC=n) for n in (3, 2)
                        if not tuning.gemm_problems(dict(r, ASYNC=n), dev.facts, size)]
                more += fits[:1]
            rows += [r for r in more if not tuning.gemm_problems(r, dev.facts, size)]
            if n == max(sizes):
                rows += [r for r in extra_rows(dev.facts, kind) if r not in rows]
            for r in rows:
                def run(r=r):
                    with tuning.override("gemm", dict(r, KSPLIT=1)):
                        clnn.gemm(A, B, out=C)
                tile = f"{r['MWG']}x{r['NWG']}x{r['KWG']} warps {r['WM']}x{r['WN']}" \
                    + (" ldmatrix" if r.get("LDSM") else "") \
                    + (f" cp.async x{r['ASYNC']}" if r.get("ASYNC") else "")
                # a row that fails (the untimed ones have only run emulated) is reported
                # and left untimed; the other rows are still timed
                try:
                    run()
                    check("clnn", C.get(), a, b, False, False,
                          "tf32" if kind == "tf32" else "float16")
                except (SystemExit, clnn.ClnnError) as exc:
                    out.append({"shape": f"{n}^3", "row": tile, "format": kind,
                                "error": str(exc)})
                    print(f"{n:5d}^3 {kind:5s} {tile:28s} FAILED: {exc}", flush=True)
                    continue
                tf = 2 * n ** 3 / median_kernel_time(run, dev, repeats) / 1e12
                out.append({"shape": f"{n}^3", "row": tile, "format": kind, "tflops": tf})
                print(f"{n:5d}^3 {kind:5s} {tile:28s} {tf:7.1f}", flush=True)
    return out


def main(argv=None):
    p = _common.arg_parser(__doc__)
    p.add_argument("--sizes", default="1024,2048,4096,8192")
    p.add_argument("--each-row", action="store_true",
                   help="also time every engine row forced on the squares (kernel time "
                        "from profiling events, no split-K), as the tuning table's "
                        "speeds were measured")
    args = p.parse_args(argv)
    devs = [d for d in _common.devices(args.device) if tuning.mma_rows(d.facts, "tf32")]
    if not devs:
        print("no device with matrix-engine rows (mma.sync needs NVIDIA compute "
              "capability 8.0 or newer); nothing to measure")
        return
    dev = devs[0]
    torch = _common.torch_cuda()
    rng = np.random.default_rng(0)
    shapes = [(f"{n}^3", n, n, n, False, False) for n in map(int, args.sizes.split(","))]
    rows = []
    old = tuning.get_float32_matmul_precision()
    print(f"# {dev.name}, {dev.facts.driver_version}; TFLOP/s (wall-clock medians)")
    print(f"{'shape':20s} " + " ".join(f"{'clnn ' + f:>13s} {'cuBLAS ' + f:>15s}"
                                       for f in FORMATS) + "  tf32/cuBLAS f16/cuBLAS")
    try:
        for name, M, N, K, ta, tb in shapes + DENSE:
            a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
            b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
            row = {"shape": name, "M": M, "N": N, "K": K}
            for fmt, (dt, prec, _) in FORMATS.items():
                tuning.set_float32_matmul_precision(prec)
                ah, bh = a.astype(dt), b.astype(dt)
                A, B = clnn.asarray(ah, device=dev), clnn.asarray(bh, device=dev)
                out = clnn.gemm(A, B, trans_a=ta, trans_b=tb)
                check("clnn", out.get(), ah, bh, ta, tb, fmt)
                t = _common.median_time(
                    lambda: clnn.gemm(A, B, out=out, trans_a=ta, trans_b=tb),
                    args.repeats, sync=dev.finish)
                row[f"clnn {fmt}"] = 2 * M * N * K / t / 1e12
                if torch is not None:
                    torch.backends.cuda.matmul.allow_tf32 = fmt == "tf32"
                    ta_, tb_ = torch.from_numpy(ah).cuda(), torch.from_numpy(bh).cuda()
                    op = (lambda: (ta_.T if ta else ta_) @ (tb_.T if tb else tb_))
                    check("cuBLAS", op()[:256].float().cpu().numpy(), ah, bh, ta, tb, fmt)
                    row[f"cuBLAS {fmt}"] = 2 * M * N * K / _common.cuda_time(
                        torch, op, args.repeats) / 1e12
                    torch.backends.cuda.matmul.allow_tf32 = False
            rows.append(row)
            cells = " ".join(f"{row.get('clnn ' + f, 0):13.1f} {row.get('cuBLAS ' + f, 0):15.1f}"
                             for f in FORMATS)
            ratios = "  ".join(f"{row['clnn ' + f] / row['cuBLAS ' + f]:10.2f}"
                               if row.get("cuBLAS " + f) else f"{'-':>10s}"
                               for f in ("tf32", "float16"))
            print(f"{name:20s} {cells}  {ratios}", flush=True)
    finally:
        tuning.set_float32_matmul_precision(old)
    if args.each_row:
        rows += each_row(dev, [n for _, n, _, _, _, _ in shapes], args.repeats, rng)
    path = _common.write_json("bench_engines", {"device": dev.name,
                                                "driver": dev.facts.driver_version,
                                                "rows": rows}, args.json)
    print(f"results: {path}")
    failed = [r for r in rows if "error" in r]
    if failed:
        raise SystemExit(f"{len(failed)} engine rows gave wrong results or failed")


if __name__ == "__main__":
    main()
