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
    mods = [T.Conv2d(1, 6, 5), T.Conv2d(6, 16, 5), T.Linear(400, 120), T.Linear(120, 84),
            T.Linear(84, 10)]
    return _common.torch_classifier(torch, net, mods, [
        0, T.ReLU(), T.MaxPool2d(2), 1, T.ReLU(), T.MaxPool2d(2), T.Flatten(), 2, T.ReLU(),
        3, T.ReLU(), 4])


def main(argv=None):
    # forward multiply-adds of the two convolutions and three dense layers
    _common.classifier_step(
        argv, __doc__, name="bench_lenet", network="LeNet-5", make_net=make_net,
        torch_model=torch_model, x_of=lambda rng, B: rng.random((B, 1, 32, 32),
                                                                dtype=np.float32),
        macs=28 * 28 * 6 * 25 + 10 * 10 * 16 * 150 + 400 * 120 + 120 * 84 + 84 * 10,
        lr=LR, momentum=MOMENTUM)


if __name__ == "__main__":
    main()
