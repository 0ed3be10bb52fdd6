"""The whole GPT on a real GPU (CuPy arrays, the CUDA kernels) against the CPU model: ten
training steps of examples/train_tiny.py's default configuration give the CPU run's losses,
greedy generation its tokens, a checkpoint the same file, and train_tiny --device cuda runs
end to end; pytfm.train_step.TrainStep gives the loop's bits and replays a CUDA graph; the C
model on PYTFM_DEVICE_CUDA gives the CPU C model's greedy tokens. Skipped where CuPy, a GPU or
a CUDA build of pytfm is missing; tests/cuda/test_cuda_model.py, test_cuda_step.py and
test_cuda_c_model.py run the same paths without a GPU, under the emulator.
"""


import numpy as np
import pytest

from helpers import cupy_on_a_gpu, run_train_tiny
from pytfm import checkpoint, data
from pytfm.cli import train as cli
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr
from pytfm.train_step import TrainStep

cp = cupy_on_a_gpu()
EPS32 = float(np.finfo(np.float32).eps)

STEPS = 10


def train_tiny_defaults():
    return cli.parse_args([])


@pytest.fixture(scope="module")
def runs():
    """train_tiny's default model trained STEPS steps on each device, as train_tiny trains it
    (its schedule, clip and optimizer, its batches of the stdlib corpus) ->
    {device: (model, optimizer, [loss per step])}."""
    args = train_tiny_defaults()
    cfg = GPTConfig(d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
                    max_seq=args.context, pos=args.pos, seed=args.seed)
    batches = data.Batches(data.stdlib_corpus().astype(np.int64), args.context, args.batch,
                           seed=args.seed)
    out = {}
    for device in ("cpu", "cuda"):
        model = GPT(cfg, device=device)
        opt = AdamW(model.params, model.grads, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        losses = []
        for step in range(STEPS):
            lr = cosine_lr(step, args.lr, args.warmup, args.steps, min_lr=args.lr / 10)
            x, y = batches.batch("train", step)
            if device == "cuda":
                x, y = cp.asarray(x), cp.asarray(y)
            model.zero_grad()
            _, loss = model.forward(x, y)
            model.backward()
            clip_grad_norm(model.grads, 1.0)
            opt.step(lr)
            losses.append(loss)  # read after the run, on the GPU
        out[device] = (model, opt, [float(loss) for loss in losses])
    return out


def test_ten_training_steps_give_the_cpu_runs_losses(runs):
    cpu, gpu = runs["cpu"][2], runs["cuda"][2]
    print("\nstep  cpu loss   gpu loss   rel diff")
    for i, (c, g) in enumerate(zip(cpu, gpu)):
        print(f"{i + 1:4d}  {c:.6f}  {g:.6f}  {abs(g - c) / c:.2e}")
    assert cpu[0] == pytest.approx(gpu[0], rel=1e-5)  # the same parameters: rounding only
    # later steps: AdamW turns the gradients' rounding into parameter differences of a small
    # part of lr, which the loss barely sees
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4)
    assert gpu[-1] < gpu[0]  # and it learns


def test_a_checkpoint_round_trip_and_greedy_tokens(runs, tmp_path):
    model, opt, _ = runs["cuda"]
    path = tmp_path / "gpu.safetensors"
    checkpoint.save(path, model, step=STEPS, optimizer=opt)
    again = GPT(model.cfg, device="cuda")
    again_opt = AdamW(again.params, again.grads)
    checkpoint.load(path, again, again_opt)
    np.testing.assert_array_equal(cp.asnumpy(again.params.buffer), cp.asnumpy(model.params.buffer))
    np.testing.assert_array_equal(cp.asnumpy(again_opt.v.buffer), cp.asnumpy(opt.v.buffer))
    host, _, _ = checkpoint.load(path)  # into a CPU model: the same bits, the same file
    np.testing.assert_array_equal(host.params.buffer, cp.asnumpy(model.params.buffer))
    host_opt = AdamW(host.params, host.grads)
    checkpoint.load(path, host, host_opt)
    checkpoint.save(tmp_path / "cpu.safetensors", host, step=STEPS, optimizer=host_opt)
    assert (tmp_path / "cpu.safetensors").read_bytes() == path.read_bytes()
    # one set of parameters on both devices: greedy decoding picks the same tokens
    prompt = data.encode("def ")[None, :]
    n = min(40, model.cfg.max_seq - prompt.shape[1])
    want = generate(host, prompt, n, temperature=0)
    np.testing.assert_array_equal(generate(model, prompt, n, temperature=0), want)
    np.testing.assert_array_equal(generate(model, cp.asarray(prompt), n, temperature=0.8,
                                           top_k=40, seed=1),
                                  generate(host, prompt, n, temperature=0.8, top_k=40, seed=1))


