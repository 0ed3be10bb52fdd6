"""examples/train_tiny.py for tests/model/test_distributed.py, run under mpiexec (or alone), with
faults to inject, from the environment:

    PYTFM_TEST_INTERRUPT_AT=k     a Ctrl-C after step k (train_tiny.main's interrupt_at)
    PYTFM_TEST_FAULT=raise|kill|exit   at the start of optimizer step PYTFM_TEST_FAULT_STEP on
    PYTFM_TEST_FAULT_RANK=r       rank r: raise RuntimeError, SIGKILL itself, or sys.exit(3);
    PYTFM_TEST_FAULT=kill-saving  SIGKILL in the checkpoint save of that step, once the
                                  temporary file is written, before it is renamed

The other arguments are train_tiny's."""

import importlib.util
import os
import signal
import sys

ROOT = os.path.abspath(os.path.join(__file__, "..", "..", "..", ".."))

from pytfm import checkpoint, distributed  # noqa: E402
from pytfm.optim import AdamW  # noqa: E402


def kill_before_rename(rank, at):
    world, save = distributed.init(), checkpoint.save

    def dying(path, model, step=0, *args, **kwargs):
        if world.rank == rank and step == at:
            os.replace = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
        return save(path, model, step, *args, **kwargs)

    checkpoint.save = dying


def inject(kind, rank, at):
    if kind == "kill-saving":
        return kill_before_rename(rank, at)
    world, step = distributed.init(), AdamW.step

    def faulty(self, lr=None):
        if world.rank == rank and self.t + 1 == at:
            if kind == "raise":
                raise RuntimeError(f"injected fault on rank {rank} at step {at}")
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.exit(3)
        return step(self, lr)

    AdamW.step = faulty


if __name__ == "__main__":
    env = os.environ.get
    if env("PYTFM_TEST_FAULT"):
        inject(env("PYTFM_TEST_FAULT"), int(env("PYTFM_TEST_FAULT_RANK", "1")),
               int(env("PYTFM_TEST_FAULT_STEP", "3")))
    spec = importlib.util.spec_from_file_location(
        "train_tiny", os.path.join(ROOT, "examples", "train_tiny.py"))
    tt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tt)
    at = env("PYTFM_TEST_INTERRUPT_AT")
    sys.exit(tt.main(sys.argv[1:], interrupt_at=int(at) if at else None))
