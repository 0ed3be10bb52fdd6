"""pytfm's command line: `python -m pytfm train` (pytfm.cli.train), and what the examples'
parsers share: --help with the defaults, no abbreviated flags, an --out folder made or refused
in one line, a checkpoint or Hugging Face folder (GPT-2's or the Llama family's) read with its
tokenizer, a problem said in one line."""

import argparse
import os

from .. import checkpoint, data, folders, gpt2
from ..tokenizer import Tokenizer, TokenizerError

SEED_MAX = 2**32 - 1  # as numpy.random.seed and most twins take


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default, where there is one to show (not None, not False)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def new_parser(description, prog=None):
    """A command's parser: defaults in --help, and no abbreviations (argparse would otherwise
    take --step 10 for --steps 10). prog: the name its usage and errors show (default: the
    script's file name)."""
    return argparse.ArgumentParser(prog=prog, description=description,
                                   formatter_class=HelpFormatter, allow_abbrev=False)


def check_out_path(p, out):
    """A usage error when the --out path is empty or names something that is not a folder."""
    if not out:
        p.error("--out: the path is empty")
    if os.path.exists(out) and not os.path.isdir(out):
        p.error(f"--out: {out} exists and is not a folder")


def make_out_folder(p, out):
    """The folder --out names, made if it is missing; a usage error when the path is empty,
    names a file, or cannot be made."""
    check_out_path(p, out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        p.error(f"--out: cannot create the folder {out}: {e.strerror or e}")


def load_model(p, path, tokenizer=True, precision="fp32"):
    """The model in the checkpoint at path (a pytfm checkpoint file, or a Hugging Face folder
    of GPT-2 or the Llama family: pytfm.folders) and, when tokenizer, its tokenizer (None for
    bytes), a problem reported in one line, in precision (a bfloat16 Llama-family folder in
    "bf16": held as the file holds it, for inference; pytfm.llama.load; "int8": every matrix
    quantised, for inference, GPT.set_precision("int8"), a matrix it refuses reported as
    --precision's problem)."""
    if not os.path.exists(path):
        p.error(f"checkpoint: there is no file {path}")
    folder = os.path.isdir(path)
    if folder and not os.path.isfile(os.path.join(path, gpt2.CONFIG)):
        inside = os.path.join(path, "model.safetensors")
        hint = f" (did you mean {inside}?)" if os.path.isfile(inside) else ""
        p.error(f"checkpoint: {path} is a folder without a {gpt2.CONFIG}{hint}")
    try:
        tok = None
        if folder and tokenizer:  # the model and tokenizer of one save
            model, tok = folders.load_snapshot(path, precision=precision)
        elif folder:
            model = folders.load(path, precision=precision)
        else:
            model = checkpoint.load(path)[0].set_precision(precision)
        if not folder and tokenizer and model.cfg.vocab != data.VOCAB:
            tok = tokenizer_beside(p, path, model.cfg.vocab)
    except (checkpoint.CheckpointError, TokenizerError) as e:  # all a malformed file can raise
        p.error(f"checkpoint: {e}")
    except MemoryError as e:
        p.error(f"checkpoint: {e}")
    except ValueError as e:  # what int8 refuses (a matrix not in whole blocks); else a bug
        if precision != "int8":
            raise
        p.error(f"--precision int8: {e}")
    except OSError as e:
        p.error(f"checkpoint: cannot read {e.filename or path}: {e.strerror or e}")
    if tok is not None and len(tok) > model.cfg.vocab:
        p.error(f"checkpoint: its tokenizer has {len(tok)} tokens, more than the model's "
                f"{model.cfg.vocab}")
    return model, tok


def tokenizer_beside(p, path, vocab):
    """The tokenizer in the checkpoint's folder (`train --tokenizer bpe:N` saves it there) of a
    model whose vocabulary is not the bytes; its absence reported in one line."""
    folder = os.path.dirname(os.path.abspath(path))
    try:  # the folder rule is the library's (pytfm_tokenizer_open_folder)
        return Tokenizer.from_folder(folder)
    except FileNotFoundError as e:
        p.error(f"checkpoint: its model has a vocabulary of {vocab} tokens, not the "
                f"{data.VOCAB} bytes sample.py encodes text into, and {e.strerror}")
