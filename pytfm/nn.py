"""pytfm.nn — a GPT built from pytfm's kernels, with hand-written backward passes.

Two families, one model: GPT(cfg) builds GPT-2's decoder (cfg.arch "gpt": LayerNorm,
CausalSelfAttention, a GELU MLP) or the Llama family's (arch "llama": RMSNorm,
GroupedQueryAttention with RoPE, a SwiGLU MLP; Llama, Qwen 2 and 3, Mistral; docs/llama.md).
Only Block's four layers and the final norm differ; the skeleton (embedding -> blocks -> norm ->
LM head -> loss), backward(), the KV-cache decode, devices, precisions and checkpoints are one
piece of code. One class rather than a second one beside it, so that a reader follows a single
forward and backward and sees a family as the configuration it is, not as a copy to diff.

Each layer is a small class: forward() keeps what backward() needs in one attribute,
self.saved, and backward(dy), right below it, reads it, returns the gradient of its input and
ACCUMULATES the gradients of its parameters. There is no autograd. forward(..., save=False)
runs the same code without writing self.saved; decoding through KV caches (GPT.decode) and
evaluation (GPT.forward without targets, or with save=False) run that way, so they may come
between a forward() and its backward() without changing the gradients. So does
GPT.attention_probs, which shows the attention weights of a short input.

All parameters live in one dict, model.params, and their gradients in model.grads, keyed by
the names a PyTorch GPT-2 (nanoGPT) state dict uses: transformer.wte.weight,
transformer.h.0.attn.c_attn.weight, ... (for the Llama family, transformers'
LlamaForCausalLM's: model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight, ...).
Layers hold references to those arrays, which are only ever updated in place. Both dicts are
FlatDicts: every array is a view into one flat buffer (model.params.buffer, model.grads.buffer;
matrices first, then vectors), so that zeroing the gradients, clipping them, AdamW's step and a
data-parallel all-reduce each take one call.

BF16 weights, for inference: model.keep_bf16() (and pytfm.llama.load(folder, precision="bf16"))
holds every matrix as its BF16 bits only (model.params16, uint16; the vectors stay float32 in
model.vectors), with no float32 copy and no gradients: 2 bytes per matrix value instead of 8.
Such a model forwards, decodes and generates, in precision "bf16"; it does not train.
Int8 weights, for inference: model.set_precision("int8") (and a load in precision "int8")
holds every matrix but GPT-2's learned positions as blocks of 32 int8 values with an fp16
scale each (Q8_0: model.params8, {name: (q int8, scales uint16)}), the rest float32 in
model.vectors: about 1.06 bytes per matrix value. It forwards, decodes and generates on
ops.linear_forward_q8w and ops.embedding_forward_q8w, as the C model in PYTFM_PRECISION_INT8
does (the same bits); it does not train, and it stays int8.

Devices: GPT(cfg, device="cuda") (or model.to("cuda")) keeps every array on the GPU as a CuPy
array, and each op runs its CUDA twin (pytfm.ops picks the backend from the arrays); model.device
says which. Nothing is read back to the host inside a training step (forward, backward,
zero_grad, clipping, AdamW): the loss is a 0-d array on the model's device, on the CPU as on
the GPU, until float(loss) reads it. The inputs (token ids, targets) must be on the model's
device: cupy.asarray(idx).

Threads: a GPT is trained by one thread at a time. Training keeps its state in the model (what
each layer saved for backward(), one gradient buffer), so two threads training one model at
once would mix each other's activations and gradients. The first thread that calls
zero_grad(), forward() with save, backward() or to() trains the model; the same call from
another thread raises RuntimeError while that thread lives, until it calls release_thread().
Calls that only read the parameters (forward(save=False), decode(), attention_probs(),
pytfm.generate) may run in any thread, each with its own KV caches; during another thread's
optimizer step they see parameters partly updated.
"""

import itertools
import math
import threading
from dataclasses import asdict, dataclass

import numpy as np

from . import _arrays, _core, ops
from . import device as devices
from ._arrays import arange, as_bool, check_index_arrays, is_array, is_cupy
from ._core import MODEL_PRECISIONS, precision_code
from .kvcache import KVCache

