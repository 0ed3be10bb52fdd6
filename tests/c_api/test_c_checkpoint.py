"""The checkpoint reader in C (csrc/model/safetensors.c, csrc/model/json.c) against
pytfm.checkpoint.

The goal is agreement: every file pytfm.checkpoint.load rejects, C rejects
(PYTFM_STATUS_INVALID_ARGUMENT, a message naming the file and what is wrong, no crash), and every
file it accepts, C accepts with the same config and bit-identical parameters. Here: a hostile
set (each case rejected by both, with C's message checked), a file cut at every byte, edge
cases Python accepts (C must too), hypothesis mutations of real checkpoints compared verdict by
verdict, the happy path in every position mode, tied and untied, with and without AdamW state;
tests/c_api/open_checkpoints.c runs the hostile set and tests/c_api/fuzz/regressions/ under ASan and
UBSan, and the libFuzzer target runs for a bounded time (tests/c_api/fuzz/README.md).

The parameters C read are compared through that driver (its --serve mode prints them): the
public API does not hand them out.
"""

import ast
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
from checkpoint_edits import edit_structure, pack, unpack
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import CSRC, TESTS, library_sources
from pytfm import checkpoint
from pytfm._core import ffi, lib
from pytfm.checkpoint import CheckpointError
from pytfm.nn import GPT, GPTConfig, param_shapes
from pytfm.optim import AdamW

FUZZ = os.path.join(TESTS, "c_api", "fuzz")
REGRESSIONS = os.path.join(FUZZ, "regressions")
INVALID = lib.PYTFM_STATUS_INVALID_ARGUMENT
DEPTH = checkpoint.MAX_JSON_DEPTH  # csrc/model/json.h PYTFM__JSON_MAX_DEPTH
POS = {"rope": 0, "sinusoidal": 1, "none": 2}
needs_csrc = pytest.mark.skipif(not os.path.isdir(CSRC), reason="needs the source checkout")


# ---- checkpoints to start from --------------------------------------------------------------


def small(pos="rope", tie=True, seed=0, **kw):
    """A GPT with random (not initial) weights, and its AdamW after one step."""
    cfg = dict(vocab=8, d_model=4, n_layer=1, n_head=2, max_seq=4, pos=pos, tie_embeddings=tie,
               seed=seed)
    cfg.update(kw)
    model = GPT(GPTConfig(**cfg))
    rng = np.random.default_rng(seed + 1)
    for p in model.params.values():
        p[...] = rng.standard_normal(p.shape)
    opt = AdamW(model.params, model.grads)
    for g in model.grads.values():
        g[...] = rng.standard_normal(g.shape)
    opt.step()
    return model, opt


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


# ---- the three readers ----------------------------------------------------------------------


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
    message = ffi.string(lib.pytfm_last_error()).decode("utf-8", "replace")
    if status != lib.PYTFM_STATUS_OK:
        assert model[0] == ffi.NULL
        return status, message, None
    config = ffi.new("pytfm_model_config *")
    assert lib.pytfm_model_get_config(model[0], config) == lib.PYTFM_STATUS_OK
    assert lib.pytfm_model_close(model[0]) == lib.PYTFM_STATUS_OK
    names = ["vocab", "d_model", "n_layer", "n_head", "max_seq", "pos", "tie_embeddings",
             "n_params", "step"]
    return status, message, {k: getattr(config, k) for k in names}


def py_verdict(path):
    """Python's load: ("ok", config as the C struct has it, parameters' bytes) or ("rejected",
    message). Anything but CheckpointError propagates: that would be Python's bug."""
    try:
        model, step, _ = checkpoint.load(path)
    except CheckpointError as e:
        return "rejected", str(e)
    cfg = model.cfg
    config = dict(vocab=cfg.vocab, d_model=cfg.d_model, n_layer=cfg.n_layer, n_head=cfg.n_head,
                  max_seq=cfg.max_seq, pos=POS[cfg.pos], tie_embeddings=int(cfg.tie_embeddings),
                  n_params=model.num_params(), step=step)
    params = b"".join(model.params[name].tobytes() for name, _ in param_shapes(cfg))
    return "ok", config, params


