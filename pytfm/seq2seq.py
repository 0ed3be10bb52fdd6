"""pytfm.seq2seq — the encoder–decoder Transformer of "Attention Is All You Need" (Vaswani et
al., 2017), with hand-written backward passes, built from pytfm.nn's layers.

    cfg = Seq2SeqConfig(src_vocab=8000, tgt_vocab=8000, d_model=512, n_head=8)
    model = Transformer(cfg, seed=0)
    logits, loss = model.forward(src, tgt_in, src_lens, tgt_lens, targets=tgt_out,
                                 label_smoothing=0.1)
    model.zero_grad(); model.backward()          # model.grads, for pytfm.optim.AdamW
    state = model.start_decode(src, src_lens)    # then decode_step(state, tokens) per token

The model: source tokens -> embedding · sqrt(d_model) + sinusoidal positions -> n_enc_layers
encoder layers (bidirectional self-attention over the source, a feed-forward network) -> a
LayerNorm: the memory. Target tokens (shifted right: BOS first) -> the same kind of embedding ->
n_dec_layers decoder layers (causal self-attention, cross-attention whose queries come from the
decoder and whose keys and values come from the memory, a feed-forward network) -> a LayerNorm
-> the output projection -> logits over the target vocabulary. Each sublayer is wrapped either
post-norm, x = LN(x + f(x)) (the paper's, norm="post"), or pre-norm, x = x + f(LN(x))
(norm="pre"); both end each stack with a LayerNorm, as torch.nn.Transformer does (its
encoder_norm and decoder_norm), so that the parameters map one to one onto it. The
feed-forward network is linear2(act(linear1(x))) of width d_ff, act ReLU (the paper's) or GELU
(tanh approximation). There is no dropout: the model is deterministic, and training it to the
paper's results would need dropout added (its residual, attention and embedding dropouts).

Padding: src (B, Ts) and tgt_in (B, Tt) are padded batches; src_lens and tgt_lens give each
sequence's length (None: every position is real). Positions past a length are padding: they
may hold any id in the vocabulary, and what they hold changes no logit at a real position and
no gradient. The encoder's attention sees the source's real keys only (its padded query rows
give zero), the decoder's self-attention is causal within the target's real positions, and
cross-attention from the target's real positions sees the source's real positions. Logits at
padded target positions are computed but mean nothing (their attention outputs are zero); the
loss ignores them. Padded positions get zero gradients, and so do the embedding rows only
padding uses.

Parameters live in one FlatDict (model.params, gradients in model.grads: see pytfm.nn), named
after torch.nn.Transformer's state dict where there is a counterpart:
encoder.layers.i.self_attn.in_proj.weight [3·d_model, d_model] is torch's in_proj_weight (q; k;
v stacked), ...self_attn.out_proj, linear1, linear2, norm1, norm2; the decoder's layers add
multihead_attn.{q,k,v,out}_proj (separate q, k and v projections: q reads the decoder, k and v
the memory; torch's in_proj_weight is the three stacked) and norm3; encoder.norm, decoder.norm.
Around them: src_embed.weight and tgt_embed.weight (one table, embed.weight, with
share_embeddings), generator.weight [tgt_vocab, d_model] (none with tie_output: the target
embedding table is the output projection; no bias either way). Matrices are drawn
normal(0, sqrt(2 / (fan_in + fan_out))) (Xavier's normal; q, k, v each its own matrix),
embedding tables normal(0, d_model^-0.5), so that table · sqrt(d_model) has unit scale; norms
start at weight 1, bias 0, and linear biases at 0.

Decoding: start_decode(src, src_lens) encodes once and computes each decoder layer's
cross-attention keys and values of the memory once; decode_step(state, tokens) runs one token
per sequence through the decoder, with one KV cache per layer for its self-attention, and gives
the logits forward() gives at that position. state.reorder(index) keeps (and repeats) batch
rows, for beam search (pytfm.beam).

One thread trains a model at a time (the layers keep what backward() needs); forward with
save=False, decoding and cross_attention_probs keep nothing in the model and may run beside it.
Devices: "cpu" (NumPy arrays, the C kernels) or "cuda" (CuPy arrays, the CUDA kernels); the
token ids must be on the model's device.
"""

import math
import numbers
from dataclasses import dataclass

import numpy as np

from . import device as devices
from . import ops
from ._arrays import as_bool, as_float, check_index_arrays, is_array
from .kvcache import KVCache
from .nn import MAX_ATTENTION_BYTES, FlatDict, LayerNorm, Linear, Parameters, flat_layout

NORMS = ("post", "pre")
ACTIVATIONS = ("relu", "gelu")
IGNORE = -1  # the loss's ignore index: targets at padded positions become it


