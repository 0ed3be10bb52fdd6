"""pytfm.kvcache — the keys and values of the tokens decoded so far, for generation.

The one stateful piece of the Python API: pytfm.ops stays stateless (attention_cache_append and
attention_decode take the cache arrays as arguments); KVCache owns those arrays and the count
of positions filled.
"""

import math

import numpy as np

from . import device as devices
from . import ops
from ._arrays import Args, as_int


class KVCache:
    """Keys and values of the tokens seen so far, for decoding one (or a few) tokens at a time.

        cache = KVCache(batch=1, max_len=128, n_head=4, head_dim=16)
        o = cache.attend(q, k, v)   # q, k, v [B, n_new, H, D] of the n_new new tokens

    attend() appends k and v at positions [len(cache), len(cache) + n_new) and returns the
    causal attention of q to everything cached: the same result as ops.attention_forward over
    the whole sequence, at O(len·D) per new token. The caches live on device: NumPy arrays
    for "cpu", CuPy arrays for "cuda" (then q, k, v are CuPy arrays too).

    Grouped-query heads: n_kv_head (dividing n_head; None: n_head) key/value heads are cached,
    [B, max_len, n_kv_head, head_dim] each, and attend() takes k, v of n_kv_head heads beside
    q of n_head. window (0: none): the sliding window of ops.attention_forward; the cache still
    keeps every position (max_len of them).

    precision: "fp32" (default) keeps float32 keys and values; "bf16" keeps their BF16 bits
    (uint16 arrays, half the bytes: what grows with a long context), each rounded to nearest
    even as it is appended, attention reading their float32 widening. Its results are exactly
    those of an "fp32" cache to which k and v are appended rounded (ops.round_bf16): the
    rounding is the only difference. CPU only.
    """

    PRECISIONS = ("fp32", "bf16")

    def __init__(self, batch, max_len, n_head, head_dim, device="cpu", n_kv_head=None,
                 window=0, precision="fp32"):
        n_head = as_int("n_head", n_head)
        n_kv_head = n_head if n_kv_head is None else as_int("n_kv_head", n_kv_head)
        shape = (as_int("batch", batch), as_int("max_len", max_len), n_kv_head,
                 as_int("head_dim", head_dim))
        if min(shape + (n_head,)) < 1:
            raise ValueError(f"KVCache sizes must all be >= 1, got {shape} and n_head {n_head}")
        if n_head % n_kv_head:
            raise ValueError(f"n_kv_head = {n_kv_head} must divide n_head = {n_head}")
        self.window = as_int("window", window)
        if self.window < 0:
            raise ValueError(f"window must be >= 0 (0: no sliding window), got {self.window}")
        if not isinstance(precision, str) or precision not in self.PRECISIONS:
            raise ValueError(f"precision must be one of {self.PRECISIONS}, got {precision!r}")
        if precision == "bf16" and device != "cpu":
            raise ValueError(f"precision='bf16' (a BF16 KV cache) runs on the CPU only, got "
                             f"device={device!r}: use precision='fp32' there")
        self.precision = precision
        xp = devices.array_module(device)
        kind = np.uint16 if precision == "bf16" else np.float32  # BF16 bits, or float32
        self.k = xp.zeros(shape, kind)  # (B, Tmax, Hkv, D)
        self.v = xp.zeros(shape, kind)
        self.n_head = n_head
        self.device = device
        self.length = 0  # positions [0, length) hold keys and values

    def __len__(self):
        return self.length

    def attend(self, q, k, v, scale=None):  # q (B, n_new, H, D), k, v (B, n_new, Hkv, D)
        # check q, k, v and scale before anything is written to the cache -> o (B, n_new, H, D)
        a = Args("pytfm_attention_decode", locals())
        q = a.array("q", ndim=4, last="head dim D")
        B, n_new, _, D = q.shape
        if q.shape[2] != self.n_head:
            raise ValueError(f"q must have n_head = {self.n_head} heads, got shape {q.shape}")
        like = dict(ndim=4, shape=(B, n_new, self.k.shape[2], D),
                    because="q's (B, n_new) and D, and the cache's n_kv_head")
        k, v = a.array("k", **like), a.array("v", **like)
        scale = a.float("scale", default=1.0 / math.sqrt(D))
        start = self.length
        if self.precision == "bf16":
            ops.attention_cache_append_bf16(self.k, self.v, k, v, start)
            o, _ = ops.attention_gqa_decode_bf16kv(q, self.k, self.v, start, scale,
                                                   window=self.window)
        else:
            ops.attention_cache_append(self.k, self.v, k, v, start)
            o, _ = ops.attention_decode(q, self.k, self.v, start, scale, window=self.window)
        self.length = start + n_new
        return o

    def reset(self):
        """Forget every position (the arrays are reused)."""
        self.length = 0

    def reorder(self, index):
        """Keep the batch rows index (B' >= 1 ints in [0, batch): a list, tuple, NumPy or CuPy
        int array; a row may repeat or go): row i becomes old row index[i], with every
        position filled so far (beam search: the hypotheses that survive a step)."""
        index = devices.to_host(index)
        B = self.k.shape[0]
        if index.dtype.kind not in "iu" or index.ndim != 1 or index.size == 0:
            raise ValueError(f"index must be B' >= 1 batch rows (a 1-D int array), got dtype "
                             f"{index.dtype}, shape {index.shape}")
        bad = (index < 0) | (index >= B)
        if bad.any():
            i = int(bad.argmax())
            raise ValueError(f"index[{i}] = {int(index[i])} is not a row of a batch of {B}")
        rows = devices.to_device(index.astype(np.int64), self.device)
        self.k = self.k[rows]  # fresh C-contiguous arrays: the old rows stay as they were
        self.v = self.v[rows]
