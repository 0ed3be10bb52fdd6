"""The tensor-core product on BF16 operands in memory on the CPU emulator (cuda/emu):
pytfm_gemm_bf16_cuda (cuda/sgemm_tc.cu, raw BF16 bits in, FP32 C) against the float64
reference, with test_cuda_tensor_core.py's derived bound (its BF16 inputs need no rounding: the
bound is the sums' alone); the route of pytfm_sgemm_ex_cuda's BF16 product that rounds the FP32
operands into stream scratch first and runs that kernel, whose bits must be the in-block
route's on every shape (so no result depends on the crossover or on the workspace); the
fragment loads' bank conflicts; the argument checks.

The BF16-operand kernel takes slices of 32 along k, so the shapes here put k at one slice
short of full, one, several, and 0; its copies are 16-byte ones (aligned bases, rows a multiple
of 8 elements), 4-byte ones (even) and 2-byte loads (a view offset by one element, or odd
rows): the offset views must not move a bit.
"""

import os

import cffi
import numpy as np
import pytest
from test_cuda_tensor_core import BF16, bf16_rn, bound, ldmatrix_counts, operands

from cuda_emu import CUDA, Aligned, EmuError, Guarded
from helpers import assert_close, bits

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")

TRANS = [(0, 0), (0, 1), (1, 0), (1, 1)]
# one full tile (k one slice of 32, and three), ragged m, n and k (k 1, 9, 33, 40, 28: one
# slice short of full, one and a bit, several), more than one tile each way, k = 0
SIZES = [(128, 128, 32), (128, 128, 96), (7, 9, 1), (129, 130, 33), (33, 257, 40),
         (257, 20, 9), (65, 72, 28), (5, 6, 0)]


def to_bits(x):
    """float32 -> the uint16 BF16 bits of cvt.rn.bf16.f32 (to nearest even, subnormals kept)"""
    return (bf16_rn(x).view(np.uint32) >> 16).astype(np.uint16)


def widen(h):
    """uint16 BF16 bits -> their float32 values"""
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


