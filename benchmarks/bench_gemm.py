"""float32 GEMM: clnn on every OpenCL device beside numpy, PyTorch, CLBlast, tinygrad
(and cuBLAS through PyTorch CUDA, TF32 off, on a machine with an NVIDIA GPU).

    python benchmarks/bench_gemm.py [--device SPEC] [--sizes 512,1024,2048] [--quick]

Shapes: squares, and the dense layer of benchmarks/bench_mlp.py (batch 1000, 2000 in,
5000 out) in its three backprop forms: forward X W^T (NT), input gradient dY W (NN)
and weight gradient dY^T X (TN). Each library's result is checked against numpy before
it is timed. Prints GFLOP/s and the ratio of clnn to each reference; writes JSON to
benchmarks/results/bench_gemm.json.
"""

import os
import subprocess
import sys
import json

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import clnn  # noqa: E402

DENSE = [("dense fwd X.W^T", 1000, 5000, 2000, False, True),
         ("dense dX = dY.W", 1000, 2000, 5000, False, False),
         ("dense dW = dY^T.X", 5000, 2000, 1000, True, False)]


def operands(M, N, K, ta, tb, rng):
    a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
    return a, b


def check(name, got, ref, K):
    got = got[:ref.shape[0]]                  # ref may hold only the first rows
    err = np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30)
    if not err < 1e-5 * max(1, np.sqrt(K)):
        raise SystemExit(f"{name}: result differs from numpy (relative error {err:.2e})")


def bench_clnn(dev, a_h, b_h, ta, tb, ref, K, repeats):
    a, b = clnn.asarray(a_h, device=dev), clnn.asarray(b_h, device=dev)
    out = clnn.gemm(a, b, trans_a=ta, trans_b=tb)
    check(f"clnn on {dev.name}", out.get(), ref, K)
    return _common.median_time(lambda: clnn.gemm(a, b, out=out, trans_a=ta, trans_b=tb),
                               repeats, sync=dev.finish)


def bench_clblast(dev, a_h, b_h, ta, tb, ref, K, repeats):
    gemm = _common.clblast_gemm()
    if gemm is None:
        return None
    a, b = clnn.asarray(a_h, device=dev), clnn.asarray(b_h, device=dev)
    M, N = (a_h.shape[1] if ta else a_h.shape[0]), ref.shape[1]
    c = clnn.empty((M, N), device=dev)

    def run():
        gemm(dev, M, N, K, a, b, c, ta, tb)
    try:
        run()
        dev.finish()
    except Exception as exc:  # noqa: BLE001 - a peer that cannot run is left out
        print(f"(CLBlast did not run on {dev.name}: {exc})")
        return None
    check("CLBlast", c.get(), ref, K)
    return _common.median_time(run, repeats, sync=dev.finish)


def bench_cublas(a_h, b_h, ta, tb, ref, K, repeats):
    torch = _common.torch_cuda()
    if torch is None:
        return None
    a, b = torch.from_numpy(a_h).cuda(), torch.from_numpy(b_h).cuda()
    op = (lambda: (a.T if ta else a) @ (b.T if tb else b))
    check("cuBLAS", op()[:ref.shape[0]].cpu().numpy(), ref, K)
    return _common.cuda_time(torch, op, repeats)


def bench_torch(a_h, b_h, ta, tb, ref, K, repeats):
    torch = _common.torch_or_none()
    if torch is None:
        return None
    a, b = torch.from_numpy(a_h), torch.from_numpy(b_h)
    op = (lambda: (a.T if ta else a) @ (b.T if tb else b))
    check("PyTorch", op().numpy(), ref, K)
    return _common.median_time(op, repeats)


TINYGRAD_SCRIPT = r"""
import json, sys, time, statistics, numpy as np
from tinygrad import Tensor, Device
shapes = json.loads(sys.argv[1]); out = {}
for key, M, N, K, ta, tb, repeats in shapes:
    rng = np.random.default_rng(0)
    a_h = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
    b_h = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
    a, b = Tensor(a_h).realize(), Tensor(b_h).realize()
    f = lambda: ((a.T if ta else a) @ (b.T if tb else b)).realize()
    ref = (a_h.T if ta else a_h).astype(np.float64) @ (b_h.T if tb else b_h)
    got = f().numpy()
    if np.max(np.abs(got - ref)) / np.max(np.abs(ref)) > 1e-4:
        out[key] = None; continue
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter(); f(); Device[Device.DEFAULT].synchronize(); ts.append(time.perf_counter() - t0)
    out[key] = statistics.median(ts)
print("RESULT" + json.dumps(out))
"""


