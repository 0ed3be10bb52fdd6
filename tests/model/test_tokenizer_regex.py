"""tokenizer.json's Split pre-tokenizer with any regex (csrc/model/regex.c): its pieces are
tokenizers' (Oniguruma's) for the constructs regex.c implements, a construct it does not
implement is refused by name, and no pattern hangs or overflows the stack.

Pieces are seen through the ids of a byte-level BPE whose merges join every pair of bytes:
a piece boundary moved by a byte changes which bytes pair up, so different pieces give
different ids."""

import json
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytfm.tokenizer import Tokenizer, TokenizerError, bytes_to_unicode

tokenizers = pytest.importorskip("tokenizers")

TABLE = list(bytes_to_unicode().values())
VOCAB = {c: i for i, c in enumerate(TABLE)}
VOCAB.update({a + b: 256 + 256 * i + j for i, a in enumerate(TABLE) for j, b in enumerate(TABLE)})
MERGES = [f"{a} {b}" for a in TABLE for b in TABLE]

# The hand-scanned patterns (bpe.c's split_regex), as tokenizer.json holds them
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

# Patterns of other tokenizer.json files, and the engine's constructs one by one
PATTERNS = [
    # GPT-4's cl100k_base as tiktoken writes it (possessive, a class in (?i:))
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"
    r"|\s*[\r\n]|\s+(?!\S)|\s+",
    # GPT-4o's o200k_base
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    # DeepSeek's three Splits, each alone
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    # StarCoder-like digits, and more
    r"\p{N}",
    r"(?i)[a-z]+|\d+|[^\w\s]",
    r"(?i:k|s)+|\P{L}",
    r"\p{L}+?\p{Ll}|\p{Lu}",
    r"\p{L}*+x|\p{Nd}++",
    r"(?=\p{Lu})\p{L}+|(?!\p{L})\S",
    r"^\s+|\s+$|\p{Z}",
    r"\b\w+\b|\W",
    r"(?>ab|a)c|(?:ab){2,3}|(?:a|b)*?c",
    r"(?:(?:a|b)*c)+|.{1,4}",
    r"\x{41}\u0042|[\x41-\x{5A}\t\n]+|[^\p{L}\p{N}\p{P}\s]+",
    r"\p{Letter}\p{Mark}*|\p{Decimal_Number}+|\p{Other_Punctuation}|\p{So}\p{Sk}?",
    r"[\p{Ps}\p{Pe}\p{Pi}\p{Pf}]|\p{Pd}+|\p{Sc}\p{Nd}*|\p{Cc}|\p{Cf}|\p{Co}|\p{Mc}|\p{Me}",
    r"a*|b",
    r"x?",
    r"\A\p{L}|\p{L}\z|\Z|\h+|\B.",
    r"\p{Nl}|\p{No}+|\p{Lt}|\p{Zs}\p{Zl}?\p{Zp}?|\p{Sm}{2,}",
]

FIXED = [
    "", "Hello world", "  Hello   world  ", "I'm here, you're there. They'LL go; it'S ok",
    "'ſ 'K 'Ks", "12345 1,234.56 ٣٤٥ ²³", "a\nb\r\nc\n\n  \n\t",
    "中文字符 ひらがな カタカナ 한국어", "e\u0301 n\u0303o\u0308",
    "ab aab abab ababab abc cba", "ABC Abc aBC ǅa", "x  y\u00a0z\u2028w",
    "emoji 😀👍🏽 !!! ??? ...", "$100 €5 ¥", "Ⅳ ⅻ ① ½", "(a) [b] {c} «d» “e”", "\x00\x1f\x7f",
]

ALPHABET = list("abcksABCKSxyz0189 \n\r\t'.,!?-_()[]{}$€") + [
    "ſ", "\u212a", "ß", "é", "e\u0301", "中", "ひ", "カ", "한", "٣", "²", "Ⅳ", "①", "😀", "\u00a0",
    "\u2028", "\u3000", "ǅ", "Ⓐ", "_", "\u200d", "\ue000", "\x85"]


def assigned(c):
    """a character this Unicode (the tables') assigns; tokenizers' may class newer ones
    otherwise"""
    return unicodedata.category(c) not in ("Cn", "Cs")


