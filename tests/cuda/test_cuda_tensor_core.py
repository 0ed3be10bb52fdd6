"""The tensor-core products on the CPU emulator (cuda/emu): the two mma instructions and the
roundings that feed them (cuda/mma.cuh) against a plain product, the eager cp.async mode, and
pytfm_sgemm_ex_cuda / the linear layer's _ex twins at PYTFM_PRECISION_TF32 and _BF16
(cuda/sgemm_tc.cu) against the float64 reference on inputs rounded to the format.

The bound of a product (derived, not tuned): with the inputs rounded as the kernel rounds them,
each product is exact in float32 (TF32: 11 × 11 significant bits; BF16: 8 × 8), so the whole
error is the sums': k products, then β·C (one rounding of β·C, one add). Each of the at most
k + 2 roundings a term meets on its way is at most 2u of the partial sum it rounds (u = 2^-24:
2u also covers an accumulator that truncates instead of rounding to nearest, as the hardware's
order and rounding inside one mma are not specified), so |err| <= 1.01·(k + 2)·2u·(Σ|a||b| +
|β·C|) (the factor 1.01 absorbs the second-order terms while (k + 2)·2u < 0.01).

Emulator runs are slow: the shapes are small, but they take every path of the kernel: a full
128 × 128 tile and more than one, ragged m, n and k (k not a multiple of 8 or 16, one slice
and several: the double buffer's both halves), k = 0, each transpose, β = 0 (C full of NaN)
and β = 1.5, operands offset by a float (4-byte cp.async), both thread orders and both cp.async
modes.
"""

import os

import numpy as np
import pytest

import pytfm
from cuda_emu import CUDA, Aligned, EmuError
from helpers import EPS32, assert_close, bits
from pytfm import reference as ref

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")

FP32, BF16, TF32 = 0, 1, 2  # pytfm_precision
U = 2.0**-24


def tf32_rna(x):
    """cvt.rna.tf32.f32 in NumPy: to 10 stored mantissa bits, to nearest, ties away from zero;
    inf and NaN stay (a NaN as a NaN)."""
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    special = (u & 0x7F800000) == 0x7F800000
    r = np.where(special, u, (u + 0x1000) & 0xFFFFE000).astype(np.uint32)
    nan = np.isnan(x)
    r[nan] = (x[nan].view(np.uint32) | 0x00400000) & 0xFFFFE000
    return r.view(np.float32)


def bf16_rn(x):
    """cvt.rn.bf16.f32 in NumPy: to 8 significant bits, to nearest even, subnormals kept (as
    pytfm.reference.round_bf16 for every normal value; the CPU's BF16 flushes subnormals, the
    GPU's conversion does not); NaN stays a NaN."""
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    r = np.where(np.isnan(x), x.view(np.uint32) | np.uint32(0x00400000), r).astype(np.uint32)
    return r.view(np.float32)


def tf32_trunc(x):
    """What the tensor core reads of an FP32 register given as TF32: its top 19 bits"""
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def rounded(x, precision):
    x = np.asarray(x, np.float32)
    return (tf32_rna(x) if precision == TF32 else ref.round_bf16(x)).astype(np.float64)


def bound(k, mag):
    return 1.01 * (k + 2) * 2 * U * mag


# ---- the instructions -------------------------------------------------------------------------


def mma(emu, a, b, c, bf16, missing=-1):
    d = np.full((16, 8), np.nan, np.float32)
    emu.call("emu_mma", d, np.ascontiguousarray(a, np.float32),
             np.ascontiguousarray(b, np.float32), np.ascontiguousarray(c, np.float32), bf16,
             missing, stream=False)
    return d


def plain_mma(a, b, c, read):
    """D = A·B + C as the emulator defines it: the operands as the tensor core reads them
    (read), each product exact in float32, added in order of k to C in float32."""
    a, b = read(a), read(b)
    d = np.array(c, np.float32)
    for p in range(a.shape[1]):
        d = (d + np.outer(a[:, p], b[p, :]).astype(np.float32)).astype(np.float32)
    return d


INSTRUCTIONS = [(0, 8, tf32_trunc), (1, 16, bf16_rn)]


