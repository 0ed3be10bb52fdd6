"""The row and column kernels of cuda/ (softmax, LayerNorm, the column sums), run on the CPU by
the emulator (cuda/emu), against the float64 reference and the C kernels.

Rows of up to 4096 columns are held in registers by a column class (pytfm_cuda.cuh): a warp
per row holding 4, 8, 16 or 32 floats a lane (up to 128, 256, 512, 1024 columns), a block of
512 or 1024 threads holding 4 floats a thread (up to 2048, 4096); longer rows take the plain
multi-pass kernels. Each class is run at its edges (one short, full, one past), with float4
accesses (cols % 4 == 0, buffers 16-byte aligned) and with the 32-bit path (buffers one float
off a 16-byte boundary, where a float4 access fails the launch), in both thread orders, in
guarded buffers. The column sums run in two stages (per-chunk partials, then the chunks added
in order): under the emulator a chunk is a few rows (PYTFM_COLUMN_MIN_ROWS = 8, about 8 blocks
in all), so rows = 100 spans several chunks. No atomics anywhere: every result has the same
bits on a second run.
"""

import os

import numpy as np
import pytest

import cuda_emu
from cuda_emu import CUDA, Aligned, close
from helpers import EPS32, assert_close, f32
from pytfm import ops
from pytfm import reference as ref

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")

# each class's edges: 128, 256, 512, 1024 (a warp per row), 2048, 4096 (a block per row),
# then 4097 (the plain kernels)
COLS = [1, 3, 4, 31, 32, 33, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025,
        2047, 2048, 2049, 4095, 4096, 4097]


def same_bits(name, a, b):
    assert (np.asarray(a).view(np.uint32) == np.asarray(b).view(np.uint32)).all(), \
        f"{name}: another run gave other bits"


# ---- softmax ------------------------------------------------------------------------------


def softmax_cuda(emu, g, x, dy, offsets=(None, None, None, None)):
    """y = softmax(x) and dx, by the CUDA kernels; offsets: (x, y, dy, dx) buffers' offsets."""
    rows, cols = x.shape
    ox, oy, ody, odx = offsets
    y = g.empty(x.shape, offset=oy)
    emu.call("pytfm_softmax_forward_cuda", y, g(x, offset=ox), rows, cols)
    dx = g.empty(x.shape, offset=odx)
    emu.call("pytfm_softmax_backward_cuda", dx, g(dy, offset=ody), g(y, offset=oy), rows, cols)
    return y, dx


def check_softmax(emu, g, x, dy, offsets=(None, None, None, None)):
    cols = x.shape[1]
    y, dx = softmax_cuda(emu, g, x, dy, offsets)
    close("softmax.forward", y, ref.softmax_forward(x), ops.softmax_forward(x), atol=1e-7,
          rtol=1e-5 + 4 * EPS32 * float(abs(x - x.max(-1, keepdims=True)).max()))
    close("softmax.backward", dx, ref.softmax_backward(dy, y), ops.softmax_backward(dy, y),
          atol=4 * cols * EPS32 * float(abs(dy).max()), rtol=1e-5)
    return y, dx


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
def test_softmax_every_column_class(emu, order, cols, offset):
    rng = np.random.default_rng(cols)
    for rows in (1, 5):
        g = Aligned(offset)
        x, dy = f32(rng, (rows, cols), 3.0, -20.0), f32(rng, (rows, cols))
        y, dx = check_softmax(emu, g, x, dy)
        g.check()
        y2, dx2 = softmax_cuda(emu, Aligned(offset), x, dy)  # a fixed order: the same bits
        same_bits("softmax.forward", y, y2)
        same_bits("softmax.backward", dx, dx2)


