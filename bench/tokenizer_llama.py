"""Llama 3's, Qwen 3's, Llama 2's and Gemma 3's tokenizer.json: the seconds to encode 1 MiB
of text, pytfm against Hugging Face tokenizers.

    python bench/tokenizer_llama.py --rounds 3

The texts (1 MiB of UTF-8 each): "code", the running Python's standard library sources in
sorted order, and "prose", tests/model/gpt2_oracle.PROSE repeated (English, contractions,
digits, many scripts, emoji, combining marks). Each library runs in processes of its own, one
per round, interleaved (TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1); a process opens the
file, encodes each text once with special tokens as text and no template (str in, a list of
ids out), and reports the seconds of the encode calls. The table gives the medians, the ratio
pytfm / tokenizers, the CPU and the load average, and checks that both gave the same ids.
Needs tokenizers and the files (scripts/fetch_llama_tokenizers.sh).
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "model"))
from bench.common import cpu_name, worker_env  # noqa: E402

SIZE = 1 << 20
NAMES = ("llama3", "qwen3", "llama2", "gemma3")
TEXTS = ("code", "prose")
LIBS = ("pytfm", "tokenizers")


def path_of(name):
    folder = os.environ.get("PYTFM_LLAMA_TOKENIZERS") or os.path.join(
        os.path.expanduser("~"), ".cache", "pytfm", "llama-tokenizers")
    path = os.path.join(folder, name, "tokenizer.json")
    if not os.path.isfile(path):
        sys.exit(f"{path} is missing: bash scripts/fetch_llama_tokenizers.sh")
    return path


def text(kind):
    """1 MiB of UTF-8 (cut at a character)."""
    if kind == "code":
        from gpt2_oracle import stdlib_sources

        parts, size = [], 0
        for p in stdlib_sources():
            with open(p, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
            size += len(parts[-1].encode())
            if size >= SIZE:
                break
        raw = "".join(parts).encode()
    else:
        from gpt2_oracle import PROSE

        raw = (PROSE * (SIZE // len(PROSE.encode()) + 1)).encode()
    return raw[:SIZE].decode(errors="ignore")


def worker(lib):
    out = {}
    texts = {kind: text(kind) for kind in TEXTS}
    for name in NAMES:
        if lib == "pytfm":
            from pytfm.tokenizer import Tokenizer

            tok = Tokenizer.from_tokenizer_json(path_of(name))

            def encode(t, tok=tok):
                return tok.encode(t, special=False, template=False)
        else:
            from tokenizers import Tokenizer as HF

            engine = HF.from_file(path_of(name))
            engine.encode_special_tokens = True

            def encode(t, engine=engine):
                return engine.encode(t, add_special_tokens=False).ids
        for kind in TEXTS:
            start = time.perf_counter()
            ids = encode(texts[kind])
            seconds = time.perf_counter() - start
            digest = hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()[:16]
            out[f"{name}/{kind}"] = (seconds, digest, len(ids))
    print(json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    env = worker_env(1, TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS=1)
    runs = {lib: [] for lib in LIBS}
    for _ in range(args.rounds):
        for lib in LIBS:
            done = subprocess.run([sys.executable, __file__, "--worker", lib], env=env,
                                  capture_output=True, text=True, check=True)
            runs[lib].append(json.loads(done.stdout))
    print(f"cpu: {cpu_name()}; load average {os.getloadavg()[0]:.2f} "
          f"{os.getloadavg()[1]:.2f}; {args.rounds} rounds, medians, seconds per 1 MiB")
    print(f"{'file':<8}{'text':<7}{'ids':>8}{'pytfm':>10}{'tokenizers':>12}{'ratio':>8}")
    same = True
    for name in NAMES:
        for kind in TEXTS:
            key = f"{name}/{kind}"
            med = {lib: statistics.median(r[key][0] for r in runs[lib]) for lib in LIBS}
            n = runs["pytfm"][0][key][2]
            print(f"{name:<8}{kind:<7}{n:>8}{med['pytfm']:>10.4f}{med['tokenizers']:>12.4f}"
                  f"{med['pytfm'] / med['tokenizers']:>7.2f}x")
            same &= len({r[key][1] for lib in LIBS for r in runs[lib]}) == 1
    print("same ids: " + ("yes" if same else "NO"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
