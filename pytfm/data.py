"""pytfm.data — byte-level text, a corpus every machine has, batches, a synthetic task."""

import os
import sysconfig

import numpy as np

VOCAB = 256  # one token per byte


def encode(text):
    """str -> int64 array of its UTF-8 bytes."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def decode(ids):
    """int array of bytes -> str (invalid UTF-8 sequences become U+FFFD)."""
    return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


def stdlib_corpus(max_bytes=4_000_000):
    """The default corpus: the running interpreter's standard library sources, the top-level
    *.py files in sorted order, up to max_bytes. Present wherever Python is; no download."""
    root = sysconfig.get_paths()["stdlib"]
    parts, size = [], 0
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(root, name), "rb") as f:
            data = f.read()
        parts.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    if not parts:
        raise RuntimeError(f"no .py files found in the standard library at {root}")
    return np.frombuffer(b"".join(parts)[:max_bytes], dtype=np.uint8).astype(np.int64)


def text_corpus(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 2:
        raise ValueError(f"{path}: needs at least 2 bytes of text, got {len(data)}")
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


class Batches:
    """Random windows of a token array, split into train and validation (the last val_frac of
    the tokens, and at least one window's worth).

    batch(split, step) depends only on (seed, split, step), so a resumed run sees the same
    batches as an uninterrupted one.
    """

    def __init__(self, tokens, block, batch_size, seed=0, val_frac=0.1):
        n_val = max(int(len(tokens) * val_frac), block + 1)
        if len(tokens) - n_val < block + 1:
            raise ValueError(f"corpus of {len(tokens)} tokens is too short for windows of {block}")
        self.splits = {"train": tokens[:-n_val], "val": tokens[-n_val:]}
        self.block, self.batch_size, self.seed = block, batch_size, seed

    def batch(self, split, step):
        data = self.splits[split]
        rng = np.random.default_rng([self.seed, split == "val", step])
        starts = rng.integers(0, len(data) - self.block, size=self.batch_size)
        x = np.stack([data[s:s + self.block] for s in starts])
        y = np.stack([data[s + 1:s + 1 + self.block] for s in starts])
        return x, y


def reverse_task(rng, batch_size, n=8, n_symbols=10):
    """Sequences 'a1 .. an SEP an .. a1' for learning checks: x (B, 2n), targets (B, 2n) with
    -1 (ignored) except where the reversed half is predicted. Symbols are 0..n_symbols-1 and
    SEP is n_symbols."""
    a = rng.integers(0, n_symbols, size=(batch_size, n))
    seq = np.concatenate([a, np.full((batch_size, 1), n_symbols), a[:, ::-1]], axis=1)
    x, y = seq[:, :-1].copy(), seq[:, 1:].copy()
    y[:, :n] = -1  # the first half is random and SEP is fixed: score the reversal only
    return x.astype(np.int64), y.astype(np.int64)
