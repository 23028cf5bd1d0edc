"""The network API: gradients against finite differences, a training step against a
float64 numpy implementation of the same equations, allocation counts, persistence and
bad input."""

import os

import numpy as np
import pytest

import clnn
from clnn import nn
from conftest import assert_step_gradients, assert_steps_allocate_nothing
from reference import df_ref, f_ref

RNG = np.random.default_rng(77)
ACTS = ["identity", "sigmoid", "tanh", "relu", "leaky_relu", "elu", "softplus"]


def small_net(acts, widths=(5, 4, 3), seed=0, dtype=np.float64):
    return nn.Sequential([nn.Dense(w, a) for w, a in zip(widths[1:], acts)], widths[0],
                         dtype=dtype, seed=seed)


def loss_of(net, x, y, loss):
    out = net(x)
    if loss == "cross_entropy":
        a = out.get()
        return float(-(y * np.log(a)).sum() / len(x))
    return float(clnn.quadratic_loss(out, clnn.asarray(y))[0].get())


def gradients_by_step(net, x, y, loss):
    """dL/dW, dL/db from one plain SGD step with lr=1: W_new = W - dL/dW."""
    before = [(l.weight.get(), l.bias.get()) for l in net.layers]
    clnn.nn.sgd(net, x, y, loss=loss, epochs=1, lr=1.0)
    grads = [(w - l.weight.get(), b - l.bias.get()) for (w, b), l in zip(before, net.layers)]
    for (w, b), l in zip(before, net.layers):
        l.weight.set(w)
        l.bias.set(b)
    return grads


@pytest.mark.parametrize("act", ACTS)
def test_backward_matches_finite_differences(dev, act):
    """Each activation in a hidden and an output layer, float64, quadratic loss."""
    net = small_net([act, act], seed=3)
    x = RNG.standard_normal((6, 5))
    y = RNG.standard_normal((6, 3))
    grads = gradients_by_step(net, x, y, "quadratic")
    h = 1e-6
    for li, layer in enumerate(net.layers):
        for name, g in (("weight", grads[li][0]), ("bias", grads[li][1])):
            p = getattr(layer, name)
            base = p.get()
            num = np.zeros_like(base)
            for idx in np.ndindex(base.shape):
                for sign in (1, -1):
                    q = base.copy()
                    q[idx] += sign * h
                    p.set(q)
                    num[idx] += sign * loss_of(net, x, y, "quadratic") / (2 * h)
            p.set(base)
            np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-7,
                                       err_msg=f"{act} layer {li} {name}")


def test_softmax_cross_entropy_backward_matches_finite_differences(dev):
    net = small_net(["tanh", "softmax"], seed=4)
    x = RNG.standard_normal((5, 5))
    y = np.eye(3)[[0, 2, 1, 1, 0]]
    grads = gradients_by_step(net, x, y, "cross_entropy")
    h = 1e-6
    w = net.layers[0].weight
    base = w.get()
    for idx in [(0, 0), (2, 3), (3, 4)]:
        vals = []
        for sign in (1, -1):
            q = base.copy()
            q[idx] += sign * h
            w.set(q)
            vals.append(loss_of(net, x, y, "cross_entropy"))
        w.set(base)
        assert abs(grads[0][0][idx] - (vals[0] - vals[1]) / (2 * h)) < 1e-7


def numpy_steps(params, acts, x, y, lr, momentum, steps):
    """The four backprop equations with momentum, float64, batch-first."""
    params = [(w.copy(), b.copy()) for w, b in params]
    vel = [(np.zeros_like(w), np.zeros_like(b)) for w, b in params]
    n = len(x)
    losses = []
    for _ in range(steps):
        zs, a = [], [x]
        for (w, b), act in zip(params, acts):
            zs.append(a[-1] @ w.T + b)
            a.append(f_ref(act, zs[-1], 0.01))
        losses.append(((a[-1] - y) ** 2).sum() / (2 * n))
        delta = (a[-1] - y) * df_ref(acts[-1], zs[-1], 0.01)
        new = []
        for i in range(len(params) - 1, -1, -1):
            w, b = params[i]
            below = (delta @ w) * df_ref(acts[i - 1], zs[i - 1], 0.01) if i else None
            vw, vb = vel[i]
            vw = momentum * vw - lr / n * delta.T @ a[i]
            vb = momentum * vb - lr / n * delta.sum(0)
            vel[i] = (vw, vb)
            new.append((w + vw, b + vb))
            delta = below
        params = new[::-1]
    return params, losses


