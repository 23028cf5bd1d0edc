"""Dropout and BatchNorm layers inside Sequential: training-mode gradients against
finite differences (float64), evaluation mode, running statistics, bitwise
repetition and resumption, bias=False, and failure atomicity."""

import os

import numpy as np
import pytest

import clnn
from clnn import nn, optim
from conftest import assert_step_gradients, assert_steps_allocate_nothing

RNG = np.random.default_rng(2024)


def net_with_norms(dtype=np.float64, seed=0, p=0.3, momentum=0.1):
    return nn.Sequential([
        nn.Conv2d(3, 3, padding=1, activation="identity", bias=False),
        nn.BatchNorm2d(3, activation="relu", momentum=momentum),
        nn.Dropout(p), nn.MaxPool2d(2), nn.Flatten(),
        nn.Dense(5, "identity", bias=False), nn.BatchNorm1d(5, activation="tanh"),
        nn.Dropout(p), nn.Dense(3, "sigmoid")],
        in_shape=(2, 6, 5), dtype=dtype, seed=seed)


def step_loss_and_grads(net, xd, yd, steps):
    """The training-mode loss and gradients of a step at step number ``steps``, with
    nothing updated (the hook skips the update)."""
    got = {}

    def keep(step):
        got["grads"] = [g.get() * step.grad_scale for g in step.grads]
        step.skip = True
    net.steps = steps
    value = net.train_step(xd, yd, 0.1, 0.0, "quadratic", hook=keep)
    return float(value.get()), got["grads"]


def test_training_gradients_match_finite_differences(dev):
    if not dev.facts.fp64:
        pytest.skip("finite differences need float64")
    net = net_with_norms()
    x = RNG.standard_normal((4, 2, 6, 5))
    y = RNG.random((4, 3))
    xd, yd, _, _ = net._train_args(x, y, "quadratic", 0.1, 0.0)
    _, grads = step_loss_and_grads(net, xd, yd, 7)
    assert len(net.parameters()) == len(grads) == 8   # conv w, bn2d w b, dense w,
    #                                                   bn1d w b, dense w b
    net.steps = 7          # the step's masks, and the same masks for every difference
    assert_step_gradients(net, xd, yd, lambda: step_loss_and_grads(net, xd, yd, 7)[0], RNG,
                          picks=5)


def test_evaluation_mode_uses_running_statistics_and_no_dropout(dev):
    net = net_with_norms(np.float32, p=0.5)
    x = RNG.standard_normal((6, 2, 6, 5)).astype(np.float32)
    a, b = net.predict(x), net.predict(x)
    assert np.array_equal(a, b)                                 # no dropout
    # fresh running statistics (mean 0, var 1): BatchNorm is x / sqrt(1 + eps)
    bn = net.layers[1]
    assert np.array_equal(bn.running_mean.get(), np.zeros(3, np.float32))
    one = net.predict(x[:1])                                    # batch-independent
    np.testing.assert_allclose(one, a[:1], rtol=1e-5, atol=1e-6)


def test_running_statistics_follow_pytorch(dev):
    for momentum in (0.25, None):
        net = nn.Sequential([nn.BatchNorm1d(4), nn.Dense(2, "sigmoid")], in_features=4,
                            dtype=np.float64 if dev.facts.fp64 else np.float32, seed=1)
        bn = net.layers[0]
        bn.momentum = momentum
        rm, rv = np.zeros(4), np.ones(4)
        xs = [RNG.standard_normal((5, 4)) * 2 + 1 for _ in range(3)]
        for t, x in enumerate(xs, 1):
            net.fit(x, RNG.random((5, 2)), epochs=1, batch_size=5, shuffle=False)
            f = 1 / t if momentum is None else momentum
            rm = (1 - f) * rm + f * x.mean(0)
            rv = (1 - f) * rv + f * x.var(0, ddof=1)
        assert bn.num_batches_tracked == 3
        np.testing.assert_allclose(bn.running_mean.get(), rm, rtol=1e-5)
        np.testing.assert_allclose(bn.running_var.get(), rv, rtol=1e-5)


