"""pip install . : CMakeLists.txt builds libpytfm and installs it into the package (pytfm/lib:
libpytfm.so.<ABI>, libpytfm.a, pkgconfig/pytfm.pc and, with CUDA, cuda_build.log;
pytfm/include: the public headers), then the cffi extension pytfm._pytfm_cffi is linked to that
same library (rpath $ORIGIN/lib). The build logic is CMake's; this file only drives it.

Environment: PYTFM_CUDA, PYTFM_CUDA_ARCH, PYTFM_OPENMP and PYTFM_WERROR set the CMake options
of those names, NVCC_CCBIN sets CMAKE_CUDA_HOST_COMPILER (CMakeLists.txt says what each does);
CMAKE_BUILD_PARALLEL_LEVEL caps the parallel jobs (default: one per CPU).
"""

import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import SetupError

ROOT = os.path.dirname(os.path.abspath(__file__))
# environment variable -> CMake cache variable; unset, CMakeLists.txt's default holds
OPTIONS = {"PYTFM_CUDA": "PYTFM_CUDA", "PYTFM_CUDA_ARCH": "PYTFM_CUDA_ARCH",
           "PYTFM_OPENMP": "PYTFM_OPENMP", "PYTFM_WERROR": "PYTFM_WERROR",
           "NVCC_CCBIN": "CMAKE_CUDA_HOST_COMPILER"}


def read_version():
    with open(os.path.join(ROOT, "csrc", "include", "pytfm_core.h"), encoding="utf-8") as f:
        return re.search(r'#define PYTFM_VERSION "([^"]+)"', f.read()).group(1)


def find_cmake():
    """cmake on PATH (pip puts the build requirement's there), else the one of an importable
    cmake package (installed with pip --target, say)."""
    found = shutil.which("cmake")
    if found:
        return found
    try:
        import cmake
    except ImportError:
        raise SetupError("cmake (>= 3.18) is needed to build pytfm: `pip install .` brings it; "
                         "for setup.py itself, `pip install cmake` or put one on PATH") from None
    return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")


class BuildExt(build_ext):
    """CMake's configure, build and install of libpytfm, before the extension that links it."""

    def build_extensions(self):
        pkg_dir = os.path.join(ROOT if self.inplace else self.build_lib, "pytfm")
        lib_dir = os.path.join(pkg_dir, "lib")
        self.build_libpytfm(pkg_dir)
        # the one library file CMake installed, linked by path: the extension records its
        # SONAME, libpytfm.so.<ABI>, and finds it through the $ORIGIN/lib rpath
        shared = [f for f in os.listdir(lib_dir) if re.fullmatch(r"libpytfm\.so\.\d+", f)]
        if len(shared) != 1:
            raise SetupError(f"expected one libpytfm.so.<ABI> in {lib_dir}, found {shared}")
        library = os.path.join(lib_dir, shared[0])
        for ext in self.extensions:
            ext.extra_objects.append(library)
            # relinked when the library is newer: an extension left in build/ by an earlier
            # build may name another library (a former SONAME) and would not load
            ext.depends.append(library)
        super().build_extensions()
        if not self.inplace:
            self.mirror_into_source(pkg_dir)

    def build_libpytfm(self, pkg_dir):
        cmake = find_cmake()
        build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
        configure = [cmake, "-S", ROOT, "-B", build_dir, "-DPYTFM_PYTHON_LAYOUT=ON",
                     "-DPYTFM_EXAMPLES=OFF", "-DCMAKE_INSTALL_LIBDIR=lib",
                     "-DCMAKE_INSTALL_INCLUDEDIR=include"]
        for env, var in OPTIONS.items():
            value = os.environ.get(env, "").strip()
            # -U: an option unset now takes its default, not the value of an earlier build
            configure.append(f"-D{var}={value}" if value else f"-U{var}")
        jobs = self.parallel or os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or os.cpu_count()
        # what a former install left in the package (another library name, an old log) goes
        for sub in ("lib", "include"):
            shutil.rmtree(os.path.join(pkg_dir, sub), ignore_errors=True)
        steps = {"configure": configure,
                 "build": [cmake, "--build", build_dir, "-j", str(jobs)],
                 "install": [cmake, "--install", build_dir, "--prefix", os.path.abspath(pkg_dir)]}
        for name, command in steps.items():
            if subprocess.run(command).returncode:
                raise SetupError(f"the CMake {name} of libpytfm failed (its output is above): "
                                 f"{' '.join(command)}")

    def mirror_into_source(self, pkg_dir):
        """Copy what was built into the checkout's pytfm/ too (all of it git-ignored), so that
        `import pytfm` also works from the checkout root, where the source package shadows the
        installed one. It is the same build, so either import runs the same code."""
        src_pkg = os.path.join(ROOT, "pytfm")
        if os.path.abspath(pkg_dir) == src_pkg:
            return
        for sub in ("lib", "include"):
            dst = os.path.join(src_pkg, sub)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(os.path.join(pkg_dir, sub), dst)
        for ext in self.extensions:
            shutil.copy2(self.get_ext_fullpath(ext.name), src_pkg)


setup(
    version=read_version(),
    cffi_modules=["pytfm/_build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": BuildExt},
)
