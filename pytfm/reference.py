"""pytfm.reference — the NumPy float64 oracle of every op, forward and backward.

Written to be read like the maths, not to be fast. Every backend is tested against these
functions, and these backward functions are tested against finite differences. Production code
never imports this module.

Shapes use the words of pytfm.h: [rows, cols] for row-wise ops (every leading dimension is a
row), in and out features, vocab (embedding rows, cross-entropy classes), dim, [B, T, H, D] for
heads; dy is the gradient arriving from above, lse a saved log-sum-exp.
Parameter gradients are returned, not accumulated.
"""

import numpy as np

GELU_K = np.sqrt(2.0 / np.pi)
GELU_A = 0.044715


def _f64(*arrays):
    return [None if a is None else np.asarray(a, dtype=np.float64) for a in arrays]


BF16_MAX = (2 - 2**-7) * 2.0**127  # the largest BF16 value: 8 significant bits


def round_bf16(x):  # float32 [...] -> float32 [...]: each value rounded to BF16
    """x to the nearest number of 8 significant bits, ties to even, as pytfm's BF16 products
    take their inputs: |x| in [2^e, 2^(e+1)) is rounded to a multiple of 2^(e-7) (np.rint: ties
    to even); BF16_MAX plus half its ulp or more is inf; NaN stays NaN, ±inf stays; a float32
    subnormal (|x| < 2^-126) is a zero of its sign. In float64, where every step is exact."""
    with np.errstate(invalid="ignore"):  # a signalling NaN's cast says so; it stays NaN
        x = np.asarray(x, dtype=np.float32).astype(np.float64)
    finite = np.isfinite(x)
    _, e = np.frexp(np.where(finite, x, 1.0))  # |x| = m·2^e, m in [0.5, 1): e - 1 as above
    ulp = np.ldexp(1.0, e - 8)
    y = np.where(finite, np.rint(np.where(finite, x, 0.0) / ulp) * ulp, x)
    y = np.where(np.abs(y) > BF16_MAX, np.copysign(np.inf, x), y)
    y = np.where(np.abs(x) < 2.0**-126, np.copysign(0.0, x), y)
    return y.astype(np.float32)


def linear_forward(x, w, b=None):  # [..., in], [out, in], [out] -> [..., out]
    x, w, b = _f64(x, w, b)
    y = x @ w.T
    return y if b is None else y + b


def widen_bf16(h):  # uint16 [...] -> float64 [...]: the BF16 bits h as numbers
    """The value of each BF16 bit pattern: sign, 8 exponent bits (bias 127; 0: subnormal, 255:
    inf or NaN) and 7 fraction bits, read field by field (not through the float32 bit trick
    the library uses)."""
    h = np.asarray(h, dtype=np.uint16).astype(np.int64)
    sign = np.where(h >> 15, -1.0, 1.0)
    e, f = (h >> 7) & 0xFF, (h & 0x7F).astype(np.float64)
    normal = np.ldexp(1.0 + f / 128, np.maximum(e, 1) - 127)
    value = np.where(e == 0, np.ldexp(f / 128, -126), normal)
    value = np.where(e == 255, np.where(f == 0, np.inf, np.nan), value)
    return sign * value


def linear_forward_bf16w(x, w16, b=None):  # [..., in], uint16 [out, in], [out] -> [..., out]
    """x·Wᵀ + b on what the BF16 product multiplies: x rounded to BF16 and W the BF16 values
    w16 holds, taken as round_bf16 takes them (a subnormal is a zero of its sign)."""
    w = widen_bf16(w16)
    w = np.where(np.abs(w) < 2.0**-126, np.copysign(0.0, w), w)
    return linear_forward(round_bf16(x), w, b)

Q8_BLOCK = 32  # 8-bit weights: values per block, each block with one fp16 scale


def quantize_q8(w):  # float32 [out, in] -> int8 [out, in], uint16 [out, in / 32] (fp16 bits)
    """pytfm_quantize_q8's rounding, step by step: per block of 32, d = fp16(float32(amax /
    127)) (numpy's float16 cast rounds to nearest even), q = the float32 quotient w / d rounded
    half away from zero, clamped to ±127; d = 0 gives q = 0."""
    w = np.asarray(w, dtype=np.float32)
    out, inn = w.shape
    blocks = w.reshape(out, inn // Q8_BLOCK, Q8_BLOCK)
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(over="ignore"):
        d16 = (amax / np.float32(127)).astype(np.float16)
    d = d16.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (blocks / np.where(d > 0, d, np.float32(1))).astype(np.float64)  # float32 quotient
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)  # half away from zero (exact in float64)
    q = np.where(d > 0, np.clip(q, -127, 127), 0)
    return q.astype(np.int8).reshape(out, inn), d16.view(np.uint16)


