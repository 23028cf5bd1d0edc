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

from clnn import nn  # noqa: E402

IN, BATCH = 2000, 1000
LAYERS = [(5000, "tanh"), (1000, "sigmoid"), (10, "sigmoid")]
LR, MOMENTUM = 0.1, 0.9


def make_net(dev):
    return nn.Sequential([nn.Dense(w, a) for w, a in LAYERS], IN, device=dev, seed=0)


def torch_model(torch, net):
    """PyTorch's copy of the network, and the tutorial's quadratic loss."""
    return _common.torch_mlp(torch, net, IN, LAYERS, BATCH)


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

    def memory(dev, net, key, t, s):
        print(f"{key}: plain steps' pool peak {s['peak_bytes'] / 2**20:.0f} MiB for "
              f"{buffers_needed(net) / 2**20:.0f} MiB of network buffers (the rest: GEMM "
              "packing workspace, inputs)")
        return {"pool_peak_bytes": s["peak_bytes"],
                "network_buffers_bytes": buffers_needed(net)}
    res = _common.step_benchmark(args, make_net, torch_model, x, y, "quadratic", LR,
                                 MOMENTUM, flops, memory)
    result = {"network": f"{IN}-" + "-".join(f"{w} {a}" for w, a in LAYERS),
              "batch": BATCH, "step_seconds": res["step_seconds"],
              "update_seconds": res.get("update_seconds", {}), "memory": res["extra"]}
    print(f"results: {_common.write_json('bench_mlp', result, args.json)}")


if __name__ == "__main__":
    main()
