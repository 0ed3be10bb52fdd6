"""The one list of pytfm's ops, per direction, that the cross-cutting tests iterate.

Each entry of OPS is an Op: a C function pytfm_<name> of pytfm_kernels.h (with its CUDA twin
pytfm_<name>_cuda of pytfm_cuda.h unless cuda=False), its wrapper pytfm.ops.<name> and
reference pytfm.reference.<name> (where they exist), and what each test needs of it:

  limits   C calls with sizes whose arithmetic overflows   tests/kernels/test_limits.py,
                                                           tests/c_api/hostile_sizes.c
  exact    C calls on exactly-sized buffers                tests/c_api/sanitize_kernels.c,
                                                           the NULL-buffer checks
  check    inputs, the op and the reference, tolerances    tests/kernels/test_ops.py,
           per output; the sizes its CUDA twin runs at     tests/cuda/test_cuda_emu.py,
                                                           tests/cuda/test_cuda_dispatch.py,
           sizes split among threads                       tests/kernels/test_fast.py
  fast     the fast kernels against the plain ones         tests/kernels/test_fast.py
  bad      bad input and the error it raises               tests/kernels/test_errors.py
  scratch  its scratch running out (OUT_OF_MEMORY)         tests/kernels/test_memory.py
  tested_in  the tests of its own (properties, bits, special values)

tests/kernels/test_registry.py holds the registry to the headers: a function they declare
that is neither an op here nor in NON_OPS fails there, as does a call template whose arguments
do not match the declaration. CONTRIBUTING.md says how to add an op.

Call templates (limits, exact) are C argument lists, one token per argument:
  F D I H B  a float, double, int64_t, uint16_t (BF16 or fp16 bits) or int8_t (8-bit weights)
             buffer: tiny (one element in C, 64 in Python) in a limits call; N: NULL
  F:e D:e H:e B:e  exactly e elements (a C expression of the sizes r, a, b), random values (H:
             the BF16 bits of finite ones)
  I:e:l      e int64 indices in [0, l)
  {i}        the i-th size of a limits case; anything else a C literal or expression
The sanitizer runs every exact call at each r, a, b in {1, 2, 3, 7, 17, 33} (r also 0).

    python tests/ops_registry.py hostile   # the C calls of hostile_sizes.c (hostile_calls.h)
    python tests/ops_registry.py exact     # those of sanitize_kernels.c (exact_calls.h)
"""

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

from helpers import EPS32, FLT_MIN, amax, awkward, f32, i64, scales, seeds, small, z
from pytfm import ops
from pytfm import reference as ref


class Tol(NamedTuple):
    """|got − want| <= atol + rtol·|want| (atol a number or an array of the output's shape)."""

    atol: object = 0.0
    rtol: float = 1e-5


EXACT = Tol(0.0, 0.0)


@dataclass(frozen=True)
class Check:
    """An op direction through pytfm.ops against the float64 reference.

    make(**drawn) builds the inputs (a dict: arrays, and the drawn values themselves); run(a)
    calls the op on them (it may update a's arrays in place: each run gets its own copy) and
    returns its outputs (None where the op returns none); want(a) the reference's; tol(a, want)
    a Tol per output, the C kernel's bound. emu: the drawn values the CUDA twin runs at on the
    emulator, held to emu_tol (default tol) and, at twice that, to the C kernel's result (its
    bits when same_bits_as_c). threads: drawn values whose sizes split the work among threads.
    """

    draw: object
    make: Callable
    run: Callable
    want: Callable
    tol: Callable
    outputs: tuple
    emu: tuple = ()
    emu_tol: Callable = None
    same_bits_as_c: bool = False
    threads: tuple = ()


FAST = ("portable", "avx2", "avx512")


@dataclass(frozen=True)
class Fast:
    """The fast kernels (each ISA of isas) against the plain loops (PYTFM_ISA_PLAIN):
    run(make(**drawn)) under each, output i within tol(a, got, plain)[i] of the plain one; the
    AVX2 and AVX-512 builds give the same bits."""

    id: str
    draw: object
    make: Callable
    run: Callable
    tol: Callable
    isas: tuple = FAST


@dataclass(frozen=True)
class Limits:
    """C argument templates, each called with every case of sizes (overflowing ones)."""

    calls: tuple
    sizes: tuple


@dataclass(frozen=True)
class Scratch:
    """tests/kernels/test_memory.py's set-up for the op's scratch running out: it defines
    call() -> list of arrays, out_bytes and scratch_bytes (see the driver there);
    fast_path_only: the scratch is allocated in the AVX2 micro-kernel path only."""

    setup: str
    fast_path_only: bool = False


class Bad(NamedTuple):
    """call() raises exc with a message matching pattern (exc None: a value at the edge that
    must be accepted); id names the case (default: from the pattern)."""

    call: Callable
    exc: object
    pattern: object
    id: str = ""

    def name(self):
        if self.id:
            return self.id
        text = re.sub(r"\\(.)", r"\1", self.pattern)
        for sign, word in ((">=", " ge "), ("<=", " le "), (">", " gt "), ("<", " lt ")):
            text = text.replace(sign, word)
        text = re.sub(r"(?<![\w.])-(?=\d)", "minus", text)
        return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:60]


@dataclass(frozen=True)
class Op:
    """One op direction: pytfm_<name> in C (pytfm_<name>_cuda on the GPU when cuda),
    pytfm.ops.<name> when wrapper, pytfm.reference.<name> when reference; the rest as the
    module's docstring says."""

    name: str
    limits: Limits
    exact: tuple
    check: object = None  # a Check; None: tested_in holds its checks
    fast: object = ()  # Fast cases, or a str saying why there are none
    bad: tuple = ()
    scratch: object = None  # a Scratch, a str saying why it is not tested, None: no scratch
    cuda: bool = True
    wrapper: bool = True
    reference: bool = True
    tested_in: tuple = ()

    def __repr__(self):
        return f"Op({self.name})"

    @property
    def c(self):
        return "pytfm_" + self.name

    @property
    def twin(self):
        return self.c + "_cuda" if self.cuda else None


# ---- sizes that overflow ----------------------------------------------------------------------
# near 2^31, 2^32, 2^61 (the most float32 elements whose byte count fits in a ptrdiff_t), 2^62
# and INT64_MAX; RoPE position strides past them; cache positions start + n_new that wrap

I64_MAX = 2**63 - 1
P31, P32, P61, P62 = 2**31, 2**32, 2**61, 2**62
RC = ((P32, P32), (P62, 4), (4, P62), (P31 + 1, P31 - 1), (P61, 1), (I64_MAX, 1), (1, I64_MAX),
      (3, P61 // 2))
MNK = ((P32, P32, 0), (P32, P32, P32), (P62, 1, 1), (1, P62, 1), (1, 1, P62), (P31, P31, 1),
       (I64_MAX, 1, 1), (P61, 1, 0), (1, P61, 4))
LIN = ((P32, P32, 1), (P62, 1, 1), (1, P62, 1), (1, 1, P62), (P31, 2, P31), (1, P31, P31),
       (I64_MAX, 1, 1), (P61, 1, 4))
COUNT = ((P61,), (P62,), (I64_MAX,), (P61 + 1,))
EMB = ((P62, 1, 4), (1, P62, 4), (P32, 2, P32), (P61, 1, 1), (I64_MAX, 1, 1), (2, 1, I64_MAX))
HEADS = ((P62, 1, 1, 1), (1, P62, 1, 1), (1, 1, P62, 1), (1, 1, 1, P62), (2**16,) * 4,
         (P31, P31, 1, 1), (I64_MAX, 1, 1, 1), (1, 1, 1, I64_MAX))
ROPE = ((P31, P31, 1, 2, 0), (1, P62, 1, 2, 0), (1, 1, P62, 2, 0), (1, 1, 1, P62, 0),
        (2**16, 2**16, 2**16, 2**16, 0), (2, 4, 1, 2, I64_MAX), (P32, 1, 1, 2, P32),
        (3, 1, 1, 2, P62), (I64_MAX, 1, 1, 2, 0))
POSITIONS = ((P62, 2), (2, P62), (P31, P32), (P61, 2), (I64_MAX, 2), (1, I64_MAX - 1), (3, P61))
CACHE = (  # B, n_new, H, D, Tmax, start
    (1, 1, 1, 1, 4, I64_MAX),  # start + n_new wraps
    (1, 2, 1, 1, I64_MAX, I64_MAX - 1),  # so does this, past Tmax = INT64_MAX
    (1, I64_MAX, 1, 1, 4, 1),
    (P32, 1, P32, 1, 4, 0),  # the cache [B, Tmax, H, D] would wrap to 0 floats
    (1, 1, 1, 1, P62, 0),
    (2**16, 1, 2**16, 2**16, 2**16, 0),
    (1, 1, 1, I64_MAX, 4, 0),
)


# ---- drawing ----------------------------------------------------------------------------------

def _abs(a):
    """|a|, 0 for None (an accumulator not given)."""
    return 0.0 if a is None else np.abs(a.astype(np.float64))


def _plus(a0, r):
    """What an accumulated gradient holds: a0 + r (r alone without a0)."""
    return r if a0 is None else a0 + r


def drawn(**strategies):
    """A strategy of dicts: make()'s keywords, a seed among them."""
    return st.fixed_dictionaries({**strategies, "seed": seeds})


# the fast kernels' sizes: around their vector and lane widths (16), tiles (64) and task size
# (16384 elements)
fast_cols = st.one_of(st.integers(1, 40),
                      st.sampled_from([47, 48, 49, 255, 256, 257, 1000, 16385]))
fast_rows = st.sampled_from([1, 2, 3, 7])


def sum_roundings(cols):
    """Roundings on the way of one term into a float sum of `cols` terms as fast_impl.h adds
    them (vecmath.h): a lane adds up to cols/16 terms, then a 4-level tree and the final add;
    a tail term up to 15 adds and the final one."""
    return cols / 16 + 16


# ---- bad input --------------------------------------------------------------------------------
# An integer argument is an int64_t in C, a real one a float (a double for rope's base and
# AdamW's hyper-parameters), causal and has_bias an int32_t flag. Python hands over more than
# those hold: ints of any size, True (an int), None.


class FakeCupyArray:  # what pytfm sees when a CuPy array arrives in a CPU-only build
    __module__ = "cupy._core.core"


HUGE = 10**400  # beyond float64: float(HUGE) raises OverflowError
x23, w43 = z(2, 3), z(4, 3)
readonly = z(4, 3)
readonly.flags.writeable = False
q4 = z(1, 2, 2, 4)
ce = (x23, i64(0, 1))  # logits, targets
adam = (z(3), z(3), z(3), z(3))


def ln(eps):
    return ops.layernorm_forward(x23, z(3), z(3), eps=eps)


def rope(base):
    return ops.rope_forward(z(1, 3, 2, 4), i64(0, 1, 2), base=base)


def adamw(**hyper):
    return ops.adamw_step(*adam, **{"step": 1, "lr": 0.1, **hyper})


def decode(start, scale=None):
    return ops.attention_decode(q4, z(1, 8, 2, 4), z(1, 8, 2, 4), start=start, scale=scale)


# ---- linear -----------------------------------------------------------------------------------

def linear_make(seed, rows, inn, out, bias=True, batch=1, accumulate=False):
    rng = np.random.default_rng(seed)
    x, w = f32(rng, (batch, rows, inn)), f32(rng, (out, inn))
    b = f32(rng, (out,)) if bias else None
    dy = f32(rng, (batch, rows, out))
    dw0 = f32(rng, (out, inn)) if accumulate else None
    db0 = f32(rng, (out,)) if accumulate and bias else None
    return dict(seed=seed, x=x, w=w, b=b, dy=dy, dw0=dw0, db0=db0)


def linear_bound(a):
    """|fl(Σ x w) − Σ x w| <= in·eps·Σ|x||w|: 2·in·eps·Σ|x||w| (+ |b|)"""
    b = a["b"]
    return 2 * a["x"].shape[-1] * EPS32 * ref.linear_forward(abs(a["x"]), abs(a["w"]),
                                                             None if b is None else abs(b))


def linear_backward_tol(a, want):
    adx, adw, adb = ref.linear_backward(abs(a["dy"]), abs(a["x"]), abs(a["w"]))
    out, inn = a["w"].shape
    n = a["x"].size // inn  # rows of every batch: the sums of dw and db
    return [Tol(2 * out * EPS32 * adx), Tol(2 * n * EPS32 * (adw + _abs(a["dw0"]))),
            None if a["b"] is None else Tol(2 * n * EPS32 * (adb + _abs(a["db0"])))]


def linear_backward_want(a):
    rdx, rdw, rdb = ref.linear_backward(a["dy"], a["x"], a["w"])
    return [rdx, _plus(a["dw0"], rdw), None if a["b"] is None else _plus(a["db0"], rdb)]


LINEAR_DRAW = drawn(rows=awkward, inn=awkward, out=awkward, bias=st.booleans(), batch=small)
LINEAR_EMU = tuple(dict(rows=r, inn=i, out=o, bias=b, seed=r + i + o)
                   for r, i, o in [(1, 1, 1), (3, 5, 7), (65, 17, 63), (33, 64, 65)]
                   for b in (True, False))


def linear_one_row_tol(a, got, plain):
    """Each side's dot product is off the exact one by at most its roundings times Σ|x·w|: the
    plain loop n_in of them, the fast one sum_roundings(n_in) (n_in/16 per lane, the tree);
    the bias add one more each side."""
    x, w = a["x"], a["w"]
    n_in = x.shape[-1]
    mag = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    return [Tol(EPS32 * (n_in + sum_roundings(n_in) + 2) * mag, EPS32)]


LINEAR_FORWARD = Op(
    "linear_forward",
    limits=Limits(("F F F F {0} {1} {2}",), LIN),
    exact=("F:r*b F:r*a F:b*a F:b r a b", "F:r*b F:r*a F:b*a N r a b"),
    check=Check(
        LINEAR_DRAW, linear_make,
        run=lambda a: [ops.linear_forward(a["x"], a["w"], a["b"])],
        want=lambda a: [ref.linear_forward(a["x"], a["w"], a["b"])],
        tol=lambda a, want: [Tol(linear_bound(a))],
        outputs=("y",), emu=LINEAR_EMU,
        threads=(dict(rows=300, inn=257, out=130, seed=3),
                 dict(rows=1, inn=257, out=600, bias=False, seed=3),  # one row: gemv
                 dict(rows=1, inn=300, out=1000, bias=False, seed=3),  # streamed: gemv_rows
                 dict(rows=5, inn=257, out=600, seed=3))),  # a few rows: gemv_rows
    fast=(Fast("one_row",  # the matrix-vector product (fast_impl.h gemv) vs the plain sgemm loop
               drawn(inn=fast_cols, out=st.sampled_from([1, 3, 4, 5, 63, 64, 65, 130]),
                     bias=st.booleans()),
               lambda seed, inn, out, bias: linear_make(seed, 1, inn, out, bias),
               lambda a: [ops.linear_forward(a["x"], a["w"], a["b"])], linear_one_row_tol),
          Fast("few_rows",  # 2 to 7 rows (fast_impl.h gemv_rows) vs the plain sgemm loop
               drawn(rows=st.integers(2, 7), inn=fast_cols,
                     out=st.sampled_from([1, 3, 4, 5, 63, 64, 65, 130]), bias=st.booleans()),
               lambda seed, rows, inn, out, bias: linear_make(seed, rows, inn, out, bias),
               lambda a: [ops.linear_forward(a["x"], a["w"], a["b"])], linear_one_row_tol)),
    bad=(
        Bad(lambda: ops.linear_forward(z(2, 3, dtype=np.float64), w43), TypeError,
            r"x must have dtype float32, got float64"),
        Bad(lambda: ops.linear_forward([[1.0, 2.0, 3.0]], w43), TypeError,
            r"x must be a numpy.ndarray of float32, got list"),
        Bad(lambda: ops.linear_forward(FakeCupyArray(), w43), TypeError, r"x is a CuPy array"),
        Bad(lambda: ops.linear_forward(x23, z(3)), ValueError,
            r"w must have 2 dimensions, got shape \(3,\)"),
        Bad(lambda: ops.linear_forward(z(2, 5), w43), ValueError,
            r"x.shape\[-1\] must equal w.shape\[1\] = 3 .*got x.shape \(2, 5\)"),
        Bad(lambda: ops.linear_forward(x23, w43, z(3)), ValueError,
            r"b must have shape \(4,\).*got \(3,\)"),
        Bad(lambda: ops.linear_forward(z(3, 2).T, w43), ValueError, r"x must be C-contiguous"),
        Bad(lambda: ops.linear_forward(x23, z(0, 3)), ValueError,
            r"w must have shape \(out, in\) .*>= 1"),
    ),
    scratch="as pytfm_sgemm's, for the one product x·Wᵀ: the sgemm case",
)

LINEAR_GELU_FORWARD = Op(
    "linear_gelu_forward",
    limits=Limits(("F F F F F {0} {1} {2}",), LIN),
    exact=("F:r*b F:r*b F:r*a F:b*a F:b r a b",),
    check=Check(
        LINEAR_DRAW, linear_make,
        run=lambda a: list(ops.linear_gelu_forward(a["x"], a["w"], a["b"])),
        want=lambda a: [ref.gelu_forward(ref.linear_forward(a["x"], a["w"], a["b"])),
                        ref.linear_forward(a["x"], a["w"], a["b"])],
        # |gelu'| <= 1.13: h's error carries over to y, plus gelu's own few roundings
        tol=lambda a, want: [Tol(1.2 * linear_bound(a) + 4 * EPS32 * (1.0 + abs(want[1]))),
                             Tol(linear_bound(a))],
        outputs=("y", "h"), emu=LINEAR_EMU[:4],
        threads=(dict(rows=300, inn=200, out=90, seed=1),)),
    fast="tests/kernels/test_linear_fused.py: linear then GELU bit for bit, on every version",
    bad=(
        Bad(lambda: ops.linear_gelu_forward(z(4, 3), z(5, 3), z(4)), ValueError,
            r"b must have shape"),
        Bad(lambda: ops.linear_gelu_forward(z(4, 2), z(5, 3), z(5)), ValueError,
            r"x.shape\[-1\] must equal w.shape\[1\] = 3"),
        Bad(lambda: ops.linear_gelu_forward(z(4, 3, dtype=np.float64), z(5, 3), z(5)), TypeError,
            r"x must have dtype float32, got float64"),
    ),
    scratch="as pytfm_linear_forward's: the sgemm case",
    reference=False,
    tested_in=("tests/kernels/test_linear_fused.py::test_linear_gelu_is_linear_then_gelu_bit_for_bit",
               "tests/cuda/test_cuda_emu.py::test_linear_gelu"),
)

LINEAR_BACKWARD = Op(
    "linear_backward",
    limits=Limits(("F F F F F F {0} {1} {2}", "N F N F F N {0} {1} {2}"), LIN),
    exact=("F:r*a F:b*a F:b F:r*b F:r*a F:b*a r a b", "N F:b*a N F:r*b F:r*a F:b*a r a b"),
    check=Check(
        LINEAR_DRAW, linear_make,
        run=lambda a: list(ops.linear_backward(a["dy"], a["x"], a["w"], has_bias=a["b"] is not None,
                                               dw=a["dw0"], db=a["db0"])),
        want=linear_backward_want, tol=linear_backward_tol, outputs=("dx", "dw", "db"),
        emu=tuple(dict(d, accumulate=True) for d in LINEAR_EMU),
        threads=(dict(rows=300, inn=257, out=130, seed=3),)),
    fast="its two products are pytfm_sgemm's (tests/kernels/test_sgemm.py)",
    bad=(
        Bad(lambda: ops.linear_backward(z(2, 5), x23, w43), ValueError,
            r"dy must have shape \(2, 4\)"),
        Bad(lambda: ops.linear_backward(z(2, 4), x23, w43, has_bias=False, db=z(4)), ValueError,
            r"db was given but has_bias is False"),
        Bad(lambda: ops.linear_backward(z(2, 4), x23, w43, dw=z(3, 4)), ValueError,
            r"dw must have shape \(4, 3\)"),
        Bad(lambda: ops.linear_backward(z(2, 4), x23, w43, dw=readonly), ValueError,
            r"dw must be writable"),
        Bad(lambda: ops.linear_backward(z(2, 4), x23, w43, has_bias=None), TypeError,
            r"has_bias must be a bool .*got NoneType"),
        Bad(lambda: ops.linear_backward(z(2, 4), x23, w43, has_bias=1), TypeError,
            r"has_bias must be a bool .*got int"),
    ),
    scratch=Scratch(fast_path_only=True, setup="""
# dx = dy·W and dW += dyᵀ·x share one scratch allocation made before either is written.
# The room left fits dx's product's scratch but not dW's, so two allocations, one per
# product, would write the caller's dx before failing on dW's: the C function is called
# with the caller's dx, dw and db, as a C program calls it
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
    tested_in=("tests/kernels/test_properties.py::test_linear_backward_is_the_adjoint_of_forward",
               "tests/kernels/test_properties.py::test_parameter_gradients_accumulate"),
)

SGEMM_CALLS = ("F F F {0} {1} {2} 0 0 0.0", "F F F {0} {1} {2} 1 1 1.0")
SGEMM_EXACT = ("F:r*b F:r*a F:a*b r b a 0 0 0.0", "F:r*b F:a*r F:b*a r b a 1 1 1.0")

SGEMM = Op(
    "sgemm", limits=Limits(SGEMM_CALLS, MNK), exact=SGEMM_EXACT,
    fast="tests/kernels/test_sgemm.py: the packed kernels against pytfm_sgemm_plain",
    scratch=Scratch(fast_path_only=True, setup="""
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
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_sgemm.py::test_fast_sgemm_matches_plain_and_float64",
               "tests/cuda/test_cuda_emu.py::test_sgemm",
               "tests/cuda/test_cuda_sgemm.py::test_fast_sgemm_matches_plain_and_float64"),
)

SGEMM_PLAIN = Op(
    "sgemm_plain", limits=Limits(("F F F {0} {1} {2} 0 0 0.0", "F F F {0} {1} {2} 0 1 0.0"), MNK),
    exact=SGEMM_EXACT, fast="it is the plain loop the fast ones are held to",
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_sgemm.py::test_fast_sgemm_matches_plain_and_float64",
               "tests/cuda/test_cuda_sgemm.py::test_fast_sgemm_matches_plain_and_float64"),
)

# ---- the BF16 products (the _ex functions at PYTFM_PRECISION_BF16) and their rounding ---------

U32 = 2.0**-24  # float32's unit roundoff


def bf16_bound(k, mag):
    """|fl(s) − s| for s = Σ_p a_p·b_p (+ one more term: a bias, β·C or an accumulated dw) over
    k products of BF16 values, mag = Σ_p |a_p·b_p| + |that term|. Each product is exact in
    float32 (8 + 8 significant bits), so the error is the sums' alone; on every BF16 path
    (pytfm_get_bf16_isa) a term meets at most n = k + ⌈k/384⌉ + 3 roundings on its way into
    the result: one per add along its lane (k at most: the vdpbf16ps pair, the FMA, the plain
    loop's add, the one-row kernels' lanes and trees), one per k slice whose partial sum is
    added to C (slices of 384 values or more), the extra term's add and the final tree, so
    |err| <= γ_n·mag <= 1.01·n·u·mag (n·u < 0.01; u = 2^-24). The AVX512-BF16 path flushes a
    partial sum below 2^-126 to zero, once per add at most: (k + 2)·2^-126 more."""
    n = k + -(-k // 384) + 3
    return 1.01 * n * U32 * mag + (k + 2) * FLT_MIN


def rounded(*arrays):
    """The BF16 values the products multiply (pytfm.reference.round_bf16), in float64"""
    return [None if a is None else ref.round_bf16(a).astype(np.float64) for a in arrays]


def bf16_linear_tol(a):
    x, w = rounded(a["x"], a["w"])
    return Tol(bf16_bound(x.shape[-1], ref.linear_forward(abs(x), abs(w),
                                                          None if a["b"] is None
                                                          else abs(a["b"]))), 0.0)


def bf16_linear_want(a):
    x, w = rounded(a["x"], a["w"])
    return ref.linear_forward(x, w, a["b"])


def bf16_backward_want(a):
    dy, x, w = rounded(a["dy"], a["x"], a["w"])
    rdx, rdw, _ = ref.linear_backward(dy, x, w)
    db = ref.linear_backward(a["dy"], a["x"], a["w"])[2]  # the column sums of dy, unrounded
    return [rdx, _plus(a["dw0"], rdw), None if a["b"] is None else _plus(a["db0"], db)]


def bf16_backward_tol(a, want):
    dy, x, w = rounded(a["dy"], a["x"], a["w"])
    adx, adw, _ = ref.linear_backward(abs(dy), abs(x), abs(w))
    adb = ref.linear_backward(abs(a["dy"]), abs(a["x"]), abs(a["w"]))[2]
    out, inn = a["w"].shape
    n = a["x"].size // inn
    return [Tol(bf16_bound(out, adx), 0.0), Tol(bf16_bound(n, adw + _abs(a["dw0"])), 0.0),
            None if a["b"] is None else Tol(2 * n * EPS32 * (adb + _abs(a["db0"])))]


# the _ex twins (pytfm_cuda.h: TF32 and BF16 on the tensor cores): pytfm.ops on CuPy arrays
# runs the BF16 Checks there (at BF16_EMU: one tile, ragged, with and without a bias, held to
# the CPU's BF16 bound, which the tensor cores' FP32 sums meet); TF32, which has no CPU twin,
# and the kernels' own paths in tests/cuda/test_cuda_tensor_core.py
BF16_EMU = (dict(rows=3, inn=5, out=7, bias=True, seed=15),
            dict(rows=33, inn=64, out=65, bias=False, seed=162))
TC_LINEAR = "tests/cuda/test_cuda_tensor_core.py::test_linear_ex_twins_on_the_tensor_cores"
TC_LINEAR_FP32 = ("tests/cuda/test_cuda_tensor_core.py::"
                  "test_linear_ex_twins_at_fp32_are_the_twins_bits")

BF16_NOT_FAST = ("tests/kernels/test_bf16.py: every BF16 path (AVX512-BF16, the FP32 kernels "
                 "on rounded panels, the plain loop) against the reference on rounded inputs, and "
                 "the fallbacks bit for bit against the FP32 kernels on rounded copies")
BF16_THREADS = (dict(rows=300, inn=257, out=130, seed=3),
                dict(rows=1, inn=257, out=600, bias=False, seed=3))  # one row: the gemv

LINEAR_FORWARD_EX = Op(
    "linear_forward_ex",
    limits=Limits(("F F F F {0} {1} {2} 1",), LIN),
    exact=("F:r*b F:r*a F:b*a F:b r a b 1", "F:r*b F:r*a F:b*a N r a b 0"),
    check=Check(
        LINEAR_DRAW, linear_make,
        run=lambda a: [ops.linear_forward(a["x"], a["w"], a["b"], precision="bf16")],
        want=lambda a: [bf16_linear_want(a)], tol=lambda a, want: [bf16_linear_tol(a)],
        outputs=("y",), threads=BF16_THREADS, emu=BF16_EMU),
    fast=BF16_NOT_FAST,
    bad=(
        Bad(lambda: ops.linear_forward(x23, w43, precision="fp16"), ValueError,
            r"precision must be one of fp32, bf16, tf32; got 'fp16'"),
        Bad(lambda: ops.linear_forward(x23, w43, precision=1), TypeError,
            r"precision must be a str, one of fp32, bf16, tf32; got int"),
        Bad(lambda: ops.linear_forward(x23, w43, precision="tf32"), ValueError,
            r"precision 'tf32' runs on CuPy arrays only \(the GPU's tensor cores\)"),
        Bad(lambda: ops.linear_forward(z(2, 5), w43, precision="bf16"), ValueError,
            r"x.shape\[-1\] must equal w.shape\[1\] = 3"),
    ),
    scratch="as pytfm_sgemm_ex's, for the one product x·Wᵀ: the sgemm_ex case",
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_bf16.py::test_the_bf16_linear_layer_on_every_path",
               TC_LINEAR, TC_LINEAR_FP32),
)

LINEAR_GELU_FORWARD_EX = Op(
    "linear_gelu_forward_ex",
    limits=Limits(("F F F F F {0} {1} {2} 1",), LIN),
    exact=("F:r*b F:r*b F:r*a F:b*a F:b r a b 1",),
    check=Check(
        LINEAR_DRAW, linear_make,
        run=lambda a: list(ops.linear_gelu_forward(a["x"], a["w"], a["b"], precision="bf16")),
        want=lambda a: [ref.gelu_forward(bf16_linear_want(a)), bf16_linear_want(a)],
        # |gelu'| <= 1.13: h's error carries over to y, plus gelu's own few roundings
        tol=lambda a, want: [Tol(1.2 * bf16_linear_tol(a).atol + 4 * EPS32 * (1.0 + abs(want[1])),
                                 0.0), bf16_linear_tol(a)],
        outputs=("y", "h"), threads=(dict(rows=300, inn=200, out=90, seed=1),), emu=BF16_EMU),
    fast=BF16_NOT_FAST,
    bad=(Bad(lambda: ops.linear_gelu_forward(z(4, 3), z(5, 3), z(5), precision="tf16"),
             ValueError, r"precision must be one of fp32, bf16, tf32; got 'tf16'"),
         Bad(lambda: ops.linear_gelu_forward(z(4, 3), z(5, 3), z(5), precision="tf32"),
             ValueError, r"precision 'tf32' runs on CuPy arrays only"),),
    scratch="as pytfm_linear_forward_ex's: the sgemm_ex case",
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_bf16.py::test_linear_gelu_in_bf16_is_linear_then_gelu",
               TC_LINEAR, TC_LINEAR_FP32),
)

