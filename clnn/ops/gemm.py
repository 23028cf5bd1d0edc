"""GEMM and GEMV: C = act(alpha * op(A) @ op(B) + beta * C + bias). Kernel: gemm.cl.

The routine validates shapes, strides and dtypes, picks the tile variant and its
parameters for the device (clnn/tuning.py), and launches. Operands may be row-strided
views (an offset and a row stride, e.g. a block of columns of a bigger matrix); a 3-D
operand makes a strided batch, and a 2-D one beside it is shared by every batch.
"""

from .. import programs, tuning
from ..errors import ArgumentError, ShapeError
from ._args import (INT_MAX, as_array, check, common_device, dev_empty, dev_scratch,
                    finite, scratch_cap)
from .elementwise import ACTIVATIONS, _done, _param

programs.register(
    "gemm",
    {"variant": "reg", "trans_a": False, "trans_b": False, "act": "none", "bias": "none",
     "even": False, "conv": "none", "tuning": tuning.template_tuning(tuning.GEMM_TABLE["type"]["CPU"])},
    lambda: _variants(), lambda p: _complete(p))


def _complete(params):
    """Tile parameters for ``clnn render``: the variant's first table row, with any
    uppercase NAME=VALUE given on the command line put in."""
    variant = params.get("variant", "reg")
    row = next(r for r in tuning.all_gemm_rows() if r["variant"] == variant)
    row = dict(row, **{k: v for k, v in params.items() if k.isupper()})
    params = {k: v for k, v in params.items() if not k.isupper()}
    params.setdefault("tuning", tuning.template_tuning(row, params.get("dtype", "float32")))
    return params


def _variants():
    rows = tuning.all_gemm_rows()
    out = []
    for p in rows:
        for ta in (False, True):
            for tb in (False, True):
                out.append({"variant": p["variant"], "trans_a": ta, "trans_b": tb,
                            "act": "none", "bias": "none", "conv": "none",
                            "tuning": tuning.template_tuning(p)})
        for conv in ("fwd", "dgrad", "wgrad"):
            out.append({"variant": p["variant"], "trans_a": False, "trans_b": False,
                        "act": "relu" if conv == "fwd" else "none",
                        "bias": "row" if conv == "fwd" else "none", "conv": conv,
                        "tuning": tuning.template_tuning(p)})
    for act in ACTIVATIONS:
        out.append(dict(out[0], act=act, bias="col"))
    out += [dict(p, even=True) for p in out if p["variant"] == "local"]
    return out


class _Layout:
    """A 2-D or 3-D operand as (batch, rows, cols, ld, bstride, off) in elements."""

    def __init__(self, x, name):
        isz = x.dtype.itemsize
        if x.ndim not in (2, 3):
            raise ShapeError(f"{name} must be a matrix or a batch of matrices, has shape "
                             f"{x.shape}")
        self.batched = x.ndim == 3
        self.batch = x.shape[0] if self.batched else 1
        self.rows, self.cols = x.shape[-2:]
        strides = x.strides
        if any(s % isz for s in strides) or x.offset % isz:
            raise ShapeError(f"{name} has strides {strides} or offset {x.offset} that are "
                             f"not multiples of its item size {isz}")
        s_row, s_col = strides[-2] // isz, strides[-1] // isz
        if self.cols > 1 and s_col != 1:
            raise ShapeError(f"{name} must have unit column stride (a row-strided view); "
                             f"its strides are {strides}: copy it first")
        self.ld = s_row if self.rows > 1 else max(self.cols, 1)
        if self.rows > 1 and self.ld < self.cols:
            raise ShapeError(f"{name} has a row stride of {self.ld} elements for {self.cols} "
                             "columns: rows would overlap")
        self.bstride = strides[0] // isz if self.batched and self.batch > 1 else 0
        if self.bstride < 0 or self.ld < 0:
            raise ShapeError(f"{name} has negative strides {strides}")
        self.off = x.offset // isz
        last = self.off + (self.batch - 1) * self.bstride + (self.rows - 1) * self.ld + \
            self.cols
        if x.size and last > INT_MAX:
            raise ShapeError(f"{name} spans {last} elements; clnn indexes with 32-bit ints")

    def disjoint_rows(self):
        """True when no two elements of different batches share memory."""
        return self.batch <= 1 or self.bstride >= (self.rows - 1) * self.ld + self.cols


