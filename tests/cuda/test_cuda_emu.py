"""Every CUDA kernel of cuda/, run on the CPU by the emulator (cuda/emu), against the float64
reference and the C kernels, at sizes that break kernels: 1, odd, one past a warp (33) or a
tile (65), rows short enough for a warp per row and long enough for a block per row (> 1024).
Every twin of tests/ops_registry.py through pytfm.ops at its Check's sizes and bounds, then each
kernel's own cases: bits, alignments, in-place forms, special inputs.

Each case runs twice, with the threads of every block scheduled first-to-last and then
last-to-first between barriers, so that a missing __syncthreads() reads stale shared memory in
at least one of the two orders. Every buffer is guarded (tests/cuda_emu.py): reading past an
edge spoils the result, writing past one fails the test. The emulator caps grids at 3 blocks,
so the grid-stride loops are walked too.
"""

import os

import numpy as np
import pytest

from cuda_emu import CUDA, Aligned, EmuError, Guarded, close, guard_cupy, run_on_device
from helpers import EPS32, assert_close, bits, f32
from ops_registry import OPS, case_id, checked, exact_null_args, fresh
from pytfm import ops
from pytfm import reference as ref

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")


# ---- the emulator itself ------------------------------------------------------------------


@pytest.mark.parametrize("width", [32, 16, 8])
@pytest.mark.parametrize("src,delta,lane_mask", [(5, 3, 6), (0, 1, 1), (31, 16, 16),
                                                 (12, 31, 31)])
def test_emulator_shuffles_follow_their_definitions(emu, width, src, delta, lane_mask):
    threads = 64  # two warps
    out = np.zeros((4, threads), np.int32)
    emu.call("emu_shuffles", out, threads, src, delta, lane_mask, width, stream=False)
    lane = np.arange(threads) % 32
    base = lane & ~(width - 1)  # the first lane of this lane's group of `width`
    v = 1000 + np.arange(threads) - lane  # + lane: the value of that lane of the warp
    # a lane that would read outside its group of `width` reads its own value
    np.testing.assert_array_equal(out[0], v + base + src % width)  # __shfl_sync
    np.testing.assert_array_equal(out[1], v + np.where(lane - delta >= base, lane - delta, lane))
    np.testing.assert_array_equal(out[2], v + np.where(lane + delta < base + width, lane + delta,
                                                       lane))
    x = lane ^ lane_mask
    np.testing.assert_array_equal(out[3], v + np.where(x < base + width, x, lane))


@pytest.mark.parametrize("dynamic", [0, 1], ids=["static", "dynamic"])
def test_emulator_catches_a_missing_barrier(emu, dynamic):
    """Without the barrier, a thread reads the slot of a thread that has not run yet: the NaN
    the emulator fills shared memory with, static or dynamic, not the last launch's value."""
    x = np.arange(256, dtype=np.float32)
    first_half = np.arange(256) < 128  # thread i reads the slot thread 255 − i writes
    for reverse in (0, 1):
        emu.lib.pytfm_emu_set_order(reverse)
        good, bad = np.zeros_like(x), np.zeros_like(x)
        emu.call("emu_reverse", good, x, 256, dynamic, 1, stream=False)
        emu.call("emu_reverse", bad, x, 256, dynamic, 0, stream=False)
        np.testing.assert_array_equal(good, x[::-1])
        unwritten = first_half if not reverse else ~first_half
        assert np.isnan(bad[unwritten]).all(), "a missing __syncthreads went unseen"
        np.testing.assert_array_equal(bad[~unwritten], x[::-1][~unwritten])
    emu.lib.pytfm_emu_set_order(0)


def test_emulator_reports_a_barrier_not_every_thread_reaches(emu):
    out = np.zeros(64, np.float32)
    emu.call("emu_early_exit", out, 64, 64, stream=False)  # everyone reaches it: fine
    assert (out == 1).all()
    with pytest.raises(EmuError, match=r"status 4: .*block \(0,0,0\).*thread \(40,0,0\).*exited "
                                       r"while 40 threads wait at __syncthreads"):
        emu.call("emu_early_exit", out, 64, 40, stream=False)
    emu.call("emu_early_exit", out, 64, 64, stream=False)  # the error does not stick


def test_emulator_reports_a_shuffle_with_a_lane_gone(emu):
    with pytest.raises(EmuError, match=r"thread \(31,0,0\) exited while thread \(0,0,0\) waits "
                                       r"for it at __shfl_xor_sync"):
        emu.call("emu_shuffle_exit", np.zeros(32, np.float32), stream=False)


