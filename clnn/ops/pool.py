"""2-D max and average pooling with their backward ops. Kernel: clnn/kernels/pool.cl."""

import numpy as np

from .. import programs, tuning
from ..errors import ArgumentError, ShapeError
from ._args import (INT_MAX, check, check_ints, check_out, common_device, dev_empty,
                    dev_scratch, done, launch_size, offset, overlaps, pair)
from ._memo import memoized
from .elementwise import _check_source, activation_parameter

programs.register("pool", {"mode": "max", "per": "row", "act": "none"},
                  lambda: [{"mode": m, "per": per, "act": act} for m in ("max", "avg")
                           for per in ("row", "element") for act in ("none", "tanh")])


def _per(dev):
    """The general kernels' work-item: "row" on CPUs (index arithmetic once per row),
    "element" on GPUs (or where tests force the GPUs' row-wise kernels)."""
    forced = tuning.forced("rows")
    return "element" if (forced["wg"] if forced else not dev.facts.is_cpu) else "row"


def _out_size(L, k, s, p, d, ceil_mode):
    """PyTorch's pooled length: floor (or ceil) of (L + 2p - d(k-1) - 1) / s + 1, where a
    ceil_mode window must start inside the input or its left padding."""
    span = L + 2 * p - d * (k - 1) - 1
    n = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (n - 1) * s >= L + p:
        n -= 1
    return n


def pool_geometry(x_shape, kernel_size, stride, padding, dilation=1, ceil_mode=False):
    """(N, C, H, W, P, Q, (kh, kw), (sh, sw), (ph, pw), (dh, dw)); stride defaults to
    the kernel. PyTorch's rules: padding at most half the (dilated) window."""
    if len(x_shape) != 4:
        raise ShapeError(f"x must be (N, C, H, W), has shape {tuple(x_shape)}")
    N, C, H, W = x_shape
    k = pair(kernel_size, "kernel_size", 1)
    s = k if stride is None else pair(stride, "stride", 1)
    p = pair(padding, "padding", 0)
    d = pair(dilation, "dilation", 1)
    if not isinstance(ceil_mode, (bool, np.bool_)):
        raise ArgumentError(f"ceil_mode must be True or False, got {ceil_mode!r}")
    ext = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)     # the dilated window
    if p[0] > ext[0] // 2 or p[1] > ext[1] // 2:
        raise ShapeError(f"padding {p} must be at most half the window {ext}")
    if ext[0] > H + 2 * p[0] or ext[1] > W + 2 * p[1]:
        raise ShapeError(f"the {ext[0]}x{ext[1]} window is bigger than the padded "
                         f"{H + 2 * p[0]}x{W + 2 * p[1]} input")
    P = _out_size(H, k[0], s[0], p[0], d[0], ceil_mode)
    Q = _out_size(W, k[1], s[1], p[1], d[1], ceil_mode)
    # one output position along an axis: its stride multiplies nothing, and a huge one
    # would not fit the kernel's int argument; the smallest that keeps one position
    # (1 would change the geometry that the kernels assume)
    s = (s[0] if P > 1 else min(s[0], H + 2 * p[0] - ext[0] + 1),
         s[1] if Q > 1 else min(s[1], W + 2 * p[1] - ext[1] + 1))
    return N, C, H, W, P, Q, k, s, p, d


def _is_22(mode, k, s, p, d=(1, 1), H=0, W=0, P=0, Q=0):
    """Max or average pooling over 2x2 windows with stride 2, no padding or dilation,
    every window inside the input (ceil_mode adds none for even sizes): its own
    kernels. (Average pooling took the general kernels until 2026-11-29: LeNet C1's
    planes at batch 64, forward 364 us against max pooling's 68, backward 982 against
    130.)"""
    return tuple(k) == (2, 2) and tuple(s) == (2, 2) and \
        tuple(p) == (0, 0) and tuple(d) == (1, 1) and P == H // 2 and Q == W // 2


def _div22(divisor):
    """The 2x2 kernels' divisor from the general kernels' (div_mode, divisor): every
    window has its four taps inside the input, so 4 unless divisor_override."""
    return float(divisor[1]) if divisor[0] == 2 else 4.0


