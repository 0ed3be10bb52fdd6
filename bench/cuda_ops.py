"""Time every CUDA kernel of pytfm on the GPU and print a table: time per call, and the rate
(GB/s for memory-bound ops, GFLOP/s for the matrix products) next to two ceilings measured in
the same run: cuBLAS (cupy.matmul) for the products, a device-to-device copy for bandwidth.

    python bench/cuda_ops.py [--out FILE]

Needs CuPy and a CUDA build of pytfm (scripts/gpu_check.sh runs it). Timing: CUDA events
around 20 calls after 3 warm-up calls; the median of 5 such runs.
"""

import argparse
import statistics
import sys

import cupy as cp
import numpy as np

from pytfm import ops


def timed(fn, reps=20, runs=5):
    """Median seconds per call of fn() on the current stream."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / reps)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    r = lambda *shape: cp.asarray(rng.standard_normal(shape).astype(np.float32))
    lines = []

    def add(name, seconds, amount, unit, ceiling=None):
        rate = amount / seconds / 1e9
        frac = f"{rate / ceiling:6.1%}" if ceiling else ""
        lines.append(f"{name:42s} {seconds * 1e6:10.1f} us {rate:10.1f} {unit:7s} {frac}")

    # ceilings
    big = cp.ones(64 * 1024 * 1024, cp.float32)  # 256 MiB
    dst = cp.empty_like(big)
    copy_gbs = 2 * big.nbytes / timed(lambda: cp.copyto(dst, big)) / 1e9
    add("device-to-device copy (ceiling)", 2 * big.nbytes / copy_gbs / 1e9, 2 * big.nbytes, "GB/s")

    ROWS, IN, OUT = 8192, 768, 3072  # a GPT-2 small MLP layer, rows = B·T = 8192
    x, w, b, dy = r(ROWS, IN), r(OUT, IN), r(OUT), r(ROWS, OUT)
    flops = 2.0 * ROWS * IN * OUT
    cublas = flops / timed(lambda: cp.matmul(x, w.T)) / 1e9
    add(f"cupy.matmul {ROWS}x{IN} . {IN}x{OUT} (ceiling)", flops / cublas / 1e9, flops, "GFLOP/s")
    add("linear_forward (tiled SGEMM + bias)", timed(lambda: ops.linear_forward(x, w, b)), flops,
        "GFLOP/s", cublas)
    add("linear_backward (dx, dW, db)", timed(lambda: ops.linear_backward(dy, x, w)), 2 * flops,
        "GFLOP/s", cublas)

    COLS, VOCAB = 768, 50304  # GPT-2 small's width and vocabulary
    shape = f"{ROWS}x{COLS}"
    xs, ws, bs = r(ROWS, COLS), r(COLS), r(COLS)
    nbytes = 2 * xs.nbytes
    add(f"softmax_forward {shape}", timed(lambda: ops.softmax_forward(xs)), nbytes, "GB/s",
        copy_gbs)
    ys = ops.softmax_forward(xs)
    add(f"softmax_backward {shape}", timed(lambda: ops.softmax_backward(xs, ys)), 3 * xs.nbytes,
        "GB/s", copy_gbs)
    add(f"layernorm_forward {shape}", timed(lambda: ops.layernorm_forward(xs, ws, bs)), nbytes,
        "GB/s", copy_gbs)
    _, mean, rstd = ops.layernorm_forward(xs, ws, bs)
    add(f"layernorm_backward {shape}",
        timed(lambda: ops.layernorm_backward(xs, xs, ws, mean, rstd)), 3 * xs.nbytes, "GB/s",
        copy_gbs)
    g = r(ROWS * COLS * 4)
    add(f"gelu_forward {g.size}", timed(lambda: ops.gelu_forward(g)), 2 * g.nbytes, "GB/s",
        copy_gbs)
    add(f"gelu_backward {g.size}", timed(lambda: ops.gelu_backward(g, g)), 3 * g.nbytes, "GB/s",
        copy_gbs)
    q = r(8, 1024, 12, 64)
    pos = cp.arange(1024, dtype=cp.int64)
    add(f"rope_forward {q.shape}", timed(lambda: ops.rope_forward(q, pos)), 2 * q.nbytes, "GB/s",
        copy_gbs)
    table = r(VOCAB, COLS)
    ids = cp.asarray(rng.integers(0, VOCAB, size=ROWS))
    add(f"embedding_forward {shape}", timed(lambda: ops.embedding_forward(ids, table)),
        2 * ROWS * COLS * 4, "GB/s", copy_gbs)
    add(f"embedding_backward {shape}",
        timed(lambda: ops.embedding_backward(xs, ids, VOCAB, dtable=table)), 3 * ROWS * COLS * 4,
        "GB/s", copy_gbs)
    logits = r(ROWS // 4, VOCAB)
    targets = cp.asarray(rng.integers(0, VOCAB, size=ROWS // 4))
    add(f"cross_entropy_forward {logits.shape}",
        timed(lambda: ops.cross_entropy_forward(logits, targets)), logits.nbytes, "GB/s", copy_gbs)
    _, lse = ops.cross_entropy_forward(logits, targets)
    add(f"cross_entropy_backward {logits.shape}",
        timed(lambda: ops.cross_entropy_backward(logits, targets, lse)), 2 * logits.nbytes, "GB/s",
        copy_gbs)
    count = 124 * 1024 * 1024 // 4 * 4 // 4  # ~31M parameters
    p, gr, m, v = r(count), r(count), r(count), cp.abs(r(count))
    add(f"adamw_step {count}", timed(lambda: ops.adamw_step(p, gr, m, v, 10, 1e-4)), 7 * p.nbytes,
        "GB/s", copy_gbs)

    head = f"{'kernel':42s} {'time':>13s} {'rate':>10s} {'unit':7s} of ceiling"
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    text = "\n".join([f"pytfm CUDA kernels on {props['name'].decode()}", head, *lines]) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
