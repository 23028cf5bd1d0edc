"""The tuner behind ``clnn tune``: search GEMM tile parameters on the current device.

For each shape class (see clnn.tuning.shape_class) it times every candidate that the
constraints allow on a representative problem, after checking the candidate's result
against numpy, and stores the fastest per device name, driver version, dtype and class
in the user's tuning database (clnn.tuning.db_path). The search lives above the ops it
times (clnn.tuning, below them, only holds tables, constraints and the database).
"""

import itertools
import statistics
import time

import numpy as np

import clnn
from . import programs, tuning

# class -> (quick problem, full problem): (M, N, K) with the class's transposes
GEMM_CLASSES = {
    "NN-square": ((384, 384, 384), (1024, 1024, 1024)),
    "NT-wide": ((256, 1280, 512), (1000, 5000, 2000)),      # dense forward X W^T
    "TN-square": ((768, 384, 256), (5000, 2000, 1000)),     # dense weight gradient
    "NN-tall": ((1536, 256, 384), (4096, 512, 1024)),
    "NT-square": ((384, 384, 384), (1024, 1024, 1024)),
}
# convolution classes: LeNet-5's C3 at batch 64 (quick: batch 16)
CONV = {"quick": (16, 6, 14, 14, 16, 5, 5), "full": (64, 6, 14, 14, 16, 5, 5)}


def candidates(facts, quick):
    """Parameter sets the constraints allow on this device, fewer with ``quick``."""
    out = []
    if facts.is_cpu:
        mwis, nwis, wgms = ((4, 6, 8), (16, 32), (16,)) if quick else \
            ((2, 3, 4, 6, 8), (8, 16, 24, 32), (4, 16))
        for m, n, w in itertools.product(mwis, nwis, wgms):
            out.append({"variant": "reg", "MWI": m, "NWI": n, "VW": 8, "WGM": w})
    else:
        tiles = (32, 64) if quick else (32, 64, 128)
        for mwg, nwg, kwg, md, nd in itertools.product(tiles, tiles, (8, 16) if quick else
                                                       (8, 16, 32), (8, 16), (8, 16)):
            out.append({"variant": "local", "MWG": mwg, "NWG": nwg, "KWG": kwg,
                        "MDIMC": md, "NDIMC": nd})
    return [p for p in out if not tuning.gemm_problems(p, facts)]


def conv_candidates(facts, quick):
    """Extra candidates for the convolution classes: conv.cl's gathered kernel on CPUs
    (its tiles follow each problem's shape; the search covers the work-group size)."""
    if not facts.is_cpu:
        return []
    out = [{"variant": "gather", "VW": 8, "WG": w} for w in ((4, 16) if quick else (1, 4, 16))]
    return [p for p in out if not tuning.gemm_problems(p, facts)]


def _median_time(fn, dev, repeats):
    """Median device seconds of ``fn``'s kernels, from OpenCL profiling events: the
    first kernel's start to the last one's end, after one warm-up call."""
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


def _gemm_problem(dev, klass, size, rng):
    M, N, K = size
    ta, tb = klass[0] == "T", klass[1] == "T"
    a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
    ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
    A, B = clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)
    out = clnn.empty((M, N), device=dev)
    return (lambda: clnn.gemm(A, B, out=out, trans_a=ta, trans_b=tb)), \
        (lambda: out.get()), ref, 2.0 * M * N * K


