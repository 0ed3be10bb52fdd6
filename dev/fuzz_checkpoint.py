"""Mutation fuzzer for pytfm.checkpoint (the C reader, through its Python mapper): mutate real
checkpoints for a given time, load each result, and count what comes out.

    python dev/fuzz_checkpoint.py --seconds 120
    python dev/fuzz_checkpoint.py --seconds 3600 --seed 7 --out /tmp/fuzz

Each mutation stacks one to three edits of a real checkpoint (bit flips, interesting bytes,
truncation, splices, a new header length, structured edits of the header JSON and of the
config inside it) and loads the result three ways: load_file, load, and load into a model and
optimizer. The only allowed outcomes are success and CheckpointError; anything else is a bug:
another exception, a failed load that changed the model or optimizer, or a load slower than
--slow seconds. Each bug's file is saved under --out with its traceback and the edits that
made it, and the exit status is 1. tests/model/test_checkpoint.py runs a short hypothesis version of
this in every test run; tests/c_api/fuzz/ fuzzes the reader in C with libFuzzer.
"""

import argparse
import json
import os
import random
import re
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter

import numpy as np

try:
    from pytfm import checkpoint
except ImportError:  # run from a checkout built in place
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from pytfm import checkpoint
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW

INTERESTING_BYTES = b'\x00\xff\x7f\x80 "{}[],:-.0123456789eE\\'
INTERESTING_INTS = [0, 1, -1, 2, 3, 4, 7, 8, 16, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1,
                    2**63, 2**64 - 1, 2**64, -(2**63), 10**6, 10**30]
INTERESTING_JSON = [None, True, False, 0.5, -0.0, 1e308, "", "F32", "I64", "F16", "pytfm",
                    "__metadata__", [], {}, [0], [1, 2, 3], [[1]], {"a": 1}, *INTERESTING_INTS]


def json_value(rng, depth=0):
    """An interesting JSON value: an edge, or a small random structure."""
    roll = rng.random()
    if roll < 0.6 or depth > 2:
        return rng.choice(INTERESTING_JSON)
    if roll < 0.8:
        return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["dtype", "shape", "data_offsets", "x", ""]): json_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


# ---- edits: (rng, blob) -> (new blob, description) ------------------------------------------


def flip_bits(rng, blob):
    data = bytearray(blob)
    spots = [rng.randrange(len(data)) for _ in range(rng.randint(1, 8))] if data else []
    for pos in spots:
        data[pos] ^= 1 << rng.randrange(8)
    return bytes(data), f"flip bits at {spots}"


def set_byte(rng, blob):
    if not blob:
        return blob, "set no byte"
    pos, value = rng.randrange(len(blob)), rng.choice(INTERESTING_BYTES)
    return blob[:pos] + bytes([value]) + blob[pos + 1:], f"byte {pos} = {value:#x}"


def truncate(rng, blob):
    cut = rng.randrange(len(blob) + 1)
    return blob[:cut], f"cut to {cut} bytes"


def splice(rng, blob):
    a = rng.randrange(len(blob) + 1)
    b = min(len(blob), a + rng.choice([0, 1, 4, 16, 64]))
    if rng.random() < 0.5:
        start = rng.randrange(len(blob) + 1)
        piece = blob[start:start + rng.randint(0, 64)]  # a copy of some other part
    else:
        piece = bytes(rng.choice(INTERESTING_BYTES) for _ in range(rng.randint(0, 8)))
    return blob[:a] + piece + blob[b:], f"bytes [{a}, {b}) = {piece[:16]!r}"


def set_length(rng, blob):
    n = struct.unpack("<Q", blob[:8])[0] if len(blob) >= 8 else 0
    value = rng.choice([0, 1, n - 1, n + 1, n + 8, len(blob) - 8, len(blob), 2**63, 2**64 - 1,
                        rng.randrange(2**64)]) % 2**64
    return struct.pack("<Q", value) + blob[8:], f"header length = {value}"


def split(blob):
    """-> (header, data) of a file whose header still parses, else None."""
    try:
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
    except (ValueError, struct.error, RecursionError):
        return None
    return (header, blob[8 + n:]) if isinstance(header, dict) else None


def join(header, data):
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + data


def edit_json(rng, blob):
    """Replace, delete or rename a value somewhere in the header."""
    parts = split(blob)
    if parts is None:
        return flip_bits(rng, blob)
    header, data = parts
    path, node = [], header
    while isinstance(node, (dict, list)) and node and (not path or rng.random() < 0.6):
        key = rng.choice(list(node) if isinstance(node, dict) else range(len(node)))
        path.append(key)
        parent, node = node, node[key]
    if not path:
        return join({**header, "x": json_value(rng)}, data), "add x"
    action = rng.choice(["replace", "delete", "rename"]) if isinstance(parent, dict) else "replace"
    if action == "replace":
        parent[path[-1]] = value = json_value(rng)
        what = f"= {value!r}"
    elif action == "delete":
        del parent[path[-1]]
        what = "deleted"
    else:
        name = rng.choice(["__metadata__", "", "dtype", "shape", *parent])
        parent[name] = parent.pop(path[-1])
        what = f"renamed {name!r}"
    return join(header, data), f"header {path} {what}"


