"""Time pytfm's CUDA kernels on the GPU against what bounds them, measured in the same run.

    python bench/cuda_ops.py [--out FILE] [--budget SECONDS] [--cpu-threads N]

One table, each row printed as soon as it is measured (and appended to FILE), in this order:
  ceilings    a device-to-device copy of 64x the L2 (counting bytes read and written), cuBLAS
              (cupy.matmul, FP32, TF32 off) at n = 4096
  attention   pytfm_attention_forward and forward+backward against
              torch.nn.functional.scaled_dot_product_attention in float32 (B=4, H=8, D=64,
              causal, T = 1024, 4096, 16384); the memory each takes beyond its inputs (peak of
              CuPy's pool, and of the CUDA stream-ordered pool the kernels' scratch comes from;
              torch.cuda.max_memory_allocated for torch), and the largest difference of the
              outputs, so the two are seen to compute the same thing
  train_tiny  examples/train_tiny.py's default config (its own parser's defaults, imported from
              it): GPT(cfg, device="cuda") and AdamW, the step train_tiny takes (the loss read
              back every step), tokens/s; against the same loop on the CPU with --cpu-threads
              threads (default 2; 0 skips it) in this process, on this machine's CPU
  products    the linear layer's three products, x·Wᵀ, dy·W and dyᵀ·x, through
              pytfm_sgemm_cuda at n = 1024 and 4096 against cupy.matmul of the same operands
              (transposed views: no copies on either side); linear_forward and linear_backward
              at a GPT-2 MLP layer's size, and linear_gelu_forward
  bandwidth   every memory-bound kernel, forward and backward, with every input at least 4x
              the L2 (read from the device), against a device-to-device copy of the same
              number of bytes (the fewest a kernel must move: each input read once, each
              output written once)
Targets (the ratio a row must reach on an H200) are printed next to each ratio, with "yes" or
"NO"; rows without a target show "-". These are benchmark figures,
never a test. Timing: CUDA events around enough calls to fill ~20 ms, after warm-up; the
median of 5 such runs. A section that fails prints its error and the others still run (exit
status 1); a section that would start past --budget seconds (default: GPU_CHECK_STEP_SECONDS
less 10, as scripts/gpu_check.sh sets it, else none) is printed as skipped.

The shape arithmetic and the table's formatting import without CuPy (tests/cuda/test_gpu_check.py
checks the sizes against the 4x L2 rule).
"""

import argparse
import importlib.util
import math
import os
import statistics
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1e6

# ---- what is measured -----------------------------------------------------------------------
ATTENTION_SHAPE = (4, 8, 64)  # B, H, D
ATTENTION_T = (1024, 4096, 16384)
ATTENTION_TARGET_T = 4096
PRODUCT_N = (1024, 4096)
LINEAR_SHAPE = (8192, 768, 3072)  # a GPT-2 small MLP layer: rows = B·T = 8192, in, out

# ---- targets ------------------------------------------------------------------------------------
# (label, ratio): the ratio this row must reach on an H200, against the row's baseline
ATTENTION_FWD_TARGET = ("issue 10", 1.0)    # x torch SDPA at T = 4096
ATTENTION_FWDBWD_TARGET = ("issue 10", 0.8)
TRAIN_TINY_TARGET = ("issue 10", 3.0)       # x the 2-core CPU
PRODUCT_TARGETS = {4096: ("issue 12", 0.8), 1024: ("issue 12", 0.6)}  # x cuBLAS
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
    return None if t is None else ("issue 12", t)


# ---- sizes: every input of a bandwidth row at least 4x the L2 -----------------------------------
def ceil_to(x, m):
    """The smallest multiple of the integer m that is >= x (a float or an int)."""
    return math.ceil(x / m) * m