# ---- the ASan driver, tests/c_api/open_checkpoints.c --------------------------------------------

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
    build = subprocess.run([cc, *flags, f"-I{CSRC}/include", f"-I{CSRC}",
                            os.path.join(TESTS, "c_api", "open_checkpoints.c"),
                            *library_sources(), "-lm", "-o", exe], capture_output=True, text=True)
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


class Server:
    """The driver in --serve mode: one process answers every path sent to it, and is checked
    for leaks and ASan reports when it exits (at the end of the test session)."""

    def __init__(self, exe):
        self.proc = subprocess.Popen([exe, "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, **ASAN_ENV))
        self.lock = threading.Lock()

    def verdict(self, path):
        """-> (json verdict, ("ok", config, params) or ("rejected", status, message))"""
        with self.lock:
            self.proc.stdin.write(path + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        assert line, f"the driver died on {path}: {self.proc.stderr.read()[-4000:]}"
        json_verdict, verdict, rest = line.rstrip("\n").split(" ", 2)
        if verdict == "rejected":
            status, message = rest.split(" ", 1)
            return json_verdict, ("rejected", int(status), message)
        fields = rest.split(" ")
        names = ["vocab", "d_model", "n_layer", "n_head", "max_seq", "pos", "tie_embeddings",
                 "n_params", "step"]
        config = dict(zip(names, map(int, fields[:9])))
        return json_verdict, ("ok", config, bytes.fromhex(fields[9]))

    def close(self):
        self.proc.stdin.close()
        err = self.proc.stderr.read()
        assert self.proc.wait(timeout=120) == 0, err[-4000:]


@pytest.fixture(scope="session")
def server():
    """The driver as a server: under ASan where it links, else a plain build."""
    exe = driver(True) or driver(False)
    s = Server(exe)
    yield s
    s.close()


def agree(server, path):
    """C (both readers, both API entry points) and Python agree on path: the same verdict and,
    on acceptance, the same config and parameters, bit for bit. -> Python's verdict."""
    py = py_verdict(path)
    _, c = server.verdict(path)
    assert c[0] == py[0], (path, c, py[1] if py[0] == "rejected" else "accepted")
    if py[0] == "ok":
        assert c[1] == py[1]
        assert c[2] == py[2], "the parameters differ"
    else:
        assert c[1] == INVALID and c[2].startswith(f"{path}: "), c
    return py


# ---- hostile files: each rejected by both, C naming the file and the fault -----------------


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
def test_hostile_file_is_rejected_by_c_and_python(tmp_path, name, make, match):
    blob = make()
    path = write(str(tmp_path), name, blob)
    status, message, _ = c_open(path)
    assert status == INVALID, message
    assert message.startswith(f"{path}: "), message
    assert re.search(match, message), message
    status, message, _ = c_open_memory(blob)
    assert status == INVALID, message
    assert message.startswith("<memory>: ") and re.search(match, message), message
    with pytest.raises(CheckpointError):
        checkpoint.load(path)


@pytest.mark.parametrize("name", ["unknown keys", "unknown keys by code point",
                                  "unknown keys past the BMP"])
def test_both_readers_name_the_same_of_two_unknown_keys(tmp_path, name):
    """C shows the key as JSON, Python as a repr: read back, they are the same str."""
    make = next(make for case, make, _ in HOSTILE if case == name)
    path = write(str(tmp_path), name, make())
    _, message, _ = c_open(path)
    c_key = json.loads(re.search(r"unknown key (.*)$", message).group(1))
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load(path)
    py_key = ast.literal_eval(re.search(r"unknown key (.*)$", str(raised.value)).group(1))
    assert c_key == py_key, (message, str(raised.value))


@needs_csrc
def test_hostile_files_run_clean_under_asan_and_ubsan(tmp_path):
    """Every hostile file, and every file of tests/c_api/fuzz/regressions/, through the file and
    memory readers and both API entry points, under ASan (leaks included) and UBSan."""
    paths = [write(str(tmp_path), name, make()) for name, make, _ in HOSTILE]
    paths += sorted(os.path.join(REGRESSIONS, f) for f in os.listdir(REGRESSIONS))
    out = run_driver(paths).stdout
    total = len(HOSTILE) + len(os.listdir(REGRESSIONS))
    assert f"{total} files: " in out and "every way agreed" in out, out[-2000:]
    assert out.count("rejected: ") >= len(HOSTILE), out[-2000:]


@needs_csrc
def test_fuzz_regressions_agree_with_python(server):
    """Each input the fuzzer ever flagged: C and Python give the same verdict, as a checkpoint
    and as a bare JSON text (the fuzz target checks both)."""
    names = sorted(os.listdir(REGRESSIONS))
    assert names, "tests/c_api/fuzz/regressions/ is empty"
    for name in names:
        path = os.path.join(REGRESSIONS, name)
        agree(server, path)
        json_verdict, _ = server.verdict(path)
        with open(path, "rb") as f:
            raw = f.read()
        try:
            checkpoint._parse_json(raw.decode("utf-8"))
            py_json = "json-ok"
        except (ValueError, UnicodeDecodeError):
            py_json = "json-bad"
        assert json_verdict == py_json, name


def test_a_huge_header_length_within_the_file_is_refused_by_its_limit(tmp_path):
    """A file over MAX_HEADER bytes (sparse: nothing is written) whose header length is past
    the limit: refused before anything is read."""
    path = str(tmp_path / "huge.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", checkpoint.MAX_HEADER + 1))
    os.truncate(path, checkpoint.MAX_HEADER + 100)
    status, message, _ = c_open(path)
    assert status == INVALID and message == (
        f"{path}: header of 100000001 bytes is over the 100000000-byte limit"), message
    with pytest.raises(CheckpointError, match="over the 100000000-byte limit"):
        checkpoint.load(path)


@pytest.mark.parametrize("kind", ["bare members", "empty tensors"])
def test_a_header_of_many_members_is_refused_fast(tmp_path, kind):
    """A header of 200 000 members that are not entries (refused at the first, before any list
    of them is made), or of 200 000 valid empty tensors (each checked, sorted, looked up)."""
    meta = json.dumps(base()[0]["__metadata__"])
    if kind == "bare members":
        members = ", ".join(f'"k{i}": {i}' for i in range(200_000))
        match = r"tensor 'k0': its entry is a JSON number, not an object"
    else:
        members = ", ".join(f'"k{i}": {{"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'
                            for i in range(200_000))
        match = r"tensor transformer.wte.weight is missing"
    path = write(str(tmp_path), kind, pack(f'{{"__metadata__": {meta}, {members}}}'.encode()))
    start = time.perf_counter()
    status, message, _ = c_open(path)
    elapsed = time.perf_counter() - start
    assert status == INVALID and re.search(match, message), message
    assert elapsed < 2, elapsed  # a million empty tensors: C 0.8 s here, Python 12 s
    with pytest.raises(CheckpointError):
        checkpoint.load(path)


def test_what_cannot_be_opened_is_an_error_naming_the_path(tmp_path):
    for path, why in [(str(tmp_path / "missing"), "No such file"), (str(tmp_path), "not a "
                                                                   "regular file")]:
        status, message, _ = c_open(path)
        assert status == INVALID and message.startswith(f"{path}: ") and why in message, message


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
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(pytfm.__file__)))
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


