"""scripts/gpu_check.sh rehearsed without a GPU: the real script runs in a copy of its folder
layout, with stub commands first on PATH (python3, nvidia-smi, compute-sanitizer, nvcc) whose
behaviour each test picks through STUB_* variables. Every failure path the H200 call can meet
is forced once, and the report, the summary table and the exit status are checked: a failing
step is reported and the next one still runs, a hanging one is killed at its limit, the
overall deadline turns the remaining steps into SKIPPED rows, a sanitizer that refuses the
device is REFUSED (not a failure), and missing wheels say what to do.
"""

import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import types

import pytest

from helpers import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and GNU timeout")

# python3 as the script calls it: the wheels' install and import, setup.py, pytest, the small
# run, the benchmark, and the -c probes (cffi, pytfm, cupy)
PYTHON3 = r"""#!/bin/bash
echo "python3 $*" >>"$STUB_LOG"
has_cffi() {
    [ "${STUB_CFFI:-0}" = 1 ] && return 0
    local IFS=:
    for d in $PYTHONPATH; do [ -f "$d/cffi_installed" ] && return 0; done
    return 1
}
hang() { echo $$ >>"$STUB_PIDS"; exec sleep 60; }
case "$1" in
--version) echo "Python 3.12.3 (stub)"; exit 0 ;;
-c)
    case "$2" in
    "import cffi, pycparser") has_cffi ;;
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
        while [ $# -gt 0 ]; do [ "$1" = --target ] && target="$2"; shift; done
        [ "${STUB_PIP:-ok}" = ok ] || { echo "ERROR: no matching distribution"; exit 1; }
        mkdir -p "$target" && touch "$target/cffi_installed"
        echo "Successfully installed cffi pycparser"; exit 0 ;;
    pytest)
        echo "pytest args: ${*:3}"
        case "${STUB_TESTS:-ok}" in
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
    werror) [ "${PYTFM_WERROR:-}" = 1 ] && {
                echo "cuda/attention.cu(40): error #177-D: variable y was declared but never"\
                     "referenced (warnings treated as errors)"; exit 1; } ;;
    hang) hang ;;
    esac
    mkdir -p pytfm/lib
    cat >pytfm/lib/cuda_build.log <<'EOF'
# nvcc (stub)

## cuda/attention.cu
ptxas info    : Compiling entry function '_Z8attn_fwdILi64EEvPfPKfi' for 'sm_90'
ptxas info    : Function properties for _Z8attn_fwdILi64EEvPfPKfi
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 33280 bytes smem, 432 bytes cmem[0]

## cuda/gelu.cu
ptxas info    : Compiling entry function '_Z19gelu_forward_kernelPfPKfl' for 'sm_90'
ptxas info    : Function properties for _Z19gelu_forward_kernelPfPKfl
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 28 registers, used 0 barriers, 376 bytes cmem[0]
EOF
    echo "built (PYTFM_CUDA=$PYTFM_CUDA PYTFM_WERROR=${PYTFM_WERROR:-unset}" \
         "PYTFM_CUDA_ARCH=$PYTFM_CUDA_ARCH)" ;;
scripts/cuda_small_run.py)
    echo "cuda_small_run: every kernel ran (pool off: ${PYTFM_SMALL_RUN_NO_POOL:-no})" ;;
bench/cuda_ops.py)
    [ "${STUB_BENCH:-ok}" = hang ] && hang
    echo "budget ${GPU_CHECK_STEP_SECONDS:-none} s"
    printf 'kernel  time  rate\nsoftmax_forward  1.0 us  3000 GB/s\n' | tee "$3" ;;
*) echo "stub python3: unexpected $*"; exit 3 ;;
esac
"""

SANITIZER = r"""#!/bin/bash
echo "compute-sanitizer $*" >>"$STUB_LOG"
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
echo "NVIDIA H200 (stub), 143771 MiB, driver 580.159.04"
"""

NVCC = """#!/bin/bash
echo "Cuda compilation tools, release 13.0 (stub)"
"""

PYTEST_FILES = ("tests/cuda/test_cuda_gpu.py", "tests/cuda/test_cuda_gpu_model.py")


