"""8-bit weights (pytfm_quantize_q8, pytfm_linear_forward_q8w and their kin): the quantisation
against the NumPy statement of its contract, bit for bit; the product on every path against
the plain loops, bit for bit, and against the float64 reference within the bound of its
float32 combination; x·Wᵀ within the bound of the two quantisations; bad input refused."""

import contextlib

import numpy as np
import pytest

import pytfm
from pytfm import ops
from pytfm import reference as ref
from pytfm._core import ffi, lib

U = 2.0**-24  # float32's unit roundoff
# the product's paths by ISA cap (pytfm_kernels.h): AVX512-VNNI, AVX-VNNI, AVX2, plain loops
PATHS = ("avx512_bf16", "avx512", "avx2", "portable", "plain")


@contextlib.contextmanager
def cap(name, threads=None):
    """The kernels capped at ISA `name` (a CPU without it takes the next below: the product's
    result is the same on every path, which is what the tests hold it to)."""
    before = pytfm.get_num_threads()
    pytfm.set_max_isa(name)
    if threads:
        pytfm.set_num_threads(threads)
    try:
        yield
    finally:
        pytfm.set_max_isa("auto")
        pytfm.set_num_threads(before)


def weights(rng, out, inn, kind="normal"):
    w = rng.standard_normal((out, inn)).astype(np.float32)
    if kind == "edges":  # per block: zeros, exact ±127 multiples, huge, tiny, underflowing
        b = w.reshape(out, -1, 32)
        pick = rng.integers(0, 6, b.shape[:2])
        b[pick == 0] = 0.0
        b[pick == 1] = rng.integers(-127, 128, b[pick == 1].shape) * np.float32(0.25)
        b[pick == 2] *= np.float32(3e5)
        b[pick == 3] *= np.float32(1e-5)  # an fp16 subnormal scale
        b[pick == 4] *= np.float32(1e-12)  # amax / 127 under fp16's least subnormal: d = 0
        w = b.reshape(out, inn)
    return w


@pytest.mark.parametrize("kind", ["normal", "edges"])
@pytest.mark.parametrize("out,inn", [(1, 32), (7, 64), (33, 96), (5, 4096)])
def test_quantize_matches_the_numpy_contract_bit_for_bit(out, inn, kind):
    rng = np.random.default_rng(out * inn)
    w = weights(rng, out, inn, kind)
    q, s = ops.quantize_q8(w)
    q_ref, s_ref = ref.quantize_q8(w)
    np.testing.assert_array_equal(s, s_ref)
    np.testing.assert_array_equal(q, q_ref)
    assert q.min() >= -127
    # the bound the header states: d/2, or amax − 127·d where the clamp binds
    d = s.view(np.float16).astype(np.float64)
    amax = np.abs(w.reshape(out, -1, 32)).max(axis=-1)
    bound = np.maximum(d / 2, amax - 127 * d)
    err = np.abs(ref.dequantize_q8(q, s) - w).reshape(out, -1, 32).max(axis=-1)
    assert np.all(err <= bound)
    # from BF16 bits: the quantisation of their float32 widening
    w16 = ops.to_bf16_bits(w)
    q16, s16 = ops.quantize_q8(w16)
    q_w, s_w = ref.quantize_q8(ops.from_bf16_bits(w16))
    np.testing.assert_array_equal(q16, q_w)
    np.testing.assert_array_equal(s16, s_w)


def test_ties_round_half_away_from_zero():
    w = np.zeros((1, 32), np.float32)
    w[0, :4] = [127.0, 0.5, -0.5, -2.5]  # d = 1 exactly
    q, s = ops.quantize_q8(w)
    assert s[0, 0] == np.float16(1.0).view(np.uint16)
    assert list(q[0, :4]) == [127, 1, -1, -3]


def test_dequantize_and_the_embedding_are_q_times_d_exactly():
    rng = np.random.default_rng(1)
    w = weights(rng, 50, 96, "edges")
    q, s = ops.quantize_q8(w)
    np.testing.assert_array_equal(ops.dequantize_q8(q, s), ref.dequantize_q8(q, s))
    ids = rng.integers(0, 50, (3, 7))
    np.testing.assert_array_equal(ops.embedding_forward_q8w(ids, q, s),
                                  ref.embedding_forward_q8w(ids, q, s))


