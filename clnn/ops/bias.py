"""Bias broadcast and its gradient. Kernels: elementwise.cl (bias_add) and reduce.cl.

Channels are axis 1, batch-first: a dense layer's (N, F) activations take a bias of
shape (F,), an image batch (N, C, H, W) one of shape (C,).
"""

import math

from ._args import (check, check_out, common_device, dev_empty, done, finite, launch,
                    offset)
from ._memo import memoized
from .elementwise import elementwise_kernel, inplace
from .reduce import reduce3
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
