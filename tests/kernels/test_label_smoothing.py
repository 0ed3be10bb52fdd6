"""Cross-entropy with label smoothing ε (pytfm_cross_entropy_smoothed_forward/backward through
pytfm.ops' label_smoothing): torch.nn.functional.cross_entropy's definition, forward and
gradient, on every instruction set; ε = 0 the unsmoothed functions' bits; each kept row's
gradient sums to zero and an ignored row's is zero; a bad ε is refused before anything is
written. The registry (tests/ops_registry.py) runs the drawn-shape checks against the
reference, the fast-vs-plain and thread-count checks and the bad-input messages."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import EPS32, amax, assert_close, awkward, bits, f32, max_isa, numerical_grad, seeds
from ops_registry import cross_entropy_backward_tol, cross_entropy_tol
from pytfm import ops
from pytfm import reference as ref
from pytfm._core import ffi, lib

ISAS = ["plain", "portable", "avx2", "avx512"]
smoothings = st.one_of(st.sampled_from([0.0, 0.1, 1.0]), st.floats(0.0, 1.0))


def fp(a):
    return ffi.from_buffer("float[]", a)


def ip(a):
    return ffi.from_buffer("int64_t[]", a)


def make(seed, rows, vocab, scale=3.0, ignore_index=-100, ignored=0.3):
    rng = np.random.default_rng(seed)
    logits = f32(rng, (rows, vocab), scale, float(rng.normal() * 10))
    targets = rng.integers(0, vocab, size=rows)
    targets[rng.random(rows) < ignored] = ignore_index
    return logits, targets


def torch_cross_entropy(logits, targets, ignore_index, eps, dloss):
    """torch's loss and dlogits (autograd) in float64"""
    torch = pytest.importorskip("torch")
    x = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(x, torch.tensor(targets), ignore_index=ignore_index,
                                             label_smoothing=eps)
    (loss * dloss).backward()
    return loss.item(), x.grad.numpy()


def tols(logits, targets, ignore_index, dloss, want):
    a = dict(logits=logits, targets=targets, ignore_index=ignore_index, dloss=dloss)
    return cross_entropy_tol(a, want)[0], cross_entropy_backward_tol(a, [want[-1]])[0]


@given(rows=awkward, vocab=awkward, eps=smoothings, ignore_index=st.sampled_from([-100, 0]),
       dloss=st.sampled_from([1.0, -0.5]), isa=st.sampled_from(ISAS), seed=seeds)
def test_forward_matches_torch(rows, vocab, eps, ignore_index, dloss, isa, seed):
    """the loss as torch defines it, the reference's to float64 rounding and the kernels' to
    float32's (with no row kept torch's is NaN, ours 0)"""
    logits, targets = make(seed, rows, vocab, ignore_index=ignore_index)
    want, _ = torch_cross_entropy(logits, targets, ignore_index, eps, dloss)
    with max_isa(isa):
        loss, _ = ops.cross_entropy_forward(logits, targets, ignore_index, label_smoothing=eps)
    r, _ = ref.cross_entropy_forward(logits, targets, ignore_index, eps)
    if not (targets != ignore_index).any():
        assert np.isnan(want) and r == 0.0 and float(loss) == 0.0
        return
    assert_close("label_smoothing.torch.reference_loss", r, want, atol=1e-12, rtol=1e-12)
    t, _ = tols(logits, targets, ignore_index, dloss, [want])
    assert_close("label_smoothing.torch.loss", float(loss), want, *t)


@given(rows=awkward, vocab=awkward, eps=smoothings, ignore_index=st.sampled_from([-100, 0]),
       dloss=st.sampled_from([1.0, -0.5]), isa=st.sampled_from(ISAS), seed=seeds)
