"""Template rendering, program and kernel cache, build errors, named-argument launches.

A kernel template is ``clnn/kernels/<stem>.cl``, rendered by Mako from one parameter
dict. ``dtype`` is always a parameter; the preamble in ``_common.cl`` turns it into
``real_t`` (storage) and ``acc_t`` (arithmetic) with the right extension pragma. Sizes
are kernel arguments, so one build serves every shape.

Op modules register their templates with ``register``: the default parameters and the
list of variants, which ``clnn render`` and the clang gate use.
"""

import contextlib
import hashlib
import logging
import os
import re
import sys
import threading
import time
import warnings

import numpy as np
import pyopencl as cl
import pyopencl.cltypes as cltypes
from mako import exceptions as mako_exceptions
from mako.lookup import TemplateLookup

from .cache import CACHE_SIZE, KernelCache  # noqa: F401 - used by tests as programs.*
from . import memory
from .device import BFLOAT16
from .errors import KernelBuildError, TemplateError
from .ptx import PTX_MARK, PTX_PATCH_OPTION, patch_ptx  # noqa: F401 - clnn.programs.*

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
BUILD_OPTIONS = ("-cl-std=CL1.2",)
# On a CPU device every kernel is built with -DCLNN_CPU (see _common.cl: the element
# loops and float16 conversions that suit a CPU's compiler)
CPU_OPTIONS = ("-DCLNN_CPU=1",)


def cpu_options(facts):
    """CPU_OPTIONS for a CPU device. On PoCL, -DCLNN_POCL=1: its compiler is
    clang, which takes GNU inline assembly, so on x86 with F16C the float16 vector
    conversions are instructions in the kernel instead of calls (_half.cl), and it
    links built-ins such as select() as calls, which the kernels avoid there
    (_common.cl's CLNN_SELECT). With
    -DCLNN_HALF_BITS=1 from 3.1 on: where that is not the case (another instruction
    set), its float16 vector built-ins on global memory crashed PoCL 3.1 (Debian 12's)
    at addresses not 16-byte aligned; 3.0 (pip's) runs them faster, and later
    versions, not tried, get the safe form."""
    if not facts.is_pocl:
        return CPU_OPTIONS
    options = CPU_OPTIONS + ("-DCLNN_POCL=1",)
    m = re.match(r"(\d+)\.(\d+)", facts.driver_version)
    if m and (int(m.group(1)), int(m.group(2))) >= (3, 1):
        options += ("-DCLNN_HALF_BITS=1",)
    return options


log = logging.getLogger("clnn")


def debug_level():
    try:
        return int(os.environ.get("CLNN_DEBUG", "0") or 0)
    except ValueError:
        return 1


if debug_level() > 0 and not log.handlers:
    _h = logging.StreamHandler(sys.stderr)
    _h.setFormatter(logging.Formatter("clnn: %(message)s"))
    log.addHandler(_h)
    log.setLevel(logging.DEBUG)


# ---------------------------------------------------------------- dtypes

_CTYPES = {
    "float32": ("float", "float"),
    "float64": ("double", "double"),
    "float16": ("half", "float"),      # half storage, float arithmetic
    "bfloat16": ("ushort", "float"),   # bfloat16 bits as storage, float arithmetic
}
# dtypes kept only as storage: loaded to float, computed in float, stored rounded
STORAGE_ONLY = ("float16", "bfloat16")

# the activations whose functions call OpenCL math built-ins (exp, tanh, expm1, log1p):
# PoCL links those as calls, so kernels for CPUs call them on vectors (every template
# sees this as ``math_acts``: _activation.cl's vector forms, and who takes them)
MATH_ACTIVATIONS = ("sigmoid", "tanh", "elu", "softplus")


# acc_t lanes of the vectors that kernels' CPU code computes on (``cpu_lanes`` in every
# template): 256 bits, 8 floats or 4 doubles. Never 512: PoCL 3.0 compiles for an
# AVX-512 Zen 4 as for a Zen 3, where a 512-bit vector passed to a function (a built-in
# such as select or exp on double8) "changes the ABI"; after a build that warns so,
# building another program with the same kernel names in the process gave one with no
# kernels (clCreateKernel: INVALID_KERNEL_NAME), which broke float64 there.
CPU_LANES = {"float": 8, "double": 4}

_NAMES = {np.dtype(n): n for n in _CTYPES}    # np.dtype("bfloat16") once ml_dtypes is imported


