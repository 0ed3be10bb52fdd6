#!/usr/bin/env bash
# One call that checks pytfm's CUDA backend on a machine with an NVIDIA GPU, and always returns
# a report of what it got to, however far that is, even when it is killed. Written for the H200
# machine lent through the device tool's `run` (python3 there: a Python 3.12 virtualenv with
# numpy, cupy-cuda13x, torch, pytest, pytest-timeout, hypothesis, setuptools and the cmake
# package, but no cffi or pycparser, and no network; 16 cores; one command at most 600 s; about
# 15 minutes of device time a session, its cold start included), usable on any such machine.
#
# On the H200 machine, from a session whose checkout holds gpu_wheels/ (made there by
# `bash scripts/fetch_gpu_wheels.sh`; it is git-ignored, so it travels only when carried):
#     run(command="bash scripts/gpu_check.sh", carry=["gpu_wheels"], timeout_s=330)
# Anywhere else:
#     bash scripts/gpu_check.sh            # the report goes to $OUT, or ./gpu_check_out
#
# The budget. One deadline, GPU_CHECK_BUDGET seconds (default 300), caps every step: a
# session's 900 device-seconds hold a cold start (up to 120 s by the device tool's notes), a
# first call (300 s and ~15 s of transfers), and a second call of the same length even when
# the machine has gone cold again in between (120 + 300 + 15): 870 s, and 435 s are still left
# after the first call, over the 240 s below which no machine is started. The run tool's
# timeout_s (330) leaves the steps' last kill (5 s) and the transfers room. A warm second call
# finds the build and CuPy's compiled kernels in place and reaches further; GPU_CHECK_SKIP
# names steps it need not repeat (e.g. GPU_CHECK_SKIP=gpu-tests-tc,bench-tc).
#
# The order: the most valuable results first, since the deadline ends the run where it is.
# The prerequisites (a build that imports and a GPU that CuPy sees), then the tensor cores:
# their GPU tests first (a figure of a wrong kernel is worth nothing) and their figures (what
# no emulator can give: the TF32/BF16 products and attention against cuBLAS and torch), then
# the model's step (train_tiny's and the GPT-2-shaped step's tokens/s, the bf16 target), then
# the other GPU tests, then the three sanitizers (racecheck and synccheck have never run on a
# GPU), and last the FP32 and memory-bound figures (estimated well; the first to give up).
# The GPU tests and the sanitizers keep time for the steps after them (GPU_CHECK_KEEP_*): a
# slow test run is cut rather than the sanitizers skipped. Estimates per step, and the sum, in
# docs/performance.md ("The GPU check's time on the H200").
#
# Steps, in order; each runs under its own `timeout` (GPU_CHECK_LIMIT_<STEP> overrides its
# limit), capped by what is left of the deadline less what it keeps for later. A failing step
# is written into the report and the next one still runs; a step that would start with under
# GPU_CHECK_MIN_STEP seconds left (default 5) is reported as skipped; the steps that need the
# GPU are NOT RUN, saying why, once pytfm does not import or no GPU can be used.
#   preflight        about a second: python3 and Python.h, cc, setuptools, cffi and cmake,
#                    nvcc, libcudart_static.a under $CUDA_HOME, compute-sanitizer and the
#                    options it has, pytest-timeout, and the GPU's clocks (nvidia-smi)
#   wheels           what python3 lacks (cffi and pycparser; cmake too, where it is missing)
#                    from gpu_wheels/ (GPU_CHECK_WHEELS) into a temporary folder with `pip
#                    install --no-index --no-deps --target`, put on PYTHONPATH (and cmake on
#                    PATH); nothing when python3 has them already
#   build            python3 setup.py build_ext --inplace, PYTFM_CUDA=1, PYTFM_CUDA_ARCH=90
#                    (or as set), nvcc on every core (CMAKE_BUILD_PARALLEL_LEVEL); once, without
#                    PYTFM_WERROR: warnings as errors are CI's, not this machine's
#   registers        nvcc's -Xptxas -v report (pytfm/lib/cuda_build.log) as one row per
#                    kernel: registers, static shared memory, stack, spills; a spill fails it
#   import           import pytfm; its build_info must say CUDA
#   gpu              CuPy sees a device: its name, SMs, L2, memory; cupy and torch versions
#   gpu-tests-tc     the GPU tests of the tensor cores: pytest -k "$GPU_CHECK_TC_TESTS"
#                    (default "tensor_core or bf16 or tf32": names and parameter ids)
#   bench-tc         bench/cuda_ops.py --sections tensor-cores: TF32/BF16 products, BF16
#                    operands, tensor-core attention
#   bench-step       bench/cuda_ops.py --sections step: train_tiny's and the GPT-2-shaped step
#   gpu-tests        the other GPU tests (tests/cuda/test_cuda_gpu.py, test_cuda_gpu_model.py,
#                    the files that exist), --durations, a per-test timeout where
#                    pytest-timeout is installed; a run where every test skipped fails
#   sanitizer-memcheck, sanitizer-racecheck, sanitizer-synccheck
#                    compute-sanitizer over scripts/cuda_small_run.py with CuPy's memory pool
#                    off (PYTFM_SMALL_RUN_NO_POOL=1), so memcheck sees each array's end, on
#                    pytfm's kernels only (CuPy's excluded, where the sanitizer has
#                    --kernel-name-exclude) and a bounded print; a sanitizer that refuses the
#                    device or runtime is reported REFUSED; one cut at its limit is TIMEOUT,
#                    with the errors it found until then
#   bench-rest       bench/cuda_ops.py --sections rest: the ceilings, FP32 attention and
#                    products, the linear layer, the memory-bound kernels, until the deadline
# Each bench step is given its step's seconds as its budget, appends its rows to bench.txt as
# they are measured and rewrites bench.json (atomically) as each section starts and ends, so
# a step killed at its limit loses only the section it was in.
# Files in $OUT (at most 8, flat, as the run tool brings back): gpu_check.txt (everything, as
# it runs), summary.txt (the table, rewritten after every step, so a run killed from outside
# still leaves one; printed last), bench.txt, bench.json, registers.txt, cuda_build.log.
#
# Environment: OUT, GPU_CHECK_BUDGET, GPU_CHECK_MIN_STEP, GPU_CHECK_WHEELS, PYTFM_CUDA_ARCH,
# GPU_CHECK_LIMIT_<STEP> (a step's own limit in seconds, e.g. GPU_CHECK_LIMIT_GPU_TESTS=120),
# GPU_CHECK_KEEP_<STEP> (seconds a step leaves for the steps after it), GPU_CHECK_SKIP (steps,
# comma-separated, reported SKIPPED without running), GPU_CHECK_TC_TESTS, GPU_CHECK_BENCH_ARGS
# (more arguments for each bench step), GPU_CHECK_TEST_TIMEOUT (seconds a GPU test may take,
# default 60), GPU_CHECK_TAIL (lines of each step's output echoed to stdout, default 12; the
# report keeps all), CUDA_HOME or CUDA_PATH (the toolkit; else nvcc's, else
# GPU_CHECK_CUDA_FALLBACK, default /usr/local/cuda).
# tests/cuda/test_gpu_check.py rehearses every failure path with stub commands on PATH;
# tests/cuda/test_cuda_bench_rehearsal.py runs every bench section on the emulated GPU.
# Exit status: 0 when every step passed (REFUSED sanitizers count as passed, and are listed),
# 1 when a step failed, timed out, was skipped or not run, 2 for a usage error.

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
    # registers, used N barriers[, N bytes smem][, ...]"; cmake/nvcc_report.sh heads each file
    # "## FILE"
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
                                             printf "%5d %8d %7d %5d/%-5d  %-18s %s [%s]\n", regs, smem, stack, st, ld, file, fn, arch
                                             if (st + ld > 0) spills++ }
        END                                { if (spills) { printf "SPILLS: %d kernel(s) spill registers\n", spills > "/dev/stderr"; exit 3 } }
    ' "$log" | $demangle | sort -b -k5,5 -k1,1nr
    local rc=${PIPESTATUS[0]}
    echo "smem_B is static shared memory only (dynamic shared memory is set at launch); a"
    echo "spill_st/ld other than 0/0 means registers went to local memory."
    return "$rc"
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
BUDGET="${GPU_CHECK_BUDGET:-300}"
MIN_STEP="${GPU_CHECK_MIN_STEP:-5}"
WHEELS="${GPU_CHECK_WHEELS:-$ROOT/gpu_wheels}"
ARCH="${PYTFM_CUDA_ARCH:-90}"
TAIL="${GPU_CHECK_TAIL:-12}"
TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT:-60}"
SKIP=",${GPU_CHECK_SKIP:-},"
TC_TESTS="${GPU_CHECK_TC_TESTS:-tensor_core or bf16 or tf32}"
read -r -a BENCH_ARGS <<<"${GPU_CHECK_BENCH_ARGS:-}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# the checkout first: `python3 scripts/x.py` puts scripts/, not the root, on sys.path
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

