"""pytfm.folders — a Hugging Face model folder of either family pytfm runs, whichever it is:
GPT-2's (pytfm.gpt2) or the Llama family's (pytfm.llama: Llama, Qwen 2 and 3, Mistral).

    model, tok = pytfm.folders.load_snapshot("Qwen2.5-0.5B")   # the model and its tokenizer
    pytfm.folders.save(model, "out", tok)

What the command line (sample.py, `python -m pytfm train --init-from`) opens a folder with. The
family is config.json's model_type; the family's reader (in C) then holds the folder to its
rules (pytfm_folder_arch is the rule, in C, which pytfm_model_open follows too); a folder of
another model_type is refused by the Llama family's reader, naming it.
"""

import functools
import os

from . import gpt2, llama
from ._core import ffi, lib


def family(folder):
    """The module that reads folder, by the C library's rule (pytfm_folder_arch, which
    pytfm_model_open follows too): pytfm.gpt2 when config.json's model_type is "gpt2" or
    absent (a config.json that is missing, unreadable or not a JSON object included: GPT-2's
    reader says what is wrong, in its words), else pytfm.llama, whose reader takes the Llama
    family's model_types and refuses any other by name."""
    path = os.fsencode(folder)  # a TypeError for what is no path
    if b"\0" in path:
        raise ValueError(f"folder must not contain a NUL byte, got {folder!r}")
    arch = ffi.new("int32_t *")
    lib.pytfm_folder_arch(path, arch)  # OK for every path
    return llama if arch[0] == lib.PYTFM_ARCH_LLAMA else gpt2


def read_config(folder):
    """The GPTConfig of the folder's config.json."""
    return family(folder).read_config(folder)


def load(folder, device="cpu", precision="fp32"):
    """The folder's model, a pytfm.nn.GPT on device, in precision (a bfloat16 Llama-family
    folder on the CPU in "bf16": its matrices in BF16 only, for inference; pytfm.llama.load;
    "int8", the CPU only: every matrix quantised to int8 blocks, for inference)."""
    return family(folder).load(folder, device, precision)


def load_tokenizer(folder):
    """The tokenizer beside the weights (pytfm.tokenizer.Tokenizer.from_folder)."""
    return gpt2.load_tokenizer(folder)


def load_snapshot(folder, device="cpu", precision="fp32"):
    """(model, tokenizer) of one save of the folder (gpt2.load_snapshot says how), the model in
    precision as load gives it."""
    read = functools.partial(family(folder).load, precision=precision)
    return gpt2.load_snapshot(folder, device, load=read)


def save(model, folder, tokenizer=None):
    """Write model as a Hugging Face folder of its family: a GPT with pos "learned" as GPT-2's
    (pytfm.gpt2.save), one of arch "llama" as its family's (pytfm.llama.save_model)."""
    if getattr(getattr(model, "cfg", None), "arch", None) == "llama":
        return llama.save_model(model, folder, tokenizer)
    return gpt2.save(model, folder, tokenizer)