LINEAR_BACKWARD_EX = Op(
    "linear_backward_ex",
    limits=Limits(("F F F F F F {0} {1} {2} 1", "N F N F F N {0} {1} {2} 1"), LIN),
    exact=("F:r*a F:b*a F:b F:r*b F:r*a F:b*a r a b 1", "N F:b*a N F:r*b F:r*a F:b*a r a b 1"),
    check=Check(
        LINEAR_DRAW, lambda **d: linear_make(**d, accumulate=True),
        run=lambda a: list(ops.linear_backward(a["dy"], a["x"], a["w"],
                                               has_bias=a["b"] is not None, dw=a["dw0"],
                                               db=a["db0"], precision="bf16")),
        want=bf16_backward_want, tol=bf16_backward_tol, outputs=("dx", "dw", "db"),
        threads=(dict(rows=300, inn=257, out=130, seed=3),),
        emu=BF16_EMU),
    fast=BF16_NOT_FAST,
    bad=(Bad(lambda: ops.linear_backward(z(2, 4), x23, w43, precision="BF16"), ValueError,
             r"precision must be one of fp32, bf16, tf32; got 'BF16'"),
         Bad(lambda: ops.linear_backward(z(2, 4), x23, w43, precision="tf32"), ValueError,
             r"precision 'tf32' runs on CuPy arrays only"),),
    scratch="as pytfm_linear_backward's, one allocation for both products: the sgemm_ex case",
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_bf16.py::test_the_bf16_linear_layer_on_every_path",
               TC_LINEAR, TC_LINEAR_FP32),
)

SGEMM_EX = Op(
    "sgemm_ex",
    limits=Limits(tuple(t + " 1" for t in SGEMM_CALLS), MNK),
    exact=tuple(t + " 1" for t in SGEMM_EXACT) + ("F:r*b F:r*a F:a*b r b a 0 1 0.5 0",),
    fast=BF16_NOT_FAST,
    scratch=Scratch(fast_path_only=True, setup="""
m, n, k = 64, 1024, 192
a, b, c = randn(m, k), randn(k, n), np.empty((m, n), np.float32)
pc, pa, pb = (ffi.from_buffer("float[]", t) for t in (c, a, b))
def call():
    check(lib.pytfm_sgemm_ex(pc, pa, pb, m, n, k, 0, 0, 0.0, lib.PYTFM_PRECISION_BF16))
    return [c.copy()]
watched = lambda: [c]  # a failed product writes nothing
out_bytes = 0  # C is the caller's
# C split by columns (m < n), 2 threads: per thread an MC×KC block of op(A), packed always in
# BF16 (144×384 floats, or 144 rows × 384 pairs of k on AVX512-BF16: the same bytes), and its
# own panel of B for its half of C's 1024 columns (384 × 512 floats or pairs)
scratch_bytes = 4 * threads * (144 * 384 + 384 * 512)
"""),
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_bf16.py::test_the_bf16_sgemm_on_every_path",
               "tests/kernels/test_bf16.py::test_the_fallbacks_are_the_fp32_kernels_on_rounded_copies",
               "tests/cuda/test_cuda_tensor_core.py::"
               "test_tensor_core_sgemm_matches_the_reference_on_rounded_inputs",
               "tests/cuda/test_cuda_tensor_core.py::"
               "test_both_orders_both_cp_async_modes_and_offset_views_give_the_same_bits",
               "tests/cuda/test_cuda_tensor_core.py::test_fp32_through_the_ex_twin_is_pytfm_sgemm_cuda"),
)


def round_make(seed, shape, scale=1.0):
    """Normal values times scale, with finite special values mixed in: ties either way, ±0,
    subnormals, the largest BF16 (NaN, inf and the values that round to inf: test_bf16.py,
    bit for bit)"""
    rng = np.random.default_rng(seed)
    x = f32(rng, shape, scale).ravel()
    special = np.array([0.0, -0.0, 1e-40, -1e-42, ref.BF16_MAX, -ref.BF16_MAX, 1.0 + 2**-8,
                        1.0 + 3 * 2**-8, -(1.0 + 2**-8), 2.0**-126], np.float32)
    picks = rng.integers(0, 3 * len(special), x.size)
    x = np.where(picks < len(special), special[np.minimum(picks, len(special) - 1)], x)
    return dict(seed=seed, x=x.astype(np.float32).reshape(shape))


ROUND_BF16 = Op(
    "round_bf16",
    limits=Limits(("F F {0}",), COUNT),
    exact=("F:r*a F:r*a r*a",),
    check=Check(
        drawn(shape=st.lists(awkward, min_size=1, max_size=3), scale=scales), round_make,
        run=lambda a: [ops.round_bf16(a["x"])], want=lambda a: [ref.round_bf16(a["x"])],
        tol=lambda a, want: [EXACT], outputs=("y",),
        threads=(dict(shape=(300, 257), seed=3),)),
    fast="one version, element by element: tests/kernels/test_bf16.py checks its bits",
    bad=(Bad(lambda: ops.round_bf16(z(3, dtype=np.float64)), TypeError,
             r"x must have dtype float32, got float64"),
         Bad(lambda: ops.round_bf16(FakeCupyArray()), TypeError, r"x is a CuPy array")),
    cuda=False,
    tested_in=("tests/kernels/test_bf16.py::test_rounding_matches_numpy_bit_for_bit",),
)

# ---- BF16 weights (pytfm_linear_forward_bf16w, pytfm_embedding_forward_bf16w) ----------------

def bf16_bits(a):
    """The BF16 bits of a float32 array, by the reference's rounding (not the op's)."""
    return (ref.round_bf16(a).view(np.uint32) >> 16).astype(np.uint16)


def bf16_special(rng, bits):
    """bits with about one in eight made a BF16 subnormal (of either sign) and one in eight a
    signed zero: the values whose widening a product flushes, or whose sign it must keep"""
    pick = rng.integers(0, 8, bits.shape)
    sign = (rng.integers(0, 2, bits.shape) << 15).astype(np.uint16)
    sub = rng.integers(1, 128, bits.shape).astype(np.uint16) | sign
    return np.where(pick == 0, sub, np.where(pick == 1, sign, bits)).astype(np.uint16)


def linear_bf16w_make(seed, rows, inn, out, bias=True, batch=1):
    a = linear_make(seed, rows, inn, out, bias, batch)
    a["w16"] = bf16_special(np.random.default_rng(seed + 1), bf16_bits(a["w"]))
    return a


def linear_bf16w_tol(a):
    """bf16_bound on the magnitudes of what the product multiplies: x rounded, W as w16 holds
    it (subnormals flushed, as the reference takes them)"""
    x = ref.round_bf16(a["x"]).astype(np.float64)
    mag = ref.linear_forward_bf16w(abs(x), a["w16"] & 0x7FFF,
                                   None if a["b"] is None else abs(a["b"]))
    return Tol(bf16_bound(x.shape[-1], mag), 0.0)


h43 = np.zeros((4, 3), np.uint16)

LINEAR_FORWARD_BF16W = Op(
    "linear_forward_bf16w",
    limits=Limits(("F F H F {0} {1} {2}",), LIN),
    exact=("F:r*b F:r*a H:b*a F:b r a b", "F:r*b F:r*a H:b*a N r a b"),
    check=Check(
        LINEAR_DRAW, linear_bf16w_make,
        run=lambda a: [ops.linear_forward_bf16w(a["x"], a["w16"], a["b"])],
        want=lambda a: [ref.linear_forward_bf16w(a["x"], a["w16"], a["b"])],
        tol=lambda a, want: [linear_bf16w_tol(a)], outputs=("y",),
        threads=BF16_THREADS + (dict(rows=5, inn=300, out=1000, seed=3),)),  # few rows, streamed
    fast=("tests/kernels/test_bf16_weights.py: the bits of pytfm_linear_forward_ex at BF16 on "
          "W's widening, on every BF16 path, whose fast kernels test_bf16.py holds to the plain"),
    bad=(
        Bad(lambda: ops.linear_forward_bf16w(x23, w43), TypeError,
            r"w16 must be a uint16 array of BF16 bits .*got dtype float32: make them with "
            r"pytfm.ops.to_bf16_bits"),
        Bad(lambda: ops.linear_forward_bf16w(x23, [[0] * 3] * 4), TypeError,
            r"w16 must be a numpy.ndarray of uint16, got list"),
        Bad(lambda: ops.linear_forward_bf16w(FakeCupyArray(), h43), TypeError,
            r"x is a CuPy array, but linear_forward_bf16w runs on NumPy arrays only"),
        Bad(lambda: ops.linear_forward_bf16w(x23, FakeCupyArray()), TypeError,
            r"w16 is a CuPy array, .* on the GPU widen the bits \(from_bf16_bits\)"),
        Bad(lambda: ops.linear_forward_bf16w(x23, h43[0]), ValueError,
            r"w16 must have 2 dimensions, got shape \(3,\)"),
        Bad(lambda: ops.linear_forward_bf16w(x23, np.zeros((0, 3), np.uint16)), ValueError,
            r"w16 must have shape \(out, in\) with both >= 1, got \(0, 3\)"),
        Bad(lambda: ops.linear_forward_bf16w(x23, np.zeros((3, 4), np.uint16).T), ValueError,
            r"w16 must be C-contiguous"),
        Bad(lambda: ops.linear_forward_bf16w(z(2, 5), h43), ValueError,
            r"x.shape\[-1\] must equal w16.shape\[1\] = 3 .*got x.shape \(2, 5\)"),
        Bad(lambda: ops.linear_forward_bf16w(z(2, 3, dtype=np.float64), h43), TypeError,
            r"x must have dtype float32, got float64"),
        Bad(lambda: ops.linear_forward_bf16w(x23, h43, z(3)), ValueError,
            r"b must have shape \(4,\) \(w16.shape\[0\]\), got \(3,\)"),
    ),
    scratch=Scratch(setup="""
# the widening path (any BF16 path but AVX512-BF16, whose packing is pytfm_sgemm_ex's case):
# 64 rows take the packed product, which widens W a block of rows at a time into scratch
pytfm.set_max_isa("avx512")
rows, inn, out = 64, 256, 1024
x, w = randn(rows, inn), randn(out, inn)
w16 = ops.to_bf16_bits(w)
call = lambda: [ops.linear_forward_bf16w(x, w16)]
out_bytes = 4 * rows * out  # y
# a block of 2^18 / 256 = 1024 rows of W widened (all of it) and 64 × 1024 floats of its
# product, in one allocation made before the block's own product asks for its packing
scratch_bytes = 4 * (1024 * inn + rows * 1024)
"""),
    cuda=False,  # BF16-only weights are a CPU inference mode: the C model on the GPU widens them
    tested_in=("tests/kernels/test_bf16_weights.py::test_the_bits_of_the_bf16_product_on_every_path",
               "tests/kernels/test_bf16_weights.py::test_the_thresholds_of_each_path"),
)


# ---- softmax ----------------------------------------------------------------------------------

def softmax_make(seed, rows, cols, scale=1.0, offset=0.0):
    rng = np.random.default_rng(seed)
    x = f32(rng, (rows, cols), scale, offset)
    return dict(seed=seed, x=x, dy=f32(rng, x.shape))


def softmax_saved(**drawn_values):
    a = softmax_make(**drawn_values)
    a["y"] = ops.softmax_forward(a["x"])
    return a


def softmax_rtol(x, roundings):
    """Inputs of size |x| are known to half an ulp, which moves exp() by that much, relatively:
    `roundings` of them."""
    return 1e-5 + roundings * EPS32 * float(abs(x - x.max(axis=-1, keepdims=True)).max())


SOFTMAX_DRAW = drawn(rows=awkward, cols=awkward, scale=scales,
                     offset=st.sampled_from([0.0, -50.0, 1e4]))
# a warp per row (up to 1024 columns) and a block per row (past it)
SOFTMAX_EMU = tuple(dict(rows=r, cols=c, scale=3.0, offset=-20.0, seed=r * c)
                    for r, c in [(1, 1), (3, 7), (9, 32), (2, 33), (70, 67), (3, 1024),
                                 (2, 1025), (4, 1500)])
SOFTMAX_FAST_DRAW = drawn(rows=fast_rows, cols=fast_cols, scale=st.sampled_from([0.01, 1.0, 20.0]))


def softmax_fast_tol(a, got, plain):
    """y = e^(x − max) / Σ: both sides exponentiate the same float x − max (the fast e^ within
    2 ulp, expf within 1); the fast sum of positive terms rounds k times (the plain one sums
    in double); 1/Σ and the product round once each side: relative to each y, however small
    (but an e^ under FLT_MIN, which expf keeps as a subnormal, the fast one flushes to 0);
    twice the bound, as the others of test_fast"""
    return [Tol(2 * FLT_MIN, 2 * EPS32 * (sum_roundings(a["x"].shape[1]) / 2 + 5))]


def softmax_backward_fast_tol(a, got, plain):
    """dx = y·(dy − Σ dy·y): the sum (float, in other order) carries cols·eps·Σ|dy·y|"""
    dy, y = a["dy"], a["y"]
    dot_err = (dy.shape[1] * EPS32 * abs(dy * y).sum(axis=1, keepdims=True)
               + EPS32 * abs(dy)) * y
    return [Tol(4 * dot_err, 1e-5)]


SOFTMAX_FORWARD = Op(
    "softmax_forward",
    limits=Limits(("F F {0} {1}",), RC),
    exact=("F:r*a F:r*a r a",),
    check=Check(
        SOFTMAX_DRAW, softmax_make,
        run=lambda a: [ops.softmax_forward(a["x"])],
        want=lambda a: [ref.softmax_forward(a["x"])],
        tol=lambda a, want: [Tol(1e-7, softmax_rtol(a["x"], 2))],
        emu_tol=lambda a, want: [Tol(1e-7, softmax_rtol(a["x"], 4))],
        outputs=("y",), emu=SOFTMAX_EMU, threads=(dict(rows=300, cols=257, seed=3),)),
    fast=(Fast("rows", SOFTMAX_FAST_DRAW, softmax_make,
               lambda a: [ops.softmax_forward(a["x"])], softmax_fast_tol),),
    bad=(
        Bad(lambda: ops.softmax_forward(z(2, 0)), ValueError, r"x.shape\[-1\] .* must be >= 1"),
        Bad(lambda: ops.softmax_forward(z(2, 3, dtype=np.int32)), TypeError,
            r"x must have dtype float32"),
        Bad(lambda: ops.softmax_forward(z()), ValueError, r"x must have at least 1 dimension"),
    ),
    tested_in=("tests/kernels/test_properties.py::"
               "test_softmax_rows_sum_to_one_and_ignore_a_row_constant",
               "tests/cuda/test_cuda_rows.py::test_softmax_every_column_class"),
)

SOFTMAX_BACKWARD = Op(
    "softmax_backward",
    limits=Limits(("F F F {0} {1}",), RC),
    exact=("F:r*a F:r*a F:r*a r a",),
    check=Check(
        SOFTMAX_DRAW, softmax_saved,
        run=lambda a: [ops.softmax_backward(a["dy"], a["y"])],
        want=lambda a: [ref.softmax_backward(a["dy"], a["y"])],
        tol=lambda a, want: [Tol(4 * a["x"].shape[1] * EPS32 * amax(a["dy"]), 1e-5)],
        outputs=("dx",), emu=SOFTMAX_EMU, threads=(dict(rows=300, cols=257, seed=3),)),
    fast=(Fast("rows", SOFTMAX_FAST_DRAW, softmax_saved,
               lambda a: [ops.softmax_backward(a["dy"], a["y"])], softmax_backward_fast_tol),),
    bad=(Bad(lambda: ops.softmax_backward(z(2, 4), x23), ValueError,
             r"dy must have shape \(2, 3\)"),),
    tested_in=("tests/cuda/test_cuda_rows.py::test_softmax_every_column_class",),
)


# ---- layernorm --------------------------------------------------------------------------------

def layernorm_make(seed, rows, cols, scale=1.0, offset=0.0, eps=1e-5, accumulate=False):
    """x at `scale`, offset·scale off zero; dw0, db0 to accumulate into when asked."""
    rng = np.random.default_rng(seed)
    x = f32(rng, (rows, cols), scale, offset * scale)
    if eps == 0.0 and cols == 1:
        eps = 1e-5  # a single column has zero variance: rstd would be inf
    w, b = f32(rng, (cols,)), f32(rng, (cols,))
    dy = f32(rng, x.shape)
    dw0 = f32(rng, (cols,)) if accumulate else None
    db0 = f32(rng, (cols,)) if accumulate else None
    return dict(seed=seed, scale=scale, eps=eps, x=x, w=w, b=b, dy=dy, dw0=dw0, db0=db0)


def layernorm_saved(**drawn_values):
    a = layernorm_make(**drawn_values)
    a["y"], a["mean"], a["rstd"] = ops.layernorm_forward(a["x"], a["w"], a["b"], a["eps"])
    return a


def layernorm_emu_tol(a, want):
    """The CUDA kernels sum in another order than the C ones: sums of cols terms, each
    rounding about sqrt(cols) times (a safety factor of 8)."""
    tol = 8 * np.sqrt(a["x"].shape[1]) * EPS32
    w, b = a["w"], a["b"]
    return [Tol(tol * 10 * (abs(w) * 4 + abs(b)), 1e-5), Tol(tol * 5, tol), Tol(0.0, tol * 10)]


def layernorm_backward_tol(a, want):
    rows, cols = a["x"].shape
    g = float(abs(a["dy"] * a["w"]).max() * a["rstd"].max())
    s = 1e-5 * rows * amax(a["dy"])
    return [Tol(4 * cols * EPS32 * g, 1e-4), Tol(s + 2 * EPS32 * _abs(a["dw0"])),
            Tol(s + 2 * EPS32 * _abs(a["db0"]))]


def layernorm_backward_emu_tol(a, want):
    rows, cols = a["x"].shape
    x, mean, rstd = a["x"], a["mean"], a["rstd"]
    gmax = float(abs(a["dy"] * a["w"]).max() * rstd.max())
    big = 4 * rows * EPS32 * amax(a["dy"]) * (1 + float(abs(x - mean[:, None]).max()
                                                          * rstd.max()))
    return [Tol(8 * cols * EPS32 * gmax, 1e-4), Tol(big + 2 * EPS32 * _abs(a["dw0"])),
            Tol(big + 2 * EPS32 * _abs(a["db0"]))]


def layernorm_backward_want(a):
    rdx, rdw, rdb = ref.layernorm_backward(a["dy"], a["x"], a["w"], a["mean"], a["rstd"])
    return [rdx, _plus(a["dw0"], rdw), _plus(a["db0"], rdb)]


def layernorm_fast_make(seed, rows, cols, offset):
    return layernorm_make(seed, rows, cols, 1.0, offset)


