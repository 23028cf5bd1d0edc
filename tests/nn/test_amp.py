"""Mixed-precision training (clnn/nn/amp.py): float16 and bfloat16 steps against float32
steps and a float64 reference, dynamic loss scaling (skip and back off on overflow, grow
after good steps; none for bfloat16), checkpoints that resume the scale, halved
activation memory, bad arguments."""

import sys

import numpy as np
import pyopencl.array as cla
import pytest

import clnn
from clnn import nn, optim

RNG = np.random.default_rng(2024)


def mlp(seed=0, dtype=np.float32, first="relu"):
    return nn.Sequential([nn.Dense(24, first), nn.Dense(16, "relu"), nn.Dense(5, "softmax")],
                         in_features=13, seed=seed, dtype=dtype)


def smooth_mlp(seed=0):
    return nn.Sequential([nn.Dense(24, "tanh"), nn.Dense(16, "tanh"), nn.Dense(5, "softmax")],
                         in_features=13, seed=seed)


def lenet_like(seed=0):
    return nn.Sequential([nn.Conv2d(4, 3, activation="tanh"),
                          nn.BatchNorm2d(4, activation="tanh"), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Dropout(0.2), nn.Dense(6, "softmax")], in_shape=(2, 9, 9),
                         seed=seed)


def data(n=64, shape=(13,), classes=5, rng=None):
    rng = rng or RNG
    x = rng.standard_normal((n,) + shape).astype(np.float32)
    y = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, n)]
    return x, y


def test_grad_scaler_backs_off_and_grows():
    s = nn.GradScaler(init_scale=8.0, growth_interval=3)
    for finite, scale in [(True, 8), (True, 8), (True, 16), (False, 8), (True, 8),
                          (False, 4), (True, 4), (True, 4), (True, 8)]:
        s.update(finite)
        assert s.scale == scale
    assert s.skipped == 2
    for bad in (dict(init_scale=0), dict(growth_factor=1.0), dict(backoff_factor=1.0),
                dict(growth_interval=0), dict(init_scale=float("inf"))):
        with pytest.raises(clnn.ArgumentError):
            nn.GradScaler(**bad)


# How far a 16-bit step's update may stray from float32's, relative to the largest
# update (the first step's, and after three: momentum compounds the differences), and
# its loss from float32's. Measured over data from 8 seeds, the worst differences of
# the updates were, float16 / bfloat16: the MLP 6e-4 / 8e-3; the convolution, BatchNorm
# and Dropout net 4.1e-2 / 1.3e-1 (BatchNorm's sums over 32 x 49 half-stored values of
# its gradient cancel, and its statistics normalise what rounding moved); the bounds
# are twice those. (One bound of 2e-3 for both nets, in float16, held only for the data
# that one test name's seed drew.)
STEP_TOL = {("mlp", "float16"): 2e-3, ("mlp", "bfloat16"): 2e-2,
            ("conv-bn-dropout", "float16"): 8e-2, ("conv-bn-dropout", "bfloat16"): 2.5e-1}
LOSS_TOL = {"float16": 5e-3, "bfloat16": 4e-2}


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("make,shape", [(smooth_mlp, (13,)), (lenet_like, (2, 9, 9))],
                         ids=["mlp", "conv-bn-dropout"])
