"""The CUDA kernels on a real GPU, through pytfm.ops with CuPy arrays, against the C kernels
(NumPy arrays) on the same inputs. Skipped where CuPy, a GPU or a CUDA build of pytfm is
missing; scripts/gpu_check.sh runs them on a machine that has all three.
"""

import numpy as np
import pytest

import pytfm
from helpers import assert_close
from pytfm import ops

cp = pytest.importorskip("cupy", reason="CuPy is not installed (pip install cupy-cuda13x)")
if not pytfm.build_info()["cuda"]:
    pytest.skip("pytfm was built without CUDA (nvcc not found)", allow_module_level=True)
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no device")
except Exception as e:  # no driver or no device
    pytest.skip(f"no CUDA GPU here ({e})", allow_module_level=True)

EPS32 = float(np.finfo(np.float32).eps)
SIZES = [(1, 1), (3, 7), (33, 65), (257, 1024), (7, 1025), (129, 4099)]


def both(rng, shape, scale=1.0, offset=0.0):
    a = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
    return a, cp.asarray(a)


def same(name, gpu, cpu, atol, rtol=1e-5):
    assert isinstance(gpu, cp.ndarray) or np.isscalar(gpu), type(gpu)
    assert_close(f"cuda-gpu.{name}", cp.asnumpy(gpu) if isinstance(gpu, cp.ndarray) else gpu,
                 cpu, atol=atol, rtol=rtol)


@pytest.mark.parametrize("rows,inn,out", [(1, 1, 1), (65, 17, 63), (256, 512, 384),
                                          (1000, 129, 3)])
def test_linear(rows, inn, out):
    rng = np.random.default_rng(rows)
    (x, gx), (w, gw), (b, gb) = both(rng, (rows, inn)), both(rng, (out, inn)), both(rng, out)
    tol = 4 * inn * EPS32 * (abs(x) @ abs(w).T + abs(b))
    same("linear.forward", ops.linear_forward(gx, gw, gb), ops.linear_forward(x, w, b), tol)
    dy, gdy = both(rng, (rows, out))
    for name, g, c in zip(("dx", "dw", "db"), ops.linear_backward(gdy, gx, gw),
                          ops.linear_backward(dy, x, w)):
        same(f"linear.backward.{name}", g, c,
             atol=4 * max(rows, out) * EPS32 * float(abs(c).max() + 1))


@pytest.mark.parametrize("rows,cols", SIZES)
def test_softmax_and_layernorm(rows, cols):
    rng = np.random.default_rng(rows * cols)
    (x, gx), (dy, gdy) = both(rng, (rows, cols), 3.0), both(rng, (rows, cols))
    y = ops.softmax_forward(x)
    same("softmax.forward", ops.softmax_forward(gx), y, atol=1e-7, rtol=1e-4)
    same("softmax.backward", ops.softmax_backward(gdy, cp.asarray(y)), ops.softmax_backward(dy, y),
         atol=4 * cols * EPS32 * float(abs(dy).max()), rtol=1e-4)
    (w, gw), (b, gb) = both(rng, cols), both(rng, cols)
    cpu, gpu = ops.layernorm_forward(x, w, b), ops.layernorm_forward(gx, gw, gb)
    for name, g, c in zip(("y", "mean", "rstd"), gpu, cpu):
        same(f"layernorm.forward.{name}", g, c, atol=1e-5 * (1 + float(abs(c).max())), rtol=1e-4)
    _, mean, rstd = cpu
    cpu = ops.layernorm_backward(dy, x, w, mean, rstd)
    gpu = ops.layernorm_backward(gdy, gx, gw, cp.asarray(mean), cp.asarray(rstd))
    for name, g, c in zip(("dx", "dw", "db"), gpu, cpu):
        same(f"layernorm.backward.{name}", g, c, atol=1e-5 * rows * (1 + float(abs(c).max())),
             rtol=1e-4)


