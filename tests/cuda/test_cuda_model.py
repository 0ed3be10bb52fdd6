"""The whole GPT on the GPU path, without a GPU: pytfm.nn, optim, generate, kvcache and
checkpoint on the stand-in cupy (tests/fake_cupy.py, strict: a NumPy array mixed into device
code is a TypeError, as with CuPy), every op answered by the CUDA kernels of cuda/ built for
the CPU emulator. Each result is compared with the CPU model's on the same inputs; the
emulated kernels sum in other orders than the C ones, so values agree to float32 rounding,
and where nothing is summed (initialisation, checkpoints, the clip's scale) bit for bit.
Also the clear errors when the GPU cannot be used. tests/cuda/test_cuda_gpu_model.py runs the same
on a real GPU.

Sizes are tiny: the emulator runs each CUDA thread as a fiber.
"""

import math
import sys

import numpy as np
import pytest

import fake_cupy
import pytfm
from helpers import run_train_tiny
from pytfm import checkpoint, ops
from pytfm import device as devices
from pytfm.cli import train as cli
from pytfm.generate import generate
from pytfm.kvcache import KVCache
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm

EPS32 = float(np.finfo(np.float32).eps)
TINY = GPTConfig(vocab=32, d_model=32, n_layer=2, n_head=2, max_seq=12)
CONFIGS = {
    "rope-tied": TINY,
    "sinusoidal-untied": GPTConfig(vocab=32, d_model=32, n_layer=2, n_head=2, max_seq=12,
                                   pos="sinusoidal", tie_embeddings=False, seed=1),
    "none-odd-head-dim": GPTConfig(vocab=29, d_model=30, n_layer=2, n_head=2, max_seq=12,
                                   pos="none", seed=2),  # head dim 15
}


@pytest.fixture
def cp(emu, monkeypatch):
    """The strict stand-in cupy, with pytfm._core.lib the emulator's (fake_cupy.install)."""
    return fake_cupy.install(monkeypatch, emu, strict=True)


def batch(cfg, seed=0, B=2, T=12):
    """Token ids and targets (B, T) on the host, two targets ignored (-1)."""
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, cfg.vocab, (B, T)), rng.integers(0, cfg.vocab, (B, T))
    y[0, 3] = y[1, -1] = -1
    return x, y


def host(a):
    """A device array's values, for comparing (a read the tests do, not the model)."""
    return fake_cupy._asnumpy(a)


def assert_close(name, got, want, atol):
    """got (a device array) within atol of want (a host array) everywhere."""
    got = host(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape)
    err = float(np.abs(got.astype(np.float64) - want).max(initial=0.0))
    assert err <= atol, f"{name}: max error {err:.3g} over {atol:.3g}"


def step(model, x, y, max_norm=None, opt=None, lr=None, check_ids=True):
    """zero_grad, forward, backward (then the clip and the optimizer step when asked) ->
    (loss, norm or None)."""
    model.zero_grad()
    _, loss = model.forward(x, y, check_ids=check_ids)
    model.backward()
    norm = clip_grad_norm(model.grads, max_norm) if max_norm is not None else None
    if opt is not None:
        opt.step(lr)
    return loss, norm


def on_device(cp, *arrays):
    return [cp.asarray(a) for a in arrays]


# ---- training --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_a_training_step_gives_the_cpu_models_loss_and_gradients(cp, name):
    cfg = CONFIGS[name]
    cpu, gpu = GPT(cfg), GPT(cfg, device="cuda")
    assert gpu.device == "cuda" and cpu.device == "cpu"
    assert type(gpu.params.buffer) is cp.ndarray and type(gpu.grads.buffer) is cp.ndarray
    # drawn on the host from one seed, copied over: the same bits
    np.testing.assert_array_equal(host(gpu.params.buffer), cpu.params.buffer)
    x, y = batch(cfg)
    cpu_loss, _ = step(cpu, x, y)
    gpu_loss, _ = step(gpu, *on_device(cp, x, y))
    assert type(gpu_loss) is cp.ndarray and gpu_loss.shape == ()  # stays on the device
    assert type(cpu_loss) is np.ndarray and cpu_loss.shape == ()  # a 0-d array on both
    cpu_loss = float(cpu_loss)
    assert abs(float(gpu_loss) - cpu_loss) <= 64 * EPS32 * cpu_loss
    # summed in other orders: a few eps of each gradient's own size apart (6 eps seen)
    for k, want in cpu.grads.items():
        assert_close(f"grad {k}", gpu.grads[k], want, 64 * EPS32 * float(abs(want).max()))
    # the padding between the views stays zero on the device too
    padding = np.ones(gpu.grads.size, bool)
    for off, shape in gpu.grads.layout.values():
        padding[off:off + math.prod(shape)] = False
    assert not host(gpu.grads.buffer)[padding].any()  # (d_model 30 has some)


