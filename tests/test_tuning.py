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


GENERIC_GPU_ROWS = [tuning.GEMM_TABLE["type"]["GPU"], tuning.GEMM_TABLE["default"]]
VENDOR_FACTS = {"nvidia": facts(vendor="NVIDIA Corporation", max_work_group_size=1024,
                                max_work_item_sizes=(1024, 1024, 64), local_mem_size=49152)}


@pytest.mark.parametrize("row", GENERIC_GPU_ROWS, ids=str)
def test_generic_gpu_rows_fit_gpu_sized_limits(row):
    # 256 work-items and 32 KiB of local memory: what the Oclgrind gate simulates
    assert tuning.gemm_problems(row, GPU_MIN) == []


@pytest.mark.parametrize("key", list(tuning.GEMM_TABLE["vendor"]), ids=str)
def test_vendor_rows_fit_their_devices_and_smaller_ones_keep_a_row(key):
    entry = tuning.GEMM_TABLE["vendor"][key]
    rows = entry if isinstance(entry, list) else [entry]
    vendor_facts = VENDOR_FACTS.get(key[0], GPU_MIN)
    for row in rows:
        assert tuning.gemm_problems(row, vendor_facts) == [], row
    # a smaller device of the vendor (32 KiB, 256 work-items) still has tiled rows
    small = dataclasses.replace(vendor_facts, local_mem_size=32768, max_work_group_size=256)
    assert any(tuning.gemm_problems(r, small) == [] for r in rows)


def test_lookup_order_exact_vendor_type_default(monkeypatch):
    named = {"variant": "reg", "MWI": 2, "NWI": 8, "VW": 8, "WGM": 4, "tuned": True}
    monkeypatch.setitem(tuning.GEMM_TABLE["device"], "Some CPU", named)
    tuning.table_rows.cache_clear()
    cpu = facts(name="Some CPU", type="CPU", vendor="GenuineIntel", float_lanes=16)
    assert tuning.gemm_params(cpu) is named
    # a CPU the table does not name: by the floats of its vectors, then by type
    avx512 = tuning.GEMM_TABLE["lanes"][("CPU", 16)]
    assert tuning.gemm_params(dataclasses.replace(cpu, name="Other CPU")) is avx512[0]
    assert tuning.gemm_params(dataclasses.replace(cpu, name="Other CPU", float_lanes=8)) \
        is tuning.GEMM_TABLE["type"]["CPU"]
    nv = VENDOR_FACTS["nvidia"]
    assert tuning.gemm_params(nv) is tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")][0]
    assert list(tuning.gemm_rows(nv)) == tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")]
    # a smaller NVIDIA GPU keeps the rows that fit it
    small = facts(vendor="NVIDIA Corporation")
    assert tuning.gemm_params(small) in tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")]
    assert tuning.gemm_params(facts()) is tuning.GEMM_TABLE["type"]["GPU"]
    assert tuning.gemm_params(facts(type="CPU")) is tuning.GEMM_TABLE["type"]["CPU"]
    assert tuning.gemm_params(facts(type="ACCELERATOR")) is tuning.GEMM_TABLE["default"]


def test_512_bit_tiles_only_where_the_code_has_them():
    """VW 16 (512-bit vectors) is refused on a CPU whose code has 8 float lanes (PoCL
    builds AVX2 code for some AVX-512 CPUs, where 512-bit vectors broke later builds),
    allowed on 16, and on other device types (Oclgrind runs the rows as a GPU);
    doubles, half as many per vector, take the lanes entry's row whose accumulators
    fit 32 registers."""
    row = tuning.GEMM_TABLE["lanes"][("CPU", 16)][0]
    cpu = facts(type="CPU", max_work_group_size=4096, float_lanes=16)
    assert tuning.gemm_problems(row, cpu) == []
    assert any("512-bit" in p for p in tuning.gemm_problems(
        row, dataclasses.replace(cpu, float_lanes=8)))
    assert tuning.gemm_problems(row, dataclasses.replace(GPU_MIN, float_lanes=1)) == []
    f32, f64 = tuning.GEMM_TABLE["lanes"][("CPU", 16)]
    assert tuning.spills(f32, itemsize=8) and not tuning.spills(f64, itemsize=8)
    assert not tuning.spills(f32, itemsize=4) and not tuning.spills(f32, itemsize=2)
    assert tuning.gemm_rows(cpu, 8)[0] is f64
    assert tuning.gemm_rows(cpu, 4)[0] is f32 and tuning.gemm_rows(cpu, 2)[0] is f32
    # (more than 32 accumulators in the dtype is no valid row at all)
    assert any("accumulators" in p for p in tuning.gemm_problems(
        dict(f32, MWI=9), cpu, itemsize=8))


