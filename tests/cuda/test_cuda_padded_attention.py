"""The GPU attention with Tq != Tk and padded sequences (pytfm_attention_padded_*_cuda of
cuda/attention.cu), run on the CPU by the emulator (cuda/emu), against a float64 reference of
the contract (pytfm_cuda.h): query row i of sequence b sees key s iff i < q_len[b],
s < k_len[b], with causal s <= i (top-left aligned), with a window w also s > i - w; a row that
sees no key gets o = 0, lse = -inf, dq = 0 and adds nothing to dk, dv; keys no row sees get
dk = dv = 0.

Shapes that break the tiles: Tq < Tk and Tq > Tk, one past a 64-row tile, Tq = 1 (the 16-row
tiles of a decoding step), lengths of 0, partial and full, every head-dim class, groups of
query heads; with NULL lengths and Tq = Tk the gqa functions' bits; a length outside [0, T]
(the caller's to check) clamped, reading and writing nothing out of bounds. Each kernel case
runs in both thread orders, on guarded 16-byte aligned buffers (tests/cuda_emu.py).
"""

import math
import os

import numpy as np
import pytest

from cuda_emu import CUDA, Aligned, EmuError
from helpers import EPS32, amax, assert_close, f32
from ops_registry import softmax_rel

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")


# ---- the float64 reference of the contract ---------------------------------------------------

def visible(Tq, Tk, q_len, k_len, causal, window):  # -> [Tq, Tk] bool
    i, s = np.arange(Tq)[:, None], np.arange(Tk)[None, :]
    seen = (i < q_len) & (s < k_len)
    if causal:
        seen &= s <= i
    if window:
        seen &= s > i - window
    return seen


def probabilities(q, k, q_lens, k_lens, causal, scale, window):
    """[B, Tq, H, D], [B, Tk, Hkv, D] -> P [B, H, Tq, Tk] (rows that see no key: 0), lse
    [B, H, Tq] (there: -inf), kk [B, Tk, H, D] (each query head's keys)"""
    B, Tq, H, _ = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    kk = np.repeat(k.astype(np.float64), H // Hkv, axis=2)
    S = scale * np.einsum("bthd,bshd->bhts", q.astype(np.float64), kk)
    q_lens = [Tq] * B if q_lens is None else q_lens
    k_lens = [Tk] * B if k_lens is None else k_lens
    mask = np.stack([visible(Tq, Tk, q_lens[b], k_lens[b], causal, window) for b in range(B)])
    S = np.where(mask[:, None], S, -np.inf)
    top = S.max(axis=-1, keepdims=True) if Tk else np.full(S.shape[:-1] + (1,), -np.inf)
    top = np.where(np.isfinite(top), top, 0.0)
    E = np.exp(S - top)
    total = E.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, top[..., 0] + np.log(np.where(total > 0, total, 1)), -np.inf)
    return E / np.where(total > 0, total, 1)[..., None], lse, kk


