"""The tensor-core kernels on a real GPU: the TF32 and BF16 products (cuda/sgemm_tc.cu, through
pytfm_sgemm_ex_cuda and the linear layer's _ex twins) and attention forward and backward
(cuda/attention_tc.cu) against float64 references, the real instructions' fragment layouts,
roundings and sums. Skipped without CuPy, a GPU or a CUDA build (scripts/gpu_check.sh runs them
where all three are); the same checks run here on the CPU emulator at small shapes
(test_the_checks_hold_on_the_emulator), so their code cannot break unseen.

Products, against the float64 product of the unrounded inputs. u is the format's unit roundoff
(TF32: 2^-11, BF16: 2^-8), u32 = 2^-24. The kernel rounds each input to the format, r(a) =
a(1 + α), |α| <= u (TF32 to nearest, ties away; BF16 to nearest even), so each product
r(a)·r(b) = ab(1 + α)(1 + β) is off by at most (2u + u²)|ab|, and is exact in FP32 (11 × 11 or
8 × 8 significant bits). The k products, and β·C (one rounding of β·C, one add), are summed in
FP32: at most k + 2 roundings in a term's way, each at most 2·u32 of the partial sum it rounds
(2·u32 also covers an accumulator that truncates: the order and rounding inside one mma are not
specified), on terms of at most (1 + u)²|ab|. So, per element,
    |err| <= (2u + u²)·Σ_p|a_ip||b_pj| + 1.01·(k + 2)·2u32·((1 + u)²·Σ_p|a_ip||b_pj| + |β·C_ij|)
(1.01: the second-order terms, while (k + 2)·2u32 < 0.01). The linear layer's y = x·Wᵀ + b is
this with C = b, β = 1; its dx = dy·W and dW += dyᵀ·x too (dW's start as C); db, the column sums
of dy, is unrounded FP32 (2·rows·eps32·Σ|dy|); GELU's output adds |gelu'| <= 1.13 times h's bound
and its own few roundings.

Attention, against the float64 reference on the inputs rounded as the kernels round them, within
tests/cuda/test_cuda_tc_attention.py's derived bound (forward_want, backward_want: the rounded
inputs multiply exactly, the scores, the softmax's rescales and every sum in FP32, P, dy and dS
rounded to the format as they enter a product; the derivation is that module's docstring, its
one home), on shapes that take every path of the kernels: T = 1, ragged tiles, several tiles,
causal and not, each head dim of the kernels (16, 32, 64, 128), grouped heads and windows. The
backward runs twice: no atomics, the same bits.
"""

import math

import numpy as np
import pytest

from helpers import EPS32, assert_close, bits, cupy_on_a_gpu
from pytfm import ops

FP32, BF16, TF32 = 0, 1, 2  # pytfm_precision
NAMES = {TF32: "tf32", BF16: "bf16"}
UNIT = {TF32: 2.0**-11, BF16: 2.0**-8}
U32 = 2.0**-24


def product_bound(k, u, mag, c=0.0):
    """the module docstring's bound: mag = Σ_p|a||b| per element, c = |β·C|"""
    return (2 * u + u * u) * mag + 1.01 * (k + 2) * 2 * U32 * ((1 + u) ** 2 * mag + c)


def stream(cp):
    from pytfm import _core

    return _core.ffi.cast("void *", cp.cuda.get_current_stream().ptr)


def check_sgemm_ex(cp, m, n, k, trans_a, trans_b, beta, precision, seed=0, tag="cuda-gpu"):
    """pytfm_sgemm_ex_cuda (CuPy arrays, the current stream) against the float64 product of the
    unrounded operands, within product_bound"""
    from pytfm import _core

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    ga, gb = cp.asarray(a), cp.asarray(b)
    gc = cp.asarray(c0) if beta else cp.asarray(np.full((m, n), np.nan, np.float32))
    p = lambda x: _core.ffi.cast("float *", x.data.ptr)  # noqa: E731
    _core.check(_core.lib.pytfm_sgemm_ex_cuda(p(gc), p(ga), p(gb), m, n, k, trans_a, trans_b,
                                              beta, precision, stream(cp)))
    opa = (a.T if trans_a else a).astype(np.float64)
    opb = (b.T if trans_b else b).astype(np.float64)
    bc = beta * c0.astype(np.float64)
    tol = product_bound(k, UNIT[precision], abs(opa) @ abs(opb), abs(bc))
    assert_close(f"{tag}.sgemm_ex.{NAMES[precision]}", cp.asnumpy(gc), opa @ opb + bc,
                 atol=tol, rtol=0.0)


