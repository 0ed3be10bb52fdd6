"""The C model in PYTFM_PRECISION_BF16 (pytfm_model_set_precision) against pytfm.nn's GPT in
precision "bf16": the same bits, batched and through sessions (which read the BF16 copy of the
weights), on every BF16 path; and examples/generate.c --precision bf16."""

import numpy as np
import pytest
from test_c_model import CModel, assert_same_logits, run_exe, saved, small, trained

from helpers import BF16_PATHS, bf16_path
from pytfm._core import ffi, lib
from pytfm.generate import generate

OK, INVALID = lib.PYTFM_STATUS_OK, lib.PYTFM_STATUS_INVALID_ARGUMENT
BF16, FP32 = lib.PYTFM_PRECISION_BF16, lib.PYTFM_PRECISION_FP32
__all__ = ["trained"]  # a fixture of test_c_model.py, used here (generate_exe: conftest.py)


def precision_of(c):
    p = ffi.new("int32_t *")
    assert lib.pytfm_model_get_precision(c.h, p) == OK
    return p[0]


@pytest.mark.parametrize("path", BF16_PATHS)
@pytest.mark.parametrize("pos,tie", [("rope", True), ("sinusoidal", False), ("none", True)])
def test_the_c_model_in_bf16_is_pythons(path, pos, tie, tmp_path):
    model = small(pos, tie, d_model=64, max_seq=40, vocab=300)  # vocab: an LM head of 300 rows
    file = saved(model, tmp_path / "m.safetensors")
    model.set_precision("bf16")
    tokens = np.random.default_rng(0).integers(0, 300, (3, 20))
    with bf16_path(path), CModel(file) as c:
        assert precision_of(c) == FP32  # a model opens in FP32
        assert lib.pytfm_model_set_precision(c.h, BF16) == OK and precision_of(c) == BF16
        assert_same_logits(c.forward(tokens), model.forward(tokens)[0])
        caches = model.new_caches(1)
        with c.session() as s:  # a prompt of 5, then one token at a time: the BF16 copy
            assert_same_logits(s.feed(tokens[0, :5]), model.decode(tokens[:1, :5], caches)[0, -1])
            for t in range(5, 20):
                assert_same_logits(s.feed(tokens[0, t:t + 1]),
                                   model.decode(tokens[:1, t:t + 1], caches)[0, -1])
        assert lib.pytfm_model_set_precision(c.h, FP32) == OK  # back: the FP32 bits again
        assert_same_logits(c.forward(tokens), model.set_precision("fp32").forward(tokens)[0])


def test_a_bad_precision_is_refused_and_changes_nothing(tmp_path):
    file = saved(small(), tmp_path / "m.safetensors")
    with CModel(file) as c:
        for bad in (2, -1):
            assert lib.pytfm_model_set_precision(c.h, bad) == INVALID
            assert "precision must be a pytfm_precision (0: FP32, 1: BF16)" in \
                ffi.string(lib.pytfm_last_error()).decode()
        assert precision_of(c) == FP32
        assert lib.pytfm_model_set_precision(c.h, BF16) == OK
        assert lib.pytfm_model_set_precision(c.h, BF16) == OK  # again: nothing to do
    assert lib.pytfm_model_set_precision(ffi.NULL, BF16) == INVALID
    assert lib.pytfm_model_get_precision(ffi.NULL, ffi.new("int32_t *")) == INVALID


def test_the_generate_example_in_bf16_is_pythons_greedy(trained, generate_exe):
    model, path = trained
    model.set_precision("bf16")
    try:
        ref = generate(model, np.array([list(b"class ")]), 50, temperature=0.0)[0]
    finally:
        model.set_precision("fp32")
    r = run_exe(generate_exe, path, "--prompt", "class ", "--tokens", 50, "--temperature", 0,
                "--threads", 1, "--precision", "bf16")
    assert r.returncode == 0, r.stderr
    assert r.stdout == bytes(ref.tolist()) + b"\n"
    assert b"precision: bf16 (" in r.stderr
    r = run_exe(generate_exe, path, "--precision", "fp16")
    assert r.returncode == 2 and b"argument --precision: invalid choice: 'fp16'" in r.stderr
