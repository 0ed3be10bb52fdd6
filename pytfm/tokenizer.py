"""pytfm.tokenizer — BPE: byte-level (GPT-2's, Llama 3's, Qwen's) and SentencePiece-style
with byte fallback (Llama 2's, Gemma's): encode, decode, load, save, train.

    tok = Tokenizer.from_folder("gpt2")            # vocab.json + merges.txt, or tokenizer.json
    ids = tok.encode("Hello world")                # [15496, 995]
    tok.decode(ids)                                # 'Hello world'
    tok = train(open("corpus.txt", "rb").read(), 4096)   # a tokenizer of your own text

The engine is the C library's (csrc/include/pytfm_tokenizer.h says what it does, token for
token what Hugging Face `tokenizers` gives for GPT-2): the file checks, the folder rule, the
pre-tokenizer, the merges and decoding; Python and C programs get the same ids and the same
messages. Training and writing the files are Python's (train, Tokenizer.save).

Text in and out: encode takes a str (valid Unicode: a lone surrogate is a ValueError) or bytes
of any kind. A byte that is not part of valid UTF-8 is one "other" character of its own (as
Python's errors="surrogateescape" reads it: it joins the run of punctuation around it) and its
own byte token again. So decode_bytes(encode(b)) == b for any bytes b, and encode(s) ==
encode(s.encode()) for any str s. decode(ids) gives a str, invalid UTF-8 as U+FFFD (as
transformers' decode does).

Files (checked strictly before any table is built): GPT-2's vocab.json ({token: id}: the ids
0 .. n-1 each once) and merges.txt ("#version" line, then one "a b" pair per line), or Hugging
Face's tokenizer.json of a ByteLevel BPE (GPT-2's, or Llama 3's and Qwen's: a Split regex,
ignore_merges, NFC) or of a BPE with byte_fallback (Llama 2's, Mistral's, Gemma's: tokens are
text, normalizer Prepend/Replace, Metaspace; docs/tokenizer.md). A vocabulary and merges that
disagree are refused: every merge's parts must be tokens, every result a token of the
vocabulary, no pair merged twice, and (byte-level, without ignore_merges) every token a byte,
a merge's result or <|endoftext|>. A
bad file is a TokenizerError naming it; a file or folder that cannot be read, an OSError
(FileNotFoundError for a folder without a tokenizer).
"""

import functools
import json
import os

import numpy as np

from ._core import check, ffi, lib

ENDOFTEXT = "<|endoftext|>"
MAX_FILE = lib.PYTFM_TOKENIZER_MAX_FILE  # bytes of a vocab.json, merges.txt or tokenizer.json
MAX_TOKENS = lib.PYTFM_TOKENIZER_MAX_TOKENS  # tokens of a vocabulary, at most
_MERGES_HEADER = "#version: 0.2"
_ONE_PASS = 1 << 24  # bytes of text encoded (split) in one pass; a longer one is counted first


class TokenizerError(ValueError):
    """A vocabulary, merges or tokenizer.json file that is malformed or inconsistent."""


@functools.cache
def bytes_to_unicode():
    """GPT-2's table: byte b -> the printable character that stands for it in the vocabulary
    (the printable Latin-1 bytes stand for themselves; the others, in order, for U+0100 ...).
    Its order is GPT-2's order of the byte tokens: ids 0 .. 255 of its vocabulary."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)  # 188 printable bytes: the others get 256, 257, ...
    return dict(zip(bs, map(chr, cs)))


def _as_bytes(text):
    """encode's text as UTF-8 bytes; a str must be valid Unicode, anything else bytes-like (the
    buffer protocol: bytes, bytearray, memoryview, array.array, a NumPy array), read as its raw
    bytes."""
    if not isinstance(text, str):
        try:
            view = memoryview(text)
        except TypeError:
            raise TypeError(f"text must be a str or bytes-like, got {type(text).__name__}") \
                from None
        return view.tobytes()
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"text holds a lone surrogate {text[e.start]!r} at index {e.start}, which is not "
            "Unicode text: pass bytes (undecodable bytes are tokenized as they are)") from None


def pretokenize(text):
    """GPT-2's words of text (str or bytes, read as encode reads it), as bytes, which join to
    the text's UTF-8 bytes. <|endoftext|> is text here."""
    return list(_words(_as_bytes(text)))


def _words(raw):
    """The words of bytes raw, one at a time (pytfm_tokenizer_split)."""
    count = ffi.new("int64_t *")
    size = len(raw)
    if size > _ONE_PASS:  # a long text is counted first, not given 8 bytes of ends per byte
        check(lib.pytfm_tokenizer_split(raw, len(raw), ffi.NULL, 0, count))
        size = count[0]
    ends = np.empty(max(size, 1), np.int64)  # a text never has more words than bytes
    check(lib.pytfm_tokenizer_split(raw, len(raw), ffi.from_buffer("int64_t[]", ends),
                                    len(ends), count))
    ends, start = ends[:count[0]], 0
    for at in range(0, len(ends), 1 << 16):
        for end in ends[at:at + (1 << 16)].tolist():
            yield raw[start:end]
            start = end


