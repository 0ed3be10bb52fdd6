"""Every CUDA kernel once, on small awkward sizes, through pytfm.ops with CuPy arrays, then one
training step and a short generation of a tiny GPT on the GPU, four calls of its TrainStep (the
workspace's scratch, the captured graph replayed), and the C model on PYTFM_DEVICE_CUDA: the
workload scripts/gpu_check.sh hands to compute-sanitizer (memcheck, racecheck, synccheck).

    python scripts/cuda_small_run.py          # PYTFM_SMALL_RUN_NO_POOL=1: CuPy's pools off

With PYTFM_SMALL_RUN_NO_POOL=1 CuPy allocates every array with its own cudaMalloc (no memory
pool), so memcheck sees where each array ends: a read one past an array's end inside a pooled
block would go unseen. Each section runs on its own, synchronises the device and prints ok or
its error; one that fails (a twin not built, an error the device reports) does not stop the
others. Exit status 0 when every section passed, 1 otherwise.

KERNELS names the sections that call the kernels themselves: between them every CUDA function
of pytfm_cuda.h (each op's _cuda twin and the functions of no C op), each _ex function in
every precision it takes, the tensor-core attention at each head dim of its kernels and the
tensor-core products in each transpose. tests/cuda/test_cuda_small_run.py runs them under the
CPU emulator and fails when a CUDA function, a precision or one of those paths is left out.
"""

import math
import os
import sys
import traceback

import cupy as cp
import numpy as np

from pytfm import ops
from pytfm._core import check, ffi, lib

if os.environ.get("PYTFM_SMALL_RUN_NO_POOL") == "1":
    cp.cuda.set_allocator(None)
    cp.cuda.set_pinned_memory_allocator(None)

rng = np.random.default_rng(0)


def r(*shape):
    return cp.asarray(rng.standard_normal(shape).astype(np.float32))


def unaligned(*shape):
    """A random array whose data starts 4 bytes into its allocation: not 16-byte aligned, so
    kernels that use float4 loads must take their scalar path."""
    n = math.prod(shape)
    flat = cp.empty(n + 1, np.float32)
    flat[1:] = r(n)
    return flat[1:].reshape(shape)


def p(a):
    """a CuPy array's device pointer, as the C functions take it"""
    kind = {"int64": "int64_t *", "uint16": "uint16_t *"}.get(str(a.dtype), "float *")
    return ffi.cast(kind, a.data.ptr)


def stream():
    return ffi.cast("void *", cp.cuda.get_current_stream().ptr)


def sgemm(name, m, n, k, trans_a, trans_b, beta, *precision, view=False):
    """lib.<name> (pytfm_sgemm_cuda, _plain_cuda or, with a precision, _ex_cuda) on random
    operands; view: each operand one float past a 16-byte boundary (the 4-byte copies)"""
    make = unaligned if view else r
    a, b = make(*((k, m) if trans_a else (m, k))), make(*((n, k) if trans_b else (k, n)))
    c = make(m, n)
    check(getattr(lib, name)(p(c), p(a), p(b), m, n, k, trans_a, trans_b, beta, *precision,
                             stream()))


