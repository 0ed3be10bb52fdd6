"""What the decoding benchmarks from C (gpt2_decode.py, llama_c_decode.py) share: the prompt's
token ids, the GGUF conversion and llama.cpp's worker, one case timed in a process of its own,
the cases interleaved over rounds, and the table's rows.

A case is a tuple whose first item says how it runs:
  ("bandwidth", "huge" | "small")   c_decode --bandwidth: GB/s of a 500 MiB read
  ("pytfm", path, "fp32" | "bf16" | "int8")  c_decode --generate on what pytfm_model_open
                                    opens, in that precision
  (kind, path)                      any other kind: `python SCRIPT --worker kind path threads
                                    reps prompt tokens`, whose last stdout line is a JSON list of
                                    decode seconds (llama_worker below for kind "llama")
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import ROOT, cpu_name, worker_env

from bench.c_generate import tokens_of  # c_decode.c's prompt ids: every library's prompt

PROMPT, TOKENS, BANDWIDTH_MIB = 16, 128, 500
BW, BW_SMALL = "bandwidth GB/s", "(in 4 KiB pages) GB/s"  # the limit is the first's
PYTFM = [("pytfm fp32", "fp32"), ("pytfm bf16", "bf16"), ("pytfm int8", "int8")]
LLAMA = [("llama.cpp f32", "f32"), ("llama.cpp f16", "f16"), ("llama.cpp q8_0", "q8_0")]
PEER = {"fp32": "llama.cpp f32", "bf16": "llama.cpp f16", "int8": "llama.cpp q8_0"}
# bytes a weight takes in each precision: int8 (pytfm's and Q8_0) 32 values and an fp16 scale
WIDTH = {"fp32": 4, "f32": 4, "bf16": 2, "f16": 2, "int8": 34 / 32, "q8_0": 34 / 32}
LIMIT = {"f32": "fp32", "f16": "bf16", "q8_0": "int8"}  # a llama.cpp type's limit row


# ---- llama.cpp -------------------------------------------------------------------------------


def gguf_converter(llama_src):
    """(path of llama.cpp's convert_hf_to_gguf.py under llama_src, None), or (None, why
    llama.cpp's rows cannot run)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return None, f"llama_cpp is not importable ({e}): pip install llama-cpp-python"
    script = os.path.join(llama_src or "", "convert_hf_to_gguf.py")
    if not llama_src or not os.path.isfile(script):
        return None, ("no convert_hf_to_gguf.py: pass --llama-src, a llama.cpp tree (llama-"
                      "cpp-python's sdist has one in vendor/llama.cpp)")
    return script, None


def convert_ggufs(script, src, llama_src, paths):
    """Converts the Hugging Face folder src into GGUFs, one per {type: path} of paths (a path
    already there is kept: a cache): "f32" and "f16" by convert_hf_to_gguf.py, "q8_0" by
    llama.cpp's quantizer (llama_model_quantize, what its llama-quantize tool runs) from the
    "f32" one, which paths must then name too. Returns paths, or a string saying what
    failed."""
    env = dict(os.environ, PYTHONPATH=os.path.join(llama_src, "gguf-py"), HF_HUB_OFFLINE="1")
    for kind, path in sorted(paths.items(), key=lambda kv: kv[0] == "q8_0"):  # f32 first
        if os.path.isfile(path):
            continue
        part = path + ".part"  # renamed when whole, so an interrupted run is never reused
        if kind == "q8_0":
            import llama_cpp

            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
            if llama_cpp.llama_model_quantize(paths["f32"].encode(), part.encode(), params):
                return f"llama_model_quantize to Q8_0 of {paths['f32']} failed"
        else:
            r = subprocess.run([sys.executable, script, src, "--outtype", kind, "--outfile",
                                part], capture_output=True, text=True, env=env)
            if r.returncode:
                return f"convert_hf_to_gguf.py --outtype {kind} failed: {r.stderr[-500:]}"
        os.replace(part, path)
    return paths


def llama_worker(path, threads, reps, prompt, count):
    """[decode seconds] of reps greedy decodes by llama-cpp-python."""
    import numpy as np
    from llama_cpp import Llama

    n_ctx = prompt + count + 8  # n_batch = n_ctx: Llama.scores keeps n_batch rows of logits
    llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    ids = tokens_of(llm.n_vocab(), prompt)
    seconds = []
    for _ in range(reps):
        llm.reset()
        llm.eval(ids)
        t0 = time.perf_counter()
        for _ in range(count):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        seconds.append(time.perf_counter() - t0)
    return seconds


# ---- one case, in a process of its own --------------------------------------------------------


def run(cmd, threads):
    """The stdout of cmd run at threads threads in this checkout; exits naming it on failure."""
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                       env=worker_env(threads, OPENBLAS_NUM_THREADS=1, HF_HUB_OFFLINE=1))
    if r.returncode:
        sys.exit(f"bench/{os.path.basename(sys.argv[0])}: {' '.join(cmd)} failed:\n"
                 f"{r.stderr[-3000:]}")
    return r.stdout


