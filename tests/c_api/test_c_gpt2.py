"""The C model API on a Hugging Face GPT-2 folder (pytfm_model_open of a folder, pytfm_gpt2_*):
the logits are pytfm.gpt2.load's bits (the one reader, the same kernels), transformers' within
float32's rounding, and a hostile folder is refused by the C reader in the words Python
raises (tests/model/test_gpt2.py's hostile folders, here through pytfm_model_open)."""

import json
import math
import os
import sys

import numpy as np
import pytest
from test_c_model import OK, CModel, assert_same_logits, last_error

from helpers import TESTS
from pytfm import checkpoint, folders, gpt2
from pytfm._core import ffi, lib
from pytfm.checkpoint import CheckpointError

sys.path.insert(0, os.path.join(TESTS, "model"))
from gpt2_oracle import logits_of, random_gpt2  # noqa: E402  (a skip without transformers)
from test_gpt2 import HOSTILE, TINY, edited  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def folder_of(tmp_path, seed=0, **config):
    model = random_gpt2(seed, **{**TINY, **config})
    path = tmp_path / "g2"
    model.save_pretrained(str(path))
    return str(path), model


@pytest.mark.parametrize("config", [TINY, dict(TINY, tie_word_embeddings=False)])
def test_a_folder_opens_as_the_python_model_and_decodes_as_transformers(tmp_path, config):
    path, hf = folder_of(tmp_path, **config)
    py = gpt2.load(path)
    idx = np.random.default_rng(0).integers(0, TINY["vocab_size"], (2, 13))
    with CModel(path) as c:
        assert c.config.pos == lib.PYTFM_POS_LEARNED
        assert c.config.n_params == sum(p.size for p in py.params.values())
        assert bool(c.config.tie_embeddings) == config.get("tie_word_embeddings", True)
        ours = c.forward(idx)
        assert_same_logits(ours, py.forward(idx)[0])
        theirs = logits_of(hf, idx)
        # float32 sums of at most 4·n_embd terms, over layers: a few ulps of the largest logit
        err = np.abs(ours - theirs).max() / np.abs(theirs).max()
        assert err <= 1e-5, err
        caches = py.new_caches(1)
        with c.session() as s:
            for t in range(idx.shape[1]):
                tok = np.ascontiguousarray(idx[:1, t:t + 1])
                np.testing.assert_array_equal(s.feed(tok[0]), py.decode(tok, caches)[0, -1])


def test_the_reader_transposes_each_conv1d_weight_once(tmp_path):
    path, hf = folder_of(tmp_path)
    handle = ffi.new("pytfm_gpt2 **")
    assert lib.pytfm_gpt2_open(handle, path.encode()) == OK, last_error()
    try:
        config = ffi.new("pytfm_model_config *")
        assert lib.pytfm_gpt2_get_config(handle[0], config) == OK
        flat = np.empty(config.n_params, np.float32)
        assert lib.pytfm_gpt2_read(handle[0], ffi.from_buffer("float[]", flat, True),
                                   flat.size - 1) == lib.PYTFM_STATUS_INVALID_ARGUMENT
        assert lib.pytfm_gpt2_read(handle[0], ffi.from_buffer("float[]", flat, True),
                                   flat.size) == OK, last_error()
    finally:
        assert lib.pytfm_gpt2_close(handle[0]) == OK
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    from pytfm.nn import param_shapes

    at = 0
    for name, shape in param_shapes(gpt2.read_config(path)):
        n = int(np.prod(shape))
        want = state[name].T if name.endswith(gpt2._CONV1D) else state[name]
        np.testing.assert_array_equal(flat[at:at + n].reshape(shape), want, err_msg=name)
        at += n
    assert at == flat.size


@pytest.mark.parametrize("change, message", HOSTILE)
def test_pytfm_model_open_refuses_a_hostile_folder_as_python_does(tmp_path, change, message):
    path, _ = folder_of(tmp_path)
    bad = edited(tmp_path, path, **change)
    handle = ffi.new("pytfm_model **")
    assert lib.pytfm_model_open(handle, bad.encode(), lib.PYTFM_DEVICE_CPU) != OK
    assert handle[0] == ffi.NULL
    got = last_error()
    with pytest.raises(checkpoint.CheckpointError) as e:
        folders.load(bad)  # pytfm_model_open's rule: a model_type of the Llama family goes there
    assert got == str(e.value)