def test_tuner_tries_512_bit_tiles_where_the_code_has_them():
    from clnn import tuner
    cpu = facts(type="CPU", max_work_group_size=4096, float_lanes=16)
    for quick in (True, False):
        wide = [p for p in tuner.candidates(cpu, quick) if p["VW"] == 16]
        assert wide and all(p["NWI"] % 16 == 0 for p in wide)
        assert {p["NWI"] for p in wide} >= {32, 64}
        assert not [p for p in tuner.candidates(dataclasses.replace(cpu, float_lanes=8),
                                                quick) if p["VW"] == 16]


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


def test_database_changes_are_seen(db, monkeypatch):
    """save_db_entries takes effect at once; a file another process rewrites is looked
    at again after DB_RECHECK_S (a stat per launch cost 7 us), not before."""
    import os
    f = facts()
    key = tuning.db_key(f, "float32", "NN-square")
    one = {"variant": "local", "MWG": 16, "NWG": 32, "KWG": 8, "MDIMC": 4, "NDIMC": 8}
    two = dict(one, KWG=16)
    assert tuning.load_db() == {}                       # no file yet
    tuning.save_db_entries({key: {"params": one}})
    assert tuning.gemm_params(f, 4, "float32", "NN-square") == one
    import json
    db.write_text(json.dumps({"version": 1, "entries": {key: {"params": two}}}))
    os.utime(db, (1, 1))                                # a different mtime for sure
    monkeypatch.setattr(tuning, "DB_RECHECK_S", 3600.0)
    assert tuning.gemm_params(f, 4, "float32", "NN-square") == one
    monkeypatch.setattr(tuning, "DB_RECHECK_S", 0.0)
    assert tuning.gemm_params(f, 4, "float32", "NN-square") == two


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
    assert tuning.shape_class(1000, 5000, 2000, False, True) == "NT-wide-large"
    assert tuning.shape_class(500, 2500, 1000, False, True) == "NT-wide-medium"
    assert tuning.shape_class(5000, 1000, 10, True, False) == "TN-tall-small"
    assert tuning.shape_class(64, 64, 64) == "NN-square-small"
    assert tuning.shape_class(4096, 4096, 4096) == "NN-square-large"
    assert tuning.shape_class(64, 64, 64, batch=1 << 20) == "NN-square-large"
    assert [tuning.size_bucket(n, n, n) for n in (511, 512, 2047, 2048)] == \
        ["small", "medium", "medium", "large"]


def test_tuner_problems_lie_in_their_classes():
    from clnn import tuner
    for aspect, buckets in tuner.GEMM_CLASSES.items():
        t = aspect.split("-")[0]
        for bucket, sizes in buckets.items():
            for M, N, K in sizes:
                assert tuning.shape_class(M, N, K, t[0] == "T", t[1] == "T") == \
                    f"{aspect}-{bucket}", (M, N, K)


SCALAR = {"variant": "reg", "MWI": 1, "NWI": 1, "VW": 1, "WGM": 1}
FAST = {"variant": "reg", "MWI": 4, "NWI": 32, "VW": 8, "WGM": 16}


def tune_one_class(monkeypatch, table, candidate):
    """Tune one small class in float32 with ``table`` as the table's only row (a GPU
    with engines tunes TF32 and float16 too, their engine rows beside the table's)."""
    from clnn import tuner
    monkeypatch.setattr(tuner, "GEMM_CLASSES",
                        {"NT-wide": {"small": ((48, 256, 96), (64, 512, 128))}})
    monkeypatch.setattr(tuner, "candidates", lambda f, q: [candidate])
    monkeypatch.setattr(tuning, "table_rows", lambda f, i=4: (table,))
    return tuner.tune(("gemm",), quick=True, progress=False, log=lambda *a: None,
                      formats=["float32"])