def test_nothing_is_read_back_inside_a_training_step(cp):
    """zero_grad, forward, backward, the clip and AdamW's step leave everything on the device;
    the loss is read when asked. The ids' check is the one read, and check_ids=False (the ids
    known to be good, as train_tiny's bytes are) skips it."""
    model = GPT(TINY, device="cuda")
    opt = AdamW(model.params, model.grads, lr=1e-2)
    x, y = on_device(cp, *batch(TINY))
    before = cp.reads()
    step(model, x, y, max_norm=0.5, opt=opt)
    assert cp.reads() == before + 1, "the ids' check reads the device once a step"
    before = cp.reads()
    loss, norm = step(model, x, y, max_norm=0.5, opt=opt, check_ids=False)
    assert cp.reads() == before, "a training step read from the device"
    assert type(norm) is cp.ndarray and norm.shape == () and norm.dtype == np.float64
    assert math.isfinite(float(loss)) and cp.reads() == before + 1


def test_adamw_steps_with_clipping_track_the_cpu_run(cp):
    cpu, gpu = GPT(TINY), GPT(TINY, device="cuda")
    kw = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    cpu_opt, gpu_opt = AdamW(cpu.params, cpu.grads, **kw), AdamW(gpu.params, gpu.grads, **kw)
    assert type(gpu_opt.m.buffer) is cp.ndarray and gpu_opt.m.device == "cuda"
    for i in range(3):
        x, y = batch(TINY, seed=10 + i)
        cpu_loss, cpu_norm = step(cpu, x, y, max_norm=0.5, opt=cpu_opt)
        gpu_loss, gpu_norm = step(gpu, *on_device(cp, x, y), max_norm=0.5, opt=gpu_opt)
        cpu_loss, cpu_norm = float(cpu_loss), float(cpu_norm)
        assert cpu_norm > 0.5  # clipped
        assert abs(float(gpu_loss) - cpu_loss) <= 256 * EPS32 * cpu_loss, i
        assert abs(float(gpu_norm) - cpu_norm) <= 256 * EPS32 * cpu_norm, i
    # AdamW moves each element by about lr whatever its gradient's size, so a gradient near
    # zero, whose last bits differ, moves differently: the parameters agree to a small part of
    # 3 steps · lr (1.7e-5 seen, of 3e-2)
    for k, want in cpu.params.items():
        assert_close(f"param {k}", gpu.params[k], want, 3 * 1e-2 * 2e-3)


def test_the_clip_scales_on_the_device_by_the_cpu_paths_factor(cp):
    model = GPT(TINY, device="cuda")
    x, y = on_device(cp, *batch(TINY))
    step(model, x, y)
    before = host(model.grads.buffer)
    norm = clip_grad_norm(model.grads, 1e9)  # not clipped: multiplied by exactly 1
    np.testing.assert_array_equal(host(model.grads.buffer), before)
    # the norm is Σ g² summed in double (in the GPU kernel's order), its square root
    assert float(norm) == pytest.approx(math.sqrt(ops.sum_squares(before)), rel=1e-12)
    small = float(norm) / 3
    clip_grad_norm(model.grads, small)  # clipped: by float32(max_norm / (norm + 1e-6))
    np.testing.assert_array_equal(host(model.grads.buffer),
                                  before * np.float32(small / (float(norm) + 1e-6)))
    # a plain dict of device arrays: the squares array by array, in order, as on the CPU
    grads = {k: cp.asarray(before[i * 100:(i + 1) * 100]) for i, k in enumerate("abc")}
    want = math.sqrt(sum(ops.sum_squares(before[i * 100:(i + 1) * 100]) for i in range(3)))
    assert float(clip_grad_norm(grads, math.inf)) == pytest.approx(want, rel=1e-12)


