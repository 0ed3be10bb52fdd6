"""pytfm's tokenizer against Hugging Face tokenizers on the real tokenizer.json files
(scripts/fetch_llama_tokenizers.sh): ids and decodes compared on the standard library's
sources, the docs and random multi-script text, one line per file.

    python dev/tokenizer_agreement.py            # 300 sources, the docs, 500 random strings
    python dev/tokenizer_agreement.py --random 2000

Needs tokenizers (pip install ".[gpt2-test]")."""

import argparse
import glob
import os
import random
import sysconfig

import tokenizers

from pytfm.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("llama3", "qwen3", "llama2", "gemma3")
# code point ranges the random strings draw from: ASCII, Latin, Greek and Cyrillic, Hebrew and
# Arabic, Devanagari, kana, CJK, Hangul, emoji, control white space
POOLS = [(0x20, 0x7E), (0xA0, 0x2FF), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0x97F),
         (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x9, 0xD)]


def texts(n_random, seed=0):
    stdlib = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:300]
    out = [open(f, encoding="utf-8", errors="replace").read() for f in stdlib]
    out += [open(f, encoding="utf-8").read() for f in sorted(glob.glob(f"{ROOT}/docs/*.md"))]
    rng = random.Random(seed)
    for _ in range(n_random):
        out.append("".join(chr(rng.randint(*rng.choice(POOLS)))
                           for _ in range(rng.randint(0, 60))))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--random", type=int, default=500, help="random strings beside the texts")
    p.add_argument("--dir", default=os.environ.get("PYTFM_LLAMA_TOKENIZERS", os.path.expanduser(
        "~/.cache/pytfm/llama-tokenizers")), help="where the fetch script put the files")
    args = p.parse_args()
    corpus = texts(args.random)
    chars = sum(map(len, corpus))
    for name in FILES:
        path = os.path.join(args.dir, name, "tokenizer.json")
        ours, ref = Tokenizer.from_tokenizer_json(path), tokenizers.Tokenizer.from_file(path)
        ids_equal = decodes_equal = 0
        for t in corpus:
            want, got = ref.encode(t).ids, ours.encode(t)
            ids_equal += got == want
            decodes_equal += ours.decode(got) == ref.decode(want, skip_special_tokens=False)
        print(f"{name}: {len(corpus)} texts ({chars / 1e6:.1f} M characters), ids equal "
              f"{ids_equal}, decodes equal {decodes_equal}")


if __name__ == "__main__":
    main()
