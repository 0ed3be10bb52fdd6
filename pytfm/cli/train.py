"""Train a small byte-level GPT with pytfm's kernels and hand-written backprop, then sample.

    python -m pytfm train                       # 0.83M parameters, context 128, < 1 min on 2 cores
    python -m pytfm train --steps 1000 --text my.txt --out run1
    python -m pytfm train --out run1 --resume  # continue an interrupted run
    python -m pytfm train --force              # train anew over out/
    python -m pytfm train --device cuda        # on the GPU (CuPy, CUDA build)
    python -m pytfm train --precision bf16     # BF16 products, FP32 state
    mpiexec -n 2 python -m pytfm train         # two processes (pytfm[mpi])
    python -m pytfm train --tokenizer bpe:4096 # GPT-2's BPE, trained on the text
    python -m pytfm train --init-from gpt2 --text my.txt --lr 3e-4   # fine-tune GPT-2

examples/train_tiny.py is this command, flag for flag and bit for bit: it makes the calls of
main() below (the model, the optimizer, the batches, the loop, the sample), written out to read,
inside the same session(), which holds everything around them (the flags and their checks, the
text, the tokenizer, resume, MPI, the progress lines, validation, checkpoints, Ctrl-C, loss.csv
and loss.png).

With no --text it learns from the Python standard library's own source files, which every
machine has. It prints a progress line every --log-every steps and the validation loss every
--eval-every, writes OUT/model.safetensors (the checkpoint, also at each evaluation), OUT/loss.csv
and, when matplotlib is installed, OUT/loss.png; at the end it samples --sample-tokens bytes
after --prompt. Ctrl-C saves a resumable checkpoint and exits; a loss or a gradient that turns
NaN or inf stops the run with the step it happened at, and leaves the last good checkpoint as it
was. Every flag and path is checked before training (--out by creating it and writing a test
file): a bad one stops the script with its usage and one line naming the flag, exit status 2.
So does an OUT/model.safetensors that a run would replace, unless --resume continues it or
--force replaces it. Sample from a checkpoint later with examples/sample.py.

By default the tokens are the text's bytes. --tokenizer bpe:N trains a byte-level BPE of N
tokens on the text first (GPT-2's pre-tokenizer and file format, pytfm.tokenizer), trains the
model on its tokens and saves it beside the checkpoint (OUT/vocab.json, OUT/merges.txt), where
sample.py finds it. --init-from FOLDER fine-tunes the model of a Hugging Face folder, GPT-2 or
the Llama family (config.json, model.safetensors, its tokenizer beside them: pytfm.folders) on
the text tokenized with that tokenizer; the model's shape is the folder's (--d-model, --n-layer,
--n-head, --pos are not used), --context at most its positions, and OUT becomes a folder of the
same family, in float32 (transformers reads it), saved at each evaluation; its memory
(parameters, gradients, AdamW's moments and a step's activations, pytfm.gpt2.memory_plan) is
compared with what the machine has before the model is loaded. Such a run continues with
--init-from OUT (a new run from those weights: steps from 0, so the warm-up, the schedule, the
batch order and AdamW's moments start again), not --resume.

The text is held as its bytes, one token per byte (its own size in memory), and is opened and
read once (a pipe works). Its memory is planned before it is read: a --text larger than the
memory available beside training's own needs (or than --max-text-bytes) is refused by its size,
and an input of unknown size (a pipe, /dev/zero) once it passes that, with one usage line.

Each step's loss stays where the model is until a progress line prints it: then the losses of
the steps since the last line are read at once (from the GPU in one copy; under N ranks summed
in one collective) and checked for NaN or inf; a bad one stops the run there, before anything
is saved. --device cuda trains, evaluates, saves and samples on the GPU, in one process: each
batch is copied to the device. Without CuPy, a CUDA build of pytfm or a GPU it stops at once
with a sentence saying which (exit status 2).

Under mpiexec -n N (pytfm.distributed) the N ranks train the same run together: --batch is the
global batch, each rank trains its rows of it, and the gradients are averaged every step. Rank
0 alone checks the flags and --out (every rank takes its decision: a refusal ends them all with
status 2), reads the text (and sends it to the others), reads and writes the checkpoint, the log
and the plot, and prints; the progress line shows the global tokens/s and the rank count. A
checkpoint resumes on any number of ranks. A rank that fails ends them all, and so does one
that stops answering: a collective that waits longer than --collective-timeout seconds (or
PYTFM_COLLECTIVE_TIMEOUT; default 600) ends the job through MPI, naming the rank that did not
arrive and the step.
"""

import argparse
import contextlib
import csv
import math
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import asdict

import numpy as np

from .. import (
    __version__,
    bf16_path,
    checkpoint,
    data,
    distributed,
    folders,
    get_num_threads,
    gpt2,
)
from .. import device as devices
from ..generate import generate
from ..nn import GPT, GPTConfig
from ..optim import MAX_LR, AdamW, clip_grad_norm, cosine_lr
from ..tokenizer import MAX_TOKENS, Tokenizer, TokenizerError
from ..tokenizer import train as train_tokenizer
from . import SEED_MAX, check_out_path, make_out_folder, new_parser