@pytest.mark.parametrize("bf16,k,read", INSTRUCTIONS, ids=["tf32-m16n8k8", "bf16-m16n8k16"])
def test_mma_matches_a_plain_product_at_every_layout_position(emu, bf16, k, read):
    """Random operands (every element distinct), then A and B each one-hot at every position
    in turn: D must be the plain product bit for bit, so each element of each fragment must be
    where the PTX ISA's layout puts it (the kernel gathers by its own statement of them)."""
    rng = np.random.default_rng(k)
    a = rng.standard_normal((16, k)).astype(np.float32)
    b = rng.standard_normal((k, 8)).astype(np.float32)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_array_equal(bits(mma(emu, a, b, c, bf16)), bits(plain_mma(a, b, c, read)))
    zero_c = np.zeros((16, 8), np.float32)
    for r in range(16):
        for p in range(k):
            one = np.zeros((16, k), np.float32)
            one[r, p] = 1.0
            want = np.zeros((16, 8), np.float32)
            want[r] = read(b)[p]
            np.testing.assert_array_equal(mma(emu, one, b, zero_c, bf16), want,
                                          err_msg=f"A[{r}, {p}]")
    for p in range(k):
        for j in range(8):
            one = np.zeros((k, 8), np.float32)
            one[p, j] = 1.0
            want = np.zeros((16, 8), np.float32)
            want[:, j] = read(a)[:, p]
            np.testing.assert_array_equal(mma(emu, a, one, zero_c, bf16), want,
                                          err_msg=f"B[{p}, {j}]")
    for r in range(16):  # C and D: c[r, j] = its own index comes back at (r, j)
        np.testing.assert_array_equal(mma(emu, np.zeros((16, k)), b, np.arange(128.0).reshape(
            16, 8), bf16)[r], np.arange(8.0) + 8 * r)


def test_tf32_operands_are_truncated_unless_rounded_first(emu):
    """The hardware reads a TF32 operand's top 19 bits: 1 + 2^-11 (a tie) reads as 1, 1 + 3·2^-12
    as 1 (cvt.rna would give 1 + 2^-10 for both)"""
    a = np.zeros((16, 8), np.float32)
    a[:, 0] = 1 + 2**-11
    a[:, 1] = 1 + 3 * 2**-12
    b = np.zeros((8, 8), np.float32)
    b[0] = b[1] = 1.0
    d = mma(emu, a, b, np.zeros((16, 8)), 0)
    np.testing.assert_array_equal(d, 2.0)


