"""Greedy decoding of a Llama-family model from Python: pytfm.generate (the KV caches of
n_kv_head heads, GPT.decode) against transformers' generate(do_sample=False) with its cache,
eager attention.

    python bench/llama_decode.py                # bench/llama_train.py's model, 1 x 16 + 128
    python bench/llama_decode.py --rounds 5 --new 256 --threads 1

The model is bench/llama_train.py's (d 384, 6 layers, 6 heads, 2 KV heads, SwiGLU 1024, vocab
256), its weights pytfm's initial ones, copied into transformers' LlamaForCausalLM. One sequence:
a prompt of --prompt tokens, then --new greedy tokens; the figure is new tokens over the whole
call's time (the prompt's prefill included), the median over --rounds rounds, in which the two
processes (each library its own, --threads threads) alternate. Whether both chose the same
tokens is printed too (greedy ties may break differently in float32). Target: pytfm ≥ 2×
transformers. Needs torch and transformers (pip install ".[gpt2-test]").
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from common import ROOT, cpu_name, worker_env  # bench/ is this script's folder
from llama_train import CONFIG

WORKER = r"""
import json, sys, time
import numpy as np
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig
which, a = sys.argv[1], json.loads(sys.argv[2])
cfg = GPTConfig(**{**a["config"], "max_seq": a["prompt"] + a["new"]})
model = GPT(cfg)
prompt = np.random.default_rng(0).integers(0, cfg.vocab, (1, a["prompt"]))
if which == "torch":
    import torch
    import transformers as tf
    torch.set_num_threads(a["threads"])
    hf = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
        head_dim=cfg.head_dim, intermediate_size=cfg.d_ff, max_position_embeddings=cfg.max_seq,
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="eager"))
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in model.params.items()}, strict=False)
    hf.eval()
    tp = torch.from_numpy(prompt)
    def run():
        with torch.no_grad():
            return hf.generate(tp, max_new_tokens=a["new"], min_new_tokens=a["new"],
                               do_sample=False).numpy()
else:
    def run():
        return generate(model, prompt, a["new"], temperature=0)
run()
t = time.perf_counter()
out = run()
print(json.dumps({"seconds": time.perf_counter() - t, "tokens": out[0].tolist()}))
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new", type=int, default=128)
    args = p.parse_args()
    env = worker_env(args.threads, OPENBLAS_NUM_THREADS=args.threads)
    spec = json.dumps(dict(config=CONFIG, prompt=args.prompt, new=args.new,
                           threads=args.threads))
    runs = ("pytfm", "torch")
    times, tokens = {r: [] for r in runs}, {}
    for _ in range(args.rounds):
        for which in runs:
            r = subprocess.run([sys.executable, "-c", WORKER, which, spec], capture_output=True,
                               text=True, env=env, cwd=ROOT)
            if r.returncode:
                sys.exit(f"{which} failed:\n{r.stderr[-3000:]}")
            got = json.loads(r.stdout.splitlines()[-1])
            times[which].append(got["seconds"])
            tokens[which] = got["tokens"]
    med = {r: statistics.median(t) for r, t in times.items()}
    print(f"Llama greedy decoding: d {CONFIG['d_model']}, {CONFIG['n_layer']} layers, "
          f"{CONFIG['n_head']} heads, {CONFIG['n_kv_head']} KV heads; 1 x {args.prompt} prompt "
          f"+ {args.new} new tokens")
    print(f"CPU {cpu_name()}; {args.threads} threads; load {os.getloadavg()[0]:.2f}; "
          f"median of {args.rounds} rounds")
    for r in runs:
        print(f"{r:6s} {med[r] * 1e3:8.0f} ms {args.new / med[r]:8.1f} new tokens/s")
    print(f"same tokens: {'yes' if tokens['pytfm'] == tokens['torch'] else 'no'}")
    print(f"pytfm / transformers eager: {med['torch'] / med['pytfm']:.2f}x (target >= 2)")


if __name__ == "__main__":
    main()
