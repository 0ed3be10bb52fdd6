"""cffi out-of-line API-mode builder for pytfm._pytfm_cffi.

The cdef is the public header itself (the part between its PYTFM_CDEF markers), so the binding
cannot drift from the C API. The extension links against libpytfm.so, which setup.py builds
first into pytfm/lib/ and finds at run time through an $ORIGIN rpath.
"""

import os
import re

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
INCLUDE_DIR = os.path.join(ROOT, "csrc", "include")
HEADER = os.path.join(INCLUDE_DIR, "pytfm.h")


def read_cdef(path=HEADER):
    """The declarations between the PYTFM_CDEF markers, with the export macro removed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"/\* PYTFM_CDEF_BEGIN \*/(.*)/\* PYTFM_CDEF_END \*/", text, re.S)
    if m is None:
        raise RuntimeError(f"{path}: PYTFM_CDEF_BEGIN/END markers not found")
    return re.sub(r"\bPYTFM_API\s+", "", m.group(1))


ffibuilder = cffi.FFI()
ffibuilder.cdef(read_cdef())
ffibuilder.set_source(
    "pytfm._pytfm_cffi",
    '#include "pytfm.h"',
    include_dirs=[INCLUDE_DIR],
    libraries=["pytfm"],
    # library_dirs is added by setup.py's build_ext, which knows where it built libpytfm.
    extra_link_args=["-Wl,-rpath,$ORIGIN/lib"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