def token_ids(ids, vocab_size):
    """ids (a sequence or a 1-D integer array) as a 1-D integer array, each in [0, vocab_size);
    ValueError naming ids otherwise."""
    ids = np.asarray(ids)
    if ids.size == 0:
        return ids.reshape(0).astype(np.int64)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"ids must be a 1-D sequence of integer token ids, got an array "
                         f"of shape {ids.shape} and dtype {ids.dtype}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"ids: token {bad} is outside the vocabulary [0, {vocab_size})")
    return ids


class Tokenizer:
    """A byte-level BPE: vocab {token: id} (tokens in GPT-2's byte-level alphabet), merges
    [(a, b)] in rank order, checked as the module says. .eot: the id of <|endoftext|> (None
    when the vocabulary has none); len(tok): the vocabulary's size; .vocab and .merges: the
    vocabulary and merges, read back from the library on first use."""

    def __init__(self, vocab, merges):
        if not isinstance(merges, (list, tuple)):
            raise TokenizerError(f"merges must be a list of pairs, got {type(merges).__name__}")
        for rank, pair in enumerate(merges):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
                    isinstance(x, str) and x and " " not in x and "\n" not in x for x in pair)):
                raise TokenizerError(f"merge {rank} is not a pair of tokens: {pair!r:.60}")
        try:
            vocab_text = json.dumps(vocab, ensure_ascii=False).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError) as e:
            raise TokenizerError(f"the vocabulary is not JSON: {e}") from None
        merges_text = "".join(f"{a} {b}\n" for a, b in merges).encode("utf-8", "surrogatepass")
        self._open(lib.pytfm_tokenizer_open_memory, vocab_text, len(vocab_text), merges_text,
                   len(merges_text))

    def _open(self, opener, *args):
        out = ffi.new("pytfm_tokenizer **")
        check(opener(*args, out), error=TokenizerError)  # errno set: an OSError
        self._tok = ffi.gc(out[0], lib.pytfm_tokenizer_close)
        eot = lib.pytfm_tokenizer_eot(self._tok)
        self.eot = None if eot < 0 else int(eot)
        count = ffi.new("int64_t *")
        check(lib.pytfm_tokenizer_encode(self._tok, ffi.NULL, 0, lib.PYTFM_TOKENIZER_TEMPLATE,
                                         ffi.NULL, 0, count))
        self._template_size = int(count[0])
        return self

    def __len__(self):
        return int(lib.pytfm_tokenizer_vocab_size(self._tok))

    def __repr__(self):
        return f"Tokenizer({len(self)} tokens, {lib.pytfm_tokenizer_merge_count(self._tok)} merges)"

    @property
    def text_tokens(self):
        """True when the tokens are text (a tokenizer.json with model.byte_fallback, Llama 2's
        and Gemma's: U+2581 for a space, <0xNN> tokens for bytes): token_bytes(i) is then the
        UTF-8 of the token's name, and decode runs the file's decoder."""
        return bool(lib.pytfm_tokenizer_text_tokens(self._tok))

    @functools.cached_property
    def vocab(self):
        """{token: id}, in id order."""
        if self.text_tokens:
            return {self.token_bytes(i).decode("utf-8"): i for i in range(len(self))}
        table = bytes_to_unicode()
        return {"".join(map(table.__getitem__, self.token_bytes(i))): i for i in range(len(self))}

    @functools.cached_property
    def merges(self):
        """[(a, b)], in rank order."""
        n = int(lib.pytfm_tokenizer_merge_count(self._tok))
        pairs = np.empty((n, 2), np.int32)
        check(lib.pytfm_tokenizer_merges(self._tok, ffi.from_buffer("int32_t[]", pairs), n))
        names = list(self.vocab)
        return [(names[a], names[b]) for a, b in pairs.tolist()]

    # -- encoding

    def encode(self, text, special=True, *, template=True):
        """text (str or bytes) -> its token ids, a list of ints. special: the special added
        tokens in the text (<|endoftext|>, tokenizer.json's added_tokens marked special) are
        those tokens, as transformers' tokenizer has it; False: their characters are text
        (tokenizers' encode_special_tokens). Added tokens not marked special are always
        matched. template: the ids of tokenizer.json's TemplateProcessing post-processor
        around the text (a BOS token), as transformers' encode adds them by default
        (add_special_tokens); GPT-2 has none, so it changes nothing there."""
        return self._encode(text, special, template).tolist()

    def encode_array(self, text, special=True, *, template=True, dtype=np.int64):
        """encode, as a NumPy array of dtype (an integer type that holds every id)."""
        dtype = np.dtype(dtype)
        if dtype.kind not in "iu" or np.iinfo(dtype).max < len(self) - 1:
            raise ValueError(f"dtype must be an integer type holding ids up to "
                             f"{len(self) - 1}, got {dtype}")
        return self._encode(text, special, template).astype(dtype)

    def _encode(self, text, special, template):
        raw = _as_bytes(text)
        flags = (lib.PYTFM_TOKENIZER_SPECIAL if special else 0) | (
            lib.PYTFM_TOKENIZER_TEMPLATE if template else 0)
        count = ffi.new("int64_t *")
        # a text has no more ids than bytes (without a normalizer or Metaspace), plus the
        # template's (the empty text's ids); a longer count is retried below
        size = len(raw) + (self._template_size if template else 0)
        if size > _ONE_PASS:  # a long text is counted first, not given 4 bytes of ids per byte
            check(lib.pytfm_tokenizer_encode(self._tok, raw, len(raw), flags, ffi.NULL, 0,
                                             count))
            size = count[0]
        ids = np.empty(max(size, 1), np.int32)
        status = lib.pytfm_tokenizer_encode(self._tok, raw, len(raw), flags,
                                            ffi.from_buffer("int32_t[]", ids), len(ids), count)
        if status != lib.PYTFM_STATUS_OK and count[0] > len(ids):
            # a normalizer (NFC, Prepend, Replace) or Metaspace may lengthen the text: the
            # count is known now
            ids = np.empty(count[0], np.int32)
            status = lib.pytfm_tokenizer_encode(self._tok, raw, len(raw), flags,
                                                ffi.from_buffer("int32_t[]", ids), len(ids),
                                                count)
        check(status)
        return ids[:count[0]]

    # -- decoding

    def decode_bytes(self, ids):
        """Token ids (a sequence or a 1-D integer array) -> the bytes they stand for (text
        tokens: the UTF-8 of what the file's decoder makes of them, as tokenizers' decode with
        skip_special_tokens=False gives it)."""
        ids = np.ascontiguousarray(token_ids(ids, len(self)), np.int32)
        src, size = ffi.from_buffer("int32_t[]", ids), ffi.new("int64_t *")
        check(lib.pytfm_tokenizer_decode(self._tok, src, len(ids), ffi.NULL, 0, size))
        out = bytearray(size[0])
        check(lib.pytfm_tokenizer_decode(self._tok, src, len(ids), ffi.from_buffer(out),
                                         len(out), size))
        return bytes(out)

    def decode(self, ids, errors="replace"):
        """Token ids -> str: their bytes as UTF-8, invalid sequences as U+FFFD (errors as
        bytes.decode takes it; text tokens' bytes are valid UTF-8 already: a run of <0xNN>
        tokens that is not is one U+FFFD per byte, as tokenizers' ByteFallback decodes it)."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    def token_bytes(self, i):
        """The bytes of token i."""
        p, size = ffi.new("char **"), ffi.new("int64_t *")
        check(lib.pytfm_tokenizer_token(self._tok, i, p, size))
        return ffi.unpack(p[0], size[0])

    # -- files

    @classmethod
    def from_files(cls, vocab_path, merges_path):
        """GPT-2's vocab.json (encoder.json) and merges.txt (vocab.bpe)."""
        return cls.__new__(cls)._open(lib.pytfm_tokenizer_open, _path(vocab_path, "vocab_path"),
                                      _path(merges_path, "merges_path"))

    @classmethod
    def from_tokenizer_json(cls, path):
        """Hugging Face's tokenizer.json of a BPE, byte-level or with byte_fallback
        (docs/tokenizer.md)."""
        tok = cls.__new__(cls)._open(lib.pytfm_tokenizer_open_json, _path(path, "path"))
        tok._json = os.fsdecode(path)
        return tok

    @classmethod
    def from_folder(cls, folder):
        """The tokenizer in a folder: vocab.json + merges.txt, else tokenizer.json
        (pytfm_tokenizer_open_folder's rule)."""
        tok = cls.__new__(cls)._open(lib.pytfm_tokenizer_open_folder, _path(folder, "folder"))
        folder = os.fsdecode(folder)
        if not all(os.path.isfile(os.path.join(folder, n)) for n in ("vocab.json", "merges.txt")):
            tok._json = os.path.join(folder, "tokenizer.json")
        return tok

    def save(self, folder):
        """Write vocab.json and merges.txt into folder (made if missing), GPT-2's format (a
        tokenizer opened from a tokenizer.json with another pre-tokenizer, a normalizer or
        ignore_merges is refused, a TokenizerError: those files would give other ids): what
        from_folder and transformers' GPT2TokenizerFast.from_pretrained read. The folder is
        replaced as a whole (pytfm._atomic.Folder: its other files kept), so a reader sees the
        old pair or the new one; folder may be an open Folder (gpt2.save's), then written into."""
        from . import _atomic

        source = getattr(self, "_json", None)
        if source is not None:  # GPT-2's files give other ids for what GPT-2 has not
            with open(source, encoding="utf-8") as f:
                doc = json.load(f)
            pre, model = doc.get("pre_tokenizer") or {}, doc.get("model") or {}
            if pre.get("type") != "ByteLevel" or doc.get("normalizer") or model.get(
                    "ignore_merges"):
                raise TokenizerError(
                    f"{source}: its pre_tokenizer, normalizer or ignore_merges is not GPT-2's, "
                    f"so vocab.json and merges.txt would give other ids: copy the "
                    f"tokenizer.json instead")
        vocab = json.dumps(self.vocab, ensure_ascii=False)
        merges = "\n".join([_MERGES_HEADER, *(f"{a} {b}" for a, b in self.merges)]) + "\n"
        with _atomic.writing(folder) as f:
            f.write("vocab.json", vocab.encode("utf-8"))
            f.write("merges.txt", merges.encode("utf-8"))