def test_emulator_reports_lanes_at_different_shuffles(emu):
    with pytest.raises(EmuError, match=r"threads \(0,0,0\) and \(1,0,0\) of one warp wait at "
                                       r"different warp operations \(__shfl_xor_sync, mask "
                                       r"0xffffffff and __shfl_down_sync"):
        emu.call("emu_mixed_shuffle", np.zeros(32, np.int32), stream=False)


def switch_results(emu):
    """Shuffles, barriers, cp.async, ldmatrix and mma.sync in one go: the TF32 and BF16
    tensor-core products (pytfm_precision 2 and 1) of one ragged size in all four transposes,
    the FP32 SGEMM, and emu_shuffles."""
    rng = np.random.default_rng(11)
    g = Aligned()
    got = []
    for precision in (2, 1):
        for trans_a, trans_b in [(0, 0), (0, 1), (1, 0), (1, 1)]:
            a = f32(rng, (28, 65) if trans_a else (65, 28))
            b = f32(rng, (72, 28) if trans_b else (28, 72))
            c = g.empty((65, 72))
            emu.call("pytfm_sgemm_ex_cuda", c, g(a), g(b), 65, 72, 28, trans_a, trans_b, 0.0,
                     precision)
            got.append(bits(np.array(c)))
    out = np.zeros((4, 64), np.int32)
    emu.call("emu_shuffles", out, 64, 5, 3, 6, 16, stream=False)
    got.append(out)
    return got


def test_both_context_switches_give_the_same_bits(emu):
    """The fibers' two context switches (emu.cpp's stack switch, glibc's ucontext) run the
    same schedule, so every kernel gives the same bits under either."""
    default = emu.lib.pytfm_emu_switch_kind()
    try:
        emu.lib.pytfm_emu_set_switch(1)
        assert emu.lib.pytfm_emu_switch_kind() == 1
        slow = switch_results(emu)
        emu.lib.pytfm_emu_set_switch(0)
        fast = switch_results(emu)
    finally:
        emu.lib.pytfm_emu_set_switch(default)
    for s, f in zip(slow, fast, strict=True):
        np.testing.assert_array_equal(s, f)


def test_the_switch_comes_from_the_environment(emu):
    """PYTFM_EMU_SWITCH=ucontext selects ucontext for a run (a fresh process loading the same
    library); without it the fresh process takes what this one takes when nothing asks for
    ucontext (the stack switch on x86-64 Linux without a shadow stack, else ucontext)."""
    import glob
    import platform
    import subprocess
    import sys

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lib = glob.glob(os.path.join(emu.dir, "libpytfm_emu*.so"))[0]
    code = f"import cuda_emu; print(cuda_emu.Emu({lib!r}).lib.pytfm_emu_switch_kind())"
    default = emu.lib.pytfm_emu_switch_kind()
    try:  # what this process takes when nothing asks for ucontext: the fresh one must agree
        emu.lib.pytfm_emu_set_switch(0)
        unasked = emu.lib.pytfm_emu_switch_kind()
    finally:
        emu.lib.pytfm_emu_set_switch(default)
    kinds = {}
    for mode in ("ucontext", "default"):
        env = {**os.environ, "PYTHONPATH": tests, "PYTFM_EMU_SWITCH": mode}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=tests, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        kinds[mode] = int(r.stdout.strip())
    assert kinds["ucontext"] == 1
    assert kinds["default"] == unasked
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        assert kinds["default"] == 1  # no stack switch written for this platform


def test_emulator_block_sum_dynamic_shared_memory_and_launch_checks(emu):
    x = np.arange(3 * 96, dtype=np.float32).reshape(3, 96)
    for shared_bytes in (128, 48 * 1024):  # the scratch, or all a launch may ask for
        out = np.zeros(3, np.float32)
        emu.call("emu_block_sum", out, x, 3, 96, shared_bytes, stream=False)
        np.testing.assert_array_equal(out, x.sum(axis=1))
    with pytest.raises(EmuError, match="invalid configuration argument"):
        emu.call("emu_block_sum", out, x, 1, 1056, 128, stream=False)  # > 1024 threads
    with pytest.raises(EmuError, match="invalid configuration argument"):
        emu.call("emu_block_sum", out, x, 0, 96, 128, stream=False)  # an empty grid
    with pytest.raises(EmuError, match="invalid configuration argument.* 49153 bytes of dynamic"):
        emu.call("emu_block_sum", out, x, 3, 96, 48 * 1024 + 1, stream=False)  # > 48 KiB