def layernorm_fast_tol(a, got, plain, backward=True):
    """(atol) of each LayerNorm output, fast (float sums) vs plain (double sums), from the
    float32 error of the fast computation (EPS32 = 2u covers a rounding on each side). mean and
    rstd get a priori bounds; y, dx, dw inherit, to first order, the mean and rstd differences
    actually seen (each held to its own bound), plus the roundings of their own steps."""
    x, w, eps = a["x"], a["w"], np.float64(np.float32(a["eps"]))
    rows, cols = x.shape
    k = sum_roundings(cols)
    X, W = (t.astype(np.float64) for t in (x, w))
    mu = X.mean(axis=1, keepdims=True)
    var = ((X - mu) ** 2).mean(axis=1, keepdims=True)
    rs = 1 / np.sqrt(var + eps)
    mean_f, rstd_f = (t.astype(np.float64)[:, None] for t in got[1:3])
    mean_p, rstd_p = (t.astype(np.float64)[:, None] for t in plain[1:3])
    # mean: x0 + d (x0 the row's first value), d = Σ(x − x0)/cols a float sum: off by tol_d,
    # then rounded once more when stored
    X0 = X[:, :1]
    tol_d = EPS32 * k * abs(X - X0).mean(axis=1, keepdims=True)
    tol_mean = tol_d[:, 0] + EPS32 * abs(mu[:, 0])
    # rstd: Σ((x − x0) − d)² = Σ(x − μ)² + cols·dd², its float sum off by (k + 5) roundings
    # (two subtracts, square, sum, divide, + eps); sqrt halves that; sqrt and 1/· round once more
    dd = tol_d + abs(mean_f - mu)
    tol_rstd = rs * (0.5 * (dd**2 + (k + 5) * EPS32 * var) / (var + eps) + 2 * EPS32)
    # y = x̂·w + b, x̂ = ((x − x0) − d)·rstd: the fast x̂ is off by rstd·(d's error and the two
    # subtractions' roundings) + (x − μ)·(rstd_f − rstd) + its product's rounding (the plain one
    # casts once); ·w and + b round once each side
    xhat = (X - mu) * rs
    dxhat = rstd_f * (tol_d + EPS32 * (abs(X - X0) + abs(X - mu)))
    dxhat += abs(X - mu) * abs(rstd_f - rs) + 2 * EPS32 * abs(xhat)
    tol_y = abs(W) * dxhat + EPS32 * (abs(xhat * W) + abs(plain[0]))
    # twice each bound: for the second-order terms left out
    tols = [Tol(2 * t, 0.0) for t in (tol_y, tol_mean, tol_rstd[:, 0])]
    if not backward:
        return tols
    G = a["dy"].astype(np.float64)
    # backward: each side rebuilds x̂ from its own saved mean and rstd, in float
    xb = (X - mean_p) * rstd_p
    dxb = rstd_f * abs(mean_f - mean_p) + abs(X - mean_p) * abs(rstd_f - rstd_p)
    dxb += 2 * EPS32 * abs(xb)
    # dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·w (the same floats on both sides); the
    # two means are float sums (k roundings) and mean(g·x̂) inherits x̂'s difference
    g = (a["dy"] * w).astype(np.float64)
    gm, gxm = g.mean(axis=1, keepdims=True), (g * xb).mean(axis=1, keepdims=True)
    dgm = EPS32 * (k * abs(g).mean(axis=1, keepdims=True) + abs(gm))
    dgxm = (abs(g) * dxb).mean(axis=1, keepdims=True)
    dgxm += EPS32 * ((k + 1) * abs(g * xb).mean(axis=1, keepdims=True) + abs(gxm))
    inner = abs(g - gm) + abs(xb * gxm)
    tol_dx = abs(rstd_f - rstd_p) * inner + rstd_p * (dgm + dxb * abs(gxm) + abs(xb) * dgxm)
    tol_dx += 3 * EPS32 * rstd_p * (abs(g) + abs(gm) + abs(xb * gxm))
    # dw = Σ_rows dy·x̂, db = Σ_rows dy: float sums over rows on both sides (the fast one in
    # 16 chunks, the plain one in row order), at most rows + 1 roundings each (the product)
    tol_dw = (abs(G) * dxb).sum(axis=0) + (rows + 1) * EPS32 * abs(G * xb).sum(axis=0)
    tol_db = rows * EPS32 * abs(G).sum(axis=0)
    return tols + [Tol(2 * t, 0.0) for t in (tol_dx, tol_dw, tol_db)]


def layernorm_chain(a):
    """The forward, then the backward fed what this kernel version's forward saved."""
    y, mean, rstd = ops.layernorm_forward(a["x"], a["w"], a["b"], a["eps"])
    return [y, mean, rstd, *ops.layernorm_backward(a["dy"], a["x"], a["w"], mean, rstd)]


LAYERNORM_DRAW = drawn(rows=awkward, cols=awkward, scale=scales,
                       offset=st.sampled_from([0.0, 3.0, -20.0]),
                       eps=st.sampled_from([1e-5, 1e-3, 0.0]))
LAYERNORM_EMU = tuple(dict(rows=r, cols=c, scale=2.0, offset=1.5, seed=r + c)
                      for r, c in [(1, 1), (3, 7), (9, 32), (2, 33), (70, 67), (3, 1024),
                                   (2, 1025), (4, 1500)])
# rows past 16 make the fast backward sum dw, db in 16 chunks of rows
LAYERNORM_FAST_DRAW = drawn(rows=st.sampled_from([1, 2, 3, 7, 17, 40]), cols=fast_cols,
                            offset=st.sampled_from([0.0, 3.0, -100.0]))

LAYERNORM_FORWARD = Op(
    "layernorm_forward",
    limits=Limits(("F F F F F F {0} {1} 1e-5",), RC),
    exact=("F:r*a F:r F:r F:r*a F:a F:a r a 1e-5",),
    check=Check(
        LAYERNORM_DRAW, layernorm_make,
        run=lambda a: list(ops.layernorm_forward(a["x"], a["w"], a["b"], a["eps"])),
        want=lambda a: list(ref.layernorm_forward(a["x"], a["w"], a["b"], a["eps"])),
        tol=lambda a, want: [Tol(1e-5 * (abs(a["w"]) * 4 + abs(a["b"]))),
                             Tol(1e-6 * a["scale"], 1e-6), Tol(0.0, 1e-5)],
        emu_tol=layernorm_emu_tol, outputs=("y", "mean", "rstd"), emu=LAYERNORM_EMU,
        threads=(dict(rows=300, cols=257, seed=3),)),
    fast=(Fast("rows", LAYERNORM_FAST_DRAW, layernorm_fast_make,
               lambda a: list(ops.layernorm_forward(a["x"], a["w"], a["b"], a["eps"])),
               lambda a, got, plain: layernorm_fast_tol(a, got, plain, backward=False)),),
    bad=(
        Bad(lambda: ops.layernorm_forward(x23, z(4), z(3)), ValueError,
            r"w must have shape \(3,\)"),
        Bad(lambda: ops.layernorm_forward(x23, z(3), z(3), eps=-1.0), ValueError,
            r"eps must be >= 0, got -1"),
        Bad(lambda: ops.layernorm_forward(x23, z(3), z(3), eps=float("nan")), ValueError,
            r"eps must be finite"),
        Bad(lambda: ops.layernorm_forward(x23, z(3), z(3), eps="small"), TypeError,
            r"eps must be a real number, got str"),
        Bad(lambda: ln(HUGE), ValueError,
            r"eps must fit in float32 \(\|eps\| <= 3.402823e\+38\), got an integer of 1329 bits"),
        Bad(lambda: ln(1e39), ValueError, r"eps must fit in float32 .*got 1e\+39"),
        Bad(lambda: ln(np.float64(-1e300)), ValueError, r"eps must fit in float32", "eps-1e300"),
        Bad(lambda: ln(True), TypeError, r"eps must be a real number, got bool"),
        Bad(lambda: ln(np.False_), TypeError, r"eps must be a real number, got bool",
            "eps-np-False"),
        Bad(lambda: ln(float("inf")), ValueError, r"eps must be finite, got inf"),
        Bad(lambda: ln(np.float32("nan")), ValueError, r"eps must be finite, got nan"),
        Bad(lambda: ln(np.float16(1e-3)), None, None, "any-numpy-real-is-accepted"),
    ),
    tested_in=("tests/kernels/test_properties.py::"
               "test_layernorm_ignores_row_shift_and_positive_scale",
               "tests/kernels/test_extremes.py::test_layernorm_of_huge_and_tiny_rows",
               "tests/cuda/test_cuda_emu.py::test_layernorm_of_rows_far_from_zero"),
)

LAYERNORM_BACKWARD = Op(
    "layernorm_backward",
    limits=Limits(("F F F F F F F F {0} {1}",), RC),
    exact=("F:r*a F:a F:a F:r*a F:r*a F:a F:r F:r r a",),
    check=Check(
        LAYERNORM_DRAW, layernorm_saved,
        run=lambda a: list(ops.layernorm_backward(a["dy"], a["x"], a["w"], a["mean"], a["rstd"],
                                                  dw=a["dw0"], db=a["db0"])),
        want=layernorm_backward_want, tol=layernorm_backward_tol,
        emu_tol=layernorm_backward_emu_tol, outputs=("dx", "dw", "db"),
        emu=tuple(dict(d, accumulate=True) for d in LAYERNORM_EMU),
        threads=(dict(rows=300, cols=257, seed=3),)),
    fast=(Fast("chain", LAYERNORM_FAST_DRAW, layernorm_fast_make, layernorm_chain,
               layernorm_fast_tol),),
    bad=(Bad(lambda: ops.layernorm_backward(x23, x23, z(3), z(3), z(2)), ValueError,
             r"mean must have shape \(2,\)"),),
    scratch=Scratch("""
rows, cols = 16, 65536
x, dy, w, b = randn(rows, cols), randn(rows, cols), randn(cols), randn(cols)
y, mean, rstd = ops.layernorm_forward(x, w, b)
call = lambda: list(ops.layernorm_backward(dy, x, w, mean, rstd))
out_bytes = 4 * (rows * cols + 2 * cols)  # dx, dw, db
scratch_bytes = 4 * 2 * min(rows, 16) * cols  # backward_fast: dw, db per chunk of rows
"""),
    tested_in=("tests/cuda/test_cuda_rows.py::test_layernorm_every_column_class",),
)


# ---- rope and the QKV split -------------------------------------------------------------------

def rope_make(seed, B, T, H, half, start=0, batched=False, base=10000.0):
    """x [B, T, H, 2·half] at positions start + t, shifted per batch when batched"""
    rng = np.random.default_rng(seed)
    x = f32(rng, (B, T, H, 2 * half))
    pos = start + np.arange(T, dtype=np.int64)
    if batched:
        pos = pos + rng.integers(0, 100, size=(B, 1))
    return dict(seed=seed, base=base, x=x, pos=pos, dy=f32(rng, x.shape))


def rope_fast_make(seed, B, T, H, D, per_batch):
    rng = np.random.default_rng(seed)
    x = f32(rng, (B, T, H, D))
    return dict(x=x, pos=rng.integers(0, 5000, (B, T) if per_batch else T))


ROPE_DRAW = drawn(B=small, T=awkward, H=small, half=st.sampled_from([1, 2, 3, 4, 8, 16, 32]),
                  start=st.sampled_from([0, 1, 1000, 123456]), batched=st.booleans(),
                  base=st.sampled_from([10000.0, 500.0, 1e6]))
ROPE_EMU = tuple(dict(B=B, T=T, H=H, half=D // 2, batched=batched, start=1000, seed=B * T * H)
                 for B, T, H, D in [(1, 1, 1, 2), (2, 3, 5, 6), (1, 33, 2, 64)]
                 for batched in (False, True))
# the tabled RoPE computes the same expressions as the plain one: the same bits
ROPE_FAST_DRAW = drawn(B=st.sampled_from([1, 3]), T=st.sampled_from([1, 5, 64]),
                       H=st.sampled_from([1, 4]), D=st.sampled_from([2, 6, 32, 34]),
                       per_batch=st.booleans())
ROPE_SCRATCH = """
B, T, H, D = 1, 4096, 1, 512
x, pos = randn(B, T, H, D), np.arange(T)
call = lambda: [ops.{name}(x, pos)]
out_bytes = 4 * B * T * H * D
scratch_bytes = 4 * T * D  # rotate_tabled: cos and sin, [T, D/2] each (pos shared by the batch)
"""

ROPE_FORWARD = Op(
    "rope_forward",
    limits=Limits(("F F I {0} {1} {2} {3} {4} 10000.0",), ROPE),
    exact=("F:2*r*b*2*a F:2*r*b*2*a I:2*r:1000 2 r b 2*a r 10000.0",
           "F:2*r*b*2*a F:2*r*b*2*a I:r:1000 2 r b 2*a 0 10000.0"),
    check=Check(
        ROPE_DRAW, rope_make,
        run=lambda a: [ops.rope_forward(a["x"], a["pos"], a["base"])],
        want=lambda a: [ref.rope_forward(a["x"], a["pos"], a["base"])],
        tol=lambda a, want: [Tol(4 * EPS32 * amax(a["x"]))],
        outputs=("y",), emu=ROPE_EMU, same_bits_as_c=True,
        threads=(dict(B=2, T=100, H=3, half=8, seed=3),)),
    fast=(Fast("same_bits", ROPE_FAST_DRAW, rope_fast_make,
               lambda a: [ops.rope_forward(a["x"], a["pos"])], lambda a, got, plain: [EXACT]),),
    bad=(
        Bad(lambda: ops.rope_forward(z(2, 3, 4), i64(0, 1, 2)), ValueError,
            r"x must have 4 dimensions"),
        Bad(lambda: ops.rope_forward(z(1, 3, 2, 5), i64(0, 1, 2)), ValueError,
            r"x.shape\[3\] \(head dim D\) must be even and >= 2"),
        Bad(lambda: ops.rope_forward(z(1, 3, 2, 4), np.arange(3.0)), TypeError,
            r"pos must have dtype int64, got float64"),
        Bad(lambda: ops.rope_forward(z(1, 3, 2, 4), i64(0, 1)), ValueError,
            r"pos must have shape \(T,\) = \(3,\) or \(B, T\) = \(1, 3\)"),
        Bad(lambda: ops.rope_forward(z(1, 3, 2, 4), i64(0, 1, 2), base=0.0), ValueError,
            r"base must be finite and > 0"),
        Bad(lambda: rope(HUGE), ValueError,
            r"base must fit in float64 \(\|base\| <= 1.797693e\+308\)"),
        Bad(lambda: rope(True), TypeError, r"base must be a real number, got bool"),
        Bad(lambda: rope(float("nan")), ValueError, r"base must be finite and > 0, got nan"),
        Bad(lambda: rope(1e300), None, None, "a-double-holds-1e300"),
    ),
    scratch=Scratch(ROPE_SCRATCH.format(name="rope_forward")),
    tested_in=("tests/kernels/test_properties.py::test_rope_is_a_rotation",
               "tests/cuda/test_cuda_emu.py::test_rope"),
)

ROPE_BACKWARD = Op(
    "rope_backward",
    limits=Limits(("F F I {0} {1} {2} {3} {4} 10000.0",), ROPE),
    exact=ROPE_FORWARD.exact,
    check=Check(
        ROPE_DRAW, rope_make,
        run=lambda a: [ops.rope_backward(a["dy"], a["pos"], a["base"])],
        want=lambda a: [ref.rope_backward(a["dy"], a["pos"], a["base"])],
        tol=lambda a, want: [Tol(4 * EPS32 * amax(a["dy"]))],
        outputs=("dx",), emu=ROPE_EMU, same_bits_as_c=True,
        threads=(dict(B=2, T=100, H=3, half=8, seed=3),)),
    fast=(Fast("same_bits", ROPE_FAST_DRAW, rope_fast_make,
               lambda a: [ops.rope_backward(a["x"], a["pos"])], lambda a, got, plain: [EXACT]),),
    bad=(Bad(lambda: ops.rope_backward(z(1, 3, 2, 4), i64(0, 1, 2), base=None), TypeError,
             r"base must be a real number"),),
    scratch=Scratch(ROPE_SCRATCH.format(name="rope_backward")),
    tested_in=("tests/cuda/test_cuda_emu.py::test_rope",),
)


def qkv_make(seed, B, T, H, D, pos="shared"):
    """qkv [B, T, 3, H, D], the gradients dq, dk, dv; positions shared by the batch, per batch,
    or none (no rotation)"""
    rng = np.random.default_rng(seed)
    qkv = f32(rng, (B, T, 3, H, D))
    dq, dk, dv = (f32(rng, (B, T, H, D)) for _ in range(3))
    if pos == "none":
        p = None
    elif pos == "shared":
        p = np.arange(T, dtype=np.int64) + int(rng.integers(0, 100))
    else:
        p = rng.integers(-50, 5000, (B, T)).astype(np.int64)
    return dict(seed=seed, qkv=qkv, dq=dq, dk=dk, dv=dv, pos=p)


def _rotated(parts, pos, rotate):
    return [rotate(p, pos) if pos is not None else p for p in parts[:2]] + parts[2:]


def qkv_parts(a):
    return [np.ascontiguousarray(a["qkv"][:, :, i]) for i in range(3)]


def qkv_forward_tol(a, want):
    """q and k: RoPE's bound on their slices; v: a copy"""
    if a["pos"] is None:
        return [EXACT] * 3
    return [Tol(4 * EPS32 * amax(p)) for p in qkv_parts(a)[:2]] + [EXACT]


def qkv_backward_tol(a, want):
    if a["pos"] is None:
        return [EXACT]
    atol = np.stack([np.full(a["dq"].shape, 4 * EPS32 * amax(a["dq"])),
                     np.full(a["dk"].shape, 4 * EPS32 * amax(a["dk"])),
                     np.zeros(a["dv"].shape)], axis=2)
    return [Tol(atol)]


QKV_DRAW = drawn(B=st.integers(1, 3), T=st.integers(1, 9), H=st.integers(1, 4),
                 D=st.sampled_from([2, 4, 6, 8, 16, 64]),
                 pos=st.sampled_from(["shared", "per-batch", "none"]))
QKV_EMU = tuple(dict(B=B, T=T, H=H, D=D, pos=pos, seed=B * T * H * D)
                for B, T, H, D, pos in [(1, 1, 1, 2, "shared"), (1, 1, 3, 1, "none"),
                                        (2, 3, 5, 6, "per-batch"), (1, 33, 2, 64, "none"),
                                        (3, 7, 1, 10, "shared")])
QKV_NOT_FAST = "tests/kernels/test_qkv_split.py: slicing then RoPE bit for bit, on every version"

QKV_SPLIT_FORWARD = Op(
    "qkv_split_forward",
    limits=Limits(("F F F F I {0} {1} {2} {3} {4} 10000.0 1",), ROPE),
    exact=("F:2*r*b*2*a F:2*r*b*2*a F:2*r*b*2*a F:2*r*3*b*2*a I:2*r:1000 2 r b 2*a r 10000.0 1",
           "F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*3*b*a N 2 r b a 0 10000.0 0"),
    check=Check(
        QKV_DRAW, qkv_make,
        run=lambda a: list(ops.qkv_split_forward(a["qkv"], a["pos"])),
        want=lambda a: _rotated(qkv_parts(a), a["pos"], ref.rope_forward),
        tol=qkv_forward_tol, outputs=("q", "k", "v"), emu=QKV_EMU, same_bits_as_c=True,
        threads=(dict(B=4, T=130, H=6, D=64, seed=3),)),
    fast=QKV_NOT_FAST,
    bad=(
        Bad(lambda: ops.qkv_split_forward(z(2, 3, 4, 1, 8)), ValueError, r"qkv.shape\[2\]"),
        Bad(lambda: ops.qkv_split_forward(z(2, 3, 3, 1, 8), np.arange(4)), ValueError,
            "pos must have shape"),
        Bad(lambda: ops.qkv_split_forward(z(2, 3, 3, 1, 7), np.arange(3)), ValueError,
            "must be even"),
        Bad(lambda: ops.qkv_split_forward(z(2, 3, 3, 8)), ValueError, "5 dimensions"),
        Bad(lambda: ops.qkv_split_forward(z(2, 3, 3, 1, 8, dtype=np.float64)), TypeError,
            "dtype"),
        Bad(lambda: ops.qkv_split_forward(z(1, 2, 3, 1, 8), np.arange(2), base=0.0), ValueError,
            "base"),
    ),
    scratch="as pytfm_rope_forward's (when rope != 0): the rope cases",
    reference=False,
    tested_in=("tests/kernels/test_qkv_split.py::test_split_is_slicing_then_rope_bit_for_bit",
               "tests/cuda/test_cuda_emu.py::test_qkv_split"),
)

QKV_SPLIT_BACKWARD = Op(
    "qkv_split_backward",
    limits=Limits(("F F F F I {0} {1} {2} {3} {4} 10000.0 1",), ROPE),
    exact=("F:2*r*3*b*2*a F:2*r*b*2*a F:2*r*b*2*a F:2*r*b*2*a I:2*r:1000 2 r b 2*a r 10000.0 1",
           "F:2*r*3*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a N 2 r b a 0 10000.0 0"),
    check=Check(
        QKV_DRAW, qkv_make,
        run=lambda a: [ops.qkv_split_backward(a["dq"], a["dk"], a["dv"], a["pos"])],
        want=lambda a: [np.stack(_rotated([a["dq"], a["dk"], a["dv"]], a["pos"],
                                          ref.rope_backward), axis=2)],
        tol=qkv_backward_tol, outputs=("dqkv",), emu=QKV_EMU, same_bits_as_c=True,
        threads=(dict(B=4, T=130, H=6, D=64, seed=3),)),
    fast=QKV_NOT_FAST,
    bad=(Bad(lambda: ops.qkv_split_backward(*[z(2, 3, 1, 8)] * 2, z(2, 3, 1, 4)), ValueError,
             "dv must have shape"),),
    scratch="as pytfm_rope_backward's (when rope != 0): the rope cases",
    reference=False,
    tested_in=("tests/kernels/test_qkv_split.py::test_backward_is_the_adjoint_of_forward",),
)

SINUSOIDAL_POSITIONS = Op(
    "sinusoidal_positions",
    limits=Limits(("F {0} {1}",), POSITIONS),
    exact=("F:r*2*a r 2*a",),
    fast="one version, the same bits at any thread count",
    bad=(
        Bad(lambda: ops.sinusoidal_positions(4, 3), ValueError,
            r"dim must be even and >= 2, got 3"),
        Bad(lambda: ops.sinusoidal_positions(4, 0), ValueError,
            r"dim must be even and >= 2, got 0"),
        Bad(lambda: ops.sinusoidal_positions(-1, 4), ValueError, r"T must be >= 0, got -1"),
        Bad(lambda: ops.sinusoidal_positions(4, True), TypeError,
            r"dim must be an integer, got bool"),
        Bad(lambda: ops.sinusoidal_positions(4.0, 4), TypeError,
            r"T must be an integer, got float"),
        Bad(lambda: ops.sinusoidal_positions(2**64, 4), ValueError, r"T must fit in int64"),
    ),
    cuda=False,
    tested_in=("tests/kernels/test_positions.py::test_the_table_is_the_reference_to_a_few_ulps",),
)


# ---- gelu -------------------------------------------------------------------------------------

def gelu_make(seed, shape, scale=1.0):
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    return dict(seed=seed, x=f32(rng, shape, scale), dy=f32(rng, shape))


GELU_DRAW = drawn(shape=st.lists(awkward, min_size=1, max_size=3), scale=scales)
GELU_EMU = tuple(dict(shape=(c,), scale=3.0, seed=c) for c in (1, 257, 1027))
GELU_FAST_DRAW = drawn(shape=st.tuples(fast_cols), scale=st.sampled_from([0.1, 1.0, 5.0, 50.0]))

GELU_FORWARD = Op(
    "gelu_forward",
    limits=Limits(("F F {0}",), COUNT),
    exact=("F:r*a F:r*a r*a",),
    check=Check(
        GELU_DRAW, gelu_make,
        run=lambda a: [ops.gelu_forward(a["x"])],
        want=lambda a: [ref.gelu_forward(a["x"])],
        tol=lambda a, want: [Tol(4 * EPS32 * (1.0 + abs(a["x"])))],
        outputs=("y",), emu=GELU_EMU, threads=(dict(shape=(300, 257), seed=3),)),
    fast=(Fast("count", GELU_FAST_DRAW, gelu_make, lambda a: [ops.gelu_forward(a["x"])],
               lambda a, got, plain: [Tol(1e-7, 2e-6)]),),
    bad=(Bad(lambda: ops.gelu_forward(z(3, dtype=np.float16)), TypeError,
             r"x must have dtype float32"),),
    tested_in=("tests/kernels/test_extremes.py::test_gelu_is_finite_and_right_up_to_flt_max",
               "tests/cuda/test_cuda_emu.py::test_gelu"),
)

GELU_BACKWARD = Op(
    "gelu_backward",
    limits=Limits(("F F F {0}",), COUNT),
    exact=("F:r*a F:r*a F:r*a r*a",),
    check=Check(
        GELU_DRAW, gelu_make,
        run=lambda a: [ops.gelu_backward(a["dy"], a["x"])],
        want=lambda a: [ref.gelu_backward(a["dy"], a["x"])],
        tol=lambda a, want: [Tol(8 * EPS32 * (1.0 + abs(a["x"])) * abs(a["dy"]))],
        outputs=("dx",), emu=GELU_EMU, threads=(dict(shape=(300, 257), seed=3),)),
    fast=(Fast("count", GELU_FAST_DRAW, gelu_make,
               lambda a: [ops.gelu_backward(a["dy"], a["x"])],
               lambda a, got, plain: [Tol(1e-7, 2e-6)]),),
    bad=(Bad(lambda: ops.gelu_backward(z(4), z(3)), ValueError, r"dy must have shape \(3,\)"),),
    tested_in=("tests/cuda/test_cuda_emu.py::test_gelu",),
)


# ---- the Llama family: RMSNorm, SwiGLU, RoPE from a table of frequencies ----------------------

def rmsnorm_make(seed, rows, cols, scale=1.0, eps=1e-6, accumulate=False):
    rng = np.random.default_rng(seed)
    x = f32(rng, (rows, cols), scale)
    w, dy = f32(rng, (cols,)), f32(rng, (rows, cols))
    dw0 = f32(rng, (cols,)) if accumulate else None
    return dict(seed=seed, eps=eps, x=x, w=w, dy=dy, dw0=dw0)


def rmsnorm_saved(**drawn_values):
    a = rmsnorm_make(**drawn_values)
    a["y"], a["rstd"] = ops.rmsnorm_forward(a["x"], a["w"], a["eps"])
    return a


def rmsnorm_tol(a, want):
    """The fast kernel's Σ x² in float: sum_roundings(cols) roundings, halved by the square
    root, plus the few of rstd and y = (x·rstd)·w; the plain one sums in double (fewer)."""
    k = sum_roundings(a["x"].shape[1]) / 2 + 6
    return [Tol(2 * k * EPS32 * abs(want[0]), 0.0), Tol(2 * k * EPS32 * want[1], 0.0)]


def rmsnorm_backward_tol(a, want):
    """dx = rstd·(g − x̂·mean(g·x̂)): a few roundings of each term, and the float mean of
    g·x̂ (sum_roundings(cols) of them); dw a float sum over rows (rows + 1 roundings each)"""
    x, w, dy, rstd = (t.astype(np.float64) for t in (a["x"], a["w"], a["dy"], a["rstd"]))
    rows, cols = x.shape
    rs = rstd[:, None]
    xhat, g = x * rs, dy * w
    gxm = abs(g * xhat).mean(axis=1, keepdims=True)
    tol_dx = rs * EPS32 * (4 * abs(g) + 4 * abs(xhat) * gxm
                           + (sum_roundings(cols) + 2) * abs(xhat) * gxm)
    tol_dw = (rows + 2) * EPS32 * abs(dy * xhat).sum(axis=0) + 2 * EPS32 * _abs(a["dw0"])
    return [Tol(2 * tol_dx, 0.0), Tol(2 * tol_dw, 0.0)]


def rmsnorm_backward_want(a):
    rdx, rdw = ref.rmsnorm_backward(a["dy"], a["x"], a["w"], a["rstd"])
    return [rdx, _plus(a["dw0"], rdw)]


def rmsnorm_chain(a):
    """The forward, then the backward fed what this kernel version's forward saved."""
    y, rstd = ops.rmsnorm_forward(a["x"], a["w"], a["eps"])
    return [y, rstd, *ops.rmsnorm_backward(a["dy"], a["x"], a["w"], rstd)]


def rmsnorm_fast_tol(a, got, plain, backward=True):
    """fast (float sums) vs plain (double sums): each within its bound of the reference, so
    within the sum of the two bounds of each other"""
    want = ref.rmsnorm_forward(a["x"], a["w"], a["eps"])
    tols = [Tol(2 * t.atol) for t in rmsnorm_tol(a, want)]
    if not backward:
        return tols
    b = dict(a, rstd=plain[1])
    return tols + [Tol(2 * t.atol + 8 * EPS32 * abs(p)) for t, p in
                   zip(rmsnorm_backward_tol(b, None), plain[2:])]


RMSNORM_DRAW = drawn(rows=awkward, cols=awkward, scale=scales,
                     eps=st.sampled_from([1e-6, 1e-5, 0.0]))
RMSNORM_EMU = tuple(dict(rows=r, cols=c, scale=2.0, seed=r + c)
                    for r, c in [(1, 1), (3, 7), (9, 32), (70, 67), (3, 1025), (2, 2048)])
RMSNORM_FAST_DRAW = drawn(rows=st.sampled_from([1, 2, 3, 7, 17, 40]), cols=fast_cols)


def rms(eps):
    return ops.rmsnorm_forward(x23, z(3), eps)


RMSNORM_FORWARD = Op(
    "rmsnorm_forward",
    limits=Limits(("F F F F {0} {1} 1e-5",), RC),
    exact=("F:r*a F:r F:r*a F:a r a 1e-5",),
    check=Check(
        RMSNORM_DRAW, rmsnorm_make,
        run=lambda a: list(ops.rmsnorm_forward(a["x"], a["w"], a["eps"])),
        want=lambda a: list(ref.rmsnorm_forward(a["x"], a["w"], a["eps"])),
        tol=rmsnorm_tol, outputs=("y", "rstd"), emu=RMSNORM_EMU,
        threads=(dict(rows=300, cols=257, seed=3),)),
    fast=(Fast("rows", RMSNORM_FAST_DRAW, rmsnorm_make,
               lambda a: list(ops.rmsnorm_forward(a["x"], a["w"], a["eps"])),
               lambda a, got, plain: rmsnorm_fast_tol(a, got, plain, backward=False)),),
    bad=(
        Bad(lambda: ops.rmsnorm_forward(x23, z(4), 1e-6), ValueError,
            r"w must have shape \(3,\)"),
        Bad(lambda: rms(-1.0), ValueError, r"eps must be >= 0, got -1"),
        Bad(lambda: rms(float("nan")), ValueError, r"eps must be finite"),
        Bad(lambda: rms("small"), TypeError, r"eps must be a real number, got str"),
        Bad(lambda: rms(1e39), ValueError, r"eps must fit in float32 .*got 1e\+39"),
        Bad(lambda: ops.rmsnorm_forward(z(2, 0), z(0), 1e-6), ValueError,
            r"x.shape\[-1\] \(the normalised axis\) must be >= 1"),
    ),
    tested_in=("tests/kernels/test_llama_ops.py::test_rmsnorm_matches_transformers",
               "tests/kernels/test_llama_ops.py::test_rmsnorm_of_huge_and_tiny_rows",
               "tests/cuda/test_cuda_llama_ops.py::test_rmsnorm_of_huge_rows"),
)

RMSNORM_BACKWARD = Op(
    "rmsnorm_backward",
    limits=Limits(("F F F F F F {0} {1}",), RC),
    exact=("F:r*a F:a F:r*a F:r*a F:a F:r r a",),
    check=Check(
        RMSNORM_DRAW, rmsnorm_saved,
        run=lambda a: list(ops.rmsnorm_backward(a["dy"], a["x"], a["w"], a["rstd"],
                                                dw=a["dw0"])),
        want=rmsnorm_backward_want, tol=rmsnorm_backward_tol, outputs=("dx", "dw"),
        emu=tuple(dict(d, accumulate=True) for d in RMSNORM_EMU),
        threads=(dict(rows=300, cols=257, seed=3),)),
    fast=(Fast("chain", RMSNORM_FAST_DRAW, rmsnorm_make, rmsnorm_chain, rmsnorm_fast_tol),),
    bad=(Bad(lambda: ops.rmsnorm_backward(x23, x23, z(3), z(3)), ValueError,
             r"rstd must have shape \(2,\)"),),
    scratch=Scratch("""
rows, cols = 16, 65536
x, dy, w = randn(rows, cols), randn(rows, cols), randn(cols)
y, rstd = ops.rmsnorm_forward(x, w, 1e-6)
call = lambda: list(ops.rmsnorm_backward(dy, x, w, rstd))
out_bytes = 4 * (rows * cols + cols)  # dx, dw
scratch_bytes = 4 * min(rows, 16) * cols  # backward_fast: dw per chunk of rows
"""),
    tested_in=("tests/kernels/test_llama_ops.py::test_rmsnorm_matches_transformers",),
)


def swiglu_make(seed, shape, scale=1.0):
    rng = np.random.default_rng(seed)
    g, u, dh = f32(rng, shape, scale), f32(rng, shape), f32(rng, shape)
    return dict(seed=seed, g=g, u=u, dh=dh)


def swiglu_backward_tol(a, want):
    """|silu'| <= 1.1; 1 − σ(g) is off by an ulp of 1, which g multiplies: |g|·EPS32"""
    g, du = abs(a["g"].astype(np.float64)), abs((a["dh"] * a["u"]).astype(np.float64))
    return [Tol(8 * EPS32 * du * (1 + g) + 1e-30, 0.0), Tol(8 * EPS32 * abs(want[1]) + 1e-30, 0.0)]


SWIGLU_DRAW = drawn(shape=st.lists(awkward, min_size=1, max_size=3),
                    scale=st.sampled_from([1e-3, 1.0, 5.0, 40.0]))
SWIGLU_EMU = tuple(dict(shape=(c,), scale=5.0, seed=c) for c in (1, 257, 1027))
SWIGLU_FAST_DRAW = drawn(shape=st.tuples(fast_cols), scale=st.sampled_from([0.1, 1.0, 5.0, 50.0]))

SWIGLU_FORWARD = Op(
    "swiglu_forward",
    limits=Limits(("F F F {0}",), COUNT),
    exact=("F:r*a F:r*a F:r*a r*a",),
    check=Check(
        SWIGLU_DRAW, swiglu_make,
        run=lambda a: [ops.swiglu_forward(a["g"], a["u"])],
        want=lambda a: [ref.swiglu_forward(a["g"], a["u"])],
        tol=lambda a, want: [Tol(8 * EPS32 * abs(want[0]) + 1e-30, 0.0)],
        outputs=("h",), emu=SWIGLU_EMU, threads=(dict(shape=(300, 257), seed=3),)),
    fast=(Fast("count", SWIGLU_FAST_DRAW, swiglu_make,
               lambda a: [ops.swiglu_forward(a["g"], a["u"])],
               lambda a, got, plain: [Tol(1e-30, 16 * EPS32)]),),
    bad=(Bad(lambda: ops.swiglu_forward(z(3), z(4)), ValueError, r"u must have shape \(3,\)"),
         Bad(lambda: ops.swiglu_forward(z(3, dtype=np.float64), z(3)), TypeError,
             r"g must have dtype float32")),
    tested_in=("tests/kernels/test_llama_ops.py::test_swiglu_matches_llama_mlp",
               "tests/kernels/test_llama_ops.py::test_silu_is_finite_for_large_inputs"),
)

SWIGLU_BACKWARD = Op(
    "swiglu_backward",
    limits=Limits(("F F F F F {0}",), COUNT),
    exact=("F:r*a F:r*a F:r*a F:r*a F:r*a r*a",),
    check=Check(
        SWIGLU_DRAW, swiglu_make,
        run=lambda a: list(ops.swiglu_backward(a["dh"], a["g"], a["u"])),
        want=lambda a: list(ref.swiglu_backward(a["dh"], a["g"], a["u"])),
        tol=swiglu_backward_tol, outputs=("dg", "du"), emu=SWIGLU_EMU,
        threads=(dict(shape=(300, 257), seed=3),)),
    fast=(Fast("count", SWIGLU_FAST_DRAW, swiglu_make,
               lambda a: list(ops.swiglu_backward(a["dh"], a["g"], a["u"])),
               lambda a, got, plain: [Tol(t.atol + 8 * EPS32 * abs(p)) for t, p in
                                      zip(swiglu_backward_tol(a, plain), plain)]),),
    bad=(Bad(lambda: ops.swiglu_backward(z(4), z(3), z(3)), ValueError,
             r"dh must have shape \(3,\)"),),
    tested_in=("tests/kernels/test_llama_ops.py::test_swiglu_matches_llama_mlp",),
)


LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=8192)


