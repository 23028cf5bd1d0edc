"""Element-wise routines: activations and their derivatives, Hadamard, axpy, scale,
fill, copy. Kernels: clnn/kernels/elementwise.cl.

Every routine takes ``out=``: ``None`` allocates from the device's pool, an input
array computes in place, any other array of the right shape and dtype is overwritten.
"""


from .. import programs, tuning
from ..errors import ArgumentError
from ._memo import memoized
from ._args import check, check_out, common_device, done, finite, launch, offset, real

ACTIVATIONS = ("identity", "sigmoid", "tanh", "relu", "leaky_relu", "elu", "softplus")
# The parameter p of each activation that has one, and its default: the leaky_relu
# slope, the elu alpha, softplus's beta (its threshold, PyTorch's 20, is a second one).
ACTIVATION_PARAMS = {"leaky_relu": 0.01, "elu": 1.0, "softplus": 1.0}
SOFTPLUS_THRESHOLD = 20.0

# GPUs: elements each work-item loads before it computes (elementwise.cl's each()). A
# grid-stride loop of one load at a time reached 0.67x PyTorch CUDA's relu on an H200
# (2596 against 3863 GB/s; PyTorch's kernels load several elements per thread at once)
# and 0.88x on an H100 (kernel time): the H200's bandwidth needs more bytes in flight.
# Not yet timed on a GPU (benchmarks/gpu_session.sh times 1 against 4).
GPU_UNROLL = 4

programs.register(
    "elementwise", {"op": "act", "act": "sigmoid", "src": "z", "inplace": "", "unroll": 1},
    lambda: [dict(v, unroll=u) for u in (1, GPU_UNROLL) for v in
             [{"op": "act", "act": a, "src": s} for a in ACTIVATIONS for s in ("z", "a")]
             + [{"op": "act", "act": "relu", "src": "a", "inplace": "dy"},
                {"op": "act", "act": "tanh", "src": "z", "inplace": "src"},
                {"op": "act", "act": "elu", "src": "z", "inplace": "z"},
                {"op": "linalg"}, {"op": "linalg", "inplace": "x"},
                {"op": "linalg", "inplace": "y"}]])


def unroll(dev):
    """The kernels' ``unroll``: GPU_UNROLL on GPUs, 1 (the CPU loops) on CPUs; a test or
    benchmark forces either with tuning.override("elementwise", {"unroll": u})."""
    forced = tuning.forced("elementwise")
    if forced and "unroll" in forced:
        return int(forced["unroll"])
    return 1 if dev.facts.is_cpu else GPU_UNROLL


def elementwise_kernel(dev, dtype, entry, **params):
    return programs.get_kernel(dev, "elementwise", entry,
                               dict(params, dtype=programs.dtype_name(dtype), unroll=unroll(dev)))


def inplace(out, **inputs):
    """The name of the input that ``out`` is (the same buffer at the same offset; a
    partial overlap was refused by check_out), or "": the kernels' ``inplace``
    parameter, so they store through that input's pointer."""
    if out.base_data is None:                    # empty: nothing is launched
        return ""
    ptr, off = out.base_data.int_ptr, out.offset
    for name, x in inputs.items():
        if x is out or (x.base_data is not None and x.base_data.int_ptr == ptr and
                        x.offset == off):
            return name
    return ""


def activation_parameter(name, param, dt=None):
    """The kernels' (p, q) for activation ``name`` and the user's ``param``: the
    leaky_relu slope, the elu alpha, softplus's beta or (beta, threshold); q is the
    threshold for softplus and unused by the others."""
    if name not in ACTIVATIONS:
        raise ArgumentError(f"unknown activation {name!r}; choose from {', '.join(ACTIVATIONS)}")
    q = 0.0
    if name == "softplus":
        q = SOFTPLUS_THRESHOLD
        if isinstance(param, (tuple, list)):
            if len(param) != 2:
                raise ArgumentError(f"softplus takes beta or (beta, threshold), got {param!r}")
            param, q = param
            q = finite(q, "softplus threshold", dt)
    if param is None:
        return ACTIVATION_PARAMS.get(name, 0.0), q
    p = finite(param, f"{name} parameter", dt)
    if name == "elu" and p <= 0:
        raise ArgumentError(f"elu alpha must be positive, got {p}")
    if name == "leaky_relu" and p < 0:
        raise ArgumentError(f"leaky_relu slope must be >= 0, got {p}")
    if name == "softplus" and p <= 0:
        raise ArgumentError(f"softplus beta must be positive, got {p}")
    return p, q


