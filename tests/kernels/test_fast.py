"""The vectorised element-wise kernels (portable, AVX2 and AVX-512 builds of
csrc/kernels/fast_impl.h) and the tiled attention against the plain reference loops
(PYTFM_ISA_PLAIN), on sizes around their vector and lane widths (16), tiles (64) and task size
(16384 elements): every Fast case of tests/ops_registry.py. The AVX2 and AVX-512 builds must agree
bit for bit: they run the same operations in the same order (sums over 16 fixed partial results,
the same fused multiply-adds). And every op, and the model built of them, gives the same bits
at any thread count."""

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
import pytfm
from pytfm import ops
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm

def digest(arrays):
    return hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in arrays)).hexdigest()

digests = {{"threads": pytfm.get_num_threads()}}
for op in ops_registry.OPS:
    for i, values in enumerate(op.check.threads if op.check else ()):
        a = op.check.make(**values)
        digests[f"{{op.name}}[{{i}}]"] = digest(o for o in op.check.run(a) if o is not None)
digests["sinusoidal_positions"] = digest([ops.sinusoidal_positions(300, 258)])
# the model: two training steps (forward, backward, clipping, AdamW), then sampled generation
# through the KV cache, with every tensor large enough to be split among threads
for pos in ("rope", "sinusoidal", "learned"):
    model = GPT(GPTConfig(vocab=257, d_model=96, n_layer=2, n_head=4, max_seq=64, pos=pos,
                          tie_embeddings=pos == "rope", seed=1))
    opt = AdamW(model.params, model.grads, lr=1e-2)
    rng = np.random.default_rng(2)
    out = []
    for step in range(2):
        x, y = rng.integers(0, 257, (2, 4, 64))
        model.zero_grad()
        logits, loss = model.forward(x, y)
        model.backward()
        out += [logits, loss, clip_grad_norm(model.grads, 1.0)]
        opt.step()
    out += [model.params[k] for k in sorted(model.params)]
    out.append(generate(model, x[:2, :5], 8, temperature=0.8, top_k=20, seed=3))
    digests[f"model[{{pos}}]"] = digest(out)
print(json.dumps(digests))
"""


def test_every_op_and_the_model_give_the_same_bits_at_any_thread_count():
    """Each op at its Check's threads sizes, large enough that it splits its work among threads
    (> 16384 elements), the sinusoidal table, and a model's training steps and generation, at
    1, 2 and 3 threads (PYTFM_NUM_THREADS: exactly that many, whatever the machine's load): the
    same bytes. With this, a test that passes at one thread count passes at any: CI runs the
    suite once."""
    digests = {}
    for threads in (1, 2, 3):
        r = run_python(THREADS.format(tests=TESTS), threads=threads)
        assert r.returncode == 0, f"at {threads} threads:\n{r.stderr[-3000:]}"
        digests[threads] = json.loads(r.stdout)
        assert digests[threads].pop("threads") == threads
    assert len(digests[1]) >= 24, digests[1]
    for threads in (2, 3):
        differ = [k for k in digests[1] if digests[threads][k] != digests[1][k]]
        assert not differ, f"at {threads} threads, other bits than at 1 from {differ}"
