"""Train a small byte-level GPT with pytfm's kernels and hand-written backprop, then sample.

    python examples/train_tiny.py               # 0.83M parameters, context 128, < 1 min on 2 cores
    python examples/train_tiny.py --steps 1000 --text my.txt --out run1
    python examples/train_tiny.py --out run1 --resume          # continue an interrupted run
    python examples/train_tiny.py --force                      # train anew over out/
    python examples/train_tiny.py --device cuda                # on the GPU (CuPy, CUDA build)
    python examples/train_tiny.py --precision bf16             # BF16 products (CPU), FP32 state
    mpiexec -n 2 python examples/train_tiny.py                 # two processes (pytfm[mpi])

With no --text it learns from the Python standard library's own source files, which every
machine has. It prints a progress line every --log-every steps and the validation loss every
--eval-every, writes OUT/model.safetensors (the checkpoint, also at each evaluation), OUT/loss.csv
and, when matplotlib is installed, OUT/loss.png; at the end it samples --sample-tokens bytes
after --prompt. Ctrl-C saves a resumable checkpoint and exits; a loss that turns NaN or inf
stops the run and leaves the last good checkpoint as it was. Every flag and path is checked
before training (--out by creating it and writing a test file): a bad one stops the script with
its usage and one line naming the flag, exit status 2. So does an OUT/model.safetensors that a
run would replace, unless --resume continues it or --force replaces it. Sample from a
checkpoint later with examples/sample.py.

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
checkpoint resumes on any number of ranks. A rank that fails ends them all.
"""

import argparse
import csv
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict

import numpy as np

import pytfm
from pytfm import checkpoint, data, distributed
from pytfm import device as devices
from pytfm.generate import generate
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr

SEED_MAX = 2**32 - 1  # as numpy.random.seed and most twins take
INT_MAX = 2**63 - 1  # the schedule's step counts are int64 in pytfm
MINIMUM = {"steps": 1, "batch": 1, "d_model": 1, "n_layer": 1, "n_head": 1,
           "context": 2,  # one prompt token and one sampled for the sample at the end
           "warmup": 0, "eval_every": 1, "log_every": 1, "sample_tokens": 0, "seed": 0}
PROMPT_BYTES = 16  # the sample's default prompt on a --text: its first bytes, this many at most
PLOT_EXTRA = 'pip install ".[plot]"'  # matplotlib, from pytfm's checkout


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default, where there is one to show (not None, not False);
    the other examples' parsers use it too."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def new_parser(description):
    """An example's parser: defaults in --help, and no abbreviations (argparse would otherwise
    take --step 10 for --steps 10)."""
    return argparse.ArgumentParser(description=description, formatter_class=HelpFormatter,
                                   allow_abbrev=False)


def add_model_args(p):
    """The model's and the schedule's options (bench/train_twin.py trains with the same ones)."""
    p.add_argument("--seed", type=int, default=0, help=f"0 .. {SEED_MAX}")
    p.add_argument("--d-model", type=int, default=128, help="features per token")
    p.add_argument("--n-layer", type=int, default=4, help="transformer blocks")
    p.add_argument("--n-head", type=int, default=4, help="attention heads, must divide --d-model")
    p.add_argument("--context", type=int, default=128,
                   help="tokens per window, >= 2 and at most half the text's bytes minus 1")
    p.add_argument("--batch", type=int, default=8, help="windows per step")
    p.add_argument("--pos", choices=["rope", "sinusoidal", "none"], default="rope",
                   help="how attention sees token positions")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=20, help="steps of linear warmup")


def parser():
    p = new_parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=800, help="optimizer steps in all")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to train")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="of the linear layers' products: bf16 rounds their inputs to BF16 and "
                   "sums in float32 (weights, gradients and optimizer state stay float32; the "
                   "checkpoint is float32 either way); on the CPU")
    p.add_argument("--text", help="train on this file instead of the stdlib corpus; it is "
                   "read as raw bytes, one token per byte: any encoding works (the sample at the "
                   "end shows as UTF-8)")
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
    return p


def parse_args(argv=None):
    """The flags as given (no checks, no files touched: bench/train_twin.py reads defaults)."""
    return parser().parse_args(argv)


# ---- checks: every flag and path before anything is loaded, built or trained -----------------


