"""The examples with a BF16 KV cache: examples/generate.c --kv-cache bf16 (a C session opened
by pytfm_session_open_ex) and examples/sample.py --kv-cache bf16 (pytfm.generate with
kv_cache="bf16") choose the same greedy tokens as pytfm.generate on a BF16 cache; bad values
of the flag and of generate's kv_cache are refused by name. The kernels' and the session's
bits: tests/kernels/test_kv_bf16.py."""

import importlib.util
import io
import os
from contextlib import redirect_stdout

import numpy as np
import pytest
from test_c_model import run_exe, trained

from helpers import ROOT
from pytfm import data
from pytfm.generate import generate

__all__ = ["trained"]  # a fixture of test_c_model.py, used here (generate_exe: conftest.py)


def test_the_generate_example_with_a_bf16_cache_is_pythons_greedy(trained, generate_exe):
    model, path = trained
    ref = generate(model, np.array([list(b"class ")]), 50, temperature=0.0, kv_cache="bf16")[0]
    r = run_exe(generate_exe, path, "--prompt", "class ", "--tokens", 50, "--temperature", 0,
                "--threads", 1, "--kv-cache", "bf16")
    assert r.returncode == 0, r.stderr
    assert r.stdout == bytes(ref.tolist()) + b"\n"
    r = run_exe(generate_exe, path, "--kv-cache", "fp16")
    assert r.returncode == 2
    assert b"argument --kv-cache: invalid choice: 'fp16' (choose from 'fp32', 'bf16')" \
        in r.stderr


def test_sample_py_runs_with_a_bf16_cache(trained):
    model, path = trained
    spec = importlib.util.spec_from_file_location("sample", os.path.join(ROOT, "examples",
                                                                         "sample.py"))
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    out = io.StringIO()
    with redirect_stdout(out):
        assert sample.main([str(path), "--prompt", "class ", "--tokens", "20",
                            "--temperature", "0", "--kv-cache", "bf16"]) in (0, None)
    ref = generate(model, np.array([list(b"class ")]), 20, temperature=0.0, kv_cache="bf16")
    assert out.getvalue() == data.decode(ref[0]) + "\n"


def test_generate_refuses_other_kv_caches_by_name(trained):
    model, _ = trained
    with pytest.raises(ValueError, match=r"kv_cache must be 'fp32' or 'bf16' .*got 'int8'"):
        generate(model, np.array([[1, 2]]), 3, kv_cache="int8")
