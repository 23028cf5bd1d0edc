import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import clnn
from conftest import AWKWARD, Guarded, assert_close, float_dtypes, guarded_input
from reference import df_ref, f_ref

RNG = np.random.default_rng(1234)


PARAM = {"leaky_relu": 0.1, "elu": 0.7, "softplus": 1.5}


def inputs(n, dtype):
    # a spread of values that avoids exact zeros, where derivatives of relu-likes jump
    z = RNG.uniform(-6, 6, n)
    z[np.abs(z) < 1e-3] = 0.5
    return z.astype(dtype)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("name", clnn.ACTIVATIONS)
@pytest.mark.parametrize("n", [1, 7, 97, 1000003], ids=lambda n: f"n{n}")
def test_activation_forward(dev, name, n, dtype):
    z = inputs(n, dtype)
    out = Guarded(dev, (n,), dtype)
    r = clnn.activation(name, guarded_input(dev, z), out=out.view, param=PARAM.get(name))
    assert r is out.view
    assert_close(out.check(), f_ref(name, z, PARAM.get(name, 0)), dtype)


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("name", clnn.ACTIVATIONS)
@pytest.mark.parametrize("src", ["z", "a"])
def test_activation_derivative_and_backward(dev, name, src, dtype):
    n = 997
    p = PARAM.get(name)
    z = inputs(n, dtype)
    # the derivative from a is computed from the stored (rounded) output, as training does
    a = f_ref(name, z, p or 0).astype(dtype)
    x = guarded_input(dev, z if src == "z" else a)
    ref = df_ref(name, z, p or 0)
    out = Guarded(dev, (n,), dtype)
    clnn.activation_derivative(name, **{src: x}, out=out.view, param=p)
    # from a, the rounding of a itself moves the result by about one ulp of a
    assert_close(out.check(), ref, dtype, k=4 if src == "a" else 1)
    dy = RNG.standard_normal(n).astype(dtype)
    out = Guarded(dev, (n,), dtype)
    clnn.activation_backward(name, guarded_input(dev, dy), **{src: x}, out=out.view, param=p)
    assert_close(out.check(), dy * ref, dtype, k=4 if src == "a" else 1,
                 scale=np.maximum(np.abs(dy), 1))


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("beta,threshold", [(1.0, 20.0), (2.0, 3.0), (0.5, 1.0), (3.0, -1.0)])
def test_softplus_beta_and_threshold(dev, beta, threshold, dtype):
    """PyTorch's softplus(z, beta, threshold): forward, derivative and backward from z,
    on values on both sides of the threshold, against the float64 reference and, for
    the backward, finite differences away from the jump at beta z = threshold."""
    n = 1009
    z = np.concatenate([inputs(n - 3, dtype), np.array([threshold / beta] * 3)])
    z = z.astype(dtype)
    p = (beta, threshold)
    out = Guarded(dev, (n,), dtype)
    clnn.softplus(guarded_input(dev, z), out=out.view, beta=beta, threshold=threshold)
    assert_close(out.check(), f_ref("softplus", z, p), dtype, k=2)
    out = Guarded(dev, (n,), dtype)
    clnn.activation_derivative("softplus", z=guarded_input(dev, z), out=out.view, param=p)
    assert_close(out.check(), df_ref("softplus", z, p), dtype, k=2)
    dy = RNG.standard_normal(n).astype(dtype)
    got = clnn.activation_backward("softplus", clnn.asarray(dy), z=clnn.asarray(z),
                                   param=p).get()
    assert_close(got, dy * df_ref("softplus", z, p), dtype, k=2,
                 scale=np.maximum(np.abs(dy), 1))
    if dtype == np.float64:
        h = 1e-6
        far = np.abs(beta * z - threshold) > 1e-3
        fd = (f_ref("softplus", z + h, p) - f_ref("softplus", z - h, p)) / (2 * h)
        np.testing.assert_allclose(got[far], (dy * fd)[far], rtol=1e-7, atol=1e-8)
    # from the output a, the two branches overlap below the default threshold
    if threshold < 20:
        with pytest.raises(clnn.ArgumentError, match="needs z"):
            clnn.activation_backward("softplus", clnn.asarray(dy), a=clnn.asarray(z), param=p)