def test_cuda_entry_points_check_their_arguments(emu):
    with pytest.raises(EmuError, match="status 1: pytfm_softmax_forward_cuda: cols must be >= 1"):
        emu.call("pytfm_softmax_forward_cuda", None, None, 3, 0)
    with pytest.raises(EmuError, match="pytfm_layernorm_forward_cuda: eps must be >= 0"):
        emu.call("pytfm_layernorm_forward_cuda", None, None, None, None, None, None, 0, 4, -1.0)
    count = emu.ffi.new("int32_t *")
    assert emu.lib.pytfm_cuda_device_count(count) == 0 and count[0] == 1  # "the emulator"
    emu.call("pytfm_softmax_forward_cuda", None, None, 0, 5)  # zero rows: nothing to launch


# ---- every twin, through pytfm.ops -----------------------------------------------------------

TWINS = [(op, values) for op in checked(cuda=True) for values in op.check.emu]


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
@pytest.mark.parametrize("op,values", TWINS,
                         ids=[f"{op.name}-{case_id(values)}" for op, values in TWINS])
def test_twin_matches_the_reference_and_the_c_kernel(cp, order, op, values, offset):
    """Each op's CUDA twin at its Check's emu sizes (tests/ops_registry.py), called by
    pytfm.ops on stand-in CuPy arrays whose every buffer, inputs and outputs, is guarded and
    starts on a 16-byte boundary (the float4 paths) or one float past one (the scalar paths):
    within the twin's bound of the reference, and twice that of the C kernel (its bits where
    the twin promises them)."""
    g = Aligned(offset)
    guard_cupy(cp, g)
    c = op.check
    a = c.make(**values)
    want, want_c = c.want(fresh(a)), c.run(fresh(a))
    asked = len(cp.streams_asked)
    got = run_on_device(cp, op, a)
    assert len(cp.streams_asked) == asked + 1, "the CUDA twin was not called"
    g.check()
    tols = (c.emu_tol or c.tol)(a, want)
    for name, x, r, cc, t in zip(c.outputs, got, want, want_c, tols, strict=True):
        if r is None:
            assert x is None and cc is None, name
            continue
        x = np.asarray(x)
        close(f"{op.name}.{name}", x, r, cc, atol=t.atol, rtol=t.rtol)
        if c.same_bits_as_c:
            np.testing.assert_array_equal(bits(x), bits(cc), err_msg=f"{op.name}.{name}")


@pytest.mark.parametrize("op", [op for op in OPS if op.cuda], ids=lambda op: op.name)
def test_twins_refuse_null_buffers(emu, op):
    """As tests/kernels/test_errors.py for the C functions: every buffer NULL, sizes that need
    them: INVALID_ARGUMENT naming the twin, before anything is launched."""
    for template in op.exact:
        with pytest.raises(EmuError, match=rf"status 1: {op.twin}: .*must not be NULL"):
            emu.call(op.twin, *exact_null_args(template, emu.ffi))


# ---- the kernels' own cases -----------------------------------------------------------------

GEMM_SIZES = [(1, 1, 1), (3, 5, 7), (64, 64, 16), (65, 63, 17), (33, 70, 129), (2, 1, 65)]


@pytest.mark.parametrize("m,n,k", GEMM_SIZES)
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_sgemm(emu, order, m, n, k, trans_a, trans_b):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    g = Guarded()
    a = f32(rng, (k, m) if trans_a else (m, k))
    b = f32(rng, (n, k) if trans_b else (k, n))
    opa = (a.T if trans_a else a).astype(np.float64)
    opb = (b.T if trans_b else b).astype(np.float64)
    bound = np.abs(opa) @ np.abs(opb)
    for beta in (0.0, 1.0):
        c0 = f32(rng, (m, n))
        c = g(c0) if beta else g.empty((m, n))  # beta 0: NaN in c must not leak
        emu.call("pytfm_sgemm_cuda", c, g(a), g(b), m, n, k, trans_a, trans_b, beta)
        want = opa @ opb + (beta * c0 if beta else 0)
        assert_close("cuda-emu.sgemm", c, want, atol=2 * k * EPS32 * (bound + abs(c0)))
    g.check()


def layernorm_forward_3(emu, g, x, w, b, eps=1e-5):
    """LayerNorm's forward (y, mean, rstd) by the CUDA kernel (in g's guarded buffers), by the
    reference and by the C kernel."""
    rows, cols = x.shape
    y, mean, rstd = g.empty(x.shape), g.empty(rows), g.empty(rows)
    emu.call("pytfm_layernorm_forward_cuda", y, mean, rstd, g(x), g(w), g(b), rows, cols, eps)
    return (y, mean, rstd), ref.layernorm_forward(x, w, b, eps), ops.layernorm_forward(x, w, b, eps)


