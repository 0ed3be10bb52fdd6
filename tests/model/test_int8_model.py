"""A model in precision "int8" (GPT.set_precision("int8"), a load in "int8"): every matrix
but GPT-2's learned positions held as Q8_0 blocks (32 int8 values, one fp16 scale), for
inference. Each product is held to the bound its rounding allows, derived per output from the
block scales (not a tolerance shared by every output); the logits' relative distance to the
float32 model's, a trained model's greedy choices and its perplexity are bounded as stated
below; a load in "int8" quantises what it reads as set_precision("int8") would; what would
train the model or move it off int8 is refused by name, as is a matrix not in whole blocks;
`python -m pytfm perplexity --precision int8` and examples/sample.py run it. The C model's
bits are tests/c_api/test_c_model_int8.py's."""

import importlib.util
import io
import json
import math
import os
import re
import sys
from contextlib import redirect_stdout

import numpy as np
import pytest

from helpers import PEAK_MARGIN, ROOT, TESTS, big_bf16_folder, peak_growth
from pytfm import checkpoint, data, folders, gpt2, llama, ops
from pytfm import perplexity as ppl
from pytfm.__main__ import main as pytfm_main
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig, Linear, param_shapes
from pytfm.optim import AdamW, clip_grad_norm

sys.path.insert(0, os.path.join(TESTS, "model"))
from test_keep_bf16 import MEASURE  # noqa: E402
from test_llama_folders import hf_model, saved  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

GPT2 = GPTConfig(vocab=300, d_model=64, n_layer=2, n_head=4, max_seq=40, pos="learned",
                 tie_embeddings=False, seed=3)
GPT_TIED = GPTConfig(vocab=300, d_model=64, n_layer=2, n_head=4, max_seq=40, seed=7)
LLAMA = GPTConfig(arch="llama", vocab=300, d_model=64, n_layer=2, n_head=4, n_kv_head=2,
                  head_dim=16, d_ff=96, max_seq=40, qkv_bias=True, tie_embeddings=False,
                  seed=4)
LLAMA_TIED = GPTConfig(arch="llama", vocab=300, d_model=64, n_layer=2, n_head=4,
                       n_kv_head=1, d_ff=96, max_seq=40, qk_norm=True, tie_embeddings=True,
                       sliding_window=6, seed=5)
CFGS, IDS = [GPT2, GPT_TIED, LLAMA, LLAMA_TIED], ["gpt2", "gpt-tied", "llama", "llama-tied"]
U = 2.0**-24  # float32's unit roundoff
INT8 = r"holds its matrices in int8 blocks only"


def blocks(a):  # (..., in) -> (..., in / 32, 32)
    return a.reshape(a.shape[:-1] + (-1, 32))


def product_bound(x, wq, scales, w):
    """The most |x·Wqᵀ − x·Wᵀ| (per output, float64) that the int8 product may differ from the
    float32 model's, for x [rows, in], W [out, in] the float32 weights, Wq = q·d their blocks:
      Σ_i |x_i|·|Wq_i − W_i|, each weight within d_w/2 of its block (asserted here too),
    + Σ_i |x_i − x̃_i|·|Wq_i|, x̃ x's own blocks (scale dx = amax/127: within dx/2, and 2^-15
      of dx more where the float32 quotient x/dx rounds across a half),
    + float32 rounding of the sum, (in/16 + 16)·u·Σ|x||Wq| (the kernel's combination order),
      and of the bias added last, 2u·|b|."""
    x, wq, w = (a.astype(np.float64) for a in (x, wq, w))
    dw = np.repeat(scales.view(np.float16).astype(np.float64), 32, axis=-1)  # [out, in]
    assert (np.abs(wq - w) <= dw / 2).all(), "a weight off by more than half its block's step"
    dx = np.repeat(np.abs(blocks(x)).max(-1) / 127, 32, axis=-1)  # [rows, in]
    n_in = x.shape[-1]
    return (np.abs(x) @ (dw / 2).T + (dx / 2 * (1 + 2.0**-15)) @ np.abs(wq).T
            + (n_in / 16 + 16) * U * (np.abs(x) @ np.abs(wq).T))


def linears(model):
    """Each Linear of the model (a tied head too), in _layers' order."""
    return [layer for layer in model._layers() if isinstance(layer, Linear)]


