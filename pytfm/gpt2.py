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

config.json, read strictly (the C library's JSON check first): vocab_size, n_positions,
n_embd, n_layer and n_head must be there (positive ints; n_ctx, if there, equal to
n_positions). A field that would change the maths must have GPT-2's value, else the folder is
refused naming it: activation_function gelu_new (or gelu_pytorch_tanh, the same function),
n_inner null or 4·n_embd, layer_norm_epsilon 1e-5, scale_attn_weights true,
scale_attn_by_inverse_layer_idx false, add_cross_attention false, pruned_heads empty,
model_type gpt2; tie_word_embeddings true, or false with an lm_head.weight stored. The fields
in IGNORED (dropout, initialisation, the heads of other tasks, generation defaults, labels,
token ids, bookkeeping) and any whose name starts with "_" are ignored: none changes the
forward pass. Any other field is refused: pytfm cannot know what it does.

model.safetensors, through the C reader (its header checked before any data is read): the
tensors named as GPT2LMHeadModel names them (transformer.h.0.attn.c_attn.weight, ...) or as
GPT2Model does (h.0.attn.c_attn.weight, ...), one layout per folder; each float32, of the shape
the config implies; nothing missing. By rule: the buffers h.N.attn.bias (the causal mask
[1, 1, n_positions, n_positions]) and h.N.attn.masked_bias (a scalar) may be there and are not
read (transformers rebuilds them too); a tied model's lm_head.weight may be there and must then
equal the embedding, bit for bit; any other tensor is refused. F16 and BF16 files are refused
by the reader (it takes F32 and I64 tensors). All of that is checked before the model is
allocated, and the memory the model takes (its parameters and their gradients) is compared with
what the machine has: a folder claiming a million layers fails at once, naming the file.

Every problem is a CheckpointError (a ValueError) naming the file, or an OSError from the file
system; a tokenizer's, a TokenizerError naming its file.
"""

import json
import math
import os

import numpy as np

from .checkpoint import CheckpointError, SafetensorsFile, json_error, save_file
from .device import available_memory  # memory_plan's default; tests patch it here
from .nn import GPT, GPTConfig
from .tokenizer import Tokenizer

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
MAX_CONFIG = 1 << 24  # bytes of a config.json or an index, at most

# config.json fields that do not change the forward pass: ignored
IGNORED = frozenset({
    "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout",  # dropout
    "initializer_range",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_hidden_size",  # GPT2DoubleHeadsModel's head
    "use_cache", "task_specific_params", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "num_beam_groups", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "diversity_penalty", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens",  # generation defaults
    "architectures", "finetuning_task", "id2label", "label2id", "num_labels", "problem_type",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "tokenizer_class", "prefix",
    "transformers_version", "torch_dtype", "dtype", "output_attentions", "output_hidden_states",
    "return_dict", "torchscript", "use_bfloat16", "chunk_size_feed_forward", "is_decoder",
    "is_encoder_decoder", "tie_encoder_decoder", "cross_attention_hidden_size",
    "reorder_and_upcast_attn",  # the order of float32 operations within attention
})
_SIZES = {"vocab_size": "vocab", "n_positions": "max_seq", "n_embd": "d_model",
          "n_layer": "n_layer", "n_head": "n_head"}
_GELU = ("gelu_new", "gelu_pytorch_tanh")
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _read_json(path, what):
    """A JSON file of at most MAX_CONFIG bytes, checked strictly (pytfm_json_check) ->
    its value."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        # read(n) allocates n bytes first: the file's size (+1 to see it grow), within the limit
        raw = f.read(min(size, MAX_CONFIG) + 1) if size <= MAX_CONFIG else b""
    if size > MAX_CONFIG or len(raw) > MAX_CONFIG:
        raise CheckpointError(f"{path}: {what} of more than {MAX_CONFIG:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 (byte {e.start}: {e.reason})") from None
    why = json_error(text)
    if why is not None:
        raise CheckpointError(f"{path}: {why}")
    return json.loads(text)


def read_config(folder):
    """The GPTConfig (pos="learned", seed 0) of the folder's config.json, checked as the
    module says."""
    path = os.path.join(folder, CONFIG)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing (a GPT-2 folder holds config.json)")
    c = _read_json(path, "a config")
    if not isinstance(c, dict):
        raise CheckpointError(f"{path}: a JSON {type(c).__name__}, not an object")
    return config_from_dict(c, path)


def config_from_dict(c, path=CONFIG):
    """GPT2Config's dict (config.json's object) -> GPTConfig, or CheckpointError naming path."""
    def bad(what):
        raise CheckpointError(f"{path}: {what}")

    sizes = {}
    for key, field in _SIZES.items():
        if key not in c:
            bad(f"has no {key}")
        v = c[key]
        if type(v) is not int or not 1 <= v < 2**63:
            bad(f"{key} must be a positive int, got {v!r}")
        sizes[field] = v
    if "n_ctx" in c and c["n_ctx"] != c["n_positions"]:
        bad(f"n_ctx ({c['n_ctx']!r}) and n_positions ({c['n_positions']}) disagree")
    maths = {  # field: (the value that GPT-2 has (a default when absent), what is allowed)
        "activation_function": ("gelu_new", lambda v: v in _GELU),
        "n_inner": (None, lambda v: v is None or (type(v) is int and v == 4 * c["n_embd"])),
        "layer_norm_epsilon": (1e-5, lambda v: type(v) in (int, float) and v == 1e-5),
        "scale_attn_weights": (True, lambda v: v is True),
        "scale_attn_by_inverse_layer_idx": (False, lambda v: v is False),
        "add_cross_attention": (False, lambda v: v is False),
        "pruned_heads": ({}, lambda v: v == {} or v is None),
        "model_type": ("gpt2", lambda v: v == "gpt2"),
        "tie_word_embeddings": (True, lambda v: type(v) is bool),
    }
    for key, (default, ok) in maths.items():
        if key in c and not ok(c[key]):
            bad(f"{key} is {c[key]!r}: pytfm runs GPT-2's {default!r} only"
                + (" (or false, with lm_head.weight stored)" if key == "tie_word_embeddings"
                   else ""))
    unknown = sorted(k for k in c if k not in IGNORED and k not in maths and k not in _SIZES
                     and k != "n_ctx" and not k.startswith("_"))
    if unknown:
        bad(f"unknown field {unknown[0]!r}: pytfm cannot tell whether it changes the model "
            f"(it ignores only the fields pytfm.gpt2.IGNORED lists)")
    try:
        return GPTConfig(**sizes, pos="learned", tie_embeddings=c.get("tie_word_embeddings", True))
    except (TypeError, ValueError) as e:
        bad(str(e))


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
    GPT2LMHeadModel's names, lazily (a config of a million layers costs nothing until a name
    is missing)."""
    from .nn import param_shapes

    for name, shape in param_shapes(cfg):
        conv = name.endswith(_CONV1D) and name.startswith("transformer.h.")
        yield name, tuple(reversed(shape)) if conv else shape, conv


def _weight_files(folder):
    """[(path of a safetensors file, the tensor names the index puts in it, or None)]."""
    single, index = os.path.join(folder, WEIGHTS), os.path.join(folder, INDEX)
    if os.path.isfile(single):
        return [(single, None)]
    if not os.path.isfile(index):
        found = [n for n in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")
                 if os.path.exists(os.path.join(folder, n))]
        hint = f" (it has {found[0]}: pytfm reads safetensors only)" if found else ""
        raise CheckpointError(f"{single}: missing, and no {INDEX} either{hint}")
    doc = _read_json(index, "an index")
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise CheckpointError(f"{index}: needs a weight_map {{tensor name: file name}}")
    files = {}
    for name, file in wmap.items():
        if file != os.path.basename(file) or file in ("", ".", "..") or \
                not file.endswith(".safetensors"):
            raise CheckpointError(f"{index}: {name} is in {file!r}, not a .safetensors file "
                                  "of the folder")
        files.setdefault(file, set()).add(name)
    return [(os.path.join(folder, f), names) for f, names in sorted(files.items())]


class _Weights:
    """The folder's safetensors files, open and checked against cfg (the module's rules):
    .where {pytfm name: (file, stored name)}, .lm_head (file, name) of a tied model's stored
    head or None."""

    def __init__(self, folder, cfg):
        self.files, self.cfg = [], cfg
        try:
            self._open(folder)
            self._check()
        except BaseException:
            self.close()
            raise

    def _open(self, folder):
        self.entries = {}  # stored name -> (file, dtype, shape)
        for path, names in _weight_files(folder):
            f = SafetensorsFile(path)
            self.files.append(f)
            for name, (dtype, shape) in f.tensors.items():
                if name in self.entries:
                    raise CheckpointError(f"{path}: tensor {name} is also in "
                                          f"{self.entries[name][0].path}")
                if names is not None and name not in names:
                    raise CheckpointError(f"{path}: holds {name}, which {INDEX} does not put "
                                          "there")
                self.entries[name] = (f, dtype, shape)
            if names is not None and not names <= set(f.tensors):
                missing = sorted(names - set(f.tensors))[0]
                raise CheckpointError(f"{path}: {INDEX} puts {missing} there, but it is not")
        self.source = self.files[0].path if len(self.files) == 1 else os.path.join(folder, INDEX)

    def _fail(self, what):
        raise CheckpointError(f"{self.source}: {what}")

    def _check(self):
        cfg, entries = self.cfg, self.entries
        prefix = "transformer." if any(n.startswith("transformer.") for n in entries) else ""
        self.where, used = {}, set()
        for name, shape, conv in _hf_shapes(cfg):
            if name == "lm_head.weight":
                stored = name
            else:
                stored = prefix + name[len("transformer."):]
            if stored not in entries:
                self._fail(f"tensor {stored} is missing: config.json's "
                           f"{dict(n_layer=cfg.n_layer, n_embd=cfg.d_model)} needs float32"
                           f"{list(shape)}")
            self._expect(stored, shape)
            self.where[name] = (entries[stored][0], stored, conv)
            used.add(stored)
        P, self.lm_head = cfg.max_seq, None
        for stored in entries:
            if stored in used:
                continue
            rest = stored[len(prefix):] if stored.startswith(prefix) else None
            layer = rest.split(".")[1] if rest and rest.startswith("h.") else None
            if rest is not None and layer is not None and layer.isdigit() and \
                    int(layer) < cfg.n_layer and rest == f"h.{int(layer)}.attn.bias":
                self._expect(stored, (1, 1, P, P))
            elif rest is not None and layer is not None and layer.isdigit() and \
                    int(layer) < cfg.n_layer and rest == f"h.{int(layer)}.attn.masked_bias":
                self._expect(stored, ())
            elif stored == "lm_head.weight" and cfg.tie_embeddings:
                self._expect(stored, (cfg.vocab, cfg.d_model))
                self.lm_head = (entries[stored][0], stored)
            else:
                self._fail(f"unexpected tensor {stored} (for a {cfg.n_layer}-layer GPT-2, "
                           f"names {prefix or 'without a prefix, '}h.N..., "
                           f"{'lm_head.weight' if not cfg.tie_embeddings else 'tied'})")

    def _expect(self, stored, shape):
        _, dtype, got = self.entries[stored]
        if dtype != np.float32 or got != tuple(shape):
            self._fail(f"{stored} is {dtype}{list(got)}, config.json needs float32{list(shape)}")

    def read_into(self, model):
        """Copy every parameter into model (transposing the Conv1D weights), then check a
        tied model's stored head against its embedding."""
        for name, (f, stored, conv) in self.where.items():
            a = f.read(stored)
            model.params[name] = a.T if conv else a
        if self.lm_head is not None:
            f, stored = self.lm_head
            head = f.read(stored)
            wte = np.asarray(_host(model.params["transformer.wte.weight"]))
            if not np.array_equal(head, wte):
                raise CheckpointError(f"{f.path}: lm_head.weight differs from the embedding, but "
                                      "config.json ties them (tie_word_embeddings)")

    def close(self):
        for f in self.files:
            f.close()