def rope_freq_make(seed, B, T, H, half, start=0, batched=False, theta=10000.0, llama3=False):
    a = rope_make(seed, B, T, H, half, start, batched)
    a["inv_freq"] = ops.rope_inv_freq(2 * half, theta, LLAMA3 if llama3 else None)
    return a


def rope_freq_tol(a, x):
    """cos and sin rounded once each, the angle pos·inv_freq rounded once in float"""
    theta = float(np.abs(a["pos"]).max() * a["inv_freq"].max()) if a["pos"].size else 0.0
    return [Tol(EPS32 * amax(x) * (4 + theta))]


ROPE_FREQ_DRAW = drawn(B=small, T=awkward, H=small, half=st.sampled_from([1, 2, 3, 8, 32, 64]),
                       start=st.sampled_from([0, 1, 1000, 123456]), batched=st.booleans(),
                       theta=st.sampled_from([10000.0, 500000.0, 1e6]), llama3=st.booleans())
ROPE_FREQ_EMU = tuple(dict(d, llama3=True) for d in ROPE_EMU)
ROPE_FREQ_SCRATCH = """
B, T, H, D = 1, 4096, 1, 512
x, pos, inv_freq = randn(B, T, H, D), np.arange(T), ops.rope_inv_freq(D, 10000.0)
call = lambda: [ops.{name}(x, pos, inv_freq)]
out_bytes = 4 * B * T * H * D
scratch_bytes = 4 * T * D  # rope_tabled: cos and sin, [T, D/2] each (pos shared by the batch)
"""


def rope_freq_fast_make(**drawn_values):
    a = rope_fast_make(**drawn_values)
    a["inv_freq"] = ops.rope_inv_freq(a["x"].shape[3], 500000.0, LLAMA3)
    return a


def rf(x=None, pos=None, inv_freq=None):
    return ops.rope_freq_forward(z(1, 3, 2, 4) if x is None else x,
                                 i64(0, 1, 2) if pos is None else pos,
                                 z(2) if inv_freq is None else inv_freq)


ROPE_FREQ_FORWARD = Op(
    "rope_freq_forward",
    limits=Limits(("F F I F {0} {1} {2} {3} {4}",), ROPE),
    exact=("F:2*r*b*2*a F:2*r*b*2*a I:2*r:1000 F:a 2 r b 2*a r",
           "F:2*r*b*2*a F:2*r*b*2*a I:r:1000 F:a 2 r b 2*a 0"),
    check=Check(
        ROPE_FREQ_DRAW, rope_freq_make,
        run=lambda a: [ops.rope_freq_forward(a["x"], a["pos"], a["inv_freq"])],
        want=lambda a: [ref.rope_freq_forward(a["x"], a["pos"], a["inv_freq"])],
        tol=lambda a, want: rope_freq_tol(a, a["x"]),
        outputs=("y",), emu=ROPE_FREQ_EMU, same_bits_as_c=True,
        threads=(dict(B=2, T=100, H=3, half=8, seed=3),)),
    fast=(Fast("same_bits", ROPE_FAST_DRAW, rope_freq_fast_make,
               lambda a: [ops.rope_freq_forward(a["x"], a["pos"], a["inv_freq"])],
               lambda a, got, plain: [EXACT]),),
    bad=(
        Bad(lambda: rf(x=z(2, 3, 4)), ValueError, r"x must have 4 dimensions"),
        Bad(lambda: rf(x=z(1, 3, 2, 5)), ValueError,
            r"x.shape\[3\] \(head dim D\) must be even and >= 2"),
        Bad(lambda: rf(pos=np.arange(3.0)), TypeError, r"pos must have dtype int64, got float64"),
        Bad(lambda: rf(pos=i64(0, 1)), ValueError,
            r"pos must have shape \(T,\) = \(3,\) or \(B, T\) = \(1, 3\)"),
        Bad(lambda: rf(inv_freq=z(4)), ValueError, r"inv_freq must have shape \(2,\)"),
    ),
    scratch=Scratch(ROPE_FREQ_SCRATCH.format(name="rope_freq_forward")),
    tested_in=("tests/kernels/test_llama_ops.py::test_rope_freq_matches_transformers",
               "tests/kernels/test_llama_ops.py::test_rope_freq_is_rope_with_the_default_table",
               "tests/cuda/test_cuda_llama_ops.py::test_rope_freq_in_place"),
)

ROPE_FREQ_BACKWARD = Op(
    "rope_freq_backward",
    limits=Limits(("F F I F {0} {1} {2} {3} {4}",), ROPE),
    exact=ROPE_FREQ_FORWARD.exact,
    check=Check(
        ROPE_FREQ_DRAW, rope_freq_make,
        run=lambda a: [ops.rope_freq_backward(a["dy"], a["pos"], a["inv_freq"])],
        want=lambda a: [ref.rope_freq_backward(a["dy"], a["pos"], a["inv_freq"])],
        tol=lambda a, want: rope_freq_tol(a, a["dy"]),
        outputs=("dx",), emu=ROPE_FREQ_EMU, same_bits_as_c=True,
        threads=(dict(B=2, T=100, H=3, half=8, seed=3),)),
    fast=(Fast("same_bits", ROPE_FAST_DRAW, rope_freq_fast_make,
               lambda a: [ops.rope_freq_backward(a["x"], a["pos"], a["inv_freq"])],
               lambda a, got, plain: [EXACT]),),
    bad=(Bad(lambda: ops.rope_freq_backward(z(1, 3, 2, 4), i64(0, 1, 2), z(2, 1)), ValueError,
             r"inv_freq must have shape \(2,\)"),),
    scratch=Scratch(ROPE_FREQ_SCRATCH.format(name="rope_freq_backward")),
    tested_in=("tests/kernels/test_llama_ops.py::test_rope_freq_backward_undoes_the_forward",),
)


def inv_freq_make(seed, D, theta, llama3):
    return dict(seed=seed, D=D, theta=theta, scaling=LLAMA3 if llama3 else None)


ROPE_INV_FREQ = Op(
    "rope_inv_freq",
    limits=Limits(("F {0} 10000.0 1 8.0 1.0 4.0 8192.0",), ((P62,), (P62 + 2,), (I64_MAX - 1,))),
    exact=("F:a 2*a 10000.0 1 8.0 1.0 4.0 8192.0", "F:a 2*a 500000.0 0 0.0 0.0 0.0 0.0"),
    check=Check(
        drawn(D=st.sampled_from([2, 4, 6, 64, 128, 256]),
              theta=st.sampled_from([10000.0, 500000.0, 1e6]), llama3=st.booleans()),
        inv_freq_make,
        run=lambda a: [ops.rope_inv_freq(a["D"], a["theta"], a["scaling"])],
        want=lambda a: [ref.rope_inv_freq(a["D"], a["theta"], a["scaling"])],
        tol=lambda a, want: [Tol(0.0, EPS32)], outputs=("inv_freq",)),
    fast="one loop, called once per model",
    bad=(
        Bad(lambda: ops.rope_inv_freq(5, 1e4), ValueError, r"D \(head dim\) must be even"),
        Bad(lambda: ops.rope_inv_freq(4, 0.0), ValueError, r"theta must be finite and > 0"),
        Bad(lambda: ops.rope_inv_freq(4, 1e4, {"rope_type": "yarn"}), ValueError,
            r"rope_type must be 'default' or 'llama3', got 'yarn'"),
        Bad(lambda: ops.rope_inv_freq(4, 1e4, {"rope_type": "llama3", "factor": 8.0}),
            ValueError, r"needs low_freq_factor, high_freq_factor, original_max_position"),
        Bad(lambda: ops.rope_inv_freq(4, 1e4, dict(LLAMA3, high_freq_factor=0.5)), ValueError,
            r"high_freq_factor must be finite and > low_freq_factor = 1, got 0.5"),
        Bad(lambda: ops.rope_inv_freq(4, 1e4, "llama3"), TypeError,
            r"scaling must be None or a dict"),
    ),
    cuda=False,
    tested_in=("tests/kernels/test_llama_ops.py::test_inv_freq_matches_transformers_llama3",),
)


# ---- embedding --------------------------------------------------------------------------------

def embedding_make(seed, rows, vocab, dim, batch=1, accumulate=False):
    """ids [batch, rows] of few classes and many rows: repeats are common"""
    rng = np.random.default_rng(seed)
    table = f32(rng, (vocab, dim))
    ids = rng.integers(0, vocab, size=(batch, rows))
    dy = f32(rng, (batch, rows, dim))
    dtable0 = f32(rng, (vocab, dim)) if accumulate else None
    return dict(seed=seed, vocab=vocab, table=table, ids=ids, dy=dy, dtable0=dtable0)


EMBEDDING_DRAW = drawn(rows=awkward, vocab=awkward, dim=awkward, batch=small)
EMBEDDING_EMU = tuple(dict(rows=r, vocab=v, dim=d, seed=r * v * d)
                      for r, v, d in [(1, 1, 1), (7, 3, 5), (17, 3, 8), (40, 2, 65), (300, 50, 5)])
EMBEDDING_NOT_FAST = "one version: a row copy, and the rows of each id added in order of position"

EMBEDDING_FORWARD = Op(
    "embedding_forward",
    limits=Limits(("F I F {0} {1} {2}",), EMB),
    exact=("F:r*a I:r:b F:b*a r b a",),
    check=Check(
        EMBEDDING_DRAW, embedding_make,
        run=lambda a: [ops.embedding_forward(a["ids"], a["table"])],
        want=lambda a: [ref.embedding_forward(a["ids"], a["table"])],
        tol=lambda a, want: [EXACT], outputs=("y",), emu=EMBEDDING_EMU, same_bits_as_c=True,
        threads=(dict(rows=300, vocab=50, dim=257, seed=3),)),
    fast=EMBEDDING_NOT_FAST,
    bad=(
        Bad(lambda: ops.embedding_forward(i64(0, 256), z(4, 3)), ValueError,
            r"ids\[1\] = 256 is outside \[0, 4\)"),
        Bad(lambda: ops.embedding_forward(i64(-1), z(4, 3)), ValueError,
            r"ids\[0\] = -1 is outside"),
        Bad(lambda: ops.embedding_forward(np.array([0, 1], np.int32), z(4, 3)), TypeError,
            r"ids must have dtype int64, got int32"),
        Bad(lambda: ops.embedding_forward(i64(0), z(4)), ValueError,
            r"table must have 2 dimensions"),
        Bad(lambda: ops.embedding_forward(i64(0), z(0, 3)), ValueError, r"table must have shape"),
    ),
    tested_in=("tests/cuda/test_cuda_emu.py::test_embedding",),
)

def embedding_bf16w_make(seed, rows, vocab, dim, batch=1):
    a = embedding_make(seed, rows, vocab, dim, batch)
    a["table16"] = bf16_special(np.random.default_rng(seed + 1), bf16_bits(a["table"]))
    return a


EMBEDDING_FORWARD_BF16W = Op(
    "embedding_forward_bf16w",
    limits=Limits(("F I H {0} {1} {2}",), EMB),
    exact=("F:r*a I:r:b H:b*a r b a",),
    check=Check(
        EMBEDDING_DRAW, embedding_bf16w_make,
        run=lambda a: [ops.embedding_forward_bf16w(a["ids"], a["table16"])],
        want=lambda a: [ref.embedding_forward_bf16w(a["ids"], a["table16"])],
        tol=lambda a, want: [EXACT], outputs=("y",),
        threads=(dict(rows=300, vocab=50, dim=257, seed=3),)),
    fast="one version: a row widened",
    bad=(
        Bad(lambda: ops.embedding_forward_bf16w(i64(0, 256), h43), ValueError,
            r"pytfm_embedding_forward_bf16w: ids\[1\] = 256 is outside \[0, 4\)"),
        Bad(lambda: ops.embedding_forward_bf16w(i64(-1), h43), ValueError,
            r"ids\[0\] = -1 is outside"),
        Bad(lambda: ops.embedding_forward_bf16w(np.array([0, 1], np.int32), h43), TypeError,
            r"ids must have dtype int64, got int32"),
        Bad(lambda: ops.embedding_forward_bf16w(i64(0), z(4, 3)), TypeError,
            r"table16 must be a uint16 array of BF16 bits .*got dtype float32: make them with "
            r"pytfm.ops.to_bf16_bits"),
        Bad(lambda: ops.embedding_forward_bf16w(i64(0), h43[0]), ValueError,
            r"table16 must have 2 dimensions"),
        Bad(lambda: ops.embedding_forward_bf16w(i64(0), np.zeros((0, 3), np.uint16)),
            ValueError, r"table16 must have shape \(vocab, dim\) with both >= 1"),
        Bad(lambda: ops.embedding_forward_bf16w(FakeCupyArray(), h43), TypeError,
            r"ids is a CuPy array, but embedding_forward_bf16w runs on NumPy arrays only"),
    ),
    cuda=False,  # BF16-only tables are a CPU inference mode: the C model on the GPU widens them
    tested_in=("tests/kernels/test_bf16_weights.py::test_the_embedding_rows_are_widened_exactly",
               "tests/kernels/test_bf16_weights.py::test_bad_ids_are_refused_and_nothing_written"),
)

