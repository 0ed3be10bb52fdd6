"""Sample text from a checkpoint written by train_tiny.py, or from a GPT-2 folder.

    python examples/sample.py out/model.safetensors --prompt "def " --tokens 100
    python examples/sample.py gpt2 --prompt "Hello, my name is"   # a folder: greedy
    python examples/sample.py out/model.safetensors --precision bf16

The prompt is taken as the bytes the shell passed: one token per byte for a byte-level model;
a checkpoint of another vocabulary (train_tiny.py --tokenizer bpe:N) is read with the tokenizer
beside it (vocab.json and merges.txt in its folder), and a Hugging Face GPT-2 folder
(config.json, model.safetensors: pytfm.gpt2) with its own. A bad flag or a checkpoint that is
missing or unreadable stops the script with its usage and one line naming the problem, exit
status 2.
"""

import math
import os
import sys

import numpy as np
from train_tiny import SEED_MAX, new_parser  # defaults in --help, no abbreviated flags

import pytfm
from pytfm import checkpoint, data, gpt2
from pytfm.generate import generate
from pytfm.tokenizer import Tokenizer, TokenizerError


def parser():
    p = new_parser(__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a model.safetensors written by train_tiny.py, or a "
                   "GPT-2 folder (config.json, model.safetensors, its tokenizer)")
    p.add_argument("--prompt", default="def ",
                   help="text to continue, at least one byte (default: %(default)r)")
    p.add_argument("--tokens", type=int, default=100,
                   help="tokens to generate, >= 0 (cut to what the model's context leaves)")
    p.add_argument("--temperature", type=float, default=None,
                   help="finite, >= 0; 0: greedy (default 0.8; 0 on a GPT-2 folder, as "
                   "transformers' generate has it)")
    p.add_argument("--top-k", type=int, default=40, help="sample among the k likeliest; 0: all")
    p.add_argument("--seed", type=int, default=0, help=f"0 .. {SEED_MAX}")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="of the linear layers' products (bf16: BF16-rounded inputs, float32 "
                   "sums)")
    return p


def load(p, path):
    """The model in the checkpoint at path (a file, or a GPT-2 folder), a problem reported in
    one line (attention_maps.py reads its checkpoint through this too)."""
    return load_with_tokenizer(p, path, tokenizer=False)[0]


def load_with_tokenizer(p, path, tokenizer=True):
    """The model in the checkpoint at path (a file, or a GPT-2 folder) and, when tokenizer, its
    tokenizer (None for bytes), a problem reported in one line."""
    if not os.path.exists(path):
        p.error(f"checkpoint: there is no file {path}")
    folder = os.path.isdir(path)
    if folder and not os.path.isfile(os.path.join(path, gpt2.CONFIG)):
        inside = os.path.join(path, "model.safetensors")
        hint = f" (did you mean {inside}?)" if os.path.isfile(inside) else ""
        p.error(f"checkpoint: {path} is a folder without a {gpt2.CONFIG}{hint}")
    try:
        model = gpt2.load(path) if folder else checkpoint.load(path)[0]
        tok = None
        if folder and tokenizer:
            tok = gpt2.load_tokenizer(path)
        elif tokenizer and model.cfg.vocab != data.VOCAB:
            tok = beside(p, path, model.cfg.vocab)
    except (checkpoint.CheckpointError, TokenizerError) as e:  # all a malformed file can raise
        p.error(f"checkpoint: {e}")
    except MemoryError as e:
        p.error(f"checkpoint: {e}")
    except OSError as e:
        p.error(f"checkpoint: cannot read {e.filename or path}: {e.strerror or e}")
    if tok is not None and len(tok) > model.cfg.vocab:
        p.error(f"checkpoint: its tokenizer has {len(tok)} tokens, more than the model's "
                f"{model.cfg.vocab}")
    return model, tok


def beside(p, path, vocab):
    """The tokenizer in the checkpoint's folder (train_tiny.py --tokenizer bpe:N saves it there)
    of a model whose vocabulary is not the bytes; its absence reported in one line."""
    folder = os.path.dirname(os.path.abspath(path))
    if not any(os.path.exists(os.path.join(folder, n))
               for n in ("vocab.json", "merges.txt", "tokenizer.json")):
        p.error(f"checkpoint: its model has a vocabulary of {vocab} tokens, not the "
                f"{data.VOCAB} bytes sample.py encodes text into, and {folder} has no tokenizer "
                "(vocab.json + merges.txt, or tokenizer.json) for them")
    return Tokenizer.from_folder(folder)


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.tokens < 0:
        p.error(f"--tokens must be >= 0, got {args.tokens}")
    if args.temperature is None:  # greedy on a GPT-2 folder, as transformers' generate()
        args.temperature = 0.0 if os.path.isdir(args.checkpoint) else 0.8
    if not 0 <= args.temperature < math.inf:
        p.error(f"--temperature must be finite and >= 0 (0: greedy), got {args.temperature}")
    if args.top_k < 0:
        p.error(f"--top-k must be >= 0 (0: no top-k cut), got {args.top_k}")
    if not 0 <= args.seed <= SEED_MAX:
        p.error(f"--seed must be in [0, {SEED_MAX}], got {args.seed}")
    # surrogateescape: bytes of the command line that are not UTF-8 come back as they were
    raw = args.prompt.encode("utf-8", "surrogateescape")
    if not raw:
        p.error("--prompt must not be empty: generation continues at least one byte")
    model, tok = load_with_tokenizer(p, args.checkpoint)
    model.set_precision(args.precision)
    if args.precision == "bf16":
        print(f"precision bf16, the BF16 products' path: {pytfm.bf16_path()}", file=sys.stderr)
    ids = np.frombuffer(raw, np.uint8).astype(np.int64) if tok is None else tok.encode_array(raw)
    max_seq, unit = model.cfg.max_seq, "bytes" if tok is None else "tokens"
    if len(ids) > max_seq:
        p.error(f"--prompt is {len(ids)} {unit}, longer than the model's context of {max_seq}")
    n_new = min(args.tokens, max_seq - len(ids))
    if n_new < args.tokens:
        print(f"note: --tokens {args.tokens} cut to {n_new}: the model's context is {max_seq} "
              f"and the prompt takes {len(ids)}", file=sys.stderr)
    top_k = args.top_k if 0 < args.top_k < model.cfg.vocab else None
    out = generate(model, ids[None, :], n_new, args.temperature, top_k, args.seed)
    print(data.decode(out[0]) if tok is None else tok.decode(out[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
