"""batch_norm and batch_norm_backward against float64 references of PyTorch's formulas
(and PyTorch itself when it is installed), on awkward shapes with offsets and canaries;
the backward pass against finite differences."""

import sys

import numpy as np
import pytest

import clnn
from clnn import programs
from conftest import Guarded, assert_close, float_dtypes, guarded_input
from reference import numeric_grad

RNG = np.random.default_rng(77)
DTYPES = pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
# (N, C, ...): M = N * positions values per channel, below, at and past the work-group
SHAPES = pytest.mark.parametrize(
    "shape", [(2, 1), (7, 3), (97, 2), (1, 2, 13), (5, 4, 3, 3), (3, 2, 17, 19)],
    ids=lambda s: "x".join(map(str, s)))


def axes(shape):
    return (0,) + tuple(range(2, len(shape)))


def per_channel(v, shape):
    return np.asarray(v, np.float64).reshape((1, shape[1]) + (1,) * (len(shape) - 2))


def act_ref(name, z):
    return {"identity": z, "relu": np.maximum(z, 0),
            "elu": np.where(z > 0, z, np.expm1(np.minimum(z, 0)))}[name]


def bn_ref(x, w, b, mean=None, var=None, eps=1e-5):
    """PyTorch's batch_norm in float64: batch statistics unless mean and var given."""
    x = x.astype(np.float64)
    if mean is None:
        mean, var = x.mean(axes(x.shape)), x.var(axes(x.shape))
    xhat = (x - per_channel(mean, x.shape)) / np.sqrt(per_channel(var, x.shape) + eps)
    if w is not None:
        xhat = xhat * per_channel(w, x.shape) + per_channel(b, x.shape)
    return xhat


def bn_backward_ref(dy, x, w, eps=1e-5):
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    ax = axes(x.shape)
    mean, var = x.mean(ax), x.var(ax)
    invstd = 1 / np.sqrt(per_channel(var, x.shape) + eps)
    xhat = (x - per_channel(mean, x.shape)) * invstd
    g = dy * (per_channel(w, x.shape) if w is not None else 1)
    dx = invstd * (g - g.mean(ax, keepdims=True) - xhat * (g * xhat).mean(ax, keepdims=True))
    return dx, (dy * xhat).sum(ax), dy.sum(ax)


def setup(dev, shape, dtype, affine=True):
    x = (RNG.standard_normal(shape) * 3 + 1).astype(dtype)
    C = shape[1]
    w = RNG.uniform(0.5, 2, C).astype(dtype) if affine else None
    b = RNG.standard_normal(C).astype(dtype) if affine else None
    acc = programs.acc_dtype(dtype)
    return x, w, b, acc


@DTYPES
@SHAPES
@pytest.mark.parametrize("affine,act", [(True, "identity"), (False, "relu"), (True, "elu")])
def test_training_forward_and_running_statistics(dev, shape, dtype, affine, act):
    x, w, b, acc = setup(dev, shape, dtype, affine)
    C, M = shape[1], x.size // shape[1]
    rm0, rv0 = RNG.standard_normal(C).astype(acc), RNG.uniform(0.5, 2, C).astype(acc)
    rm, rv = Guarded(dev, (C,), acc, fill=rm0), Guarded(dev, (C,), acc, fill=rv0)
    out, save = Guarded(dev, shape, dtype), Guarded(dev, (2, C), acc)
    W = B = None
    if affine:
        W, B = guarded_input(dev, w), guarded_input(dev, b)
    clnn.batch_norm(guarded_input(dev, x), rm.view, rv.view, W, B, training=True,
                    momentum=0.3, activation=None if act == "identity" else act,
                    out=out.view, save=save.view)
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axes(shape)), x64.var(axes(shape))
    assert_close(out.check(), act_ref(act, bn_ref(x, w, b)), dtype, k=M)
    assert_close(save.check(), np.stack([mean, var]), dtype, k=M,
                 scale=np.maximum(np.abs(np.stack([mean, var])), 3))
    assert_close(rm.check(), 0.7 * rm0 + 0.3 * mean, dtype, k=M)
    assert_close(rv.check(), 0.7 * rv0 + 0.3 * var * M / (M - 1), dtype, k=M)