def test_softplus_fused_everywhere(dev):
    """The (beta, threshold) pair reaches every fused epilogue: both GEMM variants,
    the convolution (implicit GEMM and the grouped direct kernel), batch_norm."""
    from clnn import tuning
    p = (2.0, 1.5)
    a = RNG.standard_normal((13, 11)).astype(np.float32)
    b = RNG.standard_normal((11, 9)).astype(np.float32)
    ref = f_ref("softplus", a.astype(np.float64) @ b, p)
    for row in (tuning.GEMM_TABLE["type"]["CPU"], tuning.GEMM_TABLE["type"]["GPU"],
                dict(tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")][-1], KSPLIT=3)):
        with tuning.override("gemm", row):
            got = clnn.gemm(clnn.asarray(a), clnn.asarray(b), activation="softplus",
                            activation_param=p).get()
        assert_close(got, ref, np.float32, k=11, scale=np.abs(a) @ np.abs(b) + 1)
    x = RNG.standard_normal((2, 4, 6, 5)).astype(np.float32)
    w = RNG.standard_normal((4, 2, 3, 3)).astype(np.float32)
    for groups in (1, 2):
        wg = w if groups == 2 else RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)
        lin = clnn.conv2d(clnn.asarray(x), clnn.asarray(wg), groups=groups).get()
        got = clnn.conv2d(clnn.asarray(x), clnn.asarray(wg), groups=groups,
                          activation="softplus", activation_param=p).get()
        assert_close(got, f_ref("softplus", lin, p), np.float32, k=36,
                     scale=np.abs(lin) + 1)
    rm, rv = clnn.zeros(4), clnn.asarray(np.full(4, 1.0, np.float32))
    lin = clnn.batch_norm(clnn.asarray(x), rm, rv).get()
    got = clnn.batch_norm(clnn.asarray(x), rm, rv, activation="softplus",
                          activation_param=p).get()
    assert_close(got, f_ref("softplus", lin, p), np.float32, k=2)


def test_named_activation_functions_match_activation(dev):
    z = clnn.asarray(inputs(50, np.float32))
    assert np.array_equal(clnn.elu(z, alpha=0.3).get(), clnn.activation("elu", z, param=0.3).get())
    assert np.array_equal(clnn.leaky_relu(z).get(),
                          clnn.activation("leaky_relu", z, param=0.01).get())
    assert np.array_equal(clnn.relu(z).get(), np.maximum(z.get(), 0))


def test_activations_do_not_overflow(dev):
    z = np.array([-1e4, -100, 0, 100, 1e4], np.float32)
    for name in clnn.ACTIVATIONS:
        got = clnn.activation(name, clnn.asarray(z)).get()
        assert np.all(np.isfinite(got)), (name, got)


def test_activation_in_place(dev):
    z = inputs(101, np.float32)
    x = clnn.asarray(z)
    assert clnn.sigmoid(x, out=x) is x
    assert_close(x.get(), f_ref("sigmoid", z, 0), np.float32)


def _in_place_cases(n, dtype):
    """(name, inputs, the input out is, call(arrays, out), float64 reference)."""
    z, y = inputs(n, dtype), inputs(n, dtype)
    z64, y64 = z.astype(np.float64), y.astype(np.float64)
    b = inputs(7, dtype)
    bias = np.tile(b.astype(np.float64), n // 7)
    return [
        ("tanh", {"z": z}, "z", lambda a, o: clnn.tanh(a["z"], out=o), np.tanh(z64)),
        ("derivative", {"z": z}, "z",
         lambda a, o: clnn.activation_derivative("tanh", z=a["z"], out=o),
         df_ref("tanh", z64, 0)),
        *[("backward", {"dy": y, "a": z}, which,
           lambda a, o: clnn.activation_backward("relu", a["dy"], a=a["a"], out=o),
           y64 * (z64 > 0)) for which in ("dy", "a")],
        *[("hadamard", {"x": z, "y": y}, which,
           lambda a, o: clnn.hadamard(a["x"], a["y"], out=o), z64 * y64)
          for which in ("x", "y")],
        *[("axpy", {"x": z, "y": y}, which,
           lambda a, o: clnn.axpy(-1.5, a["x"], a["y"], out=o), -1.5 * z64 + y64)
          for which in ("x", "y")],
        ("scale", {"x": z}, "x", lambda a, o: clnn.scale(0.25, a["x"], out=o), 0.25 * z64),
        ("bias_add", {"x": z}, "x",
         lambda a, o: clnn.bias_add(a["x"].reshape(n // 7, 7), clnn.asarray(b),
                                    out=o.reshape(n // 7, 7)), z64 + bias),
    ]


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
def test_every_element_wise_kernel_in_place_on_each_input(dev, dtype):
    """out may be any one input: the kernels then store through that input's pointer
    (so the compiler vectorises); every op, each input it can overwrite, at an offset
    with canaries, against float64 references."""
    n = 7 * 1429                      # a multiple of the bias's 7 channels, and prime 1429
    for name, host, which, call, ref in _in_place_cases(n, dtype):
        arrays = {k: Guarded(dev, (n,), dtype, fill=v) for k, v in host.items()}
        views = {k: g.view for k, g in arrays.items()}
        call(views, views[which])
        assert_close(arrays[which].check(), ref, dtype), (name, which)
        for k, g in arrays.items():       # the other inputs are as they were
            if k != which:
                np.testing.assert_array_equal(g.check(), host[k])


@pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("n", AWKWARD, ids=lambda n: f"n{n}")
def test_linalg_ops(dev, n, dtype):
    x = RNG.standard_normal(n).astype(dtype)
    y = RNG.standard_normal(n).astype(dtype)
    X, Y = guarded_input(dev, x), guarded_input(dev, y)
    ref = {
        "hadamard": x.astype(np.float64) * y,
        "axpy": -1.5 * x.astype(np.float64) + y,
        "scale": 0.25 * x.astype(np.float64),
        "copy": x.astype(np.float64),
    }
    for op, want in ref.items():
        out = Guarded(dev, (n,), dtype)
        if op == "hadamard":
            clnn.hadamard(X, Y, out=out.view)
        elif op == "axpy":
            clnn.axpy(-1.5, X, Y, out=out.view)
        elif op == "scale":
            clnn.scale(0.25, X, out=out.view)
        else:
            clnn.copy(X, out=out.view)
        assert_close(out.check(), want, dtype, k=2, scale=np.maximum(np.abs(x * y), 1))
    out = Guarded(dev, (n,), dtype)
    clnn.fill(out.view, 3.25)
    assert np.all(out.check() == 3.25)
    # axpy without out updates y in place, like BLAS
    assert clnn.axpy(2.0, X, Y) is Y
    assert_close(Y.get(), 2.0 * x.astype(np.float64) + y, dtype, k=2,
                 scale=np.maximum(np.abs(x), 1))


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4),
       alpha=st.sampled_from([0.0, 1.0, -1.5]))
def test_axpy_any_shape(shape, alpha):
    x = RNG.standard_normal(shape).astype(np.float32)
    y = RNG.standard_normal(shape).astype(np.float32)
    got = clnn.axpy(alpha, clnn.asarray(x), clnn.asarray(y)).get()
    assert_close(got, alpha * x.astype(np.float64) + y, np.float32, k=2,
                 scale=np.maximum(np.abs(x), 1))


def test_zero_size_is_a_no_op(dev):
    x = clnn.empty((0, 3))
    assert clnn.sigmoid(x).shape == (0, 3)
    assert clnn.fill(x, 1.0) is x


class TestBadInput:
    def test_shape_mismatch(self, dev):
        out = Guarded(dev, (5,), np.float32, fill=np.arange(5))
        with pytest.raises(clnn.ShapeError):
            clnn.hadamard(clnn.zeros(5), clnn.zeros(6), out=out.view)
        with pytest.raises(clnn.ShapeError):
            clnn.sigmoid(clnn.zeros(6), out=out.view)
        assert np.array_equal(out.check(), np.arange(5))

    def test_dtype_mismatch_and_unsupported(self, dev):
        with pytest.raises(clnn.DTypeError):
            clnn.hadamard(clnn.zeros(5), clnn.zeros(5, np.float64) if dev.facts.fp64 else
                          clnn.asarray(np.zeros(5, np.int32)))
        with pytest.raises(clnn.DTypeError):
            clnn.relu(clnn.asarray(np.zeros(5, np.int32)))
        with pytest.raises(clnn.DTypeError):
            clnn.relu(clnn.asarray(np.zeros(3, np.float32)),
                      out=clnn.asarray(np.zeros(3, np.float16)))

    def test_not_an_array(self, dev):
        with pytest.raises(clnn.ArgumentError):
            clnn.relu(np.zeros(3, np.float32))

    def test_bad_parameters(self, dev):
        x = clnn.zeros(4)
        with pytest.raises(clnn.ArgumentError):
            clnn.activation("swish", x)
        with pytest.raises(clnn.ArgumentError):
            clnn.elu(x, alpha=float("nan"))
        with pytest.raises(clnn.ArgumentError):
            clnn.elu(x, alpha=-1.0)
        with pytest.raises(clnn.ArgumentError):
            clnn.axpy(float("inf"), x, x)
        with pytest.raises(clnn.ArgumentError):
            clnn.activation_derivative("relu", z=x, a=x)
        for bad in (0.0, -1.0, float("inf"), (1.0,), (1.0, float("nan")), (1.0, 2.0, 3.0)):
            with pytest.raises(clnn.ArgumentError):
                clnn.activation("softplus", x, param=bad)

    def test_non_contiguous(self, dev):
        x = clnn.zeros((4, 6))
        with pytest.raises(clnn.ShapeError):
            clnn.relu(x[:, ::2])

    def test_partial_overlap_is_refused(self, dev):
        big = clnn.asarray(np.arange(10, dtype=np.float32))
        with pytest.raises(clnn.ShapeError):
            clnn.scale(2.0, big[0:6], out=big[2:8])
        assert np.array_equal(big.get(), np.arange(10))

    def test_arrays_from_different_contexts(self, dev):
        import pyopencl as cl
        import pyopencl.array as cla
        ctx = cl.Context([dev.cl_device])
        foreign = cla.zeros(cl.CommandQueue(ctx), 4, np.float32)
        with pytest.raises(clnn.DeviceError):
            clnn.relu(foreign)


@pytest.mark.parametrize("dtype,unroll", [(t, 4) for t in (np.float32, np.float64, np.float16,
                                                            clnn.bfloat16)] + [(np.float32, 3)],
                         ids=lambda v: v if isinstance(v, int) else np.dtype(v).name)
def test_gpu_loop_every_kernel(dev, dtype, unroll):
    """The GPUs' loop (elementwise.cl's each() with ``unroll`` > 1: several elements per
    work-item loaded before any is stored), forced on the test device: every
    activation's three kernels, the linear-algebra kernels and each in-place form, at
    sizes below, at and past one pass of the grid, with canaries, against float64."""
    from clnn import tuning
    if not dev.supports(dtype):
        pytest.skip(f"{np.dtype(dtype).name} is not supported on {dev.name}")
    with tuning.override("elementwise", {"unroll": unroll}):
        for n in (1, 5, 7 * 1429):
            dy = RNG.standard_normal(n).astype(dtype)
            for name in clnn.ACTIVATIONS:
                p = PARAM.get(name)
                z = inputs(n, dtype)
                out = Guarded(dev, (n,), dtype)
                clnn.activation(name, guarded_input(dev, z), out=out.view, param=p)
                assert_close(out.check(), f_ref(name, z, p or 0), dtype)
                a = f_ref(name, z, p or 0).astype(dtype)
                for src, x in (("z", z), ("a", a)):
                    if name == "softplus" and src == "a":
                        continue
                    k = 4 if src == "a" else 1
                    out = Guarded(dev, (n,), dtype)
                    clnn.activation_derivative(name, **{src: guarded_input(dev, x)},
                                               out=out.view, param=p)
                    assert_close(out.check(), df_ref(name, z, p or 0), dtype, k=k)
                    out = Guarded(dev, (n,), dtype)
                    clnn.activation_backward(name, guarded_input(dev, dy),
                                             **{src: guarded_input(dev, x)}, out=out.view,
                                             param=p)
                    assert_close(out.check(), dy * df_ref(name, z, p or 0), dtype, k=k,
                                 scale=np.maximum(np.abs(dy), 1))
        test_every_element_wise_kernel_in_place_on_each_input(dev, dtype)
        test_linalg_ops(dev, 97, dtype)
        test_linalg_ops(dev, 1000003, dtype)
