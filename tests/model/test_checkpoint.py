"""Checkpoints: a round trip is bitwise; the reader trusts no byte of a file (each malformed
class below must give a CheckpointError naming the file and the field, fast, and never any other
exception); a load into a model is all-or-nothing; a save is atomic, and the next save removes
what a killed one left, never what a running one holds. A hypothesis test mutates real
checkpoints; dev/fuzz_checkpoint.py does the same for as long as it is given."""

import functools
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_edits import edit_structure, pack, unpack
from checkpoint_edits import small_model as small
from pytfm import _atomic, checkpoint
from pytfm.checkpoint import CheckpointError
from pytfm.nn import GPT, GPTConfig, config_dict, param_shapes
from pytfm.optim import AdamW


@pytest.fixture
def saved(tmp_path):
    """A real checkpoint with optimizer state: (path, header, data) to start mutations from."""
    model, opt = small()
    path = str(tmp_path / "m.safetensors")
    checkpoint.save(path, model, step=3, optimizer=opt, extra={"note": "hi"})
    header, body = unpack(open(path, "rb").read())
    return path, header, body


def rejected(path, blob, match, loaders=(checkpoint.load, checkpoint.load_file)):
    """blob, written to path (None: path as it is), must be refused by each loader with a
    CheckpointError that names the file and matches."""
    if blob is not None:
        with open(path, "wb") as f:
            f.write(blob)
    for load in loaders:
        with pytest.raises(CheckpointError, match=match) as e:
            load(path)
        assert str(e.value).startswith(f"{path}: "), e.value


# ---- round trip -----------------------------------------------------------------------------


def test_checkpoint_round_trip_is_bitwise(tmp_path):
    model, opt = small("sinusoidal", tie=False)
    path = str(tmp_path / "m.safetensors")
    checkpoint.save(path, model, step=7, optimizer=opt, extra={"note": "hi"})
    model2, step, extra = checkpoint.load(path)
    assert step == 7 and extra == {"note": "hi"} and model2.cfg == model.cfg
    for name, p in model.params.items():
        assert p.tobytes() == model2.params[name].tobytes(), name
    opt2 = AdamW(model2.params, model2.grads)
    checkpoint.load(path, model2, opt2)
    assert opt2.t == 1
    for name in model.params:
        assert opt2.m[name].tobytes() == opt.m[name].tobytes()
        assert opt2.v[name].tobytes() == opt.v[name].tobytes()
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []  # no leftovers
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~current_umask()  # an ordinary file


def current_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_save_file_and_load_file_round_trip_any_layout(tmp_path):
    """Empty and 0-d arrays, int64, no tensors at all: what the format allows, load_file
    reads back, in the order written."""
    path = str(tmp_path / "t.safetensors")
    tensors = {"z": np.zeros((0, 3), np.float32), "s": np.array(2.5, np.float32),
               "i": np.arange(6, dtype=np.int64).reshape(2, 3), "e": np.zeros(0, np.int64)}
    checkpoint.save_file(path, tensors, {"k": "v"})
    got, meta = checkpoint.load_file(path)
    assert meta == {"k": "v"} and list(got) == list(tensors)
    for name, a in tensors.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape
        assert got[name].tobytes() == a.tobytes()
    checkpoint.save_file(path, {}, {})
    assert checkpoint.load_file(path) == ({}, {})


# ---- the safetensors layer: each malformed class --------------------------------------------


def first(header):
    return next(k for k in header if k != "__metadata__")


def last(header):
    return max((k for k in header if k != "__metadata__"),
               key=lambda k: header[k]["data_offsets"][1])


def entry(header, **change):
    """header with its first tensor's entry changed."""
    header[first(header)].update(change)
    return header


def offsets(header, name):
    return header[name]["data_offsets"]


STRUCTURE = {  # name: (mutation of (header, data) -> file bytes, what the error says)
    "header an array": (lambda h, b: pack([h], b), "is a JSON array, not an object"),
    "header a string": (lambda h, b: pack("x", b), "is a JSON string, not an object"),
    "entry a number": (lambda h, b: pack({**h, first(h): 5}, b), "entry is a JSON number"),
    "entry an array": (lambda h, b: pack({**h, first(h): [1]}, b), "entry is a JSON array"),
    "entry without shape": (lambda h, b: pack({**h, first(h): {
        k: v for k, v in h[first(h)].items() if k != "shape"}}, b), "has no shape"),
    "entry with an unknown key": (lambda h, b: pack(entry(h, offsets=[0, 1]), b),
                                  'unknown key "offsets"'),
    "dtype unsupported": (lambda h, b: pack(entry(h, dtype="F16"), b), 'unsupported dtype "F16"'),
    "dtype not a string": (lambda h, b: pack(entry(h, dtype=["F32"]), b), "unsupported dtype"),
    "dtype null": (lambda h, b: pack(entry(h, dtype=None), b), "unsupported dtype null"),
    "shape a string": (lambda h, b: pack(entry(h, shape="8,4"), b), "not a list of non-negative"),
    "shape negative": (lambda h, b: pack(entry(h, shape=[-8, -4]), b), "non-negative ints"),
    "shape of bools": (lambda h, b: pack(entry(h, shape=[True, 32]), b), r"\[true, 32\] is not"),
    "shape of floats": (lambda h, b: pack(entry(h, shape=[8.0, 4]), b), "non-negative ints"),
    "shape of 33 dims": (lambda h, b: pack(entry(h, shape=[1] * 33), b), "33 dimensions"),
    "shape wrong size": (lambda h, b: pack(entry(h, shape=[8, 3]), b),
                         r"F32\[8, 3\] is 96 bytes, but its data_offsets \[0, 128\] hold 128"),
    "shape too large for NumPy": (lambda h, b: pack(entry(h, shape=[0, 2**62, 2**62]), b),
                                  "too large for NumPy"),
    "offsets of bools": (lambda h, b: pack(entry(h, data_offsets=[False, 128]), b),
                         "not a pair of ints"),
    "offsets of floats": (lambda h, b: pack(entry(h, data_offsets=[0.0, 128.0]), b),
                          "not a pair of ints"),
    "offsets a triple": (lambda h, b: pack(entry(h, data_offsets=[0, 64, 128]), b),
                         "not a pair of ints"),
    "offsets null": (lambda h, b: pack(entry(h, data_offsets=None), b), "not a pair of ints"),
    "offsets negative": (lambda h, b: pack(entry(h, data_offsets=[-128, 0]), b),
                         r"\[-128, 0\] are negative or reversed"),
    "offsets reversed": (lambda h, b: pack(entry(h, data_offsets=[128, 0]), b),
                         r"\[128, 0\] are negative or reversed"),
    "offsets huge": (lambda h, b: pack(entry(h, data_offsets=[0, 2**64 + 128]), b),
                     "run past the end of the data"),
    "data truncated": (lambda h, b: pack(h, b[:-4]), "run past the end of the data .*truncated"),
    "data with trailing bytes": (lambda h, b: pack(h, b + bytes(8)),
                                 "the last 8 of the .* data bytes belong to no tensor"),
}


