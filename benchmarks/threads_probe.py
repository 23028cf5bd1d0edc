"""Which host calls made at once from several threads crash the OpenCL driver: each
mode below runs four threads at once (the interpreter switching every microsecond,
as tests/conftest.py's race does) in a process of its own, --repeats times, and counts
the processes that crashed, hung or computed a wrong result.

    python benchmarks/threads_probe.py [--device SPEC] [--repeats 5] [--modes a,b]

Why: on an H200 (driver 580.159.04, 2026-11-28) test_reliability's
test_3_launches_from_many_threads_keep_their_arguments (four threads: two arrays
copied in with clnn.asarray, a Hadamard product, the result read back, 150 times)
killed its process with a segmentation fault in 5 runs of 7, in a thread of the
driver's own; the same loop on arrays from PyOpenCL's own allocator, or with the
copies made one thread at a time, did not crash in 2 runs each. clnn's pool differs
from PyOpenCL's allocator in two ways, tried apart here: it makes each new block real
with clEnqueueMigrateMemObjects on the shared queue, and it hands a block another
thread has just let go to the next request.

Modes (a fresh 1 KiB array per copy unless said):
  raw-write       PyOpenCL only: one buffer per thread, blocking writes and reads
  raw-migrate     PyOpenCL only: a new buffer each time, migrated as clnn's pool does
  clnn            the test's loop
  clnn-nomigrate  the test's loop, the pool making buffers without the migration
  clnn-fill       the test's loop, the pool making each new block real with a 4-byte
                  fill instead (a candidate fix, should the migration be the cause)
  clnn-noreuse    the test's loop, the pool never reusing a block
  clnn-nopool     the test's loop on arrays from PyOpenCL's allocator
  clnn-locked     the test's loop with copies in and out one thread at a time
Writes benchmarks/results/threads_probe.json.
"""

import argparse
import functools
import os
import subprocess
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import clnn  # noqa: E402

MODES = ("raw-write", "raw-migrate", "clnn", "clnn-nomigrate", "clnn-fill",
         "clnn-noreuse", "clnn-nopool", "clnn-locked")
N, ITERS, THREADS = 257, 150, 4


def child(mode, spec):
    """One process: THREADS threads of ``mode``; exit status 0 when every result was
    right, 3 when one was wrong (a crash gives the signal's status)."""
    import pyopencl as cl
    import pyopencl.array as cla
    dev = clnn.device(spec)
    ctx, queue, pool = dev.context, dev.queue, dev.pool
    if mode == "clnn-nomigrate":
        pool._allocator = lambda nbytes: cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes)
    elif mode == "clnn-fill":
        def filled(nbytes):
            buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes)
            cl.enqueue_fill_buffer(queue, buf, np.zeros(1, np.uint32), 0, 4)
            return buf
        pool._allocator = filled
    elif mode == "clnn-noreuse":
        pool._reuse = lambda size: None
    lock = threading.Lock()
    wrong = []

    def work(t):
        host = np.full(N, t + 1, np.float32)
        ramp = np.arange(N, dtype=np.float32)
        want = (t + 1) * ramp
        back = np.empty(N, np.float32)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
        for _ in range(ITERS):
            if mode == "raw-write":
                cl.enqueue_copy(queue, buf, host)
                cl.enqueue_copy(queue, back, buf)
                got = back * ramp
            elif mode == "raw-migrate":
                fresh = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
                cl.enqueue_migrate_mem_objects(queue, [fresh], flags=0)
                cl.enqueue_copy(queue, fresh, host)
                cl.enqueue_copy(queue, back, fresh)
                got = back * ramp
            elif mode == "clnn-nopool":
                x, y = cla.to_device(queue, host), cla.to_device(queue, ramp)
                got = clnn.hadamard(x, y).get()
            elif mode == "clnn-locked":
                with lock:
                    x, y = clnn.asarray(host, device=dev), clnn.asarray(ramp, device=dev)
                z = clnn.hadamard(x, y)
                with lock:
                    got = z.get()
            else:
                x, y = clnn.asarray(host, device=dev), clnn.asarray(ramp, device=dev)
                got = clnn.hadamard(x, y).get()
            if not np.array_equal(got, want):
                wrong.append(t)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=functools.partial(work, t)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.setswitchinterval(switch)
    sys.exit(3 if wrong else 0)


def main():
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: "
                    + ", ".join(MODES))
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.device)
        return
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}")
    spec = ["--device", args.device] if args.device else []
    print(f"# {clnn.device(args.device).name}: {THREADS} threads x {ITERS} iterations, "
          f"{args.repeats} processes per mode")
    rows = []
    for mode in modes:
        outcomes = []
        for _ in range(args.repeats):
            try:
                rc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                     mode] + spec, capture_output=True,
                                    timeout=args.timeout).returncode
                outcomes.append("ok" if rc == 0 else "wrong" if rc == 3 else
                                f"crashed ({rc})")
            except subprocess.TimeoutExpired:
                outcomes.append("hung")
        bad = sum(o != "ok" for o in outcomes)
        rows.append({"mode": mode, "runs": len(outcomes), "bad": bad,
                     "outcomes": outcomes})
        print(f"{mode:<16} {bad} of {len(outcomes)} bad: {', '.join(outcomes)}", flush=True)
    print(f"results: {_common.write_json('threads_probe', {'rows': rows}, args.json)}")


if __name__ == "__main__":
    main()
