"""Replayed launches as command buffers (clnn.cmdbuf, CLNN_COMMAND_BUFFERS=1): the
same results, bit for bit, as replaying launch by launch. Where the test device lacks
cl_khr_command_buffer (pip's PoCL 3.0) an emulation of the extension's entry points
stands in for them (the graph's runs, copies between them, the turns of a device
without simultaneous use); the extension itself runs where the device has it."""

import os
import sys

import numpy as np
import pyopencl as cl
import pytest

import clnn
from clnn import cmdbuf, nn, optim, programs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "nn"))
from test_replay import data, lenet, same_weights  # noqa: E402

RNG = np.random.default_rng(12)


class FakeApi:
    """cmdbuf.Api's calls done with plain enqueues: a "command buffer" is the list of
    its commands, each with the kernel object of its own cmdbuf.command_kernel makes,
    its arguments set when it is recorded (as the extension keeps them)."""

    def __init__(self, simultaneous=False):
        self.simultaneous = simultaneous
        self.recorded, self.runs, self.released, self.waits = [], 0, 0, 0

    def record(self, queue, launches):
        cmds, kernels = [], []
        for kern, gs, ls, values in launches:
            k = cmdbuf.command_kernel(kern, values)
            kernels.append(k)
            cmds.append((k, gs, ls))
        buf = (queue, cmds)
        self.recorded.append(buf)
        return buf, kernels

    def run(self, buf):
        queue, cmds = buf
        self.runs += 1
        for k, gs, ls in cmds:
            evt = cl.enqueue_nd_range_kernel(queue, k, gs, ls)
        return _Watched(evt, self)

    def release(self, buf):
        self.released += 1


class _Watched:
    """An event whose waits are counted."""

    def __init__(self, evt, api):
        self.evt, self.api = evt, api

    def wait(self):
        self.api.waits += 1
        self.evt.wait()


@pytest.fixture
def fake(monkeypatch, dev):
    """CLNN_COMMAND_BUFFERS=1 and the emulated extension on the test device."""
    api = FakeApi()
    monkeypatch.setenv("CLNN_COMMAND_BUFFERS", "1")
    monkeypatch.setattr(cmdbuf, "has", lambda cl_device: True)
    monkeypatch.setattr(cmdbuf, "api", lambda cl_device: api)
    return api


def captured_ops(dev, n=1000):
    """Launches of three element-wise ops with a buffer copy between the second and
    third, captured, and their arrays."""
    x = clnn.asarray(RNG.standard_normal(n).astype(np.float32), device=dev)
    a, b, c, d = (clnn.empty((n,), np.float32, dev) for _ in range(4))
    with programs.captured() as launches:
        clnn.relu(x, out=a)
        clnn.tanh(a, out=b)
        clnn.copy(b, out=c)
        clnn.sigmoid(c, out=d)
    return launches, x, (a, b, c, d)


def test_runs_of_kernels_become_command_buffers_around_copies(dev, fake):
    """Two runs of kernels around the copy: two buffers per set, two sets where the
    device cannot enqueue a pending buffer again, used in turn (the older set's last
    run waited for); the results those of the launches."""
    launches, x, outs = captured_ops(dev)
    assert [type(k).__name__ for k, *_ in launches] == ["Kernel", "Kernel", "_BufferCopy",
                                                      "Kernel"]

    class Owner:
        pass
    owner = Owner()
    for v in outs:
        v.fill(0)
    for step in range(3):
        x.set(RNG.standard_normal(x.shape).astype(np.float32))
        cmdbuf.replay(launches, owner)
        want = 1 / (1 + np.exp(-np.tanh(np.maximum(x.get().astype(np.float64), 0))))
        np.testing.assert_allclose(outs[3].get(), want, rtol=1e-5, atol=1e-6)
        assert owner.graph.turn == (step + 1) % 2
    assert len(fake.recorded) == 4 and fake.runs == 6
    assert fake.waits == 1                  # the first set's second run, its third
    graph = owner.graph
    graph.release()
    assert fake.released == 4


def test_a_device_with_simultaneous_use_records_once(dev, fake):
    fake.simultaneous = True
    launches, x, outs = captured_ops(dev)

    class Owner:
        pass
    owner = Owner()
    for _ in range(3):
        cmdbuf.replay(launches, owner)
    assert len(owner.graph.sets) == 1 and len(fake.recorded) == 2 and fake.waits == 0


def test_no_command_buffers_unless_asked_and_had(dev, monkeypatch):
    """Without CLNN_COMMAND_BUFFERS=1, or where the device lacks the extension, replay
    enqueues the launches one by one (no graph is made)."""
    launches, x, outs = captured_ops(dev)

    class Owner:
        graph = None
    monkeypatch.delenv("CLNN_COMMAND_BUFFERS", raising=False)
    monkeypatch.setattr(cmdbuf, "has", lambda cl_device: True)
    cmdbuf.replay(launches, Owner)
    assert Owner.graph is None
    monkeypatch.setenv("CLNN_COMMAND_BUFFERS", "1")
    monkeypatch.setattr(cmdbuf, "has", lambda cl_device: False)
    cmdbuf.replay(launches, Owner)
    assert Owner.graph is None
    np.testing.assert_allclose(outs[3].get(), 1 / (1 + np.exp(-np.tanh(np.maximum(
        x.get().astype(np.float64), 0)))), rtol=1e-5, atol=1e-6)


