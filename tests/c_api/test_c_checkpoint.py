"""The checkpoint reader in C (csrc/model/safetensors.c, checkpoint.c, json.c): the one reader,
which pytfm.checkpoint maps to NumPy and the C model API builds its models on.

Every file it refuses, it refuses with PYTFM_STATUS_INVALID_ARGUMENT and a message naming the
file and what is wrong, never with a crash: through Python (a CheckpointError in the same words)
and through the C model API (pytfm_model_open, pytfm_model_open_memory); every file it accepts
gives Python and C the same config. Here: a hostile set (each case refused everywhere, its
message checked), a file cut at every byte, edge cases the format allows, hypothesis mutations
of real checkpoints, the happy path in every position mode, tied and untied, with and without
AdamW state, and the public safetensors API itself; tests/c_api/open_checkpoints.c reads the
hostile set, the cuts and tests/c_api/fuzz/regressions/ every way the API offers (path,
descriptor, memory; each tensor read) under ASan and UBSan, and the libFuzzer target runs for a
bounded time (tests/c_api/fuzz/README.md).
"""

import errno
import functools
import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_edits import edit_structure, pack, unpack
from checkpoint_edits import small_model as small
from helpers import CSRC, TESTS, build_with_library, subprocess_env
from pytfm import checkpoint
from pytfm._core import ffi, lib
from pytfm.checkpoint import CheckpointError
from pytfm.nn import GPTConfig, param_shapes

FUZZ = os.path.join(TESTS, "c_api", "fuzz")
REGRESSIONS = os.path.join(FUZZ, "regressions")
OK, INVALID = lib.PYTFM_STATUS_OK, lib.PYTFM_STATUS_INVALID_ARGUMENT
DEPTH = lib.PYTFM_JSON_MAX_DEPTH
POS = {"rope": 0, "sinusoidal": 1, "none": 2, "learned": 3}
needs_csrc = pytest.mark.skipif(not os.path.isdir(CSRC), reason="needs the source checkout")


# ---- checkpoints to start from --------------------------------------------------------------


@functools.cache
def saved(pos="rope", tie=True, adamw=True, extra=(("note", "hi"),), step=3, **kw):
    """The bytes pytfm.checkpoint.save writes for small(pos, tie, **kw)."""
    model, opt = small(pos, tie, **kw)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.safetensors")
        checkpoint.save(path, model, step=step, optimizer=opt if adamw else None,
                        extra=dict(extra))
        with open(path, "rb") as f:
            return f.read()


def base():
    """The header and data of the small checkpoint with AdamW state that the cases edit."""
    return unpack(saved())


def header_text():
    (n,) = struct.unpack("<Q", saved()[:8])
    return saved()[8:8 + n].decode(), saved()[8 + n:]


# ---- the reader, through the model API and through Python -----------------------------------


def last_error():
    return ffi.string(lib.pytfm_last_error()).decode("utf-8", "replace")


def c_open(path):
    """-> (status, message, config dict or None) of pytfm_model_open(path)."""
    model = ffi.new("pytfm_model **")
    status = lib.pytfm_model_open(model, os.fsencode(path), lib.PYTFM_DEVICE_CPU)
    return _opened(status, model)


def c_open_memory(blob):
    model = ffi.new("pytfm_model **")
    status = lib.pytfm_model_open_memory(model, ffi.from_buffer(blob), len(blob),
                                         lib.PYTFM_DEVICE_CPU)
    return _opened(status, model)


def _opened(status, model):
    message = last_error()
    if status != OK:
        assert model[0] == ffi.NULL
        return status, message, None
    config = ffi.new("pytfm_model_config *")
    assert lib.pytfm_model_get_config(model[0], config) == OK
    assert lib.pytfm_model_close(model[0]) == OK
    names = ["vocab", "d_model", "n_layer", "n_head", "max_seq", "pos", "tie_embeddings",
             "n_params", "step"]
    return status, message, {k: getattr(config, k) for k in names}


def py_load(path):
    """pytfm.checkpoint.load: ("ok", config as the C struct has it, the model) or ("rejected",
    message). Anything but CheckpointError propagates: that would be a bug."""
    try:
        model, step, _ = checkpoint.load(path)
    except CheckpointError as e:
        return "rejected", str(e), None
    cfg = model.cfg
    config = dict(vocab=cfg.vocab, d_model=cfg.d_model, n_layer=cfg.n_layer, n_head=cfg.n_head,
                  max_seq=cfg.max_seq, pos=POS[cfg.pos], tie_embeddings=int(cfg.tie_embeddings),
                  n_params=model.num_params(), step=step)
    return "ok", config, model


def same_words(python, c):
    """Python's message is C's (both "<path>: ..."; C's last error is cut at 2047 bytes)."""
    return python == c or (len(c.encode()) >= 2036 and python.startswith(c[:-8]))


def read_alike(path, blob):
    """The reader, through Python and through the model API from the file and from memory,
    refuses path (which holds blob) with one message naming its source, or accepts it with one
    config. -> ("rejected", what is wrong) or ("ok", the config, Python's model)."""
    py = py_load(path)
    status, message, config = c_open(path)
    m_status, m_message, m_config = c_open_memory(blob)
    if py[0] == "rejected":
        assert status == INVALID and message.startswith(f"{path}: "), (path, status, message)
        what = message[len(path) + 2:]
        assert same_words(py[1], message), (py[1], message)
        assert m_status == INVALID and m_message == f"<memory>: {what}", (m_message, what)
        return "rejected", what
    assert status == OK and m_status == OK, (path, message, m_message)
    assert config == py[1] == m_config, (config, py[1], m_config)
    return py


def refused(path, blob, match):
    """read_alike, which must refuse, with a message matching match. -> what is wrong."""
    verdict = read_alike(path, blob)
    assert verdict[0] == "rejected", f"{path} accepted"
    assert re.search(match, verdict[1]), verdict[1]
    return verdict[1]


# ---- the ASan driver, tests/c_api/open_checkpoints.c ----------------------------------------

