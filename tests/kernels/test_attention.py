"""Attention's properties and the flash-style C kernel's own cases (its check against the naive
float64 reference on drawn sizes is tests/ops_registry.py's, run by test_ops.py)."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pytfm
from helpers import (
    EPS32,
    amax,
    assert_close,
    assert_same_bits_at_any_thread_count,
    f32,
    seeds,
    subprocess_env,
)
from ops_registry import (
    ATTENTION_BACKWARD,
    ATTENTION_FORWARD,
    ATTENTION_GQA_BACKWARD,
    ATTENTION_GQA_FORWARD,
    attention_backward_tol,
    attention_make,
    attention_tol,
    compare_with_reference,
    score_error,
    softmax_rel,
)
from pytfm import ops
from pytfm import reference as ref


def qkv(rng, B, T, H, D, scale=1.0):
    return [f32(rng, (B, T, H, D), scale) for _ in range(3)]


@pytest.mark.parametrize("T", [128, 255, 256, 257, 300])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_across_the_key_tiles(T, causal):
    """Lengths around the fast forward's 256-key tile (one tile per row up to 256, then a
    second one and the online rescale) and the model's T = 128, where the diagonal's
    micro-tiles are skipped in every product; against the reference, forward and backward
    (tests/ops_registry.py's checks, which tests/kernels/test_ops.py runs on drawn sizes)."""
    for op in (ATTENTION_FORWARD, ATTENTION_BACKWARD):
        compare_with_reference(op, dict(B=1, T=T, H=2, D=32, causal=causal, scale=None, seed=T))


@given(T=st.integers(1, 24), H=st.sampled_from([1, 3]), D=st.sampled_from([1, 8, 16]),
       data=st.data(), seed=seeds)
def test_attention_without_mask_is_permutation_equivariant(T, H, D, data, seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, T, H, D)
    o, lse = ops.attention_forward(q, k, v, causal=False)
    perm = np.array(data.draw(st.permutations(range(T))))
    # permuting the queries permutes the outputs: each row is computed on its own, bit for bit
    o_q, lse_q = ops.attention_forward(np.ascontiguousarray(q[:, perm]), k, v, causal=False)
    np.testing.assert_array_equal(o_q, o[:, perm])
    np.testing.assert_array_equal(lse_q, lse[:, :, perm])
    # permuting keys and values together changes only the order of a sum
    kp, vp = np.ascontiguousarray(k[:, perm]), np.ascontiguousarray(v[:, perm])
    o_kv, lse_kv = ops.attention_forward(q, kp, vp, causal=False)
    rel = softmax_rel(q, k, 1 / np.sqrt(D), T)
    assert_close("property.attention.kv_permutation", o_kv, o, atol=rel * amax(v))
    assert_close("property.attention.kv_permutation_lse", lse_kv, lse, atol=rel + EPS32 * amax(lse))


@given(T=st.integers(2, 70), t=st.integers(0, 68), D=st.sampled_from([1, 8, 64]), seed=seeds)
def test_causal_attention_ignores_the_future(T, t, D, seed):
    t = min(t, T - 2)
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, T, 3, D)
    o, lse = ops.attention_forward(q, k, v)
    q2, k2, v2 = (a.copy() for a in (q, k, v))
    for a in (q2, k2, v2):
        a[:, t + 1:] = f32(rng, a[:, t + 1:].shape, 100.0)  # change everything after t
    o2, lse2 = ops.attention_forward(q2, k2, v2)
    np.testing.assert_array_equal(o2[:, : t + 1], o[:, : t + 1])
    np.testing.assert_array_equal(lse2[:, :, : t + 1], lse[:, :, : t + 1])
    assert not np.array_equal(o2[:, t + 1:], o[:, t + 1:])
    # and backwards: a loss on outputs <= t sends no gradient to keys or values after t
    dy = f32(rng, o.shape)
    dy[:, t + 1:] = 0.0
    _, dk, dv = ops.attention_backward(dy, q, k, v, o, lse)
    assert not dk[:, t + 1:].any() and not dv[:, t + 1:].any()


