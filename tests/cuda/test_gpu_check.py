"""scripts/gpu_check.sh rehearsed without a GPU: the real script runs in a copy of its folder
layout, with stub commands first on PATH (python3, nvidia-smi, compute-sanitizer, nvcc) whose
behaviour each test picks through STUB_* variables, and the system's other commands beside
them (cmake only when a test puts it there). Every failure path the H200 call can meet is
forced once, and the report, the summary table and the exit status are checked: the steps run
in their order (the figures before the checks), a failing step is reported and the next one
still runs, the steps that need the GPU say why they did not run once pytfm does not import or
no GPU can be used, a hanging one is killed at its limit, the overall deadline turns the
remaining steps into SKIPPED rows, a sanitizer that refuses the device is REFUSED (not a
failure), a spilling kernel fails the register report, and missing wheels say what to do.
"""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import types

import pytest

from helpers import ROOT, subprocess_env

SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and GNU timeout")

# python3 as the script calls it: the preflight's probes, the wheels' install and import,
# setup.py, pytest, the small run, the benchmark, and the -c probes (cffi, pytfm, cupy)
PYTHON3 = r"""#!/bin/bash
echo "python3 $*" >>"$STUB_LOG"
on_path() {  # a module the wheels installed into a folder on PYTHONPATH
    local IFS=:
    for d in $PYTHONPATH; do [ -f "$d/$1_installed" ] && return 0; done
    return 1
}
has_cffi() { [ "${STUB_CFFI:-0}" = 1 ] || on_path cffi; }
hang() { echo $$ >>"$STUB_PIDS"; exec sleep 60; }
case "$1" in
--version) echo "Python 3.12.3 (stub)"; exit 0 ;;
-c)
    case "$2" in
    "import cffi, pycparser") has_cffi ;;
    "from cmake import CMAKE_BIN_DIR") on_path cmake ;;
    *sysconfig*) echo "$STUB_INCLUDE" ;;
    *"import setuptools"*) echo "80.9.0 (stub)" ;;
    *"import cffi; print"*)
        has_cffi && echo "2.0.0 (stub)" || { echo "No module named 'cffi'"; exit 1; } ;;
    *pytest_timeout*) [ "${STUB_PYTEST_TIMEOUT:-1}" = 1 ] && echo yes || exit 1 ;;
    "import pytfm"*)
        [ "${STUB_IMPORT:-ok}" = undefined ] && {
            echo "ImportError: pytfm/_pytfm_cffi.abi3.so: undefined symbol: pytfm_x_cuda"; exit 1; }
        [ -f pytfm/lib/cuda_build.log ] && { echo "pytfm (stub) {'cuda': 1}"; exit 0; }
        echo "ImportError: pytfm's compiled module is missing"; exit 1 ;;
    "import cupy"*)
        [ "${STUB_GPU:-1}" = 1 ] && { echo "1 device(s); 0: NVIDIA H200 (stub)"; exit 0; }
        echo "AssertionError: CuPy sees no CUDA device"; exit 1 ;;
    *) echo "stub python3: unexpected -c $2"; exit 3 ;;
    esac ;;
-m)
    case "$2" in
    pip)
        shift 2
        wheels=()
        while [ $# -gt 0 ]; do
            case "$1" in --target) target="$2"; shift ;; *.whl) wheels+=("$1") ;; esac
            shift
        done
        [ "${STUB_PIP:-ok}" = ok ] || { echo "ERROR: no matching distribution"; exit 1; }
        mkdir -p "$target"
        for w in "${wheels[@]}"; do
            name="$(basename "$w")"; name="${name%%-*}"
            touch "$target/${name}_installed"
            [ "$name" = cmake ] && mkdir -p "$target/cmake/data/bin"
        done
        echo "Successfully installed ${wheels[*]##*/}"; exit 0 ;;
    pytest)
        echo "pytest args: ${*:3}"
        tests="${STUB_TESTS:-ok}"  # STUB_TESTS_ONLY: only the run whose arguments hold it
        [ -n "${STUB_TESTS_ONLY:-}" ] && [[ "$*" != *"$STUB_TESTS_ONLY"* ]] && tests=ok
        case "$tests" in
        ok) echo "12 passed in 3.1s" ;;
        skip) echo "SKIPPED [12] tests/cuda/test_cuda_gpu.py: no CUDA GPU here"
              echo "12 skipped in 0.2s" ;;
        fail) echo "FAILED tests/cuda/test_cuda_gpu.py::test_linear"; echo "1 failed, 11 passed"
              exit 1 ;;
        hang) echo "collecting ..."; hang ;;
        esac ;;
    esac ;;
setup.py)
    has_cffi || { echo "ModuleNotFoundError: No module named 'cffi'"; exit 1; }
    case "${STUB_BUILD:-ok}" in
    fail) echo "cuda/attention.cu(12): error: identifier x is undefined"; exit 1 ;;
    hang) hang ;;
    esac
    mkdir -p pytfm/lib
    spill=0; [ "${STUB_SPILL:-0}" = 1 ] && spill=8
    cat >pytfm/lib/cuda_build.log <<LOG
# nvcc (stub)

## cuda/attention.cu
ptxas info    : Compiling entry function '_Z8attn_fwdILi64EEvPfPKfi' for 'sm_90'
ptxas info    : Function properties for _Z8attn_fwdILi64EEvPfPKfi
    16 bytes stack frame, $spill bytes spill stores, $spill bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 33280 bytes smem, 432 bytes cmem[0]

## cuda/gelu.cu
ptxas info    : Compiling entry function '_Z19gelu_forward_kernelPfPKfl' for 'sm_90'
ptxas info    : Function properties for _Z19gelu_forward_kernelPfPKfl
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 28 registers, used 0 barriers, 376 bytes cmem[0]
LOG
    echo "built (PYTFM_CUDA=$PYTFM_CUDA PYTFM_WERROR=${PYTFM_WERROR:-unset}" \
         "PYTFM_CUDA_ARCH=$PYTFM_CUDA_ARCH jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-unset})" ;;
scripts/cuda_small_run.py)
    echo "cuda_small_run: every kernel ran (pool off: ${PYTFM_SMALL_RUN_NO_POOL:-no})" ;;
bench/cuda_ops.py)
    shift
    while [ $# -gt 0 ]; do
        case "$1" in --sections) sections="$2" ;; --out) out="$2" ;; --json) json="$2" ;; esac
        shift
    done
    echo "budget ${GPU_CHECK_STEP_SECONDS:-none} s, sections $sections"
    [ "${STUB_BENCH:-ok}" = hang ] && hang
    printf -- '-- %s\nsoftmax_forward  1.0 us  3000 GB/s\n' "$sections" | tee -a "$out"
    echo "{\"rows\": [{\"name\": \"softmax_forward\", \"section\": \"$sections\"}]}" >"$json" ;;
*) echo "stub python3: unexpected $*"; exit 3 ;;
esac
"""

