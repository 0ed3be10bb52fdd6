"""The loaded library and the one place a C status becomes a Python exception."""

import os

try:
    from ._pytfm_cffi import ffi, lib
except ImportError as e:  # pragma: no cover - only for an unbuilt source tree
    here = os.path.dirname(os.path.abspath(__file__))
    raise ImportError(
        f"pytfm's compiled module is missing from {here}: build it with `pip install .` "
        "(which also places the build in a source checkout)"
    ) from e


class PytfmError(RuntimeError):
    """A failure inside libpytfm that is not a bad argument (CUDA error, unsupported op)."""


def check(status, error=None, prefix=None):
    """Raise for a failed call, the one map from a pytfm_status to an exception: MemoryError
    when memory ran out; ValueError for bad arguments (INVALID_ARGUMENT, OUT_OF_RANGE);
    PytfmError otherwise. prefix (a path, say) goes before pytfm_last_error()'s message.

    error: the exception class of a bad file (CheckpointError, TokenizerError), for the calls
    that read one. Those leave errno set where a system call failed (else 0): that failure is
    an OSError with its errno, and any other but running out of memory is error."""
    if status == lib.PYTFM_STATUS_OK:
        return
    error_number = ffi.errno  # the call's own: read before any other C call
    message = ffi.string(lib.pytfm_last_error()).decode("utf-8", "replace")
    message = message if prefix is None else f"{prefix}: {message}"
    if status == lib.PYTFM_STATUS_OUT_OF_MEMORY:
        raise MemoryError(message)
    if error is not None:
        raise OSError(error_number, message) if error_number else error(message)
    if status in (lib.PYTFM_STATUS_INVALID_ARGUMENT, lib.PYTFM_STATUS_OUT_OF_RANGE):
        raise ValueError(message)
    kind = ffi.string(lib.pytfm_status_string(status)).decode()
    raise PytfmError(f"{message} ({kind})")


_CPU_FEATURES = {
    "sse2": "PYTFM_CPU_SSE2",
    "avx": "PYTFM_CPU_AVX",
    "avx2": "PYTFM_CPU_AVX2",
    "fma": "PYTFM_CPU_FMA",
    "avx512f": "PYTFM_CPU_AVX512F",
    "neon": "PYTFM_CPU_NEON",
    "avx512_bf16": "PYTFM_CPU_AVX512_BF16",
    "amx_bf16": "PYTFM_CPU_AMX_BF16",
}


def set_num_threads(threads):
    """Threads for pytfm's kernels from now on. 0, the default: OpenMP's (OMP_NUM_THREADS or
    all available cores), but no more than the cores other processes leave free (on Linux,
    sampled every 100 ms), so that a busy neighbour does not slow the kernels down. A count
    set here (up to the process's cores) is the most threads a parallel region takes: its team
    is lowered to the cores the last two samples saw free; a count above the cores is taken as
    it is. get_num_threads() reports the count set. Results are the same at any thread count; only speed changes.
    Whatever sets it (this, PYTFM_NUM_THREADS, OMP_NUM_THREADS), the kernels use at most 4
    threads per available core: a larger value is accepted and clamped, and get_num_threads()
    reports the clamped count. Safe to call while another thread runs a kernel (it takes
    effect from the next call). The environment variable PYTFM_NUM_THREADS sets it when pytfm
    is imported. In a process forked (os.fork, multiprocessing's "fork" start method) from one
    whose kernels had used more than one thread, the kernels run on one thread whatever this
    says: OpenMP's threads do not survive a fork (a "spawn" or "forkserver" process has a
    count of its own)."""
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int, got {type(threads).__name__}")
    if threads < 0:
        raise ValueError(f"threads must be >= 0 (0: the default), got {threads}")
    if threads >= 2**31:
        raise ValueError(f"threads must be below 2**31 (the library takes an int32_t; it uses "
                         f"at most 4 per core), got {threads}")
    check(lib.pytfm_set_num_threads(threads))


def get_num_threads():
    """The number of threads the next kernel will use, after the clamp to 4 per core (1 in a
    build without OpenMP, and in a forked child as set_num_threads says)."""
    return lib.pytfm_get_num_threads()


ISAS = ("auto", "plain", "portable", "avx2", "avx512", "avx512_bf16")  # pytfm_isa, in order


