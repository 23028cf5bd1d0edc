"""The promises under attack: typed errors before anything is enqueued, outputs and
weights untouched by a failed call or step, budget-independent bits, thread-safe
launches, checked checkpoints and tuning databases. Each numbered test is a
regression test for the item of the same number in the reliability issue."""

import contextlib
import functools
import json
import os
import stat
import sys
from unittest import mock

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clnn
from clnn import nn, tuning

from conftest import Guarded, race
from reference import conv2d_backward_ref, conv2d_ref

conv_module = sys.modules["clnn.ops.conv"]
gemm_module = sys.modules["clnn.ops.gemm"]
RNG = np.random.default_rng(13)
NV = tuning.GEMM_TABLE["vendor"][("nvidia", "GPU")]


def dev_rand(dev, *shape, dtype=np.float32):
    return clnn.asarray(RNG.standard_normal(shape).astype(dtype), device=dev)


# ---------------------------------------------------------------- 1, 12: index ranges

def test_1_conv_index_overflow_is_a_shape_error(dev):
    x = clnn.zeros((1, 2, 8, 8), device=dev)
    dy = clnn.zeros((1, 3, 3, 3), device=dev)
    w = clnn.zeros((3, 2, 3, 3), device=dev)
    big = 2 ** 28
    with pytest.raises(clnn.ShapeError, match="32-bit"):
        clnn.conv2d_backward_weight(dy, x, (3, 2, 3, 3), stride=big, padding=big)
    with pytest.raises(clnn.ShapeError, match="32-bit"):
        clnn.conv2d(x, w, stride=big, padding=big)
    with pytest.raises(clnn.ShapeError, match="32-bit"):
        clnn.conv2d_backward_data(dy, w, (1, 2, 8, 8), stride=big, padding=big)


def test_12_huge_stride_and_numpy_ints_work_like_pytorch(dev):
    x = RNG.standard_normal((2, 3, 7, 6))
    w = RNG.standard_normal((4, 3, 3, 2))
    xd, wd = clnn.asarray(x, device=dev, dtype=np.float32), \
        clnn.asarray(w, device=dev, dtype=np.float32)
    # one output position: the stride multiplies nothing
    y = clnn.conv2d(xd, wd, stride=10 ** 12, padding=np.int64(1)).get()
    ref = conv2d_ref(x, w, None, (10 ** 12, 10 ** 12), (1, 1))
    assert y.shape == ref.shape == (2, 4, 1, 1)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    dy = RNG.standard_normal(ref.shape)
    dx_ref, dw_ref = conv2d_backward_ref(dy, x, w, (10 ** 12, 10 ** 12), (1, 1))
    dyd = clnn.asarray(dy, device=dev, dtype=np.float32)
    np.testing.assert_allclose(clnn.conv2d_backward_data(dyd, wd, np.array(x.shape),
                                                         stride=10 ** 12, padding=1).get(),
                               dx_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(clnn.conv2d_backward_weight(dyd, xd, w.shape,
                                                           stride=np.int32(10 ** 9),
                                                           padding=1).get(),
                               dw_ref, rtol=1e-4, atol=1e-4)
    assert clnn.max_pool2d(xd, np.int64(2), 10 ** 12).shape == (2, 3, 1, 1)
    assert nn.Conv2d(2, np.int64(3), stride=np.int64(2)).kernel_size == (3, 3)
    for bad in (2.0, "2", None, (1, 2, 3), True, 0):
        with pytest.raises(clnn.ShapeError):
            clnn.conv2d(xd, wd, stride=bad)
        with pytest.raises(clnn.ShapeError):
            nn.Conv2d(2, 3, stride=bad)
        if bad is not None:           # a pooling stride of None is the window's size
            with pytest.raises(clnn.ShapeError):
                clnn.max_pool2d(xd, 2, stride=bad)


# ---------------------------------------------------------------- 2: array extents

def test_2_views_past_their_buffer_are_refused(dev):
    buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 16)
    a = cla.Array(dev.queue, (2_000_000,), np.float32, data=buf)
    m = cla.Array(dev.queue, (1000, 2000), np.float32, data=buf)
    for call in (lambda: clnn.relu(a), lambda: clnn.fill(a, 1.0), lambda: clnn.sum(a),
                 lambda: clnn.copy(a), lambda: clnn.gemm(m, m, trans_b=True),
                 lambda: clnn.softmax(m), lambda: clnn.relu(a[:8], out=a[:8])):
        with pytest.raises(clnn.ShapeError, match="past the buffer"):
            call()
    ok = cla.Array(dev.queue, (4,), np.float32, data=buf)
    clnn.fill(ok, 2.0)
    assert ok.get().tolist() == [2.0] * 4


