"""pytfm.ops — one function per op direction, over libpytfm.

Each function checks its arrays (type, dtype, C-contiguity, shapes), allocates its outputs and
calls the C kernel; no maths happens here. Arrays are float32 (index arrays int64); leading
dimensions are folded into rows, so x may be [rows, cols] or [B, T, cols]. Sizes are named as
in pytfm.h: rows and cols, count (a flat array's elements), vocab, B, T, H, D, n_new.

Backends: NumPy arrays run the C kernels; CuPy arrays run their CUDA twins (pytfm_*_cuda) on
CuPy's current stream and return CuPy arrays (cupy is imported only when one arrives). All the
arrays of one call must be of one kind and, for CuPy, on the current device. Every op with array
arguments has a CUDA twin, but for round_bf16, the ops on BF16 weights (linear_forward_bf16w and
embedding_forward_bf16w) and those on 8-bit weights (quantize_q8, dequantize_q8,
linear_forward_q8w, embedding_forward_q8w): NumPy arrays only, CPU inference modes; gemm_bf16
(BF16 operands) and the linear layer's precision="tf32" run on CuPy arrays only (the GPU's
tensor cores). A library without a twin (an older build) takes NumPy arrays only.
Results are of one kind on both backends: arrays of the inputs' kind, a reduction (the loss of
cross_entropy_forward, sum_squares) a 0-d array, so that nothing is read back from a device
unless the caller asks (float(loss)).

Gradient rule, as in the C library: activation gradients are returned fresh; parameter
gradients (dw, db, dtable) are returned fresh too, unless an array is passed through the
keyword of the same name, in which case they are ACCUMULATED into it (+=) and it is returned.

Bad input raises TypeError (wrong type or dtype) or ValueError (shape, layout, value), with a
message naming the argument; nothing is written when an exception is raised. Scalars: an
integer argument takes an int or NumPy integer within int64, never a bool; a real one any real
number within its C type's range (float32; float64 for rope's base and AdamW's
hyper-parameters), NaN and inf left to the C checks, which reject them; causal and has_bias take
True or False only (a bool or numpy.bool_), not None or 0.
"""

import math

import numpy as _np

from . import _core
from ._arrays import F64 as _F64
from ._arrays import I64 as _I64
from ._arrays import Args as _Args
from ._arrays import as_float as _as_float
from ._arrays import as_int as _as_int
from ._arrays import check_index_arrays  # noqa: F401 - public: pytfm.ops.check_index_arrays
from ._arrays import is_cupy as _is_cupy

_U16 = _np.dtype(_np.uint16)  # BF16 bits (gemm_bf16, the _bf16w ops)
# the model's constants, as pytfm_model.h defines them: the defaults of eps and base below
LAYERNORM_EPS = _core.lib.PYTFM_LAYERNORM_EPS
ROPE_BASE = _core.lib.PYTFM_ROPE_BASE

# ---- linear ---------------------------------------------------------------------------------


def _linear_dims(a):
    """x [..., in] and w [out, in] -> x, w, rows, in, out"""
    w = a.array("w", ndim=2)
    out, inn = w.shape
    if out < 1 or inn < 1:
        raise ValueError(f"w must have shape (out, in) with out, in >= 1, got {w.shape}")
    x = a.array("x")
    if x.shape[-1] != inn:
        raise ValueError(
            f"x.shape[-1] must equal w.shape[1] = {inn} (in features), got x.shape {x.shape}"
        )
    return x, w, x.size // inn, inn, out


def _precise(kernel, precision):
    """The kernel for a precision: its FP32 function itself ("fp32": those bits), else the _ex
    one, which takes the precision last -> (name, the extra arguments)"""
    code = _core.precision_code(precision)
    return (kernel, ()) if code == 0 else (kernel + "_ex", (code,))


def _gpu_only(a, precision):
    """TF32 is the tensor cores' format: the C kernels have no TF32 products"""
    if precision == "tf32" and not a.gpu:
        raise ValueError("precision 'tf32' runs on CuPy arrays only (the GPU's tensor cores); "
                         "on NumPy arrays use 'fp32' or 'bf16'")


def linear_forward(x, w, b=None, precision="fp32"):
    """y = x·wᵀ + b.  x [..., in], w [out, in], b [out] or None -> y [..., out]. precision:
    "fp32", "bf16" (x and w rounded to BF16 as the product reads them, sums in float32: see
    pytfm_linear_forward_ex; on CuPy arrays the tensor cores, pytfm_linear_forward_ex_cuda) or
    "tf32" (rounded to TF32, on the tensor cores: CuPy arrays only)."""
    kernel, extra = _precise("pytfm_linear_forward", precision)
    a = _Args(kernel, locals())
    _gpu_only(a, precision)
    x, w, rows, inn, out = _linear_dims(a)
    b = a.array("b", shape=(out,), because="w.shape[0]", optional=True)
    y = a.empty(x.shape[:-1] + (out,))
    a.call(y, x, w, b, rows, inn, out, *extra)
    return y


def linear_gelu_forward(x, w, b=None, precision="fp32"):
    """h = x·wᵀ + b, y = gelu(h).  x [..., in], w [out, in], b [out] or None -> (y, h) [..., out];
    precision as linear_forward"""
    kernel, extra = _precise("pytfm_linear_gelu_forward", precision)
    a = _Args(kernel, locals())
    _gpu_only(a, precision)
    x, w, rows, inn, out = _linear_dims(a)
    b = a.array("b", shape=(out,), because="w.shape[0]", optional=True)
    y, h = a.empty(x.shape[:-1] + (out,)), a.empty(x.shape[:-1] + (out,))
    a.call(y, h, x, w, b, rows, inn, out, *extra)
    return y, h


def linear_backward(dy, x, w, has_bias=True, *, dw=None, db=None, precision="fp32"):
    """dy [..., out], x [..., in], w [out, in] -> (dx [..., in], dw [out, in], db [out] or None
    when has_bias is False); precision as linear_forward: in "bf16" the products dy·w and
    dyᵀ·x take BF16-rounded inputs, db (the column sums of dy) is float32."""
    kernel, extra = _precise("pytfm_linear_backward", precision)
    a = _Args(kernel, locals())
    _gpu_only(a, precision)
    x, w, rows, inn, out = _linear_dims(a)
    dy = a.array("dy", shape=x.shape[:-1] + (out,), because="x.shape[:-1] + (w.shape[0],)")
    has_bias = a.bool("has_bias")
    if db is not None and not has_bias:
        raise ValueError("db was given but has_bias is False")
    dw = a.grad("dw", w.shape)
    db = a.grad("db", (out,)) if has_bias else None
    dx = a.empty_like(x)
    a.call(dx, dw, db, dy, x, w, rows, inn, out, *extra)
    return dx, dw, db


