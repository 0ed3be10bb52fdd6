"""The BF16 products on every path this CPU runs (pytfm_get_bf16_isa): the AVX512-BF16 kernels,
the FP32 kernels on rounded panels (AVX-512, AVX2) and the plain loop, selected by capping the
instruction set.

What is checked, and why it is enough:
  - the rounding, bit for bit against pytfm.reference.round_bf16 (a by-value rounding in
    float64, written independently of the C bit trick), on every upper half of a float's bits
    with the lower halves that decide a rounding (0, 1, a tie, either side of it, all ones),
    and through the packing of each path (a product with the identity returns its rounded
    input);
  - each product against the float64 product of the rounded inputs, within a bound derived
    from float32 summation over k (ops_registry.bf16_bound): the products of BF16 values are
    exact, so nothing else may differ; the rounding error itself (2^-9 relative per input) is
    far outside that bound, so a product that skipped the rounding fails;
  - the fallbacks bit for bit against the FP32 kernels on rounded copies of the inputs: what
    "BF16 means the same numbers everywhere" rests on;
  - padding: an odd k and ragged edges change nothing, and inf or NaN reach only the outputs
    they belong to;
  - the same bits at any thread count on each path.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pytfm
from helpers import (
    BF16_FALLBACKS,
    BF16_PATHS,
    assert_close,
    assert_same_bits_at_any_thread_count,
    bf16_path,
    seeds,
)
from ops_registry import bf16_bound, rounded
from pytfm import ops
from pytfm import reference as ref
from pytfm._core import check, ffi, lib

BF16 = lib.PYTFM_PRECISION_BF16
PATHS, FALLBACKS = BF16_PATHS, BF16_FALLBACKS


def P(a):
    return ffi.from_buffer("float[]", a)


def sgemm_ex(c, a, b, m, n, k, ta, tb, beta, precision=BF16):
    check(lib.pytfm_sgemm_ex(P(c), P(a), P(b), m, n, k, ta, tb, beta, precision))


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


# ---- the rounding --------------------------------------------------------------------------

LOW_HALVES = (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF)


def all_halves():
    """Every upper half of a float's bits with each of LOW_HALVES and one random lower half:
    every sign, exponent and BF16 fraction, each tie (0x8000) with an even and an odd kept
    part, either side of it, and the ends."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    rng = np.random.default_rng(0)
    lows = [np.full(1 << 16, low, np.uint32) for low in LOW_HALVES]
    lows.append(rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint32))
    return np.concatenate([hi | low for low in lows]).view(np.float32)


def test_rounding_matches_numpy_bit_for_bit():
    x = all_halves()
    got, want = ops.round_bf16(x), ref.round_bf16(x)
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(got), nan) and np.array_equal(np.isnan(want), nan)
    np.testing.assert_array_equal(bits(got)[~nan], bits(want)[~nan])
    # a NaN keeps its sign and upper fraction, made quiet (never inf: the add would carry)
    u = x.view(np.uint32)[nan]
    np.testing.assert_array_equal(bits(got)[nan], (u | 0x00400000) & 0xFFFF0000)
    assert not (bits(got) & 0xFFFF).any(), "the low 16 bits must be zero"
    y = x.copy()
    assert ops.round_bf16(y) is not y
    check(lib.pytfm_round_bf16(P(y), P(y), y.size))  # in place: y may equal x
    np.testing.assert_array_equal(bits(y)[~nan], bits(want)[~nan])


