"""Attention's properties and the flash-style C kernel's own cases (its check against the naive
float64 reference on drawn sizes is tests/ops_registry.py's, run by test_ops.py)."""

import os
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

