"""Kernels in a forked child: the same bits as the parent's, and no hang.

libgomp does not survive fork(): a child that starts a team of threads after its parent ran one
waits forever for pool threads that were not copied. The library (csrc/core/status.c) runs a
child forked after the parent's first team on one thread, and leaves a child forked before it
the count it inherited. Each case runs in a fresh interpreter under a time limit (SECONDS), its
children each under one of their own (CHILD_SECONDS), so that a hang fails the test instead of
hanging the suite. The default thread count is made 2 here whatever the machine's load
(OMP_NUM_THREADS=2, and PYTFM_PROC_ROOT naming an empty folder: no neighbours seen), so that the
default runs a team too.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import TESTS

SECONDS = 120  # a case, interpreter start to end, on a busy 2-core machine: ~1 s alone
CHILD_SECONDS = 60  # one child's kernels and exit

COMMON = f"""
import multiprocessing, os, signal, sys, time
sys.path[:0] = [{TESTS!r} + "/kernels", {TESTS!r}]
import numpy as np
import pytfm
from test_threads import workload

run = workload()


def digest():
    return b"".join(a.tobytes() for a in run())


def in_child(body):
    '''body() in a forked child -> its exit status (a child still running after CHILD_SECONDS
    is killed: -9); body returns the status to exit with.'''
    pid = os.fork()
    if pid == 0:
        try:
            status = body()
        except BaseException:
            import traceback
            traceback.print_exc()
            status = 70
        os._exit(status)
    deadline = time.monotonic() + {CHILD_SECONDS}
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -9
"""


def run_case(code, tmp_path):
    """COMMON and code in a fresh interpreter, which must print 'done'."""
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTFM_PROC_ROOT=str(tmp_path))
    env.pop("PYTFM_NUM_THREADS", None)
    r = subprocess.run([sys.executable, "-c", COMMON + textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=SECONDS, cwd="/", env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), (
        f"exit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}")
    return r.stdout


def test_a_child_forked_after_the_parents_threads_ran_computes_the_same_bits(tmp_path):
    """The parent runs the kernels on 2 threads, then forks: the child, with the count it
    inherited, computes the parent's bits on one thread instead of waiting for the parent's
    pool; so does a child of that child, and a count set in the child is not obeyed either."""
    run_case("""
        pytfm.set_num_threads(2)
        parent = digest()
        assert pytfm.get_num_threads() == 2

        def child():
            same = digest() == parent and pytfm.get_num_threads() == 1
            pytfm.set_num_threads(2)
            same = same and digest() == parent and pytfm.get_num_threads() == 1
            grandchild = in_child(lambda: 0 if digest() == parent else 3)
            return 0 if same and grandchild == 0 else 3 if grandchild == 0 else 4

        status = in_child(child)
        assert status == 0, f"the child exited {status} (-9: it hung; 3: other bits)"
        assert digest() == parent and pytfm.get_num_threads() == 2  # the parent keeps its team
        print("done")
    """, tmp_path)


def test_a_child_forked_before_any_team_keeps_its_thread_count(tmp_path):
    """No team has run in the parent: the child's libgomp is fresh, and its kernels use the
    count it inherited (2 here), with the parent's bits."""
    run_case("""
        pytfm.set_num_threads(1)
        serial = digest()  # one thread: no team
        pytfm.set_num_threads(2)

        def child():
            if pytfm.get_num_threads() != 2:
                return 5
            return 0 if digest() == serial else 3

        status = in_child(child)
        assert status == 0, f"the child exited {status} (-9: it hung; 3: other bits; 5: 1 thread)"
        print("done")
    """, tmp_path)


@pytest.mark.parametrize("threads", [2, 0])
def test_a_fork_pool_of_workers_computes_the_parents_bits(threads, tmp_path):
    """multiprocessing's "fork" start method (Linux's default before Python 3.14), after the
    parent ran its kernels on 2 threads: set (2), or the default (0)."""
    run_case(f"""
        pytfm.set_num_threads({threads})
        assert pytfm.get_num_threads() == min(2, len(os.sched_getaffinity(0)))
        parent = digest()

        def work(i):
            return digest()

        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map_async(work, range(4)).get(timeout={CHILD_SECONDS})
        assert all(r == parent for r in results)
        print("done")
    """, tmp_path)
