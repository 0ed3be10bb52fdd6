"""Attention on the tensor cores (cuda/attention_tc.cu: pytfm_attention_forward_ex_cuda and
_backward_ex_cuda at PYTFM_PRECISION_TF32 and _BF16) on the CPU emulator, against the float64
reference (pytfm/reference.py) computed on the inputs rounded to the format as the kernels
round them (TF32: to nearest, ties away; BF16: to nearest even, subnormals kept).

The bound (derived, not tuned), per output element, first order in the roundings. u is the
format's unit roundoff (TF32 2^-11, BF16 2^-8), u32 = 2^-24, and an FP32 rounding counts 2·u32
(as tests/cuda/test_cuda_tensor_core.py: that also covers an accumulator that truncates), so
n of them in a chain are γ(n) = 2n·u32. Rounded inputs q̂, k̂, v̂, dŷ multiply exactly in FP32
(11 × 11 or 8 × 8 significant bits); what is left is:

  scores   S_ts = scale·q̂_t·k̂_s: the D-term sum, then the scale·log2 e product (three
           roundings: the constant, the product, the score): δ_ts = γ(D)·scale·Σ_d|q̂ k̂| +
           6u32·|S_ts|, and the base-2 shift and exp2f (2 ulp) add 2u32·(|S_ts| + |M_t|) + 4u32
           (M_t the row's max), all as relative errors of e^(S_ts − M_t).
  forward  the weights P_ts = e^S_ts / Σ_s e^S_ts move by at most δ_ts + Δ_t (Δ_t = the row's
           largest δ: a shift common to every score cancels in the ratio); P is rounded to the
           format (u) as it enters P·V; the n_t keys a row sees are summed in FP32, the sums and
           l rescaled once per tile of 64 keys (the factor is the same for both, so its own
           error cancels in O = acc / l), l and 1/l and the product: γ(n_t + 2·tiles + 4) for
           the sum and again for l:
             |ΔO_td| <= Σ_s P_ts |v̂_sd| · (δ_ts + Δ_t + u + 2γ(n_t + 2·tiles + 4))
           lse = (m + log2 l)·ln 2:
             |Δlse_t| <= 2Δ_t + γ(n_t + 2·tiles + 8) + 8u32·(|lse_t| + |M_t|).
  backward P recomputed from S and the given lse (rounded to float32): relative ε_ts = γ(D)·
           scale·Σ|q̂ k̂| + 8u32·(|S_ts| + |lse_t|) + 4u32; dP = dŷ·v̂: γ(D)·Σ|dŷ||v̂|;
           delta = Σ_d dŷ·o (o given in float32): γ(D + 1)·Σ|dŷ||o|; dS = P·(dP − delta) (two
           roundings):  |ΔdS| <= P·((ε + 4u32)·|dP − delta| + γ(D)·Σ|dŷ||v̂| + Δdelta);
           then each product rounds its first operand to the format (u) and sums T terms in
           FP32 (γ(T + 1), the scale's product included):
             |ΔdV_s| <= Σ_t P_ts (ε_ts + u + γ(T + 1)) |dŷ_t|
             |ΔdK_s| <= scale·Σ_t (|ΔdS_ts| + (u + γ(T + 1))|dS_ts|) |q̂_t|, dQ likewise with k̂.
Each bound is multiplied by 1.01, which covers the second-order terms (every first-order term
is under 1% here: u <= 2^-8 and γ(n) < 2^-13 at these sizes), plus, for underflow, an
absolute n·2^-126·max|b| (a P under FLT_MIN has an absolute, not a relative, error).
The bound is a worst case; a result that misses it by far (a dropped rescale, a wrong key)
does so by orders of magnitude. Exact checks stand beside it where the maths is exact: a row
that sees one key gives o = v̂ bit for bit, and so does dV of a lone key with q = 0 (P = 1),
which is where a wrong rounding (truncation for to-nearest) shows.

Shapes are small (the emulator runs every lane on the CPU) but take every path: T = 1, ragged
T past one and two tiles of 64, several tiles (the online rescale), causal and not, each head
dim of the kernels (16, 32, 64, 128), batches and heads, both thread orders; the bits of two
runs, of an offset view (the scalar loads) and of the FP32 fallbacks (precision fp32, and a
head dim the kernels do not take); the emulator's third order, where a warp runs a tile ahead
(each pass's double buffer and single buffer); a ragged last tile of one row, whose prefetch
must read nothing past T; and the BF16 tiles' fragment loads, each an ldmatrix without a bank
conflict. Grouped-query heads and the sliding window (pytfm_attention_gqa_*_ex_cuda) are held
to the same bounds, taken over each query head's key/value head, with dk and dv the sums of
the group's heads.
"""

