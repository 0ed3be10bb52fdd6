"""GPT-2's tokenizer in C (pytfm_tokenizer.h, through pytfm.tokenizer) against Hugging Face
tokenizers: encode throughput on one thread.

    python bench/tokenizer_c.py --rounds 5

Each worker process opens GPT-2's vocabulary ($PYTFM_GPT2_VOCAB, else ~/.cache/pytfm/gpt2-vocab:
encoder.json + vocab.bpe) and encodes every UTF-8 .py file of the standard library, one file
at a time (str in, the ids as each gives them: a list; pytfm-array is pytfm's encode_array,
an int32 array, no list made; each tokenizer's cache starts empty in each process); the figure
is the files' UTF-8 bytes over the time of the encode calls alone, in MB/s. Each runs in
processes of its own, interleaved over the rounds (TOKENIZERS_PARALLELISM=false,
RAYON_NUM_THREADS=1, OMP_NUM_THREADS=1); the table gives the medians, the CPU and the load
average, and checks that all gave the same ids. Needs tokenizers (pip install ".[gpt2-test]").
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
from bench.common import cpu_name, stdlib_texts, worker_env  # noqa: E402

VOCAB_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "pytfm", "gpt2-vocab")
LIBS = ("pytfm-array", "tokenizers", "pytfm")


def vocab_paths():
    folder = os.environ.get("PYTFM_GPT2_VOCAB") or VOCAB_CACHE
    for v, m in (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")):
        paths = os.path.join(folder, v), os.path.join(folder, m)
        if all(map(os.path.isfile, paths)):
            return paths
    sys.exit(f"no GPT-2 vocabulary (encoder.json, vocab.bpe) in {folder}: see "
             "tests/model/gpt2_oracle.py for the fetch")


def worker(lib, vocab, merges):
    texts = stdlib_texts()
    if lib.startswith("pytfm"):
        from pytfm.tokenizer import Tokenizer

        tok = Tokenizer.from_files(vocab, merges)
        encode = tok.encode if lib == "pytfm" else \
            lambda text: tok.encode_array(text, dtype=np.int32)
    else:
        from tokenizers import Tokenizer as HF
        from tokenizers import decoders, models, pre_tokenizers

        engine = HF(models.BPE.from_file(vocab, merges))
        engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        engine.decoder = decoders.ByteLevel()

        def encode(text):
            return engine.encode(text, add_special_tokens=False).ids
    encode("warm up the imports")  # not the cache: a word no file holds alone
    digest = hashlib.sha256()
    n = 0
    seconds = 0.0
    for text in texts:  # only the encodes are timed, not the digest of their ids
        t0 = time.perf_counter()
        ids = encode(text)
        seconds += time.perf_counter() - t0
        n += len(ids)
        digest.update(np.asarray(ids, np.int32).tobytes())
    mb = sum(len(t.encode()) for t in texts) / 1e6
    return {"seconds": seconds, "tokens": n, "files": len(texts), "mb": mb,
            "digest": digest.hexdigest()}


def run(lib, vocab, merges):
    env = worker_env(1, OPENBLAS_NUM_THREADS=1, TOKENIZERS_PARALLELISM="false",
                     RAYON_NUM_THREADS=1, HF_HUB_OFFLINE=1)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", lib, vocab,
                        merges], capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"bench/tokenizer_c.py worker {lib} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--libs", nargs="+", default=list(LIBS), choices=LIBS)
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    vocab, merges = vocab_paths()
    got = {lib: [] for lib in args.libs}
    print(f"# CPU: {cpu_name()}; load before: {'{:.2f} {:.2f} {:.2f}'.format(*os.getloadavg())}")
    for r in range(args.rounds):
        order = args.libs if r % 2 == 0 else args.libs[::-1]
        for lib in order:
            got[lib].append(run(lib, vocab, merges))
    first = next(iter(got.values()))[0]
    digests = {lib: runs[0]["digest"] for lib, runs in got.items()}
    mbs = {lib: statistics.median(x["mb"] / x["seconds"] for x in runs)
           for lib, runs in got.items()}
    print(f"# {first['files']} files, {first['mb']:.1f} MB, {first['tokens']:,} tokens; "
          f"{args.rounds} rounds, medians; load after: "
          f"{'{:.2f} {:.2f} {:.2f}'.format(*os.getloadavg())}")
    print(f"# same ids from all: {len(set(digests.values())) == 1}")
    base = mbs.get("tokenizers")
    print("| tokenizer (1 thread) | MB/s | vs tokenizers |")
    print("|---|---|---|")
    for lib, v in mbs.items():
        print(f"| {lib} | {v:.2f} | {v / base:.2f}× |" if base else f"| {lib} | {v:.2f} | |")


if __name__ == "__main__":
    main()
