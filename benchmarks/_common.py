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


def enqueue_time(dev, fn, calls, repeats=1):
    """Median over ``repeats`` of the seconds per call of ``calls`` calls of ``fn`` made
    back to back without waiting (the queue finished before and after): a call's host
    time (Python and the driver's enqueue) where the device keeps up."""
    times = []
    for _ in range(repeats):
        dev.finish()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
        dev.finish()
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


def torch_cuda():
    """PyTorch when it has a CUDA GPU (the cuBLAS/cuDNN reference on NVIDIA machines),
    with TF32 off so float32 is float32; else None."""
    torch = torch_or_none()
    if torch is None or not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def cuda_time(torch, fn, repeats, warmup=2):
    """median_time for PyTorch CUDA: synchronised after every call, as clnn's finish."""
    return median_time(fn, repeats, warmup=warmup, sync=torch.cuda.synchronize)


def clblast_gemm():
    """A function gemm(dev, M, N, K, a, b, c, ta, tb) running CLBlast's SGEMM on clnn's
    queue: through pyclblast when it is installed, else through Debian's libclblast
    with ctypes (GPU images often have the library but cannot build pyclblast); None
    without either."""
    try:
        import pyclblast

        def run(dev, M, N, K, a, b, c, ta, tb):
            pyclblast.gemm(dev.queue, M, N, K, a, b, c, a_ld=a.shape[1], b_ld=b.shape[1],
                           c_ld=N, a_transp=ta, b_transp=tb)
        return run
    except ImportError:
        pass
    import ctypes
    import ctypes.util
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("clblast") or "libclblast.so.1")
    except OSError:
        return None

    def run(dev, M, N, K, a, b, c, ta, tb):
        q, ev, sz = ctypes.c_void_p(dev.queue.int_ptr), ctypes.c_void_p(0), ctypes.c_size_t
        status = lib.CLBlastSgemm(
            ctypes.c_int(101), ctypes.c_int(112 if ta else 111),
            ctypes.c_int(112 if tb else 111), sz(M), sz(N), sz(K), ctypes.c_float(1.0),
            ctypes.c_void_p(a.base_data.int_ptr), sz(a.offset // 4), sz(a.shape[1]),
            ctypes.c_void_p(b.base_data.int_ptr), sz(b.offset // 4), sz(b.shape[1]),
            ctypes.c_float(0.0), ctypes.c_void_p(c.base_data.int_ptr), sz(c.offset // 4),
            sz(N), ctypes.byref(q), ctypes.byref(ev))
        if status != 0:
            raise RuntimeError(f"CLBlastSgemm returned status {status}")
    return run


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


def torch_mlp(torch, net, in_features, layers, batch):
    """PyTorch's copy of a dense clnn network of (width, "tanh" | "sigmoid") layers with
    the same weights, and the tutorial's quadratic loss sum((out - y)^2) / (2 batch)."""
    modules, width = [], in_features
    for (w, a), layer in zip(layers, net.layers):
        lin = torch.nn.Linear(width, w)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(layer.weight.get()))
            lin.bias.copy_(torch.from_numpy(layer.bias.get()))
        modules += [lin, torch.nn.Tanh() if a == "tanh" else torch.nn.Sigmoid()]
        width = w
    return torch.nn.Sequential(*modules), lambda out, y: ((out - y) ** 2).sum() / (2 * batch)


def step_benchmark(args, make_net, torch_model, x, y, loss, lr, momentum, flops,
                   report=None):
    """One SGD-with-momentum training step of a clnn network beside PyTorch CPU's (and
    PyTorch CUDA's, on a machine with an NVIDIA GPU).

    ``make_net(dev)`` builds the clnn network; ``torch_model(torch, net)`` returns
    (model, loss_fn) with the same weights. Before timing, one step from the same
    weights must give PyTorch's loss and first-layer weights. ``report(dev, net, key,
    seconds, stats)`` may print and return extra fields for the device; ``stats`` is the
    pool's stats() right after the plain steps were timed (its peak: theirs, before
    the replayed steps' networks and captures). Returns
    {"step_seconds": {library: seconds}, "extra": {library: fields}}.
    """
    torch = torch_or_none()
    result = {"step_seconds": {}, "extra": {}}

    def torch_step_fn(net, cuda=False):
        model, loss_fn = torch_model(torch, net)
        if cuda:
            model = model.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        X, Y = torch.from_numpy(x), torch.from_numpy(y)
        if cuda:
            X, Y = X.cuda(), Y.cuda()

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
        stats = dev.pool.stats()
        key = f"clnn ({dev.name})"
        result["step_seconds"][key] = t
        print(f"{key}: {1e3 * t:.2f} ms per step ({flops / t / 1e9:.1f} GFLOP/s)")
        # replayed steps (what fit runs): checked first to give bitwise the weights of
        # plain steps from the same start, then timed
        pair = [make_net(dev), make_net(dev)]
        for _ in range(3):
            for i, other in enumerate(pair):
                other.train_step(X, Y, lr, momentum, loss, replay=i == 1)
        if not all(np.array_equal(p.get(), q.get())
                   for p, q in zip(pair[0].parameters(), pair[1].parameters())):
            raise SystemExit("replayed steps differ from plain steps")
        rnet = pair[1]
        t_rep = median_time(lambda: rnet.train_step(X, Y, lr, momentum, loss, replay=True),
                            args.repeats, warmup=2, sync=dev.finish)
        result["step_seconds"][f"{key}, replayed"] = t_rep
        print(f"{key}, replayed (fit's steps): {1e3 * t_rep:.2f} ms per step "
              f"({flops / t_rep / 1e9:.1f} GFLOP/s)")
        del pair, rnet
        # The step computes gradients into buffers, then updates (the hook's place).
        # The update alone bounds what fusing it into the gradient GEMMs (the
        # tutorial's path, which had no gradient to hand to a hook) could save.
        flat, flat_g = [net.flat_parameters], [net.flat_gradients]
        t_upd = median_time(lambda: net.optimizer.step(flat, flat_g, 1.0 / len(x)),
                            args.repeats, warmup=2, sync=dev.finish)
        result.setdefault("update_seconds", {})[key] = t_upd
        print(f"{key}: of which the optimizer's update {1e3 * t_upd:.3f} ms "
              f"({100 * t_upd / t:.1f}% of the step, the most a gradient GEMM with the "
              "update fused in could save)")
        if report:
            result["extra"][key] = report(dev, net, key, t, stats)
    if torch is not None:
        _, tstep = torch_step_fn(make_net(devices(args.device)[0]))
        t = median_time(tstep, args.repeats, warmup=2)
        result["step_seconds"]["PyTorch CPU"] = t
        print(f"PyTorch CPU: {1e3 * t:.2f} ms per step ({flops / t / 1e9:.1f} GFLOP/s, "
              f"{torch.get_num_threads()} threads)")
        for k, v in result["step_seconds"].items():
            if k.startswith("clnn"):
                print(f"{k} runs at {t / v:.2f}x PyTorch CPU's speed")
    cuda = torch_cuda()
    if cuda is not None:
        _, tstep = torch_step_fn(make_net(devices(args.device)[0]), cuda=True)
        t = cuda_time(cuda, tstep, args.repeats)
        result["step_seconds"]["PyTorch CUDA"] = t
        print(f"PyTorch CUDA ({cuda.cuda.get_device_name()}): {1e3 * t:.2f} ms per step")
        for k, v in result["step_seconds"].items():
            if k.startswith("clnn"):
                print(f"{k} runs at {t / v:.2f}x PyTorch CUDA's speed")
    return result


def torch_classifier(torch, net, modules, layout):
    """PyTorch's copy of a clnn classifier: ``modules`` (its layers with weights, in
    clnn's order) take the network's weights and biases; ``layout`` lists the model,
    an int standing for modules[i]. Its loss takes clnn's one-hot targets."""
    trainable = [l for l in net.layers if getattr(l, "weight", None) is not None]
    with torch.no_grad():
        for mine, theirs in zip(trainable, modules):
            theirs.weight.copy_(torch.from_numpy(mine.weight.get()))
            theirs.bias.copy_(torch.from_numpy(mine.bias.get()))
    model = torch.nn.Sequential(*[modules[m] if isinstance(m, int) else m for m in layout])
    return model, lambda logits, y: torch.nn.functional.cross_entropy(logits, y.argmax(1))


def classifier_step(argv, doc, *, name, network, make_net, torch_model, x_of, macs, lr,
                    momentum):
    """The main of a training-step benchmark of a 10-class classifier: ``x_of(rng,
    batch)`` draws the inputs, ``macs`` is the forward pass's multiply-adds per example
    (a step's flops are 6 of them); writes benchmarks/results/``name``.json."""
    ap = arg_parser(doc)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args(argv)
    B = args.batch
    rng = np.random.default_rng(0)
    x = x_of(rng, B)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, B)]
    res = step_benchmark(args, make_net, torch_model, x, y, "cross_entropy", lr, momentum,
                         3 * 2 * B * macs)
    result = {"network": network, "batch": B, "step_seconds": res["step_seconds"],
              "update_seconds": res.get("update_seconds", {})}
    print(f"results: {write_json(name, result, args.json)}")
