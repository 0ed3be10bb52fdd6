"""The standalone build (CMakeLists.txt) and pytfm.pc, the way a C program without Python uses
the library.

Once per session, CMake configures, builds and installs libpytfm from a clean folder into a
prefix, with a PATH that holds the tools it needs and no Python. Programs then use that prefix
through find_package(pytfm) (tests/c_api/consumer, shared and static) and through pkg-config; the
pip build's pytfm.pc (pytfm/lib/pkgconfig) builds examples/layernorm.c. The library pip installed
(setup.py driving the same CMakeLists.txt) is checked to be the same library: SONAME, exported
symbols, compiler flags.

cmake (>= 3.18), make, pkg-config and a C compiler are needed: a missing one fails these
tests with a message saying so (CI has them all).
"""

import os
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from helpers import ROOT, header_text, public_headers

CONSUMER = os.path.join(ROOT, "tests", "c_api", "consumer")
# what CMake, make, the compiler driver and pkg-config run by name
BUILD_TOOLS = ("cmake", "make", "sh", "ar", "ranlib", "as", "ld", "pkg-config")

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")),
                                reason="needs the source checkout (CMakeLists.txt)")


def header_macros():
    with open(os.path.join(ROOT, "csrc", "include", "pytfm_core.h"), encoding="utf-8") as f:
        text = f.read()
    macros = dict(re.findall(r'^#define (PYTFM_\w+) "?([\w.]+)"?$', text, re.M))
    return types.SimpleNamespace(
        version=macros["PYTFM_VERSION"], abi=int(macros["PYTFM_ABI_VERSION"]),
        major=int(macros["PYTFM_VERSION_MAJOR"]), minor=int(macros["PYTFM_VERSION_MINOR"]))


def need(tool, path=None):
    """The full path of tool, or a failure saying it is missing (no silent skip: CI has it)."""
    found = shutil.which(tool, path=path)
    if not found:
        pytest.fail(f"{tool} not found on PATH: tests/packaging/test_cmake.py needs cmake >= 3.18, "
                    "make, pkg-config, binutils and a C compiler", pytrace=False)
    return found


def run(cmd, env, cwd=None, what=None):
    """Run cmd; on failure, fail with its output. Returns its stdout."""
    r = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        pytest.fail(f"{what or cmd[0]} failed ({r.returncode}): {' '.join(map(str, cmd))}\n"
                    f"{r.stdout[-3000:]}\n{r.stderr[-5000:]}", pytrace=False)
    return r.stdout


def executable(tool):
    """The program a tool's name runs: for cmake from the package index (a Python script that
    runs the cmake binary its package holds), that binary."""
    found = need(tool)
    with open(found, "rb") as f:
        if tool != "cmake" or f.read(2) != b"#!":
            return found
    import cmake

    return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")


def no_python_env(tmp):
    """An environment whose PATH is a folder of links to the build tools only: no Python."""
    tools = tmp / "tools"
    tools.mkdir()
    compiler = need(os.environ.get("CC") or "cc")
    os.symlink(compiler, tools / "cc")
    for tool in BUILD_TOOLS:
        os.symlink(executable(tool), tools / tool)
    env = {"PATH": str(tools), "HOME": str(tmp), "LANG": "C", "CC": "cc"}
    for python in ("python", "python3", os.path.basename(sys.executable)):
        assert shutil.which(python, path=env["PATH"]) is None, python
    return env


@pytest.fixture(scope="module")
def cmake_install(tmp_path_factory):
    """libpytfm configured, built and installed by CMake alone (PYTFM_WERROR=ON) from a clean
    build folder; its prefix, build folder, environment and configure output."""
    tmp = tmp_path_factory.mktemp("cmake")
    env = no_python_env(tmp)
    build, prefix = tmp / "build", tmp / "prefix"
    configure = run(["cmake", "-S", ROOT, "-B", build, "-DPYTFM_WERROR=ON",
                     f"-DCMAKE_INSTALL_PREFIX={prefix}"], env, what="cmake configure")
    run(["cmake", "--build", build, "-j2"], env, what="cmake --build")
    run(["cmake", "--install", build], env, what="cmake --install")
    return types.SimpleNamespace(prefix=prefix, build=build, env=env, tmp=tmp,
                                 configure=configure)