@DTYPES
@SHAPES
def test_evaluation_uses_the_running_statistics(dev, shape, dtype):
    x, w, b, acc = setup(dev, shape, dtype)
    C = shape[1]
    rm, rv = RNG.standard_normal(C).astype(acc), RNG.uniform(0.5, 2, C).astype(acc)
    out = Guarded(dev, shape, dtype)
    RM, RV = clnn.asarray(rm, device=dev), clnn.asarray(rv, device=dev)
    clnn.batch_norm(guarded_input(dev, x), RM, RV, guarded_input(dev, w),
                    guarded_input(dev, b), activation="relu", eps=1e-3, out=out.view)
    assert_close(out.check(), np.maximum(bn_ref(x, w, b, rm, rv, eps=1e-3), 0), dtype)
    assert np.array_equal(RM.get(), rm) and np.array_equal(RV.get(), rv)


@DTYPES
@SHAPES
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_backward(dev, shape, dtype, affine):
    x, w, b, acc = setup(dev, shape, dtype, affine)
    C, M = shape[1], x.size // shape[1]
    dy = RNG.standard_normal(shape).astype(dtype)
    X = guarded_input(dev, x)
    save = clnn.empty((2, C), acc, device=dev)
    W = guarded_input(dev, w) if affine else None
    clnn.batch_norm(X, weight=W, bias=guarded_input(dev, b) if affine else None,
                    training=True, save=save)
    dx = Guarded(dev, shape, dtype)
    dw, db = (Guarded(dev, (C,), dtype), Guarded(dev, (C,), dtype)) if affine else (None,) * 2
    got = clnn.batch_norm_backward(guarded_input(dev, dy), X, save, W, dx=dx.view,
                                   dweight=dw and dw.view, dbias=db and db.view)
    assert got[0] is dx.view
    rdx, rdw, rdb = bn_backward_ref(dy, x, w)
    # dx is a difference of terms of size |g| * invstd: bound relative to those
    scale = np.abs(dy).max() * (np.abs(w).max() if affine else 1) / np.sqrt(
        x.astype(np.float64).var(axes(shape))).min()
    assert_close(dx.check(), rdx, dtype, k=M, scale=scale)
    if affine:
        assert_close(dw.check(), rdw, dtype, k=M, scale=np.abs(dy).max() * 4)
        assert_close(db.check(), rdb, dtype, k=M, scale=np.abs(dy).max())
    else:
        assert got[1] is None and got[2] is None