import math
import os

import numpy as np
import pytest

import fake_cupy
from cuda_emu import CUDA, Aligned, EmuError
from helpers import EPS32, amax, assert_close, bits
from ops_registry import softmax_rel
from pytfm import ops
from pytfm import reference as ref

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")

FP32, BF16, TF32 = 0, 1, 2  # pytfm_precision
NAMES = {TF32: "tf32", BF16: "bf16"}
UNIT = {TF32: 2.0**-11, BF16: 2.0**-8}
U32 = 2.0**-24
TINY = 2.0**-126
TILE = 64


def gamma(n):
    return 2.0 * n * U32


def tf32_rna(x):
    """cvt.rna.tf32.f32: to 10 stored mantissa bits, to nearest, ties away from zero"""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def bf16_rn(x):
    """cvt.rn.bf16.f32: to 8 significant bits, to nearest even, subnormals kept"""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)


def rounded(x, precision):
    return (tf32_rna(x) if precision == TF32 else bf16_rn(x)).astype(np.float64)


def seen_keys(T, causal, window=0):  # -> [T, T] bool, row t: the keys s it sees
    return ref.attention_mask(T, causal, window)


def grouped(k, H):  # [B, T, Hkv, D] -> [B, T, H, D]: query head h's key/value head h // G
    return np.repeat(k, H // k.shape[2], axis=2)


def scores(qh, kh, scale, seen):  # -> S, scale·Σ|q̂ k̂| [B, H, T, T]; -inf where not seen
    S = scale * np.einsum("bthd,bshd->bhts", qh, kh)
    A = scale * np.einsum("bthd,bshd->bhts", abs(qh), abs(kh))
    return np.where(seen, S, -np.inf), A


def forward_want(q, k, v, causal, scale, precision, window=0):
    """(o, lse) of the reference on rounded inputs, and their bounds (the module's docstring);
    k, v of fewer heads than q are read through each query head's key/value head"""
    qh, kh, vh = (rounded(x, precision) for x in (q, k, v))
    kh, vh = grouped(kh, q.shape[2]), grouped(vh, q.shape[2])
    T, D = q.shape[1], q.shape[3]
    o, lse = ref.attention_forward(qh, kh, vh, causal, scale, window)
    seen = seen_keys(T, causal, window)
    S, A = scores(qh, kh, scale, seen)
    M = S.max(axis=-1, keepdims=True)
    Sf = np.where(seen, S, 0.0)
    delta = np.where(seen, gamma(D) * A + 6 * U32 * abs(Sf) + 2 * U32 * (abs(Sf) + abs(M))
                     + 4 * U32, 0.0)
    Delta = delta.max(axis=-1, keepdims=True)
    n = seen.sum(axis=-1)[:, None]  # keys per row, [T, 1]
    tiles = np.ceil(n / TILE)
    P = np.where(seen, np.exp(Sf - lse[..., None]), 0.0)
    eps = delta + Delta + UNIT[precision] + 2 * gamma(n + 2 * tiles + 4)
    o_bound = 1.01 * np.einsum("bhts,bshd->bthd", P * eps, abs(vh)) + T * TINY * abs(vh).max()
    lse_bound = 1.01 * (2 * Delta[..., 0] + gamma(n[:, 0] + 2 * tiles[:, 0] + 8)
                        + 8 * U32 * (abs(lse) + abs(M[..., 0])))
    return (o, lse), (o_bound, lse_bound)


def backward_want(dy, q, k, v, o, lse, causal, scale, precision, window=0):
    """(dq, dk, dv) of the reference on rounded inputs (o, lse: the float32 ones the kernel is
    given, from the reference), and their bounds (the module's docstring); with fewer
    key/value heads, dk and dv and their bounds are the sums over each group's G query heads,
    each a sum of G·T terms"""
    dyh, qh, kh, vh = (rounded(x, precision) for x in (dy, q, k, v))
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    kh, vh = grouped(kh, H), grouped(vh, H)
    dq, dk, dv = ref.attention_backward(dyh, qh, kh, vh, causal, scale, window)
    seen = seen_keys(T, causal, window)
    S, A = scores(qh, kh, scale, seen)
    Sf = np.where(seen, S, 0.0)
    lse64 = ref.attention_forward(qh, kh, vh, causal, scale, window)[1][..., None]
    P = np.where(seen, np.exp(Sf - lse64), 0.0)
    L = abs(np.asarray(lse, np.float64))[..., None]
    eps = gamma(D) * A + 8 * U32 * (abs(Sf) + L) + 4 * U32
    dP = np.einsum("bthd,bshd->bhts", dyh, vh)
    AdP = np.einsum("bthd,bshd->bhts", abs(dyh), abs(vh))
    o64 = np.asarray(o, np.float64)
    dlt = np.einsum("bthd,bthd->bht", dyh, o64)[..., None]
    Adlt = gamma(D + 1) * np.einsum("bthd,bthd->bht", abs(dyh), abs(o64))[..., None]
    dS = P * (dP - dlt)
    err_dS = P * ((eps + 4 * U32) * abs(dP - dlt) + gamma(D) * AdP + Adlt)
    u, g, gk = UNIT[precision], gamma(T + 1), gamma(G * T + 1)
    floor = lambda b: G * T * TINY * abs(b).max()  # noqa: E731
    per_group = lambda x: x.reshape(B, T, Hkv, G, D).sum(axis=3)  # noqa: E731
    dv_bound = per_group(1.01 * np.einsum("bhts,bthd->bshd", P * (eps + u + gk), abs(dyh))
                         ) + floor(dyh)
    w, wk = err_dS + (u + g) * abs(dS), err_dS + (u + gk) * abs(dS)
    dk_bound = per_group(1.01 * scale * np.einsum("bhts,bthd->bshd", wk, abs(qh))) + floor(qh)
    dq_bound = 1.01 * scale * np.einsum("bhts,bshd->bthd", w, abs(kh)) + floor(kh)
    return (dq, per_group(dk), per_group(dv)), (dq_bound, dk_bound, dv_bound)


def forward(emu, g, q, k, v, causal, scale, precision, window=None):
    """pytfm_attention_forward_ex_cuda; window not None (k, v of any heads dividing q's):
    pytfm_attention_gqa_forward_ex_cuda"""
    B, T, H, D = q.shape
    o, lse = g.empty(q.shape), g.empty((B, H, T))
    if window is None:
        emu.call("pytfm_attention_forward_ex_cuda", o, lse, g(q), g(k), g(v), B, T, H, D, scale,
                 causal, precision)
    else:
        emu.call("pytfm_attention_gqa_forward_ex_cuda", o, lse, g(q), g(k), g(v), B, T, H,
                 k.shape[2], D, scale, causal, window, precision)
    return o, lse


def backward(emu, g, dy, q, k, v, o, lse, causal, scale, precision, window=None):
    B, T, H, D = q.shape
    dq, dk, dv = g.empty(q.shape), g.empty(k.shape), g.empty(k.shape)
    if window is None:
        emu.call("pytfm_attention_backward_ex_cuda", dq, dk, dv, g(dy), g(q), g(k), g(v), g(o),
                 g(lse), B, T, H, D, scale, causal, precision)
    else:
        emu.call("pytfm_attention_gqa_backward_ex_cuda", dq, dk, dv, g(dy), g(q), g(k), g(v),
                 g(o), g(lse), B, T, H, k.shape[2], D, scale, causal, window, precision)
    return dq, dk, dv


def inputs(seed, B, T, H, D):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(4)]


