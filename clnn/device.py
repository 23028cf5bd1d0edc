"""Device selection and device facts.

A ``Device`` owns one context, one in-order queue (with profiling, so benchmarks and
the tuner can time kernels from events; CLNN_PROFILING=0 leaves it out), the buffer
pool, the kernel cache and a small cache of constant tables. There is one ``Device``
per OpenCL device per process, so every array clnn makes for a device lives in the
same context and can be mixed freely.
"""

import math
import os
import textwrap
import threading
from dataclasses import dataclass, asdict

import ml_dtypes
import numpy as np
import pyopencl as cl

from .errors import DeviceError, DTypeError

_POCL_PLATFORM = "portable computing language"

# PoCL's CPU driver leaves its worker threads unpinned, and on this 2-core machine they
# often shared one core: every kernel ran at single-thread speed about half the time
# (LeNet's C3 forward: 0.34 ms against 0.18 ms pinned, bimodal from run to run).
# Pinning them is PoCL's own switch; it must be set before PoCL enumerates its devices,
# so it is set on import, unless the user already chose (POCL_AFFINITY=0 keeps
# threads free, e.g. for several processes sharing the cores).
os.environ.setdefault("POCL_AFFINITY", "1")

# bfloat16 is ml_dtypes' numpy dtype (the one JAX and PyTorch's numpy interop use):
# numpy has none of its own
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16),
                    BFLOAT16)


