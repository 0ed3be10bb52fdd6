"""pytfm.tokenizer against Hugging Face tokenizers (GPT2TokenizerFast): the pre-tokenizer's
classes on every code point, GPT-2's vocabulary on every .py file of the standard library, on
prose and on drawn Unicode; decode∘encode on any bytes; the files it reads, hostile ones
refused; a tokenizer trained here read back by transformers. The oracles are optional
(gpt2_oracle.py: a skip without them, a failure under CI)."""

import json
import re
import unicodedata

import numpy as np
import pytest
from gpt2_oracle import PROSE, UNICODE, small_files, stdlib_sources, tokenizers, transformers
from hypothesis import given
from hypothesis import strategies as st

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
    out, at = [], 0
    for w in pretokenize(text):
        out.append((at, at + len(w)))
        at += len(w)
    return out


def test_the_character_classes_are_tokenizers_on_every_assigned_code_point():
    """Every code point c (not a surrogate) in two probes, "a" c "!" and "1" c "!": where the
    words' boundaries fall tells whether the pre-tokenizer takes c for a letter, a number,
    whitespace or something else. Equal to tokenizers' on every code point the running
    Python's Unicode assigns; the ones it leaves unassigned (Cn) are letters or numbers of a
    later Unicode to tokenizers' regex engine, and "other" here (the module's docstring)."""
    pre = tokenizers().pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    codes = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c != ord("'")]
    assigned = [c for c in codes if unicodedata.category(chr(c)) != "Cn"]
    for probe in ("a{}!", "1{}!"):
        for start in range(0, len(assigned), 4096):
            text = "".join(probe.format(chr(c)) for c in assigned[start:start + 4096])
            assert our_words(text) == hf_words(pre, text), (probe, hex(assigned[start]))


def test_words_join_to_the_text_and_long_texts_are_cut_where_nothing_changes(monkeypatch):
    text = (PROSE * 40).replace("\n\n", "\nx\n")
    whole = pretokenize(text)
    assert "".join(whole) == text
    monkeypatch.setattr(tk, "CHUNK", 97)  # many cuts, each between "X\n" and "Y"
    cut = list(tk._chunks(text))
    assert len(cut) > 10 and "".join(cut) == text
    assert [w for c in cut for w in pretokenize(c)] == whole


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_the_words_of_any_text_join_to_it(text):
    assert "".join(pretokenize(text)) == text


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
    for text in (PROSE, PROSE.upper(), PROSE.replace(" ", "  "), PROSE.replace("\n", "\r\n")):
        assert gpt2_tokenizer.encode(text) == hf_tokenizer(text)
    assert gpt2_tokenizer.encode("Hello world") == [15496, 995]
    assert gpt2_tokenizer.encode(ENDOFTEXT) == [50256] == [gpt2_tokenizer.eot]
    plain = gpt2_tokenizer.encode(ENDOFTEXT, special=False)
    assert 50256 not in plain and gpt2_tokenizer.decode(plain) == ENDOFTEXT


@given(UNICODE)
def test_drawn_unicode_is_tokenized_as_gpt2tokenizerfast_does(gpt2_tokenizer, hf_tokenizer,
                                                             text):
    """Emoji, CJK, combining marks, line ends, runs of spaces, digits, contractions, the special
    token, any assigned character."""
    ids = gpt2_tokenizer.encode(text)
    assert ids == hf_tokenizer(text)
    assert gpt2_tokenizer.decode(ids) == text
    assert gpt2_tokenizer.encode(text.encode("utf-8")) == ids


@given(st.lists(st.one_of(st.binary(max_size=6), st.sampled_from(
    [b"\xff", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80 a",
     b" \xfe'll", b"\xf0\x9f\x98", " é😀 ".encode(), b"1\xff2"]), UNICODE.map(str.encode)),
    max_size=12).map(b"".join))
def test_decode_of_encode_is_the_identity_on_any_bytes(gpt2_tokenizer, data):
    """Invalid UTF-8 through the bytes path: each undecodable byte stays itself."""
    ids = gpt2_tokenizer.encode(data)
    assert gpt2_tokenizer.decode_bytes(ids) == data
    assert gpt2_tokenizer.decode(ids) == data.decode("utf-8", "replace")
    assert all(0 <= i < len(gpt2_tokenizer) for i in ids)


def test_text_that_is_not_unicode_and_ids_outside_the_vocabulary_are_refused(gpt2_tokenizer):
    with pytest.raises(ValueError, match=r"lone surrogate '\\udc80' at index 2.*pass bytes"):
        gpt2_tokenizer.encode("ab\udc80")
    with pytest.raises(TypeError, match="text must be a str or bytes, got int"):
        gpt2_tokenizer.encode(3)
    for bad in ([50257], [-1], [0, 2**40]):
        with pytest.raises(ValueError, match=r"ids: token -?\d+ is outside the vocabulary"):
            gpt2_tokenizer.decode(bad)
    with pytest.raises(ValueError, match="1-D sequence of integer token ids"):
        gpt2_tokenizer.decode([[1, 2]])
    with pytest.raises(ValueError, match="dtype must be an integer type holding ids up to 50256"):
        gpt2_tokenizer.encode_array("x", dtype=np.uint8)
    assert gpt2_tokenizer.encode_array("Hello world", dtype=np.uint16).tolist() == [15496, 995]


# ---- files -------------------------------------------------------------------------------------


