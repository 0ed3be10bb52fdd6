"""The encoder–decoder (pytfm.seq2seq): hand-written gradients against finite differences,
decoding against the full forward pass, padding, the loss's mask, the cross-attention maps and
bad input. Its check against torch.nn.Transformer is test_seq2seq_torch.py's."""

import numpy as np
import pytest

from pytfm.seq2seq import DecodeState, Seq2SeqConfig, Transformer

EPS32 = float(np.finfo(np.float32).eps)
SRC_V, TGT_V = 19, 23


def tiny(norm="post", activation="relu", share=False, tie=False, seed=0, **kw):
    """A small model with weights larger than its init, so that every path carries gradient
    worth measuring."""
    vocab = dict(src_vocab=TGT_V if share else SRC_V, tgt_vocab=TGT_V)
    cfg = dict(d_model=16, n_head=2, n_enc_layers=2, n_dec_layers=2, d_ff=24, max_len=12,
               norm=norm, activation=activation, share_embeddings=share, tie_output=tie)
    cfg.update(vocab, **kw)
    model = Transformer(Seq2SeqConfig(**cfg), seed=seed)
    rng = np.random.default_rng(seed + 1)
    for name, p in model.params.items():
        if ".norm" in name or name.endswith("norm.weight"):
            p[...] = (name.endswith(".weight")) + 0.2 * rng.standard_normal(p.shape)
        else:
            p[...] = 0.3 * rng.standard_normal(p.shape)
    return model


def batch(rng, src_vocab=SRC_V, B=3, Ts=7, Tt=6):
    """A padded batch: (src, tgt_in, src_lens, tgt_lens, targets); lengths below T in two of
    the three sequences, in different ways for source and target."""
    src = rng.integers(0, src_vocab, (B, Ts))
    tgt = rng.integers(0, TGT_V, (B, Tt))
    targets = rng.integers(0, TGT_V, (B, Tt))
    src_lens = [Ts, 3, Ts - 2][:B]
    tgt_lens = [Tt - 1, Tt, 2][:B]
    return src, tgt, src_lens, tgt_lens, targets


def loss_of(model, data):
    src, tgt, sl, tl, y = data
    return float(model.forward(src, tgt, sl, tl, targets=y, save=False)[1])


def difference_error(model, data, p, g, u, step):
    """(L(p + step·u) − L(p − step·u) − g·Δ) / 2·step in float64, Δ the step p₊ − p₋ the
    float32 parameter really took; p is left as it was (as tests/model/test_model.py's)."""
    p0, p64, ends = p.copy(), p.astype(np.float64), []
    for sign in (1, -1):
        p[...] = p64 + sign * step * u
        ends.append((loss_of(model, data), p.astype(np.float64)))
    p[...] = p0
    (l_plus, p_plus), (l_minus, p_minus) = ends
    return (l_plus - l_minus - float(np.vdot(g, p_plus - p_minus))) / (2 * step)


@pytest.mark.parametrize("norm, share, tie", [
    ("post", False, False), ("pre", False, True), ("post", True, True), ("pre", True, False)])
