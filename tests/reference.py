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
