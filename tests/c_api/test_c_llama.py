"""The C API of Llama-family folders (pytfm_llama_*): what it reads is what pytfm.llama maps
(the one reader), its arguments are checked, and under ASan and UBSan it reads good folders
and refuses every hostile one of tests/model/test_llama_folders.py without a leak or a read
out of bounds."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import TESTS
from pytfm import llama
from pytfm._core import ffi, lib

sys.path.insert(0, os.path.join(TESTS, "model"))
from test_llama_folders import (  # noqa: E402  (a skip without transformers)
    HOSTILE_CONFIGS,
    HOSTILE_WEIGHTS,
    edit_config,
    hf_model,
    rewrite,
    saved,
    weights_of,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
OK = lib.PYTFM_STATUS_OK


def last_error():
    return ffi.string(lib.pytfm_last_error()).decode()


def test_the_c_api_reads_what_python_maps(tmp_path):
    model = hf_model("qwen3", dtype="bfloat16", head_dim=16)
    path = saved(tmp_path, model, shard="8KB")
    handle = ffi.new("pytfm_llama **")
    assert lib.pytfm_llama_open(handle, path.encode()) == OK, last_error()
    try:
        c = ffi.new("pytfm_model_config *")
        assert lib.pytfm_llama_get_config(handle[0], c) == OK
        assert c.arch == lib.PYTFM_ARCH_LLAMA and c.qk_norm == 1 and c.head_dim == 16
        _, params = llama.read_params(path)
        assert c.n_params == sum(a.size for a in params.values())
        flat = np.full(c.n_params, np.nan, np.float32)
        buf = ffi.from_buffer("float[]", flat, True)
        assert lib.pytfm_llama_read(handle[0], buf, c.n_params) == OK, last_error()
        np.testing.assert_array_equal(flat, np.concatenate([a.ravel() for a in params.values()]))
        assert lib.pytfm_llama_read(handle[0], buf, c.n_params - 1) == \
            lib.PYTFM_STATUS_INVALID_ARGUMENT
        assert "count must be the config's n_params" in last_error()
        assert lib.pytfm_llama_read(handle[0], ffi.NULL, c.n_params) != OK
        assert lib.pytfm_llama_get_config(handle[0], ffi.NULL) != OK
    finally:
        assert lib.pytfm_llama_close(handle[0]) == OK
    assert lib.pytfm_llama_close(ffi.NULL) == OK
    assert lib.pytfm_llama_open(ffi.NULL, path.encode()) != OK
    assert lib.pytfm_llama_open(handle, ffi.NULL) != OK and handle[0] == ffi.NULL
    text = open(os.path.join(path, "config.json"), "rb").read()
    parsed = ffi.new("pytfm_model_config *")
    assert lib.pytfm_llama_config_parse(parsed, text, len(text), b"x.json") == OK
    assert lib.pytfm_model_config_check(parsed) == OK
    assert lib.pytfm_llama_config_parse(parsed, text, len(text) - 2, b"x.json") != OK
    assert last_error().startswith("x.json: not valid JSON")
    assert lib.pytfm_llama_ignored_field(-1) == ffi.NULL


def test_a_failed_open_leaves_no_handle(tmp_path):
    path = saved(tmp_path, hf_model("llama"))
    edit_config(path, hidden_act="relu")
    handle = ffi.new("pytfm_llama **")
    handle[0] = ffi.cast("pytfm_llama *", 1)
    assert lib.pytfm_llama_open(handle, path.encode()) == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert handle[0] == ffi.NULL and "hidden_act is 'relu'" in last_error()


PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pytfm.h"

/* each folder: pytfm_llama_open, its config, every parameter read into an exactly-sized heap
 * buffer (ASan sees a write one float past its end); "<path>: ok <n>" or "rejected: <msg>";
 * exit 1 when a failure leaves a handle or its message names no file of the folder */
int main(int argc, char **argv) {
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        pytfm_llama *g = (pytfm_llama *)1;
        pytfm_status st = pytfm_llama_open(&g, argv[i]);
        if (st != PYTFM_STATUS_OK) {
            printf("rejected: %s\n", pytfm_last_error());
            bad |= g != NULL || strncmp(pytfm_last_error(), argv[i], strlen(argv[i]));
            continue;
        }
        pytfm_model_config c;
        pytfm_llama_get_config(g, &c);
        float *params = malloc((size_t)c.n_params * sizeof *params);
        st = params ? pytfm_llama_read(g, params, c.n_params) : PYTFM_STATUS_OUT_OF_MEMORY;
        if (st == PYTFM_STATUS_OK) printf("%s: ok %lld\n", argv[i], (long long)c.n_params);
        else printf("rejected: %s\n", pytfm_last_error());
        free(params);
        pytfm_llama_close(g);
    }
    return bad;
}
"""


def test_every_folder_is_read_clean_under_asan_and_ubsan(tmp_path):
    from test_c_checkpoint import ASAN_ENV, FLAGS, SANITIZE

    from helpers import build_with_library

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    if subprocess.run([cc, *FLAGS, *SANITIZE, str(probe), "-o", str(probe) + ".exe"],
                      capture_output=True).returncode:
        if os.environ.get("CI"):
            pytest.fail("the C compiler cannot link sanitizer runtimes here")
        pytest.skip("the C compiler cannot link sanitizer runtimes (libasan/libubsan) here")
    source = tmp_path / "open_llama.c"
    source.write_text(PROGRAM)
    exe = str(tmp_path / "open_llama")
    build = build_with_library(cc, [*FLAGS, *SANITIZE], str(source), exe)
    assert build.returncode == 0, build.stderr
    good = [saved(tmp_path, hf_model("llama", dtype="float16"), "g0"),
            saved(tmp_path, hf_model("qwen2", dtype="bfloat16"), "g1", shard="8KB"),
            saved(tmp_path, hf_model("mistral", sliding_window=4), "g2")]
    hostile = []
    for k, (change, _) in enumerate(HOSTILE_CONFIGS):
        hostile.append(saved(tmp_path, hf_model("llama"), f"c{k}"))
        edit_config(hostile[-1], **change)
    for k, (change, _) in enumerate(HOSTILE_WEIGHTS):
        hostile.append(saved(tmp_path, hf_model("llama"), f"w{k}"))
        rewrite(hostile[-1], change(weights_of(hostile[-1])))
    r = subprocess.run([exe, *good, *hostile], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, **ASAN_ENV))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    counts = [sum(a.size for a in llama.read_params(p)[1].values()) for p in good]
    assert lines[:3] == [f"{p}: ok {n}" for p, n in zip(good, counts)]
    assert len(lines) == len(good) + len(hostile)
    assert all(line.startswith("rejected: ") for line in lines[3:])
