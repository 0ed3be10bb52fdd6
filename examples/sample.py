"""Sample text from a checkpoint written by train_tiny.py, or from a GPT-2 folder.

    python examples/sample.py out/model.safetensors --prompt "def " --tokens 100
    python examples/sample.py gpt2 --prompt "Hello, my name is"   # a folder: greedy
    python examples/sample.py out/model.safetensors --precision bf16
    python examples/sample.py out/model.safetensors --precision int8   # int8 weights

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

import pytfm
from pytfm import data
from pytfm.cli import SEED_MAX, load_model, new_parser
from pytfm.generate import generate


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
    p.add_argument("--precision", choices=["fp32", "bf16", "int8"], default="fp32",
                   help="of the linear layers' products (bf16: BF16-rounded inputs, float32 "
                   "sums; a bfloat16 Llama-family folder is then held as it lies, in BF16; "
                   "int8: every matrix quantised to int8 blocks, for inference on the CPU)")
    p.add_argument("--kv-cache", choices=["fp32", "bf16"], default="fp32",
                   help="the KV cache's precision (bf16: keys and values rounded to BF16 as "
                   "they are cached, half the cache's memory; CPU only)")
    return p


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
    model, tok = load_model(p, args.checkpoint, precision=args.precision)
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
    # ids past the tokenizer's (a vocabulary padded to a multiple of 64) are never drawn
    vocab = model.cfg.vocab if tok is None else len(tok)
    top_k = args.top_k if 0 < args.top_k < vocab else None
    out = generate(model, ids[None, :], n_new, args.temperature, top_k, args.seed, vocab,
                   kv_cache=args.kv_cache)
    print(data.decode(out[0]) if tok is None else tok.decode(out[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
