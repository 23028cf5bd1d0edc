"""float64 numpy references shared by the tests."""

import numpy as np


def f_ref(name, z, p):
    z = z.astype(np.float64)
    return {
        "identity": lambda: z,
        "sigmoid": lambda: 1 / (1 + np.exp(-z)),
        "tanh": lambda: np.tanh(z),
        "relu": lambda: np.maximum(z, 0),
        "leaky_relu": lambda: np.where(z > 0, z, p * z),
        "elu": lambda: np.where(z > 0, z, p * np.expm1(z)),
        "softplus": lambda: np.logaddexp(0, z),
    }[name]()


def df_ref(name, z, p):
    z = z.astype(np.float64)
    s = 1 / (1 + np.exp(-z))
    return {
        "identity": lambda: np.ones_like(z),
        "sigmoid": lambda: s * (1 - s),
        "tanh": lambda: 1 - np.tanh(z) ** 2,
        "relu": lambda: (z > 0).astype(np.float64),
        "leaky_relu": lambda: np.where(z > 0, 1.0, p),
        "elu": lambda: np.where(z > 0, 1.0, p * np.exp(z)),
        "softplus": lambda: s,
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


def pool2d_ref(x, k, stride, padding, mode):
    """(y, dx_of(dy)) for max/avg pooling; max picks the first maximum in row-major order."""
    (kh, kw), (sh, sw), (ph, pw) = k, stride, padding
    N, C, H, W = x.shape
    P, Q = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)),
                constant_values=fill)
    y = np.zeros((N, C, P, Q))
    where = np.zeros((N, C, P, Q), dtype=np.int64)
    for p in range(P):
        for q in range(Q):
            win = xp[:, :, p * sh:p * sh + kh, q * sw:q * sw + kw].reshape(N, C, -1)
            if mode == "max":
                where[:, :, p, q] = win.argmax(-1)
                y[:, :, p, q] = win.max(-1)
            else:
                y[:, :, p, q] = win.sum(-1) / (kh * kw)

    def backward(dy):
        dxp = np.zeros_like(xp)
        for p in range(P):
            for q in range(Q):
                g = dy[:, :, p, q].astype(np.float64)
                if mode == "max":
                    r, s = np.divmod(where[:, :, p, q], kw)
                    n, c = np.indices((N, C))
                    np.add.at(dxp, (n, c, p * sh + r, q * sw + s), g)
                else:
                    dxp[:, :, p * sh:p * sh + kh, q * sw:q * sw + kw] += \
                        g[:, :, None, None] / (kh * kw)
        return dxp[:, :, ph:ph + H, pw:pw + W]
    return y, backward


def numeric_grad(loss, x, h=1e-6):
    """Central finite differences of the scalar ``loss(x)`` (float64 numpy in and out)."""
    g = np.zeros_like(x, dtype=np.float64)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        g[idx] = (loss(xp) - loss(xm)) / (2 * h)
    return g
