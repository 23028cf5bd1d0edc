"""Shared fixtures: the test device, canary-guarded outputs, error bounds.

The device comes from CLNN_TEST_DEVICE (default "pocl", the driver-free CPU device).
"""

import atexit
import os
import shutil
import sys
import tempfile
import threading
import zlib

import ml_dtypes
import numpy as np
import pytest

# Every test runs on one device: CLNN_TEST_DEVICE (default PoCL) also becomes the
# default device, so arrays made without an explicit device live there too.
TEST_DEVICE = os.environ.get("CLNN_TEST_DEVICE", "pocl")
os.environ["CLNN_DEVICE"] = TEST_DEVICE
# Tests never read the developer's own tuning database (clnn tune writes one). The
# process that makes the folder (pytest's, whose workers and child processes inherit
# the variable) removes it when it exits: every run had left one in /tmp.
if "CLNN_TUNING_DB" not in os.environ:
    _tuning_dir = tempfile.mkdtemp(prefix="clnn-tests-")
    atexit.register(shutil.rmtree, _tuning_dir, ignore_errors=True)
    os.environ["CLNN_TUNING_DB"] = os.path.join(_tuning_dir, "tuning.json")

import clnn  # noqa: E402
from clnn.device import is_floating  # noqa: E402

# CLNN_TEST_FACTS=h100: the GPU's plans on this device (facts_mode.py)
if os.environ.get("CLNN_TEST_FACTS"):
    import facts_mode
    facts_mode.apply(clnn.device(TEST_DEVICE))


def _gpu_only(stem, params):
    """Whether a kernel is one of a GPU's that tests force on a CPU device: the tile
    GEMM (and its matrix-engine rows), the work-group reductions, and convt.cl's and
    convw.cl's direct tiles."""
    return (stem == "gemm" and params.get("variant") == "local") or stem in ("convt", "convw") \
        or (stem == "reduce" and bool(params.get("wg")))


def _build_unoptimised_where_gpu_only(build):
    """programs._build, building a GPU's kernels on a CPU device with -cl-opt-disable.
    Tests check what those kernels compute (no user runs them on a CPU, and the GPU's
    compiler makes its own code of them), and compiling them was a third of a cold
    run's time: PoCL took 1.0 to 1.8 s to compile a tile GEMM (0.3 to 0.8 s so)."""
    import pyopencl as cl

    def wrapped(device, stem, params, options):
        if device.cl_device.type & cl.device_type.CPU and _gpu_only(stem, params):
            options = tuple(options) + ("-cl-opt-disable",)
        return build(device, stem, params, options)
    return wrapped


from clnn import programs  # noqa: E402
programs._build = _build_unoptimised_where_gpu_only(programs._build)

CANARY = -12352.0          # exactly representable in bfloat16, float16, float32, float64
PAD = 17                   # canary elements on each side of a guarded output


@pytest.fixture(scope="session")
def dev():
    return clnn.device(TEST_DEVICE)


@pytest.fixture(autouse=True)
def _rng_of_its_own(request):
    """Each test draws its module's ``RNG`` from a generator seeded by its own name.
    With one generator per module a test's data depended on which of its neighbours
    had run before in the same process, and pytest-xdist deals tests out to its workers
    differently on every run: a test that passed in one order failed in another."""
    module = getattr(request, "module", None)
    if isinstance(getattr(module, "RNG", None), np.random.Generator):
        module.RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
    yield


@pytest.fixture(params=["device", "work-groups"])
def kernels(request):
    """Run a test with the device's own reduction and row-wise kernels, then again with
    the GPUs' work-group kernels forced, so PoCL (and Oclgrind) check those too."""
    from clnn import tuning
    if request.param == "device":
        yield request.param
        return
    with tuning.override("reduce", {"wg": True}), tuning.override("rows", {"wg": True}):
        yield request.param


