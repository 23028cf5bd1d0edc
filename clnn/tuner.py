"""The tuner behind ``clnn tune``: search GEMM tile parameters on the current device.

For each shape class (see clnn.tuning.shape_class: transposes, aspect and size bucket)
it times every candidate that the constraints allow on a problem of that class, after
checking the candidate's result against numpy, and stores the fastest per device name,
driver version, dtype and class in the user's tuning database (clnn.tuning.db_path).

Tuning never makes things worse: a winner is stored only after it is timed again
beside the table's own choice on the class's reference problem (the full-size one,
also after a --quick search at smaller sizes) and is at least as fast there. (On an
H100 a quick search that picked 32x32 tiles on small problems, stored for every size,
made 4096^3 run 2.3x slower.) The search lives above the ops it times (clnn.tuning,
below them, only holds tables, constraints and the database).

On a device with matrix engines (NVIDIA, compute capability 8.0 and up) it tunes two
more formats the same way: TF32 (float32 products where set_float32_matmul_precision
allows TF32) and float16, searching engine rows (clnn.tuning.MMA_TABLE's kind of row)
against the table's choice in that format, and stores them under their own keys
("tf32", "float16"): a TF32 winner never serves an exact float32 product. bfloat16 is
tuned only when asked (``formats=["bfloat16"]``, ``clnn tune --format bfloat16``): it
runs the float16 rows with another operand type, so until it has winners of its own
it takes float16's (clnn.tuning._engine_entry).
"""

import contextlib
import itertools
import statistics
import time

import numpy as np

import clnn
from . import programs, tuning
from .errors import DeviceError

# GEMM classes: transposes and aspect -> {size bucket: (quick problem, reference
# problem)}, (M, N, K) with the class's transposes; the reference problem is the one a
# winner must not lose on (see tuning.size_bucket for the buckets)
GEMM_CLASSES = {
    "NN-square": {"small": ((256, 256, 256), (384, 384, 384)),
                  "medium": ((768, 768, 768), (1024, 1024, 1024)),
                  "large": ((2048, 2048, 2048), (4096, 4096, 4096))},
    "NT-wide": {"small": ((128, 640, 256), (128, 1280, 512)),   # dense forward X W^T
                "medium": ((256, 1280, 512), (500, 2500, 1000)),
                "large": ((1000, 5000, 2000), (2000, 10000, 4000))},
    "TN-square": {"small": ((384, 192, 256), (768, 384, 256)),  # dense weight gradient
                  "medium": ((1000, 500, 500), (2500, 1000, 1000)),
                  "large": ((5000, 2000, 1000), (5000, 2000, 2000))},
    "NN-tall": {"small": ((768, 128, 384), (1536, 256, 256)),
                "medium": ((2048, 256, 1024), (4096, 512, 1024)),
                "large": ((4096, 512, 4096), (8192, 1024, 2048))},
    "NT-square": {"small": ((256, 256, 256), (384, 384, 384)),
                  "medium": ((768, 768, 768), (1024, 1024, 1024))},
}
# convolution problems (N, C, H, W, M, R, S): LeNet-5's C3 (quick: batch 16), and on a
# full search a 14x14x256 3x3 layer (padding 1) too
CONV = {"quick": [(16, 6, 14, 14, 16, 5, 5)],
        "full": [(64, 6, 14, 14, 16, 5, 5), (8, 256, 14, 14, 256, 3, 3)]}


def candidates(facts, quick):
    """Parameter sets the constraints allow on this device, fewer with ``quick``."""
    out = []
    if facts.is_cpu:
        # 256-bit vectors, and 512-bit ones where the device's code has them (their
        # panels twice as wide: the constraints drop them elsewhere)
        mwis, nwis, wgms = ((4, 6, 8), (16, 32), (16,)) if quick else \
            ((2, 3, 4, 6, 8), (8, 16, 24, 32), (4, 16))
        for vw in (8, 16):
            for m, n, w in itertools.product(mwis, nwis, wgms):
                out.append({"variant": "reg", "MWI": m, "NWI": n * vw // 8, "VW": vw,
                            "WGM": w})
    else:
        # tiles, work-items per tile and vector widths around the shapes that measured
        # well on an H100 (4x4 to 16x4 outputs per work-item)
        tiles = ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128),
                 (32, 32), (16, 64))
        for (mwg, nwg), kwg, vw in itertools.product(
                tiles, (16,) if quick else (8, 16), (4,) if quick else (2, 4)):
            for md, nd in ((8, 32), (16, 16), (32, 8), (8, 8), (4, 16), (16, 4)):
                mwi, nwi = mwg // md if mwg % md == 0 else 0, nwg // nd if nwg % nd == 0 else 0
                if mwi < vw or nwi < vw or mwi * nwi > 64 or mwi * nwi < 16:
                    continue
                out.append({"variant": "local", "MWG": mwg, "NWG": nwg, "KWG": kwg,
                            "MDIMC": md, "NDIMC": nd, "VWM": vw, "VWN": vw})
    return [p for p in out if not tuning.gemm_problems(p, facts)]


