"""tokenizer.json's features against Hugging Face tokenizers and transformers, on GPT-2's real
vocabulary: each variant of the file (added tokens and their flags, post-processors, the
settings that change ids) gives tokenizers' ids on a mixed text, or a TokenizerError naming
the field pytfm does not implement. Then GPT-2 folders transformers reads its own way, inputs
of a mebibyte in one word, files that are not files, and bytes-like texts for training.
The oracles are optional (gpt2_oracle.py: a skip without them, a failure under CI)."""

import array
import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from gpt2_oracle import PROSE, small_files, tokenizers, transformers

from pytfm import tokenizer as tk
from pytfm.tokenizer import ENDOFTEXT, Tokenizer, TokenizerError

# special tokens with spaces around them, next to letters, halves of them, overlaps
MIXED = ("Hello <|endoftext|>  world<|endoftext|>\n<mask> x  <mask>y <mask>\t\n"
         "hello world hello worldly cat cats concat (cat) cat_ 2cat cat, <|end of text "
         "<|begin_of_text|>abcdef bcde <|reserved_special_token_7|><|reserved_special_token_"
         "77|> done <|endoftext|>") + PROSE


@pytest.fixture(scope="module")
def gpt2_json(gpt2_vocab_folder, tmp_path_factory):
    """tokenizer.json of GPT-2 as transformers' GPT2TokenizerFast writes it, a dict."""
    folder = tmp_path_factory.mktemp("gpt2-json")
    transformers().GPT2TokenizerFast.from_pretrained(str(gpt2_vocab_folder)).save_pretrained(
        str(folder))
    with open(folder / "tokenizer.json", encoding="utf-8") as f:
        return json.load(f)


def added(content, id, special=True, **flags):
    return {"id": id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": special, **flags}


def template(before, after, ids):
    """TemplateProcessing: single = before, $A, after (special tokens' names); ids: name ->
    its id."""
    items = [{"SpecialToken": {"id": n, "type_id": 0}} for n in before] + [
        {"Sequence": {"id": "A", "type_id": 0}}] + [
        {"SpecialToken": {"id": n, "type_id": 0}} for n in after]
    return {"type": "TemplateProcessing", "single": items, "pair": items,
            "special_tokens": {n: {"id": n, "ids": [ids[n]], "tokens": [n]}
                               for n in {*before, *after}}}


def eot_flags(**flags):
    return lambda d: d["added_tokens"][0].update(flags)


def more(*tokens):
    """Added tokens; an id of None is the one tokenizers gives (the vocabulary's, else the
    next)."""
    def edit(d):
        for t in tokens:
            ids = [a["id"] for a in d["added_tokens"]] + [len(d["model"]["vocab"]) - 1]
            t = {**t, "id": d["model"]["vocab"].get(t["content"], max(ids) + 1)
                 if t["id"] is None else t["id"]}
            d["added_tokens"].append(t)
    return edit


def set_(key, value):
    return lambda d: d.update({key: value})


def llama_like(d):
    """A Llama 3-like head: <|begin_of_text|> and reserved special tokens after the vocabulary,
    a Sequence post-processor of ByteLevel and a template adding <|begin_of_text|>."""
    d["added_tokens"] += [added("<|begin_of_text|>", 50257)] + [
        added(f"<|reserved_special_token_{i}|>", 50258 + i) for i in range(100)]
    d["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
         "use_regex": True}, template(["<|begin_of_text|>"], [], {"<|begin_of_text|>": 50257})]}


# (name, edit of GPT-2's tokenizer.json): tokenizers' ids expected
SAME = [
    ("as transformers writes it", lambda d: None),
    ("eot lstrip", eot_flags(lstrip=True)),
    ("eot rstrip", eot_flags(rstrip=True)),
    ("eot lstrip and rstrip", eot_flags(lstrip=True, rstrip=True)),
    ("eot normalized", eot_flags(normalized=True)),
    ("eot not special", eot_flags(special=False)),
    ("eot single_word", eot_flags(single_word=True)),
    ("<mask> lstrip, a new id", more(added("<mask>", 50257, lstrip=True))),
    ("<mask> rstrip and single_word", more(added("<mask>", 50257, rstrip=True,
                                                 single_word=True))),
    ("a non-special token with a space", more(added("hello world", None, special=False))),
    ("single_word cat", more(added("cat", None, special=False, single_word=True))),
    ("overlapping: <|end non-special inside the special eot",
     more(added("<|end", None, special=False))),
    ("two passes: normalized bcde after non-normalized cd",
     more(added("bcde", None, special=False, normalized=True),
          added("cd", None, special=False))),
    ("template: eot around the text", set_("post_processor", template(
        [ENDOFTEXT], [ENDOFTEXT], {ENDOFTEXT: 50256}))),
    ("post_processor ByteLevel", set_("post_processor", {
        "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
        "use_regex": True})),
    ("post_processor null", set_("post_processor", None)),
    ("decoder null", set_("decoder", None)),
    ("Llama 3-like special tokens and template", llama_like),
]

