"""Train a small byte-level GPT with pytfm's kernels and hand-written backprop, then sample.

    python examples/train_tiny.py               # 0.83M parameters, context 128, < 1 min on 2 cores
    python examples/train_tiny.py --steps 1000 --text my.txt --out run1
    python examples/train_tiny.py --out run1 --resume          # continue an interrupted run

With no --text it learns from the Python standard library's own source files, which every
machine has. It prints a progress line every --log-every steps and the validation loss every
--eval-every, writes OUT/model.safetensors (the checkpoint, also at each evaluation), OUT/loss.csv
and, when matplotlib is installed, OUT/loss.png. Ctrl-C saves a resumable checkpoint and exits;
a loss that turns NaN or inf stops the run and leaves the last good checkpoint as it was.
Sample from a checkpoint later with examples/sample.py.
"""

import argparse
import csv
import math
import os
import signal
import sys
import time

import numpy as np

import pytfm
from pytfm import checkpoint, data
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr


def add_model_args(p):
    """The model's and the schedule's options (bench/train_twin.py trains with the same ones)."""
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--pos", choices=["rope", "sinusoidal", "none"], default="rope")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=800, help="optimizer steps in all (default 800)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--text", help="train on this UTF-8 text file instead of the stdlib corpus")
    p.add_argument("--out", default="out", help="folder for checkpoint, loss log and plot")
    p.add_argument("--resume", action="store_true", help="continue from OUT/model.safetensors")
    add_model_args(p)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--sample-tokens", type=int, default=100)
    return p.parse_args(argv)


def clock(seconds):
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def val_loss(model, batches, n_batches=4):
    # save=False: an evaluation leaves the state of the model's backward() alone
    losses = [model.forward(*batches.batch("val", i), save=False)[1] for i in range(n_batches)]
    return float(np.mean(losses))


def write_log(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "train_loss", "val_loss", "lr", "tokens_per_s", "elapsed_s"])
        w.writerows(rows)


def plot(path, rows):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = [r[0] for r in rows]
    plt.figure(figsize=(6, 4))
    plt.plot(steps, [r[1] for r in rows], label="train")
    val = [(r[0], r[2]) for r in rows if r[2] != ""]
    if val:
        plt.plot(*zip(*val), "o-", label="validation")
    plt.xlabel("step"), plt.ylabel("loss (nats/byte)"), plt.legend(), plt.tight_layout()
    plt.savefig(path)
    plt.close()
    return True


def main(argv=None, interrupt_at=None):
    """Returns the exit status. interrupt_at=k acts as a Ctrl-C after step k (for tests)."""
    args = parse_args(argv)
    if args.device == "cuda":
        sys.exit("--device cuda: the model has no CUDA backend yet (no CUDA attention) "
                 f"(build_info()['cuda'] is {pytfm.build_info()['cuda']}); use --device cpu")
    os.makedirs(args.out, exist_ok=True)
    ckpt, log_path = os.path.join(args.out, "model.safetensors"), os.path.join(args.out, "loss.csv")

    tokens = data.text_corpus(args.text) if args.text else data.stdlib_corpus()
    batches = data.Batches(tokens, args.context, args.batch, seed=args.seed)
    cfg = GPTConfig(d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
                    max_seq=args.context, pos=args.pos, seed=args.seed)
    model = GPT(cfg)
    opt = AdamW(model.params, model.grads, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    step, rows = 0, []
    if args.resume:
        if not os.path.exists(ckpt):
            sys.exit(f"--resume: there is no checkpoint at {ckpt}")
        try:
            model, step, extra = checkpoint.load(ckpt, model, opt)
        except checkpoint.CheckpointError as e:
            sys.exit(f"--resume: {e}")
        rows = [r for r in extra.get("log", []) if r[0] <= step]
        print(f"resumed {ckpt} at step {step}")
    print(f"pytfm {pytfm.__version__}: GPT with {model.num_params():,} parameters "
          f"({cfg.n_layer} layers, d={cfg.d_model}, {cfg.n_head} heads, context {cfg.max_seq}, "
          f"pos={cfg.pos}); {len(tokens):,} bytes of "
          f"{'text from ' + args.text if args.text else 'Python stdlib source'}")

    stop = []  # Ctrl-C: finish the step, then save
    previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    try:
        return train(args, model, opt, batches, step, rows, ckpt, log_path, stop, interrupt_at)
    finally:
        signal.signal(signal.SIGINT, previous)


def train(args, model, opt, batches, step, rows, ckpt, log_path, stop, interrupt_at):
    cfg = model.cfg

    def save():
        checkpoint.save(ckpt, model, step, opt, extra={"log": rows, "args": vars(args)})

    start, first_step, tokens_done = time.perf_counter(), step, 0
    while step < args.steps and not stop:
        lr = cosine_lr(step, args.lr, args.warmup, args.steps, min_lr=args.lr / 10)
        x, y = batches.batch("train", step)
        model.zero_grad()
        _, loss = model.forward(x, y)
        if not math.isfinite(loss):
            print(f"\nstep {step + 1}: the loss became {loss}; stopping. The last good checkpoint "
                  f"({ckpt}) is left as it was.", file=sys.stderr)
            return 1
        model.backward()
        clip_grad_norm(model.grads, 1.0)
        opt.step(lr)
        step += 1
        tokens_done += x.size
        elapsed = time.perf_counter() - start
        rate = tokens_done / elapsed
        vl = val_loss(model, batches) if step % args.eval_every == 0 or step == args.steps else ""
        if vl != "" and not math.isfinite(vl):
            print(f"\nstep {step}: the validation loss became {vl}; stopping. The last good "
                  f"checkpoint ({ckpt}) is left as it was.", file=sys.stderr)
            return 1
        if step == interrupt_at:
            stop.append(True)
        rows.append([step, round(loss, 5), vl if vl == "" else round(vl, 5), lr, round(rate),
                     round(elapsed, 2)])
        if step % args.log_every == 0 or vl != "" or step == 1:
            left = (args.steps - step) * elapsed / (step - first_step)
            val = f" | val {vl:.4f}" if vl != "" else ""
            print(f"step {step:5d}/{args.steps} | loss {loss:.4f}{val} | {rate:6.0f} tok/s | "
                  f"{clock(elapsed)} elapsed | {clock(left)} left", flush=True)
        if vl != "":
            save()
    save()
    write_log(log_path, rows)
    if stop:
        print(f"\ninterrupted: checkpoint saved at step {step} in {ckpt}; continue with --resume")
        return 130
    plotted = plot(os.path.join(args.out, "loss.png"), rows)
    print(f"saved {ckpt}, {log_path}" + (" and loss.png" if plotted else ""))
    prompt = data.encode("def ")[None, :]
    n_new = min(args.sample_tokens, cfg.max_seq - prompt.shape[1])
    text = data.decode(generate(model, prompt, n_new, temperature=0.8, top_k=40, seed=args.seed)[0])
    print("sample (temperature 0.8, top-k 40):\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
