"""The quadratic loss and its gradient. Kernel: clnn/kernels/loss.cl.

(The softmax cross-entropy lives in softmax.py, beside the softmax it is fused with.)
"""

import numpy as np

from .. import programs, tuning
from ..errors import DTypeError, ShapeError
from ._args import (check, check_out, common_device, dev_empty, done, finite, offset,
                    overlaps)
from .reduce import reduce3

programs.register("loss", {"wg": 0, "dscale": 0, "head": 0, "lossout": "acc"},
                  lambda: [{"wg": 0, "dscale": 0}, {"wg": 64, "dscale": 0},
                           {"wg": 256, "dscale": 0}, {"wg": 0, "dscale": 1},
                           {"wg": 64, "dscale": 1}] + HEAD_VARIANTS)

# A batch of at most HEAD_ROWS rows short enough for a work-item each (row_groups None:
# fewer than 32 classes, or a CPU) takes the *_head kernels: one work-group of up to
# HEAD_WG work-items for the rows, the mean loss and (the softmax cross-entropy's) the
# column sums of the gradient, in one launch where the row kernel, the loss's reduction
# and the output layer's bias_grad took three (kernels/_head.cl). A classifier's step
# on a GPU is bound by its launches (about 19 us each replayed on an H200). On PoCL the
# one launch is faster too: 72 against 186 us at 64 x 10, 207 against 284 at 1000 x 10.
HEAD_ROWS = 1024
HEAD_WG = 256
HEAD_VARIANTS = [{"head": HEAD_WG, "dscale": d, "lossout": o}
                 for d in (0, 1) for o in ("acc", "real")]


def row_groups(dev, rows, cols):
    """(global, local) for the GPU row-wise kernels (a work-group per row), or None for
    a work-item per row: on CPUs, and for rows shorter than a warp (10 classes), which
    one work-item walks faster than a group could share them."""
    forced = tuning.forced("rows")
    if not (forced["wg"] if forced else not dev.facts.is_cpu) or cols < 32:
        return None
    wg = min(256 if cols >= 1024 else 64, dev.facts.max_work_group_size)
    wg = 1 << (wg.bit_length() - 1)            # the tree needs a power of two
    groups = min(rows, dev.facts.compute_units * 32)
    return (groups * wg,), (wg,)


def head_group(dev, rows, cols):
    """The work-group size of the *_head kernels for a batch of ``rows`` x ``cols``,
    or 0 where the row kernels take it (HEAD_ROWS above)."""
    forced = tuning.forced("loss")
    if forced and "head" in forced:
        if not forced["head"]:
            return 0
    elif rows > HEAD_ROWS or row_groups(dev, rows, cols) is not None:
        return 0
    wg = min(HEAD_WG, dev.facts.max_work_group_size)
    return 1 << (wg.bit_length() - 1)            # the tree needs a power of two


