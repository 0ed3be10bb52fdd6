"""pytfm.gpt2 — GPT-2 in the layout it is published in: Hugging Face folders in and out.

    model = pytfm.gpt2.load("gpt2")                   # config.json + model.safetensors
    tok = pytfm.gpt2.load_tokenizer("gpt2")           # vocab.json + merges.txt beside it
    pytfm.gpt2.save(model, "gpt2-tuned", tokenizer=tok)

A folder holds config.json (GPT2Config's fields), the weights in model.safetensors (or shards
listed by model.safetensors.index.json), and the tokenizer (vocab.json + merges.txt, or
tokenizer.json). pytfm's GPT with pos="learned" is GPT-2: learned positions added to the token
embedding, pre-norm blocks with LayerNorm (eps 1e-5), attention scaled by 1/sqrt(head dim),
GELU's tanh form (transformers' gelu_new), the LM head tied to the embedding; the weights have
the names GPT2LMHeadModel's state dict uses. Its Conv1D layers store their weights [in, out],
pytfm's Linear [out, in]: load transposes them, save transposes them back.

The folder is read by the C library's GPT-2 reader (pytfm_gpt2_* in pytfm_model.h, the same
reader the C model API opens folders with, where its rules are written down); this module maps
what it returns to NumPy. In short: config.json is read strictly (the C library's JSON check
first): vocab_size, n_positions, n_embd, n_layer and n_head must be there (positive ints;
n_ctx, if there, equal to n_positions). A field that would change the maths must have GPT-2's
value, else the folder is refused naming it: activation_function gelu_new (or
gelu_pytorch_tanh, the same function), n_inner null or 4·n_embd, layer_norm_epsilon 1e-5,
scale_attn_weights true, scale_attn_by_inverse_layer_idx false, add_cross_attention false,
pruned_heads empty, model_type gpt2; tie_word_embeddings true, or false with an lm_head.weight
stored. The fields in IGNORED (dropout, initialisation, the heads of other tasks, generation
defaults, labels, token ids, bookkeeping; the C reader's list) and any whose name starts with
"_" are ignored: none changes the forward pass. Any other field is refused: pytfm cannot know
what it does.

model.safetensors (or the shards the index lists), each header checked before any data is
read: the tensors named as GPT2LMHeadModel names them (transformer.h.0.attn.c_attn.weight,
...) or as GPT2Model does (h.0.attn.c_attn.weight, ...), one layout per folder; each float32,
of the shape the config implies; nothing missing. By rule: the buffers h.N.attn.bias (the
causal mask [1, 1, n_positions, n_positions]) and h.N.attn.masked_bias (a scalar) may be there
and are not read (transformers rebuilds them too); a tied model's lm_head.weight may be there
and must then equal the embedding; any other tensor is refused. F16 and BF16 files are refused
by the reader (it takes F32 and I64 tensors). All of that is checked before the model is
allocated, and the memory the model takes (its parameters and their gradients) is compared with
what the machine has: a folder claiming a million layers fails at once, naming the file.

Every problem is a CheckpointError (a ValueError) naming the file, or an OSError from the file
system; a tokenizer's, a TokenizerError naming its file.
"""

import errno
import json
import math
import os
import re
from dataclasses import replace

import numpy as np

from . import _atomic
from ._core import MODEL_PRECISIONS, check, ffi, lib, precision_code
from .checkpoint import CheckpointError, safetensors_chunks
from .device import available_memory  # memory_plan's default; tests patch it here
from .nn import GPT, GPTConfig
from .tokenizer import Tokenizer

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _ignored():
    names, i = [], 0
    while (name := lib.pytfm_gpt2_ignored_field(i)) != ffi.NULL:
        names.append(ffi.string(name).decode("ascii"))
        i += 1
    return frozenset(names)


# config.json fields that do not change the forward pass: ignored (pytfm_gpt2_ignored_field)
IGNORED = _ignored()
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _check(status):
    check(status, CheckpointError)  # the C reader's messages name the file


def _gpt_config(c):
    """A pytfm_model_config the reader filled -> GPTConfig (pos="learned", seed 0)."""
    return GPTConfig(vocab=c.vocab, d_model=c.d_model, n_layer=c.n_layer, n_head=c.n_head,
                     max_seq=c.max_seq, pos="learned", tie_embeddings=bool(c.tie_embeddings))


def read_config(folder):
    """The GPTConfig (pos="learned", seed 0) of the folder's config.json, checked by the C
    reader (pytfm_gpt2_read_config) as the module says."""
    c = ffi.new("pytfm_model_config *")
    _check(lib.pytfm_gpt2_read_config(c, os.fsencode(folder)))
    return _gpt_config(c)