def test_a_16_bit_step_is_the_float32_step_to_its_precision(make, shape, precision):
    """The same step from the same weights in float32 and in float16 (scaled loss,
    float16 activations and weight copies, float32 masters): updates agree to within
    what half storage allows, and the masters stay float32. Smooth activations away
    from saturation: a relu whose input rounds across 0 in half, or a saturated tanh's
    derivative 1 - a^2 from its half output, moves a gradient by far more than half's
    precision (in PyTorch's autocast too), which would hide a real error. The scale
    starts where the float16 gradients, S times the batch mean's, fit; bfloat16 takes
    no scale (its gradients are the batch mean's) and its tolerance is its 8 times
    coarser epsilon's."""
    x, y = data(32, shape, 5 if make is smooth_mlp else 6)
    x *= 0.3
    a, b = make(), make()
    for net in (a, b):
        net.optimizer = optim.SGD(lr=0.1, momentum=0.9)
    b.scaler = nn.GradScaler(init_scale=2.0 ** 10)
    start = a.flat_parameters.get()
    xd, yd = clnn.asarray(x), clnn.asarray(y)
    for step in range(3):
        la = a.train_step(xd, yd, loss="cross_entropy")
        lb = b.train_step(xd, yd, loss="cross_entropy", precision=precision)
        assert lb.dtype == np.float32
        assert abs(float(la.get()) - float(lb.get())) < \
            LOSS_TOL[precision] * max(1, abs(float(la.get())))
        da, db = a.flat_parameters.get() - start, b.flat_parameters.get() - start
        # half storage keeps about 3 significant digits of every activation and
        # gradient, bfloat16 about 2
        tol = STEP_TOL["mlp" if make is smooth_mlp else "conv-bn-dropout", precision]
        assert np.abs(da - db).max() <= tol * np.abs(da).max(), step
    assert b.flat_parameters.dtype == np.float32 and b.layers[0].weight.dtype == np.float32
    assert b.scaler.skipped == 0 and b.scaler.scale == 2.0 ** 10
    assert b._half.dtype == np.dtype(precision)


def test_overflow_skips_the_step_and_halves_the_scale():
    net = mlp()
    net.optimizer = optim.SGD(lr=0.1, momentum=0.9)
    net.scaler = nn.GradScaler(init_scale=2.0 ** 40)     # half gradients overflow
    # data of its own: with the module's generator the batches depended on which tests
    # ran before in the same process (pytest-xdist deals them out), and on some the
    # scale settled an epoch later
    x, y = data(16, rng=np.random.default_rng(3))
    before = net.flat_parameters.get()
    net.train_step(clnn.asarray(x), clnn.asarray(y), loss="cross_entropy",
                   precision="float16")
    assert np.array_equal(net.flat_parameters.get(), before)     # nothing changed
    assert net.scaler.skipped == 1 and net.scaler.scale == 2.0 ** 39
    # fit backs off until the scale fits (gradients S times the batch mean's, stored
    # in half: below 65504), counts the skipped steps, then trains. Its shuffles are
    # seeded: unseeded, about one run in twelve overflowed once more in the last epoch
    # (the scale grows back after a run of good steps)
    hist = net.fit(x, y, "cross_entropy", epochs=10, batch_size=4, precision="float16",
                   progress=False, seed=0)
    assert 15 <= sum(hist["skipped_steps"]) < 40 and hist["loss_scale"][-1] < 2.0 ** 20
    assert hist["skipped_steps"][-1] == 0
    assert not np.array_equal(net.flat_parameters.get(), before)
    assert np.all(np.isfinite(net.flat_parameters.get()))


def test_fit_in_float16_learns_as_float32():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 13)).astype(np.float32)
    w = rng.standard_normal((13, 5))
    y = np.eye(5, dtype=np.float32)[(x @ w).argmax(1)]          # a learnable rule
    acc = {}
    for precision in ("float32", "float16", "bfloat16"):
        net = mlp(seed=3)
        hist = net.fit(x[:200], y[:200], "cross_entropy", epochs=30, batch_size=20,
                       lr=0.05, momentum=0.9, precision=precision, progress=False, seed=1)
        acc[precision] = net.evaluate(x[200:], y[200:], "cross_entropy",
                                      precision=precision)[1]
        # bfloat16 scales no loss: no scaler, nothing skipped or recorded
        assert ("skipped_steps" in hist) == (precision == "float16")
        assert (net.scaler is None) == (precision != "float16")
    assert acc["float32"] > 0.6, acc
    assert acc["float16"] >= acc["float32"] - 0.05, acc
    assert acc["bfloat16"] >= acc["float32"] - 0.05, acc


