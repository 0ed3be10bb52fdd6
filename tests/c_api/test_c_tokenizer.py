"""The C tokenizer (pytfm_tokenizer.h, csrc/model/bpe.c) from C's side: the hostile files of
tests/model/tokenizer_cases.py refused by a C program with the message Python gives; the size
contract of encode and decode; threads; its Unicode table as the generator writes it; and a
bounded libFuzzer run. What it encodes is tested through pytfm.tokenizer, which is it, against
Hugging Face tokenizers (tests/model/test_tokenizer.py). GPT-2's vocabulary is optional here
(tests/model/gpt2_oracle.py: a skip without it, a failure under CI)."""

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata

import pytest

from helpers import CSRC, ROOT, TESTS
from pytfm._core import ffi, lib
from pytfm.tokenizer import Tokenizer, TokenizerError

sys.path.insert(0, os.path.join(TESTS, "model"))
import gpt2_oracle  # noqa: E402  (tests/model's oracles: a skip without them, a failure in CI)
import tokenizer_cases  # noqa: E402
from gpt2_oracle import PROSE  # noqa: E402

vocab_files = gpt2_oracle.vocab_files
# its fixtures: GPT-2's vocabulary folder and pytfm.tokenizer on it
gpt2_vocab_folder = gpt2_oracle.gpt2_vocab_folder
gpt2_tokenizer = gpt2_oracle.gpt2_tokenizer

FUZZ = os.path.join(TESTS, "c_api", "fuzz")
needs_csrc = pytest.mark.skipif(not os.path.isdir(CSRC), reason="needs the source checkout")


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
    assert ffi.string(lib.pytfm_tokenizer_unicode_version()).decode() == version
    if unicodedata.unidata_version != version:
        pytest.skip(f"the table is of Unicode {version}, this Python's unicodedata of "
                    f"{unicodedata.unidata_version}")
    gen = load_generator()
    assert gen.header() == table
    ranges = gen.ranges()
    assert len(ranges) > 500 and ranges[0] == (0x9, 0xD, "W")


# ---- hostile files: the table Python is held to, through C ---------------------------------


def test_hostile_files_are_refused_by_c_with_pythons_message(tmp_path):
    """tests/c_api/open_tokenizer.c, built against the installed library, opens every folder
    of tokenizer_cases.HOSTILE (pytfm_tokenizer_open_folder): each refused with the table's
    message, which is Python's str of the exception, errno as Python's OSError has it."""
    from test_generate_gpt2 import flags

    exe = str(tmp_path / "open_tokenizer")
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Wextra", "-Werror",
                    os.path.join(TESTS, "c_api", "open_tokenizer.c"), *flags(), "-o", exe],
                   check=True)
    cases = [tokenizer_cases.hostile_folder(tmp_path, n)
             for n in range(len(tokenizer_cases.HOSTILE))]
    run = subprocess.run([exe, *(folder for folder, _ in cases)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(cases)
    for (folder, message), line in zip(cases, lines):
        with pytest.raises((TokenizerError, OSError)) as e:
            Tokenizer.from_folder(folder)
        errno = e.value.errno if isinstance(e.value, OSError) else 0
        text = e.value.strerror if isinstance(e.value, OSError) else str(e.value)
        assert line == f"rejected {errno}: {text}"
        assert re.fullmatch(message, text), text
    good = subprocess.run([exe, tokenizer_cases.small_files(tmp_path)], capture_output=True,
                          text=True, check=True).stdout
    assert good == f"ok 259 2 257 {tokenizer_cases.BASE['e']}\n"


# ---- the size contract ------------------------------------------------------------------------


def test_encode_and_decode_say_the_size_and_refuse_a_short_buffer(gpt2_tokenizer):
    text = b"Hello world, it's me."
    count = ffi.new("int64_t *")
    handle = gpt2_tokenizer._tok
    assert lib.pytfm_tokenizer_encode(handle, text, len(text), 1, ffi.NULL, 0, count) == 0
    want = gpt2_tokenizer.encode_array(text)
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
    assert lib.pytfm_tokenizer_vocab_size(ffi.NULL) == 0 and lib.pytfm_tokenizer_eot(ffi.NULL) == -1
    words = ffi.new("int64_t[]", 8)
    assert lib.pytfm_tokenizer_split(text, len(text), words, 8, count) == 0
    assert count[0] == 7 and list(words[0:7]) == [5, 11, 12, 15, 17, 20, 21]
    assert lib.pytfm_tokenizer_split(text, len(text), words, 2, count) == \
        lib.PYTFM_STATUS_INVALID_ARGUMENT and count[0] == 7
    pairs = ffi.new("int32_t[]", 2)
    assert lib.pytfm_tokenizer_merges(handle, pairs, 1) == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "n must be the merge count, 50000, got 1" in ffi.string(lib.pytfm_last_error()).decode()


def test_threads_encoding_at_once_agree(gpt2_tokenizer):
    """One tokenizer, four threads: the cache is one encode's at a time, the others merge
    without it, and every result is the same."""
    from concurrent.futures import ThreadPoolExecutor

    text = (PROSE * 200).encode()
    want = gpt2_tokenizer.encode(text)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: gpt2_tokenizer.encode(text), range(8)))
    assert all(g == want for g in got)


# ---- the fuzzer ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tokenizer_fuzzer(tmp_path_factory):
    from test_c_checkpoint import build_fuzz_target

    return build_fuzz_target(tmp_path_factory, "fuzz_tokenizer")


def open_memory(opener, *args):
    """A Tokenizer of one of the library's memory openers (TokenizerError when it refuses)."""
    return Tokenizer.__new__(Tokenizer)._open(opener, *args)


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
                tok = open_memory(lib.pytfm_tokenizer_open_memory, vocab, len(vocab), merges,
                                  len(merges))
            else:
                tok = open_memory(lib.pytfm_tokenizer_open_json_memory, raw[1:], len(raw) - 1)
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
    """Every hostile file of tokenizer_cases.HOSTILE, as an input of the fuzz target
    (vocab.json NUL merges.txt, or tokenizer.json), and the seeds, run once under ASan and
    LeakSanitizer: refused without a leak."""
    inputs = []
    for n in range(len(tokenizer_cases.HOSTILE)):
        folder, _ = tokenizer_cases.hostile_folder(tmp_path, n)
        names = sorted(os.listdir(folder))
        texts = [open(os.path.join(folder, name), "rb").read() for name in names]
        if names == ["merges.txt", "vocab.json"] and b"\0" not in texts[1]:
            raw = b"\x01" + texts[1] + b"\0" + texts[0]
        elif names == ["tokenizer.json"]:
            raw = b"\x02" + texts[0]
        else:
            continue  # the folder rule's cases: not an input of the fuzz target
        path = tmp_path / f"hostile-{n}"
        path.write_bytes(raw)
        inputs.append(str(path))
    seeds = os.path.join(FUZZ, "tokenizer_seeds")
    inputs += [os.path.join(seeds, f) for f in sorted(os.listdir(seeds))]
    run = subprocess.run([tokenizer_fuzzer, *inputs], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTFM_FUZZ_VOCAB": ""})
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stderr.count("Executed ") == len(inputs), run.stderr[-2000:]