def test_vocab_and_merges_and_tokenizer_json_give_the_same_tokenizer(gpt2_tokenizer,
                                                                     gpt2_vocab_folder, tmp_path):
    """tokenizer.json as transformers writes it, and the files pytfm writes, read back."""
    tf = transformers()
    tf.GPT2TokenizerFast.from_pretrained(str(gpt2_vocab_folder)).save_pretrained(str(tmp_path))
    from_json = Tokenizer.from_tokenizer_json(str(tmp_path / "tokenizer.json"))
    assert from_json.vocab == gpt2_tokenizer.vocab and from_json.merges == gpt2_tokenizer.merges
    gpt2_tokenizer.save(str(tmp_path / "again"))
    again = Tokenizer.from_folder(str(tmp_path / "again"))
    assert again.vocab == gpt2_tokenizer.vocab and again.merges == gpt2_tokenizer.merges
    assert again.encode(PROSE) == gpt2_tokenizer.encode(PROSE)


def test_a_small_vocabulary_works(tmp_path):
    tok = Tokenizer.from_folder(small_files(tmp_path))
    assert tok.encode(" the") == [256 + 1, bytes_to_unicode_ids()["e"]]
    assert tok.decode(tok.encode(" the<|endoftext|>")) == " the<|endoftext|>"


def bytes_to_unicode_ids():
    return {c: i for i, c in enumerate(bytes_to_unicode().values())}


TABLE = list(bytes_to_unicode().values())
BASE = {c: i for i, c in enumerate(TABLE)}


@pytest.mark.parametrize("edit, message", [
    (dict(vocab={**BASE, "Ġt": 256, ENDOFTEXT: 257}),
     r"merge 1 \(Ġt h\) makes 'Ġth', which is not in the vocabulary"),
    (dict(merges=[("Ġ", "t"), ("Ġt", "h"), ("Ġ", "t")]), r"merge 2 \(Ġ t\) makes 'Ġt', which a "
     "byte or an earlier merge already made"),
    (dict(merges=[("Ġt", "h"), ("Ġ", "t")]), r"merge 0 \(Ġt h\): 'Ġt' is neither a byte nor made"),
    (dict(merges=[("Ġ", "t"), ("Ġt", "x")]), r"merge 1 \(Ġt x\) makes 'Ġtx', which is not in"),
    (dict(merges=[("Ġ", "t")]), r"token 'Ġth' is made by no merge"),
    (dict(merges=[("Ġ", "t"), ("Ġt", "h"), ("Ġt", "hé")]), r"'hé' is not a token"),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": 258, ENDOFTEXT: 257, "xyz\u2603": 259}),
     r"token 'xyz☃' holds '☃', which is not one of the 256 byte characters"),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": 256, ENDOFTEXT: 257}), "id 256 is given to two tokens"),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": 300, ENDOFTEXT: 257}), "token 'Ġth' has id 300: ids"),
    (dict(vocab={**BASE, "Ġt": 256, "Ġth": True, ENDOFTEXT: 257}), "token 'Ġth' has id True"),
    (dict(vocab={c: i for i, c in enumerate(TABLE[1:])}),
     r"a byte-level vocabulary has 256 to"),
    (dict(vocab={**{c: i for i, c in enumerate(TABLE[1:])}, "x y": 255, "Ġt": 256, "Ġth": 257,
                 ENDOFTEXT: 258}), "byte token '!' is missing"),
    (dict(vocab=[1, 2]), "the vocabulary must be a JSON object"),
    (dict(vocab_text=b'{"a": 1, "a": 2}'), "duplicate key"),
    (dict(vocab_text=b'{"\xff": 1}'), "not UTF-8"),
    (dict(vocab_text=b'{"a": NaN}'), "not valid JSON"),
    (dict(merges_text=b"#version: 0.2\n\xc3\x28 t\n"), "not UTF-8"),
    (dict(merges_text=b"#version: 0.2\n\xc4\xa0 t\nabc\n"), r"line 3: 'abc' is not a merge"),
    (dict(merges_text=b"#version: 0.2\n\xc4\xa0  t\n"), r"line 2: .* is not a merge"),
])
def test_hostile_files_are_refused_naming_the_file(tmp_path, edit, message):
    folder = small_files(tmp_path, **edit)
    with pytest.raises(TokenizerError, match=message) as e:
        Tokenizer.from_folder(folder)
    assert folder in str(e.value)


def test_oversized_files_are_refused_by_their_size(tmp_path, monkeypatch):
    folder = small_files(tmp_path)
    monkeypatch.setattr(tk, "MAX_FILE", 1000)
    with pytest.raises(TokenizerError, match=r"vocab.json: \d[\d,]* bytes, more than the 1,000"):
        Tokenizer.from_folder(folder)
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        Tokenizer.from_folder(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["model"].update(type="WordPiece"), r'model.type must be "BPE"'),
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "normalizer must be null"),
    (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space false"),
    (lambda d: d["model"].update(ignore_merges=True), "model.ignore_merges is True"),
    (lambda d: d["model"].update(dropout=0.1), "model.dropout is 0.1"),
    (lambda d: d["added_tokens"].append({"content": "<pad>", "id": 259}), "added token"),
    (lambda d: d["model"]["merges"].append("a b c"), "is not a merge"),
])
def test_a_tokenizer_json_that_tokenizes_otherwise_is_refused(tmp_path, edit, message):
    tf = transformers()
    folder = small_files(tmp_path)
    tf.GPT2TokenizerFast.from_pretrained(folder).save_pretrained(str(tmp_path / "hf"))
    path = tmp_path / "hf" / "tokenizer.json"
    doc = json.loads(path.read_text())
    Tokenizer.from_tokenizer_json(str(path))  # as written: fine
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_tokenizer_json(str(path))


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
