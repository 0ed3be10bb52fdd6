"""Data-parallel training on MPI (pytfm.distributed): the tokens/s of a training step as 1 rank
x 1 thread, 1 rank x 2 threads and 2 ranks x 1 thread, and the communication per step at 2
ranks, against their targets.

    flock /tmp/pytfm-bench.lock python bench/distributed.py                  # d384, 3 rounds
    flock /tmp/pytfm-bench.lock python bench/distributed.py --config tiny --rounds 5 --steps 10

Needs mpi4py and an mpiexec (pip install ".[mpi]"; the mpiexec beside this Python first).
Configs are bench/worker.py's TRAIN rows: d384 is the 6-layer d=384 GPT (6 heads, context 256,
global batch 8), tiny is train_tiny.py's default (d=128, 4 layers, context 128, batch 8).

Each run is a job of its own (mpiexec -n R of this file with --worker, PYTFM_NUM_THREADS set),
runs interleaved over --rounds rounds, the order reversed every other round; each figure is the
median over rounds of a run's median step. A step is train_tiny.py's: the rank's rows of the
global batch, forward, the loss summed over ranks, backward, average_gradients, clipping, AdamW;
each starts after a barrier so that the ranks' clocks measure the same interval.
Communication at 2 ranks, two figures:
  in step   the time inside average_gradients during the timed steps: the scaling by the rank's
            share, the all-reduce, and any wait for the slower rank;
  alone     after the steps, a barrier, then average_gradients alone (median of 5): the transfer
            of the gradient bytes and the scaling, with no waiting.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import cpu_name, worker_env  # noqa: E402
from worker import TRAIN  # noqa: E402

CONFIGS = {row[0]: row for row in TRAIN}
# (ranks, threads per rank, rows of the global batch): the last is what one rank of 2 x 1
# computes, alone on the machine: the 2-rank step it would take without communication and
# without the two ranks slowing each other down (memory bandwidth, caches, neighbours)
RUNS = ((1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 2))
LABELS = {RUNS[0]: "1 rank x 1 thread", RUNS[1]: "1 rank x 2 threads",
          RUNS[2]: "2 ranks x 1 thread", RUNS[3]: "1 x 1, half batch"}
TARGETS = {"vs 1x1": 1.8, "vs 1x2": 0.95, "comm": 0.10}  # 2x1 vs 1x1, 2x1 vs 1x2, comm share


def worker(config, steps, warmup, divide):
    """Under mpiexec: time `steps` training steps after `warmup`; rank 0 prints one JSON line."""
    from time import perf_counter

    import pytfm
    from pytfm import data, distributed
    from pytfm.nn import GPT, GPTConfig
    from pytfm.optim import AdamW, clip_grad_norm

    world = distributed.init()
    _, d, L, H, T, B = CONFIGS[config]
    B //= divide
    model = GPT(GPTConfig(d_model=d, n_layer=L, n_head=H, max_seq=T, seed=0))
    opt = AdamW(model.params, model.grads, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    batches = data.Batches(data.stdlib_corpus(), T, B, seed=0)
    world.broadcast(model.params.buffer)
    step_s, comm_s, compute_s = [], [], []
    for s in range(warmup + steps):
        world.barrier()
        t0 = perf_counter()
        x, y, share = world.shard(*batches.batch("train", s))
        model.zero_grad()
        _, loss = model.forward(x, y)
        world.sum([float(loss) * share])
        model.backward()
        t1 = perf_counter()
        world.average_gradients(model.grads, share)
        t2 = perf_counter()
        clip_grad_norm(model.grads, 1.0)
        opt.step(1e-4)
        t3 = perf_counter()
        if s >= warmup:
            step_s.append(t3 - t0)
            comm_s.append(t2 - t1)
            compute_s.append(t1 - t0)
    alone = []
    for _ in range(5):
        world.barrier()
        t = perf_counter()
        world.average_gradients(model.grads, 1.0 / world.size)
        alone.append(perf_counter() - t)
    if world.root:
        print(json.dumps({"ranks": world.size, "threads": pytfm.get_num_threads(),
                          "step_s": statistics.median(step_s), "comm_s": statistics.median(comm_s),
                          "compute_s": statistics.median(compute_s),
                          "alone_s": statistics.median(alone), "tokens": B * T,
                          "params": model.num_params(), "grad_bytes": model.grads.buffer.nbytes}))


def find_mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


def run(mpiexec, config, ranks, threads, divide, steps, warmup):
    cmd = [mpiexec, "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--worker",
           "--config", config, "--steps", str(steps), "--warmup", str(warmup), "--divide",
           str(divide)]
    env = worker_env(threads, PYTFM_NUM_THREADS=threads)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def verdict(value, target, at_most=False):
    ok = value <= target if at_most else value >= target
    return f"{'ok' if ok else 'MISS'} (target {'<=' if at_most else '>='} {target:g})"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=sorted(CONFIGS), default="d384")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="timed steps per run (default 3)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--divide", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    if args.worker:
        return worker(args.config, args.steps, args.warmup, args.divide)
    mpiexec = find_mpiexec()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        sys.exit('bench/distributed.py needs mpi4py and mpiexec: pip install ".[mpi]"')

    _, d, L, H, T, B = CONFIGS[args.config]
    print(f"pytfm.distributed, {args.config}: d={d}, {L} layers, {H} heads, context {T}, global "
          f"batch {B} ({B * T} tokens a step); {cpu_name()}, {os.cpu_count()} CPUs; "
          f"{args.rounds} rounds x {args.steps} timed steps after {args.warmup}, interleaved")
    results = {run_: [] for run_ in RUNS}
    start = time.perf_counter()
    for i in range(args.rounds):
        for key in (RUNS if i % 2 == 0 else RUNS[::-1]):
            results[key].append(run(mpiexec, args.config, *key, args.steps, args.warmup))
    first = results[RUNS[0]][0]
    rate = {k: statistics.median(x["tokens"] / x["step_s"] for x in v)
            for k, v in results.items()}
    print(f"{first['params']:,} parameters, {first['grad_bytes'] / 1e6:.1f} MB of gradients; "
          f"{time.perf_counter() - start:.0f} s")
    print(f"{'run':20s} {'tokens/s':>9s} {'step ms':>8s} {'fwd+bwd':>8s}   tokens/s per round")
    for key, v in results.items():
        per = ", ".join(f"{x['tokens'] / x['step_s']:.0f}" for x in v)
        step = statistics.median(x["step_s"] for x in v) * 1e3
        compute = statistics.median(x["compute_s"] for x in v) * 1e3
        print(f"{LABELS[key]:20s} {rate[key]:9.0f} {step:8.0f} {compute:8.0f}   {per}")
    two, half = results[RUNS[2]], results[RUNS[3]]
    step = statistics.median(x["step_s"] for x in two)
    comm = statistics.median(x["comm_s"] for x in two)
    alone = statistics.median(x["alone_s"] for x in two)
    r11, r12 = rate[RUNS[2]] / rate[RUNS[0]], rate[RUNS[2]] / rate[RUNS[1]]
    print(f"2x1 / 1x1 = {r11:.2f}  {verdict(r11, TARGETS['vs 1x1'])}")
    print(f"2x1 / 1x2 = {r12:.2f}  {verdict(r12, TARGETS['vs 1x2'])}")
    print(f"communication at 2 ranks: {comm * 1e3:.1f} ms of a {step * 1e3:.0f} ms step in the "
          f"step = {comm / step:.1%}  {verdict(comm / step, TARGETS['comm'], at_most=True)}; "
          f"alone {alone * 1e3:.1f} ms for {first['grad_bytes'] / 1e6:.1f} MB "
          f"({first['grad_bytes'] / alone / 1e9:.1f} GB/s)")
    mine = statistics.median(x["compute_s"] for x in two)
    alone_half = statistics.median(x["compute_s"] for x in half)
    print(f"a rank's forward + backward: {mine * 1e3:.0f} ms at 2 ranks, {alone_half * 1e3:.0f} ms "
          f"for the same rows alone ({mine / alone_half - 1:+.0%}: what running beside the other "
          "rank costs, apart from communication)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "cpu": cpu_name(),
                       "runs": {LABELS[k]: v for k, v in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