# B, T, H, D, causal: T = 1, one past a tile, two tiles and a ragged third (the online
# rescale across tiles), every head dim the kernels take, batches and heads
CASES = [(1, 1, 1, 16, True), (1, 1, 2, 32, False), (1, 65, 2, 16, True), (2, 33, 1, 32, False),
         (1, 150, 1, 32, True), (1, 130, 1, 64, False), (1, 70, 1, 128, True),
         (1, 129, 1, 16, False)]


def assert_within_the_bound(emu, seed, B, T, H, D, causal, precision):
    """Forward and backward of random inputs against the float64 reference on rounded inputs,
    every element within its derived bound, no guard margin touched."""
    q, k, v, dy = inputs(seed, B, T, H, D)
    scale = 1.0 / math.sqrt(D)
    g = Aligned()
    o, lse = forward(emu, g, q, k, v, causal, scale, precision)
    (o_want, lse_want), (o_tol, lse_tol) = forward_want(q, k, v, causal, scale, precision)
    name = f"cuda-emu.attention_ex.{NAMES[precision]}"
    assert_close(f"{name}.o", o, o_want, atol=o_tol, rtol=0.0)
    assert_close(f"{name}.lse", lse, lse_want, atol=lse_tol, rtol=0.0)
    # the backward from the reference's o and lse, so that its bound is its own
    o32, lse32 = (np.ascontiguousarray(x, np.float32) for x in (o_want, lse_want))
    got = backward(emu, g, dy, q, k, v, o32, lse32, causal, scale, precision)
    want, tols = backward_want(dy, q, k, v, o32, lse32, causal, scale, precision)
    for what, x, w, t in zip(("dq", "dk", "dv"), got, want, tols, strict=True):
        assert_close(f"{name}.{what}", x, w, atol=t, rtol=0.0)
    g.check()


