import subprocess
import sys


def clnn_cli(*args):
    return subprocess.run([sys.executable, "-m", "clnn", *args], capture_output=True,
                          text=True, timeout=300)


def test_devices_lists_facts():
    r = clnn_cli("devices")
    assert r.returncode == 0
    assert "Portable Computing Language" in r.stdout and "local memory" in r.stdout
    assert sum(line.startswith("* ") for line in r.stdout.splitlines()) == 1
    # the vectors of a CPU's code, which decide its GEMM and convolution tiles
    cpus = r.stdout.count("type CPU")
    assert cpus and r.stdout.count("-bit vectors in its compiled code") == cpus
    assert "extensions:" not in r.stdout
    # and the command buffers clnn.cmdbuf can replay steps through, where a device has them
    from clnn.device import all_devices
    have = sum("cl_khr_command_buffer" in d.extensions.split() for _, _, d in all_devices())
    assert r.stdout.count("command buffers (cl_khr_command_buffer)") == have


def test_devices_lists_extensions_when_asked():
    import clnn
    r = clnn_cli("devices", "--extensions")
    assert r.returncode == 0, r.stderr
    devices = r.stdout.count("  type ")
    assert devices and r.stdout.count("      extensions: ") == devices
    # every extension of the default device (the lines wrap between names)
    words = r.stdout.split()
    for name in clnn.device().cl_device.extensions.split():
        assert name in words, name


def test_render_prints_the_source():
    r = clnn_cli("render", "gemm", "--dtype", "float64", "--param", "variant=local",
                 "--param", "trans_a=true", "--param", "KWG=4")
    assert r.returncode == 0, r.stderr
    assert "typedef double real_t;" in r.stdout and "#define KWG 4" in r.stdout
    assert "clnn_gemm_tiled" in r.stdout and "a_lmv[" in r.stdout
    assert "#define KWG 4 " in r.stdout
    assert clnn_cli("render", "nope").returncode == 2
    assert clnn_cli("render", "elementwise", "--param", "act").returncode == 2
    bad = clnn_cli("render", "elementwise", "--param", "act=swish")
    assert bad.returncode == 1 and "TemplateError" in bad.stderr


def test_selfcheck_passes():
    r = clnn_cli("selfcheck", "--quick")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all ops match numpy" in r.stdout and "FAIL" not in r.stdout


def test_train_resumes_bitwise(tmp_path):
    """`clnn train mnist` saves after every epoch; 1 epoch, then --resume for the 2nd,
    gives bitwise the weights of 2 epochs in one go (and refuses another network)."""
    import numpy as np
    import pytest
    pytest.importorskip("mlxtend")
    one, two = tmp_path / "one", tmp_path / "two"
    for args in (["--epochs", "2", "--out", str(two)], ["--epochs", "1", "--out", str(one)],
                 ["--epochs", "2", "--out", str(one), "--resume",
                  str(one / "mnist-mlp.npz")]):
        r = clnn_cli("train", "mnist", "--no-progress", *args)
        assert r.returncode == 0, r.stdout + r.stderr
    with np.load(one / "mnist-mlp.npz") as a, np.load(two / "mnist-mlp.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
    r = clnn_cli("train", "lenet5", "--epochs", "1", "--no-progress", "--out", str(one),
                 "--resume", str(one / "mnist-mlp.npz"))
    assert r.returncode == 1 and "not this job's network" in r.stderr