def test_the_roundings_are_cvt_rna_tf32_and_cvt_rn_bf16(emu):
    rng = np.random.default_rng(5)
    special = np.array([0.0, -0.0, 1 + 2**-11, -(1 + 2**-11), 1 + 3 * 2**-11, 1 + 2**-12,
                        1 + 2**-8, 1 + 3 * 2**-8, 1e-40, -1e-42, 2.0**-126,
                        np.finfo(np.float32).max, -np.finfo(np.float32).max, np.inf, -np.inf,
                        np.nan, ref.BF16_MAX], np.float32)
    x = np.concatenate([special, rng.standard_normal(200).astype(np.float32),
                        (rng.standard_normal(50) * 1e-39).astype(np.float32)])
    tf32 = np.empty(x.size, np.int32)
    bf16 = np.empty(x.size, np.int32)
    emu.call("emu_round_tc", tf32, bf16, x, x.size, stream=False)
    want = tf32_rna(x)
    got = tf32.view(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    ok = ~np.isnan(x)
    np.testing.assert_array_equal(bits(got[ok]), bits(want[ok]))
    assert got[4] == 1 + 2**-9 and got[2] == 1 + 2**-10 and got[3] == -(1 + 2**-10)  # ties away
    assert got[11] == np.inf  # past the largest TF32
    got16 = (bf16.astype(np.uint32) << 16).view(np.float32)
    want16 = bf16_rn(x)
    normal = np.isfinite(x) & (abs(x) >= 2.0**-126)
    np.testing.assert_array_equal(bits(want16[normal]), bits(ref.round_bf16(x)[normal]))
    np.testing.assert_array_equal(np.isnan(got16), np.isnan(want16))
    ok = ~np.isnan(want16)
    np.testing.assert_array_equal(bits(got16[ok]), bits(want16[ok]))


def test_an_mma_without_every_lane_fails_the_launch_naming_the_thread(emu):
    z = np.zeros((16, 16), np.float32)
    with pytest.raises(EmuError, match=r"thread \(5,0,0\) exited while thread \(\d+,0,0\) waits "
                                       r"for it at mma.sync.aligned.m16n8k8"):
        mma(emu, z[:, :8], z[:8, :8], z[:, :8], 0, missing=5)
    with pytest.raises(EmuError, match=r"thread \(31,0,0\) exited .*m16n8k16"):
        mma(emu, z, z[:, :8], z[:, :8], 1, missing=31)


# ---- ldmatrix ---------------------------------------------------------------------------------

LDMATRIX = [(num, trans) for num in (1, 2, 4) for trans in (0, 1)]


def ldmatrix(emu, tile, rows, num, trans, missing=-1):
    """lane i's registers (4 per lane, 0 past num) from emu_ldmatrix: tile [128, 8] of 16-bit
    values in shared memory, lane i giving row rows[i]"""
    out = np.zeros((32, 4), np.int32)
    emu.call("emu_ldmatrix", out, np.ascontiguousarray(tile, np.int32).reshape(-1),
             np.ascontiguousarray(rows, np.int32), num, trans, missing, stream=False)
    return out.view(np.uint32)


def ldmatrix_counts(emu):
    out = emu.ffi.new("int64_t[3]")
    emu.lib.pytfm_emu_ldmatrix_counts(out)
    return tuple(out)


def ldmatrix_want(tile, rows, num, trans):
    """The PTX ISA's figure for ldmatrix, written out apart from the emulator's ldmatrix_slot:
    lane i holds, of matrix q (the rows lanes 8q..8q+7 address), elements (i / 4, 2(i % 4))
    (lower half) and (i / 4, 2(i % 4) + 1); with .trans (2(i % 4), i / 4) and (2(i % 4) + 1,
    i / 4)."""
    want = np.zeros((32, 4), np.uint32)
    for q in range(num):
        mat = tile[rows[8 * q:8 * q + 8]]  # [8 rows, 8 elements]
        for i in range(32):
            g, t = i // 4, i % 4
            lo, hi = (mat[2 * t, g], mat[2 * t + 1, g]) if trans else (mat[g, 2 * t],
                                                                        mat[g, 2 * t + 1])
            want[i, q] = int(lo) | int(hi) << 16
    return want


@pytest.mark.parametrize("num,trans", LDMATRIX,
                         ids=[f"x{n}{'.trans' if t else ''}" for n, t in LDMATRIX])
def test_ldmatrix_hands_each_lane_the_ptx_layout(emu, num, trans):
    """Every 16-bit element distinct, rows in a scattered order (a row address per lane, not a
    base and a stride): each register must hold the two elements the PTX ISA puts there; the
    lanes past 8·num give a misaligned address, which must not be read."""
    rng = np.random.default_rng(num * 2 + trans)
    tile = rng.permutation(65536)[:128 * 8].reshape(128, 8)
    rows = rng.permutation(128)[:32]
    np.testing.assert_array_equal(ldmatrix(emu, tile, rows, num, trans),
                                  ldmatrix_want(tile, rows, num, trans))


def test_ldmatrix_counts_bank_conflicts(emu):
    """8 rows of one matrix in 8 distinct 16-byte bank groups: one wavefront; all 8 at a
    128-byte stride (one bank group): 8; two rows the same address: a broadcast, no more; a
    32-byte stride: 2."""
    tile = np.arange(128 * 8).reshape(128, 8)
    for rows, waves in ((np.arange(32), 4), (np.arange(32) * 8 % 128, 4 * 8),
                        (np.arange(32) // 2 * 2, 4), (np.arange(32) * 2 % 128, 4 * 2)):
        before = ldmatrix_counts(emu)
        ldmatrix(emu, tile, rows, 4, 0)
        after = ldmatrix_counts(emu)
        assert tuple(a - b for a, b in zip(after, before)) == (1, 4, waves), rows


def test_an_ldmatrix_without_every_lane_or_with_a_bad_address_fails_the_launch(emu):
    tile = np.zeros((128, 8))
    with pytest.raises(EmuError, match=r"thread \(3,0,0\) exited while thread \(\d+,0,0\) waits "
                                       r"for it at ldmatrix.sync.aligned.m8n8.x4.trans"):
        ldmatrix(emu, tile, np.arange(32), 4, 1, missing=3)
    with pytest.raises(EmuError, match=r"gives ldmatrix.sync.aligned.m8n8.x2.shared.b16 the row "
                                       r"address .* not 16 bytes of shared memory"):
        ldmatrix(emu, tile, np.r_[np.arange(15), 1 << 20, np.arange(16)], 2, 0)  # far off


# ---- the eager cp.async mode ------------------------------------------------------------------


@pytest.fixture
def eager(emu):
    emu.lib.pytfm_emu_set_cp_async(1)
    yield
    emu.lib.pytfm_emu_set_cp_async(0)


def cp_async_war(emu, with_barrier):
    src = np.arange(2 * 256, dtype=np.float32) + 1
    out = np.zeros(512, np.float32)
    emu.call("emu_cp_async_war", out, src, with_barrier, stream=False)
    want = np.roll(src.reshape(2, 64, 4), -1, axis=1).reshape(-1)  # each thread's neighbour
    return out, want


def test_eager_cp_async_catches_a_write_after_read(emu, order, eager):
    out, want = cp_async_war(emu, with_barrier=1)
    np.testing.assert_array_equal(out, want)
    out, want = cp_async_war(emu, with_barrier=0)
    assert (out[:256] != want[:256]).any(), "the eager mode missed a write after read"


def test_the_wait_mode_cannot_see_that_write_after_read(emu, order):
    """Why the eager mode exists: at the wait, the copy lands after the barrier that follows
    the reads, so the planted race reads right."""
    out, want = cp_async_war(emu, with_barrier=0)
    np.testing.assert_array_equal(out, want)


def test_the_mode_comes_from_the_environment(emu_library):
    """PYTFM_EMU_CP_ASYNC=eager selects the eager mode for a run (a fresh process)"""
    import subprocess
    import sys

    code = (
        "import numpy as np, cuda_emu\n"
        f"e = cuda_emu.Emu({emu_library!r})\n"
        "src = np.arange(512, dtype=np.float32) + 1; out = np.zeros(512, np.float32)\n"
        "e.call('emu_cp_async_war', out, src, 0, stream=False)\n"
        "want = np.roll(src.reshape(2, 64, 4), -1, axis=1).reshape(-1)\n"
        "print((out[:256] != want[:256]).any())\n")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tests,
                       env={**os.environ, "PYTFM_EMU_CP_ASYNC": "eager",
                            "PYTHONPATH": tests})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True"


# ---- the tensor-core SGEMM ------------------------------------------------------------------


def operands(rng, m, n, k, trans_a, trans_b):
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    return a, b


def want_and_bound(a, b, c0, beta, trans_a, trans_b, precision):
    opa = rounded(a.T if trans_a else a, precision)
    opb = rounded(b.T if trans_b else b, precision)
    bc = beta * c0.astype(np.float64)
    k = opa.shape[1]
    return opa @ opb + bc, bound(k, np.abs(opa) @ np.abs(opb) + np.abs(bc))


def sgemm_ex(emu, g, c0, a, b, m, n, k, trans_a, trans_b, beta, precision, ga=None, gb=None):
    c = g(c0) if beta else g.empty((m, n))
    emu.call("pytfm_sgemm_ex_cuda", c, (ga or g)(a), (gb or g)(b), m, n, k, trans_a, trans_b,
             beta, precision)
    return c


# every tile path: one full tile (k one slice of 16, and four), ragged m, n and k (k 1, 9, 17,
# 24, 28: not multiples of 8 or 16, one slice and more, a last slice one 16-byte copy short of
# full, with 16-byte copies), more than one tile each way, k = 0
SIZES = [(128, 128, 16), (128, 128, 64), (7, 9, 1), (129, 130, 17), (33, 257, 24), (257, 20, 9),
         (65, 72, 28), (5, 6, 0)]
TRANS = [(0, 0), (0, 1), (1, 0), (1, 1)]
PRECISIONS = [(TF32, "tf32"), (BF16, "bf16")]


@pytest.mark.parametrize("precision", [p for p, _ in PRECISIONS], ids=[n for _, n in PRECISIONS])
@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_tensor_core_sgemm_matches_the_reference_on_rounded_inputs(emu, m, n, k, trans_a,
                                                                   trans_b, precision):
    rng = np.random.default_rng(m * 7919 + n * 31 + k + precision)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    g = Aligned()
    for beta in (0.0, 1.5):
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        got = sgemm_ex(emu, g, c0, a, b, m, n, k, trans_a, trans_b, beta, precision)
        want, atol = want_and_bound(a, b, c0, beta, trans_a, trans_b, precision)
        assert_close(f"cuda-emu.sgemm_ex.{precision}", got, want, atol=atol, rtol=0.0)
    g.check()


@pytest.mark.parametrize("precision", [p for p, _ in PRECISIONS], ids=[n for _, n in PRECISIONS])
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
@pytest.mark.parametrize("mode", ["wait", "eager"])
def test_both_orders_both_cp_async_modes_and_offset_views_give_the_same_bits(
        emu, order, mode, trans_a, trans_b, precision):
    """A missing barrier or wait reads stale shared memory in one thread order; a copy into a
    buffer still being read lands under the reader in the eager mode; an operand one float off
    a 16-byte boundary (a CuPy view x[1:]) takes 4-byte copies. None may change a bit."""
    m, n, k = 132, 136, 36  # two tiles each way, three slices, rows multiples of 4
    rng = np.random.default_rng(11 + precision)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    emu.lib.pytfm_emu_set_cp_async(mode == "eager")
    try:
        g = Aligned()
        base = sgemm_ex(emu, g, c0, a, b, m, n, k, trans_a, trans_b, 1.5, precision)
        want, atol = want_and_bound(a, b, c0, 1.5, trans_a, trans_b, precision)
        assert_close("cuda-emu.sgemm_ex.aligned", base, want, atol=atol, rtol=0.0)
        for off in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (3, 2, 1)):  # c, a, b
            gs = [Aligned(o) for o in off]
            got = sgemm_ex(emu, gs[0], c0, a, b, m, n, k, trans_a, trans_b, 1.5, precision,
                           gs[1], gs[2])
            np.testing.assert_array_equal(bits(got), bits(base), err_msg=f"offsets {off}")
            for x in gs:
                x.check()
        g.check()
    finally:
        emu.lib.pytfm_emu_set_cp_async(0)


@pytest.mark.parametrize("precision", [p for p, _ in PRECISIONS], ids=[n for _, n in PRECISIONS])
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_the_fragment_loads_are_bank_conflict_free(emu, trans_a, trans_b, precision):
    """Every ldmatrix of the kernel, on every layout its tiles take (the swizzles of
    sgemm_tc.cu), costs one shared-memory wavefront per matrix; and the kernel loads by
    ldmatrix what it says: per block and slice of 16, 4 warps × (4 for A + 4 for B) x4 loads
    per k step (one BF16 step, two TF32 ones), but for a TF32 operand whose rows run along m or
    n (A with trans_a, B without trans_b), which 32-bit loads read (ldmatrix cannot transpose
    32-bit elements; their banks are argued in sgemm_tc.cu's tf32_at)."""
    m, n, k = 128, 128, 48
    rng = np.random.default_rng(3)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    before = ldmatrix_counts(emu)
    sgemm_ex(emu, Aligned(), None, a, b, m, n, k, trans_a, trans_b, 0.0, precision)
    calls, matrices, waves = (x - y for x, y in zip(ldmatrix_counts(emu), before))
    if precision == TF32:
        per_step, steps = 4 * (not trans_a) + 4 * bool(trans_b), 2
    else:
        per_step, steps = 8, 1
    assert calls == 4 * per_step * steps * (k // 16)
    assert matrices == 4 * calls
    assert waves == matrices, f"{waves - matrices} extra wavefronts: bank conflicts"


@pytest.mark.parametrize("precision", [p for p, _ in PRECISIONS], ids=[n for _, n in PRECISIONS])
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 1)])
@pytest.mark.parametrize("mode", ["wait", "eager"])
def test_a_warp_running_ahead_changes_nothing(emu, mode, trans_a, trans_b, precision):
    """The emulator's third order (pytfm_emu_set_order(2)): each warp runs alone to its next
    barrier, so one warp is a whole stretch between barriers ahead of the others, which the
    two sweeps never let happen (they keep warps at one warp operation of each other: mma and
    ldmatrix are warp operations). A buffer refilled, or read, without a barrier against the
    other warps' use of it shows here; the kernel's bits must not move."""
    m, n, k = 132, 136, 52  # two tiles each way, four slices: every staging buffer refilled
    rng = np.random.default_rng(17 + precision)
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    g = Aligned()
    base = sgemm_ex(emu, g, c0, a, b, m, n, k, trans_a, trans_b, 1.5, precision)
    emu.lib.pytfm_emu_set_cp_async(mode == "eager")
    emu.lib.pytfm_emu_set_order(2)
    try:
        got = sgemm_ex(emu, g, c0, a, b, m, n, k, trans_a, trans_b, 1.5, precision)
    finally:
        emu.lib.pytfm_emu_set_order(0)
        emu.lib.pytfm_emu_set_cp_async(0)
    np.testing.assert_array_equal(bits(got), bits(base))
    g.check()