@dataclass
class Seq2SeqConfig:
    src_vocab: int
    tgt_vocab: int
    d_model: int = 512
    n_head: int = 8  # dividing d_model
    n_enc_layers: int = 6
    n_dec_layers: int = 6
    d_ff: int = 2048  # the feed-forward network's hidden width
    max_len: int = 256  # the longest source or target sequence (the position table's rows)
    norm: str = "post"  # "post": x = LN(x + f(x)), the paper's; "pre": x = x + f(LN(x))
    activation: str = "relu"  # of the feed-forward network: "relu" (the paper's) or "gelu"
    share_embeddings: bool = False  # one table for source and target (src_vocab == tgt_vocab)
    tie_output: bool = False  # the output projection is the target embedding table

    def __post_init__(self):
        """TypeError for a field of the wrong type (a bool is not an int), ValueError for a
        wrong value, naming the field."""
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_head", "n_enc_layers",
                     "n_dec_layers", "d_ff", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
                raise TypeError(f"Seq2SeqConfig.{name} must be an int, got {value!r}")
            if not 1 <= value < 2**31:
                raise ValueError(f"Seq2SeqConfig.{name} must be in [1, 2**31), got {value}")
            setattr(self, name, int(value))
        for name, choices in (("norm", NORMS), ("activation", ACTIVATIONS)):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"Seq2SeqConfig.{name} must be a str, got {value!r}")
            if value not in choices:
                raise ValueError(f"Seq2SeqConfig.{name} must be one of {choices}, got {value!r}")
        for name in ("share_embeddings", "tie_output"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"Seq2SeqConfig.{name} must be a bool, got "
                                f"{getattr(self, name)!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"Seq2SeqConfig.n_head = {self.n_head} must divide d_model = "
                             f"{self.d_model}")
        if self.d_model % 2:
            raise ValueError(f"Seq2SeqConfig.d_model must be even (the sinusoidal positions "
                             f"pair sin and cos), got {self.d_model}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"Seq2SeqConfig.share_embeddings needs src_vocab == tgt_vocab, got "
                             f"{self.src_vocab} and {self.tgt_vocab}")


def _xavier(n_in, n_out):
    return math.sqrt(2.0 / (n_in + n_out))


class _Shapes:
    """A stand-in for Parameters that records (name, shape) of each add() and returns arrays
    of no memory: the first of Transformer's two builds, which lays out the FlatDicts."""

    def __init__(self):
        self.shapes = []

    def add(self, name, shape, std=None):
        self.shapes.append((name, tuple(shape)))
        empty = np.broadcast_to(np.float32(0), shape)
        return empty, empty


class _Params(Parameters):
    """nn.Parameters over given FlatDicts (params, grads), drawing from seed when init."""

    def __init__(self, params, grads, seed, init=True):
        self.params, self.grads = params, grads
        self.rng = np.random.default_rng(seed)
        self.init = init


# ---- layers ------------------------------------------------------------------------------------


class TokenEmbedding:
    """table[ids] · sqrt(d_model) + pe[start : start + T]; table (and its gradient) an array of
    the model's, shared by two of these with share_embeddings."""

    def __init__(self, w, dw, pe):
        self.w, self.dw, self.pe = w, dw, pe
        self.scale = math.sqrt(w.shape[1])
        self.saved = None

    def forward(self, ids, start=0, save=True):  # int64 (B, T) -> (B, T, C)
        if save:
            self.saved = ids
        x = ops.embedding_forward(ids, self.w, check_ids=False)  # the model checked them
        x *= self.scale
        x += self.pe[start:start + ids.shape[1]]
        return x

    def backward(self, dx):  # (B, T, C) -> None (ids have no gradient; the table's accumulates)
        ids = self.saved
        ops.embedding_backward(dx * self.scale, ids, self.w.shape[0], dtable=self.dw,
                               check_ids=False)