def dequantize_q8(q, scales):  # int8 [out, in], uint16 [out, in / 32] -> [out, in]
    d = np.asarray(scales, dtype=np.uint16).view(np.float16).astype(np.float64)
    q = np.asarray(q).astype(np.float64)
    return (q.reshape(*d.shape, Q8_BLOCK) * d[..., None]).reshape(q.shape)


def quantize_x_q8(x):  # float32 [rows, in] -> qx float64 [rows, in], dx float64 [rows, in / 32]
    """x's rows as the 8-bit product quantises them: dx = float32(amax / 127), qx = the float32
    quotient x / dx rounded to nearest, ties to even (np.rint), 0 where dx is 0."""
    x = np.asarray(x, dtype=np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, Q8_BLOCK)
    dx = np.abs(blocks).max(axis=-1) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        qx = np.rint(blocks / np.where(dx > 0, dx, np.float32(1))[..., None])
    qx = np.where(dx[..., None] > 0, np.clip(qx, -127, 127), 0.0)
    return qx.reshape(x.shape).astype(np.float64), dx.astype(np.float64)


def linear_forward_q8w(x, q, scales, b=None):  # [..., in], int8 [out, in], [out, in / 32]
    """What the 8-bit product computes, exactly: x quantised per block (quantize_x_q8), each
    block's integer dot product scaled by dw·dx (the float32 product of the two scales), summed
    in float64; + b."""
    x = np.asarray(x, dtype=np.float32)
    qx, dx = quantize_x_q8(x.reshape(-1, x.shape[-1]))
    dw = np.asarray(scales, dtype=np.uint16).view(np.float16).astype(np.float32)
    out = np.shape(q)[0]
    qw = np.asarray(q).astype(np.float64).reshape(out, -1, Q8_BLOCK)
    isum = np.einsum("rki,oki->rok", qx.reshape(len(qx), -1, Q8_BLOCK), qw)
    scale = (dw[None, :, :] * dx.astype(np.float32)[:, None, :]).astype(np.float64)
    y = (isum * scale).sum(axis=-1)
    if b is not None:
        y = y + np.asarray(b, dtype=np.float64)
    return y.reshape(*x.shape[:-1], out)


def embedding_forward_q8w(ids, q, scales):  # int [...], int8 [vocab, dim], [vocab, dim/32]
    return dequantize_q8(q, scales)[np.asarray(ids)]



def linear_backward(dy, x, w):  # [..., out], [..., in], [out, in] -> dx, dw, db
    dy, x, w = _f64(dy, x, w)
    dy2, x2 = dy.reshape(-1, w.shape[0]), x.reshape(-1, w.shape[1])
    return dy @ w, dy2.T @ x2, dy2.sum(axis=0)


def softmax_forward(x):  # [..., cols] -> [..., cols]
    (x,) = _f64(x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_backward(dy, y):  # [..., cols], [..., cols] -> [..., cols]
    dy, y = _f64(dy, y)
    return y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def layernorm_forward(x, w, b, eps=1e-5):  # [..., cols], [cols], [cols] -> y, mean, rstd [...]
    x, w, b = _f64(x, w, b)
    mean = x.mean(axis=-1)
    rstd = 1.0 / np.sqrt(((x - mean[..., None]) ** 2).mean(axis=-1) + eps)
    xhat = (x - mean[..., None]) * rstd[..., None]
    return xhat * w + b, mean, rstd


def layernorm_backward(dy, x, w, mean, rstd):  # [..., cols] x2, [cols], [...] x2 -> dx, dw, db
    dy, x, w, mean, rstd = _f64(dy, x, w, mean, rstd)
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dy * w
    dx = rstd[..., None] * (
        g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True)
    )
    cols = x.shape[-1]
    return dx, (dy * xhat).reshape(-1, cols).sum(axis=0), dy.reshape(-1, cols).sum(axis=0)


def sinusoidal_positions(T, dim):  # -> [T, dim]: sin on even features, cos on odd
    pos = np.arange(T)[:, None]
    inv = 10000.0 ** (-np.arange(0, dim, 2) / dim)
    pe = np.zeros((T, dim))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos * inv), np.cos(pos * inv)
    return pe


def rope_angles(pos, D, base=10000.0):  # [T] or [B, T] -> [T, D/2] or [B, T, D/2]
    inv_freq = base ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    return np.asarray(pos, dtype=np.float64)[..., None] * inv_freq