mkdir -p "$OUT" || { echo "cannot create OUT=$OUT"; exit 2; }
report="$OUT/gpu_check.txt"
: >"$report"
rm -f "$OUT/summary.txt" "$OUT/bench.txt" "$OUT/bench.json" "$OUT/registers.txt" \
    "$OUT/cuda_build.log"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# killed from outside (the run tool's own limit): keep what the running step printed so far
trap 'say "gpu_check: stopped by a signal during step ${current:-?}"; \
      [ -n "${step_pid:-}" ] && kill -TERM "$step_pid" 2>/dev/null; \
      [ -f "${current_log:-/nonexistent}" ] && cat "$current_log" >>"$report"; \
      write_summary "stopped by a signal during step ${current:-?}"; exit 1' TERM INT

now_us() { echo "${EPOCHREALTIME//[!0-9]/}"; }  # bash 5: microseconds, whatever the locale
START_US="$(now_us)"
DEADLINE_US=$((START_US + BUDGET * 1000000))
left_s() { echo $(((DEADLINE_US - $(now_us)) / 1000000)); }
seconds_since() { local d=$(($(now_us) - $1)); printf '%d.%d' $((d / 1000000)) $((d / 100000 % 10)); }

say() { printf '%s\n' "$*"; printf '%s\n' "$*" >>"$report"; }
note() { printf '%s\n' "$*" >>"$report"; }  # the report only

