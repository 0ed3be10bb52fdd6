#!/usr/bin/env bash
# One call that checks pytfm's CUDA backend on a machine with an NVIDIA GPU, and always returns
# a full report, however far it gets. Written for the H200 machine lent through the device
# tool's `run` (python3 there: a Python 3.12 virtualenv with numpy, cupy-cuda13x, torch,
# pytest, hypothesis and setuptools, but no cffi, and no network), usable on any such machine.
#
# On the H200 machine, from a session whose checkout holds gpu_wheels/ (made there by
# `bash scripts/fetch_gpu_wheels.sh`; it is git-ignored, so it travels only when carried):
#     run(command="bash scripts/gpu_check.sh", carry=["gpu_wheels"], timeout_s=600)
# Anywhere else:
#     bash scripts/gpu_check.sh            # the report goes to $OUT, or ./gpu_check_out
#
# Steps, in order; each runs under its own `timeout`, capped by what is left of one overall
# deadline (GPU_CHECK_BUDGET seconds, default 540: the run tool allows 600). A failing step is
# written into the report and the next one still runs; a step that would start with under
# GPU_CHECK_MIN_STEP seconds left (default 5) is reported as skipped.
#   wheels           cffi and pycparser from gpu_wheels/ (GPU_CHECK_WHEELS) into a temporary
#                    folder with `pip install --no-index --no-deps --target`, put on PYTHONPATH;
#                    nothing is installed when python3 already imports both
#   build-werror     python3 setup.py build_ext --inplace, PYTFM_CUDA=1, PYTFM_WERROR=1,
#                    PYTFM_CUDA_ARCH=90 (or as set); if it fails:
#   build-plain      the same without PYTFM_WERROR (the report says so)
#   import           import pytfm; its build_info must say CUDA
#   nvidia-smi       the GPU, driver, clocks and memory as the driver reports them (read only)
#   gpu              CuPy sees a device: its name, SMs, L2, memory; cupy and torch versions
#   gpu-tests        pytest tests/cuda/test_cuda_gpu.py tests/cuda/test_cuda_gpu_model.py (the
#                    files that exist); a run where every test skipped (no GPU) fails
#   sanitizer-memcheck, sanitizer-racecheck, sanitizer-synccheck
#                    compute-sanitizer over scripts/cuda_small_run.py with CuPy's memory pool
#                    off (PYTFM_SMALL_RUN_NO_POOL=1), so memcheck sees each array's end; a
#                    sanitizer that refuses the device or runtime is reported REFUSED
#   bench            bench/cuda_ops.py --out $OUT/bench.txt, given the step's seconds as its
#                    budget; the tests and sanitizers leave it at least 120 s of the deadline
#                    (and it leaves 15 s for the register report)
#   registers        nvcc's -Xptxas -v report (pytfm/lib/cuda_build.log) as one row per
#                    kernel: registers, static shared memory, stack, spills
# Files in $OUT (at most 8, flat, as the run tool brings back): gpu_check.txt (everything),
# summary.txt (the table printed last), bench.txt, registers.txt, cuda_build.log.
#
# Environment: OUT, GPU_CHECK_BUDGET, GPU_CHECK_MIN_STEP, GPU_CHECK_WHEELS, PYTFM_CUDA_ARCH,
# GPU_CHECK_LIMIT_<STEP> (a step's own limit in seconds, e.g. GPU_CHECK_LIMIT_GPU_TESTS=120),
# GPU_CHECK_TAIL (lines of each step's output echoed to stdout, default 12; the report keeps
# all). tests/cuda/test_gpu_check.py rehearses every failure path with stub commands on PATH.
# Exit status: 0 when every step passed (REFUSED sanitizers count as passed, and are listed),
# 1 when a step failed, timed out or was skipped, 2 for a usage error.

set -uo pipefail  # no -e: a failing step must not end the run before the report is written
cd "$(dirname "$0")/.." || exit 2
ROOT="$PWD"

