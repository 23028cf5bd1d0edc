"""A bounded buffer pool: every device allocation clnn makes goes through it.

The tutorial this project grew from died with CL_MEM_OBJECT_ALLOCATION_FAILURE: an
asynchronous queue let temporaries pile up faster than the driver freed them. The pool
answers that with a byte budget and a fixed escalation when a request does not fit:

1. reuse a free block of the request's size bin;
2. release held (free) blocks, wait for the queue, collect garbage, and look again;
3. only then raise ``OutOfDeviceMemory``, naming request, budget, active and held bytes.

An OpenCL allocation failure takes step 2 once. New blocks are made real at once
(migrated to the device) so failures surface at allocation, not at a later launch.

How freed blocks are found: ``pyopencl.Buffer`` objects can be neither weakly
referenced nor subclassed around an existing ``cl_mem``, so the pool keeps every block
it made in its own lists and treats a block that nothing else refers to (no array,
no view) as free. Reusing it at once is safe because clnn has one in-order queue per
device: a kernel enqueued later cannot overtake one still reading the old contents.
"""

import contextlib
import ctypes
import gc
import math
import mmap
import numbers
import os
import sys
import threading

import numpy as np
import pyopencl as cl

from .errors import ArgumentError, OutOfDeviceMemory

_MIN_BLOCK = 256          # bytes; also keeps sub-256-byte requests in one bin
_BIN_BITS = 4             # size bins keep 4 leading bits: under 1/8 of a block wasted


# References to pool blocks held by the launch records of sequences this thread is
# capturing for replay (programs.captured(reuse=True)), a dict of id(block) ->
# references per capture: a block that only those records refer to is free again for
# the capture's own later requests (see Pool._free_blocks).
_captures = threading.local()


@contextlib.contextmanager
def capture_references():
    """Count, inside the block, the references a captured sequence's records hold
    (``count_references`` adds them); blocks nest."""
    outer = getattr(_captures, "counts", ())
    counts = {}
    _captures.counts = outer + (counts,)
    try:
        yield counts
    finally:
        _captures.counts = outer


def count_references(values):
    """A launch's argument ``values`` went into every capture counting references."""
    for counts in getattr(_captures, "counts", ()):
        for v in values:
            if isinstance(v, cl.MemoryObjectHolder):
                counts[id(v)] = counts.get(id(v), 0) + 1


# Huge pages for host memory (CPU devices): a kernel streaming through a buffer of
# PoCL's on 4 KiB pages ran at 19-24 GB/s on the 2-core Xeon and the same kernel on
# memory in 2 MiB pages (numpy's, which asks for them) at 32-35: at 4 KiB a page the
# TLB misses bound it. Where Linux hands out transparent huge pages only on request
# ("madvise" mode, Debian's default), the pool asks for them on each new block of two
# huge pages or more.
_THP = "/sys/kernel/mm/transparent_hugepage/"


