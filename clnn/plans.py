"""Launch plans for the tiled (GPU) GEMM: which tile row, how many K slices, how many
work-groups, how much workspace.

Pure functions of the sizes, the device's facts and the parameter sets: no device is
needed, so tests check the plans an H100 would get (tests/test_plans.py) on a machine
with only PoCL. clnn/ops/gemm.py launches what they return.

The cost model is deliberately small. A device has ``compute_units`` units; a unit
keeps ``groups_per_unit`` work-groups of a tile row resident (bounded by local
memory and by 2048 work-items); work-groups run in waves, and a unit's step of KWG
costs MWG * NWG * KWG multiply-adds per resident group at the row's rate: its
measured "speed" (tuning.py), less when too few work-items share the unit to hide
latency. Edge tiles cost as much as full ones, so a tile much bigger than the output
loses to one that fits it. Split-K adds the traffic of its partial sums and a launch.
The model only has to rank a few rows for one shape; the tuner measures.
"""

import dataclasses
import functools

# multiply-adds a unit does in the time it moves one byte of global memory: an H100
# moves 3.35 TB/s for 67 TFLOP/s (float32, 132 units), so about 10 per byte device-wide
FMA_PER_BYTE = 10.0
# what a second launch costs, in multiply-adds of one unit (5 us at 2.5e11 per second)
LAUNCH = 1.25e6
# resident work-items a unit needs to hide latency (an H100 unit ran 64x64 tiles with
# 8x8 blocks, two groups of 64, at 2/3 of its full rate)
HIDING = 192
# a K slice covers at least this many K steps: shorter slices spend their time on the
# pipeline's start and on partial sums
MIN_STEPS_PER_SLICE = 4


