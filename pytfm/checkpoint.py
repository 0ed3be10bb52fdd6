"""pytfm.checkpoint — models (and optimizer state) as safetensors files, written atomically.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length,
a JSON header {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {str: str}}, then the
raw little-endian tensor bytes. pytfm stores the GPTConfig, the step and any extra JSON-able
values in __metadata__, the parameters under their names, and AdamW's moments under
"optim.m.<name>" / "optim.v.<name>".
"""

import json
import os
import struct
import tempfile
from dataclasses import asdict

import numpy as np

from .nn import GPT, GPTConfig

_DTYPES = {"F32": np.dtype("<f4"), "I64": np.dtype("<i8")}
_NAMES = {v: k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint file that is truncated, malformed or does not fit the model."""


def save_file(path, tensors, metadata):
    """Write {name: array} and {str: str} metadata to path atomically: the data goes to a
    temporary file in the same folder, is flushed to disk, then renamed over path."""
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        if a.dtype not in _NAMES:
            raise TypeError(f"{name}: cannot store dtype {a.dtype}")
        blob = a.tobytes()
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)  # align the data to 8 bytes
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=folder)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it 0600; a checkpoint is an ordinary file
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(head)) + head)
            for blob in blobs:
                f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load_file(path):
    """-> ({name: array}, {str: str}); raises CheckpointError for a bad file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise CheckpointError(f"{path}: {len(data)} bytes is too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise CheckpointError(f"{path}: header of {n} bytes runs past the end of the file "
                              f"({len(data)} bytes): truncated?")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise CheckpointError(f"{path}: the header is not valid JSON ({e})") from None
    body = memoryview(data)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info.get("dtype"))
        begin, end = info["data_offsets"]
        if dtype is None:
            raise CheckpointError(f"{path}: {name} has unsupported dtype {info.get('dtype')!r}")
        if end > len(body) or end - begin != int(np.prod(info["shape"])) * dtype.itemsize:
            raise CheckpointError(f"{path}: the data of {name} is missing or has the wrong size "
                                  f"(truncated file?)")
        tensors[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(info["shape"]).copy()
    return tensors, metadata


def save(path, model, step=0, optimizer=None, extra=None):
    """Save a GPT (and optionally its AdamW state) with its config and step."""
    tensors = dict(model.params)
    meta = {"format": "pytfm", "config": json.dumps(asdict(model.cfg)), "step": str(step),
            "extra": json.dumps(extra or {})}
    if optimizer is not None:
        state = optimizer.state()
        meta["optim.t"] = str(state["t"])
        for name in model.params:
            tensors[f"optim.m.{name}"] = state["m"][name]
            tensors[f"optim.v.{name}"] = state["v"][name]
    save_file(path, tensors, meta)


def load(path, model=None, optimizer=None):
    """Load a checkpoint. With model=None a GPT is built from the stored config; otherwise the
    stored tensors are copied into model (names, shapes and dtypes must all match). Restores
    optimizer when given. Returns (model, step, extra)."""
    tensors, meta = load_file(path)
    if meta.get("format") != "pytfm" or "config" not in meta:
        raise CheckpointError(f"{path}: not a pytfm checkpoint (no pytfm config in __metadata__)")
    cfg = GPTConfig(**json.loads(meta["config"]))
    if model is None:
        model = GPT(cfg)
    elif asdict(model.cfg) != asdict(cfg):
        raise CheckpointError(f"{path}: saved for config {asdict(cfg)}, not {asdict(model.cfg)}")
    _copy_into(path, model.params, tensors, "")
    if optimizer is not None:
        if "optim.t" not in meta:
            raise CheckpointError(f"{path}: has no optimizer state to resume from")
        m = {k: np.empty_like(p) for k, p in model.params.items()}
        v = {k: np.empty_like(p) for k, p in model.params.items()}
        _copy_into(path, m, tensors, "optim.m.")
        _copy_into(path, v, tensors, "optim.v.")
        optimizer.load_state({"t": meta["optim.t"], "m": m, "v": v})
    return model, int(meta["step"]), json.loads(meta.get("extra", "{}"))


def _copy_into(path, target, tensors, prefix):
    for name, dst in target.items():
        src = tensors.get(prefix + name)
        if src is None:
            raise CheckpointError(f"{path}: tensor {prefix + name} is missing")
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise CheckpointError(f"{path}: {prefix + name} is {src.dtype}{list(src.shape)}, the "
                                  f"model needs {dst.dtype}{list(dst.shape)}")
        dst[...] = src
    names = {k[len(prefix):] for k in tensors if k.startswith(prefix)}
    if not prefix:
        names = {k for k in tensors if not k.startswith("optim.")}
    unexpected = sorted(names - set(target))
    if unexpected:
        raise CheckpointError(f"{path}: unexpected tensors {unexpected[:5]}")
