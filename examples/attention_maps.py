"""Draw what every attention head of a checkpoint looks at, for a short text.

    python examples/attention_maps.py out/model.safetensors --text "def f(x): return f(x)"
    python examples/attention_maps.py out/model.safetensors --text "..." --out maps.png \\
        --npy maps.npy

Runs the model on the text's bytes (one token each), gets every layer's attention weights
from pytfm.nn.GPT.attention_probs and draws them as one grid of heatmaps, a row per layer and
a column per head, query tokens down the side, key tokens along the bottom. For each head it
prints one line of scores (pytfm.interpret, where they are defined):

  mean distance   how many tokens back the head looks on average (0: at itself)
  entropy         how spread its attention is, in nats (0: one token; log(t+1): all evenly)
  previous-token  the weight on the token just before, averaged over positions
  induction       on the positions whose byte occurred before, the weight on the byte right
                  after that earlier occurrence ("n/a" when no byte repeats): 1 for a head that
                  finds where the current text occurred before and looks at what came next

The picture goes to --out, by default out/attention.png beside train_tiny.py's files (out/ is
made for it if missing). --npy FILE also saves the weights, float32 [n_layer, n_head, T, T]. The
picture needs
matplotlib (pip install matplotlib, or pip install ".[plot]"); without it the script prints
the scores and says so. A bad flag, an empty text, a text longer than the model's context or a
checkpoint that is missing or unreadable stops the script with its usage and one line naming
the problem, exit status 2.
"""

import math
import os
import sys

import numpy as np

from pytfm import data, interpret
from pytfm.cli import load_model, new_parser

OUT = os.path.join("out", "attention.png")  # where train_tiny.py writes, by default


def parser():
    p = new_parser(__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a model.safetensors written by train_tiny.py")
    p.add_argument("--text", required=True,
                   help="the text to look at, its bytes as the shell passes them (at least 1)")
    p.add_argument("--out", default=OUT, help="the PNG to write")
    p.add_argument("--npy", help="also save the weights [n_layer, n_head, T, T] to this .npy")
    return p


def check_output(p, flag, path, made=False):
    """path names a file this process can create: its folder exists (or, made, can be made
    there when the file is written), it is not a folder."""
    if not path:
        p.error(f"{flag}: the path is empty")
    if os.path.isdir(path):
        p.error(f"{flag}: {path} is a folder; give a file name")
    folder = os.path.dirname(path) or "."
    if made and not os.path.exists(folder):
        folder = os.path.dirname(folder) or "."  # the folder is made in its parent
    if not os.path.isdir(folder):
        p.error(f"{flag}: there is no folder {folder} to write {os.path.basename(path)} in")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        p.error(f"{flag}: cannot write {path}")


def token_label(byte):
    """A byte as an axis label: printable ASCII as itself, space as ␣, others escaped."""
    if byte == 32:
        return "␣"
    if 32 < byte < 127:
        return chr(byte)
    return {9: "\\t", 10: "\\n", 13: "\\r"}.get(byte, f"\\x{byte:02x}")


def score_line(scores, h):
    ind = scores["induction"][h]
    return (f"mean distance {scores['mean_distance'][h]:5.2f} | entropy "
            f"{scores['entropy'][h]:.2f} nats | previous-token {scores['previous_token'][h]:.2f}"
            f" | induction {'n/a' if math.isnan(ind) else f'{ind:.2f}'}")


def plot(path, maps, scores, tokens):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layer, n_head, T = len(maps), maps[0].shape[1], len(tokens)
    cell = min(max(2.6, 0.16 * T + 1.0), 7.0)  # inches per heatmap: room for T labels
    fig, axes = plt.subplots(n_layer, n_head, figsize=(n_head * cell, n_layer * cell + 0.6),
                             squeeze=False, layout="constrained")
    every = max(1, math.ceil(T / 64))  # past 64 tokens, label every second (third, ...) one
    font = max(4.0, min(9.0, 0.8 * 72 * (cell - 1.0) / T * every))
    labels = [token_label(t) for t in tokens]
    future = np.triu(np.ones((T, T), bool), k=1)
    for layer in range(n_layer):
        for h in range(n_head):
            ax = axes[layer, h]
            image = ax.imshow(np.ma.masked_where(future, maps[layer][0, h]), cmap="viridis",
                              vmin=0, vmax=1)
            ticks = range(0, T, every)
            ax.set_xticks(ticks, [labels[i] for i in ticks], fontsize=font, rotation=90)
            ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=font)
            s = scores[layer]
            ind = s["induction"][h]
            ax.set_title(f"layer {layer} head {h}\ndist {s['mean_distance'][h]:.1f} · entropy "
                         f"{s['entropy'][h]:.2f} · prev {s['previous_token'][h]:.2f} · ind "
                         f"{'n/a' if math.isnan(ind) else f'{ind:.2f}'}", fontsize=8)
            if h == 0:
                ax.set_ylabel("query", fontsize=8)
            if layer == n_layer - 1:
                ax.set_xlabel("key", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(f"attention weights, {T} tokens (row: the query; white: the future, masked)",
                 fontsize=10)
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    # surrogateescape: bytes of the command line that are not UTF-8 come back as they were
    raw = args.text.encode("utf-8", "surrogateescape")
    if not raw:
        p.error("--text must not be empty: give at least one byte to look at")
    check_output(p, "--out", args.out, made=args.out == OUT)
    if args.npy is not None:
        check_output(p, "--npy", args.npy)
    model = load_model(p, args.checkpoint, tokenizer=False)[0]
    cfg = model.cfg
    if cfg.vocab != data.VOCAB:  # the text's bytes are its token ids
        p.error(f"checkpoint: its model has a vocabulary of {cfg.vocab} tokens, not the "
                f"{data.VOCAB} bytes attention_maps.py encodes text into")
    if len(raw) > cfg.max_seq:
        p.error(f"--text is {len(raw)} bytes, longer than the model's context of {cfg.max_seq}")
    tokens = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)[None, :]
    try:
        maps = model.attention_probs(tokens)
    except ValueError as e:  # more maps than a short input makes
        p.error(f"--text: {e}")
    maps = [maps[layer] for layer in range(cfg.n_layer)]
    scores = [interpret.head_scores(P, tokens) for P in maps]
    print(f"{cfg.n_layer} layers x {cfg.n_head} heads, pos={cfg.pos}, {len(raw)} tokens "
          f"(bytes) of text")
    for layer, s in enumerate(scores):
        for h in range(cfg.n_head):
            print(f"layer {layer} head {h}: {score_line(s, h)}")
    if args.npy is not None:
        with open(args.npy, "wb") as f:  # np.save(name) would add .npy to a name without it
            np.save(f, np.stack([P[0] for P in maps]))
        print(f"wrote {args.npy}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"no picture: matplotlib is not installed (pip install matplotlib, or pip "
              f"install '.[plot]' in pytfm's checkout); {args.out} not written")
        return 0
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)  # out/ for the default
    plot(args.out, maps, scores, tokens[0])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
