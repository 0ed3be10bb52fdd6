"""The Llama-family model of pytfm.nn (GPT with arch "llama") against transformers: logits,
every gradient of a training step, greedy generation and KV-cache decoding, a checkpoint round
trip, and BF16 products. The oracles are random-weight models transformers builds offline
(LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, eager attention),
whose state_dict loads into model.params by name: the layouts share transformers' names.

Tolerances. Logits: float32 within 1e-4 in relative L2 of transformers' float64 run of the same
weights. Gradients: the same bound, against float64 autograd: every gradient here is a chain
of float32 products and sums of at most a few hundred terms (B·T = 48 positions, widths <= 64),
each rounding at 2^-24 ≈ 6e-8, so a correct float32 computation lands near 1e-6, and a wrong
term (a missing RoPE, a misplaced head, a gradient written instead of accumulated) at 1e-2 or
more."""

import numpy as np
import pytest
from gpt2_oracle import transformers

from helpers import BF16_FALLBACKS, BF16_PATHS, bf16_path
from pytfm import checkpoint
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig

SMALL = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=40, max_position_embeddings=64,
             rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
# (transformers' class, its config's fields past SMALL): each family and each option
CASES = {
    "llama-gqa": ("Llama", {}),
    "llama-mqa-tied": ("Llama", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "llama-mha-llama3": ("Llama", dict(num_key_value_heads=4, rope_parameters=LLAMA3)),
    "llama-head-dim": ("Llama", dict(head_dim=12)),
    "qwen2": ("Qwen2", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3": ("Qwen3", dict(head_dim=16)),
    "mistral-window": ("Mistral", dict(sliding_window=5)),
}


def config_of(c):
    """The GPTConfig of a transformers config c"""
    rope = c.rope_parameters
    llama3 = rope["rope_type"] == "llama3"
    scaling = {f"rope_{k}": float(rope[key]) if llama3 else 0.0 for k, key in (
        ("factor", "factor"), ("low_freq_factor", "low_freq_factor"),
        ("high_freq_factor", "high_freq_factor"),
        ("original_max_pos", "original_max_position_embeddings"))}
    return GPTConfig(
        vocab=c.vocab_size, d_model=c.hidden_size, n_layer=c.num_hidden_layers,
        n_head=c.num_attention_heads, max_seq=c.max_position_embeddings,
        tie_embeddings=bool(c.tie_word_embeddings), arch="llama",
        n_kv_head=c.num_key_value_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        d_ff=c.intermediate_size, norm_eps=c.rms_norm_eps, rope_theta=rope["rope_theta"],
        rope_scaling="llama3" if llama3 else None, **scaling,
        qkv_bias=c.model_type == "qwen2",  # (Llama's attention_bias would bias o_proj too)
        qk_norm=c.model_type == "qwen3",
        sliding_window=c.sliding_window if c.model_type == "mistral" else 0)


def pair(case, seed=0, **fields):
    """(transformers' model in float32, pytfm's GPT of the same weights) for CASES[case]: every
    parameter drawn from a seeded normal (norm weights around 1), eval mode."""
    tf = transformers()
    import torch

    family, extra = CASES[case]
    config = getattr(tf, f"{family}Config")(**{**SMALL, **extra, **fields})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    hf = getattr(tf, f"{family}ForCausalLM")(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=g) * (0.1 if p.ndim >= 2 else 0.05)
            p.copy_(noise + 1.0 if name.endswith("norm.weight") else noise)
    model = GPT(config_of(config))
    state = {k: v.numpy() for k, v in hf.state_dict().items()}
    assert set(model.params) <= set(state), set(model.params) - set(state)
    model.params.copy_from(state)
    return hf, model


def rel_err(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(ours - ref) / np.linalg.norm(ref)


def tokens(vocab, shape, seed):
    return np.random.default_rng(seed).integers(0, vocab, shape)


@pytest.mark.parametrize("case", CASES)
def test_logits_are_transformers(case):
    import torch

    hf, model = pair(case)
    idx = tokens(model.cfg.vocab, (2, 24), 1)
    with torch.no_grad():
        ref = hf.double()(torch.from_numpy(idx)).logits.numpy()
    err = rel_err(model.forward(idx)[0], ref)
    assert err <= 1e-4, err


@pytest.mark.parametrize("case", CASES)
def test_every_gradient_of_a_step_is_autograds(case):
    import torch
    import torch.nn.functional as F

    hf, model = pair(case, seed=1)
    hf.double()
    vocab = model.cfg.vocab
    x, y = tokens(vocab, (2, 24), 2), tokens(vocab, (2, 24), 3)
    y[1, :3] = -1  # ignored targets
    model.zero_grad()
    model.grads.buffer.fill(0.5)  # the gradients accumulate: start from something
    _, loss = model.forward(x, y)
    model.backward()
    logits = hf(torch.from_numpy(x)).logits
    ref = F.cross_entropy(logits.reshape(-1, vocab), torch.from_numpy(y).ravel(),
                          ignore_index=-1)
    ref.backward()
    assert abs(float(loss) - ref.item()) <= 1e-5 * ref.item()
    grads = dict(hf.named_parameters())
    for name in model.params:
        err = rel_err(model.grads[name] - 0.5, grads[name].grad.numpy())
        assert err <= 1e-4, (name, err)


def test_the_flat_buffer_holds_q_k_v_as_one_matrix():
    """k and v's weights follow q's with no padding (d_model 5: no size is a multiple of the
    alignment), so the joined product reads the parameters themselves."""
    cfg = GPTConfig(vocab=7, d_model=5, n_layer=1, n_head=3, n_kv_head=1, head_dim=2, d_ff=3,
                    arch="llama", qkv_bias=True)
    model = GPT(cfg)
    attn, p = model.blocks[0].attn, "model.layers.0.self_attn."
    for name, part in (("weight", attn.qkv.w), ("bias", attn.qkv.b)):
        for which, rows in (("q", slice(0, 6)), ("k", slice(6, 8)), ("v", slice(8, 10))):
            assert np.shares_memory(part[rows], model.params[f"{p}{which}_proj.{name}"])
            assert (part[rows] == model.params[f"{p}{which}_proj.{name}"]).all()
    assert attn.qkv.w.shape == (10, 5) and attn.qkv.b.shape == (10,)


def test_a_checkpoint_round_trip_keeps_the_model(tmp_path):
    _, model = pair("llama-mha-llama3", seed=2)
    path = str(tmp_path / "llama.safetensors")
    checkpoint.save(path, model)
    again = checkpoint.load(path)[0]
    assert again.cfg == model.cfg
    for name in model.params:
        assert (again.params[name] == model.params[name]).all(), name
    idx = tokens(model.cfg.vocab, (1, 9), 3)
    assert (again.forward(idx)[0] == model.forward(idx)[0]).all()


@pytest.mark.parametrize("case", ["llama-gqa", "llama-mqa-tied", "qwen3", "mistral-window"])
def test_decoding_through_the_caches_is_the_forward_pass(case):
    """A prompt fed in pieces (6 tokens, then 1, then 8) through KV caches of n_kv_head heads
    (the window's keys only, with Mistral's) gives the full forward pass's logits."""
    _, model = pair(case, seed=3)
    idx = tokens(model.cfg.vocab, (2, 15), 4)
    full = model.forward(idx)[0]
    caches = model.new_caches(2)
    assert caches[0].k.shape == (2, 64, model.cfg.n_kv_head, model.cfg.head_dim)
    parts = [model.decode(np.ascontiguousarray(idx[:, a:b]), caches)
             for a, b in ((0, 6), (6, 7), (7, 15))]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["llama-gqa", "qwen2", "mistral-window"])
def test_32_greedy_tokens_are_transformers(case):
    import torch

    hf, model = pair(case, seed=4)
    prompt = tokens(model.cfg.vocab, (2, 7), 5)
    ours = generate(model, prompt, 32, temperature=0)
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(prompt), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False).numpy()
    assert ref.shape == (2, 39)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("case", ["llama-gqa", "mistral-window"])
def test_attention_probs_are_transformers_attention_weights(case):
    import torch

    hf, model = pair(case, seed=5)
    idx = tokens(model.cfg.vocab, (1, 12), 6)
    with torch.no_grad():
        ref = hf(torch.from_numpy(idx), output_attentions=True).attentions
    ours = model.attention_probs(idx)
    for i in range(model.cfg.n_layer):
        np.testing.assert_allclose(ours[i], ref[i].numpy(), atol=1e-5)


def test_a_cache_of_another_shape_is_refused():
    _, model = pair("llama-gqa")
    gpt_like = [type(c)(1, 8, 4, 8) for c in model.new_caches(1)]  # 4 key/value heads, not 2
    with pytest.raises(ValueError, match="n_kv_head"):
        model.decode(np.zeros((1, 1), np.int64), gpt_like)


def test_bf16_is_a_setting_of_every_linear_layer():
    _, model = pair("qwen3")
    model.set_precision("bf16")
    linears = [layer for layer in model._layers() if hasattr(layer, "w") and layer.w.ndim == 2]
    assert len(linears) == 2 * 5 + 2  # embedding, per block qkv, o, gate, up, down, the head
    assert all(layer.precision == "bf16" for layer in linears[1:])


@pytest.mark.parametrize("path", BF16_FALLBACKS)
@pytest.mark.parametrize("case", ["llama-gqa", "qwen2", "qwen3"])
def test_the_bf16_fallback_model_is_the_fp32_model_on_rounded_inputs(path, case, monkeypatch):
    """Loss, logits, every gradient and decoded logits: the same bits as the FP32 model whose
    linear products take BF16-rounded inputs (round_inputs, test_bf16_model.py's)"""
    from test_bf16_model import bits, round_inputs

    _, model = pair(case, seed=6)
    vocab = model.cfg.vocab
    x, y = tokens(vocab, (2, 20), 7), tokens(vocab, (2, 20), 8)
    with bf16_path(path):
        model.set_precision("bf16")
        model.zero_grad()
        logits, loss = model.forward(x, y)
        model.backward()
        got = (logits, loss, model.grads.buffer.copy(),
               model.decode(x[:1, :5], model.new_caches(1)))
        model.set_precision("fp32")
        model.zero_grad()
        with monkeypatch.context() as m:
            round_inputs(m)
            logits, loss = model.forward(x, y)
            model.backward()
            want = (logits, loss, model.grads.buffer.copy(),
                    model.decode(x[:1, :5], model.new_caches(1)))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(bits(g), bits(w))


@pytest.mark.parametrize("path", BF16_PATHS)
@pytest.mark.parametrize("case", ["llama-gqa", "qwen2", "qwen3", "mistral-window"])
def test_bf16_gradients_are_the_fp32_ones_within_the_stated_bound(path, case):
    """The bound of test_bf16_model.py's GPT test, for the Llama block: rounding a product's
    two inputs to BF16 (2^-9 relative each) moves it by at most 2^-8 relative to Σ|x||W|; the
    first layer's weights' gradients depend on every linear product's forward and, in the
    backward, its dx and dW: 3·(5·n_layer + 1) products (q/k/v, o, gate, up, down per block,
    the LM head). Those moves adding, every gradient is within 3·(5·n_layer + 1)·2^-8 of the
    FP32 model's, normwise (12.9 % for 2 layers), and the loss within (5·n_layer + 1)·2^-8."""
    _, model = pair(case, seed=7)
    vocab, n_layer = model.cfg.vocab, model.cfg.n_layer
    x, y = tokens(vocab, (2, 24), 9), tokens(vocab, (2, 24), 10)
    with bf16_path(path):
        model.zero_grad()
        _, loss32 = model.forward(x, y)
        model.backward()
        g32 = {k: v.copy() for k, v in model.grads.items()}
        model.set_precision("bf16")
        model.zero_grad()
        _, loss16 = model.forward(x, y)
        model.backward()
    chain = 3 * (5 * n_layer + 1)
    for name, g in g32.items():
        rel = np.linalg.norm(model.grads[name] - g) / np.linalg.norm(g)
        assert rel <= chain * 2**-8, f"{name}: {rel:.3g} of its norm"
    assert abs(float(loss16) - float(loss32)) <= (5 * n_layer + 1) * 2**-8 * float(loss32)


@pytest.mark.parametrize("case", ["qwen3", "mistral-window"])
def test_on_the_gpu_path_a_step_and_a_generation_are_the_cpus(case, emu, monkeypatch):
    """GPT(cfg).to("cuda") on the stand-in cupy (strict: a NumPy array in device code is a
    TypeError), every op the CUDA kernels under the emulator: the loss and every gradient
    agree with the CPU model's to float32 rounding (the kernels sum in other orders), and
    greedy generation gives the CPU's tokens."""
    import fake_cupy

    cp = fake_cupy.install(monkeypatch, emu, strict=True)
    _, cpu = pair(case, seed=8)
    gpu = GPT(cpu.cfg)
    gpu.params.copy_from(cpu.params)
    gpu.to("cuda")
    assert gpu.blocks[0].attn.qkv.w.base is not None and type(gpu.blocks[0].attn.inv_freq) is \
        cp.ndarray
    x, y = tokens(cpu.cfg.vocab, (2, 10), 11), tokens(cpu.cfg.vocab, (2, 10), 12)
    for model, (a, b) in ((cpu, (x, y)), (gpu, (cp.asarray(x), cp.asarray(y)))):
        model.zero_grad()
        model.forward(a, b)
        model.backward()
    for name in cpu.params:
        err = rel_err(fake_cupy._asnumpy(gpu.grads[name]), cpu.grads[name])
        assert err <= 1e-5, (name, err)
    prompt = tokens(cpu.cfg.vocab, (1, 4), 13)
    np.testing.assert_array_equal(generate(gpu, prompt, 6, temperature=0),
                                  generate(cpu, prompt, 6, temperature=0))


def test_every_other_parameter_starts_aligned():
    """Only k's and v's projections start where the one before ends; the rest keep the
    buffer's 16-float alignment (d_model 5, head_dim 2: no size is a multiple of 16)."""
    from pytfm.nn import ALIGN, JOINED

    model = GPT(GPTConfig(vocab=7, d_model=5, n_layer=2, n_head=3, n_kv_head=1, head_dim=2,
                          d_ff=3, arch="llama", qkv_bias=True, qk_norm=True,
                          tie_embeddings=False))
    for name, (offset, _) in model.params.layout.items():
        assert name.endswith(JOINED) or offset % ALIGN == 0, (name, offset)


def test_the_thread_rule_holds():
    """A second thread may decode with its own caches while the first trains, not train."""
    import threading

    _, model = pair("llama-gqa")
    x = tokens(model.cfg.vocab, (1, 6), 14)
    model.forward(x, x)
    got = {}

    def other():
        try:
            model.backward()
        except RuntimeError as e:
            got["error"] = str(e)
        got["decoded"] = model.decode(x, model.new_caches(1)).shape

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert "is being trained by thread" in got["error"] and got["decoded"] == (1, 6, 61)


def test_a_train_step_on_the_gpu_path_replays_as_a_graph_with_the_loops_bits(emu, monkeypatch):
    """pytfm.train_step.TrainStep on a Llama model (q/k norms, biases, a window), on the
    emulated CUDA kernels: each call the bits of the loop it replaces, a CUDA graph from the
    third call on, and no array made once the first has recorded the step."""
    import fake_cupy
    from pytfm.optim import AdamW, clip_grad_norm
    from pytfm.train_step import TrainStep

    cp = fake_cupy.install(monkeypatch, emu, strict=True)
    cfg = GPTConfig(vocab=32, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=40,
                    max_seq=12, arch="llama", qk_norm=True, qkv_bias=True, sliding_window=5,
                    tie_embeddings=False)
    (loop, loop_opt), (model, opt) = [
        (m, AdamW(m.params, m.grads, lr=1e-2, weight_decay=0.1))
        for m in (GPT(cfg, device="cuda"), GPT(cfg, device="cuda"))]
    step = TrainStep(model, opt, max_norm=0.5)
    modes = []
    for i, lr in enumerate((3e-2, 1e-2, 2e-2, 5e-3)):
        x, y = tokens(32, (2, 12), 20 + i), tokens(32, (2, 12), 30 + i)
        loop.zero_grad()
        _, want = loop.forward(cp.asarray(x), cp.asarray(y))
        loop.backward()
        clip_grad_norm(loop.grads, 0.5)
        loop_opt.step(lr)
        made = cp.allocations()
        got = step(x, y, lr)
        modes.append(step.mode)
        assert i == 0 or cp.allocations() == made, (i, step.mode)
        assert fake_cupy._asnumpy(got).tobytes() == fake_cupy._asnumpy(want).tobytes(), i
        for ours, theirs in ((model.params, loop.params), (opt.m, loop_opt.m)):
            assert (fake_cupy._asnumpy(ours.buffer) == fake_cupy._asnumpy(theirs.buffer)).all()
    assert modes == ["record", "replay", "graph", "graph"], step.graph_error