DESCRIPTION = __doc__.splitlines()[0]
INT_MAX = 2**63 - 1  # the schedule's step counts are int64 in pytfm
MINIMUM = {"steps": 1, "batch": 1, "d_model": 1, "n_layer": 1, "n_head": 1,
           "context": 2,  # one prompt token and one sampled for the sample at the end
           "warmup": 0, "eval_every": 1, "log_every": 1, "sample_tokens": 0, "seed": 0}
PROMPT_BYTES = 16  # the sample's default prompt on a --text: its first bytes, this many at most
PLOT_EXTRA = 'pip install ".[plot]"'  # matplotlib, from pytfm's checkout


def add_model_args(p):
    """The model's and the schedule's options (bench/train_twin.py trains with the same ones)."""
    p.add_argument("--seed", type=int, default=0, help=f"0 .. {SEED_MAX}")
    p.add_argument("--d-model", type=int, default=128, help="features per token")
    p.add_argument("--n-layer", type=int, default=4, help="transformer blocks")
    p.add_argument("--n-head", type=int, default=4, help="attention heads, must divide --d-model")
    p.add_argument("--context", type=int, default=128,
                   help="tokens per window, >= 2 and at most half the text's bytes minus 1")
    p.add_argument("--batch", type=int, default=8, help="windows per step")
    p.add_argument("--pos", choices=["rope", "sinusoidal", "none", "learned"], default="rope",
                   help="how attention sees token positions")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=20, help="steps of linear warmup")


def parser(prog=None):
    """The flags; prog: the name usage lines show (default: the script's file name)."""
    p = new_parser(DESCRIPTION, prog)
    p.add_argument("--steps", type=int, default=800, help="optimizer steps in all")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to train")
    p.add_argument("--precision", choices=["fp32", "bf16", "tf32"], default="fp32",
                   help="of the linear layers' products: bf16 rounds their inputs to BF16 and "
                   "sums in float32 (weights, gradients and optimizer state stay float32; the "
                   "checkpoint is float32 either way), on the CPU or the GPU's tensor cores; "
                   "tf32 (TF32-rounded inputs) on the GPU only")
    p.add_argument("--text", help="train on this file instead of the stdlib corpus; it is "
                   "read as raw bytes, one token per byte: any encoding works (the sample at the "
                   "end shows as UTF-8)")
    p.add_argument("--tokenizer", default="bytes", help="the tokens: 'bytes' (one per byte), or "
                   "'bpe:N' for a byte-level BPE of N tokens trained on the text, saved in --out")
    p.add_argument("--init-from", metavar="FOLDER", help="fine-tune the model of this Hugging "
                   "Face folder, GPT-2 or the Llama family (config.json, model.safetensors, its "
                   "tokenizer), and save OUT as such a folder; fine-tuning wants a lower --lr, "
                   "e.g. 3e-4")
    p.add_argument("--out", default="out", help="folder for checkpoint, loss log and plot")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue from OUT/model.safetensors")
    again.add_argument("--force", action="store_true",
                       help="train anew, replacing OUT/model.safetensors (without it, or "
                       "--resume, a run refuses to replace it)")
    add_model_args(p)
    p.add_argument("--eval-every", type=int, default=100, help="steps between validations")
    p.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    p.add_argument("--sample-tokens", type=int, default=100, help="0: no sample at the end")
    p.add_argument("--prompt", help="what the sample at the end continues (default: 'def ' for "
                   f"the stdlib corpus, the first {PROMPT_BYTES} bytes of a --text), shorter "
                   "than --context")
    p.add_argument("--max-text-bytes", type=int, help="refuse a --text longer than this (default: "
                   "the memory available beside training's needs)")
    p.add_argument("--collective-timeout", type=float,
                   help="under mpiexec: seconds a rank waits for the others in a collective "
                   "before it ends the job (default: PYTFM_COLLECTIVE_TIMEOUT, else "
                   f"{distributed.DEFAULT_TIMEOUT:g})")
    return p


def parse_args(argv=None):
    """The flags as given (no checks, no files touched: bench/train_twin.py reads defaults)."""
    return parser().parse_args(argv)


# ---- checks: every flag and path before anything is loaded, built or trained -----------------


def flag(name):
    return "--" + name.replace("_", "-")


def in_flags(message):
    """A GPTConfig message with its fields named as this command's flags: "d_model (24) must
    be a multiple of n_head (5)" is "--d-model (24) must be a multiple of --n-head (5)"."""
    message = re.sub(r"\b(rope|sinusoidal)\b", r"--pos \1", message.replace("GPTConfig.", ""),
                     count=1)
    return re.sub(r"\b(d_model|n_layer|n_head|max_seq)\b",
                  lambda m: "--context" if m[1] == "max_seq" else flag(m[1]), message)


