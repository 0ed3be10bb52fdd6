"""pytfm.generate — sampling from a GPT through its KV caches.

The prompt is run once through decode() (filling the caches), then each new token costs one
decode step over the cache: O(context) work per token, not a full recomputation.
"""

import numpy as np


def sample_next(logits, rng, temperature=1.0, top_k=None):
    """logits (B, vocab) -> int64 (B,): greedy when temperature == 0, else sampled from
    softmax(logits / temperature) restricted to the top_k largest logits."""
    if temperature == 0:
        return logits.argmax(axis=-1).astype(np.int64)
    z = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    u = rng.random((z.shape[0], 1))
    return np.minimum((p.cumsum(axis=-1) < u).sum(axis=-1), z.shape[-1] - 1).astype(np.int64)


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, seed=0):
    """Continue prompt (int64 (B, T0), T0 >= 1) by max_new_tokens tokens
    -> (B, T0 + max_new_tokens).
    The total length may not exceed model.cfg.max_seq. Same seed, same tokens."""
    prompt = np.asarray(prompt, dtype=np.int64)
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must have shape (B, T) with T >= 1, got {prompt.shape}")
    if prompt.shape[1] + max_new_tokens > model.cfg.max_seq:
        raise ValueError(f"prompt of {prompt.shape[1]} tokens + {max_new_tokens} new ones exceeds "
                         f"max_seq = {model.cfg.max_seq}")
    rng = np.random.default_rng(seed)
    caches = model.new_caches(prompt.shape[0])
    logits = model.decode(prompt, caches)[:, -1]
    out = [prompt]
    for i in range(max_new_tokens):
        token = sample_next(logits, rng, temperature, top_k)[:, None]
        out.append(token)
        if i + 1 < max_new_tokens:
            logits = model.decode(token, caches)[:, -1]
    return np.concatenate(out, axis=1)
