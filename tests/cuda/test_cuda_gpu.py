"""The CUDA kernels on a real GPU, through pytfm.ops with CuPy arrays, against the C kernels
(NumPy arrays) on the same inputs, or, for the largest, against a float64 reference computed
on the device. Each comparison runs on the device (same()): the host holds no float64 copy of
an array, and a bad element is read back alone. Skipped where CuPy, a GPU or a CUDA build of
pytfm is missing; scripts/gpu_check.sh runs them on a machine that has all three.
"""

import numpy as np
import pytest

from helpers import RECORD, cupy_on_a_gpu
from pytfm import ops

cp = cupy_on_a_gpu()

EPS32 = float(np.finfo(np.float32).eps)
SIZES = [(1, 1), (3, 7), (33, 65), (257, 1024), (7, 1025), (129, 4099)]


def both(rng, shape, scale=1.0, offset=0.0):
    a = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
    return a, cp.asarray(a)


def same(name, gpu, want, atol, rtol=1e-5):
    """|gpu − want| <= atol + rtol·|want| everywhere (helpers.assert_close's rule and record),
    computed on the device in float64: want (and atol) a NumPy or CuPy array or a number."""
    assert isinstance(gpu, cp.ndarray), type(gpu)
    got = gpu.astype(cp.float64)
    ref = cp.asarray(want, dtype=cp.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, reference {ref.shape}"
    atol = cp.asarray(atol, dtype=cp.float64)
    assert bool((cp.isfinite(got) | ~cp.isfinite(ref)).all()), f"{name}: non-finite values"
    err = cp.abs(got - ref)
    tol = atol + rtol * cp.abs(ref)
    stats = RECORD[f"cuda-gpu.{name}"]
    stats.count += 1
    if err.size:
        scale, worst = (float(v) for v in (cp.abs(ref).max(), err.max()))
        if scale > 1e3 * float(atol.max()):
            stats.max_rel = max(stats.max_rel, worst / scale)
        ratio = cp.where(err == 0, 0.0, err / cp.maximum(tol, 1e-300))
        stats.max_ratio = max(stats.max_ratio, float(ratio.max()))
    bad = err > tol
    count = int(bad.sum())
    if count:
        i = np.unravel_index(int(cp.where(bad, err - tol, -cp.inf).argmax()), err.shape)
        raise AssertionError(
            f"{name}: {count} of {err.size} elements out of tolerance; worst at {i}: got "
            f"{float(got[i])!r}, reference {float(ref[i])!r}, |err| {float(err[i]):.3g} > tol "
            f"{float(cp.broadcast_to(tol, err.shape)[i]):.3g}")


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
    """Relative error to expect in probabilities and outputs (tests/kernels/test_attention.py)."""
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


# ---- the SGEMM (cuda/sgemm.cu) at real sizes ------------------------------------------------


def sgemm(name, c, a, b, m, n, k, trans_a, trans_b, beta):
    """lib.<name> (pytfm_sgemm_cuda or pytfm_sgemm_plain_cuda) on CuPy arrays, current stream."""
    from pytfm._core import check, ffi, lib

    def p(x):
        return ffi.cast("float *", x.data.ptr)

    stream = ffi.cast("void *", cp.cuda.get_current_stream().ptr)
    check(getattr(lib, name)(p(c), p(a), p(b), m, n, k, trans_a, trans_b, beta, stream))
    return c


def sgemm_case(m, n, k, trans_a, trans_b, seed=0):
    rng = cp.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k), dtype=cp.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n), dtype=cp.float32)
    opa, opb = (a.T if trans_a else a), (b.T if trans_b else b)
    # |error| <= k·eps·Σ|a||b| for either order of the sum: the bound for fast vs cuBLAS
    tol = 2 * k * EPS32 * cp.matmul(abs(opa), abs(opb))
    return a, b, cp.matmul(opa, opb), tol


def bits_equal(x, y):
    return bool((x.view(cp.uint32) == y.view(cp.uint32)).all())


