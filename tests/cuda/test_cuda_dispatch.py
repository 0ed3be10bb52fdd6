"""pytfm.ops' CuPy path, without CuPy or a GPU: a stand-in `cupy` module whose arrays are NumPy
arrays in disguise (their .data.ptr is host memory), and the library's _cuda functions answered
by the emulator build of cuda/ (tests/cuda_emu.py). So the dispatch (which backend, the shape
checks, outputs allocated by the array module, pointers from .data.ptr, the current stream, the
index checks done in Python for device arrays) runs end to end here and must give what the
NumPy path gives. The stand-in and the emulated library live in tests/fake_cupy.py (also used
by tests/cuda/test_cuda_model.py); tests/cuda/test_cuda_gpu.py runs the same path with real CuPy
on a GPU.
"""

import types

import numpy as np
import pytest

import pytfm
from cuda_emu import run_on_device
from fake_cupy import EmulatedLib, ndarray  # noqa: F401 - EmulatedLib: for the tests below
from helpers import assert_close
from ops_registry import checked, fresh
from pytfm import ops


@pytest.mark.parametrize("op", checked(cuda=True), ids=lambda op: op.name)
def test_every_twin_is_reached_through_pytfm_ops_on_cupy_arrays(cp, op):
    """Each op of tests/ops_registry.py with a CUDA twin, on CuPy arrays (its Check's first emu
    size): one call of the twin on the current stream, outputs made by the array module (or
    the caller's, updated in place) of the NumPy path's shapes and dtypes and values (within
    twice the twin's bound of the C kernel's)."""
    c = op.check
    values = c.emu[0]
    a = c.make(**values)
    want_c = c.run(fresh(a))
    asked = len(cp.streams_asked)
    got = run_on_device(cp, op, a)
    assert len(cp.streams_asked) == asked + 1, "not one call on the current stream"
    tols = (c.emu_tol or c.tol)(a, c.want(fresh(a)))
    for name, g, w, t in zip(c.outputs, got, want_c, tols, strict=True):
        if w is None:
            assert g is None, name
            continue
        assert type(g) is ndarray, f"{op.name}.{name}: a {type(g)}, not a cupy.ndarray"
        assert g.shape == np.shape(w), (name, g.shape, np.shape(w))
        if isinstance(w, np.ndarray):
            assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        assert_close(f"dispatch.{op.name}.{name}", g.get(), w, atol=2 * np.asarray(t.atol),
                     rtol=2 * t.rtol)