# ---------------------------------------------------------------- 3: threads

def test_3_launches_from_many_threads_keep_their_arguments(dev):
    n, iters = 257, 150
    errors = []

    def work(t):
        x = clnn.asarray(np.full(n, t + 1, np.float32), device=dev)
        y = clnn.asarray(np.arange(n, dtype=np.float32), device=dev)
        want = (t + 1) * np.arange(n, dtype=np.float32)
        for i in range(iters):
            got = clnn.hadamard(x, y).get()
            if not np.array_equal(got, want):
                errors.append((t, i))
    race(*(functools.partial(work, t) for t in range(4)))
    assert not errors, f"{len(errors)} launches computed with another thread's arrays"


# ---------------------------------------------------------------- 4, 5: all or nothing

class FailAt:
    """Wrap a pool's allocate: request number ``at`` (0-based) raises OutOfDeviceMemory;
    ``at=None`` only counts."""

    def __init__(self, pool, at=None):
        self.pool, self.at, self.count = pool, at, 0
        self.real = pool.allocate

    def __call__(self, nbytes):
        k, self.count = self.count, self.count + 1
        if k == self.at:
            raise clnn.OutOfDeviceMemory("injected", request=nbytes)
        return self.real(nbytes)


@contextlib.contextmanager
def failing(pool, at=None):
    f = FailAt(pool, at)
    with mock.patch.object(pool, "allocate", f):
        yield f


def walk(dev, call, snapshot):
    """Run ``call`` with an injected failure at each of its allocation requests in
    turn; each failing run must leave ``snapshot()`` as it was. Returns the count."""
    with failing(dev.pool) as counter:
        call()
    n = counter.count
    for at in range(n):
        before = snapshot()
        with failing(dev.pool, at), pytest.raises(clnn.OutOfDeviceMemory):
            call()
        after = snapshot()
        for b, a in zip(before, after):
            assert np.array_equal(b, a, equal_nan=True), \
                f"allocation {at} of {n} failed after a write"
    return n