@pytest.mark.parametrize("case", STRUCTURE)
def test_malformed_entries_are_refused(saved, case):
    path, header, body = saved
    mutate, match = STRUCTURE[case]
    rejected(path, mutate(header, body), match)


def two(a, b, body_len):
    """A header of two float32 tensors x (1 value) and y at the given offsets."""
    return {"x": {"dtype": "F32", "shape": [1], "data_offsets": a},
            "y": {"dtype": "F32", "shape": [1], "data_offsets": b}}, bytes(body_len)


@pytest.mark.parametrize("a, b, n, match", [
    ([0, 4], [0, 4], 4, r"tensor 'y' \(data_offsets \[0, 4\]\) overlaps tensor 'x'"),  # duplicate
    ([0, 4], [2, 6], 6, "overlaps tensor 'x', which ends at 4"),
    ([0, 4], [8, 12], 12, "leaves a gap of 4 bytes after tensor 'x'"),
    ([4, 8], [8, 12], 12, "leaves a gap of 4 bytes after the start of the data"),
    ([0, 4], [4, 8], 12, "the last 4 of the 12 data bytes belong to no tensor"),
    ([4, 8], [0, 4], 8, None),  # out of header order is fine: the data is tiled
])
def test_data_offsets_must_tile_the_data(tmp_path, a, b, n, match):
    path = str(tmp_path / "t.safetensors")
    header, body = two(a, b, n)
    if match is None:
        open(path, "wb").write(pack(header, body))
        assert list(checkpoint.load_file(path)[0]) == ["x", "y"]
    else:
        rejected(path, pack(header, body), match, loaders=(checkpoint.load_file,))


def test_a_tensor_named_metadata_is_refused_both_ways(saved, tmp_path):
    path, header, body = saved
    header["__metadata__"] = header.pop(first(header))  # the first tensor's entry, renamed
    rejected(path, pack(header, body), r'__metadata__\["shape"\] is \[8, 4\], not a string')
    with pytest.raises(ValueError, match="cannot store a tensor named '__metadata__'"):
        checkpoint.save_file(str(tmp_path / "x"), {"__metadata__": np.zeros(1, np.float32)}, {})


@pytest.mark.parametrize("meta, match", [
    ([], "__metadata__ is a JSON array, not an object of strings"),
    (None, "__metadata__ is a JSON null"),
    ({"step": 3}, r'__metadata__\["step"\] is 3, not a string'),
    ({"step": ["3"]}, r'__metadata__\["step"\] is \["3"\], not a string'),
])
def test_metadata_must_map_strings_to_strings(saved, meta, match):
    path, header, body = saved
    header["__metadata__"] = meta
    rejected(path, pack(header, body), match)


def raw_header(header):
    return json.dumps(header).encode()


@pytest.mark.parametrize("case, edit, match", [
    ("duplicate tensor", lambda t: t.replace(b'"transformer.wte.weight": {',
                                             b'"transformer.wte.weight": 1, '
                                             b'"transformer.wte.weight": {', 1),
     'duplicate key "transformer.wte.weight"'),
    ("duplicate field", lambda t: t.replace(b'"dtype": "F32"', b'"dtype": "F32", "dtype": "F32"',
                                            1), 'duplicate key "dtype"'),
    ("deep nesting", lambda t: b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "nested more than 64 levels deep"),
    ("deep objects", lambda t: b'{"x": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001,
     "nested more than 64 levels deep"),
    ("not UTF-8", lambda t: t.replace(b"transformer", b"transf\xffrmer", 1),
     r"the header is not UTF-8 \(byte \d+: invalid start byte\)"),
    ("UTF-16", lambda t: t.decode().encode("utf-16"), "the header is not UTF-8"),
    ("lone surrogate", lambda t: t.replace(b"transformer", b"\\ud800", 1),
     r'key "\\ud800.wte.weight" holds a lone surrogate \(not valid Unicode\)'),
    ("NaN", lambda t: t.replace(b'"shape": [', b'"shape": [NaN, ', 1), "NaN is not JSON"),
    ("Infinity", lambda t: t.replace(b'"shape": [', b'"shape": [-Infinity, ', 1),
     "-Infinity is not JSON"),
    ("trailing text", lambda t: t + b" x", "the header is not valid JSON"),
    ("empty", lambda t: b"", "the header is not valid JSON"),
    ("integer of 5000 digits", lambda t: t.replace(b'"shape": [', b'"shape": [' + b"9" * 5000 +
                                                   b", ", 1), "the header is not valid JSON"),
])
def test_header_json_must_be_strict(saved, case, edit, match):
    path, header, body = saved
    rejected(path, pack(edit(raw_header(header)), body), match)


