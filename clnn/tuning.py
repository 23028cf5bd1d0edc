"""Per-device tuning parameters, their constraints, the user's tuning database, and
the override knob.

Tuning data is data: ``GEMM_TABLE`` holds literal parameter sets keyed by exact device
name, then by (vendor, type), then by (type, the floats of the device's native
vectors), then by type, with a "default" at the end of every lookup. Every row is
checked against the kernel's constraints (tests/test_tuning.py), and before a build
the chosen row is checked against the device's real limits.

Lookup order: an ``override`` in force, then the user's database written by
``clnn tune`` (per device name, driver version, dtype and shape class), then the table.
A database entry that is malformed or no longer fits the device is ignored with a
warning, never a crash.
"""

import contextlib
import functools
import json
import os
import stat
import threading
import time
import warnings

import numpy as np

from . import plans, programs
from .errors import ArgumentError

# Variant "reg" (CPU): MWI x NWI outputs per work-item, VW-wide vectors, WGM work-items
# per work-group along M. Variant "local" (GPU): an MWG x NWG tile per work-group of
# MDIMC x NDIMC work-items, KWG deep in local memory.
GEMM_TABLE = {
    # exact device names (tuned on that device). Empty: the CPUs measured so far are
    # served by the "lanes" rows below, which any CPU with the same code gets.
    "device": {},
    # CPUs by the floats of their code's vectors (DeviceFacts.float_lanes: PoCL says
    # 16 where it builds AVX-512 code, 8 for AVX2), the first row whose registers fit
    # the dtype (tuning.spills): 512-bit tiles (VW 16). PoCL 3.0 (pip) on the 2-core
    # Intel Xeon (AVX-512, "rocketlake" code) that PoCL names "Intel(R) Xeon(R)
    # Processor", 2026-11-27, /tmp sweeps of the packed GEMM: float32 8x32 (16 zmm accumulators)
    # 300-330 GFLOP/s at 1024^3, 2048^3 and a dense layer's three products (numpy
    # 340-385), 6x64 and 8x48 within 3% of it, the 256-bit 4x32 that served this CPU
    # before 190-205. 8x32 also suits Winograd's transforms, which write its panels:
    # 32 channels divide the layers' 32 to 512, and dy's runs of 8 channels are one
    # vector (6 x 64: dy's transform 2-3x slower, 32- and 64-channel layers' passes
    # 10-30% slower). Doubles take 6x32 (8 x 4 double8 accumulators would spill):
    # 155-170 (numpy 155-185; 4x32 with double4: 78-84).
    "lanes": {
        ("CPU", 16): [
            {"variant": "reg", "MWI": 8, "NWI": 32, "VW": 16, "WGM": 16, "tuned": True},
            {"variant": "reg", "MWI": 6, "NWI": 32, "VW": 16, "WGM": 16, "tuned": True},
        ],
    },
    # (vendor substring, type)
    "vendor": {
        # NVIDIA: the rows the planner (clnn/plans.py) picks from per shape. "speed" is
        # each row's float32 throughput at 4096^3 relative to the fastest, measured on
        # an H100 (driver 580.159.04, 2026-11-23, benchmarks/README.md): 128x128 tiles
        # for big products, 64x64 with 8x8 per work-item where 128x128 tiles leave
        # units idle (1024^3: 27.6 against 23.3 TFLOP/s), skinny and small tiles for
        # outputs with few rows or columns (10 classes, 6 filters, 3 channels), and
        # split-K where even those leave units idle. 128x128 needs 33 KiB of local
        # memory: more than the 32 KiB the Oclgrind gate simulates, and than some GPUs
        # have; the planner drops rows that do not fit.
        ("nvidia", "GPU"): [
            {"variant": "local", "MWG": 128, "NWG": 128, "KWG": 16, "MDIMC": 8,
             "NDIMC": 32, "VWM": 4, "VWN": 4, "speed": 1.0, "tuned": True},
            {"variant": "local", "MWG": 128, "NWG": 128, "KWG": 16, "MDIMC": 16,
             "NDIMC": 16, "VWM": 4, "VWN": 4, "speed": 0.94, "tuned": True},
            {"variant": "local", "MWG": 128, "NWG": 64, "KWG": 16, "MDIMC": 16,
             "NDIMC": 16, "VWM": 4, "VWN": 4, "speed": 0.85, "tuned": True},
            {"variant": "local", "MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 8,
             "NDIMC": 8, "VWM": 4, "VWN": 4, "speed": 0.93, "tuned": True},
            {"variant": "local", "MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 16,
             "NDIMC": 16, "VWM": 2, "VWN": 2, "speed": 0.75, "tuned": True},
            {"variant": "local", "MWG": 128, "NWG": 32, "KWG": 16, "MDIMC": 32,
             "NDIMC": 8, "VWM": 4, "VWN": 4, "speed": 0.66, "tuned": True},
            {"variant": "local", "MWG": 32, "NWG": 128, "KWG": 16, "MDIMC": 8,
             "NDIMC": 32, "VWM": 4, "VWN": 4, "speed": 0.72, "tuned": True},
            {"variant": "local", "MWG": 16, "NWG": 64, "KWG": 16, "MDIMC": 4,
             "NDIMC": 16, "VWM": 4, "VWN": 4, "speed": 0.61, "tuned": True},
        ],
        # AMD GCN/RDNA (untuned): wavefronts of 64, 256 work-items, 64x64 tiles with
        # 4x4 outputs each keep VGPR use low enough for several waves per CU.
        ("advanced micro devices", "GPU"): {"variant": "local", "MWG": 64, "NWG": 64,
                                            "KWG": 16, "MDIMC": 16, "NDIMC": 16,
                                            "tuned": False},
        ("amd", "GPU"): {"variant": "local", "MWG": 64, "NWG": 64, "KWG": 16,
                         "MDIMC": 16, "NDIMC": 16, "tuned": False},
        # Intel Gen9..Xe (untuned): SIMD8/16 subgroups, 64 KiB SLM per subslice;
        # 128 work-items with 4x4 outputs each.
        ("intel", "GPU"): {"variant": "local", "MWG": 32, "NWG": 64, "KWG": 16,
                           "MDIMC": 8, "NDIMC": 16, "tuned": False},
    },
    # by device type
    "type": {
        # Any CPU (PoCL, Intel's and AMD's CPU runtimes): 6 rows x 16 columns in 12
        # float8 accumulators leaves registers for two B vectors and the broadcast A
        # value on AVX2's 16, like BLIS's AVX2 micro-kernel. 170 GFLOP/s here (n=2048).
        "CPU": {"variant": "reg", "MWI": 6, "NWI": 16, "VW": 8, "WGM": 16, "tuned": False},
        # a generic GPU (untuned): modest tiles that fit 16 KiB of local memory and
        # 256 work-items, the OpenCL 1.2 minimums that every GPU offers.
        "GPU": {"variant": "local", "MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 16,
                "NDIMC": 16, "tuned": False},
    },
    "default": {"variant": "local", "MWG": 32, "NWG": 32, "KWG": 8, "MDIMC": 8,
                "NDIMC": 8, "tuned": False},
}

