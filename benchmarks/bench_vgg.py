"""One training step of a VGG-like CNN on CIFAR-10-sized images: clnn on every OpenCL
device beside PyTorch CPU (and PyTorch CUDA on a machine with an NVIDIA GPU) in the
same run.

    python benchmarks/bench_vgg.py [--device SPEC] [--repeats 5] [--batch 64]

Network (VGG-11's channel plan on 32x32 inputs): 3x3 convolutions with padding 1 and
relu, 64 filters, max-pool 2, 128, max-pool 2, 256, 256, max-pool 2, 512, 512,
max-pool 2 (2x2x512), then dense 10 with softmax cross-entropy, SGD with momentum 0.9. Most of
its multiply-adds are in 3x3 layers of 128 to 512 channels, which clnn's CPU path runs
as Winograd's F(4x4, 3x3) (bench_cifar.py's network has only 32 and 64). Before timing,
one step from the same weights is compared with PyTorch's (loss and updated
first-layer filters). Writes benchmarks/results/bench_vgg.json.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from clnn import nn  # noqa: E402

LR, MOMENTUM = 0.01, 0.9
# (in, out) channels and the side of each 3x3 convolution; "pool" after the ones marked
CONVS = [(3, 64, 32, True), (64, 128, 16, True), (128, 256, 8, False),
         (256, 256, 8, True), (256, 512, 4, False), (512, 512, 4, True)]


def make_net(dev):
    layers = []
    for _, m, _, pool in CONVS:
        layers.append(nn.Conv2d(m, 3, padding=1))
        if pool:
            layers.append(nn.MaxPool2d(2))
    layers += [nn.Flatten(), nn.Dense(10, "softmax")]
    return nn.Sequential(layers, in_shape=(3, 32, 32), device=dev, seed=0)


def torch_model(torch, net):
    """PyTorch's copy of the network; its loss takes clnn's one-hot targets."""
    T = torch.nn
    mods = [T.Conv2d(c, m, 3, padding=1) for c, m, _, _ in CONVS] + [T.Linear(512 * 2 * 2, 10)]
    order = []
    for i, (_, _, _, pool) in enumerate(CONVS):
        order += [i, T.ReLU()] + ([T.MaxPool2d(2)] if pool else [])
    return _common.torch_classifier(torch, net, mods, order + [T.Flatten(), len(CONVS)])


def main(argv=None):
    _common.classifier_step(
        argv, __doc__, name="bench_vgg", network="VGG-like CNN", make_net=make_net,
        torch_model=torch_model,
        x_of=lambda rng, B: rng.standard_normal((B, 3, 32, 32), dtype=np.float32),
        macs=sum(s * s * m * c * 9 for c, m, s, _ in CONVS) + 2048 * 10,
        lr=LR, momentum=MOMENTUM)


if __name__ == "__main__":
    main()
