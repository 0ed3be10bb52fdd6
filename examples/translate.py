"""Train the encoder–decoder Transformer to translate numbers from English words to German words.

    python examples/translate.py                 # about 2 minutes on 2 cores, then the scores
    python examples/translate.py --beam 8 --plot attention.png
    python examples/translate.py --device cuda   # on the GPU (CuPy, CUDA build)
    python examples/translate.py --quick         # a few seconds: the pipeline, not the accuracy

The task, generated here (no download): a number in 0 .. 999999, written in English words, to
the same number in German words, a word per token, German compounds split at their parts:

    two hundred forty two                  ->  zwei hundert zwei und vierzig
    seventy one thousand one               ->  ein und siebzig tausend eins
    nine hundred thirteen thousand sixty   ->  neun hundert dreizehn tausend sechzig

German says the units before the tens ("zwei und vierzig", two-and-forty), so each tens-units
pair is reordered: to write "zwei" the decoder must look past "forty" to the source's next
word, and then back for "vierzig". The one is "eins" at the end of a number and "ein" before
"und", "hundert" or "tausend", which the decoder can only tell from what follows in the source.
A word-by-word copy (or any monotone alignment) cannot do it; cross-attention can, and the
picture (--plot) shows its alignment cross over at each pair. The default run (0.24M
parameters, 5000 steps of 64 sentences) gets every held-out number right; the last thing it
learns is the rare "eins" after "hundert" (... hundred one), which shorter runs write "ein".

Numbers are drawn by their count of digits (1 to 6, equally likely), then uniformly. The
held-out test set is 500 numbers of 3 to 6 digits, drawn with their own seed; training never
sees one of them, nor the picture's 242042 (it draws again). Exact match: the whole German
sentence right, EOS included.

The calls, in order: the vocabularies and the batches (numpy), pytfm.seq2seq.Transformer,
pytfm.optim.AdamW with the paper's warm-up schedule (transformer_lr) and betas, the loss with
label smoothing 0.1 (model.forward(..., label_smoothing=)), model.backward(), then
pytfm.beam.greedy_decode and beam_search on the test set, and model.cross_attention_probs for
one sentence's picture.
"""

import argparse
import os
import sys
import time

import numpy as np

from pytfm.beam import beam_search, greedy_decode
from pytfm.optim import AdamW, clip_grad_norm, transformer_lr
from pytfm.seq2seq import Seq2SeqConfig, Transformer

# ---- the task ---------------------------------------------------------------------------------

EN_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
           "eighteen", "nineteen"]
EN_TENS = [None, None, "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
           "ninety"]
DE_ONES = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun",
           "zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn",
           "achtzehn", "neunzehn"]
DE_TENS = [None, None, "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig",
           "achtzig", "neunzig"]


