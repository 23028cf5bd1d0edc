"""Would cl_khr_command_buffer make a replayed training step cheaper on this device?
A probe for a GPU session, before any library code depends on the extension.

    python benchmarks/cmdbuf_probe.py [--device SPEC] [--batches 64,1024]
                                      [--precisions float32,float16] [--repeats 5]

fit replays a step's captured kernels (clnn.programs.replay): one clSetKernelArg pass
and one clEnqueueNDRangeKernel per launch, 25-40 launches for LeNet-5. On an H200 a
replayed LeNet-5 step at batch 64 took 0.60 ms, most of it host time between the
launches. The extension records launches once into a command buffer and enqueues
them in one call. Where the device lists it, this script records each captured step
(LeNet-5, float32 and mixed precision, each batch) into one, checks that the
gradients it computes are bitwise those of the plain replay, and times both: a step
at a time (queue finished after each, what a user waits for) and enqueue alone (the
host's share). Where the device lacks the extension it says so and writes that.
Measured on Debian's PoCL 3.1 (which has it, version 0.9.0; pip's 3.0 does not), Intel
Xeon, 2026-11-28: enqueue of LeNet-5's step at batch 64 (39 launches) 232 -> 144 us,
float16's (59) 283 -> 139 us; the steps themselves 1.00-1.05x (2.6-48 ms of kernels on
2 cores). PoCL 3.1 runs a recorded command with the arguments its kernel object holds
when the buffer is enqueued, not those it was recorded with, so each command gets a
kernel object of its own here. Writes benchmarks/results/cmdbuf_probe.json.
"""

import argparse
import ctypes
import os
import sys
import time

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from bench_half import lenet  # noqa: E402

import clnn  # noqa: E402
from clnn import programs  # noqa: E402

EXTENSION = "cl_khr_command_buffer"
# from the extension's header (cl_ext.h)
DEVICE_CAPABILITIES = 0x12A9
DEVICE_REQUIRED_QUEUE_PROPERTIES = 0x12AA
FLAGS = 0x1293
SIMULTANEOUS_USE = 1 << 0
CAPABILITY_SIMULTANEOUS_USE = 1 << 2
INVALID_OPERATION = -59


def _loader():
    """The OpenCL ICD loader PyOpenCL runs on (its wheel bundles one)."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "libOpenCL" in os.path.basename(path):
                return ctypes.CDLL(path)
    return ctypes.CDLL("libOpenCL.so.1")


class CommandBuffers:
    """The extension's entry points for one platform, through ctypes."""

    def __init__(self, dev):
        P, I, U, S = ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32, ctypes.c_size_t
        lib = _loader()
        address = lib.clGetExtensionFunctionAddressForPlatform
        address.restype, address.argtypes = P, [P, ctypes.c_char_p]
        platform = dev.queue.device.platform.int_ptr

        def entry(name, res, *args):
            where = address(platform, name.encode())
            if not where:
                raise RuntimeError(f"the platform has no {name}")
            return ctypes.CFUNCTYPE(res, *args)(where)
        self.create = entry("clCreateCommandBufferKHR", P, U, ctypes.POINTER(P),
                            P, ctypes.POINTER(I))
        self.ndrange = entry("clCommandNDRangeKernelKHR", I, P, P, P, P, U, P,
                             ctypes.POINTER(S), ctypes.POINTER(S), U, P, P, P)
        self.finalize = entry("clFinalizeCommandBufferKHR", I, P)
        self.enqueue = entry("clEnqueueCommandBufferKHR", I, U, P, P, U, P,
                             ctypes.POINTER(P))
        self.release = entry("clReleaseCommandBufferKHR", I, P)
        info = lib.clGetDeviceInfo
        info.restype, info.argtypes = I, [P, U, S, P, P]
        self.capabilities = ctypes.c_uint64(0)
        self.required = ctypes.c_uint64(0)
        d = dev.queue.device.int_ptr
        info(d, DEVICE_CAPABILITIES, 8, ctypes.byref(self.capabilities), None)
        info(d, DEVICE_REQUIRED_QUEUE_PROPERTIES, 8, ctypes.byref(self.required), None)
        self.dev = dev
        self.kernels = {}            # buffer -> the kernel objects its commands run

    def record(self, launches, simultaneous):
        """A finalized command buffer of ``launches`` (captured Kernels only), or an
        exception naming the call that refused."""
        P, I, S = ctypes.c_void_p, ctypes.c_int32, ctypes.c_size_t
        queue = P(self.dev.queue.int_ptr)
        props = (ctypes.c_uint64 * 3)(FLAGS, SIMULTANEOUS_USE, 0) if simultaneous else None
        err = I(0)
        buf = self.create(1, ctypes.byref(queue), props, ctypes.byref(err))
        if err.value:
            raise RuntimeError(f"clCreateCommandBufferKHR: {err.value}")
        kernels = []
        for kern, gs, ls, values in launches:
            if not hasattr(kern, "cl_kernel"):
                raise RuntimeError(f"a captured {kern.entry} is not a kernel launch")
            # a kernel object of its own per command: the extension records the
            # arguments with the command, but PoCL 3.1 reads them from the kernel object
            # when the buffer is enqueued (every command of a kernel object used twice
            # in a step then ran with its last arguments)
            k = cl.Kernel(kern.cl_kernel.program, kern.cl_kernel.function_name)
            k.set_scalar_arg_dtypes(kern.types)
            k.set_args(*values)
            kernels.append(k)
            rc = self.ndrange(buf, None, None, k.int_ptr, len(gs), None,
                              (S * len(gs))(*gs), (S * len(ls))(*ls) if ls else None,
                              0, None, None, None)
            if rc:
                raise RuntimeError(f"clCommandNDRangeKernelKHR ({kern.entry}): {rc}")
        rc = self.finalize(buf)
        if rc:
            raise RuntimeError(f"clFinalizeCommandBufferKHR: {rc}")
        self.kernels[buf] = kernels
        return buf

    def run(self, buf):
        """Enqueue ``buf`` on the device's queue; its event (a pyopencl.Event)."""
        evt = ctypes.c_void_p()
        rc = self.enqueue(0, None, buf, 0, None, ctypes.byref(evt))
        if rc:
            raise RuntimeError(f"clEnqueueCommandBufferKHR: {rc}")
        return cl.Event.from_int_ptr(evt.value, retain=False)