def check_linear_ex(cp, rows, inn, out, bias, precision, seed=0, tag="cuda-gpu"):
    """ops.linear_forward, linear_gelu_forward and linear_backward (dw and db accumulated) in
    TF32 or BF16 on CuPy arrays (the _ex twins) against float64 on the unrounded inputs"""
    rng = np.random.default_rng(seed)
    x, w, dy = (rng.standard_normal(s).astype(np.float32)
                for s in ((rows, inn), (out, inn), (rows, out)))
    b = rng.standard_normal(out).astype(np.float32) if bias else None
    dw0, db0 = rng.standard_normal((out, inn)).astype(np.float32), rng.standard_normal(
        out).astype(np.float32)
    u, name = UNIT[precision], NAMES[precision]
    g = {k_: None if v is None else cp.asarray(v) for k_, v in dict(x=x, w=w, b=b, dy=dy).items()}
    x64, w64, dy64 = (t.astype(np.float64) for t in (x, w, dy))
    b64 = np.zeros(out) if b is None else b.astype(np.float64)
    h_want = x64 @ w64.T + b64
    h_tol = product_bound(inn, u, abs(x64) @ abs(w64.T), abs(b64))
    y = ops.linear_forward(g["x"], g["w"], g["b"], precision=name)
    assert_close(f"{tag}.linear_forward_ex.{name}", cp.asnumpy(y), h_want, atol=h_tol,
                 rtol=0.0)
    y, h = ops.linear_gelu_forward(g["x"], g["w"], g["b"], precision=name)
    assert_close(f"{tag}.linear_gelu_forward_ex.{name}.h", cp.asnumpy(h), h_want, atol=h_tol,
                 rtol=0.0)
    from pytfm import reference as ref

    # |gelu'| <= 1.13: h's error carries over to y, plus gelu's own few roundings
    assert_close(f"{tag}.linear_gelu_forward_ex.{name}.y", cp.asnumpy(y),
                 ref.gelu_forward(h_want), atol=1.2 * h_tol + 4 * EPS32 * (1.0 + abs(h_want)),
                 rtol=0.0)
    gdw, gdb = cp.asarray(dw0), cp.asarray(db0)
    dx, dw, db = ops.linear_backward(g["dy"], g["x"], g["w"], has_bias=bias, dw=gdw,
                                     db=gdb if bias else None, precision=name)
    assert_close(f"{tag}.linear_backward_ex.{name}.dx", cp.asnumpy(dx), dy64 @ w64,
                 atol=product_bound(out, u, abs(dy64) @ abs(w64)), rtol=0.0)
    assert_close(f"{tag}.linear_backward_ex.{name}.dw", cp.asnumpy(dw),
                 dw0 + dy64.T @ x64,
                 atol=product_bound(rows, u, abs(dy64.T) @ abs(x64), abs(dw0)), rtol=0.0)
    if bias:
        assert_close(f"{tag}.linear_backward_ex.{name}.db", cp.asnumpy(db),
                     db0 + dy64.sum(0), atol=2 * rows * EPS32 * (abs(dy64).sum(0) + abs(db0)),
                     rtol=0.0)
    else:
        assert db is None


def check_attention_ex(cp, B, T, H, D, causal, precision, Hkv=None, window=0, seed=0,
                       tag="cuda-gpu"):
    """ops.attention_forward and attention_backward in TF32 or BF16 on CuPy arrays (the _ex
    twins; Hkv < H or a window: the grouped ones) against the reference on rounded inputs,
    within tests/cuda/test_cuda_tc_attention.py's bound; the backward's bits on a second run"""
    from test_cuda_tc_attention import backward_want, forward_want

    Hkv = Hkv or H
    rng = np.random.default_rng(seed)
    q, dy = (rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((B, T, Hkv, D)).astype(np.float32) for _ in range(2))
    scale, name = 1.0 / math.sqrt(D), NAMES[precision]
    gq, gk, gv, gdy = (cp.asarray(t) for t in (q, k, v, dy))
    o, lse = ops.attention_forward(gq, gk, gv, causal=causal, precision=name, window=window)
    (o_want, lse_want), (o_tol, lse_tol) = forward_want(q, k, v, causal, scale, precision,
                                                        window)
    label = f"{tag}.attention_ex.{name}"
    assert_close(f"{label}.o", cp.asnumpy(o), o_want, atol=o_tol, rtol=0.0)
    assert_close(f"{label}.lse", cp.asnumpy(lse), lse_want, atol=lse_tol, rtol=0.0)
    # the backward from the reference's o and lse, so that its bound is its own
    o32, lse32 = (np.ascontiguousarray(t, np.float32) for t in (o_want, lse_want))
    go, glse = cp.asarray(o32), cp.asarray(lse32)
    runs = [ops.attention_backward(gdy, gq, gk, gv, go, glse, causal=causal, precision=name,
                                   window=window) for _ in range(2)]
    want, tols = backward_want(dy, q, k, v, o32, lse32, causal, scale, precision, window)
    for what, got, again, w, t in zip(("dq", "dk", "dv"), *runs, want, tols, strict=True):
        got, again = cp.asnumpy(got), cp.asnumpy(again)
        assert_close(f"{label}.{what}", got, w, atol=t, rtol=0.0)
        assert bits(got).tolist() == bits(again).tolist(), f"{label}.{what}: other bits"


