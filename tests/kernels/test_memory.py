"""The out-of-memory path: an op whose scratch space cannot be allocated returns
PYTFM_STATUS_OUT_OF_MEMORY, which Python raises as MemoryError naming the C function, and the
next call, with memory to spare, works.

Each case runs in a process of its own (helpers.run_python), so that the limit cannot hurt
this one: it makes the inputs, calls the op twice (which starts the thread pool and its
stacks and fills malloc's and Python's arenas), then lowers the address-space limit
(RLIMIT_AS) to what the process holds (VmSize) plus the op's outputs plus half its scratch, so
the outputs can be allocated and the scratch cannot. The scratch sizes are those the C code
asks for (named beside each case). glibc is told to serve every block of 64 KiB or more by
mmap (a fixed threshold: by default it rises after the warm-up frees a large block, and the
heap could then hand back the freed scratch without asking for address space).
"""

import json
import sys

import pytest

import pytfm
from helpers import run_python

DRIVER = """
import json, resource
import numpy as np
import pytfm
from pytfm import ops
from pytfm._core import check, ffi, lib

def vm_size():  # bytes of address space the process holds: what RLIMIT_AS limits
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024

threads = pytfm.get_num_threads()
rng = np.random.default_rng(0)
randn = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
{setup}
failing_call = globals().get("failing_call", call)  # the call made under the limit
watched = globals().get("watched", lambda: [])  # arrays it must leave as they were
want = call()
call()
before = [a.copy() for a in watched()]
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
# the outputs fit, the scratch does not (room_bytes: a case that needs a finer line)
room = globals().get("room_bytes", out_bytes + scratch_bytes // 2)
resource.setrlimit(resource.RLIMIT_AS, (vm_size() + room, hard))
try:
    failing_call()
    message = None
except MemoryError as e:
    message = str(e)
finally:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
kept = all(np.array_equal(a, b) for a, b in zip(before, watched(), strict=True))
again = call()
same = all(np.array_equal(a, b) for a, b in zip(want, again, strict=True))
print(json.dumps({{"message": message, "same": same, "kept": kept, "room": room,
                  "scratch": scratch_bytes}}))
"""

