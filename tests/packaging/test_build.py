"""The installed package: header and binding agree, version and build info, the C example; a
CPU-only build's CUDA entry points."""

import ctypes
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pytfm
from helpers import ROOT, header_text, public_headers
from pytfm import reference as ref
from pytfm._core import ffi, lib

PKG = os.path.dirname(os.path.abspath(pytfm.__file__))
INSTALLED_INCLUDE = os.path.join(PKG, "include")
INSTALLED_HEADER = os.path.join(INSTALLED_INCLUDE, "pytfm.h")
SOURCE_INCLUDE = os.path.join(ROOT, "csrc", "include")
SOURCE_HEADER = os.path.join(SOURCE_INCLUDE, "pytfm.h")
# the package holds the library under its SONAME only (a wheel holds no symlinks)
SHARED_LIB = f"libpytfm.so.{lib.pytfm_abi_version()}"


def declared_functions(include):
    return sorted(set(re.findall(r"\b(pytfm_\w+)\s*\(", header_text(include))))


def test_every_declared_function_is_bound_and_exported():
    names = declared_functions(INSTALLED_INCLUDE)
    assert len(names) >= 19, names
    missing = [n for n in names if not hasattr(lib, n)]
    assert not missing, f"declared in pytfm.h but not bound by cffi: {missing}"
    so = ctypes.CDLL(os.path.join(PKG, "lib", SHARED_LIB))
    unexported = [n for n in names if not hasattr(so, n)]
    assert not unexported, f"declared in pytfm.h but not exported by {SHARED_LIB}: {unexported}"
    assert not hasattr(so, "pytfm__fail"), "internal helpers must not be exported"


@pytest.mark.skipif(not os.path.exists(SOURCE_HEADER), reason="needs the source checkout")
def test_installed_headers_are_the_source_headers():
    for source in public_headers(SOURCE_INCLUDE):
        installed = os.path.join(INSTALLED_INCLUDE, os.path.basename(source))
        with open(source, "rb") as a, open(installed, "rb") as b:
            assert a.read() == b.read(), f"reinstall: the installed {installed} differs"


def test_version_is_one_number_everywhere():
    with open(os.path.join(INSTALLED_INCLUDE, "pytfm_core.h"), encoding="utf-8") as f:
        header_version = re.search(r'#define PYTFM_VERSION "([^"]+)"', f.read()).group(1)
    assert pytfm.__version__ == header_version == importlib.metadata.version("pytfm")
    assert pytfm.build_info()["version"] == header_version


