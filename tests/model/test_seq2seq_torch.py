"""The encoder–decoder against torch.nn.Transformer (batch_first, dropout 0, post- and
pre-norm) with the same weights, the same padding masks (src_key_padding_mask,
tgt_key_padding_mask, memory_key_padding_mask) and a causal tgt_mask: logits at the real
positions, the loss (with and without label smoothing) and every parameter's gradient.

The tolerance of each output is derived from float32 rounding, per output: torch runs the
same weights twice, in float32 and in float64; the float64 run is the truth, and pytfm's
float32 result may be off it by at most a few times what torch's own float32 run is off it
(plus a few float32 units of the output's scale, for outputs whose torch error happens to be
tiny). Padded positions' logits are not compared: torch computes its padded query rows as if
they were real, pytfm gives them zero attention; neither reaches the loss."""

import math

import numpy as np
import pytest

from pytfm.seq2seq import Seq2SeqConfig, Transformer

EPS32 = float(np.finfo(np.float32).eps)


def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed (the twin tests run in CI, which installs it)")
    torch.manual_seed(0)
    return torch


def torch_name(name):
    """pytfm's parameter name -> torch.nn.Transformer's (q, k, v of cross-attention: see
    twin())."""
    return name.replace(".in_proj.weight", ".in_proj_weight").replace(".in_proj.bias",
                                                                      ".in_proj_bias")


def twin(torch, model, dtype):
    """torch.nn.Transformer with model's weights in dtype, and the embedding tables and the
    output projection around it: (module, forward(src, tgt, src_lens, tgt_lens) -> logits,
    grads() -> {pytfm name: gradient as float64 NumPy})."""
    F = torch.nn.functional
    cfg = model.cfg
    act = "relu" if cfg.activation == "relu" else (lambda x: F.gelu(x, approximate="tanh"))
    core = torch.nn.Transformer(
        cfg.d_model, cfg.n_head, cfg.n_enc_layers, cfg.n_dec_layers, cfg.d_ff, dropout=0.0,
        activation=act, batch_first=True, norm_first=cfg.norm == "pre", dtype=dtype)
    state = core.state_dict()
    params = {}  # pytfm name -> a leaf tensor of its own (a view of the core's, or a table)
    with torch.no_grad():
        for name, p in model.params.items():
            value = torch.from_numpy(p.copy()).to(dtype)
            if ".multihead_attn." in name and name.split(".")[-2] in ("q_proj", "k_proj",
                                                                        "v_proj"):
                continue  # stacked below
            if name.startswith(("encoder.", "decoder.")):
                state[torch_name(name)].copy_(value)
            else:
                params[name] = torch.nn.Parameter(value)
        for i in range(cfg.n_dec_layers):
            pre = f"decoder.layers.{i}.multihead_attn"
            for kind in ("weight", "bias"):
                state[f"{pre}.in_proj_{kind}"].copy_(torch.cat([
                    torch.from_numpy(model.params[f"{pre}.{x}_proj.{kind}"].copy()).to(dtype)
                    for x in "qkv"]))
    core.train()  # dropout 0; and no fast path (it needs eval mode and no grad)
    pe = torch.from_numpy(model.pe.copy()).to(dtype)
    src_table = params.get("embed.weight", params.get("src_embed.weight"))
    tgt_table = params.get("embed.weight", params.get("tgt_embed.weight"))
    out = params.get("generator.weight", tgt_table)

    def forward(src, tgt, src_lens, tgt_lens):
        Ts, Tt = src.shape[1], tgt.shape[1]
        src_pad = torch.arange(Ts)[None, :] >= torch.tensor(src_lens)[:, None]
        tgt_pad = torch.arange(Tt)[None, :] >= torch.tensor(tgt_lens)[:, None]
        scale = math.sqrt(cfg.d_model)
        x = F.embedding(torch.from_numpy(src), src_table) * scale + pe[:Ts]
        y = F.embedding(torch.from_numpy(tgt), tgt_table) * scale + pe[:Tt]
        causal = torch.triu(torch.ones(Tt, Tt, dtype=torch.bool), diagonal=1)
        h = core(x, y, tgt_mask=causal, src_key_padding_mask=src_pad,
                 tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
        return h @ out.T

    def grads():
        got = {name: p.grad for name, p in params.items()}
        named = dict(core.named_parameters())
        for name in model.params:
            if name in got:
                continue
            if ".multihead_attn." in name and name.split(".")[-2] in ("q_proj", "k_proj",
                                                                        "v_proj"):
                pre, x, kind = name.rsplit(".", 2)
                g = named[f"{pre}.in_proj_{kind}"].grad
                got[name] = g.chunk(3)["qkv".index(x[0])]
            else:
                got[name] = named[torch_name(name)].grad
        return {name: g.detach().to(torch.float64).numpy() for name, g in got.items()}

    return core, forward, grads


def run_twin(torch, model, dtype, data, smoothing):
    src, tgt, sl, tl, y = data
    _, forward, grads = twin(torch, model, dtype)
    logits = forward(src, tgt, sl, tl)
    kept = torch.from_numpy(y.copy())
    kept[torch.arange(tgt.shape[1])[None, :] >= torch.tensor(tl)[:, None]] = -1
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             kept.reshape(-1), ignore_index=-1,
                                             label_smoothing=smoothing)
    loss.backward()
    return logits.detach().to(torch.float64).numpy(), loss.item(), grads()


