"""pytfm.optim.transformer_lr, the paper's schedule: its formula, its peak at step = warmup,
rising before it and falling after, and bad arguments refused naming them."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytfm.optim import transformer_lr


def paper(step, d_model, warmup, factor=1.0):
    """section 5.3's formula, written the other way round: the warm-up branch as a linear
    ramp to the peak, the decay branch as the peak · sqrt(warmup / step)"""
    peak = factor / math.sqrt(d_model * warmup)
    return peak * step / warmup if step < warmup else peak * math.sqrt(warmup / step)


@given(step=st.integers(1, 10**7), d_model=st.integers(1, 8192), warmup=st.integers(1, 10**5),
       factor=st.sampled_from([1.0, 2.0, 0.5, 1e-3]))
def test_the_formula(step, d_model, warmup, factor):
    got = transformer_lr(step, d_model, warmup, factor)
    assert math.isclose(got, paper(step, d_model, warmup, factor), rel_tol=1e-12)
    want = factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    assert math.isclose(got, want, rel_tol=1e-15)


def test_the_papers_values():
    # d_model = 512, warmup = 4000 (the base model): 512^-0.5 · 4000^-0.5 at the peak
    assert math.isclose(transformer_lr(4000, 512, 4000), 6.987712429686843e-4, rel_tol=1e-14)
    assert math.isclose(transformer_lr(1, 512, 4000), 512**-0.5 * 4000**-1.5, rel_tol=1e-14)
    assert math.isclose(transformer_lr(100_000, 512, 4000), 512**-0.5 * 100_000**-0.5,
                        rel_tol=1e-14)
    assert transformer_lr(4000, 512, 4000, factor=2.0) == 2 * transformer_lr(4000, 512, 4000)
    assert transformer_lr(7, 512, 4000, factor=0.0) == 0.0


@pytest.mark.parametrize("d_model,warmup", [(512, 4000), (1024, 8000), (16, 1), (64, 2),
                                            (128, 37)])
def test_the_peak_is_at_warmup_rising_before_and_falling_after(d_model, warmup):
    steps = np.arange(1, 4 * warmup + 50)
    lr = np.array([transformer_lr(int(s), d_model, warmup) for s in steps])
    assert steps[lr.argmax()] == warmup
    peak = transformer_lr(warmup, d_model, warmup)
    assert math.isclose(peak, (d_model * warmup) ** -0.5, rel_tol=1e-14)
    assert lr.max() == peak
    before, after = lr[: warmup], lr[warmup - 1:]
    assert (np.diff(before) > 0).all(), "rises up to warmup"
    assert (np.diff(after) < 0).all(), "falls after warmup"


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda: transformer_lr(0, 512, 4000), ValueError, r"step must be >= 1, got 0"),
    (lambda: transformer_lr(-3, 512, 4000), ValueError, r"step must be >= 1, got -3"),
    (lambda: transformer_lr(1.5, 512, 4000), TypeError, r"step must be an integer, got float"),
    (lambda: transformer_lr(True, 512, 4000), TypeError, r"step must be an integer, got bool"),
    (lambda: transformer_lr(2**64, 512, 4000), ValueError, r"step must fit in int64"),
    (lambda: transformer_lr(1, 0, 4000), ValueError, r"d_model must be >= 1, got 0"),
    (lambda: transformer_lr(1, 512.0, 4000), TypeError, r"d_model must be an integer, got float"),
    (lambda: transformer_lr(1, 512, 0), ValueError, r"warmup must be >= 1, got 0"),
    (lambda: transformer_lr(1, 512, None), TypeError, r"warmup must be an integer, got NoneType"),
    (lambda: transformer_lr(1, 512, 4000, -1.0), ValueError,
     r"factor must be finite and >= 0, got -1.0"),
    (lambda: transformer_lr(1, 512, 4000, float("nan")), ValueError,
     r"factor must be finite and >= 0, got nan"),
    (lambda: transformer_lr(1, 512, 4000, float("inf")), ValueError,
     r"factor must be finite and >= 0, got inf"),
    (lambda: transformer_lr(1, 512, 4000, "1"), TypeError, r"factor must be a real number"),
    (lambda: transformer_lr(1, 512, 4000, True), TypeError,
     r"factor must be a real number, got bool"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_arguments_raise_naming_them(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_numpy_integers_are_integers():
    assert transformer_lr(np.int64(10), np.int32(512), np.int64(4000)) == \
        transformer_lr(10, 512, 4000)
