"""Launch plans per call shape (clnn/ops/_memo.py): from the third call with the same
shapes, layouts and settings an op enqueues the launches it planned, with the new
call's buffers; every result must be the op's own, every check must still hold."""

import sys

import numpy as np
import pytest

import clnn
from clnn import programs, tuning
from clnn.ops import _memo
from conftest import Guarded, assert_close
from reference import conv2d_backward_ref, conv2d_ref
from test_reliability import failing

RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def _fresh():
    clnn.clear_caches()
    yield


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


class Kernels:
    """How many kernels the block chose in Python (programs.get_kernel calls)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = programs.get_kernel

        def counting(*a, **k):
            self.calls += 1
            return real(*a, **k)
        monkeypatch.setattr(programs, "get_kernel", counting)


def _conv_case(dev, x, w, dy, b, stride, padding):
    X, W, DY, B = (clnn.asarray(v, device=dev) for v in (x, w, dy, b))
    y = clnn.conv2d(X, W, B, stride=stride, padding=padding, activation="tanh")
    dx = clnn.conv2d_backward_data(DY, W, x.shape, stride=stride, padding=padding)
    dw = clnn.conv2d_backward_weight(DY, X, w.shape, stride=stride, padding=padding)
    return y.get(), dx.get(), dw.get()


@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1)])
def test_planned_convolutions_compute_each_calls_arrays(dev, monkeypatch, stride, padding):
    """Five calls of the forward pass and both gradients, new arrays each time: the
    third and later enqueue the plan (no kernel chosen in Python) and give what the
    float64 loops give for their own inputs."""
    N, C, H, Wd, M, R = 3, 2, 11, 7, 5, 3
    P, Q = (H + 2 * padding - R) // stride + 1, (Wd + 2 * padding - R) // stride + 1
    kernels = Kernels(monkeypatch)
    for call in range(5):
        x, w, dy, b = _f32(N, C, H, Wd), _f32(M, C, R, R), _f32(N, M, P, Q), _f32(M)
        chosen = kernels.calls
        y, dx, dw = _conv_case(dev, x, w, dy, b, stride, padding)
        if call >= 2:
            assert kernels.calls == chosen, "a planned call chose kernels"
        st, pd = (stride, stride), (padding, padding)
        ref = np.tanh(conv2d_ref(x, w, b, st, pd))
        rdx, rdw = conv2d_backward_ref(dy, x, w, st, pd)
        assert_close(y, ref, np.float32, k=C * R * R)
        assert_close(dx, rdx, np.float32, k=M * R * R)
        assert_close(dw, rdw, np.float32, k=N * P * Q, scale=np.abs(rdw).max() + 1)


def test_a_planned_gemm_writes_only_its_output_and_honours_offsets(dev):
    """out at an offset inside canaries, operands at offsets, bias, alpha and beta: the
    planned calls write the view alone and compute with the new call's values."""
    for call in range(4):
        a, b, c0, bias = _f32(13, 7), _f32(11, 7), _f32(13, 11), _f32(11)
        A, Bm = (Guarded(dev, v.shape, np.float32, fill=v).view for v in (a, b))
        out = Guarded(dev, c0.shape, np.float32, fill=c0)
        r = clnn.gemm(A, Bm, out.view, alpha=0.5, beta=-2.0, trans_b=True,
                      bias=clnn.asarray(bias, device=dev))
        assert r is out.view
        ref = 0.5 * a.astype(np.float64) @ b.T - 2.0 * c0 + bias
        assert_close(out.check(), ref, np.float32, k=7)