def test_cupy_arrays_run_the_cuda_kernels_and_match_numpy(cp):
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    x, w, b, dy = r(5, 33), r(7, 33), r(7), r(5, 7)
    y = ops.linear_forward(cp.asarray(x), cp.asarray(w), cp.asarray(b))
    assert type(y) is ndarray and y.shape == (5, 7)
    np.testing.assert_allclose(y, ops.linear_forward(x, w, b), rtol=1e-5, atol=1e-5)
    got = ops.linear_backward(cp.asarray(dy), cp.asarray(x), cp.asarray(w))
    for g, c in zip(got, ops.linear_backward(dy, x, w)):
        assert type(g) is ndarray
        np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-5)

    x3 = r(2, 3, 1030)  # leading axes flattened; the block-per-row kernels
    np.testing.assert_allclose(ops.softmax_forward(cp.asarray(x3)), ops.softmax_forward(x3),
                               rtol=1e-5, atol=1e-8)
    lw, lb = r(1030), r(1030)
    for g, c in zip(ops.layernorm_forward(cp.asarray(x3), cp.asarray(lw), cp.asarray(lb)),
                    ops.layernorm_forward(x3, lw, lb)):
        assert g.shape == c.shape
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-5)

    q, pos = r(2, 3, 2, 8), np.arange(3, dtype=np.int64)
    np.testing.assert_allclose(ops.rope_forward(cp.asarray(q), cp.asarray(pos)),
                               ops.rope_forward(q, pos), atol=1e-6)
    np.testing.assert_allclose(ops.gelu_backward(cp.asarray(q), cp.asarray(q)),
                               ops.gelu_backward(q, q), atol=1e-6)

    table, ids = r(6, 4), rng.integers(0, 6, size=(3, 5))
    np.testing.assert_array_equal(ops.embedding_forward(cp.asarray(ids), cp.asarray(table)),
                                  ops.embedding_forward(ids, table))
    gy = r(3, 5, 4)
    acc = cp.asarray(np.ones((6, 4), np.float32))
    out = ops.embedding_backward(cp.asarray(gy), cp.asarray(ids), 6, dtable=acc)
    assert out is acc  # accumulated into the caller's array
    np.testing.assert_array_equal(out, ops.embedding_backward(gy, ids, 6,
                                                              dtable=np.ones((6, 4), np.float32)))

    logits, targets = r(9, 11), rng.integers(0, 11, size=9)
    targets[2] = -1
    loss, lse = ops.cross_entropy_forward(cp.asarray(logits), cp.asarray(targets))
    closs, clse = ops.cross_entropy_forward(logits, targets)
    assert type(loss) is ndarray and loss.shape == ()  # the loss stays on the device
    assert type(closs) is np.ndarray and closs.shape == () and closs.dtype == loss.dtype
    closs = float(closs)
    assert abs(float(loss) - closs) <= 1e-5 * abs(closs)
    np.testing.assert_allclose(
        ops.cross_entropy_backward(cp.asarray(logits), cp.asarray(targets), lse, dloss=2.0),
        ops.cross_entropy_backward(logits, targets, clse, dloss=2.0), atol=1e-7, rtol=1e-5)

    p, g, m, v = r(50), r(50), r(50), abs(r(50))
    gp, gg, gm, gv = (cp.asarray(a.copy()) for a in (p, g, m, v))
    ops.adamw_step(gp, gg, gm, gv, 3, 1e-3, weight_decay=0.1)
    ops.adamw_step(p, g, m, v, 3, 1e-3, weight_decay=0.1)
    for a, c in ((gp, p), (gm, m), (gv, v)):
        np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-7)
    assert len(cp.streams_asked) == 11  # each of the 11 calls above asked for the stream


def test_cupy_arguments_are_checked_like_numpy_ones(cp):
    x = cp.asarray(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="x is a CuPy array but w is a NumPy array"):
        ops.linear_forward(x, np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"x.shape\[-1\] must equal w.shape\[1\] = 4"):
        ops.linear_forward(x, cp.asarray(np.ones((5, 4), np.float32)))
    with pytest.raises(TypeError, match="x must have dtype float32, got float64"):
        ops.softmax_forward(cp.asarray(np.ones((2, 3))))
    table = cp.asarray(np.ones((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"ids\[1\] = 3 is outside \[0, 3\)"):
        ops.embedding_forward(cp.asarray(np.array([0, 3, 1])), table)
    with pytest.raises(ValueError, match=r"targets\[0\] = -5 is outside \[0, 4\)"):
        ops.cross_entropy_forward(cp.asarray(np.ones((2, 4), np.float32)),
                                  cp.asarray(np.array([-5, -1])))


def test_one_dispatch_path_decides_the_backend_from_the_kernel_it_calls(cp, monkeypatch):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 5)).astype(np.float32), np.ones((2, 5), np.float32)
    # None becomes a NULL device pointer: no bias
    np.testing.assert_allclose(ops.linear_forward(cp.asarray(x), cp.asarray(w)),
                               ops.linear_forward(x, w), rtol=1e-6, atol=1e-6)
    # an array on another GPU than the current one
    with monkeypatch.context() as m:
        m.setattr(ndarray, "device", property(lambda a: types.SimpleNamespace(id=1)))
        with pytest.raises(ValueError, match=r"x is on GPU 1 but the current device is GPU 0"):
            ops.softmax_forward(cp.asarray(x))


