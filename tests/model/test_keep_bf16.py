"""A model that holds its matrices in BF16 only, for inference (GPT.keep_bf16, and
pytfm.llama.load(folder, precision="bf16")): its logits, KV-cache decode and greedy tokens are
the float32 model's in precision "bf16", bit for bit, once that model's matrices hold the
same BF16 values; a bfloat16 folder is read into it as it lies, taking the file's size in
memory, not the float32 model's four times it; what would train it is refused by name."""

import os
import re
import sys

import numpy as np
import pytest

from helpers import PEAK_MARGIN, TESTS, big_bf16_folder, peak_growth
from pytfm import checkpoint, folders, gpt2, llama, ops
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig, param_shapes
from pytfm.optim import AdamW

sys.path.insert(0, os.path.join(TESTS, "model"))
from test_llama_folders import CASES, hf_model, rewrite, saved, weights_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

GPT2 = GPTConfig(vocab=300, d_model=48, n_layer=2, n_head=4, max_seq=40, seed=3)
LLAMA = GPTConfig(arch="llama", vocab=300, d_model=48, n_layer=2, n_head=4, n_kv_head=2,
                  head_dim=16, d_ff=80, max_seq=40, qkv_bias=True, tie_embeddings=False,
                  seed=4)
LLAMA_TIED = GPTConfig(arch="llama", vocab=300, d_model=48, n_layer=2, n_head=4,
                       n_kv_head=1, d_ff=80, max_seq=40, qk_norm=True, tie_embeddings=True,
                       sliding_window=6, seed=5)


def rounded_twin(model):
    """A float32 GPT of model's config whose matrices hold their BF16 roundings, in "bf16"."""
    twin = GPT(model.cfg, init=False)
    for name, a in model.params.items():
        twin.params[name] = ops.from_bf16_bits(ops.to_bf16_bits(a)) if a.ndim >= 2 else a
    return twin.set_precision("bf16")


def assert_same_inference(kept, twin, seed=0):
    """The forward logits, the loss, a decode through KV caches and 12 greedy tokens: equal."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, kept.cfg.vocab, (2, 9))
    targets = rng.integers(0, kept.cfg.vocab, (2, 9))
    (a, la), (b, lb) = kept.forward(idx, targets), twin.forward(idx, targets, save=False)
    np.testing.assert_array_equal(a, b)
    assert float(la) == float(lb)
    caches_a, caches_b = kept.new_caches(2), twin.new_caches(2)
    for at in (slice(0, 7), slice(7, 8), slice(8, 9)):  # a prompt, then one token at a time
        new = np.ascontiguousarray(idx[:, at])
        np.testing.assert_array_equal(kept.decode(new, caches_a), twin.decode(new, caches_b))
    np.testing.assert_array_equal(generate(kept, idx[:1, :4], 12, temperature=0.0),
                                  generate(twin, idx[:1, :4], 12, temperature=0.0))


@pytest.mark.parametrize("cfg", [GPT2, LLAMA, LLAMA_TIED], ids=["gpt2", "llama", "tied"])
def test_keep_bf16_infers_as_the_rounded_model_in_bf16(cfg):
    model = GPT(cfg)
    twin = rounded_twin(model)
    matrices = {n: ops.to_bf16_bits(a) for n, a in model.params.items() if a.ndim >= 2}
    vectors = {n: a.copy() for n, a in model.params.items() if a.ndim < 2}
    assert model.keep_bf16() is model and model.kept and model.precision == "bf16"
    assert sorted(model.params16) == sorted(matrices)
    for name, bits in matrices.items():
        assert model.params16[name].dtype == np.uint16
        np.testing.assert_array_equal(model.params16[name], bits)
    for name, a in vectors.items():
        np.testing.assert_array_equal(model.vectors[name], a)
    assert model.num_params() == sum(np.prod(s) for _, s in param_shapes(cfg))
    assert_same_inference(model, twin)
    assert model.keep_bf16() is model  # a second call: nothing to do


def test_the_layers_hold_the_kept_buffers_only():
    model = GPT(LLAMA).keep_bf16()
    buffers = [model.vectors.buffer, *(a.base for a in model.params16.values())]
    for layer in model._layers():
        for attr, value in vars(layer).items():
            if isinstance(value, np.ndarray) and attr in ("w", "b"):
                assert any(np.shares_memory(value, b) for b in buffers), (layer, attr)
            if attr in ("dw", "db"):
                assert value is None, (layer, attr)


@pytest.mark.parametrize("family, dtype, shard, config, fields",
                         [c for c in CASES if c[1] == "bfloat16"],
                         ids=[f"{c[0]}-{c[1]}" for c in CASES if c[1] == "bfloat16"])
def test_a_bfloat16_folder_loads_kept_as_the_float32_load_in_bf16(tmp_path, family, dtype,
                                                                  shard, config, fields):
    path = saved(tmp_path, hf_model(family, dtype=dtype, **config), shard=shard)
    kept = llama.load(path, precision="bf16")
    assert kept.kept and kept.precision == "bf16"
    twin = llama.load(path).set_precision("bf16")  # float32 masters of the same values
    for name, a in twin.params.items():
        if a.ndim >= 2:  # read as they lie: the file's bits
            np.testing.assert_array_equal(ops.from_bf16_bits(kept.params16[name]), a)
    assert_same_inference(kept, twin)


@pytest.mark.parametrize("dtype", ["float32", "float16", "mixed"])
def test_a_folder_not_all_bfloat16_loads_in_bf16_with_float32_parameters(tmp_path, dtype):
    # the C model's rule (pytfm_model_open): only a file whose matrices are all bfloat16 is
    # held in BF16; any other runs precision "bf16" on float32 parameters
    path = saved(tmp_path, hf_model("qwen3", dtype="bfloat16" if dtype == "mixed" else dtype))
    if dtype == "mixed":  # one matrix float32
        tensors = weights_of(path)
        name = "model.layers.1.mlp.up_proj.weight"
        tensors[name] = tensors[name].float()
        rewrite(path, tensors)
    model = llama.load(path, precision="bf16")
    assert not model.kept and model.precision == "bf16"
    twin = llama.load(path).set_precision("bf16")
    for name, a in model.params.items():
        np.testing.assert_array_equal(a, twin.params[name])
    model.zero_grad()  # it trains
    assert folders.load(path, precision="bf16").kept is False


def test_a_gpt2_folder_keeps_float32_until_keep_bf16(tmp_path):
    model = GPT(GPTConfig(vocab=300, d_model=48, n_layer=2, n_head=4, max_seq=40,
                          pos="learned", seed=6))
    gpt2.save(model, str(tmp_path / "g"))
    loaded = gpt2.load(str(tmp_path / "g"), precision="bf16")
    assert not loaded.kept and loaded.precision == "bf16"
    twin = rounded_twin(loaded)
    assert loaded.keep_bf16().params16["transformer.wpe.weight"].dtype == np.uint16
    assert_same_inference(loaded, twin)


def test_what_would_train_it_is_refused_by_name(tmp_path):
    model = GPT(LLAMA).keep_bf16()
    idx = np.zeros((1, 4), np.int64)
    refused = "holds its matrices in BF16 only"
    for call, name in [(lambda: model.params, "model.params"), (lambda: model.grads, "model.grads"),
                       (model.backward, "backward()"), (model.zero_grad, "zero_grad()"),
                       (lambda: model.forward(idx, idx, save=True), "forward(save=True)"),
                       (lambda: AdamW(model.params, model.grads), "model.params"),
                       (lambda: checkpoint.save(str(tmp_path / "c"), model, 0), "model.params"),
                       (lambda: folders.save(model, str(tmp_path / "f")), "model.params")]:
        with pytest.raises(RuntimeError, match=rf"{re.escape(name)}.*{refused}.*in float32"):
            call()
    with pytest.raises(ValueError, match=r"set_precision\('fp32'\).*BF16 only"):
        model.set_precision("fp32")
    assert model.set_precision("bf16") is model
    assert not os.listdir(tmp_path)  # nothing written
    model.forward(idx, idx)  # a loss needs no backward: save is off by default


MEASURE = r"""
import sys
import numpy as np
from pytfm import llama