def make_tree(tmp_path, *, wheels=True, model_tests=True, smi=True):
    """A copy of the script in the folder layout it expects, and a bin/ of stubs."""
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
                  "pycparser-3.0-py3-none-any.whl"):
            (root / "gpu_wheels" / w).write_bytes(b"")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {"python3": PYTHON3, "compute-sanitizer": SANITIZER, "nvcc": NVCC}
    if smi:
        stubs["nvidia-smi"] = NVIDIA_SMI
    for name, text in stubs.items():
        path = bin_dir / name
        path.write_text(textwrap.dedent(text))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return root, bin_dir


def run_check(tmp_path, out=True, expect_seconds=15, **stub):
    """Run the copied script with the stubs; -> .rc (exit status), .stdout (with stderr),
    .report (gpu_check.txt), .out (the OUT folder), .rows ({step: status} of summary.txt)."""
    root, bin_dir = make_tree(tmp_path, **{k: stub.pop(k) for k in ("wheels", "model_tests", "smi")
                                           if k in stub})
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_CHECK_", "PYTFM_", "CUDA_", "STUB_")) and k != "OUT"}
    out_dir = tmp_path / "out"
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", STUB_LOG=str(tmp_path / "calls.log"),
               STUB_PIDS=str(tmp_path / "pids"), PYTHONPATH="")
    if out:
        env["OUT"] = str(out_dir)
    else:
        out_dir = root / "gpu_check_out"
    env.update({k: str(v) for k, v in stub.items()})
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < expect_seconds, r.stdout
    return types.SimpleNamespace(rc=r.returncode, stdout=r.stdout + r.stderr, out=out_dir,
                                 report=(out_dir / "gpu_check.txt").read_text(),
                                 rows=summary(out_dir))


def summary(out_dir):
    """{step: status} of summary.txt, the table printed last."""
    rows = {}
    for line in (out_dir / "summary.txt").read_text().splitlines()[2:-1]:
        m = re.match(r"(\S+)\s+(\d+\.\d)\s+(.*)$", line)
        assert m, line
        rows[m.group(1)] = m.group(3)
    return rows


ALL_STEPS = ["wheels", "build-werror", "import", "nvidia-smi", "gpu", "gpu-tests",
             "sanitizer-memcheck", "sanitizer-racecheck", "sanitizer-synccheck", "bench",
             "registers"]


def test_everything_passes(tmp_path):
    r = run_check(tmp_path)
    assert list(r.rows) == ALL_STEPS
    assert all(s.startswith("ok") for s in r.rows.values()), r.rows
    assert r.rc == 0, r.stdout
    calls = (tmp_path / "calls.log").read_text()
    # the wheels went in with --no-index --target, and the build found cffi through PYTHONPATH
    assert re.search(r"python3 -m pip install --no-index --no-deps .*--target \S+/site "
                     r"\S+/gpu_wheels/cffi-2\.0\.0\S+\.whl \S+/pycparser-3\.0\S+\.whl", calls)
    assert "built (PYTFM_CUDA=1 PYTFM_WERROR=1 PYTFM_CUDA_ARCH=90)" in r.report
    assert "build-plain" not in r.rows
    # both GPU test files, the three sanitizers over the small run with the pool off
    assert "pytest args: -q -p no:cacheprovider -rs " + " ".join(PYTEST_FILES) in r.report
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert f"compute-sanitizer --tool {tool} --error-exitcode 99 python3 " \
               "scripts/cuda_small_run.py" in calls
    assert r.report.count("every kernel ran (pool off: 1)") == 3
    # the bench is given its step's seconds (240, or less when the deadline is nearer)
    assert re.search(r"budget (\d+) s", r.report) and int(re.search(r"budget (\d+) s",
                                                                  r.report).group(1)) <= 240
    assert "softmax_forward" in (r.out / "bench.txt").read_text()
    # the register report: one row per kernel, demangled when c++filt exists, spills shown
    regs = (r.out / "registers.txt").read_text()
    assert re.search(r"^\s+255\s+33280\s+16\s+8/12\s+attention\.cu\s+"
                     r"void attn_fwd<64>\(float\*, float const\*, int\) \[sm_90\]$",
                     regs, re.M), regs
    assert regs.index("attention.cu") < regs.index("gelu.cu")  # by file
    assert re.search(r"^\s+28\s+0\s+0\s+0/0\s+gelu\.cu\s+gelu_forward_kernel\(float\*", regs, re.M)
    assert (r.out / "cuda_build.log").exists()
    # what the run tool brings back: at most 8 files, flat, plain names
    names = os.listdir(r.out)
    assert len(names) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names), names
    assert set(names) == {"gpu_check.txt", "summary.txt", "bench.txt", "registers.txt",
                          "cuda_build.log"}
    # the summary table is the last thing printed, and in the r.report too
    assert r.stdout.rstrip().splitlines()[-1].startswith("gpu_check: 11 steps, 0 failed")
    assert (r.out / "summary.txt").read_text() in r.report