def test_training_steps_match_numpy(dev):
    acts = ["tanh", "relu", "sigmoid"]
    net = small_net(acts, widths=(7, 6, 5, 4), seed=5)
    x = RNG.standard_normal((9, 7))
    y = RNG.random((9, 4))
    start = [(l.weight.get(), l.bias.get()) for l in net.layers]
    want, want_losses = numpy_steps(start, acts, x, y, lr=0.3, momentum=0.8, steps=4)
    got_losses = nn.sgd(net, x, y, schedule=[(1, 0.3)] * 4, momentum=0.8)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-12)
    for (w, b), layer in zip(want, net.layers):
        np.testing.assert_allclose(layer.weight.get(), w, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(layer.bias.get(), b, rtol=1e-11, atol=1e-13)


def test_sgd_returns_the_last_forward_loss(dev):
    net = small_net(["sigmoid", "sigmoid"], seed=1, dtype=np.float32)
    x = RNG.random((8, 5)).astype(np.float32)
    y = RNG.random((8, 3)).astype(np.float32)
    before = loss_of(net, x, y, "quadratic")
    assert nn.sgd(net, x, y, epochs=1, lr=0.5) == pytest.approx(before, rel=1e-6)
    losses = nn.sgd(net, x, y, schedule=[(3, 0.5), (2, 0.1)])
    assert len(losses) == 2 and losses[1] < before


def test_a_step_allocates_nothing_after_the_first(dev):
    net = nn.Sequential([nn.Dense(32, "relu"), nn.Dense(10, "softmax")], 20, seed=0)
    x = clnn.asarray(RNG.random((16, 20)).astype(np.float32))
    y = clnn.asarray(np.eye(10, dtype=np.float32)[RNG.integers(0, 10, 16)])
    assert_steps_allocate_nothing(dev, net, x, y, "cross_entropy")


def test_training_never_writes_the_input(dev):
    net = small_net(["relu", "sigmoid"], seed=2, dtype=np.float32)
    host = RNG.random((10, 5)).astype(np.float32)
    x = clnn.asarray(host)
    nn.sgd(net, x, RNG.random((10, 3)).astype(np.float32), epochs=20, lr=1.0)
    assert x.get().tobytes() == host.tobytes()


def test_same_seed_same_network_and_deterministic_outputs(dev):
    a, b = small_net(["relu", "tanh"], seed=9), small_net(["relu", "tanh"], seed=9)
    for la, lb in zip(a.layers, b.layers):
        assert la.weight.get().tobytes() == lb.weight.get().tobytes()
    x = RNG.random((4, 5))
    assert a.predict(x).tobytes() == b.predict(x).tobytes()
    c = small_net(["relu", "tanh"], seed=10)
    assert not np.array_equal(a.layers[0].weight.get(), c.layers[0].weight.get())


def test_initialisation_scales(dev):
    net = nn.Sequential([nn.Dense(400, "relu"), nn.Dense(300, "tanh")], 500, seed=0)
    w_he, w_xavier = net.layers[0].weight.get(), net.layers[1].weight.get()
    assert abs(w_he.std() - np.sqrt(2 / 500)) < 0.05 * np.sqrt(2 / 500)
    assert abs(np.abs(w_xavier).max() - np.sqrt(6 / 700)) < 0.01
    assert np.all(net.layers[0].bias.get() == 0)


def test_inference_any_batch_and_predict_matches_numpy(dev):
    net = small_net(["elu", "softmax"], seed=6)
    w0, b0 = net.layers[0].weight.get(), net.layers[0].bias.get()
    w1, b1 = net.layers[1].weight.get(), net.layers[1].bias.get()
    for n in (1, 7, 64):
        x = RNG.standard_normal((n, 5))
        z = f_ref("elu", x @ w0.T + b0, 1.0) @ w1.T + b1
        ref = np.exp(z - z.max(1, keepdims=True))
        ref /= ref.sum(1, keepdims=True)
        np.testing.assert_allclose(net.predict(x), ref, rtol=1e-12)
    first = net(x)
    second = net(x)
    assert first is not second and first.get().tobytes() == second.get().tobytes()


def test_save_and_load_bitwise(dev, tmp_path):
    net = nn.Sequential([nn.Dense(6, "leaky_relu", param=0.2), nn.Dense(3, "softmax")], 4,
                        seed=1)
    nn.sgd(net, RNG.random((5, 4)), np.eye(3)[[0, 1, 2, 0, 1]].astype(np.float32),
           loss="cross_entropy", epochs=3, lr=0.1)
    path = str(tmp_path / "m.npz")
    net.save(path)
    back = nn.load(path)
    x = RNG.random((7, 4))
    assert back.predict(x).tobytes() == net.predict(x).tobytes()
    assert back.layers[0].param == 0.2 and back.layers[1].activation == "softmax"


def test_a_bfloat16_network_saves_and_loads_bitwise(dev, tmp_path):
    """npz has no bfloat16 dtype: the bits go as uint16 and come back as bfloat16, the
    optimizer's state too, so training resumes as if it never stopped."""
    x = RNG.random((8, 4)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2, 0, 1]]

    def make():
        return nn.Sequential([nn.Dense(6, "relu"), nn.Dense(3, "softmax")], 4, seed=1,
                             dtype=clnn.bfloat16)
    kw = dict(batch_size=4, lr=0.1, momentum=0.9, progress=False, seed=5)
    whole = make()
    whole.fit(x, y, "cross_entropy", epochs=3, **kw)
    net = make()
    net.fit(x, y, "cross_entropy", epochs=2, **kw)
    path = str(tmp_path / "m.npz")
    net.save(path)
    back = nn.load(path)
    assert back.dtype == clnn.bfloat16 and back.layers[0].weight.dtype == clnn.bfloat16
    assert back.predict(x).tobytes() == net.predict(x).tobytes()
    back.fit(x, y, "cross_entropy", epochs=3, initial_epoch=2, **kw)
    assert back.flat_parameters.get().tobytes() == whole.flat_parameters.get().tobytes()


