"""A training step of a Llama-family model: pytfm FP32 against its torch eager twin, and pytfm
BF16 against pytfm FP32.

    python bench/llama_train.py                 # d 384, 6 layers, 6 heads, 2 KV heads, ...
    python bench/llama_train.py --rounds 5 --steps 3 --threads 2

The model: byte-level (vocab 256), d_model 384, 6 layers, 6 query heads and 2 key/value heads
of 64, SwiGLU of 1024, untied head; a batch of 8×256 bytes of the standard library's sources.
A step is zero_grad, forward, backward, clipping to norm 1, AdamW. The twin is transformers'
LlamaForCausalLM (attn_implementation "eager") holding pytfm's initial weights, with
torch.optim.AdamW and clip_grad_norm_. Each library runs in its own process at --threads
threads (torch.set_num_threads, OMP_NUM_THREADS), the three processes interleaved over
--rounds rounds; a process times --steps steps after one warm-up step, the figure is the median
step over every round. Targets: pytfm FP32 ≥ 1.3× torch, pytfm BF16 ≥ 1.4× pytfm FP32. Needs
torch and transformers (pip install ".[gpt2-test]").
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from common import ROOT, cpu_name, worker_env  # bench/ is this script's folder

CONFIG = dict(vocab=256, d_model=384, n_layer=6, n_head=6, n_kv_head=2, d_ff=1024, max_seq=256,
              arch="llama", tie_embeddings=False, rope_theta=10000.0, norm_eps=1e-5)

WORKER = r"""
import json, sys, time
import numpy as np
from pytfm import data
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm
which, a = sys.argv[1], json.loads(sys.argv[2])
cfg = GPTConfig(**a["config"])
model = GPT(cfg, precision="bf16" if which == "pytfm-bf16" else "fp32")
x, y = data.Batches(data.stdlib_corpus(), cfg.max_seq, a["batch"], seed=0).batch("train", 0)
if which == "torch":
    import torch
    import torch.nn.functional as F
    import transformers as tf
    torch.set_num_threads(a["threads"])
    hf = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
        head_dim=cfg.head_dim, intermediate_size=cfg.d_ff, max_position_embeddings=cfg.max_seq,
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=False, attn_implementation="eager"))
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in model.params.items()})
    hf.train()
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    def step():
        opt.zero_grad()
        logits = hf(tx).logits
        F.cross_entropy(logits.reshape(-1, cfg.vocab), ty.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt.step()
else:
    opt = AdamW(model.params, model.grads, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    def step():
        model.zero_grad()
        model.forward(x, y)
        model.backward()
        clip_grad_norm(model.grads, 1.0)
        opt.step(1e-4)
step()
times = []
for _ in range(a["steps"]):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="timed steps per process and round")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    env = worker_env(args.threads, OPENBLAS_NUM_THREADS=args.threads)
    spec = json.dumps(dict(config=CONFIG, batch=args.batch, steps=args.steps,
                           threads=args.threads))
    runs = ("pytfm-fp32", "pytfm-bf16", "torch")
    times = {r: [] for r in runs}
    for _ in range(args.rounds):
        for which in runs:
            r = subprocess.run([sys.executable, "-c", WORKER, which, spec], capture_output=True,
                               text=True, env=env, cwd=ROOT)
            if r.returncode:
                sys.exit(f"{which} failed:\n{r.stderr[-3000:]}")
            times[which] += json.loads(r.stdout.splitlines()[-1])
    med = {r: statistics.median(t) for r, t in times.items()}
    tokens = args.batch * CONFIG["max_seq"]
    print(f"Llama training step: d {CONFIG['d_model']}, {CONFIG['n_layer']} layers, "
          f"{CONFIG['n_head']} heads, {CONFIG['n_kv_head']} KV heads, SwiGLU {CONFIG['d_ff']}, "
          f"B {args.batch}, T {CONFIG['max_seq']}")
    print(f"CPU {cpu_name()}; {args.threads} threads; load {os.getloadavg()[0]:.2f}; "
          f"median of {args.rounds} rounds x {args.steps} steps")
    for r in runs:
        print(f"{r:11s} {med[r] * 1e3:9.0f} ms/step {tokens / med[r]:9.0f} tokens/s")
    print(f"pytfm fp32 / torch eager: {med['torch'] / med['pytfm-fp32']:.2f}x (target >= 1.3)")
    print(f"pytfm bf16 / pytfm fp32:  {med['pytfm-fp32'] / med['pytfm-bf16']:.2f}x "
          f"(target >= 1.4)")


if __name__ == "__main__":
    main()
