"""GPT-2 124M in pytfm against transformers (torch eager, FP32), and GPT-2's tokenizer against
Hugging Face tokenizers: the ratios of issue "GPT-2 in pytfm, part 1", measured in one run.

    python bench/gpt2.py                           # every group, 1 and 2 threads, 3 rounds
    python bench/gpt2.py --groups tokenizer --rounds 5

Groups (> 1: pytfm is faster):
  logits     a random GPT-2 of 124M's shape (vocab 50257, 12 layers, d 768, 12 heads, context
             1024; transformers' own initialisation, saved as a Hugging Face folder) loaded by
             pytfm.gpt2.load and by GPT2LMHeadModel.from_pretrained: the forward pass of one
             sequence of 1024 tokens, its time, and the largest logit difference relative to
             the largest logit (target: <= 1e-4, at 1 and 2 threads).
  train      one training step at B4 T256 (forward, cross-entropy, backward, gradient norm
             clipped to 1, AdamW) of the same model: pytfm against transformers' model with
             torch.optim.AdamW, dropout 0 (target: >= 1.0x torch, at 1 and 2 threads).
  tokenizer  encoding every UTF-8 .py file of the standard library, one file at a time, with
             GPT-2's vocabulary (~/.cache/pytfm/gpt2-vocab or $PYTFM_GPT2_VOCAB): pytfm's
             tokenizer against GPT2TokenizerFast on one thread (TOKENIZERS_PARALLELISM=false,
             RAYON_NUM_THREADS=1), each from a fresh process, so from a cold cache
             (target: >= 1.0x).
Each library runs in a process of its own at the given thread count (OMP_NUM_THREADS, and
torch.set_num_threads in torch's), the libraries alternate over rounds, and each figure is the
median over rounds; the header names the CPU and the load average before and after, since
other work on the machine skews every figure. Needs torch, transformers and tokenizers
(pip install ".[gpt2-test]").
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import ROOT, cpu_name, stdlib_texts, worker_env  # noqa: E402

SHAPE = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
TRAIN_B, TRAIN_T = 4, 256
VOCAB_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "pytfm", "gpt2-vocab")


# ---- the workers: one library, one measurement, in a process of its own ----------------------


def make_folder(folder):
    """The random 124M GPT-2, dropout 0, as transformers saves it."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(**SHAPE, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)
    GPT2LMHeadModel(config).save_pretrained(folder)


def tokens(n, seed):
    import numpy as np

    return np.random.default_rng(seed).integers(0, SHAPE["vocab_size"], n).astype(np.int64)


def timed(f, repeat):
    """f() once to warm up, then the median of repeat timed calls (seconds)."""
    f()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def logits_worker(lib, folder, out):
    import numpy as np

    idx = tokens(SHAPE["n_positions"], 1).reshape(1, -1)
    if lib == "pytfm":
        from pytfm import gpt2

        model = gpt2.load(folder)
        result = {}

        def f():
            result["logits"] = model.forward(idx)[0]
    else:
        import torch
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(folder).eval()
        x, result = torch.from_numpy(idx), {}

        def f():
            with torch.no_grad():
                result["logits"] = model(x).logits.numpy()
    seconds = timed(f, 2)
    np.save(out, result["logits"][0])
    return {"forward_s": seconds}


def train_worker(lib, folder):
    import numpy as np

    data = tokens(TRAIN_B * (TRAIN_T + 1), 2).reshape(TRAIN_B, TRAIN_T + 1)
    x, y = np.ascontiguousarray(data[:, :-1]), np.ascontiguousarray(data[:, 1:])
    if lib == "pytfm":
        from pytfm import gpt2
        from pytfm.optim import AdamW, clip_grad_norm

        model = gpt2.load(folder)
        opt = AdamW(model.params, model.grads, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)

        def step():
            model.zero_grad()
            loss = model.forward(x, y)[1]
            model.backward()
            clip_grad_norm(model.grads, 1.0)
            opt.step()
            return float(loss)
    else:
        import torch
        import torch.nn.functional as F
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(folder).train()
        params = list(model.parameters())
        opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2],
                                  "weight_decay": 0.1},
                                 {"params": [p for p in params if p.ndim < 2],
                                  "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.95))
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def step():
            opt.zero_grad()
            logits = model(tx).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ty.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            return loss.item()
    return {"step_s": timed(step, 2), "tokens": TRAIN_B * TRAIN_T}


def tokenizer_worker(lib, vocab_folder):
    texts = stdlib_texts()
    if lib == "pytfm":
        from pytfm.tokenizer import Tokenizer

        tok = Tokenizer.from_folder(vocab_folder)
        encode = tok.encode
    else:
        from transformers import GPT2TokenizerFast

        engine = GPT2TokenizerFast.from_pretrained(vocab_folder).backend_tokenizer

        def encode(text):
            return engine.encode(text, add_special_tokens=False).ids
    t0 = time.perf_counter()
    n = sum(len(encode(t)) for t in texts)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": n, "files": len(texts),
            "mb": sum(len(t.encode()) for t in texts) / 1e6}


def worker(argv):
    group, lib, threads, *rest = argv
    if lib == "torch":
        import torch

        torch.set_num_threads(int(threads))
    if group == "folder":
        make_folder(rest[0])
        result = {}
    elif group == "logits":
        result = logits_worker(lib, *rest)
    elif group == "train":
        result = train_worker(lib, rest[0])
    else:
        result = tokenizer_worker(lib, rest[0])
    print(json.dumps(result))


