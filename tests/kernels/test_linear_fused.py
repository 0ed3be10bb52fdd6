"""The linear layer's fused output pass: pytfm_linear_gelu_forward (h = x·Wᵀ + b, y = gelu(h))
against the unfused ops, bit for bit, with every kernel this CPU has; and linear_forward's bias,
now the product's epilogue, against sgemm followed by `+= b`."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from helpers import assert_close, assert_same_bits_at_any_thread_count, bits, max_isa, seeds
from pytfm import ops, reference
from pytfm._core import ffi, lib

ISAS = ["plain", "avx2", "avx512"]
# 1, odd, and one either side of the micro-tiles (6×16, 8×32) and of the row block (96)
rows_ = st.one_of(st.integers(1, 20), st.sampled_from([31, 32, 33, 95, 96, 97, 130]))
ins = st.one_of(st.integers(1, 12), st.sampled_from([31, 193, 385]))
outs = st.one_of(st.integers(1, 20), st.sampled_from([31, 32, 33, 47, 48, 49, 65, 300]))


def p(x):
    return ffi.from_buffer("float[]", x)


def layer(rng, rows, inn, out, bias):
    x = rng.standard_normal((rows, inn), dtype=np.float32)
    w = rng.standard_normal((out, inn), dtype=np.float32) / np.float32(np.sqrt(inn))
    b = rng.standard_normal(out, dtype=np.float32) if bias else None
    return x, w, b


@pytest.mark.parametrize("isa", ISAS)
@given(rows=rows_, inn=ins, out=outs, bias=st.booleans(), seed=seeds)
def test_linear_gelu_is_linear_then_gelu_bit_for_bit(isa, rows, inn, out, bias, seed):
    x, w, b = layer(np.random.default_rng(seed), rows, inn, out, bias)
    with max_isa(isa):
        y, h = ops.linear_gelu_forward(x, w, b)
        h_unfused = ops.linear_forward(x, w, b)
        y_unfused = ops.gelu_forward(h_unfused)
    np.testing.assert_array_equal(bits(h), bits(h_unfused))
    np.testing.assert_array_equal(bits(y), bits(y_unfused))
    h_ref = reference.linear_forward(x, w, b)
    atol = 4 * inn * float(np.finfo(np.float32).eps) * (abs(x) @ abs(w.T) + abs(b if bias else 0))
    assert_close("linear_gelu.h", h, h_ref, atol=atol)
    assert_close("linear_gelu.y", y, reference.gelu_forward(h), atol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
@given(rows=rows_.filter(lambda r: r > 1), inn=ins, out=outs, seed=seeds)
def test_linear_bias_is_sgemm_then_add(isa, rows, inn, out, seed):
    """The bias as the product's epilogue adds b[o] to the finished sum, one float addition,
    as the separate pass over y did before it (one row is a matrix-vector product instead, whose
    kernel adds its bias itself, and so are up to 4 rows of a W this small on the fast
    kernels: test_gemv.py)."""
    assume(isa == "plain" or rows > 4)
    x, w, b = layer(np.random.default_rng(seed), rows, inn, out, True)
    y_sgemm = np.empty((rows, out), np.float32)
    with max_isa(isa):
        y = ops.linear_forward(x, w, b)
        assert lib.pytfm_sgemm(p(y_sgemm), p(x), p(w), rows, out, inn, 0, 1, 0.0) == 0
    np.testing.assert_array_equal(bits(y), bits(y_sgemm + b))


def test_linear_gelu_keeps_leading_axes():
    x, w, b = layer(np.random.default_rng(0), 6, 5, 7, True)
    y, h = ops.linear_gelu_forward(x.reshape(2, 3, 5), w, b)
    assert y.shape == h.shape == (2, 3, 7)
    np.testing.assert_array_equal(bits(h.reshape(6, 7)), bits(ops.linear_forward(x, w, b)))


def test_linear_gelu_rejects_bad_arguments():
    """The C function's own checks (pytfm.ops' are tests/ops_registry.py's bad-input cases)."""
    x, w, b = layer(np.random.default_rng(0), 4, 3, 5, True)
    y, h = np.empty((4, 5), np.float32), np.empty((4, 5), np.float32)
    f = lib.pytfm_linear_gelu_forward
    cases = [
        ((ffi.NULL, p(h), p(x), p(w), p(b), 4, 3, 5), "y must not be NULL"),
        ((p(y), ffi.NULL, p(x), p(w), p(b), 4, 3, 5), "h must not be NULL"),
        ((p(y), p(h), ffi.NULL, p(w), p(b), 4, 3, 5), "x must not be NULL"),
        ((p(y), p(h), p(x), ffi.NULL, p(b), 4, 3, 5), "w must not be NULL"),
        ((p(y), p(y), p(x), p(w), p(b), 4, 3, 5), "y and h must not share memory"),
        ((p(y), p(h), p(y), p(w), p(b), 4, 3, 5), "y and x must not share memory"),
        ((p(y), p(h), p(x), p(w), p(h), 4, 3, 5), "h and b must not share memory"),
        ((p(y), p(h), p(x), p(w), p(b), -1, 3, 5), "rows must be >= 0"),
        ((p(y), p(h), p(x), p(w), p(b), 4, 0, 5), "in must be >= 1"),
    ]
    for args, message in cases:
        y[:], h[:] = 7, 7
        assert f(*args) == lib.PYTFM_STATUS_INVALID_ARGUMENT, message
        assert message in ffi.string(lib.pytfm_last_error()).decode()
        assert (y == 7).all() and (h == 7).all(), f"{message}: an output was written"
    assert f(p(y), p(h), p(x), p(w), ffi.NULL, 0, 3, 5) == 0  # no rows, no bias: nothing to do


def test_linear_gelu_is_the_same_at_any_thread_count():
    """Bit-identical at 1, 2 and 3 threads, C split by rows (300×90) and by columns (5×1100, past
    one column panel), one row (a product of its own), with every kernel this CPU has."""
    assert_same_bits_at_any_thread_count(
        """
        import numpy as np
        from pytfm import ops
        from pytfm._core import lib
        rng = np.random.default_rng(1)
        out = []
        for rows, inn, o in ((300, 200, 90), (5, 300, 1100), (1, 700, 900)):
            x = rng.standard_normal((rows, inn), dtype=np.float32)
            w = rng.standard_normal((o, inn), dtype=np.float32)
            b = rng.standard_normal(o, dtype=np.float32)
            for isa in (lib.PYTFM_ISA_PLAIN, lib.PYTFM_ISA_AVX2, lib.PYTFM_ISA_AVX512):
                assert lib.pytfm_set_max_isa(isa) == 0
                out += [*ops.linear_gelu_forward(x, w, b), np.int32(lib.pytfm_get_isa())]
        """
    )
