"""clnn.profile: every kernel a block launches, with profiled device times, and the
block's wall time."""

import threading

import numpy as np
import pytest

import clnn
from clnn import nn, tuning
from clnn.profiler import KernelRecord

RNG = np.random.default_rng(5)


def test_a_block_records_each_launch_with_its_times(dev):
    x = clnn.asarray(RNG.standard_normal((37, 23)).astype(np.float32), device=dev)
    w = clnn.asarray(RNG.standard_normal((23, 11)).astype(np.float32), device=dev)
    clnn.relu(clnn.gemm(x, w))                    # built outside the block
    with clnn.profile() as prof:
        y = clnn.gemm(x, w)
        clnn.relu(y, out=y)
        clnn.relu(y, out=y)
    assert prof.launches == len(prof.records) >= 3
    assert [r.entry for r in prof.records].count("clnn_act_forward") == 2
    for r in prof.records:
        assert r.queued_ns <= r.start_ns <= r.end_ns and r.seconds >= 0
        assert all(isinstance(n, int) and n > 0 for n in r.global_size)
        if r.local_size is not None:
            assert len(r.local_size) == len(r.global_size)
            assert all(g % l == 0 for g, l in zip(r.global_size, r.local_size))
    # an in-order queue: each kernel starts after the one before it ends
    for a, b in zip(prof.records, prof.records[1:]):
        assert b.start_ns >= a.end_ns
    assert 0 < prof.device_s <= prof.span_s <= prof.wall_s
    assert prof.idle_s == pytest.approx(prof.span_s - prof.device_s, abs=1e-12)
    summary = prof.summary()
    assert sum(n for _, n, _ in summary) == prof.launches
    assert sum(t for _, _, t in summary) == pytest.approx(prof.device_s)
    assert [t for _, _, t in summary] == sorted((t for _, _, t in summary), reverse=True)
    acts = [row for row in summary if row[0] == "clnn_act_forward"]
    assert acts and acts[0][1] == 2
    text = prof.table(per=2)
    assert "clnn_act_forward" in text and "per step" in text and "idle" in text


def test_nothing_outside_the_block_or_from_other_threads(dev):
    x = clnn.asarray(np.ones(64, np.float32), device=dev)
    clnn.relu(x)
    with clnn.profile() as outer:
        clnn.relu(x)
        t = threading.Thread(target=lambda: [clnn.relu(x) for _ in range(5)])
        t.start()
        t.join()
        with clnn.profile() as inner:          # nested: both see the inner launches
            clnn.sigmoid(x)
    clnn.relu(x)
    assert [r.entry for r in inner.records] == ["clnn_act_forward"]
    assert len(outer.records) == 2 and inner.records[0] in outer.records
    assert inner.records[0].params["act"] == "sigmoid"
    with clnn.profile() as empty:
        pass
    assert empty.launches == 0 and empty.device_s == empty.span_s == 0.0
    assert empty.wall_s >= 0 and "0 launches" in empty.table()


def test_labels_tell_dtypes_and_tiles_apart():
    def rec(params):
        return KernelRecord("clnn_gemm_tiled", "gemm", params, (64, 1, 1), (64, 1, 1), 0, 1,
                            2)
    tile = tuning.template_tuning({"variant": "local", "MWG": 128, "NWG": 64, "KWG": 16,
                                   "MDIMC": 16, "NDIMC": 16})
    assert rec({"dtype": "float32", "tuning": tile}).label == "clnn_gemm_tiled [128x64]"
    mma = tuning.template_tuning(next(
        r for r in tuning.MMA_TABLE[("nvidia", "GPU")] if r["MMA"] == "f16" and
        (r["MWG"], r["NWG"]) == (128, 256) and not r.get("LDSM")), "float16")
    assert rec({"dtype": "float16", "tuning": mma}).label == \
        "clnn_gemm_tiled [float16, 128x256 f16]"
    assert rec({"dtype": "float32"}).label == "clnn_gemm_tiled"


