"""16-bit storage (float16, bfloat16) against float32: GEMM, and a training step of the
MLP and LeNet-5 in mixed precision (clnn/nn/amp.py) against the same step in float32, on
every device.

    python benchmarks/bench_half.py [--device SPEC] [--repeats 5] [--sizes 512,1024]
                                    [--lenet-batches 64,1024]
                                    [--engine-rows all,tuned,float-direct]

Each 16-bit GEMM is checked first against numpy's float64 product of the same 16-bit
operands (bound: one rounding to the format plus float32 accumulation); each 16-bit
training step against the float32 one from the same weights (loss to 1%, 3% for
bfloat16's 8-bit mantissas). Then the three are timed alternately (warm-up, repeats,
medians) and each format's speed printed as float32's time over its own: above 1
where moving half the bytes pays. Steps are timed plain and replayed as fit runs them
("replayed" rows: the batch kept in the step's format, the kernels captured once).
On a GPU where PyTorch has CUDA, each step also runs in PyTorch (rows "PyTorch
CUDA: ..."): float32 with TF32 off against autocast to float16 (GradScaler) and
bfloat16, the same network and batch: what 16-bit steps gain with cuDNN and cuBLAS.
With ``--engine-rows all,tuned`` every case runs again with the matrix-engine rows
that no GPU has timed yet (clnn.tuning.MMA_TABLE's "tuned": False) set aside, the
rows marked "[tuned engine rows]": what those rows change, in the same run; with
``float-direct`` too, LeNet-5's steps again with the small layers' direct tiles
(convt.cl: LeNet-5's convolutions on a GPU) summing in float instead of on the
engines (clnn.ops.conv.TILE_DIRECT_ENGINES off), the rows marked "[direct tiles in
float]". A case whose check fails is named and the run goes on; it exits non-zero.
Writes benchmarks/results/bench_half.json.
"""

import contextlib
import os
import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import clnn  # noqa: E402
from clnn import nn, optim, tuning  # noqa: E402

DENSE = [("dense fwd X.W^T", 1000, 5000, 2000, False, True),
         ("dense dW = dY^T.X", 5000, 2000, 1000, True, False)]


FORMATS = ("float16", "bfloat16")        # each timed against float32
LOSS_TOL = {"float16": 1e-2, "bfloat16": 3e-2}


def gemm_case(dev, M, N, K, ta, tb, repeats):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((K, M) if ta else (M, K))
    b = rng.standard_normal((N, K) if tb else (K, N))
    times = {}
    for name in FORMATS + ("float32",):
        dt = np.dtype(name)
        # the format's own values, multiplied in float64 by numpy (float32 from halves:
        # the same data as float16's)
        ah, bh = (v.astype(np.float16 if name == "float32" else dt) for v in (a, b))
        ref = (ah.T if ta else ah).astype(np.float64) @ (bh.T if tb else bh).astype(np.float64)
        scale = np.abs(ah.T if ta else ah).astype(np.float64) @ \
            np.abs(bh.T if tb else bh).astype(np.float64)
        A, B = clnn.asarray(ah.astype(dt), device=dev), clnn.asarray(bh.astype(dt), device=dev)
        out = clnn.gemm(A, B, trans_a=ta, trans_b=tb)
        err = np.abs(out.get().astype(np.float64) - ref)
        bound = (float(ml_dtypes.finfo(dt).eps) + 8 * (K + 1) * np.finfo(np.float32).eps) * scale
        if not np.all(err <= bound):
            raise SystemExit(f"{name} GEMM {M}x{N}x{K} differs from numpy")
        times[name] = (A, B, out)
    samples = {name: [] for name in times}
    for _ in range(repeats):                       # alternating: drift hits all alike
        for name, (A, B, out) in times.items():
            samples[name].append(_common.median_time(
                lambda: clnn.gemm(A, B, out=out, trans_a=ta, trans_b=tb), 1, warmup=1,
                sync=dev.finish))
    return {name: float(np.median(s)) for name, s in samples.items()}


def mlp():
    return nn.Sequential([nn.Dense(5000, "tanh"), nn.Dense(1000, "sigmoid"),
                          nn.Dense(10, "softmax")], in_features=2000, seed=0)


def lenet(device=None):
    return nn.Sequential([nn.Conv2d(6, 5), nn.MaxPool2d(2), nn.Conv2d(16, 5), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Dense(120, "relu"), nn.Dense(84, "relu"),
                          nn.Dense(10, "softmax")], in_shape=(1, 32, 32), device=device,
                         seed=0)