def test_save_is_atomic(dev, tmp_path, monkeypatch):
    net = small_net(["relu", "relu"], seed=0, dtype=np.float32)
    path = str(tmp_path / "m.npz")
    net.save(path)
    good = open(path, "rb").read()

    def crash(f, **arrays):
        f.write(b"half a file")
        raise KeyboardInterrupt("power cut")
    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(KeyboardInterrupt):
        net.save(path)
    assert open(path, "rb").read() == good
    assert os.listdir(tmp_path) == ["m.npz"]


def test_fit_history_and_learning(dev):
    # data of its own: XOR of signs is hard near the axes, and over data sets 16 tanh
    # units reach 0.80-0.99 in 30 epochs; this one reaches 0.955
    x = np.random.default_rng(0).standard_normal((200, 2)).astype(np.float32)
    labels = (x[:, 0] * x[:, 1] > 0).astype(np.int64)   # XOR of signs
    net = nn.Sequential([nn.Dense(16, "tanh"), nn.Dense(2, "softmax")], 2, seed=0)
    hist = net.fit(x, labels, loss="cross_entropy", epochs=30, batch_size=16, lr=0.2,
                   momentum=0.9, seed=0, validation=(x, labels), progress=False)
    assert set(hist) == {"loss", "epoch_time", "val_loss", "val_accuracy"}
    assert len(hist["loss"]) == 30 and hist["loss"][-1] < hist["loss"][0] / 2
    assert hist["val_accuracy"][-1] > 0.9



def test_the_default_loss_is_the_output_layers_own(dev):
    """Without ``loss``, a softmax output trains and evaluates with cross-entropy (the
    only loss it takes) and any other with the quadratic loss: fit, train_step,
    evaluate and sgd give bitwise what the named loss gives."""
    x = RNG.standard_normal((12, 5)).astype(np.float32)
    labels = RNG.integers(0, 3, 12)
    onehot = np.eye(3, dtype=np.float32)[labels]
    for out, named in (("softmax", "cross_entropy"), ("sigmoid", "quadratic")):
        def net():
            return nn.Sequential([nn.Dense(4, "tanh"), nn.Dense(3, out)], 5, seed=3)
        assert net().loss_for() == named and net().loss_for("quadratic") == "quadratic"
        runs = []
        for loss in ({}, {"loss": named}):
            a, b, c = net(), net(), net()
            hist = a.fit(x, onehot, epochs=2, batch_size=5, lr=0.1, seed=0,
                         validation=(x, onehot), progress=False, **loss)
            xd, yd, _, _ = b._train_args(x, onehot, named, 0.1, 0.0)
            step = float(b.train_step(xd, yd, 0.1, 0.0, **loss).get())
            runs.append((hist["loss"], hist["val_loss"], a.evaluate(x, onehot, **loss),
                         step, nn.sgd(c, x, onehot, epochs=2, **loss),
                         a.flat_parameters.get().tobytes(), c.flat_parameters.get().tobytes()))
        assert runs[0] == runs[1]
    with pytest.raises(clnn.ArgumentError):     # a named loss is still checked
        nn.Sequential([nn.Dense(3, "softmax")], 5).evaluate(x, onehot, loss="quadratic")