def step_case(dev, cbs, precision, batch, repeats):
    net = lenet(dev)
    rng = np.random.default_rng(0)
    x = clnn.asarray(rng.random((batch, 1, 32, 32), dtype=np.float32), device=dev)
    y = clnn.asarray(np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)], device=dev)
    low = None if precision == "float32" else precision
    for _ in range(3):                      # the second step captures, the third replays
        net.train_step(x, y, 0.0, 0.0, "cross_entropy", precision=low, replay=True)
    dev.finish()
    rep = next(r for r in net._replays.values() if r.launches)
    launches = rep.launches
    grads = net.flat_gradients
    grads.fill(0)
    programs.replay(launches)
    want = grads.get()
    simultaneous = bool(cbs.capabilities.value & CAPABILITY_SIMULTANEOUS_USE)
    buf = cbs.record(launches, simultaneous)
    last = [None]

    def via_buffer():
        if not simultaneous and last[0] is not None:
            last[0].wait()             # a buffer still pending cannot be enqueued again
        last[0] = cbs.run(buf)
    grads.fill(0)
    via_buffer()
    got = grads.get()
    row = {"precision": precision, "batch": batch, "launches": len(launches),
           "simultaneous_use": simultaneous,
           "bitwise_equal": bool(np.array_equal(got.view(np.uint8), want.view(np.uint8)))}
    if not row["bitwise_equal"]:
        print(f"  {precision} batch {batch}: the command buffer's gradients differ")
        cbs.release(buf)
        cbs.kernels.pop(buf)
        return row
    for name, fn in (("replay", lambda: programs.replay(launches)), ("buffer", via_buffer)):
        row[f"{name}_step_us"] = 1e6 * _common.median_time(fn, repeats * 10, warmup=3,
                                                           sync=dev.finish)
        dev.finish()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        row[f"{name}_enqueue_us"] = 1e6 * (time.perf_counter() - t0) / 20
        dev.finish()
    cbs.release(buf)
    cbs.kernels.pop(buf)
    print(f"  {precision:8} batch {batch:5}: {len(launches)} launches; step "
          f"{row['replay_step_us']:8.1f} us replayed, {row['buffer_step_us']:8.1f} us "
          f"from one command buffer ({row['replay_step_us'] / row['buffer_step_us']:.2f}x); "
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
        if EXTENSION not in d.extensions.split():
            print(f"{dev.name}: no {EXTENSION} (driver {d.driver_version}): nothing to "
                  "probe")
            rows.append({"device": dev.name, "driver": d.driver_version, "supported": False})
            continue
        versions = {e.name: e.version for e in getattr(d, "extensions_with_version", ())}
        cbs = CommandBuffers(dev)
        print(f"{dev.name}: {EXTENSION} version {versions.get(EXTENSION, '?')}, "
              f"capabilities {cbs.capabilities.value:#x}, required queue properties "
              f"{cbs.required.value:#x} (clnn's queue: {dev.queue.properties:#x})")
        for precision in args.precisions.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                try:
                    row = step_case(dev, cbs, precision, batch, args.repeats)
                except Exception as e:       # a refusal is this probe's answer too
                    print(f"  {precision} batch {batch}: {type(e).__name__}: {e}")
                    row = {"precision": precision, "batch": batch, "error": str(e)}
                rows.append(dict(row, device=dev.name, driver=d.driver_version,
                                 supported=True))
    print(f"results: {_common.write_json('cmdbuf_probe', {'rows': rows}, args.json)}")
    return 1 if any("error" in r or r.get("bitwise_equal") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
