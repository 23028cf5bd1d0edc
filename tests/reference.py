"""float64 numpy references shared by the tests."""

import numpy as np


def softplus_params(p):
    """(beta, threshold) from an activation parameter: (beta, threshold), beta, or
    nothing (PyTorch's defaults 1 and 20)."""
    if isinstance(p, (tuple, list)):
        return float(p[0]), float(p[1])
    return (float(p) if p else 1.0), 20.0


def f_ref(name, z, p):
    z = z.astype(np.float64)
    beta, t = softplus_params(p)
    return {
        "identity": lambda: z,
        "sigmoid": lambda: 1 / (1 + np.exp(-z)),
        "tanh": lambda: np.tanh(z),
        "relu": lambda: np.maximum(z, 0),
        "leaky_relu": lambda: np.where(z > 0, z, p * z),
        "elu": lambda: np.where(z > 0, z, p * np.expm1(z)),
        "softplus": lambda: np.where(beta * z > t, z, np.logaddexp(0, beta * z) / beta),
    }[name]()


def df_ref(name, z, p):
    z = z.astype(np.float64)
    s = 1 / (1 + np.exp(-z))
    beta, t = softplus_params(p)
    return {
        "identity": lambda: np.ones_like(z),
        "sigmoid": lambda: s * (1 - s),
        "tanh": lambda: 1 - np.tanh(z) ** 2,
        "relu": lambda: (z > 0).astype(np.float64),
        "leaky_relu": lambda: np.where(z > 0, 1.0, p),
        "elu": lambda: np.where(z > 0, 1.0, p * np.exp(z)),
        "softplus": lambda: np.where(beta * z > t, 1.0, 1 / (1 + np.exp(-beta * z))),
    }[name]()


def conv2d_ref(x, w, b, stride, padding):
    """The lecture's forward loops over output positions, float64, with stride and
    zero padding: y[n, m, p, q] = sum_{c,r,s} x[n, c, p*sh + r - ph, q*sw + s - pw] w[m, c, r, s]."""
    (sh, sw), (ph, pw) = stride, padding
    N, C, H, W = x.shape
    M, _, R, S = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    P, Q = (H + 2 * ph - R) // sh + 1, (W + 2 * pw - S) // sw + 1
    y = np.zeros((N, M, P, Q))
    for p in range(P):
        for q in range(Q):
            window = xp[:, :, p * sh:p * sh + R, q * sw:q * sw + S]
            y[:, :, p, q] = np.einsum("ncrs,mcrs->nm", window, w.astype(np.float64))
    if b is not None:
        y += b.astype(np.float64)[None, :, None, None]
    return y


def conv2d_backward_ref(dy, x, w, stride, padding):
    """(dx, dw) from the same loops run backwards: each output position sends dy
    through the window it read (dE/dX and dE/dW of the lecture's backprop section)."""
    (sh, sw), (ph, pw) = stride, padding
    N, C, H, W = x.shape
    M, _, R, S = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    dxp = np.zeros_like(xp)
    dw = np.zeros(w.shape)
    P, Q = dy.shape[2:]
    for p in range(P):
        for q in range(Q):
            g = dy[:, :, p, q].astype(np.float64)
            sl = (slice(None), slice(None), slice(p * sh, p * sh + R), slice(q * sw, q * sw + S))
            dxp[sl] += np.einsum("nm,mcrs->ncrs", g, w.astype(np.float64))
            dw += np.einsum("nm,ncrs->mcrs", g, xp[sl])
    return dxp[:, :, ph:ph + H, pw:pw + W], dw


def pool_out_size(L, k, s, p, d=1, ceil_mode=False):
    """PyTorch's pooled length (torch/nn/modules/pooling.py's documented formula)."""
    import math
    f = math.ceil if ceil_mode else math.floor
    n = f((L + 2 * p - d * (k - 1) - 1) / s) + 1
    if ceil_mode and (n - 1) * s >= L + p:
        n -= 1
    return n


