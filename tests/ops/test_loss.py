import numpy as np
import pytest

import clnn
from conftest import Guarded, assert_close, float_dtypes, guarded_input
from reference import numeric_grad

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(1, 1), (1, 10), (97, 3), (1000, 10)],
                         ids=lambda s: "x".join(map(str, s)))
def test_quadratic_loss_and_gradient(dev, shape, dtype, kernels):
    a = RNG.random(shape).astype(dtype)
    y = RNG.random(shape).astype(dtype)
    d = a.astype(np.float64) - y
    da = Guarded(dev, shape, dtype)
    loss, g = clnn.quadratic_loss(guarded_input(dev, a), guarded_input(dev, y), da=da.view)
    assert g is da.view
    assert_close(loss.get(), (d ** 2).sum() / (2 * shape[0]), dtype, k=a.size)
    assert_close(da.check(), d / shape[0], dtype, k=2, scale=1.0 / shape[0])


def test_quadratic_gradient_matches_finite_differences(dev):
    if not dev.facts.fp64:
        pytest.skip("finite differences need float64")
    a = RNG.random((3, 4))
    y = RNG.random((3, 4))
    Y = clnn.asarray(y)
    _, g = clnn.quadratic_loss(clnn.asarray(a), Y)
    num = numeric_grad(lambda v: float(clnn.quadratic_loss(clnn.asarray(v), Y)[0].get()), a)
    np.testing.assert_allclose(g.get(), num, atol=1e-8)


def test_quadratic_bad_input_leaves_gradient_untouched(dev):
    da = Guarded(dev, (3, 4), np.float32, fill=np.ones((3, 4)))
    with pytest.raises(clnn.ShapeError):
        clnn.quadratic_loss(clnn.zeros((3, 4)), clnn.zeros((4, 3)), da=da.view)
    assert np.all(da.check() == 1)
