"""The C model API on PYTFM_DEVICE_CUDA (csrc/model/model_cuda.c) without a GPU: libpytfm as a
CUDA build makes it, its kernels compiled for the emulator (tests/cuda_emu.build_full), opens
a checkpoint on the "GPU" and runs its forward and its sessions on the CUDA twins. Against the
same library's model on the CPU: the logits to float32 rounding (the twins sum in other
orders), the same tokens greedily, and against pytfm.generate's. Every byte of device memory
it allocates is freed. tests/cuda/test_cuda_gpu_model.py runs the same on a real GPU.
"""

import numpy as np
import pytest

import cuda_emu
from pytfm import checkpoint
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig

EPS32 = float(np.finfo(np.float32).eps)
CONFIGS = {
    "rope-tied": GPTConfig(vocab=40, d_model=32, n_layer=2, n_head=2, max_seq=24),
    "sinusoidal-untied": GPTConfig(vocab=40, d_model=32, n_layer=2, n_head=4, max_seq=24,
                                   pos="sinusoidal", tie_embeddings=False, seed=1),
    "none-odd-head-dim": GPTConfig(vocab=37, d_model=30, n_layer=1, n_head=2, max_seq=24,
                                   pos="none", seed=2),  # head dim 15
    "learned-tied": GPTConfig(vocab=40, d_model=32, n_layer=2, n_head=4, max_seq=24,
                              pos="learned", seed=3),
    # the Llama family: grouped-query heads with q, k, v biases and a window shorter than the
    # sequence; multi-query heads with the q/k norm, a head_dim not d_model / n_head, llama3
    "llama-gqa-bias-window": GPTConfig(arch="llama", vocab=40, d_model=32, n_layer=2, n_head=4,
                                       n_kv_head=2, d_ff=40, max_seq=24, qkv_bias=True,
                                       sliding_window=5, seed=4),
    "llama-mqa-qknorm-llama3": GPTConfig(
        arch="llama", vocab=40, d_model=32, n_layer=2, n_head=4, n_kv_head=1, head_dim=12,
        d_ff=24, max_seq=24, qk_norm=True, tie_embeddings=False, rope_theta=500000.0,
        rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0, rope_original_max_pos=8.0, seed=5),
}


@pytest.fixture(scope="module")
def full(emu):
    """The CUDA build's library on the emulator (the kernels' objects of `emu` reused)."""
    return cuda_emu.Emu(cuda_emu.build_full(emu.dir), full=True)


class Lib:
    """The model API of one library through its cffi ABI handle (an Emu)."""

    def __init__(self, emu):
        self.ffi, self.lib = emu.ffi, emu.lib

    def error(self):
        return self.ffi.string(self.lib.pytfm_last_error()).decode()

    def ok(self, status):
        assert status == self.lib.PYTFM_STATUS_OK, self.error()

    def p(self, a):
        return self.ffi.cast({np.float32: "float *", np.int64: "int64_t *"}[a.dtype.type],
                             a.ctypes.data)

    def open(self, path, device):
        h = self.ffi.new("pytfm_model **")
        self.ok(self.lib.pytfm_model_open(h, str(path).encode(), device))
        return h[0]

    def forward(self, m, tokens, vocab):
        tokens = np.ascontiguousarray(tokens, np.int64)
        logits = np.full(tokens.shape + (vocab,), np.nan, np.float32)
        self.ok(self.lib.pytfm_model_forward(m, self.p(logits), self.p(tokens), *tokens.shape))
        return logits

    def greedy(self, m, prompt, n, vocab):
        """Feed prompt, then n tokens each the argmax of the logits before it (pytfm_sample at
        temperature 0). -> (the tokens, the logits of each step)"""
        h = self.ffi.new("pytfm_session **")
        self.ok(self.lib.pytfm_session_open(h, m, 0))
        s, out, seen = h[0], [], []
        try:
            feed = np.asarray(prompt, np.int64)
            token = self.ffi.new("int64_t *")
            for _ in range(n):
                logits = np.full(vocab, np.nan, np.float32)
                self.ok(self.lib.pytfm_session_feed(s, self.p(logits), self.p(feed), feed.size))
                self.ok(self.lib.pytfm_sample(token, self.p(logits), vocab, 0.0, 0,
                                              self.ffi.NULL))
                seen.append(logits)
                out.append(token[0])
                feed = np.array([token[0]], np.int64)
        finally:
            self.ok(self.lib.pytfm_session_close(s))
        return np.array(out), np.array(seen)


