"""Build pytfm: libpytfm (C kernels) into pytfm/lib, its header into pytfm/include, then the
cffi extension pytfm._pytfm_cffi linked to that same library (rpath $ORIGIN/lib).

Environment:
  PYTFM_WERROR=1   compile the C kernels with -Werror (CI does)
  PYTFM_OPENMP=0   build without OpenMP (by default it is used when the compiler has it)
  CC, CFLAGS       as for any setuptools build
CUDA kernels are not part of the build yet; they arrive with the CUDA backend issue.
"""

import os
import re
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = "csrc"
INCLUDE = os.path.join(CSRC, "include")
HEADER = os.path.join(INCLUDE, "pytfm.h")
# -fno-math-errno and -fno-trapping-math change no result (no errno from sqrtf, no FP exception
# flags); they let the compiler vectorise the element-wise loops (csrc/fast_impl.h). No
# -ffast-math: the kernels rely on IEEE semantics and a fixed order of operations.
C_FLAGS = ["-std=c11", "-O3", "-fPIC", "-fvisibility=hidden", "-fno-math-errno",
           "-fno-trapping-math", "-Wall", "-Wextra", "-Wpedantic"]


def read_version():
    with open(os.path.join(ROOT, HEADER), encoding="utf-8") as f:
        return re.search(r'#define PYTFM_VERSION "([^"]+)"', f.read()).group(1)


class BuildExt(build_ext):
    """Build libpytfm.so and libpytfm.a before the extensions that link to it."""

    def build_extensions(self):
        pkg_dir = os.path.join(ROOT if self.inplace else self.build_lib, "pytfm")
        lib_dir = os.path.join(pkg_dir, "lib")
        self.build_libpytfm(lib_dir)
        include_dir = os.path.join(pkg_dir, "include")
        os.makedirs(include_dir, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, HEADER), include_dir)
        for ext in self.extensions:
            ext.library_dirs.append(lib_dir)
        super().build_extensions()
        if not self.inplace:
            self.mirror_into_source(pkg_dir)

    def mirror_into_source(self, pkg_dir):
        """Copy what was built into the checkout's pytfm/ too (all of it git-ignored), so that
        `import pytfm` also works from the checkout root, where the source package shadows the
        installed one. It is the same build, so either import runs the same code."""
        src_pkg = os.path.join(ROOT, "pytfm")
        if os.path.abspath(pkg_dir) == src_pkg:
            return
        for sub in ("lib", "include"):
            src, dst = os.path.join(pkg_dir, sub), os.path.join(src_pkg, sub)
            shutil.copytree(src, dst, dirs_exist_ok=True)
        for ext in self.extensions:
            shutil.copy2(self.get_ext_fullpath(ext.name), src_pkg)

    def has_openmp(self):
        """Whether the C compiler can build and link an OpenMP program."""
        if os.environ.get("PYTFM_OPENMP") == "0":
            return False
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "omp.c")
            with open(src, "w") as f:
                f.write("#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n")
            try:
                objs = self.compiler.compile([src], output_dir=tmp, extra_postargs=["-fopenmp"])
                self.compiler.link_executable(objs, "omp", output_dir=tmp,
                                              extra_postargs=["-fopenmp"])
            except Exception:  # CompileError, LinkError: build without threads
                return False
        return True

    def build_libpytfm(self, lib_dir):
        flags = C_FLAGS + (["-Werror"] if os.environ.get("PYTFM_WERROR") == "1" else [])
        threads = ["-fopenmp"] if self.has_openmp() else []
        flags += threads
        sources = sorted(
            os.path.join(CSRC, f) for f in os.listdir(os.path.join(ROOT, CSRC)) if f.endswith(".c")
        )
        headers = [HEADER, os.path.join(CSRC, "internal.h")]  # rebuild when they change
        objects = self.compiler.compile(
            sources,
            output_dir=self.build_temp,
            macros=[("PYTFM_BUILDING", None), ("PYTFM_BUILD_FLAGS", f'"{" ".join(flags)}"')],
            include_dirs=[INCLUDE],
            extra_postargs=flags,
            depends=headers,
        )
        os.makedirs(lib_dir, exist_ok=True)
        self.compiler.link_shared_object(
            objects,
            os.path.join(lib_dir, "libpytfm.so"),
            libraries=["m"],
            extra_postargs=["-Wl,-soname,libpytfm.so"] + threads,
        )
        self.compiler.create_static_lib(objects, "pytfm", output_dir=lib_dir)


setup(
    version=read_version(),
    cffi_modules=["pytfm/_build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": BuildExt},
)
