"""The vectorised element-wise kernels (portable, AVX2 and AVX-512 builds of
csrc/kernels/fast_impl.h) and the tiled attention against the plain reference loops
(PYTFM_ISA_PLAIN), on sizes around their vector and lane widths (16), tiles (64) and task size
(16384 elements). The AVX2 and AVX-512 builds must agree bit for bit: they run the same operations
in the same order (sums over 16 fixed partial results, the same fused multiply-adds). """

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import assert_close, assert_same_bits_at_any_thread_count, max_isa, seeds
from pytfm import ops

FAST = ["portable", "avx2", "avx512"]
EPS32 = float(np.finfo(np.float32).eps)
FLT_MIN = float(np.finfo(np.float32).tiny)
cols_ = st.one_of(st.integers(1, 40), st.sampled_from([47, 48, 49, 255, 256, 257, 1000, 16385]))
rows_ = st.sampled_from([1, 2, 3, 7])


def run_all(isa, fn):
    with max_isa(isa):
        return fn()


def has_isa(name):
    import pytfm

    pytfm.set_max_isa(name)
    try:
        return pytfm.get_isa() == name
    finally:
        pytfm.set_max_isa("auto")


def fma_twin(isa):
    """The other build with FMA, whose results must be the same bits (or None)."""
    twin = {"avx2": "avx512", "avx512": "avx2"}.get(isa)
    return twin if twin and has_isa(twin) else None


def compare(name, isa, fn, tol):
    """fn() under `isa` vs under "plain": output i within tol[i] = (rtol, atol) of the plain one
    (atol may be an array; one pair stands for every output). `tol` may also be a function of
    (got, plain) that returns that list, for outputs whose bound inherits the difference already
    seen in an earlier output (each checked against its own bound). And the AVX2 and AVX-512
    builds (both fuse a·b + c) give the same bits."""
    got = run_all(isa, fn)
    plain = run_all("plain", fn)
    twin = fma_twin(isa)
    same = run_all(twin, fn) if twin else got
    tols = tol(got, plain) if callable(tol) else tol
    tols = tols if isinstance(tols, list) else [tols] * len(got)
    for i, (g, p, q, t) in enumerate(zip(got, plain, same, tols, strict=True)):
        assert_close(f"fast.{name}[{i}]", g, p, atol=t[1], rtol=t[0])
        np.testing.assert_array_equal(g, q, err_msg=f"{name}[{i}]: {isa} and {twin} differ")


def sum_roundings(cols):
    """Roundings on the way of one term into a float sum of `cols` terms as fast_impl.h adds
    them (vecmath.h): a lane adds up to cols/16 terms, then a 4-level tree and the final add;
    a tail term up to 15 adds and the final one."""
    return cols / 16 + 16