def dtype_name(dtype):
    name = _NAMES.get(dtype)           # numpy's dtype.name takes about 3 us
    if name is not None:
        return name
    name = np.dtype(dtype).name
    if name not in _CTYPES:
        raise TemplateError(f"no OpenCL type for dtype {name}", params={"dtype": name})
    return name


def acc_dtype(dtype):
    """The numpy dtype kernels compute in for storage dtype ``dtype``."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


# ---------------------------------------------------------------- registry

_registry = {}


def register(stem, defaults, variants=None, complete=None):
    """Declare template ``stem`` with its default params and a variants() callable.

    ``variants()`` yields the param dicts (without dtype) that the library can render;
    the clang gate renders each for every dtype. ``complete(params)``, if given, fills
    in what a partial set from the command line implies (``clnn render``).
    """
    _registry[stem] = (dict(defaults), variants or (lambda: [dict(defaults)]))
    _completers[stem] = complete or (lambda p: p)


_completers = {}


def complete(stem, params):
    """``params`` as ``clnn render`` would use them: implied values filled in."""
    registered()
    return _completers.get(stem, lambda p: p)(dict(params))


def registered():
    """{stem: (defaults, variants)} for every template an op module registered (the
    package imports every op module, so all of them have by the time anyone asks:
    this module never imports the routines above it)."""
    return dict(_registry)


# ---------------------------------------------------------------- rendering

_lookup = TemplateLookup(directories=[KERNEL_DIR], strict_undefined=True,
                         input_encoding="utf-8", output_encoding=None)


def vector_width(vw, dtype):
    """The acc_t lanes of a tile's vectors in ``dtype`` for a width ``vw`` that counts
    float32 lanes (tuning rows and tiles do): half as many doubles, the same bytes
    (tuning.template_tuning, conv.py's tiles, variant_for)."""
    return max(1, vw // 2) if np.dtype(dtype).itemsize == 8 else vw


def helper_width(vw, dtype):
    """The lanes of the vectors a CPU GEMM tile of ``vw`` acc_t lanes (as
    vector_width gives them) packs, stores and sums its K slices with, and its direct
    kernel computes in (gemm.cl's HVW): at most 256 bits, CPU_LANES, whatever the
    micro-kernel's registers hold."""
    return min(vw, CPU_LANES["double" if acc_dtype(dtype).itemsize == 8 else "float"])


def variant_for(params, dtype):
    """A registered variant's ``params`` as the ops build it in ``dtype`` (what the
    gates render): its tile's VW as vector_width makes it."""
    p = dict(params, dtype=dtype)
    t = dict(p.get("tuning", ()))
    if "VW" in t:
        p["tuning"] = tuple(sorted(dict(t, VW=vector_width(t["VW"], dtype)).items()))
    return p


def full_params(stem, params):
    """``params`` over the template's registered defaults, with a canonical dtype name.

    Mako's strict_undefined needs every name a template mentions, also in branches a
    variant does not take, so each render starts from the complete default set.
    """
    full = dict(_registry.get(stem, ({}, None))[0])
    full.update(params)
    full["dtype"] = dtype_name(full.get("dtype", "float32"))
    return full


def render(stem, params):
    """The OpenCL C source of template ``stem`` for ``params`` (dtype defaults to float32)."""
    params = full_params(stem, params)
    real, acc = _CTYPES[params["dtype"]]
    ctx = dict(params, real=real, acc=acc, math_acts=MATH_ACTIVATIONS,
               storage_only=params["dtype"] in STORAGE_ONLY,
               cpu_lanes=CPU_LANES[acc])
    try:
        tmpl = _lookup.get_template(f"{stem}.cl")
        return tmpl.render(**ctx)
    except Exception as exc:  # noqa: BLE001 - Mako raises many kinds; all mean "bad render"
        tb = mako_exceptions.text_error_template().render()
        raise TemplateError(f"rendering {stem}.cl with {params} failed: "
                            f"{type(exc).__name__}: {exc}", template=stem, params=params,
                            traceback=tb) from exc


def numbered(source):
    return "".join(f"{i:5d}  {line}\n" for i, line in enumerate(source.splitlines(), 1))


def _save_failed(stem, source):
    try:
        import platformdirs
        folder = os.path.join(platformdirs.user_cache_dir("clnn"), "failed")
        os.makedirs(folder, exist_ok=True)
    except Exception:  # noqa: BLE001 - a read-only home must not hide the build error
        import tempfile
        folder = tempfile.gettempdir()
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    path = os.path.join(folder, f"{stem}-{digest}.cl.txt")
    with open(path, "w") as f:
        f.write(numbered(source))
    return path


# ---------------------------------------------------------------- kernels

# "__kernel [__attribute__((...))] void name(args)"; args hold no parentheses
_SIG = re.compile(r"__kernel\b[^;{]*?\bvoid\s+(\w+)\s*\(([^)]*)\)", re.S)
_SCALARS = {"int": np.int32, "uint": np.uint32, "long": np.int64, "ulong": np.uint64,
            "float": np.float32, "double": np.float64,
            # operand descriptors and column maps (see gemm.cl)
            "int4": cltypes.int4, "int16": cltypes.int16}


def signatures(source):
    """{entry: [(arg name, numpy scalar type or None for a buffer)]} from the source."""
    sigs = {}
    for entry, args in _SIG.findall(source):
        parsed = []
        for raw in args.split(","):
            raw = " ".join(raw.split())
            if not raw:
                continue
            name = re.findall(r"\w+", raw)[-1]
            if "*" in raw:
                parsed.append((name, None))
                continue
            base = [w for w in re.findall(r"\w+", raw)[:-1] if w not in ("const", "__private")]
            parsed.append((name, base[-1]))
        sigs[entry] = parsed
    return sigs


class Kernel:
    """A built kernel launched with named arguments.

    Scalar arguments are converted to the type the kernel declares; array arguments
    take a ``pyopencl.array.Array`` (its buffer; offsets are separate arguments) or a
    ``pyopencl.Buffer``.
    """

    def __init__(self, device, cl_kernel, entry, args, dtype):
        self.device = device
        self.cl_kernel = cl_kernel
        self.entry = entry
        acc = acc_dtype(dtype).type
        real = np.uint16 if np.dtype(dtype) == BFLOAT16 else np.dtype(dtype).type
        typemap = dict(_SCALARS, real_t=real, acc_t=acc)
        self.names = [n for n, _ in args]
        self.types = [None if t is None else typemap[t] for _, t in args]
        self._names = frozenset(self.names)
        self._buffers = [i for i, t in enumerate(self.types) if t is None]
        # With the scalar types declared, PyOpenCL packs the arguments with a
        # generated struct call: 0.7 us for six arguments against 26 us when it has to
        # work out each argument's type (measured on PoCL), which was a third of the
        # cost of a small launch.
        cl_kernel.set_scalar_arg_dtypes(self.types)
        # an OpenCL kernel object holds its arguments: setting them and enqueueing is
        # one step under this lock, or two threads launching the same kernel could
        # enqueue each other's arguments
        self._lock = threading.Lock()

    def __call__(self, global_size, local_size=None, **args):
        if args.keys() != self._names:
            missing = self._names - args.keys()
            extra = args.keys() - self._names
            raise TypeError(f"{self.entry}: missing {sorted(missing)}, unknown {sorted(extra)}")
        values = [args[n] for n in self.names]
        for i in self._buffers:              # an Array's buffer (offsets are arguments)
            v = values[i]
            values[i] = getattr(v, "base_data", v)
        global_size = tuple(global_size)
        local_size = None if local_size is None else tuple(local_size)
        return enqueue(self, global_size, local_size, values)

    def launch(self, global_size, local_size, values, record=True):
        """Enqueue with the argument values as the kernel takes them (buffers, and
        scalars of the declared types): what __call__ ends in, and what replay()
        repeats (``record``: into this thread's recordings, _recorded)."""
        with self._lock:
            self.cl_kernel.set_args(*values)
            evt = cl.enqueue_nd_range_kernel(self.device.queue, self.cl_kernel,
                                             global_size, local_size)
        return _recorded(self, global_size, local_size, evt) if record else evt


class _BufferCopy:
    """A device-side copy between buffers, enqueued the way a Kernel is so that what
    records launches (captures above all: a replayed step must repeat its copies) sees
    it too; ``copy_buffer`` makes one."""

    entry = stem = "copy"
    params = {}

    def launch(self, global_size, local_size, values, record=True):
        queue, dst, src, nbytes, src_offset, dst_offset = values
        evt = cl.enqueue_copy(queue, dst, src, byte_count=nbytes, src_offset=src_offset,
                              dst_offset=dst_offset)
        return _recorded(self, global_size, local_size, evt) if record else evt


def _recorded(kern, global_size, local_size, evt):
    """``evt``, the event of a launch just enqueued, after it went into this thread's
    event lists (recorded_events) and profiles (clnn.profile)."""
    for events in getattr(_recording, "lists", ()):
        events.append(evt)
    for records in getattr(_recording, "profiles", ()):
        records.append((kern, global_size, local_size, evt))
    return evt


_COPY = _BufferCopy()


def copy_buffer(device, dst, src, nbytes, src_offset=0, dst_offset=0):
    """Enqueue a copy of ``nbytes`` from buffer ``src`` to ``dst`` on the device's queue,
    recorded as a launch (its "global size" is its byte count)."""
    values = [device.queue, dst, src, int(nbytes), int(src_offset), int(dst_offset)]
    return enqueue(_COPY, (int(nbytes),), None, values)


def enqueue(kern, global_size, local_size, values):
    """Launch ``kern`` (a Kernel, or a buffer copy) with argument values as it takes
    them, recorded in the captures around it: what every launch ends in."""
    captures = getattr(_recording, "captures", ())
    for launches in captures:     # captured()
        launches.append((kern, global_size, local_size, values))
    if captures:
        memory.count_references(values)
    return kern.launch(global_size, local_size, values)


# what the kernels this thread launches are recorded into: recorded_events' lists of
# events, clnn.profile's lists of (kernel, global size, local size, event), captured()'s
# lists of launches
_recording = threading.local()


@contextlib.contextmanager
def recording(kind, items=None):
    """Record what this thread's launches inside the block give ``kind`` ("lists":
    events, "profiles": (kernel, global size, local size, event), "captures": launches)
    into ``items`` (a new list by default), which the block gets; blocks nest."""
    outer = getattr(_recording, kind, ())
    items = [] if items is None else items
    setattr(_recording, kind, outer + (items,))
    try:
        yield items
    finally:
        setattr(_recording, kind, outer)


@contextlib.contextmanager
def captured(reuse=False):
    """Every launch this thread makes inside the block, as (kernel, global size, local
    size, argument values) in a list: ``replay`` enqueues them again exactly (the same
    buffers, offsets and scalars), without the Python that chose them. The list holds
    the buffers, so the pool keeps them (temporaries too) for as long as it lives.
    With ``reuse``, a temporary the captured code lets go of is the pool's again for
    the captured code's later requests (memory.capture_references): the replay then
    uses as few blocks as an uncaptured run would, and for nobody else's."""
    with recording("captures") as launches:
        if not reuse:
            yield launches
            return
        with memory.capture_references():
            yield launches


def recording_active():
    """Whether anything records this thread's launches (events, profiles, captures)."""
    return bool(getattr(_recording, "lists", ()) or getattr(_recording, "profiles", ()) or
                getattr(_recording, "captures", ()))


def replay(launches):
    """Enqueue captured launches again, in order; the last event (None for none)."""
    evt = None
    # where nothing records this thread's events, without the bookkeeping (a third of a
    # replayed LeNet-5 step's host time on PoCL, whose enqueue itself takes 4-5 us)
    record = bool(getattr(_recording, "lists", ()) or getattr(_recording, "profiles", ()))
    for kern, global_size, local_size, values in launches:
        evt = kern.launch(global_size, local_size, values, record)
    return evt


def recorded_events():
    """The events of every kernel this thread launches inside the block (nested blocks
    included), in a list: an op's device time is from the first one's profiled start
    to the last one's end (the device queues profile; the tuner times candidates so)."""
    return recording("lists")


def _freeze(params):
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


def get_kernel(device, stem, entry, params, options=()):
    """The kernel ``entry`` of template ``stem`` rendered with ``params`` for ``device``.

    Built once per (device context, template, entry, params, options) and kept in the
    device's bounded cache.
    """
    # Routines ask for the same few kernels on every call: the parameters as given
    # are a key too, so a hit skips the defaults, dtype naming and canonical key
    # (about 20 us of Python per launch).
    try:
        quick = ("as given", stem, entry, tuple(sorted(params.items())), tuple(options))
        kern = device.kernels.get(quick)
    except TypeError:          # an unhashable value (a list): only the canonical key
        quick = kern = None
    if kern is not None:
        # (the logger's level first: reading CLNN_DEBUG is 5 us, on every launch)
        if log.isEnabledFor(logging.DEBUG) and debug_level() >= 1:
            log.debug("cache hit %s:%s %s", stem, entry, params)
        return kern
    params = full_params(stem, params)
    options = tuple(BUILD_OPTIONS) + (cpu_options(device.facts) if device.facts.is_cpu
                                      else ()) + tuple(options)
    key = (stem, entry, _freeze(params), options)
    kern = device.kernels.get(key)
    if kern is not None:
        if log.isEnabledFor(logging.DEBUG) and debug_level() >= 1:
            log.debug("cache hit %s:%s %s", stem, entry, params)
        if quick is not None:
            device.kernels.put(quick, kern)
        return kern
    prg_key = (stem, None, _freeze(params), options)
    with device.build_lock:        # (see Device: one build at a time, each once)
        kern = device.kernels.get(key)          # another thread may have made it
        if kern is None:
            cached = device.kernels.get(prg_key)
            if cached is None:
                cached = _build(device, stem, params, options)
                device.kernels.put(prg_key, cached)
            program, sigs = cached
            if entry not in sigs:
                raise TemplateError(f"{stem}.cl has no kernel {entry!r} for {params}",
                                    template=stem, params=params)
            kern = Kernel(device, cl.Kernel(program, entry), entry, sigs[entry],
                          params["dtype"])
            kern.stem, kern.params = stem, params           # for clnn.profile's records
            device.kernels.put(key, kern)
    if quick is not None:
        device.kernels.put(quick, kern)
    return kern


def rebuild_patched(device, program, options=()):
    """``program`` (built with PTX_PATCH_OPTION) built again from its PTX, patched
    (patch_ptx) for the device's architecture-specific target, with build ``options``.
    Raises ValueError (no compute capability, no mark) or pyopencl's error."""
    cc = device.facts.nv_compute_capability
    if not cc:
        raise ValueError("the device reports no NVIDIA compute capability")
    text = patch_ptx(program.binaries[0].decode("latin-1"), "sm_%da" % cc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        return cl.Program(device.context, [device.cl_device],
                          [text.encode("latin-1")]).build(options=list(options))


def _patched(device, stem, params, options, source, program):
    """rebuild_patched, its failure a KernelBuildError."""
    cc = device.facts.nv_compute_capability
    try:
        return rebuild_patched(device, program)
    except (cl.Error, ValueError) as exc:
        try:
            ptx = program.binaries[0].decode("latin-1")
        except cl.Error:
            ptx = ""
        path = _save_failed(stem, source)
        raise KernelBuildError(
            f"{stem}.cl built on {device.name} with {params} and options "
            f"{' '.join(options)}, but its PTX, patched for an architecture-specific "
            f"target (compute capability {cc}), did not build: {exc}; its PTX's header: "
            f"{re.findall(r'^[.](?:version|target) .*$', ptx, re.M)}; rendered source: "
            f"{path}", log=str(exc), options=options, params=params,
            source_path=path) from exc


def _build(device, stem, params, options):
    source = render(stem, params)
    if debug_level() >= 2:
        print(f"// ---- clnn: {stem}.cl {params}\n{source}", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            program = cl.Program(device.context, source).build(options=list(options))
    except cl.RuntimeError as exc:
        path = _save_failed(stem, source)
        # pyopencl's message carries the compiler's build log.
        raise KernelBuildError(
            f"{stem}.cl failed to build on {device.name} with {params} and options "
            f"{' '.join(options)}; rendered source with line numbers: {path}\n{exc}",
            log=str(exc), options=options, params=params,
            source_path=path) from exc
    if PTX_PATCH_OPTION in options:
        program = _patched(device, stem, params, options, source, program)
    if debug_level() >= 1:
        log.debug("built %s.cl %s in %.3f s", stem, params, time.perf_counter() - t0)
    sigs = signatures(source)
    # A build can "succeed" without its kernels: PoCL 3.0, after an earlier build in the
    # process warned that a 512-bit vector argument changes the ABI (see CPU_LANES),
    # returned programs with none, which clCreateKernel then called INVALID_KERNEL_NAME.
    # Say so here, with the compiler's log, rather than at the first launch.
    try:
        built = set(filter(None, program.kernel_names.split(";")))
    except cl.Error:               # a driver that cannot list them: trust the build
        built = set(sigs)
    missing = sorted(set(sigs) - built)
    if missing:
        path = _save_failed(stem, source)
        build_log = "\n".join(program.get_build_info(d, cl.program_build_info.LOG)
                              for d in device.context.devices)
        raise KernelBuildError(
            f"{stem}.cl built on {device.name} with {params} without its kernels "
            f"{', '.join(missing)} (the driver returned a program lacking them; an earlier "
            f"build's warnings can cause this on PoCL 3.0); rendered source: {path}\n"
            f"{build_log}", log=build_log, options=options, params=params,
            source_path=path)
    return program, sigs