@pytest.mark.parametrize("precision", [TF32, BF16], ids=NAMES.get)
@pytest.mark.parametrize("B,T,H,D,causal", CASES)
def test_forward_and_backward_within_the_bound(emu, order, precision, B, T, H, D, causal):
    assert_within_the_bound(emu, T * 1000 + D + H, B, T, H, D, causal, precision)


# B, T, H, Hkv, D, causal, window: groups of 2 and 4, multi-query; windows of 1, inside a
# 64-key tile, and across tiles (a row's first tiles skipped; a dK tile's query rows stopping
# before T); the dK/dV pass's steps crossing from one head of a group to the next
GQA_CASES = [(1, 65, 4, 2, 16, True, 0), (1, 150, 2, 1, 32, True, 70),
             (2, 33, 3, 1, 64, False, 0), (1, 130, 4, 1, 128, True, 64),
             (1, 70, 2, 2, 16, True, 1), (1, 200, 4, 2, 32, True, 100)]


@pytest.mark.parametrize("precision", [TF32, BF16], ids=NAMES.get)
@pytest.mark.parametrize("B,T,H,Hkv,D,causal,window", GQA_CASES)
def test_gqa_and_window_within_the_bound(emu, order, precision, B, T, H, Hkv, D, causal,
                                         window):
    """pytfm_attention_gqa_forward_ex_cuda and _backward_ex_cuda against the float64 reference
    on rounded inputs, every element within its derived bound (dk, dv: the group's sums)"""
    rng = np.random.default_rng(T * 100 + H * 10 + Hkv)
    q, dy = (rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((B, T, Hkv, D)).astype(np.float32) for _ in range(2))
    scale = 1.0 / math.sqrt(D)
    g = Aligned()
    o, lse = forward(emu, g, q, k, v, causal, scale, precision, window)
    (o_want, lse_want), (o_tol, lse_tol) = forward_want(q, k, v, causal, scale, precision,
                                                        window)
    name = f"cuda-emu.attention_gqa_ex.{NAMES[precision]}"
    assert_close(f"{name}.o", o, o_want, atol=o_tol, rtol=0.0)
    assert_close(f"{name}.lse", lse, lse_want, atol=lse_tol, rtol=0.0)
    o32, lse32 = (np.ascontiguousarray(x, np.float32) for x in (o_want, lse_want))
    got = backward(emu, g, dy, q, k, v, o32, lse32, causal, scale, precision, window)
    want, tols = backward_want(dy, q, k, v, o32, lse32, causal, scale, precision, window)
    for what, x, w, t in zip(("dq", "dk", "dv"), got, want, tols, strict=True):
        assert_close(f"{name}.{what}", x, w, atol=t, rtol=0.0)
    g.check()