def engine_candidates(facts, kind, quick):
    """Matrix-engine rows of ``kind`` ("tf32", "f16") that fit the device: tiles of 64
    to 256, warp blocks of 32x32 to 64x64, 4 to 16 warps a work-group (cf. MMA_TABLE,
    whose rows came from such a search on an H100), and narrow tiles for products with
    few rows (16 x 128 in warp blocks of 16 x 32; the full search also 16 x 256 and
    32 x 128)."""
    itemsize = tuning.MMA_KINDS[kind][1]
    if quick:
        tiles = ((128, 128), (64, 128), (128, 256), (64, 64))
        blocks, depths = ((64, 64), (32, 64), (32, 32)), (16,) if kind == "tf32" else (16, 32)
        narrow = (((16, 128), (16, 32)),)
    else:
        tiles = ((128, 128), (64, 128), (128, 64), (128, 256), (256, 128), (64, 64))
        blocks = ((64, 64), (32, 64), (64, 32), (32, 32))
        depths = (8, 16, 32) if kind == "tf32" else (16, 32)
        narrow = (((16, 128), (16, 32)), ((16, 256), (16, 64)), ((32, 128), (32, 32)))
    shapes = list(itertools.product(tiles, blocks)) + list(narrow)
    out = []
    for ((mwg, nwg), (wm, wn)), kwg in itertools.product(shapes, depths):
        if mwg % wm or nwg % wn:
            continue
        threads = 32 * (mwg // wm) * (nwg // wn)
        if not 128 <= threads <= 512:
            continue
        row = {"variant": "local", "MMA": kind, "MWG": mwg, "NWG": nwg, "KWG": kwg,
               "MDIMC": threads // 16, "NDIMC": 16, "WM": wm, "WN": wn}
        # float16 also with ldmatrix and tiles of plain halves (LDSM); those, and the
        # TF32 rows, also with tiles filled by cp.async, a pipeline of 2 to 4 (ASYNC;
        # in a quick search the longest of 3 and 2 that fits, as the table's rows have)
        base = [row, dict(row, LDSM=True)] if kind == "f16" else [row]
        piped = [dict(base[-1], ASYNC=n) for n in ((3, 2) if quick else (2, 3, 4))]
        fits = [r for r in base + piped if not tuning.gemm_problems(r, facts, itemsize)]
        piped = [r for r in fits if "ASYNC" in r]
        out += [r for r in fits if "ASYNC" not in r] + (piped[:1] if quick else piped)
    return out


# format -> (storage dtype, float32 matmul precision while tuning it, engine kind)
FORMATS = {"float32": (np.float32, "highest", None), "tf32": (np.float32, "high", "tf32"),
           "float16": (np.float16, "highest", "f16"),
           "bfloat16": (clnn.bfloat16, "highest", "f16")}
# tuned only when asked: bfloat16 takes float16's winners until it has its own
ON_REQUEST = ("bfloat16",)


def device_formats(facts, requested=False):
    """What the tuner tunes on this device by default: "float32", and "tf32" and
    "float16" where the device has those matrix engines; ``requested``: also the
    formats it tunes when asked (bfloat16 where it has float16's engines)."""
    return [fmt for fmt, (_, _, kind) in FORMATS.items()
            if (kind is None or tuning.mma_rows(facts, kind))
            and (requested or fmt not in ON_REQUEST)]


def conv_candidates(facts, quick):
    """Extra candidates for the convolution classes: conv.cl's gathered kernel on CPUs
    (its tiles follow each problem's shape; the search covers the work-group size and
    the vector registers the tiles may fill: 16 for AVX2 code, 32 where PoCL builds
    AVX-512 code; the full search also never Winograd, and its F(2x2, 3x3) tiles)."""
    if not facts.is_cpu:
        return []
    # the table row's Winograd thresholds go with every candidate (a winner stored
    # for a class must not move its layers' choice of Winograd)
    table = tuning.conv_rows(facts)[0]
    keep = {k: table[k] for k in ("WINO_CHANNELS", "WINO_WGRAD_CHANNELS") if k in table}
    out = [{"variant": "gather", "VW": 8, "WG": w, "REGS": r, **keep}
           for w in ((4, 16) if quick else (1, 4, 16)) for r in (16, 32)]
    # and 512-bit vectors where the device's code has them (the constraints drop them
    # elsewhere)
    out += [dict(p, VW=16) for p in out if p["REGS"] == 32]
    if not quick:
        # Winograd (conv.WINO_CHANNELS's threshold, measured on one CPU) against never
        # taking it, and F(2x2, 3x3) against F(4x4, 3x3), with the table's other choices
        base = dict(out[2])
        out += [dict(base, WINO=False), dict(base, WINO_M=2)]
    return [p for p in out if not tuning.gemm_problems(p, facts)]


def median_kernel_time(fn, dev, repeats):
    """Median device seconds of ``fn``'s kernels, from OpenCL profiling events: the
    first kernel's start to the last one's end, after one warm-up call."""
    if not dev.profiling:
        raise DeviceError(f"kernel times come from profiling events, and {dev.name} runs "
                          f"without them here (CLNN_PROFILING=0)")
    fn()
    dev.finish()
    times = []
    for _ in range(repeats):
        with programs.recorded_events() as events:
            fn()
        dev.finish()
        times.append(1e-9 * (max(e.profile.end for e in events)
                             - min(e.profile.start for e in events)))
    return statistics.median(times)


def _operand(x, fmt):
    """A random operand as the format stores it: halves for float16 and bfloat16,
    float32 values that TF32 holds exactly for tf32 (so the engine's rounding changes
    nothing and a float64 product of the operands is the reference)."""
    if fmt in ("float16", "bfloat16"):
        return x.astype(FORMATS[fmt][0])
    if fmt == "tf32":
        u = x.astype(np.float32).view(np.uint32)
        return ((u + np.uint32(0x1000)) & np.uint32(0xffffe000)).view(np.float32)
    return x.astype(np.float32)


def _gemm_problem(dev, klass, size, rng, fmt="float32"):
    M, N, K = size
    ta, tb = klass[0] == "T", klass[1] == "T"
    a = _operand(rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32), fmt)
    b = _operand(rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32), fmt)
    ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
    A, B = clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)
    out = clnn.empty((M, N), a.dtype, device=dev)
    return (lambda: clnn.gemm(A, B, out=out, trans_a=ta, trans_b=tb)), \
        (lambda: out.get()), ref, 2.0 * M * N * K