SANITIZER = r"""#!/bin/bash
echo "compute-sanitizer $*" >>"$STUB_LOG"
case "$1" in
--version) echo "Compute Sanitizer 2025.3.1 (stub)"; echo "Version 2025.3.1"; exit 0 ;;
--help)
    echo "  --tool arg  --error-exitcode arg"
    [ "${STUB_SANITIZER_FILTERS:-1}" = 1 ] && echo "  --kernel-name-exclude arg  --print-limit arg"
    exit 0 ;;
esac
echo "========= COMPUTE-SANITIZER"
case "${STUB_SANITIZER:-ok}" in
refuse) echo "========= Error: Device not supported. Please refer to the documentation"
        echo "cudaErrorUnknown (999) at the first allocation"; exit 1 ;;
errors) echo "========= Invalid __global__ write of size 4 bytes"
        echo "========= ERROR SUMMARY: 1 error"; exit 99 ;;
esac
while [ "$1" != python3 ]; do shift; done
"$@"; rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
"""

NVIDIA_SMI = """#!/bin/bash
echo "nvidia-smi $*" >>"$STUB_LOG"
echo "NVIDIA H200 (stub), 580.159.04, 1980 MHz, 1980 MHz, 3201 MHz, 3201 MHz, 120 W, 31, 0 MiB, \
143771 MiB"
"""

NVCC = """#!/bin/bash
echo "Cuda compilation tools, release 13.0 (stub)"
"""

PYTEST_FILES = ("tests/cuda/test_cuda_gpu.py", "tests/cuda/test_cuda_gpu_model.py")
STUBBED = ("python3", "nvidia-smi", "compute-sanitizer", "nvcc", "cmake")


def system_bin(tmp_path, cmake):
    """The system's commands, but those the stubs stand for (and cmake, unless asked for: then
    a stub of it)."""
    sysbin = tmp_path / "sysbin"
    sysbin.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name not in STUBBED and not os.path.lexists(sysbin / name):
                (sysbin / name).symlink_to(os.path.join(folder, name))
    if cmake:
        path = sysbin / "cmake"
        path.write_text("#!/bin/bash\necho 'cmake version 4.4.3 (stub)'\n")
        path.chmod(0o755)
    return sysbin