# Convolutions on CPUs: the gathered kernel of conv.cl (variant "gather"), VW-wide
# vectors, WG work-items per work-group; MWI and NWI follow each problem's shape (see
# clnn/ops/conv.py) unless a parameter set names them, and so do the flags LINE,
# PIXELS, PANELS_FIRST, WINO and WINO_M (3x3 layers at unit stride through winograd.cl's
# F(m x m, 3x3), m = 2 or 4; WINO_CHANNELS and WINO_WGRAD_CHANNELS, the channel counts'
# harmonic mean from which it is taken, else conv.WINO_CHANNELS), and WROWS and
# WROWS_MB (weight gradients as convwr.cl's pixel rows, MB filters a work-item).
# Elsewhere a convolution takes the GEMM row of its device (gemm.cl's loaders).
CONV_TABLE = {
    # exact device names; then CPUs by the floats of their code's vectors, as in
    # GEMM_TABLE
    "device": {},
    "lanes": {
        # AVX-512 code (PoCL on the 2-core Intel Xeon "Intel(R) Xeon(R) Processor";
        # benchmarks/bench_conv.py, forward + both gradients): 3-7x the packed GEMM on
        # LeNet-5's layers at batch 64, 3x on the 56x56x64 layer; WG 1, 4 and 16 within
        # noise on LeNet's C3; 32 vector registers for the tiles, and 512-bit vectors
        # over 128 columns and more (conv.WIDE_COLS: 1.2-1.5x on strided 3x3 and 1x1
        # layers, 2026-11-27). Winograd from a harmonic mean of 26 channels for forward
        # passes and data gradients, 14 for weight gradients (conv._winograd; 36 for
        # both was measured with AVX2 code on a Zen 4): the GEMMs between its
        # transforms run on 512-bit tiles here. Wall ms, gathered / F(4x4), batch 64,
        # 32x32 unless named, 2026-11-28: 32 -> 32 forward 6.6 / 5.5, data gradient
        # 6.0 / 5.3, weight gradient 7.4 / 4.1; 24 -> 32 forward 4.3 / 3.9; 16 -> 64 at
        # 56x56 (25.6) forward 14.7 / 10.7 but data gradient 12.5-13.0 / 13.1-16.9;
        # 20 -> 32 (24.6) 3.4 / 3.8; weight gradients 16 -> 16 2.8 / 2.1, 12 -> 32 (17.5)
        # 3.7 / 3.4, 12 -> 12 1.7 / 1.7, 8 -> 16 (10.7) 1.6 / 1.5 at 28x28 and 1.6 / 1.7
        # at 32x32, 6 -> 32 1.9 / 3.0
        ("CPU", 16): {"variant": "gather", "VW": 16, "WG": 4, "REGS": 32,
                      "WINO_CHANNELS": 26, "WINO_WGRAD_CHANNELS": 14, "tuned": True},
    },
    # GPU rows of gemm.cl's convolution loaders, for the planner: the same tiles as the
    # GEMM rows with "speed" measured on convolutions (an H100, driver 580.159.04,
    # 2026-11-23: kernel times of the 56x56x64, 14x14x256 and stem layers). Gathered
    # loads favour 256 work-items on 64x64 tiles; the 128x128 tiles that win plain
    # GEMMs ran the 56x56x64 forward pass 2.7x slower.
    "vendor": {
        ("nvidia", "GPU"): [
            {"variant": "local", "MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 16,
             "NDIMC": 16, "VWM": 2, "VWN": 2, "speed": 1.0, "tuned": True},
            {"variant": "local", "MWG": 128, "NWG": 64, "KWG": 16, "MDIMC": 16,
             "NDIMC": 16, "VWM": 4, "VWN": 4, "speed": 0.85, "tuned": True},
            {"variant": "local", "MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 8,
             "NDIMC": 8, "VWM": 4, "VWN": 4, "speed": 0.8, "tuned": True},
            {"variant": "local", "MWG": 128, "NWG": 128, "KWG": 16, "MDIMC": 16,
             "NDIMC": 16, "VWM": 4, "VWN": 4, "speed": 0.6, "tuned": True},
            {"variant": "local", "MWG": 128, "NWG": 32, "KWG": 16, "MDIMC": 32,
             "NDIMC": 8, "VWM": 4, "VWN": 4, "speed": 0.7, "tuned": True},
            {"variant": "local", "MWG": 32, "NWG": 128, "KWG": 16, "MDIMC": 8,
             "NDIMC": 32, "VWM": 4, "VWN": 4, "speed": 0.7, "tuned": True},
            {"variant": "local", "MWG": 16, "NWG": 64, "KWG": 16, "MDIMC": 4,
             "NDIMC": 16, "VWM": 4, "VWN": 4, "speed": 0.6, "tuned": True},
        ],
    },
    "type": {
        # Any CPU: AVX2's 8 float lanes, which AVX-512 machines run too, and the 16
        # vector registers AVX2 code has (REGS: what the work-items' tiles may hold,
        # clnn/ops/conv.py). Measured on an AMD EPYC Zen 4, for which PoCL 3.0 builds
        # AVX2 code (bench_conv.py, 2026-11-24): 1.6-1.9x the 32-register tiles on
        # the 56x56x64, 14x14x256 and dilated layers. An AVX-512 target does better
        # with "REGS": 32 (clnn tune conv searches it).
        "CPU": {"variant": "gather", "VW": 8, "WG": 4, "REGS": 16, "tuned": False},
    },
}

