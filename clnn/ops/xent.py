"""Cross-entropy as PyTorch users call it (torch.nn.functional.cross_entropy), fused with
its gradient. Kernel: clnn/kernels/xent.cl.

softmax_cross_entropy (softmax.py) stays the networks' fast path for (batch, classes)
rows of target distributions; this op takes what PyTorch takes.
"""

import math

import numpy as np

from .. import programs
from ..errors import ArgumentError, ShapeError
from ._args import (INT_MAX, check, check_ints, check_out, common_device, dev_empty, done,
                    finite, launch, offset, overlaps)
from .reduce import reduce3

programs.register("xent", {"target": "index"},
                  lambda: [{"target": "index"}, {"target": "prob"}])

REDUCTIONS = ("mean", "sum", "none")


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0, *, dz=None, want_dz=True):
    """(loss, dz): torch.nn.functional.cross_entropy's loss and its gradient.

    ``input``: logits (N, C) or (N, C, d1, ...), classes along axis 1. ``target``:
    int32 class indices of shape (N,) or (N, d1, ...) (``ignore_index`` marks positions
    that count for nothing), or probabilities of ``input``'s shape and dtype.
    ``weight``: (C,) class weights. ``reduction``: "mean" (over the targets' total
    weight for class indices, over the positions for probabilities, as PyTorch),
    "sum" or "none" (a loss per position). ``label_smoothing`` in [0, 1].

    dz is the gradient of the returned loss (of its sum for "none") with respect to
    ``input``, into ``dz`` when given (it may be ``input``); ``want_dz=False`` skips it
    (dz is then None). A class index outside 0..C-1 other than ``ignore_index`` is a
    ShapeError raised before anything is written (it costs one wait for the device).
    A mean over targets that are all ignored is NaN, as in PyTorch.
    """
    loss, dz, _ = cross_entropy_parts(input, target, weight, ignore_index, reduction,
                                      label_smoothing, dz=dz, want_dz=want_dz)
    return loss, dz


def cross_entropy_parts(input, target, weight=None, ignore_index=-100, reduction="mean",
                        label_smoothing=0.0, *, dz=None, want_dz=True):
    """``cross_entropy`` and the denominator D of its mean (a float: the targets'
    total weight, or the number of positions for probabilities), which a training loop
    that sums (reduction="sum") divides by itself."""
    dev = common_device(input=input, target=target, weight=weight, dz=dz)
    dt = check(input, "input", dev)
    if input.ndim < 2:
        raise ShapeError(f"input must be (N, C) or (N, C, d1, ...), has shape {input.shape}")
    N, C = input.shape[0], input.shape[1]
    S = int(math.prod(input.shape[2:]))
    rows = N * S
    by_index = target.dtype.kind in "iu" if hasattr(target, "dtype") else False
    if by_index:
        check_ints(target, "target", dev, shape=(N,) + tuple(input.shape[2:]))
    else:
        check(target, "target", dev, dtype=dt, shape=input.shape)
    weighted = weight is not None
    if weighted:
        check(weight, "weight", dev, dtype=dt, shape=(C,))
    if reduction not in REDUCTIONS:
        raise ArgumentError(f"reduction must be one of {', '.join(REDUCTIONS)}, got "
                            f"{reduction!r}")
    eps = finite(label_smoothing, "label_smoothing", dt)
    if not 0 <= eps <= 1:
        raise ArgumentError(f"label_smoothing must lie in [0, 1], got {label_smoothing}")
    if not isinstance(ignore_index, (int, np.integer)) or isinstance(ignore_index, bool) \
            or not -INT_MAX - 1 <= ignore_index <= INT_MAX:
        raise ArgumentError(f"ignore_index must be a 32-bit int, got {ignore_index!r}")
    if C == 0:
        raise ShapeError("cross_entropy needs at least one class")
    if want_dz:
        dz = check_out(dz, input.shape, dt, dev, inputs=(input,), name="dz")
        for name, a in (("target", target), ("weight", weight)):
            if overlaps(dz, a):
                raise ShapeError(f"dz overlaps {name}")
    elif dz is not None:
        raise ArgumentError("dz is written only with want_dz=True")
    acc = programs.acc_dtype(dt)
    loss = dev_empty(dev, (N,) + tuple(input.shape[2:]) if reduction == "none" else (), dt)
    params = {"dtype": programs.dtype_name(dt), "target": "index" if by_index else "prob"}
    w = weight if weighted else input            # a placeholder the kernel never reads
    # the denominator of a mean: the targets' total weight (class indices: read back,
    # with the count of out-of-range targets, before anything is written)
    denom = float(rows)
    if by_index and rows:
        row_w, bad = dev_empty(dev, (rows,), acc), dev_empty(dev, (rows,), acc)
        launch(programs.get_kernel(dev, "xent", "clnn_xent_row_weights", params), dev, rows,
               C=C, ignore_index=int(ignore_index), weighted=int(weighted), y=target,
               y_off=offset(target), w=w, w_off=offset(w), row_w=row_w, bad=bad)
        sums = dev_empty(dev, (2,), acc)
        reduce3(dev, acc, row_w, (1, rows, 1), sums[0:1].reshape(()))
        reduce3(dev, acc, bad, (1, rows, 1), sums[1:2].reshape(()))
        total, n_bad = (float(v) for v in sums.get())
        if n_bad:
            raise ShapeError(f"{int(n_bad)} targets lie outside 0..{C - 1} and are not "
                             f"ignore_index ({ignore_index})")
        denom = total
    scale = (1.0 / denom if denom else float("nan")) if reduction == "mean" else 1.0
    if rows == 0:
        if reduction != "none":
            from .elementwise import fill
            fill(loss, scale * 0.0 if reduction == "mean" else 0.0)
        return loss, dz, denom
    per_row = loss if reduction == "none" else dev_empty(dev, (rows,), acc)
    kern = programs.get_kernel(dev, "xent", "clnn_xent", params)
    d = dz if want_dz else input
    evt = launch(kern, dev, rows, C=C, S=S, ignore_index=int(ignore_index),
                 weighted=int(weighted), eps=eps, loss_scale=scale, grad_scale=scale,
                 z=input, z_off=offset(input), y=target, y_off=offset(target), w=w,
                 w_off=offset(w), dz=d, dz_off=offset(d), want_dz=int(want_dz),
                 loss_out=loss if reduction == "none" else input,
                 lo_off=offset(loss) if reduction == "none" else 0,
                 loss_real=int(reduction == "none"), loss_acc=per_row)
    if want_dz:
        done(dz, evt)
    if reduction == "none":
        return done(loss, evt), dz, denom
    # the rows' losses (already over D for a mean) summed in a fixed order
    return reduce3(dev, dt, per_row, (1, rows, 1), loss, inp="acc"), dz, denom
