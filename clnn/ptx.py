"""Offline PTX checks: a rendered kernel compiled for an NVIDIA GPU without one.

clang's NVPTX target compiles OpenCL C to PTX (libclc's bitcode supplies the
built-ins: get_local_id, barrier, vload_half), and NVIDIA's assembler ``ptxas`` (from
the ``nvidia-cuda-nvcc-cu12`` wheel, the ``ptx`` extra) turns that PTX into machine
code for an H100 (sm_90). What this checks and what it does not:

- the inline PTX of the matrix-engine rows (``mma.sync``, ``ldmatrix``): clang passes
  it through unread, so a wrong operand count, type or state space fails only here
  (or on a GPU);
- the local memory each kernel declares (ptxas's "smem"), against the planner's model
  (plans.local_bytes);
- registers and spills, as a proxy only: NVIDIA's OpenCL compiler emits its own PTX
  (on an H100 the engine rows used 125 to 167 registers there, none spilling; through
  clang 14 the 128x128 TF32 row takes 255 and spills a little).

Developer tooling for the tests (tests/test_ptx.py) and benchmarks/ptx_resources.py,
but for ``patch_ptx`` (and its two names), which clnn.programs uses at run time to
build Hopper's WGMMA rows on NVIDIA's own compiler.
"""

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# clang 14 knows up to sm_86: the PTX says sm_80 (every instruction the kernels use
# exists there) and ptxas assembles it for ARCH
CLANG_ARCH = "sm_80"
ARCH = "sm_90"
# the WGMMA rows' wgmma.mma_async needs the architecture-specific target of an H100
ARCH_A = "sm_90a"


# Instructions that exist only for an architecture-specific target (Hopper's wgmma:
# sm_90a) cannot go through NVIDIA's OpenCL compiler: it emits PTX for plain sm_90 and
# its ptxas rejects them, whatever -cl-nv-arch says (measured on an H200, driver
# 580.159.04). A kernel built with PTX_PATCH_OPTION writes each such instruction as a
# PTX comment that starts with PTX_MARK (its operands already substituted, since the
# asm statement still binds them), builds for sm_90, and is then built again from its
# own PTX (NVIDIA's program binary) with the marks removed and the target raised to
# the device's sm_XYa: see patch_ptx.
PTX_PATCH_OPTION = "-DCLNN_PTX_PATCH=1"
PTX_MARK = "//clnn-ptx "


def patch_ptx(ptx, arch, min_version=(8, 0)):
    """``ptx`` (text) with every PTX_MARK comment made an instruction again, its
    ``.target`` raised to ``arch`` (an architecture-specific one: "sm_90a") and its
    ``.version`` to at least ``min_version`` (wgmma needs PTX 8.0). Raises ValueError
    where the text has no mark or no target to raise (not a PTX_PATCH_OPTION build)."""
    if PTX_MARK not in ptx:
        raise ValueError("the PTX has no instruction marked " + repr(PTX_MARK))
    out, n = re.subn(r"^(\.target\s+)sm_\d+a?\b", lambda m: m.group(1) + arch, ptx,
                     count=1, flags=re.M)
    if not n:
        raise ValueError("the PTX names no .target")

    def version(m):
        have = (int(m.group(2)), int(m.group(3)))
        return m.group(1) + "%d.%d" % max(have, min_version)

    out = re.sub(r"^(\.version\s+)(\d+)\.(\d+)", version, out, count=1, flags=re.M)
    return out.replace(PTX_MARK, "")


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel (entry function)."""
    registers: int
    spill_bytes: int      # spill stores
    local_bytes: int      # ptxas's "smem": the kernel's __local arrays
    stack_bytes: int


def _libclc():
    pats = ["/usr/lib/clc/nvptx64--nvidiacl.bc", "/usr/lib/llvm-*/lib/clc/nvptx64--nvidiacl.bc",
            "/usr/share/clc/nvptx64--nvidiacl.bc", "/usr/local/share/clc/nvptx64--nvidiacl.bc"]
    for pat in pats:
        found = sorted(glob.glob(pat))
        if found:
            return found[-1]
    return None


def _ptxas():
    """CLNN_PTXAS, else the nvidia-cuda-nvcc wheel's (the declared one, whatever CUDA
    toolkit the machine has), else one on PATH."""
    if os.environ.get("CLNN_PTXAS"):
        return shutil.which(os.environ["CLNN_PTXAS"])
    for base in sys.path:        # the wheel: nvidia/cuda_nvcc/bin/ptxas
        cand = os.path.join(base or ".", "nvidia", "cuda_nvcc", "bin", "ptxas")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return shutil.which("ptxas")


@functools.lru_cache(maxsize=1)
def tools():
    """(clang, libclc bitcode, ptxas) paths, or None where one is missing."""
    return shutil.which("clang"), _libclc(), _ptxas()


def missing():
    """What is missing for the PTX check, as a line for a skip message ('' if none)."""
    names = ("clang (apt-get install clang)",
             "libclc's NVPTX bitcode (apt-get install libclc-<clang's version>)",
             "ptxas (pip install nvidia-cuda-nvcc-cu12, clnn's 'ptx' extra)")
    return ", ".join(n for n, t in zip(names, tools()) if t is None)


class PTXError(Exception):
    """clang or ptxas rejected a kernel; ``stage`` says which, ``log`` what it said."""

    def __init__(self, stage, log):
        super().__init__(f"{stage} rejected the kernel:\n{log}")
        self.stage, self.log = stage, log


_ENTRY = re.compile(r"Compiling entry function '(\w+)'.*?\n(.*?)(?=Compiling entry|\Z)", re.S)


def parse(log):
    """{entry function: Resources} from ``ptxas -v``'s report."""
    out = {}
    for name, body in _ENTRY.findall(log):
        def num(pat):
            m = re.search(pat, body)
            return int(m.group(1)) if m else 0
        out[name] = Resources(registers=num(r"Used (\d+) registers"),
                              spill_bytes=num(r"(\d+) bytes spill stores"),
                              local_bytes=num(r"(\d+) bytes smem"),
                              stack_bytes=num(r"(\d+) bytes stack frame"))
    return out