def _conv_problems(dev, shape, rng, fmt="float32"):
    """{class: (run, read, reference, flops)} for the three convolution ops of one layer
    (padding keeps 3x3 layers' size); references from the device's own table row (no
    engines: float32 sums of the same operands). Not the ops that the GPU path gives
    convt.cl's direct tiles (conv.tile_direct_op): the rows tuned here do not run them,
    and a winner timed on them would be stored for its class untried."""
    from .ops.conv import conv_geometry, tile_direct_op
    N, C, H, W, M, R, S = shape
    pad = 1 if R == 3 else 0
    P, Q = conv_geometry((N, C, H, W), (M, C, R, S), 1, pad)[7:9]
    x = _operand(rng.standard_normal((N, C, H, W), dtype=np.float32), fmt)
    w = _operand(rng.standard_normal((M, C, R, S), dtype=np.float32), fmt)
    dy = _operand(rng.standard_normal((N, M, P, Q), dtype=np.float32), fmt)
    X, Wd, DY = (clnn.asarray(v, device=dev) for v in (x, w, dy))
    ops = {"fwd": (lambda: clnn.conv2d(X, Wd, padding=pad), (M, N * P * Q, C * R * S)),
           "dgrad": (lambda: clnn.conv2d_backward_data(DY, Wd, x.shape, padding=pad),
                     (C, N * H * W, M * R * S)),
           "wgrad": (lambda: clnn.conv2d_backward_weight(DY, X, w.shape, padding=pad),
                     (M, C * R * S, N * P * Q))}
    if not dev.facts.is_cpu:
        # (with the engine's plan where the dtype takes engine rows: its taps per block
        # are fewer than the float sums', so it leaves a few more layers to the GEMM)
        kind = tuning.mma_kind(dev.facts, x.dtype)
        engine = {"MMA": kind} if tuning.mma_rows(dev.facts, kind) else None
        for mode in ("fwd", "dgrad"):
            if tile_direct_op(dev, x.dtype, mode, N, C, M, R, S, (1, 1), (pad, pad),
                              engine=engine):
                del ops[mode]
    with tuning.override("gemm", tuning.table_rows(dev.facts, x.dtype.itemsize)[0]):
        refs = {mode: op().get().astype(np.float64) for mode, (op, _) in ops.items()}
    flops = 2.0 * N * M * P * Q * C * R * S
    problems = {}
    for mode, (op, mnk) in ops.items():
        box = {}

        def run(op=op, box=box):
            box["y"] = op()
        problems[f"conv-{mode}-{tuning.size_bucket(*mnk)}"] = (
            run, (lambda box=box: box["y"].get()), refs[mode], flops)
    return problems


