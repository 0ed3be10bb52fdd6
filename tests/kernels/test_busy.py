"""The default thread count gives way to a busy neighbour (csrc/core/free_cores.c).

Each case runs in a process of its own, since the count is sampled at most every 100 ms and
remembered; the neighbours are processes that spin on a core. The figures that matter (a
training step's speed with and without a neighbour) are bench/busy.py's, not a test's.
"""

import os
import subprocess
import sys
import time

import pytest

from helpers import run_python

CORES = len(os.sched_getaffinity(0))

# prints the thread count after {seconds} s of asking for it every 10 ms, as kernels do
PROBE = """
import time
import pytfm
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    pytfm.get_num_threads()
    time.sleep(0.01)
print(pytfm.get_num_threads())
"""


def spinners(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def probe(seconds=0.6, **env):
    out = run_python(PROBE.format(seconds=seconds), **env)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.skipif(sys.platform != "linux" or CORES < 2,
                    reason="the neighbour count is read from Linux's /proc; needs 2 cores")
def test_default_thread_count_leaves_the_cores_that_neighbours_keep_busy():
    if len(os.sched_getaffinity(0)) < os.cpu_count():
        pytest.skip("this process may not run on every CPU: the default count does not adapt")
    busy = spinners(CORES)
    try:
        time.sleep(0.3)
        assert probe() == 1  # every core is taken: one thread, not a team that waits on itself
        # an explicit count is the user's: it stays
        assert probe(PYTFM_NUM_THREADS=str(CORES)) == CORES
    finally:
        for p in busy:
            p.kill()
            p.wait()


def test_default_thread_count_is_at_least_one_and_at_most_openmps():
    assert probe(seconds=0.2, OMP_NUM_THREADS="1") == 1
    assert 1 <= probe(seconds=0.2) <= CORES


def fake_proc(root, machine_running, own_states):
    """A /proc of our making (PYTFM_PROC_ROOT): loadavg with machine_running runnable tasks,
    and this process's threads in the given states ("R" runnable, "S" asleep)."""
    (root / "loadavg").write_text(f"0.50 0.40 0.30 {machine_running}/300 4242\n")
    for i, state in enumerate(own_states):
        task = root / "self" / "task" / str(100 + i)
        task.mkdir(parents=True)
        (task / "stat").write_text(f"{100 + i} (a (b) c) {state} 1 2 3\n")  # ')' in the name
    return str(root)


@pytest.mark.skipif(sys.platform != "linux" or CORES < 2,
                    reason="the neighbour count is read from Linux's /proc; needs 2 cores")
@pytest.mark.parametrize("machine, own, others", [
    (3, "RRS", 1),  # this process's own running threads are not neighbours
    (1, "R", 0),
    (CORES + 5, "RS", CORES + 4),  # more neighbours than cores: still one thread
    (2, "RRRR", 0),  # fewer runnable than ours (the two reads are not one snapshot)
])
def test_the_default_counts_only_other_processes_tasks(tmp_path, machine, own, others):
    if len(os.sched_getaffinity(0)) < os.cpu_count():
        pytest.skip("this process may not run on every CPU: the default count does not adapt")
    root = fake_proc(tmp_path, machine, own)
    assert probe(PYTFM_PROC_ROOT=root) == max(1, CORES - others)


@pytest.mark.skipif(sys.platform != "linux" or CORES < 2,
                    reason="the neighbour count is read from Linux's /proc; needs 2 cores")
def test_the_first_call_already_leaves_the_busy_cores(tmp_path):
    """The very first kernel of a process sees the neighbours: the two-sample filter starts
    from the first sample, not from an imagined idle one (which would run a short C program's
    prompt on a full team beside a busy neighbour)."""
    if len(os.sched_getaffinity(0)) < os.cpu_count():
        pytest.skip("this process may not run on every CPU: the default count does not adapt")
    root = fake_proc(tmp_path, CORES + 5, "R")
    code = "import pytfm; print(pytfm.get_num_threads())"
    out = run_python(code, PYTFM_PROC_ROOT=root)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 1


# runs one parallel kernel (a one-row product of a 1024 x 512 W: 64-output tasks) and prints the
# threads this process gained: the team's workers, which libgomp starts at a team's first use
TEAM = """
import os
import numpy as np
import pytfm
from pytfm import ops
before = len(os.listdir("/proc/self/task"))
x = np.ones((1, 512), np.float32)
w = np.ones((1024, 512), np.float32)
for _ in range(3):
    ops.linear_forward(x, w)
print(len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.skipif(sys.platform != "linux" or CORES < 2,
                    reason="the neighbour count is read from Linux's /proc; needs 2 cores")
@pytest.mark.parametrize("machine, workers", [(CORES + 5, 0), (1, CORES - 1)])
def test_an_explicit_count_runs_no_team_member_on_a_busy_core(tmp_path, machine, workers):
    """PYTFM_NUM_THREADS=cores beside neighbours on every core: the parallel loops run on the
    calling thread alone (a team member on a busy core would hold every region's end); on an
    idle machine the whole team runs. get_num_threads() still reports the count set."""
    if len(os.sched_getaffinity(0)) < os.cpu_count():
        pytest.skip("this process may not run on every CPU: the team does not adapt")
    root = fake_proc(tmp_path, machine, "R")
    env = dict(PYTFM_PROC_ROOT=root, PYTFM_NUM_THREADS=str(CORES), OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS=str(CORES))
    out = run_python(TEAM, **env)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == workers
    assert probe(seconds=0.2, **env) == CORES
