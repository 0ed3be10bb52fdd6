"""Attention benchmark: pytfm's flash-style CPU kernel vs naive NumPy and PyTorch's fused SDPA.

    python bench/attention.py                     # B=4, H=8, D=64, causal, T = 256 ... 4096
    python bench/attention.py --T 256 1024 --repeat 5 --json out.json

Each (library, T) runs in its own process, so no two thread pools share one (pytfm's OpenMP,
OpenBLAS, torch's), each at --threads threads; runs are interleaved over --repeat rounds and
the table shows medians. "extra MB" is the growth of the process's peak RSS during the first
forward+backward after the inputs exist: outputs (o, lse, dq, dk, dv: the "outputs MB" column)
plus any scratch. torch is skipped when it is not importable; naive NumPy stops at --naive-max-T
(its [B, H, T, T] matrices grew the process by 1.6 GB at T=2048, so about 6.4 GB at 4096).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import worker_env  # noqa: E402

B, H, D = 4, 8, 64

WORKER = r"""
import json, sys, time
import numpy as np
lib, T, B, H, D, inner = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:7])

def peak_kib():  # the process's peak resident set (VmHWM), in KiB
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))

def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))

rng = np.random.default_rng(0)
q, k, v, dy = (rng.standard_normal((B, T, H, D), dtype=np.float32) for _ in range(4))
scale = 1.0 / np.sqrt(D)

if lib in ("pytfm", "torch"):
    if lib == "torch":
        import torch
        torch.set_num_threads(int(sys.argv[7]))
    from bench.common import attention_calls  # the checkout's root is on PYTHONPATH
    fwd, fwd_bwd = attention_calls(lib, q, k, v, dy)
elif lib == "numpy":  # the textbook version: materialise S and P, [B, H, T, T]
    qh, kh, vh, dyh = (np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in (q, k, v, dy))
    mask = np.triu(np.ones((T, T), bool), 1)
    def forward():
        S = qh @ kh.transpose(0, 1, 3, 2) * np.float32(scale)
        S[..., mask] = -np.inf
        P = np.exp(S - S.max(axis=-1, keepdims=True))
        P /= P.sum(axis=-1, keepdims=True)
        return P @ vh, P
    def fwd():
        return forward()[0]
    def fwd_bwd():
        o, P = forward()
        dv = P.transpose(0, 1, 3, 2) @ dyh
        dP = dyh @ vh.transpose(0, 1, 3, 2)
        dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True)) * np.float32(scale)
        return dS @ kh, dS.transpose(0, 1, 3, 2) @ qh, dv

before = rss_kib()
out = fwd_bwd()  # the first run: its peak is the memory figure
extra_kib = peak_kib() - before
del out
times = {}
for name, f in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
    ts = []
    for _ in range(inner):
        t0 = time.perf_counter(); r = f(); ts.append(time.perf_counter() - t0); del r
    times[name] = min(ts)
print(json.dumps(dict(times, extra_mb=extra_kib / 1024)))
"""


def have_torch():
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    return r.returncode == 0


def run(lib, T, threads, inner):
    env = worker_env(threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    args = [sys.executable, "-c", WORKER, lib, str(T), str(B), str(H), str(D), str(inner),
            str(threads)]
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd="/")
    if r.returncode:
        raise RuntimeError(f"{lib} T={T} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (median)")
    ap.add_argument("--naive-max-T", type=int, default=2048)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    libs = ["pytfm", "numpy"] + (["torch"] if have_torch() else [])
    results = {}  # (lib, T) -> list of runs
    for rnd in range(args.repeat):
        for T in args.T:
            for lib in libs:
                if lib == "numpy" and T > args.naive_max_T:
                    continue
                inner = 3 if T <= 1024 else 1
                results.setdefault((lib, T), []).append(run(lib, T, args.threads, inner))
                print(f"round {rnd + 1}/{args.repeat} T={T} {lib} done", file=sys.stderr)

    def med(lib, T, key):
        runs = results.get((lib, T))
        return statistics.median(r[key] for r in runs) if runs else None

    def cell(x, fmt):  # fmt like "9.1f": a missing value keeps the column's width
        return format("-", ">" + fmt.split(".")[0]) if x is None else format(x, fmt)

    out_mb = lambda T: (4 * B * T * H * D * 4 + B * H * T * 4) / 2**20  # noqa: E731
    print(f"\nattention, causal, B={B} H={H} D={D}, float32, {args.threads} threads, median of "
          f"{args.repeat}; times in ms; extra = peak RSS growth in MB (outputs included)\n")
    head = f"{'T':>5} {'outputs MB':>10} | {'pytfm fwd':>9} {'f+b':>8} {'extra':>7} |"
    head += f" {'numpy fwd':>9} {'f+b':>8} {'extra':>7} |"
    if "torch" in libs:
        head += f" {'torch fwd':>9} {'f+b':>8} {'extra':>7} | {'torch/pytfm fwd':>15} {'f+b':>6}"
    print(head)
    print("-" * len(head))
    rows = []
    for T in args.T:
        row = {"T": T, "outputs_mb": out_mb(T)}
        line = f"{T:5d} {out_mb(T):10.1f} |"
        for lib in libs:
            f, fb, mem = (med(lib, T, key) for key in ("fwd", "fwd_bwd", "extra_mb"))
            row[lib] = {"fwd_ms": f and f * 1e3, "fwd_bwd_ms": fb and fb * 1e3, "extra_mb": mem}
            ms_f, ms_fb = f and f * 1e3, fb and fb * 1e3
            line += f" {cell(ms_f, '9.1f')} {cell(ms_fb, '8.1f')} {cell(mem, '7.1f')} |"
        if "torch" in libs:
            r_f = med("torch", T, "fwd") / med("pytfm", T, "fwd")
            r_fb = med("torch", T, "fwd_bwd") / med("pytfm", T, "fwd_bwd")
            row["torch_over_pytfm"] = {"fwd": r_f, "fwd_bwd": r_fb}
            line += f" {r_f:15.2f} {r_fb:6.2f}"
        rows.append(row)
        print(line)
    base = [r for r in rows if r["T"] == 1024]
    if base:
        print("\npytfm extra memory relative to T=1024: " + ", ".join(
            f"T={r['T']}: {r['pytfm']['extra_mb'] / base[0]['pytfm']['extra_mb']:.2f}x"
            for r in rows))
    print("torch/pytfm > 1 means pytfm is faster.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"B": B, "H": H, "D": D, "threads": args.threads, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