def race(*targets):
    """Run the callables ``targets`` in threads of their own at once, with the
    interpreter switching threads every microsecond (so they take turns inside each
    other's launches and passes), and wait for all of them."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=t) for t in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)


def float_dtypes(dev_=None):
    d = dev_ or clnn.device(TEST_DEVICE)
    return [t for t in (np.float32, np.float64, np.float16, clnn.bfloat16) if d.supports(t)]


class Guarded:
    """A device array of ``shape`` in the middle of a buffer filled with canaries.

    ``view`` has a non-zero offset (like a row block of a bigger array), so kernels must
    honour offsets; ``check()`` asserts no element outside the view was written.
    """

    def __init__(self, dev, shape, dtype, fill=None):
        n = int(np.prod(shape, dtype=np.int64))
        # an int array (indices) gets the canary's integer part
        self.canary = CANARY if is_floating(dtype) else int(CANARY)
        host = np.full(n + 2 * PAD, self.canary, dtype=dtype)
        if fill is not None:
            host[PAD:PAD + n] = np.asarray(fill, dtype=dtype).ravel()
        self.big = clnn.asarray(host, device=dev)
        self.n = n
        self.view = self.big[PAD:PAD + n].reshape(shape)
        assert self.view.offset == PAD * np.dtype(dtype).itemsize

    def check(self):
        host = self.big.get()
        assert np.all(host[:PAD] == self.canary), "canary before the output was overwritten"
        assert np.all(host[PAD + self.n:] == self.canary), \
            "canary after the output was overwritten"
        return self.view.get()


def guarded_input(dev, a):
    """``a`` on the device at a non-zero offset (the canaries are never read)."""
    return Guarded(dev, a.shape, a.dtype, fill=a).view


def storage_only(dtype):
    """float16 and bfloat16: stored as such, computed in float32."""
    return np.dtype(dtype) in (np.dtype(np.float16), clnn.bfloat16)


def f64(a):
    """A host array as float64: numpy's testing helpers see no NaN in bfloat16 arrays
    (ml_dtypes' dtype is not a numpy float kind), so compare them so."""
    return np.asarray(a).astype(np.float64)


def eps(dtype):
    return float(ml_dtypes.finfo(dtype).eps)       # numpy's finfo lacks bfloat16


def error_bound(dtype, k=1, ulps=8):
    """The error of a length-``k`` reduction stored in ``dtype``, relative to the size
    of its terms: ulps * (k + 1) roundings in the arithmetic type. float16 is stored as
    half and computed in float32, so its bound is two half roundings (of the result, and
    of an intermediate some ops store) plus float32's accumulation: tight enough that a
    kernel that computed in half (or stored a rounded partial sum too often) fails.
    bfloat16 likewise, with its own (8 times coarser) epsilon."""
    if storage_only(dtype):
        return 2 * eps(dtype) + ulps * (k + 1) * eps(np.float32)
    return ulps * (k + 1) * eps(dtype)


def assert_close(got, ref, dtype, k=1, scale=None, ulps=8):
    """|got - ref| <= error_bound(dtype, k, ulps) * scale, elementwise.

    ``k`` is the reduction length (an error bound that grows with it); ``scale`` the
    size of the terms (defaults to |ref| with a floor of 1 for values near zero).
    """
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if scale is None:
        scale = np.maximum(np.abs(ref), 1.0)
    bound = error_bound(dtype, k, ulps) * scale
    bad = ~(np.abs(got - ref) <= bound)
    if np.any(bad):
        i = np.argwhere(bad)[0]
        raise AssertionError(f"{bad.sum()} of {bad.size} elements out of bound; first at "
                             f"{tuple(i)}: got {got[tuple(i)]!r}, ref {ref[tuple(i)]!r}, "
                             f"bound {np.broadcast_to(bound, ref.shape)[tuple(i)]!r}")


AWKWARD = [1, 2, 7, 31, 64, 97, 1000003]



def gate(tool, present, missing=None):
    """Mark a test that needs an external checker (clang, oclgrind); ``missing``: what to
    install, where that is not the Debian package named ``tool``.

    Without the tool the test is skipped with a line saying which gate did not run;
    with CLNN_REQUIRE_GATES=1 (set by .ci/run) a missing tool fails the test instead.
    """
    return pytest.mark.clnn_gate(tool=tool, present=present, missing=missing)


# A run that may be cut off (a lent GPU machine allows 10 minutes a command) goes on in
# the next command where it stopped: CLNN_TEST_RECORD=FILE appends one line per test
# report that decides an outcome ("passed", "failed", "skipped", "error", a tab, the
# test's id), and CLNN_TEST_RESUME=FILE leaves out every test that FILE names.
_RECORD = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "clnn_gate(tool, present): needs an external tool")
    # the recording process: pytest-xdist's controller, or pytest itself without xdist
    if os.environ.get("CLNN_TEST_RECORD") and not hasattr(config, "workerinput"):
        _RECORD["file"] = os.environ["CLNN_TEST_RECORD"]