@pytest.mark.parametrize("rows,cols", [(3, 5), (4, 100), (3, 1024), (2, 1025)])
def test_layernorm_of_rows_far_from_zero(emu, order, rows, cols):
    """|μ| = 10⁴·σ. The kernel sums x − x0 (x0 = x[0]), exact differences here, so y keeps the
    float32 accuracy of the row's spread: x̂ is off by the float sum's roundings of |x − x0|
    (k of them: cols/32 per lane, or cols/256 per thread of a block, then the tree) and a few
    of its own steps, all relative to σ. A float sum of x would be off by k·eps·|μ|/σ ≈ 1e-2."""
    rng = np.random.default_rng(rows * cols)
    g = Guarded()
    x = f32(rng, (rows, cols), 0.01, 100.0)
    w, b = f32(rng, cols), f32(rng, cols)
    (y, _, _), (ry, rmean, rrstd), (cy, _, _) = layernorm_forward_3(emu, g, x, w, b)
    X, rs = x.astype(np.float64), rrstd[:, None]
    k = cols / 32 + 16  # roundings of one term in the team's sum, at most
    xhat = (X - rmean[:, None]) * rs
    dxhat = EPS32 * (k * abs(X - X[:, :1]).mean(axis=1, keepdims=True) * rs  # the mean
                     + 2 * abs(X - X[:, :1]) * rs  # x − x0 and − d
                     + (k + 6) * abs(xhat))  # rstd's sum, sqrt and product
    close("layernorm.far.y", y, ry, cy, atol=2 * (abs(w) * dxhat + EPS32 * abs(ry)), rtol=0)
    g.check()


@pytest.mark.parametrize("B,T,H,D", [(1, 1, 1, 2), (2, 3, 5, 6), (1, 33, 2, 64), (3, 7, 1, 10),
                                     (2, 5, 3, 8)])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("start", [1000, 10**6])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
def test_rope(emu, order, B, T, H, D, batched, start, offset):
    """pos as [T] (pos_stride 0: a table row per t) or [B, T] (a row per (b, t)), positions up
    to 10⁶; float4 rotations where D is a multiple of 8 and the data aligned, else per pair.
    The angles are the C kernels' double expression rounded to float, and each rotation the same
    float operations: the same bits as pytfm_rope_forward (and the reference to rounding)."""
    rng = np.random.default_rng(B * T * H * D + start)
    g = Aligned(offset)
    x = f32(rng, (B, T, H, D))
    pos = start + np.arange(T, dtype=np.int64)
    if batched:
        pos = pos + rng.integers(0, 100, size=(B, 1))
    stride = T if batched else 0
    y = g.empty(x.shape)
    emu.call("pytfm_rope_forward_cuda", y, g(x), g(pos, np.int64), B, T, H, D, stride, 10000.0)
    want_c = ops.rope_forward(x, pos)
    np.testing.assert_array_equal(bits(y), bits(want_c))
    close("rope.forward", y, ref.rope_forward(x, pos, 10000.0), want_c,
          atol=4 * EPS32 * float(abs(x).max()))
    dx = g(y)  # in place: dx == dy
    emu.call("pytfm_rope_backward_cuda", dx, dx, g(pos, np.int64), B, T, H, D, stride, 10000.0)
    want_c = ops.rope_backward(y, pos)
    np.testing.assert_array_equal(bits(dx), bits(want_c))
    close("rope.backward", dx, ref.rope_backward(y, pos, 10000.0), want_c,
          atol=4 * EPS32 * float(abs(y).max()))
    g.check()


