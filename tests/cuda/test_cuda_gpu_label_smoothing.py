"""Label smoothing's CUDA twins on a real GPU, through pytfm.ops with CuPy arrays, against the
C kernels on the same inputs: the paper's vocabulary (37000) and GPT-2's, rows for a block
each, ignored targets, an offset view (the scalar heads and tails). Skipped where CuPy, a GPU
or a CUDA build of pytfm is missing. scripts/gpu_check.sh runs a fixed list of GPU test files
that does not name this one: on a GPU, run it by hand
(python -m pytest tests/cuda/test_cuda_gpu_label_smoothing.py)."""

import numpy as np
import pytest

from helpers import EPS32, assert_close, bits, cupy_on_a_gpu
from pytfm import ops

cp = cupy_on_a_gpu()


def offset_view(a):
    """a CuPy copy of a starting one float past a 16-byte boundary"""
    flat = cp.empty(a.size + 4, np.float32)
    v = flat[1:1 + a.size].reshape(a.shape)
    v[...] = a
    return v


@pytest.mark.parametrize("vocab", [37000, 50304])
@pytest.mark.parametrize("eps", [0.1, 1.0])
def test_smoothed_cross_entropy_matches_the_c_kernels(vocab, eps):
    rows = 512
    rng = np.random.default_rng(vocab)
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    targets = rng.integers(0, vocab, size=rows)
    targets[::5] = -1
    loss, lse = ops.cross_entropy_forward(logits, targets, label_smoothing=eps)
    d = ops.cross_entropy_backward(logits, targets, lse, dloss=0.5, label_smoothing=eps)
    mag = EPS32 * float(abs(logits).max())
    kept = int((targets != -1).sum())
    gt = cp.asarray(targets)
    for name, g in (("aligned", cp.asarray(logits)), ("offset", offset_view(cp.asarray(logits)))):
        gloss, glse = ops.cross_entropy_forward(g, gt, label_smoothing=eps)
        gd = ops.cross_entropy_backward(g, gt, glse, dloss=0.5, label_smoothing=eps)
        # each within its bound of the float64 result (tests/ops_registry.py): twice it here
        assert_close(f"cuda-gpu.label_smoothing.{name}.lse", cp.asnumpy(glse), lse,
                     atol=2e-5 + 16 * mag, rtol=2e-6)
        assert_close(f"cuda-gpu.label_smoothing.{name}.loss", float(gloss), float(loss),
                     atol=2e-5 + 16 * mag, rtol=2e-5)
        assert_close(f"cuda-gpu.label_smoothing.{name}.backward", cp.asnumpy(gd), d,
                     atol=(2e-6 + 16 * mag) * 0.5 / kept, rtol=2e-4)
        assert (cp.asnumpy(gd)[targets == -1] == 0).all()
        again = ops.cross_entropy_backward(g, gt, glse, dloss=0.5, label_smoothing=eps)
        np.testing.assert_array_equal(bits(cp.asnumpy(again)), bits(cp.asnumpy(gd)))