def test_gradients_match_finite_differences(norm, share, tie):
    """Each parameter's gradient g along a random unit direction u, against the loss's
    derivative along u by central differences with Richardson extrapolation over h, 2h, 4h;
    the tolerance is the float32 loss's rounding (nu = 4·eps32·L, turned into 1.65·nu/h by the
    extrapolation's weights) plus the last correction's size (the derivation is
    test_model.py's test_model_gradients_match_finite_differences). Padded batch: the masks'
    paths are in what is differentiated. GELU: ReLU's kinks, which the steps cross, break
    the differences (its gradients are checked against torch in float64:
    test_seq2seq_torch.py).

    The cross-attention's k_proj.bias adds q_t·b to every score of row t, which the softmax
    cancels: its gradient is zero but for rounding, and is checked to be that."""
    model = tiny(norm, "gelu", share, tie)
    rng = np.random.default_rng(5)
    data = batch(rng, src_vocab=model.cfg.src_vocab)
    src, tgt, sl, tl, y = data
    model.zero_grad()
    loss = float(model.forward(src, tgt, sl, tl, targets=y)[1])
    model.backward()
    nu, h = 4 * EPS32 * abs(loss), 0.03
    names = set(model.params)
    assert ("embed.weight" in names) == share and ("generator.weight" in names) != tie
    for name, p in model.params.items():
        g = model.grads[name].astype(np.float64)
        if name.endswith("multihead_attn.k_proj.bias"):
            assert np.abs(g).max() <= 1e-6, f"{name}: {np.abs(g).max()} is not 0"
            continue
        assert np.linalg.norm(g) > 1e-4, f"{name}: no gradient reaches it"
        u = rng.standard_normal(p.shape)
        while abs(np.vdot(g, u)) < np.linalg.norm(g) * np.linalg.norm(u) / np.sqrt(p.size):
            u = rng.standard_normal(p.shape)
        u /= np.linalg.norm(u)
        want = float(np.vdot(g, u))
        e1, e2, e4 = (difference_error(model, data, p, g, u, s) for s in (h, 2 * h, 4 * h))
        r1, r2 = (4 * e1 - e2) / 3, (4 * e2 - e4) / 3
        err = (16 * r1 - r2) / 15
        tol = 1.65 * nu / h + abs(r1 - r2) / 15
        assert abs(err) <= tol, (
            f"{name}: backprop gives d/du = {want:.6g}, differences {want + err:.6g}: "
            f"off by {abs(err / want):.2%}, tolerance {tol / abs(want):.2%}")


def test_padding_gets_zero_gradient():
    """Token ids that only padding holds get exactly zero gradient in their embedding rows,
    source and target; every other row of the batch's tokens gets some."""
    model = tiny()
    src, tgt, sl, tl, y = batch(np.random.default_rng(2))
    src, tgt = src % (SRC_V - 1), tgt % (TGT_V - 1)  # the last id of each vocabulary ...
    for b in range(3):
        src[b, sl[b]:] = SRC_V - 1  # ... is padding only
        tgt[b, tl[b]:] = TGT_V - 1
        y[b, tl[b]:] = TGT_V - 1
    model.zero_grad()
    model.forward(src, tgt, sl, tl, targets=y)
    model.backward()
    g_src, g_tgt = model.grads["src_embed.weight"], model.grads["tgt_embed.weight"]
    assert not g_src[SRC_V - 1].any() and not g_tgt[TGT_V - 1].any()
    real_src = {int(src[b, t]) for b in range(3) for t in range(sl[b])}
    real_tgt = {int(tgt[b, t]) for b in range(3) for t in range(tl[b])}
    assert all(np.abs(g_src[i]).max() > 0 for i in real_src)
    assert all(np.abs(g_tgt[i]).max() > 0 for i in real_tgt)


@pytest.mark.parametrize("norm, activation", [("post", "relu"), ("pre", "gelu")])
def test_padding_changes_nothing_real(norm, activation):
    """A sentence's logits at its real positions depend neither on what its padding holds nor
    on the other sentences of its batch: each row equals the sentence alone, unpadded, to
    float32 rounding of the logits' scale; changing the padding's ids changes no bit."""
    model = tiny(norm, activation)
    rng = np.random.default_rng(3)
    src, tgt, sl, tl, _ = batch(rng)
    logits = model.forward(src, tgt, sl, tl)
    other_src, other_tgt = src.copy(), tgt.copy()
    for b in range(3):
        other_src[b, sl[b]:] = rng.integers(0, SRC_V, src.shape[1] - sl[b])
        other_tgt[b, tl[b]:] = rng.integers(0, TGT_V, tgt.shape[1] - tl[b])
    assert (other_src != src).any() and (other_tgt != tgt).any()
    again = model.forward(other_src, other_tgt, sl, tl)
    for b in range(3):
        assert np.array_equal(again[b, :tl[b]], logits[b, :tl[b]])
        alone = model.forward(src[b:b + 1, :sl[b]], tgt[b:b + 1, :tl[b]])[0]
        scale = np.abs(alone).max()
        np.testing.assert_allclose(logits[b, :tl[b]], alone, rtol=0, atol=64 * EPS32 * scale)


