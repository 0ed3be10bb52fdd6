"""pytfm: a small transformer library on hand-written C kernels, bound through cffi.

    import numpy as np, pytfm
    y, mean, rstd = pytfm.ops.layernorm_forward(x, w, b)

pytfm.ops holds one function per op direction (stateless); pytfm.KVCache the keys and values
of a decoding run; pytfm.nn a GPT with hand-written backward passes (on the CPU, or on the GPU
with CuPy: pytfm.device; pytfm.train_step its GPU step with nothing allocated), trained with
pytfm.optim on pytfm.data's batches (the command line: pytfm.cli), saved and loaded by
pytfm.checkpoint, sampled by pytfm.generate, across processes with pytfm.distributed;
pytfm.interpret scores attention heads; pytfm.gpt2 reads and writes Hugging Face GPT-2 folders,
pytfm.llama the Llama family's (Llama, Qwen 2 and 3, Mistral), pytfm.folders either; pytfm.tokenizer
runs their tokenizers (byte-level and SentencePiece BPE); pytfm.reference is the float64 NumPy
oracle.

Every one of those modules is an attribute of the package after `import pytfm`; the ones not
imported below load on first use (pytfm.data, ...), so that importing pytfm stays quick. CuPy
and mpi4py are imported only when a GPU or an MPI launcher is used.
"""

import importlib

from . import device, kvcache, ops
from ._core import (
    PytfmError,
    _settings_from_environment,
    bf16_path,
    build_info,
    get_bf16_isa,
    get_isa,
    get_num_threads,
    set_max_isa,
    set_num_threads,
    version,
)
from .kvcache import KVCache

__version__ = version()
_settings_from_environment()

_ON_FIRST_USE = ("checkpoint", "cli", "data", "distributed", "folders", "generate", "gpt2",
                 "interpret", "llama", "nn", "optim", "reference", "tokenizer", "train_step")

__all__ = ["KVCache", "PytfmError", "__version__", "bf16_path", "build_info", "device",
           "get_bf16_isa", "get_isa",
           "get_num_threads", "kvcache", "ops", "set_max_isa", "set_num_threads",
           *_ON_FIRST_USE]


def __getattr__(name):  # a public module not imported yet: import it now (PEP 562)
    if name in _ON_FIRST_USE:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_ON_FIRST_USE))
