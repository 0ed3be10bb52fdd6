"""Watch an induction head form: a 2-layer attention-only GPT on repeated random tokens.

    python examples/induction.py             # two runs of 3000 steps: 1.5-5 min on 2 cores
    python examples/induction.py --quick     # a few steps, to see that it runs (the tests)

Each training sequence is 32 random tokens (of 64) whose end is a segment of k random tokens,
8 <= k <= 16, written twice: "... a1 a2 .. ak a1 a2 .. ak". The first copy cannot be predicted
(loss ln 64 = 4.16 nats); the second can, from a2 on, by a model that looks back: at a_i,
find the earlier a_i and read the token after it. That look-up is an induction head (Olsson et
al. 2022), built from two heads in two layers: in layer 0 a previous-token head writes "the
token before me was a_{i-1}" into each position; in layer 1 the induction head's query a_i
matches the key "the token before me was a_i", found at the a_{i+1} of the first copy, and
copies a_{i+1} to the output. k varies from sequence to sequence, so a head that looks a fixed
distance back cannot do it; it must match content.

The script trains the same model twice, with RoPE positions and with pos='none', and every
--eval-every steps measures on 64 held-out sequences the loss on the second copy (from a2 on),
the loss on the rest (random tokens) and each head's scores (pytfm.interpret: induction score
in layer 1, previous-token score in layer 0). The induction head has formed at the first
evaluation where a layer-1 head's induction score reaches 0.5 (uniform attention: 0.06): the
in-context loss, on the second copy, falls at that moment from above 3 nats towards 0.
Without positions, layer 0 cannot tell the previous token from any other (keys carry no
position), no previous-token head can form, and neither can the induction head: the loss on
the second copy stays near that on the random rest.

The model is attention-only, as in Olsson et al.'s small models: each block's MLP is zeroed and
kept at zero (its output is then exactly 0). With the MLPs trained too, 3000 to 5000 steps at
these settings were not enough in our tries: the model first settles on cheaper tricks
(guessing among the tokens seen so far), and the induction head comes much later.

Prints the numbers; writes OUT/induction.csv and, with matplotlib, OUT/induction.png: the
losses and scores over training with the moment marked, and the attention maps of the heads.
A bad flag stops the script with its usage and one line naming the flag, exit status 2.
"""

import csv
import math
import os
import sys
import time

import numpy as np

from pytfm import interpret
from pytfm.cli import make_out_folder, new_parser
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm, cosine_lr

VOCAB, T, SHORTEST, LONGEST = 64, 32, 8, 16  # tokens, sequence length, segment lengths k
FORMED = 0.5  # the induction score that counts as formed
N_EVAL = 64  # held-out sequences


def parser():
    p = new_parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, help="training steps per run (default: 3000; "
                   "--quick: 30)")
    p.add_argument("--eval-every", type=int, help="steps between measurements (default: 50; "
                   "--quick: 10)")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--seed", type=int, default=0, help="the models' and the data's")
    p.add_argument("--out", default="out", help="folder for induction.png and induction.csv")
    p.add_argument("--quick", action="store_true", help="30 steps: a smoke run (too short for "
                   "an induction head)")
    return p


