"""The Llama family's model against transformers, per case of tests/model/test_llama_model.py
(the tests' own random-weight pairs): the logits' and the worst parameter's gradient's relative
L2 difference from transformers' float64 run, one line per case.

    python dev/llama_differences.py

Needs torch and transformers (pip install ".[gpt2-test]")."""

import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests", "model"), os.path.join(ROOT, "tests")]
import test_llama_model as T  # noqa: E402  (the tests' pairs, on the path just set)


def main():
    for case in T.CASES:
        hf, model = T.pair(case)
        idx = T.tokens(model.cfg.vocab, (2, 24), 1)
        with torch.no_grad():
            ref = hf.double()(torch.from_numpy(idx)).logits.numpy()
        logits = T.rel_err(model.forward(idx)[0], ref)
        hf, model = T.pair(case, seed=1)
        hf.double()
        x, y = T.tokens(model.cfg.vocab, (2, 24), 2), T.tokens(model.cfg.vocab, (2, 24), 3)
        model.zero_grad()
        model.forward(x, y)
        model.backward()
        out = hf(torch.from_numpy(x)).logits
        F.cross_entropy(out.reshape(-1, model.cfg.vocab), torch.from_numpy(y).ravel()).backward()
        grads = dict(hf.named_parameters())
        worst = max(T.rel_err(model.grads[n], grads[n].grad.numpy()) for n in model.params)
        print(f"{case:16s} logits {logits:.1e}  worst gradient {worst:.1e}")


if __name__ == "__main__":
    main()
