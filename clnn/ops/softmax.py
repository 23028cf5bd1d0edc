"""Softmax, log-softmax and the softmax cross-entropy loss fused with its gradient.
Kernel: clnn/kernels/softmax.cl.
"""

import math

import numpy as np

from .. import programs
from ._args import check, check_out, common_device, done, launch_size, normalize_axis, offset
from ._memo import memoized
from .loss import HEAD_VARIANTS, fused_loss, row_groups

programs.register("softmax", {"wg": 0, "dscale": 0, "head": 0, "lossout": "acc"},
                  lambda: [{"wg": 0, "dscale": 0}, {"wg": 64, "dscale": 0},
                           {"wg": 256, "dscale": 0}, {"wg": 0, "dscale": 1},
                           {"wg": 64, "dscale": 1}] + HEAD_VARIANTS)


def _rowwise(entry, x, axis, out):
    dev = common_device(x=x, out=out)
    dt = check(x, "x", dev)          # any rank; a 0-d array is one row of one
    axis = normalize_axis(axis, x.ndim) if x.ndim else None
    out = check_out(out, x.shape, dt, dev, inputs=(x,))
    if axis is None:
        outer, cols, inner = 1, 1, 1
    else:
        outer = int(math.prod(x.shape[:axis]))
        cols = x.shape[axis]
        inner = int(math.prod(x.shape[axis + 1:]))
    rows = outer * inner
    if rows and cols:
        wg = row_groups(dev, rows, cols)
        if wg:
            kern = programs.get_kernel(dev, "softmax", entry + "_wg",
                                       {"dtype": programs.dtype_name(dt), "wg": wg[1][0]})
            g, l = wg
        else:
            kern = programs.get_kernel(dev, "softmax", entry, {"dtype": programs.dtype_name(dt)})
            g, l = launch_size(dev, rows)
        done(out, kern(g, l, rows=rows, cols=cols, inner=inner, x=x, x_off=offset(x),
                       out=out, out_off=offset(out)))
    return out


def _as(x, dtype):
    """x in ``dtype`` first (PyTorch's dtype= argument), on the device."""
    if dtype is None or (hasattr(x, "dtype") and np.dtype(dtype) == x.dtype):
        return x
    from .cast import cast
    return cast(x, dtype)


@memoized
def softmax(x, axis=-1, out=None, dtype=None):
    """Softmax along ``axis`` (the last by default; PyTorch's dim), stable for large
    inputs (in place with out=x); ``dtype``: convert x to it first, as PyTorch's."""
    return _rowwise("clnn_softmax", _as(x, dtype), axis, out)


@memoized
def log_softmax(x, axis=-1, out=None, dtype=None):
    """log(softmax(x)) along ``axis``, computed as x - logsumexp(x); ``dtype`` as in
    softmax."""
    return _rowwise("clnn_log_softmax", _as(x, dtype), axis, out)


def softmax_cross_entropy(z, y, *, dz=None, grad_scale=None, scale_by=None,
                          loss_dtype=None, db=None):
    """(L, dL/dz) for the mean softmax cross-entropy of logits z against targets y.

    z and y are (batch, classes); y holds targets, usually distributions (one-hot rows
    for labels) but any rows, as PyTorch takes them. L = mean over the batch of
    -sum(y * log_softmax(z)), a 0-d device array; dL/dz = (softmax(z) sum(y) - y) /
    batch per row (softmax(z) - y for distributions) goes to ``dz`` (allocated when
    None; may be z);
    ``grad_scale`` replaces its 1/batch, ``scale_by`` also multiplies it; ``loss_dtype``
    float32 gives a 16-bit input's loss in float32 (see quadratic_loss). ``db`` (an
    array of z's dtype, (classes,)): also dz summed over the batch as stored, a dense
    output layer's bias gradient (bias_grad(dz)). A batch of up to 1024 rows of fewer
    than 32 classes takes one launch for all of it (loss.py's HEAD_ROWS).
    """
    return fused_loss("softmax", "clnn_softmax_xent", z, y, dz, grad_scale, ("z", "dz"),
                      scale_by, loss_dtype, db)