CASES = {
    # K in slices (PANEL_BYTES made small), and blocks of columns under a small cap:
    # the packed (CPU) GEMM and the gathered convolution, forced on every device (a
    # GPU would take the tiled kernels, which allocate nothing here)
    "gemm-k-slices": lambda dev: (
        _all(mock.patch.object(gemm_module, "PANEL_BYTES", 64 << 10),
             mock.patch.object(gemm_module, "DIRECT_FLOPS", 0),      # (a small product)
             tuning.override("gemm", tuning.GEMM_TABLE["type"]["CPU"])),
        lambda o: clnn.gemm(A, B, out=o, beta=0.5), (64, 3)),
    # a 16-bit C's slices of K summed in a float32 workspace, then the epilogue pass
    "gemm-16bit-k-slices": lambda dev: (
        _all(mock.patch.object(gemm_module, "PANEL_BYTES", 64 << 10),
             mock.patch.object(gemm_module, "DIRECT_FLOPS", 0),
             tuning.override("gemm", tuning.GEMM_TABLE["type"]["CPU"])),
        lambda o: clnn.gemm(A16, B16, out=o, beta=0.5, activation="tanh"), (64, 3),
        np.float16),
    "wgrad-groups": lambda dev: (
        _all(mock.patch.object(conv_module, "SCRATCH_BYTES", 4 << 10),
             tuning.override("conv", tuning.CONV_TABLE["type"]["CPU"])),
        lambda o: clnn.conv2d_backward_weight(DY, X, (3, 2, 3, 3), out=o, padding=1,
                                              beta=0.5), (3, 2, 3, 3)),
    "winograd-groups": lambda dev: (
        # an image's transforms take 3456 bytes (F(4x4)): groups of 2, 2 and 1
        _all(mock.patch.object(conv_module, "WINO_GROUP_BYTES", 9300),
             tuning.override("conv", dict(tuning.CONV_TABLE["type"]["CPU"], WINO=True))),
        lambda o: clnn.conv2d(X, W2, padding=1, out=o), (5, 4, 6, 7)),
    "winograd-wgrad-groups": lambda dev: (
        _all(mock.patch.object(conv_module, "WINO_GROUP_BYTES", 9300),
             tuning.override("conv", dict(tuning.CONV_TABLE["type"]["CPU"], WINO=True))),
        lambda o: clnn.conv2d_backward_weight(DY, X, (3, 2, 3, 3), out=o, padding=1,
                                              beta=0.5), (3, 2, 3, 3)),
    "dgrad-col2im-groups": lambda dev: (
        contextlib.ExitStack(), lambda o: _dgrad_col2im(o), (5, 2, 6, 7)),
    # a CPU's strided data gradient as dcol transposed (packed GEMMs, forced) and the
    # rows col2im, in groups of 2 images (the last one images 3 and 4: each GEMM asks
    # for the panels the one before let go)
    "dgrad-col2im-rows-groups": lambda dev: (
        _all(mock.patch.object(conv_module, "SCRATCH_BYTES", 2 * 18 * 12 * 4),
             mock.patch.object(gemm_module, "DIRECT_FLOPS", 0),
             tuning.override("gemm", tuning.GEMM_TABLE["type"]["CPU"]),
             tuning.override("conv", tuning.CONV_TABLE["type"]["CPU"])),
        lambda o: clnn.conv2d_backward_data(DY2, W2, (5, 2, 6, 7), stride=2, padding=1,
                                            out=o), (5, 2, 6, 7)),
    # a CPU's strided 1x1 convolution: the copy of its positions, then batched packed
    # GEMMs (forced); its weight gradient over the copy, an image a group, each after
    # the first adding into dw
    "pointwise-strided-forward": lambda dev: (
        _all(mock.patch.object(gemm_module, "DIRECT_FLOPS", 0),
             mock.patch.object(conv_module, "POINTWISE_MIN_COLS", 0),
             tuning.override("gemm", tuning.GEMM_TABLE["type"]["CPU"]),
             tuning.override("conv", tuning.CONV_TABLE["type"]["CPU"])),
        lambda o: clnn.conv2d(X, W1, B1, stride=2, activation="relu", out=o), (5, 3, 3, 4)),
    "pointwise-strided-wgrad-groups": lambda dev: (
        _all(mock.patch.object(conv_module, "SCRATCH_BYTES", 1),
             mock.patch.object(conv_module, "POINTWISE_MIN_COLS", 0),
             mock.patch.object(conv_module, "POINTWISE_MIN_MACS", 0),
             tuning.override("conv", tuning.CONV_TABLE["type"]["CPU"])),
        lambda o: clnn.conv2d_backward_weight(DY1, X, (3, 2, 1, 1), stride=2, out=o,
                                              beta=0.5), (3, 2, 1, 1)),
    # overlapping max windows' backward pass by rows (forced): the forward kernel's
    # indices and maxima into scratch, then dx
    "max-pool-overlapping-backward": lambda dev: (
        tuning.override("rows", {"wg": False}),
        lambda o: clnn.max_pool2d_backward(DYP, X, 3, 2, 1, out=o), (5, 2, 6, 7)),
    "gpu-dgrad-phases": lambda dev: (
        tuning.override("gemm", dict(NV[-1], KSPLIT=2)),
        lambda o: clnn.conv2d_backward_data(DY2, W2, (5, 2, 6, 7), stride=2, padding=1,
                                            out=o), (5, 2, 6, 7)),
}
A = B = A16 = B16 = X = DY = DY2 = W2 = W1 = B1 = DY1 = DYP = None


@contextlib.contextmanager
def _all(*managers):
    with contextlib.ExitStack() as stack:
        for m in managers:
            stack.enter_context(m)
        yield


def _dgrad_col2im(o):
    with tuning.override("conv", dict(tuning.CONV_TABLE["type"]["CPU"], DGRAD="col2im")), \
            mock.patch.object(conv_module, "SCRATCH_BYTES", 1 << 10):
        return clnn.conv2d_backward_data(DY2, W2, (5, 2, 6, 7), stride=2, padding=1, out=o)


