"""The bounded pool, with an injected allocator: PoCL never fails an allocation."""

import gc
import mmap
import sys

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clnn
from clnn import memory
from clnn.memory import Pool, bin_size


class FlakyAllocator:
    """Real allocations, except that the next ``fail`` calls raise like a full device."""

    def __init__(self, dev):
        self.dev = dev
        self.fail = 0
        self.calls = 0

    def __call__(self, nbytes):
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise MemoryError("injected CL_MEM_OBJECT_ALLOCATION_FAILURE")
        return cl.Buffer(self.dev.context, cl.mem_flags.READ_WRITE, nbytes)


@pytest.fixture
def pool(dev):
    alloc = FlakyAllocator(dev)
    p = Pool(dev.context, dev.queue, budget=1 << 20, max_alloc=1 << 19, allocator=alloc)
    p.injected = alloc
    return p


def test_bins_round_up_by_less_than_an_eighth():
    for n in [1, 255, 256, 257, 1000, 4097, 10**6, 3 * 10**8]:
        b = bin_size(n)
        assert b >= n and (b <= 256 or b - n < b / 8)
        assert bin_size(b) == b


def test_freed_blocks_are_reused(pool):
    a = pool(5000)
    assert pool.allocations == 1 and pool.active_bytes == bin_size(5000)
    del a
    assert pool.held_bytes == bin_size(5000) and pool.active_bytes == 0
    b = pool(4900)          # same bin
    assert pool.allocations == 1
    c = pool(5000)          # the bin's only block is in use: a new one
    assert pool.allocations == 2 and b is not c


def test_a_capture_reuses_its_own_temporaries_only(dev):
    """Inside programs.captured(reuse=True), a block only the capture's launch records
    refer to is free again for the captured code's next request (its launches replay
    in the same order); a plain capture keeps it; and once the capture is over the
    block is the capture's: active, neither reused nor released."""
    from clnn import programs
    from clnn.ops._args import dev_scratch
    pool, n = dev.pool, 12345                 # (a size no other test asks for)

    def temporary():
        buf = dev_scratch(dev, n, np.float32)
        programs.copy_buffer(dev, buf, buf, 4, dst_offset=4)   # a launch that uses it
        return buf
    for reuse in (True, False):
        with programs.captured(reuse=reuse) as launches:
            first = temporary()
            del first                           # only the record refers to it now
            second = temporary()
        assert (launches[0][3][1] is second) == reuse
        del second
        active = pool.active_bytes
        pool.free_held()                        # the capture's blocks stay
        assert pool.active_bytes == active and launches[0][3][1] in \
            pool._bins[bin_size(4 * n)]
        third = dev_scratch(dev, n, np.float32)
        assert all(third is not v for _, _, _, values in launches for v in values)
        del third, launches
        gc.collect()


def test_views_keep_a_block_active(dev, pool):
    import pyopencl.array as cla
    x = cla.empty(dev.queue, (1000,), np.float32, allocator=pool)
    v = x[10:20]
    del x
    assert pool.active_bytes == bin_size(4000)
    del v
    assert pool.active_bytes == 0


def test_request_over_max_alloc_or_budget_fails_at_once(pool):
    with pytest.raises(clnn.OutOfDeviceMemory) as e:
        pool((1 << 19) + 1)
    assert "max allocation" in str(e.value) and e.value.request == (1 << 19) + 1
    pool.budget = 1 << 18
    with pytest.raises(clnn.OutOfDeviceMemory, match="whole budget"):
        pool((1 << 18) + 4096)
    assert pool.injected.calls == 0


def test_over_budget_releases_held_blocks_first(pool):
    blocks = [pool(200_000) for _ in range(4)]       # 4 x 204800 bytes of a 1 MiB budget
    del blocks
    assert pool.held_bytes == 4 * bin_size(200_000)
    big = pool(500_000)                              # does not fit beside the held blocks
    assert pool.held_bytes == 0
    assert pool.real_bytes == bin_size(500_000) <= pool.budget
    del big


def test_over_budget_with_live_blocks_raises_with_the_numbers(pool):
    keep = [pool(300_000) for _ in range(3)]
    with pytest.raises(clnn.OutOfDeviceMemory) as e:
        pool(300_000)
    err = e.value
    assert err.budget == 1 << 20 and err.active == 3 * bin_size(300_000) and err.held == 0
    assert "budget" in str(err) and "active" in str(err)
    assert len(keep) == 3


def test_opencl_allocation_failure_is_retried_once_after_freeing(pool):
    held = pool(100_000)
    del held
    pool.injected.fail = 1
    blk = pool(300_000)                       # first try fails, pool frees held, retries
    assert blk is not None and pool.held_bytes == 0
    pool.injected.fail = 2
    with pytest.raises(clnn.OutOfDeviceMemory, match="failed in OpenCL"):
        pool(300_000)


