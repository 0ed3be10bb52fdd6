"""pytfm.checkpoint — models (and optimizer state) as safetensors files, written atomically and
read without trusting a byte of them.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
N, an N-byte UTF-8 JSON header {name: {"dtype", "shape", "data_offsets"}, "__metadata__":
{str: str}}, then the raw little-endian tensor bytes. pytfm stores the GPTConfig, the step and
any extra JSON-able values in __metadata__, the parameters under their names, and AdamW's
moments under "optim.m.<name>" / "optim.v.<name>".

Reading is the C library's (pytfm_safetensors_* and pytfm_checkpoint_check in pytfm_model.h,
the same reader the C model API opens checkpoints with); this module maps what it returns to
NumPy. SafetensorsFile opens a file and has its header checked against the format before any
tensor data is read: the length (at most the file, at most MAX_HEADER), strict JSON (no
duplicate keys, no NaN, at most MAX_JSON_DEPTH containers deep), each entry's dtype, shape and
data_offsets, and offsets that tile the data exactly. load() then has the pytfm layer checked
(format, config, step, extra, optim.t; that the tensors are exactly the parameters the config
implies, by name, shape and dtype; that the sinusoidal table GPT(cfg) would allocate is not out
of all proportion to them) before it builds or touches a model. Only then does it read the
data, and only after that does it copy into a given model and optimizer: a load that fails
leaves them as they were.

A model on the GPU writes the same file as on the CPU (its parameters and the optimizer's
moments are copied to the host, each FlatDict in one transfer), and a file loads into a model
on either device (the tensors are copied into its arrays there).

A path that is not a regular file (a folder; a FIFO, refused at once, not waited on) is a
CheckpointError. Whatever the bytes, load_file and load raise nothing but CheckpointError
(naming the file and the tensor or field), or OSError from the file system (MemoryError when
memory runs out).

Writing is pytfm._atomic.write_file's: a temporary file beside the checkpoint, locked, fsynced and
renamed over it, so that a reader, or a save killed at any moment, sees the old file or the new
one; the next save removes what killed ones left.
"""

import json
import math
import operator
import os
import struct
from dataclasses import asdict

import numpy as np

from . import _atomic
from . import device as devices
from ._core import check, ffi, lib
from .nn import GPT, GPTConfig, config_dict, param_shapes

_DTYPES = {lib.PYTFM_DTYPE_F32: np.dtype("<f4"), lib.PYTFM_DTYPE_I64: np.dtype("<i8")}
_NAMES = {np.dtype("<f4"): "F32", np.dtype("<i8"): "I64"}  # what save_file writes
MAX_HEADER = lib.PYTFM_SAFETENSORS_MAX_HEADER  # bytes: the reference implementation's limit
MAX_JSON_DEPTH = lib.PYTFM_JSON_MAX_DEPTH  # JSON containers open at once, at most
_MAX_INT = 2**63 - 1  # step and optim.t reach the kernels as int64_t


class CheckpointError(ValueError):
    """A checkpoint file that is truncated, malformed or does not fit the model."""


