"""A subset of ops under Oclgrind with GPU-like limits and data-race detection.

Oclgrind stands in for a GPU's strictness: 32 KiB of local memory, 256 work-items per
work-group, and reports of races and out-of-bounds accesses, which PoCL would forgive.
Its exit code stays 0, so the gate is an empty log.
"""

import os
import subprocess
import sys

import pytest

from conftest import gate

ICD = "/usr/lib/oclgrind/liboclgrind-rt-icd.so"
HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = gate("oclgrind", os.path.exists(ICD))


def run_battery(tmp_path, which):
    vendors = tmp_path / "oclgrind.icd"
    vendors.write_text(ICD + "\n")
    log = tmp_path / "oclgrind.log"
    env = dict(os.environ, OCL_ICD_VENDORS=str(vendors), OCLGRIND_DATA_RACES="1",
               OCLGRIND_LOCAL_MEM_SIZE="32768", OCLGRIND_MAX_WGSIZE="256",
               OCLGRIND_LOG=str(log), PYOPENCL_NO_CACHE="1", CLNN_DEVICE="oclgrind",
               CLNN_POOL_EXACT="1",
               PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    env.pop("CLNN_TEST_DEVICE", None)
    res = subprocess.run([sys.executable, os.path.join(HERE, "oclgrind_battery.py"), which],
                         env=env, capture_output=True, text=True, timeout=900)
    text = log.read_text() if log.exists() else ""
    return res, text


@pytest.mark.parametrize("battery,done", [("ops", "battery passed"),
                                           ("gemm", "checked"),     # every GEMM variant
                                           ("conv", "checked"),     # convolution, pooling
                                           ("engines", "checked"),  # mma rows, emulated
                                           ("wgmma", "checked")])   # and WGMMA rows
def test_runs_clean_under_oclgrind(tmp_path, battery, done):
    res, log = run_battery(tmp_path, battery)
    assert res.returncode == 0, res.stdout + res.stderr
    assert done in res.stdout
    assert log.strip() == "", "Oclgrind reported:\n" + log


def test_oclgrind_reports_an_out_of_bounds_write(tmp_path):
    res, log = run_battery(tmp_path, "bad")
    assert "Invalid write" in log or "out-of-bounds" in log.lower(), log