def test_rope_gelu_embedding_cross_entropy_adamw():
    rng = np.random.default_rng(0)
    x, gx = both(rng, (2, 33, 3, 64))
    pos = np.arange(33, dtype=np.int64) + 7
    same("rope.forward", ops.rope_forward(gx, cp.asarray(pos)), ops.rope_forward(x, pos), 1e-5)
    same("rope.backward", ops.rope_backward(gx, cp.asarray(pos)), ops.rope_backward(x, pos), 1e-5)
    same("gelu.forward", ops.gelu_forward(gx), ops.gelu_forward(x), 1e-6, 1e-5)
    dy, gdy = both(rng, x.shape)
    same("gelu.backward", ops.gelu_backward(gdy, gx), ops.gelu_backward(dy, x), 1e-6, 1e-5)

    table, gtable = both(rng, (50, 96))
    ids = rng.integers(0, 50, size=(4, 300))  # repeats
    same("embedding.forward", ops.embedding_forward(cp.asarray(ids), gtable),
         ops.embedding_forward(ids, table), 0, 0)
    dy, gdy = both(rng, (4, 300, 96))
    same("embedding.backward", ops.embedding_backward(gdy, cp.asarray(ids), 50),
         ops.embedding_backward(dy, ids, 50), 1e-5)
    with pytest.raises(ValueError, match=r"ids\[1\] = 50 is outside \[0, 50\)"):
        ops.embedding_forward(cp.asarray(np.array([0, 50])), gtable)

    for vocab in (5, 256, 5000):
        logits, glogits = both(rng, (300, vocab), 3.0)
        targets = rng.integers(0, vocab, size=300)
        targets[::7] = -1
        loss, lse = ops.cross_entropy_forward(logits, targets)
        gloss, glse = ops.cross_entropy_forward(glogits, cp.asarray(targets))
        same("cross_entropy.loss", gloss, loss, 1e-5, 1e-5)
        same("cross_entropy.lse", glse, lse, 1e-5, 1e-6)
        same("cross_entropy.backward",
             ops.cross_entropy_backward(glogits, cp.asarray(targets), glse),
             ops.cross_entropy_backward(logits, targets, lse), 1e-7, 1e-4)

    p, g, m, v = (a.astype(np.float32) for a in rng.standard_normal((4, 1000)))
    v = abs(v)
    gp, gg, gm, gv = (cp.asarray(a) for a in (p, g, m, v))
    ops.adamw_step(p, g, m, v, 10, 1e-3, weight_decay=0.1)
    ops.adamw_step(gp, gg, gm, gv, 10, 1e-3, weight_decay=0.1)
    for name, a, b in (("param", gp, p), ("m", gm, m), ("v", gv, v)):
        same(f"adamw.{name}", a, b, 1e-6, 1e-5)


def test_mixing_numpy_and_cupy_is_an_error():
    w = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="x is a CuPy array but w is a NumPy array"):
        ops.linear_forward(cp.ones((2, 3), cp.float32), w)


def test_runs_on_the_current_stream():
    rng = np.random.default_rng(1)
    x, gx = both(rng, (64, 300))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        y = ops.softmax_forward(gx)
    stream.synchronize()
    same("softmax.stream", y, ops.softmax_forward(x), 1e-7, 1e-4)


# ---- attention ------------------------------------------------------------------------------


def attention_rel(q, k, scale, T):
    """Relative error to expect in probabilities and outputs (tests/test_attention.py)."""
    delta = 8 * q.shape[-1] ** 0.5 * EPS32 * float(abs(q).max()) * float(abs(k).max()) * scale
    return np.expm1(2 * (delta + EPS32)) + 8 * (T**0.5 + 1) * EPS32


@pytest.mark.parametrize("B,T,H,D,causal", [(2, 1, 3, 64, True), (1, 65, 2, 80, False),
                                            (2, 300, 4, 128, True), (1, 257, 3, 7, True),
                                            (4, 4096, 8, 64, True),
                                            (7000, 3, 10, 8, True)])  # B·H = 70000 blocks
def test_attention(B, T, H, D, causal):
    rng = np.random.default_rng(T + D)
    (q, gq), (k, gk), (v, gv), (dy, gdy) = (both(rng, (B, T, H, D)) for _ in range(4))
    scale = 1 / np.sqrt(D)
    rel = attention_rel(q, k, scale, T)
    o, lse = ops.attention_forward(q, k, v, causal)
    go, glse = ops.attention_forward(gq, gk, gv, causal)
    same("attention.forward.o", go, o, 2 * rel * float(abs(v).max()))
    same("attention.forward.lse", glse, lse, 2 * rel + EPS32 * float(abs(lse).max()))
    grads = ops.attention_backward(dy, q, k, v, o, lse, causal)
    ggrads = ops.attention_backward(gdy, gq, gk, gv, go, glse, causal)
    noise = rel * scale * D**0.5 * float(abs(dy).max()) * float(abs(v).max())
    floors = (noise * float(abs(k).max()), noise * float(abs(q).max()), rel * float(abs(dy).max()))
    for name, g, c, floor in zip(("dq", "dk", "dv"), ggrads, grads, floors):
        same(f"attention.backward.{name}", g, c, 8 * rel * float(abs(c).max()) + 2 * floor)
    again = ops.attention_backward(gdy, gq, gk, gv, go, glse, causal)  # no atomics: same bits
    for g, g2 in zip(ggrads, again):
        assert bool((g.view(cp.uint32) == g2.view(cp.uint32)).all())