def make_tree(tmp_path, *, wheels=True, model_tests=True, smi=True, cmake=False, cudart=True,
              python_h=True):
    """A copy of the script in the folder layout it expects, a toolkit folder whose bin/ holds
    the stubs, a sysbin/ of the system's other commands and an include folder (Python.h);
    -> (the copy's root, PATH, the include folder)."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / "gpu_check.sh")
    for name in ("setup.py", "scripts/cuda_small_run.py", "bench/cuda_ops.py",
                 *PYTEST_FILES[:1 + model_tests]):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("# stand-in: the stub python3 answers for it\n")
    if wheels:
        (root / "gpu_wheels").mkdir()
        for w in ("cffi-2.0.0-cp312-cp312-manylinux2014_x86_64.whl",
                  "pycparser-3.0-py3-none-any.whl",
                  "cmake-4.4.3-py3-none-manylinux2014_x86_64.whl"):
            (root / "gpu_wheels" / w).write_bytes(b"")
    cuda = tmp_path / "cuda"  # nvcc's toolkit: the $CUDA_HOME the script derives from it
    bin_dir = cuda / "bin"
    bin_dir.mkdir(parents=True)
    if cudart:
        (cuda / "lib64").mkdir()
        (cuda / "lib64" / "libcudart_static.a").write_bytes(b"")
    include = tmp_path / "include"
    include.mkdir()
    if python_h:
        (include / "Python.h").write_text("/* stub */\n")
    stubs = {"python3": PYTHON3, "compute-sanitizer": SANITIZER, "nvcc": NVCC}
    if smi:
        stubs["nvidia-smi"] = NVIDIA_SMI
    for name, text in stubs.items():
        path = bin_dir / name
        path.write_text(textwrap.dedent(text))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return root, f"{bin_dir}:{system_bin(tmp_path, cmake)}", include


def run_check(tmp_path, out=True, expect_seconds=15, **stub):
    """Run the copied script with the stubs; -> .rc (exit status), .stdout (with stderr),
    .report (gpu_check.txt), .out (the OUT folder), .rows ({step: status} of summary.txt),
    .calls (the stubs' log of their calls)."""
    tree = {k: stub.pop(k) for k in ("wheels", "model_tests", "smi", "cmake", "cudart",
                                      "python_h") if k in stub}
    root, path, include = make_tree(tmp_path, **tree)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_CHECK_", "PYTFM_", "CUDA_", "STUB_", "CMAKE_"))
           and k != "OUT"}
    out_dir = tmp_path / "out"
    env.update(PATH=path, STUB_LOG=str(tmp_path / "calls.log"), STUB_PIDS=str(tmp_path / "pids"),
               STUB_INCLUDE=str(include), PYTHONPATH="",
               GPU_CHECK_CUDA_FALLBACK=str(tmp_path / "no-cuda"))  # not this machine's toolkit
    if out:
        env["OUT"] = str(out_dir)
    else:
        out_dir = root / "gpu_check_out"
    env.update({k: str(v) for k, v in stub.items()})
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < expect_seconds, r.stdout
    calls = tmp_path / "calls.log"
    return types.SimpleNamespace(rc=r.returncode, stdout=r.stdout + r.stderr, out=out_dir,
                                 report=(out_dir / "gpu_check.txt").read_text(),
                                 rows=summary(out_dir),
                                 calls=calls.read_text() if calls.exists() else "")


def summary(out_dir):
    """{step: status} of summary.txt, the table printed last."""
    rows = {}
    for line in (out_dir / "summary.txt").read_text().splitlines()[2:-1]:
        m = re.match(r"(\S+)\s+(\d+\.\d)\s+(.*)$", line)
        assert m, line
        rows[m.group(1)] = m.group(3)
    return rows


ALL_STEPS = ["preflight", "wheels", "build", "registers", "import", "gpu", "gpu-tests-tc",
             "bench-tc", "bench-step", "gpu-tests", "sanitizer-memcheck", "sanitizer-racecheck",
             "sanitizer-synccheck", "bench-rest"]
GPU_STEPS = ALL_STEPS[6:]
SUMMARY = "gpu_check: 14 steps, {} failed, skipped or not run, {} refused by the sanitizer"
TC = "tensor_core or bf16 or tf32"  # the tensor cores' GPU tests (pytest -k)


