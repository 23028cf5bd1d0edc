"""Property test: every public op, given one bad argument (hypothesis picks the op, the
argument and how it is bad), raises a typed clnn error and leaves every output it was
given bitwise as it was (canaries around it included). Nothing may crash, hang or be
enqueued: the valid call of each op is run first, so a bad call that slips through
would show as a changed output."""

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import clnn

from conftest import Guarded

F32 = np.float32
ERRORS = (clnn.ShapeError, clnn.ArgumentError, clnn.DTypeError, clnn.DeviceError)

# name -> (arguments, call); an argument is (kind, shape or value). Kinds: "in" (an
# input whose shape the op fixes), "free" (an input of any shape: only its type, view
# and dtype can be wrong), "out" (a guarded output), "scalar", "size" (ints: stride,
# padding, window), "axis".
OPS = {
    "relu": ({"z": ("free", (5, 3)), "out": ("out", (5, 3))},
             lambda a: clnn.relu(a["z"], out=a["out"])),
    "leaky_relu": ({"z": ("free", (7,)), "out": ("out", (7,)), "slope": ("scalar", 0.1)},
                   lambda a: clnn.leaky_relu(a["z"], out=a["out"], slope=a["slope"])),
    "activation_backward": ({"dy": ("free", (4, 3)), "a": ("in", (4, 3)),
                             "out": ("out", (4, 3))},
                            lambda a: clnn.activation_backward("tanh", a["dy"], a=a["a"],
                                                               out=a["out"])),
    "hadamard": ({"x": ("free", (6,)), "y": ("in", (6,)), "out": ("out", (6,))},
                 lambda a: clnn.hadamard(a["x"], a["y"], out=a["out"])),
    "axpy": ({"alpha": ("scalar", 2.0), "x": ("free", (6,)), "y": ("in", (6,)),
              "out": ("out", (6,))},
             lambda a: clnn.axpy(a["alpha"], a["x"], a["y"], out=a["out"])),
    "scale": ({"alpha": ("scalar", 2.0), "x": ("free", (3, 3)), "out": ("out", (3, 3))},
              lambda a: clnn.scale(a["alpha"], a["x"], out=a["out"])),
    "cast": ({"x": ("free", (2, 5)), "out": ("out", (2, 5))},
             lambda a: clnn.cast(a["x"], np.float32, out=a["out"])),
    "copy": ({"x": ("free", (9,)), "out": ("out", (9,))},
             lambda a: clnn.copy(a["x"], out=a["out"])),
    "sgd_step": ({"weight": ("out", (5,)), "grad": ("in", (5,)), "buf": ("out2", (5,)),
                  "lr": ("scalar", 0.1), "momentum": ("scalar", 0.9)},
                 lambda a: clnn.sgd_step(a["weight"], a["grad"], a["buf"], lr=a["lr"],
                                         momentum=a["momentum"])),
    "adam_step": ({"weight": ("out", (2, 3)), "grad": ("in", (2, 3)), "m": ("out2", (2, 3)),
                   "v": ("out2", (2, 3)), "lr": ("scalar", 1e-3), "eps": ("scalar", 1e-8)},
                  lambda a: clnn.adam_step(a["weight"], a["grad"], a["m"], a["v"], step=1,
                                           lr=a["lr"], eps=a["eps"])),
    "batch_norm": ({"x": ("in", (4, 3, 2)), "running_mean": ("out2", (3,)),
                    "running_var": ("out2", (3,)), "weight": ("in", (3,)),
                    "bias": ("in", (3,)), "out": ("out", (4, 3, 2)), "eps": ("scalar", 1e-5),
                    "momentum": ("scalar", 0.1)},
                   lambda a: clnn.batch_norm(a["x"], a["running_mean"], a["running_var"],
                                             a["weight"], a["bias"], training=True,
                                             eps=a["eps"], momentum=a["momentum"],
                                             out=a["out"])),
    "batch_norm_backward": ({"dy": ("in", (4, 3, 2)), "x": ("in", (4, 3, 2)),
                             "save": ("in", (2, 3)), "weight": ("in", (3,)),
                             "dx": ("out", (4, 3, 2)), "dweight": ("out", (3,)),
                             "dbias": ("out", (3,)), "eps": ("scalar", 1e-5)},
                            lambda a: clnn.batch_norm_backward(
                                a["dy"], a["x"], a["save"], a["weight"], eps=a["eps"],
                                dx=a["dx"], dweight=a["dweight"], dbias=a["dbias"])),
    "dropout": ({"x": ("free", (5, 3)), "out": ("out", (5, 3)), "p": ("scalar", 0.3)},
                lambda a: clnn.dropout(a["x"], a["p"], 12345, out=a["out"])),
    "sum": ({"x": ("free", (4, 5)), "axis": ("axis", 1), "out": ("out", (4,))},
            lambda a: clnn.sum(a["x"], axis=a["axis"], out=a["out"])),
    "dot": ({"x": ("free", (8,)), "y": ("in", (8,)), "out": ("out", ())},
            lambda a: clnn.dot(a["x"], a["y"], out=a["out"])),
    "softmax": ({"x": ("free", (3, 7)), "out": ("out", (3, 7))},
                lambda a: clnn.softmax(a["x"], out=a["out"])),
    "softmax_cross_entropy": ({"z": ("in", (3, 4)), "y": ("in", (3, 4)),
                               "dz": ("out", (3, 4)), "grad_scale": ("scalar", 0.5)},
                              lambda a: clnn.softmax_cross_entropy(
                                  a["z"], a["y"], dz=a["dz"], grad_scale=a["grad_scale"])),
    "cross_entropy": ({"input": ("in", (3, 4)), "target": ("in", (3, 4)),
                       "weight": ("in", (4,)), "dz": ("out", (3, 4)),
                       "label_smoothing": ("scalar", 0.1)},
                      lambda a: clnn.cross_entropy(a["input"], a["target"], a["weight"],
                                                   label_smoothing=a["label_smoothing"],
                                                   dz=a["dz"])),
    "quadratic_loss": ({"a": ("in", (2, 5)), "y": ("in", (2, 5)), "da": ("out", (2, 5))},
                       lambda a: clnn.quadratic_loss(a["a"], a["y"], da=a["da"])),
    "gemm": ({"a": ("in", (4, 3)), "b": ("in", (3, 5)), "out": ("out", (4, 5)),
              # (1, N): addmm's broadcast, so an extra leading axis of 1 is still bad
              "bias": ("in", (1, 5)), "alpha": ("scalar", 1.5), "beta": ("scalar", 0.5)},
             lambda a: clnn.gemm(a["a"], a["b"], out=a["out"], bias=a["bias"],
                                 alpha=a["alpha"], beta=a["beta"])),
    "gemv": ({"a": ("in", (4, 3)), "x": ("in", (3,)), "y": ("out", (4,)),
              "alpha": ("scalar", 1.0)},
             lambda a: clnn.gemv(a["a"], a["x"], a["y"], alpha=a["alpha"])),
    "bias_add": ({"x": ("in", (2, 3, 4)), "b": ("in", (3,)), "out": ("out", (2, 3, 4))},
                 lambda a: clnn.bias_add(a["x"], a["b"], out=a["out"])),
    "bias_grad": ({"dy": ("in", (2, 3, 4)), "out": ("out", (3,)), "beta": ("scalar", 0.5)},
                  lambda a: clnn.bias_grad(a["dy"], out=a["out"], beta=a["beta"])),
    "conv2d": ({"x": ("in", (2, 3, 6, 5)), "w": ("in", (4, 3, 3, 2)), "b": ("in", (4,)),
                "out": ("out", (2, 4, 3, 3)), "stride": ("size", 2), "padding": ("size", 1)},
               lambda a: clnn.conv2d(a["x"], a["w"], a["b"], stride=a["stride"],
                                     padding=a["padding"], out=a["out"])),
    "conv2d_backward_data": ({"dy": ("in", (2, 4, 3, 3)), "w": ("in", (4, 3, 3, 2)),
                              "out": ("out", (2, 3, 6, 5)), "stride": ("size", 2),
                              "padding": ("size", 1)},
                             lambda a: clnn.conv2d_backward_data(
                                 a["dy"], a["w"], (2, 3, 6, 5), stride=a["stride"],
                                 padding=a["padding"], out=a["out"])),
    "conv2d_backward_weight": ({"dy": ("in", (2, 4, 3, 3)), "x": ("in", (2, 3, 6, 5)),
                                "out": ("out", (4, 3, 3, 2)), "stride": ("size", 2),
                                "padding": ("size", 1), "alpha": ("scalar", 1.0),
                                "db": ("out2", (4,))},
                               lambda a: clnn.conv2d_backward_weight(
                                   a["dy"], a["x"], (4, 3, 3, 2), stride=a["stride"],
                                   padding=a["padding"], out=a["out"], alpha=a["alpha"],
                                   db=a["db"])),
    "max_pool2d": ({"x": ("in", (1, 2, 6, 6)), "out": ("out", (1, 2, 3, 3)),
                    "kernel_size": ("size", 2)},
                   lambda a: clnn.max_pool2d(a["x"], a["kernel_size"], out=a["out"])),
    "avg_pool2d_backward": ({"dy": ("in", (1, 2, 3, 3)), "x": ("in", (1, 2, 6, 6)),
                             "out": ("out", (1, 2, 6, 6)), "kernel_size": ("size", 2)},
                            lambda a: clnn.avg_pool2d_backward(a["dy"], a["x"],
                                                               a["kernel_size"],
                                                               out=a["out"])),
}

