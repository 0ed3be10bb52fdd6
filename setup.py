"""Build pytfm: libpytfm (C kernels, and the CUDA kernels when nvcc is found) into pytfm/lib,
with a pkg-config file for C programs in pytfm/lib/pkgconfig (`python -m pytfm --pkgconfig-dir`),
its header into pytfm/include, then the cffi extension pytfm._pytfm_cffi linked to that same
library (rpath $ORIGIN/lib). CMakeLists.txt builds the same library without Python; both read
the compiler flags from cmake/flags.txt and fill cmake/pytfm.pc.in.

Environment:
  PYTFM_WERROR=1      compile the C and CUDA kernels with warnings as errors (CI does)
  PYTFM_OPENMP=0      build without OpenMP (by default it is used when the compiler has it)
  PYTFM_CUDA=0 / =1   never / always build the CUDA kernels (=1 fails when nvcc is missing);
                      unset: build them when nvcc is on PATH or in $CUDA_HOME/bin, $CUDA_PATH/bin
  PYTFM_CUDA_ARCH     compute capabilities to compile for, e.g. "90" or "80;90" (default
                      "80;90"), plus PTX of the newest for the GPUs after it
  NVCC_CCBIN          host compiler for nvcc (default: nvcc's own choice)
  CC, CFLAGS          as for any setuptools build
With CUDA, nvcc's per-kernel register and shared-memory report (-Xptxas -v) is written to
pytfm/lib/cuda_build.log, and the CUDA runtime is linked statically (libcudart_static), so the
library needs only the NVIDIA driver at run time, and loads without one.
"""

import hashlib
import os
import re
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import SetupError

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = "csrc"
INCLUDE = os.path.join(CSRC, "include")
HEADER = os.path.join(INCLUDE, "pytfm.h")
CORE_HEADER = os.path.join(INCLUDE, "pytfm_core.h")  # the version
CUDA_HEADER = os.path.join(INCLUDE, "pytfm_cuda.h")  # the CUDA entry points
FLAGS_FILE = os.path.join("cmake", "flags.txt")
PC_TEMPLATE = os.path.join("cmake", "pytfm.pc.in")


def read_flags():
    """{name: [flag, ...]} of cmake/flags.txt, the one list of compiler flags that this build and
    CMakeLists.txt both read (the reasons for the flags are written there)."""
    path = os.path.join(ROOT, FLAGS_FILE)
    flags = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                name, eq, value = line.partition("=")
                if not eq:
                    raise SetupError(f"{path}: expected NAME = flags, got {line!r}")
                flags[name.strip()] = value.split()
    return flags


FLAGS = read_flags()
C_FLAGS = FLAGS["C_FLAGS"]
CUDA_DIR = "cuda"
# the CUDA entry points of a CPU-only build that are not plain stubs; cuda_stub_source()
# generates the others from the header
CUDA_STUB = os.path.join(CSRC, "core", "cuda_stub.c")
CUDA_STUB_MESSAGE = "pytfm was built without CUDA (nvcc not found, or PYTFM_CUDA=0)"
CUDA_SYSTEM_LIBS = ["-lcudart_static", "-lstdc++", "-lrt", "-ldl", "-lpthread"]