def pool2d_ref(x, k, stride, padding, mode, dilation=(1, 1), ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """(y, dx_of(dy), indices) for max/avg pooling with PyTorch's options, by loops
    over windows and taps in float64; max picks the first maximum in row-major order
    (a NaN beats any number), indices are flat h * W + w within the plane (-1 for a
    window with no tap inside the input)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k, stride, padding, dilation
    N, C, H, W = x.shape
    P = pool_out_size(H, kh, sh, ph, dh, ceil_mode)
    Q = pool_out_size(W, kw, sw, pw, dw, ceil_mode)
    x64 = x.astype(np.float64)
    y = np.zeros((N, C, P, Q))
    idx = np.full((N, C, P, Q), -1, dtype=np.int64)
    div = np.ones((P, Q))
    for p in range(P):
        for q in range(Q):
            taps = [(p * sh - ph + r * dh, q * sw - pw + t * dw)
                    for r in range(kh) for t in range(kw)]
            taps = [(h, w) for h, w in taps if 0 <= h < H and 0 <= w < W]
            if mode == "avg":
                h0, w0 = p * sh - ph, q * sw - pw
                h1, w1 = min(h0 + kh, H + ph), min(w0 + kw, W + pw)
                if divisor_override is not None:
                    div[p, q] = divisor_override
                elif count_include_pad:
                    div[p, q] = (h1 - h0) * (w1 - w0)
                else:
                    div[p, q] = (min(h1, H) - max(h0, 0)) * (min(w1, W) - max(w0, 0))
                y[:, :, p, q] = sum(x64[:, :, h, w] for h, w in taps) / div[p, q]
                continue
            for n in range(N):
                for c in range(C):
                    best = None
                    for h, w in taps:
                        v = x64[n, c, h, w]
                        if best is None or v > best[0] or (np.isnan(v) and
                                                           not np.isnan(best[0])):
                            best = (v, h * W + w)
                    # no tap inside the input (dilation): -inf, as PyTorch
                    y[n, c, p, q], idx[n, c, p, q] = best or (-np.inf, -1)

    def backward(dy):
        dx = np.zeros((N, C, H * W))
        for p in range(P):
            for q in range(Q):
                g = dy[:, :, p, q].astype(np.float64)
                if mode == "max":
                    n, c = np.indices((N, C))
                    hit = idx[:, :, p, q] >= 0           # -1: a window with no input
                    np.add.at(dx, (n[hit], c[hit], idx[:, :, p, q][hit]), g[hit])
                else:
                    for h, w in [(p * sh - ph + r, q * sw - pw + t)
                                 for r in range(kh) for t in range(kw)]:
                        if 0 <= h < H and 0 <= w < W:
                            dx[:, :, h * W + w] += g / div[p, q]
        return dx.reshape(N, C, H, W)
    return y, backward, idx


def numeric_grad(loss, x, h=1e-6):
    """Central finite differences of the scalar ``loss(x)`` (float64 numpy in and out)."""
    g = np.zeros_like(x, dtype=np.float64)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        g[idx] = (loss(xp) - loss(xm)) / (2 * h)
    return g


def conv2d_general_ref(x, w, b, stride, padding, dilation=(1, 1), groups=1):
    """(y, backward(dy) -> (dx, dw)) for PyTorch's conv2d with groups and dilation, in
    float64: w is (M, C / groups, R, S); tap (r, s) reads the zero-padded input at
    (p sh + r dh, q sw + s dw)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    N, C, H, W = x.shape
    M, Cg, R, S = w.shape
    G, Mg = groups, M // groups
    P = (H + 2 * ph - dh * (R - 1) - 1) // sh + 1
    Q = (W + 2 * pw - dw * (S - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    wg = w.reshape(G, Mg, Cg, R, S)

    def patch(arr, r, s):
        return arr[:, :, r * dh:r * dh + sh * (P - 1) + 1:sh,
                   s * dw:s * dw + sw * (Q - 1) + 1:sw]
    y = np.zeros((N, G, Mg, P, Q))
    for r in range(R):
        for s in range(S):
            pt = patch(xp, r, s).reshape(N, G, Cg, P, Q)
            y += np.einsum("ngcpq,gmc->ngmpq", pt, wg[:, :, :, r, s])
    y = y.reshape(N, M, P, Q)
    if b is not None:
        y += b.astype(np.float64)[None, :, None, None]

    def backward(dy):
        d = dy.astype(np.float64).reshape(N, G, Mg, P, Q)
        dxp = np.zeros_like(xp)
        dwg = np.zeros_like(wg)
        for r in range(R):
            for s in range(S):
                pt = patch(xp, r, s).reshape(N, G, Cg, P, Q)
                dwg[:, :, :, r, s] = np.einsum("ngmpq,ngcpq->gmc", d, pt)
                patch(dxp, r, s)[...] += np.einsum("ngmpq,gmc->ngcpq", d,
                                                   wg[:, :, :, r, s]).reshape(N, C, P, Q)
        return dxp[:, :, ph:ph + H, pw:pw + W], dwg.reshape(M, Cg, R, S)
    return y, backward
