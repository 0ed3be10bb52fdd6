"""A busy neighbour: pytfm's training step, or its decoding, while another process keeps a core
busy.

    python -m bench.busy                    # (or python bench/busy.py) 3 rounds of ~2 s each
    python -m bench.busy --rounds 5 --seconds 3 --variants pytfm pinned passive
    python -m bench.busy --decode           # GPT-2-124M-shaped decoding through the C model
    python -m bench.busy --decode --model tiny --threads 0 1 2

What it measures: train_tiny's training step (d=128, 4 layers, 8x128 tokens; forward,
backward, clipping, AdamW), in tokens/s, in a process of its own; or, with --decode, tokens/s
of the C model decoding greedily (bench/c_decode.c --generate: a 16-token prompt, then
--tokens tokens) on a random GPT-2 of 124M's shape (--model gpt2: transformers' initialisation,
needs torch and transformers) or train_tiny's model (--model tiny). Each at the thread counts
--threads (0: the default count; the default list is 0 and 1 for training, 0, 1 and 2 for
decoding), first on an idle machine and then while a neighbour process spins on one core
(`nice -n NICE python -c 'while True: pass'`, NICE 19 by default as in the issue that asked
for this; 0 is a neighbour of equal weight). Every parallel region ends at a barrier, so a team
runs at the pace of its slowest thread: the one that shares a core with the neighbour, slowed
further by its teammates spinning while they wait.

Variants (each the environment of the measuring process):
  pytfm      nothing set: what a user gets. The default count is the cores that other
             processes leave free (csrc/core/free_cores.c), with libgomp's default wait (spin, then
             sleep); an explicit count within the cores runs no team member on a busy core.
  pinned     PYTFM_NUM_THREADS = all CPUs: a fixed team, the default without the free-core rule
             (training: the 0 column).
  passive    pinned, with OMP_WAIT_POLICY=passive (waiting threads sleep at once).
Rounds interleave every (variant, threads) run, idle then busy; each figure is the median over
rounds of a per-run median step time (decoding: of the decodes' times). The targets: busy,
every thread count is never slower than one thread (ratio >= 1, less 5 % of noise); idle, the
default's speed is unchanged (pytfm / pinned ~ 1). The load average is printed before and
after: on a shared machine other work is a neighbour too.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
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


def variant_env(variant):
    env = worker_env(1)
    for var in POLICY_VARS:
        env.pop(var, None)
    env.update(VARIANTS[variant])
    return env


def measure(variant, threads, seconds):
    """tokens/s of the step under `variant`'s environment at `threads` (0: the default)."""
    r = subprocess.run([sys.executable, "-c", STEP, str(threads), str(seconds)],
                       capture_output=True, text=True, env=variant_env(variant))
    if r.returncode:
        sys.exit(f"busy worker ({variant}, {threads} threads) failed:\n{r.stderr[-3000:]}")
    tokens_per_s, used = r.stdout.split()
    return float(tokens_per_s), int(used)


def decode_model(kind, tmp):
    """The path of the model --decode runs: a GPT-2-124M-shaped folder or train_tiny's."""
    if kind == "gpt2":
        folder = os.path.join(tmp, "gpt2-124m")
        subprocess.run([sys.executable, os.path.join(HERE, "gpt2.py"), "--worker", "folder",
                        "torch", "1", folder], check=True, env=worker_env(1),
                       stdout=subprocess.DEVNULL)
        return folder
    sys.path.insert(0, os.path.dirname(HERE))
    from pytfm import checkpoint
    from pytfm.nn import GPT, GPTConfig

    path = os.path.join(tmp, "tiny.safetensors")
    checkpoint.save(path, GPT(GPTConfig(seed=0)))
    return path


