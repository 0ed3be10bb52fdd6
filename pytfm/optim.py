"""pytfm.optim — AdamW through the fused kernel, gradient clipping, learning-rate schedule."""

import math

import numpy as np

from . import ops


class AdamW:
    """torch.optim.AdamW over a dict of parameters. As in GPT-2 / nanoGPT, weight decay applies
    to matrices and embeddings (ndim >= 2) only, not to biases and LayerNorm parameters."""

    def __init__(self, params, grads, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        self.params, self.grads = params, grads
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.m = {k: np.zeros_like(p) for k, p in params.items()}
        self.v = {k: np.zeros_like(p) for k, p in params.items()}
        self.t = 0  # steps taken

    def step(self, lr=None):
        self.t += 1
        lr = self.lr if lr is None else lr
        for name, p in self.params.items():
            wd = self.weight_decay if p.ndim >= 2 else 0.0
            ops.adamw_step(p, self.grads[name], self.m[name], self.v[name], self.t, lr,
                           self.betas[0], self.betas[1], self.eps, wd)

    def state(self):
        """Everything needed to continue identically: {'t': int, 'm': {...}, 'v': {...}}."""
        return {"t": self.t, "m": self.m, "v": self.v}

    def load_state(self, state):
        self.t = int(state["t"])
        for name in self.params:
            self.m[name][...] = state["m"][name]
            self.v[name][...] = state["v"][name]


def clip_grad_norm(grads, max_norm):
    """Scale all gradients in place so that their global L2 norm is at most max_norm.
    Returns the norm before clipping (as torch.nn.utils.clip_grad_norm_)."""
    norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    if norm > max_norm:
        scale = np.float32(max_norm / (norm + 1e-6))
        for g in grads.values():
            g *= scale
    return norm


def cosine_lr(step, max_lr, warmup, total, min_lr=0.0):
    """Linear warmup over `warmup` steps, then cosine decay to min_lr at step `total`."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
