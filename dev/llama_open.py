"""pytfm_model_open of a Llama-family folder: the time of a warm open (the median of --rounds
opens in one process, after a first that warms the page cache) and how much the first open
raised the process's peak resident memory (VmHWM), with the precision it opened in.

    python dev/llama_open.py --make /tmp/qwen3   # a Qwen3-0.6B-shaped folder, bfloat16, 1.2 GB
    python dev/llama_open.py /tmp/qwen3 --rounds 7

--make builds the folder with transformers (Qwen3Config: 28 layers, hidden 1024, 16 heads,
8 KV heads, head_dim 128, intermediate 3072, vocab 151936, tied; random weights in bfloat16,
save_pretrained). Needs torch and transformers for --make only."""

import argparse
import os
import statistics
import sys
import time


def make(folder):
    import torch
    import transformers as tf

    cfg = tf.Qwen3Config(num_hidden_layers=28, hidden_size=1024, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                         vocab_size=151936, tie_word_embeddings=True, torch_dtype="bfloat16")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    tf.Qwen3ForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)


def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def measure(folder, rounds):
    from pytfm._core import ffi, lib

    h, precision = ffi.new("pytfm_model **"), ffi.new("int32_t *")
    before, times, grown = status_kib("VmHWM"), [], 0
    for i in range(rounds + 1):
        t = time.perf_counter()
        if lib.pytfm_model_open(h, folder.encode(), lib.PYTFM_DEVICE_CPU) != lib.PYTFM_STATUS_OK:
            sys.exit(ffi.string(lib.pytfm_last_error()).decode())
        times.append(time.perf_counter() - t)
        if i == 0:
            grown = status_kib("VmHWM") - before
            lib.pytfm_model_get_precision(h[0], precision)
        lib.pytfm_model_close(h[0])
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f.endswith(".safetensors"))
    warm = times[1:]
    print(f"{folder}: {size / 2**20:.0f} MiB of safetensors, opened in "
          f"{'BF16' if precision[0] == lib.PYTFM_PRECISION_BF16 else 'FP32'}")
    print(f"first open {times[0]:.3f} s; warm: median {statistics.median(warm):.3f} s of "
          f"{rounds} ({min(warm):.3f}-{max(warm):.3f}); peak RSS raised by "
          f"{grown / 1024:.0f} MiB; load {os.getloadavg()[0]:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--make", action="store_true", help="build the Qwen3-shaped folder first")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    if a.make:
        make(a.folder)
    measure(a.folder, a.rounds)


if __name__ == "__main__":
    main()
