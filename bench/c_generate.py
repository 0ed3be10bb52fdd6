"""The C generator's decode step against the PyTorch twin's, per token, by context position.

    python -m bench.c_generate                      # train_tiny's default config, one thread
    python -m bench.c_generate --torch-python venv/bin/python --rounds 7

Both decode one token at a time through their own KV caches, from position 0 to max_seq − 1,
and each step is timed: pytfm by bench/c_decode.c (a C program on the public model API, so no
Python is in the timed loop; each step is pytfm_session_feed writing the logits), PyTorch by a
KV-cache decode of tests/torch_twin.py's modules in eager mode (twin_decode below, checked
against pytfm.nn.GPT.decode before it is timed), torch.set_num_threads(threads), no_grad. Each
library runs in its own process; rounds alternate between them, and the figure is the median
over rounds of each round's median over reps. The weights are the default GPTConfig's at
initialisation (speed does not depend on their values). Needs torch (`pip install
torch==2.13.0`, in the interpreter --torch-python names); pytfm never does.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from bench.common import ROOT, cpu_name, torch_twin, worker_env

POSITIONS = (32, 64, 96, 127)


def twin_decode(twin, idx, caches, start):
    """The twin's logits (B, n, vocab) of tokens idx (B, n) at positions [start, start + n),
    appending their keys and values to caches (per block: k, v of shape (B, Tmax, H, D)), as
    pytfm.nn.GPT.decode; the ops are torch_twin's, the cache handling the usual one."""
    import torch
    import torch.nn.functional as F

    tt = torch_twin()
    B, n = idx.shape
    end = start + n
    pos = torch.arange(start, end)
    x = twin.transformer.wte(idx)
    if twin.cfg.pos == "sinusoidal":
        x = x + twin.pe[start:end]
    mask = None if n == 1 else pos[:, None] >= torch.arange(end)[None, :]  # (n, end)
    for block, (kc, vc) in zip(twin.transformer.h, caches):
        a = block.attn
        qkv = a.c_attn(block.ln_1(x)).view(B, n, 3, a.H, a.hd)
        q, k, v = qkv.unbind(dim=2)  # (B, n, H, hd)
        if a.rope:
            q, k = tt.rope(q, pos), tt.rope(k, pos)
        kc[:, start:end], vc[:, start:end] = k, v
        o = F.scaled_dot_product_attention(q.transpose(1, 2), kc[:, :end].transpose(1, 2),
                                           vc[:, :end].transpose(1, 2), attn_mask=mask)
        x = x + a.c_proj(o.transpose(1, 2).reshape(B, n, -1))
        x = x + block.mlp.c_proj(F.gelu(block.mlp.c_fc(block.ln_2(x)), approximate="tanh"))
    x = twin.transformer.ln_f(x)
    w = twin.transformer.wte.weight if twin.cfg.tie_embeddings else twin.lm_head.weight
    return x @ w.T


def tokens_of(vocab, count):
    """c_decode.c's token ids: its LCG, so both libraries decode the same sequence."""
    x, out = 12345, []
    for _ in range(count):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append((x >> 33) % vocab)
    return out


def torch_worker(path, reps, threads):
    """Per-position median ns of the twin's decode step, as c_decode.c prints them."""
    import time

    import torch

    from pytfm import checkpoint

    torch.set_num_threads(threads)
    model, _, _ = checkpoint.load(path)
    cfg = model.cfg
    twin = torch_twin().TorchGPT.from_pytfm(model).eval()
    tokens = tokens_of(cfg.vocab, cfg.max_seq)
    H, D = cfg.n_head, cfg.d_model // cfg.n_head

    def new_caches():
        return [(torch.zeros(1, cfg.max_seq, H, D), torch.zeros(1, cfg.max_seq, H, D))
                for _ in range(cfg.n_layer)]

    with torch.no_grad():
        # the twin's decode is the model's: pytfm.nn.GPT.decode, token by token
        caches, ref_caches = new_caches(), model.new_caches(1)
        for t in range(cfg.max_seq):
            got = twin_decode(twin, torch.tensor([[tokens[t]]]), caches, t)[0, -1].numpy()
            ref = model.decode(np.array([[tokens[t]]]), ref_caches)[0, -1]
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        ns = np.empty((cfg.max_seq, reps))
        for r in range(reps):
            caches = new_caches()
            for t in range(cfg.max_seq):
                idx = torch.tensor([[tokens[t]]])
                t0 = time.perf_counter_ns()
                twin_decode(twin, idx, caches, t)
                ns[t, r] = time.perf_counter_ns() - t0
    for t in range(cfg.max_seq):
        print(t, int(np.median(ns[t])), int(ns[t].min()))


