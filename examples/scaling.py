"""A small compute-optimal scaling sweep, in the manner of Hoffmann et al. 2022 ("Chinchilla").

    python examples/scaling.py              # 5 sizes x 3 budgets: about 30 min on 2 cores
    python examples/scaling.py --quick      # a toy sweep in seconds (what the tests run)

Training a model of N parameters on D tokens costs about C = 6·N·D floating-point operations
(2·N per token for the forward pass, 4·N for the backward). For each compute budget C in
--budgets and each model size in --sizes, the script trains a fresh model on the stdlib corpus
(pytfm.data, as train_tiny.py) for D = C / (6·N) tokens, the learning rate on a cosine
schedule that ends with the run, and measures its loss on the whole held-out tenth of the
corpus (the same 400k bytes for every run). At a fixed budget a small model sees many tokens
and a large one few; somewhere between lies the size N*(C) with the lowest loss. The script
finds it two ways:

  1. isoFLOP parabolas (Hoffmann et al.'s approach 2): per budget, fit loss = a·(ln N)² +
     b·ln N + c through the sizes; N* is the minimum, exp(−b / 2a) (trusted only when it lies
     within the sizes tried). Then a straight line through ln N* against ln C gives N* ∝ C^a,
     D* = C / (6·N*), and the tokens-per-parameter ratio D*/N* of a compute-optimal model.
  2. a loss surface (their approach 3): loss(N, D) = E + A/N^α + B/D^β fitted to every run
     (least squares for E, A, B on a grid of α, β), whose minimum along C = 6·N·D is
     N* = G·(C/6)^(β/(α+β)), G = (α·A / (β·B))^(1/(α+β)).

N counts every parameter, the (tied) embedding table included, as Hoffmann et al. count them.
Each finished run is appended to OUT/scaling.jsonl at once: a rerun skips the runs found there
(with the same settings) and trains only the missing ones, so an interrupted sweep resumes
where it stopped. The fits are printed and, with matplotlib, drawn in OUT/scaling.png.
A bad flag stops the script with its usage and one line naming the flag, exit status 2.
"""

import json
import math
import os
import sys
import time

import numpy as np

from pytfm import data
from pytfm.cli import make_out_folder, new_parser
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr

# (d_model, n_layer, n_head): 10.7k, 20.6k, 33.7k, 97k and 216k parameters
SIZES = "16x2x2,24x2x2,32x2x2,48x3x3,64x4x4"
BUDGETS = "3e11,1e12,3e12"  # FLOPs; the largest one takes about 2/3 of the sweep's time
QUICK = dict(sizes="8x1x1,16x1x2,24x2x2", budgets="2e8,6e8", context=16, batch=8,
             val_tokens=16384)
CHINCHILLA_RATIO = 20  # tokens per parameter of a compute-optimal model (Hoffmann et al.)


def parser():
    p = new_parser(__doc__.splitlines()[0])
    p.add_argument("--out", default="out", help="folder for scaling.jsonl and scaling.png")
    p.add_argument("--quick", action="store_true",
                   help="a toy sweep (3 tiny sizes, 2 tiny budgets, context 16): seconds")
    p.add_argument("--sizes", help="comma-separated d_model x n_layer x n_head (default: "
                   f"{SIZES})")
    p.add_argument("--budgets", help=f"comma-separated FLOPs (default: {BUDGETS})")
    p.add_argument("--context", type=int, help="tokens per window (default: 64)")
    p.add_argument("--batch", type=int, help="windows per step (default: 16)")
    p.add_argument("--val-tokens", type=int, help="the validation loss is measured on this "
                   "many tokens of the held-out text (default: 0, all of it, 400k)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--seed", type=int, default=0, help="the models' and the data's")
    return p


def parse_sizes(p, text):
    sizes = []
    for item in text.split(","):
        try:
            d, layers, heads = (int(v) for v in item.strip().split("x"))
            GPTConfig(d_model=d, n_layer=layers, n_head=heads)
        except ValueError as e:
            detail = str(e) if "x" in item and item.count("x") == 2 else "not DxLxH"
            p.error(f"--sizes: {item.strip()!r}: {detail} (e.g. 64x4x4: d_model 64, 4 layers, "
                    "4 heads)")
        sizes.append((d, layers, heads))
    if len(sizes) < 3:
        p.error(f"--sizes: a parabola needs at least 3 sizes, got {len(sizes)}")
    return sizes


def parse_budgets(p, text):
    try:
        budgets = sorted(float(v) for v in text.split(","))
    except ValueError:
        p.error(f"--budgets: {text!r} is not a comma-separated list of numbers")
    if not all(0 < c < math.inf for c in budgets):
        p.error(f"--budgets must be finite and > 0, got {text}")
    return budgets