EMBEDDING_BACKWARD = Op(
    "embedding_backward",
    limits=Limits(("F F I {0} {1} {2}",), EMB),
    exact=("F:b*a F:r*a I:r:b r b a",),
    check=Check(
        EMBEDDING_DRAW, embedding_make,
        run=lambda a: [ops.embedding_backward(a["dy"], a["ids"], a["vocab"], dtable=a["dtable0"])],
        want=lambda a: [_plus(a["dtable0"], ref.embedding_backward(a["dy"], a["ids"],
                                                                   a["vocab"]))],
        tol=lambda a, want: [Tol(2 * a["ids"].size * EPS32
                                 * (amax(a["dy"]) + _abs(a["dtable0"])))],
        outputs=("dtable",), emu=tuple(dict(d, accumulate=True) for d in EMBEDDING_EMU),
        same_bits_as_c=True, threads=(dict(rows=300, vocab=50, dim=257, seed=3),)),
    fast=EMBEDDING_NOT_FAST,
    bad=(
        Bad(lambda: ops.embedding_backward(z(2, 3), i64(0, 1), 0), ValueError,
            r"vocab must be >= 1"),
        Bad(lambda: ops.embedding_backward(z(2, 3), i64(0, 1), 4.0), TypeError,
            r"vocab must be an integer"),
        Bad(lambda: ops.embedding_backward(z(3, 3), i64(0, 1), 4), ValueError,
            r"dy must have shape \(2, 3\)"),
        Bad(lambda: ops.embedding_backward(z(2, 3), i64(0, 4), 4), ValueError,
            r"ids\[1\] = 4 is outside"),
        Bad(lambda: ops.embedding_backward(z(2, 3), i64(0, 1), True), TypeError,
            r"vocab must be an integer, got bool \(True\)"),
        Bad(lambda: ops.embedding_backward(z(2, 3), i64(0, 1), np.True_), TypeError,
            r"vocab must be an integer, got bool", "vocab-np-True"),
        Bad(lambda: ops.embedding_backward(z(2, 3), i64(0, 1), 2**63), ValueError,
            r"vocab must fit in int64, \[-2\*\*63, 2\*\*63 - 1\], got 9223372036854775808"),
        Bad(lambda: ops.embedding_backward(z(2, 3), i64(0, 1), -HUGE), ValueError,
            r"vocab must fit in int64.*got an integer of 1329 bits"),
        Bad(lambda: ops.embedding_backward(z(2, 3), i64(0, 1), 2**62), ValueError,
            r"dtable of shape \(4611686018427387904, 3\) cannot be allocated"),
    ),
    tested_in=("tests/kernels/test_properties.py::test_embedding_backward_sums_repeated_ids",
               "tests/cuda/test_cuda_emu.py::test_embedding"),
)


# ---- cross-entropy ----------------------------------------------------------------------------

def cross_entropy_make(seed, rows, vocab, scale=1.0, offset=0.0, ignore_index=-1, ignored=0.0,
                       dloss=1.0, label_smoothing=0.0):
    """logits at `scale` around offset; a share `ignored` of the targets ignore_index"""
    rng = np.random.default_rng(seed)
    logits = f32(rng, (rows, vocab), scale, offset)
    targets = rng.integers(0, vocab, size=rows)
    targets[rng.random(rows) < ignored] = ignore_index
    return dict(seed=seed, ignore_index=ignore_index, dloss=dloss, logits=logits,
                targets=targets, label_smoothing=label_smoothing)


def cross_entropy_saved(**drawn_values):
    a = cross_entropy_make(**drawn_values)
    a["lse"] = ops.cross_entropy_forward(a["logits"], a["targets"], a["ignore_index"])[1]
    return a


def cross_entropy_tol(a, want, roundings=1):
    """float32 inputs of size |logits| are known to half an ulp; lse is stored in float32"""
    mag = roundings * EPS32 * amax(a["logits"])
    return [Tol(1e-6 + mag, 1e-5), Tol(1e-6 + mag, 1e-6)]


def cross_entropy_backward_tol(a, want, roundings=2):
    """softmax is recomputed as exp(logits − lse) with lse rounded to float32: an absolute
    error of about eps32·|lse| in each probability"""
    mag = EPS32 * amax(a["logits"])
    kept = max(int((a["targets"] != a["ignore_index"]).sum()), 1)
    return [Tol((1e-6 + roundings * mag) * abs(a["dloss"]) / kept, 1e-5)]


def cross_entropy_fast_make(seed, rows, cols, offset):
    a = cross_entropy_make(seed, rows, cols, 3.0, offset)
    a["targets"][0] = -1  # one ignored row
    return a


def cross_entropy_fast_tol(a, got, plain):
    logits, targets = a["logits"], a["targets"]
    kept = targets != -1
    scale = 1 / max(int(kept.sum()), 1)
    X = logits.astype(np.float64)
    lse, dlse = plain[1].astype(np.float64), abs(got[1].astype(np.float64) - plain[1])
    # lse = max + log Σ e^(x − max): both sides exponentiate the same float x − max, the
    # fast e^ within 2 ulp of the plain expf's; a float sum of positive terms (k roundings)
    # vs a double one; log and + max round once each side
    tol_lse = EPS32 * (sum_roundings(logits.shape[1]) + 3 + abs(lse - X.max(axis=1)) + abs(lse))
    # loss = mean over kept rows of lse − x_target (in double): inherits each row's lse
    # difference (the plain one uses its lse before rounding it to float)
    dl = (dlse + EPS32 * abs(lse))[kept]
    tol_loss = (dl.mean() if dl.size else 0.0) + EPS32 * abs(float(plain[0]))
    tols = [Tol(2 * tol_loss, 0.0), Tol(2 * tol_lse, 0.0)]
    if len(got) == 2:
        return tols
    # dlogits = scale·e^(x − lse) − [j = target]·scale: the exponent moves by the lse
    # difference and by a rounding of x − lse on each side; e^ (2 ulp), ·scale and − scale
    p = np.exp(X - lse[:, None])
    tol_d = scale * p * (dlse[:, None] + EPS32 * (abs(X - lse[:, None]) + 3))
    tol_d = np.where(kept[:, None], tol_d + EPS32 * abs(plain[2]), 0.0)
    return tols + [Tol(2 * tol_d, 0.0)]


def cross_entropy_forward_run(a):
    loss, lse = ops.cross_entropy_forward(a["logits"], a["targets"], a["ignore_index"])
    return [loss, lse]


def cross_entropy_chain(a):
    loss, lse = ops.cross_entropy_forward(a["logits"], a["targets"])
    return [np.float32(loss), lse, ops.cross_entropy_backward(a["logits"], a["targets"], lse)]


CROSS_ENTROPY_DRAW = drawn(rows=awkward, vocab=awkward, scale=scales,
                           offset=st.sampled_from([0.0, -30.0, 1e4]),
                           ignore_index=st.sampled_from([-1, -100, 0]), ignored=st.floats(0.0, 1.0),
                           dloss=st.sampled_from([1.0, 0.5, -3.0]))
CROSS_ENTROPY_EMU = tuple(
    dict(rows=r, vocab=v, scale=3.0, offset=-30.0, ignore_index=i, ignored=p, dloss=-3.0,
         seed=r * v)
    for r, v in [(1, 1), (5, 7), (9, 33), (3, 1025), (70, 5), (30, 1100), (4, 5000)]
    for i, p in [(-1, 0.0), (-100, 0.3), (0, 0.5), (-1, 1.0)])
CROSS_ENTROPY_FAST_DRAW = drawn(rows=fast_rows, cols=fast_cols, offset=st.sampled_from([0.0, 1e3]))

CROSS_ENTROPY_FORWARD = Op(
    "cross_entropy_forward",
    limits=Limits(("F F F I {0} {1} -1",), RC),
    exact=("F:1 F:r F:r*b I:r:b r b -1",),
    check=Check(
        CROSS_ENTROPY_DRAW, cross_entropy_make, run=cross_entropy_forward_run,
        want=lambda a: list(ref.cross_entropy_forward(a["logits"], a["targets"],
                                                      a["ignore_index"])),
        tol=cross_entropy_tol, emu_tol=lambda a, want: cross_entropy_tol(a, want, 4),
        outputs=("loss", "lse"), emu=CROSS_ENTROPY_EMU,
        threads=(dict(rows=300, vocab=257, seed=3),)),
    fast=(Fast("rows", CROSS_ENTROPY_FAST_DRAW, cross_entropy_fast_make,
               lambda a: cross_entropy_chain(a)[:2], cross_entropy_fast_tol),),
    bad=(
        Bad(lambda: ops.cross_entropy_forward(x23, i64(0, 7)), ValueError,
            r"targets\[1\] = 7 is outside \[0, 3\)"),
        Bad(lambda: ops.cross_entropy_forward(x23, i64(0, 1, 2)), ValueError,
            r"targets must have shape \(2,\)"),
        Bad(lambda: ops.cross_entropy_forward(z(2, 0), i64(0, 1)), ValueError,
            r"logits.shape\[-1\]"),
        Bad(lambda: ops.cross_entropy_forward(*ce, ignore_index=2**63), ValueError,
            r"ignore_index must fit in int64"),
        Bad(lambda: ops.cross_entropy_forward(*ce, ignore_index=False), TypeError,
            r"ignore_index must be an integer, got bool"),
    ),
    tested_in=("tests/kernels/test_properties.py::"
               "test_cross_entropy_is_nonnegative_and_dlogits_rows_sum_to_zero",
               "tests/cuda/test_cuda_emu.py::test_cross_entropy_offsets"),
)

CROSS_ENTROPY_BACKWARD = Op(
    "cross_entropy_backward",
    limits=Limits(("F F I F {0} {1} -1 1.0",), RC),
    exact=("F:r*b F:r*b I:r:b F:r r b -1 1.0",),
    check=Check(
        CROSS_ENTROPY_DRAW, cross_entropy_saved,
        run=lambda a: [ops.cross_entropy_backward(a["logits"], a["targets"], a["lse"],
                                                  a["ignore_index"], a["dloss"])],
        want=lambda a: [ref.cross_entropy_backward(a["logits"], a["targets"], a["ignore_index"],
                                                   a["dloss"])],
        tol=cross_entropy_backward_tol,
        emu_tol=lambda a, want: cross_entropy_backward_tol(a, want, 4),
        outputs=("dlogits",), emu=CROSS_ENTROPY_EMU, threads=(dict(rows=300, vocab=257, seed=3),)),
    fast=(Fast("chain", CROSS_ENTROPY_FAST_DRAW, cross_entropy_fast_make, cross_entropy_chain,
               cross_entropy_fast_tol),),
    bad=(
        Bad(lambda: ops.cross_entropy_backward(x23, i64(0, 1), z(3)), ValueError,
            r"lse must have shape \(2,\)"),
        Bad(lambda: ops.cross_entropy_backward(x23, i64(0, 1), z(2), dloss=float("inf")),
            ValueError, r"dloss must be finite", "dloss-inf"),
        Bad(lambda: ops.cross_entropy_backward(*ce, z(2), ignore_index=-1.0), TypeError,
            r"ignore_index must be an integer, got float"),
        Bad(lambda: ops.cross_entropy_backward(*ce, z(2), dloss=HUGE), ValueError,
            r"dloss must fit in float32", "dloss-huge"),
        Bad(lambda: ops.cross_entropy_backward(*ce, z(2), dloss=-1e39), ValueError,
            r"dloss must fit in float32", "dloss-1e39"),
        Bad(lambda: ops.cross_entropy_backward(*ce, z(2), dloss=True), TypeError,
            r"dloss must be a real number, got bool"),
        Bad(lambda: ops.cross_entropy_backward(*ce, z(2), dloss=float("nan")), ValueError,
            r"dloss must be finite", "dloss-nan"),
    ),
    tested_in=("tests/cuda/test_cuda_emu.py::test_cross_entropy_offsets",),
)


# ---- cross-entropy with label smoothing -------------------------------------------------------
# ops.cross_entropy_forward/backward call these when label_smoothing != 0 (the entries above:
# ε = 0, the same code)

def smoothed_forward_run(a):
    return list(ops.cross_entropy_forward(a["logits"], a["targets"], a["ignore_index"],
                                          label_smoothing=a["label_smoothing"]))


def smoothed_backward_run(a):
    return [ops.cross_entropy_backward(a["logits"], a["targets"], a["lse"], a["ignore_index"],
                                       a["dloss"], label_smoothing=a["label_smoothing"])]


def smoothed_chain(a):
    e = a["label_smoothing"]
    loss, lse = ops.cross_entropy_forward(a["logits"], a["targets"], label_smoothing=e)
    return [np.float32(loss), lse,
            ops.cross_entropy_backward(a["logits"], a["targets"], lse, label_smoothing=e)]


def smoothed_backward_tol(a, want, roundings=2):
    """the unsmoothed bound (the softmax's error from lse's rounding), and the roundings of
    − scale·ε/vocab and − scale·(1 − ε): each within eps32·scale, below that bound's
    1e-6·scale"""
    return cross_entropy_backward_tol(a, want, roundings)


def smoothed_fast_make(seed, rows, cols, offset, label_smoothing):
    a = cross_entropy_fast_make(seed, rows, cols, offset)
    a["label_smoothing"] = label_smoothing
    return a


def smoothed_fast_tol(a, got, plain):
    """cross_entropy_fast_tol: the loss's terms move with lse as before (d/dlse = 1; the rows'
    means are the same double sums on both paths); dlogits has one more rounding, of
    g − scale·ε/vocab, on each side, within eps32·(|g| + scale·ε/vocab)"""
    tols = cross_entropy_fast_tol(a, got, plain)
    if len(got) == 2:
        return tols
    kept = a["targets"] != -1
    scale = 1 / max(int(kept.sum()), 1)
    g = scale * np.exp(a["logits"].astype(np.float64) - plain[1][:, None])
    extra = EPS32 * (g + scale * a["label_smoothing"] / a["logits"].shape[1])
    return tols[:2] + [Tol(tols[2].atol + 2 * np.where(kept[:, None], extra, 0.0), 0.0)]


smoothings = st.one_of(st.sampled_from([0.1, 1.0]), st.floats(1e-6, 1.0))
SMOOTHED_DRAW = drawn(rows=awkward, vocab=awkward, scale=scales,
                      offset=st.sampled_from([0.0, -30.0, 1e4]),
                      ignore_index=st.sampled_from([-1, -100, 0]), ignored=st.floats(0.0, 1.0),
                      dloss=st.sampled_from([1.0, 0.5, -3.0]), label_smoothing=smoothings)
SMOOTHED_EMU = tuple(
    dict(rows=r, vocab=v, scale=3.0, offset=-30.0, ignore_index=i, ignored=p, dloss=-3.0,
         label_smoothing=e, seed=r * v)
    for (r, v), (i, p), e in [((1, 1), (-1, 0.0), 0.1), ((5, 7), (-100, 0.3), 1.0),
                              ((9, 33), (0, 0.5), 0.1), ((3, 1025), (-1, 0.0), 0.3),
                              ((70, 5), (-100, 0.3), 0.1), ((30, 1100), (0, 0.5), 0.05),
                              ((4, 5000), (-1, 0.0), 0.1), ((5, 7), (-1, 1.0), 0.1)])
SMOOTHED_FAST_DRAW = drawn(rows=fast_rows, cols=fast_cols, offset=st.sampled_from([0.0, 1e3]),
                           label_smoothing=smoothings)
# past CE_ROW_BLOCK (256) rows: the smoothed fast forward's passes
SMOOTHED_THREADS = (dict(rows=600, vocab=257, seed=3, ignored=0.2, label_smoothing=0.1),)

CROSS_ENTROPY_SMOOTHED_FORWARD = Op(
    "cross_entropy_smoothed_forward",
    limits=Limits(("F F F I {0} {1} -1 0.1",), RC),
    exact=("F:1 F:r F:r*b I:r:b r b -1 0.1",),
    check=Check(
        SMOOTHED_DRAW, cross_entropy_make, run=smoothed_forward_run,
        want=lambda a: list(ref.cross_entropy_forward(a["logits"], a["targets"],
                                                      a["ignore_index"], a["label_smoothing"])),
        tol=cross_entropy_tol, emu_tol=lambda a, want: cross_entropy_tol(a, want, 4),
        outputs=("loss", "lse"), emu=SMOOTHED_EMU, threads=SMOOTHED_THREADS),
    fast=(Fast("rows", SMOOTHED_FAST_DRAW, smoothed_fast_make,
               lambda a: smoothed_chain(a)[:2], smoothed_fast_tol),),
    bad=(
        Bad(lambda: ops.cross_entropy_forward(*ce, label_smoothing=1.5), ValueError,
            r"label_smoothing must be finite and in \[0, 1\], got 1.5"),
        Bad(lambda: ops.cross_entropy_forward(*ce, label_smoothing=-0.25), ValueError,
            r"label_smoothing must be finite and in \[0, 1\], got -0.25"),
        Bad(lambda: ops.cross_entropy_forward(*ce, label_smoothing=float("nan")), ValueError,
            r"label_smoothing must be finite and in \[0, 1\], got nan", "label_smoothing-nan"),
        Bad(lambda: ops.cross_entropy_forward(*ce, label_smoothing=float("inf")), ValueError,
            r"label_smoothing must be finite and in \[0, 1\], got inf", "label_smoothing-inf"),
        Bad(lambda: ops.cross_entropy_forward(*ce, label_smoothing=True), TypeError,
            r"label_smoothing must be a real number, got bool"),
        Bad(lambda: ops.cross_entropy_forward(*ce, label_smoothing="0.1"), TypeError,
            r"label_smoothing must be a real number, got str"),
        Bad(lambda: ops.cross_entropy_forward(*ce, label_smoothing=1e39), ValueError,
            r"label_smoothing must fit in float32", "label_smoothing-1e39"),
        Bad(lambda: ops.cross_entropy_forward(*ce, label_smoothing=1.0), None,
            "", "label_smoothing-1-accepted"),
    ),
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_label_smoothing.py::test_forward_matches_torch",
               "tests/kernels/test_label_smoothing.py::test_zero_smoothing_gives_the_plain_bits",
               "tests/cuda/test_cuda_label_smoothing.py::test_twins_match_the_c_kernels"),
)

CROSS_ENTROPY_SMOOTHED_BACKWARD = Op(
    "cross_entropy_smoothed_backward",
    limits=Limits(("F F I F {0} {1} -1 0.1 1.0",), RC),
    exact=("F:r*b F:r*b I:r:b F:r r b -1 0.1 1.0",),
    check=Check(
        SMOOTHED_DRAW, cross_entropy_saved, run=smoothed_backward_run,
        want=lambda a: [ref.cross_entropy_backward(a["logits"], a["targets"], a["ignore_index"],
                                                   a["dloss"], a["label_smoothing"])],
        tol=smoothed_backward_tol,
        emu_tol=lambda a, want: smoothed_backward_tol(a, want, 4),
        outputs=("dlogits",), emu=SMOOTHED_EMU, threads=SMOOTHED_THREADS),
    fast=(Fast("chain", SMOOTHED_FAST_DRAW, smoothed_fast_make, smoothed_chain,
               smoothed_fast_tol),),
    bad=(
        Bad(lambda: ops.cross_entropy_backward(*ce, z(2), label_smoothing=1.0001), ValueError,
            r"label_smoothing must be finite and in \[0, 1\], got 1.0001"),
        Bad(lambda: ops.cross_entropy_backward(*ce, z(2), label_smoothing=float("nan")),
            ValueError, r"label_smoothing must be finite and in \[0, 1\], got nan",
            "label_smoothing-nan"),
        Bad(lambda: ops.cross_entropy_backward(*ce, z(2), label_smoothing=-1e-30), ValueError,
            r"label_smoothing must be finite and in \[0, 1\]"),
        Bad(lambda: ops.cross_entropy_backward(*ce, z(2), label_smoothing=np.bool_(True)),
            TypeError, r"label_smoothing must be a real number, got bool"),
    ),
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_label_smoothing.py::test_backward_matches_torch",
               "tests/kernels/test_label_smoothing.py::"
               "test_gradient_rows_sum_to_zero_and_ignored_rows_are_zero",
               "tests/cuda/test_cuda_label_smoothing.py::test_twins_match_the_c_kernels"),
)


# ---- adamw and the sum of squares -------------------------------------------------------------

def adamw_make(seed, count, step=1, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0):
    rng = np.random.default_rng(seed)
    param, grad = f32(rng, count), f32(rng, count)
    m, v = f32(rng, count, 0.1), abs(f32(rng, count, 0.1))
    return dict(seed=seed, step=step, lr=lr, beta1=beta1, beta2=beta2,
                weight_decay=weight_decay, param=param, grad=grad, m=m, v=v)


def adamw_run(a):
    ops.adamw_step(a["param"], a["grad"], a["m"], a["v"], a["step"], a["lr"], a["beta1"],
                   a["beta2"], 1e-8, a["weight_decay"])
    return [a["param"], a["m"], a["v"]]


def adamw_tol(a, want):
    """float32 rounding of each term: the old value and the change made to it"""
    tols = []
    for name, r in zip(("param", "m", "v"), want):
        before = a[name].astype(np.float64)
        scale = abs(before) + abs(r - before) + abs(a["grad"]) * (1 - a["beta1"]) * (name == "m")
        tols.append(Tol(8 * EPS32 * scale + 1e-12))
    return tols


def adamw_fast_make(seed, count, step):
    rng = np.random.default_rng(seed)
    p0, g = f32(rng, count), f32(rng, count)
    return dict(param=p0, grad=g, m=f32(rng, count, 0.1), v=abs(f32(rng, count)) * 0.01,
                step=step)


ADAMW_STEP = Op(
    "adamw_step",
    limits=Limits(("F F F F {0} 1 0.001 0.9 0.999 1e-8 0.0",), COUNT),
    exact=("F:b*a F:b*a F:b*a F:b*a b*a 3 0.001 0.9 0.999 1e-8 0.1",),
    check=Check(
        drawn(count=awkward, step=st.sampled_from([1, 2, 10, 1000]),
              lr=st.sampled_from([1e-3, 0.1]), beta1=st.sampled_from([0.9, 0.0]),
              beta2=st.sampled_from([0.999, 0.95]), weight_decay=st.sampled_from([0.0, 0.1])),
        adamw_make, run=adamw_run,
        want=lambda a: list(ref.adamw_step(a["param"], a["grad"], a["m"], a["v"], a["step"],
                                           a["lr"], a["beta1"], a["beta2"], 1e-8,
                                           a["weight_decay"])),
        tol=adamw_tol, outputs=("param", "m", "v"),
        emu=tuple(dict(count=c, step=s, weight_decay=wd, seed=c + s)
                  for c in (1, 7, 257, 1000) for s, wd in [(1, 0.0), (1000, 0.1)]),
        threads=(dict(count=300 * 257, weight_decay=0.1, seed=3),)),
    fast=(Fast("count", drawn(count=fast_cols, step=st.sampled_from([1, 2, 1000])),
               adamw_fast_make,
               lambda a: adamw_run(dict(a, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.1)),
               lambda a, got, plain: [Tol(1e-7, 1e-6)] * 3),),
    bad=(
        Bad(lambda: ops.adamw_step(z(3), z(3), z(3), z(3), step=0, lr=0.1), ValueError,
            r"step must be >= 1, got 0"),
        Bad(lambda: ops.adamw_step(z(3), z(3), z(3), z(3), step=1.5, lr=0.1), TypeError,
            r"step must be an integer"),
        Bad(lambda: ops.adamw_step(z(3), z(3), z(3), z(3), step=1, lr=-0.1), ValueError,
            r"lr must be finite and >= 0"),
        Bad(lambda: ops.adamw_step(z(3), z(3), z(3), z(3), step=1, lr=0.1, beta1=1.0), ValueError,
            r"beta1 must be in \[0, 1\)"),
        Bad(lambda: ops.adamw_step(z(3), z(4), z(3), z(3), step=1, lr=0.1), ValueError,
            r"grad must have shape \(3,\)"),
        Bad(lambda: ops.adamw_step(z(4, 3), z(4, 3), readonly, z(4, 3), step=1, lr=0.1),
            ValueError, r"m must be writable"),
        Bad(lambda: ops.adamw_step(x23, z(2, 3), x23, z(2, 3), step=1, lr=0.1), ValueError,
            r"param and m must not share memory"),
        Bad(lambda: adamw(step=True), TypeError, r"step must be an integer, got bool"),
        Bad(lambda: adamw(step=HUGE), ValueError, r"step must fit in int64"),
        Bad(lambda: adamw(step=2**63 - 1, lr=0.0), None, None, "the-largest-step-is-accepted"),
        Bad(lambda: adamw(lr=HUGE), ValueError, r"lr must fit in float64"),
        Bad(lambda: adamw(lr=True), TypeError, r"lr must be a real number, got bool"),
        Bad(lambda: adamw(lr=float("nan")), ValueError, r"lr must be finite and >= 0, got nan"),
        Bad(lambda: adamw(beta1=float("nan")), ValueError, r"beta1 must be in \[0, 1\), got nan"),
        Bad(lambda: adamw(beta2=np.True_), TypeError, r"beta2 must be a real number, got bool"),
        Bad(lambda: adamw(eps=-HUGE), ValueError, r"eps must fit in float64"),
        Bad(lambda: adamw(eps=float("inf")), ValueError, r"eps must be finite and > 0, got inf"),
        Bad(lambda: adamw(weight_decay=float("nan")), ValueError, r"weight_decay must be finite"),
        Bad(lambda: adamw(weight_decay=False), TypeError, r"weight_decay must be a real number"),
    ),
    tested_in=("tests/kernels/test_properties.py::test_first_adamw_step_equals_its_closed_form",),
)


