"""GEMM and GEMV: C = act(alpha * op(A) @ op(B) + beta * C + bias). Kernel: gemm.cl.

The routine validates shapes, strides and dtypes, picks the tile variant and its
parameters for the device (clnn/tuning.py), and launches. Operands may be row-strided
views (an offset and a row stride, e.g. a block of columns of a bigger matrix); a 3-D
operand makes a strided batch, and a 2-D one beside it is shared by every batch.
"""

import dataclasses
import warnings
from typing import NamedTuple

import numpy as np

from .. import plans, programs, tuning
from ..errors import ArgumentError, KernelBuildError, ShapeError
from ._args import (INT_MAX, as_array, check, common_device, dev_empty, dev_scratch, done,
                    finite, int4, overlaps, scratch_cap)
from ._memo import memoized
from .elementwise import ACTIVATIONS, activation_parameter
from .reduce import on_work_groups, reduce3

programs.register(
    "gemm",
    {"variant": "reg", "trans_a": False, "trans_b": False, "act": "none", "bias": "none",
     "conv": "none", "vec": 1, "vec_c": False, "partial": False,
     "tuning": tuning.template_tuning(tuning.GEMM_TABLE["type"]["CPU"])},
    lambda: _variants(), lambda p: _complete(p))


class Operand(NamedTuple):
    """A matrix operand as the kernels see it: the array (or a bare buffer), its element
    offset, leading dimension (row stride) and batch stride (0: shared by every batch),
    and how many batches it has. Kernels take (off, ld, bstride) as one int4 (desc)."""

    data: object
    off: int = 0
    ld: int = 0
    bstride: int = 0
    batches: int = 1

    def desc(self):
        return int4(self.off, self.ld, self.bstride)


def _complete(params):
    """Tile parameters for ``clnn render``: the variant's first table row, with any
    uppercase NAME=VALUE given on the command line put in."""
    variant = params.get("variant", "reg")
    rows = tuning.all_gemm_rows()
    row = next((r for r in rows if r["variant"] == variant), None)
    if row is None:
        raise ArgumentError(f"no GEMM variant {variant!r}; variants: "
                            f"{', '.join(sorted({r['variant'] for r in rows}))}")
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
    for bias in ("row", "one"):      # gemm's bias of shape (M, 1) and ()
        out.append(dict(out[0], bias=bias))
    # the tiled kernel's vector loads and stores, and its split-K partial sums
    for p in [r for r in rows if r["variant"] == "local"]:
        vec = plans.vector_width(p, ())
        for ta, tb, bias in ((False, False, "col"), (True, True, "col"),
                             (False, False, "one")):
            out.append({"variant": "local", "trans_a": ta, "trans_b": tb, "act": "tanh",
                        "bias": bias, "conv": "none", "vec": vec, "vec_c": True,
                        "tuning": tuning.template_tuning(p)})
        out.append({"variant": "local", "trans_a": False, "trans_b": True, "act": "none",
                    "bias": "none", "conv": "none", "vec": vec, "partial": True,
                    "tuning": tuning.template_tuning(p)})
        out.append({"variant": "local", "trans_a": False, "trans_b": False, "act": "none",
                    "bias": "none", "conv": "wgrad", "partial": True,
                    "tuning": tuning.template_tuning(p)})
    return out


def _bias_mode(bias, M, N):
    """How gemm's ``bias`` broadcasts over the M x N product (addmm's input rules): one
    value per column, (N,) or (1, N); per row, (M, 1); one for all, (), (1,) or (1, 1)."""
    shape = tuple(getattr(bias, "shape", ()))
    if shape in ((N,), (1, N)):
        return "col"
    if shape == (M, 1):
        return "row"
    if shape in ((), (1,), (1, 1)):
        return "one"
    raise ShapeError(f"bias of shape {shape} does not broadcast over the {M}x{N} product: "
                     f"give ({N},), (1, {N}), ({M}, 1) or one value")


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

    def operand(self, x):
        return Operand(x, self.off, self.ld, self.bstride, self.batch)

    def disjoint_rows(self):
        """True when no two elements of different batches share memory."""
        return self.batch <= 1 or self.bstride >= (self.rows - 1) * self.ld + self.cols