def _is_text(s):
    """Valid Unicode: a str can hold lone surrogates ("\\ud800"), which UTF-8 cannot."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(pointer, length):
    """A UTF-8 text the C reader returned (it has checked it is valid)."""
    return ffi.unpack(pointer, length).decode("utf-8")


# ---- reading: a mapper over the C reader ----------------------------------------------------


class SafetensorsFile:
    """A safetensors file, open, its header checked by the C reader (any layout of F32 and I64
    tensors): .metadata {str: str} and .tensors {name: (dtype, shape)}, both in header order
    (made when first asked for); read(name) -> a new NumPy array of its data. A context
    manager; close() frees it.

    The path is opened here, O_NONBLOCK (so that a FIFO is refused at once instead of the
    open waiting, forever, for a writer) and O_NOCTTY (nor may a terminal become the
    controlling one): what cannot be opened is an OSError from os.open, with its errno; what is
    not a safetensors file is a CheckpointError naming the path."""

    def __init__(self, path):
        self.path = path
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        handle = ffi.new("pytfm_safetensors **")
        try:
            self._check(lib.pytfm_safetensors_open_fd(handle, fd, ffi.NULL))
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._st = fd, handle[0]
        self._metadata = self._tensors = self._index = None

    def _check(self, status):
        check(status, CheckpointError, self.path)

    @property
    def metadata(self):
        if self._metadata is None:
            count, item = ffi.new("int64_t *"), ffi.new("pytfm_metadata_item *")
            self._check(lib.pytfm_safetensors_metadata_count(self._st, count))
            self._metadata = {}
            for i in range(count[0]):
                self._check(lib.pytfm_safetensors_metadata(self._st, i, item))
                self._metadata[_text(item.key, item.key_len)] = _text(item.value, item.value_len)
        return self._metadata

    @property
    def tensors(self):
        return self._table()[0]

    def _table(self):
        """-> ({name: (dtype, shape)}, {name: index}), made once."""
        if self._tensors is None:
            count = ffi.new("int64_t *")
            self._check(lib.pytfm_safetensors_tensor_count(self._st, count))
            self._tensors, self._index = {}, {}
            for i in range(count[0]):
                name, dtype, shape = self._info(i)
                self._tensors[name], self._index[name] = (dtype, shape), i
        return self._tensors, self._index

    def _info(self, index):
        """-> (name, dtype, shape) of tensor index."""
        info = ffi.new("pytfm_tensor_info *")
        self._check(lib.pytfm_safetensors_tensor(self._st, index, info))
        return (_text(info.name, info.name_len), _DTYPES[info.dtype],
                tuple(info.shape[0:info.ndim]))

    def read(self, name):
        """-> tensor name's data, a new NumPy array of its dtype and shape (KeyError when
        there is none)."""
        if self._index is None and "\0" not in name:  # no table needed: the reader's index
            found = ffi.new("int64_t *")
            self._check(lib.pytfm_safetensors_find(self._st, name.encode(), found))
            if found[0] < 0:
                raise KeyError(name)
            index = found[0]
            _, dtype, shape = self._info(index)
        else:
            tensors, indices = self._table()
            index, (dtype, shape) = indices[name], tensors[name]
        try:
            a = np.empty(shape, dtype)
        except MemoryError:
            nbytes = dtype.itemsize * math.prod(shape)
            raise MemoryError(f"{self.path}: cannot allocate {nbytes:,} bytes for tensor {name} "
                              f"({dtype.name}{list(shape)})") from None
        buffer = ffi.from_buffer(a, require_writable=True) if a.nbytes else ffi.NULL
        self._check(lib.pytfm_safetensors_read(self._st, index, buffer, a.nbytes))
        return a

    def _text_of(self, key):
        """The metadata value of key, or None."""
        value, length = ffi.new("char **"), ffi.new("int64_t *")
        self._check(lib.pytfm_safetensors_metadata_get(self._st, key.encode(), value, length))
        return None if value[0] == ffi.NULL else _text(value[0], length[0])

    def checkpoint(self):
        """The pytfm layer, checked by the C reader: -> (GPTConfig, step, extra, optim.t or
        None)."""
        info = ffi.new("pytfm_checkpoint_info *")
        self._check(lib.pytfm_checkpoint_check(self._st, info))
        cfg = GPTConfig(**json.loads(self._text_of("config")))  # texts the reader has checked
        extra = self._text_of("extra")
        extra = {} if extra is None else json.loads(extra)
        return cfg, info.config.step, extra, info.optim_t if info.has_optimizer else None

    def close(self):
        if self._st is not None:
            lib.pytfm_safetensors_close(self._st)
            os.close(self._fd)
            self._st = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_file(path):
    """-> ({name: array}, {str: str}) of any safetensors file of F32 and I64 tensors, in header
    order; raises CheckpointError for a bad file."""
    with SafetensorsFile(path) as f:
        return {name: f.read(name) for name in f.tensors}, dict(f.metadata)


def json_error(text):
    """Why the C reader would refuse text as JSON (pytfm_json_check: strict, at most
    MAX_JSON_DEPTH containers deep), or None when it takes it."""
    raw = text.encode("utf-8", "surrogatepass")
    if lib.pytfm_json_check(raw, len(raw)) == lib.PYTFM_STATUS_OK:
        return None
    return ffi.string(lib.pytfm_last_error()).decode("utf-8", "replace")


# ---- writing --------------------------------------------------------------------------------


def save_file(path, tensors, metadata):
    """Write {name: array} and {str: str} metadata to path atomically (pytfm._atomic.write_file:
    a reader, or a save killed at any moment, sees the old file or the new one). The new file
    keeps the permission bits of the file it replaces (a private 0600 checkpoint stays
    private, a 0444 one read-only); a new path gets 0666 less the umask. A symlink at path is
    replaced by the new file (its target is left as it was), which takes the target's
    permission bits. A folder that is missing or not writable raises OSError naming path."""
    try:
        _atomic.write_file(path, safetensors_chunks(tensors, metadata))
    except OSError as e:
        message = f"cannot save checkpoint {path}: {e.strerror or e}"
        message += f" ({e.filename})" if e.filename else ""
        raise (OSError(message) if e.errno is None else OSError(e.errno, message)) from e


def safetensors_chunks(tensors, metadata):
    """The bytes of a safetensors file of {name: array} and {str: str} metadata, as a list of
    chunks (the header, then each tensor's data)."""
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and _is_text(k) and _is_text(v)
            for k, v in metadata.items()):
        raise TypeError("metadata must be a dict of str to str")
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, a in tensors.items():
        if not isinstance(name, str) or name == "__metadata__" or not _is_text(name):
            raise ValueError(f"cannot store a tensor named {name!r}")
        a = np.asarray(a)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)  # tobytes() is in C order
        if a.dtype not in _NAMES:
            raise TypeError(f"{name}: cannot store dtype {a.dtype}")
        blob = a.tobytes()
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)  # align the data to 8 bytes
    return [struct.pack("<Q", len(head)) + head, *blobs]


