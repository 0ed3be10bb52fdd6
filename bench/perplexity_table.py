"""What a precision costs in accuracy, pytfm's beside llama.cpp's: perplexity over a text and
greedy agreement, on the same weights.

    python bench/perplexity_table.py --llama-src LLAMA_SRC             # random GPT-2 124M
    python bench/perplexity_table.py --folder F --llama-src LLAMA_SRC  # a folder with tokenizer
    python bench/perplexity_table.py --context 256 --text FILE --steps 64 --cache DIR

The model: --folder, a Hugging Face folder with its tokenizer (GPT-2's or the Llama family's),
or by default the random GPT-2 of 124M's shape of bench/gpt2.py (transformers' initialisation,
seed 0) with GPT-2's vocabulary beside it (scripts/fetch_gpt2_vocab.sh). llama.cpp's GGUFs
are converted from that folder by llama.cpp's convert_hf_to_gguf.py (F32, F16; --llama-src: a
llama.cpp tree, as llama-cpp-python's sdist's vendor/llama.cpp) and Q8_0 by llama.cpp's
quantizer (llama_model_quantize, what the llama-quantize tool runs) from the F32 one.

Rows:
  pytfm fp32 / bf16 / int8   `python -m pytfm perplexity FOLDER TEXT --precision P --json` for
                             the perplexity; the per-token figures from GPT.forward's logits
  llama.cpp F32 / F16 / Q8_0  llama-cpp-python's Llama.eval over the same token ids
Perplexity is measured one way for both libraries (docs/perplexity.md): the text's ids from
the folder's tokenizer (no BOS), cut into consecutive windows of --context tokens, each window
one forward from position 0, every token after a window's first scored; NLL per token =
logsumexp(logits) - logits[target] in float64 here for llama.cpp's float32 logits, summed with
math.fsum. (llama.cpp's own llama-perplexity tool puts a BOS first and scores each window's
second half only: its figures are not this table's; the measure here is the same for all six
rows, which is what a comparison of precisions needs.)

Greedy agreement: from the prompt of the decode benches (bench/c_generate.py's tokens_of: 16
ids), --steps tokens decoded greedily in each precision; "agree" is how many of the first new
tokens equal those of the same library's full-precision run (pytfm fp32, llama.cpp F32).

The distances printed, each within one library against its full-precision run: |ppl -
ppl(fp32)| / ppl(fp32), a signed sum's (per-token errors of both signs cancel in it, so on a
random model, whose perplexity is near its vocabulary's size, it is a noisy figure); the mean
|ΔNLL| over the scored tokens (nats: how far each token's log-likelihood moved); and top-1,
how many scored positions keep the full-precision run's most likely next token. The target
(issue "Decoding at the speed of the bytes"): pytfm int8's distance from fp32 at most
llama.cpp Q8_0's from F32, and int8's greedy agreement at least Q8_0's. The CPU and load are
printed (the figures do not depend on them: this is accuracy, not speed).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # bench/'s modules, and this checkout's pytfm
from common import ROOT, cpu_name, worker_env  # noqa: E402

from bench.c_generate import tokens_of  # noqa: E402

PYTFM = ("fp32", "bf16", "int8")
LLAMA = ("f32", "f16", "q8_0")
PROMPT = 16


def load():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# ---- the model: a folder with its tokenizer, and its GGUFs -----------------------------------


def default_folder(cache):
    """The random GPT-2 124M with GPT-2's vocabulary and n_ctx in its config (what the
    converter reads), made once in cache."""
    import gpt2

    folder = os.path.join(cache, "gpt2-124m")
    if os.path.isfile(os.path.join(folder, "merges.txt")):
        return folder
    vocab = gpt2.vocab_folder(cache)
    if vocab is None:
        sys.exit("bench/perplexity_table.py: no GPT-2 vocabulary: bash "
                 "scripts/fetch_gpt2_vocab.sh")
    part = folder + ".part"
    gpt2.make_folder(part)
    with open(os.path.join(part, "config.json")) as f:
        config = json.load(f)
    config.setdefault("n_ctx", config["n_positions"])
    with open(os.path.join(part, "config.json"), "w") as f:
        json.dump(config, f)
    for name in ("vocab.json", "merges.txt"):
        with open(os.path.join(vocab, name), "rb") as f, \
                open(os.path.join(part, name), "wb") as g:
            g.write(f.read())
    os.replace(part, folder)
    return folder


def ggufs(folder, cache, llama_src):
    """{"f32": path, "f16": path, "q8_0": path}, or a string saying why there are none."""
    from decoding import convert_ggufs, gguf_converter

    script, why = gguf_converter(llama_src)
    if why:
        return why
    stem = os.path.join(cache, os.path.basename(os.path.normpath(folder)))
    return convert_ggufs(script, folder, llama_src, {k: f"{stem}-{k}.gguf" for k in LLAMA})


# ---- the workers: one case, in a process of its own ------------------------------------------


def windows_of(n, context):
    return [(s, min(context, n - s)) for s in range(0, n, context)]


def ids_of(folder, text):
    """The text's ids from the folder's tokenizer, as `python -m pytfm perplexity` takes them."""
    from pytfm import folders

    _, tok = folders.load_snapshot(folder)
    with open(text, "rb") as f:
        raw = f.read()
    return [int(i) for i in tok.encode_array(raw, special=False, template=False)]


def llama_worker(path, ids_file, context, steps, threads):
    """{"nll", "tokens", "perplexity", "greedy"} of llama.cpp on the ids in ids_file."""
    import numpy as np
    from llama_cpp import Llama

    with open(ids_file) as f:
        ids = json.load(f)
    n_ctx = max(context, PROMPT + steps)
    llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                n_threads_batch=threads, logits_all=True, verbose=False)
    terms, best = [], []
    for start, length in windows_of(len(ids), context):
        window = ids[start:start + length]
        llm.reset()
        llm.eval(window)
        t, b = token_figures(np.asarray(llm.scores[:length]), window)
        terms += t
        best += b
    nll = math.fsum(terms)
    prompt = tokens_of(llm.n_vocab(), PROMPT)
    llm.reset()
    llm.eval(prompt)
    greedy = []
    for _ in range(steps):
        greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([greedy[-1]])
    return {"nll": nll, "tokens": len(terms), "perplexity": math.exp(nll / len(terms)),
            "greedy": greedy, "terms": terms, "best": best}


def token_figures(logits, window):
    """([NLL of each token of window after the first], [the most likely id at each position
    but the last]) from a window's float32 logits, in float64."""
    import numpy as np

    logits = np.asarray(logits, np.float64)[:len(window) - 1]
    top = logits.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    rows = np.arange(len(window) - 1)
    return (lse - logits[rows, window[1:]]).tolist(), logits.argmax(axis=1).tolist()