def test_tf32_rounds_to_nearest_ties_away_before_the_product(emu):
    """Inputs whose TF32 rounding differs from the hardware's truncation, and whose rounded
    products sum exactly: the kernel's C is the sum of cvt.rna-rounded inputs, bit for bit."""
    m, n, k = 16, 8, 32
    a = np.full((m, k), 1 + 3 * 2**-12, np.float32)  # rna: 1 + 2^-10; truncated: 1
    a[:, ::2] = -(1 + 2**-11)  # a tie: away from zero, -(1 + 2^-10)
    b = np.ones((k, n), np.float32)
    g = Aligned()
    got = sgemm_ex(emu, g, np.zeros((m, n), np.float32), a, b, m, n, k, 0, 0, 0.0, TF32)
    np.testing.assert_array_equal(got, 0.0)  # 16·(1 + 2^-10) − 16·(1 + 2^-10)
    a[:, ::2] = 1 + 2**-11
    got = sgemm_ex(emu, g, np.zeros((m, n), np.float32), a, b, m, n, k, 0, 0, 0.0, TF32)
    np.testing.assert_array_equal(got, np.float32(32 * (1 + 2**-10)))


def test_fp32_through_the_ex_twin_is_pytfm_sgemm_cuda(emu):
    rng = np.random.default_rng(2)
    m, n, k = 70, 129, 33
    a, b = operands(rng, m, n, k, 0, 1)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    g = Aligned()
    got = sgemm_ex(emu, g, c0, a, b, m, n, k, 0, 1, 1.0, FP32)
    plain = g(c0)
    emu.call("pytfm_sgemm_cuda", plain, g(a), g(b), m, n, k, 0, 1, 1.0)
    np.testing.assert_array_equal(bits(got), bits(plain))


