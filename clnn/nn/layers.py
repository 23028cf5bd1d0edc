"""Layers. A layer is built (given its input shape per example, device, dtype and a
generator) when the network that holds it is made.

The protocol a network drives, batch-first, for output a = f(z):
    plan(in_shape)                 (parameter shapes, output shape), allocating nothing
    state_plan(in_shape, dtype)    {name: (shape, dtype)} of the state a checkpoint keeps
                                   besides the parameters (BatchNorm's running statistics)
    build(in_shape, device, dtype, rng)
    parameters(), parameter_names  the trainable arrays and their names ("weight", "bias")
    state()                        {name: array} of the state of state_plan
    forward(x, out, logits=False, training=False, key=0)
                                   out = a (or z for a softmax output when ``logits``);
                                   ``training`` selects batch statistics and dropout,
                                   ``key`` is this layer's random key for this step
    backward_activation(delta, a, grads=None)
                                   delta = dL/da -> dL/dz, in place; given the layer's
                                   gradients ``grads``, also the bias's where the layer
                                   can sum it in the same pass (Dense, Conv2d): returns
                                   True when it did
    backward(delta, x, dx, grads, ones)
                                   dx = dL/dx from delta = dL/dz (skipped when dx is
                                   None) and grads[i] = the gradient of parameters()[i],
                                   summed over the batch (``ones``: a vector of ones);
                                   by default gradients(), then backward_input(); a
                                   bias gradient that backward_activation wrote is left
                                   out of ``grads`` (the network passes grads[:1])
    activation_to_fuse(), takes_activation
                                   a layer whose backward_input takes ``activation=``
                                   (pooling) applies the derivative the layer below
                                   names (Conv2d: its activation, from its output) in
                                   its own pass; the network then skips that layer's
                                   backward_activation, and its gradients get the
                                   bias's buffer
    after_step()                   once the step has succeeded (BatchNorm moves its
                                   running statistics here, so a failed step keeps them)
The network's optimizer (clnn.optim) then updates every parameter from its gradient,
only after every gradient of the step exists, so a step that fails changes nothing.
Layers without parameters return [] from ``parameters()``; a ``view`` layer (Flatten)
has an output that is a reshaped view of its input.
"""

import numpy as np

import clnn
from ..device import device_of
from ..errors import ArgumentError, ShapeError
from ..programs import acc_dtype
from ..ops._args import finite, probability
from ..ops.elementwise import ACTIVATIONS, ACTIVATION_PARAMS

# He initialisation for the relu family, Xavier/Glorot for the saturating ones.
_HE = ("relu", "leaky_relu", "elu", "softplus")


def _flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{name} must be True or False, got {value!r}")
    return bool(value)


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
    param = None
    parameter_names = ()
    stochastic = False          # takes a random key per training step (Dropout)
    # a training step may replay this layer's kernels without running its Python: its
    # forward and backward leave no Python state that changes from step to step beyond
    # what step_state hands back, and their kernels' arguments stay the same (except a
    # stochastic layer's key, which the network puts into them); a layer says so
    capturable = False

    def parameters(self):
        return []

    def plan(self, in_shape):
        """(shapes of the parameters, output shape per example) for inputs of
        ``in_shape``, without allocating anything (``load`` checks files with it)."""
        raise NotImplementedError

    def state_plan(self, in_shape, dtype):
        return {}

    def state(self):
        return {}

    # whether backward_activation may sum the bias gradient as it goes (a layer whose
    # parameters are (weight, bias), with the bias over delta's axis 1)
    fuses_bias = False
    # whether backward_input takes activation= (the derivative of the activation of the
    # layer below, from its output x, applied in the same pass: pooling)
    takes_activation = False

    def activation_to_fuse(self):
        """(activation, param) that the layer above may apply to this layer's delta in
        its own backward pass (its derivative from this layer's output) instead of
        backward_activation; None where this layer's activation pass must run itself.
        The layer's gradients then get the bias's buffer too."""
        return None

    def backward_activation(self, delta, a, grads=None):
        if self.activation in ("identity", "softmax"):
            return False
        if self.fuses_bias and grads is not None and len(grads) == 2:
            # one pass on GPUs for both (one or two launches where they took two or
            # three: LeNet-5's step 36 -> 32)
            clnn.activation_bias_backward(self.activation, delta, grads[1], a=a,
                                          out=delta, param=self.param)
            return True
        clnn.activation_backward(self.activation, delta, a=a, out=delta, param=self.param)
        return False

    def backward(self, delta, x, dx, grads, ones):
        if grads:
            self.gradients(delta, x, grads, ones)
        if dx is not None:
            self.backward_input(delta, x, dx)

    def backward_input(self, delta, x, dx):
        raise NotImplementedError

    def gradients(self, delta, x, grads, ones):
        pass

    def after_step(self):
        pass

    def step_state(self):
        """The Python state a training step's forward and backward leave for
        after_step (None: none): a replayed step, which runs neither, restores it."""
        return None

    def restore_step_state(self, state):
        pass