POSITIONS = ("rope", "sinusoidal", "none", "learned")
ARCHS = ("gpt", "llama")
ROPE_SCALINGS = (None, "llama3")
# The Llama family's fields of GPTConfig: 0 (None, False) in a GPT's config, which a checkpoint
# then leaves out (so it reads as it always has)
LLAMA_FIELDS = ("n_kv_head", "head_dim", "d_ff", "norm_eps", "rope_theta", "rope_scaling",
                "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                "rope_original_max_pos", "qkv_bias", "qk_norm", "sliding_window")
MAX_ATTENTION_BYTES = 2**28  # GPT.attention_probs refuses maps larger than 256 MiB in all
_PROBES = threading.Lock()  # held while GPT.attention_probs sets or clears a layer's probe


@dataclass
class GPTConfig:
    vocab: int = 256  # byte-level tokens
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    max_seq: int = 128  # longest context
    pos: str = "rope"  # rope | sinusoidal (added to the embedding) | none | learned (GPT-2's)
    tie_embeddings: bool = True  # the LM head reuses the token embedding table
    seed: int = 0  # initialisation
    # arch "gpt": GPT-2's block (LayerNorm, GELU MLP of 4·d_model, biases), the fields below
    # left at 0. arch "llama": the Llama family's (Llama, Qwen 2 and 3, Mistral; the C
    # library's pytfm_arch says what it is), with pos "rope" and these:
    arch: str = "gpt"
    n_kv_head: int = 0  # key/value heads, dividing n_head (0 for llama: n_head)
    head_dim: int = 0  # each head's width, even (0 for llama: d_model // n_head)
    d_ff: int = 0  # SwiGLU's hidden width, intermediate_size (required for llama)
    norm_eps: float = 0.0  # RMSNorm's eps (0 for llama: 1e-6)
    rope_theta: float = 0.0  # RoPE's base (0 for llama: 10000)
    rope_scaling: str = None  # None or "llama3" (Llama 3.1's, with the four numbers below)
    rope_factor: float = 0.0
    rope_low_freq_factor: float = 0.0
    rope_high_freq_factor: float = 0.0
    rope_original_max_pos: float = 0.0  # original_max_position_embeddings
    qkv_bias: bool = False  # biases on q, k, v (Qwen 2)
    qk_norm: bool = False  # RMSNorm of each head of q and k (Qwen 3)
    sliding_window: int = 0  # 0: none; w: position t sees keys t - w < s <= t (Mistral)

    def __post_init__(self):
        """Check every field, so that a bad value fails here, naming the field, and not later
        inside a kernel: TypeError for a wrong type (a bool is not an int), ValueError for a
        wrong value. The values' rules are the C library's pytfm_model_config_check, the one
        the checkpoint and folder readers hold a file's config to. For arch "llama" the fields
        left at 0 take their defaults first (n_kv_head, head_dim, norm_eps, rope_theta)."""
        if not isinstance(self.arch, str):
            raise TypeError(f"GPTConfig.arch must be a str, got {self.arch!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"GPTConfig.arch must be one of {ARCHS}, got {self.arch!r}")
        ints = ("n_kv_head", "head_dim", "d_ff", "sliding_window")
        for name in ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"GPTConfig.{name} must be an int, got {value!r}")
            if not -2**63 <= value < 2**63:
                raise ValueError(f"GPTConfig.{name} must be below 2**63 in size, got {value}")
        for name in ("norm_eps", "rope_theta", "rope_factor", "rope_low_freq_factor",
                     "rope_high_freq_factor", "rope_original_max_pos"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"GPTConfig.{name} must be a float, got {value!r}")
            setattr(self, name, float(value))  # an int from JSON (10000) is the same number
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(f"GPTConfig.rope_scaling must be one of {ROPE_SCALINGS}, "
                             f"got {self.rope_scaling!r}")
        for name in ("qkv_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"GPTConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.arch == "llama":
            if isinstance(self.n_head, int) and not self.n_kv_head:
                self.n_kv_head = self.n_head
            if (isinstance(self.d_model, int) and isinstance(self.n_head, int)
                    and self.n_head > 0 and not self.head_dim):
                self.head_dim = self.d_model // self.n_head
            self.norm_eps = self.norm_eps or 1e-6
            self.rope_theta = self.rope_theta or 10000.0
        for name in ("vocab", "d_model", "n_layer", "n_head", "max_seq", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"GPTConfig.{name} must be an int, got {value!r}")
            if name != "seed" and not -2**63 <= value < 2**63:  # the C config's int64_t
                raise ValueError(f"GPTConfig.{name} must be a positive int (below 2**63), "
                                 f"got {value}")
        if self.seed < 0:  # what np.random.default_rng accepts; any size
            raise ValueError(f"GPTConfig.seed must be a non-negative int, got {self.seed}")
        if not isinstance(self.pos, str):
            raise TypeError(f"GPTConfig.pos must be a str, got {self.pos!r}")
        if self.pos not in POSITIONS:
            raise ValueError(f"GPTConfig.pos must be one of {POSITIONS}, got {self.pos!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise TypeError(
                f"GPTConfig.tie_embeddings must be a bool, got {self.tie_embeddings!r}")
        _core.check(_core.lib.pytfm_model_config_check(_c_config(self)))


def _c_config(cfg):  # GPTConfig -> its C twin, a new pytfm_model_config *
    return _core.ffi.new("pytfm_model_config *", dict(
        vocab=cfg.vocab, d_model=cfg.d_model, n_layer=cfg.n_layer, n_head=cfg.n_head,
        max_seq=cfg.max_seq, pos=POSITIONS.index(cfg.pos), tie_embeddings=cfg.tie_embeddings,
        arch=ARCHS.index(cfg.arch), rope_scaling=ROPE_SCALINGS.index(cfg.rope_scaling),
        **{name: getattr(cfg, name) for name in LLAMA_FIELDS if name != "rope_scaling"}))


def config_from_c(c, seed=0):
    """The GPTConfig of a pytfm_model_config (a reader's): the inverse of _c_config."""
    return GPTConfig(
        vocab=c.vocab, d_model=c.d_model, n_layer=c.n_layer, n_head=c.n_head,
        max_seq=c.max_seq, pos=POSITIONS[c.pos], tie_embeddings=bool(c.tie_embeddings),
        seed=seed, arch=ARCHS[c.arch], rope_scaling=ROPE_SCALINGS[c.rope_scaling],
        qkv_bias=bool(c.qkv_bias), qk_norm=bool(c.qk_norm),
        **{name: getattr(c, name) for name in LLAMA_FIELDS
           if name not in ("rope_scaling", "qkv_bias", "qk_norm")})


def config_dict(cfg):
    """asdict(cfg) as a checkpoint stores it: a GPT's without the Llama family's fields (all
    0), so that it is the config every pytfm checkpoint has held; a Llama's whole."""
    d = asdict(cfg)
    if cfg.arch == "gpt":
        for name in ("arch", *LLAMA_FIELDS):
            del d[name]
    return d


def param_shapes(cfg):
    """(name, shape) of each parameter GPT(cfg) creates, in the same order, computed without
    allocating anything: the layout of the C library's pytfm_model_param, its one home, which
    the checkpoint and folder readers walk too (a Linear's weight is [out, in]). A generator: a
    caller comparing against a file stops at the first mismatch, so a config claiming a million
    layers costs nothing."""
    lib, ffi = _core.lib, _core.ffi
    config, param = _c_config(cfg), ffi.new("pytfm_param_info *")
    for layer in itertools.chain((-1,), range(cfg.n_layer + 1)):  # embeddings, blocks, tail
        for part in itertools.count():
            if not lib.pytfm_model_param(config, layer, part, param):
                break
            yield (ffi.string(param.name).decode(),
                   tuple(param.factor[d] * param.base[d] for d in range(param.ndim)))


ALIGN = 16  # floats: every parameter's view starts on a 64-byte boundary


def _aligned_zeros(n):  # -> float32 [n], zeros, its first element 64-byte aligned
    raw = np.zeros(n + ALIGN, np.float32)
    start = (-raw.ctypes.data % (4 * ALIGN)) // 4
    return raw[start:start + n]


# The Llama family's k and v projections follow q's with no padding between them (weights and
# biases), so that the three are one matrix [(H + 2·Hkv)·hd, C] in the buffer, multiplied in one
# product (pytfm_model_param puts them in that order)
JOINED = ("self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.k_proj.bias", "self_attn.v_proj.bias")


def flat_layout(shapes):
    """{name: (offset, shape)} for (name, shape) pairs: where each array lies in one flat
    buffer, and the buffer's size. The matrices (ndim >= 2, the parameters AdamW decays) come
    first and the vectors after them, so that each group is one span of the buffer; within a
    group, the order given. Each offset is a multiple of ALIGN, but for a name ending in one of
    JOINED, which starts where the array before it ends; the few floats of padding between
    views stay zero through every step (their gradient is zero)."""
    shapes = list(shapes)
    layout, offset, end = {}, 0, 0
    for decayed in (True, False):
        for name, shape in shapes:
            if (len(shape) >= 2) == decayed:
                if name.endswith(JOINED):
                    offset = end
                layout[name] = (offset, tuple(shape))
                end = offset + math.prod(shape)
                offset = -(-end // ALIGN) * ALIGN
    return {name: layout[name] for name, _ in shapes}, offset  # in the order given


class FlatDict(dict):
    """A dict of named float32 arrays that are views into one flat buffer, .buffer (1-D,
    C-contiguous; 64-byte aligned on the host, CuPy's 256-byte alignment on the GPU), laid out
    by flat_layout (.layout, .size), on .device ("cpu": NumPy, "cuda": CuPy): the model's
    parameters, their gradients, and AdamW's moments are each one of these, so that zeroing,
    clipping, the optimizer step, and an all-reduce are each one call over .buffer.

    The views keep their names and shapes; assigning to a name copies into its view (the
    layers hold references to the views, so an array must never be replaced), and names can
    be neither added nor removed. .stale is set on the FlatDicts a GPT.to() left behind."""

    def __init__(self, layout, size, device="cpu", buffer=None):
        if buffer is None:
            xp = devices.array_module(device)
            buffer = _aligned_zeros(size) if xp is np else xp.zeros(size, np.float32)
        super().__init__((name, buffer[off:off + math.prod(shape)].reshape(shape))
                         for name, (off, shape) in layout.items())
        self.buffer, self.layout, self.size, self.device = buffer, layout, size, device
        self.stale = False

    def zeros_like(self):
        """A FlatDict of the same layout on the same device, all zeros."""
        return FlatDict(self.layout, self.size, self.device)

    def to(self, device):
        """This FlatDict on device: itself when it is there already, else a copy (the buffer
        copied in one transfer)."""
        if devices.check(device) == self.device:
            return self
        if device == "cpu":
            buffer = _aligned_zeros(self.size)
            buffer[...] = devices.to_host(self.buffer)
        else:
            buffer = devices.array_module(device).asarray(self.buffer)
        return FlatDict(self.layout, self.size, device, buffer)

    def copy_from(self, arrays):
        """Copy {name: array} (every name of this FlatDict; NumPy or CuPy arrays of the views'
        shapes) into the views. On the GPU, host arrays are gathered into one host buffer and
        copied in one transfer."""
        if self.device == "cuda" and not any(map(is_cupy, arrays.values())):
            staging = FlatDict(self.layout, self.size)
            staging.copy_from(arrays)
            self.buffer[...] = devices.to_device(staging.buffer, "cuda")
            return
        for name in self:
            self[name] = arrays[name]

    def __setitem__(self, name, value):
        if name not in self:
            raise KeyError(f"{name!r} is not one of this FlatDict's arrays: names are fixed")
        view = self[name]
        value = devices.to_device(value, self.device)
        if value.shape != view.shape:
            raise ValueError(f"{name} has shape {view.shape}, got an array of shape "
                             f"{value.shape}")
        view[...] = value

    def __delitem__(self, name):
        raise TypeError("a FlatDict's names are fixed: its arrays are views into one buffer")

    def _fixed(self, *args, **kwargs):
        raise TypeError("a FlatDict's names are fixed: its arrays are views into one buffer")

    pop = popitem = clear = update = setdefault = _fixed


class Parameters:
    """The model's parameters and gradients: two FlatDicts of one layout (param_shapes order),
    filled by add() in the order the layers are built, drawing from one generator."""

    def __init__(self, cfg, init=True):
        self.params = FlatDict(*flat_layout(param_shapes(cfg)))
        self.grads = self.params.zeros_like()
        self.rng = np.random.default_rng(cfg.seed)
        self.init = init

    def add(self, name, shape, std=None):
        """Parameter `name`: normal(0, std) when std is given (drawn in float64, rounded to
        float32), else ones for 'weight', zeros otherwise (all zeros, untouched, without init:
        a model about to be loaded); returns (its view, its gradient's)."""
        p = self.params[name]
        assert p.shape == tuple(shape), (name, p.shape, shape)  # param_shapes agrees with nn
        if not self.init:
            return p, self.grads[name]
        if std is not None:
            p[...] = self.rng.normal(0.0, std, shape)
        elif name.endswith(".weight"):
            p.fill(1.0)
        return p, self.grads[name]

    def joined(self, names):
        """The parameters `names`, adjacent in the buffer (see JOINED) and of one row width,
        as one array [Σ rows, cols] (or [Σ size] for vectors) -> (its view, its gradient's)."""
        layout = self.params.layout
        (first, shape), (last, last_shape) = layout[names[0]], layout[names[-1]]
        end = last + math.prod(last_shape)
        assert end - first == sum(math.prod(self.params[n].shape) for n in names), names
        return tuple(flat.buffer[first:end].reshape((-1,) + shape[1:])
                     for flat in (self.params, self.grads))


class Linear:
    """y = x·wᵀ + b, w [out, in] as torch.nn.Linear.weight. tied: an Embedding whose table
    (and its gradient) is w, as in a tied LM head, logits = x · tableᵀ. precision: its
    products' ("fp32", or "bf16": see GPT), set by the model."""

    def __init__(self, P, name, n_in, n_out, std=0.02, bias=True, tied=None):
        if tied is None:
            self.w, self.dw = P.add(f"{name}.weight", (n_out, n_in), std)
        else:
            self.w, self.dw = tied.w, tied.dw
        self.b, self.db = P.add(f"{name}.bias", (n_out,)) if bias else (None, None)
        self.scales = None  # int8 weights' (GPT.set_precision("int8")): w holds their blocks
        self.saved = None
        self.precision = "fp32"

    def forward(self, x, save=True):  # (..., in) -> (..., out)
        if save:
            self.saved = x
        if self.w.dtype == np.uint16:  # BF16 bits (GPT.keep_bf16): precision "bf16"'s product
            return ops.linear_forward_bf16w(x, self.w, self.b)
        if self.w.dtype == np.int8:  # int8 blocks and their scales (precision "int8")
            return ops.linear_forward_q8w(x, self.w, self.scales, self.b)
        return ops.linear_forward(x, self.w, self.b, precision=self.precision)

    def forward_gelu(self, x, save=True):  # (..., in) -> gelu(h), h = x·wᵀ + b: (..., out) each
        """The layer followed by GELU, in one pass over the output (the bias and GELU applied to
        each tile of the product while it is in cache): (gelu(h), h). With BF16 bits, the
        product then GELU's own pass, which gives the fused epilogue's bits."""
        if save:
            self.saved = x
        if self.w.dtype in (np.uint16, np.int8):
            h = self.forward(x, save=False)
            return ops.gelu_forward(h), h
        return ops.linear_gelu_forward(x, self.w, self.b, precision=self.precision)

    def backward(self, dy):  # (..., out) -> (..., in)
        x = self.saved
        has_bias = self.b is not None
        dx, _, _ = ops.linear_backward(dy, x, self.w, has_bias, dw=self.dw, db=self.db,
                                       precision=self.precision)
        return dx


class JoinedLinear(Linear):
    """Linears of one input whose weights [out_i, in] (and biases [out_i]) are adjacent in the
    flat buffer (see JOINED), read as one Linear of [Σ out_i, in]: one product gives every
    output side by side, y = x·[W_0; W_1; ...]ᵀ (the Llama family's q, k and v, measured
    twice as fast in one product as in three on the CPU). The parameters keep their own
    names and init (normal(0, std) weights, zero biases)."""

    def __init__(self, P, names, n_in, n_outs, std=0.02, bias=True):
        for name, n_out in zip(names, n_outs):
            P.add(f"{name}.weight", (n_out, n_in), std)
        self.w, self.dw = P.joined([f"{name}.weight" for name in names])
        if bias:
            for name, n_out in zip(names, n_outs):
                P.add(f"{name}.bias", (n_out,))
        self.b, self.db = P.joined([f"{name}.bias" for name in names]) if bias else (None, None)
        self.scales = None  # as Linear's
        self.saved = None
        self.precision = "fp32"


class Embedding:
    def __init__(self, P, name, vocab, dim):
        self.w, self.dw = P.add(f"{name}.weight", (vocab, dim), 0.02)
        self.scales = None  # as Linear's
        self.saved = None

    def forward(self, ids, save=True):  # int64 (B, T) -> (B, T, dim)
        if save:
            self.saved = ids
        if self.w.dtype == np.uint16:  # BF16 bits (GPT.keep_bf16)
            return ops.embedding_forward_bf16w(ids, self.w, check_ids=False)
        if self.w.dtype == np.int8:  # int8 blocks (precision "int8")
            return ops.embedding_forward_q8w(ids, self.w, self.scales, check_ids=False)
        return ops.embedding_forward(ids, self.w, check_ids=False)  # GPT._inputs did

    def backward(self, dy):  # (B, T, dim) -> None (the ids have no gradient)
        ids = self.saved
        ops.embedding_backward(dy, ids, self.w.shape[0], dtable=self.dw, check_ids=False)


class LearnedPositions:
    """GPT-2's absolute positions: x + wpe[start : start + T], wpe [max_seq, dim] a parameter
    (transformer.wpe.weight) whose gradient accumulates as an embedding's: row start + t gets
    the gradient at position t of each sequence in turn (pytfm_embedding_backward, one call per
    sequence, ids a plan's constant: inside a TrainStep nothing is allocated)."""

    def __init__(self, P, name, max_seq, dim):
        self.w, self.dw = P.add(f"{name}.weight", (max_seq, dim), 0.02)
        self.saved = None

    def forward(self, x, start, pos, save=True):  # (B, T, dim), pos = start + arange(T) -> x,
        if save:  # the rows added in place
            self.saved = pos
        rows = self.w[start:start + x.shape[1]]
        x += ops.from_bf16_bits(rows) if rows.dtype == np.uint16 else rows  # GPT.keep_bf16
        return x

    def backward(self, dx):  # (B, T, dim) -> None (the positions have no gradient)
        pos = self.saved
        for b in range(dx.shape[0]):
            ops.embedding_backward(dx[b], pos, self.w.shape[0], dtable=self.dw, check_ids=False)


class LayerNorm:
    def __init__(self, P, name, dim):
        self.w, self.dw = P.add(f"{name}.weight", (dim,))
        self.b, self.db = P.add(f"{name}.bias", (dim,))
        self.saved = None

    def forward(self, x, save=True):  # (..., dim) -> (..., dim)
        y, mean, rstd = ops.layernorm_forward(x, self.w, self.b)
        if save:
            self.saved = (x, mean, rstd)
        return y

    def backward(self, dy):  # (..., dim) -> (..., dim)
        x, mean, rstd = self.saved
        dx, _, _ = ops.layernorm_backward(dy, x, self.w, mean, rstd, dw=self.dw, db=self.db)
        return dx


class RMSNorm:
    """The Llama family's norm: y = x / sqrt(mean(x²) + eps) · w, no bias, no mean removed."""

    def __init__(self, P, name, dim, eps):
        self.w, self.dw = P.add(f"{name}.weight", (dim,))
        self.eps = eps
        self.saved = None

    def forward(self, x, save=True):  # (..., dim) -> (..., dim)
        y, rstd = ops.rmsnorm_forward(x, self.w, self.eps)
        if save:
            self.saved = (x, rstd)
        return y

    def backward(self, dy):  # (..., dim) -> (..., dim)
        x, rstd = self.saved
        dx, _ = ops.rmsnorm_backward(dy, x, self.w, rstd, dw=self.dw)
        return dx


class CausalSelfAttention:
    """Fused QKV projection, causal multi-head attention (RoPE on q, k when pos='rope'),
    output projection."""

    def __init__(self, P, name, cfg, proj_std):
        self.H, self.hd, self.rope = cfg.n_head, cfg.d_model // cfg.n_head, cfg.pos == "rope"
        self.c_attn = Linear(P, f"{name}.c_attn", cfg.d_model, 3 * cfg.d_model)
        self.c_proj = Linear(P, f"{name}.c_proj", cfg.d_model, cfg.d_model, std=proj_std)
        self.saved = None
        # while GPT.attention_probs runs: {thread id: a list that gets (q, k, lse)}, else None
        self.probe = None
        # of the attention's products, set by the model; on the GPU only: the C attention
        # kernels are FP32, so a model on the CPU attends in FP32 in every precision
        self.precision = "fp32"

    def _precision(self, q):
        return "fp32" if isinstance(q, np.ndarray) else self.precision

    def forward(self, x, pos, save=True, cache=None):  # (B, T, C), int64 (T,) -> (B, T, C)
        """With a KV cache, x holds the new tokens only (at positions pos): they attend to
        themselves and to the earlier tokens whose keys and values the cache keeps, and their
        own are appended to it. Nothing is saved then, whatever save says: decoding has no
        backward, and a pending one must keep what its forward saved."""
        save = save and cache is None
        B, T, C = x.shape
        qkv = self.c_attn.forward(x, save).reshape(B, T, 3, self.H, self.hd)
        q, k, v = ops.qkv_split_forward(qkv, pos if self.rope else None)  # (B, T, H, hd)
        if cache is not None:
            o = cache.attend(q, k, v)
        else:
            o, lse = ops.attention_forward(q, k, v, causal=True,  # (B, T, H, hd), (B, H, T)
                                           precision=self._precision(q))
            if save:
                self.saved = (q, k, v, o, lse, pos)
            probe = self.probe
            if probe is not None and threading.get_ident() in probe:
                probe[threading.get_ident()].append((q, k, lse))
        return self.c_proj.forward(o.reshape(B, T, C), save)

    def backward(self, dy):  # (B, T, C) -> (B, T, C)
        q, k, v, o, lse, pos = self.saved
        do = self.c_proj.backward(dy).reshape(o.shape)  # (B, T, H, hd)
        dq, dk, dv = ops.attention_backward(do, q, k, v, o, lse, causal=True,
                                            precision=self._precision(q))
        dqkv = ops.qkv_split_backward(dq, dk, dv, pos if self.rope else None)  # (B, T, 3, H, hd)
        return self.c_attn.backward(dqkv.reshape(dy.shape[:2] + (-1,)))


class GroupedQueryAttention:
    """The Llama family's attention: q, k and v projections (one product, JoinedLinear) of
    n_head query heads and n_kv_head key/value heads of head_dim (biases with qkv_bias); with
    qk_norm an RMSNorm of each head of q and of k (Qwen 3); RoPE in the rotate-half layout, by
    the angles pos · inv_freq (the model's table, ops.rope_inv_freq); causal attention in which
    query head h reads key/value head h // (n_head / n_kv_head), within the last
    sliding_window keys when it is not 0 (Mistral); the output projection o_proj."""

    def __init__(self, P, name, cfg, inv_freq, proj_std):
        C, H, Hkv, hd = cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.H, self.Hkv, self.hd, self.window = H, Hkv, hd, cfg.sliding_window
        self.qkv = JoinedLinear(P, [f"{name}.{x}_proj" for x in "qkv"], C,
                                (H * hd, Hkv * hd, Hkv * hd), bias=cfg.qkv_bias)
        self.o_proj = Linear(P, f"{name}.o_proj", H * hd, C, std=proj_std, bias=False)
        self.norms = tuple(RMSNorm(P, f"{name}.{x}_norm", hd, cfg.norm_eps)
                           for x in "qk") if cfg.qk_norm else ()
        self.inv_freq = inv_freq  # float32 (hd/2,), on the model's device
        self.saved = None
        self.probe = None  # as CausalSelfAttention's
        self.precision = "fp32"  # as CausalSelfAttention's

    _precision = CausalSelfAttention._precision

    def forward(self, x, pos, save=True, cache=None):  # (B, T, C), int64 (T,) -> (B, T, C)
        """With a KV cache (of n_kv_head heads): as CausalSelfAttention.forward."""
        save = save and cache is None
        B, T, _ = x.shape
        H, Hkv, hd = self.H, self.Hkv, self.hd
        qkv = self.qkv.forward(x, save)  # (B, T, (H + 2·Hkv)·hd): q, k, v side by side
        ends = (0, H * hd, (H + Hkv) * hd, (H + 2 * Hkv) * hd)
        q, k, v = (_empty_like(qkv, (B, T, (b - a) // hd, hd))  # (B, T, H or Hkv, hd): each
                   for a, b in zip(ends, ends[1:]))             # contiguous for the kernels
        for part, a, b in zip((q, k, v), ends, ends[1:]):
            part.reshape(B, T, b - a)[...] = qkv[..., a:b]
        if self.norms:
            q, k = (norm.forward(a, save) for norm, a in zip(self.norms, (q, k)))
        q, k = (ops.rope_freq_forward(a, pos, self.inv_freq) for a in (q, k))
        if cache is not None:
            o = cache.attend(q, k, v)
        else:
            o, lse = ops.attention_forward(q, k, v, causal=True, window=self.window,
                                           precision=self._precision(q))  # (B, T, H, hd)
            if save:
                self.saved = (q, k, v, o, lse, pos)
            probe = self.probe
            if probe is not None and threading.get_ident() in probe:
                probe[threading.get_ident()].append((q, k, lse, self.window))
        return self.o_proj.forward(o.reshape(B, T, H * hd), save)

    def backward(self, dy):  # (B, T, C) -> (B, T, C)
        q, k, v, o, lse, pos = self.saved
        do = self.o_proj.backward(dy).reshape(o.shape)  # (B, T, H, hd)
        dq, dk, dv = ops.attention_backward(do, q, k, v, o, lse, causal=True,
                                            window=self.window, precision=self._precision(q))
        dq, dk = (ops.rope_freq_backward(d, pos, self.inv_freq) for d in (dq, dk))
        if self.norms:
            dq, dk = (norm.backward(d) for norm, d in zip(self.norms, (dq, dk)))
        B, T = dy.shape[:2]
        dqkv = _empty_like(dq, (B, T, self.qkv.w.shape[0]))  # dq, dk, dv side by side, as qkv
        start = 0
        for d in (dq, dk, dv):
            dqkv[..., start:start + d[0, 0].size] = d.reshape(B, T, -1)
            start += d[0, 0].size
        return self.qkv.backward(dqkv)


def attention_probs(q, k, lse, window=0):  # [B, T, H, D], [B, T, Hkv, D], [B, H, T] -> P
    """The causal attention weights ops.attention_forward(q, k, v) used, rebuilt from its q, k
    and the lse it returned (the kernel never stores them): P[b, h, t, s] = exp(scale·q_t·k_s −
    lse_t) for s <= t and 0 for s > t, scale = 1/sqrt(D) (the kernel's default). Each row sums
    to 1 because lse_t = log Σ_{s<=t} exp(scale·q_t·k_s). Computed in float64, returned as
    float32; [B, H, T, T] floats: for short inputs. Device arrays are copied to the host
    first: the maps are for analysis, and come back as NumPy arrays. Grouped-query heads (k of
    Hkv heads) and a sliding window (window > 0: keys s <= t - window get 0) as the kernel's."""
    q, k, lse = (devices.to_host(a) for a in (q, k, lse))
    T, H, D = q.shape[1:]
    if k.shape[2] != H:
        k = np.repeat(k, H // k.shape[2], axis=2)  # query head h reads key head h // (H / Hkv)
    scores = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k.astype(np.float64))
    scores /= math.sqrt(D)
    scores -= lse[..., None]
    scores[..., np.triu(np.ones((T, T), bool), k=1)] = -np.inf  # s > t: the causal mask
    if window:
        scores[..., np.tril(np.ones((T, T), bool), k=-window)] = -np.inf  # s <= t - window
    return np.exp(scores, out=scores).astype(np.float32)  # (in place: a float64 copy at most)


class MLP:
    def __init__(self, P, name, cfg, proj_std):
        self.c_fc = Linear(P, f"{name}.c_fc", cfg.d_model, 4 * cfg.d_model)
        self.c_proj = Linear(P, f"{name}.c_proj", 4 * cfg.d_model, cfg.d_model, std=proj_std)
        self.saved = None

    def forward(self, x, save=True):  # (B, T, C) -> (B, T, C)
        g, h = self.c_fc.forward_gelu(x, save)  # (B, T, 4C): gelu(h), and h, GELU's input
        if save:
            self.saved = h
        return self.c_proj.forward(g, save)

    def backward(self, dy):  # (B, T, C) -> (B, T, C)
        h = self.saved
        return self.c_fc.backward(ops.gelu_backward(self.c_proj.backward(dy), h))


class SwiGLU:
    """The Llama family's MLP: down_proj(silu(gate_proj(x)) · up_proj(x)), hidden width d_ff.
    gate and up are two products, though adjacent in the buffer: one product of [2·d_ff, C]
    would need its output's halves copied out to be contiguous for the SwiGLU kernel, and
    measured slower on the CPU."""

    def __init__(self, P, name, cfg, proj_std):
        C, F = cfg.d_model, cfg.d_ff
        self.gate_proj = Linear(P, f"{name}.gate_proj", C, F, bias=False)
        self.up_proj = Linear(P, f"{name}.up_proj", C, F, bias=False)
        self.down_proj = Linear(P, f"{name}.down_proj", F, C, std=proj_std, bias=False)
        self.saved = None

    def forward(self, x, save=True):  # (B, T, C) -> (B, T, C)
        g, u = self.gate_proj.forward(x, save), self.up_proj.forward(x, save)  # (B, T, F) each
        if save:
            self.saved = (g, u)
        return self.down_proj.forward(ops.swiglu_forward(g, u), save)

    def backward(self, dy):  # (B, T, C) -> (B, T, C)
        g, u = self.saved
        dg, du = ops.swiglu_backward(self.down_proj.backward(dy), g, u)
        dx = self.gate_proj.backward(dg)  # fresh: add up's in place
        dx += self.up_proj.backward(du)
        return dx


class Block:
    """Pre-norm residual block: x + attn(ln_1(x)), then + mlp(ln_2(.)). It saves nothing of
    its own (the residual adds need nothing); its four layers save theirs. Which four is the
    family's, cfg.arch: GPT-2's LayerNorm, CausalSelfAttention, LayerNorm, MLP (under
    transformer.h.i.), or the Llama family's RMSNorm, GroupedQueryAttention, RMSNorm, SwiGLU
    (under model.layers.i., inv_freq the model's RoPE table)."""

    def __init__(self, P, name, cfg, inv_freq=None):
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)  # GPT-2: scale residual projections
        if cfg.arch == "llama":
            C, eps = cfg.d_model, cfg.norm_eps
            self.ln_1 = RMSNorm(P, f"{name}.input_layernorm", C, eps)
            self.attn = GroupedQueryAttention(P, f"{name}.self_attn", cfg, inv_freq, proj_std)
            self.ln_2 = RMSNorm(P, f"{name}.post_attention_layernorm", C, eps)
            self.mlp = SwiGLU(P, f"{name}.mlp", cfg, proj_std)
            return
        self.ln_1 = LayerNorm(P, f"{name}.ln_1", cfg.d_model)
        self.attn = CausalSelfAttention(P, f"{name}.attn", cfg, proj_std)
        self.ln_2 = LayerNorm(P, f"{name}.ln_2", cfg.d_model)
        self.mlp = MLP(P, f"{name}.mlp", cfg, proj_std)

    def forward(self, x, pos, save=True, cache=None):  # (B, T, C) -> (B, T, C)
        # The residual adds go in place into each sublayer's output, a fresh array nobody
        # keeps (never into x: ln_1 keeps it for its backward).
        save = save and cache is None  # decoding through a cache saves nothing
        h = self.attn.forward(self.ln_1.forward(x, save), pos, save, cache)
        h += x
        y = self.mlp.forward(self.ln_2.forward(h, save), save)
        y += h
        return y

    def backward(self, dy):  # (B, T, C) -> (B, T, C)
        dh = self.ln_2.backward(self.mlp.backward(dy))  # fresh: add the residual's in place
        dh += dy
        dx = self.ln_1.backward(self.attn.backward(dh))
        dx += dh
        return dx

    def layers(self):
        """Its layers and theirs, each once."""
        a, m = self.attn, self.mlp
        if isinstance(a, CausalSelfAttention):
            return (self.ln_1, a, a.c_attn, a.c_proj, self.ln_2, m, m.c_fc, m.c_proj)
        return (self.ln_1, a, a.qkv, a.o_proj, *a.norms, self.ln_2, m, m.gate_proj, m.up_proj,
                m.down_proj)


def _empty_like(a, shape):
    """An uninitialised float32 array of shape on a's device: inside a TrainStep, the one its
    plan holds at this place (a step allocates nothing once recorded), as pytfm.ops' outputs."""
    plan = _arrays._CURRENT.plan if is_cupy(a) else None
    if plan is None:
        return devices.module_of(a).empty(shape, np.float32)
    return plan.take(devices.module_of(a), shape, np.float32)


def _address(a):  # where a's first element is, on its device
    return a.data.ptr if is_cupy(a) else a.ctypes.data


def _moved(a, flats, device):
    """The array a of a layer, on device: the same span of the new buffer when a is a view into
    one of the old ones (flats: (old FlatDict, new FlatDict) pairs; a parameter, a gradient or
    a span of several, JoinedLinear's), else a copy (a constant table: RoPE's inv_freq)."""
    for old, new in flats:
        start = _address(a) - _address(old.buffer)
        if is_cupy(a) == is_cupy(old.buffer) and 0 <= start < 4 * old.buffer.size:
            return new.buffer[start // 4:start // 4 + a.size].reshape(a.shape)
    return devices.to_device(a, device)


_KEPT = ("{what}: this model holds its matrices in {form} only ({how}), for inference, with "
         "no float32 parameters or gradients; load or build it in float32 to train it, save it "
         "or hand it to an optimizer")
_FORMS = {"bf16": ("BF16", "keep_bf16, or a load in precision 'bf16'"),
          "int8": ("int8 blocks", "set_precision('int8'), or a load in precision 'int8'")}
_KEEP_CHUNK = 1 << 20  # matrix values rounded (keep_bf16) or quantised (int8) at once
Q8_BLOCK = 32  # the values of one int8 block (PYTFM_Q8_BLOCK), along a matrix's input


def _quantised(name, a):
    """Whether parameter name (array a) is held in int8 blocks in precision "int8": every
    matrix but GPT-2's learned positions, which are added to the embeddings, never multiplied
    (the C model's rule, csrc/model/model.c)."""
    return a.ndim >= 2 and name != "transformer.wpe.weight"


def _split(params):
    """({name: array} of the matrices (ndim >= 2), of the vectors) of a FlatDict, in order."""
    matrices = {n: a for n, a in params.items() if a.ndim >= 2}
    return matrices, {n: a for n, a in params.items() if a.ndim < 2}


def _within(a, buffer):
    """Whether array a is a view into buffer's memory (both on the host)."""
    if not (isinstance(a, np.ndarray) and isinstance(buffer, np.ndarray)):
        return False
    return 0 <= _address(a) - _address(buffer) < buffer.nbytes


def sinusoidal_positions(T, d):  # (T, d): sin on even features, cos on odd (Vaswani et al.)
    return ops.sinusoidal_positions(T, d)  # the C model's table: the same bits


class GPT:
    """Decoder-only transformer: embedding → n_layer blocks → LayerNorm (RMSNorm for the Llama
    family) → LM head; the blocks are cfg.arch's (see Block).

    device: "cpu" (NumPy arrays, the C kernels) or "cuda" (CuPy arrays on the current GPU, the
    CUDA kernels; pytfm.device.CudaUnavailable says why when the GPU cannot be used). The
    parameters are drawn on the host from cfg.seed whatever the device, so GPT(cfg,
    device="cuda") starts from the same bits as GPT(cfg), copied over in one transfer.

    precision: of the linear layers' products, a property of the run, not of the model (a
    checkpoint holds float32 parameters and no precision): "fp32", or "bf16", where each product
    (forward x·Wᵀ, backward dy·W and dyᵀ·x) multiplies BF16-rounded inputs and sums in float32,
    as torch.autocast("cpu", torch.bfloat16) does; parameters, gradients, optimizer state,
    LayerNorm, softmax and the loss stay float32. "bf16" runs on the CPU (pytfm.bf16_path()
    says how) and on the GPU (the tensor cores), "tf32" (TF32-rounded inputs, float32 sums) on
    the GPU only: on "cuda" each linear layer's products run on pytfm_linear_*_ex_cuda and the
    attention's (Q·Kᵀ, P·V and their backward; the softmax in float32) on
    pytfm_attention_*_ex_cuda, the rest as in "fp32". On the CPU attention stays float32, and
    so does the KV-cached decode on either device (it is bound by memory bandwidth).
    model.precision says which; set_precision changes it. keep_bf16() holds the matrices in
    BF16 only, for inference.

    init=False leaves the parameters zero and draws nothing (their memory untouched until
    written): for a model whose parameters are about to be loaded."""

    def __init__(self, cfg, device="cpu", precision="fp32", *, init=True):
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a pytfm.nn.GPTConfig, got {type(cfg).__name__}")
        devices.array_module(device)  # a bad name or an unusable GPU fails before any work
        self.cfg = cfg
        self._trainer, self._trainer_lock = None, threading.Lock()  # see the module's "Threads"
        P = Parameters(cfg, init=as_bool("init", init))
        self.kept = False  # keep_bf16: the matrices are BF16 bits only
        if cfg.arch == "llama":
            self._llama(P)
        else:
            self.wte = Embedding(P, "transformer.wte", cfg.vocab, cfg.d_model)
            self.wpe = (LearnedPositions(P, "transformer.wpe", cfg.max_seq, cfg.d_model)
                        if cfg.pos == "learned" else None)
            sinusoidal = cfg.pos == "sinusoidal"
            self.pe = sinusoidal_positions(cfg.max_seq, cfg.d_model) if sinusoidal else None
            self.blocks = [Block(P, f"transformer.h.{i}", cfg) for i in range(cfg.n_layer)]
            self.ln_f = LayerNorm(P, "transformer.ln_f", cfg.d_model)
            self.lm_head = Linear(P, "lm_head", cfg.d_model, cfg.vocab, bias=False,
                                  tied=self.wte if cfg.tie_embeddings else None)
        self._params, self._grads = P.params, P.grads
        self.params16 = self.vectors = None  # keep_bf16's (vectors: and int8's)
        self.params8 = None  # precision "int8"'s: {name: (q, scales)}
        self.saved, self.device, self.xp, self.precision = None, "cpu", np, "fp32"
        self.to(device)
        self.set_precision(precision)

    def _llama(self, P):
        """The Llama family's model (the rest of __init__ for arch "llama"): the same
        attributes as a GPT's (wte, blocks, ln_f, lm_head), of the family's layers, under
        transformers' LlamaForCausalLM names; no position table (RoPE is in the attention)."""
        cfg = self.cfg
        scaling = None if cfg.rope_scaling is None else {
            "rope_type": cfg.rope_scaling, "factor": cfg.rope_factor,
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_pos}
        inv_freq = ops.rope_inv_freq(cfg.head_dim, cfg.rope_theta, scaling)  # (head_dim/2,)
        self.wte = Embedding(P, "model.embed_tokens", cfg.vocab, cfg.d_model)
        self.wpe = self.pe = None
        self.blocks = [Block(P, f"model.layers.{i}", cfg, inv_freq) for i in range(cfg.n_layer)]
        self.ln_f = RMSNorm(P, "model.norm", cfg.d_model, cfg.norm_eps)
        self.lm_head = Linear(P, "lm_head", cfg.d_model, cfg.vocab, bias=False,
                              tied=self.wte if cfg.tie_embeddings else None)

    def _kept_error(self, what):
        """The RuntimeError of a model that keeps BF16 or int8 weights, for what it refuses."""
        form, how = _FORMS[self.precision]
        return RuntimeError(_KEPT.format(what=what, form=form, how=how))

    @property
    def params(self):
        """The parameters: a FlatDict of float32 arrays (see the module's docstring)."""
        if self.kept:
            raise self._kept_error("model.params")
        return self._params

    @property
    def grads(self):
        """The parameters' gradients: a FlatDict of model.params's layout."""
        if self.kept:
            raise self._kept_error("model.grads")
        return self._grads

    def keep_bf16(self):
        """Hold every matrix (each linear layer's weight, the embedding table, GPT-2's learned
        positions) in BF16 only, for inference; returns the model. Each matrix becomes its
        BF16 rounding (to nearest, ties to even: ops.to_bf16_bits), kept as its bits, uint16, in
        one buffer: model.params16 ({name: view}); the vectors (norms, biases) stay float32 in
        model.vectors (a FlatDict); the float32 matrices and all the gradients are freed. The
        model then takes 2 bytes per matrix value where it took 8 (parameters and gradients).

        Its precision is "bf16" from then on, and forward (save=False: its default here),
        decode and pytfm.generate give the bits of the float32 model whose matrices hold those
        rounded values, in precision "bf16": its products read the BF16 bits they would have
        rounded to (ops.linear_forward_bf16w), the embedding and the positions read the rounded
        values. A model loaded from a BF16 file (pytfm.llama.load(folder, precision="bf16"))
        rounds nothing: it is the file's model. Training is refused (backward, zero_grad,
        model.params and model.grads, which an optimizer, a checkpoint or a save would take),
        and so are set_precision to another precision and to("cuda"): build or load the model
        in float32 to train it or move it. The CPU only."""
        if self.precision == "int8":
            raise ValueError("keep_bf16: this model holds its matrices in int8 blocks only "
                             "(set_precision('int8')); load or build it in float32 to keep BF16")
        if self.kept:
            return self
        if self.device != "cpu":
            raise ValueError(f"keep_bf16: the model is on {self.device}; BF16-only matrices run "
                             "on the CPU (model.to('cpu') first)")
        self._claim("keep_bf16")
        matrices, vectors = _split(self._params)
        bits = np.empty(sum(a.size for a in matrices.values()), np.uint16)
        at = 0
        for a in matrices.values():  # rounded a piece at a time: no float32 copy
            flat = a.reshape(-1)
            for i in range(0, flat.size, _KEEP_CHUNK):
                piece = flat[i:i + _KEEP_CHUNK]
                bits[at + i:at + i + piece.size] = ops.to_bf16_bits(piece)
            at += flat.size
        self._keep(bits, np.concatenate([a.reshape(-1) for a in vectors.values()]))
        return self

    def _keep(self, bits, vector_values):
        """keep_bf16 with its values given: bits (uint16) every matrix's, vector_values
        (float32) every vector's, each one after another in model.params's order (the order
        of param_shapes, and of pytfm_llama_read_bf16); the layers then hold views of them."""
        params, grads = self._params, self._grads
        matrices, vectors = _split(params)
        layout = {n: params.layout[n] for n in vectors}
        start = min(off for off, _ in layout.values())
        flat = FlatDict({n: (off - start, shape) for n, (off, shape) in layout.items()},
                        params.size - start)
        # where each parameter starts in the new buffers: bits, or flat's (JoinedLinear's q, k
        # and v, one span of the old buffer, are adjacent in both)
        self.params16, starts, at = {}, {}, 0
        for name, a in matrices.items():
            self.params16[name] = bits[at:at + a.size].reshape(a.shape)
            starts[_address(a)] = (bits, at)
            at += a.size
        assert at == bits.size
        at = 0
        for name, a in vectors.items():
            flat[name] = vector_values[at:at + a.size].reshape(a.shape)
            starts[_address(a)] = (flat.buffer, layout[name][0] - start)
            at += a.size
        assert at == vector_values.size

        def held(a):  # the new array of a layer's a, a view into params's buffer
            buffer, at = starts[_address(a)]
            return buffer[at:at + a.size].reshape(a.shape)

        self.set_precision("bf16")
        for layer in self._layers():
            for attr, value in list(vars(layer).items()):
                if _within(value, grads.buffer):
                    setattr(layer, attr, None)  # no gradients: the model does not train
                elif _within(value, params.buffer):
                    setattr(layer, attr, held(value))
            layer.saved = None
        self.vectors, self.saved = flat, None
        self._params = self._grads = None
        params.stale = grads.stale = True
        self.kept = True

    def _quantise(self, values=None):
        """set_precision("int8"): see there. values: {name: float32 array} of every parameter,
        quantised instead of the model's own (a load quantises what it read, never touching
        the float32 model's pages)."""
        if self.device != "cpu":
            raise ValueError(f"set_precision('int8'): the model is on {self.device}; int8 "
                             "weights run on the CPU only (model.to('cpu') first)")
        # what the layers hold now, by name: model.params's, or a kept model's BF16 bits
        now = dict(self._params) if not self.kept else {**self.params16, **self.vectors}
        current = now if values is None else values
        order = [name for name, _ in param_shapes(self.cfg)]
        quantised = [n for n in order if _quantised(n, current[n])]
        for name in quantised:
            out, n_in = current[name].shape
            if n_in % Q8_BLOCK:
                raise ValueError(f"set_precision('int8'): int8 weights are blocks of {Q8_BLOCK} "
                                 f"values along a matrix's input dimension, and {name} is "
                                 f"[{out}, {n_in}]: {n_in} is not a multiple of {Q8_BLOCK} "
                                 "(run this model in 'fp32' or 'bf16')")
        self._claim("set_precision")
        q_all = np.empty(sum(current[n].size for n in quantised), np.int8)
        s_all = np.empty(q_all.size // Q8_BLOCK, np.uint16)
        starts, at = {}, 0  # the address of each array held now -> its place in the new ones
        params8 = {}
        for name in quantised:
            a = current[name]
            rows = max(1, _KEEP_CHUNK // a.shape[1])
            for r in range(0, a.shape[0], rows):  # a piece at a time: no float32 copy
                # float32, or BF16 bits (quantised as their float32 widening, exactly)
                q, scales = ops.quantize_q8(np.ascontiguousarray(a[r:r + rows]))
                lo = at + r * a.shape[1]
                q_all[lo:lo + q.size] = q.reshape(-1)
                s_all[lo // Q8_BLOCK:(lo + q.size) // Q8_BLOCK] = scales.reshape(-1)
            params8[name] = (q_all[at:at + a.size].reshape(a.shape),
                             s_all[at // Q8_BLOCK:(at + a.size) // Q8_BLOCK].reshape(
                                 a.shape[0], -1))
            starts[_address(now[name])] = ("q8", at)
            at += a.size
        rest = [(n, current[n].shape) for n in order if n not in params8]
        layout, size = flat_layout(rest)
        flat = FlatDict(layout, size)
        for name, _ in rest:
            a = current[name]
            flat[name] = ops.from_bf16_bits(a) if a.dtype == np.uint16 else a
            starts[_address(now[name])] = ("vector", layout[name][0])
        grads = self._grads

        def held(a):  # the new arrays of a layer's array a (a span of one or more parameters)
            kind, at = starts[_address(a)]
            if kind == "vector":
                return flat.buffer[at:at + a.size].reshape(a.shape), None
            return (q_all[at:at + a.size].reshape(a.shape),
                    s_all[at // Q8_BLOCK:(at + a.size) // Q8_BLOCK].reshape(a.shape[0], -1))

        for layer in self._layers():
            for attr, value in list(vars(layer).items()):
                if grads is not None and _within(value, grads.buffer):
                    setattr(layer, attr, None)  # no gradients: the model does not train
                elif isinstance(value, np.ndarray) and _address(value) in starts:
                    new, scales = held(value)
                    setattr(layer, attr, new)
                    if scales is not None:  # a weight's blocks: the layer's scales beside
                        layer.scales = scales
            layer.saved = None
        if self._params is not None:
            self._params.stale = self._grads.stale = True
        self.vectors, self.params16, self.params8, self.saved = flat, None, params8, None
        self._params = self._grads = None
        self.kept, self.precision = True, "int8"
        return self

    def set_precision(self, precision):
        """The precision of the linear layers' products from now on ("fp32" or "bf16", see
        GPT); returns the model. A forward and its backward should run in one precision.

        "int8", for inference on the CPU: every matrix but GPT-2's learned positions (which
        are added, not multiplied) is quantised once, here, into blocks of 32 values along its
        input dimension, each block int8 values q and one fp16 scale d = amax/127 (Q8_0:
        ops.quantize_q8; from its BF16 values for a model that keeps BF16), held in
        model.params8 ({name: (q, scales)}; a tied LM head is the embedding's), the rest in
        float32 in model.vectors; the float32 matrices and the gradients are freed. Each
        product is then ops.linear_forward_q8w's, the embedding ops.embedding_forward_q8w's:
        forward, decode and pytfm.generate give the bits of the C model in
        PYTFM_PRECISION_INT8. It is one way: what would train the model is refused as for
        keep_bf16, and so are set_precision to another precision, keep_bf16 and to("cuda").
        A matrix whose input dimension is not a multiple of 32 is refused (ValueError naming
        it) before anything changes."""
        precision_code(precision, choices=MODEL_PRECISIONS)  # a bad name fails here
        if self.precision == "int8" and precision != "int8":
            raise ValueError(f"set_precision({precision!r}): this model holds its matrices in "
                             "int8 blocks only (set_precision('int8')), so it runs in 'int8'; "
                             "load or build it in float32 for another precision")
        if precision == "int8":
            return self._quantise() if self.precision != "int8" else self
        if self.kept and precision != "bf16":
            raise ValueError(f"set_precision({precision!r}): this model holds its matrices in "
                             "BF16 only (keep_bf16), so it runs in 'bf16'; load or build it in "
                             "float32 for another precision")
        if precision == "tf32" and self.device == "cpu":
            raise ValueError("precision 'tf32' runs on the GPU only (its tensor cores): use "
                             "'fp32' or 'bf16' on the CPU, or GPT(..., device='cuda')")
        if precision != self.precision:
            self._claim("set_precision")  # a forward in flight elsewhere would mix precisions
        for layer in self._layers():
            if isinstance(layer, (Linear, CausalSelfAttention, GroupedQueryAttention)):
                layer.precision = precision
        self.precision = precision
        return self

    def to(self, device):
        """Move the model to device ("cpu" or "cuda") and return it. Its parameters and
        gradients become new FlatDicts there (each buffer copied in one transfer), which the
        layers then hold; what a forward saved for its backward is dropped. Make the optimizer
        AFTER moving the model, as in torch: one made before still holds the old arrays (its
        step() refuses them: they are marked stale)."""
        if self.kept and device != self.device:  # before the GPU is looked for
            form, how = _FORMS[self.precision]
            raise ValueError(f"to({device!r}): this model holds its matrices in {form} only "
                             f"({how.split(',')[0]}), which runs on the CPU; load or build it "
                             "in float32 to move it")
        xp = devices.array_module(device)
        if device == self.device:
            return self
        if self.precision == "tf32" and device == "cpu":
            raise ValueError("precision 'tf32' runs on the GPU only: set_precision('fp32') or "
                             "'bf16' before moving the model to the CPU")
        self._claim("to")
        params, grads = self.params.to(device), self.grads.to(device)
        moved = {}  # id of an old array -> the array that replaces it
        flats = ((self.params, params), (self.grads, grads))
        for old, new in flats:
            moved.update((id(old[name]), new[name]) for name in old)
            old.stale = True
        for layer in self._layers():
            for attr, value in list(vars(layer).items()):
                if is_array(value):
                    if id(value) not in moved:  # a span of parameters, or a constant table
                        moved[id(value)] = _moved(value, flats, device)
                    setattr(layer, attr, moved[id(value)])
            layer.saved = None
        self._params, self._grads = params, grads
        if self.pe is not None:
            self.pe = devices.to_device(self.pe, device)
        self.saved, self.device, self.xp = None, device, xp
        return self

    def _layers(self):
        """Every layer object, each once (a tied LM head shares the embedding's arrays)."""
        yield self.wte
        if self.wpe is not None:
            yield self.wpe
        for block in self.blocks:
            yield from block.layers()
        yield self.ln_f
        yield self.lm_head

    def _claim(self, what):
        """Make the calling thread the one that trains this model, unless another live thread
        does (RuntimeError naming both): see the module's "Threads"."""
        me = threading.current_thread()
        with self._trainer_lock:
            trainer = self._trainer
            if trainer is not None and trainer is not me and trainer.is_alive():
                raise RuntimeError(
                    f"GPT.{what}() in thread {me.name!r}: this model is being trained by thread "
                    f"{trainer.name!r}, and two threads training one model at once mix their "
                    "saved activations and gradients. Train it in one thread (forward with "
                    "save=False, decode and generate may run in any), or call "
                    "model.release_thread() in that thread first to hand it over")
            self._trainer = me

    def __getstate__(self):  # copy.deepcopy, pickle: a copy no thread trains yet
        state = dict(self.__dict__, _trainer=None)
        del state["_trainer_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state, _trainer_lock=threading.Lock())

    def release_thread(self):
        """Hand the training of this model over: after this call (in the thread that trains it),
        another thread may train it. A thread that ends hands it over too."""
        with self._trainer_lock:
            if self._trainer is threading.current_thread():
                self._trainer = None

    def _check_inputs(self, idx, targets=None, check_ids=True, what="forward"):
        """Token ids are int64 arrays (B, T) on the model's device, targets of idx's shape
        (TypeError or ValueError naming the argument otherwise). On the CPU the C kernels check
        their values; on the GPU the kernels cannot (pytfm.h), so they are checked here, idx and
        targets with one read of the device, unless the caller vouches for them
        (check_ids=False)."""
        named = [("idx", idx)] + ([("targets", targets)] if targets is not None else [])
        kind = "a cupy.ndarray" if self.device == "cuda" else "a numpy.ndarray"
        for name, a in named:
            want = f"{name} must be {kind} of int64 token ids, of shape (B, T)"
            if not is_array(a):
                raise TypeError(f"GPT.{what}: {want}, got {type(a).__name__}")
            if devices.device_of(a) != self.device:
                how = "cupy.asarray(" if self.device == "cuda" else "cupy.asnumpy("
                raise TypeError(f"{name} is on {devices.device_of(a)} but the model is on "
                                f"{self.device}: move it there first ({how}{name}))")
            if a.dtype != np.int64:
                raise TypeError(f"GPT.{what}: {want}, got dtype {a.dtype} "
                                f"({name}.astype(np.int64))")
            if a.ndim != 2:
                raise ValueError(f"GPT.{what}: {want}, got shape {a.shape}")
            if not a.flags.c_contiguous:
                raise ValueError(f"GPT.{what}: {name} must be C-contiguous "
                                 f"(np.ascontiguousarray({name})), got strides {a.strides}")
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"GPT.{what}: targets must have idx's shape {idx.shape} (one target "
                             f"per token, -1 to ignore), got {targets.shape}")
        if self.device != "cpu" and as_bool("check_ids", check_ids):
            vocab = self.cfg.vocab
            check_index_arrays(*((name, a, vocab, -1 if name == "targets" else None)
                                 for name, a in named))

    def num_params(self):
        if self.kept:
            held = self.params16.values() if self.params8 is None else \
                (q for q, _ in self.params8.values())
            return sum(p.size for p in (*held, *self.vectors.values()))
        return sum(p.size for p in self.params.values())

    def zero_grad(self):
        if self.kept:
            raise self._kept_error("zero_grad()")
        self._claim("zero_grad")
        self.grads.buffer.fill(0.0)

    def _logits(self, idx, start, save, caches):  # int64 (B, T) -> (B, T, vocab)
        """The tokens idx (checked by the caller) at positions [start, start + T): the whole
        sequence (start 0, no caches) or new tokens decoded through one KV cache per block."""
        T = idx.shape[1]
        if start + T > self.cfg.max_seq:
            raise ValueError(
                f"sequence of {start + T} tokens is longer than max_seq = {self.cfg.max_seq}")
        x = self.wte.forward(idx, save)  # (B, T, C)
        if self.pe is not None:
            x += self.pe[start:start + T]
        pos = arange(self.xp, start, start + T)  # inside a TrainStep: one array for its plan
        if self.wpe is not None:
            x = self.wpe.forward(x, start, pos, save)
        for block, cache in zip(self.blocks, caches):
            x = block.forward(x, pos, save, cache)
        return self.lm_head.forward(self.ln_f.forward(x, save), save)

    def forward(self, idx, targets=None, *, save=None, check_ids=True):
        """idx int64 (B, T) -> logits (B, T, vocab), and the mean cross-entropy loss of the
        targets (B, T) when given (-1 marks a position to ignore), else None. idx and targets
        are on the model's device, and so are the logits and the loss (a 0-d float32 array on
        either device: float(loss) reads it back).

        save: keep what backward() needs (the default when targets are given, but for a model
        that keeps BF16 or int8 weights, which does not train: keep_bf16); pass
        save=False to evaluate a loss without touching the state of a pending backward().
        check_ids=False skips the GPU's check of the ids' values (one read of the device, the
        only one in a training step) when the caller knows them to be in [0, vocab) (-1 for a
        target); an id outside would then make the loss NaN. The CPU always checks."""
        save = targets is not None and not self.kept if save is None else as_bool("save", save)
        if save and self.kept:
            raise self._kept_error("forward(save=True)")
        if save and targets is None:
            raise ValueError("forward(save=True) needs targets: backward() starts at the loss")
        self._check_inputs(idx, targets, check_ids)
        if save:
            self._claim("forward")
        logits = self._logits(idx, 0, save, [None] * self.cfg.n_layer)
        loss = lse = None
        if targets is not None:
            loss, lse = ops.cross_entropy_forward(logits, targets, check_ids=False)  # lse (B, T)
        if save:
            self.saved = (logits, targets, lse)
        return logits, loss

    def backward(self):
        """Accumulate d(loss)/d(parameter) into self.grads, for the loss of the last
        forward() that saved."""
        if self.kept:
            raise self._kept_error("backward()")
        if self.saved is None:
            raise RuntimeError("backward() needs a preceding forward(idx, targets) with targets")
        self._claim("backward")
        logits, targets, lse = self.saved
        dlogits = ops.cross_entropy_backward(logits, targets, lse, check_ids=False)  # (B, T, V)
        dx = self.ln_f.backward(self.lm_head.backward(dlogits))  # (B, T, C)
        for block in reversed(self.blocks):
            dx = block.backward(dx)
        self.wte.backward(dx)
        if self.wpe is not None:  # learned positions; a sinusoidal table is fixed
            self.wpe.backward(dx)

    def attention_probs(self, idx, layers=None):
        """The attention weights of the tokens idx (B, T) in each layer (every layer, or the
        indices in layers): {layer: P (B, n_head, T, T)}, where P[b, h, t, s] is the weight
        query t of head h gives key s (zero for s > t; each row sums to 1).

        Runs the ordinary forward pass with save=False (a pending backward() is not disturbed)
        while the asked layers hand over their q, k (after RoPE) and the lse their attention
        kernel returned; P is rebuilt from those (attention_probs above), so it is what the
        kernel computed. Nothing is kept once this returns, and training never asks. The maps
        take B·n_head·T²·len(layers) floats: more than MAX_ATTENTION_BYTES is a ValueError.
        On the GPU, idx may be on either device, and the maps come back as NumPy arrays."""
        n_layer, H = self.cfg.n_layer, self.cfg.n_head
        layers = list(range(n_layer)) if layers is None else list(layers)
        for i in layers:
            if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or \
                    not 0 <= i < n_layer:
                raise ValueError(f"layers: {i!r} is not a layer index in [0, {n_layer})")
        if self.device != "cpu" and is_array(idx):
            idx = devices.to_device(idx, self.device)
        self._check_inputs(idx, what="attention_probs")
        B, T = idx.shape
        size = 4 * B * H * T * T * len(set(layers))
        if size > MAX_ATTENTION_BYTES:
            most = math.isqrt(MAX_ATTENTION_BYTES // (4 * B * H * len(set(layers))))
            raise ValueError(
                f"attention maps of {B} sequence(s) x {H} heads x {len(set(layers))} layer(s) x "
                f"T² for T = {T} take {size / 2**20:,.0f} MiB, more than the "
                f"{MAX_ATTENTION_BYTES // 2**20} MiB allowed (MAX_ATTENTION_BYTES): they are "
                f"for short inputs (at most T = {most} here)")
        attns, me = [self.blocks[i].attn for i in set(layers)], threading.get_ident()
        try:
            with _PROBES:
                for attn in attns:
                    attn.probe = {**(attn.probe or {}), me: []}
            self._logits(idx, 0, False, [None] * n_layer)
            return {i: attention_probs(*self.blocks[i].attn.probe[me][0]) for i in layers}
        finally:
            with _PROBES:
                for attn in attns:
                    rest = {t: got for t, got in (attn.probe or {}).items() if t != me}
                    attn.probe = rest or None

    def new_caches(self, batch, max_len=None, precision="fp32"):
        """One KV cache per block, for decode(), of max_len positions (default and at most
        cfg.max_seq: a generation sizes them to what it will decode, not to the context), on
        the model's device; precision "fp32" or "bf16" (half the bytes, CPU only: KVCache)."""
        c = self.cfg
        kw = dict(device=self.device, precision=precision)
        max_len = c.max_seq if max_len is None else min(max_len, c.max_seq)
        if c.arch == "llama":  # n_kv_head heads of head_dim, the sliding window
            return [KVCache(batch, max_len, c.n_head, c.head_dim, n_kv_head=c.n_kv_head,
                            window=c.sliding_window, **kw)
                    for _ in range(c.n_layer)]
        return [KVCache(batch, max_len, c.n_head, c.d_model // c.n_head, **kw)
                for _ in range(c.n_layer)]

    def decode(self, idx, caches, *, check_ids=True):
        """Logits (B, n_new, vocab) of n_new new tokens idx (B, n_new), which follow the
        len(caches[0]) tokens already decoded; appends their keys and values to the caches.
        idx, the caches and the logits are on the model's device; check_ids as forward().
        caches: one KVCache per block (new_caches(B)), each of batch B, of the model's heads
        and head size, holding the same number of positions, with room for n_new more; else
        TypeError or ValueError naming the cache, before anything is appended.
        Saves nothing: a forward() and its backward() may be on either side of it."""
        self._check_inputs(idx, check_ids=check_ids, what="decode")
        self._check_caches(caches, *idx.shape)
        return self._logits(idx, len(caches[0]), False, caches)

    def _check_caches(self, caches, batch, n_new):
        c = self.cfg
        want = f"{c.n_layer} KVCaches, one per block (GPT.new_caches)"
        if not isinstance(caches, (list, tuple)):
            raise TypeError(f"GPT.decode: caches must be a list of {want}, got "
                            f"{type(caches).__name__}")
        if len(caches) != c.n_layer:
            raise ValueError(f"GPT.decode: caches must be a list of {want}, got {len(caches)}")
        heads = "n_head"
        shape = (batch, c.n_head, c.d_model // c.n_head)
        if c.arch == "llama":
            heads, shape = "n_kv_head", (batch, c.n_kv_head, c.head_dim)
        for i, cache in enumerate(caches):
            if not isinstance(cache, KVCache):
                raise TypeError(f"GPT.decode: caches[{i}] must be a KVCache, got "
                                f"{type(cache).__name__}")
            B, room, H, D = cache.k.shape
            if (B, H, D) != shape or cache.n_head != c.n_head:
                have = want_q = ""  # the query heads a grouped cache serves, where they differ
                if c.arch == "llama":
                    have = f" for {cache.n_head} query heads"
                    want_q = f" for {c.n_head} query heads"
                raise ValueError(
                    f"GPT.decode: caches[{i}] holds (batch, {heads}, head_dim) = {(B, H, D)}"
                    f"{have}, but idx's batch and this model's heads need {shape}{want_q} "
                    f"(GPT.new_caches({batch}))")
            if cache.window != c.sliding_window:
                raise ValueError(f"GPT.decode: caches[{i}] has a sliding window of "
                                 f"{cache.window}, this model {c.sliding_window} "
                                 f"(GPT.new_caches({batch}))")
            if cache.device != self.device:
                raise ValueError(f"GPT.decode: caches[{i}] is on {cache.device} but the model is "
                                 f"on {self.device}")
            if len(cache) != len(caches[0]):
                raise ValueError(f"GPT.decode: caches[{i}] holds {len(cache)} positions but "
                                 f"caches[0] holds {len(caches[0])}: the caches of one sequence "
                                 "are filled together")
            if len(cache) + n_new > room:
                raise ValueError(f"GPT.decode: caches[{i}] has room for {room} positions; "
                                 f"{len(cache)} are filled, {n_new} new ones do not fit")


_SEQ2SEQ = ("Seq2SeqConfig", "Transformer")  # the encoder–decoder's, from pytfm.seq2seq


def __getattr__(name):  # pytfm.nn.Transformer: imported on first use (PEP 562), since
    if name in _SEQ2SEQ:  # pytfm.seq2seq imports this module's layers
        from . import seq2seq

        return getattr(seq2seq, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
