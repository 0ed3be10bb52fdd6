"""The ops on weights held in BF16 only (pytfm_linear_forward_bf16w,
pytfm_embedding_forward_bf16w) and the bits they take (pytfm.ops.to_bf16_bits, from_bf16_bits).

What is checked, and why it is enough:
  - the linear layer on BF16 weights is pytfm_linear_forward_ex at BF16 on the weights'
    float32 widening, bit for bit (y's bits, signed zeros included): on every BF16 path this
    CPU runs (AVX512-BF16, the FP32 kernels of AVX-512, AVX2 and the portable build on rounded
    values, the plain loop), at one and two threads, on drawn shapes and on the sizes where a
    path changes (one row, the few rows the row kernels take, the packed product, a W that
    streams, rows longer than the row kernels' buffers, a W widened a row at a time); weights
    with BF16 subnormals and signed zeros, inf and NaN. That function's own bits are held to
    the reference and the plain loop by test_bf16.py, so these ops inherit its bounds; the
    registry's Check (test_ops.py) holds them to the reference directly;
  - the embedding is the float32 widening of the rows, exactly, for every bit pattern;
  - bad ids and overlapping buffers are refused before anything is written.
"""

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pytfm
from helpers import bf16_path, f32, seeds
from ops_registry import bf16_special
from pytfm import ops
from pytfm._core import ffi, lib

# every BF16 path, best first: AVX512-BF16's kernels, then the FP32 kernels on rounded values
PATHS = ("avx512_bf16", "avx512", "avx2", "portable", "plain")


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@contextlib.contextmanager
def num_threads(t):
    before = pytfm.get_num_threads()
    pytfm.set_num_threads(t)
    try:
        yield
    finally:
        pytfm.set_num_threads(before)


THREADS = pytest.mark.parametrize("threads", (1, 2), ids=lambda t: f"threads{t}")


def make(seed, rows, inn, out, bias, special=True):
    """x (a few signed zeros among normal values), w16 (W's BF16 bits, with subnormals and
    signed zeros when special), b or None, and the float32 W they were made from"""
    rng = np.random.default_rng(seed)
    x = f32(rng, (rows, inn))
    x[rng.random(x.shape) < 0.05] = -0.0
    w = f32(rng, (out, inn))
    w16 = ops.to_bf16_bits(w)
    if special:
        w16 = bf16_special(rng, w16)
    b = f32(rng, (out,)) if bias else None
    return x, w16, b, w


def assert_bits_of_ex(x, w16, b, label):
    got = ops.linear_forward_bf16w(x, w16, b)
    want = ops.linear_forward(x, ops.from_bf16_bits(w16), b, precision="bf16")
    assert got.shape == want.shape, label
    np.testing.assert_array_equal(bits(got), bits(want), err_msg=label)


@st.composite
def shapes(draw):
    """rows: one, the few the row kernels take (2..7), the packed product's; in and out past
    the vector and tile widths, out past 2048 (a W that streams) where the product stays
    small enough for the plain loop"""
    rows = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 17, 65]))
    inn = draw(st.one_of(st.integers(1, 40), st.sampled_from([255, 256, 257, 385, 769, 1000])))
    wide = [2049, 2100] if rows * inn <= 8 * 1000 else []
    out = draw(st.one_of(st.integers(1, 70), st.sampled_from([63, 64, 65, 130] + wide)))
    return rows, inn, out


@THREADS
@pytest.mark.parametrize("path", PATHS)
@given(shape=shapes(), bias=st.booleans(), seed=seeds)
def test_the_bits_of_the_bf16_product_on_every_path(path, threads, shape, bias, seed):
    rows, inn, out = shape
    label = f"{path}, {threads} threads, rows {rows}, in {inn}, out {out}, bias {bias}"
    with bf16_path(path), num_threads(threads):
        x, w16, b, _ = make(seed, rows, inn, out, bias)
        assert_bits_of_ex(x, w16, b, label)
        # and from float32 weights: their BF16 bits give linear_forward's BF16 product on them
        x, w16, b, w = make(seed, rows, inn, out, bias, special=False)
        got = ops.linear_forward_bf16w(x, w16, b)
        want = ops.linear_forward(x, w, b, precision="bf16")
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=label)


