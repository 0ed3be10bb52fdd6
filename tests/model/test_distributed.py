"""pytfm.distributed: data-parallel training on MPI, run as a user runs it (mpiexec -n 2, each
rank on one thread by the module's own choice on 2 cores).

The MPI tests need mpi4py and an mpiexec (pip install "pytfm[mpi]": the mpich wheels bring
one): without them they skip, and under CI (the environment variable CI set), which installs
the extra, they fail. Each mpiexec job is bounded (JOB_SECONDS) and killed, all its processes,
if it runs over: a hang fails the test instead of hanging the suite.

Tolerance of "2 ranks give the 1-rank losses" (RTOL): the two runs train the same rows with the
same parameters; they differ only in float32 rounding: each rank's loss and weight gradients
are sums over its half of the B·T positions, added to the other half's afterwards, where one
process adds them in one sum. The losses seen here differ by at most 8e-8 relative (1.3 float32
epsilons) over 10 steps. RTOL = 1e-5 leaves room for AdamW carrying a rounding difference in a
gradient near zero into a full-size update (its step is lr·m/√v whatever the size of g), and
is far below what a wrong share of the batch does: with batch 7 (rows 3 and 4) weighted 1/2
each instead of 3/7 and 4/7 the losses move 3e-4 at step 1 and up to 5e-3 within 10 steps
(measured). Adam and clipping do not see a gradient's scale, so a sum where the mean belongs is
caught by the gradient norms, compared with the same RTOL.
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import pytfm
from helpers import ROOT
from pytfm import checkpoint, distributed
from pytfm.nn import GPT, GPTConfig

MPI_DIR = os.path.join(ROOT, "tests", "model", "mpi")
TRAIN_TINY = os.path.join(ROOT, "examples", "train_tiny.py")
JOB_SECONDS = 120  # a whole tiny job, start to end, on a busy 2-core machine: ~2 s alone
FAULT_SECONDS = 60  # a fault to the job's end (seconds alone: ~1)
RTOL = 1e-5  # see the module's docstring
STALL_TIMEOUT = 3.0  # the collective timeout of the stalled-rank test
STALL_SLACK = 10.0  # the watchdog's tick and MPI_Abort on a busy machine (alone: ~0.1 s)
needs_checkout = pytest.mark.skipif(not os.path.isdir(MPI_DIR), reason="needs the checkout")


def find_mpiexec():
    """The mpiexec beside this Python (a virtualenv with the mpich wheel), else on PATH; None
    without mpi4py or an mpiexec."""
    if importlib.util.find_spec("mpi4py") is None:
        return None
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


def mpiexec_or_skip(find=find_mpiexec):
    """mpiexec's path; where mpi4py or mpiexec is missing, a skip, but a failure under CI."""
    exe = find()
    if exe is None:
        message = f"needs mpi4py and mpiexec for the 2-rank tests: {distributed.INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return exe


@pytest.fixture(scope="module")
def mpiexec():
    return mpiexec_or_skip()


def job(cmd, ranks=None, env=None, timeout=JOB_SECONDS, mpiexec=None):
    """Run cmd (a list: a script and its arguments) with this Python, under mpiexec -n ranks
    unless ranks is None; the pytfm this test imports comes first on the path. -> (status,
    stdout + stderr, seconds). Over timeout: every process of the job is killed and the test
    fails."""
    path = os.path.dirname(os.path.dirname(os.path.abspath(pytfm.__file__)))
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [path, *filter(None, [os.environ.get("PYTHONPATH")])]), **(env or {}))
    for var in ("PYTFM_NUM_THREADS", "OMP_NUM_THREADS"):  # let the ranks choose
        if env is None or var not in env:
            full_env.pop(var, None)
    argv = [sys.executable, "-u", *map(str, cmd)]
    if ranks is not None:
        argv = [mpiexec, "-n", str(ranks), *argv]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, cwd="/", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(argv)} ran over {timeout} s (a hang?); its output:\n{out[-3000:]}")
    return proc.returncode, out, time.perf_counter() - start


def steps(mpiexec, ranks, n_steps=10, batch=6):
    """tests/model/mpi/steps.py's JSON (ranks None: one plain process)."""
    status, out, _ = job([os.path.join(MPI_DIR, "steps.py"), n_steps, batch], ranks,
                         mpiexec=mpiexec)
    assert status == 0, out
    return json.loads(out.strip().splitlines()[-1])


# ---- without MPI ------------------------------------------------------------------------------


def test_shards_cover_the_global_batch_exactly_once():
    for batch in range(1, 40):
        for size in range(1, batch + 1):
            rows = [shard for r in range(size)
                    for shard in range(*distributed.shard_rows(batch, r, size))]
            assert rows == list(range(batch))
            sizes = {np.subtract(*distributed.shard_rows(batch, r, size)) for r in range(size)}
            assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="cannot give each of 3 ranks a row"):
        distributed.shard_rows(2, 0, 3)