def test_header_length_must_fit_the_file_and_the_limit(saved):
    path, header, body = saved
    head = raw_header(header)
    rejected(path, pack(head, body, length=2**64 - 1), "header of 18446744073709551615 bytes runs "
             r"past the end of the file \(\d+ bytes\): truncated\?")
    rejected(path, pack(head, b"", length=len(head) + 1), "runs past the end")
    rejected(path, pack(head, body)[:7], "7 bytes is too short")
    rejected(path, b"", "0 bytes is too short")
    # a file larger than the limit (sparse: nothing is written) whose header length is past it
    limit = checkpoint.MAX_HEADER
    assert limit == 100_000_000
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", limit + 1) + b"{")
    os.truncate(path, limit + 100)
    rejected(path, None, f"header of {limit + 1} bytes is over the {limit}-byte limit$")


@pytest.mark.parametrize("blob", [
    b"# pytfm\n\nA small transformer library: hand-written C kernels ...\n",  # README.md
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    b"PK\x03\x04\x14\x00\x00\x00\x08\x00",  # a zip, as torch.save writes
    b"\x80\x04\x95\x1a\x00\x00\x00\x00\x00\x00\x00}",  # a pickle
], ids=["text", "png", "zip", "pickle"])
def test_a_file_of_another_kind_is_not_a_safetensors_file(tmp_path, blob):
    """Its first 8 bytes, read as a header length, run far past its end, and no JSON object
    follows them: not a cut checkpoint, a file of another kind."""
    rejected(str(tmp_path / "README.md"), blob, r"not a safetensors file \(it does not start "
             r"with a header length and a JSON object\)$")


def test_a_safetensors_file_is_read_tensor_by_tensor(tmp_path):
    """SafetensorsFile: the header's table (any names: escapes, NUL, non-ASCII), metadata,
    and each tensor read on its own, as stored."""
    path = str(tmp_path / "t.safetensors")
    tensors = {"b\x00c": np.arange(3, dtype=np.int64), "é": np.ones((2, 0), np.float32),
               "a": np.array([[1.5, -2]], np.float32)}
    checkpoint.save_file(path, tensors, {"k": "v\x00w", "ü": ""})
    with checkpoint.SafetensorsFile(path) as f:  # by the reader's index of names
        for name in reversed(list(tensors)):
            assert f.read(name).tobytes() == tensors[name].tobytes()
        with pytest.raises(KeyError):
            f.read("nope")
    with checkpoint.SafetensorsFile(path) as f:  # by the table
        assert f.metadata == {"k": "v\x00w", "ü": ""}
        assert f.tensors == {name: (a.dtype, a.shape) for name, a in tensors.items()}
        for name in reversed(list(tensors)):
            assert f.read(name).tobytes() == tensors[name].tobytes()
        with pytest.raises(KeyError):
            f.read("nope")
    with pytest.raises(FileNotFoundError):  # what cannot be opened: os.open's OSError
        checkpoint.SafetensorsFile(str(tmp_path / "missing"))
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(tmp_path))}: not a regular file"):
        checkpoint.load_file(str(tmp_path))


# ---- the pytfm layer ------------------------------------------------------------------------


def with_meta(header, **change):
    header["__metadata__"].update(change)
    return header


def with_config(header, **change):
    config = json.loads(header["__metadata__"]["config"])
    config.update(change)
    header["__metadata__"]["config"] = json.dumps(config)
    return header


def without(header, key):
    del header["__metadata__"][key]
    return header


PYTFM = {
    "format missing": (lambda h: without(h, "format"), "not a pytfm checkpoint"),
    "format safetensors": (lambda h: with_meta(h, format="pt"), "not a pytfm checkpoint"),
    "config missing": (lambda h: without(h, "config"), "not a pytfm checkpoint"),
    "config not JSON": (lambda h: with_meta(h, config="{vocab: 8}"), "config is not valid JSON"),
    "config an array": (lambda h: with_meta(h, config="[8, 4]"), "config is a JSON array"),
    "config field missing": (lambda h: with_meta(h, config=json.dumps(
        {k: v for k, v in json.loads(h["__metadata__"]["config"]).items() if k != "seed"})),
        "config has no seed"),
    "config field unknown": (lambda h: with_config(h, dropout=0.1),
                             'config has an unknown field "dropout"'),
    "config duplicate field": (lambda h: with_meta(h, config=h["__metadata__"]["config"].replace(
        "{", '{"n_layer": 1, ', 1)), 'config is not valid JSON .duplicate key "n_layer"'),
    "n_layer true": (lambda h: with_config(h, n_layer=True),
                     "config: GPTConfig.n_layer must be an int, got true"),
    "d_model a string": (lambda h: with_config(h, d_model="4"),
                         'GPTConfig.d_model must be an int, got "4"'),
    "n_head a float": (lambda h: with_config(h, n_head=2.0), "GPTConfig.n_head must be an int"),
    "vocab zero": (lambda h: with_config(h, vocab=0), "GPTConfig.vocab must be a positive int"),
    "max_seq past int64": (lambda h: with_config(h, max_seq=2**63), "GPTConfig.max_seq must be"),
    "seed negative": (lambda h: with_config(h, seed=-1), "GPTConfig.seed must be a non-negative"),
    "pos a number": (lambda h: with_config(h, pos=1), "GPTConfig.pos must be a str, got 1"),
    "pos unknown": (lambda h: with_config(h, pos="alibi"), "GPTConfig.pos must be one of"),
    "tie_embeddings 1": (lambda h: with_config(h, tie_embeddings=1),
                         "GPTConfig.tie_embeddings must be a bool, got 1"),
    "n_head not dividing": (lambda h: with_config(h, n_head=3), "must be a multiple of n_head"),
    "step missing": (lambda h: without(h, "step"), "__metadata__ has no step"),
    "step negative": (lambda h: with_meta(h, step="-1"), 'step is "-1", not a non-negative int64'),
    "step a float": (lambda h: with_meta(h, step="1.5"), 'step is "1.5", not'),
    "step empty": (lambda h: with_meta(h, step=""), 'step is "", not'),
    "step past int64": (lambda h: with_meta(h, step=str(2**63)), "not a non-negative int64"),
    "step in Arabic digits": (lambda h: with_meta(h, step="\u0663"), "not a non-negative int64"),
    "optim.t negative": (lambda h: with_meta(h, **{"optim.t": "-2"}), 'optim.t is "-2", not'),
    "extra not JSON": (lambda h: with_meta(h, extra="{"), "extra is not valid JSON"),
    "extra NaN": (lambda h: with_meta(h, extra='{"loss": NaN}'), "extra is not valid JSON"),
    "extra nested deeply": (lambda h: with_meta(h, extra="[" * 100_000),
                            "nested more than 64 levels deep"),
}


@pytest.mark.parametrize("case", PYTFM)
def test_malformed_pytfm_metadata_is_refused(saved, case):
    path, header, body = saved
    mutate, match = PYTFM[case]
    rejected(path, pack(mutate(header), body), match, loaders=(checkpoint.load,))


