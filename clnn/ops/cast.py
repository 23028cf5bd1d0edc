"""Conversion between the floating types on the device (``Array.astype`` for clnn's
arrays, without a round trip through the host). Kernel: clnn/kernels/cast.cl."""

import numpy as np

from .. import programs
from ._args import check, check_out, common_device, done, launch, offset

# (mark: the checked cast of a mixed-precision step's gradients, 2 with the loss-scale
# update, clnn/ops/optim.py)
programs.register("cast", {"src": "float32", "mark": 0},
                  lambda: [{"src": s} for s in ("float32", "float64", "float16", "bfloat16")] +
                  [{"src": s, "mark": m} for s in ("float16", "bfloat16") for m in (1, 2)])


def cast(x, dtype, out=None):
    """``x`` converted to ``dtype`` (float32, float64 where the device has it, float16
    or bfloat16), rounded once to nearest even (float64 to bfloat16 too, where numpy's
    ml_dtypes rounds through float32); a copy when the dtypes are the same. ``out`` may not
    overlap ``x`` unless it is ``x`` with the same dtype."""
    dev = common_device(x=x, out=out)
    src = check(x, "x", dev)
    dst = dev.check_dtype(np.dtype(dtype), "dtype")
    out = check_out(out, x.shape, dst, dev, inputs=(x,) if dst == src else (),
                    allow_alias=dst == src)
    if dst != src:
        from ._args import overlaps
        if overlaps(out, x):
            from ..errors import ShapeError
            raise ShapeError("out overlaps x: a conversion needs its own buffer")
    kern = programs.get_kernel(dev, "cast", "clnn_cast", {"dtype": programs.dtype_name(dst),
                                                          "src": programs.dtype_name(src)})
    if out.size and not (dst == src and out.base_data.int_ptr == x.base_data.int_ptr and
                         out.offset == x.offset):
        done(out, launch(kern, dev, x.size, x=x, x_off=offset(x), out=out,
                         out_off=offset(out)))
    return out
