"""pytfm.nn — a GPT built from pytfm's kernels, with hand-written backward passes.

Each layer is a small class: forward() keeps on self what backward() needs, and backward(dout),
right below it, returns the gradient of its input and ACCUMULATES the gradients of its
parameters. There is no autograd. All parameters live in one dict, model.params, and their
gradients in model.grads, keyed by the names a PyTorch GPT-2 (nanoGPT) state dict uses:
transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ... Layers hold references to those
arrays, which are only ever updated in place.
"""

import math
from dataclasses import dataclass

import numpy as np

from . import ops
from .kvcache import KVCache

POSITIONS = ("rope", "sinusoidal", "none")


@dataclass
class GPTConfig:
    vocab: int = 256  # byte-level tokens
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    max_seq: int = 128  # longest context
    pos: str = "rope"  # rope | sinusoidal (added to the embedding) | none
    tie_embeddings: bool = True  # the LM head reuses transformer.wte.weight
    seed: int = 0  # initialisation

    def __post_init__(self):
        for name in ("vocab", "d_model", "n_layer", "n_head", "max_seq"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                value = getattr(self, name)
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.pos not in POSITIONS:
            raise ValueError(f"GPTConfig.pos must be one of {POSITIONS}, got {self.pos!r}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head})")
        if self.pos == "rope" and (self.d_model // self.n_head) % 2:
            raise ValueError(f"rope needs an even head dim, got {self.d_model // self.n_head}")
        if self.pos == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")


class Parameters:
    """The model's parameters and gradients: two dicts of float32 arrays with the same keys."""

    def __init__(self, seed):
        self.params, self.grads = {}, {}
        self.rng = np.random.default_rng(seed)

    def add(self, name, shape, std=None):
        """A new parameter: normal(0, std) when std is given, else ones for 'weight', zeros."""
        if std is not None:
            value = self.rng.normal(0.0, std, shape)
        else:
            value = np.ones(shape) if name.endswith(".weight") else np.zeros(shape)
        self.params[name] = value.astype(np.float32)
        self.grads[name] = np.zeros(shape, np.float32)
        return self.params[name], self.grads[name]


class Linear:
    def __init__(self, P, name, n_in, n_out, std=0.02, bias=True):
        self.w, self.dw = P.add(f"{name}.weight", (n_out, n_in), std)
        self.b, self.db = P.add(f"{name}.bias", (n_out,)) if bias else (None, None)

    def forward(self, x):  # (..., in) -> (..., out)
        self.x = x
        return ops.linear_forward(x, self.w, self.b)

    def backward(self, dy):
        has_bias = self.b is not None
        dx, _, _ = ops.linear_backward(dy, self.x, self.w, has_bias, dw=self.dw, db=self.db)
        return dx


class Embedding:
    def __init__(self, P, name, vocab, dim):
        self.w, self.dw = P.add(f"{name}.weight", (vocab, dim), 0.02)

    def forward(self, ids):  # int64 (B, T) -> (B, T, dim)
        self.ids = ids
        return ops.embedding_forward(ids, self.w)

    def backward(self, dy):
        ops.embedding_backward(dy, self.ids, self.w.shape[0], dtable=self.dw)


class LayerNorm:
    def __init__(self, P, name, dim):
        self.w, self.dw = P.add(f"{name}.weight", (dim,))
        self.b, self.db = P.add(f"{name}.bias", (dim,))

    def forward(self, x):
        self.x = x
        y, self.mean, self.rstd = ops.layernorm_forward(x, self.w, self.b)
        return y

    def backward(self, dy):
        dx, _, _ = ops.layernorm_backward(dy, self.x, self.w, self.mean, self.rstd, dw=self.dw,
                                          db=self.db)
        return dx


class CausalSelfAttention:
    """Fused QKV projection, causal multi-head attention (RoPE on q, k when pos='rope'),
    output projection."""

    def __init__(self, P, name, cfg, proj_std):
        self.H, self.hd, self.rope = cfg.n_head, cfg.d_model // cfg.n_head, cfg.pos == "rope"
        self.c_attn = Linear(P, f"{name}.c_attn", cfg.d_model, 3 * cfg.d_model)
        self.c_proj = Linear(P, f"{name}.c_proj", cfg.d_model, cfg.d_model, std=proj_std)

    def _qkv(self, x, pos):  # (B, T, C) -> q, k, v (B, T, H, hd)
        B, T, _ = x.shape
        qkv = self.c_attn.forward(x).reshape(B, T, 3, self.H, self.hd)
        q, k, v = (np.ascontiguousarray(qkv[:, :, i]) for i in range(3))
        if self.rope:
            q, k = ops.rope_forward(q, pos), ops.rope_forward(k, pos)
        return q, k, v

    def forward(self, x, pos):
        q, k, v = self._qkv(x, pos)
        o, lse = ops.attention_forward(q, k, v, causal=True)
        self.saved = (q, k, v, o, lse, pos)
        return self.c_proj.forward(o.reshape(x.shape))

    def backward(self, dy):
        q, k, v, o, lse, pos = self.saved
        do = self.c_proj.backward(dy).reshape(o.shape)
        dq, dk, dv = ops.attention_backward(do, q, k, v, o, lse, causal=True)
        if self.rope:
            dq, dk = ops.rope_backward(dq, pos), ops.rope_backward(dk, pos)
        B, T = dy.shape[:2]
        return self.c_attn.backward(np.stack([dq, dk, dv], axis=2).reshape(B, T, -1))

    def decode(self, x, cache, pos):  # new tokens only; earlier keys/values come from cache
        q, k, v = self._qkv(x, pos)
        return self.c_proj.forward(cache.attend(q, k, v).reshape(x.shape))


class MLP:
    def __init__(self, P, name, cfg, proj_std):
        self.c_fc = Linear(P, f"{name}.c_fc", cfg.d_model, 4 * cfg.d_model)
        self.c_proj = Linear(P, f"{name}.c_proj", 4 * cfg.d_model, cfg.d_model, std=proj_std)

    def forward(self, x):
        self.h = self.c_fc.forward(x)
        return self.c_proj.forward(ops.gelu_forward(self.h))

    def backward(self, dy):
        return self.c_fc.backward(ops.gelu_backward(self.c_proj.backward(dy), self.h))


class Block:
    """Pre-norm residual block: x + attn(ln_1(x)), then + mlp(ln_2(.))."""

    def __init__(self, P, name, cfg):
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)  # GPT-2: scale residual projections
        self.ln_1 = LayerNorm(P, f"{name}.ln_1", cfg.d_model)
        self.attn = CausalSelfAttention(P, f"{name}.attn", cfg, proj_std)
        self.ln_2 = LayerNorm(P, f"{name}.ln_2", cfg.d_model)
        self.mlp = MLP(P, f"{name}.mlp", cfg, proj_std)

    def forward(self, x, pos):
        h = x + self.attn.forward(self.ln_1.forward(x), pos)
        return h + self.mlp.forward(self.ln_2.forward(h))

    def backward(self, dout):
        dh = dout + self.ln_2.backward(self.mlp.backward(dout))
        return dh + self.ln_1.backward(self.attn.backward(dh))

    def decode(self, x, cache, pos):
        h = x + self.attn.decode(self.ln_1.forward(x), cache, pos)
        return h + self.mlp.forward(self.ln_2.forward(h))


def sinusoidal_positions(n, d):  # (n, d): sin on even features, cos on odd (Vaswani et al.)
    pos = np.arange(n)[:, None]
    inv = 10000.0 ** (-np.arange(0, d, 2) / d)
    pe = np.zeros((n, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos * inv), np.cos(pos * inv)
    return pe.astype(np.float32)


class GPT:
    """Decoder-only transformer: embedding → n_layer blocks → LayerNorm → LM head."""

    def __init__(self, cfg):
        self.cfg = cfg
        P = Parameters(cfg.seed)
        self.wte = Embedding(P, "transformer.wte", cfg.vocab, cfg.d_model)
        sinusoidal = cfg.pos == "sinusoidal"
        self.pe = sinusoidal_positions(cfg.max_seq, cfg.d_model) if sinusoidal else None
        self.blocks = [Block(P, f"transformer.h.{i}", cfg) for i in range(cfg.n_layer)]
        self.ln_f = LayerNorm(P, "transformer.ln_f", cfg.d_model)
        self.lm_head = None if cfg.tie_embeddings else Linear(
            P, "lm_head", cfg.d_model, cfg.vocab, bias=False)
        self.params, self.grads = P.params, P.grads

    def num_params(self):
        return sum(p.size for p in self.params.values())

    def zero_grad(self):
        for g in self.grads.values():
            g.fill(0.0)

    def _embed(self, idx, start):
        T = idx.shape[1]
        if start + T > self.cfg.max_seq:
            raise ValueError(
                f"sequence of {start + T} tokens is longer than max_seq = {self.cfg.max_seq}")
        x = self.wte.forward(idx)
        if self.pe is not None:
            x += self.pe[start:start + T]
        return x, np.arange(start, start + T, dtype=np.int64)

    def _head(self, x):
        x = self.ln_f.forward(x)
        if self.lm_head is not None:
            return self.lm_head.forward(x)
        self.x_head = x
        return ops.linear_forward(x, self.wte.w)  # tied: logits = x · wteᵀ

    def forward(self, idx, targets=None):
        """idx int64 (B, T) -> logits (B, T, vocab), and the mean cross-entropy loss of the
        targets (B, T) when given (-1 marks a position to ignore), else None."""
        x, pos = self._embed(idx, 0)
        for block in self.blocks:
            x = block.forward(x, pos)
        logits = self._head(x)
        self.targets, loss = targets, None
        if targets is not None:
            self.logits2d = logits.reshape(-1, self.cfg.vocab)
            loss, self.lse = ops.cross_entropy_forward(self.logits2d, targets.reshape(-1))
        return logits, loss

    def backward(self):
        """Accumulate d(loss)/d(parameter) into self.grads, for the last forward's loss."""
        if getattr(self, "targets", None) is None:
            raise RuntimeError("backward() needs a preceding forward(idx, targets) with targets")
        dlogits = ops.cross_entropy_backward(self.logits2d, self.targets.reshape(-1), self.lse)
        dlogits = dlogits.reshape(self.targets.shape + (self.cfg.vocab,))
        if self.lm_head is not None:
            dx = self.lm_head.backward(dlogits)
        else:
            dx, _, _ = ops.linear_backward(dlogits, self.x_head, self.wte.w, False, dw=self.wte.dw)
        dx = self.ln_f.backward(dx)
        for block in reversed(self.blocks):
            dx = block.backward(dx)
        self.wte.backward(dx)  # the positional table, if any, is fixed

    def new_caches(self, batch):
        """One KV cache per layer, for decode()."""
        c = self.cfg
        return [KVCache(batch, c.max_seq, c.n_head, c.d_model // c.n_head)
                for _ in range(c.n_layer)]

    def decode(self, idx, caches):
        """Logits (B, n, vocab) of n new tokens idx (B, n), which follow the len(caches[0])
        tokens already decoded; appends their keys and values to the caches."""
        x, pos = self._embed(idx, len(caches[0]))
        for block, cache in zip(self.blocks, caches):
            x = block.decode(x, cache, pos)
        return self._head(x)
