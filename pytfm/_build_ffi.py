"""cffi out-of-line API-mode builder for pytfm._pytfm_cffi.

The cdef is the public headers themselves (the part between each one's PYTFM_CDEF markers, in
the order pytfm.h includes them), and their floating-point constants (read_constants), so the
binding cannot drift from the C API. The extension links against libpytfm.so.<ABI>, which
setup.py has CMake build first into pytfm/lib/, and finds it at run time through an $ORIGIN
rpath.
"""

import os
import re

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
INCLUDE_DIR = os.path.join(ROOT, "csrc", "include")
HEADER = os.path.join(INCLUDE_DIR, "pytfm.h")


def _headers(path):
    """The texts of the pytfm_*.h headers that path (pytfm.h) includes, in its order."""
    with open(path, encoding="utf-8") as f:
        parts = re.findall(r'^#include "(pytfm_\w+\.h)"', f.read(), re.M)
    if not parts:
        raise RuntimeError(f"{path}: includes no pytfm_*.h header")
    for name in parts:
        part = os.path.join(os.path.dirname(path), name)
        with open(part, encoding="utf-8") as f:
            yield part, f.read()


def read_cdef(path=HEADER):
    """The declarations of the headers that path (pytfm.h) includes, in its order: the text
    between each one's PYTFM_CDEF markers, with the export macro removed."""
    cdef = []
    for part, text in _headers(path):
        m = re.search(r"/\* PYTFM_CDEF_BEGIN \*/(.*)/\* PYTFM_CDEF_END \*/", text, re.S)
        if m is None:
            raise RuntimeError(f"{part}: PYTFM_CDEF_BEGIN/END markers not found")
        cdef.append(re.sub(r"\bPYTFM_API\s+", "", m.group(1)))
    return "\n".join(cdef)


def read_constants(path=HEADER):
    """The floating-point macros of those headers (`#define PYTFM_LAYERNORM_EPS 1e-5`), which a
    cdef `#define` cannot carry (it takes integers only), as `static const double <name>;`:
    the API-mode module reads each macro's value when it compiles."""
    float_macro = r"^#define (PYTFM_\w+) (?:\d+\.\d*(?:[eE]-?\d+)?|\d+[eE]-?\d+)$"
    return "".join(f"static const double {name};\n" for _, text in _headers(path)
                   for name in re.findall(float_macro, text, re.M))


ffibuilder = cffi.FFI()
ffibuilder.cdef(read_cdef() + read_constants())
ffibuilder.set_source(
    "pytfm._pytfm_cffi",
    '#include "pytfm.h"',
    include_dirs=[INCLUDE_DIR],
    # the library itself is added by setup.py's build_ext, which knows where CMake put it
    extra_link_args=["-Wl,-rpath,$ORIGIN/lib"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