# ---- on the GPU ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu():
    return cupy_on_a_gpu()


PRECISIONS = pytest.mark.parametrize("precision", [TF32, BF16], ids=NAMES.get)
TRANS = [(0, 0), (0, 1), (1, 0), (1, 1)]


@PRECISIONS
@pytest.mark.parametrize("trans_a,trans_b", TRANS)
@pytest.mark.parametrize("m,n,k,beta", [(1, 1, 1, 0.0), (129, 131, 77, 1.5), (300, 70, 33, 0.0),
                                        (4097, 64, 129, 1.0), (64, 65, 4099, 0.0),
                                        (2048, 2048, 512, 0.0)])
def test_sgemm_ex_on_the_gpu(gpu, m, n, k, beta, trans_a, trans_b, precision):
    """every layout, ragged tiles, long k, and (2048² × 512 in BF16) the route through BF16
    copies of the operands"""
    check_sgemm_ex(gpu, m, n, k, trans_a, trans_b, beta, precision, seed=m + n + k)


@PRECISIONS
@pytest.mark.parametrize("rows,inn,out,bias", [(1, 1, 1, True), (130, 20, 9, True),
                                               (3, 17, 129, False), (1000, 768, 3072, True)])
def test_linear_ex_on_the_gpu(gpu, rows, inn, out, bias, precision):
    check_linear_ex(gpu, rows, inn, out, bias, precision, seed=rows + inn)


@PRECISIONS
@pytest.mark.parametrize("B,T,H,D,causal,Hkv,window", [
    (1, 1, 1, 16, True, None, 0), (2, 65, 3, 32, False, None, 0), (1, 300, 4, 64, True, None, 0),
    (1, 257, 2, 128, True, None, 0), (2, 129, 2, 128, False, None, 0),
    (1, 200, 8, 64, True, 2, 100), (1, 130, 4, 128, True, 1, 64), (2, 70, 2, 16, True, 2, 1)])
def test_attention_ex_on_the_gpu(gpu, B, T, H, D, causal, Hkv, window, precision):
    check_attention_ex(gpu, B, T, H, D, causal, precision, Hkv, window, seed=T + D)


# ---- the same checks on the emulator ---------------------------------------------------------


def test_the_checks_hold_on_the_emulator(cp):
    """Each check above at a small shape on the CPU emulator (the CuPy stand-in): the checks'
    own code runs on every machine; what only the GPU can show stays in the GPU tests."""
    tag = "cuda-emu.gpu-tc"
    for precision in (TF32, BF16):
        check_sgemm_ex(cp, 33, 17, 9, 1, 0, 1.5, precision, tag=tag)
        check_linear_ex(cp, 5, 7, 9, True, precision, tag=tag)
        check_linear_ex(cp, 3, 4, 5, False, precision, tag=tag)
        check_attention_ex(cp, 1, 33, 2, 16, True, precision, tag=tag)
        check_attention_ex(cp, 1, 20, 2, 16, True, precision, Hkv=1, window=5, tag=tag)


def test_a_wrong_product_fails_the_bound(cp, monkeypatch):
    """The products' bound can fail: a result whose inputs were truncated to the format instead
    of rounded, or a term left out, lands outside it (a check that cannot fail checks nothing)"""
    from pytfm import _core

    real = _core.lib

    class Off:
        def __getattr__(self, name):
            fn = getattr(real, name)
            if name != "pytfm_sgemm_ex_cuda":
                return fn

            def call(c, a, b, m, n, k, *rest):  # one term of k short
                return fn(c, a, b, m, n, k - 1, *rest)

            return call

    monkeypatch.setattr(_core, "lib", Off())
    with pytest.raises(AssertionError, match="out of tolerance|tol"):
        check_sgemm_ex(cp, 8, 8, 16, 0, 0, 0.0, BF16, tag="cuda-emu.gpu-tc.wrong")
