"""The C API of Llama-family folders (pytfm_llama_*): what it reads is what pytfm.llama maps
(the one reader), its arguments are checked, and under ASan and UBSan it reads good folders
and refuses every hostile one of tests/model/test_llama_folders.py without a leak or a read
out of bounds."""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import TESTS
from pytfm import llama
from pytfm._core import ffi, lib
from pytfm.checkpoint import CheckpointError
from pytfm.nn import config_from_c

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

/* the model of a good folder (it keeps BF16 for a bfloat16 one): a forward of 2 x 5 tokens, a
 * session fed 3 then 1, in the precision it opened in, then in FP32, then in BF16 again: 0, or
 * 1 with the problem printed */
static int run_model(const char *path) {
    pytfm_model *m = NULL;
    pytfm_session *s = NULL;
    pytfm_model_config c;
    pytfm_status st = pytfm_model_open(&m, path, PYTFM_DEVICE_CPU);
    if (st == PYTFM_STATUS_OK) st = pytfm_model_get_config(m, &c);
    float *logits = st == PYTFM_STATUS_OK ? malloc((size_t)(10 * c.vocab) * sizeof *logits) : NULL;
    const int64_t tokens[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const int32_t precisions[3] = {-1, PYTFM_PRECISION_FP32, PYTFM_PRECISION_BF16};
    if (st == PYTFM_STATUS_OK && !logits) st = PYTFM_STATUS_OUT_OF_MEMORY;
    for (int p = 0; p < 3 && st == PYTFM_STATUS_OK; p++) {
        if (precisions[p] >= 0) st = pytfm_model_set_precision(m, precisions[p]);
        if (st == PYTFM_STATUS_OK) st = pytfm_model_forward(m, logits, tokens, 2, 5);
        if (st == PYTFM_STATUS_OK) st = pytfm_session_open(&s, m, 8);
        if (st == PYTFM_STATUS_OK) st = pytfm_session_feed(s, logits, tokens, 3);
        if (st == PYTFM_STATUS_OK) st = pytfm_session_feed(s, logits, tokens + 3, 1);
        pytfm_session_close(s);
        s = NULL;
    }
    if (st != PYTFM_STATUS_OK) printf("%s: the model failed: %s\n", path, pytfm_last_error());
    free(logits);
    pytfm_model_close(m);
    return st != PYTFM_STATUS_OK;
}

/* each folder: pytfm_llama_open, its config, every parameter read into an exactly-sized heap
 * buffer (ASan sees a write one float past its end); "<path>: ok <n>" or "rejected: <msg>";
 * then a good one's model run (run_model). Exit 1 when a failure leaves a handle or its
 * message names no file of the folder, or a good folder's model fails */
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
        if (st == PYTFM_STATUS_OK) bad |= run_model(argv[i]);
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
            saved(tmp_path, hf_model("mistral", sliding_window=4), "g2"),
            saved(tmp_path, hf_model("qwen3", dtype="bfloat16", head_dim=16,
                                     tie_word_embeddings=True), "g3")]
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
    assert lines[:len(good)] == [f"{p}: ok {n}" for p, n in zip(good, counts)]
    assert len(lines) == len(good) + len(hostile)
    assert all(line.startswith("rejected: ") for line in lines[len(good):])


def judged_alike(raw):
    """raw (a config.json's bytes) through the C parser and through llama.config_from_dict of
    json.loads(raw): both refuse, or both give the same GPTConfig. A text the C parser refuses
    as not JSON may be one that json.loads reads leniently (NaN, Infinity, a duplicate key, a
    byte order mark); there the dict is judged on its own. -> (the C parser's GPTConfig or
    None, its message)."""
    out = ffi.new("pytfm_model_config *")
    took = lib.pytfm_llama_config_parse(out, raw, len(raw), b"config.json") == OK
    why = "" if took else last_error()
    assert took or why.startswith("config.json: "), why
    try:
        doc = json.loads(raw)
    except ValueError:
        assert not took, raw  # a text the C parser takes is JSON that Python reads
        return None, why
    try:
        cfg = llama.config_from_dict(doc)
    except CheckpointError as e:
        cfg = e
    if took:
        assert cfg == config_from_c(out), (raw, cfg)
        return cfg, why
    if not why.startswith("config.json: not valid JSON"):
        assert isinstance(cfg, CheckpointError), (raw, why, cfg)
    return None, why


