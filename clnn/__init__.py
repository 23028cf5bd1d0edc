"""clnn: OpenCL neural-network kernels and a small network API.

Arrays are ``pyopencl.array.Array`` allocated from the device's bounded pool:

    >>> import clnn, numpy as np
    >>> x = clnn.asarray(np.random.rand(4, 3).astype(np.float32))
    >>> clnn.sigmoid(x).get()
"""

import numpy as np
import pyopencl.array as cla

from .device import BFLOAT16 as bfloat16  # ml_dtypes' numpy dtype: clnn.asarray(a, dtype=clnn.bfloat16)
from .device import Device, DeviceFacts, device, device_of
from .errors import (ArgumentError, CheckpointError, ClnnError, DeviceError, DistributedError,
                     DTypeError,
                     KernelBuildError, OutOfDeviceMemory, ShapeError, TemplateError)
from .programs import render
from .profiler import profile
from .tuning import get_float32_matmul_precision, set_float32_matmul_precision
from .ops import *  # noqa: F401,F403 - the public ops
from .ops import __all__ as _ops_all

from . import datasets, nn, optim  # noqa: E402,F401 - after the ops they use

__version__ = "0.1.0"


def clear_caches():
    """Empty every cache clnn keeps: each open device's kernels and tables, the launch
    plans and tuning rows, and the GEMM routine's launch cache. (Here, at the top,
    because it reaches every layer of the package: the layers themselves never
    import the ones above them.)"""
    from . import plans, tuning
    from .device import open_devices
    from .ops import _memo
    from .ops.gemm import clear_launches
    _memo.clear()
    for dev in open_devices():
        dev.kernels.clear()
        dev.tables.clear()
    plans.cached_best.cache_clear()
    tuning.table_rows.cache_clear()
    tuning.conv_vendor_rows.cache_clear()
    tuning.mma_rows.cache_clear()
    tuning._with_engines.cache_clear()
    clear_launches()


def asarray(a, device=None, dtype=None):
    """Copy a numpy array (or anything numpy takes) to the device, as C-contiguous."""
    from .device import device as _device, is_floating
    dev = _device(device)
    host = np.asarray(a, dtype=dtype, order="C")   # 0-d stays 0-d (ascontiguousarray
                                                   # would make it (1,))
    if is_floating(host.dtype):
        dev.check_dtype(host.dtype)
    out = cla.empty(dev.queue, host.shape, host.dtype, allocator=dev.pool)
    if host.size:
        out.set(host)
    return out


def empty(shape, dtype=np.float32, device=None):
    """An uninitialised array from the device's pool."""
    from .device import device as _device
    dev = _device(device)
    dev.check_dtype(dtype)
    return cla.empty(dev.queue, shape, dtype, allocator=dev.pool)


def zeros(shape, dtype=np.float32, device=None):
    """A zero-filled array from the device's pool."""
    out = empty(shape, dtype, device)
    return fill(out, 0.0) if out.size else out  # noqa: F405


__all__ = ["Device", "DeviceFacts", "device", "device_of", "asarray", "empty", "zeros",
           "render", "profile", "clear_caches", "set_float32_matmul_precision",
           "get_float32_matmul_precision", "ClnnError", "ShapeError", "ArgumentError",
           "CheckpointError", "DistributedError",
           "DTypeError", "DeviceError", "OutOfDeviceMemory", "KernelBuildError",
           "TemplateError"] + list(_ops_all)
