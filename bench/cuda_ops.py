"""Time pytfm's CUDA kernels on the GPU against what bounds them, measured in the same run.

    python bench/cuda_ops.py [--out FILE] [--json FILE] [--budget SECONDS] [--cpu-threads N]
                             [--sections KEYS|GROUPS] [--sizes full|tiny]
    python bench/cuda_ops.py --host-only     # no GPU: a step's host work, the kernels stubbed

One table, each row printed as soon as it is measured and appended to FILE; the --json FILE
(every row, each section's status, the GPU's clocks before and after, the versions of
everything) is rewritten atomically when each section starts and ends, and added to when it
exists: a run killed at any point keeps every finished section in both files, and SIGTERM marks
the running section STOPPED before the process ends. The sections run in this order (SECTIONS;
--sections picks keys or the groups tensor-cores, step and rest): the tensor-core products,
attention and BF16 operands, then the training steps, then the ceilings, FP32 attention and
products, the linear layer and the memory-bound kernels. What each measures:
  ceilings    a device-to-device copy of 64x the L2 (counting bytes read and written); the
              matrix product at n = 8192 in FP32 (cupy.matmul with TF32 off, and torch),
              TF32 (torch, allow_tf32) and BF16 (torch): what each precision's tensor cores or
              CUDA cores give
  training    python -m pytfm train's default config (pytfm.cli.train's defaults): the step as
              train_tiny takes it (the loop: zero_grad, forward, backward, clip, AdamW) and as
              pytfm.train_step.TrainStep takes it (no allocation, a CUDA graph), tokens/s,
              against the loop on this machine's CPU with --cpu-threads threads (default 2;
              0 skips it); then a GPT-2-124M-shaped step (d=768, 12 layers, 12 heads,
              vocab 50257, B=8, T=1024) both ways
  attention   pytfm_attention_forward and forward+backward (float32, CUDA cores) beside
              torch.nn.functional.scaled_dot_product_attention in float32 and in bfloat16, the
              backend torch ran recorded (flash, memory-efficient, cuDNN or math, read from
              the names of the kernels it launched), at B=4, H=8, D=64, causal, T = 1024,
              4096, 16384; the memory each takes beyond its inputs, and the largest difference
              of the outputs
  tensor-core attention  pytfm_attention_forward_ex + backward_ex in TF32 and in BF16
              (cuda/attention_tc.cu) at B=4, H=8, D=64, causal, T = 1024 .. 8192, forward and
              backward, against torch's float32 SDPA (TF32) and its flash SDPA in bfloat16
  products    the linear layer's three products, x·Wᵀ, dy·W and dyᵀ·x, through pytfm_sgemm_cuda
              at n = 1024 and 4096 against cupy.matmul in FP32 (transposed views: no copies);
              linear_forward, linear_gelu_forward and linear_backward at a GPT-2 MLP's size
  tensor cores  the same three products through pytfm_sgemm_ex_cuda in TF32 and in BF16
              (cuda/sgemm_tc.cu, FP32 in memory, rounded in registers) at n = 1024 and 4096
              against cuBLAS in the same mode (torch.matmul: FP32 tensors with allow_tf32,
              bfloat16 tensors), the largest difference from cuBLAS FP32
  BF16 operands  pytfm_gemm_bf16_cuda (BF16 in memory, cp.async'd as it lies) and
              pytfm_sgemm_ex_cuda in BF16 on the same values as FP32 (converted first where
              that pays) on the three products at 4096³ and at the linear layer's shape below,
              against torch.matmul on the bfloat16 tensors (cuBLAS BF16)
  bandwidth   every memory-bound kernel, forward and backward, with every input at least 4x
              the L2 (read from the device), against a device-to-device copy of the same
              number of bytes (the fewest a kernel must move: each input read once, each
              output written once)
Targets (the ratio a row must reach on an H200) are printed next to each ratio, with "yes" or
"NO"; rows without a target show "-". These are benchmark figures, never a test. Timing: CUDA
events around enough calls to fill ~20 ms, after warm-up; the median of 5 such runs. A section
that fails prints its error and the others still run (exit status 1); a section that would
start past --budget seconds (default: GPU_CHECK_STEP_SECONDS less 10, as scripts/gpu_check.sh
sets it, else none) is printed as skipped.

The shapes, the arithmetic, the backend's classification and the table's formatting import
without CuPy or torch (tests/cuda/test_gpu_check.py tests them).
"""

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1e6