def test_a_folder_with_a_stored_tied_head_that_differs_is_refused(tmp_path):
    path, _ = folder_of(tmp_path)
    tensors, _ = checkpoint.load_file(os.path.join(path, "model.safetensors"))
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"].copy()
    tensors["lm_head.weight"][3, 4] += 1
    checkpoint.save_file(os.path.join(path, "model.safetensors"), tensors, {"format": "pt"})
    handle = ffi.new("pytfm_model **")
    assert lib.pytfm_model_open(handle, path.encode(), 0) == lib.PYTFM_STATUS_INVALID_ARGUMENT
    assert "model.safetensors: lm_head.weight differs from the embedding" in last_error()


def test_a_shard_that_shrinks_after_the_open_is_an_error_not_a_crash(tmp_path):
    """The reader copies with pread: a file cut short between the header check and the read
    is an error naming the tensor (no mapping, so no SIGBUS)."""
    path, _ = folder_of(tmp_path)
    handle = ffi.new("pytfm_gpt2 **")
    assert lib.pytfm_gpt2_open(handle, path.encode()) == OK, last_error()
    try:
        weights = os.path.join(path, "model.safetensors")
        os.truncate(weights, os.path.getsize(weights) // 2)
        config = ffi.new("pytfm_model_config *")
        assert lib.pytfm_gpt2_get_config(handle[0], config) == OK
        flat = np.empty(config.n_params, np.float32)
        st = lib.pytfm_gpt2_read(handle[0], ffi.from_buffer("float[]", flat, True), flat.size)
        assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT
        assert "model.safetensors" in last_error()
    finally:
        assert lib.pytfm_gpt2_close(handle[0]) == OK


def test_the_config_parser_is_the_python_rules(tmp_path):
    """config_from_dict is the C parser on json.dumps of the dict; the ignored fields are the C
    reader's list."""
    assert "attn_pdrop" in gpt2.IGNORED and "rope_theta" not in gpt2.IGNORED
    doc = {**TINY, **{k: None for k in sorted(gpt2.IGNORED)}, "_private": 1}
    assert gpt2.config_from_dict(doc).vocab == TINY["vocab_size"]
    raw = json.dumps(TINY).encode()
    out = ffi.new("pytfm_model_config *")
    assert lib.pytfm_gpt2_config_parse(out, raw, len(raw), b"c.json") == OK
    assert (out.vocab, out.max_seq, out.d_model, out.n_layer, out.n_head) == (100, 40, 24, 2, 3)
    raw = json.dumps({**TINY, "n_inner": 4 * 24 + 1}).encode()
    assert lib.pytfm_gpt2_config_parse(out, raw, len(raw), b"c.json") != OK
    assert last_error() == "c.json: n_inner is 97: pytfm runs GPT-2's None only"


def test_a_number_too_large_for_a_double_is_judged_alike_from_text_and_dict(tmp_path):
    """1e999 is JSON that json.loads reads as inf: where the C parser takes the text (an ignored
    field) config_from_dict takes the dict, where it refuses (the epsilon, n_ctx) both refuse,
    as a bad config rather than an OSError; NaN, which no JSON text spells, is refused."""
    out = ffi.new("pytfm_model_config *")
    for field, taken in (("attn_pdrop", True), ("layer_norm_epsilon", False), ("n_ctx", False)):
        for sign in ("", "-"):
            raw = json.dumps({**TINY, field: 0}).replace(f'"{field}": 0', f'"{field}": {sign}1e999')
            st = lib.pytfm_gpt2_config_parse(out, raw.encode(), len(raw), b"config.json")
            assert (st == OK) == taken, (raw, last_error())
            if not taken:
                assert st == lib.PYTFM_STATUS_INVALID_ARGUMENT and field in last_error()
            doc = json.loads(raw)
            assert math.isinf(doc[field])
            if taken:
                assert gpt2.config_from_dict(doc) == gpt2.config_from_dict(TINY)
            else:
                with pytest.raises(CheckpointError, match=field):
                    gpt2.config_from_dict(doc)
    with pytest.raises(CheckpointError, match="NaN"):
        gpt2.config_from_dict({**TINY, "attn_pdrop": math.nan})


def test_every_folder_is_read_clean_under_asan_and_ubsan(tmp_path):
    """tests/c_api/open_gpt2.c (the library built from its sources with ASan and UBSan) on the
    good folders (one file, shards, GPT2Model's names with the buffers) and every hostile one:
    each read both ways (pytfm_gpt2_open + read, pytfm_model_open) with the same verdict, no
    leak, no read or write out of bounds."""
    import shutil
    import subprocess

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
    exe = str(tmp_path / "open_gpt2")
    build = build_with_library(cc, [*FLAGS, *SANITIZE], os.path.join(TESTS, "c_api", "open_gpt2.c"),
                               exe)
    assert build.returncode == 0, build.stderr
    path, _ = folder_of(tmp_path)
    tensors, _ = checkpoint.load_file(os.path.join(path, "model.safetensors"))
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(os.path.join(path, "config.json"), sharded)
    names = sorted(tensors)
    wmap = {}
    for k, part in enumerate((names[:7], names[7:])):
        file = f"model-{k + 1:05d}-of-00002.safetensors"
        checkpoint.save_file(str(sharded / file), {n: tensors[n] for n in part}, {})
        wmap.update({n: file for n in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    P = TINY["n_positions"]
    bare = {k[len("transformer."):]: v for k, v in tensors.items()}
    bare.update({f"h.{i}.attn.bias": np.ones((1, 1, P, P), np.float32) for i in range(2)})
    bare["h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
    bare["lm_head.weight"] = bare["wte.weight"]
    buffers = tmp_path / "buffers"
    buffers.mkdir()
    shutil.copy(os.path.join(path, "config.json"), buffers)
    checkpoint.save_file(str(buffers / "model.safetensors"), bare, {})
    good = [path, str(sharded), str(buffers)]
    hostile = []
    for k, (change, _) in enumerate(HOSTILE):
        (tmp_path / f"h{k}").mkdir()
        hostile.append(edited(tmp_path / f"h{k}", path, **change))
    r = subprocess.run([exe, *good, *hostile], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, **ASAN_ENV))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    n = sum(p.size for p in gpt2.load(path).params.values())
    assert lines[:3] == [f"{p}: ok {n}" for p in good]
    assert all(line.startswith("rejected: ") for line in lines[3:]) and len(lines) == \
        len(good) + len(hostile)


def test_fuzzing_the_config_parser_for_a_while_finds_nothing(tmp_path_factory, tmp_path):
    """tests/c_api/fuzz/fuzz_gpt2_config.c under libFuzzer, ASan and UBSan for a bounded time
    (PYTFM_FUZZ_SECONDS, default 10), from the published GPT-2 config and the tests' own: no
    crash, leak or trap; then every input it kept is refused or taken alike by
    pytfm.gpt2.config_from_dict on json.loads of it (the same parser behind both)."""
    from test_c_checkpoint import build_fuzz_target, fuzz_for_a_while
    from test_gpt2 import GPT2_124M_CONFIG

    exe = build_fuzz_target(tmp_path_factory, "fuzz_gpt2_config")
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "gpt2-124m.json").write_text(GPT2_124M_CONFIG)
    (seeds / "tiny.json").write_text(json.dumps(dict(TINY, n_inner=96, tie_word_embeddings=False,
                                                     pruned_heads={}, _x=1, n_ctx=40)))
    kept, _ = fuzz_for_a_while(exe, tmp_path, "checkpoint.dict", str(seeds),
                               what="libFuzzer (config.json)")
    assert kept
    out = ffi.new("pytfm_model_config *")
    for path in kept:
        raw = path.read_bytes()
        took = lib.pytfm_gpt2_config_parse(out, raw, len(raw), b"config.json") == OK
        if took:  # a text the parser takes is JSON that Python reads to the same config
            cfg = gpt2.config_from_dict(json.loads(raw))
            assert (cfg.vocab, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.max_seq) == \
                (out.vocab, out.d_model, out.n_layer, out.n_head, out.max_seq)
