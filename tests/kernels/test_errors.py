"""Bad input: a clear exception naming the argument, nothing written, the interpreter alive."""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import pytfm
from helpers import i64, last_error, z
from ops_registry import OPS, Bad, exact_null_args
from pytfm import PytfmError, ops
from pytfm._core import check, ffi, lib
from pytfm.generate import generate, sample_next
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr

F = np.float32
x23, w43 = z(2, 3), z(4, 3)
q4 = z(1, 2, 2, 4)
HUGE = 10**400  # beyond float64: float(HUGE) raises OverflowError

BAD = [(op, bad) for op in OPS for bad in op.bad]


@pytest.mark.parametrize("op,bad", BAD, ids=[f"{op.name}-{bad.name()}" for op, bad in BAD])
def test_bad_input_raises_a_clear_error(op, bad):
    """tests/ops_registry.py's bad-input cases of every op: arrays of the wrong type, dtype,
    shape or layout, and scalars beyond what their C type holds (bool, huge, NaN)."""
    if bad.exc is None:  # a value at the edge that must be accepted
        bad.call()
        return
    with pytest.raises(bad.exc, match=bad.pattern):
        bad.call()


KVCACHE_CASES = [
    Bad(lambda: pytfm.KVCache(True, 4, 2, 4), TypeError, r"batch must be an integer, got bool"),
    Bad(lambda: pytfm.KVCache(1, 2**64, 2, 4), ValueError, r"max_len must fit in int64"),
]


@pytest.mark.parametrize("bad", KVCACHE_CASES, ids=Bad.name)
def test_bad_kv_cache_sizes_raise_a_clear_error(bad):
    with pytest.raises(bad.exc, match=bad.pattern):
        bad.call()


def tiny_model():
    return GPT(GPTConfig(d_model=8, n_layer=1, n_head=2, max_seq=8))


def params_and_grads():
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 2)).astype(F), "b": rng.standard_normal(2).astype(F)}
    return params, {k: np.ones_like(p) for k, p in params.items()}


PROMPT = i64(1, 2)[None, :]

PYTHON_API_CASES = [
    Bad(lambda: AdamW(*params_and_grads(), lr=True), TypeError,
        r"lr must be a real number, got bool"),
    Bad(lambda: AdamW(*params_and_grads(), lr=-1.0), ValueError, r"lr must be finite and >= 0"),
    Bad(lambda: AdamW(*params_and_grads(), lr=HUGE), ValueError, r"lr must fit in float64"),
    Bad(lambda: AdamW(*params_and_grads(), betas=(0.9,)), TypeError,
        r"betas must be a pair \(beta1, beta2\)"),
    Bad(lambda: AdamW(*params_and_grads(), betas=(1.0, 0.9)), ValueError,
        r"betas\[0\] must be in \[0, 1\), got 1.0"),
    Bad(lambda: AdamW(*params_and_grads(), betas=(0.9, float("nan"))), ValueError,
        r"betas\[1\] must be in \[0, 1\), got nan"),
    Bad(lambda: AdamW(*params_and_grads(), eps=0.0), ValueError, r"eps must be finite and > 0"),
    Bad(lambda: AdamW(*params_and_grads(), weight_decay=float("inf")), ValueError,
        r"weight_decay must be finite and >= 0"),
    Bad(lambda: clip_grad_norm(params_and_grads()[1], float("nan")), ValueError,
        r"max_norm must be >= 0 \(inf: no clipping\), got nan"),
    Bad(lambda: clip_grad_norm(params_and_grads()[1], -1), ValueError, r"max_norm must be >= 0"),
    Bad(lambda: clip_grad_norm(params_and_grads()[1], True), TypeError,
        r"max_norm must be a real number, got bool"),
    Bad(lambda: cosine_lr(-1, 1e-3, 10, 100), ValueError, r"step must be >= 0, got -1"),
    Bad(lambda: cosine_lr(True, 1e-3, 10, 100), TypeError, r"step must be an integer, got bool"),
    Bad(lambda: cosine_lr(0, 1e-3, 1.5, 100), TypeError, r"warmup must be an integer, got float"),
    Bad(lambda: cosine_lr(0, 1e-3, 10, 2**64), ValueError, r"total must fit in int64"),
    Bad(lambda: cosine_lr(0, float("nan"), 10, 100), ValueError, r"max_lr must be finite and >= 0"),
    Bad(lambda: cosine_lr(0, 1e-3, 10, 100, min_lr=HUGE), ValueError,
        r"min_lr must fit in float64"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, temperature=-1.0), ValueError,
        r"temperature must be finite and >= 0 \(0: greedy\), got -1.0"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, temperature=float("nan")), ValueError,
        r"temperature must be finite and >= 0"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, temperature=True), TypeError,
        r"temperature must be a real number, got bool"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, temperature=HUGE), ValueError,
        r"temperature must fit in float64"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, top_k=0), ValueError,
        r"top_k must be >= 1 \(None: no top-k cut\), got 0"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, top_k=True), TypeError,
        r"top_k must be an integer, got bool"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, top_k=2**64), ValueError,
        r"top_k must fit in int64"),
    Bad(lambda: generate(tiny_model(), PROMPT, -1), ValueError, r"max_new_tokens must be >= 0"),
    Bad(lambda: generate(tiny_model(), PROMPT, 1.0), TypeError,
        r"max_new_tokens must be an integer"),
    Bad(lambda: generate(tiny_model(), PROMPT, HUGE), ValueError,
        r"max_new_tokens must fit in int64"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, seed=-1), ValueError,
        r"seed must be >= 0, got -1"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, seed=True), TypeError,
        r"seed must be an integer or None, got bool"),
    Bad(lambda: generate(tiny_model(), PROMPT, 2, seed=0.5), TypeError,
        r"seed must be an integer or None, got float"),
    Bad(lambda: generate(tiny_model(), [[1.5, 2.0]], 2), TypeError,
        r"prompt must hold integer token ids, got dtype float64"),
    Bad(lambda: generate(tiny_model(), [[1, 256]], 2), ValueError,
        r"prompt\[0, 1\] = 256 is outside \[0, 256\)"),
    Bad(lambda: generate(tiny_model(), PROMPT, 7), ValueError, r"exceeds max_seq = 8"),
]


@pytest.mark.parametrize("bad", PYTHON_API_CASES, ids=Bad.name)
def test_bad_numbers_for_optim_and_generate_raise_a_clear_error(bad):
    with pytest.raises(bad.exc, match=bad.pattern):
        bad.call()


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


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_every_c_function_refuses_null_buffers(op):
    """Each of the op's exact calls (tests/ops_registry.py) with every buffer NULL, at sizes
    that need them: INVALID_ARGUMENT, naming the function, before any pointer is read."""
    for template in op.exact:
        st = getattr(lib, op.c)(*exact_null_args(template, ffi))
        assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT, (template, st)
        assert last_error().startswith(f"{op.c}: ") and "must not be NULL" in last_error()


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