def test_train_tiny_device_cuda_trains_saves_and_samples(tmp_path):
    r = run_train_tiny("--device", "cuda", "--steps", "20", "--eval-every", "10", "--log-every",
                       "5", "--sample-tokens", "40", "--out", tmp_path / "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step    20/20" in r.stdout and "sample (temperature 0.8, top-k 40):" in r.stdout
    _, step, extra = checkpoint.load(tmp_path / "run" / "model.safetensors")
    assert step == 20 and [row[0] for row in extra["log"]] == list(range(1, 21))
    assert all(isinstance(row[1], float) for row in extra["log"])  # every step's loss, read


def test_train_step_gives_the_loops_bits_and_replays_a_graph(runs):
    """pytfm.train_step.TrainStep against the loop above on the GPU: each call the loop's bits (the
    same kernels on the same arrays), the third call captured as a CUDA graph and the later
    ones replaying it, and CuPy's pool no larger after the first call."""
    args = train_tiny_defaults()
    cfg = runs["cuda"][0].cfg
    batches = data.Batches(data.stdlib_corpus().astype(np.int64), args.context, args.batch,
                           seed=args.seed)
    made = []
    for _ in range(2):
        model = GPT(cfg, device="cuda")
        made.append((model, AdamW(model.params, model.grads, lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1)))
    (ref, ref_opt), (model, opt) = made
    step = TrainStep(model, opt, max_norm=1.0)
    pool = cp.get_default_memory_pool()
    for i in range(STEPS):
        lr = cosine_lr(i, args.lr, args.warmup, args.steps, min_lr=args.lr / 10)
        x, y = batches.batch("train", i)
        ref.zero_grad()
        _, want = ref.forward(cp.asarray(x), cp.asarray(y))
        ref.backward()
        clip_grad_norm(ref.grads, 1.0)
        ref_opt.step(lr)
        got = step(x, y, lr)
        assert float(got) == float(want), (i, step.mode)
        if i == 1:
            held = pool.total_bytes()
        elif i > 1:
            assert pool.total_bytes() == held, "a call after the first allocated"
    assert step.mode == "graph", step.graph_error
    for a, b in ((model.params, ref.params), (opt.m, ref_opt.m), (opt.v, ref_opt.v)):
        assert bool((a.buffer.view(cp.uint32) == b.buffer.view(cp.uint32)).all())


def test_the_c_model_on_the_gpu_gives_the_cpu_models_tokens(runs, tmp_path):
    """pytfm_model_open(..., PYTFM_DEVICE_CUDA) on the trained model: its logits to float32
    rounding of the CPU C model's, the same greedy tokens through a session."""
    from pytfm._core import ffi, lib

    model, _, _ = runs["cuda"]
    path = tmp_path / "m.safetensors"
    checkpoint.save(path, model)
    V = model.cfg.vocab

    def p(a):
        return ffi.cast({np.float32: "float *", np.int64: "int64_t *"}[a.dtype.type],
                        a.ctypes.data)

    def opened(device):
        h = ffi.new("pytfm_model **")
        assert lib.pytfm_model_open(h, str(path).encode(), device) == lib.PYTFM_STATUS_OK, \
            ffi.string(lib.pytfm_last_error()).decode()
        return h[0]

    def greedy(m, prompt, n):
        h = ffi.new("pytfm_session **")
        assert lib.pytfm_session_open(h, m, 0) == lib.PYTFM_STATUS_OK
        feed, out, token = np.asarray(prompt, np.int64), [], ffi.new("int64_t *")
        logits = np.zeros(V, np.float32)
        for _ in range(n):
            assert lib.pytfm_session_feed(h[0], p(logits), p(feed), feed.size) == 0
            assert lib.pytfm_sample(token, p(logits), V, 0.0, 0, ffi.NULL) == 0
            out.append(token[0])
            feed = np.array([token[0]], np.int64)
        lib.pytfm_session_close(h[0])
        return out

    cpu, gpu = opened(lib.PYTFM_DEVICE_CPU), opened(lib.PYTFM_DEVICE_CUDA)
    try:
        tokens = np.random.default_rng(0).integers(0, V, (4, model.cfg.max_seq))
        got, want = (np.zeros(tokens.shape + (V,), np.float32) for _ in range(2))
        for m, out in ((gpu, got), (cpu, want)):
            assert lib.pytfm_model_forward(m, p(out), p(tokens), *tokens.shape) == 0
        err = float(np.abs(got.astype(np.float64) - want).max())
        assert err <= 64 * EPS32 * float(np.abs(want).max()), err
        prompt = list(data.encode("def "))
        assert greedy(gpu, prompt, 40) == greedy(cpu, prompt, 40)
    finally:
        lib.pytfm_model_close(gpu)
        lib.pytfm_model_close(cpu)