@memoized
def activation(name, z, out=None, param=None):
    """out = f(z) for activation ``name`` (``param``: leaky_relu slope, elu alpha,
    softplus beta or (beta, threshold))."""
    dev = common_device(z=z, out=out)
    dt = check(z, "z", dev)
    p, q = activation_parameter(name, param, dt)
    out = check_out(out, z.shape, dt, dev, inputs=(z,))
    kern = elementwise_kernel(dev, dt, "clnn_act_forward", op="act", act=name, src="z",
                              inplace=inplace(out, z=z))
    evt = launch(kern, dev, z.size, p=p, q=q, z=z, z_off=offset(z), out=out,
                 out_off=offset(out))
    return done(out, evt)


def _source(z, a, name):
    if (z is None) == (a is None):
        raise ArgumentError(f"give exactly one of z (pre-activation) or a (output) for "
                            f"the {name} derivative")
    return ("z", z) if a is None else ("a", a)


def _check_source(name, src, q):
    # softplus's two branches reach the same outputs a in (t, log(1 + e^t)] / beta for
    # threshold t: from a, the derivative there is off by up to e^-t, so below PyTorch's
    # default (e^-20 = 2e-9) it is computed from z only
    if src == "a" and name == "softplus" and q < SOFTPLUS_THRESHOLD:
        raise ArgumentError(f"the softplus derivative with threshold {q:g} < "
                            f"{SOFTPLUS_THRESHOLD:g} needs z, not a: both branches "
                            "produce some of the same outputs")


@memoized
def activation_derivative(name, *, z=None, a=None, out=None, param=None):
    """out = f'(z), from ``z`` or, usually cheaper, from the output ``a = f(z)``."""
    src, x = _source(z, a, name)
    dev = common_device(**{src: x}, out=out)
    dt = check(x, src, dev)
    p, q = activation_parameter(name, param, dt)
    _check_source(name, src, q)
    if src == "a" and name == "leaky_relu" and p == 0:
        name = "relu"
    out = check_out(out, x.shape, dt, dev, inputs=(x,))
    kern = elementwise_kernel(dev, dt, "clnn_act_derivative", op="act", act=name, src=src,
                              inplace=inplace(out, src=x))
    evt = launch(kern, dev, x.size, p=p, q=q, src=x, src_off=offset(x), out=out,
                 out_off=offset(out))
    return done(out, evt)


@memoized
def activation_backward(name, dy, *, z=None, a=None, out=None, param=None):
    """out = dy * f'(z): the gradient wrt the pre-activation. Overwrites ``out``."""
    src, x = _source(z, a, name)
    dev = common_device(dy=dy, **{src: x}, out=out)
    dt = check(dy, "dy", dev)
    p, q = activation_parameter(name, param, dt)
    _check_source(name, src, q)
    check(x, src, dev, dtype=dt, shape=dy.shape)
    out = check_out(out, dy.shape, dt, dev, inputs=(dy, x))
    kern = elementwise_kernel(dev, dt, "clnn_act_backward", op="act", act=name, src=src,
                              inplace=inplace(out, dy=dy, src=x))
    evt = launch(kern, dev, dy.size, p=p, q=q, dy=dy, dy_off=offset(dy), src=x,
                 src_off=offset(x), out=out, out_off=offset(out))
    return done(out, evt)


