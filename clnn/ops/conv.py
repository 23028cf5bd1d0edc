"""2-D convolution as implicit GEMM: forward, data gradient, weight gradient.

    x (N, C, H, W)   w (M, C, R, S)   b (M,)   y (N, M, P, Q)
    P = (H + 2 * pad_h - R) // stride_h + 1,   Q likewise

The unrolled (im2col) matrix is never stored: a loader computes where each of its
elements lives in the input while the GEMM reads it. Two kernels do this:

- On CPUs, conv.cl's gathered kernel (tuning variant "gather"): rows of C are output
  positions (or, for the weight gradient, filter taps) loaded straight from the input
  into registers, columns are channels in vectors from a small packed operand:

    forward:          y^T (NPQ x M)   = unroll(x)^T (NPQ x CRS) @ w^T (CRS x M)  (+ b, act)
    weight gradient:  dw^T (CRS x M)  = unroll(x) (CRS x NPQ) @ dy^T (NPQ x M)
    data gradient:    dcol (NPQ x CRS) = dy^T (NPQ x M) @ w (M x CRS), then col2im
                      gathers each dx element's entries; or, at unit stride when the
                      input is hardly bigger than the output ("flip"), a forward pass
                      over dy padded by R - 1 - ph with the filters flipped.

  A forward pass (the flipped one included) at unit column stride over an input with
  no padding left to check may take convpx.cl's "pixel rows" instead: the same
  product with a work-item's vectors along an output row, so each channel's outputs
  leave as whole vectors (_pixel_tile says when that is cheaper); a weight gradient
  with few filter rows over output rows of whole vectors takes convwr.cl's pixel rows
  (_wgrad_rows), which sum dy and the input in place, without packing. A 3x3 layer
  at unit stride between many channels takes winograd.cl's F(4x4, 3x3) instead, for its
  forward pass and both gradients: 36 batched GEMMs between transforms of the input
  (or dy), the filters and the output, with 4x fewer multiply-adds (_winograd).

- Elsewhere (and when a GEMM parameter set is forced), gemm.cl with its ``conv``
  loaders, which share the GEMM's tiles:

    forward:          y (M x NPQ)    = w (M x CRS) @ unroll(x) (CRS x NPQ)   (+ b, act)
    data gradient:    dx (C x NHW)   = w^T gathered (C x MRS) @ dy gathered (MRS x NHW)
    weight gradient:  dw (M x CRS)   = dy (M x NPQ) @ unroll(x)^T (NPQ x CRS)

  except for layers with few filters (TILE_DIRECT_MAXM), whose forward pass (and data
  gradient at unit stride into few channels) convt.cl sums directly from input
  patches in local memory (tile_direct_op), on the matrix engines where the rows are
  engine rows (TILE_DIRECT_ENGINES), and whose weight gradient convw.cl sums from
  whole images in local memory, a work-group's partial sums added in group order by
  a second launch (wgrad_direct, WGRAD_DIRECT).

Every output element is summed by one work-item in a fixed order: no atomics, bitwise
reproducible results.
"""

import numpy as np
import pyopencl.cltypes as cltypes

from .. import programs, tuning
from ..device import device_of
from ..errors import ArgumentError, ShapeError
from ._args import (INT_MAX, check, check_out, common_device, dev_scratch, done, finite,
                    int4, launch, launch_size, offset, pair, scratch_cap)
from ._memo import memoized
from .bias import bias_grad
from .elementwise import ACTIVATIONS, activation_parameter, axpy, copy
from .gemm import Operand, panel_widths, run_gemm, run_panels, tiled_workspace
from .reduce import reduce3

programs.register("convd", {"act": "none", "wg": 64},
                  lambda: [{"act": a, "wg": wg} for a in ("none",) + ACTIVATIONS
                           for wg in (64, 256)])

_TILES = ((("MWI", 10), ("NWI", 16), ("VW", 8)), (("MWI", 5), ("NWI", 8), ("VW", 8)),
          (("MWI", 4), ("NWI", 24), ("VW", 8)))
# and a 512-bit one (CPUs whose code has them), for the gates
_WIDE_TILE = (("MWI", 6), ("NWI", 64), ("VW", 16))


programs.register("winograd", {"m": 4, "act": "none", "bias": "none", "dyv": 1,
                                "x_acc": False},
                  lambda: [{"m": m, "act": a, "bias": b, "dyv": 1} for m in (2, 4)
                           for a in ("none",) + ACTIVATIONS for b in ("none", "row")] +
                  # every panel width the weight gradient may ask dy's transform for
                  # (2 to a CPU vector's lanes: the tuner's rows go to MWI 8)
                  [{"m": m, "act": "none", "bias": "none", "dyv": v} for m in (2, 4)
                   for v in range(2, programs.CPU_LANES["float"] + 1)] +
                  # clnn_wino_input on a float copy of a float16 input (WINO_X_COPY)
                  [{"m": m, "act": "none", "bias": "none", "dyv": 1, "x_acc": True}
                   for m in (2, 4)])

PX_WG = 4           # work-items per work-group of clnn_conv_pixels
PACK_RUN = 8        # consecutive k per work-item of clnn_conv_pack


def _helper(dt, **params):
    """conv.cl's parameters for its helper kernels (padding, col2im): the default tiles,
    as the gathered kernel's are, as wide in bytes for every dtype."""
    return programs.variant_for(dict(params, tuning=_TILES[0]), programs.dtype_name(dt))


programs.register(
    "conv", {"padded": False, "line": False, "vstore": False, "act": "none", "bias": "none",
             "x_acc": False, "tuning": _TILES[0]},
    lambda: [dict(e, padded=p, line=ln, tuning=t) for t in _TILES + (_WIDE_TILE,)
             for p in (False, True)
             for ln in (False, True)
             for e in ({"act": "none", "bias": "none", "vstore": False},
                       {"act": "relu", "bias": "col", "vstore": False},
                       {"act": "none", "bias": "none", "vstore": True})]
    + [{"padded": False, "line": ln, "vstore": False, "act": "relu", "bias": "col",
        "x_acc": True, "tuning": _TILES[1]} for ln in (False, True)])

# (MB, QV, VW) of convpx.cl's pixel rows: MB output channels by QV vectors of VW
# positions per work-item. The gate renders these; _pixel_tile picks MB.
_PX_TILES = ((("MB", 6), ("QV", 2), ("VW", 8)), (("MB", 4), ("QV", 2), ("VW", 8)),
             (("MB", 3), ("QV", 1), ("VW", 4)), (("MB", 6), ("QV", 2), ("VW", 16)))
programs.register(
    "convpx", {"act": "none", "bias": "none", "x_acc": False, "tuning": _PX_TILES[0]},
    lambda: [dict(e, tuning=t) for t in _PX_TILES
             for e in ({"act": "none", "bias": "none"}, {"act": "relu", "bias": "row"},
                       {"act": "tanh", "bias": "row", "x_acc": True})])

# A work-item's tile lives in vector registers: MWI * NVW accumulators, the NVW B
# vectors of one k and the broadcast A value. REGS (CONV_TABLE) is how many the
# device's kernels get: 16 on AVX2 targets (PoCL builds AVX2 code on an AMD Zen 4,
# as on a Zen 3), 32 where PoCL targets AVX-512 (32 ymm registers with AVX-512VL). A
# tile past the budget spills its accumulators to the stack on every k: on the Zen 4,
# 5 x 32 tiles (20 accumulators) ran the 56x56x64 and 14x14x256 layers at 85-105
# GFLOP/s, 6 x 16 and 4 x 24 tiles at 165-200. With 32 registers, 16, 20 and 24
# accumulators measured well (MWI at most 16, 10, 8 and 6 for 1-4 B vectors).
_MOST_ROWS = {1: 16, 2: 10, 3: 8, 4: 6}
DEFAULT_REGS = 16