def test_fit_trains_with_the_networks_own_optimizer(dev, tmp_path):
    """fit without optimizer= keeps the one the network has (a loaded Adam stays Adam,
    its moments and step count carried on), changing only the rates it is given; a
    network without one gets SGD(lr=0.1)."""
    from clnn import optim
    x = RNG.random((12, 5)).astype(np.float32)
    y = RNG.random((12, 3)).astype(np.float32)
    kw = dict(batch_size=4, progress=False, seed=3)

    def make():
        return nn.Sequential([nn.Dense(4, "tanh"), nn.Dense(3, "sigmoid")], 5, seed=1)

    # Adam for two epochs, saved, resumed with a plain fit(): the uninterrupted run's
    # weights, bitwise
    whole = make()
    whole.fit(x, y, epochs=2, optimizer=optim.Adam(lr=0.01), **kw)
    whole.fit(x, y, epochs=4, initial_epoch=2, **kw)
    half = make()
    half.fit(x, y, epochs=2, optimizer=optim.Adam(lr=0.01), **kw)
    resumed = nn.load(half.save(str(tmp_path / "mid.npz")))
    resumed.fit(x, y, epochs=4, initial_epoch=2, **kw)
    assert isinstance(resumed.optimizer, optim.Adam) and resumed.optimizer.steps == 12
    for a, b in zip(whole.parameters(), resumed.parameters()):
        assert np.array_equal(a.get(), b.get())

    # the rates given change the network's optimizer; those not given stay
    net = make()
    net.optimizer = optim.SGD(lr=0.05, momentum=0.9)
    net.fit(x, y, epochs=1, **kw)
    assert (net.optimizer.lr, net.optimizer.momentum) == (0.05, 0.9)
    net.fit(x, y, epochs=1, lr=0.02, **kw)
    assert (net.optimizer.lr, net.optimizer.momentum) == (0.02, 0.9)
    fresh = make()
    fresh.fit(x, y, epochs=1, **kw)
    assert isinstance(fresh.optimizer, optim.SGD)
    assert (fresh.optimizer.lr, fresh.optimizer.momentum) == (0.1, 0.0)


@pytest.mark.parametrize("kwargs,why", [
    (dict(optimizer="adam"), "clnn.optim optimizer"),
    (dict(optimizer=True, lr=0.1), "clnn.optim optimizer"),
    (dict(lr=0.1, optimizer=None, momentum=0.5, adam=True), "momentum is SGD's"),
    (dict(lr=0.1, optimizer="new"), "not beside it"),
    (dict(momentum=0.5, optimizer="new"), "not beside it"),
])
def test_fit_refuses_rates_it_would_ignore(dev, kwargs, why):
    from clnn import optim
    net = nn.Sequential([nn.Dense(3, "sigmoid")], 5, seed=1)
    if kwargs.pop("adam", False):
        net.optimizer = optim.Adam(lr=0.01)
    if kwargs.get("optimizer") == "new":
        kwargs["optimizer"] = optim.SGD(lr=0.3)
    before = [p.get() for p in net.parameters()]
    old = net.optimizer
    with pytest.raises(clnn.ArgumentError, match=why):
        net.fit(RNG.random((4, 5)).astype(np.float32), RNG.random((4, 3)).astype(np.float32),
                progress=False, **kwargs)
    assert net.optimizer is old
    for a, b in zip(before, net.parameters()):
        assert np.array_equal(a, b.get())