def test_attention_on_views_offset_by_one_float():
    """x[1:] of a larger array is contiguous but 4 bytes past a 16-byte boundary: the kernels
    take their scalar loads there, with the same results as the float4 ones."""
    rng = np.random.default_rng(5)
    B, T, H, D = 2, 130, 4, 64
    n = B * T * H * D
    flat = [cp.asarray(rng.standard_normal(n + 1).astype(np.float32)) for _ in range(4)]
    views = [f[1:].reshape(B, T, H, D) for f in flat]
    assert all(x.data.ptr % 16 == 4 for x in views)
    copies = [cp.ascontiguousarray(x.copy()) for x in views]
    o1, lse1 = ops.attention_forward(*views[:3])
    o2, lse2 = ops.attention_forward(*copies[:3])
    assert bool((o1 == o2).all()) and bool((lse1 == lse2).all())
    g1 = ops.attention_backward(views[3], *views[:3], o1, lse1)
    g2 = ops.attention_backward(copies[3], *copies[:3], o2, lse2)
    for a, b in zip(g1, g2):
        assert bool((a == b).all())
    q, k, v = (cp.asnumpy(x) for x in copies[:3])
    same("attention.view.o", o1, ops.attention_forward(q, k, v)[0],
         2 * attention_rel(q, k, 1 / np.sqrt(D), T) * float(abs(v).max()))


@pytest.mark.parametrize("B,H,D,n_new,start,Tmax", [(1, 8, 64, 1, 3000, 4096),
                                                    (1, 2, 80, 5, 1000, 1100),
                                                    (1, 4, 128, 100, 2000, 2100),
                                                    (8, 32, 64, 1, 500, 512)])
def test_attention_decode_and_cache_append(B, H, D, n_new, start, Tmax):
    rng = np.random.default_rng(start)
    (kc, gkc), (vc, gvc) = both(rng, (B, Tmax, H, D)), both(rng, (B, Tmax, H, D))
    (k, gk), (v, gv), (q, gq) = (both(rng, (B, n_new, H, D)) for _ in range(3))
    ops.attention_cache_append(kc, vc, k, v, start)
    ops.attention_cache_append(gkc, gvc, gk, gv, start)
    same("attention.cache_append.k", gkc, kc, 0, 0)
    same("attention.cache_append.v", gvc, vc, 0, 0)
    o, lse = ops.attention_decode(q, kc, vc, start)
    go, glse = ops.attention_decode(gq, gkc, gvc, start)
    rel = attention_rel(q, kc, 1 / np.sqrt(D), start + n_new)
    same("attention.decode.o", go, o, 2 * rel * float(abs(vc).max()))
    same("attention.decode.lse", glse, lse, 2 * rel + EPS32 * float(abs(lse).max()))


def test_attention_head_dim_above_128_is_an_error():
    q = cp.ones((1, 2, 1, 129), cp.float32)
    with pytest.raises(ValueError, match=r"D must be <= 128"):
        ops.attention_forward(q, q, q)


# ---- issue 12: the memory-bound kernels at real sizes ---------------------------------------


def offset_view(a):
    """A CuPy copy of a (NumPy) that starts one float past a 16-byte boundary: contiguous, so
    the kernels take it, but their float4 paths must step aside."""
    flat = cp.empty(a.size + 4, cp.float32)
    v = flat[1:1 + a.size].reshape(a.shape)
    v[...] = cp.asarray(a)
    assert v.data.ptr % 16 == 4
    return v