# (name, edit, the field the error names): refused
REFUSED = [
    ("truncation", set_("truncation", {"direction": "Right", "max_length": 8,
                                       "strategy": "LongestFirst", "stride": 0}),
     "truncation must be null"),
    ("padding", set_("padding", {"strategy": "BatchLongest", "direction": "Right",
                                 "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
                                 "pad_token": ENDOFTEXT}), "padding must be null"),
    ("a normalizer", set_("normalizer", {"type": "NFKC"}), "normalizer must be null or NFC"),
    ("eot's id not the vocabulary's", eot_flags(id=5), r"added_tokens\[0\]"),
    ("a new token's id not the next", more(added("<mask>", 60000)), r"added_tokens\[1\]"),
    ("Split pre-tokenizer", set_("pre_tokenizer", {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": " ?\\p{Han}+"}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}), r"Split.pattern Regex: at byte \d+: \\p\{Han\}"),
    ("RobertaProcessing", set_("post_processor", {
        "type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
        "trim_offsets": True, "add_prefix_space": False}), "post_processor must be"),
    ("byte_fallback", lambda d: d["model"].update(byte_fallback=True), "model.byte_fallback"),
    ("a WordPiece decoder", set_("decoder", {"type": "WordPiece", "prefix": "##",
                                            "cleanup": True}), "decoder must be"),
]


def write(doc, edit, path):
    doc = copy.deepcopy(doc)
    edit(doc)
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("name, edit", SAME, ids=[n for n, _ in SAME])
def test_a_tokenizer_json_feature_gives_tokenizers_ids(gpt2_json, tmp_path, name, edit):
    """pytfm's encode (special, template) is tokenizers' encode (encode_special_tokens = not
    special, add_special_tokens = template), and transformers' encode is the default."""
    path = write(gpt2_json, edit, tmp_path / "tokenizer.json")
    tok = Tokenizer.from_tokenizer_json(path)
    hf = tokenizers().Tokenizer.from_file(path)
    assert len(tok) == hf.get_vocab_size(with_added_tokens=True)
    for special in (True, False):
        hf.encode_special_tokens = not special
        for tmpl in (True, False):
            want = hf.encode(MIXED, add_special_tokens=tmpl).ids
            assert tok.encode(MIXED, special=special, template=tmpl) == want, (special, tmpl)
    fast = transformers().PreTrainedTokenizerFast(tokenizer_file=path)
    assert tok.encode(MIXED) == fast.encode(MIXED)
    assert tok.encode("") == fast.encode("")


@pytest.mark.parametrize("name, edit, field", REFUSED, ids=[n for n, _, _ in REFUSED])
def test_a_tokenizer_json_feature_not_implemented_is_refused_by_name(gpt2_json, tmp_path,
                                                                     name, edit, field):
    path = write(gpt2_json, edit, tmp_path / "tokenizer.json")
    with pytest.raises(TokenizerError, match=field):
        Tokenizer.from_tokenizer_json(path)


def test_single_word_next_to_a_character_of_unknown_class_is_an_error(gpt2_json, tmp_path):
    """Rust's \\w, which single_word reads, is known here for ASCII, letters and white space:
    next to another character encode fails rather than guess (tokenizers' ids otherwise)."""
    path = write(gpt2_json, more(added("cat", None, special=False, single_word=True)),
                 tmp_path / "tokenizer.json")
    tok = Tokenizer.from_tokenizer_json(path)
    hf = tokenizers().Tokenizer.from_file(path)
    for text in ("écat cat日本 cat", "a cat\u00a0b"):
        assert tok.encode(text) == hf.encode(text).ids
    with pytest.raises(ValueError, match=r"single_word, and whether U\+00BD next to it"):
        tok.encode("cat½")


# ---- GPT-2 folders -----------------------------------------------------------------------------


def test_a_gpt2_folder_without_endoftext_gets_it_as_gpt2tokenizerfast_does(gpt2_vocab_folder,
                                                                           tmp_path):
    """transformers adds <|endoftext|> (GPT-2's bos, eos and unk) as the next id when the
    vocabulary lacks it; an empty merges file is read as no merges."""
    with open(gpt2_vocab_folder / "vocab.json", encoding="utf-8") as f:
        vocab = json.load(f)
    del vocab[ENDOFTEXT]
    folder = tmp_path / "noeot"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_bytes((gpt2_vocab_folder / "merges.txt").read_bytes())
    tok = Tokenizer.from_folder(str(folder))
    fast = transformers().GPT2TokenizerFast.from_pretrained(str(folder))
    assert tok.encode(MIXED) == fast.encode(MIXED) and len(tok) == len(fast) == 50257
    assert tok.eot == 50256
    for eot in (False, True):  # the bytes alone, with no merges: merges.txt empty
        (tmp_path / f"bare{eot}").mkdir()
        bare = small_files(tmp_path / f"bare{eot}", vocab={
            c: i for i, c in enumerate([*tk.bytes_to_unicode().values()] + [ENDOFTEXT] * eot)},
            merges_text=b"")
        fast = transformers().GPT2TokenizerFast.from_pretrained(bare)
        assert Tokenizer.from_folder(bare).encode(MIXED) == fast.encode(MIXED)


def test_an_empty_merges_file_for_a_vocabulary_of_merged_tokens_is_refused(gpt2_vocab_folder,
                                                                           tmp_path):
    (tmp_path / "vocab.json").write_bytes((gpt2_vocab_folder / "vocab.json").read_bytes())
    (tmp_path / "merges.txt").write_bytes(b"")
    with pytest.raises(TokenizerError, match=r"merges.txt: token 'Ġt' \(id 256\) is made by "
                       "no merge"):
        Tokenizer.from_folder(str(tmp_path))


# ---- long words ---------------------------------------------------------------------------------


def test_a_mebibyte_in_one_word_gives_tokenizers_ids(gpt2_tokenizer, gpt2_json, tmp_path):
    """Words and runs of 1 MiB (random letters, digits, spaces, one letter): tokenizers' ids
    (the merge is a heap, the runs scanned once: bench/tokenizer_long.py times them)."""
    path = write(gpt2_json, lambda d: None, tmp_path / "tokenizer.json")
    hf = tokenizers().Tokenizer.from_file(path)
    rng = np.random.default_rng(3)
    n = 1 << 20
    texts = {"letters": bytes(rng.integers(97, 123, n, dtype=np.uint8)).decode(),
             "digits": bytes(rng.integers(48, 58, n, dtype=np.uint8)).decode(),
             "spaces": " " * n, "one letter": "a" * n}
    for name, text in texts.items():
        assert gpt2_tokenizer.encode(text) == hf.encode(text).ids, name


# ---- files that are not files --------------------------------------------------------------


def test_a_fifo_for_any_tokenizer_file_is_refused_without_blocking(tmp_path):
    """A FIFO no writer opens, as vocab.json, merges.txt or tokenizer.json, through every
    reader: refused as not a regular file. In a child process with a timeout, so that a read
    that blocks fails the test instead of hanging it."""
    folder = small_files(tmp_path)
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    v, m = os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")
    calls = [f"Tokenizer.from_files({fifo!r}, {m!r})", f"Tokenizer.from_files({v!r}, {fifo!r})",
             f"Tokenizer.from_tokenizer_json({fifo!r})"]
    for name in ("vocab.json", "merges.txt", "tokenizer.json"):
        sub = tmp_path / name.replace(".", "_")
        sub.mkdir()
        small_files(sub)
        target = sub / "tok"
        if name == "tokenizer.json":
            for other in ("vocab.json", "merges.txt"):
                os.unlink(target / other)
        else:
            os.unlink(target / name)
        os.mkfifo(target / name)
        calls.append(f"Tokenizer.from_folder({str(target)!r})")
    for call in calls:
        code = ("from pytfm.tokenizer import Tokenizer, TokenizerError\n"
                f"try:\n    {call}\nexcept TokenizerError as e:\n    print(e)\n")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0 and "not a regular file" in run.stdout, (call, run)


# ---- training on bytes-like texts -------------------------------------------------------------


def test_train_and_encode_take_any_bytes_like_text():
    text = (PROSE * 2).encode()
    want = tk.train(text, 300)
    for like in (bytearray(text), memoryview(text), array.array("B", text),
                 np.frombuffer(text, np.uint8)):
        tok = tk.train(like, 300)
        assert tok.merges == want.merges, type(like)
        assert tok.encode(like) == want.encode(text), type(like)
    with pytest.raises(TypeError, match="text must be a str or bytes-like, got int"):
        tk.train(3, 300)
