#!/usr/bin/env bash
# Download the wheels scripts/gpu_check.sh installs on the lent H200 machine, where python3 is
# CPython 3.12 on x86-64 with numpy, cupy, torch, pytest, hypothesis and setuptools but no cffi,
# and no package index can be reached: cffi (binary, manylinux2014 / manylinux_2_17) and
# pycparser (pure Python), into gpu_wheels/ (git-ignored; the run tool's `carry` takes it along).
#
#     bash scripts/fetch_gpu_wheels.sh [DIR]     # DIR defaults to gpu_wheels
#
# The versions are the ones this project is built and tested with here; change them together.
# Exit status non-zero when pip cannot fetch both.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-gpu_wheels}"
CFFI_VERSION="${CFFI_VERSION:-2.0.0}"
PYCPARSER_VERSION="${PYCPARSER_VERSION:-3.0}"
mkdir -p "$dir"
rm -f "$dir"/cffi-*.whl "$dir"/pycparser-*.whl  # one version of each: two stop the install there
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$dir" "cffi==$CFFI_VERSION" "pycparser==$PYCPARSER_VERSION"
for name in cffi pycparser; do
    ls "$dir"/"$name"-*.whl >/dev/null 2>&1 || { echo "no $name wheel in $dir" >&2; exit 1; }
done
ls -l "$dir"
