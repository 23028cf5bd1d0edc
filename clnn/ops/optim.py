"""Optimizer steps on one parameter buffer, each one fused kernel (clnn/kernels/optim.cl):
the parameter, its gradient and the optimizer's state are read and written once.

Both follow torch.optim's formulas; ``grad_scale`` multiplies the gradient first (1/batch
for a gradient summed over a batch, as clnn's networks compute them). The optimizer
objects in clnn.optim call these.
"""

import math

from .. import programs
from ..errors import ArgumentError, ShapeError
from ._args import check, common_device, done, finite, launch, offset, overlaps

programs.register("optim", {}, lambda: [{}])


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


def _kernel(dev, dt, entry):
    return programs.get_kernel(dev, "optim", entry, {"dtype": programs.dtype_name(dt)})


def sgd_step(weight, grad, buf, *, lr, momentum=0.0, weight_decay=0.0, nesterov=False,
             grad_scale=1.0):
    """torch.optim.SGD's step (dampening 0) in place: g = grad_scale * grad +
    weight_decay * weight; buf = momentum * buf + g; weight -= lr * (g + momentum * buf
    if nesterov else buf). ``buf`` starts at zero. Returns weight."""
    dev, dt = _buffers(weight, grad, {"buf": buf})
    lr, momentum = finite(lr, "lr", dt), finite(momentum, "momentum", dt)
    wd, scale = finite(weight_decay, "weight_decay", dt), finite(grad_scale, "grad_scale", dt)
    if lr < 0 or momentum < 0 or wd < 0:
        raise ArgumentError("lr, momentum and weight_decay must be >= 0")
    if nesterov and momentum == 0:
        raise ArgumentError("nesterov momentum needs momentum > 0")
    evt = launch(_kernel(dev, dt, "clnn_sgd_step"), dev, weight.size, lr=lr,
                  momentum=momentum, wd=wd, scale=scale, nesterov=int(bool(nesterov)),
                  grad=grad, g_off=offset(grad), buf=buf, b_off=offset(buf), w=weight,
                  w_off=offset(weight))
    return done(weight, evt)


def adam_step(weight, grad, m, v, *, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
              weight_decay=0.0, decoupled=False, grad_scale=1.0):
    """torch.optim.Adam's step number ``step`` (1, 2, ...) in place, or AdamW's with
    ``decoupled`` (weight decay applied to the weight, not added to the gradient).
    ``m`` and ``v`` (first and second moments) start at zero. Returns weight."""
    dev, dt = _buffers(weight, grad, {"m": m, "v": v})
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ArgumentError(f"step must be an int >= 1, got {step!r}")
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
    step_size = lr / (1 - b1 ** step)
    bc2_sqrt = math.sqrt(1 - b2 ** step)
    evt = launch(_kernel(dev, dt, "clnn_adam_step"), dev, weight.size, lr=lr, beta1=b1,
                  beta2=b2, eps=eps, wd=wd, scale=scale, decoupled=int(bool(decoupled)),
                  step_size=step_size, bc2_sqrt=bc2_sqrt, grad=grad, g_off=offset(grad),
                  m=m, m_off=offset(m), v=v, v_off=offset(v), w=weight,
                  w_off=offset(weight))
    return done(weight, evt)
