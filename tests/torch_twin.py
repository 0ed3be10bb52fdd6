"""A PyTorch twin of pytfm.nn.GPT: the same architecture, parameter names and maths, so pytfm's
weights load into it one-to-one. The tests' oracle (tests/model/test_model.py, when torch is
installed: logits, loss, every gradient and the AdamW trajectory); the benchmarks import it from
here to compare training (bench/train_twin.py) and a training step (bench/worker.py's train
group). PyTorch is only an oracle and a benchmark peer, never a dependency of pytfm.
"""

import torch
import torch.nn.functional as F
from torch import nn


def rope(x, pos, base=10000.0):  # (B, T, H, D), rotate-half pairing, as pytfm_rope_forward
    half = x.shape[-1] // 2
    inv = base ** (-torch.arange(0, x.shape[-1], 2, dtype=torch.float64) / x.shape[-1])
    theta = pos.to(torch.float64)[:, None] * inv  # (T, D/2)
    cos, sin = (f(theta).to(x.dtype)[None, :, None, :] for f in (torch.cos, torch.sin))
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.H, self.hd, self.rope = cfg.n_head, cfg.d_model // cfg.n_head, cfg.pos == "rope"
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x, pos):
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.H, self.hd)
        q, k, v = qkv.unbind(dim=2)  # (B, T, H, hd), as pytfm's split
        if self.rope:
            q, k = rope(q, pos), rope(k, pos)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.c_proj(o.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(cfg.d_model), Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.mlp.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x, pos):
        x = x + self.attn(self.ln_1(x), pos)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class TorchGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.transformer.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.transformer.ln_f = nn.LayerNorm(cfg.d_model)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        if cfg.pos == "sinusoidal":
            pos = torch.arange(cfg.max_seq, dtype=torch.float64)[:, None]
            inv = 10000.0 ** (-torch.arange(0, cfg.d_model, 2, dtype=torch.float64) / cfg.d_model)
            pe = torch.zeros(cfg.max_seq, cfg.d_model, dtype=torch.float64)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * inv), torch.cos(pos * inv)
            self.register_buffer("pe", pe.float(), persistent=False)

    @classmethod
    def from_pytfm(cls, model):
        twin = cls(model.cfg)
        twin.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.params.items()})
        return twin

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        pos = torch.arange(T)
        x = self.transformer.wte(idx)
        if self.cfg.pos == "sinusoidal":
            x = x + self.pe[:T]
        for block in self.transformer.h:
            x = block(x, pos)
        x = self.transformer.ln_f(x)
        w = self.transformer.wte.weight if self.cfg.tie_embeddings else self.lm_head.weight
        logits = x @ w.T
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss

    def optimizer(self, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        """AdamW grouped as pytfm.optim.AdamW: decay on tensors with ndim >= 2 only."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                  {"params": rest, "weight_decay": 0.0}],
                                 lr=lr, betas=betas, eps=eps)


def grads_as_numpy(twin):
    return {k: p.grad.detach().numpy() for k, p in twin.named_parameters()}

