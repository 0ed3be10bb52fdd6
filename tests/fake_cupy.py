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

Streams (cupy.cuda.Stream, its null stream the legacy default one) order the work queued on
them, and events (cupy.cuda.Event; Event.record(stream), Stream.record(event),
Stream.wait_event(event), synchronize()) order work between them, as on a GPU. The stand-in
runs each operation at once, in the order the host queued it, which is one order a GPU could
run them in; what it adds is a hazard detector (_Order) that sees whether the GPU would have
had to: every operation is attributed to the stream it runs on, with the memory it reads and
writes, and a vector clock per stream (its count of operations, and what it has seen of the
others' through events, synchronisations and the host) tells whether an earlier access on
another stream is ordered before it. Two accesses to one allocation, at least one a write, on
two streams with nothing ordering them is a hazard: StreamHazard is raised at the second one
(and kept in hazards()), where a GPU would read or overwrite stale memory some of the time.
What orders an access a on stream A before b on stream B: A = B; an event recorded on A after
a that B waited on before b; the host having seen a complete (A's, an event's or the device's
synchronize(), or a read of the host such as .get(), which synchronises the current stream)
before it queued b; or the legacy null stream, which waits for the blocking streams' earlier
work and they for its (a Stream(non_blocking=True) does neither). The rules for the accesses:
  - the stand-in's operations: a ufunc reads its inputs and writes its outputs (its result: a
    new array), copyto reads src and where and writes dst, fill and an assignment write,
    astype, copy and the factories that fill (zeros, arange, asarray...) write the new array,
    all on the current stream; set(arr, stream) writes on that stream (the current one by
    default); empty writes nothing;
  - a read back to the host (.get(), asnumpy(), float(), int(), bool(), .item(), .tolist()) is
    a read on the current stream, after which the host has seen that stream's work (CuPy's
    .get() synchronises it);
  - a kernel of the emulator (a pytfm_*_cuda function called through EmulatedLib) runs on the
    stream of its last argument, and each pointer argument that falls in an array of the
    stand-in is read, and written too unless the header declares it const (the header's
    promise: a kernel writes no const input). Scratch from a workspace or cudaMallocAsync is
    the kernel's own and not seen.