# the linear layer's three products: y = x·Wᵀ, dx = dy·W, dW = dyᵀ·x
LINEAR = pytest.mark.parametrize("trans_a,trans_b", [(0, 1), (0, 0), (1, 0)],
                                 ids=["x_wT", "dy_w", "dyT_x"])


@LINEAR
def test_sgemm_4096_against_cublas_and_the_plain_kernel(trans_a, trans_b):
    n = 4096  # 1024 tiles of 128×128: the big class, several waves
    a, b, want, tol = sgemm_case(n, n, n, trans_a, trans_b)
    c = sgemm("pytfm_sgemm_cuda", cp.full((n, n), cp.nan, cp.float32), a, b, n, n, n, trans_a,
              trans_b, 0.0)
    same("sgemm.4096", c, want, tol, 0)
    plain = sgemm("pytfm_sgemm_plain_cuda", cp.empty((n, n), cp.float32), a, b, n, n, n,
                  trans_a, trans_b, 0.0)
    assert bits_equal(c, plain), "fast and plain both sum k in order with fmaf: the same bits"
    c0 = cp.random.default_rng(1).standard_normal((n, n), dtype=cp.float32)
    c = sgemm("pytfm_sgemm_cuda", c0.copy(), a, b, n, n, n, trans_a, trans_b, 1.0)  # dW += ...
    same("sgemm.4096.accumulate", c, want + c0, tol + abs(c0) * EPS32, 0)


@pytest.mark.parametrize("m,n,k", [(1024, 1024, 1024), (4097, 1000, 129), (1, 5000, 3),
                                   (3000, 1, 77), (129, 131, 4099), (2, 4_194_305, 3)])
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_sgemm_sizes_off_the_tiles(m, n, k, trans_a, trans_b):
    """Edges in every dimension, both size classes (1024² takes the 64×64 tiles), and n past
    the plain kernel's 65535 column tiles (4194305 columns: the fast one has no such cap)."""
    a, b, want, tol = sgemm_case(m, n, k, trans_a, trans_b, seed=m + n + k)
    c = sgemm("pytfm_sgemm_cuda", cp.full((m, n), cp.nan, cp.float32), a, b, m, n, k, trans_a,
              trans_b, 0.0)
    same(f"sgemm.{m}x{n}x{k}", c, want, tol, 0)
    if n <= 65535 * 64:
        plain = sgemm("pytfm_sgemm_plain_cuda", cp.empty((m, n), cp.float32), a, b, m, n, k,
                      trans_a, trans_b, 0.0)
        assert bits_equal(c, plain)


def tensor_core_rounded(x, precision):
    """x rounded as pytfm_sgemm_ex_cuda rounds it, on the device, in float64: TF32 to nearest,
    ties away (cvt.rna); BF16 to nearest even (cvt.rn, subnormals kept)"""
    u = x.view(cp.uint32).astype(cp.uint64)
    if precision == 2:
        r = (u + 0x1000) & 0xFFFFE000
    else:
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(cp.uint32).view(cp.float32).astype(cp.float64)


@pytest.mark.parametrize("precision", [2, 1], ids=["tf32", "bf16"])
@pytest.mark.parametrize("m,n,k,trans_a,trans_b", [(4096, 4096, 4096, 0, 1),
                                                   (4096, 4096, 4096, 0, 0),
                                                   (4096, 4096, 4096, 1, 0),
                                                   (129, 131, 77, 1, 1), (1, 300, 17, 0, 1)])