@given(T=st.integers(1, 40), half=st.sampled_from([1, 4, 8]), shift=st.integers(1, 5000),
       seed=seeds)
def test_rope_attention_depends_only_on_relative_position(T, half, shift, seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, T, 2, 2 * half)
    pos = np.arange(T, dtype=np.int64)

    def attend(p):
        return ops.attention_forward(ops.rope_forward(q, p), ops.rope_forward(k, p), v)[0]

    D = 2 * half
    rel = softmax_rel(q, k, 1 / np.sqrt(D), T)  # rotated q, k have the same norms
    assert_close("property.attention.rope_shift", attend(pos + shift), attend(pos),
                 atol=2 * rel * amax(v))


@given(B=st.sampled_from([1, 2]), T=st.integers(1, 70), H=st.sampled_from([1, 3]),
       D=st.sampled_from([1, 8, 16]), prompt=st.integers(0, 70), spare=st.integers(0, 5),
       seed=seeds)
def test_decoding_through_the_kv_cache_reproduces_the_full_forward(B, T, H, D, prompt, spare,
                                                                   seed):
    prompt = min(prompt, T)
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, B, T, H, D)
    o, lse = ops.attention_forward(q, k, v)
    cache = pytfm.KVCache(B, T + spare, H, D)
    C = np.ascontiguousarray
    outs = [cache.attend(C(q[:, :prompt]), C(k[:, :prompt]), C(v[:, :prompt]))] if prompt else []
    for t in range(prompt, T):  # then one token at a time
        outs.append(cache.attend(C(q[:, t:t + 1]), C(k[:, t:t + 1]), C(v[:, t:t + 1])))
    assert len(cache) == T
    assert_close("property.attention.decode", np.concatenate(outs, axis=1), o,
                 atol=1e-6 * amax(v), rtol=1e-6)
    # the lower-level call gives the log-sum-exp too
    _, lse_last = ops.attention_decode(C(q[:, -1:]), cache.k, cache.v, start=T - 1)
    assert_close("property.attention.decode_lse", lse_last[..., 0], lse[..., -1], atol=1e-6,
                 rtol=1e-6)


@given(T=st.integers(1, 40), D=st.sampled_from([1, 16, 64]), causal=st.booleans(),
       magnitude=st.sampled_from([1e3, 1e4]), seed=seeds)
def test_huge_scores_stay_finite_and_correct(T, D, causal, magnitude, seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 1, T, 2, D)
    s = float(magnitude)  # with this scale the scores are about ±magnitude
    o, lse = ops.attention_forward(q, k, v, causal, scale=s)
    ro, rlse = ref.attention_forward(q, k, v, causal, scale=s)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    delta = score_error(q, k, s)
    assert_close("attention.huge_scores.o", o, ro, atol=np.expm1(2 * delta) * amax(v) + 1e-6)
    assert_close("attention.huge_scores.lse", lse, rlse, atol=delta + EPS32 * amax(rlse))
    grads = ops.attention_backward(f32(rng, q.shape), q, k, v, o, lse, causal, scale=s)
    assert all(np.isfinite(g).all() for g in grads)


def test_results_do_not_depend_on_the_thread_count():
    assert_same_bits_at_any_thread_count(
        """
        import numpy as np
        from pytfm import ops
        rng = np.random.default_rng(7)
        q, k, v, dy = (rng.standard_normal((3, 77, 5, 24)).astype(np.float32) for _ in range(4))
        o, lse = ops.attention_forward(q, k, v)
        out = [o, lse, *ops.attention_backward(dy, q, k, v, o, lse)]
        """,
        threads=(1, 2, 3, 5),
    )


# ---- bad input (the ops' own cases are tests/ops_registry.py's, run by test_errors.py) ---------


def test_a_kv_cache_of_no_positions_is_refused():
    with pytest.raises(ValueError, match=r"KVCache sizes must all be >= 1"):
        pytfm.KVCache(1, 0, 2, 4)