def _host(a):
    from . import device as devices

    return devices.to_host(a)


# ---- memory ------------------------------------------------------------------------------------


def memory_plan(cfg, batch=None, context=None, optimizer=True):
    """{what: bytes} a GPT of cfg takes in float32: "params", "grads" (GPT allocates both),
    "adamw" (its two moments, when optimizer), and with batch and context, "activations": what
    a training step keeps for its backward, per layer 16·d_model floats per token (the block's
    input, both LayerNorms' outputs, q, k, v, attention's output, the residual, the MLP's
    pre-activation and its GELU, 4·d_model each), and for the head its LayerNorm's input and
    output and the logits twice (themselves and their gradient), plus the first layer's
    gradients in flight. "total" sums them."""
    from .nn import param_shapes

    n = sum(math.prod(s) for _, s in param_shapes(cfg))
    plan = {"params": 4 * n, "grads": 4 * n}
    if optimizer:
        plan["adamw"] = 8 * n
    if batch is not None:
        N, C = batch * (context or cfg.max_seq), cfg.d_model
        plan["activations"] = 4 * N * (16 * C * cfg.n_layer + 3 * C + 2 * cfg.vocab + 8 * C)
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


def load(folder, device="cpu"):
    """The GPT-2 in a Hugging Face folder (config.json + model.safetensors) as a pytfm GPT
    (pos="learned") on device. Everything is checked, and the memory the model needs compared
    with what is available, before the model is allocated."""
    from . import device as devices

    devices.array_module(device)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: not a folder (a GPT-2 folder holds {CONFIG} and "
                              f"{WEIGHTS})")
    cfg = read_config(folder)
    weights = _Weights(folder, cfg)
    try:
        check_memory(memory_plan(cfg, optimizer=False), f"the GPT-2 in {folder}")
        model = GPT(cfg, device)
        weights.read_into(model)
    finally:
        weights.close()
    return model


def load_tokenizer(folder):
    """The tokenizer beside the weights (pytfm.tokenizer.Tokenizer.from_folder)."""
    return Tokenizer.from_folder(folder)


def save(model, folder, tokenizer=None):
    """Write model (a GPT with pos="learned") as a Hugging Face GPT-2 folder (made if missing):
    config.json, model.safetensors (GPT2LMHeadModel's names, the Conv1D weights [in, out], no
    lm_head.weight when tied, metadata format "pt"), and, given a tokenizer, vocab.json and
    merges.txt. transformers.GPT2LMHeadModel.from_pretrained(folder) reads it. Each file is
    written atomically (the folder as a whole is not)."""
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
    os.makedirs(folder, exist_ok=True)
    params = model.params.to("cpu")
    tensors = {}
    for name, _, conv in _hf_shapes(model.cfg):
        a = params[name]
        tensors[name] = np.ascontiguousarray(a.T) if conv else a
    save_file(os.path.join(folder, WEIGHTS), tensors, {"format": "pt"})
    from .tokenizer import _write_text

    _write_text(os.path.join(folder, CONFIG), json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(folder)
