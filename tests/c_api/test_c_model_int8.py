"""The C model in PYTFM_PRECISION_INT8 (pytfm_model_set_precision) against pytfm.nn's GPT in
precision "int8": the same bits, batched and through sessions, for pytfm checkpoints of every
position mode (tied and untied heads) and for Llama-family folders (float32 ones quantised from
float32, bfloat16 ones from the BF16 matrices they keep); the refusals, each with its message;
examples/generate.c --precision int8."""

import os
import sys

import numpy as np
import pytest
from test_c_llama_model import same_as_python
from test_c_model import CModel, assert_same_logits, last_error, run_exe, saved, small, trained

from helpers import PEAK_MARGIN, TESTS, big_bf16_folder, max_isa, peak_growth
from pytfm import checkpoint, llama
from pytfm._core import ffi, lib
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig

sys.path.insert(0, os.path.join(TESTS, "model"))
from test_llama_folders import hf_model  # noqa: E402
from test_llama_folders import saved as saved_folder  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

OK, INVALID = lib.PYTFM_STATUS_OK, lib.PYTFM_STATUS_INVALID_ARGUMENT
FP32, BF16, INT8 = lib.PYTFM_PRECISION_FP32, lib.PYTFM_PRECISION_BF16, lib.PYTFM_PRECISION_INT8
__all__ = ["trained"]  # a fixture of test_c_model.py, used here (generate_exe: conftest.py)


def precision_of(c):
    p = ffi.new("int32_t *")
    assert lib.pytfm_model_get_precision(c.h, p) == OK
    return p[0]


def set_precision(c, precision):
    assert lib.pytfm_model_set_precision(c.h, precision) == OK, last_error()
    assert precision_of(c) == precision


def same_in_sessions(c, model, tokens):
    """A session fed a prompt of 5, then one token at a time: the Python model's decode."""
    caches = model.new_caches(1)
    with c.session() as s:
        assert_same_logits(s.feed(tokens[0, :5]), model.decode(tokens[:1, :5], caches)[0, -1])
        for t in range(5, tokens.shape[1]):
            assert_same_logits(s.feed(tokens[0, t:t + 1]),
                               model.decode(tokens[:1, t:t + 1], caches)[0, -1])


@pytest.mark.parametrize("pos,tie", [("rope", True), ("sinusoidal", False), ("none", True),
                                     ("learned", False), ("learned", True)])
def test_the_c_model_in_int8_is_pythons(pos, tie, tmp_path):
    model = small(pos, tie, d_model=64, max_seq=40, vocab=300)
    file = saved(model, tmp_path / "m.safetensors")
    model.set_precision("int8")
    tokens = np.random.default_rng(0).integers(0, 300, (3, 20))
    with CModel(file) as c:
        set_precision(c, INT8)
        assert_same_logits(c.forward(tokens), model.forward(tokens)[0])
        same_in_sessions(c, model, tokens)
        set_precision(c, INT8)  # again: nothing to do


@pytest.mark.parametrize("isa", ["plain", "avx2", "avx512"])
def test_the_c_model_in_int8_is_pythons_at_each_isa_cap(isa, tmp_path):
    model = small("learned", False, d_model=64, max_seq=40, vocab=300)
    file = saved(model, tmp_path / "m.safetensors")
    tokens = np.random.default_rng(4).integers(0, 300, (2, 12))
    with max_isa(isa), CModel(file) as c:
        model.set_precision("int8")
        set_precision(c, INT8)
        assert_same_logits(c.forward(tokens), model.forward(tokens)[0])
        same_in_sessions(c, model, tokens)


def test_a_model_in_bf16_quantises_its_float32_weights(tmp_path):
    # the BF16 copy of the weights is not what is quantised (it is freed with them)
    model = small("rope", False, d_model=64, max_seq=40, vocab=300)
    file = saved(model, tmp_path / "m.safetensors")
    model.set_precision("int8")
    tokens = np.random.default_rng(1).integers(0, 300, (2, 12))
    with CModel(file) as c:
        set_precision(c, BF16)
        set_precision(c, INT8)
        assert_same_logits(c.forward(tokens), model.forward(tokens)[0])