def sum_squares_make(seed, count, scale=2.0):
    return dict(seed=seed, x=f32(np.random.default_rng(seed), count, scale))


SUM_SQUARES = Op(
    "sum_squares",
    limits=Limits(("D F {0}",), COUNT),
    exact=("D:1 F:r*a r*a",),
    check=Check(
        # past 64 blocks of 16384 the block sums go to scratch
        drawn(count=st.one_of(awkward, st.sampled_from([0, 16384, 16385, 65 * 16384 + 3]))),
        sum_squares_make, run=lambda a: [ops.sum_squares(a["x"])],
        # float32 squares are exact in float64: their correctly rounded sum
        want=lambda a: [math.fsum(np.square(a["x"].astype(np.float64)))],
        tol=lambda a, want: [Tol((a["x"].size + 1) * 2.0**-52 * abs(want[0]), 0.0)],
        outputs=("sum",), emu=tuple(dict(count=c, seed=c) for c in (0, 1, 257, 5000)),
        threads=(dict(count=300 * 257, seed=3), dict(count=65 * 16384 + 3, seed=3))),
    fast="one version: double sums of fixed blocks, in order",
    bad=(Bad(lambda: ops.sum_squares(z(3, dtype=np.float64)), TypeError,
             r"x must have dtype float32, got float64"),
         Bad(lambda: ops.sum_squares([1.0, 2.0]), TypeError,
             r"x must be a numpy.ndarray of float32, got list")),
    scratch="one double per block past 64 blocks of 16384 floats: 8 bytes per 64 KiB of input, "
            "too little to run out of on its own",
    reference=False,
    tested_in=("tests/model/test_flat.py::test_sum_squares_is_the_float64_sum",
               "tests/cuda/test_cuda_emu.py::test_sum_squares"),
)


# ---- attention --------------------------------------------------------------------------------

def score_error(q, k, scale):
    """The float32 rounding error to expect in one score, scale·q·k: rounding errors of a
    D-term dot product grow like sqrt(D) (with a safety factor of 8)."""
    D = q.shape[-1]
    return 8 * D**0.5 * EPS32 * amax(q) * amax(k) * scale + EPS32


def softmax_rel(q, k, scale, T):
    """Relative error to expect in probabilities and outputs: a score off by δ moves its
    probability by a factor e^±δ (the shift by the row max cancels), and the sums over T keys
    add their own rounding."""
    return np.expm1(2 * score_error(q, k, scale)) + 8 * (T**0.5 + 1) * EPS32


def _scale(a):
    return 1 / np.sqrt(a["q"].shape[-1]) if a["scale"] is None else a["scale"]


def attention_make(seed, B, T, H, D, causal=True, scale=None, group=1, window=0):
    """q, dy [B, T, H·group, D], k, v [B, T, H, D] (group query heads per key/value head);
    window: the sliding window where causal (a window needs causal attention), else 0"""
    rng = np.random.default_rng(seed)
    q = f32(rng, (B, T, H * group, D))
    k, v = f32(rng, (B, T, H, D)), f32(rng, (B, T, H, D))
    return dict(seed=seed, causal=causal, scale=scale, q=q, k=k, v=v, dy=f32(rng, q.shape),
                group=group, window=window if causal else 0)


def attention_saved(**drawn_values):
    a = attention_make(**drawn_values)
    a["o"], a["lse"] = ops.attention_forward(a["q"], a["k"], a["v"], a["causal"], a["scale"],
                                             window=a["window"])
    return a


def finite_amax(a):
    """max |a| over its finite values (a padded row's lse is -inf), 0 if none"""
    a = np.asarray(a, np.float64)
    return amax(np.where(np.isfinite(a), a, 0.0))


def attention_tol(a, want):
    """o and lse: a row's sums run over its keys, at most Tk (k's axis 1)"""
    rel = softmax_rel(a["q"], a["k"], _scale(a), a["k"].shape[1])
    return [Tol(rel * amax(a["v"])), Tol(rel + EPS32 * finite_amax(want[1]))]


def attention_backward_tol(a, want):
    """dS = P·(dO·v − rowsum(dO∘O)) cancels: its noise is about rel·|dO||v|·sqrt(D)"""
    q, k, v, dy = a["q"], a["k"], a["v"], a["dy"]
    s, D = _scale(a), q.shape[-1]
    rel = softmax_rel(q, k, s, max(q.shape[1], k.shape[1]))  # sums over keys, or over rows
    noise = rel * s * D**0.5 * amax(dy) * amax(v)
    G = a.get("group", 1)  # dk and dv sum the group's G heads: G times the noise of one
    floors = (noise * amax(k), G * noise * amax(q), G * rel * amax(dy))
    return [Tol(4 * rel * amax(r) + floor) for r, floor in zip(want, floors)]


def attention_fast_tol(a, got, plain):
    """Dot products of length D, sums over up to T keys (dk, dv: over the group's heads too)"""
    T, D = max(a["q"].shape[1], a["k"].shape[1]), a["q"].shape[-1]  # sums over keys or rows
    bound = np.sqrt(D) * T * a.get("group", 1) * EPS32
    return [Tol(4 * bound * max(1.0, amax(p)), 1e-5) for p in plain]


def attention_chain(a):
    o, lse = ops.attention_forward(a["q"], a["k"], a["v"], causal=a["causal"],
                                   window=a["window"])
    return [o, lse, *ops.attention_backward(a["dy"], a["q"], a["k"], a["v"], o, lse,
                                            causal=a["causal"], window=a["window"])]


def attention_run(a):
    return list(ops.attention_forward(a["q"], a["k"], a["v"], a["causal"], a["scale"],
                                      window=a["window"]))


def attention_want(a):
    return list(ref.attention_forward(a["q"], a["k"], a["v"], a["causal"], a["scale"],
                                      a["window"]))


def attention_backward_run(a):
    return list(ops.attention_backward(a["dy"], a["q"], a["k"], a["v"], a["o"], a["lse"],
                                       a["causal"], a["scale"], window=a["window"]))


def attention_backward_want(a):
    return list(ref.attention_backward(a["dy"], a["q"], a["k"], a["v"], a["causal"],
                                       a["scale"], a["window"]))


def padded_lengths(rng, B, T):
    """B lengths in [0, T]: the whole T a quarter of the time, 0 an eighth, else any"""
    u = rng.random(B)
    drawn = rng.integers(0, T + 1, B)
    return [int(T if x < 0.25 else 0 if x < 0.375 else d) for x, d in zip(u, drawn)]


def padded_make(seed, B, Tq, Tk, H, D, causal=True, scale=None, group=1, window=0,
                lens="both"):
    """q, dy [B, Tq, H·group, D], k, v [B, Tk, H, D]; lens: which of q_lens, k_lens are given
    ("none", "q", "k", "both"), each a list of B lengths (padded_lengths); window as
    attention_make's"""
    rng = np.random.default_rng(seed)
    q = f32(rng, (B, Tq, H * group, D))
    k, v = f32(rng, (B, Tk, H, D)), f32(rng, (B, Tk, H, D))
    q_lens = padded_lengths(rng, B, Tq) if lens in ("q", "both") else None
    k_lens = padded_lengths(rng, B, Tk) if lens in ("k", "both") else None
    return dict(seed=seed, causal=causal, scale=scale, q=q, k=k, v=v, dy=f32(rng, q.shape),
                group=group, window=window if causal else 0, q_lens=q_lens, k_lens=k_lens)


def _lens(a):
    return dict(window=a["window"], q_lens=a["q_lens"], k_lens=a["k_lens"])


def padded_saved(**drawn_values):
    a = padded_make(**drawn_values)
    a["o"], a["lse"] = ops.attention_forward(a["q"], a["k"], a["v"], a["causal"], a["scale"],
                                             **_lens(a))
    return a


def padded_run(a):
    return list(ops.attention_forward(a["q"], a["k"], a["v"], a["causal"], a["scale"],
                                      **_lens(a)))


def padded_want(a):
    return list(ref.attention_forward(a["q"], a["k"], a["v"], a["causal"], a["scale"],
                                      **_lens(a)))


def padded_backward_run(a):
    return list(ops.attention_backward(a["dy"], a["q"], a["k"], a["v"], a["o"], a["lse"],
                                       a["causal"], a["scale"], **_lens(a)))


def padded_backward_want(a):
    return list(ref.attention_backward(a["dy"], a["q"], a["k"], a["v"], a["causal"],
                                       a["scale"], **_lens(a)))


def padded_chain(a):
    o, lse = ops.attention_forward(a["q"], a["k"], a["v"], a["causal"], **_lens(a))
    return [o, lse, *ops.attention_backward(a["dy"], a["q"], a["k"], a["v"], o, lse,
                                            a["causal"], **_lens(a))]


def decode_make(seed, B, n_new, H, D, start, spare=0, scale=None, group=1, window=0):
    """caches [B, Tmax, H, D] with Tmax = start + n_new + spare, queries [B, n_new, H·group, D]
    (group query heads per cached head), keys and values [B, n_new, H, D]"""
    rng = np.random.default_rng(seed)
    Tmax = start + n_new + spare
    k_cache, v_cache = f32(rng, (B, Tmax, H, D)), f32(rng, (B, Tmax, H, D))
    return dict(seed=seed, start=start, scale=scale, k_cache=k_cache, v_cache=v_cache,
                q=f32(rng, (B, n_new, H * group, D)), k=f32(rng, (B, n_new, H, D)),
                v=f32(rng, (B, n_new, H, D)), group=group, window=window)


def decode_reference(q, k_cache, v_cache, start, scale, window=0):
    """float64: query i at position start + i sees the cached keys 0 .. start + i (with a
    window, those after start + i − window); query head h the cached head h // (H / Hkv)"""
    n_new = q.shape[1]
    Tk = start + n_new
    G = q.shape[2] // k_cache.shape[2]
    k, v = (np.repeat(c[:, :Tk].astype(np.float64), G, axis=2) for c in (k_cache, v_cache))
    S = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k) * scale
    S = np.where(ref.attention_mask(n_new, True, window, start, Tk), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(S - m).sum(axis=-1))
    P = np.exp(S - lse[..., None])
    return np.einsum("bhts,bshd->bthd", P, v), lse


def decode_tol(a, want):
    rel = softmax_rel(a["q"], a["k_cache"], _scale(a), a["start"] + a["q"].shape[1])
    return [Tol(rel * amax(a["v_cache"])), Tol(rel + EPS32 * amax(want[1]))]


def decode_run(a):
    return list(ops.attention_decode(a["q"], a["k_cache"], a["v_cache"], a["start"], a["scale"],
                                     window=a["window"]))


def decode_want(a):
    return list(decode_reference(a["q"], a["k_cache"], a["v_cache"], a["start"], _scale(a),
                                 a["window"]))


def cache_append_want(a):
    k_cache, v_cache = a["k_cache"].copy(), a["v_cache"].copy()
    at = slice(a["start"], a["start"] + a["k"].shape[1])
    k_cache[:, at], v_cache[:, at] = a["k"], a["v"]
    return [k_cache, v_cache]


def cache_append_run(a):
    ops.attention_cache_append(a["k_cache"], a["v_cache"], a["k"], a["v"], a["start"])
    return [a["k_cache"], a["v_cache"]]


ATTENTION_DRAW = drawn(B=st.sampled_from([1, 2]),
                       T=st.one_of(awkward, st.sampled_from([31, 32, 33, 63, 64, 65, 97])),
                       H=st.sampled_from([1, 3, 8]),
                       D=st.sampled_from([1, 2, 8, 16, 64, 80, 128]), causal=st.booleans(),
                       scale=st.sampled_from([None, 0.05, 1.0]))
ATTENTION_EMU = (dict(B=1, T=1, H=1, D=1, seed=1), dict(B=2, T=33, H=3, D=3, causal=False, seed=2),
                 dict(B=1, T=65, H=2, D=16, seed=3))
ATTENTION_FAST_DRAW = drawn(B=st.sampled_from([1, 2]),
                            T=st.sampled_from([8, 9, 31, 63, 64, 65, 129, 200]),
                            H=st.sampled_from([1, 3]), D=st.sampled_from([1, 5, 16, 33, 64, 80]),
                            causal=st.booleans())
ATTENTION_SCRATCH = """
B, T, H, D = 1, 512, 1, 4096
q, k, v, dy = randn(B, T, H, D), randn(B, T, H, D), randn(B, T, H, D), randn(B, T, H, D)
"""
TQ_TK = 64 * (256 + 16)  # attention.c: the forward's TQ×LDS tile of scores
TQB_TKB = 64 * (64 + 16)  # and the backward's TQB×LDSB
DECODE_DRAW = drawn(B=st.sampled_from([1, 2]), n_new=st.integers(1, 12),
                    H=st.sampled_from([1, 3]), D=st.sampled_from([1, 8, 16, 64]),
                    start=st.integers(0, 70), spare=st.sampled_from([0, 3]),
                    scale=st.sampled_from([None, 0.5]))

ATTENTION_FORWARD = Op(
    "attention_forward",
    limits=Limits(("F F F F F {0} {1} {2} {3} 0.5 0", "F F F F F {0} {1} {2} {3} 0.5 1"), HEADS),
    exact=("F:2*r*b*a F:2*b*r F:2*r*b*a F:2*r*b*a F:2*r*b*a 2 r b a 0.5 0",
           "F:2*r*b*a F:2*b*r F:2*r*b*a F:2*r*b*a F:2*r*b*a 2 r b a 0.5 1"),
    check=Check(
        ATTENTION_DRAW, attention_make,
        run=lambda a: list(ops.attention_forward(a["q"], a["k"], a["v"], a["causal"],
                                                 a["scale"])),
        want=lambda a: list(ref.attention_forward(a["q"], a["k"], a["v"], a["causal"],
                                                  a["scale"])),
        tol=attention_tol, outputs=("o", "lse"), emu=ATTENTION_EMU,
        threads=(dict(B=3, T=77, H=5, D=24, seed=7),)),
    fast=(Fast("tiled", ATTENTION_FAST_DRAW, attention_make, lambda a: attention_chain(a)[:2],
               attention_fast_tol, isas=("avx2", "avx512")),),
    bad=(
        Bad(lambda: ops.attention_forward(q4, q4, q4, scale=HUGE), ValueError,
            r"scale must fit in float32", "scale-huge"),
        Bad(lambda: ops.attention_forward(q4, q4, q4, scale=1e39), ValueError,
            r"scale must fit in float32", "scale-1e39"),
        Bad(lambda: ops.attention_forward(q4, q4, q4, scale=True), TypeError,
            r"scale must be a real number, got bool"),
        Bad(lambda: ops.attention_forward(q4, q4, q4, scale=-float("inf")), ValueError,
            r"scale must be finite", "scale-minus-inf"),
        Bad(lambda: ops.attention_forward(q4, q4, q4, scale=float("nan")), ValueError,
            r"scale must be finite", "scale-nan"),
        Bad(lambda: ops.attention_forward(q4, q4, q4, causal=None), TypeError,
            r"causal must be a bool \(True or False\), got NoneType"),
        Bad(lambda: ops.attention_forward(q4, q4, q4, causal=0), TypeError,
            r"causal must be a bool .*got int"),
        Bad(lambda: ops.attention_forward(q4, q4, q4, causal="no"), TypeError,
            r"causal must be a bool .*got str"),
        Bad(lambda: ops.attention_forward(q4, q4, q4, causal=np.False_), None, None,
            "causal-np-False-is-accepted"),
        Bad(lambda: ops.attention_forward(z(2, 5, 3, 4), z(3, 6, 3, 4), z(3, 6, 3, 4)),
            ValueError, r"k must have shape \(B, Tk, Hkv, D\) = \(2, Tk, Hkv, 4\) with Hkv "
            r"dividing q's H = 3 \(grouped-query heads\), got \(3, 6, 3, 4\)"),
        Bad(lambda: ops.attention_forward(z(2, 5, 3, 4), z(2, 6, 3, 4), z(2, 5, 3, 4)),
            ValueError, r"v must have shape \(2, 6, 3, 4\) \(k.shape\), got \(2, 5, 3, 4\)"),
        Bad(lambda: ops.attention_forward(z(2, 5, 3, 0), z(2, 5, 3, 0), z(2, 5, 3, 0)),
            ValueError, r"q.shape\[3\] \(head dim D\) must be >= 1"),
        Bad(lambda: ops.attention_forward(z(5, 3, 4), z(5, 3, 4), z(5, 3, 4)), ValueError,
            r"q must have 4 dim"),
    ),
    scratch=Scratch(fast_path_only=True, setup=ATTENTION_SCRATCH + f"""
call = lambda: list(ops.attention_forward(q, k, v))
out_bytes = 4 * (B * T * H * D + B * H * T)  # o, lse
scratch_bytes = 4 * threads * (D * T + {TQ_TK} + 2 * 64)  # forward_ws_floats per thread
"""),
    tested_in=("tests/kernels/test_attention.py::test_attention_across_the_key_tiles",
               "tests/kernels/test_attention.py::test_causal_attention_ignores_the_future",
               "tests/cuda/test_cuda_attention.py::test_attention_forward_and_backward"),
)

ATTENTION_BACKWARD = Op(
    "attention_backward",
    limits=Limits(("F F F F F F F F F {0} {1} {2} {3} 0.5 0",
                   "F F F F F F F F F {0} {1} {2} {3} 0.5 1"), HEADS),
    exact=tuple(f"F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a "
                f"F:2*r*b*a F:2*b*r 2 r b a 0.5 {causal}" for causal in (0, 1)),
    check=Check(
        ATTENTION_DRAW, attention_saved,
        run=lambda a: list(ops.attention_backward(a["dy"], a["q"], a["k"], a["v"], a["o"],
                                                  a["lse"], a["causal"], a["scale"])),
        want=lambda a: list(ref.attention_backward(a["dy"], a["q"], a["k"], a["v"], a["causal"],
                                                   a["scale"])),
        tol=attention_backward_tol, outputs=("dq", "dk", "dv"), emu=ATTENTION_EMU,
        threads=(dict(B=3, T=77, H=5, D=24, seed=7),)),
    fast=(Fast("chain", ATTENTION_FAST_DRAW, attention_make, attention_chain, attention_fast_tol,
               isas=("avx2", "avx512")),),
    bad=(
        Bad(lambda: ops.attention_backward(q4, q4, q4, q4, q4, z(1, 2, 2), scale=1e39),
            ValueError, r"scale must fit in float32"),
        Bad(lambda: ops.attention_backward(q4, q4, q4, q4, q4, z(1, 2, 2), causal=None),
            TypeError, r"causal must be a bool"),
        Bad(lambda: ops.attention_backward(*[z(2, 5, 3, 4)] * 5, z(2, 5, 3)), ValueError,
            r"lse must have shape \(2, 3, 5\)"),
        Bad(lambda: ops.attention_backward(z(2, 5, 3, 5), *[z(2, 5, 3, 4)] * 4, z(2, 3, 5)),
            ValueError, r"dy must have shape"),
    ),
    scratch=Scratch(fast_path_only=True, setup=ATTENTION_SCRATCH + f"""
o, lse = ops.attention_forward(q, k, v)
call = lambda: list(ops.attention_backward(dy, q, k, v, o, lse))
out_bytes = 4 * 3 * B * T * H * D  # dq, dk, dv
scratch_bytes = 4 * threads * (2 * D * T + 2 * {TQB_TKB} + T)  # backward_fast, per thread
"""),
    tested_in=("tests/kernels/test_attention.py::test_attention_across_the_key_tiles",
               "tests/cuda/test_cuda_attention.py::test_backward_is_the_same_bits_on_every_run"),
)

ATTENTION_CACHE_APPEND = Op(
    "attention_cache_append",
    limits=Limits(("F F F F {0} {1} {2} {3} {4} {5}",), CACHE),
    exact=("F:2*(r+1)*b*a F:2*(r+1)*b*a F:2*r*b*a F:2*r*b*a 2 r b a r+1 1",),
    check=Check(
        drawn(B=st.sampled_from([1, 2]), n_new=st.integers(1, 9), H=st.sampled_from([1, 3]),
              D=st.sampled_from([1, 5, 8]), start=st.integers(0, 20),
              spare=st.sampled_from([0, 2])),
        decode_make, run=cache_append_run, want=cache_append_want,
        tol=lambda a, want: [EXACT, EXACT], outputs=("k_cache", "v_cache"),
        emu=(dict(B=2, n_new=7, H=3, D=5, start=9, spare=4, seed=3),), same_bits_as_c=True),
    fast="a copy: one version",
    bad=(
        Bad(lambda: ops.attention_cache_append(z(1, 8, 2, 4), z(1, 8, 2, 4), q4, q4,
                                               start=-(2**70)),
            ValueError, r"start must fit in int64"),
        Bad(lambda: ops.attention_cache_append(z(1, 8, 2, 4), z(1, 8, 2, 4), q4, q4, start=None),
            TypeError, r"start must be an integer, got NoneType"),
        Bad(lambda: ops.attention_cache_append(z(2, 8, 3, 4), z(2, 8, 3, 4), z(2, 5, 3, 4),
                                               z(2, 5, 3, 4), start=-1),
            ValueError, r"cache overflow"),
        Bad(lambda: ops.attention_cache_append(z(2, 8, 3, 4), z(2, 9, 3, 4), z(2, 5, 3, 4),
                                               z(2, 5, 3, 4), start=0),
            ValueError, r"v_cache must have shape \(2, 8, 3, 4\)"),
    ),
    reference=False,
    tested_in=("tests/kernels/test_attention.py::"
               "test_a_full_kv_cache_refuses_more_and_keeps_its_contents",
               "tests/cuda/test_cuda_attention.py::test_cache_append"),
)

