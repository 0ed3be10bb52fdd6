"""The C tokenizer (pytfm_tokenizer.h, csrc/model/bpe.c) against its two oracles: Hugging Face
tokenizers (GPT2TokenizerFast) and pytfm.tokenizer (the bytes path for invalid UTF-8), on every
.py file of the standard library, on prose, on drawn Unicode and on random bytes; its Unicode
table against the running Python's unicodedata; hostile files refused with a message naming
the file; the size contract of encode and decode; and a bounded libFuzzer run. The oracles and
GPT-2's vocabulary are optional here (tests/model/gpt2_oracle.py: a skip without them, a
failure under CI)."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import CSRC, ROOT, TESTS
from pytfm._core import ffi, lib
from pytfm._ctokenizer import CTokenizer, unicode_version
from pytfm.tokenizer import ENDOFTEXT, TokenizerError, bytes_to_unicode

sys.path.insert(0, os.path.join(TESTS, "model"))
import gpt2_oracle  # noqa: E402  (tests/model's oracles: a skip without them, a failure in CI)
from gpt2_oracle import PROSE, UNICODE, small_files  # noqa: E402

stdlib_sources, transformers, vocab_files = (gpt2_oracle.stdlib_sources, gpt2_oracle.transformers,
                                             gpt2_oracle.vocab_files)
# its fixtures: GPT-2's vocabulary folder, pytfm.tokenizer and GPT2TokenizerFast on it
gpt2_vocab_folder = gpt2_oracle.gpt2_vocab_folder
gpt2_tokenizer = gpt2_oracle.gpt2_tokenizer
hf_tokenizer = gpt2_oracle.hf_tokenizer

FUZZ = os.path.join(TESTS, "c_api", "fuzz")
needs_csrc = pytest.mark.skipif(not os.path.isdir(CSRC), reason="needs the source checkout")


@pytest.fixture(scope="session")
def ctok(gpt2_vocab_folder):
    return CTokenizer.from_folder(str(gpt2_vocab_folder))


# ---- the Unicode table ----------------------------------------------------------------------


def load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_unicode_tables", os.path.join(ROOT, "dev", "gen_unicode_tables.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_csrc
def test_the_unicode_table_is_the_generators_output_on_this_pythons_unicode():
    """The checked-in table is what dev/gen_unicode_tables.py writes from this Python's
    unicodedata, where the versions agree (the library reports the table's)."""
    with open(os.path.join(CSRC, "model", "unicode_tables.h"), encoding="utf-8") as f:
        table = f.read()
    version = re.search(r'PYTFM__UNICODE_VERSION "([\d.]+)"', table).group(1)
    assert unicode_version() == version
    if unicodedata.unidata_version != version:
        pytest.skip(f"the table is of Unicode {version}, this Python's unicodedata of "
                    f"{unicodedata.unidata_version}")
    gen = load_generator()
    assert gen.header() == table
    ranges = gen.ranges()
    assert len(ranges) > 500 and ranges[0] == (0x9, 0xD, "W")


def test_every_code_point_is_classed_as_both_oracles_class_it(ctok, gpt2_tokenizer,
                                                               hf_tokenizer):
    """Every code point but the surrogates in the probes "a" c "!" and "1" c "!": the ids tell
    where the words' boundaries fall, so how c is classed. As pytfm.tokenizer on all of them,
    assigned or not (both class by the same Unicode); as tokenizers on those this Unicode
    assigns (its regex engine's later Unicode makes letters and numbers of some of the rest)."""
    if unicode_version() != unicodedata.unidata_version:
        pytest.skip("the table's Unicode is not this Python's: pytfm.tokenizer classes by it")
    codes = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c != ord("'")]
    assigned = [c for c in codes if unicodedata.category(chr(c)) != "Cn"]
    for probe in ("a{}!", "1{}!"):
        for start in range(0, len(codes), 1 << 16):
            text = "".join(probe.format(chr(c)) for c in codes[start:start + (1 << 16)])
            assert ctok.encode(text).tolist() == gpt2_tokenizer.encode(text), (probe, start)
        for start in range(0, len(assigned), 1 << 14):
            text = "".join(probe.format(chr(c)) for c in assigned[start:start + (1 << 14)])
            assert ctok.encode(text).tolist() == hf_tokenizer(text), (probe, start)