def recording(model):
    """Wrap each Linear's forward so that it records (x, y): -> the list of records, per
    layer, in linears' order."""
    records = []
    for layer in linears(model):
        calls = []
        records.append(calls)

        def forward(x, save=True, layer=layer, calls=calls, inner=layer.forward):
            y = inner(x, save)
            calls.append((x.reshape(-1, x.shape[-1]).copy(), y.reshape(-1, y.shape[-1]).copy()))
            return y
        layer.forward = forward
    return records


@pytest.mark.parametrize("cfg", CFGS, ids=IDS)
def test_every_product_is_within_its_rounding_bound(cfg):
    twin, model = GPT(cfg), GPT(cfg)
    vectors = {n: a.copy() for n, a in twin.params.items() if a.ndim < 2}
    assert model.set_precision("int8") is model and model.kept and model.precision == "int8"
    # what is held: each matrix's blocks, GPT-2's positions and the vectors in float32
    held = [n for n, s in param_shapes(cfg) if len(s) == 2 and n != "transformer.wpe.weight"]
    assert list(model.params8) == held
    for name, (q, scales) in model.params8.items():
        out, n_in = twin.params[name].shape
        assert q.dtype == np.int8 and q.shape == (out, n_in)
        assert scales.dtype == np.uint16 and scales.shape == (out, n_in // 32)
        ref_q, ref_s = ops.quantize_q8(twin.params[name])
        np.testing.assert_array_equal(q, ref_q)
        np.testing.assert_array_equal(scales, ref_s)
    for name, a in vectors.items():
        np.testing.assert_array_equal(model.vectors[name], a)
    if cfg.pos == "learned":
        np.testing.assert_array_equal(model.vectors["transformer.wpe.weight"],
                                      twin.params["transformer.wpe.weight"])
    assert model.num_params() == twin.num_params()
    if cfg.tie_embeddings:  # one set of blocks for the embedding and the head
        assert np.shares_memory(model.lm_head.w, model.wte.w)
        assert np.shares_memory(model.lm_head.scales, model.wte.scales)
    # every product of a forward against the float32 weights, on the inputs it was given
    records = recording(model)
    idx = np.random.default_rng(0).integers(0, cfg.vocab, (2, 13))
    model.forward(idx)
    checked = 0
    for calls, layer32, layer8 in zip(records, linears(twin), linears(model)):
        assert calls, "a linear layer the forward did not use"
        wq = ops.dequantize_q8(layer8.w, layer8.scales)
        for x, y in calls:
            ref = x.astype(np.float64) @ layer32.w.T.astype(np.float64)
            if layer32.b is not None:
                ref += layer32.b
            bound = product_bound(x, wq, layer8.scales, layer32.w)
            if layer32.b is not None:
                bound += 2 * U * np.abs(layer32.b)
            excess = np.abs(y - ref) - bound
            assert (excess <= 0).all(), f"{excess.max():.3g} past the bound"
            checked += 1
    assert checked == len(linears(twin))
    # the embedding's rows: the table's blocks dequantised, each value within d/2
    rows = model.wte.forward(idx, save=False)
    table = twin.wte.w[idx].astype(np.float64)
    step = np.repeat(model.wte.scales.view(np.float16).astype(np.float64)[idx], 32, axis=-1)
    assert (np.abs(rows - table) <= step / 2).all()


# The logits' relative L2 distance to the float32 model's. One product's relative error is
# about the RMS of a weight's rounding (uniform in ±d/2, d = amax/127 of 32 normal values:
# d/sqrt(12) ≈ 0.0048 of the weights' RMS) and of its input's, together ≈ 0.7 %; a path holds
# 2·n_layer + 1 products in series (n_layer = 2 here) whose errors add about in quadrature.
# Measured: 1.0-1.3 % on these random models; the bound is 3 times sqrt(5)·0.7 %.
LOGITS_RTOL = 0.047


@pytest.mark.parametrize("cfg", CFGS, ids=IDS)
def test_the_logits_are_within_the_block_roundings_distance(cfg):
    idx = np.random.default_rng(1).integers(0, cfg.vocab, (2, 17))
    ref = GPT(cfg).forward(idx)[0].astype(np.float64)
    model = GPT(cfg).set_precision("int8")
    got = model.forward(idx)[0]
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err <= LOGITS_RTOL, f"relative L2 {err:.4f}"
    np.testing.assert_array_equal(model.forward(idx)[0], got)  # deterministic
    caches = model.new_caches(2)  # decoding reads the same blocks: each row's logits within
    model.decode(np.ascontiguousarray(idx[:, :9]), caches)  # float rounding (the attention's
    for t in range(9, 17):  # sums in another order can move an input across a block's step)
        step = model.decode(np.ascontiguousarray(idx[:, t:t + 1]), caches)[:, 0]
        assert np.linalg.norm(step - got[:, t]) <= 1e-3 * np.linalg.norm(got[:, t])
    np.testing.assert_array_equal(generate(model, idx[:1, :4], 12, temperature=0.0),
                                  generate(model, idx[:1, :4], 12, temperature=0.0))


def test_a_kept_bf16_model_quantises_its_bf16_values():
    kept = GPT(LLAMA_TIED).keep_bf16()
    twin = GPT(LLAMA_TIED)
    for name, a in twin.params.items():  # float32 masters of the kept model's values
        if a.ndim >= 2:
            twin.params[name] = ops.from_bf16_bits(kept.params16[name])
    kept.set_precision("int8"), twin.set_precision("int8")
    assert kept.params16 is None
    for name, (q, s) in twin.params8.items():
        np.testing.assert_array_equal(kept.params8[name][0], q)
        np.testing.assert_array_equal(kept.params8[name][1], s)
    idx = np.random.default_rng(2).integers(0, 300, (2, 9))
    np.testing.assert_array_equal(kept.forward(idx)[0], twin.forward(idx)[0])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family, config", [
    ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    ("qwen2", {}), ("qwen3", dict(head_dim=16))], ids=["llama-tied", "qwen2", "qwen3"])