def flag(name):
    return "--" + name.replace("_", "-")


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
    if args.d_model % args.n_head:
        p.error(f"--n-head {args.n_head} must divide --d-model {args.d_model} "
                "(each head gets d-model / n-head features)")
    head = args.d_model // args.n_head
    if args.pos == "rope" and head % 2:
        p.error(f"--pos rope needs an even head size, got --d-model / --n-head = {head}")
    if args.pos == "sinusoidal" and args.d_model % 2:
        p.error(f"--pos sinusoidal needs an even --d-model, got {args.d_model}")
    try:  # any rule of GPTConfig's that the checks above do not know yet
        GPTConfig(d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
                  max_seq=args.context, pos=args.pos, seed=args.seed)
    except ValueError as e:
        p.error(str(e))
    need, have = memory_needed(args), physical_memory()
    if have and need > have:
        p.error(f"--d-model {args.d_model}, --n-layer {args.n_layer}, --batch {args.batch}, "
                f"--context {args.context}: training needs about {need / 2**30:,.0f} GiB, more "
                f"than this machine's {have / 2**30:,.0f} GiB of memory")


def memory_needed(args):
    """A lower estimate of the bytes training takes: parameters with their gradients and AdamW
    moments, and per token about 20 saved floats per layer and feature plus the logits."""
    d, layers = args.d_model, args.n_layer
    params = data.VOCAB * d + layers * (12 * d * d + 13 * d) + 2 * d
    per_token = 20 * d * layers + 3 * data.VOCAB
    return 4 * (4 * params + args.batch * args.context * per_token)


def physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: skip the check
        return 0


def min_text_bytes(context):
    """data.Batches keeps the last tenth of the text, and at least context + 1 bytes, for
    validation and needs context + 1 bytes to train on: 2 * (context + 1) bytes at least."""
    return 2 * (context + 1)


def check_text(p, args):
    """--text names a readable, non-empty file long enough for --context (what size tells
    before reading: a pipe's length shows when it is read)."""
    path = args.text
    if path is None:
        return
    if not path:
        p.error("--text: the path is empty")
    if not os.path.exists(path):
        p.error(f"--text: there is no file {path}")
    if os.path.isdir(path):
        p.error(f"--text: {path} is a folder; give a text file")
    try:  # opening is the test (reading even a byte would lose it from a pipe)
        with open(path, "rb"):
            pass
    except OSError as e:
        p.error(f"--text: cannot read {path}: {e.strerror or e}")
    size = os.stat(path).st_size
    if os.path.isfile(path) and size == 0:
        p.error(f"--text: {path} is empty")
    if os.path.isfile(path) and size < min_text_bytes(args.context):
        context_too_long(p, args, size)


def context_too_long(p, args, size):
    where = args.text or "the stdlib corpus"
    hint = f"use --context {size // 2 - 1} or less" if size >= 6 else "give a longer text"
    p.error(f"--context {args.context} is too long for the {size:,} bytes of {where}: training "
            f"and validation need context + 1 bytes each ({hint})")


def check_out(p, args):
    """--out is a folder this process can create and write in, before training: the run must
    not end with nowhere to save; and a checkpoint there is replaced only when asked
    (--force), continued with --resume. -> the checkpoint's path."""
    out = args.out
    if not out:
        p.error("--out: the path is empty")
    ckpt = os.path.join(out, "model.safetensors")
    if os.path.exists(out) and not os.path.isdir(out):
        p.error(f"--out: {out} exists and is not a folder")
    if args.resume and not os.path.isfile(ckpt):
        p.error(f"--resume: there is no checkpoint at {ckpt}")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        p.error(f"--out: cannot create the folder {out}: {e.strerror or e}")
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


def sample_prompt(args, raw, tokens):
    """The bytes the sample at the end continues (uint8): --prompt's (raw), or by default
    'def ' for the stdlib corpus (Python source) and the first PROMPT_BYTES bytes of a --text,
    cut to leave room in the context for one new byte."""
    if raw is not None:
        return np.frombuffer(raw, np.uint8)
    first = data.encode("def ") if args.text is None else tokens[:PROMPT_BYTES]
    return np.asarray(first[:args.context - 1], np.uint8)


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


def check_resume(p, args, ckpt):
    """The checkpoint in --out holds the model the flags describe, at a step <= --steps."""
    saved, step, _ = load_checkpoint(p, ckpt)
    flags = {"d_model": args.d_model, "n_layer": args.n_layer, "n_head": args.n_head,
             "max_seq": args.context, "pos": args.pos, "seed": args.seed}
    have, want = asdict(saved.cfg), asdict(GPTConfig(**flags))
    other = [f"{k}={have[k]!r}" for k in have if k not in flags and have[k] != want[k]]
    if other:
        p.error(f"--resume: {ckpt} holds a model train_tiny.py does not make ({', '.join(other)})")
    wrong = [f"{flag('context' if k == 'max_seq' else k)} {have[k]}"
             for k in flags if have[k] != want[k]]
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