# ---- nvcc's register report: `gpu_check.sh --register-report LOG` (the registers step) ------
register_report() {
    local log="$1"
    [ -f "$log" ] || { echo "no $log: the CUDA build did not run (or wrote no report)"; return 1; }
    local demangle=cat
    command -v c++filt >/dev/null && demangle="c++filt"
    printf '%5s %8s %7s %11s  %-18s %s\n' regs smem_B stack_B spill_st/ld file kernel
    # ptxas -v, per kernel: "Compiling entry function 'NAME' for 'sm_XX'", "Function properties
    # for NAME", "N bytes stack frame, N bytes spill stores, N bytes spill loads", "Used N
    # registers, used N barriers[, N bytes smem][, ...]"; setup.py heads each file "## FILE"
    awk '
        /^## /                             { file = $2; sub(/^cuda\//, "", file) }
        /Compiling entry function/         { match($0, /\047[^\047]+\047/); fn = substr($0, RSTART + 1, RLENGTH - 2)
                                             match($0, /for \047sm_[0-9a-z]+\047/); arch = substr($0, RSTART + 5, RLENGTH - 6)
                                             stack = st = ld = 0 }
        /bytes stack frame/                { stack = $1; st = $5; ld = $9 }
        /Used [0-9]+ registers/            { regs = 0; smem = 0
                                             for (i = 1; i <= NF; i++) {
                                                 if ($(i + 1) ~ /^registers/) regs = $i
                                                 if ($(i + 1) == "bytes" && $(i + 2) ~ /^smem/) smem = $i }
                                             printf "%5d %8d %7d %5d/%-5d  %-18s %s [%s]\n", regs, smem, stack, st, ld, file, fn, arch }
    ' "$log" | $demangle | sort -b -k5,5 -k1,1nr
    echo "smem_B is static shared memory only (dynamic shared memory is set at launch); a"
    echo "spill_st/ld other than 0/0 means registers went to local memory."
}
if [ "${1:-}" = "--register-report" ]; then
    register_report "${2:-pytfm/lib/cuda_build.log}"
    exit
