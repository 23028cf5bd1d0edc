"""Cases run under `mpiexec -n 2` by test_distributed.py; each exits non-zero (or is
aborted) on failure. Usage: python mpi_battery.py CASE FOLDER"""

import os
import sys

import numpy as np

from clnn import distributed, nn, optim


def mlp(world, dtype, seed=0):
    return nn.Sequential([nn.Dense(7, "tanh"), nn.Dense(3, "sigmoid")], in_features=5,
                         device=world.device, dtype=dtype, seed=seed)


def equivalence(folder):
    """2 ranks with batch B/2 each = one process with batch B; every rank bitwise the
    same weights after every step; the shards cover every example once per epoch."""
    world = distributed.World()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((21, 5)), rng.random((21, 3))
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 2e-6)):
        # rank 1 starts from other weights: the broadcast must replace them
        net = mlp(world, dtype, seed=world.rank)
        dp = distributed.DataParallel(net, world)
        hist = dp.fit(x, y, epochs=3, batch_size=8, optimizer=optim.SGD(lr=0.3, momentum=0.9),
                      seed=4)
        assert dp.identical(), "ranks hold different weights"
        single = mlp(world, dtype, seed=0)
        ref = single.fit(x, y, epochs=3, batch_size=8, optimizer=optim.SGD(lr=0.3,
                                                                            momentum=0.9),
                         seed=4, progress=False)
        for p, q in zip(net.parameters(), single.parameters()):
            a, b = p.get(), q.get()
            err = np.abs(a - b).max() / np.abs(b).max()
            assert err < tol, f"{dtype.__name__}: relative difference {err}"
        assert np.allclose(hist["loss"], ref["loss"], rtol=tol * 10), (hist, ref)
    # sharding: one batch of 5 over 2 ranks is 3 + 2; of 1, 1 + 0 (the empty rank joins in)
    assert list(distributed.shard(np.arange(5), 0, 2)) == [0, 1, 2]
    assert list(distributed.shard(np.arange(5), 1, 2)) == [3, 4]
    net = mlp(world, np.float64)
    dp = distributed.DataParallel(net, world)
    dp.fit(x[:9], y[:9], epochs=1, batch_size=4, optimizer=optim.Adam(lr=0.01))
    assert dp.identical()
    single = mlp(world, np.float64)
    single.fit(x[:9], y[:9], epochs=1, batch_size=4, optimizer=optim.Adam(lr=0.01), seed=0,
               progress=False)
    for p, q in zip(net.parameters(), single.parameters()):
        assert np.allclose(p.get(), q.get(), rtol=1e-12, atol=1e-14)
    # buckets: a bucket per layer (each exchanged as soon as the device has it), the
    # default, or one after the backward pass give bitwise the same weights
    results = []
    for bucket_bytes in (1, distributed.BUCKET_BYTES, None):
        deep = nn.Sequential([nn.Dense(9, "tanh"), nn.Dense(6, "relu"), nn.Dense(3, "sigmoid")],
                             in_features=5, device=world.device, dtype=np.float32, seed=1)
        ddp = distributed.DataParallel(deep, world, bucket_bytes=bucket_bytes)
        ddp.fit(x, y, epochs=2, batch_size=7, optimizer=optim.SGD(lr=0.3, momentum=0.9),
                seed=2)
        assert ddp.identical()
        results.append((len(ddp.buckets()), deep.flat_parameters.get()))
    assert [n for n, _ in results] == [3, 1, 1], results
    assert all(np.array_equal(results[0][1], r) for _, r in results[1:])
    # Dropout: each rank draws its shard's part of the global batch's masks, so the
    # ranks together drop what one process with the whole batch drops
    def dropnet():
        return nn.Sequential([nn.Dense(16, "relu"), nn.Dropout(0.4), nn.Dense(3, "sigmoid")],
                             in_features=5, device=world.device, dtype=np.float64, seed=3)
    net = dropnet()
    dp = distributed.DataParallel(net, world)
    dp.fit(x, y, epochs=2, batch_size=8, optimizer=optim.SGD(lr=0.3, momentum=0.9), seed=5)
    single = dropnet()
    single.fit(x, y, epochs=2, batch_size=8, optimizer=optim.SGD(lr=0.3, momentum=0.9),
               seed=5, progress=False)
    for p, q in zip(net.parameters(), single.parameters()):
        err = np.abs(p.get() - q.get()).max() / np.abs(q.get()).max()
        assert err < 1e-12, f"with Dropout: relative difference {err}"
    # mixed precision: every rank checks the same summed gradients for overflow (all
    # skip together: the scale starts too high), and the loss scale's factor S / B is
    # the global batch's on every rank, so uneven shards weigh their examples right
    def halfnet():
        return nn.Sequential([nn.Dense(9, "tanh"), nn.Dense(3, "sigmoid")], in_features=5,
                             device=world.device, seed=8)
    net, single = halfnet(), halfnet()
    net.scaler, single.scaler = nn.GradScaler(2.0 ** 22), nn.GradScaler(2.0 ** 22)
    dp = distributed.DataParallel(net, world)
    opts = dict(epochs=4, batch_size=8, seed=6, precision="float16")
    dp.fit(x, y, optimizer=optim.SGD(lr=0.3, momentum=0.9), **opts)
    single.fit(x, y, optimizer=optim.SGD(lr=0.3, momentum=0.9), progress=False, **opts)
    assert dp.identical(), "float16: ranks hold different weights"
    assert net.scaler.skipped == single.scaler.skipped > 0, (net.scaler.config(),
                                                             single.scaler.config())
    p, q = net.flat_parameters.get(), single.flat_parameters.get()
    err = np.abs(p - q).max() / np.abs(q).max()
    assert err < 1e-2, f"float16: relative difference {err}"
    assert np.abs(q - halfnet().flat_parameters.get()).max() > 10 * np.abs(p - q).max()
    # bfloat16: no loss scale, the mean gradient summed over the ranks in float32
    net, single = halfnet(), halfnet()
    dp = distributed.DataParallel(net, world)
    opts = dict(opts, precision="bfloat16")
    dp.fit(x, y, optimizer=optim.SGD(lr=0.3, momentum=0.9), **opts)
    single.fit(x, y, optimizer=optim.SGD(lr=0.3, momentum=0.9), progress=False, **opts)
    assert dp.identical(), "bfloat16: ranks hold different weights"
    assert net.scaler is None and single.scaler is None
    p, q = net.flat_parameters.get(), single.flat_parameters.get()
    err = np.abs(p - q).max() / np.abs(q).max()
    assert err < 2e-2, f"bfloat16: relative difference {err}"   # measured 8e-4
    assert np.abs(q - halfnet().flat_parameters.get()).max() > 5 * np.abs(p - q).max()
    # checkpoints: rank 0 writes, every rank can read it after save returns
    path = dp.save(os.path.join(folder, "dp.npz"))
    again = nn.load(path, device=world.device)
    assert all(np.array_equal(p.get(), q.get())
               for p, q in zip(again.parameters(), net.parameters()))
    print(f"rank {world.rank}: equivalence passed")


def mismatch(folder):
    """Different networks on the two ranks: a DistributedError on both, no hang."""
    world = distributed.World()
    net = nn.Sequential([nn.Dense(4 + world.rank, "tanh")], in_features=5,
                        device=world.device)
    try:
        distributed.DataParallel(net, world)
    except distributed.DistributedError as exc:
        print(f"rank {world.rank}: mismatch found: {str(exc)[:60]}")
        return
    raise SystemExit("no error for different networks")


def failure(folder):
    """An exception on rank 1 ends the job with its rank and message, while rank 0 is
    waiting in a collective."""
    world = distributed.World()
    with world.guard():
        if world.rank == 1:
            raise RuntimeError("injected failure")
        world.comm.Barrier()            # rank 0 would wait here forever otherwise
    raise SystemExit("rank 0 went past the barrier")


if __name__ == "__main__":
    {"equivalence": equivalence, "mismatch": mismatch, "failure": failure}[sys.argv[1]](
        sys.argv[2])