@pytest.mark.parametrize("count", [1, 7, 255, 257, 1000, 1027])
def test_gelu(emu, order, count):
    """float4 on aligned arrays (the last count % 4 one by one), per float on offset ones: the
    same function of each element, so the same bits; in place too."""
    rng = np.random.default_rng(count)
    x, dy = f32(rng, count, 3.0), f32(rng, count)
    got = {}
    for offset in (0, 1, 2):
        g = Aligned(offset)
        y, dx = g.empty(count), g.empty(count)
        emu.call("pytfm_gelu_forward_cuda", y, g(x), count)
        emu.call("pytfm_gelu_backward_cuda", dx, g(dy), g(x), count)
        inplace = g(x)
        emu.call("pytfm_gelu_forward_cuda", inplace, inplace, count)
        np.testing.assert_array_equal(bits(inplace), bits(y))
        g.check()
        got[offset] = (y.copy(), dx.copy())
    # x the prefix of a longer array: the floats after it are finite, not the guards' NaN
    # marker, so a vector step past count would write something new past y's and dx's ends
    g = Aligned(0)
    longer = g(np.concatenate([x, dy[:5] + 1.0, [2.0, 3.0, 4.0]]).astype(np.float32))
    y, dx = g.empty(count), g.empty(count)
    emu.call("pytfm_gelu_forward_cuda", y, longer[:count], count)
    emu.call("pytfm_gelu_backward_cuda", dx, g(dy), longer[:count], count)
    g.check()
    np.testing.assert_array_equal(bits(y), bits(got[0][0]))
    np.testing.assert_array_equal(bits(dx), bits(got[0][1]))
    a, b = Aligned(0), Aligned(1)  # x and dx aligned, dy not: the scalar path
    dx = a.empty(count)
    emu.call("pytfm_gelu_backward_cuda", dx, b(dy), a(x), count)
    a.check()
    b.check()
    got[3] = (got[0][0], dx)
    for offset in (1, 2, 3):
        np.testing.assert_array_equal(bits(got[offset][0]), bits(got[0][0]))
        np.testing.assert_array_equal(bits(got[offset][1]), bits(got[0][1]))
    y, dx = got[0]
    close("gelu.forward", y, ref.gelu_forward(x), ops.gelu_forward(x),
          atol=4 * EPS32 * (1.0 + abs(x)))
    close("gelu.backward", dx, ref.gelu_backward(dy, x), ops.gelu_backward(dy, x),
          atol=8 * EPS32 * (1.0 + abs(x)) * abs(dy))


def embedding_ids(rng, kind, rows, vocab):
    if kind == "reverse":  # every id (or its repeats) met last-to-first
        return (np.arange(rows) % vocab)[::-1].copy()
    if kind == "distinct":
        return rng.permutation(vocab)[:rows]
    if kind == "few":  # many repeats of a few ids
        return rng.choice(rng.integers(0, vocab, 3), size=rows)
    return rng.integers(0, vocab, size=rows)


# rows <= 16 take the plain walk, more the sorted path; under the emulator a block sorts 256
# keys, so 257+ rows walk the merge passes (1000: 4 tiles, 2 passes; 600: an unpaired run)
EMBEDDING_CASES = [(1, 1, 1, "random"), (7, 3, 5, "random"), (16, 2, 8, "few"),
                   (17, 3, 8, "few"), (40, 2, 65, "random"), (3, 1, 33, "random"),
                   (100, 7, 70, "reverse"), (1000, 3, 8, "few"), (600, 1, 4, "random"),
                   (513, 5000, 12, "distinct"), (700, 700, 4, "reverse"),
                   (300, 50, 5, "reverse")]


@pytest.mark.parametrize("rows,vocab,dim,kind", EMBEDDING_CASES)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
def test_embedding(emu, order, rows, vocab, dim, kind, offset):
    """The backward adds the rows of repeated ids in order of position, as the CPU does: the
    same bits, whatever the order of the ids (grouped by a sort on the GPU)."""
    rng = np.random.default_rng(rows * vocab * dim)
    g = Aligned(offset)
    table = f32(rng, (vocab, dim))
    ids = embedding_ids(rng, kind, rows, vocab)
    y = g.empty((rows, dim))
    emu.call("pytfm_embedding_forward_cuda", y, g(ids, np.int64), g(table), rows, vocab, dim)
    close("embedding.forward", y, ref.embedding_forward(ids, table),
          ops.embedding_forward(ids, table), atol=0, rtol=0)
    dy = f32(rng, (rows, dim))
    dt0 = f32(rng, (vocab, dim))
    dtable = g(dt0)
    emu.call("pytfm_embedding_backward_cuda", dtable, g(dy), g(ids, np.int64), rows, vocab, dim)
    want_c = ops.embedding_backward(dy, ids, vocab, dtable=dt0.copy())
    np.testing.assert_array_equal(bits(dtable), bits(want_c))  # the CPU's order: same bits
    assert_close("cuda-emu.embedding.backward", dtable,
                 dt0 + ref.embedding_backward(dy, ids, vocab),
                 atol=2 * rows * EPS32 * (float(abs(dy).max()) + abs(dt0)))
    g.check()


def test_embedding_backward_mixed_alignment_and_bad_ids(emu, order):
    """dtable aligned, dy not: the scalar accumulation; bad ids (sorted last) are skipped and
    the rest keep the CPU's bits."""
    rng = np.random.default_rng(3)
    rows, vocab, dim = 300, 20, 8
    ids = rng.integers(0, vocab, size=rows)
    ids[::7], ids[3::11] = -1, vocab
    dy, dt0 = f32(rng, (rows, dim)), f32(rng, (vocab, dim))
    a, b = Aligned(0), Aligned(1)
    dtable = a(dt0)
    emu.call("pytfm_embedding_backward_cuda", dtable, b(dy), a(ids, np.int64), rows, vocab, dim)
    ok = (ids >= 0) & (ids < vocab)
    want_c = ops.embedding_backward(dy[ok], ids[ok], vocab, dtable=dt0.copy())
    np.testing.assert_array_equal(bits(dtable), bits(want_c))
    a.check()
    b.check()


