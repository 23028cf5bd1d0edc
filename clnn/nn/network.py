"""Sequential networks: inference, training with preallocated workspaces, sgd, fit,
save and load.

The backward pass follows the tutorial's four equations, batch-first:
    delta_L = dL/da_L (.) f'(z_L)              (fused into the loss for softmax + CE)
    delta_l = (delta_{l+1} W_{l+1}) (.) f'(z_l)
    dW_l    = delta_l^T a_{l-1},   db_l = sum over the batch of delta_l
Deltas are kept unscaled (the loss gradient without 1/batch), so are the gradients
(sums over the batch), and 1/batch is folded into the update's step = -lr/batch. A
step computes every delta and gradient first and updates the parameters last.
"""

import contextlib
import functools
import json
import os
import stat
import sys
import tempfile
import threading
import time
import zipfile

import numpy as np
import pyopencl.array as cla

import clnn
from ..device import device as _device, is_floating
from ..ops.xent import cross_entropy_parts
from .. import optim
from ..errors import ArgumentError, CheckpointError, ShapeError
from ..ops import _memo, optim as optim_ops
from ..ops._args import INT_MAX, dev_empty
from ..ops.dropout import dropout_key, dropout_key_at
from ..programs import dtype_name
from . import amp
from .layers import Layer, from_config
from .losses import CrossEntropyLoss

LOSSES = ("quadratic", "cross_entropy")


class _Workspace:
    """Everything one training step needs for one batch size, allocated once."""

    def __init__(self, net, batch, dtype=None):
        dev, dt = net.device, np.dtype(net.dtype if dtype is None else dtype)
        self.batch, self.dtype = batch, dt
        self.cast = {}                  # a float16 step's copies of x and y
        self.a, self.delta = [], []
        for i, layer in enumerate(net.layers):
            shape = (batch,) + layer.out_shape
            if layer.view and i > 0:
                # Flatten: the same memory as the layer below, seen with another shape
                self.a.append(self.a[-1].reshape(shape))
                self.delta.append(self.delta[-1].reshape(shape))
            else:
                self.a.append(None if layer.view else clnn.empty(shape, dt, dev))
                self.delta.append(clnn.empty(shape, dt, dev))
        self.ones = clnn.asarray(np.ones(batch, dt), device=dev)


class _Replay:
    """A captured forward and backward pass: seen once (``launches`` None), then
    captured on the next step with the same key, replayed from then on."""

    def __init__(self):
        self.launches = self.value = self.grad_scale = self.states = None
        self.patches = ()               # (launch, argument, layer) of dropout keys
        self.disabled = False           # capturing ran out of memory: never again
        self.graph = None               # its command buffers (cmdbuf.replay), if any


def _ident(a):
    """What a replayed step's kernels know of an array: its buffer, offset and layout."""
    return (a.base_data.int_ptr, a.offset, a.shape, a.strides, a.dtype.str)


REPLAYS = 2         # captured steps a network keeps (a full batch and the last one)


