"""pytfm.tokenizer (the C library's tokenizer) against Hugging Face tokenizers
(GPT2TokenizerFast): the pre-tokenizer's classes on every code point, GPT-2's vocabulary on every
.py file of the standard library, on prose and on drawn Unicode; decode∘encode on any bytes; the
files it reads, hostile ones refused (tokenizer_cases.py, the table C is held to as well); a
tokenizer trained here read back by transformers. The oracles are optional (gpt2_oracle.py: a
skip without them, a failure under CI)."""

import json
import os
import re
import unicodedata

import numpy as np
import pytest
from gpt2_oracle import PROSE, UNICODE, small_files, stdlib_sources, tokenizers, transformers
from hypothesis import given
from hypothesis import strategies as st
from tokenizer_cases import BASE, HOSTILE, TABLE, hostile_folder, tokenizer_json

from pytfm import tokenizer as tk
from pytfm.tokenizer import ENDOFTEXT, Tokenizer, TokenizerError, bytes_to_unicode, pretokenize

# ---- the pre-tokenizer ------------------------------------------------------------------------


def test_bytes_to_unicode_is_gpt2s_table():
    table = bytes_to_unicode()
    assert list(table)[:3] == [33, 34, 35] and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[32] == "Ġ" and table[10] == "Ċ" and table[0] == "Ā"
    assert all(c.isprintable() and not c.isspace() for c in table.values())


def hf_words(pre, text):
    """tokenizers' ByteLevel pre-tokenizer (GPT-2's) on text: the words' (start, end)."""
    return [span for _, span in pre.pre_tokenize_str(text)]


def our_words(text):
    """pretokenize's words of text (a str, or bytes read with surrogateescape): (start, end)
    in characters."""
    out, at = [], 0
    for w in pretokenize(text):
        n = len(w.decode("utf-8", "surrogateescape"))
        out.append((at, at + n))
        at += n
    return out


def test_the_character_classes_are_tokenizers_on_every_assigned_code_point():
    """Every code point c (not a surrogate) in two probes, "a" c "!" and "1" c "!": where the
    words' boundaries fall tells whether the pre-tokenizer takes c for a letter, a number,
    whitespace or something else. Equal to tokenizers' on every code point the running
    Python's Unicode assigns (the library's tables are generated from it,
    dev/gen_unicode_tables.py); the ones it leaves unassigned (Cn) may be letters or numbers
    of a later Unicode to tokenizers' regex engine, and are "other" here."""
    pre = tokenizers().pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    codes = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c != ord("'")]
    assigned = [c for c in codes if unicodedata.category(chr(c)) != "Cn"]
    for probe in ("a{}!", "1{}!"):
        for start in range(0, len(assigned), 4096):
            text = "".join(probe.format(chr(c)) for c in assigned[start:start + 4096])
            assert our_words(text) == hf_words(pre, text), (probe, hex(assigned[start]))


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_the_words_of_any_text_join_to_it(text):
    assert b"".join(pretokenize(text)) == text.encode()


BYTES = st.lists(st.one_of(st.binary(max_size=8), st.sampled_from(
    [b"\xff", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80 a",
     b" \xfe'll", b"\xf0\x9f\x98", " é😀 ".encode(), b"1\xff2", b"\xc0\xaf", b"\xe0\x80\x80",
     b"\xf8\x88\x80\x80\x80", b"  \xff", b"\n\xa0", b"'\xff", ENDOFTEXT.encode()]),
    UNICODE.map(str.encode)), max_size=16).map(b"".join)


@given(BYTES)
def test_invalid_utf8_is_split_as_tokenizers_splits_an_other_character(data):
    """A byte that begins no valid UTF-8 sequence is one "other" character (as Python's
    surrogateescape reads it): the words are tokenizers' on the text with U+0000 (an "other"
    character) in its place."""
    pre = tokenizers().pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    text = data.decode("utf-8", "surrogateescape")
    stand_in = re.sub("[\udc80-\udcff]", "\x00", text)
    assert our_words(data) == hf_words(pre, stand_in)