@pytest.mark.parametrize("case", sorted(CASES))
def test_4_a_failed_allocation_never_leaves_a_half_written_output(dev, case):
    global A, B, A16, B16, X, DY, DY2, W2, W1, B1, DY1, DYP
    A, B = dev_rand(dev, 64, 301), dev_rand(dev, 301, 3)
    A16, B16 = (clnn.asarray(x.get().astype(np.float16), device=dev) for x in (A, B))
    X, DY = dev_rand(dev, 5, 2, 6, 7), dev_rand(dev, 5, 3, 6, 7)
    W2, DY2 = dev_rand(dev, 4, 2, 3, 3), dev_rand(dev, 5, 4, 3, 4)
    W1, B1, DY1 = dev_rand(dev, 3, 2, 1, 1), dev_rand(dev, 3), dev_rand(dev, 5, 3, 3, 4)
    DYP = dev_rand(dev, 5, 2, 3, 4)
    patch, call, shape, *dtype = CASES[case](dev)
    out = Guarded(dev, shape, dtype[0] if dtype else np.float32,
                  fill=RNG.standard_normal(shape))
    with patch:
        n = walk(dev, lambda: call(out.view), lambda: [out.big.get()])
    assert n >= 1
    out.check()


@pytest.mark.parametrize("rows", ["cpu-groups", "gpu-convw", "gpu-gemm"])
def test_4_a_weight_gradient_with_its_bias_is_all_or_nothing(dev, rows):
    """conv2d_backward_weight(db=) writes two outputs: an allocation failure anywhere
    (the CPU's image groups, convw.cl's workspace, the GPU's GEMM beside bias_grad's
    temporaries) leaves dw and db both as they were, beta 0.5 reading both."""
    dy, x = dev_rand(dev, 5, 3, 6, 7), dev_rand(dev, 5, 2, 6, 7)
    dw = Guarded(dev, (3, 2, 3, 3), np.float32, fill=RNG.standard_normal((3, 2, 3, 3)))
    db = Guarded(dev, (3,), np.float32, fill=RNG.standard_normal(3))
    patch = {"cpu-groups": _all(mock.patch.object(conv_module, "SCRATCH_BYTES", 4 << 10),
                                tuning.override("conv", tuning.CONV_TABLE["type"]["CPU"])),
             "gpu-convw": tuning.override("gemm", tuning.GEMM_TABLE["type"]["GPU"]),
             "gpu-gemm": _all(mock.patch.object(conv_module, "WGRAD_DIRECT", False),
                              tuning.override("gemm", dict(NV[-1], KSPLIT=2)))}[rows]
    def call():
        clnn.conv2d_backward_weight(dy, x, (3, 2, 3, 3), padding=1, out=dw.view,
                                    db=db.view, beta=0.5)
    with patch, clnn.profile() as prof:
        call()            # (what a first call makes once: a GPU's tables of k)
        n = walk(dev, call, lambda: [dw.big.get(), db.big.get()])
    assert n >= (1 if rows == "gpu-convw" else 2)     # (convw.cl: its workspace alone)
    assert ("clnn_convw_partial" in [r.entry for r in prof.records]) == (rows == "gpu-convw")
    dw.check(), db.check()


def lenet_like(dev, seed=0):
    return nn.Sequential([nn.Conv2d(3, 3, padding=1), nn.MaxPool2d(2), nn.Conv2d(4, 3),
                          nn.AvgPool2d(2), nn.Flatten(), nn.Dense(5, "softmax")],
                         in_shape=(2, 10, 10), device=dev, seed=seed)


@pytest.mark.parametrize("rows", ["device", "gpu-tiles"])
def test_5_a_training_step_is_all_or_nothing(dev, rows):
    net = lenet_like(dev)
    x = dev_rand(dev, 7, 2, 10, 10)
    y = RNG.integers(0, 5, 7)
    xd, yd, _, _ = net._train_args(x, y, "cross_entropy", 0.1, 0.9)
    force = tuning.override("gemm", NV[0]) if rows == "gpu-tiles" else contextlib.nullcontext()

    def state():
        opt = net.optimizer
        vel = [b.get() for s in (opt.state if opt and opt.state else []) for b in s]
        return [p.get() for l in net.layers for p in l.parameters()] + vel
    with force:
        net.train_step(xd, yd, 0.1, 0.9, "cross_entropy")        # momentum now nonzero
        n = walk(dev, lambda: net.train_step(xd, yd, 0.1, 0.9, "cross_entropy"), state)
        before = state()
        net.train_step(xd, yd, 0.1, 0.9, "cross_entropy")
    assert n >= 1
    assert any(not np.array_equal(b, a) for b, a in zip(before, state()))


