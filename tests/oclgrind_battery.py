"""Small cases of clnn's ops, run by test_oclgrind.py inside Oclgrind.

Run as a script in a process whose OpenCL loader sees only Oclgrind; exits non-zero on
a wrong result. Oclgrind itself reports races and out-of-bounds accesses to its log.
Usage: python oclgrind_battery.py [ops|gemm|conv|engines|wgmma|bad]
"""

import os
import sys

import numpy as np

import clnn


def close(got, ref, tol=1e-5):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if not np.allclose(got, ref, rtol=tol, atol=tol):
        raise SystemExit(f"mismatch: max error {np.abs(got - ref).max()}")


def ops():
    """Element-wise, reductions, softmax and losses; then again with the GPUs'
    kernels (reductions, rows, gemv as work-groups; element-wise loops unrolled) forced;
    a few in bfloat16 both ways."""
    from clnn import tuning
    _ops()
    _bf16_ops()
    with tuning.override("reduce", {"wg": True}), tuning.override("rows", {"wg": True}), \
            tuning.override("elementwise", {"unroll": 4}):
        _ops()
        _bf16_ops()
        rng = np.random.default_rng(3)
        a = rng.standard_normal((37, 70)).astype(np.float32)
        v = rng.standard_normal(37).astype(np.float32)
        close(clnn.gemv(clnn.asarray(a), clnn.asarray(v), trans_a=True).get(), a.T @ v, 1e-4)
        wide = rng.standard_normal((3, 300)).astype(np.float32)
        close(clnn.softmax(clnn.asarray(wide)).get(),
              np.exp(wide) / np.exp(wide).sum(1, keepdims=True))
        close(clnn.sum(clnn.asarray(wide), axis=0).get(), wide.sum(0), 1e-4)
        cube = rng.standard_normal((3, 40, 5)).astype(np.float32)     # along axis 1
        close(clnn.softmax(clnn.asarray(cube), axis=1).get(),
              np.exp(cube) / np.exp(cube).sum(1, keepdims=True))