ATTENTION_DECODE = Op(
    "attention_decode",
    limits=Limits(("F F F F F {0} {1} {2} {3} {4} {5} 0.5",), CACHE),
    exact=("F:2*r*b*a F:2*b*r F:2*r*b*a F:2*(r+1)*b*a F:2*(r+1)*b*a 2 r b a r+1 1 0.5",),
    check=Check(
        DECODE_DRAW, decode_make, run=decode_run,
        want=lambda a: list(decode_reference(a["q"], a["k_cache"], a["v_cache"], a["start"],
                                             _scale(a))),
        tol=decode_tol, outputs=("o", "lse"),
        emu=(dict(B=1, n_new=1, H=1, D=64, start=0, spare=3, seed=1),
             dict(B=1, n_new=20, H=1, D=3, start=100, spare=1, seed=2),
             dict(B=2, n_new=3, H=2, D=16, start=100, spare=7, seed=3)),
        threads=(dict(B=2, n_new=1, H=3, D=16, start=250, spare=49, seed=3),)),  # 1 query
    fast=(
        # n_new >= 8 new queries at once through the cache (a prompt) takes the tiled path too
        Fast("tiled", drawn(n_new=st.sampled_from([8, 40, 100]), start=st.sampled_from([0, 1, 50])),
             lambda seed, n_new, start: decode_make(seed, 2, n_new, 3, 16, start,
                                                    200 - n_new - start),
             decode_run, lambda a, got, plain: [Tol(1e-5, 1e-5)] * 2, isas=("avx2", "avx512")),
        # fewer than 8: each row alone on the row kernels (scores by gemv, the online softmax
        # step, attn_pv_row), tiles of 64 keys; as the forward: dot products of length D (each
        # side off by up to D roundings of sqrt(D)-sized terms), sums over up to T keys
        Fast("rows", drawn(B=st.sampled_from([1, 2]), n_new=st.sampled_from([1, 2, 7]),
                           H=st.sampled_from([1, 3]), D=st.sampled_from([1, 5, 16, 32, 33]),
                           start=st.sampled_from([0, 1, 63, 64, 65, 150])),
             lambda seed, B, n_new, H, D, start: decode_make(seed, B, n_new, H, D, start, 3),
             decode_run,
             lambda a, got, plain: [Tol(4 * np.sqrt(a["q"].shape[-1]) * EPS32
                                        * (a["start"] + a["q"].shape[1]), 1e-5)] * 2),
    ),
    bad=(
        Bad(lambda: decode(start=True), TypeError, r"start must be an integer, got bool"),
        Bad(lambda: decode(start=2**64), ValueError, r"start must fit in int64"),
        Bad(lambda: decode(0, scale=HUGE), ValueError, r"scale must fit in float32"),
        Bad(lambda: decode(0, scale=float("nan")), ValueError, r"scale must be finite"),
        Bad(lambda: ops.attention_decode(z(2, 5, 3, 4), z(2, 8, 3, 4), z(2, 8, 3, 4), start=4),
            ValueError, r"cache overflow: positions \[4, 9\) do not fit in a cache of Tmax = 8"),
        Bad(lambda: ops.attention_decode(z(2, 5, 3, 4), z(2, 8, 2, 4), z(2, 8, 2, 4), start=0),
            ValueError, r"k_cache must have shape \(B, Tmax, Hkv dividing H, D\) = "
            r"\(2, Tmax, Hkv, 4\) to match q of shape \(2, 5, 3, 4\), got \(2, 8, 2, 4\)"),
    ),
    scratch=Scratch(fast_path_only=True, setup=f"""
B, Tmax, H, D, start, n_new = 1, 512, 1, 4096, 448, 64  # n_new >= 8: the tiled path
q, k_cache, v_cache = randn(B, n_new, H, D), randn(B, Tmax, H, D), randn(B, Tmax, H, D)
call = lambda: list(ops.attention_decode(q, k_cache, v_cache, start))
out_bytes = 4 * (B * n_new * H * D + B * H * n_new)  # o, lse
scratch_bytes = 4 * threads * (D * (start + n_new) + {TQ_TK} + 2 * 64)  # as the forward's
"""),
    reference=False,
    tested_in=("tests/kernels/test_attention.py::"
               "test_decoding_through_the_kv_cache_reproduces_the_full_forward",
               "tests/cuda/test_cuda_attention.py::test_decode"),
)


# ---- attention with grouped-query heads and a sliding window ----------------------------------
# ops.attention_forward/backward/decode call these when k's heads are fewer than q's or a window
# is given (the entries above: Hkv = H and no window, the same code)

GQA_DRAW = drawn(B=st.sampled_from([1, 2]),
                 T=st.one_of(awkward, st.sampled_from([31, 33, 64, 65, 97])),
                 H=st.sampled_from([1, 2, 3]), group=st.sampled_from([1, 2, 4]),
                 D=st.sampled_from([1, 3, 8, 64, 96, 256]), causal=st.booleans(),
                 scale=st.sampled_from([None, 0.05, 1.0]),
                 window=st.sampled_from([0, 1, 2, 7, 32, 33, 64, 200]))
GQA_EMU = (dict(B=1, T=1, H=1, D=1, group=2, window=1, seed=1),
           dict(B=2, T=33, H=1, D=3, group=3, causal=False, seed=2),  # multi-query
           dict(B=1, T=130, H=2, D=16, group=2, window=70, seed=3),  # tiles past the window
           dict(B=1, T=65, H=1, D=80, group=4, window=1, seed=4))
GQA_FAST_DRAW = drawn(B=st.sampled_from([1, 2]),
                      T=st.sampled_from([8, 9, 31, 63, 64, 65, 129, 200, 300]),
                      H=st.sampled_from([1, 2]), group=st.sampled_from([1, 2, 3]),
                      D=st.sampled_from([1, 5, 16, 33, 64, 80]), causal=st.booleans(),
                      window=st.sampled_from([0, 1, 5, 64, 65, 100, 257]))
gq, gkv = z(1, 2, 4, 4), z(1, 2, 2, 4)  # 4 query heads on 2 key/value heads
# HEADS and CACHE with Hkv after H: Hkv = H, and Hkv = 1 (multi-query)
GQA_HEADS = tuple((B, T, H, Hkv, D) for B, T, H, D in HEADS for Hkv in (H, 1))
GQA_CACHE = tuple((B, n, H, Hkv, D, Tmax, start) for B, n, H, D, Tmax, start in CACHE
                  for Hkv in (H, 1)
                  # (Hkv = 1 shrinks the cache below the limit where q alone does not pass it)
                  if Hkv == H or start + n > Tmax or B * n * H * D >= P61)

ATTENTION_GQA_FORWARD = Op(
    "attention_gqa_forward",
    limits=Limits(("F F F F F {0} {1} {2} {3} {4} 0.5 0 0",
                   "F F F F F {0} {1} {2} {3} {4} 0.5 1 5"), GQA_HEADS),
    exact=("F:2*r*b*a F:2*b*r F:2*r*b*a F:2*r*a F:2*r*a 2 r b 1 a 0.5 1 3",
           "F:2*r*b*a F:2*b*r F:2*r*b*a F:2*r*b*a F:2*r*b*a 2 r b b a 0.5 0 0"),
    check=Check(GQA_DRAW, attention_make, run=attention_run, want=attention_want,
                tol=attention_tol, outputs=("o", "lse"), emu=GQA_EMU,
                threads=(dict(B=3, T=77, H=2, D=24, group=3, window=20, seed=7),)),
    fast=(Fast("tiled", GQA_FAST_DRAW, attention_make, lambda a: attention_chain(a)[:2],
               attention_fast_tol, isas=("avx2", "avx512")),),
    bad=(
        Bad(lambda: ops.attention_forward(z(1, 2, 3, 4), gkv, gkv), ValueError,
            r"k must have shape \(B, Tk, Hkv, D\) = \(1, Tk, Hkv, 4\) with Hkv dividing q's "
            r"H = 3 \(grouped-query heads\), got \(1, 2, 2, 4\)"),
        Bad(lambda: ops.attention_forward(gq, gkv, z(1, 2, 1, 4)), ValueError,
            r"v must have shape \(1, 2, 2, 4\)"),
        Bad(lambda: ops.attention_forward(gq, gkv, gkv, window=-1), ValueError,
            r"window must be >= 0 \(0: no sliding window\), got -1"),
        Bad(lambda: ops.attention_forward(gq, gkv, gkv, window=True), TypeError,
            r"window must be an integer, got bool"),
        Bad(lambda: ops.attention_forward(gq, gkv, gkv, causal=False, window=2), ValueError,
            r"window = 2 needs causal=True"),
        Bad(lambda: ops.attention_forward(gq, gkv, gkv, window=2**64), ValueError,
            r"window must fit in int64"),
    ),
    scratch=Scratch(fast_path_only=True, setup=ATTENTION_SCRATCH + f"""
call = lambda: list(ops.attention_forward(q, k, v, window=T))
out_bytes = 4 * (B * T * H * D + B * H * T)  # o, lse
scratch_bytes = 4 * threads * (D * T + {TQ_TK} + 2 * 64)  # forward_ws_floats per thread
"""),
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_attention.py::test_gqa_is_multi_head_attention_on_repeated_kv",
               "tests/kernels/test_attention.py::test_attention_matches_torch_sdpa_with_gqa",
               "tests/kernels/test_attention.py::test_sliding_window_matches_transformers_mask"),
)

ATTENTION_GQA_BACKWARD = Op(
    "attention_gqa_backward",
    limits=Limits(("F F F F F F F F F {0} {1} {2} {3} {4} 0.5 1 0",
                   "F F F F F F F F F {0} {1} {2} {3} {4} 0.5 1 7"), GQA_HEADS),
    exact=("F:2*r*b*a F:2*r*a F:2*r*a F:2*r*b*a F:2*r*b*a F:2*r*a F:2*r*a F:2*r*b*a F:2*b*r "
           "2 r b 1 a 0.5 1 3",
           "F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a F:2*r*b*a "
           "F:2*b*r 2 r b b a 0.5 0 0"),
    check=Check(GQA_DRAW, attention_saved, run=attention_backward_run,
                want=attention_backward_want, tol=attention_backward_tol,
                outputs=("dq", "dk", "dv"), emu=GQA_EMU,
                threads=(dict(B=3, T=77, H=2, D=24, group=3, window=20, seed=7),)),
    fast=(Fast("chain", GQA_FAST_DRAW, attention_make, attention_chain, attention_fast_tol,
               isas=("avx2", "avx512")),),
    bad=(
        Bad(lambda: ops.attention_backward(gq, gq, z(1, 2, 3, 4), z(1, 2, 3, 4), gq,
                                           z(1, 4, 2)), ValueError, r"Hkv dividing q's H = 4"),
        Bad(lambda: ops.attention_backward(gq, gq, gkv, gkv, gq, z(1, 4, 2), window=-3),
            ValueError, r"window must be >= 0"),
    ),
    scratch=Scratch(fast_path_only=True, setup=ATTENTION_SCRATCH + f"""
o, lse = ops.attention_forward(q, k, v, window=T)
call = lambda: list(ops.attention_backward(dy, q, k, v, o, lse, window=T))
out_bytes = 4 * 3 * B * T * H * D  # dq, dk, dv
scratch_bytes = 4 * threads * (2 * D * T + 2 * {TQB_TKB} + T)  # backward_fast, per thread
"""),
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_attention.py::test_gqa_is_multi_head_attention_on_repeated_kv",
               "tests/kernels/test_attention.py::test_attention_matches_torch_sdpa_with_gqa"),
)


# ---- attention with Tq != Tk and padded sequences ---------------------------------------------
# ops.attention_forward/backward call these when q_lens or k_lens is given or k's Tk is not q's
# Tq (the encoder-decoder's cross-attention and padding masks); the functions above are these,
# called with Tq = Tk and no lengths

PADDED_DRAW = drawn(B=st.sampled_from([1, 2, 3]),
                    Tq=st.one_of(awkward, st.sampled_from([31, 33, 64, 65, 97])),
                    Tk=st.one_of(awkward, st.sampled_from([31, 33, 64, 65, 97])),
                    H=st.sampled_from([1, 2, 3]), group=st.sampled_from([1, 2]),
                    D=st.sampled_from([1, 3, 8, 64, 80]), causal=st.booleans(),
                    scale=st.sampled_from([None, 0.05, 1.0]),
                    window=st.sampled_from([0, 0, 1, 7, 33]),
                    lens=st.sampled_from(["none", "q", "k", "both"]))
PADDED_EMU = (dict(B=2, Tq=5, Tk=9, H=2, D=8, group=2, causal=False, lens="both", seed=1),
              dict(B=3, Tq=33, Tk=17, H=1, D=16, lens="k", seed=2),
              dict(B=2, Tq=7, Tk=7, H=1, D=3, window=3, lens="q", seed=3))
PADDED_FAST_DRAW = drawn(B=st.sampled_from([1, 3]),
                         Tq=st.sampled_from([8, 9, 31, 64, 65, 129, 200]),
                         Tk=st.sampled_from([1, 5, 8, 63, 64, 65, 129, 257, 300]),
                         H=st.sampled_from([1, 2]), group=st.sampled_from([1, 2]),
                         D=st.sampled_from([1, 5, 16, 33, 64]), causal=st.booleans(),
                         window=st.sampled_from([0, 1, 5, 65]),
                         lens=st.sampled_from(["none", "q", "k", "both"]))
PADDED_THREADS = (dict(B=3, Tq=77, Tk=50, H=2, D=24, group=2, seed=7),
                  dict(B=3, Tq=40, Tk=90, H=2, D=24, causal=False, seed=8))
# GQA_HEADS with Tk = Tq, and sizes where only k, v (Tk) or only q (Tq) overflow
PADDED_HEADS = tuple((B, T, T, H, Hkv, D) for B, T, H, Hkv, D in GQA_HEADS) + (
    (1, 1, P62, 1, 1, 1), (1, P62, 1, 1, 1, 1), (P32, 1, P32, 1, 1, 1), (1, 1, I64_MAX, 1, 1, 1),
    (1, I64_MAX, 1, 1, 1, 1))
PADDED_SCRATCH = """
B, Tq, Tk, H, D = 1, 512, 600, 1, 4096
q, dy, k, v = randn(B, Tq, H, D), randn(B, Tq, H, D), randn(B, Tk, H, D), randn(B, Tk, H, D)
lens = dict(q_lens=[500], k_lens=[590])
"""
PADDED_TESTS = "tests/kernels/test_attention_padded.py::"
pq, pk = z(2, 3, 2, 4), z(2, 5, 1, 4)  # Tq = 3 queries of 2 heads, Tk = 5 keys of 1 head

ATTENTION_PADDED_FORWARD = Op(
    "attention_padded_forward",
    limits=Limits(("F F F F F I I {0} {1} {2} {3} {4} {5} 0.5 0 0",
                   "F F F F F N N {0} {1} {2} {3} {4} {5} 0.5 1 5"), PADDED_HEADS),
    exact=("F:2*r*b*a F:2*b*r F:2*r*b*a F:2*(r+1)*a F:2*(r+1)*a I:2:r+1 I:2:r+2 "
           "2 r r+1 b 1 a 0.5 1 3",
           "F:2*r*b*a F:2*b*r F:2*r*b*a F:2*(r+2)*b*a F:2*(r+2)*b*a N I:2:r+3 "
           "2 r r+2 b b a 0.5 0 0"),
    check=Check(PADDED_DRAW, padded_make, run=padded_run, want=padded_want,
                tol=attention_tol, outputs=("o", "lse"), emu=PADDED_EMU,
                threads=PADDED_THREADS),
    fast=(Fast("tiled", PADDED_FAST_DRAW, padded_make, lambda a: padded_chain(a)[:2],
               attention_fast_tol, isas=("avx2", "avx512")),),
    bad=(
        Bad(lambda: ops.attention_forward(pq, pk, pk, q_lens=[1, 4]), ValueError,
            r"q_lens\[1\] = 4 is outside \[0, 3\] \(Tq, q's axis 1\)"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, k_lens=np.array([-1, 2])), ValueError,
            r"k_lens\[0\] = -1 is outside \[0, 5\] \(Tk, k's axis 1\)"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, k_lens=[6, 0]), ValueError,
            r"k_lens\[0\] = 6 is outside \[0, 5\]"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, q_lens=[1]), ValueError,
            r"q_lens must have shape \(B,\) = \(2,\) \(one length per sequence\), got "
            r"\(1,\)"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, q_lens=[True, 1]), TypeError,
            r"q_lens\[0\] must be an integer, got bool"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, k_lens=np.array([1.0, 2.0])), TypeError,
            r"k_lens must hold integers, got dtype float64"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, q_lens="ab"), TypeError,
            r"q_lens must be None or B = 2 lengths"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, q_lens=[2**64, 0]), ValueError,
            r"q_lens\[0\] must fit in int64"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, k_lens=FakeCupyArray()), TypeError,
            r"k_lens is a CuPy array but q is a NumPy array"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, causal=False, window=2), ValueError,
            r"window = 2 needs causal=True"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, q_lens=[3, 3], k_lens=[5, 5]), None,
            None, "full-lengths-are-accepted"),
        Bad(lambda: ops.attention_forward(pq, pk, pk, q_lens=[0, 0], k_lens=[0, 0]), None,
            None, "zero-lengths-are-accepted"),
    ),
    scratch=Scratch(fast_path_only=True, setup=PADDED_SCRATCH + f"""
call = lambda: list(ops.attention_forward(q, k, v, **lens))
out_bytes = 4 * (B * Tq * H * D + B * H * Tq)  # o, lse
scratch_bytes = 4 * threads * (D * Tk + {TQ_TK} + 2 * 64)  # forward_ws_floats per thread
"""),
    wrapper=False, reference=False,
    tested_in=(PADDED_TESTS + "test_padded_attention_matches_the_reference",
               PADDED_TESTS + "test_padding_and_other_sequences_do_not_matter",
               PADDED_TESTS + "test_padded_attention_matches_torch_sdpa"),
)

ATTENTION_PADDED_BACKWARD = Op(
    "attention_padded_backward",
    limits=Limits(("F F F F F F F F F I I {0} {1} {2} {3} {4} {5} 0.5 1 0",
                   "F F F F F F F F F N N {0} {1} {2} {3} {4} {5} 0.5 0 0"), PADDED_HEADS),
    exact=("F:2*r*b*a F:2*(r+1)*a F:2*(r+1)*a F:2*r*b*a F:2*r*b*a F:2*(r+1)*a F:2*(r+1)*a "
           "F:2*r*b*a F:2*b*r I:2:r+1 I:2:r+2 2 r r+1 b 1 a 0.5 1 3",
           "F:2*r*b*a F:2*(r+2)*b*a F:2*(r+2)*b*a F:2*r*b*a F:2*r*b*a F:2*(r+2)*b*a "
           "F:2*(r+2)*b*a F:2*r*b*a F:2*b*r N I:2:r+3 2 r r+2 b b a 0.5 0 0"),
    check=Check(PADDED_DRAW, padded_saved, run=padded_backward_run, want=padded_backward_want,
                tol=attention_backward_tol, outputs=("dq", "dk", "dv"), emu=PADDED_EMU,
                threads=PADDED_THREADS),
    fast=(Fast("chain", PADDED_FAST_DRAW, padded_make, padded_chain, attention_fast_tol,
               isas=("avx2", "avx512")),),
    bad=(
        Bad(lambda: ops.attention_backward(pq, pq, pk, pk, pq, z(2, 2, 5), q_lens=[1, 1]),
            ValueError, r"lse must have shape \(2, 2, 3\) \(\(B, H, Tq\) of q\)"),
        Bad(lambda: ops.attention_backward(pq, pq, pk, pk, pq, z(2, 2, 3), k_lens=[1, 9]),
            ValueError, r"k_lens\[1\] = 9 is outside \[0, 5\]"),
        Bad(lambda: ops.attention_backward(pq, pq, pk, z(2, 4, 1, 4), pq, z(2, 2, 3)),
            ValueError, r"v must have shape \(2, 5, 1, 4\)"),
    ),
    scratch=Scratch(fast_path_only=True, setup=PADDED_SCRATCH + f"""
o, lse = ops.attention_forward(q, k, v, **lens)
call = lambda: list(ops.attention_backward(dy, q, k, v, o, lse, **lens))
out_bytes = 4 * (B * Tq * H * D + 2 * B * Tk * H * D)  # dq, dk, dv
scratch_bytes = 4 * threads * (2 * D * Tk + 2 * {TQB_TKB} + Tq)  # backward_fast, per thread
"""),
    wrapper=False, reference=False,
    tested_in=(PADDED_TESTS + "test_padded_attention_matches_the_reference",
               PADDED_TESTS + "test_padded_rows_and_keys_get_no_gradient"),
)

ATTENTION_GQA_DECODE = Op(
    "attention_gqa_decode",
    limits=Limits(("F F F F F {0} {1} {2} {3} {4} {5} {6} 0.5 0",
                   "F F F F F {0} {1} {2} {3} {4} {5} {6} 0.5 9"), GQA_CACHE),
    exact=("F:2*r*b*a F:2*b*r F:2*r*b*a F:2*(r+1)*a F:2*(r+1)*a 2 r b 1 a r+1 1 0.5 2",),
    check=Check(
        drawn(B=st.sampled_from([1, 2]), n_new=st.integers(1, 12), H=st.sampled_from([1, 2]),
              group=st.sampled_from([1, 2, 3]), D=st.sampled_from([1, 8, 16, 64, 160]),
              start=st.integers(0, 70), spare=st.sampled_from([0, 3]),
              scale=st.sampled_from([None, 0.5]), window=st.sampled_from([0, 1, 4, 30, 64])),
        decode_make, run=decode_run, want=decode_want, tol=decode_tol, outputs=("o", "lse"),
        emu=(dict(B=1, n_new=1, H=1, D=64, start=0, spare=3, group=4, window=1, seed=1),
             dict(B=1, n_new=20, H=1, D=3, start=100, spare=1, group=2, window=70, seed=2),
             dict(B=2, n_new=3, H=2, D=16, start=300, spare=7, group=2, window=100, seed=3)),
        threads=(dict(B=2, n_new=1, H=3, D=16, start=250, spare=49, group=2, window=100,
                      seed=3),)),
    fast=(
        Fast("tiled", drawn(n_new=st.sampled_from([8, 40, 100]),
                            start=st.sampled_from([0, 1, 50]),
                            window=st.sampled_from([0, 1, 30, 64, 65, 150])),
             lambda seed, n_new, start, window: decode_make(seed, 2, n_new, 2, 16, start,
                                                            200 - n_new - start, group=3,
                                                            window=window),
             decode_run, lambda a, got, plain: [Tol(1e-5, 1e-5)] * 2, isas=("avx2", "avx512")),
        Fast("rows", drawn(n_new=st.sampled_from([1, 2, 7]), D=st.sampled_from([1, 16, 33]),
                           start=st.sampled_from([0, 1, 64, 150]),
                           window=st.sampled_from([1, 2, 63, 64, 65, 100])),
             lambda seed, n_new, D, start, window: decode_make(seed, 2, n_new, 1, D, start, 3,
                                                               group=4, window=window),
             decode_run,
             lambda a, got, plain: [Tol(4 * np.sqrt(a["q"].shape[-1]) * EPS32
                                        * (a["start"] + a["q"].shape[1]), 1e-5)] * 2),
    ),
    bad=(
        Bad(lambda: ops.attention_decode(gq, z(1, 8, 3, 4), z(1, 8, 3, 4), start=0), ValueError,
            r"k_cache must have shape \(B, Tmax, Hkv dividing H, D\)"),
        Bad(lambda: ops.attention_decode(gq, z(1, 8, 2, 4), z(1, 8, 2, 4), start=0, window=-1),
            ValueError, r"window must be >= 0"),
    ),
    scratch=Scratch(fast_path_only=True, setup=f"""
B, Tmax, H, D, start, n_new = 1, 512, 1, 4096, 448, 64  # n_new >= 8: the tiled path
q, k_cache, v_cache = randn(B, n_new, H, D), randn(B, Tmax, H, D), randn(B, Tmax, H, D)
call = lambda: list(ops.attention_decode(q, k_cache, v_cache, start, window=Tmax))
out_bytes = 4 * (B * n_new * H * D + B * H * n_new)  # o, lse
scratch_bytes = 4 * threads * (D * (start + n_new) + {TQ_TK} + 2 * 64)  # as the forward's
"""),
    wrapper=False, reference=False,
    tested_in=("tests/kernels/test_attention.py::test_gqa_window_decoding_equals_the_forward",),
)

# ---- a BF16 KV cache (attention_bf16kv.c) -----------------------------------------------------

def bf16kv_make(seed, B, n_new, H, D, start, spare=0, scale=None, group=1, window=0):
    """decode_make's, the caches as BF16 bits"""
    a = decode_make(seed, B, n_new, H, D, start, spare, scale, group, window)
    a["k_cache"], a["v_cache"] = (ops.to_bf16_bits(a[n]) for n in ("k_cache", "v_cache"))
    return a


def bf16kv_run(a):
    return list(ops.attention_gqa_decode_bf16kv(a["q"], a["k_cache"], a["v_cache"], a["start"],
                                                a["scale"], window=a["window"]))


def bf16kv_tol(a, want):
    wide = {**a, **{n: ops.from_bf16_bits(a[n]) for n in ("k_cache", "v_cache")}}
    return decode_tol(wide, want)


def bf16_append_run(a):
    ops.attention_cache_append_bf16(a["k_cache"], a["v_cache"], a["k"], a["v"], a["start"])
    return [a["k_cache"], a["v_cache"]]


h16 = np.zeros((1, 8, 2, 4), np.uint16)

ATTENTION_CACHE_APPEND_BF16 = Op(
    "attention_cache_append_bf16",
    limits=Limits(("H H F F {0} {1} {2} {3} {4} {5}",), CACHE),
    exact=("H:2*(r+1)*b*a H:2*(r+1)*b*a F:2*r*b*a F:2*r*b*a 2 r b a r+1 1",),
    check=Check(
        drawn(B=st.sampled_from([1, 2]), n_new=st.integers(1, 9), H=st.sampled_from([1, 3]),
              D=st.sampled_from([1, 5, 8]), start=st.integers(0, 20),
              spare=st.sampled_from([0, 2])),
        bf16kv_make, run=bf16_append_run,
        want=lambda a: list(ref.attention_cache_append_bf16(a["k_cache"], a["v_cache"], a["k"],
                                                             a["v"], a["start"])),
        tol=lambda a, want: [EXACT, EXACT], outputs=("k_cache", "v_cache")),
    fast="a rounding, element by element: one version",
    bad=(
        Bad(lambda: ops.attention_cache_append_bf16(h16, h16.copy(), q4, q4, start=7),
            ValueError, r"cache overflow"),
        Bad(lambda: ops.attention_cache_append_bf16(z(1, 8, 2, 4), h16, q4, q4, start=0),
            TypeError, r"k_cache must be a uint16 array of BF16 bits"),
        Bad(lambda: ops.attention_cache_append_bf16(h16, np.zeros((1, 9, 2, 4), np.uint16), q4,
                                                    q4, start=0),
            ValueError, r"v_cache must have shape \(1, 8, 2, 4\)"),
        Bad(lambda: ops.attention_cache_append_bf16(h16, h16.copy(), FakeCupyArray(), q4, 0),
            TypeError, r"k is a CuPy array, but attention_cache_append_bf16 runs on NumPy"),
    ),
    cuda=False,
    tested_in=("tests/kernels/test_kv_bf16.py::"
               "test_append_rounds_to_nearest_even_as_the_reference",),
)