def _most_rows(nvw, regs):
    """The most rows a work-item with ``nvw`` B vectors per k keeps within ``regs``."""
    return min(_MOST_ROWS[nvw], (regs - 1 - nvw) // nvw)


# what the line layout's one pointer saves over rows at offsets of their own, in
# loads per multiply-add (the flat layout must win by more to be chosen)
LINE_GAIN = 1.05
FLAT_MIN_K = 64


def _load_cost(nvw, mwi):
    """Loads per vector multiply-add of an MWI x NVW tile: NVW of B and MWI of A per k
    feed MWI * NVW multiply-adds."""
    return 1.0 / nvw + 1.0 / mwi


# A row's 512-bit vectors (VW 16: CPUs whose code has them) serve products of at least
# this many columns; narrower ones take 256-bit vectors. Forward + both gradients,
# batch 8-64, Xeon with AVX-512 code, ms, 256-bit -> 512-bit tiles: 3x3 stride 2, 128
# filters, 22.7/36.4/27.3 -> 15.2/25.4/25.4; 1x1 stride 2, 512 filters, 53.8/52.4/77.8 ->
# 47.4/42.0/61.1; the 7x7 stem's data gradient (147 columns) 20 -> 17.7; but over 64
# filters or fewer the stem's forward pass 11.3 -> 12.3-12.8 and CIFAR's and LeNet C1's
# weight gradients (32 and 6 columns) 8.7 -> 9.2-10.0 and 0.78 -> 1.05 (their panels are
# one or two vectors of 16, and the flat rows' block stays 8 rows).
WIDE_COLS = 128


def _tiles(p, dt, cols, line_len, k=0, vectors=4):
    """(MWI, NWI, VW, line) of the gathered kernel for ``cols`` columns of C.

    NWI is NVW vectors (at most ``vectors``, at most four), NVW the one whose tile of
    the most rows that fit the registers (REGS) costs least over the padded columns:
    loads per multiply-add times the columns the panels cover, times the panels'
    columns over the useful ones again (counted once, the padding let 4 x 24 tiles
    win on 64 and 128 filters, where 6 x 16 ran 5-8% faster on the Zen 4: 56x56x64's
    forward pass and data gradient, 3x3 stride 2, dilated; at 256 and 512 filters,
    3% padding, 4 x 24 stays). It depends on the columns only (callers size the
    packed B from it). With lines of ``line_len`` >= 6 consecutive
    rows (a unit step along the last row index) the "line" layout addresses a
    work-item's rows from one pointer; MWI is then the one that covers a line with
    the least cost per useful row (the rows past the line's end cost like the
    others), unless rows at offsets of their own cost less (LINE_GAIN) over a sum of
    ``k`` >= FLAT_MIN_K terms. Shorter lines (a 3x3 weight gradient's rows are lines
    of 3 taps) leave too few rows per work-item: there each row keeps its own offset
    (1.6x faster on the 56x56x64 layer's weight gradient).
    A row's 512-bit vectors serve WIDE_COLS columns and more (VW then is the vector
    width, in acc_t lanes, the kernel is built with).
    A parameter set may fix MWI, NWI and LINE instead (the tuner, tests).
    """
    vw = programs.vector_width(p["VW"], dt)
    if cols < WIDE_COLS and not p.get("NWI"):
        vw = programs.helper_width(vw, dt)
    regs = p.get("REGS", DEFAULT_REGS)
    if p.get("NWI"):
        nwi = p["NWI"]
    else:
        need = -(-cols // vw)
        fits = [n for n in range(1, min(4, vectors, need) + 1)
                if n == 1 or _most_rows(n, regs) >= 3]
        nwi = vw * min(fits, key=lambda n: ((-(-need // n) * n) ** 2 / need * _load_cost(
            n, max(1, _most_rows(n, regs))), n))
    nvw = nwi // vw
    most = max(1, _most_rows(nvw, regs)) if nvw in _MOST_ROWS else max(1, 24 // nvw)
    if "MWI" in p:
        mwi = p["MWI"]
        line = p.get("LINE", True) and line_len >= mwi
    elif line_len >= 6:
        mwi = min(range(min(3, most), min(most, line_len) + 1),
                  key=lambda m: (-(-line_len // m) * m / line_len * _load_cost(nvw, m), -m))
        line = True
        # a line that MWI does not divide computes rows twice; rows at offsets of their
        # own compute each once, but find their offsets first (on PoCL, lines of 14 in
        # blocks of 4, 16 rows for 14: flat 5-9% faster on the 14x14 and 7x7 layers'
        # forward passes and data gradients, and on the 28x28 stride-2 one's, k 256 to
        # 4608; LeNet C1's dcol, k = 6, 1.6x slower)
        flat = min(8, most)
        waste = -(-line_len // mwi) * mwi / line_len
        if k >= FLAT_MIN_K and \
                waste * _load_cost(nvw, mwi) > LINE_GAIN * _load_cost(nvw, flat):
            mwi, line = flat, False
    else:
        mwi, line = min(8, most), False
    return mwi, nwi, vw, line


# The order of the gathered kernel's work-items. Panels first: work-items that share
# rows walk the panels, so the input they gather is read from memory once, and the
# packed B is re-read per row block. Rows first: work-items that share a panel walk
# the rows, so the panel stays in cache and the input is re-read per panel. Panels
# come first unless B is larger than both this many bytes (a core's L2 here) and a
# quarter of the input: forward passes' B is the filters (a hundredth of the input
# down to a third, 1.8x on the 7x7x512 layer), a weight gradient's is dy (transposed)
# at every output position of a group of images (about as large as the input).
# Measured on an AMD EPYC Zen 4 (1 MiB of L2 per core), PoCL 3.0, batch 32, kernel
# times: panels first took strided forward passes from 43 to 25 ms (3x3, stride 2,
# 64 to 128 channels at 56x56), from 90 to 50 ms (1x1, stride 2, 256 to 512) and from
# 155 to 51 ms (1x1, stride 2, 512 to 1024: B 2.1 MiB, the input 205 MB), the ResNet
# stem's data gradient from 39-43 to 36 ms and 1x1 data gradients 10% faster; other
# forward passes ran alike in either order (the 14x14x256 and 7x7x512 layers, which
# the rule leaves rows first, too); weight gradients were 1.3-1.6x slower with panels
# first.
PANELS_FIRST_BYTES = 1 << 20

# The most B vectors per k of a weight gradient's tiles. Its B, dy transposed at every
# output position of a group of images, is megabytes per panel, re-read from the
# last-level cache by each row block (rows first, above): a tile with fewer B vectors
# and as many rows or more (6 x 16 against 4 x 24, or 4 x 16 where lines of 7 taps
# cap the rows) read it faster than the loads-per-multiply-add count says. Measured
# on an AMD EPYC Zen 4 (AVX2, 16 registers), PoCL 3.0, kernel times, 4 x 24 -> the
# two-vector tile: the ResNet stem 16.6 -> 12.6 ms, 56x56x64 3x3 41 -> 36.5,
# 14x14x256 36.4 -> 34.6, 28x28x64 dilated 5.2 -> 4.6, 3x3 stride 2 24.3 -> 22.6, the
# 1x1 stride-2 projection alike; one vector (8 rows at offsets of their own) was
# 1.4x slower on the 3x3 layers, three or four slower everywhere.
WGRAD_VECTORS = 2

# Where a row holds 512-bit vectors (VW 16: CPUs whose code has them) and a panel of
# the weight gradient's B at that width is at least WGRAD_STREAM_BYTES, the panel
# streams from memory once per row block: the tile takes the whole vectors and the
# most rows per work-item, WGRAD_ROWS for one or two vectors of columns (one where
# two would leave fewer than two work-items a compute unit), rows at offsets of their
# own. Columns that one 256-bit vector holds keep _tiles' tile (LeNet C1's 6 filters:
# 0.53 ms, 0.66 in a 512-bit vector). Measured on the 2-core Intel Xeon (AVX-512, 32
# registers), PoCL 3.0, float32, kernel times, medians of 5 alternating runs in one
# process, the tile _tiles picks -> this one: the ResNet stem (64 filters, 147 taps)
# 15.2 -> 10.6 ms (7 x 16 in 256-bit vectors before), 3x3 stride 2 (128 filters)
# 23.8 -> 20.9 (8 x 32), CIFAR's 32-channel layer 8.3 -> 7.6 (8 x 16), its 3-channel
# input layer 1.50 -> 1.32 (one vector: its 27 taps make 3 work-items of two, 1.58),
# the 1x1 stride-2 projection 62.9 -> 58.4 (8 x 32; 12 rows 53.2, but 7-20% slower
# than 10 on the others). Panels that stay in the cache keep _tiles' choice: LeNet
# C3's (400 KB) ran alike, C5's (4 KB, k = 64) 2x slower with 512-bit tiles.
WGRAD_STREAM_BYTES = 1 << 19
WGRAD_ROWS = {1: 14, 2: 10}


def _wgrad_tile(p, dt, cols, rows, k, compute_units):
    """(MWI, NWI, VW, line) of a weight gradient's gathered kernel over ``rows`` taps,
    ``cols`` filters and sums of ``k`` terms when its B panels stream (see
    WGRAD_STREAM_BYTES), else None (_tiles decides). A parameter set that fixes the
    tile decides instead."""
    if p.get("NWI") or "MWI" in p:
        return None
    vw = programs.vector_width(p["VW"], dt)
    if vw <= programs.helper_width(vw, dt) or cols <= programs.helper_width(vw, dt) or \
            k * vw * programs.acc_dtype(dt).itemsize < WGRAD_STREAM_BYTES:
        return None
    nvw = min(WGRAD_VECTORS, -(-cols // vw))
    if nvw > 1 and -(-rows // WGRAD_ROWS[nvw]) * -(-cols // (nvw * vw)) < 2 * compute_units:
        nvw = 1
    mwi = min(WGRAD_ROWS[nvw], _most_rows(nvw, p.get("REGS", DEFAULT_REGS)))
    return mwi, nvw * vw, vw, False


# A weight gradient's images in groups whose panel of dy^T (one panel of its tile's
# columns at every output position of the group) is at most half a core's L2
# (DeviceFacts.l2_size, a CPU's), where the tile has at least WGRAD_L2_BLOCKS row
# blocks to read it again and one image's panel fits: each row block then reads the
# panel from L2 instead of memory, at the cost of a pack and a launch per group.
# Measured on the 2-core Intel Xeon (2 MiB of L2 a core), PoCL 3.0, float32, kernel
# times, images per group (ms): the 1x1 stride-2 projection (panels of 100 KB an
# image) 20: 61.3 (SCRATCH_BYTES' group), 10: 50.8, 5: 41.8-44.0, 3: 43.6; 3x3
# stride 2 (100 KB) 32: 24.1, 8: 17.5, 5: 18.9; CIFAR's 32-channel layer (128 KB) 64:
# 8.45, 12: 7.0, 8: 6.4, 5: 8.2 (more launches); not its 3-channel input layer (2
# row blocks: 16 images 1.75 against 64's 1.55) nor the stem (1.6 MB an image: 12.1
# in groups of one against 8's 11.6). float64 alike (3x3 stride 2: 62.5 -> 45.8 ms).
# Not 16-bit weights: each group after the first adds its sum into dw, which rounds
# to the 16-bit format every time (float16: 2 -> 8 groups moved CIFAR's dw by 5e-4).
WGRAD_L2_BLOCKS = 8


def _l2_group(dev, dt, group, panel_elems, blocks):
    """The images per group of a weight gradient whose panels hold ``panel_elems``
    acc_t elements an image and whose tile has ``blocks`` row blocks: ``group``, or
    fewer where they stay in half of L2 then (see WGRAD_L2_BLOCKS)."""
    half = dev.facts.l2_size // 2
    acc = programs.acc_dtype(dt)
    panel = panel_elems * acc.itemsize
    if not half or acc != np.dtype(dt) or blocks < WGRAD_L2_BLOCKS or panel > half:
        return group
    return min(group, max(1, half // panel))


def _panels_first(dt, b_elems, x_elems):
    """Whether the gathered kernel's work-items walk the panels first: the packed B
    (``b_elems``) against the input its rows gather (``x_elems``: image and channel
    planes, the rows' first part by k's), both in elements of acc_t."""
    return b_elems <= max(PANELS_FIRST_BYTES // programs.acc_dtype(dt).itemsize,
                          x_elems // 4)


# What an output costs the two CPU kernels, in units of one k step of it (measured on
# an AMD EPYC Zen 4, PoCL 3.0, float32, 14 layers from 3 to 64 channels at 16x16 to
# 64x64): the gathered kernel stores a position's channels P Q elements apart, about
# 39 k steps an output, and 87 more when that distance is a multiple of 4 KiB (a
# 32x32 float32 plane: every store of a work-item falls in one cache set); the pixel
# rows store whole vectors (8) but their k steps cost 1.08 of the gathered kernel's
# (more input vectors loaded per panel of channels). Their crossing on the 56x56x64
# layer is near k = 300; on 3-channel input layers pixel rows are 1.3-3.6x faster.
GATHER_STORE, GATHER_ALIASED, PX_STORE, PX_PER_K = 39, 87, 8, 1.08
# the channels per pixel-row work-item (MB) to choose from: the least loads per
# multiply-add over the padded channels, then the fewest padded channels, then the
# most channels, within the registers (MB * QV accumulators, QV input vectors and
# one broadcast filter value); on the 16x16x64 layer MB 4 took twice as long as MB 6,
# on 16 and 32 channels MB 4 and 6 ran alike (and MB 4 pads none)
_PX_PANELS = (12, 8, 6, 4)


def _pixel_tile(p, dt, cols, rows3, row_steps, out_steps, K, *, padded, vstore):
    """(MB, QV, VW) when convpx.cl's pixel rows should compute this gathered GEMM, else
    None: only a forward pass whose rows run along contiguous output rows (out_steps[2]
    == 1) and read the input at unit column stride (row_steps[2] == 1) with no padding
    to check, and rows (rows3[2]) at least one work-item's QW positions long (a weight
    gradient's rows, filter taps, are lines of S: shorter, unless QV and VW are set
    small); then whichever kernel's cost model (GATHER_STORE ...) says is cheaper,
    padded tiles included. A parameter set may decide instead (PIXELS True or False, and QV, MB,
    VW: the tests)."""
    if vstore or padded or row_steps[2] != 1 or out_steps[2] != 1 or \
            p.get("PIXELS") is False:
        return None
    vw = programs.vector_width(p["VW"], dt)
    qv = p.get("QV", 2)
    Q = rows3[2]
    if Q < qv * vw and "QV" not in p:
        # a row's 512-bit vectors serve rows of two of them or more (32x32 planes:
        # CIFAR's 3- and 32-channel forward passes 1.5x and 1.35x); shorter rows take
        # 256-bit ones (LeNet C1's rows of 28 in one 512-bit vector: 0.17 -> 0.22 ms)
        vw = programs.helper_width(vw, dt)
    if Q < qv * vw or vw not in (2, 4, 8, 16):
        return None
    regs = p.get("REGS", DEFAULT_REGS)
    mb = p.get("MB") or min((b for b in _PX_PANELS if b * qv + qv + 1 <= regs),
                            key=lambda b: (-(-cols // b) * b * _load_cost(b, qv),
                                           -(-cols // b) * b, -b))
    tile = (mb, qv, vw)
    if p.get("PIXELS"):
        return tile
    mwi, nwi, _, line = _tiles(p, dt, cols, Q, K)
    waste_px = -(-Q // (qv * vw)) * qv * vw / Q * (-(-cols // mb) * mb / cols)
    waste = -(-cols // nwi) * nwi / cols * (-(-Q // mwi) * mwi / Q if line else 1.0)
    aliased = out_steps[3] * np.dtype(dt).itemsize % 4096 == 0
    gather = waste * (GATHER_STORE + GATHER_ALIASED * aliased + K)
    return tile if waste_px * (PX_STORE + PX_PER_K * K) < gather else None


def _run_gather(dev, dt, p, *, x, x_off, H, W, ph, pw, rows3, row_steps, k3, k_steps,
                cols, src, src_off, CS, KD, KS, flip, out, out_steps, alpha=1.0,
                beta=0.0, act="none", act_p=(0.0, 0.0), bias=None, vstore=False, nwi=None,
                zero_rows=None, scratch=None, pixels="auto", vectors=4, tile=None):
    """One gathered GEMM (conv.cl): pack B, then the kernel. See conv.cl for the
    meaning of the row, k and output steps; ``zero_rows`` (top, bottom) counts the
    all-zero border rows of a padded copy, which the kernel skips. ``scratch``: the
    buffers from _gather_scratch for at least this K, when a caller that launches
    several times must hold them all before its first write (wide enough for either
    kernel's panels). Pixel rows (convpx.cl) instead where _pixel_tile picks them
    (``pixels``: "auto", or a tile or None decided by the caller). ``vectors``: the
    most B vectors per k (_tiles); ``tile``: (MWI, NWI, VW, line) decided by the
    caller instead (_wgrad_tile)."""
    K = k3[0] * k3[1] * k3[2]
    if pixels == "auto":
        pixels = _pixel_tile(p, dt, cols, rows3, row_steps, out_steps, K,
                             padded=bool(ph or pw), vstore=vstore)
    if pixels:
        return _run_pixels(dev, dt, pixels, x=x, x_off=x_off, H=H, W=W, rows3=rows3,
                           row_steps=row_steps, k3=k3, k_steps=k_steps, cols=cols, src=src,
                           src_off=src_off, CS=CS, KD=KD, KS=KS, flip=flip, out=out,
                           out_steps=out_steps, alpha=alpha, beta=beta, act=act,
                           act_p=act_p, bias=bias, zero_rows=zero_rows, scratch=scratch)
    mwi, nwi_auto, vw, line = tile or _tiles(p, dt, cols,
                                             rows3[2] if row_steps[2] == 1 else 0, K,
                                             vectors)
    nwi = nwi or nwi_auto
    rows = rows3[0] * rows3[1] * rows3[2]
    Nb = -(-cols // nwi)
    prm = {"dtype": programs.dtype_name(dt), "padded": bool(ph or pw), "act": act, "line": line,
           "vstore": vstore, "x_acc": isinstance(x, _Converted),
           "bias": "col" if bias is not None else "none",
           "tuning": (("MWI", mwi), ("NWI", nwi), ("VW", vw))}
    b_pk, koff, k_split, k_step = _pack(dev, "conv", prm, dt, scratch, nwi, cols=cols, K=K,
                                        k3=k3, k_steps=k_steps, src=src, src_off=src_off,
                                        src_steps=(CS, KD, KS, flip), W=W)
    kern = programs.get_kernel(dev, "conv", "clnn_conv_gather", prm)
    Rb = rows // rows3[2] * -(-rows3[2] // mwi) if line else -(-rows // mwi)
    # work-groups of WG, fewer when that would leave compute units idle (a weight
    # gradient has a few long rows: LeNet C1's 25 taps make 4 work-items)
    wg = max(1, min(p["WG"], dev.facts.max_work_group_size,
                    Rb * Nb // (2 * dev.facts.compute_units)))
    panels_first = p.get("PANELS_FIRST", _panels_first(dt, K * Nb * nwi,
                                                       rows3[0] * k3[0] * H * W))
    if not panels_first:
        # whole work-groups per panel, as a 2-D grid would have them (on a weight
        # gradient's few row blocks, groups that straddle panels balanced the two
        # cores worse: CIFAR's 3-channel layer 20% slower)
        Rb = -(-Rb // wg) * wg
    return kern((-(-(Rb * Nb) // wg) * wg,), (wg,), x_geom=int4(H, W, ph, pw), Rb=Rb,
                panels_first=int(panels_first),
                **_kernel_args(rows3, row_steps, k_split, k_step, x, x_off, H, zero_rows,
                               cols, b_pk, koff, out, out_steps, alpha, beta, act_p, bias))


def _run_pixels(dev, dt, tile, *, x, x_off, H, W, rows3, row_steps, k3, k_steps, cols,
                src, src_off, CS, KD, KS, flip, out, out_steps, alpha, beta, act, act_p,
                bias, zero_rows, scratch):
    """_run_gather's GEMM as pixel rows (convpx.cl, ``tile`` from _pixel_tile): the
    filters packed in panels of MB channels, then one work-item per QW positions of an
    output row and panel."""
    mb, qv, vw = tile
    K = k3[0] * k3[1] * k3[2]
    prm = {"dtype": programs.dtype_name(dt), "act": act, "x_acc": isinstance(x, _Converted),
           "bias": "row" if bias is not None else "none",
           "tuning": (("MB", mb), ("QV", qv), ("VW", vw))}
    b_pk, koff, k_split, k_step = _pack(dev, "convpx", prm, dt, scratch, mb, cols=cols,
                                        K=K, k3=k3, k_steps=k_steps, src=src,
                                        src_off=src_off, src_steps=(CS, KD, KS, flip), W=W)
    kern = programs.get_kernel(dev, "convpx", "clnn_conv_pixels", prm)
    items = rows3[0] * rows3[1] * -(-rows3[2] // (qv * vw)) * -(-cols // mb)
    wg = max(1, min(PX_WG, dev.facts.max_work_group_size,
                    items // (2 * dev.facts.compute_units)))
    return kern((-(-items // wg) * wg,), (wg,), W=W,
                **_kernel_args(rows3, row_steps, k_split, k_step, x, x_off, H, zero_rows,
                               cols, b_pk, koff, out, out_steps, alpha, beta, act_p, bias))


# Weight gradients as pixel rows (convwr.cl): a work-item's vectors along output rows,
# its MB filters by S taps of one filter row summed in registers over a slice of the
# images. The gathered kernel holds filters in its vectors (LeNet C1's 6 in vectors of
# 16) and packs dy^T first; this one packs nothing and reads dy once per filter row (c,
# r) and the input once per panel of MB filters. Slices of the output rows (n, p) give
# every core WROWS_ITEMS work-items or more, each slice's input and dy rows within half
# of L2 (VGG's input layer 11.2 -> 9.2-10.3 ms against slices of whole images); with
# more than one slice, their partial sums go to a workspace that a second launch
# (reduce3) adds in slice order. Taken where a filter's rows are few (C R at most
# WROWS_MAX_CR) and the output rows fill the device's whole vectors (at least
# WROWS_MIN_LANES of their lanes). Measured on the 2-core Intel Xeon (AVX-512), PoCL
# 3.0, float32, kernel times, gathered / pixel rows, us: LeNet C1 at batch 64 457 / 133,
# at 512 3239 / 1025; 1 -> 32 channels 3x3 at 28x28 628 / 345; 3 -> 16 5x5 at 32x32 1482
# / 949; CIFAR's 3 -> 32 at 32x32 1149 / 814-949; VGG's 3 -> 64 at 224x224 (batch 8)
# 13.2 / 9.2-11.2 ms; 8 -> 8 3x3 at 24x24 573 / 509 (rows of 22: 69% of the lanes, left
# to the gathered kernel). Not taken: 16 -> 32 3x3 at 28x28 (C R 48) 1411 / 2116; rows
# shorter than a whole vector (LeNet C3, rows of 10 in 256-bit vectors: 260 / 379; 32 ->
# 64 at 14x14 1176 / 1167).
WROWS_MAX_CR = 24
WROWS_MIN_LANES = 0.75
WROWS_ITEMS = 8          # work-items per compute unit the slices aim for
WROWS_MAX_S = 8          # the widest filter row a work-item's registers take
programs.register(
    "convwr", {"x_acc": False, "tuning": (("MB", 4), ("S", 5), ("VW", 8))},
    lambda: [{"x_acc": xa, "tuning": (("MB", mb), ("S", s), ("VW", vw))}
             for mb, s, vw, xa in ((3, 5, 16, False), (3, 5, 16, True), (8, 3, 16, False),
                                   (4, 5, 8, False), (2, 7, 8, True))])


def _wgrad_rows(p, dev, dt, N, C, M, R, S, P, Q, Hg, Wg, st, dl, padded):
    """(MB, VW, G, RPS) of convwr.cl for a weight gradient over an input of Hg x Wg
    planes (G slices of RPS output rows), or None: where it cannot take the layer (a
    column stride past 1, padding left to check, filters wider than WROWS_MAX_S,
    rows shorter than a vector of 4) or should not (see WROWS_MAX_CR and
    WROWS_MIN_LANES), or a parameter set says WROWS False (or forces convpx.cl's
    PIXELS). WROWS True takes it wherever it can, and WROWS_MB fixes MB (the
    tests)."""
    if p.get("WROWS") is False or st[1] != 1 or padded or S > WROWS_MAX_S or N < 1 or \
            (p.get("PIXELS") and not p.get("WROWS")):     # (convpx.cl's forced)
        return None
    vw = full = programs.vector_width(p["VW"], dt)
    if Q < vw:
        vw = programs.helper_width(vw, dt)
    if Q < vw or vw < 4:
        return None
    # registers: MB S sums, the operand that stays (the fewer of MB and S), the one
    # loaded as used, and the lane numbers and mask
    regs = p.get("REGS", DEFAULT_REGS) - 3
    fits = [mb for mb in range(1, 9) if mb * S + min(mb, S) <= regs]
    if not fits:
        return None
    mb = p.get("WROWS_MB") or min(fits, key=lambda b: (-(-M // b), -(-M // b) * b, -b))
    units = C * R * -(-M // mb)
    rows = N * P
    G = max(1, min(rows, -(-WROWS_ITEMS * dev.facts.compute_units // units)))
    rps = -(-rows // G)
    # a slice's input and dy rows within half of L2: the work-items of a slice, which
    # run one after another, then read them from L2 (CIFAR's 3-channel input layer
    # re-read 75 MB of dy from memory in slices of all 64 images)
    per_row = (C * st[0] * Wg + M * Q) * programs.acc_dtype(dt).itemsize
    if dev.facts.l2_size:
        rps = max(1, min(rps, dev.facts.l2_size // 2 // per_row))
    G = -(-rows // rps)
    if p.get("WROWS") or (C * R <= WROWS_MAX_CR and vw == full and
                          Q / (-(-Q // vw) * vw) >= WROWS_MIN_LANES):
        return mb, vw, G, rps
    return None


def _run_wgrad_rows(dev, dt, plan, *, x, x_off, Hg, Wg, zero_rows, dy, N, C, M, R, S, P,
                    Q, st, dl, out, alpha, beta):
    """convwr.cl's launch for ``plan`` (_wgrad_rows), over the input ``x`` as
    _pad_input gives it (Hg x Wg planes, no padding left to check), and where the
    plan has several slices, their sum in slice order into ``out``."""
    mb, vw, G, rps = plan
    prm = {"dtype": programs.dtype_name(dt), "x_acc": isinstance(x, _Converted),
           "tuning": (("MB", mb), ("S", S), ("VW", vw))}
    kern = programs.get_kernel(dev, "convwr", "clnn_conv_wgrad_rows", prm)
    kw = M * C * R * S
    # (one slice writes dw itself: its kernel never touches ws then)
    ws = dev_scratch(dev, G * kw, programs.acc_dtype(dt)) if G > 1 else out
    Mb = -(-M // mb)
    zlo, zhi = _nonzero_rows(zero_rows, Hg)
    evt = kern((C * R * Mb * G,), (1,), units=int4(C, R, Mb, G), dims=int4(N, P, Q, M),
               steps=int4(st[0], dl[0], dl[1], rps), x=x,
               xd=int4(C * Hg * Wg, Hg * Wg, Wg, x_off), zlo=zlo, zhi=zhi, dy=dy,
               yd=int4(M * P * Q, P * Q, Q, offset(dy)), ws=ws,
               dw=out, dw_off=offset(out), alpha=alpha, beta=beta)
    if G == 1:
        return evt
    return reduce3(dev, dt, ws, (1, G, kw), out, final="axpby", post=alpha, beta=beta,
                   inp="acc", wg=False)


def _nonzero_rows(zero_rows, H):
    """(zlo, zhi): the rows [zlo, zhi) of an H-row plane that are not a padded copy's
    zero border, whose (top, bottom) rows ``zero_rows`` counts (None: no border)."""
    return (zero_rows[0], H - zero_rows[1]) if zero_rows else (0, H)


def _kernel_args(rows3, row_steps, k_split, k_steps, x, x_off, H, zero_rows, cols, b_pk,
                 koff, out, out_steps, alpha, beta, act_p, bias):
    """The arguments clnn_conv_gather and clnn_conv_pixels share: the row, k and output
    descriptors, the input, the packed B and k table, the zero border's rows and the
    epilogue's."""
    zlo, zhi = _nonzero_rows(zero_rows, H)
    return dict(row_split=int4(*rows3), row_steps=int4(*row_steps), k_split=k_split,
                k_steps=k_steps, x=x, x_off=x_off, zlo=zlo, zhi=zhi, cols=cols, b_pk=b_pk,
                koff=koff, out=out, out_off=offset(out), out_steps=int4(*out_steps),
                alpha=alpha, beta=beta, act_p=act_p[0], act_q=act_p[1],
                bias=bias if bias is not None else out,
                bias_off=offset(bias) if bias is not None else 0)


def _pack(dev, stem, prm, dt, scratch, width, *, cols, K, k3, k_steps, src, src_off,
          src_steps, W):
    """clnn_conv_pack (_convpack.cl) of template ``stem`` with ``prm``: B in panels of
    ``width`` columns and the k offset table, into the caller's scratch (checked) or
    new buffers. Returns (b_pk, koff, k_split, k_steps) as the kernels take them."""
    b_pk, koff = _own_scratch(dev, dt, scratch, cols, K, width)
    pack = programs.get_kernel(dev, stem, "clnn_conv_pack", prm)
    runs = -(-K // PACK_RUN)               # a work-item packs PACK_RUN k
    Nb = -(-cols // width)
    k_split, k_step = int4(*k3), int4(*k_steps)
    pack((-(-runs // 64) * 64, Nb), (64, 1), RUN=PACK_RUN, cols=cols, Nb=Nb, src=src,
         src_off=src_off, src_steps=int4(*src_steps), b_pk=b_pk,
         k_split=k_split, k_steps=k_step, W=W, koff=koff)
    return b_pk, koff, k_split, k_step


def _own_scratch(dev, dt, scratch, cols, K, width):
    """A caller's _gather_scratch buffers, checked to hold panels of ``width`` columns
    (a kernel writing past them would corrupt the host heap on PoCL, silently until
    some later allocation), else new ones."""
    if scratch is None:
        return _gather_scratch(dev, dt, cols, K, width)
    need = -(-cols // width) * width * K * programs.acc_dtype(dt).itemsize
    if scratch[0].size < need or scratch[1].size < 4 * K:
        raise AssertionError(f"scratch of {scratch[0].size} bytes for {need} bytes of "
                             f"panels {width} wide")
    return scratch


def _gather_scratch(dev, dt, cols, K, *widths):
    """(packed B, k offsets) of one gathered GEMM with ``cols`` columns and K k, packed
    in panels of one of ``widths`` columns (NWI, or pixel rows' MB)."""
    panel = max(-(-cols // n) * n for n in widths)
    return (dev_scratch(dev, panel * K, programs.acc_dtype(dt)), dev_scratch(dev, K, np.int32))


# A strided data gradient on CPUs (float32, float64) as dcol transposed, one batched
# GEMM per group of images, and clnn_conv_col2im_rows (_dgrad_col2im_rows); False: as
# dcol (positions by taps, the gathered kernel) and clnn_conv_col2im, whose reads took
# one element of each cache line per work-item. Kernel ms, Intel Xeon (AVX-512), PoCL
# 3.0: see benchmarks/README.md.
DGRAD_COL2IM_ROWS = True


def _col2im_rows(dt, R, S, st):
    """Whether a CPU's data gradient takes _dgrad_col2im_rows: strided, float32 or
    float64, and either its columns at most 2 apart (the rows kernel stores whole
    vectors) or its taps overlapping along an axis (R > sh or S > sw). Where neither
    holds, every dcol entry is a dx element of its own, stored element by element:
    with its stores lane by lane at stride 2, the rows kernel lost to clnn_conv_col2im
    on 1x1 filters at stride 2 (11.9 -> 13.3 ms); with them as vectors it wins there
    too (12.2-12.9 -> 10.5-10.6)."""
    return DGRAD_COL2IM_ROWS and st != (1, 1) and programs.acc_dtype(dt) == dt and \
        (st[1] <= 2 or R > st[0] or S > st[1])


def _dgrad_method(C, H, W, M, P, Q, R, S):
    """"flip" or "col2im" for a unit-stride data gradient, whichever does less work.

    The flipped forward pass computes every dx element from all M R S taps, padding
    included, in vectors across C; the col2im path computes each unrolled entry once,
    in vectors across C R S, then adds each into dx. Weights from bench_conv.py's
    layers here: an entry added by col2im costs about 40 vector lanes of multiply-add.
    """
    def lanes(n):
        return -(-n // 8) * 8
    flip = H * W * M * R * S * lanes(C)
    col2im = P * Q * C * R * S * (lanes(M) + 40)
    return "flip" if flip <= 1.3 * col2im else "col2im"


def _dcol_t(dev, dt, dy, w, C, M, R, S, P, Q, rows=None):
    """dcol transposed (C R S x P Q, per image) = w^T (C R S x M) @ dy (M x P Q): one
    batched GEMM of plain matrices per group of images, a generator that yields (n0,
    group, dcol) after each group's GEMM for the caller's col2im. Groups hold as many
    images as fit SCRATCH_BYTES (a constant, so the plan and the bits never follow the
    budget), all alike: the last one starts early and its col2im writes some images'
    dx again, the same values. dcol is in dt, what the GEMM sums in for float32 and
    float64. ``rows``: the GEMM's parameter sets (a GPU's conv rows), else the
    GEMM table's for the shape. Everything is taken from the pool before the first
    GEMM: every GEMM asks for the same panels or split-K workspace, which the one
    before let go, so an allocation fails, if at all, before dx is written."""
    N = dy.shape[0]
    CRS, PQ = C * R * S, P * Q
    group = max(1, min(N, SCRATCH_BYTES // (CRS * PQ * dt.itemsize)))
    if rows is None:
        rows = tuning.gemm_rows(dev.facts, dt.itemsize, dt,
                                tuning.shape_class(CRS, PQ, M, trans_a=True, batch=group))
    dcol = dev_scratch(dev, group * CRS * PQ, dt)

    def gemm_args(n0):
        return dict(M=CRS, N=PQ, K=M, nbatch=group, a=Operand(w, offset(w), CRS),
                    b=Operand(dy, offset(dy) + n0 * M * PQ, PQ, M * PQ, group),
                    c=Operand(dcol, 0, PQ, CRS * PQ, group), trans_a=True)
    need = tiled_workspace(dev, dt, rows, **gemm_args(0)) \
        if rows[0]["variant"] != "reg" else 0
    ws = dev_scratch(dev, need, programs.acc_dtype(dt)) if need else None
    for n0 in sorted({min(n, N - group) for n in range(0, N, group)}):
        run_gemm(dev, dt, rows=rows, workspace=ws, **gemm_args(n0))
        yield n0, group, dcol


def _dgrad_col2im_rows(dev, dt, dy, w, out, C, H, W, M, P, Q, R, S, st, pd):
    """A strided data gradient on CPUs: dcol transposed by groups of images (_dcol_t),
    then clnn_conv_col2im_rows, which reads dcol's rows as whole vectors. float32 and
    float64."""
    col2im = programs.get_kernel(dev, "conv", "clnn_conv_col2im_rows", _helper(dt))
    wg = min(8, dev.facts.max_work_group_size)
    evt = None
    for n0, group, dcol in _dcol_t(dev, dt, dy, w, C, M, R, S, P, Q):
        n_rows = group * C * H
        evt = col2im((-(-n_rows // wg) * wg,), (wg,), n0=n0, rows=n_rows, C=C, H=H, W=W,
                     P=P, Q=Q, R=R, S=S, sh=st[0], sw=st[1], ph=pd[0], pw=pd[1],
                     dcol=dcol, dx=out, dx_off=offset(out))
    return evt


def _dgrad_col2im(dev, dt, p, dy, w, out, C, H, W, M, P, Q, R, S, st, pd):
    """dcol (NPQ x CRS) = dy^T @ w for a group of images at a time, then col2im. dcol
    rows are whole panels wide, so the kernel stores vectors; a group's dcol stays
    within SCRATCH_BYTES."""
    N = dy.shape[0]
    CRS = C * R * S
    acc = programs.acc_dtype(dt)
    nwi = _tiles(p, dt, CRS, Q)[1]
    ld = -(-CRS // nwi) * nwi              # whole panels per row: vector stores
    group = max(1, min(N, scratch_cap(dev, SCRATCH_BYTES) // (P * Q * ld * acc.itemsize)))
    dcol = dev_scratch(dev, group * P * Q * ld, acc)
    scratch = _gather_scratch(dev, dt, CRS, M, nwi)
    col2im = programs.get_kernel(dev, "conv", "clnn_conv_col2im", _helper(dt))
    for n0 in range(0, N, group):
        g = min(group, N - n0)
        _run_gather(dev, dt, p, x=dy, x_off=offset(dy) + n0 * M * P * Q, H=P, W=Q, ph=0,
                    pw=0, rows3=(g, P, Q), row_steps=(M * P * Q, 1, 1), k3=(M, 1, 1),
                    k_steps=(P * Q, 0, 0), cols=CRS, src=w, src_off=offset(w), CS=1, KD=1,
                    KS=CRS, flip=0, out=dcol, out_steps=(P * Q * ld, Q * ld, ld, 1),
                    vstore=True, nwi=nwi, scratch=scratch)
        wg = min(8, dev.facts.max_work_group_size)
        evt = col2im((-(-W // 64), -(-g * C * H // wg) * wg), (1, wg), n0=n0,
                     rows=g * C * H, C=C, H=H, W=W, P=P, Q=Q, R=R, S=S, sh=st[0], sw=st[1],
                     ph=pd[0], pw=pd[1], dcol=dcol, ldcol=ld, dx=out, dx_off=offset(out))
    return evt


def _rows(dev, dt, mode, M, N, K):
    """The parameter sets for one convolution op, looked up by its class
    "conv-<mode>-<size bucket of its GEMM>" (see tuning.conv_rows)."""
    return tuning.conv_rows(dev.facts, dt.itemsize, dt,
                            f"conv-{mode}-{tuning.size_bucket(M, N, K)}")


def _ktab(dev, k3, coef):
    """The k table of gemm.cl's tiled loaders: for k = (k1, k2, k3) over ``k3`` =
    (K1, K2, K3), (src offset, h, w, A offset) = sum of k_i * X_i + X0 with ``coef`` =
    the (X1, X2, X3, X0) of each of the four. Built on the device once per geometry and
    kept in the device's bounded table cache (a training step reuses it every step)."""
    key = (k3, coef)
    tab = dev.tables.get(key)
    if tab is not None:
        return tab
    K = k3[0] * k3[1] * k3[2]
    tab = dev_scratch(dev, max(K, 1) * 4, np.int32)
    if K:
        kern = programs.get_kernel(dev, "conv", "clnn_conv_ktab", {"dtype": "float32"})
        wg = min(64, dev.facts.max_work_group_size)
        kern((-(-K // wg) * wg,), (wg,), K=K, K2=k3[1], K3=k3[2],
             coef=np.array(tuple(int(v) for c in coef for v in c), cltypes.int16), ktab=tab)
    dev.tables.put(key, tab)
    return tab


def _colmap(grid, b, h, w, bounds, c=(0, 0, 0, 0)):
    """The column map of gemm.cl's tiled loaders: columns j = (i, u, v) over ``grid``
    = (U, V) give bc = i b0 + u b1 + v b2 + b3, hc = u h0 + h1, wc = v w0 + w1, and
    (for a convolution output) C's offset i c0 + u c1 + v c2 + c3."""
    return np.array((grid[0], grid[1], b[0], b[1], b[2], b[3], h[0], h[1], w[0], w[1],
                     bounds[0], bounds[1], c[0], c[1], c[2], c[3]), cltypes.int16)


def _tiled(dev, dt, rows, mode, *, M, N, K, a, b, c, k3, coef, cols, alpha=1.0,
           beta=0.0, act="none", act_p=(0.0, 0.0), bias=None, tab=None, workspace=None):
    """One tiled implicit GEMM (the GPU path): build the k table (unless given), then
    run the GEMM."""
    tab = tab if tab is not None else _ktab(dev, k3, coef)
    return run_gemm(dev, dt, M=M, N=N, K=K, nbatch=1, a=a, b=b, c=c, alpha=alpha,
                    beta=beta, act=act, act_p=act_p, bias=bias,
                    bias_mode="row" if bias is not None else "none", conv=mode,
                    conv_args={"ktab": tab, "cols": cols}, rows=rows, workspace=workspace)


# Below this many input channels the GPU data gradient goes through col2im: as a GEMM
# with C rows it would fill a few rows of every tile (the 3-channel stem: 3 of 16)
COL2IM_CHANNELS = 16

# convt.cl, the direct convolution in local-memory tiles, takes the GPU path's forward
# passes with at most this many output channels, and its data gradients at unit
# stride with at most this many input channels (0: never; at most 16, its widest MB).
# As an implicit GEMM such a layer fills 16 rows of a tile or fewer, and each
# unrolled element it gathers serves only M rows (LeNet-5's C1 and C3: 6 and 16).
TILE_DIRECT_MAXM = 16
# and at most this many terms a sum (C R S): a work-item adds them one after another,
# where the tiled GEMM can split them over work-groups (split-K). A guess, untimed.
TILE_DIRECT_MAXK = 1024
# its tile (TW x TH output positions, a work-item each) and its local memory (LW
# elements of weights, LP of input patch, acc_t each: 16 KiB in float)
_CONVT = {"TW": 16, "TH": 8, "LW": 2560, "LP": 1536}
_CONVT_MB = (4, 8, 16)
# Where the GPU path's rows are matrix-engine rows (NVIDIA, compute capability 8.0 and
# up: float16 and bfloat16, float32 where TF32 is allowed), convt.cl's sums run on the
# engine too (its MMA variant): the tile's positions along the engine's m, the filters
# along its n (MB 8 or 16), a channel block's taps along k, at most KP of them a block
# (with the patch, 11 KiB of local memory for 16-bit operands, 16 KiB for TF32). Off
# (False): the float sums above, as on other GPUs (benchmarks compare the two).
TILE_DIRECT_ENGINES = True
_CONVT_KP = {"f16": 160, "tf32": 96}
programs.register("convt", dict(_CONVT, act="none", MB=16, MMA="none", EMULATE=False,
                                KP=_CONVT_KP["f16"]),
                  lambda: [dict(_CONVT, act=a, MB=mb, MMA="none", EMULATE=False,
                                KP=_CONVT_KP["f16"])
                           for a in ("none",) + ACTIVATIONS for mb in _CONVT_MB])


# convw.cl, the weight gradient summed directly from whole images in local memory,
# takes the GPU path's weight gradients of layers with at most TILE_DIRECT_MAXM filters
# (and sums of at most TILE_DIRECT_MAXK taps C R S, filters at most 8 wide) where an
# image's input and dy fit its local memory: as a GEMM, dw (M x CRS) fills a few rows
# of every tile and gathers each element of x once per tile step (LeNet-5's C1 at batch
# 1024 on an H200: 157 us in float32, 275 us on float16's engine tiles). Off (False):
# the tiled GEMM, as before (benchmarks compare the two).
WGRAD_DIRECT = True
# its work-group (T work-items) and local memory (BYTES: an image's padded input and
# dy, in acc_t); work-groups per compute unit it aims for (each takes IPG images)
_CONVW = {"T": 256, "BYTES": 32768, "GROUPS_PER_UNIT": 2}
_CONVW_UPT = (1, 2, 4)
programs.register("convw", {"S": 5, "UPT": 1, "T": _CONVW["T"], "LM": 8192},
                  lambda: [{"S": s, "UPT": u, "T": _CONVW["T"], "LM": 8192}
                           for s in (1, 3, 5, 8) for u in _CONVW_UPT])


def wgrad_direct(dev, dt, N, C, H, W, M, R, S, P, Q, st, pd, dilation=(1, 1)):
    """convw.cl's plan for a weight gradient (dict of its template and launch values),
    or None where it does not take it: dilated filters, more filters than
    TILE_DIRECT_MAXM, sums of more than TILE_DIRECT_MAXK taps, filters wider than 8,
    more units (M C R) than UPT x T, an image's padded input and dy past LM (or LM past
    the device's local memory), an empty batch, or WGRAD_DIRECT off."""
    T = _CONVW["T"]
    if not WGRAD_DIRECT or tuple(dilation) != (1, 1) or N < 1 or \
            M > TILE_DIRECT_MAXM or C * R * S > TILE_DIRECT_MAXK or S > 8 or \
            T > dev.facts.max_work_group_size or _CONVW["BYTES"] > dev.facts.local_mem_size:
        return None
    lm = _CONVW["BYTES"] // programs.acc_dtype(dt).itemsize
    units = M * C * R
    upt = next((u for u in _CONVW_UPT if units <= u * T), None)
    if upt is None:
        return None
    # position slices: a power of two (a warp's 32 work-items then hold whole units,
    # 32 / PS of them); rows of the local input WPL long, WPL = PS mod 32 where PS < 32,
    # so that a warp's units, filter rows r apart, read PS banks apart and its slices
    # the banks between (C1: PS 8, rows of 40); odd otherwise
    ps = 1 << (max(1, min(T // units, P * Q)).bit_length() - 1) if upt == 1 else 1
    hp, wp = (P - 1) * st[0] + R, (Q - 1) * st[1] + S
    wpl = wp + (ps - wp) % 32 if 1 < ps < 32 else wp | 1
    # (and after the units' sums, T for the bias's)
    if C * hp * wpl + M * P * Q > lm or units * S * ps + T > lm:
        return None
    ipg = -(-N // min(N, _CONVW["GROUPS_PER_UNIT"] * dev.facts.compute_units))
    return {"S": S, "UPT": upt, "T": T, "LM": lm, "PS": ps, "HP": hp, "WPL": wpl,
            "IPG": ipg, "G": -(-N // ipg)}


def _run_wgrad_direct(dev, dt, plan, *, dy, x, N, C, H, W, M, P, Q, R, S, st, pd, out,
                      alpha, beta, db=None):
    """convw.cl's two launches: each work-group's partial sums, then their sum in group
    order with alpha and beta into ``out``, and into ``db`` the bias gradient where
    given (dy's sums per filter, from the dy the groups hold anyway: no launch of its
    own). (reduce3's column sums with final "axpby" would add them too, but split G
    into chunks first on a GPU: a third launch, in steps that launches bound.)"""
    params = {"dtype": programs.dtype_name(dt), "S": S, "UPT": plan["UPT"],
              "T": plan["T"], "LM": plan["LM"]}
    kw = M * C * R * S
    nb = 0 if db is None else M
    ws = dev_scratch(dev, plan["G"] * (kw + nb), programs.acc_dtype(dt))
    part = programs.get_kernel(dev, "convw", "clnn_convw_partial", params)
    part((plan["G"] * plan["T"],), (plan["T"],), N=N, C=C, H=H, W=W, M=M, P=P, Q=Q, R=R,
         SH=st[0], SW=st[1], PH=pd[0], PW=pd[1], IPG=plan["IPG"], PS=plan["PS"],
         HP=plan["HP"], WPL=plan["WPL"], NB=nb, x=x, x_off=offset(x), dy=dy,
         dy_off=offset(dy), ws=ws)
    total = programs.get_kernel(dev, "convw", "clnn_convw_sum", params)
    return total(((kw + nb) * 64,), (64,), G=plan["G"], K=kw + nb, KW=kw, alpha=alpha,
                 beta=beta, ws=ws, dw=out, dw_off=offset(out),
                 db=out if db is None else db, db_off=offset(out if db is None else db))


def convt_params(dt, act, plan):
    """convt.cl's template parameters for tile_direct's ``plan`` (MB, CB, engine)."""
    mb, _, eng = plan
    kind = eng["MMA"] if eng else "none"
    return dict(_CONVT, dtype=programs.dtype_name(dt), act=act, MB=mb, MMA=kind,
                EMULATE=bool(eng and eng.get("EMULATE")),
                KP=_CONVT_KP.get(kind, _CONVT_KP["f16"]))


def tile_direct(dev, dt, N, Cin, Mout, R, S, st, engine=None):
    """convt.cl's plan (MB, CB, engine) for a forward pass from ``Cin`` to ``Mout``
    channels at stride ``st`` (N images), or None where it does not take it: more
    channels than TILE_DIRECT_MAXM, sums longer than TILE_DIRECT_MAXK, a channel's
    patch or weights past its local memory, or a device that cannot hold its tile or
    launch N images along the grid's third axis. ``engine``: the matrix-engine row the
    GPU path would run (its "MMA" kind, "EMULATE"), which the plan keeps where
    TILE_DIRECT_ENGINES allows, or None."""
    t = _CONVT
    engine = engine if TILE_DIRECT_ENGINES and engine and engine.get("MMA") else None
    item = programs.acc_dtype(dt).itemsize
    if engine:
        # the patch in the operands' bytes, the weights as KP rows of 24 words (16
        # filters; 8 for fewer), each k's offset in the patch (an int), and the
        # emulation's exchange of fragment registers (12 words a work-item)
        kp = _CONVT_KP[engine["MMA"]]
        item = 4 if engine["MMA"] == "tf32" else 2
        local = t["LP"] * item + kp * 24 * item + kp * 4 + \
            (12 * t["TW"] * t["TH"] * 4 if engine.get("EMULATE") else 0)
    else:
        local = (t["LW"] + t["LP"]) * item
    if Mout > min(TILE_DIRECT_MAXM, _CONVT_MB[-1]) or N > 65535 or \
            Cin * R * S > TILE_DIRECT_MAXK or \
            t["TW"] * t["TH"] > dev.facts.max_work_group_size or \
            local > dev.facts.local_mem_size:
        return None
    mb = next(m for m in _CONVT_MB if Mout <= m and (m >= 8 or not engine))
    patch = ((t["TH"] - 1) * st[0] + R) * ((t["TW"] - 1) * st[1] + S)
    weights = kp // (R * S) if engine else t["LW"] // (R * S * mb)
    cb = min(Cin, weights, t["LP"] // patch)
    return (mb, cb, engine) if cb >= 1 else None


def tile_direct_op(dev, dt, mode, N, C, M, R, S, st, pd, dilation=(1, 1), engine=None):
    """tile_direct's plan for the GPU path's ``mode`` ("fwd" or "dgrad") of a
    convolution from C to M channels, or None: undilated forward passes, and data
    gradients at unit stride whose padding leaves the flipped pass over dy one (the
    same kernel from M to C channels); a weight gradient never."""
    if tuple(dilation) != (1, 1):
        return None
    if mode == "fwd":
        return tile_direct(dev, dt, N, C, M, R, S, st, engine)
    if mode == "dgrad" and tuple(st) == (1, 1) and pd[0] < R and pd[1] < S:
        return tile_direct(dev, dt, N, M, C, R, S, st, engine)
    return None


def _run_tile_direct(dev, dt, plan, *, x, N, Cin, H, W, Mout, P, Q, R, S, st, pd, w, flip,
                     out, act="none", act_p=(0.0, 0.0), bias=None):
    """One launch of convt.cl (see there; ``flip``: the data gradient at unit stride,
    ``pd`` then R - 1 - ph and S - 1 - pw)."""
    cb = plan[1]
    kern = programs.get_kernel(dev, "convt", "clnn_convt_forward",
                               convt_params(dt, act, plan))
    tw, th = _CONVT["TW"], _CONVT["TH"]
    bb = bias if bias is not None else w
    return kern((-(-Q // tw) * tw, -(-P // th) * th, N), (tw, th, 1), C=Cin, H=H, W=W,
                M=Mout, P=P, Q=Q, R=R, S=S, SH=st[0], SW=st[1], PH=pd[0], PW=pd[1], CB=cb,
                flip=int(flip), act_p=act_p[0], act_q=act_p[1],
                has_bias=int(bias is not None), x=x, x_off=offset(x), w=w,
                w_off=offset(w), b=bb, b_off=offset(bb), y=out, y_off=offset(out))


def _tiled_dgrad_col2im(dev, dt, rows, dy, w, out, C, H, W, M, P, Q, R, S, st, pd):
    """dcol transposed by groups of images (_dcol_t, the GPU's tiled GEMM), then
    col2im."""
    col2im = programs.get_kernel(dev, "conv", "clnn_conv_col2im_t", _helper(dt))
    evt = None
    for n0, group, dcol in _dcol_t(dev, dt, dy, w, C, M, R, S, P, Q, rows):
        count = group * C * H * W
        g_size, l_size = launch_size(dev, count)
        evt = col2im(g_size, l_size, n0=n0, count=count, C=C, H=H, W=W, P=P, Q=Q, R=R,
                     S=S, sh=st[0], sw=st[1], ph=pd[0], pw=pd[1], dcol=dcol, dx=out,
                     dx_off=offset(out))
    return evt


def _tiled_dgrad(dev, dt, rows, dy, w, out, C, H, W, M, P, Q, R, S, st, pd,
                 dilation=(1, 1)):
    """dx by stride phase: the positions h = h0 + sh hh (and likewise w) receive only
    from the taps r = a + sh i with a = (h0 + ph) mod sh, from p = hh + pbase - i. Each
    phase is one dense GEMM over its own taps: none of the zeros that the stride puts
    between dy's entries is multiplied (3/4 of the work at stride 2). A dilated
    convolution (unit stride only: one phase) reads dy (dh, dw) apart per tap."""
    (sh, sw), (ph, pw), (dh, dw) = st, pd, dilation
    assert (dh, dw) == (1, 1) or (sh, sw) == (1, 1)
    N = dy.shape[0]
    launches = []
    for h0 in range(sh):
        Hh = -(-(H - h0) // sh)
        alpha_h = (h0 + ph) % sh
        Rh = max(0, -(-(R - alpha_h) // sh))
        pbase = (h0 + ph - alpha_h) // sh
        for w0 in range(sw):
            Wh = -(-(W - w0) // sw)
            if Hh <= 0 or Wh <= 0:
                continue
            alpha_w = (w0 + pw) % sw
            Sw = max(0, -(-(S - alpha_w) // sw))
            qbase = (w0 + pw - alpha_w) // sw
            # dx (C x N Hh Wh) = A (C x M Rh Sw) @ B (M Rh Sw x N Hh Wh):
            #   A(c, (m, i, j)) = w[m, c, alpha_h + sh i, alpha_w + sw j]
            #   B((m, i, j), (n, hh, ww)) = dy[n, m, hh + pbase - i, ww + qbase - j]
            coef = ((P * Q, -dh * Q, -dw, 0), (0, -dh, 0, 0), (0, 0, -dw, 0),
                    (C * R * S, sh * S, sw, alpha_h * S + alpha_w))
            cols = _colmap((Hh, Wh), (M * P * Q, Q, 1, pbase * Q + qbase), (1, pbase),
                           (1, qbase), (P, Q), (C * H * W, sh * W, sw, h0 * W + w0))
            launches.append(dict(M=C, N=N * Hh * Wh, K=M * Rh * Sw,
                                 a=Operand(w, offset(w), R * S), b=Operand(dy, offset(dy)),
                                 c=Operand(out, offset(out), H * W), k3=(M, Rh, Sw),
                                 coef=coef, cols=cols))
    # each phase writes its own part of dx: every k table and the split-K workspace
    # are taken before the first phase writes
    tabs = [_ktab(dev, la["k3"], la["coef"]) for la in launches]
    need = max([tiled_workspace(dev, dt, rows, M=la["M"], N=la["N"], K=la["K"], nbatch=1,
                                a=la["a"], b=la["b"], c=la["c"], conv="dgrad")
                for la in launches] + [0])
    ws = dev_scratch(dev, need, programs.acc_dtype(dt)) if need else None
    evt = None
    for la, tab in zip(launches, tabs):
        evt = _tiled(dev, dt, rows, "dgrad", tab=tab, workspace=ws, **la)
    return evt


def _shape(v, name):
    """A shape argument (x_shape, w_shape) as a tuple of Python ints."""
    try:
        t = tuple(v)
    except TypeError:
        t = None
    if t is None or not all(isinstance(i, (int, np.integer)) and
                            not isinstance(i, (bool, np.bool_)) for i in t):
        raise ShapeError(f"{name} must be a tuple of ints, got {v!r}")
    return tuple(int(i) for i in t)


def _positions(H, W, R, S, stride, padding, dilation, extra=(0, 0)):
    """(P, Q, stride) of a convolution: the (dilated) kernel must fit the padded input;
    an axis with one output position gets the smallest stride that still gives one
    (1 would change the geometry the kernels assume; a huge one would not fit their int
    arguments). ``extra``: padding at the bottom and right beyond ``padding``."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    Hp, Wp = H + 2 * ph + extra[0], W + 2 * pw + extra[1]
    eh, ew = dh * (R - 1) + 1, dw * (S - 1) + 1            # the dilated extent
    if eh > Hp or ew > Wp:
        raise ShapeError(f"the {eh}x{ew} kernel{' (dilated)' if (dh, dw) != (1, 1) else ''} "
                         f"is bigger than the padded {Hp}x{Wp} input")
    P, Q = (Hp - eh) // sh + 1, (Wp - ew) // sw + 1
    return P, Q, ((sh if P > 1 else min(sh, Hp - eh + 1)),
                  (sw if Q > 1 else min(sw, Wp - ew + 1)))


def conv_geometry(x_shape, w_shape, stride, padding, x_off=0, dilation=(1, 1)):
    """(N, C, H, W, M, R, S, P, Q, (sh, sw), (ph, pw)) after checking every size.

    Every index a kernel computes must fit a 32-bit int: the padded input (from the
    element offset ``x_off``), the output and the filters, or the call is a ShapeError.
    A stride along an axis with one output position multiplies nothing, so it comes
    back as the smallest one that gives one position (``stride=10**12`` is a
    1-position convolution, as in PyTorch, and its kernels get a stride that fits)."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ShapeError(f"x must be (N, C, H, W) and w (M, C, R, S); got {tuple(x_shape)} "
                         f"and {tuple(w_shape)}")
    N, C, H, W = x_shape
    M, Cw, R, S = w_shape
    if C != Cw:
        raise ShapeError(f"x has {C} channels but w expects {Cw}")
    (sh, sw), (ph, pw) = pair(stride, "stride", 1), pair(padding, "padding", 0)
    if min(C, H, W, M, R, S) < 1 or N < 0:
        raise ShapeError(f"empty convolution: x {tuple(x_shape)}, w {tuple(w_shape)}")
    P, Q, (sh, sw) = _positions(H, W, R, S, (sh, sw), (ph, pw), dilation)
    for what, n in (("the padded input", x_off + N * C * (H + 2 * ph) * (W + 2 * pw)),
                    ("the output", N * M * P * Q), ("the filters", M * C * R * S),
                    ("a row of the unrolled input", C * R * S * max(P * Q, 1))):
        if n > INT_MAX:
            raise ShapeError(f"{what} of this convolution spans {n} elements; clnn "
                             "indexes with 32-bit ints")
    return N, C, H, W, M, R, S, P, Q, (sh, sw), (ph, pw)


def _geometry_args(C, H, W, M, P, Q, R, S, stride, padding):
    return dict(cv_C=C, cv_H=H, cv_W=W, cv_M=M, cv_P=P, cv_Q=Q, cv_R=R, cv_S=S,
                cv_sh=stride[0], cv_sw=stride[1], cv_ph=padding[0], cv_pw=padding[1])


# Bound on the scratch matrix of one launch, in bytes (and at most an eighth of the
# pool's budget): the unrolled data gradient (dcol) or a weight gradient's packed dy^T
# covers a group of images at a time.
SCRATCH_BYTES = 32 << 20

# Largest zero-padded copy of an input the gathered path makes (bytes, and at most an
# eighth of the pool's budget); bigger inputs are read in place with bounds checks.
PAD_BYTES = 64 << 20


# Largest float copy of a 16-bit (float16, bfloat16) input the gathered forward pass
# makes at once (bytes): bigger batches are copied and convolved a group of images at
# a time, so a 16-bit convolution's working memory stays small beside its input (an
# evaluation at batch 1000 would otherwise copy twice the input's bytes). The weight
# gradient copies whole batches: it adds groups into dw, and in 16 bits each addition
# would round.
CONVERT_BYTES = 1 << 20


def _copy_group(dt, N, per_image):
    """Images per _pad_input copy in the forward pass: all N, unless a 16-bit input's
    float copy of that many (``per_image`` elements each) would pass CONVERT_BYTES."""
    if not _converts(dt):
        return N
    return max(1, min(N, CONVERT_BYTES // (per_image * programs.acc_dtype(dt).itemsize)))


def _converts(dt):
    """Whether the gathered kernel reads a float copy of a ``dt`` input: 16-bit
    storage (float16, bfloat16), converted once rather than once per filter tap."""
    return programs.dtype_name(dt) in programs.STORAGE_ONLY


class _Converted:
    """A float copy of a 16-bit input from _pad_input: the gathered kernel reads it as
    acc_t (a kernel argument takes its ``base_data``)."""

    def __init__(self, buf):
        self.base_data = buf


def _pad_input(dev, dt, x, images, H, W, ph, pw, into=None):
    """(array, element offset, H, W, ph, pw, zero rows) for the gathered kernel: ``x``
    itself when there is no padding (or the padded copy would be too big, or a padding
    is negative, a crop: the kernel then checks bounds), else a zero-bordered copy and
    its border's (top, bottom) rows; for 16-bit storage a float copy (_Converted),
    bordered or not (into ``into`` when given: a caller copying a group at a time takes
    it before its first write). The unchecked kernel measured 1.6x faster on the
    56x56x64 layer, and the copy costs 5% of that."""
    Hp, Wp = H + 2 * ph, W + 2 * pw
    # 16-bit storage: a float copy even without padding, so the kernel converts each
    # element once instead of once per filter tap (LeNet-5's float16 step on PoCL: 31
    # -> 19 ms; bfloat16's conversion is a shift, yet its gathered kernels took 3.5
    # ms of a step against float16's 2.1 with the copy)
    acc = programs.acc_dtype(dt) if _converts(dt) else dt
    nbytes = images * Hp * Wp * acc.itemsize
    if not (ph or pw or acc != dt) or min(ph, pw) < 0 or \
            nbytes > scratch_cap(dev, PAD_BYTES):
        return x, offset(x), H, W, ph, pw, None
    xp = into if into is not None else dev_scratch(dev, images * Hp * Wp, acc)
    pad = programs.get_kernel(dev, "conv", "clnn_conv_pad", _helper(dt, x_acc=acc != dt))
    rows = images * Hp
    pad((-(-rows // 64) * 64,), (64,), rows=rows, H=H, W=W, ph=ph, pw=pw, x=x,
        x_off=offset(x), xp=xp)
    return (_Converted(xp) if acc != dt else xp), 0, Hp, Wp, 0, 0, (ph, ph)


# 1x1 convolutions without padding on CPUs (the gathered variant's devices) as batched
# packed GEMMs of plain matrices, an image a batch: y_n (M x P Q) = w (M x C) @ x_n (C x
# P Q), the bias and activation in the GEMM's epilogue, and at unit stride dx_n = w^T @
# dy_n. A strided one reads a copy of x's strided positions (clnn_conv_subsample), as
# does its weight gradient (the gathered kernel over the copy). The gathered kernel
# ran these at 110-150 GFLOP/s, each of its k steps reading x_n a plane further on;
# the packed GEMM copies an image's columns into panels that stay in a core's cache
# and ran them at 250-280. Kernel ms,
# batch 32, Intel Xeon (AVX-512), PoCL 3.0: see benchmarks/README.md. Same sums in the
# same order: bitwise what the gathered kernel gave. False: the gathered kernel.
POINTWISE_GEMM = True
# ... where an image has at least POINTWISE_MIN_COLS output positions (7x7 images, 49
# columns in panels of 32 or 64, lost: 8 x 512 -> 2048 forward 3.97 -> 4.87 ms, data
# gradient 4.08 -> 5.02), and for the passes that add launches (the data gradient's
# packing of A, a strided weight gradient's copy) at least POINTWISE_MIN_MACS
# multiply-adds (below, those launches cost more than they save: 16 x 32 -> 32 at
# 16x16, data gradient 0.18 -> 0.26 ms; 8 x 64 -> 128 at 32x32 stride 2, weight
# gradient 0.49 -> 0.60).
POINTWISE_MIN_COLS = 128
POINTWISE_MIN_MACS = 1 << 25


def _pointwise(p, R, S, pd, cols, macs=None):
    """Whether a convolution takes the CPU's 1x1 path (POINTWISE_GEMM): ``cols``, its
    output positions per image; ``macs``, its multiply-adds where the pass adds
    launches."""
    return POINTWISE_GEMM and p["variant"] == "gather" and (R, S) == (1, 1) and \
        tuple(pd) == (0, 0) and cols >= POINTWISE_MIN_COLS and \
        (macs is None or macs >= POINTWISE_MIN_MACS)


def _subsample(dev, dt, x, N, C, H, W, P, Q, st, x_acc=False, budget=True):
    """(array, element offset) of x's positions (p sh, q sw) as an (N, C, P, Q) copy (at
    unit stride x itself), an acc_t copy (_Converted) where ``x_acc`` and ``dt`` is
    16-bit; None where the copy would pass PAD_BYTES (the caller then reads x in place,
    as _pad_input does), and with ``budget`` an eighth of the pool's budget too. A
    weight gradient passes budget=False: the copy decides its image groups, so how it
    sums, which must not follow the budget (a pool too small for the copy raises)."""
    acc = programs.acc_dtype(dt) if x_acc and _converts(dt) else dt
    if st == (1, 1) and acc == dt:
        return x, offset(x)
    if N * C * P * Q * acc.itemsize > (scratch_cap(dev, PAD_BYTES) if budget else PAD_BYTES):
        return None
    xs = dev_scratch(dev, N * C * P * Q, acc)
    kern = programs.get_kernel(dev, "conv", "clnn_conv_subsample",
                               _helper(dt, x_acc=acc != dt))
    rows = N * C * P
    kern((-(-rows // 64) * 64,), (64,), rows=rows, H=H, W=W, P=P, Q=Q, sh=st[0], sw=st[1],
         x=x, x_off=offset(x), xs=xs)
    return (_Converted(xs) if acc != dt else xs), 0


# Winograd's F(m x m, 3x3) (winograd.cl) for 3x3 convolutions at unit stride on CPUs:
# (m + 2)^2 GEMMs of Mo x Ci x (tiles) instead of one of Mo x 9 Ci x (positions), for
# the transforms' memory traffic. F(4x4, 3x3) (WINO_M 4: 36 GEMMs, 4x fewer
# multiply-adds, the transformed operands 2.25 times the input's size) beat F(2x2, 3x3)
# (16, 2.25x fewer, 4 times) on every layer measured on an AMD EPYC Zen 4 (PoCL 3.0,
# batch 32, kernel times, gathered / F(2x2) / F(4x4), ms): forward passes 28x28x128
# 38.3 / 29.8 / 26.4, 14x14x256 36.4 / 25.7 / 23.9, 7x7x512 36.4 / 29.6 / 27.2; weight
# gradients 35.2 / 37.1 / 27.7, 34.4 / 27.9 / 24.6, 35.7 / 30.6 / 26.3. Since the
# transforms write the GEMMs' panels themselves (no packing), 64 channels gain too
# (56x56x64, ms, gathered / F(4x4): forward 42.6 / 38.2, data gradient 43.6 / 37.8,
# weight gradient 38.3 / 30.7; 28x28, 64 to 128: 20.5 / 14.4, 19.8 / 15.2, 18.7 /
# 12.6). The transforms' share of the work grows as 1/Ci + 1/Mo (input and dy
# transforms per input channel, output and filter transforms per filter, against
# Ci x Mo multiply-adds), so the threshold is on the two counts' harmonic mean,
# 2 Ci Mo / (Ci + Mo), at least WINO_CHANNELS (forward + both gradients, ms, gathered
# / F(4x4), alternating processes: 32 -> 64 channels at 56x56 63.8 / 55.4, 64 -> 32 at 28x28
# 15.7 / 13.2, 32 -> 48 at 32x32 30.9 / 26.9, 24 -> 96 at 28x28 16.9 / 15.6, where the
# harmonic means are 38-43; 24 -> 64 48.3 / 50.6 (35), 32 -> 32 20.7 / 21.7 at 32x32,
# 33.4 / 36.5 at 56x56, 16 -> 64 36.0 / 41.2 (26); an AMD EPYC Zen 4, AVX2 code). For
# the forward pass, the flipped data gradient and the weight gradient. A parameter set
# may carry thresholds of its own, "WINO_CHANNELS" for the forward pass and the data
# gradient and "WINO_WGRAD_CHANNELS" for the weight gradient (AVX-512 code's row in
# tuning.CONV_TABLE: 26 and 14), or say instead ("WINO", "WINO_M"). Its rounding:
# F(4x4)'s transform coefficients reach 8 (A) and 5 (B), so its errors run about 10x a
# direct sum's (float32: 1e-5 of the sums' magnitude), as in cuDNN's and oneDNN's
# Winograd.
WINO_CHANNELS = 36  # the harmonic mean of the two channel counts, at least
WINO_M = 4
WINO_WG = 8         # work-items per work-group of winograd.cl's kernels
# Winograd's image groups: as many images as have their transformed operands within
# WINO_GROUP_BYTES (at least one; a layer whose one image needs more than SCRATCH_BYTES
# takes the gathered kernel). Half of SCRATCH_BYTES: the transformed input, the GEMM
# outputs and the transforms' streams then stay nearer the caches (32 MiB of L3 here);
# forward passes, kernel ms, AMD EPYC Zen 4, groups of 32 -> 16 MiB: 56x56x64
# 29.8 -> 25.4, 28x28x128 17.9-18.8 -> 16.9-17.1, 14x14x256 17.0-17.1 -> 16.6.
WINO_GROUP_BYTES = 16 << 20
# Forward passes (and flipped data gradients) transform their input with tiles in the
# lanes where its tile rows allow (_wino_rows, clnn_wino_input_rows); False: always
# channels in the lanes (clnn_wino_input, which weight gradients use)
WINO_INPUT_ROWS = True


def _winograd(p, Ci, Mo, R, S, stride, dilation, groups=1, dt=None, P=1, Q=1,
              wgrad=False):
    """Whether the Winograd path computes a convolution of Ci to Mo channels (or, with
    ``wgrad``, its weight gradient) with P x Q outputs: Ci and Mo's harmonic mean at
    least the parameter set's "WINO_CHANNELS" (or "WINO_WGRAD_CHANNELS"), else
    WINO_CHANNELS (32 and 64 channels take it, 32 and 32 do not), unless the parameter
    set says ("WINO"), and one image's transforms within SCRATCH_BYTES (a constant, so
    that the choice, and with it the bits, do not depend on the pool's budget; larger
    images take the gathered kernel, which needs no such scratch). Dilated convolutions
    too: each phase of their outputs is an undilated convolution (_wino_phases)."""
    if (R, S) != (3, 3) or tuple(stride) != (1, 1) or groups != 1 or \
            p["variant"] != "gather":
        return False
    if dt is not None and _wino_image_bytes(dt, p, Ci, Mo, P, Q) > SCRATCH_BYTES:
        return False
    least = p.get("WINO_WGRAD_CHANNELS" if wgrad else "WINO_CHANNELS", WINO_CHANNELS)
    return bool(p.get("WINO", 2 * Ci * Mo >= least * (Ci + Mo)))


def _wino_image_bytes(dt, p, Ci, Mo, P, Q):
    """The bytes of one image's transformed input and GEMM outputs (or, for a weight
    gradient, transformed input and dy: the same sizes)."""
    m = _wino_tile(p)
    return (m + 2) ** 2 * -(-P // m) * -(-Q // m) * (Ci + Mo) * \
        programs.acc_dtype(dt).itemsize


def _wino_tile(p):
    """The outputs per side of a Winograd tile, 2 (F(2x2, 3x3)) or 4 (F(4x4, 3x3)): a
    parameter set's "WINO_M", else WINO_M."""
    return p.get("WINO_M", WINO_M)


def _wino_phases(p, H, W, ph, pw, dilation):
    """The undilated convolutions that a 3x3 convolution over H x W with padding (ph,
    pw) and dilation (dh, dw) splits into, one per phase (a, b) of its outputs that
    has any: output rows a, a + dh, ... read input rows ia, ia + dh, ... (ia = (a -
    ph) mod dh), an undilated convolution over that phase of the input with its own
    padding. Each a dict: P, Q, TH, TW (its outputs and tiles), out_plane (the whole
    output's P Q), y (the outputs' layout in the whole output, winograd.cl's image
    layout), H, W, ph, pw (its input and padding) and x (the input phase's layout);
    one phase, the whole images, where undilated."""
    dh, dw = dilation
    P, Q, m = H + 2 * ph - 2 * dh, W + 2 * pw - 2 * dw, _wino_tile(p)
    phases = []
    for a in range(min(dh, P)):
        ia = (a - ph) % dh
        Pa, Ha, pha = -(-(P - a) // dh), max(0, -(-(H - ia) // dh)), (ph - a + ia) // dh
        for b in range(min(dw, Q)):
            ib = (b - pw) % dw
            Qa, Wa, pwa = -(-(Q - b) // dw), max(0, -(-(W - ib) // dw)), (pw - b + ib) // dw
            phases.append(dict(P=Pa, Q=Qa, TH=-(-Pa // m), TW=-(-Qa // m), out_plane=P * Q,
                               y=int4(P * Q, dh * Q, dw, a * Q + b), H=Ha, W=Wa, ph=pha,
                               pw=pwa, x=int4(H * W, dh * W, dw,
                                              ia * W + ib if Ha and Wa else 0)))
    return phases


def _wino_plan(dt, p, N, Ci, Mo, H, W, ph, pw, dilation, cap):
    """(m, X, phases, tiles, group) of a Winograd pass of N images from Ci to Mo
    channels: the tile's outputs per side, the GEMMs (the transformed tile's elements),
    _wino_phases, an image's tiles in its largest phase (the first), and the images per
    group whose transformed operands fit ``cap`` bytes (at least one)."""
    m = _wino_tile(p)
    phases = _wino_phases(p, H, W, ph, pw, dilation)
    tiles = max(f["TH"] * f["TW"] for f in phases)
    group = max(1, min(N, cap // _wino_image_bytes(dt, p, Ci, Mo, phases[0]["P"],
                                                   phases[0]["Q"])))
    return m, (m + 2) ** 2, phases, tiles, group


# Where the runs of tiles (clnn_wino_input_runs, below) can take a forward pass's
# input transform, the rows kernel takes only tile rows of at least this many vectors
# of tiles: kernel ms (with float16's copy), Intel Xeon (AVX-512), PoCL 3.0, rows /
# runs, at 32x32 (one vector a row), batch 64, 32 -> 32 channels 1.44 / 1.20-1.25,
# batch 32, 64 -> 64 1.46-1.51 / 1.30-1.35, float16 1.71-1.87 / 1.70-1.79; at 64x64
# (two), batch 16, 2.81-2.93 / 3.10-3.18, float16 3.46-3.73 / 3.73-3.77.
WINO_ROWS_MIN_VECTORS = 2


def _wino_rows(acc, phases, runs=False):
    """Whether a Winograd forward pass transforms its input with clnn_wino_input_rows:
    one phase (undilated) whose tile rows are whole vectors of tiles (32x32 and 64x64
    images at F(4x4)), at least WINO_ROWS_MIN_VECTORS of them where the runs of
    tiles could take it instead (``runs``: _wino_runs). Kernel ms against
    clnn_wino_input, AMD EPYC Zen 3, 3-4 runs each: 64 -> 64 channels at 64x64, batch
    16: 10.1-11.8 against 21.2-22.1; 48 at 32x32, batch 64: 7.9-9.8 against
    10.8-11.6. Rows padded to whole vectors with
    tiles that the GEMMs multiply for nothing (14 -> 16 tiles at 56x56, 7 -> 8 at
    28x28) gained in the transform what the GEMMs and the output transform lost."""
    lanes = _wino_lanes(acc)
    return WINO_INPUT_ROWS and len(phases) == 1 and int(phases[0]["x"]["s2"]) == 1 and \
        phases[0]["TW"] % lanes == 0 and \
        (not runs or phases[0]["TW"] >= WINO_ROWS_MIN_VECTORS * lanes)


# float16's input to clnn_wino_input (channels in the lanes: its loads gather a lane
# per channel, each a scalar conversion, and every element is loaded by up to four
# patches) goes through a float copy of each group of images first, made in vectors
# (clnn_cast's kernel: F16C's conversion on x86). Kernel ms, one process switching
# this, AMD EPYC Zen 3, batch 32: at 56x56, 64 -> 64 channels, the forward pass's input
# transform 46.1 -> 19.1 plus a 2.5 ms copy (the whole pass 79.2 -> 50.7), the weight
# gradient 78.3 -> 43.5; 28x28x128 forward 45.3 -> 31.7. bfloat16's loads are a shift:
# no copy.
WINO_X_COPY = True


# The output transform takes a tile row's tiles per work-item and stores each output
# row's run as vectors (clnn_wino_output's by_rows) where a phase's columns are
# contiguous and its tile rows at least WINO_OUTPUT_ROW_LANES of a vector's lanes long;
# else runs of any tiles, stored lane by lane. Kernel ms, 64 images, 64 channels unless
# named, lane by lane / by rows, float32 and float16: tile rows of 8 (32x32, 32
# channels) 1.58 / 0.78, 2.24 / 0.91; of 14 (56x56, batch 32, 32 channels) 2.26 /
# 1.67, 3.51 / 1.86; of 6, 7 and 9 within 5% in float32, float16 1.5x by rows; of 4
# and 2 (16x16, 8x8) 0.76 / 1.05 and 0.22 / 0.52 in float32: most lanes idle.
WINO_OUTPUT_ROW_LANES = 0.75


def _wino_output_rows(acc, f):
    """Whether clnn_wino_output takes phase ``f``'s tiles by rows (above)."""
    return int(f["y"]["s2"]) == 1 and f["TW"] >= WINO_OUTPUT_ROW_LANES * _wino_lanes(acc)


# A forward pass's (and a flipped data gradient's) input transform takes runs of a
# vector's lanes of tiles per work-item (clnn_wino_input_runs) where the rows kernel
# does not apply: V's tiles lie side by side (B panels of tiles), and clnn_wino_input,
# channels in the lanes, stored them lane by lane, 36 scalar stores per tile and
# channel. Kernel ms, Intel Xeon (AVX-512), PoCL 3.0, batch 32, clnn_wino_input ->
# runs: 56x56x64 7.4-8.3 -> 4.5-4.7, 28x28x128 3.4-3.8 -> 2.0-2.2, 14x14x256 2.1-2.9
# -> 1.3, dilated 28x28x64 (batch 16) 1.2 -> 0.75, float16 at 56x56 (batch 16) 3.4 ->
# 2.1-2.9. Not doubles: runs of 4 lanes gather as many elements for half the tiles of
# a float run, and their scalar stores were a smaller share (56x56x64, batch 16: 6.0
# -> 9.2).
WINO_INPUT_RUNS = True


def _wino_runs(acc, nwi, panels):
    """Whether a forward pass's input transform (not the rows kernel) takes runs of
    tiles: float sums, into B panels of ``nwi`` tiles, a multiple of the vector's
    lanes, or a plain matrix (another GEMM variant's operand)."""
    return WINO_INPUT_RUNS and acc.itemsize == 4 and \
        (not panels or nwi % _wino_lanes(acc) == 0)


def _wino_input_kernel(dev, dt, acc, prm, rows_in, group_elems, runs=False):
    """The input transform's kernel (clnn_wino_input_rows where ``rows_in``,
    clnn_wino_input_runs where ``runs``, else clnn_wino_input) and, where it reads a
    float copy of a float16 input (WINO_X_COPY), the buffer for a group's
    ``group_elems`` elements of it (else None)."""
    copy = WINO_X_COPY and not rows_in and programs.dtype_name(dt) == "float16"
    entry = "clnn_wino_input_rows" if rows_in else \
        "clnn_wino_input_runs" if runs else "clnn_wino_input"
    return (programs.get_kernel(dev, "winograd", entry, dict(prm, x_acc=copy)),
            dev_scratch(dev, group_elems, acc) if copy else None)


def _wino_group_x(dev, xf, x, x_off, count):
    """(buffer, element offset) the input transform reads for a group of images, the
    ``count`` elements of x from x_off: x itself, or, with a copy buffer ``xf``, xf
    after they were converted into it (clnn_cast's kernel, in vectors)."""
    if xf is None:
        return x, x_off
    kern = programs.get_kernel(dev, "cast", "clnn_cast", {"dtype": "float32",
                                                          "src": "float16"})
    launch(kern, dev, count, x=x, x_off=x_off, out=xf, out_off=0)
    return xf, 0


def _wino_plane(n):
    """The distance between the transformed planes of ``n`` elements: 16 more than a
    multiple of 1024, so that a work-item's streams of stores or loads (one per plane)
    fall in different cache sets (C T floats apart, 4 KiB multiples at 14x14x256, they
    shared one set of the L1: F(2x2)'s input transform took 10.8 ms instead of 3.7)."""
    return n + (16 - n) % 1024


# An axis laid out along "one panel" longer than any index: a plain matrix's axis
_WHOLE = 1 << 30


def _wino_lay(width, panel_step, step):
    """winograd.cl's layout of an operand's axis: index i at (i / width) * panel_step +
    (i % width) * step."""
    return int4(width, panel_step, step, 0)


def _wino_lanes(acc):
    """The lanes of winograd.cl's vectors of ``acc`` values (a CPU vector's)."""
    return programs.CPU_LANES["double" if acc.itemsize == 8 else "float"]


def _wino_lane_groups(acc, n):
    """Work-items of a winograd.cl kernel that puts a CPU vector's lanes of n things
    (channels, tiles, filter slots) in each."""
    return -(-n // _wino_lanes(acc))


def _round_up(n, k):
    return -(-n // k) * k


# The transforms with channels in the lanes (clnn_wino_input, clnn_wino_dy) split each
# image's tile rows into bands, a work-item per band, until their work-items make
# WINO_BAND_GROUPS work-groups a compute unit: a work-item per vector of channels of
# an image was all the work there was where an image group holds few images (one or
# two at 112x112 and up), and one core transformed while the other waited.
WINO_BAND_GROUPS = 2


def _wino_block(dev, wg, items, extent):
    """The block of ``extent`` (tile rows, channels) each of ``items`` work-items takes
    so that together they make WINO_BAND_GROUPS work-groups of ``wg`` a compute unit:
    all of it where the items do already, else smaller blocks, down to one."""
    blocks = max(1, min(extent, -(-WINO_BAND_GROUPS * dev.facts.compute_units * wg //
                                  max(1, items))))
    return -(-extent // blocks)


def _wino_band(dev, wg, items, TH):
    """(TB, work-items) for a channel-lane transform of ``items`` work-items over TH
    tile rows: the tile rows per band (_wino_block), and the work-items with their
    bands."""
    tb = _wino_block(dev, wg, items, TH)
    return tb, items * -(-TH // tb)


def _wino_run_channels(dev, wg, runs, C):
    """The channels per work-item of clnn_wino_input_runs over ``runs`` runs of tiles
    (_wino_block)."""
    return _wino_block(dev, wg, runs, C)


def _wino_input(dev, inp, acc, wg, f, x, x_off, images, C, v, plane, c_lay, t_lay,
                rows=False, runs=False):
    """clnn_wino_input (kernel ``inp``) over phase ``f`` of ``images`` images of C
    channels from x + x_off, into v (planes ``plane`` apart) along c_lay and t_lay, in
    bands of tile rows (_wino_band); with ``rows``, clnn_wino_input_rows (a work-item
    per vector of tiles of a tile row of a channel; f's TW a multiple of the vector's
    lanes); with ``runs``, clnn_wino_input_runs (a work-item per vector of tiles and
    _wino_run_channels channels; t_lay's panels whole vectors of tiles)."""
    if runs:
        n_runs = _wino_lane_groups(acc, images * f["TH"] * f["TW"])
        cb = _wino_run_channels(dev, wg, n_runs, C)
        items, band = n_runs * -(-C // cb), {"CB": cb}
    elif rows:
        items, band = C * images * f["TH"] * f["TW"] // _wino_lanes(acc), {}
    else:
        tb, items = _wino_band(dev, wg, images * _wino_lane_groups(acc, C), f["TH"])
        band = {"TB": tb}
    inp((_round_up(items, wg),), (wg,), C=C, H=f["H"],
        W=f["W"], ph=f["ph"], pw=f["pw"], TH=f["TH"], TW=f["TW"], images=images,
        plane=plane, c_lay=c_lay, t_lay=t_lay, x=x, x_off=x_off, x_lay=f["x"], v=v,
        **band)


def _run_winograd(dev, dt, p, *, x, N, Ci, H, W, Mo, ph, pw, w, flip, out, act="none",
                  act_p=(0.0, 0.0), bias=None, dilation=(1, 1)):
    """out (N, Mo, P, Q) = the 3x3 convolution of x (N, Ci, H, W) with padding (ph, pw)
    and dilation: filters w (Mo, Ci, 3, 3), or with ``flip`` w (Ci, Mo, 3, 3) turned
    (a data gradient). Images go in groups whose transformed input and GEMM outputs fit
    WINO_GROUP_BYTES, and a dilated convolution's phases (_wino_phases) one after another;
    every buffer is taken before the first launch. The transforms write the GEMMs'
    operands as the packed CPU GEMM's panels (U as A panels of MWI filters, V as B
    panels of NWI tiles), so nothing packs them again; another GEMM variant gets plain
    matrices."""
    acc = programs.acc_dtype(dt)
    m, X, phases, tiles, group = _wino_plan(dt, p, N, Ci, Mo, H, W, ph, pw, dilation,
                                            scratch_cap(dev, WINO_GROUP_BYTES))
    prm = {"dtype": programs.dtype_name(dt), "m": m, "act": act,
           "bias": "row" if bias is not None else "none"}
    rows = tuning.gemm_rows(dev.facts, acc.itemsize, acc,
                            tuning.shape_class(Mo, group * tiles, Ci, batch=X))
    panels = panel_widths(rows)
    mwi, nwi = panels or (1, 1)
    Mpad = _round_up(Mo, mwi)
    us = _wino_plane(Mpad * Ci)
    u = dev_scratch(dev, X * us, acc)
    v = dev_scratch(dev, X * _wino_plane(Ci * _round_up(group * tiles, nwi)), acc)
    z = dev_scratch(dev, X * _wino_plane(Mo * group * tiles), acc)
    filt, outp = (programs.get_kernel(dev, "winograd", e, prm) for e in
                  ("clnn_wino_filter", "clnn_wino_output"))
    runs = _wino_runs(acc, nwi, panels)
    rows_in = _wino_rows(acc, phases, runs)
    runs = runs and not rows_in
    inp, xf = _wino_input_kernel(dev, dt, acc, prm, rows_in, group * Ci * H * W, runs)
    wg = min(WINO_WG, dev.facts.max_work_group_size)
    filt((_round_up(_wino_lane_groups(acc, Mpad * Ci), wg),), (wg,), Mo=Mo, Ci=Ci,
         flip=int(flip), plane=us, orun=mwi, w=w, w_off=offset(w), u=u)
    for n0 in range(0, N, group):
        g = min(group, N - n0)
        xs, xs_off = _wino_group_x(dev, xf, x, offset(x) + n0 * Ci * H * W, g * Ci * H * W)
        for f in phases:
            T = g * f["TH"] * f["TW"]
            vs, zs = _wino_plane(Ci * _round_up(T, nwi)), _wino_plane(Mo * T)
            c_lay, t_lay = (_wino_lay(_WHOLE, 0, nwi), _wino_lay(nwi, Ci * nwi, 1)) \
                if panels else (_wino_lay(_WHOLE, 0, T), _wino_lay(_WHOLE, 0, 1))
            _wino_input(dev, inp, acc, wg, f, xs, xs_off, g, Ci, v, vs, c_lay, t_lay,
                        rows_in, runs)
            c = Operand(z, 0, T, zs, X)
            if panels:
                run_panels(dev, acc, rows, M=Mo, N=T, K=Ci, nbatch=X, a_pk=u, b_pk=v,
                           a_bstride=us, b_bstride=vs, c=c)
            else:
                run_gemm(dev, acc, M=Mo, N=T, K=Ci, nbatch=X, a=Operand(u, 0, Ci, us, X),
                         b=Operand(v, 0, T, vs, X), c=c, rows=rows)
            by_rows = _wino_output_rows(acc, f)
            groups = Mo * (g * f["TH"] * _wino_lane_groups(acc, f["TW"]) if by_rows else
                           _wino_lane_groups(acc, T))
            evt = outp((_round_up(groups, wg),), (wg,), M=Mo,
                       P=f["P"], Q=f["Q"], TH=f["TH"], TW=f["TW"], images=g, plane=zs,
                       by_rows=int(by_rows),
                       z=z, y=out, y_off=offset(out) + n0 * Mo * f["out_plane"], y_lay=f["y"],
                       act_p=act_p[0], act_q=act_p[1],
                       bias=bias if bias is not None else out,
                       bias_off=offset(bias) if bias is not None else 0)
    return evt


def _run_winograd_wgrad(dev, dt, p, *, dy, x, N, C, H, W, M, ph, pw, out, alpha, beta,
                        dilation=(1, 1)):
    """out (M, C, 3, 3) = alpha dw + beta out for the 3x3 unit-stride convolution of x
    (N, C, H, W) with padding (ph, pw), dilation and output gradient dy: F(m x m, 3x3)
    transposed (winograd.cl). The GEMMs sum over a group of images and a phase
    (_wino_phases) at a time into Z, every one after the first adding to it (groups
    from the constant WINO_GROUP_BYTES, so the bits do not depend on the pool's budget);
    all scratch is taken first. The transforms write the GEMMs' operands as panels, as
    in _run_winograd: Y as A panels of MWI channels of dy, V^T as B panels of NWI
    channels of x, both along the tiles."""
    acc = programs.acc_dtype(dt)
    m, X, phases, tiles, group = _wino_plan(dt, p, N, C, M, H, W, ph, pw, dilation,
                                            WINO_GROUP_BYTES)
    prm = {"dtype": programs.dtype_name(dt), "m": m, "act": "none", "bias": "none",
           "dyv": 1}
    rows = tuning.gemm_rows(dev.facts, acc.itemsize, acc, tuning.shape_class(
        M, C, group * tiles, trans_b=True, batch=X))
    panels = panel_widths(rows)
    mwi, nwi = panels or (1, 1)
    # dy's transform: a panel of MWI channels per work-item, stored as contiguous runs,
    # where the panels are no wider than a CPU vector (else a work-item per channel)
    dyv = mwi if panels and 2 <= mwi <= _wino_lanes(acc) else 1
    Mpad, Cpad = _round_up(M, mwi), _round_up(C, nwi)
    zs = _wino_plane(M * C)
    z = dev_scratch(dev, X * zs, acc)
    v = dev_scratch(dev, X * _wino_plane(Cpad * group * tiles), acc)
    y = dev_scratch(dev, X * _wino_plane(Mpad * group * tiles), acc)
    inp, xf = _wino_input_kernel(dev, dt, acc, prm, False, group * C * H * W)
    dwk = programs.get_kernel(dev, "winograd", "clnn_wino_dw", prm)
    dyk = programs.get_kernel(dev, "winograd", "clnn_wino_dy", dict(prm, dyv=dyv))
    wg = min(WINO_WG, dev.facts.max_work_group_size)
    first = True
    for n0 in range(0, N, group):
        g = min(group, N - n0)
        xs, xs_off = _wino_group_x(dev, xf, x, offset(x) + n0 * C * H * W, g * C * H * W)
        for f in phases:
            T = g * f["TH"] * f["TW"]
            vs, ys = _wino_plane(Cpad * T), _wino_plane(Mpad * T)
            if panels:      # channels in panels, tiles (the GEMMs' k) along them
                c_lay, vt_lay = _wino_lay(nwi, T * nwi, 1), _wino_lay(_WHOLE, 0, nwi)
                m_lay, yt_lay = _wino_lay(mwi, T * mwi, 1), _wino_lay(_WHOLE, 0, mwi)
            else:
                c_lay = m_lay = _wino_lay(_WHOLE, 0, T)
                vt_lay = yt_lay = _wino_lay(_WHOLE, 0, 1)
            _wino_input(dev, inp, acc, wg, f, xs, xs_off, g, C, v, vs, c_lay, vt_lay)
            tb, items = _wino_band(dev, wg, g * -(-M // dyv), f["TH"])
            dyk((_round_up(items, wg),), (wg,), M=M, P=f["P"],
                Q=f["Q"], TH=f["TH"], TW=f["TW"], TB=tb, images=g, plane=ys, m_lay=m_lay,
                t_lay=yt_lay, dy=dy, dy_off=offset(dy) + n0 * M * f["out_plane"],
                dy_lay=f["y"], y=y)
            c = Operand(z, 0, C, zs, X)
            if panels:
                run_panels(dev, acc, rows, M=M, N=C, K=T, nbatch=X, a_pk=y, b_pk=v,
                           a_bstride=ys, b_bstride=vs, c=c, beta=0.0 if first else 1.0)
            else:
                run_gemm(dev, acc, M=M, N=C, K=T, nbatch=X, a=Operand(y, 0, T, ys, X),
                         b=Operand(v, 0, T, vs, X), c=c, beta=0.0 if first else 1.0,
                         trans_b=True, rows=rows)
            first = False
    return dwk((_round_up(M * C, wg),), (wg,), M=M, C=C, plane=zs, z=z, dw=out,
               dw_off=offset(out), alpha=alpha, beta=beta)


def _conv2d(x, w, b=None, *, stride=1, padding=0, activation=None, activation_param=None,
            out=None, dilation=(1, 1)):
    dev = common_device(x=x, w=w, b=b, out=out)
    dt = check(x, "x", dev, ndim=4)
    check(w, "w", dev, dtype=dt, ndim=4)
    N, C, H, W, M, R, S, P, Q, st, pd = conv_geometry(x.shape, w.shape, stride, padding,
                                                      offset(x), dilation)
    if b is not None:
        check(b, "b", dev, dtype=dt, shape=(M,))
    act = "none" if activation is None else activation
    act_p = activation_parameter(act, activation_param, dt) if act != "none" \
        else (0.0, 0.0)
    out = check_out(out, (N, M, P, Q), dt, dev, inputs=(x, w, b), allow_alias=False)
    rows = _rows(dev, dt, "fwd", M, N * P * Q, C * R * S)
    p = rows[0]
    dilated = tuple(dilation) != (1, 1)
    if dilated and p["variant"] not in ("gather", "local"):   # the packed CPU GEMM
        return _direct_forward(x, w, b, stride, padding, tuple(dilation), 1, activation,
                               activation_param, out)
    if _winograd(p, C, M, R, S, st, dilation, dt=dt, P=P, Q=Q):
        evt = _run_winograd(dev, dt, p, x=x, N=N, Ci=C, H=H, W=W, Mo=M, ph=pd[0], pw=pd[1],
                            w=w, flip=False, out=out, act=act, act_p=act_p, bias=b,
                            dilation=tuple(dilation))
        return done(out, evt)
    xs = _pointwise(p, R, S, pd, P * Q) and _subsample(dev, dt, x, N, C, H, W, P, Q, st)
    if xs:
        evt = run_gemm(dev, dt, M=M, N=P * Q, K=C, nbatch=N, a=Operand(w, offset(w), C),
                       b=Operand(xs[0], xs[1], P * Q, C * P * Q, N),
                       c=Operand(out, offset(out), P * Q, M * P * Q, N), act=act,
                       act_p=act_p, bias=b, bias_mode="row")
        return done(out, evt)
    if p["variant"] == "gather":
        # dilation is the k steps: tap (r, s) moves by (dh rows, dw columns); a group
        # of images at a time when a 16-bit input's float copy would be large
        per_image = C * (H + 2 * pd[0]) * (W + 2 * pd[1])
        group = _copy_group(dt, N, per_image)
        into = scratch = None
        if group < N:           # every group's buffers are taken before the first write
            into = dev_scratch(dev, group * per_image, programs.acc_dtype(dt))
            # (panels wide enough for either kernel: each group's call picks its own)
            scratch = _gather_scratch(dev, dt, M, C * R * S,
                                      _tiles(p, dt, M, 0)[1], p.get("MB", 4), *_PX_PANELS)
        for n0 in range(0, N, group):
            g = min(group, N - n0)
            xs, ys = (x, out) if g == N else (x[n0:n0 + g], out[n0:n0 + g])
            xg, xg_off, Hg, Wg, phg, pwg, zr = _pad_input(dev, dt, xs, g * C, H, W, *pd,
                                                          into=into)
            evt = _run_gather(dev, dt, p, x=xg, x_off=xg_off, H=Hg, W=Wg, ph=phg, pw=pwg,
                              zero_rows=zr, rows3=(g, P, Q),
                              row_steps=(C * Hg * Wg, st[0], st[1]),
                              k3=(C, R, S), k_steps=(Hg * Wg, dilation[0], dilation[1]),
                              cols=M, src=w,
                              src_off=offset(w), CS=C * R * S, KD=C * R * S, KS=0, flip=0,
                              out=ys, out_steps=(M * P * Q, Q, 1, P * Q), act=act,
                              act_p=act_p, bias=b, scratch=scratch)
        return done(out, evt)
    plan = p["variant"] == "local" and \
        tile_direct_op(dev, dt, "fwd", N, C, M, R, S, st, pd, dilation, engine=p)
    if plan:
        evt = _run_tile_direct(dev, dt, plan, x=x, N=N, Cin=C, H=H, W=W, Mout=M, P=P, Q=Q,
                               R=R, S=S, st=st, pd=pd, w=w, flip=False, out=out, act=act,
                               act_p=act_p, bias=b)
        return done(out, evt)
    if p["variant"] == "local":
        # y (M x NPQ) = w (M x CRS) @ unroll(x) (CRS x NPQ): k = (c, r, s) reads
        # x[n, c, p sh - ph + r dh, q sw - pw + s dw] for column (n, p, q)
        dh, dw = dilation
        evt = _tiled(dev, dt, rows, "fwd", M=M, N=N * P * Q, K=C * R * S,
                     a=Operand(w, offset(w), C * R * S), b=Operand(x, offset(x)),
                     c=Operand(out, offset(out), P * Q), k3=(C, R, S),
                     coef=((H * W, dh * W, dw, 0), (0, dh, 0, 0), (0, 0, dw, 0),
                           (R * S, S, 1, 0)),
                     cols=_colmap((P, Q), (C * H * W, st[0] * W, st[1], -pd[0] * W - pd[1]),
                                  (st[0], -pd[0]), (st[1], -pd[1]), (H, W),
                                  (M * P * Q, Q, 1, 0)),
                     act=act, act_p=act_p, bias=b)
        return done(out, evt)
    evt = run_gemm(dev, dt, M=M, N=N * P * Q, K=C * R * S, nbatch=1, a=Operand(w, offset(w),
                   C * R * S), b=Operand(x, offset(x)), c=Operand(out, offset(out)),
                   act=act, act_p=act_p, bias=b, bias_mode="row", conv="fwd",
                   conv_args=_geometry_args(C, H, W, M, P, Q, R, S, st, pd), params=p)
    return done(out, evt)


def _conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, out=None,
                          dilation=(1, 1)):
    dev = common_device(dy=dy, w=w, out=out)
    dt = check(dy, "dy", dev, ndim=4)
    check(w, "w", dev, dtype=dt, ndim=4)
    N, C, H, W, M, R, S, P, Q, st, pd = conv_geometry(_shape(x_shape, "x_shape"), w.shape,
                                                      stride, padding, 0, dilation)
    if dy.shape != (N, M, P, Q):
        raise ShapeError(f"dy has shape {dy.shape}; this convolution's output is "
                         f"{(N, M, P, Q)}")
    out = check_out(out, (N, C, H, W), dt, dev, inputs=(dy, w), allow_alias=False)
    rows = _rows(dev, dt, "dgrad", C, N * H * W, M * R * S)
    p = rows[0]
    dh, dw = dilation
    eh, ew = dh * (R - 1) + 1, dw * (S - 1) + 1
    flip = p["variant"] == "gather" and st == (1, 1) and pd[0] < eh and pd[1] < ew and \
        p.get("DGRAD", _dgrad_method(C, H, W, M, P, Q, R, S)) == "flip"
    tiled_dilated = p["variant"] == "local" and st == (1, 1)
    if _pointwise(p, R, S, pd, P * Q, N * M * C * P * Q) and st == (1, 1):
        evt = run_gemm(dev, dt, M=C, N=H * W, K=M, nbatch=N, a=Operand(w, offset(w), C),
                       b=Operand(dy, offset(dy), H * W, M * H * W, N),
                       c=Operand(out, offset(out), H * W, C * H * W, N), trans_a=True)
        return done(out, evt)
    if (dh, dw) != (1, 1) and not flip and not tiled_dilated:
        # dilation: the flipped pass below, the GPU loaders' one phase at unit stride,
        # else (col2im, strided phases) the direct kernels
        return _direct_backward_data(dy, w, (N, C, H, W), stride, padding, (dh, dw), 1,
                                     out)
    if flip and _winograd(p, M, C, R, S, st, dilation, dt=dt, P=H, Q=W):
        evt = _run_winograd(dev, dt, p, x=dy, N=N, Ci=M, H=P, W=Q, Mo=C, ph=eh - 1 - pd[0],
                            pw=ew - 1 - pd[1], w=w, flip=True, out=out, dilation=(dh, dw))
        return done(out, evt)
    if flip:
        # at unit stride the data gradient is a forward pass over dy padded by
        # eh - 1 - ph (eh = R undilated), with the filters flipped and their channel
        # axes swapped, taps (dh, dw) apart (a padding of eh or more would make that a
        # crop: col2im handles it)
        dg, dg_off, Hg, Wg, phg, pwg, zr = _pad_input(dev, dt, dy, N * M, P, Q,
                                                      eh - 1 - pd[0], ew - 1 - pd[1])
        evt = _run_gather(dev, dt, p, x=dg, x_off=dg_off, H=Hg, W=Wg, ph=phg, pw=pwg,
                          zero_rows=zr,
                          rows3=(N, H, W), row_steps=(M * Hg * Wg, 1, 1),
                          k3=(M, R, S), k_steps=(Hg * Wg, dh, dw), cols=C, src=w,
                          src_off=offset(w), CS=R * S, KD=R * S, KS=C * R * S, flip=1,
                          out=out, out_steps=(C * H * W, W, 1, H * W))
        return done(out, evt)
    if p["variant"] == "gather":
        if _col2im_rows(dt, R, S, st):
            evt = _dgrad_col2im_rows(dev, dt, dy, w, out, C, H, W, M, P, Q, R, S, st, pd)
        else:
            evt = _dgrad_col2im(dev, dt, p, dy, w, out, C, H, W, M, P, Q, R, S, st, pd)
        return done(out, evt)
    plan = p["variant"] == "local" and \
        tile_direct_op(dev, dt, "dgrad", N, C, M, R, S, st, pd, dilation, engine=p)
    if plan:
        # the flipped forward pass over dy (see the gathered path's "flip" above)
        evt = _run_tile_direct(dev, dt, plan, x=dy, N=N, Cin=M, H=P, W=Q, Mout=C, P=H, Q=W,
                               R=R, S=S, st=st, pd=(R - 1 - pd[0], S - 1 - pd[1]), w=w,
                               flip=True, out=out)
        return done(out, evt)
    if p["variant"] == "local":
        if (dh, dw) != (1, 1):
            evt = _tiled_dgrad(dev, dt, rows, dy, w, out, C, H, W, M, P, Q, R, S, st, pd,
                               (dh, dw))
            return done(out, evt)
        method = _tiled_dgrad_col2im if C < COL2IM_CHANNELS else _tiled_dgrad
        evt = method(dev, dt, rows, dy, w, out, C, H, W, M, P, Q, R, S, st, pd)
        return done(out, evt)
    evt = run_gemm(dev, dt, M=C, N=N * H * W, K=M * R * S, nbatch=1, a=Operand(w, offset(w)),
                   b=Operand(dy, offset(dy)), c=Operand(out, offset(out)), conv="dgrad",
                   conv_args=_geometry_args(C, H, W, M, P, Q, R, S, st, pd), params=p)
    return done(out, evt)


def _conv2d_backward_weight(dy, x, w_shape, *, stride=1, padding=0, out=None, alpha=1.0,
                            beta=0.0, dilation=(1, 1), db=None):
    """dw, and the bias gradient into ``db`` in the same launches where given (only
    where convw.cl takes the layer: fuses_bias_gradient)."""
    dev, dt, g, alpha, beta, out = _wgrad_checked(dy, x, _shape(w_shape, "w_shape"),
                                                  stride, padding, dilation, 1, out,
                                                  alpha, beta)
    N, C, H, W, M, R, S, P, Q, st, pd = g
    rows = _rows(dev, dt, "wgrad", M, C * R * S, N * P * Q)
    p = rows[0]
    if tuple(dilation) != (1, 1) and p["variant"] not in ("gather", "local"):
        return _direct_backward_weight(dy, x, (M, C, R, S), stride, padding,
                                       tuple(dilation), 1, out, alpha, beta)
    if _winograd(p, C, M, R, S, st, dilation, dt=dt, P=P, Q=Q, wgrad=True):
        evt = _run_winograd_wgrad(dev, dt, p, dy=dy, x=x, N=N, C=C, H=H, W=W, M=M, ph=pd[0],
                                  pw=pd[1], out=out, alpha=alpha, beta=beta,
                                  dilation=tuple(dilation))
        return done(out, evt)
    if p["variant"] == "gather":
        xs = _pointwise(p, R, S, pd, P * Q, N * M * C * P * Q) and st != (1, 1) and \
            _subsample(dev, dt, x, N, C, H, W, P, Q, st, x_acc=True, budget=False)
        if xs:      # the strided positions' copy, then a 1x1 weight gradient at unit stride
            (xg, xg_off), Hg, Wg, phg, pwg, zr, st = xs, P, Q, 0, 0, None, (1, 1)
        else:
            xg, xg_off, Hg, Wg, phg, pwg, zr = _pad_input(dev, dt, x, N * C, H, W, *pd)
        rows_plan = _wgrad_rows(p, dev, dt, N, C, M, R, S, P, Q, Hg, Wg, st, dilation,
                                bool(phg or pwg))
        if rows_plan:
            evt = _run_wgrad_rows(dev, dt, rows_plan, x=xg, x_off=xg_off, Hg=Hg, Wg=Wg,
                                  zero_rows=zr, dy=dy, N=N, C=C, M=M, R=R, S=S, P=P, Q=Q,
                                  st=st, dl=tuple(dilation), out=out, alpha=alpha,
                                  beta=beta)
            return done(out, evt)
        # dy^T is packed for a group of images at a time (at most SCRATCH_BYTES), and
        # every group after the first adds its sum into dw
        # (rows are filter taps along lines of S: pixel rows take them when a parameter
        # set forces them, S being shorter than a work-item's positions otherwise)
        px = _pixel_tile(p, dt, M, (C, R, S), (Hg * Wg, dilation[0], dilation[1]),
                         (R * S, S, 1, C * R * S), N * P * Q, padded=bool(phg or pwg),
                         vstore=False)
        # every group after the first adds its sum into dw, which rounds: the groups
        # come from the constant SCRATCH_BYTES, not the budget, so the bits do not
        # depend on the budget; and all scratch is taken before the first write
        # and the group's input and packed dy^T at most half the cache: rows first,
        # every row block re-reads its panel and every panel the input (with the input
        # alone bounded, the stem's weight gradient took 12.8 ms instead of 11.4 and
        # the 1x1 stride-2 projection's 48.7 instead of 44.3 on the Zen 4)
        acc = programs.acc_dtype(dt).itemsize
        x_image = C * Hg * Wg * acc

        def images(nwi):            # per group, with panels of nwi columns
            per_image = -(-M // nwi) * nwi * P * Q * acc
            cached = dev.facts.cache_size // 2 // (x_image + per_image) \
                if dev.facts.cache_size else N
            return max(1, min(N, SCRATCH_BYTES // per_image, cached))

        # the streamed panels' tile, where a group's sums are long enough for it
        tile = None if px else _wgrad_tile(p, dt, M, C * R * S, N * P * Q,
                                           dev.facts.compute_units)
        if tile and not _wgrad_tile(p, dt, M, C * R * S, images(tile[1]) * P * Q,
                                    dev.facts.compute_units):
            tile = None
        nwi = px[0] if px else tile[1] if tile else \
            _tiles(p, dt, M, 0, vectors=WGRAD_VECTORS)[1]
        group = images(nwi)
        if not px:                  # groups whose panels stay in a core's L2
            mwi = tile[0] if tile else _tiles(p, dt, M, S if dilation[1] == 1 else 0,
                                              N * P * Q, vectors=WGRAD_VECTORS)[0]
            group = _l2_group(dev, dt, group, P * Q * nwi, -(-(C * R * S) // mwi))
        scratch = _gather_scratch(dev, dt, M, group * P * Q, nwi)
        for n0 in range(0, N, group):
            g = min(group, N - n0)
            evt = _run_gather(dev, dt, p, x=xg, x_off=xg_off + n0 * C * Hg * Wg, H=Hg, W=Wg,
                              ph=phg, pw=pwg, zero_rows=zr, rows3=(C, R, S),
                              row_steps=(Hg * Wg, dilation[0], dilation[1]), k3=(g, P, Q),
                              k_steps=(C * Hg * Wg, st[0], st[1]), cols=M, src=dy,
                              src_off=offset(dy) + n0 * M * P * Q, CS=P * Q, KD=P * Q,
                              KS=M * P * Q, flip=0, out=out,
                              out_steps=(R * S, S, 1, C * R * S), alpha=alpha,
                              beta=beta if n0 == 0 else 1.0, scratch=scratch, pixels=px,
                              vectors=WGRAD_VECTORS, tile=tile)
        return done(out, evt)
    if p["variant"] == "local":
        plan = _convw_plan(dev, dt, p, N, C, H, W, M, R, S, P, Q, st, pd, dilation)
        if plan:
            evt = _run_wgrad_direct(dev, dt, plan, dy=dy, x=x, N=N, C=C, H=H, W=W, M=M,
                                    P=P, Q=Q, R=R, S=S, st=st, pd=pd, out=out, alpha=alpha,
                                    beta=beta, db=db)
            return done(out, evt)
        # dw (M x CRS) = dy (M x NPQ) @ unroll(x)^T (NPQ x CRS): k = (n, p, q), column
        # (c, r, s) reads x[n, c, p sh - ph + r dh, q sw - pw + s dw] and A(m, k)
        # dy[n, m, p, q]
        dh, dw = dilation
        evt = _tiled(dev, dt, rows, "wgrad", M=M, N=C * R * S, K=N * P * Q,
                     a=Operand(dy, offset(dy), P * Q), b=Operand(x, offset(x)),
                     c=Operand(out, offset(out), C * R * S), k3=(N, P, Q),
                     coef=((C * H * W, st[0] * W, st[1], -pd[0] * W - pd[1]),
                           (0, st[0], 0, -pd[0]), (0, 0, st[1], -pd[1]),
                           (M * P * Q, Q, 1, 0)),
                     cols=_colmap((R, S), (H * W, dh * W, dw, 0), (dh, 0), (dw, 0), (H, W)),
                     alpha=alpha, beta=beta)
        return done(out, evt)
    evt = run_gemm(dev, dt, M=M, N=C * R * S, K=N * P * Q, nbatch=1, a=Operand(dy, offset(dy)),
                   b=Operand(x, offset(x)), c=Operand(out, offset(out), C * R * S),
                   alpha=alpha, beta=beta, conv="wgrad",
                   conv_args=_geometry_args(C, H, W, M, P, Q, R, S, st, pd), params=p)
    return done(out, evt)


# ------------------------------------------------------------ the public ops: PyTorch's
# options, unbatched (C, H, W) arrays and empty batches, then the routines above

def _options(name, w_shape, stride, padding, dilation, groups):
    """(padding, dilation pair, groups, direct): PyTorch's options checked, and
    whether the direct kernels (convd.cl: groups, or an odd "same" padding) run the
    call; the implicit GEMMs take dilation themselves."""
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, (bool, np.bool_)) \
            or groups < 1:
        raise ArgumentError(f"{name}: groups must be a positive int, got {groups!r}")
    groups = int(groups)
    dl = pair(dilation, "dilation", 1)
    padding = _padding(name, w_shape, stride, padding, dl)
    direct = groups != 1 or isinstance(padding, _Uneven)
    return padding, dl, groups, direct


def _padding(name, w_shape, stride, padding, dl):
    if isinstance(padding, str):
        if padding == "valid":
            return 0
        if padding != "same":
            raise ArgumentError(f"{name}: padding must be ints, 'valid' or 'same', got "
                                f"{padding!r}")
        if pair(stride, "stride", 1) != (1, 1):
            raise ArgumentError(f"{name}: padding='same' needs stride 1 (as in PyTorch)")
        R, S = _shape(w_shape, "w_shape")[2:] if len(w_shape) == 4 else (1, 1)
        eh, ew = dl[0] * (R - 1), dl[1] * (S - 1)         # the padding 'same' needs
        if eh % 2 or ew % 2:
            # one more row (column) at the bottom (right), as PyTorch pads
            return _Uneven((eh // 2, ew // 2), (eh % 2, ew % 2))
        return (eh // 2, ew // 2)
    return padding


class _Uneven:
    """padding="same" with an odd total: ``top_left`` on both sides plus ``extra`` at
    the bottom and right. The direct kernels take it (they check every tap's bounds and
    are given the output size); the implicit GEMMs' padded copies are symmetric."""

    def __init__(self, top_left, extra):
        self.top_left, self.extra = top_left, extra


def _four(a, name):
    """A (C, H, W) array as the view (1, C, H, W); 4-D arrays as they are."""
    if a is None or not hasattr(a, "ndim") or a.ndim != 3:
        return a
    if not a.flags.c_contiguous:
        raise ShapeError(f"{name} must be C-contiguous")
    return a.reshape((1,) + tuple(a.shape))


@memoized
def conv2d(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, activation=None,
           activation_param=None, out=None):
    """y = activation(conv(x, w) + b), x (N, C, H, W), w (M, C / groups, R, S) ->
    y (N, M, P, Q), PyTorch's conv2d.

    ``stride``, ``padding`` and ``dilation`` are ints or (h, w) pairs; ``padding`` also
    "valid" or "same" (stride 1; an odd total pads the bottom and right one more, as
    PyTorch does, and runs the direct kernels). ``groups`` splits the channels
    into groups convolved separately (groups = C: depthwise). An unbatched x (C, H, W)
    gives y (M, P, Q), a batch of 0 an empty y. Dilation is the k steps of the
    implicit-GEMM loaders (CPU and GPU); grouped convolutions run direct kernels
    (convd.cl). Overwrites ``out``.
    """
    padding, dl, groups, direct = _options("conv2d", getattr(w, "shape", ()), stride,
                                           padding, dilation, groups)
    unbatched = getattr(x, "ndim", 0) == 3
    x4, o4 = _four(x, "x"), _four(out, "out") if unbatched else out
    if direct or (getattr(x4, "ndim", 0) == 4 and x4.shape[0] == 0):
        y = _direct_forward(x4, w, b, stride, padding, dl, groups, activation,
                            activation_param, o4)
    else:                 # the implicit GEMM (dilated: CPU loaders, else direct)
        y = _conv2d(x4, w, b, stride=stride, padding=padding, activation=activation,
                    activation_param=activation_param, out=o4, dilation=dl)
    return y.reshape(y.shape[1:]) if unbatched and out is None else (out if unbatched else y)


@memoized
def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1,
                         out=None):
    """dx = dL/dx for y = conv2d(x, w): dy (N, M, P, Q), w (M, C / groups, R, S) -> dx
    x_shape (unbatched (C, H, W) too). Overwrites ``out``."""
    padding, dl, groups, direct = _options("conv2d_backward_data", getattr(w, "shape", ()),
                                           stride, padding, dilation, groups)
    shape = _shape(x_shape, "x_shape")
    unbatched = len(shape) == 3
    if unbatched:
        shape = (1,) + shape
        dy, out4 = _four(dy, "dy"), _four(out, "out")
    else:
        out4 = out
    if direct or (len(shape) == 4 and shape[0] == 0):
        dx = _direct_backward_data(dy, w, shape, stride, padding, dl, groups, out4)
    else:
        dx = _conv2d_backward_data(dy, w, shape, stride=stride, padding=padding, out=out4,
                                   dilation=dl)
    return dx.reshape(dx.shape[1:]) if unbatched and out is None else \
        (out if unbatched else dx)


@memoized
def conv2d_backward_weight(dy, x, w_shape, *, stride=1, padding=0, dilation=1, groups=1,
                           out=None, alpha=1.0, beta=0.0, db=None):
    """dw = alpha * dL/dw + beta * out for y = conv2d(x, w): dy (N, M, P, Q), x (N, C, H, W)
    (or unbatched (M, P, Q) and (C, H, W)), dw of ``w_shape`` (M, C / groups, R, S).

    With the defaults it overwrites ``out``; ``alpha = -lr/batch, beta = momentum`` makes
    it the update step of a training loop, as for dense layers. A batch of 0 gives
    dw = beta * out.

    ``db``, an (M,) array, also gets the bias gradient, alpha * dy summed over the
    batch and positions + beta * db (``bias_grad``'s): in the weight gradient's own
    launches where the GPU path sums from images in local memory (convw.cl: LeNet's
    layers; ``fuses_bias_gradient`` says where). Elsewhere bias_grad sums it into a
    temporary first and a copy (an axpy where beta is not 0) writes db last, so that
    an allocation failure leaves both outputs as they were (a network, which calls
    bias_grad itself there, saves the copy).
    """
    w_shape = _shape(w_shape, "w_shape")
    padding, dl, groups, direct = _options("conv2d_backward_weight", w_shape, stride,
                                           padding, dilation, groups)
    if db is not None:        # (checked before anything is enqueued)
        dev = common_device(dy=dy, x=x, out=out, db=db)
        dt = check(dy, "dy", dev)
        db = check_out(db, w_shape[:1], dt, dev, inputs=(dy, x, out), name="db",
                       allow_alias=False)
    if getattr(x, "ndim", 0) == 3:
        x, dy = _four(x, "x"), _four(dy, "dy")
    direct = direct or (getattr(x, "ndim", 0) == 4 and x.shape[0] == 0)
    fused, part = False, None
    if db is not None:
        # (the weight gradient's own checks first: a bad argument must not get as far
        # as bias_grad's launches; out allocated here where not given, which the
        # routine then takes as given)
        out = _wgrad_checked(dy, x, w_shape, stride, padding, dl, groups, out, alpha,
                             beta, direct)[-1]
        fused = not direct and fuses_bias_gradient(dy, x.shape, w_shape, stride=stride,
                                                   padding=padding, dilation=dl)
        if not fused:
            part = bias_grad.unplanned(dy, alpha=alpha)
    if direct:
        dw = _direct_backward_weight(dy, x, w_shape, stride, padding, dl, groups, out,
                                     alpha, beta)
    else:
        # (fused: the routine's own choice of convw.cl, made by the same _convw_plan)
        dw = _conv2d_backward_weight(dy, x, w_shape, stride=stride, padding=padding,
                                     out=out, alpha=alpha, beta=beta, dilation=dl,
                                     db=db if fused else None)
    if part is not None:              # db written last, by kernels that allocate nothing
        if beta == 0:
            copy(part, out=db)
        else:
            axpy.unplanned(beta, db, part, out=db)
    return dw


def _wgrad_checked(dy, x, w_shape, stride, padding, dl, groups, out, alpha, beta,
                   direct=False):
    """The checks of conv2d_backward_weight's routines (the direct kernels' where
    ``direct``, else the implicit GEMMs'), all before anything is enqueued: (device,
    dtype, geometry, alpha, beta, out), the geometry conv_geometry's or
    direct_geometry's, ``out`` checked (check_out), or allocated where None."""
    dev = common_device(dy=dy, x=x, out=out)
    dt = check(dy, "dy", dev, ndim=4)
    check(x, "x", dev, dtype=dt, ndim=4)
    g = direct_geometry(x.shape, w_shape, stride, padding, dl, groups) if direct else \
        conv_geometry(x.shape, w_shape, stride, padding, offset(x), dl)
    N, M, P, Q = g[0], g[4], g[7], g[8]          # (the same places in both)
    if tuple(dy.shape) != (N, M, P, Q):
        raise ShapeError(f"dy has shape {dy.shape}; this convolution's output is "
                         f"{(N, M, P, Q)}")
    alpha, beta = finite(alpha, "alpha", dt), finite(beta, "beta", dt)
    if out is None and beta != 0:
        raise ShapeError("beta != 0 reads out: pass the out array")
    out = check_out(out, w_shape, dt, dev, inputs=(dy, x), allow_alias=False)
    return dev, dt, g, alpha, beta, out


def fuses_bias_gradient(dy, x_shape, w_shape, *, stride=1, padding=0, dilation=1,
                        groups=1):
    """Whether conv2d_backward_weight(dy, x, w_shape, ..., db=) with an x of ``x_shape``
    sums the bias gradient in the weight gradient's own launches (a layer then leaves it
    out of its activation's backward pass). Reads dy's device and dtype only."""
    w_shape = _shape(w_shape, "w_shape")
    padding, dl, groups, direct = _options("conv2d_backward_weight", w_shape, stride,
                                           padding, dilation, groups)
    if direct or len(x_shape) != 4 or x_shape[0] == 0 or not WGRAD_DIRECT:
        return False
    dev, dt = device_of(dy), np.dtype(dy.dtype)
    N, C, H, W, M, R, S, P, Q, st, pd = conv_geometry(tuple(x_shape), w_shape, stride,
                                                      padding, 0, dl)
    p = _rows(dev, dt, "wgrad", M, C * R * S, N * P * Q)[0]
    return _convw_plan(dev, dt, p, N, C, H, W, M, R, S, P, Q, st, pd, dl) is not None


def _convw_plan(dev, dt, p, N, C, H, W, M, R, S, P, Q, st, pd, dl):
    """convw.cl's plan (wgrad_direct) where the weight gradient's routine, given its
    row ``p``, reaches the GPU path's local branch and convw.cl takes the layer; else
    None. The routine and fuses_bias_gradient both ask here, so they agree."""
    if p["variant"] != "local" or _winograd(p, C, M, R, S, st, dl, dt=dt, P=P, Q=Q,
                                            wgrad=True):
        return None
    return wgrad_direct(dev, dt, N, C, H, W, M, R, S, P, Q, st, pd, dl)


# ------------------------------------------------------------ direct kernels (convd.cl)

def direct_geometry(x_shape, w_shape, stride, padding, dilation, groups):
    """(N, C, H, W, M, R, S, P, Q, (sh, sw), (ph, pw), (dh, dw)) of a grouped and
    dilated convolution, PyTorch's rules: w is (M, C / groups, R, S), both C and M
    divide by groups; every index fits a 32-bit int."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ShapeError(f"x must be (N, C, H, W) and w (M, C / groups, R, S); got "
                         f"{tuple(x_shape)} and {tuple(w_shape)}")
    N, C, H, W = x_shape
    M, Cg, R, S = w_shape
    if C % groups or M % groups:
        raise ShapeError(f"groups={groups} must divide the {C} input and {M} output "
                         "channels")
    if Cg != C // groups:
        raise ShapeError(f"w has {Cg} channels per group; x's {C} channels in {groups} "
                         f"groups are {C // groups}")
    extra = (0, 0)
    if isinstance(padding, _Uneven):
        padding, extra = padding.top_left, padding.extra
    (sh, sw), (ph, pw) = pair(stride, "stride", 1), pair(padding, "padding", 0)
    dh, dw = dilation
    if min(C, H, W, M, R, S) < 1 or N < 0:
        raise ShapeError(f"empty convolution: x {tuple(x_shape)}, w {tuple(w_shape)}")
    P, Q, (sh, sw) = _positions(H, W, R, S, (sh, sw), (ph, pw), (dh, dw), extra)
    for what, n in (("the input", N * C * H * W), ("the output", N * M * P * Q),
                    ("the filters", M * Cg * R * S),
                    ("a padded row", (H + 2 * ph + extra[0]) * W),
                    ("the weight gradient's sum", N * P * Q)):
        if n > INT_MAX:
            raise ShapeError(f"{what} of this convolution spans {n} elements; clnn "
                             "indexes with 32-bit ints")
    return N, C, H, W, M, R, S, P, Q, (sh, sw), (ph, pw), (dh, dw)


def _direct_args(N, C, H, W, M, R, S, P, Q, st, pd, dl, groups):
    return dict(N=N, C=C, H=H, W=W, M=M, P=P, Q=Q, R=R, S=S, SH=st[0], SW=st[1], PH=pd[0],
                PW=pd[1], DH=dl[0], DW=dl[1], G=groups)


# The direct kernels' weight gradient: "lanes" (a work-item per weight, its sum in
# vector lanes: CPUs, where a work-group's barriers split PoCL's work-item loop) or
# "tree" (a work-group per weight and a tree in local memory: GPUs); None: by the
# device's type (tests force either)
DIRECT_WGRAD = None


def _direct_wg(dev):
    want = 64 if dev.facts.is_cpu else 256
    while want > dev.facts.max_work_group_size:
        want //= 2
    return want


def _direct_kernel(dev, dt, entry, act="none"):
    return programs.get_kernel(dev, "convd", entry, {"dtype": programs.dtype_name(dt),
                                                     "act": act, "wg": _direct_wg(dev)})


def _direct_forward(x, w, b, stride, padding, dl, groups, activation, activation_param,
                    out):
    dev = common_device(x=x, w=w, b=b, out=out)
    dt = check(x, "x", dev, ndim=4)
    check(w, "w", dev, dtype=dt, ndim=4)
    g = direct_geometry(x.shape, w.shape, stride, padding, dl, groups)
    N, M, P, Q = g[0], g[4], g[7], g[8]
    if b is not None:
        check(b, "b", dev, dtype=dt, shape=(M,))
    act = "none" if activation is None else activation
    act_p = activation_parameter(act, activation_param, dt) if act != "none" \
        else (0.0, 0.0)
    out = check_out(out, (N, M, P, Q), dt, dev, inputs=(x, w, b), allow_alias=False)
    bb = b if b is not None else w
    if out.size == 0:
        return out
    evt = _direct_kernel(dev, dt, "clnn_convd_forward", act)(
                 *launch_size(dev, N * M * P), rows=N * M * P, act_p=act_p[0], act_q=act_p[1],
                 has_bias=int(b is not None), x=x, x_off=offset(x), w=w,
                 w_off=offset(w), b=bb, b_off=offset(bb), y=out, y_off=offset(out),
                 **_direct_args(*g, groups))
    return done(out, evt)


def _direct_backward_data(dy, w, shape, stride, padding, dl, groups, out):
    dev = common_device(dy=dy, w=w, out=out)
    dt = check(dy, "dy", dev, ndim=4)
    check(w, "w", dev, dtype=dt, ndim=4)
    g = direct_geometry(shape, w.shape, stride, padding, dl, groups)
    N, C, H, W, M, P, Q = g[0], g[1], g[2], g[3], g[4], g[7], g[8]
    if tuple(dy.shape) != (N, M, P, Q):
        raise ShapeError(f"dy has shape {dy.shape}; this convolution's output is "
                         f"{(N, M, P, Q)}")
    out = check_out(out, (N, C, H, W), dt, dev, inputs=(dy, w), allow_alias=False)
    if out.size == 0:
        return out
    evt = _direct_kernel(dev, dt, "clnn_convd_backward_data")(
                 *launch_size(dev, N * C * H), rows=N * C * H, dy=dy,
                 dy_off=offset(dy), w=w, w_off=offset(w), dx=out, dx_off=offset(out),
                 **_direct_args(*g, groups))
    return done(out, evt)


def _direct_backward_weight(dy, x, w_shape, stride, padding, dl, groups, out, alpha, beta):
    w_shape = _shape(w_shape, "w_shape")
    dev, dt, g, alpha, beta, out = _wgrad_checked(dy, x, w_shape, stride, padding, dl,
                                                  groups, out, alpha, beta, direct=True)
    if out.size == 0:
        return out
    args = dict(alpha=alpha, beta=beta, dy=dy, dy_off=offset(dy), x=x, x_off=offset(x),
                dw=out, dw_off=offset(out), **_direct_args(*g, groups))
    if (DIRECT_WGRAD or ("lanes" if dev.facts.is_cpu else "tree")) == "lanes":
        # a work-item per weight, its sum in vector lanes
        kern = _direct_kernel(dev, dt, "clnn_convd_backward_weight_lanes")
        evt = kern((-(-out.size // 8) * 8,), (8,), **args)
    else:                         # a work-group per weight, a tree in local memory
        wg = _direct_wg(dev)
        kern = _direct_kernel(dev, dt, "clnn_convd_backward_weight")
        evt = kern((out.size * wg,), (wg,), **args)
    return done(out, evt)
