"""Batch normalisation (torch.nn.functional.batch_norm's semantics) and its backward
pass. Kernels: clnn/kernels/batchnorm.cl.

Inputs are (N, C) or (N, C, d1, ...): statistics are per channel C, over the batch and
every other axis. Statistics and running statistics are kept in the arithmetic type
(programs.acc_dtype: float32 for float16 storage). The per-channel sums are reduced by
one work-group per channel in a fixed order: results are bitwise reproducible.
"""

import math

import numpy as np

from .. import programs
from ..errors import ArgumentError, ShapeError
from ._args import (check, check_out, common_device, dev_scratch, done, finite, launch,
                    launch_size, offset)
from ._memo import memoized
from .elementwise import ACTIVATIONS, activation_parameter

programs.register("batchnorm", {"act": "identity", "wg": 64},
                  lambda: [{"act": a, "wg": wg} for a in ACTIVATIONS for wg in (1, 64, 256)])


def _wg(dev):
    """Work-items per channel: 1 on CPUs (a work-item per channel, its planes read as
    vectors: batchnorm.cl), 256 on GPUs, within the device's limit (a power of two,
    for the tree)."""
    want = 1 if dev.facts.is_cpu else 256
    while want > dev.facts.max_work_group_size:
        want //= 2
    return want


def _planes_launch(dev, N, C, HW):
    """(global, local) of the element-wise passes (forward, data gradient): by planes
    of HW elements on CPUs where a plane holds a vector (see batchnorm.cl), else by
    elements."""
    if _wg(dev) == 1 and HW >= 8:
        return launch_size(dev, N * C, wg=8)
    return launch_size(dev, N * C * HW)


def _kernel(dev, dt, entry, act="identity"):
    return programs.get_kernel(dev, "batchnorm", entry,
                               {"dtype": programs.dtype_name(dt), "act": act, "wg": _wg(dev)})


def _geometry(x):
    if x.ndim < 2:
        raise ShapeError(f"batch_norm takes (N, C) or (N, C, ...) inputs, got {x.shape}")
    N, C = x.shape[0], x.shape[1]
    HW = int(math.prod(x.shape[2:]))
    return N, C, HW


def _affine(weight, bias, dev, dt, C):
    if (weight is None) != (bias is None):
        raise ArgumentError("give weight and bias together, or neither")
    if weight is not None:
        check(weight, "weight", dev, dtype=dt, shape=(C,))
        check(bias, "bias", dev, dtype=dt, shape=(C,))
    return weight is not None


def _eps(eps, dt):
    eps = finite(eps, "eps", dt)
    if eps <= 0:
        raise ArgumentError(f"eps must be positive, got {eps}")
    return eps


def _momentum(momentum, dt):
    momentum = finite(momentum, "momentum", dt)
    if not 0 <= momentum <= 1:
        raise ArgumentError(f"momentum must lie in [0, 1], got {momentum}")
    return momentum