def test_embedding_bad_id_gives_a_nan_row(emu):
    table = np.ones((3, 4), np.float32)
    ids = np.array([0, 3, -1, 2])
    y = np.zeros((4, 4), np.float32)
    emu.call("pytfm_embedding_forward_cuda", y, ids, table, 4, 3, 4)
    assert np.isnan(y[1:3]).all() and (y[[0, 3]] == 1).all()


@pytest.mark.parametrize("rows,vocab", [(9, 5), (33, 64), (3, 1025), (2, 5000)])
@pytest.mark.parametrize("offsets", [(0, 0), (1, 1), (3, 3), (2, 0), (0, 1)])
def test_cross_entropy_offsets(emu, rows, vocab, offsets):
    """logits (and dlogits) starting 0–3 floats past a 16-byte boundary: the rows' float4
    bodies with scalar heads and tails of every length; dlogits at another offset than the
    logits takes the scalar path. Both thread orders give the same bits (a fixed order of
    reduction); the values agree with the reference and the C kernel to rounding."""
    rng = np.random.default_rng(rows + vocab)
    logits = f32(rng, (rows, vocab), 4.0, 10.0)
    targets = rng.integers(0, vocab, size=rows)
    targets[1] = -1
    results = []
    for reverse in (0, 1):
        emu.lib.pytfm_emu_set_order(reverse)
        a, b = Aligned(offsets[0]), Aligned(offsets[1])
        loss, lse, dlogits = a.empty(1), a.empty(rows), b.empty((rows, vocab))
        gl, gt = a(logits), a(targets, np.int64)
        emu.call("pytfm_cross_entropy_forward_cuda", loss, lse, gl, gt, rows, vocab, -1)
        emu.call("pytfm_cross_entropy_backward_cuda", dlogits, gl, gt, lse, rows, vocab, -1, 2.0)
        a.check()
        b.check()
        results.append([r.copy() for r in (loss, lse, dlogits)])
    emu.lib.pytfm_emu_set_order(0)
    for r0, r1 in zip(*results):
        np.testing.assert_array_equal(bits(r0), bits(r1))
    loss, lse, dlogits = results[0]
    rloss, rlse = ref.cross_entropy_forward(logits, targets, -1)
    closs, clse = ops.cross_entropy_forward(logits, targets, -1)
    mag = EPS32 * float(abs(logits).max())
    close("cross_entropy.offsets.lse", lse, rlse, clse, atol=1e-6 + 4 * mag, rtol=1e-6)
    close("cross_entropy.offsets.loss", loss[0], rloss, closs, atol=1e-6 + 4 * mag, rtol=1e-5)
    kept = int((targets != -1).sum())
    close("cross_entropy.offsets.backward", dlogits,
          ref.cross_entropy_backward(logits, targets, -1, 2.0),
          ops.cross_entropy_backward(logits, targets, lse, -1, 2.0),
          atol=(1e-6 + 4 * mag) * 2.0 / kept, rtol=1e-5)
    assert (dlogits[1] == 0).all()  # the ignored row


# ---- the twins the GPU model needs besides attention -----------------------------------------

QKV_CASES = [  # (B, T, H, D, pos): "none" is rope off (D may then be odd), [T] or [B, T]
    (1, 1, 1, 2, "shared"), (1, 1, 1, 2, "none"), (1, 1, 3, 1, "none"),
    (2, 3, 5, 6, "per-batch"), (2, 3, 5, 6, "shared"), (2, 3, 2, 5, "none"),
    (1, 33, 2, 64, "per-batch"), (1, 33, 2, 64, "none"), (3, 7, 1, 10, "shared"),
    (3, 1, 4, 8, "per-batch"), (3, 5, 3, 7, "none"), (2, 3, 2, 8, "shared"), (2, 3, 1, 4, "none"),
]