TEXT = st.lists(st.one_of(st.sampled_from(ALPHABET),
                          st.characters(blacklist_categories=("Cs", "Cn"))), max_size=40).map(
    "".join).filter(lambda s: all(assigned(c) for c in s))


def doc(pattern, kind="Regex"):
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {kind: pattern}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": VOCAB, "merges": MERGES},
    }


def pair(tmp_path, pattern, kind="Regex"):
    """(pytfm's tokenizer, tokenizers') of the pair-merging BPE behind a Split of pattern"""
    text = json.dumps(doc(pattern, kind))
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    return Tokenizer.from_tokenizer_json(path), tokenizers.Tokenizer.from_str(text)


@pytest.fixture(scope="module", params=range(len(PATTERNS)), ids=lambda i: f"pattern{i}")
def both(request, tmp_path_factory):
    return pair(tmp_path_factory.mktemp("re"), PATTERNS[request.param])


def test_a_split_regex_gives_tokenizers_ids_on_fixed_texts(both):
    ours, theirs = both
    for text in FIXED:
        assert ours.encode(text) == theirs.encode(text).ids, text


@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_a_split_regex_gives_tokenizers_ids_on_unicode_text(both, text):
    ours, theirs = both
    assert ours.encode(text) == theirs.encode(text).ids


@pytest.mark.parametrize("pattern", ["ab", ".", "'s", "中文", "(?i)"])
def test_a_split_string_pattern_gives_tokenizers_ids(tmp_path, pattern):
    ours, theirs = pair(tmp_path, pattern, "String")
    for text in [*FIXED, "ab.ab..'s(?i)中文中", "abab (?i) ...."]:
        assert ours.encode(text) == theirs.encode(text).ids, text


@pytest.fixture(scope="module", params=[GPT2, LLAMA3, QWEN2], ids=["gpt2", "llama3", "qwen2"])
def fast_and_plain(request, tmp_path_factory):
    """pytfm with the hand-written scanner of a pattern, pytfm with regex.c running the same
    pattern (in a group, so that its text is not recognised), and tokenizers"""
    folder = tmp_path_factory.mktemp("fast")
    fast, theirs = pair(folder, request.param)
    plain, _ = pair(folder, f"(?:{request.param})")
    return fast, plain, theirs


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_the_fast_scanners_give_the_plain_engines_pieces(fast_and_plain, text):
    fast, plain, theirs = fast_and_plain
    assert fast.encode(text) == plain.encode(text) == theirs.encode(text).ids


def test_the_fast_scanners_give_the_plain_engines_pieces_on_fixed_texts(fast_and_plain):
    fast, plain, theirs = fast_and_plain
    for text in FIXED:
        assert fast.encode(text) == plain.encode(text) == theirs.encode(text).ids, text


REFUSED = [
    (r"(?<=a)b", r"lookbehind \(\?<="),
    (r"(a)\1", r"backreference \\1"),
    (r"\p{Han}+", r"\\p\{Han\} \(pytfm implements the general categories only\)"),
    (r"(?m)a.", r"the option \(\?m\)"),
    (r"(?x)a b", r"the option \(\?x\)"),
    (r"[[:alpha:]]", r"POSIX bracket \[:"),
    (r"[a-z&&[^aeiou]]", r"class intersection &&"),
    (r"(?i)é", r"case-insensitive U\+00E9"),
    (r"(?i:\p{L}+)", r"case-insensitive \\p\{L\}"),
    (r"(?i:class)", r"case-insensitive \"ss\""),
    (r"a{2}?", r"\{n\}\?"),
    (r"a{1,2}+", r"\{n,m\}\+"),
    (r"a**", r"a quantifier of a quantifier"),
    (r"\Ka", r"\\K \(pytfm does not implement it\)"),
    (r"\G\w", r"\\G \(pytfm does not implement it\)"),
    (r"(?#note)a", r"a comment group"),
    ("(", r"a \( without its \)"),
    ("a)", r"a \) without its \("),
    ("[a", r"a \[ without its \]"),
    ("*a", r"\* repeats nothing"),
    (r"\p{L", r"\\p\{ without its \}"),
    ("a{3,2}", r"\{3,2\} counts down"),
    ("[z-a]", r"the range U\+007A-U\+0061 is empty"),
    (r"\u12", r"\\u needs 4 hex digits"),
    (r"\xFF", r"\\x: U\+00FF is no character"),
    ("^*", "a quantifier on an anchor"),
]