def check_numbers(p, args):
    """Each number flag within its range, the model's shape as pytfm.nn.GPTConfig wants it."""
    for name, low in MINIMUM.items():
        value, high = getattr(args, name), SEED_MAX if name == "seed" else INT_MAX
        if value < low:
            p.error(f"{flag(name)} must be >= {low}, got {value}")
        if value > high:
            p.error(f"{flag(name)} must be <= {'2**63 - 1' if high == INT_MAX else high}, "
                    f"got {value}")
    if not 0 < args.lr < math.inf:
        p.error(f"--lr must be finite and > 0, got {args.lr}")
    if args.lr > MAX_LR:
        p.error(f"--lr must be at most {MAX_LR:g} (an AdamW step moves a parameter by about lr), "
                f"got {args.lr}")
    if args.max_text_bytes is not None and args.max_text_bytes < 2:
        p.error(f"--max-text-bytes must be >= 2, got {args.max_text_bytes}")
    if args.collective_timeout is not None and not 0 < args.collective_timeout < math.inf:
        p.error(f"--collective-timeout must be finite and > 0 (seconds), got "
                f"{args.collective_timeout}")
    try:  # the model's shape by GPTConfig's rules (the C library's config check), in flags
        GPTConfig(d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
                  max_seq=args.context, pos=args.pos, seed=args.seed)
    except ValueError as e:
        p.error(in_flags(str(e)))
    if args.init_from:  # check_tokens plans a fine-tuning run, once it has read the folder
        return
    need, have = memory_needed(args), physical_memory()
    if have and need > have:
        need_text, have_text = gib(need, have)
        p.error(f"--d-model {args.d_model}, --n-layer {args.n_layer}, --batch {args.batch}, "
                f"--context {args.context}: training needs at least {need_text}, more than "
                f"this machine's {have_text} of memory")


def gib(*sizes):
    """Byte counts in GiB, each with as many decimals as it takes (up to 3) to tell them
    apart: 24.3 GiB and 23.6 GiB, not 24 GiB and 24 GiB."""
    for decimals in range(4):
        shown = [f"{n / 2**30:,.{decimals}f} GiB" for n in sizes]
        if len(set(shown)) == len(set(sizes)):
            break
    return shown


def memory_needed(args):
    """The bytes training takes, pytfm.gpt2.memory_plan's total (of the folder's model for
    --init-from)."""
    cfg = folders.read_config(args.init_from) if args.init_from else GPTConfig(
        vocab=bpe_size(args) or data.VOCAB, d_model=args.d_model, n_layer=args.n_layer,
        n_head=args.n_head, max_seq=args.context, pos=args.pos)
    return gpt2.memory_plan(cfg, args.batch, args.context)["total"]


def bpe_size(args):
    """N of --tokenizer bpe:N (checked by check_tokens), else None."""
    return int(args.tokenizer[4:]) if args.tokenizer.startswith("bpe:") else None


def check_tokens(p, args):
    """--tokenizer and --init-from, and the folder --init-from names: its config, its
    tokenizer, --context within its positions, and the memory a step of it needs. -> (the
    folder's tokenizer, its GPTConfig), or (None, None) without --init-from."""
    kind = args.tokenizer
    if kind != "bytes":
        n = kind[4:]
        if not (kind.startswith("bpe:") and n.isdigit() and n.isascii()):
            p.error(f"--tokenizer must be 'bytes' or 'bpe:N' (N tokens), got {kind!r}")
        if not 257 <= int(n) <= MAX_TOKENS:
            p.error(f"--tokenizer bpe:N needs N in [257, {MAX_TOKENS}] (the 256 bytes, "
                    f"<|endoftext|> and the merges), got {n}")
    folder = args.init_from
    if folder is None:
        return None, None
    if kind != "bytes":
        p.error("--tokenizer: --init-from tokenizes with the folder's own tokenizer")
    if args.resume:
        p.error("--resume continues a pytfm checkpoint; a fine-tuning run saves a Hugging Face "
                "folder: continue it with --init-from OUT")
    try:
        cfg = folders.read_config(folder)
        tok = folders.load_tokenizer(folder)
    except (checkpoint.CheckpointError, TokenizerError, OSError) as e:
        p.error(f"--init-from: {e}")
    if len(tok) > cfg.vocab:
        p.error(f"--init-from: its tokenizer has {len(tok)} tokens, more than the model's "
                f"{cfg.vocab}")
    if args.context > cfg.max_seq:
        p.error(f"--context {args.context} is longer than the {cfg.max_seq} positions of the "
                f"model in {folder}")
    plan, have = gpt2.memory_plan(cfg, args.batch, args.context), gpt2.available_memory()
    if have is not None and plan["total"] > have:
        p.error(f"--init-from {folder}, --batch {args.batch}, --context {args.context}: a "
                f"training step needs {gpt2.describe(plan)}, more than the "
                f"{have / 2**30:.2f} GiB of memory available")
    return tok, cfg


def physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: skip the check
        return 0


def available_memory():
    """The bytes this process may still take (pytfm.device.available_memory); elsewhere than
    Linux the physical memory (0 where unknown)."""
    available = devices.available_memory()
    return physical_memory() if available is None else available


def text_limit(args):
    """(the most bytes of --text this run takes, the reason): --max-text-bytes, else the
    available memory less what training needs; (None, "") when no limit is known."""
    if args.max_text_bytes is not None:
        return args.max_text_bytes, f"--max-text-bytes {args.max_text_bytes:,} allows"
    available = available_memory()
    if not available:
        return None, ""
    need = memory_needed(args)
    room = max(available - need, 0)
    return room, (f"the memory available for it ({gib(available)[0]} available, training needs "
                  f"about {gib(need)[0]}; --max-text-bytes sets the limit)")


def min_text_bytes(context):
    """data.Batches keeps the last tenth of the text, and at least context + 1 bytes, for
    validation and needs context + 1 bytes to train on: 2 * (context + 1) bytes at least."""
    return 2 * (context + 1)


def open_text(p, args):
    """--text opened, once (a pipe can be read only once) -> the binary file, or None for the
    stdlib corpus. A regular file must be non-empty, long enough for --context and within
    text_limit: what its size tells before reading (a pipe's length shows when it is read)."""
    path = args.text
    if path is None:
        return None
    if not path:
        p.error("--text: the path is empty")
    if not os.path.exists(path):
        p.error(f"--text: there is no file {path}")
    if os.path.isdir(path):
        p.error(f"--text: {path} is a folder; give a text file")
    try:
        f = open(path, "rb", buffering=0)
    except OSError as e:
        p.error(f"--text: cannot read {path}: {e.strerror or e}")
    if not os.path.isfile(path):
        return f
    size = os.fstat(f.fileno()).st_size
    limit, why = text_limit(args)
    problem = (f"{path} is empty" if size == 0 else
               f"{path} is {size:,} bytes, more than {why}" if limit is not None and size > limit
               else None)
    if problem or size < min_text_bytes(args.context):
        f.close()
        if problem:
            p.error(f"--text: {problem}")
        context_too_long(p, args, size)
    return f


def read_text(p, args, f):
    """The text's bytes (uint8): all of f, the opened --text (then closed), else the stdlib
    corpus."""
    if f is None:
        try:
            return data.stdlib_corpus()
        except (OSError, RuntimeError) as e:
            p.error(f"the stdlib corpus: {e}")
    limit, why = text_limit(args)
    try:
        with f:
            return data.text_corpus(f, limit)
    except data.TextTooLarge:
        p.error(f"--text: {args.text} gives more than {limit:,} bytes, more than {why} (an "
                "endless input?)")
    except (OSError, ValueError) as e:  # a pipe that turned out short, ...
        p.error(f"--text: {e}")


def context_too_long(p, args, size, unit="bytes"):
    where = args.text or "the stdlib corpus"
    hint = f"use --context {size // 2 - 1} or less" if size >= 6 else "give a longer text"
    p.error(f"--context {args.context} is too long for the {size:,} {unit} of {where}: training "
            f"and validation need context + 1 {unit} each ({hint})")



def check_out(p, args):
    """--out is a folder this process can create and write in, before training: the run must
    not end with nowhere to save; and a checkpoint there is replaced only when asked
    (--force), continued with --resume. -> the checkpoint's path."""
    out = args.out
    check_out_path(p, out)
    ckpt = os.path.join(out, "model.safetensors")
    if args.resume and not os.path.isfile(ckpt):
        p.error(f"--resume: there is no checkpoint at {ckpt}")
    make_out_folder(p, out)
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        p.error(f"--out: cannot write in {out}: {e.strerror or e}")
    for name in ("model.safetensors", "loss.csv", "loss.png"):
        path = os.path.join(out, name)
        if os.path.isdir(path):
            p.error(f"--out: {path} is a folder, where the run writes a file")
        if name != "model.safetensors" and os.path.exists(path) and not os.access(path, os.W_OK):
            p.error(f"--out: {path} exists and is not writable")
    if os.path.exists(ckpt) and not (args.resume or args.force):
        p.error(f"--out: {ckpt} exists: --resume continues its run, --force trains anew over "
                "it, or give another --out")
    return ckpt


def check_prompt(p, args):
    """--prompt, when given, as bytes: not empty, shorter than --context (one new byte must
    fit). -> the bytes, or None for the default."""
    if args.prompt is None:
        return None
    # surrogateescape: bytes of the command line that are not UTF-8 come back as they were
    raw = args.prompt.encode("utf-8", "surrogateescape")
    if not raw:
        p.error("--prompt must not be empty: the sample continues at least one byte")
    if len(raw) >= args.context:
        p.error(f"--prompt is {len(raw)} bytes: the sample needs it shorter than --context "
                f"{args.context}")
    return raw


