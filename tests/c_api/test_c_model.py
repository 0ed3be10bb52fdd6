"""The model API of pytfm.h in C (csrc/model/model.c, csrc/model/sample.c, examples/generate.c)
against pytfm.nn and pytfm.generate: logits, KV-cache sessions, the generator, sampling, errors,
threads.

C and Python call the same kernels with the same arguments, in the same order (model.c mirrors
GPT._logits op for op, row counts included), so the logits are not merely close: they are the
same bits, and the tests below assert exactly that (np.testing.assert_array_equal), at every pos
mode, tied and untied, batched and through sessions. Were a kernel ever to take another path
in C than in Python, the relative error would still have to be within 1e-5 (checked first, so
that a failure says which it is).
"""

import inspect
import math
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from helpers import ROOT, run_python, subprocess_env
from pytfm import checkpoint, data, ops
from pytfm._core import ffi, lib
from pytfm.generate import generate, sample_next
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm

OK = lib.PYTFM_STATUS_OK
INVALID = lib.PYTFM_STATUS_INVALID_ARGUMENT
OUT_OF_RANGE = lib.PYTFM_STATUS_OUT_OF_RANGE
POS = {"rope": lib.PYTFM_POS_ROPE, "sinusoidal": lib.PYTFM_POS_SINUSOIDAL,
       "none": lib.PYTFM_POS_NONE, "learned": lib.PYTFM_POS_LEARNED}


def ptr(a):
    return ffi.from_buffer({np.float32: "float[]", np.int64: "int64_t[]"}[a.dtype.type], a)


def last_error():
    return ffi.string(lib.pytfm_last_error()).decode()


