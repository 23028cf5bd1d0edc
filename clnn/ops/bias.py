"""Bias broadcast and its gradient, alone or with an activation's backward pass.
Kernels: elementwise.cl (bias_add, and the activation's backward pass on CPUs) and
reduce.cl.

Channels are axis 1, batch-first: a dense layer's (N, F) activations take a bias of
shape (F,), an image batch (N, C, H, W) one of shape (C,).
"""

import math

from ._args import (check, check_out, common_device, dev_empty, done, finite, launch,
                    offset)
from ._memo import memoized
from .elementwise import (_check_source, _source, activation_backward,
                          activation_parameter, elementwise_kernel, inplace)
from .reduce import on_work_groups, reduce3
from ..errors import ArgumentError, ShapeError


def _channels(x, name):
    if x.ndim < 2:
        raise ShapeError(f"{name} must be batch-first with channels on axis 1, has shape "
                         f"{x.shape}")
    return x.shape[1], int(math.prod(x.shape[2:]))


@memoized
def bias_add(x, b, out=None):
    """out = x + b with b (C,) broadcast over every axis but axis 1 of x."""
    dev = common_device(x=x, b=b, out=out)
    dt = check(x, "x", dev)
    channels, inner = _channels(x, "x")
    check(b, "b", dev, dtype=dt, shape=(channels,))
    out = check_out(out, x.shape, dt, dev, inputs=(x, b))
    kern = elementwise_kernel(dev, dt, "clnn_bias_add", op="linalg",
                              inplace=inplace(out, x=x))
    evt = launch(kern, dev, x.size, channels=channels, inner=inner, x=x, x_off=offset(x),
                  b=b, b_off=offset(b), out=out, out_off=offset(out))
    return done(out, evt)


@memoized
def bias_grad(dy, out=None, *, alpha=1.0, beta=0.0):
    """db = alpha * (dy summed over every axis but axis 1) + beta * out.

    Sums over the batch, and H, W for images; deterministic. With the defaults it
    overwrites ``out`` (shape (C,)); ``alpha = -lr/batch, beta = momentum`` makes it a
    momentum update of a bias's velocity in one pass (beta != 0 needs ``out``).
    """
    dev = common_device(dy=dy, out=out)
    dt = check(dy, "dy", dev)
    channels, inner = _channels(dy, "dy")
    alpha, beta = finite(alpha, "alpha", dt), finite(beta, "beta", dt)
    if out is None and beta != 0:
        raise ArgumentError("beta != 0 reads out: pass the out array")
    n = dy.shape[0]
    out = check_out(out, (channels,), dt, dev, allow_alias=False, inputs=(dy,))
    final = "axpby" if (alpha, beta) != (1.0, 0.0) else "none"
    if inner == 1:
        return reduce3(dev, dt, dy, (1, n, channels), out, final=final, post=alpha, beta=beta)
    # Images: sum over H*W first (rows of the (N*C, H*W) view), then over the batch.
    per_image = dev_empty(dev, (n * channels,), dt)
    reduce3(dev, dt, dy, (n * channels, inner, 1), per_image)
    return reduce3(dev, dt, per_image, (1, n, channels), out, final=final, post=alpha,
                   beta=beta)


@memoized
def activation_bias_backward(name, dy, db, *, z=None, a=None, out=None, param=None):
    """out = dy * f'(z), the gradient wrt the pre-activation (activation_backward),
    and db = out summed over every axis but axis 1 (bias_grad): a layer's activation
    and bias gradients. Returns (out, db); ``out`` may be ``dy`` (in place).

    Where the device reduces in work-groups (GPUs) one pass does both: each value is
    stored, rounded to the dtype, and summed as stored, in bias_grad's order (one launch
    for a dense layer's gradients where the two ops took two, two for images where they
    took three). Elsewhere the two ops run in turn.
    """
    src, x = _source(z, a, name)
    dev = common_device(dy=dy, **{src: x}, out=out, db=db)
    dt = check(dy, "dy", dev)
    p, q = activation_parameter(name, param, dt)
    _check_source(name, src, q)
    check(x, src, dev, dtype=dt, shape=dy.shape)
    channels, inner = _channels(dy, "dy")
    out = check_out(out, dy.shape, dt, dev, inputs=(dy, x))
    if db is None:
        raise ArgumentError("db (the bias gradient's array) is required")
    db = check_out(db, (channels,), dt, dev, inputs=(dy, x, out), name="db",
                   allow_alias=False)
    if not on_work_groups(dev):
        # (the ops themselves, unplanned: this call's plan holds their launches)
        activation_backward.unplanned(name, dy, **{src: x}, out=out, param=param)
        bias_grad.unplanned(out, out=db)
        return out, db
    n = dy.shape[0]
    dact = (name, src, p, q, out)
    if inner == 1:
        reduce3(dev, dt, dy, (1, n, channels), db, y=x, wg=True, dact=dact)
    else:
        # images: each (image, channel)'s sum over H*W with the backward pass, then
        # over the batch (as bias_grad sums them)
        per_image = dev_empty(dev, (n * channels,), dt)
        reduce3(dev, dt, dy, (n * channels, inner, 1), per_image, y=x, wg=True,
                dact=dact)
        reduce3(dev, dt, per_image, (1, n, channels), db, wg=True)
    return out, db
