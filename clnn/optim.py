"""Optimizers and learning-rate schedules, with PyTorch's names, defaults and formulas.

    net.fit(x, y, optimizer=clnn.optim.Adam(lr=1e-3), scheduler=...)

An optimizer updates a network's parameters from the gradients a training step
computed (sums over the batch; the step passes ``grad_scale = 1/batch``). Its state
(momentum buffers, moments, the step count) lives in the device pool, is allocated at
the first step before anything is written, and is saved with the network
(``Sequential.save``) so ``load`` resumes training bitwise where it stopped.

Schedules change ``optimizer.lr`` once per ``step()`` (``fit`` steps them after
every epoch), with the semantics of torch.optim.lr_scheduler's classes of the same name.
"""

import math

import numpy as np

import clnn
from .errors import ArgumentError
from .ops._args import finite
from .ops.optim import DeviceCopy


def _nonneg(value, name):
    v = finite(value, name)
    if v < 0:
        raise ArgumentError(f"{name} must be >= 0, got {value!r}")
    return v


class Optimizer:
    """Base class: ``state`` holds, per parameter, the buffers of ``buffers()`` names.
    ``gated``: whether step() takes a ``gate`` (a mixed-precision step's loss-scale
    state on the device, which skips or unscales the update without the host reading
    it). ``steps`` counts the updates applied (Adam's t); while gated steps run, the
    device counts them (device_count) and reading ``steps`` reads that back."""
    kind = None
    gated = False

    def __init__(self, lr):
        self.lr = _nonneg(lr, "lr")
        self._count = DeviceCopy([0], lambda v: np.array(v, np.int32),
                                 lambda a: [int(a[0])])
        self.state = None             # per parameter: a list of device arrays

    @property
    def steps(self):
        return self._count.values()[0]

    @steps.setter
    def steps(self, value):
        self._count.set(0, int(value))

    def device_count(self, dev):
        """The count of updates applied as an int32 array of one on device ``dev``
        (uploaded from ``steps`` when that is newer), which gated steps count on
        (clnn.ops.optim.loss_scale_update) and Adam reads its t from: from now on the
        device's count is the current one."""
        return self._count.on(dev)

    def buffers(self):
        return ()

    def prepare(self, params):
        """Allocate (zeroed) state for ``params`` unless it exists: the training step
        calls this before its first write, so a failure here changes nothing."""
        if self.state is None or len(self.state) != len(params) or any(
                s[0].shape != p.shape for s, p in zip(self.state, params) if s):
            self.state = [[clnn.zeros(p.shape, p.dtype, clnn.device_of(p))
                           for _ in self.buffers()] for p in params]

    def step(self, params, grads, grad_scale=1.0, gate=None, copies=None):
        """Update every parameter from its gradient (times ``grad_scale``). With a
        ``gate`` (see clnn.ops.optim.sgd_step) the device decides whether the update
        applies, and counts it in device_count's array, which loss_scale_update
        must have been given for this step. ``copies``: per parameter, a 16-bit copy
        (or None) that the update's kernel also writes (sgd_step's ``copy``)."""
        if gate is not None and not self.gated:
            raise ArgumentError(f"{self.kind or type(self).__name__} takes no gate")
        if gate is not None and not self._count.device_newer:
            raise ArgumentError("a gated step counts on the device: pass device_count() "
                                "to loss_scale_update first")
        self.prepare(params)
        if gate is None:
            self.steps += 1
        for p, g, s, c in zip(params, grads, self.state, copies or [None] * len(params)):
            self._update(p, g, s, grad_scale, gate, c)

    # persistence: a JSON-able config and the state's arrays
    def config(self):
        raise NotImplementedError

    def state_arrays(self):
        return [[b.get() for b in s] for s in (self.state or [])]

    def load_state(self, params, arrays, steps):
        self.prepare(params)
        for s, host in zip(self.state, arrays):
            for b, h in zip(s, host):
                b.set(np.ascontiguousarray(h))
        self.steps = int(steps)


class SGD(Optimizer):
    """torch.optim.SGD: momentum (dampening 0), Nesterov, L2 weight decay."""
    kind = "SGD"
    gated = True

    def __init__(self, lr=0.01, momentum=0.0, nesterov=False, weight_decay=0.0):
        super().__init__(lr)
        self.momentum = _nonneg(momentum, "momentum")
        if self.momentum >= 1:
            raise ArgumentError(f"momentum must lie in [0, 1), got {momentum!r}")
        self.nesterov = bool(nesterov)
        if self.nesterov and self.momentum == 0:
            raise ArgumentError("nesterov momentum needs momentum > 0")
        self.weight_decay = _nonneg(weight_decay, "weight_decay")

    def buffers(self):
        return ("momentum_buffer",)

    def _update(self, p, g, s, grad_scale, gate=None, copy=None):
        clnn.sgd_step(p, g, s[0], lr=self.lr, momentum=self.momentum,
                      weight_decay=self.weight_decay, nesterov=self.nesterov,
                      grad_scale=grad_scale, gate=gate, copy=copy)

    def config(self):
        return {"type": self.kind, "lr": self.lr, "momentum": self.momentum,
                "nesterov": self.nesterov, "weight_decay": self.weight_decay}