@pytest.mark.parametrize("precision", [TF32, BF16], ids=NAMES.get)
def test_a_row_that_sees_one_key_gives_its_rounded_value(emu, precision):
    """Causal row 0 sees key 0 alone: P = 1, o = r(v) exactly; so does T = 1 without a mask.
    With q = 0 and T = 1 the backward's P is 1 too: dV = r(dy) exactly."""
    B, T, H, D = 1, 70, 2, 32
    q, k, v, dy = inputs(5, B, T, H, D)
    v[0, 0, 0, :4] = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8]  # ties
    g = Aligned()
    o, _ = forward(emu, g, q, k, v, True, 0.125, precision)
    want = rounded(v[:, 0], precision).astype(np.float32)
    assert bits(o[:, 0]).tolist() == bits(want).tolist()
    for causal in (True, False):
        o, _ = forward(emu, g, q[:, :1], k[:, :1], v[:, :1], causal, 0.125, precision)
        assert bits(o).tolist() == bits(want[:, None]).tolist()
    z = np.zeros_like(q[:, :1])
    o1 = np.ascontiguousarray(want[:, None])
    _, _, dv = backward(emu, g, dy[:, :1], z, k[:, :1], v[:, :1], o1, np.zeros((B, H, 1),
                        np.float32), True, 0.125, precision)
    assert bits(dv).tolist() == bits(rounded(dy[:, :1], precision).astype(np.float32)).tolist()


@pytest.mark.parametrize("precision", [TF32, BF16], ids=NAMES.get)
def test_the_same_bits_on_every_run_order_and_alignment(emu, precision):
    """Two runs, the other thread order, and inputs offset by one float (the scalar loads):
    the same bits, forward and backward (no atomics, one order of every sum)."""
    B, T, H, D, causal = 1, 100, 2, 32, True
    q, k, v, dy = inputs(11, B, T, H, D)
    runs = []
    for reverse, offset in ((0, 0), (0, 0), (1, 0), (0, 1), (1, 3)):
        emu.lib.pytfm_emu_set_order(reverse)
        try:
            g = Aligned(offset)
            o, lse = forward(emu, g, q, k, v, causal, 0.2, precision)
            grads = backward(emu, g, dy, q, k, v, o, lse, causal, 0.2, precision)
            g.check()
        finally:
            emu.lib.pytfm_emu_set_order(0)
        runs.append([bits(x).tolist() for x in (o, lse, *grads)])
    assert all(r == runs[0] for r in runs[1:])


def test_fp32_and_other_head_dims_are_the_fp32_kernels_bits(emu):
    """precision FP32 at any D, and TF32 / BF16 at a head dim the tensor-core kernels do not
    take (48, 8), run attention.cu's FP32 kernels: their bits."""
    for D, precisions in ((32, (FP32,)), (48, (TF32, BF16)), (8, (TF32,))):
        B, T, H = 1, 40, 2
        q, k, v, dy = inputs(D, B, T, H, D)
        g = Aligned()
        o, lse = g.empty(q.shape), g.empty((B, H, T))
        emu.call("pytfm_attention_forward_cuda", o, lse, g(q), g(k), g(v), B, T, H, D, 0.3, 1)
        dq, dk, dv = g.empty(q.shape), g.empty(q.shape), g.empty(q.shape)
        emu.call("pytfm_attention_backward_cuda", dq, dk, dv, g(dy), g(q), g(k), g(v), g(o),
                 g(lse), B, T, H, D, 0.3, 1)
        want = [bits(x).tolist() for x in (o, lse, dq, dk, dv)]
        for precision in precisions:
            o2, lse2 = forward(emu, g, q, k, v, 1, 0.3, precision)
            grads = backward(emu, g, dy, q, k, v, o, lse, 1, 0.3, precision)
            assert [bits(x).tolist() for x in (o2, lse2, *grads)] == want, (D, precision)