class Halves(Guarded):
    """Guarded uint16 buffers whose data start `offset` elements past a 16-byte boundary: 0
    takes the 16-byte copies (where rows allow), 2 the 4-byte ones, 1 (or 3) the 2-byte loads.
    The margins hold 0xFFF9, a BF16 NaN: a read past an edge spoils the result."""

    def __init__(self, offset=0):
        super().__init__()
        self.offset = offset

    def __call__(self, a, dtype=np.uint16):
        a = np.asarray(a, np.uint16)
        big = np.full(a.size + 2 * 48 + 8, 0xFFF9, np.uint16)
        start = 48 + (-(big.ctypes.data // 2 + 48)) % 8 + self.offset
        big[start:start + a.size] = a.ravel()
        self.buffers.append((big, start, start + a.size))
        view = big[start:start + a.size].reshape(a.shape)
        assert not a.size or (view.ctypes.data % 16 == 0) == (self.offset % 8 == 0)
        return view

    def check(self):
        for big, start, end in self.buffers:
            assert (big[:start] == 0xFFF9).all() and (big[end:] == 0xFFF9).all(), \
                "a kernel wrote outside its buffer"


def p16(emu, h):
    return emu.ffi.cast("uint16_t *", h.ctypes.data)


def gemm_bf16(emu, g, c0, ha, hb, m, n, k, trans_a, trans_b, beta, h=None):
    """pytfm_gemm_bf16_cuda on the bits ha, hb (in h's buffers, Halves() by default)"""
    h = h or Halves()
    c = g(c0) if beta else g.empty((m, n))
    emu.call("pytfm_gemm_bf16_cuda", c, p16(emu, h(ha)), p16(emu, h(hb)), m, n, k, trans_a,
             trans_b, beta)
    h.check()
    return c


def want_and_bound(ha, hb, c0, beta, trans_a, trans_b):
    opa = widen(ha.T if trans_a else ha).astype(np.float64)
    opb = widen(hb.T if trans_b else hb).astype(np.float64)
    bc = beta * c0.astype(np.float64)
    return opa @ opb + bc, bound(opa.shape[1], np.abs(opa) @ np.abs(opb) + np.abs(bc))


def hostile_values(rng, shape):
    """normal values with subnormals, exact BF16 ties (to even both ways), signed zeros and
    values that round up across a power of two: where two roundings would part"""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=min(flat.size, 6 * max(1, flat.size // 40)),
                       replace=False)
    specials = np.array([1.5e-39, -3e-41, 1 + 2**-8, 1 + 3 * 2**-8, -0.0, 2 - 2**-9],
                        np.float32)
    flat[picks] = specials[np.arange(picks.size) % specials.size]
    return x


@pytest.fixture
def route(emu):
    """pytfm__emu_sgemm_bf16_route of the emulator library (an emulator build's test hook):
    route(0) rounds in the block, route(1) converts first; -1 again after the test."""
    ffi = cffi.FFI()
    ffi.cdef("void pytfm__emu_sgemm_bf16_route(int route);")
    lib = ffi.dlopen(os.path.join(emu.dir, "libpytfm_emu.so"))
    yield lib.pytfm__emu_sgemm_bf16_route
    lib.pytfm__emu_sgemm_bf16_route(-1)


def sgemm_ex16(emu, g, c0, a, b, m, n, k, trans_a, trans_b, beta, ga=None, gb=None):
    c = g(c0) if beta else g.empty((m, n))
    emu.call("pytfm_sgemm_ex_cuda", c, (ga or g)(a), (gb or g)(b), m, n, k, trans_a, trans_b,
             beta, BF16)
    return c


def workspace(emu):
    got = emu.ffi.new("int64_t[3]")
    emu.call("pytfm_cuda_workspace_get", emu.ffi.NULL, got, got + 1, got + 2, stream=False)
    return tuple(got)


# ---- the BF16-operand kernel ------------------------------------------------------------------


@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_bf16_operands_match_the_reference(emu, m, n, k, trans_a, trans_b):
    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    ha, hb = to_bits(a), to_bits(b)
    g = Aligned()
    for beta in (0.0, 1.0):
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        got = gemm_bf16(emu, g, c0, ha, hb, m, n, k, trans_a, trans_b, beta)
        want, atol = want_and_bound(ha, hb, c0, beta, trans_a, trans_b)
        assert_close("cuda-emu.gemm_bf16", got, want, atol=atol, rtol=0.0)
    g.check()


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
@pytest.mark.parametrize("mode", ["wait", "eager"])
def test_both_orders_both_modes_and_offset_views_give_the_same_bits(emu, order, mode, trans_a,
                                                                      trans_b):
    """As the FP32-operand kernel's test: a missing barrier or wait, a copy landing under a
    reader, or a fallback copy that lands elsewhere than the 16-byte one moves a bit. Operands
    offset by 2 elements take 4-byte cp.async, by 1 or 3 the 2-byte loads; C offset by a float.
    And the bits are pytfm_sgemm_ex_cuda's in BF16 on the widened operands."""
    m, n, k = 132, 136, 72  # two tiles each way, three slices of 32 (the last ragged)
    rng = np.random.default_rng(23)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    ha, hb = to_bits(a), to_bits(b)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    emu.lib.pytfm_emu_set_cp_async(mode == "eager")
    try:
        g = Aligned()
        base = gemm_bf16(emu, g, c0, ha, hb, m, n, k, trans_a, trans_b, 1.0)
        want, atol = want_and_bound(ha, hb, c0, 1.0, trans_a, trans_b)
        assert_close("cuda-emu.gemm_bf16.aligned", base, want, atol=atol, rtol=0.0)
        for off in (1, 2, 3):
            got = gemm_bf16(emu, g, c0, ha, hb, m, n, k, trans_a, trans_b, 1.0, Halves(off))
            np.testing.assert_array_equal(bits(got), bits(base), err_msg=f"offset {off}")
        got = gemm_bf16(emu, Aligned(1), c0, ha, hb, m, n, k, trans_a, trans_b, 1.0)
        np.testing.assert_array_equal(bits(got), bits(base), err_msg="C offset")
        ex = sgemm_ex16(emu, g, c0, widen(ha), widen(hb), m, n, k, trans_a, trans_b, 1.0)
        np.testing.assert_array_equal(bits(ex), bits(base), err_msg="pytfm_sgemm_ex_cuda")
        g.check()
    finally:
        emu.lib.pytfm_emu_set_cp_async(0)


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_odd_rows_take_the_narrow_copies_and_keep_the_bits(emu, trans_a, trans_b):
    """Rows of an odd number of elements (k = 37, m = 35, n = 41): every other row starts at
    an odd element, so the 2-byte loads, against pytfm_sgemm_ex_cuda's bits; rows of 2 mod 8
    (k = 34, m = 42, n = 50) the 4-byte copies."""
    for m, n, k in ((35, 41, 37), (42, 50, 34)):
        rng = np.random.default_rng(m + n + k)
        a, b = operands(rng, m, n, k, trans_a, trans_b)
        ha, hb = to_bits(a), to_bits(b)
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        g = Aligned()
        got = gemm_bf16(emu, g, c0, ha, hb, m, n, k, trans_a, trans_b, 1.0)
        ex = sgemm_ex16(emu, g, c0, widen(ha), widen(hb), m, n, k, trans_a, trans_b, 1.0)
        np.testing.assert_array_equal(bits(got), bits(ex))
        g.check()


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 1)])
@pytest.mark.parametrize("mode", ["wait", "eager"])
def test_a_warp_running_ahead_changes_nothing(emu, mode, trans_a, trans_b):
    """The emulator's third order (each warp alone to its next barrier): a tile refilled, or
    read, without a barrier against the other warps' use of it shows here."""
    m, n, k = 132, 136, 136  # five slices of 32: every tile of the ring refilled
    rng = np.random.default_rng(29)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    ha, hb = to_bits(a), to_bits(b)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    g = Aligned()
    base = gemm_bf16(emu, g, c0, ha, hb, m, n, k, trans_a, trans_b, 1.0)
    emu.lib.pytfm_emu_set_cp_async(mode == "eager")
    emu.lib.pytfm_emu_set_order(2)
    try:
        got = gemm_bf16(emu, g, c0, ha, hb, m, n, k, trans_a, trans_b, 1.0)
    finally:
        emu.lib.pytfm_emu_set_order(0)
        emu.lib.pytfm_emu_set_cp_async(0)
    np.testing.assert_array_equal(bits(got), bits(base))


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_the_fragment_loads_are_bank_conflict_free(emu, trans_a, trans_b):
    """Every ldmatrix from the tiles as the copies laid them (swz<4> for rows of 32 along k,
    swz<16> for rows along m or n): one wavefront per matrix; per block and k step of 16, 4
    warps × (4 for A + 4 for B) x4 loads."""
    m, n, k = 128, 128, 96
    rng = np.random.default_rng(5)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    before = ldmatrix_counts(emu)
    gemm_bf16(emu, Aligned(), None, to_bits(a), to_bits(b), m, n, k, trans_a, trans_b, 0.0)
    calls, matrices, waves = (x - y for x, y in zip(ldmatrix_counts(emu), before))
    assert calls == 4 * 8 * (k // 16)
    assert matrices == 4 * calls
    assert waves == matrices, f"{waves - matrices} extra wavefronts: bank conflicts"


def test_nan_and_specials_pass_as_the_widened_values(emu):
    """A NaN's bits stay a NaN; infinities and subnormal BF16 values enter as themselves"""
    m, n, k = 16, 8, 16
    ha = np.full((m, k), 0x3F80, np.uint16)  # 1.0
    hb = np.zeros((k, n), np.uint16)
    hb[0, 0], hb[1, 1], hb[2, 2] = 0x7FC1, 0x7F80, 0x0001  # NaN, inf, the least subnormal
    got = gemm_bf16(emu, Aligned(), None, ha, hb, m, n, k, 0, 0, 0.0)
    assert np.isnan(got[:, 0]).all() and (got[:, 1] == np.inf).all()
    np.testing.assert_array_equal(got[:, 2], widen(np.uint16(1)))
    np.testing.assert_array_equal(got[:, 3:], 0.0)


def test_the_arguments_are_checked(emu):
    name = "pytfm_gemm_bf16_cuda"
    c = np.zeros(4, np.float32)
    h = np.zeros(8, np.uint16)
    p = p16(emu, h)
    null = emu.ffi.NULL
    for args, msg in (
            ((c, p, p, -1, 2, 2), r"m, n, k must be >= 0, got -1, 2, 2"),
            ((c, p, p, 2, 2, -3), r"m, n, k must be >= 0, got 2, 2, -3"),
            ((c, p, p, 2**40, 2**40, 1), r"m, n = 1099511627776, 1099511627776 is too large"),
            ((c, p, p, 1, 1, 2**62), r"m, k = 1, 4611686018427387904 is too large: an array "
                                     r"of that many 2-byte elements"),
            ((None, p, p, 2, 2, 2), r"c must not be NULL"),
            ((c, null, p, 2, 2, 2), r"a must not be NULL"),
            ((c, p, null, 2, 2, 2), r"b must not be NULL")):
        with pytest.raises(EmuError, match=rf"status 1: {name}: {msg}"):
            emu.call(name, *args, 0, 0, 0.0)
    with pytest.raises(EmuError, match=rf"status 1: {name}: beta must be finite, got inf"):
        emu.call(name, c, p, p, 2, 2, 2, 0, 0, float("inf"))
    with pytest.raises(EmuError, match=rf"status 1: {name}: c and a must not share memory"):
        emu.call(name, c, emu.ffi.cast("uint16_t *", c.ctypes.data), p, 2, 2, 2, 0, 0, 0.0)
    c[:] = 2.0
    emu.call(name, c, null, null, 2, 2, 0, 0, 0, 0.5)  # k = 0: C = β·C
    np.testing.assert_array_equal(c, 1.0)
    emu.call(name, None, p, p, 0, 3, 2, 0, 0, 0.0)  # m = 0: nothing to do


# ---- the FP32-operand bf16 product through the conversion ------------------------------------


@pytest.mark.parametrize("m,n,k", [(132, 136, 72), (7, 9, 1), (35, 41, 37), (129, 20, 50),
                                   (5, 6, 0)])
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_converting_first_gives_the_in_block_bits(emu, route, m, n, k, trans_a, trans_b):
    """pytfm_sgemm_ex_cuda in BF16 both ways (route 0: each slice rounded in the block; 1: the
    operands rounded into stream scratch, rows padded to 8 elements, then the BF16-operand
    kernel): the same bits, on values where two roundings would part (subnormals, ties, signed
    zeros), on aligned operands and on views one float off (the conversion's scalar loads),
    ragged and odd shapes; and pytfm_gemm_bf16_cuda's on the operands rounded in NumPy."""
    rng = np.random.default_rng(m * 3 + n * 5 + k)
    a = hostile_values(rng, (k, m) if trans_a else (m, k))
    b = hostile_values(rng, (n, k) if trans_b else (k, n))
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    g = Aligned()
    route(0)
    base = sgemm_ex16(emu, g, c0, a, b, m, n, k, trans_a, trans_b, 1.0)
    route(1)
    for ga, gb in ((g, g), (Aligned(1), Aligned(3))):
        got = sgemm_ex16(emu, g, c0, a, b, m, n, k, trans_a, trans_b, 1.0, ga, gb)
        np.testing.assert_array_equal(bits(got), bits(base))
        ga.check()
        gb.check()
    got = sgemm_ex16(emu, g, None, a, b, m, n, k, trans_a, trans_b, 0.0)
    route(0)
    np.testing.assert_array_equal(
        bits(got), bits(sgemm_ex16(emu, g, None, a, b, m, n, k, trans_a, trans_b, 0.0)))
    direct = gemm_bf16(emu, g, c0, to_bits(a), to_bits(b), m, n, k, trans_a, trans_b, 1.0)
    np.testing.assert_array_equal(bits(direct), bits(base))
    g.check()


@pytest.mark.parametrize("trans_a", [0, 1])
def test_the_conversion_rounds_as_the_block_does(emu, route, trans_a):
    """Each value of A alone in its product (B a scaled identity: C = 2^100·r(A), exact), on
    values where BF16 roundings part: subnormals (kept, not flushed as the CPU's BF16 does),
    ties both ways (to even), carries across a power of two. Both routes give
    2^100·cvt.rn.bf16(A) bit for bit (the sums would hide a subnormal; one product does not)."""
    m = k = n = 16
    vals = np.array([1.5e-39, -3e-41, 2**-133, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8),
                     2 - 2**-9, -0.0, 0.0, 1 + 2**-9 + 2**-20, 3.0, -1e-38, 7e-39, 1 / 3,
                     -2 / 3, 65504.0], np.float32)
    a = np.stack([np.roll(vals, i) for i in range(m)]).astype(np.float32)
    b = (np.eye(k) * 2.0**100).astype(np.float32)
    # + 0: the accumulator starts at +0, and +0 + −0 is +0
    want = (bf16_rn(a).astype(np.float64) * 2.0**100).astype(np.float32) + np.float32(0.0)
    g = Aligned()
    at = np.ascontiguousarray(a.T) if trans_a else a
    for r in (0, 1):
        route(r)
        got = sgemm_ex16(emu, g, None, at, b, m, n, k, trans_a, 0, 0.0)
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"route {r}")
    g.check()