def _locked(method):
    """Run a network's method holding its lock (see Sequential.__init__)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return run


class _InferReplay:
    """A captured inference pass: seen once (``launches`` None), then captured with
    its input copied into ``x`` and its output written to ``out``, replayed from then
    on (see Sequential._run)."""

    def __init__(self, bufs):
        self.bufs = bufs                # the work buffers its launches read
        self.launches = self.x = self.out = None
        self.disabled = False           # capturing ran out of memory: never again
        self.graph = None               # its command buffers (cmdbuf.replay), if any


class GradientStep:
    """What a training step's hook sees: ``params`` and their ``grads`` (tuples of
    device arrays, gradients summed over the batch; change them in place), the same as
    one flat buffer each (``flat_params``, ``flat_grads``: every parameter is a view
    into the first, every gradient into the second, at the same offsets), the
    ``grad_scale`` the optimizer will multiply them by (1/batch), and ``skip`` (set it
    to apply no update this step)."""

    def __init__(self, params, grads, grad_scale, flat_params=None, flat_grads=None):
        self.params, self.grads, self.grad_scale = tuple(params), tuple(grads), grad_scale
        self.flat_params, self.flat_grads = flat_params, flat_grads
        self.skip = False


# Parameters start at multiples of this many elements in the flat buffer (128 bytes
# for float32): the alignment GEMM's vector loads want.
_ALIGN = 32


class Sequential:
    """A stack of layers on one device.

    ``Sequential([Dense(64, "relu"), Dense(10, "softmax")], in_features=784)`` for flat
    inputs, or ``in_shape=(C, H, W)`` for images (with Conv2d, pooling and Flatten).
    A layer object belongs to one network. ``seed`` makes the initial weights and
    every Dropout mask repeat (without one, a seed is drawn and kept in ``seed``);
    ``steps`` counts the training steps taken. ``initialize=False`` leaves the weights
    unset (``load`` fills them from a file).
    """

    def __init__(self, layers, in_features=None, device=None, dtype=np.float32, seed=None,
                 in_shape=None, initialize=True):
        self.device = _device(device)
        self.dtype = self.device.check_dtype(dtype, "network")
        self.layers = list(layers)
        if (in_features is None) == (in_shape is None):
            raise ArgumentError("give in_features (flat inputs) or in_shape=(C, H, W)")
        self.in_shape = (int(in_features),) if in_shape is None else \
            tuple(int(v) for v in in_shape)
        if not self.layers:
            raise ArgumentError("a network needs at least one layer")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, Layer):
                raise ArgumentError(f"layer {i} is a {type(layer).__name__}, not a layer")
            if layer.activation == "softmax" and i != len(self.layers) - 1:
                raise ArgumentError("softmax is for the output layer only")
        for i, layer in enumerate(self.layers):
            if getattr(layer, "_network", None) is not None or \
                    any(layer is other for other in self.layers[:i]):
                raise ArgumentError(f"layer {i} ({type(layer).__name__}) already belongs to "
                                    "a network: building it again would replace that "
                                    "network's weights; make a new layer object")
        shape = self.in_shape
        for layer in self.layers:        # every shape checked before anything is built
            shape = layer.plan(shape)[1]
        if seed is None:
            seed = np.random.SeedSequence().entropy
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ArgumentError(f"seed must be an int >= 0, got {seed!r}")
        self.seed = int(seed) & ((1 << 63) - 1)      # JSON and the dropout key take it
        self.steps = 0
        rng = np.random.default_rng(self.seed) if initialize else None
        shape = self.in_shape
        for layer in self.layers:
            layer.build(shape, self.device, self.dtype, rng)
            layer._network = True
            shape = layer.out_shape
        self.out_shape = shape
        self.out_features = int(np.prod(shape))
        self._flatten_parameters()
        trainable = [i for i, l in enumerate(self.layers) if l.parameters()]
        self._first_trainable = trainable[0] if trainable else len(self.layers)
        # one thread at a time in a network's passes: they share work buffers,
        # captures and staging buffers (two threads' predict calls would interleave
        # their layers through the same buffers on the device's one queue)
        self._lock = threading.RLock()
        self._infer = {}            # (batch, dtype) -> two ping-pong buffers
        self._infer_replays = {}    # replay key -> _InferReplay (an inference pass)
        self._train = {}            # batch -> _Workspace
        self._grads = None          # per layer: a gradient buffer per parameter
        self.optimizer = None       # a clnn.optim optimizer, set by fit or train_step
        self.scaler = None          # the GradScaler of float16 steps (amp.py)
        self._half = None           # their float16 parameters and gradients
        self._half_fresh = None     # the fit epoch whose last update wrote _half.params
        self._replays = {}          # replay key -> _Replay (train_step(replay=True))
        self._stages = {}           # fit's fixed batch buffers, for replayed steps

    def _flatten_parameters(self):
        """Move every parameter into one buffer, ``flat_parameters`` (each layer's
        weight and bias become views into it), so an optimizer updates all of them
        with one kernel launch, and a step's gradients can go to one buffer too (for
        a hook that sums them across processes)."""
        layout, total = [], 0
        for layer in self.layers:
            for name, p in zip(layer.parameter_names, layer.parameters()):
                layout.append((layer, name, tuple(p.shape), total, p.size))
                total += -(-p.size // _ALIGN) * _ALIGN
        self._layout, self.flat_parameters, self.flat_gradients = layout, None, None
        if not total:
            return
        flat = clnn.zeros((total,), self.dtype, self.device)   # padding stays 0
        for layer, name, shape, off, n in layout:
            view = flat[off:off + n].reshape(shape)
            clnn.copy(getattr(layer, name), out=view)
            setattr(layer, name, view)
        self.flat_parameters = flat

    @property
    def in_features(self):
        return int(np.prod(self.in_shape))

    def __repr__(self):
        def step(l):
            shape = "x".join(map(str, l.out_shape))
            return f"{shape} {l.activation}" if l.parameters() else \
                f"{shape} ({type(l).__name__})"
        return (f"Sequential({'x'.join(map(str, self.in_shape))} -> "
                f"{' -> '.join(step(l) for l in self.layers)}, {self.dtype.name} on "
                f"{self.device.name})")

    # ------------------------------------------------------------ inputs
    def _input(self, x, name="x", dtype=None):
        """x as a device array of shape (batch, in_features), checked for NaN/inf, stored
        in ``dtype`` (default the network's; float16 or bfloat16 for mixed precision,
        checked finite there)."""
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        if isinstance(x, cla.Array):
            if clnn.device_of(x) is not self.device:
                raise clnn.DeviceError(f"{name} is on {clnn.device_of(x).name}, the network "
                                       f"on {self.device.name}")
            if x.dtype != dtype:
                raise clnn.DTypeError(f"{name} has dtype {x.dtype}, expected {dtype}")
            arr = x
        else:
            host = np.asarray(x)
            if host.dtype.kind not in "iu" and not is_floating(host.dtype):
                raise clnn.DTypeError(f"{name} must hold numbers, has dtype {host.dtype}")
            arr = None
        shape = arr.shape if arr is not None else host.shape
        if tuple(shape[1:]) == self.in_shape and shape[0] == 0:   # (in_shape is not ())
            raise ShapeError(f"{name} is an empty batch (shape {shape}): a batch holds at "
                             "least one example")
        if tuple(shape[1:]) != self.in_shape or len(shape) < 2 or shape[0] < 1:
            raise ShapeError(f"{name} must have shape (batch, "
                             f"{', '.join(map(str, self.in_shape))}), has {shape}")
        if arr is None:
            # checked in the stored dtype: 1e39 is finite in float64, inf in float32
            with np.errstate(over="ignore"):
                host = host.astype(dtype, copy=False)
            if not np.all(np.isfinite(host)):
                raise ArgumentError(f"{name} contains NaN or infinite values (in "
                                    f"{dtype.name})")
            return clnn.asarray(host, device=self.device)
        if not arr.flags.c_contiguous:
            raise ShapeError(f"{name} must be C-contiguous")
        if clnn.count_nonfinite(arr):
            raise ArgumentError(f"{name} contains NaN or infinite values")
        return arr

    def _labels(self, y, batch, loss):
        """Class labels as a device int32 (batch,) array, for a CrossEntropyLoss: in
        0..classes-1 or its ignore_index."""
        if isinstance(y, cla.Array):
            if y.shape != (batch,) or y.dtype != np.int32:
                raise ShapeError(f"labels must be a ({batch},) int32 array, are {y.shape} "
                                 f"{y.dtype}")
            return y
        host = np.asarray(y)
        if host.shape != (batch,) or host.dtype.kind not in "iu":
            raise ShapeError(f"CrossEntropyLoss takes ({batch},) integer labels, got "
                             f"{host.shape} {host.dtype}")
        bad = (host != loss.ignore_index) & ((host < 0) | (host >= self.out_features))
        if np.any(bad):
            raise ShapeError(f"labels must lie in 0..{self.out_features - 1} or be "
                             f"ignore_index ({loss.ignore_index})")
        return clnn.asarray(host.astype(np.int32), device=self.device)

    def _loss_weight(self, loss, dtype=None):
        """The loss's class weights on the device (kept per loss object and dtype), or
        None."""
        if loss.weight is None:
            return None
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        cache = self.__dict__.setdefault("_loss_weights", {})
        w = cache.get((id(loss), dtype.name))
        if w is None or w[0] is not loss:
            w = cache[id(loss), dtype.name] = (loss, clnn.asarray(loss.weight.astype(dtype),
                                                                  device=self.device))
        return w[1]

    def _targets(self, y, batch, loss=None, dtype=None):
        """y as a device (batch, out_features) array of ``dtype`` (default the
        network's): targets, or int class labels (for a CrossEntropyLoss: the labels
        themselves, int32)."""
        if isinstance(loss, CrossEntropyLoss):
            return self._labels(y, batch, loss)
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        if isinstance(y, cla.Array):
            if y.shape != (batch, self.out_features) or y.dtype != dtype:
                raise ShapeError(f"y must be a ({batch}, {self.out_features}) {dtype} "
                                 f"array, is {y.shape} {y.dtype}")
            if clnn.device_of(y) is not self.device:
                raise clnn.DeviceError(f"y is on {clnn.device_of(y).name}, the network "
                                       f"on {self.device.name}")
            if not y.flags.c_contiguous:
                raise ShapeError("y must be C-contiguous")
            if clnn.count_nonfinite(y):
                raise ArgumentError("y contains NaN or infinite values")
            return y
        host = np.asarray(y)
        if host.ndim == 1 and host.dtype.kind in "iu":
            if host.shape[0] != batch:
                raise ShapeError(f"{host.shape[0]} labels for {batch} inputs")
            if host.size and (host.min() < 0 or host.max() >= self.out_features):
                raise ShapeError(f"labels must lie in 0..{self.out_features - 1}")
            host = clnn.datasets.one_hot(host, self.out_features, dtype)
        if host.shape != (batch, self.out_features):
            raise ShapeError(f"y must have shape ({batch}, {self.out_features}) or be "
                             f"({batch},) integer labels, has {host.shape}")
        if host.dtype.kind not in "iub" and not is_floating(host.dtype):
            raise clnn.DTypeError(f"y must hold numbers, has dtype {host.dtype}")
        with np.errstate(over="ignore"):
            host = host.astype(dtype, copy=False)
        if not np.all(np.isfinite(host)):
            raise ArgumentError(f"y contains NaN or infinite values (in {dtype.name})")
        return clnn.asarray(host, device=self.device)

    # ------------------------------------------------------------ inference
    @_locked
    def __call__(self, x):
        """The network's output for a batch, as a device array (a new one per call).

        Hidden activations alternate between two work buffers kept per batch size, as
        the tutorial's inference network does.
        """
        return self._run(self._input(x))

    def _run(self, x, logits=False):
        """The forward pass in evaluation mode on a checked device batch (the last
        layer stops before its softmax with ``logits``), in x's dtype (float16 with the
        layers bound to their float16 copy, for a mixed-precision evaluation); a new
        array.

        Replayed as training steps are: the second pass with the same batch size,
        dtype, parameter arrays and settings is captured (its input copied into a
        fixed buffer first, its output written to a fixed one), and later passes copy
        their input in, enqueue the captured launches and copy the output out, without
        the Python of the layers and ops (most of a small batch's time)."""
        batch, dtype = x.shape[0], x.dtype
        key = (batch, dtype.name)
        if key not in self._infer:
            # work buffers for two batch sizes at most (evaluate's and its last batch's)
            while len(self._infer) >= REPLAYS:
                old = self._infer.pop(next(iter(self._infer)))
                self._infer_replays = {k: r for k, r in self._infer_replays.items()
                                       if r.bufs is not old}   # (they read the old ones)
            width = max([int(np.prod(l.out_shape)) for l in self.layers[:-1] if not l.view]
                        + [1])
            self._infer[key] = [clnn.empty((batch * width,), dtype, self.device)
                                for _ in range(2)]
        bufs = self._infer[key]
        rkey = self._infer_key(x, logits)
        rep = self._infer_replays.get(rkey) if rkey is not None else None
        if rep is None or rep.disabled:
            if rep is None and rkey is not None:     # seen once: captured next time
                while len(self._infer_replays) >= 2 * REPLAYS:
                    self._infer_replays.pop(next(iter(self._infer_replays)))
                self._infer_replays[rkey] = _InferReplay(bufs)
            return self._forward_eval(x, bufs, logits)
        from .. import cmdbuf, programs
        if rep.launches is None:
            try:
                rep.x = clnn.copy(x)                                      # fixed input
                rep.out = clnn.empty((batch,) + self.out_shape, dtype, self.device)
                with programs.captured(reuse=True) as launches:
                    self._forward_eval(rep.x, bufs, logits, rep.out)
            except clnn.OutOfDeviceMemory:
                # (captures hold their temporaries): this key runs in full from now
                rep.x = rep.out = None
                rep.disabled = True
                return self._forward_eval(x, bufs, logits)
            rep.launches = launches
        else:
            clnn.copy(x, out=rep.x)
            cmdbuf.replay(rep.launches, rep)
        return clnn.copy(rep.out)

    def _infer_key(self, x, logits):
        """What must match for an inference pass to replay a captured one (the
        arrays its launches read: parameters, as bound, and layer state such as
        running statistics), or None where it must run in full."""
        settings = _memo.settings(self.device)
        if not all(layer.capturable for layer in self.layers) or settings is None:
            return None
        arrays = [_ident(p) for p in self.parameters()]
        for layer in self.layers:
            arrays += [_ident(v) for v in layer.state().values() if isinstance(v, cla.Array)]
        return (x.shape, x.dtype.str, bool(logits), tuple(arrays), settings)

    def _forward_eval(self, x, bufs, logits, out=None):
        """The layers' forward passes in evaluation mode through the work buffers
        ``bufs``, the last into ``out`` (a new array when None)."""
        batch, dtype = x.shape[0], x.dtype
        h, nxt = x, 0             # nxt: the work buffer the next layer writes into
        for i, layer in enumerate(self.layers):
            shape = (batch,) + layer.out_shape
            last = i == len(self.layers) - 1
            if layer.view:
                h = layer.forward(h)
                if last:
                    h = clnn.copy(h, out=out)
                continue
            if last:
                dst = out if out is not None else clnn.empty(shape, dtype, self.device)
            else:
                dst = bufs[nxt][:int(np.prod(shape))].reshape(shape)
                nxt = 1 - nxt
            h = layer.forward(h, dst, logits=logits)
        return h

    def predict(self, x):
        """The network's output for a batch, as a numpy array."""
        return self(x).get()

    # ------------------------------------------------------------ training
    def loss_for(self, loss=None):
        """``loss``, or where it is None the output layer's own: "cross_entropy" (fused
        with the softmax) after a softmax layer, the only loss one trains with, else
        "quadratic" (the tutorial's). What train_step, fit, evaluate and sgd use."""
        if loss is not None:
            return loss
        return "cross_entropy" if self.layers[-1].activation == "softmax" else "quadratic"

    def _check_loss(self, loss):
        if len(self.out_shape) != 1:
            raise ArgumentError(f"the network's output is {self.out_shape} per example; "
                                "losses take flat outputs (put a Flatten() before the "
                                "last Dense)")
        if isinstance(loss, CrossEntropyLoss):
            if self.layers[-1].activation != "softmax":
                raise ArgumentError("CrossEntropyLoss needs a softmax output layer")
            if loss.weight is not None and loss.weight.shape != (self.out_features,):
                raise ShapeError(f"CrossEntropyLoss has {loss.weight.size} class weights "
                                 f"for {self.out_features} classes")
            return
        if not isinstance(loss, str) or loss not in LOSSES:
            raise ArgumentError(f"unknown loss {loss!r}; choose from {', '.join(LOSSES)}")
        last = self.layers[-1].activation
        if loss == "cross_entropy" and last != "softmax":
            raise ArgumentError("cross_entropy is fused with a softmax output layer; the "
                                f"last layer has {last}")
        if loss == "quadratic" and last == "softmax":
            raise ArgumentError("a softmax output layer trains with loss='cross_entropy'")

    def _workspace(self, batch, dtype=None):
        key = (batch, dtype_name(self.dtype if dtype is None else dtype))
        ws = self._train.get(key)
        if ws is None:
            ws = self._train[key] = _Workspace(self, batch, dtype)
        if self._grads is None:
            # views into one flat buffer laid out as flat_parameters (padding 0)
            if self.flat_parameters is not None:
                self.flat_gradients = clnn.zeros(self.flat_parameters.shape, self.dtype,
                                                 self.device)
            views = {(id(layer), name): self.flat_gradients[off:off + n].reshape(shape)
                     for layer, name, shape, off, n in self._layout}
            self._grads = [[views[id(layer), name] for name in layer.parameter_names]
                           for layer in self.layers]
        return ws

    def workspace_bytes(self, dtype=None):
        """Bytes of the activations and deltas a training step keeps at the largest
        batch trained so far (views counted once), stored in ``dtype`` (default: the
        dtype of the last step): what float16 steps halve."""
        if not self._train:
            return 0
        dtype = np.dtype(list(self._train)[-1][1] if dtype is None else dtype)
        ws = self._train[max(self._train, key=lambda key: key[0])]
        buffers = {id(a.base_data): a.size for a in ws.a + ws.delta if a is not None}
        return sum(buffers.values()) * dtype.itemsize

    def gradient_range(self, i):
        """(start, stop): the elements of ``flat_gradients`` (and ``flat_parameters``)
        holding layer i's parameters, padding included; (0, 0) for a layer without
        parameters. Layers lie in order, so ranges of consecutive layers join."""
        spans = [(off, off + -(-n // _ALIGN) * _ALIGN)
                 for layer, _, _, off, n in self._layout if layer is self.layers[i]]
        return (spans[0][0], spans[-1][1]) if spans else (0, 0)

    def parameters(self):
        """Every parameter array, layer by layer (weight, then bias)."""
        return [p for layer in self.layers for p in layer.parameters()]

    def _optimizer(self, lr=None, momentum=None):
        """The network's optimizer (SGD with ``lr`` and ``momentum`` when it has none);
        ``lr`` and ``momentum``, when given, are set on it, as the tutorial's sgd
        changes the rate by schedule."""
        opt = self.optimizer
        if opt is None:
            opt = self.optimizer = optim.SGD(lr=0.01 if lr is None else lr,
                                             momentum=momentum or 0.0)
        if lr is not None:
            opt.lr = float(lr)
        if momentum is not None and isinstance(opt, optim.SGD):
            opt.momentum = float(momentum)
        return opt

    @_locked
    def train_step(self, x, y, lr=None, momentum=None, loss=None, hook=None,
                   layer_hook=None, example_offset=0, precision=None, global_batch=None,
                   replay=False, _half_epoch=None):
        """One gradient step on the batch (x, y), both device arrays already checked.

        The network's optimizer (``self.optimizer``; SGD when it has none) applies the
        update; ``lr`` and ``momentum`` when given are set on it first. ``hook``, when
        given, is called with a GradientStep after every gradient is computed and
        before anything is updated: it may change the gradients (sum them across
        processes, unscale them), their ``grad_scale``, or set ``skip``.
        ``layer_hook(i)``, when given, is called as soon as the kernels computing layer
        i's parameter gradients are enqueued (last layer first), while the layers below
        are still to run: what it enqueues (a copy of ``gradient_range(i)`` of
        ``flat_gradients`` to the host) runs right after them, so a data-parallel
        exchange can start before the backward pass ends. ``example_offset``: where
        this batch starts in a larger global batch split between processes; Dropout
        then draws that part of the global batch's masks (so N data-parallel ranks
        drop what one process with the whole batch would). ``precision="float16"``:
        a mixed-precision step (clnn/nn/amp.py) with ``self.scaler``'s loss scale S:
        the loss gradient is multiplied by S / ``global_batch`` (the examples of the
        whole global batch, default this batch's: the same factor on every rank), so
        the float16 gradients are S times the batch mean's, as PyTorch's.
        ``precision="bfloat16"``: the same step in bfloat16, with S = 1 and no overflow
        check (amp.py).

        ``replay=True``: the forward and backward passes' kernels are captured on the
        second step with the same arrays and settings and replayed on every later one
        (the same kernels, buffers and arguments, bitwise the same results), without
        the Python that checks arguments and picks kernels: most of a small network's
        step time on a GPU. Dropout's key for the step goes into its captured
        launches before each replay. Only networks whose layers all allow it (see
        Layer.capturable), loss "quadratic" or "cross_entropy" (None: ``loss_for``'s
        default), no ``layer_hook`` and no tuning override. Mixed-precision steps
        capture their casts too (and a float16 step without a hook its overflow check,
        on the device: one capture for every loss scale; with a hook, a capture per
        scale); the optimizer's update, ``hook``, the host's overflow
        check and the layers' after-step work run as usual. The
        returned loss array is then the same array every step: read it (or add it up,
        as fit does) before the next step. Elsewhere ``replay`` changes nothing.

        Returns the batch loss of the forward pass (a 0-d device array). Allocates
        nothing once the workspace for this batch size exists.

        ``_half_epoch`` (fit's, one object per epoch): in mixed precision without hooks,
        the optimizer's kernel writes the 16-bit copy of the weights as it updates the
        masters, and the next step of the same epoch uses that copy instead of casting
        the masters again (a launch and a pass fewer a step). Only fit passes it: no
        code of the user's runs between the steps of an epoch, so nothing else can
        change the masters there.
        """
        loss = self.loss_for(loss)
        low = amp.check_precision(precision, self)      # float16, bfloat16 or None
        half = low is not None
        batch = x.shape[0] if x.ndim else 0
        if batch < 1:        # (as fit and predict refuse it, before anything runs)
            raise ShapeError(f"x is an empty batch (shape {x.shape}): a batch holds at "
                             "least one example")
        opt = self._optimizer(lr, momentum)
        ws = self._workspace(batch, low)
        flat = [self.flat_parameters] if self.flat_parameters is not None else []
        # the optimizer's state with the workspace, before any op: a step then has
        # the same live buffers from the first one on (and a failure writes nothing)
        opt.prepare(flat)
        grads, scale, views, gate, count = self._grads, 1.0, None, None, None
        if half:
            # S times the mean's gradient (float16; bfloat16 takes no loss scale, S =
            # 1): sums over a batch would overflow half S times sooner. Where nothing
            # on the host needs this step's gradients (no hook) and the optimizer
            # can be gated, S stays on the device: the loss kernel reads it, and the
            # check, the skip, the new S and the optimizer's count of its updates are
            # kernels too, so the host never waits for a step (amp.py)
            if amp.scaled(low) and hook is None and layer_hook is None and \
                    isinstance(loss, str) and opt.gated and flat:
                gate = self.scaler.device_state(self.device)
                count = opt.device_count(self.device)
            scale = (self.scaler.scale if amp.scaled(low) and gate is None else 1.0) / \
                (global_batch or batch)
            half_copy = self._half_buffers(low)
            grads, views = half_copy.grad_lists, half_copy.views
        # fit's steps keep the 16-bit weights current in the optimizer's kernel (see
        # above); the copy is made outside the passes (and their capture) when the last
        # update of this epoch did not write it
        keep = half and _half_epoch is not None and hook is None and \
            layer_hook is None and bool(flat)
        fresh = keep and self._half_fresh is _half_epoch
        self._half_fresh = None         # until this step's update has written it
        if keep and not fresh:
            self._half_copy(low)
        key = self._replay_key(x, y, loss, batch, low, scale, gate, count, keep) \
            if replay and layer_hook is None else None
        with self._bound(views):
            value, grad_scale = self._replayed(key, ws, x, y, loss, grads, scale,
                                               layer_hook, example_offset, low, gate, count,
                                               not keep)
        # Every gradient exists; only now does anything the step keeps change. The
        # optimizer's state is allocated before its first write and its updates
        # allocate nothing, so a step that runs out of memory (or fails in any op
        # above) leaves weights and optimizer state as they were: all or nothing.
        info = GradientStep(self.parameters(), [g for gs in self._grads for g in gs],
                            grad_scale / scale, self.flat_parameters, self.flat_gradients)
        if hook is not None:
            hook(info)
        self._finish_step(info, amp.scaled(low), gate, self._half.params if keep else None)
        if keep:
            self._half_fresh = _half_epoch
        return value

    def _replayable(self, loss):
        """Whether steps with ``loss`` can replay at all: a plain loss (CrossEntropyLoss
        options read a denominator on the host) and layers that allow it."""
        return isinstance(loss, str) and self.flat_parameters is not None and \
            all(layer.capturable for layer in self.layers)

    def _replay_key(self, x, y, loss, batch, low=None, scale=1.0, gate=None, count=None,
                    keep=False):
        """What must match for a step to replay a captured one, or None where replay
        does not apply (see train_step). A float16 step's loss scale is part of it (the
        loss kernel takes it; a new scale captures anew), or where it lives on the
        device, the arrays that hold it and the optimizer's count, and the scaler's
        factors (the update kernel's arguments), and whether the passes cast the
        masters to 16 bits (``keep``: fit's steps, whose optimizer keeps the copy)."""
        settings = _memo.settings(self.device)
        if not self._replayable(loss) or settings is None:
            return None
        on_device = (_ident(gate), _ident(count), self.scaler.growth_factor,
                     self.scaler.backoff_factor, self.scaler.growth_interval) \
            if gate is not None else None
        halves = (dtype_name(low), scale, _ident(self._half.params),
                  _ident(self._half.grads), on_device, keep) if low is not None else None
        return (batch, loss, _ident(x), _ident(y), _ident(self.flat_parameters),
                _ident(self.flat_gradients), halves, settings)

    def _replayed(self, key, ws, x, y, loss, grads, scale, layer_hook, example_offset,
                  low=None, gate=None, count=None, cast=True):
        """_passes, captured and replayed under ``key`` (None: just run)."""
        from .. import cmdbuf, programs
        rep = self._replays.get(key) if key is not None else None
        if rep is not None and rep.launches is not None:
            if rep.patches:               # this step's dropout keys into the launches
                keys = self._dropout_keys(example_offset)
                for launch, arg, layer in rep.patches:
                    rep.launches[launch][3][arg] = keys[layer]
                programs.replay(rep.launches)
            else:                         # (command buffers where asked for)
                cmdbuf.replay(rep.launches, rep)
            for layer, state in zip(self.layers, rep.states):
                layer.restore_step_state(state)     # what after_step needs (BatchNorm)
            return rep.value, rep.grad_scale
        args = (ws, x, y, loss, grads, scale, layer_hook, example_offset, low, gate, count,
                cast)
        if rep is None and key is not None:     # seen once: captured next time
            while len(self._replays) >= REPLAYS:
                self._replays.pop(next(iter(self._replays)))
            self._replays[key] = _Replay()
        try:
            if rep is None or rep.disabled:
                return self._passes(*args)
            with programs.captured(reuse=True) as launches:
                value, grad_scale = self._passes(*args)
        except clnn.OutOfDeviceMemory:
            # captured steps hold their temporaries (as few as a plain step's: a
            # capture reuses its own): give them back and run the passes again,
            # uncaptured (they change no weight: running them twice is safe); this key
            # runs so from now
            if not self._replays or (rep is not None and rep.disabled):
                raise
            self._replays.clear()
            if key is not None:
                self._replays[key] = _Replay()
                self._replays[key].disabled = True
            return self._passes(*args)
        rep.patches = self._key_patches(launches, example_offset)
        if rep.patches is None:               # a key it cannot place: never replay
            rep.disabled = True
            return value, grad_scale
        rep.launches, rep.value, rep.grad_scale = launches, value, grad_scale
        rep.states = [layer.step_state() for layer in self.layers]
        return value, grad_scale

    def _key_patches(self, launches, example_offset):
        """Where a captured step's dropout keys are: (launch, argument, layer) for
        every captured dropout kernel (forward and backward), found by the key the
        layer drew this step; None when a dropout launch has a key no layer drew."""
        keys = self._dropout_keys(example_offset)
        layer_of = {k: i for i, k in enumerate(keys) if k}
        patches = []
        for j, (kern, _, _, values) in enumerate(launches):
            if kern.entry != "clnn_dropout":
                continue
            arg = kern.names.index("key")
            if values[arg] not in layer_of:
                return None
            patches.append((j, arg, layer_of[values[arg]]))
        return patches

    def _finish_step(self, info, scaled, gate=None, copy=None):
        """After the hook: the loss scale's check on the host (``scaled``: float16
        steps; with a ``gate`` the passes checked on the device, and the optimizer
        reads the gate), the update (which also writes the 16-bit ``copy`` of the
        parameters where one is given), the layers' after-step work (BatchNorm's
        running statistics)."""
        if not np.isfinite(info.grad_scale):
            info.skip = True              # every label ignored: nothing to learn from
        if scaled and not info.skip and gate is None:
            finite = info.flat_grads is None or amp.all_finite(info.flat_grads)
            self.scaler.update(finite)
            info.skip = not finite        # an overflow: skip, with a smaller scale
        if not info.skip and self.flat_parameters is not None:
            # one kernel for every parameter (and the padding between them, whose
            # zero gradients leave it 0)
            self._optimizer().step([self.flat_parameters], [self.flat_gradients],
                                   info.grad_scale, gate=gate, copies=[copy])
        for layer in self.layers:          # BatchNorm's running statistics
            layer.after_step()
        self.steps += 1

    def _half_buffers(self, dtype=np.float16):
        """The 16-bit (``dtype``) copy of the parameters and gradients (amp.HalfCopy),
        made where it is missing; the parameters are cast into it by _half_copy."""
        if self._half is None or self._half.dtype != dtype:
            self._half = amp.HalfCopy(self, dtype)
        return self._half

    def _half_copy(self, dtype=np.float16):
        """_half_buffers, with the float32 masters cast into its parameters now."""
        half = self._half_buffers(dtype)
        if self.flat_parameters is not None:
            clnn.cast(self.flat_parameters, dtype, out=half.params)
        return half

    def _cast_batch(self, ws, name, a, dtype):
        """``a`` (the step's x or float targets) as ``dtype`` in the workspace."""
        buf = ws.cast.get(name)
        if buf is None or buf.shape != a.shape or buf.dtype != dtype:
            buf = ws.cast[name] = clnn.empty(a.shape, dtype, self.device)
        return clnn.cast(a, dtype, out=buf)

    @contextlib.contextmanager
    def _bound(self, views):
        """The layers' parameter attributes pointed at ``views`` (the float16 copy) for
        the block, and back to the float32 masters after it."""
        if views is None:
            yield
            return
        saved = [(layer, name, getattr(layer, name)) for layer, name, *_ in self._layout]
        try:
            for layer, name, _ in saved:
                setattr(layer, name, views[id(layer), name])
            yield
        finally:
            for layer, name, v in saved:
                setattr(layer, name, v)

    def _passes(self, ws, x, y, loss, grads, scale, layer_hook, example_offset, low=None,
                gate=None, count=None, cast=True):
        """Everything a step enqueues before its hook and update, which a replay
        repeats as one capture: in mixed precision (``low``, the 16-bit dtype) the
        masters' 16-bit copy (with ``cast``; fit's steps make it before) and the
        batch's cast, the passes, the gradients cast to the float32 flat buffer and the
        loss to float32, and with a ``gate`` the loss-scale update and the step's
        ``count``. Returns (loss, 1 / the loss's denominator)."""
        half = low is not None
        if half:
            if cast:
                self._half_copy(low)
            # (fit keeps its data in the 16-bit dtype: nothing to cast)
            if x.dtype != low:
                x = self._cast_batch(ws, "x", x, low)
            if is_floating(y.dtype) and y.dtype != low:
                y = self._cast_batch(ws, "y", y, low)
        value, grad_scale = self._forward_backward(ws, x, y, loss, grads, scale, layer_hook,
                                                   example_offset, half, gate)
        if half:
            if value.dtype != self.dtype:       # (the plain losses' is already float32,
                value = clnn.cast(value, self.dtype)    # as PyTorch's autocast has it)
            if gate is not None:
                # last: the two kernels here that change what the step keeps (the
                # state's mark of an inf or NaN, then S and the count), enqueued after
                # everything that could run out of memory, so that _replayed may run
                # the passes again after a failed capture. The cast marks the state as
                # it reads the 16-bit gradients, and its last work-group updates S and
                # the count: one pass and launch for the cast, the check and the update
                self.scaler.device_cast_update(self._half.grads, self.flat_gradients,
                                               count)
            elif self.flat_parameters is not None and layer_hook is None:
                # (with a layer hook, each layer's were cast as they came)
                clnn.cast(self._half.grads, self.dtype, out=self.flat_gradients)
        return value, grad_scale

    def _forward_backward(self, ws, x, y, loss, grads, scale, layer_hook, example_offset,
                          half, gate=None):
        """The forward pass, the loss (its gradient times ``scale``, and with a
        ``gate`` its loss scale on the device) and the backward pass into ``grads``;
        returns (loss, 1 / the loss's denominator)."""
        batch = x.shape[0]
        options = loss if isinstance(loss, CrossEntropyLoss) else None
        xent = loss == "cross_entropy" or options is not None
        L = len(self.layers)
        keys = self._dropout_keys(example_offset)
        # the first layer reads the user's x and never writes it
        inputs = [x] + ws.a[:-1]
        for i, layer in enumerate(self.layers):
            if layer.view:
                inputs[i + 1:i + 2] = [layer.forward(inputs[i])] if i + 1 < L else []
                continue
            layer.forward(inputs[i], ws.a[i], logits=xent and i == L - 1, training=True,
                          key=keys[i])
        grad_scale = 1.0 / batch
        fused = [False] * L       # whose bias gradient backward_activation summed
        if options is not None:
            # the sum and its gradient, over the labels' total weight D (from the
            # kernel): the mean PyTorch takes, with the network's unscaled deltas
            value, _, denom = cross_entropy_parts(
                ws.a[-1], y, self._loss_weight(options, ws.dtype), options.ignore_index,
                "sum", options.label_smoothing, dz=ws.delta[-1])
            grad_scale = 1.0 / denom if denom else float("inf")
            if scale != 1.0:
                clnn.scale(scale, ws.delta[-1], out=ws.delta[-1])
            if denom:
                clnn.scale(1.0 / denom, value, out=value)
            else:
                clnn.fill(value, float("nan"))     # a mean over nothing, as PyTorch
        elif xent:
            # a dense output layer's bias gradient comes with the loss's (for a small
            # batch in the same launch: loss.py's HEAD_ROWS)
            last = self.layers[-1]
            db = grads[-1][1] if last.fuses_bias and ws.delta[-1].ndim == 2 and \
                len(grads[-1] or ()) == 2 else None
            value, _ = clnn.softmax_cross_entropy(ws.a[-1], y, dz=ws.delta[-1],
                                                  grad_scale=scale, scale_by=gate,
                                                  loss_dtype=self.dtype, db=db)
            fused[-1] = db is not None
        else:
            value, _ = clnn.quadratic_loss(ws.a[-1], y, da=ws.delta[-1], grad_scale=scale,
                                           scale_by=gate, loss_dtype=self.dtype)
            fused[-1] = self.layers[-1].backward_activation(ws.delta[-1], ws.a[-1],
                                                            grads[-1] or None)
        for i in range(L - 1, -1, -1):
            # below the first layer with parameters no delta is needed
            need_dx = i - 1 >= self._first_trainable
            # a pooling layer applies the derivative of the activation below it in its
            # own pass (a launch and a pass over the delta fewer: LeNet-5's step on a
            # GPU 31 -> 29 launches); that layer's gradients then sum its bias
            act = self.layers[i - 1].activation_to_fuse() \
                if need_dx and self.layers[i].takes_activation else None
            if act is not None:
                self.layers[i].backward_input(ws.delta[i], inputs[i], ws.delta[i - 1],
                                              activation=act)
            elif need_dx or grads[i]:
                # (a bias gradient its activation's backward pass summed: left out)
                self.layers[i].backward(ws.delta[i], inputs[i],
                                        ws.delta[i - 1] if need_dx else None,
                                        grads[i][:1] if fused[i] else grads[i], ws.ones)
            if need_dx and act is None:
                fused[i - 1] = self.layers[i - 1].backward_activation(
                    ws.delta[i - 1], inputs[i], grads[i - 1] or None)
            if layer_hook is not None and grads[i]:
                if half:          # this layer's gradients, float32, for the hook to copy
                    lo, hi = self.gradient_range(i)
                    clnn.cast(self._half.grads[lo:hi], self.dtype,
                              out=self.flat_gradients[lo:hi])
                layer_hook(i)
        return value, grad_scale

    def _dropout_keys(self, example_offset):
        """The key each stochastic layer (Dropout) draws its mask with at this step (0
        for the others): from the seed, the layer and the step; shifted to this batch's
        part of the global batch when it starts ``example_offset`` examples into it."""
        keys = []
        for i, layer in enumerate(self.layers):
            key = dropout_key(self.seed, i, self.steps) if layer.stochastic else 0
            if key and example_offset:
                per_example = int(np.prod(layer.in_shape, dtype=np.int64))
                key = dropout_key_at(key, example_offset * per_example)
            keys.append(key)
        return keys

    def _check_fit_optimizer(self, optimizer, lr, momentum):
        """fit's rule for its optimizer, checked before anything reaches the device:
        ``optimizer`` comes with its own rates (lr or momentum beside it would be
        ignored, so they are refused), and momentum is SGD's."""
        if optimizer is not None and not isinstance(optimizer, optim.Optimizer):
            raise ArgumentError(f"optimizer must be a clnn.optim optimizer, got "
                                f"{type(optimizer).__name__}")
        if optimizer is not None and (lr is not None or momentum is not None):
            raise ArgumentError("pass lr and momentum to the optimizer, not beside it")
        own = self.optimizer
        if optimizer is None and momentum is not None and own is not None and \
                not isinstance(own, optim.SGD):
            raise ArgumentError(f"momentum is SGD's; the network trains with "
                                f"{type(own).__name__} (pass optimizer= to change it)")

    def _fit_optimizer(self, optimizer, lr, momentum):
        """The optimizer fit trains with: ``optimizer`` when given; else the network's
        own, whatever its kind (a loaded Adam stays Adam), with ``lr`` and ``momentum``
        set where given; SGD(lr=0.1, momentum or 0) for a network without one."""
        if optimizer is not None:
            self.optimizer = optimizer
            return optimizer
        return self._optimizer(0.1 if lr is None and self.optimizer is None else lr,
                               momentum)

    def _train_args(self, x, y, loss, lr, momentum, dtype=None):
        """The training data on the device in ``dtype`` (default the network's) and
        the checked rates (None stays None: not given)."""
        self._check_loss(loss)
        if lr is not None:
            lr = float(lr)
            if not (np.isfinite(lr) and lr > 0):
                raise ArgumentError(f"lr must be a positive number, got {lr}")
        if momentum is not None:
            momentum = float(momentum)
            if not (np.isfinite(momentum) and 0 <= momentum < 1):
                raise ArgumentError(f"momentum must lie in [0, 1), got {momentum}")
        xd = self._input(x, dtype=dtype)
        return xd, self._targets(y, xd.shape[0], loss, dtype), lr, momentum

    def fit(self, x, y, loss=None, epochs=1, batch_size=32, lr=None, momentum=None,
            shuffle=True, seed=None, validation=None, progress=None, optimizer=None,
            scheduler=None, hook=None, initial_epoch=0, callback=None, precision=None,
            replay=True):
        """Mini-batch training. Returns a history: {"loss": [...], "epoch_time": [...],
        "val_loss": [...], "val_accuracy": [...]} (validation keys when given).

        ``initial_epoch``: the epochs already done (a resumed run): their shuffles are
        drawn and skipped, so epochs initial_epoch..epochs-1 see the batches an
        uninterrupted run would. ``callback(epoch, history)`` runs after every epoch
        (e.g. to save a checkpoint).

        ``optimizer``: a clnn.optim optimizer (it becomes ``self.optimizer``; its rates
        are its own, so ``lr`` and ``momentum`` beside it are refused). Without one,
        fit trains with the network's optimizer as it is (one set before, or loaded
        with a checkpoint: a resumed Adam stays Adam, its rates and state kept), with
        ``lr`` and ``momentum`` (SGD's) changed where given; a network without one
        gets SGD(lr=0.1, momentum=0), or the rates given. ``scheduler``: a clnn.optim
        schedule, stepped after every epoch. ``hook``: see train_step. ``progress``: a tqdm bar
        with the running loss (default: when stderr is a terminal).

        ``precision="float16"``: mixed precision (clnn/nn/amp.py): float16 activations,
        deltas and weight copies, float32 master weights and optimizer state, dynamic
        loss scaling by ``self.scaler`` (a GradScaler, created with PyTorch's defaults
        unless set); the history adds "skipped_steps" (per epoch: steps skipped for an
        overflow) and "loss_scale" (at each epoch's end). The training and validation
        data are kept on the device in float16 and validated in float16 too (as under
        autocast), so the data and the evaluation's activations take half the memory.
        ``precision="bfloat16"``: the same in bfloat16, without loss scaling (no
        scaler, no "skipped_steps" or "loss_scale" in the history).

        ``replay`` (default True): steps replay their captured kernels where the network
        allows it (see train_step; each batch is first copied into a buffer of its
        size, so every step sees the same arrays): the same results, bitwise, with a
        fraction of the host time per step.

        ``loss``: "quadratic", "cross_entropy" or a CrossEntropyLoss; None (the default)
        takes the output layer's own (``loss_for``: cross-entropy after a softmax).
        """
        loss = self.loss_for(loss)
        low = amp.check_precision(precision, self)
        scaled = amp.scaled(low)
        dt = low if low is not None else self.dtype    # the data's dtype on the device
        self._check_fit_optimizer(optimizer, lr, momentum)
        if scheduler is not None and not isinstance(scheduler, optim.Schedule):
            raise ArgumentError(f"scheduler must be a clnn.optim schedule, got "
                                f"{type(scheduler).__name__}")
        if hook is not None and not callable(hook):
            raise ArgumentError("hook must be callable")
        if callback is not None and not callable(callback):
            raise ArgumentError("callback must be callable")
        if not isinstance(initial_epoch, (int, np.integer)) or initial_epoch < 0:
            raise ArgumentError(f"initial_epoch must be an int >= 0, got {initial_epoch!r}")
        x_host = np.asarray(x.get() if hasattr(x, "get") else x)
        y_host = np.asarray(y.get() if hasattr(y, "get") else y)
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(epochs, (int, np.integer)) or epochs < 0:
            raise ArgumentError(f"epochs must be a non-negative int, got {epochs!r}")
        xd, yd, lr, momentum = self._train_args(x_host, y_host, loss, lr, momentum, dt)
        self._fit_optimizer(optimizer, lr, momentum)
        n = xd.shape[0]
        self._check_batches(n, batch_size)
        y_dense = yd.get()                       # targets as (batch, classes) rows
        x_host = x_host.astype(dt, copy=False)   # what _input uploaded to xd
        if validation is not None:
            xv = self._input(validation[0], "validation x", dt)
            yv = self._targets(validation[1], xv.shape[0], loss, dt)
        if progress is None:
            progress = sys.stderr.isatty()
        rng = np.random.default_rng(seed)
        hist = {"loss": [], "epoch_time": []}
        if validation is not None:
            hist.update(val_loss=[], val_accuracy=[])
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=max(0, epochs - initial_epoch) * -(-n // batch_size),
                       unit="batch", leave=True)
        if shuffle:
            for _ in range(min(initial_epoch, epochs)):
                rng.permutation(n)               # the shuffles of the epochs done
        skipped_before = self.scaler.skipped if scaled else 0
        # batches go through fixed buffers where steps can replay (see train_step)
        stage = replay and self._replayable(loss)
        try:
            for epoch in range(initial_epoch, epochs):
                t0 = time.perf_counter()
                if shuffle:
                    order = rng.permutation(n)
                    xd.set(np.ascontiguousarray(x_host[order]))
                    yd.set(np.ascontiguousarray(y_dense[order]))
                # the epoch's loss is summed on the device: reading it every step would
                # make the host wait for the device after every step (on a GPU, most
                # of a small network's step time); the bar reads it now and then
                total = clnn.zeros((), self.dtype, self.device)
                seen, shown = 0, time.perf_counter()
                # its steps keep the 16-bit weights current (train_step's _half_epoch);
                # the callback and the schedule between epochs may change the masters
                epoch_token = object()
                for start in range(0, n, batch_size):
                    stop = min(n, start + batch_size)
                    xb, yb = xd[start:stop], yd[start:stop]
                    if stage:
                        xb, yb = self._staged("x", xb), self._staged("y", yb)
                    value = self.train_step(xb, yb, loss=loss, hook=hook,
                                            precision=precision, replay=replay,
                                            _half_epoch=epoch_token)
                    clnn.axpy(float(stop - start), value, total)
                    seen += stop - start
                    if bar is not None:
                        bar.update(1)
                        if time.perf_counter() - shown > 0.5 or stop == n:
                            shown = time.perf_counter()
                            bar.set_postfix(epoch=epoch + 1,
                                            loss=f"{float(total.get()) / seen:.4f}")
                hist["loss"].append(float(total.get()) / max(seen, 1))
                hist["epoch_time"].append(time.perf_counter() - t0)
                if scaled:
                    skipped_before = amp.record_epoch(hist, self.scaler, skipped_before)
                if scheduler is not None:
                    scheduler.step()
                if validation is not None:
                    vl, va = self.evaluate(xv, yv, loss, precision=precision)
                    hist["val_loss"].append(vl)
                    hist["val_accuracy"].append(va)
                    if bar is not None:
                        bar.set_postfix(epoch=epoch + 1, loss=f"{hist['loss'][-1]:.4f}",
                                        val_acc=f"{va:.3f}")
                if callback is not None:
                    callback(epoch, hist)
        finally:
            if bar is not None:
                bar.close()
        return hist

    def _staged(self, name, a):
        """``a`` copied (on the device) into this network's buffer for ``name`` and
        its shape: a replayed step's kernels read fixed arrays."""
        key = (name, a.shape, a.dtype.str)
        buf = self._stages.get(key)
        if buf is None:
            buf = self._stages[key] = dev_empty(self.device, a.shape, a.dtype)
        return clnn.copy(a, out=buf)

    def _check_batches(self, n, batch_size):
        """Batch statistics need two values per channel: a last batch of one example
        would stop an epoch half-way; say so before the first step."""
        sizes = {min(n, batch_size), n % batch_size or batch_size}
        shape = self.in_shape
        for layer in self.layers:
            if getattr(layer, "batch_statistics", False) and \
                    min(sizes) * int(np.prod(shape[1:])) < 2:
                raise ShapeError(f"{type(layer).__name__} needs more than one value per "
                                 f"channel in training; {n} examples in batches of "
                                 f"{batch_size} leave a batch of {min(sizes)}: choose "
                                 "another batch_size or drop an example")
            shape = layer.out_shape
        return n

    @_locked
    def evaluate(self, x, y, loss=None, batch_size=1000, precision=None):
        """(mean loss, accuracy) on (x, y); accuracy compares arg-max of output and y.

        ``precision="float16"`` (or "bfloat16"): evaluated as a mixed-precision step
        runs forward (the 16-bit copy of the weights, 16-bit activations; x and y are
        stored so), as PyTorch evaluates under autocast: half the activation memory.
        ``loss``: None for the output layer's own (``loss_for``)."""
        loss = self.loss_for(loss)
        self._check_loss(loss)
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) \
                or batch_size < 1:
            raise ArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
        low = amp.mixed_dtype(precision, self)
        half = low is not None
        dt = low if half else self.dtype
        if half:        # the network's own dtype on the device: cast, then checked in half
            x, y = (clnn.cast(a, dt) if isinstance(a, cla.Array) and a.dtype == self.dtype
                    else a for a in (x, y))
        xd = self._input(x, dtype=dt)
        yd = self._targets(y, xd.shape[0], loss, dt)
        with self._bound(self._half_copy(low).views if half else None):
            return self._evaluate(xd, yd, loss, batch_size, half)

    def _evaluate(self, xd, yd, loss, batch_size, half):
        options = loss if isinstance(loss, CrossEntropyLoss) else None
        xent = loss == "cross_entropy" or options is not None
        total, correct = clnn.zeros((), self.dtype, self.device), 0
        n = xd.shape[0]

        def add(value, weight):        # a 16-bit loss is summed in float32
            clnn.axpy(weight, clnn.cast(value, self.dtype) if half else value, total)

        if options is not None:
            # PyTorch's mean over the whole set: the sum over the labels' total weight;
            # accuracy over the labels that are not ignored
            denom, counted = 0.0, 0
            for start in range(0, n, batch_size):
                stop = min(n, start + batch_size)
                out = self._run(xd[start:stop], logits=True)
                labels = yd[start:stop].get()
                keep = labels != options.ignore_index
                correct += int((out.get().argmax(1)[keep] == labels[keep]).sum())
                counted += int(keep.sum())
                value, _, d = cross_entropy_parts(out, yd[start:stop],
                                                  self._loss_weight(options, xd.dtype),
                                                  options.ignore_index, "sum",
                                                  options.label_smoothing, want_dz=False)
                add(value, 1.0)
                denom += d
            return (float(total.get()) / denom if denom else float("nan"),
                    correct / counted if counted else float("nan"))
        for start in range(0, n, batch_size):
            stop = min(n, start + batch_size)
            # the loss the training step computes, with the same kernel (for cross-
            # entropy from the logits, as fit does); accuracy from the output's arg-max
            out = self._run(xd[start:stop], logits=xent)
            target = yd[start:stop]
            correct += int((out.get().argmax(1) == target.get().argmax(1)).sum())
            if xent:
                value, _ = clnn.softmax_cross_entropy(out, target, dz=out)
            else:
                value, _ = clnn.quadratic_loss(out, target, da=out)
            add(value, float(stop - start))
        return float(total.get()) / n, correct / n

    # ------------------------------------------------------------ persistence
    @_locked
    def save(self, path):
        """Architecture, parameters and the optimizer (its settings, step count and
        state, so ``load`` resumes training bitwise) to an .npz file, written
        atomically."""
        arch = {"in_shape": list(self.in_shape), "dtype": self.dtype.name,
                "layers": [l.config() for l in self.layers], "seed": self.seed,
                "steps": self.steps}
        opt = self.optimizer
        if opt is not None and opt.state is not None:
            arch["optimizer"] = dict(opt.config(), steps=opt.steps)
        if self.scaler is not None:          # float16 steps: the loss scale's state
            arch["grad_scaler"] = self.scaler.config()
        arrays = {"architecture": np.frombuffer(json.dumps(arch).encode(), np.uint8)}
        for i, l in enumerate(self.layers):
            for name, p in zip(l.parameter_names, l.parameters()):
                arrays[f"layer{i}.{name}"] = p.get()
            for name, v in l.state().items():     # BatchNorm's running statistics
                arrays[f"layer{i}.{name}"] = v.get() if hasattr(v, "get") else \
                    np.asarray(v, np.int64)
        if "optimizer" in arch:
            # the flat state, saved per parameter (a file independent of the layout)
            state = opt.state_arrays()[0] if opt.state else []
            for k, (_, _, shape, off, n) in enumerate(self._layout):
                for j, b in enumerate(state):
                    arrays[f"optimizer.{k}.{j}"] = b[off:off + n].reshape(shape)
        # npz keeps no bfloat16 dtype (it would read back as raw void): its bits go as
        # uint16, and the architecture's dtype says what they are
        arrays = {k: v.view(np.uint16) if v.dtype == clnn.bfloat16 else v
                  for k, v in arrays.items()}
        # through a symlink to its target (replacing the link by a file would break
        # whatever else points there), with the mode an ordinary new file gets, or
        # the replaced file's (mkstemp's 0600 would hide the model from the group)
        target = os.path.realpath(path)
        folder = os.path.dirname(target)
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except OSError:
            mode = 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".clnn-save-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(tmp, target)     # atomic: readers see the old file or the new one
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# A checkpoint's architecture is a few hundred bytes of JSON; more is not ours.
_ARCH_MAX_BYTES = 1 << 20
_DTYPES = ("float32", "float64", "float16", "bfloat16")


def _read_checkpoint(path):
    """(architecture, layers, {name: array}) from a checkpoint, everything checked
    before a device buffer exists: the JSON, the layers' configurations and the shapes
    they imply, the names, dtypes, shapes and values of the arrays (all finite)."""
    def bad(why):
        return CheckpointError(f"{path}: {why}")
    try:
        f = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise bad(f"not a clnn checkpoint (.npz): {exc}") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise bad("not a clnn checkpoint (.npz archive)")
    with f:
        try:
            names = set(f.files)
            if "architecture" not in names:
                raise bad("no architecture entry")
            info = f.zip.getinfo("architecture.npy")
            if info.file_size > _ARCH_MAX_BYTES:
                raise bad(f"an architecture of {info.file_size} bytes")
            raw = f["architecture"]
            if raw.dtype != np.uint8 or raw.ndim != 1:
                raise bad("the architecture is not JSON bytes")
            arch = json.loads(bytes(raw).decode("utf-8"))
        except CheckpointError:
            raise
        except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile,
                UnicodeDecodeError, RecursionError) as exc:
            raise bad(f"unreadable architecture: {exc}") from None
        if not isinstance(arch, dict) or not isinstance(arch.get("layers"), list) or \
                not isinstance(arch.get("in_shape"), list) or \
                arch.get("dtype") not in _DTYPES:
            raise bad("the architecture needs in_shape (a list), dtype (one of "
                      f"{', '.join(_DTYPES)}) and layers (a list)")
        in_shape = arch["in_shape"]
        if not in_shape or not all(isinstance(v, int) and not isinstance(v, bool) and
                                   0 < v <= INT_MAX for v in in_shape):
            raise bad(f"in_shape {in_shape} is not a list of positive ints")
        dtype = np.dtype(arch["dtype"])
        for key in ("seed", "steps"):          # absent from older checkpoints
            v = arch.get(key, 0)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 63:
                raise bad(f"{key} {v!r} is not an int in [0, 2**63)")
        try:
            layers = [from_config(cfg) for cfg in arch["layers"]]
            if not layers:
                raise ArgumentError("no layers")
            shape, expected, param_shapes = tuple(in_shape), {}, []
            for i, layer in enumerate(layers):
                shapes, out = layer.plan(shape)
                for name, s in zip(layer.parameter_names, shapes):
                    expected[f"layer{i}.{name}"] = (s, dtype)
                    param_shapes.append(s)
                for name, (s, dt) in layer.state_plan(shape, dtype).items():
                    expected[f"layer{i}.{name}"] = (s, np.dtype(dt))
                shape = out
            opt = None
            if "optimizer" in arch:
                cfg = arch["optimizer"]
                cfg = dict(cfg) if isinstance(cfg, dict) else cfg
                steps = cfg.pop("steps", None) if isinstance(cfg, dict) else None
                if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
                    raise ArgumentError("the optimizer's step count is not an int >= 0")
                opt = optim.from_config(cfg)
                opt.steps = steps
                for k, s in enumerate(param_shapes):
                    for j in range(len(opt.buffers())):
                        expected[f"optimizer.{k}.{j}"] = (s, dtype)
            if "grad_scaler" in arch:
                cfg = arch["grad_scaler"]
                try:
                    arch["grad_scaler"] = amp.GradScaler.from_config(cfg)
                except (TypeError, KeyError, ValueError):
                    raise ArgumentError(f"a bad grad_scaler entry: {cfg!r}") from None
        except (ArgumentError, ShapeError) as exc:
            raise bad(f"invalid architecture: {exc}") from None
        unexpected = names - set(expected) - {"architecture"}
        missing = set(expected) - names
        if missing or unexpected:
            raise bad(f"the arrays do not match the architecture: missing "
                      f"{sorted(missing)}, unexpected {sorted(unexpected)}")
        values = {}
        for key, (s, dt) in expected.items():
            size = int(np.prod(s)) * dt.itemsize
            if f.zip.getinfo(key + ".npy").file_size < size:
                raise bad(f"{key} holds fewer bytes than a {s} {dtype.name} array")
            try:
                v = f[key]
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise bad(f"unreadable {key}: {exc}") from None
            if dt == clnn.bfloat16 and v.dtype == np.uint16:
                v = v.view(dt)                    # bfloat16's bits, as save wrote them
            if v.dtype != dt or v.shape != tuple(s):
                raise bad(f"{key} is a {v.shape} {v.dtype} array, the architecture says "
                          f"{tuple(s)} {dt.name}")
            if is_floating(dt) and not np.all(np.isfinite(v)):
                raise bad(f"{key} holds NaN or infinite values")
            if dt.kind == "i" and np.any(v < 0):
                raise bad(f"{key} holds negative values")
            values[key] = v
    return arch, layers, values, opt


def load(path, device=None):
    """A network saved by ``Sequential.save``, on ``device``.

    The whole file is checked before anything is built: a damaged or crafted file
    raises CheckpointError and allocates nothing (no pickles are ever loaded)."""
    arch, layers, values, opt = _read_checkpoint(path)
    net = Sequential(layers, in_shape=arch["in_shape"], device=device, dtype=arch["dtype"],
                     initialize=False, seed=arch.get("seed", 0))
    net.steps = arch.get("steps", 0)
    for i, layer in enumerate(net.layers):
        for name, p in zip(layer.parameter_names, layer.parameters()):
            p.set(np.ascontiguousarray(values[f"layer{i}.{name}"]))
        names = layer.state()
        if names:
            layer.load_state({name: values[f"layer{i}.{name}"] for name in names})
    if opt is not None:
        if net.flat_parameters is not None:
            flat = [np.zeros(net.flat_parameters.shape, net.dtype)
                    for _ in opt.buffers()]
            for k, (_, _, shape, off, n) in enumerate(net._layout):
                for j, host in enumerate(flat):
                    host[off:off + n] = values[f"optimizer.{k}.{j}"].ravel()
            opt.load_state([net.flat_parameters], [flat], opt.steps)
        net.optimizer = opt
    net.scaler = arch.get("grad_scaler")
    return net


def sgd(net, x, y, loss=None, epochs=1, lr=0.1, momentum=0.0, schedule=None):
    """Full-batch gradient descent, as the tutorial's sgd.

    Returns the loss of the last epoch's forward pass (before its update); with
    ``schedule=[(epochs, lr), ...]`` runs each entry in turn and returns the list of
    those losses, one per entry.
    """
    loss = net.loss_for(loss)
    entries = [(epochs, lr)] if schedule is None else list(schedule)
    if not entries:
        raise ArgumentError("schedule is empty")
    for e, r in entries:
        if not isinstance(e, (int, np.integer)) or e < 1:
            raise ArgumentError(f"epochs must be positive ints, got {e!r}")
    for _, r in entries:          # check every learning rate before the first update
        r = float(r)
        if not (np.isfinite(r) and r > 0):
            raise ArgumentError(f"lr must be a positive number, got {r}")
    xd, yd, _, momentum = net._train_args(x, y, loss, entries[0][1], momentum)
    losses = []
    for e, r in entries:
        value = None
        for _ in range(e):
            value = net.train_step(xd, yd, float(r), momentum, loss)
        losses.append(float(value.get()))
    return losses if schedule is not None else losses[0]