@pytest.mark.parametrize("pattern, message", REFUSED, ids=[p for p, _ in REFUSED])
def test_a_split_regex_construct_not_implemented_is_refused_by_name(tmp_path, pattern,
                                                                    message):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc(pattern)))
    with pytest.raises(TokenizerError, match=r"pre_tokenizer: Split.pattern Regex: at byte "
                                             r"\d+: " + message):
        Tokenizer.from_tokenizer_json(path)


def test_a_split_pattern_neither_regex_nor_string_is_refused(tmp_path):
    d = doc("x")
    d["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Glob": "x"}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(d))
    with pytest.raises(TokenizerError, match=r'Split.pattern must be \{"Regex": pattern\}'):
        Tokenizer.from_tokenizer_json(path)


def test_a_word_of_a_million_letters_needs_no_stack_per_letter(tmp_path):
    """quantifiers of one character count in a loop: greedy, lazy, possessive, and a class
    behind a lookahead"""
    ours, theirs = pair(tmp_path, r"\p{L}+|\p{L}+?x|[a-z]*+\d|\s+(?!\S)|\s+")
    text = "ab" * 500_000 + " " * 300_000 + "z"
    assert ours.encode(text) == theirs.encode(text).ids


@pytest.mark.parametrize("pattern", [r"(a*)*b", r"(?:a|a)*b", r"(a|aa)+$"])
def test_a_pattern_that_backtracks_exponentially_is_an_error_not_a_hang(tmp_path, pattern):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc(pattern)))
    tok = Tokenizer.from_tokenizer_json(path)
    assert len(tok.encode("aaab")) == 2  # it works where it does not explode
    with pytest.raises(ValueError, match="the Split regex backtracks too much on this text"):
        tok.encode("a" * 5000 + "c")


# ---- a Sequence of pre-tokenizers: Splits of any behavior, Digits, Punctuation, ByteLevel ----

# DeepSeek V3's tokenizer.json: three Splits (each Isolated), then a ByteLevel without regex
DEEPSEEK = PATTERNS[2:5]
BEHAVIORS = ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]
STEP_PATTERNS = [r"\s+", r"\p{N}", r"x?|a", r"\p{N}{1,3}"]
STEP_TEXTS = [*FIXED, "12 345 6789 x1x22 abxab", "  xx  x ab a b", "a1b22c333d4444 "]


def split_item(pattern, behavior="Isolated", invert=False, kind="Regex"):
    return {"type": "Split", "pattern": {kind: pattern}, "behavior": behavior,
            "invert": invert}


def byte_level(use_regex):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": use_regex}


def sequence_pair(tmp_path, items):
    """(pytfm's tokenizer, tokenizers') of the pair-merging BPE behind a Sequence of items"""
    d = doc("x")
    d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": items}
    text = json.dumps(d)
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    return Tokenizer.from_tokenizer_json(path), tokenizers.Tokenizer.from_str(text)


SEQUENCES = {
    "deepseek": [*(split_item(p) for p in DEEPSEEK), byte_level(False)],
    "digits_each": [{"type": "Digits", "individual_digits": True}, byte_level(True)],
    "digits_runs": [{"type": "Digits", "individual_digits": False}, byte_level(True)],
    "split_then_gpt2": [split_item(r"\p{N}{1,3}"), byte_level(True)],
    "punctuation": [{"type": "Punctuation", "behavior": "Contiguous"},
                    split_item(r"\s+", "MergedWithNext"), byte_level(False)],
    "string_removed_inverted": [split_item("ab", "Removed", True, "String"),
                                split_item(LLAMA3), byte_level(False)],
    "llama3_then_digits": [split_item(LLAMA3), split_item(r"\p{N}", "Isolated"),
                           split_item(r"[aeiou]", "MergedWithPrevious", True),
                           byte_level(False)],
    **{f"{b}_{'inverted' if inv else 'plain'}_{i}": [split_item(p, b, inv), byte_level(False)]
       for b in BEHAVIORS for inv in (False, True) for i, p in enumerate(STEP_PATTERNS)
       if (b, inv) != ("Isolated", False)},
}