def test_build_info():
    info = pytfm.build_info()
    assert set(info) == {"version", "compiler", "flags", "arch", "cpu_features", "isa", "bf16",
                         "cuda", "cuda_version"}
    assert info["compiler"] != "unknown" and "-std=c11" in info["flags"]
    log = os.path.join(PKG, "lib", "cuda_build.log")
    if info["cuda"]:  # built with nvcc: the ptxas report of every kernel is kept
        assert info["cuda_version"] >= 11000
        with open(log, encoding="utf-8") as f:
            assert "ptxas info" in f.read()
    else:
        assert info["cuda_version"] is None
    if info["arch"] == "x86_64":
        assert "sse2" in info["cpu_features"]
        # the kernels use the best instruction set the CPU reports
        best = "avx512" if "avx512f" in info["cpu_features"] else (
            "avx2" if {"avx2", "fma"} <= set(info["cpu_features"]) else "portable")
        assert info["isa"] == best
        # the BF16 products: AVX512-BF16 where the CPU has it (with AMX too), else the FP32 ISA
        assert info["bf16"] == ("avx512_bf16" if "avx512_bf16" in info["cpu_features"] else best)
    out = subprocess.run([sys.executable, "-m", "pytfm"], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and '"compiler"' in out.stdout


def test_cuda_entry_points_answer_with_or_without_cuda_and_a_gpu():
    count = ffi.new("int32_t *")
    assert lib.pytfm_cuda_device_count(count) == lib.PYTFM_STATUS_OK and count[0] >= 0
    status = lib.pytfm_softmax_forward_cuda(ffi.NULL, ffi.NULL, 0, 1, ffi.NULL)
    message = ffi.string(lib.pytfm_last_error()).decode()
    if not pytfm.build_info()["cuda"]:
        assert status == lib.PYTFM_STATUS_NOT_SUPPORTED and "built without CUDA" in message
        return
    assert status == lib.PYTFM_STATUS_OK  # zero rows: nothing to launch, even without a GPU
    status = lib.pytfm_softmax_forward_cuda(ffi.NULL, ffi.NULL, 1, 0, ffi.NULL)
    assert status == lib.PYTFM_STATUS_INVALID_ARGUMENT  # arguments are checked on the host
    if count[0] == 0:  # a CUDA build on a machine without a GPU or driver: a status, no crash
        assert lib.pytfm_cuda_stream_synchronize(ffi.NULL) == lib.PYTFM_STATUS_CUDA_ERROR
        assert "pytfm_cuda_stream_synchronize: " in ffi.string(lib.pytfm_last_error()).decode()


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "setup.py")), reason="needs the checkout")
def test_pytfm_cuda_1_without_nvcc_is_a_clear_build_error(tmp_path, path_without):
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CUDACXX")}
    env.update(PATH=path_without("nvcc"), PYTFM_CUDA="1")
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-temp",
                        str(tmp_path / "t"), "--build-lib", str(tmp_path / "l")], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    assert r.returncode != 0
    # CMake's configure says it (wrapping its lines), and setup.py names the step that failed
    stderr = " ".join(r.stderr.split())
    assert ("PYTFM_CUDA=ON asks for the CUDA kernels, but nvcc was found neither on PATH nor in "
            "$CUDA_HOME/bin or $CUDA_PATH/bin") in stderr, r.stderr[-3000:]
    assert "the CMake configure of libpytfm failed" in stderr


def cuda_entry_points(include):
    """{name: [parameter type, ...]} of every pytfm_*_cuda and pytfm_cuda_* function declared
    in the headers (read here independently of cmake/cuda_stubs.cmake, to check it)."""
    text = header_text(include)
    decls = re.findall(r"pytfm_status\s+(pytfm_cuda_\w+|pytfm_\w+_cuda)\s*\(([^)]*)\)", text)
    return {name: [p.strip() for p in params.split(",")] for name, params in decls}


def zero_argument(param):
    """A ctypes zero (or NULL) of a C parameter's type: its argtype and value."""
    if "*" in param:
        return ctypes.c_void_p, None
    kind = param.split()[-2] if len(param.split()) > 1 else param
    return {"int64_t": (ctypes.c_int64, 0), "int32_t": (ctypes.c_int32, 0),
            "float": (ctypes.c_float, 0.0), "double": (ctypes.c_double, 0.0)}[kind]


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "setup.py")), reason="needs the checkout")
def test_a_cpu_only_build_has_every_cuda_entry_point_and_each_says_not_supported(tmp_path):
    # a copy of what the build reads, built in place with PYTFM_CUDA=0: the checkout's own build
    # (with CUDA where nvcc is found) stays as it is
    for f in ("setup.py", "pyproject.toml", "README.md", "CMakeLists.txt"):
        shutil.copy2(os.path.join(ROOT, f), tmp_path)
    shutil.copytree(os.path.join(ROOT, "csrc"), tmp_path / "csrc")
    shutil.copytree(os.path.join(ROOT, "cmake"), tmp_path / "cmake")  # the stub generator
    shutil.copytree(os.path.join(ROOT, "pytfm"), tmp_path / "pytfm", ignore=shutil.ignore_patterns(
        "lib", "include", "*.so", "_pytfm_cffi.c", "__pycache__"))
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                       cwd=tmp_path, env=dict(os.environ, PYTFM_CUDA="0"), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    so = ctypes.CDLL(str(tmp_path / "pytfm" / "lib" / SHARED_LIB))
    so.pytfm_last_error.restype = ctypes.c_char_p
    entry_points = cuda_entry_points(SOURCE_INCLUDE)
    assert len(entry_points) >= 18 and "pytfm_cuda_stream_synchronize" in entry_points
    for name, params in entry_points.items():
        fn = getattr(so, name)  # AttributeError: the symbol is missing
        args = [zero_argument(p) for p in params if p != "void"]
        fn.restype, fn.argtypes = ctypes.c_int, [t for t, _ in args]
        if name == "pytfm_cuda_device_count":  # no CUDA, no device: 0, and not an error
            count = ctypes.c_int32(-1)
            assert fn(ctypes.byref(count)) == lib.PYTFM_STATUS_OK and count.value == 0
            continue
        assert fn(*[v for _, v in args]) == lib.PYTFM_STATUS_NOT_SUPPORTED, name
        assert so.pytfm_last_error().decode() == (
            f"{name}: pytfm was built without CUDA (nvcc not found, or PYTFM_CUDA=0)")
    # generated in the build folder, not in the source tree
    assert not [f for f in os.listdir(tmp_path / "csrc") if f not in os.listdir(
        os.path.join(ROOT, "csrc"))]