def product_case(seed, rows, out, inn, kind="normal"):
    rng = np.random.default_rng(seed)
    q, s = ops.quantize_q8(weights(rng, out, inn, kind))
    x = rng.standard_normal((rows, inn)).astype(np.float32)
    if kind == "edges":  # x's blocks too: zeros, huge, tiny
        xb = x.reshape(rows, -1, 32)
        pick = rng.integers(0, 4, xb.shape[:2])
        xb[pick == 0] = 0.0
        xb[pick == 1] *= np.float32(1e20)
        xb[pick == 2] *= np.float32(1e-30)
    b = rng.standard_normal(out).astype(np.float32)
    return x, q, s, b


def combination_tol(x, q, s, b):
    """|y − reference| for the float32 combination: each of 16 accumulators takes nb/2 fused
    multiply-adds, then 4 additions and the bias; each step's error is at most u times the sum
    of the magnitudes it has combined, plus u for each block's dw·dx product."""
    nb = q.shape[1] // 32
    mag = ref.linear_forward_q8w(np.abs(x), np.abs(q.astype(np.int16)).astype(np.int8)
                                 if q.min() > -128 else np.abs(q), s)
    return (nb / 2 + 6) * U * mag + 2 * U * np.abs(b)


@pytest.mark.parametrize("kind", ["normal", "edges"])
@pytest.mark.parametrize("out,inn", [(1, 32), (7, 64), (33, 96), (1000, 4096), (130, 1024)])
def test_every_path_gives_the_plain_bits_within_the_bound(out, inn, kind):
    for rows in (1, 2, 3, 8, 20) if out * inn < 10**6 else (1, 5):
        x, q, s, b = product_case(rows * out + inn, rows, out, inn, kind)
        with cap("plain", threads=1):
            plain = ops.linear_forward_q8w(x, q, s, b)
        want = ref.linear_forward_q8w(x, q, s, b)
        assert np.all(np.abs(plain - want) <= combination_tol(x, q, s, b)), (rows, out, inn)
        for path in PATHS:
            for threads in (1, 2):
                with cap(path, threads):
                    got = ops.linear_forward_q8w(x, q, s, b)
                np.testing.assert_array_equal(got, plain, err_msg=f"{path}, {threads} threads, "
                                              f"rows {rows}")
        nob = ops.linear_forward_q8w(x, q, s)  # no bias: the sum alone
        np.testing.assert_array_equal(nob + b, plain)


def test_the_product_is_x_times_w_within_the_quantisation_bounds():
    rng = np.random.default_rng(7)
    rows, out, inn = 4, 300, 512
    w = rng.standard_normal((out, inn)).astype(np.float32)
    x = rng.standard_normal((rows, inn)).astype(np.float32)
    q, s = ops.quantize_q8(w)
    y = ops.linear_forward_q8w(x, q, s)
    wd = ref.dequantize_q8(q, s)
    _, dx = ref.quantize_x_q8(x)
    d = s.view(np.float16).astype(np.float64)
    # W's rounding: Σ |x|·d/2 per block; x's: Σ |q·d|·dx/2 per block; and the combination
    xb, wb = np.abs(x).reshape(rows, -1, 32).sum(-1), np.abs(wd).reshape(out, -1, 32).sum(-1)
    bound = (xb @ (d / 2).T + (dx / 2) @ wb.T + combination_tol(x, q, s, np.zeros(out)))
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.all(np.abs(y - exact) <= bound)
    # and the bound is not vacuous: the error is a fair part of it somewhere
    assert np.abs(y - exact).max() > 0.05 * bound.max()


def test_a_row_of_x_with_inf_or_nan_propagates_the_same_on_every_path():
    x, q, s, b = product_case(3, 3, 40, 96)
    x[0, 5] = np.inf
    x[2, 70] = np.nan
    wd = ref.dequantize_q8(q, s).astype(np.float32)
    results = []
    for path in PATHS:
        with cap(path):
            results.append(ops.linear_forward_q8w(x, q, s, b))
    for got in results:
        np.testing.assert_array_equal(got, results[0])
    assert np.all(np.isnan(results[0][2]))
    np.testing.assert_array_equal(np.isinf(results[0][0]), wd[:, 5] != 0)
    assert np.all(np.sign(results[0][0][wd[:, 5] != 0]) == np.sign(wd[wd[:, 5] != 0, 5]))
    assert np.all(np.isfinite(results[0][1]))


