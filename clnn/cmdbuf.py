"""Replayed launches as OpenCL command buffers (cl_khr_command_buffer), where asked for.

A replayed training step (clnn.programs.replay) makes one clSetKernelArg pass and one
clEnqueueNDRangeKernel per captured launch: on a GPU that host time is most of a small
network's step (a LeNet-5 step on an H200: 0.6 ms for 25 launches). The extension
records the launches once and enqueues them in one call. ``replay(launches, owner)``
does so where the device lists the extension and ``CLNN_COMMAND_BUFFERS=1`` asks for
it (no default yet: no GPU has timed it, benchmarks/cmdbuf_probe.py measures it);
elsewhere, and while anything records this thread's launches (clnn.profile, a
capture), it is programs.replay.

How: the extension's entry points come from the platform
(clGetExtensionFunctionAddressForPlatform through the ICD loader PyOpenCL runs on),
called through ctypes with the raw handles PyOpenCL holds. Each run of kernel launches
becomes one command buffer (buffer copies in between are enqueued as they are); every
command gets a kernel object of its own, with the launch's arguments set on it. The
extension records the arguments with the command, but PoCL 3.1 reads them from the
kernel object when the buffer is enqueued: a kernel object launched twice in a step
ran both commands with its last arguments there. A device that cannot enqueue a
buffer still pending again (no simultaneous use) gets two copies, used in turn, the
older one's last run waited for before it runs again.
"""

import ctypes
import functools
import os

import pyopencl as cl

from . import programs

EXTENSION = "cl_khr_command_buffer"
# the extension's header (cl_ext.h)
DEVICE_CAPABILITIES = 0x12A9
FLAGS = 0x1293
SIMULTANEOUS_USE = 1 << 0
CAPABILITY_SIMULTANEOUS_USE = 1 << 2


def asked():
    """Whether CLNN_COMMAND_BUFFERS=1 asks for command buffers."""
    return os.environ.get("CLNN_COMMAND_BUFFERS", "0") == "1"


