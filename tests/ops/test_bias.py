import numpy as np
import pytest

import clnn
from clnn.ops.elementwise import ACTIVATION_PARAMS
from conftest import Guarded, assert_close, float_dtypes, guarded_input
from reference import df_ref

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


# (activation, where its derivative is taken): every one, from a as the layers take
# them, and from z where some settings need it
FUSED = [("relu", "a"), ("sigmoid", "a"), ("tanh", "z"), ("leaky_relu", "a"), ("elu", "a"),
         ("softplus", "z"), ("identity", "a"), ("tanh", "a")]


SHAPES = [(1, 1), (7, 13), (97, 31), (600, 3), (3, 4, 5, 7), (2, 6, 1, 1), (1, 2, 91, 113)]


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_activation_bias_backward(dev, shape, dtype, kernels):
    """out = dy * f'(z) and db = out summed over every axis but 1, in one pass on the
    GPUs' kernel (forced here too): out is the float64 reference within
    activation_backward's bounds (and its result bit for bit where no math built-in
    takes part: exp's vector and scalar forms differ in the last places on CPUs), and
    db the float64 sum of out as stored (what bias_grad would sum), with dy overwritten in
    place or not, and canaries around both outputs. The shapes take every form: rows of
    one, columns in chunks (600 rows), images' sums over H*W in chunks (10283). Each
    shape takes three of the activations, in turn, so that every dtype meets each of
    them in two or three shapes (each a kernel build of its own: all eight everywhere
    took a cold run a minute more)."""
    axes = (0,) + tuple(range(2, len(shape)))
    j = SHAPES.index(shape)
    for i, (act, src) in enumerate(FUSED[k % len(FUSED)] for k in range(3 * j, 3 * j + 3)):
        dy = RNG.standard_normal(shape).astype(dtype)
        z = RNG.standard_normal(shape).astype(dtype)
        s = clnn.activation(act, clnn.asarray(z, device=dev)).get() if src == "a" else z
        want = clnn.activation_backward(act, clnn.asarray(dy, device=dev),
                                        **{src: clnn.asarray(s, device=dev)}).get()
        in_place = i % 2 == 0
        d = Guarded(dev, shape, dtype, fill=dy)
        out = d if in_place else Guarded(dev, shape, dtype)
        db = Guarded(dev, (shape[1],), dtype)
        got = clnn.activation_bias_backward(act, d.view, db.view,
                                            **{src: guarded_input(dev, s)}, out=out.view)
        assert got[0] is out.view and got[1] is db.view
        stored = out.check()
        # against float64 as activation_backward's own tests check it (from a: a's
        # rounding too), and bit for bit where no math built-in takes part
        p = ACTIVATION_PARAMS.get(act)
        assert_close(stored, dy.astype(np.float64) * df_ref(act, z, p), dtype,
                     k=4 if src == "a" else 1, scale=np.maximum(np.abs(dy), 1))
        if act in ("relu", "leaky_relu", "identity"):
            assert np.array_equal(stored, want), (act, src)
        if not in_place:
            assert np.array_equal(d.check(), dy)            # dy left as it was
        ref = stored.astype(np.float64)
        assert_close(db.check(), ref.sum(axes), dtype, k=dy.size // shape[1],
                     scale=np.abs(ref).sum(axes), ulps=2)


def test_activation_bias_backward_on_the_gpu_kernel_sums_as_bias_grad(dev):
    """The one pass sums in bias_grad's order: the same bits as the two ops in turn."""
    from clnn import tuning
    for shape in ((600, 3), (3, 4, 5, 7), (1, 2, 91, 113)):
        dy = RNG.standard_normal(shape).astype(np.float32)
        a = clnn.relu(clnn.asarray(RNG.standard_normal(shape).astype(np.float32), device=dev))
        with tuning.override("reduce", {"wg": True}):
            two = clnn.activation_backward("relu", clnn.asarray(dy, device=dev), a=a)
            db2 = clnn.bias_grad(two)
            _, db1 = clnn.activation_bias_backward("relu", clnn.asarray(dy, device=dev),
                                                   clnn.zeros(shape[1], device=dev), a=a)
        assert np.array_equal(db1.get(), db2.get())


def test_activation_bias_backward_refuses_bad_input_before_writing(dev):
    dy0 = RNG.standard_normal((6, 4)).astype(np.float32)
    a = clnn.asarray(np.abs(RNG.standard_normal((6, 4))).astype(np.float32), device=dev)
    db = Guarded(dev, (4,), np.float32)
    cases = [
        (clnn.ArgumentError, "db", lambda dy: clnn.activation_bias_backward(
            "relu", dy, None, a=a)),
        (clnn.ShapeError, "db", lambda dy: clnn.activation_bias_backward(
            "relu", dy, clnn.zeros(5, device=dev), a=a)),
        (clnn.ShapeError, "overlaps", lambda dy: clnn.activation_bias_backward(
            "relu", dy, dy.reshape(-1)[:4], a=a, out=dy)),
        (clnn.ArgumentError, "exactly one", lambda dy: clnn.activation_bias_backward(
            "relu", dy, db.view, a=a, z=a)),
        (clnn.ArgumentError, "unknown activation", lambda dy: clnn.activation_bias_backward(
            "gelu", dy, db.view, a=a)),
        (clnn.ShapeError, "channels on axis 1", lambda dy: clnn.activation_bias_backward(
            "relu", dy.reshape(-1), db.view, a=a.reshape(-1))),
        (clnn.ShapeError, None, lambda dy: clnn.activation_bias_backward(
            "relu", dy, db.view, a=a[:3])),
        (clnn.ArgumentError, "softplus", lambda dy: clnn.activation_bias_backward(
            "softplus", dy, db.view, a=a, param=(1.0, 5.0))),
    ]
    for err, match, call in cases:
        dy = clnn.asarray(dy0, device=dev)
        with pytest.raises(err, match=match):
            call(dy)
        assert np.array_equal(dy.get(), dy0)
        db.check()
        assert np.all(db.view.get() == db.canary)
