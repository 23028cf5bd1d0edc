"""One training step of LeNet-5, the lecture's network: clnn on every OpenCL device
beside PyTorch CPU in the same run.

    python benchmarks/bench_lenet.py [--device SPEC] [--repeats 5] [--batch 64]

Network (as `clnn train lenet5`): 1x32x32 inputs, conv 5x5 6 relu, max-pool 2, conv
5x5 16 relu, max-pool 2, dense 120 relu, 84 relu, 10 with softmax cross-entropy, SGD
with momentum 0.9. Before timing, one step from the same weights is compared with
PyTorch's (loss and updated first-layer filters). Writes
benchmarks/results/bench_lenet.json.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from clnn import nn  # noqa: E402

LR, MOMENTUM = 0.02, 0.9


def make_net(dev):
    return nn.Sequential([nn.Conv2d(6, 5), nn.MaxPool2d(2), nn.Conv2d(16, 5),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Dense(120, "relu"),
                          nn.Dense(84, "relu"), nn.Dense(10, "softmax")],
                         in_shape=(1, 32, 32), device=dev, seed=0)


def torch_model(torch, net):
    """PyTorch's copy of the network; its loss takes clnn's one-hot targets."""
    T = torch.nn
    conv1, conv2 = T.Conv2d(1, 6, 5), T.Conv2d(6, 16, 5)
    fc = [T.Linear(400, 120), T.Linear(120, 84), T.Linear(84, 10)]
    trainable = [l for l in net.layers if getattr(l, "weight", None) is not None]
    with torch.no_grad():
        for mine, theirs in zip(trainable, [conv1, conv2] + fc):
            theirs.weight.copy_(torch.from_numpy(mine.weight.get()))
            theirs.bias.copy_(torch.from_numpy(mine.bias.get()))
    model = T.Sequential(conv1, T.ReLU(), T.MaxPool2d(2), conv2, T.ReLU(), T.MaxPool2d(2),
                         T.Flatten(), fc[0], T.ReLU(), fc[1], T.ReLU(), fc[2])
    return model, lambda logits, y: T.functional.cross_entropy(logits, y.argmax(1))


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args(argv)
    B = args.batch
    rng = np.random.default_rng(0)
    x = rng.random((B, 1, 32, 32), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, B)]
    # forward multiply-adds of the two convolutions and three dense layers, x3 for a step
    macs = 28 * 28 * 6 * 25 + 10 * 10 * 16 * 150 + 400 * 120 + 120 * 84 + 84 * 10
    flops = 3 * 2 * B * macs
    res = _common.step_benchmark(args, make_net, torch_model, x, y, "cross_entropy", LR,
                                 MOMENTUM, flops)
    result = {"network": "LeNet-5", "batch": B, "step_seconds": res["step_seconds"],
              "update_seconds": res.get("update_seconds", {})}
    print(f"results: {_common.write_json('bench_lenet', result, args.json)}")


if __name__ == "__main__":
    main()