def test_the_tensors_must_be_exactly_those_the_config_implies(saved):
    path, header, body = saved
    load = (checkpoint.load,)
    h = json.loads(json.dumps(header))
    h["transformer.wte.weight"]["dtype"] = "I64"
    h["transformer.wte.weight"]["shape"] = [4, 4]
    rejected(path, pack(h, body), r"transformer.wte.weight is int64\[4, 4\], config .* needs "
             r"float32\[8, 4\]", load)
    h = json.loads(json.dumps(header))
    h["bonus"] = h.pop(last(h))
    rejected(path, pack(h, body), "is missing", load)
    h = json.loads(json.dumps(header))
    h["transformer.wte.weight"]["shape"] = [32]
    rejected(path, pack(h, body), r"transformer.wte.weight is float32\[32\]", load)
    rejected(path, pack(with_config(json.loads(json.dumps(header)), d_model=8), body),
             r"transformer.wte.weight is float32\[8, 4\], config .* needs float32\[8, 8\]", load)
    rejected(path, pack(without(json.loads(json.dumps(header)), "optim.t"), body),
             r"unexpected tensors 'optim.m.transformer.wte.weight', .* and \d+ more .*"
             r"no optim.t\)", load)
    tensors, _ = checkpoint.load_file(path)
    tensors["extra.weight"] = np.zeros(2, np.float32)
    checkpoint.save_file(path, tensors, header["__metadata__"])
    with pytest.raises(CheckpointError, match=r"unexpected tensors 'extra.weight' \(config"):
        checkpoint.load(path)


def test_a_config_of_a_million_layers_in_a_tiny_file_fails_at_once(tmp_path):
    """The hostile tester's 216-byte file: load() built the million-layer model (20 s and
    gigabytes) before it looked at a tensor."""
    path = str(tmp_path / "big.safetensors")
    config = config_dict(GPTConfig(vocab=8, d_model=4, n_layer=1_000_000, n_head=2, max_seq=4))
    meta = {"format": "pytfm", "config": json.dumps(config), "step": "0"}
    open(path, "wb").write(pack({"__metadata__": meta}))
    assert os.path.getsize(path) < 300
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match="tensor transformer.wte.weight is missing: "
                       r"config \{.*'n_layer': 1000000"):
        checkpoint.load(path)
    assert time.perf_counter() - start < 0.5  # milliseconds; the limit is for a busy machine
    # with every tensor of the small model present, it fails at the first of layer 1
    model, _ = small()
    checkpoint.save(path, model)
    header, body = unpack(open(path, "rb").read())
    rejected(path, pack(with_config(header, n_layer=10**18), body),
             "tensor transformer.h.1.ln_1.weight is missing", (checkpoint.load,))


def test_a_positional_table_out_of_proportion_to_the_file_is_refused(tmp_path):
    """GPT(cfg) allocates max_seq x d_model sinusoidal positions, which are not stored: a small
    file must not make load() allocate a huge table."""
    path = str(tmp_path / "pe.safetensors")
    model, _ = small("sinusoidal")
    checkpoint.save(path, model)
    header, body = unpack(open(path, "rb").read())
    rejected(path, pack(with_config(header, max_seq=10**12), body),
             r"needs a sinusoidal table of 4000000000000 floats for \d+ stored parameters",
             (checkpoint.load,))
    open(path, "wb").write(pack(with_config(header, max_seq=4096), body))  # 16K floats: fine
    assert checkpoint.load(path)[0].cfg.max_seq == 4096


def test_bad_checkpoints_raise_clear_errors(tmp_path):
    model, _ = small()
    path = str(tmp_path / "m.safetensors")
    checkpoint.save(path, model)
    blob = open(path, "rb").read()
    cut = str(tmp_path / "cut.safetensors")
    open(cut, "wb").write(blob[: len(blob) - 100])
    with pytest.raises(CheckpointError, match="truncated"):
        checkpoint.load(cut)
    open(cut, "wb").write(blob[:5])
    with pytest.raises(CheckpointError, match="too short"):
        checkpoint.load(cut)
    other, _ = small(d_model=8)
    with pytest.raises(CheckpointError, match="saved for config"):
        checkpoint.load(path, other)
    meta = {"format": "pytfm", "config": json.dumps(config_dict(model.cfg)), "step": "0"}
    checkpoint.save_file(cut, {"transformer.wte.weight": np.zeros((3, 3), np.float32)}, meta)
    with pytest.raises(CheckpointError, match=r"transformer.wte.weight is float32\[3, 3\]"):
        checkpoint.load(cut)
    with pytest.raises(CheckpointError, match="no optimizer state"):
        checkpoint.load(path, small()[0], AdamW(model.params, model.grads))


# ---- GPTConfig and param_shapes -------------------------------------------------------------


@pytest.mark.parametrize("field, value, error, match", [
    ("n_layer", True, TypeError, "GPTConfig.n_layer must be an int, got True"),
    ("vocab", 8.0, TypeError, "GPTConfig.vocab must be an int, got 8.0"),
    ("d_model", np.int64(8), TypeError, "GPTConfig.d_model must be an int"),
    ("n_head", 0, ValueError, "GPTConfig.n_head must be a positive int"),
    ("max_seq", 2**63, ValueError, r"GPTConfig.max_seq must be a positive int \(below 2\*\*63"),
    ("seed", -1, ValueError, "GPTConfig.seed must be a non-negative int, got -1"),
    ("seed", False, TypeError, "GPTConfig.seed must be an int, got False"),
    ("pos", None, TypeError, "GPTConfig.pos must be a str, got None"),
    ("pos", "alibi", ValueError, "GPTConfig.pos must be one of"),
    ("tie_embeddings", "yes", TypeError, "GPTConfig.tie_embeddings must be a bool, got 'yes'"),
])
def test_gptconfig_names_the_bad_field(field, value, error, match):
    with pytest.raises(error, match=match):
        GPTConfig(**{field: value})