# ---- GPT-2's vocabulary: the stdlib, prose, drawn text, any bytes -------------------------------


def test_every_stdlib_source_is_tokenized_as_both_oracles_do(ctok, gpt2_tokenizer, hf_tokenizer):
    """All .py files of the standard library: equal to pytfm.tokenizer on every one (the few
    that are not UTF-8 through its bytes path), and to GPT2TokenizerFast on the UTF-8 ones;
    each comes back whole."""
    paths = stdlib_sources()
    assert len(paths) > 500
    compared = undecodable = total = 0
    for path in paths:
        with open(path, "rb") as f:
            raw = f.read()
        total += len(raw)
        ids = ctok.encode(raw)
        assert ctok.decode_bytes(ids) == raw, path
        assert ids.tolist() == gpt2_tokenizer.encode(raw), path
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            undecodable += 1
            continue
        assert ids.tolist() == hf_tokenizer(text), path
        compared += 1
    assert compared > 500 and undecodable < 10, (compared, undecodable)
    print(f"stdlib: {len(paths)} files, {total / 1e6:.1f} MB; {compared} against tokenizers "
          f"and pytfm.tokenizer, {undecodable} (not UTF-8) against pytfm.tokenizer")


def test_prose_is_tokenized_as_both_oracles_do(ctok, gpt2_tokenizer, hf_tokenizer):
    for text in (PROSE, PROSE.upper(), PROSE.replace(" ", "  "), PROSE.replace("\n", "\r\n"),
                 PROSE * 50):
        ids = ctok.encode(text).tolist()
        assert ids == hf_tokenizer(text) == gpt2_tokenizer.encode(text)
    assert ctok.encode("Hello world").tolist() == [15496, 995]
    assert ctok.encode(ENDOFTEXT).tolist() == [50256] == [ctok.eot]
    plain = ctok.encode(ENDOFTEXT, special=False).tolist()
    assert plain == gpt2_tokenizer.encode(ENDOFTEXT, special=False) and 50256 not in plain
    assert len(ctok) == 50257 and ctok.n_merges == 50000
    assert ctok.token_bytes(15496) == b"Hello" and ctok.token_bytes(50256) == ENDOFTEXT.encode()


@given(UNICODE)
def test_drawn_unicode_is_tokenized_as_both_oracles_do(ctok, gpt2_tokenizer, hf_tokenizer, text):
    """Emoji, CJK, combining marks, line ends, runs of spaces, digits, contractions, the special
    token, any assigned character."""
    ids = ctok.encode(text).tolist()
    assert ids == hf_tokenizer(text) == gpt2_tokenizer.encode(text)
    assert ctok.decode(ids) == text
    assert ctok.encode(text, special=False).tolist() == gpt2_tokenizer.encode(text, special=False)


BYTES = st.lists(st.one_of(st.binary(max_size=8), st.sampled_from(
    [b"\xff", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80 a",
     b" \xfe'll", b"\xf0\x9f\x98", " é😀 ".encode(), b"1\xff2", b"\xc0\xaf", b"\xe0\x80\x80",
     b"\xf8\x88\x80\x80\x80", b"  \xff", b"\n\xa0", b"'\xff", ENDOFTEXT.encode()]),
    UNICODE.map(str.encode)), max_size=16).map(b"".join)


@given(BYTES)
def test_any_bytes_are_tokenized_as_the_python_bytes_path_and_come_back(ctok, gpt2_tokenizer,
                                                                        data):
    """Invalid UTF-8: each byte that begins no valid sequence is one "other" character, as
    surrogateescape reads it; decode of encode is the identity."""
    ids = ctok.encode(data)
    assert ids.tolist() == gpt2_tokenizer.encode(data)
    assert ctok.decode_bytes(ids) == data
    assert ctok.encode(data, special=False).tolist() == gpt2_tokenizer.encode(data, special=False)


