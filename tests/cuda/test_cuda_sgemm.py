"""The GPU SGEMM of cuda/sgemm.cu, run on the CPU by the emulator (cuda/emu): the fast kernel
(pytfm_sgemm_cuda) against the plain one it replaced (pytfm_sgemm_plain_cuda, the oracle) and
against NumPy in float64, on the sizes that break tiled kernels (1, 7, one short of, at and
one past a 128-row tile, two tiles and one past; k = 0, 1, one slice of 8, one past, two past),
every transpose combination, β = 0 (C full of NaN: none may leak) and β = 1.5, both size
classes of tiles, operands offset by one float (the scalar paths), and the emulator's cp.async.

The emulator sees a one-SM "GPU": the 128×128 tiles are taken from two of them on (m or n
past 128), the 64×64 ones below. Each kernel case runs in both thread orders (a missing
barrier, or a missing cp.async wait, reads stale shared memory in one of them) on guarded
buffers whose data start on a 16-byte boundary (the float4 path; tests/cuda_emu.py's Guarded
leaves them 4 bytes past one) unless the test offsets them.
"""

import os

import numpy as np
import pytest

from cuda_emu import CUDA, Aligned, EmuError
from helpers import EPS32, assert_close, bits

BIG, SMS = 128, 1  # cuda/sgemm.cu: Big::BM = Big::BN, SGEMM_SMS under the emulator

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")