def pytfm_worker(folder, precision, ids_file, context, steps):
    """pytfm's per-token figures on the ids in ids_file, and its greedy continuation of the
    prompt, in precision."""
    import numpy as np

    from pytfm import folders
    from pytfm.generate import generate

    with open(ids_file) as f:
        ids = json.load(f)
    model = folders.load(folder, precision=precision)
    terms, best = [], []
    for start, length in windows_of(len(ids), context):
        window = ids[start:start + length]
        logits, _ = model.forward(np.array([window], np.int64), save=False)
        t, b = token_figures(logits[0], window)
        terms += t
        best += b
    prompt = np.array([tokens_of(model.cfg.vocab, PROMPT)], np.int64)
    out = generate(model, prompt, steps, temperature=0.0)
    return {"greedy": [int(t) for t in out[0, PROMPT:]], "terms": terms, "best": best}


def worker(argv):
    if argv[0] == "llama":
        _, path, ids_file, context, steps, threads = argv
        r = llama_worker(path, ids_file, int(context), int(steps), int(threads))
    else:
        _, folder, precision, ids_file, context, steps = argv
        r = pytfm_worker(folder, precision, ids_file, int(context), int(steps))
    print(json.dumps(r))


def run(cmd, threads):
    """The last stdout line of cmd as JSON, or {"error": why}."""
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                       env=worker_env(threads, HF_HUB_OFFLINE=1))
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- the driver ------------------------------------------------------------------------------


def agree(a, b):
    """How many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", help="a Hugging Face folder with its tokenizer (default: a "
                    "random GPT-2 124M, made in --cache)")
    ap.add_argument("--text", default=os.path.join(ROOT, "README.md"),
                    help="the text (default: README.md)")
    ap.add_argument("--context", type=int, default=128, help="window length (default 128)")
    ap.add_argument("--steps", type=int, default=64, help="greedy tokens (default 64)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "pytfm-ppl-table"))
    ap.add_argument("--llama-src", help="a llama.cpp tree with convert_hf_to_gguf.py")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    os.makedirs(args.cache, exist_ok=True)
    folder = args.folder or default_folder(args.cache)
    print(f"# {cpu_name()} | load {load()} | {folder} | {args.text} | context {args.context} | "
          f"{args.steps} greedy steps after {PROMPT} prompt tokens")
    rows = {}
    ids_file = os.path.join(args.cache, "ids.json")
    with open(ids_file, "w") as f:
        json.dump(ids_of(folder, args.text), f)
    for p in PYTFM:
        r = run([sys.executable, "-m", "pytfm", "perplexity", folder, args.text, "--context",
                 str(args.context), "--precision", p, "--json"], args.threads)
        g = run([sys.executable, __file__, "--worker", "pytfm", folder, p, ids_file,
                 str(args.context), str(args.steps)], args.threads)
        rows[f"pytfm {p}"] = {**r, **g}
    paths = ggufs(folder, args.cache, args.llama_src)
    if isinstance(paths, str):
        print(f"# llama.cpp rows absent: {paths}")
    else:
        for k in LLAMA:
            rows[f"llama.cpp {k.upper()}"] = run(
                [sys.executable, __file__, "--worker", "llama", paths[k], ids_file,
                 str(args.context), str(args.steps), str(args.threads)], args.threads)
    refs = {"pytfm": rows.get("pytfm fp32", {}), "llama.cpp": rows.get("llama.cpp F32", {})}
    print("| case | perplexity | tokens scored | distance from its fp32 | mean \\|ΔNLL\\| (nats) "
          "| top-1 as its fp32 | greedy tokens agreeing with its fp32 |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | {r['error']} | | | | | |")
            continue
        ref = refs[name.split()[0]]
        if "error" in ref or not ref:
            print(f"| {name} | {r['perplexity']:.6f} | {r['tokens']} | (no full-precision "
                  "run) | | | |")
            continue
        dist = abs(r["perplexity"] - ref["perplexity"]) / ref["perplexity"]
        dnll = math.fsum(abs(a - b) for a, b in zip(r["terms"], ref["terms"])) / len(r["terms"])
        top1 = sum(a == b for a, b in zip(r["best"], ref["best"]))
        same = agree(r["greedy"], ref["greedy"])
        print(f"| {name} | {r['perplexity']:.6f} | {r['tokens']} | {dist:.2e} | {dnll:.2e} | "
              f"{top1} of {len(r['best'])} | {same} of {args.steps} |")
    print(f"# load after: {load()}")


if __name__ == "__main__":
    main()