FLAGS = ["-std=c11", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
ASAN_ENV = dict(ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
                UBSAN_OPTIONS="print_stacktrace=1")


@functools.cache
def driver(sanitized=True):
    """tests/c_api/open_checkpoints.c built with the library sources, under ASan and UBSan (or None
    where the compiler cannot link their runtimes); sanitized=False: a plain build."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    out = tempfile.mkdtemp(prefix="pytfm-open-checkpoints-")
    flags = FLAGS + (SANITIZE if sanitized else [])
    probe = os.path.join(out, "probe.c")
    with open(probe, "w") as f:
        f.write("int main(void) { return 0; }\n")
    if subprocess.run([cc, *flags, probe, "-o", probe + ".exe"], capture_output=True).returncode:
        return None
    exe = os.path.join(out, "open_checkpoints")
    build = build_with_library(cc, flags, os.path.join(TESTS, "c_api", "open_checkpoints.c"), exe)
    assert build.returncode == 0, build.stderr
    return exe


def asan_driver():
    """The ASan driver; where the sanitizers do not link, a skip, but a failure under CI (the
    environment variable CI set), which must run these tests, as the fuzzer fixture does."""
    exe = driver(True)
    if exe is None:
        message = ("the C compiler cannot link sanitizer runtimes (libasan/libubsan) here: "
                   "install them (Debian/Ubuntu: gcc's libasan and libubsan packages)")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return exe


def test_without_sanitizers_the_asan_tests_skip_but_fail_under_ci(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "driver", lambda sanitized=True: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="cannot link sanitizer runtimes"):
        asan_driver()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="cannot link sanitizer runtimes"):
        asan_driver()


def run_driver(paths):
    """The ASan driver on paths: its CompletedProcess, asserted clean."""
    run = subprocess.run([asan_driver(), *paths], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, **ASAN_ENV))
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-4000:])
    return run


# ---- hostile files: each refused everywhere, naming the file and the fault ------------------


def edit_header(change):
    """A case: the base header changed by change(header) (which may return a new one)."""
    def make():
        header, body = base()
        return pack(change(header) or header, body)
    return make


def edit_meta(meta=None, **more):
    """A case: __metadata__ with these fields set."""
    return edit_header(lambda h: h["__metadata__"].update({**(meta or {}), **more}))


def edit_config(**changes):
    def change(h):
        config = json.loads(h["__metadata__"]["config"])
        for k, v in changes.items():
            if v is DELETE:
                del config[k]
            else:
                config[k] = v
        h["__metadata__"]["config"] = json.dumps(config)
    return edit_header(change)


def edit_text(old, new, count=1):
    """A case: the raw header text with old replaced by new (the length field follows)."""
    def make():
        text, body = header_text()
        assert old in text, old
        return pack(text.replace(old, new, count).encode(), body)
    return make


def edit_bytes(old, new):
    def make():
        text, body = header_text()
        return pack(text.encode().replace(old, new, 1), body)
    return make


def entry(name, **changes):
    def change(h):
        for k, v in changes.items():
            if v is DELETE:
                del h[name][k]
            else:
                h[name][k] = v
    return edit_header(change)


DELETE = object()
WTE = "transformer.wte.weight"


def swap_offsets(h):
    h[WTE]["data_offsets"], h["transformer.ln_f.bias"]["data_offsets"] = (
        h["transformer.ln_f.bias"]["data_offsets"], h[WTE]["data_offsets"])


def overlap(h):
    b, e = h["transformer.ln_f.bias"]["data_offsets"]
    h["transformer.ln_f.bias"]["data_offsets"] = [b - 4, e - 4]


def big_table(h):
    config = json.loads(h["__metadata__"]["config"])
    config.update(pos="sinusoidal", max_seq=2**40)
    h["__metadata__"]["config"] = json.dumps(config)


def rename(old, new):
    def change(h):
        h[new] = h.pop(old)
    return change


def without_moments():
    """optim.t, but no moments (their entries and bytes gone: the layout holds)."""
    header, body = base()
    for k in [k for k in header if k.startswith("optim.")]:
        del header[k]
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    return pack(header, body[:end])


def plain_file():
    """The base checkpoint's body with __metadata__ but no optim.t: moments are unexpected."""
    header, body = base()
    del header["__metadata__"]["optim.t"]
    return pack(header, body)


def cut(n):
    return lambda: saved()[:n]


def absurd_length(n):
    return lambda: struct.pack("<Q", n) + saved()[8:]


HOSTILE = [
    # the safetensors layer: lengths
    ("empty", lambda: b"", r"0 bytes is too short for a safetensors file"),
    ("a text file", lambda: b"# pytfm\n\npytfm is a small transformer library.\n",
     r"^not a safetensors file \(it does not start with a header length and a JSON object\)$"),
    ("seven bytes", cut(7), r"7 bytes is too short"),
    ("header only", cut(8), r"header of \d+ bytes runs past the end of the file \(8 bytes\)"),
    ("length past the end", absurd_length(len(saved())), r"runs past the end of the file"),
    ("length 2**64-1", absurd_length(2**64 - 1), r"header of 18446744073709551615 bytes runs "),
    ("length 2**63", absurd_length(2**63), r"runs past the end"),
    ("length 0", absurd_length(0), r"the header is not valid JSON \(expecting a value"),
    ("length one short", lambda: struct.pack("<Q", struct.unpack("<Q", saved()[:8])[0] - 1)
     + saved()[8:], r"not valid JSON|data bytes belong to no tensor"),
    # UTF-8 and JSON
    ("invalid byte", edit_bytes(b'"format"', b'"form\xffat"'), r"not UTF-8 \(byte \d+: invalid "
     r"start byte\)"),
    ("overlong", edit_bytes(b'"format"', b'"form\xc0\x80at"'), r"not UTF-8"),
    ("overlong 3 bytes", edit_bytes(b'"format"', b'"form\xe0\x80\xafat"'), r"not UTF-8"),
    ("encoded surrogate", edit_bytes(b'"format"', b'"form\xed\xa0\x80at"'), r"not UTF-8"),
    ("past U+10FFFF", edit_bytes(b'"format"', b'"form\xf4\x90\x80\x80at"'), r"not UTF-8"),
    ("truncated sequence", edit_bytes(b'"format"', b'"form\xe2\x82"'), r"not UTF-8"),
    ("BOM", lambda: pack(b"\xef\xbb\xbf" + header_text()[0].encode(), header_text()[1]),
     r"not valid JSON \(expecting a value"),
    ("trailing comma", edit_text("]}}", "]},}"), r"not valid JSON \(expecting a property name"),
    ("key without colon", edit_text('"__metadata__": ', '"__metadata__" '),
     r"not valid JSON \(expecting ':'"),
    ("single quotes", edit_text('"F32"', "'F32'"), r"not valid JSON"),
    ("unterminated", lambda: pack(header_text()[0].rstrip()[:-2].encode(), header_text()[1]),
     r"not valid JSON"),
    ("extra data", edit_text("]}}", "]}} {}"), r"extra data after the value"),
    ("NaN", edit_text("[8, 4]", "[NaN, 4]"), r"NaN is not JSON"),
    ("Infinity", edit_text("[8, 4]", "[Infinity, 4]"), r"Infinity is not JSON"),
    ("-Infinity", edit_text("[8, 4]", "[-Infinity, 4]"), r"-Infinity is not JSON"),
    ("leading zero", edit_text("[8, 4]", "[08, 4]"), r"not valid JSON"),
    ("bare minus", edit_text("[8, 4]", "[-, 4]"), r"not valid JSON"),
    ("control character", edit_text('"F32"', '"F3\t2"'), r"invalid control character 0x09"),
    ("bad escape", edit_text('"F32"', '"F\\x32"'), r"invalid escape \\x"),
    ("bad \\u escape", edit_text('"F32"', '"F\\u00g2"'), r"invalid \\uXXXX escape"),
    ("int of 4301 digits", edit_text("[8, 4]", "[" + "1" * 4301 + ", 4]"),
     r"an integer of 4301 digits"),
    ("nested 5000 deep", edit_text('{"', '{"deep": ' + "[" * 5000 + "]" * 5000 + ', "'),
     rf"not valid JSON \(nested more than {DEPTH} levels deep"),
    ("nested a level too deep", edit_text('{"', '{"deep": ' + "[" * DEPTH + "]" * DEPTH + ', "'),
     rf"not valid JSON \(nested more than {DEPTH} levels deep"),  # the header's { is one
    ("nested objects too deep", edit_text('{"', '{"deep": ' + '{"a": ' * DEPTH + "1" +
                                          "}" * DEPTH + ', "'),
     rf"not valid JSON \(nested more than {DEPTH} levels deep"),
    ("header {}", lambda: pack(b"{}"), r"not a pytfm checkpoint \(no pytfm config"),
    ("no tensors", lambda: pack({"__metadata__": base()[0]["__metadata__"]}),
     r"tensor transformer.wte.weight is missing"),
    ("header is an array", lambda: pack(b"[]", b""), r"the header is a JSON array, not an object"),
    ("header is a string", lambda: pack(b'"x"', b""), r"the header is a JSON string"),
    ("duplicate tensor", edit_text(', "transformer.ln_f.weight"',
                                   ', "transformer.ln_f.bias": 1, "transformer.ln_f.weight"'),
     r"duplicate key \"transformer.ln_f.bias\""),
    ("duplicate by escape", edit_text(', "transformer.ln_f.bias":',
                                      ', "transformer.ln_f.bia\\u0073": 1, '
                                      '"transformer.ln_f.bias":'),
     r"duplicate key"),
    ("duplicate in config", edit_text('{\\"vocab\\": 8', '{\\"vocab\\": 8, \\"vocab\\": 8'),
     r"config is not valid JSON \(duplicate key"),
    ("lone surrogate key", edit_text('"__metadata__"', '"\\ud800": 1, "__metadata__"'),
     r"lone surrogate"),
    ("low surrogate key", edit_text('"__metadata__"', '"a\\udc00": 1, "__metadata__"'),
     r"lone surrogate"),
    # __metadata__
    ("metadata a list", edit_header(lambda h: h.update(__metadata__=[])),
     r"__metadata__ is a JSON array, not an object of strings"),
    ("metadata value an int", edit_meta(step=3), r"__metadata__\[\"step\"\] is 3, not a string"),
    ("metadata value lone surrogate", edit_text('"pytfm"', '"pytfm\\udfff"'),
     r"__metadata__\[\"format\"\] is .*, not a string"),
    ("no metadata", edit_header(lambda h: h.pop("__metadata__") and None),
     r"not a pytfm checkpoint"),
    # entries
    ("entry a list", edit_header(lambda h: h.update({WTE: [1]})),
     r"tensor 'transformer.wte.weight': its entry is a JSON array, not an object"),
    ("no dtype", entry(WTE, dtype=DELETE), r"its entry has no dtype"),
    ("no shape", entry(WTE, shape=DELETE), r"its entry has no shape"),
    ("no data_offsets", entry(WTE, data_offsets=DELETE), r"its entry has no data_offsets"),
    ("unknown key", entry(WTE, extra=1), r"its entry has an unknown key \"extra\""),
    # two: both readers name the first in code point order, not the first written
    ("unknown keys", entry(WTE, zz=1, extra=1), r"its entry has an unknown key \"extra\"$"),
    ("unknown keys by code point", edit_text('"dtype": "F32", "shape": [8, 4]',
                                             '"dtype": "F32", "\\u00e9": 1, "z": 2, '
                                             '"shape": [8, 4]'),
     r"its entry has an unknown key \"z\"$"),  # not "\u00e9": escapes compare unescaped
    ("unknown keys past the BMP", edit_text('"dtype": "F32", "shape": [8, 4]',
                                            '"dtype": "F32", "\\ud83d\\ude00": 1, '
                                            '"\\uffff": 2, "shape": [8, 4]'),
     r"its entry has an unknown key \"\\uffff\"$"),  # U+FFFF before U+1F600, as Python
    ("dtype F16", entry(WTE, dtype="F16"), r"unsupported dtype \"F16\" \(pytfm reads F32, I64\)"),
    ("dtype f32", entry(WTE, dtype="f32"), r"unsupported dtype"),
    ("dtype an int", entry(WTE, dtype=4), r"unsupported dtype 4"),
    ("shape not a list", entry(WTE, shape=32), r"shape 32 is not a list of non-negative ints"),
    ("shape negative", entry(WTE, shape=[-8, -4]), r"is not a list of non-negative ints"),
    ("shape a float", entry(WTE, shape=[8.0, 4]), r"is not a list of non-negative ints"),
    ("shape a bool", entry(WTE, shape=[True, 32]), r"is not a list of non-negative ints"),
    ("shape 33 dims", entry(WTE, shape=[1] * 31 + [8, 4]), r"33 dimensions, NumPy allows 32"),
    ("shape 2**64", entry(WTE, shape=[2**64, 0]), r"is too large for NumPy"),
    ("shape 2**62 empty", entry(WTE, shape=[2**62, 0]), r"is too large for NumPy"),
    ("shape wrong bytes", entry(WTE, shape=[8, 3]), r"F32\[8, 3\] is 96 bytes, but its "
     r"data_offsets \[0, 128\] hold 128"),
    ("offsets not a pair", entry(WTE, data_offsets=[0, 64, 128]), r"is not a pair of ints"),
    ("offsets floats", entry(WTE, data_offsets=[0.0, 128]), r"is not a pair of ints"),
    ("offsets bools", entry(WTE, data_offsets=[False, 128]), r"is not a pair of ints"),
    ("offsets negative", entry(WTE, data_offsets=[-128, 0]), r"are negative or reversed"),
    ("offsets reversed", entry(WTE, data_offsets=[128, 0]), r"are negative or reversed"),
    ("offsets huge", entry(WTE, data_offsets=[0, 2**64]), r"run past the end of the data"),
    ("offsets huge begin", entry(WTE, data_offsets=[2**64, 128]), r"negative or reversed"),
    ("offsets past the end", entry(WTE, data_offsets=[0, 10**9]), r"run past the end of the "
     r"data \(\d+ bytes\): truncated file\?"),
    ("offsets swapped", edit_header(swap_offsets), r"is F32\[8, 4\] is|bytes, but its"),
    ("offsets overlap", edit_header(overlap), r"overlaps tensor|bytes, but its"),
    ("data left over", lambda: saved() + b"\0" * 4, r"the last 4 of the \d+ data bytes belong "
     r"to no tensor"),
    ("gap", entry(WTE, data_offsets=[4, 132]), r"tensor 'transformer.wte.weight' \(data_offsets "
     r"\[4, 132\]\) leaves a gap of 4 bytes after the start of the data, which ends at 0"),
    # the pytfm layer
    ("not pytfm", edit_meta(format="other"), r"not a pytfm checkpoint \(no pytfm config"),
    ("no config", edit_header(lambda h: h["__metadata__"].pop("config") and None),
     r"not a pytfm checkpoint"),
    ("config not JSON", edit_meta(config="{vocab: 8}"), r"config is not valid JSON"),
    ("config a list", edit_meta(config="[]"), r"config is a JSON array, not an object"),
    ("config no vocab", edit_config(vocab=DELETE), r"config has no vocab"),
    ("config no seed", edit_config(seed=DELETE), r"config has no seed"),
    ("config unknown field", edit_config(dropout=0.1), r"config has an unknown field \"dropout\""),
    ("vocab a float", edit_config(vocab=8.0), r"GPTConfig.vocab must be an int, got 8.0"),
    ("vocab 8e0", edit_text('\\"vocab\\": 8', '\\"vocab\\": 8e0'),
     r"GPTConfig.vocab must be an int, got 8e0"),
    ("vocab a bool", edit_config(vocab=True), r"GPTConfig.vocab must be an int, got true"),
    ("vocab a string", edit_config(vocab="8"), r"GPTConfig.vocab must be an int"),
    ("vocab null", edit_config(vocab=None), r"GPTConfig.vocab must be an int"),
    ("vocab 0", edit_config(vocab=0), r"GPTConfig.vocab must be a positive int"),
    ("vocab 2**63", edit_config(vocab=2**63), r"GPTConfig.vocab must be a positive int "),
    ("vocab 10**30", edit_config(vocab=10**30), r"GPTConfig.vocab must be a positive int "),
    ("n_layer -1", edit_config(n_layer=-1), r"GPTConfig.n_layer must be a positive int"),
    ("n_head 0", edit_config(n_head=0), r"GPTConfig.n_head must be a positive int"),
    ("max_seq -2**63", edit_config(max_seq=-2**63), r"GPTConfig.max_seq must be a positive int"),
    ("seed -1", edit_config(seed=-1), r"GPTConfig.seed must be a non-negative int, got -1"),
    ("seed a float", edit_config(seed=0.0), r"GPTConfig.seed must be an int"),
    ("pos an int", edit_config(pos=0), r"GPTConfig.pos must be a str, got 0"),
    ("pos rotary", edit_config(pos="rotary"), r"GPTConfig.pos must be one of"),
    ("pos ROPE", edit_config(pos="ROPE"), r"GPTConfig.pos must be one of"),
    ("tie an int", edit_config(tie_embeddings=1), r"GPTConfig.tie_embeddings must be a bool"),
    ("tie a string", edit_config(tie_embeddings="true"), r"tie_embeddings must be a bool"),
    ("n_head not dividing", edit_config(n_head=3), r"d_model \(4\) must be a multiple of "
     r"n_head \(3\)"),
    ("rope odd head dim", edit_config(n_head=4), r"rope needs an even head dim, got 1"),
    ("sinusoidal odd d_model", edit_config(pos="sinusoidal", d_model=5, n_head=5),
     r"sinusoidal positions need an even d_model, got 5"),
    ("2**60 layers", edit_config(n_layer=2**60), r"tensor transformer.h.1.ln_1.weight is "
     r"missing: config \{'vocab': 8, 'd_model': 4, 'n_layer': 1152921504606846976"),
    ("vocab mismatch", edit_config(vocab=9), r"transformer.wte.weight is float32\[8, 4\], "
     r"config .* needs float32\[9, 4\]"),
    ("d_model huge", edit_config(d_model=2**62, n_head=1),
     r"needs float32\[8, 4611686018427387904\]"),
    ("untied, no lm_head", edit_config(tie_embeddings=False), r"tensor lm_head.weight is missing"),
    ("learned, no wpe", edit_config(pos="learned"), r"tensor transformer.wpe.weight is missing: "
     r"config \{.*'pos': 'learned'.*\} needs float32\[4, 4\]"),
    ("sinusoidal table", edit_header(big_table), r"needs a sinusoidal table of 4398046511104 "
     r"floats for \d+ stored parameters"),
    ("sinusoidal table 2**63", edit_config(pos="sinusoidal", max_seq=2**62),
     r"needs a sinusoidal table of more than"),
    ("no step", edit_header(lambda h: h["__metadata__"].pop("step") and None),
     r"__metadata__ has no step"),
    ("step -1", edit_meta(step="-1"), r"step is \"-1\", not a non-negative int64"),
    ("step 1.5", edit_meta(step="1.5"), r"step is \"1.5\", not a non-negative int64"),
    ("step empty", edit_meta(step=""), r"step is \"\", not a non-negative int64"),
    ("step 2**63", edit_meta(step=str(2**63)), r"not a non-negative int64"),
    ("step 20 digits", edit_meta(step="0" * 20), r"not a non-negative int64"),
    ("step arabic digit", edit_meta(step="\u0663"), r"not a non-negative int64"),
    ("step space", edit_meta(step=" 1"), r"not a non-negative int64"),
    ("step newline", edit_meta(step="1\n"), r"not a non-negative int64"),
    ("optim.t -1", edit_meta({"optim.t": "-1"}), r"optim.t is \"-1\", not a non-negative int64"),
    ("extra not JSON", edit_meta(extra="{"), r"extra is not valid JSON"),
    ("extra NaN", edit_meta(extra="[NaN]"), r"extra is not valid JSON \(NaN is not JSON"),
    ("extra duplicate", edit_meta(extra='{"a": 1, "a": 2}'), r"extra is not valid JSON "
     r"\(duplicate key"),
    ("extra lone surrogate key", edit_meta(extra='{"\\ud800": 1}'), r"extra is not valid JSON"),
    ("extra 4301 digits", edit_meta(extra="1" * 4301), r"an integer of 4301 digits"),
    ("extra nested a level too deep", edit_meta(extra="[" * (DEPTH + 1) + "]" * (DEPTH + 1)),
     rf"extra is not valid JSON \(nested more than {DEPTH} levels deep"),
    ("config nested too deep", edit_text('{\\"vocab\\": 8', '{\\"x\\": ' + "[" * DEPTH +
                                         "]" * DEPTH + ', \\"vocab\\": 8'),
     rf"config is not valid JSON \(nested more than {DEPTH} levels deep"),
    ("extra empty", edit_meta(extra=""), r"extra is not valid JSON \(expecting a value"),
    # the tensors
    ("missing tensor", edit_header(lambda h: h.pop("transformer.ln_f.bias") and None),
     r"data_offsets|belong to no tensor|leaves a gap"),
    ("renamed tensor", edit_header(rename("transformer.ln_f.bias", "transformer.ln_f.b")),
     r"tensor transformer.ln_f.bias is missing: config \{'vocab': 8, 'd_model': 4, 'n_layer': "
     r"1, 'n_head': 2, 'max_seq': 4, 'pos': 'rope', 'tie_embeddings': True, 'seed': 0\} needs "
     r"float32\[4\]"),
    ("wrong dtype", entry("transformer.ln_f.bias", dtype="I64", shape=[2]),
     r"transformer.ln_f.bias is int64\[2\], config .* needs float32\[4\]"),
    ("wrong shape", entry("transformer.h.0.attn.c_attn.weight", shape=[4, 12]),
     r"transformer.h.0.attn.c_attn.weight is float32\[4, 12\], config .* needs "
     r"float32\[12, 4\]"),
    ("extra tensor", edit_text('"__metadata__"', '"zzz": {"dtype": "F32", "shape": [0], '
                               '"data_offsets": [0, 0]}, "__metadata__"'),
     r"unexpected tensors 'zzz' \(config"),
    ("moments without optim.t", plain_file, r"unexpected tensors 'optim.m.transformer.wte.weight'"
     r", 'optim.v.transformer.wte.weight', 'optim.m.transformer.h.0.ln_1.weight' and \d+ more "
     r"\(config .*, no optim.t\)"),
    ("optim.t without moments", without_moments,
     r"tensor optim.m.transformer.wte.weight is missing"),
    ("moment missing", edit_header(rename("optim.v.transformer.ln_f.bias", "optim.v.x")),
     r"tensor optim.v.transformer.ln_f.bias is missing"),
    ("moment of the wrong shape", entry("optim.m.transformer.h.0.mlp.c_fc.weight",
                                        shape=[4, 16]),
     r"optim.m.transformer.h.0.mlp.c_fc.weight is float32\[4, 16\], config .* needs "
     r"float32\[16, 4\]"),
]


def write(folder, name, blob):
    path = os.path.join(folder, re.sub(r"[^\w.-]+", "_", name) + ".safetensors")
    with open(path, "wb") as f:
        f.write(blob)
    return path


def test_the_hostile_cases_are_distinct():
    blobs = [make() for _, make, _ in HOSTILE]
    assert len(set(blobs)) == len(blobs)
    assert len({name for name, _, _ in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize("name,make,match", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_file_is_refused_everywhere_in_its_words(tmp_path, name, make, match):
    blob = make()
    refused(write(str(tmp_path), name, blob), blob, match)


@pytest.mark.parametrize("name", ["unknown keys", "unknown keys by code point",
                                  "unknown keys past the BMP"])
def test_of_two_unknown_keys_the_first_in_code_point_order_is_named(tmp_path, name):
    """The key is shown as the header writes it (JSON): read back, it is the one of the entry's
    unknown keys that Python's sorted() puts first."""
    make = next(make for case, make, _ in HOSTILE if case == name)
    blob = make()
    what = refused(write(str(tmp_path), name, blob), blob, "unknown key")
    named = json.loads(re.search(r"unknown key (.*)$", what).group(1))
    header, _ = unpack(blob)
    keys = set(header[WTE]) - {"dtype", "shape", "data_offsets"}
    assert len(keys) == 2 and named == min(keys), (named, keys)


@needs_csrc
def test_hostile_files_run_clean_under_asan_and_ubsan(tmp_path):
    """Every hostile file, and every file of tests/c_api/fuzz/regressions/, read every way
    (path, descriptor, memory; each tensor) and through both model API entry points, under ASan
    (leaks included) and UBSan."""
    paths = [write(str(tmp_path), name, make()) for name, make, _ in HOSTILE]
    paths += sorted(os.path.join(REGRESSIONS, f) for f in os.listdir(REGRESSIONS))
    out = run_driver(paths).stdout
    total = len(HOSTILE) + len(os.listdir(REGRESSIONS))
    assert f"{total} files: " in out and "every way agreed" in out, out[-2000:]
    assert out.count("rejected: ") >= len(HOSTILE), out[-2000:]


def json_text_is_read_by_python(raw):
    """Every text the C JSON check passes is one json.loads reads (pytfm.checkpoint relies on
    it for config and extra): asserted; -> whether C passed raw."""
    if lib.pytfm_json_check(raw, len(raw)) != OK:
        return False
    json.loads(raw.decode("utf-8"))
    return True


@needs_csrc
def test_fuzz_regressions_are_refused_everywhere(tmp_path):
    """Each input the fuzzer ever flagged: read alike through Python and the model API, as a
    checkpoint and as its bytes wrapped as a header; one named json-*-accepted, a text that is
    not JSON, refused by the JSON check."""
    names = sorted(os.listdir(REGRESSIONS))
    assert names, "tests/c_api/fuzz/regressions/ is empty"
    wrapped = str(tmp_path / "wrapped.safetensors")
    for name in names:
        path = os.path.join(REGRESSIONS, name)
        with open(path, "rb") as f:
            raw = f.read()
        read_alike(path, raw)
        if name.startswith("json-") and name.endswith("-accepted"):
            assert lib.pytfm_json_check(raw, len(raw)) == INVALID, name
            with pytest.raises(ValueError):
                json.loads(raw)
        read_as_header(raw, wrapped)


def test_a_huge_header_length_within_the_file_is_refused_by_its_limit(tmp_path):
    """A file over MAX_HEADER bytes (sparse: nothing is written) whose header length is past
    the limit: refused before anything is read."""
    path = str(tmp_path / "huge.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", lib.PYTFM_SAFETENSORS_MAX_HEADER + 1) + b"{")
    os.truncate(path, lib.PYTFM_SAFETENSORS_MAX_HEADER + 100)
    status, message, _ = c_open(path)
    assert status == INVALID and message == (
        f"{path}: header of 100000001 bytes is over the 100000000-byte limit"), message
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(path)
    assert str(e.value) == message


@pytest.mark.parametrize("kind", ["bare members", "empty tensors"])
def test_a_header_of_many_members_is_refused_fast(tmp_path, kind):
    """A header of 200 000 members that are not entries (refused at the first, before any list
    of them is made), or of 200 000 valid empty tensors (each checked, sorted, looked up):
    through the model API and through Python."""
    meta = json.dumps(base()[0]["__metadata__"])
    if kind == "bare members":
        members = ", ".join(f'"k{i}": {i}' for i in range(200_000))
        match = r"tensor 'k0': its entry is a JSON number, not an object"
    else:
        members = ", ".join(f'"k{i}": {{"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'
                            for i in range(200_000))
        match = r"tensor transformer.wte.weight is missing"
    path = write(str(tmp_path), kind, pack(f'{{"__metadata__": {meta}, {members}}}'.encode()))
    for load in (c_open, py_load):
        start = time.perf_counter()
        verdict = load(path)
        elapsed = time.perf_counter() - start
        assert verdict[0] in (INVALID, "rejected") and re.search(match, verdict[1]), verdict[:2]
        assert elapsed < 2, (load, elapsed)  # the limit is for a busy machine


def test_what_cannot_be_opened_is_an_error_naming_the_path(tmp_path):
    """C: the path and why (a folder is opened as a GPT-2 folder, so it is its config.json
    that is missing); Python: os.open's OSError for what cannot be opened at all, a
    CheckpointError for what is not a file."""
    missing, folder = str(tmp_path / "missing"), str(tmp_path)
    for path, why in [(missing, ": cannot open: No such file"),
                      (folder, "/config.json: missing (a GPT-2 folder holds config.json)")]:
        status, message, _ = c_open(path)
        assert status == INVALID and message.startswith(f"{path}{why}"), message
    with pytest.raises(FileNotFoundError) as e:
        checkpoint.load(missing)
    assert e.value.errno == errno.ENOENT and e.value.filename == missing
    with pytest.raises(CheckpointError, match=f"^{re.escape(folder)}: not a regular file$"):
        checkpoint.load(folder)


FIFO_OPEN = """
import sys
from pytfm import checkpoint
from pytfm._core import ffi, lib
path = sys.argv[2]
if sys.argv[1] == "c":
    model = ffi.new("pytfm_model **")
    status = lib.pytfm_model_open(model, path.encode(), lib.PYTFM_DEVICE_CPU)
    print(status, ffi.string(lib.pytfm_last_error()).decode())
else:
    for load in (checkpoint.load, checkpoint.load_file):
        try:
            load(path)
            print("accepted")
        except checkpoint.CheckpointError as e:
            print(type(e).__name__, e)
"""


@pytest.mark.parametrize("reader", ["c", "python"])
def test_a_fifo_is_refused_at_once_naming_the_path(tmp_path, reader):
    """Opening a FIFO for reading waits for a writer unless opened O_NONBLOCK: both readers
    must refuse it as not a regular file without waiting. Run in a child process with a
    timeout, so that a reader that blocks fails the test instead of hanging it."""
    import pytfm

    path = str(tmp_path / "fifo.safetensors")
    os.mkfifo(path)
    env = subprocess_env(os.path.dirname(os.path.dirname(pytfm.__file__)))
    try:
        run = subprocess.run([sys.executable, "-c", FIFO_OPEN, reader, path], capture_output=True,
                             text=True, env=env, cwd="/", timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"opening the FIFO {path} blocked ({reader} reader)")
    assert run.returncode == 0, run.stderr[-2000:]
    if reader == "c":
        assert run.stdout == f"{INVALID} {path}: not a regular file\n", run.stdout
    else:
        assert run.stdout == f"CheckpointError {path}: not a regular file\n" * 2, run.stdout



def test_every_truncation_of_a_small_file_is_refused_everywhere(tmp_path):
    blob = saved(adamw=False, extra=())
    path = str(tmp_path / "cut.safetensors")
    for n in range(len(blob)):
        with open(path, "wb") as f:
            f.write(blob[:n])
        refused(path, blob[:n], "")
    assert c_open_memory(blob)[0] == OK


@needs_csrc
def test_every_truncation_runs_clean_under_asan(tmp_path):
    blob = saved(adamw=False, extra=())
    paths = []
    for n in range(0, len(blob), 7):
        paths.append(write(str(tmp_path), f"cut{n}", blob[:n]))
    out = run_driver(paths).stdout
    assert f"{len(paths)} files: 0 accepted" in out, out[-1000:]


# ---- what the reader accepts: the same config everywhere, the bytes as stored ---------------


@pytest.mark.parametrize("pos", list(POS))
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("adamw", [False, True])
def test_happy_path_same_config_and_parameters(tmp_path, pos, tie, adamw):
    blob = saved(pos, tie, adamw, n_layer=2, step=12345)
    path = write(str(tmp_path), "m", blob)
    verdict, config, model = read_alike(path, blob)
    assert verdict == "ok" and config["step"] == 12345 and config["n_layer"] == 2
    header, body = unpack(blob)
    for name, _ in param_shapes(model.cfg):
        begin, end = header[name]["data_offsets"]
        assert model.params[name].tobytes() == body[begin:end], name


def st_open(path):
    handle = ffi.new("pytfm_safetensors **")
    status = lib.pytfm_safetensors_open(handle, os.fsencode(path))
    return status, handle[0]


def test_the_safetensors_api_reads_any_layout(tmp_path):
    """Layer 1 alone: the table in header order (names with escapes, NUL, non-ASCII), metadata
    by index and by key, find, each tensor's bytes as stored, and its argument checks."""
    path = str(tmp_path / "t.safetensors")
    tensors = {"b\x00c": np.arange(3, dtype=np.int64), "é": np.zeros((2, 0, 5), np.float32),
               "a": np.array([[1.5, -2]], np.float32), "s": np.array(7.0, np.float32)}
    checkpoint.save_file(path, tensors, {"k": "v", "ü": "\x00x"})
    status, st = st_open(path)
    assert status == OK, last_error()
    try:
        count = ffi.new("int64_t *")
        assert lib.pytfm_safetensors_tensor_count(st, count) == OK and count[0] == 4
        info = ffi.new("pytfm_tensor_info *")
        head = struct.unpack("<Q", open(path, "rb").read(8))[0]
        for i, (name, a) in enumerate(tensors.items()):
            assert lib.pytfm_safetensors_tensor(st, i, info) == OK
            assert ffi.unpack(info.name, info.name_len).decode() == name
            assert info.dtype == (lib.PYTFM_DTYPE_F32 if a.dtype == np.float32
                                  else lib.PYTFM_DTYPE_I64)
            assert tuple(info.shape[0:info.ndim]) == a.shape and info.nbytes == a.nbytes
            assert info.end - info.begin == a.nbytes and info.file_offset == 8 + head + info.begin
            out = bytearray(a.nbytes)
            assert lib.pytfm_safetensors_read(st, i, ffi.from_buffer(out), len(out)) == OK
            assert bytes(out) == a.tobytes()
            index = ffi.new("int64_t *")
            assert lib.pytfm_safetensors_find(st, name.encode(), index) == OK
            assert index[0] == (i if "\x00" not in name else -1)  # a NUL ends the C string
        assert lib.pytfm_safetensors_find(st, b"nope", index) == OK and index[0] == -1
        assert lib.pytfm_safetensors_metadata_count(st, count) == OK and count[0] == 2
        item = ffi.new("pytfm_metadata_item *")
        assert lib.pytfm_safetensors_metadata(st, 1, item) == OK
        assert ffi.unpack(item.key, item.key_len).decode() == "ü"
        assert ffi.unpack(item.value, item.value_len) == b"\x00x"
        value, length = ffi.new("char **"), ffi.new("int64_t *")
        assert lib.pytfm_safetensors_metadata_get(st, b"k", value, length) == OK
        assert ffi.unpack(value[0], length[0]) == b"v"
        assert lib.pytfm_safetensors_metadata_get(st, b"x", value, length) == OK
        assert value[0] == ffi.NULL and length[0] == 0
        assert lib.pytfm_safetensors_tensor(st, 4, info) == lib.PYTFM_STATUS_OUT_OF_RANGE
        assert last_error() == "pytfm_safetensors_tensor: index must be in [0, 4), got 4"
        assert lib.pytfm_safetensors_read(st, 0, ffi.from_buffer(out), 4) == INVALID
        assert last_error() == ("pytfm_safetensors_read: size must be the tensor's 24 bytes, "
                                "got 4")
        info_ckpt = ffi.new("pytfm_checkpoint_info *")
        assert lib.pytfm_checkpoint_check(st, info_ckpt) == INVALID
        assert last_error() == f"{path}: not a pytfm checkpoint (no pytfm config in __metadata__)"
    finally:
        assert lib.pytfm_safetensors_close(st) == OK
    assert lib.pytfm_safetensors_close(ffi.NULL) == OK
    handle = ffi.new("pytfm_safetensors **")
    assert lib.pytfm_safetensors_open(ffi.NULL, path.encode()) == INVALID
    assert last_error() == "pytfm_safetensors_open: st must not be NULL"
    assert lib.pytfm_safetensors_open_memory(handle, ffi.NULL, 8, ffi.NULL) == INVALID
    assert last_error() == "pytfm_safetensors_open_memory: data must not be NULL"
    assert lib.pytfm_safetensors_open_fd(handle, -1, ffi.NULL) == INVALID
    assert last_error() == "pytfm_safetensors_open_fd: fd must be >= 0, got -1"


def test_errno_tells_a_failed_system_call_from_a_bad_file(tmp_path):
    """errno after a failed open: the system call's error, or 0 when the bytes are at fault;
    without a source, the message names nothing (Python adds the path)."""
    status, st = st_open(str(tmp_path / "missing"))
    assert status == INVALID and st == ffi.NULL and ffi.errno == errno.ENOENT
    path = write(str(tmp_path), "cut", saved()[:5])
    status, st = st_open(path)
    assert status == INVALID and ffi.errno == 0 and last_error() == (
        f"{path}: 5 bytes is too short for a safetensors file")
    fd = os.open(path, os.O_RDONLY)
    try:
        handle = ffi.new("pytfm_safetensors **")
        assert lib.pytfm_safetensors_open_fd(handle, fd, ffi.NULL) == INVALID
        assert ffi.errno == 0 and last_error() == "5 bytes is too short for a safetensors file"
    finally:
        os.close(fd)


def test_the_checkpoint_layer_says_what_the_file_holds(tmp_path):
    blob = saved("sinusoidal", False, True, step=9)
    status, st = st_open(write(str(tmp_path), "m", blob))
    assert status == OK, last_error()
    try:
        info = ffi.new("pytfm_checkpoint_info *")
        assert lib.pytfm_checkpoint_check(st, info) == OK, last_error()
        model, _ = small("sinusoidal", False)
        assert info.has_optimizer == 1 and info.optim_t == 1 and info.config.step == 9
        assert info.config.n_params == model.num_params() and info.config.pos == POS["sinusoidal"]
        value = ffi.new("char **")
        assert lib.pytfm_safetensors_metadata_get(st, b"config", value, ffi.NULL) == OK
        assert GPTConfig(**json.loads(ffi.string(value[0]))) == model.cfg
    finally:
        lib.pytfm_safetensors_close(st)


def accepted_edit(change=None, text=None, meta=None, config=None, body=None):
    """The base checkpoint edited in ways Python accepts."""
    header, data = unpack(saved())
    if config:
        c = json.loads(header["__metadata__"]["config"])
        c.update(config)
        header["__metadata__"]["config"] = json.dumps(c)
    if meta:
        header["__metadata__"].update(meta)
    if change:
        header = change(header) or header
    head = json.dumps(header)
    for old, new in text or []:
        assert old in head, old
        head = head.replace(old, new)
    return pack(head.encode(), data if body is None else body(data))


def metadata_last(h):
    return {**{k: v for k, v in h.items() if k != "__metadata__"},
            "__metadata__": h["__metadata__"]}


def reverse_order(h):
    return dict(reversed(list(h.items())))


def special_floats(data):
    floats = np.frombuffer(data, np.float32).copy()
    bits = floats.view(np.uint32)
    bits[:6] = [0x7FC00001, 0x7F800001, 0xFFC12345, 0x80000000, 0x00000001, 0x7F800000]
    return floats.tobytes()


ACCEPTED = [
    ("as saved", {}),
    ("metadata last", dict(change=metadata_last)),
    ("entries reversed", dict(change=reverse_order)),
    ("whitespace", dict(text=[('}, "transformer', '} ,\n\t\r "transformer'),
                              ('"dtype": ', '"dtype"\t:\n ')])),
    ("escaped names", dict(text=[('"transformer.wte.weight"',
                                  '"\\u0074ransformer.wte.weigh\\u0074"')])),
    ("escaped metadata key", dict(text=[('"format"', '"\\u0066ormat"')])),
    ("escaped config key", dict(text=[('\\"vocab\\"', '\\"\\\\u0076ocab\\"')])),
    ("escaped pos", dict(text=[('\\"rope\\"', '\\"r\\\\u006fpe\\"')])),
    ("escaped step digits", dict(meta={"step": "\\u0033"}, text=[('\\\\u0033', '\\u0033')])),
    ("step with leading zeros", dict(meta={"step": "0000000000000000007"})),
    ("step max", dict(meta={"step": str(2**63 - 1)})),
    ("optim.t max", dict(meta={"optim.t": str(2**63 - 1)})),
    ("more metadata", dict(meta={"author": "\u00e9\U0001f600", "": ""})),
    ("seed 2**100", dict(config={"seed": 2**100})),
    ("seed of 4300 digits", dict(config={"seed": int("9" * 4300)})),
    ("seed -0", dict(text=[('\\"seed\\": 0', '\\"seed\\": -0')])),
    ("config keys in another order", dict(change=lambda h: h["__metadata__"].update(
        config=json.dumps(dict(reversed(json.loads(h["__metadata__"]["config"]).items())))))),
    ("extra floats", dict(meta={"extra": "[1e999, -1e-400, 0.5, -0.0, 1E+2, 2e-3]"})),
    ("extra big ints", dict(meta={"extra": json.dumps([2**64, -(10**4299), int("1" * 4300)])})),
    ("extra lone surrogate value", dict(meta={"extra": '["\\ud800", {"k": "\\udfff"}]'})),
    ("extra surrogate pair key", dict(meta={"extra": '{"\\ud83d\\ude00": 1}'})),
    ("extra nested to the limit", dict(meta={"extra": "[" * DEPTH + "]" * DEPTH})),
    ("extra not an object", dict(meta={"extra": " 7 "})),
    ("extra absent", dict(change=lambda h: h["__metadata__"].pop("extra") and None)),
    ("NaN and odd floats in the data", dict(body=special_floats)),
]


@pytest.mark.parametrize("name,kw", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_edge_cases_of_the_format_are_accepted_everywhere(tmp_path, name, kw):
    blob = accepted_edit(**kw)
    assert read_alike(write(str(tmp_path), name, blob), blob)[0] == "ok"


def nested(depth, kind):
    """A JSON text of depth containers, one inside the other: arrays or objects."""
    if kind == "arrays":
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize("kind", ["arrays", "objects"])
def test_json_nests_to_its_explicit_limit(tmp_path, kind):
    """JSON nested DEPTH - 1 and DEPTH containers deep is taken, DEPTH + 1 refused: as a
    checkpoint's extra (through Python, which reads the extra back, and the model API), as a
    header, and as a bare text. The limit is the reader's constant: the same verdicts with
    Python's recursion limit raised to 100 000."""
    limit = sys.getrecursionlimit()
    for depth, ok in [(DEPTH - 1, True), (DEPTH, True), (DEPTH + 1, False)]:
        text = nested(depth, kind)
        blob = accepted_edit(meta={"extra": text})
        path = write(str(tmp_path), f"extra{depth}", blob)
        deep = rf"extra is not valid JSON \(nested more than {DEPTH} levels deep"
        for recursion_limit in (limit, 100_000):
            sys.setrecursionlimit(recursion_limit)
            try:
                if ok:
                    assert read_alike(path, blob)[0] == "ok"
                    assert checkpoint.load(path)[2] == json.loads(text)
                else:
                    refused(path, blob, deep)
            finally:
                sys.setrecursionlimit(limit)
        assert (lib.pytfm_json_check(text.encode(), len(text)) == OK) == ok
        header = f'{{"x": {text}}}'
        # the header's own object is one level: DEPTH - 1 inside it is its limit
        verdict = read_alike(write(str(tmp_path), f"header{depth}", pack(header.encode())),
                             pack(header.encode()))
        assert verdict[0] == "rejected"
        assert ("nested more than" in verdict[1]) == (depth >= DEPTH), verdict[1]


# ---- hypothesis: mutations of real checkpoints, read alike everywhere ------------------------


@functools.cache
def seeds():
    """Real checkpoints to mutate (a function, not a fixture: hypothesis would print it)."""
    return (saved(), saved("sinusoidal", False, False, extra=(("a", (1, 2.5)),)),
            saved("none", True, True, n_layer=2), saved("learned", False, True))


JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.sampled_from([0, 1, -1, 2, 4, 8, 12, 16, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63),
                       10**30, "F32", "I64", "pytfm", "rope", "none", "sinusoidal",
                       "learned"])
    | st.integers(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=5)

TEXT_EDITS = [b'"', b"\\", b"\\u", b"\\ud800", b"\\ud83d\\ude00", b"\xff", b"\xc3", b"\xed\xa0\x80",
              b"\xf4\x90\x80\x80", b"NaN", b"-0", b"1e999", b"[", b"]", b"{", b"}", b",", b":",
              b" ", b"\x00", b"0", b"9" * 20]


def mutate(draw):
    blob = seeds()[draw(st.integers(0, len(seeds()) - 1))]
    kind = draw(st.sampled_from(["flip", "truncate", "splice", "text", "structure",
                                 "structure"]))
    if kind == "structure":
        return edit_structure(draw, blob, JSON)
    data = bytearray(blob)
    (n,) = struct.unpack("<Q", blob[:8])
    if kind == "flip":
        for pos in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=6)):
            data[pos] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif kind == "splice":
        a = draw(st.integers(0, len(data)))
        b = draw(st.integers(a, min(len(data), a + 32)))
        data[a:b] = draw(st.binary(max_size=12))
    else:  # a token inserted into the header, its length kept right
        at = draw(st.integers(8, 8 + n))
        piece = draw(st.sampled_from(TEXT_EDITS))
        drop = draw(st.integers(0, 2))
        data[at:at + drop] = piece
        data[:8] = struct.pack("<Q", n + len(piece) - min(drop, 8 + n - at))
    return bytes(data)


@needs_csrc
@settings(max_examples=8 * settings().max_examples)
@given(data=st.data())
def test_mutated_checkpoints_are_read_alike_everywhere(tmp_path_factory, data):
    """Refused with one message naming the file (never another exception, never a crash), or
    accepted with one config, through Python and the model API; and a header the JSON check
    passes is one json.loads reads."""
    path = str(tmp_path_factory.getbasetemp() / "mutated.safetensors")
    blob = mutate(data.draw)
    with open(path, "wb") as f:
        f.write(blob)
    read_alike(path, blob)
    if len(blob) >= 8:
        (n,) = struct.unpack("<Q", blob[:8])
        json_text_is_read_by_python(blob[8:8 + n])


# ---- a file that changes under the reader ---------------------------------------------------


def test_a_file_shrinking_while_it_is_read_is_an_error_not_a_crash(tmp_path):
    """Another thread cuts the file's tail off and writes it back, over and over, while C
    reads it: each open either reads it whole or fails naming the path (a short read of a
    tensor included), never crashes or reads past what it holds."""
    model, _ = small(vocab=256, d_model=128, n_layer=2, n_head=2, max_seq=8)
    path = str(tmp_path / "big.safetensors")
    checkpoint.save(path, model)
    with open(path, "rb") as f:
        blob = f.read()
    stop = threading.Event()

    def flip():
        fd = os.open(path, os.O_RDWR)
        try:
            for i in itertools.count():
                if stop.is_set():
                    break
                at = len(blob) // 2 + (i * 7919) % (len(blob) // 2)
                os.ftruncate(fd, at)
                os.pwrite(fd, blob[at:], at)
                time.sleep(0.0002)
        finally:
            os.close(fd)

    thread = threading.Thread(target=flip)
    thread.start()
    seen = set()
    try:
        for i in range(400):
            status, message, _ = c_open(path)
            assert status in (lib.PYTFM_STATUS_OK, INVALID), message
            if status == INVALID:
                assert message.startswith(f"{path}: "), message
                seen.add(re.sub(r"'[^']*'|\d+", "_", message[len(path) + 2:]))
            else:
                seen.add("ok")
            if i > 100 and len(seen) >= 3:
                break
    finally:
        stop.set()
        thread.join()
    assert "ok" in seen, seen


# ---- the fuzzer: libFuzzer on the reader's public API ----------------------------------------


def libfuzzer_clang():
    """A clang that links -fsanitize=fuzzer (Debian: clang-14 and libclang-rt-14-dev), or the
    reason there is none."""
    tried = []
    for cc in [os.environ.get("PYTFM_FUZZ_CC"), "clang", "clang-14", "clang-15", "clang-16",
               "clang-17", "clang-18"]:
        if not cc or not shutil.which(cc):
            continue
        with tempfile.TemporaryDirectory() as folder:
            src = os.path.join(folder, "t.c")
            with open(src, "w") as f:
                f.write("#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput("
                        "const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
            run = subprocess.run([cc, "-fsanitize=fuzzer,address,undefined", src, "-o",
                                  os.path.join(folder, "t")], capture_output=True, text=True)
        if run.returncode == 0:
            return cc, None
        tried.append(f"{cc}: {run.stderr.strip().splitlines()[-1] if run.stderr else '?'}")
    return None, "no clang links -fsanitize=fuzzer (" + ("; ".join(tried) or "none found") + ")"


FUZZ_FLAGS = ["-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all",
              "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas"]


def build_fuzz_target(tmp_path_factory, name):
    """tests/c_api/fuzz/<name>.c linked with the library's sources under libFuzzer, ASan and
    UBSan: the executable's path; a skip (a failure under CI) without a clang that can."""
    cc, why = libfuzzer_clang()
    if cc is None:
        message = (f"{why}: install clang with libFuzzer (Debian/Ubuntu: apt-get install clang-14 "
                   f"libclang-rt-14-dev)")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    exe = str(tmp_path_factory.mktemp("fuzz") / name)
    build = build_with_library(cc, FUZZ_FLAGS, os.path.join(FUZZ, f"{name}.c"), exe)
    assert build.returncode == 0, build.stderr
    return exe


def fuzz_for_a_while(exe, tmp_path, dictionary, seeds, env=None, what="libFuzzer"):
    """A bounded libFuzzer run of exe (PYTFM_FUZZ_SECONDS, default 10) from tests/c_api/fuzz's
    seeds folder with its dictionary, into tmp_path/corpus: asserts no crash, leak, OOM or
    time-out and more than 1000 inputs run; (the inputs it kept, sorted; its stderr)."""
    seconds = int(os.environ.get("PYTFM_FUZZ_SECONDS", "10"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    run = subprocess.run([exe, f"-max_total_time={seconds}", "-print_final_stats=1",
                          f"-dict={os.path.join(FUZZ, dictionary)}",
                          f"-artifact_prefix={tmp_path}/", "-rss_limit_mb=2048",
                          str(corpus), os.path.join(FUZZ, seeds)],
                         capture_output=True, text=True, timeout=seconds + 300,
                         env={**os.environ, **(env or {})})
    crashes = [f for f in os.listdir(tmp_path) if f.startswith(("crash-", "leak-", "oom-",
                                                                  "timeout-"))]
    assert run.returncode == 0 and not crashes, (crashes, run.stderr[-4000:])
    runs = re.search(r"stat::number_of_executed_units: (\d+)", run.stderr)
    assert runs and int(runs.group(1)) > 1000, run.stderr[-2000:]
    print(f"{what}: {runs.group(1)} inputs in {seconds} s")
    return sorted(corpus.iterdir()), run.stderr


@pytest.fixture(scope="session")
def fuzzer(tmp_path_factory):
    return build_fuzz_target(tmp_path_factory, "fuzz_checkpoint")


@needs_csrc
def test_fuzz_regressions_pass_the_fuzz_target(fuzzer):
    """The fuzz target run once on each saved regression and seed (its own checks included)."""
    files = [os.path.join(d, f) for d in (REGRESSIONS, os.path.join(FUZZ, "seeds"))
             for f in sorted(os.listdir(d))]
    run = subprocess.run([fuzzer, *files], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stderr.count("Executed ") == len(files), run.stderr[-2000:]


@needs_csrc
def test_fuzzing_for_a_while_finds_nothing(fuzzer, tmp_path):
    """A bounded libFuzzer run from the seeds (PYTFM_FUZZ_SECONDS, default 10): no crash, no
    leak, no trap of the target's checks; then every input it kept (those that reached new
    code) read alike through Python and the model API, as it is and wrapped as a header, and
    every kept JSON text the check passes read by json.loads."""
    kept, stderr = fuzz_for_a_while(fuzzer, tmp_path, "checkpoint.dict", "seeds")
    assert "Done " in stderr, stderr[-2000:]
    assert kept
    wrapped = str(tmp_path / "wrapped.safetensors")
    for path in kept:
        raw = path.read_bytes()
        read_alike(str(path), raw)
        json_text_is_read_by_python(raw)
        read_as_header(raw, wrapped)


def read_as_header(raw, path):
    """read_alike on as_header(raw), written to path, when raw is a JSON object."""
    blob = as_header(raw)
    if blob is not None:
        with open(path, "wb") as f:
            f.write(blob)
        read_alike(path, blob)


def as_header(raw):
    """What tests/c_api/fuzz/fuzz_checkpoint.c also reads when its input is a JSON object: a
    checkpoint with raw as its header, the right length field and as many zero bytes of data
    as the largest data_offsets end (up to 1 MiB) says. None for input that is not a JSON
    object (by the reader's check)."""
    if not json_text_is_read_by_python(raw):
        return None
    header = json.loads(raw.decode("utf-8"))
    if not isinstance(header, dict):
        return None
    body = 0
    for info in header.values():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        items = list(offsets.values()) if isinstance(offsets, dict) else offsets
        if isinstance(items, list) and len(items) >= 2:
            end = items[1]
            if type(end) is int and 0 <= end <= 2**20:
                body = max(body, end)
    return struct.pack("<Q", len(raw)) + raw + bytes(body)