def test_every_truncation_of_a_small_file_is_rejected(tmp_path):
    blob = saved(adamw=False, extra=())
    path = str(tmp_path / "cut.safetensors")
    for n in range(len(blob)):
        with open(path, "wb") as f:
            f.write(blob[:n])
        status, message, _ = c_open(path)
        assert status == INVALID and message.startswith(f"{path}: "), (n, message)
        status, message, _ = c_open_memory(blob[:n])
        assert status == INVALID and message.startswith("<memory>: "), (n, message)
        with pytest.raises(CheckpointError):
            checkpoint.load(path)
    assert c_open_memory(blob)[0] == lib.PYTFM_STATUS_OK


@needs_csrc
def test_every_truncation_runs_clean_under_asan(tmp_path):
    blob = saved(adamw=False, extra=())
    paths = []
    for n in range(0, len(blob), 7):
        paths.append(write(str(tmp_path), f"cut{n}", blob[:n]))
    out = run_driver(paths).stdout
    assert f"{len(paths)} files: 0 accepted" in out, out[-1000:]


# ---- what Python accepts, C accepts: the same config and parameters --------------------------


@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "none"])
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("adamw", [False, True])
def test_happy_path_same_config_and_parameters(tmp_path, server, pos, tie, adamw):
    blob = saved(pos, tie, adamw, n_layer=2, step=12345)
    path = write(str(tmp_path), "m", blob)
    verdict, config, _ = agree(server, path)
    assert verdict == "ok" and config["step"] == 12345 and config["n_layer"] == 2
    for status, message, got in (c_open(path), c_open_memory(blob)):
        assert status == lib.PYTFM_STATUS_OK, message
        assert got == config


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
def test_what_python_accepts_c_accepts_identically(tmp_path, server, name, kw):
    path = write(str(tmp_path), name, accepted_edit(**kw))
    assert agree(server, path)[0] == "ok"


