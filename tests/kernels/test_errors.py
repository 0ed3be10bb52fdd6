"""Bad input: a clear exception naming the argument, nothing written, the interpreter alive."""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import pytfm
from pytfm import PytfmError, ops
from pytfm._core import check, ffi, lib
from pytfm.generate import generate, sample_next
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr

F = np.float32


def z(*shape, dtype=F):
    return np.zeros(shape, dtype)


def i64(*values):
    return np.array(values, dtype=np.int64)


class FakeCupyArray:  # what pytfm sees when a CuPy array arrives in a CPU-only build
    __module__ = "cupy._core.core"


x23, w43 = z(2, 3), z(4, 3)
readonly = z(4, 3)
readonly.flags.writeable = False

CASES = [
    # (call, exception, message pattern)
    (lambda: ops.linear_forward(z(2, 3, dtype=np.float64), w43), TypeError,
     r"x must have dtype float32, got float64"),
    (lambda: ops.linear_forward([[1.0, 2.0, 3.0]], w43), TypeError,
     r"x must be a numpy.ndarray of float32, got list"),
    (lambda: ops.linear_forward(FakeCupyArray(), w43), TypeError, r"x is a CuPy array"),
    (lambda: ops.linear_forward(x23, z(3)), ValueError,
     r"w must have 2 dimensions, got shape \(3,\)"),
    (lambda: ops.linear_forward(z(2, 5), w43), ValueError,
     r"x.shape\[-1\] must equal w.shape\[1\] = 3 .*got x.shape \(2, 5\)"),
    (lambda: ops.linear_forward(x23, w43, z(3)), ValueError,
     r"b must have shape \(4,\).*got \(3,\)"),
    (lambda: ops.linear_forward(z(3, 2).T, w43), ValueError, r"x must be C-contiguous"),
    (lambda: ops.linear_forward(x23, z(0, 3)), ValueError, r"w must have shape \(out, in\) .*>= 1"),
    (lambda: ops.linear_backward(z(2, 5), x23, w43), ValueError, r"dy must have shape \(2, 4\)"),
    (lambda: ops.linear_backward(z(2, 4), x23, w43, has_bias=False, db=z(4)), ValueError,
     r"db was given but has_bias is False"),
    (lambda: ops.linear_backward(z(2, 4), x23, w43, dw=z(3, 4)), ValueError,
     r"dw must have shape \(4, 3\)"),
    (lambda: ops.linear_backward(z(2, 4), x23, w43, dw=readonly), ValueError,
     r"dw must be writable"),
    (lambda: ops.softmax_forward(z(2, 0)), ValueError, r"x.shape\[-1\] .* must be >= 1"),
    (lambda: ops.softmax_forward(z(2, 3, dtype=np.int32)), TypeError, r"x must have dtype float32"),
    (lambda: ops.softmax_forward(z()), ValueError, r"x must have at least 1 dimension"),
    (lambda: ops.softmax_backward(z(2, 4), x23), ValueError, r"dy must have shape \(2, 3\)"),
    (lambda: ops.layernorm_forward(x23, z(4), z(3)), ValueError, r"w must have shape \(3,\)"),
    (lambda: ops.layernorm_forward(x23, z(3), z(3), eps=-1.0), ValueError,
     r"eps must be >= 0, got -1"),
    (lambda: ops.layernorm_forward(x23, z(3), z(3), eps=float("nan")), ValueError,
     r"eps must be finite"),
    (lambda: ops.layernorm_forward(x23, z(3), z(3), eps="small"), TypeError,
     r"eps must be a real number, got str"),
    (lambda: ops.layernorm_backward(x23, x23, z(3), z(3), z(2)), ValueError,
     r"mean must have shape \(2,\)"),
    (lambda: ops.rope_forward(z(2, 3, 4), i64(0, 1, 2)), ValueError, r"x must have 4 dimensions"),
    (lambda: ops.rope_forward(z(1, 3, 2, 5), i64(0, 1, 2)), ValueError,
     r"x.shape\[3\] \(head dim D\) must be even and >= 2"),
    (lambda: ops.rope_forward(z(1, 3, 2, 4), np.arange(3.0)), TypeError,
     r"pos must have dtype int64, got float64"),
    (lambda: ops.rope_forward(z(1, 3, 2, 4), i64(0, 1)), ValueError,
     r"pos must have shape \(T,\) = \(3,\) or \(B, T\) = \(1, 3\)"),
    (lambda: ops.rope_forward(z(1, 3, 2, 4), i64(0, 1, 2), base=0.0), ValueError,
     r"base must be finite and > 0"),
    (lambda: ops.rope_backward(z(1, 3, 2, 4), i64(0, 1, 2), base=None), TypeError,
     r"base must be a real number"),
    (lambda: ops.gelu_forward(z(3, dtype=np.float16)), TypeError, r"x must have dtype float32"),
    (lambda: ops.gelu_backward(z(4), z(3)), ValueError, r"dy must have shape \(3,\)"),
    (lambda: ops.embedding_forward(i64(0, 256), z(4, 3)), ValueError,
     r"ids\[1\] = 256 is outside \[0, 4\)"),
    (lambda: ops.embedding_forward(i64(-1), z(4, 3)), ValueError, r"ids\[0\] = -1 is outside"),
    (lambda: ops.embedding_forward(np.array([0, 1], np.int32), z(4, 3)), TypeError,
     r"ids must have dtype int64, got int32"),
    (lambda: ops.embedding_forward(i64(0), z(4)), ValueError, r"table must have 2 dimensions"),
    (lambda: ops.embedding_forward(i64(0), z(0, 3)), ValueError, r"table must have shape"),
    (lambda: ops.embedding_backward(z(2, 3), i64(0, 1), 0), ValueError, r"vocab must be >= 1"),
    (lambda: ops.embedding_backward(z(2, 3), i64(0, 1), 4.0), TypeError,
     r"vocab must be an integer"),
    (lambda: ops.embedding_backward(z(3, 3), i64(0, 1), 4), ValueError,
     r"dy must have shape \(2, 3\)"),
    (lambda: ops.embedding_backward(z(2, 3), i64(0, 4), 4), ValueError, r"ids\[1\] = 4 is outside"),
    (lambda: ops.cross_entropy_forward(x23, i64(0, 7)), ValueError,
     r"targets\[1\] = 7 is outside \[0, 3\)"),
    (lambda: ops.cross_entropy_forward(x23, i64(0, 1, 2)), ValueError,
     r"targets must have shape \(2,\)"),
    (lambda: ops.cross_entropy_forward(z(2, 0), i64(0, 1)), ValueError, r"logits.shape\[-1\]"),
    (lambda: ops.cross_entropy_backward(x23, i64(0, 1), z(3)), ValueError,
     r"lse must have shape \(2,\)"),
    (lambda: ops.cross_entropy_backward(x23, i64(0, 1), z(2), dloss=float("inf")), ValueError,
     r"dloss must be finite"),
    (lambda: ops.adamw_step(z(3), z(3), z(3), z(3), step=0, lr=0.1), ValueError,
     r"step must be >= 1, got 0"),
    (lambda: ops.adamw_step(z(3), z(3), z(3), z(3), step=1.5, lr=0.1), TypeError,
     r"step must be an integer"),
    (lambda: ops.adamw_step(z(3), z(3), z(3), z(3), step=1, lr=-0.1), ValueError,
     r"lr must be finite and >= 0"),
    (lambda: ops.adamw_step(z(3), z(3), z(3), z(3), step=1, lr=0.1, beta1=1.0), ValueError,
     r"beta1 must be in \[0, 1\)"),
    (lambda: ops.adamw_step(z(3), z(4), z(3), z(3), step=1, lr=0.1), ValueError,
     r"grad must have shape \(3,\)"),
    (lambda: ops.adamw_step(z(4, 3), z(4, 3), readonly, z(4, 3), step=1, lr=0.1), ValueError,
     r"m must be writable"),
    (lambda: ops.adamw_step(x23, z(2, 3), x23, z(2, 3), step=1, lr=0.1), ValueError,
     r"param and m must not share memory"),
]


