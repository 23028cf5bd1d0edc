"""Host time per op: what one call of a small op costs beside its kernels, on LeNet-5's
shapes at batch 64 (its first convolution, a dense layer's GEMM, pooling, an
activation, a softmax, a sum along rows), clnn beside PyTorch (CPU, and CUDA where a
GPU is there).

    python benchmarks/bench_host.py [--device SPEC] [--repeats 5] [--calls 200]

For each op, in microseconds per call: ``enqueue``, the mean of ``--calls`` calls made
back to back without waiting (the Python and the driver's enqueue; on a CPU device the
kernels run meanwhile on the same cores); ``call``, the median of calls each waited for
(what bench_conv.py and a user see); ``kernel``, its kernels' span in profiling events;
``unplanned``, ``enqueue`` again for the ops with launch plans (clnn/ops/_memo.py)
called past them, which shows what the plans save in the same run; and ``python``,
``enqueue`` with clnn's launches not enqueued at all: the Python of a call alone.
Each result is checked against PyTorch (or numpy) first.

First, the floor under all of them: an empty kernel enqueued straight through
PyOpenCL. Then the same three figures for whole replayed LeNet-5 training steps (batch
64, SGD with momentum) in float32, float16 and bfloat16 (mixed precision, the batch kept
in the 16-bit type as fit keeps it): what a step costs the host beside its kernels,
and whether mixed precision adds to it. Each is checked first: its replayed steps
give bitwise the plain steps' losses and weights.
With CLNN_PROFILING=0 in the environment the device's queue keeps no profiling
events (no ``kernel`` column): run it both ways to see what the events cost a launch.
Writes benchmarks/results/bench_host.json.
"""

import contextlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from bench_lenet import make_net  # noqa: E402  (bench_lenet.py's LeNet-5)

import clnn  # noqa: E402
from clnn import programs  # noqa: E402
from clnn.tuner import median_kernel_time  # noqa: E402


def cases(rng):
    """(name, clnn op on device arrays, its inputs, torch op on tensors, the clnn op
    past its launch plans or None)"""
    f = np.float32
    x = rng.standard_normal((64, 1, 32, 32), dtype=f)
    w = rng.standard_normal((6, 1, 5, 5), dtype=f)
    dy = rng.standard_normal((64, 6, 28, 28), dtype=f)
    a = rng.standard_normal((64, 400), dtype=f)
    wd = rng.standard_normal((120, 400), dtype=f)
    z = rng.standard_normal((64, 10), dtype=f)
    dgrad, wgrad = clnn.conv2d_backward_data, clnn.conv2d_backward_weight
    return [
        ("conv2d (LeNet C1)", clnn.conv2d, (x, w),
         lambda t, x, w: t.nn.functional.conv2d(x, w), clnn.conv2d.unplanned),
        ("conv2d_backward_data", lambda dy, w: dgrad(dy, w, x.shape), (dy, w),
         lambda t, dy, w: t.nn.grad.conv2d_input(x.shape, w, dy),
         lambda dy, w: dgrad.unplanned(dy, w, x.shape)),
        ("conv2d_backward_weight", lambda dy, x: wgrad(dy, x, w.shape), (dy, x),
         lambda t, dy, x: t.nn.grad.conv2d_weight(x, w.shape, dy),
         lambda dy, x: wgrad.unplanned(dy, x, w.shape)),
        ("gemm 64x400 @ 400x120 (dense)", lambda a, b: clnn.gemm(a, b, trans_b=True),
         (a, wd), lambda t, a, b: a @ b.T, lambda a, b: clnn.gemm.unplanned(a, b, trans_b=True)),
        ("max_pool2d 2x2", lambda y: clnn.max_pool2d(y, 2), (dy,),
         lambda t, y: t.nn.functional.max_pool2d(y, 2),
         lambda y: clnn.max_pool2d.unplanned(y, 2)),
        ("relu", clnn.relu, (dy,), lambda t, y: t.relu(y),
         lambda y: clnn.activation.unplanned("relu", y)),
        ("softmax 64x10", clnn.softmax, (z,), lambda t, z: t.softmax(z, 1),
         clnn.softmax.unplanned),
        ("sum along rows 64x400", lambda a: clnn.sum(a, axis=1), (a,),
         lambda t, a: a.sum(1), lambda a: clnn.sum.unplanned(a, axis=1)),
    ]


def _kernel_us(fn, dev, repeats):
    """The kernels' span per call in µs; None on a queue without profiling events
    (CLNN_PROFILING=0)."""
    return 1e6 * median_kernel_time(fn, dev, repeats) if dev.profiling else None


def _enqueue_us(dev, fn, calls, repeats):
    """Median over ``repeats`` of the µs per call of ``calls`` calls made back to back."""
    return 1e6 * _common.enqueue_time(dev, fn, calls, repeats)


@contextlib.contextmanager
def _no_enqueue():
    """Inside the block clnn's launches are not enqueued (programs.enqueue does
    nothing): what is left of a call is its Python. Only for timing calls whose
    results are never read."""
    real = programs.enqueue
    programs.enqueue = lambda *args, **kwargs: None
    try:
        yield
    finally:
        programs.enqueue = real


