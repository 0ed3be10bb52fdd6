"""nvcc's -Xptxas -v report of the CUDA build (pytfm/lib/cuda_build.log, written by
cmake/nvcc_report.sh): no kernel spills registers to local memory on any architecture built
(sm_80 and sm_90 by default), as the kernels' rows-in-registers design promises (a spilled
register array is a round trip through local memory per element). scripts/gpu_check.sh's
register report fails on a spill too, on the machine with the GPU.

And no kernel uses more than MAX_REGISTERS = 240 of the 255 registers a thread can have: a
kernel at 255 spills, and fails, at the next value it keeps live, with nothing left to give
it; under 240 it has 15 to grow into (the tensor-core kernels: the restructured loads of
cuda/sgemm_tc.cu, the TC_REGS budget of cuda/attention_tc.cu; docs/cuda.md).
"""

import os
import re

import pytest

import pytfm

LOG = os.path.join(os.path.dirname(pytfm.__file__), "lib", "cuda_build.log")
MAX_REGISTERS = 240


def kernels(text):
    """[(kernel, arch, stack bytes, spill stores, spill loads, registers)] of a -Xptxas -v
    report."""
    found, current = [], None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line)
        if m:
            current, spills = m.groups(), None
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                      r"loads", line)
        if m and current:
            spills = tuple(map(int, m.groups()))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current and spills:
            found.append((*current, *spills, int(m.group(1))))
            current = None
    return found


def build_log():
    """the text of the build's report, and the architectures it was built for"""
    if not pytfm.build_info()["cuda"]:
        reason = "pytfm was built without CUDA (no nvcc): no build log to read"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    assert os.path.exists(LOG), f"a CUDA build writes {LOG} (cmake/nvcc_report.sh)"
    with open(LOG, encoding="utf-8") as f:
        text = f.read()
    found = kernels(text)
    built = set(re.findall(r"\b(\d+)-real\b", text.splitlines()[0]))
    assert found and {arch for _, arch, *_ in found} == {f"sm_{a}" for a in built}, built
    return found


def over(found, limit=MAX_REGISTERS):
    """the kernels of found that use more than limit registers, one line each"""
    return [f"{name} [{arch}]: {regs} registers" for name, arch, *_, regs in found
            if regs > limit]


SAMPLE = """# nvcc (CUDA 13.0.88), 80-real 90-real 90-virtual: -Xptxas -v

## cuda/layernorm.cu
ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_80'
ptxas info    : Function properties for _Z6kernelPf
    40 bytes stack frame, 40 bytes spill stores, 40 bytes spill loads
ptxas info    : Used 64 registers, used 0 barriers, 416 bytes cmem[0]
ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90'
ptxas info    : Function properties for _Z6kernelPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers
"""


def test_the_report_is_read_kernel_by_kernel():
    assert kernels(SAMPLE) == [("_Z6kernelPf", "sm_80", 40, 40, 40, 64),
                               ("_Z6kernelPf", "sm_90", 0, 0, 0, 255)]
    assert over(kernels(SAMPLE)) == ["_Z6kernelPf [sm_90]: 255 registers"]


def test_no_kernel_spills_registers():
    found = build_log()
    spilled = [f"{name} [{arch}]: {stores} bytes spill stores, {loads} loads"
               for name, arch, _, stores, loads, _ in found if stores or loads]
    assert not spilled, "\n".join(spilled)


def test_every_kernel_leaves_a_margin_of_registers():
    """every kernel of every architecture built within MAX_REGISTERS"""
    found = build_log()
    assert not over(found), "\n".join(over(found))
