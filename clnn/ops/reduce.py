"""Deterministic reductions: sum, mean, max along an axis or over all, dot, nrm2.
Kernel: clnn/kernels/reduce.cl.

Long reductions are split into chunks summed in parallel, then the partial results
are reduced again; the split depends only on the shape and the device, so the same
inputs give bitwise the same result on every run.
"""

import builtins
import math

import numpy as np

from .. import programs, tuning
from ..errors import ArgumentError, ShapeError
from ._args import (check, check_out, common_device, dev_empty, dev_scratch, done,
                    normalize_axis, offset)
from ._memo import memoized

_MIN_CHUNK = 256     # below this, a second launch costs more than it saves

_LANES = 8           # partial results side by side along a contiguous row (CPUs)
_ROW_LANES = 32      # the same for float32: four vectors of 8

# the activations whose backward pass a GPU fuses with the bias gradient (map "dact"),
# and where their derivatives are taken: from the output a, as the layers have them,
# and from z (softplus below its default threshold needs it)
DACT = [(a, "a") for a in ("identity", "sigmoid", "tanh", "relu", "leaky_relu", "elu",
                           "softplus")] + [("softplus", "z"), ("tanh", "z")]


def _variants():
    plain = [{"map": m, "op": o, "final": f, "inp": i, "outp": p, "wg": wg,
              "lanes": lanes, "span": span, "stream": stream}
             for wg, lanes, span, stream in ((0, 1, 1, False), (0, _LANES, 1, False),
                                             (0, _ROW_LANES, 1, False),
                                             (0, 1, _LANES, False), (0, 1, 1, True),
                                             ((1, 256), 1, 1, False), ((32, 8), 1, 1, False),
                                             ((1, 64), 1, 1, False))
             for m, o, f, i, p in [("x", "sum", "none", "real", "real"),
                                   ("x", "sum", "scale", "real", "real"),
                                   ("x", "max", "none", "real", "real"),
                                   ("x", "sum", "none", "real", "acc"),
                                   ("x", "max", "none", "real", "acc"),
                                   ("xy", "sum", "none", "real", "acc"),
                                   ("xy", "sum", "none", "real", "real"),
                                   ("sq", "sum", "none", "real", "acc"),
                                   ("sq", "sum", "sqrt", "real", "real"),
                                   ("x", "sum", "scale", "acc", "real"),
                                   # a 16-bit loss's mean and count kept in float32
                                   ("x", "sum", "scale", "acc", "acc"),
                                   ("x", "sum", "none", "acc", "acc"),
                                   ("x", "sum", "sqrt", "acc", "real"),
                                   ("x", "max", "none", "acc", "real"),
                                   ("xv", "sum", "axpby", "real", "real"),
                                   ("xv", "sum", "none", "real", "acc"),
                                   ("x", "sum", "axpby", "acc", "real"),
                                   ("bad", "sum", "none", "real", "real"),
                                   ("bad", "sum", "none", "real", "acc")]
             # (the streaming form only makes a first stage's partial results)
             if not stream or (p == "acc" and f == "none")]
    # an activation's backward pass with the bias gradient: the GPU form only, whole
    # or as a first stage, rows (images' sums over H*W) and columns (dense layers)
    fused = [{"map": "dact", "op": "sum", "final": "none", "inp": "real", "outp": p,
              "wg": wg, "act": a, "src": s}
             for wg in ((1, 64), (1, 256), (32, 8)) for p in ("real", "acc")
             for a, s in DACT]
    return plain + fused


programs.register(
    "reduce", {"map": "x", "op": "sum", "final": "none", "inp": "real", "outp": "real",
               "wg": 0, "lanes": 1, "span": 1, "stream": False, "act": "none", "src": "a"},
    _variants)


def on_work_groups(dev):
    """Whether routines with a work-group form for GPUs (gemv, activation_bias_backward)
    take it on ``dev``: on GPUs, and wherever a test or benchmark forces the GPUs'
    reductions (tuning.override("reduce", {"wg": True}))."""
    return not dev.facts.is_cpu or bool((tuning.forced("reduce") or {}).get("wg"))


