"""Layers. A layer is built (given its input shape per example, device, dtype and a
generator) when the network that holds it is made.

The protocol a network drives, batch-first, for output a = f(z):
    plan(in_shape)                 (parameter shapes, output shape), allocating nothing
    forward(x, out, logits)        out = a (or z for a softmax output when ``logits``)
    backward_activation(delta, a)  delta = dL/da -> dL/dz, in place
    backward_input(delta, x, dx)   dx = dL/dx from delta = dL/dz (the layer's linear part)
    gradients(delta, x, grads, ones)
                                   grads[i] = the gradient of parameters()[i], summed
                                   over the batch (``ones``: a vector of batch ones)
The network's optimizer (clnn.optim) then updates every parameter from its gradient,
only after every gradient of the step exists, so a step that fails changes nothing.
Layers without parameters return [] from ``parameters()``; a ``view`` layer (Flatten)
has an output that is a reshaped view of its input.
"""

import numpy as np

import clnn
from ..errors import ArgumentError, ShapeError
from ..ops._args import finite
from ..ops.elementwise import ACTIVATIONS, ACTIVATION_PARAMS

# He initialisation for the relu family, Xavier/Glorot for the saturating ones.
_HE = ("relu", "leaky_relu", "elu", "softplus")


def _check_activation(activation):
    if activation not in ACTIVATIONS + ("softmax",):
        raise ArgumentError(f"unknown activation {activation!r}; choose from "
                            f"{', '.join(ACTIVATIONS + ('softmax',))}")


def _init(rng, activation, shape, fan_in, fan_out, dtype, device):
    if rng is None:                  # the caller sets the weights (load)
        return clnn.empty(shape, dtype, device=device)
    if activation in _HE:
        w = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
    else:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        w = rng.uniform(-limit, limit, shape)
    return clnn.asarray(w.astype(dtype), device=device)


class Layer:
    view = False
    activation = "identity"

    def parameters(self):
        return []

    def plan(self, in_shape):
        """(shapes of the parameters, output shape per example) for inputs of
        ``in_shape``, without allocating anything (``load`` checks files with it)."""
        raise NotImplementedError


    def backward_activation(self, delta, a):
        if self.activation not in ("identity", "softmax"):
            clnn.activation_backward(self.activation, delta, a=a, out=delta,
                                     param=self.param)

    def gradients(self, delta, x, grads, ones):
        pass


class Dense(Layer):
    """a = f(x @ weight.T + bias): weight (out, in) and bias (out,), PyTorch's shapes.

    ``activation``: identity, sigmoid, tanh, relu, leaky_relu, elu, softplus, or softmax
    (output layer only). ``param`` is the leaky_relu slope or elu alpha.
    """

    def __init__(self, out_features, activation="sigmoid", param=None):
        if not isinstance(out_features, (int, np.integer)) or out_features < 1:
            raise ArgumentError(f"out_features must be a positive int, got {out_features!r}")
        _check_activation(activation)
        self.out_features = int(out_features)
        self.activation = activation
        self.param = ACTIVATION_PARAMS.get(activation) if param is None else \
            finite(param, "param")
        self.in_features = None
        self.weight = None
        self.bias = None

    def __repr__(self):
        return f"Dense({self.in_features} -> {self.out_features}, {self.activation})"

    def config(self):
        return {"type": "Dense", "out_features": self.out_features,
                "activation": self.activation, "param": self.param}

    def plan(self, in_shape):
        if len(in_shape) != 1:
            raise ShapeError(f"Dense takes flat inputs, got {in_shape} per example: put a "
                             "Flatten() before it")
        return [(self.out_features, int(in_shape[0])), (self.out_features,)], \
            (self.out_features,)

    def build(self, in_shape, device, dtype, rng):
        self.plan(in_shape)
        self.in_features = int(in_shape[0])
        fan_in, fan_out = self.in_features, self.out_features
        self.weight = _init(rng, self.activation, (fan_out, fan_in), fan_in, fan_out, dtype,
                            device)
        self.bias = clnn.zeros((fan_out,), dtype, device=device)
        self.out_shape = (self.out_features,)

    def parameters(self):
        return [self.weight, self.bias]

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

    def backward_input(self, delta, x, dx):
        clnn.gemm(delta, self.weight, out=dx)

    def gradients(self, delta, x, grads, ones):
        g_w, g_b = grads
        clnn.gemm(delta, x, out=g_w, trans_a=True)          # dW = delta^T x
        clnn.gemv(delta, ones, g_b, trans_a=True)           # db = delta^T 1


