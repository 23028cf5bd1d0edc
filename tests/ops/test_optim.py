"""Optimizer steps against float64 re-implementations of torch.optim's single-tensor
algorithms (and torch itself when it is installed), 100 steps on awkward sizes with
canaries; the optimizer objects, schedules, the gradient hook and bitwise resume."""

import math

import numpy as np
import pytest

import clnn
from clnn import nn, optim

from conftest import Guarded, f64, float_dtypes

RNG = np.random.default_rng(41)


def torch_sgd(w, grads, lr, momentum, wd, nesterov, scale):
    w, buf = w.astype(np.float64), None
    for g in grads:
        g = scale * g.astype(np.float64) + wd * w
        buf = g.copy() if buf is None else momentum * buf + g
        w = w - lr * (g + momentum * buf if nesterov else buf)
    return w


def torch_adam(w, grads, lr, betas, eps, wd, decoupled, scale):
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        g = scale * g.astype(np.float64)
        if decoupled:
            w = w * (1 - lr * wd)
        else:
            g = g + wd * w
        m += (1 - betas[0]) * (g - m)
        v = betas[1] * v + (1 - betas[1]) * g * g
        denom = np.sqrt(v) / math.sqrt(1 - betas[1] ** t) + eps
        w = w - lr / (1 - betas[0] ** t) * m / denom
    return w


