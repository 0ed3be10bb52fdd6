"""The whole GPT on a real GPU (CuPy arrays, the CUDA kernels) against the CPU model: ten
training steps of examples/train_tiny.py's default configuration give the CPU run's losses,
greedy generation its tokens, a checkpoint the same file, and train_tiny --device cuda runs
end to end. Skipped where CuPy, a GPU or a CUDA build of pytfm is missing;
tests/cuda/test_cuda_model.py runs the same path without a GPU, under the emulator.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT, cupy_on_a_gpu
from pytfm import checkpoint, data
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr

cp = cupy_on_a_gpu()

TRAIN_TINY = os.path.join(ROOT, "examples", "train_tiny.py")
STEPS = 10


def train_tiny_defaults():
    spec = importlib.util.spec_from_file_location("train_tiny", TRAIN_TINY)
    tt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tt)
    return tt.parse_args([])


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
    r = subprocess.run([sys.executable, TRAIN_TINY, "--device", "cuda", "--steps", "20",
                        "--eval-every", "10", "--log-every", "5", "--sample-tokens", "40",
                        "--out", str(tmp_path / "run")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step    20/20" in r.stdout and "sample (temperature 0.8, top-k 40):" in r.stdout
    _, step, extra = checkpoint.load(tmp_path / "run" / "model.safetensors")
    assert step == 20 and [row[0] for row in extra["log"]] == list(range(1, 21))
    assert all(isinstance(row[1], float) for row in extra["log"])  # every step's loss, read
