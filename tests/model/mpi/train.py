"""python -m pytfm train (examples/train_tiny.py) for tests/model/test_distributed.py, run
under mpiexec (or alone), with faults to inject, from the environment:

    PYTFM_TEST_INTERRUPT_AT=k     a Ctrl-C after step k (pytfm.cli.train.main's interrupt_at)
    PYTFM_TEST_FAULT=raise|kill|exit|stop   at the start of optimizer step
    PYTFM_TEST_FAULT_RANK=r       PYTFM_TEST_FAULT_STEP on rank r: raise RuntimeError, SIGKILL
                                  itself, sys.exit(3), or SIGSTOP itself (after printing
                                  "stopped at <time.monotonic()>");
    PYTFM_TEST_FAULT=nan-grad     a NaN into the gradients of that step's backward on rank r
    PYTFM_TEST_FAULT=kill-saving  SIGKILL in the checkpoint save of that step, once the
                                  temporary file is written, before it is renamed

The other arguments are train_tiny's."""

import os
import signal
import sys
import time

ROOT = os.path.abspath(os.path.join(__file__, "..", "..", "..", ".."))

from pytfm import checkpoint, distributed  # noqa: E402
from pytfm.nn import GPT  # noqa: E402
from pytfm.optim import AdamW  # noqa: E402


def kill_before_rename(rank, at):
    world, save = distributed.init(), checkpoint.save

    def dying(path, model, step=0, *args, **kwargs):
        if world.rank == rank and step == at:
            os.replace = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
        return save(path, model, step, *args, **kwargs)

    checkpoint.save = dying


def nan_gradients(rank, at):
    world, backward, steps = distributed.init(), GPT.backward, []

    def poisoned(self):
        backward(self)
        steps.append(1)
        if world.rank == rank and len(steps) == at:
            self.grads.buffer[0] = float("nan")

    GPT.backward = poisoned


def inject(kind, rank, at):
    if kind == "kill-saving":
        return kill_before_rename(rank, at)
    if kind == "nan-grad":
        return nan_gradients(rank, at)
    world, step = distributed.init(), AdamW.step

    def faulty(self, lr=None):
        if world.rank == rank and self.t + 1 == at:
            if kind == "raise":
                raise RuntimeError(f"injected fault on rank {rank} at step {at}")
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "stop":
                print(f"stopped at {time.monotonic()}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            sys.exit(3)
        return step(self, lr)

    AdamW.step = faulty


if __name__ == "__main__":
    env = os.environ.get
    if env("PYTFM_TEST_FAULT"):
        inject(env("PYTFM_TEST_FAULT"), int(env("PYTFM_TEST_FAULT_RANK", "1")),
               int(env("PYTFM_TEST_FAULT_STEP", "3")))
    from pytfm.cli import train as cli

    at = env("PYTFM_TEST_INTERRUPT_AT")
    sys.exit(cli.main(sys.argv[1:], interrupt_at=int(at) if at else None))