def plot(path, rows):
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
    plt.xlabel("step"), plt.ylabel("loss (nats/byte)"), plt.legend(), plt.tight_layout()
    plt.savefig(path)
    plt.close()
    return True


def prepare(argv, ranks):
    """Everything before training that reads or writes a file or may fail on a flag: on rank 0
    alone under N ranks. -> (args, checkpoint path, the text's tokens as uint8, the sample's
    prompt as uint8)."""
    p = parser()
    args = p.parse_args(argv)
    check_numbers(p, args)
    raw_prompt = check_prompt(p, args)
    if args.device == "cuda":
        problem = devices.cuda_problem()
        if problem is not None:
            p.error(f"--device cuda: {problem} (--device cpu trains on the CPU)")
        if ranks > 1:
            p.error(f"--device cuda trains in one process, not {ranks} ranks: run it without "
                    "mpiexec")
        if args.precision != "fp32":
            p.error(f"--precision {args.precision} runs on the CPU only: --precision fp32 "
                    "with --device cuda")
    if args.batch < ranks:
        p.error(f"--batch {args.batch} is the global batch, split over the {ranks} ranks: it "
                f"must be at least {ranks}, one row each")
    check_text(p, args)
    ckpt = check_out(p, args)
    if args.resume:
        check_resume(p, args, ckpt)
    try:
        tokens = data.text_corpus(args.text) if args.text is not None else data.stdlib_corpus()
    except (OSError, ValueError, RuntimeError) as e:  # a pipe that turned out short, ...
        p.error(f"--text: {e}" if args.text else f"the stdlib corpus: {e}")
    if len(tokens) < min_text_bytes(args.context):
        context_too_long(p, args, len(tokens))
    # bytes: a quarter of the int64s' size to send to the other ranks (the text or even the
    # stdlib may exist only on rank 0's machine)
    return args, ckpt, tokens.astype(np.uint8), sample_prompt(args, raw_prompt, tokens)


def resume(ckpt, model, opt):
    """Rank 0: the checkpoint into model and opt. -> (step, log rows, opt.t)."""
    model, step, extra = load_checkpoint(parser(), ckpt, model, opt)
    print(f"resumed {ckpt} at step {step}")
    return step, [r for r in extra.get("log", []) if r[0] <= step], opt.t


def main(argv=None, interrupt_at=None):
    """Returns the exit status. interrupt_at=k acts as a Ctrl-C after step k (for tests). A bad
    flag or path exits with status 2 and one line naming it (parser.error) before the text is
    read or the model built; --resume reads its checkpoint first to compare it with the
    flags. Under mpiexec every rank returns the same status, and an exception on one rank
    ends them all (pytfm.distributed)."""
    world = distributed.init()
    with world.guard():
        return run(world, argv, interrupt_at)