def nested(depth, kind):
    """A JSON text of depth containers, one inside the other: arrays or objects."""
    if kind == "arrays":
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


def py_json_verdict(path):
    """Python's verdict on the whole file as one JSON text, in the words of the driver."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        checkpoint._parse_json(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        return "json-bad"
    return "json-ok"


NESTED_SCRIPT = """
import sys
from pytfm import checkpoint
sep = sys.argv.index("--")
for limit in (sys.getrecursionlimit(), 100_000):
    sys.setrecursionlimit(limit)
    for path in sys.argv[1:sep]:
        try:
            checkpoint.load(path)
            print("ok")
        except checkpoint.CheckpointError:
            print("rejected")
    for path in sys.argv[sep + 1:]:
        try:
            checkpoint._parse_json(open(path, encoding="utf-8").read())
            print("json-ok")
        except ValueError:
            print("json-bad")
"""


@pytest.mark.parametrize("kind", ["arrays", "objects"])
def test_c_and_python_nest_to_the_same_explicit_limit(tmp_path, server, kind):
    """JSON nested DEPTH - 1 and DEPTH containers deep is taken by both readers, DEPTH + 1
    refused by both: as a checkpoint's extra, and as a bare text (json.c's check against
    _parse_json). Python's limit is its own constant, not the interpreter's recursion limit:
    the same verdicts from this test (a deep stack), from a script (a shallow one), and in each
    with the recursion limit raised to 100 000 (under which json.loads alone would take
    thousands of levels)."""
    band = [(DEPTH - 1, "ok"), (DEPTH, "ok"), (DEPTH + 1, "rejected")]
    files, bare = [], []
    for depth, _ in band:
        text = nested(depth, kind)
        files.append(write(str(tmp_path), f"extra{depth}", accepted_edit(meta={"extra": text})))
        bare.append(write(str(tmp_path), f"bare{depth}", text.encode()))
    verdicts = [verdict for _, verdict in band]
    json_verdicts = ["json-" + ("ok" if v == "ok" else "bad") for v in verdicts]
    for path, verdict in zip(files, verdicts):
        assert agree(server, path)[0] == verdict, path
    assert [server.verdict(path)[0] for path in bare] == json_verdicts
    limit = sys.getrecursionlimit()
    for recursion_limit in (limit, 100_000):
        sys.setrecursionlimit(recursion_limit)
        try:
            assert [py_verdict(path)[0] for path in files] == verdicts, recursion_limit
            assert [py_json_verdict(path) for path in bare] == json_verdicts, recursion_limit
        finally:
            sys.setrecursionlimit(limit)
    import pytfm

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(pytfm.__file__)))
    run = subprocess.run([sys.executable, "-c", NESTED_SCRIPT, *files, "--", *bare],
                         capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == (verdicts + json_verdicts) * 2


# ---- hypothesis: mutations of real checkpoints, verdict by verdict ---------------------------


@functools.cache
def seeds():
    """Real checkpoints to mutate (a function, not a fixture: hypothesis would print it)."""
    return (saved(), saved("sinusoidal", False, False, extra=(("a", (1, 2.5)),)),
            saved("none", True, True, n_layer=2))


JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.sampled_from([0, 1, -1, 2, 4, 8, 12, 16, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63),
                       10**30, "F32", "I64", "pytfm", "rope", "none", "sinusoidal"])
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
def test_c_and_python_agree_on_mutated_checkpoints(tmp_path_factory, server, data):
    path = str(tmp_path_factory.getbasetemp() / "mutated.safetensors")
    with open(path, "wb") as f:
        f.write(mutate(data.draw))
    agree(server, path)


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


# ---- the fuzzer: libFuzzer on pytfm__weights_read_memory -----------------------------------


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


@pytest.fixture(scope="session")
def fuzzer(tmp_path_factory):
    cc, why = libfuzzer_clang()
    if cc is None:
        message = (f"{why}: install clang with libFuzzer (Debian/Ubuntu: apt-get install clang-14 "
                   f"libclang-rt-14-dev)")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    exe = str(tmp_path_factory.mktemp("fuzz") / "fuzz_checkpoint")
    build = subprocess.run([cc, "-g", "-O1", "-fsanitize=fuzzer,address,undefined",
                            "-fno-sanitize-recover=all", "-std=c11", "-Wall", "-Wextra", "-Werror",
                            "-Wno-unknown-pragmas", f"-I{CSRC}/include", f"-I{CSRC}",
                            os.path.join(FUZZ, "fuzz_checkpoint.c"), *library_sources(), "-lm",
                            "-o", exe], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return exe


@needs_csrc
def test_fuzz_regressions_pass_the_fuzz_target(fuzzer):
    """The fuzz target run once on each saved regression and seed (its own checks included)."""
    files = [os.path.join(d, f) for d in (REGRESSIONS, os.path.join(FUZZ, "seeds"))
             for f in sorted(os.listdir(d))]
    run = subprocess.run([fuzzer, *files], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stderr.count("Executed ") == len(files), run.stderr[-2000:]


@needs_csrc
def test_fuzzing_for_a_while_finds_nothing(fuzzer, server, tmp_path):
    """A bounded libFuzzer run from the seeds (PYTFM_FUZZ_SECONDS, default 30): no crash, no
    leak, no trap of the target's checks; then every input it kept (those that reached new
    code) read by C and Python, which must agree on each."""
    seconds = int(os.environ.get("PYTFM_FUZZ_SECONDS", "30"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    run = subprocess.run([fuzzer, f"-max_total_time={seconds}", "-print_final_stats=1",
                          f"-dict={os.path.join(FUZZ, 'checkpoint.dict')}",
                          f"-artifact_prefix={tmp_path}/", "-rss_limit_mb=2048",
                          str(corpus), os.path.join(FUZZ, "seeds")],
                         capture_output=True, text=True, timeout=seconds + 300)
    crashes = [f for f in os.listdir(tmp_path) if f.startswith(("crash-", "leak-", "oom-",
                                                                  "timeout-"))]
    assert run.returncode == 0 and not crashes, (crashes, run.stderr[-4000:])
    runs = re.search(r"stat::number_of_executed_units: (\d+)", run.stderr)
    assert runs and int(runs.group(1)) > 1000, run.stderr[-2000:]
    assert "Done " in run.stderr, run.stderr[-2000:]
    kept = sorted(corpus.iterdir())
    assert kept
    wrapped = str(tmp_path / "wrapped.safetensors")
    for path in kept:
        agree(server, str(path))
        blob = as_header(path.read_bytes())
        if blob is not None:
            with open(wrapped, "wb") as f:
                f.write(blob)
            agree(server, wrapped)


def as_header(raw):
    """What tests/c_api/fuzz/fuzz_checkpoint.c also reads when its input is a JSON object: a
    checkpoint with raw as its header, the right length field and as many zero bytes of data
    as the largest data_offsets end (up to 1 MiB) says. None for input that is not a JSON
    object."""
    try:
        header = checkpoint._parse_json(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
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