def _spans_overlap(x, y):
    if x is None or y is None or x.size == 0 or y.size == 0:
        return False
    if x.base_data.int_ptr != y.base_data.int_ptr:
        return False
    x_end = x.offset + sum((n - 1) * s for n, s in zip(x.shape, x.strides)) + x.dtype.itemsize
    y_end = y.offset + sum((n - 1) * s for n, s in zip(y.shape, y.strides)) + y.dtype.itemsize
    return x.offset < y_end and y.offset < x_end


def gemm(a, b, out=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, bias=None,
         activation=None, activation_param=None):
    """out = activation(alpha * op(a) @ op(b) + beta * out + bias).

    op(x) is x or its transpose (``trans_a``, ``trans_b``, applied to the last two axes).
    ``bias`` (N,) is added to every row, as a dense layer with batch-first data needs.
    ``beta != 0`` needs ``out``; with ``beta == 0`` the old contents of ``out`` are never
    read. Overwrites ``out`` (allocated when None) and returns it.
    """
    dev = common_device(a=a, b=b, out=out, bias=bias)
    dt = check(a, "a", dev, contiguous=False)
    check(b, "b", dev, dtype=dt, contiguous=False)
    alpha, beta = finite(alpha, "alpha"), finite(beta, "beta")
    act = "none" if activation is None else activation
    act_p = _param(act, activation_param) if act != "none" else 0.0
    A, B = _Layout(a, "a"), _Layout(b, "b")
    M, K = (A.cols, A.rows) if trans_a else (A.rows, A.cols)
    Kb, N = (B.cols, B.rows) if trans_b else (B.rows, B.cols)
    if K != Kb:
        raise ShapeError(f"inner dimensions differ: op(a) is {M}x{K}, op(b) is {Kb}x{N} "
                         f"(a {a.shape}, b {b.shape}, trans_a={trans_a}, trans_b={trans_b})")
    if A.batched and B.batched and A.batch != B.batch:
        raise ShapeError(f"batch sizes differ: a has {A.batch}, b has {B.batch}")
    batched = A.batched or B.batched
    nbatch = A.batch if A.batched else B.batch
    shape = (nbatch, M, N) if batched else (M, N)
    if bias is not None:
        check(bias, "bias", dev, dtype=dt, shape=(N,))
    if out is None:
        if beta != 0:
            raise ArgumentError("beta != 0 reads out: pass the out array")
        out = dev_empty(dev, shape, dt)
    else:
        as_array(out, "out")
        check(out, "out", dev, dtype=dt, shape=shape, contiguous=False)
        for x, n in ((a, "a"), (b, "b"), (bias, "bias")):
            if _spans_overlap(out, x):
                raise ShapeError(f"out overlaps {n}")
    C = _Layout(out, "out")
    if not C.disjoint_rows():
        raise ShapeError("out's batches overlap each other")
    if out.size == 0:
        return out

    evt = run_gemm(dev, dt, M=M, N=N, K=K, nbatch=nbatch, alpha=alpha, beta=beta,
                   act=act, act_p=act_p, bias=bias, bias_mode="col",
                   a=a, a_off=A.off, lda=A.ld, a_bstride=A.bstride, a_batches=A.batch,
                   b=b, b_off=B.off, ldb=B.ld, b_bstride=B.bstride, b_batches=B.batch,
                   out=out, c_off=C.off, ldc=C.ld, c_bstride=C.bstride,
                   trans_a=trans_a, trans_b=trans_b)
    return _done(out, evt)