fi
if [ $# -gt 0 ]; then
    sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
    [ "$1" = "--help" ] || [ "$1" = "-h" ] && exit 0
    exit 2
fi

OUT="${OUT:-$ROOT/gpu_check_out}"
BUDGET="${GPU_CHECK_BUDGET:-540}"
MIN_STEP="${GPU_CHECK_MIN_STEP:-5}"
WHEELS="${GPU_CHECK_WHEELS:-$ROOT/gpu_wheels}"
ARCH="${PYTFM_CUDA_ARCH:-90}"
TAIL="${GPU_CHECK_TAIL:-12}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# the checkout first: `python3 scripts/x.py` puts scripts/, not the root, on sys.path
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

mkdir -p "$OUT" || { echo "cannot create OUT=$OUT"; exit 2; }
report="$OUT/gpu_check.txt"
: >"$report"
rm -f "$OUT/summary.txt" "$OUT/bench.txt" "$OUT/registers.txt" "$OUT/cuda_build.log"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# killed from outside (the run tool's own limit): keep what the running step printed so far
trap 'say "gpu_check: stopped by a signal during step ${current:-?}"; \
      [ -f "${current_log:-/nonexistent}" ] && cat "$current_log" >>"$report"; exit 1' TERM INT

now_us() { echo "${EPOCHREALTIME//[!0-9]/}"; }  # bash 5: microseconds, whatever the locale
START_US="$(now_us)"
DEADLINE_US=$((START_US + BUDGET * 1000000))
left_s() { echo $(((DEADLINE_US - $(now_us)) / 1000000)); }
seconds_since() { local d=$(($(now_us) - $1)); printf '%d.%d' $((d / 1000000)) $((d / 100000 % 10)); }

say() { printf '%s\n' "$*"; printf '%s\n' "$*" >>"$report"; }
note() { printf '%s\n' "$*" >>"$report"; }  # the report only

NAMES=() STATUSES=() TIMES=()
record() { # name status seconds
    NAMES+=("$1") STATUSES+=("$2") TIMES+=("$3")
    say "==== $1: $2 (${3} s)"
}

# run_step NAME LIMIT COMMAND...: run COMMAND under timeout min(LIMIT, left - RESERVE), its
# output into $work/NAME.log, all of it appended to the report, the last TAIL lines echoed.
# Sets RC (124 for a timeout, 125 when skipped), LOG, SECS and STATUS (the default reading of
# RC: the caller may change STATUS, then calls `record "$NAME" "$STATUS" "$SECS"`).
RESERVE=0
run_step() {
    NAME="$1"
    local limit="$2"; shift 2
    local var="GPU_CHECK_LIMIT_${NAME^^}"
    var="${var//-/_}"
    limit="${!var:-$limit}"
    local left; left="$(left_s)"
    local avail=$((left - RESERVE))
    LOG="$work/$NAME.log"
    : >"$LOG"
    if [ "$avail" -lt "$MIN_STEP" ]; then
        RC=125 SECS=0.0
        STATUS="SKIPPED (deadline: ${left} s left of ${BUDGET} s"
        [ "$RESERVE" -gt 0 ] && STATUS="$STATUS, ${RESERVE} s of it kept for the bench"
        STATUS="$STATUS)"
        return
    fi
    [ "$limit" -gt "$avail" ] && limit="$avail"
    local shown="$*"  # the command's first line (the -c probes run to several)
    [ "${shown%%$'\n'*}" = "$shown" ] || shown="${shown%%$'\n'*} ..."
    say ""
    say "==== $NAME: $shown (limit ${limit} s; ${left} s left)"
    current="$NAME" current_log="$LOG"
    local t0; t0="$(now_us)"
    GPU_CHECK_STEP_SECONDS="$limit" timeout -k 5 "$limit" "$@" >"$LOG" 2>&1 </dev/null
    RC=$?
    SECS="$(seconds_since "$t0")"
    current="" current_log=""
    cat "$LOG" >>"$report"
    tail -n "$TAIL" "$LOG"
    local elapsed=$((($(now_us) - t0) / 1000000))
    if [ "$RC" = 0 ]; then
        STATUS=ok
    elif [ "$RC" = 124 ] || { [ "$RC" = 137 ] && [ "$elapsed" -ge "$limit" ]; }; then
        STATUS="TIMEOUT (killed after ${limit} s)"
        RC=124
    elif [ "$RC" = 127 ]; then
        STATUS="FAIL (command not found: $1)"
    else  # with the output's last line, which usually names the error
        local last
        last="$(grep -v '^[[:space:]]*$' "$LOG" | tail -n 1 | cut -c 1-100)"
        STATUS="FAIL (exit $RC)${last:+: $last}"
    fi
}
step() { run_step "$@"; record "$NAME" "$STATUS" "$SECS"; }
# a step that cannot start (a tool is missing): recorded at once, no time spent
cannot() { say ""; record "$1" "$2" 0.0; }

say "pytfm gpu_check $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')" \
    "$(date -u +%FT%TZ) on $(hostname 2>/dev/null || echo '?')"
say "deadline ${BUDGET} s; report $report"
say "python3: $(command -v python3 || echo 'not found') $(python3 --version 2>&1)"
say "nvcc: $( (nvcc --version 2>&1 || echo 'not found') | tail -n 1)"

# ---- wheels: cffi and pycparser (python3 there has neither, and no index) --------------------
if python3 -c "import cffi, pycparser" >/dev/null 2>&1; then
    say ""
    say "==== wheels: python3 already imports cffi and pycparser: nothing installed"
    record wheels "ok (already installed)" 0.0
elif ! ls "$WHEELS"/cffi-*.whl "$WHEELS"/pycparser-*.whl >/dev/null 2>&1; then
    cannot wheels "FAIL (no cffi and pycparser wheels in $WHEELS: python3 cannot import cffi; run \
scripts/fetch_gpu_wheels.sh where pip reaches PyPI, and name gpu_wheels in the run tool's carry)"
else
    site="$work/site"
    run_step wheels 120 python3 -m pip install --no-index --no-deps --no-compile \
        --disable-pip-version-check --target "$site" "$WHEELS"/cffi-*.whl "$WHEELS"/pycparser-*.whl
    export PYTHONPATH="$site:$PYTHONPATH"
    if [ "$STATUS" = ok ] && ! python3 -c "import cffi, pycparser" >>"$report" 2>&1; then
        STATUS="FAIL (installed into $site, but python3 still cannot import cffi)"
    fi
    record wheels "$STATUS" "$SECS"
fi

# ---- build, warnings as errors, then without ------------------------------------------------
run_step build-werror 300 env PYTFM_CUDA=1 PYTFM_WERROR=1 PYTFM_CUDA_ARCH="$ARCH" \
    python3 setup.py build_ext --inplace
case "$RC" in
    0 | 124 | 125) record "$NAME" "$STATUS" "$SECS" ;;  # a timeout would time out again
    *)
        record "$NAME" "$STATUS: retried without PYTFM_WERROR" "$SECS"
        say "the warnings-as-errors build failed: building once more without PYTFM_WERROR"
        step build-plain 300 env -u PYTFM_WERROR PYTFM_CUDA=1 PYTFM_CUDA_ARCH="$ARCH" \
            python3 setup.py build_ext --inplace
        ;;
