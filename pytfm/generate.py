"""pytfm.generate — sampling from a GPT through its KV caches.

The prompt is run once through decode() (filling the caches), then each new token costs one
decode step over the cache: O(context) work per token, not a full recomputation.

For a model on the GPU the prompt is copied there and decoding runs there; each step reads the
last position's logits (B, vocab) back and samples on the host, with the same NumPy generator
and float64 arithmetic as on the CPU: the tokens are the CPU's wherever the logits are.
"""

import math
import operator

import numpy as np

from . import device as devices
from ._arrays import as_float, as_int
from .nn import GPT


def _sampling(temperature, top_k):
    """The checked (temperature, top_k): temperature a finite real >= 0, top_k None or an
    integer >= 1."""
    temperature = as_float("temperature", temperature, "float64")
    if not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be finite and >= 0 (0: greedy), got {temperature}")
    if top_k is not None and as_int("top_k", top_k) < 1:
        raise ValueError(f"top_k must be >= 1 (None: no top-k cut), got {top_k}")
    return temperature, top_k


def _check_logits(logits):
    """logits, once it is a NumPy float array (B, vocab), vocab >= 1, of finite values (as the
    C pytfm_sample wants): NaN or inf would pick token 0 or the last one without a word."""
    if not isinstance(logits, np.ndarray):
        raise TypeError(f"logits must be a numpy.ndarray of floats, of shape (B, vocab); got "
                        f"{type(logits).__name__}")
    if logits.dtype.kind != "f":
        raise TypeError(f"logits must be a numpy.ndarray of floats, of shape (B, vocab); got "
                        f"dtype {logits.dtype}")
    if logits.ndim != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits must have shape (B, vocab) with vocab >= 1, got {logits.shape}")
    finite = np.isfinite(logits)
    if not finite.all():
        where = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(f"logits must be finite, got logits{list(where)} = {logits[where]}")
    return logits


def sample_next(logits, rng, temperature=1.0, top_k=None):
    """logits (B, vocab), finite -> int64 (B,): greedy when temperature == 0, else sampled from
    softmax(logits / temperature) restricted to the top_k largest logits (top_k None: all).
    rng: a numpy.random.Generator (np.random.default_rng(seed)), or anything with its
    random(shape) method; greedy sampling draws nothing from it."""
    temperature, top_k = _sampling(temperature, top_k)
    logits = _check_logits(logits)
    if temperature > 0 and not callable(getattr(rng, "random", None)):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    if temperature == 0:
        return logits.argmax(axis=-1).astype(np.int64)
    # shift before dividing: with a tiny temperature, logits / temperature alone overflows
    z = logits.astype(np.float64)
    z = (z - z.max(axis=-1, keepdims=True)) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    u = rng.random((z.shape[0], 1))
    return np.minimum((p.cumsum(axis=-1) < u).sum(axis=-1), z.shape[-1] - 1).astype(np.int64)


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, seed=0,
             sample_vocab=None, kv_cache="fp32"):
    """Continue prompt (int64 (B, T0), T0 >= 1) by max_new_tokens (>= 0) tokens
    -> (B, T0 + max_new_tokens).
    sample_vocab (1 <= it <= model.cfg.vocab; None: model.cfg.vocab): new tokens are drawn
    among ids [0, sample_vocab) only. A model whose vocabulary is padded past its tokenizer's
    (nanoGPT's 50,304 beside GPT-2's 50,257) passes the tokenizer's size: the padding's ids,
    which no text decodes to, are never drawn (their logits are left out, as if -inf), so every
    new token decodes. The C example generate.c does the same (pytfm_sample on the first ids).
    The total length may not exceed model.cfg.max_seq. Same seed (an integer >= 0), same
    tokens; seed None draws fresh randomness. The prompt may be a NumPy or a CuPy array; the
    result is a NumPy array, whatever model.device is. Logits that are not finite (a model
    whose parameters hold NaN or inf) are a ValueError, as in the C pytfm_sample.
    kv_cache: the KV cache's precision, "fp32" or "bf16" (half its memory; CPU only; the keys
    and values rounded to BF16 as they are cached, pytfm.kvcache.KVCache)."""
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a pytfm.nn.GPT, got {type(model).__name__}")
    prompt = devices.to_host(prompt)
    if prompt.dtype.kind not in "iu":  # 1.5 or True must not become a token id silently
        raise TypeError(f"prompt must hold integer token ids, got dtype {prompt.dtype}")
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must have shape (B, T) with T >= 1, got {prompt.shape}")
    vocab = model.cfg.vocab
    bad = (prompt < 0) | (prompt >= vocab)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"prompt{list(where)} = {prompt[where]} is outside [0, {vocab})")
    prompt = prompt.astype(np.int64)
    if as_int("max_new_tokens", max_new_tokens) < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    temperature, top_k = _sampling(temperature, top_k)
    sample_vocab = vocab if sample_vocab is None else as_int("sample_vocab", sample_vocab)
    if not 1 <= sample_vocab <= vocab:
        raise ValueError(f"sample_vocab must be in [1, model.cfg.vocab = {vocab}] (None: all), "
                         f"got {sample_vocab}")
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError("seed must be an integer or None, got bool")
    try:
        if seed is not None and operator.index(seed) < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
    except TypeError:
        raise TypeError(f"seed must be an integer or None, got {type(seed).__name__}") from None
    if prompt.shape[1] + max_new_tokens > model.cfg.max_seq:
        raise ValueError(f"prompt of {prompt.shape[1]} tokens + {max_new_tokens} new ones exceeds "
                         f"max_seq = {model.cfg.max_seq}")
    if kv_cache not in ("fp32", "bf16"):
        raise ValueError(f"kv_cache must be 'fp32' or 'bf16' (the KV cache's precision), got "
                         f"{kv_cache!r}")
    rng = np.random.default_rng(seed)
    device = getattr(model, "device", "cpu")
    caches = model.new_caches(prompt.shape[0], prompt.shape[1] + max_new_tokens,
                              precision=kv_cache)
    # the prompt was checked above, and sampled tokens are below vocab: no check on the GPU
    logits = model.decode(devices.to_device(prompt, device), caches, check_ids=False)[:, -1]
    out = [prompt]
    for i in range(max_new_tokens):
        try:
            token = sample_next(devices.to_host(logits)[:, :sample_vocab], rng, temperature,
                                top_k)[:, None]
        except ValueError as e:  # the logits' values: the rest was checked above
            raise ValueError(f"generate: the model's logits for new token {i} (of "
                             f"{max_new_tokens}): {e}; are its parameters finite?") from None
        out.append(token)
        if i + 1 < max_new_tokens:
            token = devices.to_device(token, device)
            logits = model.decode(token, caches, check_ids=False)[:, -1]
    return np.concatenate(out, axis=1)