def test_a_plan_never_serves_another_layout_or_setting(dev):
    """What the key holds: an offset, a zero's sign, a shared buffer; each call with
    one of them changed computes its own result."""
    a, b = _f32(6, 5), _f32(5, 4)
    A, Bm = clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)
    for _ in range(3):
        clnn.gemm(A, Bm, alpha=0.0)
    keys = len(_memo._plans)
    clnn.gemm(A, Bm, alpha=-0.0)              # equal as floats, not as arguments
    assert len(_memo._plans) == keys + 1
    big = clnn.asarray(np.concatenate([np.zeros(3, np.float32), a.ravel()]), device=dev)
    shifted = big[3:].reshape(6, 5)
    for _ in range(3):
        assert_close(clnn.gemm(shifted, Bm).get(), a.astype(np.float64) @ b, np.float32, k=5)
    # an out that overlaps an input: planned calls with separate buffers must not
    # let it through
    sq = clnn.asarray(_f32(4, 4), device=dev)
    for _ in range(3):
        clnn.gemm(sq, clnn.asarray(_f32(4, 4), device=dev), clnn.empty((4, 4), np.float32, dev))
    with pytest.raises(clnn.ShapeError):
        clnn.gemm(sq, clnn.asarray(_f32(4, 4), device=dev), sq)


def test_bad_input_after_planning_gets_the_ops_error(dev):
    x = clnn.asarray(_f32(2, 3, 8, 8), device=dev)
    w = clnn.asarray(_f32(4, 3, 3, 3), device=dev)
    for _ in range(3):
        clnn.conv2d(x, w)
    with pytest.raises(clnn.ShapeError):
        clnn.conv2d(x, clnn.asarray(_f32(4, 2, 3, 3), device=dev))
    with pytest.raises(clnn.DTypeError):
        clnn.conv2d(x, clnn.asarray(_f32(4, 3, 3, 3).astype(np.float64), device=dev))
    with pytest.raises(clnn.ArgumentError):
        clnn.conv2d(x, w, activation="nope")
    with pytest.raises(clnn.ArgumentError):
        clnn.conv2d(x, w, activation="leaky_relu", activation_param=float("nan"))


def test_a_changed_setting_makes_a_new_plan(dev, monkeypatch):
    """A module setting patched between calls (as tests force kernel paths) is never
    served by a plan made before: softmax's choice between a work-item and a work-group
    per row, patched to the other one (on every device: a CPU or a short row takes a
    work-item, a GPU's long row a group), launches the other kernel."""
    softmax_module = sys.modules["clnn.ops.softmax"]
    x = _f32(5, 40)
    X = clnn.asarray(x, device=dev)
    for _ in range(3):
        clnn.softmax(X)
    with clnn.profile() as before:
        clnn.softmax(X)
    chosen = softmax_module.row_groups

    def other(d, rows, cols):
        return None if chosen(d, rows, cols) else ((64 * rows,), (64,))
    monkeypatch.setattr(softmax_module, "row_groups", other)
    with clnn.profile() as after:
        got = clnn.softmax(X).get()
    entries = [[r.entry for r in p.records] for p in (before, after)]
    assert len(entries[0]) == len(entries[1]) == 1 and entries[0] != entries[1], entries
    e = np.exp(x - x.max(axis=1, keepdims=True).astype(np.float64))
    assert_close(got, e / e.sum(axis=1, keepdims=True), np.float32, k=40)


def test_fresh_scalars_leave_the_other_plans_alone(dev, monkeypatch):
    """An op called with a new scalar every time (an lr schedule through scale) adds a
    key a call: the table gives up its least recently used keys for them, never the
    plan of an op that runs between them."""
    monkeypatch.setattr(_memo, "PLANS", 8)
    a, b = _f32(9, 8), _f32(8, 7)
    A, Bm = clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)
    x = clnn.asarray(_f32(5), device=dev)
    for _ in range(3):
        out = clnn.gemm(A, Bm)
    key = next(k for k in _memo._plans if k[0] is clnn.gemm)
    plan = _memo._plans[key]
    assert isinstance(plan, _memo._Plan)
    for i in range(40):
        y = clnn.scale(1.0 + i / 64, x)
        out = clnn.gemm(A, Bm)
        assert _memo._plans.get(key) is plan and len(_memo._plans) <= 8, i
    assert_close(y.get(), (1.0 + 39 / 64) * x.get().astype(np.float64), np.float32, k=1)
    assert_close(out.get(), a.astype(np.float64) @ b, np.float32, k=8)


