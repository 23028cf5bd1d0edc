"""2-D max and average pooling with their backward ops. Kernel: clnn/kernels/pool.cl."""

from .. import programs
from ..errors import ShapeError
from ._args import check, check_out, common_device, done, launch_size, offset, pair

programs.register("pool", {"mode": "max"},
                  lambda: [{"mode": "max"}, {"mode": "avg"}])


def pool_geometry(x_shape, kernel_size, stride, padding):
    """(N, C, H, W, P, Q, (kh, kw), (sh, sw), (ph, pw)); stride defaults to the kernel."""
    if len(x_shape) != 4:
        raise ShapeError(f"x must be (N, C, H, W), has shape {tuple(x_shape)}")
    N, C, H, W = x_shape
    k = pair(kernel_size, "kernel_size", 1)
    s = k if stride is None else pair(stride, "stride", 1)
    p = pair(padding, "padding", 0)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ShapeError(f"padding {p} must be at most half the kernel {k}")
    if k[0] > H + 2 * p[0] or k[1] > W + 2 * p[1]:
        raise ShapeError(f"the {k[0]}x{k[1]} window is bigger than the padded "
                         f"{H + 2 * p[0]}x{W + 2 * p[1]} input")
    P, Q = (H + 2 * p[0] - k[0]) // s[0] + 1, (W + 2 * p[1] - k[1]) // s[1] + 1
    # one output position along an axis: its stride multiplies nothing, and a huge one
    # would not fit the kernel's int argument; the smallest that keeps one position
    # (1 would change the geometry that the kernels assume)
    s = (s[0] if P > 1 else min(s[0], H + 2 * p[0] - k[0] + 1),
         s[1] if Q > 1 else min(s[1], W + 2 * p[1] - k[1] + 1))
    return N, C, H, W, P, Q, k, s, p


def _is_22(mode, k, s, p):
    """Max pooling over 2x2 windows with stride 2 and no padding: its own kernels."""
    return mode == "max" and tuple(k) == (2, 2) and tuple(s) == (2, 2) and tuple(p) == (0, 0)


def _grid(dev, cols, rows):
    """(global, local) for a work-item per element of a rows x cols grid, in groups of
    8 x 8: PoCL runs the 8 along a row as one vectorised loop, and 8 rows per group
    cut its per-group cost (LeNet-5's pooling: 1.1 -> 0.7 ms per training step)."""
    lx = min(8, dev.facts.max_work_group_size)
    ly = max(1, min(8, dev.facts.max_work_group_size // lx))
    return (-(-cols // lx) * lx, -(-rows // ly) * ly), (lx, ly)


def _args(N, C, H, W, P, Q, k, s, p):
    return dict(planes=N * C, H=H, W=W, P=P, Q=Q, KH=k[0], KW=k[1], SH=s[0], SW=s[1],
                PH=p[0], PW=p[1])


def _forward(mode, x, kernel_size, stride, padding, out):
    dev = common_device(x=x, out=out)
    dt = check(x, "x", dev, ndim=4)
    N, C, H, W, P, Q, k, s, p = pool_geometry(x.shape, kernel_size, stride, padding)
    out = check_out(out, (N, C, P, Q), dt, dev, inputs=(x,), allow_alias=False)
    if _is_22(mode, k, s, p):
        kern = programs.get_kernel(dev, "pool", "clnn_pool22_forward",
                                   {"dtype": programs.dtype_name(dt), "mode": mode})
        evt = kern(*_grid(dev, Q, N * C * P), planes=N * C, H=H, W=W, P=P, Q=Q, x=x,
                   x_off=offset(x), y=out, y_off=offset(out))
        return done(out, evt)
    kern = programs.get_kernel(dev, "pool", "clnn_pool_forward", {"dtype": programs.dtype_name(dt),
                                                                   "mode": mode})
    g, l = launch_size(dev, N * C * P)          # a work-item per output row
    evt = kern(g, l, x=x, x_off=offset(x), y=out, y_off=offset(out),
               **_args(N, C, H, W, P, Q, k, s, p))
    return done(out, evt)


def _backward(mode, dy, x, kernel_size, stride, padding, out):
    dev = common_device(dy=dy, x=x, out=out)
    dt = check(x, "x", dev, ndim=4)
    N, C, H, W, P, Q, k, s, p = pool_geometry(x.shape, kernel_size, stride, padding)
    check(dy, "dy", dev, dtype=dt, shape=(N, C, P, Q))
    out = check_out(out, x.shape, dt, dev, inputs=(dy, x), allow_alias=False)
    if _is_22(mode, k, s, p):
        kern = programs.get_kernel(dev, "pool", "clnn_pool22_backward",
                                   {"dtype": programs.dtype_name(dt), "mode": mode})
        evt = kern(*_grid(dev, W, N * C * H), planes=N * C, H=H, W=W, P=P, Q=Q, x=x,
                   x_off=offset(x), dy=dy, dy_off=offset(dy), dx=out, dx_off=offset(out))
        return done(out, evt)
    kern = programs.get_kernel(dev, "pool", "clnn_pool_backward", {"dtype": programs.dtype_name(dt),
                                                                    "mode": mode})
    g, l = launch_size(dev, N * C * H)          # a work-item per input row
    evt = kern(g, l, x=x, x_off=offset(x), dy=dy, dy_off=offset(dy), dx=out,
               dx_off=offset(out), **_args(N, C, H, W, P, Q, k, s, p))
    return done(out, evt)


def max_pool2d(x, kernel_size, stride=None, padding=0, out=None):
    """Max over each window of each (N, C) plane; stride defaults to kernel_size."""
    return _forward("max", x, kernel_size, stride, padding, out)


def avg_pool2d(x, kernel_size, stride=None, padding=0, out=None):
    """Mean over each window (divided by the window size, padding included)."""
    return _forward("avg", x, kernel_size, stride, padding, out)


def max_pool2d_backward(dy, x, kernel_size, stride=None, padding=0, out=None):
    """dx: dy routed to each window's (first) maximum of x. Overwrites ``out``."""
    return _backward("max", dy, x, kernel_size, stride, padding, out)


def avg_pool2d_backward(dy, x, kernel_size, stride=None, padding=0, out=None):
    """dx: dy spread evenly over each window. Overwrites ``out``."""
    return _backward("avg", dy, x, kernel_size, stride, padding, out)