@pytest.mark.parametrize("isa", FAST)
@given(rows=rows_, cols=cols_, seed=seeds, scale=st.sampled_from([0.01, 1.0, 20.0]))
def test_softmax(isa, rows, cols, seed, scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    y = ops.softmax_forward(x)

    # y = e^(x − max) / Σ: both sides exponentiate the same float x − max (the fast e^ within
    # 2 ulp, expf within 1); the fast sum of positive terms rounds k times (the plain one sums
    # in double); 1/Σ and the product round once each side: relative to each y, however small
    # (but an e^ under FLT_MIN, which expf keeps as a subnormal, the fast one flushes to 0);
    # twice the bound, as the others in this file
    y_rtol = 2 * EPS32 * (sum_roundings(cols) / 2 + 5)
    # dx = y·(dy − Σ dy·y): the sum (float, in other order) carries cols·eps·Σ|dy·y|
    dot_err = (cols * EPS32 * abs(dy * y).sum(axis=1, keepdims=True) + EPS32 * abs(dy)) * y
    compare(
        "softmax",
        isa,
        lambda: [ops.softmax_forward(x), ops.softmax_backward(dy, y)],
        [(y_rtol, 2 * FLT_MIN), (1e-5, 4 * dot_err)],
    )


def layernorm_tolerances(x, w, dy, eps, got, plain):
    """(rtol, atol) of each LayerNorm output, fast (float sums) vs plain (double sums), from the
    float32 error of the fast computation (EPS32 = 2u covers a rounding on each side). mean and
    rstd get a priori bounds; y, dx, dw inherit, to first order, the mean and rstd differences
    actually seen (each held to its own bound), plus the roundings of their own steps."""
    rows, cols = x.shape
    k = sum_roundings(cols)
    X, W, G = (a.astype(np.float64) for a in (x, w, dy))
    mu = X.mean(axis=1, keepdims=True)
    var = ((X - mu) ** 2).mean(axis=1, keepdims=True)
    rs = 1 / np.sqrt(var + eps)
    mean_f, rstd_f = (a.astype(np.float64)[:, None] for a in got[1:3])
    mean_p, rstd_p = (a.astype(np.float64)[:, None] for a in plain[1:3])
    # mean: x0 + d (x0 the row's first value), d = Σ(x − x0)/cols a float sum: off by tol_d,
    # then rounded once more when stored
    X0 = X[:, :1]
    tol_d = EPS32 * k * abs(X - X0).mean(axis=1, keepdims=True)
    tol_mean = tol_d[:, 0] + EPS32 * abs(mu[:, 0])
    # rstd: Σ((x − x0) − d)² = Σ(x − μ)² + cols·dd², its float sum off by (k + 5) roundings
    # (two subtracts, square, sum, divide, + eps); sqrt halves that; sqrt and 1/· round once more
    dd = tol_d + abs(mean_f - mu)
    tol_rstd = rs * (0.5 * (dd**2 + (k + 5) * EPS32 * var) / (var + eps) + 2 * EPS32)
    # y = x̂·w + b, x̂ = ((x − x0) − d)·rstd: the fast x̂ is off by rstd·(d's error and the two
    # subtractions' roundings) + (x − μ)·(rstd_f − rstd) + its product's rounding (the plain one
    # casts once); ·w and + b round once each side
    xhat = (X - mu) * rs
    dxhat = rstd_f * (tol_d + EPS32 * (abs(X - X0) + abs(X - mu)))
    dxhat += abs(X - mu) * abs(rstd_f - rs) + 2 * EPS32 * abs(xhat)
    tol_y = abs(W) * dxhat + EPS32 * (abs(xhat * W) + abs(plain[0]))
    # backward: each side rebuilds x̂ from its own saved mean and rstd, in float
    xb = (X - mean_p) * rstd_p
    dxb = rstd_f * abs(mean_f - mean_p) + abs(X - mean_p) * abs(rstd_f - rstd_p)
    dxb += 2 * EPS32 * abs(xb)
    # dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·w (the same floats on both sides); the
    # two means are float sums (k roundings) and mean(g·x̂) inherits x̂'s difference
    g = (dy * w).astype(np.float64)
    gm, gxm = g.mean(axis=1, keepdims=True), (g * xb).mean(axis=1, keepdims=True)
    dgm = EPS32 * (k * abs(g).mean(axis=1, keepdims=True) + abs(gm))
    dgxm = (abs(g) * dxb).mean(axis=1, keepdims=True)
    dgxm += EPS32 * ((k + 1) * abs(g * xb).mean(axis=1, keepdims=True) + abs(gxm))
    inner = abs(g - gm) + abs(xb * gxm)
    tol_dx = abs(rstd_f - rstd_p) * inner + rstd_p * (dgm + dxb * abs(gxm) + abs(xb) * dgxm)
    tol_dx += 3 * EPS32 * rstd_p * (abs(g) + abs(gm) + abs(xb * gxm))
    # dw = Σ_rows dy·x̂, db = Σ_rows dy: float sums over rows on both sides (the fast one in
    # 16 chunks, the plain one in row order), at most rows + 1 roundings each (the product)
    tol_dw = (abs(G) * dxb).sum(axis=0) + (rows + 1) * EPS32 * abs(G * xb).sum(axis=0)
    tol_db = rows * EPS32 * abs(G).sum(axis=0)
    # twice each bound: for the second-order terms left out
    return [(0.0, 2 * t) for t in (tol_y, tol_mean, tol_rstd[:, 0], tol_dx, tol_dw, tol_db)]


@pytest.mark.parametrize("isa", FAST)
@given(rows=st.sampled_from([1, 2, 3, 7, 17, 40]), cols=cols_, seed=seeds,
       offset=st.sampled_from([0.0, 3.0, -100.0]))
def test_layernorm(isa, rows, cols, seed, offset):
    """Rows past 16 make the fast backward sum dw, db in 16 chunks of rows."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) + offset).astype(np.float32)
    w, b = (rng.standard_normal(cols).astype(np.float32) for _ in range(2))
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    eps = 1e-5

    def fn():
        y, mean, rstd = ops.layernorm_forward(x, w, b, eps)
        dx, dw, db = ops.layernorm_backward(dy, x, w, mean, rstd)
        return [y, mean, rstd, dx, dw, db]

    compare("layernorm", isa, fn, lambda got, plain: layernorm_tolerances(
        x, w, dy, np.float64(np.float32(eps)), got, plain))


@pytest.mark.parametrize("isa", FAST)
@given(n_in=cols_, out=st.sampled_from([1, 3, 4, 5, 63, 64, 65, 130]), bias=st.booleans(),
       seed=seeds)
def test_linear_one_row(isa, n_in, out, bias, seed):
    """One row: the matrix-vector product (fast_impl.h gemv) against the plain sgemm loop."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    w = rng.standard_normal((out, n_in)).astype(np.float32)
    b = rng.standard_normal(out).astype(np.float32) if bias else None
    # each side's dot product is off the exact one by at most its roundings times Σ|x·w|: the
    # plain loop n_in of them, the fast one sum_roundings(n_in) (n_in/16 per lane, the tree);
    # the bias add one more each side
    mag = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    tol = EPS32 * (n_in + sum_roundings(n_in) + 2) * mag
    compare("linear.one_row", isa, lambda: [ops.linear_forward(x, w, b)], (EPS32, tol))


@pytest.mark.parametrize("isa", FAST)
@given(count=cols_, seed=seeds, scale=st.sampled_from([0.1, 1.0, 5.0, 50.0]))
def test_gelu(isa, count, seed, scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(count) * scale).astype(np.float32)
    dy = rng.standard_normal(count).astype(np.float32)
    compare("gelu", isa, lambda: [ops.gelu_forward(x), ops.gelu_backward(dy, x)], (2e-6, 1e-7))


@pytest.mark.parametrize("isa", FAST)
@given(rows=rows_, cols=cols_, seed=seeds, offset=st.sampled_from([0.0, 1e3]))
def test_cross_entropy(isa, rows, cols, seed, offset):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, cols)) * 3 + offset).astype(np.float32)
    targets = rng.integers(0, cols, rows)
    targets[0] = -1  # one ignored row
    kept = targets != -1
    scale = 1 / max(int(kept.sum()), 1)

    def fn():
        loss, lse = ops.cross_entropy_forward(logits, targets)
        return [np.float32(loss), lse, ops.cross_entropy_backward(logits, targets, lse)]

    def tolerances(got, plain):
        X = logits.astype(np.float64)
        lse, dlse = plain[1].astype(np.float64), abs(got[1].astype(np.float64) - plain[1])
        # lse = max + log Σ e^(x − max): both sides exponentiate the same float x − max, the
        # fast e^ within 2 ulp of the plain expf's; a float sum of positive terms (k roundings)
        # vs a double one; log and + max round once each side
        tol_lse = EPS32 * (sum_roundings(cols) + 3 + abs(lse - X.max(axis=1)) + abs(lse))
        # loss = mean over kept rows of lse − x_target (in double): inherits each row's lse
        # difference (the plain one uses its lse before rounding it to float)
        dl = (dlse + EPS32 * abs(lse))[kept]
        tol_loss = (dl.mean() if dl.size else 0.0) + EPS32 * abs(float(plain[0]))
        # dlogits = scale·e^(x − lse) − [j = target]·scale: the exponent moves by the lse
        # difference and by a rounding of x − lse on each side; e^ (2 ulp), ·scale and − scale
        p = np.exp(X - lse[:, None])
        tol_d = scale * p * (dlse[:, None] + EPS32 * (abs(X - lse[:, None]) + 3))
        tol_d = np.where(kept[:, None], tol_d + EPS32 * abs(plain[2]), 0.0)
        return [(0.0, 2 * tol_loss), (0.0, 2 * tol_lse), (0.0, 2 * tol_d)]

    compare("cross_entropy", isa, fn, tolerances)