@memoized
def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None,
               training=False, momentum=0.1, eps=1e-5, activation=None,
               activation_param=None, out=None, save=None):
    """out = f(weight (x - mean) / sqrt(var + eps) + bias), per channel (axis 1).

    PyTorch's argument order and meaning: in training, mean and var are the batch's
    (the variance biased), and the running statistics, when given, move towards them:
    r = (1 - momentum) r + momentum s (the variance unbiased, times M/(M-1) for M values
    per channel; any finite momentum, as PyTorch takes); otherwise mean and var are the running statistics. ``running_mean``
    and ``running_var`` are (C,) arrays of the arithmetic type (float32 for float16 x).
    ``save``, a (2, C) array of that type, receives the batch's mean and biased
    variance in training, for batch_norm_backward. ``activation`` (with its
    ``activation_param``) is applied to the result in the same pass.
    """
    dev = common_device(x=x, running_mean=running_mean, running_var=running_var,
                        weight=weight, bias=bias, out=out, save=save)
    dt = check(x, "x", dev)
    N, C, HW = _geometry(x)
    acc = programs.acc_dtype(dt)
    if (running_mean is None) != (running_var is None):
        raise ArgumentError("give running_mean and running_var together, or neither")
    if running_mean is not None:
        check(running_mean, "running_mean", dev, dtype=acc, shape=(C,))
        check(running_var, "running_var", dev, dtype=acc, shape=(C,))
    elif not training:
        raise ArgumentError("batch_norm in evaluation mode needs running_mean and "
                            "running_var")
    affine = _affine(weight, bias, dev, dt, C)
    eps = _eps(eps, dt)
    # momentum moves running statistics in training only (PyTorch ignores it
    # otherwise), and, as in PyTorch, any finite value is taken
    momentum = finite(momentum, "momentum", dt) if training and running_mean is not None \
        else 0.0
    act = "identity" if activation is None else activation
    p, q = activation_parameter(act, activation_param, dt)
    if training and N * HW < 2:
        raise ShapeError(f"batch_norm in training needs more than one value per channel, "
                         f"got input shape {x.shape}")
    if save is not None:
        if not training:
            raise ArgumentError("save is written in training only")
        check(save, "save", dev, dtype=acc, shape=(2, C))
    inputs = tuple(a for a in (x, running_mean, running_var, weight, bias) if a is not None)
    out = check_out(out, x.shape, dt, dev, inputs=(x,))
    for name, a in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if a is not None and _shares(a, out):
            raise ShapeError(f"out overlaps {name}")
    if training:
        stats = save if save is not None else dev_scratch(dev, 2 * C, acc)
        if save is not None and any(_shares(save, a) for a in inputs + (out,)):
            raise ShapeError("save overlaps another argument")
    if x.size == 0:
        return out
    if training:
        k = _kernel(dev, dt, "clnn_bn_stats")
        k((C * _wg(dev),), (_wg(dev),), N=N, C=C, HW=HW, x=x, x_off=offset(x),
          stats=stats, s_off=offset(stats))
        mean, m_off, var, v_off = stats, offset(stats), stats, offset(stats) + C
    else:
        mean, m_off = running_mean, offset(running_mean)
        var, v_off = running_var, offset(running_var)
    w, b = (weight, bias) if affine else (x, x)
    evt = _kernel(dev, dt, "clnn_bn_forward", act)(
        *_planes_launch(dev, N, C, HW), n=x.size, C=C, HW=HW, eps=eps, p=p, q=q,
        affine=int(affine), x=x, x_off=offset(x), mean=mean, m_off=m_off, var=var,
        v_off=v_off, w=w, w_off=offset(w), b=b, b_off=offset(b), out=out,
        out_off=offset(out))
    if training and running_mean is not None:         # checked above
        _update_running(dev, running_mean, running_var, stats, momentum, N * HW)
    return done(out, evt)


def _shares(a, b):
    from ._args import overlaps
    return overlaps(a, b) if hasattr(a, "base_data") and hasattr(b, "base_data") else False


def update_running_stats(running_mean, running_var, save, factor, count):
    """running = (1 - factor) running + factor batch statistic, from ``save`` (the
    batch's mean and biased variance over ``count`` values per channel; the variance
    is unbiased first). A network's BatchNorm layer calls this once a training step
    has succeeded; ``batch_norm`` in training calls it itself."""
    dev = common_device(running_mean=running_mean, running_var=running_var, save=save)
    check(running_mean, "running_mean", dev, ndim=1)
    C, acc = running_mean.shape[0], running_mean.dtype
    check(running_var, "running_var", dev, dtype=acc, shape=(C,))
    check(save, "save", dev, dtype=acc, shape=(2, C))
    if _shares(save, running_mean) or _shares(save, running_var) or \
            _shares(running_mean, running_var):
        raise ShapeError("running_mean, running_var and save need buffers of their own")
    if not isinstance(count, (int, np.integer)) or count < 2:
        raise ArgumentError(f"count must be an int >= 2, got {count!r}")
    factor = _momentum(factor, acc)
    return _update_running(dev, running_mean, running_var, save, factor, count)