def test_5_the_first_step_too(dev):
    """The first step allocates its workspace, gradients and momenta: a failure there
    leaves the weights as built. (A network's first step counts the allocations after
    another's has run: the process's first step of a shape also makes what every later
    one shares, a GPU's convolution tables among them.)"""
    net = lenet_like(dev, seed=3)
    x, y = dev_rand(dev, 4, 2, 10, 10), RNG.integers(0, 5, 4)
    weights = [p.get() for l in net.layers for p in l.parameters()]
    xd, yd, _, _ = net._train_args(x, y, "cross_entropy", 0.1, 0.9)
    lenet_like(dev, seed=3).train_step(xd, yd, 0.1, 0.9, "cross_entropy")
    other = lenet_like(dev, seed=3)
    with failing(dev.pool) as counter:
        other.train_step(xd, yd, 0.1, 0.9, "cross_entropy")
    for at in range(0, counter.count, 3):
        net._train.clear()
        net._grads = net.optimizer = None
        with failing(dev.pool, at), pytest.raises(clnn.OutOfDeviceMemory):
            net.train_step(xd, yd, 0.1, 0.9, "cross_entropy")
        assert all(np.array_equal(w, p.get()) for w, p in
                   zip(weights, (p for l in net.layers for p in l.parameters())))


# ---------------------------------------------------------------- 6, 7: NaN and inf

def test_6_scalars_and_inputs_are_checked_in_the_kernels_type(dev):
    a = dev_rand(dev, 4, 4)
    out = Guarded(dev, (4, 4), np.float32, fill=np.ones((4, 4)))
    for call in (lambda: clnn.axpy(1e39, a, a, out=out.view),
                 lambda: clnn.gemm(a, a, out=out.view, alpha=1e39),
                 lambda: clnn.gemm(a, a, out=out.view, beta=-1e39),
                 lambda: clnn.leaky_relu(a, out=out.view, slope=1e39),
                 lambda: clnn.scale(float("nan"), a, out=out.view)):
        with pytest.raises(clnn.ArgumentError):
            call()
    assert np.all(out.check() == 1)
    clnn.axpy(1e39, clnn.asarray(np.ones(3)), clnn.asarray(np.ones(3)))   # fine in float64
    net = nn.Sequential([nn.Dense(2, "relu")], in_features=3, device=dev)
    with pytest.raises(clnn.ArgumentError, match="NaN or infinite"):
        net.fit(np.full((4, 3), 1e39), np.zeros((4, 2)), epochs=1)
    with pytest.raises(clnn.ArgumentError, match="NaN or infinite"):
        net.fit(np.ones((4, 3)), np.full((4, 2), -1e39), epochs=1)
    # big but finite device inputs are fine (a sum would overflow to inf)
    big = clnn.asarray(np.full((4, 3), 3e37, np.float32), device=dev)
    assert clnn.count_nonfinite(big) == 0
    net.evaluate(big, np.zeros((4, 2)))
    assert clnn.count_nonfinite(clnn.asarray(
        np.array([1, np.inf, np.nan, -np.inf, 0], np.float32), device=dev)) == 3


def test_7_nan_is_not_masked(dev, tmp_path):
    z = clnn.asarray(np.array([np.nan, -1.0, 2.0], np.float32), device=dev)
    r = clnn.relu(z).get()
    assert np.isnan(r[0]) and r[1:].tolist() == [0.0, 2.0]
    g = clnn.gemm(clnn.asarray(np.array([[np.nan], [-1.0]], np.float32), device=dev),
                  clnn.asarray(np.ones((1, 3), np.float32), device=dev),
                  activation="relu").get()
    assert np.all(np.isnan(g[0])) and np.all(g[1] == 0)
    net = nn.Sequential([nn.Dense(2, "relu")], in_features=3, device=dev)
    net.layers[0].weight.set(np.full((2, 3), np.nan, np.float32))
    path = net.save(str(tmp_path / "nan.npz"))
    with pytest.raises(clnn.CheckpointError, match="NaN"):
        nn.load(path, device=dev)