# Matrix-engine rows (variant "local" with "MMA"): gemm.cl's tiled kernel whose inner
# product is NVIDIA's mma.sync (inline PTX, compute capability 8.0 and up), a warp per
# WM x WN block of the tile, MDIMC * NDIMC = 32 warps' work-items. A row forced with
# "EMULATE": True runs anywhere, the engine emulated in OpenCL C (slowly): how the
# tests check the kernel's layouts, loaders and epilogue on PoCL and under Oclgrind. "tf32" serves
# float32 only where the user allows TF32 (set_float32_matmul_precision), "f16" serves
# float16 storage (products of halves, sums in float32). "speed" is relative to the
# float32 rows, so the planner prefers them where their tiles fit the shape. Kept
# apart from GEMM_TABLE: no other device may run them (the clang and Oclgrind gates
# walk GEMM_TABLE; the tuner searches engine rows of its own, clnn.tuner.
# engine_candidates, and files winners under "tf32" and "float16").
MMA_TABLE = {
    # measured on an H100 (driver 580.159.04, 2026-11-24, kernel times of square GEMMs
    # at 2048-8192, .gpu experiments described in benchmarks/README.md): TF32 128x128
    # tiles with a 64x64 block per warp ran 105-111 TFLOP/s (the float32 rows: 44),
    # float16 128x256 tiles 93-103
    ("nvidia", "GPU"): [
        # Hopper's warpgroup engines (wgmma.mma_async, compute capability 9.0 only),
        # built through their patched PTX (programs.PTX_PATCH_OPTION). Measured on an
        # H200 (driver 580.159.04, 2026-11-27, kernel times at 8192^3,
        # benchmarks/bench_engines.py --wgmma-only; cuBLAS in the same run: float16
        # 691 TFLOP/s, TF32 391): 128x128 tiles, one warpgroup per 64 x 128 block, 3
        # cp.async stages of swizzled K-major tiles, in bands of 16 tile rows, ran
        # float16 467 TFLOP/s and TF32 251 with both operands K-major (NT: a dense
        # layer's forward pass), against 280 and 135 for the best mma.sync rows; with B
        # stored along n (NN) only 238 and 128, so they serve K-major products only
        # (KMAJOR) and the mma.sync rows the rest. First here: engine_rows' emulated
        # lists and wgmma_fallback take the kinds' last rows, mma.sync tiles.
        {"variant": "local", "MMA": "f16", "MWG": 128, "NWG": 128, "KWG": 32,
         "MDIMC": 16, "NDIMC": 16, "WM": 64, "WN": 128, "ASYNC": 3, "WGMMA": True,
         "WGSWZ": True, "GROUPM": 16, "KMAJOR": True, "speed": 10.6, "tuned": True},
        {"variant": "local", "MMA": "tf32", "MWG": 128, "NWG": 128, "KWG": 16,
         "MDIMC": 16, "NDIMC": 16, "WM": 64, "WN": 128, "ASYNC": 3, "WGMMA": True,
         "WGSWZ": True, "GROUPM": 16, "KMAJOR": True, "speed": 5.7, "tuned": True},
        {"variant": "local", "MMA": "tf32", "MWG": 128, "NWG": 128, "KWG": 16,
         "MDIMC": 8, "NDIMC": 16, "WM": 64, "WN": 64, "speed": 2.4, "tuned": True},
        {"variant": "local", "MMA": "tf32", "MWG": 64, "NWG": 128, "KWG": 16,
         "MDIMC": 8, "NDIMC": 16, "WM": 32, "WN": 64, "speed": 2.1, "tuned": True},
        {"variant": "local", "MMA": "tf32", "MWG": 64, "NWG": 64, "KWG": 16,
         "MDIMC": 8, "NDIMC": 16, "WM": 32, "WN": 32, "speed": 1.6, "tuned": True},
        {"variant": "local", "MMA": "f16", "MWG": 128, "NWG": 256, "KWG": 16,
         "MDIMC": 16, "NDIMC": 16, "WM": 64, "WN": 64, "speed": 2.3, "tuned": True},
        {"variant": "local", "MMA": "f16", "MWG": 128, "NWG": 128, "KWG": 32,
         "MDIMC": 8, "NDIMC": 16, "WM": 64, "WN": 64, "speed": 2.0, "tuned": True},
        {"variant": "local", "MMA": "f16", "MWG": 64, "NWG": 64, "KWG": 32,
         "MDIMC": 8, "NDIMC": 16, "WM": 32, "WN": 32, "speed": 1.5, "tuned": True},
        # measured on an H200 (driver 580.159.04, 2026-11-27, kernel times of square
        # GEMMs at 4096 and 8192, benchmarks/bench_engines.py --each-row): the same
        # float16 tiles with ldmatrix fragments (LDSM) and cp.async tile pipelines
        # (ASYNC) ran 271-280 (128x128x32, 2 stages), 175-184 (128x256x16) and 155-168
        # TFLOP/s (64x64x32, 3 stages), against 90-101 for the rows above. Where an
        # operand allows no copy (a convolution's gathered operand, halves one at a
        # time) they load through registers as LDSM rows: 85-110, still no slower.
        # Left out: 64x128x32 with 32x64 warp blocks, 3 stages (210 at 8192^3), with
        # which the GPU suite's awkward sizes crashed the process (a segmentation fault
        # reading the result back) on the H200; correct emulated and under Oclgrind,
        # cause not found (benchmarks/README.md, "cp.async and ldmatrix on an H200")
        {"variant": "local", "MMA": "f16", "MWG": 128, "NWG": 128, "KWG": 32,
         "MDIMC": 8, "NDIMC": 16, "WM": 64, "WN": 64, "LDSM": True, "ASYNC": 2,
         "speed": 6.2, "tuned": True},
        {"variant": "local", "MMA": "f16", "MWG": 128, "NWG": 256, "KWG": 16,
         "MDIMC": 16, "NDIMC": 16, "WM": 64, "WN": 64, "LDSM": True, "ASYNC": 2,
         "speed": 4.0, "tuned": True},
        {"variant": "local", "MMA": "f16", "MWG": 64, "NWG": 64, "KWG": 32,
         "MDIMC": 8, "NDIMC": 16, "WM": 32, "WN": 32, "LDSM": True, "ASYNC": 3,
         "speed": 3.6, "tuned": True},
    ],
}

# A narrow float16 tile for products with few rows: one warp row of m16 fragments, 4
# warps of 16x32 (LeNet's float16 convolutions multiply 6 or 16 filters, and 6
# channels in a data gradient, by 10^5-10^6 columns; the 64-row tiles discard 90% (75%)
# of their engine work on them, this one 60% (none)). In the table from 2026-11-27
# untimed, on an estimated speed (the 64x64x32 row's 3.6 halved) and for products of at
# most 32 rows (MAXM). Timed on an H200 the same day (benchmarks/bench_half.py
# --engine-rows all,tuned, two runs) it made LeNet-5's float16 steps slower: at batch
# 1024 replayed 1.48 and 1.65 ms with it against 1.22 and 1.31 without, at batch 64
# 0.65 and 0.63 against 0.69 and 0.58; alone at 8192^3 it ran 77 TFLOP/s, the 64x64x32
# row 156. Out of the table since; kept for an override and for the tests of a tile of
# one fragment row.
NARROW_F16 = {"variant": "local", "MMA": "f16", "MWG": 16, "NWG": 128, "KWG": 32,
              "MDIMC": 8, "NDIMC": 16, "WM": 16, "WN": 32, "LDSM": True, "ASYNC": 3,
              "speed": 1.8, "MAXM": 32, "tuned": False}

