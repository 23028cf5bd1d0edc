"""2-D convolution as implicit GEMM: forward, data gradient, weight gradient.

There is no conv.cl: the three ops run gemm.cl with its ``conv`` loaders, which compute
where an element of the conceptual unrolled (im2col) matrix lives in the input while a
tile is loaded, so they share the GEMM's tile body, variants and tuning parameters.

    x (N, C, H, W)   w (M, C, R, S)   b (M,)   y (N, M, P, Q)
    P = (H + 2 * pad_h - R) // stride_h + 1,   Q likewise

    forward:          y (M x NPQ)    = w (M x CRS) @ unroll(x) (CRS x NPQ)   (+ b, act)
    data gradient:    dx (C x NHW)   = w^T gathered (C x MRS) @ dy gathered (MRS x NHW)
    weight gradient:  dw (M x CRS)   = dy (M x NPQ) @ unroll(x)^T (NPQ x CRS)

(the columns of the first two run over every image, and the GEMM's store maps them
back to NCHW, so a layer with few positions per image still makes one wide GEMM).

Every output element is summed by one work-item in a fixed order: no atomics, bitwise
reproducible results.
"""

import os

from .. import programs, tuning
from ..errors import ShapeError
from ._args import check, check_out, common_device, dev_empty, finite, offset
from .elementwise import _done, _param
from .gemm import run_gemm

programs.register(
    "conv", {"padded": False, "act": "none", "bias": "none",
             "tuning": (("MWI", 8), ("NWI", 16), ("VW", 8))},
    lambda: [{"padded": p, "act": a, "bias": b, "tuning": t}
             for p in (False, True) for a, b in (("none", "none"), ("relu", "col"))
             for t in ((("MWI", 8), ("NWI", 16), ("VW", 8)),
                       (("MWI", 8), ("NWI", 8), ("VW", 8)))])


def _gather_params(cols):
    env = os.environ.get("CLNN_GATHER")
    if env:
        m, n, v, w = (int(i) for i in env.split(","))
        return {"MWI": m, "NWI": n, "VW": v, "WG": w}
    return {"MWI": 8, "NWI": 8 if cols <= 8 else 16, "VW": 8, "WG": 16}