# ---- the pytfm layer ------------------------------------------------------------------------


def save(path, model, step=0, optimizer=None, extra=None):
    """Save a GPT (and optionally its AdamW state) with its config and step. extra must be
    JSON that load() reads back (RFC 8259: NaN and Infinity are not; keys valid Unicode) nested
    at most MAX_JSON_DEPTH (64) containers deep ({"a": [1]} is 2 deep): else ValueError, and
    nothing is written."""
    step = operator.index(step)
    if not 0 <= step <= _MAX_INT:
        raise ValueError(f"step must be a non-negative int64, got {step}")
    try:
        extra_json = json.dumps(extra or {}, allow_nan=False)
        why = json_error(extra_json)
    except RecursionError:  # deeper than json.dumps recurses: far deeper than the limit
        why = f"not valid JSON (nested more than {MAX_JSON_DEPTH} levels deep)"
    if why:
        raise ValueError(f"extra is {why}: load() would refuse it")
    tensors = dict(_on_host(model.params))
    meta = {"format": "pytfm", "config": json.dumps(config_dict(model.cfg)), "step": str(step),
            "extra": extra_json}
    if optimizer is not None:
        state = optimizer.state()
        meta["optim.t"] = str(state["t"])
        m, v = _on_host(state["m"]), _on_host(state["v"])
        for name in model.params:
            tensors[f"optim.m.{name}"] = m[name]
            tensors[f"optim.v.{name}"] = v[name]
    save_file(path, tensors, meta)


def _on_host(arrays):
    """{name: NumPy array} of a FlatDict (copied in one transfer when it is on the GPU) or of
    a dict of arrays."""
    if hasattr(arrays, "to") and hasattr(arrays, "layout"):
        return arrays.to("cpu")
    return {name: devices.to_host(a) for name, a in arrays.items()}


def load(path, model=None, optimizer=None, device="cpu"):
    """Load a checkpoint. With model=None a GPT is built from the stored config, on device;
    otherwise the stored config must be model's and the tensors are copied into it, on its
    device (device is then not used). Restores optimizer when given. Returns (model, step,
    extra). Everything is checked before anything is built or copied: on any error, model and
    optimizer are as they were. A model or optimizer that does not hold float32 arrays of the
    config's parameter shapes is a ValueError."""
    if model is None:
        devices.array_module(device)  # a bad device fails before the file is read
    with SafetensorsFile(path) as f:
        cfg, step, extra, t = f.checkpoint()
        shapes = dict(param_shapes(cfg))
        if model is not None and asdict(model.cfg) != asdict(cfg):
            raise CheckpointError(f"{path}: saved for config {asdict(cfg)}, not "
                                  f"{asdict(model.cfg)}")
        if model is not None:
            _check_arrays("the model's parameters", model.params, shapes)
        if optimizer is not None:
            if t is None:
                raise CheckpointError(f"{path}: has no optimizer state to resume from")
            state = optimizer.state()
            _check_arrays("the optimizer's first moments", state["m"], shapes)
            _check_arrays("the optimizer's second moments", state["v"], shapes)
        tensors = {name: f.read(name) for name in shapes}
        if optimizer is not None:
            m = {name: f.read(f"optim.m.{name}") for name in shapes}
            v = {name: f.read(f"optim.v.{name}") for name in shapes}
    if model is None:
        model = GPT(cfg, device, init=False)  # every parameter is read below
    if hasattr(model.params, "copy_from"):  # a FlatDict: on the GPU, one copy of the buffer
        model.params.copy_from(tensors)
    else:
        for name, p in model.params.items():
            p[...] = devices.to_device(tensors[name], devices.device_of(p))
    if optimizer is not None:
        optimizer.load_state({"t": t, "m": m, "v": v})
    return model, step, extra


def _check_arrays(what, arrays, shapes):
    """A caller's model or optimizer must hold float32 arrays of the parameters' shapes, so that
    copying into them cannot fail halfway."""
    if set(arrays) != set(shapes) or any(
            arrays[k].shape != s or arrays[k].dtype != np.float32 for k, s in shapes.items()):
        raise ValueError(f"{what} are not float32 arrays of the checkpoint's parameter shapes")