@pytest.mark.parametrize("cols", [4, 64, 128, 1024, 2048, 4096])
@pytest.mark.parametrize("which", range(4), ids=["x", "y", "dy", "dx"])
def test_softmax_one_buffer_off_takes_the_scalar_path(emu, cols, which):
    """One pointer one float off a 16-byte boundary, the others aligned: every row of every
    buffer is read and written with 32-bit accesses (a float4 there fails the launch)."""
    rng = np.random.default_rng(cols + which)
    g = Aligned(0)
    x, dy = f32(rng, (3, cols), 2.0), f32(rng, (3, cols))
    check_softmax(emu, g, x, dy, tuple(1 if i == which else 0 for i in range(4)))
    g.check()


def test_softmax_rows_walk_the_grid(emu, order):
    """More rows than the emulator's 3 blocks hold (8 warps each, or a row a block): each team
    takes several rows."""
    rng = np.random.default_rng(3)
    for rows, cols in [(50, 64), (61, 33), (7, 1500), (4, 4096)]:
        g = Aligned(0)
        x, dy = f32(rng, (rows, cols), 3.0), f32(rng, (rows, cols))
        check_softmax(emu, g, x, dy)
        g.check()


def test_softmax_of_rows_with_infinities_as_the_c_kernel(emu):
    """−∞ entries get probability 0 (the register rows pad with −∞ too: they must add nothing);
    a row of large values stays finite."""
    x = np.float32([[-np.inf, 0, 1, 2, -np.inf, 3, 4, 5], [3e38, -3e38, 0, 1, 2, 3, 4, 5]])
    for cols in (8, 7):
        g = Aligned(0)
        y = g.empty((2, cols))
        emu.call("pytfm_softmax_forward_cuda", y, g(x[:, :cols]), 2, cols)
        assert_close("cuda-rows.softmax.inf", y, ref.softmax_forward(x[:, :cols]), atol=1e-7)


# ---- LayerNorm ----------------------------------------------------------------------------


def layernorm_cuda(emu, g, x, w, b, dy, dw0, db0, offsets=None, eps=1e-5):
    """Forward and backward by the CUDA kernels; offsets maps a buffer name to its offset."""
    o = (offsets or {}).get
    rows, cols = x.shape
    y, mean, rstd = g.empty(x.shape, offset=o("y")), g.empty(rows), g.empty(rows)
    gx, gw = g(x, offset=o("x")), g(w, offset=o("w"))
    emu.call("pytfm_layernorm_forward_cuda", y, mean, rstd, gx, gw, g(b, offset=o("b")), rows,
             cols, eps)
    dx, dw, db = g.empty(x.shape, offset=o("dx")), g(dw0), g(db0)
    emu.call("pytfm_layernorm_backward_cuda", dx, dw, db, g(dy, offset=o("dy")), gx, gw, mean, rstd,
             rows, cols)
    return y, mean, rstd, dx, dw, db


def check_layernorm(emu, g, x, w, b, dy, dw0, db0, offsets=None):
    out = layernorm_cuda(emu, g, x, w, b, dy, dw0, db0, offsets)
    cuda_emu.check_layernorm(x, w, b, dy, dw0, db0, out)
    return out


def layernorm_inputs(rng, rows, cols):
    x = f32(rng, (rows, cols), 2.0, 3.0)
    w, b, dy = f32(rng, cols), f32(rng, cols), f32(rng, (rows, cols))
    return x, w, b, dy, f32(rng, cols), f32(rng, cols)


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
def test_layernorm_every_column_class(emu, order, cols, offset):
    rng = np.random.default_rng(cols + 1)
    for rows in (1, 5):
        args = layernorm_inputs(rng, rows, cols)
        g = Aligned(offset)
        first = check_layernorm(emu, g, *args)
        g.check()
        again = layernorm_cuda(emu, Aligned(offset), *args)
        for name, a, b in zip(("y", "mean", "rstd", "dx", "dw", "db"), first, again):
            same_bits(f"layernorm.{name}", a, b)


