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


@pytest.mark.parametrize("dtype", [np.float16, clnn.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("which", ["quadratic", "cross_entropy"])
def test_a_16_bit_loss_in_float32(dev, which, dtype, kernels):
    """loss_dtype=float32: a 16-bit input's loss as summed in float32 (PyTorch's autocast
    computes losses so), not rounded to the input's 8 or 11 bits; the gradient is the
    same either way. Another loss_dtype is refused before anything runs."""
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((53, 10)) * 3).astype(dtype)
    y = np.eye(10, dtype=dtype)[rng.integers(0, 10, 53)]
    fn = clnn.quadratic_loss if which == "quadratic" else clnn.softmax_cross_entropy
    a64, y64 = a.astype(np.float64), y.astype(np.float64)
    if which == "quadratic":
        ref = ((a64 - y64) ** 2).sum() / (2 * 53)
    else:
        z = a64 - a64.max(1, keepdims=True)
        ref = -(y64 * (z - np.log(np.exp(z).sum(1, keepdims=True)))).sum() / 53
    A, Y = guarded_input(dev, a), guarded_input(dev, y)
    l32, g32 = fn(A, Y, loss_dtype=np.float32)
    l16, g16 = fn(A, Y)
    assert l32.dtype == np.float32 and l16.dtype == np.dtype(dtype)
    assert abs(float(l32.get()) - ref) <= 1e-5 * abs(ref)
    assert float(l16.get()) == float(np.asarray(l32.get()).astype(dtype))
    assert np.array_equal(g32.get(), g16.get())
    with pytest.raises(clnn.DTypeError):
        fn(A, Y, loss_dtype=np.float64)
