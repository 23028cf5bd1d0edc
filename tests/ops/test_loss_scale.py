"""Dynamic loss scaling on the device (clnn/kernels/optim.cl, clnn/ops/optim.py): the
state update against the host's GradScaler, SGD gated by it, the losses' gradients
scaled by a factor they read on the device, and bad arguments."""

import contextlib

import numpy as np
import pytest

import clnn
from clnn import nn
from clnn.ops import optim as optim_ops
from conftest import Guarded, guarded_input

RNG = np.random.default_rng(17)


def state_on(dev, scale, good=0, skipped=0):
    """A loss-scale state at an offset between canaries."""
    return Guarded(dev, (optim_ops.LOSS_SCALE_STATE,), np.float32,
                   fill=optim_ops.loss_scale_state(scale, good, skipped))


def gradients(n, bad_at=None, bad=np.nan):
    g = RNG.standard_normal(n).astype(np.float32) * 100
    if bad_at is not None:
        g[bad_at] = bad
    return g


@pytest.mark.parametrize("n", [1, 7, 4099, 100003])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_device_update_is_the_host_scalers(dev, n, dtype):
    """A run of steps, some with an inf or NaN (first, last or inside the gradients),
    through loss_scale_update and through GradScaler.update: the same S, S used, found,
    good and skipped counts after every step, and nothing written around the state;
    16-bit gradients (a mixed-precision step counts its own) as float32 ones."""
    dt = np.dtype(clnn.bfloat16 if dtype == "bfloat16" else dtype)
    host = nn.GradScaler(init_scale=2.0 ** 12, growth_interval=3)
    st = state_on(dev, host.scale)
    cases = [None, None, None, 0, None, n - 1, None, None, None, n // 2, None]
    bads = [np.nan, np.inf, -np.inf]
    for i, at in enumerate(cases):
        g = gradients(n, at, bads[i % 3])
        used = host.scale
        optim_ops.loss_scale_update(guarded_input(dev, g.astype(dt)), st.view,
                                    growth_interval=3)
        host.update(at is None)
        s, found, s_used, good, skipped = optim_ops.read_loss_scale_state(st.check())
        assert (s, found, s_used, good, skipped) == \
            (host.scale, at is not None, used, host.good_steps, host.skipped), i
    assert host.skipped == 3 and host.scale == 2.0 ** 11


@pytest.mark.parametrize("n", [1, 7, 9, 4099, 100003])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_gradients_cast_marks_what_the_count_finds(dev, n, dtype):
    """cast_gradients (a mixed-precision step's one pass over its 16-bit gradients):
    float32 exactly as the conversion gives, canaries around the output untouched; the
    state marked where any is an inf or NaN (first, last or inside: in the CPU loop's
    vectors of 8 and the elements after them), nothing else of it written; then
    loss_scale_update(None, state) updates as GradScaler.update does from that mark,
    and clears it."""
    dt = np.dtype(clnn.bfloat16 if dtype == "bfloat16" else dtype)
    host = nn.GradScaler(init_scale=2.0 ** 12, growth_interval=3)
    st = state_on(dev, host.scale)
    cases = [None, 0, None, n - 1, None, None, n // 2, None, None, None]
    bads = [np.nan, np.inf, -np.inf]
    for i, at in enumerate(cases):
        g = gradients(n, at, bads[i % 3]).astype(dt)
        out = Guarded(dev, (n,), np.float32)
        before = st.check().view(np.int32)
        optim_ops.cast_gradients(guarded_input(dev, g), out.view, st.view)
        assert np.array_equal(out.check(), g.astype(np.float32), equal_nan=True), i
        marked = st.check()
        assert marked[optim_ops.LS_MARK] == (0.0 if at is None else 1.0), i
        assert np.array_equal(marked.view(np.int32)[:optim_ops.LS_MARK],
                              before[:optim_ops.LS_MARK]), i
        used = host.scale
        optim_ops.loss_scale_update(None, st.view, growth_interval=3)
        host.update(at is None)
        after = st.check()
        assert optim_ops.read_loss_scale_state(after) == \
            (host.scale, at is not None, used, host.good_steps, host.skipped), i
        assert after[optim_ops.LS_MARK] == 0.0, i
    assert host.skipped == 3


@pytest.mark.parametrize("n", [1, 7, 9, 4099, 100003])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("groups", ["device", "gpu-like"])
def test_the_gradients_cast_applies_the_update_in_its_last_work_group(dev, n, dtype,
                                                                      groups):
    """cast_gradients with update=True (a float16 step's one launch for the cast, the
    check and the loss-scale update): the float32 gradients exactly, canaries around
    the output, the state and the count untouched; after every step the state and the
    count are GradScaler.update's (and the mark and the work-group count 0 again),
    whichever of the kernel's work-groups met the inf or NaN; with the device's launch
    and with 256-wide groups, up to 391 of them (a GPU's shape)."""
    from unittest import mock
    from clnn.ops import _args
    dt = np.dtype(clnn.bfloat16 if dtype == "bfloat16" else dtype)
    host = nn.GradScaler(init_scale=2.0 ** 12, growth_interval=3)
    st = state_on(dev, host.scale)
    count = Guarded(dev, (1,), np.int32, fill=[5])
    cases = [None, 0, None, n - 1, None, None, n // 2, None, None, None]
    bads = [np.nan, np.inf, -np.inf]
    gpu_like = (lambda d, m, wg=None: ((-(-m // 256) * 256,), (256,)))
    with mock.patch.object(_args, "launch_size", gpu_like) if groups == "gpu-like" \
            else contextlib.nullcontext():
        for i, at in enumerate(cases):
            g = gradients(n, at, bads[i % 3]).astype(dt)
            out = Guarded(dev, (n,), np.float32)
            used = host.scale
            optim_ops.cast_gradients(guarded_input(dev, g), out.view, st.view, update=True,
                                     count=count.view, growth_interval=3)
            host.update(at is None)
            assert np.array_equal(out.check(), g.astype(np.float32), equal_nan=True), i
            after = st.check()
            assert optim_ops.read_loss_scale_state(after) == \
                (host.scale, at is not None, used, host.good_steps, host.skipped), i
            assert after[optim_ops.LS_MARK] == 0.0 and after.view(np.int32)[6] == 0, i
            assert count.check()[0] == 5 + i + 1 - host.skipped, i
    assert host.skipped == 3


def test_the_gradients_cast_refuses_what_it_cannot_mark(dev):
    """Bad arguments to cast_gradients: a typed error, nothing written."""
    st = state_on(dev, 8.0)
    out = Guarded(dev, (5,), np.float32, fill=np.full(5, 3.0))
    g = clnn.asarray(np.full(5, np.inf, np.float16), device=dev)
    for args, err in (((clnn.asarray(np.ones(5, np.float32), device=dev), out.view, st.view),
                       clnn.DTypeError),
                      ((g, clnn.zeros((5,), np.float16, device=dev), st.view), clnn.DTypeError),
                      ((g, clnn.zeros((4,), device=dev), st.view), clnn.ShapeError),
                      ((g, out.view, clnn.zeros((5,), device=dev)), clnn.ShapeError),
                      ((g, out.view, np.zeros(6, np.float32)), clnn.ArgumentError)):
        with pytest.raises(err):
            optim_ops.cast_gradients(*args)
    whole = clnn.asarray(optim_ops.loss_scale_state(8.0), device=dev)
    with pytest.raises(clnn.ShapeError):            # out overlapping the state
        optim_ops.cast_gradients(clnn.asarray(np.ones(6, np.float16), device=dev), whole,
                                 whole)
    count = Guarded(dev, (1,), np.int32, fill=[4])
    for kw, err in ((dict(count=count.view), clnn.ArgumentError),   # a count: update's
                    (dict(update=True, growth_factor=1.0), clnn.ArgumentError),
                    (dict(update=True, backoff_factor=0.0), clnn.ArgumentError),
                    (dict(update=True, growth_interval=0), clnn.ArgumentError),
                    (dict(update=True, growth_interval=True), clnn.ArgumentError),
                    (dict(update=True, count=clnn.zeros((1,))), clnn.DTypeError),
                    (dict(update=True, count=st.view[:1].view(np.int32)), clnn.ShapeError)):
        with pytest.raises(err):
            optim_ops.cast_gradients(g, out.view, st.view, **kw)
    assert np.all(out.check() == 3.0)
    assert count.check()[0] == 4
    assert np.array_equal(st.check(), optim_ops.loss_scale_state(8.0))
    assert np.array_equal(whole.get(), optim_ops.loss_scale_state(8.0))


def test_growth_and_backoff_factors_other_than_two(dev):
    """Any factors, rounded to float32 as PyTorch's float32 scale is."""
    st = state_on(dev, 1000.0)
    g = clnn.asarray(gradients(5))
    optim_ops.loss_scale_update(g, st.view, growth_factor=1.5, growth_interval=1)
    assert st.check()[0] == np.float32(1500.0)
    optim_ops.loss_scale_update(clnn.asarray(gradients(5, 2)), st.view, backoff_factor=0.3,
                                growth_interval=1)
    assert st.check()[0] == np.float32(np.float32(1500.0) * np.float32(0.3))


@pytest.mark.parametrize("scale", [2.0 ** 11, 3.0])
@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.9, True, 1e-2)])
def test_gated_sgd_skips_or_unscales(dev, scale, momentum, nesterov, wd):
    """Gated by a state that marks the step found, SGD changes neither weights nor
    momentum; else it is the plain step with grad_scale / S (bitwise for a power of
    two S, whose division is exact)."""
    n = 1031
    w0, b0 = (RNG.standard_normal(n).astype(np.float32) for _ in range(2))
    g = gradients(n)
    kw = dict(lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    # found: nothing changes (canaries around every array)
    st = state_on(dev, scale)
    optim_ops.loss_scale_update(clnn.asarray(gradients(9, 4)), st.view)
    w, b = Guarded(dev, (n,), np.float32, fill=w0), Guarded(dev, (n,), np.float32, fill=b0)
    clnn.sgd_step(w.view, guarded_input(dev, g), b.view, grad_scale=0.25, gate=st.view,
                  **kw)
    assert np.array_equal(w.check(), w0) and np.array_equal(b.check(), b0)
    # finite: the plain step's grad_scale divided by the S used
    st = state_on(dev, scale)
    optim_ops.loss_scale_update(clnn.asarray(g), st.view)
    w, b = Guarded(dev, (n,), np.float32, fill=w0), Guarded(dev, (n,), np.float32, fill=b0)
    clnn.sgd_step(w.view, guarded_input(dev, g), b.view, grad_scale=0.25, gate=st.view,
                  **kw)
    wr, br = clnn.asarray(w0), clnn.asarray(b0)
    clnn.sgd_step(wr, clnn.asarray(g), br, grad_scale=float(np.float32(0.25) /
                                                            np.float32(scale)), **kw)
    if scale == 2.0 ** 11:
        assert np.array_equal(w.check(), wr.get()) and np.array_equal(b.check(), br.get())
    else:
        np.testing.assert_allclose(w.check(), wr.get(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(b.check(), br.get(), rtol=1e-6, atol=1e-7)
    assert not np.array_equal(w.check(), w0)


@pytest.mark.parametrize("betas,wd,decoupled", [((0.9, 0.999), 0.0, False),
                                                ((0.0, 0.5), 1e-2, True)])
def test_gated_adam_counts_its_steps_on_the_device(dev, betas, wd, decoupled):
    """Gated Adam: a skipped step changes neither weights, moments nor the count; the
    others count t on the device and match Adam's step t with grad_scale / S, to the
    rounding of the bias corrections computed in float32 there."""
    n = 517
    w0 = RNG.standard_normal(n).astype(np.float32)
    kw = dict(lr=1e-2, betas=betas, weight_decay=wd, decoupled=decoupled)
    st = state_on(dev, 2.0 ** 9)
    count = Guarded(dev, (1,), np.int32, fill=[0])
    w, m, v = (Guarded(dev, (n,), np.float32, fill=f)
               for f in (w0, np.zeros(n), np.zeros(n)))
    wr, mr, vr = clnn.asarray(w0), clnn.zeros((n,)), clnn.zeros((n,))
    t = 0
    for i, bad_at in enumerate([None, None, 3, None, n - 1, None]):
        g = gradients(n, bad_at)
        optim_ops.loss_scale_update(clnn.asarray(g), st.view, count=count.view,
                                    growth_interval=2)
        used = optim_ops.read_loss_scale_state(st.check())[2]
        before = w.check().copy(), m.check().copy(), v.check().copy()
        clnn.adam_step(w.view, guarded_input(dev, g), m.view, v.view, step=count.view,
                       grad_scale=0.5, gate=st.view, **kw)
        if bad_at is not None:
            assert all(np.array_equal(x.check(), y) for x, y in zip((w, m, v), before))
            assert count.check()[0] == t
            continue
        t += 1
        assert count.check()[0] == t
        clnn.adam_step(wr, clnn.asarray(g), mr, vr, step=t, grad_scale=0.5 / used, **kw)
        for got, ref in ((w, wr), (m, mr), (v, vr)):
            np.testing.assert_allclose(got.check(), ref.get(), rtol=2e-6, atol=1e-7)
    assert t == 4


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("loss", ["quadratic", "cross_entropy"])
def test_losses_scale_their_gradient_by_a_device_factor(dev, loss, dtype, kernels):
    """scale_by[0] multiplies the gradient inside the kernel (before it is rounded to
    the storage type: bitwise the gradient with grad_scale times a power-of-two S);
    the loss is unchanged."""
    shape = (37, 10)
    a = RNG.standard_normal(shape).astype(dtype)
    y = np.eye(10, dtype=dtype)[RNG.integers(0, 10, 37)]
    fn = clnn.quadratic_loss if loss == "quadratic" else clnn.softmax_cross_entropy
    S = 2.0 ** 13
    sb = Guarded(dev, (3,), np.float32, fill=[S, 5.0, 7.0])
    out = Guarded(dev, shape, dtype)
    kw = {"da" if loss == "quadratic" else "dz": out.view}
    lv, _ = fn(guarded_input(dev, a), guarded_input(dev, y), grad_scale=1 / 37,
               scale_by=sb.view, **kw)
    ref_l, ref_g = fn(clnn.asarray(a), clnn.asarray(y), grad_scale=S / 37)
    assert np.array_equal(out.check(), ref_g.get())
    assert float(lv.get()) == float(ref_l.get())
    assert np.array_equal(sb.check(), np.float32([S, 5, 7]))


def test_bad_states_and_gates_change_nothing(dev):
    w = Guarded(dev, (4,), np.float32, fill=np.ones(4))
    b, g = clnn.zeros((4,)), clnn.asarray(np.ones(4, np.float32))
    st = state_on(dev, 8.0)
    for bad, err in ((clnn.zeros((4,)), clnn.ShapeError),
                     (clnn.zeros((5,), np.float64), clnn.DTypeError),
                     (np.zeros(5, np.float32), clnn.ArgumentError)):
        with pytest.raises(err):
            clnn.sgd_step(w.view, g, b, lr=0.1, gate=bad)
        with pytest.raises(err):
            optim_ops.loss_scale_update(g, bad)
    with pytest.raises(clnn.DTypeError):
        optim_ops.loss_scale_update(clnn.zeros((4,), np.float64), st.view)
    for kw in (dict(growth_factor=1.0), dict(backoff_factor=1.0), dict(growth_interval=0),
               dict(growth_factor=float("inf"))):
        with pytest.raises(clnn.ArgumentError):
            optim_ops.loss_scale_update(g, st.view, **kw)
    with pytest.raises(clnn.ArgumentError):      # gated steps count on the device
        clnn.optim.Adam().step([w.view], [g], gate=st.view)
    with pytest.raises(clnn.ShapeError):
        clnn.adam_step(w.view, g, b, clnn.zeros((4,)),
                       step=clnn.asarray(np.zeros(2, np.int32)), gate=st.view)
    with pytest.raises(clnn.ArgumentError):
        clnn.adam_step(w.view, g, b, clnn.zeros((4,)),
                       step=clnn.asarray(np.zeros(1, np.int32)), gate=st.view,
                       betas=(1.0, 0.5))
    for bad, err in ((clnn.zeros((1,), np.float64), clnn.DTypeError),
                     (clnn.zeros((0,)), clnn.ShapeError)):
        with pytest.raises(err):
            clnn.softmax_cross_entropy(clnn.zeros((2, 3)), clnn.zeros((2, 3)),
                                       dz=w.view[:0], scale_by=bad)
    assert np.all(w.check() == 1)
    assert np.array_equal(st.check(), optim_ops.loss_scale_state(8.0))
