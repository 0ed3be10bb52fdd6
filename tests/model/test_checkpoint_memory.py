"""A file claiming a huge tensor (a sparse file: the bytes are there, on no disk): when memory
runs out, the message names the file and the tensor, in C (pytfm_model_open of a GPT-2
folder) and in Python (SafetensorsFile.read, checkpoint.load). Run in a child whose address
space is limited (RLIMIT_AS), so that the allocation fails on any machine."""

import json
import struct
import subprocess
import sys

import numpy as np

from pytfm.gpt2 import _hf_shapes
from pytfm.nn import GPTConfig

V = 2**30  # 96 GiB of embedding

CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))
from pytfm import checkpoint
from pytfm._core import ffi, lib
kind, path = sys.argv[1], sys.argv[2]
if kind == "c":
    h = ffi.new("pytfm_model **")
    st = lib.pytfm_model_open(h, path.encode(), 0)
    print(ffi.string(lib.pytfm_status_string(st)).decode(), "|",
          ffi.string(lib.pytfm_last_error()).decode())
else:
    try:
        with checkpoint.SafetensorsFile(path) as f:
            f.read("transformer.wte.weight")
    except MemoryError as e:
        print("MemoryError |", e)
"""


def sparse(path, shapes, metadata):
    header, at = {"__metadata__": metadata}, 0
    for name, shape in shapes:
        n = 4 * int(np.prod(shape, dtype=object))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.truncate(8 + len(head) + at)


def child(kind, path):
    r = subprocess.run([sys.executable, "-c", CHILD, kind, path], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def huge_folder(tmp_path):
    cfg = GPTConfig(vocab=V, d_model=24, n_layer=1, n_head=3, max_seq=8, pos="learned")
    folder = tmp_path / "g2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        dict(vocab_size=V, n_positions=8, n_embd=24, n_layer=1, n_head=3)))
    sparse(str(folder / "model.safetensors"), [(n, s) for n, s, _ in _hf_shapes(cfg)],
           {"format": "pt"})
    return folder


def test_c_out_of_memory_names_the_file_and_the_tensor(tmp_path):
    folder = huge_folder(tmp_path)
    got = child("c", str(folder))
    assert got.startswith(f"out of memory | {folder}/model.safetensors: cannot allocate "), got
    assert f"parameters (tensor transformer.wte.weight alone is {4 * 24 * V} bytes)" in got


def test_python_out_of_memory_names_the_file_and_the_tensor(tmp_path):
    folder = huge_folder(tmp_path)
    path = str(folder / "model.safetensors")
    assert child("py", path) == (f"MemoryError | {path}: cannot allocate {4 * 24 * V:,} bytes "
                                 f"for tensor transformer.wte.weight (float32[{V}, 24])")
