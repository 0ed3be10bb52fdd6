"""pytfm.llama — the Llama family in the layout it is published in: Hugging Face folders of
LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and MistralForCausalLM, in and out.

    cfg = pytfm.llama.read_config("Qwen2.5-0.5B")      # config.json -> GPTConfig(arch="llama")
    cfg, params = pytfm.llama.read_params("Qwen2.5-0.5B")   # {name: float32 array}
    model = pytfm.llama.load("Qwen2.5-0.5B")           # pytfm.nn.GPT with the weights in
    pytfm.llama.save("out", cfg, params, dtype="bfloat16")

The folder is read by the C library's Llama-family reader (pytfm_llama_* in pytfm_model.h,
where its rules are written down: one home); this module maps what it returns to NumPy. In
short: config.json is strict JSON with model_type llama, qwen2, qwen3 or mistral (and
architectures, if there, its XForCausalLM); the sizes must be there; the fields that change the
forward pass take transformers' defaults where absent and must have a value pytfm runs
(hidden_act silu, no o_proj or MLP biases, pretraining_tp 1, RoPE default or llama3, one kind of
attention in every layer); the fields in IGNORED and any whose name starts with "_" are
ignored; any other field is refused by name. The weights: every parameter under transformers'
name, float32, bfloat16 or float16 (converted to float32 exactly), of the shape the config
implies; a tied model's lm_head.weight may be there (equal to the embedding) and the rotary
inv_freq buffers too; anything else is refused. All of it is checked from the headers before
anything large is allocated. Every problem is a CheckpointError (a ValueError) naming the file
and the field or tensor, or an OSError from the file system.

pytfm's names of a Llama-family model's parameters are transformers' (pytfm_model_param), so
the params dict maps each name of config.json's model to its array, as stored.
"""

import json
import os

import numpy as np

from . import _atomic
from ._core import MODEL_PRECISIONS, check, ffi, lib, precision_code
from .checkpoint import CheckpointError
from .gpt2 import _cpu_only, _json_text, check_memory, memory_plan
from .gpt2 import _Folder as gpt2_folder
from .nn import GPT, GPTConfig, config_from_c, param_shapes

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
DTYPES = ("float32", "bfloat16")  # what save writes


def _ignored():
    names, i = [], 0
    while (name := lib.pytfm_llama_ignored_field(i)) != ffi.NULL:
        names.append(ffi.string(name).decode("ascii"))
        i += 1
    return frozenset(names)


# config.json fields that do not change the forward pass: ignored (pytfm_llama_ignored_field)
IGNORED = _ignored()


def _check(status):
    check(status, CheckpointError)  # the C reader's messages name the file


def read_config(folder):
    """The GPTConfig (arch "llama", seed 0) of the folder's config.json, checked by the C reader
    (pytfm_llama_read_config) as the module says."""
    c = ffi.new("pytfm_model_config *")
    _check(lib.pytfm_llama_read_config(c, os.fsencode(folder)))
    return config_from_c(c)


def config_from_dict(c, path=CONFIG):
    """A config.json's dict -> GPTConfig, or CheckpointError naming path (the C reader's rules,
    on json.dumps(c))."""
    try:
        raw = _json_text(c).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: not a JSON value ({e})") from None
    out = ffi.new("pytfm_model_config *")
    _check(lib.pytfm_llama_config_parse(out, raw, len(raw), os.fsencode(path)))
    return config_from_c(out)


def _Folder(folder):
    """The folder open in the C reader pytfm_llama_* (gpt2._Folder, the one wrapper of both
    families' readers)."""
    return gpt2_folder(folder, "llama", config_from_c)


def read_params(folder):
    """(GPTConfig, {name: float32 array}) of the folder: every parameter, in
    pytfm.nn.param_shapes order, views into one buffer."""
    with _Folder(folder) as f:
        params = memory_plan(f.cfg, optimizer=False)["params"]
        check_memory({"params": params, "total": params}, f"the parameters in {folder}")
        return f.cfg, f.read()


