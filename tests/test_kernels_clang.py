"""Every rendered kernel variant through clang's OpenCL C 1.2 checker (no device needed).

Each dtype is checked with only the extension it needs enabled, so a float32 kernel
that slips in a double (an unsuffixed literal, a double builtin) fails here even though
PoCL, which has cl_khr_fp64, would run it. float16 is checked without cl_khr_fp16: half
is storage only (vload_half/vstore_half are core OpenCL 1.2), so every device runs it.
"""

import atexit
import functools
import os
import shutil
import subprocess
import tempfile

import pytest

from clnn import programs
from conftest import gate

CLANG = shutil.which("clang")
DTYPES = ("float32", "float64", "float16", "bfloat16")


def variants():
    for stem, (_, make) in sorted(programs.registered().items()):
        for i, params in enumerate(make()):
            for dtype in DTYPES:
                yield pytest.param(stem, programs.variant_for(params, dtype),
                                   id=f"{stem}-{i}-{dtype}")


def extensions(*dtypes):
    """The -cl-ext switch that enables exactly the extensions ``dtypes`` need (a cast
    from float64 needs cl_khr_fp64 whatever its destination); never cl_khr_fp16."""
    return ("+" if "float64" in dtypes else "-") + "cl_khr_fp64,-cl_khr_fp16"


@functools.lru_cache(maxsize=None)
def default_header(target, ext):
    """clang's options that declare the OpenCL built-ins for ``target`` with extensions
    ``ext``: its default header (opencl-c.h) precompiled once per process, which
    parsing took most of each check's 90 ms (2000-odd checks); the header itself
    where it does not precompile. (clang 14's -fdeclare-opencl-builtins, which needs
    no header, lacks vload_half and vstore_half.)"""
    plain = ["-Xclang", "-finclude-default-header"]
    resource = subprocess.run([CLANG, "-print-resource-dir"], capture_output=True,
                              text=True).stdout.strip()
    header = os.path.join(resource, "include", "opencl-c.h")
    if not os.path.exists(header):
        return plain
    folder = tempfile.mkdtemp(prefix="clnn-clang-")
    atexit.register(shutil.rmtree, folder, True)
    pch = os.path.join(folder, f"{target}{ext}.pch")
    res = subprocess.run([CLANG, "-x", "cl-header", "-target", target, "-cl-std=CL1.2",
                          "-cl-no-stdinc", "-Xclang", f"-cl-ext={ext}", header, "-o", pch],
                         capture_output=True, text=True, timeout=120)
    return ["-Xclang", "-include-pch", "-Xclang", pch] if res.returncode == 0 else plain


def clang_check(source, dtype, *others, defines=(), target="spir64"):
    """clang's OpenCL C 1.2 checker on ``source``: only the extensions ``dtype`` (and
    ``others``) need, no warnings; ``target`` spir64 (portable) or nvptx64-nvidia-cuda
    (inline PTX's register operands)."""
    ext = extensions(dtype, *others)
    cmd = [CLANG, "-x", "cl", "-fsyntax-only", "-target", target, "-cl-std=CL1.2",
           "-cl-no-stdinc"] + default_header(target, ext) + \
        ["-Xclang", f"-cl-ext={ext}", "-Wall", "-Werror"] + \
        [f"-D{d}" for d in defines] + ["-"]
    return subprocess.run(cmd, input=source, capture_output=True, text=True, timeout=60)


@gate("clang", CLANG is not None)
@pytest.mark.parametrize("stem,params", list(variants()))
def test_kernel_compiles_as_opencl_c_1_2(stem, params):
    source = programs.render(stem, params)
    res = clang_check(source, params["dtype"], params.get("src"))
    assert res.returncode == 0, f"clang rejected {stem} {params}:\n{res.stderr}\n" + \
        programs.numbered(source)


def cpu_variants():
    """Each template's variants built for CPUs (-DCLNN_CPU: their element loops and
    float16 conversions), every dtype: its first, and its first with tanh (the
    epilogue's inline exp and tanh on PoCL); cast with every source."""
    for stem, (_, make) in sorted(programs.registered().items()):
        every = list(make())
        firsts = every[:1] + [v for v in every if v.get("act") == "tanh"][:1]
        for i, params in enumerate(firsts if stem != "cast" else every):
            for dtype in DTYPES:
                yield pytest.param(stem, programs.variant_for(params, dtype),
                                   id=f"{stem}-{i}-{dtype}")


@gate("clang", CLANG is not None)
@pytest.mark.parametrize("stem,params", list(cpu_variants()))
def test_cpu_build_compiles_as_opencl_c_1_2(stem, params):
    source = programs.render(stem, params)
    builds = [["CLNN_CPU=1"]]
    if params["dtype"] == "float32":        # PoCL's selects (the operator), in one dtype
        builds.append(["CLNN_CPU=1", "CLNN_POCL=1"])
    if "float16" in (params["dtype"], params.get("src")):
        builds.append(["CLNN_CPU=1", "CLNN_HALF_BITS=1"])   # PoCL's from 3.1 on
    for defines in builds:
        res = clang_check(source, params["dtype"], params.get("src"), defines=defines)
        assert res.returncode == 0, f"clang rejected {stem} {params} with {defines}:\n" \
            f"{res.stderr}\n" + programs.numbered(source)


@gate("clang", CLANG is not None)
def test_the_checker_catches_a_stray_double():
    bad = "__kernel void k(__global float *x) { x[0] = x[0] * 0.5 + 1.0 / 3; }"
    assert clang_check(bad.replace("0.5", "(double)0.5"), "float32").returncode != 0


@gate("clang", CLANG is not None)
def test_the_checker_catches_half_arithmetic():
    """What float16 kernels must not do without cl_khr_fp16: assign or compute in half."""
    bad = "__kernel void k(__global half *x) { x[0] = x[1]; }"
    assert clang_check(bad, "float16").returncode != 0
    good = "__kernel void k(__global half *x) { vstore_half(vload_half(1, x) * 2.0f, 0, x); }"
    assert clang_check(good, "float16").returncode == 0, clang_check(good, "float16").stderr