def rope_forward(x, pos, base=10000.0):  # [B, T, H, D], [T] or [B, T] -> [B, T, H, D]
    (x,) = _f64(x)
    half = x.shape[-1] // 2
    theta = rope_angles(pos, x.shape[-1], base)[..., None, :]  # (B|1, T, 1, D/2)
    cos, sin = np.cos(theta), np.sin(theta)
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1)


def rope_backward(dy, pos, base=10000.0):  # [B, T, H, D], [T] or [B, T] -> [B, T, H, D]
    (dy,) = _f64(dy)
    half = dy.shape[-1] // 2
    theta = rope_angles(pos, dy.shape[-1], base)[..., None, :]
    cos, sin = np.cos(theta), np.sin(theta)
    d0, d1 = dy[..., :half], dy[..., half:]
    return np.concatenate([d0 * cos + d1 * sin, d1 * cos - d0 * sin], axis=-1)


def _gelu_halves(x):  # [...] -> ½(1 + tanh u), ½(1 − tanh² u) for u = K(x + A x³)
    """Both without cancellation: where tanh u is near ±1, 1 ± tanh u is computed from
    e = e^(−2|u|) (1 + tanh u = 2e/(1 + e) for u < 0; 1 − tanh² u = 4e/(1 + e)²), which never
    overflows: every float32 x, up to ±FLT_MAX, gives finite values (x³ fits in float64)."""
    u = GELU_K * (x + GELU_A * x**3)
    e = np.exp(-2.0 * np.abs(u))
    t = np.tanh(u)
    return np.where(u < 0, e / (1.0 + e), 0.5 * (1.0 + t)), 2.0 * e / (1.0 + e) ** 2


def gelu_forward(x):  # [...] -> [...]
    """0.5 x (1 + tanh u); +inf -> +inf, -inf -> NaN (-inf · 0), NaN -> NaN."""
    (x,) = _f64(x)
    s, _ = _gelu_halves(x)
    with np.errstate(invalid="ignore"):
        return x * s


def gelu_backward(dy, x):  # [...], [...] -> [...]
    """dy (½(1 + tanh u) + x ½(1 − tanh² u) K (1 + 3A x²)); x = ±inf or NaN -> NaN."""
    dy, x = _f64(dy, x)
    s, q = _gelu_halves(x)
    with np.errstate(invalid="ignore"):
        return dy * (s + x * q * GELU_K * (1.0 + 3.0 * GELU_A * x**2))


def embedding_forward(ids, table):  # int [...], [vocab, dim] -> [..., dim]
    (table,) = _f64(table)
    return table[np.asarray(ids)]


def embedding_forward_bf16w(ids, table16):  # int [...], uint16 [vocab, dim] -> [..., dim]
    return widen_bf16(table16)[np.asarray(ids)]


def embedding_backward(dy, ids, vocab):  # [..., dim], int [...] -> [vocab, dim]
    (dy,) = _f64(dy)
    dtable = np.zeros((vocab, dy.shape[-1]))
    np.add.at(dtable, np.asarray(ids).reshape(-1), dy.reshape(-1, dy.shape[-1]))
    return dtable


def cross_entropy_forward(logits, targets, ignore_index=-1, label_smoothing=0.0):  # -> loss, lse
    # logits [..., vocab], targets int [...], lse [...]; the target (1 − ε)·onehot + ε/vocab
    (logits,) = _f64(logits)
    targets = np.asarray(targets)
    m = logits.max(axis=-1)
    lse = m + np.log(np.exp(logits - m[..., None]).sum(axis=-1))
    keep = targets != ignore_index
    picked = np.take_along_axis(logits, np.where(keep, targets, 0)[..., None], -1)[..., 0]
    per_row = lse - picked
    if label_smoothing:
        e = label_smoothing
        per_row = (1 - e) * per_row + e * (lse - logits.mean(axis=-1))
    loss = per_row[keep].sum() / keep.sum() if keep.any() else 0.0
    return loss, lse


def cross_entropy_backward(logits, targets, ignore_index=-1, dloss=1.0, label_smoothing=0.0):
    # -> [..., vocab]
    (logits,) = _f64(logits)
    targets = np.asarray(targets)
    keep = targets != ignore_index
    if not keep.any():
        return np.zeros_like(logits)
    p = softmax_forward(logits)
    vocab = logits.shape[-1]
    e = label_smoothing
    target = (1 - e) * np.eye(vocab)[np.where(keep, targets, 0)] + e / vocab
    return (p - target) * keep[..., None] * (dloss / keep.sum())