def test_tensor_core_sgemm_against_the_rounded_reference(precision, m, n, k, trans_a, trans_b):
    """pytfm_sgemm_ex_cuda in TF32 and BF16 on the tensor cores: the real instructions'
    fragment layouts and roundings, against float64 on the inputs rounded as the kernel rounds
    them, within tests/cuda/test_cuda_tensor_core.py's bound (k + 2 float32 roundings of at
    most 2u each, u = 2^-24)."""
    a, b, _, _ = sgemm_case(m, n, k, trans_a, trans_b, seed=m + k + precision)
    opa = tensor_core_rounded(a.T if trans_a else a, precision)
    opb = tensor_core_rounded(b.T if trans_b else b, precision)
    want = cp.matmul(opa, opb)
    tol = 1.01 * (k + 2) * 2 * 2.0**-24 * cp.matmul(abs(opa), abs(opb))
    from pytfm._core import check, ffi, lib

    c = cp.full((m, n), cp.nan, cp.float32)
    stream = ffi.cast("void *", cp.cuda.get_current_stream().ptr)
    check(lib.pytfm_sgemm_ex_cuda(ffi.cast("float *", c.data.ptr),
                                  ffi.cast("float *", a.data.ptr),
                                  ffi.cast("float *", b.data.ptr), m, n, k, trans_a, trans_b,
                                  0.0, precision, stream))
    same(f"sgemm_ex.{precision}.{m}x{n}x{k}", c, want, tol, 0)


@pytest.mark.parametrize("m,n,k,trans_a,trans_b,offset",
                         [(4096, 4096, 4096, 0, 1, 0), (4096, 4096, 4096, 1, 0, 0),
                          (129, 131, 77, 1, 1, 0), (300, 70, 33, 0, 0, 1),
                          (65, 64, 40, 0, 1, 2), (1, 300, 17, 0, 1, 0)])
def test_gemm_bf16_is_the_bf16_product_of_its_widened_operands(m, n, k, trans_a, trans_b,
                                                               offset):
    """pytfm_gemm_bf16_cuda (ops.gemm_bf16) on BF16 bits gives the bits of pytfm_sgemm_ex_cuda
    at BF16 on their float32 widening, as its header says, at 4096³ (the BF16-operand kernel on
    both sides) and at small or offset sizes (the in-block route, views 2 or 4 bytes off a
    16-byte boundary: the 2- and 4-byte copies); and lands within the rounded reference's
    bound."""
    from pytfm import ops
    from pytfm._core import check, ffi, lib

    a, b, _, _ = sgemm_case(m, n, k, trans_a, trans_b, seed=m + n + k)
    wide = [tensor_core_rounded(x, 1).astype(cp.float32) for x in (a, b)]
    bits16 = []
    for x in wide:
        flat = cp.zeros(x.size + offset, cp.uint16)
        flat[offset:] = (x.view(cp.uint32) >> 16).astype(cp.uint16).reshape(-1)
        bits16.append(flat[offset:].reshape(x.shape))
    c = ops.gemm_bf16(*bits16, trans_a=bool(trans_a), trans_b=bool(trans_b))
    want = cp.full((m, n), cp.nan, cp.float32)
    stream = ffi.cast("void *", cp.cuda.get_current_stream().ptr)
    check(lib.pytfm_sgemm_ex_cuda(ffi.cast("float *", want.data.ptr),
                                  ffi.cast("float *", wide[0].data.ptr),
                                  ffi.cast("float *", wide[1].data.ptr), m, n, k, trans_a,
                                  trans_b, 0.0, 1, stream))
    assert bits_equal(c, want)
    opa = wide[0].T if trans_a else wide[0]
    opb = wide[1].T if trans_b else wide[1]
    ref = cp.matmul(opa.astype(cp.float64), opb.astype(cp.float64))
    tol = 1.01 * (k + 2) * 2 * 2.0**-24 * cp.matmul(abs(opa.astype(cp.float64)),
                                                     abs(opb.astype(cp.float64)))
    same(f"gemm_bf16.{m}x{n}x{k}", c, ref, tol, 0)


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_sgemm_on_views_offset_by_one_float(trans_a, trans_b):
    """x[1:] of a larger array is contiguous but 4 bytes past a 16-byte boundary: the loaders
    take 4-byte cp.async and scalar loads there, with the same bits as the float4 ones."""
    m, n, k = 300, 264, 136  # multiples of 4: the aligned copies take float4s everywhere
    a, b, want, tol = sgemm_case(m, n, k, trans_a, trans_b, seed=7)
    views = [cp.empty(x.size + 1, cp.float32)[1:].reshape(x.shape) for x in (a, b)]
    for v, x in zip(views, (a, b)):
        v[...] = x
        assert v.data.ptr % 16 == 4
    c0 = cp.random.default_rng(2).standard_normal((m, n), dtype=cp.float32)
    for beta in (0.0, 1.5):
        cv = cp.empty(m * n + 1, cp.float32)[1:].reshape(m, n)
        cv[...] = c0
        sgemm("pytfm_sgemm_cuda", cv, *views, m, n, k, trans_a, trans_b, beta)
        c = sgemm("pytfm_sgemm_cuda", c0.copy(), a, b, m, n, k, trans_a, trans_b, beta)
        assert bits_equal(cv, c)
        same("sgemm.view", cv, want + beta * c0, tol + abs(beta * c0) * EPS32, 0)


