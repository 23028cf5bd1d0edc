import numpy as np
import pytest

import clnn
from conftest import Guarded, assert_close, float_dtypes, guarded_input
from reference import numeric_grad

RNG = np.random.default_rng(5)
DTYPES = pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
SHAPES = pytest.mark.parametrize("shape", [(1, 1), (1, 10), (7, 1), (13, 97), (300, 10)],
                                 ids=lambda s: "x".join(map(str, s)))


def log_softmax_ref(z):
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


@DTYPES
@SHAPES
def test_softmax_and_log_softmax(dev, shape, dtype, kernels):
    z = (RNG.standard_normal(shape) * 5).astype(dtype)
    ref = log_softmax_ref(z)
    out = Guarded(dev, shape, dtype)
    clnn.softmax(guarded_input(dev, z), out=out.view)
    assert_close(out.check(), np.exp(ref), dtype, k=shape[1])
    out = Guarded(dev, shape, dtype)
    clnn.log_softmax(guarded_input(dev, z), out=out.view)
    assert_close(out.check(), ref, dtype, k=shape[1])


def test_softmax_large_inputs_do_not_overflow(dev, kernels):
    z = np.array([[1e4, 0, -1e4], [1e4, 1e4, 1e4], [-1e4, -1e4, -3e4]], np.float32)
    got = clnn.softmax(clnn.asarray(z)).get()
    assert np.all(np.isfinite(got))
    assert_close(got, np.exp(log_softmax_ref(z)), np.float32, k=3)
    assert np.all(np.isfinite(clnn.log_softmax(clnn.asarray(z)).get()[:, 1:2]))


@DTYPES
@SHAPES
def test_softmax_cross_entropy(dev, shape, dtype, kernels):
    n, k = shape
    z = (RNG.standard_normal(shape) * 3).astype(dtype)
    y = np.eye(k, dtype=dtype)[RNG.integers(0, k, n)]
    y[0] = RNG.dirichlet(np.ones(k)).astype(dtype)     # a soft target too
    ls = log_softmax_ref(z)
    ref_loss = -(y * ls).sum() / n
    ref_grad = (np.exp(ls) - y) / n
    dz = Guarded(dev, shape, dtype)
    loss, g = clnn.softmax_cross_entropy(guarded_input(dev, z), guarded_input(dev, y),
                                         dz=dz.view)
    assert g is dz.view and loss.shape == ()
    assert_close(loss.get(), ref_loss, dtype, k=n * k, scale=max(abs(ref_loss), 1))
    assert_close(dz.check(), ref_grad, dtype, k=k, scale=1.0 / n)


def test_cross_entropy_gradient_matches_finite_differences(dev):
    if not dev.facts.fp64:
        pytest.skip("finite differences need float64")
    z = RNG.standard_normal((4, 5))
    y = np.eye(5)[[0, 3, 2, 4]]
    Y = clnn.asarray(y)
    _, g = clnn.softmax_cross_entropy(clnn.asarray(z), Y)
    num = numeric_grad(
        lambda v: float(clnn.softmax_cross_entropy(clnn.asarray(v), Y)[0].get()), z)
    np.testing.assert_allclose(g.get(), num, atol=1e-8)


def test_cross_entropy_bad_input(dev):
    with pytest.raises(clnn.ShapeError):
        clnn.softmax_cross_entropy(clnn.zeros((3, 4)), clnn.zeros((3, 5)))
    with pytest.raises(clnn.ShapeError):
        clnn.softmax_cross_entropy(clnn.zeros((0, 4)), clnn.zeros((0, 4)))
    with pytest.raises(clnn.ShapeError):
        clnn.softmax_cross_entropy(clnn.zeros(4), clnn.zeros(4))