def _problems(dev, kernels, quick, rng, fmt="float32"):
    """{class: (tuning problem, reference problem)}, each (run, read, ref, flops)."""
    problems = {}
    if "gemm" in kernels:
        for aspect, buckets in GEMM_CLASSES.items():
            for bucket, (small, full) in buckets.items():
                klass = f"{aspect}-{bucket}"
                ref = _gemm_problem(dev, klass, full, rng, fmt)
                problems[klass] = (_gemm_problem(dev, klass, small, rng, fmt) if quick and
                                   small != full else ref, ref)
    if "conv" in kernels:
        for shape in CONV["quick" if quick else "full"]:
            for klass, prob in _conv_problems(dev, shape, rng, fmt).items():
                problems.setdefault(klass, (prob, prob))
    return problems


def _check_and_time(run, read, ref, dev, repeats, tol=1e-4):
    """Seconds of device time, or None when the result is wrong (off by more than
    ``tol`` of the reference's largest value)."""
    run()
    scale = max(np.abs(ref).max(), 1e-30)
    if not np.abs(read().astype(np.float64) - ref).max() / scale < tol:
        return None
    return median_kernel_time(run, dev, repeats)


# a float16 result is rounded once to 11 bits (half a unit, 2^-11, of each value), a
# bfloat16 one to 8 (2^-8); the table's row and a candidate may also round partial
# sums differently
_TOLERANCE = {"float32": 1e-4, "tf32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}


def tune(kernels=("gemm",), device=None, quick=False, progress=True, save=True, log=print,
         formats=None):
    """Search, store and return {class: (best params, GFLOP/s, table's GFLOP/s)}.

    ``formats``: any of "float32", "tf32", "float16", "bfloat16" (default: every one
    the device has but bfloat16, see device_formats); classes of the engine formats
    are returned as "tf32/NN-square-large". The GFLOP/s are from the class's reference
    problem; a class whose best candidate is not faster than the table's choice there
    keeps the table (nothing is stored).
    """
    dev = clnn.device(device)
    have = device_formats(dev.facts, requested=True)
    formats = device_formats(dev.facts) if formats is None else list(formats)
    for fmt in formats:
        if fmt not in FORMATS:
            raise clnn.ArgumentError(f"unknown format {fmt!r}: tune one of "
                                     f"{', '.join(FORMATS)}")
        if fmt not in have:
            raise clnn.ArgumentError(f"{dev.name} has no {fmt} matrix engines to tune "
                                     f"(it tunes {', '.join(have)})")
    # Each format runs at its own float32 matmul precision: "highest" for float32
    # (with TF32 allowed, the table's choice would run on the engines, fail the float32
    # check and let any candidate "beat" it), "high" for TF32; the user's setting is
    # put back afterwards.
    precision = tuning.get_float32_matmul_precision()
    results = {}
    try:
        for fmt in formats:
            tuning.set_float32_matmul_precision(FORMATS[fmt][1])
            results.update(_tune(dev, kernels, quick, progress, save, log, fmt))
    finally:
        tuning.set_float32_matmul_precision(precision)
    return results


def _tune(dev, kernels, quick, progress, save, log, fmt):
    dtype, _, kind = FORMATS[fmt]
    key_dtype = tuning.db_format(dtype, kind)
    rng = np.random.default_rng(0)
    problems = _problems(dev, kernels, quick, rng, fmt)
    if kind is None:
        cands, extra = candidates(dev.facts, quick), conv_candidates(dev.facts, quick)
    else:
        cands, extra = engine_candidates(dev.facts, kind, quick), []
    repeats, tol = 3 if quick else 5, _TOLERANCE[fmt]
    prefix = "" if fmt == "float32" else f"{fmt}/"
    log(f"tuning {', '.join(kernels)} in {fmt} on {dev.name} [{dev.facts.platform}]: "
        f"{len(problems)} shape classes x {len(cands)} candidates"
        + (f" (+{len(extra)} for convolution)" if "conv" in kernels and extra else ""))
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(problems) * (len(cands) + len(extra) + 1),
                   unit="candidate")  # upper bound
    results, entries = {}, {}
    try:
        for klass, ((run, read, ref, flops), reference) in problems.items():
            conv = klass.startswith("conv-")
            timed = []
            for params in [None] + [c for c in cands + (extra if conv else [])]:
                knob = None if params is None else \
                    "conv" if params["variant"] == "gather" else "gemm"
                with _no_db(dev, key_dtype, klass), \
                        (tuning.override(knob, params) if knob else contextlib.nullcontext()):
                    try:
                        t = _check_and_time(run, read, ref, dev, repeats, tol)
                    except clnn.ClnnError as exc:
                        t = None
                        log(f"  {prefix}{klass} {params}: {exc}")
                if t is None:
                    log(f"  {prefix}{klass}: {params or 'the table'} gave a wrong result; "
                        "skipped")
                else:
                    timed.append((params, flops / t / 1e9))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(cls=prefix + klass)
            best, best_gf = max([r for r in timed if r[0] is not None] or [(None, 0.0)],
                                key=lambda r: r[1])
            if best is None:
                continue
            # the winner against the table's choice on the reference problem
            rrun, rread, rref, rflops = reference
            with _no_db(dev, key_dtype, klass):
                t_table = _check_and_time(rrun, rread, rref, dev, repeats, tol)
                with tuning.override("conv" if best["variant"] == "gather" else "gemm",
                                     best):
                    t_best = _check_and_time(rrun, rread, rref, dev, repeats, tol)
            table_gf = rflops / t_table / 1e9 if t_table else 0.0
            best_gf = rflops / t_best / 1e9 if t_best else 0.0
            results[prefix + klass] = (best, best_gf, table_gf)
            if best_gf <= table_gf:
                log(f"  {prefix + klass:<18} keeps the table ({table_gf:.1f} GFLOP/s; the "
                    f"best candidate ran {best_gf:.1f} on the reference problem)")
                continue
            entries[tuning.db_key(dev.facts, key_dtype, klass)] = {
                "params": best, "gflops": round(best_gf, 2),
                "table_gflops": round(table_gf, 2), "quick": bool(quick),
                "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    finally:
        if bar is not None:
            bar.close()
    for klass, (best, gf, base) in results.items():
        shown = {k: v for k, v in best.items() if k != "variant"}
        log(f"  {klass:<18} {gf:7.1f} GFLOP/s with {shown} (table's choice: {base:.1f})")
    if save and entries:
        log(f"saved {len(entries)} classes to {tuning.save_db_entries(entries)}")
    return results


class _no_db:
    """Time the table's own choice: hide the user's database entry for one class."""

    def __init__(self, dev, key_dtype, klass):
        self.key = tuning.db_key(dev.facts, key_dtype, klass)

    def __enter__(self):
        self.saved = tuning.load_db().pop(self.key, None)

    def __exit__(self, *exc):
        if self.saved is not None:
            tuning.load_db()[self.key] = self.saved