def pytfm_flags(*flags):
    out = subprocess.run([sys.executable, "-m", "pytfm", *flags], capture_output=True, text=True,
                         cwd="/", check=True)
    return out.stdout.split()


@pytest.mark.parametrize("link", ["--libs", "--static-libs"])
def test_c_example_builds_and_matches_the_reference(tmp_path, link):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build pytfm itself"
    exe = tmp_path / "layernorm"
    src = os.path.join(ROOT, "examples", "layernorm.c")
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", src,
                    *pytfm_flags("--cflags", link), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == f"pytfm {pytfm.__version__}"
    rows = [[float(v) for v in re.findall(r"-?\d+\.\d+", line)] for line in out.splitlines()[1:]]
    got = np.array([r[2:] for r in rows])  # each row: mean, rstd, then y
    x = np.array([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 2.5]])
    y, mean, rstd = ref.layernorm_forward(x, [1.0, 1.0, 2.0, 0.5], [0.0, 0.1, 0.0, -0.1])
    np.testing.assert_allclose(got, y, atol=2e-6)
    np.testing.assert_allclose([r[:2] for r in rows], np.c_[mean, rstd], atol=2e-6)


def test_thread_count_setting_changes_speed_not_results():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 70, 3, 16), dtype=np.float32) for _ in range(3))
    shapes = ((300, 200), (90, 200), (300, 90))
    x, w, dy = (rng.standard_normal(s, dtype=np.float32) for s in shapes)
    openmp = "-fopenmp" in pytfm.build_info()["flags"]
    cores = len(os.sched_getaffinity(0))
    runs = []
    try:
        for n in (1, 2, 3):
            pytfm.set_num_threads(n)
            assert pytfm.get_num_threads() == (n if openmp else 1)
            o, lse = pytfm.ops.attention_forward(q, k, v)
            runs.append([o, lse, pytfm.ops.linear_forward(x, w),
                         *pytfm.ops.linear_backward(dy, x, w),
                         *pytfm.ops.attention_backward(o, q, k, v, o, lse)])
        for other in runs[1:]:
            for a, b in zip(runs[0], other):
                np.testing.assert_array_equal(a, b)
        with pytest.raises(ValueError, match="threads must be >= 0"):
            pytfm.set_num_threads(-1)
        with pytest.raises(TypeError, match="threads must be an int"):
            pytfm.set_num_threads(2.0)
        pytfm.set_num_threads(4 * cores)  # the most a setting is allowed (4 per core)
        assert pytfm.get_num_threads() == (4 * cores if openmp else 1)
    finally:
        pytfm.set_num_threads(0)
    # the default again: at most the cores (fewer while neighbours keep some busy, so not
    # necessarily the count read before)
    assert 1 <= pytfm.get_num_threads() <= cores


def test_pytfm_num_threads_environment_variable():
    code = "import pytfm; print(pytfm.get_num_threads())"
    env = dict(os.environ, PYTFM_NUM_THREADS="3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd="/", check=True).stdout.strip()
    assert out == ("3" if "-fopenmp" in pytfm.build_info()["flags"] else "1")
    env["PYTFM_NUM_THREADS"] = "many"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd="/")
    assert r.returncode != 0 and "PYTFM_NUM_THREADS='many'" in r.stderr