@pytest.mark.parametrize("wg", [1, 64, 256])
def test_every_work_group_form(dev, monkeypatch, wg):
    """The per-channel sums as a CPU takes them (a work-item per channel, planes 8
    at a time) and as GPUs do (trees of 64 and 256), each forced: statistics, forward
    with a vector activation, and backward against float64, on planes shorter than,
    equal to and past a vector."""
    monkeypatch.setattr(sys.modules["clnn.ops.batchnorm"], "_wg", lambda dev: wg)
    for shape in ((9, 3), (4, 2, 2, 4), (3, 5, 7, 11)):
        x = (RNG.standard_normal(shape) * 2 + 1).astype(np.float32)
        dy = RNG.standard_normal(shape).astype(np.float32)
        w = RNG.uniform(0.5, 2, shape[1]).astype(np.float32)
        b = RNG.standard_normal(shape[1]).astype(np.float32)
        X, W = clnn.asarray(x, device=dev), clnn.asarray(w, device=dev)
        save = clnn.empty((2, shape[1]), np.float32, device=dev)
        out = clnn.batch_norm(X, weight=W, bias=clnn.asarray(b, device=dev), training=True,
                              save=save, activation="tanh")
        ax = axes(shape)
        x64 = x.astype(np.float64)
        mean, var = x64.mean(ax), x64.var(ax)
        z = (x64 - per_channel(mean, shape)) / np.sqrt(per_channel(var, shape) + 1e-5)
        ref = np.tanh(per_channel(w, shape) * z + per_channel(b, shape))
        M = x.size // shape[1]
        assert_close(save.get()[0], mean, np.float32, k=M, scale=np.abs(x64).max(ax))
        assert_close(save.get()[1], var, np.float32, k=M, scale=var + mean ** 2)
        assert_close(out.get(), ref, np.float32, k=M, scale=4)
        dx, dw, db = clnn.batch_norm_backward(clnn.asarray(dy, device=dev), X, save, W)
        rdx, rdw, rdb = bn_backward_ref(dy, x, w)
        scale = np.abs(dy).max() * np.abs(w).max() / np.sqrt(var).min()
        assert_close(dx.get(), rdx, np.float32, k=M, scale=scale)
        assert_close(dw.get(), rdw, np.float32, k=M, scale=np.abs(dy).max() * 4)
        assert_close(db.get(), rdb, np.float32, k=M, scale=np.abs(dy).max())


def test_backward_matches_finite_differences(dev):
    if not dev.facts.fp64:
        pytest.skip("finite differences need float64")
    x = RNG.standard_normal((3, 2, 2, 3)) * 2 + 1
    w, b = RNG.uniform(0.5, 2, 2), RNG.standard_normal(2)
    r = RNG.standard_normal(x.shape)            # L = sum(r * bn(x))

    def loss(xv, wv=w, bv=b):
        out = clnn.batch_norm(clnn.asarray(xv), weight=clnn.asarray(wv),
                              bias=clnn.asarray(bv), training=True)
        return float((out.get() * r).sum())
    save = clnn.empty((2, 2), np.float64)
    X, W = clnn.asarray(x), clnn.asarray(w)
    clnn.batch_norm(X, weight=W, bias=clnn.asarray(b), training=True, save=save)
    dx, dw, db = clnn.batch_norm_backward(clnn.asarray(r), X, save, W)
    np.testing.assert_allclose(dx.get(), numeric_grad(loss, x), atol=1e-7)
    np.testing.assert_allclose(dw.get(), numeric_grad(lambda v: loss(x, v), w), atol=1e-7)
    np.testing.assert_allclose(db.get(), numeric_grad(lambda v: loss(x, w, v), b), atol=1e-7)


def test_bitwise_reproducible(dev):
    x = clnn.asarray(RNG.standard_normal((64, 3, 11, 13)).astype(np.float32))
    dy = clnn.asarray(RNG.standard_normal((64, 3, 11, 13)).astype(np.float32))
    W = clnn.asarray(np.ones(3, np.float32))
    runs = []
    for _ in range(2):
        save = clnn.empty((2, 3), np.float32)
        out = clnn.batch_norm(x, weight=W, bias=clnn.zeros(3), training=True, save=save)
        runs.append([a.get() for a in (out, save) + clnn.batch_norm_backward(dy, x, save, W)])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_dx_may_overwrite_dy(dev):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    dy = RNG.standard_normal((4, 3)).astype(np.float32)
    X, DY = clnn.asarray(x), clnn.asarray(dy)
    save = clnn.empty((2, 3), np.float32)
    clnn.batch_norm(X, training=True, save=save)
    want = clnn.batch_norm_backward(DY, X, save)[0].get()
    assert clnn.batch_norm_backward(DY, X, save, dx=DY)[0] is DY
    np.testing.assert_array_equal(DY.get(), want)