ATTENTION_GQA_DECODE_BF16KV = Op(
    "attention_gqa_decode_bf16kv",
    limits=Limits(("F F F H H {0} {1} {2} {3} {4} {5} {6} 0.5 0",
                   "F F F H H {0} {1} {2} {3} {4} {5} {6} 0.5 9"), GQA_CACHE),
    exact=("F:2*r*b*a F:2*b*r F:2*r*b*a H:2*(r+1)*a H:2*(r+1)*a 2 r b 1 a r+1 1 0.5 2",),
    check=Check(
        drawn(B=st.sampled_from([1, 2]), n_new=st.integers(1, 12), H=st.sampled_from([1, 2]),
              group=st.sampled_from([1, 2, 3]), D=st.sampled_from([1, 8, 16, 64, 160]),
              start=st.integers(0, 70), spare=st.sampled_from([0, 3]),
              scale=st.sampled_from([None, 0.5]), window=st.sampled_from([0, 1, 4, 30, 64])),
        bf16kv_make, run=bf16kv_run,
        want=lambda a: list(ref.attention_gqa_decode_bf16kv(a["q"], a["k_cache"], a["v_cache"],
                                                        a["start"], _scale(a), a["window"])),
        tol=bf16kv_tol, outputs=("o", "lse"),
        threads=(dict(B=2, n_new=1, H=3, D=16, start=250, spare=49, group=2, window=100,
                      seed=3),
                 dict(B=2, n_new=20, H=3, D=16, start=250, spare=9, group=2, seed=4))),
    fast=("tests/kernels/test_kv_bf16.py: the bits of attention_gqa_decode on the widened "
          "cache on every ISA path, whose fast kernels this registry holds to the plain ones"),
    bad=(
        Bad(lambda: ops.attention_gqa_decode_bf16kv(gq, z(1, 8, 2, 4), h16, start=0), TypeError,
            r"k_cache must be a uint16 array of BF16 bits"),
        Bad(lambda: ops.attention_gqa_decode_bf16kv(gq, np.zeros((1, 8, 3, 4), np.uint16),
                                                    np.zeros((1, 8, 3, 4), np.uint16), start=0),
            ValueError, r"k_cache must have shape \(B, Tmax, Hkv dividing H, D\)"),
        Bad(lambda: ops.attention_gqa_decode_bf16kv(gq, h16, h16.copy(), start=7), ValueError,
            r"cache overflow"),
        Bad(lambda: ops.attention_gqa_decode_bf16kv(gq, h16, h16.copy(), start=0, window=-1),
            ValueError, r"window must be >= 0"),
        Bad(lambda: ops.attention_gqa_decode_bf16kv(gq, h16, h16.copy(), 0, scale=float("nan")),
            ValueError, r"scale must be finite"),
        Bad(lambda: ops.attention_gqa_decode_bf16kv(FakeCupyArray(), h16, h16.copy(), 0),
            TypeError, r"q is a CuPy array, but attention_gqa_decode_bf16kv runs on NumPy"),
    ),
    scratch=Scratch(setup="""
B, Tmax, H, D, start, n_new = 1, 512, 1, 4096, 448, 20  # n_new > 1: a head widened
q = randn(B, n_new, H, D)
k_cache, v_cache = (ops.to_bf16_bits(randn(B, Tmax, H, D)) for _ in range(2))
call = lambda: list(ops.attention_gqa_decode_bf16kv(q, k_cache, v_cache, start))
out_bytes = 4 * (B * n_new * H * D + B * H * n_new)  # o, lse
scratch_bytes = 4 * 2 * (start + n_new) * H * D  # the widened keys and values (c = 1)
"""),
    cuda=False,
    tested_in=("tests/kernels/test_kv_bf16.py::"
               "test_decode_on_a_bf16_cache_is_the_float32_decode_on_rounded_keys",),
)

# ---- the list ---------------------------------------------------------------------------------

# ---- 8-bit weights (pytfm_quantize_q8 ... pytfm_embedding_forward_q8w) ------------------------
# in (or dim) a multiple of the block, 32: the sizes overflow in their counts, not the block
Q8 = ((P32, P32), (1, P62), (P62, 32), (P61, 32), (I64_MAX - 31, 32))
Q8LIN = ((P32, P32, 1), (1, P62, 1), (P32, 32, P32), (1, 32, P62), (P61, 32, 1), (1, P61, 32))
Q8EMB = ((P62, 1, 32), (1, P62, 32), (P32, 2, P32), (2, 1, P62))
Q8_DRAW = drawn(rows=st.sampled_from([1, 2, 3, 8, 20]), blocks=st.integers(1, 9),
                out=awkward, bias=st.booleans())
q80, s80 = np.zeros((4, 32), np.int8), np.zeros((4, 1), np.uint16)


def q8_make(seed, rows, blocks, out, bias=True):
    rng = np.random.default_rng(seed)
    inn = 32 * blocks
    q, s = ops.quantize_q8(f32(rng, (out, inn)))
    b = f32(rng, (out,)) if bias else None
    return dict(seed=seed, x=f32(rng, (rows, inn)), q=q, scales=s, b=b)


def q8_tol(a):
    """the float32 combination of pytfm_linear_forward_q8w: 16 accumulators of nb/2 fused
    multiply-adds, 4 additions and the bias, each off by u times the magnitudes combined, and
    each block's scale dw·dx by u"""
    nb = a["q"].shape[1] // 32
    mag = ref.linear_forward_q8w(abs(a["x"]), abs(a["q"]), a["scales"])
    bias = 0.0 if a["b"] is None else 2 * EPS32 * abs(a["b"]).astype(np.float64)
    return Tol((nb / 2 + 6) * EPS32 * mag + bias, 0.0)


Q8_FAST = ("tests/kernels/test_q8.py: every path (AVX512-VNNI, AVX-VNNI, AVX2, the plain "
           "loops) and 1 and 2 threads give the plain loops' bits")

LINEAR_FORWARD_Q8W = Op(
    "linear_forward_q8w",
    limits=Limits(("F F B H N {0} {1} {2}",), Q8LIN),
    exact=("F:r*b F:r*32*a B:b*32*a H:b*a F:b r 32*a b",
           "F:r*b F:r*32*a B:b*32*a H:b*a N r 32*a b"),
    check=Check(
        Q8_DRAW, q8_make,
        run=lambda a: [ops.linear_forward_q8w(a["x"], a["q"], a["scales"], a["b"])],
        want=lambda a: [ref.linear_forward_q8w(a["x"], a["q"], a["scales"], a["b"])],
        tol=lambda a, want: [q8_tol(a)], outputs=("y",),
        threads=(dict(rows=1, blocks=9, out=1000, bias=True, seed=3),
                 dict(rows=8, blocks=4, out=700, bias=False, seed=4))),
    fast=Q8_FAST,
    bad=(
        Bad(lambda: ops.linear_forward_q8w(z(2, 32), q80.astype(np.uint8), s80), TypeError,
            r"q must have dtype int8, got uint8"),
        Bad(lambda: ops.linear_forward_q8w(z(2, 40), np.zeros((4, 40), np.int8), s80),
            ValueError, r"q must have shape \(out, cols\) with out >= 1 and cols a positive "
            r"multiple of 32, got \(4, 40\)"),
        Bad(lambda: ops.linear_forward_q8w(z(2, 32), q80, np.zeros((4, 2), np.uint16)),
            ValueError, r"scales must have shape \(4, 1\)"),
        Bad(lambda: ops.linear_forward_q8w(z(2, 64), q80, s80), ValueError,
            r"x.shape\[-1\] must equal q.shape\[1\] = 32"),
        Bad(lambda: ops.linear_forward_q8w(z(2, 32), q80, s80, z(3)), ValueError,
            r"b must have shape \(4,\)"),
        Bad(lambda: ops.linear_forward_q8w(FakeCupyArray(), q80, s80), TypeError,
            r"x is a CuPy array, but linear_forward_q8w runs on NumPy arrays only"),
    ),
    scratch=("x's quantised rows, one allocation before anything is written; its failure "
             "path is pytfm__scratch's, as every kernel's (not forced here)"),
    cuda=False,  # 8-bit weights are a CPU inference mode
    tested_in=(
        "tests/kernels/test_q8.py::test_every_path_gives_the_plain_bits_within_the_bound",
        "tests/kernels/test_q8.py::test_the_product_is_x_times_w_within_the_quantisation_bounds",
        "tests/kernels/test_q8.py::"
        "test_a_row_of_x_with_inf_or_nan_propagates_the_same_on_every_path",
        "tests/kernels/test_q8.py::test_in_not_a_multiple_of_the_block_and_null_pointers_are_refused",
    ),
)

QUANTIZE_Q8 = Op(
    "quantize_q8",
    limits=Limits(("B H F {0} {1}",), Q8),
    exact=("B:r*32*a H:r*a F:r*32*a r 32*a",),
    fast="one version: the plain loops (quantising is done once, when a model is converted)",
    bad=(
        Bad(lambda: ops.quantize_q8(z(3, 40)), ValueError,
            r"w must have shape \(out, in\) with in a positive multiple of 32"),
        Bad(lambda: ops.quantize_q8(np.full((1, 32), np.inf, np.float32)), ValueError,
            r"pytfm_quantize_q8: row 0, block 0 \(columns 0..31\) of w cannot be quantised"),
        Bad(lambda: ops.quantize_q8(z(3, 32, dtype=np.float64)), TypeError,
            r"w must have dtype float32, got float64"),
        Bad(lambda: ops.quantize_q8(FakeCupyArray()), TypeError,
            r"w is a CuPy array, but quantize_q8 runs on NumPy arrays only"),
    ),
    scratch="none: the header's entry says so",
    cuda=False,
    tested_in=("tests/kernels/test_q8.py::test_quantize_matches_the_numpy_contract_bit_for_bit",
               "tests/kernels/test_q8.py::test_ties_round_half_away_from_zero",
               "tests/kernels/test_q8.py::"
               "test_non_finite_weights_and_overflowing_scales_are_refused_naming_row_and_block"),
)

QUANTIZE_Q8_BF16 = Op(
    "quantize_q8_bf16",
    limits=Limits(("B H H {0} {1}",), Q8),
    exact=("B:r*32*a H:r*a H:r*32*a r 32*a",),
    fast="one version: the plain loops",
    scratch="none: the header's entry says so",
    cuda=False, wrapper=False, reference=False,  # ops.quantize_q8 takes BF16 bits (uint16)
    tested_in=("tests/kernels/test_q8.py::test_quantize_matches_the_numpy_contract_bit_for_bit",),
)

DEQUANTIZE_Q8 = Op(
    "dequantize_q8",
    limits=Limits(("F B H {0} {1}",), Q8),
    exact=("F:r*32*a B:r*32*a H:r*a r 32*a",),
    fast="one version: a product per weight",
    bad=(
        Bad(lambda: ops.dequantize_q8(q80, np.zeros((4, 2), np.uint16)), ValueError,
            r"scales must have shape \(4, 1\)"),
        Bad(lambda: ops.dequantize_q8(q80, s80.astype(np.int16)), TypeError,
            r"scales must have dtype uint16, got int16"),
    ),
    scratch="none: the header's entry says so",
    cuda=False,
    tested_in=("tests/kernels/test_q8.py::"
               "test_dequantize_and_the_embedding_are_q_times_d_exactly",),
)

EMBEDDING_FORWARD_Q8W = Op(
    "embedding_forward_q8w",
    limits=Limits(("F I B H {0} {1} {2}",), Q8EMB),
    exact=("F:r*32*a I:r:b B:b*32*a H:b*a r b 32*a",),
    fast="one version: a row dequantised",
    bad=(
        Bad(lambda: ops.embedding_forward_q8w(i64(0, 4), q80, s80), ValueError,
            r"pytfm_embedding_forward_q8w: ids\[1\] = 4 is outside \[0, 4\)"),
        Bad(lambda: ops.embedding_forward_q8w(np.array([0], np.int32), q80, s80), TypeError,
            r"ids must have dtype int64, got int32"),
        Bad(lambda: ops.embedding_forward_q8w(FakeCupyArray(), q80, s80), TypeError,
            r"ids is a CuPy array, but embedding_forward_q8w runs on NumPy arrays only"),
    ),
    scratch="none: the header's entry says so",
    cuda=False,
    tested_in=("tests/kernels/test_q8.py::"
               "test_dequantize_and_the_embedding_are_q_times_d_exactly",
               "tests/kernels/test_q8.py::test_bad_ids_are_refused_and_nothing_written"),
)


OPS = (LINEAR_FORWARD, LINEAR_GELU_FORWARD, LINEAR_BACKWARD, LINEAR_FORWARD_EX,
       LINEAR_GELU_FORWARD_EX, LINEAR_BACKWARD_EX, SGEMM, SGEMM_PLAIN, SGEMM_EX, ROUND_BF16,
       LINEAR_FORWARD_BF16W, LINEAR_FORWARD_Q8W, QUANTIZE_Q8, QUANTIZE_Q8_BF16, DEQUANTIZE_Q8,
       EMBEDDING_FORWARD_Q8W,
       SOFTMAX_FORWARD, SOFTMAX_BACKWARD, LAYERNORM_FORWARD, LAYERNORM_BACKWARD, ROPE_FORWARD,
       ROPE_BACKWARD,
       RMSNORM_FORWARD, RMSNORM_BACKWARD, SWIGLU_FORWARD, SWIGLU_BACKWARD,
       ROPE_FREQ_FORWARD, ROPE_FREQ_BACKWARD, ROPE_INV_FREQ,
       QKV_SPLIT_FORWARD, QKV_SPLIT_BACKWARD, SINUSOIDAL_POSITIONS, GELU_FORWARD, GELU_BACKWARD,
       EMBEDDING_FORWARD, EMBEDDING_FORWARD_BF16W, EMBEDDING_BACKWARD, CROSS_ENTROPY_FORWARD,
       CROSS_ENTROPY_BACKWARD, CROSS_ENTROPY_SMOOTHED_FORWARD, CROSS_ENTROPY_SMOOTHED_BACKWARD,
       ADAMW_STEP, SUM_SQUARES, ATTENTION_FORWARD, ATTENTION_BACKWARD, ATTENTION_CACHE_APPEND,
       ATTENTION_DECODE,
       ATTENTION_GQA_FORWARD, ATTENTION_GQA_BACKWARD, ATTENTION_GQA_DECODE,
       ATTENTION_PADDED_FORWARD, ATTENTION_PADDED_BACKWARD,
       ATTENTION_CACHE_APPEND_BF16, ATTENTION_GQA_DECODE_BF16KV)
BY_NAME = {op.name: op for op in OPS}

# The public functions that are not ops, by header: no kernel, nothing for the iterating tests.
NON_OPS = {
    "pytfm_core.h": ("pytfm_status_string", "pytfm_last_error", "pytfm_version",
                     "pytfm_abi_version", "pytfm_set_num_threads", "pytfm_get_num_threads",
                     "pytfm_set_max_isa", "pytfm_read_environment", "pytfm_get_isa",
                     "pytfm_get_bf16_isa", "pytfm_get_build_info"),
    "pytfm_model.h": ("pytfm_safetensors_open", "pytfm_safetensors_open_fd",
                      "pytfm_safetensors_open_memory", "pytfm_safetensors_close",
                      "pytfm_safetensors_tensor_count", "pytfm_safetensors_tensor",
                      "pytfm_safetensors_find", "pytfm_safetensors_read",
                      "pytfm_safetensors_metadata_count", "pytfm_safetensors_metadata",
                      "pytfm_safetensors_metadata_get", "pytfm_json_check",
                      "pytfm_checkpoint_check", "pytfm_gpt2_ignored_field",
                      "pytfm_gpt2_config_parse", "pytfm_gpt2_read_config", "pytfm_gpt2_open",
                      "pytfm_gpt2_close", "pytfm_gpt2_get_config", "pytfm_gpt2_read",
                      "pytfm_llama_ignored_field", "pytfm_llama_config_parse",
                      "pytfm_llama_read_config", "pytfm_llama_open", "pytfm_llama_close",
                      "pytfm_llama_bf16_matrices", "pytfm_llama_read_bf16",
                      "pytfm_llama_get_config", "pytfm_llama_read", "pytfm_folder_arch",
                      "pytfm_model_open", "pytfm_model_open_memory", "pytfm_model_close",
                      "pytfm_model_get_config", "pytfm_model_set_precision",
                      "pytfm_model_get_precision", "pytfm_model_forward", "pytfm_session_open",
                      "pytfm_session_open_ex",
                      "pytfm_session_close", "pytfm_session_feed", "pytfm_session_length",
                      "pytfm_session_reset", "pytfm_rng_seed", "pytfm_rng_next", "pytfm_sample",
                      "pytfm_model_config_check", "pytfm_model_param",
                      "pytfm_rename_exchange"),
    "pytfm_tokenizer.h": ("pytfm_tokenizer_open", "pytfm_tokenizer_open_memory",
                          "pytfm_tokenizer_open_json", "pytfm_tokenizer_open_json_memory",
                          "pytfm_tokenizer_close", "pytfm_tokenizer_vocab_size",
                          "pytfm_tokenizer_eot", "pytfm_tokenizer_merge_count",
                          "pytfm_tokenizer_unicode_version", "pytfm_tokenizer_encode",
                          "pytfm_tokenizer_decode", "pytfm_tokenizer_token",
                          "pytfm_tokenizer_open_folder", "pytfm_tokenizer_merges",
                          "pytfm_tokenizer_split", "pytfm_tokenizer_text_tokens"),
    # the workspaces and AdamW's scalars in device memory: what a step with no allocation in
    # it, replayed as a CUDA graph, needs (tests/cuda/test_cuda_workspace.py); the kernel that
    # reads the scalars from memory gives pytfm_adamw_step_cuda's bits there
    # ... and attention on the tensor cores, twins of no C kernel (the CPU's attention is FP32
    # only): tests/cuda/test_cuda_tc_attention.py holds them to the reference on rounded inputs,
    # their FP32 fallbacks to pytfm_attention_*_cuda's bits, and pytfm.ops' path to them
    # ... and the product of BF16 operands (raw bits), the twin of no C kernel (the CPU has no
    # BF16 operands): tests/cuda/test_cuda_bf16_gemm.py holds it to the reference and to
    # pytfm_sgemm_ex_cuda's BF16 bits
    "pytfm_cuda.h": ("pytfm_cuda_device_count", "pytfm_cuda_stream_synchronize",
                     "pytfm_cuda_workspace_set", "pytfm_cuda_workspace_clear",
                     "pytfm_cuda_workspace_get", "pytfm_cuda_adamw_scalars",
                     "pytfm_adamw_step_scalars_cuda",
                     "pytfm_attention_forward_ex_cuda", "pytfm_attention_backward_ex_cuda",
                     "pytfm_attention_gqa_forward_ex_cuda", "pytfm_attention_gqa_backward_ex_cuda",
                     "pytfm_gemm_bf16_cuda"),
}


def checked(cuda=False):
    """The ops with a Check (cuda: and a CUDA twin the Check runs, at its emu sizes)."""
    return [op for op in OPS if op.check is not None and (not cuda or op.cuda and op.check.emu)]


def case_id(values):
    """A parametrize id for drawn values: "rows3-cols7-scale3.0" (the seed left out)."""
    return "-".join(f"{k}{'x'.join(map(str, v)) if isinstance(v, tuple) else v}"
                    for k, v in values.items() if k != "seed")


def fresh(a):
    """A copy of the inputs a whose arrays a run may update in place."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in a.items()}


def assert_outputs(label, op, got, want, tols):
    """Each output within its Tol of want (None where want says the op returns none)."""
    from helpers import assert_close

    got = list(got)
    assert len(got) == len(want) == len(op.check.outputs), (label, len(got), len(want))
    for name, g, w, t in zip(op.check.outputs, got, want, tols):
        if w is None:
            assert g is None, f"{label}.{name}: the op returned {type(g)}, not None"
            continue
        assert_close(f"{label}.{name}", np.asarray(g), w, atol=t.atol, rtol=t.rtol)


def compare_with_reference(op, values):
    """op's C kernel (through pytfm.ops) against the reference, on make(**values)."""
    c = op.check
    a = c.make(**values)
    want = c.want(fresh(a))
    assert_outputs(op.name, op, c.run(fresh(a)), want, c.tol(a, want))


# ---- C calls ----------------------------------------------------------------------------------

def tokens(template):
    return template.split()


def _c_literal(token):
    """A literal of a limits call as C: ints past int32 as INT64_C(...)."""
    if re.fullmatch(r"-?\d+", token) and not -(2**31) <= int(token) < 2**31:
        return f"INT64_C({token})"
    return token


def hostile_calls():
    """(count, C text) of hostile_sizes.c's calls: every limits template at every case, its
    buffers f[i], d, ids, h (one element each) and NULL, in a function hostile_calls()."""
    lines, count = [], 0
    for op in OPS:
        for template in op.limits.calls:
            for sizes in op.limits.sizes:
                floats, args = 0, []
                for token in tokens(template.format(*sizes)):
                    if token == "F":
                        args.append(f"f[{floats}]")
                        floats += 1
                    else:
                        c_names = {"D": "d", "I": "ids", "H": "h", "B": "i8", "N": "NULL"}
                        args.append(c_names.get(token) or _c_literal(token))
                lines.append(f"    REJECT({count}, {op.c}({', '.join(args)}));")
                count += 1
    body = "\n".join(lines)
    return count, (f"/* generated by tests/ops_registry.py: {count} calls */\n"
                   f"static int hostile_calls(void) {{\n{body}\n    return 0;\n}}\n")


def exact_buffers(template):
    """The buffers of an exact call: (token index, kind, count expression, index limit)."""
    out = []
    for i, token in enumerate(tokens(template)):
        kind, _, rest = token.partition(":")
        if kind in ("F", "D", "I", "H", "B") and rest:
            count, _, limit = rest.partition(":")
            out.append((i, kind, count, limit or None))
    return out


def exact_calls():
    """C text of sanitize_kernels.c's calls: a function run(r, a, b) that makes every exact
    call of every op on buffers of exactly their size (floats(), doubles(), indices(),
    halves()) and frees them."""
    blocks = []
    for op in OPS:
        for template in op.exact:
            toks = tokens(template)
            decls, frees = [], []
            for i, kind, count, limit in exact_buffers(template):
                ctype, make = {"F": ("float", f"floats({count})"),
                               "D": ("double", f"doubles({count})"),
                               "I": ("int64_t", f"indices({count}, {limit})"),
                               "H": ("uint16_t", f"halves({count})"),
                               "B": ("int8_t", f"bytes8({count})")}[kind]
                decls.append(f"        {ctype} *p{i} = {make};")
                frees.append(f"p{i}")
                toks[i] = f"p{i}"
            toks = ["NULL" if t == "N" else t for t in toks]
            free = " ".join(f"free({p});" for p in frees)
            decl, args = "\n".join(decls), ", ".join(toks)
            blocks.append(f"    {{  /* {op.name} */\n{decl}\n        CHECK({op.c}({args}));\n"
                          f"        {free}\n    }}")
    body = "\n".join(blocks)
    return ("/* generated by tests/ops_registry.py */\n"
            f"static int run(int64_t r, int64_t a, int64_t b) {{\n{body}\n    return 0;\n}}\n")


def exact_null_args(template, ffi, r=2, a=2, b=2):
    """The arguments of an exact call with every buffer NULL, at sizes r, a, b (via cffi)."""
    args = []
    for token in tokens(template):
        kind = token.partition(":")[0]
        if kind in ("F", "D", "I", "H", "B", "N"):
            args.append(ffi.NULL)
        else:
            args.append(eval(token, {"__builtins__": {}}, dict(r=r, a=a, b=b)))
    return args


if __name__ == "__main__":
    what = sys.argv[1:] or ["hostile"]
    print(hostile_calls()[1] if what[0] == "hostile" else exact_calls(), end="")