@pytest.mark.parametrize("cols", [4, 128, 1024, 2048])
@pytest.mark.parametrize("which", ["x", "y", "w", "b", "dy", "dx"])
def test_layernorm_one_buffer_off_takes_the_scalar_path(emu, cols, which):
    rng = np.random.default_rng(cols)
    g = Aligned(0)
    check_layernorm(emu, g, *layernorm_inputs(rng, 3, cols), offsets={which: 1})
    g.check()


def test_layernorm_backward_partials_of_several_blocks_and_rows(emu, order):
    """Past 24 rows (3 blocks of 8 warps) each warp of each block sums dw/db over several rows;
    the blocks' partials are added in order. A block per row (1500, 4096 columns): 3 blocks
    each take several rows. Past 4096 columns: the plain dx and the two-stage column sum."""
    rng = np.random.default_rng(7)
    for rows, cols in [(50, 96), (61, 33), (29, 1024), (9, 1500), (7, 4096), (20, 4100)]:
        g = Aligned(0)
        check_layernorm(emu, g, *layernorm_inputs(rng, rows, cols))
        g.check()


def test_layernorm_of_rows_far_from_zero_in_every_class(emu):
    """|μ| = 10⁴·σ: the register rows sum x − x0 as the plain ones do (else y is off by ~1e-2)."""
    rng = np.random.default_rng(11)
    for cols in (100, 1024, 4096, 4097):
        x = f32(rng, (3, cols), 0.01, 100.0)
        w, b = f32(rng, cols), f32(rng, cols)
        g = Aligned(0)
        y, mean, rstd = g.empty(x.shape), g.empty(3), g.empty(3)
        emu.call("pytfm_layernorm_forward_cuda", y, mean, rstd, g(x), g(w), g(b), 3, cols, 1e-5)
        ry, _, _ = ref.layernorm_forward(x, w, b, 1e-5)
        assert_close("cuda-rows.layernorm.far.y", y, ry, atol=2e-3 * (abs(w) + 1e-3), rtol=0)


# ---- the column sums (the linear layer's db; LayerNorm's dw/db past 4096 columns) ---------


def chunks(rows, cols, blocks=8, min_rows=8, lanes=8, tile=32):
    """Stage 1's chunks under the emulator (pytfm__column_chunk_rows)."""
    def up(a, b):
        return (a + b - 1) // b

    want = up(blocks, up(cols, tile))
    chunk = max(up(up(rows, want), lanes) * lanes, min_rows)
    return up(rows, chunk)


@pytest.mark.parametrize("rows,out", [(1, 1), (7, 33), (100, 33), (257, 70), (64, 96),
                                      (300, 5)])
def test_bias_gradient_column_sum(emu, order, rows, out):
    """db += Σ_rows dy through the linear layer's backward, in = 1 (the SGEMMs are tiny)."""
    rng = np.random.default_rng(rows * out)
    g = Aligned(1)
    x, w, dy = f32(rng, (rows, 1)), f32(rng, (out, 1)), f32(rng, (rows, out))
    db0 = f32(rng, out)
    results = []
    for _ in range(2):
        dx, dw, db = g.empty((rows, 1)), g(np.zeros((out, 1), np.float32)), g(db0)
        emu.call("pytfm_linear_backward_cuda", dx, dw, db, g(dy), g(x), g(w), rows, 1, out)
        results.append(db)
    _, _, cdb = ops.linear_backward(dy, x, w, has_bias=True, db=db0.copy())
    close("column_sum.db", results[0], db0 + dy.astype(np.float64).sum(0), cdb,
          atol=2 * rows * EPS32 * (abs(dy).sum(0) + abs(db0)))
    same_bits("column_sum.db", results[0], results[1])
    g.check()


def test_the_column_sum_tests_span_several_chunks():
    """The sizes above give stage 1 three chunks or more (pytfm__column_chunk_rows under the
    emulator), so a stage 2 that drops or repeats one is seen."""
    assert all(chunks(r, c) >= 3 for r, c in [(100, 33), (257, 70), (300, 5)])
