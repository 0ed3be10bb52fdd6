"""The Llama family's CUDA twins on the emulator (cuda/rmsnorm.cu, swiglu.cu, rope_half.cu):
what the registry's emulator cases (tests/cuda/test_cuda_emu.py) do not draw: rows whose
float sum overflows, RoPE in place, and the bits of the C kernel in both thread orders."""

import numpy as np

from cuda_emu import Aligned
from helpers import assert_close, bits, f32
from pytfm import ops


def test_rmsnorm_of_huge_rows(emu, order):
    """Σ x² past FLT_MAX (1e20) and under FLT_MIN (1e-25, eps = 0): summed again in double,
    y = sign(x)·w, finite, as on the CPU"""
    for v in (1e20, 1e-25):
        rows, cols = 3, 1100  # a block per row past 1024 columns, a warp below
        for c in (cols, 33):
            x = np.full((rows, c), v, dtype=np.float32)
            x[1, ::2] = -v
            w = np.ones(c, np.float32)
            y, rstd = np.empty_like(x), np.empty(rows, np.float32)
            emu.call("pytfm_rmsnorm_forward_cuda", y, rstd, x, w, rows, c, 0.0)
            assert np.isfinite(y).all() and np.isfinite(rstd).all()
            assert_close(f"emu.rmsnorm.extreme.{v}.{c}", y, np.sign(x).astype(np.float64),
                         atol=1e-6)


def test_rope_freq_in_place(emu, order):
    """y == x is allowed; the twin gives the C kernel's bits (same angle expressions)"""
    rng = np.random.default_rng(5)
    B, T, H, D = 2, 5, 3, 64
    x, pos = f32(rng, (B, T, H, D)), rng.integers(0, 100_000, (B, T)).astype(np.int64)
    inv = ops.rope_inv_freq(D, 500000.0, dict(rope_type="llama3", factor=8.0,
                                               low_freq_factor=1.0, high_freq_factor=4.0,
                                               original_max_position_embeddings=8192))
    want = ops.rope_freq_forward(x, pos, inv)
    g = Aligned(0)
    y = g(x)
    emu.call("pytfm_rope_freq_forward_cuda", y, y, pos, inv, B, T, H, D, T)
    g.check()
    np.testing.assert_array_equal(bits(y), bits(want))
    emu.call("pytfm_rope_freq_backward_cuda", y, y, pos, inv, B, T, H, D, T)
    np.testing.assert_array_equal(bits(y), bits(ops.rope_freq_backward(want, pos, inv)))


def test_swiglu_matches_the_c_kernel(emu, order):
    """silu(g)·u at the extremes too: −1e30 gives −0, never NaN"""
    rng = np.random.default_rng(6)
    g, u, dh = f32(rng, 1027, 30.0), f32(rng, 1027), f32(rng, 1027)
    g[:3] = (-1e30, 1e30, -100.0)
    h = np.empty_like(g)
    emu.call("pytfm_swiglu_forward_cuda", h, g, u, g.size)
    dg, du = np.empty_like(g), np.empty_like(g)
    emu.call("pytfm_swiglu_backward_cuda", dg, du, dh, g, u, g.size)
    assert np.isfinite(h).all() and np.isfinite(dg).all() and np.isfinite(du).all()
    assert_close("emu.swiglu.h", h, ops.swiglu_forward(g, u).astype(np.float64), atol=1e-30,
                 rtol=1e-6)
    want_dg, want_du = ops.swiglu_backward(dh, g, u)
    assert_close("emu.swiglu.dg", dg, want_dg.astype(np.float64), atol=1e-30, rtol=2e-5)
    assert_close("emu.swiglu.du", du, want_du.astype(np.float64), atol=1e-30, rtol=1e-6)