class Cuda:
    """Where nvcc is, what it is, and the flags it gets; None from find() when not used."""

    def __init__(self, nvcc):
        self.nvcc = nvcc
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
        major, minor = re.search(r"release (\d+)\.(\d+)", out.stdout).groups()
        self.version = 1000 * int(major) + 10 * int(minor)
        self.home = self.toolkit_root()
        self.lib_dir = next(
            (d for d in (os.path.join(self.home, "lib64"), os.path.join(self.home, "lib"),
                         os.path.join(self.home, "targets", "x86_64-linux", "lib"))
             if os.path.exists(os.path.join(d, "libcudart_static.a"))),
            None,
        )
        if self.lib_dir is None:
            raise SetupError(f"libcudart_static.a not found under {self.home} (from {nvcc})")
        archs = os.environ.get("PYTFM_CUDA_ARCH", "80;90").replace(",", ";").split(";")
        archs = sorted({a.strip().removeprefix("sm_") for a in archs if a.strip()}, key=int)
        self.archs = archs
        self.gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
        self.gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")

    def toolkit_root(self):
        """The toolkit folder: nvcc may be a wrapper script, so ask nvcc where it lives."""
        for var in ("CUDA_HOME", "CUDA_PATH"):
            if os.environ.get(var) and os.path.isdir(os.environ[var]):
                return os.environ[var]
        out = subprocess.run([self.nvcc, "--dryrun", "-c", "pytfm-probe.cu"], capture_output=True,
                             text=True)
        m = re.search(r"^#\$ _HERE_=(.*)$", out.stdout + out.stderr, re.M)
        here = m.group(1).strip() if m else os.path.dirname(os.path.realpath(self.nvcc))
        return os.path.dirname(here)

    @staticmethod
    def find():
        mode = os.environ.get("PYTFM_CUDA", "").strip()
        if mode not in ("", "0", "1"):
            raise SetupError(f"PYTFM_CUDA must be 0, 1 or unset, got {mode!r}")
        if mode == "0":
            return None
        nvcc = shutil.which("nvcc")
        for var in ("CUDA_HOME", "CUDA_PATH"):
            candidate = os.path.join(os.environ.get(var) or "/nonexistent", "bin", "nvcc")
            if nvcc is None and os.access(candidate, os.X_OK):
                nvcc = candidate
        if nvcc is None and mode == "1":
            raise SetupError(
                "PYTFM_CUDA=1 asks for the CUDA kernels, but nvcc was found neither on PATH nor "
                "in $CUDA_HOME/bin or $CUDA_PATH/bin; install the CUDA toolkit or unset PYTFM_CUDA"
            )
        return Cuda(nvcc) if nvcc else None


def c_files(suffix):
    """Every csrc/**/*<suffix>, sorted: the library's sources (".c") or headers (".h")."""
    return sorted(
        os.path.relpath(os.path.join(d, f), ROOT)
        for d, _, files in os.walk(os.path.join(ROOT, CSRC)) for f in files if f.endswith(suffix)
    )


def c_headers():
    """The public headers and every internal one (internal.h, checks.h, fast.h, ...): an object
    is rebuilt when one of them is newer."""
    return c_files(".h")


def cuda_entry_points(header_text):
    """{name: parameter list} of the CUDA entry points declared between the PYTFM_CDEF markers
    of pytfm_cuda.h: every pytfm_*_cuda and pytfm_cuda_* function."""
    cdef = re.search(r"PYTFM_CDEF_BEGIN(.*)PYTFM_CDEF_END", header_text, re.S).group(1)
    cdef = re.sub(r"/\*.*?\*/", "", cdef, flags=re.S)
    decls = re.findall(r"PYTFM_API\s+pytfm_status\s+(pytfm_cuda_\w+|pytfm_\w+_cuda)\s*\(([^)]*)\)",
                       cdef)
    return {name: " ".join(params.split()) for name, params in decls}


def cuda_stub_source(header_text, hand_written):
    """C source of the plain stubs of a CPU-only build: one for each CUDA entry point of the
    header that hand_written (csrc/core/cuda_stub.c's text) does not define, returning
    PYTFM_STATUS_NOT_SUPPORTED. It includes pytfm.h, so the compiler checks each signature."""
    defined = set(re.findall(r"^pytfm_status\s+(pytfm_\w+)\s*\(", hand_written, re.M))
    # cmake/cuda_stubs.cmake writes the same bytes for a build without Python (a test compares)
    out = [f"/* Generated from {CUDA_HEADER} by setup.py's cuda_stub_source() or by",
           " * cmake/cuda_stubs.cmake (the same bytes): the CUDA entry points of a build without",
           f" * CUDA that {CUDA_STUB} does not define. Do not edit. */",
           '#include "core/internal.h"', "",
           "static pytfm_status no_cuda(const char *func) {",
           f'    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED, "%s: {CUDA_STUB_MESSAGE}", func);',
           "}"]
    for name, params in cuda_entry_points(header_text).items():
        if name in defined:
            continue
        names = [re.search(r"(\w+)\s*$", p).group(1) for p in params.split(",")
                 if p.strip() != "void"]
        out += ["", f"pytfm_status {name}({params}) {{",
                "    " + " ".join(f"(void){n};" for n in names),  # a stub reads no argument
                "    return no_cuda(__func__);", "}"]
    return "\n".join(out) + "\n"