class Conv2d(Layer):
    """a = f(conv(x, weight) + bias): weight (M, C, R, S), bias (M,), on (C, H, W) inputs."""

    def __init__(self, out_channels, kernel_size, stride=1, padding=0, activation="relu",
                 param=None):
        if not isinstance(out_channels, (int, np.integer)) or out_channels < 1:
            raise ArgumentError(f"out_channels must be a positive int, got {out_channels!r}")
        _check_activation(activation)
        if activation == "softmax":
            raise ArgumentError("softmax belongs on a Dense output layer")
        from ..ops._args import pair
        self.out_channels = int(out_channels)
        self.kernel_size = pair(kernel_size, "kernel_size", 1)
        self.stride, self.padding = pair(stride, "stride", 1), pair(padding, "padding", 0)
        self.activation = activation
        self.param = ACTIVATION_PARAMS.get(activation) if param is None else \
            finite(param, "param")
        self.weight = self.bias = None

    def __repr__(self):
        return (f"Conv2d({self.in_shape} -> {self.out_shape}, {self.kernel_size[0]}x"
                f"{self.kernel_size[1]}, {self.activation})")

    def config(self):
        return {"type": "Conv2d", "out_channels": self.out_channels,
                "kernel_size": list(self.kernel_size), "stride": self.stride,
                "padding": self.padding, "activation": self.activation, "param": self.param}

    def plan(self, in_shape):
        from ..ops.conv import conv_geometry
        if len(in_shape) != 3:
            raise ShapeError(f"Conv2d takes (C, H, W) inputs, got {in_shape} per example")
        C = in_shape[0]
        R, S = self.kernel_size
        _, _, _, _, M, _, _, P, Q, _, _ = conv_geometry((1,) + tuple(in_shape),
                                                        (self.out_channels, C, R, S),
                                                        self.stride, self.padding)
        return [(M, C, R, S), (M,)], (M, P, Q)

    def build(self, in_shape, device, dtype, rng):
        _, (M, P, Q) = self.plan(in_shape)
        C = in_shape[0]
        R, S = self.kernel_size
        self.in_shape, self.out_shape = tuple(in_shape), (M, P, Q)
        self.weight = _init(rng, self.activation, (M, C, R, S), C * R * S, M * R * S, dtype,
                            device)
        self.bias = clnn.zeros((M,), dtype, device=device)

    def parameters(self):
        return [self.weight, self.bias]

    def forward(self, x, out, logits=False):
        fused = None if self.activation == "identity" else self.activation
        return clnn.conv2d(x, self.weight, self.bias, stride=self.stride,
                           padding=self.padding, activation=fused,
                           activation_param=self.param, out=out)

    def backward_input(self, delta, x, dx):
        clnn.conv2d_backward_data(delta, self.weight, x.shape, stride=self.stride,
                                  padding=self.padding, out=dx)

    def gradients(self, delta, x, grads, ones):
        g_w, g_b = grads
        clnn.conv2d_backward_weight(delta, x, self.weight.shape, stride=self.stride,
                                    padding=self.padding, out=g_w)
        clnn.bias_grad(delta, out=g_b)       # delta summed over batch and positions


class _Pool(Layer):
    mode = None

    def __init__(self, kernel_size, stride=None, padding=0):
        from ..ops._args import pair
        self.kernel_size = pair(kernel_size, "kernel_size", 1)
        self.stride = None if stride is None else pair(stride, "stride", 1)
        self.padding = pair(padding, "padding", 0)

    def __repr__(self):
        return f"{type(self).__name__}({self.kernel_size}, stride={self.stride})"

    def config(self):
        return {"type": type(self).__name__, "kernel_size": self.kernel_size,
                "stride": self.stride, "padding": self.padding}

    def plan(self, in_shape):
        from ..ops.pool import pool_geometry
        if len(in_shape) != 3:
            raise ShapeError(f"{type(self).__name__} takes (C, H, W) inputs, got {in_shape}")
        _, C, _, _, P, Q, _, _, _ = pool_geometry((1,) + tuple(in_shape), self.kernel_size,
                                                  self.stride, self.padding)
        return [], (C, P, Q)

    def build(self, in_shape, device, dtype, rng):
        self.in_shape, self.out_shape = tuple(in_shape), self.plan(in_shape)[1]

    def forward(self, x, out, logits=False):
        fwd = clnn.max_pool2d if self.mode == "max" else clnn.avg_pool2d
        return fwd(x, self.kernel_size, self.stride, self.padding, out=out)

    def backward_input(self, delta, x, dx):
        bwd = clnn.max_pool2d_backward if self.mode == "max" else clnn.avg_pool2d_backward
        bwd(delta, x, self.kernel_size, self.stride, self.padding, out=dx)


class MaxPool2d(_Pool):
    """Max over k x k windows (stride defaults to k); ties go to the first maximum."""
    mode = "max"


class AvgPool2d(_Pool):
    """Mean over k x k windows (stride defaults to k)."""
    mode = "avg"


class Flatten(Layer):
    """(C, H, W) -> (C*H*W,): a reshaped view, no copy."""
    view = True

    def __repr__(self):
        return "Flatten()"

    def config(self):
        return {"type": "Flatten"}

    def plan(self, in_shape):
        return [], (int(np.prod(in_shape)),)

    def build(self, in_shape, device, dtype, rng):
        self.in_shape = tuple(in_shape)
        self.out_shape = self.plan(in_shape)[1]

    def forward(self, x, out=None, logits=False):
        return x.reshape((x.shape[0],) + self.out_shape)

    def backward_input(self, delta, x, dx):
        pass              # dx is delta, seen with the input's shape


LAYER_TYPES = {"Dense": Dense, "Conv2d": Conv2d, "MaxPool2d": MaxPool2d,
               "AvgPool2d": AvgPool2d, "Flatten": Flatten}


def from_config(cfg):
    if not isinstance(cfg, dict):
        raise ArgumentError(f"a layer's configuration must be a mapping, got {cfg!r}")
    cfg = dict(cfg)
    kind = LAYER_TYPES.get(cfg.pop("type", None)) if isinstance(cfg.get("type"), str) \
        else None
    if kind is None:
        raise ArgumentError(f"unknown layer type in {cfg}")
    try:
        return kind(**cfg)
    except TypeError as exc:          # unknown or missing keyword
        raise ArgumentError(f"bad {kind.__name__} configuration {cfg}: {exc}") from None
