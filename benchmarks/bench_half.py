"""float16 storage against float32: GEMM, and a training step of the MLP and LeNet-5 in
mixed precision (clnn/nn/amp.py) against the same step in float32, on every device.

    python benchmarks/bench_half.py [--device SPEC] [--repeats 5] [--sizes 512,1024]

Each float16 GEMM is checked first against numpy's float64 product of the same float16
operands (bound: one half rounding plus float32 accumulation); each float16 training
step against the float32 one from the same weights (loss to 1%). Then the two are timed
alternately (warm-up, repeats, medians) and the ratio printed: float16 time over
float32 time is below 1 where moving half the bytes pays. Writes
benchmarks/results/bench_half.json.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import clnn  # noqa: E402
from clnn import nn, optim  # noqa: E402

DENSE = [("dense fwd X.W^T", 1000, 5000, 2000, False, True),
         ("dense dW = dY^T.X", 5000, 2000, 1000, True, False)]


def gemm_case(dev, M, N, K, ta, tb, repeats):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float16)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float16)
    ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
    scale = np.abs(a.T if ta else a).astype(np.float64) @ np.abs(b.T if tb else b)
    times = {}
    for dt in (np.float16, np.float32):
        A, B = clnn.asarray(a.astype(dt), device=dev), clnn.asarray(b.astype(dt), device=dev)
        out = clnn.gemm(A, B, trans_a=ta, trans_b=tb)
        err = np.abs(out.get().astype(np.float64) - ref)
        bound = (np.finfo(dt).eps + 8 * (K + 1) * np.finfo(np.float32).eps) * scale
        if not np.all(err <= bound):
            raise SystemExit(f"{np.dtype(dt).name} GEMM {M}x{N}x{K} differs from numpy")
        times[dt] = (A, B, out)
    samples = {np.float16: [], np.float32: []}
    for _ in range(repeats):                       # alternating: drift hits both alike
        for dt, (A, B, out) in times.items():
            samples[dt].append(_common.median_time(
                lambda: clnn.gemm(A, B, out=out, trans_a=ta, trans_b=tb), 1, warmup=1,
                sync=dev.finish))
    return {np.dtype(dt).name: float(np.median(s)) for dt, s in samples.items()}


def mlp():
    return nn.Sequential([nn.Dense(5000, "tanh"), nn.Dense(1000, "sigmoid"),
                          nn.Dense(10, "softmax")], in_features=2000, seed=0)


def lenet():
    return nn.Sequential([nn.Conv2d(6, 5), nn.MaxPool2d(2), nn.Conv2d(16, 5), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Dense(120, "relu"), nn.Dense(84, "relu"),
                          nn.Dense(10, "softmax")], in_shape=(1, 32, 32), seed=0)


def step_case(dev, make, batch, in_shape, repeats):
    rng = np.random.default_rng(1)
    x = clnn.asarray(rng.random((batch,) + in_shape, dtype=np.float32), device=dev)
    y = clnn.asarray(np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)], device=dev)
    nets = {}
    for precision in ("float16", "float32"):
        net = make()
        net.optimizer = optim.SGD(lr=0.0)        # the same weights every step
        net.scaler = nn.GradScaler(init_scale=1.0)
        nets[precision] = net
    losses = {p: float(n.train_step(x, y, loss="cross_entropy", precision=p).get())
              for p, n in nets.items()}
    if abs(losses["float16"] - losses["float32"]) > 1e-2 * max(1.0, losses["float32"]):
        raise SystemExit(f"float16 step's loss {losses['float16']} is not the float32 "
                         f"step's {losses['float32']}")
    samples = {p: [] for p in nets}
    for _ in range(repeats):
        for p, n in nets.items():
            samples[p].append(_common.median_time(
                lambda: n.train_step(x, y, loss="cross_entropy", precision=p), 1,
                warmup=1, sync=dev.finish))
    return {p: float(np.median(s)) for p, s in samples.items()}


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--sizes", default="512,1024", help="square GEMM sizes")
    args = ap.parse_args(argv)
    rows = []
    for dev in _common.devices(args.device):
        print(f"# {dev.name}")
        cases = [(f"GEMM {n}^3", n, n, n, False, False) for n in map(int, args.sizes.split(","))]
        for name, M, N, K, ta, tb in cases + DENSE:
            t = gemm_case(dev, M, N, K, ta, tb, args.repeats)
            rows.append({"device": dev.name, "case": name, **t,
                         "float32_over_float16": t["float32"] / t["float16"]})
        for name, make, batch, shape in (("MLP step (batch 1000)", mlp, 1000, (2000,)),
                                         ("LeNet-5 step (batch 64)", lenet, 64, (1, 32, 32))):
            t = step_case(dev, make, batch, shape, args.repeats)
            rows.append({"device": dev.name, "case": name, **t,
                         "float32_over_float16": t["float32"] / t["float16"]})
        for r in rows:
            if r["device"] == dev.name:
                print(f"{r['case']:26s} float16 {1e3 * r['float16']:9.2f} ms   float32 "
                      f"{1e3 * r['float32']:9.2f} ms   float16 speed {r['float32_over_float16']:.2f}x "
                      "float32's")
    print(f"results: {_common.write_json('bench_half', {'rows': rows}, args.json)}")


if __name__ == "__main__":
    main()
