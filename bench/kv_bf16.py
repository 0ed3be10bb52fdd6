"""Decoding on a BF16 KV cache (attention_gqa_decode_bf16kv) against the float32 cache
(attention_decode), one layer's attention at Qwen3-0.6B's heads (H 16, Hkv 8, D 128) over
a long context: a token (n_new 1) and a short feed (n_new 20), at each thread count.

The calls are timed in interleaved rounds in one process; the figures are medians, the ratio
is bf16 time over fp32 time (below 1: the BF16 cache is faster). The load average is printed
beside them: the figures mean little on a busy machine.

    python bench/kv_bf16.py [--positions 4096] [--threads 1,2] [--rounds 31]
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def medians(calls, rounds):
    times = {k: [] for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--positions", type=int, default=4096)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=31)
    args = p.parse_args(argv)
    import pytfm
    from pytfm import ops

    H, Hkv, D, T = 16, 8, 128, args.positions
    rng = np.random.default_rng(0)
    k = rng.standard_normal((1, T, Hkv, D), dtype=np.float32)
    v = rng.standard_normal((1, T, Hkv, D), dtype=np.float32)
    k16, v16 = ops.to_bf16_bits(k), ops.to_bf16_bits(v)
    k32, v32 = ops.from_bf16_bits(k16), ops.from_bf16_bits(v16)
    print(f"isa {pytfm.get_isa()}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"cache of one layer: fp32 {2 * k32.nbytes >> 20} MiB, bf16 {2 * k16.nbytes >> 20} MiB")
    print(f"{'threads':>7} {'n_new':>5} {'fp32 ms':>9} {'bf16 ms':>9} {'bf16/fp32':>9}")
    for threads in (int(t) for t in args.threads.split(",")):
        pytfm.set_num_threads(threads)
        for n_new in (1, 20):
            q = rng.standard_normal((1, n_new, H, D), dtype=np.float32)
            start = T - n_new
            m = medians({
                "fp32": lambda q=q, s=start: ops.attention_decode(q, k32, v32, s),
                "bf16": lambda q=q, s=start: ops.attention_gqa_decode_bf16kv(q, k16, v16, s),
            }, args.rounds)
            print(f"{threads:>7} {n_new:>5} {1e3 * m['fp32']:>9.3f} {1e3 * m['bf16']:>9.3f} "
                  f"{m['bf16'] / m['fp32']:>9.2f}")
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
