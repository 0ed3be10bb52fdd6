"""A C program using libpytfm forks after its kernels ran on 2 threads (tests/c_api/fork_child.c):
its child and grandchild compute the parent's bits, on one thread, instead of hanging in
libgomp. Built as a user builds a program (python -m pytfm --cflags --libs), so it runs the
library as installed, OpenMP and all."""

import os
import shutil
import subprocess
import sys

from helpers import TESTS

SECONDS = 200  # the program: its children have 60 s each, and end in well under 1 s alone


def test_a_forked_child_of_a_c_program_computes_the_parents_bits(tmp_path):
    import pytfm

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build pytfm itself"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(pytfm.__file__)),
               OMP_NUM_THREADS="2", PYTFM_PROC_ROOT=str(tmp_path))  # a team whatever the load
    flags = subprocess.run([sys.executable, "-m", "pytfm", "--cflags", "--libs"], check=True,
                           capture_output=True, text=True, cwd="/", env=env).stdout.split()
    exe, here = str(tmp_path / "fork_child"), os.path.join(TESTS, "c_api")
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", f"-I{here}",
                    os.path.join(here, "fork_child.c"), *flags, "-o", exe], check=True)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=SECONDS, env=env)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "forked children computed the parent's bits (parent on 2 threads)" in r.stdout
