"""Attention with Tq != Tk and padded sequences (pytfm_attention_padded_forward/backward, what
ops.attention_forward/backward run with q_lens, k_lens or Tk != Tq): its properties, on the
plain loops (PYTFM_ISA_PLAIN) and on the fast tiled path alike. Its check against the float64
reference on drawn sizes is also tests/ops_registry.py's (test_ops.py), its fast path against
the plain one test_fast.py's."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytfm
from helpers import assert_close, bits, f32, last_error, max_isa, seeds
from ops_registry import (
    ATTENTION_PADDED_BACKWARD,
    ATTENTION_PADDED_FORWARD,
    attention_backward_tol,
    attention_tol,
    compare_with_reference,
    padded_make,
    softmax_rel,
)
from pytfm import ops
from pytfm import reference as ref

# the plain loops, and the best path this CPU has (tiled from 8 queries, rows below that)
ISAS = ["plain", "auto"]

sizes = dict(B=st.integers(1, 4), Tq=st.one_of(st.integers(1, 20), st.sampled_from([33, 65, 70])),
             Tk=st.one_of(st.integers(1, 20), st.sampled_from([33, 65, 70])),
             H=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]),
             D=st.sampled_from([1, 5, 16, 64]))


def isa_is(isa):
    """a context capping the kernels at isa ("auto": none)"""
    if isa == "auto":
        pytfm.set_max_isa("auto")
        return _nothing()
    return max_isa(isa)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def lens_of(a):
    return dict(window=a["window"], q_lens=a["q_lens"], k_lens=a["k_lens"])


def forward_backward(a, **changed):
    """o, lse, dq, dk, dv of a (with the arrays in changed instead of a's)"""
    x = {**a, **changed}
    o, lse = ops.attention_forward(x["q"], x["k"], x["v"], x["causal"], **lens_of(x))
    o_in, lse_in = changed.get("o", o), changed.get("lse", lse)
    return [o, lse, *ops.attention_backward(x["dy"], x["q"], x["k"], x["v"], o_in, lse_in,
                                            x["causal"], **lens_of(x))]


def full(lens, B, T):
    return [T] * B if lens is None else lens


@pytest.mark.parametrize("isa", ISAS)
@given(**sizes, causal=st.booleans(), window=st.sampled_from([0, 1, 4]),
       lens=st.sampled_from(["none", "q", "k", "both"]), seed=seeds)
def test_padded_attention_matches_the_reference(isa, B, Tq, Tk, H, group, D, causal, window,
                                                lens, seed):
    """Forward and backward against the float64 reference on drawn shapes and lengths, and a
    row that sees no key is o = 0, lse = -inf exactly (assert_close lets -inf pass as equal to
    NaN: checked here)"""
    values = dict(B=B, Tq=Tq, Tk=Tk, H=H, group=group, D=D, causal=causal, scale=None,
                  window=window, lens=lens, seed=seed)
    with isa_is(isa):
        for op in (ATTENTION_PADDED_FORWARD, ATTENTION_PADDED_BACKWARD):
            compare_with_reference(op, values)
        a = padded_make(**values)
        o, lse = ops.attention_forward(a["q"], a["k"], a["v"], causal, **lens_of(a))
    _, want = ref.attention_forward(a["q"], a["k"], a["v"], causal, **lens_of(a))
    empty = np.isneginf(want)  # [B, H, Tq]: rows that see no key
    assert np.array_equal(np.isneginf(lse), empty)
    assert not o.transpose(0, 2, 1, 3)[empty].any()


@pytest.mark.parametrize("isa", ISAS)
@given(**sizes, causal=st.booleans(), seed=seeds)
def test_padded_rows_and_keys_get_no_gradient(isa, B, Tq, Tk, H, group, D, causal, seed):
    """Rows past q_len: o = 0, lse = -inf, dq = 0; keys past k_len: dk = dv = 0; a sequence
    with no keys: o = 0 and no gradient anywhere; exactly"""
    a = padded_make(seed, B, Tq, Tk, H, D, causal, group=group)
    a["k_lens"][0] = 0
    with isa_is(isa):
        o, lse, dq, dk, dv = forward_backward(a)
    for b, (nq, nk) in enumerate(zip(a["q_lens"], a["k_lens"])):
        assert not o[b, nq:].any() and not dq[b, nq:].any()
        assert np.isneginf(lse[b, :, nq:]).all()
        assert not dk[b, nk:].any() and not dv[b, nk:].any()
    assert not o[0].any() and not dq[0].any() and np.isneginf(lse[0]).all()


@pytest.mark.parametrize("isa", ISAS)
@given(**sizes, causal=st.booleans(), window=st.sampled_from([0, 3]), data=st.data(),
       seed=seeds)
def test_padding_and_other_sequences_do_not_matter(isa, B, Tq, Tk, H, group, D, causal, window,
                                                   data, seed):
    """A sequence's results are the same bits whatever its padding holds (NaN, huge values: in
    q, k, v, dy, and in the o and lse the backward is given) and whatever the other sequences
    of the batch are (it alone in a batch of one)"""
    a = padded_make(seed, B, Tq, Tk, H, D, causal, group=group, window=window)
    rng = np.random.default_rng(seed)
    with isa_is(isa):
        got = forward_backward(a)
        junk = {}
        for name, lens in (("q", "q_lens"), ("dy", "q_lens"), ("k", "k_lens"), ("v", "k_lens")):
            x = a[name].copy()
            for b, n in enumerate(a[lens]):
                x[b, n:] = data.draw(st.sampled_from([np.nan, 1e30, -np.inf]))
                x[b, n:] *= f32(rng, x[b, n:].shape) > 0  # (NaN stays NaN: it is still junk)
            junk[name] = x
        o, lse = (x.copy() for x in got[:2])
        for b, n in enumerate(a["q_lens"]):
            o[b, n:], lse[b, :, n:] = np.nan, 7.0
        again = forward_backward(a, o=o, lse=lse, **junk)
        for i, (g, h) in enumerate(zip(got, again)):
            np.testing.assert_array_equal(bits(g), bits(h), err_msg=f"output {i}")
        b = data.draw(st.integers(0, B - 1))
        one = {**a, "q_lens": a["q_lens"][b:b + 1], "k_lens": a["k_lens"][b:b + 1]}
        for name in ("q", "k", "v", "dy"):
            one[name] = np.ascontiguousarray(a[name][b:b + 1])
        alone = forward_backward(one)
    for i, (g, h) in enumerate(zip(got, alone)):
        np.testing.assert_array_equal(bits(g[b:b + 1]), bits(h), err_msg=f"output {i}")


@pytest.mark.parametrize("isa", ISAS)
@given(**sizes, data=st.data(), seed=seeds)
def test_non_causal_keys_of_a_sequence_are_a_set(isa, B, Tq, Tk, H, group, D, data, seed):
    """Without a causal mask the valid keys of a sequence are a set: permuting them (keys and
    values together, each sequence its own permutation) moves its results by the order of a
    sum only (the padding left where it is), and dk, dv are permuted with them"""
    a = padded_make(seed, B, Tq, Tk, H, D, False, group=group)
    perm = np.tile(np.arange(Tk), (B, 1))
    for b, n in enumerate(a["k_lens"]):
        perm[b, :n] = data.draw(st.permutations(range(n)))
    rows = np.arange(B)[:, None]
    with isa_is(isa):
        o, lse, dq, dk, dv = forward_backward(a)
        po, plse, pdq, pdk, pdv = forward_backward(a, k=np.ascontiguousarray(a["k"][rows, perm]),
                                                   v=np.ascontiguousarray(a["v"][rows, perm]))
    rel = softmax_rel(a["q"], a["k"], 1 / np.sqrt(D), Tk)
    tol_o, tol_lse = attention_tol(a, [o, lse])
    assert_close("padded.kv_permutation.o", po, o, *tol_o)
    assert_close("padded.kv_permutation.lse", plse, lse, *tol_lse)
    assert np.array_equal(np.isneginf(plse), np.isneginf(lse))
    want = [dq, dk[rows, perm], dv[rows, perm]]
    for name, got, w, t in zip(("dq", "dk", "dv"), (pdq, pdk, pdv), want,
                               attention_backward_tol(a, want)):
        assert_close(f"padded.kv_permutation.{name}", got, w, atol=2 * t.atol + rel, rtol=t.rtol)


@pytest.mark.parametrize("isa", ISAS)
@given(B=st.integers(1, 3), T=st.sampled_from([1, 7, 8, 33, 70]), Hkv=st.sampled_from([1, 2]),
       causal=st.booleans(), window=st.sampled_from([0, 5]), seed=seeds)
def test_without_lengths_it_is_the_gqa_function_bit_for_bit(isa, B, T, Hkv, causal, window,
                                                            seed):
    """pytfm_attention_padded_* with Tq = Tk and NULL lengths, called through cffi, against
    pytfm_attention_gqa_* (ops without lengths): the same bits"""
    from pytfm._core import ffi, lib

    a = padded_make(seed, B, T, T, Hkv, 8, causal, group=2, window=window, lens="none")
    q, k, v, dy = a["q"], a["k"], a["v"], a["dy"]
    H, D, window = 2 * Hkv, 8, a["window"]
    p = lambda x: ffi.from_buffer("float[]", x)  # noqa: E731
    with isa_is(isa):
        o, lse = ops.attention_forward(q, k, v, causal, window=window)
        grads = ops.attention_backward(dy, q, k, v, o, lse, causal, window=window)
        o2, lse2 = np.empty_like(o), np.empty_like(lse)
        assert lib.pytfm_attention_padded_forward(p(o2), p(lse2), p(q), p(k), p(v), ffi.NULL,
                                                  ffi.NULL, B, T, T, H, Hkv, D, 1 / np.sqrt(D),
                                                  causal, window) == 0
        g2 = [np.empty_like(q), np.empty_like(k), np.empty_like(k)]
        assert lib.pytfm_attention_padded_backward(*map(p, g2), p(dy), p(q), p(k), p(v), p(o),
                                                   p(lse), ffi.NULL, ffi.NULL, B, T, T, H, Hkv,
                                                   D, 1 / np.sqrt(D), causal, window) == 0
    for got, want in zip([o2, lse2, *g2], [o, lse, *grads]):
        np.testing.assert_array_equal(bits(got), bits(want))


def test_the_c_functions_refuse_bad_lengths():
    """A length outside [0, T] is INVALID_ARGUMENT naming q_len or k_len and the sequence,
    before anything is written"""
    from pytfm._core import ffi, lib

    B, Tq, Tk, H, D = 3, 4, 6, 2, 8
    q, o = np.zeros((B, Tq, H, D), np.float32), np.full((B, Tq, H, D), 5.0, np.float32)
    k = np.zeros((B, Tk, H, D), np.float32)
    lse = np.zeros((B, H, Tq), np.float32)
    p = lambda x: ffi.from_buffer("float[]", x)  # noqa: E731
    i = lambda *x: ffi.new("int64_t[]", list(x))  # noqa: E731
    for q_len, k_len, message in (
            (i(1, -1, 2), ffi.NULL, "q_len[1] must be in [0, Tq] = [0, 4], got -1"),
            (i(1, 1, 5), ffi.NULL, "q_len[2] must be in [0, Tq] = [0, 4], got 5"),
            (ffi.NULL, i(7, 0, 0), "k_len[0] must be in [0, Tk] = [0, 6], got 7"),
            (i(4, 4, 4), i(0, 6, -(2**63)), "k_len[2] must be in [0, Tk] = [0, 6], got "
                                            f"{-(2**63)}")):
        st_ = lib.pytfm_attention_padded_forward(p(o), p(lse), p(q), p(k), p(k), q_len, k_len, B,
                                                 Tq, Tk, H, H, D, 0.5, 1, 0)
        assert st_ == lib.PYTFM_STATUS_INVALID_ARGUMENT
        assert last_error() == f"pytfm_attention_padded_forward: {message}"
        assert (o == 5.0).all()
        st_ = lib.pytfm_attention_padded_backward(p(o), p(k.copy()), p(k.copy()), p(q), p(q),
                                                  p(k), p(k), p(q), p(lse), q_len, k_len, B, Tq,
                                                  Tk, H, H, D, 0.5, 1, 0)
        assert st_ == lib.PYTFM_STATUS_INVALID_ARGUMENT
        assert last_error() == f"pytfm_attention_padded_backward: {message}"
        assert (o == 5.0).all()
    st_ = lib.pytfm_attention_padded_forward(p(o), p(lse), p(q), p(k), p(k), ffi.NULL, ffi.NULL,
                                             B, Tq, -1, H, H, D, 0.5, 1, 0)
    assert st_ == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "B, Tq, Tk, H must be >= 0, got 3, 4, -1, 2" in last_error()


def test_fp32_only_with_lengths_or_cross_attention():
    """The tensor-core precisions take no lengths and no Tk != Tq: a ValueError saying to use
    fp32 (on NumPy arrays, where they do not run at all, the same word)"""
    q, k = np.zeros((1, 3, 2, 4), np.float32), np.zeros((1, 5, 2, 4), np.float32)
    for precision in ("tf32", "bf16"):
        with pytest.raises(ValueError, match=r"use 'fp32'"):
            ops.attention_forward(q, k, k, precision=precision)
        with pytest.raises(ValueError, match=r"'fp32'"):
            ops.attention_forward(q, q, q, precision=precision, q_lens=[1])


def torch_padded(a, scale):
    """torch's scaled_dot_product_attention in float64 with the boolean attn_mask of the
    lengths (and causal, top-left: tril(ones(Tq, Tk))) -> o, dq, dk, dv, and which rows see a
    key. torch gives NaN to a row with no key (and to every gradient it touches), so such a
    row attends to everything there, with dy = 0 on it: it then adds nothing anywhere."""
    torch = pytest.importorskip("torch")
    q, k, v, dy = a["q"], a["k"], a["v"], a["dy"].copy()
    B, Tq, H, _ = q.shape
    Tk, G = k.shape[1], H // k.shape[2]
    seen = ref.attention_seen(B, Tq, Tk, a["causal"], a["window"], a["q_lens"], a["k_lens"])
    sees = seen.any(axis=-1)  # [B, Tq]
    mask = np.where(sees[..., None], seen, True)[:, None]  # [B, 1, Tq, Tk]
    dy[~sees] = 0.0
    qt, kt, vt = (torch.tensor(x, dtype=torch.float64).transpose(1, 2).requires_grad_()
                  for x in (q, np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)))
    o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=torch.tensor(mask),
                                                         scale=scale)
    o.backward(torch.tensor(dy, dtype=torch.float64).transpose(1, 2))
    o, dq, dk, dv = (x.transpose(1, 2).detach().numpy() for x in (o, qt.grad, kt.grad, vt.grad))
    group = lambda g: g.reshape(B, Tk, -1, G, g.shape[-1]).sum(axis=3)  # noqa: E731
    return o, dq, group(dk), group(dv), sees


@settings(max_examples=30)
@given(**sizes, causal=st.booleans(), window=st.sampled_from([0, 2]), seed=seeds)
def test_padded_attention_matches_torch_sdpa(B, Tq, Tk, H, group, D, causal, window, seed):
    """Forward and every gradient against torch's SDPA with the equivalent boolean mask (the
    encoder-decoder's padding masks, torch.nn.Transformer's way), float64"""
    a = padded_make(seed, B, Tq, Tk, H, D, causal, group=group, window=window)
    scale = 1 / np.sqrt(D)
    o_t, dq_t, dk_t, dv_t, sees = torch_padded(a, scale)
    o, lse, dq, dk, dv = forward_backward(a)
    tol_o = attention_tol(a, [o_t, lse])[0]
    assert_close("padded.torch_sdpa.o", o[sees], o_t[sees], *tol_o)
    assert not o[~sees].any() and not dq[~sees].any()
    for name, got, want, t in zip(("dq", "dk", "dv"), (dq, dk, dv), (dq_t, dk_t, dv_t),
                                  attention_backward_tol(a, [dq_t, dk_t, dv_t])):
        assert_close(f"padded.torch_sdpa.{name}", got, want, *t)