@pytest.mark.parametrize("x,want", [
    (1.0 + 2**-8, 1.0),  # a tie with an even kept part stays
    (1.0 + 3 * 2**-8, 1.0 + 2**-6),  # a tie with an odd one goes up to the even
    (1.0 + 2**-8 + 2**-20, 1.0 + 2**-7),  # past the tie: up
    (-(1.0 + 2**-8), -1.0),
    (2**-126, 2**-126),  # the smallest normal stays
    (2**-127, 0.0),  # a float32 subnormal is zero
    (-(2**-149), -0.0),
    ((2 - 2**-7) * 2.0**127, (2 - 2**-7) * 2.0**127),  # the largest BF16
    ((2 - 2**-8) * 2.0**127, np.inf),  # half an ulp past it: a tie, to the even, 2^128: inf
    (-((2 - 2**-8) * 2.0**127 - 2.0**104), -(2 - 2**-7) * 2.0**127),  # just under the tie
    (np.finfo(np.float32).max, np.inf),
    (np.inf, np.inf), (-np.inf, -np.inf), (0.0, 0.0), (-0.0, -0.0),
], ids=lambda v: repr(v))
def test_rounding_of_special_values(x, want):
    x = np.array([x], np.float32)
    for got in (ops.round_bf16(x), ref.round_bf16(x)):
        np.testing.assert_array_equal(bits(got), bits(np.array([want], np.float32)))
    assert np.isnan(ops.round_bf16(np.array([np.nan], np.float32))[0])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("ta,tb,side", [(0, 0, "a"), (1, 0, "a"), (0, 1, "b"), (0, 0, "b")])
def test_every_packing_rounds_as_the_reference(path, ta, tb, side):
    """A·I (or I·B) takes the one product x·1 per output: the rounded x, through each packing
    (A's rows or columns, B's rows or columns) of each path. Finite values only (inf·0 would
    be NaN): ties either way, subnormals, the largest values."""
    x = all_halves()
    x = x[np.isfinite(x) & (np.abs(x) < 3.38e38)]
    m, k = 37, 65  # ragged against every tile and an odd k
    ties = x[(x.view(np.uint32) & 0xFFFF) == 0x8000]  # a third of them ties
    x = np.random.default_rng(0).permutation(np.concatenate([x, ties]))[:m * k]
    x = x.reshape(m, k) if side == "a" else x.reshape(k, m)
    eye = np.eye(k, dtype=np.float32)
    with bf16_path(path):
        if side == "a":  # C [m, k] = op(A)·I
            c = np.empty((m, k), np.float32)
            sgemm_ex(c, np.ascontiguousarray(x.T) if ta else x, eye, m, k, k, ta, tb, 0.0)
        else:  # C [k, m] = I·op(B)
            c = np.empty((k, m), np.float32)
            sgemm_ex(c, eye, np.ascontiguousarray(x.T) if tb else x, k, m, k, ta, tb, 0.0)
    np.testing.assert_array_equal(c, ref.round_bf16(x))  # values: a sum of +0 drops -0's sign


# ---- the products against the reference ------------------------------------------------------

# around the tiles (8×32 for AVX512-BF16, 6×16 and 8×32 for the FP32 ones), the row block (144)
# and the k slices (384 for FP32, 768 values = 384 pairs for AVX512-BF16); odd k for the pairs
edges = st.one_of(st.integers(1, 40), st.sampled_from([7, 8, 9, 31, 32, 33, 143, 144, 145]))
depths = st.one_of(st.integers(1, 40), st.sampled_from([383, 384, 385, 767, 768, 769, 1537]))


def product_case(seed, m, n, k, ta, tb, beta, scale=1.0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((k, m) if ta else (m, k)) * scale).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    if beta == 0.0:
        c0[0, 0] = np.nan  # beta = 0 must not read C
    A, B = rounded(a.T if ta else a, b.T if tb else b)
    want = A @ B + (beta * c0.astype(np.float64) if beta else 0.0)
    tol = bf16_bound(k, abs(A) @ abs(B) + (abs(beta * c0.astype(np.float64)) if beta else 0.0))
    return a, b, c0, want, tol


@pytest.mark.parametrize("path", PATHS)
@given(m=edges, n=edges, k=depths, ta=st.booleans(), tb=st.booleans(),
       beta=st.sampled_from([0.0, 1.0, 0.5]), scale=st.sampled_from([1.0, 1e-3, 1e3]),
       seed=seeds)