@pytest.mark.parametrize("isa", FAST)
@given(count=cols_, seed=seeds, step=st.sampled_from([1, 2, 1000]))
def test_adamw(isa, count, seed, step):
    rng = np.random.default_rng(seed)
    p0, g = (rng.standard_normal(count).astype(np.float32) for _ in range(2))
    m0 = rng.standard_normal(count).astype(np.float32) * 0.1
    v0 = abs(rng.standard_normal(count).astype(np.float32)) * 0.01

    def fn():
        p, m, v = p0.copy(), m0.copy(), v0.copy()
        ops.adamw_step(p, g, m, v, step=step, lr=1e-3, weight_decay=0.1)
        return [p, m, v]

    compare("adamw", isa, fn, (1e-6, 1e-7))


# ---- attention: the tiled version on sgemm's micro-kernels vs the plain one ----------------


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@given(B=st.sampled_from([1, 2]), T=st.sampled_from([8, 9, 31, 63, 64, 65, 129, 200]),
       H=st.sampled_from([1, 3]), D=st.sampled_from([1, 5, 16, 33, 64, 80]),
       causal=st.booleans(), seed=seeds)
def test_attention(isa, B, T, H, D, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v, dy = (rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(4))

    def fn():
        o, lse = ops.attention_forward(q, k, v, causal=causal)
        return [o, lse, *ops.attention_backward(dy, q, k, v, o, lse, causal=causal)]

    got, plain = run_all(isa, fn), run_all("plain", fn)
    # both micro-kernels sum each product in the same order, with FMA: the same bits
    twin = fma_twin(isa)
    other = run_all(twin, fn) if twin else got
    bound = np.sqrt(D) * T * EPS32  # dot products of length D, sums over up to T keys
    for name, g, p, o in zip(["o", "lse", "dq", "dk", "dv"], got, plain, other, strict=True):
        assert_close(f"fast.attention.{name}", g, p, atol=4 * bound * max(1.0, abs(p).max()),
                     rtol=1e-5)
        np.testing.assert_array_equal(g, o, err_msg=f"attention {name}: avx2 and avx512 differ")


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@given(T=st.sampled_from([8, 40, 100]), prompt=st.sampled_from([0, 1, 50]), seed=seeds)
def test_attention_decode(isa, T, prompt, seed):
    """n_new >= 8 new queries at once through the cache (a prompt) takes the tiled path too."""
    rng = np.random.default_rng(seed)
    B, H, D, Tmax = 2, 3, 16, 200
    kc, vc = (rng.standard_normal((B, Tmax, H, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((B, T, H, D)).astype(np.float32)

    def fn():
        return list(ops.attention_decode(q, kc, vc, start=prompt))

    got, plain = run_all(isa, fn), run_all("plain", fn)
    for name, g, p in zip(["o", "lse"], got, plain, strict=True):
        assert_close(f"fast.attention_decode.{name}", g, p, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("isa", FAST)
@given(B=st.sampled_from([1, 2]), n_new=st.sampled_from([1, 2, 7]), H=st.sampled_from([1, 3]),
       D=st.sampled_from([1, 5, 16, 32, 33]), start=st.sampled_from([0, 1, 63, 64, 65, 150]),
       seed=seeds)
def test_attention_decode_rows(isa, B, n_new, H, D, start, seed):
    """Fewer than 8 new queries: each row alone on the row kernels (scores by gemv, the online
    softmax step, attn_pv_row), tiles of 64 keys, against the plain loop."""
    rng = np.random.default_rng(seed)
    Tmax = start + n_new + 3
    kc, vc = (rng.standard_normal((B, Tmax, H, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((B, n_new, H, D)).astype(np.float32)
    # as test_attention: dot products of length D (each side off by up to D roundings of
    # sqrt(D)-sized terms), sums over up to T keys
    T = start + n_new
    bound = 4 * np.sqrt(D) * T * EPS32
    compare("attention_decode_rows", isa, lambda: list(ops.attention_decode(q, kc, vc, start)),
            (1e-5, bound))


@pytest.mark.parametrize("isa", FAST)
@given(B=st.sampled_from([1, 3]), T=st.sampled_from([1, 5, 64]), H=st.sampled_from([1, 4]),
       D=st.sampled_from([2, 6, 32, 34]), per_batch=st.booleans(), seed=seeds)
def test_rope(isa, B, T, H, D, per_batch, seed):
    """The tabled RoPE computes the same expressions as the plain one: the same bits."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, H, D)).astype(np.float32)
    pos = rng.integers(0, 5000, (B, T) if per_batch else T)
    fn = lambda: [ops.rope_forward(x, pos), ops.rope_backward(x, pos)]  # noqa: E731
    for g, p in zip(run_all(isa, fn), run_all("plain", fn), strict=True):
        np.testing.assert_array_equal(g, p)


def test_every_op_gives_the_same_bits_at_any_thread_count():
    """Sizes large enough that each op splits its work among threads (> 16384 elements)."""
    assert_same_bits_at_any_thread_count(
        """
        import numpy as np
        from pytfm import ops
        rng = np.random.default_rng(3)
        x, dy = (rng.standard_normal((300, 257)).astype(np.float32) for _ in range(2))
        w, b = (rng.standard_normal(257).astype(np.float32) for _ in range(2))
        W = rng.standard_normal((130, 257)).astype(np.float32)
        ids = rng.integers(0, 50, 300)
        table = rng.standard_normal((50, 257)).astype(np.float32)
        q = rng.standard_normal((2, 100, 3, 16)).astype(np.float32)
        y, mean, rstd = ops.layernorm_forward(x, w, b)
        sm = ops.softmax_forward(x)
        loss, lse = ops.cross_entropy_forward(x, ids)
        lin = ops.linear_forward(x, W, b[:130])
        Wide = rng.standard_normal((600, 257)).astype(np.float32)  # one row, 600 outputs
        lin1 = ops.linear_forward(x[:1], Wide)
        kc, vc = (rng.standard_normal((2, 300, 3, 16)).astype(np.float32) for _ in range(2))
        dec = ops.attention_decode(q[:, :1].copy(), kc, vc, start=250)  # 1 query, 6 heads
        p, m, v = x.copy(), np.zeros_like(x), np.zeros_like(x)
        ops.adamw_step(p, dy, m, v, step=1, lr=1e-3, weight_decay=0.1)
        out = [y, mean, rstd, *ops.layernorm_backward(dy, x, w, mean, rstd), sm,
               ops.softmax_backward(dy, sm), np.float32(loss), lse,
               ops.cross_entropy_backward(x, ids, lse), ops.gelu_forward(x),
               ops.gelu_backward(dy, x), lin, lin1, *ops.linear_backward(lin, x, W),
               ops.embedding_forward(ids, table), ops.embedding_backward(dy, ids, 50),
               ops.rope_forward(q, np.arange(100)), p, m, v, *dec]
        """
    )
