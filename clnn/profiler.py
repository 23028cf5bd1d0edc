"""Where a block's time goes: every kernel it launches, with its device time from
OpenCL profiling events, beside the block's wall time.

    with clnn.profile() as prof:
        net.train_step(x, y, loss="cross_entropy")
    print(prof.table())

Every device queue clnn opens profiles, so this costs one record per launch. The
numbers that matter for a training step:

- ``device_s``: the kernels' own time, summed (an in-order queue runs one at a time);
- ``span_s``: from the first kernel's start to the last one's end;
- ``idle_s``: span minus device time, the device waiting between kernels, for the host
  to launch the next one (a small layer on a GPU: its kernels take microseconds, the
  Python and the driver around each take tens);
- ``wall_s``: the block, from entry to the end of its last kernel (the exit waits for
  them), so wall minus span is the host's time before the first kernel started and the
  wait for completion.

Only kernels are recorded: copies to and from the host (``.get()``, ``asarray``) and
fills by PyOpenCL are not, and neither are other threads' launches.
"""

import contextlib
import dataclasses
import time

import pyopencl as cl

from . import programs
from .errors import DeviceError


@dataclasses.dataclass(frozen=True)
class KernelRecord:
    """One launch: the kernel's name (``entry``, with its tile for GEMM rows: see
    ``label``), its template and parameters, its global and local sizes (None: the
    driver's choice) and its profiled times in nanoseconds on the device's clock."""
    entry: str
    stem: str
    params: dict
    global_size: tuple
    local_size: tuple
    queued_ns: int
    start_ns: int
    end_ns: int

    @property
    def seconds(self):
        return 1e-9 * (self.end_ns - self.start_ns)

    @property
    def label(self):
        """``entry`` plus what tells its variants apart in a table: the storage dtype
        when not float32, and a GEMM row's tile (``128x128`` or ``128x128 tf32``)."""
        p, extra = self.params, []
        if p.get("dtype", "float32") != "float32":
            extra.append(p["dtype"])
        tiles = dict(p.get("tuning", ()))
        if "MWG" in tiles:
            extra.append(f"{tiles['MWG']}x{tiles['NWG']}"
                         + (f" {tiles['MMA']}" if "MMA" in tiles else ""))
        return self.entry + (f" [{', '.join(extra)}]" if extra else "")


class Profile:
    """What ``clnn.profile()`` recorded; complete once its block has exited."""

    def __init__(self):
        self._launches = []
        self.records = []
        self.wall_s = None

    def _finish(self):
        if self._launches:
            cl.wait_for_events([evt for *_, evt in self._launches])
        enabled = cl.command_queue_properties.PROFILING_ENABLE
        off = {evt.command_queue.device.name for *_, evt in self._launches
               if not evt.command_queue.properties & enabled}
        if off:
            self._launches = []
            raise DeviceError(f"clnn.profile() reads profiling events, and {sorted(off)} "
                              f"ran without them here (CLNN_PROFILING=0)")
        self.records = [KernelRecord(k.entry, getattr(k, "stem", "?"),
                                     dict(getattr(k, "params", {})), gs,
                                     None if ls is None else tuple(ls),
                                     evt.profile.queued, evt.profile.start, evt.profile.end)
                        for k, gs, ls, evt in self._launches]
        self._launches = []

    @property
    def launches(self):
        return len(self.records)

    @property
    def device_s(self):
        return sum(r.seconds for r in self.records)

    @property
    def span_s(self):
        if not self.records:
            return 0.0
        return 1e-9 * (max(r.end_ns for r in self.records) -
                       min(r.start_ns for r in self.records))

    @property
    def idle_s(self):
        return max(0.0, self.span_s - self.device_s)

    def summary(self):
        """[(label, launches, device seconds)], the most time first."""
        groups = {}
        for r in self.records:
            n, t = groups.get(r.label, (0, 0.0))
            groups[r.label] = (n + 1, t + r.seconds)
        return sorted(((label, n, t) for label, (n, t) in groups.items()),
                      key=lambda row: -row[2])

    def table(self, top=None, per=1):
        """The summary as text, with times divided by ``per`` (e.g. the number of
        training steps profiled): wall, span, device and idle time, then each kernel."""
        f = 1e3 / per
        rows = self.summary()[:top]
        head = (f"wall {f * (self.wall_s or 0.0):.3f} ms, span {f * self.span_s:.3f} ms, "
                f"device {f * self.device_s:.3f} ms, idle {f * self.idle_s:.3f} ms, "
                f"{self.launches / per:g} launches" + (" (per step)" if per != 1 else ""))
        width = max([len(label) for label, _, _ in rows] + [6])
        lines = [head, f"{'kernel':<{width}}  launches   device ms   share"]
        total = self.device_s or 1.0
        for label, n, t in rows:
            lines.append(f"{label:<{width}}  {n / per:8g}  {f * t:10.3f}  {100 * t / total:5.1f}%")
        return "\n".join(lines)


@contextlib.contextmanager
def profile():
    """Record every kernel this thread launches inside the block (see the module's
    docstring); the Profile is complete when the block exits, which waits for them."""
    prof = Profile()
    t0 = time.perf_counter()
    try:
        with programs.recording("profiles", prof._launches):
            yield prof
    finally:
        prof._finish()
        prof.wall_s = time.perf_counter() - t0