@memoized
def gemm(a, b, out=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, bias=None,
         activation=None, activation_param=None):
    """out = activation(alpha * op(a) @ op(b) + beta * out + bias).

    op(x) is x or its transpose (``trans_a``, ``trans_b``, applied to the last two axes).
    ``bias`` (N,) is added to every row, as a dense layer with batch-first data needs;
    it broadcasts as addmm's input does: (1, N) the same, (M, 1) one value per row,
    () or (1,) one value everywhere.
    ``beta != 0`` needs ``out``; with ``beta == 0`` the old contents of ``out`` are never
    read. Overwrites ``out`` (allocated when None) and returns it.
    """
    dev = common_device(a=a, b=b, out=out, bias=bias)
    dt = check(a, "a", dev, contiguous=False)
    check(b, "b", dev, dtype=dt, contiguous=False)
    alpha, beta = finite(alpha, "alpha", dt), finite(beta, "beta", dt)
    act = "none" if activation is None else activation
    act_p = activation_parameter(act, activation_param, dt) if act != "none" \
        else (0.0, 0.0)
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
    bias_mode = "none"
    if bias is not None:
        check(bias, "bias", dev, dtype=dt)
        bias_mode = _bias_mode(bias, M, N)
    if out is None:
        if beta != 0:
            raise ArgumentError("beta != 0 reads out: pass the out array")
        out = dev_empty(dev, shape, dt)
    else:
        as_array(out, "out")
        check(out, "out", dev, dtype=dt, shape=shape, contiguous=False)
        for x, n in ((a, "a"), (b, "b"), (bias, "bias")):
            if overlaps(out, x):
                raise ShapeError(f"out overlaps {n}")
    C = _Layout(out, "out")
    if not C.disjoint_rows():
        raise ShapeError("out's batches overlap each other")
    if out.size == 0:
        return out

    evt = run_gemm(dev, dt, M=M, N=N, K=K, nbatch=nbatch, a=A.operand(a), b=B.operand(b),
                   c=C.operand(out), alpha=alpha, beta=beta, act=act, act_p=act_p,
                   bias=bias, bias_mode=bias_mode, trans_a=trans_a, trans_b=trans_b)
    return done(out, evt)


# Bound on split-K's partial sums, in bytes
SPLITK_BYTES = 64 << 20

programs.register("transpose", {})


def _k_major_rows(dev, dt, rows, klass, M, N, K, trans_a, trans_b):
    """The NT shape class's rows where its plan is a K-major row (tuning's "KMAJOR":
    Hopper's WGMMA rows) and beats the plan of ``rows`` (this product's, NN, TN or TT)
    by more than copying its operands along k costs (device-wide traffic and a launch
    each, in the planner's units); else None."""
    nt = tuning.gemm_rows(dev.facts, dt.itemsize, dt, "NT" + klass[2:])
    if nt is rows or list(nt) == list(rows) or \
            any(r.get("variant") != "local" for r in rows):
        # (a row forced by tuning.override, which gemm_rows returns for every class,
        # decides alone; a CPU row has no K-major plan to weigh against)
        return None
    ws = SPLITK_BYTES // programs.acc_dtype(dt).itemsize
    best = plans.cached_best(dev.facts, plans.freeze(nt), M, N, K, 1, dt.itemsize, ws)
    if not best.params.get("KMAJOR"):
        return None
    mine = plans.cached_best(dev.facts, plans.freeze(rows), M, N, K, 1, dt.itemsize, ws)
    moved = (M * K if trans_a else 0) + (0 if trans_b else K * N)
    copies = 2 * moved * dt.itemsize * plans.FMA_PER_BYTE / dev.facts.compute_units + \
        plans.LAUNCH * (int(trans_a) + int(not trans_b))
    return nt if best.cost + copies < mine.cost else None


