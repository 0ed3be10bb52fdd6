"""The label-smoothed cross-entropy twins (pytfm_cross_entropy_smoothed_forward_cuda and
_backward_cuda, cuda/cross_entropy.cu) on the CPU emulator, called directly: against the C
kernels and the float64 reference at rows for a warp and for a block (vocab past 1024), with
the buffers at every offset from a 16-byte boundary; both thread orders give the same bits; at
ε = 0 the unsmoothed twins' bits; a bad ε refused before anything runs. (Through pytfm.ops at
the registry's sizes: tests/cuda/test_cuda_emu.py.)"""

import os

import numpy as np
import pytest

from cuda_emu import CUDA, Aligned, EmuError, close
from helpers import EPS32, bits, f32
from pytfm import ops
from pytfm import reference as ref

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")


def make(rows, vocab, seed):
    rng = np.random.default_rng(seed)
    logits = f32(rng, (rows, vocab), 4.0, 10.0)
    targets = rng.integers(0, vocab, size=rows)
    targets[rng.random(rows) < 0.3] = -100
    targets[0] = -100  # at least one ignored row
    return logits, targets


def run(emu, logits, targets, eps, offsets, smoothed=True, dloss=2.0):
    """(loss, lse, dlogits) of the twins on guarded copies at offsets (logits', dlogits')"""
    rows, vocab = logits.shape
    a, b = Aligned(offsets[0]), Aligned(offsets[1])
    loss, lse, dlogits = a.empty(1), a.empty(rows), b.empty((rows, vocab))
    gl, gt = a(logits), a(targets, np.int64)
    if smoothed:
        emu.call("pytfm_cross_entropy_smoothed_forward_cuda", loss, lse, gl, gt, rows, vocab,
                 -100, eps)
        emu.call("pytfm_cross_entropy_smoothed_backward_cuda", dlogits, gl, gt, lse, rows, vocab,
                 -100, eps, dloss)
    else:
        emu.call("pytfm_cross_entropy_forward_cuda", loss, lse, gl, gt, rows, vocab, -100)
        emu.call("pytfm_cross_entropy_backward_cuda", dlogits, gl, gt, lse, rows, vocab, -100,
                 dloss)
    a.check()
    b.check()
    return [x.copy() for x in (loss, lse, dlogits)]


@pytest.mark.parametrize("rows,vocab", [(1, 1), (9, 5), (33, 64), (3, 1025), (2, 5000)])
@pytest.mark.parametrize("offsets", [(0, 0), (1, 1), (2, 0)])
@pytest.mark.parametrize("eps", [0.1, 1.0])
def test_twins_match_the_c_kernels(emu, rows, vocab, offsets, eps):
    logits, targets = make(rows, vocab, rows * vocab)
    results = []
    for reverse in (0, 1):
        emu.lib.pytfm_emu_set_order(reverse)
        results.append(run(emu, logits, targets, eps, offsets))
    emu.lib.pytfm_emu_set_order(0)
    for r0, r1 in zip(*results):
        np.testing.assert_array_equal(bits(r0), bits(r1))
    loss, lse, dlogits = results[0]
    rloss, rlse = ref.cross_entropy_forward(logits, targets, -100, eps)
    closs, clse = ops.cross_entropy_forward(logits, targets, -100, label_smoothing=eps)
    mag = EPS32 * float(abs(logits).max())
    close("label_smoothing.cuda.lse", lse, rlse, clse, atol=1e-6 + 4 * mag, rtol=1e-6)
    close("label_smoothing.cuda.loss", loss[0], rloss, closs, atol=1e-6 + 4 * mag, rtol=1e-5)
    kept = max(int((targets != -100).sum()), 1)
    close("label_smoothing.cuda.backward", dlogits,
          ref.cross_entropy_backward(logits, targets, -100, 2.0, eps),
          ops.cross_entropy_backward(logits, targets, clse, -100, 2.0, label_smoothing=eps),
          atol=(1e-6 + 4 * mag) * 2.0 / kept, rtol=1e-5)
    ignored = targets == -100
    assert (dlogits[ignored] == 0).all()


@pytest.mark.parametrize("rows,vocab", [(9, 5), (3, 1025)])
def test_zero_smoothing_gives_the_unsmoothed_twins_bits(emu, rows, vocab):
    logits, targets = make(rows, vocab, 7)
    plain = run(emu, logits, targets, 0.0, (1, 1), smoothed=False)
    smoothed = run(emu, logits, targets, 0.0, (1, 1))
    for x, y in zip(plain, smoothed):
        np.testing.assert_array_equal(bits(x), bits(y))


def test_no_rows_give_a_zero_loss(emu):
    loss = np.full(1, np.nan, np.float32)
    empty = np.zeros((0, 3), np.float32)
    emu.call("pytfm_cross_entropy_smoothed_forward_cuda", loss, np.zeros(0, np.float32), empty,
             np.zeros(0, np.int64), 0, 3, -1, 0.1)
    assert loss[0] == 0.0
    emu.call("pytfm_cross_entropy_smoothed_backward_cuda", empty, empty, np.zeros(0, np.int64),
             np.zeros(0, np.float32), 0, 3, -1, 0.1, 1.0)


@pytest.mark.parametrize("eps", [1.5, -0.25, float("nan"), float("inf")], ids=str)
def test_twins_refuse_a_bad_smoothing(emu, eps):
    logits, targets = make(3, 5, 1)
    loss, lse, d = (np.full(s, 7.0, np.float32) for s in (1, 3, (3, 5)))
    name = "pytfm_cross_entropy_smoothed_forward_cuda"
    with pytest.raises(EmuError, match=rf"status 1: {name}: label_smoothing must be finite and "
                                       r"in \[0, 1\]"):
        emu.call(name, loss, lse, logits, targets, 3, 5, -100, eps)
    name = "pytfm_cross_entropy_smoothed_backward_cuda"
    with pytest.raises(EmuError, match=rf"status 1: {name}: label_smoothing must be finite"):
        emu.call(name, d, logits, targets, lse, 3, 5, -100, eps, 1.0)
    assert (loss == 7).all() and (lse == 7).all() and (d == 7).all()