def test_a_folder_loads_in_int8_as_its_load_quantised(tmp_path, family, config, dtype):
    path = saved(tmp_path, hf_model(family, dtype=dtype, intermediate_size=64, **config))
    model = llama.load(path, precision="int8")  # a bfloat16 folder: kept, then quantised
    assert model.kept and model.precision == "int8"
    twin = llama.load(path, precision="bf16" if dtype == "bfloat16" else "fp32")
    twin.set_precision("int8")
    for name, (q, s) in twin.params8.items():
        np.testing.assert_array_equal(model.params8[name][0], q)
        np.testing.assert_array_equal(model.params8[name][1], s)
    idx = np.random.default_rng(3).integers(0, model.cfg.vocab, (2, 11))
    np.testing.assert_array_equal(model.forward(idx)[0], twin.forward(idx)[0])
    np.testing.assert_array_equal(folders.load(path, precision="int8").forward(idx)[0],
                                  twin.forward(idx)[0])


def test_a_gpt2_folder_loads_in_int8_as_its_load_quantised(tmp_path):
    gpt2.save(GPT(GPT2), str(tmp_path / "g"))
    model = gpt2.load(str(tmp_path / "g"), precision="int8")
    twin = gpt2.load(str(tmp_path / "g")).set_precision("int8")
    assert model.precision == "int8" and model.vectors["transformer.wpe.weight"].dtype == \
        np.float32
    idx = np.random.default_rng(4).integers(0, 300, (2, 11))
    np.testing.assert_array_equal(model.forward(idx)[0], twin.forward(idx)[0])


def test_loading_a_bfloat16_folder_in_int8_holds_no_float32_copy(tmp_path):
    # the file's BF16 kept as it lies (its size S), then quantised beside it (S/2 of int8 and
    # S/32 of scales, a piece at a time): the peak; a float32 model would take 2 S alone
    size = big_bf16_folder(tmp_path / "big")
    grown, finite = peak_growth(MEASURE, tmp_path / "big", "int8")
    assert finite
    assert grown <= size + size // 2 + size // 32 + PEAK_MARGIN, \
        f"loading in int8 grew the peak by {grown >> 20} MiB, the file is {size >> 20}"