# (C function, needs sgemm's micro-kernels, set-up that defines call() -> list of arrays,
# out_bytes (what the Python wrapper allocates for the results) and scratch_bytes)
TQ_TK = 64 * 256  # attention.c: the forward's TQ×TK tile of scores
TQB_TKB = 64 * 64  # and the backward's TQB×TKB
CASES = {
    "attention_forward": ("pytfm_attention_forward", True, f"""
B, T, H, D = 1, 512, 1, 4096
q, k, v = randn(B, T, H, D), randn(B, T, H, D), randn(B, T, H, D)
call = lambda: list(ops.attention_forward(q, k, v))
out_bytes = 4 * (B * T * H * D + B * H * T)  # o, lse
scratch_bytes = 4 * threads * (D * T + {TQ_TK} + 2 * 64)  # forward_ws_floats per thread
"""),
    "attention_backward": ("pytfm_attention_backward", True, f"""
B, T, H, D = 1, 512, 1, 4096
q, k, v, dy = randn(B, T, H, D), randn(B, T, H, D), randn(B, T, H, D), randn(B, T, H, D)
o, lse = ops.attention_forward(q, k, v)
call = lambda: list(ops.attention_backward(dy, q, k, v, o, lse))
out_bytes = 4 * 3 * B * T * H * D  # dq, dk, dv
scratch_bytes = 4 * threads * (2 * D * T + 2 * {TQB_TKB} + T)  # backward_fast, per thread
"""),
    "attention_decode": ("pytfm_attention_decode", True, f"""
B, Tmax, H, D, start, n_new = 1, 512, 1, 4096, 448, 64  # n_new >= 8: the tiled path
q, k_cache, v_cache = randn(B, n_new, H, D), randn(B, Tmax, H, D), randn(B, Tmax, H, D)
call = lambda: list(ops.attention_decode(q, k_cache, v_cache, start))
out_bytes = 4 * (B * n_new * H * D + B * H * n_new)  # o, lse
scratch_bytes = 4 * threads * (D * (start + n_new) + {TQ_TK} + 2 * 64)  # as the forward's
"""),
    "layernorm_backward": ("pytfm_layernorm_backward", False, """
rows, cols = 16, 65536
x, dy, w, b = randn(rows, cols), randn(rows, cols), randn(cols), randn(cols)
y, mean, rstd = ops.layernorm_forward(x, w, b)
call = lambda: list(ops.layernorm_backward(dy, x, w, mean, rstd))
out_bytes = 4 * (rows * cols + 2 * cols)  # dx, dw, db
scratch_bytes = 4 * 2 * min(rows, 16) * cols  # backward_fast: dw, db per chunk of rows
"""),
    "rope_forward": ("pytfm_rope_forward", False, """
B, T, H, D = 1, 4096, 1, 512
x, pos = randn(B, T, H, D), np.arange(T)
call = lambda: [ops.rope_forward(x, pos)]
out_bytes = 4 * B * T * H * D
scratch_bytes = 4 * T * D  # rotate_tabled: cos and sin, [T, D/2] each (pos shared by the batch)
"""),
    "rope_backward": ("pytfm_rope_backward", False, """
B, T, H, D = 1, 4096, 1, 512
dy, pos = randn(B, T, H, D), np.arange(T)
call = lambda: [ops.rope_backward(dy, pos)]
out_bytes = 4 * B * T * H * D
scratch_bytes = 4 * T * D  # rotate_tabled: cos and sin, [T, D/2] each
"""),
    "sgemm": ("pytfm_sgemm", True, """
m, n, k = 64, 1024, 192
a, b, c = randn(m, k), randn(k, n), np.empty((m, n), np.float32)
pc, pa, pb = (ffi.from_buffer("float[]", t) for t in (c, a, b))
def call():
    check(lib.pytfm_sgemm(pc, pa, pb, m, n, k, 0, 0, 0.0))
    return [c.copy()]
watched = lambda: [c]  # a failed product writes nothing
out_bytes = 0  # C is the caller's
# gemm_blocked, C split by columns (m < n), 2 threads: per thread an MC×KC = 144×384 block of A
# (packed: n >= 512) and its own KC×512 panel of B (its half of C's 1024 columns)
scratch_bytes = 4 * threads * (144 * 384 + 384 * 512)
"""),
    # dx = dy·W and dW += dyᵀ·x share one scratch allocation made before either is written.
    # The room left fits dx's product's scratch but not dW's, so two allocations, one per
    # product, would write the caller's dx before failing on dW's: the C function is called
    # with the caller's dx, dw and db, as a C program calls it
    "linear_backward": ("pytfm_linear_backward", True, """
rows, inn, out = 64, 256, 192
x, w, dy = randn(rows, inn), randn(out, inn), randn(rows, out)
call = lambda: list(ops.linear_backward(dy, x, w))
dx0 = np.full((rows, inn), 7.0, np.float32)
dw0, db0 = np.ones((out, inn), np.float32), np.ones(out, np.float32)
P = lambda a: ffi.from_buffer("float[]", a)
failing_call = lambda: check(lib.pytfm_linear_backward(P(dx0), P(dw0), P(db0), P(dy), P(x),
                                                       P(w), rows, inn, out))
watched = lambda: [dx0, dw0, db0]
out_bytes = 0  # all three are the caller's
# Both products split C by columns (m < n = 256), 2 threads. dW += dyᵀ·x packs op(A)
# (transposed): per thread an MC×KC = 144×384 block and a KC×128 panel of B (its half of the
# 256 columns); dx = dy·W reads A in place (n = 256 < 512) and needs the panels alone
scratch_bytes = 4 * threads * (144 * 384 + 384 * inn // 2)
room_bytes = 4 * threads * 384 * (inn // 2) * 11 // 8  # dx's 384 KiB fit, dW's 816 KiB do not
"""),
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and RLIMIT_AS")
@pytest.mark.parametrize("case", CASES)
def test_scratch_that_cannot_be_allocated_raises_memory_error(case):
    func, needs_micro_kernel, setup = CASES[case]
    if needs_micro_kernel and pytfm.get_isa() not in ("avx2", "avx512"):
        pytest.skip(f"{func} allocates scratch only in its fast path, which needs AVX2")
    r = run_python(DRIVER.format(setup=setup), threads=2,
                   GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")
    assert r.returncode == 0, f"the {case} process failed:\n{r.stderr[-3000:]}"
    res = json.loads(r.stdout)
    assert res["message"] is not None, (
        f"{func} did not raise MemoryError with {res['room']} bytes of room for outputs and "
        f"scratch ({res['scratch']} bytes of scratch)")
    assert func in res["message"] and "cannot allocate" in res["message"], res["message"]
    assert res["kept"], f"{func} changed its outputs although it failed"
    assert res["same"], f"{func} gave other results once the limit was lifted"
