"""What the benchmarks' worker processes share."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_env(threads, **extra):
    """The environment of a worker process at `threads` threads (plus `extra` variables) that
    imports this checkout's pytfm, the one setup.py built and mirrored into it, and not some
    other installed copy."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **{k: str(v) for k, v in extra.items()})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env
