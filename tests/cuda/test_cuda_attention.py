"""The GPU attention of cuda/attention.cu, run on the CPU by the emulator (cuda/emu), against
the float64 reference and the C kernels, on the sizes that break tiled kernels: T = 1, T one
past a 64-row tile (65), T over several tiles, every head-dim class (1, 3, 16, 32, 64, 80,
128), causal and not, several batches and heads; the decode on both of its paths (one pass,
and the keys split with a log-sum-exp merge, which the emulator's small "GPU" of 4 SMs takes
for a head or two); the backward's bits on two runs; an input offset by one float (the scalar
path of the loads); the errors (D = 129, too many query tiles); and the emulator features the
kernels rely on (cudaFuncSetAttribute and the 48 KiB / 227 KiB limits, float4 alignment,
cudaMallocAsync).

Each kernel case runs in both thread orders (a missing __syncthreads() reads stale shared
memory in one of them) on guarded buffers whose data start on a 16-byte boundary, so the
float4 path is the one taken (tests/cuda_emu.py's Guarded leaves them at 4 bytes past one).
"""

import math
import os

import numpy as np
import pytest

import cuda_emu
from cuda_emu import CUDA, Aligned, EmuError, Guarded
from helpers import EPS32, amax, f32
from ops_registry import decode_reference, softmax_rel
from pytfm import ops
from pytfm import reference as ref

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")


def close(name, got, want_ref, want_c, atol):
    cuda_emu.close(f"attention.{name}", got, want_ref, want_c, atol, rtol_c=1e-5)


def forward(emu, g, q, k, v, causal, scale):
    B, T, H, D = q.shape
    o, lse = g.empty(q.shape), g.empty((B, H, T))
    emu.call("pytfm_attention_forward_cuda", o, lse, g(q), g(k), g(v), B, T, H, D, scale, causal)
    return o, lse


def backward(emu, g, dy, q, k, v, o, lse, causal, scale):
    B, T, H, D = q.shape
    dq, dk, dv = g.empty(q.shape), g.empty(q.shape), g.empty(q.shape)
    emu.call("pytfm_attention_backward_cuda", dq, dk, dv, g(dy), g(q), g(k), g(v), g(o), g(lse),
             B, T, H, D, scale, causal)
    return dq, dk, dv


# B, T, H, D, causal: T = 1, one past a tile, several tiles; every head-dim class
CASES = [(1, 1, 1, 1, True), (1, 1, 2, 3, False), (1, 65, 2, 16, True), (2, 33, 3, 3, False),
         (2, 130, 1, 32, False), (1, 200, 2, 64, True), (1, 97, 1, 80, True),
         (1, 66, 1, 80, False), (1, 65, 1, 128, True), (1, 129, 1, 128, False)]


@pytest.mark.parametrize("B,T,H,D,causal", CASES)
def test_attention_forward_and_backward(emu, order, B, T, H, D, causal):
    rng = np.random.default_rng(T * 1000 + D)
    q, k, v, dy = (f32(rng, (B, T, H, D)) for _ in range(4))
    scale = 1 / math.sqrt(D) if D != 3 else 0.9  # a scale that is not the default too
    g = Aligned()
    o, lse = forward(emu, g, q, k, v, causal, scale)
    ro, rlse = ref.attention_forward(q, k, v, causal, scale)
    co, clse = ops.attention_forward(q, k, v, causal, scale)
    rel = softmax_rel(q, k, scale, T)
    close("forward.o", o, ro, co, rel * amax(v))
    close("forward.lse", lse, rlse, clse, rel + EPS32 * amax(rlse))

    grads = backward(emu, g, dy, q, k, v, o, lse, causal, scale)
    want = ref.attention_backward(dy, q, k, v, causal, scale)
    c = ops.attention_backward(dy, q, k, v, o, lse, causal, scale)
    # dS = P·(dO·v − rowsum(dO∘O)) cancels: its noise is about rel·|dO||v|·sqrt(D)
    noise = rel * scale * D**0.5 * amax(dy) * amax(v)
    floors = (noise * amax(k), noise * amax(q), rel * amax(dy))
    for name, got, r, cc, floor in zip(("dq", "dk", "dv"), grads, want, c, floors):
        close(f"backward.{name}", got, r, cc, 4 * rel * amax(r) + floor)
    g.check()