def test_the_precision_is_checked(emu):
    x = np.ones(4, np.float32)
    t = [np.ones(4, np.float32) for _ in range(6)]  # distinct buffers
    for name, args in (("pytfm_sgemm_ex_cuda", (*t[:3], 2, 2, 1, 0, 0, 0.0)),
                       ("pytfm_linear_forward_ex_cuda", (*t[:3], None, 2, 2, 2)),
                       ("pytfm_linear_gelu_forward_ex_cuda", (*t[:4], None, 2, 2, 2)),
                       ("pytfm_linear_backward_ex_cuda", (t[0], t[1], None, *t[3:], 2, 2, 2))):
        with pytest.raises(EmuError, match=rf"status 1: {name}: precision must be a "
                                           r"pytfm_precision \(0: FP32, 1: BF16, 2: TF32\), "
                                           r"got 4"):
            emu.call(name, *args, 4)
        with pytest.raises(EmuError, match=rf"status 1: {name}: precision "
                                           r"PYTFM_PRECISION_INT8 \(3\) runs on the CPU only"):
            emu.call(name, *args, 3)  # a model's precision (8-bit weights), not the GPU's
    c = x.copy()
    emu.call("pytfm_sgemm_ex_cuda", c, None, None, 2, 2, 0, 0, 0, 0.5, TF32)  # k = 0: C = β·C
    np.testing.assert_array_equal(c, 0.5)
    emu.call("pytfm_sgemm_ex_cuda", None, x, x, 0, 3, 2, 0, 0, 0.0, BF16)  # m = 0: no launch