def english(n):
    """0 <= n < 10**6 -> a list of words: 242 -> two hundred forty two."""
    def below_1000(n):
        h, r = divmod(n, 100)
        words = [EN_ONES[h], "hundred"] if h else []
        if r >= 20:
            words += [EN_TENS[r // 10]] + ([EN_ONES[r % 10]] if r % 10 else [])
        elif r:
            words += [EN_ONES[r]]
        return words

    if n == 0:
        return ["zero"]
    thousands, rest = divmod(n, 1000)
    words = below_1000(thousands) + ["thousand"] if thousands else []
    return words + below_1000(rest)


def german(n):
    """0 <= n < 10**6 -> a list of words: 242 -> zwei hundert zwei und vierzig; 'eins' only
    at the end of the number ('ein' before und, hundert, tausend)."""
    def below_1000(n, last):
        h, r = divmod(n, 100)
        words = ["ein" if h == 1 else DE_ONES[h], "hundert"] if h else []
        if r >= 20:
            u = r % 10
            words += (["ein" if u == 1 else DE_ONES[u], "und"] if u else []) + [DE_TENS[r // 10]]
        elif r:
            words += ["ein" if r == 1 and not last else DE_ONES[r]]
        return words

    if n == 0:
        return ["null"]
    thousands, rest = divmod(n, 1000)
    words = below_1000(thousands, last=False) + ["tausend"] if thousands else []
    return words + below_1000(rest, last=True)


BOS, EOS = "<bos>", "<eos>"
SRC_WORDS = sorted({w for n in range(1000) for w in english(n)} | {"thousand"})
TGT_WORDS = [BOS, EOS] + sorted({w for n in range(1000) for w in german(n)} | {"ein",
                                                                                 "tausend"})
SRC_ID = {w: i for i, w in enumerate(SRC_WORDS)}
TGT_ID = {w: i for i, w in enumerate(TGT_WORDS)}
PICTURE = 242042  # the number whose cross-attention --plot draws
MAX_WORDS = 14  # decoding's limit: the longest German number is 11 words, 12 with EOS


def draw_numbers(rng, count, digits=(1, 6), exclude=frozenset()):
    """count numbers: a count of digits uniform in digits (1 digit includes 0), then a number
    of that many digits uniformly; none in exclude."""
    out = []
    while len(out) < count:
        d = int(rng.integers(digits[0], digits[1] + 1))
        n = int(rng.integers(0 if d == 1 else 10 ** (d - 1), 10 ** d))
        if n not in exclude:
            out.append(n)
    return out


def batch(numbers):
    """-> src (B, Ts), src_lens, tgt_in (B, Tt) (BOS first), tgt_out (EOS last), tgt_lens;
    padding 0 (any id would do: the lengths mask it)."""
    srcs = [[SRC_ID[w] for w in english(n)] for n in numbers]
    tgts = [[TGT_ID[w] for w in german(n)] for n in numbers]
    B, Ts, Tt = len(numbers), max(map(len, srcs)), max(map(len, tgts)) + 1
    src, tgt_in, tgt_out = (np.zeros((B, T), np.int64) for T in (Ts, Tt, Tt))
    for b, (s, t) in enumerate(zip(srcs, tgts)):
        src[b, :len(s)] = s
        tgt_in[b, :len(t) + 1] = [TGT_ID[BOS]] + t
        tgt_out[b, :len(t) + 1] = t + [TGT_ID[EOS]]
    src_lens = np.array([len(s) for s in srcs], np.int64)
    tgt_lens = np.array([len(t) + 1 for t in tgts], np.int64)
    return src, src_lens, tgt_in, tgt_out, tgt_lens


def words(ids):
    """Target ids -> text, up to the first EOS."""
    ids = list(ids)
    ids = ids[:ids.index(TGT_ID[EOS])] if TGT_ID[EOS] in ids else ids
    return " ".join(TGT_WORDS[i] for i in ids)


# ---- the run ----------------------------------------------------------------------------------


def positive(name):
    def parse(text):
        v = int(text)
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {v}")
        return v
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=positive("--steps"), default=None,
                   help="training steps (default 5000; --quick: 20)")
    p.add_argument("--batch", type=positive("--batch"), default=64, help="sentences per step")
    p.add_argument("--d-model", type=positive("--d-model"), default=None,
                   help="model width (default 64; --quick: 16); 4 heads, d_ff 4x")
    p.add_argument("--layers", type=positive("--layers"), default=None,
                   help="encoder and decoder layers each (default 2; --quick: 1)")
    p.add_argument("--seed", type=int, default=0, help="model and training data seed")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--beam", type=positive("--beam"), default=4, help="beam width")
    p.add_argument("--plot", default="translate_attention.png",
                   help="the cross-attention picture's path (needs matplotlib; '': none)")
    p.add_argument("--quick", action="store_true",
                   help="a very short run (for the tests): tiny model, 20 steps, 40 test sentences")
    args = p.parse_args(argv)
    if args.seed < 0:
        p.error(f"--seed must be >= 0, got {args.seed}")
    quick = args.quick
    args.steps = args.steps or (20 if quick else 5000)
    args.d_model = args.d_model or (16 if quick else 64)
    args.layers = args.layers or (1 if quick else 2)
    if args.d_model % 4:
        p.error(f"--d-model must be a multiple of the 4 heads, got {args.d_model}")
    if args.plot and os.path.dirname(args.plot) and not os.path.isdir(os.path.dirname(args.plot)):
        p.error(f"--plot: no folder {os.path.dirname(args.plot)}")
    return args


def on_device(arrays, device):
    if device == "cpu":
        return arrays
    import cupy

    return tuple(cupy.asarray(a) for a in arrays)


def evaluate(model, numbers, device, beam, batch_size=100):
    """Exact-match accuracy of greedy and beam decoding over numbers, and the outputs."""
    greedy_out, beam_out = [], []
    for i in range(0, len(numbers), batch_size):
        src, src_lens, *_ = batch(numbers[i:i + batch_size])
        src, = on_device((src,), device)
        kw = dict(bos=TGT_ID[BOS], eos=TGT_ID[EOS], max_len=MAX_WORDS)
        greedy_out += [words(ids) for ids in greedy_decode(model, src, src_lens, **kw)]
        beam_out += [words(h[0][0]) for h in beam_search(model, src, src_lens, beam=beam,
                                                         length_penalty=0.6, **kw)]
    refs = [" ".join(german(n)) for n in numbers]
    accuracy = [float(np.mean([o == r for o, r in zip(outs, refs)]))
                for outs in (greedy_out, beam_out)]
    return accuracy, greedy_out, beam_out


def plot_attention(model, n, device, path):
    """The last decoder layer's cross-attention for number n, averaged over heads, to path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipped the attention picture "
              "(pip install matplotlib)")
        return
    src, src_lens, tgt_in, tgt_out, tgt_lens = batch([n])
    probs = model.cross_attention_probs(*on_device((src, tgt_in), device), src_lens, tgt_lens)
    p = probs[-1][0].mean(axis=0)  # (Tt, Ts)
    fig, ax = plt.subplots(figsize=(6, 5))
    fig.colorbar(ax.imshow(p, cmap="viridis", vmin=0, vmax=1), ax=ax, label="weight")
    ax.set_xticks(range(len(english(n))), english(n), rotation=60, ha="right")
    ax.set_yticks(range(tgt_out.shape[1]), [TGT_WORDS[i] for i in tgt_out[0]])
    ax.set_xlabel("English (source)")
    ax.set_ylabel("German (the word each row writes)")
    ax.set_title(f"{n}: last decoder layer's cross-attention, mean of heads", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None):
    args = parse_args(argv)
    test_rng = np.random.default_rng(12345)  # the test set's own seed: the same for every run
    test = draw_numbers(test_rng, 40 if args.quick else 500, digits=(3, 6))
    held_out = frozenset(test) | {PICTURE}  # never trained on
    rng = np.random.default_rng(args.seed)

    cfg = Seq2SeqConfig(src_vocab=len(SRC_WORDS), tgt_vocab=len(TGT_WORDS),
                        d_model=args.d_model, n_head=4, n_enc_layers=args.layers,
                        n_dec_layers=args.layers, d_ff=4 * args.d_model, max_len=16)
    model = Transformer(cfg, seed=args.seed, device=args.device)
    opt = AdamW(model.params, model.grads, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
    warmup = max(1, min(400, args.steps // 5))
    print(f"English -> German numbers: {len(SRC_WORDS)} source words, {len(TGT_WORDS)} target "
          f"tokens; {model.num_params():,} parameters, {args.steps} steps of {args.batch} "
          f"sentences, warm-up {warmup}, on {args.device}")

    start = last = time.perf_counter()
    tokens = 0
    for step in range(1, args.steps + 1):
        src, src_lens, tgt_in, tgt_out, tgt_lens = batch(
            draw_numbers(rng, args.batch, exclude=held_out))
        src, tgt_in, tgt_out = on_device((src, tgt_in, tgt_out), args.device)
        lr = transformer_lr(step, args.d_model, warmup)
        model.zero_grad()
        _, loss = model.forward(src, tgt_in, src_lens, tgt_lens, targets=tgt_out,
                                label_smoothing=0.1)
        model.backward()
        clip_grad_norm(model.grads, 1.0)  # not the paper's: a guard at the schedule's peak
        opt.step(lr)
        tokens += int(src_lens.sum() + tgt_lens.sum())
        if step % max(1, args.steps // 20) == 0 or step == args.steps:
            now = time.perf_counter()
            print(f"step {step:5d}  loss {float(loss):.4f}  lr {lr:.2e}  "
                  f"{tokens / (now - last):,.0f} tokens/s", flush=True)
            last, tokens = now, 0
    print(f"trained in {time.perf_counter() - start:.1f} s")

    t0 = time.perf_counter()
    (greedy_acc, beam_acc), greedy_out, beam_out = evaluate(model, test, args.device,
                                                            args.beam)
    print(f"held-out exact match ({len(test)} numbers, {time.perf_counter() - t0:.1f} s):")
    print(f"  greedy        {greedy_acc:.1%}")
    print(f"  beam {args.beam:<2d}       {beam_acc:.1%}")
    wrong = [i for i, n in enumerate(test)  # by greedy, by beam search or by both
             if {greedy_out[i], beam_out[i]} != {" ".join(german(n))}]
    shown = [(i, "a held-out sentence") for i in range(3)]
    shown += [(i, f"a mistake ({len(wrong)} in all)") for i in [i for i in wrong if i >= 3][:3]]
    for i, what in shown:
        print(f"\n  {what}:\n  source     {' '.join(english(test[i]))}\n  reference  "
              f"{' '.join(german(test[i]))}\n  greedy     {greedy_out[i]}\n  "
              f"beam       {beam_out[i]}")
    print()
    if args.plot:
        plot_attention(model, PICTURE, args.device, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
