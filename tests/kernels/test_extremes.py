"""Float extremes and aliasing, on the plain and every fast instruction set, and on
the CUDA kernels through the emulator.

- e^x of the fast kernels (csrc/kernels/vecmath.h) overflows to +inf exactly where the plain expf
  does (not short of it, at 2.4e38, say), and is 0 wherever expf is, within 1.7e-38 of it below (it
  flushes results under 1.68e-38, x < -86.98, where expf goes on through the subnormals);
- GELU is finite and right for every finite float32 x up to ±FLT_MAX, and gives the
  reference's answer for ±inf and NaN;
- LayerNorm's variance is right for rows of huge values (squares past FLT_MAX) and of tiny
  spread with eps = 0 (squares lost to underflow);
- softmax of rows holding ±3e38;
- cross-entropy of rows holding ±inf, NaN, huge or far-negative logits: the plain kernel's
  answer from the fast one-pass logsumexp;
- a gradient accumulator that shares memory with another argument is rejected, naming both,
  and nothing is written.
"""

import numpy as np
import pytest

from cuda_emu import Guarded
from helpers import EPS32, assert_close, max_isa
from pytfm import ops
from pytfm import reference as ref
from pytfm._core import ffi, lib

ISAS = ["plain", "portable", "avx2", "avx512"]
FLT_MAX = float(np.finfo(np.float32).max)


def fp(a):
    return ffi.from_buffer("float[]", a)


def ip(a):
    return ffi.from_buffer("int64_t[]", a)


# ---- e^x ----------------------------------------------------------------------------------


def exp_of(x, isa):
    """e^x as the kernels of isa compute it: the cross-entropy's backward with lse = 0 and
    one row kept writes dlogits[j] = e^(logits[j] − lse) for every j but the target's."""
    logits = np.append(x, np.float32(0))[None].astype(np.float32)
    d = np.empty_like(logits)
    target = np.array([logits.shape[1] - 1], np.int64)
    with max_isa(isa):
        st = lib.pytfm_cross_entropy_backward(fp(d), fp(logits), ip(target),
                                              fp(np.zeros(1, np.float32)), 1, logits.shape[1],
                                              -100, 1.0)
    assert st == lib.PYTFM_STATUS_OK
    return d[0, :-1]


EXP_X = np.concatenate([
    np.linspace(-112, 92, 80001, dtype=np.float32),
    np.float32([88.72283172607422, 88.72283935546875, 89.0, 1e4, 3e38, FLT_MAX, np.inf,
                -87.3365, -100.0, -103.9, -104.5, -1e4, -3e38, -np.inf, np.nan]),
])


@pytest.mark.parametrize("isa", ISAS[1:])
def test_fast_exp_overflows_and_underflows_where_expf_does(isa):
    plain, fast = exp_of(EXP_X, "plain"), exp_of(EXP_X, isa)
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(EXP_X))
    # +inf exactly from ln(FLT_MAX) on: 88.72283172607422 is the last finite x
    np.testing.assert_array_equal(np.isinf(fast), np.isinf(plain))
    assert np.isfinite(fast[EXP_X == np.float32(88.72283172607422)]).all()
    # 0 wherever expf gives 0 (far below: e^x < 2^-150 from x = -103.97 on), and nonzero
    # wherever x >= -86.98, the flush threshold (e^x >= 1.68e-38: normal numbers)
    assert (fast[plain == 0] == 0).all() and (fast[EXP_X < -104] == 0).all()
    assert (fast[(EXP_X >= -86.98) & (EXP_X < 89)] > 0).all()
    # values: within 3 ulp, or the flushed ones (e^x < e^-86.98 = 1.68e-38) within 1.7e-38
    ok = np.isfinite(plain)
    want = np.exp(EXP_X[ok].astype(np.float64))
    assert_close("extremes.exp", fast[ok], want, atol=1.7e-38, rtol=4 * EPS32)


# ---- GELU ---------------------------------------------------------------------------------