# ---- generation ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rope-tied", "none-odd-head-dim"])
def test_generation_gives_the_cpu_models_tokens(cp, name):
    cfg = CONFIGS[name]
    cpu, gpu = GPT(cfg), GPT(cfg, device="cuda")
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    want = generate(cpu, prompt, 6, temperature=0)
    got = generate(gpu, prompt, 6, temperature=0)
    assert type(got) is np.ndarray and got.dtype == np.int64  # back on the host
    np.testing.assert_array_equal(got, want)
    # sampling: the same NumPy generator over the host copy of the logits
    np.testing.assert_array_equal(generate(gpu, cp.asarray(prompt), 6, temperature=0.8,
                                           top_k=10, seed=3),
                                  generate(cpu, prompt, 6, temperature=0.8, top_k=10, seed=3))
    caches = gpu.new_caches(2, 8)
    assert all(c.device == "cuda" and type(c.k) is cp.ndarray for c in caches)
    # the attention maps come back to the host
    maps = gpu.attention_probs(prompt, layers=[1])
    assert type(maps[1]) is np.ndarray
    np.testing.assert_allclose(maps[1], cpu.attention_probs(prompt, layers=[1])[1], atol=1e-5)


def test_a_kv_cache_on_the_device_decodes_as_the_full_forward(cp):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 5, 2, 8)).astype(np.float32) for _ in range(3))
    cache = KVCache(1, 8, 2, 8, device="cuda")
    got = [cache.attend(*on_device(cp, q[:, :3], k[:, :3], v[:, :3]))]
    got += [cache.attend(*on_device(cp, q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1]))
            for t in (3, 4)]
    want, _ = ops.attention_forward(q, k, v)
    assert len(cache) == 5
    assert all(type(o) is cp.ndarray for o in got)
    assert_close("decode", cp.concatenate(got, axis=1), want, 64 * EPS32 * 4)


# ---- moving and saving -----------------------------------------------------------------------


def test_to_moves_the_model_and_back(cp):
    cfg = CONFIGS["sinusoidal-untied"]
    model, fresh = GPT(cfg), GPT(cfg)
    stale_opt = AdamW(model.params, model.grads)
    assert model.to("cuda") is model and model.device == "cuda"
    assert type(model.params.buffer) is cp.ndarray and type(model.pe) is cp.ndarray
    np.testing.assert_array_equal(host(model.params.buffer), fresh.params.buffer)
    assert model.wte.w is model.params["transformer.wte.weight"]  # the layers hold the new views
    assert model.blocks[1].mlp.c_fc.dw is model.grads["transformer.h.1.mlp.c_fc.weight"]
    with pytest.raises(RuntimeError, match="make the optimizer after moving"):
        stale_opt.step()
    x, y = batch(cfg)
    gpu_loss, _ = step(model, *on_device(cp, x, y))
    assert model.to("cuda") is model  # already there: nothing moves
    assert model.to("cpu") is model and model.device == "cpu"
    assert type(model.params.buffer) is np.ndarray and model.params.buffer.ctypes.data % 64 == 0
    assert model.saved is None and model.ln_f.saved is None  # a pending backward is dropped
    np.testing.assert_array_equal(model.params.buffer, fresh.params.buffer)
    loss, _ = step(model, x, y)
    want, _ = step(fresh, x, y)
    loss, want = float(loss), float(want)
    assert loss == want and abs(float(gpu_loss) - want) <= 64 * EPS32 * want
    np.testing.assert_array_equal(model.grads.buffer, fresh.grads.buffer)


