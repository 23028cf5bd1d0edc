"""Argument checks shared by every routine.

Routines validate, kernels compute: each public op runs these checks before it
enqueues anything, so bad input leaves outputs and weights untouched.
"""

import inspect
import math
import numbers

import numpy as np
import pyopencl.array as cla
import pyopencl.cltypes as cltypes

from ..device import device_of
from ..errors import ArgumentError, DeviceError, DTypeError, ShapeError

INT_MAX = 2**31 - 1


def as_array(x, name):
    if not isinstance(x, cla.Array):
        raise ArgumentError(f"{name} must be a pyopencl.array.Array (make one with "
                            f"clnn.asarray), got {type(x).__name__}")
    return x


def common_device(**arrays):
    """The one clnn Device that every non-None array argument lives on."""
    dev = None
    first = None
    for name, x in arrays.items():
        if x is None:
            continue
        as_array(x, name)
        d = device_of(x)
        if dev is None:
            dev, first = d, name
        elif d is not dev:
            raise DeviceError(f"{name} is on {d.name} but {first} is on {dev.name}")
    if dev is None:
        raise ArgumentError("no array argument given")
    return dev


def check(x, name, dev, *, dtype=None, ndim=None, shape=None, contiguous=True):
    """Check one array argument; returns its dtype."""
    as_array(x, name)
    dt = dev.check_dtype(x.dtype, name)
    if dtype is not None and dt != dtype:
        raise DTypeError(f"{name} has dtype {dt}, expected {np.dtype(dtype)} like the "
                         "other operands")
    if ndim is not None and x.ndim not in (ndim if isinstance(ndim, tuple) else (ndim,)):
        raise ShapeError(f"{name} must have {ndim} dimensions, has shape {x.shape}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ShapeError(f"{name} has shape {x.shape}, expected {tuple(shape)}")
    if contiguous and not x.flags.c_contiguous:
        raise ShapeError(f"{name} must be C-contiguous (strides {x.strides} for shape "
                         f"{x.shape}); copy it first")
    if x.offset % x.dtype.itemsize:
        raise ShapeError(f"{name} has a byte offset {x.offset} that is not a multiple "
                         f"of its item size")
    if x.size > INT_MAX:
        raise ShapeError(f"{name} has {x.size} elements; clnn indexes with 32-bit ints")
    check_extent(x, name)
    return dt


def check_ints(x, name, dev, *, shape=None):
    """Check an int32 array argument (class indices, pooling indices): its device,
    dtype, shape, contiguity and extent."""
    as_array(x, name)
    if device_of(x) is not dev:
        raise DeviceError(f"{name} is on {device_of(x).name}, the other arrays on "
                          f"{dev.name}")
    if x.dtype != np.int32:
        raise DTypeError(f"{name} must be an int32 array, has dtype {x.dtype}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ShapeError(f"{name} has shape {x.shape}, expected {tuple(shape)}")
    if not x.flags.c_contiguous:
        raise ShapeError(f"{name} must be C-contiguous")
    if x.offset % 4:
        raise ShapeError(f"{name} has a byte offset {x.offset} that is not a multiple of 4")
    check_extent(x, name)
    return x


def check_extent(x, name):
    """Every element of ``x`` must lie inside its buffer (a view made with ``data=``
    can claim more than the buffer holds) and at an element index a 32-bit int holds."""
    if x.size == 0:
        return
    if x.flags.c_contiguous:
        lo, hi = x.offset, x.offset + x.nbytes
    else:
        lo = hi = x.offset
        for n, s in zip(x.shape, x.strides):
            if s > 0:
                hi += (n - 1) * s
            else:
                lo += (n - 1) * s
        hi += x.dtype.itemsize
    buf = x.base_data
    size = getattr(buf, "size", None)
    if buf is None or size is None:
        raise ShapeError(f"{name} has no device buffer behind it")
    if lo < 0 or hi > size:
        raise ShapeError(f"{name} reaches bytes {lo}..{hi} of a {size}-byte buffer: its "
                         "shape, strides or offset go past the buffer")
    if hi // x.dtype.itemsize > INT_MAX:
        raise ShapeError(f"{name} reaches element {hi // x.dtype.itemsize} of its buffer; "
                         "clnn indexes with 32-bit ints")


def int4(*parts):
    """An OpenCL int4 kernel argument from up to four ints, the rest 0: the descriptors
    kernels take instead of scalars per operand (a matrix's (offset, leading dimension,
    batch stride), a convolution's sizes and steps)."""
    return np.array(tuple(int(p) for p in parts) + (0,) * (4 - len(parts)), cltypes.int4)


def offset(x):
    """The element offset of ``x`` in its buffer (kernels take element offsets); 0 for
    a bare scratch buffer (dev_scratch), which kernels read from its start."""
    return x.offset // x.dtype.itemsize if hasattr(x, "dtype") else 0


def overlaps(x, y):
    """Whether two arrays (either may be None) share any byte of one buffer."""
    if x is None or y is None or x.size == 0 or y.size == 0:
        return False
    if x.base_data.int_ptr != y.base_data.int_ptr:
        return False
    x_end = x.offset + sum((n - 1) * s for n, s in zip(x.shape, x.strides)) + x.dtype.itemsize
    y_end = y.offset + sum((n - 1) * s for n, s in zip(y.shape, y.strides)) + y.dtype.itemsize
    return x.offset < y_end and y.offset < x_end


def _span(x):
    return x.base_data.int_ptr, x.offset, x.offset + x.nbytes


def check_out(out, shape, dtype, dev, inputs=(), name="out", allow_alias=True):
    """Validate a caller's ``out`` array, or allocate one from the pool.

    ``out`` may be one of ``inputs`` exactly (in place) when ``allow_alias``; a partial
    overlap would let a kernel read what it already wrote, so it is refused.
    """
    if out is None:
        return dev_empty(dev, shape, dtype)
    as_array(out, name)
    if device_of(out) is not dev:
        raise DeviceError(f"{name} is on {device_of(out).name}, inputs on {dev.name}")
    check(out, name, dev, dtype=dtype, shape=shape)
    if out.size:
        buf, lo, hi = _span(out)
        for x in inputs:
            if x is None or x.base_data is None or x.size == 0:
                continue
            xb, xlo, xhi = _span(x)
            if xb != buf or xhi <= lo or hi <= xlo:
                continue
            if allow_alias and xlo == lo and xhi == hi and x.strides == out.strides:
                continue
            raise ShapeError(f"{name} overlaps an input without being the same array")
    return out


# PyOpenCL's Array constructor checks a shape through numpy (about 20 us, as much as
# the rest of a small op's Python); the fast path its own views and copies take trusts
# the sizes it is given. clnn gives it sizes it computed itself, and falls back to the
# checked constructor for anything else (or a PyOpenCL without that path).
_FAST_ARRAY = "_fast" in inspect.signature(cla.Array.__init__).parameters


def dev_empty(dev, shape, dtype):
    shape = tuple(shape)
    if _FAST_ARRAY and all(type(n) is int and n >= 0 for n in shape):
        dtype = np.dtype(dtype)
        strides, step = [], dtype.itemsize
        for n in reversed(shape):
            strides.append(step)
            step *= max(1, n)                   # as PyOpenCL's C-order strides
        return cla.Array(None, shape, dtype, allocator=dev.pool, strides=tuple(strides[::-1]),
                         _fast=True, _size=math.prod(shape), _context=dev.context,
                         _queue=dev.queue)
    return cla.empty(dev.queue, shape, dtype, allocator=dev.pool)


def scratch_cap(dev, limit):
    """The most bytes one launch's scratch (packed panels, padded copies) may take:
    ``limit``, and never more than an eighth of the pool's budget."""
    return min(limit, dev.pool.budget // 8)


def dev_scratch(dev, count, dtype):
    """A pool buffer for ``count`` elements of ``dtype`` that only kernels touch (packed
    panels, padded copies): a bare buffer, without the 20-30 us of Python that making
    an Array costs. Like an Array's, it returns to the pool when dropped."""
    return dev.pool(max(int(count), 1) * np.dtype(dtype).itemsize)


def done(out, evt):
    """Return ``out`` after a launch that wrote it (event ``evt``).

    clnn launches everything for a device on its one in-order queue, so an array whose
    queue is that queue needs no event: later launches and reads (``get``) on the queue
    come after the write anyway. Only an array bound to another queue gets the event.
    (pyopencl's ``Array.add_event`` also waits on the host once an array holds 12
    events: attached to every output, that made every launch of a GPU training loop
    wait for the device, 130 us a launch on an H100.)
    """
    if evt is not None and out.queue is not None and out.queue != device_of(out).queue:
        out.add_event(evt)
    return out


_F32_MAX = float(np.finfo(np.float32).max)


def real(value, name):
    """A real scalar argument (Python or numpy number, 0-d array) as a float: no None,
    strings ("2") or bools."""
    if type(value) is float or type(value) is int:      # the common case, fast
        return float(value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if value is None or isinstance(value, (str, bytes, bool, np.bool_)) or \
            not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise ArgumentError(f"{name} must be a real number, got {value!r}")
    return float(value)


def finite(value, name, dtype=None):
    """A real scalar argument as a float, finite, and finite in the type the kernel
    computes in for ``dtype`` (1e39 is finite as a Python float but inf in float32:
    checked in float64 alone it would pass and turn every result into inf or NaN)."""
    value = real(value, name)
    if not math.isfinite(value):
        raise ArgumentError(f"{name} must be finite, got {value}")
    if dtype is not None and abs(value) > _F32_MAX and np.dtype(dtype).itemsize < 8:
        # float32 and float16 (which computes in float32)
        raise ArgumentError(f"{name} = {value} is infinite in float32, the type the "
                            "kernel computes in")
    return value


def probability(value, name):
    """A probability in [0, 1) (dropout's p) as a float."""
    p = real(value, name)
    if not 0 <= p < 1:
        raise ArgumentError(f"{name} must lie in [0, 1), got {p}")
    return p


def normalize_axis(axis, ndim):
    if axis is None:
        return None
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis!r} is out of range for {ndim} dimensions")
    return int(axis) % ndim


def launch_size(dev, n, wg=None):
    """(global, local) for a grid-stride loop over ``n`` items.

    The kernels loop, so any global size is correct. On a CPU (PoCL runs a work-group
    as a vectorised loop) about 16 items per work-item with many groups measured
    fastest here: 0.33 ms for a 1M-element Hadamard product, against 1.6 ms with
    a handful of long-running groups. On a GPU, enough groups to fill it, then stride.
    """
    f = dev.facts
    if f.is_cpu:
        wg, per_item, max_groups = wg or 64, 16, 1 << 20
    else:
        wg, per_item, max_groups = wg or 256, 4, f.compute_units * 32
    wg = min(wg, f.max_work_group_size)
    groups = max(1, min(-(-n // (wg * per_item)), max_groups))
    return (groups * wg,), (wg,)


def launch(kern, dev, n, **args):
    """Launch an element-wise kernel over ``n`` items (a grid-stride loop); None when
    there is nothing to do."""
    if n == 0:
        return None
    gsize, lsize = launch_size(dev, n)
    return kern(gsize, lsize, n=n, **args)


def pair(v, name, low):
    """An int (numpy's too) or a pair of them, each at least ``low``, as Python ints; a
    1-tuple counts for both axes (PyTorch's _pair)."""
    def ok(i):
        return isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) \
            and i >= low
    if isinstance(v, (tuple, list)) and len(v) == 1:
        v = v[0]
    t = (v, v) if ok(v) else v
    if isinstance(t, (tuple, list)) and len(t) == 2 and all(ok(i) for i in t):
        return int(t[0]), int(t[1])
    raise ShapeError(f"{name} must be an int >= {low} or a pair of them, got {v!r}")
