"""pytfm: a small transformer library on hand-written C kernels, bound through cffi.

    import numpy as np, pytfm
    y, mean, rstd = pytfm.ops.layernorm_forward(x, w, b)

pytfm.ops holds one function per op direction (stateless); pytfm.KVCache the keys and values
of a decoding run; pytfm.nn a GPT with hand-written backward passes (on the CPU, or on the GPU
with CuPy: pytfm.device); pytfm.reference the float64 NumPy oracle.
"""

from . import device, ops
from ._core import (
    PytfmError,
    _settings_from_environment,
    build_info,
    get_isa,
    get_num_threads,
    set_max_isa,
    set_num_threads,
    version,
)
from .kvcache import KVCache

__version__ = version()
_settings_from_environment()

__all__ = ["KVCache", "PytfmError", "__version__", "build_info", "device", "get_isa",
           "get_num_threads", "ops", "set_max_isa", "set_num_threads"]