def torch_models(torch, make, net):
    """PyTorch's copy of ``net`` (made by mlp or lenet), its weights and loss."""
    T = torch.nn
    if make is mlp:
        mods = [T.Linear(2000, 5000), T.Linear(5000, 1000), T.Linear(1000, 10)]
        return _common.torch_classifier(torch, net, mods, [0, T.Tanh(), 1, T.Sigmoid(), 2])
    mods = [T.Conv2d(1, 6, 5), T.Conv2d(6, 16, 5), T.Linear(400, 120), T.Linear(120, 84),
            T.Linear(84, 10)]
    return _common.torch_classifier(torch, net, mods, [
        0, T.ReLU(), T.MaxPool2d(2), 1, T.ReLU(), T.MaxPool2d(2), T.Flatten(), 2, T.ReLU(),
        3, T.ReLU(), 4])


def torch_step_case(torch, make, batch, in_shape, repeats, device="cuda"):
    """Seconds per step of PyTorch's copy of the network, float32 (TF32 off) and under
    autocast to float16 (with a GradScaler) and bfloat16: what the 16-bit steps gain
    there, the reference for clnn's ratios (cuDNN's LeNet-5 is bound by launches too).
    Checked first as clnn's: each 16-bit step's loss to the float32 step's."""
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.random((batch,) + in_shape, dtype=np.float32)).to(device)
    y = torch.from_numpy(np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)]).to(device)
    steps = {}
    for precision in FORMATS + ("float32",):
        model, loss_fn = torch_models(torch, make, make())
        model = model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        half = precision != "float32"
        scaler = torch.amp.GradScaler(device, enabled=precision == "float16")

        def step(model=model, loss_fn=loss_fn, opt=opt, scaler=scaler, half=half,
                 dtype=getattr(torch, precision)):
            opt.zero_grad(set_to_none=False)
            with torch.autocast(device, dtype=dtype, enabled=half):
                value = loss_fn(model(x), y)
            scaler.scale(value).backward()
            scaler.step(opt)
            scaler.update()
            return value
        steps[precision] = step
    losses = {p: float(steps[p]().detach()) for p in steps}
    for p in FORMATS:
        if abs(losses[p] - losses["float32"]) > LOSS_TOL[p] * max(1.0, losses["float32"]):
            raise SystemExit(f"PyTorch's {p} step's loss {losses[p]} is not its float32 "
                             f"step's {losses['float32']}")
    sync = torch.cuda.synchronize if device == "cuda" else None
    samples = {p: [] for p in steps}
    for _ in range(repeats):
        for p in steps:
            samples[p].append(_common.median_time(steps[p], 1, warmup=1, sync=sync))
    return {p: float(np.median(s)) for p, s in samples.items()}


def step_case(dev, make, batch, in_shape, repeats, replay=False):
    """Seconds per training step in each format, plain (the batch given in float32) or
    ``replay``ed as fit runs them (the batch kept in the step's format, the step's
    kernels captured and replayed, the optimizer keeping the 16-bit weights)."""
    rng = np.random.default_rng(1)
    x = rng.random((batch,) + in_shape, dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)]
    nets, data = {}, {}
    for precision in FORMATS + ("float32",):
        net = make()
        net.optimizer = optim.SGD(lr=0.0)        # the same weights every step
        net.scaler = nn.GradScaler(init_scale=1.0)
        nets[precision] = net
        dt = np.dtype(precision) if replay else np.float32
        data[precision] = tuple(clnn.asarray(v.astype(dt), device=dev) for v in (x, y))

    epoch = object() if replay else None       # fit's steps keep the 16-bit weights

    def step(p):
        return nets[p].train_step(*data[p], loss="cross_entropy", precision=p,
                                  replay=replay, _half_epoch=epoch)

    for _ in range(3 if replay else 1):           # replayed from the third on
        losses = {p: float(step(p).get()) for p in nets}
    for p in FORMATS:
        if abs(losses[p] - losses["float32"]) > LOSS_TOL[p] * max(1.0, losses["float32"]):
            raise SystemExit(f"{p} step's loss {losses[p]} is not the float32 step's "
                             f"{losses['float32']}")
    samples = {p: [] for p in nets}
    for _ in range(repeats):
        for p in nets:
            samples[p].append(_common.median_time(lambda: step(p), 1, warmup=1,
                                                  sync=dev.finish))
    return {p: float(np.median(s)) for p, s in samples.items()}


@contextlib.contextmanager
def tuned_engines_only():
    """MMA_TABLE without its untuned rows inside the block (the caches emptied on the
    way in and out, so that the planner sees the change)."""
    saved = {key: list(rows) for key, rows in tuning.MMA_TABLE.items()}
    try:
        for rows in tuning.MMA_TABLE.values():
            rows[:] = [r for r in rows if r.get("tuned")]
        clnn.clear_caches()
        yield
    finally:
        for key, rows in tuning.MMA_TABLE.items():
            rows[:] = saved[key]
        clnn.clear_caches()