def big_tiles(m, n):
    """Whether pytfm_sgemm_cuda takes its 128×128 tiles (two per SM), as sgemm.cu chooses."""
    return -(-m // BIG) * -(-n // BIG) >= 2 * SMS


def operands(rng, m, n, k, trans_a, trans_b):
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    return a, b


def product(a, b, trans_a, trans_b):
    """op(A)·op(B) in float64, and Σ|op(A)||op(B)| (the rounding error's scale)."""
    opa = (a.T if trans_a else a).astype(np.float64)
    opb = (b.T if trans_b else b).astype(np.float64)
    return opa @ opb, np.abs(opa) @ np.abs(opb)


def run(emu, name, g, c0, a, b, m, n, k, trans_a, trans_b, beta):
    """name's C for β·c0 + op(A)·op(B), every array through g (β = 0: C starts as NaN)."""
    c = g(c0) if beta else g.empty((m, n))
    emu.call(name, c, g(a), g(b), m, n, k, trans_a, trans_b, beta)
    return c


# sizes: m and n each 1, 7, 127, 128, 129, 255, 257 somewhere, k each of 0, 1, 8, 9, 17;
# both classes of tiles (big_tiles), row lengths that are and are not multiples of 4
SIZES = [(1, 1, 1), (7, 127, 9), (127, 129, 17), (128, 128, 8), (129, 7, 0), (255, 1, 17),
         (257, 255, 9), (1, 257, 8), (128, 257, 1), (7, 128, 17), (255, 127, 0), (64, 68, 12)]
TRANS = [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_the_sizes_take_both_classes_of_tiles():
    classes = {big_tiles(m, n) for m, n, _ in SIZES}
    assert classes == {True, False}


@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_fast_sgemm_matches_plain_and_float64(emu, order, m, n, k, trans_a, trans_b):
    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    want, bound = product(a, b, trans_a, trans_b)
    g = Aligned()
    for beta in (0.0, 1.5):
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        fast = run(emu, "pytfm_sgemm_cuda", g, c0, a, b, m, n, k, trans_a, trans_b, beta)
        plain = run(emu, "pytfm_sgemm_plain_cuda", g, c0, a, b, m, n, k, trans_a, trans_b, beta)
        exact = want + beta * c0.astype(np.float64)
        atol = 2 * (k + 1) * EPS32 * (bound + abs(beta * c0))
        assert_close("cuda-emu.sgemm.fast", fast, exact, atol=atol)
        assert_close("cuda-emu.sgemm.plain", plain, exact, atol=atol)
        # both sum k in order with fmaf from 0 and finish with β·C + Σ: the same bits
        np.testing.assert_array_equal(bits(fast), bits(plain))
    g.check()


@pytest.mark.parametrize("m,n,k", [(132, 136, 20), (64, 68, 12)], ids=["big", "small"])
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_operands_one_float_off_take_the_scalar_path(emu, order, m, n, k, trans_a, trans_b):
    """m, n, k multiples of 4: aligned, every operand takes float4s; one float off (a CuPy view
    such as x[1:]), that operand takes 4-byte cp.async or scalar loads (a float4 there fails
    the emulated launch as it would fault on the GPU), with the same bits."""
    rng = np.random.default_rng(m + k)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    want, bound = product(a, b, trans_a, trans_b)
    for beta in (0.0, 1.5):
        ga = Aligned()
        ref = run(emu, "pytfm_sgemm_cuda", ga, c0, a, b, m, n, k, trans_a, trans_b, beta)
        assert_close("cuda-emu.sgemm.aligned", ref, want + beta * c0,
                     atol=2 * (k + 1) * EPS32 * (bound + abs(beta * c0)))
        for off in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (3, 2, 1)):  # c, a, b
            gs = [Aligned(o) for o in off]
            c = gs[0](c0) if beta else gs[0].empty((m, n))
            emu.call("pytfm_sgemm_cuda", c, gs[1](a), gs[2](b), m, n, k, trans_a, trans_b, beta)
            np.testing.assert_array_equal(bits(c), bits(ref), err_msg=f"offsets {off}")
            for g in gs:
                g.check()
        ga.check()


def test_errors_and_empty_products(emu):
    x = np.ones(4, np.float32)
    with pytest.raises(EmuError, match="pytfm_sgemm_cuda: m, n, k must be >= 0"):
        emu.call("pytfm_sgemm_cuda", x, x, x, -1, 2, 2, 0, 0, 0.0)
    with pytest.raises(EmuError, match="pytfm_sgemm_cuda: beta must be finite"):
        emu.call("pytfm_sgemm_cuda", x, x, x, 2, 2, 1, 0, 0, float("nan"))
    with pytest.raises(EmuError, match="pytfm_sgemm_plain_cuda: m, n, k must be >= 0"):
        emu.call("pytfm_sgemm_plain_cuda", x, x, x, 2, -2, 2, 0, 0, 0.0)
    emu.call("pytfm_sgemm_cuda", None, x, x, 0, 5, 3, 0, 0, 0.0)  # m = 0: nothing to launch
    emu.call("pytfm_sgemm_cuda", None, x, x, 5, 0, 3, 1, 1, 1.0)
    c = x.copy()
    emu.call("pytfm_sgemm_cuda", c, None, None, 2, 2, 0, 0, 1, 0.5)  # k = 0: C = β·C
    np.testing.assert_array_equal(c, 0.5 * x)


# ---- the emulator's cp.async --------------------------------------------------------------


def cp_async(emu, n=64, groups=3, pending=0, barrier=1, size=16, src_bytes=16, leave_open=0,
             target_global=0, offset=0):
    src = np.arange(groups * 4 * n + 4, dtype=np.float32) + 1
    out = np.zeros(groups * 4 * n, np.float32)
    emu.call("emu_cp_async", out, src[offset:], n, groups, pending, barrier, size, src_bytes,
             leave_open, target_global, stream=False)
    # out[g, t] holds the copy of thread n − 1 − t: the source's chunk n − 1 − t
    return out.reshape(groups, n, 4)[:, ::-1], src[offset:offset + groups * 4 * n].reshape(
        groups, n, 4)


@pytest.mark.parametrize("size", [16, 4])
def test_emulator_cp_async_completes_at_the_wait_for_its_group(emu, size):
    got, src = cp_async(emu, size=size)
    np.testing.assert_array_equal(got, src)
    for pending in (1, 2):  # wait_group N: all but the newest N groups are in
        got, src = cp_async(emu, size=size, pending=pending)
        np.testing.assert_array_equal(got[:3 - pending], src[:3 - pending])
        assert np.isnan(got[3 - pending:]).all(), "a group still in flight was read as done"
    got, src = cp_async(emu, size=size, leave_open=1)  # not committed: no wait covers it
    np.testing.assert_array_equal(got[:2], src[:2])
    assert np.isnan(got[2]).all()
    got, src = cp_async(emu, size=size, src_bytes=8)  # the rest of the 16 bytes zeroed
    np.testing.assert_array_equal(got[..., :2], src[..., :2])
    np.testing.assert_array_equal(got[..., 2:], 0)
    got, src = cp_async(emu, size=size, src_bytes=0)
    np.testing.assert_array_equal(got, 0)


def test_emulator_cp_async_needs_a_barrier_after_the_wait(emu):
    """Another thread's copy is in only once that thread has waited: without the barrier, a
    thread reads the slots of the threads that have not run yet as the NaN fill."""
    n, t = 64, np.arange(64)
    for reverse in (0, 1):
        emu.lib.pytfm_emu_set_order(reverse)
        got, src = cp_async(emu, n=n, barrier=0)
        got = got[:, ::-1]  # back to thread order: thread t read thread n − 1 − t's chunk
        src = src[:, ::-1]
        ran_before = (n - 1 - t < t) if not reverse else (n - 1 - t > t)
        np.testing.assert_array_equal(got[:, ran_before], src[:, ran_before])
        assert np.isnan(got[:, ~ran_before]).all(), "a missing barrier went unseen"
    emu.lib.pytfm_emu_set_order(0)


def test_emulator_cp_async_checks_its_addresses(emu):
    got, src = cp_async(emu, size=4, offset=1)  # 4-byte copies from any float
    np.testing.assert_array_equal(got, src)
    with pytest.raises(EmuError, match=r"thread \(0,0,0\): cp.async of 16 bytes from .* not both "
                                       r"16-byte aligned"):
        cp_async(emu, offset=1)
    with pytest.raises(EmuError, match=r"cp.async to .*, which is not in shared memory"):
        cp_async(emu, target_global=1)
