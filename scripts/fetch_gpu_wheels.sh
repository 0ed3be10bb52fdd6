#!/usr/bin/env bash
# Download the wheels scripts/gpu_check.sh installs on the lent H200 machine, where python3 is
# CPython 3.12 on x86-64 with numpy, cupy, torch, pytest, hypothesis, setuptools and CMake
# (the cmake package; the device tool's KINDS.md lists it, and saw CMake run there) but no cffi
# or pycparser, and no package index can be reached: cffi (binary, manylinux2014 /
# manylinux_2_17) and pycparser (pure Python), into gpu_wheels/ (git-ignored; the run tool's
# `carry` takes it along). Only what the image lacks travels: WITH_CMAKE=1 adds the cmake wheel
# (py3-none manylinux, ~40 MB) for a machine without CMake.
#
#     bash scripts/fetch_gpu_wheels.sh [DIR]     # DIR defaults to gpu_wheels
#
# PYTHON_VERSION (default 3.12) picks the CPython the cffi wheel is for: the tests rebuild the
# device's conditions with this machine's Python (tests/cuda/test_gpu_conditions.py). The
# versions are the ones this project is built and tested with here; change them together.
# Exit status non-zero when pip cannot fetch them all.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-gpu_wheels}"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
CFFI_VERSION="${CFFI_VERSION:-2.0.0}"
PYCPARSER_VERSION="${PYCPARSER_VERSION:-3.0}"
CMAKE_VERSION="${CMAKE_VERSION:-4.4.3}"
abi="cp${PYTHON_VERSION//./}"
mkdir -p "$dir"
# one version of each: two stop the install there
rm -f "$dir"/cffi-*.whl "$dir"/pycparser-*.whl "$dir"/cmake-*.whl
names=(cffi pycparser) specs=("cffi==$CFFI_VERSION" "pycparser==$PYCPARSER_VERSION")
if [ "${WITH_CMAKE:-0}" = 1 ]; then names+=(cmake) specs+=("cmake==$CMAKE_VERSION"); fi
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp --abi "$abi" --abi abi3 --abi none \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$dir" "${specs[@]}"
for name in "${names[@]}"; do
    ls "$dir"/"$name"-*.whl >/dev/null 2>&1 || { echo "no $name wheel in $dir" >&2; exit 1; }
done
ls -l "$dir"