def _path(path, name):
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} must be a path, got {type(path).__name__}")
    return os.fsencode(path)


# ---- training ----------------------------------------------------------------------------------


def train(text, vocab_size, special=True):
    """A byte-level BPE of vocab_size tokens learnt from text (str or bytes, read as encode
    reads it), with GPT-2's pre-tokenizer: the 256 byte tokens (ids 0 .. 255, GPT-2's order),
    then vocab_size - 257 merges, each the pair of adjacent tokens that occurs most often in
    the words of the text (weighted by each word's count; a tie goes to the pair of the smaller
    ids), and <|endoftext|> last. special: <|endoftext|> in the text separates it, as encode
    has it. A text with fewer distinct pairs gives fewer merges (and a smaller vocabulary).
    -> Tokenizer."""
    if type(vocab_size) is not int or not 257 <= vocab_size <= MAX_TOKENS:
        raise ValueError(f"vocab_size must be an int in [257, {MAX_TOKENS:,}] (the 256 bytes, "
                         f"{ENDOFTEXT} and the merges), got {vocab_size!r}")
    table = bytes_to_unicode()
    order = list(table)  # the bytes in GPT-2's id order
    byte_id = {b: i for i, b in enumerate(order)}
    counts = {}
    raw = _as_bytes(text)
    for piece in (raw.split(ENDOFTEXT.encode()) if special else [raw]):
        for word in _words(piece):
            counts[word] = counts.get(word, 0) + 1
    words = [[byte_id[b] for b in w] for w in counts]
    freqs = list(counts.values())
    tokens = [table[b] for b in order]  # id -> its byte-level string
    merges = _learn(words, freqs, tokens, vocab_size - 257)
    vocab = {t: i for i, t in enumerate(tokens)}
    vocab[ENDOFTEXT] = len(vocab)
    return Tokenizer(vocab, merges)