@pytest.mark.parametrize("config, message", [
    (dict(d_model=24, n_head=5), r"d_model \(24\) must be a multiple of n_head \(5\)"),
    (dict(pos="rope", d_model=6, n_head=2), "rope needs an even head dim, got 3"),
    (dict(pos="sinusoidal", d_model=33, n_head=1), "sinusoidal positions need an even d_model"),
    (dict(vocab=-1), r"GPTConfig.vocab must be a positive int \(below 2\*\*63\), got -1"),
])
def test_a_configs_rules_are_the_c_librarys_one_check(tmp_path, config, message):
    """GPTConfig, the checkpoint reader and the C API give one message per broken rule: each
    calls pytfm_model_config_check."""
    from pytfm._core import ffi, lib

    with pytest.raises(ValueError, match=f"^{message}"):
        GPTConfig(**config)
    path = str(tmp_path / "m.safetensors")
    model, _ = small()
    meta = {"format": "pytfm", "config": json.dumps({**asdict(model.cfg), **config}), "step": "0"}
    checkpoint.save_file(path, {}, meta)
    with pytest.raises(CheckpointError, match=f"^{re.escape(path)}: config: {message}"):
        checkpoint.load(path)
    c = ffi.new("pytfm_model_config *", dict(vocab=8, d_model=8, n_layer=1, n_head=2,
                                               max_seq=8, pos=2, tie_embeddings=1))
    for field, value in {"pos": 0, **config}.items():  # pos 0: rope, as GPTConfig's default
        setattr(c, field, lib.PYTFM_POS_SINUSOIDAL if value == "sinusoidal" else
                0 if value == "rope" else value)
    assert lib.pytfm_model_config_check(c) == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert re.match(message, ffi.string(lib.pytfm_last_error()).decode())
    c.pos, c.d_model, c.vocab, c.n_head = 4, 8, 8, 2
    assert lib.pytfm_model_config_check(c) == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "GPTConfig.pos must be one of" in ffi.string(lib.pytfm_last_error()).decode()


@pytest.mark.parametrize("cfg", [dict(), dict(pos="sinusoidal", tie_embeddings=False),
                                 dict(vocab=3, d_model=6, n_head=3, n_layer=1, pos="none")])
def test_param_shapes_are_the_models_without_building_it(cfg):
    cfg = GPTConfig(**cfg)
    assert list(param_shapes(cfg)) == [(k, p.shape) for k, p in GPT(cfg).params.items()]
    shapes = param_shapes(GPTConfig(n_layer=10**18))  # a generator: nothing built
    assert next(shapes) == ("transformer.wte.weight", (256, 128))


def test_the_layout_names_no_parameter_outside_its_groups():
    """pytfm_model_param, the layout's one home: (layer, part) outside the groups, or a NULL
    argument, is no parameter; sizes past int64 come back as factors of in-range bases."""
    from pytfm._core import ffi, lib
    c = ffi.new("pytfm_model_config *", dict(vocab=5, d_model=2**62, n_layer=2, n_head=1,
                                             max_seq=3, pos=3, tie_embeddings=1))
    p = ffi.new("pytfm_param_info *")
    for layer, part in ((-2, 0), (3, 0), (0, -1), (0, 12), (-1, 2), (2, 2)):
        assert lib.pytfm_model_param(c, layer, part, p) == 0, (layer, part)
    assert lib.pytfm_model_param(ffi.NULL, 0, 0, p) == 0
    assert lib.pytfm_model_param(c, 0, 0, ffi.NULL) == 0
    assert lib.pytfm_model_param(c, 1, 10, p) == 1  # mlp.c_proj.weight [C, 4C]
    assert ffi.string(p.name) == b"transformer.h.1.mlp.c_proj.weight"
    assert [p.factor[d] * p.base[d] for d in range(p.ndim)] == [2**62, 2**64]
    assert lib.pytfm_model_param(c, -1, 1, p) == 1 and ffi.string(p.name).endswith(b"wpe.weight")


LLAMA_C = dict(vocab=100, d_model=24, n_layer=2, n_head=4, max_seq=16, pos=0, tie_embeddings=0,
               arch=1, n_kv_head=2, head_dim=8, d_ff=40, norm_eps=1e-6, rope_theta=1e4)