def test_the_conversion_takes_its_scratch_from_the_workspace_or_the_stream(emu, route):
    """Converting takes 2·(rows·padded row) bytes per operand of stream scratch: from the
    workspace when it holds them, allocated on the stream when not (a miss), the same bits
    either way; the in-block route, and the automatic choice at these sizes, take none."""
    m, n, k = 40, 24, 20  # A [40, 20] -> rows of 24; B [20, 24] -> rows of 24
    rng = np.random.default_rng(8)
    a, b = operands(rng, m, n, k, 0, 0)
    need = 2 * (m * 24 + k * 24)
    g = Aligned()
    buf = np.zeros(need + 256, np.uint8)
    buf = buf[-buf.ctypes.data % 256:][:need]
    try:
        emu.call("pytfm_cuda_workspace_set", emu.ffi.NULL, emu.ffi.NULL, 0, stream=False)
        route(-1)
        auto = sgemm_ex16(emu, g, None, a, b, m, n, k, 0, 0, 0.0)
        assert workspace(emu) == (0, 0, 0), "the estimate converts a product this small"
        route(1)
        missed = sgemm_ex16(emu, g, None, a, b, m, n, k, 0, 0, 0.0)
        assert workspace(emu) == (0, need, 1)
        emu.call("pytfm_cuda_workspace_set", emu.ffi.NULL,
                 emu.ffi.cast("void *", buf.ctypes.data), need, stream=False)
        held = sgemm_ex16(emu, g, None, a, b, m, n, k, 0, 0, 0.0)
        assert workspace(emu) == (need, need, 0)
    finally:
        emu.call("pytfm_cuda_workspace_clear", emu.ffi.NULL, stream=False)
    np.testing.assert_array_equal(bits(missed), bits(auto))
    np.testing.assert_array_equal(bits(held), bits(auto))
    g.check()



