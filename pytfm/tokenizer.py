"""pytfm.tokenizer — GPT-2's byte-level BPE in Python: encode, decode, load, save, train.

    tok = Tokenizer.from_folder("gpt2")            # vocab.json + merges.txt, or tokenizer.json
    ids = tok.encode("Hello world")                # [15496, 995]
    tok.decode(ids)                                # 'Hello world'
    tok = train(open("corpus.txt", "rb").read(), 4096)   # a tokenizer of your own text

What GPT-2's tokenizer does, and so this one (token for token what Hugging Face `tokenizers`
gives for GPT-2):
1. The special token <|endoftext|> is cut out of the text (special=True, the default), and
   each piece between is tokenized alone.
2. Pre-tokenization splits a piece into words with GPT-2's pattern
       's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
   where \\p{L} is a letter (general category L*), \\p{N} a number (N*) and \\s Unicode's
   White_Space (Python's str.isspace less U+001C..U+001F, which Python alone counts). The
   classes come from the running Python's unicodedata (Python 3.11: Unicode 14), built once,
   on the first encode; a character assigned after that version (a Cn character here) counts
   as "other", where a tokenizer of a newer Unicode may call it a letter or a number.
3. Each word's UTF-8 bytes become the byte tokens (ids through the vocabulary: GPT-2's
   byte-to-unicode table names byte b by a printable character), merged pair by pair, the pair
   of lowest rank (its line in merges.txt) first, every occurrence of it left to right, until
   no pair of the word has a rank. Words seen before come from a cache (at most MAX_CACHE).

Text in and out: encode takes a str (valid Unicode: a lone surrogate is a ValueError) or bytes
of any kind. Bytes are decoded as UTF-8 with errors="surrogateescape": a byte that is not part
of valid UTF-8 becomes one "other" character of its own (it joins the run of punctuation around
it, as ` ?[^\\s\\p{L}\\p{N}]+` says) and is its own byte token again. So decode_bytes(encode(b))
== b for any bytes b, and encode(s) == encode(s.encode()) for any str s. decode(ids) gives a
str, invalid UTF-8 as U+FFFD (as transformers' decode does).

Files (validated strictly before any table is built: TokenizerError naming the file): GPT-2's
vocab.json ({token: id}: the ids 0 .. n-1 each once) and merges.txt ("#version" line, then one
"a b" pair per line), or Hugging Face's tokenizer.json of a ByteLevel BPE. A vocabulary and
merges that disagree are refused: every merge's parts must be byte tokens or results of earlier
merges, every result a token of the vocabulary, and every token a byte, a merge's result or
<|endoftext|>.
"""

import bisect
import functools
import json
import os
import re
import threading
import unicodedata
from itertools import chain

import numpy as np

ENDOFTEXT = "<|endoftext|>"
MAX_CACHE = 1 << 18  # words whose tokens are kept; past it the cache starts again, empty
MAX_FILE = 1 << 28  # bytes of a vocab.json, merges.txt or tokenizer.json, at most (256 MiB)
MAX_TOKENS = 1 << 24  # tokens of a vocabulary, at most
_MERGES_HEADER = "#version: 0.2"


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


# ---- pre-tokenization ----------------------------------------------------------------------


def _ranges(chars):
    """The characters of a str, in code point order -> [(first, last)] code points of their
    runs."""
    codes = np.frombuffer(chars.encode("utf-32-le", "surrogatepass"), "<u4").astype(np.int64)
    if not codes.size:
        return []
    cut = np.flatnonzero(np.diff(codes) != 1)
    firsts, lasts = np.append(codes[:1], codes[cut + 1]), np.append(codes[cut], codes[-1:])
    return list(zip(firsts.tolist(), lasts.tolist()))


def _class(ranges):
    """The inside of a regex character class matching these ranges."""
    def esc(c):
        return f"\\U{c:08x}" if c > 0xFFFF else f"\\u{c:04x}"
    return "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}" for a, b in ranges)