# ---- GPT-2's vocabulary, against GPT2TokenizerFast ---------------------------------------------


def test_every_stdlib_source_is_tokenized_as_gpt2tokenizerfast_does(gpt2_tokenizer,
                                                                     hf_tokenizer):
    """All .py files of the standard library (1,790 on Python 3.11, 31.5 MB; the few that are
    not UTF-8 go through the bytes path and come back whole)."""
    paths = stdlib_sources()
    assert len(paths) > 500
    compared = undecodable = 0
    for path in paths:
        with open(path, "rb") as f:
            raw = f.read()
        ids = gpt2_tokenizer.encode(raw)
        assert gpt2_tokenizer.decode_bytes(ids) == raw, path
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            undecodable += 1
            continue
        assert ids == hf_tokenizer(text), path
        compared += 1
    assert compared > 500 and undecodable < 10, (compared, undecodable)


def test_prose_is_tokenized_as_gpt2tokenizerfast_does(gpt2_tokenizer, hf_tokenizer):
    for text in (PROSE, PROSE.upper(), PROSE.replace(" ", "  "), PROSE.replace("\n", "\r\n"),
                 PROSE * 50):
        assert gpt2_tokenizer.encode(text) == hf_tokenizer(text)
    assert gpt2_tokenizer.encode("Hello world") == [15496, 995]
    assert gpt2_tokenizer.encode(ENDOFTEXT) == [50256] == [gpt2_tokenizer.eot]
    plain = gpt2_tokenizer.encode(ENDOFTEXT, special=False)
    assert 50256 not in plain and gpt2_tokenizer.decode(plain) == ENDOFTEXT
    assert len(gpt2_tokenizer) == 50257 and len(gpt2_tokenizer.merges) == 50000
    assert gpt2_tokenizer.token_bytes(15496) == b"Hello"
    assert gpt2_tokenizer.token_bytes(50256) == ENDOFTEXT.encode()


@given(UNICODE)
def test_drawn_unicode_is_tokenized_as_gpt2tokenizerfast_does(gpt2_tokenizer, hf_tokenizer,
                                                             text):
    """Emoji, CJK, combining marks, line ends, runs of spaces, digits, contractions, the special
    token, any assigned character."""
    ids = gpt2_tokenizer.encode(text)
    assert ids == hf_tokenizer(text)
    assert gpt2_tokenizer.decode(ids) == text
    assert gpt2_tokenizer.encode(text.encode("utf-8")) == ids


@given(BYTES)
def test_decode_of_encode_is_the_identity_on_any_bytes(gpt2_tokenizer, data):
    """Invalid UTF-8 through the bytes path: each undecodable byte stays itself."""
    for special in (True, False):
        ids = gpt2_tokenizer.encode(data, special=special)
        assert gpt2_tokenizer.decode_bytes(ids) == data
        assert gpt2_tokenizer.decode(ids) == data.decode("utf-8", "replace")
        assert all(0 <= i < len(gpt2_tokenizer) for i in ids)