def test_everything_passes(tmp_path):
    r = run_check(tmp_path)
    assert list(r.rows) == ALL_STEPS
    assert all(s.startswith("ok") for s in r.rows.values()), r.rows
    assert r.rc == 0, r.stdout
    # the preflight, first: what the build and the checks need
    for line in ("Python.h: ", "setuptools: 80.9.0", "nvcc: ", "libcudart_static.a: ",
                 "compute-sanitizer options used: --kernel-name-exclude kns=cupy --print-limit",
                 "pytest-timeout: yes", "GPU: NVIDIA H200 (stub), 580.159.04, 1980 MHz"):
        assert line in r.report, line
    assert r.report.index("==== preflight") < r.report.index("==== wheels")
    # the wheels, cmake's too (none on PATH), went in with --no-index --target
    assert re.search(r"python3 -m pip install --no-index --no-deps .*--target \S+/site "
                     r"\S+/cffi-2\.0\.0\S+\.whl \S+/pycparser-3\.0\S+\.whl "
                     r"\S+/cmake-4\.4\.3\S+\.whl", r.calls), r.calls
    # one build, every core, warnings not errors
    assert re.search(r"built \(PYTFM_CUDA=1 PYTFM_WERROR=unset PYTFM_CUDA_ARCH=90 jobs=\d+\)",
                     r.report)
    # the order: the tensor cores' tests and figures, the model's step, the other tests, the
    # sanitizers, the other figures
    positions = [r.report.index(f"==== {s}:") for s in GPU_STEPS]
    assert positions == sorted(positions)
    sections = re.findall(r"budget \d+ s, sections (\S+)", r.report)
    assert sections == ["tensor-cores", "step", "rest"]
    # both GPU test files, their durations, a per-test timeout: the tensor cores' first
    for k in (TC, f"not ({TC})"):
        assert "pytest args: -q -p no:cacheprovider -rs --durations=15 --timeout 60 -k " + \
            k + " " + " ".join(PYTEST_FILES) in r.report
    # the three sanitizers over the small run with the pool off, on pytfm's kernels only
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert f"compute-sanitizer --tool {tool} --error-exitcode 99 --kernel-name-exclude " \
               "kns=cupy --print-limit 20 python3 scripts/cuda_small_run.py" in r.calls
    assert r.report.count("every kernel ran (pool off: 1)") == 3
    # each bench step is given its step's seconds (60, 60, 120: less when the deadline is
    # nearer), and appends to one table
    budgets = [int(b) for b in re.findall(r"budget (\d+) s", r.report)]
    assert 50 <= budgets[0] <= 60 and 50 <= budgets[1] <= 60 and 60 <= budgets[2] <= 120
    assert (r.out / "bench.txt").read_text().count("softmax_forward") == 3
    assert json.loads((r.out / "bench.json").read_text())["rows"]
    # the register report: one row per kernel, demangled when c++filt exists, spills shown
    regs = (r.out / "registers.txt").read_text()
    assert re.search(r"^\s+255\s+33280\s+16\s+0/0\s+attention\.cu\s+"
                     r"void attn_fwd<64>\(float\*, float const\*, int\) \[sm_90\]$",
                     regs, re.M), regs
    assert regs.index("attention.cu") < regs.index("gelu.cu")  # by file
    assert re.search(r"^\s+28\s+0\s+0\s+0/0\s+gelu\.cu\s+gelu_forward_kernel\(float\*", regs,
                     re.M)
    assert (r.out / "cuda_build.log").exists()
    # what the run tool brings back: at most 8 files, flat, plain names
    names = os.listdir(r.out)
    assert len(names) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names), names
    assert set(names) == {"gpu_check.txt", "summary.txt", "bench.txt", "bench.json",
                          "registers.txt", "cuda_build.log"}
    # the summary table is the last thing printed, and in the report too
    assert r.stdout.rstrip().splitlines()[-1] == SUMMARY.format(0, 0)
    assert (r.out / "summary.txt").read_text() in r.report
    assert re.match(r"gpu_check summary \(\d+\.\d s of 300 s\)",
                    (r.out / "summary.txt").read_text())


def test_a_failed_build_is_built_once_and_the_gpu_steps_say_why_they_did_not_run(tmp_path):
    r = run_check(tmp_path, STUB_BUILD="fail")
    assert list(r.rows) == ALL_STEPS  # no second build
    assert r.rows["build"] == "FAIL (exit 1): cuda/attention.cu(12): error: identifier x is " \
                              "undefined"
    assert r.report.count("\ncuda/attention.cu(12): error: identifier x is undefined") == 1
    assert r.rows["registers"] == "FAIL (exit 1): no pytfm/lib/cuda_build.log: the CUDA build " \
                                  "did not run (or wrote no report)"
    imported = "FAIL (exit 1): ImportError: pytfm's compiled module is missing"
    assert r.rows["import"] == imported
    assert r.rows["gpu"] == "ok"  # it needs CuPy only
    for s in GPU_STEPS:
        assert r.rows[s] == f"NOT RUN (pytfm does not import: {imported})", (s, r.rows)
    assert "bench/cuda_ops.py" not in r.calls and "-m pytest" not in r.calls
    assert "compute-sanitizer --tool" not in r.calls
    assert r.rc == 1