class CModel:
    """A pytfm_model opened from a file (or bytes), closed on exit."""

    def __init__(self, source):
        handle = ffi.new("pytfm_model **")
        if isinstance(source, bytes):
            st = lib.pytfm_model_open_memory(handle, source, len(source), lib.PYTFM_DEVICE_CPU)
        else:
            st = lib.pytfm_model_open(handle, str(source).encode(), lib.PYTFM_DEVICE_CPU)
        assert st == OK, last_error()
        self.h = handle[0]
        config = ffi.new("pytfm_model_config *")
        assert lib.pytfm_model_get_config(self.h, config) == OK
        self.config = config[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        assert lib.pytfm_model_close(self.h) == OK

    def forward(self, tokens):  # int64 (B, T) -> (B, T, vocab)
        tokens = np.ascontiguousarray(tokens, np.int64)
        logits = np.empty(tokens.shape + (self.config.vocab,), np.float32)
        st = lib.pytfm_model_forward(self.h, ptr(logits), ptr(tokens), *tokens.shape)
        assert st == OK, last_error()
        return logits

    def session(self, max_len=0):
        return Session(self, max_len)


class Session:
    def __init__(self, model, max_len=0):
        handle = ffi.new("pytfm_session **")
        assert lib.pytfm_session_open(handle, model.h, max_len) == OK, last_error()
        self.h, self.vocab = handle[0], model.config.vocab

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        assert lib.pytfm_session_close(self.h) == OK

    def feed(self, tokens):  # int64 (n,) -> the logits (vocab,) after the last
        tokens = np.ascontiguousarray(tokens, np.int64)
        logits = np.empty(self.vocab, np.float32)
        st = lib.pytfm_session_feed(self.h, ptr(logits), ptr(tokens), tokens.size)
        assert st == OK, last_error()
        return logits

    def length(self):
        n = ffi.new("int64_t *")
        assert lib.pytfm_session_length(self.h, n) == OK
        return n[0]


def assert_same_logits(got, ref):
    """Within 1e-5 of the largest logit, then bit for bit (see the module's docstring)."""
    err = float(np.abs(got.astype(np.float64) - ref).max()) / float(np.abs(ref).max())
    assert err <= 1e-5, f"relative error {err:.3g}"
    np.testing.assert_array_equal(got, ref)


def small(pos="rope", tie=True, seed=1, **kw):
    cfg = dict(vocab=40, d_model=32, n_layer=2, n_head=4, max_seq=24, pos=pos,
               tie_embeddings=tie, seed=seed)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def saved(model, path, step=0):
    checkpoint.save(str(path), model, step=step)
    return path


CASES = [(pos, tie) for pos in POS for tie in (True, False)]


# ---- opening, and the forward pass ----------------------------------------------------------


@pytest.mark.parametrize("pos,tie", CASES)
def test_the_config_is_the_checkpoints(tmp_path, pos, tie):
    model = small(pos, tie)
    with CModel(saved(model, tmp_path / "m.safetensors", step=17)) as c:
        cfg = c.config
        assert (cfg.vocab, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.max_seq) == (40, 32, 2, 4, 24)
        assert (cfg.pos, cfg.tie_embeddings, cfg.step) == (POS[pos], int(tie), 17)
        assert cfg.n_params == model.num_params()


@pytest.mark.parametrize("pos,tie", CASES)
def test_forward_logits_are_pythons(tmp_path, pos, tie):
    model = small(pos, tie)
    rng = np.random.default_rng(0)
    with CModel(saved(model, tmp_path / "m.safetensors")) as c:
        for B, T in ((2, 1), (3, 7), (2, 16), (2, 24)):  # T = max_seq last
            tokens = rng.integers(0, 40, (B, T))
            assert_same_logits(c.forward(tokens), model.forward(tokens)[0])


def test_python_runs_with_the_c_models_constants():
    """LayerNorm's eps and RoPE's base live in pytfm_model.h; pytfm.ops takes them from there
    as the defaults pytfm.nn runs with."""
    assert (lib.PYTFM_LAYERNORM_EPS, lib.PYTFM_ROPE_BASE) == (1e-5, 10000.0)  # GPT-2's, RoPE's
    assert inspect.signature(ops.layernorm_forward).parameters["eps"].default == \
        lib.PYTFM_LAYERNORM_EPS
    for f in (ops.rope_forward, ops.rope_backward, ops.qkv_split_forward, ops.qkv_split_backward):
        assert inspect.signature(f).parameters["base"].default == lib.PYTFM_ROPE_BASE, f.__name__


def test_a_model_opened_from_memory_is_the_files(tmp_path):
    model = small("sinusoidal", False)
    path = saved(model, tmp_path / "m.safetensors")
    tokens = np.random.default_rng(1).integers(0, 40, (2, 9))
    blob = bytearray(path.read_bytes())
    with CModel(bytes(blob)) as c:
        blob[:] = b"\0" * len(blob)  # the model holds its own copy
        assert_same_logits(c.forward(tokens), model.forward(tokens)[0])


def test_a_batch_of_zero_sequences_is_a_no_op(tmp_path):
    with CModel(saved(small(), tmp_path / "m.safetensors")) as c:
        assert lib.pytfm_model_forward(c.h, ffi.NULL, ffi.NULL, 0, 5) == OK


# ---- sessions -------------------------------------------------------------------------------


def decode_in_pieces(model, tokens, pieces):
    """GPT.decode's logits after each piece of tokens (1, T), through one set of caches."""
    caches = model.new_caches(1)
    out, start = [], 0
    for n in pieces:
        out.append(model.decode(tokens[:, start:start + n], caches)[0, -1])
        start += n
    return out


@pytest.mark.parametrize("pos,tie", CASES)
@pytest.mark.parametrize("pieces", [[24], [9] + [1] * 15, [1] * 24, [5, 3, 1, 7, 8]])
def test_session_logits_are_gpt_decodes(tmp_path, pos, tie, pieces):
    model = small(pos, tie)
    tokens = np.random.default_rng(2).integers(0, 40, (1, 24))
    expected = decode_in_pieces(model, tokens, pieces)
    with CModel(saved(model, tmp_path / "m.safetensors")) as c, c.session() as s:
        start = 0
        for n, ref in zip(pieces, expected):
            assert_same_logits(s.feed(tokens[0, start:start + n]), ref)
            start += n
            assert s.length() == start


def test_a_session_continues_the_forward_pass_and_resets(tmp_path):
    model = small("rope")
    tokens = np.random.default_rng(3).integers(0, 40, (1, 12))
    with CModel(saved(model, tmp_path / "m.safetensors")) as c, c.session(12) as s:
        full = c.forward(tokens)[0]
        for _ in range(2):  # the second time after a reset, in the same caches
            got = [s.feed(tokens[0, :4])] + [s.feed(tokens[0, t:t + 1]) for t in range(4, 12)]
            # the attention of one query and the products of one row sum in another order than
            # the whole sequence's: float32 rounding apart, not bits
            for t, logits in zip(range(3, 12), got):
                np.testing.assert_allclose(logits, full[t], rtol=1e-4, atol=1e-5)
            assert lib.pytfm_session_reset(s.h) == OK and s.length() == 0
        # logits NULL only fills the caches
        assert lib.pytfm_session_feed(s.h, ffi.NULL, ptr(tokens[0, :11].copy()), 11) == OK
        assert_same_logits(s.feed(tokens[0, 11:]), decode_in_pieces(model, tokens, [11, 1])[1])


# ---- a trained model: greedy generation ------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A byte-level model trained 40 steps on a little Python (about 2 s), so that its logits
    are far from uniform and greedy choices are not near-ties; and its checkpoint."""
    text = data.encode("def f(x):\n    return x + 1\n\nclass A:\n    pass\n" * 100)
    model = GPT(GPTConfig(vocab=256, d_model=32, n_layer=2, n_head=2, max_seq=64, seed=5))
    opt = AdamW(model.params, model.grads, lr=1e-2, weight_decay=0.0)
    batches = data.Batches(text, 32, 8, seed=5)
    losses = []
    for step in range(40):
        x, y = batches.batch("train", step)
        model.zero_grad()
        losses.append(float(model.forward(x, y)[1]))
        model.backward()
        clip_grad_norm(model.grads, 1.0)
        opt.step()
    assert losses[-1] < 0.5 * losses[0], losses  # it learnt something: ln 256 = 5.5 at first
    path = tmp_path_factory.mktemp("trained") / "model.safetensors"
    checkpoint.save(str(path), model, step=40)
    return model, path


def c_generate(c, prompt, n_new, temperature=0.0, top_k=0, seed=0):
    """pytfm.generate.generate in C: one session, pytfm_sample, pytfm_rng (seed)."""
    rng = ffi.new("pytfm_rng *")
    assert lib.pytfm_rng_seed(rng, seed) == OK
    token = ffi.new("int64_t *")
    out = list(prompt)
    with c.session(len(prompt) + n_new) as s:
        logits = s.feed(np.array(prompt))
        for i in range(n_new):
            st = lib.pytfm_sample(token, ptr(logits), logits.size, temperature, top_k, rng)
            assert st == OK, last_error()
            out.append(token[0])
            if i + 1 < n_new:
                logits = s.feed(np.array([token[0]]))
    return out


def test_greedy_generation_in_c_is_pythons(trained):
    model, path = trained
    prompt = list(b"def ")
    ref = generate(model, np.array([prompt]), 60, temperature=0.0)[0].tolist()
    # the logits are sharp: greedy is not choosing among near-ties
    probs = np.exp(model.forward(np.array([ref[:-1]]))[0].astype(np.float64))
    probs /= probs.sum(axis=-1, keepdims=True)
    assert np.median(probs.max(axis=-1)) > 0.5
    with CModel(path) as c:
        assert c_generate(c, prompt, 60) == ref


@pytest.fixture(scope="module")
def generate_asan_exe(generate_exe, tmp_path_factory):
    """examples/generate.c under AddressSanitizer (the library as built): a write past a buffer
    of its own is a failure, not silent corruption."""
    import pytfm
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    env = subprocess_env(os.path.dirname(os.path.dirname(pytfm.__file__)))
    flags = subprocess.run([sys.executable, "-m", "pytfm", "--cflags", "--libs"], check=True,
                           capture_output=True, text=True, cwd="/", env=env).stdout.split()
    exe = tmp_path_factory.mktemp("generate_asan") / "generate"
    r = subprocess.run([cc, "-std=c11", "-g", "-fsanitize=address,undefined",
                        os.path.join(ROOT, "examples", "generate.c"), *flags, "-o", str(exe)],
                       capture_output=True, text=True)
    if r.returncode:
        if os.environ.get("CI"):
            pytest.fail(f"cannot build generate.c under ASan: {r.stderr[-2000:]}")
        pytest.skip("the C compiler cannot link the sanitizer runtimes here")
    return str(exe)


def run_exe(exe, *args):
    return subprocess.run([exe, *map(str, args)], capture_output=True)


def test_the_generate_example_greedy_is_sample_pys(trained, generate_exe):
    model, path = trained
    ref = generate(model, np.array([list(b"class ")]), 50, temperature=0.0)[0]
    r = run_exe(generate_exe, path, "--prompt", "class ", "--tokens", 50, "--temperature", 0,
                "--threads", 1)
    assert r.returncode == 0, r.stderr
    assert r.stdout == bytes(ref.tolist()) + b"\n"
    assert b"tokens/s" in r.stderr


def test_the_generate_example_cuts_tokens_to_the_context(trained, generate_exe):
    _, path = trained
    r = run_exe(generate_exe, path, "--tokens", 1000, "--temperature", 0)
    assert r.returncode == 0 and len(r.stdout) == 64 + 1  # max_seq bytes and a newline
    assert b"--tokens 1000 cut to 60" in r.stderr


def test_a_context_of_2_to_the_40_generates_with_sessions_sized_to_what_they_decode(
        tmp_path, generate_exe):
    # as pytfm.generate (test_model.py): caches for max_seq would be 64 TiB here
    model = GPT(GPTConfig(vocab=256, d_model=8, n_layer=1, n_head=2, max_seq=2**40, seed=3))
    path = saved(model, tmp_path / "huge.safetensors")
    ref = generate(model, np.array([list(b"ab")]), 12, temperature=0.0)[0]
    with CModel(path) as c:
        assert c.config.max_seq == 2**40
        assert c_generate(c, list(b"ab"), 12) == ref.tolist()
    r = run_exe(generate_exe, path, "--prompt", "ab", "--tokens", 12, "--temperature", 0)
    assert r.returncode == 0 and r.stdout == bytes(ref.tolist()) + b"\n", r.stderr


@pytest.mark.parametrize("max_seq", [2**61 + 8, 2**62])
def test_asking_for_a_context_past_memory_is_an_error_not_an_overflow(tmp_path,
                                                                      generate_asan_exe, max_seq):
    """A legal checkpoint (RoPE: max_seq changes no tensor) whose context, asked for whole, is
    more positions than memory holds: the session's size check says so before any buffer is
    sized from it (the token buffer's byte count used to wrap, and the prompt overflowed it)."""
    model = GPT(GPTConfig(vocab=256, d_model=16, n_layer=1, n_head=2, max_seq=max_seq, seed=4))
    path = saved(model, tmp_path / "huge.safetensors")
    r = run_exe(generate_asan_exe, path, "--prompt", "0123456789abcdefghijklmnopqrstuvwxyz",
                "--tokens", 2**63 - 1)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stdout == b""
    assert b"generate: error: pytfm_session_open" in r.stderr, r.stderr
    assert b"would pass PTRDIFF_MAX bytes" in r.stderr, r.stderr


def test_a_text_that_cannot_be_written_is_an_error(trained, generate_exe):
    _, path = trained
    with open("/dev/full", "wb") as full:
        r = subprocess.run([generate_exe, path, "--tokens", "10"], stdout=full,
                           stderr=subprocess.PIPE)
    assert r.returncode == 1 and b"cannot write the text to stdout" in r.stderr, r.stderr


@pytest.mark.parametrize("args,message", [
    ([], "the following arguments are required: checkpoint"),
    (["{path}", "--tokens", "-1"], "--tokens must be >= 0"),
    (["{path}", "--tokens", "ten"], "argument --tokens: invalid int value"),
    (["{path}", "--temperature", "-0.5"], "--temperature must be finite and >= 0"),
    (["{path}", "--temperature", "nan"], "--temperature must be finite and >= 0"),
    (["{path}", "--temperature", "1e400"], "--temperature must be finite and >= 0"),
    (["{path}", "--top-k", "-2"], "--top-k must be >= 0"),
    (["{path}", "--seed", str(2**32)], "--seed must be an integer in [0, 4294967295]"),
    (["{path}", "--threads", "-1"], "--threads must be an integer"),
    (["{path}", "--prompt", ""], "--prompt must not be empty"),
    (["{path}", "--prompt", "x" * 65], "--prompt is 65 bytes, longer than the model's context"),
    (["{path}", "--tokens"], "argument --tokens: expected one argument"),
    (["{path}", "--frobnicate", "1"], "unrecognized argument: --frobnicate"),
    (["{path}", "{path}"], "unrecognized argument"),
    (["{tmp}/missing.safetensors"], "checkpoint: there is no file"),
    (["{tmp}"], "is a folder (did you mean"),
    (["{tmp}/junk"], "checkpoint: "),
    (["{tmp}/vocab40"], "a vocabulary of 40 tokens, not the 256 bytes"),
])
def test_the_generate_example_refuses_bad_flags_and_files(trained, generate_exe, tmp_path,
                                                          args, message):
    _, path = trained
    shutil.copy(path, tmp_path / "model.safetensors")
    (tmp_path / "junk").write_bytes(b"not a checkpoint at all")
    saved(small(), tmp_path / "vocab40")
    r = run_exe(generate_exe, *(a.format(path=path, tmp=tmp_path) for a in args))
    assert r.returncode == 2, r
    err = r.stderr.decode()
    assert err.startswith("usage: generate CHECKPOINT") and message in err, err
    assert r.stdout == b""


def test_seeded_sampling_is_reproducible(trained, generate_exe):
    _, path = trained
    with CModel(path) as c:
        a = c_generate(c, list(b"def "), 40, temperature=1.0, top_k=0, seed=7)
        assert a == c_generate(c, list(b"def "), 40, temperature=1.0, top_k=0, seed=7)
        assert a != c_generate(c, list(b"def "), 40, temperature=1.0, top_k=0, seed=8)
    runs = [run_exe(generate_exe, path, "--seed", s, "--temperature", 1.5, "--top-k", 0).stdout
            for s in (3, 3, 4)]
    assert runs[0] == runs[1] != runs[2]
    with CModel(path) as c:  # the example is this loop
        assert runs[0] == bytes(c_generate(c, list(b"def "), 60, 1.5, 0, 3)) + b"\n"


# ---- the generator and sampling -------------------------------------------------------------

M64 = 2**64 - 1


def splitmix64(x):  # -> (new x, output), as pytfm.h describes it
    x = (x + 0x9E3779B97F4A7C15) & M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return x, z ^ (z >> 31)


def xoshiro256ss(s):  # the next output; s (a list of four) updated, as Blackman and Vigna
    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & M64

    result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
    t = (s[1] << 17) & M64
    s[2] ^= s[0]
    s[3] ^= s[1]
    s[1] ^= s[2]
    s[0] ^= s[3]
    s[2] ^= t
    s[3] = rotl(s[3], 45)
    return result


def c_stream(rng, count):
    value = ffi.new("uint64_t *")
    out = []
    for _ in range(count):
        assert lib.pytfm_rng_next(rng, value) == OK
        out.append(value[0])
    return out


def test_the_generator_is_xoshiro256ss_seeded_by_splitmix64():
    rng = ffi.new("pytfm_rng *")
    # published values: SplitMix64's first output from 0; xoshiro256** from the state 1, 2, 3, 4
    # (the test vector of the rand_xoshiro crate, from the reference C code)
    assert lib.pytfm_rng_seed(rng, 0) == OK and rng.state[0] == 0xE220A8397B1DCDAF
    rng.state[0:4] = [1, 2, 3, 4]
    assert c_stream(rng, 10) == [
        11520, 0, 1509978240, 1215971899390074240, 1216172134540287360, 607988272756665600,
        16172922978634559625, 8476171486693032832, 10595114339597558777, 2904607092377533576]
    for seed in (0, 1, 42, 2**32 - 1, 2**63, M64):
        x, state = seed, []
        for _ in range(4):
            x, z = splitmix64(x)
            state.append(z)
        assert lib.pytfm_rng_seed(rng, seed) == OK and list(rng.state) == state
        assert c_stream(rng, 500) == [xoshiro256ss(state) for _ in range(500)]


class FixedU:
    """A stand-in for numpy's Generator in sample_next: random() returns u."""

    def __init__(self, u):
        self.u = u

    def random(self, shape):
        return np.full(shape, self.u)


def c_sample(logits, temperature, top_k, rng):
    token = ffi.new("int64_t *")
    st = lib.pytfm_sample(token, ptr(logits), logits.size, temperature, top_k, rng)
    assert st == OK, last_error()
    return token[0]


def test_sampling_picks_sample_nexts_token_for_the_same_u():
    rng = ffi.new("pytfm_rng *")
    lib.pytfm_rng_seed(rng, 11)
    draws = np.random.default_rng(4)
    cases = 0
    for vocab in (1, 2, 7, 40, 256, 300):
        for temperature in (1.0, 0.5, 2.0, 1e-3, 30.0):  # float32 values: C takes a float
            for top_k in (0, 1, 3, vocab - 1, vocab, vocab + 5):
                logits = (draws.standard_normal(vocab) * 3).astype(np.float32)
                if vocab > 5:  # ties, at the k-th largest among them
                    logits[draws.integers(0, vocab, 4)] = np.sort(logits)[-3]
                ahead = ffi.new("pytfm_rng *", {"state": list(rng.state)})  # the u C will draw
                u = (c_stream(ahead, 1)[0] >> 11) * 2.0**-53
                k = top_k if 0 < top_k < vocab else None
                ref = int(sample_next(logits[None], FixedU(u), temperature, k)[0])
                assert c_sample(logits, temperature, top_k, rng) == ref, (vocab, temperature, k)
                assert list(rng.state) == list(ahead.state)  # one number per draw
                cases += 1
    assert cases == 6 * 5 * 6


def test_greedy_sampling_is_the_first_argmax_and_draws_nothing():
    logits = np.array([0.5, 3.0, -1.0, 3.0], np.float32)
    rng = ffi.new("pytfm_rng *")
    lib.pytfm_rng_seed(rng, 5)
    before = list(rng.state)
    assert c_sample(logits, 0.0, 0, rng) == 1 and list(rng.state) == before
    assert c_sample(logits, 0.0, 2, ffi.NULL) == 1  # no generator needed


def test_top_k_keeps_the_ties_of_the_kth_and_nothing_below():
    logits = np.array([1.0, 5.0, 3.0, 3.0, 0.0, 3.0, -2.0], np.float32)
    rng = ffi.new("pytfm_rng *")
    lib.pytfm_rng_seed(rng, 1)
    seen = {c_sample(logits, 5.0, 2, rng) for _ in range(2000)}
    assert seen == {1, 2, 3, 5}  # the 2nd largest is 3.0, held by three logits


def test_sampled_frequencies_follow_the_softmax():
    # With a fixed seed the test is deterministic. If pytfm_sample draws from p, each count n_i
    # of N draws is Binomial(N, p_i): |n_i/N − p_i| exceeds 5·sqrt(p_i(1 − p_i)/N) with
    # probability under 6e-7 (normal tail, 5σ) per token, so a correct sampler passes for all
    # but a negligible share of seeds. A wrong one does not: at N = 40000 the bound is at most
    # 5·0.5/200 = 0.0125, while an off-by-one in the cumulative search moves every p_i by
    # p_{i±1} (0.02 and more here), and a temperature ignored or applied twice moves the top
    # probability by more than 0.1.
    logits = np.array([2.0, 0.5, -1.0, 1.5, 0.0, -3.0, 1.0, 0.2], np.float32)
    N = 40000
    rng = ffi.new("pytfm_rng *")
    for temperature, top_k in ((1.0, 0), (0.7, 0), (2.0, 4)):
        lib.pytfm_rng_seed(rng, 2024)
        z = logits.astype(np.float64) / temperature
        if top_k:
            z[z < np.sort(z)[-top_k]] = -np.inf
        p = np.exp(z - z.max())
        p /= p.sum()
        counts = np.bincount([c_sample(logits, temperature, top_k, rng) for _ in range(N)],
                             minlength=logits.size)
        bound = 5 * np.sqrt(p * (1 - p) / N)
        assert np.all(np.abs(counts / N - p) <= bound), (temperature, top_k, counts / N, p)
        assert np.all(counts[p == 0] == 0)


# ---- errors ---------------------------------------------------------------------------------


@pytest.fixture
def opened(tmp_path):
    with CModel(saved(small(), tmp_path / "m.safetensors")) as c:
        yield c


def test_opening_fails_clearly(tmp_path):
    path = str(saved(small(), tmp_path / "m.safetensors")).encode()
    handle = ffi.new("pytfm_model **")
    blob = open(path, "rb").read()
    count = ffi.new("int32_t *")
    gpu = lib.pytfm_cuda_device_count(count) == OK and count[0] > 0  # then CUDA opens
    for device, name in ((lib.PYTFM_DEVICE_CUDA, "PYTFM_DEVICE_CUDA"), (7, "device"))[gpu:]:
        handle[0] = ffi.cast("pytfm_model *", 1)
        assert lib.pytfm_model_open(handle, path, device) == lib.PYTFM_STATUS_NOT_SUPPORTED
        assert handle[0] == ffi.NULL and last_error().startswith("pytfm_model_open: device")
        assert name in last_error()
        handle[0] = ffi.cast("pytfm_model *", 1)
        st = lib.pytfm_model_open_memory(handle, blob, len(blob), device)
        assert st == lib.PYTFM_STATUS_NOT_SUPPORTED and handle[0] == ffi.NULL
        assert last_error().startswith("pytfm_model_open_memory: device")
    assert lib.pytfm_model_open(ffi.NULL, path, 0) == INVALID
    assert last_error() == "pytfm_model_open: model must not be NULL"
    assert lib.pytfm_model_open(handle, ffi.NULL, 0) == INVALID and handle[0] == ffi.NULL
    assert last_error() == "pytfm_model_open: path must not be NULL"
    assert lib.pytfm_model_open_memory(handle, ffi.NULL, 10, 0) == INVALID
    assert last_error() == "pytfm_model_open_memory: data must not be NULL"
    missing = str(tmp_path / "missing.safetensors").encode()
    assert lib.pytfm_model_open(handle, missing, 0) != OK and handle[0] == ffi.NULL
    assert "missing.safetensors" in last_error()
    assert lib.pytfm_model_close(ffi.NULL) == OK
    config = ffi.new("pytfm_model_config *")
    assert lib.pytfm_model_get_config(ffi.NULL, config) == INVALID
    assert last_error() == "pytfm_model_get_config: model must not be NULL"


def test_forward_rejects_bad_arguments_before_writing(opened):
    c = opened
    tokens = np.arange(10, dtype=np.int64).reshape(2, 5)
    logits = np.full((2, 5, 40), 7.0, np.float32)
    logits_p, tokens_p = ptr(logits), ptr(tokens)

    def call(model=c.h, out=logits_p, tok=tokens_p, B=2, T=5):
        return lib.pytfm_model_forward(model, out, tok, B, T)

    assert call(model=ffi.NULL) == INVALID
    assert last_error() == "pytfm_model_forward: model must not be NULL"
    assert call(out=ffi.NULL) == INVALID
    assert last_error() == "pytfm_model_forward: logits must not be NULL"
    assert call(tok=ffi.NULL) == INVALID
    assert last_error() == "pytfm_model_forward: tokens must not be NULL"
    assert call(B=-1) == INVALID and last_error() == "pytfm_model_forward: B must be >= 0, got -1"
    for T in (0, 25):
        assert call(T=T) == INVALID
        assert last_error() == f"pytfm_model_forward: T must be in [1, max_seq = 24], got {T}"
    assert call(B=2**60) == INVALID and "pytfm_model_forward: B, T, vocab = " in last_error()
    overlapping = ffi.cast("float *", ptr(tokens))
    assert call(out=overlapping, B=1, T=2) == INVALID
    assert last_error() == "pytfm_model_forward: logits and tokens must not share memory"
    for bad in (40, -1, 2**62):
        tokens[1, 3] = bad
        assert call() == OUT_OF_RANGE
        assert last_error() == f"pytfm_model_forward: tokens[8] = {bad} is outside [0, 40)"
    assert np.all(logits == 7.0)  # nothing written


def test_sessions_reject_bad_arguments_and_a_failed_feed_changes_nothing(tmp_path):
    model = small("rope")
    tokens = np.random.default_rng(6).integers(0, 40, 10)
    with CModel(saved(model, tmp_path / "m.safetensors")) as c:
        handle = ffi.new("pytfm_session **")
        for max_len in (-1, 25):
            handle[0] = ffi.cast("pytfm_session *", 1)
            assert lib.pytfm_session_open(handle, c.h, max_len) == INVALID
            assert handle[0] == ffi.NULL
            assert last_error() == ("pytfm_session_open: max_len must be in [1, max_seq = 24], "
                                    f"or 0 for max_seq; got {max_len}")
        assert lib.pytfm_session_open(handle, ffi.NULL, 0) == INVALID
        assert last_error() == "pytfm_session_open: model must not be NULL"
        assert lib.pytfm_session_open(ffi.NULL, c.h, 0) == INVALID
        assert last_error() == "pytfm_session_open: session must not be NULL"
        assert lib.pytfm_session_close(ffi.NULL) == OK

        caches = model.new_caches(1, 8)
        with c.session(8) as s:
            logits = np.full(40, 7.0, np.float32)
            logits_p = ptr(logits)

            def feed(tok, n=None, session=s.h, out=logits_p):
                tok = np.ascontiguousarray(tok, np.int64)
                return lib.pytfm_session_feed(session, out, ptr(tok), tok.size if n is None
                                              else n)

            assert_same_logits(s.feed(tokens[:5]), model.decode(tokens[None, :5], caches)[0, -1])
            assert feed(tokens[5:9]) == INVALID  # 5 + 4 > 8
            assert last_error() == ("pytfm_session_feed: n = 4 tokens do not fit: the session "
                                    "holds 5 of max_len = 8 (pytfm_session_reset, or open a "
                                    "longer session)")
            bad = tokens[5:8].copy()
            bad[1] = 40
            assert feed(bad) == OUT_OF_RANGE
            assert last_error() == "pytfm_session_feed: tokens[1] = 40 is outside [0, 40)"
            assert feed(tokens[5:6], n=0) == INVALID
            assert last_error() == "pytfm_session_feed: n must be >= 1, got 0"
            assert lib.pytfm_session_feed(s.h, ptr(logits), ffi.NULL, 1) == INVALID
            assert last_error() == "pytfm_session_feed: tokens must not be NULL"
            assert feed(tokens[5:6], session=ffi.NULL) == INVALID
            assert last_error() == "pytfm_session_feed: session must not be NULL"
            assert feed(tokens[5:6], n=2**62) == INVALID
            assert np.all(logits == 7.0) and s.length() == 5  # nothing written, nothing fed
            # the next valid feed sees the five tokens, as if the failures never happened
            assert_same_logits(s.feed(tokens[5:8]), model.decode(tokens[None, 5:8], caches)[0, -1])
            assert s.length() == 8
            n = ffi.new("int64_t *")
            assert lib.pytfm_session_length(s.h, ffi.NULL) == INVALID
            assert last_error() == "pytfm_session_length: length must not be NULL"
            assert lib.pytfm_session_length(ffi.NULL, n) == INVALID
            assert lib.pytfm_session_reset(ffi.NULL) == INVALID
            assert last_error() == "pytfm_session_reset: session must not be NULL"


def test_sampling_rejects_bad_arguments_and_draws_nothing():
    logits = np.array([0.0, 1.0, 2.0], np.float32)
    token = ffi.new("int64_t *", -5)
    rng = ffi.new("pytfm_rng *")
    lib.pytfm_rng_seed(rng, 3)
    before = list(rng.state)
    logits_p = ptr(logits)

    def call(tok=token, lg=logits_p, vocab=3, temperature=1.0, top_k=0, r=rng):
        return lib.pytfm_sample(tok, lg, vocab, temperature, top_k, r)

    cases = [
        (dict(tok=ffi.NULL), "pytfm_sample: token must not be NULL"),
        (dict(lg=ffi.NULL), "pytfm_sample: logits must not be NULL"),
        (dict(vocab=0), "pytfm_sample: vocab must be >= 1, got 0"),
        (dict(temperature=-1.0), "pytfm_sample: temperature must be finite and >= 0 (0: greedy), "
                                 "got -1"),
        (dict(temperature=math.inf), "pytfm_sample: temperature must be finite"),
        (dict(temperature=math.nan), "pytfm_sample: temperature must be finite"),
        (dict(r=ffi.NULL), "pytfm_sample: rng must not be NULL when temperature > 0"),
        (dict(tok=ffi.cast("int64_t *", ptr(logits))),
         "pytfm_sample: token and logits must not share memory"),
    ]
    for kwargs, message in cases:
        assert call(**kwargs) == INVALID, kwargs
        assert last_error().startswith(message), (last_error(), message)
    for value in (math.nan, math.inf, -math.inf):
        logits[1] = value
        for temperature in (0.0, 1.0):
            assert call(temperature=temperature) == INVALID
            assert last_error() == f"pytfm_sample: logits must be finite, got logits[1] = {value}"
    assert token[0] == -5 and list(rng.state) == before
    assert lib.pytfm_rng_seed(ffi.NULL, 1) == INVALID
    assert last_error() == "pytfm_rng_seed: rng must not be NULL"
    assert lib.pytfm_rng_next(rng, ffi.NULL) == INVALID
    assert last_error() == "pytfm_rng_next: value must not be NULL"


# ---- threads --------------------------------------------------------------------------------


def test_threads_sharing_one_model_get_one_threads_results(trained):
    _, path = trained
    prompts = [list(b"def "), list(b"class "), list(b"    ret"), list(b"x")]
    tokens = np.random.default_rng(7).integers(0, 256, (3, 40))
    with CModel(path) as c:
        serial = [c_generate(c, p, 30, 1.0, 20, seed=i) for i, p in enumerate(prompts)]
        serial_forward = c.forward(tokens)
        results, errors = {}, []
        start = threading.Barrier(len(prompts))

        def work(i):
            try:
                start.wait()
                for _ in range(3):  # cffi releases the GIL: the calls overlap
                    got = c_generate(c, prompts[i], 30, 1.0, 20, seed=i)
                    assert got == serial[i]
                    np.testing.assert_array_equal(c.forward(tokens), serial_forward)
                results[i] = got
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert results == dict(enumerate(serial))


def test_results_are_the_same_bits_at_one_and_three_threads(tmp_path):
    # d_model 256: a one-token feed's larger products (c_fc: 1024 x 256) pass linear.c's
    # threshold for a parallel matrix-vector product, so the threaded paths run too
    path = saved(small("rope", False, d_model=256, n_layer=1, max_seq=64),
                 tmp_path / "m.safetensors")
    code = f"""
        import numpy as np
        from pytfm._core import ffi, lib
        h = ffi.new("pytfm_model **")
        assert lib.pytfm_model_open(h, {str(path).encode()!r}, 0) == 0
        tokens = np.random.default_rng(8).integers(0, 40, (4, 64))
        logits = np.empty((4, 64, 40), np.float32)
        p = lambda a: ffi.from_buffer("float[]" if a.dtype == np.float32 else "int64_t[]", a)
        assert lib.pytfm_model_forward(h[0], p(logits), p(tokens), 4, 64) == 0
        s = ffi.new("pytfm_session **")
        assert lib.pytfm_session_open(s, h[0], 0) == 0
        last = np.empty(40, np.float32)
        out = [logits]
        for piece in (tokens[0, :40], tokens[0, 40:41], tokens[0, 41:]):
            piece = piece.copy()
            assert lib.pytfm_session_feed(s[0], p(last), p(piece), piece.size) == 0
            out.append(last.copy())
        import hashlib
        print(hashlib.sha256(b"".join(a.tobytes() for a in out)).hexdigest())
    """
    digests = {}
    for threads in (1, 3):
        r = run_python(code, PYTFM_NUM_THREADS=threads)
        assert r.returncode == 0, r.stderr[-3000:]
        digests[threads] = r.stdout.strip()
    assert digests[1] == digests[3], digests