# ---- the row kernels in registers and the two-stage column sums at real sizes ---------------


def softmax_layernorm_against_cpu(name, gx, x, gdy, dy, gw, w, gb, b):
    """softmax and LayerNorm forward and backward on the GPU (gx, ... CuPy arrays, possibly
    views) against the C kernels on the same values."""
    cols = x.shape[-1]
    y = ops.softmax_forward(x)
    same(f"{name}.softmax.forward", ops.softmax_forward(gx), y, atol=1e-7, rtol=1e-4)
    same(f"{name}.softmax.backward", ops.softmax_backward(gdy, cp.asarray(y)),
         ops.softmax_backward(dy, y), atol=4 * cols * EPS32 * float(abs(dy).max()), rtol=1e-4)
    cpu, gpu = ops.layernorm_forward(x, w, b), ops.layernorm_forward(gx, gw, gb)
    for part, g, c in zip(("y", "mean", "rstd"), gpu, cpu):
        same(f"{name}.layernorm.forward.{part}", g, c, atol=1e-5 * (1 + float(abs(c).max())),
             rtol=1e-4)
    _, mean, rstd = cpu
    rows = x.size // cols
    cpu = ops.layernorm_backward(dy, x, w, mean, rstd)
    gpu = ops.layernorm_backward(gdy, gx, gw, cp.asarray(mean), cp.asarray(rstd))
    same(f"{name}.layernorm.backward.dx", gpu[0], cpu[0],
         atol=1e-5 * (1 + float(abs(cpu[0]).max())), rtol=1e-4)
    check_dw_db(name, gpu[1:], cpu[1:], dy, x, mean, rstd, rows)


def check_dw_db(name, gpu, cpu, dy, x, mean, rstd, rows, dw0=0.0, db0=0.0):
    """dw, db against the float64 reference and the C kernels. Float sums over the rows in a
    fixed order are off by about sqrt(terms in a chain)·eps·|partial sums|: far under
    1e-6·Σ_rows |term| (the tolerance), while a block's or a chunk's partial left out or
    counted twice is of order sqrt(rows in it)·|term|, far over it."""
    from pytfm import reference as ref

    dy2, x2 = dy.reshape(rows, -1).astype(np.float64), x.reshape(rows, -1).astype(np.float64)
    xhat = (x2 - mean.reshape(rows, 1)) * rstd.reshape(rows, 1)
    _, rdw, rdb = ref.layernorm_backward(dy2, x2, np.ones(x2.shape[1]), mean.reshape(rows),
                                         rstd.reshape(rows))
    for part, g, c, r, terms, start in (("dw", gpu[0], cpu[0], rdw, dy2 * xhat, dw0),
                                        ("db", gpu[1], cpu[1], rdb, dy2, db0)):
        atol = 1e-6 * (abs(terms).sum(0) + abs(start)) + 1e-6
        same(f"{name}.layernorm.backward.{part}", g, start + r, atol=atol, rtol=0)
        same(f"{name}.layernorm.backward.{part}.vs-c", g, c, atol=2 * atol, rtol=0)


