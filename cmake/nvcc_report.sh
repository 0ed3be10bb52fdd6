#!/bin/sh
# nvcc's per-kernel report (-Xptxas -v: registers, shared memory, stack, spills) for
# cuda_build.log; CMakeLists.txt runs it in two ways:
#
#   sh nvcc_report.sh DIR nvcc ARGS...         the CUDA compiler launcher: run nvcc ARGS, keep
#                                              what it prints in DIR/<name of the .cu>.txt
#                                              (and print it too when nvcc fails)
#   sh nvcc_report.sh --join LOG DIR TITLE NAME.cu...
#                                              write LOG: TITLE, then per file "## cuda/NAME.cu"
#                                              and its report (scripts/gpu_check.sh reads this)
set -u
if [ "$1" = --join ]; then
    log=$2 dir=$3
    printf '# %s\n' "$4" >"$log.tmp"
    shift 4
    for name in "$@"; do
        printf '\n## cuda/%s\n' "$name" >>"$log.tmp"
        cat "$dir/$name.txt" >>"$log.tmp" || exit 1
    done
    mv "$log.tmp" "$log"
    exit
fi

dir=$1
shift
source="" prev=""
for arg in "$@"; do
    [ "$prev" = -c ] && source=$arg
    prev=$arg
done
[ -n "$source" ] || { echo "nvcc_report.sh: no -c SOURCE in: $*" >&2; exit 2; }
mkdir -p "$dir"
report="$dir/$(basename "$source").txt"
"$@" >"$report" 2>&1
status=$?
[ "$status" -eq 0 ] || cat "$report" >&2
exit "$status"
