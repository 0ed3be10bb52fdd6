#!/usr/bin/env bash
# One-shot check of pytfm's CUDA backend on a machine with an NVIDIA GPU:
#   1. build pytfm with nvcc for sm_90 (PYTFM_CUDA_ARCH to change), warnings as errors
#   2. the GPU tests (CuPy arrays vs the CPU kernels) and the emulator tests
#   3. compute-sanitizer memcheck and racecheck over scripts/cuda_small_run.py, where available
#   4. bench/cuda_ops.py: each kernel's time and GB/s or GFLOP/s, against cupy.matmul (cuBLAS)
#      and a device-to-device copy
# Everything is printed, and appended to $OUT/gpu_check.txt when OUT is set.
#
# Needs: nvcc, a C/C++ compiler, Python 3.9+. Python packages (numpy, cffi, setuptools, pytest,
# hypothesis, cupy-cuda13x or cupy-cuda12x) come from pip; on a machine without network access,
# carry the wheels in a folder and set WHEELS=/path/to/wheels (pip then installs only from it).
# Exit status: non-zero if the build or any step fails (every step still runs).
set -euo pipefail
cd "$(dirname "$0")/.."

report="${OUT:+$OUT/gpu_check.txt}"
say() { echo "$@"; if [ -n "$report" ]; then echo "$@" >>"$report"; fi; }
run_step() { # name, command...: run, keep the output, remember a failure
    local name="$1"; shift
    say "== $name: $*"
    local rc=0
    if [ -n "$report" ]; then "$@" 2>&1 | tee -a "$report" || rc=$?; else "$@" || rc=$?; fi
    say "== $name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
    [ "$rc" = 0 ] || failures=$((failures + 1))
}
failures=0
[ -n "$report" ] && mkdir -p "$OUT" && : >"$report"

say "pytfm gpu_check $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | while read -r l; do say "$l"; done || true
command -v nvcc >/dev/null || { say "nvcc not on PATH: set PATH or CUDA_HOME"; exit 1; }

venv="$(mktemp -d)/venv"
python3 -m venv --system-site-packages "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
pip_args=(-q)
[ -n "${WHEELS:-}" ] && pip_args+=(--no-index --find-links "$WHEELS")
python -c "import cffi, setuptools, numpy" 2>/dev/null || pip install "${pip_args[@]}" numpy cffi setuptools
python -c "import pytest, hypothesis" 2>/dev/null || pip install "${pip_args[@]}" pytest hypothesis
python -c "import cupy" 2>/dev/null || pip install "${pip_args[@]}" cupy-cuda13x \
    || pip install "${pip_args[@]}" cupy-cuda12x

export PYTFM_CUDA=1 PYTFM_WERROR=1 PYTFM_CUDA_ARCH="${PYTFM_CUDA_ARCH:-90}"
run_step build pip install "${pip_args[@]}" --no-build-isolation .
[ "$failures" = 0 ] || { say "build failed"; exit 1; }
run_step build-info python -m pytfm
grep -h "registers\|spill" pytfm/lib/cuda_build.log | sort | uniq -c | sort -rn | head -5 \
    | while read -r l; do say "ptxas: $l"; done || true

run_step gpu-tests python -m pytest -q -p no:cacheprovider tests/test_cuda_gpu.py tests/test_cuda_emu.py
if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
        run_step "sanitizer-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
            python scripts/cuda_small_run.py
    done
else
    say "compute-sanitizer not found: sanitizer steps skipped"
fi
run_step bench python bench/cuda_ops.py
say "gpu_check: $failures step(s) failed"
[ "$failures" = 0 ]
