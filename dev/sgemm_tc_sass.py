"""The instructions one warp executes per interior slice of the tensor-core SGEMM's main loop
(cuda/sgemm_tc.cu), per kernel, from its SASS: the method of docs/performance.md's estimate.

    nvcc ... --ptxas-options=-v -c cuda/sgemm_tc.cu -o sgemm_tc.o   (docs/performance.md)
    cuobjdump -sass -arch sm_90 sgemm_tc.o > sgemm_tc.sass
    python dev/sgemm_tc_sass.py sgemm_tc.sass

The loop is the longest backward branch's body that holds the HMMAs; the walk through it takes,
at each conditional branch, the side an interior slice takes: toward the 16-byte copies
without ZFILL (no edge), away from the 4-byte or zero-filling ones, and through the rounding
of the next slice (BF16) rather than its skip at the last one.
"""

import re
import sys
from collections import Counter

KEYS = ["HMMA", "LDSM", "LDS", "STS", "LDGSTS", "LDG", "F2FP", "FSETP", "BAR", "DEPBAR",
        "LDGDEPBAR"]
BRANCH = re.compile(r"BRA\s+(?:\w+,\s+)?0x([0-9a-f]+)")


def main_loop(ins):
    """(first, last) index of the longest backward branch's body that holds HMMAs"""
    at = {a: n for n, (a, _) in enumerate(ins)}
    best = None
    for n, (a, i) in enumerate(ins):
        b = BRANCH.search(i)
        if b and int(b.group(1), 16) < a:
            j = at[int(b.group(1), 16)]
            if any("HMMA" in x for _, x in ins[j:n + 1]) and (
                    best is None or n - j > best[1] - best[0]):
                best = (j, n)
    return best


def segment(ins, k, end):
    """the straight line from k to the next branch"""
    out = []
    while k <= end:
        out.append(ins[k][1])
        if "BRA" in ins[k][1]:
            break
        k += 1
    return out


def edge(seg):
    return any("ZFILL" in x or re.search(r"LDGSTS\.E \[", x) for x in seg)


def interior(seg):
    return any(re.search(r"LDGSTS\.E\.BYPASS\.128 \[", x) for x in seg)


def walk(ins):
    at = {a: n for n, (a, _) in enumerate(ins)}
    first, end = main_loop(ins)
    path, k = [], first
    while k <= end and len(path) < 5000:
        i = ins[k][1]
        path.append(i)
        b = BRANCH.search(i)
        if k == end:
            break
        if b:
            t = at[int(b.group(1), 16)]
            if not i.startswith("@"):
                k = t
                continue
            if first < t <= end:
                fall, jump = segment(ins, k + 1, end), segment(ins, t, end)
                take = (edge(fall) and not edge(jump)) or (interior(jump) and not interior(fall))
                k = t if take else k + 1
                continue
        k += 1
    return path


def main(path):
    text = open(path).read()
    for f in re.split(r"\n\s*Function : ", text)[1:]:
        name = f.split("\n", 1)[0]
        m = re.search(r"PrecE(\d)E([ft])Lb(\d)ELb(\d)", name)
        if not m:  # the conversion pass (to_bf16_kernel): no main loop
            continue
        ins = [(int(a, 16), b.strip())
               for a, b in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", f)]
        run = walk(ins)
        ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for x in run)
        prec = ("TF32" if m.group(1) == "0" else "BF16") + (" (BF16 operands, slices of 32)"
                                                              if m.group(2) == "t" else "")
        counts = {k: ops[k] for k in KEYS if ops[k]}
        print(f"{prec} trans_a={m.group(3)} trans_b={m.group(4)}: {len(run)} a slice, {counts}, "
              f"other {len(run) - sum(counts.values())}")


if __name__ == "__main__":
    main(sys.argv[1])