def test_the_cpu_functions_refuse_tf32():
    """TF32 is the GPU's format: the CPU's _ex functions say so rather than compute FP32."""
    lib, ffi = pytfm._core.lib, pytfm._core.ffi
    x = np.ones(4, np.float32)
    p = ffi.cast("float *", x.ctypes.data)
    assert lib.pytfm_sgemm_ex(p, p, p, 2, 2, 1, 0, 0, 0.0, TF32) == 1
    assert "precision must be a pytfm_precision (0: FP32, 1: BF16)" in \
        ffi.string(lib.pytfm_last_error()).decode()


# ---- the linear layer's _ex twins ----------------------------------------------------------


@pytest.mark.parametrize("precision", [p for p, _ in PRECISIONS], ids=[n for _, n in PRECISIONS])
@pytest.mark.parametrize("rows,inn,out,bias", [(130, 20, 9, True), (3, 17, 129, False)])
def test_linear_ex_twins_on_the_tensor_cores(emu, precision, rows, inn, out, bias):
    """forward (bias), linear + GELU, backward (dx, dw and db accumulated) against the
    reference on rounded x, W, dy; the bias, GELU and db unrounded, as the header says"""
    rng = np.random.default_rng(rows + inn + out)
    x = rng.standard_normal((rows, inn)).astype(np.float32)
    w = rng.standard_normal((out, inn)).astype(np.float32)
    b = rng.standard_normal(out).astype(np.float32) if bias else None
    dy = rng.standard_normal((rows, out)).astype(np.float32)
    dw0 = rng.standard_normal((out, inn)).astype(np.float32)
    db0 = rng.standard_normal(out).astype(np.float32)
    g = Aligned()
    rx, rw, rdy = (rounded(t, precision) for t in (x, w, dy))
    b64 = None if b is None else b.astype(np.float64)
    h_want = ref.linear_forward(rx, rw, b64)
    h_tol = bound(inn, ref.linear_forward(abs(rx), abs(rw), None if b is None else abs(b64)))

    y = g.empty((rows, out))
    emu.call("pytfm_linear_forward_ex_cuda", y, g(x), g(w), None if b is None else g(b), rows,
             inn, out, precision)
    assert_close("cuda-emu.linear_forward_ex.y", y, h_want, atol=h_tol, rtol=0.0)

    y, h = g.empty((rows, out)), g.empty((rows, out))
    emu.call("pytfm_linear_gelu_forward_ex_cuda", y, h, g(x), g(w), None if b is None else g(b),
             rows, inn, out, precision)
    assert_close("cuda-emu.linear_gelu_forward_ex.h", h, h_want, atol=h_tol, rtol=0.0)
    # |gelu'| <= 1.13: h's error carries over to y, plus gelu's own few roundings
    assert_close("cuda-emu.linear_gelu_forward_ex.y", y, ref.gelu_forward(h_want),
                 atol=1.2 * h_tol + 4 * EPS32 * (1.0 + abs(h_want)), rtol=0.0)

    dx, dw, db = g.empty((rows, inn)), g(dw0), g(db0) if bias else None
    emu.call("pytfm_linear_backward_ex_cuda", dx, dw, db, g(dy), g(x), g(w), rows, inn, out,
             precision)
    dx_want = rdy @ rw
    dw_want = dw0 + rdy.T @ rx
    assert_close("cuda-emu.linear_backward_ex.dx", dx, dx_want,
                 atol=bound(out, abs(rdy) @ abs(rw)), rtol=0.0)
    assert_close("cuda-emu.linear_backward_ex.dw", dw, dw_want,
                 atol=bound(rows, abs(rdy.T) @ abs(rx) + abs(dw0)), rtol=0.0)
    if bias:
        db_want = db0 + dy.astype(np.float64).sum(0)
        assert_close("cuda-emu.linear_backward_ex.db", db, db_want,
                     atol=2 * rows * EPS32 * (abs(dy).sum(0) + abs(db0)), rtol=0.0)
    g.check()