def _conv_problems(dev, quick, rng):
    N, C, H, W, M, R, S = CONV["quick" if quick else "full"]
    from .ops.conv import conv_geometry
    P, Q = conv_geometry((N, C, H, W), (M, C, R, S), 1, 0)[7:9]
    x = rng.standard_normal((N, C, H, W), dtype=np.float32)
    w = rng.standard_normal((M, C, R, S), dtype=np.float32)
    dy = rng.standard_normal((N, M, P, Q), dtype=np.float32)
    X, Wd, DY = (clnn.asarray(v, device=dev) for v in (x, w, dy))
    with tuning.override("gemm", tuning.gemm_params(dev.facts)):
        refs = {"conv-fwd": clnn.conv2d(X, Wd).get(),
                "conv-dgrad": clnn.conv2d_backward_data(DY, Wd, x.shape).get(),
                "conv-wgrad": clnn.conv2d_backward_weight(DY, X, w.shape).get()}
    flops = 2.0 * N * M * P * Q * C * R * S
    ops = {"conv-fwd": lambda: clnn.conv2d(X, Wd),
           "conv-dgrad": lambda: clnn.conv2d_backward_data(DY, Wd, x.shape),
           "conv-wgrad": lambda: clnn.conv2d_backward_weight(DY, X, w.shape)}
    problems = {}
    for klass, op in ops.items():
        box = {}

        def run(op=op, box=box):
            box["y"] = op()
        problems[klass] = (run, (lambda box=box: box["y"].get()), refs[klass], flops)
    return problems


def tune(kernels=("gemm",), device=None, quick=False, progress=True, save=True, log=print):
    """Search, store and return {class: (best params, GFLOP/s, table's GFLOP/s)}."""
    dev = clnn.device(device)
    rng = np.random.default_rng(0)
    problems = {}
    if "gemm" in kernels:
        for klass, sizes in GEMM_CLASSES.items():
            problems[klass] = _gemm_problem(dev, klass, sizes[0 if quick else 1], rng)
    if "conv" in kernels:
        problems.update(_conv_problems(dev, quick, rng))
    cands = candidates(dev.facts, quick)
    extra = conv_candidates(dev.facts, quick)
    repeats = 3 if quick else 5
    log(f"tuning {', '.join(kernels)} on {dev.name} [{dev.facts.platform}]: "
        f"{len(problems)} shape classes x {len(cands)} candidates"
        + (f" (+{len(extra)} for convolution)" if "conv" in kernels and extra else ""))
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(problems) * (len(cands) + len(extra) + 1),
                   unit="candidate")  # upper bound
    results, entries = {}, {}
    try:
        for klass, (run, read, ref, flops) in problems.items():
            scale = max(np.abs(ref).max(), 1e-30)
            conv = klass.startswith("conv-")
            with _no_db(dev, klass):               # what the table picks today
                table = (tuning.conv_params if conv else tuning.gemm_params)(
                    dev.facts, 4, np.float32, klass)
            timed = []
            for params in [table] + [c for c in cands + (extra if conv else []) if c != table]:
                with tuning.override("conv" if params["variant"] == "gather" else "gemm",
                                     params):
                    try:
                        run()
                        ok = np.abs(read() - ref).max() / scale < 1e-4
                        t = _median_time(run, dev, repeats) if ok else None
                    except clnn.ClnnError as exc:
                        ok, t = False, None
                        log(f"  {klass} {params}: {exc}")
                if not ok:
                    log(f"  {klass}: {params} gave a wrong result; skipped")
                timed.append((params, flops / t / 1e9 if t else 0.0))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(cls=klass)
            baseline = timed[0][1]
            best, best_gf = max(timed, key=lambda r: r[1])
            results[klass] = (best, best_gf, baseline)
            entries[tuning.db_key(dev.facts, np.float32, klass)] = {
                "params": best, "gflops": round(best_gf, 2),
                "table_gflops": round(baseline, 2), "quick": bool(quick),
                "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    finally:
        if bar is not None:
            bar.close()
    for klass, (best, gf, base) in results.items():
        shown = {k: v for k, v in best.items() if k != "variant"}
        log(f"  {klass:<12} {gf:7.1f} GFLOP/s with {shown} (table's choice: {base:.1f})")
    if save and entries:
        log(f"saved to {tuning.save_db_entries(entries)}")
    return results


class _no_db:
    """Time the table's own choice: hide the user's database entry for one class."""

    def __init__(self, dev, klass):
        self.key = tuning.db_key(dev.facts, np.float32, klass)

    def __enter__(self):
        self.saved = tuning.load_db().pop(self.key, None)

    def __exit__(self, *exc):
        if self.saved is not None:
            tuning.load_db()[self.key] = self.saved
