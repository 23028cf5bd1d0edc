"""benchmarks/report.py turns result files into a table and plots, and benchmarks/gpu_session.sh
calls scripts and options that exist (no timing here)."""

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))

import report  # noqa: E402


def test_report_from_result_files(tmp_path):
    gemm = {"rows": [{"shape": "square n=8", "M": 8, "N": 8, "K": 8,
                      "gflops": {"numpy": 10.0, "clnn (dev)": 5.0}}], "date": "today"}
    mlp = {"step_seconds": {"clnn (dev)": 0.5, "PyTorch CPU": 0.25}}
    conv = {"rows": [{"layer": "C1", "ms": {"clnn (dev)": {"forward": 1, "data grad": 2,
                                                            "weight grad": 3}}}]}
    lenet = {"step_seconds": {"clnn (dev)": 0.008, "PyTorch CPU": 0.004}}
    tutorial = {"runs": [{"device": "dev", "batch": 10, "step_ms": {
        "PyTorch CUDA": 40.0, "clnn": 50.0, "clnn, mixed precision (float16)": 30.0,
        "clnn, 4 GiB pool budget": None},
        "pool_peak_bytes": 2**30, "pool_peak_bytes_float16": 2**29}]}
    ops = {"rows": [{"device": "dev", "op": "relu", "clnn_GBps": 20.0, "numpy_GBps": 10.0,
                     "torch_cpu_GBps": 40.0},
                    {"device": "gpu", "op": "sum", "clnn_GBps": 1500.0, "numpy_GBps": 15.0,
                     "torch_cuda_GBps": 2000.0}]}
    host = {"rows": [{"device": "dev", "op": "empty kernel", "enqueue_us": 4.0,
                      "call_us": 20.0, "kernel_us": None},
                     {"device": "dev", "op": "relu", "enqueue_us": 50.0, "call_us": 90.0,
                      "kernel_us": 40.0, "torch_cpu_call_us": 45.0},
                     {"device": "dev", "op": "conv2d", "enqueue_us": 80.0,
                      "unplanned_enqueue_us": 230.0, "call_us": 370.0, "kernel_us": 320.0,
                      "torch_cpu_call_us": 390.0}]}
    for name, data in (("bench_gemm", gemm), ("bench_mlp", mlp), ("bench_conv", conv),
                       ("bench_lenet", lenet), ("bench_tutorial", tutorial),
                       ("bench_ops", ops), ("bench_host", host)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    report.main(["--results", str(tmp_path)])
    text = (tmp_path / "report.md").read_text()
    assert "| square n=8 (8x8x8) | 10.0 | 5.0 | 0.50 |" in text
    assert "| clnn (dev) | 0.500 |" in text and "| C1 | 1.00 / 2.00 / 3.00 |" in text
    assert "## LeNet-5 training step" in text and "| clnn (dev) | 0.008 |" in text
    assert "| dev | 10 | clnn | 50.0 | 1.00 |" in text
    assert "| dev | 10 | clnn, mixed precision (float16) | 30.0 | 0.50 |" in text
    assert "| dev | 10 | clnn, 4 GiB pool budget | did not fit | |" in text
    assert "| dev | relu | 20.0 | 10.0 | 40.0 |  | 2.00 | 0.50 |  |" in text
    assert "| gpu | sum | 1500.0 | 15.0 |  | 2000.0 | 100.00 |  | 0.75 |" in text
    assert "| dev | empty kernel | 4.0 |  | 20.0 |  |  |" in text
    assert "| dev | relu | 50.0 |  | 90.0 | 40.0 | 45.0 |" in text
    assert "| dev | conv2d | 80.0 | 230.0 | 370.0 | 320.0 | 390.0 |" in text
    assert (tmp_path / "gemm.png").exists() and (tmp_path / "conv.png").exists()


def test_the_gpu_session_script_names_scripts_and_options_that_exist():
    """benchmarks/gpu_session.sh runs where no one can fix it mid-session (a lent GPU,
    minutes of device time): its shell parses, and every benchmark it calls exists and
    takes the options it passes."""
    import re
    import subprocess
    bench = os.path.join(os.path.dirname(HERE), "benchmarks")
    path = os.path.join(bench, "gpu_session.sh")
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    text = open(path).read()
    calls = re.findall(r"^\s*bench (\w+)(.*)$", text, re.M)
    assert len(calls) >= 8
    for script, rest in calls:
        help_text = subprocess.run(
            [sys.executable, os.path.join(bench, f"{script}.py"), "--help"],
            capture_output=True, text=True, timeout=120).stdout
        for opt in re.findall(r"--[\w-]+", rest) + ["--device", "--json"]:
            assert opt in help_text, (script, opt)
    # the finish part (a session's first command) fits one command on a lent machine
    # (10 minutes): its steps' limits, the suite's default share included, add up to less
    body = re.search(r"^run_finish\(\) {\n(.*?)^}", text, re.M | re.S).group(1)
    limits = [int(v) for v in re.findall(r"LIMIT=(?:\$\{\w+:-)?(\d+)", body)]
    assert len(limits) >= 7 and sum(limits) <= 580, limits
    # and every test file and test it names exists (pytest stops at a missing one)
    root = os.path.dirname(HERE)
    nodes = re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text)
    assert len(nodes) >= 10
    for file, test in nodes:
        assert os.path.exists(os.path.join(root, file)), file
        if test:
            assert re.search(rf"^def {test}\(", open(os.path.join(root, file)).read(),
                             re.M), (file, test)


