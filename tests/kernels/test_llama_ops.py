"""The Llama family's ops against transformers' own code, and their special values.

RMSNorm against LlamaRMSNorm, SwiGLU against LlamaMLP's act_fn(gate) * up, RoPE's frequency
table against _compute_llama3_parameters and the rotation against LlamaRotaryEmbedding +
apply_rotary_pos_emb (torch and transformers: skipped where they are not installed). The
registry (tests/ops_registry.py) holds every op to the float64 reference besides.
"""

import numpy as np
import pytest

from helpers import EPS32, assert_close, f32
from ops_registry import LLAMA3
from pytfm import ops
from pytfm import reference as ref

torch = pytest.importorskip("torch")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
LlamaConfig = pytest.importorskip("transformers").LlamaConfig


def config(head_dim, theta, scaling=None):
    c = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                    rope_theta=theta, max_position_embeddings=131072,
                    rope_scaling=None if scaling is None else dict(scaling, rope_theta=theta))
    return c


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("theta", [500000.0, 1e6])
def test_inv_freq_matches_transformers_llama3(D, theta):
    """pytfm_rope_inv_freq in double, rounded once; transformers rounds each step to float32:
    an ulp or two apart, and the same branch (kept, divided, smoothed) for every frequency"""
    c = config(D, theta, LLAMA3)
    want, scale = rope_utils._compute_llama3_parameters(c, "cpu")
    assert scale == 1.0
    got = ops.rope_inv_freq(D, theta, LLAMA3)
    assert_close("llama3.inv_freq", got, want.numpy().astype(np.float64), rtol=4 * EPS32)
    plain = ops.rope_inv_freq(D, theta)
    # the three regimes all occur at these sizes: a wrong branch is off by up to factor 8
    ratio = plain / got
    assert ratio.min() == pytest.approx(1.0) and ratio.max() == pytest.approx(8.0, rel=1e-6)
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


@pytest.mark.parametrize("scaling", [None, LLAMA3])
def test_rope_freq_matches_transformers(scaling):
    """q, k [B, T, H, D] rotated as LlamaRotaryEmbedding + apply_rotary_pos_emb rotate them,
    at positions up to 100k (where the float32 angle's rounding shows), from the same table"""
    B, T, H, D, theta = 2, 9, 3, 64, 500000.0
    rng = np.random.default_rng(0)
    q = f32(rng, (B, T, H, D))
    pos = np.stack([np.arange(T) + 5, np.arange(T) + 100_000]).astype(np.int64)
    emb = llama.LlamaRotaryEmbedding(config(D, theta, scaling))
    qt = torch.from_numpy(q).transpose(1, 2)  # transformers' [B, H, T, D]
    cos, sin = emb(qt, torch.from_numpy(pos))
    want, _ = llama.apply_rotary_pos_emb(qt, qt, cos, sin)
    want = want.transpose(1, 2).numpy()
    got = ops.rope_freq_forward(q, pos, emb.inv_freq.numpy())
    # cos and sin of the same float angle: torch's float32 cos against a double one rounded
    assert_close("rope_freq.transformers", got, want.astype(np.float64), atol=4 * EPS32 * 4.0,
                 rtol=0.0)
    # the helper's own table: an ulp of the frequency moves the angle pos·ulp
    got = ops.rope_freq_forward(q, pos, ops.rope_inv_freq(D, theta, scaling))
    assert_close("rope_freq.transformers.table", got, want.astype(np.float64),
                 atol=4.0 * (4 + 2 * 100_008) * EPS32, rtol=0.0)


def test_rope_freq_is_rope_with_the_default_table():
    """with theta's plain table, the existing RoPE (angles in double) to float32 angle
    rounding: the same pairing (i, i + D/2), the same direction of rotation"""
    rng = np.random.default_rng(1)
    x, pos = f32(rng, (2, 5, 3, 16)), np.arange(5, dtype=np.int64) + 7
    got = ops.rope_freq_forward(x, pos, ops.rope_inv_freq(16, 10000.0))
    assert_close("rope_freq.rope", got, ops.rope_forward(x, pos, 10000.0).astype(np.float64),
                 atol=16 * 12 * EPS32 * 4, rtol=0.0)


