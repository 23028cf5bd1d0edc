"""Memory-bound ops in GB/s (bytes read + written): element-wise activations,
reductions, bias gradients and softmax, clnn beside numpy and PyTorch (CPU, and CUDA
where a GPU is there) in the same run, on every device.

    python benchmarks/bench_ops.py [--device SPEC] [--repeats 5] [--scale 1.0]
                                   [--ops relu,tanh] [--unroll 1,4] [--row-group 256,64]

The shapes are the GPU issue's (64M floats, a 4096 x 4096 softmax, 16384 x 1024 for
the sums along rows and columns), and 2x2 max and average pooling of 2048 planes of 56
x 56 (a ResNet stage's 32 x 64); ``--scale`` multiplies the element counts. Each clnn
result is checked first against numpy in float64 (sums to a bound that grows with
their length, the rest to a few float32 units); then every library is timed with a
warm-up and the median of repeats, wall-clock with its queue finished after each call
(what a user waits for), and clnn also in kernel time (profiling events) and in host
time (calls made back to back without waiting, the queue finished after). The ratio
columns are clnn's GB/s over each reference's: above 1 is faster. ``--ops`` keeps the
ops whose names start with one of its words; ``--unroll`` times the element-wise ops
(relu, tanh) once per value of their kernels' GPU loop unrolling (1: one load at a time
per work-item; ops/elementwise.py's GPU_UNROLL is the default on GPUs), forced on any
device; ``--row-group`` times the sums along rows once per work-group size of the GPUs'
reduction kernel (64: the default, reduce.ROW_TREE; each a tree of that many partial
sums per row),
that kernel forced on any device.
Writes benchmarks/results/bench_ops.json.
"""

import contextlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import clnn  # noqa: E402
from clnn import tuning  # noqa: E402
from clnn.tuner import median_kernel_time  # noqa: E402


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _max_pool22(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def _avg_pool22(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))


def cases(scale):
    """(name, shape, clnn op, numpy op, torch op, bytes moved, sums: None, or the
    length of each sum and the numpy sums of magnitudes that bound its error, None for
    the values themselves)"""
    n = int(64 * 2 ** 20 * scale)
    rows = max(1, int(16384 * scale))
    sq = max(1, int(4096 * scale ** 0.5))
    planes = max(1, int(2048 * scale))          # 32 x 64 planes of 56 x 56 at scale 1
    pooled = planes * 56 * 56
    return [
        ("relu", (n,), lambda x: clnn.relu(x), lambda x: np.maximum(x, 0),
         lambda t, x: t.relu(x), 8 * n, None),
        ("tanh", (n,), lambda x: clnn.tanh(x), np.tanh, lambda t, x: t.tanh(x), 8 * n, None),
        ("sum", (n,), lambda x: clnn.sum(x), lambda x: x.sum(), lambda t, x: x.sum(),
         4 * n, (n, lambda m: m.sum())),
        ("max", (n,), lambda x: clnn.max(x), lambda x: x.max(), lambda t, x: x.max(),
         4 * n, None),
        ("sum along rows", (rows, 1024), lambda x: clnn.sum(x, axis=1),
         lambda x: x.sum(axis=1), lambda t, x: x.sum(1), 4 * rows * 1024,
         (1024, lambda m: m.sum(axis=1))),
        ("bias_grad (sum along columns)", (rows, 1024), lambda x: clnn.bias_grad(x),
         lambda x: x.sum(axis=0), lambda t, x: x.sum(0), 4 * rows * 1024,
         (rows, lambda m: m.sum(axis=0))),
        ("softmax", (sq, sq), lambda x: clnn.softmax(x), _softmax,
         lambda t, x: t.softmax(x, 1), 8 * sq * sq, (sq, None)),
        ("max_pool2d 2x2", (planes, 1, 56, 56), lambda x: clnn.max_pool2d(x, 2),
         _max_pool22, lambda t, x: t.nn.functional.max_pool2d(x, 2), 5 * pooled, None),
        ("avg_pool2d 2x2", (planes, 1, 56, 56), lambda x: clnn.avg_pool2d(x, 2),
         _avg_pool22, lambda t, x: t.nn.functional.avg_pool2d(x, 2), 5 * pooled,
         (4, _avg_pool22)),
    ]


def _check(name, got, ref, x, sums):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if sums:     # a sum of k terms: k float32 units of the terms' magnitudes, as tests
        k, mag = sums           # (softmax: of each value, which its row's sum divides)
        terms = np.abs(ref) if mag is None else mag(np.abs(x.astype(np.float64)))
        bound = 2 * (k + 8) * np.finfo(np.float32).eps * terms + 1e-30
    else:
        bound = 4 * np.finfo(np.float32).eps * np.abs(ref) + 1e-30
    if not np.all(np.abs(got - ref) <= bound):
        raise SystemExit(f"clnn {name} differs from numpy")


