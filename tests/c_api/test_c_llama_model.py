"""The C model API on Llama-family models (csrc/model/model.c's Llama blocks): a Hugging Face
folder of each family and option (tests/model/test_llama_folders.py's CASES: GQA, MQA, tied and
untied, biases, the q/k norm, llama3 scaling, head_dim != d_model / n_head, sliding windows
shorter than the sequence, float32/bfloat16/float16 files, shards) and a pytfm checkpoint of
arch "llama" give pytfm.nn's logits bit for bit, forward and through sessions, in fp32 and
bf16 (the same kernels in the same order: see test_c_model.py). Folders are told apart by the
one rule (pytfm_folder_arch, which pytfm.folders calls), and a hostile folder is refused by
pytfm_model_open in the words pytfm.folders.load raises."""

import os
import sys

import numpy as np
import pytest
from test_c_model import OK, CModel, assert_same_logits, last_error

from helpers import TESTS
from pytfm import checkpoint, folders, llama
from pytfm._core import ffi, lib
from pytfm.checkpoint import CheckpointError
from pytfm.nn import GPT, GPTConfig

sys.path.insert(0, os.path.join(TESTS, "model"))
from test_llama_folders import (  # noqa: E402  (a skip without torch and transformers)
    CASES,
    HOSTILE_CONFIGS,
    HOSTILE_WEIGHTS,
    edit_config,
    hf_model,
    rewrite,
    saved,
    weights_of,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

IDS = [f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)]


def same_as_python(c, py, vocab, T=13):
    """c's forward of a batch, and a session fed a prompt then one token at a time, are py's
    (a pytfm.nn.GPT) bit for bit; T > every CASE's sliding window."""
    idx = np.random.default_rng(0).integers(0, vocab, (2, T))
    assert_same_logits(c.forward(idx), py.forward(idx)[0])
    caches = py.new_caches(1)
    with c.session() as s:
        np.testing.assert_array_equal(s.feed(idx[0, :5]), py.decode(idx[:1, :5], caches)[0, -1])
        for t in range(5, T):
            tok = np.ascontiguousarray(idx[:1, t:t + 1])
            np.testing.assert_array_equal(s.feed(tok[0]), py.decode(tok, caches)[0, -1])


@pytest.mark.parametrize("family, dtype, shard, config, fields", CASES, ids=IDS)
def test_each_family_opens_as_the_python_model(tmp_path, family, dtype, shard, config, fields):
    path = saved(tmp_path, hf_model(family, dtype=dtype, **config), shard=shard)
    # a bfloat16 folder opens in BF16 (test_c_llama_bf16.py), the others in FP32
    py = llama.load(path, precision="bf16" if dtype == "bfloat16" else "fp32")
    with CModel(path) as c:
        assert c.config.arch == lib.PYTFM_ARCH_LLAMA
        assert c.config.n_params == py.num_params()
        for field in ("n_kv_head", "head_dim", "d_ff", "sliding_window", "qkv_bias", "qk_norm"):
            assert getattr(c.config, field) == getattr(py.cfg, field), field
        same_as_python(c, py, py.cfg.vocab)


@pytest.mark.parametrize("case", [0, 3, 4, 6], ids=[IDS[i] for i in (0, 3, 4, 6)])
def test_bf16_is_the_python_models_bf16(tmp_path, case):
    family, dtype, shard, config, _ = CASES[case]
    path = saved(tmp_path, hf_model(family, dtype=dtype, **config), shard=shard)
    py = llama.load(path, precision="bf16")
    with CModel(path) as c:
        assert lib.pytfm_model_set_precision(c.h, lib.PYTFM_PRECISION_BF16) == OK, last_error()
        same_as_python(c, py, py.cfg.vocab)
        assert lib.pytfm_model_set_precision(c.h, lib.PYTFM_PRECISION_FP32) == OK
        same_as_python(c, llama.load(path), py.cfg.vocab)


def test_a_llama_checkpoint_opens_from_a_file_and_from_memory(tmp_path):
    cfg = GPTConfig(arch="llama", vocab=40, d_model=16, n_layer=2, n_head=4, n_kv_head=2,
                    d_ff=24, max_seq=16, qkv_bias=True, qk_norm=True, sliding_window=6,
                    tie_embeddings=False, seed=3)
    model = GPT(cfg)
    path = str(tmp_path / "llama.safetensors")
    checkpoint.save(path, model)
    with CModel(path) as c:
        same_as_python(c, model, cfg.vocab, T=16)
    with CModel(open(path, "rb").read()) as c:
        same_as_python(c, model, cfg.vocab, T=16)


def arch_of(path):
    arch = ffi.new("int32_t *", -1)
    assert lib.pytfm_folder_arch(str(path).encode(), arch) == OK
    return arch[0]


def test_the_family_of_a_folder_is_one_rule(tmp_path):
    """pytfm_folder_arch tells the readers apart; pytfm.folders.family is that function."""
    path = saved(tmp_path, hf_model("qwen3"))
    assert arch_of(path) == lib.PYTFM_ARCH_LLAMA and folders.family(path) is llama
    cases = [(dict(model_type="gpt2"), lib.PYTFM_ARCH_GPT),
             (dict(model_type=None), lib.PYTFM_ARCH_GPT),  # absent: GPT-2's reader
             (dict(model_type="bert"), lib.PYTFM_ARCH_LLAMA),  # refused by name there
             (dict(model_type=3), lib.PYTFM_ARCH_LLAMA)]
    for change, arch in cases:
        edit_config(path, **change)
        assert arch_of(path) == arch, change
        assert folders.family(path).__name__ == ("pytfm.llama" if arch else "pytfm.gpt2")
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write('{"model_type": "llama",')  # not JSON: GPT-2's reader says so
    assert arch_of(path) == lib.PYTFM_ARCH_GPT
    os.remove(os.path.join(path, "config.json"))
    assert arch_of(path) == lib.PYTFM_ARCH_GPT
    assert arch_of(tmp_path / "nowhere") == lib.PYTFM_ARCH_GPT
    assert lib.pytfm_folder_arch(ffi.NULL, ffi.new("int32_t *")) != OK
    assert last_error() == "pytfm_folder_arch: folder must not be NULL"


def refused_alike(path):
    """pytfm_model_open refuses path, in the words pytfm.folders.load raises."""
    handle = ffi.new("pytfm_model **")
    assert lib.pytfm_model_open(handle, str(path).encode(), lib.PYTFM_DEVICE_CPU) != OK
    assert handle[0] == ffi.NULL
    got = last_error()
    with pytest.raises(CheckpointError) as e:
        folders.load(str(path))
    assert got == str(e.value)


@pytest.mark.parametrize("change, message", HOSTILE_CONFIGS,
                         ids=[str(i) for i in range(len(HOSTILE_CONFIGS))])
def test_a_hostile_config_is_refused_as_python_refuses_it(tmp_path, change, message):
    path = saved(tmp_path, hf_model("llama"))
    edit_config(path, **change)
    refused_alike(path)


@pytest.mark.parametrize("change, message", HOSTILE_WEIGHTS, ids=range(len(HOSTILE_WEIGHTS)))
def test_hostile_weights_are_refused_as_python_refuses_them(tmp_path, change, message):
    path = saved(tmp_path, hf_model("llama"))
    rewrite(path, change(weights_of(path)))
    refused_alike(path)