def parse(stdout):
    """{position: median ns} from a worker's lines "t median_ns min_ns"."""
    return {int(t): int(med) for t, med, _ in (line.split() for line in stdout.splitlines())}


def build_driver(folder):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    flags = subprocess.run([sys.executable, "-m", "pytfm", "--cflags", "--libs"], check=True,
                           capture_output=True, text=True, env=worker_env(1)).stdout.split()
    exe = os.path.join(folder, "c_decode")
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                    os.path.join(ROOT, "bench", "c_decode.c"), *flags, "-pthread", "-o", exe],
                   check=True)
    return exe


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=40, help="decodes of max_seq tokens per round")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per library")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--torch-python", default=sys.executable,
                    help="an interpreter with torch 2.13.0 (default: this one)")
    ap.add_argument("--worker", nargs=2, metavar=("CHECKPOINT", "REPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return torch_worker(args.worker[0], int(args.worker[1]), args.threads)

    from pytfm import checkpoint
    from pytfm.nn import GPT, GPTConfig

    cfg = GPTConfig()  # train_tiny's default: vocab 256, d_model 128, 4 layers, 4 heads, rope
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.safetensors")
        model = GPT(cfg)
        checkpoint.save(path, model)
        exe = build_driver(tmp)
        env = worker_env(args.threads)
        runs = {"pytfm": [], "torch": []}
        for _ in range(args.rounds):
            out = subprocess.run([exe, path, str(args.reps), str(args.threads)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            runs["pytfm"].append(parse(out))
            out = subprocess.run([args.torch_python, "-m", "bench.c_generate", "--threads",
                                  str(args.threads), "--worker", path, str(args.reps)], env=env,
                                 capture_output=True, text=True, cwd=ROOT)
            if out.returncode:
                sys.exit(f"the torch worker failed:\n{out.stderr[-3000:]}")
            runs["torch"].append(parse(out.stdout))
        torch_version = subprocess.run(
            [args.torch_python, "-c", "import torch; print(torch.__version__)"], env=env,
            capture_output=True, text=True).stdout.strip()

    us = {lib: {p: float(np.median([r[p] for r in rs])) / 1e3 for p in range(cfg.max_seq)}
          for lib, rs in runs.items()}
    print(f"Decoding one token through a KV cache: GPTConfig() (vocab {cfg.vocab}, d_model "
          f"{cfg.d_model}, n_layer {cfg.n_layer}, n_head {cfg.n_head}, max_seq {cfg.max_seq}, "
          f"{cfg.pos}), {model.num_params():,} parameters")
    print(f"{cpu_name()}, {args.threads} thread(s); pytfm C session (bench/c_decode.c) vs "
          f"torch {torch_version} eager twin with its own KV cache")
    print(f"median of {args.rounds} alternating rounds of {args.reps} reps\n")
    print(f"{'context':>7} {'pytfm µs':>9} {'tokens/s':>9} {'torch µs':>9} {'tokens/s':>9} "
          f"{'ratio':>6}")
    for p in POSITIONS:
        c, t = us["pytfm"][p], us["torch"][p]
        print(f"{p:7d} {c:9.1f} {1e6 / c:9.0f} {t:9.1f} {1e6 / t:9.0f} {t / c:6.1f}x")
    # per-token time against position: a least-squares line over 32..127 and how far from it
    print()
    ps = np.arange(POSITIONS[0], POSITIONS[-1] + 1)
    for lib in ("pytfm", "torch"):
        y = np.array([us[lib][p] for p in ps])
        slope, icept = np.polyfit(ps, y, 1)
        resid = np.abs(y - (slope * ps + icept)).max()
        print(f"{lib:>5}: per-token µs ≈ {icept:.1f} + {slope * 1e3:.1f}e-3 × position over "
              f"{ps[0]}..{ps[-1]} (largest deviation from the line {resid:.1f} µs)")
    print(json.dumps({"ratio_at_127": us["torch"][127] / us["pytfm"][127]}))


if __name__ == "__main__":
    main()
