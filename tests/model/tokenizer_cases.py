"""The tokenizer's hostile files, one table for both languages: each case is a folder of
tokenizer files and the one message the library refuses it with (after the folder's path).
tests/model/test_tokenizer.py opens each through Python (Tokenizer.from_folder),
tests/c_api/test_c_tokenizer.py through C (tests/c_api/open_tokenizer.c, and the fuzz target).
"""

import json
import re

from gpt2_oracle import small_files

from pytfm.tokenizer import ENDOFTEXT, bytes_to_unicode

TABLE = list(bytes_to_unicode().values())
BASE = {c: i for i, c in enumerate(TABLE)}  # the 256 byte tokens
SMALL = {**BASE, "Ġt": 256, "Ġth": 257, ENDOFTEXT: 258}  # small_files' vocabulary


def tokenizer_json(vocab=None, merges=("Ġ t", "Ġt h")):
    """small_files' vocabulary as Hugging Face's tokenizer.json of GPT-2 (as transformers
    writes it, less its post-processor), a dict."""
    vocab = SMALL if vocab is None else vocab
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab.get(ENDOFTEXT, 0), "content": ENDOFTEXT,
                          "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": True, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": list(merges)},
    }


def template(before, after, ids=None):
    """A TemplateProcessing post-processor: single = before (names), $A, after (names; None:
    no $A), its special tokens' ids from SMALL (or ids, for every name)."""
    names = [*before, *(after or [])]
    seq = [] if after is None else [{"Sequence": {"id": "A", "type_id": 0}}]
    single = [{"SpecialToken": {"id": n, "type_id": 0}} for n in before] + seq + [
        {"SpecialToken": {"id": n, "type_id": 0}} for n in (after or [])]
    return {"type": "TemplateProcessing", "single": single, "pair": single,
            "special_tokens": {n: {"id": n, "ids": ids or [SMALL.get(n, 258)], "tokens": [n]}
                               for n in names}}


def json_edit(edit):
    """A case of tokenizer.json: small_files' tokenizer.json, edited."""
    def write(folder):
        doc = tokenizer_json()
        edit(doc)
        (folder / "tokenizer.json").write_text(json.dumps(doc))
    return write


def files(**edit):
    """A case of vocab.json and merges.txt: small_files' (gpt2_oracle), edited."""
    return lambda folder: small_files(folder, **edit)


def only(*names):
    """A case of a folder holding just these files, each empty."""
    def write(folder):
        for name in names:
            (folder / name).write_bytes(b"")
    return write


