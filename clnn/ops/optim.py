"""Optimizer steps on one parameter buffer, each one fused kernel (clnn/kernels/optim.cl):
the parameter, its gradient and the optimizer's state are read and written once.

Both follow torch.optim's formulas; ``grad_scale`` multiplies the gradient first (1/batch
for a gradient summed over a batch, as clnn's networks compute them). The optimizer
objects in clnn.optim call these.
"""

import math

import numpy as np

from .. import programs
from ..device import BFLOAT16, device_of
from ..errors import ArgumentError, DTypeError, ShapeError
from ._args import (check, check_ints, common_device, dev_empty, done, finite, launch,
                    offset, overlaps)
from .elementwise import fill
from .reduce import reduce3

programs.register("optim", {"gated": 0, "copy": "none"},
                  lambda: [{"gated": g, "copy": c} for g in (0, 1)
                           for c in ("none", "float16", "bfloat16")])

# clnn_loss_scale_update's state: seven float32s, S, found, S used, good steps and
# skipped steps (int32 bits), the mark of cast_gradients and its count of finished
# work-groups (int32 bits, 0 between launches; clnn/kernels/_lossscale.cl)
LOSS_SCALE_STATE = 7
LS_MARK = 5


def _buffers(weight, grad, states):
    dev = common_device(weight=weight, grad=grad, **states)
    dt = check(weight, "weight", dev)
    check(grad, "grad", dev, dtype=dt, shape=weight.shape)
    for name, s in states.items():
        check(s, name, dev, dtype=dt, shape=weight.shape)
    arrays = [("weight", weight), ("grad", grad)] + list(states.items())
    for i, (na, a) in enumerate(arrays):
        for nb, b in arrays[i + 1:]:
            if overlaps(a, b):
                raise ShapeError(f"{na} and {nb} overlap; each needs its own buffer")
    return dev, dt


def _kernel(dev, dt, entry, gated=False, copy=None):
    return programs.get_kernel(dev, "optim", entry, {
        "dtype": programs.dtype_name(dt), "gated": int(gated),
        "copy": "none" if copy is None else programs.dtype_name(copy.dtype)})


def _copy_args(copy, weight, dt, others):
    """The kernel arguments of an update's 16-bit ``copy`` of ``weight`` (checked: a
    float16 or bfloat16 array of its shape for float32 weights, overlapping none of
    ``others``), or none."""
    if copy is None:
        return {}
    dev = common_device(weight=weight, copy=copy)
    cdt = check(copy, "copy", dev, shape=weight.shape)
    if dt != np.float32 or cdt not in (np.float16, BFLOAT16):
        raise DTypeError(f"copy takes a float16 or bfloat16 copy of float32 weights, "
                         f"got {cdt} for {dt}")
    for name, a in others.items():
        if a is not None and overlaps(copy, a):
            raise ShapeError(f"copy overlaps {name}; each needs its own buffer")
    return {"wc": copy, "wc_off": offset(copy)}


def _state(state, dev, name="state"):
    """A loss-scale state array (LOSS_SCALE_STATE float32s on ``dev``), checked."""
    check(state, name, dev, dtype=np.float32, shape=(LOSS_SCALE_STATE,))
    return state


def loss_scale_state(scale, good_steps=0, skipped=0):
    """The host values of a loss-scale state: S, found 0, S used (S), and the two
    counts as int32 bits."""
    host = np.array([scale, 0.0, scale, 0.0, 0.0, 0.0, 0.0], np.float32)
    host.view(np.int32)[3:5] = good_steps, skipped
    return host


def read_loss_scale_state(host):
    """(S, found, S used, good steps, skipped steps) from a state read back."""
    ints = np.asarray(host, np.float32).view(np.int32)
    return float(host[0]), bool(host[1]), float(host[2]), int(ints[3]), int(ints[4])


class DeviceCopy:
    """Host values that steps update on a device (a loss scale and its counts, an
    optimizer's count of its updates), read by the host now and then: ``pack`` turns
    the values into the array's host contents, ``unpack`` the array's contents read
    back into the values. values() are the host's, read back once where the device's
    are newer; set() makes the host's the newer; on(dev) is the array on ``dev``,
    uploaded where the host's are newer, and the device's are the newer from then
    on (the caller's kernels update them)."""

    def __init__(self, values, pack, unpack):
        self._values, self._pack, self._unpack = list(values), pack, unpack
        self.array = None
        self.device_newer = False
        self._host_newer = False

    def values(self):
        if self.device_newer:
            self._values = list(self._unpack(self.array.get()))
            self.device_newer = False
        return self._values

    def set(self, i, value):
        self.values()[i] = value
        self._host_newer = True

    def on(self, dev):
        if self.array is None or device_of(self.array) is not dev:
            host = self._pack(self.values())
            self.array = dev_empty(dev, host.shape, host.dtype)
            self.array.set(host)
        elif self._host_newer:
            self.array.set(self._pack(self._values))
        self._host_newer, self.device_newer = False, True
        return self.array