def test_the_bf16_sgemm_on_every_path(path, m, n, k, ta, tb, beta, scale, seed):
    a, b, c0, want, tol = product_case(seed, m, n, k, ta, tb, beta, scale)
    c = c0.copy()
    with bf16_path(path):
        sgemm_ex(c, a, b, m, n, k, ta, tb, beta)
    assert_close(f"sgemm_ex.bf16.{path}", c, want, atol=tol, rtol=0.0)


def test_the_bf16_sgemm_is_not_the_fp32_one():
    """The bound above is tight enough to tell: inputs that are not BF16 values give another
    product (by about 2^-9 of |a||b| per term), outside it."""
    a, b, c0, want, tol = product_case(1, 64, 64, 256, 0, 0, 0.0)
    c = np.empty_like(c0)
    sgemm_ex(c, a, b, 64, 64, 256, 0, 0, 0.0, lib.PYTFM_PRECISION_FP32)
    assert (np.abs(c - want) > tol).mean() > 0.5


def test_a_bad_precision_is_refused():
    c = np.zeros((2, 2), np.float32)
    st_ = lib.pytfm_sgemm_ex(P(c), P(c.copy()), P(c.copy()), 2, 2, 2, 0, 0, 0.0, 2)
    assert st_ == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "precision must be a pytfm_precision (0: FP32, 1: BF16), got 2" in \
        ffi.string(lib.pytfm_last_error()).decode()


@pytest.mark.parametrize("path", PATHS)
def test_padding_changes_nothing_and_non_finite_values_stay_where_they_are(path):
    """An odd k ends in a pair padded with zeros: the same bits as the product with an explicit
    zero column of A and zero row of B. An inf in A's row 0 and a NaN in B's column 3 reach row
    0 and column 3 of C only: the zero-filled rows, columns and pairs multiply nothing."""
    rng = np.random.default_rng(5)
    m, n, k = 13, 37, 61
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
    a1 = np.concatenate([a, np.zeros((m, 1), np.float32)], axis=1)
    b1 = np.concatenate([b, np.zeros((1, n), np.float32)], axis=0)
    a[0, 5], b[7, 3] = np.inf, np.nan
    a1[0, 5], b1[7, 3] = np.inf, np.nan
    c, c1 = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    with bf16_path(path):
        sgemm_ex(c, a, b, m, n, k, 0, 0, 0.0)
        sgemm_ex(c1, a1, b1, m, n, k + 1, 0, 0, 0.0)
    np.testing.assert_array_equal(c, c1)
    bad = ~np.isfinite(c)
    want = np.zeros((m, n), bool)
    want[0, :], want[:, 3] = True, True
    np.testing.assert_array_equal(bad, want)


# ---- the fallbacks are the FP32 kernels on rounded copies -------------------------------------


@pytest.mark.parametrize("path", FALLBACKS)
@given(m=edges, n=edges, k=depths, ta=st.booleans(), tb=st.booleans(),
       beta=st.sampled_from([0.0, 1.0, 0.5]), seed=seeds)
def test_the_fallbacks_are_the_fp32_kernels_on_rounded_copies(path, m, n, k, ta, tb, beta,
                                                              seed):
    a, b, c0, _, _ = product_case(seed, m, n, k, ta, tb, beta)
    c, fp32 = c0.copy(), c0.copy()
    ra, rb = ops.round_bf16(a), ops.round_bf16(b)
    with bf16_path(path):
        sgemm_ex(c, a, b, m, n, k, ta, tb, beta)
        fn = lib.pytfm_sgemm_plain if path == "plain" else lib.pytfm_sgemm
        check(fn(P(fp32), P(ra), P(rb), m, n, k, ta, tb, beta))
    np.testing.assert_array_equal(bits(c), bits(fp32))


@pytest.mark.parametrize("path", FALLBACKS)
@given(rows=st.sampled_from([1, 2, 7, 40]), inn=edges, out=edges, bias=st.booleans(),
       seed=seeds)