def test_activation_memory_halves():
    net = lenet_like()
    x, y = data(8, (2, 9, 9), 6)
    net.train_step(clnn.asarray(x), clnn.asarray(y), loss="cross_entropy")
    full = net.workspace_bytes("float32")
    net.train_step(clnn.asarray(x), clnn.asarray(y), loss="cross_entropy",
                   precision="float16")
    assert net.workspace_bytes("float16") * 2 == full
    net.train_step(clnn.asarray(x), clnn.asarray(y), loss="cross_entropy",
                   precision="bfloat16")
    assert net.workspace_bytes() * 2 == full and net._train[8, "bfloat16"].a[0].dtype == \
        clnn.bfloat16


def test_evaluate_in_float16_is_the_float64_forward_of_half_values():
    """evaluate(precision="float16") runs the float16 weight copy on float16 inputs:
    the float64 forward pass of the half-rounded weights and inputs, to float16's
    rounding of each stored activation; accuracy as float32's but for near-ties."""
    net = mlp(seed=4, first="tanh")
    x, y = data(37)
    loss16, acc16 = net.evaluate(x, y, "cross_entropy", batch_size=10,
                                 precision="float16")
    loss32, acc32 = net.evaluate(x, y, "cross_entropy", batch_size=10)
    h = x.astype(np.float16).astype(np.float64)
    for layer in net.layers:
        w = layer.weight.get().astype(np.float16).astype(np.float64)
        b = layer.bias.get().astype(np.float16).astype(np.float64)
        z = h @ w.T + b
        if layer.activation == "softmax":
            break
        h = np.tanh(z) if layer.activation == "tanh" else np.maximum(z, 0)
        h = h.astype(np.float16).astype(np.float64)       # stored in half
    z = z.astype(np.float16).astype(np.float64)           # the stored logits
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    ref = -(y * logp).sum() / len(x)
    assert abs(loss16 - ref) <= 2e-3 * (1 + abs(ref)), (loss16, ref)
    assert abs(loss16 - loss32) <= 2e-2 * (1 + abs(loss32)), (loss16, loss32)
    assert acc16 == (z.argmax(1) == y.argmax(1)).mean()
    # float32 device arrays are cast (and checked in half)
    same = net.evaluate(clnn.asarray(x), clnn.asarray(y), "cross_entropy", batch_size=10,
                        precision="float16")
    assert same == (loss16, acc16)
    big = x.copy()
    big[3, 2] = 1e5                    # finite in float32, inf in float16
    with pytest.raises(clnn.ArgumentError, match="NaN or infinite"):
        net.evaluate(clnn.asarray(big), clnn.asarray(y), "cross_entropy",
                     precision="float16")
    assert net.scaler is None          # evaluating creates no loss scale
    # the float32 masters were not touched
    assert all(p.dtype == np.float32 for p in net.parameters())


def test_fit_in_float16_halves_the_pool_peak(monkeypatch):
    """fit(precision="float16") keeps its data on the device in float16 and validates
    in float16 (as under autocast): the pool's peak over the fit, dominated by the
    data and the evaluation's activations, halves. (The convolution's float copy of a
    float16 input is bounded to CONVERT_BYTES, 1 MiB beside LeNet-5's 4 MiB input at
    batch 1000: scaled here to this network's 0.3 MiB.)"""
    import gc
    monkeypatch.setattr(sys.modules["clnn.ops.conv"], "CONVERT_BYTES", 1 << 16)
    dev = clnn.device()
    x, y = data(4000, (2, 9, 9), 6)
    grown = {}
    for precision in ("float32", "float16"):
        net = lenet_like(seed=1)
        gc.collect()
        dev.pool.free_held()
        dev.pool.reset_peak()
        before = dev.pool.stats()["real_bytes"]
        net.fit(x[:3000], y[:3000], "cross_entropy", epochs=1, batch_size=100,
                validation=(x[3000:], y[3000:]), precision=precision, progress=False)
        grown[precision] = dev.pool.stats()["peak_bytes"] - before
        del net
    # the float32 scratch of the convolutions (a float copy of a float16 input, packed
    # operands) is the same in both: a little over half
    assert grown["float16"] <= 0.6 * grown["float32"], grown