def load(folder, device="cpu", precision="fp32"):
    """The model in a Llama-family folder as a pytfm.nn.GPT on device, in precision. A folder
    whose matrices are all bfloat16, loaded on the CPU in precision "bf16", is held as the file
    holds it, for inference: its matrices in BF16 only (GPT.keep_bf16: 2 bytes a value, no
    gradients), read as they lie (pytfm_llama_read_bf16: no float32 copy is ever made), as the
    C model opens such a folder. Any other load has float32 parameters (in "bf16", the products
    round them); so does fine-tuning, which loads in "fp32" and calls set_precision("bf16")
    (what `python -m pytfm train --precision bf16` does). Everything is checked, and the memory
    the model needs compared with what is available, before the model is allocated.

    "int8" (the CPU only): every matrix quantised (GPT.set_precision("int8")), from the BF16
    values a bfloat16 folder holds (kept as above first, no float32 copy), else from the
    float32 values read, which are quantised as they lie (the model's own float32 pages never
    written), as the C model quantises the same folder."""
    from . import device as devices

    precision_code(precision, choices=MODEL_PRECISIONS)  # a bad name fails here
    _cpu_only(precision, device)
    devices.array_module(device)
    with _Folder(folder) as f:
        all16, n16 = ffi.new("int32_t *"), ffi.new("int64_t *")
        _check(lib.pytfm_llama_bf16_matrices(f._g, all16, n16))
        keep = device == "cpu" and precision in ("bf16", "int8") and bool(all16[0])
        check_memory(memory_plan(f.cfg, optimizer=False, bf16=keep), f"the model in {folder}")
        model = GPT(f.cfg, device, "fp32" if keep or precision == "int8" else precision,
                    init=False)
        if not keep and precision == "int8":
            return model._quantise(f.read())
        if not keep:
            model.params.copy_from(f.read())
            return model
        bits = np.empty(n16[0], np.uint16)
        vectors = np.empty(f.n_params - n16[0], np.float32)
        _check(lib.pytfm_llama_read_bf16(f._g, ffi.from_buffer("uint16_t[]", bits, True),
                                         bits.size, ffi.from_buffer("float[]", vectors, True),
                                         vectors.size))
        model._keep(bits, vectors)
    return model.set_precision(precision)  # "int8": quantised from the BF16 bits


# ---- save --------------------------------------------------------------------------------------


def family(cfg):
    """The transformers family that holds cfg: qk_norm -> "qwen3", qkv_bias -> "qwen2", a
    sliding window -> "mistral", else "llama". ValueError for a config none of them holds
    (q/k norm with biases)."""
    if cfg.qk_norm and cfg.qkv_bias:
        raise ValueError("no transformers family has both q/k norm (Qwen 3) and q, k, v biases "
                         "(Qwen 2): cannot save this config")
    return "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else (
        "mistral" if cfg.sliding_window else "llama")


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}


def _number(x):  # a float that is an integer as an int (original_max_position_embeddings)
    return int(x) if float(x).is_integer() else x


def hf_config(cfg, dtype="float32"):
    """config.json's dict for a GPTConfig with arch "llama", in its family's fields (family),
    RoPE as rope_theta and rope_scaling (which transformers 4 and 5 both read)."""
    if not isinstance(cfg, GPTConfig) or cfg.arch != "llama":
        raise ValueError(f"cfg must be a pytfm.nn.GPTConfig with arch 'llama', got {cfg!r}")
    fam = family(cfg)
    scaling = None
    if cfg.rope_scaling == "llama3":
        scaling = {"rope_type": "llama3", "factor": cfg.rope_factor,
                   "low_freq_factor": cfg.rope_low_freq_factor,
                   "high_freq_factor": cfg.rope_high_freq_factor,
                   "original_max_position_embeddings": _number(cfg.rope_original_max_pos)}
    c = {"architectures": [_ARCHITECTURES[fam]], "model_type": fam,
         "vocab_size": cfg.vocab, "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
         "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
         "num_key_value_heads": cfg.n_kv_head, "head_dim": cfg.head_dim,
         "max_position_embeddings": cfg.max_seq, "rms_norm_eps": cfg.norm_eps,
         "hidden_act": "silu", "rope_theta": cfg.rope_theta, "rope_scaling": scaling,
         "tie_word_embeddings": cfg.tie_embeddings, "attention_dropout": 0.0,
         "initializer_range": 0.02, "use_cache": True, "torch_dtype": dtype}
    if fam == "llama":
        c.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    elif fam == "qwen3":
        c["attention_bias"] = False
    if fam in ("qwen2", "qwen3"):
        window = cfg.sliding_window or None
        c.update(use_sliding_window=window is not None, sliding_window=window,
                 max_window_layers=0 if window else cfg.n_layer,
                 layer_types=[("sliding" if window else "full") + "_attention"] * cfg.n_layer)
    elif fam == "mistral":
        c["sliding_window"] = cfg.sliding_window
    return c