class SelfAttention:
    """Multi-head self-attention over x's own positions, q, k, v from one product (in_proj,
    [3·C, C], torch's in_proj_weight), then out_proj. causal (the decoder's) or bidirectional
    (the encoder's); lens: each sequence's real length, or None (all T): query rows past it
    give zero and keys past it are seen by no one."""

    def __init__(self, P, name, C, H, causal):
        self.H, self.hd, self.causal = H, C // H, causal
        std = _xavier(C, C)  # each of q, k, v is a [C, C] map
        self.in_proj = Linear(P, f"{name}.in_proj", C, 3 * C, std=std)
        self.out_proj = Linear(P, f"{name}.out_proj", C, C, std=std)
        self.saved = None

    def forward(self, x, lens, save=True, cache=None):  # (B, T, C), (B,) or None -> (B, T, C)
        """With a KV cache (decoding: causal only), x holds new tokens, which attend to
        themselves and to the cached ones; lens is not used then (every decoded position is
        real) and nothing is saved."""
        save = save and cache is None
        B, T, C = x.shape
        qkv = self.in_proj.forward(x, save).reshape(B, T, 3, self.H, self.hd)
        q, k, v = ops.qkv_split_forward(qkv)  # (B, T, H, hd) each
        if cache is not None:
            o = cache.attend(q, k, v)
        else:
            o, lse = ops.attention_forward(q, k, v, causal=self.causal, q_lens=lens,
                                           k_lens=lens)  # (B, T, H, hd), (B, H, T)
            if save:
                self.saved = (q, k, v, o, lse, lens)
        return self.out_proj.forward(o.reshape(B, T, C), save)

    def backward(self, dy):  # (B, T, C) -> (B, T, C)
        q, k, v, o, lse, lens = self.saved
        do = self.out_proj.backward(dy).reshape(o.shape)  # (B, T, H, hd)
        dq, dk, dv = ops.attention_backward(do, q, k, v, o, lse, causal=self.causal,
                                            q_lens=lens, k_lens=lens)
        dqkv = ops.qkv_split_backward(dq, dk, dv)  # (B, T, 3, H, hd)
        return self.in_proj.backward(dqkv.reshape(dy.shape[:2] + (-1,)))


class CrossAttention:
    """Queries from the decoder's x (q_proj), keys and values from the encoder's memory
    (k_proj, v_proj: memory_kv), then out_proj; no causal mask. Query row t of sequence b sees
    memory position s iff t < q_lens[b] and s < k_lens[b]."""

    def __init__(self, P, name, C, H):
        self.H, self.hd = H, C // H
        std = _xavier(C, C)
        self.q_proj = Linear(P, f"{name}.q_proj", C, C, std=std)
        self.k_proj = Linear(P, f"{name}.k_proj", C, C, std=std)
        self.v_proj = Linear(P, f"{name}.v_proj", C, C, std=std)
        self.out_proj = Linear(P, f"{name}.out_proj", C, C, std=std)
        self.saved = None

    def memory_kv(self, memory, save=True):  # (B, Ts, C) -> k, v (B, Ts, H, hd) each
        B, Ts, _ = memory.shape
        return tuple(proj.forward(memory, save).reshape(B, Ts, self.H, self.hd)
                     for proj in (self.k_proj, self.v_proj))

    def forward(self, x, kv, q_lens, k_lens, save=True, probe=None):  # (B, Tt, C) -> (B, Tt, C)
        """kv: memory_kv(memory) (made with the same save); probe: None, or a list that gets
        (q, k, lse, q_lens, k_lens), for cross_attention_probs."""
        B, T, C = x.shape
        k, v = kv
        q = self.q_proj.forward(x, save).reshape(B, T, self.H, self.hd)
        o, lse = ops.attention_forward(q, k, v, causal=False, q_lens=q_lens, k_lens=k_lens)
        if save:
            self.saved = (q, k, v, o, lse, q_lens, k_lens)
        if probe is not None:
            probe.append((q, k, lse, q_lens, k_lens))
        return self.out_proj.forward(o.reshape(B, T, C), save)

    def backward(self, dy):  # (B, Tt, C) -> dx (B, Tt, C), dmemory (B, Ts, C)
        q, k, v, o, lse, q_lens, k_lens = self.saved
        do = self.out_proj.backward(dy).reshape(o.shape)
        dq, dk, dv = ops.attention_backward(do, q, k, v, o, lse, causal=False, q_lens=q_lens,
                                            k_lens=k_lens)
        dx = self.q_proj.backward(dq.reshape(dy.shape))
        B, Ts = k.shape[:2]
        dmemory = self.k_proj.backward(dk.reshape(B, Ts, -1))  # fresh: add v's in place
        dmemory += self.v_proj.backward(dv.reshape(B, Ts, -1))
        return dx, dmemory


class FeedForward:
    """linear2(act(linear1(x))), act ReLU or GELU (tanh approximation)."""

    def __init__(self, P, name, C, F, activation):
        self.linear1 = Linear(P, f"{name}.linear1", C, F, std=_xavier(C, F))
        self.linear2 = Linear(P, f"{name}.linear2", F, C, std=_xavier(F, C))
        self.gelu = activation == "gelu"
        self.saved = None

    def forward(self, x, save=True):  # (B, T, C) -> (B, T, C)
        if self.gelu:
            a, h = self.linear1.forward_gelu(x, save)  # gelu(h), h: (B, T, F) each
        else:
            h = self.linear1.forward(x, save)
            a = devices.module_of(h).maximum(h, 0)
        if save:
            self.saved = h
        return self.linear2.forward(a, save)

    def backward(self, dy):  # (B, T, C) -> (B, T, C)
        h = self.saved
        da = self.linear2.backward(dy)  # (B, T, F)
        if self.gelu:
            dh = ops.gelu_backward(da, h)
        else:  # relu'(h) = [h > 0]
            dh = da
            dh *= h > 0
        return self.linear1.backward(dh)


