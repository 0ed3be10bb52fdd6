"""The thread count: changed from another thread while kernels run, and set far past
the machine (pytfm_set_num_threads, PYTFM_NUM_THREADS, OMP_NUM_THREADS). The kernels read it
once per call where they size per-thread scratch, and clamp it to 4 threads per core."""

import os
import threading
import time

import numpy as np
import pytest

import pytfm
from helpers import TESTS, run_python
from pytfm import ops
from pytfm._core import ffi, lib

FLIPS = [1, 2, 3, 0, 100000, 2**31 - 1, 7, 64]


def clamp():
    """The most threads a kernel may use here: 4 per core of this process's affinity."""
    return 4 * len(os.sched_getaffinity(0))


def workload():
    """Inputs, and a function that runs the kernels that size scratch per thread (tiled
    attention forward and backward, the packed sgemm, LayerNorm's fast backward) and returns
    their outputs."""
    rng = np.random.default_rng(16)
    B, T, H, D = 2, 80, 3, 32  # T past one 64-row tile, B·H = 6 heads to share out
    q, k, v, dy = (rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(4))
    a = rng.standard_normal((150, 200)).astype(np.float32)
    b = rng.standard_normal((200, 96)).astype(np.float32)
    bw = rng.standard_normal((64, 2000)).astype(np.float32)
    x = rng.standard_normal((67, 300)).astype(np.float32)
    w = rng.standard_normal(300).astype(np.float32)
    g = rng.standard_normal((67, 300)).astype(np.float32)

    def run():
        o, lse = ops.attention_forward(q, k, v, causal=True)
        dq, dk, dv = ops.attention_backward(dy, q, k, v, o, lse, causal=True)
        # sgemm: B packed and shared; A packed per thread (trans_a); split by columns (4 rows)
        c, ct, cw = np.empty((150, 96), np.float32), np.empty((150, 96), np.float32), \
            np.empty((4, 2000), np.float32)
        p = lambda arr: ffi.from_buffer("float[]", arr)  # noqa: E731
        for out, trans_a, bb, mnk in ((c, 0, b, (150, 96, 200)), (ct, 1, b, (150, 96, 200)),
                                      (cw, 0, bw, (4, 2000, 64))):
            st = lib.pytfm_sgemm(p(out), p(a), p(bb), *mnk, trans_a, 0, 0.0)
            assert st == lib.PYTFM_STATUS_OK
        _, mean, rstd = ops.layernorm_forward(x, w, w)
        dx, dw, db = ops.layernorm_backward(g, x, w, mean, rstd)
        return [o, lse, dq, dk, dv, c, ct, cw, dx, dw, db]

    return run


def in_subprocess(body):
    """Run the function `body` of this module in a fresh interpreter: a regression (a crash,
    libgomp ending the process) fails the test instead of ending pytest."""
    here = os.path.dirname(os.path.abspath(__file__))
    r = run_python(f"import sys; sys.path[:0] = [{here!r}, {TESTS!r}]; import test_threads; "
                   f"test_threads.{body}(); print('done')")
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), (
        f"exit {r.returncode}: {r.stderr[-3000:]}")


def test_changing_the_thread_count_while_kernels_run_changes_no_bit():
    in_subprocess("flip_while_running")


def test_a_huge_thread_count_is_clamped_and_runs():
    in_subprocess("set_huge")


def flip_while_running():
    run = workload()
    pytfm.set_num_threads(1)
    serial = [r.tobytes() for r in run()]
    stop = threading.Event()
    flips = [0]

    def flipper():
        while not stop.is_set():
            for t in FLIPS:
                pytfm.set_num_threads(t)
                flips[0] += 1

    thread = threading.Thread(target=flipper, daemon=True)
    thread.start()
    runs, end = 0, time.monotonic() + 3.0
    try:
        while time.monotonic() < end:
            got = run()
            runs += 1
            for name, r, s in zip("o lse dq dk dv c ct cw dx dw db".split(), got, serial):
                assert r.tobytes() == s, f"{name} differs from the serial result on run {runs}"
    finally:
        stop.set()
        thread.join()
        pytfm.set_num_threads(0)
    assert runs >= 3 and flips[0] > runs, (runs, flips[0])


def set_huge():
    run = workload()
    pytfm.set_num_threads(1)
    serial = [r.tobytes() for r in run()]
    try:
        for huge in (100000, 2**31 - 1):
            pytfm.set_num_threads(huge)
            assert pytfm.get_num_threads() == clamp()
            assert [r.tobytes() for r in run()] == serial
        pytfm.set_num_threads(3)
        assert pytfm.get_num_threads() == min(3, clamp())
    finally:
        pytfm.set_num_threads(0)
    with pytest.raises(ValueError, match="threads must be >= 0"):
        pytfm.set_num_threads(-1)
    assert lib.pytfm_set_num_threads(-1) == lib.PYTFM_STATUS_INVALID_ARGUMENT


SNIPPET = """
import os
import numpy as np
import pytfm
from pytfm import ops
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 40, 2, 16)).astype(np.float32) for _ in range(3))
o, lse = ops.attention_forward(q, k, v)
ops.attention_backward(o, q, k, v, o, lse)
x = rng.standard_normal((64, 256)).astype(np.float32)
ops.linear_forward(x, x[:32], None)
ops.gelu_forward(x)
print(pytfm.get_num_threads(), 4 * len(os.sched_getaffinity(0)))
"""


@pytest.mark.parametrize("env", [{"PYTFM_NUM_THREADS": 2**31 - 1},
                                 {"OMP_NUM_THREADS": 2**31 - 1},
                                 {"PYTFM_NUM_THREADS": 100000, "OMP_NUM_THREADS": 100000}])
def test_a_huge_thread_count_from_the_environment_is_clamped(env):
    r = run_python(SNIPPET, **env)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    got, most = map(int, r.stdout.split())
    if "PYTFM_NUM_THREADS" in env:
        assert got == most, r.stdout
    else:  # OpenMP's count is the default's ceiling; the default is the cores others leave free
        assert 1 <= got <= most // 4, r.stdout


def test_kernels_called_from_several_threads_at_once_give_the_serial_bits():
    in_subprocess("several_callers")


def several_callers(callers=4, seconds=2.0):
    """Python threads each calling the kernels at once (cffi lets go of the GIL during a call,
    so their OpenMP teams really overlap), and two more whose calls fail in C with different
    messages: every result equals the serial one, and each failing thread reads its own last
    error."""
    run = workload()
    want = run()
    x, table = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    failures, stop = [], time.monotonic() + seconds
    wrong_calls = {
        "pytfm_layernorm_forward: eps must be >= 0":
            lambda: ops.layernorm_forward(x, x[0], x[0], eps=-1.0),
        "pytfm_embedding_forward: ids[1] = 5 is outside [0, 3)":
            lambda: ops.embedding_forward(np.array([0, 5]), table),
    }

    def call():
        try:
            while time.monotonic() < stop:
                if any(not np.array_equal(g, r) for g, r in zip(run(), want)):
                    failures.append("a result changed")
        except Exception as e:  # noqa: BLE001 - reported below, not lost with the thread
            failures.append(repr(e))

    def fail(message, wrong):
        n = 0
        while time.monotonic() < stop or n == 0:
            try:
                wrong()
                failures.append(f"no error for {message}")
            except ValueError as e:
                if not str(e).startswith(message):
                    failures.append(f"{str(e)!r} in the thread expecting {message!r}")
            n += 1

    threads = [threading.Thread(target=call) for _ in range(callers)]
    threads += [threading.Thread(target=fail, args=item) for item in wrong_calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]