def sample_prompt(args, raw, text, tok=None):
    """The tokens the sample at the end continues: --prompt's bytes (raw), or by default
    'def ' for the stdlib corpus (Python source) and the first PROMPT_BYTES bytes of a --text,
    cut to leave room in the context for one new token; the bytes themselves (uint8), or
    their tokens by tok (int64)."""
    if raw is None:
        raw = b"def " if args.text is None else bytes(text[:PROMPT_BYTES])
    ids = np.frombuffer(raw, np.uint8) if tok is None else tok.encode_array(raw)
    return ids[:args.context - 1]


def load_checkpoint(p, path, model=None, opt=None):
    """checkpoint.load, a bad file reported in one line: -> (model, step, extra)."""
    try:
        model, step, extra = checkpoint.load(path, model, opt)
        log = extra.get("log", []) if isinstance(extra, dict) else None
        if not isinstance(log, list) or not all(
                isinstance(r, list) and len(r) == 6 and type(r[0]) is int for r in log):
            raise checkpoint.CheckpointError(f"{path}: its extra metadata is not train_tiny's "
                                             "(a dict whose log is a list of rows)")
        return model, step, extra
    except checkpoint.CheckpointError as e:  # all a malformed file can raise
        p.error(f"--resume: {e}")
    except OSError as e:
        p.error(f"--resume: cannot read {path}: {e.strerror or e}")


def resumed_tokenizer(p, args):
    """--resume with --tokenizer bpe:N: the tokenizer the run saved in --out (None for
    bytes)."""
    if bpe_size(args) is None:
        return None
    try:
        return Tokenizer.from_folder(args.out)
    except (TokenizerError, OSError) as e:
        p.error(f"--resume: --tokenizer {args.tokenizer} continues with the tokenizer the run "
                f"saved in {args.out}: {e}")


def check_resume(p, args, ckpt, vocab=data.VOCAB):
    """The checkpoint in --out holds the model the flags describe (of vocab tokens), at a step
    <= --steps."""
    saved, step, _ = load_checkpoint(p, ckpt)
    flags = {"vocab": vocab, "d_model": args.d_model, "n_layer": args.n_layer,
             "n_head": args.n_head, "max_seq": args.context, "pos": args.pos, "seed": args.seed}
    have, want = asdict(saved.cfg), asdict(GPTConfig(**flags))
    other = [f"{k}={have[k]!r}" for k in have if k not in flags and have[k] != want[k]]
    if other:
        p.error(f"--resume: {ckpt} holds a model train_tiny.py does not make ({', '.join(other)})")
    names = {"max_seq": "context", "vocab": "tokenizer"}
    wrong = [f"{flag(names.get(k, k))} {have[k]}" if k != "vocab" else
             f"a vocabulary of {have[k]} (here {vocab})" for k in flags if have[k] != want[k]]
    if wrong:
        p.error(f"--resume: {ckpt} was trained with {', '.join(wrong)}; resume with the flags "
                "it was started with")
    if step > args.steps:
        p.error(f"--steps {args.steps} is below the step of the checkpoint to resume "
                f"({step} in {ckpt})")


def clock(seconds):
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def val_loss(model, batches, world=None, n_batches=4):
    """The mean loss of the first n_batches validation batches; under N ranks each scores its
    rows of each batch, weighted by its share, and the shares are summed."""
    world = world or distributed.World(None)
    losses = []
    for i in range(n_batches):
        x, y, share = world.shard(*batches.batch("val", i))
        # save=False: an evaluation leaves the state of the model's backward() alone
        x, y = devices.to_device(x, model.device), devices.to_device(y, model.device)
        losses.append(float(model.forward(x, y, save=False, check_ids=False)[1]) * share)
    return float(np.mean(world.sum(losses)))


def write_log(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "train_loss", "val_loss", "lr", "tokens_per_s", "elapsed_s"])
        w.writerows(rows)


def plot(path, rows, unit="byte"):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = [r[0] for r in rows]
    plt.figure(figsize=(6, 4))
    plt.plot(steps, [r[1] for r in rows], label="train")
    val = [(r[0], r[2]) for r in rows if r[2] != ""]
    if val:
        plt.plot(*zip(*val), "o-", label="validation")
    plt.xlabel("step"), plt.ylabel(f"loss (nats/{unit})"), plt.legend(), plt.tight_layout()
    plt.savefig(path)
    plt.close()
    return True




# ---- the run: everything around the training loop --------------------------------------------