def test_random_bytes_in_bulk_match_the_python_bytes_path(ctok, gpt2_tokenizer):
    rng = np.random.default_rng(7)
    for size in (1, 2, 3, 17, 1000, 100_000):
        for _ in range(3):
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            ids = ctok.encode(data)
            assert ids.tolist() == gpt2_tokenizer.encode(data) and ctok.decode_bytes(ids) == data
    # long runs: one word of a million letters, spaces, digits or punctuation
    for run in (b"a", b" ", b"7", b"=", b"\xff", "日".encode(), b"ab"):
        data = run * (1_000_000 // len(run))
        assert ctok.encode(data).tolist() == gpt2_tokenizer.encode(data), run


# ---- the size contract ------------------------------------------------------------------------


def test_encode_and_decode_say_the_size_and_refuse_a_short_buffer(ctok):
    text = b"Hello world, it's me."
    count = ffi.new("int64_t *")
    handle = ctok._tok
    assert lib.pytfm_tokenizer_encode(handle, text, len(text), 1, ffi.NULL, 0, count) == 0
    want = ctok.encode(text)
    assert count[0] == len(want) == 7
    ids = ffi.new("int32_t[]", 8)
    st_ = lib.pytfm_tokenizer_encode(handle, text, len(text), 1, ids, 3, count)
    assert st_ == lib.PYTFM_STATUS_INVALID_ARGUMENT and count[0] == 7
    assert "needs 7 ids, capacity is 3" in ffi.string(lib.pytfm_last_error()).decode()
    assert list(ids[0:3]) == want.tolist()[:3] and ids[3] == 0
    assert lib.pytfm_tokenizer_encode(handle, ffi.NULL, 0, 1, ffi.NULL, 0, count) == 0
    assert count[0] == 0
    assert lib.pytfm_tokenizer_encode(handle, text, -1, 1, ffi.NULL, 0, count) == \
        lib.PYTFM_STATUS_INVALID_ARGUMENT
    src = ffi.new("int32_t[]", want.tolist())
    size = ffi.new("int64_t *")
    assert lib.pytfm_tokenizer_decode(handle, src, 7, ffi.NULL, 0, size) == 0
    assert size[0] == len(text)
    out = ffi.new("char[]", 5)
    assert lib.pytfm_tokenizer_decode(handle, src, 7, out, 5, size) == \
        lib.PYTFM_STATUS_INVALID_ARGUMENT and size[0] == len(text)
    assert ffi.unpack(out, 5) == text[:5]
    bad = ffi.new("int32_t[]", [1, 50257])
    assert lib.pytfm_tokenizer_decode(handle, bad, 2, ffi.NULL, 0, size) == \
        lib.PYTFM_STATUS_OUT_OF_RANGE
    assert "ids[1] is 50257, outside the vocabulary [0, 50257)" in \
        ffi.string(lib.pytfm_last_error()).decode()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ctok.decode([-1])
    with pytest.raises(ValueError, match="lone surrogate"):
        ctok.encode("a\udc80")
    with pytest.raises(TypeError, match="text must be a str or bytes, got int"):
        ctok.encode(3)
    assert lib.pytfm_tokenizer_vocab_size(ffi.NULL) == 0 and lib.pytfm_tokenizer_eot(ffi.NULL) == -1


def test_a_long_text_is_counted_first_and_gives_the_same_ids(ctok, monkeypatch):
    import pytfm._ctokenizer as ct

    text = (PROSE * 20).encode()
    want = ctok.encode(text).tolist()
    monkeypatch.setattr(ct, "_ONE_PASS", 100)
    assert ctok.encode(text).tolist() == want and ctok.encode(b"").tolist() == []


def test_threads_encoding_at_once_agree(ctok):
    """One tokenizer, four threads: the cache is one encode's at a time, the others merge
    without it, and every result is the same."""
    from concurrent.futures import ThreadPoolExecutor

    text = (PROSE * 200).encode()
    want = ctok.encode(text).tolist()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: ctok.encode(text).tolist(), range(8)))
    assert all(g == want for g in got)


# ---- files ------------------------------------------------------------------------------------


def test_tokenizer_json_and_vocab_and_merges_give_the_same_ids(ctok, gpt2_vocab_folder,
                                                               tmp_path):
    tf = transformers()
    tf.GPT2TokenizerFast.from_pretrained(str(gpt2_vocab_folder)).save_pretrained(str(tmp_path))
    from_json = CTokenizer.from_tokenizer_json(str(tmp_path / "tokenizer.json"))
    assert len(from_json) == len(ctok) and from_json.eot == ctok.eot == 50256
    assert from_json.encode(PROSE).tolist() == ctok.encode(PROSE).tolist()
    vocab, merges = vocab_files()
    with open(vocab, "rb") as v, open(merges, "rb") as m:
        mem = CTokenizer.from_memory(v.read(), m.read())
    assert mem.encode(PROSE).tolist() == ctok.encode(PROSE).tolist()


