"""Launch plans per call shape: an op called again with arrays of the same shapes,
layouts, dtypes, offsets and devices, and the same other arguments, enqueues the
kernels it enqueued last time without the Python that checked its arguments and chose
them.

A convolution's Python (checks, geometry, the tuning table, tiles, its launches' 30-odd
arguments) took about 200 us a call where its kernels take 20-50 us on a GPU (LeNet's
layers on an H100): most of the call. Wrapped: convolutions, gemm, pooling,
batch_norm and its backward pass, bias_add and bias_grad, the reductions (sum, mean,
max, dot, nrm2), softmax and log_softmax, and the element-wise ops but fill and copy.
Even a single launch gains: its Python (checks, output, kernel choice, arguments) took
19 us for a sum along rows and 12-13 us for relu, 8 and 9 us planned (Python alone, on
a 2-core Xeon); on an H200 a sum along rows of 16384 x 1024 spent about 40 us of its
81 us beside its kernel. How it works, for an op wrapped with ``@memoized``:

- the first call with a key runs as usual; the second runs inside
  ``programs.captured()`` and the pool's ``watching()``, and becomes a plan: each
  launch with its argument values, where a buffer of an argument array, a buffer the
  call asked the pool for (its temporaries and its result) or a constant (a cached
  table) stood;
- later calls with the key ask the pool for the same sizes in the same order (so an
  allocation fails before anything is enqueued, as in the op), put the buffers into
  the argument values and enqueue the launches. They hold every temporary until the
  launches are enqueued, where the op may have let one go before asking for the next:
  a planned call can need a little more of the pool at once than the op did.

What the key holds decides every check the op makes and every choice of kernel: each
array's shape, strides, dtype, offset and queue, which arrays share a buffer (overlap
checks), the other arguments by type and value; the device's pool budget (scratch
caps), the float32 matmul precision, the tuning database's generation, and no tuning
override in force. Any other argument (a numpy array, an unknown object) runs the op as
usual, which checks it. A change to a module clnn's ops read their settings from (a
test's ``monkeypatch`` of a constant or a helper) starts a new epoch of keys:
``watch`` swaps such a module's class for one that counts attribute writes. Ops that
read results back to the host, or take a key that changes every call (dropout), are
not wrapped.
"""

import collections
import functools
import importlib
import types

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from .. import programs, tuning
from ..device import device_of

# keys kept (seen once or planned), the least recently used given up first: an op
# called with a new scalar every time (an lr schedule through scale, a weighted loss's
# 1 / denominator) adds a key a call, and emptying the whole table at the limit made
# every other op plan again, once per PLANS such calls
PLANS = 1024
_plans = collections.OrderedDict()
_SEEN = object()        # a key's first call: planned on its second
_NEVER = object()       # a call that cannot be replayed (its result is not its own)


class _Epoch:
    value = 0


class _Watched(types.ModuleType):
    """A module whose attribute writes (monkeypatch.setattr, mock.patch.object) move
    the plans' epoch on: a plan made under the old value is never used again."""

    def __setattr__(self, name, value):
        _Epoch.value += 1
        super().__setattr__(name, value)

    def __delattr__(self, name):
        _Epoch.value += 1
        super().__delattr__(name)


def watch(*names):
    """Count attribute writes to the modules ``names`` (their settings decide plans)."""
    for name in names:
        module = importlib.import_module(name)
        if type(module) is types.ModuleType:
            module.__class__ = _Watched


def clear():
    _plans.clear()
    _Epoch.value += 1


def settings(dev):
    """What decides the kernels an op chooses on ``dev`` besides its arguments: the
    count of settings changes (see watch) and clears, the pool budget (scratch caps),
    the float32 matmul precision and the tuning database's generation; None while a
    tuning override is in force (nothing is planned or captured then). Plans key on
    it, and so do captured training steps and inference passes (clnn/nn/network.py),
    which a change of these settings captures anew."""
    if getattr(tuning._override, "stack", None):
        return None
    return (_Epoch.value, dev.pool.budget, tuning.get_float32_matmul_precision(),
            tuning.db_generation())


_SCALARS = (int, float, bool, str, type(None), np.generic)


def _value_key(v, arrays):
    """The key of one argument (arrays are appended to ``arrays``), or raise KeyError
    for one the plan cannot stand for."""
    t = type(v)
    if t is cla.Array:
        arrays.append(v)
        if v.queue is None:
            raise KeyError
        return (v.shape, v.strides, v.dtype, v.offset, v.queue)
    if t is float or isinstance(v, np.floating):
        return (t, float(v).hex())          # -0.0 and 0.0 apart
    if isinstance(v, _SCALARS):
        return (t, v)
    if t is tuple or t is list:
        return (t,) + tuple(_value_key(i, arrays) for i in v)
    raise KeyError