V, M = "vocab.json", "merges.txt"
BOTH = "vocab.json and merges.txt"  # a message on what the two files say together
# (the files, the file named first, the message after it): what the library refuses
HOSTILE = [
    (files(vocab={**BASE, "Ġt": 256, ENDOFTEXT: 257}), BOTH,
     r"merge 1 \(Ġt h\) makes 'Ġth', which is not in the vocabulary"),
    (files(merges=[("Ġ", "t"), ("Ġt", "h"), ("Ġ", "t")]), BOTH,
     r"merge 2 \(Ġ t\) repeats merge 0"),
    (files(merges=[("Ġ", "t"), ("Ġt", "x")]), BOTH,
     r"merge 1 \(Ġt x\) makes 'Ġtx', which is not in the vocabulary"),
    (files(merges=[("Ġ", "t")]), BOTH, r"token 'Ġth' \(id 257\) is made by no merge"),
    (files(merges=[("Ġ", "t"), ("Ġt", "h"), ("Ġt", "hé")]), BOTH,
     r"merge 2 \(Ġt hé\): 'hé' is not a token of the vocabulary"),
    (files(vocab={**SMALL, "xyz\u2603": 259}), BOTH,
     r"token 'xyz☃' holds U\+2603, which is not one of the 256 byte characters"),
    (files(vocab={**BASE, "Ġt": 256, "Ġth": 256, ENDOFTEXT: 257}), BOTH,
     r"id 256 is given to two tokens"),
    (files(vocab={**SMALL, "Ġth": 300}), BOTH,
     r"token 'Ġth' has id 300: ids are the integers 0 \.\. 258"),
    (files(vocab={**SMALL, "Ġth": True}), BOTH,
     r"token 'Ġth' has id true: ids are the integers 0 \.\. 258"),
    (files(vocab={**SMALL, "Ġth": 257.0}), BOTH,
     r"token 'Ġth' has id 257\.0: ids are the integers 0 \.\. 258"),
    (files(vocab={**SMALL, "Ġth": -1}), BOTH,
     r"token 'Ġth' has id -1: ids are the integers 0 \.\. 258"),
    (files(vocab={**BASE, "Ġt": 256, "": 257, ENDOFTEXT: 258}), BOTH,
     r"a token is the empty string"),
    (files(vocab={c: i for i, c in enumerate(TABLE[1:])}), BOTH,
     r"a byte-level vocabulary has 256 to 16777216 tokens, got 255"),
    (files(vocab={**{c: i for i, c in enumerate(TABLE[1:])}, "Ġt": 255, "Ġth": 256,
                  ENDOFTEXT: 257}), BOTH,
     r"byte token '!' \(byte 0x21\) is missing: a byte-level vocabulary has all 256"),
    (files(vocab=[1, 2]), BOTH,
     r"the vocabulary must be a JSON object \{token: id\}, got a JSON array"),
    (files(vocab_text=b'{"a": 1, "a": 2}'), V, r'not valid JSON \(duplicate key "a": byte 9\)'),
    (files(vocab_text=b'{"\\u0100": 1, "\\u0100": 2}'), V,
     r'not valid JSON \(duplicate key "\\u0100": byte 14\)'),
    (files(vocab_text=b'{"\\ud800": 1}'), V,
     r'not valid JSON \(key "\\ud800" holds a lone surrogate \(not valid Unicode\): '
     r'byte 1\)'),
    (files(vocab_text=b'{"\xff": 1}'), V, r"not UTF-8 \(byte 2: invalid start byte\)"),
    (files(vocab_text=b'{"a": NaN}'), V, r"not valid JSON \(NaN is not JSON: byte 6\)"),
    (files(vocab_text=b'{"a": 1'), V,
     r"not valid JSON \(expecting ',' delimiter or '\}': byte 7\)"),
    (files(vocab_text=b"[" * 100000), V,
     r"not valid JSON \(nested more than 64 levels deep: byte 64\)"),
    (files(vocab_text=b""), V, r"not valid JSON \(expecting a value: byte 0\)"),
    (files(merges_text=b"#version: 0.2\n\xc3\x28 t\n"), M,
     r"not UTF-8 \(byte 14: invalid continuation byte\)"),
    (files(merges_text=b"#version: 0.2\n\xc4\xa0 t\nabc\n"), M,
     r"line 3: 'abc' is not a merge \('a b': two tokens and one space\)"),
    (files(merges_text=b"#version: 0.2\n\xc4\xa0  t\n"), M,
     r"line 2: 'Ġ  t' is not a merge \('a b': two tokens and one space\)"),
    (files(merges_text=b"\xc4\xa0 t\n\tx\n"), M,
     r"line 2: '\\x09x' is not a merge \('a b': two tokens and one space\)"),
    (files(merges_text=b"#version: 0.2\n\xc4\xa0 t\n\xc4\xa0t h\n" + b"a b\n" * 10), BOTH,
     r"merge 2 \(a b\) makes 'ab', which is not in the vocabulary"),
    (json_edit(lambda d: d["model"].update(type="WordPiece")), "tokenizer.json",
     r'model.type must be "BPE"'),
    (json_edit(lambda d: d.update(model=3)), "tokenizer.json", r'model.type must be "BPE"'),
    (json_edit(lambda d: d.update(normalizer={"type": "Lowercase"})), "tokenizer.json",
     r"normalizer must be null or NFC \(pytfm implements no other\)"),
    (json_edit(lambda d: d["pre_tokenizer"].update(add_prefix_space=True)), "tokenizer.json",
     r"pre_tokenizer: GPT-2's has add_prefix_space false and use_regex true"),
    (json_edit(lambda d: d["pre_tokenizer"].update(type="Whitespace")), "tokenizer.json",
     r"pre_tokenizer must be ByteLevel, or a Sequence of Split and ByteLevel"),
    (json_edit(lambda d: d.update(decoder={"type": "WordPiece"})), "tokenizer.json",
     r"decoder must be ByteLevel or null"),
    (json_edit(lambda d: d["model"].update(ignore_merges=1)), "tokenizer.json",
     r"model.ignore_merges must be true, false or absent"),
    (json_edit(lambda d: d["model"].update(dropout=0.1)), "tokenizer.json",
     r"model.dropout must be absent or null \(GPT-2's BPE has none\)"),
    (json_edit(lambda d: d["model"].update(unk_token="x")), "tokenizer.json",
     r"model.unk_token must be absent or null \(GPT-2's BPE has none\)"),
    (json_edit(lambda d: d["model"].update(continuing_subword_prefix="##")), "tokenizer.json",
     r'model.continuing_subword_prefix must be absent, null or "" '
     r"\(GPT-2's BPE has none\)"),
    (json_edit(lambda d: d["added_tokens"].append({"content": "<pad>", "id": 300})),
     "tokenizer.json", r"added_tokens\[1\]: '<pad>' has id 300, but tokenizers gives it 259 "
     r"\(the ids after the vocabulary's, in the file's order\)"),
    (json_edit(lambda d: d["added_tokens"][0].update(id=5)), "tokenizer.json",
     r"added_tokens\[0\]: '<\|endoftext\|>' has id 5, but tokenizers gives it 258 "
     r"\(the vocabulary's id\)"),
    (json_edit(lambda d: d["added_tokens"].append(dict(d["added_tokens"][0]))), "tokenizer.json",
     r"added_tokens\[1\]: '<\|endoftext\|>' appears twice"),
    (json_edit(lambda d: d["added_tokens"].append({"content": "Ġt", "id": 256})),
     "tokenizer.json", r"added_tokens\[1\]: 'Ġt' is a token of the vocabulary by its "
     r"byte-level name, standing for other bytes \(pytfm does not implement that\)"),
    (json_edit(lambda d: d["added_tokens"].append({"content": "", "id": 259})),
     "tokenizer.json", r"added_tokens\[1\] must be an object whose content is a non-empty "
     r"string of Unicode"),
    (json_edit(lambda d: d["added_tokens"][0].update(lstrip=1)), "tokenizer.json",
     r"added_tokens\[0\].lstrip must be true or false"),
    (json_edit(lambda d: d["added_tokens"][0].pop("id")), "tokenizer.json",
     r"added_tokens\[0\] must have an id, an integer >= 0"),
    (json_edit(lambda d: d.pop("added_tokens")), "tokenizer.json",
     r"token '<\|endoftext\|>' \(id 258\) is made by no merge"),
    (json_edit(lambda d: d.update(truncation={"max_length": 512, "strategy": "LongestFirst",
                                              "stride": 0, "direction": "Right"})),
     "tokenizer.json", r"truncation must be null \(pytfm encodes whole texts\)"),
    (json_edit(lambda d: d.update(padding={"strategy": "BatchLongest", "pad_id": 0})),
     "tokenizer.json", r"padding must be null \(pytfm encodes whole texts\)"),
    (json_edit(lambda d: d.update(post_processor={"type": "RobertaProcessing"})),
     "tokenizer.json", r"post_processor must be null, ByteLevel, TemplateProcessing or a "
     r"Sequence of them \(pytfm implements no other\)"),
    (json_edit(lambda d: d.update(post_processor=template([ENDOFTEXT], [], [9999]))),
     "tokenizer.json", r"post_processor: TemplateProcessing's special token of single\[0\] "
     r"has an id outside the vocabulary \[0, 259\)"),
    (json_edit(lambda d: d.update(post_processor=template([ENDOFTEXT], None))),
     "tokenizer.json", r"post_processor: TemplateProcessing's single must hold \$A once"),
    (json_edit(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?<=x)y"}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]})),
     "tokenizer.json", r"pre_tokenizer: Split.pattern Regex: at byte 1: lookbehind \(\?<="),
    (json_edit(lambda d: d["model"]["merges"].append("a b c")), "tokenizer.json",
     r"model.merges\[2\]: \"a b c\" is not a merge \('a b' or \[a, b\]\)"),
    (json_edit(lambda d: d["model"]["merges"].append(["a", 3])), "tokenizer.json",
     r"model.merges\[2\]: \[\"a\", 3\] is not a merge \('a b' or \[a, b\]\)"),
    (json_edit(lambda d: d["model"]["merges"].append(["Ġth", "e"])), "tokenizer.json",
     r"merge 2 \(Ġth e\) makes 'Ġthe', which is not in the vocabulary"),
    (json_edit(lambda d: d["model"]["merges"].insert(0, "Ġ e")), "tokenizer.json",
     r"merge 0 \(Ġ e\) makes 'Ġe', which is not in the vocabulary"),
    (json_edit(lambda d: d["model"].update(merges={})), "tokenizer.json",
     r"model.merges must be a list"),
    (json_edit(lambda d: d["model"].pop("vocab")), "tokenizer.json", r"model.vocab is missing"),
    (only(), "", r"the folder .* has no tokenizer \(vocab.json and merges.txt, or "
     r"tokenizer.json\)"),
    (only(V), "", r"the folder .* has vocab.json but no merges.txt \(and no tokenizer.json\)"),
    (only(M), "", r"the folder .* has merges.txt but no vocab.json \(and no tokenizer.json\)"),
]


def hostile_folder(tmp_path, n):
    """Case n of HOSTILE written to a folder in tmp_path -> (the folder, the message's regex):
    the message names the file it is about first (both files: "F/vocab.json and
    F/merges.txt"; the folder rule: the folder)."""
    write, first, message = HOSTILE[n]
    folder = tmp_path / f"case{n}"
    folder.mkdir()
    write(folder)
    where = str(folder / "tok" if (folder / "tok").is_dir() else folder)
    names = [f"{where}/{name}" for name in first.split(" and ")] if first else []
    return where, (" and ".join(map(re.escape, names)) + ": " if names else "") + message