def test_one_process_is_a_world_of_one_without_mpi():
    code = ("import sys; from pytfm import distributed; w = distributed.init(); "
            "print(w.rank, w.size, 'mpi4py' in sys.modules)")
    status, out, _ = job(["-c", code])  # this test process: no launcher variables
    assert status == 0 and out.split() == ["0", "1", "False"], out


def test_a_launched_process_without_mpi4py_says_what_to_install():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "from pytfm import distributed; distributed.init()")
    status, out, _ = job(["-c", code], env={"PMI_SIZE": "2", "PMI_RANK": "1"})
    assert status != 0 and 'pip install "pytfm[mpi]"' in out and "PMI_SIZE" in out, out


def test_without_mpi_the_mpi_tests_skip_but_fail_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs mpi4py and mpiexec"):
        mpiexec_or_skip(lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="needs mpi4py and mpiexec"):
        mpiexec_or_skip(lambda: None)


# ---- 2 ranks (and 3) --------------------------------------------------------------------------


@needs_checkout
@pytest.mark.parametrize("ranks", [2, 3])
def test_parameters_are_bitwise_identical_on_every_rank_after_every_step(mpiexec, ranks):
    """Each rank starts from its own seed: the broadcast makes them rank 0's; after each step
    the parameters and both AdamW moments are the same bytes on every rank (3 ranks: the
    Reduce_scatter + Allgatherv path, 7 rows shared 2, 2, 3)."""
    r = steps(mpiexec, ranks, n_steps=6, batch=7)
    assert r["ranks"] == ranks and r["threads"] == 1  # 2 or 3 ranks on 2 cores: one each
    assert r["first_identical"] and r["identical"] == [True] * 6


def close(a, b, rtol=RTOL):
    return np.allclose(a, b, rtol=rtol, atol=0)


@needs_checkout
@pytest.mark.parametrize("batch", [6, 7])
def test_two_ranks_give_the_losses_of_one_rank_with_the_same_global_batch(mpiexec, batch):
    """10 steps; batch 7: rows 3 and 4, each rank's mean weighted by its rows."""
    one, two = steps(mpiexec, None, batch=batch), steps(mpiexec, 2, batch=batch)
    assert two["ranks"] == 2 and all(two["identical"])
    assert close(two["losses"], one["losses"]), (one["losses"], two["losses"])
    assert close(two["norms"], one["norms"]), (one["norms"], two["norms"])  # a mean, not a sum
    assert two["losses"][-1] < two["losses"][0] - 0.1  # it trains


def tiny(out, *more):
    text = os.path.join(os.path.dirname(str(out)), "corpus.txt")
    if not os.path.exists(text):
        with open(text, "w") as f:
            f.write("def f(x):\n    return x + 1\n" * 200)
    return [TRAIN_TINY, "--out", out, "--text", text, "--d-model", "32", "--n-layer", "2",
            "--n-head", "2", "--context", "32", "--batch", "4", "--eval-every", "5",
            "--log-every", "1", "--sample-tokens", "10", "--steps", "10", *more]


def log(out):
    """loss.csv's (train loss, val loss or nan) per step."""
    rows = open(os.path.join(out, "loss.csv")).read().splitlines()[1:]
    return np.array([[float(r.split(",")[1]), float(r.split(",")[2] or "nan")] for r in rows])


def same_curve(a, b):
    """Within RTOL, and the 5 decimals loss.csv keeps: 5e-6 rounding on each side."""
    return a.shape == b.shape and np.allclose(a, b, rtol=RTOL, atol=1e-5, equal_nan=True)


@needs_checkout
def test_train_tiny_on_two_ranks_matches_one_process(mpiexec, tmp_path):
    status, out1, _ = job(tiny(tmp_path / "one"))
    assert status == 0, out1
    status, out2, _ = job(tiny(tmp_path / "two"), 2, mpiexec=mpiexec)
    assert status == 0, out2
    assert same_curve(log(tmp_path / "two"), log(tmp_path / "one"))
    # rank 0 alone prints: one header, one line per step, one sample
    assert out2.count("GPT with") == 1 and out2.count("step    10/10") == 1, out2
    assert "tok/s on 2 ranks" in out2 and "2 ranks, 1 thread each" in out2
    assert out2.count("sample (temperature") == 1


