"""Write tests/c_api/fuzz/tokenizer_seeds/ again (deterministically): inputs of fuzz_tokenizer.c,
whose first byte says what follows (0 text, 1 vocab.json NUL merges.txt, 2 tokenizer.json)."""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, "tokenizer_seeds")


def byte_names():
    """GPT-2's names of the 256 byte tokens, in its id order."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    return [chr(c) for c in cs]  # GPT-2's order of the byte tokens


def main():
    os.makedirs(SEEDS, exist_ok=True)
    names = byte_names()
    vocab = {c: i for i, c in enumerate(names)}
    vocab.update({"Ġt": 256, "Ġth": 257, "he": 258, "<|endoftext|>": 259})
    merges = [("Ġ", "t"), ("Ġt", "h"), ("h", "e")]
    merges_txt = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    doc = {"version": "1.0", "added_tokens": [{"id": 259, "content": "<|endoftext|>"}],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                     "merges": [f"{a} {b}" for a, b in merges[:2]] + [list(merges[2])]}}
    seeds = {
        "text_prose": b"\x00It's the theme: 'll 've  \n\n\t 12345 caf\xc3\xa9 \xf0\x9f\x98\x80"
                      b"<|endoftext|>next",
        "text_bytes": b"\x00\xff\xfe\xc3(\xe2\x82 \xed\xa0\x80\xf4\x90\x80\x80 a'",
        "files": b"\x01" + json.dumps(vocab).encode() + b"\x00" + merges_txt.encode(),
        "tokenizer_json": b"\x02" + json.dumps(doc).encode(),
    }
    for name, data in seeds.items():
        with open(os.path.join(SEEDS, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