def test_no_gpu_each_gpu_step_says_so(tmp_path):
    r = run_check(tmp_path, smi=False, STUB_GPU=0)
    assert "GPU: nvidia-smi not found (no NVIDIA driver on this machine?)" in r.report
    assert r.rows["preflight"] == "ok" and r.rows["import"] == "ok"
    no_gpu = "FAIL (exit 1): AssertionError: CuPy sees no CUDA device"
    assert r.rows["gpu"] == no_gpu
    for s in GPU_STEPS:
        assert r.rows[s] == f"NOT RUN (no usable GPU: {no_gpu})", (s, r.rows)
    assert r.stdout.rstrip().splitlines()[-1] == SUMMARY.format(9, 0)
    assert r.rc == 1


def test_an_undefined_twin_is_named_and_nothing_runs_on_the_gpu(tmp_path):
    r = run_check(tmp_path, STUB_IMPORT="undefined")
    assert r.rows["import"] == "FAIL (exit 1): undefined symbol: pytfm_x_cuda"
    assert r.rows["bench-tc"] == "NOT RUN (pytfm does not import: FAIL (exit 1): undefined " \
                                 "symbol: pytfm_x_cuda)"
    assert r.rc == 1


def test_every_gpu_test_skipping_fails_the_step(tmp_path):
    r = run_check(tmp_path, STUB_TESTS="skip", STUB_PYTEST_TIMEOUT=0)
    assert r.rows["gpu-tests"] == "FAIL (no test ran: every test skipped, reasons above)"
    assert "no CUDA GPU here" in r.report
    # without pytest-timeout, no --timeout
    assert f"pytest args: -q -p no:cacheprovider -rs --durations=15 -k not ({TC}) tests/" \
        in r.report
    assert r.rows["gpu-tests-tc"] == "FAIL (no test ran: every test skipped, reasons above)"
    assert r.rc == 1


def test_hanging_step_is_killed_and_the_next_runs(tmp_path):
    r = run_check(tmp_path, STUB_TESTS="hang", STUB_TESTS_ONLY="not (",
                  GPU_CHECK_LIMIT_GPU_TESTS=2)
    assert r.rows["gpu-tests"] == "TIMEOUT (killed after 2 s)"
    assert "collecting ..." in r.report  # its output up to the kill is kept
    assert r.rows["sanitizer-memcheck"] == "ok" and r.rows["bench-rest"] == "ok"
    assert r.rows["gpu-tests-tc"] == "ok"
    for pid in (tmp_path / "pids").read_text().split():
        assert not os.path.exists(f"/proc/{pid}"), "the hanging process outlived its step"
    assert r.rc == 1


def test_deadline_skips_the_remaining_steps(tmp_path):
    r = run_check(tmp_path, expect_seconds=12, STUB_BUILD="hang", GPU_CHECK_BUDGET=4,
                  GPU_CHECK_MIN_STEP=1)
    assert r.rows["wheels"] == "ok"
    assert re.fullmatch(r"TIMEOUT \(killed after [34] s\)", r.rows["build"]), r.rows
    later = ALL_STEPS[3:]
    assert all(re.fullmatch(r"SKIPPED \(deadline: -?\d+ s left of 4 s\)", r.rows[s])
               for s in later), r.rows
    assert SUMMARY.format(12, 0) in r.stdout
    assert r.rc == 1


def test_a_slow_bench_leaves_the_checks_what_is_left(tmp_path):
    """A bench step that hangs is killed at its limit, and the tests and the sanitizers still
    run in what is left of the deadline."""
    r = run_check(tmp_path, expect_seconds=20, STUB_BENCH="hang", GPU_CHECK_LIMIT_BENCH_TC=3,
                  GPU_CHECK_LIMIT_BENCH_STEP=2, GPU_CHECK_LIMIT_BENCH_REST=2,
                  GPU_CHECK_BUDGET=30, GPU_CHECK_MIN_STEP=1)
    assert r.rows["bench-tc"] == "TIMEOUT (killed after 3 s)"
    assert r.rows["bench-step"] == r.rows["bench-rest"] == "TIMEOUT (killed after 2 s)"
    assert r.rows["gpu-tests"] == "ok" and r.rows["sanitizer-synccheck"] == "ok"


def test_the_gpu_tests_keep_the_sanitizers_time(tmp_path):
    """Hanging GPU tests are cut where the sanitizers' kept time begins: all three still run."""
    r = run_check(tmp_path, expect_seconds=25, STUB_TESTS="hang", STUB_TESTS_ONLY="not (",
                  GPU_CHECK_BUDGET=14, GPU_CHECK_KEEP_GPU_TESTS=9, GPU_CHECK_MIN_STEP=1)
    assert re.fullmatch(r"TIMEOUT \(killed after [1-4] s\)", r.rows["gpu-tests"]), r.rows
    assert re.search(r"==== gpu-tests: .*, 9 s kept for the steps after it\)", r.report)
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert r.rows[f"sanitizer-{tool}"] == "ok", r.rows