def _learn(words, freqs, tokens, n_merges):
    """Up to n_merges merges of the words (lists of ids, rewritten in place), appending each
    merged token to tokens: -> [(a, b)] as strings."""
    import heapq

    pairs, where = {}, {}  # pair -> its weighted count; pair -> the words it is in
    for w, (word, f) in enumerate(zip(words, freqs)):
        for pair in zip(word, word[1:]):
            pairs[pair] = pairs.get(pair, 0) + f
            where.setdefault(pair, set()).add(w)
    heap = [(-n, pair) for pair, n in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while heap and len(merges) < n_merges:
        n, pair = heapq.heappop(heap)
        if pairs.get(pair, 0) != -n or n == 0:
            continue  # a stale entry: the pair's count has changed since
        a, b = pair
        new = len(tokens)
        tokens.append(tokens[a] + tokens[b])
        merges.append((tokens[a], tokens[b]))
        changed = set()
        for w in sorted(where.pop(pair)):
            word, f = words[w], freqs[w]
            for p in zip(word, word[1:]):
                pairs[p] -= f
                changed.add(p)
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            words[w] = out
            for p in zip(out, out[1:]):
                pairs[p] = pairs.get(p, 0) + f
                where.setdefault(p, set()).add(w)
                changed.add(p)
        pairs.pop(pair, None)
        for p in changed:
            count = pairs.get(p, 0)
            if count > 0:
                heapq.heappush(heap, (-count, p))
            else:
                pairs.pop(p, None)
                where.pop(p, None)
    return merges