def test_tuner_stores_winners_that_beat_the_table(db, monkeypatch):
    dev = clnn.device()
    if not dev.facts.is_cpu:
        pytest.skip("the scalar and vector rows compared here are CPU rows")
    results = tune_one_class(monkeypatch, SCALAR, FAST)
    best, gflops, table_gflops = results["NT-wide-small"]
    assert best == FAST and gflops > table_gflops > 0
    assert tuning.gemm_params(dev.facts, 4, "float32", "NT-wide-small") == FAST
    assert db.exists()


def test_tuner_times_float32_at_highest_precision(db, monkeypatch):
    """With TF32 allowed the table's choice would run on the engines (on NVIDIA), fail
    the float32 check, and let any candidate beat it: the tuner runs at "highest" and
    puts the user's setting back."""
    from clnn import tuner
    seen = []
    real = tuner._check_and_time

    def spy(*a):
        seen.append(tuning.get_float32_matmul_precision())
        return real(*a)
    monkeypatch.setattr(tuner, "_check_and_time", spy)
    old = tuning.get_float32_matmul_precision()
    tuning.set_float32_matmul_precision("high")
    try:
        tune_one_class(monkeypatch, FAST, SCALAR)
        assert seen and set(seen) == {"highest"}
        assert tuning.get_float32_matmul_precision() == "high"
    finally:
        tuning.set_float32_matmul_precision(old)


def test_tuner_never_stores_a_winner_slower_than_the_table(db, monkeypatch):
    """A search among slower candidates (a quick search at other sizes, in the issue:
    32x32 tiles that made 4096^3 2.3x slower) leaves the table in charge."""
    dev = clnn.device()
    if not dev.facts.is_cpu:
        pytest.skip("the scalar and vector rows compared here are CPU rows")
    results = tune_one_class(monkeypatch, FAST, SCALAR)
    best, gflops, table_gflops = results["NT-wide-small"]
    assert best == SCALAR and gflops < table_gflops
    assert not db.exists() or tuning.db_key(dev.facts, "float32", "NT-wide-small") \
        not in tuning.load_db()


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
    assert tuning.gemm_problems(dict(ok, PIXELS=False, QV=2, MB=6)) == []
    assert tuning.gemm_problems(dict(ok, PIXELS="no"))
    assert tuning.gemm_problems(dict(ok, QV=5))
    assert tuning.gemm_problems(dict(ok, MB=0))
    assert tuning.gemm_problems(dict(ok, WINO=True, WINO_M=2)) == []
    assert tuning.gemm_problems(dict(ok, WINO_M=3))
    assert tuning.gemm_problems(dict(ok, WINO="yes"))


def test_tuner_searches_convolutions(db, monkeypatch):
    from clnn import tuner
    monkeypatch.setattr(tuner, "CONV", {"quick": [(2, 3, 9, 8, 5, 3, 3)], "full": None})
    dev = clnn.device()
    row = tuning.gemm_params(dev.facts)
    monkeypatch.setattr(tuner, "candidates", lambda f, q: [row])
    results = tuner.tune(("conv",), quick=True, progress=False, log=lambda *a: None,
                         formats=["float32"])
    # (float32's classes only: a GPU with engines would add "tf32/conv-wgrad-small" and
    # "float16/conv-wgrad-small", on the H200; 5 filters from 3 channels: on a GPU,
    # convt.cl's direct tiles run the forward pass and the data gradient, which the
    # rows tuned here would never run)
    assert set(results) == ({"conv-fwd-small", "conv-dgrad-small", "conv-wgrad-small"}
                            if dev.facts.is_cpu else {"conv-wgrad-small"})
    for klass, (best, gflops, table_gflops) in results.items():
        assert gflops > 0 and table_gflops > 0
        if gflops > table_gflops:             # stored only when it beat the table
            assert tuning.conv_params(dev.facts, 4, "float32", klass) == best
    tried = tuner.conv_candidates(dev.facts, True)
    full = tuner.conv_candidates(dev.facts, False)
    if dev.facts.is_cpu:                    # conv.cl's gathered kernel competes on CPUs
        assert tried and all(p["variant"] == "gather" for p in tried)
        # the full search also weighs Winograd: never, and F(2x2, 3x3); --quick does not
        assert [p for p in full if p.get("WINO") is False] and \
            [p for p in full if p.get("WINO_M") == 2]
        assert not [p for p in tried if "WINO" in p or "WINO_M" in p]
    else:
        assert tried == [] and full == []


