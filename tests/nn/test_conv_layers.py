"""Conv2d, pooling and Flatten layers inside Sequential: gradients against finite
differences in float64, zero allocations per step, persistence."""

import numpy as np
import pytest

import clnn
from clnn import nn
from conftest import assert_step_gradients, assert_steps_allocate_nothing

RNG = np.random.default_rng(123)


def cnn(pool="max", act="tanh", seed=0, dtype=np.float64):
    Pool = nn.MaxPool2d if pool == "max" else nn.AvgPool2d
    return nn.Sequential([nn.Conv2d(3, 3, padding=1, activation=act), Pool(2),
                          nn.Conv2d(4, (2, 3), stride=(1, 2), activation=act), nn.Flatten(),
                          nn.Dense(3, "sigmoid")], in_shape=(2, 7, 8), dtype=dtype, seed=seed)


def quadratic(net, x, y):
    return float(clnn.quadratic_loss(net(x), clnn.asarray(y))[0].get())


@pytest.mark.parametrize("pool,act", [("max", "tanh"), ("avg", "elu"), ("max", "softplus")])
def test_cnn_gradients_match_finite_differences(dev, pool, act):
    net = cnn(pool, act, seed=1)
    x = RNG.standard_normal((3, 2, 7, 8))
    y = RNG.random((3, 3))
    before = [[p.get() for p in l.parameters()] for l in net.layers]
    nn.sgd(net, x, y, epochs=1, lr=1.0)          # params -= dL/dparams
    grads = [[b - p.get() for b, p in zip(bs, l.parameters())]
             for bs, l in zip(before, net.layers)]
    for bs, l in zip(before, net.layers):
        for b, p in zip(bs, l.parameters()):
            p.set(b)
    h = 1e-6
    for li in (0, 2, 4):
        for pi, p in enumerate(net.layers[li].parameters()):
            base = p.get()
            flat = RNG.choice(base.size, size=min(6, base.size), replace=False)
            for idx in (np.unravel_index(f, base.shape) for f in flat):
                vals = []
                for sign in (1, -1):
                    q = base.copy()
                    q[idx] += sign * h
                    p.set(q)
                    vals.append(quadratic(net, x, y))
                p.set(base)
                num = (vals[0] - vals[1]) / (2 * h)
                assert abs(grads[li][pi][idx] - num) < 1e-6 * max(1, abs(num)), \
                    (li, pi, idx, grads[li][pi][idx], num)


def test_cnn_step_allocates_nothing_after_the_first(dev):
    net = cnn(dtype=np.float32)
    x = clnn.asarray(RNG.standard_normal((5, 2, 7, 8)).astype(np.float32))
    y = clnn.asarray(RNG.random((5, 3)).astype(np.float32))
    assert_steps_allocate_nothing(dev, net, x, y, "quadratic")


def test_cnn_save_load_and_inference(dev, tmp_path):
    net = cnn(pool="avg", seed=3)
    x = RNG.standard_normal((4, 2, 7, 8))
    nn.sgd(net, x, RNG.random((4, 3)), epochs=2, lr=0.5)
    net.save(str(tmp_path / "cnn.npz"))
    back = nn.load(str(tmp_path / "cnn.npz"))
    assert back.predict(x).tobytes() == net.predict(x).tobytes()
    assert back.predict(x[:1]).shape == (1, 3)
    assert x.tobytes() == x.copy().tobytes()


def test_cnn_bad_input(dev):
    net = cnn(dtype=np.float32)
    with pytest.raises(clnn.ShapeError):
        net(np.zeros((2, 2, 8, 7), np.float32))
    # Dense maps the last axis (PyTorch's Linear); a loss then asks for a Flatten
    net2 = nn.Sequential([nn.Conv2d(3, 3), nn.Dense(2)], in_shape=(1, 5, 5))
    assert net2.out_shape == (3, 3, 2)
    with pytest.raises(clnn.ArgumentError, match="Flatten"):
        net2.fit(np.zeros((2, 1, 5, 5)), np.zeros((2, 18)))
    with pytest.raises(clnn.ShapeError):
        nn.Sequential([nn.Conv2d(3, 7)], in_shape=(1, 5, 5))
    with pytest.raises(clnn.ArgumentError):
        nn.Sequential([nn.Dense(3)], in_features=4, in_shape=(4,))


def test_depthwise_and_dilated_layers_gradients(dev):
    """A MobileNet-like block (depthwise 3x3, then a 1x1 pointwise) and a dilated
    layer: gradients of a step against finite differences in float64."""
    if not dev.facts.fp64:
        pytest.skip("finite differences need float64")
    net = nn.Sequential([nn.Conv2d(4, 3, padding=1, activation="tanh", groups=2),
                         nn.Conv2d(4, 3, padding=2, dilation=2, activation="elu", groups=4),
                         nn.Conv2d(3, 1, activation="tanh"), nn.Flatten(),
                         nn.Dense(2, "sigmoid")], in_shape=(2, 6, 5), dtype=np.float64,
                        seed=3)
    assert net.layers[1].weight.shape == (4, 1, 3, 3)
    x = RNG.standard_normal((3, 2, 6, 5))
    y = RNG.random((3, 2))
    xd, yd, _, _ = net._train_args(x, y, "quadratic", 0.1, 0.0)
    assert_step_gradients(net, xd, yd, lambda: quadratic(net, x, y), RNG)
