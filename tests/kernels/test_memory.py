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
from ops_registry import OPS, Scratch

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

# The set-ups are tests/ops_registry.py's (each op's Scratch): they define call() -> list of
# arrays, out_bytes (what the Python wrapper allocates for the results) and scratch_bytes (what
# the C code asks for, derived beside each)
CASES = [op for op in OPS if isinstance(op.scratch, Scratch)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and RLIMIT_AS")
@pytest.mark.parametrize("op", CASES, ids=lambda op: op.name)
def test_scratch_that_cannot_be_allocated_raises_memory_error(op):
    func = op.c
    if op.scratch.fast_path_only and pytfm.get_isa() not in ("avx2", "avx512"):
        pytest.skip(f"{func} allocates scratch only in its fast path, which needs AVX2")
    r = run_python(DRIVER.format(setup=op.scratch.setup), threads=2,
                   GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")
    assert r.returncode == 0, f"the {op.name} process failed:\n{r.stderr[-3000:]}"
    res = json.loads(r.stdout)
    assert res["message"] is not None, (
        f"{func} did not raise MemoryError with {res['room']} bytes of room for outputs and "
        f"scratch ({res['scratch']} bytes of scratch)")
    assert func in res["message"] and "cannot allocate" in res["message"], res["message"]
    assert res["kept"], f"{func} changed its outputs although it failed"
    assert res["same"], f"{func} gave other results once the limit was lifted"