def test_a_full_kv_cache_refuses_more_and_keeps_its_contents():
    rng = np.random.default_rng(0)
    cache = pytfm.KVCache(1, 4, 2, 8)
    q, k, v = qkv(rng, 1, 3, 2, 8)
    cache.attend(q, k, v)
    before = cache.k.copy(), cache.v.copy()
    with pytest.raises(ValueError, match=r"cache overflow: positions \[3, 5\)"):
        cache.attend(*qkv(rng, 1, 2, 2, 8))
    _, k1, v1 = qkv(rng, 1, 1, 2, 8)
    with pytest.raises(ValueError, match=r"k must have shape \(1, 3, 2, 8\)"):
        cache.attend(q, k1, v1)  # q and k of different lengths
    assert len(cache) == 3
    np.testing.assert_array_equal(cache.k, before[0])
    np.testing.assert_array_equal(cache.v, before[1])
    # the C function checks too, for C callers
    from pytfm._core import ffi, lib

    p = lambda a: ffi.from_buffer("float[]", a)  # noqa: E731
    st_ = lib.pytfm_attention_cache_append(p(cache.k), p(cache.v), p(k), p(v), 1, 3, 2, 8, 4, 2)
    assert st_ == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "cache overflow" in ffi.string(lib.pytfm_last_error()).decode()
    np.testing.assert_array_equal(cache.k, before[0])