def _residual(norm, pre, f, x, save):
    """pre: x + f(LN(x)); post: LN(x + f(x)). f's output is fresh (the add goes in place into
    it, never into x, which a norm may keep for its backward)."""
    if pre:
        y = f(norm.forward(x, save))
        y += x
        return y
    y = f(x)
    y += x
    return norm.forward(y, save)


def _residual_backward(norm, pre, f_backward, dy):
    """The gradient of _residual's input, f_backward f's (returning a fresh array)."""
    if pre:
        dx = norm.backward(f_backward(dy))
        dx += dy
        return dx
    dy = norm.backward(dy)
    dx = f_backward(dy)
    dx += dy
    return dx


class EncoderLayer:
    def __init__(self, P, name, cfg):
        C = cfg.d_model
        self.pre = cfg.norm == "pre"
        self.self_attn = SelfAttention(P, f"{name}.self_attn", C, cfg.n_head, causal=False)
        self.ff = FeedForward(P, name, C, cfg.d_ff, cfg.activation)
        self.norm1 = LayerNorm(P, f"{name}.norm1", C)
        self.norm2 = LayerNorm(P, f"{name}.norm2", C)

    def forward(self, x, lens, save=True):  # (B, Ts, C) -> (B, Ts, C)
        x = _residual(self.norm1, self.pre, lambda y: self.self_attn.forward(y, lens, save),
                      x, save)
        return _residual(self.norm2, self.pre, lambda y: self.ff.forward(y, save), x, save)

    def backward(self, dy):  # (B, Ts, C) -> (B, Ts, C)
        dx = _residual_backward(self.norm2, self.pre, self.ff.backward, dy)
        return _residual_backward(self.norm1, self.pre, self.self_attn.backward, dx)


class DecoderLayer:
    def __init__(self, P, name, cfg):
        C = cfg.d_model
        self.pre = cfg.norm == "pre"
        self.self_attn = SelfAttention(P, f"{name}.self_attn", C, cfg.n_head, causal=True)
        self.cross = CrossAttention(P, f"{name}.multihead_attn", C, cfg.n_head)
        self.ff = FeedForward(P, name, C, cfg.d_ff, cfg.activation)
        self.norm1 = LayerNorm(P, f"{name}.norm1", C)
        self.norm2 = LayerNorm(P, f"{name}.norm2", C)
        self.norm3 = LayerNorm(P, f"{name}.norm3", C)

    def forward(self, x, tgt_lens, kv, src_lens, save=True, cache=None, probe=None):
        """(B, Tt, C) -> (B, Tt, C); kv: self.cross.memory_kv(memory); cache: the
        self-attention's KV cache when decoding (then nothing is saved)."""
        save = save and cache is None
        x = _residual(self.norm1, self.pre,
                      lambda y: self.self_attn.forward(y, tgt_lens, save, cache), x, save)
        x = _residual(self.norm2, self.pre,
                      lambda y: self.cross.forward(y, kv, tgt_lens, src_lens, save, probe),
                      x, save)
        return _residual(self.norm3, self.pre, lambda y: self.ff.forward(y, save), x, save)

    def backward(self, dy):  # (B, Tt, C) -> dx (B, Tt, C), dmemory (B, Ts, C)
        dx = _residual_backward(self.norm3, self.pre, self.ff.backward, dy)
        dmemory = []

        def cross_backward(d):
            dx, dm = self.cross.backward(d)
            dmemory.append(dm)
            return dx

        dx = _residual_backward(self.norm2, self.pre, cross_backward, dx)
        return _residual_backward(self.norm1, self.pre, self.self_attn.backward, dx), dmemory[0]


# ---- decoding state ----------------------------------------------------------------------------


def _as_index(index, batch, what):
    """index: B' ints in [0, batch) (a list, tuple, NumPy or CuPy int array) -> int64 NumPy."""
    if is_array(index):
        index = devices.to_host(index)
        if index.dtype.kind not in "iu":
            raise TypeError(f"{what}: index must hold integers, got dtype {index.dtype}")
    elif isinstance(index, (list, tuple)):
        if not all(isinstance(i, numbers.Integral) and not isinstance(i, (bool, np.bool_))
                   for i in index):
            raise TypeError(f"{what}: index must hold integers, got {index!r}")
    else:
        raise TypeError(f"{what}: index must be a list, tuple or int array of batch rows, got "
                        f"{type(index).__name__}")
    index = np.asarray(index, np.int64).reshape(-1) if len(index) else np.zeros(0, np.int64)
    if index.size == 0:
        raise ValueError(f"{what}: index must keep at least one row, got none")
    bad = (index < 0) | (index >= batch)
    if bad.any():
        raise ValueError(f"{what}: index[{int(bad.argmax())}] = {int(index[bad.argmax()])} is "
                         f"not a row of a batch of {batch}")
    return index


