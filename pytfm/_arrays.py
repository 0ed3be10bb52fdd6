"""What pytfm's modules share about arrays and arguments: which kind an array is (NumPy or
CuPy), the checks of scalar arguments, the check of index arrays, and Args, the checked
arguments of one kernel call and the call itself (the one path from Python to a C or CUDA
kernel). pytfm.ops is written with it; kvcache, nn, optim, generate and device use its parts.

Every call reaches the library through the attribute pytfm._core.lib, read at call time, and
raises through pytfm._core.check (which reads the same attribute), so that one assignment,
pytfm._core.lib = another library, answers every call and every device check (the tests give
the CUDA functions to the emulator that way: tests/fake_cupy.py). cupy is imported only when a
CuPy array arrives.

A GPU step (pytfm.train_step.TrainStep) runs its ops inside on_stream(): there Args asks CuPy
neither for the current device nor for the current stream (it was told both once), and takes its
outputs from a Plan, the arrays the step's first run made, handed out again in the same order:
a step of fixed shapes then allocates nothing.
"""

import contextlib
import math
import numbers
import operator
import sys
import threading

import numpy as np

from . import _core

F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)
F64 = np.dtype(np.float64)  # the double a reduction writes (sum_squares)
_CTYPES = {F32: "float[]", I64: "int64_t[]", F64: "double[]"}  # host buffers
_CPTRS = {F32: "float *", I64: "int64_t *", F64: "double *"}  # device pointers


# ---- array kinds ------------------------------------------------------------------------------


_NOT_CUPY = frozenset((np.ndarray, int, float, bool, type(None)))  # the common cases, at once


def is_cupy(a):
    """Whether a is a CuPy object (an array, mostly), told by its type's module: cupy itself is
    not imported."""
    t = type(a)
    return t not in _NOT_CUPY and t.__module__.split(".")[0] == "cupy"


def is_array(a):
    """Whether a is a NumPy or a CuPy array."""
    return type(a) is np.ndarray or isinstance(a, np.ndarray) or is_cupy(a)


# ---- scalar arguments -------------------------------------------------------------------------


_INT64 = (-(2**63), 2**63 - 1)  # what an int64_t argument holds
_FLOAT_MAX = {"float32": float(np.finfo(np.float32).max), "float64": sys.float_info.max}


def _shown(v):
    """A number for a message: an integer too long to read is given by its size."""
    if isinstance(v, numbers.Integral) and int(v).bit_length() > 64:
        return f"an integer of {int(v).bit_length()} bits"
    text = str(v)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def as_int(name, v):
    """v as a Python int that fits an int64_t. bool is not an integer here (True would pass as
    1 silently): TypeError, as for any non-integer; ValueError beyond int64."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got bool ({v})")
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(v).__name__}") from None
    if not _INT64[0] <= i <= _INT64[1]:
        raise ValueError(f"{name} must fit in int64, [-2**63, 2**63 - 1], got {_shown(i)}")
    return i


def as_float(name, v, kind="float32"):
    """v as a Python float for a C float (kind "float32") or double ("float64") argument: bool
    and non-numbers are a TypeError, a finite number beyond the kind's range a ValueError (it
    would reach C as inf or raise OverflowError). NaN and inf pass: the C checks say where
    they are allowed."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    try:
        f = float(v)
    except OverflowError:  # an int (or Fraction) beyond float64
        f = math.inf
    given_inf = isinstance(v, (float, np.floating)) and bool(np.isinf(v))
    if math.isnan(f) or given_inf:
        return f
    if not abs(f) <= _FLOAT_MAX[kind]:  # f is inf here for a number beyond float64
        raise ValueError(f"{name} must fit in {kind} (|{name}| <= {_FLOAT_MAX[kind]:.7g}), "
                         f"got {_shown(v)}")
    return f


