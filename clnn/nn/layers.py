"""Layers. A layer is built (given its input width, device, dtype and a generator)
when the network that holds it is made."""

import numpy as np

import clnn
from ..errors import ArgumentError
from ..ops.elementwise import ACTIVATIONS, ACTIVATION_PARAMS

# He initialisation for the relu family, Xavier/Glorot for the saturating ones.
_HE = ("relu", "leaky_relu", "elu", "softplus")


class Dense:
    """a = f(x @ weight.T + bias): weight (out, in) and bias (out,), PyTorch's shapes.

    ``activation``: identity, sigmoid, tanh, relu, leaky_relu, elu, softplus, or softmax
    (output layer only). ``param`` is the leaky_relu slope or elu alpha.
    """

    def __init__(self, out_features, activation="sigmoid", param=None):
        if not isinstance(out_features, (int, np.integer)) or out_features < 1:
            raise ArgumentError(f"out_features must be a positive int, got {out_features!r}")
        if activation not in ACTIVATIONS + ("softmax",):
            raise ArgumentError(f"unknown activation {activation!r}; choose from "
                                f"{', '.join(ACTIVATIONS + ('softmax',))}")
        self.out_features = int(out_features)
        self.activation = activation
        self.param = ACTIVATION_PARAMS.get(activation) if param is None else float(param)
        self.in_features = None
        self.weight = None
        self.bias = None

    def __repr__(self):
        return f"Dense({self.in_features} -> {self.out_features}, {self.activation})"

    def config(self):
        return {"type": "Dense", "out_features": self.out_features,
                "activation": self.activation, "param": self.param}

    def build(self, in_features, device, dtype, rng):
        self.in_features = int(in_features)
        fan_in, fan_out = self.in_features, self.out_features
        if self.activation in _HE:
            w = rng.normal(0.0, np.sqrt(2.0 / fan_in), (fan_out, fan_in))
        else:
            limit = np.sqrt(6.0 / (fan_in + fan_out))
            w = rng.uniform(-limit, limit, (fan_out, fan_in))
        self.weight = clnn.asarray(w.astype(dtype), device=device)
        self.bias = clnn.zeros((fan_out,), dtype, device=device)

    def forward(self, x, out, logits=False):
        """out = f(x W^T + b) in one GEMM with a fused epilogue; ``logits`` stops before
        a softmax (the cross-entropy loss applies it itself)."""
        act = self.activation
        fused = None if act in ("identity", "softmax") else act
        clnn.gemm(x, self.weight, out=out, trans_b=True, bias=self.bias, activation=fused,
                  activation_param=self.param)
        if act == "softmax" and not logits:
            clnn.softmax(out, out=out)
        return out

    def backward_activation(self, delta, a):
        """delta *= f'(z), from the layer's output a = f(z), in place."""
        if self.activation != "identity":
            clnn.activation_backward(self.activation, delta, a=a, out=delta,
                                     param=self.param)