# ---- what is measured -----------------------------------------------------------------------
CEILING_N = 8192
ATTENTION_SHAPE = (4, 8, 64)  # B, H, D
ATTENTION_T = (1024, 4096, 16384)
ATTENTION_TARGET_T = 4096
ATTENTION_TC_T = (1024, 2048, 4096, 8192)  # the tensor-core attention's T, B, H, D as above
PRODUCT_N = (1024, 4096)
LINEAR_SHAPE = (8192, 768, 3072)  # a GPT-2 small MLP layer: rows = B·T = 8192, in, out
GPT2_SHAPE = dict(vocab=50257, d_model=768, n_layer=12, n_head=12, max_seq=1024)
GPT2_BATCH = 8
# the GPT-2-shaped step's target in bf16, in tokens/s: (target, the rate a ratio of 1 means)
GPT2_STEP_TARGETS = {"bf16": (("GPT-2 step BF16 >= 150k tok/s", 1.0), 150e3)}
# the bandwidth rows' widths: GPT-2 small's width and vocabulary, 16 heads of 64 at T = 4096;
# rows and element counts rounded up to multiples of `align`
BANDWIDTH_DIMS = dict(C=768, V=50304, H=16, D=64, T=4096, align=1024)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the sections measure, and how long each timing loop runs. FULL: the H200 run's
    shapes (the module's constants above). TINY: shapes an emulated GPU runs in seconds, with
    one timed call a row, for the rehearsal without a GPU (tests/cuda/test_cuda_bench_
    rehearsal.py); its figures mean nothing, its files and sections are the real run's."""
    ceiling_n: int = CEILING_N
    attention_shape: tuple = ATTENTION_SHAPE
    attention_t: tuple = ATTENTION_T
    attention_target_t: int = ATTENTION_TARGET_T
    attention_tc_t: tuple = ATTENTION_TC_T
    product_n: tuple = PRODUCT_N
    linear_shape: tuple = LINEAR_SHAPE
    gpt2_shape: dict = dataclasses.field(default_factory=lambda: dict(GPT2_SHAPE))
    gpt2_batch: int = GPT2_BATCH
    train_args: tuple = ()  # python -m pytfm train's flags for the train_tiny rows
    bandwidth_dims: dict = dataclasses.field(default_factory=lambda: dict(BANDWIDTH_DIMS))
    fill_s: float = 0.02  # a timed run's length (calls repeated to fill it)
    runs: int = 5  # timed runs a row, the median reported
    step_s: tuple = (6.0, 4.0, 8.0)  # seconds of steps: the CPU, train_tiny's GPU, GPT-2's
    step_max: tuple = (40, 400, 10)  # and at most this many timed steps


SIZES = {
    "full": Sizes(),
    "tiny": Sizes(ceiling_n=32, attention_shape=(1, 2, 16), attention_t=(8, 24),
                  attention_target_t=24, attention_tc_t=(8, 24), product_n=(16, 33),
                  linear_shape=(24, 16, 40),
                  gpt2_shape=dict(vocab=256, d_model=16, n_layer=1, n_head=1, max_seq=8),
                  gpt2_batch=2,
                  train_args=("--d-model", "16", "--n-layer", "1", "--n-head", "2",
                              "--context", "8", "--batch", "2"),
                  bandwidth_dims=dict(C=32, V=96, H=2, D=16, T=8, align=8),
                  fill_s=0.0, runs=1, step_s=(0.0, 0.0, 0.0), step_max=(1, 1, 1)),
}

# ---- targets ------------------------------------------------------------------------------------
# (what the row is held to, ratio): the ratio this row must reach on an H200 against its baseline
ATTENTION_FWD_TARGET = ("attention fwd", 1.0)  # x torch's float32 SDPA at T = 4096
ATTENTION_FWDBWD_TARGET = ("attention fwd+bwd", 0.8)
# forward+backward on the tensor cores, at every T: x torch's float32 SDPA (TF32), x torch's
# flash SDPA in bf16 (BF16)
ATTENTION_TC_TARGETS = {"tf32": ("attention TF32 fwd+bwd", 1.0),
                        "bf16": ("attention BF16 fwd+bwd", 0.5)}
TRAIN_TINY_TARGET = ("GPU step", 5.0)  # x the 2-core CPU step
PRODUCT_TARGETS = {4096: ("SGEMM", 0.8), 1024: ("SGEMM", 0.6)}  # x cuBLAS FP32
# x cuBLAS in the same precision, at n = 4096 (none at 1024: a figure, no target)
TENSOR_CORE_TARGETS = {("tf32", 4096): ("SGEMM TF32", 0.7), ("bf16", 4096): ("SGEMM BF16", 0.6)}
TENSOR_CORE_PRECISIONS = (("tf32", 2), ("bf16", 1))  # name, pytfm_precision
BANDWIDTH_TARGETS = {  # x the copy of the same bytes, per kernel and direction
    ("softmax", "forward"): 0.75, ("softmax", "backward"): 0.6,
    ("layernorm", "forward"): 0.75, ("layernorm", "backward"): 0.6,
    ("gelu", "forward"): 0.75, ("gelu", "backward"): 0.6,
    ("rope", "forward"): 0.75, ("rope", "backward"): 0.6,
    ("cross_entropy", "forward"): 0.5, ("cross_entropy", "backward"): 0.5,
    ("embedding", "backward"): 0.5,
}


def bandwidth_target(kernel, direction):
    t = BANDWIDTH_TARGETS.get((kernel, direction))
    return None if t is None else (f"memory-bound {direction}", t)


# ---- the arithmetic ------------------------------------------------------------------------------
def attention_flops(B, H, T, D, causal=True):
    """The forward's multiply-adds counted twice (Q·Kᵀ and P·V): 4·B·H·T²·D, half of it
    causal. The forward + backward is 3.5x that (the backward recomputes P: five products of
    the forward's size but two halves, Q·Kᵀ again and dP = dO·Vᵀ)."""
    return (2.0 if causal else 4.0) * B * H * T * T * D


def product_cases(n):
    """The linear layer's three products at m = n = k = n, as pytfm_sgemm(_ex)_cuda takes them:
    [(label, m, n, k, trans_a, trans_b, operands)], operands naming the (x, w, dy) inputs in
    the order of the call (A, B)."""
    return [("x.W^T (forward)", n, n, n, 0, 1, ("x", "w")),
            ("dy.W (dx)", n, n, n, 0, 0, ("dy", "w")),
            ("dy^T.x (dW)", n, n, n, 1, 0, ("dy", "x"))]


def bf16_operand_cases(n=4096, linear_shape=LINEAR_SHAPE):
    """The BF16-operand rows: the three products at n³, then the linear layer's at
    linear_shape (x·Wᵀ [rows, in]·[out, in]ᵀ; dy·W; dyᵀ·x) -> [(label, m, n, k, trans_a,
    trans_b, operands)], operands as product_cases names them, with their shapes by name in
    bf16_operand_shapes."""
    rows, inn, out = linear_shape
    size = f"{rows}x{inn}->{out}"
    return [(f"{label} n={n}", m, nn, k, ta, tb, names)
            for label, m, nn, k, ta, tb, names in product_cases(n)] + [
        (f"x.W^T (forward) {size}", rows, out, inn, 0, 1, ("x", "w")),
        (f"dy.W (dx) {size}", rows, inn, out, 0, 0, ("dy", "w")),
        (f"dy^T.x (dW) {size}", out, inn, rows, 1, 0, ("dy", "x"))]


def bf16_operand_shapes(m, n, k, trans_a, trans_b):
    """(A's shape, B's shape) of a product as pytfm_gemm_bf16_cuda takes it"""
    return (k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n)


def tensor_core_target(precision, n):
    """(what, ratio) a tensor-core row at size n is held to (x cuBLAS in the same precision)"""
    return TENSOR_CORE_TARGETS.get((precision, n))


def tokens_per_s(steps, batch, context, seconds):
    return steps * batch * context / seconds


def sdpa_backend(kernel_names):
    """The backend torch's scaled_dot_product_attention ran, from the names of the CUDA kernels
    it launched (torch.profiler): "flash" (FlashAttention, bf16/fp16 only), "cudnn",
    "efficient" (the memory-efficient cutlass kernel, float32 too), else "math" (matmuls and
    a softmax: the [T, T] matrix stored)."""
    names = " ".join(kernel_names).lower()
    if "cudnn" in names or "cudnn_" in names:
        return "cudnn"
    if "flash" in names:
        return "flash"
    if "fmha" in names or "mem_eff" in names or "efficient" in names or "cutlass" in names:
        return "efficient"
    return "math"


SMI_QUERY = ("name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,"
             "power.draw,temperature.gpu,memory.used,memory.total")


def parse_smi(text):
    """nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader -> [{field: value}], one a GPU."""
    fields = SMI_QUERY.split(",")
    return [dict(zip(fields, (v.strip() for v in line.split(","))))
            for line in text.strip().splitlines() if line.strip()]


def smi():
    """The GPUs' clocks, power and memory now (nvidia-smi), or why not."""
    if shutil.which("nvidia-smi") is None:
        return {"error": "nvidia-smi not found"}
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    return {"gpus": parse_smi(out.stdout)} if out.returncode == 0 else {"error": out.stderr}


# ---- sizes: every input of a bandwidth row at least 4x the L2 -----------------------------------
def ceil_to(x, m):
    """The smallest multiple of the integer m that is >= x (a float or an int)."""
    return math.ceil(x / m) * m


def bandwidth_shapes(l2_bytes, factor=4, dims=None):
    """The shapes of the bandwidth rows for a GPU with l2_bytes of L2: each float32 input (and
    the caches of the decode) at least factor x l2_bytes, so that repeated calls stream from
    device memory, not from the L2; dims: the widths (BANDWIDTH_DIMS by default). -> {name:
    shape tuple}"""
    d = dims or BANDWIDTH_DIMS
    C, V, H, D, T, align = d["C"], d["V"], d["H"], d["D"], d["T"], d["align"]
    floats = factor * l2_bytes / 4  # the fewest elements of one input
    rows = ceil_to(floats / C, align)
    bthd = ceil_to(floats / (T * H * D), 1)  # batches of [T, H, D]
    return {
        "rows": (rows, C),                              # softmax, layernorm
        "elementwise": (ceil_to(floats, align * align),),  # gelu, adamw, sum_squares
        "heads": (bthd, T, H, D),                       # rope, qkv_split's q, k, v
        "logits": (ceil_to(floats / V, 8), V),          # cross-entropy
        "embedding": (rows, C, ceil_to(floats / C, align)),  # rows of dy, width, vocab
        "cache": (8, ceil_to(floats / (8 * H * D), align), H, D),  # decode's k and v caches
        "copy": (ceil_to(16 * floats, align * align),),  # the copy ceiling: 64x the L2
    }


def input_bytes(shapes):
    """{row: [bytes of each input array]} for the bandwidth rows (what the 4x rule is about)."""
    f = 4
    rows, C = shapes["rows"]
    (n,) = shapes["elementwise"]
    B, T, H, D = shapes["heads"]
    R, V = shapes["logits"]
    er, ec, vocab = shapes["embedding"]
    cb, ct, ch, cd = shapes["cache"]
    return {
        "softmax/layernorm": [rows * C * f],
        "gelu/adamw/sum_squares": [n * f],
        "rope/qkv_split": [B * T * H * D * f],
        "cross_entropy": [R * V * f],
        "embedding": [er * ec * f, vocab * ec * f],
        "decode caches": [cb * ct * ch * cd * f] * 2,
    }


# ---- the table ----------------------------------------------------------------------------------
HEAD = (f"{'kernel':46s} {'time us':>10s} {'rate':>9s} {'unit':8s} {'vs':12s} {'its rate':>9s} "
        f"{'ratio':>7s} {'target':>8s} {'met':3s}  note")


def row_record(name, seconds, rate, unit, vs="", vs_rate=None, target=None, note=""):
    """One row as bench.json holds it: ratio = rate / vs_rate; target (what, ratio) or None."""
    ratio = rate / vs_rate if rate is not None and vs_rate else None
    met = None if target is None or ratio is None else ratio >= target[1]
    return {"name": name, "seconds": seconds, "rate": rate, "unit": unit, "vs": vs,
            "vs_rate": vs_rate, "ratio": ratio, "target": None if target is None else
            {"what": target[0], "ratio": target[1]}, "met": met, "note": note}


def format_row(name, seconds, rate, unit, vs="", vs_rate=None, target=None, note=""):
    """One line of the table: ratio = rate / vs_rate; target (what, ratio) or None."""
    r = row_record(name, seconds, rate, unit, vs, vs_rate, target, note)
    t = f"{seconds * 1e6:10.1f}" if seconds is not None else f"{'-':>10s}"
    rate_s = f"{rate:9.1f}" if rate is not None else f"{'-':>9s}"
    ratio_s = f"{r['ratio']:6.2f}x" if r["ratio"] is not None else f"{'-':>7s}"
    vr = f"{vs_rate:9.1f}" if vs_rate else f"{'-':>9s}"
    if target is None:
        tgt, met = f"{'-':>8s}", "-"
    else:
        tgt = f">={target[1]:.2f}x"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        note = f"{target[0]}; {note}" if note else target[0]
    line = f"{name:46s} {t} {rate_s} {unit:8s} {vs:12s} {vr} {ratio_s} {tgt:>8s} {met:3s}  {note}"
    return line.rstrip()


class Table:
    """The table: each line printed and appended to out as it comes; each row kept for the
    JSON file, which is rewritten (atomically: a temporary file renamed over it) when a section
    starts and when it ends, so that a run killed at any point leaves every finished
    section's rows in both files, and the JSON names the section that was running. A JSON
    file that exists already is added to, as the text file is: its earlier rows, sections and
    runs are kept (scripts/gpu_check.sh runs the sections in several steps into one file)."""

    def __init__(self, out=None, json_out=None):
        self.out, self.json_out = out, json_out
        self.rows, self.lines, self.section = [], [], None
        self.sections, self.complete = [], False
        self.info = {}
        self.earlier = {"rows": [], "sections": [], "runs": []}
        if json_out and os.path.exists(json_out):
            try:
                with open(json_out, encoding="utf-8") as f:
                    old = json.load(f)
                self.earlier = {k: list(old.get(k) or []) for k in self.earlier}
                if not isinstance(old.get("rows"), list):
                    raise ValueError("no list of rows")
            except (OSError, ValueError, AttributeError) as e:
                print(f"{json_out}: not a bench file ({e}): written anew", flush=True)
                self.earlier = {"rows": [], "sections": [], "runs": []}

    def line(self, text):
        print(text, flush=True)
        self.lines.append(text)
        if self.out:
            with open(self.out, "a", encoding="utf-8") as f:
                f.write(text + "\n")

    def row(self, *args, **kw):
        self.rows.append(dict(row_record(*args, **kw), section=self.section))
        self.line(format_row(*args, **kw))

    def begin(self, key, title):
        """A section starts: its rows are labelled title; the JSON says it is running."""
        self.section = title
        self.sections.append({"key": key, "title": title, "status": "running",
                              "seconds": None})
        self.write_json()

    def end(self, status, seconds):
        """The running section ended: ok, FAILED (why), STOPPED (a signal)."""
        self.sections[-1].update(status=status, seconds=round(seconds, 3))
        self.write_json()

    def skipped(self, key, title, why):
        self.sections.append({"key": key, "title": title, "status": f"SKIPPED ({why})",
                              "seconds": 0.0})
        self.write_json()

    def write_json(self):
        """bench.json: the machine (clocks, versions: self.info), the sections with their
        status, every row; the runs that wrote it, each with its info and whether it ended."""
        if not self.json_out:
            return
        run = {**self.info, "sections": [s["key"] for s in self.sections],
               "complete": self.complete}
        doc = {**self.info, "complete": self.complete,
               "sections": self.earlier["sections"] + self.sections,
               "rows": self.earlier["rows"] + self.rows, "runs": self.earlier["runs"] + [run]}
        tmp = os.path.join(os.path.dirname(os.path.abspath(self.json_out)),
                           f".{os.path.basename(self.json_out)}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, self.json_out)


def versions():
    """What the figures depend on, beside the GPU: Python, the machine, pytfm's build."""
    info = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import pytfm

        info["pytfm"] = pytfm.build_info()
    except Exception as e:  # (the bench then fails at its first section, saying why)
        info["pytfm"] = f"{type(e).__name__}: {e}"
    try:
        info["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                     capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["git"] = None
    return info


# ---- the GPU part -------------------------------------------------------------------------------
# ---- the sections, in the order they run --------------------------------------------------------
# (key, group, title): the tensor cores first (the figures nothing else gives, and the
# targets the GPT-2 step rests on), then the model's step, then the rest. --sections picks
# keys or groups; scripts/gpu_check.sh runs each group as a step of its own.
BW = "vs copy, inputs >= 4x L2:"
SECTIONS = (
    ("tc-products", "tensor-cores", "tensor-core products vs cuBLAS (TF32, BF16)"),
    ("tc-attention", "tensor-cores",
     "tensor-core attention vs torch SDPA (TF32: fp32, BF16: flash)"),
    ("bf16-operands", "tensor-cores",
     "BF16 operands vs cuBLAS BF16 (gemm_bf16; sgemm_ex bf16 on FP32)"),
    ("steps", "step", "training steps, tokens/s"),
    ("ceilings", "rest", "ceilings: copy"),
    ("ceiling-products", "rest", "ceilings: matrix products, FP32 / TF32 / BF16"),
    ("attention", "rest", "attention vs torch SDPA (fp32, bf16)"),
    ("products", "rest", "products vs cuBLAS (FP32, TF32 off)"),
    ("linear", "rest", "linear layer, GPT-2 MLP size"),
    ("bw-rows", "rest", f"{BW} softmax, layernorm"),
    ("bw-elementwise", "rest", f"{BW} gelu, sum_squares, adamw"),
    ("bw-heads", "rest", f"{BW} rope, qkv_split"),
    ("bw-cross-entropy", "rest", f"{BW} cross-entropy"),
    ("bw-embedding", "rest", f"{BW} embedding"),
    ("bw-decode", "rest", f"{BW} attention_decode"),
)


def pick_sections(spec):
    """--sections: comma-separated keys or groups ("all", "tensor-cores", "step", "rest") ->
    the keys, in SECTIONS' order; an unknown name is a ValueError naming the known ones."""
    asked = [w.strip() for w in (spec or "all").split(",") if w.strip()]
    known = {k for k, _, _ in SECTIONS} | {g for _, g, _ in SECTIONS} | {"all"}
    bad = [w for w in asked if w not in known]
    if bad:
        raise ValueError(f"--sections: unknown {', '.join(bad)}; known: "
                         f"{', '.join(sorted(known))}")
    return [k for k, g, _ in SECTIONS if "all" in asked or k in asked or g in asked]


def stop_on_sigterm(table):
    """SIGTERM (timeout's first signal, 5 s before its SIGKILL): the running section is marked
    STOPPED, both files are written, and the process ends at once with status 1. Done in the
    handler, not by an exception: one raised inside a callback or a destructor would be lost."""
    def on_sigterm(signum, frame):
        running = table.sections[-1] if table.sections else None
        if running is not None and running["status"] == "running":
            running["status"] = "STOPPED (a signal)"
        table.line(f"bench/cuda_ops.py: stopped by signal {signum}"
                   + (f" during {running['key']}: its rows so far are kept" if running else ""))
        table.info["clocks_after"] = smi()
        table.write_json()
        sys.stdout.flush()
        os._exit(1)

    signal.signal(signal.SIGTERM, on_sigterm)


# ---- the GPU part -------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also append the table to this file")
    ap.add_argument("--json", help="write every row, the clocks and the versions to this file "
                    "(after each section; an existing bench file is added to)")
    step = os.environ.get("GPU_CHECK_STEP_SECONDS")
    ap.add_argument("--budget", type=float, default=float(step) - 10 if step else None,
                    help="seconds: sections that would start later are skipped")
    ap.add_argument("--sections", default="all",
                    help="comma-separated section keys or groups (tensor-cores, step, rest; "
                    "default all): " + ", ".join(k for k, _, _ in SECTIONS))
    ap.add_argument("--sizes", choices=sorted(SIZES), default="full",
                    help="full: the H200 run's shapes; tiny: an emulated GPU's (a rehearsal)")
    ap.add_argument("--cpu-threads", type=int, default=2,
                    help="threads of the CPU train_tiny run (0: skip it; default 2)")
    ap.add_argument("--host-only", action="store_true",
                    help="no GPU: the host work of a step, every CUDA kernel stubbed out")
    args = ap.parse_args(argv)
    if args.host_only:
        return host_only()
    try:
        args.keys = pick_sections(args.sections)
    except ValueError as e:
        ap.error(str(e))
    os.environ.setdefault("CUPY_TF32", "0")  # cupy.matmul in true FP32, as pytfm computes
    table = Table(args.out, args.json)
    stop_on_sigterm(table)
    table.info = {"versions": versions(), "clocks_before": smi(), "sizes": args.sizes}
    try:
        return run_gpu(args, table)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        table.info["clocks_after"] = smi()
        table.write_json()


def run_gpu(args, table):
    import cupy as cp

    from pytfm import ops
    from pytfm._core import ffi, lib

    sz = SIZES[args.sizes]
    start = time.monotonic()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    l2 = props["l2CacheSize"]
    shapes = bandwidth_shapes(l2, dims=sz.bandwidth_dims)
    table.info["gpu"] = {"name": name, "sms": props["multiProcessorCount"], "l2_bytes": l2,
                         "memory_bytes": props["totalGlobalMem"],
                         "compute_capability": f"{props['major']}.{props['minor']}",
                         "cupy": cp.__version__,
                         "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
                         "cuda_driver": cp.cuda.runtime.driverGetVersion()}
    try:
        import torch

        table.info["gpu"]["torch"] = torch.__version__
        table.info["gpu"]["torch_cuda"] = torch.version.cuda
    except ImportError as e:
        table.info["gpu"]["torch"] = f"not importable: {e}"
    table.line(f"pytfm CUDA kernels on {name}: {props['multiProcessorCount']} SMs, L2 "
               f"{l2 / MB:.1f} MB (bandwidth inputs >= {4 * l2 / MB:.0f} MB each), cupy "
               f"{cp.__version__}, torch {table.info['gpu']['torch']}")
    clocks = (table.info["clocks_before"].get("gpus") or [{}])[0]
    table.line(f"clocks before: SM {clocks.get('clocks.sm', '?')} (max "
               f"{clocks.get('clocks.max.sm', '?')}), memory {clocks.get('clocks.mem', '?')}, "
               f"{clocks.get('power.draw', '?')}, {clocks.get('temperature.gpu', '?')} C")
    table.line(HEAD)
    failed = []

    def stream_ptr():
        return ffi.cast("void *", cp.cuda.get_current_stream().ptr)

    def timed(fn, target_s=sz.fill_s, runs=sz.runs):
        """Median seconds per call of fn() on CuPy's current stream (CUDA events): after a
        warm-up call, runs timed runs of enough calls to fill target_s (one call when 0)."""
        fn()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        reps = 1
        if target_s > 0:
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            one = max(cp.cuda.get_elapsed_time(start, stop) / 1e3, 1e-6)
            reps = max(1, min(200, int(target_s / one)))
        times = []
        for _ in range(runs):
            start.record()
            for _ in range(reps):
                fn()
            stop.record()
            stop.synchronize()
            times.append(max(cp.cuda.get_elapsed_time(start, stop) / 1e3 / reps, 1e-9))
        return statistics.median(times)

    def section(key, title, fn):
        left = None if args.budget is None else args.budget - (time.monotonic() - start)
        if left is not None and left <= 0:
            table.line(f"-- {title}: SKIPPED (past the budget of {args.budget:.0f} s)")
            table.skipped(key, title, f"past the budget of {args.budget:.0f} s")
            return
        table.line(f"-- {title}")
        table.begin(key, title)
        t0 = time.monotonic()
        status = "ok"
        try:
            fn()
        except Exception as e:  # report and go on: the other sections still say something
            failed.append(title)
            status = f"FAILED ({type(e).__name__}: {e})"
            table.line(f"   FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
        table.end(status, time.monotonic() - t0)
        cp.get_default_memory_pool().free_all_blocks()

    randn = lambda *shape: cp.random.standard_normal(shape, dtype=cp.float32)  # noqa: E731

    # -- ceilings ---------------------------------------------------------------------------------
    def ceilings():
        src = randn(*shapes["copy"])
        dst = cp.empty_like(src)
        t = timed(lambda: cp.copyto(dst, src))
        table.row(f"device-to-device copy {src.nbytes / 1e9:.2f} GB (ceiling)", t,
                  2 * src.nbytes / t / 1e9, "GB/s")

    def ceiling_products():
        import torch

        n = sz.ceiling_n
        flops = 2.0 * n**3
        a, b = randn(n, n), randn(n, n)
        t = timed(lambda: cp.matmul(a, b))
        table.row(f"cupy.matmul {n}^3 FP32, TF32 off (ceiling)", t, flops / t / 1e12, "TFLOP/s")
        ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
        saved = torch.backends.cuda.matmul.allow_tf32
        try:
            for label, tf32, x, y in (("FP32", False, ta, tb), ("TF32", True, ta, tb),
                                      ("BF16", False, ta.bfloat16(), tb.bfloat16())):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                t = torch_timed(torch, lambda x=x, y=y: torch.matmul(x, y))
                table.row(f"torch.matmul {n}^3 {label} (ceiling)", t, flops / t / 1e12,
                          "TFLOP/s", note="cuBLAS; random data")
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved

    copy_buffers = {}

    def copy_rate(nbytes):
        """GB/s of a device-to-device copy moving nbytes in all (nbytes / 2 read, as many
        written), on buffers kept for the run."""
        half = ceil_to(nbytes // 2, 4) // 4
        if "src" not in copy_buffers or copy_buffers["src"].size < half:
            copy_buffers.clear()
            copy_buffers["src"] = randn(half)
            copy_buffers["dst"] = cp.empty_like(copy_buffers["src"])
        s, d = copy_buffers["src"][:half], copy_buffers["dst"][:half]
        return 2 * s.nbytes / timed(lambda: cp.copyto(d, s)) / 1e9

    # -- training steps ---------------------------------------------------------------------------
    def steps():
        import numpy as np

        import pytfm
        from pytfm import data
        from pytfm.cli import train as tiny
        from pytfm.nn import GPT, GPTConfig
        from pytfm.optim import AdamW, clip_grad_norm, cosine_lr
        from pytfm.train_step import TrainStep

        a = tiny.parse_args(list(sz.train_args))  # its defaults, no checks, no files touched
        corpus = data.stdlib_corpus().astype(np.int64)

        def run(cfg, batch, device, way, warm, seconds, max_steps, precision="fp32"):
            """tokens/s, seconds a step and the last loss of `way` ("loop": as train_tiny
            steps; "TrainStep": pytfm.train_step.TrainStep, graph and all) on device, the linear
            layers' products (and attention) in precision."""
            batches = data.Batches(corpus, cfg.max_seq, batch, seed=0)
            model = GPT(cfg, device=device, precision=precision) if device != "cpu" \
                else GPT(cfg)
            opt = AdamW(model.params, model.grads, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
            to = cp.asarray if device == "cuda" else (lambda t: t)
            train = TrainStep(model, opt, max_norm=1.0) if way == "TrainStep" else None
            done, t0, loss = 0, None, None
            for i in range(warm + max_steps):
                if i == warm:
                    if device == "cuda":
                        cp.cuda.Device().synchronize()
                    t0 = time.perf_counter()
                lr = cosine_lr(i, a.lr, a.warmup, a.steps, min_lr=a.lr / 10)
                x, y = batches.batch("train", i)
                if train is not None:
                    loss = train(x, y, lr)
                else:  # train_tiny's step: the ids are bytes (no check), the loss stays
                    model.zero_grad()
                    _, loss = model.forward(to(x), to(y), check_ids=False)
                    model.backward()
                    clip_grad_norm(model.grads, 1.0)
                    opt.step(lr)
                if i >= warm:
                    done += 1
                    if time.perf_counter() - t0 > seconds:
                        break
            if device == "cuda":
                cp.cuda.Device().synchronize()
            elapsed = time.perf_counter() - t0
            mode = f"; {train.mode}" + (f" ({train.graph_error})" if train.graph_error else "") \
                if train else ""
            return (tokens_per_s(done, batch, cfg.max_seq, elapsed), elapsed / done,
                    f"loss {float(loss):.3f}{mode}")

        cfg = GPTConfig(d_model=a.d_model, n_layer=a.n_layer, n_head=a.n_head,
                        max_seq=a.context, pos=a.pos, seed=a.seed)
        shape = f"d={cfg.d_model} L={cfg.n_layer} T={cfg.max_seq} B={a.batch}"
        cpu_rate = None
        if args.cpu_threads > 0:
            threads = pytfm.get_num_threads()
            pytfm.set_num_threads(args.cpu_threads)
            try:
                cpu_rate, cpu_step, _ = run(cfg, a.batch, "cpu", "loop", 2, sz.step_s[0],
                                             sz.step_max[0])
            finally:
                pytfm.set_num_threads(threads)
            table.row(f"train_tiny step, CPU {args.cpu_threads} threads ({shape})", cpu_step,
                      cpu_rate, "tok/s", note="this machine's CPU")
        vs = f"CPU {args.cpu_threads} thr" if cpu_rate else ""
        for way, warm in (("loop", 5), ("TrainStep", 4)):
            rate, per, note = run(cfg, a.batch, "cuda", way, warm, sz.step_s[1],
                                  sz.step_max[1])
            table.row(f"train_tiny step, GPU, {way}", per, rate, "tok/s", vs, cpu_rate,
                      TRAIN_TINY_TARGET, note)
        big = GPTConfig(**sz.gpt2_shape, pos="rope", seed=0)
        for precision in ("fp32", "bf16"):
            loop_rate = None
            for way in ("loop", "TrainStep"):
                rate, per, note = run(big, sz.gpt2_batch, "cuda", way,
                                      2 if way == "loop" else 3, sz.step_s[2], sz.step_max[2],
                                      precision)
                name = (f"GPT-2-124M-shaped step (B={sz.gpt2_batch} T={big.max_seq}), "
                        f"{precision}, {way}")
                if precision in GPT2_STEP_TARGETS:  # an absolute rate: the ratio to it
                    table.row(name, per, rate, "tok/s", "target rate",
                              GPT2_STEP_TARGETS[precision][1], GPT2_STEP_TARGETS[precision][0],
                              note)
                else:
                    table.row(name, per, rate, "tok/s", "the loop" if loop_rate else "",
                              loop_rate, None, note)
                loop_rate = loop_rate or rate
                cp.get_default_memory_pool().free_all_blocks()

    # -- attention against torch ------------------------------------------------------------------
    def torch_timed(torch, fn, target_s=sz.fill_s, runs=sz.runs):
        """timed(), for torch's work on its current stream (torch's CUDA events)"""
        fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 1
        if target_s > 0:
            s.record()
            fn()
            e.record()
            e.synchronize()
            reps = max(1, min(50, int(target_s / max(s.elapsed_time(e) / 1e3, 1e-6))))
        times = []
        for _ in range(runs):
            s.record()
            for _ in range(reps):
                fn()
            e.record()
            e.synchronize()
            times.append(max(s.elapsed_time(e) / 1e3 / reps, 1e-9))
        return statistics.median(times)

    def attention():
        import torch
        import torch.nn.functional as F

        table.line(f"   torch {torch.__version__}; FLOPs: causal forward 2·B·H·T²·D, "
                   "forward+backward 3.5x that (the backward recomputes P)")
        B, H, D = sz.attention_shape
        USED_HIGH = 8  # cudaMemPoolAttrUsedMemHigh; setting it to 0 resets the high-water mark
        try:  # the stream-ordered pool the kernels' scratch comes from (cudaMallocAsync)
            async_pool = cp.cuda.runtime.deviceGetDefaultMemPool(cp.cuda.Device().id)
            cp.cuda.runtime.memPoolSetAttribute(async_pool, USED_HIGH, 0)
            cp.cuda.runtime.memPoolGetAttribute(async_pool, USED_HIGH)
        except Exception as e:  # an older CuPy, say: say so, and count CuPy's pool only
            async_pool = None
            table.line(f"   the scratch of cudaMallocAsync is not counted: {e}")

        def pytfm_peak(fn):
            pool = cp.get_default_memory_pool()
            pool.free_all_blocks()
            before = pool.total_bytes()
            if async_pool is not None:
                cp.cuda.runtime.memPoolSetAttribute(async_pool, USED_HIGH, 0)
            kept = fn()
            cp.cuda.Device().synchronize()
            scratch = (cp.cuda.runtime.memPoolGetAttribute(async_pool, USED_HIGH)
                       if async_pool is not None else 0)
            del kept
            return pool.total_bytes() - before + scratch

        def torch_peak(fn):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            kept = fn()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
            del kept
            return peak

        def backend_of(fn):
            """sdpa_backend of the kernels one call of fn launches (torch.profiler)."""
            try:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                return sdpa_backend(e.key for e in prof.key_averages())
            except Exception as e:  # no profiler here: say so in the note
                return f"unknown ({type(e).__name__})"

        def at(T):
            q, k, v, dy = (randn(B, T, H, D) for _ in range(4))
            # torch in its own layout [B, H, T, D], its own allocations, the same values
            tq, tk, tv, tdy = (torch.from_dlpack(a).permute(0, 2, 1, 3).contiguous()
                               for a in (q, k, v, dy))
            cp.cuda.Device().synchronize()
            flops = attention_flops(B, H, T, D)

            fwd = lambda: ops.attention_forward(q, k, v, causal=True)  # noqa: E731
            o = fwd()[0]
            t_fwd, mem_fwd = timed(fwd), pytfm_peak(fwd)

            def fwd_bwd():
                o, lse = ops.attention_forward(q, k, v, causal=True)
                return ops.attention_backward(dy, q, k, v, o, lse, causal=True)

            t_fb, mem_fb = timed(fwd_bwd), pytfm_peak(fwd_bwd)
            dq = fwd_bwd()[0]
            at_target = T == sz.attention_target_t
            peers = {}
            for dtype in (torch.float32, torch.bfloat16):
                xq, xk, xv = (t.detach().to(dtype).requires_grad_() for t in (tq, tk, tv))
                xdy = tdy.to(dtype)

                def torch_fwd(xq=xq, xk=xk, xv=xv):
                    with torch.no_grad():
                        return F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)

                def torch_fwd_bwd(xq=xq, xk=xk, xv=xv, xdy=xdy):
                    out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
                    return torch.autograd.grad(out, (xq, xk, xv), xdy)

                peers[dtype] = dict(
                    fwd=torch_timed(torch, torch_fwd), fwd_bwd=torch_timed(torch, torch_fwd_bwd),
                    mem_fwd=torch_peak(torch_fwd), mem_fwd_bwd=torch_peak(torch_fwd_bwd),
                    backend=backend_of(torch_fwd), o=torch_fwd().float().permute(0, 2, 1, 3),
                    dq=torch_fwd_bwd()[0].float().permute(0, 2, 1, 3))
            f32 = peers[torch.float32]
            o_t, dq_t = cp.from_dlpack(f32["o"].contiguous()), cp.from_dlpack(
                f32["dq"].contiguous())
            diff_o = float(cp.abs(o - o_t).max() / cp.abs(o_t).max())
            diff_dq = float(cp.abs(dq - dq_t).max() / cp.abs(dq_t).max())
            table.row(f"attention_forward T={T} (B={B} H={H} D={D} causal)", t_fwd,
                      flops / t_fwd / 1e12, "TFLOP/s", "SDPA fp32", flops / f32["fwd"] / 1e12,
                      ATTENTION_FWD_TARGET if at_target else None,
                      f"torch: {f32['backend']}; mem {mem_fwd / MB:.0f} MB (torch "
                      f"{f32['mem_fwd'] / MB:.0f}); max|o-torch|/max|o| {diff_o:.1e}")
            table.row(f"attention fwd+bwd T={T}", t_fb, 3.5 * flops / t_fb / 1e12, "TFLOP/s",
                      "SDPA fp32", 3.5 * flops / f32["fwd_bwd"] / 1e12,
                      ATTENTION_FWDBWD_TARGET if at_target else None,
                      f"torch: {f32['backend']}; mem {mem_fb / MB:.0f} MB (torch "
                      f"{f32['mem_fwd_bwd'] / MB:.0f}); max|dq-torch|/max|dq| {diff_dq:.1e}")
            b16 = peers[torch.bfloat16]
            table.row(f"  torch SDPA bf16 fwd T={T}", b16["fwd"], flops / b16["fwd"] / 1e12,
                      "TFLOP/s", "pytfm fp32", flops / t_fwd / 1e12, None,
                      f"backend: {b16['backend']}; the ratio is bf16 over pytfm's fp32")
            table.row(f"  torch SDPA bf16 fwd+bwd T={T}", b16["fwd_bwd"],
                      3.5 * flops / b16["fwd_bwd"] / 1e12, "TFLOP/s", "pytfm fp32",
                      3.5 * flops / t_fb / 1e12, None, f"backend: {b16['backend']}")

        for T in sz.attention_t:
            at(T)  # its arrays go when it returns
            torch.cuda.empty_cache()
            cp.get_default_memory_pool().free_all_blocks()

    # -- attention on the tensor cores against torch -------------------------------------------
    def tc_attention():
        import torch
        import torch.nn.functional as F

        try:  # torch's flash kernel by name, where this torch can ask for it
            from torch.nn.attention import SDPBackend, sdpa_kernel

            flash = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])  # noqa: E731
        except ImportError:
            flash = contextlib.nullcontext
        B, H, D = sz.attention_shape
        table.line("   pytfm's q, k, v, dy float32 in memory, rounded in registers; torch's "
                   "bf16 tensors (flash), float32 tensors (its default backend)")

        def at(T):
            q, k, v, dy = (randn(B, T, H, D) for _ in range(4))
            tq, tk, tv, tdy = (torch.from_dlpack(a).permute(0, 2, 1, 3).contiguous()
                               for a in (q, k, v, dy))
            cp.cuda.Device().synchronize()
            flops = 3.5 * attention_flops(B, H, T, D)
            for precision, dtype, peer, ctx in (("tf32", torch.float32, "SDPA fp32",
                                                 contextlib.nullcontext),
                                                ("bf16", torch.bfloat16, "SDPA flash bf16",
                                                 flash)):
                def fwd_bwd(precision=precision):
                    o, lse = ops.attention_forward(q, k, v, causal=True, precision=precision)
                    return ops.attention_backward(dy, q, k, v, o, lse, causal=True,
                                                  precision=precision)

                t = timed(fwd_bwd)
                xq, xk, xv = (x.detach().to(dtype).requires_grad_() for x in (tq, tk, tv))
                xdy = tdy.to(dtype)

                def torch_fwd_bwd(xq=xq, xk=xk, xv=xv, xdy=xdy, ctx=ctx):
                    with ctx():
                        out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
                        return torch.autograd.grad(out, (xq, xk, xv), xdy)

                t_torch = torch_timed(torch, torch_fwd_bwd)
                table.row(f"attention {precision} fwd+bwd T={T}", t, flops / t / 1e12, "TFLOP/s",
                          peer, flops / t_torch / 1e12, ATTENTION_TC_TARGETS[precision],
                          f"B={B} H={H} D={D} causal")

        for T in sz.attention_tc_t:
            at(T)
            torch.cuda.empty_cache()
            cp.get_default_memory_pool().free_all_blocks()

    # -- the products -----------------------------------------------------------------------------
    def products():
        sgemm = lib.pytfm_sgemm_cuda
        from pytfm._arrays import pointer as ptr  # a CuPy array's device pointer, as ops makes it

        def call(c, a, b, m, n, k, ta, tb):
            status = sgemm(ptr(c), ptr(a), ptr(b), m, n, k, ta, tb, 0.0, stream_ptr())
            if status:
                raise RuntimeError(ffi.string(lib.pytfm_last_error()).decode())

        def at(n):
            x, w, dy = randn(n, n), randn(n, n), randn(n, n)
            c = cp.empty((n, n), cp.float32)
            flops = 2.0 * n**3
            cases = [  # (name, pytfm's call, cuBLAS's, the same product)
                ("x.W^T (forward)", lambda: call(c, x, w, n, n, n, 0, 1),
                 lambda: cp.matmul(x, w.T)),
                ("dy.W (dx)", lambda: call(c, dy, w, n, n, n, 0, 0), lambda: cp.matmul(dy, w)),
                ("dy^T.x (dW)", lambda: call(c, dy, x, n, n, n, 1, 0),
                 lambda: cp.matmul(dy.T, x)),
            ]
            for label, mine, theirs in cases:
                ref = theirs()
                mine()
                err = float(cp.abs(c - ref).max() / cp.abs(ref).max())
                t_mine, t_blas = timed(mine), timed(theirs)
                table.row(f"sgemm {label} n={n}", t_mine, flops / t_mine / 1e12, "TFLOP/s",
                          "cuBLAS FP32", flops / t_blas / 1e12, PRODUCT_TARGETS.get(n),
                          f"max err/max {err:.1e}")

        for n in sz.product_n:
            at(n)

    def tensor_core_products():
        import torch

        from pytfm._arrays import pointer as ptr

        def call(c, a, b, m, n, k, ta, tb, code):
            status = lib.pytfm_sgemm_ex_cuda(ptr(c), ptr(a), ptr(b), m, n, k, ta, tb, 0.0, code,
                                             stream_ptr())
            if status:
                raise RuntimeError(ffi.string(lib.pytfm_last_error()).decode())

        saved = torch.backends.cuda.matmul.allow_tf32
        try:
            for n in sz.product_n:
                arrays = {name: randn(n, n) for name in ("x", "w", "dy")}
                c = cp.empty((n, n), cp.float32)
                flops = 2.0 * n**3
                for precision, code in TENSOR_CORE_PRECISIONS:
                    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
                    dtype = torch.float32 if precision == "tf32" else torch.bfloat16
                    theirs = {k: torch.from_dlpack(v).to(dtype) for k, v in arrays.items()}
                    for label, m, nn, k, ta, tb, (an, bn) in product_cases(n):
                        a, b = arrays[an], arrays[bn]
                        ta_t = theirs[an].T if ta else theirs[an]
                        tb_t = theirs[bn].T if tb else theirs[bn]

                        def mine(c=c, a=a, b=b, m=m, nn=nn, k=k, ta=ta, tb=tb, code=code):
                            call(c, a, b, m, nn, k, ta, tb, code)

                        mine()
                        exact = cp.matmul(a.T if ta else a, b.T if tb else b)
                        err = float(cp.abs(c - exact).max() / cp.abs(exact).max())
                        t_mine = timed(mine)
                        t_blas = torch_timed(torch, lambda x=ta_t, y=tb_t: torch.matmul(x, y))
                        table.row(f"sgemm_ex {precision} {label} n={n}", t_mine,
                                  flops / t_mine / 1e12, "TFLOP/s", f"cuBLAS {precision}",
                                  flops / t_blas / 1e12, tensor_core_target(precision, n),
                                  f"max err/max vs FP32 {err:.1e}")
                del arrays, theirs
                cp.get_default_memory_pool().free_all_blocks()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved

    def bf16_operands():
        import torch

        from pytfm._arrays import pointer as ptr

        def check(status):
            if status:
                raise RuntimeError(ffi.string(lib.pytfm_last_error()).decode())

        for label, m, n, k, ta, tb, _ in bf16_operand_cases(
                max(sz.product_n), sz.linear_shape):
            sa, sb = bf16_operand_shapes(m, n, k, ta, tb)
            # (drawn by CuPy and handed over: torch's own device is never named)
            ta_t = torch.from_dlpack(randn(*sa)).to(torch.bfloat16)
            tb_t = torch.from_dlpack(randn(*sb)).to(torch.bfloat16)
            # the same BF16 values as raw bits (CuPy views of torch's memory) and widened
            a16, b16 = (cp.from_dlpack(t.view(torch.int16)).view(cp.uint16) for t in (ta_t, tb_t))
            a32, b32 = (cp.from_dlpack(t.float()) for t in (ta_t, tb_t))
            c = cp.empty((m, n), cp.float32)
            flops = 2.0 * m * n * k
            pa, pb = (ffi.cast("uint16_t *", t.data.ptr) for t in (a16, b16))

            def mine(c=c, pa=pa, pb=pb, m=m, n=n, k=k, ta=ta, tb=tb):
                check(lib.pytfm_gemm_bf16_cuda(ptr(c), pa, pb, m, n, k, ta, tb, 0.0,
                                               stream_ptr()))

            def fp32_operands(c=c, a32=a32, b32=b32, m=m, n=n, k=k, ta=ta, tb=tb):
                check(lib.pytfm_sgemm_ex_cuda(ptr(c), ptr(a32), ptr(b32), m, n, k, ta, tb, 0.0,
                                              dict(TENSOR_CORE_PRECISIONS)["bf16"],
                                              stream_ptr()))

            x, y = (ta_t.T if ta else ta_t), (tb_t.T if tb else tb_t)
            t_blas = torch_timed(torch, lambda x=x, y=y: torch.matmul(x, y))
            target = TENSOR_CORE_TARGETS[("bf16", 4096)] if "n=4096" in label else None
            for name, fn in (("gemm_bf16", mine), ("sgemm_ex bf16 (FP32 operands)",
                                                    fp32_operands)):
                fn()
                exact = cp.matmul(a32.T if ta else a32, b32.T if tb else b32)
                err = float(cp.abs(c - exact).max() / cp.abs(exact).max())
                t = timed(fn)
                table.row(f"{name} {label}", t, flops / t / 1e12, "TFLOP/s", "cuBLAS bf16",
                          flops / t_blas / 1e12, target, f"max err/max vs FP32 {err:.1e}")
            del ta_t, tb_t, a16, b16, a32, b32, c
            cp.get_default_memory_pool().free_all_blocks()

    def linear_layer():
        ROWS, IN, OUT = sz.linear_shape
        x, w, b, dy = randn(ROWS, IN), randn(OUT, IN), randn(OUT), randn(ROWS, OUT)
        flops = 2.0 * ROWS * IN * OUT
        blas = flops / timed(lambda: cp.matmul(x, w.T)) / 1e12
        size = f"{ROWS}x{IN}->{OUT}"
        t = timed(lambda: ops.linear_forward(x, w, b))
        table.row(f"linear_forward {size}", t, flops / t / 1e12, "TFLOP/s", "cuBLAS x.W^T",
                  blas)
        t = timed(lambda: ops.linear_gelu_forward(x, w, b))
        table.row(f"linear_gelu_forward {size}", t, flops / t / 1e12, "TFLOP/s",
                  "cuBLAS x.W^T", blas)
        t = timed(lambda: ops.linear_backward(dy, x, w))
        table.row(f"linear_backward {size} (dx dW db)", t, 2 * flops / t / 1e12, "TFLOP/s",
                  "cuBLAS x.W^T", blas)

    # -- the memory-bound kernels -----------------------------------------------------------------
    def row(kernel, direction, label, fn, nbytes, note=""):
        t = timed(fn)
        rate = nbytes / t / 1e9
        table.row(f"{kernel}_{direction} {label}", t, rate, "GB/s", "copy same B",
                  copy_rate(nbytes), bandwidth_target(kernel, direction),
                  f"{nbytes / MB:.0f} MB moved" + (f"; {note}" if note else ""))

    def rows_kernels():  # softmax, layernorm: rows of 768
        R, C = shapes["rows"]
        x, dy, w, b = randn(R, C), randn(R, C), randn(C), randn(C)
        N, label = x.nbytes, f"{R}x{C}"
        y = ops.softmax_forward(x)
        row("softmax", "forward", label, lambda: ops.softmax_forward(x), 2 * N)
        row("softmax", "backward", label, lambda: ops.softmax_backward(dy, y), 3 * N)
        _, mean, rstd = ops.layernorm_forward(x, w, b)
        row("layernorm", "forward", label, lambda: ops.layernorm_forward(x, w, b), 2 * N)
        row("layernorm", "backward", label,
            lambda: ops.layernorm_backward(dy, x, w, mean, rstd), 3 * N)

    def elementwise():  # gelu, sum_squares, adamw
        (n,) = shapes["elementwise"]
        g, gd = randn(n), randn(n)
        N = g.nbytes
        row("gelu", "forward", f"{n}", lambda: ops.gelu_forward(g), 2 * N)
        row("gelu", "backward", f"{n}", lambda: ops.gelu_backward(gd, g), 3 * N)
        row("sum_squares", "forward", f"{n}", lambda: ops.sum_squares(g), N)
        p, m, v = randn(n), randn(n), cp.abs(randn(n))
        row("adamw", "step", f"{n}", lambda: ops.adamw_step(p, gd, m, v, 10, 1e-4), 7 * N)

    def heads():  # rope, qkv_split
        B, T, H, D = shapes["heads"]
        q, dk, dv = randn(B, T, H, D), randn(B, T, H, D), randn(B, T, H, D)
        pos = cp.arange(T, dtype=cp.int64)
        N, label = q.nbytes, f"{B}x{T}x{H}x{D}"
        row("rope", "forward", label, lambda: ops.rope_forward(q, pos), 2 * N)
        row("rope", "backward", label, lambda: ops.rope_backward(q, pos), 2 * N)
        qkv = randn(B, T, 3, H, D)
        row("qkv_split", "forward", f"{B}x{T}x3x{H}x{D}",
            lambda: ops.qkv_split_forward(qkv, pos), 2 * qkv.nbytes)
        row("qkv_split", "backward", label, lambda: ops.qkv_split_backward(q, dk, dv, pos),
            2 * qkv.nbytes)

    def cross_entropy():
        R, V = shapes["logits"]
        logits = randn(R, V)
        targets = cp.random.randint(0, V, size=R, dtype=cp.int64)
        N, label = logits.nbytes, f"{R}x{V}"
        row("cross_entropy", "forward", label,
            lambda: ops.cross_entropy_forward(logits, targets, check_ids=False), N)
        _, lse = ops.cross_entropy_forward(logits, targets)  # (the targets checked once)
        row("cross_entropy", "backward", label,
            lambda: ops.cross_entropy_backward(logits, targets, lse, check_ids=False), 2 * N)

    def embedding():
        rows, C, vocab = shapes["embedding"]
        wte = randn(vocab, C)
        ids = cp.random.randint(0, vocab, size=rows, dtype=cp.int64)
        dy = randn(rows, C)
        touched = int(cp.unique(ids).size)
        label = f"{rows}x{C} vocab {vocab}"
        ops.embedding_forward(ids, wte)  # the ids checked once; the timed calls skip the
        # check, which reads the device (a host round trip that is no part of the kernel)
        row("embedding", "forward", label,
            lambda: ops.embedding_forward(ids, wte, check_ids=False), 2 * dy.nbytes)
        row("embedding", "backward", label,
            lambda: ops.embedding_backward(dy, ids, vocab, dtable=wte, check_ids=False),
            dy.nbytes + 2 * touched * C * 4, f"{touched} distinct ids: their rows read+written")

    def decode():
        B, T, H, D = shapes["cache"]
        k_cache, v_cache, q = randn(B, T, H, D), randn(B, T, H, D), randn(B, 1, H, D)
        row("attention_decode", "forward", f"cache {B}x{T}x{H}x{D}",
            lambda: ops.attention_decode(q, k_cache, v_cache, T - 1),
            k_cache.nbytes + v_cache.nbytes, "1 query; the caches read once")

    run = {"tc-products": tensor_core_products, "tc-attention": tc_attention,
           "bf16-operands": bf16_operands, "steps": steps, "ceilings": ceilings,
           "ceiling-products": ceiling_products, "attention": attention, "products": products,
           "linear": linear_layer, "bw-rows": rows_kernels, "bw-elementwise": elementwise,
           "bw-heads": heads, "bw-cross-entropy": cross_entropy, "bw-embedding": embedding,
           "bw-decode": decode}
    for key, _, title in SECTIONS:
        if key in args.keys:
            section(key, title, run[key])
    table.complete = True
    table.info["failed_sections"] = failed
    table.line(f"bench/cuda_ops.py: {time.monotonic() - start:.0f} s"
               + (f"; FAILED sections: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


# ---- no GPU: the host work of a step -------------------------------------------------------------
def host_only(steps=20, calls=2000):
    """train_tiny's step on the stand-in CuPy of the tests (tests/fake_cupy.py) with every CUDA
    kernel stubbed out (each returns at once): what it asks of the host, per step, for the loop
    train_tiny takes and for TrainStep's eager replay (a replayed graph asks one launch): the
    twins called, the CuPy operations (element-wise kernels on a GPU: the residual adds, the
    clip), the arrays allocated, the device and stream looked up; and the host time of one op
    (softmax_forward through pytfm.ops, its kernel stubbed) outside a step and inside one. Timed
    on this machine's CPU."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import numpy as np

    import fake_cupy
    import pytfm
    from pytfm import _arrays, _core, data, ops
    from pytfm.nn import GPT, GPTConfig
    from pytfm.optim import AdamW, clip_grad_norm
    from pytfm.train_step import TrainStep

    twins = []

    class Stub:  # pytfm's library, its CUDA functions answered at once
        def __init__(self):
            self.cpu = _core.lib

        def pytfm_get_build_info(self, info):
            status = self.cpu.pytfm_get_build_info(info)
            info.cuda = 1
            return status

        def pytfm_cuda_device_count(self, count):
            count[0] = 1
            return 0

        def __getattr__(self, name):
            if name.endswith("_cuda") or name.startswith("pytfm_cuda_"):
                def call(*args):
                    twins.append(name)
                    return 0
                return call
            return getattr(self.cpu, name)

    cp = fake_cupy.new()
    sys.modules["cupy"] = cp
    real, _core.lib = _core.lib, Stub()
    try:
        cfg = GPTConfig(d_model=128, n_layer=4, n_head=4, max_seq=128)
        x, y = data.Batches(data.stdlib_corpus().astype(np.int64), 128, 8, seed=0).batch(
            "train", 0)
        model = GPT(cfg, device="cuda")
        opt = AdamW(model.params, model.grads, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
        gx, gy = cp.asarray(x), cp.asarray(y)

        def loop():
            model.zero_grad()
            model.forward(gx, gy, check_ids=False)
            model.backward()
            clip_grad_norm(model.grads, 1.0)
            opt.step(3e-3)

        train = TrainStep(model, opt, max_norm=1.0)  # no emulator: its capture fails, it replays
        counts = {}
        with np.errstate(all="ignore"):  # the stubs leave the arrays' values unset
            for name, fn in (("loop", loop), ("TrainStep replay", lambda: train(x, y))):
                fn()
                fn()
                before = (len(twins), cp.operations(), cp.allocations(), cp.lookups())
                for _ in range(steps):
                    fn()
                after = (len(twins), cp.operations(), cp.allocations(), cp.lookups())
                counts[name] = [(b - a) / steps for a, b in zip(before, after)]
        a = cp.asarray(np.zeros((8, 128), np.float32))
        plan, stream = _arrays.Plan(), cp.cuda.Stream(non_blocking=True)
        times = {}
        t0 = time.perf_counter()
        for _ in range(calls):
            ops.softmax_forward(a)
        times["loop"] = (time.perf_counter() - t0) / calls
        with _arrays.on_stream(cp, stream, plan):
            plan.start()
            ops.softmax_forward(a)
            plan.finish()
            t0 = time.perf_counter()
            for _ in range(calls):
                plan.start()
                ops.softmax_forward(a)
                plan.finish()
            times["TrainStep replay"] = (time.perf_counter() - t0) / calls
        print(f"host work of train_tiny's step (d=128, 4 layers, B=8, T=128) with every kernel "
              f"stubbed: pytfm {pytfm.__version__}, Python {platform.python_version()}, "
              f"{platform.processor() or platform.machine()}")
        print(f"{'way':18s} {'twin calls':>10s} {'CuPy ops':>9s} {'arrays':>7s} {'lookups':>8s}"
              f" {'us/op':>6s}")
        for name, (n, operations, arrays, lookups) in counts.items():
            print(f"{name:18s} {n:10.0f} {operations:9.0f} {arrays:7.0f} {lookups:8.0f} "
                  f"{times[name] * 1e6:6.1f}")
        print("us/op: pytfm.ops.softmax_forward on an 8x128 array, its kernel stubbed; "
              f"TrainStep's mode here: {train.mode} ({train.graph_error})")
    finally:
        _core.lib = real
        del sys.modules["cupy"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