def test_the_linear_fallbacks_are_the_fp32_layer_on_rounded_copies(path, rows, inn, out, bias,
                                                                   seed):
    """Forward (one row: the row kernel), forward with GELU, backward (dx, dw from the rounded
    dy, x, w; db from dy itself)"""
    rng = np.random.default_rng(seed)
    x, w, dy = (rng.standard_normal(s).astype(np.float32)
                for s in ((rows, inn), (out, inn), (rows, out)))
    b = rng.standard_normal(out).astype(np.float32) if bias else None
    rx, rw, rdy = ops.round_bf16(x), ops.round_bf16(w), ops.round_bf16(dy)
    with bf16_path(path):
        got = [ops.linear_forward(x, w, b, precision="bf16"),
               *ops.linear_gelu_forward(x, w, b, precision="bf16"),
               *ops.linear_backward(dy, x, w, bias, precision="bf16")[:2]]
        want = [ops.linear_forward(rx, rw, b), *ops.linear_gelu_forward(rx, rw, b),
                *ops.linear_backward(rdy, rx, rw, False)[:2]]
        db = ops.linear_backward(dy, x, w, bias, precision="bf16")[2]
        db_fp32 = ops.linear_backward(dy, x, w, bias)[2]
    for g, wnt in zip(got, want, strict=True):
        np.testing.assert_array_equal(bits(g), bits(wnt))
    if bias:
        np.testing.assert_array_equal(bits(db), bits(db_fp32))


# ---- the linear layer ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@given(rows=st.sampled_from([1, 2, 3, 9, 150]), inn=st.one_of(edges, st.sampled_from([769])),
       out=edges, bias=st.booleans(), seed=seeds)
def test_the_bf16_linear_layer_on_every_path(path, rows, inn, out, bias, seed):
    """Forward (one row takes the row kernel) and backward against the reference on rounded
    inputs, each output within its bound (ops_registry.bf16_bound)"""
    import ops_registry as reg

    a = reg.linear_make(seed, rows, inn, out, bias, accumulate=True)
    with bf16_path(path):
        y = ops.linear_forward(a["x"], a["w"], a["b"], precision="bf16")
        back = ops.linear_backward(a["dy"], a["x"], a["w"], bias, dw=a["dw0"].copy(),
                                   db=None if a["db0"] is None else a["db0"].copy(),
                                   precision="bf16")
    t = reg.bf16_linear_tol(a)
    assert_close(f"linear_forward_ex.bf16.{path}", y, reg.bf16_linear_want(a), t.atol, t.rtol)
    want = reg.bf16_backward_want(a)
    for name, g, wnt, tol in zip(("dx", "dw", "db"), back, want, reg.bf16_backward_tol(a, want)):
        if wnt is None:
            assert g is None
            continue
        assert_close(f"linear_backward_ex.bf16.{path}.{name}", g, wnt, tol.atol, tol.rtol)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows,inn,out", [(1, 37, 70), (1, 300, 700), (40, 33, 65),
                                          (300, 200, 90)])
def test_linear_gelu_in_bf16_is_linear_then_gelu(path, rows, inn, out):
    """The fused form's h is the linear layer's and y GELU's pass on it, bit for bit: the C model
    runs them apart, Python fused"""
    rng = np.random.default_rng(rows + inn)
    x, w = (rng.standard_normal(s).astype(np.float32) for s in ((rows, inn), (out, inn)))
    b = rng.standard_normal(out).astype(np.float32)
    with bf16_path(path):
        y, h = ops.linear_gelu_forward(x, w, b, precision="bf16")
        h2 = ops.linear_forward(x, w, b, precision="bf16")
        y2 = ops.gelu_forward(h2)
    np.testing.assert_array_equal(bits(h), bits(h2))
    np.testing.assert_array_equal(bits(y), bits(y2))