@dataclasses.dataclass(frozen=True)
class TiledPlan:
    """How one GEMM runs on the tiled kernel."""

    params: dict          # the tile row (MWG, NWG, KWG, MDIMC, NDIMC, VWM, VWN)
    splits: int           # K slices (1: no split-K)
    k_split: int          # K per slice, a multiple of KWG
    global_size: tuple    # work-items along (N tiles, M tiles, batch * splits)
    local_size: tuple
    workspace: int        # partial-sum elements split-K needs (0 without)
    cost: float           # the model's estimate, in unit-multiply-adds (for ranking)

    @property
    def work_groups(self):
        return (self.global_size[0] // self.local_size[0]) * self.global_size[1] * \
            self.global_size[2]


def threads(p):
    return p["MDIMC"] * p["NDIMC"]


def local_bytes(p, itemsize=4):
    """Local memory of a tiled ("local") row: two buffers of each tile (one per stage
    of a cp.async row), in float or wider (halves for float16 engines), rows padded by
    4 elements (8 for the matrix engines) against bank conflicts."""
    # an emulated engine (tests) exchanges a work-item's fragment registers (4 per mma
    # tile of A, 2 per tile of B) through local memory
    extra = 4 * (4 * p["WM"] // 16 + 2 * p["WN"] // 8) * threads(p) \
        if p.get("EMULATE") else 0
    # a cp.async row's stages (a malformed count, which tuning refuses, counts as none)
    stages = p.get("ASYNC") if isinstance(p.get("ASYNC"), int) else 0
    if p.get("WGMMA") and p.get("MMA") in ("f16", "tf32"):
        # a buffer per stage of each tile, unpadded (the core-matrix layout has no bank
        # conflicts to pad against); the emulation reads them where they lie
        item = 2 if p["MMA"] == "f16" else 4
        return (stages or 2) * p["KWG"] * (p["MWG"] + p["NWG"]) * item
    if p.get("MMA") == "f16" and p.get("LDSM"):
        # plain halves, rows padded by 8 halves: rows of k, or rows of m (n) holding k,
        # whichever way the operand is stored (the larger of the two here); a buffer
        # per stage of a cp.async pipeline (ASYNC), else two
        k = p["KWG"]
        return (stages or 2) * 2 * \
            sum(max(k * (w + 8), w * (k + 8)) for w in (p["MWG"], p["NWG"])) + extra
    if p.get("MMA") == "tf32" and stages:
        # a float buffer per stage, rows of k padded by 8 floats or rows of m (n)
        # holding k padded by 4, as the copies run along the operand (the larger)
        k = p["KWG"]
        return stages * 4 * \
            sum(max(k * (w + 8), w * (k + 4)) for w in (p["MWG"], p["NWG"])) + extra
    if p.get("MMA") == "f16":        # halves, rows of words padded by 8 words
        return 2 * p["KWG"] * (p["MWG"] + p["NWG"] + 16) * 2 + extra
    pad = 8 if p.get("MMA") == "tf32" else 4
    return 2 * p["KWG"] * (p["MWG"] + p["NWG"] + 2 * pad) * max(itemsize, 4) + extra


def groups_per_unit(facts, p, itemsize=4):
    """How many work-groups of row ``p`` a compute unit holds at once (an estimate:
    2048 resident work-items, twice the per-group local memory limit per unit)."""
    by_threads = max(1, 2048 // threads(p))
    by_local = max(1, (2 * facts.local_mem_size) // max(1, local_bytes(p, itemsize)))
    return max(1, min(by_threads, by_local, 16))


def _rate(p, resident_threads):
    """Relative multiply-add rate of one unit running work-groups of ``p``: the row's
    measured "speed" where the table has one, else an estimate from the work-item's
    block (an MWI x NWI block reuses each local-memory value MWI or NWI times); fewer
    than HIDING resident work-items leave latency exposed."""
    if "speed" in p:
        speed = p["speed"]
    else:
        mwi, nwi = p["MWG"] // p["MDIMC"], p["NWG"] // p["NDIMC"]
        speed = min(1.0, (mwi * nwi / (mwi + nwi)) / 4.0)   # 8x8 blocks: 1, 4x4: 0.5
    return max(speed * min(1.0, resident_threads / HIDING), 1e-3)


def split_options(facts, p, M, N, K, batch, max_workspace):
    """The (splits, k_split) pairs worth costing for row ``p``: no split, powers of two,
    and the count that gives every resident slot of the device a work-group; each
    slice at least MIN_STEPS_PER_SLICE K steps long, the partial sums within
    ``max_workspace`` elements. A row may force a count with "KSPLIT" (tests, tuner)."""
    kwg = p["KWG"]
    steps = -(-K // kwg)

    def pair(n):
        k_split = -(-steps // n) * kwg if steps else 0
        return (-(-K // k_split) if k_split else 1), k_split
    if p.get("KSPLIT"):
        return [pair(p["KSPLIT"])]
    most = steps // MIN_STEPS_PER_SLICE
    per_split = M * N * batch
    if per_split:
        most = min(most, max_workspace // per_split, (2**31 - 1) // per_split)
    tiles = max(1, -(-M // p["MWG"]) * -(-N // p["NWG"]) * batch)
    fill = -(-facts.compute_units * groups_per_unit(facts, p) // tiles)
    counts = {1, fill} | {1 << i for i in range(1, 12)}
    return sorted({pair(n) for n in counts if 1 <= n <= max(most, 1)})


def _cost(facts, p, M, N, K, batch, splits, k_split, itemsize):
    mt, nt = -(-M // p["MWG"]), -(-N // p["NWG"])
    wgs = mt * nt * batch * splits
    gpu = groups_per_unit(facts, p, itemsize)
    resident = min(gpu, -(-wgs // facts.compute_units))
    waves = -(-wgs // (facts.compute_units * gpu))
    steps = -(-min(k_split, K) // p["KWG"]) if K else 0
    work = p["MWG"] * p["NWG"] * steps * p["KWG"] * resident
    cost = waves * (work / _rate(p, resident * threads(p)) + 64.0 * p["MWG"] * p["NWG"])
    if splits > 1:
        # partial sums written and read back, the output written (device-wide traffic),
        # and the second launch
        nbytes = (2 * splits + 1) * M * N * batch * max(itemsize, 4)
        cost += nbytes * FMA_PER_BYTE / facts.compute_units + LAUNCH
    return cost


def plan(facts, p, M, N, K, batch=1, itemsize=4, max_workspace=1 << 24, split=True):
    """The TiledPlan for tile row ``p`` (``split=False`` forbids split-K)."""
    options = split_options(facts, p, M, N, K, batch, max_workspace) if split else \
        [(1, max(K, 1))]
    cost, splits, k_split = min((_cost(facts, p, M, N, K, batch, n, ks, itemsize), n, ks)
                                for n, ks in options)
    mt, nt = -(-M // p["MWG"]), -(-N // p["NWG"])
    nthreads = threads(p)
    return TiledPlan(params=dict(p), splits=splits, k_split=k_split,
                     global_size=(nt * nthreads, mt, batch * splits),
                     local_size=(nthreads, 1, 1),
                     workspace=M * N * batch * splits if splits > 1 else 0,
                     cost=cost)


def best(facts, rows, M, N, K, batch=1, itemsize=4, max_workspace=1 << 24):
    """The cheapest plan over the tile rows ``rows`` (each already fits the device); a
    row with "MAXM" competes only for products of at most that many rows M."""
    rows = [p for p in rows if M <= p.get("MAXM", M)] or rows
    plans = [plan(facts, p, M, N, K, batch, itemsize, max_workspace) for p in rows]
    return min(plans, key=lambda pl: pl.cost)


@functools.lru_cache(maxsize=1024)
def cached_best(facts, rows, M, N, K, batch=1, itemsize=4, max_workspace=1 << 24):
    """best() for rows given as tuples of (key, value) pairs (hashable): routines ask
    for the same few shapes on every call, and costing every row and split takes about
    100 us of Python. Emptied by clnn.clear_caches()."""
    return best(facts, [dict(r) for r in rows], M, N, K, batch, itemsize, max_workspace)


_frozen = {}


def freeze(rows):
    """The rows as cached_best() takes them. A tuple of rows (the table's, which
    routines pass on every launch) is frozen once."""
    hit = _frozen.get(id(rows))
    if hit is not None and hit[0] is rows:
        return hit[1]
    frozen = tuple(tuple(sorted(r.items())) for r in rows)
    if isinstance(rows, tuple):
        if len(_frozen) > 256:
            _frozen.clear()
        _frozen[id(rows)] = (rows, frozen)      # holds rows, so its id stays unique
    return frozen


def vector_width(p, operands, limit=4):
    """The widest of 8, 4, 2, 1 that divides every offset, leading dimension and batch
    stride in ``operands`` (tuples of element counts) and the tile sizes it is loaded
    along, so vector loads stay aligned. ``limit`` caps it (1 for gathered operands; 8
    only for cp.async rows, whose copies of halves take up to 16 bytes)."""
    for v in (8, 4, 2, 1):
        if v > limit:
            continue
        if all(x % v == 0 for x in operands) and p["KWG"] % v == 0 and \
                p["MWG"] % v == 0 and p["NWG"] % v == 0:
            return v
    return 1

