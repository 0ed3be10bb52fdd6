"""Every op, forward and backward: the C kernels (through pytfm.ops) vs pytfm.reference.

Shapes are drawn to break kernels (1, odd, primes up to 67); values at several scales. The
tolerance is atol + rtol*|ref|, with atol sized by what float32 can promise for that op.
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from helpers import assert_close, awkward, f32, scales, seeds, small
from pytfm import ops
from pytfm import reference as ref

EPS32 = float(np.finfo(np.float32).eps)


@given(rows=awkward, inn=awkward, out=awkward, bias=st.booleans(), batch=small, seed=seeds)
def test_linear(rows, inn, out, bias, batch, seed):
    rng = np.random.default_rng(seed)
    x, w = f32(rng, (batch, rows, inn)), f32(rng, (out, inn))
    b = f32(rng, (out,)) if bias else None
    y = ops.linear_forward(x, w, b)
    # |fl(Σ x w) − Σ x w| <= in·eps·Σ|x||w|: scale atol by that bound
    bound = ref.linear_forward(abs(x), abs(w), None if b is None else abs(b))
    assert_close("linear.forward", y, ref.linear_forward(x, w, b), atol=2 * inn * EPS32 * bound)

    dy = f32(rng, y.shape)
    dx, dw, db = ops.linear_backward(dy, x, w, has_bias=bias)
    rdx, rdw, rdb = ref.linear_backward(dy, x, w)
    adx, adw, adb = ref.linear_backward(abs(dy), abs(x), abs(w))
    assert_close("linear.backward.dx", dx, rdx, atol=2 * out * EPS32 * adx)
    assert_close("linear.backward.dw", dw, rdw, atol=2 * rows * batch * EPS32 * adw)
    if bias:
        assert_close("linear.backward.db", db, rdb, atol=2 * rows * batch * EPS32 * adb)
    else:
        assert db is None


@given(rows=awkward, cols=awkward, scale=scales, offset=st.sampled_from([0.0, -50.0, 1e4]),
       seed=seeds)
def test_softmax(rows, cols, scale, offset, seed):
    rng = np.random.default_rng(seed)
    x = f32(rng, (rows, cols), scale, offset)
    y = ops.softmax_forward(x)
    # inputs of size |x| are known to half an ulp, which moves exp() by that much, relatively
    rtol = 1e-5 + 2 * EPS32 * float(abs(x - x.max(axis=-1, keepdims=True)).max())
    assert_close("softmax.forward", y, ref.softmax_forward(x), atol=1e-7, rtol=rtol)

    dy = f32(rng, x.shape)
    dx = ops.softmax_backward(dy, y)
    assert_close("softmax.backward", dx, ref.softmax_backward(dy, y),
                 atol=4 * cols * EPS32 * float(abs(dy).max()), rtol=1e-5)


@given(rows=awkward, cols=awkward, scale=scales, offset=st.sampled_from([0.0, 3.0, -20.0]),
       eps=st.sampled_from([1e-5, 1e-3, 0.0]), seed=seeds)
def test_layernorm(rows, cols, scale, offset, eps, seed):
    rng = np.random.default_rng(seed)
    x = f32(rng, (rows, cols), scale, offset * scale)
    if eps == 0.0 and cols == 1:
        eps = 1e-5  # a single column has zero variance: rstd would be inf
    w, b = f32(rng, (cols,)), f32(rng, (cols,))
    y, mean, rstd = ops.layernorm_forward(x, w, b, eps)
    ry, rmean, rrstd = ref.layernorm_forward(x, w, b, eps)
    assert_close("layernorm.forward.mean", mean, rmean, atol=1e-6 * scale, rtol=1e-6)
    assert_close("layernorm.forward.rstd", rstd, rrstd, rtol=1e-5)
    assert_close("layernorm.forward.y", y, ry, atol=1e-5 * (abs(w) * 4 + abs(b)), rtol=1e-5)

    dy = f32(rng, x.shape)
    dx, dw, db = ops.layernorm_backward(dy, x, w, mean, rstd)
    rdx, rdw, rdb = ref.layernorm_backward(dy, x, w, mean, rstd)
    g = float(abs(dy * w).max() * rstd.max())
    assert_close("layernorm.backward.dx", dx, rdx, atol=4 * cols * EPS32 * g, rtol=1e-4)
    assert_close("layernorm.backward.dw", dw, rdw, atol=1e-5 * rows * float(abs(dy).max()))
    assert_close("layernorm.backward.db", db, rdb, atol=1e-5 * rows * float(abs(dy).max()))


@given(B=small, T=awkward, H=small, half=st.sampled_from([1, 2, 3, 4, 8, 16, 32]),
       start=st.sampled_from([0, 1, 1000, 123456]), batched=st.booleans(),
       base=st.sampled_from([10000.0, 500.0, 1e6]), seed=seeds)
def test_rope(B, T, H, half, start, batched, base, seed):
    rng = np.random.default_rng(seed)
    x = f32(rng, (B, T, H, 2 * half))
    pos = start + np.arange(T, dtype=np.int64)
    if batched:
        pos = pos + rng.integers(0, 100, size=(B, 1))
    y = ops.rope_forward(x, pos, base)
    assert_close("rope.forward", y, ref.rope_forward(x, pos, base),
                 atol=4 * EPS32 * float(abs(x).max()))
    dy = f32(rng, x.shape)
    dx = ops.rope_backward(dy, pos, base)
    assert_close("rope.backward", dx, ref.rope_backward(dy, pos, base),
                 atol=4 * EPS32 * float(abs(dy).max()))


@given(shape=st.lists(awkward, min_size=1, max_size=3), scale=scales, seed=seeds)
def test_gelu(shape, scale, seed):
    rng = np.random.default_rng(seed)
    x = f32(rng, shape, scale)
    atol = 4 * EPS32 * (1.0 + abs(x))
    assert_close("gelu.forward", ops.gelu_forward(x), ref.gelu_forward(x), atol=atol)
    dy = f32(rng, shape)
    assert_close("gelu.backward", ops.gelu_backward(dy, x), ref.gelu_backward(dy, x),
                 atol=8 * EPS32 * (1.0 + abs(x)) * abs(dy))


@given(rows=awkward, vocab=awkward, dim=awkward, batch=small, seed=seeds)
def test_embedding(rows, vocab, dim, batch, seed):
    rng = np.random.default_rng(seed)
    table = f32(rng, (vocab, dim))
    ids = rng.integers(0, vocab, size=(batch, rows))  # few classes, many rows: repeats are common
    y = ops.embedding_forward(ids, table)
    assert_close("embedding.forward", y, ref.embedding_forward(ids, table), rtol=0.0)
    dy = f32(rng, y.shape)
    dtable = ops.embedding_backward(dy, ids, vocab)
    assert_close("embedding.backward", dtable, ref.embedding_backward(dy, ids, vocab),
                 atol=2 * batch * rows * EPS32 * float(abs(dy).max()))


@given(rows=awkward, vocab=awkward, scale=scales, offset=st.sampled_from([0.0, -30.0, 1e4]),
       ignore_index=st.sampled_from([-1, -100, 0]), ignored=st.floats(0.0, 1.0),
       dloss=st.sampled_from([1.0, 0.5, -3.0]), seed=seeds)
def test_cross_entropy(rows, vocab, scale, offset, ignore_index, ignored, dloss, seed):
    rng = np.random.default_rng(seed)
    logits = f32(rng, (rows, vocab), scale, offset)
    targets = rng.integers(0, vocab, size=rows)
    targets[rng.random(rows) < ignored] = ignore_index
    loss, lse = ops.cross_entropy_forward(logits, targets, ignore_index)
    rloss, rlse = ref.cross_entropy_forward(logits, targets, ignore_index)
    # float32 inputs of size |logits| are known to half an ulp; lse is stored in float32
    mag = EPS32 * float(abs(logits).max())
    assert_close("cross_entropy.forward.loss", loss, rloss, atol=1e-6 + mag, rtol=1e-5)
    assert_close("cross_entropy.forward.lse", lse, rlse, atol=1e-6 + mag, rtol=1e-6)
    dlogits = ops.cross_entropy_backward(logits, targets, lse, ignore_index, dloss)
    rd = ref.cross_entropy_backward(logits, targets, ignore_index, dloss)
    kept = max(int((targets != ignore_index).sum()), 1)
    # softmax is recomputed as exp(logits - lse) with lse rounded to float32: an absolute
    # error of about eps32·|lse| in each probability
    assert_close("cross_entropy.backward", dlogits, rd,
                 atol=(1e-6 + 2 * mag) * abs(dloss) / kept, rtol=1e-5)


@given(count=awkward, step=st.sampled_from([1, 2, 10, 1000]), lr=st.sampled_from([1e-3, 0.1]),
       beta1=st.sampled_from([0.9, 0.0]), beta2=st.sampled_from([0.999, 0.95]),
       weight_decay=st.sampled_from([0.0, 0.1]), seed=seeds)
def test_adamw(count, step, lr, beta1, beta2, weight_decay, seed):
    rng = np.random.default_rng(seed)
    param, grad = f32(rng, count), f32(rng, count)
    m, v = f32(rng, count, 0.1), abs(f32(rng, count, 0.1))
    old = [a.astype(np.float64) for a in (param, m, v)]
    want = ref.adamw_step(param, grad, m, v, step, lr, beta1, beta2, 1e-8, weight_decay)
    ops.adamw_step(param, grad, m, v, step, lr, beta1, beta2, 1e-8, weight_decay)
    for name, got, before, r in zip(("param", "m", "v"), (param, m, v), old, want):
        # float32 rounding of each term: the old value and the change made to it
        scale = abs(before) + abs(r - before) + abs(grad) * (1 - beta1) * (name == "m")
        assert_close(f"adamw.{name}", got, r, atol=8 * EPS32 * scale + 1e-12)
