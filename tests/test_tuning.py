"""The GEMM parameter table, row by row against the kernel's constraints (no device)."""

import dataclasses

import pytest

import clnn
from clnn import tuning
from clnn.device import DeviceFacts

GPU_MIN = DeviceFacts("p", "Some GPU", "Some Vendor", "GPU", "1", "OpenCL 1.2", 8, 256,
                      (256, 256, 64), 32768, 1 << 28, 1 << 30, False, False)


def facts(**kw):
    return dataclasses.replace(GPU_MIN, **kw)


@pytest.mark.parametrize("row", tuning.all_gemm_rows(), ids=str)
def test_every_row_satisfies_the_constraints(row):
    assert tuning.gemm_problems(row) == []
    assert isinstance(row.get("tuned"), bool), "say whether the row was tuned"


@pytest.mark.parametrize("row", [r for r in tuning.all_gemm_rows() if r["variant"] == "local"],
                         ids=str)
def test_gpu_rows_fit_gpu_sized_limits(row):
    # 256 work-items and 32 KiB of local memory: what the Oclgrind gate simulates
    assert tuning.gemm_problems(row, GPU_MIN) == []


def test_lookup_order_exact_vendor_type_default():
    name = next(iter(tuning.GEMM_TABLE["device"]))
    cpu = facts(name=name, type="CPU", vendor="GenuineIntel")
    assert tuning.gemm_params(cpu) is tuning.GEMM_TABLE["device"][name]
    nv = facts(vendor="NVIDIA Corporation")
    assert tuning.gemm_params(nv) is tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")]
    assert tuning.gemm_params(facts()) is tuning.GEMM_TABLE["type"]["GPU"]
    assert tuning.gemm_params(facts(type="CPU")) is tuning.GEMM_TABLE["type"]["CPU"]
    assert tuning.gemm_params(facts(type="ACCELERATOR")) is tuning.GEMM_TABLE["default"]


def test_rows_that_do_not_fit_fall_through():
    tiny = facts(vendor="NVIDIA Corporation", max_work_group_size=64, local_mem_size=4096)
    p = tuning.gemm_params(tiny)
    assert tuning.gemm_problems(p, tiny) == []
    hopeless = facts(type="ACCELERATOR", max_work_group_size=1, local_mem_size=0)
    assert tuning.gemm_problems(tuning.gemm_params(hopeless), hopeless) == []


def test_constraints_catch_bad_rows():
    assert tuning.gemm_problems({"variant": "reg", "MWI": 4, "NWI": 12, "VW": 8, "WGM": 1})
    assert tuning.gemm_problems({"variant": "local", "MWG": 30, "NWG": 32, "KWG": 8,
                                 "MDIMC": 8, "NDIMC": 8})
    assert tuning.gemm_problems({"variant": "local", "MWG": 64, "NWG": 64, "KWG": 128,
                                 "MDIMC": 16, "NDIMC": 16}, GPU_MIN)
    assert tuning.gemm_problems({"variant": "magic"})
    assert tuning.gemm_problems({"variant": "reg", "MWI": 0, "NWI": 8, "VW": 8, "WGM": 1})


def test_override_is_scoped_and_validated():
    f = facts()
    row = {"variant": "local", "MWG": 8, "NWG": 8, "KWG": 4, "MDIMC": 2, "NDIMC": 4}
    with tuning.override("gemm", row):
        assert tuning.gemm_params(f) == row
    assert tuning.gemm_params(f) is tuning.GEMM_TABLE["type"]["GPU"]
    with tuning.override("gemm", dict(row, MDIMC=512)):
        with pytest.raises(clnn.ArgumentError):
            tuning.gemm_params(f)


def test_float64_vectors_hold_the_same_bytes():
    row = {"variant": "reg", "MWI": 4, "NWI": 32, "VW": 8, "WGM": 16}
    assert dict(tuning.template_tuning(row, "float64"))["VW"] == 4
    assert dict(tuning.template_tuning(row, "float32"))["VW"] == 8
