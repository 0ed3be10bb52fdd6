"""A stand-in for CuPy, and pytfm's library with its CUDA functions answered by the emulator:
pytfm's GPU path (pytfm.ops on CuPy arrays, and the model, optimizer, generation and
checkpoints above it) runs here without CuPy or a GPU.

The stand-in's arrays are NumPy arrays in disguise: an ndarray subclass named cupy.ndarray
whose .data.ptr is host memory, which the emulator library's kernels (tests/cuda_emu.py) read
and write as they would device memory. Its functions forward to NumPy and return such arrays;
reductions and indexing give 0-d arrays, not scalars, as CuPy does. It counts what CuPy would
copy back to the host (.get(), asnumpy(), float(), int(), bool(), .item(), .tolist()): reads();
the arrays it makes (a factory, an operation without out=, astype, copy): allocations(); the
operations into existing arrays (a ufunc with out=, fill, copyto, an assignment), each a kernel
on a GPU: operations(); the synchronisations asked for (Device().synchronize(),
Stream.synchronize()): syncs(); and the current device and stream asked for (Device(),
get_current_stream()): lookups().
strict=True also refuses what CuPy refuses, a NumPy array mixed into an operation on device
arrays or assigned into one (TypeError), so that a host array that slipped into device code
fails here as it would on a GPU.

Streams (cupy.cuda.Stream) are handles whose `with` makes them current, as in CuPy; they order
nothing (the emulator runs each kernel at once). A capture (Stream.begin_capture ..
end_capture) records rather than runs: the emulator records each kernel launched (its
arguments as captured), and the stand-in each operation on its arrays (a ufunc with out=, fill,
copyto, an assignment), in one order; the Graph it returns runs them all again at launch(). An
array made, or a value read back, during a capture is an error, as it would corrupt or break
a real one.

    cp = fake_cupy.install(monkeypatch, emu)   # sys.modules["cupy"] and pytfm._core.lib
"""

import itertools
import sys
import types

import numpy as np

import pytfm
import pytfm._pytfm_cffi

_STATE = types.SimpleNamespace(reads=0, strict=False, allocations=0, syncs=0, lookups=0,
                               operations=0, capture=None, emu=None)


class CaptureError(RuntimeError):
    """What a real capture could not hold: an allocation or a read of the device."""


def _read():
    if _STATE.capture is not None:
        raise CaptureError("a value read back from the device during a graph capture")
    _STATE.reads += 1


def _allocated():
    if _STATE.capture is not None:
        raise CaptureError("an array allocated during a graph capture (its memory would not be "
                           "the graph's)")
    _STATE.allocations += 1


def _deferred(run):
    """Run the operation on device arrays now, or record it in the open capture."""
    _STATE.operations += 1
    if _STATE.capture is None:
        return run()
    _STATE.capture.append((_STATE.emu.lib.pytfm_emu_capture_length(), run))
    return None


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
        plain = tuple(_plain(a) for a in inputs)
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
            _deferred(lambda: getattr(ufunc, method)(*plain, **kwargs))
            return out[0] if len(out) == 1 else out
        _allocated()
        return _wrap(getattr(ufunc, method)(*plain, **kwargs))

    def fill(self, value):
        _deferred(lambda: self.view(np.ndarray).fill(value))

    def astype(self, dtype, *args, **kwargs):
        _allocated()
        return np.ndarray.astype(self, dtype, *args, **kwargs)

    def copy(self, *args, **kwargs):
        _allocated()
        return np.ndarray.copy(self, *args, **kwargs)

    def set(self, arr, stream=None):
        """A copy from host memory into this array (CuPy's ndarray.set), at once."""
        arr = np.asarray(arr)
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"set: {arr.shape} {arr.dtype} into {self.shape} {self.dtype}")
        if _STATE.capture is not None:
            raise CaptureError("a copy from the host during a graph capture")
        self.view(np.ndarray)[...] = arr

    def __getitem__(self, key):
        got = super().__getitem__(key)
        if isinstance(got, np.generic):  # one element: a 0-d view, as CuPy gives, not a copy
            got = super().__getitem__((key if isinstance(key, tuple) else (key,)) + (Ellipsis,))
        return _wrap(got)

    def __setitem__(self, key, value):
        _refuse_host([value])
        plain = self.view(np.ndarray)
        _deferred(lambda: plain.__setitem__(key, _plain(value)))

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
    _allocated()
    return _aligned(np.array(a, dtype=dtype, order="C")).view(ndarray)  # a copy, as to a device


def _asnumpy(a):
    if isinstance(a, ndarray):
        return a.get()
    return np.asarray(a)


def _where(condition, x, y):
    _refuse_host([condition, x, y])
    _allocated()
    return _wrap(np.where(_plain(condition), _plain(x), _plain(y)))


def _stack(arrays, axis=0):
    _refuse_host(arrays)
    _allocated()
    return _wrap(np.stack([_plain(a) for a in arrays], axis))


def _concatenate(arrays, axis=0):
    _refuse_host(arrays)
    _allocated()
    return _wrap(np.concatenate([_plain(a) for a in arrays], axis))


def _copyto(dst, src, casting="same_kind", where=True):
    _refuse_host([dst, src, where])
    plain_dst, plain_src, plain_where = _plain(dst), _plain(src), _plain(where)
    _deferred(lambda: np.copyto(plain_dst, plain_src, casting=casting, where=plain_where))


