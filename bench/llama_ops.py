"""The Llama family's element-wise ops: the fast kernels against the plain loops, and what a
SwiGLU fused into the gate and up products could save at most.

    python bench/llama_ops.py [--threads 1] [--rounds 7]

One process, rounds interleaved, medians. "fast/plain" is the plain loops' time over the fast
kernels' (PYTFM_ISA_PLAIN against the best the CPU has). "swiglu/(gate+up)" is the SwiGLU
step's time over the two products' at a Llama 3.2 1B MLP (d = 2048, ffn = 8192): fusing the
step into the products' epilogue saves at most that fraction of the MLP's forward.
"""

import argparse
import os
import statistics
import time

import numpy as np

import pytfm
from pytfm import ops


def timed(f, reps):
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    pytfm.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rows, d, ffn = 64, 2048, 8192
    x = rng.standard_normal((rows, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    dy = rng.standard_normal((rows, d)).astype(np.float32)
    g = rng.standard_normal((rows, ffn)).astype(np.float32)
    u, dh = (rng.standard_normal((rows, ffn)).astype(np.float32) for _ in range(2))
    wg, wu = (rng.standard_normal((ffn, d)).astype(np.float32) * 0.02 for _ in range(2))
    q = rng.standard_normal((1, rows, 32, 64)).astype(np.float32)
    pos = np.arange(rows, dtype=np.int64)
    inv = ops.rope_inv_freq(64, 500000.0)
    _, rstd = ops.rmsnorm_forward(x, w, 1e-5)
    cases = {
        "rmsnorm fwd": lambda: ops.rmsnorm_forward(x, w, 1e-5),
        "rmsnorm bwd": lambda: ops.rmsnorm_backward(dy, x, w, rstd),
        "swiglu fwd": lambda: ops.swiglu_forward(g, u),
        "swiglu bwd": lambda: ops.swiglu_backward(dh, g, u),
        "rope_freq fwd": lambda: ops.rope_freq_forward(q, pos, inv),
    }
    times = {(n, isa): [] for n in cases for isa in ("plain", "best")}
    products = []
    for _ in range(args.rounds):
        for isa in ("plain", "best"):
            pytfm.set_max_isa("plain" if isa == "plain" else "avx512")
            for n, f in cases.items():
                f()
                times[n, isa].append(timed(f, 5))
        pytfm.set_max_isa("avx512")
        products.append(timed(lambda: (ops.linear_forward(x, wg), ops.linear_forward(x, wu)), 2))
    print(f"load {os.getloadavg()[0]:.2f}, threads {args.threads}, rounds {args.rounds}, "
          f"rows {rows}")
    for n in cases:
        plain, best = (statistics.median(times[n, i]) for i in ("plain", "best"))
        print(f"{n:16s} plain {plain * 1e6:9.1f} us  fast {best * 1e6:9.1f} us  "
              f"fast/plain {plain / best:5.2f}x")
    prod = statistics.median(products)
    sw = statistics.median(times["swiglu fwd", "best"])
    print(f"gate+up products {prod * 1e6:9.1f} us  swiglu {sw * 1e6:.1f} us  "
          f"swiglu/(gate+up) {sw / prod:.4f}")


if __name__ == "__main__":
    main()
