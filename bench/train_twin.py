"""Train pytfm's GPT and its PyTorch twin the same way (same initial weights, data, schedule,
clipping and steps) and compare losses and speed.

    python bench/train_twin.py                 # train_tiny's default config and steps
    python bench/train_twin.py --steps 50 --threads 2

The model and schedule options are `python -m pytfm train`'s own (pytfm.cli.train's
add_model_args), with its defaults. Each library trains in its own process (no two thread
pools in one process), at --threads. Needs torch (`pip install torch==2.13.0`); pytfm never does.
"""

import argparse
import json
import subprocess
import sys

from common import ROOT, worker_env  # bench/ is this script's folder

WORKER = r"""
import json, sys, time
import numpy as np
from pytfm import data
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr
lib, a = sys.argv[1], json.loads(sys.argv[2])
cfg = GPTConfig(d_model=a["d_model"], n_layer=a["n_layer"], n_head=a["n_head"],
                max_seq=a["context"], pos=a["pos"], seed=a["seed"])
model = GPT(cfg)
batches = data.Batches(data.stdlib_corpus(), a["context"], a["batch"], seed=a["seed"])
if lib == "torch":
    import torch
    from bench.common import torch_twin  # the checkout's root is on PYTHONPATH
    torch.set_num_threads(a["threads"])
    twin = torch_twin().TorchGPT.from_pytfm(model)
    opt = twin.optimizer(lr=a["lr"])
else:
    opt = AdamW(model.params, model.grads, lr=a["lr"], betas=(0.9, 0.95), weight_decay=0.1)
losses, t0 = [], time.perf_counter()
for step in range(a["steps"]):
    lr = cosine_lr(step, a["lr"], a["warmup"], a["steps"], min_lr=a["lr"] / 10)
    x, y = batches.batch("train", step)
    if lib == "torch":
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss = twin(torch.from_numpy(x), torch.from_numpy(y))[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    else:
        model.zero_grad()
        losses.append(float(model.forward(x, y)[1]))
        model.backward()
        clip_grad_norm(model.grads, 1.0)
        opt.step(lr)
elapsed = time.perf_counter() - t0
if lib == "torch":
    with torch.no_grad():
        val = float(np.mean([twin(*(torch.from_numpy(t) for t in batches.batch("val", i)))[1].item()
                             for i in range(4)]))
else:
    val = float(np.mean([float(model.forward(*batches.batch("val", i))[1]) for i in range(4)]))
print(json.dumps({"losses": losses, "val": val, "seconds": elapsed,
                  "tokens_per_s": a["steps"] * a["batch"] * a["context"] / elapsed}))
"""


def main():
    sys.path.insert(0, ROOT)  # this checkout's pytfm
    from pytfm.cli import train as tiny

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=tiny.parse_args([]).steps,
                   help="optimizer steps (default: train_tiny's)")
    p.add_argument("--threads", type=int, default=2)
    tiny.add_model_args(p)
    args = vars(p.parse_args())
    env = worker_env(args["threads"], OPENBLAS_NUM_THREADS=args["threads"])
    res = {}
    for lib in ("pytfm", "torch"):
        r = subprocess.run([sys.executable, "-c", WORKER, lib, json.dumps(args)],
                           capture_output=True, text=True, env=env, cwd="/")
        if r.returncode:
            sys.exit(f"{lib} failed:\n{r.stderr[-3000:]}")
        res[lib] = json.loads(r.stdout)
    a, b = res["pytfm"], res["torch"]
    print(f"{args['steps']} steps, batch {args['batch']}x{args['context']}, "
          f"{args['threads']} threads")
    print(f"{'':8s} {'final train (mean last 10)':>27s} {'val':>7s} {'tokens/s':>9s} "
          f"{'wall s':>7s}")
    for lib, r in res.items():
        print(f"{lib:8s} {sum(r['losses'][-10:]) / 10:27.4f} {r['val']:7.4f} "
              f"{r['tokens_per_s']:9.0f} {r['seconds']:7.1f}")
    diff = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    print(f"largest per-step loss difference: {diff:.2e}; pytfm/torch tokens/s: "
          f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}")


if __name__ == "__main__":
    main()
