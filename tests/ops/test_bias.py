import numpy as np
import pytest

import clnn
from conftest import Guarded, assert_close, float_dtypes, guarded_input

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(1, 1), (7, 1), (1, 13), (97, 31), (5000, 3), (3, 4, 5, 7),
                                   (2, 6, 1, 1)], ids=lambda s: "x".join(map(str, s)))
def test_bias_add_and_grad(dev, shape, dtype, kernels):
    x = RNG.standard_normal(shape).astype(dtype)
    b = RNG.standard_normal(shape[1]).astype(dtype)
    bshape = (1, shape[1]) + (1,) * (len(shape) - 2)
    out = Guarded(dev, shape, dtype)
    clnn.bias_add(guarded_input(dev, x), guarded_input(dev, b), out=out.view)
    assert_close(out.check(), x.astype(np.float64) + b.reshape(bshape), dtype,
                 scale=np.maximum(np.abs(x) + np.abs(b.reshape(bshape)), 1))
    db = Guarded(dev, (shape[1],), dtype)
    clnn.bias_grad(guarded_input(dev, x), out=db.view)
    axes = (0,) + tuple(range(2, len(shape)))
    k = x.size // shape[1]
    assert_close(db.check(), x.astype(np.float64).sum(axes), dtype, k=k,
                 scale=np.abs(x.astype(np.float64)).sum(axes), ulps=2)


def test_bias_add_in_place_and_bad_shapes(dev):
    x = clnn.asarray(np.ones((4, 3), np.float32))
    b = clnn.asarray(np.array([1, 2, 3], np.float32))
    assert clnn.bias_add(x, b, out=x) is x
    assert np.array_equal(x.get(), np.ones((4, 3)) + [1, 2, 3])
    with pytest.raises(clnn.ShapeError):
        clnn.bias_add(x, clnn.zeros(4))
    with pytest.raises(clnn.ShapeError):
        clnn.bias_grad(clnn.zeros(5))
    with pytest.raises(clnn.ShapeError):
        clnn.bias_grad(x, out=clnn.zeros(4))


@pytest.mark.parametrize("shape", [(9, 5), (4, 3, 7, 6)], ids=["dense", "images"])
def test_bias_grad_as_a_momentum_update(dev, shape, kernels):
    """v = alpha * db + beta * v in one pass (the layers' bias update)."""
    x = RNG.standard_normal(shape).astype(np.float32)
    v0 = RNG.standard_normal(shape[1]).astype(np.float32)
    v = Guarded(dev, (shape[1],), np.float32, fill=v0)
    clnn.bias_grad(guarded_input(dev, x), out=v.view, alpha=-0.25, beta=0.9)
    axes = (0,) + tuple(range(2, len(shape)))
    ref = -0.25 * x.astype(np.float64).sum(axes) + 0.9 * v0
    assert_close(v.check(), ref, np.float32, k=x.size // shape[1],
                 scale=0.25 * np.abs(x.astype(np.float64)).sum(axes) + np.abs(v0))
    with pytest.raises(clnn.ArgumentError):
        clnn.bias_grad(clnn.asarray(x), beta=0.5)
