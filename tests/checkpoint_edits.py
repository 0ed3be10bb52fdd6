"""Building and editing safetensors files byte by byte, and the small model they start from,
shared by the tests of the checkpoint reader through Python (tests/model/test_checkpoint.py)
and through its C API (tests/c_api/test_c_checkpoint.py)."""

import json
import struct

import numpy as np
from hypothesis import strategies as st

from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW


def small_model(pos="rope", tie=True, seed=0, **kw):
    """A one-layer GPT with random (not initial) weights, and its AdamW after one step."""
    cfg = dict(vocab=8, d_model=4, n_layer=1, n_head=2, max_seq=4, pos=pos, tie_embeddings=tie,
               seed=seed)
    cfg.update(kw)
    model = GPT(GPTConfig(**cfg))
    rng = np.random.default_rng(seed + 1)
    for p in model.params.values():
        p[...] = rng.standard_normal(p.shape)
    opt = AdamW(model.params, model.grads)
    for g in model.grads.values():
        g[...] = rng.standard_normal(g.shape)
    opt.step()
    return model, opt


def pack(header, body=b"", length=None):
    """A safetensors file from a header (raw bytes as they are, anything else as its JSON) and
    the data bytes; length overrides the header length field."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(head) if length is None else length) + head + body


def unpack(blob):
    """-> (header dict, data bytes) of a file pytfm wrote."""
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def edit_structure(draw, blob, values):
    """Replace, delete or rename one value somewhere in the header of blob (or in the config
    inside it), drawing new values from the strategy values, and keep the length field right
    most of the time. Every choice is a small draw, so a falsifying example reads as the edit,
    not as kilobytes."""
    header, body = unpack(blob)
    parent = header
    while True:  # walk down to a random container
        keys = list(parent) if isinstance(parent, dict) else list(range(len(parent)))
        if not keys:
            break
        key = draw(st.sampled_from(keys))
        if key == "config" and draw(st.booleans()):
            config = json.loads(parent[key])
            config[draw(st.sampled_from(sorted(config)))] = draw(values)
            parent[key] = json.dumps(config)
            break
        if not isinstance(parent[key], (dict, list)) or draw(st.booleans()):
            action = draw(st.sampled_from(["replace", "delete", "rename"]))
            if action == "replace" or isinstance(parent, list):
                parent[key] = draw(values)
            elif action == "delete":
                del parent[key]
            else:
                name = draw(st.sampled_from(["__metadata__", "", "optim.t", "step", *parent]))
                parent[name] = parent.pop(key)
            break
        parent = parent[key]
    head = json.dumps(header).encode()
    return pack(head, body, length=len(head) + draw(st.sampled_from([0, 0, 0, 1, -1, 8])))