before = hwm()
model = llama.load(sys.argv[1], precision=sys.argv[2])
grown = hwm() - before
logits, _ = model.forward(np.zeros((1, 4), np.int64))
print(grown, int(np.isfinite(logits).all()))
"""


def test_loading_a_bfloat16_folder_in_bf16_takes_the_files_size(tmp_path):
    size = big_bf16_folder(tmp_path / "big")
    grown = {}
    for precision in ("bf16", "fp32"):
        grown[precision], finite = peak_growth(MEASURE, tmp_path / "big", precision)
        assert finite
    assert grown["bf16"] <= size + PEAK_MARGIN, \
        f"loading in bf16 grew the peak by {grown['bf16'] >> 20} MiB, the file is {size >> 20}"
    assert grown["fp32"] > 1.8 * size  # the float32 model: twice the file, at least


def test_the_bf16_read_checks_its_arguments_and_the_folder(tmp_path):
    from pytfm._core import ffi, lib

    def read(path, n16=None, nv=None, null=False):
        """pytfm_llama_read_bf16 on path's folder: (status, message, the matrices' count)"""
        h = ffi.new("pytfm_llama **")
        assert lib.pytfm_llama_open(h, str(path).encode()) == 0
        try:
            c, all16, n = ffi.new("pytfm_model_config *"), ffi.new("int32_t *"), \
                ffi.new("int64_t *")
            assert lib.pytfm_llama_get_config(h[0], c) == 0
            assert lib.pytfm_llama_bf16_matrices(h[0], all16, n) == 0
            n16 = n[0] if n16 is None else n16
            nv = c.n_params - n[0] if nv is None else nv
            bits = np.zeros(max(n16, 1), np.uint16)
            vectors = np.zeros(max(nv, 1), np.float32)
            st = lib.pytfm_llama_read_bf16(
                h[0], ffi.NULL if null else ffi.from_buffer("uint16_t[]", bits, True), n16,
                ffi.from_buffer("float[]", vectors, True), nv)
            return st, ffi.string(lib.pytfm_last_error()).decode(), all16[0], n[0]
        finally:
            lib.pytfm_llama_close(h[0])

    path = saved(tmp_path, hf_model("qwen2", dtype="bfloat16"))
    st, _, all16, n16 = read(path)
    assert st == 0 and all16 == 1
    for args, message in [(dict(n16=n16 - 1), "n_matrices must be the matrices' values"),
                          (dict(nv=1), "n_vectors must be n_params less the matrices' values"),
                          (dict(null=True), "matrices must not be NULL")]:
        st, error, _, _ = read(path, **args)
        assert st != 0 and message in error, error
    mixed = saved(tmp_path, hf_model("qwen2", dtype="bfloat16"), name="mixed")
    tensors = weights_of(mixed)
    tensors["model.layers.0.self_attn.o_proj.weight"] = \
        tensors["model.layers.0.self_attn.o_proj.weight"].float()
    rewrite(mixed, tensors)
    st, error, all16, _ = read(mixed)
    assert all16 == 0 and st != 0
    assert "model.layers.0.self_attn.o_proj.weight is float32: a read keeping the matrices in " \
           "BF16 needs every matrix in bfloat16" in error, error
