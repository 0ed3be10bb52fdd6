"""GPT-2 in pytfm against transformers' GPT2LMHeadModel: learned positions, Hugging Face folders
in and out (pytfm.gpt2), greedy continuations, fine-tuning step for step against a torch AdamW,
the example scripts on a GPT-2 folder, hostile folders. The random GPT-2 models are
transformers' own, built from a seed and saved offline (gpt2_oracle.py: without transformers
these tests skip, under CI they fail)."""

import json
import os
import struct
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest
from gpt2_oracle import greedy, logits_of, random_gpt2, transformers

from helpers import ROOT
from pytfm import checkpoint, gpt2
from pytfm.checkpoint import CheckpointError
from pytfm.data import Batches
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig, param_shapes
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr
from pytfm.tokenizer import TokenizerError
from pytfm.tokenizer import train as train_tokenizer

EXAMPLES = os.path.join(ROOT, "examples")
TINY = dict(vocab_size=100, n_positions=40, n_embd=24, n_layer=2, n_head=3)


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def folder_of(tmp_path, name="g2", seed=0, **config):
    """A random GPT-2 of transformers saved in tmp_path/name -> (its path, the model)."""
    model = random_gpt2(seed, **{**TINY, **config})
    path = tmp_path / name
    model.save_pretrained(str(path))
    return str(path), model


# ---- learned positions ------------------------------------------------------------------------


def test_learned_positions_are_a_parameter_after_the_embedding():
    cfg = GPTConfig(vocab=50, d_model=24, n_layer=2, n_head=3, max_seq=16, pos="learned")
    model = GPT(cfg)
    names = list(model.params)
    assert names[:2] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert model.params["transformer.wpe.weight"].shape == (16, 24)
    assert list(param_shapes(cfg)) == [(k, p.shape) for k, p in model.params.items()]


def test_learned_positions_decode_as_the_forward_pass():
    cfg = GPTConfig(vocab=50, d_model=24, n_layer=2, n_head=3, max_seq=16, pos="learned", seed=1)
    model = GPT(cfg)
    idx = np.random.default_rng(0).integers(0, 50, (2, 10))
    logits = model.forward(idx)[0]
    caches = model.new_caches(2)
    parts = [model.decode(np.ascontiguousarray(idx[:, a:b]), caches) for a, b in ((0, 4), (4, 10))]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), logits, rtol=1e-5, atol=1e-6)


def test_the_loss_and_every_gradient_are_transformers(tmp_path):
    """One backward pass of a random GPT-2, learned positions' gradient included (positions
    past the sequence get none)."""
    import torch
    import torch.nn.functional as F

    path, hf = folder_of(tmp_path)
    model = gpt2.load(path)
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 100, (3, 30)), rng.integers(0, 100, (3, 30))
    y[0, :5] = -1  # ignored targets
    model.zero_grad()
    loss = float(model.forward(x, y)[1])
    model.backward()
    logits = hf(torch.from_numpy(x)).logits
    tloss = F.cross_entropy(logits.reshape(-1, 100), torch.from_numpy(y).ravel(), ignore_index=-1)
    tloss.backward()
    assert abs(loss - tloss.item()) <= 1e-5 * tloss.item()
    for name, p in hf.named_parameters():
        ours = model.grads[name].T if name.endswith(gpt2._CONV1D) else model.grads[name]
        assert rel_err(ours, p.grad.numpy()) <= 1e-4, (name, rel_err(ours, p.grad.numpy()))
    assert not model.grads["transformer.wpe.weight"][30:].any()


def test_a_learned_positions_checkpoint_loads_as_before(tmp_path):
    model = GPT(GPTConfig(vocab=30, d_model=16, n_layer=1, n_head=2, max_seq=8, pos="learned"))
    checkpoint.save(str(tmp_path / "m.safetensors"), model)
    again, _, _ = checkpoint.load(str(tmp_path / "m.safetensors"))
    assert again.cfg == model.cfg
    for name, p in model.params.items():
        np.testing.assert_array_equal(again.params[name], p)


# ---- logits against transformers --------------------------------------------------------------


