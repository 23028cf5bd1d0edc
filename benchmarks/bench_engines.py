"""Matrix engines: clnn's TF32 and float16 GEMMs (gemm.cl's mma.sync rows, NVIDIA
compute capability 8.0 and up) beside its float32 GEMM, and beside cuBLAS's TF32,
float16 and float32 through PyTorch CUDA on the same GPU, in one run.

    python benchmarks/bench_engines.py [--device gpu] [--sizes 1024,2048,4096,8192] [--each-row]
    python benchmarks/bench_engines.py --device gpu --wgmma-only [--sizes 4096,8192]

--each-row also times every engine row of the table forced, in kernel time, and the
float16 rows once more with ldmatrix (LDSM), and the float16 rows with ldmatrix and the
TF32 rows with tiles filled by cp.async (ASYNC), which only the tuner picks until timed.

The squares are timed NN and NT: on a GPU of compute capability 9.0 the table's WGMMA
rows serve the NT products (both operands K-major).

--wgmma (--wgmma-only: nothing else) checks and times the WGMMA candidates (Hopper's
wgmma.mma_async, tuning.WGMMA_CANDIDATES, compute capability 9.0; built through their
patched PTX, programs.PTX_PATCH_OPTION), of which the table holds the timed winners:
first each kind on a small product with the descriptors' two byte offsets read as
PTX's documentation says and swapped (WGSWAP), to learn which reading the hardware has
(on an H200 the documented one); then, in that reading, every candidate on the
squares, NN and NT (TF32 copies an NN product's B a float at a time), in kernel time.

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
import pyopencl as cl

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
# TF32 truncated (WGMMA rows: wgmma reads the floats' top 19 bits): twice the bound
BOUNDS = dict({f: v[2] for f, v in FORMATS.items()}, tf32t=2.0 ** -9)


def check(name, got, a, b, ta, tb, fmt):
    A = (a.T if ta else a).astype(np.float64)
    B = (b.T if tb else b).astype(np.float64)
    K = A.shape[1]
    rows = slice(0, min(A.shape[0], 256))           # enough rows to catch a wrong tile
    ref = A[rows] @ B
    scale = np.abs(A[rows]) @ np.abs(B)
    out = 2.0 ** -10 if fmt == "float16" else 2.0 ** -23
    bound = (BOUNDS[fmt] + 2 * (K + 2) * 2.0 ** -24) * scale + out * np.abs(ref)
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
                 dict(MWG=128, NWG=128, KWG=16, WM=64, WN=64, ASYNC=3),
                 # the table's first row with its tiles in bands of 8 rows (L2 reuse)
                 dict(MWG=128, NWG=128, KWG=32, WM=64, WN=64, ASYNC=2, GROUPM=8)],
         "tf32": [dict(MWG=128, NWG=128, KWG=16, WM=64, WN=32, ASYNC=2),
                  dict(MWG=128, NWG=128, KWG=16, WM=32, WN=64, ASYNC=2),
                  dict(MWG=128, NWG=64, KWG=16, WM=64, WN=32, ASYNC=3),
                  dict(MWG=64, NWG=128, KWG=16, WM=32, WN=32, ASYNC=3),
                  dict(MWG=128, NWG=128, KWG=8, WM=64, WN=64, ASYNC=3),
                  dict(MWG=128, NWG=128, KWG=8, WM=64, WN=64, ASYNC=4),
                  dict(MWG=128, NWG=128, KWG=16, WM=64, WN=64, GROUPM=8),
                  # the table's first row and its cp.async form without rounding the
                  # operands to TF32 (TF32T: the engine truncates them)
                  dict(MWG=128, NWG=128, KWG=16, WM=64, WN=64, TF32T=True),
                  dict(MWG=128, NWG=128, KWG=16, WM=64, WN=64, ASYNC=2, TF32T=True)]}


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
            # (the table's WGMMA rows, timed here as every other row, NN, and by
            # --wgmma in both layouts: they serve K-major products, NT, only)
            timed = [r for r in rows if r.get("WGMMA")]
            rows = [r for r in rows if not r.get("WGMMA")]
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
            rows += timed
            if n == max(sizes):
                rows += [r for r in extra_rows(dev.facts, kind) if r not in rows]
            for r in rows:
                def run(r=r):
                    with tuning.override("gemm", dict(r, KSPLIT=1)):
                        clnn.gemm(A, B, out=C)
                tile = ("wgmma " if r.get("WGMMA") else "") + \
                    f"{r['MWG']}x{r['NWG']}x{r['KWG']} warps {r['WM']}x{r['WN']}" \
                    + (" ldmatrix" if r.get("LDSM") else "") \
                    + (f" cp.async x{r['ASYNC']}" if r.get("ASYNC") else "") \
                    + (f" bands of {r['GROUPM']}" if r.get("GROUPM") else "") \
                    + (" truncating" if r.get("TF32T") else "")
                # a row that fails (the untimed ones have only run emulated) is reported
                # and left untimed; the other rows are still timed
                try:
                    run()
                    check("clnn", C.get(), a, b, False, False,
                          "float16" if kind == "f16" else "tf32t" if r.get("TF32T")
                          else "tf32")
                except (SystemExit, clnn.ClnnError, cl.Error) as exc:
                    out.append({"shape": f"{n}^3", "row": tile, "format": kind,
                                "error": str(exc)})
                    print(f"{n:5d}^3 {kind:5s} {tile:28s} FAILED: {exc}", flush=True)
                    continue
                tf = 2 * n ** 3 / median_kernel_time(run, dev, repeats) / 1e12
                out.append({"shape": f"{n}^3", "row": tile, "format": kind, "tflops": tf})
                print(f"{n:5d}^3 {kind:5s} {tile:28s} {tf:7.1f}", flush=True)
    return out


def wgmma(dev, sizes, repeats, rng):
    """The WGMMA candidates: which descriptor reading the hardware has, then each row's
    kernel time on the squares, NN and NT."""
    out = []
    print("# WGMMA rows (wgmma.mma_async), kernel time, TFLOP/s")
    for kind, dt, fmt in (("f16", np.float16, "float16"), ("tf32", np.float32, "tf32t")):
        size = np.dtype(dt).itemsize
        M, N, K = 256, 192, 320
        a = rng.standard_normal((M, K), dtype=np.float32).astype(dt)
        b = rng.standard_normal((K, N), dtype=np.float32).astype(dt)
        A, B = clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)
        Bt = clnn.asarray(np.ascontiguousarray(b.T), device=dev)

        def probe(flags, tb):
            row = tuning.wgmma_rows(kind, **flags)[0]
            name = f"{kind} probe {'NT' if tb else 'NN'} {flags}"
            try:
                with tuning.override("gemm", dict(row, KSPLIT=1)):
                    got = clnn.gemm(A, Bt if tb else B, trans_b=tb).get()
                check("clnn", got, a, b, False, False, fmt)
            except (SystemExit, clnn.ClnnError, cl.Error) as exc:
                print(f"{name}: FAILED {exc}", flush=True)
                out.append({"probe": name, "error": str(exc)})
                return False
            print(f"{name}: correct", flush=True)
            out.append({"probe": name, "correct": True})
            return True
        # NT: both tiles K-major (WGSWAP); NN: float16's B transposed by the
        # instruction (WGSWAPT), TF32's copied a float at a time into K-major tiles
        sw = next((v for v in (False, True) if probe({"WGSWAP": v}, True)), None)
        if sw is None:
            continue
        flags = {"WGSWAP": sw}
        if kind == "f16":
            swt = next((v for v in (False, True)
                        if probe({"WGSWAP": sw, "WGSWAPT": v}, False)), None)
            if swt is None:
                continue
            flags["WGSWAPT"] = swt
        elif not probe(flags, False):
            continue
        for n in sizes:
            a = rng.standard_normal((n, n), dtype=np.float32).astype(dt)
            b = rng.standard_normal((n, n), dtype=np.float32).astype(dt)
            A, B = clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)
            C = clnn.empty((n, n), dt, device=dev)
            timed, bands = [], iter((8, 16))
            for r in tuning.wgmma_rows(kind, **flags) + [None, None]:
                if r is None:
                    # the fastest row again with its tiles in bands of 8 and 16 rows
                    plain = [x for x in timed if "GROUPM" not in x[1]]
                    if not plain:
                        break
                    r = dict(max(plain, key=lambda x: x[0])[1], GROUPM=next(bands))
                if tuning.gemm_problems(r, dev.facts, size):
                    continue
                for tb in (False, True):
                    def run(r=r, tb=tb):
                        with tuning.override("gemm", dict(r, KSPLIT=1)):
                            clnn.gemm(A, B, out=C, trans_b=tb)
                    tile = f"{r['MWG']}x{r['NWG']}x{r['KWG']} {r['WM']}x{r['WN']} " \
                        f"x{r['ASYNC']}{' wait 1' if r.get('WGWAIT') else ''}" \
                        f"{' bands ' + str(r['GROUPM']) if r.get('GROUPM') else ''}" \
                        f"{' swizzled' if r.get('WGSWZ') else ''} " \
                        f"{'NT' if tb else 'NN'}"
                    try:
                        run()
                        check("clnn", C.get(), a, b, False, tb, fmt)
                    except (SystemExit, clnn.ClnnError, cl.Error) as exc:
                        out.append({"shape": f"{n}^3", "row": "wgmma " + tile,
                                    "format": kind, "error": str(exc)})
                        print(f"{n:5d}^3 {kind:5s} wgmma {tile:26s} FAILED: {exc}", flush=True)
                        continue
                    tf = 2 * n ** 3 / median_kernel_time(run, dev, repeats) / 1e12
                    timed.append((tf, r))
                    out.append({"shape": f"{n}^3", "row": "wgmma " + tile, "format": kind,
                                "tflops": tf})
                    print(f"{n:5d}^3 {kind:5s} wgmma {tile:26s} {tf:7.1f}", flush=True)
    return out


def main(argv=None):
    p = _common.arg_parser(__doc__)
    p.add_argument("--sizes", default="1024,2048,4096,8192")
    p.add_argument("--each-row", action="store_true",
                   help="also time every engine row forced on the squares (kernel time "
                        "from profiling events, no split-K), as the tuning table's "
                        "speeds were measured")
    p.add_argument("--wgmma", action="store_true",
                   help="also check and time the WGMMA rows (compute capability 9.0)")
    p.add_argument("--wgmma-only", action="store_true", help="only the WGMMA rows")
    args = p.parse_args(argv)
    devs = [d for d in _common.devices(args.device) if tuning.mma_rows(d.facts, "tf32")]
    sizes = [int(n) for n in args.sizes.split(",")]
    if args.wgmma_only:
        devs = [d for d in devs if d.facts.nv_compute_capability == 90]
        if not devs:
            print("no device of compute capability 9.0 for the WGMMA rows")
            return
        rows = wgmma(devs[0], sizes, args.repeats, np.random.default_rng(0))
        path = _common.write_json("bench_engines_wgmma", {
            "device": devs[0].name, "driver": devs[0].facts.driver_version,
            "rows": rows}, args.json)
        print(f"results: {path}")
        return
    if not devs:
        print("no device with matrix-engine rows (mma.sync needs NVIDIA compute "
              "capability 8.0 or newer); nothing to measure")
        return
    dev = devs[0]
    torch = _common.torch_cuda()
    rng = np.random.default_rng(0)
    # the squares NN, and NT (both operands K-major: what the table's WGMMA rows serve)
    shapes = [(f"{n}^3{' NT' if tb else ''}", n, n, n, False, tb)
              for tb in (False, True) for n in sizes]
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
        rows += each_row(dev, sizes, args.repeats, rng)
    if args.wgmma and dev.facts.nv_compute_capability == 90:
        rows += wgmma(dev, sizes, args.repeats, rng)
    path = _common.write_json("bench_engines", {"device": dev.name,
                                                "driver": dev.facts.driver_version,
                                                "rows": rows}, args.json)
    print(f"results: {path}")
    failed = [r for r in rows if "error" in r]
    if failed:
        raise SystemExit(f"{len(failed)} engine rows gave wrong results or failed")


if __name__ == "__main__":
    main()
