"""pytfm._ctokenizer — the C tokenizer (pytfm_tokenizer.h) from Python: GPT-2's byte-level BPE
in libpytfm, token for token what pytfm.tokenizer gives, faster.

    tok = CTokenizer.from_folder("gpt2")        # vocab.json + merges.txt, or tokenizer.json
    ids = tok.encode("Hello world")             # a NumPy int32 array: [15496, 995]
    tok.decode_bytes(ids)                       # b'Hello world'

encode takes a str (valid Unicode: a lone surrogate is a ValueError) or any bytes; invalid
UTF-8 bytes are tokenized as pytfm.tokenizer's bytes path has it, so decode_bytes(encode(b)) ==
b for any bytes b. A bad file raises TokenizerError with the C library's message (the file and
what is wrong).
"""

import os

import numpy as np

from ._core import ffi, lib
from .tokenizer import TokenizerError, folder_files, token_ids

__all__ = ["CTokenizer", "unicode_version"]

_ONE_PASS = 1 << 24  # bytes of text encoded in one pass; a longer one is counted first


def _error():
    return ffi.string(lib.pytfm_last_error()).decode("utf-8", "replace")


def _check(status, what):
    if status == lib.PYTFM_STATUS_OK:
        return
    message = _error()
    if status == lib.PYTFM_STATUS_OUT_OF_MEMORY:
        raise MemoryError(f"{what}: {message}")
    raise ValueError(f"{what}: {message}")


def unicode_version():
    """The Unicode version of the C pre-tokenizer's character classes, e.g. '14.0.0'."""
    return ffi.string(lib.pytfm_tokenizer_unicode_version()).decode()


def _path(path, name):
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} must be a path, got {type(path).__name__}")
    return os.fsencode(path)


class CTokenizer:
    """A GPT-2-style byte-level BPE opened by the C library. len(tok): the vocabulary's size;
    .eot: the id of <|endoftext|> (None when the vocabulary has none)."""

    def __init__(self, handle):
        self._tok = ffi.gc(handle, lib.pytfm_tokenizer_close)
        eot = lib.pytfm_tokenizer_eot(handle)
        self.eot = None if eot < 0 else int(eot)
        self.n_merges = int(lib.pytfm_tokenizer_merge_count(handle))

    @classmethod
    def _open(cls, opener, *args):
        out = ffi.new("pytfm_tokenizer **")
        status = opener(*args, out)
        if status != lib.PYTFM_STATUS_OK:
            message = _error()
            if status == lib.PYTFM_STATUS_OUT_OF_MEMORY:
                raise MemoryError(message)
            raise TokenizerError(message)
        return cls(out[0])

    @classmethod
    def from_files(cls, vocab_path, merges_path):
        """GPT-2's vocab.json (encoder.json) and merges.txt (vocab.bpe)."""
        return cls._open(lib.pytfm_tokenizer_open, _path(vocab_path, "vocab_path"),
                         _path(merges_path, "merges_path"))

    @classmethod
    def from_tokenizer_json(cls, path):
        """Hugging Face's tokenizer.json of a GPT-2-style byte-level BPE."""
        return cls._open(lib.pytfm_tokenizer_open_json, _path(path, "path"))

    @classmethod
    def from_memory(cls, vocab, merges):
        """The texts (bytes) of a vocab.json and a merges.txt."""
        return cls._open(lib.pytfm_tokenizer_open_memory, bytes(vocab), len(vocab),
                         bytes(merges), len(merges))

    @classmethod
    def from_tokenizer_json_memory(cls, text):
        """The text (bytes) of a tokenizer.json."""
        return cls._open(lib.pytfm_tokenizer_open_json_memory, bytes(text), len(text))

    @classmethod
    def from_folder(cls, folder):
        """The tokenizer in a folder: vocab.json + merges.txt, else tokenizer.json."""
        paths = folder_files(folder)
        return cls.from_files(*paths) if len(paths) == 2 else cls.from_tokenizer_json(*paths)

    def __len__(self):
        return int(lib.pytfm_tokenizer_vocab_size(self._tok))

    def __repr__(self):
        return f"CTokenizer({len(self)} tokens, {self.n_merges} merges)"

    def encode(self, text, special=True):
        """text (str or bytes) -> its token ids, a NumPy int32 array. special: <|endoftext|>
        in the text is the special token; False: its characters are tokenized as text."""
        if isinstance(text, str):
            try:
                raw = text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"text holds a lone surrogate at index {e.start}, which is "
                                 "not Unicode text: pass bytes") from None
        elif isinstance(text, (bytes, bytearray, memoryview)):
            raw = bytes(text)
        else:
            raise TypeError(f"text must be a str or bytes, got {type(text).__name__}")
        count = ffi.new("int64_t *")
        special = 1 if special else 0
        if len(raw) <= _ONE_PASS:
            size = max(len(raw), 1)  # a text never has more ids than bytes
        else:  # a long text is counted first, not given 4 bytes of ids per byte
            _check(lib.pytfm_tokenizer_encode(self._tok, raw, len(raw), special, ffi.NULL, 0,
                                              count), "encode")
            size = max(count[0], 1)
        ids = np.empty(size, np.int32)
        _check(lib.pytfm_tokenizer_encode(self._tok, raw, len(raw), special,
                                          ffi.from_buffer("int32_t[]", ids), size, count),
               "encode")
        return ids[:count[0]]

    def decode_bytes(self, ids):
        """Token ids (a sequence or a 1-D integer array) -> the bytes they stand for."""
        arr = token_ids(ids, len(self))
        if arr.size == 0:
            return b""
        arr = np.ascontiguousarray(arr, np.int32)
        src = ffi.from_buffer("int32_t[]", arr)
        size = ffi.new("int64_t *")
        _check(lib.pytfm_tokenizer_decode(self._tok, src, len(arr), ffi.NULL, 0, size),
               "decode")
        out = bytearray(size[0])
        _check(lib.pytfm_tokenizer_decode(self._tok, src, len(arr), ffi.from_buffer(out),
                                          len(out), size), "decode")
        return bytes(out)

    def decode(self, ids, errors="replace"):
        """Token ids -> str: their bytes as UTF-8, invalid sequences as U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    def token_bytes(self, i):
        """The bytes of token i."""
        p, size = ffi.new("char **"), ffi.new("int64_t *")
        _check(lib.pytfm_tokenizer_token(self._tok, int(i), p, size), "token_bytes")
        return ffi.unpack(p[0], size[0])