def needed_libraries(exe):
    out = run([need("readelf"), "-d", exe], os.environ)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", out)


def soname(lib):
    out = run([need("readelf"), "-d", lib], os.environ)
    return re.search(r"\(SONAME\)\s+Library soname: \[(.+)\]", out).group(1)


def check_consumer_output(out):
    """main.c's report: the header's version and ABI, softmax checked."""
    h = header_macros()
    lines = out.splitlines()
    assert lines[0] == f"pytfm {h.version} abi {h.abi}", out
    assert lines[-1] == "softmax ok", out
    return dict(line.split(": ", 1) for line in lines[1:-1])


def test_cmake_builds_and_installs_without_python(cmake_install):
    h = header_macros()
    p = cmake_install.prefix
    for f in ("include/pytfm.h", "lib/libpytfm.a", "lib/libpytfm.so", f"lib/libpytfm.so.{h.abi}",
              f"lib/libpytfm.so.{h.version}", "lib/pkgconfig/pytfm.pc",
              "lib/cmake/pytfm/pytfmConfig.cmake", "lib/cmake/pytfm/pytfmConfigVersion.cmake",
              "lib/cmake/pytfm/pytfmTargets.cmake", "lib/cmake/pytfm/pytfmStaticTargets.cmake"):
        assert (p / f).exists(), f"not installed: {f}"
    assert soname(p / "lib" / "libpytfm.so") == f"libpytfm.so.{h.abi}"
    for header in public_headers():
        installed = p / "include" / os.path.basename(header)
        assert installed.read_bytes() == open(header, "rb").read(), f"not installed: {installed}"
    assert f"pytfm {h.version} (ABI {h.abi})" in cmake_install.configure


def test_the_shared_library_exports_the_public_api_only(cmake_install):
    out = run([need("nm"), "-D", "--defined-only", cmake_install.prefix / "lib" / "libpytfm.so"],
              os.environ)
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    header = header_text()
    declared = set(re.findall(r"PYTFM_API\s+[\w\s*]*?\b(pytfm_\w+)\s*\(", header))
    assert len(declared) >= 40 and "pytfm_abi_version" in declared
    assert not [s for s in exported if s.startswith("pytfm__")], "internal helpers leak"
    assert not [s for s in exported if not s.startswith("pytfm_")], "non-pytfm symbols leak"
    undeclared = sorted(exported - declared)
    assert not undeclared, f"exported but not declared in pytfm.h: {undeclared}"
    assert {"pytfm_version", "pytfm_abi_version", "pytfm_softmax_forward",
            "pytfm_softmax_forward_cuda", "pytfm_cuda_device_count"} <= exported


def test_find_package_consumer_builds_and_runs_shared_and_static(cmake_install):
    h = header_macros()
    build = cmake_install.tmp / "consumer"
    run(["cmake", "-S", CONSUMER, "-B", build, f"-DCMAKE_PREFIX_PATH={cmake_install.prefix}",
         f"-DPYTFM_REQUEST={h.major}.{h.minor}"], cmake_install.env, what="consumer configure")
    run(["cmake", "--build", build, "-j2"], cmake_install.env, what="consumer build")
    # the shared one finds libpytfm through the rpath CMake gives a program it builds
    shared = check_consumer_output(run([build / "consumer"], cmake_install.env))
    static = check_consumer_output(run([build / "consumer_static"], cmake_install.env))
    assert shared == static and shared["cuda"] == "0"
    assert f"libpytfm.so.{h.abi}" in needed_libraries(build / "consumer")
    assert not [n for n in needed_libraries(build / "consumer_static") if "pytfm" in n]


