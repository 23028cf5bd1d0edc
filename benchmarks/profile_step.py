"""Where a training step's time goes: each kernel's device time (OpenCL profiling
events, clnn.profile) beside the step's wall time, for LeNet-5 and the MLP of
bench_half.py, in float32 and in mixed precision (float16), on every device.

    python benchmarks/profile_step.py [--device SPEC] [--steps 5] [--mlp-batch 1000]
                                      [--lenet-batch 64[,1024]] [--top 12] [--as-gpu]
                                      [--launches]

Steps run as fit runs them (within an epoch: the optimizer's kernel keeps the 16-bit
copy of the weights). Per step: wall time (Python, driver and kernels), span (first kernel's start to the
last one's end), device time (the kernels' own), idle (span minus device time: the
device waiting for the host to launch the next kernel), launches; then the kernels,
the most time first. A step where idle is most of the span is bound by host time per
launch; one where device time is close to wall time is bound by its kernels. The
float16 step is validated first against the float32 step from the same weights (loss
to 1%), as bench_half.py does. ``--as-gpu`` gives the device an H100's facts (132
units, 48 KiB of local memory, a GPU: its kernels and launch plans; no matrix
engines), so that a CPU device counts the launches a GPU's step makes; its times then
say nothing about a GPU. Writes benchmarks/results/profile_step.json.
"""

import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import bench_half  # noqa: E402

import clnn  # noqa: E402
from clnn import nn, optim  # noqa: E402


def profile_case(dev, make, batch, in_shape, steps):
    rng = np.random.default_rng(1)
    x = clnn.asarray(rng.random((batch,) + in_shape, dtype=np.float32), device=dev)
    y = clnn.asarray(np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)], device=dev)
    out = {}
    losses = {}
    for precision in ("float32", "float16"):
        net = make()
        net.optimizer = optim.SGD(lr=0.0)           # the same weights every step
        net.scaler = nn.GradScaler(init_scale=1.0)
        # (fit keeps its batches in the step's dtype: so does this)
        xs = x if precision == "float32" else clnn.cast(x, np.float16)
        ys = y if precision == "float32" else clnn.cast(y, np.float16)

        epoch = object()          # as fit's steps: the optimizer keeps the 16-bit weights

        def step():
            return net.train_step(xs, ys, loss="cross_entropy", precision=precision,
                                  _half_epoch=epoch)
        losses[precision] = float(step().get())
        step()
        dev.finish()
        with clnn.profile() as prof:
            for _ in range(steps):
                step()
        out[precision] = prof
    if abs(losses["float16"] - losses["float32"]) > 1e-2 * max(1.0, losses["float32"]):
        raise SystemExit(f"float16 step's loss {losses['float16']} is not the float32 "
                         f"step's {losses['float32']}")
    return out


def idle_before(records):
    """The device's idle time in us before each launch (since the previous kernel's
    end: what a launch costs beyond its kernel where the host keeps up, as
    plans.LAUNCH models it); None for the first."""
    return [None] + [1e-3 * (r.start_ns - prev.end_ns) for prev, r in zip(records, records[1:])]


def launch_table(records):
    """One step's launches in order: where each layer's product went, and the device's
    idle time before each (idle_before)."""
    width = max([len(r.label) for r in records] + [6])
    lines = [f"{'#':>3}  {'kernel':<{width}}  {'global':<22}  {'local':<14}  device us"
             f"  idle before"]
    for i, (r, idle) in enumerate(zip(records, idle_before(records))):
        gs = "x".join(map(str, r.global_size))
        ls = "-" if r.local_size is None else "x".join(map(str, r.local_size))
        gap = "-" if idle is None else f"{idle:.1f}"
        lines.append(f"{i:3}  {r.label:<{width}}  {gs:<22}  {ls:<14}  {1e6 * r.seconds:9.1f}"
                     f"  {gap:>11}")
    return "\n".join(lines)


def as_gpu(dev):
    """Give ``dev`` an H100's facts (without its engines, which only NVIDIA's compiler
    builds), keeping its platform and work-group limits so that its kernels run."""
    dev.facts = dataclasses.replace(
        dev.facts, name="NVIDIA H100 80GB HBM3", vendor="NVIDIA Corporation", type="GPU",
        compute_units=132, local_mem_size=49152, nv_compute_capability=0, cache_size=0,
        float_lanes=0)
    clnn.clear_caches()


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--steps", type=int, default=5, help="steps profiled per case")
    ap.add_argument("--mlp-batch", type=int, default=1000, help="0: no MLP step")
    ap.add_argument("--lenet-batch", default="64",
                    help="LeNet-5's batch, or batches separated by commas (64,1024: "
                         "launches against convolutions); 0: no LeNet-5 step")
    ap.add_argument("--top", type=int, default=12, help="kernels shown per case")
    ap.add_argument("--launches", action="store_true",
                    help="also list one step's launches in order: kernel, tile, global "
                         "and local size, device time (which layer's product is slow)")
    ap.add_argument("--as-gpu", action="store_true",
                    help="run an H100's kernels and plans on the device (launch counts "
                         "as a GPU's; times meaningless on a CPU)")
    args = ap.parse_args(argv)
    rows = []
    for dev in _common.devices(args.device):
        print(f"# {dev.name}" + (", with an H100's facts" if args.as_gpu else ""))
        if args.as_gpu:
            as_gpu(dev)
        lenets = [("LeNet-5 step", bench_half.lenet, int(n), (1, 32, 32))
                  for n in args.lenet_batch.split(",") if int(n) > 0]
        mlps = [("MLP step", bench_half.mlp, args.mlp_batch, (2000,))] * (args.mlp_batch > 0)
        for name, make, batch, shape in lenets + mlps:
            for precision, prof in profile_case(dev, make, batch, shape, args.steps).items():
                per = args.steps
                print(f"\n## {name}, batch {batch}, {precision}")
                print(prof.table(top=args.top, per=per))
                # a step's launches, in order (every step makes the same ones)
                one = prof.records[:len(prof.records) // per]
                if args.launches:
                    print(launch_table(one))
                rows.append({"device": dev.name, "case": name, "batch": batch,
                             "precision": precision, "wall_ms": 1e3 * prof.wall_s / per,
                             "span_ms": 1e3 * prof.span_s / per,
                             "device_ms": 1e3 * prof.device_s / per,
                             "idle_ms": 1e3 * prof.idle_s / per,
                             "launches": prof.launches / per,
                             "kernels": [{"kernel": k, "launches": n / per,
                                          "device_ms": 1e3 * t / per}
                                         for k, n, t in prof.summary()],
                             "step_launches": [{"kernel": r.label,
                                                "global": list(r.global_size),
                                                "local": None if r.local_size is None
                                                else list(r.local_size),
                                                "device_us": 1e6 * r.seconds,
                                                "idle_before_us": idle}
                                               for r, idle in zip(one, idle_before(one))]})
    print(f"results: {_common.write_json('profile_step', {'rows': rows}, args.json)}")


if __name__ == "__main__":
    main()