def test_overrides_and_precision_are_part_of_the_plan(dev):
    a, b = _f32(9, 8), _f32(8, 7)
    A, Bm = clnn.asarray(a, device=dev), clnn.asarray(b, device=dev)
    for _ in range(3):
        clnn.gemm(A, Bm)
    row = dict(tuning.GEMM_TABLE["type"]["GPU"])
    with tuning.override("gemm", row), clnn.profile() as prof:
        clnn.gemm(A, Bm)
    assert any(r.entry == "clnn_gemm_tiled" for r in prof.records)
    key = next(k for k in _memo._plans if k[0] is clnn.gemm)
    assert _memo.settings(dev)[2] == tuning.get_float32_matmul_precision() and \
        key[2] == _memo.settings(dev)


def test_a_failed_allocation_in_a_planned_call_writes_nothing(dev):
    """The plan asks for all its buffers before its first launch: an allocation that
    fails leaves the output as it was, and raises the pool's error. (A weight gradient
    whose K, 8 images of 16 x 16, is long for its 4 x 27 output: split along K on a GPU,
    its columns packed on a CPU; either asks the pool for workspace.)"""
    x = clnn.asarray(_f32(8, 3, 18, 18), device=dev)
    dy = clnn.asarray(_f32(8, 4, 16, 16), device=dev)
    out = clnn.asarray(np.full((4, 3, 3, 3), 7, np.float32), device=dev)
    for _ in range(3):
        clnn.conv2d_backward_weight(dy, x, (4, 3, 3, 3), out=out)
    out.fill(7)
    with failing(dev.pool) as counter:
        clnn.conv2d_backward_weight(dy, x, (4, 3, 3, 3), out=out)
    assert counter.count > 0
    out.fill(7)
    for at in range(counter.count):
        with failing(dev.pool, at), pytest.raises(clnn.OutOfDeviceMemory):
            clnn.conv2d_backward_weight(dy, x, (4, 3, 3, 3), out=out)
        assert np.all(out.get() == 7)


def test_planned_calls_are_captured_like_any_launch(dev):
    """A planned call inside programs.captured() (a training step's capture) is
    recorded, and the capture's replay repeats it."""
    x = clnn.asarray(_f32(2, 3, 8, 8), device=dev)
    w = clnn.asarray(_f32(4, 3, 3, 3), device=dev)
    out = clnn.empty((2, 4, 6, 6), np.float32, dev)
    for _ in range(3):
        clnn.max_pool2d(clnn.conv2d(x, w, out=out), 2)
    with programs.captured() as launches:
        y = clnn.max_pool2d(clnn.conv2d(x, w, out=out), 2)
    assert launches
    want = y.get()
    x.set(_f32(2, 3, 8, 8))
    programs.replay(launches)
    ref = conv2d_ref(x.get(), w.get(), None, (1, 1), (0, 0)).reshape(2, 4, 3, 2, 3, 2).max(axis=(3, 5))
    assert_close(y.get(), ref, np.float32, k=27)
    assert not np.array_equal(y.get(), want)


def test_unbatched_and_pooled_results_keep_their_shapes(dev):
    x = _f32(3, 10, 10)
    X = clnn.asarray(x, device=dev)
    w = clnn.asarray(_f32(2, 3, 3, 3), device=dev)
    for _ in range(4):
        y = clnn.conv2d(X, w)
        p = clnn.avg_pool2d(y, 2)
        assert y.shape == (2, 8, 8) and p.shape == (2, 4, 4)
        ref = conv2d_ref(x[None], w.get(), None, (1, 1), (0, 0))[0]
        assert_close(y.get(), ref, np.float32, k=27)
        assert_close(p.get(), ref.reshape(2, 4, 2, 4, 2).mean(axis=(2, 4)), np.float32, k=27)