def test_werror_build_fails_then_plain_build_passes(tmp_path):
    r = run_check(tmp_path, STUB_BUILD="werror")
    error = ("cuda/attention.cu(40): error #177-D: variable y was declared but never "
             "referenced (warnings treated as errors)")
    # the status holds the output's last line, cut at 100 characters
    assert r.rows["build-werror"] == f"FAIL (exit 1): {error[:100]}: retried without PYTFM_WERROR"
    assert r.rows["build-plain"] == "ok"
    assert "warnings treated as errors" in r.report
    assert "the warnings-as-errors build failed: building once more without " \
           "PYTFM_WERROR" in r.report
    assert "built (PYTFM_CUDA=1 PYTFM_WERROR=unset PYTFM_CUDA_ARCH=90)" in r.report
    assert all(r.rows[s] == "ok" for s in ALL_STEPS if s != "build-werror"), r.rows
    assert r.rc == 1  # the warning is still a failure of the check


def test_build_fails_both_ways_and_every_later_step_still_reports(tmp_path):
    r = run_check(tmp_path, STUB_BUILD="fail")
    assert list(r.rows) == ALL_STEPS[:2] + ["build-plain"] + ALL_STEPS[2:]
    undefined = "FAIL (exit 1): cuda/attention.cu(12): error: identifier x is undefined"
    assert r.rows["build-werror"] == undefined + ": retried without PYTFM_WERROR"
    assert r.rows["build-plain"] == undefined
    assert r.report.count("\ncuda/attention.cu(12): error: identifier x is undefined") == 2
    assert r.rows["import"] == "FAIL (exit 1): ImportError: pytfm's compiled module is missing"
    # the GPU steps still ran (the stubs answer as a GPU machine would)
    for s in ("nvidia-smi", "gpu", "gpu-tests", "sanitizer-memcheck", "bench"):
        assert r.rows[s] == "ok", (s, r.rows)
    assert r.rows["registers"] == "FAIL (exit 1): no pytfm/lib/cuda_build.log: the CUDA build " \
                                  "did not run (or wrote no report)"
    assert r.rc == 1


def test_no_gpu_each_gpu_step_says_so(tmp_path):
    r = run_check(tmp_path, smi=False, STUB_GPU=0, STUB_TESTS="skip", STUB_IMPORT="undefined")
    assert r.rows["import"] == "FAIL (exit 1): undefined symbol: pytfm_x_cuda"
    assert r.rows["nvidia-smi"].startswith("FAIL (nvidia-smi not found on PATH")
    assert r.rows["gpu"] == "FAIL (exit 1): AssertionError: CuPy sees no CUDA device"
    assert r.rows["gpu-tests"] == "FAIL (no test ran: every test skipped, reasons above)"
    assert "no CUDA GPU here" in r.report
    assert r.rows["bench"] == "ok" and r.rows["registers"] == "ok"  # they still ran
    assert r.rc == 1


def test_hanging_step_is_killed_and_the_next_runs(tmp_path):
    r = run_check(tmp_path, STUB_TESTS="hang",
                                        GPU_CHECK_LIMIT_GPU_TESTS=2)
    assert r.rows["gpu-tests"] == "TIMEOUT (killed after 2 s)"
    assert "collecting ..." in r.report  # its output up to the kill is kept
    assert r.rows["sanitizer-memcheck"] == "ok" and r.rows["registers"] == "ok"
    for pid in (tmp_path / "pids").read_text().split():
        assert not os.path.exists(f"/proc/{pid}"), "the hanging process outlived its step"
    assert r.rc == 1


