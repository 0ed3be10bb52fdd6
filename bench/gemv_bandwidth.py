"""The one-row products (a decoded token's linear layers) against a plain read of the same bytes,
on every instruction-set path, in one run.

    python bench/gemv_bandwidth.py                        # every path, 1 and 2 threads, 3 rounds
    python bench/gemv_bandwidth.py --isas avx2 portable --threads 1 --rounds 5
    python bench/gemv_bandwidth.py --shapes gpt2 --decode  # and decoding's FP32 / BF16 per path

What it measures, per weight matrix W [out, in] of a decode (GPT-2-124M: 768x2304, 768x3072,
3072x768, the LM head 50257x768; Qwen3-0.6B: 1024x2048, 1024x3072, 3072x1024, the LM head
151936x1024; written in x W's `in`x`out`), the GB/s of W's bytes each product reads:
  fp32       ops.linear_forward(x[1, in], W)                      4 bytes a weight
  bf16       ops.linear_forward(..., precision="bf16")            4 bytes (rounded as read)
  bf16w      ops.linear_forward_bf16w(x, W's BF16 bits)            2 bytes
  q8w        ops.linear_forward_q8w, where pytfm has it            its own bytes
  read       a plain read of the bf16w product's bytes (NumPy's maximum of the same buffer as
             int32, each thread its share: of NumPy's reductions the fastest read here, 32 GB/s
             on one Zen 5 core from memory, where its float32 sum made 9): the rate that
             bounds the products
and, with --decode, tokens/s of bench/c_decode.c --generate on a random GPT-2-124M-shaped
folder in FP32 and BF16 (the target: BF16 faster than FP32 on every path).
Each (path, threads) runs in a process of its own (PYTFM_MAX_ISA: avx512_bf16 is the
AVX512-BF16 kernels, avx512 AVX-512 without them, avx2, portable: the baseline target), the
processes interleaved over rounds (the order reversed every other round); each figure is the
median over rounds of a process's median. The header prints the CPU (model, family, the flags
that choose a path) and the load average: the machine's other work skews every figure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from common import ROOT, cpu_name, worker_env  # noqa: E402

SHAPES = {
    "gpt2": [(768, 2304), (768, 3072), (3072, 768), (768, 50257)],
    "qwen3": [(1024, 2048), (1024, 3072), (3072, 1024), (1024, 151936)],
}
ISAS = ["avx512_bf16", "avx512", "avx2", "portable"]
KINDS = ["fp32", "bf16", "bf16w", "q8w", "read"]
FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx_vnni")

# one process: every shape and kind at one (ISA, threads); prints {"in x out kind": GB/s}
WORKER = r"""
import json, statistics, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import pytfm
from pytfm import ops
shapes, threads, seconds = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
pytfm.set_num_threads(threads)
pool = ThreadPoolExecutor(threads)

def timed(f, nbytes):
    f()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9

def read(buf):  # each thread the maximum of its share of buf's bytes, as int32
    parts = np.array_split(buf.view(np.int32), threads)
    return lambda: list(pool.map(np.maximum.reduce, parts))

out = {}
rng = np.random.default_rng(0)
for inn, n in shapes:
    w = rng.standard_normal((n, inn), dtype=np.float32) * 0.02
    x = rng.standard_normal((1, inn), dtype=np.float32)
    w16 = ops.to_bf16_bits(w)
    key = f"{inn}x{n}"
    out[key + " fp32"] = timed(lambda: ops.linear_forward(x, w), w.nbytes)
    out[key + " bf16"] = timed(lambda: ops.linear_forward(x, w, precision="bf16"), w.nbytes)
    out[key + " bf16w"] = timed(lambda: ops.linear_forward_bf16w(x, w16), w16.nbytes)
    out[key + " read"] = timed(read(w16), w16.nbytes)
    if hasattr(ops, "linear_forward_q8w"):  # int8 weights and their fp16 scales
        q, scales = ops.quantize_q8(w)
        out[key + " q8w"] = timed(lambda: ops.linear_forward_q8w(x, q, scales),
                                  q.nbytes + scales.nbytes)
    del w, w16
print(json.dumps(out))
"""


def cpu_line():
    """The CPU's model, family and model numbers, and which of FLAGS it has."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = (s.strip() for s in line.split(":", 1))
                    info.setdefault(k, v)
    except OSError:
        pass
    flags = set(info.get("flags", "").split())
    return (f"{cpu_name()}, {os.cpu_count()} CPUs, family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}; flags: {' '.join(f for f in FLAGS if f in flags)}")


def run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode:
        sys.exit(f"bench/gemv_bandwidth.py: {' '.join(cmd[:3])} failed:\n{r.stderr[-3000:]}")
    return r.stdout