def reference_forward(q, k, v, q_lens, k_lens, causal, scale, window):
    P, lse, _ = probabilities(q, k, q_lens, k_lens, causal, scale, window)
    vv = np.repeat(v.astype(np.float64), q.shape[2] // v.shape[2], axis=2)
    return np.einsum("bhts,bshd->bthd", P, vv), lse


def reference_backward(dy, q, k, v, q_lens, k_lens, causal, scale, window):
    """-> dq [B, Tq, H, D], dk, dv [B, Tk, Hkv, D] (dk, dv summed over each group's heads)"""
    P, _, kk = probabilities(q, k, q_lens, k_lens, causal, scale, window)
    B, Tk, Hkv, D = k.shape
    G = q.shape[2] // Hkv
    vv = np.repeat(v.astype(np.float64), G, axis=2)
    dy = dy.astype(np.float64)
    dP = np.einsum("bthd,bshd->bhts", dy, vv)
    dS = P * (dP - (P * dP).sum(axis=-1, keepdims=True))
    dq = scale * np.einsum("bhts,bshd->bthd", dS, kk)
    dk = scale * np.einsum("bhts,bthd->bshd", dS, q.astype(np.float64))
    dv = np.einsum("bhts,bthd->bshd", P, dy)
    return dq, dk.reshape(B, Tk, Hkv, G, D).sum(3), dv.reshape(B, Tk, Hkv, G, D).sum(3)


# ---- calls ------------------------------------------------------------------------------------

def lens_or_null(g, lens):
    return None if lens is None else g(np.asarray(lens, np.int64), np.int64)


def forward(emu, g, q, k, v, q_lens, k_lens, causal, scale, window):
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    o, lse = g.empty(q.shape), g.empty((B, H, Tq))
    emu.call("pytfm_attention_padded_forward_cuda", o, lse, g(q), g(k), g(v),
             lens_or_null(g, q_lens), lens_or_null(g, k_lens), B, Tq, Tk, H, Hkv, D, scale,
             causal, window)
    return o, lse


def backward(emu, g, dy, q, k, v, o, lse, q_lens, k_lens, causal, scale, window):
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    dq, dk, dv = g.empty(q.shape), g.empty(k.shape), g.empty(k.shape)
    emu.call("pytfm_attention_padded_backward_cuda", dq, dk, dv, g(dy), g(q), g(k), g(v), g(o),
             g(lse), lens_or_null(g, q_lens), lens_or_null(g, k_lens), B, Tq, Tk, H, Hkv, D,
             scale, causal, window)
    return dq, dk, dv


def make(seed, B, Tq, Tk, H, Hkv, D):
    rng = np.random.default_rng(seed)
    return (f32(rng, (B, Tq, H, D)), f32(rng, (B, Tk, Hkv, D)), f32(rng, (B, Tk, Hkv, D)),
            f32(rng, (B, Tq, H, D)))


def tolerances(q, k, v, dy, scale, Tk, G):
    """(o, lse, dq, dk, dv) bounds as tests/cuda/test_cuda_attention.py derives them: a score's
    rounding moves a probability by rel; dS cancels, its noise rel·|dy||v|·sqrt(D)"""
    D = q.shape[-1]
    rel = softmax_rel(q, k, scale, max(Tk, 1))
    noise = rel * scale * D**0.5 * amax(dy) * amax(v)
    return rel, (noise * amax(k), G * noise * amax(q), G * rel * amax(dy))


def check_case(emu, seed, B, Tq, Tk, H, Hkv, D, causal, window, q_lens, k_lens, scale=None):
    q, k, v, dy = make(seed, B, Tq, Tk, H, Hkv, D)
    scale = 1 / math.sqrt(D) if scale is None else scale
    g = Aligned()
    o, lse = forward(emu, g, q, k, v, q_lens, k_lens, causal, scale, window)
    ro, rlse = reference_forward(q, k, v, q_lens, k_lens, causal, scale, window)
    rel, floors = tolerances(q, k, v, dy, scale, Tk, H // Hkv)
    dead = np.isneginf(rlse)  # [B, H, Tq]: rows that see no key
    np.testing.assert_array_equal(np.isneginf(lse), dead)
    assert (o.transpose(0, 2, 1, 3)[dead] == 0).all(), "a row that sees no key has o = 0"
    assert_close("padded_forward.o", o, ro, rel * amax(v))
    assert_close("padded_forward.lse", np.where(dead, 0, lse),
                              np.where(dead, 0, rlse), rel + EPS32 * amax(rlse[~dead]))
    grads = backward(emu, g, dy, q, k, v, o, lse, q_lens, k_lens, causal, scale, window)
    want = reference_backward(dy, q, k, v, q_lens, k_lens, causal, scale, window)
    # rows that see no key, keys that no row sees: exactly 0
    lens = [(Tq if q_lens is None else q_lens[b], Tk if k_lens is None else k_lens[b])
            for b in range(B)]
    seen = np.stack([visible(Tq, Tk, n, m, causal, window) for n, m in lens])  # [B, Tq, Tk]
    unseen = (~seen.any(axis=2), ~seen.any(axis=1), ~seen.any(axis=1))
    for name, got, r, floor, zero in zip(("dq", "dk", "dv"), grads, want, floors, unseen):
        assert_close(f"padded_backward.{name}", got, r, 4 * rel * amax(r) + floor)
        np.testing.assert_array_equal(got[zero], 0)
    g.check()
    return o, lse, grads


# B, Tq, Tk, H, Hkv, D, causal, window, q_lens, k_lens: Tq < Tk and Tq > Tk, one past a tile;
# Tq = 1 (16-row tiles); lengths 0, partial, full (a tile of padding only, a key tile past
# k_len); causal with Tq > Tk (rows past Tk see every key) and windows inside and across tiles;
# grouped heads; every head-dim class (3, 16, 32, 64, 80, 128)
CASES = [
    (2, 5, 70, 2, 1, 16, False, 0, [5, 3], [70, 66]),
    (3, 70, 9, 2, 2, 3, False, 0, [70, 0, 65], [9, 4, 0]),
    (2, 1, 130, 4, 2, 32, False, 0, [1, 0], [130, 64]),
    (2, 80, 30, 2, 1, 64, True, 0, [80, 63], [30, 1]),
    (2, 30, 75, 2, 2, 80, True, 9, [30, 17], [75, 12]),
    (1, 66, 66, 4, 1, 128, True, 70, [65], [66]),
    (2, 17, 40, 2, 1, 16, True, 1, None, [40, 5]),
    (2, 40, 17, 2, 2, 32, False, 0, [3, 40], None),
]


@pytest.mark.parametrize("B,Tq,Tk,H,Hkv,D,causal,window,q_lens,k_lens", CASES)
def test_padded_forward_and_backward(emu, order, B, Tq, Tk, H, Hkv, D, causal, window, q_lens,
                                     k_lens):
    check_case(emu, Tq * 1000 + Tk, B, Tq, Tk, H, Hkv, D, causal, window, q_lens, k_lens)


def test_without_keys_or_rows(emu):
    """Tk = 0: every row sees nothing (o = 0, lse = -inf, dq = 0); Tq = 0: dk = dv = 0"""
    check_case(emu, 1, 2, 3, 0, 2, 1, 8, False, 0, [3, 1], None)
    check_case(emu, 2, 2, 0, 5, 2, 2, 8, True, 0, None, [5, 2])


@pytest.mark.parametrize("B,T,H,Hkv,D,causal,window", [(2, 65, 2, 1, 16, True, 0),
                                                        (1, 70, 4, 2, 80, True, 9),
                                                        (2, 9, 2, 2, 3, False, 0)])
def test_null_lengths_and_tq_equal_to_tk_are_the_gqa_functions(emu, B, T, H, Hkv, D, causal,
                                                               window):
    q, k, v, dy = make(T, B, T, T, H, Hkv, D)
    scale = 0.3
    g = Aligned()
    o, lse = forward(emu, g, q, k, v, None, None, causal, scale, window)
    go, glse = g.empty(q.shape), g.empty((B, H, T))
    emu.call("pytfm_attention_gqa_forward_cuda", go, glse, g(q), g(k), g(v), B, T, H, Hkv, D,
             scale, causal, window)
    full = [np.full(B, T, np.int64)] * 2  # full lengths: the same rows, keys and bits
    fo, flse = forward(emu, g, q, k, v, *full, causal, scale, window)
    for a, b in ((o, go), (lse, glse), (fo, go), (flse, glse)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    grads = backward(emu, g, dy, q, k, v, o, lse, None, None, causal, scale, window)
    fgrads = backward(emu, g, dy, q, k, v, o, lse, *full, causal, scale, window)
    gq, gk, gv = g.empty(q.shape), g.empty(k.shape), g.empty(k.shape)
    emu.call("pytfm_attention_gqa_backward_cuda", gq, gk, gv, g(dy), g(q), g(k), g(v), g(o),
             g(lse), B, T, H, Hkv, D, scale, causal, window)
    for a, b, c in zip(grads, fgrads, (gq, gk, gv)):
        np.testing.assert_array_equal(a.view(np.uint32), c.view(np.uint32))
        np.testing.assert_array_equal(b.view(np.uint32), c.view(np.uint32))
    g.check()


def test_padding_is_ignored(emu):
    """What sits in the padding (rows past q_len of q and dy, keys past k_len of k and v)
    changes no output but those rows' own (which are 0): NaN there is read by nothing"""
    B, Tq, Tk, H, D = 2, 20, 70, 2, 16
    q, k, v, dy = make(5, B, Tq, Tk, H, H, D)
    q_lens, k_lens = [7, 20], [66, 3]
    g = Aligned()
    o, lse = forward(emu, g, q, k, v, q_lens, k_lens, False, 0.25, 0)
    grads = backward(emu, g, dy, q, k, v, o, lse, q_lens, k_lens, False, 0.25, 0)
    for b in range(B):
        q[b, q_lens[b]:] = dy[b, q_lens[b]:] = np.nan
        k[b, k_lens[b]:] = v[b, k_lens[b]:] = np.nan
    o2, lse2 = forward(emu, g, q, k, v, q_lens, k_lens, False, 0.25, 0)
    grads2 = backward(emu, g, dy, q, k, v, o2, lse2, q_lens, k_lens, False, 0.25, 0)
    for a, b in zip((o, lse, *grads), (o2, lse2, *grads2)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    g.check()


def test_lengths_outside_their_range_are_clamped(emu):
    """The lengths are device memory, the caller's to check (pytfm.ops does): one outside
    [0, T] is clamped to it, so nothing is read or written out of bounds (the guarded buffers
    hold NaN markers around every array and check them)"""
    B, Tq, Tk, H, D = 3, 9, 12, 2, 8
    q, k, v, dy = make(6, B, Tq, Tk, H, H, D)
    g = Aligned()
    bad = ([-4, 1000, 5], [1000, -1, 2**62])
    good = ([0, Tq, 5], [Tk, 0, Tk])
    o, lse = forward(emu, g, q, k, v, *bad, True, 0.3, 0)
    want_o, want_lse = forward(emu, g, q, k, v, *good, True, 0.3, 0)
    grads = backward(emu, g, dy, q, k, v, o, lse, *bad, True, 0.3, 0)
    want = backward(emu, g, dy, q, k, v, o, lse, *good, True, 0.3, 0)
    for a, b in zip((o, lse, *grads), (want_o, want_lse, *want)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    g.check()


def test_backward_is_the_same_bits_on_every_run(emu):
    q, k, v, dy = make(8, 2, 70, 33, 4, 2, 32)
    lens = ([70, 31], [20, 33])
    g = Aligned()
    o, lse = forward(emu, g, q, k, v, *lens, True, 0.2, 0)
    first = [a.copy() for a in backward(emu, g, dy, q, k, v, o, lse, *lens, True, 0.2, 0)]
    emu.lib.pytfm_emu_set_order(1)
    try:
        second = backward(emu, g, dy, q, k, v, o, lse, *lens, True, 0.2, 0)
    finally:
        emu.lib.pytfm_emu_set_order(0)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("D", [64, 7])
def test_an_input_offset_by_one_float_takes_the_scalar_path(emu, D):
    q, k, v, dy = make(D, 2, 11, 30, 2, 1, D)
    lens = ([11, 4], [17, 30])
    results = []
    for offset in (0, 1):
        g = Aligned(offset)
        o, lse = forward(emu, g, q, k, v, *lens, True, 0.2, 0)
        grads = backward(emu, g, dy, q, k, v, o, lse, *lens, True, 0.2, 0)
        results.append([a.copy() for a in (o, lse, *grads)])
        g.check()
    for a, b in zip(*results):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_bad_arguments_are_clear_errors(emu):
    x = [np.zeros(129 * 8, np.float32) for _ in range(8)]
    lse = np.zeros(16, np.float32)
    with pytest.raises(EmuError, match=r"pytfm_attention_padded_forward_cuda: D must be <= 128"):
        emu.call("pytfm_attention_padded_forward_cuda", x[0], lse, *x[1:4], None, None, 1, 2, 3,
                 2, 1, 129, 0.1, 1, 0)
    with pytest.raises(EmuError, match=r"pytfm_attention_padded_backward_cuda: Hkv must divide "
                                       r"H"):
        emu.call("pytfm_attention_padded_backward_cuda", *x, lse, None, None, 1, 2, 3, 3, 2, 4,
                 0.1, 1, 0)
    with pytest.raises(EmuError, match=r"pytfm_attention_padded_forward_cuda: Tk must be >= 0, "
                                       r"got -1"):
        emu.call("pytfm_attention_padded_forward_cuda", x[0], lse, *x[1:4], None, None, 1, 2, -1,
                 2, 1, 4, 0.1, 1, 0)
    with pytest.raises(EmuError, match=r"window = 5 needs causal attention"):
        emu.call("pytfm_attention_padded_forward_cuda", x[0], lse, *x[1:4], None, None, 1, 2, 3,
                 2, 1, 4, 0.1, 0, 5)
    with pytest.raises(EmuError, match=r"pytfm_attention_padded_backward_cuda: q must not be "
                                       r"NULL"):
        emu.call("pytfm_attention_padded_backward_cuda", *x[:4], None, *x[5:], lse, None, None,
                 1, 2, 3, 2, 1, 4, 0.1, 1, 0)
    with pytest.raises(EmuError, match=r"o and q_len must not share memory"):
        emu.call("pytfm_attention_padded_forward_cuda", x[0], lse, *x[1:4],
                 x[0][:2].view(np.int64), None, 1, 2, 3, 2, 1, 4, 0.1, 1, 0)