class TestBadInput:
    def params(self, net):
        return [(l.weight.get().tobytes(), l.bias.get().tobytes()) for l in net.layers]

    def test_errors_leave_parameters_unchanged(self, dev):
        net = nn.Sequential([nn.Dense(4, "relu"), nn.Dense(3, "softmax")], 5, seed=0)
        before = self.params(net)
        x = RNG.random((6, 5)).astype(np.float32)
        y = np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2]]
        nan_x = x.copy()
        nan_x[2, 3] = np.nan
        cases = [
            (clnn.ShapeError, lambda: nn.sgd(net, x[:, :4], y, loss="cross_entropy")),
            (clnn.ShapeError, lambda: nn.sgd(net, x, y[:5], loss="cross_entropy")),
            (clnn.ShapeError, lambda: nn.sgd(net, x, np.array([0, 1, 5, 0, 1, 2]),
                                             loss="cross_entropy")),
            (clnn.ArgumentError, lambda: nn.sgd(net, nan_x, y, loss="cross_entropy")),
            (clnn.ArgumentError, lambda: nn.sgd(net, clnn.asarray(nan_x), y,
                                                loss="cross_entropy")),
            (clnn.ArgumentError, lambda: nn.sgd(net, x, y, loss="quadratic")),
            (clnn.ArgumentError, lambda: nn.sgd(net, x, y, loss="hinge")),
            (clnn.ArgumentError, lambda: nn.sgd(net, x, y, loss="cross_entropy", lr=-1)),
            (clnn.ArgumentError, lambda: nn.sgd(net, x, y, loss="cross_entropy",
                                                schedule=[(1, 0.1), (1, float("nan"))])),
            (clnn.ArgumentError, lambda: net.fit(x, y, loss="cross_entropy", momentum=1.5)),
            (clnn.ShapeError, lambda: net(x[:, :2])),
        ]
        for err, call in cases:
            with pytest.raises(err):
                call()
            assert self.params(net) == before

    def test_an_empty_batch_is_named(self, dev):
        """A batch of no examples is refused as empty, by predict, a call, fit (on
        the host and on the device) and train_step (which divided by the batch size:
        ZeroDivisionError), before anything runs: the weights and the optimizer's
        step count stay."""
        net = nn.Sequential([nn.Dense(4, "relu"), nn.Dense(3, "softmax")], 5, seed=0)
        empty = np.zeros((0, 5), np.float32)
        before = self.params(net)
        for call in (lambda: net.predict(empty), lambda: net(clnn.asarray(empty)),
                     lambda: net.fit(empty, np.zeros((0, 3), np.float32)),
                     lambda: net.train_step(clnn.asarray(empty),
                                            clnn.asarray(np.zeros((0, 3), np.float32)),
                                            loss="cross_entropy"),
                     lambda: net.train_step(clnn.asarray(empty),
                                            clnn.asarray(np.zeros(0, np.int32)),
                                            loss="cross_entropy", precision="float16")):
            with pytest.raises(clnn.ShapeError, match="empty batch"):
                call()
        assert self.params(net) == before and net.steps == 0

    def test_bad_architectures(self, dev):
        with pytest.raises(clnn.ArgumentError):
            nn.Sequential([nn.Dense(3, "softmax"), nn.Dense(2, "relu")], 4)
        with pytest.raises(clnn.ArgumentError):
            nn.Dense(0)
        with pytest.raises(clnn.ArgumentError):
            nn.Dense(3, "swish")
        with pytest.raises(clnn.ArgumentError):
            nn.Sequential([], 4)
        net = small_net(["relu", "sigmoid"], dtype=np.float32)
        with pytest.raises(clnn.ArgumentError, match="softmax"):
            nn.sgd(net, RNG.random((2, 5)), np.eye(3)[[0, 1]], loss="cross_entropy")

    def test_batch_larger_than_memory_allows(self, dev):
        net = nn.Sequential([nn.Dense(64, "relu"), nn.Dense(10, "softmax")], 100, seed=0)
        before = self.params(net)
        x = np.zeros((20000, 100), np.float32)
        y = np.zeros(20000, np.int64)
        old = dev.pool.budget
        dev.pool.budget = 8 << 20
        try:
            with pytest.raises(clnn.OutOfDeviceMemory):
                nn.sgd(net, x, y, loss="cross_entropy")
        finally:
            dev.pool.budget = old
        assert self.params(net) == before


def test_cross_entropy_loss_options_match_the_op_and_torch(dev):
    """fit/train_step/evaluate with nn.CrossEntropyLoss (weights, ignore_index, label
    smoothing): the step's gradient is the mean loss's (the op's, and PyTorch's
    definition), labels never become one-hot rows, ignored labels teach nothing."""
    if not dev.facts.fp64:
        pytest.skip("needs float64")
    loss = nn.CrossEntropyLoss(weight=[1.0, 2.0, 0.5], ignore_index=-1,
                               label_smoothing=0.1)
    net = nn.Sequential([nn.Dense(4, "tanh"), nn.Dense(3, "softmax")], in_features=5,
                        dtype=np.float64, seed=1)
    x = RNG.standard_normal((6, 5))
    y = np.array([0, 2, -1, 1, 1, 2])
    xd, yd, _, _ = net._train_args(x, y, loss, 0.1, 0.0)
    assert yd.dtype == np.int32 and yd.shape == (6,)
    got = {}

    def keep(step):
        got["g"] = [g.get() * step.grad_scale for g in step.grads]
        step.skip = True
    value = float(net.train_step(xd, yd, 0.1, 0.0, loss, hook=keep).get())
    logits = net._run(xd, logits=True)
    want, _ = clnn.cross_entropy(logits, yd, clnn.asarray(loss.weight), -1, "mean", 0.1)
    assert abs(value - float(want.get())) < 1e-12
    # finite differences of the mean loss through the network
    p = net.parameters()[0]
    base = p.get()
    for idx in [(0, 0), (2, 3), (3, 4)]:
        vals = []
        for sign in (1, -1):
            q = base.copy()
            q[idx] += sign * 1e-6
            p.set(q)
            out = net._run(xd, logits=True)
            vals.append(float(clnn.cross_entropy(out, yd, clnn.asarray(loss.weight), -1,
                                                 "mean", 0.1)[0].get()))
        p.set(base)
        assert abs(got["g"][0][idx] - (vals[0] - vals[1]) / 2e-6) < 1e-7
    # evaluate: the same loss over the set; accuracy over the labels not ignored
    ev_loss, acc = net.evaluate(x, y, loss)
    assert abs(ev_loss - value) < 1e-12
    pred = net.predict(x).argmax(1)
    keep_ = y != -1
    assert acc == (pred[keep_] == y[keep_]).mean()
    hist = net.fit(x, y, loss, epochs=3, batch_size=4, validation=(x, y), lr=0.5)
    assert len(hist["val_loss"]) == 3 and hist["loss"][-1] < hist["loss"][0]
    # every label of a batch ignored: no update
    before = [q.get() for q in net.parameters()]
    xi, yi, _, _ = net._train_args(x[:2], [-1, -1], loss, 0.1, 0.0)
    assert np.isnan(float(net.train_step(xi, yi, 0.1, 0.0, loss).get()))
    assert all(np.array_equal(b, q.get()) for b, q in zip(before, net.parameters()))
    for bad in (nn.CrossEntropyLoss(weight=[1, 2]), ):
        with pytest.raises(clnn.ShapeError):
            net.fit(x, y, bad)
    with pytest.raises(clnn.ShapeError):
        net.fit(x, np.array([0, 3, 1, 1, 1, 1]), loss)
    for make in (lambda: nn.CrossEntropyLoss(label_smoothing=2),
                 lambda: nn.CrossEntropyLoss(weight=[[1.0]]),
                 lambda: nn.CrossEntropyLoss(ignore_index=0.5)):
        with pytest.raises(clnn.ArgumentError):
            make()


