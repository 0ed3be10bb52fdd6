"""The fused QKV projection's split (pytfm_qkv_split_forward/backward): the same bits as slicing
the fused array and rotating q and k with RoPE, on every kernel version, with its backward the
adjoint of its forward, and bad arguments refused before anything is written."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import assert_close, assert_same_bits_at_any_thread_count, max_isa, seeds
from pytfm import ops

ISAS = ["plain", "portable", "avx2", "avx512"]
sizes = st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 4),
                  st.sampled_from([2, 4, 6, 8, 16, 64]))


def _pos(rng, B, T, shape):
    if shape == "shared":
        return np.arange(T, dtype=np.int64) + int(rng.integers(0, 100))
    return rng.integers(-50, 5000, (B, T)).astype(np.int64)


@pytest.mark.parametrize("isa", ISAS)
@given(size=sizes, pos_kind=st.sampled_from(["shared", "per-batch", "none"]), seed=seeds)
def test_split_is_slicing_then_rope_bit_for_bit(isa, size, pos_kind, seed):
    B, T, H, D = size
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, 3, H, D), dtype=np.float32)
    dq, dk, dv = (rng.standard_normal((B, T, H, D), dtype=np.float32) for _ in range(3))
    pos = None if pos_kind == "none" else _pos(rng, B, T, pos_kind)
    with max_isa(isa):
        q, k, v = ops.qkv_split_forward(qkv, pos)
        dqkv = ops.qkv_split_backward(dq, dk, dv, pos)
        parts = [np.ascontiguousarray(qkv[:, :, i]) for i in range(3)]
        want = [ops.rope_forward(p, pos) for p in parts[:2]] if pos is not None else parts[:2]
        back = [ops.rope_backward(g, pos) for g in (dq, dk)] if pos is not None else [dq, dk]
    for got, ref in zip((q, k, v), want + parts[2:]):
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    np.testing.assert_array_equal(dqkv.view(np.uint32),
                                  np.stack(back + [dv], axis=2).view(np.uint32))


@given(size=sizes, seed=seeds)
def test_backward_is_the_adjoint_of_forward(size, seed):
    """<split(x), g> = <x, split_backward(g)>: the backward is the forward's transpose."""
    B, T, H, D = size
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, 3, H, D), dtype=np.float32)
    g = [rng.standard_normal((B, T, H, D), dtype=np.float32) for _ in range(3)]
    pos = _pos(rng, B, T, "per-batch")
    lhs = sum(float(np.vdot(a.astype(np.float64), b)) for a, b in
              zip(ops.qkv_split_forward(qkv, pos), g))
    rhs = float(np.vdot(qkv.astype(np.float64), ops.qkv_split_backward(*g, pos)))
    assert_close("qkv_split.adjoint", np.float64(lhs), np.float64(rhs), atol=1e-4, rtol=1e-5)


def test_odd_head_dim_without_rope_and_empty_sizes():
    qkv = np.arange(2 * 3 * 3 * 2 * 5, dtype=np.float32).reshape(2, 3, 3, 2, 5)
    q, k, v = ops.qkv_split_forward(qkv)  # D = 5: no rotation, so no even-D rule
    np.testing.assert_array_equal(k, qkv[:, :, 1])
    assert ops.qkv_split_backward(q, k, v).tobytes() == qkv.tobytes()
    empty = np.zeros((0, 4, 3, 2, 8), np.float32)
    assert all(p.shape == (0, 4, 2, 8) for p in ops.qkv_split_forward(empty, np.arange(4)))


def test_same_bits_at_any_thread_count():
    assert_same_bits_at_any_thread_count("""
        import numpy as np
        from pytfm import ops
        rng = np.random.default_rng(3)
        qkv = rng.standard_normal((4, 130, 3, 6, 64), dtype=np.float32)
        pos = np.arange(130, dtype=np.int64)
        out = list(ops.qkv_split_forward(qkv, pos)) + [ops.qkv_split_backward(
            *ops.qkv_split_forward(qkv, pos), pos)]
    """)


def test_c_refuses_overlapping_buffers():
    """The C function itself (what a C program calls) refuses outputs that share memory."""
    from pytfm._core import ffi, lib

    qkv = np.zeros((1, 2, 3, 1, 4), np.float32)
    q = np.zeros((1, 2, 1, 4), np.float32)
    p = lambda a: ffi.from_buffer("float[]", a)  # noqa: E731
    status = lib.pytfm_qkv_split_forward(p(q), p(q), p(q), p(qkv),
                                         ffi.NULL, 1, 2, 1, 4, 0, 1.0, 0)
    assert status != lib.PYTFM_STATUS_OK
    assert b"must not share memory" in ffi.string(lib.pytfm_last_error())
    status = lib.pytfm_qkv_split_forward(p(q), ffi.NULL, p(q), p(qkv), ffi.NULL, 1, 2, 1, 4, 0,
                                         1.0, 0)
    assert b"must not be NULL" in ffi.string(lib.pytfm_last_error())
    assert status != lib.PYTFM_STATUS_OK