@pytest.mark.parametrize("call,exc,pattern", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_bad_input_raises_a_clear_error(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# ---- scalar arguments: bool, huge, NaN ---------------------------------------------------------
# An integer argument is an int64_t in C, a real one a float (a double for rope's base and
# AdamW's hyper-parameters), causal and has_bias an int32_t flag. Python hands over more than
# those hold: ints of any size, True (an int), None.

HUGE = 10**400  # beyond float64: float(HUGE) raises OverflowError
q4 = z(1, 2, 2, 4)
ce = (x23, i64(0, 1))  # logits, targets
adam = (z(3), z(3), z(3), z(3))


def ln(eps):
    return ops.layernorm_forward(x23, z(3), z(3), eps=eps)


def rope(base):
    return ops.rope_forward(z(1, 3, 2, 4), i64(0, 1, 2), base=base)


def adamw(**hyper):
    return ops.adamw_step(*adam, **{"step": 1, "lr": 0.1, **hyper})


def decode(start, scale=None):
    return ops.attention_decode(q4, z(1, 8, 2, 4), z(1, 8, 2, 4), start=start, scale=scale)


SCALAR_CASES = [
    # integers: no bool, nothing beyond int64
    (lambda: ops.embedding_backward(z(2, 3), i64(0, 1), True), TypeError,
     r"vocab must be an integer, got bool \(True\)"),
    (lambda: ops.embedding_backward(z(2, 3), i64(0, 1), np.True_), TypeError,
     r"vocab must be an integer, got bool"),
    (lambda: ops.embedding_backward(z(2, 3), i64(0, 1), 2**63), ValueError,
     r"vocab must fit in int64, \[-2\*\*63, 2\*\*63 - 1\], got 9223372036854775808"),
    (lambda: ops.embedding_backward(z(2, 3), i64(0, 1), -HUGE), ValueError,
     r"vocab must fit in int64.*got an integer of 1329 bits"),
    (lambda: ops.embedding_backward(z(2, 3), i64(0, 1), 2**62), ValueError,
     r"dtable of shape \(4611686018427387904, 3\) cannot be allocated"),
    (lambda: ops.cross_entropy_forward(*ce, ignore_index=2**63), ValueError,
     r"ignore_index must fit in int64"),
    (lambda: ops.cross_entropy_forward(*ce, ignore_index=False), TypeError,
     r"ignore_index must be an integer, got bool"),
    (lambda: ops.cross_entropy_backward(*ce, z(2), ignore_index=-1.0), TypeError,
     r"ignore_index must be an integer, got float"),
    (lambda: adamw(step=True), TypeError, r"step must be an integer, got bool"),
    (lambda: adamw(step=HUGE), ValueError, r"step must fit in int64"),
    (lambda: adamw(step=2**63 - 1, lr=0.0), None, None),  # the largest step is fine
    (lambda: decode(start=True), TypeError, r"start must be an integer, got bool"),
    (lambda: decode(start=2**64), ValueError, r"start must fit in int64"),
    (lambda: ops.attention_cache_append(z(1, 8, 2, 4), z(1, 8, 2, 4), q4, q4, start=-(2**70)),
     ValueError, r"start must fit in int64"),
    (lambda: ops.attention_cache_append(z(1, 8, 2, 4), z(1, 8, 2, 4), q4, q4, start=None),
     TypeError, r"start must be an integer, got NoneType"),
    (lambda: pytfm.KVCache(True, 4, 2, 4), TypeError, r"batch must be an integer, got bool"),
    (lambda: pytfm.KVCache(1, 2**64, 2, 4), ValueError, r"max_len must fit in int64"),
    # reals for a C float: no bool, nothing beyond float32; NaN and inf go to the C checks
    (lambda: ln(HUGE), ValueError,
     r"eps must fit in float32 \(\|eps\| <= 3.402823e\+38\), got an integer of 1329 bits"),
    (lambda: ln(1e39), ValueError, r"eps must fit in float32 .*got 1e\+39"),
    (lambda: ln(np.float64(-1e300)), ValueError, r"eps must fit in float32"),
    (lambda: ln(True), TypeError, r"eps must be a real number, got bool"),
    (lambda: ln(np.False_), TypeError, r"eps must be a real number, got bool"),
    (lambda: ln(float("inf")), ValueError, r"eps must be finite, got inf"),
    (lambda: ln(np.float32("nan")), ValueError, r"eps must be finite, got nan"),
    (lambda: ln(np.float16(1e-3)), None, None),  # any NumPy real is fine
    (lambda: ops.cross_entropy_backward(*ce, z(2), dloss=HUGE), ValueError,
     r"dloss must fit in float32"),
    (lambda: ops.cross_entropy_backward(*ce, z(2), dloss=-1e39), ValueError,
     r"dloss must fit in float32"),
    (lambda: ops.cross_entropy_backward(*ce, z(2), dloss=True), TypeError,
     r"dloss must be a real number, got bool"),
    (lambda: ops.cross_entropy_backward(*ce, z(2), dloss=float("nan")), ValueError,
     r"dloss must be finite"),
    (lambda: ops.attention_forward(q4, q4, q4, scale=HUGE), ValueError,
     r"scale must fit in float32"),
    (lambda: ops.attention_forward(q4, q4, q4, scale=1e39), ValueError,
     r"scale must fit in float32"),
    (lambda: ops.attention_forward(q4, q4, q4, scale=True), TypeError,
     r"scale must be a real number, got bool"),
    (lambda: ops.attention_forward(q4, q4, q4, scale=-float("inf")), ValueError,
     r"scale must be finite"),
    (lambda: ops.attention_backward(q4, q4, q4, q4, q4, z(1, 2, 2), scale=1e39), ValueError,
     r"scale must fit in float32"),
    (lambda: decode(0, scale=HUGE), ValueError, r"scale must fit in float32"),
    (lambda: decode(0, scale=float("nan")), ValueError, r"scale must be finite"),
    # reals for a C double: nothing beyond float64
    (lambda: rope(HUGE), ValueError, r"base must fit in float64 \(\|base\| <= 1.797693e\+308\)"),
    (lambda: rope(True), TypeError, r"base must be a real number, got bool"),
    (lambda: rope(float("nan")), ValueError, r"base must be finite and > 0, got nan"),
    (lambda: rope(1e300), None, None),  # a double holds it
    (lambda: adamw(lr=HUGE), ValueError, r"lr must fit in float64"),
    (lambda: adamw(lr=True), TypeError, r"lr must be a real number, got bool"),
    (lambda: adamw(lr=float("nan")), ValueError, r"lr must be finite and >= 0, got nan"),
    (lambda: adamw(beta1=float("nan")), ValueError, r"beta1 must be in \[0, 1\), got nan"),
    (lambda: adamw(beta2=np.True_), TypeError, r"beta2 must be a real number, got bool"),
    (lambda: adamw(eps=-HUGE), ValueError, r"eps must fit in float64"),
    (lambda: adamw(eps=float("inf")), ValueError, r"eps must be finite and > 0, got inf"),
    (lambda: adamw(weight_decay=float("nan")), ValueError, r"weight_decay must be finite"),
    (lambda: adamw(weight_decay=False), TypeError, r"weight_decay must be a real number"),
    # flags: a bool, not None, 0 or a string
    (lambda: ops.attention_forward(q4, q4, q4, causal=None), TypeError,
     r"causal must be a bool \(True or False\), got NoneType"),
    (lambda: ops.attention_forward(q4, q4, q4, causal=0), TypeError,
     r"causal must be a bool .*got int"),
    (lambda: ops.attention_forward(q4, q4, q4, causal="no"), TypeError,
     r"causal must be a bool .*got str"),
    (lambda: ops.attention_forward(q4, q4, q4, causal=np.False_), None, None),
    (lambda: ops.attention_backward(q4, q4, q4, q4, q4, z(1, 2, 2), causal=None), TypeError,
     r"causal must be a bool"),
    (lambda: ops.linear_backward(z(2, 4), x23, w43, has_bias=None), TypeError,
     r"has_bias must be a bool .*got NoneType"),
    (lambda: ops.linear_backward(z(2, 4), x23, w43, has_bias=1), TypeError,
     r"has_bias must be a bool .*got int"),
]


@pytest.mark.parametrize("call,exc,pattern", SCALAR_CASES,
                         ids=[f"scalar{i}" for i in range(len(SCALAR_CASES))])
def test_bad_scalars_raise_a_clear_error_naming_them(call, exc, pattern):
    if exc is None:  # a value at the edge that must be accepted
        call()
        return
    with pytest.raises(exc, match=pattern):
        call()


def tiny_model():
    return GPT(GPTConfig(d_model=8, n_layer=1, n_head=2, max_seq=8))


def params_and_grads():
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 2)).astype(F), "b": rng.standard_normal(2).astype(F)}
    return params, {k: np.ones_like(p) for k, p in params.items()}