def set_max_isa(name):
    """Cap the instruction set the kernels use: "auto" (no cap: the best this CPU has),
    "plain" (the plain reference loops), "portable" (vectorised for the baseline target),
    "avx2", "avx512" or "avx512_bf16" (which only the BF16 products use: "avx512" keeps them
    off the AVX512-BF16 instructions). Results of different versions agree to float32
    rounding, not bit for bit. The environment variable PYTFM_MAX_ISA sets it when pytfm is
    imported."""
    if name not in ISAS:
        raise ValueError(f"name must be one of {', '.join(ISAS)}; got {name!r}")
    check(lib.pytfm_set_max_isa(ISAS.index(name)))


def get_isa():
    """The instruction set the FP32 kernels use now, e.g. "avx512" (see set_max_isa)."""
    return ISAS[lib.pytfm_get_isa()]


def get_bf16_isa():
    """The instruction set the BF16 products use now: "avx512_bf16" (vdpbf16ps), else that of
    the FP32 kernels, which then multiply BF16-rounded inputs ("plain" and "portable": the
    plain loop). See bf16_path()."""
    return ISAS[lib.pytfm_get_bf16_isa()]


_BF16_PATHS = {
    "avx512_bf16": "AVX512-BF16: vdpbf16ps micro-kernels on panels of BF16 pairs",
    "avx512": "no AVX512-BF16: BF16-rounded inputs through the AVX-512 FP32 kernels",
    "avx2": "no AVX512-BF16: BF16-rounded inputs through the AVX2 FP32 kernels",
    "portable": "BF16-rounded inputs through the plain loops (one row: the portable row kernel)",
    "plain": "BF16-rounded inputs through the plain loops",
}


def bf16_path():
    """Which path the BF16 products take now, in words, e.g. "AVX512-BF16: vdpbf16ps
    micro-kernels on panels of BF16 pairs". Every path multiplies the same BF16 values and
    sums in float32; they differ in the order of the sums. AMX is detected
    (build_info()["cpu_features"]) but not used: such a CPU runs the AVX512-BF16 path."""
    name = get_bf16_isa()
    capped = name != "avx512_bf16" and "avx512_bf16" in _cpu_features()
    return _BF16_PATHS[name] + (" (capped: the CPU has AVX512-BF16)" if capped else "")


PRECISIONS = ("fp32", "bf16", "tf32")  # a product's pytfm_precision, in order
# a model's: also "int8" (PYTFM_PRECISION_INT8, 3), its matrices held in int8 blocks for
# inference (pytfm.nn.GPT.set_precision), which no single product takes as an argument
MODEL_PRECISIONS = PRECISIONS + ("int8",)


def precision_code(precision, name="precision", choices=PRECISIONS):
    """The pytfm_precision of a precision's name: "fp32" (float32 products, the default),
    "bf16" (products of BF16-rounded inputs, summed in float32) or "tf32" (of TF32-rounded
    inputs, on the GPU's tensor cores only); with choices=MODEL_PRECISIONS (a model's), also
    "int8" (int8 weights, for inference on the CPU)."""
    if not isinstance(precision, str):
        raise TypeError(f"{name} must be a str, one of {', '.join(choices)}; got "
                        f"{type(precision).__name__}")
    if precision not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {precision!r}")
    return MODEL_PRECISIONS.index(precision)


def _settings_from_environment():
    """PYTFM_NUM_THREADS and PYTFM_MAX_ISA, read by the C library (its one reading, which C
    programs get too); a bad value raises ValueError naming the variable."""
    check(lib.pytfm_read_environment())


def version():
    """The version of the loaded libpytfm."""
    return ffi.string(lib.pytfm_version()).decode()


def _cpu_features(info=None):
    if info is None:
        info = ffi.new("pytfm_build_info *")
        check(lib.pytfm_get_build_info(info))
    return [n for n, c in _CPU_FEATURES.items() if info.cpu_features & getattr(lib, c)]


def build_info():
    """How libpytfm was built and what this CPU offers, as a dict: "isa" is the instruction set
    of the FP32 kernels, "bf16" that of the BF16 products (get_bf16_isa, bf16_path)."""
    info = ffi.new("pytfm_build_info *")
    check(lib.pytfm_get_build_info(info))
    return {
        "version": ffi.string(info.version).decode(),
        "compiler": ffi.string(info.compiler).decode(),
        "flags": ffi.string(info.flags).decode(),
        "arch": ffi.string(info.arch).decode(),
        "cpu_features": _cpu_features(info),
        "isa": get_isa(),
        "bf16": get_bf16_isa(),
        "cuda": bool(info.cuda),
        "cuda_version": info.cuda_version or None,
    }
