"""pytfm's CPU benchmarks in one command: a table of ratios, each measured side by side.

    python -m bench                       # (or python bench/run.py) every group, 1 and 2 threads
    python -m bench --groups sgemm ew --threads 1 --rounds 5 --json results.json

Groups and what each ratio is (> 1: pytfm is faster):
  sgemm      C = op(A)·op(B) into a preallocated C: pytfm_sgemm vs `np.matmul(a, b, out=c)`
             (OpenBLAS), square n = 128 ... 2048 and the three products of each linear layer of
             the two training configs below; figures in GFLOP/s.
  ew         each element-wise kernel's GB/s (the bytes it must read and write, over its time,
             16 MiB arrays) against NumPy copying the same number of bytes (`np.copyto`).
  attention  pytfm's attention vs torch's fused scaled_dot_product_attention, B=4, H=8, D=64,
             T=1024, causal; forward and forward+backward.
  train      one training step (forward, backward, gradient clipping, AdamW) of pytfm's GPT vs
             its PyTorch twin (tests/torch_twin.py, same weights and maths), in tokens/s: the
             train_tiny.py default (d=128, 4 layers, 4 heads, 8x128 tokens) and a 6-layer d=384
             GPT (6 heads, 8x256 tokens).
  bf16       the BF16 products (pytfm's precision "bf16") beside pytfm's FP32 ones and
             torch.autocast("cpu", torch.bfloat16), each library in its own process: SGEMM at
             n = 256 ... 2048 and the linear layers' products (GFLOP/s), the training step of
             both configs (tokens/s), decoding a token from C (bench/c_decode.c, the model
             API in BF16 and FP32) against torch's twin under autocast, at train_tiny's config
             and GPT-2-124M's shape (tokens/s). Its table names the BF16 path that ran.
  breakdown  pytfm alone (no peer): where the time of those two training steps goes, per C
             kernel (op direction: pytfm_linear_forward, pytfm_adamw_step, ...): its calls, ms
             and share of a step, then the time outside the kernels, split into pytfm.ops's
             own (checks, outputs), nn.py's and optim.py's np.* calls and the rest (Python,
             NumPy operators), and the total; target: outside <= 10 % of the tiny
             step. Each plain step is paired with an instrumented one, in which every pytfm
             module's reference to the cffi library is a proxy adding each C call's wall time
             to its function's total (no kernel is named in bench/: new ones show up), and the
             ops functions and nn's and optim's NumPy are wrapped likewise. Shares are taken
             within each instrumented step, less the wrappers' calibrated cost (~1 us a call):
             on a busy machine two steps differ by more than the whole outside time. The step
             time printed is the plain steps'; the instrumented ones' excess over their pairs
             is printed as the overhead (bench/breakdown.py has the details).
Every library runs in a process of its own (bench/worker.py) at the given thread count, so no
two thread pools share a process; processes are interleaved over --rounds rounds (the order
alternates) and each figure is the median over rounds of a per-round median. torch's parts are
skipped, and say so, where torch is not installed. Targets are marked ok / MISS.
"""

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import breakdown  # noqa: E402  (the breakdown group's tables)
import worker  # noqa: E402  (the sizes and the bytes each op moves)
from common import cpu_name, worker_env  # noqa: E402

GROUPS = worker.GROUPS
NORMED = ("layernorm", "softmax", "gelu", "cross_entropy")  # element-wise ops with a target
PEER = {"sgemm": "numpy", "linear": "numpy", "ew": "numpy", "attention": "torch", "train": "torch"}


BF16_TARGETS = {  # case prefix -> (against pytfm's FP32, against torch's bf16 autocast)
    "bf16/sgemm 1024": (1.7, None),
    "bf16/train d384": (1.4, 1.3),
    "bf16/decode tiny": (1.6, None),
    "bf16/decode gpt2": (1.6, None),
}
GPT2 = dict(vocab=50257, d_model=768, n_layer=12, n_head=12, max_seq=160)  # GPT-2-124M's shape


def bf16_setup(folder):
    """The bf16 group's decode rows: the C program (bench/c_decode.c) and a checkpoint of
    train_tiny's config and of GPT-2-124M's shape (random weights: speed does not depend on
    them), as the environment variables the workers read"""
    from bench.c_generate import build_driver
    from pytfm import checkpoint
    from pytfm.nn import GPT, GPTConfig

    paths = {}
    for name, cfg in (("tiny", GPTConfig()), ("gpt2", GPTConfig(**GPT2))):
        paths[name] = os.path.join(folder, f"{name}.safetensors")
        checkpoint.save(paths[name], GPT(cfg))
    return {"PYTFM_BENCH_DECODE": json.dumps(paths), "PYTFM_BENCH_C_DECODE": build_driver(folder)}


