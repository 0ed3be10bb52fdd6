"""Every CUDA kernel once, on small awkward sizes, through pytfm.ops with CuPy arrays: the
workload scripts/gpu_check.sh hands to compute-sanitizer (memcheck, racecheck). Exit status 0
when every call returned and the device synchronised without error."""

import cupy as cp
import numpy as np

from pytfm import ops
from pytfm._core import check, ffi, lib


def main():
    rng = np.random.default_rng(0)
    r = lambda *shape: cp.asarray(rng.standard_normal(shape).astype(np.float32))
    for rows, inn, out in ((1, 1, 1), (65, 17, 63), (33, 64, 129)):
        x, w, b, dy = r(rows, inn), r(out, inn), r(out), r(rows, out)
        ops.linear_forward(x, w, b)
        ops.linear_backward(dy, x, w)
    for rows, cols in ((1, 1), (3, 33), (9, 1024), (2, 1025), (5, 3000)):
        x, dy, w, b = r(rows, cols), r(rows, cols), r(cols), r(cols)
        y = ops.softmax_forward(x)
        ops.softmax_backward(dy, y)
        _, mean, rstd = ops.layernorm_forward(x, w, b)
        ops.layernorm_backward(dy, x, w, mean, rstd)
        targets = cp.asarray(rng.integers(-1, cols, size=rows))
        _, lse = ops.cross_entropy_forward(x, targets)
        ops.cross_entropy_backward(x, targets, lse)
    x, pos = r(2, 5, 3, 10), cp.arange(5, dtype=cp.int64)
    ops.rope_backward(ops.rope_forward(x, pos), pos)
    for count in (1, 257, 5000):
        x = r(count)
        ops.gelu_backward(r(count), ops.gelu_forward(x))
        ops.adamw_step(r(count), r(count), r(count), cp.abs(r(count)), 3, 1e-3, weight_decay=0.1)
    ids = cp.asarray(rng.integers(0, 7, size=40))
    ops.embedding_forward(ids, r(7, 33))
    ops.embedding_backward(r(40, 33), ids, 7)
    check(lib.pytfm_cuda_stream_synchronize(ffi.NULL))
    print("cuda_small_run: every kernel ran")


if __name__ == "__main__":
    main()