esac
run_step import 60 python3 -c "import pytfm
info = pytfm.build_info()
print(pytfm.__file__, info)
assert info['cuda'], 'pytfm was built without CUDA'"
# the cause in the table: a twin declared in pytfm.h but not built leaves an undefined symbol
if [ "$RC" != 0 ] && [ "$RC" != 125 ]; then
    why="$(grep -m 1 -oE 'undefined symbol: [A-Za-z0-9_]+|pytfm was built without CUDA' "$LOG")"
    [ -n "$why" ] && STATUS="FAIL (exit $RC): $why"
fi
record "$NAME" "$STATUS" "$SECS"

# ---- the GPU ---------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null; then
    step nvidia-smi 30 bash -c 'nvidia-smi && nvidia-smi --format=csv \
        --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw'
else
    cannot nvidia-smi "FAIL (nvidia-smi not found on PATH: no NVIDIA driver on this machine?)"
fi
step gpu 60 python3 -c "import cupy, sys
n = cupy.cuda.runtime.getDeviceCount()
assert n > 0, 'CuPy sees no CUDA device'
p = cupy.cuda.runtime.getDeviceProperties(0)
name = p['name'].decode() if isinstance(p['name'], bytes) else p['name']
print(f\"{n} device(s); 0: {name}, {p['multiProcessorCount']} SMs, \"
      f\"L2 {p['l2CacheSize'] / 1e6:.1f} MB, {p['totalGlobalMem'] / 2**30:.1f} GiB, \"
      f\"compute capability {p['major']}.{p['minor']}\")
print('cupy', cupy.__version__, 'CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(),
      'driver', cupy.cuda.runtime.driverGetVersion())
try:
    import torch
    print('torch', torch.__version__, 'cuda available:', torch.cuda.is_available())
except ImportError as e:
    print('torch: not importable:', e)"

# ---- the GPU tests -----------------------------------------------------------------------------
# the tests and the sanitizers leave 135 s of the deadline for the bench and the register report,
# the bench 15 s for the register report: a slow build cuts the checks, not the figures
RESERVE=135
tests=()
for f in tests/cuda/test_cuda_gpu.py tests/cuda/test_cuda_gpu_model.py; do
    if [ -f "$f" ]; then tests+=("$f"); else say "gpu-tests: $f does not exist: not run"; fi
done
if [ ${#tests[@]} = 0 ]; then
    cannot gpu-tests "FAIL (no GPU test file found)"
else
    run_step gpu-tests 180 python3 -m pytest -q -p no:cacheprovider -rs "${tests[@]}"
    if [ "$RC" = 0 ] && ! tail -n 3 "$LOG" | grep -q " passed"; then
        STATUS="FAIL (no test ran: every test skipped, reasons above)"
    elif [ "$RC" = 5 ]; then
        STATUS="FAIL (pytest collected no test)"
    fi
    record "$NAME" "$STATUS" "$SECS"
fi

# ---- compute-sanitizer over a small run --------------------------------------------------------
sanitizer="$(command -v compute-sanitizer || true)"
for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [ -z "$sanitizer" ] && [ -n "$dir" ] && [ -x "$dir/bin/compute-sanitizer" ] \
        && sanitizer="$dir/bin/compute-sanitizer"
done
if [ -z "$sanitizer" ] && command -v nvcc >/dev/null; then
    nvcc_dir="$(dirname "$(readlink -f "$(command -v nvcc)")")"
    [ -x "$nvcc_dir/compute-sanitizer" ] && sanitizer="$nvcc_dir/compute-sanitizer"
fi
for tool in memcheck racecheck synccheck; do
    if [ -z "$sanitizer" ]; then
        cannot "sanitizer-$tool" "FAIL (compute-sanitizer not found on PATH, in \$CUDA_HOME/bin or beside nvcc)"
        continue
    fi
    run_step "sanitizer-$tool" 90 env PYTFM_SMALL_RUN_NO_POOL=1 "$sanitizer" --tool "$tool" \
        --error-exitcode 99 python3 scripts/cuda_small_run.py
    # the sanitizer's own lines start with "========="; a refusal of the device or runtime is
    # not a finding about pytfm: say so and go on
    refusal="$(grep -m 1 -E '^========= .*(not supported|Not supported|Internal Sanitizer Error|injection library|Unsupported)' "$LOG")"
    if [ "$RC" != 0 ] && [ "$RC" != 124 ] && [ -n "$refusal" ]; then
        STATUS="REFUSED (${refusal#========= })"
    elif [ "$RC" = 99 ] || grep -qE '^========= ERROR SUMMARY: [1-9]' "$LOG"; then
        STATUS="FAIL ($(grep -m 1 -oE 'ERROR SUMMARY: [0-9]+ errors?' "$LOG" || echo "errors found"))"
    fi
    record "$NAME" "$STATUS" "$SECS"
done

# ---- the benchmark ---------------------------------------------------------------------------------
RESERVE=15
step bench 240 python3 bench/cuda_ops.py --out "$OUT/bench.txt"
RESERVE=0

# ---- nvcc's register report ----------------------------------------------------------------------
step registers 30 bash "$ROOT/scripts/gpu_check.sh" --register-report pytfm/lib/cuda_build.log
[ -f "$LOG" ] && cp "$LOG" "$OUT/registers.txt"
[ -f pytfm/lib/cuda_build.log ] && cp pytfm/lib/cuda_build.log "$OUT/cuda_build.log"

# ---- the summary ---------------------------------------------------------------------------------
failed=0 refused=0
{
    echo "gpu_check summary ($(seconds_since "$START_US") s of ${BUDGET} s)"
    printf '%-20s %8s  %s\n' step seconds status
    for i in "${!NAMES[@]}"; do
        printf '%-20s %8s  %s\n' "${NAMES[$i]}" "${TIMES[$i]}" "${STATUSES[$i]}"
    done
} >"$work/summary"
for s in "${STATUSES[@]}"; do
    case "$s" in
        ok*) ;;
        REFUSED*) refused=$((refused + 1)) ;;
        *) failed=$((failed + 1)) ;;
    esac
done
echo "gpu_check: ${#NAMES[@]} steps, $failed failed or skipped, $refused refused by the sanitizer" \
    >>"$work/summary"
cp "$work/summary" "$OUT/summary.txt"
say ""
if [ -s "$OUT/bench.txt" ]; then
    say "==== bench table ($OUT/bench.txt)"
    cat "$OUT/bench.txt"
    note "(the bench table is above, in the bench step's output)"
fi
say ""
cat "$work/summary"
cat "$work/summary" >>"$report"
[ "$failed" = 0 ]
