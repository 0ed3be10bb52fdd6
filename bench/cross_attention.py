"""Cross-attention with padding masks: pytfm's padded attention against torch's fused SDPA.

    python bench/cross_attention.py                   # B=32, Tq=48, Tk=64, H=8, D=64, 2 threads
    python bench/cross_attention.py --repeat 7 --threads 1 --json out.json

The encoder-decoder's two attentions with padded batches: "cross" (Tq decoder queries on Tk
encoder keys, no causal mask) and "dec-self" (Tq on Tq, causal). Lengths are drawn once per
run (--seed) in [T/2, T]. torch gets the equivalent boolean attn_mask [B, 1, Tq, Tk] (True:
attend), built from the key lengths (and causal, top-left); pytfm runs twice: with k_lens only
(the same maths as that mask, every query row computed) and with q_lens too (padded query
rows skipped: zeros, no gradient; what the model passes). Each (library, case) runs in its
own process at --threads threads (bench/common.py's worker_env), rounds interleaved, medians
of --repeat rounds, each round the best of --inner calls; the machine's load average is
printed before and after the rounds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_name, worker_env  # noqa: E402

WORKER = r"""
import json, sys, time
import numpy as np
lib, B, Tq, Tk, H, D, causal, inner, threads = sys.argv[1], *map(int, sys.argv[2:10])
q_lens, k_lens = (np.array(json.loads(a), np.int64) for a in sys.argv[10:12])
rng = np.random.default_rng(0)
q, dy = (rng.standard_normal((B, Tq, H, D), dtype=np.float32) for _ in range(2))
k, v = (rng.standard_normal((B, Tk, H, D), dtype=np.float32) for _ in range(2))
causal = bool(causal)
if lib.startswith("pytfm"):
    from pytfm import ops
    lens = dict(k_lens=k_lens, q_lens=q_lens if lib == "pytfm-qk" else None)
    def fwd():
        return ops.attention_forward(q, k, v, causal, **lens)
    def fwd_bwd():
        o, lse = ops.attention_forward(q, k, v, causal, **lens)
        return ops.attention_backward(dy, q, k, v, o, lse, causal, **lens)
else:
    import torch
    torch.set_num_threads(threads)
    seen = np.arange(Tk)[None, None, :] < k_lens[:, None, None]  # [B, 1, Tk]
    if causal:
        seen = seen & np.tril(np.ones((Tq, Tk), bool))[None]
    mask = torch.from_numpy(np.ascontiguousarray(np.broadcast_to(seen, (B, Tq, Tk))[:, None]))
    tq, tk, tv, tdy = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v, dy))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    def fwd():
        with torch.no_grad():
            return sdpa(tq, tk, tv, attn_mask=mask)
    def fwd_bwd():
        a, b, c = (t.detach().requires_grad_() for t in (tq, tk, tv))
        sdpa(a, b, c, attn_mask=mask).backward(tdy)
        return a.grad, b.grad, c.grad
fwd_bwd()  # warm up: thread pools, first-touch pages
times = {}
for name, f in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
    ts = []
    for _ in range(inner):
        t0 = time.perf_counter(); r = f(); ts.append(time.perf_counter() - t0); del r
    times[name] = min(ts)
print(json.dumps(times))
"""

LIBS = ("pytfm-k", "pytfm-qk", "torch")


def have_torch():
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    return r.returncode == 0


def run(lib, case, args, lens):
    Tq, Tk, causal = case
    env = worker_env(args.threads, OPENBLAS_NUM_THREADS=args.threads,
                     MKL_NUM_THREADS=args.threads)
    argv = [sys.executable, "-c", WORKER, lib, *map(str, (args.B, Tq, Tk, args.H, args.D,
                                                          int(causal), args.inner,
                                                          args.threads)),
            json.dumps(lens[0]), json.dumps(lens[1])]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/")
    if r.returncode:
        raise RuntimeError(f"{lib} {case} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def load():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=32)
    ap.add_argument("--Tq", type=int, default=48)
    ap.add_argument("--Tk", type=int, default=64)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--inner", type=int, default=5, help="calls per round (the best counts)")
    ap.add_argument("--seed", type=int, default=0, help="of the drawn lengths")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    draw = lambda T: [int(x) for x in rng.integers(T // 2, T + 1, args.B)]  # noqa: E731
    q_lens, k_lens, t_lens = draw(args.Tq), draw(args.Tk), draw(args.Tq)
    cases = {"cross": ((args.Tq, args.Tk, False), (q_lens, k_lens)),
             "dec-self": ((args.Tq, args.Tq, True), (t_lens, t_lens))}
    libs = [lib for lib in LIBS if lib != "torch" or have_torch()]
    print(f"{cpu_name()}; load average {load()} before", file=sys.stderr)
    loads = [load()]
    results = {}
    for rnd in range(args.repeat):
        for name, (case, lens) in cases.items():
            for lib in libs:
                results.setdefault((lib, name), []).append(run(lib, case, args, lens))
        loads.append(load())
        print(f"round {rnd + 1}/{args.repeat} done, load average {loads[-1]}", file=sys.stderr)

    def ms(lib, name, key):
        return statistics.median(r[key] for r in results[(lib, name)]) * 1e3

    print(f"\npadded attention, B={args.B} H={args.H} D={args.D}, float32, {args.threads} "
          f"threads, {cpu_name()}; median of {args.repeat} rounds (best of {args.inner} each), "
          f"ms\nlengths drawn in [T/2, T] (seed {args.seed}): mean q_len "
          f"{np.mean(q_lens):.1f}/{args.Tq}, k_len {np.mean(k_lens):.1f}/{args.Tk}; dec-self "
          f"{np.mean(t_lens):.1f}/{args.Tq}\nload average (1, 5, 15 min) before: {loads[0]}, "
          f"after the last round: {loads[-1]}\n")
    head = f"{'case':>8} {'Tq':>3} {'Tk':>3} |"
    for lib in libs:
        head += f" {lib + ' fwd':>13} {'f+b':>7} |"
    if "torch" in libs:
        head += f" {'torch/pytfm-k fwd':>17} {'f+b':>5} | {'torch/pytfm-qk fwd':>18} {'f+b':>5}"
    print(head)
    print("-" * len(head))
    rows = []
    for name, ((Tq, Tk, _), _) in cases.items():
        line = f"{name:>8} {Tq:3d} {Tk:3d} |"
        row = {"case": name, "Tq": Tq, "Tk": Tk}
        for lib in libs:
            f, fb = ms(lib, name, "fwd"), ms(lib, name, "fwd_bwd")
            row[lib] = {"fwd_ms": f, "fwd_bwd_ms": fb}
            line += f" {f:13.2f} {fb:7.2f} |"
        if "torch" in libs:
            for lib, w in (("pytfm-k", 17), ("pytfm-qk", 18)):
                r_f = ms("torch", name, "fwd") / ms(lib, name, "fwd")
                r_fb = ms("torch", name, "fwd_bwd") / ms(lib, name, "fwd_bwd")
                row[f"torch_over_{lib}"] = {"fwd": r_f, "fwd_bwd": r_fb}
                line += f" {r_f:{w}.2f} {r_fb:5.2f}" + (" |" if lib == "pytfm-k" else "")
        rows.append(row)
        print(line)
    print("torch/pytfm > 1 means pytfm is faster.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "cpu": cpu_name(), "loads": loads, "rows": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()