def test_deadline_skips_the_remaining_steps(tmp_path):
    r = run_check(tmp_path, expect_seconds=12, STUB_BUILD="hang",
                                        GPU_CHECK_BUDGET=4, GPU_CHECK_MIN_STEP=1)
    assert r.rows["wheels"] == "ok"
    assert re.fullmatch(r"TIMEOUT \(killed after [34] s\)", r.rows["build-werror"]), r.rows
    assert "build-plain" not in r.rows  # a build that timed out is not tried again
    later = ALL_STEPS[2:]
    assert all(re.fullmatch(r"SKIPPED \(deadline: -?\d+ s left of 4 s(, \d+ s of it kept for "
                            r"the bench)?\)", r.rows[s]) for s in later), r.rows
    assert "gpu_check: 11 steps, 10 failed or skipped" in r.stdout
    assert r.rc == 1


def test_slow_steps_leave_the_bench_its_time(tmp_path):
    # as if a slow build had left 140 s: the tests may take what is above 135 s, the sanitizers
    # are skipped, the bench gets 120 s and the register report the last 15
    r = run_check(tmp_path, GPU_CHECK_BUDGET=140, GPU_CHECK_MIN_STEP=1, STUB_TESTS="hang")
    assert re.fullmatch(r"TIMEOUT \(killed after [345] s\)", r.rows["gpu-tests"]), r.rows
    assert re.fullmatch(r"SKIPPED \(deadline: 13[3-6] s left of 140 s, 135 s of it kept for "
                        r"the bench\)", r.rows["sanitizer-memcheck"]), r.rows
    assert r.rows["bench"] == "ok" and r.rows["registers"] == "ok"
    assert re.search(r"budget 1(1\d|20) s", r.report)  # what is left, less 15 s


def test_sanitizer_refusing_is_reported_and_not_a_failure(tmp_path):
    r = run_check(tmp_path, STUB_SANITIZER="refuse")
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert r.rows[f"sanitizer-{tool}"] == "REFUSED (Error: Device not supported. Please " \
                                            "refer to the documentation)"
    assert r.rows["bench"] == "ok"
    assert "gpu_check: 11 steps, 0 failed or skipped, 3 refused by the sanitizer" in r.stdout
    assert r.rc == 0


def test_sanitizer_finding_errors_fails(tmp_path):
    r = run_check(tmp_path, STUB_SANITIZER="errors")
    assert r.rows["sanitizer-memcheck"] == "FAIL (ERROR SUMMARY: 1 error)"
    assert "Invalid __global__ write" in r.report
    assert r.rc == 1


def test_missing_wheels_say_how_to_get_them(tmp_path):
    r = run_check(tmp_path, wheels=False)
    assert r.rows["wheels"].startswith("FAIL (no cffi and pycparser wheels in ")
    assert "scripts/fetch_gpu_wheels.sh" in r.rows["wheels"] and "carry" in r.rows["wheels"]
    assert "No module named 'cffi'" in r.report  # the build then fails, and says why
    assert r.rows["build-plain"] == "FAIL (exit 1): ModuleNotFoundError: No module named 'cffi'"
    assert r.rows["gpu"] == "ok" and r.rows["registers"].startswith("FAIL")
    assert r.rc == 1


def test_cffi_already_installed_and_a_missing_test_file(tmp_path):
    r = run_check(tmp_path, out=False, model_tests=False, STUB_CFFI=1)
    assert r.rows["wheels"] == "ok (already installed)"
    assert "pip install" not in (tmp_path / "calls.log").read_text()
    assert "gpu-tests: tests/cuda/test_cuda_gpu_model.py does not exist: not run" in r.report
    assert "pytest args: -q -p no:cacheprovider -rs tests/cuda/test_cuda_gpu.py\n" in r.report
    assert r.rows["gpu-tests"] == "ok" and r.rc == 0


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
                       timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
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
                     ("issue 12", 0.75), "484 MB moved")
    assert re.search(r" 100\.0 +3500\.0 GB/s +copy same B +4000\.0 +0\.88x +>=0\.75x yes  "
                     r"issue 12; 484 MB moved$", met), met
    below = format_row("attention fwd+bwd T=4096", 2e-3, 10.0, "TFLOP/s", "torch SDPA", 20.0,
                       ("issue 10", 0.8))
    assert re.search(r" 0\.50x +>=0\.80x NO   issue 10$", below), below
    plain = format_row("device-to-device copy", 1e-3, 4300.0, "GB/s")
    assert re.search(r"GB/s +- +- +- -$", plain), plain
    # the columns line up with the header
    assert len(met.split("  issue")[0]) == len(HEAD.split("  note")[0])