@pytest.mark.parametrize("vocab", [50304, 131072])
def test_cross_entropy_large_vocabularies(vocab):
    """4096 rows of a GPT-2 (and a 128k) vocabulary: more blocks than the GPU holds at once,
    rows read once by the online max/sum; an offset view of the logits takes scalar heads and
    tails. The reference: the C kernels on the same numbers."""
    rows = 4096
    glogits = cp.random.default_rng(vocab).standard_normal((rows, vocab), dtype=cp.float32) * 3
    logits = cp.asnumpy(glogits)
    targets = np.random.default_rng(vocab).integers(0, vocab, size=rows)
    targets[::5] = -1
    gtargets = cp.asarray(targets)
    loss, lse = ops.cross_entropy_forward(logits, targets)
    mag = EPS32 * float(abs(logits).max())
    for name, g in (("aligned", glogits), ("offset", offset_view(logits))):
        gloss, glse = ops.cross_entropy_forward(g, gtargets)
        same(f"cross_entropy.{name}.lse", glse, lse, 1e-5 + 8 * mag, 1e-6)
        same(f"cross_entropy.{name}.loss", gloss, loss, 1e-5 + 8 * mag, 1e-5)
        gd = ops.cross_entropy_backward(g, gtargets, glse)
        d = ops.cross_entropy_backward(logits, targets, lse)
        kept = int((targets != -1).sum())
        same(f"cross_entropy.{name}.backward", gd, d, (1e-6 + 8 * mag) / kept, 1e-4)
        again = ops.cross_entropy_backward(g, gtargets, glse)
        assert bool((gd.view(cp.uint32) == again.view(cp.uint32)).all())  # the same bits
        del gd, again


@pytest.mark.parametrize("rows", [8192, 70000])
def test_embedding_backward_large(rows):
    """8192 (and 70000: 18 sort tiles, an unpaired run) rows of 768 into a 50304-row table:
    ids uniform, plus a few ids repeated hundreds of times (long groups); the sorted backward
    adds each group in order of position, so dtable has the CPU's bits, aligned or not."""
    vocab, dim = 50304, 768
    rng = np.random.default_rng(rows)
    ids = rng.integers(0, vocab, size=rows)
    often = rng.random(rows) < 0.1  # ids 0..4: each about 2% of the rows
    ids[often] = rng.integers(0, 5, size=int(often.sum()))
    dy = rng.standard_normal((rows, dim), dtype=np.float32)
    dt0 = rng.standard_normal((vocab, dim), dtype=np.float32)
    want = ops.embedding_backward(dy, ids, vocab, dtable=dt0.copy())
    gids = cp.asarray(ids)
    for name, gdy, gdt in (("aligned", cp.asarray(dy), cp.asarray(dt0)),
                           ("offset", offset_view(dy), offset_view(dt0))):
        got = ops.embedding_backward(gdy, gids, vocab, dtable=gdt)
        assert bool((got.view(cp.uint32) == cp.asarray(want).view(cp.uint32)).all()), name
    table = cp.asarray(dt0)
    same("embedding.forward.large", ops.embedding_forward(gids, table),
         ops.embedding_forward(ids, dt0), 0, 0)


@pytest.mark.parametrize("batched", [False, True])
def test_rope_gelu_and_qkv_split_large(batched):
    """[4, 4096, 16, 64] (16.8M floats): RoPE's table of 4096 (or 4·4096) position rows, the
    float4 rotations, an offset view's scalar ones; the QKV split on [2, 4096, 3, 16, 64];
    GELU over the same floats, aligned and offset."""
    B, T, H, D = 4, 4096, 16, 64
    rng = np.random.default_rng(int(batched))
    x = rng.standard_normal((B, T, H, D), dtype=np.float32)
    pos = np.arange(T) + 10**5
    if batched:
        pos = pos + rng.integers(0, 1000, size=(B, 1))
    gpos = cp.asarray(pos)
    tol = 4 * EPS32 * float(abs(x).max())
    for name, gx in (("aligned", cp.asarray(x)), ("offset", offset_view(x))):
        same(f"rope.forward.{name}", ops.rope_forward(gx, gpos), ops.rope_forward(x, pos), tol, 0)
        same(f"rope.backward.{name}", ops.rope_backward(gx, gpos), ops.rope_backward(x, pos),
             tol, 0)
        same(f"gelu.forward.{name}", ops.gelu_forward(gx), ops.gelu_forward(x),
             4 * EPS32 * (1 + abs(x)), 0)
        same(f"gelu.backward.{name}", ops.gelu_backward(gx, gx), ops.gelu_backward(x, x),
             8 * EPS32 * (1 + abs(x)) * abs(x), 0)
    qkv = rng.standard_normal((2, T, 3, H, D), dtype=np.float32)
    qpos = pos if not batched else pos[:2]
    for g, c in zip(ops.qkv_split_forward(cp.asarray(qkv), cp.asarray(qpos)),
                    ops.qkv_split_forward(qkv, qpos)):
        same("qkv_split.forward.large", g, c, 4 * EPS32 * float(abs(qkv).max()), 0)
