"""Write the fuzzer's seed corpus, tests/c_api/fuzz/seeds/: small valid checkpoints, as
pytfm.checkpoint.save writes them, in each position mode, tied and untied, with and without
AdamW state and extra, the headers of those with AdamW state alone, and a few bare JSON texts
(the target also checks its input as JSON, and reads a JSON object as a header).

    python tests/c_api/fuzz/make_seeds.py [folder]

Deterministic: the same files every run (fixed seeds; json.dumps keeps the order)."""

import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "..", "..")))
from pytfm import checkpoint  # noqa: E402
from pytfm.nn import GPT, GPTConfig  # noqa: E402
from pytfm.optim import AdamW  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# (file, config changes, with AdamW, extra)
CHECKPOINTS = [
    ("rope_tied", dict(pos="rope"), False, None),
    ("rope_untied_adamw", dict(pos="rope", tie_embeddings=False), True, None),
    ("sinusoidal_tied_adamw", dict(pos="sinusoidal"), True, {"note": "h\u00e9\U0001f600"}),
    ("sinusoidal_untied", dict(pos="sinusoidal", tie_embeddings=False), False, None),
    ("none_tied_extra", dict(pos="none", n_head=2, d_model=4), False,
     {"lr": 3e-4, "losses": [1.5, -0.25, None, True], "deep": [[[{}]]]}),
    ("none_untied_2layers", dict(pos="none", n_layer=2, tie_embeddings=False), False, None),
    ("learned_tied_adamw", dict(pos="learned"), True, None),
    # the Llama family's blocks: grouped-query heads, q/k/v biases, the q/k norm, a window
    ("llama_untied", dict(arch="llama", n_head=2, n_kv_head=1, d_model=4, d_ff=6, qkv_bias=True,
                          qk_norm=True, sliding_window=1, tie_embeddings=False), False, None),
]

# headers alone (the target reads a JSON object as a header), at the edges of what the config
# may hold: (file, checkpoint whose header is edited, config changes)
HEADERS = [
    ("sinusoidal_long.header.json", "sinusoidal_untied", dict(max_seq=2**22)),  # table 2**23
    ("big_seed.header.json", "rope_tied", dict(seed=2**70)),
]

JSON_TEXTS = [
    ("config.json", json.dumps({"vocab": 2, "d_model": 2, "n_layer": 1, "n_head": 1,
                                "max_seq": 2, "pos": "rope", "tie_embeddings": True,
                                "seed": 18446744073709551616})),
    ("strings.json", '["\\ud83d\\ude00", "\\u00e9\\n\\t\\"\\\\\\/", "h\u00e9", {"": -0}]'),
    ("numbers.json", '[0, -1, 9223372036854775807, -9223372036854775808, 1.5e-3, 2E+8, -0.0]'),
]


def small(pos="rope", tie_embeddings=True, n_layer=1, n_head=1, d_model=2, **llama):
    cfg = GPTConfig(vocab=2, d_model=d_model, n_layer=n_layer, n_head=n_head, max_seq=2, pos=pos,
                    tie_embeddings=tie_embeddings, seed=1, **llama)
    model = GPT(cfg)
    rng = np.random.default_rng(7)
    for p in model.params.values():
        p[...] = rng.standard_normal(p.shape)
    return model


def header_of(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return blob[8:8 + n].rstrip(b" ")


def main(folder):
    os.makedirs(folder, exist_ok=True)
    for name, changes, adamw, extra in CHECKPOINTS:
        model = small(**changes)
        optimizer = None
        if adamw:
            optimizer = AdamW(model.params, model.grads)
            for g in model.grads.values():
                g[...] = 0.5
            optimizer.step()
        path = os.path.join(folder, name + ".safetensors")
        checkpoint.save(path, model, step=3, optimizer=optimizer, extra=extra)
        if adamw:  # its header alone: the target reads a JSON object as a header too
            with open(os.path.join(folder, name + ".header.json"), "wb") as f:
                f.write(header_of(path))
    for name, source, changes in HEADERS:
        header = json.loads(header_of(os.path.join(folder, source + ".safetensors")))
        config = json.loads(header["__metadata__"]["config"])
        config.update(changes)
        header["__metadata__"]["config"] = json.dumps(config)
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(json.dumps(header))
    for name, text in JSON_TEXTS:
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
    return sorted(os.listdir(folder))


if __name__ == "__main__":
    print("\n".join(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "seeds"))))