def test_a_checkpoint_is_the_same_file_from_either_device(cp, tmp_path):
    gpu = GPT(TINY, device="cuda")
    gpu_opt = AdamW(gpu.params, gpu.grads, lr=1e-2)
    step(gpu, *on_device(cp, *batch(TINY)), max_norm=1.0, opt=gpu_opt)
    checkpoint.save(tmp_path / "gpu.safetensors", gpu, step=1, optimizer=gpu_opt)

    cpu = GPT(TINY)  # the same state on the host, saved from there
    cpu_opt = AdamW(cpu.params, cpu.grads, lr=1e-2)
    cpu.params.buffer[...] = host(gpu.params.buffer)
    cpu_opt.load_state({"t": 1, "m": gpu_opt.m, "v": gpu_opt.v})
    checkpoint.save(tmp_path / "cpu.safetensors", cpu, step=1, optimizer=cpu_opt)
    saved = [(tmp_path / f"{d}.safetensors").read_bytes() for d in ("gpu", "cpu")]
    assert saved[0] == saved[1]

    # the GPU's file into a CPU model, and the CPU's into a GPU model: identical parameters
    into_cpu = GPT(TINY)
    into_cpu_opt = AdamW(into_cpu.params, into_cpu.grads)
    checkpoint.load(tmp_path / "gpu.safetensors", into_cpu, into_cpu_opt)
    np.testing.assert_array_equal(into_cpu.params.buffer, host(gpu.params.buffer))
    np.testing.assert_array_equal(into_cpu_opt.v.buffer, host(gpu_opt.v.buffer))
    assert into_cpu_opt.t == 1
    into_gpu = GPT(TINY, device="cuda")
    into_gpu_opt = AdamW(into_gpu.params, into_gpu.grads)
    checkpoint.load(tmp_path / "cpu.safetensors", into_gpu, into_gpu_opt)
    assert type(into_gpu.params.buffer) is cp.ndarray and type(into_gpu_opt.m.buffer) is cp.ndarray
    np.testing.assert_array_equal(host(into_gpu.params.buffer), cpu.params.buffer)
    np.testing.assert_array_equal(host(into_gpu_opt.m.buffer), cpu_opt.m.buffer)
    built, at, _ = checkpoint.load(tmp_path / "cpu.safetensors", device="cuda")
    assert built.device == "cuda" and at == 1
    np.testing.assert_array_equal(host(built.params.buffer), cpu.params.buffer)


def test_a_failed_call_reports_the_message_of_the_library_that_failed(cp):
    """pytfm._core.lib is the emulator's (the one attribute fake_cupy.install sets), and
    pytfm._core.check, unpatched, reads the message of whichever library failed last."""
    lib, null = pytfm._core.lib, pytfm._core.ffi.NULL
    assert type(lib) is fake_cupy.EmulatedLib
    with pytest.raises(ValueError, match="pytfm_sum_squares_cuda: out must not be NULL"):
        pytfm._core.check(lib.pytfm_sum_squares_cuda(null, null, 4, null))
    with pytest.raises(ValueError, match=r"^pytfm_sum_squares: out must not be NULL"):
        pytfm._core.check(lib.pytfm_sum_squares(null, null, 4))


# ---- when the GPU cannot be used -------------------------------------------------------------


def no_cuda_build(info):
    status = pytfm._core.lib.cpu.pytfm_get_build_info(info)  # the EmulatedLib's own
    info.cuda = 0
    return status


def no_device(count):
    count[0] = 0
    return pytfm._core.lib.PYTFM_STATUS_OK


WHY = {
    "no cupy": "CuPy is not installed (pip install cupy-cuda13x)",
    "no cuda build": "pytfm was built without CUDA (nvcc was not found when it was installed): "
                     "reinstall it with nvcc on PATH",
    "no device": "no CUDA GPU was found (no device, or no NVIDIA driver)",
}


@pytest.mark.parametrize("case", WHY)
def test_the_gpu_that_cannot_be_used_is_one_clear_sentence(cp, monkeypatch, tmp_path, case):
    assert devices.cuda_problem() is None  # the stand-in and the emulator: a usable "GPU"
    # each case breaks what it names and everything checked after it: the first one is said
    pytfm._core.lib.pytfm_cuda_device_count = no_device
    if case != "no device":
        pytfm._core.lib.pytfm_get_build_info = no_cuda_build
    if case == "no cupy":
        monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy: ModuleNotFoundError
    assert devices.cuda_problem() == WHY[case]
    model = GPT(TINY)
    checkpoint.save(tmp_path / "m.safetensors", model)
    for make in (lambda: GPT(TINY, device="cuda"), lambda: model.to("cuda"),
                 lambda: KVCache(1, 4, 2, 4, device="cuda"),
                 lambda: checkpoint.load(tmp_path / "m.safetensors", device="cuda")):
        with pytest.raises(devices.CudaUnavailable) as raised:
            make()
        assert str(raised.value) == WHY[case]
    assert model.device == "cpu" and type(model.params.buffer) is np.ndarray


