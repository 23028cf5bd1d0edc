"""Data-parallel training step of benchmarks/bench_mlp.py's network on 1 or more ranks,
and the gradient exchange alone.

    python benchmarks/bench_distributed.py                 # one process
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/bench_distributed.py

Network: 2000-5000 tanh-1000 sigmoid-10 sigmoid, global batch 1000 split over the ranks,
quadratic loss, SGD with momentum. Before timing, the ranks' weights after a step are
checked to be bitwise identical, with the exchange in buckets overlapping the backward
pass and with one exchange after it. Prints (rank 0) the step time both ways
(alternating), the exchange time for the gradient's size (gather in rank order and sum:
what every step does) and the bytes each rank sends per step. Writes
benchmarks/results/bench_distributed_N.json.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from clnn import distributed, nn, optim  # noqa: E402

IN, BATCH = 2000, 1000
LAYERS = [(5000, "tanh"), (1000, "sigmoid"), (10, "sigmoid")]


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--bucket-mib", type=float, default=distributed.BUCKET_BYTES / 2**20,
                    help="bucket size of the overlapped exchange (default %(default)s)")
    args = ap.parse_args(argv)
    world = distributed.World()
    dev = world.device
    net = nn.Sequential([nn.Dense(w, a) for w, a in LAYERS], IN, device=dev, seed=0)
    net.optimizer = optim.SGD(lr=0.1, momentum=0.9)
    dp = distributed.DataParallel(net, world,
                                  bucket_bytes=int(args.bucket_mib * 2**20))
    one = distributed.DataParallel(net, world, bucket_bytes=None)
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, IN), dtype=np.float32)
    y = rng.random((BATCH, 10), dtype=np.float32)
    mine = distributed.shard(np.arange(BATCH), world.rank, world.size)
    import clnn
    X = clnn.asarray(x[mine], device=dev)
    Y = clnn.asarray(y[mine], device=dev)
    for d in (dp, one):
        d.train_step(X, Y)
        if not d.identical():
            raise SystemExit("ranks disagree after one step")
    times = {id(dp): [], id(one): []}
    for _ in range(args.repeats):       # alternating, so drift hits both alike
        for d in (dp, one):
            times[id(d)].append(_common.median_time(lambda: d.train_step(X, Y), 1,
                                                    warmup=0, sync=dev.finish))
    t_step, t_one = (float(np.median(times[id(d)])) for d in (dp, one))
    flat = net.flat_gradients
    t_sum = _common.median_time(lambda: dp._sum_gradients(flat, 1.0), args.repeats, warmup=1)
    t_steps = world.comm.gather(t_step)
    t_ones = world.comm.gather(t_one)
    if world.rank == 0:
        nbytes = (flat.size + 1) * flat.dtype.itemsize
        print(f"{world.size} rank(s) on {dev.name}, {len(mine)} examples each")
        print(f"step: {1e3 * max(t_steps):.1f} ms (slowest rank) with {len(dp.buckets())} "
              f"buckets of >= {args.bucket_mib:g} MiB overlapping the backward pass, "
              f"{1e3 * max(t_ones):.1f} ms with one exchange after it "
              f"(overlap saves {1e3 * (max(t_ones) - max(t_steps)):.1f} ms)")
        print(f"gradient exchange alone {1e3 * t_sum:.1f} ms for {nbytes / 2**20:.1f} MiB "
              f"per rank ({100 * t_sum / max(t_ones):.0f}% of the step)")
        result = {"ranks": world.size, "step_seconds": max(t_steps),
                  "step_seconds_one_bucket": max(t_ones), "buckets": len(dp.buckets()),
                  "bucket_bytes": int(args.bucket_mib * 2**20),
                  "exchange_seconds": t_sum, "gradient_bytes": nbytes}
        print(f"results: {_common.write_json(f'bench_distributed_{world.size}', result, args.json)}")


if __name__ == "__main__":
    main()