# ---- pytfm.ops.gemm_bf16 -----------------------------------------------------------------------


def test_ops_gemm_bf16_is_the_kernel_and_checks_its_arguments(cp, emu):
    from pytfm import ops

    m, n, k = 20, 12, 18
    rng = np.random.default_rng(4)
    a, b = operands(rng, m, n, k, 1, 0)
    ha, hb = to_bits(a), to_bits(b)
    got = ops.gemm_bf16(cp.asarray(ha), cp.asarray(hb), trans_a=True)
    want = gemm_bf16(emu, Aligned(), None, ha, hb, m, n, k, 1, 0, 0.0)
    np.testing.assert_array_equal(bits(np.asarray(got)), bits(want))
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    c = cp.asarray(c0)
    assert ops.gemm_bf16(cp.asarray(ha), cp.asarray(hb), trans_a=True, c=c, beta=1.0) is c
    np.testing.assert_array_equal(
        bits(np.asarray(c)), bits(gemm_bf16(emu, Aligned(), c0, ha, hb, m, n, k, 1, 0, 1.0)))
    da, db = cp.asarray(ha), cp.asarray(hb)
    with pytest.raises(TypeError, match=r"a must have dtype uint16, got float32"):
        ops.gemm_bf16(cp.asarray(a), db, trans_a=True)
    with pytest.raises(ValueError, match=r"b must have k = 20 rows \(op\(a\) is \[18, 20\], "
                                         r"trans_b=False\), got b.shape \(18, 12\)"):
        ops.gemm_bf16(da, db)
    with pytest.raises(ValueError, match=r"beta must be 0 without c"):
        ops.gemm_bf16(da, db, trans_a=True, beta=1.0)
    with pytest.raises(ValueError, match=r"c must have shape \(20, 12\)"):
        ops.gemm_bf16(da, db, trans_a=True, c=cp.asarray(c0[:, :5].copy()), beta=1.0)
    with pytest.raises(TypeError, match=r"trans_a"):
        ops.gemm_bf16(da, db, trans_a=1)
    with pytest.raises(TypeError, match=r"gemm_bf16 runs on CuPy arrays only"):
        ops.gemm_bf16(ha, hb, trans_a=True)


def test_the_bench_rows_take_the_shapes_the_kernel_takes(monkeypatch):
    """bench/cuda_ops.py's BF16-operand rows: 4096³ (held to the 0.6× target there) and the
    linear layer's three products, each operand's shape as pytfm_gemm_bf16_cuda reads it"""
    monkeypatch.syspath_prepend(os.path.dirname(CUDA))  # the checkout (bench/ is not installed)
    import bench.cuda_ops as bench

    rows, inn, out = bench.LINEAR_SHAPE
    cases = bench.bf16_operand_cases()
    assert [c[1:6] for c in cases] == [
        (4096, 4096, 4096, 0, 1), (4096, 4096, 4096, 0, 0), (4096, 4096, 4096, 1, 0),
        (rows, out, inn, 0, 1), (rows, inn, out, 0, 0), (out, inn, rows, 1, 0)]
    assert bench.bf16_operand_shapes(rows, out, inn, 0, 1) == ((rows, inn), (out, inn))
    assert bench.bf16_operand_shapes(out, inn, rows, 1, 0) == ((rows, out), (rows, inn))
    assert bench.tensor_core_target("bf16", 4096) == ("SGEMM BF16", 0.6)