def parse_args(argv=None):
    p = parser()
    args = p.parse_args(argv)
    for name, full, quick in (("steps", 3000, 30), ("eval_every", 50, 10)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    for name, low in (("steps", 1), ("eval_every", 1), ("batch", 1), ("seed", 0)):
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    if not 0 < args.lr < math.inf:
        p.error(f"--lr must be finite and > 0, got {args.lr}")
    make_out_folder(p, args.out)
    return args


def repeated_tokens(rng, batch):
    """-> x, y (batch, T) and second (batch, T): True where y is a2 .. ak of the second copy."""
    seq = rng.integers(0, VOCAB, (batch, T + 1))
    second = np.zeros((batch, T), bool)
    for b in range(batch):
        k = rng.integers(SHORTEST, LONGEST + 1)
        start = T + 1 - 2 * k  # the first copy; the second ends the sequence
        seq[b, start + k:] = seq[b, start:start + k]
        second[b, start + k:] = True  # x = a1 .. a(k-1) of the second copy predicts a2 .. ak
    return seq[:, :-1].copy(), seq[:, 1:].copy(), second


def token_losses(logits, y):  # (B, T, vocab), (B, T) -> (B, T): −log p(y)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_p, y[..., None], axis=-1)[..., 0]


def measure(model, x, y, second):
    """The loss on the second copy (a2 .. ak) and on the rest (the random tokens before it),
    and every head's scores, on the held-out sequences."""
    logits, _ = model.forward(x, save=False)
    nll = token_losses(logits, y)
    maps = model.attention_probs(x)
    return {"rest": float(nll[~second].mean()), "second": float(nll[second].mean()),
            "induction": interpret.induction(maps[1], x),
            "previous": interpret.previous_token(maps[0])}


def train(pos, args, held_out):
    """Train one model -> (model, history: a list of (step, measurements))."""
    cfg = GPTConfig(vocab=VOCAB, d_model=64, n_layer=2, n_head=4, max_seq=T, pos=pos,
                    seed=args.seed)
    model = GPT(cfg)
    mlp = [name for name in model.params if ".mlp." in name]  # attention-only: MLPs stay 0
    for name in mlp:
        model.params[name].fill(0.0)
    opt = AdamW(model.params, model.grads, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng([args.seed, 1])
    history, start = [], time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            m = measure(model, *held_out)
            history.append((step, m))
            if step % (5 * args.eval_every) == 0 or step == args.steps:
                print(f"pos={pos:4s} step {step:5d} | loss second copy {m['second']:.3f}, rest "
                      f"{m['rest']:.3f} | induction (layer 1) {fmt(m['induction'])} | "
                      f"previous-token (layer 0) {fmt(m['previous'])} | "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
        if step == args.steps:
            break
        x, y, _ = repeated_tokens(rng, args.batch)
        model.zero_grad()
        model.forward(x, y)
        model.backward()
        for name in mlp:
            model.grads[name].fill(0.0)
        clip_grad_norm(model.grads, 1.0)
        opt.step(cosine_lr(step, args.lr, 20, args.steps, min_lr=args.lr / 10))
    return model, history


def fmt(scores):
    return " ".join(f"{s:.2f}" for s in scores)


def formed_at(history):
    """The first step whose best layer-1 induction score reaches FORMED, or None."""
    return next((step for step, m in history if m["induction"].max() >= FORMED), None)


def summary(pos, history, chance):
    step0 = history[0][0]
    end_step, last = history[-1]
    at = formed_at(history)
    head = int(np.argmax(last["induction"]))
    print(f"\npos={pos}: ", end="")
    if at is None:
        print(f"no induction head formed in {end_step} steps: the best layer-1 head's induction "
              f"score is {last['induction'].max():.2f} (head {head}; uniform attention: "
              f"{chance:.2f}; formed means >= {FORMED})")
    else:
        # the in-context loss some steps before, at and after that moment
        around = [min(history, key=lambda h: abs(h[0] - step))
                  for step in (at - 250, at, at + 250)]
        print(f"an induction head formed at step {at} (the first measurement, every "
              f"{history[1][0] - step0} steps, where a layer-1 head's induction score reached "
              f"{FORMED}; uniform attention: {chance:.2f}). The in-context loss: "
              + ", ".join(f"{m['second']:.2f} nats at step {step}" for step, m in around))
    print(f"  at step {end_step}: loss on the second copy {last['second']:.3f} nats, on the rest "
          f"{last['rest']:.3f} (random tokens: ln {VOCAB} = {math.log(VOCAB):.2f})")
    print(f"  induction scores of layer 1's heads: {fmt(last['induction'])} (best: head {head})")
    print(f"  previous-token scores of layer 0's heads: {fmt(last['previous'])}")
    return at


def write_csv(path, results):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        heads = len(results["rope"][1][0][1]["induction"])
        w.writerow(["pos", "step", "loss_second_copy", "loss_rest"]
                   + [f"induction_l1_h{h}" for h in range(heads)]
                   + [f"previous_token_l0_h{h}" for h in range(heads)])
        for pos, (_, history) in results.items():
            for step, m in history:
                w.writerow([pos, step, round(m["second"], 5), round(m["rest"], 5),
                            *np.round(m["induction"], 4), *np.round(m["previous"], 4)])


def draw_map(ax, P, tokens, second, title):
    """One head's attention map on one sequence, the copies' boundaries marked."""
    Tq = len(tokens)
    image = ax.imshow(np.ma.masked_where(np.triu(np.ones((Tq, Tq), bool), 1), P), cmap="viridis",
              vmin=0, vmax=1)
    ax.set_xticks(range(Tq), [str(t) for t in tokens], rotation=90, fontsize=5)
    ax.set_yticks(range(Tq), [str(t) for t in tokens], fontsize=5)
    k = int(second.sum()) + 1
    for edge in (Tq - 2 * k + 0.5, Tq - k + 0.5):  # x holds the tokens up to a_(k-1)
        ax.axvline(edge, color="white", lw=0.6, ls="--")
        ax.axhline(edge, color="white", lw=0.6, ls="--")
    ax.set_xlabel("key (token id)", fontsize=8)
    ax.set_ylabel("query (token id)", fontsize=8)
    ax.set_title(title, fontsize=9)
    return image


def plot(path, results, held_out, formed):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(15, 9.5))
    grid = fig.add_gridspec(2, 7, height_ratios=[1, 1.15], width_ratios=[1] * 6 + [0.1])
    ax_loss, ax_score = fig.add_subplot(grid[0, :3]), fig.add_subplot(grid[0, 3:])
    for pos, color in (("rope", "C0"), ("none", "C3")):
        steps = [s for s, _ in results[pos][1]]
        hist = [m for _, m in results[pos][1]]
        ax_loss.plot(steps, [m["second"] for m in hist], color=color,
                     label=f"pos={pos}: second copy (in-context)")
        ax_loss.plot(steps, [m["rest"] for m in hist], color=color, ls=":",
                     label=f"pos={pos}: the rest (random)")
        ax_score.plot(steps, [m["induction"].max() for m in hist], color=color,
                      label=f"pos={pos}: best layer-1 induction score")
        ax_score.plot(steps, [m["previous"].max() for m in hist], color=color, ls="--",
                      label=f"pos={pos}: best layer-0 previous-token score")
    ax_score.axhline(FORMED, color="grey", lw=0.8, ls=":")
    for ax, y, corner in ((ax_loss, 0.88, "center right"), (ax_score, 0.97, "upper left")):
        if formed is not None:
            ax.axvline(formed, color="black", lw=1, ls="--")
            ax.text(formed, y, f" induction head\n forms (step {formed})",
                    transform=ax.get_xaxis_transform(), va="top", fontsize=8)
        ax.set_xlabel("training step")
        ax.legend(fontsize=8, loc=corner)
    ax_loss.axhline(math.log(VOCAB), color="grey", lw=0.8, ls=":")
    ax_loss.set_ylabel("loss (nats/token)")
    ax_loss.set_title(f"loss on held-out sequences (ln {VOCAB} = {math.log(VOCAB):.2f}: a guess)")
    ax_score.set_ylim(0, 1)
    ax_score.set_ylabel("score")
    ax_score.set_title(f"head scores over training (formed: induction >= {FORMED})")

    x, _, second = held_out
    b = int(np.argmax(second.sum(axis=1)))  # the held-out sequence with the longest repeat
    rope_maps = results["rope"][0].attention_probs(x[b:b + 1])  # the trained models' maps
    none_maps = results["none"][0].attention_probs(x[b:b + 1])
    rope_end, none_end = results["rope"][1][-1][1], results["none"][1][-1][1]
    prev_head = int(np.argmax(rope_end["previous"]))
    ind_head = int(np.argmax(rope_end["induction"]))
    none_head = int(np.argmax(none_end["induction"]))
    panels = [(rope_maps[0][0, prev_head], f"pos=rope, layer 0 head {prev_head}: previous-token"
               f" {rope_end['previous'][prev_head]:.2f}"),
              (rope_maps[1][0, ind_head], f"pos=rope, layer 1 head {ind_head}: induction "
               f"{rope_end['induction'][ind_head]:.2f}"),
              (none_maps[1][0, none_head], f"pos=none, layer 1 head {none_head}: induction "
               f"{none_end['induction'][none_head]:.2f}")]
    for i, (P, title) in enumerate(panels):
        image = draw_map(fig.add_subplot(grid[1, 2 * i:2 * i + 2]), P, x[b], second[b], title)
    fig.colorbar(image, cax=fig.add_subplot(grid[1, 6]), label="attention weight")
    fig.suptitle("an induction head forming in a 2-layer attention-only GPT (dashed white: "
                 "where the repeated segment starts, and its second copy)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    held_out = repeated_tokens(np.random.default_rng([args.seed, 2]), N_EVAL)
    x = held_out[0]
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]  # row t: 1/(t+1)
    chance = float(interpret.induction(np.broadcast_to(uniform, (N_EVAL, 1, T, T)), x)[0])
    start = time.perf_counter()
    results = {}
    for pos in ("rope", "none"):
        results[pos] = train(pos, args, held_out)
    seconds = time.perf_counter() - start
    formed = summary("rope", results["rope"][1], chance)
    summary("none", results["none"][1], chance)
    print(f"\ntraining and measuring took {seconds:.0f} s")
    write_csv(os.path.join(args.out, "induction.csv"), results)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"wrote {os.path.join(args.out, 'induction.csv')}; no picture: matplotlib is not "
              "installed (pip install matplotlib, or pip install '.[plot]' in pytfm's checkout)")
        return 0
    path = os.path.join(args.out, "induction.png")
    plot(path, results, held_out, formed)
    print(f"wrote {path} and {os.path.join(args.out, 'induction.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