def core_ops():
    for rows, inn, out in ((1, 1, 1), (65, 17, 63), (33, 64, 129)):
        x, w, b, dy = r(rows, inn), r(out, inn), r(out), r(rows, out)
        ops.linear_forward(x, w, b)
        ops.linear_backward(dy, x, w)
    for m, n, k in ((1, 1, 1), (65, 130, 17), (129, 64, 40)):
        for trans_a, trans_b in TRANSPOSES:
            sgemm("pytfm_sgemm_cuda", m, n, k, trans_a, trans_b, 0.5)
            sgemm("pytfm_sgemm_plain_cuda", m, n, k, trans_a, trans_b, 0.0)
    for rows, cols in ((1, 1), (3, 33), (9, 1024), (2, 1025), (5, 3000)):
        x, dy, w, b = r(rows, cols), r(rows, cols), r(cols), r(cols)
        y = ops.softmax_forward(x)
        ops.softmax_backward(dy, y)
        _, mean, rstd = ops.layernorm_forward(x, w, b)
        ops.layernorm_backward(dy, x, w, mean, rstd)
        targets = cp.asarray(rng.integers(-1, cols, size=rows))
        _, lse = ops.cross_entropy_forward(x, targets)
        ops.cross_entropy_backward(x, targets, lse)
    x, pos = r(2, 5, 3, 10), cp.arange(5, dtype=np.int64)
    ops.rope_backward(ops.rope_forward(x, pos), pos)
    for count in (1, 257, 5000):
        x = r(count)
        ops.gelu_backward(r(count), ops.gelu_forward(x))
        ops.adamw_step(r(count), r(count), r(count), abs(r(count)), 3, 1e-3, weight_decay=0.1)
        host = np.zeros(8, np.float32)  # the scalars read on the device (TrainStep's graph)
        check(lib.pytfm_cuda_adamw_scalars(ffi.cast("float *", ffi.from_buffer("float[]", host)), 3,
                                           1e-3, 0.9, 0.999, 1e-8, 0.1))
        scalars = cp.asarray(host)
        param, m, v, grad = r(count), r(count), abs(r(count)), r(count)
        check(lib.pytfm_adamw_step_scalars_cuda(p(param), p(m), p(v), p(grad), count,
                                                p(scalars), stream()))
    ids = cp.asarray(rng.integers(0, 7, size=40))
    ops.embedding_forward(ids, r(7, 33))
    ops.embedding_backward(r(40, 33), ids, 7)


def label_smoothing():
    """cross-entropy with label smoothing, forward and backward: rows for a warp and for a
    block (vocab past 1024), ignored targets, ε = 1, an unaligned view (the scalar loads)"""
    for rows, vocab, eps in ((1, 1, 0.1), (9, 33, 1.0), (3, 1025, 0.1), (5, 3000, 0.25)):
        x = r(rows, vocab)
        targets = cp.asarray(rng.integers(-1, vocab, size=rows))
        _, lse = ops.cross_entropy_forward(x, targets, label_smoothing=eps)
        ops.cross_entropy_backward(x, targets, lse, label_smoothing=eps)
    x, targets = unaligned(7, 37), cp.asarray(rng.integers(-1, 37, size=7))
    _, lse = ops.cross_entropy_forward(x, targets, label_smoothing=0.1)
    ops.cross_entropy_backward(x, targets, lse, dloss=0.5, label_smoothing=0.1)


def fused_ops():
    """qkv_split (with and without RoPE), linear_gelu_forward, sum_squares."""
    for B, T, H, D in ((1, 1, 1, 2), (2, 65, 3, 10), (1, 7, 2, 80)):
        qkv = r(B, T, 3, H, D)
        pos = cp.arange(T, dtype=np.int64)
        for p in (pos, None):
            ops.qkv_split_forward(qkv, p)
            ops.qkv_split_backward(r(B, T, H, D), r(B, T, H, D), r(B, T, H, D), p)
    for rows, inn, out in ((1, 1, 1), (65, 17, 63), (33, 64, 129)):
        x, w, b = r(rows, inn), r(out, inn), r(out)
        ops.linear_gelu_forward(x, w, b)
        ops.linear_gelu_forward(x, w, None)
    for count in (1, 1000, 100003):
        total = ops.sum_squares(r(count))
        assert math.isfinite(float(total)), total


def attention():
    """forward and backward (causal and not) on sizes one past a tile, D = 80 and 128, an
    unaligned view; cache_append then decode, a long cache with few batch·heads (the split over
    the cache length)."""
    for B, T, H, D in ((1, 1, 1, 16), (2, 65, 3, 32), (1, 33, 2, 80), (1, 17, 1, 128)):
        for causal in (True, False):
            q, k, v, dy = r(B, T, H, D), r(B, T, H, D), r(B, T, H, D), r(B, T, H, D)
            o, lse = ops.attention_forward(q, k, v, causal=causal)
            ops.attention_backward(dy, q, k, v, o, lse, causal=causal)
    q, k, v, dy = (unaligned(1, 9, 2, 16) for _ in range(4))
    o, lse = ops.attention_forward(q, k, v)
    ops.attention_backward(dy, q, k, v, o, lse)
    for B, H, D, Tmax, prompt in ((2, 3, 32, 70, 65), (1, 1, 64, 1000, 996)):
        k_cache, v_cache = cp.zeros((B, Tmax, H, D), np.float32), cp.zeros((B, Tmax, H, D),
                                                                         np.float32)
        ops.attention_cache_append(k_cache, v_cache, r(B, prompt, H, D), r(B, prompt, H, D), 0)
        start = prompt
        for n_new in (1, 3):
            ops.attention_cache_append(k_cache, v_cache, r(B, n_new, H, D), r(B, n_new, H, D),
                                       start)
            ops.attention_decode(r(B, n_new, H, D), k_cache, v_cache, start)
            start += n_new


