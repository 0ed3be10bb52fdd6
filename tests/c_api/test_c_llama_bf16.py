"""A Llama-family folder whose matrices are all bfloat16 opens in the C model in
PYTFM_PRECISION_BF16 holding them in BF16 only (csrc/model/model.c, "keeps BF16"): its logits
are pytfm.nn's in precision "bf16" bit for bit (the float32 widening of the file, rounded as
every BF16 product rounds: the same values), FP32 widens them (pytfm.nn's fp32 bits), and
opening it takes the file's size in memory, not twice it. The packed BF16 product on weights
given in BF16 only (csrc/kernels/linear.c, sgemm_bf16.c) against the one on their float32
widening, on every BF16 path. float16 and mixed-dtype folders open as float32, as before."""

import dataclasses
import os
import sys

import numpy as np
import pytest
from test_c_llama_model import IDS, same_as_python
from test_c_model import OK, CModel, assert_same_logits, last_error

from helpers import BF16_PATHS, PEAK_MARGIN, TESTS, bf16_path, big_bf16_folder, peak_growth
from pytfm import llama
from pytfm._core import ffi, lib
from pytfm.nn import GPT, GPTConfig

sys.path.insert(0, os.path.join(TESTS, "model"))
from test_llama_folders import CASES, hf_model, rewrite, saved, weights_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

BF16, FP32 = lib.PYTFM_PRECISION_BF16, lib.PYTFM_PRECISION_FP32


def precision_of(c):
    p = ffi.new("int32_t *")
    assert lib.pytfm_model_get_precision(c.h, p) == OK, last_error()
    return p[0]


def set_precision(c, precision):
    assert lib.pytfm_model_set_precision(c.h, precision) == OK, last_error()
    assert precision_of(c) == precision


@pytest.mark.parametrize("family, dtype, shard, config, fields", CASES, ids=IDS)
def test_a_bfloat16_folder_opens_in_bf16_as_the_python_models_bf16(tmp_path, family, dtype,
                                                                   shard, config, fields):
    # every family and option of CASES, saved in bfloat16 (sharded where the case is)
    path = saved(tmp_path, hf_model(family, dtype="bfloat16", **config), shard=shard)
    py = llama.load(path, precision="bf16")
    with CModel(path) as c:
        assert precision_of(c) == BF16
        same_as_python(c, py, py.cfg.vocab)
        set_precision(c, FP32)  # the matrices widened: the float32 model's bits
        same_as_python(c, llama.load(path), py.cfg.vocab)
        set_precision(c, BF16)  # the widened copy freed: BF16's bits again
        same_as_python(c, py, py.cfg.vocab)


def odd_params(cfg):
    """Random parameters of cfg, every matrix holding a few BF16 subnormals and zeros of
    either sign among its values (what the rounding of the products makes zeros of)."""
    model = GPT(cfg)
    rng = np.random.default_rng(7)
    params = {k: np.array(v, np.float32) for k, v in model.params.items()}
    for v in params.values():
        if v.ndim == 2:
            flat = v.reshape(-1)
            at = rng.choice(flat.size, 6, replace=False)
            flat[at] = np.array([1e-39, -1e-39, 3e-40, -5e-41, 0.0, -0.0], np.float32)
    return params


# sizes past the kernels' tiles: C odd, a k slice past KC = 768 (the MLP's down projection),
# an LM head above the fallback's widening block (2^18 floats) and above NC = 2048 columns
ODD = GPTConfig(arch="llama", vocab=3001, d_model=97, n_layer=2, n_head=3, n_kv_head=1,
                head_dim=10, d_ff=801, max_seq=48, qkv_bias=True, tie_embeddings=False, seed=5)


@pytest.fixture(scope="module")
def odd_folders(tmp_path_factory):
    """The same values as a bfloat16 folder and as a float32 one (the bfloat16 file widened),
    untied and tied."""
    out = {}
    for tie in (False, True):
        cfg = dataclasses.replace(ODD, tie_embeddings=tie)
        root = tmp_path_factory.mktemp(f"odd{int(tie)}")
        bf, f32 = str(root / "bf16"), str(root / "f32")
        llama.save(bf, cfg, odd_params(cfg), dtype="bfloat16")
        llama.save(f32, cfg, llama.read_params(bf)[1], dtype="float32")
        out[tie] = bf, f32
    return out