def run_case(dev, torch, cuda, name, shape, op, ref_op, t_op, nbytes, sums, repeats):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    xd = clnn.asarray(x, device=dev)
    _check(name, op(xd).get(), ref_op(x.astype(np.float64)), x, sums)
    wall = _common.median_time(lambda: op(xd), repeats, warmup=2, sync=dev.finish)
    kernel = median_kernel_time(lambda: op(xd), dev, repeats)
    row = {"op": name, "shape": list(shape), "bytes": nbytes,
           "clnn_GBps": nbytes / wall / 1e9,
           "clnn_kernel_GBps": nbytes / kernel / 1e9,
           "clnn_wall_us": 1e6 * wall, "clnn_kernel_us": 1e6 * kernel,
           # host time: calls back to back without waiting
           "clnn_enqueue_us": 1e6 * _common.enqueue_time(dev, lambda: op(xd), 50),
           "numpy_GBps": nbytes / _common.median_time(lambda: ref_op(x), repeats,
                                                       warmup=1) / 1e9}
    if torch is not None:
        xt = torch.from_numpy(x)
        row["torch_cpu_GBps"] = nbytes / _common.median_time(lambda: t_op(torch, xt),
                                                             repeats, warmup=1) / 1e9
    if cuda is not None:
        xc = torch.from_numpy(x).cuda()
        row["torch_cuda_GBps"] = nbytes / _common.cuda_time(
            cuda, lambda: t_op(cuda, xc), repeats) / 1e9
        del xc
    return row


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the element counts (0.25 for a quick run)")
    ap.add_argument("--ops", default="",
                    help="comma-separated op names (prefixes) to run; default all")
    ap.add_argument("--unroll", default="",
                    help="comma-separated unrollings to force on the element-wise ops")
    ap.add_argument("--row-group", default="",
                    help="comma-separated work-group sizes to force on the sums along rows")
    args = ap.parse_args(argv)
    wanted = [w.strip() for w in args.ops.split(",") if w.strip()]
    unrolls = [("elementwise", {"unroll": int(u)}, f"unroll {u}")
               for u in args.unroll.split(",") if u.strip()] or [None]
    groups = [("reduce", {"wg": True, "ly": int(g)}, f"work-group {g}")
              for g in args.row_group.split(",") if g.strip()] or [None]
    torch = _common.torch_or_none()
    cuda = _common.torch_cuda()
    rows = []
    for dev in _common.devices(args.device):
        print(f"# {dev.name}")
        refs = ["numpy_GBps"] + (["torch_cpu_GBps"] if torch else []) + \
            (["torch_cuda_GBps"] if cuda and not dev.facts.is_cpu else [])
        print(f"{'op':30s} {'clnn':>8s} {'kernel':>8s} "
              + " ".join(f"{r[:-5]:>15s}" for r in refs) + "   clnn / each (GB/s)"
              "   clnn's call / kernel / enqueue (us)")
        for name, shape, op, ref_op, t_op, nbytes, sums in cases(args.scale):
            if wanted and not any(name.startswith(w) for w in wanted):
                continue
            forced = unrolls if name in ELEMENTWISE else groups if name == ROWS else [None]
            for f in forced:
                rows.append(_row(dev, torch, cuda, refs, args.repeats, f, name, shape, op,
                                 ref_op, t_op, nbytes, sums))
    print(f"results: {_common.write_json('bench_ops', {'rows': rows}, args.json)}")


ELEMENTWISE = ("relu", "tanh")
ROWS = "sum along rows"


def _row(dev, torch, cuda, refs, repeats, forced, name, shape, op, ref_op, t_op, nbytes,
         sums):
    """One case's row; ``forced``: None, or (kernel, parameters, label) to force."""
    force = contextlib.nullcontext() if forced is None else \
        tuning.override(forced[0], forced[1])
    with force:
        row = run_case(dev, torch, cuda if not dev.facts.is_cpu else None, name,
                       shape, op, ref_op, t_op, nbytes, sums, repeats)
    if forced is not None:
        name = f"{name} ({forced[2]})"
        row["op"], row["forced"] = name, forced[1]
    row["device"] = dev.name
    for r in refs:
        row[f"clnn_over_{r[:-5]}"] = row["clnn_GBps"] / row[r]
    print(f"{name:30s} {row['clnn_GBps']:8.1f} {row['clnn_kernel_GBps']:8.1f} "
          + " ".join(f"{row[r]:15.1f}" for r in refs) + "   "
          + " ".join(f"{row['clnn_over_' + r[:-5]]:.2f}x" for r in refs)
          + f"   {row['clnn_wall_us']:.0f} / {row['clnn_kernel_us']:.0f} / "
          f"{row['clnn_enqueue_us']:.0f}", flush=True)
    return row


if __name__ == "__main__":
    main()
