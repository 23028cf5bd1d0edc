"""LeNet-5 on MNIST with SGD and with Adam, in clnn and in PyTorch from the same initial
weights and the same order of batches: does an optimizer reach what it should, and
does clnn's training follow PyTorch's?

    python benchmarks/optimizers_lenet.py [--device SPEC] [--epochs 15]

The task of `clnn train lenet5` (4000 training digits padded to 32x32, 1000 test
digits, batch 32, 15 epochs); SGD as that job trains (lr 0.02, momentum 0.9), Adam with
PyTorch's defaults (lr 1e-3). Prints the test accuracy after every epoch and writes
benchmarks/results/optimizers_lenet.json. Not a timing: accuracy only.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from clnn import datasets, nn, optim  # noqa: E402

BATCH = 32
CONFIGS = {"SGD": (lambda: optim.SGD(lr=0.02, momentum=0.9),
                   lambda torch, params: torch.optim.SGD(params, lr=0.02, momentum=0.9)),
           "Adam": (lambda: optim.Adam(lr=1e-3),
                    lambda torch, params: torch.optim.Adam(params, lr=1e-3))}


def lenet(dev):
    return nn.Sequential([nn.Conv2d(6, 5), nn.MaxPool2d(2), nn.Conv2d(16, 5),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Dense(120, "relu"),
                          nn.Dense(84, "relu"), nn.Dense(10, "softmax")],
                         in_shape=(1, 32, 32), device=dev, seed=0)


def torch_run(torch, net, make_opt, data, epochs):
    """PyTorch's LeNet-5 with ``net``'s initial weights, trained on fit's batch order
    (numpy's permutation with seed 0 each epoch); test accuracy per epoch."""
    T = torch.nn
    model = T.Sequential(T.Conv2d(1, 6, 5), T.ReLU(), T.MaxPool2d(2), T.Conv2d(6, 16, 5),
                         T.ReLU(), T.MaxPool2d(2), T.Flatten(), T.Linear(400, 120), T.ReLU(),
                         T.Linear(120, 84), T.ReLU(), T.Linear(84, 10))
    with torch.no_grad():
        for p, v in zip(model.parameters(), net.parameters()):
            p.copy_(torch.from_numpy(v.get()))
    opt = make_opt(torch, model.parameters())
    x_train, y_train, x_test, y_test = data
    X, Y = torch.from_numpy(x_train), torch.from_numpy(y_train.astype(np.int64))
    Xt = torch.from_numpy(x_test)
    rng = np.random.default_rng(0)
    accs = []
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(X)))
        for start in range(0, len(X), BATCH):
            idx = order[start:start + BATCH]
            opt.zero_grad()
            T.functional.cross_entropy(model(X[idx]), Y[idx]).backward()
            opt.step()
        with torch.no_grad():
            accs.append(float((model(Xt).argmax(1).numpy() == y_test).mean()))
    return accs


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--epochs", type=int, default=15)
    args = ap.parse_args(argv)
    dev = _common.devices(args.device)[0]
    x, y = datasets.mnist()
    x = np.pad(x.reshape(-1, 1, 28, 28), ((0, 0), (0, 0), (2, 2), (2, 2)))
    data = datasets.split(x, y, 4000, seed=0)
    torch = _common.torch_or_none()
    if torch is not None:
        torch.manual_seed(0)
    result = {}
    for name, (ours, theirs) in CONFIGS.items():
        net = lenet(dev)
        runs = {}
        if torch is not None:
            runs["PyTorch CPU"] = torch_run(torch, net, theirs, data, args.epochs)
        hist = net.fit(data[0], data[1], "cross_entropy", epochs=args.epochs,
                       batch_size=BATCH, optimizer=ours(), seed=0,
                       validation=(data[2], data[3]))
        runs[f"clnn ({dev.name})"] = hist["val_accuracy"]
        for who, accs in runs.items():
            print(f"{name:4s} {who}: " + " ".join(f"{100 * a:.1f}" for a in accs) +
                  f"  (best {100 * max(accs):.1f}%)")
        result[name] = runs
    print(f"results: {_common.write_json('optimizers_lenet', result, args.json)}")


if __name__ == "__main__":
    main()