def _key(fn, args, kwargs):
    """(key, argument arrays, device), or Nones where the call cannot be planned."""
    arrays = []
    try:
        parts = [_value_key(v, arrays) for v in args]
        parts += [(k, _value_key(kwargs[k], arrays)) for k in sorted(kwargs)]
    except KeyError:
        return None, None, None
    if not arrays:
        return None, None, None
    dev = device_of(arrays[0])
    now = settings(dev)
    if now is None:
        return None, None, None
    # which arrays share a buffer (an overlap check's outcome)
    bufs = [a.base_data for a in arrays]
    shared = tuple(next(j for j, c in enumerate(bufs) if c is b) for b in bufs)
    key = (fn, dev, now, shared, tuple(parts))
    try:
        hash(key)
    except TypeError:
        return None, None, None
    return key, arrays, dev


class _Plan:
    """An op call's launches with the places its buffers go (see the module's doc)."""

    def __init__(self, dev, launches, requests, arrays, result):
        self.pool = dev.pool
        self.sizes = [n for n, _ in requests]
        new = {}
        for j, (_, buf) in enumerate(requests):
            new.setdefault(id(buf), j)
        given = {}
        for i, a in enumerate(arrays):
            if a.base_data is not None:
                given.setdefault(id(a.base_data), i)
        self.launches = []
        for kern, gs, ls, values in launches:
            slots, template = [], list(values)
            for i, v in enumerate(values):
                if not isinstance(v, cl.MemoryObjectHolder):
                    continue
                if id(v) in new:
                    slots.append((i, True, new[id(v)]))
                    template[i] = None
                elif id(v) in given:
                    slots.append((i, False, given[id(v)]))
                    template[i] = None
                # else a constant (a cached table): kept, and kept alive
            self.launches.append((kern, gs, ls, template, tuple(slots)))
        self.results = []
        for r in (result if isinstance(result, tuple) else (result,)):
            same = [i for i, a in enumerate(arrays) if a is r]
            if r is None:                   # (batch_norm_backward's missing gradients)
                self.results.append((None, None))
            elif same:
                self.results.append((False, same[0]))
            elif type(r) is cla.Array and r.base_data is not None and \
                    id(r.base_data) in new and not r.events:
                self.results.append((True, (new[id(r.base_data)], r.shape, r.dtype,
                                            r.strides, r.offset, r.size)))
            else:
                raise ValueError("a result the plan cannot make")
        self.single = not isinstance(result, tuple)
        self.context, self.queue = dev.context, dev.queue

    def run(self, arrays):
        bufs = [self.pool(n) for n in self.sizes]     # all before any launch
        for kern, gs, ls, template, slots in self.launches:
            values = list(template)
            for i, fresh, j in slots:
                values[i] = bufs[j] if fresh else arrays[j].base_data
            programs.enqueue(kern, gs, ls, values)
        out = []
        for fresh, spec in self.results:
            if not fresh:
                out.append(None if spec is None else arrays[spec])
                continue
            j, shape, dtype, strides, offset, size = spec
            out.append(cla.Array(None, shape, dtype, allocator=self.pool, data=bufs[j],
                                 offset=offset, strides=strides, _fast=True, _size=size,
                                 _context=self.context, _queue=self.queue))
        return out[0] if self.single else tuple(out)


def memoized(fn):
    """Wrap an op so that calls with a key it has run twice replay its launches."""
    @functools.wraps(fn)
    def op(*args, **kwargs):
        key, arrays, dev = _key(op, args, kwargs)
        if key is None:
            return fn(*args, **kwargs)
        plan = _plans.get(key)
        try:
            if plan is None:
                while len(_plans) >= PLANS:
                    _plans.popitem(last=False)
            else:
                _plans.move_to_end(key)
        except KeyError:          # another thread's call took it (or the last) out first
            pass
        if plan is None:
            result = fn(*args, **kwargs)
            _plans[key] = _SEEN
            return result
        if plan is _NEVER:
            return fn(*args, **kwargs)
        if plan is not _SEEN:
            return plan.run(arrays)
        with programs.captured() as launches, dev.pool.watching() as requests:
            result = fn(*args, **kwargs)
        try:
            _plans[key] = _Plan(dev, launches, requests, arrays, result)
        except ValueError:
            _plans[key] = _NEVER
        return result
    op.unplanned = fn
    return op