def test_fuzzing_the_config_parser_for_a_while_finds_nothing(tmp_path_factory, tmp_path):
    """tests/c_api/fuzz/fuzz_llama_config.c under libFuzzer, ASan and UBSan for a bounded time
    (PYTFM_FUZZ_SECONDS, default 10), from llama_seeds/ (each family's config.json as
    transformers writes it) with llama.dict: no crash, leak or trap; then every input it kept
    is judged alike by the C parser on the text and by llama.config_from_dict on json.loads of
    it (judged_alike)."""
    from test_c_checkpoint import build_fuzz_target, fuzz_for_a_while

    exe = build_fuzz_target(tmp_path_factory, "fuzz_llama_config")
    kept, _ = fuzz_for_a_while(exe, tmp_path, "llama.dict", "llama_seeds",
                               what="libFuzzer (Llama config.json)")
    assert kept
    taken = sum(judged_alike(path.read_bytes())[0] is not None for path in kept)
    assert taken  # the seeds are taken, and inputs near them


def test_every_seed_is_a_config_the_parser_takes():
    seeds = os.path.join(TESTS, "c_api", "fuzz", "llama_seeds")
    names = sorted(os.listdir(seeds))
    assert len(names) >= 12
    families = set()
    for name in names:
        raw = open(os.path.join(seeds, name), "rb").read()
        cfg, why = judged_alike(raw)
        assert cfg is not None, (name, why)
        families.add(json.loads(raw)["model_type"])
    assert families == {"llama", "qwen2", "qwen3", "mistral"}


# every number field of the four families, as (base config, path to the field)
_LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=8192)
_SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2)
_BASES = {
    "llama": dict(model_type="llama", **_SIZES, head_dim=8, max_position_embeddings=64,
                  rms_norm_eps=1e-5, rope_theta=5e5, rope_scaling=_LLAMA3, pretraining_tp=1,
                  attention_dropout=0.0),
    "qwen2": dict(model_type="qwen2", **_SIZES, use_sliding_window=True, sliding_window=8,
                  max_window_layers=0, rope_parameters=dict(rope_type="default",
                                                            rope_theta=1e6)),
}
NUMBER_FIELDS = [("llama", (f,)) for f in (*_SIZES, "head_dim", "max_position_embeddings",
                                          "rms_norm_eps", "rope_theta", "pretraining_tp",
                                          "attention_dropout")] + \
    [("llama", ("rope_scaling", f)) for f in _LLAMA3 if f != "rope_type"] + \
    [("qwen2", (f,)) for f in ("sliding_window", "max_window_layers")] + \
    [("qwen2", ("rope_parameters", "rope_theta"))]
PYTFM_NAMES = dict(vocab_size="vocab", hidden_size="d_model", intermediate_size="d_ff",
                   num_hidden_layers="n_layer", num_attention_heads="n_head",
                   num_key_value_heads="n_kv_head", max_position_embeddings="max_seq")
EDGES = ["1e999", "-1e999", "1e-999", "-1e-999", "5e-324", "-5e-324", "-0", "-0.0", "0",
         "1.7976931348623157e308", "1e308", "9223372036854775807", "9223372036854775808",
         "-9223372036854775808", "-9223372036854775809", "18446744073709551616",
         "1" + "0" * 400, "-" + "9" * 400, "1" + "0" * 400 + ".0", "2.0", "2e0",
         "1" + "0" * 4299, "1" + "0" * 4300]  # Python's limit: 4300 digits


@pytest.mark.parametrize("base, field", NUMBER_FIELDS, ids=lambda x: ".".join(x)
                         if isinstance(x, tuple) else x)
def test_a_number_at_the_edge_of_int64_or_double_is_judged_alike_from_text_and_dict(base, field):
    """Each number field at each edge (overflow to inf and underflow to 0 of a double, -0,
    the smallest subnormal, int64's limits and beyond, integers written as floats, an integer
    of 4300 digits and one of 4301, past what json.loads reads) spelled in
    the text: the C parser on the text and llama.config_from_dict on json.loads of it agree,
    and where they refuse it is a CheckpointError naming the field, never an OSError (strtod's
    ERANGE) or a crash."""
    assert judged_alike(json.dumps(_BASES[base]).encode())[0] is not None
    for edge in EDGES:
        doc = json.loads(json.dumps(_BASES[base]))
        inner = doc
        for key in field[:-1]:
            inner = inner[key]
        inner[field[-1]] = "@"
        raw = json.dumps(doc).replace('"@"', edge).encode()
        if "e999" in edge:
            value = json.loads(raw)
            for key in field:
                value = value[key]
            assert math.isinf(value)
        cfg, why = judged_alike(raw)
        if len(edge) > 4300:  # not JSON that Python reads: refused as not JSON, on its own
            assert cfg is None and "4301 digits" in why, why
            continue
        if cfg is None:  # the field by its name, or by pytfm's in a rule of the sizes
            names = f"({field[-1]}|{PYTFM_NAMES.get(field[-1], field[-1])})"
            assert re.search(names, why), (edge, why)
            with pytest.raises(CheckpointError, match=names):
                llama.config_from_dict(json.loads(raw))