def prepare(p, argv, ranks):
    """Everything before training that reads or writes a file or may fail on a flag: on rank 0
    alone under N ranks. -> (args, checkpoint path, the text's tokens, the sample's prompt,
    the tokenizer (None: bytes), the --init-from folder's GPTConfig (None without))."""
    args = p.parse_args(argv)
    check_numbers(p, args)
    tok, base = check_tokens(p, args)
    raw_prompt = check_prompt(p, args)
    if args.device == "cuda":
        problem = devices.cuda_problem()
        if problem is not None:
            p.error(f"--device cuda: {problem} (--device cpu trains on the CPU)")
        if ranks > 1:
            p.error(f"--device cuda trains in one process, not {ranks} ranks: run it without "
                    "mpiexec")
    if args.precision == "tf32" and args.device != "cuda":
        p.error("--precision tf32 runs on the GPU only (its tensor cores): --device cuda, or "
                "--precision fp32 or bf16 on the CPU")
    if args.batch < ranks:
        p.error(f"--batch {args.batch} is the global batch, split over the {ranks} ranks: it "
                f"must be at least {ranks}, one row each")
    text = open_text(p, args)
    try:
        ckpt = check_out(p, args)
        if args.resume:
            tok = resumed_tokenizer(p, args)
            check_resume(p, args, ckpt, data.VOCAB if tok is None else len(tok))
    except BaseException:
        if text is not None:
            text.close()
        raise
    raw = read_text(p, args, text)
    if len(raw) < min_text_bytes(args.context):
        context_too_long(p, args, len(raw))
    tokens = raw
    if tok is None and bpe_size(args) is not None:
        tok = train_tokenizer(raw.tobytes(), bpe_size(args))
        tok.save(args.out)
        print(f"trained a byte-level BPE of {len(tok):,} tokens on the text: "
              f"{os.path.join(args.out, 'vocab.json')}, merges.txt")
    if tok is not None:
        tokens = tok.encode_array(raw.tobytes(), dtype=np.uint16 if len(tok) <= 2**16 else
                                  np.int32)
        if len(tokens) < min_text_bytes(args.context):
            context_too_long(p, args, len(tokens), "tokens")
    return args, ckpt, tokens, sample_prompt(args, raw_prompt, raw, tok), tok, base


