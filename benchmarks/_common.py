"""Shared benchmark helpers: devices, timing, reference libraries, result files.

Every benchmark validates a result against a reference before timing it, warms up,
then reports the median of several repeats. Times are wall-clock with the device
queue finished (what a user waits for), including any packing or workspace the op
needs.
"""

import json
import os
import platform
import statistics
import time

import numpy as np

import clnn
from clnn.device import all_devices

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def arg_parser(doc):
    """The options every benchmark takes: --device, --repeats, --json."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", help="one clnn device spec (default: every device found)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="result file (default benchmarks/results/NAME.json)")
    return ap


def median_time(fn, repeats=5, warmup=1, sync=None):
    """Median seconds of ``fn()`` (followed by ``sync()``) after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
        if sync:
            sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def devices(spec=None):
    """The clnn devices to benchmark: the one ``spec`` names, else every device found."""
    if spec:
        return [clnn.device(spec)]
    return [clnn.device(d) for _, _, d in all_devices()]


def torch_or_none():
    try:
        import torch
        return torch
    except ImportError:
        return None


def numpy_blas():
    """Which BLAS numpy runs, for the report (threadpoolctl when present)."""
    try:
        from threadpoolctl import threadpool_info
        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            return f"{info[0].get('internal_api')} {info[0].get('version')} " \
                   f"({info[0].get('architecture')}, {info[0].get('num_threads')} threads)"
    except ImportError:
        pass
    return "unknown BLAS"


def machine():
    return {"machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "blas": numpy_blas(),
            "env": {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                               "POCL_MAX_WORK_GROUP_SIZE")
                    if k in os.environ}}


def write_json(name, payload, path=None):
    path = path or os.path.join(RESULTS, f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = dict(payload, machine=machine(),
                   date=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)
    return path


def step_benchmark(args, make_net, torch_model, x, y, loss, lr, momentum, flops,
                   report=None):
    """One SGD-with-momentum training step of a clnn network beside PyTorch CPU's.

    ``make_net(dev)`` builds the clnn network; ``torch_model(torch, net)`` returns
    (model, loss_fn) with the same weights. Before timing, one step from the same
    weights must give PyTorch's loss and first-layer weights. ``report(dev, net, key,
    seconds)`` may print and return extra fields for the device. Returns
    {"step_seconds": {library: seconds}, "extra": {library: fields}}.
    """
    torch = torch_or_none()
    result = {"step_seconds": {}, "extra": {}}

    def torch_step_fn(net):
        model, loss_fn = torch_model(torch, net)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        X, Y = torch.from_numpy(x), torch.from_numpy(y)

        def step():
            opt.zero_grad(set_to_none=False)
            value = loss_fn(model(X), Y)
            value.backward()
            opt.step()
            return value
        first = next(m for m in model.modules() if hasattr(m, "weight"))
        return first, step

    for dev in devices(args.device):
        net = make_net(dev)
        X, Y = clnn.asarray(x, device=dev), clnn.asarray(y, device=dev)
        if torch is not None:
            first, tstep = torch_step_fn(net)
            want = float(tstep().detach())
            got = float(net.train_step(X, Y, lr, momentum, loss).get())
            w_t = first.weight.detach().numpy()
            w_c = net.layers[0].weight.get()
            if abs(got - want) > 1e-4 * abs(want) or np.abs(w_t - w_c).max() > 1e-4:
                raise SystemExit(f"clnn and PyTorch disagree after one step: loss {got} vs "
                                 f"{want}, max weight difference {np.abs(w_t - w_c).max()}")
            print(f"validated: one step matches PyTorch (loss {got:.6f})")
        dev.finish()
        dev.pool.reset_peak()
        t = median_time(lambda: net.train_step(X, Y, lr, momentum, loss), args.repeats,
                        warmup=2, sync=dev.finish)
        key = f"clnn ({dev.name})"
        result["step_seconds"][key] = t
        print(f"{key}: {1e3 * t:.2f} ms per step ({flops / t / 1e9:.1f} GFLOP/s)")
        if report:
            result["extra"][key] = report(dev, net, key, t)
    if torch is not None:
        _, tstep = torch_step_fn(make_net(devices(args.device)[0]))
        t = median_time(tstep, args.repeats, warmup=2)
        result["step_seconds"]["PyTorch CPU"] = t
        print(f"PyTorch CPU: {1e3 * t:.2f} ms per step ({flops / t / 1e9:.1f} GFLOP/s, "
              f"{torch.get_num_threads()} threads)")
        for k, v in result["step_seconds"].items():
            if k.startswith("clnn"):
                print(f"{k} runs at {t / v:.2f}x PyTorch CPU's speed")
    return result