def _retarget(path, arch):
    """Raise the header clang 14 wrote (sm_80, PTX 7.x) in the PTX file ``path`` to PTX
    8.0 and target ``arch``; the new text."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"^\.version \d+\.\d+", ".version 8.0", text, flags=re.M)
    text = re.sub(r"^\.target sm_\d+", f".target {arch}", text, flags=re.M)
    with open(path, "w") as f:
        f.write(text)
    return text


def assemble(source, arch=ARCH, workdir=None, timeout=120, patched=False):
    """Compile rendered OpenCL C ``source`` to PTX and assemble it for ``arch``:
    {entry: Resources}, or PTXError.

    ``patched`` builds as clnn builds an architecture-specific row on NVIDIA's compiler
    (programs.PTX_PATCH_OPTION): the marked instructions as comments, assembled for
    plain ``arch`` (which must take it), then uncommented by patch_ptx and
    assembled for ARCH_A; the second assembly's resources."""
    clang, libclc, ptxas = tools()
    if None in (clang, libclc, ptxas):
        raise PTXError("setup", "missing " + missing())
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        cmd = [clang, "-x", "cl", "-S", "-O3", "-target", "nvptx64--nvidiacl",
               f"-march={CLANG_ARCH}", "-cl-std=CL1.2", "-cl-no-stdinc",
               "-Xclang", "-finclude-default-header",
               "-Xclang", "-cl-ext=-cl_khr_fp64,-cl_khr_fp16",
               "-Xclang", "-mlink-builtin-bitcode", "-Xclang", libclc, "-o", ptx, "-"]
        if patched:
            cmd.insert(-1, PTX_PATCH_OPTION)
        res = subprocess.run(cmd, input=source, capture_output=True, text=True,
                             timeout=timeout)
        if res.returncode:
            raise PTXError("clang", res.stderr)

        def run_ptxas(path, arch):
            res = subprocess.run([ptxas, f"-arch={arch}", "-v", "-o",
                                  os.path.join(tmp, "k.o"), path],
                                 capture_output=True, text=True, timeout=timeout)
            if res.returncode:
                raise PTXError("ptxas", res.stderr)
            return parse(res.stderr)

        if patched:
            # what the driver's compiler assembles first: its PTX (8.x) for plain sm_90
            text = _retarget(ptx, arch)
            run_ptxas(ptx, arch)
            with open(ptx, "w") as f:
                f.write(patch_ptx(text, ARCH_A))
            return run_ptxas(ptx, ARCH_A)
        if "wgmma." in source:
            # Hopper's wgmma exists only for sm_90a, in PTX 8.0 and up
            arch = ARCH_A
            _retarget(ptx, arch)
        return run_ptxas(ptx, arch)
