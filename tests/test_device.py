import numpy as np
import pytest

import clnn
from conftest import TEST_DEVICE
from clnn.device import DeviceFacts, select_cl_device


def test_specs_resolve_without_prompting(dev, monkeypatch):
    monkeypatch.delenv("CLNN_DEVICE", raising=False)
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)
    pocl = select_cl_device("pocl")
    assert select_cl_device("cpu").int_ptr == pocl.int_ptr
    assert select_cl_device("0:0").int_ptr == select_cl_device("0").int_ptr
    assert select_cl_device("portable").int_ptr == pocl.int_ptr
    monkeypatch.setenv("PYOPENCL_CTX", "0")
    assert select_cl_device(None).int_ptr == select_cl_device("0:0").int_ptr
    monkeypatch.setenv("CLNN_DEVICE", "pocl")
    assert select_cl_device(None).int_ptr == pocl.int_ptr


def test_unknown_spec_lists_the_devices():
    with pytest.raises(clnn.DeviceError, match="devices: 0:0"):
        select_cl_device("no-such-device-anywhere")
    with pytest.raises(clnn.DeviceError):
        select_cl_device("9:9")


def test_one_device_object_per_device(dev):
    assert clnn.device(TEST_DEVICE) is dev and clnn.device(dev) is dev
    assert clnn.device(dev.cl_device) is dev


def test_facts(dev):
    # (read from the driver again: CLNN_TEST_FACTS=h100 gives the test device an
    # H100's facts)
    f = DeviceFacts.of(dev.cl_device)
    assert f.max_work_group_size >= 1 and f.local_mem_size > 0
    assert f.max_alloc_size <= f.global_mem_size
    if f.is_pocl:                                    # what the pip PoCL reports
        assert f.type == "CPU" and f.fp64
    assert set(f.as_dict()) >= {"name", "vendor", "type", "driver_version", "fp64", "fp16"}


def test_l2_size_of_a_cpu_device_from_sysfs(dev, tmp_path):
    """A PoCL CPU device's facts carry the host's level-2 cache per core, read from
    Linux's sysfs (the cache levels in any order, sizes in K or M); other devices,
    and hosts that say nothing, 0."""
    from clnn.device import host_l2_size
    for index, level, size in (("index0", "1", "48K"), ("index1", "1", "32K"),
                               ("index2", "2", "2048K"), ("index3", "3", "105M")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "level").write_text(level + "\n")
        (tmp_path / index / "size").write_text(size + "\n")
    assert host_l2_size(str(tmp_path)) == 2 << 20
    (tmp_path / "index2" / "size").write_text("1M\n")
    assert host_l2_size(str(tmp_path)) == 1 << 20
    (tmp_path / "index2" / "level").write_text("4\n")
    assert host_l2_size(str(tmp_path)) == 0
    assert host_l2_size(str(tmp_path / "none")) == 0
    f = DeviceFacts.of(dev.cl_device)
    assert f.l2_size == (host_l2_size() if f.is_pocl and f.is_cpu else 0)


@pytest.mark.parametrize("platform,version,native,lanes", [
    # PoCL compiling AVX-512 code, and AVX2 code on an AVX-512 CPU (PoCL 3.0 on a Zen
    # 4: it reports the hardware's 16 lanes)
    ("Portable Computing Language",
     "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-rocketlake", 16, 16),
    ("Portable Computing Language",
     "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-skylake-avx512", 16, 16),
    ("Portable Computing Language",
     "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver3", 16, 8),
    ("Portable Computing Language", "OpenCL 3.0 PoCL", 16, 8),
    ("Portable Computing Language",
     "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-haswell", 8, 8),
    # other drivers say what their code has
    ("Intel(R) OpenCL", "OpenCL 3.0 LINUX", 16, 16),
    ("NVIDIA CUDA", "OpenCL 3.0 CUDA 12.8.97", 1, 1)])
def test_float_lanes_are_the_codes_not_the_hardwares(platform, version, native, lanes):
    """512-bit tiles are taken where the device's compiled code has 512-bit vectors,
    which for PoCL is the CPU its compiler targets, not the CPU's features."""
    from clnn.device import code_float_lanes
    assert code_float_lanes(platform, version, native) == lanes


def test_array_constructors(dev):
    x = clnn.asarray([[1, 2], [3, 4]], dtype=np.float32)
    assert x.shape == (2, 2) and x.allocator is dev.pool
    assert np.array_equal(clnn.zeros((3, 2)).get(), np.zeros((3, 2)))
    assert clnn.empty((0,)).size == 0
    assert clnn.asarray(np.zeros((0, 3), np.float32)).shape == (0, 3)
    with pytest.raises(clnn.DTypeError):
        clnn.empty(3, np.complex64)
    # half storage needs no extension: every device takes float16 arrays
    assert clnn.zeros(3, np.float16).dtype == np.float16
    if not dev.facts.fp64:
        with pytest.raises(clnn.DTypeError, match="cl_khr_fp64"):
            clnn.zeros(3, np.float64)


@pytest.mark.parametrize("given,expected", [(None, "1"), ("0", "0")])
def test_pocl_threads_are_pinned_unless_the_user_chose(given, expected):
    """Importing clnn sets POCL_AFFINITY=1 (PoCL's unpinned threads shared a core here),
    and leaves a value the user set alone."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "POCL_AFFINITY"}
    if given is not None:
        env["POCL_AFFINITY"] = given
    out = subprocess.run([sys.executable, "-c", "import os, clnn; "
                          "print(os.environ['POCL_AFFINITY'])"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == expected


def test_unregistered_nvidia_driver_is_explained(tmp_path):
    """A machine with libnvidia-opencl.so.1 but no nvidia.icd sees no NVIDIA platform:
    clnn devices says where the library is and how to register it."""
    from clnn.device import unregistered_drivers
    libs = {"libnvidia-opencl.so.1": "/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1"}
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (notes,) = unregistered_drivers(["Portable Computing Language"], libs, str(vendors))
    vendor, path, advice = notes
    assert vendor == "NVIDIA" and path == libs["libnvidia-opencl.so.1"]
    assert "/etc/OpenCL/vendors/nvidia.icd" in advice and path in advice
    # registered but not loading: say so instead
    (vendors / "nvidia.icd").write_text(path + "\n")
    (notes,) = unregistered_drivers([], libs, str(vendors))
    assert "exists but the platform did not load" in notes[2]
    # a listed NVIDIA platform, or no library: nothing to say
    assert unregistered_drivers(["NVIDIA CUDA"], libs, str(vendors)) == []
    assert unregistered_drivers(["NVIDIA CUDA"], {}, str(vendors)) == []