def test_fp32_through_the_ex_functions_is_the_fp32_kernels():
    rng = np.random.default_rng(2)
    x, w = (rng.standard_normal(s).astype(np.float32) for s in ((50, 70), (90, 70)))
    b = rng.standard_normal(90).astype(np.float32)
    for rows in (1, 50):
        y = np.empty((rows, 90), np.float32)
        check(lib.pytfm_linear_forward_ex(P(y), P(x[:rows]), P(w), P(b), rows, 70, 90,
                                          lib.PYTFM_PRECISION_FP32))
        np.testing.assert_array_equal(bits(y), bits(ops.linear_forward(x[:rows], w, b)))
    c, c2 = np.empty((50, 90), np.float32), np.empty((50, 90), np.float32)
    sgemm_ex(c, x, w, 50, 90, 70, 0, 1, 0.0, lib.PYTFM_PRECISION_FP32)
    check(lib.pytfm_sgemm(P(c2), P(x), P(w), 50, 90, 70, 0, 1, 0.0))
    np.testing.assert_array_equal(bits(c), bits(c2))


# ---- dispatch and threads --------------------------------------------------------------------


def test_the_bf16_path_follows_the_cpu_and_the_cap():
    features = pytfm.build_info()["cpu_features"]
    info = pytfm.build_info()
    assert info["bf16"] == pytfm.get_bf16_isa()
    if "avx512_bf16" in features:  # AMX or not: the AVX512-BF16 kernels (no AMX ones)
        assert info["bf16"] == "avx512_bf16"
        assert pytfm.bf16_path().startswith("AVX512-BF16: vdpbf16ps")
    else:  # the FP32 kernels' ISA, on rounded inputs
        assert info["bf16"] == info["isa"]
    for cap in ("avx512", "avx2", "portable", "plain"):
        pytfm.set_max_isa(cap)
        try:
            assert pytfm.get_bf16_isa() == pytfm.get_isa()
            assert "avx512_bf16" not in pytfm.bf16_path()
        finally:
            pytfm.set_max_isa("auto")
    pytfm.set_max_isa("avx512_bf16")  # as "auto" while no higher ISA exists
    try:
        assert pytfm.get_bf16_isa() == info["bf16"] and pytfm.get_isa() == info["isa"]
    finally:
        pytfm.set_max_isa("auto")


def test_the_bf16_products_give_the_same_bits_at_any_thread_count():
    """On every path: C split by rows and by columns, several k slices, the one-row product
    split in blocks of outputs"""
    assert_same_bits_at_any_thread_count(
        """
        import numpy as np
        from pytfm import ops
        from pytfm._core import ffi, lib
        rng = np.random.default_rng(1)
        p = lambda x: ffi.from_buffer("float[]", x)
        out = []
        for isa in ("avx512_bf16", "avx512", "avx2", "plain"):
            assert lib.pytfm_set_max_isa(("auto", "plain", "portable", "avx2", "avx512",
                                          "avx512_bf16").index(isa)) == 0
            for m, n, k, ta, tb in ((300, 90, 1600, 0, 0), (5, 700, 300, 0, 1),
                                    (90, 300, 800, 1, 0), (2100, 40, 9, 0, 1)):
                a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
                b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
                c = np.ones((m, n), np.float32)
                assert lib.pytfm_sgemm_ex(p(c), p(a), p(b), m, n, k, ta, tb, 0.5, 1) == 0
                out += [c, np.int32(lib.pytfm_get_bf16_isa())]
            x = rng.standard_normal((1, 700), dtype=np.float32)
            w = rng.standard_normal((3000, 700), dtype=np.float32)
            out.append(ops.linear_forward(x, w, precision="bf16"))
        """
    )


@pytest.mark.parametrize("path", PATHS)
def test_one_long_row(path):
    """One row of more than 8192 inputs: the AVX512-BF16 row kernel makes x's pairs per block of
    rows instead of once into its stack buffer"""
    import ops_registry as reg

    a = reg.linear_make(7, 1, 8200, 37, True)
    with bf16_path(path):
        y = ops.linear_forward(a["x"], a["w"], a["b"], precision="bf16")
    t = reg.bf16_linear_tol(a)
    assert_close(f"linear_forward_ex.bf16.{path}.long", y, reg.bf16_linear_want(a), t.atol,
                 t.rtol)
