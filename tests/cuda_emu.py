"""Build and load the CUDA kernels of cuda/ compiled for the CPU emulator (cuda/emu).

The same .cu files nvcc compiles for the GPU are compiled here by the host C++ compiler against
cuda/emu/emu.h into one shared library, libpytfm_emu.so, with csrc/core (errors, settings) and the
emulator's self-test kernels (tests/cuda/emu_selftest.cu). It exports the pytfm_*_cuda
functions of pytfm.h; "device" pointers are host pointers, so NumPy arrays are passed as-is.

build_full() makes, from the same objects and every C source of the library, what a CUDA build
is, its kernels emulated: libpytfm_emufull.so, the C model on PYTFM_DEVICE_CUDA included
(csrc/model/model_cuda.c, compiled as in a CUDA build and left out of a CPU-only one).
"""

import importlib.util
import os
import shutil
import subprocess

import cffi
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = os.path.join(ROOT, "cuda")
INCLUDES = [f"-I{ROOT}/csrc/include", f"-I{ROOT}/csrc", f"-I{CUDA}"]
SELFTEST = os.path.join(ROOT, "tests", "cuda", "emu_selftest.cu")
SELFTEST_CDEF = """
void pytfm_emu_set_order(int reverse);
pytfm_status emu_shuffles(int *out, int n, int src, int delta, int lane_mask, int width);
pytfm_status emu_reverse(float *out, const float *in, int n, int dynamic, int with_barrier);
pytfm_status emu_early_exit(float *out, int n, int stop);
pytfm_status emu_shuffle_exit(float *out);
pytfm_status emu_mixed_shuffle(int *out);
pytfm_status emu_block_sum(float *out, const float *in, int blocks, int threads,
                           int shared_bytes);
pytfm_status emu_vector_copy(float *out, const float *in, int n, int offset);
pytfm_status emu_big_shared(float *out, int bytes, int limit);
pytfm_status emu_malloc_async(float *out, const float *in, int n);
pytfm_status emu_cp_async(float *out, const float *in, int n, int groups, int pending,
                          int with_barrier, int size, int src_bytes, int leave_open, int global);
pytfm_status emu_scale(float *x, int n, float by);
pytfm_status emu_mma(float *d, const float *a, const float *b, const float *c, int bf16,
                     int missing);
pytfm_status emu_round_tc(int *tf32, int *bf16, const float *x, int n);
pytfm_status emu_cp_async_war(float *out, const float *in, int with_barrier);
pytfm_status emu_ldmatrix(int *out, const int *in, const int *rows, int num, int trans,
                          int missing);
"""

# the emulator's counters and graphs (cuda/emu/emu.cpp), in both libraries
EMU_CDEF = """
void pytfm_emu_counters(int64_t *out);
int pytfm_emu_capture_begin(void);
int64_t pytfm_emu_capture_length(void);
int64_t pytfm_emu_capture_end(void);
int pytfm_emu_graph_launch(int64_t graph, int64_t begin, int64_t end);
const char *pytfm_emu_error(void);
void pytfm_emu_graph_free(int64_t graph);
void pytfm_emu_set_cp_async(int eager);
void pytfm_emu_ldmatrix_counts(int64_t *out);
void pytfm_emu_set_switch(int ucontext);
int pytfm_emu_switch_kind(void);
"""
# the order of pytfm_emu_counters (emu.h)
COUNTERS = ("malloc", "free", "malloc_async", "free_async", "memcpy", "sync", "launches",
            "captured")