NAMES=() STATUSES=() TIMES=()
# write_summary [NOTE]: $OUT/summary.txt rewritten (a temporary file renamed over it) from
# the steps recorded so far, NOTE (what is still to come, or why it stopped) on its last line
write_summary() {
    local failed=0 refused=0 i s
    for s in "${STATUSES[@]}"; do
        case "$s" in
            ok*) ;;
            REFUSED*) refused=$((refused + 1)) ;;
            *) failed=$((failed + 1)) ;;
        esac
    done
    {
        echo "gpu_check summary ($(seconds_since "$START_US") s of ${BUDGET} s)"
        printf '%-20s %8s  %s\n' step seconds status
        for i in "${!NAMES[@]}"; do
            printf '%-20s %8s  %s\n' "${NAMES[$i]}" "${TIMES[$i]}" "${STATUSES[$i]}"
        done
        echo "gpu_check: ${#NAMES[@]} steps, $failed failed, skipped or not run, $refused" \
            "refused by the sanitizer${1:+; $1}"
    } >"$OUT/.summary.tmp" && mv -f "$OUT/.summary.tmp" "$OUT/summary.txt"
    FAILED=$failed
}
record() { # name status seconds
    NAMES+=("$1") STATUSES+=("$2") TIMES+=("$3")
    say "==== $1: $2 (${3} s)"
    write_summary "running: the steps after $1 are still to come"
}

