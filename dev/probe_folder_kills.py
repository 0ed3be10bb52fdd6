"""Kill -9 saves at random moments and count what the survivors find.

    python dev/probe_folder_kills.py N [--seed S]

folder: N times, a process saving two different GPT-2 versions (model, config, tokenizer)
in turn over an existing folder is killed after a random delay; the folder must then hold one
version whole (config.json, the weights, vocab.json and merges.txt of one save) and its other
files. checkpoint: the same with pytfm.checkpoint.save of two models over one file. Prints a
line per kind: kills, whole, torn, missing, and how many kills found a save midway (its
temporary there); then whether the next save cleared every temporary. Exit status 1 when any
kill left a torn or missing folder or file."""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VERSIONS = """
import numpy as np
from pytfm import checkpoint, gpt2
from pytfm.nn import GPT, GPTConfig
from pytfm.tokenizer import train

TEXT = bytes(range(32, 127)) * 4

def version(v):
    # version v differs in every file: vocab 300 + v, every weight v + 1, 257 + v tokens
    model = GPT(GPTConfig(vocab=300 + v, d_model=32, n_layer=2, n_head=2, max_seq=16,
                          pos="learned"))
    model.params.buffer[...] = v + 1
    return model, train(TEXT, 257 + v)
"""

SAVER = VERSIONS + """
import sys
kind, path, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
made = [version(first), version(first + 1)]
print("ready", flush=True)
for step in range(10**9):
    model, tok = made[step % 2]
    if kind == "folder":
        gpt2.save(model, path, tokenizer=tok)
    else:
        checkpoint.save(path, model, step=first + step % 2)
"""


def version_of_folder(folder):
    """The version the folder holds, or 'torn' (files of two versions), or 'missing'."""
    from pytfm import gpt2

    if not os.path.isdir(folder):
        return "missing"
    model = gpt2.load(folder)
    v = model.cfg.vocab - 300
    weights = {float(a.min()) for a in model.params.values()} | {
        float(a.max()) for a in model.params.values()}
    tokens = len(gpt2.load_tokenizer(folder)) - 257
    kept = open(os.path.join(folder, "README.md")).read() == "kept"
    return v if weights == {v + 1.0} and tokens == v and kept else "torn"


def version_of_file(path):
    from pytfm import checkpoint

    if not os.path.isfile(path):
        return "missing"
    model, step, _ = checkpoint.load(path)
    v = model.cfg.vocab - 300
    weights = {float(a.min()) for a in model.params.values()} | {
        float(a.max()) for a in model.params.values()}
    return v if weights == {v + 1.0} and step == v else "torn"


def leftovers(parent):
    return [f for f in os.listdir(parent) if f.startswith(".tmp-")]


def probe(kind, n, rng, top):
    scope = {}
    exec(VERSIONS, scope)
    path = os.path.join(top, "g2" if kind == "folder" else "m.safetensors")
    model, tok = scope["version"](0)
    if kind == "folder":
        from pytfm import gpt2

        gpt2.save(model, path, tokenizer=tok)
        with open(os.path.join(path, "README.md"), "w") as f:
            f.write("kept")
        check = version_of_folder
    else:
        from pytfm import checkpoint

        checkpoint.save(path, model, step=0)
        check = version_of_file
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    counts = {"kills": 0, "whole": 0, "torn": 0, "missing": 0, "midway": 0}
    for i in range(n):
        saver = subprocess.Popen([sys.executable, "-c", SAVER, kind, path, str(1 + 2 * (i % 2))],
                                 env=env, stdout=subprocess.PIPE, text=True)
        saver.stdout.readline()  # ready: its models are made, its first save starts now
        time.sleep(rng.uniform(0, 0.2))
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        saver.stdout.close()
        counts["kills"] += 1
        counts["midway"] += bool(leftovers(top))
        got = check(path)
        counts["whole" if isinstance(got, int) else got] += 1
    if kind == "folder":
        gpt2.save(model, path, tokenizer=tok)
    else:
        checkpoint.save(path, model, step=0)
    cleared = leftovers(top) == [] and check(path) == 0
    print(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in counts.items()) +
          f"; next save cleared the temporaries: {cleared}", flush=True)
    return counts["torn"] + counts["missing"] == 0 and cleared


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", type=int, help="kills of each kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default="folder,checkpoint")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    ok = True
    for kind in args.kinds.split(","):
        with tempfile.TemporaryDirectory() as top:
            ok &= probe(kind, args.n, rng, top)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