@pytest.mark.parametrize("config", [
    TINY,  # 3 heads of 8
    dict(vocab_size=71, n_positions=17, n_embd=20, n_layer=3, n_head=5),  # 5 heads of 4
    dict(vocab_size=33, n_positions=9, n_embd=7, n_layer=1, n_head=7),  # 7 heads of 1
    dict(vocab_size=257, n_positions=64, n_embd=48, n_layer=2, n_head=1),  # one head of 48
    dict(vocab_size=90, n_positions=24, n_embd=32, n_layer=2, n_head=4, tie_word_embeddings=False),
    dict(vocab_size=90, n_positions=24, n_embd=32, n_layer=2, n_head=4, n_inner=128,
         activation_function="gelu_pytorch_tanh"),
])
def test_logits_are_transformers(tmp_path, config):
    path, hf = folder_of(tmp_path, seed=len(str(config)), **config)
    model = gpt2.load(path)
    P, V = config["n_positions"], config["vocab_size"]
    rng = np.random.default_rng(0)
    for B, T in ((1, 1), (2, 5), (3, P)):
        idx = rng.integers(0, V, (B, T))
        ours, theirs = model.forward(idx)[0], logits_of(hf, idx)
        assert rel_err(ours, theirs) <= 1e-5, (B, T, rel_err(ours, theirs))
        caches = model.new_caches(B)
        steps = [model.decode(np.ascontiguousarray(idx[:, t:t + 1]), caches) for t in range(T)]
        assert rel_err(np.concatenate(steps, axis=1), theirs) <= 1e-5


