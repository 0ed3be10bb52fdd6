"""Time per generated token vs context length: KV-cache decoding against full recomputation.

    python bench/generate.py            # train_tiny's model shape, with a 1024-token context

With the KV cache a new token costs its own projections and MLP (constant) plus attention over
the p cached positions (O(p·D)); recomputing the whole sequence costs O(p) projections and
O(p²) attention. The table shows both at several positions p, and how each grows with p.
"""

import argparse
import time

import numpy as np

from pytfm.nn import GPT, GPTConfig


def per_token_cached(model, p, reps):
    """Seconds for one decode step at position p (the cache holds p tokens)."""
    rng = np.random.default_rng(0)
    caches = model.new_caches(1)
    model.decode(rng.integers(0, 256, size=(1, p)), caches)  # fill to p
    times = []
    for _ in range(reps):
        for c in caches:
            c.length = p  # decode the same position again
        t0 = time.perf_counter()
        model.decode(rng.integers(0, 256, size=(1, 1)), caches)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def per_token_full(model, p, reps):
    """Seconds to recompute the logits of a (p + 1)-token sequence from scratch."""
    idx = np.random.default_rng(0).integers(0, 256, size=(1, p + 1))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.forward(idx)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, nargs="+", default=[64, 128, 256, 512, 1023])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    model = GPT(GPTConfig(max_seq=max(args.positions) + 1))
    print(f"GPT {model.num_params():,} parameters; median of {args.reps} runs; ms per new token")
    print(f"{'position p':>10} {'KV cache':>9} {'x prev':>7} {'recompute':>10} {'x prev':>7}")
    prev = None
    for p in args.positions:
        c = per_token_cached(model, p, args.reps)
        f = per_token_full(model, p, max(3, args.reps // 5))
        gc = f"{c / prev[0]:7.2f}" if prev else " " * 7
        gf = f"{f / prev[1]:7.2f}" if prev else " " * 7
        print(f"{p:10d} {c * 1e3:9.2f} {gc} {f * 1e3:10.1f} {gf}")
        prev = (c, f)


if __name__ == "__main__":
    main()