def test_rows_past_one_grid():
    """600000 rows of 64 columns: a warp per row, 8 rows a block, more rows than 65535 blocks
    hold, so each warp walks the grid-stride loop; LayerNorm's backward sums its dw/db
    partials over ~1100 rows a block."""
    rng = np.random.default_rng(12)
    rows, cols = 600000, 64
    assert rows > 65535 * 8
    (x, gx), (dy, gdy) = both(rng, (rows, cols), 2.0), both(rng, (rows, cols))
    (w, gw), (b, gb) = both(rng, cols), both(rng, cols)
    softmax_layernorm_against_cpu("grid", gx, x, gdy, dy, gw, w, gb, b)


@pytest.mark.parametrize("cols", [100, 128, 256, 500, 1024, 1027, 2048, 3000, 4096, 4097])
def test_every_column_class(cols):
    """Each register class full (128 ... 4096), partly full, with the 32-bit path (cols % 4),
    and the plain kernels past it (4097)."""
    rng = np.random.default_rng(cols)
    rows = 1000
    (x, gx), (dy, gdy) = both(rng, (rows, cols), 2.0, 1.0), both(rng, (rows, cols))
    (w, gw), (b, gb) = both(rng, cols), both(rng, cols)
    softmax_layernorm_against_cpu(f"class{cols}", gx, x, gdy, dy, gw, w, gb, b)


@pytest.mark.parametrize("cols", [64, 768, 2048])
def test_row_kernels_on_views_offset_by_one_float(cols):
    """x[1:] of a flat array, reshaped: contiguous, 4 bytes past a 16-byte boundary, so the
    kernels take their 32-bit path (a float4 access there would fault)."""
    rng = np.random.default_rng(cols)
    rows = 513
    flat = [cp.asarray(rng.standard_normal(rows * cols + 1).astype(np.float32)) for _ in range(2)]
    gx, gdy = (f[1:].reshape(rows, cols) for f in flat)
    assert gx.data.ptr % 16 == 4
    x, dy = cp.asnumpy(gx), cp.asnumpy(gdy)
    (w, gw), (b, gb) = both(rng, cols), both(rng, cols)
    softmax_layernorm_against_cpu(f"view{cols}", gx, x, gdy, dy, gw, w, gb, b)


def test_layernorm_dw_db_at_gpt2_size():
    """rows = 8192, C = 768: dx and the dw/db partials in one pass (528 blocks), the partials
    added in block order; against the CPU, and the same bits on a second run."""
    rng = np.random.default_rng(768)
    rows, cols = 8192, 768
    (x, gx), (dy, gdy) = both(rng, (rows, cols), 2.0), both(rng, (rows, cols))
    w, gw = both(rng, cols)
    _, mean, rstd = ops.layernorm_forward(x, w, np.zeros(cols, np.float32))
    dw0, db0 = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(
        np.float32)
    cdx, cdw, cdb = ops.layernorm_backward(dy, x, w, mean, rstd, dw=dw0.copy(), db=db0.copy())
    runs = []
    for _ in range(2):
        gdw, gdb = cp.asarray(dw0), cp.asarray(db0)
        runs.append(ops.layernorm_backward(gdy, gx, gw, cp.asarray(mean), cp.asarray(rstd),
                                           dw=gdw, db=gdb))
    same("ln8192.dx", runs[0][0], cdx, atol=1e-5 * (1 + float(abs(cdx).max())), rtol=1e-4)
    check_dw_db("ln8192", runs[0][1:], (cdw, cdb), dy, x, mean, rstd, rows, dw0, db0)
    for a, b in zip(runs[0], runs[1]):
        assert bool((a.view(cp.uint32) == b.view(cp.uint32)).all())


