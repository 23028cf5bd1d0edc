"""cross_entropy against a float64 reference of torch.nn.functional.cross_entropy's
definition (class indices or probabilities, weights, ignore_index, label smoothing,
reductions, spatial inputs), its gradient against finite differences, PyTorch itself
when installed, and bad targets refused before anything is written."""

import numpy as np
import pytest

import clnn
from conftest import CANARY, Guarded, assert_close, float_dtypes, guarded_input
from reference import numeric_grad

RNG = np.random.default_rng(15)
DTYPES = pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)


def xent_ref(z, target, weight=None, ignore_index=-100, reduction="mean", eps=0.0):
    """PyTorch's cross-entropy from its documented formulas, in float64."""
    z = np.moveaxis(z.astype(np.float64), 1, -1)            # (N, d..., C)
    C = z.shape[-1]
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    w = np.ones(C) if weight is None else weight.astype(np.float64)
    if target.dtype.kind in "iu":
        keep = target != ignore_index
        t = np.where(keep, target, 0)
        nll = -np.take_along_axis(logp, t[..., None], -1)[..., 0] * w[t]
        smooth = -(logp * w).sum(-1)
        loss = np.where(keep, (1 - eps) * nll + eps / C * smooth, 0.0)
        denom = np.where(keep, w[t], 0.0).sum()
    else:
        y = np.moveaxis(target.astype(np.float64), 1, -1) * (1 - eps) + eps / C
        loss = -(y * w * logp).sum(-1)
        denom = loss.size
    if reduction == "none":
        return loss
    return loss.sum() / denom if reduction == "mean" else loss.sum()


CASES = [  # shape, weighted, ignore, eps, reduction
    ((1, 1), False, False, 0.0, "mean"),
    ((7, 5), True, True, 0.0, "mean"),
    ((13, 3), False, True, 0.1, "sum"),
    ((4, 6, 3), True, False, 0.2, "none"),
    ((2, 3, 5, 7), True, True, 0.05, "mean"),
    ((31, 97), False, False, 0.0, "none"),
]