def timeout_flag(argv):
    """--collective-timeout as given, read by every rank before the first collective (None
    when absent or not a positive number: rank 0's full parse reports a bad one)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--collective-timeout")
    try:
        value = float(p.parse_known_args(argv)[0].collective_timeout or "nan")
    except (ValueError, SystemExit):
        return None
    return value if 0 < value < math.inf else None


@contextlib.contextmanager
def session(argv=None, interrupt_at=None, prog=None):
    """A training run's setup, then the Run to train with. A bad flag or path exits with status
    2 and one line naming it (parser.error) before the text is read or the model built;
    --resume reads its checkpoint first to compare it with the flags. Under mpiexec every rank
    takes the same decisions, and an exception on one rank ends them all (pytfm.distributed).
    interrupt_at=k acts as a Ctrl-C after step k (for tests)."""
    p = parser(prog)
    try:
        world = distributed.init()
    except ValueError as e:  # a bad PYTFM_COLLECTIVE_TIMEOUT, said by every rank
        p.error(str(e))
    world.timeout = timeout_flag(argv) or world.timeout
    with world.guard():
        run = Run(p, world, argv, interrupt_at)
        try:
            yield run
        finally:
            if run.previous_handler is not None:
                signal.signal(signal.SIGINT, run.previous_handler)


def quiet(*_, **__):
    pass


class Run:
    """One run's state besides the model and the optimizer: the flags (args), the text's
    tokens (every rank's), the tokenizer (None: bytes), the vocabulary, the --init-from
    folder's config (base), the step, the log's rows. Under N ranks each trains its rows of
    every batch; the loss, the gradients and every decision to stop are agreed through the
    world's collectives, so that all ranks take the same steps; rank 0 alone reads and writes
    files and prints."""

    def __init__(self, p, world, argv, interrupt_at):
        self.p, self.world, self.interrupt_at = p, world, interrupt_at
        held = []  # rank 0: the text's tokens, sent to the others by world.broadcast, not
        # pickled; and its tokenizer, which rank 0 alone uses (to save and sample)

        def prepared(argv, ranks):
            args, ckpt, tokens, prompt, tok, base = prepare(p, argv, ranks)
            held.append((tokens, tok))
            vocab = data.VOCAB if tok is None else len(tok)
            return (args, ckpt, len(tokens), tokens.dtype.str, prompt, vocab,
                    None if base is None else asdict(base))

        (self.args, self.ckpt, n_tokens, dtype, self.prompt, self.vocab,
         base) = world.on_root(prepared, argv, world.size)
        self.tokens, self.tokenizer = held[0] if held else (np.empty(n_tokens, dtype), None)
        world.broadcast(self.tokens)
        self.base = None if base is None else GPTConfig(**base)
        self.log_path = os.path.join(self.args.out, "loss.csv")
        self.say = print if world.root else quiet
        self.step, self.rows, self.stop, self.previous_handler = 0, [], [], None
        # (row, loss, gradient norm, share) of each step whose loss is not read yet; the loss
        # and the norm are 0-d arrays where the model is
        self.unread = []

    def base_model(self):
        """--init-from: the folder's model (rank 0 reads its weights, the others get them from
        begin()) in --precision."""
        args = self.args
        model = folders.load(args.init_from, args.device) if self.world.root else \
            GPT(self.base, args.device)
        model.set_precision(args.precision)
        return model

    def begin(self, model, opt, batches):
        """Before the first step: --resume's checkpoint into model and opt, every rank from
        rank 0's parameters, the header line; Ctrl-C from here on finishes the step, then
        saves."""
        world, args = self.world, self.args
        self.model, self.opt, self.batches = model, opt, batches
        if args.resume:  # saved on any number of ranks: the state is the same
            self.step, self.rows, opt.t = world.on_root(self.resume)
            world.broadcast(opt.m.buffer)
            world.broadcast(opt.v.buffer)
        world.broadcast(model.params.buffer)
        if world.root:
            self.print_header()
        self.previous_handler = signal.signal(signal.SIGINT, lambda *_: self.stop.append(True))

    def resume(self):
        """Rank 0: the checkpoint into the model and the optimizer. -> (step, log rows,
        opt.t)."""
        _, step, extra = load_checkpoint(self.p, self.ckpt, self.model, self.opt)
        print(f"resumed {self.ckpt} at step {step}")
        return step, [r for r in extra.get("log", []) if r[0] <= step], self.opt.t

    def print_header(self):
        args, cfg, tok, world = self.args, self.model.cfg, self.tokenizer, self.world
        ranks = ""
        if world.size > 1:
            threads = get_num_threads()
            ranks = f"; {world.size} ranks, {threads} thread{'s' * (threads > 1)} each"
        what = "bytes" if tok is None else f"tokens (a vocabulary of {len(tok):,})"
        init = f" from {args.init_from}" if args.init_from else ""
        print(f"pytfm {__version__}: GPT{init} with {self.model.num_params():,} parameters "
              f"({cfg.n_layer} layers, d={cfg.d_model}, {cfg.n_head} heads, context "
              f"{cfg.max_seq}, pos={cfg.pos}); {len(self.tokens):,} {what} of "
              f"{'text from ' + args.text if args.text else 'Python stdlib source'}{ranks}")
        if args.precision == "bf16" and args.device == "cpu":
            print(f"precision bf16, the BF16 products' path: {bf16_path()}")
        elif args.precision != "fp32":
            print(f"precision {args.precision}: the linear layers on the tensor cores, and "
                  "attention where its head dim is 16, 32, 64 or 128")

    def steps(self):
        """The steps to take (0-based), from the resumed one to --steps; Ctrl-C on any rank
        stops all."""
        self.start, self.first_step, self.tokens_done = time.perf_counter(), self.step, 0
        while self.step < self.args.steps and not self.world.any(self.stop):
            self.world.step = self.step + 1  # the step its collectives belong to (watchdog)
            yield self.step

    def batch(self, step):
        """This rank's rows of the global training batch of step, on the model's device, and
        their share of it."""
        x, y, share = self.world.shard(*self.batches.batch("train", step))
        device = self.model.device
        return devices.to_device(x, device), devices.to_device(y, device), share

    def record(self, loss, norm, share, lr):
        """After a step: its row in the log; the progress line every --log-every steps (the
        losses since the last one read then, at once); the validation loss and the checkpoint
        every --eval-every. -> False when a loss, a norm or the validation loss is not finite
        (said, nothing saved: the run stops with status 1)."""
        args, world = self.args, self.world
        self.step = step = self.step + 1
        self.tokens_done += args.batch * args.context  # the global batch's
        row = [step, None, "", lr, 0, 0.0]  # the losses, the rate and the time filled in below
        self.rows.append(row)
        evaluating = step % args.eval_every == 0 or step == args.steps
        printing = step % args.log_every == 0 or evaluating or step == 1
        self.unread.append((row, loss, norm, share))
        if printing:
            loss = self.read_losses()
            if loss is None:
                return False
        elapsed = time.perf_counter() - self.start
        rate = self.tokens_done / elapsed
        vl = val_loss(self.model, self.batches, world) if evaluating else ""
        if vl != "" and not math.isfinite(vl):
            self.say(f"\nstep {step}: the validation loss became {vl}; stopping. The last good "
                     f"checkpoint ({self.ckpt}) is left as it was.", file=sys.stderr)
            return False
        if step == self.interrupt_at:
            self.stop.append(True)
        row[2:] = [vl if vl == "" else round(vl, 5), lr, round(rate), round(elapsed, 2)]
        if printing:
            left = (args.steps - step) * elapsed / (step - self.first_step)
            val = f" | val {vl:.4f}" if vl != "" else ""
            on = f" on {world.size} ranks" if world.size > 1 else ""
            self.say(f"step {step:5d}/{args.steps} | loss {loss:.4f}{val} | {rate:6.0f} tok/s"
                     f"{on} | {clock(elapsed)} elapsed | {clock(left)} left", flush=True)
        if vl != "":
            self.save()
        return True

    def read_losses(self):
        """The global batch's mean loss of each unread step into its row, read at once with
        the gradient norms (one copy from the device, one sum over the ranks; the norms, of the
        summed gradients, are every rank's already) -> the last loss; None, once said, when a
        loss or a norm is not finite."""
        xp, unread = self.model.xp, self.unread
        both = [xp.asarray(v, np.float64) for _, loss, norm, _ in unread for v in (loss, norm)]
        local = devices.to_host(xp.stack(both)).reshape(-1, 2)
        shares = np.array([share for *_, share in unread])
        values = self.world.sum(local[:, 0] * shares).tolist()
        for (row, *_), value, norm in zip(unread, values, local[:, 1].tolist()):
            what = ("the loss", value) if not math.isfinite(value) else \
                ("the gradients' norm", norm) if not math.isfinite(norm) else None
            if what:
                self.say(f"\nstep {row[0]}: {what[0]} became {what[1]}; stopping. The last good "
                         f"checkpoint ({self.ckpt}) is left as it was.", file=sys.stderr)
                return None
            row[1] = round(value, 5)
        unread.clear()
        return values[-1]

    def save(self):
        """The checkpoint: a Hugging Face folder in --out with --init-from, else a pytfm checkpoint
        with the optimizer, the step and the log (what --resume continues)."""
        self.world.check_identical(self.model.params.buffer)  # a divergence stops the run
        if self.world.root and self.args.init_from:
            folders.save(self.model, self.args.out, self.tokenizer)
        elif self.world.root:
            checkpoint.save(self.ckpt, self.model, self.step, self.opt,
                            extra={"log": self.rows, "args": vars(self.args)})

    def finish(self):
        """After the last step: the checkpoint, loss.csv and loss.png. -> the exit status: 0,
        1 (a loss read now is not finite), 130 (stopped by Ctrl-C)."""
        args, world = self.args, self.world
        if self.unread and self.read_losses() is None:  # stopped between two progress lines
            return 1
        self.save()
        if world.root:
            write_log(self.log_path, self.rows)
        if world.any(self.stop):
            again = f"--init-from {args.out}" if args.init_from else "--resume"
            self.say(f"\ninterrupted: checkpoint saved at step {self.step} in {self.ckpt}; "
                     f"continue with {again}")
            return 130
        if not world.root:
            return 0
        png = os.path.join(args.out, "loss.png")
        if plot(png, self.rows, "byte" if self.tokenizer is None else "token"):
            print(f"saved {self.ckpt}, {self.log_path} and {png}")
        else:
            print(f"saved {self.ckpt} and {self.log_path}")
            print(f"skipped the plot {png}: matplotlib is not installed ({PLOT_EXTRA})")
        return 0

    def sample_prompt(self):
        """The sample's prompt as a batch of one (int64), cut to leave room for one new token,
        and how many tokens to sample after it (at most --sample-tokens)."""
        prompt, n_ctx = self.prompt, min(self.model.cfg.max_seq, self.args.context)
        if prompt is None:
            tok = self.tokenizer
            prompt = data.encode("def ") if tok is None else tok.encode_array("def ")
        prompt = prompt.astype(np.int64)[None, :n_ctx - 1]
        return prompt, min(self.args.sample_tokens, n_ctx - prompt.shape[1])

    def decode(self, ids):
        return data.decode(ids) if self.tokenizer is None else self.tokenizer.decode(ids)


# ---- the command: examples/train_tiny.py writes the same out to read -------------------------


def main(argv=None, interrupt_at=None, prog=None):
    """Returns the exit status (see session() and Run.finish())."""
    with session(argv, interrupt_at, prog) as run:
        args = run.args
        if run.base is not None:  # --init-from: the folder's model
            model = run.base_model()
        else:
            cfg = GPTConfig(vocab=run.vocab, d_model=args.d_model, n_layer=args.n_layer,
                            n_head=args.n_head, max_seq=args.context, pos=args.pos,
                            seed=args.seed)
            model = GPT(cfg, device=args.device, precision=args.precision)
        opt = AdamW(model.params, model.grads, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        batches = data.Batches(run.tokens, args.context, args.batch, seed=args.seed)
        run.begin(model, opt, batches)
        for step in run.steps():
            lr = cosine_lr(step, args.lr, args.warmup, args.steps, min_lr=args.lr / 10)
            x, y, share = run.batch(step)
            model.zero_grad()
            _, loss = model.forward(x, y, check_ids=False)  # ids below vocab by construction
            model.backward()
            run.world.average_gradients(model.grads, share)
            norm = clip_grad_norm(model.grads, 1.0)
            opt.step(lr)
            if not run.record(loss, norm, share, lr):
                return 1
        status = run.finish()
        if status == 0 and run.world.root and args.sample_tokens:
            prompt, n_new = run.sample_prompt()
            ids = generate(model, prompt, n_new, temperature=0.8, top_k=40, seed=args.seed)[0]
            print("sample (temperature 0.8, top-k 40):\n" + run.decode(ids))
        return status