def test_the_precision_and_sizes_are_checked(emu):
    x = np.zeros((1, 2, 1, 16), np.float32)
    lse = np.zeros((1, 1, 2), np.float32)
    with pytest.raises(EmuError, match="precision"):
        emu.call("pytfm_attention_forward_ex_cuda", x.copy(), lse, x, x, x, 1, 2, 1, 16, 0.25, 1,
                 3)
    with pytest.raises(EmuError, match="precision"):
        emu.call("pytfm_attention_backward_ex_cuda", x.copy(), x.copy(), x.copy(), x, x, x, x, x,
                 lse, 1, 2, 1, 16, 0.25, 1, 7)
    with pytest.raises(EmuError, match="pytfm_attention_forward_ex_cuda: D must be <= 128"):
        y = np.zeros((1, 2, 1, 160), np.float32)
        emu.call("pytfm_attention_forward_ex_cuda", y.copy(), lse, y, y, y, 1, 2, 1, 160, 0.25,
                 1, TF32)
    emu.call("pytfm_attention_forward_ex_cuda", None, None, None, None, None, 0, 2, 1, 16, 0.25,
             1, BF16)  # B = 0: nothing to do


@pytest.fixture
def cp(emu, monkeypatch):
    return fake_cupy.install(monkeypatch, emu, strict=True)


def test_pytfm_ops_reaches_the_ex_twins_on_cupy_arrays_only(emu, cp):
    """ops.attention_forward/backward(..., precision=) on CuPy arrays call the _ex twins (the
    bits of a direct call); on NumPy arrays anything but fp32 is refused, naming it."""
    q, k, v, dy = inputs(3, 1, 20, 2, 16)
    for precision in ("tf32", "bf16"):
        code = TF32 if precision == "tf32" else BF16
        o, lse = ops.attention_forward(*(cp.asarray(x) for x in (q, k, v)), precision=precision)
        g = Aligned()
        o_want, lse_want = forward(emu, g, q, k, v, 1, 0.25, code)
        assert bits(fake_cupy._asnumpy(o)).tolist() == bits(o_want).tolist()
        grads = ops.attention_backward(*(cp.asarray(x) for x in (dy, q, k, v)), o, lse,
                                       precision=precision)
        want = backward(emu, g, dy, q, k, v, o_want, lse_want, 1, 0.25, code)
        for got, w in zip(grads, want, strict=True):
            assert bits(fake_cupy._asnumpy(got)).tolist() == bits(w).tolist()
        with pytest.raises(ValueError, match=f"precision '{precision}' of attention runs on "
                                             "CuPy arrays only"):
            ops.attention_forward(q, k, v, precision=precision)
        with pytest.raises(ValueError, match="on NumPy arrays use 'fp32'"):
            ops.attention_backward(dy, q, k, v, q, np.zeros((1, 2, 20), np.float32),
                                   precision=precision)


