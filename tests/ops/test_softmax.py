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


@pytest.mark.parametrize("cols", [16, 45])
def test_wide_rows_with_extremes(dev, cols, kernels):
    """Rows long enough for the CPU's vectors of 8 (and their tails): huge values do not
    overflow, -inf gets probability 0, and a NaN anywhere makes its row NaN, in the
    vectors or the tail alike."""
    z = (RNG.standard_normal((6, cols)) * 3).astype(np.float32)
    z[0, 3] = 1e4
    z[1, :] = -1e4
    z[1, cols - 1] = 3e4
    z[2, 5] = -np.inf
    z[3, 2] = np.nan
    z[4, cols - 1] = np.nan
    got = clnn.softmax(clnn.asarray(z)).get()
    logp = clnn.log_softmax(clnn.asarray(z)).get()
    assert np.all(np.isnan(got[3:5])) and np.all(np.isnan(logp[3:5]))
    ok = [0, 1, 2, 5]
    want = log_softmax_ref(z[ok])
    assert_close(got[ok], np.exp(want), np.float32, k=cols)
    assert got[2, 5] == 0 and logp[2, 5] == -np.inf
    fin = np.isfinite(want)
    assert_close(logp[ok][fin], want[fin], np.float32, k=cols,
                 scale=np.maximum(np.abs(want[fin]), 1.0))


