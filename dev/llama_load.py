"""pytfm.llama.load of a Llama-family folder in one precision, in a process of its own: how
much the load raised the process's peak resident memory (VmHWM), the load's time, whether the
model holds its matrices in BF16 only (GPT.keep_bf16), and the speed of greedy decoding after.

    python dev/llama_open.py --make /tmp/qwen3      # a Qwen3-0.6B-shaped bfloat16 folder
    python dev/llama_load.py /tmp/qwen3 --precision bf16
    python dev/llama_load.py /tmp/qwen3 --precision fp32

Run each precision in its own process (the peak is the process's)."""

import argparse
import time

import numpy as np


def peak():  # the process's peak resident memory so far, in bytes
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--tokens", type=int, default=32, help="decoded after a 16-token prompt")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import pytfm
    from pytfm import llama
    from pytfm.generate import generate

    before, t = peak(), time.perf_counter()
    model = llama.load(args.folder, precision=args.precision)
    loaded, grown = time.perf_counter() - t, peak() - before
    pytfm.set_num_threads(args.threads)
    prompt = np.arange(16, dtype=np.int64)[None] % model.cfg.vocab
    t = time.perf_counter()
    generate(model, prompt, args.tokens, temperature=0.0)
    rate = args.tokens / (time.perf_counter() - t)
    print(f"{args.precision}: load {loaded:.2f} s, peak raised by {grown / 2**20:.0f} MiB, "
          f"BF16 only: {model.kept}, {rate:.1f} tokens/s on {args.threads} thread(s)")


if __name__ == "__main__":
    main()
