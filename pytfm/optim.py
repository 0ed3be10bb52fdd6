"""pytfm.optim — AdamW through the fused kernel, gradient clipping, learning-rate schedules."""

import math
from collections.abc import Mapping

import numpy as np

from . import device as devices
from . import ops
from ._arrays import as_bool, as_float, as_int, is_array


def _real(name, v, ok, want):
    """v as a float (a real number, not a bool, within float64) for which ok(v) holds, else
    ValueError saying what `name` must be; ok must be False for NaN."""
    f = as_float(name, v, "float64")
    if not ok(f):
        raise ValueError(f"{name} must be {want}, got {f}")
    return f


def _lr(name, v):
    return _real(name, v, lambda f: 0 <= f < math.inf, "finite and >= 0")


# An AdamW step moves each parameter by about lr at most (its update m/(sqrt(v) + eps) is of
# order 1 whatever the gradients' scale): past 1, a step moves a float32 parameter of a
# network's usual size (|p| ~ 0.02 .. 1) by more than its whole value, and lr = 1e308 reaches
# the kernel as inf.
MAX_LR = 1.0


def _step_lr(name, v, weight_decay):
    """lr for a step: finite, in [0, MAX_LR], and with lr * weight_decay <= 1 (decoupled decay
    multiplies each parameter by 1 - lr * weight_decay, which must not turn it around)."""
    lr = _lr(name, v)
    if lr > MAX_LR:
        raise ValueError(f"{name} must be at most {MAX_LR:g} (an AdamW step moves a parameter by "
                         f"about lr), got {lr}")
    if lr * weight_decay > 1:
        raise ValueError(f"{name} * weight_decay must be <= 1 (each step multiplies the "
                         f"parameters by 1 - {name} * weight_decay), got {lr} * {weight_decay}")
    return lr


def _check_arrays(name, arrays, like=None):
    """arrays, once it is a dict of float32 NumPy or CuPy arrays (of like's names and shapes
    when like is given); else TypeError or ValueError naming the entry."""
    if not isinstance(arrays, Mapping):
        raise TypeError(f"{name} must be a dict of float32 arrays by name (model.{name}), got "
                        f"{type(arrays).__name__}")
    if like is not None and set(arrays) != set(like):
        missing, extra = sorted(set(like) - set(arrays)), sorted(set(arrays) - set(like))
        raise ValueError(f"{name} must have the parameters' names: missing {missing[:3]}, "
                         f"extra {extra[:3]}")
    for key, a in arrays.items():
        if not is_array(a) or a.dtype != np.float32:
            got = f"dtype {a.dtype}" if is_array(a) else type(a).__name__
            raise TypeError(f"{name}[{key!r}] must be a float32 array, got {got}")
        if like is not None and a.shape != like[key].shape:
            raise ValueError(f"{name}[{key!r}] must have its parameter's shape "
                             f"{like[key].shape}, got {a.shape}")
    return arrays


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
        # the kernel's own rules and lr's range (MAX_LR), checked here so that a bad value
        # fails now, not at step 1
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self.betas = tuple(_real(f"betas[{i}]", b, lambda f: 0 <= f < 1, "in [0, 1)")
                           for i, b in enumerate(betas))
        self.eps = _real("eps", eps, lambda f: 0 < f < math.inf, "finite and > 0")
        self.weight_decay = _real("weight_decay", weight_decay, lambda f: 0 <= f < math.inf,
                                  "finite and >= 0")
        self.lr = _step_lr("lr", lr, self.weight_decay)
        self.params = _check_arrays("params", params)
        self.grads = _check_arrays("grads", grads, like=params)
        self.spans = _decay_spans(params, grads)  # None: one call per parameter
        if self.spans is None:  # each moment where its parameter is
            self.m = {k: devices.module_of(p).zeros_like(p) for k, p in params.items()}
            self.v = {k: devices.module_of(p).zeros_like(p) for k, p in params.items()}
        else:
            self.m, self.v = params.zeros_like(), params.zeros_like()
        self.t = 0  # steps taken

    def step(self, lr=None):
        """One step over every parameter, at lr (None: the lr given to the constructor; the
        same range)."""
        lr = self.lr if lr is None else _step_lr("lr", lr, self.weight_decay)
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


def clip_grad_norm(grads, max_norm, error_if_nonfinite=False):
    """Scale all gradients in place so that their global L2 norm is at most max_norm.
    Returns the norm before clipping (as torch.nn.utils.clip_grad_norm_), a 0-d float64 array
    where the gradients are: nothing is read back from a GPU (float(norm) reads it). max_norm =
    inf measures without clipping. The squares are summed in double: over a FlatDict's buffer
    in one call, else array by array, added in order.

    Non-finite gradients (a NaN or an inf anywhere) make the norm NaN or inf and are left as
    they are, so that the norm reports them; error_if_nonfinite=True makes them a RuntimeError
    naming the first such gradient, before anything is scaled (that reads the norm: on a GPU,
    one wait for the device).

    The comparison and the scale stay where the norm is, on either device alike: the scale is
    max_norm / (norm + 1e-6) rounded to float32 when max_norm < norm < inf, else exactly 1, and
    every gradient is multiplied by it (for a finite max_norm)."""
    max_norm = _real("max_norm", max_norm, lambda f: f >= 0, ">= 0 (inf: no clipping)")
    error_if_nonfinite = as_bool("error_if_nonfinite", error_if_nonfinite)
    buffer = getattr(grads, "buffer", None)
    arrays = [buffer] if buffer is not None else list(_check_arrays("grads", grads).values())
    xp = devices.module_of(arrays[0]) if arrays else np
    total = xp.zeros((), np.float64)
    for g in arrays:
        total = total + ops.sum_squares(g)
    norm = xp.asarray(xp.sqrt(total))
    if error_if_nonfinite and not math.isfinite(float(norm)):
        first = next((name for name, g in grads.items() if not bool(xp.isfinite(g).all())), "?")
        raise RuntimeError(f"the gradients' total norm is {float(norm)}: {first!r} holds NaN or "
                           "inf (error_if_nonfinite=True)")
    if max_norm == math.inf:  # nothing to clip (and no inf / inf to compute for an inf norm)
        return norm
    # where, not minimum: clip only a finite norm above max_norm (NaN compares false, and an
    # inf one would scale by 0, which turns the infs into NaN)
    scale = xp.where((norm > max_norm) & (norm < math.inf), max_norm / (norm + 1e-6),
                     xp.ones_like(norm))
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


def transformer_lr(step, d_model, warmup, factor=1.0):
    """The learning rate of "Attention Is All You Need" (section 5.3) at `step`:

        lr = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)

    a linear rise over the first `warmup` steps, then a decay as step^-0.5. Its peak is at
    step = warmup, where both branches meet: factor · (d_model · warmup)^-0.5 (the paper's
    d_model = 512, warmup = 4000: 6.99e-4). step, d_model, warmup: integers >= 1 (step is the
    paper's step_num, the first step being 1); factor finite and >= 0. AdamW.step takes lr up
    to MAX_LR: a small d_model · warmup may ask for more (at the peak), which it refuses.
    """
    for name, v in (("step", step), ("d_model", d_model), ("warmup", warmup)):
        if as_int(name, v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    factor = _real("factor", factor, lambda f: 0 <= f < math.inf, "finite and >= 0")
    step, d_model, warmup = int(step), int(d_model), int(warmup)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