def measure_decode(exe, model, tokens, variant, threads):
    """(tokens/s of c_decode --generate, the median of 3 decodes; threads used: the count
    asked, or "dflt")."""
    r = subprocess.run([exe, "--generate", model, "3", str(threads), "fp32", "16", str(tokens)],
                       capture_output=True, text=True, env=variant_env(variant))
    if r.returncode:
        sys.exit(f"c_decode ({variant}, {threads} threads) failed:\n{r.stderr[-3000:]}")
    seconds = statistics.median(int(line.split()[1]) / 1e9 for line in r.stdout.splitlines())
    return tokens / seconds, threads


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="timing per run (default 2)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS),
                   help="default: pytfm pinned (training), pytfm (decoding: c_decode sets the "
                   "count itself, so pinned is the 2-thread column there)")
    p.add_argument("--decode", action="store_true", help="time decoding, not training")
    p.add_argument("--model", choices=["gpt2", "tiny"], default="gpt2", help="with --decode")
    p.add_argument("--tokens", type=int, default=32, help="tokens per decode (--decode)")
    p.add_argument("--threads", nargs="+", type=int, help="0: the default count")
    p.add_argument("--nice", type=int, default=19, help="the neighbour's nice (default 19)")
    args = p.parse_args(argv)
    if args.rounds < 1 or not args.seconds > 0:
        p.error("--rounds must be >= 1 and --seconds > 0")
    threads = args.threads or ([0, 1, 2] if args.decode else [0, 1])
    args.variants = args.variants or (["pytfm"] if args.decode else ["pytfm", "pinned"])
    if 1 not in threads:
        p.error("--threads must include 1: the figures are ratios to it")
    with tempfile.TemporaryDirectory(prefix="pytfm-busy-") as tmp:
        if args.decode:
            from c_generate import build_driver

            exe, model = build_driver(tmp), decode_model(args.model, tmp)
            def one(v, t):
                return measure_decode(exe, model, args.tokens, v, t)
            what = (f"{'GPT-2 124M-shaped' if args.model == 'gpt2' else 'train_tiny'} decode "
                    f"(C model, FP32, {args.tokens} tokens)")
        else:
            def one(v, t):
                return measure(v, t, args.seconds)
            what = "train_tiny step"
        runs = [(v, t) for v in args.variants for t in threads]
        results = {(v, t, load): [] for v, t in runs for load in ("idle", "busy")}
        used, loadavg = {}, [os.getloadavg()[0]]
        for r in range(args.rounds):
            for load in ("idle", "busy"):
                neighbour = None
                if load == "busy":
                    neighbour = subprocess.Popen(["nice", "-n", str(args.nice), sys.executable,
                                                  "-c", "while True: pass"])
                    time.sleep(0.5)  # let it settle on a core
                try:
                    for v, t in runs if r % 2 == 0 else runs[::-1]:
                        tps, used[t] = one(v, t)
                        results[v, t, load].append(tps)
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
            loadavg.append(os.getloadavg()[0])

    med = {k: statistics.median(x) for k, x in results.items()}
    name = {t: "dflt" if t == 0 else f"{t}thr" for t in threads}
    print(f"busy neighbour (nice {args.nice}): {cpu_name()}, {os.cpu_count()} CPUs; {what}, "
          f"tokens/s, median of {args.rounds} rounds")
    print(f"load average {loadavg[0]:.2f} at the start, {min(loadavg[1:]):.2f}-"
          f"{max(loadavg[1:]):.2f} after each round")
    if not args.decode:
        print(f"default = {used[0]} threads")
    cols = [(load, t) for load in ("idle", "busy") for t in threads]
    others = [t for t in threads if t != 1]
    print(f"{'variant':<10}" + "".join(f"{load + ' ' + name[t]:>11}" for load, t in cols)
          + "".join(f"{'busy ' + name[t] + '/1thr':>16}" for t in others))
    for v in args.variants:
        row = "".join(f"{med[v, t, load]:>11.1f}" for load, t in cols)
        for t in others:
            ratio = med[v, t, "busy"] / med[v, 1, "busy"]
            row += f"{ratio:>11.2f} {'ok' if ratio >= NOISE else 'MISS'}".rjust(16)
        print(f"{v:<10}" + row)
    if "pinned" in args.variants and "pytfm" in args.variants and 0 in threads:
        ratio = med["pytfm", 0, "idle"] / med["pinned", 0, "idle"]
        print(f"idle, default threads: pytfm / pinned = {ratio:.2f} (target ~1)")


if __name__ == "__main__":
    main()
