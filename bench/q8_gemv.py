"""The one-row product on 8-bit weights (pytfm_linear_forward_q8w: a decoded token's linear
layer) against a plain read of the same bytes and against the FP32 and BF16 one-row products of
the same matrix, on the weight shapes of GPT-2 124M and Qwen3-0.6B, 1 and 2 threads.

Each ISA path (PYTFM_MAX_ISA) and thread count runs in a process of its own; in it the
products are timed in interleaved rounds and the figures are medians. GB/s is the bytes each
product must read (q + scales for int8, 4·in·out for FP32, 2·in·out for BF16 weights) over its
time; `read` is numpy summing the int8 product's bytes (as uint64 words), the rate a plain pass
over them gets; the last columns are the FP32 and BF16-weights times over the int8 one.

    python bench/q8_gemv.py [--isas avx512_bf16,avx512,avx2,plain] [--threads 1,2]
                            [--rounds 15] [--shapes gpt2,qwen3]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import cpu_name, worker_env  # noqa: E402

SHAPES = {  # (out, in) of each model's linear layers, the tied head last
    "gpt2": [(2304, 768), (3072, 768), (768, 3072), (50257, 768)],
    "qwen3": [(3072, 1024), (1024, 3072), (151936, 1024)],
}


def time_shape(ops, rng, out, inn, rounds):
    """medians of each product on a W [out, in] and one row of x, interleaved over rounds"""
    w = (rng.standard_normal((out, inn), dtype=np.float32) * 0.02).astype(np.float32)
    x = rng.standard_normal((1, inn), dtype=np.float32)
    q, s = ops.quantize_q8(w)
    w16 = ops.to_bf16_bits(w)
    words = np.concatenate([q.reshape(-1).view(np.uint8), s.reshape(-1).view(np.uint8)])
    words = words[: words.size // 8 * 8].view(np.uint64)
    calls = {
        "int8": lambda: ops.linear_forward_q8w(x, q, s),
        "read": lambda: words.sum(),
        "fp32": lambda: ops.linear_forward(x, w),
        "bf16w": lambda: ops.linear_forward_bf16w(x, w16),
    }
    times = {k: [] for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return dict(out=out, inn=inn, q8_bytes=q.nbytes + s.nbytes, **med)


def worker(shapes, rounds):
    import pytfm
    from pytfm import ops

    rng = np.random.default_rng(0)
    rows = [time_shape(ops, rng, out, inn, rounds) for out, inn in shapes]
    print(json.dumps(dict(isa=pytfm.get_isa(), rows=rows)))


def load():
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read().split("\n\n")[0]
    except OSError:
        return "?", "?"
    fields = {k.strip(): v.strip() for k, v in
              (line.split(":", 1) for line in info.splitlines() if ":" in line)}
    family = f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    flags = fields.get("flags", "").split()
    keep = [f for f in flags if f.startswith(("avx", "f16c", "fma")) or "vnni" in f]
    return family, " ".join(keep)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--isas", default="avx512_bf16,avx512,avx2,plain")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--shapes", default="gpt2,qwen3")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    shapes = [s for name in args.shapes.split(",") for s in SHAPES[name]]
    if args.worker:
        return worker(shapes, args.rounds)
    family, flags = cpu_flags()
    print(f"CPU: {cpu_name()} ({family}); flags: {flags}")
    print(f"load average before: {load()}")
    print(f"{'path':<12} {'thr':>3} {'W [out, in]':>14} {'int8 us':>9} {'int8 GB/s':>9} "
          f"{'read GB/s':>9} {'fp32 GB/s':>9} {'bf16w GB/s':>10} {'fp32/int8':>9} "
          f"{'bf16w/int8':>10}")
    for isa in args.isas.split(","):
        for threads in map(int, args.threads.split(",")):
            env = worker_env(threads, PYTFM_MAX_ISA=isa, PYTFM_NUM_THREADS=threads)
            res = subprocess.run([sys.executable, __file__, "--worker", "--rounds",
                                  str(args.rounds), "--shapes", args.shapes], env=env,
                                 capture_output=True, text=True, check=True)
            for r in json.loads(res.stdout.strip().splitlines()[-1])["rows"]:
                n = r["out"] * r["inn"]
                gb = lambda b, t: b / t / 1e9  # noqa: E731
                print(f"{isa:<12} {threads:>3} {r['out']:>7}x{r['inn']:<6} "
                      f"{1e6 * r['int8']:>9.1f} {gb(r['q8_bytes'], r['int8']):>9.1f} "
                      f"{gb(r['q8_bytes'], r['read']):>9.1f} {gb(4 * n, r['fp32']):>9.1f} "
                      f"{gb(2 * n, r['bf16w']):>10.1f} {r['fp32'] / r['int8']:>9.2f} "
                      f"{r['bf16w'] / r['int8']:>10.2f}")
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
