"""Bad input: a clear exception naming the argument, nothing written, the interpreter alive."""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from pytfm import PytfmError, ops
from pytfm._core import check, ffi, lib

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
