"""The vectorised element-wise kernels (portable, AVX2 and AVX-512 builds of
csrc/kernels/fast_impl.h) and the tiled attention against the plain reference loops
(PYTFM_ISA_PLAIN), on sizes around their vector and lane widths (16), tiles (64) and task size
(16384 elements): every Fast case of tests/ops_registry.py. The AVX2 and AVX-512 builds must agree
bit for bit: they run the same operations in the same order (sums over 16 fixed partial results,
the same fused multiply-adds). And every op gives the same bits at any thread count."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import TESTS, assert_close, has_isa, max_isa, run_python
from ops_registry import OPS, fresh

FAST_CASES = [(op, case, isa) for op in OPS if not isinstance(op.fast, str)
              for case in op.fast for isa in case.isas]


def run_all(isa, fn):
    with max_isa(isa):
        return fn()


def fma_twin(isa):
    """The other build with FMA, whose results must be the same bits (or None)."""
    twin = {"avx2": "avx512", "avx512": "avx2"}.get(isa)
    return twin if twin and has_isa(twin) else None


def compare(name, isa, case, a):
    """case.run(a) under `isa` vs under "plain": output i within case.tol(a, got, plain)[i] of
    the plain one (a bound per output, which may inherit the difference already seen in an
    earlier output, each checked against its own). And the AVX2 and AVX-512 builds (both fuse
    a·b + c) give the same bits."""
    got = run_all(isa, lambda: case.run(fresh(a)))
    plain = run_all("plain", lambda: case.run(fresh(a)))
    twin = fma_twin(isa)
    same = run_all(twin, lambda: case.run(fresh(a))) if twin else got
    tols = case.tol(a, got, plain)
    for i, (g, p, q, t) in enumerate(zip(got, plain, same, tols, strict=True)):
        assert_close(f"fast.{name}[{i}]", g, p, atol=t.atol, rtol=t.rtol)
        np.testing.assert_array_equal(g, q, err_msg=f"{name}[{i}]: {isa} and {twin} differ")


@pytest.mark.parametrize("op,case,isa", FAST_CASES,
                         ids=[f"{op.name}-{case.id}-{isa}" for op, case, isa in FAST_CASES])
@given(data=st.data())
def test_the_fast_kernels_match_the_plain_ones(op, case, isa, data):
    """tests/ops_registry.py's Fast cases: sizes around the vector and lane widths (16), tiles
    (64) and task size (16384 elements), tolerances derived per output."""
    compare(f"{op.name}.{case.id}", isa, case, case.make(**data.draw(case.draw, label="drawn")))


THREADS = """
import hashlib, json, sys
sys.path[:0] = [{tests!r}]
import numpy as np
import ops_registry
digests = {{}}
for op in ops_registry.OPS:
    for i, values in enumerate(op.check.threads if op.check else ()):
        a = op.check.make(**values)
        out = b"".join(np.asarray(o).tobytes() for o in op.check.run(a) if o is not None)
        digests[f"{{op.name}}[{{i}}]"] = hashlib.sha256(out).hexdigest()
print(json.dumps(digests))
"""


def test_every_op_gives_the_same_bits_at_any_thread_count():
    """Each op at its Check's threads sizes, large enough that it splits its work among threads
    (> 16384 elements), at 1, 2 and 3 threads: the same bytes."""
    digests = {}
    for threads in (1, 2, 3):
        r = run_python(THREADS.format(tests=TESTS), threads=threads)
        assert r.returncode == 0, f"at {threads} threads:\n{r.stderr[-3000:]}"
        digests[threads] = json.loads(r.stdout)
    assert len(digests[1]) >= 20, digests[1]
    for threads in (2, 3):
        differ = [k for k in digests[1] if digests[threads][k] != digests[1][k]]
        assert not differ, f"at {threads} threads, other bits than at 1 from {differ}"