def test_conv_candidates_keep_the_tables_winograd_thresholds():
    """A CPU whose code has 512-bit vectors: every conv candidate carries its table
    row's Winograd thresholds, so that a winner stored for a class leaves the layers'
    choice of Winograd as the table made it; AVX2 code's row has none to carry."""
    from clnn import tuner
    facts = dataclasses.replace(clnn.device().facts, type="CPU", float_lanes=16)
    row = tuning.CONV_TABLE["lanes"][("CPU", 16)]
    cands = tuner.conv_candidates(facts, False)
    assert cands and all(p["WINO_CHANNELS"] == row["WINO_CHANNELS"] and
                         p["WINO_WGRAD_CHANNELS"] == row["WINO_WGRAD_CHANNELS"]
                         for p in cands)
    narrow = tuner.conv_candidates(dataclasses.replace(facts, float_lanes=8), False)
    assert narrow and not [p for p in narrow if "WINO_CHANNELS" in p]
    assert tuning.gemm_problems(dict(row, WINO_CHANNELS=0))
    assert tuning.gemm_problems(dict(row, WINO_WGRAD_CHANNELS=2.5))
    assert tuning.gemm_problems(dict(row, WINO_CHANNELS=40)) == []


def test_tuner_leaves_out_what_direct_tiles_run_on_gpus(monkeypatch):
    """On a GPU (an H100's facts), a layer of 5 filters from 3 channels runs its forward
    pass and data gradient in convt.cl's direct tiles: the tuner times only its weight
    gradient on the GEMM rows; with 17 filters, the forward pass too."""
    import numpy as np
    from clnn import tuner
    dev = clnn.device()
    monkeypatch.setattr(dev, "facts", dataclasses.replace(
        dev.facts, type="GPU", compute_units=132, local_mem_size=49152,
        nv_compute_capability=0, cache_size=0, float_lanes=0))
    rng = np.random.default_rng(0)
    assert set(tuner._conv_problems(dev, (2, 3, 9, 8, 5, 3, 3), rng)) == \
        {"conv-wgrad-small"}
    assert set(tuner._conv_problems(dev, (2, 3, 9, 8, 17, 3, 3), rng)) == \
        {"conv-fwd-small", "conv-wgrad-small"}
    # with 16-bit engine rows (compute capability 9.0), 13x13 filters: 169 taps a
    # channel, past the engine variant's 160 k a block, so the GEMM rows run all three
    monkeypatch.setattr(dev, "facts", dataclasses.replace(
        dev.facts, vendor="NVIDIA Corporation", nv_compute_capability=90))
    clnn.clear_caches()
    try:
        assert tuning.mma_rows(dev.facts, "f16")
        assert set(tuner._conv_problems(dev, (2, 1, 20, 20, 5, 13, 13), rng,
                                         "float16")) == \
            {"conv-fwd-small", "conv-dgrad-small", "conv-wgrad-small"}
        assert set(tuner._conv_problems(dev, (2, 1, 20, 20, 5, 5, 5), rng, "float16")) == \
            {"conv-wgrad-small"}
    finally:
        clnn.clear_caches()


def test_conv_rows_fit_and_say_whether_tuned(monkeypatch):
    rows = [kv for level in ("device", "lanes", "type")
            for kv in tuning.CONV_TABLE[level].items()]
    for key, row in rows:
        assert tuning.gemm_problems(row) == [], key
        assert isinstance(row.get("tuned"), bool), key
    # the exact device, then the floats of its code's vectors, then its type
    named = {"variant": "gather", "VW": 4, "WG": 2, "tuned": True}
    monkeypatch.setitem(tuning.CONV_TABLE["device"], "Some CPU", named)
    cpu = facts(name="Some CPU", type="CPU", max_work_group_size=4096, float_lanes=16)
    assert tuning.conv_params(cpu) is named
    other = dataclasses.replace(cpu, name="Other CPU")
    assert tuning.conv_params(other) is tuning.CONV_TABLE["lanes"][("CPU", 16)]
    assert tuning.conv_params(dataclasses.replace(other, float_lanes=8)) is \
        tuning.CONV_TABLE["type"]["CPU"]