@pytest.mark.parametrize("B,T,H,D,kind", QKV_CASES)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
def test_qkv_split(emu, order, B, T, H, D, kind, offset):
    """q, k: the same bits as pytfm_rope_forward_cuda on the slices of qkv (the same device
    code), v (and everything without rope) an exact copy; against the reference and the C
    kernel to float rounding. The backward likewise, into the fused layout. Aligned arrays
    take the float4 paths where D (with rope: D/2) is a multiple of 4, offset ones the scalar."""
    rng = np.random.default_rng(B * T * H * D + len(kind))
    g = Aligned(offset)
    qkv = f32(rng, (B, T, 3, H, D))
    rope = kind != "none"
    pos = None
    if rope:
        pos = rng.integers(-50, 5000, (B, T)) if kind == "per-batch" else 7 + np.arange(T)
    stride = T if kind == "per-batch" else 0
    gpos = g(pos, np.int64) if rope else None
    parts = [np.ascontiguousarray(qkv[:, :, i]) for i in range(3)]
    q, k, v = (g.empty((B, T, H, D)) for _ in range(3))
    emu.call("pytfm_qkv_split_forward_cuda", q, k, v, g(qkv), gpos, B, T, H, D, stride, 10000.0,
             int(rope))
    cq, ck, cv = ops.qkv_split_forward(qkv, pos)
    np.testing.assert_array_equal(bits(v), bits(parts[2]))
    np.testing.assert_array_equal(bits(cv), bits(v))
    for name, got, part, c in (("q", q, parts[0], cq), ("k", k, parts[1], ck)):
        if not rope:
            np.testing.assert_array_equal(bits(got), bits(part))
            continue
        same = g.empty(part.shape)
        emu.call("pytfm_rope_forward_cuda", same, g(part), gpos, B, T, H, D, stride, 10000.0)
        np.testing.assert_array_equal(bits(got), bits(same))
        close(f"qkv_split.forward.{name}", got, ref.rope_forward(part, pos), c,
              atol=4 * EPS32 * float(abs(part).max()))

    dq, dk, dv = (f32(rng, (B, T, H, D)) for _ in range(3))
    dqkv = g.empty((B, T, 3, H, D))
    emu.call("pytfm_qkv_split_backward_cuda", dqkv, g(dq), g(dk), g(dv), gpos, B, T, H, D,
             stride, 10000.0, int(rope))
    cdqkv = ops.qkv_split_backward(dq, dk, dv, pos)
    np.testing.assert_array_equal(bits(dqkv[:, :, 2]), bits(dv))
    np.testing.assert_array_equal(bits(cdqkv[:, :, 2]), bits(dv))
    for i, (name, grad) in enumerate((("dq", dq), ("dk", dk))):
        if not rope:
            np.testing.assert_array_equal(bits(dqkv[:, :, i]), bits(grad))
            continue
        same = g.empty(grad.shape)
        emu.call("pytfm_rope_backward_cuda", same, g(grad), gpos, B, T, H, D, stride, 10000.0)
        np.testing.assert_array_equal(bits(dqkv[:, :, i]), bits(same))
        close(f"qkv_split.backward.{name}", dqkv[:, :, i], ref.rope_backward(grad, pos),
              cdqkv[:, :, i], atol=4 * EPS32 * float(abs(grad).max()))
    g.check()


def test_qkv_split_checks_its_arguments(emu):
    qkv, out = np.ones((1, 2, 3, 1, 4), np.float32), np.zeros((3, 1, 2, 1, 4), np.float32)
    pos = np.arange(2, dtype=np.int64)
    with pytest.raises(EmuError, match="pytfm_qkv_split_forward_cuda: D must be even"):
        emu.call("pytfm_qkv_split_forward_cuda", out[0], out[1], out[2], qkv, pos, 1, 2, 1, 3, 0,
                 10000.0, 1)
    with pytest.raises(EmuError, match="pytfm_qkv_split_forward_cuda: pos must not be NULL"):
        emu.call("pytfm_qkv_split_forward_cuda", out[0], out[1], out[2], qkv, None, 1, 2, 1, 4, 0,
                 10000.0, 1)
    with pytest.raises(EmuError, match="pytfm_qkv_split_backward_cuda: .* must not share memory"):
        emu.call("pytfm_qkv_split_backward_cuda", qkv, out[0], out[0], qkv[:, :, 0], pos, 1, 2,
                 1, 4, 0, 10000.0, 1)
    emu.call("pytfm_qkv_split_forward_cuda", out[0], out[1], out[2], qkv, None, 1, 2, 1, 3, 0,
             10000.0, 0)  # rope off: odd D and no positions are fine