@needs_checkout
@pytest.mark.parametrize("first, then", [(2, 1), (1, 2)])
def test_a_run_resumes_on_another_rank_count_on_the_same_trajectory(mpiexec, tmp_path, first,
                                                                    then):
    """Interrupted after step 5 on `first` ranks, resumed to 10 on `then`: the 10 losses are
    the uninterrupted 1-rank run's, and steps 1-5 are the first run's exactly."""
    status, out, _ = job(tiny(tmp_path / "ref"))
    assert status == 0, out
    run = tmp_path / "run"
    status, out, _ = job([os.path.join(MPI_DIR, "train.py"), *tiny(run)[1:]],
                         first if first > 1 else None, mpiexec=mpiexec,
                         env={"PYTFM_TEST_INTERRUPT_AT": "5"})
    assert status == 130 and out.count("interrupted: checkpoint saved at step 5") == 1, out
    before = log(run)
    status, out, _ = job(tiny(run, "--resume"), then if then > 1 else None, mpiexec=mpiexec)
    assert status == 0 and "resumed" in out, out
    after, ref = log(run), log(tmp_path / "ref")
    assert len(before) == 5 and np.array_equal(after[:5], before, equal_nan=True)
    assert same_curve(after, ref), (after, ref)


@needs_checkout
def test_a_usage_error_under_mpiexec_is_reported_once_and_every_rank_exits_2(mpiexec, tmp_path):
    status, out, _ = job(tiny(tmp_path / "u", "--batch", "1"), 2, mpiexec=mpiexec)
    assert status == 2, out
    assert out.count("--batch 1 is the global batch, split over the 2 ranks") == 1, out
    assert "Abort" not in out and not (tmp_path / "u").exists()


@needs_checkout
def test_a_trained_model_is_refused_by_every_rank_alike_unless_forced(mpiexec, tmp_path):
    """Rank 0 alone looks at --out and decides for all: a run over a checkpoint without
    --resume or --force ends every rank with status 2 and one message, the file untouched;
    with --force the 2 ranks train and replace it."""
    (tmp_path / "m").mkdir()
    ckpt = tmp_path / "m" / "model.safetensors"
    checkpoint.save(str(ckpt), GPT(GPTConfig(d_model=32, n_layer=2, n_head=2, max_seq=32)), 7)
    before = ckpt.read_bytes()
    status, out, _ = job(tiny(tmp_path / "m"), 2, mpiexec=mpiexec)
    assert status == 2, out
    assert out.count(f"--out: {ckpt} exists") == 1 and "Abort" not in out, out
    assert ckpt.read_bytes() == before
    status, out, _ = job(tiny(tmp_path / "m", "--force", "--steps", "2"), 2, mpiexec=mpiexec)
    assert status == 0, out
    assert checkpoint.load(str(ckpt))[1] == 2


@needs_checkout
@pytest.mark.parametrize("fault, rank", [("raise", 1), ("exit", 1), ("kill", 1), ("kill", 0),
                                         ("kill-saving", 0)])
def test_a_failing_rank_ends_the_job_with_a_message_and_a_whole_checkpoint(
        mpiexec, tmp_path, fault, rank):
    """A rank that raises, exits alone, or is killed (SIGKILL, as the OOM killer does) at step
    5 of a run that would take hours: the job ends within FAULT_SECONDS with a non-zero status
    and a message, and the checkpoint (saved after every step) loads, at step 4 or 5 (or 6:
    the survivor may finish the save of a step in flight). kill-saving: rank 0 dies after
    writing the temporary of step 5's checkpoint, before its rename: the old one stays."""
    out_dir = tmp_path / "f"
    env = {"PYTFM_TEST_FAULT": fault, "PYTFM_TEST_FAULT_RANK": str(rank),
           "PYTFM_TEST_FAULT_STEP": "5"}
    cmd = [os.path.join(MPI_DIR, "train.py"), *tiny(out_dir, "--steps", "100000",
                                                     "--eval-every", "1")[1:]]
    status, out, seconds = job(cmd, 2, env=env, mpiexec=mpiexec, timeout=JOB_SECONDS)
    assert status != 0, out
    assert seconds < FAULT_SECONDS, (seconds, out)
    if fault in ("raise", "exit"):  # ours
        assert f"pytfm.distributed: rank {rank} of 2:" in out and "aborting all 2 ranks" in out
        assert ("injected fault on rank 1" if fault == "raise" else "exited with status 3") in out
    else:  # the launcher's: MPICH's hydra names the signal
        assert "signal 9" in out or "Killed" in out, out
    _, step, _ = checkpoint.load(str(out_dir / "model.safetensors"))
    assert step == 4 if fault == "kill-saving" else 4 <= step <= 6, (step, out)


