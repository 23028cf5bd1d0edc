"""The quadratic loss and its gradient. Kernel: clnn/kernels/loss.cl.

(The softmax cross-entropy lives in softmax.py, beside the softmax it is fused with.)
"""

from .. import programs
from ..errors import ShapeError
from ._args import check, check_out, common_device, dev_empty, finite, offset
from .reduce import reduce3

programs.register("loss", {})


def loss_operands(dev, a, y, name_a, grad):
    """Check a batch of predictions and targets; returns (dtype, rows, cols, grad)."""
    dt = check(a, name_a, dev, ndim=2)
    check(y, "y", dev, dtype=dt, shape=a.shape)
    if a.shape[0] == 0:
        raise ShapeError("a loss over an empty batch is undefined")
    grad = check_out(grad, a.shape, dt, dev, inputs=(a, y))
    return dt, a.shape[0], a.shape[1], grad


def row_launch(dev, rows):
    wg = min(64, dev.facts.max_work_group_size)
    return (-(-rows // wg) * wg,), (wg,)


def mean_of_rows(dev, dt, loss_rows, rows):
    """The mean over the batch of per-row losses kept in the arithmetic type."""
    loss = dev_empty(dev, (), dt)
    return reduce3(dev, dt, loss_rows, (1, rows, 1), loss, final="scale", post=1.0 / rows,
                   inp="acc")


def quadratic_loss(a, y, *, da=None, grad_scale=None):
    """(L, dL/da) for L = sum((a - y)^2) / (2 * batch) over a (batch, features) pair.

    L is a 0-d device array (``float(L.get())`` reads it); the gradient (a - y) / batch
    is written to ``da`` (allocated when None; it may be ``a`` itself). ``grad_scale``
    replaces the 1/batch of the gradient: clnn.nn passes 1 and folds 1/batch into the
    learning rate of its update GEMM, as the tutorial does.
    """
    dev = common_device(a=a, y=y, da=da)
    dt, rows, cols, da = loss_operands(dev, a, y, "a", da)
    loss_rows = dev_empty(dev, (rows,), programs.acc_dtype(dt))
    kern = programs.get_kernel(dev, "loss", "clnn_quadratic", {"dtype": dt.name})
    g, l = row_launch(dev, rows)
    gs = 1.0 / rows if grad_scale is None else finite(grad_scale, "grad_scale")
    da.add_event(kern(g, l, rows=rows, cols=cols, grad_scale=gs, a=a, a_off=offset(a),
                      y=y, y_off=offset(y), da=da, da_off=offset(da), loss_row=loss_rows))
    return mean_of_rows(dev, dt, loss_rows, rows), da