def bench_tinygrad(shapes):
    """tinygrad's OpenCL backend on PoCL, in a subprocess (its own OpenCL loader)."""
    try:
        import tinygrad  # noqa: F401
        import pyopencl
    except ImportError:
        return {}
    import glob
    import tempfile
    env = dict(os.environ, CL="1", DEV="CL")
    # tinygrad loads the system's OpenCL loader; point it at the PoCL that
    # pocl-binary-distribution put beside pyopencl (an ICD file needs an absolute path)
    libs = glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs", "libpocl*.so*"))
    if libs:
        icd = os.path.join(tempfile.mkdtemp(prefix="clnn-bench-"), "pocl.icd")
        with open(icd, "w") as f:
            f.write(libs[0] + "\n")
        env["OCL_ICD_VENDORS"] = icd
    try:
        res = subprocess.run([sys.executable, "-c", TINYGRAD_SCRIPT, json.dumps(shapes)],
                             env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT"):
            return json.loads(line[6:])
    print(f"(tinygrad did not run: {res.stderr.strip().splitlines()[-1:]})")
    return {}


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--sizes", help="square sizes (default 512,1024,2048; with a GPU "
                    "1024,2048,4096,8192)")
    ap.add_argument("--no-dense", action="store_true", help="skip the dense-layer shapes")
    args = ap.parse_args(argv)

    devs = _common.devices(args.device)
    gpu = any(not d.facts.is_cpu for d in devs)
    sizes = args.sizes or ("1024,2048,4096,8192" if gpu else "512,1024,2048")
    shapes = [(f"square n={n}", n, n, n, False, False) for n in map(int, sizes.split(","))]
    if not args.no_dense:
        shapes += DENSE
    tiny = {} if gpu else bench_tinygrad([[s[0], *s[1:], args.repeats] for s in shapes])
    rows = []
    for name, M, N, K, ta, tb in shapes:
        rng = np.random.default_rng(0)
        a_h, b_h = operands(M, N, K, ta, tb, rng)
        # products past 2^34 multiply-adds (4096^3 and up) are checked on their first
        # 64 rows, and the CPU libraries, minutes behind there, are not timed
        big = M * N * K > 1 << 34
        rows_checked = slice(0, 64 if big else M)
        ref = (a_h.T if ta else a_h)[rows_checked].astype(np.float64) @ \
            (b_h.T if tb else b_h)
        flops = 2.0 * M * N * K
        row = {"shape": name, "M": M, "N": N, "K": K, "trans_a": ta, "trans_b": tb,
               "gflops": {}}
        if not big:
            np_op = (lambda: (a_h.T if ta else a_h) @ (b_h.T if tb else b_h))
            check("numpy", np_op(), ref, K)
            row["gflops"]["numpy"] = flops / _common.median_time(np_op, args.repeats) / 1e9
            t = bench_torch(a_h, b_h, ta, tb, ref, K, args.repeats)
            if t:
                row["gflops"]["PyTorch CPU"] = flops / t / 1e9
        if tiny.get(name):
            row["gflops"]["tinygrad (PoCL)"] = flops / tiny[name] / 1e9
        t = bench_cublas(a_h, b_h, ta, tb, ref, K, args.repeats)
        if t:
            row["gflops"]["cuBLAS (PyTorch CUDA)"] = flops / t / 1e9
        for dev in devs:
            row["gflops"][f"clnn ({dev.name})"] = flops / bench_clnn(
                dev, a_h, b_h, ta, tb, ref, K, args.repeats) / 1e9
            t = bench_clblast(dev, a_h, b_h, ta, tb, ref, K, args.repeats)
            if t:
                row["gflops"][f"CLBlast ({dev.name})"] = flops / t / 1e9
        rows.append(row)
        print_row(row, devs)
    path = _common.write_json("bench_gemm", {"rows": rows}, args.json)
    print(f"\nresults: {path}")


def print_row(row, devs):
    g = row["gflops"]
    libs = ", ".join(f"{k} {v:.1f}" for k, v in g.items())
    print(f"{row['shape']:<20} {row['M']}x{row['N']}x{row['K']}: GFLOP/s {libs}")
    for dev in devs:
        mine = g[f"clnn ({dev.name})"]
        ratios = ", ".join(f"{mine / v:.2f}x {k}" for k, v in g.items()
                           if not k.startswith("clnn"))
        print(f"{'':<20} clnn on {dev.name} = {ratios}")


if __name__ == "__main__":
    main()
