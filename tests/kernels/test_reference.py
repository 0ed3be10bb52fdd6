"""The float64 reference's backward passes vs central finite differences of its forward.

For an op f with output y and a random cotangent G, the gradient of L = <f(inputs), G> with
respect to each input must equal the reference backward applied to G.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import assert_close, numerical_grad, seeds
from pytfm import reference as ref

dims = st.integers(1, 5)
fd_settings = settings(max_examples=10)


def check_fd(name, loss, inputs, analytic, atol=1e-6, rtol=1e-5):
    for key, grad in analytic.items():
        num = numerical_grad(loss, inputs[key])
        assert_close(f"reference.fd.{name}.{key}", grad, num, atol=atol, rtol=rtol)


@fd_settings
@given(rows=dims, inn=dims, out=dims, seed=seeds)
def test_linear(rows, inn, out, seed):
    rng = np.random.default_rng(seed)
    a = dict(x=rng.standard_normal((rows, inn)), w=rng.standard_normal((out, inn)),
             b=rng.standard_normal(out))
    G = rng.standard_normal((rows, out))
    dx, dw, db = ref.linear_backward(G, a["x"], a["w"])
    check_fd("linear", lambda: np.sum(ref.linear_forward(**a) * G), a, dict(x=dx, w=dw, b=db))


@fd_settings
@given(rows=dims, cols=dims, seed=seeds)
def test_softmax(rows, cols, seed):
    rng = np.random.default_rng(seed)
    a = dict(x=rng.standard_normal((rows, cols)) * 3)
    G = rng.standard_normal((rows, cols))
    dx = ref.softmax_backward(G, ref.softmax_forward(a["x"]))
    check_fd("softmax", lambda: np.sum(ref.softmax_forward(**a) * G), a, dict(x=dx))


@fd_settings
@given(rows=dims, cols=st.integers(2, 6), seed=seeds)
def test_layernorm(rows, cols, seed):
    rng = np.random.default_rng(seed)
    a = dict(x=rng.standard_normal((rows, cols)), w=rng.standard_normal(cols),
             b=rng.standard_normal(cols))
    G = rng.standard_normal((rows, cols))
    _, mean, rstd = ref.layernorm_forward(**a)
    dx, dw, db = ref.layernorm_backward(G, a["x"], a["w"], mean, rstd)
    check_fd("layernorm", lambda: np.sum(ref.layernorm_forward(**a)[0] * G), a,
             dict(x=dx, w=dw, b=db))


@fd_settings
@given(T=dims, H=dims, half=st.integers(1, 3), start=st.integers(0, 50), seed=seeds)
def test_rope(T, H, half, start, seed):
    rng = np.random.default_rng(seed)
    a = dict(x=rng.standard_normal((2, T, H, 2 * half)))
    pos = np.arange(start, start + T)
    G = rng.standard_normal(a["x"].shape)
    dx = ref.rope_backward(G, pos)
    check_fd("rope", lambda: np.sum(ref.rope_forward(a["x"], pos) * G), a, dict(x=dx))


@fd_settings
@given(count=st.integers(1, 20), seed=seeds)
def test_gelu(count, seed):
    rng = np.random.default_rng(seed)
    a = dict(x=rng.standard_normal(count) * 3)
    G = rng.standard_normal(count)
    check_fd("gelu", lambda: np.sum(ref.gelu_forward(**a) * G), a,
             dict(x=ref.gelu_backward(G, a["x"])))


@fd_settings
@given(rows=dims, vocab=dims, dim=dims, seed=seeds)
def test_embedding(rows, vocab, dim, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=rows)
    a = dict(table=rng.standard_normal((vocab, dim)))
    G = rng.standard_normal((rows, dim))
    check_fd("embedding", lambda: np.sum(ref.embedding_forward(ids, a["table"]) * G), a,
             dict(table=ref.embedding_backward(G, ids, vocab)))


@fd_settings
@given(rows=dims, vocab=dims, ignore_index=st.sampled_from([-1, 0]), dloss=st.floats(-2, 2),
       seed=seeds)
def test_cross_entropy(rows, vocab, ignore_index, dloss, seed):
    rng = np.random.default_rng(seed)
    a = dict(logits=rng.standard_normal((rows, vocab)) * 2)
    targets = rng.integers(0, vocab, size=rows)
    targets[rng.random(rows) < 0.3] = ignore_index
    grad = ref.cross_entropy_backward(a["logits"], targets, ignore_index, dloss)
    check_fd("cross_entropy",
             lambda: dloss * ref.cross_entropy_forward(a["logits"], targets, ignore_index)[0],
             a, dict(logits=grad))


@fd_settings
@given(T=dims, H=st.integers(1, 2), D=st.integers(1, 3), causal=st.booleans(), seed=seeds)
def test_attention(T, H, D, causal, seed):
    rng = np.random.default_rng(seed)
    a = {name: rng.standard_normal((2, T, H, D)) for name in ("q", "k", "v")}
    G = rng.standard_normal((2, T, H, D))
    dq, dk, dv = ref.attention_backward(G, a["q"], a["k"], a["v"], causal, 0.7)
    loss = lambda: np.sum(ref.attention_forward(**a, causal=causal, scale=0.7)[0] * G)
    check_fd("attention", loss, a, dict(q=dq, k=dk, v=dv))
