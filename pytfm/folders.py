"""pytfm.folders — a Hugging Face model folder of either family pytfm runs, whichever it is:
GPT-2's (pytfm.gpt2) or the Llama family's (pytfm.llama: Llama, Qwen 2 and 3, Mistral).

    model, tok = pytfm.folders.load_snapshot("Qwen2.5-0.5B")   # the model and its tokenizer
    pytfm.folders.save(model, "out", tok)

What the command line (sample.py, `python -m pytfm train --init-from`) opens a folder with. The
family is config.json's model_type; the family's reader (in C) then holds the folder to its
rules, and a folder of neither family is refused by GPT-2's, naming the field.
"""

import json
import os

from . import gpt2, llama

LLAMA_TYPES = ("llama", "qwen2", "qwen3", "mistral")
MAX_CONFIG = 16 << 20  # the readers' own limit on config.json


def family(folder):
    """The module that reads folder: pytfm.gpt2 when config.json's model_type is "gpt2" or
    absent (a config.json that is missing, unreadable or not a JSON object included: GPT-2's
    reader says what is wrong, in its words), else pytfm.llama, whose reader takes LLAMA_TYPES
    and refuses any other model_type by name."""
    try:
        with open(os.path.join(folder, gpt2.CONFIG), "rb") as f:
            doc = json.loads(f.read(MAX_CONFIG))
    except (OSError, ValueError, TypeError):
        return gpt2
    kind = doc.get("model_type", "gpt2") if isinstance(doc, dict) else "gpt2"
    return gpt2 if kind == "gpt2" else llama


def read_config(folder):
    """The GPTConfig of the folder's config.json."""
    return family(folder).read_config(folder)


def load(folder, device="cpu"):
    """The folder's model, a pytfm.nn.GPT on device."""
    return family(folder).load(folder, device)


def load_tokenizer(folder):
    """The tokenizer beside the weights (pytfm.tokenizer.Tokenizer.from_folder)."""
    return gpt2.load_tokenizer(folder)


def load_snapshot(folder, device="cpu"):
    """(model, tokenizer) of one save of the folder (gpt2.load_snapshot says how)."""
    return gpt2.load_snapshot(folder, device, load=family(folder).load)


def save(model, folder, tokenizer=None):
    """Write model as a Hugging Face folder of its family: a GPT with pos "learned" as GPT-2's
    (pytfm.gpt2.save), one of arch "llama" as its family's (pytfm.llama.save_model)."""
    if getattr(getattr(model, "cfg", None), "arch", None) == "llama":
        return llama.save_model(model, folder, tokenizer)
    return gpt2.save(model, folder, tokenizer)