def run_worker(lib, threads, groups, extra_env=None):
    # OpenBLAS only computes in the numpy process; elsewhere its threads would only compete
    env = worker_env(threads, OPENBLAS_NUM_THREADS=threads if lib == "numpy" else 1,
                     **(extra_env or {}))
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "worker.py"), lib, str(threads), *groups],
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode:
        sys.exit(f"bench worker {lib} ({threads} threads) failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def target(case, threads):
    """The target ratio for a case at a thread count, or None."""
    group, name = case.split("/", 1)
    if group == "sgemm":  # 0.9 at n = 256 ... 2048 on 1 and 2 threads
        n = int(name)
        return None if n < 256 or threads not in (1, 2) else 0.9
    if group == "linear":  # every model product
        return 0.85 if threads in (1, 2) else None
    if group == "ew":  # on one thread
        return 0.7 if name.split()[0] in NORMED and threads == 1 else None
    if threads != 2:
        return None
    if case == "attention/fwd+bwd":
        return 1.0
    if group == "train":
        return 1.5 if name.startswith("tiny") else 1.0
    return None


def describe(case, t_pytfm, t_peer):
    """(pytfm figure, peer figure, unit) for the table."""
    group, name = case.split("/", 1)
    if group == "sgemm":
        flops = 2 * int(name) ** 3
        return flops / t_pytfm / 1e9, flops / t_peer / 1e9, "GFLOP/s"
    if group == "linear":
        rows, rest = name.split()[1].split("x")
        i, o = map(int, rest.split("->"))
        flops = 2 * int(rows) * i * o
        return flops / t_pytfm / 1e9, flops / t_peer / 1e9, "GFLOP/s"
    if group == "ew":
        nbytes = worker.EW_BYTES[name]
        return nbytes / t_pytfm / 1e9, nbytes / t_peer / 1e9, "GB/s"
    if group == "train":
        b, t = re.search(r"\((\d+)x(\d+) tokens\)", name).groups()
        tokens = int(b) * int(t)
        return tokens / t_pytfm, tokens / t_peer, "tokens/s"
    return t_pytfm * 1e3, t_peer * 1e3, "ms"


def show_ratios(rows):
    """The ratio table: one row per case and thread count."""
    head = f"{'case':44s} {'thr':>3s} {'pytfm':>9s} {'peer':>9s} {'unit':8s} {'ratio':>6s}"
    head += f" {'target':>7s}"
    print(head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["case"].split("/")[0], r["threads"], r["case"])):
        if "ratio" not in r:
            print(
                f"{r['case']:44s} {r['threads']:3d} {r['pytfm_s'] * 1e3:8.2f}ms  (no {r['peer']})"
            )
            continue
        mark = "" if r["target"] is None else f"{r['target']:.2f} {'ok' if r['ok'] else 'MISS'}"
        print(
            f"{r['case']:44s} {r['threads']:3d} {r['pytfm']:9.1f} {r['peer_figure']:9.1f} "
            f"{r['unit']:8s} {r['ratio']:6.2f} {mark}"
        )


def bf16_rows(times, threads_list):
    """The bf16 group's rows: pytfm in BF16 beside pytfm in FP32 and torch under autocast"""
    rows = []
    for (threads, lib, case), ts in sorted(times.items()):
        if lib != "pytfm" or not case.startswith("bf16/") or case.endswith(" [fp32]"):
            continue
        t16, t32 = statistics.median(ts), statistics.median(times[(threads, lib, case + " [fp32]")])
        tt = times.get((threads, "torch", case))
        tt = statistics.median(tt) if tt else None
        name = case.split("/", 1)[1]
        if name.startswith(("sgemm", "linear")):
            size = name.split()[1] if name.startswith("sgemm") else name.split()[2]
            if name.startswith("sgemm"):
                work, unit = 2 * int(size) ** 3 / 1e9, "GFLOP/s"
            else:
                r, rest = size.split("x")
                i, o = map(int, rest.split("->"))
                work, unit = 2 * int(r) * i * o / 1e9, "GFLOP/s"
        elif name.startswith("train"):
            b, t = re.search(r"\((\d+)x(\d+) tokens\)", name).groups()
            work, unit = int(b) * int(t), "tokens/s"
        else:
            work, unit = 1, "tokens/s"
        goal = next((g for prefix, g in BF16_TARGETS.items() if case.startswith(prefix)),
                    (None, None))
        row = {"case": case, "threads": threads, "unit": unit, "bf16_s": t16, "fp32_s": t32,
               "torch_s": tt, "bf16": work / t16, "fp32": work / t32,
               "torch": work / tt if tt else None, "vs_fp32": t32 / t16,
               "vs_torch": tt / t16 if tt else None, "target_fp32": goal[0],
               "target_torch": goal[1]}
        rows.append(row)
    return rows


