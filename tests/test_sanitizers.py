"""The C kernels under AddressSanitizer and UndefinedBehaviorSanitizer.

The Python tests cannot see a read one element past a buffer; ASan can. This builds
tests/c/sanitize_kernels.c with the library sources and runs every kernel on exactly-sized heap
buffers at awkward sizes.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
FLAGS = ["-std=c11", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


def sanitizer_build(cc, src, exe):
    sources = sorted(os.path.join(CSRC, f) for f in os.listdir(CSRC) if f.endswith(".c"))
    return subprocess.run([cc, *FLAGS, f"-I{CSRC}/include", src, *sources, "-lm", "-o", exe],
                          capture_output=True, text=True)


@pytest.mark.skipif(not os.path.isdir(CSRC), reason="needs the source checkout (csrc/)")
def test_kernels_run_clean_under_asan_and_ubsan(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    if subprocess.run([cc, "-fsanitize=address,undefined", str(probe), "-o", str(tmp_path / "p")],
                      capture_output=True).returncode:
        pytest.skip(f"{cc} cannot link sanitizer runtimes (libasan/libubsan) on this machine")
    exe = str(tmp_path / "sanitize_kernels")
    build = sanitizer_build(cc, os.path.join(ROOT, "tests", "c", "sanitize_kernels.c"), exe)
    assert build.returncode == 0, build.stderr
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1")
    run = subprocess.run([exe], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "size combinations ran clean" in run.stdout