def pc_file_text(version, libs_private):
    """pytfm.pc for pip's installation (pytfm/lib/pkgconfig/), from cmake/pytfm.pc.in, the
    template CMakeLists.txt fills for its own install."""
    values = {
        # relocatable: pytfm/lib/pkgconfig/../.. is the package folder, wherever the wheel lands
        "PC_PREFIX": "${pcfiledir}/../..",
        "PC_INCLUDEDIR": "${prefix}/include",
        "PC_LIBDIR": "${prefix}/lib",
        # libpytfm.so lies inside site-packages, where the run-time linker never looks: without
        # this rpath `cc prog.c $(pkg-config --libs pytfm)` would build a program that does not
        # start (the CMake install, in a system prefix, has no rpath)
        "PC_RPATH": " -Wl,-rpath,${libdir}",
        "PC_VERSION": version,
        "PC_LIBS_PRIVATE": " ".join(libs_private),
    }

    def fill(m):
        if m.group(1) not in values:
            raise SetupError(f"{PC_TEMPLATE}: setup.py has no value for @{m.group(1)}@")
        return values[m.group(1)]

    with open(os.path.join(ROOT, PC_TEMPLATE), encoding="utf-8") as f:
        return re.sub(r"@(\w+)@", fill, f.read())


def read_version():
    with open(os.path.join(ROOT, CORE_HEADER), encoding="utf-8") as f:
        return re.search(r'#define PYTFM_VERSION "([^"]+)"', f.read()).group(1)