# where the paths change (linear.c, fast_impl.h, sgemm_bf16.c): one row of a W in the caches
# and of one that streams (in·out > 2^18, its outputs split among threads); the few rows the
# row kernels take when W is cached (up to 4) and when it streams (up to 7), and one more; the
# packed product widening W in several blocks of rows (2^18 floats each); rows longer than the
# row kernels' rounded copy of x (8192); W rows longer than a widened block (one row a block);
# no rows
THRESHOLDS = ((1, 300, 130), (1, 769, 2049), (4, 300, 130), (5, 300, 130), (7, 769, 2049),
              (8, 769, 2049), (33, 769, 2049), (2, 8200, 40), (9, 8200, 40), (1, 262150, 2),
              (8, 262150, 2), (0, 5, 3))


@THREADS
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows,inn,out", THRESHOLDS)
def test_the_thresholds_of_each_path(path, threads, rows, inn, out):
    with bf16_path(path), num_threads(threads):
        x, w16, b, _ = make(rows * inn + out, rows, inn, out, bias=rows % 2 == 1)
        assert_bits_of_ex(x, w16, b, f"{path}, {threads} threads, {rows}×{inn}×{out}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", (1, 3, 20))
def test_inf_and_nan_weights_reach_the_outputs_they_belong_to(path, rows):
    rng = np.random.default_rng(rows)
    inn, out = 70, 9
    x, w16, b, _ = make(rows, rows, inn, out, bias=True)
    w16[2, 5] = 0x7F80  # +inf
    w16[4, 0] = 0xFF80  # -inf
    w16[6, 69] = 0x7FC1  # a quiet NaN
    w16[7, 33] = 0x7F81  # a signalling one
    x[:, 5] = np.abs(x[:, 5]) + 1.0  # inf·x, never inf·0
    x[:, 0] = rng.random(rows).astype(np.float32) + 1.0
    with bf16_path(path):
        got = ops.linear_forward_bf16w(x, w16, b)
        assert_bits_of_ex(x, w16, b, f"{path}, rows {rows}")
    np.testing.assert_array_equal(got[:, 2], np.inf)
    np.testing.assert_array_equal(got[:, 4], -np.inf)
    assert np.isnan(got[:, 6]).all() and np.isnan(got[:, 7]).all()
    assert np.isfinite(got[:, [0, 1, 3, 5, 8]]).all()


# ---- the embedding --------------------------------------------------------------------------

@given(rows=st.integers(0, 40), vocab=st.integers(1, 20), dim=st.integers(1, 70), seed=seeds)
def test_the_embedding_rows_are_widened_exactly(rows, vocab, dim, seed):
    rng = np.random.default_rng(seed)
    table16 = rng.integers(0, 1 << 16, (vocab, dim)).astype(np.uint16)  # every pattern: NaN too
    ids = rng.integers(0, vocab, rows)
    got = ops.embedding_forward_bf16w(ids, table16)
    np.testing.assert_array_equal(bits(got), table16[ids].astype(np.uint32) << 16)
    same = ops.embedding_forward(ids, ops.from_bf16_bits(table16))
    np.testing.assert_array_equal(bits(got), bits(same))
    # leading dimensions are kept, as embedding_forward keeps them
    assert ops.embedding_forward_bf16w(ids.reshape(1, rows), table16).shape == (1, rows, dim)


@THREADS
def test_a_large_lookup_is_split_among_threads_with_the_same_rows(threads):
    rng = np.random.default_rng(threads)
    table16 = rng.integers(0, 1 << 16, (50, 2000)).astype(np.uint16)
    ids = rng.integers(0, 50, 300)
    with num_threads(threads):
        got = ops.embedding_forward_bf16w(ids, table16)
    np.testing.assert_array_equal(bits(got), table16[ids].astype(np.uint32) << 16)