def test_bench_half_sets_the_untimed_engine_rows_aside_and_back():
    """bench_half.py --engine-rows all,tuned: inside tuned_engines_only the planner's
    rows for an H100 lack the untimed ones (here the narrow float16 tile, which the
    table held untimed until an H200 timed it slower), and after it the table and the
    rows are what they were."""
    import dataclasses
    import types
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
    import bench_half
    import clnn
    from clnn import tuning
    from test_plans import H100
    dev = types.SimpleNamespace(facts=dataclasses.replace(H100, nv_compute_capability=90))
    rows = tuning.MMA_TABLE[("nvidia", "GPU")]
    rows.append(tuning.NARROW_F16)
    clnn.clear_caches()
    try:
        _untimed_rows_aside_and_back(bench_half, tuning, dev)
    finally:
        rows.remove(tuning.NARROW_F16)
        clnn.clear_caches()


def _untimed_rows_aside_and_back(bench_half, tuning, dev):
    before = tuning.mma_rows(dev.facts, "f16")
    untimed = bench_half.untuned_engine_rows(dev)
    assert untimed and all(r in before and r["MMA"] == "f16" for r in untimed)
    table = {k: list(v) for k, v in tuning.MMA_TABLE.items()}
    with bench_half.tuned_engines_only():
        inside = tuning.mma_rows(dev.facts, "f16")
        assert inside and all(r.get("tuned") for r in inside)
        assert len(inside) == len(before) - len(untimed)
        assert bench_half.untuned_engine_rows(dev) == []
    assert tuning.MMA_TABLE == table and tuning.mma_rows(dev.facts, "f16") == before


def test_bench_half_runs_the_direct_tiles_in_float_and_back():
    """bench_half.py --engine-rows all,float-direct: inside direct_tiles_in_float
    convt.cl plans LeNet-5's C3 without the engine (16 sums a work-item in float),
    and after it with the engine row again, also when the block raises."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
    import bench_half
    import clnn
    import numpy as np
    conv = sys.modules["clnn.ops.conv"]
    dev, f16 = clnn.device(), {"MMA": "f16"}
    assert conv.tile_direct(dev, np.float16, 64, 6, 16, 5, 5, (1, 1), f16) == (16, 6, f16)
    with pytest.raises(KeyError):
        with bench_half.direct_tiles_in_float():
            assert conv.tile_direct(dev, np.float16, 64, 6, 16, 5, 5, (1, 1), f16) == \
                (16, 6, None)
            raise KeyError
    assert conv.tile_direct(dev, np.float16, 64, 6, 16, 5, 5, (1, 1), f16) == (16, 6, f16)


def test_bench_half_goes_on_past_a_case_that_fails_its_check(capsys):
    """A case whose check fails (SystemExit) is named and the next one runs: a lent
    GPU's one command must not lose the cases after a wrong one."""
    import types
    import bench_half
    dev = types.SimpleNamespace(name="dev")
    rows, failed = [], []

    def wrong():
        raise SystemExit("float16 step's loss 3.0 is not the float32 step's 2.3")
    bench_half.checked(rows, failed, dev, "LeNet-5 step", wrong)
    times = {"float16": 1.0, "bfloat16": 2.0, "float32": 3.0}
    bench_half.checked(rows, failed, dev, "MLP step", lambda: times)
    assert failed == ["LeNet-5 step: float16 step's loss 3.0 is not the float32 step's 2.3"]
    assert [r["case"] for r in rows] == ["MLP step"] and rows[0]["float32_over_float16"] == 3
    assert "LeNet-5 step" in capsys.readouterr().out


def test_cmdbuf_probe_says_what_the_device_has(tmp_path, capsys):
    """benchmarks/cmdbuf_probe.py on the test device: where it lacks
    cl_khr_command_buffer (pip's PoCL 3.0) one line and a row saying so; where it has
    it (Debian's PoCL 3.1) a LeNet-5 step recorded into one command buffer computes
    bitwise the replay's gradients."""
    import cmdbuf_probe
    import clnn
    from conftest import TEST_DEVICE
    path = tmp_path / "probe.json"
    rc = cmdbuf_probe.main(["--device", TEST_DEVICE, "--batches", "5",
                            "--precisions", "float32", "--repeats", "1", "--json",
                            str(path)])
    rows = json.loads(path.read_text())["rows"]
    has = cmdbuf_probe.cmdbuf.has(clnn.device(TEST_DEVICE).queue.device)
    assert [r["supported"] for r in rows] == [has]
    if has:
        assert rc == 0 and rows[0]["bitwise_equal"] and rows[0]["launches"] > 10
    else:
        assert rc == 0 and "nothing to probe" in capsys.readouterr().out


def test_profile_step_lists_a_steps_launches_in_order():
    """profile_step.py --launches: one line per launch, in the order made, with its
    tile, global and local sizes, device time and the idle time before it."""
    import profile_step
    from clnn.profiler import KernelRecord
    recs = [KernelRecord("clnn_gemm_tiled", "gemm", {"dtype": "float16", "tuning": (
        ("MWG", 64), ("NWG", 64), ("MMA", "f16"))}, (128, 4, 1), (64, 1, 1), 0, 1000,
        3500), KernelRecord("clnn_sgd_step", "optim", {}, (256,), None, 0, 4000, 4300)]
    lines = profile_step.launch_table(recs).splitlines()
    assert len(lines) == 3 and lines[0].split()[:2] == ["#", "kernel"]
    assert lines[1].split() == ["0", "clnn_gemm_tiled", "[float16,", "64x64", "f16]",
                                "128x4x1", "64x1x1", "2.5", "-"]
    # (idle before it: from the first one's end at 3.5 us to its start at 4 us)
    assert lines[2].split() == ["1", "clnn_sgd_step", "256", "-", "0.3", "0.5"]