def huge_page_size():
    """The transparent huge page's size in bytes where asking for them (madvise) is
    what it takes to get them, else 0: not Linux, Linux without them, or in "always"
    mode (every large allocation gets them anyway) or "never". CLNN_HUGE_PAGES=0 says
    0 too (to compare, or to keep a process's memory in small pages)."""
    if os.environ.get("CLNN_HUGE_PAGES", "1") == "0" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return 0
    try:
        with open(_THP + "enabled") as f:
            if "[madvise]" not in f.read():
                return 0
        with open(_THP + "hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


_libc = None


def advise_huge_pages(queue, buf, nbytes, page):
    """Ask Linux for huge pages (of ``page`` bytes) under the whole ones of a new
    buffer's host memory, before anything touches it (it is touched page by page on
    first use, each then a huge page). The memory is found by mapping the buffer: a CPU
    device's map of its own buffer is that memory (PoCL's: measured). Not mapped in
    place, the advice falls on a copy and changes nothing; refused (a kernel without
    transparent huge pages), it changes nothing either."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    # (not blocking: the pointer comes at once, and nothing waits for the queue)
    arr, _ = cl.enqueue_map_buffer(queue, buf, cl.map_flags.WRITE_INVALIDATE_REGION, 0,
                                   (nbytes,), np.uint8, is_blocking=False)
    try:
        addr = arr.__array_interface__["data"][0]
        lo, hi = -(-addr // page) * page, (addr + nbytes) // page * page
        if hi > lo:
            _libc.madvise(lo, hi - lo, mmap.MADV_HUGEPAGE)
    finally:
        arr.base.release(queue)


def bin_size(nbytes):
    """The block size serving ``nbytes``: rounded up to 4 significant bits."""
    n = max(int(nbytes), _MIN_BLOCK)
    shift = max(0, n.bit_length() - _BIN_BITS)
    return -(-n >> shift) << shift


def _is_alloc_failure(exc):
    if isinstance(exc, MemoryError):
        return True
    code = getattr(exc, "code", None)
    return code in (cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
                    cl.status_code.OUT_OF_RESOURCES, cl.status_code.OUT_OF_HOST_MEMORY)


def _budget_bytes(nbytes):
    if isinstance(nbytes, (bool, str, bytes)) or not isinstance(nbytes, numbers.Real) or \
            not math.isfinite(nbytes) or nbytes < 1:
        raise ArgumentError(f"pool budget must be a positive, finite number of bytes, got "
                            f"{nbytes!r}")
    return int(nbytes)


def _fmt(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


class Pool:
    """Callable allocator for ``pyopencl.array.Array`` with a byte budget.

    ``allocator(nbytes) -> pyopencl.Buffer`` makes real allocations; the default one
    creates the buffer and migrates it to the device, and where ``huge_page`` is a
    page size (a CPU device, whose buffers are host memory) asks for huge pages under
    each block of two pages or more (advise_huge_pages). Tests inject one that fails
    on demand, since PoCL allocates lazily and never fails.
    """

    def __init__(self, context, queue, *, budget, max_alloc, allocator=None, exact=False,
                 huge_page=0):
        self.context = context
        # exact: no rounding to size bins, so Oclgrind sees any access past an array's
        # end (a rounded block would hide it in its slack); reuse needs the same size.
        self.exact = exact
        self.queue = queue
        self.max_alloc = int(max_alloc)
        self._budget = _budget_bytes(budget)
        self._allocator = allocator or self._cl_allocate
        self.huge_page = int(huge_page)
        self._bins = {}              # block size -> [Buffer]
        self._lock = threading.RLock()
        self.real_bytes = 0          # bytes of all blocks the pool holds (active + free)
        self.peak_bytes = 0
        self.allocations = 0         # real OpenCL allocations made
        self.requests = 0
        self._watching = threading.local()

    # ------------------------------------------------------------ budget
    @property
    def budget(self):
        return self._budget

    @budget.setter
    def budget(self, nbytes):
        nbytes = _budget_bytes(nbytes)
        with self._lock:
            self._budget = nbytes
            if self.real_bytes > nbytes:
                self.free_held()

    # ------------------------------------------------------------ counters
    def _free_blocks(self, size, reuse=False):
        # A block is free when only its bin list refers to it: getrefcount then counts
        # the list's reference and the one it takes for its own argument. For reuse
        # by a request made while this thread captures launches for replay, also one
        # that only the capture's records refer to: replays enqueue the launches in
        # the same order, so a later launch writes it after every earlier one that
        # used it, as it did when captured (a step's temporaries, each kept by the
        # capture, would otherwise all be distinct blocks: more memory, and a replayed
        # CIFAR CNN's kernels 20-40% slower than the same step's uncaptured ones, its
        # temporaries no longer in the cache). Never for anyone else: held blocks
        # (stats, free_held) exclude those.
        blocks = self._bins.get(size, ())
        counts = getattr(_captures, "counts", ()) if reuse else ()
        if not counts:
            return [i for i in range(len(blocks)) if sys.getrefcount(blocks[i]) == 2]
        return [i for i in range(len(blocks)) if sys.getrefcount(blocks[i]) ==
                2 + sum(c.get(id(blocks[i]), 0) for c in counts)]

    def stats(self):
        """Counters: active/held/peak/real bytes, real allocations, requests, budget."""
        with self._lock:
            held = 0
            for size, blocks in self._bins.items():
                held += size * len(self._free_blocks(size))
            return {"budget": self._budget, "active_bytes": self.real_bytes - held,
                    "held_bytes": held, "real_bytes": self.real_bytes,
                    "peak_bytes": self.peak_bytes, "allocations": self.allocations,
                    "requests": self.requests}

    @property
    def active_bytes(self):
        return self.stats()["active_bytes"]

    @property
    def held_bytes(self):
        return self.stats()["held_bytes"]

    def reset_peak(self):
        self.peak_bytes = self.real_bytes

    # ------------------------------------------------------------ allocation
    def __call__(self, nbytes):
        buf = self.allocate(nbytes)
        for requests in getattr(self._watching, "lists", ()):
            requests.append((int(nbytes), buf))
        return buf

    @contextlib.contextmanager
    def watching(self):
        """Every request this thread makes of the pool inside the block, as (bytes
        asked for, block given) in a list (clnn/ops/_memo.py plans an op's
        temporaries with it); blocks nest."""
        outer = getattr(self._watching, "lists", ())
        requests = []
        self._watching.lists = outer + (requests,)
        try:
            yield requests
        finally:
            self._watching.lists = outer

    def allocate(self, nbytes):
        nbytes = int(nbytes)
        with self._lock:
            self.requests += 1
            size = max(nbytes, 1) if self.exact else bin_size(nbytes)
            if nbytes > self.max_alloc or size > self._budget:
                raise self._error(nbytes, "exceeds the device's max allocation size "
                                  f"({_fmt(self.max_alloc)})" if nbytes > self.max_alloc
                                  else "is larger than the pool's whole budget")
            blk = self._reuse(size)
            if blk is not None:
                return blk
            if self.real_bytes + size > self._budget:
                blk = self._make_room(size)
                if blk is not None:
                    return blk
                if self.real_bytes + size > self._budget:
                    raise self._error(nbytes, "does not fit in the budget even after "
                                      "releasing held blocks and waiting for the queue")
            try:
                buf = self._allocator(size)
            except Exception as exc:  # noqa: BLE001 - classified just below
                if not _is_alloc_failure(exc):
                    raise
                blk = self._make_room(size)
                if blk is not None:
                    return blk
                try:
                    buf = self._allocator(size)
                except Exception as exc2:  # noqa: BLE001
                    if not _is_alloc_failure(exc2):
                        raise
                    raise self._error(nbytes, f"failed in OpenCL ({exc2}) even after "
                                      "releasing held blocks") from exc2
            self._bins.setdefault(size, []).append(buf)
            self.allocations += 1
            self.real_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.real_bytes)
            return buf

    def _reuse(self, size):
        free = self._free_blocks(size, reuse=True)
        return self._bins[size][free[0]] if free else None

    def _make_room(self, size):
        """Release held blocks, wait for in-flight kernels, collect garbage; then retry."""
        self.free_held()
        # Released cl_mem objects still used by enqueued kernels are only really freed
        # once those kernels finish.
        self.queue.finish()
        gc.collect()           # arrays caught in reference cycles return their blocks
        blk = self._reuse(size)
        if blk is None:
            self.free_held()
        return blk

    def free_held(self):
        """Give every free block back to OpenCL."""
        with self._lock:
            for size in list(self._bins):
                free = set(self._free_blocks(size))
                if free:
                    blocks = self._bins[size]
                    self._bins[size] = [b for i, b in enumerate(blocks) if i not in free]
                    self.real_bytes -= size * len(free)
                if not self._bins[size]:
                    del self._bins[size]

    def _error(self, nbytes, why):
        s = self.stats()
        return OutOfDeviceMemory(
            f"device allocation of {_fmt(nbytes)} ({nbytes} bytes) {why}: budget "
            f"{_fmt(s['budget'])}, active {_fmt(s['active_bytes'])}, held "
            f"{_fmt(s['held_bytes'])} (set CLNN_POOL_BYTES or device.pool.budget)",
            request=nbytes, budget=s["budget"], active=s["active_bytes"], held=s["held_bytes"])

    def _cl_allocate(self, nbytes):
        buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
        # Make the allocation real now, so an out-of-memory device says so here.
        cl.enqueue_migrate_mem_objects(self.queue, [buf], flags=0)
        if self.huge_page and nbytes >= 2 * self.huge_page:
            advise_huge_pages(self.queue, buf, nbytes, self.huge_page)
        return buf