def test_a_training_step_profiled(dev):
    """What benchmarks/profile_step.py prints: a step's kernels, every one of them
    recorded (the optimizer's update last), and the step's result unchanged by it."""
    net = nn.Sequential([nn.Dense(13, "tanh"), nn.Dense(3, "softmax")], in_features=7,
                        seed=0, device=dev)
    twin = nn.Sequential([nn.Dense(13, "tanh"), nn.Dense(3, "softmax")], in_features=7,
                         seed=0, device=dev)
    x = clnn.asarray(RNG.standard_normal((9, 7)).astype(np.float32), device=dev)
    y = clnn.asarray(np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 9)], device=dev)
    twin.train_step(x, y, 0.1, loss="cross_entropy")
    with clnn.profile() as prof:
        net.train_step(x, y, 0.1, loss="cross_entropy")
    assert prof.records[-1].entry.startswith("clnn_sgd")
    assert any(r.entry == "clnn_softmax_xent_head" for r in prof.records)   # 9 rows
    for a, b in zip(net.parameters(), twin.parameters()):
        assert np.array_equal(a.get(), b.get())


def test_replayed_steps_are_profiled_launch_by_launch(dev):
    """A replayed step enqueues its captured launches without recording them, unless
    something records: under clnn.profile every replayed kernel is there, as many as
    in the plain step, and both give the same weights."""
    nets = [nn.Sequential([nn.Dense(13, "tanh"), nn.Dense(3, "softmax")], in_features=7,
                          seed=0, device=dev) for _ in range(2)]
    x = clnn.asarray(RNG.standard_normal((9, 7)).astype(np.float32), device=dev)
    y = clnn.asarray(np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 9)], device=dev)
    counts = []
    for step in range(4):
        with clnn.profile() as prof:
            nets[0].train_step(x, y, 0.1, loss="cross_entropy", replay=True)
        counts.append(len(prof.records))
        nets[1].train_step(x, y, 0.1, loss="cross_entropy")
    assert nets[0]._replays and list(nets[0]._replays.values())[0].launches
    # (the first step also zeroes what it allocates; the second is captured, the
    # third and fourth replayed)
    assert counts[2] == counts[3] == counts[1] > 2
    for a, b in zip(*(net.parameters() for net in nets)):
        assert np.array_equal(a.get(), b.get())


def test_a_queue_without_profiling_computes_and_refuses_to_be_timed(dev, monkeypatch):
    """CLNN_PROFILING=0 (for measuring what profiling events cost a launch): the
    device's queue keeps no timestamps, its ops compute as before, and clnn.profile()
    and the tuner's kernel times say why they cannot time it instead of failing in
    the driver."""
    import pyopencl as cl
    from clnn.device import Device
    from clnn.errors import DeviceError
    from clnn.tuner import median_kernel_time
    import sys
    monkeypatch.setenv("CLNN_PROFILING", "0")
    quiet = Device(dev.cl_device)          # a second device on the test's OpenCL device,
    monkeypatch.setitem(sys.modules["clnn.device"]._by_context,     # known by its arrays
                        quiet.context.int_ptr, quiet)
    assert dev.profiling and not quiet.profiling
    assert not quiet.queue.properties & cl.command_queue_properties.PROFILING_ENABLE
    a = RNG.standard_normal((29, 13)).astype(np.float32)
    x = clnn.asarray(a, device=quiet)
    assert np.array_equal(clnn.relu(x).get(), np.maximum(a, 0))
    with pytest.raises(DeviceError, match="CLNN_PROFILING=0"):
        with clnn.profile():
            clnn.relu(x)
    with pytest.raises(DeviceError, match="CLNN_PROFILING=0"):
        median_kernel_time(lambda: clnn.relu(x), quiet, 1)
    # the profiled device next to it is timed as ever
    with clnn.profile() as prof:
        clnn.relu(clnn.asarray(a, device=dev))
    assert prof.launches >= 1