PROMPT = i64(1, 2)[None, :]

PYTHON_API_CASES = [
    (lambda: AdamW(*params_and_grads(), lr=True), TypeError, r"lr must be a real number, got bool"),
    (lambda: AdamW(*params_and_grads(), lr=-1.0), ValueError, r"lr must be finite and >= 0"),
    (lambda: AdamW(*params_and_grads(), lr=HUGE), ValueError, r"lr must fit in float64"),
    (lambda: AdamW(*params_and_grads(), betas=(0.9,)), TypeError,
     r"betas must be a pair \(beta1, beta2\)"),
    (lambda: AdamW(*params_and_grads(), betas=(1.0, 0.9)), ValueError,
     r"betas\[0\] must be in \[0, 1\), got 1.0"),
    (lambda: AdamW(*params_and_grads(), betas=(0.9, float("nan"))), ValueError,
     r"betas\[1\] must be in \[0, 1\), got nan"),
    (lambda: AdamW(*params_and_grads(), eps=0.0), ValueError, r"eps must be finite and > 0"),
    (lambda: AdamW(*params_and_grads(), weight_decay=float("inf")), ValueError,
     r"weight_decay must be finite and >= 0"),
    (lambda: clip_grad_norm(params_and_grads()[1], float("nan")), ValueError,
     r"max_norm must be >= 0 \(inf: no clipping\), got nan"),
    (lambda: clip_grad_norm(params_and_grads()[1], -1), ValueError, r"max_norm must be >= 0"),
    (lambda: clip_grad_norm(params_and_grads()[1], True), TypeError,
     r"max_norm must be a real number, got bool"),
    (lambda: cosine_lr(-1, 1e-3, 10, 100), ValueError, r"step must be >= 0, got -1"),
    (lambda: cosine_lr(True, 1e-3, 10, 100), TypeError, r"step must be an integer, got bool"),
    (lambda: cosine_lr(0, 1e-3, 1.5, 100), TypeError, r"warmup must be an integer, got float"),
    (lambda: cosine_lr(0, 1e-3, 10, 2**64), ValueError, r"total must fit in int64"),
    (lambda: cosine_lr(0, float("nan"), 10, 100), ValueError, r"max_lr must be finite and >= 0"),
    (lambda: cosine_lr(0, 1e-3, 10, 100, min_lr=HUGE), ValueError, r"min_lr must fit in float64"),
    (lambda: generate(tiny_model(), PROMPT, 2, temperature=-1.0), ValueError,
     r"temperature must be finite and >= 0 \(0: greedy\), got -1.0"),
    (lambda: generate(tiny_model(), PROMPT, 2, temperature=float("nan")), ValueError,
     r"temperature must be finite and >= 0"),
    (lambda: generate(tiny_model(), PROMPT, 2, temperature=True), TypeError,
     r"temperature must be a real number, got bool"),
    (lambda: generate(tiny_model(), PROMPT, 2, temperature=HUGE), ValueError,
     r"temperature must fit in float64"),
    (lambda: generate(tiny_model(), PROMPT, 2, top_k=0), ValueError,
     r"top_k must be >= 1 \(None: no top-k cut\), got 0"),
    (lambda: generate(tiny_model(), PROMPT, 2, top_k=True), TypeError,
     r"top_k must be an integer, got bool"),
    (lambda: generate(tiny_model(), PROMPT, 2, top_k=2**64), ValueError,
     r"top_k must fit in int64"),
    (lambda: generate(tiny_model(), PROMPT, -1), ValueError, r"max_new_tokens must be >= 0"),
    (lambda: generate(tiny_model(), PROMPT, 1.0), TypeError, r"max_new_tokens must be an integer"),
    (lambda: generate(tiny_model(), PROMPT, HUGE), ValueError, r"max_new_tokens must fit in int64"),
    (lambda: generate(tiny_model(), PROMPT, 2, seed=-1), ValueError, r"seed must be >= 0, got -1"),
    (lambda: generate(tiny_model(), PROMPT, 2, seed=True), TypeError,
     r"seed must be an integer or None, got bool"),
    (lambda: generate(tiny_model(), PROMPT, 2, seed=0.5), TypeError,
     r"seed must be an integer or None, got float"),
    (lambda: generate(tiny_model(), [[1.5, 2.0]], 2), TypeError,
     r"prompt must hold integer token ids, got dtype float64"),
    (lambda: generate(tiny_model(), [[1, 256]], 2), ValueError,
     r"prompt\[0, 1\] = 256 is outside \[0, 256\)"),
    (lambda: generate(tiny_model(), PROMPT, 7), ValueError, r"exceeds max_seq = 8"),
]


