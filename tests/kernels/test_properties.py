"""Mathematical properties of the C kernels, checked without the reference.

Each property is one a wrong kernel breaks: a missing max-subtraction, a forgotten rstd, a
transposed weight, a wrong rotation pairing, a gradient written where it must accumulate.
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from helpers import EPS32, assert_close, awkward, f32, seeds, small
from pytfm import ops


def grid(rng, shape, scale=4.0):
    """float32 values on a 1/256 grid: adding an integer constant to them is exact."""
    return (np.round(rng.standard_normal(shape) * scale * 256) / 256).astype(np.float32)


# ---- softmax --------------------------------------------------------------------------------


@given(rows=awkward, cols=awkward, shift=st.integers(-10_000, 10_000), seed=seeds)
def test_softmax_rows_sum_to_one_and_ignore_a_row_constant(rows, cols, shift, seed):
    rng = np.random.default_rng(seed)
    x = grid(rng, (rows, cols))
    y = ops.softmax_forward(x)
    assert_close("property.softmax.row_sum", y.sum(axis=-1, dtype=np.float64), np.ones(rows),
                 atol=2 * cols * EPS32)
    c = (shift * rng.integers(0, 2, size=(rows, 1))).astype(np.float32)  # per-row constant
    assert_close("property.softmax.shift", ops.softmax_forward(x + c), y, atol=1e-7, rtol=1e-6)


# ---- layernorm ------------------------------------------------------------------------------


@given(rows=awkward, cols=st.integers(2, 67), shift=st.integers(-2000, 2000),
       log2_scale=st.integers(-4, 8), seed=seeds)
def test_layernorm_ignores_row_shift_and_positive_scale(rows, cols, shift, log2_scale, seed):
    """Shifts up to 2000 on rows whose spread may be 1/4: |μ| up to 10⁴ σ, where a float sum
    of x would round away the digits x − μ needs (the kernels sum x − x[0] instead)."""
    rng = np.random.default_rng(seed)
    x = grid(rng, (rows, cols))
    x[:, 0] += 1.0  # no constant rows
    w, b = f32(rng, cols), f32(rng, cols)
    # per-row positive scales (powers of two) and shifts, so the transformed input is exact
    a = np.float32(2.0) ** rng.integers(min(log2_scale, 0), max(log2_scale, 0) + 1, (rows, 1))
    c = (shift * rng.integers(0, 2, (rows, 1))).astype(np.float32)
    x2 = (a * x + c).astype(np.float32)
    np.testing.assert_array_equal((x2 - c) / a, x)  # the transform itself was exact
    y, _, _ = ops.layernorm_forward(x, w, b, eps=0.0)
    y2, _, _ = ops.layernorm_forward(x2, w, b, eps=0.0)
    assert_close("property.layernorm.invariance", y2, y, atol=1e-5 * (abs(w) * 8 + abs(b)))


# ---- linear ---------------------------------------------------------------------------------


@given(n=awkward, inn=awkward, out=awkward, seed=seeds)
def test_linear_backward_is_the_adjoint_of_forward(n, inn, out, seed):
    rng = np.random.default_rng(seed)
    x, w, G = f32(rng, (n, inn)), f32(rng, (out, inn)), f32(rng, (n, out))
    y = ops.linear_forward(x, w)
    dx, dw, _ = ops.linear_backward(G, x, w, has_bias=False)
    f64 = np.float64
    lhs = np.vdot(y.astype(f64), G)  # <x·Wᵀ, G>
    size = np.vdot(abs(x.astype(f64)) @ abs(w.astype(f64)).T, abs(G))
    tol = 4 * max(inn, out, n) * EPS32 * size
    assert_close("property.linear.adjoint_x", np.vdot(x.astype(f64), dx), lhs, atol=tol)
    assert_close("property.linear.adjoint_w", np.vdot(w.astype(f64), dw), lhs, atol=tol)


@given(n=awkward, inn=small, out=small, seed=seeds)
def test_parameter_gradients_accumulate(n, inn, out, seed):
    rng = np.random.default_rng(seed)
    x, w, dy = f32(rng, (n, inn)), f32(rng, (out, inn)), f32(rng, (n, out))
    dx1, dw1, db1 = ops.linear_backward(dy, x, w)
    dw, db = f32(rng, (out, inn)), f32(rng, out)
    dw0, db0 = dw.copy(), db.copy()
    dx2, dw2, db2 = ops.linear_backward(dy, x, w, dw=dw, db=db)
    assert dw2 is dw and db2 is db
    np.testing.assert_array_equal(dx2, dx1)  # activation gradient: written, not accumulated
    # the kernel adds row by row onto the old value: rounding grows with the number of rows
    tol = lambda old, terms: 2 * (n + 1) * EPS32 * (abs(old) + terms)  # noqa: E731
    assert_close("property.accumulate.linear_dw", dw, dw0 + dw1, atol=tol(dw0, abs(dy).T @ abs(x)))
    assert_close("property.accumulate.linear_db", db, db0 + db1, atol=tol(db0, abs(dy).sum(0)))

    x2, g = f32(rng, (n, out)), f32(rng, out)
    _, mean, rstd = ops.layernorm_forward(x2, g, g)
    _, lw1, lb1 = ops.layernorm_backward(dy, x2, g, mean, rstd)
    lw, lb = np.ones(out, np.float32), np.full(out, 2.0, np.float32)
    ops.layernorm_backward(dy, x2, g, mean, rstd, dw=lw, db=lb)
    xhat = (x2 - mean[:, None]) * rstd[:, None]
    assert_close("property.accumulate.layernorm", np.r_[lw, lb], np.r_[1 + lw1, 2 + lb1],
                 atol=np.r_[tol(1.0, abs(dy * xhat).sum(0)), tol(2.0, abs(dy).sum(0))])


# ---- rope -----------------------------------------------------------------------------------


@given(T=awkward, H=small, half=st.sampled_from([1, 2, 5, 8, 32]),
       start=st.integers(0, 10**6), seed=seeds)
def test_rope_is_a_rotation(T, H, half, start, seed):
    rng = np.random.default_rng(seed)
    x = f32(rng, (2, T, H, 2 * half))
    pos = np.arange(start, start + T, dtype=np.int64)
    y = ops.rope_forward(x, pos)
    norm = lambda a: np.linalg.norm(a.astype(np.float64), axis=-1)  # noqa: E731
    assert_close("property.rope.norm", norm(y), norm(x), atol=1e-6, rtol=4 * EPS32)
    assert_close("property.rope.inverse", ops.rope_backward(y, pos), x,
                 atol=4 * EPS32 * abs(x).max())


@given(m=st.integers(0, 4096), n=st.integers(0, 4096), c=st.integers(-4096, 10**5),
       half=st.sampled_from([1, 4, 16, 32]), seed=seeds)
def test_rope_dot_product_depends_only_on_relative_position(m, n, c, half, seed):
    rng = np.random.default_rng(seed)
    q, k = f32(rng, (1, 1, 3, 2 * half)), f32(rng, (1, 1, 3, 2 * half))
    c = max(c, -min(m, n))  # keep positions >= 0, as in a model (negative ones work too)

    def score(pm, pn):
        rq = ops.rope_forward(q, np.array([pm], np.int64)).astype(np.float64)
        rk = ops.rope_forward(k, np.array([pn], np.int64)).astype(np.float64)
        return (rq * rk).sum(axis=-1)  # one score per head

    size = (abs(q.astype(np.float64)) * abs(k)).sum(axis=-1)
    assert_close("property.rope.relative", score(m + c, n + c), score(m, n), atol=8 * EPS32 * size)


# ---- cross-entropy, embedding, adamw --------------------------------------------------------


@given(rows=awkward, vocab=awkward, scale=st.sampled_from([0.1, 1.0, 10.0]), seed=seeds)
def test_cross_entropy_is_nonnegative_and_dlogits_rows_sum_to_zero(rows, vocab, scale, seed):
    rng = np.random.default_rng(seed)
    logits = f32(rng, (rows, vocab), scale)
    targets = rng.integers(-1, vocab, size=rows)  # -1: ignored
    loss, lse = ops.cross_entropy_forward(logits, targets)
    assert loss >= 0.0
    d = ops.cross_entropy_backward(logits, targets, lse)
    assert_close("property.cross_entropy.row_sum", d.sum(axis=-1, dtype=np.float64),
                 np.zeros(rows), atol=4 * vocab * EPS32)
    assert np.all(d[targets == -1] == 0.0)


@given(n=awkward, vocab=small, dim=awkward, seed=seeds)
def test_embedding_backward_sums_repeated_ids(n, vocab, dim, seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(0, vocab))
    ids = np.full(n, k, dtype=np.int64)
    dy = f32(rng, (n, dim))
    dtable = np.ones((vocab, dim), np.float32)
    ops.embedding_backward(dy, ids, vocab, dtable=dtable)
    want = np.ones((vocab, dim))
    want[k] += dy.sum(axis=0, dtype=np.float64)
    assert_close("property.embedding.repeated", dtable, want, atol=n * EPS32 * (1 + abs(dy).sum(0)))


@given(n=awkward, lr=st.floats(1e-4, 1.0), weight_decay=st.floats(0.0, 0.5),
       eps=st.sampled_from([1e-8, 1e-3]), seed=seeds)
def test_first_adamw_step_equals_its_closed_form(n, lr, weight_decay, eps, seed):
    # with m = v = 0 at step 1: m̂ = g and v̂ = g², so p ← p(1 − lr·wd) − lr·g / (|g| + eps)
    rng = np.random.default_rng(seed)
    p, g = f32(rng, n), f32(rng, n)
    p64, g64 = p.astype(np.float64), g.astype(np.float64)
    want = p64 * (1 - lr * weight_decay) - lr * g64 / (abs(g64) + eps)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    ops.adamw_step(p, g, m, v, step=1, lr=lr, eps=eps, weight_decay=weight_decay)
    assert_close("property.adamw.closed_form", p, want, atol=4 * EPS32 * (1 + abs(want)))


@given(seed=seeds)
def test_results_are_bitwise_reproducible(seed):
    rng = np.random.default_rng(seed)
    x, w, dy = f32(rng, (17, 33)), f32(rng, (9, 33)), f32(rng, (17, 9))
    ids = rng.integers(0, 4, size=17)
    first = ops.linear_backward(dy, x, w) + (ops.embedding_backward(x, ids, 4),)
    again = ops.linear_backward(dy, x, w) + (ops.embedding_backward(x, ids, 4),)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
