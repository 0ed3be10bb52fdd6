"""Sizes whose arithmetic would overflow, at every entry point of pytfm.h.

Each case calls a C function straight through cffi with sizes near 2^31, 2^32, 2^61 (the most
float32 elements whose byte count fits in a ptrdiff_t), 2^62 and INT64_MAX, or with a cache
position start + n_new that wraps, and with tiny (64-element) or NULL buffers. Every one must
return PYTFM_STATUS_INVALID_ARGUMENT, with a message that names the function and the sizes,
and leave the tiny buffers as they were. Before the fix, start = INT64_MAX returned OK and
wrote before the cache, m = n = 2^32 made m·n wrap to 0, and sizes near 2^62 segfaulted: so
the calls run in a subprocess, and a regression is a failed test, not a dead pytest.

The CUDA twins share the checks (csrc/core/checks.h): they are called too, on the CPU emulator
(cuda/emu) and, in a build with CUDA, through pytfm's own library (the checks run before any
CUDA call, so no GPU is needed); in a build without CUDA they return NOT_SUPPORTED.
"""

import json
import os

import pytest

from helpers import TESTS, run_python

I64_MAX = 2**63 - 1
P31, P32, P61, P62 = 2**31, 2**32, 2**61, 2**62

# For each entry point: its arguments (F a float buffer, D a double one, I an int64 one, {i}
# the i-th size of a case, anything else a literal), and the overflowing cases.
RC = [(P32, P32), (P62, 4), (4, P62), (P31 + 1, P31 - 1), (P61, 1), (I64_MAX, 1), (1, I64_MAX)]
LIN = [(P32, P32, 1), (P62, 1, 1), (1, P62, 1), (1, 1, P62), (P31, 2, P31), (1, P31, P31),
       (I64_MAX, 1, 1), (P61, 1, 4)]
COUNT = [(P61,), (P62,), (I64_MAX,), (P61 + 1,)]
EMB = [(P62, 1, 4), (1, P62, 4), (P32, 2, P32), (P61, 1, 1), (I64_MAX, 1, 1), (2, 1, I64_MAX)]
HEADS = [(P62, 1, 1, 1), (1, P62, 1, 1), (1, 1, P62, 1), (1, 1, 1, P62), (2**16,) * 4,
         (P31, P31, 1, 1), (I64_MAX, 1, 1, 1), (1, 1, 1, I64_MAX)]
ROPE = [(P31, P31, 1, 2, 0), (1, P62, 1, 2, 0), (1, 1, P62, 2, 0), (1, 1, 1, P62, 0),
        (2**16, 2**16, 2**16, 2**16, 0), (2, 4, 1, 2, I64_MAX), (P32, 1, 1, 2, P32),
        (3, 1, 1, 2, P62), (I64_MAX, 1, 1, 2, 0)]
CACHE = [  # B, n_new, H, D, Tmax, start
    (1, 1, 1, 1, 4, I64_MAX),  # start + n_new wraps
    (1, 2, 1, 1, I64_MAX, I64_MAX - 1),  # so does this, past Tmax = INT64_MAX
    (1, I64_MAX, 1, 1, 4, 1),
    (P32, 1, P32, 1, 4, 0),  # the cache [B, Tmax, H, D] would wrap to 0 floats
    (1, 1, 1, 1, P62, 0),
    (2**16, 1, 2**16, 2**16, 2**16, 0),
    (1, 1, 1, I64_MAX, 4, 0),
]

SPECS = {
    "pytfm_sgemm": ("F F F {0} {1} {2} 0 0 0.0",
                    [(P32, P32, 0), (P32, P32, P32), (P62, 1, 1), (1, P62, 1), (1, 1, P62),
                     (P31, P31, 1), (I64_MAX, 1, 1), (P61, 1, 0), (1, P61, 4)]),
    "pytfm_linear_forward": ("F F F F {0} {1} {2}", LIN),
    "pytfm_linear_backward": ("F F F F F F {0} {1} {2}", LIN),
    "pytfm_softmax_forward": ("F F {0} {1}", RC),
    "pytfm_softmax_backward": ("F F F {0} {1}", RC),
    "pytfm_layernorm_forward": ("F F F F F F {0} {1} 1e-5", RC),
    "pytfm_layernorm_backward": ("F F F F F F F F {0} {1}", RC),
    "pytfm_rope_forward": ("F F I {0} {1} {2} {3} {4} 10000.0", ROPE),
    "pytfm_rope_backward": ("F F I {0} {1} {2} {3} {4} 10000.0", ROPE),
    "pytfm_sinusoidal_positions": ("F {0} {1}", [(P62, 2), (2, P62), (P31, P32), (P61, 2),
                                                 (I64_MAX, 2), (1, I64_MAX - 1), (3, P61)]),
    "pytfm_gelu_forward": ("F F {0}", COUNT),
    "pytfm_gelu_backward": ("F F F {0}", COUNT),
    "pytfm_embedding_forward": ("F I F {0} {1} {2}", EMB),
    "pytfm_embedding_backward": ("F F I {0} {1} {2}", EMB),
    "pytfm_cross_entropy_forward": ("F F F I {0} {1} -1", RC),
    "pytfm_cross_entropy_backward": ("F F I F {0} {1} -1 1.0", RC),
    "pytfm_adamw_step": ("F F F F {0} 1 0.001 0.9 0.999 1e-8 0.0", COUNT),
    "pytfm_attention_forward": ("F F F F F {0} {1} {2} {3} 0.5 1", HEADS),
    "pytfm_attention_backward": ("F F F F F F F F F {0} {1} {2} {3} 0.5 1", HEADS),
    "pytfm_attention_cache_append": ("F F F F {0} {1} {2} {3} {4} {5}", CACHE),
    "pytfm_attention_decode": ("F F F F F {0} {1} {2} {3} {4} {5} 0.5", CACHE),
    "pytfm_linear_gelu_forward": ("F F F F F {0} {1} {2}", LIN),
    "pytfm_qkv_split_forward": ("F F F F I {0} {1} {2} {3} {4} 10000.0 1", ROPE),
    "pytfm_qkv_split_backward": ("F F F F I {0} {1} {2} {3} {4} 10000.0 1", ROPE),
    "pytfm_sum_squares": ("D F {0}", COUNT),
}
SPECS["pytfm_sgemm_plain"] = SPECS["pytfm_sgemm"]
CPU_ONLY = {"pytfm_sinusoidal_positions"}  # no CUDA twin
MARK = 1234.5  # what the tiny buffers hold before the call