TABLE = list(bytes_to_unicode().values())
BASE = {c: i for i, c in enumerate(TABLE)}


def test_a_small_vocabulary_works(tmp_path):
    tok = CTokenizer.from_folder(small_files(tmp_path))
    assert tok.encode(" the").tolist() == [257, BASE["e"]] and tok.eot == 258
    assert tok.decode(tok.encode(" the<|endoftext|>")) == " the<|endoftext|>"
    empty = small_files(tmp_path, vocab={**BASE}, merges=[])
    assert CTokenizer.from_folder(empty).encode(" the").tolist() == [BASE[c] for c in "Ġthe"]
    assert CTokenizer.from_folder(empty).eot is None


HOSTILE = [
    (dict(vocab={**BASE, "Ġt": 256, ENDOFTEXT: 257}),
     r"merge 1 \(\\x20t h\) makes a token that is not in the vocabulary"),
    (dict(merges=[("Ġ", "t"), ("Ġt", "h"), ("Ġ", "t")]),
     "merge 2 .* makes a token that a byte or an earlier merge already made"),
    (dict(merges=[("Ġt", "h"), ("Ġ", "t")]),
     r"merge 0: \\x20t is neither a byte nor made by an earlier merge"),
    (dict(merges=[("Ġ", "t"), ("Ġt", "x")]), r"merge 1 .* not in the vocabulary"),
    (dict(merges=[("Ġ", "t")]), r"token \\x20th \(id 257\) is made by no merge"),
    (dict(merges=[("Ġ", "t"), ("Ġt", "h"), ("Ġt", "hé")]),
     r"merge 2: h\\xe9 is not a token of the vocabulary"),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": 258, ENDOFTEXT: 257, "xyz\u2603": 259}),
     r"holds U\+2603, which is not one of the 256 byte characters"),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": 256, ENDOFTEXT: 257}), "id 256 is given to two tokens"),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": 300, ENDOFTEXT: 257}),
     r'token "\\u0120th" has id 300: ids are'),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": True, ENDOFTEXT: 257}), r'"\\u0120th" has id true'),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": 257.0, ENDOFTEXT: 258}),
     r'"\\u0120th" has id 257\.0'),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": -1, ENDOFTEXT: 258}), r'"\\u0120th" has id -1'),
    (dict(vocab={**BASE, "Ġt": 256, "": 257, ENDOFTEXT: 258}), "a token is the empty string"),
    (dict(vocab={c: i for i, c in enumerate(TABLE[1:])}), "a byte-level vocabulary has 256 to"),
    (dict(vocab={**{c: i for i, c in enumerate(TABLE[1:])}, "Ġt": 255, "Ġth": 256,
                 ENDOFTEXT: 257}), r"byte token U\+0021 \(byte 0x21\) is missing"),
    (dict(vocab=[1, 2]), "the vocabulary must be a JSON object"),
    (dict(vocab_text=b'{"a": 1, "a": 2}'), "duplicate key"),
    (dict(vocab_text=b'{"\\u0100": 1, "\\u0100": 2}'), "duplicate key"),
    (dict(vocab_text=b'{"\\ud800": 1}'), "holds a lone surrogate"),
    (dict(vocab_text=b'{"\xff": 1}'), "not UTF-8"),
    (dict(vocab_text=b'{"a": NaN}'), "not valid JSON"),
    (dict(vocab_text=b'{"a": 1'), "not valid JSON"),
    (dict(vocab_text=b'[' * 100000), "not valid JSON"),
    (dict(vocab_text=b''), "not valid JSON"),
    (dict(merges_text=b"#version: 0.2\n\xc3\x28 t\n"), "not UTF-8"),
    (dict(merges_text=b"#version: 0.2\n\xc4\xa0 t\nabc\n"), r"line 2: 'abc' is not a merge"),
    (dict(merges_text=b"#version: 0.2\n\xc4\xa0  t\n"), r"line 1: .* is not a merge"),
    (dict(merges_text=b"#version: 0.2\n\xc4\xa0 t\n\xc4\xa0t h\n" + b"a b\n" * 10),
     "12 merges for 259 tokens"),
]