@pytest.mark.parametrize("family, dtype, config", [
    ("llama", "float32", {}),
    ("llama", "bfloat16", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    ("qwen2", "bfloat16", {}),
    ("qwen3", "float32", dict(head_dim=16, tie_word_embeddings=True)),
    ("mistral", "float16", dict(sliding_window=8))],
    ids=["llama-f32", "llama-bf16-tied", "qwen2-bf16", "qwen3-f32-tied", "mistral-f16"])
def test_a_folder_in_int8_is_the_python_models_int8(tmp_path, family, dtype, config):
    path = saved_folder(tmp_path, hf_model(family, dtype=dtype, intermediate_size=64, **config))
    py = llama.load(path, precision="int8")
    with CModel(path) as c:
        set_precision(c, INT8)  # a bfloat16 folder: from the BF16 matrices it keeps
        same_as_python(c, py, py.cfg.vocab)
    if dtype == "bfloat16":  # FP32 first (the matrices widened): the same blocks
        with CModel(path) as c:
            set_precision(c, FP32)
            set_precision(c, INT8)
            same_as_python(c, py, py.cfg.vocab)


def test_int8_is_one_way_and_bad_precisions_are_refused(tmp_path):
    model = small(d_model=64, max_seq=40, vocab=300)
    file = saved(model, tmp_path / "m.safetensors")
    model.set_precision("int8")
    tokens = np.random.default_rng(2).integers(0, 300, (2, 9))
    with CModel(file) as c:
        for bad in (2, -1, 4):
            assert lib.pytfm_model_set_precision(c.h, bad) == INVALID
            assert last_error() == ("pytfm_model_set_precision: precision must be a "
                                    "pytfm_precision (0: FP32, 1: BF16) or PYTFM_PRECISION_INT8 "
                                    f"(3), got {bad}")
        set_precision(c, INT8)
        for other in (FP32, BF16):
            assert lib.pytfm_model_set_precision(c.h, other) == INVALID
            assert "the model is in PYTFM_PRECISION_INT8, which holds its weight matrices as " \
                "int8 blocks only" in last_error()
            assert f"open the model again for precision {other}" in last_error()
        assert precision_of(c) == INT8  # unchanged, and it still runs
        assert_same_logits(c.forward(tokens), model.forward(tokens)[0])


@pytest.mark.parametrize("cfg, message", [
    (GPTConfig(vocab=64, d_model=48, n_layer=1, n_head=4, max_seq=16),
     "transformer.wte.weight is [64, 48]: 48 is not a multiple of 32"),
    (GPTConfig(vocab=64, d_model=32, n_layer=1, n_head=4, max_seq=16, tie_embeddings=False),
     None)], ids=["d48", "d32"])
def test_a_matrix_not_in_whole_blocks_is_refused_naming_it(tmp_path, cfg, message):
    model = GPT(cfg)
    file = saved(model, tmp_path / "m.safetensors")
    tokens = np.random.default_rng(3).integers(0, 64, (1, 7))
    with CModel(file) as c:
        if message is None:  # d_model 32: every matrix in whole blocks
            set_precision(c, INT8)
            assert_same_logits(c.forward(tokens), model.set_precision("int8").forward(tokens)[0])
            return
        assert lib.pytfm_model_set_precision(c.h, INT8) == INVALID
        assert last_error() == (
            "pytfm_model_set_precision: PYTFM_PRECISION_INT8 quantises each weight matrix "
            f"[out, in] in blocks of 32 along in, and {message} (run this model in FP32 or BF16)")
        assert precision_of(c) == FP32  # unchanged
        assert_same_logits(c.forward(tokens), model.forward(tokens)[0])


def test_a_non_finite_weight_is_refused_naming_its_matrix(tmp_path):
    model = small(d_model=64, max_seq=40, vocab=300)
    model.params["transformer.h.1.mlp.c_fc.weight"][3, 40] = np.inf
    file = saved(model, tmp_path / "m.safetensors")
    with CModel(file) as c:
        assert lib.pytfm_model_set_precision(c.h, INT8) == INVALID
        assert last_error().startswith("pytfm_model_set_precision: quantising "
                                       "transformer.h.1.mlp.c_fc.weight: ")
        assert precision_of(c) == FP32


def test_the_products_refuse_int8_as_a_precision():
    x, w, y = (np.zeros(n, np.float32) for n in (32, 64, 2))
    f = ffi.from_buffer
    assert lib.pytfm_linear_forward_ex(f("float[]", y, True), f("float[]", x), f("float[]", w),
                                       ffi.NULL, 1, 32, 2, INT8) == INVALID
    assert last_error() == (
        "pytfm_linear_forward_ex: precision PYTFM_PRECISION_INT8 (3) is a model's "
        "(pytfm_model_set_precision), not a product's: a product on int8 weights is "
        "pytfm_linear_forward_q8w, on weights pytfm_quantize_q8 made; use 0: FP32 or 1: BF16 "
        "here")


def test_the_generate_example_in_int8_is_pythons_greedy(trained, generate_exe):
    _, path = trained
    ref = generate(checkpoint.load(str(path))[0].set_precision("int8"),
                   np.array([list(b"class ")]), 50, temperature=0.0)[0]
    r = run_exe(generate_exe, path, "--prompt", "class ", "--tokens", 50, "--temperature", 0,
                "--threads", 1, "--precision", "int8")
    assert r.returncode == 0, r.stderr
    assert r.stdout == bytes(ref.tolist()) + b"\n"
    assert b"precision: int8 (int8 blocks of 32, fp16 scales)" in r.stderr
    r = run_exe(generate_exe, path, "--precision", "int4")
    assert r.returncode == 2
    assert b"argument --precision: invalid choice: 'int4' (choose from 'fp32', 'bf16', " \
        b"'int8')" in r.stderr


MEASURE = r"""
import sys
from pytfm._core import ffi, lib

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

before, base = hwm(), rss()
h = ffi.new("pytfm_model **")
assert lib.pytfm_model_open(h, sys.argv[1].encode(), lib.PYTFM_DEVICE_CPU) == 0
assert lib.pytfm_model_set_precision(h[0], lib.PYTFM_PRECISION_INT8) == 0, \
    ffi.string(lib.pytfm_last_error()).decode()
print(hwm() - before, rss() - base)
"""


def test_a_bfloat16_folder_in_int8_holds_its_blocks_only(tmp_path):
    # opened as BF16 (the file's size S), then quantised beside it (S/2 values of int8, S/32
    # of scales): the peak; then the BF16 matrices freed: what stays is about 0.53 S
    size = big_bf16_folder(tmp_path / "big")
    peak, resident = peak_growth(MEASURE, tmp_path / "big")
    int8 = size // 2 + size // 32
    assert peak <= size + int8 + PEAK_MARGIN, f"peak {peak >> 20} MiB, file {size >> 20} MiB"
    assert resident <= int8 + PEAK_MARGIN, f"resident {resident >> 20} MiB, the blocks " \
                                           f"{int8 >> 20} MiB"