@pytest.mark.parametrize("qkv_bias,qk_norm", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_the_llama_layout_is_transformers_names_with_qkv_and_gate_up_adjacent(qkv_bias, qk_norm):
    """pytfm_model_param for arch 'llama': LlamaForCausalLM's names, the options' parameters
    there only when on, q/k/v and gate/up adjacent (one matrix each), part numbers dense."""
    from pytfm._core import ffi, lib
    c = ffi.new("pytfm_model_config *", dict(LLAMA_C, qkv_bias=qkv_bias, qk_norm=qk_norm))
    assert lib.pytfm_model_config_check(c) == lib.PYTFM_STATUS_OK
    p = ffi.new("pytfm_param_info *")
    got = []
    for layer in range(-1, 3):
        part = 0
        while lib.pytfm_model_param(c, layer, part, p):
            got.append((ffi.string(p.name).decode(),
                        tuple(p.factor[d] * p.base[d] for d in range(p.ndim))))
            part += 1
    block = [("input_layernorm.weight", (24,)), ("self_attn.q_proj.weight", (32, 24)),
             ("self_attn.k_proj.weight", (16, 24)), ("self_attn.v_proj.weight", (16, 24))]
    if qkv_bias:
        block += [("self_attn.q_proj.bias", (32,)), ("self_attn.k_proj.bias", (16,)),
                  ("self_attn.v_proj.bias", (16,))]
    block += [("self_attn.o_proj.weight", (24, 32))]
    if qk_norm:
        block += [("self_attn.q_norm.weight", (8,)), ("self_attn.k_norm.weight", (8,))]
    block += [("post_attention_layernorm.weight", (24,)), ("mlp.gate_proj.weight", (40, 24)),
              ("mlp.up_proj.weight", (40, 24)), ("mlp.down_proj.weight", (24, 40))]
    want = [("model.embed_tokens.weight", (100, 24))]
    want += [(f"model.layers.{i}.{n}", s) for i in range(2) for n, s in block]
    want += [("model.norm.weight", (24,)), ("lm_head.weight", (100, 24))]
    assert got == want
    c.tie_embeddings = 1
    assert lib.pytfm_model_param(c, 2, 1, p) == 0


@pytest.mark.parametrize("change,message", [
    (dict(n_kv_head=3), r"n_head \(4\) must be a multiple of n_kv_head \(3\)"),
    (dict(n_kv_head=0), r"GPTConfig.n_kv_head must be a positive int"),
    (dict(head_dim=7), r"rope needs an even head_dim, got 7"),
    (dict(d_ff=0), r"GPTConfig.d_ff must be a positive int"),
    (dict(d_ff=2**62), r"\(n_head \+ 2·n_kv_head\)·head_dim and 2·d_ff must be below 2\*\*63"),
    (dict(pos=3), r"the Llama family \(arch 'llama'\) uses pos 'rope', got 'learned'"),
    (dict(norm_eps=0.0), r"GPTConfig.norm_eps must be finite and > 0, got 0"),
    (dict(rope_theta=float("inf")), r"GPTConfig.rope_theta must be finite and > 0, got inf"),
    (dict(sliding_window=-1), r"GPTConfig.sliding_window must be an int >= 0"),
    (dict(qk_norm=2), r"GPTConfig.qkv_bias and qk_norm must be 0 or 1"),
    (dict(rope_scaling=1), r"rope_scaling factor must be finite and > 0, got 0"),
    (dict(rope_scaling=1, rope_factor=8.0, rope_low_freq_factor=4.0, rope_high_freq_factor=1.0,
          rope_original_max_pos=8192.0), r"rope_scaling high_freq_factor must be finite and >"),
    (dict(rope_factor=8.0), r"the rope scaling's numbers are 0 without a scaling"),
    (dict(rope_scaling=2), r"GPTConfig.rope_scaling must be None or 'llama3', got 2"),
    (dict(arch=2), r"GPTConfig.arch must be one of \('gpt', 'llama'\), got 2"),
    (dict(arch=0), r"a GPT config \(arch 'gpt'\) has none of the Llama family's fields"),
])
def test_a_llama_configs_rules_name_the_field(change, message):
    from pytfm._core import ffi, lib
    c = ffi.new("pytfm_model_config *", dict(LLAMA_C, **change))
    assert lib.pytfm_model_config_check(c) == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert re.match(message, ffi.string(lib.pytfm_last_error()).decode())
    c = ffi.new("pytfm_model_config *", dict(LLAMA_C, rope_scaling=1, rope_factor=8.0,
                                             rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                                             rope_original_max_pos=8192.0, sliding_window=4))
    assert lib.pytfm_model_config_check(c) == lib.PYTFM_STATUS_OK, lib.pytfm_last_error()


LLAMA_CFG = dict(arch="llama", vocab=50, d_model=16, n_layer=1, n_head=4, n_kv_head=2,
                 head_dim=6, d_ff=24, max_seq=8, tie_embeddings=False, qkv_bias=True,
                 qk_norm=True, norm_eps=1e-5, rope_theta=500000.0, rope_scaling="llama3",
                 rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                 rope_original_max_pos=8192.0, sliding_window=3)


def llama_file(path, config, cfg=None):
    """A pytfm checkpoint of a Llama config: the tensors param_shapes(cfg) names, config's text
    in __metadata__ (cfg: GPTConfig(**config) unless given)."""
    cfg = cfg or GPTConfig(**config)
    tensors = {n: np.full(s, 0.5, np.float32) for n, s in param_shapes(cfg)}
    checkpoint.save_file(path, tensors, {"format": "pytfm", "config": json.dumps(config),
                                         "step": "3"})


def test_a_llama_checkpoint_reads_back_its_config_and_a_gpts_leaves_the_fields_out(tmp_path):
    """A Llama config's every field goes through the reader (ints, floats, None/'llama3',
    bools); a GPT's is stored without them, as before, and reads back equal."""
    path = str(tmp_path / "llama.safetensors")
    cfg = GPTConfig(**LLAMA_CFG)
    llama_file(path, config_dict(cfg))
    with checkpoint.SafetensorsFile(path) as f:
        got, step, _, _ = f.checkpoint()
    assert got == cfg and step == 3
    assert set(config_dict(GPTConfig())) == {"vocab", "d_model", "n_layer", "n_head", "max_seq",
                                             "pos", "tie_embeddings", "seed"}
    llama_file(path, dict(config_dict(cfg), rope_theta=500000), cfg)  # an int is a float here
    with checkpoint.SafetensorsFile(path) as f:
        assert f.checkpoint()[0] == cfg


@pytest.mark.parametrize("change,message", [
    (dict(arch="t5"), r"config: GPTConfig.arch must be one of \('gpt', 'llama'\), got \"t5\""),
    (dict(arch=1), r"config: GPTConfig.arch must be a str, got 1"),
    (dict(n_kv_head=2.0), r"config: GPTConfig.n_kv_head must be an int, got 2.0"),
    (dict(d_ff=2**64), r"config: GPTConfig.d_ff must be below 2\*\*63 in size"),
    (dict(norm_eps="1e-5"), r"config: GPTConfig.norm_eps must be a float, got \"1e-5\""),
    (dict(rope_scaling="yarn"), r"config: GPTConfig.rope_scaling must be one of \(None, 'llama3'"),
    (dict(qk_norm=1), r"config: GPTConfig.qk_norm must be a bool, got 1"),
    (dict(n_kv_head=3), r"config: n_head \(4\) must be a multiple of n_kv_head \(3\)"),
    (dict(rope_theta=1e999), r"config: GPTConfig.rope_theta must be finite and > 0, got inf"),
    (dict(arch="gpt"), r"config: a GPT config \(arch 'gpt'\) has none of the Llama family's"),
    (dict(colour="red"), r"config has an unknown field \"colour\""),
])
def test_a_llama_checkpoints_config_is_held_to_gptconfigs_types_and_rules(tmp_path, change,
                                                                           message):
    path = str(tmp_path / "llama.safetensors")
    cfg = GPTConfig(**LLAMA_CFG)
    config = json.dumps(dict(config_dict(cfg), **change)).replace("Infinity", "1e999")
    tensors = {n: np.full(s, 0.5, np.float32) for n, s in param_shapes(cfg)}
    checkpoint.save_file(path, tensors, {"format": "pytfm", "config": config, "step": "0"})
    with pytest.raises(CheckpointError, match=f"^{re.escape(path)}: {message}"):
        checkpoint.load(path)


def test_a_llama_checkpoints_missing_tensor_message_shows_its_whole_config(tmp_path):
    path = str(tmp_path / "llama.safetensors")
    cfg = GPTConfig(**LLAMA_CFG)
    checkpoint.save_file(path, {}, {"format": "pytfm", "config": json.dumps(config_dict(cfg)),
                                    "step": "0"})
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(path)
    assert str(e.value) == (f"{path}: tensor model.embed_tokens.weight is missing: config "
                            f"{config_dict(cfg)} needs float32[50, 16]")


# ---- loads are all-or-nothing ---------------------------------------------------------------


def snapshot(model, opt):
    return ({k: p.tobytes() for k, p in model.params.items()}, opt.t,
            {k: a.tobytes() for k, a in opt.m.items()}, {k: a.tobytes() for k, a in opt.v.items()})


def test_a_failed_load_leaves_the_model_and_optimizer_alone(saved, monkeypatch):
    path, header, body = saved
    model, opt = small(seed=0)  # the saved config, other values
    for a in [*model.params.values(), *opt.m.values(), *opt.v.values()]:
        a += 1
    opt.t = 5
    before = snapshot(model, opt)

    def refused(blob, match, error=CheckpointError):
        open(path, "wb").write(blob)
        with pytest.raises(error, match=match):
            checkpoint.load(path, model, opt)
        assert snapshot(model, opt) == before

    # the last tensor of the file is the bad one: every parameter before it was fine
    h = json.loads(json.dumps(header))
    h[last(h)]["dtype"] = "I64"
    h[last(h)]["shape"] = [h[last(h)]["shape"][0] // 2]
    refused(pack(h, body), "is int64")
    refused(pack(with_meta(json.loads(json.dumps(header)), **{"optim.t": "x"}), body), "optim.t")
    refused(pack(with_meta(json.loads(json.dumps(header)), extra="{"), body), "extra")
    refused(pack(header, body[:-1]), "truncated")
    # the file shrinks between the checks and the reading of the data
    open(path, "wb").write(pack(header, body))

    class Shrinking(checkpoint.SafetensorsFile):
        def __init__(self, path):
            super().__init__(path)  # the header is checked: now the last 4 bytes go
            os.truncate(path, os.path.getsize(path) - 4)

    monkeypatch.setattr(checkpoint, "SafetensorsFile", Shrinking)
    with pytest.raises(CheckpointError, match="the file ended inside tensor .* shrank while"):
        checkpoint.load(path, model, opt)
    monkeypatch.undo()
    assert snapshot(model, opt) == before
    # an optimizer of another model is the caller's mistake, found before anything is copied
    _, other_opt = small(d_model=8)
    open(path, "wb").write(pack(header, body))
    with pytest.raises(ValueError, match="the optimizer's first moments are not float32 arrays"):
        checkpoint.load(path, model, other_opt)
    assert snapshot(model, opt) == before
    # and the same file, whole, loads
    checkpoint.load(path, model, opt)
    params, t, m, v = snapshot(model, opt)
    assert t == 1 and params != before[0] and m != before[2] and v != before[3]


# ---- saves ----------------------------------------------------------------------------------


def temporaries(folder):
    return sorted(f for f in os.listdir(folder) if f.startswith(".tmp-"))


HOLD = """
import sys
from pytfm import _atomic
fd, tmp = _atomic._create_temporary(sys.argv[1])  # as a running save holds it
print(tmp, flush=True)
sys.stdin.read()
"""


def python(script, *args, **kw):
    """Run script in a new Python that imports this pytfm (in place or installed), from a
    folder where no other pytfm shadows it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(checkpoint.__file__)))
    env = dict(os.environ, PYTHONPATH=package + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, cwd="/", text=True,
                            **kw)


def test_the_next_save_removes_stale_temporaries_but_not_a_running_saves(tmp_path):
    path = str(tmp_path / "ck.safetensors")
    model, _ = small()
    stale = tmp_path / ".tmp-ck.safetensors.0badf00d"  # a killed save's: nobody holds it
    stale.write_bytes(b"half a checkpoint")
    others = [".tmp-other.safetensors.0badf00d", ".tmp-ck.safetensors.notmine", "ck.tmp-12"]
    for name in others:  # other checkpoints', or not pytfm's at all
        (tmp_path / name).write_bytes(b"x")
    holder = python(HOLD, path, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        running = holder.stdout.readline().strip()
        assert os.path.basename(running).startswith(".tmp-ck.safetensors.")
        checkpoint.save(path, model)
        assert not stale.exists() and os.path.exists(running)
        assert all((tmp_path / name).exists() for name in others)
    finally:
        holder.communicate("")  # it exits, its lock goes: now it is a killed save's leftover
    checkpoint.save(path, model)
    assert not os.path.exists(running) and temporaries(tmp_path) == sorted(others[:2])


def test_a_long_name_gets_a_short_temporary(tmp_path):
    path = str(tmp_path / ("é" * 120 + ".safetensors"))  # 252 bytes: the longest is 255
    model, _ = small()
    checkpoint.save(path, model)
    assert checkpoint.load(path)[0].cfg == model.cfg
    fd, tmp = _atomic._create_temporary(path)
    os.close(fd)
    assert len(os.fsencode(os.path.basename(tmp))) < 255
    checkpoint.save(path, model)
    assert not os.path.exists(tmp)


SAVER = """
import sys
import numpy as np
from pytfm import checkpoint
x = np.zeros(1 << 22, np.float32)  # 16 MB: a save lasts long enough to be killed midway
for step in range(1, 10**9):
    x[:] = step
    checkpoint.save_file(sys.argv[1], {"x": x}, {"step": str(step)})
    print(step, flush=True)
"""


def test_a_save_killed_midway_leaves_the_old_checkpoint_whole(tmp_path):
    path = str(tmp_path / "ck.safetensors")
    for _ in range(10):  # until the kill lands while a temporary exists
        saver = python(SAVER, path, stdout=subprocess.PIPE)
        saver.stdout.readline()  # one save done: there is an old checkpoint
        deadline = time.monotonic() + 10
        while not temporaries(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.001)
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        saver.stdout.close()
        if temporaries(tmp_path):
            break
    else:
        pytest.fail("never caught a save midway")
    tensors, meta = checkpoint.load_file(path)  # the previous save, whole
    assert int(meta["step"]) >= 1 and (tensors["x"] == int(meta["step"])).all()
    assert len(temporaries(tmp_path)) == 1
    checkpoint.save_file(path, {"x": np.ones(1, np.float32)}, {"step": "0"})
    assert temporaries(tmp_path) == []


def test_a_save_into_a_missing_or_unwritable_folder_names_the_path(tmp_path):
    model, _ = small()

    def refused(path, error):
        with pytest.raises(error, match=f"cannot save checkpoint {re.escape(str(path))}: "):
            checkpoint.save(str(path), model)

    refused(tmp_path / "nope" / "m.safetensors", FileNotFoundError)
    (tmp_path / "file").write_text("")
    refused(tmp_path / "file" / "m.safetensors", NotADirectoryError)
    (tmp_path / "folder").mkdir()
    refused(tmp_path / "folder", IsADirectoryError)
    assert temporaries(tmp_path) == []
    if os.geteuid() == 0:
        return  # root writes into read-only folders
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    refused(read_only / "m.safetensors", PermissionError)


def test_save_refuses_what_load_would_refuse(tmp_path):
    path = str(tmp_path / "m.safetensors")
    model, _ = small()
    with pytest.raises(ValueError, match="step must be a non-negative int64"):
        checkpoint.save(path, model, step=-1)
    with pytest.raises(TypeError):
        checkpoint.save(path, model, step=1.5)
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        checkpoint.save(path, model, extra={"loss": float("nan")})
    with pytest.raises(TypeError, match="metadata must be a dict of str to str"):
        checkpoint.save_file(path, {}, {"step": 1})
    with pytest.raises(ValueError, match="cannot store a tensor named"):
        checkpoint.save_file(path, {"\ud800": np.zeros(1, np.float32)}, {})
    assert not os.path.exists(path) and temporaries(tmp_path) == []


def deep_list(depth):
    value = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_save_refuses_an_extra_nested_deeper_than_load_reads(tmp_path):
    """extra nested MAX_JSON_DEPTH deep is saved and loaded back; one level more, or far more
    (past what json.dumps can recurse), is a ValueError from save() and nothing is written."""
    path = str(tmp_path / "m.safetensors")
    model, _ = small()
    limit = checkpoint.MAX_JSON_DEPTH
    assert limit == 64
    for extra in [deep_list(limit), {"a": deep_list(limit - 1)}]:
        checkpoint.save(path, model, extra=extra)
        assert checkpoint.load(path)[2] == extra
    os.unlink(path)
    for extra in [deep_list(limit + 1), {"a": deep_list(limit)}, deep_list(100_000)]:
        with pytest.raises(ValueError, match=rf"extra is not valid JSON \(nested more than "
                           rf"{limit} levels deep.*: load\(\) would refuse it"):
            checkpoint.save(path, model, extra=extra)
    assert not os.path.exists(path) and temporaries(tmp_path) == []


DEEP = "not valid JSON \\(nested more than 64 levels deep"


@pytest.mark.parametrize("text, error", [
    ("[" * 64 + "]" * 64, None),
    ("[" * 65 + "]" * 65, DEEP),
    ('{"a": ' * 64 + "1" + "}" * 64, None),
    ('{"a": ' * 65 + "1" + "}" * 65, DEEP),
    ('["' + "[" * 100 + '"]', None),  # brackets in strings are text
    ('{"k\\"[[[[": ' + "[" * 63 + "]" * 63 + "}", None),  # an escaped quote ends no string
    ('{"k\\\\": ' + "[" * 64 + "]" * 64 + "}", DEEP),  # an escaped backslash escapes no quote
    ("[" * 32 + "]" * 32 + " " + "[" * 40 + "]" * 40, "extra data after the value: byte 65"),
    ('{"\\ud800": 1}', r'key "\\ud800" holds a lone surrogate'),  # json.dumps writes these
    ('["\\ud800"]', None),  # a lone surrogate is only refused in a key (a str holds it)
    ("1" * 4301, "an integer of 4301 digits"),
])
def test_json_nests_to_its_explicit_limit(text, error):
    """The C reader's JSON check, which save() holds extra to: containers are counted outside
    strings, up to MAX_JSON_DEPTH."""
    assert checkpoint.json_error(text) is None if error is None else re.search(
        error, checkpoint.json_error(text)), checkpoint.json_error(text)


def test_save_refuses_an_extra_load_would_refuse(tmp_path):
    path = str(tmp_path / "m.safetensors")
    model, _ = small()
    with pytest.raises(ValueError, match=r'extra is not valid JSON \(key "\\ud800" holds a lone '
                       r"surrogate .*load\(\) would refuse it"):
        checkpoint.save(path, model, extra={"\ud800": 1})
    checkpoint.save(path, model, extra={"a": "\ud800"})  # a value may: json.loads reads it
    assert checkpoint.load(path)[2] == {"a": "\ud800"}


# ---- fuzzing --------------------------------------------------------------------------------


@functools.cache
def seeds():
    """Real checkpoints to mutate: with and without optimizer state, both position kinds. (Not
    a fixture: hypothesis would print it with every falsifying example.)"""
    blobs = []
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "seed.safetensors")
        for pos, tie, with_opt in [("rope", True, True), ("sinusoidal", False, False)]:
            model, opt = small(pos, tie)
            checkpoint.save(path, model, step=5, optimizer=opt if with_opt else None,
                            extra={"a": [1]})
            blobs.append(open(path, "rb").read())
    return tuple(blobs)


JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.sampled_from([0, 1, -1, 4, 8, 2**31, 2**63, 2**64, -(2**63), 10**30]) | st.integers(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=6)


def mutate(draw):
    """A real checkpoint with bits flipped, cut short, spliced or its header edited."""
    blob = seeds()[draw(st.integers(0, len(seeds()) - 1))]
    kind = draw(st.sampled_from(["flip", "truncate", "splice", "header"]))
    if kind == "header":
        return edit_structure(draw, blob, JSON)
    data = bytearray(blob)
    if kind == "flip":
        for pos in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=8)):
            data[pos] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    else:
        a = draw(st.integers(0, len(data)))
        b = draw(st.integers(a, min(len(data), a + 64)))
        data[a:b] = draw(st.binary(max_size=16) | st.integers(0, len(data)).map(
            lambda i: bytes(data[i:i + 32])))
    return bytes(data)


@settings(max_examples=8 * settings().max_examples)  # cheap: 200 in the quick profile
@given(data=st.data())
def test_fuzzed_checkpoints_load_or_raise_checkpoint_error(tmp_path_factory, data):
    path = str(tmp_path_factory.getbasetemp() / "fuzzed.safetensors")
    with open(path, "wb") as f:
        f.write(mutate(data.draw))
    for load in (checkpoint.load_file, checkpoint.load):
        try:
            load(path)
        except CheckpointError:
            pass
    model, opt = small()  # the first seed's config
    before = snapshot(model, opt)
    try:
        checkpoint.load(path, model, opt)
    except CheckpointError:
        assert snapshot(model, opt) == before
