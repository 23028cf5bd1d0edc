"""Mixed-precision training: float16 (or bfloat16) activations, deltas and weight
copies with float32 master weights, and for float16 dynamic loss scaling (PyTorch's
autocast + GradScaler).

``net.fit(..., precision="float16")`` (``train_step`` takes it too) runs each step as:

1. the float32 master parameters are cast to a float16 copy (one kernel for all of
   them: they live in one flat buffer) and the batch to float16; within an epoch of
   ``fit`` (no hook) the optimizer's kernel writes that copy as it updates the masters
   (``copy=`` of clnn.sgd_step and clnn.adam_step), so only an epoch's first step casts;
2. forward and backward run in float16 storage (every kernel computes in float32 and
   rounds once on store), the loss gradient multiplied by the scale S so small
   gradients do not flush to zero in half;
3. the float16 gradients are cast to the float32 flat gradient buffer, where the hook
   (a data-parallel sum) sees them, and checked: with an inf or NaN the step is skipped
   and S halved; otherwise the optimizer updates the float32 masters with the gradients
   times 1/(batch S), and after ``growth_interval`` good steps in a row S doubles.

Where nothing on the host needs the step's gradients (no hook, a plain loss) and the
optimizer can be gated (SGD, Adam, AdamW), S lives on the device
(GradScaler.device_state): the loss kernel reads it, the gradients' cast marks the
state where it meets an inf or NaN, its last work-group updates S from that mark (in
the same launch), and the optimizer's kernel reads whether to skip and what S to divide
by (Adam its step count too, which the update keeps on the device).
The host then waits for no step (PyTorch's GradScaler reads its inf check back every
step unless the optimizer is fused); reading ``scaler.scale`` or ``skipped`` (fit does
at each epoch's end), or ``optimizer.steps``, reads the state back once.

``precision="bfloat16"`` runs the same steps in bfloat16 storage without the loss
scale, its check and its read-back: bfloat16 keeps float32's exponent range (8 bits of
mantissa instead of float16's 11), so gradients neither overflow nor flush to zero
sooner than float32's, which is why PyTorch's bfloat16 autocast takes no GradScaler.

Why a ``precision=`` argument to ``fit`` and not a float16 network: the network, its
checkpoints and ``predict`` stay float32 (as a PyTorch model under autocast stays
float32), the same network trains either way, and a checkpoint from a float16 run
resumes in float32 or float16.
"""

import numpy as np

import clnn
from ..errors import ArgumentError
from ..ops import optim as optim_ops
from ..programs import dtype_name     # (a dict lookup: numpy's dtype.name is 3 us)

PRECISIONS = ("float32", "float16", "bfloat16")


class GradScaler:
    """Dynamic loss scaling with PyTorch's GradScaler defaults: start at ``init_scale``,
    multiply by ``backoff_factor`` when a step's gradients overflow (and skip the step),
    by ``growth_factor`` after ``growth_interval`` good steps in a row. ``skipped``
    counts the steps skipped so far.

    The state (``scale``, ``good_steps``, ``skipped``) lives where the steps need it:
    on the host for update(), or on the device (device_state) for steps that check,
    skip and rescale there without the host waiting for them. Reading an attribute
    reads the device's state back once; setting one makes the host's the current
    state again."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        for name, v, ok in (("init_scale", init_scale, init_scale > 0),
                            ("growth_factor", growth_factor, growth_factor > 1),
                            ("backoff_factor", backoff_factor, 0 < backoff_factor < 1)):
            if not (isinstance(v, (int, float, np.floating, np.integer)) and np.isfinite(v)
                    and ok):
                raise ArgumentError(f"GradScaler {name} out of range: {v!r}")
        if not isinstance(growth_interval, (int, np.integer)) or \
                not 1 <= growth_interval < 2 ** 31:
            raise ArgumentError(f"growth_interval must be a positive int, got "
                                f"{growth_interval!r}")
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        # scale, good steps, skipped; on the device clnn.ops.optim.loss_scale_state
        self._state = optim_ops.DeviceCopy(
            [float(init_scale), 0, 0], lambda v: optim_ops.loss_scale_state(*v),
            lambda a: [optim_ops.read_loss_scale_state(a)[i] for i in (0, 3, 4)])

    def _field(i):
        def get(self):
            return self._state.values()[i]

        def put(self, value):
            self._state.set(i, value)
        return property(get, put)

    scale, good_steps, skipped = _field(0), _field(1), _field(2)
    del _field

    def update(self, finite):
        """After a step: ``finite`` whether its gradients were all finite."""
        if finite:
            self.good_steps += 1
            if self.good_steps >= self.growth_interval:
                self.scale *= self.growth_factor
                self.good_steps = 0
        else:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1

    def device_state(self, dev):
        """The state as a float32 array on device ``dev`` (uploaded from the host's
        when that is newer), which the step's kernels then read and update: from now
        on the device's copy is the current one."""
        return self._state.on(dev)

    def device_update(self, grads, count):
        """The step's check and update on the device (from device_state's array): the
        ``grads`` (float32, or the step's 16-bit ones; None: the mark that
        clnn.ops.optim.cast_gradients left in the state) all finite or not, as update()
        would do it; ``count`` (an optimizer's device_count) counts the step unless it
        is skipped."""
        optim_ops.loss_scale_update(grads, self._state.array, count=count,
                                    growth_factor=self.growth_factor,
                                    backoff_factor=self.backoff_factor,
                                    growth_interval=self.growth_interval)

    def device_cast_update(self, grads, out, count):
        """device_update from a mixed-precision step's 16-bit ``grads``, cast to float32
        into ``out`` in the same pass (clnn.ops.optim.cast_gradients with update): one
        launch for the cast, the check and the update."""
        optim_ops.cast_gradients(grads, out, self._state.array, update=True, count=count,
                                 growth_factor=self.growth_factor,
                                 backoff_factor=self.backoff_factor,
                                 growth_interval=self.growth_interval)

    def config(self):
        return {"scale": self.scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "good_steps": self.good_steps,
                "skipped": self.skipped}

    @classmethod
    def from_config(cls, cfg):
        s = cls(cfg["scale"], cfg["growth_factor"], cfg["backoff_factor"],
                cfg["growth_interval"])
        s.good_steps, s.skipped = int(cfg["good_steps"]), int(cfg["skipped"])
        return s