def test_reference_cycles_are_collected_before_giving_up(pool):
    class Node:
        pass
    live = pool(450_000)
    n = Node()
    n.self = n
    n.buf = pool(450_000)
    del n                           # only a reference cycle holds the second block now
    gc.disable()
    try:
        blk = pool(450_000)         # no room for a third: gc.collect() frees the second
        assert blk is not None and blk is not live and pool.allocations == 2
    finally:
        gc.enable()


def test_thousands_of_ops_with_temporaries_stay_in_a_small_budget(dev):
    """The tutorial's failure: temporaries of async ops piling up. Here they are reused."""
    budget = 2 << 20
    dev.pool.free_held()
    old = dev.pool.budget
    dev.pool.budget = budget
    dev.pool.reset_peak()
    try:
        x = clnn.asarray(np.linspace(-1, 1, 50_000, dtype=np.float32))
        for _ in range(2000):
            t = clnn.sigmoid(x)                 # a 200 kB temporary each time
            s = clnn.sum(clnn.hadamard(t, t))   # more temporaries and workspace
            del t
        assert dev.pool.peak_bytes <= budget
        assert np.isfinite(s.get())
    finally:
        dev.pool.budget = old


def test_device_pool_budget_from_environment(monkeypatch):
    from clnn.device import DeviceFacts, _default_budget
    facts = DeviceFacts("p", "d", "v", "CPU", "1", "OpenCL 1.2", 1, 256, (256,), 32768,
                        1 << 30, 4 << 30, False, False)
    monkeypatch.setenv("CLNN_POOL_BYTES", "123456")
    assert _default_budget(facts) == 123456
    monkeypatch.delenv("CLNN_POOL_BYTES")
    assert 0 < _default_budget(facts) < 4 << 30
    monkeypatch.setenv("CLNN_POOL_BYTES", "lots")
    with pytest.raises(clnn.DeviceError):
        _default_budget(facts)


def test_arrays_come_from_the_pool(dev):
    before = dev.pool.requests
    x = clnn.asarray(np.zeros(10, np.float32))
    y = clnn.sigmoid(x)
    assert dev.pool.requests >= before + 2
    assert y.allocator is dev.pool


def _vm_flags(addr):
    """The VmFlags of the mapping of this process that holds ``addr`` (proc(5))."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_huge_pages_are_asked_for_under_large_blocks_of_a_cpu(dev):
    """A CPU device's pool asks Linux for huge pages ("hg" among the mapping's
    flags) under a new block of two huge pages or more, found by mapping it; the
    data in it is what was written, and ops on it compute as anywhere."""
    cpu = bool(dev.cl_device.type & cl.device_type.CPU)
    # the device's own pool asks where Linux gives huge pages on request, on a CPU
    assert dev.pool.huge_page == (memory.huge_page_size() if cpu else 0)
    if not cpu or not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip(f"the advice is for a CPU device's host memory on Linux; {dev.name} "
                    f"on {sys.platform} is not one")
    page = 2 << 20
    p = Pool(dev.context, dev.queue, budget=1 << 30, max_alloc=1 << 30, huge_page=page)
    n = 3 * page + 12345
    block = p(n)
    arr, _ = cl.enqueue_map_buffer(dev.queue, block, cl.map_flags.READ, 0, (n,), np.uint8)
    addr = arr.__array_interface__["data"][0]
    lo = -(-addr // page) * page
    arr.base.release(dev.queue)
    assert "hg" in _vm_flags(lo)
    # and the contents: an array in an advised block, summed as numpy sums it
    host = np.random.default_rng(5).standard_normal(n // 4, dtype=np.float32)
    x = cla.to_device(dev.queue, host, allocator=p)
    assert x.base_data.int_ptr != block.int_ptr          # a block of its own
    np.testing.assert_array_equal(x.get(), host)
    got = clnn.sum(x).get()
    ref = host.astype(np.float64).sum()
    assert abs(got - ref) <= 2 * (host.size + 8) * np.finfo(np.float32).eps * \
        np.abs(host.astype(np.float64)).sum()


def test_huge_page_size_follows_linux_mode(tmp_path, monkeypatch):
    """Huge pages are asked for only where Linux gives them on request: in "always"
    mode every large allocation has them already, in "never" none."""
    monkeypatch.delenv("CLNN_HUGE_PAGES", raising=False)
    (tmp_path / "hpage_pmd_size").write_text("2097152\n")
    monkeypatch.setattr(memory, "_THP", str(tmp_path) + "/")
    for mode, want in (("always [madvise] never", 2097152), ("[always] madvise never", 0),
                       ("always madvise [never]", 0)):
        (tmp_path / "enabled").write_text(mode + "\n")
        assert memory.huge_page_size() == want, mode
    monkeypatch.setenv("CLNN_HUGE_PAGES", "0")
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    assert memory.huge_page_size() == 0
    monkeypatch.delenv("CLNN_HUGE_PAGES")
    (tmp_path / "enabled").unlink()                 # no transparent huge pages at all
    assert memory.huge_page_size() == 0