def _named(name, doc):
    def f(z, out=None, **kw):
        return activation(name, z, out=out, param=kw.pop(_PNAME.get(name, "param"), None),
                          **kw)
    f.__name__ = name
    f.__doc__ = doc
    return f


_PNAME = {"leaky_relu": "slope", "elu": "alpha"}
identity = _named("identity", "out = z")
sigmoid = _named("sigmoid", "out = 1 / (1 + exp(-z))")
tanh = _named("tanh", "out = tanh(z)")
relu = _named("relu", "out = max(z, 0)")
leaky_relu = _named("leaky_relu", "out = z if z > 0 else slope * z (slope=0.01)")
elu = _named("elu", "out = z if z > 0 else alpha * (exp(z) - 1) (alpha=1.0)")


def softplus(z, out=None, beta=1.0, threshold=SOFTPLUS_THRESHOLD):
    """out = log(1 + exp(beta z)) / beta, computed without overflow, and z itself where
    beta z > threshold (PyTorch's softplus)."""
    return activation("softplus", z, out=out, param=(beta, threshold))


@memoized
def hadamard(x, y, out=None):
    """out = x * y element by element."""
    dev = common_device(x=x, y=y, out=out)
    dt = check(x, "x", dev)
    check(y, "y", dev, dtype=dt, shape=x.shape)
    out = check_out(out, x.shape, dt, dev, inputs=(x, y))
    kern = elementwise_kernel(dev, dt, "clnn_hadamard", op="linalg",
                              inplace=inplace(out, x=x, y=y))
    evt = launch(kern, dev, x.size, x=x, x_off=offset(x), y=y, y_off=offset(y), out=out,
                  out_off=offset(out))
    return done(out, evt)


@memoized
def axpy(alpha, x, y, out=None):
    """y += alpha * x (BLAS axpy); with ``out`` given, out = alpha * x + y instead."""
    dev = common_device(x=x, y=y, out=out)
    dt = check(x, "x", dev)
    alpha = finite(alpha, "alpha", dt)
    check(y, "y", dev, dtype=dt, shape=x.shape)
    out = check_out(y if out is None else out, x.shape, dt, dev, inputs=(x, y))
    kern = elementwise_kernel(dev, dt, "clnn_axpy", op="linalg",
                              inplace=inplace(out, x=x, y=y))
    evt = launch(kern, dev, x.size, alpha=alpha, x=x, x_off=offset(x), y=y,
                  y_off=offset(y), out=out, out_off=offset(out))
    return done(out, evt)


@memoized
def scale(alpha, x, out=None):
    """out = alpha * x (in place with out=x)."""
    dev = common_device(x=x, out=out)
    dt = check(x, "x", dev)
    alpha = finite(alpha, "alpha", dt)
    out = check_out(out, x.shape, dt, dev, inputs=(x,))
    kern = elementwise_kernel(dev, dt, "clnn_scale", op="linalg",
                              inplace=inplace(out, x=x))
    evt = launch(kern, dev, x.size, alpha=alpha, x=x, x_off=offset(x), out=out,
                  out_off=offset(out))
    return done(out, evt)


def fill(out, value):
    """Set every element of ``out`` to ``value`` (NaN and inf allowed); returns out."""
    dev = common_device(out=out)
    dt = check(out, "out", dev)
    kern = elementwise_kernel(dev, dt, "clnn_fill", op="linalg")
    evt = launch(kern, dev, out.size, value=real(value, "value"), out=out,
                  out_off=offset(out))
    return done(out, evt)


def copy(x, out=None):
    """out = x, a device-side copy of a contiguous array."""
    dev = common_device(x=x, out=out)
    dt = check(x, "x", dev)
    out = check_out(out, x.shape, dt, dev, inputs=(x,))
    evt = None
    if x.size and (out.base_data.int_ptr, out.offset) != (x.base_data.int_ptr, x.offset):
        evt = programs.copy_buffer(dev, out.base_data, x.base_data, x.nbytes,
                                   src_offset=x.offset, dst_offset=out.offset)
    return done(out, evt)