def run_cases(name, emu_path):
    """In this process: call name with every case of SPECS, its buffers tiny and then NULL,
    and its _cuda twin (NULL stream) through pytfm's library and on the emulator library at
    emu_path; print one JSON line per call: the mode, status, message, buffers intact."""
    from pytfm import _core

    ffi_, lib_ = _core.ffi, _core.lib
    modes = [("tiny", ffi_, lib_, False, False), ("null", ffi_, lib_, True, False)]
    if name not in CPU_ONLY:
        modes.append(("cuda", ffi_, lib_, False, True))
        if emu_path:
            import cuda_emu

            emu = cuda_emu.Emu(emu_path)
            modes.append(("emu", emu.ffi, emu.lib, False, True))
    template, cases = SPECS[name]
    for mode, ffi, lib, null, cuda in modes:
        func = getattr(lib, name + ("_cuda" if cuda else ""))
        for sizes in cases:
            buffers, args = [], []
            for token in template.format(*sizes).split():
                if token in ("F", "D", "I"):
                    b = ffi.new({"F": "float[64]", "D": "double[64]", "I": "int64_t[64]"}[token])
                    for j in range(64):
                        b[j] = 7 if token == "I" else MARK
                    buffers.append(b)
                    args.append(ffi.NULL if null else b)
                else:
                    args.append(float(token) if "." in token or "e" in token else int(token))
            print(json.dumps({"mode": mode, "sizes": [str(s) for s in sizes]}), flush=True)
            st = func(*args, *([ffi.NULL] if cuda else []))
            intact = all(b[j] == (7 if ffi.typeof(b).item.cname == "int64_t" else MARK)
                         for b in buffers for j in range(64))
            print(json.dumps({"mode": mode, "sizes": [str(s) for s in sizes], "status": int(st),
                              "msg": ffi.string(lib.pytfm_last_error()).decode(),
                              "intact": intact}), flush=True)


HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def emu_library(tmp_path_factory):
    """The CUDA kernels built for the CPU emulator, as a path a subprocess can load (None
    without the source checkout)."""
    import cuda_emu

    if not os.path.isdir(cuda_emu.CUDA):
        return None
    return cuda_emu.build(str(tmp_path_factory.mktemp("emu_limits")))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_overflowing_sizes_are_invalid_arguments_and_write_nothing(name, emu_library):
    import pytfm

    r = run_python(f"""
        import sys; sys.path[:0] = [{HERE!r}, {TESTS!r}]
        import test_limits
        test_limits.run_cases({name!r}, {emu_library!r})
    """)
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not lines or "status" not in lines[-1]:
        last = lines[-1] if lines else "before the first call"
        pytest.fail(f"{name}: the subprocess ended with {r.returncode} in {last}:\n"
                    f"{r.stderr[-3000:]}")
    results = [out for out in lines if "status" in out]
    modes = {out["mode"] for out in results}
    assert {"tiny", "null"} <= modes and (name in CPU_ONLY or "cuda" in modes), modes
    cuda_built = pytfm.build_info()["cuda"]
    for out in results:
        func = name + ("_cuda" if out["mode"] in ("cuda", "emu") else "")
        where = f"{func} ({out['mode']}) sizes {out['sizes']}: {out['msg']!r}"
        if out["mode"] == "cuda" and not cuda_built:  # the stubs of a build without CUDA
            assert out["status"] == 3, f"status {out['status']}, not NOT_SUPPORTED: {where}"
            continue
        assert out["status"] == 1, f"status {out['status']}, not INVALID_ARGUMENT: {where}"
        assert out["msg"].startswith(f"{func}: "), where
        assert "too large" in out["msg"] or "cache overflow" in out["msg"], where
        assert out["intact"], f"a buffer was written: {where}"


def test_the_largest_sizes_that_fit_pass_the_size_check():
    """The bound is the byte count, not a guess: 2^61 − 1 float32 elements pass it (and then
    fail on the NULL pointer), 2^61 do not."""
    r = run_python("""
        from pytfm._core import ffi, lib
        for count in (2**61 - 1, 2**61):
            st = lib.pytfm_gelu_forward(ffi.NULL, ffi.NULL, count)
            print(st, ffi.string(lib.pytfm_last_error()).decode())
    """)
    assert r.returncode == 0, r.stderr
    fits, too_big = r.stdout.splitlines()
    assert fits == "1 pytfm_gelu_forward: y must not be NULL", fits
    assert too_big.startswith("1 pytfm_gelu_forward: count = 2305843009213693952 is too large")