def as_bool(name, v):
    """A bool (or numpy.bool_): None or 0 must not mean False silently."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {type(v).__name__}")
    return bool(v)


# ---- index arrays -----------------------------------------------------------------------------


def check_index_arrays(*specs):
    """Raise ValueError for the first id outside [0, limit) (ignore, when not None, is allowed
    too) in each (name, ids, limit, ignore) of specs, for NumPy or CuPy int arrays alike; on the
    device, one read for all of them together (what pytfm.nn does once per batch)."""
    bads = []
    for _, ids, limit, ignore in specs:
        bad = (ids < 0) | (ids >= limit)
        if ignore is not None:
            bad &= ids != ignore
        bads.append(bad)
    if not bads or not bool(sum(b.any() for b in bads)):  # (a 0-d sum on the device: one read)
        return
    for (name, ids, limit, _), bad in zip(specs, bads):
        if bool(bad.any()):
            i = int(bad.ravel().argmax())
            raise ValueError(f"{name}[{i}] = {int(ids.ravel()[i])} is outside [0, {limit})")


# ---- a GPU step's stream and arrays ------------------------------------------------------------


class PlanMismatch(RuntimeError):
    """A step asked its Plan for other arrays than its first run did."""


class Plan:
    """The arrays one step of fixed shapes uses, made by its first run (recording) and handed
    out again, in the same order, by every later run: outputs of the ops (Args.empty,
    Args.empty_like, fresh parameter gradients) and constants (arange). Arrays of one run are
    reused by the next, so what a run returns (a loss) must be copied out before the next one
    starts. A later run that asks for another shape or dtype, or for more or fewer arrays, is a
    PlanMismatch: a step must make the same calls on every run."""

    def __init__(self):
        self.arrays = []  # in the order the first run asked for them
        self.constants = {}
        self.recorded = False
        self.next = None  # while a later run goes: the index of the next array to hand out

    def start(self):
        """A run begins: a later one hands out the recorded arrays from the first; until a run
        has finished, each records anew (what a failed one made is dropped)."""
        if not self.recorded:
            self.arrays = []
        self.next = 0 if self.recorded else None

    def finish(self):
        """A run ends: the first one's arrays are the plan; a later one must have used them
        all."""
        if not self.recorded:
            self.recorded = True
        elif self.next != len(self.arrays):
            raise PlanMismatch(f"the step used {self.next} of the {len(self.arrays)} arrays its "
                               "first run made: a step must make the same calls on every run")
        self.next = None

    def take(self, xp, shape, dtype):
        """An array of shape and dtype: new (recording), or the recorded one at this place."""
        shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
        dtype = np.dtype(dtype)
        if self.next is None:
            a = xp.empty(shape, dtype)
            self.arrays.append(a)
            return a
        i = self.next
        have = self.arrays[i] if i < len(self.arrays) else None
        if have is None or have.shape != shape or have.dtype != dtype:
            made = "nothing" if have is None else f"{have.shape} {have.dtype}"
            raise PlanMismatch(f"the step asked for array {i} of shape {shape}, {dtype}, where "
                               f"its first run made {made}: a step must make the same calls, "
                               "on arrays of the same shapes, on every run")
        self.next = i + 1
        return have

    def constant(self, key, make):
        """make(), once for the plan: a constant array the step reads (RoPE's positions)."""
        if key not in self.constants:
            self.constants[key] = make()
        return self.constants[key]


class _Current(threading.local):
    stream = None  # (cupy, the stream's pointer as a cffi void *) inside on_stream
    plan = None


_CURRENT = _Current()


@contextlib.contextmanager
def on_stream(cupy, stream, plan=None):
    """Run the block on `stream` (a cupy.cuda.Stream of the current device, made current here):
    the ops' Args call their kernels on it without asking CuPy for the device or the stream,
    take every array to be on that device (the caller checked its inputs once), and take their
    outputs from plan when one is given."""
    saved = _CURRENT.stream, _CURRENT.plan
    _CURRENT.stream = (cupy, _core.ffi.cast("void *", stream.ptr))
    _CURRENT.plan = plan
    try:
        with stream:
            yield
    finally:
        _CURRENT.stream, _CURRENT.plan = saved


def arange(xp, start, stop):
    """xp.arange(start, stop) of int64: inside a plan, one array for the plan (a constant)."""
    plan = _CURRENT.plan if xp is not np else None
    if plan is None:
        return xp.arange(start, stop, dtype=I64)
    return plan.constant(("arange", start, stop), lambda: xp.arange(start, stop, dtype=I64))


# ---- the arguments of one kernel call, and the call ------------------------------------------


class Args:
    """The arguments of one call to the C function `kernel`, by name (an op's locals()).

    It picks the backend once, from every array among them: NumPy runs lib.<kernel>, CuPy runs
    lib.<kernel>_cuda on CuPy's current stream. Each check below names the argument it reads,
    and .call() makes the pointers, so an op writes each argument's name once, where it checks
    it.
    """

    def __init__(self, kernel, named):
        self.kernel, self.named = kernel, named
        arrays = [(n, a) for n, a in named.items() if is_array(a)]
        self.gpu = bool(arrays) and is_cupy(arrays[0][1])
        kind = {False: "NumPy", True: "CuPy"}
        for n, a in arrays[1:]:
            if is_cupy(a) != self.gpu:
                raise TypeError(
                    f"{arrays[0][0]} is a {kind[self.gpu]} array but {n} is a "
                    f"{kind[not self.gpu]} array: pass the arrays of one call on one device "
                    "(NumPy: the CPU kernels, CuPy: the CUDA ones)"
                )
        if not self.gpu:
            self.xp = np
            return
        if not hasattr(_core.lib, kernel + "_cuda"):
            raise TypeError(
                f"{arrays[0][0]} is a CuPy array, but this operation runs on NumPy arrays only "
                "(it has no CUDA kernel yet); pass a numpy.ndarray"
            )
        if _CURRENT.stream is not None:  # a GPU step: its device and stream are known
            self.xp = _CURRENT.stream[0]
            return
        import cupy

        self.xp = cupy
        current = cupy.cuda.Device().id
        for n, a in arrays:
            if isinstance(a, cupy.ndarray) and a.device.id != current:
                raise ValueError(
                    f"{n} is on GPU {a.device.id} but the current device is GPU {current}: "
                    f"call inside `with cupy.cuda.Device({a.device.id}):`"
                )

    # -- checks: each returns the checked value --

    def array(self, name, dtype=F32, ndim=None, min_ndim=1, last=None, shape=None, lead=None,
              because=None, writable=False, optional=False):
        """The argument `name`, once it is a C-contiguous array of the backend, of dtype, of
        rank ndim (or at least min_ndim), whose last axis (what `last` says it is) is not
        empty, of `shape`, or of leading axes `lead` and any last one (`because` says why),
        and writable when asked; None if optional."""
        a = self.named[name]
        if a is None and optional:
            return None
        if self.gpu and not (is_cupy(a) and type(a).__name__ == "ndarray"):
            raise TypeError(f"{name} must be a cupy.ndarray of {dtype}, got {type(a).__qualname__}")
        if not self.gpu and not isinstance(a, np.ndarray):
            kind = type(a).__name__ if type(a).__module__ == "builtins" else type(a).__qualname__
            kind = f"numpy.{kind} scalar" if isinstance(a, np.generic) else kind
            raise TypeError(f"{name} must be a numpy.ndarray of {dtype}, got {kind}")
        if a.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype}, got {a.dtype}")
        if ndim is not None and a.ndim != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
        if a.ndim < min_ndim:
            raise ValueError(
                f"{name} must have at least {min_ndim} dimension(s), got shape {a.shape}")
        if not a.flags.c_contiguous:
            raise ValueError(
                f"{name} must be C-contiguous (np.ascontiguousarray({name})), "
                f"got strides {a.strides} for shape {a.shape}"
            )
        if last is not None and a.shape[-1] < 1:
            axis = -1 if ndim is None else ndim - 1
            raise ValueError(f"{name}.shape[{axis}] ({last}) must be >= 1, got shape {a.shape}")
        if shape is not None and a.shape != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)} ({because}), got {a.shape}")
        if lead is not None and a.shape[:-1] != tuple(lead):
            want = tuple(lead) + (a.shape[-1],)
            raise ValueError(f"{name} must have shape {want} ({because}), got {a.shape}")
        if writable and isinstance(a, np.ndarray) and not a.flags.writeable:
            raise ValueError(f"{name} must be writable, got a read-only array")
        return a

    def heads(self, *names, writable=False):
        """The [B, T, H, D] arrays `names` (D >= 1), all of the first one's shape."""
        first = self.array(names[0], ndim=4, last="head dim D", writable=writable)
        like = dict(ndim=4, shape=first.shape, because=f"{names[0]}.shape", writable=writable)
        return [first] + [self.array(name, **like) for name in names[1:]]

    def grad(self, name, shape):
        """A zeroed fresh parameter gradient, or the caller's array to accumulate into."""
        if self.named[name] is None:
            if self.gpu and _CURRENT.plan is not None:
                g = _CURRENT.plan.take(self.xp, shape, F32)
                g.fill(0.0)
                return g
            try:
                return self.xp.zeros(shape, F32)
            except ValueError as e:  # NumPy: "array is too big", naming no argument
                raise ValueError(f"{name} of shape {shape} cannot be allocated: {e}") from None
        return self.array(name, shape=shape, because="the parameter's shape", writable=True)

    def int(self, name):
        """An integer that fits int64 (not a bool)."""
        return as_int(name, self.named[name])

    def float(self, name, default=None, kind="float32"):
        """A real number that fits the C argument's type: float32, or "float64" for a double;
        `default` when the argument is None and a default is given."""
        v = self.named[name]
        if v is None and default is not None:
            return default
        return as_float(name, v, kind)

    def bool(self, name):
        """True or False (a bool or numpy.bool_; not None, not an int)."""
        return as_bool(name, self.named[name])

    def ids(self, name, limit, ignore=None):
        """Device index arrays are not checked by the CUDA kernels (that needs a copy to the
        host): check them here, as the C kernels do, before anything is written, unless the
        caller says it did (check_ids=False). That check reads the device once."""
        check = as_bool("check_ids", self.named.get("check_ids", True))
        if self.gpu and check:
            check_index_arrays((name, self.named[name], limit, ignore))

    # -- outputs and the call --

    def empty(self, shape, dtype=F32):
        if self.gpu and _CURRENT.plan is not None:
            return _CURRENT.plan.take(self.xp, shape, dtype)
        return self.xp.empty(shape, dtype)

    def empty_like(self, a):
        if self.gpu and _CURRENT.plan is not None:
            return _CURRENT.plan.take(self.xp, a.shape, a.dtype)
        return self.xp.empty_like(a)

    def call(self, *args):
        """lib.<kernel>(*args) on the CPU, or lib.<kernel>_cuda(*args, stream) on CuPy's
        current stream; arrays become pointers (None: NULL); raise for a failed status."""
        args = [pointer(a) if a is None or is_array(a) else a for a in args]
        if not self.gpu:
            return _core.check(getattr(_core.lib, self.kernel)(*args))
        if _CURRENT.stream is not None:
            stream = _CURRENT.stream[1]
        else:
            stream = _core.ffi.cast("void *", self.xp.cuda.get_current_stream().ptr)
        _core.check(getattr(_core.lib, self.kernel + "_cuda")(*args, stream))


def pointer(a):
    """A cffi pointer to the data of a (a float32, int64 or float64 array; ffi.NULL for None):
    host memory for NumPy (which keeps a alive during the call), device memory for CuPy (the
    caller keeps a alive)."""
    if a is None:
        return _core.ffi.NULL
    if is_cupy(a):
        return _core.ffi.cast(_CPTRS[a.dtype], a.data.ptr)
    return _core.ffi.from_buffer(_CTYPES[a.dtype], a)
