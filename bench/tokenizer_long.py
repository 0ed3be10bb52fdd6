"""One long word: how encode's time grows with the size of a single word or run, pytfm against
Hugging Face tokenizers, on GPT-2's vocabulary.

    python bench/tokenizer_long.py --rounds 3

The texts are one word each of 64 KiB, 256 KiB and 1 MiB: random lowercase letters, random
digits, spaces, and one letter repeated. Each library runs in processes of its own, one per
round, interleaved (TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1); a process opens the
vocabulary, encodes each text once (str in, a list of ids out) and reports the seconds of the
encode calls. The table gives the medians, the growth from 256 KiB to 1 MiB (a linear or
n log n cost gives about 4x, a quadratic one about 16x), the CPU and the load average, and
checks that both gave the same ids. Needs tokenizers and the vocabulary (scripts/
fetch_gpt2_vocab.sh).
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import cpu_name, worker_env  # noqa: E402
from bench.tokenizer_c import vocab_paths  # noqa: E402

SIZES = (64 << 10, 256 << 10, 1 << 20)
KINDS = ("letters", "digits", "spaces", "one letter")
LIBS = ("pytfm", "tokenizers")


def text(kind, size):
    rng = np.random.default_rng(size)
    if kind == "letters":
        return bytes(rng.integers(97, 123, size, dtype=np.uint8)).decode()
    if kind == "digits":
        return bytes(rng.integers(48, 58, size, dtype=np.uint8)).decode()
    return (" " if kind == "spaces" else "a") * size


def worker(lib, vocab, merges):
    if lib == "pytfm":
        from pytfm.tokenizer import Tokenizer

        encode = Tokenizer.from_files(vocab, merges).encode
    else:
        from tokenizers import Tokenizer as HF
        from tokenizers import models, pre_tokenizers

        engine = HF(models.BPE.from_file(vocab, merges))
        engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)

        def encode(t):
            return engine.encode(t, add_special_tokens=False).ids
    out = {}
    for kind in KINDS:
        for size in SIZES:
            t = text(kind, size)
            start = time.perf_counter()
            ids = encode(t)
            seconds = time.perf_counter() - start
            digest = hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()[:16]
            out[f"{kind}/{size}"] = (seconds, digest)
    print(json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    vocab, merges = vocab_paths()
    if args.worker:
        return worker(args.worker, vocab, merges)
    env = worker_env(1, TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS=1)
    runs = {lib: [] for lib in LIBS}
    for _ in range(args.rounds):
        for lib in LIBS:
            done = subprocess.run([sys.executable, __file__, "--worker", lib], env=env,
                                  capture_output=True, text=True, check=True)
            runs[lib].append(json.loads(done.stdout))
    print(f"cpu: {cpu_name()}; load average {os.getloadavg()[0]:.2f} "
          f"{os.getloadavg()[1]:.2f}; {args.rounds} rounds, medians, seconds")
    print(f"{'text':<12}{'lib':<12}" + "".join(f"{s >> 10:>9} KiB" for s in SIZES)
          + "   1 MiB / 256 KiB")
    same = True
    for kind in KINDS:
        for lib in LIBS:
            med = [statistics.median(r[f"{kind}/{s}"][0] for r in runs[lib]) for s in SIZES]
            print(f"{kind:<12}{lib:<12}" + "".join(f"{m:>13.4f}" for m in med)
                  + f"{med[2] / med[1]:>12.1f}x")
        for s in SIZES:
            same &= len({r[f"{kind}/{s}"][1] for lib in LIBS for r in runs[lib]}) == 1
    print("same ids: " + ("yes" if same else "NO"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