def test_a_profiled_replay_runs_launch_by_launch(dev, fake):
    """clnn.profile() sees each kernel of a replay, as without command buffers."""
    launches, x, outs = captured_ops(dev)

    class Owner:
        graph = None
    with clnn.profile() as prof:
        cmdbuf.replay(launches, Owner)
    assert Owner.graph is None and prof.launches == 4


def steps(dev, net, x, y, n=5):
    net.optimizer = optim.SGD(lr=0.05, momentum=0.9)
    return [net.train_step(x, y, loss="cross_entropy", replay=True).get() for _ in range(n)]


@pytest.mark.parametrize("precision", [None, "float16"])
def test_training_steps_from_command_buffers_are_bitwise_the_replays(dev, fake, monkeypatch,
                                                                     precision):
    """Five steps of a small CNN through (emulated) command buffers: the losses and
    weights of five replayed launch by launch, bit for bit; its inference passes too."""
    x, y = data(dev, 6, (2, 13, 13), 7)
    nets = [lenet(dev), lenet(dev)]
    runs = []
    for i, net in enumerate(nets):
        if i == 0:
            monkeypatch.setenv("CLNN_COMMAND_BUFFERS", "0")
        else:
            monkeypatch.setenv("CLNN_COMMAND_BUFFERS", "1")
        net.optimizer = optim.SGD(lr=0.05, momentum=0.9)
        runs.append([net.train_step(x, y, loss="cross_entropy", replay=True,
                                    precision=precision).get() for _ in range(5)])
        runs[-1].append(net.predict(x.get()))
        runs[-1].append(net.predict(x.get()))
    assert [v.tobytes() for v in runs[0]] == [v.tobytes() for v in runs[1]]
    assert same_weights(*nets)
    (rep,) = nets[1]._replays.values()
    assert isinstance(rep.graph, cmdbuf.Graph) and nets[0]._replays
    assert all(r.graph is None for r in nets[0]._replays.values())
    assert fake.runs >= 3


def test_steps_whose_launches_change_replay_launch_by_launch(dev, fake):
    """Dropout's key goes into its launches every step: such a step makes no graph."""
    x, y = data(dev, 6, (9,), 5)
    net = nn.Sequential([nn.Dense(17, "tanh"), nn.Dropout(0.3), nn.Dense(5, "softmax")],
                        in_features=9, seed=3, device=dev)
    net.optimizer = optim.SGD(lr=0.05)
    for _ in range(4):
        net.train_step(x, y, loss="cross_entropy", replay=True)
    (rep,) = net._replays.values()
    assert rep.patches and rep.graph is None and fake.runs == 0


def test_the_extension_where_the_device_has_it(dev, monkeypatch):
    """On a device with cl_khr_command_buffer (Debian's PoCL 3.1, GPUs whose driver has
    it), training steps from real command buffers are bitwise the replays."""
    if not cmdbuf.has(dev.queue.device):
        pytest.skip(f"{dev.name} has no {cmdbuf.EXTENSION} (pip's PoCL 3.0 never has; "
                    "Debian's PoCL 3.1 and some GPU drivers do)")
    x, y = data(dev, 6, (2, 13, 13), 7)
    nets = [lenet(dev), lenet(dev)]
    losses = []
    for i, net in enumerate(nets):
        monkeypatch.setenv("CLNN_COMMAND_BUFFERS", str(i))
        losses.append(steps(dev, net, x, y))
    assert [v.tobytes() for v in losses[0]] == [v.tobytes() for v in losses[1]]
    assert same_weights(*nets)
    (rep,) = nets[1]._replays.values()
    assert isinstance(rep.graph, cmdbuf.Graph)      # recorded, not refused


def test_a_refused_recording_replays_launch_by_launch(dev, fake, caplog):
    """Where the driver refuses to record (a command it does not take), a warning says
    so, the buffers recorded before are released, and the launches replay one by one
    with the same results, without another try."""
    launches, x, outs = captured_ops(dev)

    record = fake.record

    def refuse(queue, launches):            # the second run of kernels, after the copy
        if len(fake.recorded) == 1:
            fake.recorded.append(None)
            raise cl.RuntimeError("clCommandNDRangeKernelKHR (clnn_relu) failed: -59")
        return record(queue, launches)
    fake.record = refuse

    class Owner:
        graph = None
    with caplog.at_level("WARNING", logger="clnn"):
        for _ in range(3):
            x.set(RNG.standard_normal(x.shape).astype(np.float32))
            cmdbuf.replay(launches, Owner)
            np.testing.assert_allclose(outs[3].get(), 1 / (1 + np.exp(-np.tanh(np.maximum(
                x.get().astype(np.float64), 0)))), rtol=1e-5, atol=1e-6)
    # (the buffer recorded before the refusal released)
    assert isinstance(Owner.graph, cmdbuf.Refused) and len(fake.recorded) == 2
    assert fake.released == 1 and fake.runs == 0
    assert [r.message for r in caplog.records].count(
        f"clnn: replaying launch by launch: {dev.name} could not record command buffers "
        "(clCommandNDRangeKernelKHR (clnn_relu) failed: -59)") == 1
