"""Inverted dropout with a mask computed, not stored (clnn/kernels/dropout.cl).

Element i of an array is kept when a hash of (``key``, i) clears a threshold, so one key
gives one mask: the backward pass applies the same call to the gradient. Networks derive
the key from their seed, the layer and the step (``dropout_key``), so a run repeats
bitwise and a resumed run draws the masks an uninterrupted one would.
"""

import math

import numpy as np

from .. import programs
from ..errors import ArgumentError
from ._args import check, check_out, common_device, done, launch, offset, probability

programs.register("dropout", {}, lambda: [{}])

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z):
    """SplitMix64's finaliser on Python ints or numpy uint64 arrays (wrapping)."""
    if isinstance(z, np.ndarray):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def dropout_key(seed, layer, step):
    """The 64-bit key of one dropout layer's mask at one training step."""
    z = _mix64((int(seed) + _GOLDEN) & _M64)
    z = _mix64((z + int(layer) * _GOLDEN) & _M64)
    return _mix64((z + int(step)) & _M64)


def dropout_key_at(key, start):
    """The key whose mask is ``key``'s mask from element ``start`` on: element i of the
    hash input is key + i * golden, so shifting the key by start * golden shifts the
    mask. A data-parallel rank whose shard starts ``start`` elements into the global
    batch draws with it the very elements one process with the whole batch would."""
    return (_check_key(key) + int(start) * _GOLDEN) & _M64


def _threshold(p):
    return min(int(round(p * 2.0 ** 32)), 2 ** 32 - 1)


def _check_key(key):
    if not isinstance(key, (int, np.integer)) or isinstance(key, bool) or \
            not 0 <= int(key) <= _M64:
        raise ArgumentError(f"key must be an int in [0, 2**64), got {key!r}")
    return int(key)


def dropout_mask(shape, p, key):
    """The float64 mask (0 or 1/(1-p)) that ``dropout`` with ``p`` and ``key`` applies
    to an array of ``shape``, computed on the host (for tests and references)."""
    p, key = probability(p, "dropout probability p"), _check_key(key)
    n = int(math.prod(shape))
    with np.errstate(over="ignore"):
        i = np.arange(n, dtype=np.uint64)
        h = _mix64(np.uint64(key) + i * np.uint64(_GOLDEN)) >> np.uint64(32)
    keep = h >= np.uint64(_threshold(p))
    return np.where(keep, 1.0 / (1.0 - p), 0.0).reshape(shape)


def dropout(x, p, key, out=None):
    """out = x * mask: each element zeroed with probability ``p``, the others scaled by
    1/(1-p) (PyTorch's inverted dropout). ``key`` (an int in [0, 2**64)) picks the mask:
    the same key, shape and p give the same mask, so ``dropout(dy, p, key)`` is the
    backward pass of ``dropout(x, p, key)``. ``out`` may be ``x``."""
    dev = common_device(x=x, out=out)
    dt = check(x, "x", dev)
    p, key = probability(p, "dropout probability p"), _check_key(key)
    out = check_out(out, x.shape, dt, dev, inputs=(x,))
    kern = programs.get_kernel(dev, "dropout", "clnn_dropout",
                               {"dtype": programs.dtype_name(dt)})
    evt = launch(kern, dev, x.size, key=key, threshold=_threshold(p), scale=1.0 / (1.0 - p),
                 x=x, x_off=offset(x), out=out, out_off=offset(out))
    return done(out, evt)