def fused_loss(stem, entry, pred, y, grad, grad_scale, names, scale_by=None,
               loss_dtype=None, db=None):
    """Run a loss kernel that writes each row's loss and the gradient in one pass, then
    average the rows: returns (0-d loss, grad). ``names`` are the kernel's names for
    the prediction and the gradient, e.g. ("a", "da"). ``scale_by``: a float32 device
    array whose first element also multiplies the gradient, read by the kernel (a
    loss scale that lives on the device, clnn/nn/amp.py). ``loss_dtype``: the loss's
    dtype, the inputs' (default) or the type they are computed in (float32 for 16-bit
    inputs, as PyTorch's autocast computes its losses). ``db``: also the gradient's
    column sums, as stored (bias_grad's), into this array of grad's dtype. A small
    batch (head_group) takes one launch for all of it."""
    p, g = names
    dev = common_device(**{p: pred, "y": y, g: grad, "scale_by": scale_by, "db": db})
    dt = check(pred, p, dev, ndim=2)
    check(y, "y", dev, dtype=dt, shape=pred.shape)
    if scale_by is not None:
        check(scale_by, "scale_by", dev, dtype=np.float32)
        if scale_by.size == 0:
            raise ShapeError("scale_by is empty; its first element is the factor")
    acc = programs.acc_dtype(dt)
    out_dt = dt if loss_dtype is None else np.dtype(loss_dtype)
    if out_dt not in (dt, acc):
        raise DTypeError(f"loss_dtype must be {dt} or {acc} for {dt} inputs, got "
                         f"{np.dtype(loss_dtype)}")
    rows, cols = pred.shape
    if rows == 0:
        raise ShapeError("a loss over an empty batch is undefined")
    grad = check_out(grad, pred.shape, dt, dev, inputs=(pred, y))
    if db is not None:
        check(db, "db", dev, dtype=dt, shape=(cols,))
        for name, a in ((p, pred), ("y", y), (g, grad), ("scale_by", scale_by)):
            if a is not None and overlaps(db, a):
                raise ShapeError(f"db overlaps {name}; each needs its own buffer")
    gs = 1.0 / rows if grad_scale is None else finite(grad_scale, "grad_scale", dt)
    params = {"dtype": programs.dtype_name(dt), "dscale": int(scale_by is not None)}
    extra = {"scale_by": scale_by, "sb_off": offset(scale_by)} if scale_by is not None \
        else {}
    # the arguments the row, work-group and head kernels share
    args = dict(rows=rows, cols=cols, grad_scale=gs, y=y, y_off=offset(y), **extra,
                **{p: pred, p + "_off": offset(pred), g: grad, g + "_off": offset(grad)})
    loss = dev_empty(dev, (), out_dt)
    head = head_group(dev, rows, cols)
    if head:
        kern = programs.get_kernel(dev, stem, entry + "_head", dict(
            params, head=head, lossout="acc" if out_dt == acc else "real"))
        evt = kern((head,), (head,), post=1.0 / rows, loss=loss, loss_off=offset(loss),
                   with_db=int(db is not None), db=db if db is not None else loss,
                   db_off=offset(db) if db is not None else 0, **args)
        if db is not None:
            done(db, evt)
        return done(loss, evt), done(grad, evt)
    loss_rows = dev_empty(dev, (rows,), acc)
    groups = row_groups(dev, rows, cols)
    if groups:
        kern = programs.get_kernel(dev, stem, entry + "_wg", dict(params, wg=groups[1][0]))
    else:
        kern = programs.get_kernel(dev, stem, entry, params)
        wg = min(64, dev.facts.max_work_group_size)
        groups = (-(-rows // wg) * wg,), (wg,)
    done(grad, kern(*groups, loss_row=loss_rows, **args))
    # the mean over the batch of the per-row losses, kept in the arithmetic type
    reduce3(dev, dt, loss_rows, (1, rows, 1), loss, final="scale", post=1.0 / rows,
            inp="acc", outp="acc" if out_dt != dt else "real")
    if db is not None:
        from .bias import bias_grad
        bias_grad(grad, out=db)
    return loss, grad


def quadratic_loss(a, y, *, da=None, grad_scale=None, scale_by=None, loss_dtype=None):
    """(L, dL/da) for L = sum((a - y)^2) / (2 * batch) over a (batch, features) pair.

    L is a 0-d device array (``float(L.get())`` reads it); the gradient (a - y) / batch
    is written to ``da`` (allocated when None; it may be ``a`` itself). ``grad_scale``
    replaces the 1/batch of the gradient: clnn.nn passes 1 and folds 1/batch into the
    learning rate of its update GEMM, as the tutorial does. ``scale_by``: a float32
    device array whose first element the gradient is also multiplied by (a
    mixed-precision step's loss scale, which stays on the device). ``loss_dtype``:
    float32 gives the loss of 16-bit inputs in float32, as summed (PyTorch's autocast
    computes losses in float32); default the inputs' dtype.
    """
    return fused_loss("loss", "clnn_quadratic", a, y, da, grad_scale, ("a", "da"), scale_by,
                      loss_dtype)
