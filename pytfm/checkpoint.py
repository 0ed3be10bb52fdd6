"""pytfm.checkpoint — models (and optimizer state) as safetensors files, written atomically and
read without trusting a byte of them.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
N, an N-byte UTF-8 JSON header {name: {"dtype", "shape", "data_offsets"}, "__metadata__":
{str: str}}, then the raw little-endian tensor bytes. pytfm stores the GPTConfig, the step and
any extra JSON-able values in __metadata__, the parameters under their names, and AdamW's
moments under "optim.m.<name>" / "optim.v.<name>".

Reading checks the whole header against the format before it reads any tensor data: the length
(at most the file, at most MAX_HEADER), strict JSON (no duplicate keys, no NaN), each entry's
dtype, shape and data_offsets, and offsets that tile the data exactly, as the reference
implementation requires. load() then checks the pytfm layer (format, config, step, extra,
optim.t), that the tensors are exactly the parameters the config implies, names, shapes and
dtypes, and that the sinusoidal table GPT(cfg) would allocate (it is not stored) is not out of
all proportion to them, before it builds or touches a model. Only then does it read the data,
and only after that does it copy into a given model and optimizer: a load that fails leaves
them as they were.

A model on the GPU writes the same file as on the CPU (its parameters and the optimizer's
moments are copied to the host, each FlatDict in one transfer), and a file loads into a model
on either device (the tensors are copied into its arrays there).

A path that is not a regular file (a folder; a FIFO, refused at once, not
waited on) is a CheckpointError. Whatever the bytes, load_file and load raise nothing but
CheckpointError (naming the file and the tensor or field), or OSError from the file system.

Writing goes to a temporary file next to the checkpoint, .tmp-<name>.<8 hex digits>, which the
writer holds locked (flock) while it writes, fsyncs and renames it over the checkpoint; then the
folder is fsynced so the rename itself survives a crash. A save killed midway leaves its
temporary behind, unlocked (the kernel drops a dead process's locks): the next save of the same
checkpoint removes each one it can lock, and so never one a running save, in any process, holds.
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import operator
import os
import re
import reprlib
import secrets
import stat
import struct
from dataclasses import asdict, fields

import numpy as np

from . import device as devices
from .nn import GPT, GPTConfig, param_shapes

_DTYPES = {"F32": np.dtype("<f4"), "I64": np.dtype("<i8")}
_NAMES = {v: k for k, v in _DTYPES.items()}
MAX_HEADER = 100_000_000  # bytes: the reference implementation's limit
_MAX_NDIM = 32  # NumPy 1.x's limit (2.x allows 64)
_MAX_INT = 2**63 - 1  # step and optim.t reach the kernels as int64_t
_MAX_TABLE = 2**24  # floats of sinusoidal table allowed beyond the stored parameters' count
# JSON containers open at once, at most: the header (3 deep), config (1) and extra. Explicit,
# and far below any interpreter's recursion limit, so that the verdict never depends on the
# stack json.loads runs on; csrc/model/json.h PYTFM__JSON_MAX_DEPTH is the same number.
MAX_JSON_DEPTH = 64


class CheckpointError(ValueError):
    """A checkpoint file that is truncated, malformed or does not fit the model."""


_repr = reprlib.Repr()  # values from a file may be huge: show their beginning only
_repr.maxstring, _repr.maxother, _repr.maxlong = 80, 80, 40
_show = _repr.repr


def _kind(value):
    """The JSON name of a parsed value's type."""
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_text(s):
    """Valid Unicode: JSON's \\ud800 escapes can put lone surrogates in a str."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---- strict JSON ----------------------------------------------------------------------------


def _object(pairs):
    for key, _ in pairs:
        if not _is_text(key):
            raise ValueError(f"key {_show(key)} is not valid Unicode")
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {_show(duplicate)}")
    return obj


def _constant(name):
    raise ValueError(f"{name} is not JSON")


# what is not a bracket of the JSON's own: strings (escapes and all; unterminated: to the
# end) and runs of anything else
_NOT_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[^"\[\]{}]+', re.DOTALL)


def _json_depth_error(text):
    """The message for a text whose containers nest more than MAX_JSON_DEPTH deep, else None.
    Brackets are counted outside strings, over the first value only (what follows it is
    extra data json.loads refuses); where a closing bracket has no opening one the text is
    malformed there, and the scan leaves it to json.loads."""
    if text.lstrip(" \t\n\r")[:1] not in ("[", "{"):
        return None  # no container at the top: nothing can nest
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return None
    depth = 0
    for c in _NOT_BRACKETS.sub("", text):
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return f"nested more than {MAX_JSON_DEPTH} levels deep"
        else:
            depth -= 1
            if depth <= 0:
                return None
    return None


def _parse_json(text):
    """RFC 8259 JSON: duplicate keys, NaN and Infinity are errors, and so is nesting more than
    MAX_JSON_DEPTH containers deep (checked first, as csrc/model/json.c does, so that the verdict is
    the same whatever the interpreter's recursion limit). Any failure is a ValueError."""
    deep = _json_depth_error(text)
    if deep:
        raise ValueError(deep)
    try:
        return json.loads(text, object_pairs_hook=_object, parse_constant=_constant)
    except RecursionError:  # not reached within MAX_JSON_DEPTH: kept as a guard
        raise ValueError("nested too deeply") from None


# ---- the safetensors layer ------------------------------------------------------------------


def _read_header(f, path):
    """Read and check the header of the open file f. -> (metadata {str: str}, entries), entries
    [(name, dtype, shape, begin, end)] in header order, their data tiling the rest of the file;
    f is left at the start of that data."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(8)
    if len(head) < 8:
        raise CheckpointError(f"{path}: {len(head)} bytes is too short for a safetensors file")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8:
        raise CheckpointError(f"{path}: header of {n} bytes runs past the end of the file "
                              f"({size} bytes): truncated?")
    if n > MAX_HEADER:
        raise CheckpointError(f"{path}: header of {n} bytes is over the {MAX_HEADER}-byte limit")
    raw = f.read(n)
    if len(raw) < n:
        raise CheckpointError(f"{path}: the file shrank while it was being read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: the header is not UTF-8 (byte {8 + e.start}: "
                              f"{e.reason})") from None
    try:
        header = _parse_json(text)
    except ValueError as e:
        raise CheckpointError(f"{path}: the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is a JSON {_kind(header)}, not an object")
    body = size - 8 - n
    metadata = _check_metadata(path, header.pop("__metadata__", {}))
    entries = [_check_entry(path, name, info, body) for name, info in header.items()]
    _check_layout(path, entries, body)
    return metadata, entries


def _check_metadata(path, meta):
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: __metadata__ is a JSON {_kind(meta)}, not an object of "
                              f"strings")
    for key, value in meta.items():
        if not isinstance(value, str) or not _is_text(value):
            raise CheckpointError(f"{path}: __metadata__[{_show(key)}] is {_show(value)}, not a "
                                  f"string")
    return meta


def _check_entry(path, name, info, body):
    """-> (name, dtype, shape, begin, end) of one header entry, checked on its own."""
    where = f"{path}: tensor {_show(name)}"
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: its entry is a JSON {_kind(info)}, not an object")
    keys = {"dtype", "shape", "data_offsets"}
    missing, unknown = sorted(keys - set(info)), sorted(set(info) - keys)
    if missing:
        raise CheckpointError(f"{where}: its entry has no {missing[0]}")
    if unknown:
        raise CheckpointError(f"{where}: its entry has an unknown key {_show(unknown[0])}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise CheckpointError(f"{where}: unsupported dtype {_show(dtype)} (pytfm reads "
                              f"{', '.join(_DTYPES)})")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: shape {_show(shape)} is not a list of non-negative ints")
    if len(shape) > _MAX_NDIM:
        raise CheckpointError(f"{where}: {len(shape)} dimensions, NumPy allows {_MAX_NDIM}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))):
        raise CheckpointError(f"{where}: data_offsets {_show(offsets)} is not a pair of ints")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise CheckpointError(f"{where}: data_offsets {_show(offsets)} are negative or reversed")
    if end > body:
        raise CheckpointError(f"{where}: data_offsets {_show(offsets)} run past the end of the "
                              f"data ({body} bytes): truncated file?")
    nbytes = _nbytes(shape, _DTYPES[dtype].itemsize)
    if nbytes is None:
        raise CheckpointError(f"{where}: shape {_show(shape)} is too large for NumPy")
    if nbytes != end - begin:
        raise CheckpointError(f"{where}: {dtype}{_show(shape)} is {nbytes} bytes, but its "
                              f"data_offsets {_show(offsets)} hold {end - begin}")
    return name, _DTYPES[dtype], tuple(shape), begin, end


def _nbytes(shape, itemsize):
    """Bytes of an array of this shape, or None when NumPy could not make it: the product of
    the non-zero dimensions and the item size must fit in int64, even for an empty array."""
    size, empty = itemsize, False
    for d in shape:
        empty |= d == 0
        size *= d or 1
        if size > _MAX_INT:
            return None
    return 0 if empty else size


def _check_layout(path, entries, body):
    """The tensors' data, in offset order, must tile the data exactly: no gap, no overlap, no
    byte left over (what safetensors' own validate() requires)."""
    at, previous = 0, None
    for name, _, _, begin, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != at:
            after = "the start of the data" if previous is None else f"tensor {_show(previous)}"
            how = "overlaps" if begin < at else f"leaves a gap of {begin - at} bytes after"
            raise CheckpointError(f"{path}: tensor {_show(name)} (data_offsets [{begin}, {end}]) "
                                  f"{how} {after}, which ends at {at}")
        at, previous = end, name
    if at != body:
        raise CheckpointError(f"{path}: the last {body - at} of the {body} data bytes belong to "
                              f"no tensor")


def _read_data(f, path, entries):
    """-> {name: array} in header order, read from f, which is at the start of the data."""
    tensors = {}
    for name, dtype, shape, _, _ in sorted(entries, key=lambda e: (e[3], e[4])):
        a = np.empty(shape, dtype)
        view, got = memoryview(a.reshape(-1).view(np.uint8)), 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise CheckpointError(f"{path}: the file ended inside tensor {_show(name)} (it "
                                      f"shrank while it was being read)")
            got += n
        tensors[name] = a
    return {name: tensors[name] for name, *_ in entries}


def _open_regular(path):
    """path opened for reading as a binary file object; CheckpointError when it is not a
    regular file. Opened O_NONBLOCK, so that a FIFO is refused at once instead of the open
    waiting, forever, for a writer (O_NOCTTY: nor may a terminal become the controlling one);
    the flag is cleared before anything is read. As csrc/model/safetensors.c opens it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def load_file(path):
    """-> ({name: array}, {str: str}); raises CheckpointError for a bad file."""
    with _open_regular(path) as f:
        metadata, entries = _read_header(f, path)
        return _read_data(f, path, entries), metadata


# ---- writing --------------------------------------------------------------------------------


def save_file(path, tensors, metadata):
    """Write {name: array} and {str: str} metadata to path atomically: the data goes to a
    locked temporary file in the same folder, is flushed to disk, then renamed over path. Stale
    temporaries of earlier, killed saves of path are removed first. A folder that is missing
    or not writable raises OSError naming path.

    The new file keeps the permission bits of the file it replaces (a private 0600 checkpoint
    stays private, a 0444 one read-only), set before any data is written; a new path gets
    0666 less the umask. A symlink at path is replaced by the new file (its target is left as
    it was), which takes the target's permission bits."""
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
    try:
        _write(path, struct.pack("<Q", len(head)) + head, blobs)
    except OSError as e:
        message = f"cannot save checkpoint {path}: {e.strerror or e}"
        message += f" ({e.filename})" if e.filename else ""
        raise (OSError(message) if e.errno is None else OSError(e.errno, message)) from e


def _write(path, head, blobs):
    """Write head and blobs to a new locked temporary next to path, fsync it, rename it over
    path, fsync the folder; remove the temporary if anything fails."""
    _remove_stale_temporaries(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode) & 0o777  # a symlink's target's
    except FileNotFoundError:
        mode = None  # a new file: the umask's mode, as _create_temporary made it
    fd, tmp = _create_temporary(path)
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # before the data: a private file's bytes are never readable
        with os.fdopen(fd, "wb") as f:  # closing it drops the lock, after the rename
            f.write(head)
            for blob in blobs:
                f.write(blob)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
        _fsync_folder(os.path.dirname(tmp))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _temporary_prefix(path):
    """.tmp-<name>. : a temporary's name is this and 8 hex digits. A long name is cut (with a
    hash of the whole) so that the temporary's name stays under NAME_MAX (255 bytes)."""
    base = os.path.basename(path)
    if len(base) > 50:
        base = base[:40] + "~" + hashlib.sha256(os.fsencode(base)).hexdigest()[:8]
    return f".tmp-{base}."


def _create_temporary(path):
    """-> (fd, name) of a new, empty, locked temporary file next to path, mode 0666 & ~umask
    (an ordinary file)."""
    folder = os.path.dirname(os.path.abspath(path))
    prefix = _temporary_prefix(path)
    while True:
        tmp = os.path.join(folder, prefix + secrets.token_hex(4))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # a cleaner may have locked and removed it between the open and the lock
            ours = os.path.samestat(os.stat(tmp), os.fstat(fd))
        except FileNotFoundError:
            ours = False
        except OSError:
            ours = True  # no locks on this file system: then no cleaner removes anything either
        if ours:
            return fd, tmp
        os.close(fd)


def _remove_stale_temporaries(path):
    """Remove the temporaries of path that killed saves left: those no running save holds."""
    folder = os.path.dirname(os.path.abspath(path))
    prefix = _temporary_prefix(path)
    for entry in os.listdir(folder):
        if not (entry.startswith(prefix) and re.fullmatch("[0-9a-f]{8}", entry[len(prefix):])):
            continue
        tmp = os.path.join(folder, entry)
        try:  # O_RDWR: NFS emulates flock with fcntl locks, whose LOCK_EX needs a writable fd
            fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # removed meanwhile, or not ours to touch
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a save holds it
            if os.path.samestat(os.stat(tmp), os.fstat(fd)):
                os.unlink(tmp)
        except OSError:
            pass  # held by a running save (or no locks here): leave it
        finally:
            os.close(fd)


def _fsync_folder(folder):
    """Make a rename in folder durable (POSIX leaves that to an fsync of the folder)."""
    fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file system without folder fsync
            raise
    finally:
        os.close(fd)


# ---- the pytfm layer ------------------------------------------------------------------------


def save(path, model, step=0, optimizer=None, extra=None):
    """Save a GPT (and optionally its AdamW state) with its config and step. extra must be
    JSON (RFC 8259: NaN and Infinity are not) nested at most MAX_JSON_DEPTH (64) containers
    deep ({"a": [1]} is 2 deep), as load() will check: else ValueError, and nothing is
    written."""
    step = operator.index(step)
    if not 0 <= step <= _MAX_INT:
        raise ValueError(f"step must be a non-negative int64, got {step}")
    too_deep = f"extra is nested more than {MAX_JSON_DEPTH} levels deep (load() would refuse it)"
    try:
        extra_json = json.dumps(extra or {}, allow_nan=False)
    except RecursionError:
        raise ValueError(too_deep) from None
    if _json_depth_error(extra_json):
        raise ValueError(too_deep)
    tensors = dict(_on_host(model.params))
    meta = {"format": "pytfm", "config": json.dumps(asdict(model.cfg)), "step": str(step),
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
    with _open_regular(path) as f:
        meta, entries = _read_header(f, path)
        cfg, step, extra, t = _check_pytfm_metadata(path, meta)
        shapes = _check_tensors(path, cfg, t is not None, entries)
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
        tensors = _read_data(f, path, entries)
    if model is None:
        model = GPT(cfg, device)
    if hasattr(model.params, "copy_from"):  # a FlatDict: on the GPU, one copy of the buffer
        model.params.copy_from(tensors)
    else:
        for name, p in model.params.items():
            p[...] = devices.to_device(tensors[name], devices.device_of(p))
    if optimizer is not None:
        optimizer.load_state({"t": t, "m": {k: tensors[f"optim.m.{k}"] for k in shapes},
                              "v": {k: tensors[f"optim.v.{k}"] for k in shapes}})
    return model, step, extra


def _check_pytfm_metadata(path, meta):
    """-> (GPTConfig, step, extra, optim.t or None) from __metadata__, each checked."""
    if meta.get("format") != "pytfm" or "config" not in meta:
        raise CheckpointError(f"{path}: not a pytfm checkpoint (no pytfm config in __metadata__)")
    config = _json_field(path, meta, "config")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: config is a JSON {_kind(config)}, not an object")
    names = [f.name for f in fields(GPTConfig)]
    for name in names:
        if name not in config:
            raise CheckpointError(f"{path}: config has no {name}")
    for name in config:
        if name not in names:
            raise CheckpointError(f"{path}: config has an unknown field {_show(name)}")
    try:
        cfg = GPTConfig(**config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: config: {e}") from None
    if "step" not in meta:
        raise CheckpointError(f"{path}: __metadata__ has no step")
    step = _count_field(path, meta, "step")
    t = _count_field(path, meta, "optim.t") if "optim.t" in meta else None
    extra = _json_field(path, meta, "extra") if "extra" in meta else {}
    return cfg, step, extra, t


def _json_field(path, meta, key):
    try:
        return _parse_json(meta[key])
    except ValueError as e:
        raise CheckpointError(f"{path}: {key} is not valid JSON ({e})") from None


def _count_field(path, meta, key):
    """A non-negative int64 written in decimal."""
    text = meta[key]
    if not re.fullmatch("[0-9]{1,19}", text) or int(text) > _MAX_INT:
        raise CheckpointError(f"{path}: {key} is {_show(text)}, not a non-negative int64")
    return int(text)


def _check_tensors(path, cfg, with_optimizer, entries):
    """The stored tensors must be exactly the float32 parameters cfg implies (and their AdamW
    moments with_optimizer). Checked against param_shapes(cfg), which stops at the first
    mismatch: a config claiming a million layers in a small file fails at once. Also refuses
    a config whose sinusoidal table GPT(cfg) would allocate is out of all proportion to the
    stored parameters. -> {name: shape} of the parameters."""
    stored = {name: (dtype, shape) for name, dtype, shape, _, _ in entries}
    shapes, expected, count = {}, set(), 0
    for name, shape in param_shapes(cfg):
        keys = (name, f"optim.m.{name}", f"optim.v.{name}") if with_optimizer else (name,)
        for key in keys:
            if key not in stored:
                raise CheckpointError(f"{path}: tensor {key} is missing: config {asdict(cfg)} "
                                      f"needs float32{list(shape)}")
            dtype, got = stored[key]
            if dtype != np.float32 or got != shape:
                raise CheckpointError(f"{path}: {key} is {dtype.name}{list(got)}, config "
                                      f"{asdict(cfg)} needs float32{list(shape)}")
        shapes[name] = shape
        expected.update(keys)
        count += math.prod(shape)
    unexpected = [k for k in stored if k not in expected]
    if unexpected:
        more = f" and {len(unexpected) - 3} more" if len(unexpected) > 3 else ""
        raise CheckpointError(f"{path}: unexpected tensors {', '.join(map(_show, unexpected[:3]))}"
                              f"{more} (config {asdict(cfg)}"
                              f"{'' if with_optimizer else ', no optim.t'})")
    table = cfg.max_seq * cfg.d_model if cfg.pos == "sinusoidal" else 0
    if table > max(count, _MAX_TABLE):
        raise CheckpointError(f"{path}: config {asdict(cfg)} needs a sinusoidal table of "
                              f"{table} floats for {count} stored parameters")
    return shapes


def _check_arrays(what, arrays, shapes):
    """A caller's model or optimizer must hold float32 arrays of the parameters' shapes, so that
    copying into them cannot fail halfway."""
    if set(arrays) != set(shapes) or any(
            arrays[k].shape != s or arrays[k].dtype != np.float32 for k, s in shapes.items()):
        raise ValueError(f"{what} are not float32 arrays of the checkpoint's parameter shapes")
