"""pytfm.data — byte-level text, a corpus every machine has, batches, a synthetic task.

A byte-level corpus is held as its bytes, uint8, one token per byte: a text takes its own size
in memory, and Batches makes int64 ids of each batch's windows only (an int64 copy of the whole
text would take 8 times its size).
"""

import os
import stat
import sysconfig

import numpy as np

VOCAB = 256  # one token per byte
CHUNK = 1 << 24  # bytes read at a time from an input of unknown size (a pipe)


class TextTooLarge(ValueError):
    """A text longer than the bytes the caller allows (text_corpus's max_bytes)."""


def encode(text):
    """str -> int64 array of its UTF-8 bytes."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def decode(ids):
    """int array of bytes -> str (invalid UTF-8 sequences become U+FFFD)."""
    return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


def stdlib_corpus(max_bytes=4_000_000):
    """The default corpus: the running interpreter's standard library sources, the top-level
    *.py files in sorted order, up to max_bytes, as uint8 tokens (its bytes). Present wherever
    Python is; no download."""
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
    return np.frombuffer(bytearray(b"".join(parts)[:max_bytes]), dtype=np.uint8)  # writable


def text_corpus(source, max_bytes=None):
    """The bytes of a text as uint8 tokens, read once into one buffer of their size.

    source: a path, or a binary file open for reading, read from where it stands (a pipe can
    be read only once: a caller that opened it to check it passes that file). max_bytes: at
    most this many bytes (None: no limit); a longer text is a TextTooLarge error, raised before
    anything is read when the size is known (a regular file) and else once the input passes
    max_bytes (a pipe, or an endless device like /dev/zero), so that no more than max_bytes + 1
    bytes are ever held. Fewer than 2 bytes is a ValueError (one window needs an input and a
    target)."""
    if isinstance(source, (str, bytes, os.PathLike)):
        with open(source, "rb", buffering=0) as f:
            return text_corpus(f, max_bytes)
    name = getattr(source, "name", "the text")
    st = os.fstat(source.fileno())
    if stat.S_ISREG(st.st_mode):
        size = max(st.st_size - source.tell(), 0)
        if max_bytes is not None and size > max_bytes:
            raise TextTooLarge(f"{name} is {size:,} bytes, more than the {max_bytes:,} allowed")
        data = _read_exactly(source, size)
    else:
        data = _read_until(source, max_bytes, name)
    if len(data) < 2:
        raise ValueError(f"{name}: needs at least 2 bytes of text, got {len(data)}")
    return np.frombuffer(data, dtype=np.uint8)


def _read_exactly(f, size):
    """Up to size bytes of f into one bytearray (fewer if it ends first: a file cut meanwhile);
    what a file grows by while it is read is not read."""
    data = bytearray(size)
    view, n = memoryview(data), 0
    while n < size:
        got = f.readinto(view[n:])
        if not got:
            break
        n += got
    view.release()
    del data[n:]
    return data


def _read_until(f, max_bytes, name):
    """All of f, read CHUNK bytes at a time into one growing bytearray (resized in place: no
    second copy), or TextTooLarge once it passes max_bytes."""
    data = bytearray()
    while True:
        want = CHUNK if max_bytes is None else min(CHUNK, max_bytes + 1 - len(data))
        chunk = f.read(want)
        if not chunk:
            return data
        data += chunk
        if max_bytes is not None and len(data) > max_bytes:
            raise TextTooLarge(f"{name} gives more than the {max_bytes:,} bytes allowed "
                               "(an endless input?)")


class Batches:
    """Random windows of a token array (any integer dtype: uint8 for bytes), split into train
    and validation (the last val_frac of the tokens, and at least one window's worth). The
    tokens are kept as they are (views, no copy); each batch is int64, (batch_size, block).

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
        x = np.stack([data[s:s + self.block] for s in starts]).astype(np.int64, copy=False)
        y = np.stack([data[s + 1:s + 1 + self.block] for s in starts]).astype(np.int64, copy=False)
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
