"""Replayed training steps (train_step(replay=True), fit's default): the kernels of a
step's forward and backward passes, captured once and enqueued again without the
Python that chose them, give bitwise the results of steps that run it; networks,
losses and settings that replay cannot serve run as before."""

import functools
import os
import sys

import numpy as np
import pytest

import clnn
from clnn import cmdbuf, nn, optim, programs, tuning
from clnn.ops import optim as optim_ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import race  # noqa: E402
from test_reliability import FailAt  # noqa: E402

RNG = np.random.default_rng(8)


def lenet(dev, seed=3):
    return nn.Sequential([nn.Conv2d(4, 3, activation="relu"), nn.MaxPool2d(2),
                          nn.Conv2d(5, 3, padding=1, activation="tanh"), nn.AvgPool2d(2),
                          nn.Flatten(), nn.Dense(11, "sigmoid"), nn.Dense(7, "softmax")],
                         in_shape=(2, 13, 13), seed=seed, device=dev)


def mlp(dev, seed=3):
    return nn.Sequential([nn.Dense(17, "tanh"), nn.Dense(5, "softmax")], in_features=9,
                         seed=seed, device=dev)


def data(dev, n, in_shape, classes):
    x = RNG.standard_normal((n,) + in_shape).astype(np.float32)
    y = np.eye(classes, dtype=np.float32)[RNG.integers(0, classes, n)]
    return clnn.asarray(x, device=dev), clnn.asarray(y, device=dev)