@pytest.mark.parametrize("edit, message", HOSTILE)
def test_hostile_files_are_refused_naming_the_file(tmp_path, edit, message):
    folder = small_files(tmp_path, **edit)
    with pytest.raises(TokenizerError, match=message) as e:
        CTokenizer.from_folder(folder)
    assert folder in str(e.value)
    with open(os.path.join(folder, "vocab.json"), "rb") as v, \
            open(os.path.join(folder, "merges.txt"), "rb") as m:
        with pytest.raises(TokenizerError, match=message):
            CTokenizer.from_memory(v.read(), m.read())


def test_a_vocabulary_with_a_lone_surrogate_token_is_refused(tmp_path):
    folder = small_files(tmp_path, vocab={**BASE, "Ġt": 256, "Ġth": 257, "\ud800": 258})
    with pytest.raises(TokenizerError, match=r"not valid JSON .* holds a lone surrogate"):
        CTokenizer.from_folder(folder)


def test_files_that_are_not_files_or_too_large_are_refused(tmp_path):
    folder = small_files(tmp_path)
    with pytest.raises(TokenizerError, match="nowhere.json: cannot open"):
        CTokenizer.from_files(str(tmp_path / "nowhere.json"), os.path.join(folder, "merges.txt"))
    with pytest.raises(TokenizerError, match="not a regular file"):
        CTokenizer.from_files(str(tmp_path), os.path.join(folder, "merges.txt"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TokenizerError, match="fifo: not a regular file"):
        CTokenizer.from_tokenizer_json(str(fifo))
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(lib.PYTFM_TOKENIZER_MAX_FILE + 1)
    with pytest.raises(TokenizerError, match="more than the 268435456 a tokenizer file may"):
        CTokenizer.from_tokenizer_json(str(big))
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        CTokenizer.from_folder(str(tmp_path / "nowhere"))
    out = ffi.new("pytfm_tokenizer **")
    assert lib.pytfm_tokenizer_open_memory(b"{}", 1 << 40, b"", 0, out) == \
        lib.PYTFM_STATUS_INVALID_ARGUMENT and out[0] == ffi.NULL
    assert "vocab_size must be in [0, 268435456]" in ffi.string(lib.pytfm_last_error()).decode()


def hf_json(tmp_path):
    """A tokenizer.json of the small vocabulary as transformers writes it: (path, its doc)."""
    tf = transformers()
    folder = small_files(tmp_path)
    tf.GPT2TokenizerFast.from_pretrained(folder).save_pretrained(str(tmp_path / "hf"))
    path = tmp_path / "hf" / "tokenizer.json"
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["model"].update(type="WordPiece"), r'model.type must be "BPE"'),
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "normalizer must be null"),
    (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space false"),
    (lambda d: d["pre_tokenizer"].update(type="Whitespace"), "pre_tokenizer must be ByteLevel"),
    (lambda d: d.update(decoder={"type": "WordPiece"}), "decoder must be ByteLevel or null"),
    (lambda d: d["model"].update(ignore_merges=True), "model.ignore_merges must be absent"),
    (lambda d: d["model"].update(dropout=0.1), "model.dropout must be absent, null"),
    (lambda d: d["model"].update(unk_token="x"), "model.unk_token must be absent"),
    (lambda d: d["added_tokens"].append({"content": "<pad>", "id": 259}), "added tokens"),
    (lambda d: d["model"]["merges"].append("a b c"), r"model.merges\[2\]: .* is not a merge"),
    (lambda d: d["model"]["merges"].append(["a", 3]), r"model.merges\[2\]: .* is not a merge"),
    (lambda d: d["model"]["merges"].append(["Ġth", "e"]), "not in the vocabulary"),
    (lambda d: d["model"].update(merges={}), "model.merges must be a list"),
    (lambda d: d["model"].pop("vocab"), "model.vocab is missing"),
    (lambda d: d.update(model=3), r'model.type must be "BPE"'),
])
def test_a_tokenizer_json_that_tokenizes_otherwise_is_refused(tmp_path, edit, message):
    path, doc = hf_json(tmp_path)
    tok = CTokenizer.from_tokenizer_json(str(path))  # as written: fine
    assert tok.encode(" the").tolist() == [257, BASE["e"]]
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenizerError, match=message) as e:
        CTokenizer.from_tokenizer_json(str(path))
    assert str(path) in str(e.value)
    with pytest.raises(TokenizerError, match=message):
        CTokenizer.from_tokenizer_json_memory(path.read_bytes())


