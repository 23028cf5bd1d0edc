"""The tutorial's own micro-benchmark: one training step of a 10000-5000-1000-10 network
(tanh, sigmoid, sigmoid, quadratic loss, plain SGD) on a batch of 10000, beside PyTorch
(CUDA where there is an NVIDIA GPU, else CPU), also in mixed precision (float16) and under
a 4 GiB pool budget.

    python benchmarks/bench_tutorial.py [--device SPEC] [--repeats 3] [--batch 10000]

The tutorial reported 433 ms for this step on a GTX 1080 Ti through CUDA, and 18 s or
CL_MEM_OBJECT_ALLOCATION_FAILURE on an R9 290X (4 GiB) through OpenCL. A step is 2.3
TFLOP (the input needs no gradient): on a CPU device the default batch shrinks to 1000
(--batch to choose). Before timing, one step from the same weights is compared with
PyTorch's. Writes benchmarks/results/bench_tutorial.json.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import clnn  # noqa: E402
from clnn import nn  # noqa: E402

IN = 10000
LAYERS = [(5000, "tanh"), (1000, "sigmoid"), (10, "sigmoid")]
LR = 0.1
BUDGET = 4 << 30          # the R9 290X's memory


def make_net(dev):
    return nn.Sequential([nn.Dense(w, a) for w, a in LAYERS], IN, device=dev, seed=0)


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--batch", type=int, help="default 10000 on GPUs, 1000 on CPUs")
    args = ap.parse_args(argv)
    torch = _common.torch_or_none()
    cuda = _common.torch_cuda()
    result = {"network": f"{IN}-" + "-".join(f"{w} {a}" for w, a in LAYERS), "runs": []}
    for dev in _common.devices(args.device):
        B = args.batch or (1000 if dev.facts.is_cpu else 10000)
        rng = np.random.default_rng(0)
        x = rng.random((B, IN), dtype=np.float32)
        y = rng.random((B, 10), dtype=np.float32)
        # every layer's forward product and weight gradient, and the data gradients of
        # all but the first (the input needs none, in PyTorch or clnn)
        sizes = list(zip([IN] + [w for w, _ in LAYERS], [w for w, _ in LAYERS]))
        flops = 2 * B * (3 * sum(a * b for a, b in sizes) - sizes[0][0] * sizes[0][1])
        net = make_net(dev)
        X, Y = clnn.asarray(x, device=dev), clnn.asarray(y, device=dev)
        run = {"device": dev.name, "batch": B, "step_ms": {}}
        peer = cuda if (cuda is not None and not dev.facts.is_cpu) else torch
        if peer is not None:
            on_gpu = peer is cuda
            model, loss_fn = _common.torch_mlp(peer, net, IN, LAYERS, B)
            Xt, Yt = peer.from_numpy(x), peer.from_numpy(y)
            if on_gpu:
                model, Xt, Yt = model.cuda(), Xt.cuda(), Yt.cuda()
            opt = peer.optim.SGD(model.parameters(), lr=LR)

            def tstep():
                opt.zero_grad(set_to_none=False)
                v = loss_fn(model(Xt), Yt)
                v.backward()
                opt.step()
                return v
            want = float(tstep().detach())
            got = float(net.train_step(X, Y, LR, 0.0, "quadratic").get())
            if abs(got - want) > 1e-4 * abs(want):
                raise SystemExit(f"clnn and PyTorch disagree after one step: {got} vs {want}")
            print(f"validated: one step matches PyTorch (loss {got:.6f})")
            name = "PyTorch CUDA" if on_gpu else "PyTorch CPU"
            t = _common.cuda_time(peer, tstep, args.repeats) if on_gpu else \
                _common.median_time(tstep, args.repeats, warmup=1)
            run["step_ms"][name] = 1e3 * t
            del model, opt, Xt, Yt
        dev.finish()
        dev.pool.reset_peak()
        t = _common.median_time(lambda: net.train_step(X, Y, LR, 0.0, "quadratic"),
                                args.repeats, warmup=1, sync=dev.finish)
        run["step_ms"]["clnn"] = 1e3 * t
        run["pool_peak_bytes"] = dev.pool.stats()["peak_bytes"]
        # mixed precision (PyTorch's autocast + GradScaler): float16 activations, deltas
        # and weight copies; its first step checked against float32's from the same
        # weights (loss to 1%)
        del net
        first32 = float(make_net(dev).train_step(X, Y, LR, 0.0, "quadratic").get())
        net16 = make_net(dev)
        first16 = float(net16.train_step(X, Y, LR, 0.0, "quadratic", precision="float16").get())
        if abs(first16 - first32) > 1e-2 * abs(first32):
            raise SystemExit(f"the float16 step's loss {first16} is not float32's {first32}")
        dev.finish()
        dev.pool.reset_peak()
        t16 = _common.median_time(
            lambda: net16.train_step(X, Y, LR, 0.0, "quadratic", precision="float16"),
            args.repeats, warmup=1, sync=dev.finish)
        run["step_ms"]["clnn, mixed precision (float16)"] = 1e3 * t16
        run["pool_peak_bytes_float16"] = dev.pool.stats()["peak_bytes"]
        # the same step under the R9 290X's 4 GiB, in a fresh network and pool state
        del net16
        dev.pool.free_held()
        saved = dev.pool.budget
        dev.pool.budget = min(saved, BUDGET)
        try:
            net4 = make_net(dev)
            t4 = _common.median_time(lambda: net4.train_step(X, Y, LR, 0.0, "quadratic"),
                                     args.repeats, warmup=1, sync=dev.finish)
            run["step_ms"]["clnn, 4 GiB pool budget"] = 1e3 * t4
            run["pool_peak_bytes_4gib"] = dev.pool.stats()["peak_bytes"]
            del net4
        except clnn.OutOfDeviceMemory as exc:
            run["step_ms"]["clnn, 4 GiB pool budget"] = None
            print(f"under a 4 GiB budget: {exc}")
        finally:
            dev.pool.budget = saved
        for k, v in run["step_ms"].items():
            print(f"{dev.name} batch {B}: {k} {v:.1f} ms per step" if v else
                  f"{dev.name} batch {B}: {k} did not fit")
        for k, v in run["step_ms"].items():
            if k.startswith("PyTorch"):
                print(f"clnn runs at {v / run['step_ms']['clnn']:.2f}x {k}'s speed "
                      f"({flops / run['step_ms']['clnn'] / 1e6:.0f} GFLOP/s); pool peak "
                      f"{run['pool_peak_bytes'] / 2**30:.2f} GiB")
        result["runs"].append(run)
    print(f"results: {_common.write_json('bench_tutorial', result, args.json)}")


if __name__ == "__main__":
    main()