def recorded(path):
    """{test id: worst outcome} from a CLNN_TEST_RECORD file (missing: empty)."""
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    out = {}
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            outcome, _, nodeid = line.rstrip("\n").partition("\t")
            if nodeid and rank.get(outcome, 3) >= rank.get(out.get(nodeid), -1):
                out[nodeid] = outcome
    return out


def pytest_collection_modifyitems(config, items):
    done = recorded(os.environ.get("CLNN_TEST_RESUME", ""))
    if done:
        keep = [i for i in items if i.nodeid not in done]
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in done])
        items[:] = keep


def pytest_runtest_logreport(report):
    path = _RECORD.get("file")
    if not path:
        return
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{outcome}\t{report.nodeid}\n")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("clnn_gate"):
        if mark.kwargs["present"]:
            continue
        tool = mark.kwargs["tool"]
        how = mark.kwargs.get("missing") or f"Debian: apt-get install {tool}"
        reason = f"{tool} not installed ({how}); the {tool} kernel gate did not run"
        if os.environ.get("CLNN_REQUIRE_GATES"):
            pytest.fail(reason + ", and CLNN_REQUIRE_GATES is set")
        pytest.skip(reason)


def assert_steps_allocate_nothing(dev, net, x, y, loss, steps=100):
    """After one step has built the workspace, ``steps`` more make no real allocation."""
    net.train_step(x, y, 0.1, 0.9, loss)
    dev.finish()
    allocations = dev.pool.allocations
    for _ in range(steps):
        net.train_step(x, y, 0.1, 0.9, loss)
    dev.finish()
    assert dev.pool.allocations == allocations


def assert_step_gradients(net, xd, yd, loss_now, rng, loss="quadratic", picks=4, h=1e-6,
                          tol=1e-6):
    """The gradients a training step hands its hook (times grad_scale: the mean loss's)
    against central differences of ``loss_now()`` (the loss of the network as it is),
    at ``picks`` random elements of every parameter; nothing is updated."""
    got = {}

    def keep(step):
        got["g"] = [g.get() * step.grad_scale for g in step.grads]
        step.skip = True
    net.train_step(xd, yd, 0.1, 0.0, loss, hook=keep)
    for pi, p in enumerate(net.parameters()):
        base = p.get()
        for f in rng.choice(base.size, size=min(picks, base.size), replace=False):
            idx = np.unravel_index(f, base.shape)
            vals = []
            for sign in (1, -1):
                q = base.copy()
                q[idx] += sign * h
                p.set(q)
                vals.append(loss_now())
            p.set(base)
            num = (vals[0] - vals[1]) / (2 * h)
            assert abs(got["g"][pi][idx] - num) < tol * max(1, abs(num)), \
                (pi, idx, got["g"][pi][idx], num)
