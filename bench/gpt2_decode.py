"""Decoding GPT-2 124M token by token: pytfm's C model against llama.cpp and transformers, and
against the memory-bandwidth limit, in one run (the decode table of issue "GPT-2 in pytfm,
part 2").

    python bench/gpt2_decode.py                       # 1 and 2 threads, 5 rounds
    python bench/gpt2_decode.py --threads 1 --rounds 3 --tokens 64

The model: a random GPT-2 of 124M's shape (vocab 50257, 12 layers, d 768, 12 heads, context
1024; transformers' own initialisation, saved as a Hugging Face folder, bench/gpt2.py's
make_folder). Each case decodes a prompt of PROMPT (16) tokens fed at once, then TOKENS tokens
greedily, one at a time through its KV cache, and the figure is TOKENS over the time of those
steps (the prompt's time apart):
  pytfm fp32/bf16/int8  the C model API on the folder (bench/c_decode.c --generate; bf16 and
                   int8 are pytfm_model_set_precision(PYTFM_PRECISION_BF16 / _INT8)), no
                   Python in the loop
  llama.cpp f32/f16/q8_0  llama-cpp-python's Llama.eval on GGUFs converted from the same folder
                   by llama.cpp's convert_hf_to_gguf.py (--llama-src: a llama.cpp tree holding
                   it and gguf-py; llama-cpp-python's sdist carries one under vendor/llama.cpp),
                   Q8_0 quantized from the F32 one by llama.cpp's quantizer; absent, with the
                   reason, when llama_cpp cannot be imported or converted
  transformers     GPT2LMHeadModel, torch eager, FP32, use_cache, no_grad
  limit fp32/bf16/int8  the read bandwidth (c_decode --bandwidth: a STREAM-like sum of 500 MiB of
                   floats at that thread count, in transparent huge pages as pytfm's weights;
                   the same in 4 KiB pages is printed beside it) over the bytes a token must
                   read: every weight matrix once (the LM head included), in the precision's
                   width, and the float32 vectors (biases, LayerNorms) beside them
Every case runs in a process of its own at the given thread count, the cases alternate over
rounds (the order reversed every other round), each process times REPS decodes and reports
their median, and the figure is the median over rounds. The header names the CPU and the load
average before and after: other work on the machine skews every figure. Targets (ok / MISS):
each pytfm precision >= 1.0x its llama.cpp peer (fp32: f32, bf16: f16, int8: q8_0), fp32 and
bf16 >= 0.8x their limits, and bf16 faster than fp32, int8 than bf16.
Needs torch, transformers (pip install ".[gpt2-test]"), GPT-2's vocabulary for the conversion
(scripts/fetch_gpt2_vocab.sh), and, for its rows, llama-cpp-python and gguf.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # bench/'s modules, and this checkout's pytfm
from decoding import (  # noqa: E402
    BW,
    BW_SMALL,
    LLAMA,
    PEER,
    PYTFM,
    WIDTH,
    add_decode_args,
    convert_ggufs,
    gguf_converter,
    interleave,
    llama_worker,
    machine_line,
    measure,
    print_rates,
    ratio_row,
    run,
    tokens_of,
)

# ---- the model in each library's format ------------------------------------------------------


def pytfm_model_path(folder, tmp):
    """The path pytfm's C model opens for the GPT-2 in folder: the folder itself
    (pytfm_model_open reads config.json and model.safetensors). A pytfm checkpoint of the same
    weights (pytfm.gpt2.load, then pytfm.checkpoint.save into tmp) decodes at the same speed:
    the same floats, in the same allocation."""
    del tmp
    return folder


def gguf_paths(folder, tmp, llama_src):
    """{"f32": path, "f16": path} of GGUFs converted from folder by llama.cpp's
    convert_hf_to_gguf.py, or a string saying why there are none."""
    script, why = gguf_converter(llama_src)
    if why:
        return why
    vocab = gpt2_bench().vocab_folder(tmp)
    if vocab is None:
        return "no GPT-2 vocabulary to convert with: bash scripts/fetch_gpt2_vocab.sh"
    # the converter reads n_ctx, which transformers no longer writes, and the tokenizer files
    src = os.path.join(tmp, "gguf-src")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config.setdefault("n_ctx", config["n_positions"])
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(config, f)
    os.symlink(os.path.join(folder, "model.safetensors"), os.path.join(src, "model.safetensors"))
    for name in ("vocab.json", "merges.txt"):
        os.symlink(os.path.join(vocab, name), os.path.join(src, name))
    return convert_ggufs(script, src, llama_src, {k: os.path.join(tmp, f"gpt2-124m-{k}.gguf")
                                                  for _, k in LLAMA})


def gpt2_bench():
    import gpt2

    return gpt2


# ---- the workers: one case, in a process of its own -------------------------------------------


def torch_worker(folder, threads, reps, prompt, count):
    """[decode seconds] of reps greedy decodes by transformers with its KV cache."""
    import torch
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(threads)
    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    ids = torch.tensor([tokens_of(model.config.vocab_size, prompt)])
    seconds = []
    with torch.no_grad():
        for _ in range(reps):
            out = model(ids, use_cache=True)
            t0 = time.perf_counter()
            for _ in range(count):
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
            seconds.append(time.perf_counter() - t0)
    return seconds


def worker(argv):
    kind, path, threads, reps, prompt, count = argv
    f = llama_worker if kind == "llama" else torch_worker
    print(json.dumps(f(path, int(threads), int(reps), int(prompt), int(count))))


# ---- the driver ------------------------------------------------------------------------------


def bytes_per_token(cfg, width):
    """Every weight matrix (the layers' four, the LM head) in `width` bytes, the rest float32:
    what one token reads (the position table: one row)."""
    C, L, V = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"]
    matrices = L * 12 * C * C + V * C
    vectors = L * (4 * C + 3 * C + C + 4 * C + C) + 2 * C + C  # biases, LayerNorms, wpe row
    return width * matrices + 4 * vectors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decode_args(ap, rounds=5, reps=3)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    from bench.c_generate import build_driver

    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="pytfm-gpt2-decode-") as tmp:
        folder = os.path.join(tmp, "gpt2-124m")
        run([sys.executable, os.path.join(HERE, "gpt2.py"), "--worker", "folder", "torch", "1",
             folder], 1)
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        exe = build_driver(tmp)
        cases = [("bandwidth", "huge"), ("bandwidth", "small")] + [
            ("pytfm", pytfm_model_path(folder, tmp), p) for _, p in PYTFM]
        ggufs = gguf_paths(folder, tmp, args.llama_src)
        if isinstance(ggufs, dict):
            cases += [("llama", ggufs[k]) for _, k in LLAMA]
        cases.append(("torch", folder))
        names = [BW, BW_SMALL] + [n for n, _ in PYTFM] + (
            [n for n, _ in LLAMA] if isinstance(ggufs, dict) else []) + ["transformers"]
        load.append(os.getloadavg()[0])
        script = os.path.abspath(__file__)
        got = interleave(list(zip(names, cases)), args.threads, args.rounds,
                         lambda case, threads: measure(case, threads, args, exe, script))
        load.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"GPT-2 124M shape, random weights (vocab {cfg['vocab_size']}, {cfg['n_layer']} "
          f"layers, d {cfg['n_embd']}, {cfg['n_head']} heads, context {cfg['n_positions']}): "
          f"a {args.prompt}-token prompt, then {args.tokens} tokens decoded greedily")
    print(machine_line(load))
    print(f"command: python bench/gpt2_decode.py --threads {' '.join(map(str, args.threads))} "
          f"--rounds {args.rounds} --reps {args.reps} --prompt {args.prompt} --tokens "
          f"{args.tokens}; medians over rounds of each process's median\n")
    if not isinstance(ggufs, dict):
        print(f"llama.cpp: absent: {ggufs}\n")
    limit = {p: bytes_per_token(cfg, WIDTH[p]) for _, p in PYTFM}
    print_rates(names, med, args.threads, limit)
    print()
    rows = []
    for t in args.threads:
        bw = med[(BW, t)] * 1e9
        for name, p in PYTFM:
            if isinstance(ggufs, dict):
                rows.append(ratio_row(f"{t} thr: {name} / {PEER[p]}", med[(name, t)],
                                      med[(PEER[p], t)], 1.0))
        for name, p in PYTFM:  # (int8's product is integer work as much as bytes: no target)
            rows.append(ratio_row(f"{t} thr: {name} / {p} limit", med[(name, t)],
                                  bw / limit[p], None if p == "int8" else 0.8))
        for (a, _), (b, _) in zip(PYTFM[1:], PYTFM):  # each precision faster than the wider
            rows.append(ratio_row(f"{t} thr: {a} / {b}", med[(a, t)], med[(b, t)], 1.0))
        rows.append(ratio_row(f"{t} thr: pytfm fp32 / transformers",
                              med[("pytfm fp32", t)], med[("transformers", t)], 1.0))
    print("\n".join(rows))
    print(json.dumps({f"{n} {t}": v for (n, t), v in med.items()}))


if __name__ == "__main__":
    main()