def _loader():
    """The OpenCL ICD loader PyOpenCL runs on (its wheel bundles one)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libOpenCL" in os.path.basename(path):
                    return ctypes.CDLL(path)
    except OSError:
        pass
    return ctypes.CDLL("libOpenCL.so.1")


def device_uint64(cl_device, param):
    """A 64-bit device query PyOpenCL does not know (the extension's), 0 where the
    driver answers none."""
    lib = _loader()
    info = lib.clGetDeviceInfo
    info.restype = ctypes.c_int32
    info.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p,
                     ctypes.c_void_p]
    value = ctypes.c_uint64(0)
    info(cl_device.int_ptr, param, 8, ctypes.byref(value), None)
    return value.value


def command_kernel(kern, values):
    """A kernel object of its own for one recorded launch of ``kern`` (a
    programs.Kernel) with its argument ``values`` set (see the module's docstring)."""
    k = cl.Kernel(kern.cl_kernel.program, kern.cl_kernel.function_name)
    k.set_scalar_arg_dtypes(kern.types)
    k.set_args(*values)
    return k


class Api:
    """The extension's entry points on one device's platform, and the device's
    capabilities; ``api(cl_device)`` makes them once per device."""

    def __init__(self, cl_device):
        P, I, U, S = ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32, ctypes.c_size_t
        lib = _loader()
        address = lib.clGetExtensionFunctionAddressForPlatform
        address.restype, address.argtypes = P, [P, ctypes.c_char_p]
        platform = cl_device.platform.int_ptr

        def entry(name, res, *args):
            where = address(platform, name.encode())
            if not where:
                raise RuntimeError(f"the platform lists {EXTENSION} but has no {name}")
            return ctypes.CFUNCTYPE(res, *args)(where)
        self.create = entry("clCreateCommandBufferKHR", P, U, ctypes.POINTER(P), P,
                            ctypes.POINTER(I))
        self.ndrange = entry("clCommandNDRangeKernelKHR", I, P, P, P, P, U, P,
                             ctypes.POINTER(S), ctypes.POINTER(S), U, P, P, P)
        self.finalize = entry("clFinalizeCommandBufferKHR", I, P)
        self.enqueue = entry("clEnqueueCommandBufferKHR", I, U, P, P, U, P,
                             ctypes.POINTER(P))
        self.release = entry("clReleaseCommandBufferKHR", I, P)
        caps = device_uint64(cl_device, DEVICE_CAPABILITIES)
        self.simultaneous = bool(caps & CAPABILITY_SIMULTANEOUS_USE)

    def record(self, queue, launches):
        """A finalized command buffer of kernel ``launches`` on ``queue``, and the
        kernel objects its commands run (theirs alone: see the module's docstring)."""
        P, I, S = ctypes.c_void_p, ctypes.c_int32, ctypes.c_size_t
        q = P(queue.int_ptr)
        props = (ctypes.c_uint64 * 3)(FLAGS, SIMULTANEOUS_USE, 0) \
            if self.simultaneous else None
        err = I(0)
        buf = self.create(1, ctypes.byref(q), props, ctypes.byref(err))
        if err.value:
            raise cl.RuntimeError(f"clCreateCommandBufferKHR failed: {err.value}")
        kernels = []
        try:
            for kern, gs, ls, values in launches:
                k = command_kernel(kern, values)
                kernels.append(k)
                rc = self.ndrange(buf, None, None, k.int_ptr, len(gs), None,
                                  (S * len(gs))(*gs), (S * len(ls))(*ls) if ls else None,
                                  0, None, None, None)
                if rc:
                    raise cl.RuntimeError(f"clCommandNDRangeKernelKHR ({kern.entry}) "
                                          f"failed: {rc}")
            rc = self.finalize(buf)
            if rc:
                raise cl.RuntimeError(f"clFinalizeCommandBufferKHR failed: {rc}")
        except Exception:
            self.release(buf)
            raise
        return buf, kernels

    def run(self, buf):
        """Enqueue the command buffer ``buf`` (on the queue it was recorded for); its
        event, a pyopencl.Event."""
        evt = ctypes.c_void_p()
        rc = self.enqueue(0, None, buf, 0, None, ctypes.byref(evt))
        if rc:
            raise cl.RuntimeError(f"clEnqueueCommandBufferKHR failed: {rc}")
        return cl.Event.from_int_ptr(evt.value, retain=False)


@functools.lru_cache(maxsize=None)
def api(cl_device):
    """The Api of ``cl_device`` (a pyopencl.Device, hashed by its handle), made once."""
    return Api(cl_device)


def has(cl_device):
    return EXTENSION in cl_device.extensions.split()


class Graph:
    """Captured ``launches`` recorded for ``queue``: each run of kernel launches one
    command buffer, other launches (buffer copies) as they are; two sets of buffers,
    used in turn, where the device cannot enqueue a pending one again. ``run()``
    enqueues them in order and returns the last event."""

    def __init__(self, api_, queue, launches):
        self.api = api_
        self.launches = launches
        self.kernels = []
        self.sets = []
        try:
            for _ in range(1 if api_.simultaneous else 2):
                items = []
                self.sets.append([items, None])        # (items, the last run's event)
                run = []
                for launch in launches + [None]:
                    if launch is not None and isinstance(launch[0], programs.Kernel):
                        run.append(launch)
                        continue
                    if run:
                        buf, kernels = api_.record(queue, run)
                        items.append((buf, None))
                        self.kernels.append(kernels)
                        run = []
                    if launch is not None:
                        items.append((None, launch))
        except Exception:
            self.release()           # the buffers recorded before the one refused
            raise
        self.turn = 0

    def run(self):
        items_last = self.sets[self.turn]
        self.turn = (self.turn + 1) % len(self.sets)
        items, last = items_last
        if last is not None and not self.api.simultaneous:
            last.wait()              # its buffers may not be pending when enqueued again
        evt = None
        for buf, launch in items:
            if buf is not None:
                evt = self.api.run(buf)
            else:
                kern, gs, ls, values = launch
                evt = kern.launch(gs, ls, values, record=False)
        items_last[1] = evt
        return evt

    def release(self):
        for items, _ in self.sets:
            for buf, _ in items:
                if buf is not None:
                    self.api.release(buf)
        self.sets = []

    def __del__(self):
        try:
            self.release()
        except Exception:       # (at exit the entry points may be gone)
            pass


class Refused:
    """What ``owner.graph`` holds where recording ``launches`` failed: they replay
    launch by launch from then on."""

    def __init__(self, launches):
        self.launches = launches


def replay(launches, owner):
    """programs.replay(launches), from command buffers kept on ``owner.graph`` (any
    object; made on the first call) where the device has the extension and
    CLNN_COMMAND_BUFFERS=1 asks for it, and nothing records this thread's launches.
    The launches' arguments must not change afterwards (callers whose steps patch
    them, Dropout's keys, call programs.replay). Where the driver refuses to record
    them (a command it does not take, a queue it cannot record for), a warning says
    why and they replay launch by launch, without another try."""
    dev = next((k.device for k, *_ in launches if isinstance(k, programs.Kernel)), None)
    if dev is None or not asked() or programs.recording_active() or \
            not has(dev.queue.device):
        return programs.replay(launches)
    graph = getattr(owner, "graph", None)
    if graph is None or graph.launches is not launches:
        try:
            graph = Graph(api(dev.queue.device), dev.queue, launches)
        except (cl.Error, RuntimeError, OSError, AttributeError) as e:
            programs.log.warning("clnn: replaying launch by launch: %s could not record "
                                 "command buffers (%s)", dev.name, e)
            graph = Refused(launches)
        owner.graph = graph
    if isinstance(graph, Refused):
        return programs.replay(launches)
    return graph.run()
