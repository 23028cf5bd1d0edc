"""Launch plans of the tiled GEMM for an H100's facts, without an H100 (clnn/plans.py)."""

import dataclasses

import pytest

from clnn import plans, tuning
from clnn.device import DeviceFacts

H100 = DeviceFacts("NVIDIA CUDA", "NVIDIA H100 80GB HBM3", "NVIDIA Corporation", "GPU",
                   "580.159.04", "OpenCL 3.0 CUDA", 132, 1024, (1024, 1024, 64), 49152,
                   21254373376, 85017493504, True, False)
ROWS = tuning.gemm_rows(H100)


def tile(plan):
    return plan.params["MWG"], plan.params["NWG"]


def test_the_h100_gets_the_nvidia_rows():
    assert [r for r in ROWS] == tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")]
    assert all(r["variant"] == "local" and tuning.gemm_problems(r, H100) == [] for r in ROWS)


@pytest.mark.parametrize("n", [2048, 4096, 8192])
def test_big_squares_take_the_big_tile_without_split(n):
    plan = plans.best(H100, ROWS, n, n, n)
    assert tile(plan) == (128, 128) and plan.splits == 1
    assert plan.work_groups == (n // 128) ** 2
    assert plan.global_size == ((n // 128) * 256, n // 128, 1) and plan.local_size == (256, 1, 1)


@pytest.mark.parametrize("M,N,K", [(64, 576, 32 * 56 * 56), (6, 25, 64 * 28 * 28),
                                   (64, 147, 8 * 112 * 112), (16, 150, 64 * 10 * 10)],
                         ids=["wgrad-56x56x64", "wgrad-lenet-c1", "wgrad-stem", "wgrad-c3"])
def test_weight_gradients_split_k_to_fill_the_device(M, N, K):
    """The issue's first finding: a weight gradient's few output tiles looped over
    50 000 to 100 000 k in 1 to 5 work-groups. Now the K slices fill every unit."""
    plan = plans.best(H100, ROWS, M, N, K)
    assert plan.splits > 1
    assert plan.work_groups >= H100.compute_units
    assert plan.k_split % plan.params["KWG"] == 0
    assert (plan.splits - 1) * plan.k_split < K <= plan.splits * plan.k_split
    assert plan.workspace == M * N * plan.splits


@pytest.mark.parametrize("M,N", [(3, 100352), (6, 6400), (1000, 10), (10, 1000)])
def test_thin_outputs_get_thin_tiles(M, N):
    """Three channels or ten classes fill a small part of a 128-row tile: the planner
    picks a row whose tile wastes less."""
    plan = plans.best(H100, ROWS, M, N, 1024)
    mwg, nwg = tile(plan)
    waste = 1 - (M * N) / (-(-M // mwg) * mwg * -(-N // nwg) * nwg)
    assert waste < 0.9
    assert min(mwg, nwg) <= 32


def test_split_k_respects_the_workspace_and_short_k():
    plan = plans.best(H100, ROWS, 64, 64, 1 << 20, max_workspace=64 * 64 * 4)
    assert plan.splits <= 4
    short = plans.best(H100, ROWS, 64, 64, 48)           # three K steps: nothing to split
    assert short.splits == 1 and short.workspace == 0
    for p in ROWS:
        assert plans.plan(H100, p, 8, 8, 1 << 16, split=False).splits == 1


def test_a_row_may_force_the_slices():
    p = dict(ROWS[0], KSPLIT=3)
    plan = plans.plan(H100, p, 100, 100, 1000)
    assert plan.splits == 3 and plan.k_split == 336       # 21 steps of 16 per slice
    assert plans.plan(H100, dict(p, KSPLIT=1000), 100, 100, 1000).splits == 63
    assert tuning.gemm_problems(dict(p, KSPLIT=0))


def test_plans_are_cached_and_deterministic():
    frozen = plans.freeze(ROWS)
    assert plans.freeze(ROWS) is frozen
    a = plans.cached_best(H100, frozen, 1000, 5000, 2000)
    assert plans.cached_best(H100, frozen, 1000, 5000, 2000) is a
    assert a == plans.best(H100, list(ROWS), 1000, 5000, 2000)


def test_smaller_gpus_drop_rows_that_do_not_fit():
    small = dataclasses.replace(H100, local_mem_size=32768, max_work_group_size=256,
                                compute_units=8)
    rows = tuning.gemm_rows(small)
    assert rows and all(tuning.gemm_problems(r, small) == [] for r in rows)
    assert all(plans.local_bytes(r) <= 32768 for r in rows)
    assert plans.best(small, rows, 4096, 4096, 4096).params in rows


def test_vector_width_follows_alignment_and_tiles():
    p = ROWS[0]
    assert plans.vector_width(p, (0, 4096, 0)) == 4
    assert plans.vector_width(p, (2, 4096, 0)) == 2
    assert plans.vector_width(p, (0, 4095, 0)) == 1
    odd = {"variant": "local", "MWG": 12, "NWG": 8, "KWG": 5, "MDIMC": 4, "NDIMC": 2}
    assert plans.vector_width(odd, (0, 64, 0)) == 1


def test_empty_and_tiny_products_plan():
    for M, N, K in [(1, 1, 1), (0, 5, 5), (5, 5, 0)]:
        plan = plans.best(H100, ROWS, M, N, K)
        assert plan.splits == 1
