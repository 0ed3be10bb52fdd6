"""Sample text from a checkpoint written by train_tiny.py.

    python examples/sample.py out/model.safetensors --prompt "def " --tokens 100
"""

import argparse

from pytfm import checkpoint, data
from pytfm.generate import generate


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--prompt", default="def ")
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    model, _, _ = checkpoint.load(args.checkpoint)
    prompt = data.encode(args.prompt)[None, :]
    n_new = min(args.tokens, model.cfg.max_seq - prompt.shape[1])
    out = generate(model, prompt, n_new, args.temperature, args.top_k, args.seed)
    print(data.decode(out[0]))


if __name__ == "__main__":
    main()