def saved(cfg, tmp_path):
    model = GPT(cfg)
    path = tmp_path / "m.safetensors"
    checkpoint.save(path, model)
    return model, path


def close_to(name, gpu, cpu):
    """float32 rounding through the layers: 16 eps of the largest logit (2.2 seen)"""
    err = float(np.abs(gpu.astype(np.float64) - cpu).max())
    bound = 16 * EPS32 * float(np.abs(cpu).max())
    assert np.isfinite(gpu).all() and err <= bound, f"{name}: max error {err:.3g} over {bound:.3g}"


@pytest.mark.parametrize("name", CONFIGS)
def test_the_model_on_the_gpu_gives_the_cpu_models_logits_and_greedy_tokens(full, tmp_path,
                                                                            name):
    cfg = CONFIGS[name]
    model, path = saved(cfg, tmp_path)
    lib = Lib(full)
    before = full.counters()
    cpu, gpu = lib.open(path, lib.lib.PYTFM_DEVICE_CPU), lib.open(path, lib.lib.PYTFM_DEVICE_CUDA)
    uploaded = full.counters()
    assert uploaded["malloc"] - before["malloc"] == 1  # the parameters, in one allocation
    try:
        config = lib.ffi.new("pytfm_model_config *")
        lib.ok(lib.lib.pytfm_model_get_config(gpu, config))
        assert config.vocab == cfg.vocab and config.n_params == model.num_params()
        tokens = np.random.default_rng(0).integers(0, cfg.vocab, (3, cfg.max_seq))
        want = lib.forward(cpu, tokens, cfg.vocab)
        launched = full.counters()["launches"]
        got = lib.forward(gpu, tokens, cfg.vocab)
        assert full.counters()["launches"] > launched, "the forward ran on the twins"
        close_to(f"{name} forward", got, want)
        close_to(f"{name} forward, one row", lib.forward(gpu, tokens[1:2, :7], cfg.vocab),
                 want[1:2, :7])
        prompt = [1, 2, 3, 4, 5]
        want_tokens, want_logits = lib.greedy(cpu, prompt, 12, cfg.vocab)
        got_tokens, got_logits = lib.greedy(gpu, prompt, 12, cfg.vocab)
        np.testing.assert_array_equal(got_tokens, want_tokens)
        close_to(f"{name} session", got_logits, want_logits)
        python = generate(model, np.array([prompt]), 12, temperature=0)[0, len(prompt):]
        np.testing.assert_array_equal(got_tokens, python)
    finally:
        lib.ok(lib.lib.pytfm_model_close(gpu))
        lib.ok(lib.lib.pytfm_model_close(cpu))
    after = full.counters()
    for alloc, free in (("malloc", "free"), ("malloc_async", "free_async")):
        assert after[alloc] - before[alloc] == after[free] - before[free], (alloc, after)


def test_a_session_on_the_gpu_resets_and_feeds_without_logits(full, tmp_path):
    cfg = CONFIGS["rope-tied"]
    _, path = saved(cfg, tmp_path)
    lib = Lib(full)
    blob = path.read_bytes()
    h = lib.ffi.new("pytfm_model **")
    lib.ok(lib.lib.pytfm_model_open_memory(h, blob, len(blob), lib.lib.PYTFM_DEVICE_CUDA))
    m = h[0]
    cpu = lib.open(path, lib.lib.PYTFM_DEVICE_CPU)
    s = lib.ffi.new("pytfm_session **")
    lib.ok(lib.lib.pytfm_session_open(s, m, 10))
    session = s[0]
    try:
        tokens = np.arange(1, 10, dtype=np.int64)
        lib.ok(lib.lib.pytfm_session_feed(session, lib.ffi.NULL, lib.p(tokens), 4))  # no logits
        last = np.zeros(cfg.vocab, np.float32)
        lib.ok(lib.lib.pytfm_session_feed(session, lib.p(last), lib.p(tokens[4:]), 5))
        close_to("fed 4 then 5", last, lib.forward(cpu, tokens[None], cfg.vocab)[0, -1])
        length = lib.ffi.new("int64_t *")
        lib.ok(lib.lib.pytfm_session_length(session, length))
        assert length[0] == 9
        too_many = np.zeros(2, np.int64)
        assert lib.lib.pytfm_session_feed(session, lib.p(last), lib.p(too_many), 2) == \
            lib.lib.PYTFM_STATUS_INVALID_ARGUMENT
        bad = np.array([cfg.vocab], np.int64)
        assert lib.lib.pytfm_session_feed(session, lib.p(last), lib.p(bad), 1) == \
            lib.lib.PYTFM_STATUS_OUT_OF_RANGE
        assert "tokens[0] = 40" in lib.error()
        lib.ok(lib.lib.pytfm_session_reset(session))
        lib.ok(lib.lib.pytfm_session_feed(session, lib.p(last), lib.p(tokens), 3))
        close_to("after a reset", last, lib.forward(cpu, tokens[None, :3], cfg.vocab)[0, -1])
        bad_batch = np.zeros((2, 3), np.int64)
        bad_batch[1, 1] = -1
        logits = np.zeros((2, 3, cfg.vocab), np.float32)
        assert lib.lib.pytfm_model_forward(m, lib.p(logits), lib.p(bad_batch), 2, 3) == \
            lib.lib.PYTFM_STATUS_OUT_OF_RANGE and not logits.any()  # nothing written
    finally:
        lib.ok(lib.lib.pytfm_session_close(session))
        lib.ok(lib.lib.pytfm_model_close(m))
        lib.ok(lib.lib.pytfm_model_close(cpu))