def show_bf16(rows, path):
    print(f"\nBF16 products: {path}; x = figure ratio (> 1: pytfm bf16 faster)")
    head = (f"{'case':44s} {'thr':>3s} {'bf16':>8s} {'fp32':>8s} {'torch':>8s} {'unit':8s} "
            f"{'x fp32':>6s} {'x torch':>7s}  targets")
    print(head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["threads"], r["case"])):
        torch_fig = f"{r['torch']:8.1f}" if r["torch"] else f"{'-':>8s}"
        vs_torch = f"{r['vs_torch']:7.2f}" if r["vs_torch"] else f"{'-':>7s}"
        marks = []
        for key, goal in (("vs_fp32", r["target_fp32"]), ("vs_torch", r["target_torch"])):
            if goal and r[key] is not None:
                marks.append(f"{key[3:]} {goal:.1f} {'ok' if r[key] >= goal else 'MISS'}")
        print(f"{r['case'][5:]:44s} {r['threads']:3d} {r['bf16']:8.1f} {r['fp32']:8.1f} "
              f"{torch_fig} {r['unit']:8s} {r['vs_fp32']:6.2f} {vs_torch}  {', '.join(marks)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", nargs="+", choices=sorted(GROUPS), default=sorted(GROUPS))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", metavar="PATH", help="also write every figure to PATH as JSON")
    args = ap.parse_args(argv)

    have_torch = importlib.util.find_spec("torch") is not None
    libs = ["pytfm", "numpy"] + (["torch"] if have_torch else [])
    times = {}  # (threads, lib, case) -> [seconds per round]
    bf16_path = None
    with tempfile.TemporaryDirectory() as tmp:
        env = bf16_setup(tmp) if "bf16" in args.groups else {}
        t0, load = time.time(), [os.getloadavg()[0]]  # others' work skews every figure
        for rnd in range(args.rounds):
            for threads in args.threads:
                order = libs if rnd % 2 == 0 else libs[::-1]
                for lib in order:
                    groups = [g for g in args.groups if lib in GROUPS[g]]
                    if not groups:
                        continue
                    for case, t in run_worker(lib, threads, groups, env).items():
                        if case == "bf16/path":
                            bf16_path = t
                            continue
                        times.setdefault((threads, lib, case), []).append(t)
            print(f"round {rnd + 1}/{args.rounds} done ({time.time() - t0:.0f} s)",
                  file=sys.stderr)

    load.append(os.getloadavg()[0])
    rows = []
    for (threads, lib, case), ts in sorted(times.items()):
        if lib != "pytfm" or case.startswith(("breakdown/", "bf16/")):
            continue
        peer = PEER[case.split("/")[0]]
        peer_ts = times.get((threads, peer, case))
        t_p = statistics.median(ts)
        row = {"case": case, "threads": threads, "peer": peer, "pytfm_s": t_p}
        if peer_ts:
            t_q = statistics.median(peer_ts)
            fp, fq, unit = describe(case, t_p, t_q)
            tgt = target(case, threads)
            row.update(
                peer_s=t_q,
                pytfm=fp,
                peer_figure=fq,
                unit=unit,
                ratio=t_q / t_p,
                target=tgt,
                ok=None if tgt is None else t_q / t_p >= tgt,
            )
        rows.append(row)

    print(
        f"pytfm benchmarks: {cpu_name()}, "
        f"{os.cpu_count()} CPUs (load average {load[0]:.1f} before, {load[1]:.1f} after), "
        f"{args.rounds} rounds, medians; ratio = peer time / pytfm time"
    )
    if not have_torch and {"attention", "train"} & set(args.groups):
        print(
            "torch is not installed: attention and training comparisons skipped "
            "(pip install torch==2.13.0)"
        )
    if rows:
        show_ratios(rows)
    bf16 = bf16_rows(times, args.threads) if "bf16" in args.groups else []
    if bf16:
        show_bf16(bf16, bf16_path)
    steps = breakdown.tables(times, worker.TRAIN)
    breakdown.show(steps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "rounds": args.rounds,
                    "threads": args.threads,
                    "torch": have_torch,
                    "load_average": load,
                    "rows": rows,
                    "bf16": {"path": bf16_path, "rows": bf16},
                    "breakdown": steps,
                    "raw": [
                        {"threads": t, "lib": lib, "case": c, "seconds": ts}
                        for (t, lib, c), ts in sorted(times.items())
                    ],
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