def test_an_unknown_device_is_a_value_error_naming_the_argument(tmp_path):
    with pytest.raises(ValueError, match=r"device must be 'cpu' or 'cuda', got 'gpu'"):
        GPT(TINY, device="gpu")
    with pytest.raises(ValueError, match=r"device must be 'cpu' or 'cuda', got 'CUDA'"):
        GPT(TINY).to("CUDA")
    with pytest.raises(ValueError, match=r"device must be 'cpu' or 'cuda', got 0"):
        KVCache(1, 4, 2, 4, device=0)
    with pytest.raises(ValueError, match=r"device must be 'cpu' or 'cuda', got None"):
        checkpoint.load(tmp_path / "none.safetensors", device=None)


def test_ids_outside_the_vocabulary_are_refused_on_the_device_too(cp):
    gpu = GPT(TINY, device="cuda")
    x, y = batch(TINY)
    bad_x, bad_y = x.copy(), y.copy()
    bad_x[1, 2], bad_y[0, 3] = TINY.vocab, -2
    with pytest.raises(ValueError, match=rf"idx\[{x.shape[1] + 2}\] = {TINY.vocab} is outside"):
        gpu.forward(*on_device(cp, bad_x, y))
    with pytest.raises(ValueError, match=r"targets\[3\] = -2 is outside"):
        gpu.forward(*on_device(cp, x, bad_y))
    y[0, 3] = -1  # ignored, not bad
    gpu.forward(*on_device(cp, x, y))
    with pytest.raises(ValueError, match="is outside"):
        gpu.decode(cp.asarray(bad_x), gpu.new_caches(x.shape[0]))


def test_inputs_on_the_other_device_are_refused_clearly(cp):
    gpu = GPT(TINY, device="cuda")
    x, y = batch(TINY)
    with pytest.raises(TypeError, match=r"idx is on cpu but the model is on cuda: move it there "
                                        r"first \(cupy.asarray\(idx\)\)"):
        gpu.forward(x, y)
    with pytest.raises(TypeError, match="targets is on cpu but the model is on cuda"):
        gpu.forward(cp.asarray(x), y)
    with pytest.raises(TypeError, match="idx is on cuda but the model is on cpu"):
        GPT(TINY).forward(cp.asarray(x))


# ---- train_tiny --device cuda ----------------------------------------------------------------


def tiny_run(tmp_path, name, *more):
    text = tmp_path / "corpus.txt"
    if not text.exists():
        text.write_bytes(b"def f(x):\n    return x + 1\n" * 40)
    return ["--out", str(tmp_path / name), "--text", str(text), "--d-model", "16", "--n-layer",
            "1", "--n-head", "2", "--context", "8", "--batch", "2", "--steps", "5",
            "--eval-every", "4", "--log-every", "2", "--sample-tokens", "3", *more]


def read_log(path):
    import csv

    with open(path) as f:
        return list(csv.reader(f))[1:]