# Candidates for Hopper's warpgroup engines (WGMMA: wgmma.mma_async, compute capability
# 9.0): written without a GPU (2026-11-27), checked emulated on PoCL and assembled by
# ptxas for sm_90a (tests/test_ptx.py); benchmarks/bench_engines.py --wgmma checks each
# on the GPU first, with the descriptors' two offsets read either way (WGSWAP and
# WGSWAPT: an H200 reads them as documented), then times each. MMA_TABLE holds the
# timed winners (for K-major products); the tuner does not search them. A warpgroup
# of 128 work-items per WM x WN block, tiles through a cp.async
# pipeline of ASYNC stages in the core-matrix layout (gemm.cl), 48 KiB at most; with
# WGWAIT 1 a step's wgmma's still run while the next step's are issued; with WGSWZ
# the K-major tiles swizzled (rows of 64 or 128 bytes), as CUTLASS lays them
WGMMA_CANDIDATES = {
    "f16": [dict(MWG=128, NWG=128, KWG=32, WM=64, WN=128, ASYNC=2),
            dict(MWG=128, NWG=128, KWG=32, WM=64, WN=128, ASYNC=3),
            dict(MWG=128, NWG=256, KWG=32, WM=64, WN=256, ASYNC=2),
            dict(MWG=64, NWG=128, KWG=64, WM=64, WN=128, ASYNC=2),
            dict(MWG=128, NWG=128, KWG=32, WM=64, WN=128, ASYNC=3, WGWAIT=1),
            dict(MWG=128, NWG=128, KWG=32, WM=64, WN=128, ASYNC=2, WGSWZ=True),
            dict(MWG=128, NWG=128, KWG=32, WM=64, WN=128, ASYNC=3, WGSWZ=True),
            dict(MWG=64, NWG=128, KWG=64, WM=64, WN=128, ASYNC=2, WGSWZ=True)],
    "tf32": [dict(MWG=128, NWG=128, KWG=16, WM=64, WN=128, ASYNC=2),
             dict(MWG=128, NWG=128, KWG=16, WM=64, WN=128, ASYNC=3),
             dict(MWG=128, NWG=256, KWG=16, WM=64, WN=256, ASYNC=2),
             dict(MWG=128, NWG=128, KWG=16, WM=64, WN=128, ASYNC=3, WGWAIT=1),
             dict(MWG=128, NWG=128, KWG=16, WM=64, WN=128, ASYNC=2, WGSWZ=True),
             dict(MWG=128, NWG=128, KWG=16, WM=64, WN=128, ASYNC=3, WGSWZ=True),
             dict(MWG=64, NWG=128, KWG=32, WM=64, WN=64, ASYNC=2, WGSWZ=True)],
}