def test_backward_is_the_same_bits_on_every_run(emu):
    rng = np.random.default_rng(7)
    B, T, H, D = 1, 150, 2, 64
    q, k, v, dy = (f32(rng, (B, T, H, D)) for _ in range(4))
    for causal in (True, False):
        g = Aligned()
        o, lse = forward(emu, g, q, k, v, causal, 0.125)
        first = [a.copy() for a in backward(emu, g, dy, q, k, v, o, lse, causal, 0.125)]
        emu.lib.pytfm_emu_set_order(1)  # another schedule of the threads changes nothing either
        try:
            second = backward(emu, g, dy, q, k, v, o, lse, causal, 0.125)
        finally:
            emu.lib.pytfm_emu_set_order(0)
        for a, b in zip(first, second):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("D", [64, 80, 7])
def test_an_input_offset_by_one_float_takes_the_scalar_path(emu, D):
    """A CuPy view x[1:] is contiguous but 4 bytes past a 16-byte boundary: a float4 load
    there fails the emulator's launch (and faults on a GPU). The scalar path must give the same
    bits as the vector one."""
    rng = np.random.default_rng(D)
    B, T, H = 1, 70, 2
    q, k, v, dy = (f32(rng, (B, T, H, D)) for _ in range(4))
    results = []
    for offset in (0, 1):
        g = Aligned(offset)
        o, lse = forward(emu, g, q, k, v, True, 0.2)
        grads = backward(emu, g, dy, q, k, v, o, lse, True, 0.2)
        results.append([a.copy() for a in (o, lse, *grads)])
        g.check()
    for a, b in zip(*results):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


# B, H, D, n_new, start, Tmax: B·H < 4 splits the keys (the emulator's 4 "SMs"); n_new > 16
# takes 64-row query tiles; n_new = 70 from start 10 leaves the first tile's rows nothing to
# see in the second split (o = 0, lse = -inf there, which the merge must weigh as nothing)
DECODE = [(1, 1, 64, 1, 0, 4), (1, 1, 64, 1, 150, 160), (1, 2, 80, 5, 130, 140),
          (1, 1, 3, 20, 100, 121), (1, 1, 32, 70, 10, 90), (2, 2, 16, 3, 100, 110),
          (1, 4, 128, 1, 66, 70)]


@pytest.mark.parametrize("B,H,D,n_new,start,Tmax", DECODE)
def test_decode(emu, order, B, H, D, n_new, start, Tmax):
    rng = np.random.default_rng(start + n_new)
    k_cache, v_cache = f32(rng, (B, Tmax, H, D)), f32(rng, (B, Tmax, H, D))
    q = f32(rng, (B, n_new, H, D))
    scale = 1 / math.sqrt(D)
    g = Aligned()
    o, lse = g.empty(q.shape), g.empty((B, H, n_new))
    emu.call("pytfm_attention_decode_cuda", o, lse, g(q), g(k_cache), g(v_cache), B, n_new, H, D,
             Tmax, start, scale)
    ro, rlse = decode_reference(q, k_cache, v_cache, start, scale)
    co, clse = ops.attention_decode(q, k_cache, v_cache, start, scale)
    rel = softmax_rel(q, k_cache, scale, start + n_new)
    close("decode.o", o, ro, co, rel * amax(v_cache))
    close("decode.lse", lse, rlse, clse, rel + EPS32 * amax(rlse))
    g.check()


