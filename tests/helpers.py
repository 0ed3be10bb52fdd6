"""Shared test helpers: the one comparison function, hypothesis strategies, array makers,
finite differences, snippets run in a fresh interpreter."""

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import strategies as st


@dataclass
class _Stats:
    count: int = 0
    max_rel: float = 0.0
    max_ratio: float = 0.0


RECORD = defaultdict(_Stats)

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)  # the checkout
CSRC = os.path.join(ROOT, "csrc")


INCLUDE = os.path.join(CSRC, "include")


def public_headers(include=INCLUDE):
    """The paths of the public headers in `include` (a checkout's csrc/include, or an installed
    include folder): pytfm.h first, then the parts it includes, in its order."""
    umbrella = os.path.join(include, "pytfm.h")
    with open(umbrella, encoding="utf-8") as f:
        parts = re.findall(r'^#include "(pytfm_\w+\.h)"', f.read(), re.M)
    return [umbrella] + [os.path.join(include, p) for p in parts]


def header_text(include=INCLUDE):
    """The public API's declarations: the text of every public header, comments removed (they
    name functions too)."""
    text = ""
    for path in public_headers(include):
        with open(path, encoding="utf-8") as f:
            text += f.read() + "\n"
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def library_sources():
    """Every C source of a CPU-only libpytfm (csrc/**/*.c, the CUDA stubs' hand-written part
    included, the C model on the GPU, csrc/model/model_cuda.c, left out as CMake leaves it), for
    the tests that build the library themselves (under sanitizers, libFuzzer)."""
    return sorted(os.path.join(d, f) for d, _, files in os.walk(CSRC) for f in files
                  if f.endswith(".c") and f != "model_cuda.c")


def compile_all(commands):
    """Run independent compiler commands, as many at once as there are cores (make -j);
    -> their CompletedProcesses, in order."""
    def one(cmd):
        return subprocess.run([str(c) for c in cmd], capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(one, commands))


_OBJECTS = {}  # key of a build -> its object files


def _objects_folder():
    if "folder" not in _OBJECTS:
        _OBJECTS["folder"] = tempfile.mkdtemp(prefix="pytfm-objects-")
        atexit.register(shutil.rmtree, _OBJECTS["folder"], True)
    return _OBJECTS["folder"]


def library_objects(cc, flags):
    """library_sources() compiled by cc with flags (in parallel): their object files, built
    once a run for each compiler, set of flags and content of csrc/ (a test that changes a
    source, or builds with other flags, gets a build of its own). Raises on a compile error."""
    key = hashlib.sha256(repr((cc, list(flags))).encode())
    for d, _, files in sorted(os.walk(CSRC)):
        for f in sorted(files):
            with open(os.path.join(d, f), "rb") as src:
                key.update(f"{d}/{f}".encode() + b"\0" + src.read())
    key = key.hexdigest()[:16]
    if key not in _OBJECTS:
        out = os.path.join(_objects_folder(), key)
        os.makedirs(out)
        sources = library_sources()
        objects = [os.path.join(out, os.path.relpath(s, CSRC).replace(os.sep, "_") + ".o")
                   for s in sources]
        runs = compile_all([cc, *flags, f"-I{INCLUDE}", f"-I{CSRC}", "-c", s, "-o", o]
                           for s, o in zip(sources, objects, strict=True))
        failed = [r for r in runs if r.returncode]
        if failed:
            raise RuntimeError(f"{' '.join(failed[0].args)}\n{failed[0].stderr[-4000:]}")
        _OBJECTS[key] = objects
    return _OBJECTS[key]


def build_with_library(cc, flags, program, exe, program_flags=()):
    """The C file program compiled with flags and program_flags and linked (with flags) with
    library_objects(cc, flags) into exe, as `cc flags program <the library's sources> -lm` would
    build it; -> the CompletedProcess of the compile and link (raises if the library fails)."""
    return subprocess.run([cc, *flags, *program_flags, f"-I{INCLUDE}", f"-I{CSRC}", program,
                           *library_objects(cc, flags), "-lm", "-o", exe],
                          capture_output=True, text=True)


def assert_close(name, got, ref, atol=0.0, rtol=1e-5):
    """Assert |got - ref| <= atol + rtol*|ref| elementwise (atol may be an array) and record it.

    `name` keys the summary printed at the end of the run, e.g. "layernorm.backward.dx".
    """
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, reference {ref.shape}"
    assert np.all(np.isfinite(got) | ~np.isfinite(ref)), f"{name}: non-finite values {got}"
    err = np.abs(got - ref)
    tol = atol + rtol * np.abs(ref)
    stats = RECORD[name]
    stats.count += 1
    if err.size:
        # normwise relative error, for arrays whose reference stands well above the noise floor
        scale = float(np.abs(ref).max())
        if scale > 1e3 * float(np.max(atol)):
            stats.max_rel = max(stats.max_rel, float(err.max()) / scale)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(err == 0, 0.0, err / tol)
        stats.max_ratio = max(stats.max_ratio, float(ratio.max()))
    bad = err > tol
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - tol, -np.inf)), err.shape)
        tol_i = np.broadcast_to(tol, err.shape)[i]
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {err.size} elements out of tolerance; worst at {i}: "
            f"got {got[i]!r}, reference {ref[i]!r}, |err| {err[i]:.3g} > tol {tol_i:.3g}"
        )


