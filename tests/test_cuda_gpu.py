"""The CUDA kernels on a real GPU, through pytfm.ops with CuPy arrays, against the C kernels
(NumPy arrays) on the same inputs. Skipped where CuPy, a GPU or a CUDA build of pytfm is
missing; scripts/gpu_check.sh runs them on a machine that has all three.
"""

import numpy as np
import pytest

import pytfm
from helpers import assert_close
from pytfm import ops

cp = pytest.importorskip("cupy", reason="CuPy is not installed (pip install cupy-cuda13x)")
if not pytfm.build_info()["cuda"]:
    pytest.skip("pytfm was built without CUDA (nvcc not found)", allow_module_level=True)
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no device")
except Exception as e:  # no driver or no device
    pytest.skip(f"no CUDA GPU here ({e})", allow_module_level=True)

EPS32 = float(np.finfo(np.float32).eps)
SIZES = [(1, 1), (3, 7), (33, 65), (257, 1024), (7, 1025), (129, 4099)]


def both(rng, shape, scale=1.0, offset=0.0):
    a = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
    return a, cp.asarray(a)


def same(name, gpu, cpu, atol, rtol=1e-5):
    assert isinstance(gpu, cp.ndarray) or np.isscalar(gpu), type(gpu)
    assert_close(f"cuda-gpu.{name}", cp.asnumpy(gpu) if isinstance(gpu, cp.ndarray) else gpu,
                 cpu, atol=atol, rtol=rtol)


@pytest.mark.parametrize("rows,inn,out", [(1, 1, 1), (65, 17, 63), (256, 512, 384),
                                          (1000, 129, 3)])
def test_linear(rows, inn, out):
    rng = np.random.default_rng(rows)
    (x, gx), (w, gw), (b, gb) = both(rng, (rows, inn)), both(rng, (out, inn)), both(rng, out)
    tol = 4 * inn * EPS32 * (abs(x) @ abs(w).T + abs(b))
    same("linear.forward", ops.linear_forward(gx, gw, gb), ops.linear_forward(x, w, b), tol)
    dy, gdy = both(rng, (rows, out))
    for name, g, c in zip(("dx", "dw", "db"), ops.linear_backward(gdy, gx, gw),
                          ops.linear_backward(dy, x, w)):
        same(f"linear.backward.{name}", g, c,
             atol=4 * max(rows, out) * EPS32 * float(abs(c).max() + 1))


@pytest.mark.parametrize("rows,cols", SIZES)
def test_softmax_and_layernorm(rows, cols):
    rng = np.random.default_rng(rows * cols)
    (x, gx), (dy, gdy) = both(rng, (rows, cols), 3.0), both(rng, (rows, cols))
    y = ops.softmax_forward(x)
    same("softmax.forward", ops.softmax_forward(gx), y, atol=1e-7, rtol=1e-4)
    same("softmax.backward", ops.softmax_backward(gdy, cp.asarray(y)), ops.softmax_backward(dy, y),
         atol=4 * cols * EPS32 * float(abs(dy).max()), rtol=1e-4)
    (w, gw), (b, gb) = both(rng, cols), both(rng, cols)
    cpu, gpu = ops.layernorm_forward(x, w, b), ops.layernorm_forward(gx, gw, gb)
    for name, g, c in zip(("y", "mean", "rstd"), gpu, cpu):
        same(f"layernorm.forward.{name}", g, c, atol=1e-5 * (1 + float(abs(c).max())), rtol=1e-4)
    _, mean, rstd = cpu
    cpu = ops.layernorm_backward(dy, x, w, mean, rstd)
    gpu = ops.layernorm_backward(gdy, gx, gw, cp.asarray(mean), cp.asarray(rstd))
    for name, g, c in zip(("dx", "dw", "db"), gpu, cpu):
        same(f"layernorm.backward.{name}", g, c, atol=1e-5 * rows * (1 + float(abs(c).max())),
             rtol=1e-4)


def test_rope_gelu_embedding_cross_entropy_adamw():
    rng = np.random.default_rng(0)
    x, gx = both(rng, (2, 33, 3, 64))
    pos = np.arange(33, dtype=np.int64) + 7
    same("rope.forward", ops.rope_forward(gx, cp.asarray(pos)), ops.rope_forward(x, pos), 1e-5)
    same("rope.backward", ops.rope_backward(gx, cp.asarray(pos)), ops.rope_backward(x, pos), 1e-5)
    same("gelu.forward", ops.gelu_forward(gx), ops.gelu_forward(x), 1e-6, 1e-5)
    dy, gdy = both(rng, x.shape)
    same("gelu.backward", ops.gelu_backward(gdy, gx), ops.gelu_backward(dy, x), 1e-6, 1e-5)

    table, gtable = both(rng, (50, 96))
    ids = rng.integers(0, 50, size=(4, 300))  # repeats
    same("embedding.forward", ops.embedding_forward(cp.asarray(ids), gtable),
         ops.embedding_forward(ids, table), 0, 0)
    dy, gdy = both(rng, (4, 300, 96))
    same("embedding.backward", ops.embedding_backward(gdy, cp.asarray(ids), 50),
         ops.embedding_backward(dy, ids, 50), 1e-5)
    with pytest.raises(ValueError, match=r"ids\[1\] = 50 is outside \[0, 50\)"):
        ops.embedding_forward(cp.asarray(np.array([0, 50])), gtable)

    for vocab in (5, 256, 5000):
        logits, glogits = both(rng, (300, vocab), 3.0)
        targets = rng.integers(0, vocab, size=300)
        targets[::7] = -1
        loss, lse = ops.cross_entropy_forward(logits, targets)
        gloss, glse = ops.cross_entropy_forward(glogits, cp.asarray(targets))
        same("cross_entropy.loss", gloss, loss, 1e-5, 1e-5)
        same("cross_entropy.lse", glse, lse, 1e-5, 1e-6)
        same("cross_entropy.backward",
             ops.cross_entropy_backward(glogits, cp.asarray(targets), glse),
             ops.cross_entropy_backward(logits, targets, lse), 1e-7, 1e-4)

    p, g, m, v = (a.astype(np.float32) for a in rng.standard_normal((4, 1000)))
    v = abs(v)
    gp, gg, gm, gv = (cp.asarray(a) for a in (p, g, m, v))
    ops.adamw_step(p, g, m, v, 10, 1e-3, weight_decay=0.1)
    ops.adamw_step(gp, gg, gm, gv, 10, 1e-3, weight_decay=0.1)
    for name, a, b in (("param", gp, p), ("m", gm, m), ("v", gv, v)):
        same(f"adamw.{name}", a, b, 1e-6, 1e-5)


def test_mixing_numpy_and_cupy_is_an_error():
    w = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="x is a CuPy array but w is a NumPy array"):
        ops.linear_forward(cp.ones((2, 3), cp.float32), w)


def test_runs_on_the_current_stream():
    rng = np.random.default_rng(1)
    x, gx = both(rng, (64, 300))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        y = ops.softmax_forward(gx)
    stream.synchronize()
    same("softmax.stream", y, ops.softmax_forward(x), 1e-7, 1e-4)