def same_weights(a, b):
    return all(np.array_equal(p.get(), q.get()) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("make,in_shape,classes", [(lenet, (2, 13, 13), 7), (mlp, (9,), 5)],
                         ids=["lenet", "mlp"])
@pytest.mark.parametrize("loss", ["cross_entropy", "quadratic"])
def test_replayed_steps_are_bitwise_the_steps(dev, make, in_shape, classes, loss):
    """Six steps each way, the learning rate and optimizer state changing between them
    (Adam's bias corrections, a new lr): the same losses and weights, bit for bit; and
    from the third step on nothing of the passes' Python runs."""
    x, y = data(dev, 6, in_shape, classes)
    nets = [make(dev), make(dev)]
    for net in nets:
        net.optimizer = optim.Adam(lr=0.01)
    losses = [[], []]
    for step in range(6):
        for i, net in enumerate(nets):
            if step == 4:
                net.optimizer.lr = 0.003
            losses[i].append(net.train_step(x, y, loss=loss, replay=i == 1).get())
    assert [v.tobytes() for v in losses[0]] == [v.tobytes() for v in losses[1]]
    assert same_weights(*nets)
    (rep,) = nets[1]._replays.values()
    assert rep.launches and not nets[0]._replays
    calls = []
    real = programs.get_kernel

    def counting(*a, **k):
        calls.append(a[2])
        return real(*a, **k)
    try:
        programs.get_kernel = counting
        with clnn.profile() as prof:
            nets[1].train_step(x, y, loss=loss, replay=True)
    finally:
        programs.get_kernel = real
    # the update's kernel is chosen in Python every step; the passes' are replayed
    assert calls == [prof.records[-1].entry] and prof.launches == len(rep.launches) + 1


def test_a_captured_step_reuses_its_temporaries(dev, monkeypatch):
    """A step's temporaries (padded copies, packed panels, workspaces) go back to the
    pool inside the capture as in a plain step, so the replayed launches use fewer
    blocks than a capture that kept each one (whose kernels, on a CIFAR CNN, ran 20-40%
    slower, their temporaries no longer in the cache), with bitwise the same steps.
    (A GPU's direct weight gradients, convw.cl, which sum the bias too, leave this
    small network's step without temporaries to reuse: the tiled GEMMs here.)"""
    from clnn.ops import conv as conv_module
    monkeypatch.setattr(conv_module, "WGRAD_DIRECT", False)
    x, y = data(dev, 6, (2, 13, 13), 7)
    blocks, losses = [], []
    for reuse in (True, False):
        if not reuse:       # the capture counts no references: nothing is reused
            monkeypatch.setattr(clnn.memory, "count_references", lambda values: None)
        net = lenet(dev)
        losses.append([net.train_step(x, y, replay=True).get() for _ in range(4)])
        (rep,) = net._replays.values()
        blocks.append(len({id(v) for _, _, _, values in rep.launches for v in values
                           if isinstance(v, clnn.memory.cl.MemoryObjectHolder)}))
    assert blocks[0] < blocks[1]
    assert [v.tobytes() for v in losses[0]] == [v.tobytes() for v in losses[1]]


def test_fit_replays_and_gives_the_same_history(dev):
    """fit (replay on by default) against fit with it off: shuffled batches with a
    partial last one, three epochs, momentum: the same history and weights."""
    x = RNG.standard_normal((23, 2, 13, 13)).astype(np.float32)
    labels = RNG.integers(0, 7, 23)
    results = []
    for replay in (True, False):
        net = lenet(dev)
        hist = net.fit(x, labels, loss="cross_entropy", epochs=3, batch_size=8, lr=0.05,
                       momentum=0.9, seed=5, progress=False, replay=replay)
        results.append((net, hist))
    (a, ha), (b, hb) = results
    assert ha["loss"] == hb["loss"] and same_weights(a, b)
    assert len(a._replays) == 2 and all(r.launches for r in a._replays.values())
    assert not b._replays


def test_batch_norm_replays_with_its_running_statistics(dev):
    """BatchNorm's forward counts the batch for after_step in Python: a replayed step
    hands the count back (step_state), so the running statistics move as in plain
    steps, and predict after training gives the same outputs."""
    x, y = data(dev, 6, (2, 13, 13), 7)

    def make():
        return nn.Sequential([nn.Conv2d(4, 3, bias=False), nn.BatchNorm2d(4, activation="relu"),
                              nn.MaxPool2d(2), nn.Flatten(), nn.Dense(8, bias=False),
                              nn.BatchNorm1d(8, momentum=None), nn.Dense(7, "softmax")],
                             in_shape=(2, 13, 13), seed=2, device=dev)
    nets = [make(), make()]
    for step in range(5):
        for i, net in enumerate(nets):
            net.train_step(x, y, 0.1, loss="cross_entropy", replay=i == 1)
    assert same_weights(*nets)
    assert any(r.launches for r in nets[1]._replays.values())
    for a, b in zip(nets[0].layers, nets[1].layers):
        for name, v in a.state().items():
            w = b.state()[name]
            assert (np.array_equal(v.get(), w.get()) if hasattr(v, "get") else v == w), name
    assert np.array_equal(nets[0].predict(x), nets[1].predict(x))


@pytest.mark.parametrize("offset", [0, 3])
def test_dropout_replays_with_each_steps_masks(dev, offset):
    """Dropout draws a new key every step: replayed steps put it into the captured
    forward and backward dropout kernels, so they drop what plain steps drop (a
    Dropout with p=0 launches none); also with a batch that starts ``offset``
    examples into a global one (data-parallel ranks). A replay that kept the
    captured key would repeat one mask and fail this."""
    x, y = data(dev, 6, (9,), 5)

    def make():
        return nn.Sequential([nn.Dense(8, "relu"), nn.Dropout(0.5), nn.Dense(6, "tanh"),
                              nn.Dropout(0.0), nn.Dense(7, "relu"), nn.Dropout(0.3),
                              nn.Dense(5, "softmax")], in_features=9, seed=1, device=dev)
    nets = [make(), make()]
    losses = [[], []]
    for step in range(6):
        for i, net in enumerate(nets):
            losses[i].append(net.train_step(x, y, 0.1, loss="cross_entropy",
                                            example_offset=offset, replay=i == 1).get())
    assert [v.tobytes() for v in losses[0]] == [v.tobytes() for v in losses[1]]
    assert same_weights(*nets)
    (rep,) = nets[1]._replays.values()
    assert rep.launches and [(layer, sum(1 for p in rep.patches if p[2] == layer))
                             for layer in (1, 3, 5)] == [(1, 2), (3, 0), (5, 2)]
    assert len({v.tobytes() for v in losses[1][2:]}) == 4    # the masks moved


def test_a_dropout_key_no_layer_drew_is_never_replayed(dev, monkeypatch):
    """A captured dropout launch whose key matches no layer's key for the step (a
    layer that drew its own) cannot be given the next step's: that step shape runs in
    full from then on."""
    x, y = data(dev, 6, (9,), 5)
    net = nn.Sequential([nn.Dense(8, "relu"), nn.Dropout(0.5), nn.Dense(5, "softmax")],
                        in_features=9, seed=1, device=dev)
    drop = net.layers[1]
    real = drop.forward
    monkeypatch.setattr(drop, "forward", lambda x, out, key=0, **k: real(x, out, key=key + 1,
                                                                          **k))
    for _ in range(4):
        net.train_step(x, y, 0.1, loss="cross_entropy", replay=True)
    (rep,) = net._replays.values()
    assert rep.disabled and rep.launches is None


def test_what_replay_does_not_serve_runs_as_before(dev):
    """Steps under a tuning override run every step in full."""
    x, y = data(dev, 6, (9,), 5)
    net = mlp(dev)
    row = tuning.gemm_params(dev.facts)
    with tuning.override("gemm", row):
        for _ in range(3):
            net.train_step(x, y, 0.1, loss="cross_entropy", replay=True)
    assert not net._replays


@pytest.mark.parametrize("where", ["device", "host"])
def test_float16_steps_replay_across_loss_scales(dev, monkeypatch, where):
    """Mixed-precision steps replay too. Where the loss scale lives on the device (no
    hook), the captured loss kernel reads it there: one capture serves every scale
    (growth every 3 steps here). A hook keeps the scale on the host, an argument of the
    captured loss kernel, so a new scale captures anew (seen, captured, replayed). Both
    give the same losses, weights and scale history as plain float16 steps."""
    replays, casts = [], []
    real = cmdbuf.replay           # (programs.replay, or command buffers where asked for)
    monkeypatch.setattr(cmdbuf, "replay", lambda launches, owner: replays.append(1) or
                        real(launches, owner))
    # (the gradients' cast, where the scale lives on the device, is cast_gradients,
    # which marks the state)
    for module, name in ((clnn, "cast"), (optim_ops, "cast_gradients")):
        monkeypatch.setattr(module, name, functools.partial(
            lambda real, *a, **kw: casts.append(1) or real(*a, **kw),
            getattr(module, name)))
    per_step = []
    x, y = data(dev, 6, (2, 13, 13), 7)
    nets = [lenet(dev), lenet(dev)]
    losses = [[], []]
    hook = (lambda step: None) if where == "host" else None
    for net in nets:
        net.scaler = nn.GradScaler(init_scale=4.0, growth_interval=3)
    for step in range(7):
        for i, net in enumerate(nets):
            casts.clear()
            losses[i].append(net.train_step(x, y, 0.1, loss="cross_entropy", hook=hook,
                                            precision="float16", replay=i == 1).get())
            if i == 1:
                per_step.append(len(casts))
    assert [v.tobytes() for v in losses[0]] == [v.tobytes() for v in losses[1]]
    assert same_weights(*nets) and nets[0].scaler.scale == nets[1].scaler.scale == 16.0
    # device: steps 3 to 7; host: the third step of scales 4 and 8
    assert len(replays) == (5 if where == "device" else 2)
    # the casts to and from float16 (the masters' copy, x and y, the gradients; the
    # loss comes out in float32) are in the capture: a replayed step makes none from
    # Python
    assert per_step[:2] == [4, 4]
    if where == "device":
        assert per_step[2:] == [0] * 5


def test_a_capture_that_runs_out_of_memory_falls_back(dev):
    """Capturing holds all of a step's temporaries at once: where that does not fit,
    the step runs again uncaptured (it changes no weight before its update) and that
    batch shape is never captured again; the results stay those of plain steps."""
    x, y = data(dev, 6, (2, 13, 13), 7)
    nets = [lenet(dev), lenet(dev)]
    nets[0].train_step(x, y, 0.1, loss="cross_entropy")
    nets[1].train_step(x, y, 0.1, loss="cross_entropy", replay=True)    # seen once
    pool = dev.pool
    fail = FailAt(pool, at=1)                 # during the capture
    pool.allocate = fail
    try:
        nets[1].train_step(x, y, 0.1, loss="cross_entropy", replay=True)
    finally:
        del pool.allocate
    nets[0].train_step(x, y, 0.1, loss="cross_entropy")
    assert fail.count > 3 and same_weights(*nets)
    (rep,) = nets[1]._replays.values()
    assert rep.disabled and rep.launches is None
    for net in nets:
        net.train_step(x, y, 0.1, loss="cross_entropy", replay=net is nets[1])
    assert same_weights(*nets) and rep.launches is None


def test_the_hook_still_sees_every_step(dev):
    x, y = data(dev, 6, (9,), 5)
    seen = []
    net = mlp(dev)
    for _ in range(4):
        net.train_step(x, y, 0.1, loss="cross_entropy", replay=True,
                       hook=lambda info: seen.append(float(info.flat_grads.get()[0])))
    assert len(seen) == 4 and list(net._replays.values())[0].launches


def test_captured_copies_are_replayed(dev):
    """clnn.copy enqueues a buffer copy, not a kernel: a capture records it like a
    launch (a Dropout with p=0 copies in both passes), so a replay repeats it."""
    x = clnn.asarray(np.arange(10, dtype=np.float32), device=dev)
    out = clnn.empty((10,), np.float32, dev)
    with programs.captured() as launches:
        clnn.copy(x[2:9], out=out[1:8])
    assert [k.entry for k, *_ in launches] == ["copy"]
    out.fill(0)
    x.set(np.arange(10, 20, dtype=np.float32))
    programs.replay(launches).wait()
    assert np.array_equal(out.get(), [0] + list(range(12, 19)) + [0, 0])


def _plain_forward(net, x, logits=False):
    """The inference pass without replay (what _run captures), as a numpy array."""
    xd = net._input(x)
    return net._forward_eval(xd, net._infer[(xd.shape[0], xd.dtype.name)], logits).get()


def test_inference_replays_and_follows_the_weights(dev, monkeypatch):
    """predict and __call__ replay from the third pass with a batch size: new inputs
    each time, training steps in between (weights, BatchNorm's running statistics
    and a Dropout, which is the identity here); bitwise what the layers' own pass
    gives, and no kernel chosen in Python."""
    net = nn.Sequential([nn.Conv2d(4, 3, bias=False), nn.BatchNorm2d(4, activation="relu"),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.3), nn.Dense(8, "tanh"),
                         nn.Dense(7, "softmax")], in_shape=(2, 13, 13), seed=2, device=dev)
    x, y = data(dev, 6, (2, 13, 13), 7)
    calls = []
    real = programs.get_kernel
    for i in range(6):
        xs = RNG.standard_normal((5, 2, 13, 13)).astype(np.float32)
        if i == 4:
            monkeypatch.setattr(programs, "get_kernel",
                                lambda *a, **k: calls.append(a[2]) or real(*a, **k))
        got = net.predict(xs)
        monkeypatch.setattr(programs, "get_kernel", real)
        assert got.tobytes() == _plain_forward(net, xs).tobytes()
        assert net(clnn.asarray(xs, device=dev)).get().tobytes() == got.tobytes()
        net.train_step(x, y, 0.1, loss="cross_entropy")
    assert calls == [] and any(r.launches for r in net._infer_replays.values())


