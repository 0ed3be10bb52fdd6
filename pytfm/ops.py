"""pytfm.ops — one function per op direction, over libpytfm.

Each function checks its arrays (type, dtype, C-contiguity, shapes), allocates its outputs and
calls the C kernel; no maths happens here. Arrays are float32 (index arrays int64); leading
dimensions are flattened into rows, so x may be [N, C] or [B, T, C].

Backends: NumPy arrays run the C kernels; CuPy arrays run their CUDA twins (pytfm_*_cuda) on
CuPy's current stream and return CuPy arrays (cupy is imported only when one arrives). All the
arrays of one call must be of one kind and, for CuPy, on the current device. Attention and
KVCache take NumPy arrays only (no CUDA kernels yet).

Gradient rule, as in the C library: activation gradients are returned fresh; parameter
gradients (dw, db, dtable) are returned fresh too, unless an array is passed through the
keyword of the same name, in which case they are ACCUMULATED into it (+=) and it is returned.

Bad input raises TypeError (wrong type or dtype) or ValueError (shape, layout, value), with a
message naming the argument; nothing is written when an exception is raised.
"""

import operator

import numpy as np

from ._core import check, ffi, lib

_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)
_CTYPES = {_F32: "float[]", _I64: "int64_t[]"}


# ---- argument checks ------------------------------------------------------------------------


def _is_cupy(a):
    return type(a).__module__.split(".")[0] == "cupy"


def _on_gpu(*named):
    """Whether a call runs on the GPU: (name, array) pairs, None arrays skipped, all NumPy
    (False) or all CuPy (True) on the current device; a mix raises naming the odd one out."""
    named = [(n, a) for n, a in named if a is not None]
    if not named:
        return False
    first, gpu = named[0][0], _is_cupy(named[0][1])
    kind = {False: "NumPy", True: "CuPy"}
    for n, a in named[1:]:
        if _is_cupy(a) != gpu:
            raise TypeError(
                f"{first} is a {kind[gpu]} array but {n} is a {kind[not gpu]} array: pass the "
                "arrays of one call on one device (NumPy: the CPU kernels, CuPy: the CUDA ones)"
            )
    if gpu:
        import cupy

        current = cupy.cuda.Device().id
        for n, a in named:
            if isinstance(a, cupy.ndarray) and a.device.id != current:
                raise ValueError(
                    f"{n} is on GPU {a.device.id} but the current device is GPU {current}: "
                    f"call inside `with cupy.cuda.Device({a.device.id}):`"
                )
    return gpu


def _xp(gpu):
    """The array module of a backend: numpy, or cupy (imported on first use)."""
    if not gpu:
        return np
    import cupy

    return cupy


def _array(name, a, dtype=_F32, ndim=None, min_ndim=1, gpu=False):
    """a itself, once it is a C-contiguous array of dtype and rank: a numpy.ndarray, or a
    cupy.ndarray when gpu (the backend _on_gpu chose)."""
    if gpu and not (_is_cupy(a) and type(a).__name__ == "ndarray"):
        raise TypeError(f"{name} must be a cupy.ndarray of {dtype}, got {type(a).__qualname__}")
    if not gpu and _is_cupy(a):
        raise TypeError(
            f"{name} is a CuPy array, but this operation runs on NumPy arrays only "
            "(it has no CUDA kernel yet); pass a numpy.ndarray"
        )
    if not gpu and not isinstance(a, np.ndarray):
        kind = type(a).__name__ if type(a).__module__ == "builtins" else type(a).__qualname__
        kind = f"numpy.{kind} scalar" if isinstance(a, np.generic) else kind
        raise TypeError(f"{name} must be a numpy.ndarray of {dtype}, got {kind}")
    if a.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    if a.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(
            f"{name} must be C-contiguous (np.ascontiguousarray({name})), "
            f"got strides {a.strides} for shape {a.shape}"
        )
    return a


def _shape(name, a, expected, because):
    expected = tuple(expected)
    if a.shape != expected:
        raise ValueError(f"{name} must have shape {expected} ({because}), got {a.shape}")


def _last_dim(name, a, what):
    """The size of a's last axis, which must be at least 1."""
    if a.shape[-1] < 1:
        raise ValueError(f"{name}.shape[-1] ({what}) must be >= 1, got shape {a.shape}")
    return a.shape[-1]


