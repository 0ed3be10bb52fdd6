"""pytfm.optim — AdamW through the fused kernel, gradient clipping, learning-rate schedule."""

import math

import numpy as np

from . import device as devices
from . import ops
from ._arrays import as_float, as_int


def _real(name, v, ok, want):
    """v as a float (a real number, not a bool, within float64) for which ok(v) holds, else
    ValueError saying what `name` must be; ok must be False for NaN."""
    f = as_float(name, v, "float64")
    if not ok(f):
        raise ValueError(f"{name} must be {want}, got {f}")
    return f


def _lr(name, v):
    return _real(name, v, lambda f: 0 <= f < math.inf, "finite and >= 0")


class AdamW:
    """torch.optim.AdamW over a dict of parameters. As in GPT-2 / nanoGPT, weight decay applies
    to matrices and embeddings (ndim >= 2) only, not to biases and LayerNorm parameters.

    For a model's parameters and gradients (FlatDicts of one layout, pytfm.nn) the moments m
    and v are FlatDicts of that layout too, and a step is two calls of the fused kernel: one
    over the span of matrices, with weight decay, one over the vectors after it, without. Each
    element's update is the one the per-parameter loop (any other dict) gives, bit for bit.

    The moments live where the parameters do (on the GPU for a model there): make the
    optimizer after moving the model (GPT.to), as in torch; step() refuses parameters a move
    left behind."""

    def __init__(self, params, grads, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        # the kernel's own rules, checked here so that a bad value fails now, not at step 1
        self.lr = _lr("lr", lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self.betas = tuple(_real(f"betas[{i}]", b, lambda f: 0 <= f < 1, "in [0, 1)")
                           for i, b in enumerate(betas))
        self.eps = _real("eps", eps, lambda f: 0 < f < math.inf, "finite and > 0")
        self.weight_decay = _real("weight_decay", weight_decay, lambda f: 0 <= f < math.inf,
                                  "finite and >= 0")
        self.params, self.grads = params, grads
        self.spans = _decay_spans(params, grads)  # None: one call per parameter
        if self.spans is None:  # each moment where its parameter is
            self.m = {k: devices.module_of(p).zeros_like(p) for k, p in params.items()}
            self.v = {k: devices.module_of(p).zeros_like(p) for k, p in params.items()}
        else:
            self.m, self.v = params.zeros_like(), params.zeros_like()
        self.t = 0  # steps taken

    def step(self, lr=None):
        """One step over every parameter, at lr (None: the lr given to the constructor)."""
        lr = self.lr if lr is None else _lr("lr", lr)
        if getattr(self.params, "stale", False):
            raise RuntimeError("the model was moved (GPT.to) after this optimizer was made: its "
                               "parameters are elsewhere now; make the optimizer after moving")
        self.t += 1
        hyper = (self.t, lr, self.betas[0], self.betas[1], self.eps)
        if self.spans is not None:
            flat = (self.params.buffer, self.grads.buffer, self.m.buffer, self.v.buffer)
            for (lo, hi), wd in zip(self.spans, (self.weight_decay, 0.0)):
                if hi > lo:
                    ops.adamw_step(*(a[lo:hi] for a in flat), *hyper, wd)
            return
        for name, p in self.params.items():
            wd = self.weight_decay if p.ndim >= 2 else 0.0
            ops.adamw_step(p, self.grads[name], self.m[name], self.v[name], *hyper, wd)

    def state(self):
        """Everything needed to continue identically: {'t': int, 'm': {...}, 'v': {...}}, the
        moments where the parameters are (pytfm.checkpoint copies them to the host)."""
        return {"t": self.t, "m": self.m, "v": self.v}

    def load_state(self, state):
        """Continue from state (as state() gives; its moments NumPy or CuPy arrays, copied
        to where this optimizer's are)."""
        self.t = int(state["t"])
        for mine, theirs in ((self.m, state["m"]), (self.v, state["v"])):
            if hasattr(mine, "copy_from"):  # a FlatDict: one copy of the buffer
                mine.copy_from({name: theirs[name] for name in self.params})
                continue
            for name in self.params:
                mine[name][...] = devices.to_device(theirs[name], devices.device_of(mine[name]))


def _decay_spans(params, grads):
    """((0, end), (end, size)) of the flat buffers: the matrices (decayed) before end, the
    vectors from it, when params and grads are FlatDicts of one layout that keeps them apart
    (pytfm.nn's does); else None."""
    flat = getattr(params, "layout", None)
    if flat is None or getattr(grads, "layout", None) != flat:
        return None
    matrices = [off + math.prod(shape) for off, shape in flat.values() if len(shape) >= 2]
    vectors = [off for off, shape in flat.values() if len(shape) < 2]
    end = max(matrices, default=0)
    if vectors and min(vectors) < end:
        return None
    return (0, end), (end, params.size)


def clip_grad_norm(grads, max_norm):
    """Scale all gradients in place so that their global L2 norm is at most max_norm.
    Returns the norm before clipping (as torch.nn.utils.clip_grad_norm_), a 0-d float64 array
    where the gradients are: nothing is read back from a GPU (float(norm) reads it). max_norm =
    inf measures without clipping. The squares are summed in double: over a FlatDict's buffer
    in one call, else array by array, added in order.

    The comparison and the scale stay where the norm is, on either device alike: the scale is
    max_norm / (norm + 1e-6) rounded to float32 when norm > max_norm, else exactly 1 (so too
    for a NaN norm), and every gradient is multiplied by it (for a finite max_norm)."""
    max_norm = _real("max_norm", max_norm, lambda f: f >= 0, ">= 0 (inf: no clipping)")
    buffer = getattr(grads, "buffer", None)
    arrays = [buffer] if buffer is not None else list(grads.values())
    xp = devices.module_of(arrays[0]) if arrays else np
    total = xp.zeros((), np.float64)
    for g in arrays:
        total = total + ops.sum_squares(g)
    norm = xp.asarray(xp.sqrt(total))
    if max_norm == math.inf:  # nothing to clip (and no inf / inf to compute for an inf norm)
        return norm
    # where, not minimum: clip only when norm > max_norm (not for a NaN norm either)
    scale = xp.where(norm > max_norm, max_norm / (norm + 1e-6), xp.ones_like(norm))
    scale = scale.astype(np.float32)
    for g in arrays:
        g *= scale
    return norm


def cosine_lr(step, max_lr, warmup, total, min_lr=0.0):
    """Linear warmup over `warmup` steps, then cosine decay to min_lr at step `total`.
    step, warmup, total: integers >= 0 (step 0 is the first); max_lr, min_lr finite, >= 0."""
    for name, v in (("step", step), ("warmup", warmup), ("total", total)):
        if as_int(name, v) < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    max_lr, min_lr = _lr("max_lr", max_lr), _lr("min_lr", min_lr)
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