def test_dense_maps_the_last_axis_of_n_d_inputs(dev):
    """Dense on (..., in) inputs per example, as PyTorch's Linear: the forward pass
    against numpy, and a step's gradients against finite differences (float64)."""
    if not dev.facts.fp64:
        pytest.skip("needs float64")
    net = nn.Sequential([nn.Dense(4, "tanh"), nn.Dense(3, "elu"), nn.Flatten(),
                         nn.Dense(2, "sigmoid")], in_shape=(5, 6), dtype=np.float64,
                        seed=2)
    assert net.layers[0].out_shape == (5, 4) and net.layers[2].out_shape == (15,)
    x = RNG.standard_normal((3, 5, 6))
    y = RNG.random((3, 2))
    w0, b0 = net.layers[0].weight.get(), net.layers[0].bias.get()
    w1, b1 = net.layers[1].weight.get(), net.layers[1].bias.get()
    h = np.tanh(x @ w0.T + b0)
    z = h @ w1.T + b1
    h = np.where(z > 0, z, np.expm1(np.minimum(z, 0))).reshape(3, 15)
    w2, b2 = net.layers[3].weight.get(), net.layers[3].bias.get()
    np.testing.assert_allclose(net.predict(x), 1 / (1 + np.exp(-(h @ w2.T + b2))),
                               rtol=1e-12)
    xd, yd, _, _ = net._train_args(x, y, "quadratic", 0.1, 0.0)
    assert_step_gradients(net, xd, yd,
                          lambda: float(clnn.quadratic_loss(net(xd), yd)[0].get()), RNG,
                          tol=1e-7)


@pytest.mark.parametrize("precision", [None, "float16", "bfloat16"])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_a_training_step_never_waits_for_the_device(dev, monkeypatch, precision, opt):
    """No training step reads a value back or waits for the device, in float32 or
    mixed precision (float16's overflow check and loss scale stay on the device), with
    SGD or Adam (its step count stays there too), plain or replayed, through every
    kind of layer: on a GPU a wait per step is most of a small network's step time.
    Watched: array reads, blocking copies to or from the host, event waits and queue
    finishes."""
    import pyopencl as cl
    import pyopencl.array as cla
    from clnn import optim
    waits = []

    def watch(owner, name, blocking=lambda *a, **kw: True):
        real = getattr(owner, name)

        def watched(*args, **kw):
            if blocking(*args, **kw):
                waits.append(name)
            return real(*args, **kw)
        monkeypatch.setattr(owner, name, watched)

    rng = np.random.default_rng(4)
    x = clnn.asarray(rng.random((6, 2, 12, 12), dtype=np.float32), device=dev)
    y = clnn.asarray(np.eye(5, dtype=np.float32)[rng.integers(0, 5, 6)], device=dev)
    net = nn.Sequential([nn.Conv2d(4, 3), nn.BatchNorm2d(4, activation="relu"),
                         nn.MaxPool2d(2), nn.Conv2d(3, 3, activation="tanh"), nn.Flatten(),
                         nn.Dropout(0.25), nn.Dense(7, "relu"), nn.Dense(5, "softmax")],
                        in_shape=(2, 12, 12), seed=1, device=dev)
    net.optimizer = optim.SGD(lr=0.05, momentum=0.9) if opt == "sgd" else optim.Adam()
    for replay in (False, True):
        for _ in range(2):                 # the first steps allocate, upload, capture
            net.train_step(x, y, loss="cross_entropy", precision=precision, replay=replay)
        watch(cla.Array, "get")
        watch(cla.Array, "set", lambda *a, **kw: not kw.get("async_", False))
        watch(cl, "enqueue_copy", lambda queue, dst, src, **kw: kw.get("is_blocking", True)
              and (isinstance(dst, np.ndarray) or isinstance(src, np.ndarray)))
        watch(cl, "wait_for_events")
        watch(cl.Event, "wait")
        watch(cl.CommandQueue, "finish")
        for _ in range(3):
            net.train_step(x, y, loss="cross_entropy", precision=precision, replay=replay)
        monkeypatch.undo()
        assert waits == [], (replay, waits)
    assert np.all(np.isfinite(net.flat_parameters.get()))
    assert net.optimizer.steps == 10 - (net.scaler.skipped if net.scaler else 0)