def test_backward_matches_torch(rows, vocab, eps, ignore_index, dloss, isa, seed):
    """dlogits as torch's autograd gives them, the reference's to float64 rounding and the
    kernels' to float32's"""
    logits, targets = make(seed, rows, vocab, ignore_index=ignore_index)
    if not (targets != ignore_index).any():
        targets[0] = (ignore_index + 1) % vocab  # torch's gradient is NaN with no row kept
    _, want = torch_cross_entropy(logits, targets, ignore_index, eps, dloss)
    with max_isa(isa):
        _, lse = ops.cross_entropy_forward(logits, targets, ignore_index, label_smoothing=eps)
        d = ops.cross_entropy_backward(logits, targets, lse, ignore_index, dloss,
                                       label_smoothing=eps)
    r = ref.cross_entropy_backward(logits, targets, ignore_index, dloss, eps)
    assert_close("label_smoothing.torch.reference_dlogits", r, want, atol=1e-15, rtol=1e-12)
    _, t = tols(logits, targets, ignore_index, dloss, [want])
    assert_close("label_smoothing.torch.dlogits", d, want, *t)


@pytest.mark.parametrize("eps", [0.1, 1.0])
def test_the_reference_backward_is_the_gradient_of_its_forward(eps):
    logits, targets = make(5, 4, 7)
    x = logits.astype(np.float64)
    g = numerical_grad(lambda: ref.cross_entropy_forward(x, targets, -100, eps)[0], x)
    assert_close("label_smoothing.reference.fd", ref.cross_entropy_backward(x, targets, -100,
                                                                           1.0, eps),
                 g, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows,vocab", [(1, 1), (7, 33), (300, 257), (3, 5000)])
def test_zero_smoothing_gives_the_plain_bits(isa, rows, vocab):
    """pytfm_cross_entropy_smoothed_forward/backward at ε = 0 write what the unsmoothed
    functions write, bit for bit (they are one code path)"""
    logits, targets = make(rows * vocab, rows, vocab)
    out = {}
    with max_isa(isa):
        for name in ("plain", "smoothed"):
            loss, lse, d = (np.full(s, np.nan, np.float32) for s in (1, rows, (rows, vocab)))
            if name == "plain":
                st1 = lib.pytfm_cross_entropy_forward(fp(loss), fp(lse), fp(logits), ip(targets),
                                                      rows, vocab, -100)
                st2 = lib.pytfm_cross_entropy_backward(fp(d), fp(logits), ip(targets), fp(lse),
                                                       rows, vocab, -100, -2.5)
            else:
                st1 = lib.pytfm_cross_entropy_smoothed_forward(fp(loss), fp(lse), fp(logits),
                                                               ip(targets), rows, vocab, -100,
                                                               0.0)
                st2 = lib.pytfm_cross_entropy_smoothed_backward(fp(d), fp(logits), ip(targets),
                                                                fp(lse), rows, vocab, -100, 0.0,
                                                                -2.5)
            assert st1 == st2 == lib.PYTFM_STATUS_OK
            out[name] = (loss, lse, d)
    for x, y in zip(out["plain"], out["smoothed"]):
        np.testing.assert_array_equal(bits(x), bits(y))


@given(rows=awkward, vocab=awkward, eps=smoothings, scale=st.sampled_from([0.1, 3.0, 30.0]),
       dloss=st.sampled_from([1.0, -3.0]), isa=st.sampled_from(ISAS), seed=seeds)
def test_gradient_rows_sum_to_zero_and_ignored_rows_are_zero(rows, vocab, eps, scale, dloss,
                                                             isa, seed):
    """The smoothed target sums to 1 as the softmax does: each kept row's gradient sums to 0,
    up to the softmax's rounding (its sum is 1 within eps32·(|lse| + 2) from lse's rounding and
    each e^ within 2 ulp) and one rounding of each of its terms; an ignored row's is exactly 0.
    The loss is >= 0 (lse >= max >= the target's logit and the row's mean)."""
    logits, targets = make(seed, rows, vocab, scale, ignore_index=-1, ignored=0.4)
    with max_isa(isa):
        loss, lse = ops.cross_entropy_forward(logits, targets, label_smoothing=eps)
        d = ops.cross_entropy_backward(logits, targets, lse, dloss=dloss, label_smoothing=eps)
    kept = targets != -1
    assert float(loss) >= 0.0
    assert (d[~kept] == 0).all() and not np.signbit(d[~kept]).any()
    s = abs(dloss) / max(int(kept.sum()), 1)
    atol = s * EPS32 * (abs(lse[kept]).astype(np.float64) + 8)
    assert_close("label_smoothing.row_sum", d[kept].sum(axis=-1, dtype=np.float64),
                 np.zeros(int(kept.sum())), atol=atol, rtol=0)


@given(rows=awkward, vocab=awkward, eps=st.floats(0.0, 1.0), seed=seeds)
def test_the_loss_is_linear_in_smoothing(rows, vocab, eps, seed):
    """(1 − ε)·loss(0) + ε·loss(1): the two terms are the unsmoothed loss and the mean of
    lse − mean_j logits, each kept row's"""
    logits, targets = make(seed, rows, vocab, ignored=0.2)
    at = {e: float(ops.cross_entropy_forward(logits, targets, -100, label_smoothing=e)[0])
          for e in (0.0, 1.0, eps)}
    want = (1 - eps) * at[0.0] + eps * at[1.0]
    mag = EPS32 * (amax(logits) + 1)
    assert_close("label_smoothing.linear", at[eps], want, atol=4 * mag, rtol=4 * EPS32)
    kept = targets != -100
    if kept.any():  # ε = 1: the targets do not matter
        lse = ref.cross_entropy_forward(logits, targets, -100)[1]
        uniform = (lse - logits.astype(np.float64).mean(axis=-1))[kept].mean()
        assert_close("label_smoothing.uniform", at[1.0], uniform, atol=2 * mag, rtol=2 * EPS32)


BAD = [1.5, -0.25, 1.0001, -1e-30, float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("eps", BAD, ids=str)
def test_a_bad_smoothing_is_refused_and_nothing_is_written(eps):
    logits, targets = make(1, 3, 5, ignored=0.0)
    lse = ops.cross_entropy_forward(logits, targets)[1]
    with pytest.raises(ValueError, match=r"label_smoothing must be finite and in \[0, 1\]"):
        ops.cross_entropy_forward(logits, targets, label_smoothing=eps)
    with pytest.raises(ValueError, match=r"label_smoothing must be finite and in \[0, 1\]"):
        ops.cross_entropy_backward(logits, targets, lse, label_smoothing=eps)
    loss, lse_out, d = (np.full(s, 7.0, np.float32) for s in (1, 3, (3, 5)))
    st1 = lib.pytfm_cross_entropy_smoothed_forward(fp(loss), fp(lse_out), fp(logits),
                                                   ip(targets), 3, 5, -1, eps)
    assert st1 == lib.PYTFM_STATUS_INVALID_ARGUMENT
    st2 = lib.pytfm_cross_entropy_smoothed_backward(fp(d), fp(logits), ip(targets), fp(lse), 3,
                                                    5, -1, eps, 1.0)
    assert st2 == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert (loss == 7).all() and (lse_out == 7).all() and (d == 7).all()


def test_the_model_interface_keeps_smoothing_off_by_default():
    """label_smoothing defaults to 0: the unsmoothed functions' bits through pytfm.ops"""
    logits, targets = make(3, 6, 11)
    loss, lse = ops.cross_entropy_forward(logits, targets, -100)
    loss0, lse0 = ops.cross_entropy_forward(logits, targets, -100, label_smoothing=0.0)
    loss1, _ = ops.cross_entropy_forward(logits, targets, -100, label_smoothing=0.1)
    np.testing.assert_array_equal(bits(np.float32(loss)), bits(np.float32(loss0)))
    np.testing.assert_array_equal(bits(lse), bits(lse0))
    assert float(loss1) != float(loss)