def test_linear_ex_twins_at_fp32_are_the_twins_bits(emu):
    rng = np.random.default_rng(9)
    rows, inn, out = 33, 20, 40
    x, w = rng.standard_normal((rows, inn)), rng.standard_normal((out, inn))
    b, dy = rng.standard_normal(out), rng.standard_normal((rows, out))
    x, w, b, dy = (t.astype(np.float32) for t in (x, w, b, dy))
    g = Aligned()
    outs = {}
    for name in ("pytfm_linear_gelu_forward_cuda", "pytfm_linear_gelu_forward_ex_cuda"):
        y, h = g.empty((rows, out)), g.empty((rows, out))
        extra = (FP32,) if "_ex" in name else ()
        emu.call(name, y, h, g(x), g(w), g(b), rows, inn, out, *extra)
        outs[name] = (y, h)
    for a, c in zip(*outs.values()):
        np.testing.assert_array_equal(bits(a), bits(c))
    res = {}
    for name in ("pytfm_linear_backward_cuda", "pytfm_linear_backward_ex_cuda"):
        dx, dw, db = g.empty((rows, inn)), g(np.zeros((out, inn))), g(np.zeros(out))
        extra = (FP32,) if "_ex" in name else ()
        emu.call(name, dx, dw, db, g(dy), g(x), g(w), rows, inn, out, *extra)
        res[name] = (dx, dw, db)
    for a, c in zip(*res.values()):
        np.testing.assert_array_equal(bits(a), bits(c))