def test_non_finite_scales_give_non_finite_outputs_on_every_path():
    x, q, s, b = product_case(4, 2, 9, 64)
    q[:, :] = 1
    s[3, 1] = np.float16(np.inf).view(np.uint16)
    s[5, 0] = np.float16(np.nan).view(np.uint16)
    results = []
    for path in PATHS:
        with cap(path):
            results.append(ops.linear_forward_q8w(x, q, s, b))
    for got in results:
        np.testing.assert_array_equal(got, results[0])
    assert not np.any(np.isfinite(results[0][:, [3, 5]]))
    assert np.all(np.isfinite(np.delete(results[0], [3, 5], axis=1)))


def ptr(a, ctype):
    return ffi.cast(ctype, a.ctypes.data) if a is not None else ffi.NULL


def c_error():
    return ffi.string(lib.pytfm_last_error()).decode()


@pytest.mark.parametrize("value,what", [(np.inf, "inf"), (np.nan, "NaN"), (1e7, "overflow")])
def test_non_finite_weights_and_overflowing_scales_are_refused_naming_row_and_block(value, what):
    w = np.ones((3, 96), np.float32)
    w[2, 40] = value
    with pytest.raises(ValueError, match=r"row 2, block 1 \(columns 32..63\) of w cannot be "):
        ops.quantize_q8(w)
    q, s = np.full((3, 96), 7, np.int8), np.full((3, 3), 9, np.uint16)
    st = lib.pytfm_quantize_q8(ptr(q, "int8_t *"), ptr(s, "uint16_t *"), ptr(w, "float *"), 3, 96)
    assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert np.all(q == 7) and np.all(s == 9)  # nothing written
    with pytest.raises(ValueError, match=r"row 2, block 1 .* of w16 cannot be quantised"):
        ops.quantize_q8(ops.to_bf16_bits(w) if what != "overflow" else
                        (w.view(np.uint32) >> 16).astype(np.uint16))


def test_in_not_a_multiple_of_the_block_and_null_pointers_are_refused():
    x, q, s, y = (np.zeros((2, 40), np.float32), np.zeros((3, 40), np.int8),
                  np.zeros((3, 2), np.uint16), np.zeros((2, 3), np.float32))
    st = lib.pytfm_linear_forward_q8w(ptr(y, "float *"), ptr(x, "float *"), ptr(q, "int8_t *"),
                                      ptr(s, "uint16_t *"), ffi.NULL, 2, 40, 3)
    assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "in must be a positive multiple of PYTFM_Q8_BLOCK (32), got 40" in c_error()
    with pytest.raises(ValueError, match=r"in a positive multiple of 32"):
        ops.quantize_q8(np.zeros((3, 40), np.float32))
    with pytest.raises(ValueError, match=r"q must have shape \(out, cols\) .* multiple of 32"):
        ops.linear_forward_q8w(x, q, s)
    q, s, x = np.zeros((3, 64), np.int8), np.zeros((3, 2), np.uint16), np.zeros((2, 64), np.float32)
    for name in ("q", "scales", "x", "y"):
        args = {"y": ptr(y, "float *"), "x": ptr(x, "float *"), "q": ptr(q, "int8_t *"),
                "scales": ptr(s, "uint16_t *")}
        args[name] = ffi.NULL
        st = lib.pytfm_linear_forward_q8w(args["y"], args["x"], args["q"], args["scales"],
                                          ffi.NULL, 2, 64, 3)
        assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT
        assert f"{name} must not be NULL" in c_error()
    with pytest.raises(ValueError, match=r"scales must have shape \(3, 2\)"):
        ops.linear_forward_q8w(x, q, np.zeros((3, 1), np.uint16))
    with pytest.raises(TypeError, match=r"q must have dtype int8"):
        ops.linear_forward_q8w(x, q.astype(np.uint8), s)


def test_bad_ids_are_refused_and_nothing_written():
    q, s = np.ones((4, 32), np.int8), np.zeros((4, 1), np.uint16)
    with pytest.raises(ValueError, match=r"ids\[1\] = 4 is outside \[0, 4\)"):
        ops.embedding_forward_q8w(np.array([0, 4]), q, s)
    y = np.full((2, 32), 5.0, np.float32)
    ids = np.array([1, -1], np.int64)
    st = lib.pytfm_embedding_forward_q8w(ptr(y, "float *"), ptr(ids, "int64_t *"),
                                         ptr(q, "int8_t *"), ptr(s, "uint16_t *"), 2, 4, 32)
    assert st == lib.PYTFM_STATUS_OUT_OF_RANGE
    assert np.all(y == 5.0)