def test_merges_as_pairs_in_tokenizer_json_are_read(tmp_path):
    path, doc = hf_json(tmp_path)
    doc["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m
                              for m in doc["model"]["merges"]]
    path.write_text(json.dumps(doc))
    assert CTokenizer.from_tokenizer_json(str(path)).encode(" the").tolist() == [257, BASE["e"]]


# ---- the fuzzer ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tokenizer_fuzzer(tmp_path_factory):
    from test_c_checkpoint import build_fuzz_target

    return build_fuzz_target(tmp_path_factory, "fuzz_tokenizer")


def fuzz_for_a_while(exe, tmp_path, env):
    from test_c_checkpoint import fuzz_for_a_while as run

    which = "GPT-2's" if env["PYTFM_FUZZ_VOCAB"] else "a small"
    kept, _ = run(exe, tmp_path, "tokenizer.dict", "tokenizer_seeds", env,
                  f"libFuzzer (tokenizer, {which} vocabulary)")
    return kept


@needs_csrc
def test_fuzzing_the_tokenizer_for_a_while_finds_nothing(tokenizer_fuzzer, tmp_path):
    """A bounded libFuzzer run from the seeds (PYTFM_FUZZ_SECONDS, default 10) with the target's
    small vocabulary: no crash, no leak, decode∘encode the identity; then every kept input
    opened from Python agrees with the fuzz target (opens or is refused with a message)."""
    kept = fuzz_for_a_while(tokenizer_fuzzer, tmp_path, {"PYTFM_FUZZ_VOCAB": ""})
    assert kept
    for path in kept:
        raw = path.read_bytes()
        if not raw or raw[0] % 3 == 0:
            continue
        try:
            if raw[0] % 3 == 1:
                vocab, _, merges = raw[1:].partition(b"\0")
                tok = CTokenizer.from_memory(vocab, merges)
            else:
                tok = CTokenizer.from_tokenizer_json_memory(raw[1:])
        except TokenizerError as e:
            assert str(e)
            continue
        assert tok.decode_bytes(tok.encode(raw)) == raw


@needs_csrc
def test_fuzzing_text_on_gpt2s_vocabulary_finds_nothing(tokenizer_fuzzer, tmp_path):
    vocab, _ = vocab_files()
    kept = fuzz_for_a_while(tokenizer_fuzzer, tmp_path,
                            {"PYTFM_FUZZ_VOCAB": os.path.dirname(vocab)})
    assert kept


@needs_csrc
def test_hostile_files_and_seeds_pass_the_fuzz_target(tokenizer_fuzzer, tmp_path):
    """Every hostile file above, as an input of the fuzz target (vocab.json NUL merges.txt),
    and the seeds, run once under ASan and LeakSanitizer: refused without a leak."""
    inputs = []
    for n, (edit, _) in enumerate(HOSTILE):
        (tmp_path / str(n)).mkdir()
        folder = small_files(tmp_path / str(n), **edit)
        with open(os.path.join(folder, "vocab.json"), "rb") as v, \
                open(os.path.join(folder, "merges.txt"), "rb") as m:
            vocab, merges = v.read(), m.read()
        if b"\0" in vocab:
            continue
        path = tmp_path / f"hostile-{n}"
        path.write_bytes(b"\x01" + vocab + b"\0" + merges)
        inputs.append(str(path))
    seeds = os.path.join(FUZZ, "tokenizer_seeds")
    inputs += [os.path.join(seeds, f) for f in sorted(os.listdir(seeds))]
    run = subprocess.run([tokenizer_fuzzer, *inputs], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTFM_FUZZ_VOCAB": ""})
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stderr.count("Executed ") == len(inputs), run.stderr[-2000:]