def adamw_step(param, grad, m, v, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """[...] x4 -> (param, m, v) after one step (new arrays; the inputs are not touched)."""
    param, grad, m, v = _f64(param, grad, m, v)
    param = param * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * grad
    v = beta2 * v + (1.0 - beta2) * grad**2
    mhat = m / (1.0 - beta1**step)
    vhat = v / (1.0 - beta2**step)
    return param - lr * mhat / (np.sqrt(vhat) + eps), m, v


# ---- the Llama family: RMSNorm, SwiGLU, RoPE from a table of frequencies --------------------


def rmsnorm_forward(x, w, eps):  # [..., cols], [cols] -> y [..., cols], rstd [...]
    x, w = _f64(x, w)
    rstd = 1.0 / np.sqrt((x**2).mean(axis=-1) + eps)
    return x * rstd[..., None] * w, rstd


def rmsnorm_backward(dy, x, w, rstd):  # [..., cols] x2, [cols], [...] -> dx, dw
    dy, x, w, rstd = _f64(dy, x, w, rstd)
    xhat = x * rstd[..., None]
    g = dy * w
    dx = rstd[..., None] * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)


def _sigmoid(g):  # [...] -> [...], without overflow: e^(−|g|) <= 1
    e = np.exp(-np.abs(g))
    return np.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def swiglu_forward(g, u):  # [...], [...] -> h [...]
    g, u = _f64(g, u)
    return g * _sigmoid(g) * u


def swiglu_backward(dh, g, u):  # [...] x3 -> dg, du
    dh, g, u = _f64(dh, g, u)
    s = _sigmoid(g)
    return dh * u * s * (1.0 + g * (1.0 - s)), dh * g * s


def rope_inv_freq(D, theta, scaling=None):  # -> [D/2]
    """theta^(−2i/D), then transformers' llama3 rule when scaling's rope_type says so."""
    inv_freq = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        return inv_freq
    factor, lo_f, hi_f = (scaling[k] for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv_freq
    s = (old / wavelen - lo_f) / (hi_f - lo_f)
    medium = (1 - s) * inv_freq / factor + s * inv_freq
    return np.where(wavelen < old / hi_f, inv_freq,
                    np.where(wavelen > old / lo_f, inv_freq / factor, medium))


def rope_freq_forward(x, pos, inv_freq):  # [B, T, H, D], [T] or [B, T], [D/2] -> [B, T, H, D]
    x, inv_freq = _f64(x, inv_freq)
    half = x.shape[-1] // 2
    theta = np.asarray(pos, dtype=np.float64)[..., None, None] * inv_freq  # (B|1, T, 1, D/2)
    cos, sin = np.cos(theta), np.sin(theta)
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1)


def rope_freq_backward(dy, pos, inv_freq):  # [B, T, H, D], [T] or [B, T], [D/2] -> [B, T, H, D]
    return rope_freq_forward(dy, np.negative(pos), inv_freq)


def attention_mask(T, causal, window=0, start=0, Tk=None):  # -> bool [T, Tk]: query t sees s
    """Query t (at position start + t) sees key s: every s, or causal s <= start + t, and with
    a sliding window w > 0 also s > start + t − w (transformers' sliding_window_overlay)"""
    if window and not causal:
        raise ValueError(f"window = {window} needs causal attention")
    Tk = T if Tk is None else Tk
    t = start + np.arange(T)[:, None]
    s = np.arange(Tk)[None, :]
    seen = (s <= t) if causal else np.ones((T, Tk), bool)
    return seen & (s > t - window) if window else seen