def pytfm_refusal(exe, path, precision):
    """None when c_decode --generate runs the model at path in precision (one token after a
    one-token prompt), else the reason it gives (pytfm_last_error's message)."""
    r = subprocess.run([exe, "--generate", path, "1", "1", precision, "1", "1"],
                       capture_output=True, text=True, cwd=ROOT, env=worker_env(1))
    if r.returncode == 0:
        return None
    return (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]


def measure(case, threads, args, exe, script):
    """One process of case at threads: tokens/s (decode cases) or GB/s (the bandwidth). args:
    the driver's (reps, prompt, tokens); script: the file whose --worker runs the other kinds."""
    kind, what = case[0], case[1]
    n = args.tokens
    if kind == "bandwidth":
        out = run([exe, "--bandwidth", str(BANDWIDTH_MIB), str(threads), str(args.reps), what],
                  threads)
        return statistics.median(int(b) / int(ns) for b, ns in map(str.split, out.splitlines()))
    if kind == "pytfm":
        out = run([exe, "--generate", what, str(args.reps), str(threads), case[2],
                   str(args.prompt), str(n)], threads)
        seconds = [int(line.split()[1]) / 1e9 for line in out.splitlines()]
    else:
        out = run([sys.executable, script, "--worker", kind, what, str(threads), str(args.reps),
                   str(args.prompt), str(n)], threads)
        seconds = json.loads(out.strip().splitlines()[-1])
    return n / statistics.median(seconds)


def interleave(cases, threads_list, rounds, measure_one):
    """{(name, threads): [figure per round]} of measure_one(case, threads) for every (name, case)
    of cases at every thread count: each round takes the thread counts in turn and, at each,
    the cases in order, reversed every other round (so that no case always follows another)."""
    got = {(name, t): [] for name, _ in cases for t in threads_list}
    for r in range(rounds):
        for threads in threads_list:
            for name, case in (cases if r % 2 == 0 else cases[::-1]):
                got[(name, threads)].append(measure_one(case, threads))
    return got


# ---- the table --------------------------------------------------------------------------------


def add_decode_args(ap, rounds, reps):
    """The options both decoding benchmarks take (their defaults: rounds, reps)."""
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--reps", type=int, default=reps, help="decodes per process")
    ap.add_argument("--prompt", type=int, default=PROMPT)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--llama-src", default=os.environ.get("PYTFM_LLAMA_SRC"),
                    help="a llama.cpp tree with convert_hf_to_gguf.py and gguf-py")
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)


def print_rates(names, med, threads, limit):
    """The tokens/s table: a row per case of names (med[(name, threads)]), then the limits
    the read bandwidth sets (limit: {"fp32": bytes a token reads, "bf16": ..., "int8": ...})."""
    print(f"{'tokens/s':<22s}" + "".join(f"{t:>3d} thread(s)" for t in threads))
    for name in names:
        print(f"{name:<22s}" + "".join(f"{med[(name, t)]:13.1f}" for t in threads))
    for prec in limit:
        print(f"{'limit ' + prec:<22s}" + "".join(
            f"{med[(BW, t)] * 1e9 / limit[prec]:13.1f}" for t in threads))
    print("(limit = bandwidth / bytes a token reads: " + ", ".join(
        f"{b / 1e6:.0f} MB {p}" for p, b in limit.items()) + ")")


def machine_line(load):
    """The CPU and the load averages [at the start, before timing, after]."""
    return (f"{cpu_name()}, {os.cpu_count()} CPUs; load average {load[0]:.2f} at the start, "
            f"{load[1]:.2f} before timing, {load[2]:.2f} after")


def ratio_row(name, num, den, target=None):
    """name, num / den, and ok or MISS against target (a bare ratio without one)."""
    r = num / den
    mark = "" if target is None else "ok" if r >= target else f"MISS (target {target})"
    return f"{name:<40s} {r:6.2f}x  {mark}".rstrip()