def all_finite(flat):
    """Whether every element of a float32 device array is finite: its sum is (an inf
    or NaN anywhere makes it inf or NaN; float16 gradients, at most 65504 each, cannot
    overflow a float32 sum). One value read back: the host decides to skip."""
    return bool(np.isfinite(float(clnn.sum(flat).get())))


def mixed_dtype(precision, net):
    """The 16-bit dtype of mixed-precision work on ``net`` (float16 or bfloat16), or
    None for work in its own dtype."""
    if precision is None or (isinstance(precision, str) and
                             precision == dtype_name(net.dtype)):
        return None
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ArgumentError(f"precision must be one of {', '.join(PRECISIONS)}, got "
                            f"{precision!r}")
    if net.dtype != np.float32:
        raise ArgumentError(f"precision={precision!r} trains a float32 network (its "
                            f"master weights); this one is {net.dtype.name}")
    return np.dtype(precision)


def scaled(low):
    """Whether mixed precision in ``low`` (mixed_dtype's) scales its loss: float16's."""
    return low is not None and low == np.float16


def check_precision(precision, net):
    """mixed_dtype; a float16 step's network gets a GradScaler with PyTorch's
    defaults unless it has one."""
    low = mixed_dtype(precision, net)
    if scaled(low) and net.scaler is None:
        net.scaler = GradScaler()
    return low


def record_epoch(hist, scaler, skipped_before):
    """An epoch's "skipped_steps" and the "loss_scale" at its end into a fit's history;
    returns the skipped count to measure the next epoch from."""
    hist.setdefault("skipped_steps", []).append(scaler.skipped - skipped_before)
    hist.setdefault("loss_scale", []).append(scaler.scale)
    return scaler.skipped


class HalfCopy:
    """The 16-bit side of a float32 network: a flat copy of its parameters in ``dtype``
    (float16 or bfloat16) and a flat gradient buffer of that dtype, laid out as the
    float32 ones, with the views the layers use while a mixed-precision step runs."""

    def __init__(self, net, dtype=np.float16):
        n = net.flat_parameters.size if net.flat_parameters is not None else 0
        self.dtype = np.dtype(dtype)
        self.params = clnn.zeros((n,), self.dtype, net.device) if n else None
        self.grads = clnn.zeros((n,), self.dtype, net.device) if n else None
        self.views = {(id(layer), name): self.params[off:off + k].reshape(shape)
                      for layer, name, shape, off, k in net._layout}
        gviews = {(id(layer), name): self.grads[off:off + k].reshape(shape)
                  for layer, name, shape, off, k in net._layout}
        self.grad_lists = [[gviews[id(layer), name] for name in layer.parameter_names]
                           for layer in net.layers]
