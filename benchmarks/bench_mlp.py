"""One training step of the tutorial's network, scaled to this machine: clnn on every
OpenCL device beside PyTorch CPU in the same run.

    python benchmarks/bench_mlp.py [--device SPEC] [--repeats 5]

Network: 2000 inputs, batch 1000, dense 5000 tanh, 1000 sigmoid, 10 sigmoid, quadratic
loss, SGD with momentum 0.9. Before timing, one step from the same weights is compared
with PyTorch's (loss and updated weights). Also reports the pool's peak memory against
the bytes the network's own buffers need. Writes benchmarks/results/bench_mlp.json.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import clnn  # noqa: E402
from clnn import nn  # noqa: E402

IN, BATCH = 2000, 1000
LAYERS = [(5000, "tanh"), (1000, "sigmoid"), (10, "sigmoid")]
LR, MOMENTUM = 0.1, 0.9


def make_net(dev):
    return nn.Sequential([nn.Dense(w, a) for w, a in LAYERS], IN, device=dev, seed=0)


def torch_step_fn(torch, net, x, y):
    layers = []
    width = IN
    for (w, a), layer in zip(LAYERS, net.layers):
        lin = torch.nn.Linear(width, w)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(layer.weight.get()))
            lin.bias.copy_(torch.from_numpy(layer.bias.get()))
        layers += [lin, torch.nn.Tanh() if a == "tanh" else torch.nn.Sigmoid()]
        width = w
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    X, Y = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = ((model(X) - Y) ** 2).sum() / (2 * BATCH)
        loss.backward()
        opt.step()
        return loss
    return model, step


def buffers_needed(net):
    """Bytes of parameters, update buffers, activations and deltas, input and target."""
    item = net.dtype.itemsize
    params = sum(l.weight.size + l.bias.size for l in net.layers)
    acts = sum(BATCH * l.out_features for l in net.layers)
    return item * (2 * params + 2 * acts + BATCH * (IN + net.out_features) + BATCH)


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, IN), dtype=np.float32)
    y = rng.random((BATCH, 10), dtype=np.float32)
    flops = 3 * 2 * BATCH * sum(a * b for a, b in zip([IN] + [w for w, _ in LAYERS],
                                                         [w for w, _ in LAYERS]))
    result = {"network": f"{IN}-" + "-".join(f"{w} {a}" for w, a in LAYERS),
              "batch": BATCH, "step_seconds": {}, "memory": {}}
    torch = _common.torch_or_none()
    for dev in _common.devices(args.device):
        net = make_net(dev)
        X, Y = clnn.asarray(x, device=dev), clnn.asarray(y, device=dev)
        if torch is not None:
            model, tstep = torch_step_fn(torch, net, x, y)
            want = float(tstep().detach())
            got = float(net.train_step(X, Y, LR, MOMENTUM, "quadratic").get())
            w_t = model[0].weight.detach().numpy()
            w_c = net.layers[0].weight.get()
            if abs(got - want) > 1e-4 * abs(want) or np.abs(w_t - w_c).max() > 1e-4:
                raise SystemExit(f"clnn and PyTorch disagree after one step: loss {got} vs "
                                 f"{want}, max weight difference {np.abs(w_t - w_c).max()}")
            print(f"validated: one step matches PyTorch (loss {got:.6f})")
        dev.finish()
        dev.pool.reset_peak()
        t = _common.median_time(lambda: net.train_step(X, Y, LR, MOMENTUM, "quadratic"),
                                args.repeats, warmup=2, sync=dev.finish)
        key = f"clnn ({dev.name})"
        result["step_seconds"][key] = t
        s = dev.pool.stats()
        result["memory"][key] = {"pool_peak_bytes": s["peak_bytes"],
                                 "network_buffers_bytes": buffers_needed(net)}
        print(f"{key}: {t:.3f} s per step ({flops / t / 1e9:.0f} GFLOP/s); pool peak "
              f"{s['peak_bytes'] / 2**20:.0f} MiB for {buffers_needed(net) / 2**20:.0f} MiB "
              "of network buffers (the rest: GEMM packing workspace, inputs)")
    if torch is not None:
        model, tstep = torch_step_fn(torch, make_net(_common.devices(args.device)[0]), x, y)
        t = _common.median_time(tstep, args.repeats, warmup=2)
        result["step_seconds"]["PyTorch CPU"] = t
        print(f"PyTorch CPU: {t:.3f} s per step ({flops / t / 1e9:.0f} GFLOP/s, "
              f"{torch.get_num_threads()} threads)")
        for k, v in result["step_seconds"].items():
            if k.startswith("clnn"):
                print(f"{k} runs at {t / v:.2f}x PyTorch CPU's speed")
    print(f"results: {_common.write_json('bench_mlp', result, args.json)}")


if __name__ == "__main__":
    main()