def gelu_grid():
    mags = np.minimum(np.geomspace(1e-6, FLT_MAX, 4000), FLT_MAX)
    x = np.concatenate([-mags, mags, np.linspace(-24, 24, 9601), [0.0, FLT_MAX, -FLT_MAX]])
    return x.astype(np.float32)


def gelu_tolerances(x, dy):
    """Per element, from the float32 error of u = K(x + A x³): e^(−2u) is off by about
    4·eps·|2u| relative (capped where it has over- or underflowed and s is exactly 0 or 1),
    which moves s, y = x·s and the backward's two parts s and x·½(1 − tanh² u)·u' by as much
    relative; atol covers results that fall below FLT_MIN (e^(−2u) = +inf in float32)."""
    X = x.astype(np.float64)
    two_u = np.minimum(np.abs(2 * ref.GELU_K * (X + ref.GELU_A * X**3)), 110.0)
    rel = EPS32 * (4 * two_u + 16)
    s, q = ref._gelu_halves(X)
    parts = s + np.abs(X) * q * ref.GELU_K * (1 + 3 * ref.GELU_A * np.minimum(X * X, 1e30))
    return rel, np.abs(dy) * (rel * parts + 1e-35)


@pytest.mark.parametrize("isa", ISAS)
def test_gelu_is_finite_and_right_up_to_flt_max(isa):
    x = gelu_grid()
    dy = np.random.default_rng(0).standard_normal(x.size).astype(np.float32)
    with max_isa(isa):
        y, dx = ops.gelu_forward(x), ops.gelu_backward(dy, x)
    assert np.isfinite(y).all() and np.isfinite(dx).all()
    rel, dx_tol = gelu_tolerances(x, dy)
    assert_close("extremes.gelu.forward", y, ref.gelu_forward(x), atol=1e-37, rtol=rel)
    assert_close("extremes.gelu.backward", dx, ref.gelu_backward(dy, x), atol=dx_tol, rtol=0)
    # the tester's cases: gelu'(−1e15) = 0 (not −8.95e5), gelu'(±3e38) finite
    with max_isa(isa):
        g = ops.gelu_backward(np.ones(3, np.float32), np.float32([-1e15, 3e38, -3e38]))
    np.testing.assert_array_equal(g, [0.0, 1.0, 0.0])


NON_FINITE = np.float32([np.inf, -np.inf, np.nan])


@pytest.mark.parametrize("isa", ISAS)
def test_gelu_of_inf_and_nan_is_what_the_reference_gives(isa):
    with max_isa(isa):
        y, dx = ops.gelu_forward(NON_FINITE), ops.gelu_backward(np.ones(3, np.float32), NON_FINITE)
    np.testing.assert_array_equal(y, ref.gelu_forward(NON_FINITE))  # inf, nan, nan
    np.testing.assert_array_equal(dx, ref.gelu_backward(np.ones(3), NON_FINITE))  # nan x 3
    np.testing.assert_array_equal(y, np.float32([np.inf, np.nan, np.nan]))
    assert np.isnan(dx).all()


def test_gelu_extremes_on_the_cuda_kernels(emu):
    g = Guarded()
    x = np.concatenate([gelu_grid(), NON_FINITE])
    dy = np.random.default_rng(1).standard_normal(x.size).astype(np.float32)
    y, dx = g.empty(x.shape), g.empty(x.shape)
    emu.call("pytfm_gelu_forward_cuda", y, g(x), x.size)
    emu.call("pytfm_gelu_backward_cuda", dx, g(dy), g(x), x.size)
    g.check()
    n = x.size - 3
    rel, dx_tol = gelu_tolerances(x[:n], dy[:n])
    assert np.isfinite(y[:n]).all() and np.isfinite(dx[:n]).all()
    assert_close("extremes.cuda.gelu.forward", y[:n], ref.gelu_forward(x[:n]), atol=1e-37,
                 rtol=rel)
    assert_close("extremes.cuda.gelu.backward", dx[:n], ref.gelu_backward(dy[:n], x[:n]),
                 atol=dx_tol, rtol=0)
    np.testing.assert_array_equal(y[n:], [np.inf, np.nan, np.nan])
    assert np.isnan(dx[n:]).all()


