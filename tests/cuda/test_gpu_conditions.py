"""The GPU check machine's Python, rebuilt here: a virtual environment without cffi or
pycparser (the device's image has CMake, as the cmake package: the device tool's KINDS.md),
the wheels scripts/fetch_gpu_wheels.sh fetches (for this machine's Python) installed with
`pip install --no-index --no-deps --target` onto PYTHONPATH, as scripts/gpu_check.sh installs
them there, and the checkout first on PYTHONPATH. In it pytfm imports, setup.py finds the
image's cmake package with none on PATH, and the GPU tests' subprocess paths run: a subprocess
that replaced PYTHONPATH instead of extending it would lose cffi, so its pytfm would not import
(shown here too). The GPU parts skip (no CuPy); the imports and the subprocesses run.
"""

import ast
import os
import shutil
import site
import subprocess
import sys

import pytest

from helpers import ROOT

FETCH = os.path.join(ROOT, "scripts", "fetch_gpu_wheels.sh")
PACKAGES = ("cffi", "_cffi_backend", "pycparser", "pytfm")  # what the device lacks
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def lacking(name):
    """Whether the site-packages entry `name` belongs to a package the device's Python lacks."""
    base = name.split("-")[0].split(".")[0].lower()
    return base in PACKAGES


@pytest.fixture(scope="module")
def device_like(tmp_path_factory):
    """(the rebuilt interpreter, its environment with the wheels on PYTHONPATH, the folder the
    wheels went into)"""
    root = tmp_path_factory.mktemp("device")
    wheels = root / "wheels"
    r = subprocess.run(["bash", FETCH, str(wheels)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHON_VERSION=VERSION), timeout=300)
    if r.returncode:  # the pinned versions unreachable: those installed here, from the index
        from importlib.metadata import version  # (or the wheel cache) they came from

        pins = {f"{name.upper()}_VERSION": version(name) for name in ("cffi", "pycparser")}
        r = subprocess.run(["bash", FETCH, str(wheels)], capture_output=True, text=True,
                           env=dict(os.environ, PYTHON_VERSION=VERSION, **pins), timeout=300)
    if r.returncode:
        reason = f"the wheels could not be fetched (pip reaches no index?): {r.stderr[-500:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # the device's packages (numpy, pytest, hypothesis, ...): this environment's, but those
    ours = [p for p in site.getsitepackages() if os.path.isdir(p)]
    deps = root / "deps"
    deps.mkdir()
    for folder in ours:
        for name in os.listdir(folder):
            if not lacking(name) and not (deps / name).exists() and not name.endswith(".pth"):
                (deps / name).symlink_to(os.path.join(folder, name))
    venv_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip()
    with open(os.path.join(venv_site, "device_packages.pth"), "w") as f:
        f.write(str(deps) + "\n")
    target = root / "site"
    # gpu_check.sh's install, with the pip of this environment (the venv has none)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                    "--no-compile", "--disable-pip-version-check", "-q", "--target",
                    str(target), *map(str, sorted(wheels.glob("*.whl")))], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}:{os.environ['PATH']}", PYTHONPATH=f"{target}:{ROOT}",
               PYTHONDONTWRITEBYTECODE="1")
    return python, env, target


def run(python, env, *args, cwd=ROOT, timeout=300):
    return subprocess.run([python, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)


def test_the_rebuilt_python_lacks_what_the_device_lacks(device_like):
    python, env, _ = device_like
    bare = dict(env, PYTHONPATH=ROOT)  # the checkout alone: no wheels
    for probe in ("import cffi", "import _cffi_backend", "import pycparser"):
        r = run(python, bare, "-c", probe)
        assert r.returncode and "Error" in r.stderr, (probe, r.stderr)
    # what the device has (the checkout's cmake/ folder is a namespace package: the cmake
    # package's module has CMAKE_BIN_DIR)
    r = run(python, bare, "-c", "import numpy, pytest, hypothesis\n"
            "from cmake import CMAKE_BIN_DIR")
    assert r.returncode == 0, r.stderr
    r = run(python, bare, "-c", "import pytfm")  # the failure the wheels are there for
    assert r.returncode and "pytfm's compiled module is missing" in r.stderr, r.stderr


def test_with_the_wheels_pytfm_imports_and_setup_finds_cmake(device_like, tmp_path):
    python, env, target = device_like
    r = run(python, env, "-c", "import pytfm, cffi; print(pytfm.__file__, cffi.__file__)")
    assert r.returncode == 0, r.stderr
    here, backend = r.stdout.split()
    assert here == os.path.join(ROOT, "pytfm", "__init__.py")  # the checkout's build
    assert backend.startswith(str(target))  # cffi from the wheel
    # setup.py's find_cmake, with no cmake on PATH: the image's package's, which runs
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    find = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "find_cmake")
    code = ("import os, shutil, subprocess\nfrom setuptools.errors import SetupError\n"
            f"{ast.unparse(find)}\n"
            "c = find_cmake()\nprint(c)\nprint(subprocess.run([c, '--version'], "
            "capture_output=True, text=True, check=True).stdout.splitlines()[0])\n")
    lone = tmp_path / "bin"
    lone.mkdir()
    (lone / "python").symlink_to(python)
    r = run(python, dict(env, PATH=str(lone)), "-c", code)
    assert r.returncode == 0, r.stderr
    found, version = r.stdout.splitlines()
    assert not found.startswith(str(target)) and version.startswith("cmake version"), r.stdout
    assert not list(target.glob("cmake*")), "a cmake wheel was carried: the device has CMake"


def test_the_gpu_tests_subprocess_paths_run_there(device_like):
    """The GPU test files (their GPU parts skip: no CuPy here) and the subprocesses of the model
    tests, which start train_tiny as the GPU ones do, under pytest in the rebuilt Python."""
    python, env, _ = device_like
    r = run(python, env, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
            "tests/cuda/test_cuda_gpu.py", "tests/cuda/test_cuda_gpu_model.py",
            "tests/cuda/test_cuda_model.py::test_train_tiny_runs_in_a_fresh_interpreter",
            "tests/cuda/test_cuda_model.py::test_train_tiny_device_cuda_fails_clearly_here")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "2 passed" in out and "CuPy is not installed" in out, out[-4000:]


def test_a_subprocess_that_replaced_pythonpath_would_fail_there(device_like, tmp_path):
    """What the fixed tests did before extending it: PYTHONPATH set to the checkout alone loses
    the wheels, and train_tiny cannot import pytfm."""
    python, env, _ = device_like
    r = run(python, dict(env, PYTHONPATH=ROOT), os.path.join(ROOT, "examples", "train_tiny.py"),
            "--steps", "1", cwd=tmp_path, timeout=120)
    assert r.returncode and "pytfm's compiled module is missing" in r.stderr, r.stderr[-2000:]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_fetch_gpu_wheels_gets_what_the_device_lacks_only(device_like):
    _, _, target = device_like
    names = {p.split("-")[0] for p in os.listdir(target) if p.endswith(".dist-info")}
    assert names == {"cffi", "pycparser"}, names