def _chunks(dev, outputs, R):
    """How many chunks to split each length-R reduction into (CPU kernel)."""
    target = dev.facts.compute_units * 32
    want = -(-target // builtins.max(outputs, 1))
    return builtins.max(1, builtins.min(want, R // _MIN_CHUNK))


# work-items along a row of the GPUs' row reduction (its tree's partial sums): on an
# H200 (2026-11-27, kernel time, sums along rows of 16384 x 1024) 64 read 2996 GB/s and
# 256 read 1986: 16 elements a work-item and 6 levels of barriers instead of 4 and 8
# (and LeNet-5's bias gradients sum rows of 100 and 784)
ROW_TREE = 64


def _wg_shape(dev, inner, forced=None):
    """(LX, LY) of the GPU kernel: rows (inner == 1) get ROW_TREE work-items along R;
    columns 32 neighbouring outputs by 8 along R, so a warp reads 128 contiguous bytes.
    ``forced`` (tuning.forced("reduce")) may give rows another LY ({"ly": 256}): a
    benchmark's way to try other trees (bench_ops.py --row-group)."""
    lx = 1 if inner == 1 else 32
    ly = ROW_TREE if lx == 1 else 8
    if lx == 1 and forced and forced.get("ly"):
        ly = int(forced["ly"])
    while lx * ly > dev.facts.max_work_group_size and ly > 1:
        ly //= 2
    return lx, ly


def reduce3(dev, dt, x, shape3, out, *, op="sum", map="x", final="none", post=1.0, y=None,
            inp="real", strides=None, beta=0.0, wg=None, outp="real", dact=None):
    """Reduce ``x`` viewed as (outer, R, inner) along R into ``out`` (outer, inner).

    ``dt`` is the storage dtype of ``out``; ``inp="acc"`` says ``x`` holds partial
    results in the arithmetic type (see programs.acc_dtype) rather than in ``dt``,
    ``outp="acc"`` that ``out`` does (a count of a 16-bit array's elements).
    ``strides`` (os, rs) place element (o, r, i) of x at o * os + r * rs + i (default:
    contiguous); map "xv" multiplies it by y[r], final "axpby" writes post * result +
    beta * out (gemv). ``wg`` forces the GPU (True) or CPU (False) kernel. ``dact``
    (act, src, p, q, z) makes the GPU kernel's map x * f'(y) for activation ``act``
    (its derivative from y, ``src`` "a" or "z", parameters p and q), each value stored
    to the array ``z`` laid out as x and summed as stored (map "dact"): an activation's
    backward pass and the bias gradient in one pass.
    On CPUs a work-item sums each output (or chunk of one); on GPUs a work-group does,
    with a tree in local memory (clnn_reduce_wg). Both split long reductions into
    chunks whose partial results a second launch reduces; the split depends only on
    the shape and the device, so results are bitwise reproducible.
    """
    outer, R, inner = shape3
    outputs = outer * inner
    if outputs == 0:
        return out
    y = x if y is None else y
    forced = tuning.forced("reduce")
    gpu = wg if wg is not None else forced["wg"] if forced else not dev.facts.is_cpu
    os_, rs_ = strides or (R * inner, inner)
    # CPU columns: a work-item per _LANES neighbouring outputs, whose loads along r are
    # contiguous (a sum over the rows of 3000 x 5000 took 62 ms with each work-item
    # striding down its own column, 10 ms so); long columns in chunks of rows, each
    # streamed a whole row at a time (below)
    span = _LANES if not gpu and inner >= _LANES else 1
    # (only a few long column sets: with many, the column form has parallelism enough,
    # and the streaming form's work-groups of one would each cost a dispatch)
    stream = span > 1 and R >= 2 * _MIN_CHUNK and outer < 8 * dev.facts.compute_units

    if dact is not None and not gpu:
        raise ValueError("map dact runs on the GPU kernel only")

    def run(params, n_chunks, chunk_len, R_, src, src_y, dst, post_, strides_):
        common = dict(outer=outer, R=R_, inner=inner, os=strides_[0], rs=strides_[1],
                      chunks=n_chunks, chunk_len=chunk_len, post=post_, beta=beta,
                      x=src, x_off=offset(src), y=src_y, y_off=offset(src_y), out=dst,
                      out_off=offset(dst))
        if params["map"] == "dact":
            act, src_kind, p, q, z = dact
            params = dict(params, act=act, src=src_kind)
            common.update(p=p, q=q, z=z, z_off=offset(z))
        if gpu:
            lx, ly = _wg_shape(dev, inner, forced)
            kern = programs.get_kernel(dev, "reduce", "clnn_reduce_wg",
                                       dict(params, dtype=programs.dtype_name(dt), wg=(lx, ly)))
            return kern((-(-inner // lx) * lx, outer * n_chunks * ly), (lx, ly), **common)
        if params.get("stream"):
            # a work-item per chunk of rows, a work-group each: every core gets some
            kern = programs.get_kernel(dev, "reduce", "clnn_reduce",
                                       dict(params, dtype=programs.dtype_name(dt)))
            return kern((outer * n_chunks,), (1,), **common)
        # a contiguous row: independent partial results side by side (a CPU's
        # compiler makes them vector operations; one chain per work-item waited for
        # each addition: a sum of 15M floats took 15 ms, numpy's 4)
        lanes = _LANES if inner == 1 and strides_[1] == 1 and R_ >= 4 * _LANES else 1
        if lanes > 1 and np.dtype(dt) == np.float32:
            # float32: four vectors of 8 side by side (sums along rows 29-32 -> 38-40
            # GB/s on a Zen 4); 16-bit rows are bound by their conversions, which one
            # vector keeps up with, and double8 arguments to built-ins fail PoCL 3.0's
            # build without AVX-512 ("changes the ABI")
            lanes = _ROW_LANES
        kern = programs.get_kernel(dev, "reduce", "clnn_reduce",
                                   dict(params, dtype=programs.dtype_name(dt), lanes=lanes,
                                        span=span))
        total = outer * n_chunks * -(-inner // span)
        # work-groups of 64, or of 1 where that would leave cores idle (a sum's 64
        # chunks were one work-group: one core of every CPU; a second local size is one
        # more build of the kernel, and PoCL runs a work-group of 1 with little overhead)
        wg = min(64, dev.facts.max_work_group_size) \
            if total >= 256 * dev.facts.compute_units else 1
        return kern((-(-total // wg) * wg,), (wg,), **common)

    if gpu:
        lx, ly = _wg_shape(dev, inner, forced)
        groups = outer * -(-inner // lx)
        # enough work-groups to fill the device, each work-item folding 16 or more
        chunks = builtins.max(1, builtins.min(-(-dev.facts.compute_units * 8 // groups),
                                              R // (ly * 16)))
    elif stream:
        # chunks of _MIN_CHUNK rows or more (partial results of at most 1/256 of the
        # input), enough of them to give every core several
        chunks = builtins.max(2, builtins.min(-(-dev.facts.compute_units * 32 // outer),
                                              R // _MIN_CHUNK))
    else:
        chunks = _chunks(dev, outer * -(-inner // span), R)
    if dact is not None:
        map = "dact"
    if chunks == 1:
        evt = run({"map": map, "op": op, "final": final, "inp": inp, "outp": outp},
                  1, builtins.max(R, 1), R, x, y, out, post, (os_, rs_))
    else:
        chunk_len = -(-R // chunks)
        chunks = -(-R // chunk_len)
        part = dev_scratch(dev, outer * chunks * inner, programs.acc_dtype(dt))
        first = run({"map": map, "op": op, "final": "none", "inp": inp, "outp": "acc",
                     **({"stream": True} if stream else {})},
                    chunks, chunk_len, R, x, y, part, 1.0, (os_, rs_))
        evt = run({"map": "x", "op": op, "final": final, "inp": "acc", "outp": outp},
                  1, chunks, chunks, part, part, out, post, (chunks * inner, inner))
        if dact is not None:
            done(dact[4], first)
    if dact is not None and chunks == 1:
        done(dact[4], evt)
    return done(out, evt)


def _along(x, axis):
    """(outer, R, inner) and the output shape for reducing ``x`` along ``axis``."""
    if axis is None:
        return (1, x.size, 1), ()
    shape = x.shape
    outer = int(math.prod(shape[:axis]))
    inner = int(math.prod(shape[axis + 1:]))
    return (outer, shape[axis], inner), shape[:axis] + shape[axis + 1:]


def _axes(axis, ndim):
    """The sorted axes to reduce (None: all), from an int or a tuple of ints."""
    if axis is None:
        return list(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = [normalize_axis(a, ndim) for a in axis]
        if len(set(axes)) != len(axes):
            raise ShapeError(f"axis {tuple(axis)} repeats an axis")
        return sorted(axes)
    return [normalize_axis(axis, ndim)]


def _runs(axes):
    """Adjacent axes grouped: each run is one reduction of a contiguous (outer, R,
    inner) view."""
    runs = []
    for a in axes:
        if runs and runs[-1][-1] == a - 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    return runs


def _reduce_op(x, axis, out, op, final, keepdims=False, scale_by_R=False):
    dev = common_device(x=x, out=out)
    dt = check(x, "x", dev)
    if not isinstance(keepdims, (bool, np.bool_)):
        raise ArgumentError(f"keepdims must be True or False, got {keepdims!r}")
    axes = _axes(axis, x.ndim)
    shape = tuple(x.shape)
    count = int(math.prod([shape[a] for a in axes]))
    if op == "max" and count == 0:
        raise ShapeError("max over an empty axis is undefined")
    kept = tuple(1 if a in axes else n for a, n in enumerate(shape))
    reduced = tuple(n for a, n in enumerate(shape) if a not in axes)
    out = check_out(out, kept if keepdims else reduced, dt, dev, allow_alias=False,
                    inputs=(x,))
    target = out.reshape(reduced) if keepdims else out
    if scale_by_R and count == 0:
        # the mean of nothing is NaN (numpy and PyTorch)
        from .elementwise import fill
        return fill(out, float("nan")) if out.size else out
    post = 1.0 / count if scale_by_R else 1.0
    if not axes:                                  # nothing to reduce: a copy
        from .elementwise import copy
        copy(x.reshape(reduced), out=target)
        return out
    # runs of adjacent axes, the last first, so the others' positions hold; every
    # run but the last writes an intermediate array
    src, cur = x, list(shape)
    runs = _runs(axes)
    for i, run in enumerate(reversed(runs)):
        a0, a1 = run[0], run[-1]
        outer = int(math.prod(cur[:a0]))
        R = int(math.prod(cur[a0:a1 + 1]))
        inner = int(math.prod(cur[a1 + 1:]))
        cur = cur[:a0] + cur[a1 + 1:]
        last = i == len(runs) - 1
        dst = target if last else dev_empty(dev, tuple(cur), dt)
        if dst.size:
            reduce3(dev, dt, src, (outer, R, inner), dst, op=op,
                    final=final if last else "none", post=post if last else 1.0)
        src = dst
    return out


@memoized
def sum(x, axis=None, out=None, keepdims=False):  # noqa: A001 - mirrors numpy's name
    """Sum of ``x`` over all elements (a 0-d array), along ``axis``, or along a tuple
    of axes; ``keepdims`` keeps them with length 1 (numpy's)."""
    return _reduce_op(x, axis, out, "sum", "none", keepdims)


@memoized
def mean(x, axis=None, out=None, keepdims=False):
    """Mean of ``x`` over all elements or along ``axis`` (an int or a tuple); NaN over
    an empty axis, as numpy and PyTorch."""
    return _reduce_op(x, axis, out, "sum", "scale", keepdims, scale_by_R=True)


@memoized
def max(x, axis=None, out=None, keepdims=False):  # noqa: A001
    """Maximum of ``x`` (NaN propagates, as in numpy), over all elements or along
    ``axis`` (an int or a tuple)."""
    return _reduce_op(x, axis, out, "max", "none", keepdims)


@memoized
def dot(x, y, out=None):
    """sum(x * y) over all elements of two arrays of one shape; a 0-d array."""
    dev = common_device(x=x, y=y, out=out)
    dt = check(x, "x", dev)
    check(y, "y", dev, dtype=dt, shape=x.shape)
    out = check_out(out, (), dt, dev, allow_alias=False, inputs=(x, y))
    return reduce3(dev, dt, x, (1, x.size, 1), out, map="xy", y=y)


@memoized
def nrm2(x, out=None):
    """Euclidean norm sqrt(sum(x**2)) over all elements; a 0-d array.

    Squares are summed in the arithmetic type without rescaling, so float32 inputs
    above about 1e19 overflow (BLAS rescales; clnn's inputs are activations and
    gradients).
    """
    dev = common_device(x=x, out=out)
    dt = check(x, "x", dev)
    out = check_out(out, (), dt, dev, allow_alias=False, inputs=(x,))
    return reduce3(dev, dt, x, (1, x.size, 1), out, map="sq", final="sqrt")


def count_nonfinite(x):
    """How many elements of ``x`` are NaN or infinite, as a Python int (it waits for
    the device). A sum would overflow on large finite values (3e37 + 3e37 is inf in
    float32); this counts instead, in the arithmetic type (float32 for the 16-bit
    types: counted in their own storage, 257 rounds to 256 in bfloat16)."""
    dev = common_device(x=x)
    dt = check(x, "x", dev, contiguous=True)
    if x.size == 0:
        return 0
    out = dev_empty(dev, (), programs.acc_dtype(dt))
    reduce3(dev, dt, x, (1, x.size, 1), out, map="bad", outp="acc")
    return int(out.get())