def close(name, ours, t32, t64):
    """|ours − t64| <= 4·|t32 − t64| + 4·eps32·max|t64| (max over the array): a few times
    torch's own float32 error."""
    ours, t32, t64 = (np.asarray(a, np.float64) for a in (ours, t32, t64))
    err, torch_err = np.abs(ours - t64).max(), np.abs(t32 - t64).max()
    tol = 4 * torch_err + 4 * EPS32 * np.abs(t64).max()
    assert err <= tol, (f"{name}: pytfm is off float64 torch by {err:.3g}, float32 torch by "
                        f"{torch_err:.3g} (tolerance {tol:.3g}, scale {np.abs(t64).max():.3g})")


@pytest.mark.parametrize("norm, activation, share, tie, smoothing", [
    ("post", "relu", False, False, 0.0),
    ("pre", "relu", False, False, 0.0),
    ("post", "relu", True, True, 0.1),
    ("pre", "gelu", False, True, 0.1),
])
def test_torch_transformer_gives_the_same_logits_loss_and_gradients(norm, activation, share,
                                                                    tie, smoothing):
    torch = _torch()
    cfg = Seq2SeqConfig(src_vocab=29 if not share else 31, tgt_vocab=31, d_model=32, n_head=4,
                        n_enc_layers=2, n_dec_layers=2, d_ff=48, max_len=16, norm=norm,
                        activation=activation, share_embeddings=share, tie_output=tie)
    model = Transformer(cfg, seed=4)
    rng = np.random.default_rng(11)
    B, Ts, Tt = 3, 9, 7
    src = rng.integers(0, cfg.src_vocab, (B, Ts))
    tgt = rng.integers(0, cfg.tgt_vocab, (B, Tt))
    y = rng.integers(0, cfg.tgt_vocab, (B, Tt))
    sl, tl = [Ts, 4, 6], [5, Tt, 2]
    data = (src, tgt, sl, tl, y)
    model.zero_grad()
    logits, loss = model.forward(src, tgt, sl, tl, targets=y, label_smoothing=smoothing)
    model.backward()
    l32, loss32, g32 = run_twin(torch, model, torch.float32, data, smoothing)
    l64, loss64, g64 = run_twin(torch, model, torch.float64, data, smoothing)
    for b in range(B):
        close(f"logits[{b}]", logits[b, :tl[b]], l32[b, :tl[b]], l64[b, :tl[b]])
    close("loss", float(loss), loss32, loss64)
    assert set(g64) == set(model.grads)
    for name, g in model.grads.items():
        if name.endswith("multihead_attn.k_proj.bias"):  # zero but for rounding: the softmax
            assert np.abs(g).max() <= 1e-6 and np.abs(g64[name]).max() <= 1e-12  # cancels it
            continue
        close(name, g, g32[name], g64[name])
