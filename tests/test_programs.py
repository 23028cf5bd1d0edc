"""Rendering, the kernel cache, build errors and debug output."""

import dataclasses
import logging
import os
import platform
import sys

import numpy as np
import pyopencl as cl
import pytest

import clnn
from clnn import programs, tuning


def test_render_is_complete_and_typed():
    src = programs.render("elementwise", {"dtype": "float64", "act": "tanh"})
    assert "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" in src
    assert "typedef double real_t;" in src and "tanh(z)" in src
    half = programs.render("reduce", {"dtype": "float16"})
    assert "cl_khr_fp16" not in half and "vload_half" in half
    f32 = programs.render("gemm", {})
    assert "cl_khr" not in f32 and "#define MWI" in f32


def test_cpu_code_keeps_to_256_bit_vectors():
    """No kernel the library builds for a CPU with 256-bit code puts a 512-bit vector
    (double8, double16, float16) in its code: PoCL 3.0 compiles for an AVX-512 Zen 4
    as for a Zen 3, a 512-bit argument there "changes the ABI", and after such a build
    the next program with the same kernel names had none (INVALID_KERNEL_NAME: float64
    activations, pooling, softmax and BatchNorm failed on those machines). The GEMM
    and convolution tiles as the ops pass them (programs.variant_for). The 512-bit
    tiles (VW 16) of the GEMM and the convolutions are refused on such a CPU, and even
    their kernels keep the wide vectors in registers: no function takes one."""
    import re
    from clnn.device import DeviceFacts
    avx2 = DeviceFacts("p", "cpu", "v", "CPU", "1", "OpenCL 1.2", 2, 4096, (4096,) * 3,
                       1 << 20, 1 << 30, 1 << 32, True, False, float_lanes=8)
    wide = re.compile(r"\b(double8|double16|float16)\b")   # (int16 kernel arguments: fine)
    signature = re.compile(r"\w+\s*\(([^;{}]*)\)\s*\{")   # a function's parameters
    bad, tiles512 = [], 0
    for stem, (_, make) in sorted(programs.registered().items()):
        for params in make():
            vw = dict(params.get("tuning", ())).get("VW", 0)
            # the row that asks for the tile: GEMM_TABLE's, or a gathered convolution's
            row = dict(params["tuning"], variant="reg") if stem == "gemm" else \
                {"variant": "gather", "VW": vw, "WG": 1}
            for dtype in ("float32", "float64"):
                p = programs.variant_for(params, dtype)
                code = "\n".join(line.split("//")[0]
                                 for line in programs.render(stem, p).splitlines())
                if vw > 8:
                    # refused where the code has 256-bit vectors, and even here no
                    # function takes a 512-bit vector (what changed the ABI)
                    tiles512 += 1
                    assert any("512-bit" in why for why in tuning.gemm_problems(row, avx2))
                    bad += [(stem, p, "512-bit argument") for args in signature.findall(code)
                            if wide.search(args) or re.search(r"\bvec_t\b", args)]
                    continue
                hit = wide.search(code)
                if hit:
                    bad.append((stem, p, hit.group(0)))
    assert not bad, bad[:5]
    assert tiles512        # the 512-bit tiles were looked at


def test_render_error_carries_params_and_traceback():
    with pytest.raises(clnn.TemplateError) as e:
        programs.render("elementwise", {"act": "swish"})
    assert e.value.params["act"] == "swish"
    assert "unknown activation swish" in e.value.traceback
    with pytest.raises(clnn.TemplateError):
        programs.render("no_such_template", {})