def bandwidth_shapes(l2_bytes, factor=4):
    """The shapes of the bandwidth rows for a GPU with l2_bytes of L2: each float32 input (and
    the caches of the decode) at least factor x l2_bytes, so that repeated calls stream from
    device memory, not from the L2. -> {name: shape tuple}"""
    floats = factor * l2_bytes / 4  # the fewest elements of one input
    C, V, H, D = 768, 50304, 16, 64  # GPT-2 small's width and vocabulary; 16 heads of 64
    rows = ceil_to(floats / C, 1024)
    bthd = ceil_to(floats / (4096 * H * D), 1)  # batches of [4096, 16, 64]
    return {
        "rows": (rows, C),                              # softmax, layernorm
        "elementwise": (ceil_to(floats, 1 << 20),),     # gelu, adamw, sum_squares
        "heads": (bthd, 4096, H, D),                    # rope, qkv_split's q, k, v
        "logits": (ceil_to(floats / V, 8), V),          # cross-entropy
        "embedding": (rows, C, ceil_to(floats / C, 1024)),  # rows of dy, width, vocab
        "cache": (8, ceil_to(floats / (8 * H * D), 1024), H, D),  # decode's k and v caches
        "copy": (ceil_to(16 * floats, 1 << 20),),       # the copy ceiling: 64x the L2
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


def format_row(name, seconds, rate, unit, vs="", vs_rate=None, target=None, note=""):
    """One line of the table: ratio = rate / vs_rate; target (issue, ratio) or None."""
    t = f"{seconds * 1e6:10.1f}" if seconds is not None else f"{'-':>10s}"
    r = f"{rate:9.1f}" if rate is not None else f"{'-':>9s}"
    ratio = rate / vs_rate if rate is not None and vs_rate else None
    ratio_s = f"{ratio:6.2f}x" if ratio is not None else f"{'-':>7s}"
    vr = f"{vs_rate:9.1f}" if vs_rate else f"{'-':>9s}"
    if target is None:
        tgt, met = f"{'-':>8s}", "-"
    else:
        tgt = f">={target[1]:.2f}x"
        met = "-" if ratio is None else ("yes" if ratio >= target[1] else "NO")
        note = f"{target[0]}; {note}" if note else target[0]
    line = f"{name:46s} {t} {r} {unit:8s} {vs:12s} {vr} {ratio_s} {tgt:>8s} {met:3s}  {note}"
    return line.rstrip()


class Table:
    def __init__(self, out):
        self.out = out

    def line(self, text):
        print(text, flush=True)
        if self.out:
            with open(self.out, "a", encoding="utf-8") as f:
                f.write(text + "\n")

    def row(self, *args, **kw):
        self.line(format_row(*args, **kw))


# ---- the GPU part -------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also append the table to this file")
    step = os.environ.get("GPU_CHECK_STEP_SECONDS")
    ap.add_argument("--budget", type=float, default=float(step) - 10 if step else None,
                    help="seconds: sections that would start later are skipped")
    ap.add_argument("--cpu-threads", type=int, default=2,
                    help="threads of the CPU train_tiny run (0: skip it; default 2)")
    args = ap.parse_args(argv)
    os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS in true FP32, as pytfm computes
    import cupy as cp

    from pytfm import ops
    from pytfm._core import ffi, lib

    start = time.monotonic()
    table = Table(args.out)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    l2 = props["l2CacheSize"]
    shapes = bandwidth_shapes(l2)
    table.line(f"pytfm CUDA kernels on {name}: {props['multiProcessorCount']} SMs, L2 "
               f"{l2 / MB:.1f} MB (bandwidth inputs >= {4 * l2 / MB:.0f} MB each), cupy "
               f"{cp.__version__}")
    table.line(HEAD)
    failed = []

    def stream_ptr():
        return ffi.cast("void *", cp.cuda.get_current_stream().ptr)

    def timed(fn, target_s=0.02, runs=5):
        """Median seconds per call of fn() on CuPy's current stream (CUDA events)."""
        fn()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
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
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / reps)
        return statistics.median(times)

    def section(title, fn):
        left = None if args.budget is None else args.budget - (time.monotonic() - start)
        if left is not None and left <= 0:
            table.line(f"-- {title}: SKIPPED (past the budget of {args.budget:.0f} s)")
            return
        table.line(f"-- {title}")
        try:
            fn()
        except Exception as e:  # report and go on: the other sections still say something
            failed.append(title)
            table.line(f"   FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
        cp.get_default_memory_pool().free_all_blocks()

    randn = lambda *shape: cp.random.standard_normal(shape, dtype=cp.float32)  # noqa: E731

    # -- ceilings ---------------------------------------------------------------------------------
    def ceilings():
        src = randn(*shapes["copy"])
        dst = cp.empty_like(src)
        t = timed(lambda: cp.copyto(dst, src))
        table.row(f"device-to-device copy {src.nbytes / 1e9:.2f} GB (ceiling)", t,
                  2 * src.nbytes / t / 1e9, "GB/s")

    def ceiling_blas():
        n = 4096
        a, b = randn(n, n), randn(n, n)
        t = timed(lambda: cp.matmul(a, b))
        table.row(f"cupy.matmul {n}^3 FP32 (ceiling)", t, 2 * n**3 / t / 1e12, "TFLOP/s")

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

    # -- attention against torch ------------------------------------------------------------------
    def attention():
        import torch
        import torch.nn.functional as F

        table.line(f"   torch {torch.__version__} (matmul TF32 "
                   f"{torch.backends.cuda.matmul.allow_tf32}); FLOPs: causal forward "
                   "2·B·H·T²·D, forward+backward 3.5x that (the backward recomputes P)")
        B, H, D = ATTENTION_SHAPE
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

        def torch_timed(fn, runs=5):
            fn()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            reps = max(1, min(50, int(0.02 / max(s.elapsed_time(e) / 1e3, 1e-6))))
            times = []
            for _ in range(runs):
                s.record()
                for _ in range(reps):
                    fn()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) / 1e3 / reps)
            return statistics.median(times)

        def at(T):
            q, k, v, dy = (randn(B, T, H, D) for _ in range(4))
            # torch in its own layout [B, H, T, D], its own allocations, the same values
            tq, tk, tv, tdy = (torch.from_dlpack(a).permute(0, 2, 1, 3).contiguous()
                               for a in (q, k, v, dy))
            for t in (tq, tk, tv):
                t.requires_grad_(True)
            cp.cuda.Device().synchronize()
            flops = 2.0 * B * H * T * T * D  # causal: half of 4·B·H·T²·D

            fwd = lambda: ops.attention_forward(q, k, v, causal=True)  # noqa: E731
            o = fwd()[0]
            t_fwd = timed(fwd)
            mem_fwd = pytfm_peak(fwd)

            def fwd_bwd():
                o, lse = ops.attention_forward(q, k, v, causal=True)
                return ops.attention_backward(dy, q, k, v, o, lse, causal=True)

            t_fb = timed(fwd_bwd)
            mem_fb = pytfm_peak(fwd_bwd)
            dq = fwd_bwd()[0]

            def torch_fwd():
                with torch.no_grad():
                    return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)

            def torch_fwd_bwd():
                out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
                return torch.autograd.grad(out, (tq, tk, tv), tdy)

            tt_fwd, tmem_fwd = torch_timed(torch_fwd), torch_peak(torch_fwd)
            tt_fb, tmem_fb = torch_timed(torch_fwd_bwd), torch_peak(torch_fwd_bwd)
            to = torch_fwd().permute(0, 2, 1, 3)
            tdq = torch_fwd_bwd()[0].permute(0, 2, 1, 3)
            o_t, dq_t = cp.from_dlpack(to.contiguous()), cp.from_dlpack(tdq.contiguous())
            diff_o = float(cp.abs(o - o_t).max() / cp.abs(o_t).max())
            diff_dq = float(cp.abs(dq - dq_t).max() / cp.abs(dq_t).max())
            at = T == ATTENTION_TARGET_T
            table.row(f"attention_forward T={T} (B={B} H={H} D={D} causal)", t_fwd,
                      flops / t_fwd / 1e12, "TFLOP/s", "torch SDPA", flops / tt_fwd / 1e12,
                      ATTENTION_FWD_TARGET if at else None,
                      f"mem {mem_fwd / MB:.0f} MB (torch {tmem_fwd / MB:.0f}); "
                      f"max|o-torch|/max|o| {diff_o:.1e}")
            table.row(f"attention fwd+bwd T={T}", t_fb, 3.5 * flops / t_fb / 1e12, "TFLOP/s",
                      "torch SDPA", 3.5 * flops / tt_fb / 1e12,
                      ATTENTION_FWDBWD_TARGET if at else None,
                      f"mem {mem_fb / MB:.0f} MB (torch {tmem_fb / MB:.0f}); "
                      f"max|dq-torch|/max|dq| {diff_dq:.1e}")

        for T in ATTENTION_T:
            at(T)  # its arrays go when it returns
            torch.cuda.empty_cache()
            cp.get_default_memory_pool().free_all_blocks()

    # -- train_tiny's default config --------------------------------------------------------------
    def train_tiny():
        import numpy as np

        import pytfm
        from pytfm import data
        from pytfm.nn import GPT, GPTConfig
        from pytfm.optim import AdamW, clip_grad_norm, cosine_lr

        spec = importlib.util.spec_from_file_location(
            "train_tiny", os.path.join(ROOT, "examples", "train_tiny.py"))
        tiny = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tiny)
        a = tiny.parse_args([])  # its defaults, no checks, no files touched
        cfg = GPTConfig(d_model=a.d_model, n_layer=a.n_layer, n_head=a.n_head,
                        max_seq=a.context, pos=a.pos, seed=a.seed)
        batches = data.Batches(data.stdlib_corpus().astype(np.int64), a.context, a.batch,
                               seed=a.seed)

        def run(device, warm, seconds, max_steps):
            model = GPT(cfg, device=device) if device != "cpu" else GPT(cfg)
            opt = AdamW(model.params, model.grads, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
            to = cp.asarray if device == "cuda" else (lambda t: t)
            steps, t0 = 0, None
            for step in range(warm + max_steps):
                if step == warm:
                    if device == "cuda":
                        cp.cuda.Device().synchronize()
                    t0 = time.perf_counter()
                lr = cosine_lr(step, a.lr, a.warmup, a.steps, min_lr=a.lr / 10)
                x, y = batches.batch("train", step)
                model.zero_grad()
                # as train_tiny's step: the ids are bytes (no check, no read of the device);
                # the loss stays there until it is printed (here: once, at the end)
                _, loss = model.forward(to(x), to(y), check_ids=False)
                model.backward()
                clip_grad_norm(model.grads, 1.0)
                opt.step(lr)
                if step >= warm:
                    steps += 1
                    if time.perf_counter() - t0 > seconds:
                        break
            if device == "cuda":
                cp.cuda.Device().synchronize()
            elapsed = time.perf_counter() - t0
            return steps * a.batch * a.context / elapsed, elapsed / steps, float(loss)

        shape = (f"d={cfg.d_model} L={cfg.n_layer} H={cfg.n_head} T={cfg.max_seq} "
                 f"B={a.batch}")
        gpu_rate, gpu_step, gpu_loss = run("cuda", 5, 10.0, 300)
        cpu_rate = None
        note = f"loss {gpu_loss:.3f}"
        if args.cpu_threads > 0:
            threads = pytfm.get_num_threads()
            pytfm.set_num_threads(args.cpu_threads)
            try:
                cpu_rate, _, _ = run("cpu", 2, 8.0, 40)
            finally:
                pytfm.set_num_threads(threads)
            note += f"; CPU: this machine, {args.cpu_threads} threads"
        table.row(f"train_tiny default ({shape})", gpu_step, gpu_rate, "tok/s",
                  f"CPU {args.cpu_threads} thr" if cpu_rate else "", cpu_rate,
                  TRAIN_TINY_TARGET, note)

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
                          "cuBLAS", flops / t_blas / 1e12, PRODUCT_TARGETS.get(n),
                          f"max err/max {err:.1e}")

        for n in PRODUCT_N:
            at(n)

    def linear_layer():
        ROWS, IN, OUT = LINEAR_SHAPE
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

    bw = "vs copy, inputs >= 4x L2:"
    for title, fn in (("ceilings: copy", ceilings), ("ceilings: cuBLAS", ceiling_blas),
                      ("attention vs torch SDPA (float32)", attention),
                      ("train_tiny tokens/s", train_tiny),
                      ("products vs cuBLAS (FP32, TF32 off)", products),
                      ("linear layer, GPT-2 MLP size", linear_layer),
                      (f"{bw} softmax, layernorm", rows_kernels),
                      (f"{bw} gelu, sum_squares, adamw", elementwise),
                      (f"{bw} rope, qkv_split", heads), (f"{bw} cross-entropy", cross_entropy),
                      (f"{bw} embedding", embedding), (f"{bw} attention_decode", decode)):
        section(title, fn)
    table.line(f"bench/cuda_ops.py: {time.monotonic() - start:.0f} s"
               + (f"; FAILED sections: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