def test_cache_append(emu, order):
    rng = np.random.default_rng(3)
    B, Tmax, H, D, n_new, start = 2, 20, 3, 5, 7, 9
    k_cache, v_cache = f32(rng, (B, Tmax, H, D)), f32(rng, (B, Tmax, H, D))
    k, v = f32(rng, (B, n_new, H, D)), f32(rng, (B, n_new, H, D))
    g = Guarded()
    gk, gv = g(k_cache), g(v_cache)
    emu.call("pytfm_attention_cache_append_cuda", gk, gv, g(k), g(v), B, n_new, H, D, Tmax, start)
    ops.attention_cache_append(k_cache, v_cache, k, v, start)
    np.testing.assert_array_equal(gk, k_cache)
    np.testing.assert_array_equal(gv, v_cache)
    g.check()


def test_bad_sizes_are_clear_errors(emu):
    x = [np.zeros(129 * 2, np.float32) for _ in range(8)]  # B = 1, T = 2, H = 1, D = 129
    lse = np.zeros(2, np.float32)
    with pytest.raises(EmuError, match=r"pytfm_attention_forward_cuda: D must be <= 128 "
                                       r"\(PYTFM_CUDA_ATTENTION_MAX_D.*got 129"):
        emu.call("pytfm_attention_forward_cuda", x[0], lse, *x[1:4], 1, 2, 1, 129, 0.1, 1)
    with pytest.raises(EmuError, match=r"pytfm_attention_backward_cuda: D must be <= 128"):
        emu.call("pytfm_attention_backward_cuda", *x, lse, 1, 2, 1, 129, 0.1, 1)
    with pytest.raises(EmuError, match=r"pytfm_attention_decode_cuda: D must be <= 128"):
        emu.call("pytfm_attention_decode_cuda", x[0], lse[:1], *x[1:4], 1, 1, 1, 129, 2, 1, 0.1)
    # query tiles go in gridDim.y, which stops at 65535: checked before anything runs (the
    # zeroed arrays of 16 MB are pages the kernel never touches)
    T = 65535 * 64 + 1
    big = [np.zeros(T, np.float32) for _ in range(5)]
    with pytest.raises(EmuError, match=r"T must be <= 4194240 \(65535 tiles of 64 in gridDim.y\)"
                                       r", got 4194241"):
        emu.call("pytfm_attention_forward_cuda", *big, 1, T, 1, 1, 0.1, 1)


# ---- grouped-query heads and a sliding window (pytfm_attention_gqa_*_cuda) ------------------

# B, T, H, Hkv, D, causal, window: multi-query and groups of 2 and 4; windows of 1, inside a
# tile, and spanning tiles (rows whose first tiles are skipped, dK tiles whose last query rows
# stop early); head dims not d_model / n_head of any model (3, 80)
GQA = [(1, 1, 2, 1, 1, True, 1), (2, 33, 3, 1, 3, False, 0), (1, 130, 4, 2, 16, True, 70),
       (1, 200, 4, 1, 64, True, 64), (1, 97, 2, 1, 80, True, 1), (1, 65, 8, 2, 32, True, 0)]


