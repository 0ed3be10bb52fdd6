"""A busy neighbour: pytfm's training step when another process keeps one core busy.

    python -m bench.busy                    # (or python bench/busy.py) 3 rounds of ~2 s each
    python -m bench.busy --rounds 5 --seconds 3 --variants pytfm pinned passive

What it measures: train_tiny's training step (d=128, 4 layers, 8x128 tokens; forward,
backward, clipping, AdamW), in tokens/s, in a process of its own, at the default thread count
and at one thread, first on an idle machine and then while a neighbour process spins on one
core (`while True: pass`). Every parallel region ends at a barrier, so a team runs at the pace
of its slowest thread: the one that shares a core with the neighbour, slowed further by its
teammates spinning while they wait.

Variants (each the environment of the measuring process):
  pytfm      nothing set: what a user gets. The default count is the cores that other
             processes leave free (csrc/core/free_cores.c), with libgomp's default wait (spin, then
             sleep).
  pinned     PYTFM_NUM_THREADS = all CPUs: a fixed team, the default without the free-core rule.
  passive    pinned, with OMP_WAIT_POLICY=passive (waiting threads sleep at once).
Rounds interleave every (variant, threads) run, idle then busy; each figure is the median over
rounds of a per-run median step time. The targets: busy, the default thread count
is never slower than one thread (ratio >= 1, less 5 % of noise); idle, its speed is unchanged
(pytfm / pinned ~ 1).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import cpu_name, worker_env  # noqa: E402

CPUS = os.cpu_count()
VARIANTS = {
    "pytfm": {},
    "pinned": {"PYTFM_NUM_THREADS": str(CPUS)},
    "passive": {"PYTFM_NUM_THREADS": str(CPUS), "OMP_WAIT_POLICY": "passive"},
}
# busy, the default runs the same one thread as the 1-thread run on a 2-core machine: a ratio
# within 5 % of 1 is a tie, the noise between two processes' runs of the same computation
NOISE = 0.95
POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "PYTFM_NUM_THREADS")

# the step is bench/worker.py's, train_tiny's config (TRAIN[0]); threads 0: the default count
STEP = f"""
import statistics, sys, time
sys.path.insert(0, {HERE!r})
import pytfm, worker
threads, seconds = int(sys.argv[1]), float(sys.argv[2])
if threads:
    pytfm.set_num_threads(threads)
*_, T, B = worker.TRAIN[0]
[(_, step)] = worker.train_cases("pytfm", threads, worker.TRAIN[:1])
step()
times, end = [], time.perf_counter() + seconds
while time.perf_counter() < end or len(times) < 5:
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
print(B * T / statistics.median(times), pytfm.get_num_threads())
"""


def measure(variant, threads, seconds):
    """tokens/s of the step under `variant`'s environment at `threads` (0: the default)."""
    env = worker_env(1)
    for var in POLICY_VARS:
        env.pop(var, None)
    env.update(VARIANTS[variant])
    r = subprocess.run([sys.executable, "-c", STEP, str(threads), str(seconds)],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"busy worker ({variant}, {threads} threads) failed:\n{r.stderr[-3000:]}")
    tokens_per_s, used = r.stdout.split()
    return float(tokens_per_s), int(used)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="timing per run (default 2)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["pytfm", "pinned"])
    args = p.parse_args(argv)
    if args.rounds < 1 or not args.seconds > 0:
        p.error("--rounds must be >= 1 and --seconds > 0")

    runs = [(v, t) for v in args.variants for t in (0, 1)]
    results = {(v, t, load): [] for v, t in runs for load in ("idle", "busy")}
    used = {}
    for r in range(args.rounds):
        for load in ("idle", "busy"):
            neighbour = None
            if load == "busy":
                neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(0.5)  # let it settle on a core
            try:
                for v, t in runs if r % 2 == 0 else runs[::-1]:
                    tps, used[t] = measure(v, t, args.seconds)
                    results[v, t, load].append(tps)
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()

    med = {k: statistics.median(x) for k, x in results.items()}
    print(f"busy neighbour: {cpu_name()}, "
          f"{os.cpu_count()} CPUs, default = {used[0]} threads; train_tiny step, tokens/s, "
          f"median of {args.rounds} rounds")
    print(f"{'variant':<10} {'idle dflt':>10} {'idle 1thr':>10} {'busy dflt':>10} "
          f"{'busy 1thr':>10} {'busy dflt/1thr':>15}")
    for v in args.variants:
        idle0, idle1, busy0, busy1 = (med[v, t, load] for load in ("idle", "busy")
                                      for t in (0, 1))
        ok = "ok" if busy0 >= NOISE * busy1 else "MISS"
        print(f"{v:<10} {idle0:>10.0f} {idle1:>10.0f} {busy0:>10.0f} {busy1:>10.0f} "
              f"{busy0 / busy1:>11.2f} {ok}")
    if "pinned" in args.variants and "pytfm" in args.variants:
        ratio = med["pytfm", 0, "idle"] / med["pinned", 0, "idle"]
        print(f"idle, default threads: pytfm / pinned = {ratio:.2f} (target ~1)")


if __name__ == "__main__":
    main()