def read_cdef():
    """The checkout's public declarations, read by pytfm/_build_ffi.py's own read_cdef (from the
    checkout: the installed package may be another build)."""
    spec = importlib.util.spec_from_file_location(
        "pytfm_build_ffi", os.path.join(ROOT, "pytfm", "_build_ffi.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_cdef()


def compilers():
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    return cc, cxx


def _has_fma():
    """Whether this CPU has the FMA instructions (x86-64 Linux's /proc/cpuinfo says; elsewhere
    no: fmaf stays libm's call)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "fma" in line.split(":", 1)[1].split()
                       for line in f)
    except OSError:
        return False


def _flags(root, kernels=False):
    """The compiler flags; kernels: those of cuda/*.cu and the emulator, which run the
    emulated GPU and so most of the time of the tests that use it: -O2, and -mfma where the
    CPU has it, so that the kernels' fmaf (CUDA's FFMA) is one instruction instead of a call.
    Neither changes a result: -ffp-contract=off keeps every a·b + c two roundings (g++ would
    contract them into FMAs under -mfma otherwise, even in ISO C++), and fmaf is rounded once
    either way."""
    includes = [f"-I{root}/csrc/include", f"-I{root}/csrc", f"-I{os.path.join(root, 'cuda')}"]
    opt = ["-O2", "-ffp-contract=off", *(["-mfma"] if _has_fma() else [])] if kernels \
        else ["-O1"]
    return [*opt, "-g", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
            "-DPYTFM_BUILDING", *includes]


def _compile(commands):
    """Run independent compile commands in parallel (helpers.compile_all); raise on a failure."""
    from helpers import compile_all

    for r in compile_all(commands):
        if r.returncode:
            raise RuntimeError(f"{' '.join(r.args)}\n{r.stderr[-4000:]}")


def _cuda_objects(out_dir, root):
    """The objects of cuda/*.cu and cuda/emu/emu.cpp in out_dir (compiled there if missing)."""
    _, cxx = compilers()
    cuda = os.path.join(root, "cuda")
    sources = sorted(os.path.join(cuda, f) for f in os.listdir(cuda) if f.endswith(".cu"))
    objects, missing = [], []
    for src in [*sources, os.path.join(cuda, "emu", "emu.cpp")]:
        obj = os.path.join(out_dir, os.path.basename(src) + ".o")
        if not os.path.exists(obj):
            missing.append([cxx, "-std=c++17", *_flags(root, kernels=True), "-x", "c++", "-c",
                            src, "-o", obj])
        objects.append(obj)
    _compile(missing)
    return objects


CORE = ("status", "environment", "isa", "free_cores")  # csrc/core/<name>.c


def build(out_dir, root=ROOT):
    """Compile the emulator library into out_dir; return its path (raises on a failure)."""
    cc, cxx = compilers()
    selftest = os.path.join(out_dir, "emu_selftest.cu.o")
    # the errors (status.c) and the thread and ISA settings they read (with the environment)
    core = [os.path.join(out_dir, f"{name}.o") for name in CORE]
    objects = _cuda_objects(out_dir, root)
    _compile([[cxx, "-std=c++17", *_flags(root), "-x", "c++", "-c",
               os.path.join(root, "tests", "cuda", "emu_selftest.cu"), "-o", selftest]] +
             [[cc, "-std=c11", *_flags(root), "-c",
               os.path.join(root, "csrc", "core", f"{name}.c"), "-o", obj]
              for name, obj in zip(CORE, core)])
    lib = os.path.join(out_dir, "libpytfm_emu.so")
    run([cxx, "-shared", "-o", lib, *objects, selftest, *core, "-lm"])
    return lib


def full_sources(root=ROOT):
    """The C sources of a CUDA build: every csrc/**/*.c but the CPU-only build's CUDA stubs
    (csrc/core/cuda_stub.c), the C model on the GPU (csrc/model/model_cuda.c) included."""
    csrc = os.path.join(root, "csrc")
    found = sorted(os.path.join(d, f) for d, _, files in os.walk(csrc) for f in files
                   if f.endswith(".c"))
    return [f for f in found if os.path.basename(f) != "cuda_stub.c"]


def build_full(out_dir, root=ROOT):
    """libpytfm as a CUDA build makes it, its kernels compiled for the emulator, into out_dir
    (reusing the kernels' objects of build() there); return its path."""
    cc, cxx = compilers()
    objects = _cuda_objects(out_dir, root)
    commands = []
    for src in full_sources(root):
        obj = os.path.join(out_dir, "full_" + os.path.relpath(src, root).replace(os.sep, "_")
                           + ".o")
        commands.append([cc, "-std=c11", *_flags(root), "-DPYTFM_CUDA=1", "-c", src, "-o", obj])
        objects.append(obj)
    _compile(commands)
    lib = os.path.join(out_dir, "libpytfm_emufull.so")
    run([cxx, "-shared", "-o", lib, *objects, "-lm"])
    return lib


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr[-4000:]}")


class EmuError(RuntimeError):
    pass


_CTYPES = {np.dtype(np.float32): "float *", np.dtype(np.int64): "int64_t *",
           np.dtype(np.int32): "int *"}


class Emu:
    """The emulator library through cffi's ABI mode, with the cdef of pytfm.h (and of the
    self-test kernels unless full: build_full's library has none)."""

    def __init__(self, path, full=False):
        self.ffi = cffi.FFI()
        self.ffi.cdef(read_cdef() + EMU_CDEF + ("" if full else SELFTEST_CDEF))
        self.lib = self.ffi.dlopen(path)
        self.dir = os.path.dirname(path)

    def counters(self):
        """{name: count} of the emulator's counters (COUNTERS), since the library loaded."""
        out = self.ffi.new(f"int64_t[{len(COUNTERS)}]")
        self.lib.pytfm_emu_counters(out)
        return dict(zip(COUNTERS, out))

    def p(self, a):
        return self.ffi.NULL if a is None else self.ffi.cast(_CTYPES[a.dtype], a.ctypes.data)

    def error(self):
        return self.ffi.string(self.lib.pytfm_last_error()).decode()

    def call(self, name, *args, stream=True):
        """Call name(*args[, stream=NULL]) with arrays as pointers; raise EmuError on failure."""
        conv = [self.p(a) if isinstance(a, np.ndarray) or a is None else a for a in args]
        if stream:
            conv.append(self.ffi.NULL)
        status = getattr(self.lib, name)(*conv)
        if status != 0:
            raise EmuError(f"status {status}: {self.error()}")


# Guarded buffers: every array handed to a kernel sits in the middle of a larger one whose
# margins hold a marker (a NaN with a payload of its own for floats, -7 for indices). A kernel
# that reads past an edge reads NaN or a bad index, which spoils its result; one that writes
# past an edge changes a marker, which check() reports.
MARGIN = 41
_F32_MARK = np.array([0x7FE5A5A5], np.uint32).view(np.float32)[0]
_F64_MARK = np.array([0x7FFA5A5A5A5A5A5A], np.uint64).view(np.float64)[0]


def _marker(dtype):
    """(the marker of a buffer of dtype, the dtype its bits are compared in)"""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return _F32_MARK, np.uint32
    if dtype == np.float64:
        return _F64_MARK, np.uint64
    return dtype.type(-7), dtype


def _intact(side, dtype):
    mark, bits = _marker(dtype)
    return (side.view(bits) == np.array([mark], dtype).view(bits)[0]).all()


class Guarded:
    def __init__(self):
        self.buffers = []

    def __call__(self, a, dtype=np.float32):
        a = np.asarray(a, dtype)
        big = np.full(a.size + 2 * MARGIN, _marker(a.dtype)[0], a.dtype)
        big[MARGIN:MARGIN + a.size] = a.ravel()
        self.buffers.append(big)
        return big[MARGIN:MARGIN + a.size].reshape(a.shape)

    def empty(self, shape, dtype=np.float32):
        """An output whose contents are a NaN (-1 for indices) until the kernel writes them."""
        floating = np.issubdtype(np.dtype(dtype), np.floating)
        return self(np.full(shape, np.nan if floating else -1, dtype), dtype)

    def check(self):
        for big in self.buffers:
            for side in (big[:MARGIN], big[-MARGIN:]):
                assert _intact(side, big.dtype), "a kernel wrote outside its buffer"


class Aligned(Guarded):
    """Guarded buffers whose float32 data start `offset` floats past a 16-byte boundary (the
    buffer's default, or per call: g(a, offset=1)): 0 takes the kernels' float4 paths, 1–3
    their scalar ones (Guarded's own buffers sit 4 bytes past a boundary). Other dtypes (ids,
    positions) as Guarded. Every float outside the data, margins and the slack used to align,
    must keep its marker."""

    def __init__(self, offset=0):
        super().__init__()
        self.offset, self.spans = offset, []

    def __call__(self, a, dtype=np.float32, offset=None):
        if np.dtype(dtype) != np.float32:
            return super().__call__(a, dtype)
        offset = self.offset if offset is None else offset
        a = np.asarray(a, np.float32)
        big = np.full(a.size + 2 * MARGIN + 8, _F32_MARK, np.float32)
        start = MARGIN + (-(big.ctypes.data // 4 + MARGIN)) % 4 + offset
        big[start:start + a.size] = a.ravel()
        self.spans.append((big, start, start + a.size))
        view = big[start:start + a.size].reshape(a.shape)
        assert not a.size or (view.ctypes.data % 16 == 0) == (offset % 4 == 0)
        return view

    def empty(self, shape, dtype=np.float32, offset=None):
        """An output whose contents are a NaN (-1 for indices) until the kernel writes them."""
        if np.dtype(dtype) != np.float32:
            return super().empty(shape, dtype)
        return self(np.full(shape, np.nan, np.float32), offset=offset)

    def check(self):
        super().check()
        for big, start, end in self.spans:
            assert _intact(big[:start], big.dtype) and _intact(big[end:], big.dtype), \
                "a kernel wrote outside its buffer"


def close(name, got, want_ref, want_c, atol, rtol=1e-5, rtol_c=None):
    """A CUDA result against the float64 reference and against the C kernel's, at one
    tolerance (twice it against C, which rounds too; rtol_c, when given, against C)."""
    from helpers import assert_close

    assert_close(f"cuda-emu.{name}", got, want_ref, atol=atol, rtol=rtol)
    assert_close(f"cuda-emu.{name}.vs-c", got, want_c, atol=2 * np.asarray(atol),
                 rtol=2 * rtol if rtol_c is None else rtol_c)


def check_layernorm(x, w, b, dy, dw0, db0, got):
    """LayerNorm's forward and backward from a CUDA kernel, got = (y, mean, rstd, dx, dw, db)
    with dw, db accumulated into dw0, db0, against the reference and the C kernels, at the
    CUDA kernels' bounds of tests/ops_registry.py."""
    from ops_registry import LAYERNORM_BACKWARD, LAYERNORM_FORWARD, fresh

    y, mean, rstd, dx, dw, db = got
    for op, a, outputs in (
            (LAYERNORM_FORWARD, dict(x=x, w=w, b=b, eps=1e-5), (y, mean, rstd)),
            (LAYERNORM_BACKWARD, dict(x=x, w=w, dy=dy, mean=mean, rstd=rstd, dw0=dw0, db0=db0),
             (dx, dw, db))):
        want = op.check.want(fresh(a))
        c = op.check.run(fresh(a))
        for name, g, r, cc, t in zip(op.check.outputs, outputs, want, c,
                                     op.check.emu_tol(a, want)):
            close(f"{op.name}.{name}", g, r, cc, atol=t.atol, rtol=t.rtol)


def guard_cupy(cp, g):
    """Make the stand-in cupy module cp (tests/fake_cupy.py) put every array it makes, copies
    and outputs alike, in g's guarded buffers: pytfm.ops on such arrays hands the CUDA kernels
    nothing but guarded memory. Each is an allocation of its own to the stand-in's stream
    checks."""
    import fake_cupy

    def put(a, dtype=None):
        got = g(a, np.asarray(a).dtype if dtype is None else dtype).view(fake_cupy.ndarray)
        return fake_cupy.made(got, "asarray (a copy from the host)")  # for the stream checks

    cp.asarray = lambda a, dtype=None: a if isinstance(a, fake_cupy.ndarray) else put(a, dtype)
    cp.empty = lambda shape, dtype=np.float64: fake_cupy.made(
        g.empty(shape, dtype).view(fake_cupy.ndarray))
    cp.zeros = lambda shape, dtype=np.float64: put(np.zeros(shape, dtype))
    cp.empty_like = lambda a: cp.empty(a.shape, a.dtype)
    cp.zeros_like = lambda a: cp.zeros(a.shape, a.dtype)
    return cp


def run_on_device(cp, op, a):
    """op's Check run on copies of the inputs a made by the (stand-in) cupy module cp, so that
    pytfm.ops calls op's CUDA twin; -> its outputs, as it returns them."""
    device = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in a.items()}
    return op.check.run(device)