def _numpy_only(op, named, instead, what="BF16-only weights are"):
    """The _bf16w ops (and a BF16 KV cache's) have no CUDA twin: a CuPy argument is refused,
    saying what to call."""
    for name, v in named.items():
        if _is_cupy(v):
            raise TypeError(f"{name} is a CuPy array, but {op} runs on NumPy arrays only "
                            f"({what} a CPU inference mode): pass numpy.ndarrays, "
                            f"or on the GPU widen the bits (from_bf16_bits) and call {instead}")


def _bf16_bits(a, name, ndim, what):
    """The argument `name`, once it is a C-contiguous NumPy uint16 array of BF16 bits of rank
    ndim (`what` says which shape), as a cffi uint16_t pointer for the call. A float array is
    refused with the way to make the bits: float32 values are not silently truncated."""
    v = a.named[name]
    if isinstance(v, _np.ndarray) and v.dtype != _U16:
        raise TypeError(
            f"{name} must be a uint16 array of BF16 bits (the upper halves of float32 values "
            f"rounded to BF16), got dtype {v.dtype}: make them with "
            f"pytfm.ops.to_bf16_bits({name}.astype(np.float32)) (round to nearest even, as "
            "pytfm.ops.round_bf16)")
    v = a.array(name, dtype=_U16, ndim=ndim)
    if 0 in v.shape:
        raise ValueError(f"{name} must have shape {what} with both >= 1, got {v.shape}")
    return v, _core.ffi.from_buffer("uint16_t[]", v)