def test_the_cmake_built_generator_continues_text_as_python_does(cmake_install, tmp_path):
    """examples/generate.c as the standalone build makes it (build/examples/generate), on a
    checkpoint pytfm.checkpoint.save wrote: greedy, its text is pytfm.generate.generate's."""
    from pytfm import checkpoint
    from pytfm.generate import generate
    from pytfm.nn import GPT, GPTConfig

    model = GPT(GPTConfig(vocab=256, d_model=16, n_layer=2, n_head=2, max_seq=48, seed=5))
    path = tmp_path / "model.safetensors"
    checkpoint.save(str(path), model)
    ref = generate(model, np.array([list(b"def ")]), 30, temperature=0.0)[0]
    exe = cmake_install.build / "examples" / "generate"
    r = subprocess.run([str(exe), str(path), "--prompt", "def ", "--tokens", "30",
                        "--temperature", "0"], env=cmake_install.env, capture_output=True)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout == bytes(ref.tolist()) + b"\n"
    assert b"tokens/s" in r.stderr


def test_the_cmake_built_generator_continues_a_gpt2_folder_as_transformers_does(cmake_install,
                                                                              tmp_path):
    """The same binary on a Hugging Face GPT-2 folder (a random GPT-2 made with transformers,
    GPT-2's vocabulary beside it): greedy, its text is transformers' greedy continuation
    (tests/c_api/test_generate_gpt2.py checks the pkg-config build at length)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "model"))
    from gpt2_oracle import greedy, random_gpt2, transformers, vocab_files

    from pytfm.tokenizer import bytes_to_unicode

    vocab, merges = vocab_files()
    folder = tmp_path / "gpt2"
    hf = random_gpt2(3, scale=3.0, vocab_size=50257, n_positions=32, n_embd=16, n_layer=1,
                     n_head=2)
    hf.save_pretrained(str(folder))
    shutil.copyfile(vocab, folder / "vocab.json")
    shutil.copyfile(merges, folder / "merges.txt")
    tok = transformers().GPT2TokenizerFast.from_pretrained(str(folder))
    ids = tok("Hello")["input_ids"]
    want = greedy(hf, [ids], 20)[0].tolist()
    back = {c: b for b, c in bytes_to_unicode().items()}
    text = bytes(back[c] for c in "".join(tok.convert_ids_to_tokens(want)))
    exe = cmake_install.build / "examples" / "generate"
    r = subprocess.run([str(exe), str(folder), "--prompt", "Hello", "--tokens", "20",
                        "--temperature", "0"], env=cmake_install.env, capture_output=True)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout == text + b"\n"


def test_find_package_version_rule(cmake_install):
    """0.x: the same minor version (semantic versioning lets 0.x break at a minor step); from
    1.0 on, the same major version, each no newer than what is installed."""
    h = header_macros()
    version_file = cmake_install.prefix / "lib" / "cmake" / "pytfm" / "pytfmConfigVersion.cmake"
    script = cmake_install.tmp / "ask.cmake"
    script.write_text(f'include("{version_file}")\n'
                      'message(STATUS "compatible=${PACKAGE_VERSION_COMPATIBLE}")\n')
    asks = {(h.major, h.minor), (h.major, h.minor + 1), (h.major + 1, 0), (h.major, 0)}
    if h.major:
        asks.add((h.major - 1, 0))
    for major, minor in sorted(asks):
        out = run(["cmake", f"-DPACKAGE_FIND_VERSION={major}.{minor}",
                   f"-DPACKAGE_FIND_VERSION_MAJOR={major}", f"-DPACKAGE_FIND_VERSION_MINOR={minor}",
                   "-P", script], cmake_install.env)
        want = major == h.major and (major > 0 or minor == h.minor) and minor <= h.minor
        assert f"compatible={'TRUE' if want else 'FALSE'}" in out, (major, minor, out)


def pkg_config(args, pc_dir, env):
    return run(["pkg-config", *args, "pytfm"], dict(env, PKG_CONFIG_PATH=str(pc_dir))).split()


def static_link_flags(pc_dir, env):
    """pkg-config --static --libs with the archive for the shared library's flag (-lpytfm; in
    pip's pytfm.pc -l:libpytfm.so.<ABI>): a linker given -lpytfm picks libpytfm.so when both
    are there, so a static link names the archive (GNU ld's -l:)."""
    libs = pkg_config(["--static", "--libs"], pc_dir, env)
    shared = ("-lpytfm", f"-l:libpytfm.so.{header_macros().abi}")
    assert len([f for f in libs if f in shared]) == 1 and "-lm" in libs, libs
    return ["-l:libpytfm.a" if flag in shared else flag for flag in libs]


def test_pkg_config_consumer_builds_and_runs_shared_and_static(cmake_install):
    h = header_macros()
    env, prefix = cmake_install.env, cmake_install.prefix
    pc_dir = prefix / "lib" / "pkgconfig"
    assert pkg_config(["--modversion"], pc_dir, env) == [h.version]
    # relocatable: the paths come from the .pc file's own folder
    for var, where in (("includedir", "include"), ("libdir", "lib")):
        got = pkg_config([f"--variable={var}"], pc_dir, env)[0]
        assert os.path.realpath(got) == os.path.realpath(prefix / where), (var, got)
    cflags = ["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]
    src = os.path.join(CONSUMER, "main.c")
    exe = cmake_install.tmp / "pc_consumer"
    run(["cc", *cflags, src, *pkg_config(["--cflags", "--libs"], pc_dir, env), "-o", exe], env)
    # a prefix outside the loader's search path: this .pc sets no rpath (a system install)
    shared = check_consumer_output(run([exe], dict(env, LD_LIBRARY_PATH=str(prefix / "lib"))))
    assert f"libpytfm.so.{h.abi}" in needed_libraries(exe)
    exe_static = cmake_install.tmp / "pc_consumer_static"
    run(["cc", *cflags, src, *pkg_config(["--cflags"], pc_dir, env),
         *static_link_flags(pc_dir, env), "-o", exe_static], env)
    assert not [n for n in needed_libraries(exe_static) if "pytfm" in n]
    assert check_consumer_output(run([exe_static], env)) == shared


def test_pytfm_cuda_on_without_nvcc_is_a_clear_configure_error(cmake_install):
    assert shutil.which("nvcc", path=cmake_install.env["PATH"]) is None
    r = subprocess.run(["cmake", "-S", ROOT, "-B", str(cmake_install.tmp / "cuda-on"),
                        "-DPYTFM_CUDA=ON"], env=cmake_install.env, capture_output=True, text=True)
    assert r.returncode != 0
    assert ("PYTFM_CUDA=ON asks for the CUDA kernels, but nvcc was found neither on PATH nor in "
            "$CUDA_HOME/bin or $CUDA_PATH/bin") in " ".join(r.stderr.split()), r.stderr


def test_the_cpu_only_build_generates_its_cuda_stubs_in_the_build_folder(cmake_install):
    stubs = (cmake_install.build / "generated" / "cuda_stubs.c").read_text(encoding="utf-8")
    assert len(re.findall(r"^pytfm_status pytfm_\w+\(", stubs, re.M)) >= 17
    assert '#include "core/internal.h"' in stubs  # pytfm.h: the compiler checks each signature


def test_pip_and_cmake_build_the_same_library(cmake_install):
    """setup.py drives the same CMakeLists.txt: the library pip installed (pytfm/lib, checked
    against the header by tests/packaging/test_build.py) and the standalone build's have one
    SONAME, export the same functions, no more and no less, and report the same compiler flags
    (-Werror aside: this standalone build uses it). CUDA may differ: pip's build has it where
    nvcc is found, this one's PATH has no nvcc; the exported names are the same either way."""
    import pytfm

    h = header_macros()
    pip_lib = os.path.join(os.path.dirname(pytfm.__file__), "lib", f"libpytfm.so.{h.abi}")
    cmake_lib = cmake_install.prefix / "lib" / "libpytfm.so"
    assert soname(pip_lib) == soname(cmake_lib) == f"libpytfm.so.{h.abi}"
    nm = need("nm")
    names = [{line.split()[-1] for line in run([nm, "-D", "--defined-only", lib],
                                               os.environ).splitlines() if line.strip()}
             for lib in (pip_lib, cmake_lib)]
    assert names[0] == names[1], (sorted(names[0] - names[1]), sorted(names[1] - names[0]))
    exe = cmake_install.tmp / "flags_consumer"
    pc_dir = cmake_install.prefix / "lib" / "pkgconfig"
    env = cmake_install.env
    run(["cc", os.path.join(CONSUMER, "main.c"), *pkg_config(["--cflags"], pc_dir, env),
         *static_link_flags(pc_dir, env), "-o", exe], env)
    cmake_flags = check_consumer_output(run([exe], env))["flags"].split()
    pip_flags = pytfm.build_info()["flags"].split()
    assert "-fvisibility=hidden" in pip_flags and "-Werror" in cmake_flags
    assert [f for f in cmake_flags if f != "-Werror"] == [f for f in pip_flags if f != "-Werror"]


# ---- pip's pytfm.pc ------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["shared", "static"])
def test_pip_pc_file_builds_the_c_example(tmp_path, link):
    """pytfm/lib/pkgconfig/pytfm.pc of this installation (or in-place build): found through
    `python -m pytfm --pkgconfig-dir`, it builds examples/layernorm.c into a program that runs
    with no LD_LIBRARY_PATH (the rpath in Libs)."""
    import pytfm
    from pytfm import reference as ref

    pkg = os.path.dirname(os.path.abspath(pytfm.__file__))
    # run from the folder above the package this process imported, so it is the one asked
    pc_dir = subprocess.run([sys.executable, "-m", "pytfm", "--pkgconfig-dir"],
                            cwd=os.path.dirname(pkg), capture_output=True, text=True,
                            check=True).stdout.strip()
    assert os.path.samefile(pc_dir, os.path.join(pkg, "lib", "pkgconfig"))
    assert os.path.exists(os.path.join(pc_dir, "pytfm.pc")), "the build installed no pytfm.pc"
    need("pkg-config")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    assert pkg_config(["--modversion"], pc_dir, env) == [pytfm.__version__]
    libs = (pkg_config(["--libs"], pc_dir, env) if link == "shared"
            else static_link_flags(pc_dir, env))
    exe = tmp_path / "layernorm"
    cc = need(os.environ.get("CC") or "cc")
    src = os.path.join(ROOT, "examples", "layernorm.c")
    run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", src, *pkg_config(["--cflags"], pc_dir, env),
         *libs, "-o", exe], env)
    in_needed = [n for n in needed_libraries(exe) if "pytfm" in n]
    abi = header_macros().abi
    assert in_needed == ([f"libpytfm.so.{abi}"] if link == "shared" else [])
    out = run([exe], env, cwd=tmp_path)
    assert out.splitlines()[0] == f"pytfm {pytfm.__version__}"
    rows = [[float(v) for v in re.findall(r"-?\d+\.\d+", line)] for line in out.splitlines()[1:]]
    x = np.array([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 2.5]])
    y, mean, rstd = ref.layernorm_forward(x, [1.0, 1.0, 2.0, 0.5], [0.0, 0.1, 0.0, -0.1])
    np.testing.assert_allclose([r[2:] for r in rows], y, atol=2e-6)
    np.testing.assert_allclose([r[:2] for r in rows], np.c_[mean, rstd], atol=2e-6)