# a JSON string, or one of the bare tokens json.dumps writes for a non-finite float
_STRING_OR_NONFINITE = re.compile(r'"(?:[^"\\]|\\.)*"|-?Infinity|NaN')


def _json_text(c):
    """json.dumps(c), with an infinite float written 1e999 (-1e999): JSON has no infinity, but
    json.loads reads a number too large for a double as one, so config.json's text for a dict
    that came from json.loads. NaN has no such spelling: ValueError."""
    def token(m):
        t = m.group(0)
        if t[0] == '"':
            return t
        if t == "NaN":
            raise ValueError("NaN is not a JSON number")
        return t.replace("Infinity", "1e999")
    return _STRING_OR_NONFINITE.sub(token, json.dumps(c))


def config_from_dict(c, path=CONFIG):
    """GPT2Config's dict (config.json's object) -> GPTConfig, or CheckpointError naming path
    (the C reader's rules, on json.dumps(c))."""
    try:
        raw = _json_text(c).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: not a JSON value ({e})") from None
    out = ffi.new("pytfm_model_config *")
    _check(lib.pytfm_gpt2_config_parse(out, raw, len(raw), os.fsencode(path)))
    return _gpt_config(out)


def hf_config(cfg, eot=None):
    """config.json's dict for a GPTConfig with pos="learned": GPT2Config's fields, with its
    defaults for what pytfm does not use (dropout 0.1, ...). eot: the id of <|endoftext|>
    (bos_token_id and eos_token_id), when the vocabulary has it."""
    if cfg.pos != "learned":
        raise ValueError(f"a GPT-2 folder holds a model with learned positions (pos='learned'); "
                         f"this one has pos={cfg.pos!r}")
    return {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": eot, "embd_pdrop": 0.1, "eos_token_id": eot,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_ctx": cfg.max_seq, "n_embd": cfg.d_model, "n_head": cfg.n_head, "n_inner": None,
        "n_layer": cfg.n_layer, "n_positions": cfg.max_seq, "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
        "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": "float32",
        "use_cache": True, "vocab_size": cfg.vocab,
    }


# ---- the weights ------------------------------------------------------------------------------


def _hf_shapes(cfg):
    """(pytfm name, shape as stored, whether stored transposed) of each parameter, in
    GPT2LMHeadModel's names, lazily: what save writes (reading is the C reader's)."""
    from .nn import param_shapes

    for name, shape in param_shapes(cfg):
        conv = name.endswith(_CONV1D) and name.startswith("transformer.h.")
        yield name, tuple(reversed(shape)) if conv else shape, conv


class _Folder:
    """A Hugging Face folder open in its family's C reader (pytfm_<kind>_open, kind "gpt2" or
    "llama": every rule checked, headers only): .cfg its GPTConfig (to_config of the C
    config); read() -> {pytfm name: array} of every parameter (GPT-2's Conv1D weights
    transposed, a stored tied head checked against the embedding, BF16 and F16 converted). A
    context manager."""

    def __init__(self, folder, kind="gpt2", to_config=None):
        self._close = getattr(lib, f"pytfm_{kind}_close")
        self._read = getattr(lib, f"pytfm_{kind}_read")
        handle = ffi.new(f"pytfm_{kind} **")
        _check(getattr(lib, f"pytfm_{kind}_open")(handle, os.fsencode(folder)))
        self._g = handle[0]
        c = ffi.new("pytfm_model_config *")
        _check(getattr(lib, f"pytfm_{kind}_get_config")(self._g, c))
        self.cfg, self.n_params = (to_config or _gpt_config)(c), c.n_params

    def read(self):
        from .nn import param_shapes

        flat = np.empty(self.n_params, np.float32)
        _check(self._read(self._g, ffi.from_buffer("float[]", flat, True), self.n_params))
        arrays, at = {}, 0
        for name, shape in param_shapes(self.cfg):
            n = math.prod(shape)
            arrays[name] = flat[at:at + n].reshape(shape)
            at += n
        return arrays

    def close(self):
        if self._g is not None:
            self._close(self._g)
            self._g = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- memory ------------------------------------------------------------------------------------