@DTYPES
@pytest.mark.parametrize("shape,weighted,ignore,eps,reduction", CASES,
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
@pytest.mark.parametrize("kind", ["index", "prob"])
def test_cross_entropy_matches_the_reference(dev, dtype, shape, weighted, ignore, eps,
                                             reduction, kind):
    N, C = shape[0], shape[1]
    z = (RNG.standard_normal(shape) * 3).astype(dtype)
    w = RNG.uniform(0.2, 2, C).astype(dtype) if weighted else None
    if kind == "index":
        t = RNG.integers(0, C, (N,) + shape[2:]).astype(np.int32)
        if ignore:
            t.flat[::3] = 7 if C <= 7 else -1         # some ignored positions
        ignore_index = (7 if C <= 7 else -1) if ignore else -100
        T = clnn.asarray(t)
    else:
        t = RNG.uniform(0, 1, shape).astype(dtype)    # need not sum to 1 (PyTorch)
        ignore_index = -100
        T = guarded_input(dev, t)
    ref_loss = xent_ref(z, t, w, ignore_index, reduction, eps)
    dz = Guarded(dev, shape, dtype)
    loss, g = clnn.cross_entropy(guarded_input(dev, z), T,
                                 None if w is None else guarded_input(dev, w), ignore_index,
                                 reduction, eps, dz=dz.view)
    assert g is dz.view
    rows = z.size // C
    assert_close(loss.get(), ref_loss, dtype, k=C * (rows if reduction != "none" else 1),
                 scale=np.maximum(np.abs(ref_loss), 1))
    if dtype == np.float64 and dev.facts.fp64 and z.size <= 120:
        zz = z.astype(np.float64)
        num = numeric_grad(lambda v: float(np.sum(xent_ref(v, t, w, ignore_index,
                                                           reduction, eps))), zz)
        np.testing.assert_allclose(dz.check(), num, atol=1e-7)
    else:
        dz.check()


def test_the_gradient_is_the_kernel_gradient_of_its_own_loss(dev):
    if not dev.facts.fp64:
        pytest.skip("finite differences need float64")
    z = RNG.standard_normal((3, 4, 2))
    t = clnn.asarray(np.array([[0, 3], [-100, 1], [2, 2]], np.int32))
    w = clnn.asarray(RNG.uniform(0.5, 2, 4))
    _, g = clnn.cross_entropy(clnn.asarray(z), t, w, label_smoothing=0.1)
    num = numeric_grad(lambda v: float(clnn.cross_entropy(clnn.asarray(v), t, w,
                                                          label_smoothing=0.1)[0].get()), z)
    np.testing.assert_allclose(g.get(), num, atol=1e-8)


def test_all_ignored_mean_is_nan_and_empty_batches(dev):
    z = clnn.asarray(RNG.standard_normal((3, 4)).astype(np.float32))
    t = clnn.asarray(np.full(3, -100, np.int32))
    assert np.isnan(float(clnn.cross_entropy(z, t)[0].get()))
    assert float(clnn.cross_entropy(z, t, reduction="sum")[0].get()) == 0
    e = clnn.zeros((0, 4))
    assert np.isnan(float(clnn.cross_entropy(e, clnn.asarray(np.zeros(0, np.int32)))[0].get()))
    assert clnn.cross_entropy(e, clnn.zeros((0, 4)), reduction="none")[0].shape == (0,)


def test_bad_targets_and_arguments_write_nothing(dev):
    z = clnn.asarray(RNG.standard_normal((4, 3)).astype(np.float32))
    dz = Guarded(dev, (4, 3), np.float32)
    for t in ([0, 1, 3, 2], [0, -1, 1, 2]):                   # out of range, not ignored
        with pytest.raises(clnn.ShapeError, match="outside"):
            clnn.cross_entropy(z, clnn.asarray(np.array(t, np.int32)), dz=dz.view)
    good = clnn.asarray(np.array([0, 1, 2, 0], np.int32))
    for kw in (dict(reduction="avg"), dict(label_smoothing=1.5), dict(ignore_index=2 ** 40),
               dict(ignore_index=1.0), dict(weight=clnn.zeros(4)),
               dict(weight=clnn.zeros(3, np.float64))):
        with pytest.raises((clnn.ArgumentError, clnn.ShapeError, clnn.DTypeError)):
            clnn.cross_entropy(z, good, dz=dz.view, **kw)
    for t in (clnn.asarray(np.zeros((4, 1), np.int32)), clnn.zeros((4, 2)),
              clnn.asarray(np.zeros(4, np.int64))):
        with pytest.raises((clnn.ShapeError, clnn.DTypeError)):
            clnn.cross_entropy(z, t, dz=dz.view)
    with pytest.raises(clnn.ShapeError):
        clnn.cross_entropy(clnn.zeros(3), good)
    dz.check()
    assert np.all(dz.view.get() == CANARY)


def test_matches_torch(dev):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    z = RNG.standard_normal((5, 4, 3)).astype(np.float32)
    t = RNG.integers(0, 4, (5, 3)).astype(np.int32)
    t[0, 0] = t[3, 2] = -100
    w = RNG.uniform(0.5, 2, 4).astype(np.float32)
    for reduction in ("mean", "sum", "none"):
        zt = torch.tensor(z, requires_grad=True)
        want = F.cross_entropy(zt, torch.tensor(t, dtype=torch.int64), torch.tensor(w),
                               reduction=reduction, label_smoothing=0.15)
        want.sum().backward()
        loss, g = clnn.cross_entropy(clnn.asarray(z), clnn.asarray(t), clnn.asarray(w),
                                     reduction=reduction, label_smoothing=0.15)
        np.testing.assert_allclose(loss.get(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g.get(), zt.grad.numpy(), rtol=1e-5, atol=1e-6)