def _writable(name, a):
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        raise ValueError(f"{name} must be writable, got a read-only array")


def _grad_out(name, given, shape, gpu=False):
    """A zeroed fresh gradient, or the caller's array to accumulate into (checked)."""
    if given is None:
        return _xp(gpu).zeros(shape, _F32)
    _array(name, given, gpu=gpu)
    _shape(name, given, shape, "the parameter's shape")
    _writable(name, given)
    return given


def _int(name, v):
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(v).__name__}") from None


def _float(name, v):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    return float(v)


def _p(a):
    """A cffi pointer to a's data (ffi.NULL for None): host memory for NumPy (which keeps a
    alive during the call), device memory for CuPy (the caller keeps a alive)."""
    if a is None:
        return ffi.NULL
    if _is_cupy(a):
        return ffi.cast(_CPTRS[a.dtype], a.data.ptr)
    return ffi.from_buffer(_CTYPES[a.dtype], a)


_CPTRS = {_F32: "float *", _I64: "int64_t *"}


def _call(gpu, name, *args):
    """lib.<name>(*args) on the CPU, or lib.<name>_cuda(*args, stream) on CuPy's current
    stream; raise for a failed status."""
    if not gpu:
        return check(getattr(lib, name)(*args))
    import cupy

    stream = ffi.cast("void *", cupy.cuda.get_current_stream().ptr)
    check(getattr(lib, name + "_cuda")(*args, stream))


def _check_ids_on_gpu(gpu, name, ids, limit, ignore=None):
    """Device index arrays are not checked by the CUDA kernels (that needs a copy to the host):
    check them here, as the C kernels do, before anything is written."""
    if not gpu or ids.size == 0:
        return
    bad = (ids < 0) | (ids >= limit)
    if ignore is not None:
        bad &= ids != ignore
    if bool(bad.any()):
        i = int(bad.ravel().argmax())
        raise ValueError(f"{name}[{i}] = {int(ids.ravel()[i])} is outside [0, {limit})")


# ---- linear ---------------------------------------------------------------------------------


def _linear_args(x, w, gpu):
    w = _array("w", w, ndim=2, gpu=gpu)
    out, inn = w.shape
    if out < 1 or inn < 1:
        raise ValueError(f"w must have shape (out, in) with out, in >= 1, got {w.shape}")
    x = _array("x", x, gpu=gpu)
    if x.shape[-1] != inn:
        raise ValueError(
            f"x.shape[-1] must equal w.shape[1] = {inn} (in features), got x.shape {x.shape}"
        )
    return x, w, x.size // inn, inn, out


def linear_forward(x, w, b=None):
    """y = x·wᵀ + b.  x [..., in], w [out, in], b [out] or None -> y [..., out]"""
    gpu = _on_gpu(("x", x), ("w", w), ("b", b))
    x, w, n, inn, out = _linear_args(x, w, gpu)
    if b is not None:
        _shape("b", _array("b", b, gpu=gpu), (out,), "w.shape[0]")
    y = _xp(gpu).empty(x.shape[:-1] + (out,), _F32)
    _call(gpu, "pytfm_linear_forward", _p(y), _p(x), _p(w), _p(b), n, inn, out)
    return y


def linear_backward(dy, x, w, has_bias=True, *, dw=None, db=None):
    """-> (dx [..., in], dw [out, in], db [out] or None when has_bias is False)"""
    gpu = _on_gpu(("dy", dy), ("x", x), ("w", w), ("dw", dw), ("db", db))
    x, w, n, inn, out = _linear_args(x, w, gpu)
    _shape("dy", _array("dy", dy, gpu=gpu), x.shape[:-1] + (out,), "x.shape[:-1] + (w.shape[0],)")
    if db is not None and not has_bias:
        raise ValueError("db was given but has_bias is False")
    dw = _grad_out("dw", dw, w.shape, gpu)
    db = _grad_out("db", db, (out,), gpu) if has_bias else None
    dx = _xp(gpu).empty_like(x)
    _call(gpu, "pytfm_linear_backward", _p(dx), _p(dw), _p(db), _p(dy), _p(x), _p(w), n, inn,
          out)
    return dx, dw, db


