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


# ---------------------------------------------------------------- the user's database

@pytest.fixture
def db(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("CLNN_TUNING_DB", str(path))
    return path


def write_db(path, entries):
    import json
    path.write_text(json.dumps({"version": 1, "entries": entries}))
    tuning._db_cache["mtime"] = None


def test_database_entry_wins_over_the_table_and_override_over_both(db):
    f = facts()
    row = {"variant": "local", "MWG": 16, "NWG": 32, "KWG": 8, "MDIMC": 4, "NDIMC": 8}
    write_db(db, {tuning.db_key(f, "float32", "NN-square"): {"params": row}})
    assert tuning.gemm_params(f, 4, "float32", "NN-square") == row
    assert tuning.gemm_params(f, 4, "float32", "NT-wide") is tuning.GEMM_TABLE["type"]["GPU"]
    assert tuning.gemm_params(f, 4, "float64", "NN-square") is tuning.GEMM_TABLE["type"]["GPU"]
    other = facts(driver_version="2")
    assert tuning.gemm_params(other, 4, "float32", "NN-square") is \
        tuning.GEMM_TABLE["type"]["GPU"]
    forced = {"variant": "local", "MWG": 8, "NWG": 8, "KWG": 4, "MDIMC": 2, "NDIMC": 4}
    with tuning.override("gemm", forced):
        assert tuning.gemm_params(f, 4, "float32", "NN-square") == forced


def test_stale_and_corrupt_entries_are_ignored_with_a_warning(db):
    f = facts()
    write_db(db, {tuning.db_key(f, "float32", "NN-square"):
                  {"params": {"variant": "local", "MWG": 64, "NWG": 64, "KWG": 16,
                              "MDIMC": 32, "NDIMC": 32}},
                  tuning.db_key(f, "float32", "NT-wide"): {"params": "garbage"}})
    for klass in ("NN-square", "NT-wide"):
        with pytest.warns(RuntimeWarning, match="stale tuning entry"):
            assert tuning.gemm_params(f, 4, "float32", klass) is \
                tuning.GEMM_TABLE["type"]["GPU"]
    db.write_text("{ not json")
    tuning._db_cache["mtime"] = None
    with pytest.warns(RuntimeWarning, match="ignoring the tuning database"):
        assert tuning.gemm_params(f, 4, "float32", "NN-square") is \
            tuning.GEMM_TABLE["type"]["GPU"]


def test_shape_classes():
    assert tuning.shape_class(1000, 5000, 2000, False, True) == "NT-wide"
    assert tuning.shape_class(5000, 1000, 10, True, False) == "TN-tall"
    assert tuning.shape_class(64, 64, 64) == "NN-square"


def test_tuner_stores_validated_winners(db, monkeypatch):
    from clnn import tuner
    monkeypatch.setattr(tuner, "GEMM_CLASSES", {"NT-wide": ((24, 100, 40), None)})
    monkeypatch.setattr(tuner, "candidates", lambda f, q: [
        {"variant": "reg", "MWI": 2, "NWI": 8, "VW": 8, "WGM": 4},
        {"variant": "local", "MWG": 8, "NWG": 8, "KWG": 4, "MDIMC": 2, "NDIMC": 4}])
    results = tuner.tune(("gemm",), quick=True, progress=False, log=lambda *a: None)
    best, gflops, _ = results["NT-wide"]
    assert gflops > 0
    dev = clnn.device()
    assert tuning.gemm_params(dev.facts, 4, "float32", "NT-wide") == best
    assert db.exists()


def test_convolutions_gather_on_cpus_and_take_the_gemm_row_elsewhere(db):
    cpu, gpu = facts(type="CPU"), facts()
    assert tuning.conv_params(cpu, 4, "float32", "conv-fwd") is \
        tuning.CONV_TABLE["type"]["CPU"]
    assert tuning.conv_params(gpu, 4, "float32", "conv-fwd") is tuning.GEMM_TABLE["type"]["GPU"]
    assert tuning.gemm_problems(tuning.CONV_TABLE["type"]["CPU"], cpu) == []
    # a forced GEMM row takes convolutions to gemm.cl, a forced gather set to conv.cl
    reg = tuning.GEMM_TABLE["type"]["CPU"]
    with tuning.override("gemm", reg):
        assert tuning.conv_params(cpu, 4, "float32", "conv-wgrad") == reg
        with tuning.override("conv", {"variant": "gather", "VW": 4, "WG": 1}):
            assert tuning.conv_params(cpu, 4, "float32", "conv-wgrad")["VW"] == 4
    # a tuned gather entry serves its convolution class only, never a GEMM
    entry = {"variant": "gather", "VW": 8, "WG": 16}
    write_db(db, {tuning.db_key(cpu, "float32", "conv-dgrad"): {"params": entry},
                  tuning.db_key(cpu, "float32", "NN-square"): {"params": entry}})
    assert tuning.conv_params(cpu, 4, "float32", "conv-dgrad") == entry
    assert tuning.conv_params(cpu, 4, "float32", "conv-fwd") is tuning.CONV_TABLE["type"]["CPU"]
    assert tuning.gemm_params(cpu, 4, "float32", "NN-square") is tuning.GEMM_TABLE["type"]["CPU"]
    with pytest.raises(clnn.ArgumentError, match="convolution variant"):
        with tuning.override("gemm", entry):
            tuning.gemm_params(cpu)


def test_gather_constraints():
    ok = {"variant": "gather", "VW": 8, "WG": 4}
    assert tuning.gemm_problems(ok) == []
    assert tuning.gemm_problems(dict(ok, MWI=3, NWI=16, DGRAD="flip")) == []
    assert tuning.gemm_problems(dict(ok, VW=3))
    assert tuning.gemm_problems(dict(ok, NWI=12))
    assert tuning.gemm_problems(dict(ok, MWI=0))
    assert tuning.gemm_problems(dict(ok, DGRAD="fft"))
    assert tuning.gemm_problems(dict(ok, WG=512), GPU_MIN)


def test_tuner_searches_gathered_convolutions(db, monkeypatch):
    from clnn import tuner
    monkeypatch.setattr(tuner, "CONV", {"quick": (2, 3, 9, 8, 5, 3, 3), "full": None})
    monkeypatch.setattr(tuner, "candidates", lambda f, q: [
        {"variant": "reg", "MWI": 2, "NWI": 8, "VW": 8, "WGM": 4}])
    dev = clnn.device()
    results = tuner.tune(("conv",), quick=True, progress=False, log=lambda *a: None)
    assert set(results) == {"conv-fwd", "conv-dgrad", "conv-wgrad"}
    for klass, (best, gflops, _) in results.items():
        assert gflops > 0
        assert tuning.conv_params(dev.facts, 4, "float32", klass) == best
    tried = tuner.conv_candidates(dev.facts, True)
    assert dev.facts.is_cpu and tried and all(p["variant"] == "gather" for p in tried)


def test_conv_rows_fit_and_say_whether_tuned():
    rows = list(tuning.CONV_TABLE["device"].items()) + list(tuning.CONV_TABLE["type"].items())
    for key, row in rows:
        assert tuning.gemm_problems(row) == [], key
        assert isinstance(row.get("tuned"), bool), key
    name = next(iter(tuning.CONV_TABLE["device"]))
    assert tuning.conv_params(facts(name=name, type="CPU")) is \
        tuning.CONV_TABLE["device"][name]