class Dense(Layer):
    """a = f(x @ weight.T + bias): weight (out, in) and bias (out,), PyTorch's shapes.

    ``activation``: identity, sigmoid, tanh, relu, leaky_relu, elu, softplus, or softmax
    (output layer only). ``param`` is the leaky_relu slope, elu alpha or softplus beta.
    ``bias=False`` leaves the bias out (as PyTorch's, before a BatchNorm1d). Inputs of more than one
    axis per example, (..., in), map their last axis as PyTorch's Linear: (..., out).
    """
    capturable = True

    def __init__(self, out_features, activation="sigmoid", param=None, bias=True):
        if not isinstance(out_features, (int, np.integer)) or out_features < 1:
            raise ArgumentError(f"out_features must be a positive int, got {out_features!r}")
        _check_activation(activation)
        self.out_features = int(out_features)
        self.use_bias = _flag(bias, "bias")
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
                "activation": self.activation, "param": self.param, "bias": self.use_bias}

    def plan(self, in_shape):
        if len(in_shape) < 1:
            raise ShapeError(f"Dense takes (..., in_features) inputs, got {in_shape}")
        return [(self.out_features, int(in_shape[-1]))] + \
            [(self.out_features,)] * self.use_bias, \
            tuple(int(v) for v in in_shape[:-1]) + (self.out_features,)

    def build(self, in_shape, device, dtype, rng):
        _, out_shape = self.plan(in_shape)
        self.in_features = int(in_shape[-1])
        fan_in, fan_out = self.in_features, self.out_features
        self.weight = _init(rng, self.activation, (fan_out, fan_in), fan_in, fan_out, dtype,
                            device)
        self.bias = clnn.zeros((fan_out,), dtype, device=device) if self.use_bias else None
        self.out_shape = out_shape

    @property
    def parameter_names(self):
        return ("weight", "bias")[:1 + self.use_bias]

    def parameters(self):
        return [self.weight] + [self.bias] * self.use_bias

    def forward(self, x, out, logits=False, training=False, key=0):
        """out = f(x W^T + b) in one GEMM with a fused epilogue; ``logits`` stops before
        a softmax (the cross-entropy loss applies it itself)."""
        act = self.activation
        fused = None if act in ("identity", "softmax") else act
        clnn.gemm(_rows(x), self.weight, out=_rows(out), trans_b=True, bias=self.bias,
                  activation=fused, activation_param=self.param)
        if act == "softmax" and not logits:
            clnn.softmax(out, out=out)
        return out

    def backward_input(self, delta, x, dx):
        clnn.gemm(_rows(delta), self.weight, out=_rows(dx))

    @property
    def fuses_bias(self):
        return self.use_bias and len(self.out_shape) == 1     # delta (batch, out)

    def gradients(self, delta, x, grads, ones):
        clnn.gemm(_rows(delta), _rows(x), out=grads[0], trans_a=True)   # dW = delta^T x
        if len(grads) > 1:                 # (else backward_activation summed it)
            if delta.ndim == 2:
                # db = delta^T 1, summed down the columns: on PoCL 5-8x faster than
                # gemv's (1000 x 5000: 0.73 ms against 3.9), the same kernel on GPUs
                clnn.bias_grad(delta, out=grads[1])
            else:                                   # summed over every leading axis
                clnn.sum(_rows(delta), axis=0, out=grads[1])