@pytest.mark.parametrize("make_opt", [None, lambda: optim.Adam(lr=1e-2)],
                         ids=["sgd", "adam"])
def test_checkpoint_resumes_the_scale_bitwise(tmp_path, make_opt):
    """Saved half-way through float16 training (the scale, its counts and Adam's t are
    on the device then: saving reads them back), loaded and trained on: bitwise the
    uninterrupted run, scale history and step count included."""
    x, y = data(48)
    kw = dict(epochs=4, batch_size=8, precision="float16", progress=False, seed=9)
    kw = dict(kw, optimizer=make_opt()) if make_opt is not None else \
        dict(kw, lr=0.1, momentum=0.9)
    whole = mlp(seed=5)
    whole.scaler = nn.GradScaler(init_scale=2.0 ** 20, growth_interval=4)
    whole.fit(x, y, "cross_entropy", **kw)
    half = mlp(seed=5)
    half.scaler = nn.GradScaler(init_scale=2.0 ** 20, growth_interval=4)
    if make_opt is not None:
        kw = dict(kw, optimizer=make_opt())
    half.fit(x, y, "cross_entropy", **dict(kw, epochs=2))
    path = half.save(str(tmp_path / "amp.npz"))
    again = nn.load(path)
    assert again.scaler.config() == half.scaler.config()
    assert again.optimizer.steps == half.optimizer.steps > 0
    # fit without optimizer= trains on with the loaded one (SGD or Adam)
    kw.pop("optimizer", None)
    again.fit(x, y, "cross_entropy", **dict(kw, initial_epoch=2))
    assert np.array_equal(again.flat_parameters.get(), whole.flat_parameters.get())
    assert again.scaler.config() == whole.scaler.config()
    assert again.optimizer.steps == whole.optimizer.steps == 24 - whole.scaler.skipped


def test_bad_precision():
    net = mlp()
    x, y = data(4)
    for bad in ("float8", "int8", np.float16, 16):
        with pytest.raises(clnn.ArgumentError, match="precision"):
            net.fit(x, y, "cross_entropy", precision=bad, progress=False)
    if clnn.device().facts.fp64:
        for p in ("float16", "bfloat16"):
            with pytest.raises(clnn.ArgumentError, match="float32 network"):
                mlp(dtype=np.float64).fit(x, y, "cross_entropy", precision=p,
                                          progress=False)


@pytest.mark.parametrize("make_opt", [lambda: optim.SGD(lr=0.1, momentum=0.9),
                                      lambda: optim.AdamW(lr=1e-2)], ids=["sgd", "adamw"])
def test_float16_steps_check_on_the_device_as_the_host_would(monkeypatch, make_opt):
    """Without a hook, a float16 step keeps its loss scale on the device: the loss
    kernel reads S there, and the overflow check, the skip and the new S are kernels,
    so the host reads nothing back during the steps. The same steps with a hook (which
    keeps the check on the host) give the same weights, optimizer state, step count
    and scale history, over overflows (S starts too large) and growth: bitwise with
    SGD, to float32's rounding of the bias corrections with AdamW (the device computes
    them from its count of the steps applied)."""
    x, y = data(16, rng=np.random.default_rng(5))
    xd, yd = clnn.asarray(x), clnn.asarray(y)
    nets = [mlp(), mlp()]
    for net in nets:
        net.optimizer = make_opt()
        net.scaler = nn.GradScaler(init_scale=2.0 ** 24, growth_interval=2)
    reads = []
    real_get = cla.Array.get
    for step in range(16):
        monkeypatch.setattr(cla.Array, "get", lambda a, *args, **kw: reads.append(a.shape)
                            or real_get(a, *args, **kw))
        nets[0].train_step(xd, yd, loss="cross_entropy", precision="float16")
        monkeypatch.setattr(cla.Array, "get", real_get)
        nets[1].train_step(xd, yd, loss="cross_entropy", precision="float16",
                           hook=lambda info: None)
    assert reads == []

    def same(a, b):
        if isinstance(nets[0].optimizer, optim.SGD):
            return np.array_equal(a.get(), b.get())
        return np.allclose(a.get(), b.get(), rtol=1e-5, atol=1e-6)

    assert nets[0].scaler.config() == nets[1].scaler.config()
    assert 2 <= nets[0].scaler.skipped < 12
    assert nets[0].optimizer.steps == nets[1].optimizer.steps == 16 - nets[0].scaler.skipped
    assert same(nets[0].flat_parameters, nets[1].flat_parameters)
    assert all(same(a, b) for a, b in zip(nets[0].optimizer.state[0],
                                          nets[1].optimizer.state[0]))
    # the host's scaler is the current one again after it was read: setting S there
    # goes to the device for the next step
    for net in nets:
        net.scaler.scale, net.scaler.good_steps = 2.0 ** 8, 0
        net.train_step(xd, yd, loss="cross_entropy", precision="float16")
    assert nets[0].scaler.config() == nets[1].scaler.config()
    assert nets[0].scaler.scale == 2.0 ** 8 and nets[0].scaler.good_steps == 1
    assert same(nets[0].flat_parameters, nets[1].flat_parameters)


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("make,shape,make_opt", [
    (mlp, (13,), lambda: optim.SGD(lr=0.1, momentum=0.9)),
    (lenet_like, (2, 9, 9), lambda: optim.Adam(lr=1e-2))], ids=["mlp-sgd", "lenet-adam"])
