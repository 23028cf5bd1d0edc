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
    mods = [T.Conv2d(c, m, 3, padding=1) for c, m in CONVS] + \
        [T.Linear(64 * 8 * 8, 128), T.Linear(128, 10)]
    return _common.torch_classifier(torch, net, mods, [
        0, T.ReLU(), 1, T.ReLU(), T.MaxPool2d(2), 2, T.ReLU(), 3, T.ReLU(), T.MaxPool2d(2),
        T.Flatten(), 4, T.ReLU(), 5])


def main(argv=None):
    # forward multiply-adds of the convolutions (two at 32x32, two at 16x16) and the
    # dense layers
    sides = [32, 32, 16, 16]
    _common.classifier_step(
        argv, __doc__, name="bench_cifar", network="CIFAR-like CNN", make_net=make_net,
        torch_model=torch_model,
        x_of=lambda rng, B: rng.standard_normal((B, 3, 32, 32), dtype=np.float32),
        macs=sum(s * s * m * c * 9 for s, (c, m) in zip(sides, CONVS)) + 4096 * 128 + 128 * 10,
        lr=LR, momentum=MOMENTUM)


if __name__ == "__main__":
    main()