# ---------------------------------------------------------------- 8: budget and bits

def test_8_the_budget_decides_whether_it_fits_never_the_bits(dev):
    a, b = dev_rand(dev, 300, 4000), dev_rand(dev, 4000, 300)
    x, dy = dev_rand(dev, 16, 8, 20, 20), dev_rand(dev, 16, 8, 20, 20)
    ref = clnn.gemm(a, b).get(), clnn.conv2d_backward_weight(dy, x, (8, 8, 3, 3),
                                                            padding=1).get()
    old = dev.pool.budget
    try:
        dev.pool.budget = dev.pool.real_bytes + (12 << 20)
        tight = clnn.gemm(a, b).get(), clnn.conv2d_backward_weight(dy, x, (8, 8, 3, 3),
                                                                  padding=1).get()
    finally:
        dev.pool.budget = old
    assert np.array_equal(ref[0], tight[0]) and np.array_equal(ref[1], tight[1])


# ---------------------------------------------------------------- 9: checkpoints

def _craft(path, arch, **arrays):
    np.savez(path, architecture=np.frombuffer(json.dumps(arch).encode(), np.uint8), **arrays)
    return str(path)


def test_9_untrusted_checkpoints_are_checked_before_anything_is_built(dev, tmp_path):
    dense = {"type": "Dense", "out_features": 20000, "activation": "relu", "param": None}
    huge = _craft(tmp_path / "huge.npz", {"in_shape": [20000], "dtype": "float32",
                                          "layers": [dense]})
    real = dev.pool.real_bytes
    with pytest.raises(clnn.CheckpointError, match="missing"):
        nn.load(huge, device=dev)
    assert dev.pool.real_bytes == real
    small = dict(dense, out_features=2)
    arch = {"in_shape": [3], "dtype": "float32", "layers": [small]}
    w, b = np.ones((2, 3), np.float32), np.zeros(2, np.float32)
    bad = {
        "float64 weights": _craft(tmp_path / "f64.npz", arch, **{
            "layer0.weight": w.astype(np.float64), "layer0.bias": b}),
        "wrong shape": _craft(tmp_path / "shape.npz", arch, **{
            "layer0.weight": w.T.copy(), "layer0.bias": b}),
        "extra array": _craft(tmp_path / "extra.npz", arch, **{
            "layer0.weight": w, "layer0.bias": b, "evil": b}),
        "unknown layer": _craft(tmp_path / "layer.npz", dict(arch, layers=[{"type": "X"}])),
        "bad config": _craft(tmp_path / "cfg.npz", dict(arch, layers=[
            dict(small, out_features=-1)])),
        "no layers": _craft(tmp_path / "none.npz", dict(arch, layers=[])),
        "bad dtype": _craft(tmp_path / "dt.npz", dict(arch, dtype="int8")),
        "not json": str(tmp_path / "json.npz"),
        "not a zip": str(tmp_path / "zip.npz"),
        "missing file": str(tmp_path / "nothing.npz"),
    }
    np.savez(bad["not json"], architecture=np.frombuffer(b"{not json", np.uint8))
    (tmp_path / "zip.npz").write_bytes(b"PK\x03\x04 not really a zip")
    for why, path in bad.items():
        with pytest.raises(clnn.CheckpointError):
            nn.load(path, device=dev)
    good = _craft(tmp_path / "good.npz", arch, **{"layer0.weight": w, "layer0.bias": b})
    assert np.array_equal(nn.load(good, device=dev).layers[0].weight.get(), w)


# ---------------------------------------------------------------- 10: tuning database