@pytest.mark.parametrize("B,T,H,Hkv,D,causal,window", GQA)
def test_gqa_forward_and_backward(emu, order, B, T, H, Hkv, D, causal, window):
    rng = np.random.default_rng(T * 100 + H)
    q, dy = f32(rng, (B, T, H, D)), f32(rng, (B, T, H, D))
    k, v = f32(rng, (B, T, Hkv, D)), f32(rng, (B, T, Hkv, D))
    scale = 1 / math.sqrt(D)
    g = Aligned()
    o, lse = g.empty(q.shape), g.empty((B, H, T))
    emu.call("pytfm_attention_gqa_forward_cuda", o, lse, g(q), g(k), g(v), B, T, H, Hkv, D,
             scale, causal, window)
    ro, rlse = ref.attention_forward(q, k, v, causal, scale, window)
    co, clse = ops.attention_forward(q, k, v, causal, scale, window=window)
    rel = softmax_rel(q, k, scale, T)
    close("gqa_forward.o", o, ro, co, rel * amax(v))
    close("gqa_forward.lse", lse, rlse, clse, rel + EPS32 * amax(rlse))
    runs = []
    for _ in range(2):  # the group's sum in one order: the same bits on every run
        dq, dk, dv = g.empty(q.shape), g.empty(k.shape), g.empty(k.shape)
        emu.call("pytfm_attention_gqa_backward_cuda", dq, dk, dv, g(dy), g(q), g(k), g(v), g(o),
                 g(lse), B, T, H, Hkv, D, scale, causal, window)
        runs.append([a.copy() for a in (dq, dk, dv)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    want = ref.attention_backward(dy, q, k, v, causal, scale, window)
    c = ops.attention_backward(dy, q, k, v, o, lse, causal, scale, window=window)
    G = H // Hkv  # dk and dv sum the group's G heads
    noise = rel * scale * D**0.5 * amax(dy) * amax(v)
    floors = (noise * amax(k), G * noise * amax(q), G * rel * amax(dy))
    for name, got, r, cc, floor in zip(("dq", "dk", "dv"), runs[0], want, c, floors):
        close(f"gqa_backward.{name}", got, r, cc, 4 * rel * amax(r) + floor)
    g.check()


# B, H, Hkv, D, n_new, start, Tmax, window: the keys split over the emulator's 4 "SMs" from
# the first query's window on (splits before it would see nothing); a window of 1 (each query
# its own key); a window wider than the cache
GQA_DECODE = [(1, 2, 1, 64, 1, 150, 160, 20), (1, 4, 2, 16, 1, 300, 301, 1),
              (1, 2, 1, 3, 20, 100, 121, 70), (1, 4, 1, 32, 70, 10, 90, 33),
              (2, 2, 2, 16, 3, 100, 110, 500)]


@pytest.mark.parametrize("B,H,Hkv,D,n_new,start,Tmax,window", GQA_DECODE)
def test_gqa_decode(emu, order, B, H, Hkv, D, n_new, start, Tmax, window):
    rng = np.random.default_rng(start + n_new + window)
    k_cache, v_cache = f32(rng, (B, Tmax, Hkv, D)), f32(rng, (B, Tmax, Hkv, D))
    q = f32(rng, (B, n_new, H, D))
    scale = 1 / math.sqrt(D)
    g = Aligned()
    o, lse = g.empty(q.shape), g.empty((B, H, n_new))
    emu.call("pytfm_attention_gqa_decode_cuda", o, lse, g(q), g(k_cache), g(v_cache), B, n_new,
             H, Hkv, D, Tmax, start, scale, window)
    ro, rlse = decode_reference(q, k_cache, v_cache, start, scale, window)
    co, clse = ops.attention_decode(q, k_cache, v_cache, start, scale, window=window)
    rel = softmax_rel(q, k_cache, scale, start + n_new)
    close("gqa_decode.o", o, ro, co, rel * amax(v_cache))
    close("gqa_decode.lse", lse, rlse, clse, rel + EPS32 * amax(rlse))
    g.check()


def test_gqa_bad_arguments_are_clear_errors(emu):
    x = [np.zeros(129 * 4, np.float32) for _ in range(8)]
    lse = np.zeros(8, np.float32)
    with pytest.raises(EmuError, match=r"pytfm_attention_gqa_forward_cuda: D must be <= 128"):
        emu.call("pytfm_attention_gqa_forward_cuda", x[0], lse, *x[1:4], 1, 2, 2, 1, 129, 0.1,
                 1, 0)
    with pytest.raises(EmuError, match=r"pytfm_attention_gqa_backward_cuda: Hkv must divide H"):
        emu.call("pytfm_attention_gqa_backward_cuda", *x, lse, 1, 2, 3, 2, 4, 0.1, 1, 0)
    with pytest.raises(EmuError, match=r"pytfm_attention_gqa_decode_cuda: window must be >= 0"):
        emu.call("pytfm_attention_gqa_decode_cuda", x[0], lse, *x[1:4], 1, 1, 2, 1, 4, 2, 1, 0.1,
                 -1)
    with pytest.raises(EmuError, match=r"window = 5 needs causal attention"):
        emu.call("pytfm_attention_gqa_forward_cuda", x[0], lse, *x[1:4], 1, 2, 2, 1, 4, 0.1, 0,
                 5)


# ---- the emulator features the kernels use ---------------------------------------------------


def aligned_floats(n, offset=0):
    big = np.zeros(n + 8, np.float32)
    start = (-(big.ctypes.data // 4)) % 4 + offset
    return big[start:start + n]


def test_emulator_checks_float4_alignment(emu):
    x = aligned_floats(64, 0)
    x[:] = np.arange(64)
    out = aligned_floats(64)
    emu.call("emu_vector_copy", out, x, 16, 0, stream=False)
    np.testing.assert_array_equal(out, x)
    emu.call("emu_vector_copy", out[:60], x, 15, 4, stream=False)  # 16 bytes on: aligned
    np.testing.assert_array_equal(out[:60], x[4:])
    with pytest.raises(EmuError, match=r"status 4: .*block \(0,0,0\): thread \(0,0,0\): "
                                       r"pytfm__load4 of 0x[0-9a-f]+, which is not 16-byte "
                                       r"aligned"):
        emu.call("emu_vector_copy", out, x, 15, 1, stream=False)
    with pytest.raises(EmuError, match=r"thread \(0,0,0\): pytfm__store4 to 0x[0-9a-f]+, which "
                                       r"is not 16-byte aligned"):
        emu.call("emu_vector_copy", out[1:], x, 15, 0, stream=False)
    emu.call("emu_vector_copy", out, x, 16, 0, stream=False)  # the error does not stick


def test_emulator_shared_memory_beyond_48k_needs_cudaFuncSetAttribute(emu):  # noqa: N802
    want = 63 - np.arange(64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    emu.call("emu_big_shared", out, 48 * 1024, 48 * 1024, stream=False)  # the default limit
    np.testing.assert_array_equal(out, want)
    with pytest.raises(EmuError, match=r"invalid configuration argument.* 65536 bytes of "
                                       r"dynamic shared memory; over 48 KiB needs "
                                       r"cudaFuncSetAttribute\(kernel, "
                                       r"cudaFuncAttributeMaxDynamicSharedMemorySize, bytes\)"):
        emu.call("emu_big_shared", out, 64 * 1024, -1, stream=False)
    out[:] = 0
    emu.call("emu_big_shared", out, 232448, 232448, stream=False)  # sm_90's opt-in maximum
    np.testing.assert_array_equal(out, want)
    out[:] = 0
    emu.call("emu_big_shared", out, 64 * 1024, -1, stream=False)  # the raised limit stays
    np.testing.assert_array_equal(out, want)
    with pytest.raises(EmuError, match=r"232464 bytes of dynamic shared memory; more than this "
                                       r"kernel's cudaFuncAttributeMaxDynamicSharedMemorySize"):
        emu.call("emu_big_shared", out, 232448 + 16, -1, stream=False)
    with pytest.raises(EmuError, match=r"invalid argument \(cudaErrorInvalidValue\)"):
        emu.call("emu_big_shared", out, 1024, 232448 + 4, stream=False)  # past 227 KiB
    # another kernel's limit is its own: emu_block_sum still stops at 48 KiB
    x = np.ones((1, 64), np.float32)
    with pytest.raises(EmuError, match="invalid configuration argument.* 65536 bytes of dynamic"):
        emu.call("emu_block_sum", np.zeros(1, np.float32), x, 1, 64, 64 * 1024, stream=False)
    emu.call("emu_big_shared", out, 1024, 48 * 1024, stream=False)  # back to the default


def test_emulator_malloc_async_scratch(emu):
    x = np.arange(300, dtype=np.float32)
    out = np.zeros_like(x)
    emu.call("emu_malloc_async", out, x, 300, stream=False)
    np.testing.assert_array_equal(out, 2 * x)
