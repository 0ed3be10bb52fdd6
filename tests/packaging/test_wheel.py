"""pip's build from the source distribution, on a machine without cmake: the sdist holds what
CMakeLists.txt needs, the build requirement brings cmake from the package index, and the wheel
holds one library file (a wheel cannot hold symlinks) that the extension loads.

It builds without CUDA (PYTFM_CUDA=0), to keep it to the C kernels' compile; pip needs the
package index (or its cache) for the build requirements, as `pip install .` does.
"""

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest

from helpers import ROOT, public_headers, subprocess_env

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "setup.py")),
                                reason="needs the source checkout")


def run(cmd, **kwargs):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r.stdout


def test_sdist_builds_a_wheel_without_a_system_cmake(tmp_path, path_without):
    if importlib.util.find_spec("setuptools") is None:  # setup.py sdist runs in this Python
        pytest.fail("making the sdist needs setuptools in this environment", pytrace=False)
    dist = tmp_path / "dist"
    run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path), "sdist",
         "--dist-dir", str(dist)], cwd=ROOT)
    (sdist,) = dist.glob("pytfm-*.tar.gz")
    with tarfile.open(sdist) as tar:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp_path / "src", **safe)
    (src,) = (tmp_path / "src").iterdir()

    env = dict(os.environ, PATH=path_without("cmake", "ctest", "cpack", "ccmake"), PYTFM_CUDA="0")
    env.pop("PYTFM_WERROR", None)  # CI's -Werror is for the checkout's own build
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "wheel"),
         str(src)], env=env, cwd=tmp_path)
    (wheel,) = (tmp_path / "wheel").glob("pytfm-*.whl")

    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    with open(os.path.join(ROOT, "csrc", "include", "pytfm_core.h"), encoding="utf-8") as f:
        abi = re.search(r"^#define PYTFM_ABI_VERSION (\d+)", f.read(), re.M).group(1)
    libraries = sorted(n for n in names if n.startswith("pytfm/lib/libpytfm"))
    assert libraries == ["pytfm/lib/libpytfm.a", f"pytfm/lib/libpytfm.so.{abi}"], libraries
    assert "pytfm/lib/pkgconfig/pytfm.pc" in names
    assert "pytfm/lib/cuda_build.log" not in names  # no CUDA, no report
    for header in public_headers():
        assert f"pytfm/include/{os.path.basename(header)}" in names, header
    (extension,) = [n for n in names if re.fullmatch(r"pytfm/_pytfm_cffi\..*so", n)]

    # installed on its own, the extension finds its library through $ORIGIN/lib
    target = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
         str(target), str(wheel)])
    out = run([sys.executable, "-c", "import pytfm; print(pytfm.__file__); "
               "print(pytfm.build_info()['cuda'], pytfm.ops.softmax_forward)"],
              env=subprocess_env(target), cwd=tmp_path)
    assert out.splitlines()[0] == str(target / "pytfm" / "__init__.py")
    assert out.splitlines()[1].startswith("False ")
    dynamic = run(["readelf", "-d", str(target / extension)])
    assert f"Shared library: [libpytfm.so.{abi}]" in dynamic
    assert "$ORIGIN/lib" in dynamic