def test_random_bytes_and_long_runs_come_back(gpt2_tokenizer):
    rng = np.random.default_rng(7)
    for size in (1, 2, 3, 17, 1000, 100_000):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert gpt2_tokenizer.decode_bytes(gpt2_tokenizer.encode(data)) == data
    # long runs: one word of a million letters, spaces, digits or punctuation
    for run in (b"a", b" ", b"7", b"=", b"\xff", "日".encode(), b"ab"):
        data = run * (1_000_000 // len(run))
        assert gpt2_tokenizer.decode_bytes(gpt2_tokenizer.encode_array(data)) == data, run


def test_a_long_text_is_counted_first_and_gives_the_same_ids(gpt2_tokenizer, monkeypatch):
    text = (PROSE * 20).encode()
    want = gpt2_tokenizer.encode(text)
    words = pretokenize(text)
    monkeypatch.setattr(tk, "_ONE_PASS", 100)
    assert gpt2_tokenizer.encode(text) == want and gpt2_tokenizer.encode(b"") == []
    assert pretokenize(text) == words and pretokenize(b"") == []


def test_text_that_is_not_unicode_and_ids_outside_the_vocabulary_are_refused(gpt2_tokenizer):
    with pytest.raises(ValueError, match=r"lone surrogate '\\udc80' at index 2.*pass bytes"):
        gpt2_tokenizer.encode("ab\udc80")
    with pytest.raises(TypeError, match="text must be a str or bytes-like, got int"):
        gpt2_tokenizer.encode(3)
    for bad in ([50257], [-1], [0, 2**40]):
        with pytest.raises(ValueError, match=r"ids: token -?\d+ is outside the vocabulary"):
            gpt2_tokenizer.decode(bad)
    with pytest.raises(ValueError, match="1-D sequence of integer token ids"):
        gpt2_tokenizer.decode([[1, 2]])
    with pytest.raises(ValueError, match="dtype must be an integer type holding ids up to 50256"):
        gpt2_tokenizer.encode_array("x", dtype=np.uint8)
    with pytest.raises(ValueError, match="id 50257 is outside the vocabulary"):
        gpt2_tokenizer.token_bytes(50257)
    assert gpt2_tokenizer.encode_array("Hello world", dtype=np.uint16).tolist() == [15496, 995]


# ---- files -------------------------------------------------------------------------------------


def test_vocab_and_merges_and_tokenizer_json_give_the_same_tokenizer(gpt2_tokenizer,
                                                                     gpt2_vocab_folder, tmp_path):
    """tokenizer.json as transformers writes it, and the files pytfm writes, read back."""
    tf = transformers()
    tf.GPT2TokenizerFast.from_pretrained(str(gpt2_vocab_folder)).save_pretrained(str(tmp_path))
    from_json = Tokenizer.from_tokenizer_json(str(tmp_path / "tokenizer.json"))
    assert from_json.vocab == gpt2_tokenizer.vocab and from_json.merges == gpt2_tokenizer.merges
    assert from_json.encode(PROSE) == gpt2_tokenizer.encode(PROSE)
    gpt2_tokenizer.save(str(tmp_path / "again"))
    again = Tokenizer.from_folder(str(tmp_path / "again"))
    assert again.vocab == gpt2_tokenizer.vocab and again.merges == gpt2_tokenizer.merges
    assert again.encode(PROSE) == gpt2_tokenizer.encode(PROSE)


def test_a_small_vocabulary_works(tmp_path):
    tok = Tokenizer.from_folder(small_files(tmp_path))
    assert tok.encode(" the") == [257, BASE["e"]] and tok.eot == 258
    assert tok.decode(tok.encode(" the<|endoftext|>")) == " the<|endoftext|>"
    assert tok.merges == [("Ġ", "t"), ("Ġt", "h")] and list(tok.vocab)[256:] == [
        "Ġt", "Ġth", ENDOFTEXT]
    # without <|endoftext|> in the vocabulary, it is the next id (GPT2TokenizerFast adds it)
    bare = Tokenizer({**BASE}, [])
    assert bare.encode(" the") == [BASE[c] for c in "Ġthe"] and bare.eot == 256
    assert bare.encode(f"a{ENDOFTEXT}") == [BASE["a"], 256] and bare.decode([256]) == ENDOFTEXT
    assert repr(bare) == "Tokenizer(257 tokens, 0 merges)"


def test_the_folder_rule(tmp_path):
    """vocab.json + merges.txt when both are there, else tokenizer.json, its merges as "a b" or
    [a, b] (as transformers reads it)."""
    folder = tmp_path / "tok"
    small_files(tmp_path, merges=[("Ġ", "t")])
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    with pytest.raises(TokenizerError, match=r"merges.txt: token 'Ġth' \(id 257\) is made by"):
        Tokenizer.from_folder(folder)  # the pair is read, and it is bad
    os.unlink(folder / "merges.txt")
    for merges in (["Ġ t", "Ġt h"], [["Ġ", "t"], ["Ġt", "h"]]):
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(merges=merges)))
        tok = Tokenizer.from_folder(folder)
        assert tok.encode(" the") == [257, BASE["e"]] and len(tok) == 259 and tok.eot == 258
        fast = transformers().PreTrainedTokenizerFast(
            tokenizer_file=str(folder / "tokenizer.json"))
        assert fast.encode(" the") == [257, BASE["e"]]