def _grouped(q, k):  # [B, T, H, D], [B, S, Hkv, D] -> q [B, T, Hkv, G, D]: head h = kv·G + g
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"k's heads Hkv = {Hkv} must divide q's H = {H}")
    return q.reshape(B, T, Hkv, H // Hkv, D)


def attention_seen(B, Tq, Tk, causal, window=0, q_lens=None, k_lens=None):  # -> bool
    # [B, Tq, Tk]: query i of sequence b sees key s (attention_mask's rule, top-left aligned),
    # and i < q_lens[b], s < k_lens[b] (None: every row, every key)
    seen = np.broadcast_to(attention_mask(Tq, causal, window, Tk=Tk), (B, Tq, Tk))
    if q_lens is not None:
        seen = seen & (np.arange(Tq)[None, :, None] < np.asarray(q_lens)[:, None, None])
    if k_lens is not None:
        seen = seen & (np.arange(Tk)[None, None, :] < np.asarray(k_lens)[:, None, None])
    return seen


def attention_scores(q, k, causal, scale=None, window=0, q_lens=None, k_lens=None):
    # [B, Tq, H, D], [B, Tk, Hkv, D] -> [B, H, Tq, Tk]: -inf where attention_seen is False
    q, k = _f64(q, k)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    B, Tq, H, _ = q.shape
    Tk = k.shape[1]
    S = np.einsum("btkgd,bskd->bkgts", _grouped(q, k), k).reshape(B, H, Tq, Tk) * scale
    seen = attention_seen(B, Tq, Tk, causal, window, q_lens, k_lens)
    return np.where(seen[:, None], S, -np.inf)


def _attention_probs(S):  # [..., Tq, Tk] (-inf: not seen) -> P, lse [..., Tq]: a row that
    # sees no key has P = 0 and lse = -inf
    seen = S > -np.inf
    m = S.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(seen, np.exp(np.where(seen, S, m) - m), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(total))[..., 0]
    return e / np.where(total > 0, total, 1.0), lse


def attention_forward(q, k, v, causal=True, scale=None, window=0, *, q_lens=None, k_lens=None):
    # q [B, Tq, H, D], k, v [B, Tk, Hkv, D] (Hkv divides H: head h reads kv head h // (H/Hkv))
    # -> o [B, Tq, H, D], lse [B, H, Tq]; sequence b: queries < q_lens[b], keys < k_lens[b]
    # (None: all); a row that sees no key gets o = 0, lse = -inf
    S = attention_scores(q, k, causal, scale, window, q_lens, k_lens)
    P, lse = _attention_probs(S)  # (B, H, Tq, Tk), materialised: this is the naive version
    B, H, Tq, Tk = P.shape
    Hkv = k.shape[2]
    P = P.reshape(B, Hkv, H // Hkv, Tq, Tk)
    o = np.einsum("bkgts,bskd->btkgd", P, np.asarray(v, np.float64))
    return o.reshape(q.shape), lse


def attention_cache_append_bf16(k_cache, v_cache, k, v, start):  # uint16 [B, Tmax, Hkv, D],
    # k, v [B, n_new, Hkv, D] -> the caches with positions [start, start + n_new) the BF16 bits
    # of k and v (round_bf16's upper halves); new arrays
    k_cache, v_cache = np.array(k_cache, np.uint16), np.array(v_cache, np.uint16)
    at = slice(start, start + np.shape(k)[1])
    for cache, x in ((k_cache, k), (v_cache, v)):
        cache[:, at] = (round_bf16(x).view(np.uint32) >> 16).astype(np.uint16)
    return k_cache, v_cache


def attention_gqa_decode_bf16kv(q, k_cache, v_cache, start, scale=None, window=0):  # q [B,n,H,D],
    # caches uint16 [B, Tmax, Hkv, D] -> o [B, n, H, D], lse [B, H, n]: query i at position
    # start + i attends to the widened keys and values [0, start + i] (with a window, after
    # start + i − window)
    n_new, Tk = q.shape[1], start + q.shape[1]
    k, v = (widen_bf16(np.asarray(c)[:, :Tk]).astype(np.float64) for c in (k_cache, v_cache))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    G = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    S = np.einsum("bthd,bshd->bhts", np.asarray(q, np.float64), k) * scale
    S = np.where(attention_mask(n_new, True, window, start, Tk), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(S - m).sum(axis=-1))
    return np.einsum("bhts,bshd->bthd", np.exp(S - lse[..., None]), v), lse


def attention_backward(dy, q, k, v, causal=True, scale=None, window=0, *, q_lens=None,
                       k_lens=None):  # -> dq, dk, dv
    # dy, q [B, Tq, H, D], k, v [B, Tk, Hkv, D]; dk, dv sum over the heads of a group; the
    # lengths as the forward's (a row that sees no key has P = 0: no gradient either way)
    dy, q, k, v = _f64(dy, q, k, v)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    B, Tq, H, _ = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    P, _ = _attention_probs(attention_scores(q, k, causal, scale, window, q_lens, k_lens))
    dyg, qg = _grouped(dy, k), _grouped(q, k)
    Pg = P.reshape(B, Hkv, H // Hkv, Tq, Tk)
    dv = np.einsum("bkgts,btkgd->bskd", Pg, dyg)
    dP = np.einsum("btkgd,bskd->bkgts", dyg, v)
    dS = softmax_backward(dP, Pg) * scale
    dq = np.einsum("bkgts,bskd->btkgd", dS, k).reshape(q.shape)
    return dq, np.einsum("bkgts,btkgd->bskd", dS, qg), dv
