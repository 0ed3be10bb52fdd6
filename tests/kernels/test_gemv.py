"""The linear layer's row products (csrc/kernels/linear.c, fast_impl.h gemv and gemv_rows): a
prompt of a few rows (2 to 4, or up to 7 of a W that streams) reads W once for all of them,
and each of its rows is the bits the one-row product gives that row alone; a one-row product
of a W too large for the caches (above linear.c's STREAM_FLOATS, 2^18 floats) has the bits of
its 64-row slices, which fit them (FP32: W streamed a row at a time, the slices four rows at a
time; BF16: four rows at a time both).
Both against the plain kernel too (tolerances from the rounding: ops_registry's
linear_one_row_tol), ragged row counts and output blocks at every offset of the parallel split
(64 outputs a task), and through the model: a GPT's forward of 2 to 7 tokens is, bit for bit,
what decoding them one at a time gives."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import BF16_PATHS, assert_close, bf16_path, bits, has_isa, max_isa, seeds
from ops_registry import linear_make, linear_one_row_tol
from pytfm import ops
from pytfm.nn import GPT, GPTConfig

FAST_ISAS = [isa for isa in ("portable", "avx2", "avx512") if has_isa(isa)]
STREAM_FLOATS = 1 << 18
# around the lane width (16), the task block (64 outputs) and the no-thread limit (65536 floats)
ins = st.one_of(st.integers(1, 40), st.sampled_from([47, 48, 49, 255, 256, 257, 768, 1000]))
outs = st.one_of(st.integers(1, 20), st.sampled_from([63, 64, 65, 127, 128, 129, 300]))


def one_row_each(x, w, b):
    return np.stack([ops.linear_forward(x[r:r + 1], w, b)[0] for r in range(x.shape[0])])


# (rows, in, out): 2 to 4 rows of any W; 5 to 7 rows only of a W that streams (above
# STREAM_FLOATS: a W in the caches takes the packed product from 5 rows on)
few = st.one_of(st.tuples(st.integers(2, 4), ins, outs),
                st.tuples(st.integers(5, 7), st.sampled_from([257, 768]),
                          st.sampled_from([1021, 1088])))


@pytest.mark.parametrize("isa", FAST_ISAS)
@given(shape=few, bias=st.booleans(), seed=seeds)
@settings(max_examples=40)
def test_a_few_rows_are_the_one_row_products_bit_for_bit(isa, shape, bias, seed):
    rows, inn, out = shape
    a = linear_make(seed, rows, inn, out, bias)
    x, w, b = a["x"][0], a["w"], a["b"]
    with max_isa(isa):
        y = ops.linear_forward(x, w, b)
        y_rows = one_row_each(x, w, b)
        g, h = ops.linear_gelu_forward(x, w, b)
        g_ref = ops.gelu_forward(y)
    np.testing.assert_array_equal(bits(y), bits(y_rows))
    np.testing.assert_array_equal(bits(h), bits(y))
    np.testing.assert_array_equal(bits(g), bits(g_ref))
    with max_isa("plain"):
        plain = ops.linear_forward(x, w, b)
    tol = linear_one_row_tol(dict(x=x, w=w), None, None)[0]
    assert_close("linear few rows", y, plain, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("isa", FAST_ISAS)
@pytest.mark.parametrize("inn,out", [(257, 1021), (768, 400), (1000, 263)])
def test_a_large_ws_row_is_its_slices_bits(isa, inn, out):
    """W above STREAM_FLOATS (from memory) and 64-row slices of it (below it, in the caches):
    the same sums in the same order."""
    assert inn * out > STREAM_FLOATS and 64 * inn <= STREAM_FLOATS
    a = linear_make(7, 1, inn, out, True)
    x, w, b = a["x"][0], a["w"], a["b"]
    with max_isa(isa):
        y = ops.linear_forward(x, w, b)
        sliced = np.concatenate([ops.linear_forward(x, w[o:o + 64], b[o:o + 64])
                                 for o in range(0, out, 64)], axis=1)
    np.testing.assert_array_equal(bits(y), bits(sliced))
    with max_isa("plain"):
        plain = ops.linear_forward(x, w, b)
    tol = linear_one_row_tol(dict(x=x, w=w), None, None)[0]
    assert_close("linear large row", y, plain, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("path", BF16_PATHS)
@pytest.mark.parametrize("inn,out", [(257, 1021), (768, 400)])
def test_a_large_ws_bf16_row_is_its_slices_bits(path, inn, out):
    """The BF16 one-row product of a W above STREAM_FLOATS against 64-row slices of it: the
    same bits, on every BF16 path."""
    a = linear_make(8, 1, inn, out, True)
    x, w, b = a["x"][0], a["w"], a["b"]
    with bf16_path(path):
        y = ops.linear_forward(x, w, b, precision="bf16")
        sliced = np.concatenate([ops.linear_forward(x, w[o:o + 64], b[o:o + 64],
                                                    precision="bf16")
                                 for o in range(0, out, 64)], axis=1)
    np.testing.assert_array_equal(bits(y), bits(sliced))


@pytest.mark.parametrize("isa", FAST_ISAS)
@pytest.mark.parametrize("pos", ["rope", "learned", "sinusoidal"])
@pytest.mark.parametrize("T", range(2, 8))
def test_a_short_prompts_forward_is_decoding_it_token_by_token(isa, pos, T):
    """Every linear layer of the forward takes T rows (gemv_rows: each row a one-row product's
    bits), attention of T < 8 queries goes row by row as decoding does, and the row ops are
    per row: the logits of the whole prompt are the decoded ones, bit for bit. From 5 tokens
    on, only matrices that stream take gemv_rows: d 576 and vocab 512 put every one (the
    smallest, 576 x 576, and the LM head, 512 x 576) above STREAM_FLOATS."""
    vocab, d = (50, 64) if T <= 4 else (512, 576)
    assert T <= 4 or min(d * d, vocab * d) > STREAM_FLOATS
    model = GPT(GPTConfig(vocab=vocab, d_model=d, n_layer=2 if T <= 4 else 1, n_head=4,
                          max_seq=16, pos=pos, seed=T))
    tokens = np.random.default_rng(T).integers(0, vocab, (1, T))
    with max_isa(isa):
        full = model.forward(tokens, save=False)[0][0]
        caches = model.new_caches(1)
        steps = [model.decode(tokens[:, t:t + 1], caches)[0, -1] for t in range(T)]
    np.testing.assert_array_equal(bits(full), bits(np.stack(steps)))