@pytest.mark.parametrize("case", range(len(HOSTILE)))
def test_hostile_files_are_refused_with_their_message(tmp_path, case):
    """Each case of tokenizer_cases.HOSTILE: the one message, naming the file (C programs get
    the same: tests/c_api/test_c_tokenizer.py)."""
    folder, message = hostile_folder(tmp_path, case)
    with pytest.raises((TokenizerError, FileNotFoundError)) as e:
        Tokenizer.from_folder(folder)
    text = e.value.strerror if isinstance(e.value, OSError) else str(e.value)
    assert re.fullmatch(message, text), text


def test_files_that_are_not_files_or_too_large_are_refused(tmp_path):
    folder = small_files(tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere.json: cannot open"):
        Tokenizer.from_files(str(tmp_path / "nowhere.json"), os.path.join(folder, "merges.txt"))
    with pytest.raises(TokenizerError, match="not a regular file"):
        Tokenizer.from_files(str(tmp_path), os.path.join(folder, "merges.txt"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TokenizerError, match="fifo: not a regular file"):
        Tokenizer.from_tokenizer_json(str(fifo))
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(tk.MAX_FILE + 1)
    with pytest.raises(TokenizerError, match=r"big.json: 268435457 bytes, more than the "
                       "268435456 a tokenizer file may have"):
        Tokenizer.from_tokenizer_json(str(big))
    with pytest.raises(TypeError, match="folder must be a path, got int"):
        Tokenizer.from_folder(3)


def test_a_vocabulary_and_merges_given_in_python_are_checked_as_files_are():
    with pytest.raises(TokenizerError, match=r"the vocabulary and the merges: merge 1 \(Ġ t\) "
                       "repeats merge 0"):
        Tokenizer({**BASE, "Ġt": 256}, [("Ġ", "t"), ("Ġ", "t")])
    with pytest.raises(TokenizerError, match=r"merge 1 is not a pair of tokens: \('a b', 'c'\)"):
        Tokenizer({**BASE}, [("Ġ", "t"), ("a b", "c")])
    with pytest.raises(TokenizerError, match="the vocabulary: not valid JSON"):
        Tokenizer({**BASE, "x": float("nan")}, [])


# ---- training ------------------------------------------------------------------------------------


def test_a_trained_tokenizer_is_deterministic_and_transformers_reads_it(tmp_path):
    text = (PROSE * 3).encode() + b"\xff\xfe binary \x00 bytes"
    tok = tk.train(text, 400)
    assert len(tok) == 400 and len(tok.merges) == 143 and tok.eot == 399
    assert list(tok.vocab)[:256] == TABLE  # GPT-2's byte order
    again = tk.train(text, 400)
    assert again.vocab == tok.vocab and again.merges == tok.merges
    ids = tok.encode(text)
    assert tok.decode_bytes(ids) == text and len(ids) < 0.7 * len(text)
    tok.save(str(tmp_path))
    fast = transformers().GPT2TokenizerFast.from_pretrained(str(tmp_path)).backend_tokenizer
    assert fast.encode(PROSE, add_special_tokens=False).ids == tok.encode(PROSE)


def test_training_on_a_text_of_few_pairs_stops_early_and_checks_its_size():
    tok = tk.train(b"abababab", 1000)
    assert len(tok.merges) <= 7 and tok.decode(tok.encode("abab")) == "abab"
    for bad in (256, 2**30, 3.0, True):
        with pytest.raises(ValueError, match="vocab_size must be an int in"):
            tk.train(b"ab", bad)


def test_the_most_frequent_pair_is_merged_first():
    tok = tk.train("aa aa aa bb bb", 260)
    assert tok.merges[0] == ("a", "a")
    assert re.fullmatch(r"Ġ|a|b", tok.merges[1][0]) is not None