def test_what_would_train_or_unquantise_it_is_refused_by_name(tmp_path):
    model = GPT(LLAMA).set_precision("int8")
    idx = np.zeros((1, 4), np.int64)
    for call, name in [(lambda: model.params, "model.params"), (lambda: model.grads, "model.grads"),
                       (model.backward, "backward()"), (model.zero_grad, "zero_grad()"),
                       (lambda: model.forward(idx, idx, save=True), "forward(save=True)"),
                       (lambda: AdamW(model.params, model.grads), "model.params"),
                       (lambda: checkpoint.save(str(tmp_path / "c"), model, 0), "model.params"),
                       (lambda: folders.save(model, str(tmp_path / "f")), "model.params")]:
        with pytest.raises(RuntimeError, match=rf"{re.escape(name)}.*{INT8}.*in float32"):
            call()
    for other in ("fp32", "bf16"):
        with pytest.raises(ValueError, match=rf"set_precision\('{other}'\).*int8 blocks only"):
            model.set_precision(other)
    with pytest.raises(ValueError, match=r"set_precision\('tf32'\).*int8 blocks only"):
        model.set_precision("tf32")
    with pytest.raises(ValueError, match=r"keep_bf16: .*int8 blocks only"):
        model.keep_bf16()
    with pytest.raises(ValueError, match=r"to\('cuda'\): .*int8 blocks only.*runs on the CPU"):
        model.to("cuda")
    with pytest.raises(ValueError, match=r"precision must be one of fp32, bf16, tf32, int8; "
                                         r"got 'int4'"):
        model.set_precision("int4")
    with pytest.raises(ValueError, match=r"precision must be one of fp32, bf16, tf32; got "
                                         r"'int8'"):  # a product's precision: int8 is none
        ops.linear_forward(np.ones((1, 64), np.float32), np.ones((8, 64), np.float32),
                           precision="int8")
    assert model.set_precision("int8") is model and model.to("cpu") is model
    assert not os.listdir(tmp_path)  # nothing written
    _, loss = model.forward(idx, idx)  # a loss needs no backward: save is off by default
    assert np.isfinite(float(loss))
    path = saved(tmp_path, hf_model("llama", intermediate_size=64))
    with pytest.raises(ValueError, match=r"precision 'int8' runs on the CPU only .*not on cuda"):
        llama.load(path, device="cuda", precision="int8")
    with pytest.raises(ValueError, match=r"precision 'int8' runs on the CPU only"):
        gpt2.load(path, device="cuda", precision="int8")


@pytest.mark.parametrize("cfg, name, shape", [
    (GPTConfig(vocab=64, d_model=48, n_layer=1, n_head=4, max_seq=16),
     "transformer.wte.weight", "[64, 48]"),
    (GPTConfig(arch="llama", vocab=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=48,
               max_seq=16), "model.layers.0.mlp.down_proj.weight", "[32, 48]")],
    ids=["gpt-d48", "llama-ff48"])
def test_a_matrix_not_in_whole_blocks_is_refused_naming_it(cfg, name, shape):
    model = GPT(cfg)
    before = model.params.buffer.copy()
    with pytest.raises(ValueError, match=rf"set_precision\('int8'\): .*blocks of 32 .*"
                                         rf"{re.escape(name)} is {re.escape(shape)}: 48 is not "
                                         r"a multiple of 32"):
        model.set_precision("int8")
    assert model.precision == "fp32" and not model.kept  # unchanged: it still trains
    np.testing.assert_array_equal(model.params.buffer, before)
    model.zero_grad()


# ---- a model trained a little: greedy choices and perplexity --------------------------------

TEXT = b"def f(x):\n    return x + 1\n\nclass A:\n    pass\n" * 100


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A byte-level model trained 60 steps on a little Python (a few seconds), so that its
    logits are far from uniform; its checkpoint and the text's path."""
    text = data.encode(TEXT.decode())
    model = GPT(GPTConfig(vocab=256, d_model=64, n_layer=2, n_head=2, max_seq=64, seed=5))
    opt = AdamW(model.params, model.grads, lr=1e-2, weight_decay=0.0)
    batches = data.Batches(text, 32, 8, seed=5)
    losses = []
    for step in range(60):
        x, y = batches.batch("train", step)
        model.zero_grad()
        losses.append(float(model.forward(x, y)[1]))
        model.backward()
        clip_grad_norm(model.grads, 1.0)
        opt.step()
    assert losses[-1] < 0.5 * losses[0], losses
    folder = tmp_path_factory.mktemp("trained")
    checkpoint.save(str(folder / "model.safetensors"), model, step=60)
    (folder / "text.txt").write_bytes(TEXT[:1500])
    return model, str(folder / "model.safetensors"), str(folder / "text.txt")


def int8_of(path):
    return checkpoint.load(path)[0].set_precision("int8")