def memory_plan(cfg, batch=None, context=None, optimizer=True, bf16=False):
    """{what: bytes} a GPT of cfg takes in float32: "params", "grads" (GPT allocates both),
    "adamw" (its two moments, when optimizer), and with batch and context, "activations": what
    a training step keeps for its backward, per layer 16·d_model floats per token (the block's
    input, both LayerNorms' outputs, q, k, v, attention's output, the residual, the MLP's
    pre-activation and its GELU, 4·d_model each; for arch "llama" the block's input, both
    norms' outputs and the residual, 3·(n_head + n_kv_head)·head_dim for q, k, v, their norms'
    inputs and attention's output, and 3·d_ff for SwiGLU's gate, up and product), and for the
    head its norm's input and output and the logits twice (themselves and their gradient),
    plus the first layer's gradients in flight. "total" sums them. The one estimate of a GPT's
    memory: train_tiny plans with it too. Costs the same for any number of layers.
    bf16: a model that holds its matrices in BF16 only (GPT.keep_bf16): "params" only, 2 bytes
    a matrix value and 4 a vector value, no gradients."""
    from .nn import param_shapes

    def count(n_layer, ndim):  # values of cfg's parameters of ndim >= 2 (1), n_layer layers
        return sum(math.prod(s) for _, s in param_shapes(replace(cfg, n_layer=n_layer))
                   if (len(s) >= 2) == (ndim == 2))

    def values(ndim):  # the layers are alike
        return count(1, ndim) + (cfg.n_layer - 1) * (count(2, ndim) - count(1, ndim))

    n = values(2) + values(1)
    plan = {"params": 4 * n, "grads": 4 * n}
    if bf16:
        plan = {"params": 2 * values(2) + 4 * values(1)}
    elif optimizer:
        plan["adamw"] = 8 * n
    if batch is not None:
        N, C = batch * (context or cfg.max_seq), cfg.d_model
        layer = 16 * C if cfg.arch == "gpt" else (
            4 * C + 3 * (cfg.n_head + cfg.n_kv_head) * cfg.head_dim + 3 * cfg.d_ff)
        plan["activations"] = 4 * N * (layer * cfg.n_layer + 3 * C + 2 * cfg.vocab + 8 * C)
    plan["total"] = sum(plan.values())
    return plan


def describe(plan):
    """A plan as one line: '1.99 GiB (params 0.46, grads 0.46, adamw 0.93, ...)'."""
    parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in plan.items() if k != "total")
    return f"{plan['total'] / 2**30:.2f} GiB ({parts} GiB)"


def check_memory(plan, what, available=None):
    """MemoryError naming what, before anything is allocated, when plan's total exceeds the
    available memory (available_memory() when not given; nothing is checked where unknown)."""
    available = available_memory() if available is None else available
    if available is not None and plan["total"] > available:
        raise MemoryError(f"{what} needs {describe(plan)}, more than the "
                          f"{available / 2**30:.2f} GiB of memory available")


# ---- load and save -----------------------------------------------------------------------------


def _cpu_only(precision, device):
    """A load in precision "int8" is refused on the GPU before anything is read."""
    if precision == "int8" and device != "cpu":
        raise ValueError(f"precision 'int8' runs on the CPU only (int8 weights), not on "
                         f"{device}: load it with device='cpu', or in 'fp32' or 'bf16'")


def load(folder, device="cpu", precision="fp32"):
    """The GPT-2 in a Hugging Face folder (config.json + model.safetensors) as a pytfm GPT
    (pos="learned") on device, in precision. Everything is checked, and the memory the model
    needs compared with what is available, before the model is allocated. "int8" (the CPU
    only) quantises the float32 values read as they lie (GPT.set_precision("int8")), never
    writing the float32 model's own pages."""
    from . import device as devices

    precision_code(precision, choices=MODEL_PRECISIONS)  # a bad name fails here
    _cpu_only(precision, device)
    devices.array_module(device)
    with _Folder(folder) as f:
        check_memory(memory_plan(f.cfg, optimizer=False), f"the GPT-2 in {folder}")
        model = GPT(f.cfg, device, init=False)
        if precision == "int8":
            return model._quantise(f.read())
        model.params.copy_from(f.read())
    return model.set_precision(precision)


def load_tokenizer(folder):
    """The tokenizer beside the weights (pytfm.tokenizer.Tokenizer.from_folder)."""
    return Tokenizer.from_folder(folder)