def _rows(a):
    """A (batch, ..., n) array as its (rows, n) view (itself when 2-D)."""
    return a if a.ndim == 2 else a.reshape((a.size // a.shape[-1], a.shape[-1]))


class Conv2d(Layer):
    """a = f(conv(x, weight) + bias): weight (M, C / groups, R, S), bias (M,), on
    (C, H, W) inputs. PyTorch's ``dilation`` and ``groups`` (groups = C: depthwise);
    ``bias=False`` leaves the bias out (as PyTorch's, before a BatchNorm2d)."""
    capturable = True

    def __init__(self, out_channels, kernel_size, stride=1, padding=0, activation="relu",
                 param=None, bias=True, dilation=1, groups=1):
        if not isinstance(out_channels, (int, np.integer)) or out_channels < 1:
            raise ArgumentError(f"out_channels must be a positive int, got {out_channels!r}")
        _check_activation(activation)
        if activation == "softmax":
            raise ArgumentError("softmax belongs on a Dense output layer")
        from ..ops._args import pair
        self.out_channels = int(out_channels)
        self.kernel_size = pair(kernel_size, "kernel_size", 1)
        self.stride, self.padding = pair(stride, "stride", 1), pair(padding, "padding", 0)
        self.dilation = pair(dilation, "dilation", 1)
        if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or \
                groups < 1:
            raise ArgumentError(f"groups must be a positive int, got {groups!r}")
        self.groups = int(groups)
        self.activation = activation
        self.param = ACTIVATION_PARAMS.get(activation) if param is None else \
            finite(param, "param")
        self.use_bias = _flag(bias, "bias")
        self.weight = self.bias = None

    def __repr__(self):
        return (f"Conv2d({self.in_shape} -> {self.out_shape}, {self.kernel_size[0]}x"
                f"{self.kernel_size[1]}, {self.activation})")

    def config(self):
        return {"type": "Conv2d", "out_channels": self.out_channels,
                "kernel_size": list(self.kernel_size), "stride": self.stride,
                "padding": self.padding, "activation": self.activation, "param": self.param,
                "bias": self.use_bias, "dilation": self.dilation, "groups": self.groups}

    def plan(self, in_shape):
        from ..ops.conv import conv_geometry, direct_geometry
        if len(in_shape) != 3:
            raise ShapeError(f"Conv2d takes (C, H, W) inputs, got {in_shape} per example")
        C = in_shape[0]
        R, S = self.kernel_size
        if C % self.groups:
            raise ShapeError(f"groups={self.groups} must divide the {C} input channels")
        w = (self.out_channels, C // self.groups, R, S)
        if self.groups == 1 and self.dilation == (1, 1):     # the implicit GEMM's checks
            g = conv_geometry((1,) + tuple(in_shape), w, self.stride, self.padding)
        else:                                                # the direct kernels'
            g = direct_geometry((1,) + tuple(in_shape), w, self.stride, self.padding,
                                self.dilation, self.groups)
        M, P, Q = g[4], g[7], g[8]
        return [w] + [(M,)] * self.use_bias, (M, P, Q)

    def _opts(self):
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation,
                    groups=self.groups)

    def build(self, in_shape, device, dtype, rng):
        _, (M, P, Q) = self.plan(in_shape)
        C = in_shape[0]
        R, S = self.kernel_size
        self.in_shape, self.out_shape = tuple(in_shape), (M, P, Q)
        Cg = C // self.groups
        self.weight = _init(rng, self.activation, (M, Cg, R, S), Cg * R * S,
                            M // self.groups * R * S, dtype, device)
        self.bias = clnn.zeros((M,), dtype, device=device) if self.use_bias else None

    @property
    def parameter_names(self):
        return ("weight", "bias")[:1 + self.use_bias]

    def parameters(self):
        return [self.weight] + [self.bias] * self.use_bias

    def forward(self, x, out, logits=False, training=False, key=0):
        fused = None if self.activation == "identity" else self.activation
        return clnn.conv2d(x, self.weight, self.bias, activation=fused,
                           activation_param=self.param, out=out, **self._opts())

    def backward_input(self, delta, x, dx):
        clnn.conv2d_backward_data(delta, self.weight, x.shape, out=dx, **self._opts())

    def gradients(self, delta, x, grads, ones):
        # the bias gradient (delta summed over batch and positions) where
        # backward_activation left it: in the weight gradient's launches on a GPU's
        # small layers (convw.cl), else by bias_grad first (delta still in the cache
        # from the pass that wrote it, where conv2d_backward_weight's own db= would
        # sum into a temporary and copy it after)
        fused = len(grads) > 1 and self._wgrad_sums_bias(delta)
        if len(grads) > 1 and not fused:
            clnn.bias_grad(delta, out=grads[1])
        clnn.conv2d_backward_weight(delta, x, self.weight.shape, out=grads[0],
                                    db=grads[1] if fused else None, **self._opts())

    @property
    def fuses_bias(self):
        return self.use_bias

    def activation_to_fuse(self):
        # (every activation a layer takes has its derivative from the output: softplus
        # keeps PyTorch's threshold, the layer's param being its beta)
        if self.activation in ("identity", "softmax"):
            return None
        return self.activation, self.param

    def backward_activation(self, delta, a, grads=None):
        if grads is not None and len(grads) == 2 and self._wgrad_sums_bias(delta):
            # the activation's pass alone: one launch on a GPU where, with the bias,
            # it took two or three (its rows' sums, then theirs over the batch)
            return super().backward_activation(delta, a)
        return super().backward_activation(delta, a, grads)

    def _wgrad_sums_bias(self, delta):
        """Whether the weight gradient sums the bias gradient too at delta's shape
        (conv.fuses_bias_gradient), kept for the shape, dtype, device and settings."""
        from ..ops import _memo
        from ..ops.conv import fuses_bias_gradient
        dev = device_of(delta)
        key = (delta.shape, delta.dtype, dev, _memo.settings(dev))
        if key[-1] is None or getattr(self, "_sums_bias", (None,))[0] != key:
            self._sums_bias = (key, fuses_bias_gradient(
                delta, (delta.shape[0],) + tuple(self.in_shape), self.weight.shape,
                **self._opts()))
        return self._sums_bias[1]


class _Pool(Layer):
    mode = None
    capturable = True

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, **options):
        from ..ops._args import pair
        self.kernel_size = pair(kernel_size, "kernel_size", 1)
        self.stride = None if stride is None else pair(stride, "stride", 1)
        self.padding = pair(padding, "padding", 0)
        self.ceil_mode = _flag(ceil_mode, "ceil_mode")
        self.options = options          # checked by plan (pool_geometry, _divisor)

    def __repr__(self):
        return f"{type(self).__name__}({self.kernel_size}, stride={self.stride})"

    def config(self):
        return dict({"type": type(self).__name__, "kernel_size": self.kernel_size,
                     "stride": self.stride, "padding": self.padding,
                     "ceil_mode": self.ceil_mode}, **self.options)

    def plan(self, in_shape):
        from ..ops.pool import _divisor, pool_geometry
        if len(in_shape) != 3:
            raise ShapeError(f"{type(self).__name__} takes (C, H, W) inputs, got {in_shape}")
        if self.mode == "avg":
            _divisor(self.options["count_include_pad"], self.options["divisor_override"])
        _, C, _, _, P, Q, _, _, _, _ = pool_geometry(
            (1,) + tuple(in_shape), self.kernel_size, self.stride, self.padding,
            self.options.get("dilation", 1), self.ceil_mode)
        return [], (C, P, Q)

    def build(self, in_shape, device, dtype, rng):
        self.in_shape, self.out_shape = tuple(in_shape), self.plan(in_shape)[1]

    def forward(self, x, out, logits=False, training=False, key=0):
        fwd = clnn.max_pool2d if self.mode == "max" else clnn.avg_pool2d
        return fwd(x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode,
                   out=out, **self.options)

    takes_activation = True

    def backward_input(self, delta, x, dx, activation=None):
        """dx, times the derivative of ``activation`` = (name, param) of the layer
        below (whose output x is) where given: that layer's activation pass, here."""
        bwd = clnn.max_pool2d_backward if self.mode == "max" else clnn.avg_pool2d_backward
        name, param = activation or (None, None)
        bwd(delta, x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode,
            out=dx, activation=name, activation_param=param, **self.options)


class MaxPool2d(_Pool):
    """Max over k x k windows (stride defaults to k); ties go to the first maximum.
    PyTorch's ``dilation`` and ``ceil_mode``."""
    mode = "max"

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        from ..ops._args import pair
        super().__init__(kernel_size, stride, padding, ceil_mode,
                         dilation=pair(dilation, "dilation", 1))


class AvgPool2d(_Pool):
    """Mean over k x k windows (stride defaults to k); PyTorch's ``ceil_mode``,
    ``count_include_pad`` and ``divisor_override``."""
    mode = "avg"

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__(kernel_size, stride, padding, ceil_mode,
                         count_include_pad=count_include_pad,
                         divisor_override=divisor_override)


class Flatten(Layer):
    """(C, H, W) -> (C*H*W,): a reshaped view, no copy."""
    capturable = True
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

    def forward(self, x, out=None, logits=False, training=False, key=0):
        return x.reshape((x.shape[0],) + self.out_shape)

    def backward_input(self, delta, x, dx):
        pass              # dx is delta, seen with the input's shape


class Dropout(Layer):
    """Zeroes each element with probability ``p`` in training and scales the others by
    1/(1-p) (PyTorch's inverted dropout); the identity in ``predict`` and ``evaluate``.

    The mask is a hash of the network's seed, the layer's index and the step number
    (clnn.dropout_key), never stored: the backward pass recomputes it, a run with one
    seed repeats bitwise, and a run resumed from a checkpoint draws the masks the
    uninterrupted run would have drawn.
    """

    stochastic = True
    capturable = True           # (replayed steps get each step's key: Network)

    def __init__(self, p=0.5):
        self.p = probability(p, "dropout probability p")
        self._key = None

    def __repr__(self):
        return f"Dropout(p={self.p})"

    def config(self):
        return {"type": "Dropout", "p": self.p}

    def plan(self, in_shape):
        return [], tuple(in_shape)

    def build(self, in_shape, device, dtype, rng):
        self.in_shape = self.out_shape = tuple(in_shape)

    def forward(self, x, out, logits=False, training=False, key=0):
        if not training or self.p == 0:
            self._key = None
            return clnn.copy(x, out=out)
        self._key = key
        return clnn.dropout(x, self.p, key, out=out)

    def backward_input(self, delta, x, dx):
        if self._key is None:                # p = 0: the identity
            clnn.copy(delta, out=dx)
        else:                                # the same key drops the same elements
            clnn.dropout(delta, self.p, self._key, out=dx)


class _BatchNorm(Layer):
    """Normalises each channel with the batch's mean and variance in training and with
    running statistics in ``predict``/``evaluate``, then y = f(weight x-hat + bias).

    PyTorch's arguments and conventions: ``eps``; ``momentum`` (running = (1 -
    momentum) running + momentum batch statistic, the variance unbiased; None: the
    cumulative average); ``affine`` (learned weight and bias, initialised to 1 and 0).
    ``activation`` (with ``param``) is applied in the same pass, where PyTorch would
    have a separate activation layer. The running statistics move only once a training
    step has succeeded, and are saved in checkpoints.
    """
    _dims = None
    batch_statistics = True     # training needs two or more values per channel
    capturable = True           # (the batch's count for after_step: step_state)

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 activation="identity", param=None):
        if not isinstance(num_features, (int, np.integer)) or isinstance(num_features, bool) \
                or num_features < 1:
            raise ArgumentError(f"num_features must be a positive int, got {num_features!r}")
        _check_activation(activation)
        if activation == "softmax":
            raise ArgumentError("softmax belongs on a Dense output layer")
        self.num_features = int(num_features)
        self.eps = finite(eps, "eps")
        if self.eps <= 0:
            raise ArgumentError(f"eps must be positive, got {eps}")
        if momentum is not None:
            momentum = finite(momentum, "momentum")
            if not 0 <= momentum <= 1:
                raise ArgumentError(f"momentum must lie in [0, 1] or be None, got {momentum}")
        self.momentum = momentum
        self.affine = _flag(affine, "affine")
        self.activation = activation
        self.param = ACTIVATION_PARAMS.get(activation) if param is None else \
            finite(param, "param")
        self.weight = self.bias = self.running_mean = self.running_var = None
        self.num_batches_tracked = 0
        self._count = None            # values per channel of the last training forward

    def __repr__(self):
        return f"{type(self).__name__}({self.num_features}, {self.activation})"

    def config(self):
        return {"type": type(self).__name__, "num_features": self.num_features,
                "eps": self.eps, "momentum": self.momentum, "affine": self.affine,
                "activation": self.activation, "param": self.param}

    @property
    def parameter_names(self):
        return ("weight", "bias") if self.affine else ()

    def plan(self, in_shape):
        name = type(self).__name__
        if len(in_shape) not in self._dims:
            raise ShapeError(f"{name} takes inputs of {' or '.join(map(str, self._dims))} "
                             f"axes per example, got {tuple(in_shape)}")
        if in_shape[0] != self.num_features:
            raise ShapeError(f"{name}({self.num_features}) got {in_shape[0]} channels "
                             f"(input {tuple(in_shape)} per example)")
        C = self.num_features
        return [(C,), (C,)] if self.affine else [], tuple(in_shape)

    def state_plan(self, in_shape, dtype):
        acc = acc_dtype(dtype)
        C = self.plan(in_shape)[1][0]
        return {"running_mean": ((C,), acc), "running_var": ((C,), acc),
                "num_batches_tracked": ((), np.dtype(np.int64))}

    def build(self, in_shape, device, dtype, rng):
        _, self.out_shape = self.plan(in_shape)
        self.in_shape = tuple(in_shape)
        C = self.num_features
        acc = acc_dtype(dtype)
        if self.affine:
            self.weight = clnn.asarray(np.ones(C, dtype), device=device)
            self.bias = clnn.zeros((C,), dtype, device=device)
        self.running_mean = clnn.zeros((C,), acc, device=device)
        self.running_var = clnn.asarray(np.ones(C, acc), device=device)
        self._save = clnn.empty((2, C), acc, device=device)   # the batch's mean, var

    def parameters(self):
        return [self.weight, self.bias] if self.affine else []

    def state(self):
        return {"running_mean": self.running_mean, "running_var": self.running_var,
                "num_batches_tracked": self.num_batches_tracked}

    def load_state(self, values):
        self.running_mean.set(np.ascontiguousarray(values["running_mean"]))
        self.running_var.set(np.ascontiguousarray(values["running_var"]))
        self.num_batches_tracked = int(values["num_batches_tracked"])

    def forward(self, x, out, logits=False, training=False, key=0):
        act = None if self.activation == "identity" else self.activation
        w, b = (self.weight, self.bias) if self.affine else (None, None)
        if training:
            # the batch's statistics into _save; the running ones move in after_step
            clnn.batch_norm(x, None, None, w, b, training=True, eps=self.eps,
                            activation=act, activation_param=self.param, out=out,
                            save=self._save)
            self._count = x.size // self.num_features
            return out
        return clnn.batch_norm(x, self.running_mean, self.running_var, w, b,
                               training=False, eps=self.eps, activation=act,
                               activation_param=self.param, out=out)

    def backward(self, delta, x, dx, grads, ones):
        clnn.batch_norm_backward(delta, x, self._save, self.weight, eps=self.eps, dx=dx,
                                 dweight=grads[0] if grads else None,
                                 dbias=grads[1] if grads else None,
                                 need_dx=dx is not None)

    def step_state(self):
        return self._count

    def restore_step_state(self, state):
        self._count = state

    def after_step(self):
        if self._count is None:
            return
        count, self._count = self._count, None
        self.num_batches_tracked += 1
        factor = 1.0 / self.num_batches_tracked if self.momentum is None else self.momentum
        clnn.update_running_stats(self.running_mean, self.running_var, self._save, factor,
                                  count)


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (C,) or (C, L) inputs per example (PyTorch's
    BatchNorm1d): statistics per feature C over the batch (and L)."""
    _dims = (1, 2)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of (C, H, W) inputs (PyTorch's BatchNorm2d): statistics per
    channel over the batch and every position."""
    _dims = (3,)


LAYER_TYPES = {"Dense": Dense, "Conv2d": Conv2d, "MaxPool2d": MaxPool2d,
               "AvgPool2d": AvgPool2d, "Flatten": Flatten, "Dropout": Dropout,
               "BatchNorm1d": BatchNorm1d, "BatchNorm2d": BatchNorm2d}


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