def test_rope_freq_backward_undoes_the_forward():
    rng = np.random.default_rng(2)
    x, pos = f32(rng, (1, 7, 2, 32)), np.arange(7, dtype=np.int64) * 1000
    inv = ops.rope_inv_freq(32, 1e6, None)
    back = ops.rope_freq_backward(ops.rope_freq_forward(x, pos, inv), pos, inv)
    assert_close("rope_freq.roundtrip", back, x.astype(np.float64), atol=8 * EPS32 * 4, rtol=0)
    # the backward is the adjoint: <R x, y> = <x, Rᵀ y>
    y = f32(rng, x.shape)
    lhs = float((ops.rope_freq_forward(x, pos, inv).astype(np.float64) * y).sum())
    rhs = float((x.astype(np.float64) * ops.rope_freq_backward(y, pos, inv)).sum())
    assert abs(lhs - rhs) < 1e-4


@pytest.mark.parametrize("cols", [1, 64, 1000])
def test_rmsnorm_matches_transformers(cols):
    """forward and both gradients against LlamaRMSNorm through torch's autograd, float64"""
    rng = np.random.default_rng(cols)
    x, w, dy = f32(rng, (6, cols), 3.0), f32(rng, (cols,)), f32(rng, (6, cols))
    norm = llama.LlamaRMSNorm(cols, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w.astype(np.float64)))
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    yt = norm(xt)
    yt.backward(torch.from_numpy(dy.astype(np.float64)))
    y, rstd = ops.rmsnorm_forward(x, w, 1e-5)
    assert_close("rmsnorm.y", y, yt.detach().numpy(), atol=1e-6, rtol=1e-5)
    dw0 = f32(rng, (cols,))
    dx, dw = ops.rmsnorm_backward(dy, x, w, rstd, dw=dw0.copy())
    assert_close("rmsnorm.dx", dx, xt.grad.numpy(), atol=1e-5, rtol=1e-4)
    # dw accumulates into the buffer passed, as LayerNorm's does
    assert_close("rmsnorm.dw", dw, dw0 + norm.weight.grad.numpy(), atol=1e-4, rtol=1e-5)


def test_rmsnorm_of_huge_and_tiny_rows():
    """rows whose float Σ x² overflows (1e20) or underflows (1e-25, eps = 0) are summed in
    double: y is x / rms(x) · w, finite"""
    for v in (1e20, 1e-25):
        x = np.full((2, 33), v, dtype=np.float32)
        x[1, ::2] = -v
        y, rstd = ops.rmsnorm_forward(x, np.ones(33, np.float32), 0.0)
        assert np.isfinite(y).all() and np.isfinite(rstd).all()
        assert_close(f"rmsnorm.extreme.{v}", y, np.sign(x).astype(np.float64), atol=1e-6)


def test_swiglu_matches_llama_mlp():
    """act_fn(gate_proj(x)) * up_proj(x) of LlamaMLP, and its gradients, on g and u"""
    rng = np.random.default_rng(3)
    g, u, dh = f32(rng, (4, 37), 4.0), f32(rng, (4, 37)), f32(rng, (4, 37))
    mlp = llama.LlamaMLP(config(8, 1e4))
    gt = torch.from_numpy(g.astype(np.float64)).requires_grad_()
    ut = torch.from_numpy(u.astype(np.float64)).requires_grad_()
    ht = mlp.act_fn(gt) * ut
    ht.backward(torch.from_numpy(dh.astype(np.float64)))
    assert_close("swiglu.h", ops.swiglu_forward(g, u), ht.detach().numpy(), atol=1e-7,
                 rtol=1e-6)
    dg, du = ops.swiglu_backward(dh, g, u)
    assert_close("swiglu.dg", dg, gt.grad.numpy(), atol=1e-7, rtol=1e-5)
    assert_close("swiglu.du", du, ut.grad.numpy(), atol=1e-7, rtol=1e-6)


def test_silu_is_finite_for_large_inputs():
    """e^(−g) overflows for g < −88.7: σ is then 0, never NaN; large g gives g"""
    g = np.array([-1e30, -3e38, -200.0, -90.0, 90.0, 1e30, 3e38], dtype=np.float32)
    u, dh = np.ones_like(g), np.ones_like(g)
    h = ops.swiglu_forward(g, u)
    dg, du = ops.swiglu_backward(dh, g, u)
    assert np.isfinite(h).all() and np.isfinite(dg).all() and np.isfinite(du).all()
    assert_close("silu.large", h, ref.swiglu_forward(g, u), atol=1e-30, rtol=1e-6)
    assert_close("silu.large.dg", dg, ref.swiglu_backward(dh, g, u)[0], atol=1e-30, rtol=1e-5)