def test_the_gpt2model_layout_and_stored_buffers_load_by_rule(tmp_path):
    """GPT2Model's names (h.0..., no lm_head) with the buffers old checkpoints carry
    (attn.bias, the causal mask; attn.masked_bias), and a tied lm_head.weight stored equal to
    the embedding: the same model."""
    path, hf = folder_of(tmp_path)
    tensors, _ = checkpoint.load_file(os.path.join(path, "model.safetensors"))
    P = TINY["n_positions"]
    bare = {k[len("transformer."):]: v for k, v in tensors.items()}
    for i in range(TINY["n_layer"]):
        bare[f"h.{i}.attn.bias"] = np.tril(np.ones((P, P), np.float32))[None, None]
        bare[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    other = tmp_path / "bare"
    other.mkdir()
    (other / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    checkpoint.save_file(str(other / "model.safetensors"), bare, {"format": "pt"})
    idx = np.random.default_rng(1).integers(0, TINY["vocab_size"], (2, 11))
    want = logits_of(hf, idx)
    assert rel_err(gpt2.load(str(other)).forward(idx)[0], want) <= 1e-5
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"]
    checkpoint.save_file(str(other / "model.safetensors"), tensors, {"format": "pt"})
    assert rel_err(gpt2.load(str(other)).forward(idx)[0], want) <= 1e-5
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1
    checkpoint.save_file(str(other / "model.safetensors"), tensors, {"format": "pt"})
    with pytest.raises(CheckpointError, match="lm_head.weight differs from the embedding"):
        gpt2.load(str(other))


def test_a_sharded_folder_loads(tmp_path):
    path, hf = folder_of(tmp_path)
    tensors, _ = checkpoint.load_file(os.path.join(path, "model.safetensors"))
    names = sorted(tensors)
    shards = tmp_path / "sharded"
    shards.mkdir()
    (shards / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    wmap = {}
    for k, part in enumerate((names[:10], names[10:])):
        file = f"model-{k + 1:05d}-of-00002.safetensors"
        checkpoint.save_file(str(shards / file), {n: tensors[n] for n in part}, {"format": "pt"})
        wmap.update({n: file for n in part})
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    idx = np.random.default_rng(2).integers(0, 100, (1, 9))
    assert rel_err(gpt2.load(str(shards)).forward(idx)[0], logits_of(hf, idx)) <= 1e-5


# ---- generation ----------------------------------------------------------------------------------


def test_greedy_continuations_are_transformers_for_100_tokens(tmp_path):
    path, hf = folder_of(tmp_path, n_positions=128, scale=3.0)
    model = gpt2.load(path)
    for prompt in ([[5]], [[17, 3, 99, 42]], [[1, 2, 3], [4, 5, 6]]):
        ours = generate(model, np.array(prompt), 100, temperature=0)
        np.testing.assert_array_equal(ours, greedy(hf, prompt, 100))
        assert len(set(ours[0, -100:].tolist())) >= 3  # not one token over and over


def run(script, *args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT)
    start = time.perf_counter()
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *map(str, args)],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    return r, time.perf_counter() - start


@pytest.fixture
def gpt2_folder(tmp_path):
    """A random GPT-2 of transformers with a BPE tokenizer of its vocabulary's size beside it
    (trained here on a prose text, so no vocabulary download is needed) -> (folder, model,
    tokenizer, the text)."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    tok = train_tokenizer(text, 384)
    path, hf = folder_of(tmp_path, vocab_size=len(tok), n_positions=160, n_embd=32, n_layer=2,
                         n_head=4, bos_token_id=tok.eot, eos_token_id=tok.eot, scale=3.0)
    tok.save(path)
    (tmp_path / "story.txt").write_text(text, encoding="utf-8")
    return path, hf, tok, str(tmp_path / "story.txt")


@pytest.mark.parametrize("flags", [["--temperature", "0"], []], ids=["greedy", "default"])
def test_sample_py_continues_a_prompt_from_a_folder_as_transformers_does(gpt2_folder, tmp_path,
                                                                         flags):
    """--temperature 0, and no --temperature at all: on a folder the default is greedy, as
    transformers' generate() decodes unless the generation config asks for sampling."""
    path, hf, tok, _ = gpt2_folder
    prompt = "Hello, my name is"
    theirs = greedy(hf, [tok.encode(prompt)], 40)[0]
    r, _ = run("sample.py", path, "--prompt", prompt, "--tokens", "40", *flags, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == tok.decode(theirs) + "\n"


# ---- folders in and out --------------------------------------------------------------------------


def test_a_round_trip_through_transformers_is_identical(tmp_path):
    """pytfm -> folder -> transformers -> folder -> pytfm: the same bits, and transformers'
    logits of pytfm's folder are pytfm's."""
    tf = transformers()
    cfg = GPTConfig(vocab=77, d_model=30, n_layer=2, n_head=5, max_seq=20, pos="learned")
    for tie in (True, False):
        model = GPT(GPTConfig(**{**cfg.__dict__, "tie_embeddings": tie}))
        for p in model.params.values():  # wider than the init: LayerNorms away from 1 and 0
            p += np.random.default_rng(p.size).normal(0, 0.3, p.shape).astype(np.float32)
        gpt2.save(model, str(tmp_path / "a"))
        hf = tf.GPT2LMHeadModel.from_pretrained(str(tmp_path / "a")).eval()
        idx = np.random.default_rng(3).integers(0, 77, (2, 20))
        assert rel_err(logits_of(hf, idx), model.forward(idx)[0]) <= 1e-5
        hf.save_pretrained(str(tmp_path / "b"))
        back = gpt2.load(str(tmp_path / "b"))
        assert back.cfg == model.cfg  # seed 0: a folder keeps no initialisation seed
        for name, p in model.params.items():
            np.testing.assert_array_equal(back.params[name], p, err_msg=name)


# config.json of the Hugging Face repository openai-community/gpt2, as published
GPT2_124M_CONFIG = """{
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
  "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
  "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
  "summary_type": "cls_index", "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
}"""


def test_the_published_gpt2_config_is_read_as_124m(tmp_path):
    """Real GPT-2's config.json needs nothing beyond the rules: every field is known."""
    (tmp_path / "config.json").write_text(GPT2_124M_CONFIG)
    cfg = gpt2.read_config(str(tmp_path))
    assert cfg == GPTConfig(vocab=50257, d_model=768, n_layer=12, n_head=12, max_seq=1024,
                            pos="learned", tie_embeddings=True)
    assert gpt2.memory_plan(cfg, optimizer=False)["params"] == 4 * 124_439_808


def test_a_folder_holds_learned_positions_only(tmp_path):
    with pytest.raises(ValueError, match="learned positions .* has pos='rope'"):
        gpt2.save(GPT(GPTConfig(vocab=10, d_model=8, n_layer=1, n_head=2, max_seq=4)),
                  str(tmp_path / "x"))


# ---- hostile folders -----------------------------------------------------------------------------


def edited(tmp_path, path, config=None, tensors=None, drop=()):
    """A copy of the folder at path with config.json's fields updated by config (a value None
    removes the field; a str replaces the whole text) and the tensors by tensors."""
    out = tmp_path / "edited"
    out.mkdir(exist_ok=True)
    doc = json.load(open(os.path.join(path, "config.json")))
    if isinstance(config, str):
        (out / "config.json").write_text(config)
    else:
        for k, v in (config or {}).items():
            if v is None:
                doc.pop(k, None)
            else:
                doc[k] = v
        (out / "config.json").write_text(json.dumps(doc))
    stored, _ = checkpoint.load_file(os.path.join(path, "model.safetensors"))
    stored.update(tensors or {})
    for k in drop:
        del stored[k]
    checkpoint.save_file(str(out / "model.safetensors"), stored, {"format": "pt"})
    return str(out)


W = "transformer.h.0.attn.c_attn.weight"


# (the edit of the folder, what the refusal says): through gpt2.load here, through the C
# model API's pytfm_model_open in tests/c_api/test_c_gpt2.py (the one reader, the same words)
HOSTILE = [
    (dict(config='{"n_embd": 24,'), r"config.json: not valid JSON"),
    (dict(config='{"n_embd": 24, "n_embd": 24}'), r"config.json: .*duplicate"),
    (dict(config="[1, 2]"), r"config.json: a JSON array, not an object"),
    (dict(config={"n_embd": None}), r"config.json: has no n_embd"),
    (dict(config={"n_layer": 2.0}), r"n_layer must be a positive int, got 2.0"),
    (dict(config={"n_head": 0}), r"n_head must be a positive int, got 0"),
    (dict(config={"n_head": 5}), r"d_model \(24\) must be a multiple of n_head \(5\)"),
    (dict(config={"n_ctx": 41}), r"n_ctx \(41\) and n_positions \(40\) disagree"),
    (dict(config={"activation_function": "relu"}), r"activation_function is 'relu'"),
    (dict(config={"n_inner": 72}), r"n_inner is 72"),
    (dict(config={"layer_norm_epsilon": 1e-6}), r"layer_norm_epsilon is 1e-06"),
    (dict(config={"scale_attn_weights": False}), r"scale_attn_weights is False"),
    (dict(config={"scale_attn_by_inverse_layer_idx": True}), r"scale_attn_by_inverse_layer_idx"),
    (dict(config={"add_cross_attention": True}), r"add_cross_attention is True"),
    (dict(config={"model_type": "llama"}), r"model_type is 'llama'"),
    (dict(config={"rope_theta": 10000.0}), r"unknown field 'rope_theta'"),
    (dict(config={"n_embd": 32, "n_head": 4}), r"transformer.wte.weight is float32\[100, 24\], "
     r"config.json needs float32\[100, 32\]"),
    (dict(config={"n_layer": 3}), r"tensor transformer.h.2.ln_1.weight is missing"),
    (dict(config={"n_layer": 10**12}), r"tensor transformer.h.2.ln_1.weight is missing"),
    (dict(config={"vocab_size": 2**40}), r"wte.weight is float32\[100, 24\], config.json needs "
     r"float32\[1099511627776, 24\]"),
    (dict(config={"n_positions": 2**62, "n_ctx": None}), r"wpe.weight is float32\[40, 24\]"),
    (dict(config={"tie_word_embeddings": False}), r"tensor lm_head.weight is missing"),
    (dict(tensors={W: np.zeros((72, 24), np.float32)}), rf"{W} is float32\[72, 24\], config.json "
     r"needs float32\[24, 72\]"),
    (dict(tensors={W: np.zeros((24, 72), np.int64)}), rf"{W} is int64\[24, 72\]"),
    (dict(drop=["transformer.ln_f.bias"]), r"tensor transformer.ln_f.bias is missing"),
    (dict(tensors={"transformer.h.0.attn.extra": np.zeros(3, np.float32)}),
     r"unexpected tensor transformer.h.0.attn.extra"),
    (dict(tensors={"transformer.h.7.attn.bias": np.zeros((1, 1, 40, 40), np.float32)}),
     r"unexpected tensor transformer.h.7.attn.bias"),
    (dict(tensors={"transformer.h.0.attn.bias": np.zeros((1, 1, 4, 4), np.float32)}),
     r"transformer.h.0.attn.bias is float32\[1, 1, 4, 4\], config.json needs "
     r"float32\[1, 1, 40, 40\]"),
    (dict(tensors={"h.0.ln_1.weight": np.zeros(24, np.float32)}), r"unexpected tensor h.0.ln_1"),
]


@pytest.mark.parametrize("change, message", HOSTILE)
def test_hostile_folders_are_refused_naming_the_file_before_anything_is_allocated(
        tmp_path, change, message):
    path, _ = folder_of(tmp_path)
    bad = edited(tmp_path, path, **change)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=message) as e:
            gpt2.load(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert bad in str(e.value) and ("config.json" in str(e.value) or
                                    "model.safetensors" in str(e.value))
    assert peak < 2**20, f"{peak:,} bytes allocated before the folder was refused"


def test_missing_files_and_f16_weights_are_refused(tmp_path):
    path, _ = folder_of(tmp_path)
    with pytest.raises(CheckpointError, match="not a folder"):
        gpt2.load(os.path.join(path, "config.json"))
    os.rename(os.path.join(path, "model.safetensors"), os.path.join(path, "pytorch_model.bin"))
    with pytest.raises(CheckpointError, match="model.safetensors: missing.*pytorch_model.bin"):
        gpt2.load(path)
    os.remove(os.path.join(path, "config.json"))
    with pytest.raises(CheckpointError, match="config.json: missing"):
        gpt2.load(path)
    header = json.dumps({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.json").write_text(json.dumps(TINY))
    (half / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(CheckpointError, match="unsupported dtype"):
        gpt2.load(str(half))


def test_an_index_that_points_outside_the_folder_is_refused(tmp_path):
    path, _ = folder_of(tmp_path)
    os.remove(os.path.join(path, "model.safetensors"))
    for file in ("../model.safetensors", "/etc/passwd", "x.bin"):
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {"transformer.wte.weight": file}}, f)
        with pytest.raises(CheckpointError, match="not a .safetensors file of the folder"):
            gpt2.load(path)


def test_a_model_larger_than_the_memory_is_refused_before_it_is_built(tmp_path, monkeypatch):
    path, _ = folder_of(tmp_path)
    monkeypatch.setattr(gpt2, "available_memory", lambda: 1000)
    with pytest.raises(MemoryError, match=r"needs 0.00 GiB \(params 0.00, grads 0.00 GiB\), more "
                       "than the 0.00 GiB"):
        gpt2.load(path)


def test_a_tokenizer_whose_vocabulary_and_merges_disagree_is_refused(gpt2_folder):
    path = gpt2_folder[0]
    lines = open(os.path.join(path, "merges.txt"), encoding="utf-8").read().splitlines()
    with open(os.path.join(path, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines[:-1]) + "\n")  # the last merge's token has no merge now
    with pytest.raises(TokenizerError, match=r"merges.txt: token .* is made by no merge"):
        gpt2.load_tokenizer(path)


def test_the_memory_plan_of_a_124m_step():
    cfg = GPTConfig(vocab=50257, d_model=768, n_layer=12, n_head=12, max_seq=1024,
                    pos="learned")
    plan = gpt2.memory_plan(cfg, batch=4, context=256)
    assert plan["params"] == 4 * 124_439_808 == plan["grads"]
    assert plan["adamw"] == 2 * plan["params"]
    assert 1.0e9 < plan["activations"] < 1.2e9 and 3.0e9 < plan["total"] < 3.2e9


# ---- fine-tuning ---------------------------------------------------------------------------------


def test_fifty_fine_tuning_steps_match_a_torch_adamw_on_the_transformers_model(tmp_path):
    """The same random GPT-2, the same batches, the same AdamW (decay on the matrices only),
    clipping and schedule: pytfm's losses and final weights are torch's to 1e-4."""
    import torch
    import torch.nn.functional as F

    path, hf = folder_of(tmp_path, n_positions=32, scale=1.0)
    hf.train()
    model = gpt2.load(path)
    hyper = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = AdamW(model.params, model.grads, lr=1e-3, **hyper)
    named = dict(hf.named_parameters())
    topt = torch.optim.AdamW([{"params": [p for p in named.values() if p.ndim >= 2],
                               "weight_decay": 0.1},
                              {"params": [p for p in named.values() if p.ndim < 2],
                               "weight_decay": 0.0}], lr=1e-3, betas=hyper["betas"], eps=1e-8)
    tokens = np.random.default_rng(5).integers(0, 100, 5000)
    batches = Batches(tokens, 32, 4, seed=1)
    for step in range(50):
        lr = cosine_lr(step, 1e-3, 5, 50, min_lr=1e-4)
        x, y = batches.batch("train", step)
        model.zero_grad()
        loss = float(model.forward(x, y)[1])
        model.backward()
        clip_grad_norm(model.grads, 1.0)
        opt.step(lr)
        for group in topt.param_groups:
            group["lr"] = lr
        topt.zero_grad()
        logits = hf(torch.from_numpy(x)).logits
        tloss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).ravel())
        tloss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        topt.step()
        assert abs(loss - tloss.item()) <= 1e-4 * tloss.item(), (step, loss, tloss.item())
    C = TINY["n_embd"]
    for name, p in named.items():
        ours = model.params[name].T if name.endswith(gpt2._CONV1D) else model.params[name]
        theirs = p.detach().numpy()
        if name.endswith("attn.c_attn.bias"):  # the keys' bias has no gradient (each query adds
            # q·b to all its scores alike): AdamW moves it by rounding noise, differently in each
            assert np.abs(ours[C:2 * C] - theirs[C:2 * C]).max() <= 50 * 1e-3
            ours, theirs = np.delete(ours, np.s_[C:2 * C]), np.delete(theirs, np.s_[C:2 * C])
        assert rel_err(ours, theirs) <= 1e-4, (name, rel_err(ours, theirs))


def test_train_tiny_fine_tunes_a_folder_into_a_folder_transformers_reads(gpt2_folder, tmp_path):
    path, _, tok, text = gpt2_folder
    r, _ = run("train_tiny.py", "--init-from", path, "--text", text, "--steps", "6", "--context",
               "64", "--batch", "2", "--lr", "3e-4", "--eval-every", "3", "--sample-tokens", "5",
               "--out", "tuned", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"GPT from {path}" in r.stdout and "step     6/6" in r.stdout
    tuned = str(tmp_path / "tuned")
    files = {"config.json", "model.safetensors", "vocab.json", "merges.txt"}
    assert files <= set(os.listdir(tuned))
    model = gpt2.load(tuned)
    hf = transformers().GPT2LMHeadModel.from_pretrained(tuned).eval()
    idx = np.array([tok.encode("A small transformer library")])
    assert rel_err(model.forward(idx)[0], logits_of(hf, idx)) <= 1e-5
    before = gpt2.load(path)
    assert any(not np.array_equal(before.params[k], p) for k, p in model.params.items())


def test_train_tiny_refuses_a_fine_tuning_run_that_does_not_fit_the_memory(gpt2_folder,
                                                                          tmp_path):
    path, _, _, text = gpt2_folder
    r, seconds = run("train_tiny.py", "--init-from", path, "--text", text, "--batch", "100000000",
                     "--context", "160", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "a training step needs" in r.stderr and "activations" in r.stderr, r.stderr
    assert seconds < 30 and not os.path.exists(tmp_path / "out" / "model.safetensors")
    r, _ = run("train_tiny.py", "--init-from", path, "--text", text, "--context", "161",
               cwd=tmp_path)
    assert r.returncode == 2 and "--context 161 is longer than the 160 positions" in r.stderr
    r, _ = run("train_tiny.py", "--init-from", path, "--tokenizer", "bpe:300", cwd=tmp_path)
    assert r.returncode == 2 and "the folder's own tokenizer" in r.stderr


def test_train_tiny_trains_a_bpe_tokenizer_and_sample_py_finds_it(tmp_path):
    r, _ = run("train_tiny.py", "--tokenizer", "bpe:1024", "--steps", "3", "--eval-every", "3",
               "--d-model", "32", "--n-layer", "1", "--n-head", "2", "--context", "32",
               "--sample-tokens", "4", "--out", "bpe", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "trained a byte-level BPE of 1,024 tokens" in r.stdout
    assert "tokens (a vocabulary of 1,024)" in r.stdout
    out = tmp_path / "bpe"
    assert {"model.safetensors", "vocab.json", "merges.txt"} <= set(os.listdir(out))
    model, _, _ = checkpoint.load(str(out / "model.safetensors"))
    assert model.cfg.vocab == 1024
    r, _ = run("sample.py", str(out / "model.safetensors"), "--prompt", "import os",
               "--tokens", "5", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("import os"), r.stderr
    r, _ = run("train_tiny.py", "--tokenizer", "bpe:1024", "--steps", "4", "--eval-every", "3",
               "--d-model", "32", "--n-layer", "1", "--n-head", "2", "--context", "32",
               "--sample-tokens", "0", "--out", "bpe", "--resume", cwd=tmp_path)
    assert r.returncode == 0 and "resumed" in r.stdout, r.stderr
    for bad, words in (("bpe:12", "N in [257,"), ("bpe", "'bytes' or 'bpe:N'"),
                       ("words", "'bytes' or 'bpe:N'")):
        r, _ = run("train_tiny.py", "--tokenizer", bad, cwd=tmp_path)
        assert r.returncode == 2 and words in r.stderr, r.stderr