def wgmma_rows(kind, **extra):
    """WGMMA_CANDIDATES of ``kind`` as full rows (``extra``: EMULATE, WGSWAP, ...)."""
    out = []
    for e in WGMMA_CANDIDATES[kind]:
        threads = 128 * (e["MWG"] // e["WM"]) * (e["NWG"] // e["WN"])
        out.append(dict({"variant": "local", "MMA": kind, "MDIMC": threads // 16,
                         "NDIMC": 16, "WGMMA": True}, **e, **extra))
    return out


_KEYS = {"reg": ("MWI", "NWI", "VW", "WGM"),
         "local": ("MWG", "NWG", "KWG", "MDIMC", "NDIMC"),
         "gather": ("VW", "WG")}
# parameters a row may leave out, with their defaults
_OPTIONAL = {"local": {"VWM": 1, "VWN": 1}}
# parameters passed to the template only when a row has them
_EXTRA = {"local": ("MMA", "WM", "WN", "EMULATE", "LDSM", "ASYNC", "WGMMA", "WGSWAP",
                   "WGSWAPT", "WGWAIT", "EAGER", "GROUPM", "WGSWZ", "TF32T")}
MMA_KINDS = {"tf32": (8, 4), "f16": (16, 2)}      # K of one mma.sync, the item size it serves


# Ranges of the integer tile parameters: outside them a kernel would not fit any
# device's registers (or would take minutes to compile: MWI 400), so a tuning entry
# or override with one is refused up front.
_RANGES = {"MWI": 32, "NWI": 128, "VW": 16, "WG": 1024, "WGM": 1024, "MWG": 256,
           "NWG": 256, "KWG": 64, "MDIMC": 64, "NDIMC": 64, "VWM": 4, "VWN": 4,
           "KSPLIT": 64, "GROUPM": 64, "WM": 128, "WN": 256, "REGS": 64, "QV": 4, "MB": 16,
           "WROWS_MB": 8, "MAXM": 1 << 30, "WINO_CHANNELS": 1 << 16,
           "WINO_WGRAD_CHANNELS": 1 << 16}


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def gemm_problems(p, facts=None, itemsize=4):
    """Why the GEMM parameter set ``p`` is invalid (for ``facts``' device), or []."""
    if not isinstance(p, dict):
        return ["not a parameter set"]
    variant = p.get("variant")
    if not isinstance(variant, str) or variant not in _KEYS:
        return [f"unknown variant {variant!r}"]
    missing = [k for k in _KEYS[variant] if not _is_int(p.get(k)) or p[k] < 1]
    if missing:
        return [f"missing or non-positive {', '.join(missing)}"]
    bad = [f"{k}={p[k]!r}" for k in _RANGES if k in p and
           not (_is_int(p[k]) and 1 <= p[k] <= _RANGES[k])]
    if bad:
        return [f"out of range or not an int: {', '.join(bad)} (limits: "
                + ", ".join(f"{k} <= {_RANGES[k]}" for k in _RANGES if k in p) + ")"]
    if "GROUPM" in p and variant != "local":
        return ["GROUPM (tiles in bands of rows) orders the tiles of local rows"]
    for flag in ("LINE", "PIXELS", "PANELS_FIRST", "WINO", "WROWS"):
        if flag in p and not isinstance(p[flag], bool):
            return [f"{flag} must be true or false"]
    probs = []
    if variant == "gather":
        if p["VW"] not in (1, 2, 4, 8, 16):
            probs.append("VW must be 1, 2, 4, 8 or 16")
        elif isinstance(p.get("NWI"), int) and p["NWI"] % p["VW"]:
            probs.append("NWI must be a multiple of VW")
        if p.get("DGRAD", "col2im") not in ("col2im", "flip"):
            probs.append("DGRAD must be 'col2im' or 'flip'")
        if p.get("WINO_M", 4) not in (2, 4):
            probs.append("WINO_M (a Winograd tile's outputs per side) must be 2 or 4")
        if "REGS" in p and p["REGS"] < 8:
            probs.append("REGS (vector registers for a work-item's tile) must be at "
                         "least 8")
        wg = p["WG"]
        local_bytes = 0
    elif variant == "reg":
        if p["VW"] not in (1, 2, 4, 8, 16):
            probs.append("VW must be 1, 2, 4, 8 or 16")
        if p["NWI"] % p["VW"]:
            probs.append("NWI must be a multiple of VW")
        if p["MWI"] * _b_vectors(p, itemsize) > 32:
            probs.append("more than 32 vector accumulators spill registers")
        wg = p["WGM"]
        local_bytes = 0
    else:
        vwm, vwn = p.get("VWM", 1), p.get("VWN", 1)
        if vwm not in (1, 2, 4) or vwn not in (1, 2, 4):
            probs.append("VWM and VWN must be 1, 2 or 4")
        elif p["MWG"] % (p["MDIMC"] * vwm) or p["NWG"] % (p["NDIMC"] * vwn):
            probs.append("MWG and NWG must be multiples of MDIMC * VWM and NDIMC * VWN")
        wg = p["MDIMC"] * p["NDIMC"]
        if wg % p["NWG"] and p["NWG"] % wg:
            probs.append("NWG must divide, or be a multiple of, MDIMC * NDIMC (the "
                         "convolution loaders give each work-item whole columns)")
        top = 16 if "MMA" in p else 1
        if "speed" in p and not (isinstance(p["speed"], (int, float)) and
                                 not isinstance(p["speed"], bool) and 0 < p["speed"] <= top):
            probs.append(f"speed (relative throughput for the planner) must lie in (0, {top}]")
        if wg > 1024:
            probs.append(f"a work-group of MDIMC * NDIMC = {wg} exceeds 1024")
        if "MMA" in p:
            probs += _mma_problems(p, facts, itemsize)
        elif "LDSM" in p or "ASYNC" in p or "WGMMA" in p:
            probs.append("LDSM, ASYNC and WGMMA serve matrix-engine rows (MMA)")
        local_bytes = plans.local_bytes(p, itemsize)
    if facts is not None:
        if variant != "local" and facts.is_cpu and 8 < p["VW"] > facts.float_lanes:
            # PoCL 3.0 builds AVX2 code for some AVX-512 CPUs (a Zen 4), where 512-bit
            # vectors in a program changed its ABI and broke later builds (CPU_LANES)
            probs.append(f"VW={p['VW']} (512-bit vectors) needs a CPU whose code has "
                         f"them; this one's has {facts.float_lanes} float lanes")
        if wg > facts.max_work_group_size:
            probs.append(f"work-group of {wg} exceeds the device's {facts.max_work_group_size}")
        if variant == "local" and wg > facts.max_work_item_sizes[0]:
            probs.append("the work-group exceeds the device's work-item sizes")
        if local_bytes > facts.local_mem_size:
            probs.append(f"{local_bytes} bytes of local memory exceed the device's "
                         f"{facts.local_mem_size}")
    return probs


def _b_vectors(p, itemsize):
    """The vectors of B a "reg" row's work-item loads per k (NVW) in elements of
    ``itemsize`` bytes: VW counts float32 lanes, so the same vectors hold half as many
    doubles."""
    return -(-p["NWI"] // (max(1, p["VW"] // 2) if itemsize == 8 else p["VW"]))


def spills(p, itemsize=4):
    """Whether a "reg" row's work-item needs more than a CPU's 32 vector registers in
    this dtype: MWI x NVW accumulators, one k's NVW B vectors and the broadcast A
    value. Such a row is valid, and slow (a table entry's rows that fit come first)."""
    nvw = _b_vectors(p, itemsize)
    return p["MWI"] * nvw + nvw + 1 > 32


def _mma_problems(p, facts, itemsize):
    kind = p["MMA"]
    if kind not in MMA_KINDS:
        return [f"MMA must be one of {', '.join(MMA_KINDS)}, not {kind!r}"]
    ki, size = MMA_KINDS[kind]
    wm, wn = p.get("WM"), p.get("WN")
    if not (_is_int(wm) and _is_int(wn) and wm > 0 and wn > 0):
        return ["an MMA row needs warp blocks WM and WN"]
    probs = []
    for flag in ("WGMMA", "WGSWAP", "WGSWAPT", "EAGER", "WGSWZ", "TF32T", "KMAJOR"):
        if not isinstance(p.get(flag, False), bool):
            probs.append(f"{flag} must be true or false")
    wgmma = p.get("WGMMA") is True
    if wgmma:
        # a warpgroup per WM x WN block, in wgmma tiles of 64 x WN
        if wm % 64 or not 8 <= wn <= 256 or wn % 8 or p["MWG"] % wm or p["NWG"] % wn:
            probs.append("WGMMA blocks: WM a multiple of 64, WN of 8 up to 256, dividing "
                         "MWG and NWG")
        elif p["MDIMC"] * p["NDIMC"] != 128 * (p["MWG"] // wm) * (p["NWG"] // wn):
            probs.append("MDIMC * NDIMC must be 128 work-items (a warpgroup) per WM x WN "
                         "block")
        if p.get("LDSM") or not _is_int(p.get("ASYNC")):
            probs.append("WGMMA rows read their tiles through descriptors from a cp.async "
                         "pipeline (ASYNC), not by ldmatrix (LDSM)")
        if p.get("WGWAIT", 0) not in (0, 1) or isinstance(p.get("WGWAIT"), bool) or \
                (p.get("WGWAIT") and _is_int(p.get("ASYNC")) and p["ASYNC"] < 3):
            probs.append("WGWAIT (wgmma batches left in flight) is 0 or 1, and 1 needs "
                         "ASYNC >= 3")
        if p.get("WGSWZ") is True and p["KWG"] * size not in (32, 64, 128):
            probs.append("WGSWZ (swizzled K-major tiles) needs rows of KWG elements of "
                         "32, 64 or 128 bytes")
        # (sm_90a's instructions: later architectures have engines of their own)
        if facts is not None and facts.nv_compute_capability != 90 and not p.get("EMULATE"):
            probs.append("wgmma needs an NVIDIA GPU of compute capability 9.0 (Hopper) "
                         "(EMULATE: True runs the kernel with the engine emulated, for tests)")
        elif facts is not None and not getattr(facts, "patched_ptx", True) and \
                not p.get("EMULATE"):
            probs.append("this device's driver did not build a WGMMA row's patched PTX "
                         "(programs.PTX_PATCH_OPTION): its mma.sync rows serve instead")
    elif p.get("WGSWAP") or p.get("WGSWAPT") or "WGWAIT" in p or p.get("WGSWZ"):
        probs.append("WGSWAP, WGSWAPT, WGWAIT and WGSWZ serve WGMMA rows")
    elif wm % 16 or wn % 8 or p["MWG"] % wm or p["NWG"] % wn:
        probs.append("WM must be a multiple of 16 and WN of 8, dividing MWG and NWG")
    elif p["MDIMC"] * p["NDIMC"] != 32 * (p["MWG"] // wm) * (p["NWG"] // wn):
        probs.append("MDIMC * NDIMC must be 32 work-items per WM x WN warp block")
    if p["KWG"] % ki:
        probs.append(f"KWG must be a multiple of {ki} for {kind}")
    if p.get("VWM", 1) != 1 or p.get("VWN", 1) != 1:
        probs.append("MMA rows read local memory per fragment: VWM = VWN = 1")
    if itemsize != size:
        probs.append(f"{kind} engines serve {size}-byte elements, not {itemsize}")
    if not isinstance(p.get("LDSM", False), bool):
        probs.append("LDSM must be true or false")
    elif p.get("LDSM") and (kind != "f16" or wn % 16):
        probs.append("LDSM (ldmatrix) serves float16 engines with WN a multiple of 16")
    if "ASYNC" in p and (not _is_int(p["ASYNC"]) or not 2 <= p["ASYNC"] <= 4 or
                         not (p.get("LDSM") or kind == "tf32" or wgmma)):
        probs.append("ASYNC (a cp.async pipeline of 2 to 4 tiles) serves TF32 rows, "
                     "float16 rows with LDSM and WGMMA rows")
    if p.get("TF32T") and (kind != "tf32" or wgmma):
        probs.append("TF32T (operands truncated to TF32, not rounded) serves mma.sync TF32 "
                     "rows (WGMMA rows always truncate)")
    if not isinstance(p.get("EMULATE", False), bool):
        probs.append("EMULATE must be true or false")
    elif p.get("EAGER") and not p.get("EMULATE"):
        probs.append("EAGER (copies landing as they are committed) serves emulated rows")
    elif facts is not None and facts.nv_compute_capability < 80 and not p.get("EMULATE"):
        probs.append("mma.sync needs an NVIDIA GPU of compute capability 8.0 or newer "
                     "(EMULATE: True runs the kernel with the engine emulated, for tests)")
    return probs


# ------------------------------------------------------- float32 matmul precision

PRECISIONS = ("highest", "high", "medium")
PRECISION_ENV = "CLNN_FLOAT32_MATMUL_PRECISION"
_precision = {"value": None}


def set_float32_matmul_precision(precision):
    """PyTorch's switch, with its names: "highest" (the default) computes float32
    GEMMs and convolutions in float32; "high" and "medium" let them use TF32 matrix
    engines (10-bit mantissas in the products, float32 sums) where the device has them
    (NVIDIA, compute capability 8.0 and up) and the planner expects them to be faster
    (a small product may keep a float32 tile); "medium" means what "high" does (clnn
    never rounds float32 operands to bfloat16: bfloat16 is a storage dtype of its
    own). Also set by the environment variable CLNN_FLOAT32_MATMUL_PRECISION, read
    when first needed."""
    if precision not in PRECISIONS:
        raise ArgumentError(f"float32 matmul precision must be one of "
                            f"{', '.join(map(repr, PRECISIONS))}, not {precision!r}")
    _precision["value"] = precision


def get_float32_matmul_precision():
    if _precision["value"] is None:
        env = os.environ.get(PRECISION_ENV, "highest").strip().lower() or "highest"
        if env not in PRECISIONS:
            warnings.warn(f"ignoring {PRECISION_ENV}={env!r}: not one of "
                          f"{', '.join(PRECISIONS)}", RuntimeWarning)
            env = "highest"
        _precision["value"] = env
    return _precision["value"]


def mma_kind(facts, dtype):
    """The matrix engine a GEMM of ``dtype`` may use on ``facts``' device: "f16" for
    16-bit storage (float16, and bfloat16: the same rows and layouts, the instruction's
    operand type .bf16), "tf32" for float32 where the precision allows it, else
    "none"."""
    if facts.nv_compute_capability < 80:
        return "none"
    name = _dtype_name(dtype)
    if name in programs.STORAGE_ONLY:
        return "f16"
    if name == "float32" and get_float32_matmul_precision() != "highest":
        return "tf32"
    return "none"


@functools.lru_cache(maxsize=64)
def mma_rows(facts, kind):
    """MMA_TABLE's rows of ``kind`` for the device's vendor that fit it (a tuple)."""
    if kind == "none":
        return ()
    size = MMA_KINDS[kind][1]
    vendor = facts.vendor.lower()
    for (v, typ), rows in MMA_TABLE.items():
        if v in vendor and typ == facts.type:
            return tuple(r for r in rows if r["MMA"] == kind and
                         not gemm_problems(r, facts, size))
    return ()


def wgmma_fallback(p):
    """The mma.sync row that serves a launch a WGMMA row cannot (a convolution's
    gathered operands, 16-bit operands too unaligned for 4-byte copies): the table's
    last row of the same kind (a timed 64x64 tile; the narrow 16-row tile, smaller,
    sits before it, and the WGMMA rows first), emulated where ``p`` is."""
    row = [r for r in MMA_TABLE[("nvidia", "GPU")] if r["MMA"] == p["MMA"]
           and not r.get("WGMMA")][-1]
    return dict(row, EMULATE=True) if p.get("EMULATE") else dict(row)


@functools.lru_cache(maxsize=64)
def _with_engines(facts, itemsize, kind, conv, kmajor=False):
    """The matrix-engine rows of ``kind`` ahead of the device's tile rows (a convolution's
    vendor rows where ``conv``), one tuple per combination, so the planner's caches see
    the same object every launch. A row with "KMAJOR" serves only products whose A and
    B are both stored along k (``kmajor``: NT, neither a convolution's)."""
    rows = (conv_vendor_rows(facts, itemsize) if conv else ()) or table_rows(facts, itemsize)
    return tuple(r for r in mma_rows(facts, kind)
                 if kmajor and not conv or not r.get("KMAJOR")) + rows


def all_gemm_rows():
    """Every parameter set in GEMM_TABLE (for the clang gate and the table tests)."""
    t = GEMM_TABLE
    entries = (list(t["device"].values()) + list(t["vendor"].values())
               + list(t["lanes"].values()) + list(t["type"].values()) + [t["default"]])
    return [row for e in entries for row in (e if isinstance(e, list) else [e])]


def _lookup_chain(facts):
    """The table's entries for a device, most specific first; an entry is one row or a
    list of rows that the planner chooses from per shape."""
    table = GEMM_TABLE
    chain = []
    if facts.name in table["device"]:
        chain.append(table["device"][facts.name])
    vendor = facts.vendor.lower()
    for (v, typ), p in table["vendor"].items():
        if v in vendor and typ == facts.type:
            chain.append(p)
    if (facts.type, facts.float_lanes) in table["lanes"]:
        chain.append(table["lanes"][(facts.type, facts.float_lanes)])
    if facts.type in table["type"]:
        chain.append(table["type"][facts.type])
    chain.append(table["default"])
    return chain


_override = threading.local()


@contextlib.contextmanager
def override(kernel, params):
    """Force the parameters of ``kernel`` ("gemm") inside a with-block (tests, benchmarks)."""
    stack = getattr(_override, "stack", [])
    _override.stack = stack + [(kernel, dict(params))]
    try:
        yield
    finally:
        _override.stack = stack


def size_bucket(M, N, K, batch=1):
    """"small", "medium" or "large": a GEMM's multiply-adds below 512^3, below 2048^3,
    or above. Tile choices differ most between these (a tile that wins at 384^3 made
    4096^3 run 2.3x slower on an H100), so the tuner tunes and looks up by bucket."""
    work = M * N * K * batch
    return "small" if work < 1 << 27 else "medium" if work < 1 << 33 else "large"


def forced(kernel):
    """The innermost override of a kernel without tile rows ("reduce", "rows"): a dict
    such as {"wg": True} that makes tests and benchmarks take a device type's path on
    another device (the GPU kernels on PoCL, under Oclgrind); None when not forced."""
    for name, params in reversed(getattr(_override, "stack", [])):
        if name == kernel:
            return params
    return None


def shape_class(M, N, K, trans_a=False, trans_b=False, batch=1):
    """The tuning class of a GEMM: transposes, aspect ("square", "tall", "wide") and
    size bucket, e.g. "NT-wide-medium"."""
    t = ("T" if trans_a else "N") + ("T" if trans_b else "N")
    aspect = "tall" if M >= 4 * N else "wide" if N >= 4 * M else "square"
    return f"{t}-{aspect}-{size_bucket(M, N, K, batch)}"


# ---------------------------------------------------------------- the user's database

def db_path():
    """Where ``clnn tune`` stores its results: CLNN_TUNING_DB, else the user cache."""
    return os.environ.get("CLNN_TUNING_DB") or _user_db_path()


@functools.lru_cache(maxsize=1)
def _user_db_path():
    # asked for on every GEMM launch: platformdirs takes about 10 us to answer
    import platformdirs
    return os.path.join(platformdirs.user_cache_dir("clnn"), "tuning.json")


_db_cache = {"path": None, "mtime": None, "entries": {}, "checked": 0.0, "generation": 0}
DB_MAX_BYTES = 16 << 20      # a database with every class of a hundred devices is ~1 MB
# Every GEMM and convolution looks its class up: the file's modification time is
# looked at once a second at most (a stat per launch was 7 us, 14 of them a LeNet-5
# step); save_db_entries and a new CLNN_TUNING_DB path take effect at once.
DB_RECHECK_S = 1.0


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype):
    if isinstance(dtype, str) and dtype == "tf32":
        return dtype
    return np.dtype(dtype).name         # numpy's dtype.name is 10 us of Python


def db_key(facts, dtype, klass, kernel="gemm"):
    """The database key of a class: ``dtype`` is the storage dtype, or "tf32" for
    float32 products on TF32 engines (tuned and looked up apart from exact float32)."""
    return f"{kernel}|{facts.name}|{facts.driver_version}|{_dtype_name(dtype)}|{klass}"


def db_format(dtype, kind):
    """What db_key files a GEMM of ``dtype`` under when ``kind`` engines run it."""
    return "tf32" if kind == "tf32" else dtype


def _engine_entry(facts, itemsize, dtype, kind, klass):
    """The user's tuned engine row for ``klass`` (``clnn tune`` on a device with matrix
    engines), or None. A bfloat16 class without a bfloat16 entry of its own takes the
    float16 one (``clnn tune`` tunes float16 by default, bfloat16 only when asked): the
    two run the same rows, layouts and loads, and their mma.sync forms the same rate."""
    if klass is None:
        return None
    fmt = db_format(dtype, kind)
    params = _from_db(facts, itemsize, fmt, klass)
    if params is None and kind == "f16" and _dtype_name(fmt) == "bfloat16":
        params = _from_db(facts, itemsize, "float16", klass)
    return params if params is not None and params.get("MMA") == kind else None


def load_db():
    """{key: entry} from the database file (re-read when it changes, looked at once a
    second at most); {} when unusable."""
    path = db_path()
    now = time.monotonic()
    if _db_cache["path"] == path and _db_cache["mtime"] is not None and \
            now - _db_cache["checked"] < DB_RECHECK_S:
        return _db_cache["entries"]
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        if _db_cache["mtime"] != "missing" or _db_cache["path"] != path:
            _db_cache["generation"] += 1
        _db_cache.update(path=path, mtime="missing", entries={}, checked=now)
        return {}
    if _db_cache["path"] == path and _db_cache["mtime"] == mtime:
        _db_cache["checked"] = now
        return _db_cache["entries"]
    try:
        # only a regular file of bounded size: /dev/zero would fill memory, a FIFO
        # would block forever
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > DB_MAX_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than {DB_MAX_BYTES}")
        with open(path, "rb") as f:
            data = json.loads(f.read(DB_MAX_BYTES + 1).decode("utf-8"))
        entries = data["entries"]
        if not isinstance(entries, dict):
            raise ValueError("entries is not a mapping")
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError,
            RecursionError) as exc:
        warnings.warn(f"ignoring the tuning database {path}: {exc}", RuntimeWarning)
        entries = {}
    _db_cache.update(path=path, mtime=mtime, entries=entries, checked=now,
                     generation=_db_cache["generation"] + 1)
    return entries


def db_generation():
    """A number that changes whenever load_db's answer may have (another file or
    path, new contents): what op plans made from rows read from it key on
    (clnn/ops/_memo.py)."""
    load_db()
    return _db_cache["generation"]


def save_db_entries(new_entries):
    """Merge ``new_entries`` into the database file, atomically."""
    path = db_path()
    entries = dict(load_db())
    entries.update(new_entries)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"version": 1, "entries": entries}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    _db_cache["mtime"] = None
    return path


def _from_db(facts, itemsize, dtype, klass):
    entry = load_db().get(db_key(facts, dtype, klass))
    if entry is None:
        return None
    params = entry.get("params") if isinstance(entry, dict) else None
    probs = ["not a parameter set"] if not isinstance(params, dict) else \
        gemm_problems(params, facts, itemsize)
    if probs:
        warnings.warn(f"ignoring stale tuning entry for {facts.name} {klass}: "
                      + "; ".join(probs) + " (run clnn tune again)", RuntimeWarning)
        return None
    return params


def _overridden(kernels, facts, itemsize):
    """The innermost override in force for any of ``kernels``, checked; or None."""
    for kernel, params in reversed(getattr(_override, "stack", [])):
        if kernel in kernels:
            probs = gemm_problems(params, facts, itemsize)
            if kernel == "gemm" and params.get("variant") == "gather":
                probs.append("gather is a convolution variant (override 'conv')")
            if probs:
                raise ArgumentError(f"{kernel} override {params} is invalid here: "
                                    + "; ".join(probs))
            return params
    return None


def gemm_rows(facts, itemsize=4, dtype="float32", klass=None):
    """The GEMM parameter sets to choose from for a device and shape class: the
    override, else the user's database entry for ``klass`` (see shape_class), else
    the rows of the first table entry that has rows fitting the device."""
    params = _overridden(("gemm",), facts, itemsize)
    if params is not None:
        return [params]
    kind = mma_kind(facts, dtype)
    if mma_rows(facts, kind):
        # the user's tuned engine row for the class, else the engine rows and the
        # table's, which the planner weighs per shape (an exact-float32 entry of the
        # class does not serve a TF32 product)
        params = _engine_entry(facts, itemsize, dtype, kind, klass)
        return [params] if params is not None else _with_engines(
            facts, itemsize, kind, False, klass is not None and klass.startswith("NT-"))
    if klass is not None:
        params = _from_db(facts, itemsize, dtype, klass)
        if params is not None and params.get("variant") != "gather":
            return [params]
    return table_rows(facts, itemsize)


@functools.lru_cache(maxsize=64)
def table_rows(facts, itemsize=4):
    """The rows of the first table entry for ``facts`` that has rows fitting the device,
    as a tuple (asked for on every launch: checking each row takes 5 us). Emptied by
    clnn.clear_caches(), e.g. after a change to GEMM_TABLE."""
    for entry in _lookup_chain(facts):
        rows = [r for r in (entry if isinstance(entry, list) else [entry])
                if not gemm_problems(r, facts, itemsize)]
        if rows:
            # CPU rows whose tile fits the registers in this dtype first (doubles take
            # twice the vectors: GEMM_TABLE["lanes"])
            return tuple(sorted(rows, key=lambda r: r["variant"] == "reg" and
                                spills(r, itemsize)))
    # The OpenCL 1.2 minimum device (work-group 1) still takes this.
    return ({"variant": "reg", "MWI": 1, "NWI": 1, "VW": 1, "WGM": 1},)


def gemm_params(facts, itemsize=4, dtype="float32", klass=None):
    """The first of gemm_rows(): the one parameter set of a CPU, the largest tile of a
    GPU (whose routines let clnn/plans.py choose among all the rows per shape)."""
    return gemm_rows(facts, itemsize, dtype, klass)[0]


def conv_rows(facts, itemsize=4, dtype="float32", klass=None):
    """The parameter sets of a convolution op (``klass`` "conv-fwd-<bucket>",
    "conv-dgrad-..." or "conv-wgrad-..."): a "gather" set (conv.cl) or GEMM rows
    (gemm.cl's loaders; a GPU's planner chooses among them per shape).

    Order: the innermost override of "conv" or "gemm", the user's database entry for
    the class, CONV_TABLE for the exact device, its vendor and type, then the device's
    GEMM rows.
    """
    params = _overridden(("conv", "gemm"), facts, itemsize)
    if params is not None:
        return [params]
    kind = mma_kind(facts, dtype)
    if mma_rows(facts, kind):
        params = _engine_entry(facts, itemsize, dtype, kind, klass)
        return [params] if params is not None else _with_engines(facts, itemsize, kind,
                                                                 True)
    if klass is not None:
        params = _from_db(facts, itemsize, dtype, klass)
        if params is not None:
            return [params]
    for row in (CONV_TABLE["device"].get(facts.name),
                CONV_TABLE["lanes"].get((facts.type, facts.float_lanes)),
                CONV_TABLE["type"].get(facts.type)):
        if row is not None and not gemm_problems(row, facts, itemsize):
            return [row]
    return conv_vendor_rows(facts, itemsize) or gemm_rows(facts, itemsize, dtype)


@functools.lru_cache(maxsize=64)
def conv_vendor_rows(facts, itemsize=4):
    """CONV_TABLE's rows for the device's vendor that fit it, as a tuple (or empty)."""
    vendor = facts.vendor.lower()
    for (v, typ), rows in CONV_TABLE.get("vendor", {}).items():
        if v in vendor and typ == facts.type:
            fit = tuple(r for r in rows if not gemm_problems(r, facts, itemsize))
            if fit:
                return fit
    return ()


def conv_params(facts, itemsize=4, dtype="float32", klass=None):
    """The first of conv_rows()."""
    return conv_rows(facts, itemsize, dtype, klass)[0]


def template_tuning(params, dtype="float32"):
    """The tile parameters as the hashable tuple the gemm template takes.

    VW counts float32 lanes; a float64 vector of the same bytes has half as many.
    """
    variant = params["variant"]
    t = dict(_OPTIONAL.get(variant, {}))
    t.update({k: v for k, v in params.items()
              if k in _KEYS[variant] or k in _OPTIONAL.get(variant, {})
              or k in _EXTRA.get(variant, ())})
    if "VW" in t:
        t["VW"] = programs.vector_width(t["VW"], dtype)
    return tuple(sorted(t.items()))
