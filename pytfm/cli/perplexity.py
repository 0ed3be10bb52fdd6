"""The perplexity of a model on a text file, and its bits per byte (pytfm.perplexity).

    python -m pytfm perplexity out/model.safetensors README.md
    python -m pytfm perplexity Qwen3-0.6B wiki.test.raw --context 512 --batch 4
    python -m pytfm perplexity Qwen3-0.6B wiki.test.raw --precision bf16 --json
    python -m pytfm perplexity Qwen3-0.6B wiki.test.raw --precision int8

PATH is a pytfm checkpoint (model.safetensors, written by `python -m pytfm train`) or a Hugging
Face folder of GPT-2 or the Llama family (pytfm.folders). TEXT_FILE is read as bytes and
encoded whole: one token per byte for a byte-level checkpoint, else with the model's tokenizer,
as plain text (no BOS or other template tokens, and special tokens' names in the text are their
characters). The tokens are cut into consecutive windows of --context tokens, each run from
position 0, and every token after a window's first is predicted from those before it in its
window: docs/perplexity.md has the definition. A line of figures so far goes to stderr every
few seconds, the summary to stdout (--json: the figures as one JSON object). A bad flag, a
missing, unreadable or empty text, or one of fewer than 2 tokens stops the command with its
usage and one line naming the argument, exit status 2.
"""

import json
import math
import os
import sys
import time

import numpy as np

from .. import bf16_path
from .. import device as devices
from .. import perplexity as ppl
from . import load_model, new_parser

PROGRESS_EVERY = 2.0  # seconds between progress lines


def parser(prog=None):
    p = new_parser(__doc__.splitlines()[0], prog)
    p.add_argument("checkpoint", metavar="PATH", help="a pytfm checkpoint (model.safetensors) "
                   "or a Hugging Face folder of GPT-2 or the Llama family")
    p.add_argument("text", metavar="TEXT_FILE", help="the text, read as bytes")
    p.add_argument("--context", type=int, default=None,
                   help="tokens per window, 2 .. the model's max_seq (default: max_seq)")
    p.add_argument("--batch", type=int, default=1, help="windows per forward, >= 1")
    p.add_argument("--precision", choices=["fp32", "bf16", "int8"], default="fp32",
                   help="of the linear layers' products (bf16: BF16-rounded inputs, float32 "
                   "sums; a bfloat16 Llama-family folder is then held as it lies, in BF16; "
                   "int8: every matrix quantised to int8 blocks, for inference on the CPU)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


def read_text(p, path):
    """The bytes of the file at path; a usage error naming TEXT_FILE when it is missing,
    unreadable or empty."""
    if not os.path.exists(path):
        p.error(f"TEXT_FILE: there is no file {path}")
    if os.path.isdir(path):
        p.error(f"TEXT_FILE: {path} is a folder, not a text file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        p.error(f"TEXT_FILE: cannot read {path}: {e.strerror or e}")
    if not raw:
        p.error(f"TEXT_FILE: {path} is empty")
    return raw


def main(argv=None, prog=None):
    p = parser(prog)
    args = p.parse_args(argv)
    if args.batch < 1:
        p.error(f"--batch must be >= 1, got {args.batch}")
    if args.context is not None and args.context < 2:
        p.error(f"--context must be >= 2 (a window of one token predicts nothing), got "
                f"{args.context}")
    if args.device == "cuda" and args.precision == "int8":
        p.error("--precision int8 runs on the CPU only (int8 weights): --device cpu, or "
                "--precision fp32 or bf16 on the GPU")
    if args.device == "cuda":
        problem = devices.cuda_problem()
        if problem is not None:
            p.error(f"--device cuda: {problem} (--device cpu runs on the CPU)")
    raw = read_text(p, args.text)
    # on the GPU: loaded in float32 and moved (a model held in BF16 only runs on the CPU)
    on_cpu = args.device == "cpu"
    model, tok = load_model(p, args.checkpoint, precision=args.precision if on_cpu else "fp32")
    if not on_cpu:
        model.to(args.device).set_precision(args.precision)
    max_seq = model.cfg.max_seq
    context = max_seq if args.context is None else args.context
    if context > max_seq:
        p.error(f"--context must be at most the model's max_seq of {max_seq}, got {context}")
    if tok is None:
        ids = np.frombuffer(raw, np.uint8).astype(np.int64)
    else:  # plain text: no template (BOS), special tokens' names as text
        ids = tok.encode_array(raw, special=False, template=False)
    if len(ids) < 2:
        p.error(f"TEXT_FILE: {args.text} is {len(ids)} token{'s' * (len(ids) != 1)}, and "
                "perplexity needs at least 2 (one to predict from, one predicted)")
    if args.precision == "bf16" and on_cpu:
        print(f"precision bf16, the BF16 products' path: {bf16_path()}", file=sys.stderr)

    t0 = last = time.perf_counter()

    def progress(done, windows, nll, tokens):
        nonlocal last
        now = time.perf_counter()
        if now - last >= PROGRESS_EVERY or done == windows:
            last = now
            print(f"window {done}/{windows} | perplexity {math.exp(nll / tokens):.4f} | "
                  f"{tokens} tokens | {now - t0:.1f} s", file=sys.stderr, flush=True)

    r = ppl.perplexity(model, ids, context, args.batch, progress)
    seconds = time.perf_counter() - t0
    n_bytes = ppl.predicted_bytes(ids, context, tok)
    bpb = ppl.bits_per_byte(r["nll"], n_bytes) if n_bytes else math.nan
    if args.json:
        print(json.dumps({**r, "bits_per_byte": bpb, "bytes": n_bytes, "text_tokens": len(ids),
                          "precision": args.precision, "device": args.device,
                          "seconds": round(seconds, 3)}))
    else:
        print(f"perplexity {r['perplexity']:.4f} | bits/byte {bpb:.4f} | {r['tokens']} tokens "
              f"predicted in {r['windows']} windows of {context} | {args.precision} | "
              f"{seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
