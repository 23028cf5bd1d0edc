"""Would cl_khr_command_buffer make a replayed training step cheaper on this device?
The measurement that decides whether clnn.cmdbuf (CLNN_COMMAND_BUFFERS=1) should be on
by default where a driver has the extension.

    python benchmarks/cmdbuf_probe.py [--device SPEC] [--batches 64,1024]
                                      [--precisions float32,float16] [--repeats 5]

fit replays a step's captured kernels (clnn.programs.replay): one clSetKernelArg pass
and one clEnqueueNDRangeKernel per launch, 25-40 launches for LeNet-5. On an H200 a
replayed LeNet-5 step at batch 64 took 0.60 ms, most of it host time between the
launches. The extension records launches once and enqueues them in one call. Where
the device lists it, this script records each captured step (LeNet-5, float32 and
mixed precision, each batch) as clnn.cmdbuf does, checks that the gradients are
bitwise those of the plain replay, and times both: a step at a time (queue finished
after each, what a user waits for) and enqueue alone (the host's share). Where the
device lacks the extension it says so and writes that. Measured on Debian's PoCL 3.1
(which has it, version 0.9.0; pip's 3.0 does not), Intel Xeon, 2026-11-28: enqueue of
LeNet-5's step at batch 64 (39 launches) 232 -> 144 us, float16's (59) 283 -> 139
us; the steps themselves 1.00-1.05x (2.6-48 ms of kernels on 2 cores). Writes
benchmarks/results/cmdbuf_probe.json.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from bench_half import lenet  # noqa: E402

import clnn  # noqa: E402
from clnn import cmdbuf, programs  # noqa: E402

# the device's required queue properties (cl_ext.h)
DEVICE_REQUIRED_QUEUE_PROPERTIES = 0x12AA


def step_case(dev, precision, batch, repeats):
    """A LeNet-5 step's replay (``precision``, ``batch``) from command buffers against
    launch by launch: its gradients, and the times of both."""
    net = lenet(dev)
    rng = np.random.default_rng(0)
    x = clnn.asarray(rng.random((batch, 1, 32, 32), dtype=np.float32), device=dev)
    y = clnn.asarray(np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)], device=dev)
    low = None if precision == "float32" else precision
    for _ in range(3):                      # the second step captures, the third replays
        net.train_step(x, y, 0.0, 0.0, "cross_entropy", precision=low, replay=True)
    dev.finish()
    launches = next(r for r in net._replays.values() if r.launches).launches
    grads = net.flat_gradients
    grads.fill(0)
    programs.replay(launches)
    want = grads.get()
    graph = cmdbuf.Graph(cmdbuf.api(dev.queue.device), dev.queue, launches)
    grads.fill(0)
    graph.run()
    got = grads.get()
    row = {"precision": precision, "batch": batch, "launches": len(launches),
           "simultaneous_use": graph.api.simultaneous,
           "bitwise_equal": bool(np.array_equal(got.view(np.uint8), want.view(np.uint8)))}
    if not row["bitwise_equal"]:
        print(f"  {precision} batch {batch}: the command buffer's gradients differ")
        graph.release()
        return row
    for name, fn in (("replay", lambda: programs.replay(launches)), ("buffer", graph.run)):
        row[f"{name}_step_us"] = 1e6 * _common.median_time(fn, repeats * 10, warmup=3,
                                                           sync=dev.finish)
        dev.finish()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        row[f"{name}_enqueue_us"] = 1e6 * (time.perf_counter() - t0) / 20
        dev.finish()
    graph.release()
    print(f"  {precision:8} batch {batch:5}: {len(launches)} launches; step "
          f"{row['replay_step_us']:8.1f} us replayed, {row['buffer_step_us']:8.1f} us "
          f"from command buffers ({row['replay_step_us'] / row['buffer_step_us']:.2f}x); "
          f"enqueue {row['replay_enqueue_us']:7.1f} -> {row['buffer_enqueue_us']:7.1f} us")
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", help="one clnn device spec (default: every device found)")
    ap.add_argument("--batches", default="64,1024")
    ap.add_argument("--precisions", default="float32,float16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="result file (default benchmarks/results/NAME.json)")
    args = ap.parse_args(argv)
    rows = []
    for dev in _common.devices(args.device):
        d = dev.queue.device
        if not cmdbuf.has(d):
            print(f"{dev.name}: no {cmdbuf.EXTENSION} (driver {d.driver_version}): "
                  "nothing to probe")
            rows.append({"device": dev.name, "driver": d.driver_version, "supported": False})
            continue
        versions = {e.name: e.version for e in getattr(d, "extensions_with_version", ())}
        required = cmdbuf.device_uint64(d, DEVICE_REQUIRED_QUEUE_PROPERTIES)
        print(f"{dev.name}: {cmdbuf.EXTENSION} version "
              f"{versions.get(cmdbuf.EXTENSION, '?')}, simultaneous use "
              f"{cmdbuf.api(d).simultaneous}, required queue properties {required:#x} "
              f"(clnn's queue: {dev.queue.properties:#x})")
        for precision in args.precisions.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                try:
                    row = step_case(dev, precision, batch, args.repeats)
                except Exception as e:       # a refusal is this probe's answer too
                    print(f"  {precision} batch {batch}: {type(e).__name__}: {e}")
                    row = {"precision": precision, "batch": batch, "error": str(e)}
                rows.append(dict(row, device=dev.name, driver=d.driver_version,
                                 supported=True))
    print(f"results: {_common.write_json('cmdbuf_probe', {'rows': rows}, args.json)}")
    return 1 if any("error" in r or r.get("bitwise_equal") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