@pytest.mark.parametrize("replay", [True, False], ids=["replayed", "plain"])
def test_fit_keeps_the_16_bit_weights_in_the_optimizers_kernel(monkeypatch, precision,
                                                               make, shape, make_opt,
                                                               replay):
    """fit's mixed-precision steps cast the masters to 16 bits once an epoch: the
    optimizer's kernel writes the copy as it updates them, and the next step uses it.
    The weights, optimizer state, scale history and losses are bitwise those of fit
    with a cast every step, over overflows and skipped steps (S starts too large for
    float16), Dropout and BatchNorm; a callback that changes the masters between
    epochs is seen by the next epoch; and the casts of the masters are one an epoch."""
    x, y = data(40, shape, 6 if make is lenet_like else 5, rng=np.random.default_rng(8))

    def run(keep):
        net = make(seed=3)
        net.scaler = nn.GradScaler(init_scale=2.0 ** 30, growth_interval=3)

        def shrink(epoch, hist):             # the masters changed between epochs
            clnn.scale(0.5, net.flat_parameters, out=net.flat_parameters)
        casts = []
        real_step, real_copy = nn.Sequential.train_step, nn.Sequential._half_copy

        def step(self, *args, _half_epoch=None, **kw):
            return real_step(self, *args, _half_epoch=_half_epoch if keep else None, **kw)

        def copy(self, *args, **kw):
            casts.append(self.steps)
            return real_copy(self, *args, **kw)
        with monkeypatch.context() as m:
            m.setattr(nn.Sequential, "train_step", step)
            m.setattr(nn.Sequential, "_half_copy", copy)
            hist = net.fit(x, y, "cross_entropy", epochs=3, batch_size=8, seed=4,
                           optimizer=make_opt(), precision=precision, progress=False,
                           callback=shrink, replay=replay)
        return net, hist, casts

    kept, hist, casts = run(True)
    every, hist_every, casts_every = run(False)
    # (a replayed step casting every step does so inside its capture, out of sight)
    assert casts == [0, 5, 10] and casts_every == list(range(2 if replay else 15))
    assert hist["loss"] == hist_every["loss"]
    assert hist.get("skipped_steps") == hist_every.get("skipped_steps")
    if precision == "float16":
        assert sum(hist["skipped_steps"]) > 0 and kept.scaler.config() == every.scaler.config()
    assert np.array_equal(kept.flat_parameters.get(), every.flat_parameters.get())
    assert all(np.array_equal(a.get(), b.get())
               for a, b in zip(kept.optimizer.state[0], every.optimizer.state[0]))
    assert kept.optimizer.steps == every.optimizer.steps > 0