_PATTERN = ("'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{W}{L}{N}]+|[{W}]+(?![^{W}])|[{W}]+")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class _PreTokenizer:
    """GPT-2's pattern, compiled three times: for ASCII text (classes of 256 bits), for text
    of the Basic Multilingual Plane (a two-level bitmap per class) and, for text with
    characters beyond U+FFFF, the BMP pattern on a copy in which each such character stands in
    as a BMP character of its class ("a", "0" or "!"; the words are then cut from the original
    by their lengths). Python's re tests a character against the ranges of a class beyond the
    BMP one by one, which would cost every word hundreds of comparisons; this way it never does.
    """

    def __init__(self):
        every = np.arange(0x110000, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
        letters = "".join(filter(str.isalpha, every))  # isalpha: the categories L*
        numbers = "".join(c for c in filter(str.isnumeric, every)  # a superset of N*
                          if unicodedata.category(c)[0] == "N")
        space = "".join(c for c in filter(str.isspace, every) if not "\x1c" <= c <= "\x1f")
        assert max(space) <= "\uffff"
        self.astral = sorted((r, kind) for kind, chars in (("a", letters), ("0", numbers))
                             for r in _ranges(chars) if r[0] > 0xFFFF)
        self.starts = [first for (first, _), _ in self.astral]

        def compile_(last):
            def cut(chars):
                return _class(_ranges(chars[:bisect.bisect_right(chars, chr(last))]))
            return re.compile(_PATTERN.format(L=cut(letters), N=cut(numbers), W=cut(space)))

        self.ascii = compile_(0x7F).findall
        self.bmp = compile_(0xFFFF).findall

    def _stand_in(self, m):
        c = ord(m.group())
        i = bisect.bisect_right(self.starts, c) - 1
        if i >= 0 and c <= self.astral[i][0][1]:
            return self.astral[i][1]
        return "!"

    def __call__(self, text):
        """text (str) -> its words, which join to text."""
        if text.isascii():
            return self.ascii(text)
        if _ASTRAL.search(text) is None:
            return self.bmp(text)
        words, at = self.bmp(_ASTRAL.sub(self._stand_in, text)), 0
        out = []
        for w in words:
            out.append(text[at:at + len(w)])
            at += len(w)
        return out


_pretokenizer = None
_pretokenizer_lock = threading.Lock()
CHUNK = 1 << 20  # characters pre-tokenized at a time, about
# A cut between "X\n" and "Y", X and Y not whitespace, is one the pattern makes anyway (no word
# runs from a non-space through a newline, nor from a newline into a non-space), and the words
# each side of it are the same whether the text is cut there or not: long texts are
# pre-tokenized a chunk at a time there, so that only one chunk's words are held at once.
_CUT = re.compile(r"\S\n(?=\S)")


def _chunks(text):
    """text in pieces of about CHUNK characters, cut where _CUT says."""
    start = 0
    while len(text) - start > CHUNK:
        m = _CUT.search(text, start + CHUNK)
        if m is None:
            break
        yield text[start:m.end()]
        start = m.end()
    yield text[start:] if start else text


def pretokenize(text):
    """GPT-2's words of text (str, or bytes taken as encode takes them), which join to it
    (to bytes' surrogateescape decoding)."""
    return _words(_as_text(text))


def _words(text):
    """pretokenize of a str already checked. The character classes are built on the first
    call (about 0.2 s)."""
    global _pretokenizer
    if _pretokenizer is None:
        with _pretokenizer_lock:
            if _pretokenizer is None:
                _pretokenizer = _PreTokenizer()
    return _pretokenizer(text)


def _as_text(text):
    """encode's text as a str: bytes through surrogateescape; a str must be valid Unicode."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text).decode("utf-8", "surrogateescape")
    if not isinstance(text, str):
        raise TypeError(f"text must be a str or bytes, got {type(text).__name__}")
    if not text.isascii():
        bad = _SURROGATE.search(text)
        if bad is not None:
            raise ValueError(
                f"text holds a lone surrogate {bad.group()!r} at index {bad.start()}, which is "
                "not Unicode text: pass bytes (undecodable bytes are tokenized as they are)")
    return text


# ---- the tokenizer ---------------------------------------------------------------------------


class _Cache(dict):
    """word -> its token ids (a tuple), computed on a miss; emptied when it reaches limit."""

    def __init__(self, compute, limit):
        super().__init__()
        self.compute, self.limit = compute, limit

    def __missing__(self, word):
        ids = self.compute(word)
        if len(self) >= self.limit:
            self.clear()
        self[word] = ids
        return ids


def token_ids(ids, vocab_size):
    """ids (a sequence or a 1-D integer array) as a 1-D integer array, each in [0, vocab_size);
    ValueError naming ids otherwise. What both tokenizers' decode_bytes take."""
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


def folder_files(folder):
    """The tokenizer files of a folder: (vocab.json, merges.txt) when either is there, else
    (tokenizer.json,); FileNotFoundError when there is neither."""
    vocab, merges = (os.path.join(folder, n) for n in ("vocab.json", "merges.txt"))
    if os.path.exists(vocab) or os.path.exists(merges):
        return vocab, merges
    path = os.path.join(folder, "tokenizer.json")
    if os.path.exists(path):
        return (path,)
    raise FileNotFoundError(f"{folder}: no tokenizer (vocab.json + merges.txt, or "
                            "tokenizer.json)")


class Tokenizer:
    """A byte-level BPE: vocab {token: id} (tokens in GPT-2's byte-level alphabet), merges
    [(a, b)] in rank order, checked as the module says. .eot: the id of <|endoftext|> (None
    when the vocabulary has none); len(tok): the vocabulary's size."""

    def __init__(self, vocab, merges, source="the vocabulary"):
        self.vocab, self.merges = _check(vocab, merges, source)
        decoder = {c: b for b, c in bytes_to_unicode().items()}
        self.eot = self.vocab.get(ENDOFTEXT)
        self._bytes = [b""] * len(self.vocab)  # id -> its bytes
        for token, i in self.vocab.items():
            self._bytes[i] = (ENDOFTEXT.encode() if token == ENDOFTEXT else
                              bytes(decoder[c] for c in token))
        table = bytes_to_unicode()
        self._byte_ids = [self.vocab[table[b]] for b in range(256)]
        self._ranks = {(self.vocab[a], self.vocab[b]): (rank, self.vocab[a + b])
                       for rank, (a, b) in enumerate(self.merges)}
        self._cache = _Cache(self._bpe, MAX_CACHE)

    def __len__(self):
        return len(self.vocab)

    def __repr__(self):
        return f"Tokenizer({len(self.vocab)} tokens, {len(self.merges)} merges)"

    # -- encoding

    def _bpe(self, word):
        """A word's token ids: its bytes, merged as the module says (GPT-2's encoder.py)."""
        ids = [self._byte_ids[b] for b in word.encode("utf-8", "surrogateescape")]
        ranks = self._ranks
        while len(ids) > 1:
            best = None
            for pair in zip(ids, ids[1:]):
                r = ranks.get(pair)
                if r is not None and (best is None or r < best[1]):
                    best = (pair, r)
            if best is None:
                break
            (a, b), (_, merged) = best
            out, i, n = [], 0, len(ids)
            while i < n:
                if i + 1 < n and ids[i] == a and ids[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            ids = out
        return tuple(ids)

    def _pieces(self, text, special):
        """text as a str, cut at each <|endoftext|> when special: -> [str or None (the
        special token)]."""
        text = _as_text(text)
        if not special or self.eot is None or ENDOFTEXT not in text:
            return [text]
        parts = text.split(ENDOFTEXT)
        return [p for part in parts for p in (None, part)][1:]

    def encode(self, text, special=True):
        """text (str or bytes) -> its token ids, a list of ints. special: <|endoftext|> in the
        text is the special token (as transformers' tokenizer has it); False: its characters
        are tokenized as text."""
        return list(self._ids(text, special))

    def encode_array(self, text, special=True, dtype=np.int64):
        """encode, as a NumPy array of dtype (an integer type that holds every id)."""
        dtype = np.dtype(dtype)
        if dtype.kind not in "iu" or np.iinfo(dtype).max < len(self.vocab) - 1:
            raise ValueError(f"dtype must be an integer type holding ids up to "
                             f"{len(self.vocab) - 1}, got {dtype}")
        return np.fromiter(self._ids(text, special), dtype=dtype)

    def _ids(self, text, special):
        cached, words, eot = self._cache.__getitem__, _words, (self.eot,)
        return chain.from_iterable(
            eot if piece is None else chain.from_iterable(map(cached, words(chunk)))
            for piece in self._pieces(text, special)
            for chunk in ((None,) if piece is None else _chunks(piece)))

    # -- decoding

    def decode_bytes(self, ids):
        """Token ids (a sequence or a 1-D integer array) -> the bytes they stand for."""
        ids = token_ids(ids, len(self._bytes))
        return b"".join(map(self._bytes.__getitem__, ids.tolist()))

    def decode(self, ids, errors="replace"):
        """Token ids -> str: their bytes as UTF-8, invalid sequences as U+FFFD (errors as
        bytes.decode takes it)."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    def token_bytes(self, i):
        """The bytes of token i."""
        return self._bytes[i]

    # -- files

    @classmethod
    def from_files(cls, vocab_path, merges_path):
        """GPT-2's vocab.json (encoder.json) and merges.txt (vocab.bpe)."""
        vocab = _json_file(vocab_path)
        merges = _merges_file(merges_path)
        return cls(vocab, merges, f"{vocab_path} and {merges_path}")

    @classmethod
    def from_tokenizer_json(cls, path):
        """Hugging Face's tokenizer.json of a GPT-2-style byte-level BPE."""
        return cls(*_tokenizer_json(path), source=path)

    @classmethod
    def from_folder(cls, folder):
        """The tokenizer in a folder: vocab.json + merges.txt, else tokenizer.json."""
        paths = folder_files(folder)
        return cls.from_files(*paths) if len(paths) == 2 else cls.from_tokenizer_json(*paths)

    def save(self, folder):
        """Write vocab.json and merges.txt into folder (made if missing), GPT-2's format: what
        from_folder and transformers' GPT2TokenizerFast.from_pretrained read. The folder is
        replaced as a whole (pytfm._atomic.Folder: its other files kept), so a reader sees the
        old pair or the new one; folder may be an open Folder (gpt2.save's), then written into."""
        from . import _atomic

        vocab = json.dumps(self.vocab, ensure_ascii=False)
        merges = "\n".join([_MERGES_HEADER, *(f"{a} {b}" for a, b in self.merges)]) + "\n"
        with _atomic.writing(folder) as f:
            f.write("vocab.json", vocab.encode("utf-8"))
            f.write("merges.txt", merges.encode("utf-8"))


# ---- reading and checking the files ----------------------------------------------------------


def _read_text(path):
    """A tokenizer file's text: at most MAX_FILE bytes of strict UTF-8."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_FILE:
            raise TokenizerError(f"{path}: {size:,} bytes, more than the {MAX_FILE:,} a "
                                 "tokenizer file may have")
        raw = f.read(size + 1)  # read(n) allocates n bytes first; +1 sees a file that grew
    if len(raw) > MAX_FILE:
        raise TokenizerError(f"{path}: more than the {MAX_FILE:,} bytes a tokenizer file may "
                             "have")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{path}: not UTF-8 (byte {e.start}: {e.reason})") from None


def _json_file(path):
    """A JSON file, checked by the C reader's strict JSON check before json.loads."""
    from .checkpoint import json_error  # the C library: only when a file is read

    text = _read_text(path)
    why = json_error(text)
    if why is not None:
        raise TokenizerError(f"{path}: {why}")
    return json.loads(text)


def _merges_file(path):
    """merges.txt: an optional "#version" first line, then "a b" per line (a final newline
    allowed) -> [(a, b)]."""
    lines = _read_text(path).split("\n")
    if lines and lines[0].startswith("#version"):
        lines = lines[1:]
    if lines and lines[-1] == "":
        lines = lines[:-1]
    merges = []
    for n, line in enumerate(lines):
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise TokenizerError(f"{path}: line {n + 2}: {line[:40]!r} is not a merge "
                                 "('a b': two tokens and one space)")
        merges.append((parts[0], parts[1]))
    return merges


def _tokenizer_json(path):
    """tokenizer.json of a GPT-2-style byte-level BPE -> (vocab, merges); any setting that
    would tokenize differently from GPT-2's is refused, naming it."""
    doc = _json_file(path)

    def need(ok, what):
        if not ok:
            raise TokenizerError(f"{path}: {what}")

    need(isinstance(doc, dict), "not a JSON object")
    model = doc.get("model")
    need(isinstance(model, dict) and model.get("type") == "BPE", "model.type must be \"BPE\"")
    for key, allowed in (("dropout", (None,)), ("unk_token", (None,)),
                         ("continuing_subword_prefix", (None, "")),
                         ("end_of_word_suffix", (None, "")), ("fuse_unk", (False, None)),
                         ("byte_fallback", (False, None)), ("ignore_merges", (False, None))):
        value = model.get(key)
        need(any(value is a or (value == a and type(value) is type(a)) for a in allowed),
             f"model.{key} is {value!r}: GPT-2's BPE has {allowed[0]!r}")
    need(doc.get("normalizer") is None, "normalizer must be null (GPT-2 has none)")
    for key in ("pre_tokenizer", "decoder"):
        part = doc.get(key)
        if key == "decoder" and part is None:
            continue
        need(isinstance(part, dict) and part.get("type") == "ByteLevel",
             f"{key} must be ByteLevel, got {part!r:.80}")
        if key == "pre_tokenizer":
            need(part.get("add_prefix_space") is False and part.get("use_regex", True) is True,
                 "pre_tokenizer: GPT-2's has add_prefix_space false and use_regex true")
    for token in doc.get("added_tokens") or []:
        need(isinstance(token, dict) and token.get("content") == ENDOFTEXT,
             f"added token {token!r:.80}: the only special token known is {ENDOFTEXT}")
    merges = model.get("merges")
    need(isinstance(merges, list), "model.merges must be a list")
    pairs = []
    for m in merges:
        if isinstance(m, str) and m.count(" ") == 1:
            pairs.append(tuple(m.split(" ")))
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m):
            pairs.append(tuple(m))
        else:
            need(False, f"model.merges: {m!r:.60} is not a merge ('a b' or [a, b])")
    return model.get("vocab"), pairs


def _check(vocab, merges, source):
    """The vocabulary and merges as the module's docstring says: -> (vocab, merges) copied."""
    def fail(what):
        raise TokenizerError(f"{source}: {what}")

    if not isinstance(vocab, dict):
        fail(f"the vocabulary must be a JSON object {{token: id}}, got {type(vocab).__name__}")
    if not 256 <= len(vocab) <= MAX_TOKENS:
        fail(f"a byte-level vocabulary has 256 to {MAX_TOKENS:,} tokens, got {len(vocab):,}")
    seen = bytearray(len(vocab))
    for token, i in vocab.items():
        if not isinstance(token, str) or not token:
            fail(f"token {token!r} is not a non-empty string")
        if type(i) is not int or not 0 <= i < len(vocab):
            fail(f"token {token!r} has id {i!r}: ids are the integers 0 .. {len(vocab) - 1}")
        if seen[i]:
            fail(f"id {i} is given to two tokens")
        seen[i] = 1
    table = bytes_to_unicode()
    missing = [c for c in table.values() if c not in vocab]
    if missing:
        fail(f"byte token {missing[0]!r} is missing: a byte-level vocabulary has all 256")
    if not isinstance(merges, (list, tuple)):
        fail(f"merges must be a list of pairs, got {type(merges).__name__}")
    alphabet, made = set(table.values()), set(table.values())
    for rank, pair in enumerate(merges):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and
                all(isinstance(x, str) for x in pair)):
            fail(f"merge {rank} is not a pair of tokens: {pair!r:.60}")
        a, b = pair
        for part in (a, b):
            if part not in made:
                why = ("not a token of the vocabulary" if part not in vocab else
                       "neither a byte nor made by an earlier merge")
                fail(f"merge {rank} ({a} {b}): {part!r} is {why}")
        if a + b not in vocab:
            fail(f"merge {rank} ({a} {b}) makes {a + b!r}, which is not in the vocabulary")
        if a + b in made:
            fail(f"merge {rank} ({a} {b}) makes {a + b!r}, which a byte or an earlier merge "
                 "already made")
        made.add(a + b)
    for token in vocab:
        if token not in made and token != ENDOFTEXT:
            bad = next((c for c in token if c not in alphabet), None)
            what = (f"holds {bad!r}, which is not one of the 256 byte characters"
                    if bad is not None else "is made by no merge")
            fail(f"token {token!r} {what}")
    return dict(vocab), [tuple(p) for p in merges]


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
    text = _as_text(text)
    for piece in (text.split(ENDOFTEXT) if special else [text]):
        for chunk in _chunks(piece):
            for word in _words(chunk):
                counts[word] = counts.get(word, 0) + 1
    words = [[byte_id[b] for b in w.encode("utf-8", "surrogateescape")] for w in counts]
    freqs = list(counts.values())
    tokens = [table[b] for b in order]  # id -> its byte-level string
    merges = _learn(words, freqs, tokens, vocab_size - 257)
    vocab = {t: i for i, t in enumerate(tokens)}
    vocab[ENDOFTEXT] = len(vocab)
    return Tokenizer(vocab, merges, source="the trained vocabulary")


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