@pytest.mark.parametrize("path", BF16_PATHS)
@pytest.mark.parametrize("tie", [False, True])
def test_bf16_weights_only_give_the_bits_of_their_float32_widening(odd_folders, path, tie):
    bf, f32 = odd_folders[tie]
    rng = np.random.default_rng(1)
    with bf16_path(path), CModel(bf) as kept, CModel(f32) as widened:
        assert precision_of(kept) == BF16 and precision_of(widened) == FP32
        set_precision(widened, BF16)  # float32 weights and their BF16 copy: the old path
        for B, T in [(1, 1), (1, 2), (1, 3), (1, 5), (1, 7), (1, 9), (3, 13), (2, 48)]:
            tokens = rng.integers(0, ODD.vocab, (B, T))
            np.testing.assert_array_equal(kept.forward(tokens), widened.forward(tokens),
                                          err_msg=f"{B}x{T} tokens")
        tokens = rng.integers(0, ODD.vocab, 20)
        with kept.session() as a, widened.session() as b:
            np.testing.assert_array_equal(a.feed(tokens[:6]), b.feed(tokens[:6]))
            for t in range(6, 20):
                np.testing.assert_array_equal(a.feed(tokens[t:t + 1]), b.feed(tokens[t:t + 1]))
        set_precision(kept, FP32)
        set_precision(widened, FP32)
        tokens = rng.integers(0, ODD.vocab, (2, 11))
        np.testing.assert_array_equal(kept.forward(tokens), widened.forward(tokens))


def test_float16_and_mixed_folders_open_as_float32(tmp_path):
    family, _, _, config, _ = CASES[0]
    f16 = saved(tmp_path, hf_model(family, dtype="float16", **config), name="f16")
    with CModel(f16) as c:
        assert precision_of(c) == FP32
    mixed = saved(tmp_path, hf_model(family, dtype="bfloat16", **config), name="mixed")
    t = weights_of(mixed)
    q = "model.layers.1.self_attn.q_proj.weight"
    t[q] = t[q].float()  # one matrix in float32: the rest cannot be kept as BF16
    rewrite(mixed, t)
    py = llama.load(mixed)
    idx = np.random.default_rng(0).integers(0, py.cfg.vocab, (2, 9))
    with CModel(mixed) as c:
        assert precision_of(c) == FP32
        assert_same_logits(c.forward(idx), py.forward(idx)[0])
    # the vectors' dtype does not matter: float32 norms beside bfloat16 matrices are kept BF16
    vectors = saved(tmp_path, hf_model(family, dtype="bfloat16", **config), name="vectors")
    t = {k: (v.float() if v.ndim == 1 else v) for k, v in weights_of(vectors).items()}
    rewrite(vectors, t)
    py = llama.load(vectors, precision="bf16")
    with CModel(vectors) as c:
        assert precision_of(c) == BF16
        same_as_python(c, py, py.cfg.vocab)


MEASURE = r"""
import sys
from pytfm._core import ffi, lib

before = hwm()
h = ffi.new("pytfm_model **")
assert lib.pytfm_model_open(h, sys.argv[1].encode(), lib.PYTFM_DEVICE_CPU) == 0, \
    ffi.string(lib.pytfm_last_error()).decode()
p = ffi.new("int32_t *")
assert lib.pytfm_model_get_precision(h[0], p) == 0
print(hwm() - before, p[0])
"""


def test_opening_a_bfloat16_folder_takes_its_size_not_twice_it(tmp_path):
    size = big_bf16_folder(tmp_path / "big")
    grown, precision = peak_growth(MEASURE, tmp_path / "big")
    assert precision == BF16
    assert grown <= size + PEAK_MARGIN, f"opening grew the peak by {grown >> 20} MiB, the " \
                                        f"file is {size >> 20} MiB"
    assert grown < 0.6 * 2 * size  # the float32 model would take twice the file