def _bf16_ops():
    """bfloat16 storage: its vector loads and stores (the reductions' rows, softmax's
    rows on CPUs), conversions both ways, a GEMM and a loss, against float64."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 300)).astype(clnn.bfloat16)
    x64 = x.astype(np.float64)
    X = clnn.asarray(x)
    close(clnn.tanh(X).get(), np.tanh(x64), 1e-2)
    close(clnn.sum(X, axis=1).get(), x64.sum(1), 5e-2)
    close(clnn.softmax(X).get(), np.exp(x64) / np.exp(x64).sum(1, keepdims=True), 1e-2)
    close(clnn.cast(clnn.cast(X, np.float32), clnn.bfloat16).get(), x64, 0)
    w = rng.standard_normal((300, 7)).astype(clnn.bfloat16)
    close(clnn.gemm(X, clnn.asarray(w)).get() / 20, x64 @ w.astype(np.float64) / 20, 1e-2)


def _ops():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 13)).astype(np.float32)
    y = rng.standard_normal((7, 13)).astype(np.float32)
    X, Y = clnn.asarray(x), clnn.asarray(y)
    close(clnn.tanh(X).get(), np.tanh(x))
    close(clnn.activation_backward("sigmoid", Y, a=clnn.sigmoid(X)).get(),
          y / (1 + np.exp(-x)) * (1 - 1 / (1 + np.exp(-x))))
    close(clnn.axpy(0.5, X, clnn.copy(Y)).get(), 0.5 * x + y)
    W, V = clnn.copy(X), clnn.copy(Y)
    clnn.sgd_step(W, Y, V, lr=0.5, momentum=0.9)
    close(V.get(), 1.9 * y)
    close(W.get(), x - 0.95 * y)
    W, M, V2 = clnn.copy(X), clnn.zeros((7, 13)), clnn.zeros((7, 13))
    clnn.adam_step(W, Y, M, V2, step=1, lr=0.01, weight_decay=0.1, decoupled=True)
    close(W.get(), x * (1 - 0.001) - 0.01 * y / (np.abs(y) + 1e-8), 1e-4)
    bad = np.array([1.0, np.inf, -np.inf, np.nan] * 1300, np.float32)
    assert clnn.count_nonfinite(clnn.asarray(bad)) == 3900
    # 16-bit storage counted on its bits, 8 elements at a time and a tail
    assert clnn.count_nonfinite(clnn.asarray(bad[:1203].astype(np.float16))) == 902
    _loss_scale(x, y)
    close(clnn.bias_add(X, clnn.asarray(x[0])).get(), x + x[0])
    close(clnn.bias_grad(X).get(), x.sum(0))
    # an activation's backward pass with its bias gradient: dense, and images whose
    # sums over H*W (10283 each) run in two chunks on the GPUs' kernel; in place
    for shape in ((7, 13), (2, 2, 91, 113)):
        d = rng.standard_normal(shape).astype(np.float32)
        a = np.abs(rng.standard_normal(shape)).astype(np.float32) * (d > 0)
        D = clnn.asarray(d)
        _, db = clnn.activation_bias_backward("relu", D, clnn.zeros(shape[1]), a=clnn.asarray(a),
                                              out=D)
        dz = d * (a > 0)
        close(D.get(), dz)
        close(db.get(), dz.sum((0,) + tuple(range(2, len(shape)))), 1e-4)
    long = rng.standard_normal(5003).astype(np.float32)
    close(clnn.sum(clnn.asarray(long)).get(), long.sum(), 1e-4)
    close(clnn.max(X, axis=1).get(), x.max(1))
    close(clnn.softmax(X).get(), np.exp(x) / np.exp(x).sum(1, keepdims=True))
    t = np.eye(13, dtype=np.float32)[[1, 5, 2, 0, 12, 3, 3]]
    loss, dz = clnn.softmax_cross_entropy(X, clnn.asarray(t))
    p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    close(dz.get(), (p - t) / 7)
    close(loss.get(), -(t * np.log(p)).sum() / 7)
    loss, da = clnn.quadratic_loss(X, Y)
    close(loss.get(), ((x - y) ** 2).sum() / 14, 1e-4)
    # a batch of 300 (work-items of the loss's one group take one or two rows each),
    # its mean loss and the gradient's column sums (each work-item's own rows, then a tree)
    zb = rng.standard_normal((300, 10)).astype(np.float32)
    tb = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 300)]
    db = clnn.zeros(10)
    loss, dz = clnn.softmax_cross_entropy(clnn.asarray(zb), clnn.asarray(tb), db=db)
    pb = np.exp(zb) / np.exp(zb).sum(1, keepdims=True)
    close(dz.get(), (pb - tb) / 300)
    close(db.get(), ((pb - tb) / 300).sum(0), 1e-4)
    close(loss.get(), -(tb * np.log(pb)).sum() / 300, 1e-4)
    loss, _ = clnn.quadratic_loss(clnn.asarray(zb), clnn.asarray(tb))
    close(loss.get(), ((zb - tb) ** 2).sum() / 600, 1e-4)
    # cross-entropy with class indices over (N, C, S), an ignored target, weights
    zz = rng.standard_normal((3, 4, 5)).astype(np.float32)
    tt = rng.integers(0, 4, (3, 5)).astype(np.int32)
    tt[1, 2] = -100
    ww = rng.uniform(0.5, 2, 4).astype(np.float32)
    loss, _ = clnn.cross_entropy(clnn.asarray(zz), clnn.asarray(tt), clnn.asarray(ww))
    lp = zz - zz.max(1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(1, keepdims=True))
    keep = tt != -100
    t0 = np.where(keep, tt, 0)
    nll = -np.take_along_axis(lp, t0[:, None], 1)[:, 0] * ww[t0]
    close(loss.get(), (nll * keep).sum() / (ww[t0] * keep).sum(), 1e-4)
    if clnn.device().facts.fp64:
        d = clnn.cast(X, np.float64)
        close(clnn.cast(d, np.float32).get(), x)
    key = clnn.dropout_key(1, 2, 3)
    close(clnn.dropout(X, 0.3, key).get(), x * clnn.dropout_mask(x.shape, 0.3, key))
    _batch_norm(rng)


def _loss_scale(x, y):
    """Dynamic loss scaling on the device: the state's update, gated SGD, a loss whose
    gradient reads the scale."""
    from clnn.ops import optim as optim_ops
    state = clnn.asarray(optim_ops.loss_scale_state(8.0))
    count = clnn.asarray(np.zeros(1, np.int32))
    optim_ops.loss_scale_update(clnn.asarray(y), state, count=count, growth_interval=1)
    W, V = clnn.asarray(x), clnn.zeros((7, 13))
    clnn.sgd_step(W, clnn.asarray(y), V, lr=0.5, grad_scale=4.0, gate=state)
    close(W.get(), x - 0.25 * y)
    assert optim_ops.read_loss_scale_state(state.get()) == (16.0, False, 8.0, 0, 0)
    W, M, V2 = clnn.asarray(x), clnn.zeros((7, 13)), clnn.zeros((7, 13))
    clnn.adam_step(W, clnn.asarray(y), M, V2, step=count, lr=0.01, grad_scale=8.0,
                   gate=state)
    close(W.get(), x - 0.01 * y / (np.abs(y) + 1e-8), 1e-4)
    assert count.get()[0] == 1
    # an update that also keeps a float16 copy of the weights
    W, H = clnn.asarray(x), clnn.zeros((7, 13), np.float16)
    clnn.sgd_step(W, clnn.asarray(y), clnn.zeros((7, 13)), lr=0.5, grad_scale=4.0,
                  gate=state, copy=H)
    close(H.get(), (x - 0.25 * y).astype(np.float16), 1e-3)
    t = np.eye(13, dtype=np.float32)[[1, 5, 2, 0, 12, 3, 3]]
    _, dz = clnn.softmax_cross_entropy(clnn.asarray(x), clnn.asarray(t), grad_scale=0.5,
                                       scale_by=state)
    p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    close(dz.get(), (p - t) * 8)
    _, da = clnn.quadratic_loss(clnn.asarray(x), clnn.asarray(y), grad_scale=0.5,
                                scale_by=state)
    close(da.get(), (x - y) * 8)
    # a mixed-precision step's gradient cast, which marks the state (an atomic write
    # from every work-item that meets an inf): the update reads and clears the mark
    g = np.tile(y.astype(np.float16).ravel(), 40)
    g[[3, 2000, len(g) - 1]] = np.inf
    out = clnn.zeros(g.shape)
    optim_ops.cast_gradients(clnn.asarray(g), out, state)
    close(out.get(), g.astype(np.float32), 0)
    assert state.get()[optim_ops.LS_MARK] == 1.0
    optim_ops.loss_scale_update(None, state)
    assert optim_ops.read_loss_scale_state(state.get())[:3] == (8.0, True, 16.0) and \
        state.get()[optim_ops.LS_MARK] == 0.0
    # the same cast applying the update itself: its work-groups count themselves (an
    # atomic each, after a barrier) and the last one updates the state, which no other
    # group reads
    optim_ops.cast_gradients(clnn.asarray(g), out, state, update=True, count=count)
    assert optim_ops.read_loss_scale_state(state.get()) == (4.0, True, 8.0, 0, 2)
    assert state.get().view(np.int32)[optim_ops.LS_MARK:].tolist() == [0, 0]
    g[[3, 2000, len(g) - 1]] = 1.0
    optim_ops.cast_gradients(clnn.asarray(g), out, state, update=True, count=count,
                             growth_interval=1)
    close(out.get(), g.astype(np.float32), 0)
    assert optim_ops.read_loss_scale_state(state.get()) == (8.0, False, 4.0, 0, 2)
    assert count.get()[0] == 2


def _batch_norm(rng):
    """Training forward, backward and the running statistics, with the work-group
    sizes (1 on CPUs: a channel per work-item, planes as vectors; 64 and 256, trees)
    over channels of 1, 13 and 300 values."""
    from unittest import mock
    bn = sys.modules["clnn.ops.batchnorm"]
    for wg in (1, 64, 256):
        with mock.patch.object(bn, "_wg", lambda dev, wg=wg: wg):
            for shape in ((13, 3), (3, 2, 10, 10), (1, 2, 1, 13)):
                x = rng.standard_normal(shape).astype(np.float32) * 2 + 1
                C = shape[1]
                ax = (0,) + tuple(range(2, len(shape)))
                X, W, B = clnn.asarray(x), clnn.asarray(np.ones(C, np.float32) * 2), \
                    clnn.zeros(C)
                rm, rv, save = clnn.zeros(C), clnn.asarray(np.ones(C, np.float32)), \
                    clnn.empty((2, C), np.float32)
                out = clnn.batch_norm(X, rm, rv, W, B, training=True, save=save)
                bshape = (1, C) + (1,) * (len(shape) - 2)
                mean, var = x.mean(ax), x.var(ax)
                xhat = (x - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape) + 1e-5)
                close(out.get(), 2 * xhat, 1e-4)
                close(rm.get(), 0.1 * mean, 1e-4)
                dy = rng.standard_normal(shape).astype(np.float32)
                dx, dw, db = clnn.batch_norm_backward(clnn.asarray(dy), X, save, W)
                close(dw.get(), (dy * xhat).sum(ax), 1e-4)
                close(db.get(), dy.sum(ax), 1e-4)
                g = 2 * dy
                want = (g - g.mean(ax, keepdims=True)
                        - xhat * (g * xhat).mean(ax, keepdims=True)) / \
                    np.sqrt(var.reshape(bshape) + 1e-5)
                close(dx.get(), want, 1e-4)


def gemm():
    """Every GEMM tile variant of the table on edge sizes, transposes, epilogue, batches."""
    from clnn import tuning
    rng = np.random.default_rng(1)
    from clnn import plans
    rows = tuning.all_gemm_rows()
    facts = clnn.device().facts
    # CLNN_BATTERY_ROWS=beyond-32k: only the tiled rows that need more local memory than
    # the Oclgrind gate simulates (the others run there already)
    beyond = os.environ.get("CLNN_BATTERY_ROWS") == "beyond-32k"
    checked = 0
    for params in rows:
        if tuning.gemm_problems(params, facts):
            continue
        if beyond and (params["variant"] != "local" or plans.local_bytes(params) <= 32768):
            continue
        _gemm_cases(params, rng)
        if params["variant"] == "reg":
            # the packed kernel's other order: blocks of rows that walk the panels
            _gemm_cases(dict(params, PANELS_FIRST=not params.get("PANELS_FIRST", False)),
                        rng)
            _gemm_16bit_slices(params, rng)
        if params["variant"] == "local":
            # split-K's partial sums and second pass, on an edge and an inside case
            _gemm_cases(dict(params, KSPLIT=3), rng, split=True)
        checked += 1
    if not checked:
        raise SystemExit("no GEMM variant fits this device")
    _transposes(rng)
    print(f"checked {checked} GEMM variants")


def _transposes(rng):
    """transpose.cl (a WGMMA row's operands copied along k), on edge sizes, from an
    offset and a row stride, 32- and 16-bit: bit for bit."""
    import pyopencl as cl
    from clnn.ops.gemm import Operand
    G = sys.modules["clnn.ops.gemm"]
    dev = clnn.device()
    for dt, (rows, cols) in ((np.float32, (37, 70)), (np.float16, (33, 5)),
                             (np.float16, (1, 65))):
        x = rng.standard_normal((rows + 1, cols + 3)).astype(dt)
        X = clnn.asarray(x)
        op = G._transposed(dev, np.dtype(dt), Operand(X.data, cols + 4, cols + 3), rows,
                           cols)
        got = np.empty((cols, op.ld), dt)
        cl.enqueue_copy(dev.queue, got, op.data)
        if not np.array_equal(got[:, :rows], x[1:, 1:1 + cols].T):
            raise SystemExit(f"transpose {dt.__name__} {rows}x{cols}: wrong")


def _gemm_cases(params, rng, split=False):
    from clnn import tuning
    cases = [(70, 37, 19, False, False), (9, 130, 33, True, True), (1, 1, 1, False, True),
             (128, 128, 32, True, False)]
    if params["variant"] == "reg":
        # the CPU rows' direct kernel: few rows, A not transposed, B read in place in
        # both layouts, N past a work-item's columns
        cases += [(5, 37, 11, False, False), (7, 21, 13, False, True)]
    with tuning.override("gemm", params):
        # edges, transposes, a single element, and sizes every tile divides
        for M, N, K, ta, tb in (cases[::3] if split else cases):
            a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
            b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
            bias = rng.standard_normal(N).astype(np.float32)
            c = rng.standard_normal((M, N)).astype(np.float32)
            C = clnn.asarray(c)
            clnn.gemm(clnn.asarray(a), clnn.asarray(b), out=C, alpha=0.5, beta=-1.5,
                      trans_a=ta, trans_b=tb, bias=clnn.asarray(bias), activation="tanh")
            ref = np.tanh(0.5 * (a.T if ta else a) @ (b.T if tb else b) - 1.5 * c + bias)
            close(C.get(), ref, 1e-4)
        if split:
            return
        x = rng.standard_normal((2, 5, 7)).astype(np.float32)
        w = rng.standard_normal((3, 7)).astype(np.float32)
        close(clnn.gemm(clnn.asarray(x), clnn.asarray(w), trans_b=True).get(), x @ w.T,
              1e-4)
        if params["variant"] == "reg":
            # float16's direct kernel (NN: A's k converted a vector at a time, then
            # the k past the last whole vector)
            for M, N, K, tb in ((3, 37, 21, False), (9, 37, 21, True)):
                a = rng.standard_normal((M, K)).astype(np.float16)
                b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float16)
                ref = a.astype(np.float64) @ (b.T if tb else b).astype(np.float64)
                got = clnn.gemm(clnn.asarray(a), clnn.asarray(b), trans_b=tb).get()
                close(got.astype(np.float64), ref, 1e-2)


def _gemm_16bit_slices(params, rng):
    """The packed kernel's K slices of a float16 C: sums in a float32 workspace in blocks
    of rows, then clnn_gemm_splitk's vector epilogue (with a partial last vector)."""
    from unittest import mock
    from clnn import tuning
    gemm_module = sys.modules["clnn.ops.gemm"]
    M, N, K = 61, 9, 200
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = rng.standard_normal((M, N)).astype(np.float16)
    bias = rng.standard_normal(N).astype(np.float16)
    C = clnn.asarray(c)
    with tuning.override("gemm", params), mock.patch.object(gemm_module, "PANEL_BYTES", 4096), \
            mock.patch.object(gemm_module, "DIRECT_FLOPS", 0):
        clnn.gemm(clnn.asarray(a), clnn.asarray(b), out=C, alpha=0.5, beta=-1.5,
                  bias=clnn.asarray(bias), activation="tanh")
    f = [x.astype(np.float64) for x in (a, b, c, bias)]
    close(C.get().astype(np.float64), np.tanh(0.5 * f[0] @ f[1] - 1.5 * f[2] + f[3]), 2e-3)


def conv():
    """Convolution (every GEMM variant of the table, and gathered variants) and pooling,
    small LeNet-like shapes."""
    from clnn import tuning
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    from reference import conv2d_backward_ref, conv2d_ref, pool2d_ref
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    ref = conv2d_ref(x, w, b, (2, 1), (1, 1))
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    dx_ref, dw_ref = conv2d_backward_ref(dy, x, w, (2, 1), (1, 1))
    X, Wd, B, DY = (clnn.asarray(v) for v in (x, w, b, dy))
    facts = clnn.device().facts
    from unittest import mock
    conv_module = sys.modules["clnn.ops.conv"]
    checked = 0
    for params in tuning.all_gemm_rows():
        if tuning.gemm_problems(params, facts):
            continue
        # the GPU rows' data gradient both through col2im and by stride phase (and
        # their forward pass as the tiled GEMM: convt.cl's tiles are checked below)
        for col2im in ((16, 0) if params["variant"] == "local" else (16,)):
            with tuning.override("gemm", params), \
                    mock.patch.object(conv_module, "COL2IM_CHANNELS", col2im), \
                    mock.patch.object(conv_module, "TILE_DIRECT_MAXM", 0):
                close(clnn.conv2d(X, Wd, B, stride=(2, 1), padding=1).get(), ref, 1e-4)
                close(clnn.conv2d_backward_data(DY, Wd, x.shape, stride=(2, 1),
                                                padding=1).get(), dx_ref, 1e-4)
                close(clnn.conv2d_backward_weight(DY, X, w.shape, stride=(2, 1),
                                                  padding=1).get(), dw_ref, 1e-4)
        checked += 1
    # convt.cl's direct tiles (the GPU path's forward pass up to 16 filters, its data
    # gradient at unit stride up to 16 channels): 4, 8 and 16 sums a work-item, the
    # channels in blocks (9 with a 5x5 filter and 16 sums: 6 a block), bias and relu
    # fused, partial tiles, the flipped filters of the data gradient
    with tuning.override("gemm", tuning.GEMM_TABLE["type"]["GPU"]), clnn.profile() as prof:
        for (C, M, R, S, st, pd) in ((3, 3, 3, 2, (2, 1), (1, 1)), (9, 16, 5, 5, (1, 1), (2, 1)),
                                     (2, 7, 3, 3, (1, 1), (0, 1))):
            xt = rng.standard_normal((2, C, 11, 18)).astype(np.float32)
            wt = rng.standard_normal((M, C, R, S)).astype(np.float32)
            bt = rng.standard_normal(M).astype(np.float32)
            yt = conv2d_ref(xt, wt, bt, st, pd)
            dyt = rng.standard_normal(yt.shape).astype(np.float32)
            dxt, _ = conv2d_backward_ref(dyt, xt, wt, st, pd)
            close(clnn.conv2d(clnn.asarray(xt), clnn.asarray(wt), clnn.asarray(bt), stride=st,
                              padding=pd, activation="relu").get(), np.maximum(yt, 0), 1e-4)
            close(clnn.conv2d_backward_data(clnn.asarray(dyt), clnn.asarray(wt), xt.shape,
                                            stride=st, padding=pd).get(), dxt, 1e-4)
    assert {r.params["MB"] for r in prof.records if r.entry == "clnn_convt_forward"} == \
        {4, 8, 16}
    checked += 1
    # convw.cl's direct weight gradients (the GPU path's, up to 16 filters): position
    # slices summed through local memory (5 filter rows), one and two filter rows a
    # work-item (330 and 432), more images than work-groups, strides and padding; the
    # bias gradient beside them (db=) in the first two
    with tuning.override("gemm", tuning.GEMM_TABLE["type"]["GPU"]), clnn.profile() as prof:
        for (N, C, M, R, S, st, pd) in ((5, 1, 5, 1, 3, (1, 1), (0, 1)),
                                        (2, 11, 10, 3, 3, (2, 1), (1, 1)),
                                        (3, 9, 16, 3, 2, (1, 2), (0, 1))):
            xt = rng.standard_normal((N, C, 7, 9)).astype(np.float32)
            wt = rng.standard_normal((M, C, R, S)).astype(np.float32)
            dyt = rng.standard_normal(conv2d_ref(xt, wt, None, st, pd).shape).astype(np.float32)
            _, dwt = conv2d_backward_ref(dyt, xt, wt, st, pd)
            dbt = clnn.empty((M,)) if M < 16 else None
            close(clnn.conv2d_backward_weight(clnn.asarray(dyt), clnn.asarray(xt), wt.shape,
                                              stride=st, padding=pd, db=dbt).get(), dwt, 1e-4)
            if dbt is not None:
                close(dbt.get(), dyt.astype(np.float64).sum(axis=(0, 2, 3)), 1e-4)
    assert [r.entry for r in prof.records].count("clnn_convw_partial") == 3
    checked += 1
    # conv.cl's gathered kernels: flat and line layouts, the padded copy and the
    # bounds-checked reads, both data-gradient methods, float64's narrower vectors,
    # work-items that walk the rows first (small problems walk the panels first);
    # convpx.cl's pixel rows; winograd.cl's transforms
    from unittest import mock
    conv_module = sys.modules["clnn.ops.conv"]
    x1 = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y1 = conv2d_ref(x1, w1, b[:4], (1, 1), (1, 1))
    dy1 = rng.standard_normal(y1.shape).astype(np.float32)
    dx1, dw1 = conv2d_backward_ref(dy1, x1, w1, (1, 1), (1, 1))
    X1, W1, B1, DY1 = (clnn.asarray(v) for v in (x1, w1, b[:4], dy1))
    base = dict(tuning.CONV_TABLE["type"]["CPU"])
    for extra in ({}, {"MWI": 3, "NWI": 8, "LINE": True, "DGRAD": "flip",
                       "PANELS_FIRST": False},
                  {"MWI": 2, "NWI": 16, "LINE": False, "DGRAD": "col2im"},
                  {"MWI": 4, "VW": 4, "NWI": 4, "DGRAD": "flip"},
                  # 512-bit tiles on every width of columns (WIDE_COLS 0 below): halves
                  # stored whole, lane by lane, and as dcol
                  {"VW": 16, "REGS": 32, "DGRAD": "col2im"},
                  # convpx.cl's pixel rows (forward passes; rows of 9 in blocks of 4)
                  {"PIXELS": True, "QV": 1, "VW": 4, "MB": 3, "DGRAD": "flip"},
                  # winograd.cl (the 3x3 layer's forward pass and data gradient)
                  {"WINO": True, "DGRAD": "flip"}):
        for pad_bytes in (conv_module.PAD_BYTES, 0):
            with tuning.override("conv", dict(base, **extra)), \
                    mock.patch.object(conv_module, "PAD_BYTES", pad_bytes), \
                    mock.patch.object(conv_module, "WIDE_COLS", 0):
                for (xx, ww, bb, dyy, st, refs) in (
                        (X, Wd, B, DY, (2, 1), (ref, dx_ref, dw_ref)),
                        (X1, W1, B1, DY1, (1, 1), (y1, dx1, dw1))):
                    close(clnn.conv2d(xx, ww, bb, stride=st, padding=1).get(), refs[0],
                          1e-4)
                    if not extra:     # the epilogue's activation on a vector of filters
                        close(clnn.conv2d(xx, ww, bb, stride=st, padding=1,
                                          activation="tanh").get(), np.tanh(refs[0]), 1e-4)
                    close(clnn.conv2d_backward_data(dyy, ww, xx.shape, stride=st,
                                                    padding=1).get(), refs[1], 1e-4)
                    close(clnn.conv2d_backward_weight(dyy, xx, ww.shape, stride=st,
                                                      padding=1).get(), refs[2], 1e-4)
            checked += 1
    # convpx.cl's pixel rows of 512-bit vectors (rows of 40: two vectors, the last
    # block overlapping), the forward pass and the flipped data gradient
    x2 = rng.standard_normal((2, 3, 4, 40)).astype(np.float32)
    w2 = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    y2 = conv2d_ref(x2, w2, b, (1, 1), (1, 1))
    dy2 = rng.standard_normal(y2.shape).astype(np.float32)
    dx2, _ = conv2d_backward_ref(dy2, x2, w2, (1, 1), (1, 1))
    with tuning.override("conv", dict(base, VW=16, REGS=32, PIXELS=True, DGRAD="flip")), \
            clnn.profile() as prof:
        close(clnn.conv2d(clnn.asarray(x2), clnn.asarray(w2), clnn.asarray(b),
                          padding=1).get(), y2, 1e-4)
        close(clnn.conv2d_backward_data(clnn.asarray(dy2), clnn.asarray(w2), x2.shape,
                                        padding=1).get(), dx2, 1e-4)
    assert {dict(r.params["tuning"])["VW"] for r in prof.records
            if r.entry == "clnn_conv_pixels"} == {16}
    checked += 1
    # convwr.cl's weight gradient: rows of 9 in vectors of 8 over the padded copy and
    # rows of 7 in vectors of 4 over the input itself (a last block overlapping the one
    # before), 4 filters in panels of 3 (the last one padded: its missing filter reads
    # filter 3 again, never past dy), in one slice and in slices that reduce3 adds
    y0 = conv2d_ref(x1, w1, b[:4], (1, 1), (0, 0))
    dy0 = rng.standard_normal(y0.shape).astype(np.float32)
    _, dw0 = conv2d_backward_ref(dy0, x1, w1, (1, 1), (0, 0))
    DY0 = clnn.asarray(dy0)
    for items in (0, 64):
        for vw, dyy, pad, want in ((8, DY1, 1, dw1), (4, DY0, 0, dw0)):
            with tuning.override("conv", dict(base, WROWS=True, VW=vw, WROWS_MB=3)), \
                    mock.patch.object(conv_module, "WROWS_ITEMS", items), \
                    clnn.profile() as prof:
                close(clnn.conv2d_backward_weight(dyy, X1, W1.shape, padding=pad).get(),
                      want, 1e-4)
            assert [r.entry for r in prof.records].count("clnn_conv_wgrad_rows") == 1
    checked += 1
    # a strided data gradient as dcol transposed and clnn_conv_col2im_rows (stride 2
    # along the rows; runs of dcol past dy's edges at both sides of rows of 8)
    with tuning.override("conv", base), clnn.profile() as prof:
        close(clnn.conv2d_backward_data(DY, Wd, x.shape, stride=(2, 1), padding=1).get(),
              dx_ref, 1e-4)
    assert any(r.entry == "clnn_conv_col2im_rows" for r in prof.records)
    # a strided 1x1 convolution: clnn_conv_subsample's copy of its positions (rows and
    # columns left out at both ends), then batched GEMMs, and its weight gradient
    w11 = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
    y11 = conv2d_ref(x, w11, None, (2, 3), (0, 0))
    dy11 = rng.standard_normal(y11.shape).astype(np.float32)
    with tuning.override("conv", base), clnn.profile() as prof, \
            mock.patch.object(conv_module, "POINTWISE_MIN_COLS", 0), \
            mock.patch.object(conv_module, "POINTWISE_MIN_MACS", 0):
        close(clnn.conv2d(X, clnn.asarray(w11), stride=(2, 3)).get(), y11, 1e-4)
        close(clnn.conv2d_backward_weight(clnn.asarray(dy11), X, w11.shape,
                                          stride=(2, 3)).get(),
              conv2d_backward_ref(dy11, x, w11, (2, 3), (0, 0))[1], 1e-4)
    assert [r.entry for r in prof.records].count("clnn_conv_subsample") == 2
    # winograd.cl with the CPU GEMM's packed panels (the transforms write them, and dy's
    # transform takes an A panel of channels per work-item), its rows forced here; the
    # channel-lane transforms in one band and with every tile row a band; the forward
    # passes' input transform in runs of tiles (clnn_wino_input_runs), its channels in
    # one block and in blocks of one
    for groups in (0, 10 ** 6):
        with tuning.override("gemm", tuning.GEMM_TABLE["type"]["CPU"]), \
                tuning.override("conv", dict(base, WINO=True, DGRAD="flip")), \
                mock.patch.object(conv_module, "WINO_BAND_GROUPS", groups), \
                clnn.profile() as prof:
            close(clnn.conv2d(X1, W1, B1, padding=1).get(), y1, 1e-4)
            close(clnn.conv2d_backward_data(DY1, W1, X1.shape, padding=1).get(), dx1, 1e-4)
            close(clnn.conv2d_backward_weight(DY1, X1, W1.shape, padding=1).get(), dw1, 1e-4)
        assert any(r.params.get("dyv", 1) > 1 for r in prof.records
                   if r.entry == "clnn_wino_dy")
        assert [r.entry for r in prof.records].count("clnn_wino_input_runs") == 2
    # a forward pass whose tile rows are whole vectors of tiles: clnn_wino_input_rows (29
    # columns and padding 1: 8 tiles a row, edge vectors at both sides)
    xr = rng.standard_normal((1, 3, 6, 29)).astype(np.float32)
    yr = conv2d_ref(xr, w1, b[:4], (1, 1), (1, 1))
    # (rows of one vector: runs of tiles take those unless WINO_ROWS_MIN_VECTORS is 1)
    with tuning.override("gemm", tuning.GEMM_TABLE["type"]["CPU"]), \
            tuning.override("conv", dict(base, WINO=True)), \
            mock.patch.object(conv_module, "WINO_ROWS_MIN_VECTORS", 1), clnn.profile() as prof:
        close(clnn.conv2d(clnn.asarray(xr), W1, B1, padding=1).get(), yr, 1e-4)
    assert any(r.entry == "clnn_wino_input_rows" for r in prof.records)
    checked += 1
    pooling = [(mode, fwd, bwd, per)
               for mode, fwd, bwd in (("max", clnn.max_pool2d, clnn.max_pool2d_backward),
                                      ("avg", clnn.avg_pool2d, clnn.avg_pool2d_backward))
               for per in (False, True)]        # a work-item per row, or per element
    for mode, fwd, bwd, per_element in pooling:
        # overlapping windows, and windows that do not overlap (their own path); with
        # ceil_mode windows past the input; dilation (max) and the divisors (avg)
        extra = ({"dilation": 2, "ceil_mode": True},) if mode == "max" else \
            ({"ceil_mode": True, "count_include_pad": False}, {"divisor_override": 5})
        for k, st, pad, opts in (((3, 2), 2, 1, {}), ((2, 2), 2, 0, {}),
                                 ((2, 1), (3, 2), (1, 0), {}), ((2, 2), 2, 0, extra[0]),
                                 ((3, 3), 2, 1, extra[-1])):
            ref_opts = dict(opts)
            dil = ref_opts.pop("dilation", 1)
            y_ref, backward, _ = pool2d_ref(
                x, k, (st, st) if isinstance(st, int) else st,
                (pad, pad) if isinstance(pad, int) else pad, mode, (dil, dil), **ref_opts)
            g = rng.standard_normal(y_ref.shape).astype(np.float32)
            with tuning.override("rows", {"wg": per_element}):
                close(fwd(X, k, st, pad, **opts).get(), y_ref)
                close(bwd(clnn.asarray(g), X, k, st, pad, **opts).get(), backward(g))
                # through the derivative of a tanh whose output x would be
                close(bwd(clnn.asarray(g), X, k, st, pad, activation="tanh", **opts).get(),
                      backward(g) * (1 - x.astype(np.float64) ** 2))
    # the direct kernels of grouped and dilated convolutions (both work-group sizes of
    # the weight gradient's reduction, and its CPU form: a work-item per weight)
    from reference import conv2d_general_ref
    xg = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    wg_ = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    opts = dict(stride=(2, 1), padding=(2, 1), dilation=(2, 2), groups=2)
    y_ref, backward = conv2d_general_ref(xg, wg_, None, (2, 1), (2, 1), (2, 2), 2)
    g = rng.standard_normal(y_ref.shape).astype(np.float32)
    dx_ref, dw_ref = backward(g)
    XG, WG, G = clnn.asarray(xg), clnn.asarray(wg_), clnn.asarray(g)
    for size, wgrad in ((64, "tree"), (256, "tree"), (64, "lanes")):
        with mock.patch.object(conv_module, "_direct_wg", lambda dev, size=size: size), \
                mock.patch.object(conv_module, "DIRECT_WGRAD", wgrad):
            close(clnn.conv2d(XG, WG, **opts).get(), y_ref, 1e-4)
            close(clnn.conv2d_backward_data(G, WG, xg.shape, **opts).get(), dx_ref, 1e-4)
            close(clnn.conv2d_backward_weight(G, XG, wg_.shape, **opts).get(), dw_ref, 1e-3)
    # the CPU form's vector lanes along a row (21 columns: two vectors and a tail, the
    # first tap's row starting one column in)
    xd = rng.standard_normal((1, 2, 3, 21)).astype(np.float32)
    wd = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    y_ref, backward = conv2d_general_ref(xd, wd, None, (1, 1), (1, 1), (1, 1), 2)
    g = rng.standard_normal(y_ref.shape).astype(np.float32)
    with mock.patch.object(conv_module, "DIRECT_WGRAD", "lanes"):
        close(clnn.conv2d_backward_weight(clnn.asarray(g), clnn.asarray(xd), wd.shape,
                                          padding=1, groups=2).get(), backward(g)[1], 1e-3)
    print(f"checked {checked} GEMM and gathered variants for convolution, and pooling")


def engines(wgmma=False):
    """The matrix-engine rows that fit the gate's limits, the engine emulated (the lanes
    of a warp exchange fragment registers through local memory): their float16 and
    TF32 tile layouts, loaders, split-K and epilogue, plain and in convolutions, with
    race detection over the local-memory protocol. With ``wgmma`` the WGMMA rows
    instead, in products only (a convolution under one runs the table's mma.sync row,
    which the battery without it checks): a battery of their own, which pytest-xdist
    runs beside the other."""
    from unittest import mock
    from clnn import plans, tuning
    facts = clnn.device().facts
    rng = np.random.default_rng(5)
    checked = 0
    # the table's mma.sync rows (its WGMMA rows' tiles exceed the gate's 32 KiB; the
    # small ones below stand for them), and its 64x64 float16 row with ldmatrix (LDSM,
    # which the tuner searches)
    rows = [r for r in tuning.MMA_TABLE[("nvidia", "GPU")] if not r.get("WGMMA")]
    ldsm = dict(next(r for r in rows if r["MMA"] == "f16" and r["MWG"] == r["NWG"] == 64),
                LDSM=True)
    # and the 64x64 float16 row in bfloat16 (the same tiles, bfloat16 conversions)
    small = next(r for r in rows if r["MMA"] == "f16" and r["MWG"] == r["NWG"] == 64)
    # and rows with tiles filled by cp.async (ASYNC), in 32x32 tiles that fit the gate's
    # 32 KiB emulated, where the operands allow copies of at least 4 bytes (the shapes
    # below: vectors of 8 halves or 4 floats, and for the third 2 of either), else (the
    # convolutions) loaded through registers as their rows load
    tiny = {"variant": "local", "MMA": "f16", "MWG": 32, "NWG": 32, "KWG": 16, "MDIMC": 8,
            "NDIMC": 16, "WM": 16, "WN": 16, "LDSM": True, "ASYNC": 3}
    tiny_tf32 = dict(tiny, MMA="tf32", KWG=8, LDSM=False)
    # and WGMMA rows (a warpgroup per 64 x 64 block, tiles read through descriptors
    # from a cp.async pipeline; convolutions under them run the table's mma.sync row)
    wg = {"variant": "local", "MMA": "f16", "MWG": 64, "NWG": 64, "KWG": 32, "MDIMC": 8,
          "NDIMC": 16, "WM": 64, "WN": 64, "ASYNC": 2, "WGMMA": True}
    wg_tf32 = dict(wg, MMA="tf32", KWG=16, ASYNC=3)
    runs = [(r, np.float32 if r["MMA"] == "tf32" else np.float16) for r in rows + [ldsm]]
    runs += [(small, clnn.bfloat16), (tiny, np.float16), (tiny_tf32, np.float32)]
    # and the narrow float16 tile (16 rows: more work-items than its A tile has copies)
    # with two stages, whose 23 KiB fit the gate's 32 KiB (its three take 35)
    narrow = tuning.NARROW_F16
    runs += [(dict(narrow, ASYNC=2), np.float16)]
    if wgmma:
        runs = [(wg, np.float16), (wg_tf32, np.float32),
                (dict(wg, ASYNC=3, WGWAIT=1), np.float16),
                (dict(wg_tf32, WGSWZ=True), np.float32)]
    for row, dt in runs:
        row = dict(row, EMULATE=True)
        size = np.dtype(dt).itemsize
        if tuning.gemm_problems(row, facts, size) or plans.local_bytes(row, size) > 32768:
            continue
        tol = {np.dtype(np.float32): 2e-3, np.dtype(np.float16): 1e-2,
               clnn.bfloat16: 8e-2}[np.dtype(dt)]
        shapes = ((37, 40, 48, False, False, None), (24, 72, 32, True, True, None),
                  (20, 18, 98, False, True, 2)) if "ASYNC" in row else \
            ((37, 29, 40, False, False, None), (9, 70, 33, True, True, None),
             (20, 20, 100, False, True, 2))
        for M, N, K, ta, tb, split in shapes:
            a = rng.standard_normal((K, M) if ta else (M, K)).astype(dt)
            b = rng.standard_normal((N, K) if tb else (K, N)).astype(dt)
            bias = rng.standard_normal(N).astype(dt)
            with tuning.override("gemm", dict(row, KSPLIT=split) if split else row):
                got = clnn.gemm(clnn.asarray(a), clnn.asarray(b), trans_a=ta, trans_b=tb,
                                bias=clnn.asarray(bias), activation="relu").get()
            ref = np.maximum((a.T if ta else a).astype(np.float64) @
                             (b.T if tb else b).astype(np.float64) + bias.astype(np.float64),
                             0.0)
            close(got / np.sqrt(K), ref / np.sqrt(K), tol)
        checked += 1
        if wgmma:
            continue
        x = rng.standard_normal((2, 3, 9, 8)).astype(dt)
        w = rng.standard_normal((5, 3, 3, 3)).astype(dt)
        dy = rng.standard_normal((2, 5, 9, 8)).astype(dt)
        x64, w64, dy64 = (clnn.asarray(v.astype(np.float32)) for v in (x, w, dy))
        refs = (clnn.conv2d(x64, w64, padding=1).get(),
                clnn.conv2d_backward_data(dy64, w64, x.shape, padding=1).get(),
                clnn.conv2d_backward_weight(dy64, x64, w.shape, padding=1).get())
        with tuning.override("gemm", row), mock.patch.object(
                sys.modules["clnn.ops.conv"], "TILE_DIRECT_MAXM", 0):     # (the engines')
            X, W, DY = clnn.asarray(x), clnn.asarray(w), clnn.asarray(dy)
            got = (clnn.conv2d(X, W, padding=1).get(),
                   clnn.conv2d_backward_data(DY, W, x.shape, padding=1).get(),
                   clnn.conv2d_backward_weight(DY, X, w.shape, padding=1).get())
        for g, r in zip(got, refs):
            close(g / 6, r / 6, tol)
    if not wgmma:
        # convt.cl's engine variant (the layers of at most 16 filters under engine rows):
        # 8 and 16 filters along n, C1's 25 taps padded to 32, blocks of channels (C3's
        # data gradient: 16 channels in blocks of 6, 6 and 4), partial tiles, bias and
        # relu; its 11 and 16 KiB and the emulation's 6 KiB exchange fit the gate's 32
        from reference import conv2d_backward_ref, conv2d_ref
        with clnn.profile() as prof:
            for row, dt in ((small, np.float16), (small, clnn.bfloat16),
                            (dict(tiny_tf32, KWG=16), np.float32)):
                tol = {np.dtype(np.float32): 2e-3, np.dtype(np.float16): 1e-2,
                       clnn.bfloat16: 8e-2}[np.dtype(dt)]
                for (C, M, H, W) in ((1, 6, 13, 20), (16, 6, 10, 19)):
                    x = rng.standard_normal((2, C, H, W)).astype(dt)
                    w = rng.standard_normal((M, C, 5, 5)).astype(dt)
                    b = rng.standard_normal(M).astype(dt)
                    y = conv2d_ref(x, w, b, (1, 1), (0, 0))
                    dy = rng.standard_normal(y.shape).astype(dt)
                    dx, _ = conv2d_backward_ref(dy, x, w, (1, 1), (0, 0))
                    with tuning.override("gemm", dict(row, EMULATE=True)):
                        X, Wd = clnn.asarray(x), clnn.asarray(w)
                        got = clnn.conv2d(X, Wd, clnn.asarray(b), activation="relu").get()
                        close(got / np.sqrt(25 * C), np.maximum(y, 0) / np.sqrt(25 * C), tol)
                        got = clnn.conv2d_backward_data(clnn.asarray(dy), Wd, x.shape).get()
                        close(got / np.sqrt(25 * M), dx / np.sqrt(25 * M), tol)
        assert {(r.params["MMA"], r.params["MB"]) for r in prof.records
                if r.entry == "clnn_convt_forward"} == \
            {("f16", 8), ("f16", 16), ("tf32", 8), ("tf32", 16)}
        checked += 1
    if not checked:
        raise SystemExit("no engine row fits this device")
    print(f"checked {checked} emulated engine rows")


def bad():
    """An out-of-bounds write that Oclgrind must report (proves the gate can fail)."""
    import pyopencl as cl
    dev = clnn.device()
    prg = cl.Program(dev.context, "__kernel void k(__global float *x) "
                     "{ x[get_global_id(0) + 1] = 1.0f; }").build()
    buf = clnn.zeros(4)
    prg.k(dev.queue, (4,), None, buf.base_data)
    dev.queue.finish()


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "ops"
    {"ops": ops, "gemm": gemm, "conv": conv, "engines": engines,
     "wgmma": lambda: engines(wgmma=True), "bad": bad}[which]()
    clnn.device().finish()
    print("battery passed")
