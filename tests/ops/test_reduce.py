import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import clnn
from conftest import AWKWARD, Guarded, assert_close, float_dtypes, guarded_input

RNG = np.random.default_rng(99)
DTYPES = pytest.mark.parametrize("dtype", float_dtypes(), ids=lambda t: np.dtype(t).name)


def guarded_scalar(dev, dtype):
    return Guarded(dev, (), dtype)


@DTYPES
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1003, 100003], ids=lambda n: f"n{n}")
def test_count_nonfinite(dev, n, dtype, kernels):
    """Infs and NaNs of both signs counted wherever they sit (first, last, inside the
    8-element vectors and their tails), and the largest finite values and subnormals
    not counted (a sum of them would overflow)."""
    import ml_dtypes
    info = ml_dtypes.finfo(dtype)
    x = RNG.standard_normal(n).astype(dtype)
    x[RNG.integers(0, n, n // 3)] = info.max
    x[RNG.integers(0, n, n // 5)] = -info.max
    x[RNG.integers(0, n, n // 7)] = info.smallest_subnormal
    assert clnn.count_nonfinite(guarded_input(dev, x)) == 0
    bad = np.unique(np.concatenate([[0, n - 1], RNG.integers(0, n, n // 11)]))
    x[bad] = np.array([np.inf, -np.inf, np.nan, -np.nan])[np.arange(bad.size) % 4]
    assert clnn.count_nonfinite(guarded_input(dev, x)) == bad.size


@DTYPES
@pytest.mark.parametrize("n", AWKWARD, ids=lambda n: f"n{n}")
def test_full_reductions(dev, n, dtype, kernels):
    x = RNG.standard_normal(n).astype(dtype)
    y = RNG.standard_normal(n).astype(dtype)
    X, Y = guarded_input(dev, x), guarded_input(dev, y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    abs_sum = np.abs(x64).sum()
    cases = [
        (clnn.sum, (X,), x64.sum(), abs_sum),
        (clnn.mean, (X,), x64.mean(), abs_sum / n),
        (clnn.max, (X,), x64.max(), np.abs(x64).max()),
        (clnn.dot, (X, Y), x64 @ y64, np.abs(x64 * y64).sum()),
        (clnn.nrm2, (X,), np.sqrt(x64 @ x64), np.sqrt(x64 @ x64)),
    ]
    for fn, args, ref, scale in cases:
        out = guarded_scalar(dev, dtype)
        r = fn(*args, out=out.view)
        assert r is out.view and r.shape == ()
        assert_close(out.check(), ref, dtype, k=n, scale=max(scale, 1e-30), ulps=2)
        assert fn(*args).shape == ()


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 13), min_size=1, max_size=4), data=st.data())
def test_axis_reductions(shape, data):
    dev = clnn.device()
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = RNG.standard_normal(shape).astype(np.float32)
    X = guarded_input(dev, x)
    x64 = x.astype(np.float64)
    k = shape[axis]
    for fn, ref, scale in [(clnn.sum, x64.sum(axis), np.abs(x64).sum(axis)),
                           (clnn.mean, x64.mean(axis), np.abs(x64).mean(axis)),
                           (clnn.max, x64.max(axis), np.abs(x64).max(axis))]:
        out = Guarded(dev, ref.shape, np.float32)
        fn(X, axis=axis, out=out.view)
        assert_close(out.check(), ref, np.float32, k=k, scale=np.maximum(scale, 1e-30), ulps=2)


@pytest.mark.parametrize("ly", [None, 256], ids=["ly-default", "ly256"])
@pytest.mark.parametrize("shape", [(3, 5000, 7), (1, 70000, 1), (40, 33, 70), (1, 3, 100)])
def test_axes_with_work_group_kernels(dev, shape, ly):
    """The GPU kernels' rows (inner 1: the default tree of 64, and 256 as bench_ops.py
    --row-group forces it) and columns (inner > 1), with chunks."""
    from clnn import tuning
    x = RNG.standard_normal(shape).astype(np.float32)
    X = clnn.asarray(x)
    with tuning.override("reduce", {"wg": True, "ly": ly}):
        for axis in range(3):
            got = clnn.sum(X, axis=axis).get()
            ref = x.astype(np.float64).sum(axis)
            assert_close(got, ref, np.float32, k=shape[axis],
                         scale=np.abs(x.astype(np.float64)).sum(axis), ulps=2)
            assert np.array_equal(clnn.max(X, axis=axis).get(), x.max(axis))


@pytest.mark.parametrize("shape", [(3, 37, 13), (2, 300, 8), (1, 1000, 70), (5, 40, 9),
                                   (2, 1537, 11), (4, 33, 1), (1, 4099, 1), (2, 31, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_the_cpu_kernels_vector_forms(dev, shape, dtype):
    """The CPU kernel's forms for a contiguous row (8 partial results side by side,
    with a tail), for columns (8 neighbouring outputs a work-item, with a partial last
    span) and for long columns (chunks of 256 rows or more, streamed a row at a time),
    forced on any device; NaN wins max wherever it falls."""
    from clnn import tuning
    x = RNG.standard_normal(shape).astype(dtype)
    x64 = x.astype(np.float64)
    X = guarded_input(dev, x)
    with tuning.override("reduce", {"wg": False}):
        for axis in range(3):
            out = Guarded(dev, x64.sum(axis).shape, dtype)
            clnn.sum(X, axis=axis, out=out.view)
            assert_close(out.check(), x64.sum(axis), dtype, k=shape[axis],
                         scale=np.abs(x64).sum(axis), ulps=2)
            assert np.array_equal(clnn.max(X, axis=axis).get(), x.max(axis))
        y = x.copy()
        y[0, shape[1] // 2, -1] = np.nan            # in a row's lanes or tail
        y[-1, -1, 0] = -np.inf
        Y = clnn.asarray(y)
        for axis in range(3):
            got, want = clnn.max(Y, axis=axis).get(), np.max(y, axis=axis)
            assert np.array_equal(np.isnan(got), np.isnan(want)), axis
            assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)]), axis


def test_long_axis_is_split_and_still_exact(dev, kernels):
    # 3 rows of 200003: the split into chunks and the second pass must cover every element
    x = RNG.standard_normal((3, 200003)).astype(np.float32)
    got = clnn.sum(clnn.asarray(x), axis=1).get()
    assert_close(got, x.astype(np.float64).sum(1), np.float32, k=200003,
                 scale=np.abs(x).sum(1), ulps=2)
    x = RNG.standard_normal((200003, 3)).astype(np.float32)
    got = clnn.max(clnn.asarray(x), axis=0).get()
    assert np.array_equal(got, x.max(0))


def test_deterministic(dev, kernels):
    x = clnn.asarray(RNG.standard_normal(1000003).astype(np.float32))
    first = [clnn.sum(x).get(), clnn.dot(x, x).get(), clnn.nrm2(x).get()]
    for _ in range(5):
        again = [clnn.sum(x).get(), clnn.dot(x, x).get(), clnn.nrm2(x).get()]
        assert [a.tobytes() for a in again] == [a.tobytes() for a in first]


def test_max_propagates_nan(dev, kernels):
    x = np.arange(1000, dtype=np.float32)
    x[500] = np.nan
    assert np.isnan(clnn.max(clnn.asarray(x)).get())


def test_empty_sums_are_zero_means_nan_and_max_an_error(dev, kernels):
    """numpy's and PyTorch's answers: sum 0, mean NaN; the max of nothing is an error."""
    x = clnn.empty((0,))
    assert clnn.sum(x).get() == 0
    with pytest.raises(clnn.ShapeError):
        clnn.max(x)
    assert np.isnan(clnn.mean(x).get())
    m = clnn.mean(clnn.empty((3, 0)), axis=1).get()
    assert m.shape == (3,) and np.all(np.isnan(m))
    assert clnn.mean(clnn.empty((0, 3)), axis=1).shape == (0,)


def test_bad_axis_and_out(dev):
    x = clnn.zeros((3, 4))
    with pytest.raises(clnn.ShapeError):
        clnn.sum(x, axis=2)
    out = Guarded(dev, (3,), np.float32, fill=[1, 2, 3])
    with pytest.raises(clnn.ShapeError):
        clnn.sum(x, axis=0, out=out.view)
    assert np.array_equal(out.check(), [1, 2, 3])
    with pytest.raises(clnn.ShapeError):
        clnn.dot(x, clnn.zeros((4, 3)))


@pytest.mark.parametrize("shape,axis", [((3, 4, 5), (0, 2)), ((3, 4, 5), (1, 2)),
                                        ((2, 3, 4, 5), (0, 1, 3)), ((7, 1, 13), (-1, 0)),
                                        ((2, 3, 4, 5), (3, 1)), ((5, 6), ()),
                                        ((0, 3), (1,)), ((4,), (0,))],
                         ids=lambda v: "x".join(map(str, v)) if v else "none")
@pytest.mark.parametrize("keepdims", [False, True])
def test_several_axes_and_keepdims(dev, shape, axis, keepdims, kernels):
    x = RNG.standard_normal(shape).astype(np.float32)
    X = guarded_input(dev, x) if x.size else clnn.asarray(x)
    for f, ref in ((clnn.sum, np.sum), (clnn.mean, np.mean), (clnn.max, np.max)):
        want_shape = np.sum(np.zeros(shape), axis=axis, keepdims=keepdims).shape
        if f is clnn.max and any(shape[a] == 0 for a in axis):
            with pytest.raises(clnn.ShapeError):
                f(X, axis=axis, keepdims=keepdims)
            continue
        with np.errstate(invalid="ignore"):
            want = ref(x.astype(np.float64), axis=axis, keepdims=keepdims)
        k = int(np.prod([shape[a] for a in axis])) if axis else 1
        if want.size == 0:                    # nothing to guard: only the shape
            assert f(X, axis=axis, keepdims=keepdims).shape == want.shape
            continue
        out = Guarded(dev, want_shape, np.float32)
        assert f(X, axis=axis, out=out.view, keepdims=keepdims) is out.view
        got = out.check()
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert_close(np.nan_to_num(got), np.nan_to_num(want), np.float32, k=k)


def test_axis_arguments_are_checked(dev):
    x = clnn.zeros((3, 4))
    for axis in ((0, 0), (0, 2), (1, -3)):
        with pytest.raises(clnn.ShapeError):
            clnn.sum(x, axis=axis)
    with pytest.raises(clnn.ArgumentError):
        clnn.sum(x, axis=0, keepdims=1)
