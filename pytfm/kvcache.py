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
    """

    def __init__(self, batch, max_len, n_head, head_dim, device="cpu"):
        shape = (as_int("batch", batch), as_int("max_len", max_len), as_int("n_head", n_head),
                 as_int("head_dim", head_dim))
        if min(shape) < 1:
            raise ValueError(f"KVCache sizes must all be >= 1, got {shape}")
        xp = devices.array_module(device)
        self.k = xp.zeros(shape, np.float32)  # (B, Tmax, H, D)
        self.v = xp.zeros(shape, np.float32)
        self.device = device
        self.length = 0  # positions [0, length) hold keys and values

    def __len__(self):
        return self.length

    def attend(self, q, k, v, scale=None):  # q, k, v (B, n_new, H, D) -> o (B, n_new, H, D)
        # check q, k, v and scale before anything is written to the cache
        a = Args("pytfm_attention_decode", locals())
        q, k, v = a.heads("q", "k", "v")
        scale = a.float("scale", default=1.0 / math.sqrt(q.shape[3]))
        start = self.length
        ops.attention_cache_append(self.k, self.v, k, v, start)
        o, _ = ops.attention_decode(q, self.k, self.v, start, scale)
        self.length = start + q.shape[1]
        return o

    def reset(self):
        """Forget every position (the arrays are reused)."""
        self.length = 0