def test_the_loss_is_the_mean_over_real_target_positions():
    """loss = mean over t < tgt_lens[b] of lse − z_target, from the logits it returns (float64
    here): targets past a length, whatever they hold, are ignored; -1 is ignored too."""
    model = tiny()
    src, tgt, sl, tl, y = batch(np.random.default_rng(4))
    y[0, 1] = -1
    logits, loss = model.forward(src, tgt, sl, tl, targets=y)
    z = logits.astype(np.float64)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    terms = [lse[b, t] - z[b, t, y[b, t]] for b in range(3) for t in range(tl[b])
             if y[b, t] >= 0]
    assert len(terms) == sum(tl) - 1
    assert abs(float(loss) - np.mean(terms)) <= 8 * EPS32 * abs(np.mean(terms))
    y2 = y.copy()
    y2[2, tl[2]:] = -7  # out of range, but padding: ignored
    assert float(model.forward(src, tgt, sl, tl, targets=y2)[1]) == float(loss)


@pytest.mark.parametrize("norm, activation", [("post", "relu"), ("pre", "gelu")])
def test_decode_step_gives_the_forward_logits(norm, activation):
    """Token by token through start_decode / decode_step, the logits are forward()'s at each
    real position (float32 rounding of the logits' scale), also after a reorder that repeats
    and drops rows, and the state does not disturb a pending backward."""
    model = tiny(norm, activation)
    src, tgt, sl, tl, y = batch(np.random.default_rng(6))
    tl = [6, 6, 6]  # every target position real: decoding has no target padding
    model.zero_grad()
    logits = model.forward(src, tgt, sl, tl, targets=y)[0]
    state = model.start_decode(src, sl)
    assert isinstance(state, DecodeState) and state.batch == 3 and len(state) == 0
    atol = 64 * EPS32 * np.abs(logits).max()
    for t in range(3):
        got = model.decode_step(state, tgt[:, t])
        assert got.shape == (3, TGT_V) and got.dtype == np.float32
        np.testing.assert_allclose(got, logits[:, t], rtol=0, atol=atol)
    rows = np.array([2, 0, 2, 2])
    state.reorder(rows)
    assert state.batch == 4 and len(state) == 3
    for t in range(3, 6):
        got = model.decode_step(state, tgt[rows, t])
        np.testing.assert_allclose(got, logits[rows, t], rtol=0, atol=atol)
    model.backward()
    g = model.grads.buffer.copy()
    model.zero_grad()
    model.forward(src, tgt, sl, tl, targets=y)
    model.backward()
    assert np.array_equal(model.grads.buffer, g)


def test_cross_attention_maps():
    """One (B, H, Tt, Ts) map per decoder layer; real rows sum to 1 over the real source
    positions, padded source columns and padded target rows are 0; and they are the weights
    the attention used: changing a padded source id changes none."""
    model = tiny()
    src, tgt, sl, tl, _ = batch(np.random.default_rng(7))
    maps = model.cross_attention_probs(src, tgt, sl, tl)
    assert len(maps) == 2
    for P in maps:
        assert P.shape == (3, 2, 6, 7) and P.dtype == np.float32
        for b in range(3):
            real = P[b, :, :tl[b], :sl[b]]
            np.testing.assert_allclose(real.sum(-1), 1.0, rtol=0, atol=16 * EPS32 * sl[b])
            assert (real > 0).all()
            assert not P[b, :, :, sl[b]:].any() and not P[b, :, tl[b]:].any()
    src2 = src.copy()
    src2[1, sl[1]:] = (src2[1, sl[1]:] + 1) % SRC_V
    assert all(np.array_equal(a, b) for a, b in zip(maps, model.cross_attention_probs(
        src2, tgt, sl, tl)))


def test_backward_needs_a_forward_with_targets():
    model = tiny()
    src, tgt, sl, tl, _ = batch(np.random.default_rng(8))
    with pytest.raises(RuntimeError, match="backward"):
        model.backward()
    with pytest.raises(ValueError, match="targets"):
        model.forward(src, tgt, sl, tl, save=True)