def test_evaluate_replays_with_the_same_results(dev):
    """evaluate's batches (views of one array at other offsets, a shorter last batch)
    replay their logits passes: the same loss and accuracy as passes run in full, in
    float32 and float16."""
    net = lenet(dev)
    x = RNG.standard_normal((23, 2, 13, 13)).astype(np.float32)
    labels = RNG.integers(0, 7, 23)
    y = np.eye(7, dtype=np.float32)[labels]
    for precision in (None, "float16"):
        first = net.evaluate(x, y, "cross_entropy", batch_size=5, precision=precision)
        for _ in range(2):
            assert net.evaluate(x, y, "cross_entropy", batch_size=5,
                                precision=precision) == first
        assert any(r.launches for r in net._infer_replays.values())
        plain = net._forward_eval(net._input(x[:5]), net._infer[(5, "float32")], True) \
            if precision is None else None
        if plain is not None:
            replayed = net._run(net._input(x[:5]), logits=True)
            assert replayed.get().tobytes() == plain.get().tobytes()


def test_an_inference_capture_that_runs_out_of_memory_falls_back(dev):
    net = lenet(dev)
    xs = RNG.standard_normal((3, 2, 13, 13)).astype(np.float32)
    want = net.predict(xs)
    pool = dev.pool
    fail = FailAt(pool, at=2)             # (0: the input's upload)
    pool.allocate = fail
    try:
        got = net.predict(xs)             # the capture fails, the pass runs in full
    finally:
        del pool.allocate
    assert got.tobytes() == want.tobytes()
    (rep,) = net._infer_replays.values()
    assert rep.disabled and rep.launches is None
    assert net.predict(xs).tobytes() == want.tobytes()