Memory is tracked per allocation (an access to a view is one to all of its base's memory),
from the array's making until it is freed. set_hazards(False) turns the detector off.

A capture (Stream.begin_capture .. end_capture) records rather than runs: the emulator records
each kernel launched (its arguments as captured), and the stand-in each operation on its arrays
(a ufunc with out=, fill, copyto, an assignment), in one order, with the memory each touches;
the Graph it returns runs them all again at launch(stream), as work on that stream. An array
made, or a value read back, during a capture is an error, as it would corrupt or break a real
one.

    cp = fake_cupy.install(monkeypatch, emu)   # sys.modules["cupy"] and pytfm._core.lib
"""

import bisect
import itertools
import re
import sys
import types
import weakref

import numpy as np

import pytfm
import pytfm._pytfm_cffi


class StreamHazard(RuntimeError):
    """Two accesses to one allocation on two streams, at least one of them a write, with
    nothing ordering them (_Order): a GPU may run them in either order."""


class _Memory:
    """One allocation: its bytes [start, end), its last write (stream, that stream's count
    then, what wrote) and the reads since ({stream: (count, what read)})."""

    __slots__ = ("start", "end", "write", "reads", "__weakref__")

    def __init__(self, start, end):
        self.start, self.end, self.write, self.reads = start, end, None, {}


def _merge(into, clock):
    for k, n in clock.items():
        if into.get(k, 0) < n:
            into[k] = n


def _stream_name(key):
    return "the null stream" if key == 0 else f"stream {key:#x}"


class _Order:
    """The hazard detector: a vector clock per stream ({stream: how many of its operations it
    is ordered after}), the host's (what it has seen complete), and per allocation its last
    write and the reads since. An access on stream B of memory last accessed on A by A's n-th
    operation is ordered when A is B or B's clock holds A's n."""

    def __init__(self):
        self.on = True
        self.clocks = {0: {}}  # stream -> its vector clock
        self.blocking = {0: True}  # stream -> whether it syncs with the legacy null stream
        self.host = {}
        self.starts, self.memory = [], {}  # sorted starts, start -> _Memory
        self.hazards = []  # the messages of the hazards seen

    # -- streams, events, synchronisations ------------------------------------------------

    def stream(self, key, blocking):
        self.blocking.setdefault(key, blocking)
        self.clocks.setdefault(key, {})

    def _tick(self, key):
        """One more operation on stream key, after what it waits for: -> its clock."""
        clock = self.clocks.setdefault(key, {})
        _merge(clock, self.host)  # queued by the host after what the host saw complete
        if key == 0:  # the legacy null stream waits for the blocking streams' work so far
            for k, blocking in self.blocking.items():
                if k and blocking:
                    _merge(clock, self.clocks.get(k, {}))
        elif self.blocking.get(key, False):  # and a blocking stream for the null stream's
            _merge(clock, self.clocks[0])
        clock[key] = clock.get(key, 0) + 1
        return clock

    def snapshot(self, key):
        """What an event recorded on stream key now stands for."""
        return dict(self.clocks.setdefault(key, {}))

    def wait(self, key, snapshot):
        _merge(self.clocks.setdefault(key, {}), snapshot)

    def host_sync(self, snapshot):
        _merge(self.host, snapshot)

    def device_sync(self):
        for clock in self.clocks.values():
            _merge(self.host, clock)

    # -- memory ----------------------------------------------------------------------------

    def track(self, a):
        """The _Memory of the allocation array a lies in; an array not seen before (not made
        by the stand-in's factories: made()) as an allocation of its base's bytes. None for
        an empty one."""
        if not a.nbytes:
            return None
        mem = self.find(a.__array_interface__["data"][0])
        if mem is not None:
            return mem
        base = _base(a)
        return self.allocated(base.__array_interface__["data"][0], base.nbytes, base)

    def allocated(self, start, nbytes, owner):
        """A new allocation of [start, start + nbytes), forgotten when owner (the array that
        holds the memory) is freed. -> its _Memory"""
        mem = _Memory(start, start + nbytes)
        i = bisect.bisect_left(self.starts, start)
        while i < len(self.starts) and self.starts[i] < mem.end:  # memory reused: fresh
            del self.memory[self.starts.pop(i)]
        if i and self.memory[self.starts[i - 1]].end > start:
            del self.memory[self.starts.pop(i - 1)]
            i -= 1
        self.starts.insert(i, start)
        self.memory[start] = mem
        weakref.finalize(owner, self._forget, weakref.ref(mem))
        return mem

    def _forget(self, ref):
        mem = ref()
        if mem is not None and self.memory.get(mem.start) is mem:
            del self.memory[mem.start]
            self.starts.remove(mem.start)

    def find(self, address):
        """The _Memory holding address, None when no array of the stand-in holds it."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0:
            mem = self.memory[self.starts[i]]
            if address < mem.end:
                return mem
        return None

    # -- accesses ----------------------------------------------------------------------------

    def access(self, key, accesses):
        """One operation on stream key making accesses, (reads, writes, what) triples of
        _Memory lists: raise StreamHazard (and keep its message) for the first access that
        an earlier one on another stream is not ordered before."""
        if not self.on:
            return
        clock = self._tick(key)
        n = clock[key]

        def check(mem, verb, what, earlier, earlier_verb):
            k, count, by = earlier
            if k != key and clock.get(k, 0) < count:
                self._hazard(f"{what} on {_stream_name(key)} {verb} a {mem.end - mem.start}-"
                             f"byte allocation that {by} {earlier_verb} on {_stream_name(k)}, "
                             "and nothing orders the two (an event recorded there after it "
                             "that this stream waited on, or a synchronisation)")

        for reads, writes, what in accesses:
            for mem in reads:
                if mem.write is not None:
                    check(mem, "reads", what, mem.write, "wrote")
            for mem in writes:
                if mem.write is not None:
                    check(mem, "writes", what, mem.write, "wrote")
                for k, (count, by) in mem.reads.items():
                    check(mem, "writes", what, (k, count, by), "read")
            for mem in reads:
                mem.reads[key] = (n, what)
            for mem in writes:
                mem.write, mem.reads = (key, n, what), {}

    def _hazard(self, message):
        self.hazards.append(message)
        raise StreamHazard(message)


_STATE = types.SimpleNamespace(reads=0, strict=False, allocations=0, syncs=0, lookups=0,
                               operations=0, capture=None, emu=None, order=_Order(),
                               current=lambda: 0)


class CaptureError(RuntimeError):
    """What a real capture could not hold: an allocation or a read of the device."""


def _memories(arrays):
    """The _Memory of each array of ours among arrays (others: host values, scalars)."""
    order, out = _STATE.order, []
    for a in arrays:
        if isinstance(a, ndarray):
            mem = order.track(a)
            if mem is not None:
                out.append(mem)
    return out


def _access(reads=(), writes=(), what="", stream=None):
    """Arrays read and written by one operation on stream (a key; the current one by default),
    or, during a capture, by the graph's launch."""
    accesses = (_memories(reads), _memories(writes), what)
    if _STATE.capture is not None:
        _STATE.capture.accesses.append(accesses)
    else:
        _STATE.order.access(_STATE.current() if stream is None else stream, [accesses])


def _read(a):
    """A copy of a to the host: a read on the current stream, which it then synchronises."""
    if _STATE.capture is not None:
        raise CaptureError("a value read back from the device during a graph capture")
    _STATE.reads += 1
    key = _STATE.current()
    _STATE.order.access(key, [(_memories([a]), [], "a read back to the host")])
    _STATE.order.host_sync(_STATE.order.snapshot(key))


def _allocated():
    if _STATE.capture is not None:
        raise CaptureError("an array allocated during a graph capture (its memory would not be "
                           "the graph's)")
    _STATE.allocations += 1


def _deferred(run, reads=(), writes=(), what=""):
    """Run the operation on device arrays now, or record it in the open capture; either way
    as reading `reads` and writing `writes`."""
    _STATE.operations += 1
    _access(reads, writes, what)
    if _STATE.capture is None:
        return run()
    _STATE.capture.ops.append((_STATE.emu.lib.pytfm_emu_capture_length(), run))
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
        what = f"cupy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        reads = inputs + tuple(v for v in kwargs.values() if isinstance(v, ndarray))
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
            _deferred(lambda: getattr(ufunc, method)(*plain, **kwargs), reads, out, what)
            return out[0] if len(out) == 1 else out
        _allocated()
        got = _wrap(getattr(ufunc, method)(*plain, **kwargs))
        _access(reads, got if isinstance(got, tuple) else (got,), what)
        return got

    def fill(self, value):
        _deferred(lambda: self.view(np.ndarray).fill(value), (), (self,), "fill")

    def astype(self, dtype, *args, **kwargs):
        _allocated()
        got = np.ndarray.astype(self, dtype, *args, **kwargs)
        _access((self,), (got,), "astype")
        return got

    def copy(self, *args, **kwargs):
        _allocated()
        got = np.ndarray.copy(self, *args, **kwargs)
        _access((self,), (got,), "copy")
        return got

    def set(self, arr, stream=None):
        """A copy from host memory into this array (CuPy's ndarray.set) on stream (the current
        one by default), at once."""
        arr = np.asarray(arr)
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"set: {arr.shape} {arr.dtype} into {self.shape} {self.dtype}")
        if _STATE.capture is not None:
            raise CaptureError("a copy from the host during a graph capture")
        _access((), (self,), "set (a copy from the host)",
                None if stream is None else stream.ptr)
        self.view(np.ndarray)[...] = arr

    def __getitem__(self, key):
        got = super().__getitem__(key)
        if isinstance(got, np.generic):  # one element: a 0-d view, as CuPy gives, not a copy
            got = super().__getitem__((key if isinstance(key, tuple) else (key,)) + (Ellipsis,))
        got = _wrap(got)
        if isinstance(got, ndarray) and _base(got) is not _base(self):  # a gather: a kernel
            _access((self,), (got,), "an indexing copy")
        return got

    def __setitem__(self, key, value):
        _refuse_host([value])
        plain = self.view(np.ndarray)
        _deferred(lambda: plain.__setitem__(key, _plain(value)), (value,), (self,),
                  "an assignment")

    # what copies to the host on a GPU
    def get(self):
        _read(self)
        return np.array(self.view(np.ndarray))

    def __float__(self):
        _read(self)
        return float(self.view(np.ndarray))

    def __int__(self):
        _read(self)
        return int(self.view(np.ndarray))

    def __bool__(self):
        _read(self)
        return bool(self.view(np.ndarray))

    def item(self, *args):
        _read(self)
        return self.view(np.ndarray).item(*args)

    def tolist(self):
        _read(self)
        return self.view(np.ndarray).tolist()


ndarray.__module__ = "cupy"


def _base(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _asarray(a, dtype=None):
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    _allocated()
    got = _aligned(np.array(a, dtype=dtype, order="C")).view(ndarray)  # a copy, as to a device
    return made(got, "asarray (a copy from the host)")


def _asnumpy(a):
    if isinstance(a, ndarray):
        return a.get()
    return np.asarray(a)


def _where(condition, x, y):
    _refuse_host([condition, x, y])
    _allocated()
    got = _wrap(np.where(_plain(condition), _plain(x), _plain(y)))
    _access((condition, x, y), (got,), "where")
    return got


def _stack(arrays, axis=0):
    _refuse_host(arrays)
    _allocated()
    got = _wrap(np.stack([_plain(a) for a in arrays], axis))
    _access(arrays, (got,), "stack")
    return got


def _concatenate(arrays, axis=0):
    _refuse_host(arrays)
    _allocated()
    got = _wrap(np.concatenate([_plain(a) for a in arrays], axis))
    _access(arrays, (got,), "concatenate")
    return got


def _copyto(dst, src, casting="same_kind", where=True):
    _refuse_host([dst, src, where])
    plain_dst, plain_src, plain_where = _plain(dst), _plain(src), _plain(where)
    _deferred(lambda: np.copyto(plain_dst, plain_src, casting=casting, where=plain_where),
              (src, where), (dst,), "copyto")


def _aligned(a):
    """a copied to memory 256-byte aligned, as CuPy's allocations are."""
    raw = np.empty(a.nbytes + 256, np.uint8)
    start = -raw.ctypes.data % 256
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _made(make, what=None):
    """A factory of arrays: make(*args) as one of ours, 256-byte aligned, counted; what: the
    name of a factory that fills its array (a write on the current stream), None for one that
    leaves it as it was (empty)."""
    def factory(*args, **kwargs):
        _allocated()
        got = _aligned(make(*args, **kwargs)).view(ndarray)
        made(got, what)
        return got
    return factory


def made(a, what=None):
    """a (an array of ours, made by other means: tests/cuda_emu.guard_cupy) as a new allocation,
    written on the current stream by `what` (None: not written)."""
    if a.nbytes:
        _STATE.order.allocated(a.__array_interface__["data"][0], a.nbytes, _base(a))
    if what is not None:
        _access((), (a,), what)
    return a


class Graph:
    """A captured step: the emulator's launches (its graph id) and the stand-in's operations,
    each at the count of launches recorded before it, and the memory all of them touch."""

    def __init__(self, emu, graph, ops, accesses):
        self.emu, self.graph, self.ops, self.accesses = emu, graph, ops, accesses

    def launch(self, stream=None):
        """Run the graph as one piece of work on stream (the current one by default)."""
        _STATE.order.access(_STATE.current() if stream is None else stream.ptr, self.accesses)
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


_POINTERS = itertools.count(0x1000, 0x100)  # stream and event handles: never dereferenced


class Event:
    """cupy.cuda.Event: record(stream) marks the work queued on stream so far (the null
    stream's by default, as CuPy documents), which a stream's wait_event(event) orders its
    later work after, and synchronize() the host."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.ptr = next(_POINTERS)
        self.snapshot = {}  # nothing recorded yet: an event of no work

    def record(self, stream=None):
        if _STATE.capture is not None:
            raise CaptureError("an event recorded during a graph capture (not modelled here)")
        self.snapshot = _STATE.order.snapshot(0 if stream is None else stream.ptr)

    def synchronize(self):
        _read_free_sync()
        _STATE.order.host_sync(self.snapshot)

    @property
    def done(self):
        return True  # the stand-in's work is done when queued


Event.__module__ = "cupy.cuda.stream"


class _Capture:
    def __init__(self):
        self.ops, self.accesses = [], []  # (launches before it, run), (reads, writes, what)


def _module_stream_type(cp, emu):
    streams = []  # the stack of current streams (the null stream below them)

    class Stream:
        """cupy.cuda.Stream: a queue of work (_Order), current inside `with`; null=True the
        legacy default stream, with which a stream synchronises unless non_blocking."""

        def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
            self.ptr = 0 if null else next(_POINTERS)
            self.non_blocking = non_blocking
            _STATE.order.stream(self.ptr, not non_blocking)

        def __enter__(self):
            streams.append(self)
            return self

        def __exit__(self, *exc):
            streams.pop()

        def synchronize(self):
            _read_free_sync()
            _STATE.order.host_sync(_STATE.order.snapshot(self.ptr))

        def wait_event(self, event):
            """Order the work queued here from now on after the work event recorded."""
            _STATE.order.wait(self.ptr, event.snapshot)

        def record(self, event=None):
            """event (a new one by default) recorded on this stream: -> event"""
            event = Event() if event is None else event
            event.record(self)
            return event

        @property
        def done(self):
            return True

        def begin_capture(self, mode=None):
            if _STATE.capture is not None or emu is None or \
                    emu.lib.pytfm_emu_capture_begin() != 0:
                raise RuntimeError("a capture is open already (or no emulator to record)")
            _STATE.capture = _Capture()

        def end_capture(self):
            capture, _STATE.capture = _STATE.capture, None
            graph = emu.lib.pytfm_emu_capture_end()
            if capture is None or graph < 0:
                raise RuntimeError("end_capture without begin_capture")
            return Graph(emu, graph, capture.ops, capture.accesses)

    Stream.__module__ = "cupy.cuda.stream"
    Stream.null = Stream(null=True)
    return Stream, lambda: streams[-1] if streams else Stream.null


def _read_free_sync():
    if _STATE.capture is not None:
        raise CaptureError("a synchronisation during a graph capture")
    _STATE.syncs += 1


def new(strict=False, emu=None):
    """A fresh stand-in module (its counters at zero); strict: refuse NumPy arrays mixed in;
    emu: the emulator library (tests/cuda_emu.Emu) whose launches a capture records."""
    _STATE.reads, _STATE.strict, _STATE.allocations, _STATE.syncs = 0, strict, 0, 0
    _STATE.lookups, _STATE.operations, _STATE.capture, _STATE.emu = 0, 0, None, emu
    _STATE.order = _Order()
    asked = []
    cp = types.ModuleType("cupy")
    cp.ndarray = ndarray
    cp.asarray = _asarray
    cp.asnumpy = _asnumpy
    cp.empty = _made(lambda shape, dtype=np.float64: np.empty(shape, dtype))
    cp.zeros = _made(lambda shape, dtype=np.float64: np.zeros(shape, dtype), "zeros")
    cp.empty_like = _made(lambda a: np.empty_like(_plain(a)))
    cp.zeros_like = _made(lambda a: np.zeros_like(_plain(a)), "zeros_like")
    cp.ones_like = _made(lambda a: np.ones_like(_plain(a)), "ones_like")
    cp.arange = _made(lambda *args, dtype=None: np.arange(*args, dtype=dtype), "arange")
    # ufuncs: ndarray.__array_ufunc__ keeps the results ours (and defers those with out=)
    cp.sqrt, cp.add, cp.divide, cp.multiply, cp.greater = (np.sqrt, np.add, np.divide,
                                                          np.multiply, np.greater)
    cp.where, cp.stack, cp.concatenate, cp.copyto = _where, _stack, _concatenate, _copyto
    cp.may_share_memory = np.may_share_memory
    Stream, current = _module_stream_type(cp, emu)
    _STATE.current = lambda: current().ptr

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
            _STATE.order.device_sync()

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
    cp.hazards = lambda: list(_STATE.order.hazards)
    cp.StreamHazard = StreamHazard

    def set_strict(on):
        _STATE.strict = on

    def set_hazards(on):
        _STATE.order.on = on

    cp.set_strict, cp.set_hazards = set_strict, set_hazards
    cp.cuda.Event = Event
    return cp


def _pointer_params(cdef):
    """{function: [None for a value, True for a const pointer, False for another pointer, per
    parameter]} of the declarations in cdef (pytfm.h's)."""
    table = {}
    for m in re.finditer(r"(\w+)\s*\(([^;()]*)\)\s*;", cdef):
        table[m.group(1)] = [None if "*" not in p else p.split()[0] == "const"
                             for p in m.group(2).split(",")]
    return table


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
        import cuda_emu

        self.params = _pointer_params(cuda_emu.read_cdef())

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

        params = self.params.get(name, ())

        def call(*args):
            conv, addresses = [], []
            for a in args:
                if isinstance(a, core.CData):  # a pointer made by pytfm's own ffi
                    addresses.append(int(core.cast("uintptr_t", a)))
                    a = emu.cast(core.getctype(core.typeof(a)), addresses[-1])
                else:
                    addresses.append(None)
                conv.append(a)
            if name.endswith("_cuda"):
                self._launched(name, addresses, params)
            self.last = "emu"
            status = fn(*conv)
            if name == "pytfm_cuda_stream_synchronize" and status == 0:
                _STATE.order.host_sync(_STATE.order.snapshot(addresses[0] or 0))
            return status

        return call

    @staticmethod
    def _launched(name, addresses, params):
        """A twin's accesses, on the stream of its last argument: each pointer argument into
        an array of the stand-in read, and written too unless declared const."""
        order, reads, writes = _STATE.order, [], []
        for address, const in zip(addresses[:-1], params):
            mem = order.find(address) if const is not None and address else None
            if mem is not None:
                (reads if const else writes).append(mem)
        accesses = (reads + writes, writes, name)
        if _STATE.capture is not None:
            _STATE.capture.accesses.append(accesses)
        else:
            order.access(addresses[-1] or 0, [accesses])


def install(monkeypatch, emu, strict=False):
    """The stand-in as sys.modules["cupy"] and EmulatedLib as pytfm._core.lib, the library
    every kernel call and every device check goes through, for one test. -> the stand-in."""
    fake = new(strict, emu)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(pytfm._core, "lib", EmulatedLib(emu))
    return fake