def parse_args(argv=None):
    """The flags, checked, with the defaults of the full or the --quick sweep filled in."""
    p = parser()
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else dict(sizes=SIZES, budgets=BUDGETS, context=64,
                                             batch=16, val_tokens=0)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name, low in (("context", 2), ("batch", 1), ("val_tokens", 0), ("seed", 0)):
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    if not 0 < args.lr < math.inf:
        p.error(f"--lr must be finite and > 0, got {args.lr}")
    args.sizes, args.budgets = parse_sizes(p, args.sizes), parse_budgets(p, args.budgets)
    make_out_folder(p, args.out)  # last: a bad flag leaves no folder behind
    return args


# ---- one run -----------------------------------------------------------------------------------


def run_key(args, size, budget):
    """What makes two runs the same run: a rerun skips a finished run with this key."""
    return {"d_model": size[0], "n_layer": size[1], "n_head": size[2], "budget": budget,
            "context": args.context, "batch": args.batch, "lr": args.lr, "seed": args.seed,
            "val_tokens": args.val_tokens}


def train_run(args, size, budget, batches):
    """Train a fresh model of `size` on C / (6·N) tokens -> the run's record."""
    d, layers, heads = size
    cfg = GPTConfig(d_model=d, n_layer=layers, n_head=heads, max_seq=args.context,
                    seed=args.seed)
    model = GPT(cfg)
    opt = AdamW(model.params, model.grads, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    n_params = model.num_params()
    tokens_per_step = args.batch * args.context
    steps = max(1, round(budget / (6 * n_params * tokens_per_step)))
    warmup = min(100, steps // 10)
    start, recent = time.perf_counter(), []
    for step in range(steps):
        lr = cosine_lr(step, args.lr, warmup, steps, min_lr=args.lr / 10)
        x, y = batches.batch("train", step)  # every run sees the same windows in the same order
        model.zero_grad()
        _, loss = model.forward(x, y)
        model.backward()
        clip_grad_norm(model.grads, 1.0)
        opt.step(lr)
        recent = (recent + [float(loss)])[-50:]
    val = val_loss(model, batches.splits["val"], args.context, args.val_tokens)
    tokens = steps * tokens_per_step
    return dict(run_key(args, size, budget), params=n_params, steps=steps, tokens=tokens,
                flops=6 * n_params * tokens, train_loss=round(float(np.mean(recent)), 5),
                val_loss=round(float(val), 5), seconds=round(time.perf_counter() - start, 1))


def val_loss(model, text, context, limit, batch=64):
    """The mean loss over the held-out text (its first `limit` tokens; 0: all), cut into
    windows of `context` tokens: the same bytes for every run, so that the runs differ only in
    what they learnt, not in which windows were drawn to test them."""
    text = (text[:limit + 1] if limit else text).astype(np.int64)  # bytes: ids are int64
    n = (len(text) - 1) // context
    x, y = text[:n * context].reshape(n, context), text[1:n * context + 1].reshape(n, context)
    total = sum(float(model.forward(x[i:i + batch], y[i:i + batch], save=False)[1])
                * len(x[i:i + batch]) for i in range(0, n, batch))
    return total / n


def read_runs(path):
    """The records in scaling.jsonl; a line a killed run left half-written is skipped."""
    runs = []
    if not os.path.exists(path):
        return runs
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"note: {path} line {number} is not a whole record; ignored",
                      file=sys.stderr)
    return runs


def append_run(path, record):
    """Append one record as one line, on disk before the next run starts."""
    with open(path, "a+") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:  # a killed write may have left a line without its newline
            f.seek(f.tell() - 1)
            if f.read(1) != "\n":
                f.write("\n")
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


# ---- the fits ----------------------------------------------------------------------------------


def isoflop_optimum(params, losses):
    """Fit loss = a·x² + b·x + c, x = ln N, through one budget's runs -> (N*, loss at N*,
    (a, b, c), bracketed): N* is the parabola's minimum; bracketed says it lies within the sizes
    tried (outside them, or with a <= 0, it is a guess and N* is the best size tried)."""
    x, y = np.log(params), np.asarray(losses)
    a, b, c = np.polyfit(x, y, 2)
    if a <= 0:
        best = int(np.argmin(y))
        return params[best], y[best], (a, b, c), False
    x_star = -b / (2 * a)
    return math.exp(x_star), a * x_star**2 + b * x_star + c, (a, b, c), \
        x.min() <= x_star <= x.max()


def power_law(budgets, optima):
    """A straight line through (ln C, ln N*) -> (exponent, prefactor): N* = k·C^a."""
    a, ln_k = np.polyfit(np.log(budgets), np.log(optima), 1)
    return a, math.exp(ln_k)


def loss_surface(params, tokens, losses):
    """loss = E + A/N^α + B/D^β: for each (α, β) on a grid, E, A, B by least squares (kept only
    when all three are >= 0); the best fit -> (E, A, B, α, β, rms error)."""
    N, D, y = np.asarray(params, float), np.asarray(tokens, float), np.asarray(losses)
    best = None
    for alpha in np.arange(0.05, 1.2, 0.01):
        for beta in np.arange(0.05, 1.2, 0.01):
            X = np.stack([np.ones_like(N), N**-alpha, D**-beta], axis=1)
            coef, *_ = np.linalg.lstsq(X, y, rcond=None)
            if (coef < 0).any():
                continue
            rms = float(np.sqrt(np.mean((X @ coef - y) ** 2)))
            if best is None or rms < best[-1]:
                best = (*coef, alpha, beta, rms)
    return best


def surface_optimum(fit, budget):
    """N* and D* of the loss surface along C = 6·N·D."""
    _, A, B, alpha, beta, _ = fit
    G = (alpha * A / (beta * B)) ** (1 / (alpha + beta))
    n_star = G * (budget / 6) ** (beta / (alpha + beta))
    return n_star, budget / (6 * n_star)


def report(runs, budgets):
    """Print the fits -> what plot() draws."""
    print("\nvalidation loss (nats/byte) by budget and size:")
    fits = {}
    for budget in budgets:
        rows = sorted((r for r in runs if r["budget"] == budget), key=lambda r: r["params"])
        if len(rows) < 3:
            print(f"  C = {budget:.0e}: only {len(rows)} runs, no parabola")
            continue
        for r in rows:
            print(f"  C = {budget:.0e}  N = {r['params']:>9,}  D = {r['tokens']:>11,}  "
                  f"D/N = {r['tokens'] / r['params']:7.1f}  loss {r['val_loss']:.4f}")
        n_star, loss_star, coef, bracketed = isoflop_optimum(
            [r["params"] for r in rows], [r["val_loss"] for r in rows])
        ratio = budget / (6 * n_star**2)
        fits[budget] = dict(rows=rows, n_star=n_star, loss_star=loss_star, coef=coef,
                            bracketed=bracketed)
        note = "" if bracketed else "  (NOT within the sizes tried: a guess)"
        print(f"  -> N* = {n_star:,.0f}, D* = {budget / (6 * n_star):,.0f}, D*/N* = {ratio:.1f}, "
              f"loss {loss_star:.4f}{note}")
    good = [c for c in fits if fits[c]["bracketed"]]
    summary = {"fits": fits}
    print(f"\nHoffmann et al. 2022 found about {CHINCHILLA_RATIO} tokens per parameter, "
          "N* ∝ C^0.50.")
    if len(good) >= 2:
        a, k = power_law(good, [fits[c]["n_star"] for c in good])
        middle = math.exp(np.mean(np.log(good)))
        n_mid = k * middle**a
        summary.update(exponent=a, prefactor=k, middle=middle, ratio=middle / (6 * n_mid**2))
        print(f"isoFLOP parabolas ({len(good)} budgets): N* ∝ C^{a:.2f}, D* ∝ C^{1 - a:.2f}; "
              f"at C = {middle:.1e}: N* = {n_mid:,.0f}, tokens per parameter D*/N* = "
              f"{summary['ratio']:.1f}")
    else:
        print(f"isoFLOP parabolas: {len(good)} budget(s) with an optimum within the sizes "
              "tried; a power law needs 2")
    surface = loss_surface([r["params"] for r in runs], [r["tokens"] for r in runs],
                           [r["val_loss"] for r in runs]) if len(runs) >= 5 else None
    if surface is not None:
        E, A, B, alpha, beta, rms = surface
        middle = math.exp(np.mean(np.log(budgets)))
        n_star, d_star = surface_optimum(surface, middle)
        summary.update(surface=surface, surface_ratio=d_star / n_star)
        print(f"loss surface: loss = {E:.3f} + {A:.3g}/N^{alpha:.2f} + {B:.3g}/D^{beta:.2f} "
              f"(rms error {rms:.4f}); N* ∝ C^{beta / (alpha + beta):.2f}; at C = {middle:.1e}: "
              f"N* = {n_star:,.0f}, D*/N* = {d_star / n_star:.1f}")
    return summary


def plot(path, runs, budgets, summary):
    """isoFLOP curves, N*(C) and D*(C) against the 20-tokens-per-parameter rule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, len(budgets)))
    for budget, color in zip(budgets, colors):
        rows = sorted((r for r in runs if r["budget"] == budget), key=lambda r: r["params"])
        ax1.plot([r["params"] for r in rows], [r["val_loss"] for r in rows], "o", color=color,
                 label=f"C = {budget:.0e} FLOPs")
        fit = summary["fits"].get(budget)
        if fit is None:
            continue
        x = np.linspace(math.log(rows[0]["params"]), math.log(rows[-1]["params"]), 100)
        ax1.plot(np.exp(x), np.polyval(fit["coef"], x), "-", color=color, alpha=0.7)
        ax1.plot(fit["n_star"], fit["loss_star"], "*", color=color, markersize=16,
                 markeredgecolor="black", alpha=1.0 if fit["bracketed"] else 0.3)
        ax1.annotate(f"D*/N* = {budget / (6 * fit['n_star'] ** 2):.0f}",
                     (fit["n_star"], fit["loss_star"]), xytext=(0, -18),
                     textcoords="offset points", ha="center", fontsize=8)
    ax1.set_xscale("log")
    ax1.margins(y=0.1)  # room for the labels under the stars
    ax1.set_xlabel("parameters N")
    ax1.set_ylabel("validation loss (nats/byte)")
    ax1.set_title("isoFLOP curves: loss at fixed compute (★ the fitted optimum)")
    ax1.legend()

    fits = summary["fits"]
    cs = np.array(sorted(fits))
    c_line = np.geomspace(budgets[0] / 2, budgets[-1] * 2, 50)
    for budget in cs:
        fit = fits[budget]
        style = dict(markersize=9, alpha=1.0 if fit["bracketed"] else 0.3)
        ax2.plot(budget, fit["n_star"], "o", color="C0", **style)
        ax2.plot(budget, budget / (6 * fit["n_star"]), "s", color="C1", **style)
    if "exponent" in summary:
        n_fit = summary["prefactor"] * c_line ** summary["exponent"]
        ax2.plot(c_line, n_fit, "-", color="C0",
                 label=f"N* ∝ C^{summary['exponent']:.2f} (parabolas)")
        ax2.plot(c_line, c_line / (6 * n_fit), "-", color="C1",
                 label=f"D* = C/(6N*): {summary['ratio']:.0f} tokens per parameter at "
                 f"C = {summary['middle']:.1e}")
    if "surface" in summary:
        n_surface = np.array([surface_optimum(summary["surface"], c)[0] for c in c_line])
        ax2.plot(c_line, n_surface, "--", color="grey", lw=1,
                 label=f"N* of the loss surface: {summary['surface_ratio']:.0f} tokens/parameter")
    n_20 = np.sqrt(c_line / (6 * CHINCHILLA_RATIO))
    ax2.plot(c_line, n_20, ":", color="C0", label=f"N at {CHINCHILLA_RATIO} tokens/parameter")
    ax2.plot(c_line, CHINCHILLA_RATIO * n_20, ":", color="C1",
             label=f"D at {CHINCHILLA_RATIO} tokens/parameter")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("compute C (FLOPs)")
    ax2.set_ylabel("compute-optimal N* (circles) and D* (squares)")
    ax2.set_xticks(budgets, [f"{c:.0e}" for c in budgets])
    ax2.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.set_title("the compute-optimal frontier (faded: optimum not bracketed)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    results = os.path.join(args.out, "scaling.jsonl")
    done = read_runs(results)
    batches = data.Batches(data.stdlib_corpus(), args.context, args.batch, seed=args.seed)
    plan = [(size, budget) for budget in args.budgets for size in args.sizes]
    runs, start = [], time.perf_counter()
    for i, (size, budget) in enumerate(plan, 1):
        key = run_key(args, size, budget)
        found = [r for r in done if all(r.get(k) == v for k, v in key.items())]
        if found:
            runs.append(found[-1])
            print(f"[{i}/{len(plan)}] C = {budget:.0e}, {size[0]}x{size[1]}x{size[2]}: "
                  f"found in {results}, skipped")
            continue
        record = train_run(args, size, budget, batches)
        append_run(results, record)
        runs.append(record)
        print(f"[{i}/{len(plan)}] C = {budget:.0e}, {size[0]}x{size[1]}x{size[2]}: "
              f"N = {record['params']:,}, {record['steps']:,} steps, D = {record['tokens']:,} "
              f"-> val loss {record['val_loss']:.4f} ({record['seconds']:.0f} s; "
              f"{time.perf_counter() - start:.0f} s so far)", flush=True)
    summary = report(runs, args.budgets)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("\nno picture: matplotlib is not installed (pip install matplotlib, or "
              "pip install '.[plot]' in pytfm's checkout); the numbers are above")
        return 0
    path = os.path.join(args.out, "scaling.png")
    plot(path, runs, args.budgets, summary)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
