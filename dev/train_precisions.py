"""train_tiny on the emulated GPU in each precision (fp32, tf32, bf16), and how far each loss
lands from fp32's: the table of docs/performance.md ("Precisions on the emulated GPU").

    python dev/train_precisions.py                   # train_tiny's config, 200 steps
    python dev/train_precisions.py --steps 20 --d-model 64 --n-layer 2 --context 64

No GPU: every op runs the CUDA kernels of cuda/ compiled for the CPU emulator (tests/cuda_emu.py)
through the stand-in cupy (tests/fake_cupy.py), as tests/cuda/test_cuda_model.py does; each run
is `python -m pytfm train --device cuda --precision P` with the flags given (its defaults
otherwise), from the same seed and batches. Prints, per precision: the loss at the last step,
its distance from fp32's, the stated bound (--bound times the format's unit roundoff, relative
to fp32's loss) and the seconds the run took; exit status 1 when a distance is past its bound.
"""

import argparse
import csv
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

UNIT = {"fp32": 2.0**-24, "tf32": 2.0**-11, "bf16": 2.0**-8}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--bound", type=float, default=16.0,
                    help="the bound on |loss - fp32's loss| / fp32's loss, in unit roundoffs")
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--emu-dir", help="where the emulator library is built (reused if there)")
    ap.add_argument("--work", help="the runs' folder (a run whose loss.csv is there is read, "
                    "not trained again: its seconds show as -)")
    args, train_args = ap.parse_known_args(argv)

    import pytest

    import cuda_emu
    import fake_cupy

    work = args.work or tempfile.mkdtemp(prefix="train_precisions_")
    emu_dir = args.emu_dir or os.path.join(work, "emu")
    os.makedirs(emu_dir, exist_ok=True)
    emu = cuda_emu.Emu(cuda_emu.build(emu_dir))
    from pytfm.cli import train as tt

    rows = []
    for precision in args.precisions.split(","):
        out = os.path.join(work, precision)
        if os.path.exists(os.path.join(out, "loss.csv")):
            with open(os.path.join(out, "loss.csv")) as f:
                rows.append((precision, float(list(csv.reader(f))[-1][1]), None))
            continue
        mp = pytest.MonkeyPatch()
        try:
            fake_cupy.install(mp, emu, strict=True)
            t0 = time.perf_counter()
            status = tt.main(["--device", "cuda", "--precision", precision, "--steps",
                              str(args.steps), "--out", out, "--eval-every", str(args.steps),
                              "--log-every", str(max(1, args.steps // 10)), "--sample-tokens",
                              "0", *train_args])
            seconds = time.perf_counter() - t0
        finally:
            mp.undo()
        if status != 0:
            sys.exit(f"train_tiny --precision {precision} ended with status {status}")
        with open(os.path.join(out, "loss.csv")) as f:
            log = list(csv.reader(f))[1:]
        rows.append((precision, float(log[-1][1]), seconds))
    fp32 = dict((p, loss) for p, loss, _ in rows).get("fp32")
    print(f"train_tiny {' '.join(train_args) or '(its defaults)'}, {args.steps} steps, on the "
          "emulated GPU")
    print("| precision | loss at the last step | |loss - fp32's| / fp32's | bound | seconds |")
    print("|---|---|---|---|---|")
    failed = False
    for precision, loss, seconds in rows:
        rel = abs(loss - fp32) / fp32 if fp32 else float("nan")
        bound = args.bound * UNIT[precision]
        failed |= rel > bound
        secs = "-" if seconds is None else f"{seconds:.0f}"
        print(f"| {precision} | {loss:.5f} | {rel:.2e} | {bound:.2e} | {secs} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
