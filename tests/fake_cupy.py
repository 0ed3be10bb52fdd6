"""A stand-in for CuPy, and pytfm's library with its CUDA functions answered by the emulator:
pytfm's GPU path (pytfm.ops on CuPy arrays, and the model, optimizer, generation and
checkpoints above it) runs here without CuPy or a GPU.

The stand-in's arrays are NumPy arrays in disguise: an ndarray subclass named cupy.ndarray
whose .data.ptr is host memory, which the emulator library's kernels (tests/cuda_emu.py) read
and write as they would device memory. Its functions forward to NumPy and return such arrays;
reductions and indexing give 0-d arrays, not scalars, as CuPy does. It counts what CuPy would
copy back to the host (.get(), asnumpy(), float(), int(), bool(), .item(), .tolist()): reads().
strict=True also refuses what CuPy refuses, a NumPy array mixed into an operation on device
arrays or assigned into one (TypeError), so that a host array that slipped into device code
fails here as it would on a GPU.

    cp = fake_cupy.install(monkeypatch, emu)   # sys.modules["cupy"] and pytfm._core.lib
"""

import sys
import types

import numpy as np

import pytfm
import pytfm._pytfm_cffi

_STATE = types.SimpleNamespace(reads=0, strict=False)


def _read():
    _STATE.reads += 1


def _host_array(a):
    """A NumPy array that is not one of ours: what CuPy refuses to mix with device arrays."""
    return isinstance(a, np.ndarray) and not isinstance(a, ndarray)


def _refuse_host(values):
    if _STATE.strict:
        for a in values:
            if _host_array(a):
                raise TypeError(f"Unsupported type {type(a)} (a NumPy array in an operation on "
                                "cupy arrays: move it with cupy.asarray)")


def _plain(a):
    return a.view(np.ndarray) if isinstance(a, ndarray) else a


def _wrap(r):
    """A result as CuPy gives it: an array of ours, 0-d for a scalar."""
    if isinstance(r, ndarray):
        return r
    if isinstance(r, (np.ndarray, np.generic)):
        return np.asarray(r).view(ndarray)
    if isinstance(r, tuple):
        return tuple(_wrap(x) for x in r)
    return r


class ndarray(np.ndarray):  # noqa: N801 - stands in for cupy.ndarray
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)

    @property
    def device(self):
        return types.SimpleNamespace(id=0)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _refuse_host(inputs + (out or ()))
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
        result = getattr(ufunc, method)(*(_plain(a) for a in inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __getitem__(self, key):
        return _wrap(super().__getitem__(key))

    def __setitem__(self, key, value):
        _refuse_host([value])
        super().__setitem__(key, _plain(value))

    # what copies to the host on a GPU
    def get(self):
        _read()
        return np.array(self.view(np.ndarray))

    def __float__(self):
        _read()
        return float(self.view(np.ndarray))

    def __int__(self):
        _read()
        return int(self.view(np.ndarray))

    def __bool__(self):
        _read()
        return bool(self.view(np.ndarray))

    def item(self, *args):
        _read()
        return self.view(np.ndarray).item(*args)

    def tolist(self):
        _read()
        return self.view(np.ndarray).tolist()


ndarray.__module__ = "cupy"


def _asarray(a, dtype=None):
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return np.array(a, dtype=dtype, order="C").view(ndarray)  # a copy, as to a device


def _asnumpy(a):
    if isinstance(a, ndarray):
        return a.get()
    return np.asarray(a)


def _where(condition, x, y):
    _refuse_host([condition, x, y])
    return _wrap(np.where(_plain(condition), _plain(x), _plain(y)))


def _stack(arrays, axis=0):
    _refuse_host(arrays)
    return _wrap(np.stack([_plain(a) for a in arrays], axis))


def _concatenate(arrays, axis=0):
    _refuse_host(arrays)
    return _wrap(np.concatenate([_plain(a) for a in arrays], axis))


def new(strict=False):
    """A fresh stand-in module (its counters at zero); strict: refuse NumPy arrays mixed in."""
    _STATE.reads, _STATE.strict = 0, strict
    streams = []
    cp = types.ModuleType("cupy")
    cp.ndarray = ndarray
    cp.asarray = _asarray
    cp.asnumpy = _asnumpy
    cp.empty = lambda shape, dtype=np.float64: np.empty(shape, dtype).view(ndarray)
    cp.zeros = lambda shape, dtype=np.float64: np.zeros(shape, dtype).view(ndarray)
    cp.empty_like = lambda a: np.empty_like(_plain(a)).view(ndarray)
    cp.zeros_like = lambda a: np.zeros_like(_plain(a)).view(ndarray)
    cp.ones_like = lambda a: np.ones_like(_plain(a)).view(ndarray)
    cp.arange = lambda *args, dtype=None: np.arange(*args, dtype=dtype).view(ndarray)
    cp.sqrt = np.sqrt  # ufuncs: ndarray.__array_ufunc__ keeps the results ours
    cp.where, cp.stack, cp.concatenate = _where, _stack, _concatenate
    cp.may_share_memory = np.may_share_memory

    def current_stream():
        streams.append(0)
        return types.SimpleNamespace(ptr=0)

    cp.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0),
                                    get_current_stream=current_stream)
    cp.streams_asked = streams
    cp.reads = lambda: _STATE.reads

    def set_strict(on):
        _STATE.strict = on

    cp.set_strict = set_strict
    return cp


class EmulatedLib:
    """pytfm's lib, with every _cuda function (and pytfm_cuda_device_count, ..._synchronize)
    answered by the emulator library instead, and a build_info that says CUDA: what a CUDA
    build on a machine with one GPU answers. pytfm_last_error is the message of the library
    that ran last, so that pytfm._core.check reads the failing one's. Assign an attribute to
    answer a function otherwise (a test that wants no device). .cpu: pytfm's own library."""

    def __init__(self, emu):
        self.emu = emu
        self.cpu = pytfm._pytfm_cffi.lib  # the compiled one, whatever pytfm._core.lib is now
        self.last = "emu"  # the library whose pytfm_last_error tells the last failure

    def pytfm_get_build_info(self, info):
        status = self.cpu.pytfm_get_build_info(info)
        info.cuda = 1
        return status

    def pytfm_last_error(self):
        return (self.emu.lib if self.last == "emu" else self.cpu).pytfm_last_error()

    def __getattr__(self, name):
        if not (name.endswith("_cuda") or name.startswith("pytfm_cuda_")):
            fn = getattr(self.cpu, name)
            if not callable(fn):  # a constant
                return fn

            def cpu(*args):
                self.last = "cpu"
                return fn(*args)

            return cpu
        core, emu = pytfm._core.ffi, self.emu.ffi
        fn = getattr(self.emu.lib, name)  # a kernel the emulator lacks: AttributeError

        def call(*args):
            conv = []
            for a in args:
                if isinstance(a, core.CData):  # a pointer made by pytfm's own ffi
                    a = emu.cast(core.getctype(core.typeof(a)), int(core.cast("uintptr_t", a)))
                conv.append(a)
            self.last = "emu"
            return fn(*conv)

        return call


def install(monkeypatch, emu, strict=False):
    """The stand-in as sys.modules["cupy"] and EmulatedLib as pytfm._core.lib, the library
    every kernel call and every device check goes through, for one test. -> the stand-in."""
    fake = new(strict)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(pytfm._core, "lib", EmulatedLib(emu))
    return fake
