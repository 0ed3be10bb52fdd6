"""pytfm.device — where a model's arrays live: "cpu" (NumPy) or "cuda" (CuPy, on the current GPU).

    problem = pytfm.device.cuda_problem()   # None, or one sentence: why the GPU cannot be used
    xp = pytfm.device.array_module("cuda")  # cupy, or CudaUnavailable with that sentence

The GPU needs three things, checked in this order: CuPy, a pytfm built with CUDA (nvcc found
at install time), and a CUDA GPU with its driver. The checks ask the library through the
attribute pytfm._core.lib, read at each call, the one every kernel call goes through too, so
that a test may answer them all with another library. CuPy is imported only when a "cuda"
device is asked for. The first time a device is used, its stream-ordered memory pool (where
the kernels' scratch comes from when no workspace holds it) is told to keep what it has
(keep_pool_memory).
"""

import numpy as np

from . import _core
from ._arrays import is_cupy

DEVICES = ("cpu", "cuda")


class CudaUnavailable(RuntimeError):
    """The GPU was asked for but cannot be used; the message says why, in one sentence."""


def check(device, name="device"):
    """device, once it is one of DEVICES; else ValueError naming the argument `name`."""
    if not isinstance(device, str) or device not in DEVICES:
        raise ValueError(f"{name} must be 'cpu' or 'cuda', got {device!r}")
    return device


def cuda_problem():
    """None when the GPU can be used, else one sentence that says why not: CuPy missing, pytfm
    built without CUDA, or no CUDA GPU (or driver), the first that applies."""
    try:
        import cupy  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name not in ("cupy", None):
            return f"CuPy cannot be imported ({e}): reinstall it (pip install cupy-cuda13x)"
        return "CuPy is not installed (pip install cupy-cuda13x)"
    except ImportError as e:  # installed, but broken (a missing CUDA library, ...)
        return f"CuPy cannot be imported ({e}): reinstall it (pip install cupy-cuda13x)"
    lib, ffi = _core.lib, _core.ffi
    info = ffi.new("pytfm_build_info *")
    if lib.pytfm_get_build_info(info) != lib.PYTFM_STATUS_OK or not info.cuda:
        return ("pytfm was built without CUDA (nvcc was not found when it was installed): "
                "reinstall it with nvcc on PATH")
    count = ffi.new("int32_t *")
    if lib.pytfm_cuda_device_count(count) != lib.PYTFM_STATUS_OK:
        error = ffi.string(lib.pytfm_last_error()).decode("utf-8", "replace")
        return f"the CUDA runtime could not count the GPUs ({error})"
    if count[0] < 1:
        return "no CUDA GPU was found (no device, or no NVIDIA driver)"
    return None


def require_cuda():
    """Raise CudaUnavailable, saying why, unless the GPU can be used."""
    problem = cuda_problem()
    if problem is not None:
        raise CudaUnavailable(problem)


def array_module(device, name="device"):
    """The array module of device: numpy for "cpu", cupy for "cuda" (after require_cuda(), and
    keep_pool_memory() for the current GPU)."""
    if check(device, name) == "cpu":
        return np
    require_cuda()
    import cupy

    keep_pool_memory(cupy)
    return cupy


_RELEASE_THRESHOLD = 4  # cudaMemPoolAttrReleaseThreshold
_KEPT = {}  # device id -> None (done) or why it could not be done


def keep_pool_memory(cupy):
    """Set the release threshold of the current GPU's default stream-ordered pool (the memory of
    cudaMallocAsync) to its maximum, once per device: the pool then keeps the memory freed into
    it instead of handing it back to the driver at each synchronisation (a threshold of 0, the
    default), so that an allocation after the first finds it there. The memory stays the
    process's until it exits. -> None, or why the threshold could not be set (an old CuPy or
    driver: the pool then works as it is)."""
    device = cupy.cuda.runtime.getDevice()
    if device not in _KEPT:
        try:
            pool = cupy.cuda.runtime.deviceGetDefaultMemPool(device)
            cupy.cuda.runtime.memPoolSetAttribute(pool, _RELEASE_THRESHOLD, 2**64 - 1)
            _KEPT[device] = None
        except Exception as e:  # AttributeError, CUDARuntimeError: the pool as it is then
            _KEPT[device] = f"{type(e).__name__}: {e}"
    return _KEPT[device]


def device_of(a):
    """ "cuda" for a CuPy array, "cpu" for anything else."""
    return "cuda" if is_cupy(a) else "cpu"


def module_of(a):
    """The array module of the array a: cupy for a CuPy array, numpy otherwise."""
    if is_cupy(a):
        import cupy

        return cupy
    return np


def to_host(a):
    """a as a NumPy array: a CuPy array is copied to the host (the one place the device is
    read), anything else goes through numpy.asarray."""
    if is_cupy(a):
        import cupy

        return cupy.asnumpy(a)
    return np.asarray(a)


def to_device(a, device):
    """a (NumPy, CuPy, or what numpy.asarray takes) as an array on device: copied when it is
    elsewhere, as it is when it is there already."""
    if device == "cpu":
        return to_host(a)
    import cupy

    return cupy.asarray(a)


def available_memory():
    """The bytes of host memory this process may still take: Linux's MemAvailable (free memory
    and the caches the kernel can drop), less where a cgroup v2 limit (memory.max) is closer;
    None where unknown (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit, used = f.read().strip(), int(g.read())
        if limit != "max":
            available = min(available, max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return available
