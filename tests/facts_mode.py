"""CLNN_TEST_FACTS=h100: the test device planned as an H100 would be (its facts: a GPU of
132 units and 48 KiB of local memory; no matrix engines, whose inline PTX only NVIDIA's
compiler builds), its kernels still built and run by its own driver. So the GPU's
kernel choices, tiles and plans, and the tests' assumptions about them, are checked
without a GPU (on an H200, two tests had failed that assumed a CPU's paths).

conftest.py applies it to the test device; a test's child process imports it too."""

import dataclasses
import os


def apply(device):
    """Give ``device`` the facts CLNN_TEST_FACTS names (nothing where it is unset)."""
    mode = os.environ.get("CLNN_TEST_FACTS")
    if not mode:
        return
    if mode != "h100":
        raise SystemExit(f"CLNN_TEST_FACTS={mode!r}: only 'h100'")
    device.facts = dataclasses.replace(
        device.facts, name="NVIDIA H100 80GB HBM3", vendor="NVIDIA Corporation",
        type="GPU", compute_units=132, local_mem_size=49152, nv_compute_capability=0,
        cache_size=0, float_lanes=0)