def test_build_error_saves_numbered_source(dev):
    bad = {"variant": "local", "trans_a": False, "trans_b": False,
           "tuning": (("KWG", 4), ("MDIMC", 4), ("MWG", 10), ("NDIMC", 4), ("NWG", 8))}
    with pytest.raises(clnn.KernelBuildError) as e:
        programs.get_kernel(dev, "gemm", "clnn_gemm_tiled", bad)
    err = e.value
    assert "MWG and NWG must be multiples" in err.log
    assert err.params["tuning"] == bad["tuning"] and "-cl-std=CL1.2" in err.options
    assert os.path.exists(err.source_path) and err.source_path in str(err)
    with open(err.source_path) as f:
        first = f.readline()
    assert first.strip().startswith("1 ")


def test_a_build_without_its_kernels_is_a_build_error(dev, monkeypatch):
    """A driver that returns a built program lacking its kernels (PoCL 3.0 did, after an
    earlier build warned about 512-bit vector arguments) gives a KernelBuildError with
    the compiler's log at once, not INVALID_KERNEL_NAME from clCreateKernel."""
    class Empty:                      # what that driver's program reports
        kernel_names = ""

        def get_build_info(self, device, what):
            return "warning: AVX vector argument ... changes the ABI"

    class Program:
        def __init__(self, context, source):
            pass

        def build(self, options=()):
            return Empty()
    clnn.clear_caches()               # so this process builds it now, whatever ran before
    monkeypatch.setattr(programs.cl, "Program", Program)
    params = {"dtype": "float32", "op": "linalg"}
    with pytest.raises(clnn.KernelBuildError, match="without its kernels") as e:
        programs.get_kernel(dev, "elementwise", "clnn_scale", params)
    assert "changes the ABI" in e.value.log and "clnn_scale" in str(e.value)


def test_cache_hits_and_clear(dev):
    params = {"dtype": "float32", "op": "linalg"}
    k1 = programs.get_kernel(dev, "elementwise", "clnn_scale", params)
    hits = dev.kernels.hits
    k2 = programs.get_kernel(dev, "elementwise", "clnn_scale", dict(params, act="sigmoid"))
    assert k1 is k2 and dev.kernels.hits == hits + 1   # defaults fill the same key
    clnn.clear_caches()
    assert len(dev.kernels) == 0
    assert programs.get_kernel(dev, "elementwise", "clnn_scale", params) is not k1


def test_threads_asking_for_a_new_kernel_build_it_once(dev, monkeypatch):
    """Eight threads ask for the same kernel nobody has built, at the same moment: one
    build (on the device's build lock), one Kernel object for all of them, and never
    two builds running at once."""
    import threading
    builds, running, overlap = [], [0], []
    real = programs._build

    def counting(*a):
        running[0] += 1
        overlap.append(running[0])
        try:
            builds.append(a[1])
            return real(*a)
        finally:
            running[0] -= 1
    monkeypatch.setattr(programs, "_build", counting)
    # (the cache is cleared first: the kernel is new to this process's cache)
    clnn.clear_caches()
    params = {"dtype": "float32", "op": "act", "act": "softplus", "src": "z",
              "inplace": ""}
    start, got = threading.Barrier(8), []

    def ask():
        start.wait()
        got.append(programs.get_kernel(dev, "elementwise", "clnn_act_backward", params))
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(k is got[0] for k in got)
    assert builds == ["elementwise"] and max(overlap) == 1


def test_cache_is_bounded():
    cache = programs.KernelCache(maxsize=3)
    for i in range(10):
        cache.put(i, object())
    assert len(cache) == 3 and cache.get(0) is None and cache.get(9) is not None


def test_named_arguments_are_checked(dev):
    k = programs.get_kernel(dev, "elementwise", "clnn_fill", {"op": "linalg"})
    assert k.names == ["n", "value", "out", "out_off"]
    with pytest.raises(TypeError, match="missing"):
        k((64,), (64,), n=1, value=0.0)


def test_signatures_parse_attributes_and_types():
    sigs = programs.signatures(
        "__kernel __attribute__((reqd_work_group_size(8, 8, 1)))\nvoid f(const int n,"
        " __global const real_t *x, const acc_t a) {}\n__kernel void g(float y) {}")
    assert sigs == {"f": [("n", "int"), ("x", None), ("a", "acc_t")], "g": [("y", "float")]}