class BuildExt(build_ext):
    """Build libpytfm.so and libpytfm.a before the extensions that link to it."""

    def build_extensions(self):
        pkg_dir = os.path.join(ROOT if self.inplace else self.build_lib, "pytfm")
        lib_dir = os.path.join(pkg_dir, "lib")
        self.build_libpytfm(lib_dir)
        include_dir = os.path.join(pkg_dir, "include")
        os.makedirs(include_dir, exist_ok=True)
        for header in os.listdir(os.path.join(ROOT, INCLUDE)):
            shutil.copy2(os.path.join(ROOT, INCLUDE, header), include_dir)
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
        werror = os.environ.get("PYTFM_WERROR") == "1"
        flags = C_FLAGS + (["-Werror"] if werror else [])
        threads = ["-fopenmp"] if self.has_openmp() else []
        flags += threads
        cuda = Cuda.find()
        sources = c_files(".c")
        macros = [("PYTFM_BUILDING", None), ("PYTFM_BUILD_FLAGS", f'"{" ".join(flags)}"')]
        if cuda:
            sources.remove(CUDA_STUB)
            macros += [("PYTFM_CUDA", "1"), ("PYTFM_CUDA_VERSION", str(cuda.version))]
        else:
            sources.append(self.write_cuda_stubs())
        headers = c_headers()  # rebuild when they change
        objects = self.compiler.compile(
            sources,
            output_dir=self.build_temp,
            macros=macros,
            include_dirs=[INCLUDE, CSRC],
            extra_postargs=flags,
            depends=headers,
        )
        os.makedirs(lib_dir, exist_ok=True)
        link = ["-Wl,-soname,libpytfm.so"] + threads
        static_link = []  # what a C program linking libpytfm.a needs besides -lm
        if cuda:
            objects += self.build_cuda(cuda, lib_dir, werror)
            static_link = [f"-L{cuda.lib_dir}"] + CUDA_SYSTEM_LIBS
            # cudart's symbols stay inside libpytfm.so: no clash with another CUDA runtime
            link += static_link + ["-Wl,--exclude-libs,ALL"]
        self.compiler.link_shared_object(
            objects, os.path.join(lib_dir, "libpytfm.so"), libraries=["m"], extra_postargs=link
        )
        self.compiler.create_static_lib(objects, "pytfm", output_dir=lib_dir)
        with open(os.path.join(lib_dir, "static_link.txt"), "w") as f:
            f.write(" ".join(static_link) + "\n")
        # pkg-config --static adds Libs.private: what libpytfm.a needs besides itself
        os.makedirs(os.path.join(lib_dir, "pkgconfig"), exist_ok=True)
        with open(os.path.join(lib_dir, "pkgconfig", "pytfm.pc"), "w", encoding="utf-8") as f:
            f.write(pc_file_text(read_version(), ["-lm", *threads, *static_link]))

    def write_cuda_stubs(self):
        """Generate the plain CUDA stubs of a CPU-only build into the build folder (rewritten
        only when they change); return the file's path."""
        with open(os.path.join(ROOT, CUDA_HEADER), encoding="utf-8") as f:
            header = f.read()
        with open(os.path.join(ROOT, CUDA_STUB), encoding="utf-8") as f:
            text = cuda_stub_source(header, f.read())
        path = os.path.join(self.build_temp, "generated", "cuda_stubs.c")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    return path
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def build_cuda(self, cuda, lib_dir, werror):
        """nvcc -c each cuda/*.cu; its -Xptxas -v report goes to lib_dir/cuda_build.log."""
        host = FLAGS["CUDA_HOST_FLAGS"] + (["-Werror"] if werror else [])
        flags = [*FLAGS["CUDA_FLAGS"], "-Xcompiler", ",".join(host), "-Xptxas", "-v",
                 "-DPYTFM_BUILDING", f"-I{INCLUDE}", f"-I{CSRC}", f"-I{CUDA_DIR}", *cuda.gencode]
        if werror:
            flags += ["-Werror", "all-warnings"]
        if os.environ.get("NVCC_CCBIN"):
            flags += ["-ccbin", os.environ["NVCC_CCBIN"]]
        cu_dir = os.path.join(ROOT, CUDA_DIR)
        sources = sorted(os.path.join(CUDA_DIR, f) for f in os.listdir(cu_dir) if f.endswith(".cu"))
        headers = [*c_headers(),
                   *(os.path.join(CUDA_DIR, f) for f in os.listdir(cu_dir) if f.endswith(".cuh"))]
        # the flags are part of the object folder's name: a change of arch or flags rebuilds
        tag = hashlib.sha1(" ".join([cuda.nvcc, *flags]).encode()).hexdigest()[:10]
        obj_dir = os.path.join(self.build_temp, f"cuda-{tag}")
        os.makedirs(obj_dir, exist_ok=True)
        log_path = os.path.join(lib_dir, "cuda_build.log")
        newest_header = max(os.path.getmtime(os.path.join(ROOT, h)) for h in headers)
        objects = []
        with open(log_path, "w") as log:
            log.write(f"# {cuda.nvcc} (CUDA {cuda.version}) {' '.join(flags)}\n")
            for src in sources:
                obj = os.path.join(obj_dir, os.path.basename(src) + ".o")
                objects.append(obj)
                log.write(f"\n## {src}\n")
                # an object newer than its sources is reused, with the report kept beside it
                if not os.path.exists(obj + ".log") or os.path.getmtime(obj) <= max(
                    newest_header, os.path.getmtime(os.path.join(ROOT, src))
                ):
                    print(f"nvcc {src}", flush=True)
                    r = subprocess.run([cuda.nvcc, *flags, "-c", src, "-o", obj], cwd=ROOT,
                                       capture_output=True, text=True)
                    if r.returncode:
                        log.write(r.stdout + r.stderr)
                        raise SetupError(f"nvcc failed on {src} (log: {log_path}):\n"
                                         f"{r.stderr[-4000:]}")
                    with open(obj + ".log", "w") as f:
                        f.write(r.stdout + r.stderr)
                with open(obj + ".log") as f:
                    log.write(f.read())
        return objects


setup(
    version=read_version(),
    cffi_modules=["pytfm/_build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": BuildExt},
)