def _run_gather(dev, dt, *, x, x_off, H, W, ph, pw, rows3, row_steps, k3, k_steps,
                cols, src, src_off, CS, KD, KS, flip, out, out_steps, alpha=1.0,
                beta=0.0, act="none", act_p=0.0, bias=None):
    p = _gather_params(cols)
    mwi, nwi = p["MWI"], p["NWI"]
    K = k3[0] * k3[1] * k3[2]
    rows = rows3[0] * rows3[1] * rows3[2]
    Nb = -(-cols // nwi)
    acc = programs.acc_dtype(dt)
    vw = p["VW"] // 2 if acc.itemsize == 8 and p["VW"] > 1 else p["VW"]
    prm = {"dtype": dt.name, "padded": bool(ph or pw), "act": act,
           "bias": "col" if bias is not None else "none",
           "tuning": (("MWI", mwi), ("NWI", nwi), ("VW", vw))}
    b_pk = dev_empty(dev, (Nb * K * nwi,), acc)
    pack = programs.get_kernel(dev, "conv", "clnn_conv_pack", prm)
    pack((-(-K // 8) * 8, Nb), (8, 1), K=K, cols=cols, Nb=Nb, src=src, src_off=src_off,
         CS=CS, KD=KD, KS=KS, flip=flip, b_pk=b_pk)
    kern = programs.get_kernel(dev, "conv", "clnn_conv_gather", prm)
    Rb = -(-rows // mwi)
    wg = min(p["WG"], dev.facts.max_work_group_size)
    return kern((-(-Rb // wg) * wg, Nb), (wg, 1), rows=rows, R2=rows3[1], R3=rows3[2],
                RA=row_steps[0], RBH=row_steps[1], RCW=row_steps[2], K1=k3[0], K2=k3[1],
                K3=k3[2], KA=k_steps[0], KBH=k_steps[1], KCW=k_steps[2], x=x, x_off=x_off,
                H=H, W=W, ph=ph, pw=pw, cols=cols, b_pk=b_pk, out=out,
                out_off=offset(out), OA=out_steps[0], OB=out_steps[1], OC=out_steps[2],
                OM=out_steps[3], alpha=alpha, beta=beta, act_p=act_p,
                bias=bias if bias is not None else out,
                bias_off=offset(bias) if bias is not None else 0)


def _use_gather(dev):
    return os.environ.get("CLNN_GATHER", "1") != "0" and dev.facts.is_cpu


def _pair(v, name, low):
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(i, int) and i >= low for i in t):
        raise ShapeError(f"{name} must be an int >= {low} or a pair of them, got {v!r}")
    return t


def conv_geometry(x_shape, w_shape, stride, padding):
    """(N, C, H, W, M, R, S, P, Q, (sh, sw), (ph, pw)) after checking every size."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ShapeError(f"x must be (N, C, H, W) and w (M, C, R, S); got {tuple(x_shape)} "
                         f"and {tuple(w_shape)}")
    N, C, H, W = x_shape
    M, Cw, R, S = w_shape
    if C != Cw:
        raise ShapeError(f"x has {C} channels but w expects {Cw}")
    (sh, sw), (ph, pw) = _pair(stride, "stride", 1), _pair(padding, "padding", 0)
    if min(N, C, H, W, M, R, S) < 1:
        raise ShapeError(f"empty convolution: x {tuple(x_shape)}, w {tuple(w_shape)}")
    if R > H + 2 * ph or S > W + 2 * pw:
        raise ShapeError(f"the {R}x{S} kernel is bigger than the padded {H + 2 * ph}x"
                         f"{W + 2 * pw} input")
    P, Q = (H + 2 * ph - R) // sh + 1, (W + 2 * pw - S) // sw + 1
    return N, C, H, W, M, R, S, P, Q, (sh, sw), (ph, pw)


def _geometry_args(C, H, W, M, P, Q, R, S, stride, padding):
    return dict(cv_C=C, cv_H=H, cv_W=W, cv_M=M, cv_P=P, cv_Q=Q, cv_R=R, cv_S=S,
                cv_sh=stride[0], cv_sw=stride[1], cv_ph=padding[0], cv_pw=padding[1])


def conv2d(x, w, b=None, *, stride=1, padding=0, activation=None, activation_param=None,
           out=None):
    """y = activation(conv(x, w) + b), x (N, C, H, W), w (M, C, R, S) -> y (N, M, P, Q).

    ``stride`` and ``padding`` are ints or (h, w) pairs. Overwrites ``out``.
    """
    dev = common_device(x=x, w=w, b=b, out=out)
    dt = check(x, "x", dev, ndim=4)
    check(w, "w", dev, dtype=dt, ndim=4)
    N, C, H, W, M, R, S, P, Q, st, pd = conv_geometry(x.shape, w.shape, stride, padding)
    if b is not None:
        check(b, "b", dev, dtype=dt, shape=(M,))
    act = "none" if activation is None else activation
    act_p = _param(act, activation_param) if act != "none" else 0.0
    out = check_out(out, (N, M, P, Q), dt, dev, inputs=(x, w, b), allow_alias=False)
    if _use_gather(dev):
        evt = _run_gather(dev, dt, x=x, x_off=offset(x), H=H, W=W, ph=pd[0], pw=pd[1],
                          rows3=(N, P, Q), row_steps=(C * H * W, st[0], st[1]),
                          k3=(C, R, S), k_steps=(H * W, 1, 1), cols=M, src=w,
                          src_off=offset(w), CS=C * R * S, KD=C * R * S, KS=0, flip=0,
                          out=out, out_steps=(M * P * Q, Q, 1, P * Q), act=act,
                          act_p=act_p, bias=b)
        return _done(out, evt)
    evt = run_gemm(dev, dt, M=M, N=N * P * Q, K=C * R * S, nbatch=1, alpha=1.0, beta=0.0,
                   act=act, act_p=act_p, bias=b, bias_mode="row",
                   a=w, a_off=offset(w), lda=C * R * S, a_bstride=0, a_batches=1,
                   b=x, b_off=offset(x), ldb=0, b_bstride=0, b_batches=1,
                   out=out, c_off=offset(out), ldc=0, c_bstride=0,
                   conv="fwd", geometry=_geometry_args(C, H, W, M, P, Q, R, S, st, pd))
    return _done(out, evt)


def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, out=None):
    """dx = dL/dx for y = conv2d(x, w): dy (N, M, P, Q), w (M, C, R, S) -> dx x_shape.

    Overwrites ``out``.
    """
    dev = common_device(dy=dy, w=w, out=out)
    dt = check(dy, "dy", dev, ndim=4)
    check(w, "w", dev, dtype=dt, ndim=4)
    N, C, H, W, M, R, S, P, Q, st, pd = conv_geometry(tuple(x_shape), w.shape, stride,
                                                      padding)
    if dy.shape != (N, M, P, Q):
        raise ShapeError(f"dy has shape {dy.shape}; this convolution's output is "
                         f"{(N, M, P, Q)}")
    out = check_out(out, (N, C, H, W), dt, dev, inputs=(dy, w), allow_alias=False)
    if _use_gather(dev) and st == (1, 1):
        # at unit stride the data gradient is a forward pass over dy, padded by
        # R - 1 - ph, with the filters flipped and their channel axes swapped
        evt = _run_gather(dev, dt, x=dy, x_off=offset(dy), H=P, W=Q, ph=R - 1 - pd[0],
                          pw=S - 1 - pd[1], rows3=(N, H, W), row_steps=(M * P * Q, 1, 1),
                          k3=(M, R, S), k_steps=(P * Q, 1, 1), cols=C, src=w,
                          src_off=offset(w), CS=R * S, KD=R * S, KS=C * R * S, flip=1,
                          out=out, out_steps=(C * H * W, W, 1, H * W))
        return _done(out, evt)
    evt = run_gemm(dev, dt, M=C, N=N * H * W, K=M * R * S, nbatch=1, alpha=1.0, beta=0.0,
                   act="none", act_p=0.0, bias=None, bias_mode="none",
                   a=w, a_off=offset(w), lda=0, a_bstride=0, a_batches=1,
                   b=dy, b_off=offset(dy), ldb=0, b_bstride=0, b_batches=1,
                   out=out, c_off=offset(out), ldc=0, c_bstride=0,
                   conv="dgrad", geometry=_geometry_args(C, H, W, M, P, Q, R, S, st, pd))
    return _done(out, evt)


def conv2d_backward_weight(dy, x, w_shape, *, stride=1, padding=0, out=None, alpha=1.0,
                           beta=0.0):
    """dw = alpha * dL/dw + beta * out for y = conv2d(x, w): dy (N, M, P, Q), x (N, C, H, W).

    With the defaults it overwrites ``out``; ``alpha = -lr/batch, beta = momentum`` makes
    it the update step of a training loop, as for dense layers.
    """
    dev = common_device(dy=dy, x=x, out=out)
    dt = check(dy, "dy", dev, ndim=4)
    check(x, "x", dev, dtype=dt, ndim=4)
    N, C, H, W, M, R, S, P, Q, st, pd = conv_geometry(x.shape, tuple(w_shape), stride,
                                                      padding)
    if dy.shape != (N, M, P, Q):
        raise ShapeError(f"dy has shape {dy.shape}; this convolution's output is "
                         f"{(N, M, P, Q)}")
    alpha, beta = finite(alpha, "alpha"), finite(beta, "beta")
    if out is None and beta != 0:
        raise ShapeError("beta != 0 reads out: pass the out array")
    out = check_out(out, (M, C, R, S), dt, dev, inputs=(dy, x), allow_alias=False)
    if _use_gather(dev):
        evt = _run_gather(dev, dt, x=x, x_off=offset(x), H=H, W=W, ph=pd[0], pw=pd[1],
                          rows3=(C, R, S), row_steps=(H * W, 1, 1), k3=(N, P, Q),
                          k_steps=(C * H * W, st[0], st[1]), cols=M, src=dy,
                          src_off=offset(dy), CS=P * Q, KD=P * Q, KS=M * P * Q, flip=0,
                          out=out, out_steps=(R * S, S, 1, C * R * S), alpha=alpha,
                          beta=beta)
        return _done(out, evt)
    evt = run_gemm(dev, dt, M=M, N=C * R * S, K=N * P * Q, nbatch=1, alpha=alpha, beta=beta,
                   act="none", act_p=0.0, bias=None, bias_mode="none",
                   a=dy, a_off=offset(dy), lda=0, a_bstride=0, a_batches=1,
                   b=x, b_off=offset(x), ldb=0, b_bstride=0, b_batches=1,
                   out=out, c_off=offset(out), ldc=C * R * S, c_bstride=0,
                   conv="wgrad", geometry=_geometry_args(C, H, W, M, P, Q, R, S, st, pd))
    return _done(out, evt)