def edit_offsets(rng, blob):
    """Make two tensors' data_offsets clash: share, swap, overlap, leave a gap."""
    parts = split(blob)
    tensors = [k for k, v in parts[0].items() if k != "__metadata__" and isinstance(v, dict)
               and isinstance(v.get("data_offsets"), list)] if parts else []
    if len(tensors) < 2:
        return edit_json(rng, blob)
    header, data = parts
    a, b = rng.sample(tensors, 2)
    how = rng.choice(["share", "swap", "shift", "reverse", "negate"])
    oa, ob = header[a]["data_offsets"], header[b]["data_offsets"]
    if how == "share":
        header[b]["data_offsets"] = list(oa)
    elif how == "swap":
        header[a]["data_offsets"], header[b]["data_offsets"] = ob, oa
    elif how == "shift":
        delta = rng.choice([-8, -4, -1, 1, 4, 8])
        header[a]["data_offsets"] = [o + delta if isinstance(o, int) else o for o in oa]
    elif how == "reverse":
        header[a]["data_offsets"] = list(reversed(oa))
    else:
        header[a]["data_offsets"] = [-o if isinstance(o, int) else o for o in oa]
    return join(header, data), f"offsets {how} {a} {b}"


def edit_config(rng, blob):
    """Give one GPTConfig field (or the step, extra, optim.t) a value of another type or range."""
    parts = split(blob)
    meta = parts[0].get("__metadata__") if parts else None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), str):
        return edit_json(rng, blob)
    header, data = parts
    if rng.random() < 0.3:
        key = rng.choice(["step", "extra", "optim.t", "format"])
        meta[key] = value = rng.choice(["-1", "1.5", "", "NaN", "[" * 5000, "{}", "007",
                                        str(2**63), "\u0663", json.dumps(json_value(rng))])
        return join(header, data), f"{key} = {value[:20]!r}"
    try:
        config = json.loads(meta["config"])
    except (ValueError, RecursionError):
        return edit_json(rng, blob)
    if not isinstance(config, dict) or not config:
        return edit_json(rng, blob)
    field = rng.choice(sorted(config))
    config[field] = value = json_value(rng)
    meta["config"] = json.dumps(config)
    return join(header, data), f"config {field} = {value!r}"


def edit_text(rng, blob):
    """Edits only raw text can make: a duplicate key, deep nesting, bad UTF-8, NaN."""
    (n,) = struct.unpack("<Q", blob[:8]) if len(blob) >= 8 else (0,)
    head, data = blob[8:8 + n], blob[8 + n:]
    how = rng.choice(["duplicate", "deep", "utf8", "nan", "surrogate"])
    at = head.find(b'"', rng.randrange(len(head) + 1))
    if at < 0:
        return flip_bits(rng, blob)
    end = head.find(b'"', at + 1) + 1
    if how == "duplicate":
        head = head[:at] + head[at:end] + b": 1, " + head[at:]
    elif how == "deep":
        depth = rng.choice([100, 5000, 100_000])
        head = head[:at] + b"[" * depth + b"]" * depth + b", " + head[at:]
    elif how == "utf8":
        head = head[:at + 1] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80"]) + head[at + 1:]
    elif how == "nan":
        head = head[:at] + rng.choice([b"NaN", b"Infinity", b"-Infinity"]) + head[end:]
    else:
        head = head[:at + 1] + b"\\ud800" + head[at + 1:]
    return struct.pack("<Q", len(head)) + head + data, f"text {how} at {at}"


# the structured edits get past the first checks more often than byte noise: weighted up
EDITS = [flip_bits, set_byte, truncate, splice, set_length, edit_text, *[edit_json] * 3,
         *[edit_offsets] * 2, *[edit_config] * 3]


# ---- seeds and loads ------------------------------------------------------------------------


def seeds(folder):
    """[(blob, model, optimizer)] of real checkpoints, with the model and optimizer (or None)
    that load(path, model, optimizer) is given for each."""
    out, rng = [], np.random.default_rng(0)
    for i, (pos, tie, n_layer, with_opt) in enumerate([("rope", True, 1, True),
                                                       ("sinusoidal", False, 2, False),
                                                       ("none", True, 1, True)]):
        cfg = GPTConfig(vocab=8, d_model=4, n_layer=n_layer, n_head=2, max_seq=4, pos=pos,
                        tie_embeddings=tie, seed=i)
        model = GPT(cfg)
        for p in model.params.values():
            p[...] = rng.standard_normal(p.shape)
        opt = AdamW(model.params, model.grads)
        opt.step()
        path = os.path.join(folder, f"seed{i}.safetensors")
        checkpoint.save(path, model, step=3 + i, optimizer=opt if with_opt else None,
                        extra={"i": i})
        out.append((open(path, "rb").read(), model, opt))
    # the safetensors layer alone: other dtypes, 0-d and empty arrays
    path = os.path.join(folder, "plain.safetensors")
    checkpoint.save_file(path, {"a": np.arange(6, dtype=np.int64).reshape(2, 3),
                                "s": np.array(1.5, np.float32), "e": np.zeros((0, 2), np.float32)},
                         {"k": "v"})
    out.append((open(path, "rb").read(), None, None))
    return out