# Sizes that break kernels: 1, small odd numbers, primes, powers of two and one past them.
awkward = st.one_of(
    st.sampled_from([1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 61, 64, 67]),
    st.integers(1, 67),
)
small = st.sampled_from([1, 2, 3, 4, 5, 7])
seeds = st.integers(0, 2**32 - 1)
scales = st.sampled_from([1e-3, 0.1, 1.0, 3.0, 30.0])


EPS32 = float(np.finfo(np.float32).eps)
FLT_MIN = float(np.finfo(np.float32).tiny)


def f32(rng, shape, scale=1.0, offset=0.0):
    """Normal float32 values of `shape`, times scale, plus offset."""
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


def z(*shape, dtype=np.float32):
    """Zeros of `shape` (float32 unless told), for the arguments of a call meant to fail."""
    return np.zeros(shape, dtype)


def i64(*values):
    """An int64 array of `values` (ids, targets, positions)."""
    return np.array(values, dtype=np.int64)


def amax(a):
    """max |a| as a float, 0 for an empty array."""
    return float(np.abs(a).max()) if np.size(a) else 0.0


def bits(a):
    """The bit patterns of a float32 array, for comparing results bit for bit."""
    return np.ascontiguousarray(a).view(np.uint32)


def last_error():
    """pytfm_last_error() of this thread, as text."""
    from pytfm._core import ffi, lib

    return ffi.string(lib.pytfm_last_error()).decode()


def numerical_grad(f, x, eps=1e-6):
    """Central differences of the scalar f() with respect to every element of x (in place)."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        hi = f()
        x[i] = old - eps
        lo = f()
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


@contextlib.contextmanager
def max_isa(name):
    """Run the body with pytfm's kernels capped at instruction set `name` (see
    pytfm.set_max_isa); skip, naming what is missing, when this CPU cannot run that version."""
    import pytfm

    pytfm.set_max_isa(name)
    try:
        if pytfm.get_isa() != name:
            pytest.skip(f"this CPU cannot run the {name} kernels (best: {pytfm.get_isa()})")
        yield
    finally:
        pytfm.set_max_isa("auto")


BF16_PATHS = ("avx512_bf16", "avx512", "avx2", "plain")  # the BF16 products' paths, best first
BF16_FALLBACKS = BF16_PATHS[1:]  # those without BF16 instructions


@contextlib.contextmanager
def bf16_path(name):
    """Run the body with the BF16 products on path `name` (one of BF16_PATHS: the
    instruction-set cap that selects it, pytfm.get_bf16_isa()); skip, naming what is missing,
    where this CPU cannot run it."""
    import pytfm

    pytfm.set_max_isa(name)
    try:
        if pytfm.get_bf16_isa() != name:
            pytest.skip(f"this CPU cannot run the {name} BF16 path "
                        f"(best: {pytfm.get_bf16_isa()})")
        yield
    finally:
        pytfm.set_max_isa("auto")


def has_isa(name):
    """Whether this CPU runs pytfm's kernels of instruction set `name`."""
    import pytfm

    pytfm.set_max_isa(name)
    try:
        return pytfm.get_isa() == name
    finally:
        pytfm.set_max_isa("auto")


def python_path(*first):
    """A PYTHONPATH for a subprocess: the folders `first`, then this process's PYTHONPATH, which
    is extended, never replaced (it may hold what pytfm imports: cffi installed with pip
    --target, as on the GPU check's machine)."""
    return os.pathsep.join([*map(str, first), *filter(None, [os.environ.get("PYTHONPATH")])])


def subprocess_env(*first, **extra):
    """This process's environment for a subprocess, its PYTHONPATH extended by `first`
    (python_path) and `extra` variables set."""
    return dict(os.environ, PYTHONPATH=python_path(*first), **{k: str(v) for k, v in
                                                                extra.items()})


def run_train_tiny(*args, cwd, timeout=300):
    """examples/train_tiny.py with args in a fresh interpreter, from cwd, its environment this
    one's with the checkout first on PYTHONPATH (subprocess_env): as the GPU model tests run it
    on a GPU, and tests/cuda/test_gpu_conditions.py in the GPU check machine's conditions.
    -> the CompletedProcess (text output)"""
    script = os.path.join(ROOT, "examples", "train_tiny.py")
    return subprocess.run([sys.executable, script, *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=subprocess_env(ROOT), timeout=timeout)


def run_python(code, threads=None, **env):
    """Run the snippet `code` in a fresh interpreter that imports the pytfm under test and sees
    none of this environment (no PYTFM_NUM_THREADS, no hypothesis profile) but its PYTHONPATH,
    after the pytfm's folder: only `env`, and PYTFM_NUM_THREADS=`threads` when given (exactly
    that many threads; OMP_NUM_THREADS would be lowered on a busy machine). Returns the
    CompletedProcess (text output)."""
    import pytfm

    root = os.path.dirname(os.path.dirname(pytfm.__file__))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": python_path(root),
           **{k: str(v) for k, v in env.items()}}
    if threads is not None:
        env["PYTFM_NUM_THREADS"] = str(threads)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd="/")