# None is a valid value there (no bias; the default slope or gradient scale)
OPTIONAL = {("gemm", "bias"), ("conv2d", "b"), ("leaky_relu", "slope"), ("cross_entropy", "weight"),
            ("softmax_cross_entropy", "grad_scale"), ("conv2d_backward_weight", "db")}
ARRAY_FLAWS = ("int32", "past-buffer", "numpy", "None", "misaligned", "strided")
SHAPED_FLAWS = ("shape", "extra-dim")
SCALAR_FLAWS = (None, "2", float("nan"), float("inf"), -1e39, 1e39, 1 + 2j, [1.0], True)
SIZE_FLAWS = (-1, 0, 2.5, "2", None, (1, 2, 3), (), True, 2 ** 40 + 0.5)  # (1,) is PyTorch's (1, 1)
AXIS_FLAWS = (2, -3, 1.0, "1", (0, 1))


def flaws_of(kind):
    if kind in ("in", "out", "out2"):
        return ARRAY_FLAWS + SHAPED_FLAWS
    if kind == "free":
        return ARRAY_FLAWS
    return {"scalar": SCALAR_FLAWS, "size": SIZE_FLAWS, "axis": AXIS_FLAWS}[kind]


CHOICES = [(op, arg, i) for op, (args, _) in OPS.items() for arg, (kind, _) in args.items()
           for i in range(len(flaws_of(kind)))]


