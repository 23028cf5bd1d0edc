"""Every rendered kernel variant through clang's OpenCL C 1.2 checker (no device needed).

Each dtype is checked with only its own extension enabled, so a float32 kernel that
slips in a double (an unsuffixed literal, a double builtin) fails here even though
PoCL, which has cl_khr_fp64, would run it.
"""

import shutil
import subprocess

import pytest

from clnn import programs
from conftest import gate

CLANG = shutil.which("clang")
EXTS = {"float32": "-cl_khr_fp64,-cl_khr_fp16",
        "float64": "+cl_khr_fp64,-cl_khr_fp16",
        "float16": "-cl_khr_fp64,+cl_khr_fp16"}


def variants():
    for stem, (_, make) in sorted(programs.registered().items()):
        for i, params in enumerate(make()):
            for dtype in EXTS:
                yield pytest.param(stem, dict(params, dtype=dtype), id=f"{stem}-{i}-{dtype}")


def extensions(*dtypes):
    """The -cl-ext switch that enables exactly the extensions ``dtypes`` need (a cast
    from float64 needs cl_khr_fp64 whatever its destination)."""
    return ",".join(("+" if name in dtypes else "-") + ext
                    for name, ext in (("float64", "cl_khr_fp64"), ("float16", "cl_khr_fp16")))


def clang_check(source, dtype, *others):
    cmd = [CLANG, "-x", "cl", "-fsyntax-only", "-target", "spir64", "-cl-std=CL1.2",
           "-cl-no-stdinc", "-Xclang", "-finclude-default-header", "-Xclang",
           f"-cl-ext={extensions(dtype, *others)}", "-Wall", "-Werror", "-"]
    return subprocess.run(cmd, input=source, capture_output=True, text=True, timeout=60)


@gate("clang", CLANG is not None)
@pytest.mark.parametrize("stem,params", list(variants()))
def test_kernel_compiles_as_opencl_c_1_2(stem, params):
    source = programs.render(stem, params)
    res = clang_check(source, params["dtype"], params.get("src"))
    assert res.returncode == 0, f"clang rejected {stem} {params}:\n{res.stderr}\n" + \
        programs.numbered(source)


@gate("clang", CLANG is not None)
def test_the_checker_catches_a_stray_double():
    bad = "__kernel void k(__global float *x) { x[0] = x[0] * 0.5 + 1.0 / 3; }"
    assert clang_check(bad.replace("0.5", "(double)0.5"), "float32").returncode != 0