@needs_checkout
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_stopped_rank_ends_the_job_within_the_timeout_with_a_whole_checkpoint(
        mpiexec, tmp_path, how):
    """Rank 1 SIGSTOPs itself at step 5 (it neither dies nor answers): rank 0's collective
    watchdog, at a timeout of STALL_TIMEOUT seconds (--collective-timeout, or
    PYTFM_COLLECTIVE_TIMEOUT), names rank 1 and the step and ends the job through MPI within
    the timeout and a few seconds; the checkpoint (saved after every step) loads, at step 4."""
    out_dir = tmp_path / "s"
    env = {"PYTFM_TEST_FAULT": "stop", "PYTFM_TEST_FAULT_RANK": "1",
           "PYTFM_TEST_FAULT_STEP": "5"}
    more = ["--collective-timeout", str(STALL_TIMEOUT)] if how == "flag" else []
    if how == "environment":
        env["PYTFM_COLLECTIVE_TIMEOUT"] = str(STALL_TIMEOUT)
    cmd = [os.path.join(MPI_DIR, "train.py"), *tiny(out_dir, "--steps", "100000",
                                                     "--eval-every", "1", *more)[1:]]
    status, out, _ = job(cmd, 2, env=env, mpiexec=mpiexec, timeout=JOB_SECONDS)
    ended = time.monotonic()
    assert status != 0, out
    stopped = float(out.split("stopped at ")[1].split()[0])  # CLOCK_MONOTONIC: one machine
    assert ended - stopped < STALL_TIMEOUT + STALL_SLACK, (ended - stopped, out)
    assert "pytfm.distributed: rank 0 of 2:" in out and "of step 5" in out, out
    assert f"more than the timeout of {STALL_TIMEOUT:g} s, for rank(s) 1, which did not " \
           "arrive" in out and "aborting all 2 ranks" in out, out
    _, step, _ = checkpoint.load(str(out_dir / "model.safetensors"))
    assert step == 4, (step, out)


@needs_checkout
@pytest.mark.parametrize("ranks, victim, delay", [(2, 1, 0.3), (2, 1, 0.8), (2, 0, 0.5),
                                                  (2, 0, 1.1), (3, 2, 0.4), (3, 1, 0.9)])
def test_a_rank_stopped_anywhere_is_the_one_rank_named(mpiexec, ranks, victim, delay):
    """One rank of a job that does nothing but collectives is stopped from outside (SIGSTOP:
    most likely inside a collective, having arrived): every watchdog message names that rank,
    and only it, as the one that did not arrive; the job ends with an abort."""
    path = os.path.dirname(os.path.dirname(os.path.abspath(pytfm.__file__)))
    # MPICH's shared-memory cells a process sends through, 64 by default, shared by all its
    # peers: 8 here, so that messages left at the stopped rank would exhaust them within these
    # few seconds, as they would within a minute at the default timeout, where a rank that can
    # no longer send heartbeats to anyone looks stopped too (other MPIs ignore the variable)
    env = dict(os.environ, PYTHONPATH=path, PYTFM_COLLECTIVE_TIMEOUT=str(STALL_TIMEOUT),
               PYTFM_NUM_THREADS="1", MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_NUM_CELLS="8")
    proc = subprocess.Popen([mpiexec, "-n", str(ranks), sys.executable, "-u",
                             os.path.join(MPI_DIR, "stall.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd="/",
                            start_new_session=True)
    try:
        pids, lines = {}, []
        while len(pids) < ranks:
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
            pids.update((int(r), int(p)) for r, p in re.findall(r"rank (\d+) pid (\d+)", line))
        time.sleep(delay)
        os.kill(pids[victim], signal.SIGSTOP)
        out, _ = proc.communicate(timeout=FAULT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the job ran on {FAULT_SECONDS} s after the stop:\n{proc.communicate()[0]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(lines) + out
    assert proc.returncode != 0, out
    messages = [m for m in out.splitlines() if m.startswith("pytfm.distributed: rank ")]
    assert messages, out
    for m in messages:
        assert f"for rank(s) {victim}, which did not arrive" in m, out
        assert f"aborting all {ranks} ranks" in m, out
        assert not m.startswith(f"pytfm.distributed: rank {victim} "), out


def test_the_collective_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(distributed.TIMEOUT_VAR, raising=False)
    assert distributed.default_timeout() == distributed.DEFAULT_TIMEOUT == 600
    monkeypatch.setenv(distributed.TIMEOUT_VAR, " 2.5 ")
    assert distributed.default_timeout() == 2.5 and distributed.World(None).timeout == 2.5
    for bad in ("0", "-1", "inf", "nan", "ten"):
        monkeypatch.setenv(distributed.TIMEOUT_VAR, bad)
        with pytest.raises(ValueError, match="PYTFM_COLLECTIVE_TIMEOUT=.*finite number of sec"):
            distributed.default_timeout()
