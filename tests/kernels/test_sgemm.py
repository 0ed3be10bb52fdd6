"""SGEMM: each fast (packed) kernel this CPU can run — AVX2 (6×16 tiles) and AVX-512 (8×32) —
against the plain one and a float64 product, on sizes around its block edges, every transpose
combination and β in {0, 1, ½}."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import EPS32, assert_close, assert_same_bits_at_any_thread_count, max_isa, seeds
from pytfm._core import check, ffi, lib

# 1, odd, and one either side of the micro-tiles (6×16, 8×32), the row block (144), the column
# panel (2048) and the k slice (384)
edges = st.one_of(
    st.integers(1, 40),
    st.sampled_from([5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 143, 144, 145, 289]),
)
wide = st.one_of(edges, st.sampled_from([2047, 2048, 2049]))
depths = st.one_of(st.integers(1, 40), st.sampled_from([383, 384, 385, 769]))
ISAS = ["avx2", "avx512"]


def sgemm(fn, c, a, b, m, n, k, ta, tb, beta):
    p = lambda x: ffi.from_buffer("float[]", x)  # noqa: E731
    check(fn(p(c), p(a), p(b), m, n, k, ta, tb, beta))


@pytest.mark.parametrize("isa", ISAS)
@given(m=edges, n=wide, k=depths, ta=st.booleans(), tb=st.booleans(),
       beta=st.sampled_from([0.0, 1.0, 0.5]), seed=seeds)
def test_fast_sgemm_matches_plain_and_float64(isa, m, n, k, ta, tb, beta, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
    c0 = rng.standard_normal((m, n), dtype=np.float32)
    if beta == 0.0:
        c0[0, 0] = np.nan  # beta = 0 must not read C
    A, B = (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)
    want = A @ B + (beta * c0.astype(np.float64) if beta else 0.0)
    atol = 2 * k * EPS32 * (abs(A) @ abs(B) + abs(beta * np.nan_to_num(c0)))
    fast, plain = c0.copy(), c0.copy()
    with max_isa(isa):
        sgemm(lib.pytfm_sgemm, fast, a, b, m, n, k, ta, tb, beta)
    sgemm(lib.pytfm_sgemm_plain, plain, a, b, m, n, k, ta, tb, beta)
    assert_close("sgemm.fast_vs_float64", fast, want, atol=atol)
    assert_close("sgemm.plain_vs_float64", plain, want, atol=atol)
    assert_close("sgemm.fast_vs_plain", fast, plain, atol=2 * atol)


def test_sgemm_is_the_same_at_any_thread_count():
    """Bit-identical at 1, 2 and 3 threads, for C split by rows (300×90, two k slices or more)
    and by columns (5×700, 90×300 with trans_a and β = 1), trans_b, and rows past one column
    panel (2100×2050), with every kernel this CPU has."""
    assert_same_bits_at_any_thread_count(
        """
        import numpy as np
        from pytfm._core import ffi, lib
        rng = np.random.default_rng(1)
        p = lambda x: ffi.from_buffer("float[]", x)
        out = []
        for m, n, k, ta, tb in ((300, 90, 700, 0, 0), (5, 700, 300, 0, 0), (90, 300, 800, 1, 0),
                                (300, 90, 400, 0, 1), (2100, 2050, 9, 0, 0)):
            a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
            b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
            for isa in (lib.PYTFM_ISA_PLAIN, lib.PYTFM_ISA_AVX2, lib.PYTFM_ISA_AVX512):
                assert lib.pytfm_set_max_isa(isa) == 0
                c = np.ones((m, n), np.float32)
                assert lib.pytfm_sgemm(p(c), p(a), p(b), m, n, k, ta, tb, float(ta)) == 0
                out += [c, np.int32(lib.pytfm_get_isa())]
        """
    )


def test_sgemm_rejects_bad_arguments():
    buf = ffi.new("float[4]")
    assert lib.pytfm_sgemm(buf, buf, buf, -1, 2, 2, 0, 0, 0.0) == lib.PYTFM_STATUS_INVALID_ARGUMENT
    st = lib.pytfm_sgemm(ffi.NULL, buf, buf, 2, 2, 1, 0, 0, 0.0)
    assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "c must not be NULL" in ffi.string(lib.pytfm_last_error()).decode()


def test_set_max_isa_rejects_unknown_values():
    import pytfm

    assert lib.pytfm_set_max_isa(7) == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "isa must be a pytfm_isa value" in ffi.string(lib.pytfm_last_error()).decode()
    with pytest.raises(ValueError, match="name must be one of auto, plain"):
        pytfm.set_max_isa("sse9")
    assert pytfm.get_isa() in ("plain", "portable", "avx2", "avx512")