def test_10_the_tuning_database_is_read_with_care(dev, tmp_path, monkeypatch):
    x, w = dev_rand(dev, 1, 2, 6, 6), dev_rand(dev, 3, 2, 3, 3)
    want = clnn.conv2d(x, w).get()
    klass = f"conv-fwd-{tuning.size_bucket(3, 16, 18)}"
    key = tuning.db_key(dev.facts, np.float32, klass)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sources = ["/dev/zero", str(fifo)]
    for bad in ({"MWI": True}, {"MWI": 400}, {"VW": "8"}, {"WG": 10 ** 9}):
        path = tmp_path / f"db{len(sources)}.json"
        row = dict(tuning.CONV_TABLE["type"]["CPU"], **bad)
        path.write_text(json.dumps({"version": 1, "entries": {key: {"params": row}}}))
        sources.append(str(path))
    for src in sources:
        monkeypatch.setenv("CLNN_TUNING_DB", src)
        with pytest.warns(RuntimeWarning, match="ignoring"):
            got = clnn.conv2d(x, w).get()
        assert np.array_equal(got, want)


# ---------------------------------------------------------------- 11: clnn train --out

def test_11_train_checks_out_before_training(tmp_path, capsys):
    from clnn import cli
    a_file = tmp_path / "model"
    a_file.write_text("keep me")
    for out in (str(a_file), str(a_file / "below")):
        with mock.patch("clnn.train._train", side_effect=AssertionError("trained")):
            assert cli.main(["train", "mnist", "--epochs", "1", "--out", out,
                             "--no-progress"]) == 1
        assert "ArgumentError" in capsys.readouterr().err
    assert a_file.read_text() == "keep me"


# ---------------------------------------------------------------- 12: typed errors

def test_12_bad_arguments_are_typed_errors(dev, monkeypatch, capsys):
    a = dev_rand(dev, 3, 3)
    out = Guarded(dev, (3, 3), np.float32, fill=np.ones((3, 3)))
    calls = {
        "gemm b None": lambda: clnn.gemm(a, None, out=out.view),
        "alpha None": lambda: clnn.scale(None, a, out=out.view),
        "alpha str": lambda: clnn.scale("2", a, out=out.view),
        "fill str": lambda: clnn.fill(out.view, "2"),
        "param str": lambda: clnn.elu(a, out=out.view, alpha="1"),
        "axis float": lambda: clnn.sum(a, axis=1.0),
        "x numpy": lambda: clnn.relu(np.ones(3)),
    }
    for name, call in calls.items():
        with pytest.raises(clnn.ClnnError):
            call()
    assert np.all(out.check() == 1)
    net = nn.Sequential([nn.Dense(2)], in_features=3, device=dev)
    for bs in (0, -1, 2.5, True):
        with pytest.raises(clnn.ArgumentError):
            net.evaluate(np.ones((4, 3)), np.zeros((4, 2)), batch_size=bs)
    from clnn.device import _default_budget
    for env in ("-5", "0", "inf", "nan", "lots"):
        monkeypatch.setenv("CLNN_POOL_BYTES", env)
        with pytest.raises(clnn.DeviceError, match="CLNN_POOL_BYTES"):
            _default_budget(dev.facts)
    for budget in (0, -5, float("inf"), "1e6", None):
        with pytest.raises(clnn.ArgumentError):
            dev.pool.budget = budget
    from clnn import cli
    assert cli.main(["render", "gemm", "--param", "variant=nosuch"]) == 1
    assert "no GEMM variant 'nosuch'" in capsys.readouterr().err


# ---------------------------------------------------------------- 13: smaller ones

def test_13_asarray_save_and_layer_reuse(dev, tmp_path):
    assert clnn.asarray(np.float32(3), device=dev).shape == ()
    assert clnn.asarray(2.5, device=dev).get() == 2.5
    net = nn.Sequential([nn.Dense(2)], in_features=3, device=dev)
    target = tmp_path / "real.npz"
    link = tmp_path / "link.npz"
    net.save(str(target))
    os.chmod(target, 0o640)
    os.symlink(target, link)
    net.save(str(link))
    assert os.path.islink(link) and stat.S_IMODE(os.stat(target).st_mode) == 0o640
    fresh = tmp_path / "fresh.npz"
    net.save(str(fresh))
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o666 & ~mask
    w = net.layers[0].weight.get()
    with pytest.raises(clnn.ArgumentError, match="already belongs"):
        nn.Sequential([net.layers[0]], in_features=3, device=dev)
    layer = nn.Dense(4)
    with pytest.raises(clnn.ArgumentError, match="already belongs"):
        nn.Sequential([layer, layer], in_features=4, device=dev)
    assert np.array_equal(net.layers[0].weight.get(), w)