# ---- the driver ------------------------------------------------------------------------------


def run(group, lib, threads, *args):
    env = worker_env(threads, OPENBLAS_NUM_THREADS=1, TOKENIZERS_PARALLELISM="false",
                     RAYON_NUM_THREADS=threads, HF_HUB_OFFLINE=1)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", group, lib,
                        str(threads), *map(str, args)], capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"bench/gpt2.py worker {group} {lib} ({threads} threads) failed:\n"
                 f"{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def vocab_folder(tmp):
    """A folder with GPT-2's vocabulary as vocab.json + merges.txt, or None."""
    source = os.environ.get("PYTFM_GPT2_VOCAB") or VOCAB_CACHE
    for v, m in (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")):
        if os.path.isfile(os.path.join(source, v)) and os.path.isfile(os.path.join(source, m)):
            folder = os.path.join(tmp, "vocab")
            os.makedirs(folder, exist_ok=True)
            for a, b in ((v, "vocab.json"), (m, "merges.txt")):
                with open(os.path.join(source, a), "rb") as f, \
                        open(os.path.join(folder, b), "wb") as g:
                    g.write(f.read())
            return folder
    return None


def load():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", nargs="+", default=["logits", "train", "tokenizer"],
                   choices=["logits", "train", "tokenizer"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print(f"bench/gpt2.py on {cpu_name()}, {os.cpu_count()} CPUs; load average {load()}")
    print(f"command: python bench/gpt2.py --groups {' '.join(args.groups)} --threads "
          f"{' '.join(map(str, args.threads))} --rounds {args.rounds}")
    with tempfile.TemporaryDirectory(prefix="pytfm-gpt2-bench-") as tmp:
        folder = os.path.join(tmp, "gpt2-124m")
        if {"logits", "train"} & set(args.groups):
            run("folder", "torch", 2, folder)
        rows = []
        for group in args.groups:
            rows += measure(group, args, folder, tmp)
    print(f"load average after: {load()}")
    width = max(len(r[0]) for r in rows) if rows else 10
    for name, value, target in rows:
        print(f"{name:{width}s}  {value}  {target}")


def measure(group, args, folder, tmp):
    """-> [(row name, figure, target verdict)] of one group, its libraries interleaved."""
    rows = []
    if group == "tokenizer":
        vocab = vocab_folder(tmp)
        if vocab is None:
            return [("tokenizer", "skipped: no GPT-2 vocabulary in " + VOCAB_CACHE, "")]
        got = {"pytfm": [], "tokenizers": []}
        for r in range(args.rounds):
            for lib in (("pytfm", "tokenizers") if r % 2 == 0 else ("tokenizers", "pytfm")):
                got[lib].append(run("tokenizer", lib, 1, vocab))
        mbs = {lib: statistics.median(g["mb"] / g["seconds"] for g in runs)
               for lib, runs in got.items()}
        first = got["pytfm"][0]
        same = first["tokens"] == got["tokenizers"][0]["tokens"]
        ratio = mbs["pytfm"] / mbs["tokenizers"]
        rows.append((f"tokenizer: {first['files']} files, {first['mb']:.1f} MB, "
                     f"{first['tokens']:,} tokens (same count: {same}); MB/s, 1 thread",
                     f"pytfm {mbs['pytfm']:.2f}  tokenizers {mbs['tokenizers']:.2f}  "
                     f"ratio {ratio:.2f}", "ok" if ratio >= 1.0 else "MISS (target 1.0)"))
        return rows
    import numpy as np

    for threads in args.threads:
        got = {"pytfm": [], "torch": []}
        for r in range(args.rounds):
            for lib in (("pytfm", "torch") if r % 2 == 0 else ("torch", "pytfm")):
                if group == "logits":
                    out = os.path.join(tmp, f"{lib}-{threads}.npy")
                    got[lib].append(run("logits", lib, threads, folder, out))
                else:
                    got[lib].append(run("train", lib, threads, folder))
        if group == "logits":
            ours = np.load(os.path.join(tmp, f"pytfm-{threads}.npy")).astype(np.float64)
            theirs = np.load(os.path.join(tmp, f"torch-{threads}.npy")).astype(np.float64)
            err = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
            t = {lib: statistics.median(g["forward_s"] for g in runs)
                 for lib, runs in got.items()}
            rows.append((f"logits, 124M, 1x1024 tokens, {threads} thread(s): max |diff| / "
                         f"max |logit|", f"{err:.2e} (forward: pytfm {t['pytfm']:.2f} s, "
                         f"torch {t['torch']:.2f} s, ratio {t['torch'] / t['pytfm']:.2f})",
                         "ok" if err <= 1e-4 else "MISS (target 1e-4)"))
        else:
            t = {lib: statistics.median(g["step_s"] for g in runs) for lib, runs in got.items()}
            ratio = t["torch"] / t["pytfm"]
            n = TRAIN_B * TRAIN_T
            rows.append((f"train step, 124M, B{TRAIN_B} T{TRAIN_T}, {threads} thread(s): tok/s",
                         f"pytfm {n / t['pytfm']:.0f}  torch {n / t['torch']:.0f}  "
                         f"ratio {ratio:.2f}", "ok" if ratio >= 1.0 else "MISS (target 1.0)"))
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.path.insert(0, ROOT)
        worker(sys.argv[2:])
    else:
        main()