def test_planned_batch_norm_and_bias_gradients_match_their_ops(dev):
    """batch_norm in training (its running statistics moved in place by every call),
    its backward pass with and without weight (None for the missing gradients) and
    bias_grad: planned calls give bitwise what the ops give unplanned, call after call,
    on new arrays."""
    C = 3
    stats = [[clnn.zeros((C,), np.float32, dev), clnn.asarray(np.ones(C, np.float32),
                                                              device=dev)] for _ in range(2)]
    for call in range(4):
        x, dy = _f32(4, C, 5, 6), _f32(4, C, 5, 6)
        w, b = _f32(C), _f32(C)
        X, DY, W, B = (clnn.asarray(v, device=dev) for v in (x, dy, w, b))
        got = []
        for op, (rm, rv) in ((clnn.batch_norm, stats[0]),
                             (clnn.batch_norm.unplanned, stats[1])):
            save = clnn.empty((2, C), np.float32, dev)
            y = op(X, rm, rv, W, B, training=True, save=save, activation="relu")
            got.append([y.get(), save.get(), rm.get(), rv.get()])
        for a, b_ in zip(*got):
            assert a.tobytes() == b_.tobytes()
        save = clnn.empty((2, C), np.float32, dev)
        clnn.batch_norm.unplanned(X, weight=W, bias=B, training=True, save=save)
        for weight in (W, None):
            planned = clnn.batch_norm_backward(DY, X, save, weight)
            plain = clnn.batch_norm_backward.unplanned(DY, X, save, weight)
            for a, b_ in zip(planned, plain):
                assert (a is None and b_ is None) or a.get().tobytes() == b_.get().tobytes()
        assert clnn.bias_grad(DY).get().tobytes() == \
            clnn.bias_grad.unplanned(DY).get().tobytes()
    assert any(isinstance(p, _memo._Plan) and len(p.results) == 3 and
               p.results[1] == (None, None) for p in _memo._plans.values())


def test_planned_reductions_softmax_and_element_wise_ops_match_their_ops(dev):
    """The single-launch ops are planned too (their Python was most of a call: a sum
    along rows 19 -> 8 us): each gives bitwise what it gives unplanned, call after call
    on new arrays, through every path its Python takes (two-stage sums, tuple axes
    with an intermediate array, keepdims, NaN means of nothing, a copy for no axes,
    results in place, into out, and axpy's y)."""
    ops = [
        ("sum rows", lambda x, y: clnn.sum(x, axis=1)),
        ("sum all (two stages)", lambda x, y: clnn.sum(x)),
        ("sum of a tuple of axes", lambda x, y: clnn.sum(x.reshape(37, 3, 100), axis=(0, 2))),
        ("mean keepdims", lambda x, y: clnn.mean(x, axis=0, keepdims=True)),
        ("mean of nothing", lambda x, y: clnn.mean(x[:0], axis=0)),
        ("sum over no axes", lambda x, y: clnn.sum(x, axis=())),
        ("max", lambda x, y: clnn.max(x, axis=-1)),
        ("dot", lambda x, y: clnn.dot(x, y)),
        ("nrm2", lambda x, y: clnn.nrm2(x)),
        ("softmax", lambda x, y: clnn.softmax(x)),
        ("log_softmax in place", lambda x, y: clnn.log_softmax(x, axis=0, out=x)),
        ("relu", lambda x, y: clnn.relu(x)),
        ("elu into out", lambda x, y: clnn.elu(x, alpha=0.5, out=y)),
        ("tanh backward in place", lambda x, y: clnn.activation_backward("tanh", x, a=y,
                                                                          out=y)),
        ("sigmoid derivative", lambda x, y: clnn.activation_derivative("sigmoid", z=x)),
        ("hadamard", lambda x, y: clnn.hadamard(x, y)),
        ("axpy on y", lambda x, y: clnn.axpy(-0.5, x, y)),
        ("scale in place", lambda x, y: clnn.scale(3.0, x, out=x)),
        ("bias_add", lambda x, y: clnn.bias_add(x, y[0])),
    ]
    for name, op in ops:
        for call in range(4):
            x, y = _f32(37, 300), _f32(37, 300)
            results = []
            for planned in (True, False):
                X, Y = clnn.asarray(x, device=dev), clnn.asarray(y, device=dev)
                if planned:
                    r = op(X, Y)
                else:
                    with tuning.override("none", {}):     # nothing is planned under one
                        r = op(X, Y)
                results.append((r.shape, r.get().tobytes(), X.get().tobytes(),
                                Y.get().tobytes()))
            assert results[0] == results[1], (name, call)
    planned = [p for p in _memo._plans.values() if isinstance(p, _memo._Plan)]
    assert len(planned) >= len(ops), len(planned)