def test_bias_gradient_at_gpt2_size():
    """The linear layer's db: the two-stage column sum over 8192 rows of 768 (1032 blocks)."""
    rng = np.random.default_rng(8192)
    rows, inn, out = 8192, 64, 768
    (x, gx), (w, gw), (dy, gdy) = both(rng, (rows, inn)), both(rng, (out, inn)), both(
        rng, (rows, out))
    _, _, cdb = ops.linear_backward(dy, x, w)
    g1 = ops.linear_backward(gdy, gx, gw)[2]
    g2 = ops.linear_backward(gdy, gx, gw)[2]
    rdb = dy.astype(np.float64).sum(0)
    atol = 1e-6 * abs(dy).sum(0) + 1e-6  # as check_dw_db's
    same("bias8192.db", g1, rdb, atol=atol, rtol=0)
    same("bias8192.db.vs-c", g1, cdb, atol=2 * atol, rtol=0)
    assert bool((g1.view(cp.uint32) == g2.view(cp.uint32)).all())


# ---- the memory-bound kernels at real sizes ------------------------------------------------


def offset_view(a):
    """A CuPy copy of a (NumPy or CuPy) that starts one float past a 16-byte boundary:
    contiguous, so the kernels take it, but their float4 paths must step aside."""
    flat = cp.empty(a.size + 4, cp.float32)
    v = flat[1:1 + a.size].reshape(a.shape)
    v[...] = cp.asarray(a)
    assert v.data.ptr % 16 == 4
    return v


def cross_entropy_reference(logits, targets):
    """(loss, lse, dlogits) of the mean cross-entropy in float64, on the device (CuPy)."""
    x = logits.astype(cp.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + cp.log(cp.exp(x - m).sum(axis=1))
    kept = targets != -1
    rows = cp.arange(x.shape[0])
    picked = x[rows, cp.where(kept, targets, 0)]
    n = int(kept.sum())
    loss = cp.where(kept, lse - picked, 0.0).sum() / n
    d = cp.exp(x - lse[:, None])
    d[rows, cp.where(kept, targets, 0)] -= kept
    d *= cp.where(kept, 1.0 / n, 0.0)[:, None]
    return loss, lse, d


@pytest.mark.parametrize("vocab", [50304, 131072])
def test_cross_entropy_large_vocabularies(vocab):
    """4096 rows of a GPT-2 (and a 128k) vocabulary: more blocks than the GPU holds at once,
    rows read once by the online max/sum; an offset view of the logits takes scalar heads and
    tails. The reference: float64 on the device (2 GB of logits stay there), and the C kernels
    on a sample of 64 rows."""
    rows = 4096
    glogits = cp.random.default_rng(vocab).standard_normal((rows, vocab), dtype=cp.float32) * 3
    targets = np.random.default_rng(vocab).integers(0, vocab, size=rows)
    targets[::5] = -1
    gtargets = cp.asarray(targets)
    loss, lse, d = cross_entropy_reference(glogits, gtargets)
    mag = EPS32 * float(cp.abs(glogits).max())
    kept = int((targets != -1).sum())
    sample = np.unique(np.r_[0, rows - 1, np.random.default_rng(1).integers(0, rows, 62)])
    host = cp.asnumpy(glogits[cp.asarray(sample)])
    _, c_lse = ops.cross_entropy_forward(host, targets[sample])
    for name, g in (("aligned", glogits), ("offset", offset_view(glogits))):
        gloss, glse = ops.cross_entropy_forward(g, gtargets)
        same(f"cross_entropy.{name}.lse", glse, lse, 1e-5 + 8 * mag, 1e-6)
        same(f"cross_entropy.{name}.lse.vs-c", glse[cp.asarray(sample)], c_lse,
             2e-5 + 16 * mag, 2e-6)
        same(f"cross_entropy.{name}.loss", gloss, loss, 1e-5 + 8 * mag, 1e-5)
        gd = ops.cross_entropy_backward(g, gtargets, glse)
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