def test_an_op_runs_on_cupy_once_its_kernel_has_a_cuda_twin(cp, monkeypatch):
    """Whether an op runs on CuPy is decided by its _cuda symbol alone: a library without
    pytfm_attention_forward_cuda (a build from before the GPU attention) makes CuPy input a
    TypeError. Give lib the symbol and the same call reaches it, with device pointers and the
    current stream, and nothing else in ops changes."""
    q = cp.asarray(np.ones((1, 3, 2, 4), np.float32))

    class WithoutAttention(type(pytfm._core.lib)):
        def __getattr__(self, name):
            if name == "pytfm_attention_forward_cuda":
                raise AttributeError(name)
            return super().__getattr__(name)

    with monkeypatch.context() as m:
        m.setattr(pytfm._core, "lib", WithoutAttention(pytfm._core.lib.emu))
        with pytest.raises(TypeError, match="q is a CuPy array, but this operation runs on Num"):
            ops.attention_forward(q, q, q)

    calls = []

    def attention_forward_cuda(o, lse, q_, k, v, B, T, H, D, scale, causal, stream):
        calls.append((int(pytfm._core.ffi.cast("uintptr_t", q_)), (B, T, H, D), scale, causal,
                      stream))
        return 0

    class WithAttention(type(pytfm._core.lib)):
        pass

    lib = WithAttention(pytfm._core.lib.emu)
    lib.pytfm_attention_forward_cuda = attention_forward_cuda
    monkeypatch.setattr(pytfm._core, "lib", lib)
    o, lse = ops.attention_forward(q, q, q, causal=False)
    assert type(o) is ndarray and o.shape == (1, 3, 2, 4) and lse.shape == (1, 2, 3)
    assert len(calls) == 1
    ptr, dims, scale, causal, stream = calls[0]
    assert ptr == q.data.ptr and dims == (1, 3, 2, 4) and scale == 0.5 and causal is False
    assert pytfm._core.ffi.typeof(stream).cname == "void *"


def test_qkv_split_linear_gelu_and_sum_squares_on_cupy(cp):
    """The twins the GPU model needs besides attention, through ops on (stand-in) CuPy arrays:
    outputs made by the array module, the same results as the NumPy path."""
    rng = np.random.default_rng(2)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    qkv, pos = r(2, 3, 3, 2, 8), np.array([[5, 6, 7], [0, 1, 2]], np.int64)
    for p in (None, pos, pos[1]):
        gp = None if p is None else cp.asarray(p)
        got = ops.qkv_split_forward(cp.asarray(qkv), gp)
        for g, c in zip(got, ops.qkv_split_forward(qkv, p)):
            assert type(g) is ndarray and g.shape == (2, 3, 2, 8)
            np.testing.assert_allclose(g, c, rtol=1e-6, atol=1e-6)
        grads = [r(2, 3, 2, 8) for _ in range(3)]
        dqkv = ops.qkv_split_backward(*(cp.asarray(a) for a in grads), gp)
        assert type(dqkv) is ndarray and dqkv.shape == qkv.shape
        np.testing.assert_allclose(dqkv, ops.qkv_split_backward(*grads, p), rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="qkv is a CuPy array but pos is a NumPy array"):
        ops.qkv_split_forward(cp.asarray(qkv), pos)
    with pytest.raises(ValueError, match=r"pos must have shape \(T,\) = \(3,\) or \(B, T\)"):
        ops.qkv_split_forward(cp.asarray(qkv), cp.asarray(pos[:, :2]))

    x, w, b = r(2, 5, 9), r(7, 9), r(7)
    for bias in (b, None):
        y, h = ops.linear_gelu_forward(cp.asarray(x), cp.asarray(w),
                                       None if bias is None else cp.asarray(bias))
        cy, ch = ops.linear_gelu_forward(x, w, bias)
        for g, c in ((y, cy), (h, ch)):
            assert type(g) is ndarray and g.shape == (2, 5, 7)
            np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)

    for a in (r(1000), r(3, 4), np.zeros(0, np.float32)):
        s = ops.sum_squares(cp.asarray(a))
        assert type(s) is ndarray and s.shape == () and s.dtype == np.float64  # on the device
        c = ops.sum_squares(a)
        assert type(c) is np.ndarray and c.shape == () and c.dtype == np.float64  # on the host
        c = float(c)
        assert abs(float(s) - c) <= 1e-12 * c