def llama_ops():
    """RMSNorm, SwiGLU, rotate-half RoPE, grouped-query heads and a sliding window (attention
    forward, backward and decode in FP32)"""
    for rows, cols in ((1, 1), (3, 33), (9, 1024), (2, 1025)):
        x, w, dy = r(rows, cols), r(cols), r(rows, cols)
        _, rstd = ops.rmsnorm_forward(x, w, 1e-5)
        ops.rmsnorm_backward(dy, x, w, rstd)
        g, u = r(rows, cols), r(rows, cols)
        ops.swiglu_forward(g, u)
        ops.swiglu_backward(dy, g, u)
    x, pos = r(2, 5, 3, 10), cp.arange(5, dtype=np.int64)
    inv_freq = cp.asarray(ops.rope_inv_freq(10, 10000.0))
    ops.rope_freq_backward(ops.rope_freq_forward(x, pos, inv_freq), pos, inv_freq)
    for B, T, H, Hkv, D, window in ((1, 65, 4, 2, 16, 0), (2, 33, 3, 1, 80, 7)):
        q, dy, k, v = r(B, T, H, D), r(B, T, H, D), r(B, T, Hkv, D), r(B, T, Hkv, D)
        o, lse = ops.attention_forward(q, k, v, window=window)
        ops.attention_backward(dy, q, k, v, o, lse, window=window)
        k_cache, v_cache = r(B, T + 3, Hkv, D), r(B, T + 3, Hkv, D)
        ops.attention_decode(r(B, 3, H, D), k_cache, v_cache, T, window=window)