def test_debug_logs_builds_and_hits(dev, monkeypatch, caplog):
    monkeypatch.setenv("CLNN_DEBUG", "1")
    caplog.set_level(logging.DEBUG, logger="clnn")
    clnn.clear_caches()
    x = clnn.asarray(np.ones(3, np.float32))
    clnn.scale(2.0, x)
    clnn.scale(2.0, x)
    text = caplog.text
    assert "built elementwise.cl" in text and "cache hit elementwise:clnn_scale" in text


def test_debug_level_two_prints_sources(dev, monkeypatch, capsys):
    monkeypatch.setenv("CLNN_DEBUG", "2")
    clnn.clear_caches()
    clnn.scale(2.0, clnn.asarray(np.ones(3, np.float32)))
    assert "__kernel void clnn_scale" in capsys.readouterr().err


def test_recorded_events_cover_every_launch_of_an_op(dev, monkeypatch):
    """What the tuner times: the profiled events of exactly the kernels an op launches
    (a packed GEMM launches three; products this small take the direct kernel
    unless told otherwise)."""
    monkeypatch.setattr(sys.modules["clnn.ops.gemm"], "DIRECT_FLOPS", 0)
    a = clnn.asarray(np.ones((40, 30), np.float32), device=dev)
    with tuning.override("gemm", tuning.GEMM_TABLE["type"]["CPU"]):
        clnn.gemm(a, a, trans_b=True)
        with programs.recorded_events() as events:
            with programs.recorded_events() as inner:
                clnn.scale(2.0, a, out=a)
            clnn.gemm(a, a, trans_b=True)
    dev.finish()
    assert len(inner) == 1 and len(events) == 4 and events[0] is inner[0]
    assert all(e.profile.end >= e.profile.start > 0 for e in events)
    clnn.scale(0.5, a, out=a)          # outside: nothing records it
    assert len(events) == 4


def test_float16_vectors_through_their_bits_from_pocl_3_1():
    """PoCL builds with CLNN_POCL (its clang takes inline assembly: F16C's
    conversions on x86; select() as an operator), and from 3.1 on with CLNN_HALF_BITS
    (3.1's vector built-ins crashed at addresses not 16-byte aligned); other CPUs'
    drivers and GPUs keep the built-ins."""
    facts = clnn.device().facts
    pocl = dataclasses.replace(facts, platform="Portable Computing Language", type="CPU")
    for version, bits in (("3.0-rc2", False), ("3.1+debian", True), ("6.0", True),
                          ("", False)):
        got = programs.cpu_options(dataclasses.replace(pocl, driver_version=version))
        assert ("-DCLNN_HALF_BITS=1" in got) == bits, version
        assert programs.CPU_OPTIONS[0] in got and "-DCLNN_POCL=1" in got
    intel = dataclasses.replace(pocl, platform="Intel(R) OpenCL", driver_version="2024.18")
    assert programs.cpu_options(intel) == programs.CPU_OPTIONS


def _x86_f16c():
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    return platform.machine() in ("x86_64", "AMD64") and " f16c" in flags


def test_float16_conversions_are_instructions_on_x86_pocl(dev):
    """On PoCL on x86 with F16C, the float16 vector conversions are F16C's
    instructions in the kernel (_half.cl's CLNN_HALF_F16C form), not calls."""
    if not (dev.facts.is_pocl and dev.facts.is_cpu and _x86_f16c()):
        pytest.skip(f"the form is PoCL's on x86 with F16C; {dev.name} is not one")
    source = programs.render("cast", {"dtype": "float16", "src": "float32"}) + """
__kernel void clnn_probe(__global int *out)
{
#ifdef CLNN_HALF_F16C
    out[0] = 1;
#else
    out[0] = 2;
#endif
}
"""
    options = list(programs.BUILD_OPTIONS) + list(programs.cpu_options(dev.facts))
    prg = cl.Program(dev.context, source).build(options=options)
    out = np.zeros(1, np.int32)
    buf = cl.Buffer(dev.context, cl.mem_flags.WRITE_ONLY, 4)
    prg.clnn_probe(dev.queue, (1,), None, buf)
    cl.enqueue_copy(dev.queue, out, buf)
    assert out[0] == 1