@pytest.mark.parametrize("change, error, match", [
    (dict(src_lens=[7, 0, 5]), ValueError, r"src_lens\[1\] = 0"),
    (dict(src_lens=[7, 8, 5]), ValueError, r"src_lens\[1\] = 8"),
    (dict(tgt_lens=[1, 7, 2]), ValueError, r"tgt_lens\[1\] = 7"),
    (dict(src_lens=[7, 3]), ValueError, "src_lens must hold B = 3"),
    (dict(src_lens=[7, 3.0, 5]), TypeError, "src_lens must hold integers"),
    (dict(tgt_lens="123"), TypeError, "tgt_lens must be None or 3 ints"),
    (dict(src="tokens"), TypeError, "src must be a numpy.ndarray"),
    (dict(src=np.zeros((3, 7), np.int32)), TypeError, "src must be .* int64"),
    (dict(tgt_in=np.zeros((3,), np.int64)), ValueError, "tgt_in must be .* shape"),
    (dict(src=np.zeros((2, 7), np.int64)), ValueError, "tgt_in has a batch of 3"),
    (dict(src=np.full((3, 7), SRC_V)), ValueError, r"src\[0\] = 19 is outside \[0, 19\)"),
    (dict(tgt_in=np.full((3, 6), -1)), ValueError, r"tgt_in\[0\] = -1 is outside"),
    (dict(targets=np.full((3, 6), TGT_V)), ValueError, r"targets\[0\] = 23 is outside"),
    (dict(targets=np.zeros((3, 5), np.int64)), ValueError, "targets must have tgt_in's shape"),
    (dict(src=np.zeros((3, 13), np.int64), src_lens=None), ValueError, "more than max_len"),
    (dict(label_smoothing=1.5), ValueError, "label_smoothing must be in"),
    (dict(label_smoothing="0.1"), TypeError, "label_smoothing"),
])
def test_bad_input_is_refused_naming_the_argument(change, error, match):
    model = tiny()
    src, tgt, sl, tl, y = batch(np.random.default_rng(9))
    args = dict(src=src, tgt_in=tgt, src_lens=sl, tgt_lens=tl, targets=y)
    args.update(change)
    with pytest.raises(error, match=match):
        model.forward(**args)


def test_bad_decoding_input_is_refused():
    model = tiny()
    src, tgt, sl, _, _ = batch(np.random.default_rng(10))
    with pytest.raises(ValueError, match=r"src_lens\[2\] = 0"):
        model.start_decode(src, [1, 2, 0])
    with pytest.raises(ValueError, match="max_len must be in"):
        model.start_decode(src, sl, max_len=13)
    state = model.start_decode(src, sl, max_len=2)
    with pytest.raises(TypeError, match="state must be a DecodeState"):
        model.decode_step(object(), tgt[:, 0])
    with pytest.raises(ValueError, match="tokens has 2 rows"):
        model.decode_step(state, tgt[:2, 0])
    with pytest.raises(TypeError, match="tokens must be an int64 array"):
        model.decode_step(state, [1, 2, 3])
    with pytest.raises(ValueError, match=r"tokens\[0\] = 23 is outside"):
        model.decode_step(state, np.full(3, TGT_V))
    with pytest.raises(ValueError, match=r"index\[1\] = 3 is not a row"):
        state.reorder([0, 3])
    with pytest.raises(TypeError, match="index must hold integers"):
        state.reorder([0.5])
    with pytest.raises(ValueError, match="at least one row"):
        state.reorder([])
    model.decode_step(state, tgt[:, 0])
    model.decode_step(state, tgt[:, 1])
    with pytest.raises(ValueError, match="decoded 2 tokens"):
        model.decode_step(state, tgt[:, 2])