def test_dropout_masks_repeat_with_the_seed_and_change_with_the_step(dev):
    x = RNG.standard_normal((8, 2, 6, 5)).astype(np.float32)
    y = RNG.random((8, 3)).astype(np.float32)
    runs = []
    for _ in range(2):
        net = net_with_norms(np.float32, seed=5)
        net.fit(x, y, epochs=2, batch_size=4, seed=3)
        runs.append([p.get() for p in net.parameters()])
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    other = net_with_norms(np.float32, seed=6)
    other.fit(x, y, epochs=2, batch_size=4, seed=3)
    assert not np.array_equal(other.parameters()[-1].get(), runs[0][-1])
    # the layer's masks differ from step to step
    drop = net.layers[2]
    xd, yd, _, _ = net._train_args(x, y, "quadratic", 0.1, 0.0)
    outs = []
    for steps in (0, 1):
        net.steps = steps
        net.train_step(xd, yd, 0.1, 0.0, hook=lambda s: setattr(s, "skip", True))
        outs.append(net._train[8, "float32"].a[2].get() == 0)
    assert drop._key is not None and not np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("make", [lambda: optim.SGD(lr=0.05, momentum=0.9),
                                  lambda: optim.Adam(lr=0.01)], ids=["sgd", "adam"])
def test_a_checkpoint_resumes_bitwise_with_dropout_and_batchnorm(dev, tmp_path, make):
    x = RNG.standard_normal((10, 2, 6, 5)).astype(np.float32)
    y = RNG.random((10, 3)).astype(np.float32)
    a = net_with_norms(np.float32, seed=4)
    a.fit(x, y, epochs=4, batch_size=4, optimizer=make(), seed=1)
    b = net_with_norms(np.float32, seed=4)
    b.fit(x, y, epochs=2, batch_size=4, optimizer=make(), seed=1)
    c = nn.load(b.save(str(tmp_path / "mid.npz")), device=dev)
    assert c.steps == 6 and c.seed == 4 and c.layers[1].num_batches_tracked == 6
    rng = np.random.default_rng(1)
    orders = [rng.permutation(10) for _ in range(4)]
    for order in orders[2:]:
        c.fit(x[order], y[order], epochs=1, batch_size=4, optimizer=c.optimizer,
              shuffle=False)
    for p, q in zip(a.parameters(), c.parameters()):
        assert np.array_equal(p.get(), q.get())
    for la, lc in zip(a.layers, c.layers):
        for k, v in la.state().items():
            w = lc.state()[k]
            assert np.array_equal(getattr(v, "get", lambda: v)(),
                                  getattr(w, "get", lambda: w)()), k
    assert np.array_equal(a.predict(x), c.predict(x))


def test_a_failed_step_keeps_weights_statistics_and_step_count(dev):
    net = net_with_norms(np.float32)
    x = RNG.standard_normal((4, 2, 6, 5)).astype(np.float32)
    y = RNG.random((4, 3)).astype(np.float32)
    net.fit(x, y, epochs=1, batch_size=4)
    before = [p.get() for p in net.parameters()] + \
        [net.layers[i].running_var.get() for i in (1, 6)]
    steps = net.steps

    def fail(step):
        raise RuntimeError("boom")
    xd, yd, _, _ = net._train_args(x, y, "quadratic", 0.1, 0.0)
    with pytest.raises(RuntimeError):
        net.train_step(xd, yd, 0.1, 0.0, hook=fail)
    after = [p.get() for p in net.parameters()] + \
        [net.layers[i].running_var.get() for i in (1, 6)]
    assert net.steps == steps
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    # and the next step moves the statistics once, not twice
    tracked = net.layers[1].num_batches_tracked
    net.train_step(xd, yd, 0.1, 0.0)
    assert net.layers[1].num_batches_tracked == tracked + 1


def test_steps_allocate_nothing_after_the_first(dev):
    net = net_with_norms(np.float32)
    x = clnn.asarray(RNG.standard_normal((5, 2, 6, 5)).astype(np.float32))
    y = clnn.asarray(RNG.random((5, 3)).astype(np.float32))
    assert_steps_allocate_nothing(dev, net, x, y, "quadratic", steps=20)