def is_floating(dtype):
    """Whether ``dtype`` holds floating-point values: numpy's kind "f", and bfloat16,
    whose ml_dtypes dtype numpy files under kind "V"."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BFLOAT16


@dataclass(frozen=True)
class DeviceFacts:
    """What routines and the tuning tables need to know about a device."""

    platform: str
    name: str
    vendor: str
    type: str
    driver_version: str
    opencl_version: str
    compute_units: int
    max_work_group_size: int
    max_work_item_sizes: tuple
    local_mem_size: int
    max_alloc_size: int
    global_mem_size: int
    fp64: bool
    fp16: bool
    # NVIDIA's compute capability as major * 10 + minor (cl_nv_device_attribute_query),
    # 0 elsewhere: 80 and up have the mma.sync matrix engines gemm.cl's MMA rows use
    nv_compute_capability: int = 0
    # the global memory cache (CL_DEVICE_GLOBAL_MEM_CACHE_SIZE: a CPU's last-level
    # cache on PoCL), 0 where the driver reports none
    cache_size: int = 0
    # floats in the vectors the device's code computes on (code_float_lanes: PoCL's
    # 16 where it builds AVX-512 code, 8 for AVX2), 0 where unknown
    float_lanes: int = 0
    # whether the driver builds architecture-specific PTX that clnn patched (Hopper's
    # WGMMA rows: programs.PTX_PATCH_OPTION); set False on the device once such a build
    # failed, which takes those rows out of its plans (ops/gemm.py)
    patched_ptx: bool = True
    # a CPU device's level-2 cache per core in bytes (PoCL runs on the host: Linux's
    # sysfs says), 0 elsewhere or where unknown; OpenCL reports only the last level
    l2_size: int = 0

    @property
    def is_pocl(self):
        return _POCL_PLATFORM in self.platform.lower()

    @property
    def is_cpu(self):
        return self.type == "CPU"

    def as_dict(self):
        return asdict(self)

    @classmethod
    def of(cls, dev):
        exts = dev.extensions.split()
        types = [n for n in ("GPU", "CPU", "ACCELERATOR") if dev.type & getattr(cl.device_type, n)]
        return cls(
            platform=dev.platform.name.strip(),
            name=dev.name.strip(),
            vendor=dev.vendor.strip(),
            type=types[0] if types else "OTHER",
            driver_version=dev.driver_version.strip(),
            opencl_version=dev.version.strip(),
            compute_units=int(dev.max_compute_units),
            max_work_group_size=int(dev.max_work_group_size),
            max_work_item_sizes=tuple(int(s) for s in dev.max_work_item_sizes),
            local_mem_size=int(dev.local_mem_size),
            max_alloc_size=int(dev.max_mem_alloc_size),
            global_mem_size=int(dev.global_mem_size),
            fp64="cl_khr_fp64" in exts,
            fp16="cl_khr_fp16" in exts,
            nv_compute_capability=_nv_compute_capability(dev, exts),
            cache_size=int(dev.global_mem_cache_size),
            float_lanes=code_float_lanes(dev.platform.name, dev.version,
                                         int(dev.native_vector_width_float)),
            l2_size=host_l2_size() if _POCL_PLATFORM in dev.platform.name.lower() and
            dev.type & cl.device_type.CPU else 0,
        )


SYS_CPU = "/sys/devices/system/cpu/cpu0/cache"


def host_l2_size(root=None):
    """The host CPU's level-2 cache per core in bytes, from Linux's sysfs (``root``:
    cpu0's cache folder), 0 where it says none."""
    root = root or SYS_CPU
    try:
        for index in sorted(os.listdir(root)):
            folder = os.path.join(root, index)
            with open(os.path.join(folder, "level")) as f:
                if f.read().strip() != "2":
                    continue
            with open(os.path.join(folder, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            return int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        pass
    return 0


# LLVM's x86 CPU names whose code has AVX-512 (-target-cpu): PoCL names the one it
# compiles for at the end of its device version ("HSTR: pthread-x86_64-unknown-linux-
# gnu-rocketlake")
_AVX512_CPUS = ("knl", "knm", "skylake-avx512", "skx", "cascadelake", "cooperlake",
                "cannonlake", "icelake-client", "icelake-server", "tigerlake", "rocketlake",
                "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
                "diamondrapids", "znver4", "znver5", "x86-64-v4")


def code_float_lanes(platform, version, native):
    """The floats in the vectors a device's compiled kernels compute on: its
    CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT (``native``), except that PoCL reports the
    hardware's width (its CPU features) while its compiler may target a CPU with
    narrower vectors: PoCL 3.0's LLVM 14 builds AVX2 code for an AVX-512 Zen 4 (it
    takes it for a Zen 3) and still reports 16. There, more than 8 only where the CPU
    PoCL compiles for, named in ``version``, has AVX-512."""
    if _POCL_PLATFORM not in platform.lower() or native <= 8:
        return native
    target = version.split("HSTR:")[-1].strip() if "HSTR:" in version else ""
    return native if any(target.endswith("-" + cpu) for cpu in _AVX512_CPUS) else 8


# cl_nv_device_attribute_query: CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV / _MINOR_NV
_CC_MAJOR_NV, _CC_MINOR_NV = 0x4000, 0x4001


def _nv_compute_capability(dev, exts):
    if "cl_nv_device_attribute_query" not in exts:
        return 0
    try:
        return int(dev.get_info(_CC_MAJOR_NV)) * 10 + int(dev.get_info(_CC_MINOR_NV))
    except (cl.Error, ValueError, TypeError):
        return 0


class Device:
    """One OpenCL device with its context, queue, pool and kernel cache."""

    def __init__(self, cl_device):
        from .memory import Pool, huge_page_size
        from .cache import KernelCache

        self.cl_device = cl_device
        self.facts = DeviceFacts.of(cl_device)
        self.context = cl.Context([cl_device])
        # profiling events (clnn.profile, the tuner, the benchmarks' kernel times)
        # unless CLNN_PROFILING=0: a queue that keeps no timestamps, for measuring what
        # they cost a launch
        self.profiling = os.environ.get("CLNN_PROFILING", "1") != "0"
        self.queue = cl.CommandQueue(
            self.context, properties=cl.command_queue_properties.PROFILING_ENABLE
            if self.profiling else 0)
        self.pool = Pool(self.context, self.queue, max_alloc=self.facts.max_alloc_size,
                         budget=_default_budget(self.facts),
                         exact=os.environ.get("CLNN_POOL_EXACT", "") not in ("", "0"),
                         # a CPU's buffers are host memory: huge pages where Linux
                         # gives them on request (memory.huge_page_size)
                         huge_page=huge_page_size()
                         if cl_device.type & cl.device_type.CPU else 0)
        self.kernels = KernelCache()
        # one program build at a time on this device (programs.get_kernel): threads that
        # ask for the same new kernel build it once, and no driver's compiler is entered
        # from two threads at once (a four-thread launch test crashed its process on an
        # H100; thread-safe builds are what the OpenCL spec promises, not what every
        # compiler delivers)
        self.build_lock = threading.Lock()
        # the dtypes this device computes in (every op checks its arrays against it)
        self._supported = {t for t in SUPPORTED_DTYPES if self.supports(t)}
        # constant device data that ops rebuild per shape otherwise (the convolution
        # loaders' k tables): bounded, and emptied by clnn.clear_caches()
        self.tables = KernelCache(maxsize=64)

    def __repr__(self):
        f = self.facts
        return f"<clnn.Device {f.name!r} on {f.platform!r}>"

    @property
    def name(self):
        return self.facts.name

    def supports(self, dtype):
        dtype = np.dtype(dtype)
        if dtype == np.float32:
            return True
        if dtype == np.float64:
            return self.facts.fp64
        if dtype == np.float16 or dtype == BFLOAT16:
            # storage only (vload_half/vstore_half are core OpenCL 1.2; bfloat16 is
            # ushort bits), computed in float32: every device, with or without cl_khr_fp16
            return True
        return False

    def check_dtype(self, dtype, what="array"):
        """Raise DTypeError unless clnn computes in ``dtype`` on this device."""
        if dtype in self._supported:
            return dtype
        dtype = np.dtype(dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise DTypeError(f"{what} has dtype {dtype}; clnn computes in float32, "
                             "float64 (cl_khr_fp64), or float16 or bfloat16 (stored as "
                             "such, computed in float32)")
        if not self.supports(dtype):
            raise DTypeError(f"{what} has dtype {dtype}, but {self.facts.name} lacks "
                             "cl_khr_fp64")
        return dtype

    def finish(self):
        self.queue.finish()


def _default_budget(facts):
    env = os.environ.get("CLNN_POOL_BYTES")
    if env:
        try:
            value = float(env)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value >= 1):
            raise DeviceError(f"CLNN_POOL_BYTES={env!r} is not a positive, finite number of "
                              "bytes")
        return int(value)
    # Leave room for the driver, other processes and the user's own buffers.
    return int(facts.global_mem_size * 0.75)


# ---------------------------------------------------------------- selection

_lock = threading.Lock()
_devices = {}          # cl.Device.int_ptr -> Device
_by_context = {}       # cl.Context.int_ptr -> Device


def _platforms():
    try:
        return cl.get_platforms()
    except cl.Error as exc:  # no ICD loader or no platform at all
        raise DeviceError(f"no OpenCL platform found ({exc}); install pocl-binary-distribution "
                          "(pip install 'clnn[pocl]') for a driver-free CPU device") from None


def all_devices():
    """[(platform_index, device_index, cl.Device)] for every device on every platform."""
    found = []
    for pi, plat in enumerate(_platforms()):
        try:
            devs = plat.get_devices()
        except cl.Error:
            continue
        found.extend((pi, di, d) for di, d in enumerate(devs))
    return found


def _match(spec, found):
    s = spec.strip().lower()
    if s in ("gpu", "cpu", "accelerator"):
        want = getattr(cl.device_type, s.upper())
        hits = [d for _, _, d in found if d.type & want]
    elif s == "pocl":
        hits = [d for _, _, d in found if _POCL_PLATFORM in d.platform.name.lower()]
    elif ":" in s or s.isdigit():
        p, _, d = s.partition(":")
        d = d or "0"

        def ok(part, index, name):
            return int(part) == index if part.isdigit() else part in name.lower()
        hits = [dev for pi, di, dev in found
                if ok(p, pi, dev.platform.name) and ok(d, di, dev.name)]
    else:
        hits = [d for _, _, d in found if s in f"{d.platform.name} {d.name}".lower()]
    if not hits:
        listing = "; ".join(f"{pi}:{di} {d.platform.name.strip()} / {d.name.strip()}"
                            for pi, di, d in found) or "none"
        raise DeviceError(f"no OpenCL device matches {spec!r}; devices: {listing}")
    return hits[0]


def select_cl_device(spec=None):
    """Resolve a device spec to a ``cl.Device`` without prompting.

    Order: the argument, ``CLNN_DEVICE``, ``PYOPENCL_CTX``, the first GPU, the PoCL
    CPU device, any device.
    """
    found = all_devices()
    if not found:
        raise DeviceError("no OpenCL device found; install pocl-binary-distribution "
                          "(pip install 'clnn[pocl]') for a driver-free CPU device")
    for candidate in (spec, os.environ.get("CLNN_DEVICE"), os.environ.get("PYOPENCL_CTX")):
        if candidate:
            return _match(candidate, found)
    for default in ("gpu", "pocl"):
        try:
            return _match(default, found)
        except DeviceError:
            pass
    return found[0][2]


def device(spec=None):
    """The ``Device`` for ``spec`` (see ``select_cl_device``); one per OpenCL device.

    ``spec`` may also be a ``Device`` (returned as is) or a ``pyopencl.Device``.
    """
    if isinstance(spec, Device):
        return spec
    cl_dev = spec if isinstance(spec, cl.Device) else select_cl_device(spec)
    with _lock:
        dev = _devices.get(cl_dev.int_ptr)
        if dev is None:
            dev = Device(cl_dev)
            _devices[cl_dev.int_ptr] = dev
            _by_context[dev.context.int_ptr] = dev
        return dev


def device_of(array):
    """The clnn ``Device`` whose context ``array`` lives in."""
    dev = _by_context.get(array.context.int_ptr)
    if dev is None:
        raise DeviceError("array was not made by clnn: create it with clnn.asarray/empty/zeros "
                          "so it lives in a clnn device's context")
    return dev


# ---------------------------------------------------------------- unregistered drivers

# vendor OpenCL libraries that an ICD loader only sees through a file in
# /etc/OpenCL/vendors: (vendor, library, .icd file name, platform name it gives)
VENDOR_ICDS = (("NVIDIA", "libnvidia-opencl.so.1", "nvidia.icd", "nvidia"),
               ("AMD ROCm", "libamdocl64.so", "amdocl64.icd", "amd"),
               ("Intel", "libigdrcl.so", "intel.icd", "intel"))
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64",
                "/usr/local/nvidia/lib", "/usr/lib/wsl/lib", "/opt/rocm/lib",
                "/usr/lib/aarch64-linux-gnu")


def _ldconfig_paths():
    """{library file name: path} from the dynamic linker's cache (``ldconfig -p``)."""
    import subprocess
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        try:
            out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True,
                                 timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
    found = {}
    for line in out.splitlines():
        name, _, path = line.strip().partition(" => ")
        if path:
            found.setdefault(name.split()[0], path.strip())
    return found


def unregistered_drivers(platform_names, libraries=None, vendors_dir=None):
    """[(vendor, library path, advice)] for vendor OpenCL libraries present on this
    machine whose platform the ICD loader does not list.

    A machine with the NVIDIA driver often has libnvidia-opencl.so.1 but no
    /etc/OpenCL/vendors/nvidia.icd (cloud and container images; the H100 clnn was
    first measured on was one): OpenCL programs then see no NVIDIA platform at all.
    ``libraries`` ({file name: path}) and ``vendors_dir`` are for tests.
    """
    if libraries is None:
        libraries = _ldconfig_paths()
        for folder in LIBRARY_DIRS:
            for _, lib, _, _ in VENDOR_ICDS:
                path = os.path.join(folder, lib)
                if lib not in libraries and os.path.exists(path):
                    libraries[lib] = path
    vendors_dir = vendors_dir or os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    names = " ".join(platform_names).lower()
    notes = []
    for vendor, lib, icd, platform_word in VENDOR_ICDS:
        path = libraries.get(lib)
        if path is None or platform_word in names:
            continue
        icd_path = os.path.join(vendors_dir, icd) if os.path.isdir(vendors_dir) else vendors_dir
        if os.path.exists(icd_path) and os.path.isdir(vendors_dir):
            advice = (f"{icd_path} exists but the platform did not load: check that the "
                      f"driver works (nvidia-smi for NVIDIA) and, in a container, that the "
                      f"runtime passes the compute capability (NVIDIA_DRIVER_CAPABILITIES="
                      f"compute,utility)")
        else:
            advice = (f"register it with the ICD loader:  echo {path} | sudo tee "
                      f"/etc/OpenCL/vendors/{icd}  (or point OCL_ICD_VENDORS at a folder "
                      f"holding such a file)")
        notes.append((vendor, path, advice))
    return notes


def open_devices():
    """The ``Device`` objects made so far."""
    return list(_devices.values())


def _driver_notes(found):
    names = {d.platform.name for _, _, d in found}
    for vendor, path, advice in unregistered_drivers(names):
        print(f"note: {vendor}'s OpenCL driver {path} is installed, but no {vendor} "
              f"platform is listed: {advice}")


def print_devices(extensions=False):
    """Print every OpenCL platform's devices with their facts, marking the default,
    and notes on installed drivers no platform lists (``clnn devices``); with
    ``extensions``, each device's OpenCL extensions too. Returns whether any device
    was found."""
    try:
        found = all_devices()
    except Exception:  # noqa: BLE001 - no ICD loader at all: still explain what is there
        found = []
    if not found:
        print("no OpenCL devices found; pip install 'clnn[pocl]' for a CPU device")
        _driver_notes(found)
        return False
    try:
        default = select_cl_device(None)
    except Exception:  # noqa: BLE001 - listing must work even if selection fails
        default = None
    for pi, di, d in found:
        f = DeviceFacts.of(d)
        mark = "*" if default is not None and d.int_ptr == default.int_ptr else " "
        print(f"{mark} {pi}:{di}  {f.name}  [{f.platform}]")
        print(f"      type {f.type}, vendor {f.vendor}, driver {f.driver_version}, "
              f"{f.opencl_version}")
        print(f"      {f.compute_units} compute units, max work-group {f.max_work_group_size}, "
              f"local memory {f.local_mem_size // 1024} KiB")
        print(f"      global memory {f.global_mem_size / 2**30:.1f} GiB, max allocation "
              f"{f.max_alloc_size / 2**30:.1f} GiB, fp64 {'yes' if f.fp64 else 'no'}, "
              f"fp16 {'yes' if f.fp16 else 'no'}")
        if f.nv_compute_capability:
            cc = f.nv_compute_capability
            engines = "TF32 and float16 matrix engines (mma.sync)" if cc >= 80 else \
                "no matrix engines clnn uses (mma.sync needs 8.0)"
            print(f"      compute capability {cc // 10}.{cc % 10}: {engines}")
        if f.is_cpu and f.float_lanes:
            print(f"      {f.float_lanes * 32}-bit vectors in its compiled code"
                  + (" (512-bit GEMM and convolution tiles)" if f.float_lanes >= 16 else ""))
        if "cl_khr_command_buffer" in d.extensions.split():
            print("      command buffers (cl_khr_command_buffer): CLNN_COMMAND_BUFFERS=1 "
                  "replays training steps through them")
        if extensions:
            names = sorted(d.extensions.split())
            print(textwrap.fill("extensions: " + (" ".join(names) or "none"), width=88,
                                initial_indent=" " * 6, subsequent_indent=" " * 8,
                                break_long_words=False, break_on_hyphens=False))
    print("(* = the default device; choose another with CLNN_DEVICE=gpu|cpu|pocl|NAME|P:D)")
    _driver_notes(found)
    return True