# ---- softmax --------------------------------------------------------------------------------


def softmax_forward(x):
    """Softmax over the last axis.  x [..., C] -> y [..., C]"""
    gpu = _on_gpu(("x", x))
    x = _array("x", x, gpu=gpu)
    cols = _last_dim("x", x, "the softmax axis")
    y = _xp(gpu).empty_like(x)
    _call(gpu, "pytfm_softmax_forward", _p(y), _p(x), x.size // cols, cols)
    return y


def softmax_backward(dy, y):
    """dy, y [..., C] (y the forward's output) -> dx [..., C]"""
    gpu = _on_gpu(("dy", dy), ("y", y))
    y = _array("y", y, gpu=gpu)
    cols = _last_dim("y", y, "the softmax axis")
    _shape("dy", _array("dy", dy, gpu=gpu), y.shape, "y.shape")
    dx = _xp(gpu).empty_like(y)
    _call(gpu, "pytfm_softmax_backward", _p(dx), _p(dy), _p(y), y.size // cols, cols)
    return dx


# ---- layernorm ------------------------------------------------------------------------------


def _layernorm_args(x, w, gpu):
    x = _array("x", x, gpu=gpu)
    cols = _last_dim("x", x, "the normalised axis")
    _shape("w", _array("w", w, gpu=gpu), (cols,), "x.shape[-1]")
    return x, cols, x.size // cols


def layernorm_forward(x, w, b, eps=1e-5):
    """x [..., C], w [C], b [C] -> (y [..., C], mean [...], rstd [...])"""
    gpu = _on_gpu(("x", x), ("w", w), ("b", b))
    x, cols, rows = _layernorm_args(x, w, gpu)
    _shape("b", _array("b", b, gpu=gpu), (cols,), "x.shape[-1]")
    eps = _float("eps", eps)
    xp = _xp(gpu)
    y = xp.empty_like(x)
    mean = xp.empty(x.shape[:-1], _F32)
    rstd = xp.empty(x.shape[:-1], _F32)
    _call(gpu, "pytfm_layernorm_forward", _p(y), _p(mean), _p(rstd), _p(x), _p(w), _p(b), rows,
          cols, eps)
    return y, mean, rstd


def layernorm_backward(dy, x, w, mean, rstd, *, dw=None, db=None):
    """dy, x [..., C], w [C], mean, rstd [...] -> (dx [..., C], dw [C], db [C])"""
    gpu = _on_gpu(("dy", dy), ("x", x), ("w", w), ("mean", mean), ("rstd", rstd), ("dw", dw),
                  ("db", db))
    x, cols, rows = _layernorm_args(x, w, gpu)
    _shape("dy", _array("dy", dy, gpu=gpu), x.shape, "x.shape")
    _shape("mean", _array("mean", mean, min_ndim=0, gpu=gpu), x.shape[:-1], "x.shape[:-1]")
    _shape("rstd", _array("rstd", rstd, min_ndim=0, gpu=gpu), x.shape[:-1], "x.shape[:-1]")
    dw = _grad_out("dw", dw, (cols,), gpu)
    db = _grad_out("db", db, (cols,), gpu)
    dx = _xp(gpu).empty_like(x)
    _call(gpu, "pytfm_layernorm_backward", _p(dx), _p(dw), _p(db), _p(dy), _p(x), _p(w),
          _p(mean), _p(rstd), rows, cols)
    return dx, dw, db


# ---- rope -----------------------------------------------------------------------------------


def _rope_call(fn, name, x, pos, base):
    gpu = _on_gpu((name, x), ("pos", pos))
    x = _array(name, x, ndim=4, gpu=gpu)
    B, T, H, D = x.shape
    if D < 2 or D % 2:
        raise ValueError(f"{name}.shape[3] (head dim D) must be even and >= 2, got {x.shape}")
    pos = _array("pos", pos, dtype=_I64, gpu=gpu)
    if pos.shape not in ((T,), (B, T)):
        raise ValueError(
            f"pos must have shape (T,) = {(T,)} or (B, T) = {(B, T)} for {name} of shape "
            f"{x.shape}, got {pos.shape}"
        )
    base = _float("base", base)
    y = _xp(gpu).empty_like(x)
    _call(gpu, fn, _p(y), _p(x), _p(pos), B, T, H, D, T if pos.ndim == 2 else 0, base)
    return y


def rope_forward(x, pos, base=10000.0):
    """Rotary embedding, rotate-half pairing.  x [B, T, H, D], pos int64 [T] or [B, T] -> y"""
    return _rope_call("pytfm_rope_forward", "x", x, pos, base)


def rope_backward(dy, pos, base=10000.0):
    """The inverse rotation.  dy [B, T, H, D], pos int64 [T] or [B, T] -> dx [B, T, H, D]"""
    return _rope_call("pytfm_rope_backward", "dy", dy, pos, base)


# ---- gelu -----------------------------------------------------------------------------------


def gelu_forward(x):
    """GELU, tanh approximation.  x [...] -> y [...]"""
    gpu = _on_gpu(("x", x))
    x = _array("x", x, min_ndim=0, gpu=gpu)
    y = _xp(gpu).empty_like(x)
    _call(gpu, "pytfm_gelu_forward", _p(y), _p(x), x.size)
    return y


def gelu_backward(dy, x):
    """dy, x [...] (x the forward's input) -> dx [...]"""
    gpu = _on_gpu(("dy", dy), ("x", x))
    x = _array("x", x, min_ndim=0, gpu=gpu)
    _shape("dy", _array("dy", dy, min_ndim=0, gpu=gpu), x.shape, "x.shape")
    dx = _xp(gpu).empty_like(x)
    _call(gpu, "pytfm_gelu_backward", _p(dx), _p(dy), _p(x), x.size)
    return dx


# ---- embedding ------------------------------------------------------------------------------


def embedding_forward(ids, table):
    """ids int64 [...] in [0, vocab), table [vocab, dim] -> y [..., dim]"""
    gpu = _on_gpu(("ids", ids), ("table", table))
    ids = _array("ids", ids, dtype=_I64, min_ndim=0, gpu=gpu)
    table = _array("table", table, ndim=2, gpu=gpu)
    vocab, dim = table.shape
    if vocab < 1 or dim < 1:
        raise ValueError(f"table must have shape (vocab, dim) with both >= 1, got {table.shape}")
    _check_ids_on_gpu(gpu, "ids", ids, vocab)
    y = _xp(gpu).empty(ids.shape + (dim,), _F32)
    _call(gpu, "pytfm_embedding_forward", _p(y), _p(ids), _p(table), ids.size, vocab, dim)
    return y


def embedding_backward(dy, ids, vocab_size, *, dtable=None):
    """dy [..., dim], ids int64 [...] -> dtable [vocab_size, dim] (repeated ids add up)"""
    gpu = _on_gpu(("dy", dy), ("ids", ids), ("dtable", dtable))
    ids = _array("ids", ids, dtype=_I64, min_ndim=0, gpu=gpu)
    dy = _array("dy", dy, gpu=gpu)
    dim = _last_dim("dy", dy, "the embedding dim")
    _shape("dy", dy, ids.shape + (dim,), "ids.shape + (dim,)")
    vocab_size = _int("vocab_size", vocab_size)
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    dtable = _grad_out("dtable", dtable, (vocab_size, dim), gpu)
    _check_ids_on_gpu(gpu, "ids", ids, vocab_size)
    _call(gpu, "pytfm_embedding_backward", _p(dtable), _p(dy), _p(ids), ids.size, vocab_size,
          dim)
    return dtable


# ---- cross-entropy --------------------------------------------------------------------------


def _cross_entropy_args(logits, targets, ignore_index, gpu):
    logits = _array("logits", logits, gpu=gpu)
    V = _last_dim("logits", logits, "the number of classes")
    targets = _array("targets", targets, dtype=_I64, min_ndim=0, gpu=gpu)
    _shape("targets", targets, logits.shape[:-1], "logits.shape[:-1]")
    ignore_index = _int("ignore_index", ignore_index)
    _check_ids_on_gpu(gpu, "targets", targets, V, ignore_index)
    return logits, targets, V, targets.size, ignore_index


def cross_entropy_forward(logits, targets, ignore_index=-1):
    """Mean softmax cross-entropy over targets != ignore_index (0.0 if there are none).

    logits [..., V], targets int64 [...] -> (loss: float, cache), where cache is the per-row
    log-sum-exp [...] that cross_entropy_backward takes.
    """
    gpu = _on_gpu(("logits", logits), ("targets", targets))
    logits, targets, V, n, ignore_index = _cross_entropy_args(logits, targets, ignore_index, gpu)
    xp = _xp(gpu)
    loss = xp.empty(1, _F32)
    lse = xp.empty(targets.shape, _F32)
    _call(gpu, "pytfm_cross_entropy_forward", _p(loss), _p(lse), _p(logits), _p(targets), n, V,
          ignore_index)
    return float(loss[0]), lse


def cross_entropy_backward(logits, targets, cache, ignore_index=-1, dloss=1.0):
    """-> dlogits [..., V], the gradient of dloss · loss; cache from cross_entropy_forward."""
    gpu = _on_gpu(("logits", logits), ("targets", targets), ("cache", cache))
    logits, targets, V, n, ignore_index = _cross_entropy_args(logits, targets, ignore_index, gpu)
    _shape("cache", _array("cache", cache, min_ndim=0, gpu=gpu), targets.shape,
           "logits.shape[:-1]")
    dloss = _float("dloss", dloss)
    dlogits = _xp(gpu).empty_like(logits)
    _call(gpu, "pytfm_cross_entropy_backward", _p(dlogits), _p(logits), _p(targets), _p(cache),
          n, V, ignore_index, dloss)
    return dlogits


# ---- adamw ----------------------------------------------------------------------------------


def adamw_step(param, grad, m, v, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One AdamW step (as torch.optim.AdamW), in place on param, m and v; returns None.

    param, grad, m, v: float32 arrays of one shape; step: the 1-based step number.
    """
    arrays = {"param": param, "grad": grad, "m": m, "v": v}
    gpu = _on_gpu(*arrays.items())
    for name, a in arrays.items():
        _array(name, a, min_ndim=0, gpu=gpu)
        _shape(name, a, param.shape, "param.shape")
    for name in ("param", "m", "v"):
        _writable(name, arrays[name])
    names = list(arrays)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if _xp(gpu).may_share_memory(arrays[a], arrays[b]):
                raise ValueError(f"{a} and {b} must not share memory")
    step = _int("step", step)
    hyper = [_float(name, x) for name, x in (("lr", lr), ("beta1", beta1), ("beta2", beta2),
                                             ("eps", eps), ("weight_decay", weight_decay))]
    _call(gpu, "pytfm_adamw_step", _p(param), _p(m), _p(v), _p(grad), param.size, step, *hyper)


# ---- attention ------------------------------------------------------------------------------


def _heads(name, a, like=None):
    """a as a [B, T, H, D] float32 array with D >= 1 (and the shape of `like` when given)."""
    a = _array(name, a, ndim=4)
    if like is not None:
        _shape(name, a, like[1].shape, f"{like[0]}.shape")
    elif a.shape[3] < 1:
        raise ValueError(f"{name}.shape[3] (head dim D) must be >= 1, got shape {a.shape}")
    return a


def _scale(scale, D):
    return 1.0 / float(D) ** 0.5 if scale is None else _float("scale", scale)


def attention_forward(q, k, v, causal=True, scale=None):
    """Multi-head scaled dot-product attention, flash-style (no [T, T] matrix is stored).

    q, k, v [B, T, H, D] -> (o [B, T, H, D], lse [B, H, T]); scale defaults to 1/sqrt(D).
    """
    q = _heads("q", q)
    k, v = _heads("k", k, ("q", q)), _heads("v", v, ("q", q))
    B, T, H, D = q.shape
    o = np.empty_like(q)
    lse = np.empty((B, H, T), _F32)
    check(lib.pytfm_attention_forward(_p(o), _p(lse), _p(q), _p(k), _p(v), B, T, H, D,
                                      _scale(scale, D), bool(causal)))
    return o, lse


def attention_backward(do, q, k, v, o, lse, causal=True, scale=None):
    """-> (dq, dk, dv), each [B, T, H, D]; o and lse from attention_forward."""
    q = _heads("q", q)
    k, v = _heads("k", k, ("q", q)), _heads("v", v, ("q", q))
    do, o = _heads("do", do, ("q", q)), _heads("o", o, ("q", q))
    B, T, H, D = q.shape
    _shape("lse", _array("lse", lse), (B, H, T), "(B, H, T) of q")
    dq, dk, dv = np.empty_like(q), np.empty_like(q), np.empty_like(q)
    check(lib.pytfm_attention_backward(_p(dq), _p(dk), _p(dv), _p(do), _p(q), _p(k), _p(v),
                                       _p(o), _p(lse), B, T, H, D, _scale(scale, D),
                                       bool(causal)))
    return dq, dk, dv


def _cache_args(q_name, q, k_cache, v_cache, start):
    q = _heads(q_name, q)
    k_cache = _heads("k_cache", k_cache)
    v_cache = _heads("v_cache", v_cache, ("k_cache", k_cache))
    B, n, H, D = q.shape
    Bc, Tmax, Hc, Dc = k_cache.shape
    if (Bc, Hc, Dc) != (B, H, D):
        raise ValueError(
            f"k_cache must have shape (B, Tmax, H, D) = ({B}, Tmax, {H}, {D}) to match "
            f"{q_name} of shape {q.shape}, got {k_cache.shape}"
        )
    start = _int("start", start)
    if start < 0 or start + n > Tmax:
        raise ValueError(
            f"cache overflow: positions [{start}, {start + n}) do not fit in a cache of "
            f"Tmax = {Tmax} (start must be in [0, Tmax - n])"
        )
    return q, k_cache, v_cache, (B, n, H, D, Tmax, start)


def attention_cache_append(k_cache, v_cache, k, v, start):
    """Write k, v [B, n, H, D] into the caches [B, Tmax, H, D] at positions [start, start+n)."""
    k, k_cache, v_cache, dims = _cache_args("k", k, k_cache, v_cache, start)
    _heads("v", v, ("k", k))
    for name, a in (("k_cache", k_cache), ("v_cache", v_cache)):
        _writable(name, a)
    check(lib.pytfm_attention_cache_append(_p(k_cache), _p(v_cache), _p(k), _p(v), *dims))


def attention_decode(q, k_cache, v_cache, start, scale=None):
    """Causal attention of queries q [B, n, H, D] at positions [start, start + n) to the cached
    keys and values at positions [0, start + n). -> (o [B, n, H, D], lse [B, H, n])"""
    q, k_cache, v_cache, dims = _cache_args("q", q, k_cache, v_cache, start)
    B, n, H, D = q.shape
    o = np.empty_like(q)
    lse = np.empty((B, H, n), _F32)
    check(lib.pytfm_attention_decode(_p(o), _p(lse), _p(q), _p(k_cache), _p(v_cache), *dims,
                                     _scale(scale, D)))
    return o, lse


class KVCache:
    """Keys and values of the tokens seen so far, for decoding one (or a few) tokens at a time.

        cache = KVCache(batch=1, max_len=128, n_head=4, head_dim=16)
        o = cache.attend(q, k, v)   # q, k, v [B, n, H, D] of the n new tokens

    attend() appends k and v at positions [len(cache), len(cache) + n) and returns the causal
    attention of q to everything cached: the same result as attention_forward over the whole
    sequence, at O(len·D) per new token.
    """

    def __init__(self, batch, max_len, n_head, head_dim):
        shape = (_int("batch", batch), _int("max_len", max_len), _int("n_head", n_head),
                 _int("head_dim", head_dim))
        if min(shape) < 1:
            raise ValueError(f"KVCache sizes must all be >= 1, got {shape}")
        self.k = np.zeros(shape, _F32)  # (B, Tmax, H, D)
        self.v = np.zeros(shape, _F32)
        self.length = 0

    def __len__(self):
        return self.length

    def attend(self, q, k, v, scale=None):
        q = _heads("q", q)
        _heads("k", k, ("q", q)), _heads("v", v, ("q", q))  # before anything is written
        start = self.length
        attention_cache_append(self.k, self.v, k, v, start)
        o, _ = attention_decode(q, self.k, self.v, start, scale)
        self.length = start + q.shape[1]
        return o

    def reset(self):
        self.length = 0