class Adam(Optimizer):
    """torch.optim.Adam (L2 weight decay added to the gradient)."""
    kind = "Adam"
    decoupled = False
    gated = True

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(lr)
        try:
            b1, b2 = (finite(b, "betas") for b in betas)
        except (TypeError, ValueError):
            raise ArgumentError(f"betas must be two numbers, got {betas!r}") from None
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ArgumentError(f"betas must lie in [0, 1), got {betas!r}")
        self.betas = (b1, b2)
        self.eps = finite(eps, "eps")
        if self.eps <= 0:
            raise ArgumentError(f"eps must be > 0, got {eps!r}")
        self.weight_decay = _nonneg(weight_decay, "weight_decay")

    def buffers(self):
        return ("exp_avg", "exp_avg_sq")

    def _update(self, p, g, s, grad_scale, gate=None, copy=None):
        # gated: t is the device's count, which the loss-scale update just moved
        clnn.adam_step(p, g, s[0], s[1],
                       step=self.steps if gate is None else self._count.array,
                       lr=self.lr, betas=self.betas, eps=self.eps,
                       weight_decay=self.weight_decay, decoupled=self.decoupled,
                       grad_scale=grad_scale, gate=gate, copy=copy)

    def config(self):
        return {"type": self.kind, "lr": self.lr, "betas": list(self.betas),
                "eps": self.eps, "weight_decay": self.weight_decay}


class AdamW(Adam):
    """torch.optim.AdamW: weight decay applied to the weights (default 0.01)."""
    kind = "AdamW"
    decoupled = True

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(lr, betas, eps, weight_decay)


OPTIMIZERS = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}


def from_config(cfg):
    """An optimizer from ``Optimizer.config()`` (checkpoints)."""
    if not isinstance(cfg, dict) or cfg.get("type") not in OPTIMIZERS:
        raise ArgumentError(f"not an optimizer configuration: {cfg!r}")
    cfg = dict(cfg)
    kind = OPTIMIZERS[cfg.pop("type")]
    try:
        return kind(**cfg)
    except TypeError as exc:
        raise ArgumentError(f"bad {kind.__name__} configuration: {exc}") from None


# ---------------------------------------------------------------- schedules

def _positive_int(value, name):
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise ArgumentError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class Schedule:
    """``step()`` once per epoch; lr = base_lr * factor(epochs stepped)."""

    def __init__(self, optimizer):
        if not isinstance(optimizer, Optimizer):
            raise ArgumentError(f"a schedule needs a clnn.optim optimizer, got "
                                f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.base_lr = optimizer.lr
        self.epoch = 0
        optimizer.lr = self.lr_at(0)

    def step(self):
        self.epoch += 1
        self.optimizer.lr = self.lr_at(self.epoch)
        return self.optimizer.lr


class StepLR(Schedule):
    """lr = base_lr * gamma ** (epoch // step_size), as torch's StepLR."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        self.step_size = _positive_int(step_size, "step_size")
        self.gamma = _nonneg(gamma, "gamma")
        super().__init__(optimizer)

    def lr_at(self, epoch):
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(Schedule):
    """lr = eta_min + (base_lr - eta_min) (1 + cos(pi epoch / T_max)) / 2, the closed
    form of torch's CosineAnnealingLR."""

    def __init__(self, optimizer, T_max, eta_min=0.0):
        self.T_max = _positive_int(T_max, "T_max")
        self.eta_min = _nonneg(eta_min, "eta_min")
        super().__init__(optimizer)

    def lr_at(self, epoch):
        return self.eta_min + (self.base_lr - self.eta_min) * \
            (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(Schedule):
    """Linear warm-up: the factor goes from start_factor to end_factor over
    total_iters epochs, then stays (torch's LinearLR)."""

    def __init__(self, optimizer, start_factor=1 / 3, end_factor=1.0, total_iters=5):
        self.start, self.end = finite(start_factor, "start_factor"), finite(end_factor,
                                                                           "end_factor")
        if not (0 < self.start <= 1 and 0 <= self.end <= 1):
            raise ArgumentError("start_factor must lie in (0, 1] and end_factor in [0, 1]")
        self.total = _positive_int(total_iters, "total_iters")
        super().__init__(optimizer)

    def lr_at(self, epoch):
        t = min(epoch, self.total) / self.total
        return self.base_lr * (self.start + (self.end - self.start) * t)