@pytest.fixture(scope="module")
def sequences(tmp_path_factory):
    return {name: sequence_pair(tmp_path_factory.mktemp("seq"), items)
            for name, items in SEQUENCES.items()}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_a_sequence_of_pre_tokenizers_gives_tokenizers_ids_on_fixed_texts(sequences, name):
    ours, theirs = sequences[name]
    for text in STEP_TEXTS:
        assert ours.encode(text) == theirs.encode(text).ids, text


@settings(max_examples=250, deadline=None)
@given(text=TEXT, name=st.sampled_from(sorted(SEQUENCES)))
def test_a_sequence_of_pre_tokenizers_gives_tokenizers_ids_on_unicode_text(sequences, text,
                                                                            name):
    ours, theirs = sequences[name]
    assert ours.encode(text) == theirs.encode(text).ids


@settings(max_examples=200, deadline=None)
@given(text=TEXT)
def test_deepseeks_three_splits_give_tokenizers_ids(sequences, text):
    ours, theirs = sequences["deepseek"]
    assert ours.encode(text) == theirs.encode(text).ids


def test_a_long_text_through_three_splits(sequences):
    """pieces of pieces are kept in lists: a long text is no deep recursion"""
    ours, theirs = sequences["deepseek"]
    text = ("中文12345 hello, world!\n\n" * 20_000) + "ab" * 100_000
    assert ours.encode(text) == theirs.encode(text).ids


SEQUENCE_REFUSED = [
    ([{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
      byte_level(False)], r"pre_tokenizer.pretokenizers\[0\]: pytfm implements Split, Digits"),
    ([byte_level(False), split_item("a"), byte_level(False)],
     r"pre_tokenizer.pretokenizers\[0\]: pytfm implements Split"),
    ([split_item("a"), {"type": "Sequence", "pretokenizers": []}, byte_level(False)],
     r"pre_tokenizer.pretokenizers\[1\]: pytfm implements Split"),
    ([split_item("a", "Merged"), byte_level(False)],
     r"pre_tokenizer.pretokenizers\[0\]: Split.behavior must be Removed, Isolated"),
    ([split_item("a", "Isolated", "yes"), byte_level(False)],
     r"pre_tokenizer.pretokenizers\[0\]: Split.invert must be true or false"),
    ([split_item("a"), split_item(r"(?<=a)b"), byte_level(False)],
     r"pre_tokenizer.pretokenizers\[1\]: Split.pattern Regex: at byte \d+: lookbehind"),
    ([split_item("a"), {"type": "Digits", "individual_digits": 1}, byte_level(False)],
     r"pre_tokenizer.pretokenizers\[1\]: Digits.individual_digits must be true or false"),
    ([split_item("a", "Contiguous")], r"pre_tokenizer.pretokenizers must end with ByteLevel"),
    ([split_item("a", "Contiguous"), {**byte_level(False), "add_prefix_space": True}],
     r"the ByteLevel ending a Sequence must have add_prefix_space false"),
]


@pytest.mark.parametrize("items, message", SEQUENCE_REFUSED,
                         ids=[str(i) for i in range(len(SEQUENCE_REFUSED))])
def test_a_sequence_pytfm_cannot_run_is_refused_by_name(tmp_path, items, message):
    d = doc("x")
    d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": items}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(d))
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_tokenizer_json(path)


def test_a_step_that_backtracks_exponentially_is_an_error_not_a_hang(tmp_path):
    ours, theirs = sequence_pair(tmp_path, [split_item(r"\s+", "Contiguous"),
                                            split_item(r"(a*)*b", "Removed"), byte_level(True)])
    for text in ["x aaab", "x aaabaacaab b"]:  # it works where it does not explode
        assert ours.encode(text) == theirs.encode(text).ids
    with pytest.raises(ValueError, match="a Split regex backtracks too much on this text"):
        ours.encode("x " + "a" * 5000 + "c")