def _flat(dev, n):
    """(global, local) for a work-item per item of n (the 2x2 kernels: a block of four
    outputs, or of four windows of the input), in groups of 64."""
    wg = min(64, dev.facts.max_work_group_size)
    return (-(-n // wg) * wg,), (wg,)


def _args(N, C, H, W, P, Q, k, s, p, d, div_mode=0, divisor=1):
    return dict(planes=N * C, H=H, W=W, P=P, Q=Q, KH=k[0], KW=k[1], SH=s[0], SW=s[1],
                PH=p[0], PW=p[1], DH=d[0], DW=d[1], div_mode=div_mode, divisor=divisor)


def _divisor(count_include_pad, divisor_override):
    """(div_mode, divisor) for the kernels from avg_pool2d's PyTorch options."""
    if not isinstance(count_include_pad, (bool, np.bool_)):
        raise ArgumentError(f"count_include_pad must be True or False, got "
                            f"{count_include_pad!r}")
    if divisor_override is None:
        return (0 if count_include_pad else 1), 1
    if not isinstance(divisor_override, (int, np.integer)) or \
            isinstance(divisor_override, (bool, np.bool_)) or divisor_override == 0 or \
            not -INT_MAX <= divisor_override <= INT_MAX:
        raise ArgumentError(f"divisor_override must be a nonzero 32-bit int, got "
                            f"{divisor_override!r}")
    return 2, int(divisor_override)


def _unbatched(*arrays):
    """(C, H, W) arrays as (1, C, H, W) views (PyTorch takes unbatched images)."""
    out = []
    for a in arrays:
        if a is not None and getattr(a, "ndim", 0) == 3:
            if not a.flags.c_contiguous:
                raise ShapeError("unbatched (C, H, W) arrays must be C-contiguous")
            a = a.reshape((1,) + tuple(a.shape))
        out.append(a)
    return out


def _forward(mode, x, kernel_size, stride, padding, out, dilation=1, ceil_mode=False,
             divisor=(0, 1), indices=None, want_indices=False):
    if getattr(x, "ndim", 0) == 3:
        x4, o4, i4 = _unbatched(x, out, indices)
        r = _forward(mode, x4, kernel_size, stride, padding, o4, dilation, ceil_mode,
                     divisor, i4, want_indices)
        y, idx = r if want_indices else (r, None)
        y = out if out is not None else y.reshape(y.shape[1:])
        if want_indices:
            return y, (indices if indices is not None else idx.reshape(idx.shape[1:]))
        return y
    dev = common_device(x=x, out=out, indices=indices)
    dt = check(x, "x", dev, ndim=4)
    N, C, H, W, P, Q, k, s, p, d = pool_geometry(x.shape, kernel_size, stride, padding,
                                                 dilation, ceil_mode)
    out = check_out(out, (N, C, P, Q), dt, dev, inputs=(x,), allow_alias=False)
    if want_indices:
        if indices is None:
            indices = dev_empty(dev, (N, C, P, Q), np.int32)
        else:
            check_ints(indices, "indices", dev, shape=(N, C, P, Q))
            if overlaps(indices, x) or overlaps(indices, out):
                raise ShapeError("indices overlaps x or out")
    elif indices is not None:
        raise ArgumentError("indices are written only with return_indices=True")
    if out.size == 0:
        return (out, indices) if want_indices else out
    per = _per(dev)
    prm = {"dtype": programs.dtype_name(dt), "mode": mode, "per": per}
    if _is_22(mode, k, s, p, d, H, W, P, Q) and not want_indices:
        kern = programs.get_kernel(dev, "pool", "clnn_pool22_forward", prm)
        evt = kern(*_flat(dev, N * C * P * (-(-Q // 4) if per == "element" else 1)),
                   planes=N * C, H=H, W=W, P=P, Q=Q, x=x, x_off=offset(x), y=out,
                   y_off=offset(out), div=_div22(divisor))
        return done(out, evt)
    kern = programs.get_kernel(dev, "pool", "clnn_pool_forward", prm)
    g, l = launch_size(dev, N * C * P * (Q if per == "element" else 1))
    idx = indices if want_indices else out      # a placeholder the kernel never writes
    evt = kern(g, l, x=x, x_off=offset(x), y=out, y_off=offset(out), idx=idx,
               idx_off=offset(idx), want_idx=int(want_indices),
               **_args(N, C, H, W, P, Q, k, s, p, d, *divisor))
    done(out, evt)
    if want_indices:
        return out, done(indices, evt)
    return out


def _backward(mode, dy, x, kernel_size, stride, padding, out, dilation=1, ceil_mode=False,
              divisor=(0, 1), activation=None, activation_param=None):
    if getattr(x, "ndim", 0) == 3:
        dy4, x4, o4 = _unbatched(dy, x, out)
        dx = _backward(mode, dy4, x4, kernel_size, stride, padding, o4, dilation,
                       ceil_mode, divisor, activation, activation_param)
        return out if out is not None else dx.reshape(dx.shape[1:])
    dev = common_device(dy=dy, x=x, out=out)
    dt = check(x, "x", dev, ndim=4)
    act = "none" if activation is None else activation
    ap, aq = 0.0, 0.0
    if activation is not None:
        # (the derivative from the activation's output, x: activation_backward's a=)
        ap, aq = activation_parameter(activation, activation_param, dt)
        _check_source(activation, "a", aq)
    N, C, H, W, P, Q, k, s, p, d = pool_geometry(x.shape, kernel_size, stride, padding,
                                                 dilation, ceil_mode)
    check(dy, "dy", dev, dtype=dt, shape=(N, C, P, Q))
    out = check_out(out, x.shape, dt, dev, inputs=(dy, x), allow_alias=False)
    if out.size == 0:
        return out
    per = _per(dev)
    prm = {"dtype": programs.dtype_name(dt), "mode": mode, "per": per, "act": act}
    if _is_22(mode, k, s, p, d, H, W, P, Q):
        kern = programs.get_kernel(dev, "pool", "clnn_pool22_backward", prm)
        windows_h, windows_w = -(-H // 2), -(-W // 2)      # odd edges included
        blocks = -(-windows_w // 4) if per == "element" else 1
        evt = kern(*_flat(dev, N * C * windows_h * blocks), planes=N * C, H=H,
                   W=W, P=P, Q=Q, x=x, x_off=offset(x), dy=dy, dy_off=offset(dy), dx=out,
                   dx_off=offset(out), ap=ap, aq=aq, div=_div22(divisor))
        return done(out, evt)
    args = _args(N, C, H, W, P, Q, k, s, p, d, *divisor)
    idx = out                           # (a placeholder the kernel never reads)
    # (windows that do not overlap: the kernel's own test, its path by counting)
    if mode == "max" and per == "row" and not (s[0] >= k[0] and s[1] >= k[1] and
                                               tuple(d) == (1, 1)):
        # overlapping windows on CPUs: each window's maximum found once, as the forward
        # kernel's indices, then added in by rows (3x3 stride 2 over 8 x 64 planes of
        # 112x112, kernel ms: 318-342 finding them per element, 88-95 once per row a
        # window covers, 39-40 with the indices, the forward kernel's 23 of them)
        idx = dev_scratch(dev, N * C * P * Q, np.int32)
        ys = dev_scratch(dev, N * C * P * Q, dt)
        fwd = programs.get_kernel(dev, "pool", "clnn_pool_forward", prm)
        fwd(*launch_size(dev, N * C * P), x=x, x_off=offset(x), y=ys, y_off=0, idx=idx,
            idx_off=0, want_idx=1, **args)
    kern = programs.get_kernel(dev, "pool", "clnn_pool_backward", prm)
    g, l = launch_size(dev, N * C * H * (W if per == "element" else 1))
    evt = kern(g, l, x=x, x_off=offset(x), dy=dy, dy_off=offset(dy), dx=out,
               dx_off=offset(out), ap=ap, aq=aq, idx=idx, **args)
    return done(out, evt)


@memoized
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False, out=None, indices=None):
    """Max over each window of each (N, C) plane of x (N, C, H, W), or of an unbatched
    (C, H, W) x; stride defaults to kernel_size.

    PyTorch's options: ``dilation`` spaces the window's taps, ``ceil_mode`` rounds the
    output size up (a last window may reach past the input), ``return_indices`` also
    returns, per output, the flat index h * W + w of its maximum in the plane (int32;
    PyTorch's are int64), into ``indices`` when given. Ties go to the first maximum in
    row-major order; NaN wins. A dilated window with no tap inside the input gives
    -inf (as PyTorch) and index -1.
    """
    return _forward("max", x, kernel_size, stride, padding, out, dilation, ceil_mode,
                    indices=indices, want_indices=bool(return_indices))


@memoized
def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None, out=None):
    """Mean over each window; PyTorch's options and divisors: padding counts unless
    ``count_include_pad=False``, ``divisor_override`` replaces the divisor."""
    return _forward("avg", x, kernel_size, stride, padding, out, 1, ceil_mode,
                    _divisor(count_include_pad, divisor_override))


@memoized
def max_pool2d_backward(dy, x, kernel_size, stride=None, padding=0, dilation=1,
                        ceil_mode=False, out=None, activation=None, activation_param=None):
    """dx: dy routed to each window's (first) maximum of x. Overwrites ``out``.

    ``activation``: the activation whose output x is (a layer's, under the pooling):
    dx is then also multiplied by its derivative, as ``activation_backward(activation,
    dx, a=x)`` would, in the same pass (the gradient wrt the layer's pre-activation)."""
    return _backward("max", dy, x, kernel_size, stride, padding, out, dilation, ceil_mode,
                     activation=activation, activation_param=activation_param)


@memoized
def avg_pool2d_backward(dy, x, kernel_size, stride=None, padding=0, ceil_mode=False,
                        count_include_pad=True, divisor_override=None, out=None,
                        activation=None, activation_param=None):
    """dx: each window's dy over its divisor, spread over the window. Overwrites
    ``out``. ``activation``: as max_pool2d_backward's (x is then read too)."""
    return _backward("avg", dy, x, kernel_size, stride, padding, out, 1, ceil_mode,
                     _divisor(count_include_pad, divisor_override), activation,
                     activation_param)