def test_bad_arguments_write_nothing(dev):
    x = clnn.asarray(RNG.standard_normal((4, 3, 2)).astype(np.float32))
    rm, rv = clnn.zeros(3), clnn.asarray(np.ones(3, np.float32))
    out = Guarded(dev, (4, 3, 2), np.float32)
    cases = [
        (clnn.ArgumentError, dict()),                                 # eval without stats
        (clnn.ArgumentError, dict(running_mean=rm, training=True)),   # one of the pair
        (clnn.ShapeError, dict(running_mean=clnn.zeros(4), running_var=clnn.zeros(4),
                               training=True)),
        (clnn.ArgumentError, dict(weight=clnn.zeros(3), training=True)),
        (clnn.ArgumentError, dict(training=True, eps=0.0)),
        (clnn.ArgumentError, dict(running_mean=rm, running_var=rv, training=True,
                                  momentum=float("inf"))),
        (clnn.ArgumentError, dict(training=True, activation="nope")),
        (clnn.ShapeError, dict(training=True, save=clnn.zeros((3, 2)))),
        (clnn.ShapeError, dict(training=True, save=out.view.reshape(24)[:6].reshape(2, 3))),
        (clnn.DTypeError, dict(running_mean=clnn.zeros(3, np.float64),
                               running_var=clnn.zeros(3, np.float64))),
    ]
    for err, kw in cases:
        with pytest.raises(err):
            clnn.batch_norm(x, out=out.view, **kw)
        out.check()
    with pytest.raises(clnn.ShapeError):     # one value per channel cannot be trained
        clnn.batch_norm(clnn.zeros((1, 3)), training=True)
    with pytest.raises(clnn.ShapeError):
        clnn.batch_norm(clnn.zeros(3), rm, rv)
    save = clnn.empty((2, 3), np.float32)
    with pytest.raises(clnn.ArgumentError):
        clnn.batch_norm_backward(x, x, save, dweight=clnn.zeros(3))
    with pytest.raises(clnn.ShapeError):
        clnn.batch_norm_backward(x, x, clnn.empty((3, 2), np.float32))
    with pytest.raises(clnn.ShapeError):
        clnn.batch_norm_backward(clnn.zeros((4, 3, 2)), x, save, dx=x)   # dx over x
    with pytest.raises(clnn.ArgumentError):
        clnn.update_running_stats(rm, rv, save, 0.1, 1)


def test_matches_torch(dev):
    torch = pytest.importorskip("torch")
    x = (RNG.standard_normal((6, 4, 5, 3)) * 2 + 0.5).astype(np.float32)
    bn = torch.nn.BatchNorm2d(4, momentum=0.2)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(RNG.uniform(0.5, 2, 4).astype(np.float32)))
        bn.bias.copy_(torch.tensor(RNG.standard_normal(4).astype(np.float32)))
    xt = torch.tensor(x, requires_grad=True)
    yt = bn(xt)
    dy = RNG.standard_normal(x.shape).astype(np.float32)
    yt.backward(torch.tensor(dy))
    W, B = clnn.asarray(bn.weight.detach().numpy()), clnn.asarray(bn.bias.detach().numpy())
    rm, rv = clnn.zeros(4), clnn.asarray(np.ones(4, np.float32))
    save = clnn.empty((2, 4), np.float32)
    X = clnn.asarray(x)
    out = clnn.batch_norm(X, rm, rv, W, B, training=True, momentum=0.2, save=save)
    dx, dw, db = clnn.batch_norm_backward(clnn.asarray(dy), X, save, W)
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.get(), yt.detach().numpy(), **tol)
    np.testing.assert_allclose(rm.get(), bn.running_mean.numpy(), **tol)
    np.testing.assert_allclose(rv.get(), bn.running_var.numpy(), **tol)
    np.testing.assert_allclose(dx.get(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw.get(), bn.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db.get(), bn.bias.grad.numpy(), rtol=1e-4, atol=1e-4)
    bn.eval()
    np.testing.assert_allclose(clnn.batch_norm(X, rm, rv, W, B).get(),
                               bn(torch.tensor(x)).detach().numpy(), **tol)