def test_bad_ids_are_refused_and_nothing_written():
    table16 = np.full((4, 3), 0x3F80, np.uint16)
    with pytest.raises(ValueError, match=r"pytfm_embedding_forward_bf16w: ids\[5\] = 9 is "
                                         r"outside \[0, 4\)"):
        ops.embedding_forward_bf16w(np.array([0, 1, 2, 3, 0, 9]), table16)
    with pytest.raises(ValueError, match=r"ids\[0\] = -1 is outside \[0, 4\)"):
        ops.embedding_forward_bf16w(np.array([-1]), table16)
    # in C: the status, and the output as it was (every id is checked before the first row)
    y = np.full((6, 3), 5.0, np.float32)
    ids = np.array([0, 1, 2, 3, 0, 4])
    st_ = lib.pytfm_embedding_forward_bf16w(ffi.from_buffer("float[]", y),
                                            ffi.from_buffer("int64_t[]", ids),
                                            ffi.from_buffer("uint16_t[]", table16), 6, 4, 3)
    assert st_ == lib.PYTFM_STATUS_OUT_OF_RANGE
    assert ffi.string(lib.pytfm_last_error()).decode() == \
        "pytfm_embedding_forward_bf16w: ids[5] = 4 is outside [0, 4)"
    np.testing.assert_array_equal(y, 5.0)


# ---- argument checks in C ----------------------------------------------------------------------

def test_an_output_sharing_memory_with_the_bf16_weights_is_refused():
    buf = np.zeros(64, np.float32)
    y, w16 = ffi.from_buffer("float[]", buf), ffi.cast("uint16_t *", ffi.from_buffer("float[]",
                                                                                      buf))
    x = ffi.new("float[6]")
    st_ = lib.pytfm_linear_forward_bf16w(y, x, w16, ffi.NULL, 2, 3, 4)
    assert st_ == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert ffi.string(lib.pytfm_last_error()).decode() == \
        "pytfm_linear_forward_bf16w: y and w16 must not share memory"
    ids = ffi.new("int64_t[2]")
    st_ = lib.pytfm_embedding_forward_bf16w(y, ids, w16, 2, 4, 3)
    assert st_ == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert ffi.string(lib.pytfm_last_error()).decode() == \
        "pytfm_embedding_forward_bf16w: y and table must not share memory"


def test_bf16_weights_are_counted_as_two_byte_values():
    # 2^62 BF16 weights are past PTRDIFF_MAX bytes, 2^61 of them are not (as floats they
    # would be): the message names the sizes and the 2-byte elements
    tiny = ffi.new("float[4]")
    w16 = ffi.new("uint16_t[4]")
    assert lib.pytfm_linear_forward_bf16w(tiny, tiny, w16, ffi.NULL, 0, 2**31, 2**31) == \
        lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "out, in = 2147483648, 2147483648 is too large: an array of that many 2-byte" in \
        ffi.string(lib.pytfm_last_error()).decode()


# ---- the bits ------------------------------------------------------------------------------

def every_upper_half():
    """every float32 upper half with lower halves that decide a rounding (0, 1, a tie, either
    side of it, all ones)"""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    return np.concatenate([hi | low for low in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001,
                                                 0xFFFF)]).view(np.float32)


def test_to_bf16_bits_are_the_upper_halves_of_round_bf16():
    x = every_upper_half()
    h = ops.to_bf16_bits(x)
    assert h.dtype == np.uint16 and h.shape == x.shape
    np.testing.assert_array_equal(h.astype(np.uint32) << 16, bits(ops.round_bf16(x)))
    np.testing.assert_array_equal(bits(ops.from_bf16_bits(h)), bits(ops.round_bf16(x)))
    assert np.isnan(ops.from_bf16_bits(h)[np.isnan(x)]).all()  # NaN stays NaN
    # widening is exact: every pattern comes back
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    np.testing.assert_array_equal(bits(ops.from_bf16_bits(every)) >> 16, every)
    assert ops.to_bf16_bits(np.array(1.5, np.float32)).shape == ()


def test_the_bits_helpers_refuse_other_dtypes():
    with pytest.raises(TypeError, match=r"a must be a numpy.ndarray of float32, got float64"):
        ops.to_bf16_bits(np.zeros(3))
    with pytest.raises(TypeError, match=r"a must be a numpy.ndarray of float32, got list"):
        ops.to_bf16_bits([1.0])
    with pytest.raises(TypeError, match=r"got numpy.float32"):
        ops.to_bf16_bits(np.float32(1.0))
    with pytest.raises(TypeError, match=r"h must have dtype uint16 \(BF16 bits\), got float32"):
        ops.from_bf16_bits(np.zeros(3, np.float32))