def test_attention_memory_does_not_grow_with_t_squared():
    """Extra memory beyond inputs and outputs: tiles and a transposed copy of one head's keys
    and values per thread (linear in T), not [T, T]."""
    code = textwrap.dedent(
        """
        import resource, numpy as np
        from pytfm import ops
        B, T, H, D = 1, 4096, 2, 16
        q, k, v, dy = (np.ones((B, T, H, D), np.float32) for _ in range(4))
        o, lse = ops.attention_forward(q, k, v)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(2):
            o, lse = ops.attention_forward(q, k, v)
            grads = ops.attention_backward(dy, q, k, v, o, lse)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
        """
    )
    env = subprocess_env(os.path.dirname(os.path.dirname(ops.__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                       check=True, env=env)
    grown_kib = int(r.stdout)
    # one [T, T] float32 matrix per head would be 2·64 MiB; the outputs are 2 MiB in all
    assert grown_kib < 16 * 1024, f"peak RSS grew by {grown_kib} KiB"



# ---- grouped-query heads, a sliding window, head dims of their own ---------------------------


def gqa(rng, B, T, H, Hkv, D):
    """q [B, T, H, D], k, v [B, T, Hkv, D]"""
    return f32(rng, (B, T, H, D)), f32(rng, (B, T, Hkv, D)), f32(rng, (B, T, Hkv, D))


def repeat_kv(x, G):  # [B, T, Hkv, D] -> [B, T, Hkv·G, D]: head h is kv head h // G
    return np.ascontiguousarray(np.repeat(x, G, axis=2))


@pytest.mark.parametrize("T", [1, 64, 65, 257, 300])
@pytest.mark.parametrize("window", [0, 1, 64, 100, 256])
def test_gqa_across_the_key_tiles(T, window):
    """Grouped heads and windows around the fast kernels' tiles (64 and 256 keys: a window
    that starts mid-tile, one whose rows skip whole tiles) against the reference"""
    for op in (ATTENTION_GQA_FORWARD, ATTENTION_GQA_BACKWARD):
        compare_with_reference(op, dict(B=1, T=T, H=2, D=32, causal=True, scale=None, seed=T,
                                        group=3, window=window))


@given(B=st.sampled_from([1, 2]), T=st.integers(1, 80), Hkv=st.sampled_from([1, 2]),
       G=st.sampled_from([1, 2, 4]), D=st.sampled_from([1, 5, 16, 64]), causal=st.booleans(),
       window=st.sampled_from([0, 1, 3, 16, 70]), seed=seeds)
def test_gqa_is_multi_head_attention_on_repeated_kv(B, T, Hkv, G, D, causal, window, seed):
    """Query head h reads key/value head h // G (transformers' repeat_kv): the same as
    multi-head attention on k, v repeated per group, bit for bit forward and for dq (each
    head's rows are computed alike); dk and dv are the sums over the group's heads of the
    multi-head gradients (summed in another order, so within both results' bounds)."""
    window = window if causal else 0
    rng = np.random.default_rng(seed)
    q, k, v = gqa(rng, B, T, Hkv * G, Hkv, D)
    dy = f32(rng, q.shape)
    o, lse = ops.attention_forward(q, k, v, causal, window=window)
    kr, vr = repeat_kv(k, G), repeat_kv(v, G)
    o_r, lse_r = ops.attention_forward(q, kr, vr, causal, window=window)
    np.testing.assert_array_equal(o, o_r)
    np.testing.assert_array_equal(lse, lse_r)
    dq, dk, dv = ops.attention_backward(dy, q, k, v, o, lse, causal, window=window)
    dq_r, dk_r, dv_r = ops.attention_backward(dy, q, kr, vr, o_r, lse_r, causal, window=window)
    assert dk.shape == k.shape and dv.shape == v.shape
    np.testing.assert_array_equal(dq, dq_r)
    a = dict(q=q, k=k, v=v, dy=dy, scale=None, group=G)
    want = ref.attention_backward(dy, q, k, v, causal, None, window)
    tol = attention_backward_tol(a, want)  # each of the two is within this of the reference
    for name, got, heads, t in (("dk", dk, dk_r, tol[1]), ("dv", dv, dv_r, tol[2])):
        summed = heads.reshape(B, T, Hkv, G, D).sum(axis=3)
        assert_close(f"property.attention.gqa_{name}", got, summed, atol=2 * t.atol, rtol=0)


def torch_attention(q, k, v, causal, window, scale, dy):
    """torch's scaled_dot_product_attention in float64 with enable_gqa (its own repeat of the
    key/value heads) and transformers' sliding-window mask -> o, dq, dk, dv (autograd)"""
    torch = pytest.importorskip("torch")
    masking = pytest.importorskip("transformers.masking_utils")
    T = q.shape[1]
    idx = torch.arange(T)
    if window:
        mask = masking.sliding_window_causal_mask_function(window)(0, 0, idx[:, None], idx[None])
    elif causal:
        mask = masking.causal_mask_function(0, 0, idx[:, None], idx[None])
    else:
        mask = None
    qt, kt, vt = (torch.tensor(x, dtype=torch.float64).transpose(1, 2).requires_grad_()
                  for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask,
                                                         scale=scale, enable_gqa=True)
    o.backward(torch.tensor(dy, dtype=torch.float64).transpose(1, 2))
    return [x.transpose(1, 2).detach().numpy() for x in (o, qt.grad, kt.grad, vt.grad)]


@given(T=st.integers(1, 70), Hkv=st.sampled_from([1, 2]), G=st.sampled_from([1, 3, 4]),
       D=st.sampled_from([3, 64, 128, 256]), causal=st.booleans(),
       window=st.sampled_from([0, 1, 2, 17, 64]), seed=seeds)
def test_attention_matches_torch_sdpa_with_gqa(T, Hkv, G, D, causal, window, seed):
    """Forward and every gradient against torch's SDPA (enable_gqa, transformers' masks); D of
    its own (3, 256: not d_model / n_head of any model here)"""
    window = window if causal else 0
    a = attention_make(seed, 2, T, Hkv, D, causal, None, G, window)
    q, k, v, dy = a["q"], a["k"], a["v"], a["dy"]
    scale = 1 / np.sqrt(D)
    o_t, dq_t, dk_t, dv_t = torch_attention(q, k, v, causal, window, scale, dy)
    o, lse = ops.attention_forward(q, k, v, causal, window=window)
    assert_close("attention.torch_sdpa.o", o, o_t, *attention_tol(a, [o_t, lse])[0])
    grads = ops.attention_backward(dy, q, k, v, o, lse, causal, window=window)
    for name, got, want, t in zip(("dq", "dk", "dv"), grads, (dq_t, dk_t, dv_t),
                                  attention_backward_tol(a, [dq_t, dk_t, dv_t])):
        assert_close(f"attention.torch_sdpa.{name}", got, want, *t)


@pytest.mark.parametrize("window", [1, 2, 3, 5, 16, 4096])
def test_sliding_window_matches_transformers_mask(window):
    """The window's off-by-one as transformers has it (sliding_window_overlay: kv > q − w, on
    top of the causal mask), and Mistral's eager attention (repeat_kv, that mask) on float32
    inputs against ours"""
    torch = pytest.importorskip("torch")
    masking = pytest.importorskip("transformers.masking_utils")
    mistral = pytest.importorskip("transformers.models.mistral.modeling_mistral")
    T, Hkv, G, D = 40, 2, 3, 16
    idx = torch.arange(T)
    mask = masking.sliding_window_causal_mask_function(window)(0, 0, idx[:, None], idx[None])
    np.testing.assert_array_equal(ref.attention_mask(T, True, window), mask.numpy())
    # ours attends exactly there: a key outside row t's window changes nothing of row t
    rng = np.random.default_rng(window)
    q, k, v = gqa(rng, 1, T, Hkv * G, Hkv, D)
    o, lse = ops.attention_forward(q, k, v, window=window)

    class Module:
        num_key_value_groups, training = G, False

    additive = torch.where(mask, 0.0, -torch.inf)[None, None]
    qt, kt, vt = (torch.tensor(x).transpose(1, 2) for x in (q, k, v))
    o_hf, _ = mistral.eager_attention_forward(Module(), qt, kt, vt, additive, 1 / np.sqrt(D))
    a = dict(q=q, k=k, v=v, scale=None)
    tol = attention_tol(a, [o, lse])[0]
    assert_close("attention.mistral_eager.o", o, o_hf.numpy(), atol=2 * tol.atol, rtol=0)


@given(T=st.integers(2, 90), window=st.integers(1, 40), t=st.integers(0, 89),
       D=st.sampled_from([1, 8, 64]), data=st.data(), seed=seeds)
def test_a_window_ignores_keys_outside_it_and_their_order_inside(T, window, t, D, data, seed):
    """Row t sees keys (t − w, t] only: keys and values before it may change at will (row t's
    bits stay; nor does any gradient reach them from row t), and permuting the keys within it
    (with their values) changes only the order of a sum"""
    t = min(t, T - 1)
    rng = np.random.default_rng(seed)
    q, k, v = gqa(rng, 2, T, 4, 2, D)
    o, lse = ops.attention_forward(q, k, v, window=window)
    lo = max(0, t - window + 1)
    k2, v2 = k.copy(), v.copy()
    k2[:, :lo], v2[:, :lo] = f32(rng, k2[:, :lo].shape, 100.0), f32(rng, v2[:, :lo].shape, 100.0)
    o2, lse2 = ops.attention_forward(q, k2, v2, window=window)
    np.testing.assert_array_equal(o2[:, t], o[:, t])
    np.testing.assert_array_equal(lse2[:, :, t], lse[:, :, t])
    dy = np.zeros_like(q)
    dy[:, t] = f32(rng, dy[:, t].shape)
    _, dk, dv = ops.attention_backward(dy, q, k, v, o, lse, window=window)
    assert not dk[:, :lo].any() and not dv[:, :lo].any() and not dk[:, t + 1:].any()
    assert dv[:, lo:t + 1].any()
    perm = lo + np.array(data.draw(st.permutations(range(t + 1 - lo))))
    kp, vp = k.copy(), v.copy()
    kp[:, lo:t + 1], vp[:, lo:t + 1] = k[:, perm], v[:, perm]
    op, lsep = ops.attention_forward(q, kp, vp, window=window)
    rel = softmax_rel(q, k, 1 / np.sqrt(D), window)
    assert_close("property.attention.window_permutation", op[:, t], o[:, t], atol=rel * amax(v))
    assert_close("property.attention.window_permutation_lse", lsep[:, :, t], lse[:, :, t],
                 atol=rel + EPS32 * amax(lse))


@given(B=st.sampled_from([1, 2]), T=st.integers(1, 70), Hkv=st.sampled_from([1, 2]),
       G=st.sampled_from([1, 2, 3]), D=st.sampled_from([1, 8, 96]),
       window=st.sampled_from([0, 1, 4, 33]), prompt=st.integers(0, 70), seed=seeds)
def test_gqa_window_decoding_equals_the_forward(B, T, Hkv, G, D, window, prompt, seed):
    """A cache of Hkv heads (its memory 1/G of the multi-head one) decoding a prompt, then a
    token at a time, with a window: the full forward's rows, and the last one's lse"""
    prompt = min(prompt, T)
    rng = np.random.default_rng(seed)
    q, k, v = gqa(rng, B, T, Hkv * G, Hkv, D)
    o, lse = ops.attention_forward(q, k, v, window=window)
    cache = pytfm.KVCache(B, T + 2, Hkv * G, D, n_kv_head=Hkv, window=window)
    assert cache.k.shape == (B, T + 2, Hkv, D) and cache.v.shape == cache.k.shape
    C = np.ascontiguousarray
    outs = [cache.attend(C(q[:, :prompt]), C(k[:, :prompt]), C(v[:, :prompt]))] if prompt else []
    for t in range(prompt, T):
        outs.append(cache.attend(C(q[:, t:t + 1]), C(k[:, t:t + 1]), C(v[:, t:t + 1])))
    assert_close("property.attention.gqa_decode", np.concatenate(outs, axis=1), o,
                 atol=1e-6 * amax(v), rtol=1e-6)
    o_last, lse_last = ops.attention_decode(C(q[:, -1:]), cache.k, cache.v, start=T - 1,
                                            window=window)
    assert_close("property.attention.gqa_decode_last", o_last[:, 0], o[:, -1],
                 atol=1e-6 * amax(v), rtol=1e-6)
    assert_close("property.attention.gqa_decode_lse", lse_last[..., 0], lse[..., -1], atol=1e-6,
                 rtol=1e-6)


def test_a_kv_cache_checks_its_grouped_heads():
    with pytest.raises(ValueError, match=r"n_kv_head = 3 must divide n_head = 4"):
        pytfm.KVCache(1, 4, 4, 8, n_kv_head=3)
    with pytest.raises(ValueError, match=r"window must be >= 0"):
        pytfm.KVCache(1, 4, 4, 8, n_kv_head=2, window=-1)
    cache = pytfm.KVCache(1, 4, 4, 8, n_kv_head=2)
    rng = np.random.default_rng(0)
    q, k, v = gqa(rng, 1, 2, 4, 2, 8)
    with pytest.raises(ValueError, match=r"q must have n_head = 4 heads, got shape \(1, 2, 2, 8\)"):
        cache.attend(k, k, v)
    with pytest.raises(ValueError, match=r"k must have shape \(1, 2, 2, 8\)"):
        cache.attend(q, q, v)
    assert len(cache) == 0 and not cache.k.any()


def test_the_c_functions_refuse_bad_groups_and_windows():
    """For C callers: Hkv not dividing H, a window without causal, a negative window"""
    from pytfm._core import ffi, lib

    x = np.zeros(64, np.float32)
    p = lambda: ffi.from_buffer("float[]", x.copy())  # noqa: E731
    cases = (((1, 2, 3, 2, 4, 0.5, 1, 0), r"Hkv must divide H .*got H = 3, Hkv = 2"),
             ((1, 2, 2, 0, 4, 0.5, 1, 0), r"Hkv must divide H"),
             ((1, 2, 2, 1, 4, 0.5, 0, 3), r"window = 3 needs causal attention"),
             ((1, 2, 2, 1, 4, 0.5, 1, -1), r"window must be >= 0 \(0: no window\), got -1"))
    for args, pattern in cases:
        st_ = lib.pytfm_attention_gqa_forward(p(), p(), p(), p(), p(), *args)
        assert st_ == lib.PYTFM_STATUS_INVALID_ARGUMENT
        assert re.search(pattern, ffi.string(lib.pytfm_last_error()).decode()), pattern