def flawed_array(dev, shape, flaw):
    n = int(np.prod(shape))
    if flaw == "int32":
        return clnn.asarray(np.ones(shape, np.int32), device=dev)
    if flaw == "numpy":
        return np.ones(shape, F32)
    if flaw == "None":
        return None
    if flaw == "past-buffer":
        buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 4 * n - 2)
        return cla.Array(dev.queue, shape, F32, data=buf)
    if flaw == "misaligned":
        base = clnn.zeros((n + 2,), device=dev)
        return cla.Array(dev.queue, shape, F32, data=base.base_data, offset=2)
    if flaw == "strided":
        base = clnn.zeros((2 * max(n, 1),), device=dev)
        strides = tuple(2 * s for s in np.zeros(shape, F32).strides) if shape else ()
        return cla.Array(dev.queue, shape, F32, data=base.base_data, strides=strides)
    if flaw == "shape":
        return clnn.zeros(tuple(s + 1 for s in shape) or (2,), device=dev)
    if flaw == "extra-dim":
        return clnn.zeros((1,) + tuple(shape), device=dev)
    raise AssertionError(flaw)


def valid_args(dev, args):
    rng = np.random.default_rng(5)
    out, guards = {}, []
    for name, (kind, v) in args.items():
        if kind in ("in", "free"):
            host = rng.uniform(0.1, 1.0, v).astype(F32)
            out[name] = clnn.asarray(host, device=dev)
        elif kind in ("out", "out2"):
            g = Guarded(dev, v, F32, fill=rng.uniform(0.1, 1.0, v))
            guards.append(g)
            out[name] = g.view
        else:
            out[name] = v
    return out, guards


@pytest.mark.parametrize("op", sorted(OPS))
def test_each_op_runs_with_its_valid_arguments(dev, op):
    args, call = OPS[op]
    a, guards = valid_args(dev, args)
    call(a)
    for g in guards:
        g.check()


@settings(max_examples=600, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choice=st.sampled_from(CHOICES))
def test_a_bad_argument_is_a_typed_error_and_writes_nothing(dev, choice):
    op, arg, i = choice
    args, call = OPS[op]
    a, guards = valid_args(dev, args)
    kind, shape = args[arg]
    flaw = flaws_of(kind)[i]
    if kind in ("in", "out", "out2", "free"):
        # None is valid for an optional input and for an output (then allocated)
        assume(not (flaw == "None" and ((op, arg) in OPTIONAL or
                                        (kind == "out" and not op.endswith("_step")))))
        assume(not (flaw == "strided" and int(np.prod(shape)) <= 1))   # nothing to stride
        a[arg] = flawed_array(dev, shape, flaw)
    else:
        assume(not (flaw is None and (op, arg) in OPTIONAL))
        a[arg] = flaw
    before = [g.big.get() for g in guards]
    with pytest.raises(ERRORS):
        call(a)
    dev.queue.finish()
    for g, b in zip(guards, before):
        assert np.array_equal(g.big.get(), b), f"{op} wrote its output with {arg}={flaw!r}"