def measure(isa, threads, shapes, seconds):
    env = worker_env(threads, PYTFM_MAX_ISA=isa, PYTFM_NUM_THREADS=threads,
                     OPENBLAS_NUM_THREADS=1)
    return json.loads(run([sys.executable, "-c", WORKER, json.dumps(shapes), str(threads),
                           str(seconds)], env).strip().splitlines()[-1])


def decode(exe, folder, isa, threads, precision, reps, tokens):
    """tokens/s of c_decode --generate (a 16-token prompt, then tokens greedily) at isa."""
    env = worker_env(threads, PYTFM_MAX_ISA=isa)
    out = run([exe, "--generate", folder, str(reps), str(threads), precision, "16", str(tokens)],
              env)
    return tokens / statistics.median(int(line.split()[1]) / 1e9 for line in out.splitlines())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isas", nargs="+", choices=ISAS, default=ISAS)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.5, help="timing per product (default 0.5)")
    ap.add_argument("--decode", action="store_true",
                    help="also FP32 and BF16 decoding of a GPT-2-124M-shaped model per path")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per decode (--decode)")
    args = ap.parse_args()
    if args.rounds < 1 or not args.seconds > 0 or min(args.threads) < 1:
        ap.error("--rounds and --threads must be >= 1 and --seconds > 0")
    shapes = [s for name in args.shapes for s in SHAPES[name]]
    runs = [(isa, t) for t in args.threads for isa in args.isas]
    load = [os.getloadavg()[0]]
    got = {}
    with tempfile.TemporaryDirectory(prefix="pytfm-gemv-") as tmp:
        exe = folder = None
        if args.decode:
            from bench.c_generate import build_driver

            folder = os.path.join(tmp, "gpt2-124m")
            run([sys.executable, os.path.join(HERE, "gpt2.py"), "--worker", "folder", "torch",
                 "1", folder], worker_env(1))
            exe = build_driver(tmp)
        for r in range(args.rounds):
            for isa, t in runs if r % 2 == 0 else runs[::-1]:
                for k, v in measure(isa, t, shapes, args.seconds).items():
                    got.setdefault((isa, t, k), []).append(v)
                if args.decode:
                    for prec in ("fp32", "bf16"):
                        got.setdefault((isa, t, "decode " + prec), []).append(
                            decode(exe, folder, isa, t, prec, 2, args.tokens))
            load.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in got.items()}
    print("the one-row products y = x[1, in]·Wᵀ, GB/s of W's bytes; read: a plain read of the "
          "BF16 bytes; bf16w/fp32: FP32's time over BF16 weights' (above 1: BF16 is faster)")
    print(cpu_line())
    print(f"load average {load[0]:.2f} at the start, {min(load[1:]):.2f}-{max(load[1:]):.2f} "
          f"after each round; medians of {args.rounds} rounds")
    print(f"command: python bench/gemv_bandwidth.py --isas {' '.join(args.isas)} --threads "
          f"{' '.join(map(str, args.threads))} --shapes {' '.join(args.shapes)} --rounds "
          f"{args.rounds} --seconds {args.seconds}" + (" --decode" if args.decode else ""))
    kinds = [k for k in KINDS if any(key[2].endswith(" " + k) for key in med)]
    for t in args.threads:
        print(f"\n{t} thread(s)")
        print(f"{'in x out':<13s}{'path':<13s}" + "".join(f"{k:>8s}" for k in kinds)
              + f"{'bf16w/fp32':>12s}{'bf16w/read':>12s}")
        for inn, n in shapes:
            key = f"{inn}x{n}"
            for isa in args.isas:
                row = [med.get((isa, t, f"{key} {k}")) for k in kinds]
                fp32, bf16w, rd = (med[(isa, t, f"{key} {k}")] for k in ("fp32", "bf16w", "read"))
                # bf16w/fp32 as time: FP32's time over BF16's, each reading its own bytes
                speed = (bf16w / 2) / (fp32 / 4)
                print(f"{key:<13s}{isa:<13s}" + "".join(
                    f"{v:8.1f}" if v is not None else f"{'-':>8s}" for v in row)
                    + f"{speed:11.2f}x{bf16w / rd:11.2f}x")
        if args.decode:
            print(f"\ndecode, GPT-2-124M shape, tokens/s, {t} thread(s)")
            for isa in args.isas:
                f32, b16 = (med[(isa, t, "decode " + p)] for p in ("fp32", "bf16"))
                mark = "ok" if b16 > f32 else "MISS (target: BF16 faster than FP32)"
                print(f"  {isa:<13s} fp32 {f32:7.1f}  bf16 {b16:7.1f}  bf16/fp32 "
                      f"{b16 / f32:5.2f}x  {mark}")
    print(json.dumps({" ".join(map(str, k)): v for k, v in med.items()}))


if __name__ == "__main__":
    main()