@pytest.mark.parametrize("field, value, error", [
    ("d_model", 0, ValueError),
    ("n_head", 3, ValueError),  # does not divide d_model 16
    ("n_head", 0, ValueError),
    ("d_ff", 2.5, TypeError),
    ("n_enc_layers", True, TypeError),
    ("norm", "middle", ValueError),
    ("activation", "swish", ValueError),
    ("share_embeddings", 1, TypeError),
])
def test_bad_config_is_refused_naming_the_field(field, value, error):
    cfg = dict(src_vocab=SRC_V, tgt_vocab=TGT_V, d_model=16, n_head=2)
    cfg[field] = value
    with pytest.raises(error, match=f"Seq2SeqConfig.{field}"):
        Seq2SeqConfig(**cfg)
    with pytest.raises(ValueError, match="share_embeddings needs src_vocab == tgt_vocab"):
        Seq2SeqConfig(src_vocab=5, tgt_vocab=6, d_model=16, n_head=2, share_embeddings=True)


def test_same_seed_same_model_and_nn_reexports_it():
    from pytfm import nn

    cfg = Seq2SeqConfig(src_vocab=SRC_V, tgt_vocab=TGT_V, d_model=16, n_head=2, d_ff=8)
    a, b, c = Transformer(cfg, seed=1), Transformer(cfg, seed=1), Transformer(cfg, seed=2)
    assert np.array_equal(a.params.buffer, b.params.buffer)
    assert not np.array_equal(a.params.buffer, c.params.buffer)
    assert nn.Transformer is Transformer and nn.Seq2SeqConfig is Seq2SeqConfig


def test_kv_cache_reorder_gathers_rows():
    from pytfm.kvcache import KVCache

    cache = KVCache(3, 4, 2, 5)
    rng = np.random.default_rng(12)
    k, v = (rng.standard_normal((3, 2, 2, 5)).astype(np.float32) for _ in range(2))
    cache.attend(rng.standard_normal((3, 2, 2, 5)).astype(np.float32), k, v)
    cache.reorder(np.array([1, 1, 0, 2]))
    assert len(cache) == 2 and cache.k.shape == (4, 4, 2, 5)
    assert np.array_equal(cache.k[:, :2], k[[1, 1, 0, 2]])
    assert np.array_equal(cache.v[:, :2], v[[1, 1, 0, 2]])
    with pytest.raises(ValueError, match=r"index\[0\] = -1"):
        cache.reorder(np.array([-1]))


def test_a_small_model_learns_to_reverse():
    """Reversing sequences of 4 to 6 tokens, padded in a batch: after 400 AdamW steps,
    greedy decoding through decode_step reverses held-out sequences (the loss path, the
    backward and the decoding agree on what was learnt)."""
    from pytfm.optim import AdamW

    V, BOS = 12, 1  # ids 2.. are the payload; 0 pads
    cfg = Seq2SeqConfig(src_vocab=V, tgt_vocab=V, d_model=32, n_head=4, n_enc_layers=1,
                        n_dec_layers=1, d_ff=64, max_len=8, norm="pre")
    model = Transformer(cfg, seed=0)
    opt = AdamW(model.params, model.grads, lr=3e-3, weight_decay=0.0)
    rng = np.random.default_rng(13)

    def sample(B):
        lens = rng.integers(4, 7, B)
        src = np.zeros((B, 6), np.int64)
        tgt_in, tgt_out = np.zeros((B, 7), np.int64), np.zeros((B, 7), np.int64)
        for b, n in enumerate(lens):
            src[b, :n] = rng.integers(2, V, n)
            tgt_in[b, 0], tgt_in[b, 1:n + 1] = BOS, src[b, :n][::-1]
            tgt_out[b, :n] = src[b, :n][::-1]
        return src, tgt_in, lens, lens + 1, tgt_out

    for _ in range(400):
        src, tgt_in, sl, tl, y = sample(32)
        model.zero_grad()
        model.forward(src, tgt_in, sl, tl, targets=y)
        model.backward()
        opt.step()
    src, _, sl, _, _ = sample(16)
    state = model.start_decode(src, sl)
    tokens, out = np.full(16, BOS), []
    for _ in range(6):
        tokens = model.decode_step(state, tokens).argmax(-1)
        out.append(tokens)
    out = np.stack(out, 1)
    right = sum(np.array_equal(out[b, :n], src[b, :n][::-1]) for b, n in enumerate(sl))
    assert right >= 12, f"{right} of 16 reversed"  # 14 to 15 seen; untrained: none