def test_steps_named_in_gpu_check_skip_are_skipped(tmp_path):
    r = run_check(tmp_path, GPU_CHECK_SKIP="gpu-tests-tc,bench-tc")
    assert r.rows["gpu-tests-tc"] == r.rows["bench-tc"] == "SKIPPED (GPU_CHECK_SKIP)"
    assert r.rows["bench-step"] == "ok" and "sections tensor-cores" not in r.report
    assert r.rc == 1


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_run_killed_from_outside_leaves_the_summary_of_what_ran(tmp_path, sig):
    """summary.txt is rewritten after every step: killed in bench-tc (SIGKILL: every process
    at once; SIGTERM: the script alone, as the run tool's limit would), the steps before it
    are there, and the last line says what was still to come or where it stopped."""
    root, path, include = make_tree(tmp_path)
    out = tmp_path / "out"
    env = dict(os.environ, PATH=path, STUB_LOG=str(tmp_path / "calls.log"), OUT=str(out),
               STUB_PIDS=str(tmp_path / "pids"), STUB_INCLUDE=str(include), PYTHONPATH="",
               GPU_CHECK_CUDA_FALLBACK=str(tmp_path / "no-cuda"), STUB_BENCH="hang")
    proc = subprocess.Popen(["bash", str(root / "scripts" / "gpu_check.sh")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        t0 = time.monotonic()
        while "==== bench-tc: python3" not in (out / "gpu_check.txt").read_text() \
                if (out / "gpu_check.txt").exists() else True:
            assert time.monotonic() - t0 < 30 and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)  # (the stub is hanging in bench-tc now)
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in (tmp_path / "pids").read_text().split() if (tmp_path / "pids").exists() \
                else ():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    rows = summary(out)
    assert list(rows) == ALL_STEPS[:7] and all(v.startswith("ok") for v in rows.values()), rows
    last = (out / "summary.txt").read_text().splitlines()[-1]
    if sig == signal.SIGKILL:
        assert last.endswith("; running: the steps after gpu-tests-tc are still to come")
    else:
        assert last.endswith("; stopped by a signal during step bench-tc")
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # no temporary file left


def test_sanitizer_refusing_is_reported_and_not_a_failure(tmp_path):
    r = run_check(tmp_path, STUB_SANITIZER="refuse")
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert r.rows[f"sanitizer-{tool}"] == "REFUSED (Error: Device not supported. Please " \
                                            "refer to the documentation)"
    assert r.rows["bench-tc"] == "ok"
    assert SUMMARY.format(0, 3) in r.stdout
    assert r.rc == 0


def test_sanitizer_finding_errors_fails(tmp_path):
    r = run_check(tmp_path, STUB_SANITIZER="errors")
    assert r.rows["sanitizer-memcheck"] == "FAIL (ERROR SUMMARY: 1 error)"
    assert "Invalid __global__ write" in r.report
    assert r.rc == 1


def test_a_sanitizer_without_the_filters_runs_without_them(tmp_path):
    r = run_check(tmp_path, STUB_SANITIZER_FILTERS=0)
    assert "compute-sanitizer options used: (none of the filters)" in r.report
    assert "compute-sanitizer --tool memcheck --error-exitcode 99 python3 " \
           "scripts/cuda_small_run.py" in r.calls
    assert r.rows["sanitizer-memcheck"] == "ok"


def test_a_kernel_that_spills_fails_the_register_report(tmp_path):
    r = run_check(tmp_path, STUB_SPILL=1)
    assert r.rows["registers"] == "FAIL (1 kernel(s) spill registers)"
    assert re.search(r"^\s+255\s+33280\s+16\s+8/8\s+attention\.cu",
                     (r.out / "registers.txt").read_text(), re.M)
    assert r.rows["bench-tc"] == "ok" and r.rc == 1


def test_the_preflight_says_what_the_build_will_miss(tmp_path):
    r = run_check(tmp_path, python_h=False, cudart=False)
    assert r.rows["preflight"] == "MISSING (Python.h libcudart_static.a)"
    assert "Python.h: not found in " in r.report
    assert re.search(r"libcudart_static.a: not found under \S+/cuda \S+/no-cuda", r.report)
    assert r.rows["build"] == "ok" and r.rc == 1  # (the stub builds anyway)


def test_missing_wheels_say_how_to_get_them(tmp_path):
    r = run_check(tmp_path, wheels=False)
    assert r.rows["wheels"].startswith("FAIL (no cffi pycparser cmake wheel in ")
    assert "scripts/fetch_gpu_wheels.sh" in r.rows["wheels"] and "carry" in r.rows["wheels"]
    assert "No module named 'cffi'" in r.report  # the build then fails, and says why
    assert r.rows["build"] == "FAIL (exit 1): ModuleNotFoundError: No module named 'cffi'"
    assert r.rows["gpu"] == "ok" and r.rows["registers"].startswith("FAIL")
    assert r.rc == 1


def test_cffi_and_cmake_already_there_and_a_missing_test_file(tmp_path):
    r = run_check(tmp_path, out=False, model_tests=False, cmake=True, STUB_CFFI=1)
    assert r.rows["wheels"] == "ok (already installed)"
    assert "pip install" not in r.calls
    assert "cmake version 4.4.3 (stub)" in r.report
    assert "gpu-tests: tests/cuda/test_cuda_gpu_model.py does not exist: not run" in r.report
    assert f"--timeout 60 -k not ({TC}) tests/cuda/test_cuda_gpu.py\n" in r.report
    assert r.rows["gpu-tests"] == "ok" and r.rc == 0


def test_only_the_missing_wheels_are_installed(tmp_path):
    r = run_check(tmp_path, STUB_CFFI=1)  # cffi and pycparser there: cmake alone
    assert re.search(r"--target \S+/site \S+/cmake-4\.4\.3\S+\.whl\n", r.calls), r.calls
    assert r.rows["wheels"] == "ok"


def test_help_and_usage_error():
    r = subprocess.run(["bash", SCRIPT, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "carry=[\"gpu_wheels\"]" in r.stdout
    r = subprocess.run(["bash", SCRIPT, "--bogus"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2


# ---- bench/cuda_ops.py's pure-Python parts (the GPU part runs only on a GPU) -------------------


def test_bench_imports_without_cupy_or_torch():
    code = ("import sys, bench.cuda_ops; "
            "assert not {'cupy', 'torch'} & set(sys.modules), sorted(sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=subprocess_env(ROOT))
    assert r.returncode == 0, r.stderr


@pytest.fixture
def cuda_ops(monkeypatch):
    """bench/cuda_ops.py as a module (bench/ is in the checkout, not in the installed package)"""
    monkeypatch.syspath_prepend(ROOT)
    import bench.cuda_ops

    return bench.cuda_ops


@pytest.mark.parametrize("l2", [40_000_000, 50 * 2**20, 60_000_000, 60 * 2**20, 96_000_000])
def test_bench_bandwidth_inputs_are_at_least_four_times_the_l2(l2, cuda_ops):
    bandwidth_shapes, input_bytes = cuda_ops.bandwidth_shapes, cuda_ops.input_bytes
    shapes = bandwidth_shapes(l2)
    for row, sizes in input_bytes(shapes).items():
        for nbytes in sizes:
            # at least 4x (the rule), and not far past it (the run must fit the lease)
            assert 4 * l2 <= nbytes <= 5 * l2, (row, nbytes / l2)
    (copy,) = shapes["copy"]
    assert 4 * copy >= 64 * l2


def test_bench_row_shows_the_ratio_and_whether_the_target_is_met(cuda_ops):
    HEAD, format_row = cuda_ops.HEAD, cuda_ops.format_row  # noqa: N806 - the module's names

    met = format_row("softmax_forward 78848x768", 1e-4, 3500.0, "GB/s", "copy same B", 4000.0,
                     ("memory-bound forward", 0.75), "484 MB moved")
    assert re.search(r" 100\.0 +3500\.0 GB/s +copy same B +4000\.0 +0\.88x +>=0\.75x yes  "
                     r"memory-bound forward; 484 MB moved$", met), met
    below = format_row("attention fwd+bwd T=4096", 2e-3, 10.0, "TFLOP/s", "SDPA fp32", 20.0,
                       cuda_ops.ATTENTION_FWDBWD_TARGET)
    assert re.search(r" 0\.50x +>=0\.80x NO   attention fwd\+bwd$", below), below
    plain = format_row("device-to-device copy", 1e-3, 4300.0, "GB/s")
    assert re.search(r"GB/s +- +- +- -$", plain), plain
    # the columns line up with the header
    assert len(met.split("  memory")[0]) == len(HEAD.split("  note")[0])
    assert cuda_ops.bandwidth_target("layernorm", "backward") == ("memory-bound backward", 0.6)
    assert cuda_ops.TRAIN_TINY_TARGET[1] == 5.0  # x the 2-core CPU step


def test_bench_json_holds_every_row_with_its_ratio_and_the_machine(cuda_ops, tmp_path):
    table = cuda_ops.Table(str(tmp_path / "bench.txt"), str(tmp_path / "bench.json"))
    table.info = {"clocks_before": {"gpus": cuda_ops.parse_smi(
        "NVIDIA H200, 580.159.04, 1980 MHz, 1980 MHz, 3201 MHz, 3201 MHz, 300.12 W, 41, "
        "1 MiB, 143771 MiB\n")}}
    table.section = "ceilings"
    table.row("copy", 1e-3, 4300.0, "GB/s")
    table.section = "training"
    table.row("train_tiny step, GPU, TrainStep", 1e-3, 1.0e6, "tok/s", "CPU 2 thr", 1.6e4,
              cuda_ops.TRAIN_TINY_TARGET, "graph")
    table.write_json()
    saved = json.loads((tmp_path / "bench.json").read_text())
    gpu = saved["clocks_before"]["gpus"][0]
    assert gpu["name"] == "NVIDIA H200" and gpu["clocks.sm"] == "1980 MHz"
    assert gpu["memory.total"] == "143771 MiB"
    copy, step = saved["rows"]
    assert copy == dict(name="copy", seconds=1e-3, rate=4300.0, unit="GB/s", vs="", vs_rate=None,
                        ratio=None, target=None, met=None, note="", section="ceilings")
    assert step["ratio"] == pytest.approx(62.5) and step["met"] is True
    assert step["target"] == {"what": "GPU step", "ratio": 5.0} and step["section"] == "training"
    assert (tmp_path / "bench.txt").read_text().count("\n") == 2


def test_bench_arithmetic(cuda_ops):
    # causal: half of 4·B·H·T²·D
    assert cuda_ops.attention_flops(4, 8, 4096, 64) == 2 * 4 * 8 * 4096**2 * 64
    assert cuda_ops.attention_flops(1, 1, 10, 2, causal=False) == 4 * 100 * 2
    assert cuda_ops.tokens_per_s(10, 8, 128, 0.5) == 20480.0


def test_bench_tensor_core_rows(cuda_ops):
    """the three products as the linear layer takes them (x·Wᵀ: trans_b; dy·W; dyᵀ·x: trans_a),
    each precision's pytfm_precision, and the targets at 4096 only"""
    cases = cuda_ops.product_cases(64)
    assert [(t[4], t[5], t[6]) for t in cases] == [(0, 1, ("x", "w")), (0, 0, ("dy", "w")),
                                                  (1, 0, ("dy", "x"))]
    assert all(t[1:4] == (64, 64, 64) for t in cases)
    assert dict(cuda_ops.TENSOR_CORE_PRECISIONS) == {"tf32": 2, "bf16": 1}
    assert cuda_ops.tensor_core_target("tf32", 4096) == ("SGEMM TF32", 0.7)
    assert cuda_ops.tensor_core_target("bf16", 4096) == ("SGEMM BF16", 0.6)
    assert cuda_ops.tensor_core_target("tf32", 1024) is None
    line = cuda_ops.format_row("sgemm_ex tf32 x.W^T (forward) n=4096", 1e-3, 280.0, "TFLOP/s",
                               "cuBLAS tf32", 400.0, cuda_ops.tensor_core_target("tf32", 4096))
    assert " 0.70x" in line and ">=0.70x" in line and " yes " in line


@pytest.mark.parametrize("names,backend", [
    (["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>"], "flash"),
    (["fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)"],
     "efficient"),
    (["cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3"], "cudnn"),
    (["ampere_sgemm_128x64_tn", "at::native::(anonymous)::cunn_SoftMaxForward"], "math"),
])
def test_bench_tells_the_sdpa_backend_from_its_kernels(cuda_ops, names, backend):
    assert cuda_ops.sdpa_backend(names) == backend


def test_bench_host_only_counts_a_steps_host_work_without_a_gpu():
    """--host-only: no GPU, CuPy or torch needed; the loop allocates and looks up the device
    and the stream per op, TrainStep's replay allocates nothing and looks up one thing per
    call: the caller's stream, which it orders itself after (pytfm/train_step.py)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "cuda_ops.py"), "--host-only"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=subprocess_env(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^(loop|TrainStep replay) +(\d+) +(\d+) +(\d+) +(\d+) +([\d.]+)$", r.stdout, re.M)}
    assert set(rows) == {"loop", "TrainStep replay"}, r.stdout
    assert int(rows["loop"][2]) > 0 and int(rows["loop"][3]) == 2 * int(rows["loop"][0])
    assert rows["TrainStep replay"][2:4] == ("0", "1")  # no array made, one stream looked up


def test_bench_tensor_core_attention_rows(cuda_ops):
    """the issue's shape (B=4, H=8, D=64, causal, T = 1024 .. 8192) and targets: TF32 against
    torch's float32 SDPA, BF16 against its flash SDPA in bf16"""
    assert cuda_ops.ATTENTION_SHAPE == (4, 8, 64)
    assert cuda_ops.ATTENTION_TC_T == (1024, 2048, 4096, 8192)
    assert cuda_ops.ATTENTION_TC_TARGETS == {"tf32": ("attention TF32 fwd+bwd", 1.0),
                                             "bf16": ("attention BF16 fwd+bwd", 0.5)}
