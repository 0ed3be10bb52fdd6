"""The C kernels under AddressSanitizer and UndefinedBehaviorSanitizer.

The Python tests cannot see a read one element past a buffer; ASan can. This builds
tests/c_api/sanitize_kernels.c with the library sources and runs every kernel on exactly-sized
heap buffers at awkward sizes, and tests/c_api/hostile_sizes.c, which calls every entry point
with sizes whose arithmetic would overflow (UBSan also sees a signed overflow in the checks
themselves). Both take their calls from tests/ops_registry.py, written here as C headers.
"""

import os
import shutil
import subprocess

import pytest

import ops_registry
from helpers import ROOT, TESTS, build_with_library

CSRC = os.path.join(ROOT, "csrc")
FLAGS = ["-std=c11", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


def build_and_run(tmp_path, name, extra=(), headers=None):
    """Build tests/c_api/<name>.c with the library under ASan and UBSan, the flags extra and
    the generated headers ({file name: text}, in tmp_path) (skip where the compiler cannot
    link their runtimes), and run it; its CompletedProcess."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    if subprocess.run([cc, "-fsanitize=address,undefined", *extra, str(probe), "-o",
                       str(tmp_path / "p")], capture_output=True).returncode:
        pytest.skip(f"{cc} cannot link sanitizer runtimes (libasan/libubsan) with {extra} here")
    for header, text in (headers or {}).items():
        (tmp_path / header).write_text(text)
    exe = str(tmp_path / name)
    build = build_with_library(cc, [*FLAGS, *extra], os.path.join(TESTS, "c_api", name + ".c"),
                               exe, [f"-I{tmp_path}"])
    assert build.returncode == 0, build.stderr
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1")
    run = subprocess.run([exe], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    return run


@pytest.mark.skipif(not os.path.isdir(CSRC), reason="needs the source checkout (csrc/)")
def test_kernels_run_clean_under_asan_and_ubsan(tmp_path):
    """Every exact call of every op (tests/ops_registry.py), at 216 combinations of sizes."""
    run = build_and_run(tmp_path, "sanitize_kernels",
                        headers={"exact_calls.h": ops_registry.exact_calls()})
    assert "216 size combinations ran clean" in run.stdout, run.stdout


@pytest.mark.skipif(not os.path.isdir(CSRC), reason="needs the source checkout (csrc/)")
def test_overflowing_sizes_are_rejected_clean_under_asan_and_ubsan(tmp_path):
    """tests/c_api/hostile_sizes.c: every entry point with sizes whose products or offsets would
    wrap, on one-element buffers: rejected, nothing read or written, no signed overflow."""
    count, calls = ops_registry.hostile_calls()
    out = build_and_run(tmp_path, "hostile_sizes", headers={"hostile_calls.h": calls}).stdout
    assert out.strip() == f"{count} hostile calls rejected", out


@pytest.mark.skipif(not os.path.isdir(CSRC), reason="needs the source checkout (csrc/)")
def test_changing_the_thread_count_mid_call_runs_clean_under_asan(tmp_path):
    """tests/c_api/thread_flips.c, with OpenMP: another thread flips the count (1 to 2^31 − 1)
    while attention, sgemm and LayerNorm's backward run; a workspace sized from one read of the
    count and used by a region of another is a heap overflow ASan sees."""
    out = build_and_run(tmp_path, "thread_flips", ["-fopenmp", "-pthread"]).stdout
    assert "all equal to the serial one" in out and int(out.split()[0]) >= 2, out