def linear_forward_bf16w(x, w16, b=None):
    """y = x·Wᵀ + b in BF16 precision, W given as BF16 only: w16 [out, in] uint16, the BF16
    bits of W (to_bf16_bits(w)); x [..., in] float32, b [out] float32 or None -> y [..., out]
    float32. The bits of linear_forward(x, from_bf16_bits(w16), b, precision="bf16"), with
    half W's bytes (see pytfm_linear_forward_bf16w). NumPy arrays only."""
    _numpy_only("linear_forward_bf16w", locals(), 'linear_forward(..., precision="bf16")')
    a = _Args("pytfm_linear_forward_bf16w", locals())
    w16, w16_ptr = _bf16_bits(a, "w16", 2, "(out, in)")
    out, inn = w16.shape
    x = a.array("x")
    if x.shape[-1] != inn:
        raise ValueError(f"x.shape[-1] must equal w16.shape[1] = {inn} (in features), got "
                         f"x.shape {x.shape}")
    b = a.array("b", shape=(out,), because="w16.shape[0]", optional=True)
    y = a.empty(x.shape[:-1] + (out,))
    a.call(y, x, w16_ptr, b, x.size // inn, inn, out)
    return y


def gemm_bf16(a, b, *, trans_a=False, trans_b=False, c=None, beta=0.0):
    """C = beta·C + op(a)·op(b) on BF16 operands, on the GPU's tensor cores
    (pytfm_gemm_bf16_cuda, the like of cuBLAS's BF16 GEMM): a [m, k] ([k, m] with trans_a) and
    b [k, n] ([n, k] with trans_b) are CuPy uint16 arrays of BF16 bits (the upper halves of
    float32 values already rounded to BF16), the products exact and summed in float32.
    -> c [m, n] float32: a fresh one (beta must then be 0), or the caller's, accumulated into.
    CuPy arrays only: the CPU has no BF16 operands (round_bf16 keeps float32)."""
    args = _Args("pytfm_gemm_bf16", locals())
    if not args.gpu:
        raise TypeError("gemm_bf16 runs on CuPy arrays only (the GPU's tensor cores); on NumPy "
                        "arrays round float32 operands with round_bf16 and multiply those")
    ta, tb = args.bool("trans_a"), args.bool("trans_b")
    a = args.array("a", dtype=_U16, ndim=2)
    b = args.array("b", dtype=_U16, ndim=2)
    m, k = a.shape[::-1] if ta else a.shape
    kb, n = b.shape[::-1] if tb else b.shape
    if kb != k:
        raise ValueError(f"b must have k = {k} {'columns' if tb else 'rows'} (op(a) is "
                         f"[{m}, {k}], trans_b={tb}), got b.shape {b.shape}")
    beta = args.float("beta")
    if c is None and beta != 0.0:
        raise ValueError(f"beta must be 0 without c (a fresh c holds nothing), got {beta}")
    c = args.empty((m, n)) if c is None else args.array(
        "c", ndim=2, shape=(m, n), because="(m, n) of op(a)·op(b)", writable=True)
    ptr = [_core.ffi.cast("uint16_t *", x.data.ptr) for x in (a, b)]
    args.call(c, *ptr, m, n, k, int(ta), int(tb), beta)
    return c


def round_bf16(x):
    """x rounded to BF16, as the BF16 products round their inputs (float32 values whose low 16
    bits are zero; see pytfm_round_bf16).  x [...] -> y [...]"""
    a = _Args("pytfm_round_bf16", locals())
    x = a.array("x", min_ndim=0)
    y = a.empty_like(x)
    a.call(y, x, x.size)
    return y


def to_bf16_bits(a):
    """The BF16 bits of a float32 array: round_bf16(a) (to nearest, ties to even; NaN stays
    NaN; a float32 subnormal becomes a zero of its sign) and its upper 16 bits, exactly (the
    rounding zeroes the lower ones).  a [...] float32 -> uint16 [...]: what the _bf16w ops
    take (linear_forward_bf16w's w16, embedding_forward_bf16w's table16)."""
    if not isinstance(a, _np.ndarray) or a.dtype != _np.float32:
        t = type(a)
        kind = (a.dtype if isinstance(a, _np.ndarray) else t.__qualname__
                if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}")
        raise TypeError(f"a must be a numpy.ndarray of float32, got {kind}")
    return (round_bf16(a).view(_np.uint32) >> 16).astype(_U16)


def from_bf16_bits(h):
    """BF16 bits widened to float32, exactly: the float whose upper half is h and lower half
    zero.  h [...] uint16 -> float32 [...]"""
    if not isinstance(h, _np.ndarray):
        raise TypeError(f"h must be a numpy.ndarray of uint16 (BF16 bits), got "
                        f"{type(h).__qualname__}")
    if h.dtype != _U16:
        raise TypeError(f"h must have dtype uint16 (BF16 bits), got {h.dtype}")
    return (h.astype(_np.uint32) << 16).view(_np.float32)


# ---- softmax --------------------------------------------------------------------------------


def softmax_forward(x):
    """Softmax over the last axis.  x [..., cols] -> y [..., cols]"""
    a = _Args("pytfm_softmax_forward", locals())
    x = a.array("x", last="the softmax axis")
    y = a.empty_like(x)
    a.call(y, x, x.size // x.shape[-1], x.shape[-1])
    return y


def softmax_backward(dy, y):
    """dy, y [..., cols] (y the forward's output) -> dx [..., cols]"""
    a = _Args("pytfm_softmax_backward", locals())
    y = a.array("y", last="the softmax axis")
    dy = a.array("dy", shape=y.shape, because="y.shape")
    dx = a.empty_like(y)
    a.call(dx, dy, y, y.size // y.shape[-1], y.shape[-1])
    return dx


# ---- layernorm ------------------------------------------------------------------------------


def _layernorm_dims(a):
    """x [..., cols] and w [cols] -> x, w, rows, cols"""
    x = a.array("x", last="the normalised axis")
    cols = x.shape[-1]
    w = a.array("w", shape=(cols,), because="x.shape[-1]")
    return x, w, x.size // cols, cols


def layernorm_forward(x, w, b, eps=LAYERNORM_EPS):
    """x [..., cols], w [cols], b [cols] -> (y [..., cols], mean [...], rstd [...])"""
    a = _Args("pytfm_layernorm_forward", locals())
    x, w, rows, cols = _layernorm_dims(a)
    b = a.array("b", shape=(cols,), because="x.shape[-1]")
    eps = a.float("eps")
    y, mean, rstd = a.empty_like(x), a.empty(x.shape[:-1]), a.empty(x.shape[:-1])
    a.call(y, mean, rstd, x, w, b, rows, cols, eps)
    return y, mean, rstd


def layernorm_backward(dy, x, w, mean, rstd, *, dw=None, db=None):
    """dy, x [..., cols], w [cols], mean, rstd [...] -> (dx [..., cols], dw [cols], db [cols])"""
    a = _Args("pytfm_layernorm_backward", locals())
    x, w, rows, cols = _layernorm_dims(a)
    dy = a.array("dy", shape=x.shape, because="x.shape")
    mean = a.array("mean", min_ndim=0, shape=x.shape[:-1], because="x.shape[:-1]")
    rstd = a.array("rstd", min_ndim=0, shape=x.shape[:-1], because="x.shape[:-1]")
    dw, db = a.grad("dw", (cols,)), a.grad("db", (cols,))
    dx = a.empty_like(x)
    a.call(dx, dw, db, dy, x, w, mean, rstd, rows, cols)
    return dx, dw, db


# ---- rope -----------------------------------------------------------------------------------


def _positions(a, name, shape):
    """RoPE's positions for the [B, T, H, D] array `name` of shape `shape`: (pos, pos_stride,
    base), pos an int64 [T] (one row shared by the batch, stride 0) or [B, T] (stride T)."""
    B, T, D = shape[0], shape[1], shape[-1]
    if D < 2 or D % 2:
        raise ValueError(f"{name}.shape[{len(shape) - 1}] (head dim D) must be even and >= 2 "
                         f"for RoPE, got {shape}")
    pos = a.array("pos", dtype=_I64)
    if pos.shape not in ((T,), (B, T)):
        raise ValueError(
            f"pos must have shape (T,) = {(T,)} or (B, T) = {(B, T)} for {name} of shape "
            f"{shape}, got {pos.shape}"
        )
    return pos, T if pos.ndim == 2 else 0, a.float("base", kind="float64")


def _rope(a, name):
    """Rotate the [B, T, H, D] argument `name` by the angles of pos (forward or backward)."""
    x = a.array(name, ndim=4)
    B, T, H, D = x.shape
    pos, stride, base = _positions(a, name, x.shape)
    y = a.empty_like(x)
    a.call(y, x, pos, B, T, H, D, stride, base)
    return y


def rope_forward(x, pos, base=ROPE_BASE):
    """Rotary embedding, rotate-half pairing.  x [B, T, H, D], pos int64 [T] or [B, T] -> y"""
    return _rope(_Args("pytfm_rope_forward", locals()), "x")


def rope_backward(dy, pos, base=ROPE_BASE):
    """The inverse rotation.  dy [B, T, H, D], pos int64 [T] or [B, T] -> dx [B, T, H, D]"""
    return _rope(_Args("pytfm_rope_backward", locals()), "dy")


# ---- the fused QKV projection's split -------------------------------------------------------


def qkv_split_forward(qkv, pos=None, base=ROPE_BASE):
    """q, k, v out of a fused QKV projection, q and k rotated by RoPE at pos (not rotated when
    pos is None).  qkv [B, T, 3, H, D], pos int64 [T] or [B, T] or None -> q, k, v [B, T, H, D]
    each; the same bits as slicing qkv and calling rope_forward on q and k."""
    a = _Args("pytfm_qkv_split_forward", locals())
    qkv = a.array("qkv", ndim=5, last="head dim D")
    B, T, three, H, D = qkv.shape
    if three != 3:
        raise ValueError(f"qkv.shape[2] must be 3 (q, k, v), got shape {qkv.shape}")
    part = (B, T, H, D)
    pos, stride, base = (None, 0, 1.0) if pos is None else _positions(a, "qkv", qkv.shape)
    q, k, v = (a.empty(part) for _ in range(3))
    a.call(q, k, v, qkv, pos, B, T, H, D, stride, base, int(pos is not None))
    return q, k, v


def qkv_split_backward(dq, dk, dv, pos=None, base=ROPE_BASE):
    """The gradient of qkv_split_forward, in the fused layout: dq, dk rotated back (when pos is
    given) and dv.  dq, dk, dv [B, T, H, D], pos as the forward -> dqkv [B, T, 3, H, D]"""
    a = _Args("pytfm_qkv_split_backward", locals())
    dq = a.array("dq", ndim=4, last="head dim D")
    dk, dv = (a.array(n, shape=dq.shape, because="dq's shape") for n in ("dk", "dv"))
    B, T, H, D = dq.shape
    pos, stride, base = (None, 0, 1.0) if pos is None else _positions(a, "dq", dq.shape)
    dqkv = a.empty((B, T, 3, H, D))
    a.call(dqkv, dq, dk, dv, pos, B, T, H, D, stride, base, int(pos is not None))
    return dqkv


# ---- sinusoidal positions -------------------------------------------------------------------


def sinusoidal_positions(T, dim):
    """The sinusoidal position table.  -> pe [T, dim]: pe[t, 2i] = sin(t·inv_i),
    pe[t, 2i + 1] = cos(t·inv_i), inv_i = 10000^(−2i/dim), in double, rounded to float32 once.
    T >= 0, dim even and >= 2. The C model computes its table with the same function."""
    a = _Args("pytfm_sinusoidal_positions", locals())
    T, dim = a.int("T"), a.int("dim")
    if T < 0:
        raise ValueError(f"T must be >= 0, got {T}")
    if dim < 2 or dim % 2:
        raise ValueError(f"dim must be even and >= 2, got {dim}")
    try:
        pe = a.empty((T, dim))
    except ValueError as e:  # NumPy: "array is too big", naming no argument
        raise ValueError(f"pe of shape ({T}, {dim}) cannot be allocated: {e}") from None
    a.call(pe, T, dim)
    return pe


# ---- gelu -----------------------------------------------------------------------------------


def gelu_forward(x):
    """GELU, tanh approximation.  x [...] -> y [...]"""
    a = _Args("pytfm_gelu_forward", locals())
    x = a.array("x", min_ndim=0)
    y = a.empty_like(x)
    a.call(y, x, x.size)
    return y


def gelu_backward(dy, x):
    """dy, x [...] (x the forward's input) -> dx [...]"""
    a = _Args("pytfm_gelu_backward", locals())
    x = a.array("x", min_ndim=0)
    dy = a.array("dy", min_ndim=0, shape=x.shape, because="x.shape")
    dx = a.empty_like(x)
    a.call(dx, dy, x, x.size)
    return dx


# ---- embedding ------------------------------------------------------------------------------


def embedding_forward(ids, table, *, check_ids=True):
    """ids int64 [...] in [0, vocab), table [vocab, dim] -> y [..., dim]. check_ids=False: the
    caller checked the ids (on CuPy arrays the check reads the device; see _Args.ids)."""
    a = _Args("pytfm_embedding_forward", locals())
    ids = a.array("ids", dtype=_I64, min_ndim=0)
    table = a.array("table", ndim=2)
    vocab, dim = table.shape
    if vocab < 1 or dim < 1:
        raise ValueError(f"table must have shape (vocab, dim) with both >= 1, got {table.shape}")
    a.ids("ids", vocab)
    y = a.empty(ids.shape + (dim,))
    a.call(y, ids, table, ids.size, vocab, dim)
    return y


def embedding_forward_bf16w(ids, table16, *, check_ids=True):
    """The rows of a BF16 table, widened: ids int64 [...] in [0, vocab), table16 [vocab, dim]
    uint16 (BF16 bits: to_bf16_bits(table)) -> y [..., dim] float32, exactly
    embedding_forward(ids, from_bf16_bits(table16)). NumPy arrays only; the C kernel checks
    the ids (check_ids is for CuPy arrays, which this op does not take)."""
    _numpy_only("embedding_forward_bf16w", locals(), "embedding_forward")
    a = _Args("pytfm_embedding_forward_bf16w", locals())
    ids = a.array("ids", dtype=_I64, min_ndim=0)
    table16, table_ptr = _bf16_bits(a, "table16", 2, "(vocab, dim)")
    vocab, dim = table16.shape
    a.ids("ids", vocab)
    y = a.empty(ids.shape + (dim,))
    a.call(y, ids, table_ptr, ids.size, vocab, dim)
    return y

# ---- 8-bit weights (inference, NumPy only) ------------------------------------------------

_I8 = _np.dtype(_np.int8)
Q8_BLOCK = _core.lib.PYTFM_Q8_BLOCK  # weights per block, each block with one fp16 scale


def _numpy_only_q8(op, named):
    """The ops on 8-bit weights have no CUDA twin: a CuPy argument is refused."""
    for name, v in named.items():
        if _is_cupy(v):
            raise TypeError(f"{name} is a CuPy array, but {op} runs on NumPy arrays only "
                            "(8-bit weights are a CPU inference mode): pass numpy.ndarrays, "
                            "or on the GPU dequantise on the host (dequantize_q8) and call "
                            "linear_forward / embedding_forward on the float32 weights")


def _q8_weights(a, q_name, s_name, rows_name):
    """The 8-bit weights `q_name` (int8 [rows, cols], cols a multiple of Q8_BLOCK) and their
    scales `s_name` (fp16 bits, uint16 [rows, cols / Q8_BLOCK]; numpy float16 is taken as its
    bits) -> q, scales, and their cffi pointers for the call."""
    scales = a.named[s_name]
    if isinstance(scales, _np.ndarray) and scales.dtype == _np.float16:
        scales = a.named[s_name] = scales.view(_U16)
    q = a.array(q_name, dtype=_I8, ndim=2)
    rows, cols = q.shape
    if rows < 1 or cols < 1 or cols % Q8_BLOCK:
        raise ValueError(f"{q_name} must have shape ({rows_name}, cols) with {rows_name} >= 1 "
                         f"and cols a positive multiple of {Q8_BLOCK}, got {q.shape}")
    scales = a.array(s_name, dtype=_U16, shape=(rows, cols // Q8_BLOCK),
                     because=f"one fp16 scale per block of {Q8_BLOCK} of {q_name}'s rows")
    ffi = _core.ffi
    return q, scales, ffi.from_buffer("int8_t[]", q), ffi.from_buffer("uint16_t[]", scales)


def quantize_q8(w):
    """W in 8 bits, blocks of Q8_BLOCK along each row with an fp16 scale each (llama.cpp's
    Q8_0; the rounding is pytfm_quantize_q8's): w [out, in] float32, or uint16 BF16 bits
    (to_bf16_bits), in a multiple of Q8_BLOCK -> (q int8 [out, in], scales uint16
    [out, in / Q8_BLOCK], the scales' fp16 bits: scales.view(numpy.float16) reads them).
    A non-finite weight, or a block whose scale overflows fp16, raises ValueError naming its
    row and block. NumPy arrays only."""
    _numpy_only_q8("quantize_q8", locals())
    bf16 = isinstance(w, _np.ndarray) and w.dtype == _U16
    a = _Args("pytfm_quantize_q8_bf16" if bf16 else "pytfm_quantize_q8", locals())
    w = a.array("w", dtype=_U16 if bf16 else _np.dtype(_np.float32), ndim=2)
    out, inn = w.shape
    if inn < 1 or inn % Q8_BLOCK:
        raise ValueError(f"w must have shape (out, in) with in a positive multiple of "
                         f"{Q8_BLOCK} (the block), got {w.shape}")
    q = _np.empty((out, inn), _I8)
    scales = _np.empty((out, inn // Q8_BLOCK), _U16)
    ffi = _core.ffi
    w_ptr = ffi.from_buffer("uint16_t[]" if bf16 else "float[]", w)
    a.call(ffi.from_buffer("int8_t[]", q), ffi.from_buffer("uint16_t[]", scales), w_ptr, out,
           inn)
    return q, scales


def dequantize_q8(q, scales):
    """W's values from its 8 bits: q int8 [out, in], scales uint16 (fp16 bits) or float16
    [out, in / Q8_BLOCK] -> w float32 [out, in] = q·scale, exactly. NumPy arrays only."""
    _numpy_only_q8("dequantize_q8", locals())
    a = _Args("pytfm_dequantize_q8", locals())
    q, scales, q_ptr, s_ptr = _q8_weights(a, "q", "scales", "out")
    w = _np.empty(q.shape, _np.float32)
    a.call(w, q_ptr, s_ptr, *q.shape)
    return w


def linear_forward_q8w(x, q, scales, b=None):
    """y = x·Wᵀ + b with W in 8 bits (quantize_q8's q, scales) and x quantised per block of
    Q8_BLOCK as llama.cpp's product does (integer dot products; pytfm_linear_forward_q8w says
    in which order the blocks' sums are combined: the same bits on every path and thread
    count). x [..., in] float32, b [out] float32 or None -> y [..., out]. NumPy arrays only."""
    _numpy_only_q8("linear_forward_q8w", locals())
    a = _Args("pytfm_linear_forward_q8w", locals())
    q, scales, q_ptr, s_ptr = _q8_weights(a, "q", "scales", "out")
    out, inn = q.shape
    x = a.array("x")
    if x.shape[-1] != inn:
        raise ValueError(f"x.shape[-1] must equal q.shape[1] = {inn} (in features), got "
                         f"x.shape {x.shape}")
    b = a.array("b", shape=(out,), because="q.shape[0]", optional=True)
    y = a.empty(x.shape[:-1] + (out,))
    a.call(y, x, q_ptr, s_ptr, b, x.size // inn, inn, out)
    return y


def embedding_forward_q8w(ids, q, scales, *, check_ids=True):
    """The rows of a table held in 8 bits, dequantised: ids int64 [...] in [0, vocab),
    q int8 [vocab, dim], scales [vocab, dim / Q8_BLOCK] -> y [..., dim] float32, exactly
    embedding_forward(ids, dequantize_q8(q, scales)). NumPy arrays only; the C kernel checks
    the ids (check_ids is for CuPy arrays, which this op does not take)."""
    _numpy_only_q8("embedding_forward_q8w", locals())
    a = _Args("pytfm_embedding_forward_q8w", locals())
    ids = a.array("ids", dtype=_I64, min_ndim=0)
    q, scales, q_ptr, s_ptr = _q8_weights(a, "q", "scales", "vocab")
    vocab, dim = q.shape
    a.ids("ids", vocab)
    y = a.empty(ids.shape + (dim,))
    a.call(y, ids, q_ptr, s_ptr, ids.size, vocab, dim)
    return y



def embedding_backward(dy, ids, vocab, *, dtable=None, check_ids=True):
    """dy [..., dim], ids int64 [...] -> dtable [vocab, dim] (repeated ids add up); check_ids as
    embedding_forward"""
    a = _Args("pytfm_embedding_backward", locals())
    ids = a.array("ids", dtype=_I64, min_ndim=0)
    dy = a.array("dy", last="the embedding dim", lead=ids.shape, because="ids.shape + (dim,)")
    dim = dy.shape[-1]
    vocab = a.int("vocab")
    if vocab < 1:
        raise ValueError(f"vocab must be >= 1, got {vocab}")
    dtable = a.grad("dtable", (vocab, dim))
    a.ids("ids", vocab)
    a.call(dtable, dy, ids, ids.size, vocab, dim)
    return dtable


# ---- cross-entropy --------------------------------------------------------------------------


def _cross_entropy_dims(a):
    """logits [..., vocab], targets int64 [...] -> logits, targets, vocab, ignore_index"""
    logits = a.array("logits", last="vocab, the number of classes")
    targets = a.array("targets", dtype=_I64, min_ndim=0, shape=logits.shape[:-1],
                      because="logits.shape[:-1]")
    ignore_index = a.int("ignore_index")
    a.ids("targets", logits.shape[-1], ignore_index)
    return logits, targets, logits.shape[-1], ignore_index


def cross_entropy_forward(logits, targets, ignore_index=-1, *, label_smoothing=0.0,
                          check_ids=True):
    """Mean softmax cross-entropy over targets != ignore_index (0.0 if there are none).

    logits [..., vocab], targets int64 [...] -> (loss, lse [...]): loss a 0-d float32 array
    where the logits are (NumPy or CuPy: nothing is read back; float(loss) reads it), lse the
    per-row log-sum-exp that cross_entropy_backward takes. label_smoothing ε in [0, 1]: each
    target is (1 − ε)·onehot + ε/vocab, as torch.nn.functional.cross_entropy's (0: none, the
    same bits as without it). check_ids=False: the caller checked the targets (on CuPy arrays
    the check reads the device).
    """
    a = _Args("pytfm_cross_entropy_forward", locals())
    logits, targets, vocab, ignore_index = _cross_entropy_dims(a)
    smoothing = a.float("label_smoothing")
    loss, lse = a.empty(()), a.empty(targets.shape)
    if smoothing != 0:  # NaN too: the C check names it
        a.kernel = "pytfm_cross_entropy_smoothed_forward"
        a.call(loss, lse, logits, targets, targets.size, vocab, ignore_index, smoothing)
    else:
        a.call(loss, lse, logits, targets, targets.size, vocab, ignore_index)
    return loss, lse


def cross_entropy_backward(logits, targets, lse, ignore_index=-1, dloss=1.0, *,
                           label_smoothing=0.0, check_ids=True):
    """-> dlogits [..., vocab], the gradient of dloss · loss; lse from cross_entropy_forward;
    label_smoothing and check_ids as cross_entropy_forward (label_smoothing the forward's)."""
    a = _Args("pytfm_cross_entropy_backward", locals())
    logits, targets, vocab, ignore_index = _cross_entropy_dims(a)
    lse = a.array("lse", min_ndim=0, shape=targets.shape, because="logits.shape[:-1]")
    dloss = a.float("dloss")
    smoothing = a.float("label_smoothing")
    dlogits = a.empty_like(logits)
    if smoothing != 0:
        a.kernel = "pytfm_cross_entropy_smoothed_backward"
        a.call(dlogits, logits, targets, lse, targets.size, vocab, ignore_index, smoothing, dloss)
    else:
        a.call(dlogits, logits, targets, lse, targets.size, vocab, ignore_index, dloss)
    return dlogits


# ---- adamw ----------------------------------------------------------------------------------


def adamw_step(param, grad, m, v, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One AdamW step (as torch.optim.AdamW), in place on param, m and v; returns None.

    param, grad, m, v: float32 arrays of one shape; step: the 1-based step number.
    """
    a = _Args("pytfm_adamw_step", locals())
    param = a.array("param", min_ndim=0, writable=True)
    same = dict(min_ndim=0, shape=param.shape, because="param.shape")
    grad = a.array("grad", **same)
    m, v = a.array("m", writable=True, **same), a.array("v", writable=True, **same)
    step = a.int("step")
    hyper = [a.float(name, kind="float64")
             for name in ("lr", "beta1", "beta2", "eps", "weight_decay")]
    a.call(param, m, v, grad, param.size, step, *hyper)


def sum_squares(x):
    """Σ x² over every element of the float32 array x, summed in double -> a 0-d float64 array
    where x is (NumPy or CuPy: nothing is read back; float() reads it). The same bits on every
    run and at any thread count; the CPU's and the GPU's agree to double rounding, not bit for
    bit (their partial sums are combined in another order)."""
    a = _Args("pytfm_sum_squares", locals())
    x = a.array("x", min_ndim=0)
    out = a.empty((), _F64)
    a.call(out, x, x.size)
    return out


# ---- the Llama family: RMSNorm, SwiGLU, RoPE from a table of frequencies ----------------------


def rmsnorm_forward(x, w, eps):
    """y = x / sqrt(mean(x²) + eps) · w.  x [..., cols], w [cols], eps (a config's
    rms_norm_eps) -> (y [..., cols], rstd [...])"""
    a = _Args("pytfm_rmsnorm_forward", locals())
    x, w, rows, cols = _layernorm_dims(a)
    eps = a.float("eps")
    y, rstd = a.empty_like(x), a.empty(x.shape[:-1])
    a.call(y, rstd, x, w, rows, cols, eps)
    return y, rstd


def rmsnorm_backward(dy, x, w, rstd, *, dw=None):
    """dy, x [..., cols], w [cols], rstd [...] -> (dx [..., cols], dw [cols])"""
    a = _Args("pytfm_rmsnorm_backward", locals())
    x, w, rows, cols = _layernorm_dims(a)
    dy = a.array("dy", shape=x.shape, because="x.shape")
    rstd = a.array("rstd", min_ndim=0, shape=x.shape[:-1], because="x.shape[:-1]")
    dw = a.grad("dw", (cols,))
    dx = a.empty_like(x)
    a.call(dx, dw, dy, x, w, rstd, rows, cols)
    return dx, dw


def swiglu_forward(g, u):
    """h = silu(g) · u, silu(g) = g·sigmoid(g).  g, u [...] (the gate and up products) -> h"""
    a = _Args("pytfm_swiglu_forward", locals())
    g = a.array("g", min_ndim=0)
    u = a.array("u", min_ndim=0, shape=g.shape, because="g.shape")
    h = a.empty_like(g)
    a.call(h, g, u, g.size)
    return h


def swiglu_backward(dh, g, u):
    """dh, g, u [...] (g, u the forward's inputs) -> (dg, du) [...]"""
    a = _Args("pytfm_swiglu_backward", locals())
    g = a.array("g", min_ndim=0)
    u = a.array("u", min_ndim=0, shape=g.shape, because="g.shape")
    dh = a.array("dh", min_ndim=0, shape=g.shape, because="g.shape")
    dg, du = a.empty_like(g), a.empty_like(g)
    a.call(dg, du, dh, g, u, g.size)
    return dg, du


_ROPE_SCALINGS = {None: 0, "default": 0, "llama3": 1}


def rope_inv_freq(D, theta, scaling=None):
    """The frequencies of rope_freq_forward, once per model: inv_freq[i] = theta^(−2i/D) for
    i < D/2, then scaled as a config's rope_scaling says: None (or {"rope_type": "default"}) or
    a dict of rope_type "llama3" (or the older key "type") with factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings (transformers' llama3 rule).
    -> inv_freq float32 [D/2] (a NumPy array: copy it to the GPU once, with the model)"""
    a = _Args("pytfm_rope_inv_freq", locals())
    D, theta = a.int("D"), a.float("theta", kind="float64")
    if D < 2 or D % 2:
        raise ValueError(f"D (head dim) must be even and >= 2, got {D}")
    if scaling is not None and not isinstance(scaling, dict):
        raise TypeError(f"scaling must be None or a dict (a config's rope_scaling), "
                        f"got {type(scaling).__name__}")
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind not in _ROPE_SCALINGS:
        raise ValueError(f"scaling's rope_type must be 'default' or 'llama3', got {kind!r}")
    params = [1.0, 1.0, 2.0, 1.0]
    if _ROPE_SCALINGS[kind] == 1:
        keys = ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")
        missing = [k for k in keys if k not in scaling]
        if missing:
            raise ValueError(f"scaling of rope_type 'llama3' needs {', '.join(missing)}")
        params = [_as_float(f"scaling[{k!r}]", scaling[k], "float64") for k in keys]
    inv_freq = a.empty((D // 2,))
    a.call(inv_freq, D, theta, _ROPE_SCALINGS[kind], *params)
    return inv_freq


def _rope_freq(a, name):
    """Rotate the [B, T, H, D] argument `name` by the angles pos · inv_freq"""
    x = a.array(name, ndim=4)
    B, T, H, D = x.shape
    if D < 2 or D % 2:
        raise ValueError(f"{name}.shape[3] (head dim D) must be even and >= 2 for RoPE, "
                         f"got {x.shape}")
    pos = a.array("pos", dtype=_I64)
    if pos.shape not in ((T,), (B, T)):
        raise ValueError(f"pos must have shape (T,) = {(T,)} or (B, T) = {(B, T)} for {name} "
                         f"of shape {x.shape}, got {pos.shape}")
    stride = T if pos.ndim == 2 else 0
    inv_freq = a.array("inv_freq", shape=(D // 2,), because=f"{name}.shape[3] // 2")
    y = a.empty_like(x)
    a.call(y, x, pos, inv_freq, B, T, H, D, stride)
    return y


def rope_freq_forward(x, pos, inv_freq):
    """Rotary embedding, rotate-half pairing (Hugging Face's), angles pos · inv_freq (see
    rope_inv_freq).  x [B, T, H, D], pos int64 [T] or [B, T], inv_freq [D/2] -> y"""
    return _rope_freq(_Args("pytfm_rope_freq_forward", locals()), "x")


def rope_freq_backward(dy, pos, inv_freq):
    """The inverse rotation.  dy [B, T, H, D], pos, inv_freq as the forward -> dx"""
    return _rope_freq(_Args("pytfm_rope_freq_backward", locals()), "dy")


# ---- attention ------------------------------------------------------------------------------


def _attention_gpu_only(a, precision):
    """The C attention kernels are FP32 only: "tf32" and "bf16" are the GPU's tensor cores"""
    if precision != "fp32" and not a.gpu:
        raise ValueError(f"precision {precision!r} of attention runs on CuPy arrays only (the "
                         "GPU's tensor cores); on NumPy arrays use 'fp32'")


def _kv_heads(a, q, names):
    """The key/value arrays `names` of queries q [B, Tq, H, D]: each [B, Tk, Hkv, D] of the
    first one's shape (any Tk), Hkv dividing H (grouped-query heads; Hkv = H: multi-head)
    -> arrays, Hkv"""
    B, _, H, D = q.shape
    first = a.array(names[0], ndim=4, last="head dim D")
    Hkv = first.shape[2]
    if (first.shape[0], first.shape[3]) != (B, D) or Hkv < 1 or H % Hkv:
        raise ValueError(
            f"{names[0]} must have shape (B, Tk, Hkv, D) = ({B}, Tk, Hkv, {D}) with Hkv "
            f"dividing q's H = {H} (grouped-query heads), got {first.shape}")
    like = dict(ndim=4, shape=first.shape, because=f"{names[0]}.shape")
    return [first] + [a.array(name, **like) for name in names[1:]], Hkv


def _lengths(a, name, value, B, T, what):
    """q_lens or k_lens: None, or B lengths in [0, T] (`what` names T): a list or tuple of ints,
    a NumPy integer array, or with CuPy arrays a CuPy one -> None, or a C-contiguous int64
    array of the call's backend (NumPy; CuPy: a copy on the device when given on the host)"""
    if value is None:
        return None
    if _is_cupy(value):
        if not a.gpu:
            raise TypeError(f"{name} is a CuPy array but q is a NumPy array: pass the lengths as "
                            "a list, tuple or NumPy array")
        xp = a.xp
    elif isinstance(value, (list, tuple)):
        value = _np.array([_as_int(f"{name}[{i}]", x) for i, x in enumerate(value)], _I64)
        xp = _np
    elif isinstance(value, _np.ndarray):
        xp = _np
    else:
        raise TypeError(f"{name} must be None or B = {B} lengths (a list, tuple or int64 array), "
                        f"got {type(value).__name__}")
    if value.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
    if value.shape != (B,):
        raise ValueError(f"{name} must have shape (B,) = ({B},) (one length per sequence), got "
                         f"{value.shape}")
    bad = (value < 0) | (value > T)
    if bool(bad.any()):  # (CuPy: one read of the device)
        i = int(bad.argmax())
        raise ValueError(f"{name}[{i}] = {int(value[i])} is outside [0, {T}] ({what})")
    value = xp.ascontiguousarray(value, dtype=_I64)
    return a.xp.asarray(value) if a.gpu and xp is _np else value


def _attention_kernel(direction, precision, H, Hkv, window, padded):
    """The kernel of an attention call, in its precision (see _precise): the multi-head one
    (Hkv = H, no window), the grouped-query/windowed one, or with lengths or Tq != Tk (padded)
    the padded one (FP32 only) -> (name, extra arguments)"""
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: no sliding window), got {window}")
    if padded:
        if precision != "fp32":
            raise ValueError(f"precision {precision!r} of attention takes neither q_lens, k_lens "
                             "nor Tk != Tq (its tensor-core kernels are not generalised): use "
                             "precision='fp32'")
        return f"pytfm_attention_padded_{direction}", ()
    if Hkv == H and window == 0:
        return _precise(f"pytfm_attention_{direction}", precision)
    return _precise(f"pytfm_attention_gqa_{direction}", precision)


def _window_causal(window, causal):
    if window and not causal:
        raise ValueError(f"window = {window} needs causal=True (a sliding window is causal)")


def _attention_args(kernel, named):
    """Args of an attention call (the lengths apart: on the host they go with CuPy arrays too)
    -> Args, q_lens, k_lens as given"""
    lens = named.pop("q_lens"), named.pop("k_lens")
    return _Args(kernel, named), *lens


def _attention_lengths(a, kernel, q_lens, k_lens, B, Tq, Tk):
    """The checked lengths (see _lengths) of a call of kernel"""
    if a.gpu and not hasattr(_core.lib, kernel + "_cuda"):
        raise TypeError(f"this build has no {kernel}_cuda (q_lens, k_lens or Tk != Tq on CuPy "
                        "arrays): pass NumPy arrays")
    return (_lengths(a, "q_lens", q_lens, B, Tq, "Tq, q's axis 1"),
            _lengths(a, "k_lens", k_lens, B, Tk, "Tk, k's axis 1"))


def attention_forward(q, k, v, causal=True, scale=None, precision="fp32", window=0, *,
                      q_lens=None, k_lens=None):
    """Multi-head scaled dot-product attention, flash-style (no [Tq, Tk] matrix is stored),
    with grouped-query heads, a sliding window, Tq queries on Tk keys and padded sequences.

    q [B, Tq, H, D], k, v [B, Tk, Hkv, D] -> (o [B, Tq, H, D], lse [B, H, Tq]); Hkv divides H and
    query head h reads key/value head h // (H // Hkv) (transformers' repeat_kv; Hkv = 1:
    multi-query). causal: query i sees keys s <= i (top-left aligned when Tq != Tk, torch's
    is_causal). window: 0, or w > 0 with causal: query i sees keys i - w < s <= i
    (transformers' sliding window). q_lens, k_lens: None, or B lengths (a list, tuple or int64
    array; on CuPy arrays a CuPy array too): sequence b has the queries [0, q_lens[b]) and
    the keys [0, k_lens[b]) (padding masks); a row that sees no key gets o = 0 and lse = -inf
    (see pytfm_attention_padded_forward). D is any head dim >= 1 (CuPy arrays: <= 128). scale
    defaults to 1/sqrt(D). precision: "fp32", or on CuPy arrays without lengths and with
    Tq = Tk "tf32" or "bf16" (Q·Kᵀ and P·V on the tensor cores, their inputs rounded to the
    format, the softmax and every sum in float32: see pytfm_attention_forward_ex_cuda; head
    dims other than 16, 32, 64, 128 stay FP32).
    """
    a, q_lens, k_lens = _attention_args("pytfm_attention_forward", locals())
    _attention_gpu_only(a, precision)
    q = a.array("q", ndim=4, last="head dim D")
    (k, v), Hkv = _kv_heads(a, q, ("k", "v"))
    B, Tq, H, D = q.shape
    Tk = k.shape[1]
    window = a.int("window")
    padded = q_lens is not None or k_lens is not None or Tk != Tq
    kernel, extra = _attention_kernel("forward", precision, H, Hkv, window, padded)
    a.kernel = kernel
    scale = a.float("scale", default=1.0 / math.sqrt(D))
    causal = a.bool("causal")
    _window_causal(window, causal)
    if padded:
        q_lens, k_lens = _attention_lengths(a, kernel, q_lens, k_lens, B, Tq, Tk)
    o, lse = a.empty_like(q), a.empty((B, H, Tq))
    if padded:
        a.call(o, lse, q, k, v, q_lens, k_lens, B, Tq, Tk, H, Hkv, D, scale, causal, window)
    elif kernel.startswith("pytfm_attention_gqa"):
        a.call(o, lse, q, k, v, B, Tq, H, Hkv, D, scale, causal, window, *extra)
    else:
        a.call(o, lse, q, k, v, B, Tq, H, D, scale, causal, *extra)
    return o, lse


def attention_backward(dy, q, k, v, o, lse, causal=True, scale=None, precision="fp32",
                       window=0, *, q_lens=None, k_lens=None):
    """dy [B, Tq, H, D], the gradient of o -> (dq [B, Tq, H, D], dk, dv [B, Tk, Hkv, D]: each
    the sum over its group's query heads); o and lse from attention_forward with the same
    causal, scale, precision, window and lengths (see attention_forward and
    pytfm_attention_backward_ex_cuda). Padded rows get dq = 0, padded keys dk = dv = 0."""
    a, q_lens, k_lens = _attention_args("pytfm_attention_backward", locals())
    _attention_gpu_only(a, precision)
    q, dy, o = a.heads("q", "dy", "o")
    (k, v), Hkv = _kv_heads(a, q, ("k", "v"))
    B, Tq, H, D = q.shape
    Tk = k.shape[1]
    window = a.int("window")
    padded = q_lens is not None or k_lens is not None or Tk != Tq
    kernel, extra = _attention_kernel("backward", precision, H, Hkv, window, padded)
    a.kernel = kernel
    lse = a.array("lse", shape=(B, H, Tq), because="(B, H, Tq) of q")
    scale = a.float("scale", default=1.0 / math.sqrt(D))
    causal = a.bool("causal")
    _window_causal(window, causal)
    if padded:
        q_lens, k_lens = _attention_lengths(a, kernel, q_lens, k_lens, B, Tq, Tk)
    dq, dk, dv = a.empty_like(q), a.empty_like(k), a.empty_like(k)
    if padded:
        a.call(dq, dk, dv, dy, q, k, v, o, lse, q_lens, k_lens, B, Tq, Tk, H, Hkv, D, scale,
               causal, window)
    elif kernel.startswith("pytfm_attention_gqa"):
        a.call(dq, dk, dv, dy, q, k, v, o, lse, B, Tq, H, Hkv, D, scale, causal, window, *extra)
    else:
        a.call(dq, dk, dv, dy, q, k, v, o, lse, B, Tq, H, D, scale, causal, *extra)
    return dq, dk, dv


def _cache_dims(a, new, writable=False, grouped=False, bits=False):
    """The new tokens' [B, n_new, H, D] array `new` and the caches [B, Tmax, Hkv, D] they go
    with (writable: for an append; grouped: Hkv divides H, else Hkv = H; bits: the caches are
    uint16 BF16 bits, else float32) -> new, k_cache, v_cache, (B, n_new, H, Hkv, D, Tmax, start)"""
    x = a.array(new, ndim=4, last="head dim D")
    if bits:
        k_cache, v_cache = _bf16_caches(a, writable)
    else:
        k_cache, v_cache = a.heads("k_cache", "v_cache", writable=writable)
    B, n_new, H, D = x.shape
    Bc, Tmax, Hc, Dc = k_cache.shape
    if (Bc, Dc) != (B, D) or (Hc != H and not (grouped and Hc >= 1 and H % Hc == 0)):
        heads = "Hkv dividing H" if grouped else "H"
        raise ValueError(
            f"k_cache must have shape (B, Tmax, {heads}, D) = ({B}, Tmax, "
            f"{'Hkv' if grouped else H}, {D}) to match {new} of shape {x.shape}, got "
            f"{k_cache.shape}"
        )
    start = a.int("start")
    if start < 0 or start + n_new > Tmax:
        raise ValueError(
            f"cache overflow: positions [{start}, {start + n_new}) do not fit in a cache of "
            f"Tmax = {Tmax} (start must be in [0, Tmax - n_new])"
        )
    return x, k_cache, v_cache, (B, n_new, H, Hc, D, Tmax, start)


def attention_cache_append(k_cache, v_cache, k, v, start):
    """Write k, v [B, n_new, Hkv, D] into the caches [B, Tmax, Hkv, D] at positions
    [start, start + n_new) (Hkv: the key/value heads, H without grouped-query heads)."""
    a = _Args("pytfm_attention_cache_append", locals())
    k, k_cache, v_cache, (B, n_new, H, _, D, Tmax, start) = _cache_dims(a, "k", writable=True)
    v = a.array("v", ndim=4, shape=k.shape, because="k.shape")
    a.call(k_cache, v_cache, k, v, B, n_new, H, D, Tmax, start)


def attention_decode(q, k_cache, v_cache, start, scale=None, window=0):
    """Causal attention of queries q [B, n_new, H, D] at positions [start, start + n_new) to
    the cached keys and values [B, Tmax, Hkv, D] at positions [0, start + n_new) (Hkv divides
    H, as attention_forward; window: as attention_forward, keys after position − window).
    -> (o [B, n_new, H, D], lse [B, H, n_new])"""
    a = _Args("pytfm_attention_decode", locals())
    q, k_cache, v_cache, dims = _cache_dims(a, "q", grouped=True)
    B, n_new, H, Hkv, D, Tmax, start = dims
    window = a.int("window")
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: no sliding window), got {window}")
    scale = a.float("scale", default=1.0 / math.sqrt(D))
    o, lse = a.empty_like(q), a.empty((B, H, n_new))
    if Hkv == H and window == 0:
        a.call(o, lse, q, k_cache, v_cache, B, n_new, H, D, Tmax, start, scale)
    else:
        a.kernel = "pytfm_attention_gqa_decode"
        a.call(o, lse, q, k_cache, v_cache, *dims, scale, window)
    return o, lse


def _bf16_caches(a, writable):
    """k_cache and v_cache of a BF16 KV cache: NumPy uint16 arrays [B, Tmax, Hkv, D] of one
    shape (a float32 cache is refused: it has its own ops)"""
    for name in ("k_cache", "v_cache"):
        v = a.named[name]
        if isinstance(v, _np.ndarray) and v.dtype != _U16:
            raise TypeError(f"{name} must be a uint16 array of BF16 bits (a BF16 KV cache, as "
                            f"KVCache(..., dtype='bf16') holds), got dtype {v.dtype}; a float32 "
                            "cache goes to attention_cache_append / attention_decode")
    k_cache = a.array("k_cache", dtype=_U16, ndim=4, last="head dim D", writable=writable)
    v_cache = a.array("v_cache", dtype=_U16, ndim=4, shape=k_cache.shape,
                      because="k_cache.shape", writable=writable)
    return k_cache, v_cache


def _u16(x):
    return _core.ffi.from_buffer("uint16_t[]", x)


def attention_cache_append_bf16(k_cache, v_cache, k, v, start):
    """attention_cache_append into a BF16 KV cache: k, v [B, n_new, Hkv, D] float32 rounded to
    BF16 (to nearest even, as round_bf16) and their bits written into k_cache, v_cache
    [B, Tmax, Hkv, D] uint16 at positions [start, start + n_new). NumPy arrays only."""
    _numpy_only("attention_cache_append_bf16", locals(), "attention_cache_append",
                "a BF16 KV cache is")
    a = _Args("pytfm_attention_cache_append_bf16", locals())
    k, k_cache, v_cache, dims = _cache_dims(a, "k", writable=True, bits=True)
    B, n_new, H, _, D, Tmax, start = dims
    v = a.array("v", ndim=4, shape=k.shape, because="k.shape")
    a.call(_u16(k_cache), _u16(v_cache), k, v, B, n_new, H, D, Tmax, start)


def attention_gqa_decode_bf16kv(q, k_cache, v_cache, start, scale=None, window=0):
    """attention_decode on a BF16 KV cache: k_cache, v_cache [B, Tmax, Hkv, D] uint16 BF16 bits
    (attention_cache_append_bf16), read as their float32 widening; q [B, n_new, H, D] float32.
    The bits of attention_decode(q, from_bf16_bits(k_cache), from_bf16_bits(v_cache), ...).
    -> (o [B, n_new, H, D], lse [B, H, n_new]). NumPy arrays only."""
    _numpy_only("attention_gqa_decode_bf16kv", locals(), "attention_decode",
                "a BF16 KV cache is")
    a = _Args("pytfm_attention_gqa_decode_bf16kv", locals())
    q, k_cache, v_cache, dims = _cache_dims(a, "q", grouped=True, bits=True)
    window = a.int("window")
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: no sliding window), got {window}")
    scale = a.float("scale", default=1.0 / math.sqrt(dims[4]))
    o, lse = a.empty_like(q), a.empty((dims[0], dims[2], dims[1]))
    a.call(o, lse, q, _u16(k_cache), _u16(v_cache), *dims, scale, window)
    return o, lse