@pytest.mark.parametrize("form", ["HALF_BITS", "POCL"])
def test_float16_vectors_through_their_bits_compute_as_the_built_ins(dev, monkeypatch, form):
    """The CLNN_HALF_BITS form of the float16 vector loads and stores, and the
    CLNN_POCL one (F16C in the kernel, where the CPU has it; selects as the vector
    conditional operator), give bitwise what the built-ins give, on arrays at odd element offsets (where PoCL 3.1 crashed) in
    element-wise ops, sums, pooling (vectors of 8 and of 4), softmax, a GEMM's
    packing, the direct GEMM (both layouts) and a convolution's strided output
    channels."""
    if not (dev.facts.is_pocl and dev.facts.is_cpu):
        pytest.skip(f"the form is PoCL's on CPUs; {dev.name} is not one")
    rng = np.random.default_rng(3)

    def run():
        x = clnn.asarray(rng.standard_normal(8 * 97 + 1).astype(np.float16))[1:]
        img = clnn.asarray(rng.standard_normal(2 * 3 * 10 * 16 + 3).astype(np.float16))
        img = img[3:].reshape(2, 3, 10, 16)
        m = clnn.asarray(rng.standard_normal(37 * 41 + 5).astype(np.float16))[5:]
        m = m.reshape(37, 41)
        w = clnn.asarray(rng.standard_normal(17 * 3 * 3 * 3 + 1).astype(np.float16))[1:]
        w = w.reshape(17, 3, 3, 3)
        return [clnn.tanh(x).get(), clnn.sum(x).get(), clnn.max(x).get(),
                clnn.max_pool2d(img, 2).get(), clnn.softmax(m).get(),
                clnn.gemm(m, m, trans_b=True).get(), clnn.gemm(m[:3, :37], m).get(),
                clnn.gemm(m[:5], m[:9], trans_b=True).get(),
                clnn.conv2d(img, w, padding=1, activation="relu").get(),
                clnn.max_pool2d_backward(clnn.max_pool2d(img, 2), img, 2).get()]

    # the reference: the built-ins, on global memory where the driver runs them
    # there (PoCL 3.0), in private memory from 3.1 on (HALF_BITS: 3.1 crashed else)
    reference = tuple(o for o in programs.cpu_options(dev.facts) if o != "-DCLNN_POCL=1")
    builds = {"built-ins": reference,
              "HALF_BITS": programs.CPU_OPTIONS + ("-DCLNN_HALF_BITS=1",),
              "POCL": reference + ("-DCLNN_POCL=1",)}
    if builds[form] == reference:
        pytest.skip(f"{dev.facts.driver_version}'s reference is the {form} form itself")
    results, built = {}, []
    build = programs._build
    state = rng.bit_generator.state
    try:
        for name in ("built-ins", form):
            monkeypatch.setattr(programs, "cpu_options", lambda facts, o=builds[name]: o)
            monkeypatch.setattr(programs, "_build", lambda device, stem, params, options:
                                built.append(options) or build(device, stem, params,
                                                               options))
            clnn.clear_caches()
            rng.bit_generator.state = state
            built.clear()
            results[name] = run()
            assert built and all(set(builds[name]) <= set(o) for o in built)
    finally:
        monkeypatch.undo()
        clnn.clear_caches()
    for g, w in zip(results[form], results["built-ins"]):
        assert g.dtype == w.dtype and np.array_equal(g, w, equal_nan=True)