# ---- the GPT on the GPU in TF32 and BF16 (the emulated stand-in) ------------------------------


@pytest.fixture
def strict_cp(emu, monkeypatch):
    import fake_cupy

    return fake_cupy.install(monkeypatch, emu, strict=True)


def gpt_step(model, x, y):
    model.zero_grad()
    _, loss = model.forward(x, y)
    model.backward()
    return float(loss)


def test_the_gpt_on_the_gpu_runs_its_linear_layers_on_the_tensor_cores(strict_cp, monkeypatch):
    """GPT(..., device="cuda", precision="bf16"/"tf32"): every linear layer's products go to
    the _ex twins (counted), the loss of a training step is the CPU model's in "bf16" to float32
    sum order (64 eps, as test_cuda_model.py holds FP32 to; the gradients to BF16's ulp, see
    below), and "tf32"'s loss is FP32's within TF32's rounding of two inputs (2·2^-11, doubled
    for the backward's share) of the loss; TF32 on the CPU is refused."""
    import fake_cupy
    from pytfm.nn import GPT, GPTConfig

    cfg = GPTConfig(vocab=32, d_model=32, n_layer=2, n_head=2, max_seq=12)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, cfg.vocab, (2, 12)), rng.integers(0, cfg.vocab, (2, 12))
    lib = pytfm._core.lib
    calls = []
    for name in ("pytfm_linear_forward_ex_cuda", "pytfm_linear_gelu_forward_ex_cuda",
                 "pytfm_linear_backward_ex_cuda"):
        real = getattr(lib, name)

        def counted(*args, _real=real, _name=name):
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(lib, name, counted, raising=False)
    cpu16 = GPT(cfg, precision="bf16")
    want16 = gpt_step(cpu16, x, y)
    gpu16 = GPT(cfg, device="cuda", precision="bf16")
    assert gpu16.precision == "bf16"
    got16 = gpt_step(gpu16, strict_cp.asarray(x), strict_cp.asarray(y))
    assert calls, "no linear layer reached the tensor cores"
    assert abs(got16 - want16) <= 64 * EPS32 * want16
    # a gradient's inputs (activations, dy) differ in float32 sum order upstream, and one such
    # ulp can move an input across a BF16 rounding boundary: a BF16 ulp (2^-8 of the input)
    # in a few of a product's terms, so a gradient agrees to about 2^-8 of its scale, not 64 eps
    for k, want in cpu16.grads.items():
        got = fake_cupy._asnumpy(gpu16.grads[k]).astype(np.float64)
        assert np.abs(got - want).max() <= 2.0**-7 * float(abs(want).max()) + 1e-30, k
    calls.clear()
    want32 = gpt_step(GPT(cfg), x, y)
    gpu32 = GPT(cfg, device="cuda", precision="tf32")
    got32 = gpt_step(gpu32, strict_cp.asarray(x), strict_cp.asarray(y))
    assert set(calls) == {"pytfm_linear_forward_ex_cuda", "pytfm_linear_gelu_forward_ex_cuda",
                          "pytfm_linear_backward_ex_cuda"}
    assert abs(got32 - want32) <= 4 * 2.0**-11 * want32
    with pytest.raises(ValueError, match=r"precision 'tf32' runs on the GPU only"):
        GPT(cfg, precision="tf32")
    with pytest.raises(ValueError, match=r"precision 'tf32' runs on the GPU only"):
        gpu32.to("cpu")
    assert gpu16.to("cpu").precision == "bf16"