def state(model, opt):
    return ([p.copy() for p in model.params.values()], opt.t,
            [a.copy() for a in opt.m.values()], [a.copy() for a in opt.v.values()])


def restore(model, opt, saved):
    params, t, m, v = saved
    for dst, src in zip(model.params.values(), params):
        dst[...] = src
    opt.t = t
    for dst, src in zip([*opt.m.values(), *opt.v.values()], [*m, *v]):
        dst[...] = src


def same(model, opt, saved):
    params, t, m, v = saved
    arrays = [*model.params.values(), *opt.m.values(), *opt.v.values()]
    return opt.t == t and all(a.tobytes() == b.tobytes() for a, b in zip(arrays, [*params, *m, *v]))


class Hang(Exception):
    pass


def _hang(signum, frame):
    raise Hang


def outcome(slow, load, *args):
    """-> ('success' | 'CheckpointError' | 'bug: ...', message) of load(*args). A load still
    running after 10 x slow seconds is stopped (SIGALRM), so that one hang cannot stall the
    run; one slower than slow is a bug as well."""
    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _hang)
    signal.setitimer(signal.ITIMER_REAL, 10 * slow)
    try:
        load(*args)
        result = "success", ""
    except checkpoint.CheckpointError as e:
        result = "CheckpointError", str(e)
    except Hang:
        return "bug: hang", f"stopped after {10 * slow:g} s"
    except Exception as e:
        return f"bug: {type(e).__name__}", traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if time.perf_counter() - start > slow:
        return "bug: slow", f"took {time.perf_counter() - start:.2f} s"
    return result


def kind(message, path):
    """A CheckpointError's message without the file and the particulars: what check it was."""
    text = message[len(path) + 2:] if message.startswith(path) else message
    text = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "'…'", text)
    text = re.sub(r"\{.*\}|\[[^\]]*\]?|\(.*\)", "…", text)
    return re.sub(r"(?<![\w-])-?\d+", "N", text)[:70]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60, help="how long to fuzz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slow", type=float, default=1.0, help="a load slower than this is a bug")
    p.add_argument("--out", default="fuzz_checkpoint_failures",
                   help="folder for the files of bugs (made when there is one)")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    counts = {name: Counter() for name in ("load_file", "load", "load into a model")}
    errors, bugs, tried, start = Counter(), 0, 0, time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        corpus = seeds(folder)
        path = os.path.join(folder, "mutated.safetensors")
        try:
            while time.monotonic() < start + args.seconds:
                blob, edits, results = try_one(rng, corpus, path, args.slow)
                tried += 1
                for name, (result, message) in results.items():
                    counts[name][result] += 1
                    if result == "CheckpointError":
                        errors[kind(message, path)] += 1
                    elif result.startswith("bug"):
                        bugs += 1
                        save_bug(args.out, bugs, blob, name, result, message, edits)
        except KeyboardInterrupt:
            print("interrupted")
    print(f"{tried} mutations in {time.monotonic() - start:.0f} s (seed {args.seed})")
    for name, c in counts.items():
        print(f"  {name:18s} " + ", ".join(f"{k}: {v}" for k, v in sorted(c.items())))
    print(f"bugs: {bugs}" + (f" (files in {args.out})" if bugs else ""))
    print("most common CheckpointErrors:")
    for text, n in errors.most_common(15):
        print(f"  {n:7d}  {text}")
    return 1 if bugs else 0


def try_one(rng, corpus, path, slow):
    """Mutate a seed, write it to path, load it every way. -> (blob, edits, {loader: outcome})"""
    blob, model, opt = rng.choice(corpus)
    edits = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        blob, what = rng.choice(EDITS)(rng, blob)
        edits.append(what)
    with open(path, "wb") as f:
        f.write(blob)
    results = {"load_file": outcome(slow, checkpoint.load_file, path),
               "load": outcome(slow, checkpoint.load, path)}
    if model is not None:
        saved = state(model, opt)
        results["load into a model"] = outcome(slow, checkpoint.load, path, model, opt)
        if results["load into a model"][0] != "success" and not same(model, opt, saved):
            results["load into a model"] = ("bug: a failed load changed the model", "")
        restore(model, opt, saved)
    return blob, edits, results


def save_bug(out, n, blob, loader, result, message, edits):
    if n > 50:
        return
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"bug-{n}")
    with open(stem + ".safetensors", "wb") as f:
        f.write(blob)
    with open(stem + ".txt", "w") as f:
        f.write(f"{loader}: {result}\nedits: {edits}\n\n{message}\n")
    print(f"{loader}: {result}: saved {stem}.safetensors", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