def test_train_tiny_trains_saves_and_samples_on_the_gpu_path(cp, tmp_path, capsys):
    assert cli.main(tiny_run(tmp_path, "cpu")) == 0
    cpu_out = capsys.readouterr().out
    assert cli.main(tiny_run(tmp_path, "gpu", "--device", "cuda")) == 0
    gpu_out = capsys.readouterr().out
    cpu_log, gpu_log = read_log(tmp_path / "cpu" / "loss.csv"), read_log(tmp_path / "gpu" /
                                                                           "loss.csv")
    assert [r[0] for r in gpu_log] == [str(s) for s in range(1, 6)]  # every step's loss, read
    for c, g in zip(cpu_log, gpu_log):
        assert abs(float(g[1]) - float(c[1])) <= 2e-5, (c, g)  # rounded to 5 decimals
        if c[2]:
            assert abs(float(g[2]) - float(c[2])) <= 2e-5, (c, g)
    printed = [line.split("|")[0] for line in gpu_out.splitlines() if line.startswith("step")]
    assert printed == [line.split("|")[0] for line in cpu_out.splitlines()
                       if line.startswith("step")]  # the same progress lines: 1, 2, 4, 5
    model, at, _ = checkpoint.load(tmp_path / "gpu" / "model.safetensors")
    assert at == 5 and model.device == "cpu"
    assert "sample (temperature 0.8, top-k 40):" in gpu_out
    # stopped after step 3, which prints nothing: its loss is read before the save
    assert cli.main(tiny_run(tmp_path, "stop", "--device", "cuda"), interrupt_at=3) == 130
    _, at, extra = checkpoint.load(tmp_path / "stop" / "model.safetensors")
    assert at == 3 and [row[1] for row in extra["log"]] == [float(r[1]) for r in gpu_log[:3]]


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_train_tiny_trains_on_the_tensor_cores(cp, tmp_path, capsys, precision):
    """--device cuda --precision tf32/bf16: the linear layers on the _ex twins; each step's
    loss within the inputs' rounding (two inputs of each product at the format's unit
    roundoff, 2^-11 TF32, 2^-8 BF16, four times over for five steps' drift) of FP32's"""
    assert cli.main(tiny_run(tmp_path, "fp32", "--device", "cuda")) == 0
    capsys.readouterr()
    assert cli.main(tiny_run(tmp_path, precision, "--device", "cuda", "--precision",
                            precision)) == 0
    assert "the linear layers on the tensor cores" in capsys.readouterr().out
    u = 2.0**-11 if precision == "tf32" else 2.0**-8
    for c, g in zip(read_log(tmp_path / "fp32" / "loss.csv"),
                    read_log(tmp_path / precision / "loss.csv"), strict=True):
        assert abs(float(g[1]) - float(c[1])) <= 8 * u * float(c[1]) + 2e-5, (c, g)
    model, at, _ = checkpoint.load(tmp_path / precision / "model.safetensors")
    assert at == 5 and model.precision == "fp32"  # the file holds float32, no precision


def test_train_tiny_refuses_tf32_on_the_cpu(tmp_path):
    r = run_train_tiny("--precision", "tf32", "--steps", "1", cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == ("train_tiny.py: error: --precision tf32 runs on the "
                                         "GPU only (its tensor cores): --device cuda, or "
                                         "--precision fp32 or bf16 on the CPU")


def test_train_tiny_stops_on_a_bad_loss_read_late_on_the_gpu(cp, tmp_path, capsys, monkeypatch):

    class Diverging(GPT):  # the loss of the third step is NaN, on the device
        calls = 0

        def forward(self, idx, targets=None, **kw):
            logits, loss = super().forward(idx, targets, **kw)
            if kw.get("save", True):
                Diverging.calls += 1
                if Diverging.calls == 3:
                    loss = loss * float("nan")
            return logits, loss

    monkeypatch.setattr(cli, "GPT", Diverging)
    args = tiny_run(tmp_path, "nan", "--device", "cuda", "--log-every", "4", "--eval-every", "5")
    assert cli.main(args) == 1
    captured = capsys.readouterr()
    # read at step 4's progress line, said for step 3, and nothing saved
    assert "step 3: the loss became nan; stopping" in captured.err
    assert "step     1/5" in captured.out and "step     4/5" not in captured.out
    assert not (tmp_path / "nan" / "model.safetensors").exists()


def test_train_tiny_device_cuda_fails_clearly_here(tmp_path):
    """In this environment, as it is (no stand-ins): a usage error that says why, no traceback."""
    why = devices.cuda_problem()
    if why is None:
        pytest.skip("the GPU can be used here: tests/cuda/test_cuda_gpu_model.py trains on it")
    r = run_train_tiny("--device", "cuda", "--steps", "1", cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == (f"train_tiny.py: error: --device cuda: {why} "
                                         "(--device cpu trains on the CPU)")
    assert not (tmp_path / "out").exists()


def test_train_tiny_runs_in_a_fresh_interpreter(tmp_path):
    """The subprocess test_cuda_gpu_model.py starts on a GPU, on the CPU: the same helper, the
    same environment (this one's, PYTHONPATH extended), so that a PYTHONPATH that loses what
    pytfm imports fails here too (tests/cuda/test_gpu_conditions.py runs it in the GPU check
    machine's conditions)."""
    r = run_train_tiny("--steps", "2", "--eval-every", "2", "--log-every", "1", "--batch", "2",
                       "--context", "16", "--d-model", "16", "--n-layer", "1", "--n-head", "2",
                       "--sample-tokens", "4", "--out", tmp_path / "run", cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step     2/2" in r.stdout and (tmp_path / "run" / "model.safetensors").exists()