def _transposed(dev, dt, op, rows, cols):
    """Operand ``op`` (``rows`` x ``cols``, row-strided) copied transposed into a pool
    buffer (transpose.cl): a cols x rows Operand whose rows start 16-byte aligned, so
    that the WGMMA row's copies take 16 bytes whatever ``rows`` is."""
    ld = -(-rows // 8) * 8
    out = dev_scratch(dev, ld * cols, dt)
    kern = programs.get_kernel(dev, "transpose", "clnn_transpose",
                               {"dtype": programs.dtype_name(dt)})
    kern((-(-cols // 32) * 32, -(-rows // 32) * 8), (32, 8), rows=rows, cols=cols,
         x=op.data, x_off=op.off, ldx=op.ld, y=out, y_off=0, ldy=ld)
    return Operand(out, 0, ld)


def run_gemm(dev, dt, *, M, N, K, nbatch, a, b, c, alpha=1.0, beta=0.0, act="none",
             act_p=(0.0, 0.0), bias=None, bias_mode="none", trans_a=False, trans_b=False,
             conv="none", conv_args=None, params=None, rows=None, workspace=None):
    """Launch a validated GEMM on Operands a, b, c: a plain one, or a convolution's
    implicit GEMM when ``conv`` names its loaders ("fwd", "dgrad", "wgrad") and
    ``conv_args`` holds what they read (the packed variant: the cv_* sizes; the tiled
    one: ktab and the column map, see clnn/ops/conv.py). ``params`` forces one
    parameter set, ``rows`` gives the sets to plan from; else the tuning rows of the
    GEMM's shape class are planned. ``workspace``: a split-K workspace of at least
    ``tiled_workspace`` elements taken by a caller that launches several GEMMs into
    one output and must hold everything before its first write. Returns the last
    event."""
    klass = None
    if params is not None:
        rows = [params]
    elif rows is None:
        klass = tuning.shape_class(M, N, K, trans_a, trans_b, nbatch)
        rows = tuning.gemm_rows(dev.facts, dt.itemsize, dt, klass)
    if klass is not None and conv == "none" and nbatch == 1 and (trans_a or not trans_b) \
            and dev.facts.nv_compute_capability == 90 and \
            all((op.off * dt.itemsize) % 4 == 0 == (op.ld * dt.itemsize) % 4
                for op, stays in ((a, not trans_a), (b, trans_b)) if stays):
        # (an operand that stays where it is must allow the WGMMA row's copies of 4
        # bytes or more: else the row would hand the launch to mma.sync anyway)
        nt = _k_major_rows(dev, dt, rows, klass, M, N, K, trans_a, trans_b)
        if nt is not None:
            # a K-major WGMMA row beats this product's plan by more than the copies
            # cost: A (stored K x M) and B (stored K x N) copied into workspace along k
            if trans_a:
                a = _transposed(dev, dt, a, K, M)
            if not trans_b:
                b = _transposed(dev, dt, b, K, N)
            rows, trans_a, trans_b = nt, False, True
    bias_mode = bias_mode if bias is not None else "none"
    common = dict(M=M, N=N, K=K, alpha=alpha, beta=beta, act_p=act_p[0],
                  act_q=act_p[1],
                  bias=bias if bias is not None else c.data,
                  bias_off=bias.offset // dt.itemsize if bias is not None else 0)
    if rows[0]["variant"] == "reg":
        prm = {"dtype": programs.dtype_name(dt), "variant": "reg", "trans_a": bool(trans_a),
               "trans_b": bool(trans_b), "act": act, "bias": bias_mode, "conv": conv,
               "tuning": tuning.template_tuning(rows[0], dt)}
        if conv == "none" and not trans_a and _direct(dt, M, N, K, nbatch, trans_b):
            return _gemm_direct(dev, prm, a, b, c, nbatch, common)
        return _gemm_packed(dev, dt, prm, rows[0], a, b, c, nbatch, common, conv_args or {})
    plan, kern, red = _tiled_launch(dev, dt, rows, M, N, K, nbatch, a, b, c, act,
                                    bias_mode, bool(trans_a), bool(trans_b), conv)
    args = dict(common, splits=plan.splits, k_split=plan.k_split, a=a.data, a_desc=a.desc(),
                b=b.data, b_desc=b.desc(), **(conv_args or {}))
    if plan.splits == 1:
        return kern(plan.global_size, plan.local_size, c=c.data, c_desc=c.desc(), **args)
    # split-K: each slice's sums go to the workspace, then one pass adds them up in
    # slice order and applies the epilogue (no atomics: bitwise reproducible)
    ws = workspace if workspace is not None else \
        dev_scratch(dev, plan.workspace, programs.acc_dtype(dt))
    kern(plan.global_size, plan.local_size, c=ws, c_desc=_PLAIN, **args)
    wg = min(64, dev.facts.max_work_group_size)
    extra = {"cols": conv_args["cols"]} if conv in ("fwd", "dgrad") else {}
    return red((-(-N // wg) * wg, M, nbatch), (wg, 1, 1), M=M, N=N, splits=plan.splits,
               alpha=alpha, beta=beta, act_p=act_p[0], act_q=act_p[1], ws=ws,
               bias=common["bias"],
               bias_off=common["bias_off"], c=c.data, c_desc=c.desc(), **extra)


def tiled_workspace(dev, dt, rows, *, M, N, K, nbatch, a, b, c, act="none",
                    bias_mode="none", trans_a=False, trans_b=False, conv="none"):
    """Elements of split-K workspace the tiled GEMM run_gemm would launch needs (0
    without split-K); plans it (cached) without allocating or launching."""
    plan = _tiled_launch(dev, dt, rows, M, N, K, nbatch, a, b, c, act, bias_mode,
                         bool(trans_a), bool(trans_b), conv)[0]
    return plan.workspace if plan.splits > 1 else 0


_PLAIN = int4()
# (device, dtype, sizes, structure, alignment, rows) -> (frozen rows, plan, kernels): a
# training step asks for the same GEMMs every step, and planning and choosing the
# kernel's parameters cost more Python than the launch itself
_launches = {}


def _without_wgmma(rows):
    """``rows`` less the WGMMA rows the GPU would run (emulated ones stay), else the
    mma.sync row that stands in for them; ``rows`` itself where it has none."""
    if not any(r.get("WGMMA") and not r.get("EMULATE") for r in rows):
        return rows
    return [r for r in rows if not r.get("WGMMA") or r.get("EMULATE")] or \
        [tuning.wgmma_fallback(rows[0])]


def _tiled_launch(dev, dt, rows, M, N, K, nbatch, a, b, c, act, bias_mode, trans_a,
                  trans_b, conv):
    """(plan, GEMM kernel, split-K kernel) of the tiled variant for one launch."""
    if not getattr(dev.facts, "patched_ptx", True):
        # (rows given before a WGMMA build failed on the device, or forced: the table's
        # rows for it lack them since)
        rows = _without_wgmma(rows)
    frozen = plans.freeze(rows)
    key = (dev, dt, M, N, K, nbatch, act, bias_mode, trans_a, trans_b, conv, id(frozen),
           (a.off | a.ld | a.bstride) & 7, (b.off | b.ld | b.bstride) & 7,
           (c.off | c.ld | c.bstride) & 3)
    hit = _launches.get(key)
    if hit is not None and hit[0] is frozen:
        return hit[1:]
    acc = programs.acc_dtype(dt)
    # the workspace bound is a constant, not a share of the pool's budget: how a GEMM
    # is split (and so its bits) must not depend on the budget, only whether it fits
    plan = plans.cached_best(dev.facts, frozen, M, N, K, nbatch, dt.itemsize,
                             SPLITK_BYTES // acc.itemsize)
    p = plan.params
    # vector loads of the plain matrix operands where every offset and stride allows
    # (a convolution's gathered operands load element by element); a cp.async row's
    # copies take up to 16 bytes, 8 halves
    vec_ops = [a.off, a.ld, a.bstride] + ([b.off, b.ld, b.bstride] if conv == "none" else [])
    if p.get("WGMMA") and (conv != "none" or
                           plans.vector_width(p, vec_ops, _widest(p, conv, dt)) *
                           dt.itemsize < 4):
        # wgmma's tiles arrive by cp.async only: an mma.sync row serves this launch
        fall = plans.freeze((tuning.wgmma_fallback(p),))
        plan = plans.cached_best(dev.facts, fall, M, N, K, nbatch, dt.itemsize,
                                 SPLITK_BYTES // acc.itemsize)
        p = plan.params
    vwn = p.get("VWN", 1)
    prm = {"dtype": programs.dtype_name(dt), "variant": "local", "trans_a": trans_a,
           "trans_b": trans_b, "act": act, "bias": bias_mode, "conv": conv,
           "vec": plans.vector_width(p, vec_ops, _widest(p, conv, dt))
           if conv in ("none", "fwd") else 1,
           "vec_c": vwn > 1 and conv in ("none", "wgrad") and
           all(x % vwn == 0 for x in (c.off, c.ld, c.bstride)),
           "partial": plan.splits > 1, "tuning": tuning.template_tuning(p, dt)}
    try:
        kern = _tiled_kernel(dev, p, prm, "clnn_gemm_tiled")
        red = _tiled_kernel(dev, p, prm, "clnn_gemm_splitk") if plan.splits > 1 else None
    except KernelBuildError as exc:
        if not p.get("WGMMA") or p.get("EMULATE"):
            raise
        # a driver whose compiler took no patched sm_90a PTX (an older one, or one
        # that changed its binaries): say so once, leave the WGMMA rows out of this
        # device's plans from now on (tuning.gemm_problems reads the fact), and serve
        # this launch with the rows that remain, mma.sync's
        warnings.warn(f"{dev.name}: a WGMMA row did not build ({str(exc)[:300]}...); "
                      f"its products run on the mma.sync rows", RuntimeWarning)
        dev.facts = dataclasses.replace(dev.facts, patched_ptx=False)
        return _tiled_launch(dev, dt, _without_wgmma(rows), M, N, K, nbatch, a, b, c, act,
                             bias_mode, trans_a, trans_b, conv)
    if len(_launches) > 4096:
        _launches.clear()
    _launches[key] = (frozen, plan, kern, red)
    return plan, kern, red


def clear_launches():
    _launches.clear()


def _widest(p, conv, dt):
    """The widest vector row ``p`` loads plain operands by: 8 halves for the 16-byte
    copies of a float16 cp.async row with ldmatrix or wgmma (16 bytes at most: 4
    floats), else 4."""
    return 8 if p.get("ASYNC") and (p.get("LDSM") or p.get("WGMMA")) and conv == "none" \
        and dt.itemsize == 2 else 4


# wgmma exists only for the architecture-specific target sm_90a. NVIDIA's OpenCL
# compiler emits PTX for plain sm_90 and its ptxas rejects wgmma there, with or without
# -cl-nv-arch sm_90a (measured on an H200, driver 580.159.04): on a device that reports
# its compute capability a WGMMA row is built with programs.PTX_PATCH_OPTION (its wgmma
# instructions as PTX comments, then built again from its PTX, uncommented, for
# sm_90a). Elsewhere it is built as it is, and a compiler without wgmma says so.
WGMMA_OPTIONS = (programs.PTX_PATCH_OPTION,)


# An emulated engine row (EMULATE: tests on PoCL and Oclgrind) unrolls every fragment's
# exchange and sums: PoCL's optimiser took 5-22 s to build one (a cold test run's
# largest share), half that without it, and the tests' products are small. Oclgrind
# interprets what it builds, so there it stays optimised.
EMULATED_OPTIONS = ("-cl-opt-disable",)


def _tiled_kernel(dev, p, prm, entry):
    if p.get("EMULATE"):
        return programs.get_kernel(dev, "gemm", entry, prm,
                                   options=EMULATED_OPTIONS if dev.facts.is_pocl else ())
    if p.get("WGMMA") and getattr(dev.facts, "nv_compute_capability", 0) >= 90:
        return programs.get_kernel(dev, "gemm", entry, prm, options=WGMMA_OPTIONS)
    return programs.get_kernel(dev, "gemm", entry, prm)


# Bound on the packed-panel workspace of one launch: batches are packed in groups and,
# when even one batch does not fit, blocks of columns (or, for a GEMM without a fused
# epilogue whose A panel alone is too big, slices of K), so a convolution never holds
# an unrolled copy of its whole input and a big GEMM's panels stay a bounded size.
PANEL_BYTES = 32 << 20


# The CPU variant multiplies products of at most this many rows of C (op(A) not
# transposed) where A and B lie, without packing them: packing a big B (a dense
# layer's weights) for a few rows of A read and wrote all of it before the multiply
# read it again. float16 elements are converted as they are loaded, once per block of
# rows here against once in the packing, so for halves the direct kernel wins on fewer
# rows. NT products (X W^T, a dense layer's forward pass), whose rows of A and B are
# vectors of halves, as float32 up to 16 rows, and small ones up to
# DIRECT_ROWS_HALF: kernel times against the packed path, float16, Intel Xeon, PoCL
# 3.0, with F16C's conversions in the kernel (_half.cl): 16 x 2000 x 2000 2.56x, 64 x
# 400 x 120 (LeNet-5's first dense layer at batch 64) 1.51x, 128 x 400 x 120 1.20x,
# 64 x 784 x 256 1.19x; 256 x 400 x 120 0.90x, 512 x 120 x 84 0.51x (with the
# conversions as calls the direct kernel ran 0.4-0.5x at 64 rows). NN products up to
# 4 rows (a work-item per 16 columns: 4 x 2000 x 2000 2.0x, 8 rows 1.3x, 16 rows
# 0.9x; at 120 columns, one work-group, 16 rows 0.5x).
DIRECT_M = 16
DIRECT_M_HALF = {True: 16, False: 4}       # by trans_b
DIRECT_ROWS_HALF = 128                     # NT, at most DIRECT_FLOPS
# Small products with more rows too, in float32 and float64: there the packed path's
# three launches cost more than its faster multiply saves (LeNet-5's and the MNIST
# MLP's dense layers at batch 64, 0.1 to 26 MFLOP, forward and data gradient: 1.3-4x
# less kernel time on PoCL; a 64 x 2000 by 2000 x 5000 NN product, 1.3 GFLOP, 2.5x
# more, and 256^3, 34 MFLOP, either way by the run). Up to DIRECT_ROWS rows: a
# work-item of the direct kernel loops over every row of C, so a tall, narrow product
# would leave most of a many-core CPU idle (measured up to 1000 rows here). bfloat16
# too, whose conversion is a shift: LeNet-5's dense products at batch 64 (forward and
# data gradient) ran 1.2-2.8x the packed path's speed direct, one of the six 0.8x
# (Intel Xeon, PoCL 3.0), where float16's direct kernel ran 0.4-0.5x at the larger ones.
DIRECT_FLOPS = 32e6
DIRECT_ROWS = 1024


def _direct(dt, M, N, K, nbatch, trans_b):
    """Whether the CPU variant takes the direct kernel (op(A) not transposed)."""
    if dt == np.float16:
        return M <= DIRECT_M_HALF[bool(trans_b)] or (
            trans_b and M <= DIRECT_ROWS_HALF and 2.0 * M * N * K * nbatch <= DIRECT_FLOPS)
    return M <= DIRECT_M or (M <= DIRECT_ROWS and 2.0 * M * N * K * nbatch <= DIRECT_FLOPS)


def _gemm_direct(dev, prm, a, b, c, nbatch, common):
    """The CPU variant's direct kernel (gemm.cl, clnn_gemm_direct), one launch."""
    kern = programs.get_kernel(dev, "gemm", "clnn_gemm_direct", prm)
    vw = programs.helper_width(dict(prm["tuning"]).get("VW", 1), prm["dtype"])
    cols = 4 if prm["trans_b"] else 2 * vw          # columns of C per work-item
    wg = min(8, dev.facts.max_work_group_size)
    items = -(-common["N"] // cols)
    return kern((-(-items // wg) * wg, nbatch), (wg, 1), a=a.data, a_desc=a.desc(), b=b.data,
                b_desc=b.desc(), c=c.data, c_desc=c.desc(), **common)


# The order of the packed kernel's work-groups (gemm.cl): panels first (a block of
# rows walks every panel: B is re-read per block of WGM * MWI rows) where A is at
# least as large as B and too large to be re-read cheaply, at least a quarter of the
# device's cache (DeviceFacts.cache_size, else PANELS_FIRST_CACHE); else rows first
# (a panel walks every block of rows: A is re-read per panel, from the cache). Wall
# time of the GEMM, AMD EPYC Zen 4, PoCL 3.0 (32 MiB L3), float32: panels first took
# 2048^3 from 155-175 to 190-194 GFLOP/s, 3000^3 from 143-184 to 190-200, a dense
# layer's weight gradient (5000 x 2000 x 1000, A transposed) from 134-159 to 198-202,
# 20000 x 256 x 512 from 104-109 to 171-174; with B the larger (a dense layer's
# forward pass and data gradient, 256 x 20000 x 512) it ran 4-9% slower, and at 512^3
# and 1024^3 up to 20% slower, which the rule leaves rows first.
PANELS_FIRST_CACHE = 32 << 20


def _panels_first(dev, a_bytes, b_bytes):
    """Whether the packed kernel walks the panels first for A and B panels of these
    sizes (one batch, one K slice)."""
    return a_bytes >= b_bytes and 4 * a_bytes >= (dev.facts.cache_size or PANELS_FIRST_CACHE)


def _gemm_packed(dev, dt, prm, params, a, b, c, nbatch, common, geometry):
    """The CPU variant: pack op(A) and op(B) into pool workspace, then multiply."""
    a_batches, b_batches = a.batches, b.batches
    common = dict(common, c=c.data)
    M, N, K = common["M"], common["N"], common["K"]
    mwi, nwi, wgm = params["MWI"], params["NWI"], params["WGM"]
    acc = programs.acc_dtype(dt)

    def panel_bytes(group, kc, nc, mc=M):
        return ((group if a_batches > 1 else 1) * -(-mc // mwi) * mwi +
                (group if b_batches > 1 else 1) * -(-nc // nwi) * nwi) * \
            max(kc, 1) * acc.itemsize

    def fit_group(kc, cap):
        group = nbatch
        while group > 1 and panel_bytes(group, kc, N) > cap:
            group = -(-group // 2)
        return group
    # Slices of K accumulate into C (beta = 1 after the first), which changes the
    # rounding, so whether and how K is sliced comes from the constant PANEL_BYTES
    # and the shape alone, never the budget: a GEMM whose A panel alone is too big.
    # A bias or activation epilogue runs in the last slice's launch, on the whole sum;
    # the slices before it store plain partial sums in C, so only where C holds them
    # in the sums' own precision (float32, float64). A plain GEMM with 16-bit C adds
    # its slices up in a float32 workspace of C's size instead (SPLITK_BYTES at most),
    # and clnn_gemm_splitk applies alpha, beta and the epilogue to the whole sum: C is
    # rounded once. Unsliced, A's panel alone past the workspace left B one panel of
    # columns per launch, A re-read from memory for each: the tutorial's 1000 x 5000 x
    # 10000 forward pass (bias and tanh) took 313 launches and ran at 123 GFLOP/s
    # (float16, before the workspace: 88; 16-bit convolutions still take that path).
    kc = K
    g = fit_group(K, PANEL_BYTES)
    epilogue = prm["act"] != "none" or prm["bias"] != "none"
    half = prm["dtype"] in programs.STORAGE_ONLY
    sums = half and prm["conv"] == "none" and nbatch * M * N * acc.itemsize <= SPLITK_BYTES
    if panel_bytes(g, K, N) > PANEL_BYTES and panel_bytes(g, K, 0) > PANEL_BYTES // 2 \
            and (sums or not half or not epilogue):
        kc = max(1, PANEL_BYTES // panel_bytes(1, 1, N))
    sums = sums and kc < K
    # Groups of batches and blocks of columns leave every sum as it is: those follow
    # the budget (an eighth of it at most), so a small budget takes more launches.
    cap = scratch_cap(dev, PANEL_BYTES)
    group = fit_group(kc, cap)
    # Blocks of rows where A's panels alone would take more than 3/4 of the workspace
    # (a plain GEMM's A; a convolution's loaders index their rows their own way): each
    # block packs B again, but B's panels keep a quarter of the workspace. Without
    # them, A's panels took it all and B went one panel of columns per launch, each
    # re-reading all of A: the tutorial's forward pass in float16 (its K not sliced
    # under the epilogue, above) took 313 launches at 88 GFLOP/s.
    mc = M
    if prm["conv"] == "none" and panel_bytes(group, kc, 0) > cap * 3 // 4:
        blocks = -(-panel_bytes(group, kc, 0) // (cap * 3 // 4))
        rows = -(-M // blocks)
        mc = min(M, -(-rows // mwi) * mwi)
    nc = N
    if panel_bytes(group, kc, N, mc) > cap:
        gb = group if b_batches > 1 else 1
        room = cap - panel_bytes(group, kc, 0, mc)
        nc = min(N, max(nwi, room // (gb * max(kc, 1) * acc.itemsize) // nwi * nwi))
    # Every panel buffer is taken from the pool before the first launch: C is written
    # slice by slice and block by block, and a pool error after the first write would
    # leave it half-written.
    ga_most, gb_most = (group if a_batches > 1 else 1), (group if b_batches > 1 else 1)
    kc_most = max(1, min(kc, K))
    a_pk = dev_scratch(dev, ga_most * -(-mc // mwi) * mwi * kc_most, acc)
    b_pk = dev_scratch(dev, gb_most * -(-nc // nwi) * nwi * kc_most, acc)
    pack_a = programs.get_kernel(dev, "gemm", "clnn_pack_a", prm)
    pack_b = programs.get_kernel(dev, "gemm", "clnn_pack_b", prm)
    ws = dev_scratch(dev, group * M * N, acc) if sums else None
    kern = programs.get_kernel(dev, "gemm", "clnn_gemm_packed", prm)
    # the slices before the last: plain sums, no epilogue (into the float32 workspace:
    # the acc_t kernel, whose C is the workspace, then a pass that applies the epilogue)
    part = kern if kc >= K or not (epilogue or sums) else programs.get_kernel(
        dev, "gemm", "clnn_gemm_packed",
        dict(prm, act="none", bias="none",
             **({"dtype": programs.dtype_name(acc)} if sums else {})))
    if sums:
        kern = part
        finish = programs.get_kernel(dev, "gemm", "clnn_gemm_splitk", prm)
    pack_wg = min(8, dev.facts.max_work_group_size)  # 8 measured best for conv packing on PoCL
    wg = min(wgm, dev.facts.max_work_group_size)
    evt = None
    for g0 in range(0, nbatch, group):
        gn = min(group, nbatch - g0)
        ga, gb = (gn if a_batches > 1 else 1), (gn if b_batches > 1 else 1)
        # this group's first batch of each operand
        a_off = a.off + (g0 * a.bstride if a_batches > 1 else 0)
        b_desc = b._replace(off=b.off + (g0 * b.bstride if b_batches > 1 else 0)).desc()
        c_off = c.off + g0 * c.bstride
        for k0 in range(0, max(K, 1), max(kc, 1)):
            kn = min(kc, K - k0)
            kpad = -(-max(kn, 1) // pack_wg) * pack_wg
            for m0 in range(0, M, mc):
                # rows m0.. of op(A), C and a bias by rows, as matrices of their own
                mn = min(mc, M - m0)
                Mbb = -(-mn // mwi)
                a_desc = a._replace(off=a_off + (m0 if prm["trans_a"] else m0 * a.ld)).desc()
                block = dict(common, M=mn, K=kn, c_desc=c._replace(off=c_off + m0 * c.ld).desc(),
                             beta=common["beta"] if k0 == 0 else 1.0,
                             bias_off=common["bias_off"] + (m0 if prm["bias"] == "row" else 0))
                if sums:
                    block.update(c=ws, c_desc=int4(m0 * N, N, M * N), alpha=1.0,
                                 beta=0.0 if k0 == 0 else 1.0, bias=ws, bias_off=0)
                if kn:
                    pack_a((kpad, Mbb, ga), (pack_wg, 1, 1), M=mn, K=kn, Mb=Mbb, k0=k0,
                           a=a.data, a_desc=a_desc, a_pk=a_pk, **geometry)
                for n0 in range(0, N, nc):
                    Nb = -(-min(nc, N - n0) // nwi)
                    if kn:
                        pack_b((kpad, Nb, gb), (pack_wg, 1, 1), N=N, K=kn, Nb=Nb, k0=k0,
                               n_base=n0, b=b.data, b_desc=b_desc, b_pk=b_pk, **geometry)
                    evt = _multiply(dev, kern if k0 + kn >= K else part, params, acc, wg,
                                    Mbb, Nb, gn,
                                    Mbb * mwi * kn if ga > 1 else 0,
                                    Nb * nwi * kn if gb > 1 else 0, a_pk, b_pk, n0,
                                    dict(block, **geometry))
        if sums:
            # a work-item per HVW columns where that is 2, 4 or 8 (the kernel's CPU
            # form), else per column; work-groups of 8
            vw = programs.helper_width(dict(prm["tuning"])["VW"], dt)
            vw = vw if vw in (2, 4, 8) else 1
            wg_n, nv = min(8, dev.facts.max_work_group_size), -(-N // vw)
            evt = finish((-(-nv // wg_n) * wg_n, M, gn), (wg_n, 1, 1), M=M, N=N, splits=1,
                         alpha=common["alpha"], beta=common["beta"], act_p=common["act_p"],
                         act_q=common["act_q"], ws=ws, bias=common["bias"],
                         bias_off=common["bias_off"], c=c.data,
                         c_desc=c._replace(off=c_off).desc())
    return evt


def _multiply(dev, kern, params, acc, wg, Mb, Nb, nbatch, a_bstride, b_bstride, a_pk,
              b_pk, n_base, args):
    """One launch of clnn_gemm_packed over Mb x Nb panels of K (args["K"]) elements of
    dtype ``acc``, a batch's panels ``a_bstride`` and ``b_bstride`` elements after the
    one before (0: one for every batch)."""
    isz = acc.itemsize
    first = params.get("PANELS_FIRST", _panels_first(
        dev, Mb * params["MWI"] * args["K"] * isz, Nb * params["NWI"] * args["K"] * isz))
    return kern((-(-Mb // wg) * wg * Nb, 1, nbatch), (wg, 1, 1), Mb=Mb, Nb=Nb,
                a_bstride=a_bstride, b_bstride=b_bstride, a_pk=a_pk, b_pk=b_pk,
                n_base=n_base, panels_first=int(first), **args)


def panel_widths(rows):
    """(MWI, NWI) of the packed CPU GEMM's A and B panels for parameter rows (run_gemm's
    ``rows``), or None where those rows take another variant: a caller that writes its
    operands as panels itself (Winograd's transforms) multiplies them with
    run_panels."""
    p = rows[0]
    if p["variant"] != "reg":
        return None
    return p["MWI"], p["NWI"]


def run_panels(dev, dt, rows, *, M, N, K, nbatch, a_pk, b_pk, a_bstride, b_bstride, c,
               beta=0.0):
    """C[b] (M x N, Operand c) = A[b] @ B[b] + beta C[b] for b < nbatch, whose operands
    are already in the packed kernel's panels (clnn_pack_a's and clnn_pack_b's
    layouts, of panel_widths): batch b's A panels from a_pk + b a_bstride, its B
    panels from b_pk + b b_bstride (multiples of the vector width); a last panel's
    rows or columns past M or N may hold anything (C never receives what they give).
    The caller holds both buffers; no workspace."""
    p = rows[0]
    prm = {"dtype": programs.dtype_name(dt), "variant": "reg", "trans_a": False,
           "trans_b": False, "act": "none", "bias": "none", "conv": "none",
           "tuning": tuning.template_tuning(p, dt)}
    kern = programs.get_kernel(dev, "gemm", "clnn_gemm_packed", prm)
    Mb, Nb = -(-M // p["MWI"]), -(-N // p["NWI"])
    args = dict(M=M, N=N, K=K, alpha=1.0, beta=beta, act_p=0.0, act_q=0.0, bias=c.data,
                bias_off=0, c=c.data, c_desc=c.desc())
    return _multiply(dev, kern, p, programs.acc_dtype(dt),
                     min(p["WGM"], dev.facts.max_work_group_size), Mb, Nb, nbatch,
                     a_bstride, b_bstride, a_pk, b_pk, 0, args)


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
    alpha, beta = finite(alpha, "alpha", dt), finite(beta, "beta", dt)
    if y is None:
        if beta != 0:
            raise ArgumentError("beta != 0 reads y: pass the y array")
        y = dev_empty(dev, (M,), dt)
    else:
        check(y, "y", dev, dtype=dt, shape=(M,))
        for other, n in ((a, "a"), (x, "x")):
            if overlaps(y, other):
                raise ShapeError(f"y overlaps {n}")
    if M == 0:
        return y
    if on_work_groups(dev):
        # GPUs: a deterministic work-group reduction (reduce.cl) over the rows of A, or
        # down its columns for A^T x (the bias gradient of a dense layer, summed over
        # the batch): one work-item per output would leave most of the device idle
        # (the tutorial's 10000-row batch: 0.8 ms a bias gradient, 0.05 ms now)
        shape3, strides = ((1, K, M), (0, A.ld)) if trans_a else ((M, K, 1), (A.ld, 1))
        return reduce3(dev, dt, a, shape3, y, map="xv", final="axpby", post=alpha, y=x,
                       strides=strides, beta=beta, wg=True)
    if trans_a and dev.facts.is_cpu and M * K >= 1 << 20:
        # Measured on PoCL: for op(A) = A^T on big matrices the GEMM path with N = 1
        # beats the one-row-per-work-item kernel, whose rows are strided there (27 ms
        # against 48 ms at 5000x2000); without the transpose the kernel wins (8 ms
        # against 20 ms), and so it does for small matrices, where the GEMM's three
        # launches cost more than they save (a dense layer's bias gradient, 64 x 256:
        # MNIST epochs of 0.44 s against 0.51 s).
        gemm(a, x.reshape(K, 1), out=y.reshape(M, 1), alpha=alpha, beta=beta, trans_a=True)
        return y
    # (the CPU variant's program, whose tiles are as wide in bytes for every dtype)
    kern = programs.get_kernel(dev, "gemm", "clnn_gemv", {
        "dtype": programs.dtype_name(dt), "trans_a": bool(trans_a),
        "tuning": tuning.template_tuning(tuning.GEMM_TABLE["type"]["CPU"], dt)})
    wg = min(64, dev.facts.max_work_group_size)
    groups = max(1, min(-(-M // wg), dev.facts.compute_units * 64))
    evt = kern((groups * wg,), (wg,), M=M, K=K, alpha=alpha, beta=beta, a=a,
               a_desc=A.operand(a).desc(), x=x, x_off=x.offset // dt.itemsize, y=y,
               y_off=y.offset // dt.itemsize)
    return done(y, evt)