def cast_gradients(grads, out, state, *, update=False, count=None, growth_factor=2.0,
                   backoff_factor=0.5, growth_interval=2000):
    """A mixed-precision step's 16-bit gradients ``grads`` cast to float32 into ``out``
    (as clnn.cast), marking ``state`` (see loss_scale_state) where any is an inf or
    NaN, for loss_scale_update(None, state) to read: one pass over the gradients and
    one launch, where the cast and a count of the non-finite values took two passes
    and, on GPUs, three launches. ``update``: the kernel's last work-group then
    applies loss_scale_update(None, state, count=..., the factors) itself, one launch
    fewer a step; the results are the same. Returns out."""
    dev = common_device(grads=grads, out=out, state=state, count=count)
    gdt = check(grads, "grads", dev)
    if gdt not in (np.float16, BFLOAT16):
        raise DTypeError(f"grads has dtype {gdt}: cast_gradients takes float16 or "
                         f"bfloat16 gradients")
    check(out, "out", dev, dtype=np.float32, shape=grads.shape)
    _state(state, dev)
    if overlaps(out, state):
        raise ShapeError("out overlaps state; each needs its own buffer")
    if not update:
        if count is not None:
            raise ArgumentError("count is for update=True")
        factors = {}
    else:
        growth, backoff, interval = _factors(growth_factor, backoff_factor, growth_interval)
        if count is None:
            count = dev_empty(dev, (1,), np.int32)        # counted, and never read
        else:
            check_ints(count, "count", dev, shape=(1,))
            if overlaps(count, state) or overlaps(count, out):
                raise ShapeError("count overlaps state or out; each needs its own buffer")
        factors = dict(count=count, count_off=offset(count), growth=growth,
                       backoff=backoff, interval=interval)
    if not grads.size:          # no work-group to apply the update: the kernel's
        if update:
            loss_scale_update(None, state, count=count, growth_factor=growth_factor,
                              backoff_factor=backoff_factor,
                              growth_interval=growth_interval)
        return out
    kern = programs.get_kernel(dev, "cast", "clnn_cast", {
        "dtype": "float32", "src": programs.dtype_name(gdt), "mark": 2 if update else 1})
    return done(out, launch(kern, dev, grads.size, x=grads, x_off=offset(grads), out=out,
                            out_off=offset(out), mark=state,
                            mark_off=offset(state) + LS_MARK, **factors))


def _factors(growth_factor, backoff_factor, growth_interval):
    """A loss-scale update's factors as its kernels take them, checked."""
    growth = finite(growth_factor, "growth_factor", np.float32)
    backoff = finite(backoff_factor, "backoff_factor", np.float32)
    if not (growth > 1 and 0 < backoff < 1):
        raise ArgumentError(f"growth_factor must be > 1 and backoff_factor in (0, 1), "
                            f"got {growth_factor!r} and {backoff_factor!r}")
    if not isinstance(growth_interval, (int, np.integer)) or \
            isinstance(growth_interval, (bool, np.bool_)) or \
            not 0 < growth_interval < 2 ** 31:
        raise ArgumentError(f"growth_interval must be a positive int, got "
                            f"{growth_interval!r}")
    return growth, backoff, int(growth_interval)


def loss_scale_update(grads, state, *, count=None, growth_factor=2.0, backoff_factor=0.5,
                      growth_interval=2000):
    """PyTorch's GradScaler update, on the device and without reading anything back:
    count ``grads``' (a float32, float16 or bfloat16 array's: the 16-bit gradients of a
    mixed-precision step, read at half the bytes of their float32 copy) infs and NaNs,
    or with ``grads`` None read the mark cast_gradients left in ``state``, and update
    ``state`` (see loss_scale_state): a step with any is marked found (a gated
    sgd_step or adam_step then changes nothing) and S times ``backoff_factor``; after
    ``growth_interval`` good steps in a row S times ``growth_factor``; the mark is
    cleared. ``count`` (an int32 device array of one, an optimizer's count of the
    updates applied) goes up by one unless the step is skipped. Returns state."""
    dev = common_device(grads=grads, state=state, count=count)
    if grads is not None:
        gdt = check(grads, "grads", dev)
        if gdt not in (np.float32, np.float16, BFLOAT16):
            raise DTypeError(f"grads has dtype {gdt}: the loss scale checks float32, "
                             f"float16 or bfloat16 gradients")
    _state(state, dev)
    if count is not None:
        check_ints(count, "count", dev, shape=(1,))
    growth, backoff, interval = _factors(growth_factor, backoff_factor, growth_interval)
    if count is None:
        count = dev_empty(dev, (1,), np.int32)        # counted, and never read
    if grads is None:
        bad, bad_off = state, offset(state) + LS_MARK
    else:
        bad, bad_off = dev_empty(dev, (), np.float32), 0
        if grads.size:
            reduce3(dev, gdt, grads, (1, grads.size, 1), bad, map="bad", outp="acc")
        else:
            fill(bad, 0.0)
    kern = _kernel(dev, np.dtype(np.float32), "clnn_loss_scale_update")
    return done(state, kern((1,), (1,), bad=bad, bad_off=bad_off, state=state,
                            st_off=offset(state), count=count, count_off=offset(count),
                            growth=growth, backoff=backoff, interval=interval))


