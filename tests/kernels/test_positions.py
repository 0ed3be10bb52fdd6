"""pytfm_sinusoidal_positions (csrc/kernels/positions.c): the one sinusoidal table, used by
pytfm.nn and the C model alike, against the NumPy version of pytfm.reference; the C function's
argument checks (pytfm.ops' are tests/ops_registry.py's bad-input cases).

(That the C model and pytfm.nn agree bit for bit on a sinusoidal config is
tests/c_api/test_c_model.py's.)"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import pytfm
from helpers import last_error
from pytfm import nn, ops, reference
from pytfm._core import ffi, lib


def ulps_off(got, ref):
    """|got − ref| in float32 ulps of max(|ref|, 2^-8): values are in [-1, 1], and near a zero
    of sin or cos an absolute error of the angle's rounding is what counts."""
    scale = np.spacing(np.maximum(np.abs(ref), 2.0**-8).astype(np.float32)).astype(np.float64)
    return np.max(np.abs(got.astype(np.float64) - ref) / scale, initial=0.0)


@given(T=st.integers(0, 300), half=st.integers(1, 200))
def test_the_table_is_the_reference_to_a_few_ulps(T, half):
    dim = 2 * half
    pe = ops.sinusoidal_positions(T, dim)
    assert pe.shape == (T, dim) and pe.dtype == np.float32 and pe.flags.c_contiguous
    assert ulps_off(pe, reference.sinusoidal_positions(T, dim)) <= 4


def test_known_values_and_nn_uses_it():
    pe = ops.sinusoidal_positions(3, 4)
    assert np.array_equal(pe[0], np.float32([0, 1, 0, 1]))
    expect = [np.sin(2.0), np.cos(2.0), np.sin(2.0 / 100), np.cos(2.0 / 100)]
    assert np.array_equal(pe[2], np.float32(expect))
    assert np.array_equal(nn.sinusoidal_positions(50, 16), ops.sinusoidal_positions(50, 16))
    assert ops.sinusoidal_positions(0, 2).shape == (0, 2)


def test_the_same_bits_at_any_thread_count():
    before = pytfm.get_num_threads()
    try:
        tables = []
        for threads in (1, 2, 3):
            pytfm.set_num_threads(threads)
            tables.append(ops.sinusoidal_positions(600, 96).tobytes())  # several row tasks
    finally:
        pytfm.set_num_threads(before)
    assert tables[0] == tables[1] == tables[2]


def test_the_c_function_checks_its_arguments_and_writes_nothing():
    buf = ffi.new("float[16]", [7.0] * 16)
    for pe, T, dim, message in [
        (buf, 2, 3, "dim must be even and >= 2, got 3"),
        (buf, 2, 0, "dim must be even and >= 2, got 0"),
        (buf, 2, -2, "dim must be even and >= 2, got -2"),
        (buf, -1, 4, "T must be >= 0, got -1"),
        (ffi.NULL, 2, 4, "pe must not be NULL"),
        (buf, 2**62, 4, "T, dim = 4611686018427387904, 4 is too large"),
    ]:
        assert lib.pytfm_sinusoidal_positions(pe, T, dim) == lib.PYTFM_STATUS_INVALID_ARGUMENT
        assert last_error().startswith(f"pytfm_sinusoidal_positions: {message}"), last_error()
        assert list(buf) == [7.0] * 16
    assert lib.pytfm_sinusoidal_positions(ffi.NULL, 0, 4) == lib.PYTFM_STATUS_OK  # no elements
    assert lib.pytfm_sinusoidal_positions(buf, 4, 4) == lib.PYTFM_STATUS_OK
    assert np.array_equal(np.frombuffer(ffi.buffer(buf), np.float32).reshape(4, 4),
                          ops.sinusoidal_positions(4, 4))
