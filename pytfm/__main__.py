"""python -m pytfm [--cflags] [--libs | --static-libs] [--{include,lib,pkgconfig}-dir]
   python -m pytfm train [flags]     (train a GPT: python -m pytfm train --help, pytfm.cli.train)
   python -m pytfm perplexity PATH TEXT_FILE [flags]   (a model's perplexity on a text:
                                     python -m pytfm perplexity --help, pytfm.cli.perplexity)

Without flags: print the build information. With flags: print what a C compiler needs to
build against this installation's libpytfm, e.g.

    cc prog.c $(python -m pytfm --cflags --libs) -o prog

or, through pkg-config (the folder holding this installation's pytfm.pc):

    export PKG_CONFIG_PATH=$(python -m pytfm --pkgconfig-dir)
    cc prog.c $(pkg-config --cflags --libs pytfm) -o prog
"""

import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE_DIR = os.path.join(HERE, "include")
LIB_DIR = os.path.join(HERE, "lib")
PKGCONFIG_DIR = os.path.join(LIB_DIR, "pkgconfig")


def _pc_fields():
    """{field: value} of this installation's pytfm.pc (Libs, Libs.private, ...), its ${variables}
    expanded as pkg-config does: the one record of how to link the library CMake installed."""
    variables, fields = {"pcfiledir": PKGCONFIG_DIR}, {}
    expand = lambda text: re.sub(r"\$\{(\w+)\}", lambda m: variables[m.group(1)], text)
    with open(os.path.join(PKGCONFIG_DIR, "pytfm.pc"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"([\w.]+)\s*([=:])\s*(.*?)\s*$", line)
            if m and not line.startswith("#"):
                if m.group(2) == "=":  # a folder
                    variables[m.group(1)] = os.path.normpath(expand(m.group(3)))
                else:
                    fields[m.group(1)] = expand(m.group(3))
    return fields


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        from .cli import train

        return train.main(argv[1:], prog="python -m pytfm train")
    if argv[:1] == ["perplexity"]:
        from .cli import perplexity

        return perplexity.main(argv[1:], prog="python -m pytfm perplexity")
    p = argparse.ArgumentParser(prog="python -m pytfm", description=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cflags", action="store_true", help="include flags for pytfm.h")
    p.add_argument("--libs", action="store_true", help="link flags for the shared libpytfm")
    p.add_argument("--static-libs", action="store_true", help="link flags for libpytfm.a")
    p.add_argument("--include-dir", action="store_true", help="the folder holding pytfm.h")
    p.add_argument("--lib-dir", action="store_true", help="the folder holding libpytfm")
    p.add_argument("--pkgconfig-dir", action="store_true",
                   help="the folder holding pytfm.pc, for PKG_CONFIG_PATH")
    args = p.parse_args(argv)

    out = []
    if args.include_dir:
        out.append(INCLUDE_DIR)
    if args.lib_dir:
        out.append(LIB_DIR)
    if args.pkgconfig_dir:
        out.append(PKGCONFIG_DIR)
    if args.cflags:
        out.append(f"-I{INCLUDE_DIR}")
    if args.libs:  # and libm, for the program's own use of it
        out.append(f"{_pc_fields()['Libs']} -lm")
    if args.static_libs:  # the archive, and what it needs (libm, OpenMP, the CUDA runtime)
        out.append(f"{os.path.join(LIB_DIR, 'libpytfm.a')} {_pc_fields()['Libs.private']}")
    if out:
        print(" ".join(out))
    else:
        from . import build_info

        print(json.dumps(build_info(), indent=2))


if __name__ == "__main__":
    sys.exit(main())