@pytest.mark.parametrize("call,exc,pattern", PYTHON_API_CASES,
                         ids=[f"api{i}" for i in range(len(PYTHON_API_CASES))])
def test_bad_numbers_for_optim_and_generate_raise_a_clear_error(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_edge_values_for_optim_and_generate_work():
    _, grads = params_and_grads()
    assert clip_grad_norm(grads, float("inf")) == pytest.approx(np.sqrt(8))  # measures only
    np.testing.assert_array_equal(grads["w"], 1)
    assert cosine_lr(np.int64(5), np.float32(1e-3), 0, 10) > 0
    model = tiny_model()
    out = generate(model, np.array([[1, 2]], np.uint8), 0, seed=2**70)
    np.testing.assert_array_equal(out, PROMPT)
    # a tiny temperature is greedy, not NaN: the logits are shifted before the division
    logits = np.array([[0.0, 5.0, 1.0], [3.0, -1.0, 2.0]], F)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(sample_next(logits, rng, temperature=1e-300), [1, 0])
    assert set(sample_next(logits, rng, temperature=1.0, top_k=1).tolist()) <= {0, 1}


def test_a_rejected_scalar_writes_nothing():
    rng = np.random.default_rng(1)
    p, g, m, v = (rng.standard_normal(5).astype(F) for _ in range(4))
    before = [a.copy() for a in (p, m, v)]
    for bad in (dict(lr=HUGE), dict(step=True), dict(weight_decay=np.True_),
                dict(beta1=float("nan")), dict(eps=-HUGE)):
        with pytest.raises((TypeError, ValueError)):
            ops.adamw_step(p, g, m, v, **{"step": 1, "lr": 0.1, **bad})
        for a, b in zip((p, m, v), before):
            np.testing.assert_array_equal(a, b)
    # accumulated gradients stay as they were
    dw, db = np.ones((4, 3), F), np.ones(4, F)
    with pytest.raises(TypeError, match="has_bias"):
        ops.linear_backward(np.ones((2, 4), F), x23, w43, has_bias=None, dw=dw, db=db)
    dtable = np.ones((4, 3), F)
    with pytest.raises(TypeError, match="vocab"):
        ops.embedding_backward(np.ones((2, 3), F), i64(0, 1), np.True_, dtable=dtable)
    for a in (dw, db, dtable):
        np.testing.assert_array_equal(a, 1)
    # a cache append with a bad start, or a KVCache.attend with a scale beyond float32,
    # leaves the cache as it was
    kc, vc = np.ones((1, 8, 2, 4), F), np.ones((1, 8, 2, 4), F)
    with pytest.raises(TypeError, match="start"):
        ops.attention_cache_append(kc, vc, q4, q4, start=True)
    cache = pytfm.KVCache(1, 8, 2, 4)
    with pytest.raises(ValueError, match="scale must fit in float32"):
        cache.attend(q4 + 1, q4 + 1, q4 + 1, scale=1e39)
    assert len(cache) == 0 and not cache.k.any() and not cache.v.any()
    np.testing.assert_array_equal(kc, 1)
    np.testing.assert_array_equal(vc, 1)
    # an optimizer step at a bad lr is not counted and changes nothing
    params, grads = params_and_grads()
    opt, kept = AdamW(params, grads), {k: p.copy() for k, p in params.items()}
    with pytest.raises(ValueError, match="lr must be finite"):
        opt.step(lr=float("nan"))
    assert opt.t == 0 and all((params[k] == kept[k]).all() for k in params)


def test_nothing_is_written_on_error():
    rng = np.random.default_rng(0)
    # the C kernel rejects beta2 after every Python check passed: param, m, v stay as they were
    p, g, m, v = (rng.standard_normal(5).astype(F) for _ in range(4))
    before = [a.copy() for a in (p, m, v)]
    with pytest.raises(ValueError, match="beta2"):
        ops.adamw_step(p, g, m, v, step=1, lr=0.1, beta2=1.5)
    for a, b in zip((p, m, v), before):
        np.testing.assert_array_equal(a, b)
    # a bad id late in the array: no earlier row may have been added to dtable
    dtable = np.ones((4, 3), F)
    with pytest.raises(ValueError, match=r"ids\[5\] = 9"):
        ops.embedding_backward(np.ones((6, 3), F), i64(0, 1, 2, 3, 0, 9), 4, dtable=dtable)
    np.testing.assert_array_equal(dtable, np.ones((4, 3), F))
    # likewise a bad target late in the array
    with pytest.raises(ValueError, match=r"targets\[2\] = 3"):
        ops.cross_entropy_forward(z(3, 3), i64(0, 1, 3))


def last_error():
    return ffi.string(lib.pytfm_last_error()).decode()


def test_c_functions_return_a_status_for_bad_pointers_and_sizes():
    buf = ffi.new("float[6]")
    st = lib.pytfm_softmax_forward(ffi.NULL, buf, 2, 3)
    assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert last_error() == "pytfm_softmax_forward: y must not be NULL"
    assert lib.pytfm_gelu_forward(buf, buf, -1) == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert last_error() == "pytfm_gelu_forward: count must be >= 0, got -1"
    assert lib.pytfm_layernorm_forward(buf, buf, buf, buf, buf, buf, 1, 0, 1e-5) != 0
    assert "cols must be >= 1, got 0" in last_error()
    assert lib.pytfm_rope_forward(buf, buf, ffi.new("int64_t[1]"), 1, 1, 1, 3, 0, 1e4) != 0
    assert "D must be even and >= 2, got 3" in last_error()
    # zero rows is a no-op, and then NULL buffers are fine
    assert lib.pytfm_softmax_forward(ffi.NULL, ffi.NULL, 0, 3) == lib.PYTFM_STATUS_OK
    assert lib.pytfm_get_build_info(ffi.NULL) == lib.PYTFM_STATUS_INVALID_ARGUMENT


def test_last_error_is_per_thread():
    lib.pytfm_gelu_forward(ffi.NULL, ffi.NULL, -7)
    main_error = last_error()
    seen = []

    def worker():
        seen.append(last_error())  # a fresh thread has no error yet
        lib.pytfm_gelu_forward(ffi.NULL, ffi.NULL, -3)
        seen.append(last_error())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == ["", "pytfm_gelu_forward: count must be >= 0, got -3"]
    assert last_error() == main_error == "pytfm_gelu_forward: count must be >= 0, got -7"


def test_status_strings_and_exception_kinds():
    names = {s: ffi.string(lib.pytfm_status_string(s)).decode() for s in range(6)}
    assert len(set(names.values())) == 6 and all(names.values())
    assert ffi.string(lib.pytfm_status_string(99)).decode() == "unknown status"
    check(lib.PYTFM_STATUS_OK)
    with pytest.raises(PytfmError, match="CUDA error"):
        check(lib.PYTFM_STATUS_CUDA_ERROR)


def test_the_interpreter_survives_a_run_of_bad_calls():
    code = textwrap.dedent(
        """
        import numpy as np, pytfm
        from pytfm._core import ffi, lib
        z = lambda *shape: np.zeros(shape, np.float32)
        bad = [lambda: pytfm.ops.embedding_forward(np.array([10**12]), z(4, 3)),
               lambda: pytfm.ops.linear_forward(z(2, 3)[:, ::2], z(4, 3)),
               lambda: pytfm.ops.cross_entropy_forward(z(1, 3), np.array([-5]))]
        for f in bad:
            try:
                f()
            except (TypeError, ValueError):
                pass
            else:
                raise SystemExit("no exception")
        for fn in (lib.pytfm_linear_forward,):
            assert fn(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 5, 3, 4) != 0
        print("alive")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "alive"