def _update_running(dev, running_mean, running_var, save, factor, count):
    acc, C = running_mean.dtype, running_mean.shape[0]
    dt = np.float64 if acc == np.float64 else np.float32
    evt = launch(_kernel(dev, dt, "clnn_bn_update_running"), dev, C, f=factor,
                 unbias=count / (count - 1), stats=save, s_off=offset(save),
                 rmean=running_mean, rm_off=offset(running_mean), rvar=running_var,
                 rv_off=offset(running_var))
    done(running_mean, evt)
    return done(running_var, evt)


@memoized
def batch_norm_backward(dy, x, save, weight=None, eps=1e-5, dx=None, dweight=None,
                        dbias=None, need_dx=True):
    """Gradients of ``batch_norm`` in training mode, from dy = dL/d(normalised and
    affine-mapped x) (before any fused activation: apply its derivative to dy first).

    ``save`` holds the batch's mean and biased variance (batch_norm's ``save``).
    Returns (dx, dweight, dbias): dweight = sum dy x-hat and dbias = sum dy per channel
    (None without ``weight``), dx the input's gradient through the batch statistics
    (None with ``need_dx=False``). Every output is allocated before the first write.
    """
    dev = common_device(dy=dy, x=x, save=save, weight=weight, dx=dx, dweight=dweight,
                        dbias=dbias)
    dt = check(x, "x", dev)
    check(dy, "dy", dev, dtype=dt, shape=x.shape)
    N, C, HW = _geometry(x)
    acc = programs.acc_dtype(dt)
    check(save, "save", dev, dtype=acc, shape=(2, C))
    affine = weight is not None
    if affine:
        check(weight, "weight", dev, dtype=dt, shape=(C,))
    elif dweight is not None or dbias is not None:
        raise ArgumentError("dweight and dbias need weight")
    eps = _eps(eps, dt)
    if N * HW < 2:
        raise ShapeError(f"batch_norm in training needs more than one value per channel, "
                         f"got input shape {x.shape}")
    ins = (dy, x, save) + ((weight,) if affine else ())
    if need_dx:
        dx = check_out(dx, x.shape, dt, dev, inputs=(dy,), name="dx")
        if any(_shares(dx, a) for a in (x, save) + ((weight,) if affine else ())):
            raise ShapeError("dx overlaps an input other than dy")
    else:
        dx = None
    if affine:
        dweight = check_out(dweight, (C,), dt, dev, name="dweight", allow_alias=False,
                            inputs=ins)
        dbias = check_out(dbias, (C,), dt, dev, name="dbias", allow_alias=False,
                          inputs=ins + (dweight,))
        for name, a in (("dweight", dweight), ("dbias", dbias)):
            if dx is not None and _shares(dx, a):
                raise ShapeError(f"dx overlaps {name}")
    sums = dev_scratch(dev, 2 * C, acc)
    if x.size == 0:
        return dx, dweight, dbias
    gw, gb = (dweight, dbias) if affine else (sums, sums)
    k = _kernel(dev, dt, "clnn_bn_backward_sums")
    evt = k((C * _wg(dev),), (_wg(dev),), N=N, C=C, HW=HW, eps=eps, affine=int(affine),
            dy=dy, dy_off=offset(dy), x=x, x_off=offset(x), stats=save,
            s_off=offset(save), sums=sums, sums_off=0, gw=gw, gw_off=offset(gw), gb=gb,
            gb_off=offset(gb))
    if affine:
        done(dweight, evt)
        done(dbias, evt)
    if dx is not None:
        w = weight if affine else x
        evt = _kernel(dev, dt, "clnn_bn_backward_data")(
            *_planes_launch(dev, N, C, HW), n=x.size, C=C, HW=HW, M=N * HW, eps=eps,
            affine=int(affine), dy=dy, dy_off=offset(dy), x=x, x_off=offset(x),
            stats=save, s_off=offset(save), sums=sums, sums_off=0, w=w, w_off=offset(w),
            dx=dx, dx_off=offset(dx))
        done(dx, evt)
    return dx, dweight, dbias
