"""pytfm: a small transformer library on hand-written C kernels, bound through cffi.

    import numpy as np, pytfm
    y, mean, rstd = pytfm.ops.layernorm_forward(x, w, b)

pytfm.ops holds one function per op direction; pytfm.reference the float64 NumPy oracle.
"""

from . import ops
from ._core import PytfmError, build_info, version
from .ops import KVCache

__version__ = version()

__all__ = ["ops", "build_info", "KVCache", "PytfmError", "__version__"]
