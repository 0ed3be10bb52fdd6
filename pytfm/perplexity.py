"""pytfm.perplexity — how well a model predicts a text: perplexity and bits per byte, the
measure of what a precision costs (as llama.cpp's llama-perplexity measures a model).

    from pytfm import perplexity as ppl
    r = ppl.perplexity(model, ids, context=512, batch=4)    # {"nll", "tokens", "perplexity", ...}
    ppl.bits_per_byte(r["nll"], ppl.predicted_bytes(ids, r["context"], tok))

`python -m pytfm perplexity PATH TEXT_FILE` (pytfm.cli.perplexity) is this module on a file.

The definition (docs/perplexity.md). The token ids are cut into consecutive, non-overlapping
windows of `context` tokens (the last one may be shorter). Within a window every token after
the first is predicted from the tokens before it in that window, and from nothing else: each
window is one forward from position 0, so a window's first token is never predicted, and a
window of one token predicts nothing. With N the number of predicted tokens (n - windows for n
ids) and NLL the sum of their negative log-likelihoods (nats), perplexity = exp(NLL / N).

Each token's NLL is lse - logit[target] of its row of logits: the log-sum-exp from the model's
cross-entropy kernel (ops.cross_entropy_forward), both float32, their difference taken in
float64. NLL is the exactly rounded sum (math.fsum) of those float64 values, so it does not
depend on the order the windows run in, nor on how many run at once given the same per-token
values: `batch` windows of one length run in one forward.

Bits per byte = NLL / ln 2 / B, B the bytes of text the predicted tokens stand for: each
token's bytes as decoding puts them in running text (predicted_bytes). Not the text's whole
size: the window's first tokens are not predicted, and dividing by their bytes too would lower
the figure by an amount that depends on the context.
"""

import math

import numpy as np

from . import device as devices
from . import ops
from .nn import GPT

_BYTE_TOKEN = b"<0x"  # a byte-fallback token of a text tokenizer: <0xNN>, one byte
_METASPACE = "\u2581".encode()  # a text tokenizer's space


def windows_of(n, context):
    """The windows n token ids are cut into: [(start, length)], consecutive, each `context`
    long but the last (n - start)."""
    return [(s, min(context, n - s)) for s in range(0, n, context)]


def perplexity(model, ids, context=None, batch=1, progress=None):
    """The perplexity of model on the token ids (a 1-D sequence of ints in [0, vocab)), in
    windows of context tokens (default: model.cfg.max_seq; 2 .. max_seq), batch windows per
    forward (>= 1), as the module defines it. -> {"nll": the total negative log-likelihood in
    nats, "tokens": N, the tokens predicted, "perplexity": exp(nll / N), "windows": how many
    the ids were cut into, "context": the window's length}.

    The model runs as it is: on its device, in its precision (model.set_precision), without
    saving anything for a backward. progress(windows_done, windows, nll, tokens), when given,
    is called after each forward with the figures so far. A forward holds batch · context ·
    vocab float32 logits. Bad arguments: TypeError or ValueError naming them."""
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a pytfm.nn.GPT, got {type(model).__name__}")
    max_seq, vocab = model.cfg.max_seq, model.cfg.vocab
    context = max_seq if context is None else _int("context", context)
    if not 2 <= context <= max_seq:
        raise ValueError(f"context must be in [2, {max_seq}] (the model's max_seq), got "
                         f"{context}: a window of one token predicts nothing")
    batch = _int("batch", batch)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, got {type(progress).__name__}")
    ids = token_ids(ids, vocab)
    if len(ids) < 2:
        raise ValueError(f"ids must hold at least 2 tokens (one predicted), got {len(ids)}")

    windows = windows_of(len(ids), context)
    groups = []  # (start, rows, length): `rows` consecutive windows of one length, one forward
    for start, length in windows:
        if length < 2:
            continue  # predicts nothing
        if groups and groups[-1][2] == length and groups[-1][1] < batch:
            s, rows, _ = groups[-1]
            groups[-1] = (s, rows + 1, length)
        else:
            groups.append((start, 1, length))
    nll = np.empty(sum(rows * (length - 1) for _, rows, length in groups))
    at = done = 0
    for start, rows, length in groups:
        x = ids[start:start + rows * length].reshape(rows, length)  # consecutive windows
        rows_nll = _window_nll(model, x).reshape(-1)
        nll[at:at + rows_nll.size] = rows_nll
        at, done = at + rows_nll.size, done + rows
        if progress is not None:
            progress(done, len(windows), math.fsum(nll[:at]), at)
    total = math.fsum(nll)
    return {"nll": total, "tokens": len(nll), "perplexity": math.exp(total / len(nll)),
            "windows": len(windows), "context": context}