def sgd_step(weight, grad, buf, *, lr, momentum=0.0, weight_decay=0.0, nesterov=False,
             grad_scale=1.0, gate=None, copy=None):
    """torch.optim.SGD's step (dampening 0) in place: g = grad_scale * grad +
    weight_decay * weight; buf = momentum * buf + g; weight -= lr * (g + momentum * buf
    if nesterov else buf). ``buf`` starts at zero. ``gate``: a loss-scale state
    (loss_scale_update's) that the kernel reads: nothing changes where it marks the
    step's gradients non-finite, else grad_scale is divided by the S they were computed
    with. ``copy``: a float16 or bfloat16 array of float32 ``weight``'s shape that the
    kernel also stores the updated weights in, bitwise clnn.cast's (a skipped step
    leaves it as it was: a copy that held the weights still does). Returns weight."""
    dev, dt = _buffers(weight, grad, {"buf": buf})
    extra = {}
    if gate is not None:
        common_device(weight=weight, gate=gate)
        extra = {"state": _state(gate, dev, "gate"), "st_off": offset(gate)}
    extra.update(_copy_args(copy, weight, dt, {"weight": weight, "grad": grad, "buf": buf,
                                               "gate": gate}))
    lr, momentum = finite(lr, "lr", dt), finite(momentum, "momentum", dt)
    wd, scale = finite(weight_decay, "weight_decay", dt), finite(grad_scale, "grad_scale", dt)
    if lr < 0 or momentum < 0 or wd < 0:
        raise ArgumentError("lr, momentum and weight_decay must be >= 0")
    if nesterov and momentum == 0:
        raise ArgumentError("nesterov momentum needs momentum > 0")
    evt = launch(_kernel(dev, dt, "clnn_sgd_step", gate is not None, copy), dev, weight.size,
                 lr=lr, momentum=momentum, wd=wd, scale=scale, nesterov=int(bool(nesterov)),
                 grad=grad, g_off=offset(grad), buf=buf, b_off=offset(buf), w=weight,
                 w_off=offset(weight), **extra)
    return done(weight, evt)


def adam_step(weight, grad, m, v, *, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
              weight_decay=0.0, decoupled=False, grad_scale=1.0, gate=None, copy=None):
    """torch.optim.Adam's step number ``step`` (1, 2, ...) in place, or AdamW's with
    ``decoupled`` (weight decay applied to the weight, not added to the gradient).
    ``m`` and ``v`` (first and second moments) start at zero. ``gate``: a loss-scale
    state, as for sgd_step; ``step`` is then an int32 device array of one that holds
    the step number (the count loss_scale_update keeps), read by the kernel, which
    computes the bias corrections itself. ``copy``: a 16-bit copy of the weights kept
    so, as for sgd_step. Returns weight."""
    dev, dt = _buffers(weight, grad, {"m": m, "v": v})
    if gate is not None:
        common_device(weight=weight, gate=gate, step=step)
        _state(gate, dev, "gate")
        check_ints(step, "step", dev, shape=(1,))
    elif not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ArgumentError(f"step must be an int >= 1, got {step!r}")
    copied = _copy_args(copy, weight, dt, {"weight": weight, "grad": grad, "m": m, "v": v,
                                           "gate": gate, "step": step if gate is not None
                                           else None})
    lr, eps = finite(lr, "lr", dt), finite(eps, "eps", dt)
    wd, scale = finite(weight_decay, "weight_decay", dt), finite(grad_scale, "grad_scale", dt)
    try:
        b1, b2 = (finite(b, "betas", dt) for b in betas)
    except (TypeError, ValueError):
        raise ArgumentError(f"betas must be two numbers, got {betas!r}") from None
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ArgumentError(f"betas must lie in [0, 1), got {betas!r}")
    if lr < 0 or eps <= 0 or wd < 0:
        raise ArgumentError("lr and weight_decay must be >= 0 and eps > 0")
    if gate is None:
        extra = dict(step_size=lr / (1 - b1 ** step), bc2_sqrt=math.sqrt(1 - b2 ** step))
    else:
        extra = dict(log_beta1=math.log(b1) if b1 else -math.inf,
                     log_beta2=math.log(b2) if b2 else -math.inf, state=gate,
                     st_off=offset(gate), count=step, count_off=offset(step))
    evt = launch(_kernel(dev, dt, "clnn_adam_step", gate is not None, copy), dev,
                 weight.size, lr=lr, beta1=b1, beta2=b2, eps=eps, wd=wd, scale=scale,
                 decoupled=int(bool(decoupled)), grad=grad, g_off=offset(grad), m=m,
                 m_off=offset(m), v=v, v_off=offset(v), w=weight, w_off=offset(weight),
                 **extra, **copied)
    return done(weight, evt)