@pytest.mark.parametrize("shape,axis", [((3, 4, 5), 0), ((3, 4, 5), 1), ((2, 7, 1, 33), 1),
                                        ((5,), 0), ((), None), ((4, 0, 3), 2),
                                        ((2, 3, 37), -2)],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_softmax_along_any_axis(dev, shape, axis, kernels):
    z = (RNG.standard_normal(shape) * 4).astype(np.float32)
    zz = z.astype(np.float64)
    ax = -1 if axis is None else axis
    if z.ndim:
        m = zz.max(ax, keepdims=True) if z.size else zz
        ref = zz - m - np.log(np.exp(zz - m).sum(ax, keepdims=True)) if z.size else zz
    else:
        ref = np.zeros(())                                # one element: log(1)
    for f, want in ((clnn.log_softmax, ref), (clnn.softmax, np.exp(ref))):
        if z.size == 0:
            assert f(clnn.asarray(z), axis=ax).shape == shape
            continue
        out = Guarded(dev, shape, np.float32)
        f(guarded_input(dev, z), axis=ax, out=out.view)
        assert_close(out.check(), want, np.float32, k=shape[ax] if z.ndim else 1)
    with pytest.raises(clnn.ShapeError):
        clnn.softmax(clnn.zeros((2, 3)), axis=2)


@DTYPES
@SHAPES
def test_softmax_cross_entropy(dev, shape, dtype, kernels):
    n, k = shape
    z = (RNG.standard_normal(shape) * 3).astype(dtype)
    y = np.eye(k, dtype=dtype)[RNG.integers(0, k, n)]
    y[0] = RNG.dirichlet(np.ones(k)).astype(dtype)     # a soft target too
    if n > 1:
        y[-1] = RNG.uniform(0, 1, k).astype(dtype)     # and one that is no distribution
    ls = log_softmax_ref(z)
    ref_loss = -(y * ls).sum() / n
    ref_grad = (np.exp(ls) * y.astype(np.float64).sum(1, keepdims=True) - y) / n
    dz = Guarded(dev, shape, dtype)
    loss, g = clnn.softmax_cross_entropy(guarded_input(dev, z), guarded_input(dev, y),
                                         dz=dz.view)
    assert g is dz.view and loss.shape == ()
    assert_close(loss.get(), ref_loss, dtype, k=n * k, scale=max(abs(ref_loss), 1))
    # (a row that is no distribution has gradients up to sum(y) / n, not 1 / n)
    assert_close(dz.check(), ref_grad, dtype, k=k, scale=np.maximum(np.abs(ref_grad), 1 / n))


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


def test_cross_entropy_gradient_of_targets_that_are_no_distribution(dev, kernels):
    """Regression (issue 15): rows of y that do not sum to 1 give PyTorch's loss and
    now its gradient, (softmax(z) sum(y) - y) / N, not (softmax(z) - y) / N."""
    z = np.array([[1, 2, 3], [0, -1, 2]], np.float32)
    y = np.array([[.2, .5, .5], [1, .3, .4]], np.float32)
    loss, g = clnn.softmax_cross_entropy(clnn.asarray(z), clnn.asarray(y))
    assert abs(float(loss.get()) - 2.28893) < 1e-5
    ls = log_softmax_ref(z)
    want = (np.exp(ls) * y.astype(np.float64).sum(1, keepdims=True) - y) / 2
    np.testing.assert_allclose(g.get(), want, atol=1e-6)
    assert np.abs(want - (np.exp(ls) - y) / 2).max() > 0.1     # the old answer was off
    if dev.facts.fp64:
        Y = clnn.asarray(y.astype(np.float64))
        num = numeric_grad(lambda v: float(clnn.softmax_cross_entropy(
            clnn.asarray(v), Y)[0].get()), z.astype(np.float64))
        _, g64 = clnn.softmax_cross_entropy(clnn.asarray(z.astype(np.float64)), Y)
        np.testing.assert_allclose(g64.get(), num, atol=1e-8)


def test_cross_entropy_bad_input(dev):
    with pytest.raises(clnn.ShapeError):
        clnn.softmax_cross_entropy(clnn.zeros((3, 4)), clnn.zeros((3, 5)))
    with pytest.raises(clnn.ShapeError):
        clnn.softmax_cross_entropy(clnn.zeros((0, 4)), clnn.zeros((0, 4)))
    with pytest.raises(clnn.ShapeError):
        clnn.softmax_cross_entropy(clnn.zeros(4), clnn.zeros(4))


@DTYPES
@pytest.mark.parametrize("shape,kernels", [
    ((1, 1), "device"), ((7, 10), "device"), ((64, 10), "device"), ((1024, 31), "device"),
    ((1025, 10), "device"), ((200, 40), "device"), ((200, 40), "work-groups")],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v)
@pytest.mark.parametrize("which", ["cross_entropy", "quadratic"])
def test_a_small_batchs_loss_comes_in_one_launch(dev, shape, dtype, which, kernels):
    """Up to 1024 rows short enough for a work-item each (fewer than 32 classes, or a
    CPU): the rows, the mean loss and (cross-entropy's ``db``) the gradient's column
    sums as stored, in one launch of one work-group (kernels/_head.cl), where the row
    kernel, the loss's reduction and bias_grad took three. Against float64 and against
    the row kernels (forced): the gradient bitwise theirs, the loss and db to rounding;
    canaries around the gradient and db; with a device loss scale and a float32 loss.
    ``kernels``: the device's row kernels, or the GPUs' (forced), which take rows of 32
    classes and more by work-groups: no head there."""
    import contextlib
    from clnn import programs, tuning
    def forced():
        return tuning.override("rows", {"wg": True}) if kernels == "work-groups" else \
            contextlib.nullcontext()
    n, k = shape
    z = (RNG.standard_normal(shape) * 3).astype(dtype)
    y = np.eye(k, dtype=dtype)[RNG.integers(0, k, n)]
    y64 = y.astype(np.float64)
    S = 2.0 ** 5
    sb = clnn.asarray(np.float32([S]), device=dev)
    if which == "cross_entropy":
        ls = log_softmax_ref(z)
        ref_loss = -(y64 * ls).sum() / n
        ref_grad = (np.exp(ls) - y64) * S / n
        fn = clnn.softmax_cross_entropy
    else:
        d = z.astype(np.float64) - y64
        ref_loss, ref_grad = (d ** 2).sum() / (2 * n), d * S / n
        fn = clnn.quadratic_loss
    loss_dt = np.float32 if dtype != np.float64 else None
    got = {}
    for head in (True, False):
        grad = Guarded(dev, shape, dtype)
        db = Guarded(dev, (k,), dtype) if which == "cross_entropy" else None
        kw = {"dz" if which == "cross_entropy" else "da": grad.view}
        if db is not None:
            kw["db"] = db.view
        with forced(), tuning.override("loss", {} if head else {"head": 0}), \
                programs.captured() as launches:
            loss, _ = fn(guarded_input(dev, z), guarded_input(dev, y), scale_by=sb,
                         loss_dtype=loss_dt, **kw)
        g = grad.check()
        got[head] = (float(loss.get()), g, db.check() if db is not None else None,
                     len(launches))
        assert_close(loss.get(), ref_loss, dtype, k=n * k, scale=max(abs(ref_loss), 1))
        assert_close(g, ref_grad, dtype, k=k, scale=np.maximum(np.abs(ref_grad), S / n))
        if db is not None:      # the column sums of the gradient as stored
            assert_close(db.check(), g.astype(np.float64).sum(0), dtype, k=n,
                         scale=np.abs(g.astype(np.float64)).sum(0) + S / n)
    small = n <= 1024 and (k < 32 or (dev.facts.is_cpu and kernels == "device"))
    assert got[True][3] == (1 if small else got[False][3])
    assert np.array_equal(got[True][1], got[False][1])
    if not small:           # the row kernels either way: the same bits
        assert got[True][0] == got[False][0]
        if which == "cross_entropy":
            assert np.array_equal(got[True][2], got[False][2])


def test_a_bias_gradient_that_cannot_be_summed_is_refused(dev):
    """Bad db: a typed error before anything is written."""
    z, y = clnn.zeros((4, 5)), clnn.zeros((4, 5))
    dz = Guarded(dev, (4, 5), np.float32, fill=np.ones((4, 5)))
    for db, err in ((clnn.zeros((4,)), clnn.ShapeError),
                    (clnn.zeros((5,), np.float16), clnn.DTypeError),
                    (dz.view[0], clnn.ShapeError),                    # overlaps dz
                    (np.zeros(5, np.float32), clnn.ArgumentError)):
        with pytest.raises(err):
            clnn.softmax_cross_entropy(z, y, dz=dz.view, db=db)
    assert np.all(dz.check() == 1)