def padded_attention():
    """Tq != Tk and padded sequences (cross-attention): forward and backward with per-sequence
    lengths (0, partial, full) and without, causal with a window and not, a group of query
    heads, head dims in each class and an unaligned view; Tq = 1 (a decoding step against an
    encoder's keys)."""
    for B, Tq, Tk, H, Hkv, D, causal, window in ((3, 65, 17, 2, 1, 32, 0, 0),
                                                 (2, 9, 70, 4, 2, 80, 1, 5),
                                                 (2, 1, 33, 2, 2, 16, 0, 0),
                                                 (1, 20, 20, 1, 1, 128, 1, 0)):
        q, dy, k, v = r(B, Tq, H, D), r(B, Tq, H, D), r(B, Tk, Hkv, D), r(B, Tk, Hkv, D)
        q_lens = cp.asarray(np.arange(B, dtype=np.int64) * Tq // max(B - 1, 1))
        k_lens = cp.asarray(Tk - np.arange(B, dtype=np.int64) * Tk // max(B - 1, 1))
        for lens in ((q_lens, k_lens), (None, None)):
            qp, kp = (ffi.NULL if n is None else p(n) for n in lens)
            o, lse, dq, dk, dv = r(B, Tq, H, D), r(B, H, Tq), r(B, Tq, H, D), r(B, Tk, Hkv, D), \
                r(B, Tk, Hkv, D)
            check(lib.pytfm_attention_padded_forward_cuda(p(o), p(lse), p(q), p(k), p(v), qp,
                                                          kp, B, Tq, Tk, H, Hkv, D, 0.25, causal,
                                                          window, stream()))
            check(lib.pytfm_attention_padded_backward_cuda(p(dq), p(dk), p(dv), p(dy), p(q),
                                                           p(k), p(v), p(o), p(lse), qp, kp, B,
                                                           Tq, Tk, H, Hkv, D, 0.25, causal,
                                                           window, stream()))
    q, dy, k, v = (unaligned(1, n, 2, 16) for n in (7, 7, 12, 12))  # the scalar loads
    o, lse, dq, dk, dv = r(1, 7, 2, 16), r(1, 2, 7), r(1, 7, 2, 16), r(1, 12, 2, 16), \
        r(1, 12, 2, 16)
    lens = cp.asarray(np.array([5], np.int64)), cp.asarray(np.array([9], np.int64))
    check(lib.pytfm_attention_padded_forward_cuda(p(o), p(lse), p(q), p(k), p(v), p(lens[0]),
                                                  p(lens[1]), 1, 7, 12, 2, 2, 16, 0.25, 1, 0,
                                                  stream()))
    check(lib.pytfm_attention_padded_backward_cuda(p(dq), p(dk), p(dv), p(dy), p(q), p(k), p(v),
                                                   p(o), p(lse), p(lens[0]), p(lens[1]), 1, 7,
                                                   12, 2, 2, 16, 0.25, 1, 0, stream()))


# the tensor cores' precisions (pytfm_precision), FP32 through the _ex functions too (their
# route to the FP32 kernels); a product's operand layouts (trans_a, trans_b)
PRECISIONS = ("fp32", "bf16", "tf32")
TRANSPOSES = ((0, 0), (0, 1), (1, 0), (1, 1))
# the head dims of cuda/attention_tc.cu's kernels (others stay on the FP32 ones)
TC_HEAD_DIMS = (16, 32, 64, 128)
# a BF16 product large enough that pytfm_sgemm_ex_cuda rounds its operands into BF16 copies
# first (cuda/sgemm_tc.cu's bf16_convert_first), rather than slice by slice in the block
CONVERT_FIRST = (2048, 2048, 512)


def tensor_cores():
    """The _ex functions in each precision: the linear layer's (bias and none, one row, ragged
    tiles), pytfm_sgemm_ex_cuda in each transpose (β = 0 and 1, aligned and offset views, the
    BF16 route through BF16 copies), pytfm_gemm_bf16_cuda (views 0, 1 and 2 halves off a
    16-byte boundary: the 16-, 2- and 4-byte copies), and attention forward and backward on the
    tensor cores at each head dim of their kernels, causal and not, T one past a tile, grouped
    heads and a window (the dK/dV pass's grouped instance)"""
    for precision in PRECISIONS:
        code = lib.PYTFM_PRECISION_FP32 if precision == "fp32" else (
            lib.PYTFM_PRECISION_BF16 if precision == "bf16" else lib.PYTFM_PRECISION_TF32)
        for rows, inn, out, bias in ((1, 1, 1, True), (130, 20, 9, True), (3, 17, 129, False)):
            x, w, dy = r(rows, inn), r(out, inn), r(rows, out)
            b = r(out) if bias else None
            if precision == "fp32":  # ops takes fp32 to the FP32 twins: the _ex ones directly
                y, h, dx, dw, db = r(rows, out), r(rows, out), r(rows, inn), r(out, inn), r(out)
                pb = p(b) if bias else ffi.NULL
                check(lib.pytfm_linear_forward_ex_cuda(p(y), p(x), p(w), pb, rows, inn, out,
                                                       code, stream()))
                check(lib.pytfm_linear_gelu_forward_ex_cuda(p(y), p(h), p(x), p(w), pb, rows,
                                                            inn, out, code, stream()))
                check(lib.pytfm_linear_backward_ex_cuda(p(dx), p(dw), p(db) if bias else
                                                        ffi.NULL, p(dy), p(x), p(w), rows, inn,
                                                        out, code, stream()))
                continue
            ops.linear_forward(x, w, b, precision=precision)
            ops.linear_gelu_forward(x, w, b, precision=precision)
            ops.linear_backward(dy, x, w, has_bias=bias, precision=precision)
        for trans_a, trans_b in TRANSPOSES:
            for m, n, k, beta, view in ((129, 130, 17, 0.0, False), (7, 9, 1, 1.0, False),
                                        (65, 72, 28, 1.0, True), (5, 6, 0, 1.0, False)):
                sgemm("pytfm_sgemm_ex_cuda", m, n, k, trans_a, trans_b, beta, code, view=view)
        if precision == "bf16":
            sgemm("pytfm_sgemm_ex_cuda", *CONVERT_FIRST, 0, 1, 0.0, code)
    for trans_a, trans_b in TRANSPOSES:
        for m, n, k, offset in ((129, 130, 40, 0), (33, 17, 9, 1), (65, 64, 40, 2)):
            a = cp.zeros(k * m + offset, np.uint16)[offset:].reshape((k, m) if trans_a else (m, k))
            b = cp.zeros(k * n + offset, np.uint16)[offset:].reshape((n, k) if trans_b else (k, n))
            a[...] = (r(*a.shape).view(np.uint32) >> 16).astype(np.uint16)
            b[...] = (r(*b.shape).view(np.uint32) >> 16).astype(np.uint16)
            ops.gemm_bf16(a, b, trans_a=bool(trans_a), trans_b=bool(trans_b))
    for precision in ("bf16", "tf32"):
        for D in TC_HEAD_DIMS:
            for B, T, H, causal in ((1, 1, 1, True), (2, 65, 2, False), (1, 130, 1, True)):
                q, k, v, dy = (r(B, T, H, D) for _ in range(4))
                o, lse = ops.attention_forward(q, k, v, causal=causal, precision=precision)
                ops.attention_backward(dy, q, k, v, o, lse, causal=causal, precision=precision)
            q, dy, k, v = r(1, 70, 4, D), r(1, 70, 4, D), r(1, 70, 2, D), r(1, 70, 2, D)
            o, lse = ops.attention_forward(q, k, v, precision=precision, window=9)
            ops.attention_backward(dy, q, k, v, o, lse, precision=precision, window=9)
        q, k, v, dy = (unaligned(1, 9, 2, 32) for _ in range(4))  # the scalar loads
        o, lse = ops.attention_forward(q, k, v, precision=precision)
        ops.attention_backward(dy, q, k, v, o, lse, precision=precision)
    for code in (lib.PYTFM_PRECISION_FP32, lib.PYTFM_PRECISION_BF16, lib.PYTFM_PRECISION_TF32):
        # the plain-attention _ex functions in FP32 (ops takes fp32 to the FP32 twins) and the
        # grouped ones at Hkv = H without a window: both routes of each launcher
        B, T, H, D = 1, 20, 2, 16
        q, k, v, dy = (r(B, T, H, D) for _ in range(4))
        o, lse, dq, dk, dv = r(B, T, H, D), r(B, H, T), r(B, T, H, D), r(B, T, H, D), r(B, T, H, D)
        check(lib.pytfm_attention_forward_ex_cuda(p(o), p(lse), p(q), p(k), p(v), B, T, H, D,
                                                  0.25, 1, code, stream()))
        check(lib.pytfm_attention_backward_ex_cuda(p(dq), p(dk), p(dv), p(dy), p(q), p(k),
                                                   p(v), p(o), p(lse), B, T, H, D, 0.25, 1, code,
                                                   stream()))
        check(lib.pytfm_attention_gqa_forward_ex_cuda(p(o), p(lse), p(q), p(k), p(v), B, T, H, H,
                                                      D, 0.25, 1, 0, code, stream()))
        check(lib.pytfm_attention_gqa_backward_ex_cuda(p(dq), p(dk), p(dv), p(dy), p(q), p(k),
                                                       p(v), p(o), p(lse), B, T, H, H, D, 0.25, 1,
                                                       0, code, stream()))


def gpt_train_step():
    """One training step of a tiny GPT on the GPU, as examples/train_tiny.py takes it."""
    from pytfm.nn import GPT, GPTConfig
    from pytfm.optim import AdamW, clip_grad_norm

    cfg = GPTConfig(d_model=32, n_layer=2, n_head=2, max_seq=17)
    model = GPT(cfg, device="cuda")
    opt = AdamW(model.params, model.grads, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    x = cp.asarray(rng.integers(0, cfg.vocab, size=(2, 17)), dtype=np.int64)
    y = cp.asarray(rng.integers(0, cfg.vocab, size=(2, 17)), dtype=np.int64)
    model.zero_grad()
    _, loss = model.forward(x, y)
    model.backward()
    clip_grad_norm(model.grads, 1.0)
    opt.step()
    loss = float(loss)
    assert math.isfinite(loss), loss
    print(f"  loss {loss:.4f}")
    return model


def gpt_generate():
    """Greedy generation through the KV cache (cache_append and decode) of a tiny GPU GPT."""
    from pytfm.generate import generate
    from pytfm.nn import GPT, GPTConfig

    model = GPT(GPTConfig(d_model=32, n_layer=2, n_head=2, max_seq=17), device="cuda")
    out = generate(model, np.array([[1, 2, 3]], dtype=np.int64), 5, temperature=0)
    print(f"  tokens {cp.asnumpy(cp.asarray(out)).tolist()}")


def gpt_train_step_graph():
    """pytfm.train_step.TrainStep: record, replay from the workspace, capture, replay the graph."""
    from pytfm.nn import GPT, GPTConfig
    from pytfm.optim import AdamW
    from pytfm.train_step import TrainStep

    cfg = GPTConfig(d_model=32, n_layer=2, n_head=2, max_seq=17, pos="sinusoidal")
    model = GPT(cfg, device="cuda")
    step = TrainStep(model, AdamW(model.params, model.grads, lr=1e-3), max_norm=1.0)
    for _ in range(4):
        x = rng.integers(0, cfg.vocab, size=(2, 17))
        loss = step(x, rng.integers(0, cfg.vocab, size=(2, 17)))
    assert math.isfinite(float(loss)), loss
    print(f"  last mode {step.mode}{' (' + step.graph_error + ')' if step.graph_error else ''}")


def c_model_on_the_gpu():
    """The C model API on PYTFM_DEVICE_CUDA: a forward of two rows, a session of a prompt and
    three tokens."""
    import tempfile

    from pytfm import checkpoint
    from pytfm.nn import GPT, GPTConfig

    model = GPT(GPTConfig(d_model=32, n_layer=2, n_head=4, max_seq=17, tie_embeddings=False))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.safetensors")
        checkpoint.save(path, model)
        h = ffi.new("pytfm_model **")
        check(lib.pytfm_model_open(h, path.encode(), lib.PYTFM_DEVICE_CUDA))
    try:
        tokens = rng.integers(0, 256, size=(2, 17))
        logits = np.zeros((2, 17, 256), np.float32)
        p = lambda a: ffi.from_buffer(  # noqa: E731
            {np.float32: "float[]", np.int64: "int64_t[]"}[a.dtype.type], a)
        check(lib.pytfm_model_forward(h[0], p(logits), p(tokens), 2, 17))
        s = ffi.new("pytfm_session **")
        check(lib.pytfm_session_open(s, h[0], 0))
        last = np.zeros(256, np.float32)
        for feed in (tokens[0, :5], tokens[0, 5:6], tokens[0, 6:8]):
            check(lib.pytfm_session_feed(s[0], p(last), p(np.ascontiguousarray(feed)), feed.size))
        check(lib.pytfm_session_close(s[0]))
        assert np.isfinite(logits).all() and np.isfinite(last).all()
    finally:
        check(lib.pytfm_model_close(h[0]))


KERNELS = [core_ops, label_smoothing, fused_ops, attention, padded_attention, llama_ops,
           tensor_cores]
SECTIONS = KERNELS + [gpt_train_step, gpt_generate, gpt_train_step_graph, c_model_on_the_gpu]


def main():
    failed = []
    for section in SECTIONS:
        print(f"{section.__name__} ...", flush=True)
        try:
            section()
            check(lib.pytfm_cuda_stream_synchronize(ffi.NULL))
            cp.cuda.Device().synchronize()
            print(f"{section.__name__}: ok", flush=True)
        except Exception:  # report it and go on: each section is checked on its own
            failed.append(section.__name__)
            print(f"{section.__name__}: FAILED\n{traceback.format_exc()}", flush=True)
    if failed:
        print(f"cuda_small_run: {len(failed)} of {len(SECTIONS)} sections failed: "
              f"{', '.join(failed)}")
        return 1
    print(f"cuda_small_run: every kernel ran ({len(SECTIONS)} sections)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