_DIGEST = """
import hashlib as _hashlib, numpy as _np, pytfm as _pytfm
print(_pytfm.get_num_threads(), _hashlib.sha256(b"".join(_np.asarray(a).tobytes() for a in out))
      .hexdigest())
"""


def assert_same_bits_at_any_thread_count(code, threads=(1, 2, 3)):
    """Run `code`, a snippet that leaves its results in a list of arrays `out`, at each thread
    count (a process each, PYTFM_NUM_THREADS set to it: its teams are that many threads, or
    fewer while another process keeps a core busy; 3 on a 2-core machine is 3) and assert that `out` holds the same
    bytes every time."""
    digests = {}
    for t in threads:
        r = run_python(textwrap.dedent(code) + _DIGEST, threads=t)
        assert r.returncode == 0, f"at {t} threads the snippet failed:\n{r.stderr[-3000:]}"
        ran, digests[t] = r.stdout.split()[-2:]
        assert int(ran) == t, f"asked for {t} threads, the kernels used {ran}"
    assert len(set(digests.values())) == 1, f"digests per thread count: {digests}"


def cupy_on_a_gpu():
    """cupy, for the tests that need a real GPU (tests/test_cuda_gpu*.py); skips the calling
    module where CuPy, a CUDA build of pytfm, or a GPU is missing."""
    import pytfm

    cp = pytest.importorskip("cupy", reason="CuPy is not installed (pip install cupy-cuda13x)")
    if not pytfm.build_info()["cuda"]:
        pytest.skip("pytfm was built without CUDA (nvcc not found)", allow_module_level=True)
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as e:  # no driver or no device
        pytest.skip(f"no CUDA GPU here ({e})", allow_module_level=True)
    return cp


def library_flags():
    """The compiler flags of the pytfm these tests import: pkg-config on its pytfm.pc (the
    README's way), else python -m pytfm's (the same flags, where pkg-config is missing)."""
    import pytfm

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(pytfm.__file__)))

    def run(*args):
        return subprocess.run(args, check=True, capture_output=True, text=True, cwd="/",
                              env=env).stdout
    if shutil.which("pkg-config"):
        env["PKG_CONFIG_PATH"] = run(sys.executable, "-m", "pytfm", "--pkgconfig-dir").strip()
        return run("pkg-config", "--cflags", "--libs", "pytfm").split()
    return run(sys.executable, "-m", "pytfm", "--cflags", "--libs").split()


def build_generate_example(directory):
    """examples/generate.c built as the README says (pkg-config's flags), warnings as errors,
    into directory -> the executable's path."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build pytfm itself"
    exe = os.path.join(str(directory), "generate")
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                    os.path.join(ROOT, "examples", "generate.c"), *library_flags(), "-o", exe],
                   check=True)
    return exe


# The peak-memory tests of opening a bfloat16 folder (tests/c_api/test_c_llama_bf16.py, in C;
# tests/model/test_keep_bf16.py, in Python): a ~93M-parameter Llama-family model, a 186 MB
# bfloat16 file (372 MB in float32), opened in a process of its own whose peak resident memory
# (VmHWM) is compared with the file's size
BIG_BF16 = dict(arch="llama", vocab=32000, d_model=1024, n_layer=4, n_head=16, n_kv_head=8,
                head_dim=64, d_ff=3072, max_seq=64, tie_embeddings=True)
PEAK_MARGIN = 48 << 20  # the process's own growth while opening: scratch, the handle, headers
HWM = """
def hwm():  # peak resident memory so far, in bytes
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
"""


def big_bf16_folder(path):
    """BIG_BF16's random model saved at path as a bfloat16 folder; -> the file's size."""
    from pytfm import llama
    from pytfm.nn import GPTConfig, param_shapes

    cfg, rng = GPTConfig(**BIG_BF16), np.random.default_rng(0)
    llama.save(str(path), cfg, {name: rng.standard_normal(shape, np.float32) * 0.02
                                for name, shape in param_shapes(cfg)}, dtype="bfloat16")
    return os.path.getsize(os.path.join(path, "model.safetensors"))


def peak_growth(code, *args):
    """Run code (which may call hwm(), HWM's) in a Python of its own with args, on one thread:
    the words it prints, as ints."""
    out = subprocess.run([sys.executable, "-c", HWM + code, *map(str, args)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    return [int(w) for w in out.stdout.split()]