def _bf16(a):
    """float32 array -> its bfloat16 bits (uint16), rounded to nearest even as torch rounds;
    NaN stays NaN."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)  # quiet, sign kept
    return rounded


def _safetensors(tensors, dtype):
    """The chunks of a safetensors file of {name: float32 array} stored as dtype (F32 or BF16),
    metadata format "pt" (what transformers writes)."""
    code = {"float32": "F32", "bfloat16": "BF16"}[dtype]
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, a in tensors.items():
        a = np.asarray(a, np.float32)
        blob = (_bf16(a) if dtype == "bfloat16" else a).astype(
            "<u2" if dtype == "bfloat16" else "<f4", copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)  # align the data to 8 bytes
    return [len(head).to_bytes(8, "little") + head, *blobs]


# The tokenizer files of a folder: a tokenizer opened from a tokenizer.json is saved as that
# file with the ones beside it that transformers' AutoTokenizer reads with it
JSON_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "added_tokens.json")
GPT2_TOKENIZER_FILES = ("vocab.json", "merges.txt")


def _write_tokenizer(f, tokenizer):
    """tokenizer's files into the open _atomic.Folder f, the folder's other tokenizer files
    removed (they would describe another tokenizer)."""
    source = getattr(tokenizer, "_json", None)
    if source is None:  # GPT-2's files (a tokenizer pytfm trained, or read from them)
        tokenizer.save(f)
        for name in JSON_TOKENIZER_FILES:
            f.remove(name)
        return
    where = os.path.dirname(source)
    for name in JSON_TOKENIZER_FILES:
        path = source if name == "tokenizer.json" else os.path.join(where, name)
        if os.path.isfile(path):
            with open(path, "rb") as src:
                f.write(name, src.read())
        else:
            f.remove(name)
    for name in GPT2_TOKENIZER_FILES:
        f.remove(name)


def save_model(model, folder, tokenizer=None, dtype="float32"):
    """save() of a pytfm.nn.GPT of arch "llama", with its tokenizer beside it when given (one
    opened from a tokenizer.json as that file and the JSON_TOKENIZER_FILES beside it, copied;
    else GPT-2's vocab.json and merges.txt), the folder's other tokenizer files removed so that
    its one tokenizer is the saved one. Without a tokenizer the folder's is kept."""
    from .tokenizer import Tokenizer

    if not isinstance(model, GPT):
        raise TypeError(f"model must be a pytfm.nn.GPT, got {type(model).__name__}")
    if tokenizer is not None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer must be a pytfm.tokenizer.Tokenizer, got "
                            f"{type(tokenizer).__name__}")
        if len(tokenizer) > model.cfg.vocab:
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, more than the model's "
                             f"vocabulary of {model.cfg.vocab}")
    save(folder, model.cfg, model.params, dtype, tokenizer=tokenizer)


def save(folder, cfg, params, dtype="float32", tokenizer=None):
    """Write cfg (arch "llama") and params ({name: array} of exactly param_shapes(cfg)'s names
    and shapes, any float dtype, NumPy or CuPy, or a model's FlatDict) as a Hugging Face folder
    of its family (family(cfg)): config.json and model.safetensors in dtype, "float32" or
    "bfloat16" (rounded to nearest even), without lm_head.weight when tied.
    transformers.AutoModelForCausalLM.from_pretrained(folder) reads it. The folder is replaced as
    a whole (pytfm._atomic.Folder; its other files are kept). tokenizer: see save_model.
    ValueError, before anything is written, for a missing, extra or misshapen parameter."""
    from . import device as devices

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    config = hf_config(cfg, dtype)
    shapes = dict(param_shapes(cfg))
    names = set(params.keys())
    if names != set(shapes):
        missing, extra = sorted(set(shapes) - names), sorted(names - set(shapes))
        raise ValueError(f"params must hold exactly the config's parameters: missing "
                         f"{missing[:3]}, unexpected {extra[:3]}")
    tensors = {}
    for name, shape in shapes.items():
        a = np.asarray(devices.to_host(params[name]), np.float32)
        if a.shape != shape:
            raise ValueError(f"params[{name!r}] has shape {a.shape}, the config needs {shape}")
        tensors[name] = a
    with _atomic.Folder(folder) as f:
        f.write(WEIGHTS, _safetensors(tensors, dtype))
        f.write(CONFIG, (json.dumps(config, indent=2) + "\n").encode())
        if tokenizer is not None:
            _write_tokenizer(f, tokenizer)
