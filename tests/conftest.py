"""Test configuration: hypothesis profiles and a summary of the errors seen per op.

Profiles (HYPOTHESIS_PROFILE=<name>, default "quick"):
  quick     ~25 examples per property: the everyday run
  ci        100 examples per property, derandomised: what .ci/run uses
  thorough  1000 examples per property: before a release or after touching a kernel
"""

import os
import shutil

import pytest
from hypothesis import HealthCheck, settings

import helpers

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("quick", max_examples=25, **_common)
settings.register_profile("ci", max_examples=100, derandomize=True, **_common)
settings.register_profile("thorough", max_examples=1000, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


def pytest_terminal_summary(terminalreporter):
    """Print, per op and direction, how many comparisons ran and the worst error seen."""
    if not helpers.RECORD:
        return
    tr = terminalreporter
    tr.section("pytfm: C kernels vs the float64 reference")
    tr.write_line(f"{'check':34s} {'compared':>9s} {'max rel err':>12s} {'max err/tol':>12s}")
    for name in sorted(helpers.RECORD):
        r = helpers.RECORD[name]
        tr.write_line(f"{name:34s} {r.count:9d} {r.max_rel:12.2e} {r.max_ratio:12.3f}")
    tr.write_line("max rel err = max|got - ref| / max|ref| per array (normwise; arrays whose")
    tr.write_line("max|ref| is under 1000 x atol, i.e. near zero by cancellation, are left out)")


@pytest.fixture(scope="session")
def emu_library(tmp_path_factory):
    """The CUDA kernels of cuda/ built for the CPU emulator (tests/cuda_emu.py), once a run: the
    library's path, which a subprocess can load too (None without the source checkout)."""
    import cuda_emu

    if not os.path.isdir(cuda_emu.CUDA):
        return None
    cc, cxx = cuda_emu.compilers()
    if not (cc and cxx and (shutil.which(cxx) or os.path.exists(cxx))):
        pytest.fail("a C++ compiler (g++) is needed to run the CUDA kernels under the emulator")
    return cuda_emu.build(str(tmp_path_factory.mktemp("emu")))


@pytest.fixture(scope="session")
def emu(emu_library):
    """emu_library loaded (tests/cuda_emu.Emu)."""
    import cuda_emu

    if emu_library is None:
        pytest.skip("needs the source checkout (cuda/)")
    return cuda_emu.Emu(emu_library)


@pytest.fixture
def cp(emu, monkeypatch):
    """The stand-in cupy module (tests/fake_cupy.py), with pytfm._core.lib the emulator's:
    pytfm.ops on its arrays runs the CUDA kernels of cuda/ under the emulator."""
    import fake_cupy

    return fake_cupy.install(monkeypatch, emu)


@pytest.fixture(params=["forward", "reverse"])
def order(request, emu):
    """Run the emulated kernels with the threads of each block scheduled first-to-last, then
    last-to-first between barriers: a missing __syncthreads() reads stale shared memory in at
    least one of the two orders (tests/test_cuda_*.py)."""
    emu.lib.pytfm_emu_set_order(request.param == "reverse")
    yield request.param
    emu.lib.pytfm_emu_set_order(0)