@pytest.mark.parametrize("rows", [1, 33, 65])
@pytest.mark.parametrize("inn,out", [(1, 1), (5, 7), (17, 65)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gelu(emu, order, rows, inn, out, bias):
    """h and y: the same bits as pytfm_linear_forward_cuda then pytfm_gelu_forward_cuda; the
    reference and the C kernel to float rounding."""
    rng = np.random.default_rng(rows * 100 + inn * 10 + out)
    g = Guarded()
    x, w = f32(rng, (rows, inn)), f32(rng, (out, inn))
    b = f32(rng, out) if bias else None
    gb = g(b) if bias else None
    y, h = g.empty((rows, out)), g.empty((rows, out))
    emu.call("pytfm_linear_gelu_forward_cuda", y, h, g(x), g(w), gb, rows, inn, out)
    h2, y2 = g.empty((rows, out)), g.empty((rows, out))
    emu.call("pytfm_linear_forward_cuda", h2, g(x), g(w), gb, rows, inn, out)
    emu.call("pytfm_gelu_forward_cuda", y2, h2, rows * out)
    np.testing.assert_array_equal(bits(h), bits(h2))
    np.testing.assert_array_equal(bits(y), bits(y2))
    rh = ref.linear_forward(x, w, b)
    cy, ch = ops.linear_gelu_forward(x, w, b)
    atol_h = 2 * inn * EPS32 * ref.linear_forward(abs(x), abs(w), None if b is None else abs(b))
    close("linear_gelu.h", h, rh, ch, atol=atol_h)
    # |gelu'| <= 1.13: h's error carries over, plus gelu's own few roundings
    close("linear_gelu.y", y, ref.gelu_forward(rh), cy,
          atol=1.2 * atol_h + 4 * EPS32 * (1.0 + abs(rh)))
    g.check()


def test_linear_gelu_refuses_aliases(emu):
    x, w = np.ones((3, 4), np.float32), np.ones((4, 4), np.float32)
    y, h = np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32)
    with pytest.raises(EmuError, match="pytfm_linear_gelu_forward_cuda: .* must not share memory"):
        emu.call("pytfm_linear_gelu_forward_cuda", y, y, x, w, None, 3, 4, 4)
    with pytest.raises(EmuError, match="pytfm_linear_gelu_forward_cuda: .* must not share memory"):
        emu.call("pytfm_linear_gelu_forward_cuda", y, x, x, w, None, 3, 4, 4)
    with pytest.raises(EmuError, match="pytfm_linear_gelu_forward_cuda: .* must not share memory"):
        emu.call("pytfm_linear_gelu_forward_cuda", y, h, x, w, h[0], 3, 4, 4)
    assert (y == 0).all() and (h == 0).all()  # refused before anything is written


def sum_squares_cuda(emu, x, count=None):
    """pytfm_sum_squares_cuda into a guarded double: its neighbours must keep their bits."""
    out = np.array([np.nan] * 3)
    marks = out.view(np.uint64).copy()
    emu.call("pytfm_sum_squares_cuda", emu.ffi.cast("double *", out.ctypes.data + 8), x,
             x.size if count is None else count)
    np.testing.assert_array_equal(out.view(np.uint64)[[0, 2]], marks[[0, 2]])
    return out[1]


@pytest.mark.parametrize("count", [0, 1, 255, 256, 257, 769, 5000])
def test_sum_squares(emu, count):
    """256 threads a block, 3 blocks under the emulator: 257 is one past a block, 769 one past
    a round of the grid-stride loop, 5000 several rounds. Both thread orders give the same bits
    (a fixed order of additions); the value is Σ x² to double rounding."""
    import math

    rng = np.random.default_rng(count)
    g = Guarded()
    x = g(f32(rng, count, 2.0))
    got = {}
    for reverse in (0, 1):
        emu.lib.pytfm_emu_set_order(reverse)
        got[reverse] = sum_squares_cuda(emu, x)
    emu.lib.pytfm_emu_set_order(0)
    assert got[0].tobytes() == got[1].tobytes()
    want = math.fsum(float(v) ** 2 for v in x)  # correctly rounded
    tol = (count + 1) * 2.0**-52 * want
    assert abs(got[0] - want) <= tol, (got[0], want)
    assert abs(got[0] - ops.sum_squares(np.asarray(x))) <= 2 * tol
    assert count or got[0] == 0.0  # count 0 writes 0
    g.check()


def test_sum_squares_checks_its_arguments(emu):
    x = np.ones(4, np.float32)
    with pytest.raises(EmuError, match="pytfm_sum_squares_cuda: count must be >= 0, got -1"):
        sum_squares_cuda(emu, x, -1)
    with pytest.raises(EmuError, match="pytfm_sum_squares_cuda: out must not be NULL"):
        emu.call("pytfm_sum_squares_cuda", None, x, 4)
    with pytest.raises(EmuError, match="pytfm_sum_squares_cuda: x must not be NULL"):
        emu.call("pytfm_sum_squares_cuda", emu.ffi.new("double *"), None, 4)