def tol(dtype):
    # 100 steps, each a few roundings of the weight: relative to the weights' size
    # (bfloat16: float16's, times the ratio of their epsilons, 8)
    return {"float64": 1e-12, "float32": 2e-5, "float16": 5e-2,
            "bfloat16": 4e-1}[np.dtype(dtype).name]


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("n", [1, 7, 1031], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("kind", ["sgd", "nesterov-wd", "adam-wd", "adamw"])
def test_100_steps_match_torch_optim(dev, dtype, n, kind):
    w0 = RNG.standard_normal(n).astype(dtype)
    grads = [RNG.standard_normal(n).astype(dtype) for _ in range(100)]
    W = Guarded(dev, (n,), dtype, fill=w0)
    S = [Guarded(dev, (n,), dtype, fill=np.zeros(n)) for _ in range(2)]
    G = clnn.asarray(grads[0], device=dev)
    for t, g in enumerate(grads, 1):
        G.set(g)
        if kind == "sgd":
            clnn.sgd_step(W.view, G, S[0].view, lr=0.05, momentum=0.9, grad_scale=0.5)
        elif kind == "nesterov-wd":
            clnn.sgd_step(W.view, G, S[0].view, lr=0.05, momentum=0.8, nesterov=True,
                          weight_decay=0.01, grad_scale=0.5)
        else:
            clnn.adam_step(W.view, G, S[0].view, S[1].view, step=t, lr=0.01,
                           betas=(0.9, 0.99), weight_decay=0.1 if kind == "adamw" else 0.01,
                           decoupled=kind == "adamw", grad_scale=0.5)
    if kind.startswith("adam"):
        want = torch_adam(w0, grads, 0.01, (0.9, 0.99), 1e-8,
                          0.1 if kind == "adamw" else 0.01, kind == "adamw", 0.5)
    else:
        want = torch_sgd(w0, grads, 0.05, 0.9 if kind == "sgd" else 0.8,
                         0.0 if kind == "sgd" else 0.01, kind != "sgd", 0.5)
    got = W.check()
    for s in S:
        s.check()
    np.testing.assert_allclose(f64(got), want, rtol=tol(dtype),
                               atol=tol(dtype) * np.abs(want).max())


@pytest.mark.parametrize("copy_dt", [np.float16, clnn.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("n", [1, 7, 1031, 100003], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("kind", ["sgd", "nesterov-wd", "adam-wd", "adamw"])
def test_the_update_keeps_a_16_bit_copy(dev, copy_dt, n, kind):
    """``copy=`` (a mixed-precision step's 16-bit weights, written by the update's
    kernel): after every step the copy is bitwise clnn.cast of the updated float32
    weights, which are bitwise those of the update without a copy; canaries around
    the copy; a gated step that is skipped leaves the weights and the copy as they
    were."""
    from clnn.ops import optim as optim_ops
    w0 = (RNG.standard_normal(n) * 3).astype(np.float32)
    W, R = Guarded(dev, (n,), np.float32, fill=w0), clnn.asarray(w0, device=dev)
    C = Guarded(dev, (n,), copy_dt, fill=w0.astype(copy_dt))
    S, T = ([clnn.zeros((n,), device=dev) for _ in range(2)] for _ in range(2))
    G = clnn.asarray(np.zeros(n, np.float32), device=dev)
    gate = clnn.asarray(optim_ops.loss_scale_state(1.0), device=dev)
    count = clnn.asarray(np.zeros(1, np.int32), device=dev)

    def step(w, s, t, **kw):
        if kind.startswith("adam"):
            clnn.adam_step(w, G, s[0], s[1], step=t, lr=0.01, betas=(0.9, 0.99),
                           weight_decay=0.1 if kind == "adamw" else 0.01,
                           decoupled=kind == "adamw", grad_scale=0.5, **kw)
        else:
            clnn.sgd_step(w, G, s[0], lr=0.05, momentum=0.9 if kind == "sgd" else 0.8,
                          nesterov=kind != "sgd", weight_decay=0.0 if kind == "sgd" else 0.01,
                          grad_scale=0.5, **kw)
    for t in range(1, 6):
        G.set(RNG.standard_normal(n).astype(np.float32))
        step(W.view, S, t, copy=C.view)
        step(R, T, t)
        w = W.check()
        assert np.array_equal(w, R.get()), t
        assert np.array_equal(C.check().view(np.uint16),
                              clnn.cast(R, copy_dt).get().view(np.uint16)), t
    # skipped under a gate: neither the weights nor the copy change
    g = RNG.standard_normal(n).astype(np.float32)
    g[n // 2] = np.inf
    G.set(g)
    optim_ops.loss_scale_update(G, gate, count=count)
    before = C.check().copy()
    step(W.view, S, count, copy=C.view, gate=gate)
    assert np.array_equal(W.check(), w)
    assert np.array_equal(C.check().view(np.uint16), before.view(np.uint16))


def test_a_copy_that_cannot_be_kept_is_refused(dev):
    """Bad copies: a typed error before anything is written."""
    w = Guarded(dev, (6,), np.float32, fill=np.ones(6))
    g, b = clnn.asarray(np.ones(6, np.float32), device=dev), clnn.zeros((6,), device=dev)
    half = clnn.zeros((6,), np.float16, device=dev)
    for copy, err in ((clnn.zeros((6,), device=dev), clnn.DTypeError),    # not 16-bit
                      (clnn.zeros((5,), np.float16, device=dev), clnn.ShapeError),
                      (np.zeros(6, np.float16), clnn.ArgumentError),
                      (b.view(np.float16)[:6], clnn.ShapeError)):         # overlaps buf
        with pytest.raises(err):
            clnn.sgd_step(w.view, g, b, lr=0.1, copy=copy)
        with pytest.raises(err):
            clnn.adam_step(w.view, g, b, clnn.zeros((6,), device=dev), step=1, copy=copy)
    if dev.supports(np.float64):                      # float64 weights: no copy
        w64 = clnn.zeros((6,), np.float64, device=dev)
        with pytest.raises(clnn.DTypeError):
            clnn.sgd_step(w64, clnn.zeros((6,), np.float64, device=dev),
                          clnn.zeros((6,), np.float64, device=dev), lr=0.1, copy=half)
    assert np.all(w.check() == 1) and np.all(b.get() == 0) and np.all(half.get() == 0)


def test_adam_and_adamw_match_torch_itself(dev):
    torch = pytest.importorskip("torch")
    w0 = RNG.standard_normal((13, 5)).astype(np.float32)
    grads = [RNG.standard_normal((13, 5)).astype(np.float32) for _ in range(100)]
    for cls, ours in ((torch.optim.Adam, optim.Adam), (torch.optim.AdamW, optim.AdamW)):
        p = torch.nn.Parameter(torch.tensor(w0))
        opt = cls([p], lr=0.01, weight_decay=0.05)
        mine = ours(lr=0.01, weight_decay=0.05)
        W, G = clnn.asarray(w0, device=dev), clnn.asarray(grads[0], device=dev)
        for g in grads:
            p.grad = torch.tensor(g)
            opt.step()
            G.set(g)
            mine.step([W], [G])
        want = p.detach().numpy()
        # float32 rounding over 100 steps, relative to the weights' size (an element
        # near 0 carries the rounding of the larger values it passed through)
        np.testing.assert_allclose(W.get(), want, rtol=tol(np.float32),
                                   atol=tol(np.float32) * np.abs(want).max())


def test_optimizer_arguments_are_checked():
    for make in (lambda: optim.SGD(lr=-1), lambda: optim.SGD(momentum=1.0),
                 lambda: optim.SGD(nesterov=True), lambda: optim.Adam(betas=(1.0, 0.9)),
                 lambda: optim.Adam(eps=0), lambda: optim.Adam(betas=0.9),
                 lambda: optim.AdamW(weight_decay=float("nan")), lambda: optim.SGD(lr="1")):
        with pytest.raises(clnn.ArgumentError):
            make()


def test_schedules_follow_torch():
    o = optim.SGD(lr=1.0)
    s = optim.StepLR(o, step_size=2, gamma=0.5)
    assert [s.step() for _ in range(5)] == [1.0, 0.5, 0.5, 0.25, 0.25]
    o = optim.Adam(lr=0.1)
    s = optim.CosineAnnealingLR(o, T_max=4, eta_min=0.01)
    lrs = [s.step() for _ in range(4)]
    assert lrs[1] == pytest.approx(0.055) and lrs[3] == pytest.approx(0.01)
    o = optim.SGD(lr=1.0)
    s = optim.LinearLR(o, start_factor=0.25, total_iters=3)
    assert o.lr == 0.25 and [s.step() for _ in range(4)] == [0.5, 0.75, 1.0, 1.0]


def _net(dev, seed=0):
    return nn.Sequential([nn.Conv2d(2, 3), nn.Flatten(), nn.Dense(4, "relu"),
                          nn.Dense(3, "softmax")], in_shape=(1, 6, 6), device=dev, seed=seed)


@pytest.mark.parametrize("make", [lambda: optim.SGD(lr=0.1, momentum=0.9, nesterov=True),
                                  lambda: optim.Adam(lr=0.01),
                                  lambda: optim.AdamW(lr=0.01)],
                         ids=["sgd-nesterov", "adam", "adamw"])
def test_a_checkpoint_resumes_bitwise(dev, tmp_path, make):
    x = RNG.standard_normal((8, 1, 6, 6)).astype(np.float32)
    y = RNG.integers(0, 3, 8)
    a = _net(dev)
    a.fit(x, y, "cross_entropy", epochs=4, batch_size=3, optimizer=make(), seed=1)
    b = _net(dev)
    b.fit(x, y, "cross_entropy", epochs=2, batch_size=3, optimizer=make(), seed=1)
    path = b.save(str(tmp_path / "mid.npz"))
    c = nn.load(path, device=dev)
    assert type(c.optimizer) is type(a.optimizer) and c.optimizer.steps == 6
    # the same shuffles as epochs 3 and 4 of the uninterrupted run
    rng = np.random.default_rng(1)
    orders = [rng.permutation(8) for _ in range(4)]
    for order in orders[2:]:
        c.fit(x[order], y[order], "cross_entropy", epochs=1, batch_size=3,
              optimizer=c.optimizer, shuffle=False)
    for p, q in zip(a.parameters(), c.parameters()):
        assert np.array_equal(p.get(), q.get())


def test_the_hook_sees_every_gradient_and_can_skip_or_rescale(dev):
    net = _net(dev, seed=2)
    x = RNG.standard_normal((5, 1, 6, 6)).astype(np.float32)
    y = RNG.integers(0, 3, 5)
    xd, yd, _, _ = net._train_args(x, y, "cross_entropy", 0.1, 0.0)
    before = [p.get() for p in net.parameters()]
    seen = []

    def skip(step):
        seen.append((len(step.grads), step.grad_scale))
        step.skip = True
    net.train_step(xd, yd, 0.1, 0.0, "cross_entropy", hook=skip)
    assert seen == [(6, 1 / 5)]
    assert all(np.array_equal(b, p.get()) for b, p in zip(before, net.parameters()))

    # doubling the gradients and halving the scale gives the same step
    other = _net(dev, seed=2)

    def rescale(step):
        for g in step.grads:
            clnn.scale(2.0, g, out=g)
        step.grad_scale /= 2
    net.train_step(xd, yd, 0.1, 0.0, "cross_entropy", hook=rescale)
    other.train_step(xd, yd, 0.1, 0.0, "cross_entropy")
    for p, q in zip(net.parameters(), other.parameters()):
        np.testing.assert_allclose(p.get(), q.get(), rtol=1e-6, atol=1e-7)


def test_fit_steps_the_schedule_and_checks_its_arguments(dev):
    net = _net(dev)
    x = RNG.standard_normal((6, 1, 6, 6)).astype(np.float32)
    y = RNG.integers(0, 3, 6)
    opt = optim.SGD(lr=0.1)
    net.fit(x, y, "cross_entropy", epochs=3, optimizer=opt,
            scheduler=optim.StepLR(opt, 1, gamma=0.5))
    assert opt.lr == pytest.approx(0.0125)
    for bad in ({"optimizer": "adam"}, {"scheduler": 3}, {"hook": 1}):
        with pytest.raises(clnn.ArgumentError):
            net.fit(x, y, "cross_entropy", **bad)