def _window_nll(model, x):  # int64 (B, T) host ids -> float64 (B, T - 1) host NLLs
    """The NLL of each of x's tokens after the first, each row one window from position 0."""
    targets = np.empty_like(x)
    targets[:, :-1], targets[:, -1] = x[:, 1:], -1  # the last token predicts past the window
    dev = model.device
    x_d, t_d = devices.to_device(x, dev), devices.to_device(targets, dev)
    logits, _ = model.forward(x_d, save=False, check_ids=False)  # ids checked by the caller
    _, lse = ops.cross_entropy_forward(logits, t_d, check_ids=False)  # (B, T)
    rows, cols = x.shape[0], x.shape[1] - 1
    xp = model.xp
    picked = logits[xp.arange(rows)[:, None], xp.arange(cols)[None, :], x_d[:, 1:]]  # (B, T-1)
    lse, picked = devices.to_host(lse[:, :-1]), devices.to_host(picked)
    return lse.astype(np.float64) - picked.astype(np.float64)


def token_ids(ids, vocab):
    """ids as a C-contiguous int64 NumPy array of one dimension, each in [0, vocab), or a
    TypeError or ValueError naming ids."""
    a = devices.to_host(ids)
    if a.dtype.kind not in "iu" and a.size:  # [] reads as float64: an empty sequence
        raise TypeError(f"ids must be integer token ids, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"ids must be one sequence of token ids (1-D), got shape {a.shape}")
    if a.size and (a.min() < 0 or a.max() >= vocab):
        bad = a[(a < 0) | (a >= vocab)][0]
        raise ValueError(f"ids must be in [0, {vocab}) (the model's vocabulary), got {bad}")
    return np.ascontiguousarray(a, np.int64)


def token_byte_lengths(tok, vocab):
    """int64 [vocab]: the bytes each token id stands for in running text. tok None (a
    byte-level model, one token per byte): 1 each. A byte-level BPE (GPT-2's, Llama 3's,
    Qwen's): its bytes, tok.token_bytes(i), which decoding concatenates. A text tokenizer
    (tok.text_tokens: Llama 2's, Gemma's): <0xNN> one byte, any other its name with U+2581 as
    the space decoding makes of it. Ids past the tokenizer's (a vocabulary padded to a
    multiple of 64) stand for 0 bytes."""
    if tok is None:
        return np.ones(vocab, np.int64)
    lengths = np.zeros(vocab, np.int64)
    for i in range(min(len(tok), vocab)):
        b = tok.token_bytes(i)
        if tok.text_tokens:
            is_byte = len(b) == 6 and b.startswith(_BYTE_TOKEN) and b.endswith(b">")
            b = b"x" if is_byte else b.replace(_METASPACE, b" ")
        lengths[i] = len(b)
    return lengths


def predicted_bytes(ids, context, tok=None):
    """B: the bytes of text that the tokens perplexity(model, ids, context) predicts stand for,
    the sum of token_byte_lengths over every token but each window's first. Exact: these are
    the bytes decoding gives for those tokens, which are the text's own when the tokenizer
    gives the text back (decode_bytes(encode(text)) == text: every text for a byte-level
    model or a byte-level BPE without a normalizer; Llama 2's adds a space before the first
    token, which is never predicted)."""
    ids = token_ids(ids, 2**63 - 1)
    context = _int("context", context)
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context}")
    vocab = int(ids.max()) + 1 if ids.size else 1
    if tok is not None:
        vocab = max(vocab, len(tok))
    lengths = token_byte_lengths(tok, vocab)[ids]
    return int(lengths.sum() - lengths[::context].sum())


def bits_per_byte(nll, n_bytes):
    """nll (nats) / ln 2 / n_bytes: the bits per byte of text (n_bytes > 0; predicted_bytes)."""
    if not n_bytes > 0:
        raise ValueError(f"n_bytes must be > 0, got {n_bytes}")
    return float(nll) / math.log(2) / n_bytes


def _int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)