# ---- LayerNorm ----------------------------------------------------------------------------


def layernorm_rows():
    """(name, x, eps): rows whose float32 sums of squares overflow or underflow, and one far
    from zero whose squares do not (the float path with its shift by x[0])."""
    rng = np.random.default_rng(16)
    f = lambda a: np.asarray(a, np.float32)  # noqa: E731
    return [
        ("issue", f([[1e20, -1e20, 0, 0]]), 1e-5),
        ("huge-normal", f(rng.standard_normal((3, 768)) * 1e20), 1e-5),
        ("huge-offset", f(rng.standard_normal((2, 300)) * 1e19 + 3e20), 1e-5),
        ("near-flt-max", f([[3e38, -3e38, 1, 2], [FLT_MAX, -FLT_MAX, 0, FLT_MAX]]), 1e-5),
        ("wide-odd", f(rng.standard_normal((2, 1025)) * 1e25), 0.0),
        ("far-offset", f(rng.standard_normal((2, 257)) * 1e16 + 1e20), 1e-5),
        ("tiny-spread", f(rng.standard_normal((2, 100)) * 1e-25), 0.0),
    ]


def check_layernorm(tag, x, eps, y, mean, rstd, w, b):
    ry, rmean, rrstd = ref.layernorm_forward(x, w, b, eps)
    scale = np.abs(x.astype(np.float64)).max(axis=1)
    assert np.isfinite(y).all(), f"{tag}: y not finite: {y}"
    assert_close(f"extremes.{tag}.y", y, ry, atol=1e-5 * (np.abs(w) * 4 + np.abs(b)), rtol=1e-5)
    assert_close(f"extremes.{tag}.mean", mean, rmean, atol=1e-6 * scale, rtol=0)
    assert_close(f"extremes.{tag}.rstd", rstd, rrstd, atol=0, rtol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", range(7))
def test_layernorm_of_huge_and_tiny_rows(isa, case):
    name, x, eps = layernorm_rows()[case]
    rng = np.random.default_rng(case)
    w, b = (rng.standard_normal(x.shape[1]).astype(np.float32) for _ in range(2))
    with max_isa(isa):
        y, mean, rstd = ops.layernorm_forward(x, w, b, eps)
    check_layernorm(f"layernorm.{name}", x, eps, y, mean, rstd, w, b)
    if name in ("issue", "huge-normal", "huge-offset"):  # x − mean within float range
        dy = rng.standard_normal(x.shape).astype(np.float32)
        with max_isa(isa):
            dx, dw, db = ops.layernorm_backward(dy, x, w, mean, rstd)
        for n, got, want in zip(("dx", "dw", "db"), (dx, dw, db),
                                ref.layernorm_backward(dy, x, w, mean, rstd)):
            assert_close(f"extremes.layernorm.{name}.{n}", got, want,
                         atol=1e-5 * float(np.abs(want).max()), rtol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_layernorm_of_rows_holding_inf_or_nan_is_nan_as_the_reference(isa):
    x = np.float32([[np.inf, 0, 1, 2], [np.nan, 0, 1, 2], [np.inf, -np.inf, 0, 0],
                    [1, 2, 3, 4]])
    w, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    with np.errstate(invalid="ignore"):
        ry, _, rrstd = ref.layernorm_forward(x, w, b)
    with max_isa(isa):
        y, _, rstd = ops.layernorm_forward(x, w, b)
    assert np.isnan(ry[:3]).all() and np.isnan(rrstd[:3]).all()
    assert np.isnan(y[:3]).all() and np.isnan(rstd[:3]).all()
    assert_close("extremes.layernorm.finite-row", y[3], ry[3], atol=1e-6)


def test_layernorm_of_1e20_rows_is_the_issue_answer():
    x = np.float32([[1e20, -1e20, 0, 0]])
    for isa in ISAS:
        with max_isa(isa):
            y, _, _ = ops.layernorm_forward(x, np.ones(4, np.float32), np.zeros(4, np.float32))
        np.testing.assert_allclose(y, [[2**0.5, -(2**0.5), 0, 0]], rtol=1e-6)


@pytest.mark.parametrize("case", range(7))
def test_layernorm_extremes_on_the_cuda_kernel(emu, case):
    name, x, eps = layernorm_rows()[case]
    rng = np.random.default_rng(case)
    w, b = (rng.standard_normal(x.shape[1]).astype(np.float32) for _ in range(2))
    for cols_mult in (1, 2):  # a warp per row, and (past 1024 columns) a block per row
        xx = np.tile(x, (1, cols_mult if x.shape[1] * cols_mult > 1024 else 1))
        ww, bb = np.tile(w, xx.shape[1] // w.size), np.tile(b, xx.shape[1] // b.size)
        g = Guarded()
        rows, cols = xx.shape
        y, mean, rstd = g.empty(xx.shape), g.empty(rows), g.empty(rows)
        emu.call("pytfm_layernorm_forward_cuda", y, mean, rstd, g(xx), g(ww), g(bb), rows, cols,
                 eps)
        g.check()
        check_layernorm(f"cuda.layernorm.{name}", xx, eps, y, mean, rstd, ww, bb)


# ---- softmax ------------------------------------------------------------------------------

SOFTMAX_ROWS = np.float32([[3e38, -3e38, 0, 1], [-3e38, -3e38, -3e38, -3e38],
                           [3e38, 3e38, 3e38, 3e38], [FLT_MAX, -FLT_MAX, FLT_MAX, 0],
                           [-3e38, 0, 1e-30, -1e38]])


@pytest.mark.parametrize("isa", ISAS)
def test_softmax_of_rows_holding_3e38(isa):
    dy = np.random.default_rng(2).standard_normal(SOFTMAX_ROWS.shape).astype(np.float32)
    with max_isa(isa):
        y = ops.softmax_forward(SOFTMAX_ROWS)
        dx = ops.softmax_backward(dy, y)
    ry = ref.softmax_forward(SOFTMAX_ROWS)
    assert_close("extremes.softmax.forward", y, ry, atol=1e-7, rtol=1e-6)
    assert_close("extremes.softmax.backward", dx, ref.softmax_backward(dy, ry),
                 atol=1e-6 * (1 + np.abs(dy).max()), rtol=1e-5)


# ---- cross-entropy ------------------------------------------------------------------------


def ce_rows(cols):
    """Rows of logits that test the fast logsumexp's one pass (blocks of 2048 floats, each
    block's maximum first, the running sum scaled when a block raises it): ±inf, NaN, -inf
    before and after the finite values, a maximum in the last block, rows far below 0 whose
    every e^(x − max) but the largest underflows, and huge logits."""
    rng = np.random.default_rng(7)
    base = (rng.standard_normal(cols) * 3).astype(np.float32)
    rows = [base.copy() for _ in range(11)]
    rows[0][:] = -np.inf                      # no finite maximum: NaN, as the plain kernel
    rows[1][: cols // 2] = -np.inf            # -inf first (a whole block when cols > 4096)
    rows[2][cols // 2:] = -np.inf             # -inf after
    rows[3][cols - 1] = np.inf                # +inf last: NaN
    rows[4][cols // 3] = np.nan               # NaN: NaN
    rows[5][cols - 1] = 200.0                 # the maximum in the last block: rescaled sum
    rows[6] = rows[6] - np.float32(1e4)       # far below 0: same answer shifted
    rows[7] = rows[7] * np.float32(40)        # e^(x − max) underflows for most x
    rows[8][0] = FLT_MAX                      # huge logits
    rows[8][cols - 1] = -FLT_MAX
    rows[9][: cols - 1] = -np.inf             # one finite value, at the end
    rows[10][:] = np.float32(-3e38)
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("isa", ISAS[1:])
@pytest.mark.parametrize("cols", [1000, 2048, 5000])
def test_cross_entropy_of_extreme_rows_is_the_plain_kernels_answer(isa, cols):
    logits = ce_rows(cols)
    targets = np.zeros(len(logits), np.int64)
    with max_isa("plain"):
        _, want = ops.cross_entropy_forward(logits, targets)
        dwant = ops.cross_entropy_backward(logits, targets, want)
    with max_isa(isa):
        _, lse = ops.cross_entropy_forward(logits, targets)
        d = ops.cross_entropy_backward(logits, targets, lse)
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(want))
    ok = np.isfinite(want)
    # a float sum of cols terms (rounded per lane) vs a double one, e^ within 3 ulp
    assert_close("extremes.cross_entropy.lse", lse[ok], want[ok], atol=0.0,
                 rtol=EPS32 * (cols / 16 + 20))
    np.testing.assert_array_equal(np.isnan(d), np.isnan(dwant))
    fin = np.isfinite(dwant)
    assert_close("extremes.cross_entropy.dlogits", d[fin], dwant[fin], atol=1e-9, rtol=1e-4)


# ---- aliasing -----------------------------------------------------------------------------


def unchanged(arrays, call, pattern):
    """call() raises ValueError matching pattern and leaves every array as it was."""
    before = [a.copy() for a in arrays]
    with pytest.raises(ValueError, match=pattern):
        call()
    for a, b in zip(arrays, before):
        np.testing.assert_array_equal(a, b)


def test_accumulated_gradients_that_share_memory_are_rejected_through_python():
    rng = np.random.default_rng(3)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    x, w, dy, db = r(3, 4), r(3, 4), r(3, 3), r(3)  # rows = out = 3, in = 4
    unchanged([x, w, dy, db], lambda: ops.linear_backward(dy, x, w, dw=x, db=db),
              r"pytfm_linear_backward: dw and x must not share memory")
    unchanged([x, w, dy], lambda: ops.linear_backward(dy, x, w, dw=w),
              r"dw and w must not share memory")
    unchanged([x, w, dy], lambda: ops.linear_backward(dy, x, w, dw=r(3, 4), db=dy[1]),
              r"db and dy must not share memory")
    lx, lw, ldy = r(4, 5), r(5), r(4, 5)
    _, mean, rstd = ops.layernorm_forward(lx, lw, lw)
    unchanged([lx, lw, ldy, mean, rstd],
              lambda: ops.layernorm_backward(ldy, lx, lw, mean, rstd, dw=lw),
              r"pytfm_layernorm_backward: dw and w must not share memory")
    unchanged([lx, lw, ldy], lambda: ops.layernorm_backward(ldy, lx, lw, mean, rstd, db=lx[2]),
              r"db and x must not share memory")
    edy, ids = r(6, 8), np.array([0, 1, 5, 5, 2, 3], np.int64)
    unchanged([edy], lambda: ops.embedding_backward(edy, ids, 6, dtable=edy),
              r"pytfm_embedding_backward: dtable and dy must not share memory")
    p, g, m, v = r(10), r(10), r(10), r(10)
    unchanged([p, g, m, v], lambda: ops.adamw_step(p, p, m, v, step=1, lr=0.1),
              r"pytfm_adamw_step: param and grad must not share memory")
    unchanged([p, g, m, v], lambda: ops.adamw_step(p, g, m, m, step=1, lr=0.1),
              r"m and v must not share memory")


def call(name, *args):
    st = getattr(lib, name)(*args)
    return st, ffi.string(lib.pytfm_last_error()).decode()


def test_partial_overlaps_are_rejected_in_c_and_nothing_is_written():
    """Views that share only part of their memory, passed straight to the C functions."""
    buf = np.arange(64, dtype=np.float32)
    keep = buf.copy()
    b = fp(buf)
    cases = [  # name, args, the pair the message must name
        ("pytfm_linear_backward", (b, b + 20, b + 40, b + 21, b + 50, b + 60, 2, 2, 2),
         "dw and dy"),
        ("pytfm_linear_backward", (ffi.NULL, b + 20, b + 23, b + 30, b + 40, b, 2, 2, 2),
         "dw and db"),
        # the input starting first, before the output it overlaps
        ("pytfm_linear_backward", (b, b + 21, b + 40, b + 20, b + 50, b + 60, 2, 2, 2),
         "dw and dy"),
        ("pytfm_adamw_step", (b + 16, b + 1, b + 32, b + 48, 16, 1, 0.1, 0.9, 0.999, 1e-8, 0.0),
         "param and m"),
        ("pytfm_layernorm_backward", (b, b + 10, b + 16, b + 20, b + 30, b + 11, b + 40, b + 42,
                                      2, 4), "dw and w"),
        ("pytfm_embedding_backward", (b, b + 3, ip(np.zeros(2, np.int64)), 2, 2, 4),
         "dtable and dy"),
        ("pytfm_adamw_step", (b, b + 16, b + 32, b + 47, 16, 1, 0.1, 0.9, 0.999, 1e-8, 0.0),
         "v and grad"),
        ("pytfm_adamw_step", (b, b + 15, b + 32, b + 48, 16, 1, 0.1, 0.9, 0.999, 1e-8, 0.0),
         "param and m"),
        ("pytfm_softmax_forward", (b, b + 4, 2, 4), "y and x"),
        ("pytfm_softmax_forward", (b, b, 2, 4), "y and x"),  # no in-place form
        ("pytfm_gelu_backward", (b, b + 1, b + 32, 8), "dx and dy must be the same buffer"),
        ("pytfm_gelu_backward", (b, b + 32, b + 4, 8), "dx and x must not share"),
        ("pytfm_rope_forward", (b, b + 2, ip(np.zeros(2, np.int64)), 1, 2, 1, 4, 0, 1e4),
         "output and input must be the same buffer"),
        ("pytfm_cross_entropy_backward", (b, b, ip(np.zeros(2, np.int64)), b + 40, 2, 4, -1,
                                          1.0), "dlogits and logits"),
        ("pytfm_sgemm", (b, b + 3, b + 40, 2, 2, 2, 0, 0, 0.0), "c and a"),
        ("pytfm_attention_cache_append", (b, b + 10, b + 40, b + 44, 1, 1, 1, 4, 4, 0),
         "k_cache and v_cache"),
        ("pytfm_attention_forward", (b, b + 40, b + 2, b + 20, b + 30, 1, 2, 1, 4, 0.5, 1),
         "o and q"),
    ]
    for name, args, pair in cases:
        st, msg = call(name, *args)
        assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT and pair in msg, (name, st, msg)
        assert msg.startswith(name + ":"), msg
        np.testing.assert_array_equal(buf, keep, err_msg=name)


def test_the_allowed_in_place_forms_still_work():
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal(100).astype(np.float32), rng.standard_normal(100).astype(np.float32)
    want = ops.gelu_backward(dy, x)
    d = dy.copy()
    assert call("pytfm_gelu_backward", fp(d), fp(d), fp(x), 100)[0] == lib.PYTFM_STATUS_OK
    np.testing.assert_array_equal(d, want)
    y = x.copy()
    assert call("pytfm_gelu_forward", fp(y), fp(y), 100)[0] == lib.PYTFM_STATUS_OK
    np.testing.assert_array_equal(y, ops.gelu_forward(x))
    q = rng.standard_normal((1, 5, 2, 4)).astype(np.float32)
    pos = np.arange(5, dtype=np.int64)
    r = q.copy()
    assert call("pytfm_rope_forward", fp(r), fp(r), ip(pos), 1, 5, 2, 4, 0, 1e4)[0] == 0
    np.testing.assert_array_equal(r, ops.rope_forward(q, pos))