class DecodeState:
    """What Transformer.decode_step needs between calls: one KV cache per decoder layer (the
    self-attention's keys and values of the tokens decoded so far), each decoder layer's
    cross-attention keys and values of the memory (mem_kv), the source lengths. batch: the
    rows; len(state): the positions decoded so far."""

    def __init__(self, caches, mem_kv, src_lens):
        self.caches, self.mem_kv, self.src_lens = caches, mem_kv, src_lens

    @property
    def batch(self):
        return self.src_lens.shape[0]

    def __len__(self):
        return len(self.caches[0])

    def reorder(self, index):
        """Keep the batch rows index (B' ints in [0, batch); a row may repeat or go): row i
        becomes old row index[i], in every cache, the memory's keys and values, and the source
        lengths. For beam search: the hypotheses that survive a step, each its parent's rows."""
        index = _as_index(index, self.batch, "DecodeState.reorder")
        for cache in self.caches:
            cache.reorder(index)
        rows = devices.to_device(index, self.caches[0].device)
        self.mem_kv = [(k[rows], v[rows]) for k, v in self.mem_kv]  # fresh, C-contiguous
        self.src_lens = self.src_lens[index]
        return self


# ---- the model ---------------------------------------------------------------------------------


class Transformer:
    """The encoder–decoder (see the module's docstring). Transformer(cfg, seed=0,
    device="cpu"): parameters drawn from np.random.default_rng(seed), on the host, then moved
    to device ("cpu" or "cuda")."""

    def __init__(self, cfg, seed=0, device="cpu"):
        if not isinstance(cfg, Seq2SeqConfig):
            raise TypeError(f"cfg must be a pytfm.seq2seq.Seq2SeqConfig, got "
                            f"{type(cfg).__name__}")
        if not isinstance(seed, numbers.Integral) or isinstance(seed, (bool, np.bool_)):
            raise TypeError(f"seed must be a non-negative int, got {seed!r}")
        if seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed}")
        self.xp = devices.array_module(device)  # a bad name or an unusable GPU fails here
        self.cfg, self.device = cfg, device
        shapes = _Shapes()
        self._build(shapes, np.zeros((cfg.max_len, cfg.d_model), np.float32))
        params = FlatDict(*flat_layout(shapes.shapes))
        grads = params.zeros_like()
        self._build(_Params(params, grads, seed), None)  # draws, on the host
        if device != "cpu":
            params, grads = params.to(device), grads.to(device)
            self._build(_Params(params, grads, seed, init=False),
                        devices.to_device(self.pe, device))
        self._params, self._grads = params, grads
        self.saved = None

    def _build(self, P, pe):
        """Make every layer, its parameters from P (in this order: the draws follow it)."""
        cfg, C = self.cfg, self.cfg.d_model
        self.pe = ops.sinusoidal_positions(cfg.max_len, C) if pe is None else pe
        if cfg.share_embeddings:
            w, dw = P.add("embed.weight", (cfg.src_vocab, C), C ** -0.5)
            src, tgt = (w, dw), (w, dw)
        else:
            src = P.add("src_embed.weight", (cfg.src_vocab, C), C ** -0.5)
            tgt = P.add("tgt_embed.weight", (cfg.tgt_vocab, C), C ** -0.5)
        self.src_embed, self.tgt_embed = TokenEmbedding(*src, self.pe), \
            TokenEmbedding(*tgt, self.pe)
        self.encoder = [EncoderLayer(P, f"encoder.layers.{i}", cfg)
                        for i in range(cfg.n_enc_layers)]
        self.encoder_norm = LayerNorm(P, "encoder.norm", C)
        self.decoder = [DecoderLayer(P, f"decoder.layers.{i}", cfg)
                        for i in range(cfg.n_dec_layers)]
        self.decoder_norm = LayerNorm(P, "decoder.norm", C)
        self.generator = Linear(P, "generator", C, cfg.tgt_vocab, std=_xavier(C, cfg.tgt_vocab),
                                bias=False, tied=self.tgt_embed if cfg.tie_output else None)

    @property
    def params(self):
        """The parameters: a FlatDict of float32 arrays (views into params.buffer)."""
        return self._params

    @property
    def grads(self):
        """The gradients, of params's layout: accumulated by backward(), zeroed by zero_grad()."""
        return self._grads

    def num_params(self):
        return sum(p.size for p in self._params.values())

    def zero_grad(self):
        self._grads.buffer.fill(0.0)

    # ---- inputs -------------------------------------------------------------------------------

    def _check_ids(self, what, named, values=True):
        """named: (name, ids, vocab, ignore) of int64 (B, T) arrays on the model's device,
        C-contiguous, of one batch B; ids in [0, vocab) (or == ignore) when values."""
        kind = "a cupy.ndarray" if self.device == "cuda" else "a numpy.ndarray"
        for name, a, _, _ in named:
            want = f"{name} must be {kind} of int64 token ids, of shape (B, T)"
            if not is_array(a):
                raise TypeError(f"Transformer.{what}: {want}, got {type(a).__name__}")
            if devices.device_of(a) != self.device:
                raise TypeError(f"Transformer.{what}: {name} is on {devices.device_of(a)} but "
                                f"the model is on {self.device}")
            if a.dtype != np.int64:
                raise TypeError(f"Transformer.{what}: {want}, got dtype {a.dtype}")
            if a.ndim != 2 or a.shape[1] < 1 or a.shape[0] < 1:
                raise ValueError(f"Transformer.{what}: {want} with B, T >= 1, got shape "
                                 f"{a.shape}")
            if not a.flags.c_contiguous:
                raise ValueError(f"Transformer.{what}: {name} must be C-contiguous "
                                 f"(np.ascontiguousarray({name}))")
            if a.shape[1] > self.cfg.max_len:
                raise ValueError(f"Transformer.{what}: {name} has {a.shape[1]} positions, more "
                                 f"than max_len = {self.cfg.max_len}")
            if a.shape[0] != named[0][1].shape[0]:
                raise ValueError(f"Transformer.{what}: {name} has a batch of {a.shape[0]}, "
                                 f"{named[0][0]} of {named[0][1].shape[0]}")
        if values:
            check_index_arrays(*named)

    def _lens(self, what, name, lens, ids):
        """lens: None (every position of ids (B, T) is real), or B ints in [1, T] (a list,
        tuple, NumPy or CuPy int array) -> None or int64 NumPy (B,)."""
        if lens is None:
            return None
        B, T = ids.shape
        if is_array(lens):
            lens = devices.to_host(lens)
            if lens.dtype.kind not in "iu":
                raise TypeError(f"Transformer.{what}: {name} must hold integers, got dtype "
                                f"{lens.dtype}")
        elif isinstance(lens, (list, tuple)):
            if not all(isinstance(n, numbers.Integral) and not isinstance(n, (bool, np.bool_))
                       for n in lens):
                raise TypeError(f"Transformer.{what}: {name} must hold integers, got {lens!r}")
        else:
            raise TypeError(f"Transformer.{what}: {name} must be None or {B} ints (a list, "
                            f"tuple or int array), got {type(lens).__name__}")
        lens = np.asarray(lens, dtype=np.int64)
        if lens.shape != (B,):
            raise ValueError(f"Transformer.{what}: {name} must hold B = {B} lengths, one per "
                             f"sequence, got shape {lens.shape}")
        bad = (lens < 1) | (lens > T)
        if bad.any():
            i = int(bad.argmax())
            raise ValueError(f"Transformer.{what}: {name}[{i}] = {int(lens[i])} is outside "
                             f"[1, {T}] (a sequence has at least one token, at most the "
                             f"array's T = {T}, itself at most max_len = {self.cfg.max_len})")
        return lens

    def _targets(self, targets, tgt_lens):
        """targets with the positions past tgt_lens set to IGNORE (a copy: the caller's stay)."""
        if tgt_lens is None:
            return targets
        xp = self.xp
        T = targets.shape[1]
        pad = xp.arange(T)[None, :] >= xp.asarray(tgt_lens)[:, None]
        return xp.where(pad, IGNORE, targets)

    # ---- training -------------------------------------------------------------------------------

    def _encode(self, src, src_lens, save):  # int64 (B, Ts) -> memory (B, Ts, C)
        x = self.src_embed.forward(src, 0, save)
        for layer in self.encoder:
            x = layer.forward(x, src_lens, save)
        return self.encoder_norm.forward(x, save)

    def _decode(self, tgt, memory, src_lens, tgt_lens, save, probe=None):  # -> (B, Tt, V)
        x = self.tgt_embed.forward(tgt, 0, save)
        for layer in self.decoder:
            x = layer.forward(x, tgt_lens, layer.cross.memory_kv(memory, save), src_lens, save,
                              probe=probe)
        return self.generator.forward(self.decoder_norm.forward(x, save), save)

    def _inputs(self, what, src, tgt_in, src_lens, tgt_lens, targets=None):
        self._check_ids(what, [("src", src, self.cfg.src_vocab, None),
                               ("tgt_in", tgt_in, self.cfg.tgt_vocab, None)])
        if targets is not None:
            self._check_ids(what, [("targets", targets, 0, None)], values=False)
            if targets.shape != tgt_in.shape:
                raise ValueError(f"Transformer.{what}: targets must have tgt_in's shape "
                                 f"{tgt_in.shape}, got {targets.shape}")
        src_lens = self._lens(what, "src_lens", src_lens, src)
        tgt_lens = self._lens(what, "tgt_lens", tgt_lens, tgt_in)
        if targets is not None:
            self._check_ids(what, [("targets", self._targets(targets, tgt_lens),
                                    self.cfg.tgt_vocab, IGNORE)])
        return src_lens, tgt_lens

    def forward(self, src, tgt_in, src_lens=None, tgt_lens=None, targets=None,
                label_smoothing=0.0, *, save=None):
        """src int64 (B, Ts), tgt_in int64 (B, Tt) (the target shifted right, BOS first), their
        lengths (None: all real) -> logits (B, Tt, tgt_vocab); with targets (B, Tt), (logits,
        loss): the mean cross-entropy over the real target positions (t < tgt_lens[b]; a
        target of -1 is ignored too), with label smoothing ε (torch's definition:
        ops.cross_entropy_forward). loss is a 0-d float32 array on the model's device.

        save: keep what backward() needs (the default when targets are given); save=False
        evaluates without disturbing a pending backward()."""
        save = targets is not None if save is None else as_bool("save", save)
        if save and targets is None:
            raise ValueError("Transformer.forward(save=True) needs targets: backward() starts "
                             "at the loss")
        label_smoothing = as_float("label_smoothing", label_smoothing)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        src_lens, tgt_lens = self._inputs("forward", src, tgt_in, src_lens, tgt_lens, targets)
        memory = self._encode(src, src_lens, save)
        logits = self._decode(tgt_in, memory, src_lens, tgt_lens, save)
        if targets is None:
            return logits
        kept = self._targets(targets, tgt_lens)
        smoothing = {"label_smoothing": label_smoothing} if label_smoothing else {}
        loss, lse = ops.cross_entropy_forward(logits, kept, IGNORE, check_ids=False,
                                              **smoothing)
        if save:
            self.saved = (logits, kept, lse, smoothing)
        return logits, loss

    def backward(self):
        """Accumulate d(loss)/d(parameter) into self.grads, for the loss of the last forward()
        that saved (with targets)."""
        if self.saved is None:
            raise RuntimeError("Transformer.backward() needs a preceding forward(src, tgt_in, "
                               "..., targets=...)")
        logits, kept, lse, smoothing = self.saved
        dlogits = ops.cross_entropy_backward(logits, kept, lse, IGNORE, check_ids=False,
                                             **smoothing)
        dx = self.decoder_norm.backward(self.generator.backward(dlogits))  # (B, Tt, C)
        dmemory = None
        for layer in reversed(self.decoder):
            dx, dm = layer.backward(dx)
            if dmemory is None:
                dmemory = dm
            else:
                dmemory += dm  # every layer's cross-attention reads the memory
        self.tgt_embed.backward(dx)
        dx = self.encoder_norm.backward(dmemory)
        for layer in reversed(self.encoder):
            dx = layer.backward(dx)
        self.src_embed.backward(dx)

    # ---- decoding ------------------------------------------------------------------------------

    def start_decode(self, src, src_lens=None, max_len=None):
        """Encode src (B, Ts) once, compute each decoder layer's cross-attention keys and
        values of the memory, and make one KV cache per decoder layer with room for max_len
        tokens (default and at most cfg.max_len) -> a DecodeState for decode_step."""
        what = "start_decode"
        self._check_ids(what, [("src", src, self.cfg.src_vocab, None)])
        src_lens = self._lens(what, "src_lens", src_lens, src)
        B, Ts = src.shape
        if max_len is None:
            max_len = self.cfg.max_len
        if not isinstance(max_len, numbers.Integral) or isinstance(max_len, (bool, np.bool_)):
            raise TypeError(f"Transformer.start_decode: max_len must be an int, got {max_len!r}")
        if not 1 <= max_len <= self.cfg.max_len:
            raise ValueError(f"Transformer.start_decode: max_len must be in [1, cfg.max_len = "
                             f"{self.cfg.max_len}], got {max_len}")
        memory = self._encode(src, src_lens, save=False)
        mem_kv = [layer.cross.memory_kv(memory, save=False) for layer in self.decoder]
        H = self.cfg.n_head
        caches = [KVCache(B, int(max_len), H, self.cfg.d_model // H, device=self.device)
                  for _ in self.decoder]
        lens = np.full(B, Ts, np.int64) if src_lens is None else src_lens
        return DecodeState(caches, mem_kv, lens)

    def decode_step(self, state, tokens):
        """tokens int64 (B,) (BOS at the first step) -> logits (B, tgt_vocab), float32: the
        logits forward() gives at the next position, given the tokens decoded so far; appends
        the tokens' keys and values to state's caches."""
        if not isinstance(state, DecodeState):
            raise TypeError(f"Transformer.decode_step: state must be a DecodeState "
                            f"(start_decode), got {type(state).__name__}")
        if not is_array(tokens) or getattr(tokens, "ndim", None) != 1:
            raise TypeError(f"Transformer.decode_step: tokens must be an int64 array of shape "
                            f"(B,), got {getattr(tokens, 'shape', type(tokens).__name__)}")
        if tokens.shape[0] != state.batch:
            raise ValueError(f"Transformer.decode_step: tokens has {tokens.shape[0]} rows, the "
                             f"state {state.batch}")
        if devices.device_of(tokens) != self.device:
            raise TypeError(f"Transformer.decode_step: tokens is on "
                            f"{devices.device_of(tokens)} but the model is on {self.device}")
        tokens = self.xp.ascontiguousarray(tokens).reshape(-1, 1)
        self._check_ids("decode_step", [("tokens", tokens, self.cfg.tgt_vocab, None)])
        pos, room = len(state), state.caches[0].k.shape[1]
        if pos >= room:
            raise ValueError(f"Transformer.decode_step: the state has decoded {pos} tokens, all "
                             f"its caches hold (start_decode's max_len)")
        x = self.tgt_embed.forward(tokens, pos, save=False)  # (B, 1, C)
        for layer, cache, kv in zip(self.decoder, state.caches, state.mem_kv):
            x = layer.forward(x, None, kv, state.src_lens, save=False, cache=cache)
        logits = self.generator.forward(self.decoder_norm.forward(x, save=False), save=False)
        return logits.reshape(tokens.shape[0], -1)

    def cross_attention_probs(self, src, tgt_in, src_lens=None, tgt_lens=None):
        """The cross-attention weights, per decoder layer, of a forward pass (save=False):
        a list of n_dec_layers float32 NumPy arrays (B, H, Tt, Ts), P[b, h, t, s] the weight
        target position t of head h gives source position s; 0 for s >= src_lens[b] and for
        the rows t >= tgt_lens[b]; each real row sums to 1. Rebuilt from the kernel's q, k and
        lse, as nn.attention_probs. At most MAX_ATTENTION_BYTES of maps."""
        src_lens, tgt_lens = self._inputs("cross_attention_probs", src, tgt_in, src_lens,
                                          tgt_lens)
        (B, Ts), Tt = src.shape, tgt_in.shape[1]
        size = 4 * B * self.cfg.n_head * Tt * Ts * self.cfg.n_dec_layers
        if size > MAX_ATTENTION_BYTES:
            raise ValueError(f"cross_attention_probs: the maps would take {size / 2**20:,.0f} "
                             f"MiB, more than the {MAX_ATTENTION_BYTES // 2**20} MiB allowed "
                             "(MAX_ATTENTION_BYTES): they are for short inputs")
        probe = []
        memory = self._encode(src, src_lens, save=False)
        self._decode(tgt_in, memory, src_lens, tgt_lens, save=False, probe=probe)
        return [_cross_probs(*got) for got in probe]


def _cross_probs(q, k, lse, q_lens, k_lens):  # [B, Tt, H, D], [B, Ts, H, D], [B, H, Tt] -> P
    """P[b, h, t, s] = exp(q_t·k_s / sqrt(D) − lse_t) where t < q_lens[b] and s < k_lens[b],
    else 0, in float64, returned as float32 (B, H, Tt, Ts) on the host."""
    q, k, lse = (devices.to_host(a).astype(np.float64) for a in (q, k, lse))
    B, Tt, _, D = q.shape
    Ts = k.shape[1]
    q_lens = np.full(B, Tt) if q_lens is None else q_lens
    k_lens = np.full(B, Ts) if k_lens is None else k_lens
    seen = ((np.arange(Tt)[None, :, None] < q_lens[:, None, None])
            & (np.arange(Ts)[None, None, :] < k_lens[:, None, None]))[:, None]  # (B, 1, Tt, Ts)
    scores = np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
    scores -= np.where(np.isfinite(lse), lse, 0.0)[..., None]
    return np.where(seen, np.exp(np.where(seen, scores, -np.inf)), 0.0).astype(np.float32)
