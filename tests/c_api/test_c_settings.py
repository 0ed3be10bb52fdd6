"""PYTFM_NUM_THREADS and PYTFM_MAX_ISA in a C program (tests/c_api/env_settings.c): the library
reads them once, at the first use of the settings, with the meaning Python's pytfm gives them
(the same counts and ISA as `import pytfm` reports under the same environment); a set call
wins over them, before or after; a value that is not one is ignored with one line on stderr
naming the variable."""

import os
import shutil
import subprocess
import sys

import pytest

from helpers import TESTS, build_with_library
from pytfm import _core

FLAGS = ["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fopenmp", "-pthread"]


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build pytfm itself"
    out = str(tmp_path_factory.mktemp("settings") / "env_settings")
    build = build_with_library(cc, FLAGS, os.path.join(TESTS, "c_api", "env_settings.c"), out)
    assert build.returncode == 0, build.stderr
    return out


def run(exe, env, *args):
    full = {k: v for k, v in os.environ.items() if k not in ("PYTFM_NUM_THREADS",
                                                            "PYTFM_MAX_ISA")}
    r = subprocess.run([exe, *args], capture_output=True, text=True, env={**full, **env})
    assert r.returncode == 0, r.stderr
    return [tuple(int(w) for w in line.split()[1::2]) for line in r.stdout.splitlines()], r.stderr


def python_settings(env):
    """(threads, isa) as `import pytfm` sets them under env."""
    full = {k: v for k, v in os.environ.items() if k not in ("PYTFM_NUM_THREADS",
                                                            "PYTFM_MAX_ISA")}
    code = ("import pytfm; from pytfm import _core; "
            "print(pytfm.get_num_threads(), _core.ISAS.index(pytfm.get_isa()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**full, **env}, check=True)
    return tuple(map(int, r.stdout.split()))


@pytest.mark.parametrize("env", [{"PYTFM_NUM_THREADS": "1"}, {"PYTFM_NUM_THREADS": " 2 "},
                                 {"PYTFM_MAX_ISA": "plain"}, {"PYTFM_MAX_ISA": "portable"},
                                 {"PYTFM_NUM_THREADS": "1", "PYTFM_MAX_ISA": " plain\t"}])
def test_the_environment_sets_what_python_sets(exe, env):
    (first, after), err = run(exe, env)
    assert err == ""
    # the default thread count follows the cores other processes leave free at that moment:
    # only a count the environment sets is compared
    same = slice(0, 2) if "PYTFM_NUM_THREADS" in env else slice(1, 2)
    assert first[same] == python_settings(env)[same]
    if "PYTFM_MAX_ISA" in env:
        assert first[1] == _core.ISAS.index(env["PYTFM_MAX_ISA"].strip())
    if "PYTFM_NUM_THREADS" in env:
        assert first[0] == int(env["PYTFM_NUM_THREADS"])
    assert after == (3, python_settings({})[1])  # the set calls win


def test_a_set_before_the_first_use_wins(exe):
    (settings,), _ = run(exe, {"PYTFM_NUM_THREADS": "1", "PYTFM_MAX_ISA": "plain"}, "first")
    assert settings == (3, python_settings({})[1])


@pytest.mark.parametrize("var, value", [("PYTFM_NUM_THREADS", "two"),
                                        ("PYTFM_NUM_THREADS", "-1"),
                                        ("PYTFM_NUM_THREADS", "2147483648"),
                                        ("PYTFM_MAX_ISA", "sse4"), ("PYTFM_MAX_ISA", "PLAIN")])
def test_a_bad_value_is_ignored_with_a_line_naming_it(exe, var, value):
    (first, _), err = run(exe, {var: value})
    default = run(exe, {})[0][0]
    assert first[1] == default[1] and first[0] >= 1  # the default threads follow the load
    assert err.startswith(f"pytfm: {var}={value} ignored: it must be ") and err.count("\n") == 1