def test_pytfm_ops_takes_grouped_heads_and_windows_to_the_gqa_ex_twins(emu, cp):
    """ops.attention_forward/backward with k, v of fewer heads or a window, in "tf32" or
    "bf16" on CuPy arrays, call pytfm_attention_gqa_*_ex_cuda (the bits of a direct call); in
    "fp32" the FP32 twins (the C kernels' results to float32 rounding)"""
    rng = np.random.default_rng(4)
    q, dy = (rng.standard_normal((1, 20, 4, 16)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((1, 20, 2, 16)).astype(np.float32) for _ in range(2))
    gq, gk, gv, gdy = (cp.asarray(x) for x in (q, k, v, dy))
    for precision in ("tf32", "bf16"):
        code = TF32 if precision == "tf32" else BF16
        o, lse = ops.attention_forward(gq, gk, gv, precision=precision, window=7)
        g = Aligned()
        o_want, lse_want = forward(emu, g, q, k, v, 1, 0.25, code, 7)
        assert bits(fake_cupy._asnumpy(o)).tolist() == bits(o_want).tolist()
        grads = ops.attention_backward(gdy, gq, gk, gv, o, lse, precision=precision, window=7)
        want = backward(emu, g, dy, q, k, v, o_want, lse_want, 1, 0.25, code, 7)
        for got, w in zip(grads, want, strict=True):
            assert bits(fake_cupy._asnumpy(got)).tolist() == bits(w).tolist()
    o, lse = ops.attention_forward(gq, gk, gv, window=7)
    co, clse = ops.attention_forward(q, k, v, window=7)
    rel = softmax_rel(q, k, 0.25, 20)
    assert_close("cuda-emu.attention_gqa.fp32.o", fake_cupy._asnumpy(o), co,
                 atol=2 * rel * amax(v))
    assert_close("cuda-emu.attention_gqa.fp32.lse", fake_cupy._asnumpy(lse), clse,
                 atol=2 * rel + EPS32 * amax(clse))


TRAIN_STEPS = 6


def train_losses(tt, tmp_path, precision):
    """train_tiny at a small config whose heads (d 32 / 2 heads = 16) take the tensor-core
    attention, on the emulated GPU -> the loss of every step"""
    import csv

    out = tmp_path / precision
    text = tmp_path / "corpus.txt"
    if not text.exists():
        text.write_bytes(b"def f(x):\n    return x + 1\n" * 40)
    assert tt.main(["--out", str(out), "--text", str(text), "--d-model", "32", "--n-layer", "1",
                    "--n-head", "2", "--context", "16", "--batch", "2", "--steps",
                    str(TRAIN_STEPS), "--eval-every", str(TRAIN_STEPS), "--log-every", "1",
                    "--sample-tokens", "0", "--device", "cuda", "--precision", precision]) == 0
    with open(out / "loss.csv") as f:
        return [float(r[1]) for r in list(csv.reader(f))[1:]]


def test_train_tiny_in_each_precision_stays_near_fp32(cp, tmp_path, capsys):
    """train_tiny on the emulated GPU, its attention on the tensor cores in tf32 and bf16: each
    step's loss within 16u·loss of fp32's (u the format's unit roundoff) plus the log's 5
    decimals. The bound is tests/cuda/test_cuda_model.py's for the linear layers alone (8u:
    two rounded inputs of each product, four times over for the steps' drift) doubled, for
    attention's two products whose inputs are rounded too (q and k; P and v). The step count
    is small (each emulated step takes seconds); dev/train_precisions.py runs 200 steps
    (docs/performance.md has its table)."""
    from pytfm.cli import train as tt

    fp32 = train_losses(tt, tmp_path, "fp32")
    for precision in ("tf32", "bf16"):
        got = train_losses(tt, tmp_path, precision)
        u = UNIT[TF32 if precision == "tf32" else BF16]
        assert len(got) == len(fp32) == TRAIN_STEPS
        for step, (g, c) in enumerate(zip(got, fp32, strict=True), 1):
            assert abs(g - c) <= 16 * u * c + 2e-5, (precision, step, g, c)
    capsys.readouterr()


@pytest.mark.parametrize("precision", [TF32, BF16], ids=NAMES.get)
@pytest.mark.parametrize("D", [16, 64, 128])
def test_a_warp_running_ahead_changes_nothing(emu, precision, D):
    """The emulator's third order (pytfm_emu_set_order(2)) runs each warp alone to its next
    barrier, so a warp can be a whole tile ahead of the others, which the two sweeps never
    allow (mma and ldmatrix are warp operations: they keep warps within one of each other). A
    K/V, query or key tile stored over while another warp still reads it, or read before every
    warp stored its part, shows here as other bits. The head dims take each kernel's both ways
    (cuda/attention_tc.cu's Tile): D = 16 every pass double-buffered with the next tile
    prefetched (a buffer reused every other tile), D = 64 the forward and dQ passes so and the
    dK/dV pass with one buffer, D = 128 every pass with one buffer (a barrier before each
    store)."""
    B, T, H, causal = 1, 200, 1, True  # four tiles of keys and of queries
    q, k, v, dy = inputs(23, B, T, H, D)
    runs = []
    for order in (0, 2):
        emu.lib.pytfm_emu_set_order(order)
        try:
            g = Aligned()
            o, lse = forward(emu, g, q, k, v, causal, 0.2, precision)
            grads = backward(emu, g, dy, q, k, v, o, lse, causal, 0.2, precision)
            g.check()
        finally:
            emu.lib.pytfm_emu_set_order(0)
        runs.append([bits(x).tolist() for x in (o, lse, *grads)])
    assert runs[1] == runs[0]


@pytest.mark.parametrize("precision", [TF32, BF16], ids=NAMES.get)
@pytest.mark.parametrize("D", [32, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_a_ragged_last_tile_reads_nothing_past_T(emu, precision, D, causal):
    """T = 129: the last tile of keys (forward, dQ) and of queries (dK/dV) holds one row, loaded
    by the prefetch of the tile before it (D = 32: the forward and dQ passes prefetch; BF16's
    dK/dV pass too) or after it (D = 128). H = 1, so row T would be the first floats past
    the arrays, inside their guard margins (41 floats, tests/cuda_emu.py), whose markers are
    NaN: a load of a row past T would turn into NaN through the zero weight it gets (0·NaN), and
    the results must stay within the bound."""
    assert_within_the_bound(emu, 129 + D, 1, 129, 1, D, causal, precision)


def ldmatrix_counts(emu):
    out = emu.ffi.new("int64_t[3]")
    emu.lib.pytfm_emu_ldmatrix_counts(out)
    return tuple(out)


def ldmatrix_want(D, T, causal):
    """(forward, backward) ldmatrix.x4 loads of the BF16 kernels at B = H = 1, as
    cuda/attention_tc.cu's loops issue them, per warp (4 a block) and tile: Q·Kᵀ-shaped scores
    D / 16 k steps × (4 B loads, two key fragments each, + 1 A load where A is not held), a
    P·V-shaped product 4 × D / 16 (.trans: two column fragments each); Q's fragments held
    (forward, D <= 64: D / 16 loads once a block)."""
    ks, tiles = D // 16, (T + TILE - 1) // TILE
    held = D <= 64
    fwd = dkdv = dq = 0
    for blk in range(tiles):
        # forward and dQ: query tile blk walks key tiles 0..blk (causal) or all
        walk = blk + 1 if causal else tiles
        fwd += 4 * ((ks if held else 0) + walk * (ks * (4 + (not held)) + 4 * ks))
        dq += 4 * walk * (2 * ks * 5 + 4 * ks)
        # dK/dV: key tile blk walks query tiles blk.. (causal) or all
        walk = tiles - blk if causal else tiles
        dkdv += 4 * walk * (2 * ks * 5 + 2 * 4 * ks)
    return fwd, dkdv + dq


@pytest.mark.parametrize("D", [16, 64, 128])
def test_bf16_fragment_loads_are_ldmatrix_without_bank_conflicts(emu, D):
    """BF16 tiles are XOR-swizzled (pytfm__swz of cuda/mma.cuh) so that the 8 rows of each
    ldmatrix matrix fall in 8 distinct 16-byte bank groups: one shared-memory wavefront per
    matrix, as the emulator counts them (pytfm_emu_ldmatrix_counts); and every fragment is
    loaded by ldmatrix.x4 as the kernels' loops say (ldmatrix_want). TF32's FP32 tiles are
    read by 32-bit loads (ldmatrix cannot transpose 32-bit elements, and the padded rows keep
    those reads in 32 distinct banks): no ldmatrix at all."""
    B, T, H, causal = 1, 150, 1, True  # three tiles, the last ragged
    q, k, v, dy = inputs(7 + D, B, T, H, D)
    g = Aligned()
    for precision in (BF16, TF32):
        before = ldmatrix_counts(emu)
        o, lse = forward(emu, g, q, k, v, causal, 0.3, precision)
        mid = ldmatrix_counts(emu)
        backward(emu, g, dy, q, k, v, o, lse, causal, 0.3, precision)
        after = ldmatrix_counts(emu)
        fwd = [x - y for x, y in zip(mid, before)]
        bwd = [x - y for x, y in zip(after, mid)]
        if precision == TF32:
            assert fwd == bwd == [0, 0, 0]
            continue
        want = ldmatrix_want(D, T, causal)
        for (calls, matrices, waves), n in zip((fwd, bwd), want, strict=True):
            assert calls == n
            assert matrices == 4 * calls
            assert waves == matrices, f"{waves - matrices} extra wavefronts: bank conflicts"