def run(dev, torch, cuda, args):
    rows = []
    rng = np.random.default_rng(0)
    for name, op, inputs, t_op, unplanned in cases(rng):
        d = [clnn.asarray(v, device=dev) for v in inputs]
        want = t_op(torch, *map(torch.from_numpy, inputs)).numpy() if torch else None
        got = op(*d).get()
        if want is not None and not np.allclose(got, want, rtol=1e-4, atol=1e-3):
            raise SystemExit(f"clnn {name} differs from PyTorch")
        call = lambda: op(*d)   # noqa: E731
        for _ in range(3):      # seen, planned, replayed
            call()
        row = {"op": name, "device": dev.name,
               "enqueue_us": _enqueue_us(dev, call, args.calls, args.repeats),
               "call_us": 1e6 * _common.median_time(call, args.repeats * 10, warmup=2,
                                                    sync=dev.finish),
               "kernel_us": _kernel_us(call, dev, args.repeats)}
        if unplanned is not None:
            row["unplanned_enqueue_us"] = _enqueue_us(dev, lambda: unplanned(*d),
                                                      args.calls, args.repeats)
        with _no_enqueue():
            row["python_us"] = _enqueue_us(dev, call, args.calls, args.repeats)
        tdev = cuda if cuda is not None else torch
        if tdev is not None:
            ts = [tdev.from_numpy(v) for v in inputs]
            if cuda is not None:
                ts = [t.cuda() for t in ts]
                row["torch_cuda_call_us"] = 1e6 * _common.cuda_time(
                    cuda, lambda: t_op(cuda, *ts), args.repeats * 10)
            else:
                row["torch_cpu_call_us"] = 1e6 * _common.median_time(
                    lambda: t_op(torch, *ts), args.repeats * 10, warmup=2)
        rows.append(row)
    return rows


def floor_row(dev, args):
    """The floor under every call: an empty kernel of one argument enqueued straight
    through PyOpenCL (set_args and enqueue_nd_range_kernel, nothing of clnn's),
    back to back: the driver's and PyOpenCL's share of a launch."""
    import pyopencl as cl
    prg = cl.Program(dev.context, "__kernel void nothing(__global float *x) { }").build()
    kern = prg.nothing
    buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 64)

    def launch():
        kern.set_args(buf)
        cl.enqueue_nd_range_kernel(dev.queue, kern, (64,), (64,))
    launch()
    dev.finish()
    return {"op": "empty kernel through PyOpenCL", "device": dev.name,
            "enqueue_us": _enqueue_us(dev, launch, args.calls, args.repeats),
            "call_us": 1e6 * _common.median_time(launch, args.repeats * 10, warmup=2,
                                                 sync=dev.finish),
            "kernel_us": None}       # (clnn records only its own launches' events)


def step_rows(dev, args):
    """Host time of replayed LeNet-5 training steps per precision (see the module's
    docstring), each checked against plain steps first."""
    from clnn import optim
    rng = np.random.default_rng(1)
    x = rng.random((64, 1, 32, 32), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)]
    rows = []
    for precision in (None, "float16", "bfloat16"):
        dt = np.dtype(precision or np.float32)
        xd, yd = (clnn.asarray(v.astype(dt), device=dev) for v in (x, y))
        nets = [make_net(dev), make_net(dev)]
        for net in nets:
            net.optimizer = optim.SGD(lr=0.01, momentum=0.9)
        for _ in range(4):                  # plain, and seen, captured, replayed
            losses = [net.train_step(xd, yd, loss="cross_entropy", precision=precision,
                                     replay=i == 1).get() for i, net in enumerate(nets)]
            if losses[0].tobytes() != losses[1].tobytes():
                raise SystemExit(f"{precision or 'float32'}: replayed steps differ")
        if not np.array_equal(nets[0].flat_parameters.get(), nets[1].flat_parameters.get()):
            raise SystemExit(f"{precision or 'float32'}: replayed steps differ")
        net = nets[1]
        step = lambda: net.train_step(xd, yd, loss="cross_entropy",  # noqa: E731
                                      precision=precision, replay=True)
        rows.append({"op": f"LeNet-5 step, {precision or 'float32'}", "device": dev.name,
                     "enqueue_us": _enqueue_us(dev, step, max(1, args.calls // 10),
                                               args.repeats),
                     "call_us": 1e6 * _common.median_time(step, args.repeats * 4, warmup=2,
                                                          sync=dev.finish),
                     "kernel_us": _kernel_us(step, dev, args.repeats)})
    return rows


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--calls", type=int, default=200, help="calls per enqueue timing")
    args = ap.parse_args(argv)
    torch = _common.torch_or_none()
    cuda = _common.torch_cuda()
    rows = []
    for dev in _common.devices(args.device):
        print(f"# {dev.name}" + ("" if dev.profiling else
                                 ", its queue without profiling (CLNN_PROFILING=0)"))
        ref = "torch_cpu_call_us" if dev.facts.is_cpu or cuda is None else \
            "torch_cuda_call_us"
        print(f"{'op':32s} {'enqueue':>8s} {'unplanned':>9s} {'python':>8s} {'call':>8s} "
              f"{'kernel':>8s} {ref[:-8]:>10s}  (us per call)")
        for row in [floor_row(dev, args)] + \
                run(dev, torch, None if dev.facts.is_cpu else cuda, args) + \
                step_rows(dev, args):
            rows.append(row)
            un, peer, py, kern = (row.get(k) for k in ("unplanned_enqueue_us", ref,
                                                       "python_us", "kernel_us"))
            print(f"{row['op']:32s} {row['enqueue_us']:8.1f} "
                  f"{'-' if un is None else f'{un:.1f}':>9s} "
                  f"{'-' if py is None else f'{py:.1f}':>8s} {row['call_us']:8.1f} "
                  f"{'-' if kern is None else f'{kern:.1f}':>8s} "
                  f"{'-' if peer is None else f'{peer:.1f}':>10s}")
    print(f"results: {_common.write_json('bench_host', {'rows': rows}, args.json)}")


if __name__ == "__main__":
    main()
