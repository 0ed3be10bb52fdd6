"""Attention weights on request (pytfm.nn.attention_probs, GPT.attention_probs) and the head
scores of pytfm.interpret.

The weights are rebuilt from the q, k and lse the attention kernel used: they must equal the
reference's naive softmax(scale·q·kᵀ) with the causal mask, on drawn shapes and, through the
whole model, at every pos mode (the q and k being the model's own: after RoPE). Each score is
checked on hand-built patterns whose value is known exactly."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import assert_close
from pytfm import interpret, ops
from pytfm import reference as R
from pytfm.nn import GPT, POSITIONS, GPTConfig, attention_probs, sinusoidal_positions

EPS = 2.0**-24  # float32 unit roundoff


def rows_are_causal_distributions(P, rtol):
    """Zero above the diagonal (exactly), rows summing to 1 within rtol (per row: every weight
    of a row is off by the same factor, P's relative error) and the float32 sum's rounding."""
    T = P.shape[-1]
    assert (P[..., np.triu(np.ones((T, T), bool), k=1)] == 0).all()
    assert (P >= 0).all()
    assert (np.abs(P.sum(axis=-1, dtype=np.float64) - 1) <= rtol + T * EPS).all()


@given(B=st.integers(1, 2), T=st.sampled_from([1, 2, 3, 7, 16, 63, 64, 65, 130]),
       H=st.integers(1, 3), D=st.sampled_from([1, 2, 5, 16, 32]),
       spread=st.sampled_from([0.1, 1.0, 4.0]), seed=st.integers(0, 2**32 - 1))
def test_attention_probs_equal_the_naive_softmax_of_the_same_q_k(B, T, H, D, spread, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(0, spread, (B, T, H, D)).astype(np.float32) for _ in range(3))
    _, lse = ops.attention_forward(q, k, v, causal=True)
    P = attention_probs(q, k, lse)
    ref = R.softmax_forward(R.attention_scores(q, k, causal=True))  # float64, [B, H, T, T]
    assert P.shape == (B, H, T, T) and P.dtype == np.float32
    # P = exp(S − lse) with the float32 lse: P's relative error is lse's absolute error, its
    # rounding (an ulp or two of |lse|) plus the kernel's float32 scores, each off by up to
    # D·EPS times scale·Σ_d |q_d·k_d|, and its sum's rounding
    _, lse_ref = R.attention_forward(q, k, v)
    terms = np.einsum("bthd,bshd->bhts", np.abs(q), np.abs(k)) / math.sqrt(D)
    rtol = (4 * np.abs(lse_ref) + 2 * D * terms.max(axis=-1) + 16) * EPS  # [B, H, T], per row
    rows_are_causal_distributions(P, rtol)
    assert_close("attention_probs.vs_naive_softmax", P, ref, atol=1e-37, rtol=rtol[..., None])


def reference_maps(model, idx):  # int64 (B, T) -> [P (B, H, T, T)] per layer, float64
    """The model's forward pass written with pytfm.reference, keeping each layer's naive
    softmax(QKᵀ): an oracle that shares nothing with GPT.attention_probs but the weights."""
    cfg, p = model.cfg, model.params
    B, T = idx.shape
    H, hd = cfg.n_head, cfg.d_model // cfg.n_head
    x = R.embedding_forward(idx, p["transformer.wte.weight"])
    if cfg.pos == "sinusoidal":
        x = x + sinusoidal_positions(T, cfg.d_model)
    if cfg.pos == "learned":
        x = x + np.asarray(p["transformer.wpe.weight"][:T], np.float64)
    pos, maps = np.arange(T), []
    for i in range(cfg.n_layer):
        w = {name[len(f"transformer.h.{i}."):]: value for name, value in p.items()
             if name.startswith(f"transformer.h.{i}.")}
        a, _, _ = R.layernorm_forward(x, w["ln_1.weight"], w["ln_1.bias"])
        qkv = R.linear_forward(a, w["attn.c_attn.weight"], w["attn.c_attn.bias"])
        q, k, v = (qkv.reshape(B, T, 3, H, hd)[:, :, j] for j in range(3))
        if cfg.pos == "rope":
            q, k = R.rope_forward(q, pos), R.rope_forward(k, pos)
        S = R.attention_scores(q, k, causal=True)
        maps.append((R.softmax_forward(S), S))
        o = np.einsum("bhts,bshd->bthd", maps[-1][0], v).reshape(B, T, -1)
        x = x + R.linear_forward(o, w["attn.c_proj.weight"], w["attn.c_proj.bias"])
        m, _, _ = R.layernorm_forward(x, w["ln_2.weight"], w["ln_2.bias"])
        hidden = R.gelu_forward(R.linear_forward(m, w["mlp.c_fc.weight"], w["mlp.c_fc.bias"]))
        x = x + R.linear_forward(hidden, w["mlp.c_proj.weight"], w["mlp.c_proj.bias"])
    return maps


def peaked_model(pos, seed, n_layer=3):
    """A small GPT whose weights are large enough for sharp, uneven attention (at the
    initialisation's scale every map is nearly uniform, and a wrong q or k would pass)."""
    model = GPT(GPTConfig(vocab=40, d_model=24, n_layer=n_layer, n_head=3, max_seq=40, pos=pos,
                          seed=seed))
    rng = np.random.default_rng(seed)
    for name, value in model.params.items():
        std = 0.25 if name.endswith("c_attn.weight") else 0.1
        value[...] = value + rng.normal(0, std, value.shape)
    return model


@pytest.mark.parametrize("pos", POSITIONS)
@given(T=st.sampled_from([1, 2, 5, 17, 40]), B=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_the_model_s_attention_probs_equal_a_reference_forward_at_every_pos(pos, T, B, seed):
    model = peaked_model(pos, seed)
    idx = np.random.default_rng(seed).integers(0, 40, (B, T))
    maps = model.attention_probs(idx)
    assert sorted(maps) == [0, 1, 2]
    for layer, (ref, S) in enumerate(reference_maps(model, idx)):
        P = maps[layer]
        assert P.shape == (B, 3, T, T)
        # float32 forward vs float64: each score S[t, s] is off by about EPS times the size of
        # the terms it sums, times the layers' growth; P[t, s] relatively by that much and by
        # the row's lse (a weighted mean of the row's S): bounded by twice the row's largest |S|
        size = np.abs(np.where(np.isfinite(S), S, 0)).max(axis=-1, keepdims=True)  # per row
        rtol = 2**9 * EPS * (1 + size)  # 2^9: measured errors stay below 2^6
        rows_are_causal_distributions(P, rtol[..., 0])
        assert_close(f"attention_probs.model.{pos}", P, ref, atol=1e-30, rtol=rtol)


def test_attention_probs_leave_a_pending_backward_alone_and_keep_nothing():
    model = peaked_model("rope", 0, n_layer=2)
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 40, (2, 12)), rng.integers(0, 40, (2, 12))
    model.forward(x, y)
    model.backward()
    want = {name: g.copy() for name, g in model.grads.items()}
    model.zero_grad()
    model.forward(x, y)
    saved = [block.attn.saved for block in model.blocks]
    model.attention_probs(rng.integers(0, 40, (1, 30)))  # another input, between the two
    assert [block.attn.saved for block in model.blocks] == saved  # the same objects
    assert all(block.attn.probe is None for block in model.blocks)
    model.backward()
    for name, g in model.grads.items():
        np.testing.assert_array_equal(g, want[name], err_msg=name)


def test_attention_probs_of_chosen_layers_and_after_a_failure():
    model = peaked_model("none", 3)
    idx = np.arange(10)[None, :]
    every = model.attention_probs(idx)
    some = model.attention_probs(idx, layers=[2, 0, 2])
    assert sorted(some) == [0, 2]
    for layer in some:
        np.testing.assert_array_equal(some[layer], every[layer])
    with pytest.raises(ValueError, match="max_seq"):  # the forward pass itself fails
        model.attention_probs(np.zeros((1, 41), np.int64))
    assert all(block.attn.probe is None for block in model.blocks)


@pytest.mark.parametrize("layers,words", [([3], "3 is not a layer index in [0, 3)"),
                                          ([-1], "-1 is not a layer index"),
                                          ([True], "True is not a layer index"),
                                          ([1.0], "1.0 is not a layer index")])
def test_attention_probs_refuse_a_layer_that_is_not_there(layers, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace(")", r"\)")):
        peaked_model("rope", 0).attention_probs(np.zeros((1, 4), np.int64), layers=layers)


def test_attention_probs_refuse_maps_too_large_for_a_short_input_before_any_work():
    # rope needs no table: max_seq 2**20 costs nothing; 4 heads x 2 layers of 3000² floats
    # are 275 MiB, past the 256 MiB limit
    model = GPT(GPTConfig(d_model=16, n_layer=2, n_head=4, max_seq=2**20))
    with pytest.raises(ValueError, match=r"T = 3000 take 275 MiB.*at most T = 2896 here"):
        model.attention_probs(np.zeros((1, 3000), np.int64))
    with pytest.raises(ValueError, match="shape \\(B, T\\), got shape \\(5,\\)"):
        model.attention_probs(np.zeros(5, np.int64))


# ---- the scores on hand-built patterns -----------------------------------------------------------


def repeated(n, seed=0):  # -> tokens (1, 2n): n distinct tokens, twice
    segment = np.random.default_rng(seed).permutation(1000)[:n]
    return np.concatenate([segment, segment])[None, :]


def pattern(T, rule):  # -> P (1, 1, T, T) with P[t, rule(t)] = 1
    P = np.zeros((1, 1, T, T))
    for t in range(T):
        P[0, 0, t, rule(t)] = 1.0
    return P


def uniform(T):  # each query spreads its weight over itself and everything before
    return (np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None])[None, None]


@given(n=st.integers(2, 60), seed=st.integers(0, 1000))
def test_a_perfect_induction_head_scores_1(n, seed):
    """In the second copy query t = n + i holds the token of i: it looks at i + 1. The first
    copy's queries have no earlier occurrence (distinct tokens): they look at themselves and
    do not count."""
    tokens = repeated(n, seed)
    P = pattern(2 * n, lambda t: t - n + 1 if t >= n else t)
    assert interpret.induction(P, tokens)[0] == 1.0
    # t − n + 1 is t − 1 only when n = 2 (then for both queries of the second copy)
    assert interpret.previous_token(P)[0] == pytest.approx(2 / 3 if n == 2 else 0)


@given(n=st.integers(2, 100))
def test_uniform_attention_has_an_induction_score_near_0(n):
    """Uniform rows give weight 1/(t + 1) to the one position after the earlier occurrence:
    the mean over the second copy's queries, about ln(2)/n."""
    expected = np.mean([1 / (t + 1) for t in range(n, 2 * n)])
    score = interpret.induction(uniform(2 * n), repeated(n))[0]
    assert score == pytest.approx(expected)
    assert score < 1 / n


@given(T=st.integers(2, 80))
def test_uniform_attention_scores(T):
    P = uniform(T)
    t = np.arange(1, T)  # the queries t >= 1 the scores average over
    assert interpret.mean_distance(P)[0] == pytest.approx(np.mean(t / 2))
    assert interpret.entropy(P)[0] == pytest.approx(np.mean(np.log(t + 1)))
    assert interpret.previous_token(P)[0] == pytest.approx(np.mean(1 / (t + 1)))


@given(n=st.integers(3, 40))
def test_previous_token_and_self_heads(n):
    tokens, T = repeated(n), 2 * n
    previous = pattern(T, lambda t: max(t - 1, 0))
    s = interpret.head_scores(previous, tokens)
    assert s["previous_token"][0] == 1.0 and s["mean_distance"][0] == 1.0
    assert s["entropy"][0] == 0.0
    assert s["induction"][0] == 0.0  # the induction target of t is t − n + 1, never t − 1
    itself = interpret.head_scores(pattern(T, lambda t: t), tokens)
    assert itself["previous_token"][0] == itself["mean_distance"][0] == 0.0
    assert itself["induction"][0] == 0.0
    back = pattern(T, lambda t: max(t - 3, 0))  # three back, from t = 3 on
    assert interpret.mean_distance(back)[0] == pytest.approx(np.mean([min(t, 3)
                                                                      for t in range(1, T)]))


def test_induction_targets_count_every_earlier_occurrence():
    tokens = np.array([[1, 2, 1, 2, 1, 7]])
    after = interpret.induction_targets(tokens)[0]
    want = {2: [1], 3: [2], 4: [1, 3]}  # query -> the positions after its earlier occurrences
    for t in range(6):
        assert list(np.flatnonzero(after[t])) == want.get(t, []), t
    P = np.zeros((1, 1, 6, 6))
    P[0, 0, range(6), range(6)] = 1.0
    P[0, 0, 4] = [0, 0.3, 0, 0.5, 0.2, 0]  # weight 0.8 on the targets of query 4
    P[0, 0, 2] = [0, 1, 0, 0, 0, 0]
    assert interpret.induction(P, tokens)[0] == pytest.approx((1 + 0 + 0.8) / 3)


@given(B=st.integers(1, 3), T=st.integers(1, 30), H=st.integers(1, 3),
       seed=st.integers(0, 2**16), vocab=st.sampled_from([2, 5, 50]))
def test_scores_of_any_causal_pattern_stay_in_their_ranges(B, T, H, seed, vocab):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (B, H, T, T))
    P = R.softmax_forward(np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf))
    tokens = rng.integers(0, vocab, (B, T))
    s = interpret.head_scores(P, tokens)
    assert all(v.shape == (H,) for v in s.values())
    if T == 1:  # no query with a token before it
        assert all(np.isnan(v).all() for v in s.values())
        return
    assert ((0 <= s["mean_distance"]) & (s["mean_distance"] <= T - 1)).all()
    assert ((0 <= s["entropy"]) & (s["entropy"] <= math.log(T) + 1e-12)).all()
    assert ((0 <= s["previous_token"]) & (s["previous_token"] <= 1)).all()
    repeats = interpret.induction_targets(tokens).any()
    assert np.isnan(s["induction"]).all() != repeats
    if repeats:
        assert ((0 <= s["induction"]) & (s["induction"] <= 1 + 1e-12)).all()


def test_head_scores_check_their_shapes():
    with pytest.raises(ValueError, match=r"P must be \[B, H, T, T\], got shape \(1, 4, 4\)"):
        interpret.head_scores(np.zeros((1, 4, 4)), np.zeros((1, 4)))
    with pytest.raises(ValueError, match=r"tokens must be \[B, T\] = \[1, 4\], got shape \[4\]"):
        interpret.head_scores(np.zeros((1, 2, 4, 4)), np.zeros(4))