def run_gemm(dev, dt, *, M, N, K, nbatch, alpha, beta, act, act_p, bias, bias_mode,
             a, a_off, lda, a_bstride, a_batches, b, b_off, ldb, b_bstride, b_batches,
             out, c_off, ldc, c_bstride, trans_a=False, trans_b=False, conv="none",
             geometry=None, params=None):
    """Launch a validated GEMM (plain, or a convolution's implicit GEMM when ``conv``
    names its loaders and ``geometry`` holds the cv_* sizes; a convolution passes the
    ``params`` it chose). Returns the last event."""
    klass = f"conv-{conv}" if conv != "none" else \
        tuning.shape_class(M, N, K, trans_a, trans_b)
    if params is None:
        params = tuning.gemm_params(dev.facts, dt.itemsize, dt, klass)
    prm = {"dtype": dt.name, "variant": params["variant"], "trans_a": bool(trans_a),
           "trans_b": bool(trans_b), "act": act,
           "bias": bias_mode if bias is not None else "none", "conv": conv,
           "tuning": tuning.template_tuning(params, dt)}
    geometry = geometry or {}
    common = dict(M=M, N=N, K=K, alpha=alpha, beta=beta, act_p=act_p,
                  bias=bias if bias is not None else out,
                  bias_off=bias.offset // dt.itemsize if bias is not None else 0,
                  c=out, c_off=c_off, ldc=ldc, c_bstride=c_bstride)
    a_args = dict(a=a, a_off=a_off, lda=lda, a_bstride=a_bstride)
    b_args = dict(b=b, b_off=b_off, ldb=ldb, b_bstride=b_bstride)
    if params["variant"] == "reg":
        return _gemm_packed(dev, dt, prm, params, a_args, a_batches, b_args, b_batches,
                            nbatch, common, geometry)
    prm["even"] = M % params["MWG"] == 0 and N % params["NWG"] == 0 and \
        K % params["KWG"] == 0
    kern = programs.get_kernel(dev, "gemm", "clnn_gemm", prm)
    gsize = (-(-M // params["MWG"]) * params["MDIMC"],
             -(-N // params["NWG"]) * params["NDIMC"], nbatch)
    lsize = (params["MDIMC"], params["NDIMC"], 1)
    return kern(gsize, lsize, **a_args, **b_args, **common, **geometry)


# Bound on the packed-panel workspace of one launch: batches are packed in groups and,
# when even one batch does not fit, blocks of columns (or, for a GEMM without a fused
# epilogue whose A panel alone is too big, slices of K), so a convolution never holds
# an unrolled copy of its whole input and a big GEMM's panels stay a bounded size.
PANEL_BYTES = 32 << 20


def _gemm_packed(dev, dt, prm, params, a_args, a_batches, b_args, b_batches, nbatch,
                 common, geometry):
    """The CPU variant: pack op(A) and op(B) into pool workspace, then multiply."""
    M, N, K = common["M"], common["N"], common["K"]
    mwi, nwi, wgm = params["MWI"], params["NWI"], params["WGM"]
    Mb = -(-M // mwi)
    acc = programs.acc_dtype(dt)
    cap = scratch_cap(dev, PANEL_BYTES)

    def panel_bytes(group, kc, nc):
        return ((group if a_batches > 1 else 1) * Mb * mwi +
                (group if b_batches > 1 else 1) * -(-nc // nwi) * nwi) * \
            max(kc, 1) * acc.itemsize
    group = nbatch
    while group > 1 and panel_bytes(group, K, N) > cap:
        group = -(-group // 2)
    kc, nc = K, N
    if panel_bytes(group, K, N) > cap:
        a_bytes = panel_bytes(group, K, 0)
        gb = group if b_batches > 1 else 1
        if a_bytes <= cap // 2:
            # panels for a block of columns at a time (the epilogue is unaffected)
            nc = max(nwi, (cap - a_bytes) // (gb * max(K, 1) * acc.itemsize) // nwi * nwi)
        elif prm["act"] == "none" and prm["bias"] == "none":
            # slices of K accumulate into C (beta = 1 after the first), so only a GEMM
            # without a bias or activation epilogue may be sliced
            kc = max(1, cap // panel_bytes(1, 1, N))
    pack_a = programs.get_kernel(dev, "gemm", "clnn_pack_a", prm)
    pack_b = programs.get_kernel(dev, "gemm", "clnn_pack_b", prm)
    kern = programs.get_kernel(dev, "gemm", "clnn_gemm", prm)
    pack_wg = min(8, dev.facts.max_work_group_size)  # 8 measured best for conv packing on PoCL
    wg = min(wgm, dev.facts.max_work_group_size)
    evt = None
    for g0 in range(0, nbatch, group):
        gn = min(group, nbatch - g0)
        ga, gb = (gn if a_batches > 1 else 1), (gn if b_batches > 1 else 1)
        a_g = dict(a_args, a_off=a_args["a_off"] + (g0 * a_args["a_bstride"]
                                                     if a_batches > 1 else 0))
        b_g = dict(b_args, b_off=b_args["b_off"] + (g0 * b_args["b_bstride"]
                                                     if b_batches > 1 else 0))
        for k0 in range(0, max(K, 1), max(kc, 1)):
            kn = min(kc, K - k0)
            kpad = -(-max(kn, 1) // pack_wg) * pack_wg
            a_pk = dev_scratch(dev, ga * Mb * mwi * kn, acc)
            if kn:
                pack_a((kpad, Mb, ga), (pack_wg, 1, 1), M=M, K=kn, Mb=Mb, k0=k0, a_pk=a_pk,
                       **a_g, **geometry)
            for n0 in range(0, N, nc):
                Nb = -(-min(nc, N - n0) // nwi)
                b_pk = dev_scratch(dev, gb * Nb * nwi * kn, acc)
                if kn:
                    pack_b((kpad, Nb, gb), (pack_wg, 1, 1), N=N, K=kn, Nb=Nb, k0=k0,
                           n_base=n0, b_pk=b_pk, **b_g, **geometry)
                step = dict(common, K=kn, beta=common["beta"] if k0 == 0 else 1.0,
                            c_off=common["c_off"] + g0 * common["c_bstride"])
                evt = kern((-(-Mb // wg) * wg, Nb, gn), (wg, 1, 1), Mb=Mb, Nb=Nb,
                           a_batched=int(ga > 1), b_batched=int(gb > 1), a_pk=a_pk,
                           b_pk=b_pk, n_base=n0, **step, **geometry)
    return evt


def gemv(a, x, y=None, *, alpha=1.0, beta=0.0, trans_a=False):
    """y = alpha * op(a) @ x + beta * y for a matrix a and contiguous vectors x, y.

    Its own kernel (clnn_gemv in gemm.cl), or the GEMM with N = 1 where that measured
    faster (the transposed case on CPUs).
    """
    dev = common_device(a=a, x=x, y=y)
    dt = check(a, "a", dev, contiguous=False)
    A = _Layout(a, "a")
    if A.batched:
        raise ShapeError("gemv takes one matrix; use gemm for batches")
    M, K = (A.cols, A.rows) if trans_a else (A.rows, A.cols)
    check(x, "x", dev, dtype=dt, shape=(K,))
    alpha, beta = finite(alpha, "alpha"), finite(beta, "beta")
    if y is None:
        if beta != 0:
            raise ArgumentError("beta != 0 reads y: pass the y array")
        y = dev_empty(dev, (M,), dt)
    else:
        check(y, "y", dev, dtype=dt, shape=(M,))
        for other, n in ((a, "a"), (x, "x")):
            if _spans_overlap(y, other):
                raise ShapeError(f"y overlaps {n}")
    if M == 0:
        return y
    if trans_a and dev.facts.is_cpu and M * K >= 1 << 20:
        # Measured on PoCL: for op(A) = A^T on big matrices the GEMM path with N = 1
        # beats the one-row-per-work-item kernel, whose rows are strided there (27 ms
        # against 48 ms at 5000x2000); without the transpose the kernel wins (8 ms
        # against 20 ms), and so it does for small matrices, where the GEMM's three
        # launches cost more than they save (a dense layer's bias gradient, 64 x 256:
        # MNIST epochs of 0.44 s against 0.51 s).
        gemm(a, x.reshape(K, 1), out=y.reshape(M, 1), alpha=alpha, beta=beta, trans_a=True)
        return y
    kern = programs.get_kernel(dev, "gemm", "clnn_gemv", {"dtype": dt.name,
                                                          "trans_a": bool(trans_a)})
    wg = min(64, dev.facts.max_work_group_size)
    groups = max(1, min(-(-M // wg), dev.facts.compute_units * 64))
    evt = kern((groups * wg,), (wg,), M=M, K=K, alpha=alpha, beta=beta, a=a, a_off=A.off,
               lda=A.ld, x=x, x_off=x.offset // dt.itemsize, y=y,
               y_off=y.offset // dt.itemsize)
    return _done(y, evt)
