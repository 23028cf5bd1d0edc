import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import clnn
from conftest import Guarded, assert_close, guarded_input
from reference import pool2d_ref

RNG = np.random.default_rng(41)


@pytest.mark.parametrize("mode", ["max", "avg"])
@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 3), C=st.integers(1, 4), H=st.integers(1, 12), W=st.integers(1, 12),
       kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3),
       data=st.data())
def test_pooling_forward_and_backward(mode, N, C, H, W, kh, kw, sh, sw, data):
    ph = data.draw(st.integers(0, kh // 2))
    pw = data.draw(st.integers(0, kw // 2))
    if kh > H + 2 * ph or kw > W + 2 * pw:
        with pytest.raises(clnn.ShapeError):
            clnn.max_pool2d(clnn.zeros((N, C, H, W)), (kh, kw), (sh, sw), (ph, pw))
        return
    # few distinct values, so max pooling meets ties
    x = RNG.integers(-3, 4, (N, C, H, W)).astype(np.float32)
    ref, backward = pool2d_ref(x, (kh, kw), (sh, sw), (ph, pw), mode)
    fwd = clnn.max_pool2d if mode == "max" else clnn.avg_pool2d
    bwd = clnn.max_pool2d_backward if mode == "max" else clnn.avg_pool2d_backward
    X = guarded_input(clnn.device(), x)
    y = Guarded(clnn.device(), ref.shape, np.float32)
    fwd(X, (kh, kw), (sh, sw), (ph, pw), out=y.view)
    assert_close(y.check(), ref, np.float32, k=kh * kw)
    dy = RNG.standard_normal(ref.shape).astype(np.float32)
    dx = Guarded(clnn.device(), x.shape, np.float32)
    bwd(guarded_input(clnn.device(), dy), X, (kh, kw), (sh, sw), (ph, pw), out=dx.view)
    k = -(-kh // sh) * -(-kw // sw)
    assert_close(dx.check(), backward(dy), np.float32, k=k,
                 scale=np.maximum(backward(np.abs(dy)), 1))


def test_defaults_and_bad_input():
    x = clnn.asarray(RNG.standard_normal((1, 2, 4, 4)).astype(np.float32))
    assert clnn.max_pool2d(x, 2).shape == (1, 2, 2, 2)
    with pytest.raises(clnn.ShapeError):
        clnn.max_pool2d(x, 2, padding=2)
    with pytest.raises(clnn.ShapeError):
        clnn.avg_pool2d(x, 5)
    with pytest.raises(clnn.ShapeError):
        clnn.max_pool2d_backward(clnn.zeros((1, 2, 3, 3)), x, 2)


@pytest.mark.parametrize("H,W", [(2, 2), (7, 9), (28, 28), (1 + 2 * 5, 2 * 8)])
def test_2x2_max_pooling_ties_and_nans(H, W):
    """2x2 windows with stride 2 have their own kernels: the first maximum in row-major
    order wins, a NaN beats any number, rows and columns past the last window get no
    gradient. Checked against the reference and against the general kernels."""
    import sys
    from unittest import mock
    x = RNG.integers(-2, 3, (2, 3, H, W)).astype(np.float32)     # many ties
    x[0, 0, 0, 1] = x[1, 2, -1, -1] = x[1, 1, 0, 0] = np.nan
    x[1, 1, 0, 1] = np.nan                                          # two in one window
    ref, backward = pool2d_ref(x, (2, 2), (2, 2), (0, 0), "max")
    dy = RNG.standard_normal(ref.shape).astype(np.float32)
    X, DY = clnn.asarray(x), clnn.asarray(dy)
    fast = clnn.max_pool2d(X, 2).get(), clnn.max_pool2d_backward(DY, X, 2).get()
    np.testing.assert_array_equal(fast[0], ref.astype(np.float32))
    np.testing.assert_array_equal(fast[1], backward(dy).astype(np.float32))
    pool = sys.modules["clnn.ops.pool"]
    with mock.patch.object(pool, "_is_22", lambda *a: False):
        general = clnn.max_pool2d(X, 2).get(), clnn.max_pool2d_backward(DY, X, 2).get()
    for a, b in zip(fast, general):
        np.testing.assert_array_equal(a, b)