@pytest.mark.parametrize("loss,last", [("cross_entropy", "softmax"), ("quadratic", "sigmoid")])
def test_bias_gradients_come_with_the_activations_backward_pass(dev, monkeypatch, loss, last):
    """Dense and Conv2d layers with a bias and an activation sum the bias gradient in
    their activation's backward pass (clnn.activation_bias_backward, one pass on GPUs:
    forced here): a step's gradients are bit for bit those of the two ops in turn, with
    a launch fewer per such layer; the output layer's too, the quadratic loss's in its
    activation's pass, the cross-entropy's in the loss's launch (a small batch's: its
    sum over the batch in an order of its own, so to rounding only; with 64 examples,
    which the loss's work-group splits unlike bias_grad's). (A GPU's small convolutions
    sum theirs in the weight gradient's launches instead, and a pooling layer applies
    the derivative of the activation under it: both off here, the next tests.)"""
    from clnn import optim, programs, tuning
    from clnn.nn import layers
    from clnn.ops import conv as conv_module
    monkeypatch.setattr(conv_module, "WGRAD_DIRECT", False)
    monkeypatch.setattr(layers._Pool, "takes_activation", False)

    def net():
        return nn.Sequential([nn.Conv2d(4, 3, activation="relu"), nn.MaxPool2d(2),
                              nn.Conv2d(5, 3, padding=1, activation="tanh"),
                              nn.AvgPool2d(2), nn.Flatten(), nn.Dense(11, "elu"),
                              nn.Dense(7, last)], in_shape=(2, 13, 13), seed=5, device=dev)
    x = clnn.asarray(RNG.standard_normal((64, 2, 13, 13)).astype(np.float32), device=dev)
    y = clnn.asarray(np.eye(7, dtype=np.float32)[RNG.integers(0, 7, 64)], device=dev)
    got = {}
    for fuse in (True, False):
        if not fuse:
            for cls in (layers.Dense, layers.Conv2d):
                monkeypatch.setattr(cls, "fuses_bias", False)
        n = net()
        n.optimizer = optim.SGD(lr=0.0)
        with tuning.override("reduce", {"wg": True}):
            n.train_step(x, y, loss=loss)
            with programs.captured() as launches:
                n.train_step(x, y, loss=loss, replay=False)
        got[fuse] = (n.flat_gradients.get(), len(launches))
    (off, size), = [(o, k) for layer, name, _, o, k in n._layout
                    if layer is n.layers[-1] and name == "bias"]
    head = slice(off, off + size) if loss == "cross_entropy" else slice(0, 0)
    rest = np.ones(got[True][0].size, bool)
    rest[head] = False
    assert np.array_equal(got[True][0][rest], got[False][0][rest])
    np.testing.assert_allclose(got[True][0][head], got[False][0][head], rtol=1e-6,
                               atol=1e-7)
    assert got[True][1] == got[False][1] - 4


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_gpu_small_convolutions_sum_their_bias_gradient_with_the_weights(dev, monkeypatch,
                                                                         precision):
    """On a GPU's path (forced here), a Conv2d layer whose weight gradient convw.cl sums
    (up to 16 filters) gets its bias gradient from those launches, and its activation's
    backward pass runs alone (the first convolution, under the second) or in the
    pooling's (the second): a step makes as many launches as the same network with
    bias-free convolutions, and its gradients are those of the activation pass's sums
    (WGRAD_DIRECT off) to rounding (float16: the mixed-precision step's)."""
    from clnn import optim, programs, tuning
    from clnn.ops import conv as conv_module

    def net(bias):
        return nn.Sequential([nn.Conv2d(4, 3, activation="relu", bias=bias),
                              nn.Conv2d(5, 3, padding=1, activation="tanh", bias=bias),
                              nn.AvgPool2d(2), nn.Flatten(), nn.Dense(11, "elu"),
                              nn.Dense(7, "softmax")], in_shape=(2, 13, 13), seed=5,
                             device=dev)
    x = clnn.asarray(RNG.standard_normal((9, 2, 13, 13)).astype(np.float32), device=dev)
    y = clnn.asarray(np.eye(7, dtype=np.float32)[RNG.integers(0, 7, 9)], device=dev)
    got = {}
    for direct, bias in ((True, True), (True, False), (False, True)):
        monkeypatch.setattr(conv_module, "WGRAD_DIRECT", direct)
        n = net(bias)
        n.optimizer = optim.SGD(lr=0.0)
        with tuning.override("gemm", tuning.GEMM_TABLE["type"]["GPU"]), \
                tuning.override("reduce", {"wg": True}), clnn.profile() as prof:
            n.train_step(x, y, loss="cross_entropy", precision=precision)
            with programs.captured() as launches:
                n.train_step(x, y, loss="cross_entropy", replay=False, precision=precision)
        entries = [r.entry for r in prof.records]
        assert ("clnn_convw_partial" in entries) == direct
        got[direct, bias] = (n.flat_gradients.get().astype(np.float64), len(launches))
    assert got[True, True][1] == got[True, False][1]
    assert got[True, True][1] < got[False, True][1]
    ref = got[False, True][0]
    # (float16's gradients are stored in half, scaled: a sum in another order may land
    # a half's unit of rounding, 2^-10 relative, apart)
    rtol = 1e-4 if precision == "float32" else 2.0 ** -9
    np.testing.assert_allclose(got[True, True][0], ref, rtol=rtol,
                               atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("wg", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_pooling_applies_the_derivative_of_the_activation_under_it(dev, monkeypatch, wg,
                                                                   precision):
    """A MaxPool2d or AvgPool2d layer over a Conv2d's activation multiplies its dx by the
    activation's derivative in its own pass (the pooling kernels' activation=), so the
    convolution's activation pass does not run: a launch fewer per such pair on CPUs
    and where the GPU's weight gradient sums the bias (convw.cl, forced); the
    convolution's bias gradient then comes from its weight gradient's call (db=). The
    gradients are those of the two passes to rounding."""
    from clnn import optim, programs, tuning
    from clnn.nn import layers

    def net():
        return nn.Sequential([nn.Conv2d(4, 3, activation="relu"), nn.MaxPool2d(2),
                              nn.Conv2d(5, 3, padding=1, activation="tanh"),
                              nn.AvgPool2d(2), nn.Flatten(), nn.Dense(11, "elu"),
                              nn.Dense(7, "softmax")], in_shape=(2, 13, 13), seed=5,
                             device=dev)
    x = clnn.asarray(RNG.standard_normal((9, 2, 13, 13)).astype(np.float32), device=dev)
    y = clnn.asarray(np.eye(7, dtype=np.float32)[RNG.integers(0, 7, 9)], device=dev)
    gemm = tuning.GEMM_TABLE["type"]["GPU" if wg else "CPU"]

    def step(make):
        n = make()
        n.optimizer = optim.SGD(lr=0.0)
        with tuning.override("gemm", gemm), tuning.override("reduce", {"wg": wg}), \
                tuning.override("rows", {"wg": wg}):
            n.train_step(x, y, loss="cross_entropy", precision=precision)
            with programs.captured() as launches:
                n.train_step(x, y, loss="cross_entropy", replay=False, precision=precision)
        return n.flat_gradients.get().astype(np.float64), len(launches)

    fused, n_fused = step(net)
    monkeypatch.setattr(layers._Pool, "takes_activation", False)
    apart, n_apart = step(net)
    # a launch fewer per convolution where its activation pass ran alone or in turn
    # with bias_grad; where a GPU's reduction took the activation's derivative with the
    # bias's sums (no convw.cl: the CPU's GEMM row on a GPU's facts), as many
    assert n_fused == n_apart - (2 if wg or dev.facts.is_cpu else 0)
    rtol = 1e-4 if precision == "float32" else 2.0 ** -9
    np.testing.assert_allclose(fused, apart, rtol=rtol, atol=1e-5 * np.abs(apart).max())
    assert nn.Conv2d(5, 3, activation="identity").activation_to_fuse() is None
    assert nn.Conv2d(5, 3, activation="softplus", param=2.0).activation_to_fuse() == \
        ("softplus", 2.0)
