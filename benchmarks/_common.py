"""Shared benchmark helpers: devices, timing, reference libraries, result files.

Every benchmark validates a result against a reference before timing it, warms up,
then reports the median of several repeats. Times are wall-clock with the device
queue finished (what a user waits for), including any packing or workspace the op
needs.
"""

import json
import os
import platform
import statistics
import time

import numpy as np

import clnn
from clnn.device import all_devices

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def arg_parser(doc):
    """The options every benchmark takes: --device, --repeats, --json."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", help="one clnn device spec (default: every device found)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="result file (default benchmarks/results/NAME.json)")
    return ap


def median_time(fn, repeats=5, warmup=1, sync=None):
    """Median seconds of ``fn()`` (followed by ``sync()``) after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
        if sync:
            sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def devices(spec=None):
    """The clnn devices to benchmark: the one ``spec`` names, else every device found."""
    if spec:
        return [clnn.device(spec)]
    return [clnn.device(d) for _, _, d in all_devices()]


def torch_or_none():
    try:
        import torch
        return torch
    except ImportError:
        return None


def numpy_blas():
    """Which BLAS numpy runs, for the report (threadpoolctl when present)."""
    try:
        from threadpoolctl import threadpool_info
        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            return f"{info[0].get('internal_api')} {info[0].get('version')} " \
                   f"({info[0].get('architecture')}, {info[0].get('num_threads')} threads)"
    except ImportError:
        pass
    return "unknown BLAS"


def machine():
    return {"machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "blas": numpy_blas(),
            "env": {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                               "POCL_MAX_WORK_GROUP_SIZE")
                    if k in os.environ}}


def write_json(name, payload, path=None):
    path = path or os.path.join(RESULTS, f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = dict(payload, machine=machine(),
                   date=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)
    return path