def test_a_model_on_the_gpu_computes_in_fp32_only(full, tmp_path):
    _, path = saved(CONFIGS["rope-tied"], tmp_path)
    lib = Lib(full)
    m = lib.open(path, lib.lib.PYTFM_DEVICE_CUDA)
    try:
        lib.ok(lib.lib.pytfm_model_set_precision(m, lib.lib.PYTFM_PRECISION_FP32))
        assert lib.lib.pytfm_model_set_precision(m, lib.lib.PYTFM_PRECISION_BF16) == \
            lib.lib.PYTFM_STATUS_NOT_SUPPORTED
        assert "FP32 only" in lib.error()
        assert lib.lib.pytfm_model_set_precision(m, lib.lib.PYTFM_PRECISION_INT8) == \
            lib.lib.PYTFM_STATUS_NOT_SUPPORTED
        assert "FP32 only (PYTFM_PRECISION_INT8 runs on the CPU: open the model on " \
            "PYTFM_DEVICE_CPU)" in lib.error()
        precision = lib.ffi.new("int32_t *")
        lib.ok(lib.lib.pytfm_model_get_precision(m, precision))
        assert precision[0] == lib.lib.PYTFM_PRECISION_FP32
    finally:
        lib.ok(lib.lib.pytfm_model_close(m))


@pytest.mark.parametrize("name", ["llama-gqa-bias-window", "llama-mqa-qknorm-llama3"])
def test_a_bfloat16_folder_on_the_gpu_is_widened_to_fp32(full, tmp_path, name):
    """A folder the CPU keeps in BF16 (test_c_llama_bf16.py) is widened as it is uploaded:
    the GPU's model computes in FP32, the logits those of the CPU's model in FP32."""
    from pytfm import llama

    cfg = CONFIGS[name]
    path = tmp_path / "bf16"
    llama.save(str(path), cfg, GPT(cfg).params, dtype="bfloat16")
    lib = Lib(full)
    before = full.counters()
    cpu, gpu = lib.open(path, lib.lib.PYTFM_DEVICE_CPU), lib.open(path, lib.lib.PYTFM_DEVICE_CUDA)
    assert full.counters()["malloc"] - before["malloc"] == 1  # the parameters, in float32
    try:
        precision = lib.ffi.new("int32_t *")
        lib.ok(lib.lib.pytfm_model_get_precision(cpu, precision))
        assert precision[0] == lib.lib.PYTFM_PRECISION_BF16
        lib.ok(lib.lib.pytfm_model_get_precision(gpu, precision))
        assert precision[0] == lib.lib.PYTFM_PRECISION_FP32
        lib.ok(lib.lib.pytfm_model_set_precision(cpu, lib.lib.PYTFM_PRECISION_FP32))
        tokens = np.random.default_rng(0).integers(0, cfg.vocab, (2, cfg.max_seq))
        close_to(f"{name} forward", lib.forward(gpu, tokens, cfg.vocab),
                 lib.forward(cpu, tokens, cfg.vocab))
        want_tokens, want_logits = lib.greedy(cpu, [1, 2, 3], 8, cfg.vocab)
        got_tokens, got_logits = lib.greedy(gpu, [1, 2, 3], 8, cfg.vocab)
        np.testing.assert_array_equal(got_tokens, want_tokens)
        close_to(f"{name} session", got_logits, want_logits)
    finally:
        lib.ok(lib.lib.pytfm_model_close(gpu))
        lib.ok(lib.lib.pytfm_model_close(cpu))
    after = full.counters()
    assert after["malloc"] - before["malloc"] == after["free"] - before["free"]