def _aligned(a):
    """a copied to memory 256-byte aligned, as CuPy's allocations are."""
    raw = np.empty(a.nbytes + 256, np.uint8)
    start = -raw.ctypes.data % 256
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _made(make):
    """A factory of arrays: make(*args) as one of ours, 256-byte aligned, counted."""
    def factory(*args, **kwargs):
        _allocated()
        return _aligned(make(*args, **kwargs)).view(ndarray)
    return factory


class Graph:
    """A captured step: the emulator's launches (its graph id) and the stand-in's operations,
    each at the count of launches recorded before it."""

    def __init__(self, emu, graph, ops):
        self.emu, self.graph, self.ops = emu, graph, ops

    def launch(self, stream=None):
        done = 0
        for at, run in self.ops:
            self._launches(done, at)
            run()
            done = at
        self._launches(done, -1)

    def _launches(self, begin, end):
        if self.emu.lib.pytfm_emu_graph_launch(self.graph, begin, end) != 0:
            message = self.emu.ffi.string(self.emu.lib.pytfm_emu_error()).decode()
            raise RuntimeError(f"a replayed kernel failed: {message}")

    def __del__(self):
        try:
            self.emu.lib.pytfm_emu_graph_free(self.graph)
        except Exception:  # the library may be gone at exit
            pass


_POINTERS = itertools.count(0x1000, 0x100)  # stream handles: distinct, never dereferenced


def _module_stream_type(cp, emu):
    streams = []  # the stack of current streams (the null stream below them)

    class Stream:
        def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
            self.ptr = 0 if null else next(_POINTERS)

        def __enter__(self):
            streams.append(self)
            return self

        def __exit__(self, *exc):
            streams.pop()

        def synchronize(self):
            _read_free_sync()

        def begin_capture(self, mode=None):
            if _STATE.capture is not None or emu is None or \
                    emu.lib.pytfm_emu_capture_begin() != 0:
                raise RuntimeError("a capture is open already (or no emulator to record)")
            _STATE.capture = []

        def end_capture(self):
            ops, _STATE.capture = _STATE.capture, None
            graph = emu.lib.pytfm_emu_capture_end()
            if ops is None or graph < 0:
                raise RuntimeError("end_capture without begin_capture")
            return Graph(emu, graph, ops)

    Stream.__module__ = "cupy.cuda.stream"
    null = Stream(null=True)
    return Stream, lambda: streams[-1] if streams else null


def _read_free_sync():
    if _STATE.capture is not None:
        raise CaptureError("a synchronisation during a graph capture")
    _STATE.syncs += 1


def new(strict=False, emu=None):
    """A fresh stand-in module (its counters at zero); strict: refuse NumPy arrays mixed in;
    emu: the emulator library (tests/cuda_emu.Emu) whose launches a capture records."""
    _STATE.reads, _STATE.strict, _STATE.allocations, _STATE.syncs = 0, strict, 0, 0
    _STATE.lookups, _STATE.operations, _STATE.capture, _STATE.emu = 0, 0, None, emu
    asked = []
    cp = types.ModuleType("cupy")
    cp.ndarray = ndarray
    cp.asarray = _asarray
    cp.asnumpy = _asnumpy
    cp.empty = _made(lambda shape, dtype=np.float64: np.empty(shape, dtype))
    cp.zeros = _made(lambda shape, dtype=np.float64: np.zeros(shape, dtype))
    cp.empty_like = _made(lambda a: np.empty_like(_plain(a)))
    cp.zeros_like = _made(lambda a: np.zeros_like(_plain(a)))
    cp.ones_like = _made(lambda a: np.ones_like(_plain(a)))
    cp.arange = _made(lambda *args, dtype=None: np.arange(*args, dtype=dtype))
    # ufuncs: ndarray.__array_ufunc__ keeps the results ours (and defers those with out=)
    cp.sqrt, cp.add, cp.divide, cp.multiply, cp.greater = (np.sqrt, np.add, np.divide,
                                                          np.multiply, np.greater)
    cp.where, cp.stack, cp.concatenate, cp.copyto = _where, _stack, _concatenate, _copyto
    cp.may_share_memory = np.may_share_memory
    Stream, current = _module_stream_type(cp, emu)

    def current_stream():
        asked.append(0)
        _STATE.lookups += 1
        return current()

    class Device:
        def __init__(self, device=None):
            _STATE.lookups += 1
            self.id = 0

        def synchronize(self):
            _read_free_sync()

    pools = {}
    runtime = types.SimpleNamespace(
        getDevice=lambda: 0,
        deviceGetDefaultMemPool=lambda device: 0x7000 + device,
        memPoolSetAttribute=lambda pool, attr, value: pools.__setitem__((pool, attr), value),
        memPoolGetAttribute=lambda pool, attr: pools.get((pool, attr), 0))
    cp.cuda = types.SimpleNamespace(Device=Device, get_current_stream=current_stream,
                                    Stream=Stream, Graph=Graph, runtime=runtime)
    cp.pool_attributes = pools
    cp.streams_asked = asked
    cp.reads = lambda: _STATE.reads
    cp.allocations = lambda: _STATE.allocations
    cp.syncs = lambda: _STATE.syncs
    cp.lookups = lambda: _STATE.lookups
    cp.operations = lambda: _STATE.operations

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
    fake = new(strict, emu)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(pytfm._core, "lib", EmulatedLib(emu))
    return fake