def test_layer_arguments_are_checked(dev):
    for make in (lambda: nn.Dropout(1.0), lambda: nn.Dropout(-0.5),
                 lambda: nn.BatchNorm2d(0), lambda: nn.BatchNorm2d(3, eps=0),
                 lambda: nn.BatchNorm1d(3, momentum=2), lambda: nn.BatchNorm1d(3, affine=1),
                 lambda: nn.BatchNorm2d(3, activation="softmax"),
                 lambda: nn.Dense(3, bias="no"), lambda: nn.Conv2d(3, 3, bias=None)):
        with pytest.raises(clnn.ArgumentError):
            make()
    with pytest.raises(clnn.ShapeError):       # channels do not match
        nn.Sequential([nn.BatchNorm2d(4)], in_shape=(3, 5, 5))
    with pytest.raises(clnn.ShapeError):       # BatchNorm2d needs (C, H, W)
        nn.Sequential([nn.BatchNorm2d(3)], in_features=3)
    net = nn.Sequential([nn.BatchNorm1d(3), nn.Dense(2)], in_features=3)
    before = net.layers[1].weight.get()
    for n, batch in ((1, 1), (5, 2)):         # a batch of one example: no statistics,
        with pytest.raises(clnn.ShapeError):  # found before the first step
            net.fit(np.ones((n, 3)), np.ones((n, 2)), batch_size=batch)
    assert net.steps == 0 and np.array_equal(net.layers[1].weight.get(), before)


def test_bias_free_layers_save_and_load(dev, tmp_path):
    net = net_with_norms(np.float32)
    assert net.layers[0].bias is None and len(net.layers[0].parameters()) == 1
    x = RNG.standard_normal((4, 2, 6, 5)).astype(np.float32)
    net.fit(x, RNG.random((4, 3)), epochs=1, batch_size=2)
    again = nn.load(net.save(str(tmp_path / "n.npz")), device=dev)
    assert [l.config() for l in again.layers] == [l.config() for l in net.layers]
    assert np.array_equal(again.predict(x), net.predict(x))


RESUME = """
import sys
import numpy as np
import clnn
from clnn import nn
sys.path.insert(0, sys.argv[4])
import facts_mode                       # the test device's facts, as the tests have them
facts_mode.apply(clnn.device())
net = nn.load(sys.argv[1])
data = np.load(sys.argv[2])
for e in range(2, 4):
    order = data["orders"][e]
    net.fit(data["x"][order], data["y"][order], epochs=1, batch_size=4,
            optimizer=net.optimizer, shuffle=False)
np.savez(sys.argv[3], *[p.get() for p in net.parameters()])
"""


def test_a_checkpoint_resumes_bitwise_in_a_fresh_process(dev, tmp_path):
    import subprocess
    import sys
    x = RNG.standard_normal((10, 2, 6, 5)).astype(np.float32)
    y = RNG.random((10, 3)).astype(np.float32)
    a = net_with_norms(np.float32, seed=8)
    a.fit(x, y, epochs=4, batch_size=4, optimizer=optim.Adam(lr=0.01), seed=2)
    b = net_with_norms(np.float32, seed=8)
    b.fit(x, y, epochs=2, batch_size=4, optimizer=optim.Adam(lr=0.01), seed=2)
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "data.npz", x=x, y=y,
             orders=np.stack([rng.permutation(10) for _ in range(4)]))
    (tmp_path / "resume.py").write_text(RESUME)
    subprocess.run([sys.executable, str(tmp_path / "resume.py"),
                    b.save(str(tmp_path / "mid.npz")), str(tmp_path / "data.npz"),
                    str(tmp_path / "out.npz"), os.path.dirname(os.path.dirname(
                        os.path.abspath(__file__)))], check=True, timeout=300)
    with np.load(tmp_path / "out.npz") as got:
        for i, p in enumerate(a.parameters()):
            assert np.array_equal(got[f"arr_{i}"], p.get())