@contextlib.contextmanager
def direct_tiles_in_float():
    """conv.TILE_DIRECT_ENGINES off inside the block: convt.cl's sums in float on every
    device, as before it had an engine variant."""
    conv = sys.modules["clnn.ops.conv"]
    old = conv.TILE_DIRECT_ENGINES
    conv.TILE_DIRECT_ENGINES = False
    try:
        yield
    finally:
        conv.TILE_DIRECT_ENGINES = old


def untuned_engine_rows(dev):
    return [r for kind in tuning.MMA_KINDS for r in tuning.mma_rows(dev.facts, kind)
            if not r.get("tuned")]


def _row(dev, case, t):
    """A result row, printed as it comes (a run cut off by a time limit keeps the
    rows it finished in its log)."""
    r = {"device": dev.name, "case": case, **t,
         **{f"float32_over_{f}": t["float32"] / t[f] for f in FORMATS}}
    print(f"{r['case']:48s} " + "   ".join(
        f"{f} {1e3 * r[f]:8.2f} ms ({r['float32_over_' + f]:.2f}x float32's speed)"
        for f in FORMATS) + f"   float32 {1e3 * r['float32']:8.2f} ms", flush=True)
    return r


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--sizes", default="512,1024", help="square GEMM sizes")
    ap.add_argument("--lenet-batches", default="64",
                    help="LeNet-5's batch sizes (at 64 a GPU's step is bound by its "
                         "launches, which mixed precision adds; a larger batch shows "
                         "where the 16-bit convolutions pay)")
    ap.add_argument("--engine-rows", default="all",
                    help="'all' (the table as it is), and after a comma 'tuned' (every "
                         "case also with the untimed matrix-engine rows set aside) or "
                         "'float-direct' (also with the small layers' direct tiles "
                         "summing in float, not on the engines)")
    args = ap.parse_args(argv)
    passes = args.engine_rows.split(",")
    if not passes or set(passes) - {"all", "tuned", "float-direct"}:
        ap.error("--engine-rows takes 'all', 'tuned' and 'float-direct'")
    marks = {"all": "", "tuned": " [tuned engine rows]",
             "float-direct": " [direct tiles in float]"}
    contexts = {"all": contextlib.nullcontext, "tuned": tuned_engines_only,
                "float-direct": direct_tiles_in_float}
    rows, failed = [], []
    for dev in _common.devices(args.device):
        print(f"# {dev.name}")
        cases = [(f"GEMM {n}^3", n, n, n, False, False) for n in map(int, args.sizes.split(","))]
        steps = [("MLP step (batch 1000)", mlp, 1000, (2000,))] + \
            [(f"LeNet-5 step (batch {n})", lenet, n, (1, 32, 32))
             for n in map(int, args.lenet_batches.split(","))]
        torch = _common.torch_cuda() if not dev.facts.is_cpu else None
        for which in passes:
            if which == "tuned" and not untuned_engine_rows(dev):
                print(f"(no untimed engine rows fit {dev.name}: nothing to set aside)")
                continue
            mark = marks[which]
            # (the direct tiles take only LeNet-5's convolutions)
            direct_only = which == "float-direct"
            with contexts[which]():
                for name, M, N, K, ta, tb in [] if direct_only else cases + DENSE:
                    checked(rows, failed, dev, name + mark, gemm_case, dev, M, N, K, ta,
                            tb, args.repeats)
                for name, make, batch, shape in steps[1:] if direct_only else steps:
                    checked(rows, failed, dev, name + mark, step_case, dev, make, batch,
                            shape, args.repeats)
                    checked(rows, failed, dev, name.replace("step", "replayed") + mark,
                            step_case, dev, make, batch, shape, args.repeats, replay=True)
                    if torch is not None and which == "all":
                        checked(rows, failed, dev, "PyTorch CUDA: " + name,
                                torch_step_case, torch, make, batch, shape, args.repeats)
    print(f"results: {_common.write_json('bench_half', {'rows': rows}, args.json)}")
    if failed:
        raise SystemExit(f"{len(failed)} case(s) failed their check: " + "; ".join(failed))


def checked(rows, failed, dev, case, run, *args, **kw):
    """One case's row, or, where its check fails, the failure named and the next case
    run (a lent GPU's one command must not lose the cases after a wrong one)."""
    try:
        rows.append(_row(dev, case, run(*args, **kw)))
    except SystemExit as e:
        print(f"{case:48s} FAILED: {e}", flush=True)
        failed.append(f"{case}: {e}")


if __name__ == "__main__":
    main()