def test_a_changed_setting_captures_anew(dev, monkeypatch):
    """A captured step or inference pass keeps the kernels chosen when it was captured;
    a change of a setting those choices read (a module attribute of the ops: here the
    CPU GEMM's limits for reading operands in place) captures anew, as clear_caches()
    does."""
    x, y = data(dev, 6, (9,), 5)
    net = mlp(dev)
    for _ in range(3):
        net.train_step(x, y, 0.1, loss="cross_entropy", replay=True)
        net.predict(x)
    gemm_module = sys.modules["clnn.ops.gemm"]
    monkeypatch.setattr(gemm_module, "DIRECT_M", 0)
    monkeypatch.setattr(gemm_module, "DIRECT_FLOPS", 0)
    for _ in range(3):
        with clnn.profile() as step:
            net.train_step(x, y, 0.1, loss="cross_entropy", replay=True)
        with clnn.profile() as infer:
            net.predict(x)
    if dev.facts.is_cpu:
        for prof in (step, infer):
            entries = {r.entry for r in prof.records}
            assert "clnn_gemm_packed" in entries and "clnn_gemm_direct" not in entries
    assert any(r.launches for r in net._replays.values())
    assert any(r.launches for r in net._infer_replays.values())


def test_threads_sharing_a_network_get_their_own_results(dev):
    """predict from several threads at once (a server's request threads) on one
    network, replayed passes and plain ones mixed, and a training thread between
    them: every thread gets its own input's output, as from one thread."""
    net = lenet(dev)
    inputs = [RNG.standard_normal((3, 2, 13, 13)).astype(np.float32) for _ in range(4)]
    x, y = data(dev, 6, (2, 13, 13), 7)
    errors = []

    def serve(k):
        try:
            for _ in range(25):
                with net._lock:           # (the expected output at this moment)
                    got = net.predict(inputs[k])
                    want = _plain_forward(net, inputs[k])
                assert got.tobytes() == want.tobytes()
                got = net.predict(inputs[k])        # racing the other threads
                assert got.shape == (3, 7) and np.allclose(got.sum(1), 1, atol=1e-5)
        except Exception as exc:      # noqa: BLE001 - reported below
            errors.append(exc)

    def train():
        for _ in range(10):
            net.train_step(x, y, 0.01, loss="cross_entropy", replay=True)

    race(*(functools.partial(serve, k) for k in range(4)), train)
    assert not errors, errors[0]
    # with the weights still, threads racing each other get exactly their outputs
    want = [net.predict(v) for v in inputs]
    results = {}

    def predict_all(k):
        results[k] = [net.predict(inputs[k]).tobytes() for _ in range(30)]
    race(*(functools.partial(predict_all, k) for k in range(4)))
    for k in range(4):
        assert set(results[k]) == {want[k].tobytes()}