def run(world, argv, interrupt_at):
    args, ckpt, tokens, prompt = world.on_root(prepare, argv, world.size)
    tokens = tokens.astype(np.int64)
    log_path = os.path.join(args.out, "loss.csv")
    batches = data.Batches(tokens, args.context, args.batch, seed=args.seed)
    cfg = GPTConfig(d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
                    max_seq=args.context, pos=args.pos, seed=args.seed)
    model = GPT(cfg, device=args.device, precision=args.precision)
    opt = AdamW(model.params, model.grads, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    step, rows = 0, []
    if args.resume:  # saved on any number of ranks: the state is the same
        step, rows, opt.t = world.on_root(resume, ckpt, model, opt)
        world.broadcast(opt.m.buffer)
        world.broadcast(opt.v.buffer)
    world.broadcast(model.params.buffer)  # every rank starts from rank 0's parameters
    ranks = ""
    if world.size > 1:
        threads = pytfm.get_num_threads()
        ranks = f"; {world.size} ranks, {threads} thread{'s' * (threads > 1)} each"
    if world.root:
        print(f"pytfm {pytfm.__version__}: GPT with {model.num_params():,} parameters "
              f"({cfg.n_layer} layers, d={cfg.d_model}, {cfg.n_head} heads, context "
              f"{cfg.max_seq}, pos={cfg.pos}); {len(tokens):,} bytes of "
              f"{'text from ' + args.text if args.text else 'Python stdlib source'}{ranks}")
        if args.precision == "bf16":
            print(f"precision bf16, the BF16 products' path: {pytfm.bf16_path()}")

    stop = []  # Ctrl-C: finish the step, then save
    previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    try:
        return train(args, model, opt, batches, step, rows, ckpt, log_path, stop, interrupt_at,
                     world, prompt)
    finally:
        signal.signal(signal.SIGINT, previous)


def quiet(*_, **__):
    pass


def train(args, model, opt, batches, step, rows, ckpt, log_path, stop, interrupt_at, world=None,
          prompt=None):
    """The training loop, then the sample after prompt (uint8; None: 'def '). Under N ranks:
    each trains its rows of every batch; the loss, the gradients and every decision to stop are
    agreed through the world's collectives, so that all ranks take the same steps; rank 0 alone
    writes and prints."""
    world = world or distributed.World(None)
    say = print if world.root else quiet
    cfg = model.cfg
    on = f" on {world.size} ranks" if world.size > 1 else ""

    def save():
        world.check_identical(model.params.buffer)  # a divergence stops the run, not saved
        if world.root:
            checkpoint.save(ckpt, model, step, opt, extra={"log": rows, "args": vars(args)})

    unread = []  # (row, loss where the model is, share) of each step whose loss is not read yet

    def read_losses():
        """The global batch's mean loss of each unread step into its row, read at once (one
        copy from the device, one sum over the ranks) -> the last one; None, once said, when
        one is not finite."""
        local = devices.to_host(model.xp.stack([loss for _, loss, _ in unread]))
        shares = np.array([share for _, _, share in unread])
        values = world.sum(local.astype(np.float64) * shares).tolist()
        for (row, _, _), value in zip(unread, values):
            if not math.isfinite(value):
                say(f"\nstep {row[0]}: the loss became {value}; stopping. The last good "
                    f"checkpoint ({ckpt}) is left as it was.", file=sys.stderr)
                return None
            row[1] = round(value, 5)
        unread.clear()
        return values[-1]

    start, first_step, tokens_done = time.perf_counter(), step, 0
    while step < args.steps and not world.any(stop):  # Ctrl-C on any rank stops all
        lr = cosine_lr(step, args.lr, args.warmup, args.steps, min_lr=args.lr / 10)
        x, y, share = world.shard(*batches.batch("train", step))
        x, y = devices.to_device(x, model.device), devices.to_device(y, model.device)
        model.zero_grad()
        _, loss = model.forward(x, y, check_ids=False)  # bytes: always below vocab = 256
        model.backward()
        world.average_gradients(model.grads, share)
        clip_grad_norm(model.grads, 1.0)
        opt.step(lr)
        step += 1
        tokens_done += args.batch * args.context  # the global batch's
        row = [step, None, "", lr, 0, 0.0]  # the losses, the rate and the time filled in below
        rows.append(row)
        evaluating = step % args.eval_every == 0 or step == args.steps
        printing = step % args.log_every == 0 or evaluating or step == 1
        unread.append((row, loss, share))
        if printing:
            loss = read_losses()
            if loss is None:
                return 1
        elapsed = time.perf_counter() - start
        rate = tokens_done / elapsed
        vl = val_loss(model, batches, world) if evaluating else ""
        if vl != "" and not math.isfinite(vl):
            say(f"\nstep {step}: the validation loss became {vl}; stopping. The last good "
                f"checkpoint ({ckpt}) is left as it was.", file=sys.stderr)
            return 1
        if step == interrupt_at:
            stop.append(True)
        row[2:] = [vl if vl == "" else round(vl, 5), lr, round(rate), round(elapsed, 2)]
        if printing:
            left = (args.steps - step) * elapsed / (step - first_step)
            val = f" | val {vl:.4f}" if vl != "" else ""
            say(f"step {step:5d}/{args.steps} | loss {loss:.4f}{val} | {rate:6.0f} tok/s{on} | "
                f"{clock(elapsed)} elapsed | {clock(left)} left", flush=True)
        if vl != "":
            save()
    if unread and read_losses() is None:  # stopped between two progress lines
        return 1
    save()
    if world.root:
        write_log(log_path, rows)
    if world.any(stop):
        say(f"\ninterrupted: checkpoint saved at step {step} in {ckpt}; continue with --resume")
        return 130
    if not world.root:
        return 0
    png = os.path.join(args.out, "loss.png")
    if plot(png, rows):
        print(f"saved {ckpt}, {log_path} and {png}")
    else:
        print(f"saved {ckpt} and {log_path}")
        print(f"skipped the plot {png}: matplotlib is not installed ({PLOT_EXTRA})")
    if args.sample_tokens == 0:
        return 0
    prompt = data.encode("def ") if prompt is None else prompt.astype(np.int64)
    prompt = prompt[None, :cfg.max_seq - 1]  # leave room for one new token
    n_new = min(args.sample_tokens, cfg.max_seq - prompt.shape[1])
    text = data.decode(generate(model, prompt, n_new, temperature=0.8, top_k=40, seed=args.seed)[0])
    print("sample (temperature 0.8, top-k 40):\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
