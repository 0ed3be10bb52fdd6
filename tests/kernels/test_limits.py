"""Sizes whose arithmetic would overflow, at every entry point of pytfm_kernels.h.

Each op of tests/ops_registry.py is called straight through cffi with its Limits: sizes near
2^31, 2^32, 2^61 (the most float32 elements whose byte count fits in a ptrdiff_t), 2^62 and
INT64_MAX, or a cache position start + n_new that wraps, with tiny (64-element) or NULL
buffers. Every call must return PYTFM_STATUS_INVALID_ARGUMENT, with a message that names the
function and the sizes, and leave the tiny buffers as they were. A size product that wraps can
let a call write before a buffer or fault, so the calls run in a subprocess: a regression is a
failed test, not a dead pytest.

The CUDA twins share the checks (csrc/core/checks.h): they are called too, on the CPU emulator
(cuda/emu) and, in a build with CUDA, through pytfm's own library (the checks run before any
CUDA call, so no GPU is needed); in a build without CUDA they return NOT_SUPPORTED.
"""

import json
import os

import pytest

from helpers import TESTS, run_python
from ops_registry import BY_NAME, OPS

MARK = 1234.5  # what the tiny buffers hold before the call
# ... by their C type: the ids a valid index, the BF16 bits those of 1.0
MARKS = {"float": MARK, "double": MARK, "int64_t": 7, "uint16_t": 0x3F80, "int8_t": 5}
CTYPES = {"F": "float", "D": "double", "I": "int64_t", "H": "uint16_t", "B": "int8_t"}


def run_cases(name, emu_path):
    """In this process: call op `name` with every template and case of its Limits, its
    buffers tiny and then NULL, and its _cuda twin (NULL stream) through pytfm's library and
    on the emulator library at emu_path; print one JSON line per call: the mode, status,
    message, buffers intact."""
    from pytfm import _core

    op = BY_NAME[name]
    ffi_, lib_ = _core.ffi, _core.lib
    modes = [("tiny", ffi_, lib_, False, False), ("null", ffi_, lib_, True, False)]
    if op.cuda:
        modes.append(("cuda", ffi_, lib_, False, True))
        if emu_path:
            import cuda_emu

            emu = cuda_emu.Emu(emu_path)
            modes.append(("emu", emu.ffi, emu.lib, False, True))
    for mode, ffi, lib, null, cuda in modes:
        func = getattr(lib, op.c + ("_cuda" if cuda else ""))
        for template, sizes in ((t, s) for t in op.limits.calls for s in op.limits.sizes):
            buffers, args = [], []
            for token in template.format(*sizes).split():
                if token == "N":
                    args.append(ffi.NULL)
                elif token in CTYPES:
                    b = ffi.new(CTYPES[token] + "[64]")
                    for j in range(64):
                        b[j] = MARKS[CTYPES[token]]
                    buffers.append(b)
                    args.append(ffi.NULL if null else b)
                else:
                    args.append(float(token) if "." in token or "e" in token else int(token))
            print(json.dumps({"mode": mode, "sizes": [str(s) for s in sizes]}), flush=True)
            st = func(*args, *([ffi.NULL] if cuda else []))
            intact = all(b[j] == MARKS[ffi.typeof(b).item.cname]
                         for b in buffers for j in range(64))
            print(json.dumps({"mode": mode, "sizes": [str(s) for s in sizes], "status": int(st),
                              "msg": ffi.string(lib.pytfm_last_error()).decode(),
                              "intact": intact}), flush=True)


HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("name", [op.name for op in OPS])
def test_overflowing_sizes_are_invalid_arguments_and_write_nothing(name, emu_library):
    import pytfm

    op = BY_NAME[name]
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
    assert {"tiny", "null"} <= modes and (not op.cuda or "cuda" in modes), modes
    calls = len(op.limits.calls) * len(op.limits.sizes)
    assert all(sum(out["mode"] == m for out in results) == calls for m in modes), results
    cuda_built = pytfm.build_info()["cuda"]
    for out in results:
        func = op.c + ("_cuda" if out["mode"] in ("cuda", "emu") else "")
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