def load_snapshot(folder, device="cpu", tries=10, load=None):
    """(model, tokenizer) of one version of the folder: load(folder, device) and
    load_tokenizer(folder) from the same save, where the two calls one after the other may pair
    the model of one save with the tokenizer of the next. load: the model's reader (default
    this module's; pytfm.llama.load for the Llama family's folders).

    The folder is held open (an O_DIRECTORY descriptor) while both are read, and they are read
    again when it is no longer the folder at that path afterwards. A save replaces the folder
    by a new one (pytfm._atomic.Folder) and removes the old, which cannot come back while it is
    held open; so the path still naming the held folder after both reads means both read it.
    OSError (EAGAIN) when saves replaced it during each of tries reads."""
    read = load if load is not None else globals()["load"]
    for _ in range(tries):
        try:
            held = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return read(folder, device), load_tokenizer(folder)  # refused there, in its words
        try:
            pair = read(folder, device), load_tokenizer(folder)
        except (ValueError, OSError):  # CheckpointError and TokenizerError are ValueErrors
            if _still(folder, held):
                raise
            pair = None  # a read of a folder being replaced: read the new one
        finally:
            same = _still(folder, held)
            os.close(held)
        if pair is not None and same:
            return pair
    raise OSError(errno.EAGAIN, f"{folder}: replaced by a save during each of {tries} reads "
                  f"of its model and tokenizer")


def _still(folder, held):
    """Whether the folder at path folder is the one open as held."""
    try:
        return os.path.samestat(os.stat(folder), os.fstat(held))
    except OSError:
        return False


# Hugging Face's tokenizer files beside vocab.json and merges.txt: transformers'
# AutoTokenizer reads tokenizer.json before them, and the other three carry ids and special
# tokens of the tokenizer they were written with
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                      "added_tokens.json")


def save(model, folder, tokenizer=None):
    """Write model (a GPT with pos="learned") as a Hugging Face GPT-2 folder (made if missing):
    config.json, model.safetensors (GPT2LMHeadModel's names, the Conv1D weights [in, out], no
    lm_head.weight when tied, metadata format "pt"), and, given a tokenizer, vocab.json and
    merges.txt. transformers.GPT2LMHeadModel.from_pretrained(folder) reads it. The folder is
    replaced as a whole (pytfm._atomic.Folder; its other files are kept): a reader, and a save
    killed at any moment, see the old folder or the new one, never new weights beside an old
    config; two saves at once never mix.

    The tokenizer files of the old folder: a save with a tokenizer removes the ones in
    HF_TOKENIZER_FILES (they describe the old tokenizer, and transformers' AutoTokenizer would
    read tokenizer.json first), so the folder's one tokenizer is the saved one, for pytfm and
    transformers alike. A save without one keeps the old tokenizer when it fits the model, and
    refuses (ValueError naming the file, before anything is written) when a tokenizer pytfm
    reads there (vocab.json + merges.txt, or tokenizer.json) has more tokens than the model's
    vocabulary: removing it would lose the user's file, keeping it would pair the model with
    ids it has no row for. Tokenizer files pytfm cannot read are kept as they are."""
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a pytfm.nn.GPT, got {type(model).__name__}")
    if tokenizer is not None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer must be a pytfm.tokenizer.Tokenizer, got "
                            f"{type(tokenizer).__name__}")
        if len(tokenizer) > model.cfg.vocab:
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, more than the model's "
                             f"vocabulary of {model.cfg.vocab}")
    config = hf_config(model.cfg, tokenizer.eot if tokenizer is not None else None)
    params = model.params.to("cpu")
    tensors = {}
    for name, _, conv in _hf_shapes(model.cfg):
        a = params[name]
        tensors[name] = np.ascontiguousarray(a.T) if conv else a
    weights = safetensors_chunks(tensors, {"format": "pt"})
    with _atomic.Folder(folder) as f:
        if tokenizer is None:
            _check_old_tokenizer(f.path, model.cfg.vocab)  # under the lock: no save between
        f.write(WEIGHTS, weights)
        f.write(CONFIG, (json.dumps(config, indent=2) + "\n").encode())
        if tokenizer is not None:
            tokenizer.save(f)
            for name in HF_TOKENIZER_FILES:
                f.remove(name)


def _check_old_tokenizer(folder, vocab):
    """ValueError when a tokenizer pytfm reads in folder has more tokens than vocab."""
    from .tokenizer import TokenizerError

    sources = [(("vocab.json", "merges.txt"), Tokenizer.from_files),
               (("tokenizer.json",), Tokenizer.from_tokenizer_json)]
    for names, read in sources:
        paths = [os.path.join(folder, n) for n in names]
        if not all(os.path.isfile(p) for p in paths):
            continue
        try:
            n = len(read(*paths))
        except TokenizerError:
            continue  # not a tokenizer pytfm reads: not pytfm's to judge
        if n > vocab:
            raise ValueError(f"{paths[0]}: the folder's tokenizer has {n} tokens, more than the "
                             f"model's vocabulary of {vocab}: save with tokenizer= (which "
                             f"replaces it), or into another folder")