# run_step NAME LIMIT COMMAND...: run COMMAND under timeout min(LIMIT, left), its output into
# $work/NAME.log, all of it appended to the report, the last TAIL lines echoed. Sets RC (124
# for a timeout, 125 when skipped), LOG, SECS and STATUS (the default reading of RC: the caller
# may change STATUS, then calls `record "$NAME" "$STATUS" "$SECS"`).
run_step() {
    NAME="$1"
    local limit="$2"; shift 2
    local var="GPU_CHECK_LIMIT_${NAME^^}"
    var="${var//-/_}"
    limit="${!var:-$limit}"
    local keep_var="GPU_CHECK_KEEP_${NAME^^}"
    keep_var="${keep_var//-/_}"
    local keep="${!keep_var:-${KEEP:-0}}"
    KEEP=0
    local left; left="$(left_s)"
    LOG="$work/$NAME.log"
    : >"$LOG"
    if [[ "$SKIP" == *",$NAME,"* ]]; then
        RC=125 SECS=0.0 STATUS="SKIPPED (GPU_CHECK_SKIP)"
        return
    fi
    # what the steps after this one are kept: never more than leaves this one MIN_STEP
    [ $((left - keep)) -lt "$MIN_STEP" ] && keep=$((left - MIN_STEP))
    [ "$keep" -lt 0 ] && keep=0
    if [ "$left" -lt "$MIN_STEP" ]; then
        RC=125 SECS=0.0 STATUS="SKIPPED (deadline: ${left} s left of ${BUDGET} s)"
        return
    fi
    [ "$limit" -gt $((left - keep)) ] && limit=$((left - keep))
    local shown="$*"  # the command's first line (the -c probes run to several)
    [ "${shown%%$'\n'*}" = "$shown" ] || shown="${shown%%$'\n'*} ..."
    say ""
    local kept=""
    [ "$keep" -gt 0 ] && kept=", ${keep} s kept for the steps after it"
    say "==== $NAME: $shown (limit ${limit} s; ${left} s left$kept)"
    current="$NAME" current_log="$LOG"
    local t0; t0="$(now_us)"
    # in the background and waited for: a signal to this script is handled at once (bash
    # runs a trap only after a foreground command ends), its trap ending the step too
    GPU_CHECK_STEP_SECONDS="$limit" timeout -k 5 "$limit" "$@" >"$LOG" 2>&1 </dev/null &
    step_pid=$!
    wait "$step_pid"
    RC=$?
    step_pid=""
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
# a step that cannot start (a tool is missing, the GPU cannot be used): recorded at once
cannot() { say ""; record "$1" "$2" 0.0; }

say "pytfm gpu_check $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')" \
    "$(date -u +%FT%TZ) on $(hostname 2>/dev/null || echo '?')"
say "deadline ${BUDGET} s; report $report"

# ---- preflight: what the build and the checks need, in about a second -----------------------
q() { timeout 5 "$@" 2>&1; }  # a probe: its output, whatever it says
preflight() {
    local missing=()
    echo "python3: $(command -v python3 || echo 'not found') $(q python3 --version)"
    command -v python3 >/dev/null || missing+=(python3)
    local include
    include="$(q python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    if [ -f "$include/Python.h" ]; then echo "Python.h: $include/Python.h"
    else echo "Python.h: not found in $include (a cffi module cannot be built)"; missing+=(Python.h); fi
    local cc="${CC:-cc}"
    if command -v "$cc" >/dev/null; then echo "$cc: $(q "$cc" --version | head -n 1)"
    else echo "$cc: not found"; missing+=("$cc"); fi
    echo "setuptools: $(q python3 -c 'import setuptools; print(setuptools.__version__)' | tail -n 1)"
    q python3 -c 'import setuptools' >/dev/null || missing+=(setuptools)
    echo "cffi: $(q python3 -c 'import cffi; print(cffi.__version__)' | tail -n 1)"
    echo "cmake: $(command -v cmake || echo 'not on PATH') $( (q cmake --version || true) | head -n 1)"
    local nvcc; nvcc="$(command -v nvcc || true)"
    if [ -n "$nvcc" ]; then echo "nvcc: $nvcc, $(q nvcc --version | tail -n 1)"
    else echo "nvcc: not found on PATH"; missing+=(nvcc); fi
    # the toolkit: $CUDA_HOME, $CUDA_PATH, nvcc's folder's parent, /usr/local/cuda (or
    # GPU_CHECK_CUDA_FALLBACK)
    local homes=() home cudart=""
    [ -n "${CUDA_HOME:-}" ] && homes+=("$CUDA_HOME")
    [ -n "${CUDA_PATH:-}" ] && homes+=("$CUDA_PATH")
    [ -n "$nvcc" ] && homes+=("$(dirname "$(dirname "$(readlink -f "$nvcc")")")")
    homes+=("${GPU_CHECK_CUDA_FALLBACK:-/usr/local/cuda}")
    for home in "${homes[@]}"; do
        cudart="$(ls "$home"/lib64/libcudart_static.a "$home"/lib/libcudart_static.a \
            "$home"/targets/*/lib/libcudart_static.a 2>/dev/null | head -n 1)"
        [ -n "$cudart" ] && break
    done
    if [ -n "$cudart" ]; then echo "libcudart_static.a: $cudart"
    else echo "libcudart_static.a: not found under ${homes[*]}"; missing+=(libcudart_static.a); fi
    if [ -n "$SANITIZER" ]; then
        echo "compute-sanitizer: $SANITIZER, $(q "$SANITIZER" --version | grep -m 1 -i version)"
        echo "compute-sanitizer options used: ${SANITIZER_OPTS[*]:-(none of the filters)}"
    else
        echo "compute-sanitizer: not found (PATH, \$CUDA_HOME/bin, beside nvcc)"
    fi
    echo "pytest-timeout: $(q python3 -c 'import pytest_timeout; print("yes")' | tail -n 1)"
    if command -v nvidia-smi >/dev/null; then
        echo "GPU: $(q nvidia-smi --format=csv,noheader --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,temperature.gpu,memory.used,memory.total)"
    else
        echo "GPU: nvidia-smi not found (no NVIDIA driver on this machine?)"
    fi
    if [ ${#missing[@]} -gt 0 ]; then echo "missing: ${missing[*]}"; return 1; fi
}
SANITIZER="$(command -v compute-sanitizer || true)"
for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [ -z "$SANITIZER" ] && [ -n "$dir" ] && [ -x "$dir/bin/compute-sanitizer" ] \
        && SANITIZER="$dir/bin/compute-sanitizer"
done
if [ -z "$SANITIZER" ] && command -v nvcc >/dev/null; then
    nvcc_dir="$(dirname "$(readlink -f "$(command -v nvcc)")")"
    [ -x "$nvcc_dir/compute-sanitizer" ] && SANITIZER="$nvcc_dir/compute-sanitizer"
fi
SANITIZER_OPTS=()  # the filters this sanitizer knows (its --help says)
if [ -n "$SANITIZER" ]; then
    help="$(timeout 5 "$SANITIZER" --help 2>&1)"
    [[ "$help" == *--kernel-name-exclude* ]] && SANITIZER_OPTS+=(--kernel-name-exclude kns=cupy)
    [[ "$help" == *--print-limit* ]] && SANITIZER_OPTS+=(--print-limit 20)
fi
# run here, not under `timeout` (a shell function): each probe has its own 5 s
say ""
say "==== preflight"
t0="$(now_us)"
preflight >"$work/preflight.log" 2>&1
pre_rc=$? status=ok
[ "$pre_rc" = 0 ] || status="MISSING ($(grep -m 1 '^missing: ' "$work/preflight.log" | cut -c 10-))"
cat "$work/preflight.log" >>"$report"
cat "$work/preflight.log"
record preflight "$status" "$(seconds_since "$t0")"

# ---- wheels: cffi and pycparser (python3 there has none, and no index), cmake where missing ----
need=()
python3 -c "import cffi, pycparser" >/dev/null 2>&1 || need+=(cffi pycparser)
# (the checkout's cmake/ folder is a namespace package: the wheel's has CMAKE_BIN_DIR)
command -v cmake >/dev/null || python3 -c "from cmake import CMAKE_BIN_DIR" >/dev/null 2>&1 \
    || need+=(cmake)
if [ ${#need[@]} = 0 ]; then
    say ""
    say "==== wheels: python3 imports cffi and pycparser and cmake is there: nothing installed"
    record wheels "ok (already installed)" 0.0
else
    wheels=() absent=()
    for name in "${need[@]}"; do
        w="$(ls "$WHEELS"/"$name"-*.whl 2>/dev/null | head -n 1)"
        if [ -n "$w" ]; then wheels+=("$w"); else absent+=("$name"); fi
    done
    if [ ${#absent[@]} -gt 0 ]; then
        cannot wheels "FAIL (no ${absent[*]} wheel in $WHEELS: python3 lacks ${need[*]}; run \
scripts/fetch_gpu_wheels.sh (WITH_CMAKE=1 for cmake) where pip reaches PyPI, and name \
gpu_wheels in the run tool's carry)"
    else
        site="$work/site"
        run_step wheels 30 python3 -m pip install --no-index --no-deps --no-compile \
            --disable-pip-version-check --target "$site" "${wheels[@]}"
        export PYTHONPATH="$site:$PYTHONPATH"
        [ -d "$site/cmake/data/bin" ] && export PATH="$PATH:$site/cmake/data/bin"
        if [ "$STATUS" = ok ] && ! python3 -c "import cffi, pycparser" >>"$report" 2>&1; then
            STATUS="FAIL (installed into $site, but python3 still cannot import cffi)"
        fi
        record wheels "$STATUS" "$SECS"
    fi
fi

# ---- build: once, nvcc on every core, warnings as warnings --------------------------------------
jobs="$(nproc 2>/dev/null || echo 4)"
step build 150 env -u PYTFM_WERROR PYTFM_CUDA=1 PYTFM_CUDA_ARCH="$ARCH" \
    CMAKE_BUILD_PARALLEL_LEVEL="$jobs" python3 setup.py build_ext --inplace

# ---- nvcc's register report ----------------------------------------------------------------------
run_step registers 15 bash "$ROOT/scripts/gpu_check.sh" --register-report pytfm/lib/cuda_build.log
if [ "$RC" = 3 ]; then STATUS="FAIL ($(grep -m 1 '^SPILLS: ' "$LOG" | cut -c 9-))"; fi
record "$NAME" "$STATUS" "$SECS"
[ -f "$LOG" ] && cp "$LOG" "$OUT/registers.txt"
[ -f pytfm/lib/cuda_build.log ] && cp pytfm/lib/cuda_build.log "$OUT/cuda_build.log"

# ---- import ----------------------------------------------------------------------------------------
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
UNUSABLE=""  # why the steps that need pytfm on a GPU cannot run (past the deadline: SKIPPED)
[ "$STATUS" = ok ] || [[ "$STATUS" == SKIPPED* ]] || UNUSABLE="pytfm does not import: $STATUS"

# ---- the GPU ---------------------------------------------------------------------------------------
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
[ -z "$UNUSABLE" ] && [ "$STATUS" != ok ] && [[ "$STATUS" != SKIPPED* ]] \
    && UNUSABLE="no usable GPU: $STATUS"

# gpu_step NAME LIMIT COMMAND...: the step, or NOT RUN with the reason when the GPU cannot be used
gpu_step() {
    if [ -n "$UNUSABLE" ]; then cannot "$1" "NOT RUN ($UNUSABLE)"; RC=126; return 1; fi
    run_step "$@"
}

# ---- the GPU tests: gpu_tests NAME LIMIT -k EXPRESSION ------------------------------------------
tests=()
for f in tests/cuda/test_cuda_gpu.py tests/cuda/test_cuda_gpu_model.py; do
    if [ -f "$f" ]; then tests+=("$f"); else say "gpu-tests: $f does not exist: not run"; fi
done
timeout_flag=()
python3 -c "import pytest_timeout" >/dev/null 2>&1 && timeout_flag=(--timeout "$TEST_TIMEOUT")
gpu_tests() {
    local name="$1" limit="$2"; shift 2
    if [ ${#tests[@]} = 0 ]; then
        cannot "$name" "FAIL (no GPU test file found)"
    elif gpu_step "$name" "$limit" python3 -m pytest -q -p no:cacheprovider -rs --durations=15 \
            "${timeout_flag[@]}" "$@" "${tests[@]}"; then
        if [ "$RC" = 0 ] && ! tail -n 3 "$LOG" | grep -q " passed"; then
            STATUS="FAIL (no test ran: every test skipped, reasons above)"
        elif [ "$RC" = 5 ]; then
            STATUS="FAIL (pytest collected no test: $*)"
        fi
        record "$NAME" "$STATUS" "$SECS"
    fi
}

# bench STEP LIMIT SECTIONS: bench/cuda_ops.py's sections into bench.txt and bench.json
bench() {
    gpu_step "$1" "$2" python3 bench/cuda_ops.py --sections "$3" --out "$OUT/bench.txt" \
        --json "$OUT/bench.json" "${BENCH_ARGS[@]}" && record "$NAME" "$STATUS" "$SECS"
}

# ---- the tensor cores: their tests, then their figures; then the model's step ----------------------
gpu_tests gpu-tests-tc 45 -k "$TC_TESTS"
bench bench-tc 60 tensor-cores
bench bench-step 60 step

# ---- the other GPU tests, keeping the sanitizers' minimum -----------------------------------------
KEEP=80
gpu_tests gpu-tests 80 -k "not ($TC_TESTS)"

# ---- compute-sanitizer over a small run, on pytfm's kernels ----------------------------------
for tool in memcheck racecheck synccheck; do
    # limit, and what each keeps for the sanitizers after it (their minimum)
    case "$tool" in memcheck) limit=40 KEEP=50 ;; racecheck) limit=50 KEEP=20 ;; *) limit=30 KEEP=0 ;; esac
    if [ -z "$SANITIZER" ]; then
        KEEP=0
        if [ -n "$UNUSABLE" ]; then cannot "sanitizer-$tool" "NOT RUN ($UNUSABLE)"
        else cannot "sanitizer-$tool" "FAIL (compute-sanitizer not found on PATH, in \$CUDA_HOME/bin or beside nvcc)"; fi
        continue
    fi
    gpu_step "sanitizer-$tool" "$limit" env PYTFM_SMALL_RUN_NO_POOL=1 "$SANITIZER" --tool "$tool" \
        --error-exitcode 99 "${SANITIZER_OPTS[@]}" python3 scripts/cuda_small_run.py || continue
    # the sanitizer's own lines start with "========="; a refusal of the device or runtime is
    # not a finding about pytfm: say so and go on
    refusal="$(grep -m 1 -E '^========= .*(not supported|Not supported|Internal Sanitizer Error|injection library|Unsupported)' "$LOG")"
    if [ "$RC" != 0 ] && [ "$RC" != 124 ] && [ -n "$refusal" ]; then
        STATUS="REFUSED (${refusal#========= })"
    elif [ "$RC" = 99 ] || grep -qE '^========= ERROR SUMMARY: [1-9]' "$LOG"; then
        STATUS="FAIL ($(grep -m 1 -oE 'ERROR SUMMARY: [0-9]+ errors?' "$LOG" || echo "errors found"))"
    elif [ "$RC" = 124 ] && grep -qE '^========= (Invalid|Race|Barrier|Error)' "$LOG"; then
        STATUS="FAIL (errors found before it was cut at its limit: see the report)"
    elif [ "$RC" = 124 ]; then
        STATUS="$STATUS: no error in what ran"
    fi
    record "$NAME" "$STATUS" "$SECS"
done
KEEP=0

# ---- the rest of the figures, until the deadline ---------------------------------------------------
bench bench-rest 120 rest

# ---- the summary ---------------------------------------------------------------------------------
write_summary ""
say ""
if [ -s "$OUT/bench.txt" ]; then
    say "==== bench table ($OUT/bench.txt)"
    cat "$OUT/bench.txt"
    note "(the bench table is above, in the bench steps' output)"
fi
say ""
cat "$OUT/summary.txt"
cat "$OUT/summary.txt" >>"$report"
[ "$FAILED" = 0 ]