def test_greedy_choices_mostly_agree_with_float32s(trained):
    # fp32's greedy continuation of 32 tokens; at each of its positions the int8 model's
    # argmax given the same prefix (teacher-forced: one early disagreement does not decide
    # the rest). Asserted: at least 30 of 32 agree. Measured: 32 of 32.
    model, path, _ = trained
    prompt = np.array([list(b"class ")])
    ref = generate(model, prompt, 32, temperature=0.0)
    int8 = int8_of(path)
    logits = int8.forward(ref[:, :-1])[0][0]
    agree = int((logits[prompt.shape[1] - 1:].argmax(-1) == ref[0, prompt.shape[1]:]).sum())
    assert agree >= 30, f"{agree} of 32 greedy choices agree"
    out = generate(int8, prompt, 32, temperature=0.0)  # deterministic
    np.testing.assert_array_equal(out, generate(int8, prompt, 32, temperature=0.0))


def test_the_perplexity_moves_within_its_logits_bound(trained):
    # log-softmax is 2-Lipschitz in the max norm, so each token's log-probability moves by at
    # most 2·max_j |Δlogit_j| of its row, and ln(perplexity) by at most their mean: that bound,
    # computed from the two models' logits, is asserted, and with it a relative change of at
    # most 2 % (measured: 0.18 %).
    model, path, text = trained
    ids = np.frombuffer(open(text, "rb").read(), np.uint8).astype(np.int64)
    int8 = int8_of(path)
    r32, r8 = ppl.perplexity(model, ids, 64), ppl.perplexity(int8, ids, 64)
    assert r8["tokens"] == r32["tokens"]
    windows = [ids[s:s + 64] for s in range(0, len(ids) - 1, 64) if len(ids[s:s + 64]) > 1]
    moved = 0.0
    for w in windows:
        a, b = model.forward(w[None])[0][0, :-1], int8.forward(w[None])[0][0, :-1]
        moved += 2 * np.abs(a.astype(np.float64) - b).max(-1).sum()
    bound = moved / r32["tokens"]
    delta = abs(math.log(r8["perplexity"]) - math.log(r32["perplexity"]))
    assert delta <= bound * (1 + 1e-6) + 1e-9, (delta, bound)
    assert abs(r8["perplexity"] / r32["perplexity"] - 1) <= 0.02, (r8, r32)


def test_the_perplexity_command_runs_in_int8(trained, capsys):
    _, path, text = trained
    assert pytfm_main(["perplexity", path, text, "--precision", "int8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["precision"] == "int8"
    ids = np.frombuffer(open(text, "rb").read(), np.uint8).astype(np.int64)
    assert out["perplexity"] == ppl.perplexity(int8_of(path), ids)["perplexity"]
    with pytest.raises(SystemExit) as e:
        pytfm_main(["perplexity", path, text, "--precision", "int4"])
    assert e.value.code == 2
    assert "invalid choice: 'int4' (choose from 'fp32', 'bf16', 'int8')" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        pytfm_main(["perplexity", path, text, "--precision", "int8", "--device", "cuda"])
    assert e.value.code == 2
    assert "--precision int8 runs on the CPU only" in capsys.readouterr().err


def test_a_checkpoint_int8_refuses_is_a_usage_error(tmp_path, capsys):
    path = str(tmp_path / "m.safetensors")
    checkpoint.save(path, GPT(GPTConfig(vocab=256, d_model=48, n_layer=1, n_head=4,
                                        max_seq=16)), step=0)
    (tmp_path / "t.txt").write_bytes(b"some text to predict")
    with pytest.raises(SystemExit) as e:
        pytfm_main(["perplexity", path, str(tmp_path / "t.txt"), "--precision", "int8"])
    assert e.value.code == 2
    assert "--precision int8: set_precision('int8'): " in capsys.readouterr().err


def test_sample_py_runs_in_int8(trained):
    _, path, _ = trained
    spec = importlib.util.spec_from_file_location("sample", os.path.join(ROOT, "examples",
                                                                         "sample.py"))
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    out = io.StringIO()
    with redirect_stdout(out):
        assert sample.main([path, "--prompt", "class ", "--tokens", "20", "--temperature", "0",
                            "--precision", "int8"]) == 0
    ref = generate(int8_of(path), np.array([list(b"class ")]), 20, temperature=0.0)
    assert out.getvalue() == data.decode(ref[0]) + "\n"
