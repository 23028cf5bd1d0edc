"""One training step of a small CIFAR-10-shaped CNN: clnn on every OpenCL device beside
PyTorch CPU (and PyTorch CUDA on a machine with an NVIDIA GPU) in the same run.

    python benchmarks/bench_cifar.py [--device SPEC] [--repeats 5] [--batch 64]

Network: 3x32x32 inputs, two 3x3 convolutions of 32 filters (padding 1, relu), max-pool
2, two 3x3 convolutions of 64 filters, max-pool 2, dense 128 relu, 10 with softmax
cross-entropy, SGD with momentum 0.9: the shapes a CPU user's first image classifier
has, whose 3-channel input layer and 32x32 planes the ResNet-like layers of
bench_conv.py do not cover. Before timing, one step from the same weights is compared
with PyTorch's (loss and updated first-layer filters). Writes
benchmarks/results/bench_cifar.json.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from clnn import nn  # noqa: E402

LR, MOMENTUM = 0.01, 0.9
CONVS = [(3, 32), (32, 32), (32, 64), (64, 64)]      # (in, out) channels, 3x3, padding 1


def make_net(dev):
    return nn.Sequential([nn.Conv2d(32, 3, padding=1), nn.Conv2d(32, 3, padding=1),
                          nn.MaxPool2d(2), nn.Conv2d(64, 3, padding=1),
                          nn.Conv2d(64, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Dense(128, "relu"), nn.Dense(10, "softmax")],
                         in_shape=(3, 32, 32), device=dev, seed=0)


def torch_model(torch, net):
    """PyTorch's copy of the network; its loss takes clnn's one-hot targets."""
    T = torch.nn
    convs = [T.Conv2d(c, m, 3, padding=1) for c, m in CONVS]
    fc = [T.Linear(64 * 8 * 8, 128), T.Linear(128, 10)]
    trainable = [l for l in net.layers if getattr(l, "weight", None) is not None]
    with torch.no_grad():
        for mine, theirs in zip(trainable, convs + fc):
            theirs.weight.copy_(torch.from_numpy(mine.weight.get()))
            theirs.bias.copy_(torch.from_numpy(mine.bias.get()))
    model = T.Sequential(convs[0], T.ReLU(), convs[1], T.ReLU(), T.MaxPool2d(2),
                         convs[2], T.ReLU(), convs[3], T.ReLU(), T.MaxPool2d(2),
                         T.Flatten(), fc[0], T.ReLU(), fc[1])
    return model, lambda logits, y: T.functional.cross_entropy(logits, y.argmax(1))


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args(argv)
    B = args.batch
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, 3, 32, 32), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, B)]
    # forward multiply-adds of the convolutions (two at 32x32, two at 16x16) and the
    # dense layers, x3 for a step
    sides = [32, 32, 16, 16]
    macs = sum(s * s * m * c * 9 for s, (c, m) in zip(sides, CONVS)) + 4096 * 128 + 128 * 10
    flops = 3 * 2 * B * macs
    res = _common.step_benchmark(args, make_net, torch_model, x, y, "cross_entropy", LR,
                                 MOMENTUM, flops)
    result = {"network": "CIFAR-like CNN", "batch": B, "step_seconds": res["step_seconds"],
              "update_seconds": res.get("update_seconds", {})}
    print(f"results: {_common.write_json('bench_cifar', result, args.json)}")


if __name__ == "__main__":
    main()
