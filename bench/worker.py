"""One round of bench/run.py's measurements for one library, in a process of its own.

    python bench/worker.py LIB THREADS GROUPS...    # LIB: pytfm, numpy or torch

Prints one JSON object {case: seconds per call} for every case LIB takes part in. Each case is
timed as the median of 5 batches of calls (a batch lasts at least ~50 ms, after one warm-up
call); bench/run.py repeats rounds, interleaving the libraries, and takes medians over them.
The breakdown group's figures (pytfm only) are bench/breakdown.py's, per training step.
Only LIB is imported (NumPy always): pytfm's OpenMP threads, OpenBLAS's and torch's never
share a process.
"""

import json
import statistics
import sys
import time

import numpy as np
from common import attention_calls, pytfm_step, torch_twin, train_model  # bench/: this folder

# the sizes every library is measured at (bench/run.py reads them too)
SQUARE = (128, 256, 512, 1024, 2048)
# training configs: (name, d_model, n_layer, n_head, context, batch)
TRAIN = (("tiny", 128, 4, 4, 128, 8), ("d384", 384, 6, 6, 256, 8))
# the linear layers of those configs: (config, rows = batch·context, in, out)
LINEAR = tuple(
    (name, b * t, i, o)
    for name, d, _, _, t, b in TRAIN
    for i, o in ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d), (d, 256))
)
EW_ROWS, EW_COLS = 4096, 1024  # element-wise ops: 16 MiB per [rows, cols] array
ATT = dict(B=4, H=8, D=64, T=1024)


def timeit(f, min_batch=0.05):
    f()
    reps, t = 1, 0.0
    while True:  # grow the batch until it lasts min_batch
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        t = time.perf_counter() - t0
        if t >= min_batch:
            break
        reps *= 2
    times = [t / reps]
    for _ in range(4):
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


# ---- sgemm: C = op(A)·op(B) into a preallocated C, β = 0, for pytfm and numpy -------------


def gemm_cases(lib):
    """(name, function) pairs; both libraries write into a preallocated output."""
    cases = []

    def add(name, c, a, b, ta, tb):
        m, n = c.shape
        k = a.shape[0] if ta else a.shape[1]
        if lib == "numpy":
            at, bt = (a.T if ta else a), (b.T if tb else b)
            cases.append((name, lambda: np.matmul(at, bt, out=c)))
        else:
            from pytfm._core import ffi
            from pytfm._core import lib as C

            p = [ffi.from_buffer("float[]", x) for x in (c, a, b)]
            cases.append((name, lambda: C.pytfm_sgemm(*p, m, n, k, ta, tb, 0.0)))

    for n in SQUARE:
        add(f"sgemm/{n}", np.empty((n, n), np.float32), randn(n, n), randn(n, n, seed=1), 0, 0)
    for cfg, rows, i, o in LINEAR:
        x, w, dy = randn(rows, i), randn(o, i, seed=1), randn(rows, o, seed=2)
        tag = f"linear/{cfg} {rows}x{i}->{o}"
        add(tag + " fwd x·Wt", np.empty((rows, o), np.float32), x, w, 0, 1)
        add(tag + " dx=dy·W", np.empty((rows, i), np.float32), dy, w, 0, 0)
        add(tag + " dW=dyt·x", np.empty((o, i), np.float32), dy, x, 1, 0)
    return cases


# ---- element-wise ops: pytfm kernels into preallocated outputs; NumPy's copy as the peer ----

# bytes each op must move (read + write), for R rows of C floats: the GB/s denominator
N_EW = EW_ROWS * EW_COLS
EW_BYTES = {
    "layernorm fwd": 4 * (2 * N_EW + 2 * EW_ROWS),  # x -> y, mean, rstd
    "layernorm bwd": 4 * (3 * N_EW + 2 * EW_ROWS),  # dy, x, mean, rstd -> dx (dw, db: C each)
    "softmax fwd": 4 * 2 * N_EW,  # x -> y
    "softmax bwd": 4 * 3 * N_EW,  # dy, y -> dx
    "gelu fwd": 4 * 2 * N_EW,
    "gelu bwd": 4 * 3 * N_EW,  # dy, x -> dx
    "rope fwd": 4 * 2 * N_EW,  # x -> y (positions: 8 bytes per row)
    "rope bwd": 4 * 2 * N_EW,
    "cross_entropy fwd": 4 * (N_EW + 2 * EW_ROWS),  # logits -> loss, lse (targets: 8 B/row)
    "cross_entropy bwd": 4 * (2 * N_EW + EW_ROWS),  # logits, lse -> dlogits
    "adamw": 4 * 7 * N_EW,  # p, g, m, v -> p, m, v
}


def ew_cases(lib):
    if lib == "numpy":  # a copy of the same bytes: half read, half written
        cases = []
        for name, nbytes in EW_BYTES.items():
            src = np.ones(nbytes // 8, np.float32)
            dst = np.empty_like(src)
            cases.append((f"ew/{name}", lambda s=src, d=dst: np.copyto(d, s)))
        return cases
    from pytfm._core import ffi
    from pytfm._core import lib as C

    R, Cc = EW_ROWS, EW_COLS

    def p(a):
        return ffi.from_buffer("int64_t[]" if a.dtype == np.int64 else "float[]", a)

    x, dy, y, out = (
        randn(R, Cc),
        randn(R, Cc, seed=1),
        randn(R, Cc, seed=2),
        np.empty((R, Cc), np.float32),
    )
    w, b, dw, db = (
        randn(Cc, seed=3),
        randn(Cc, seed=4),
        np.zeros(Cc, np.float32),
        np.zeros(Cc, np.float32),
    )
    mean, rstd, loss, lse = (np.empty(R, np.float32) for _ in range(4))
    C.pytfm_layernorm_forward(p(y), p(mean), p(rstd), p(x), p(w), p(b), R, Cc, 1e-5)
    # RoPE on the same [R, C] floats: [B = R / 64, T = 64, H = 8, D = C / 8]
    T, H = 64, 8
    pos = np.arange(T, dtype=np.int64)
    targets = np.random.default_rng(5).integers(0, Cc, R).astype(np.int64)
    C.pytfm_cross_entropy_forward(p(loss), p(lse), p(x), p(targets), R, Cc, -100)
    m, v = np.zeros((R, Cc), np.float32), np.zeros((R, Cc), np.float32)
    sm = np.empty((R, Cc), np.float32)
    C.pytfm_softmax_forward(p(sm), p(x), R, Cc)
    cases = {
        "layernorm fwd": lambda: C.pytfm_layernorm_forward(
            p(out), p(mean), p(rstd), p(x), p(w), p(b), R, Cc, 1e-5
        ),
        "layernorm bwd": lambda: C.pytfm_layernorm_backward(
            p(out), p(dw), p(db), p(dy), p(x), p(w), p(mean), p(rstd), R, Cc
        ),
        "softmax fwd": lambda: C.pytfm_softmax_forward(p(out), p(x), R, Cc),
        "softmax bwd": lambda: C.pytfm_softmax_backward(p(out), p(dy), p(sm), R, Cc),
        "gelu fwd": lambda: C.pytfm_gelu_forward(p(out), p(x), N_EW),
        "gelu bwd": lambda: C.pytfm_gelu_backward(p(out), p(dy), p(x), N_EW),
        "rope fwd": lambda: C.pytfm_rope_forward(
            p(out), p(x), p(pos), R // T, T, H, Cc // H, 0, 10000.0
        ),
        "rope bwd": lambda: C.pytfm_rope_backward(
            p(out), p(dy), p(pos), R // T, T, H, Cc // H, 0, 10000.0
        ),
        "cross_entropy fwd": lambda: C.pytfm_cross_entropy_forward(
            p(loss), p(lse), p(x), p(targets), R, Cc, -100
        ),
        "cross_entropy bwd": lambda: C.pytfm_cross_entropy_backward(
            p(out), p(x), p(targets), p(lse), R, Cc, -100, 1.0
        ),
        "adamw": lambda: C.pytfm_adamw_step(
            p(y), p(m), p(v), p(dy), N_EW, 1, 1e-4, 0.9, 0.95, 1e-8, 0.0
        ),
    }
    return [(f"ew/{k}", f) for k, f in cases.items()]


# ---- attention: pytfm vs torch's fused SDPA, B=4, H=8, D=64, T=1024, causal ----------------


def attention_cases(lib):
    B, H, D, T = ATT["B"], ATT["H"], ATT["D"], ATT["T"]
    q, k, v, dy = (randn(B, T, H, D, seed=s) for s in range(4))
    fwd, fwd_bwd = attention_calls(lib, q, k, v, dy)
    return [("attention/fwd", fwd), ("attention/fwd+bwd", fwd_bwd)]


# ---- a training step: forward, backward, clipping, AdamW ------------------------------------


def train_cases(lib, threads, configs=TRAIN):
    """[(case, step)]: one training step of each of configs (TRAIN's rows) by lib."""
    cases = []
    for name, d, L, H, T, B in configs:
        model, x, y = train_model(d, L, H, T, B)
        if lib == "pytfm":
            step = pytfm_step(model, x, y)
        else:
            import torch

            twin = torch_twin().TorchGPT.from_pytfm(model)
            topt = twin.optimizer(lr=1e-4)
            tx, ty = torch.from_numpy(x), torch.from_numpy(y)

            def step(twin=twin, topt=topt, tx=tx, ty=ty):
                topt.zero_grad()
                twin(tx, ty)[1].backward()
                torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
                topt.step()

        cases.append((f"train/{name} step ({B}x{T} tokens)", step))
    return cases


# ---- bf16: the BF16 products beside pytfm's FP32 ones and torch's bf16 autocast ---------------

BF16_SQUARE = (256, 512, 1024, 2048)
# tokens decoded per rep, and reps (a tiny model's token is tens of µs: many reps for a steady
# median); per-token medians over the reps and the positions from 16 on
DECODE_TOKENS = {"tiny": 128, "gpt2": 64}
DECODE_REPS = {"tiny": 30, "gpt2": 3}


def autocast():
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)


def bf16_gemm_cases(lib):
    """[(case, fn)]: the square products and the model's; pytfm gives each case twice, in
    BF16 (pytfm_sgemm_ex) and FP32 (pytfm_sgemm, "case [fp32]"); torch multiplies the same
    float32 arrays under autocast (the rounding to BF16 included, as in pytfm)."""
    cases = []

    def add(name, c, a, b, ta, tb):
        m, n = c.shape
        k = a.shape[0] if ta else a.shape[1]
        if lib == "torch":
            import torch

            at, bt = (torch.from_numpy(x) for x in (a, b))
            at, bt = (at.T if ta else at), (bt.T if tb else bt)

            def mm(at=at, bt=bt):
                with autocast():
                    return torch.mm(at, bt)

            cases.append((name, mm))
            return
        from pytfm._core import ffi
        from pytfm._core import lib as C

        p = [ffi.from_buffer("float[]", x) for x in (c, a, b)]
        bf16 = C.PYTFM_PRECISION_BF16
        cases.append((name, lambda: C.pytfm_sgemm_ex(*p, m, n, k, ta, tb, 0.0, bf16)))
        cases.append((name + " [fp32]", lambda: C.pytfm_sgemm(*p, m, n, k, ta, tb, 0.0)))

    for n in BF16_SQUARE:
        add(f"bf16/sgemm {n}", np.empty((n, n), np.float32), randn(n, n), randn(n, n, seed=1),
            0, 0)
    for cfg, rows, i, o in LINEAR:
        x, w, dy = randn(rows, i), randn(o, i, seed=1), randn(rows, o, seed=2)
        tag = f"bf16/linear {cfg} {rows}x{i}->{o}"
        add(tag + " fwd x·Wt", np.empty((rows, o), np.float32), x, w, 0, 1)
        add(tag + " dx=dy·W", np.empty((rows, i), np.float32), dy, w, 0, 0)
        add(tag + " dW=dyt·x", np.empty((o, i), np.float32), dy, x, 1, 0)
    return cases


def bf16_train_cases(lib):
    """[(case, step)]: the training step of each config of TRAIN, pytfm in bf16 and in fp32
    ("case [fp32]"), torch's twin with its forward under autocast (the usual recipe: the loss
    and the backward outside it)"""
    cases = []
    for name, d, L, H, T, B in TRAIN:
        model, x, y = train_model(d, L, H, T, B)
        case = f"bf16/train {name} step ({B}x{T} tokens)"
        if lib == "pytfm":
            step = pytfm_step(model, x, y)

            def in_precision(precision, step=step, model=model):
                def run():
                    model.set_precision(precision)
                    step()
                return run

            cases += [(case, in_precision("bf16")), (case + " [fp32]", in_precision("fp32"))]
            continue
        import torch

        twin = torch_twin().TorchGPT.from_pytfm(model)
        topt = twin.optimizer(lr=1e-4)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def tstep(twin=twin, topt=topt, tx=tx, ty=ty):
            topt.zero_grad()
            with autocast():
                loss = twin(tx, ty)[1]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
            topt.step()

        cases.append((case, tstep))
    return cases


def bf16_decode_figures(lib, threads):
    """{case: seconds per decoded token}: the C model API (bench/c_decode.c, in bf16 and in
    fp32) or torch's twin decoding through its own KV cache under autocast, on the checkpoints
    bench/run.py made (PYTFM_BENCH_DECODE: {name: path}; PYTFM_BENCH_C_DECODE: the program)"""
    import os
    import subprocess

    paths = json.loads(os.environ.get("PYTFM_BENCH_DECODE", "{}"))
    figures = {}
    for name, path in paths.items():
        tokens = DECODE_TOKENS[name]
        case = f"bf16/decode {name} (per token)"
        if lib == "pytfm":
            for precision, key in (("bf16", case), ("fp32", case + " [fp32]")):
                out = subprocess.run([os.environ["PYTFM_BENCH_C_DECODE"], path,
                                      str(DECODE_REPS[name]), str(threads), precision,
                                      str(tokens)], capture_output=True, text=True,
                                     check=True).stdout
                ns = [int(line.split()[1]) for line in out.splitlines()][16:]
                figures[key] = statistics.median(ns) * 1e-9
        else:
            figures[case] = torch_decode(path, tokens, reps=min(DECODE_REPS[name], 5))
    return figures


def torch_decode(path, tokens, reps=2):
    """The median seconds per token of torch's twin decoding `tokens` tokens from position 0
    (bench/c_generate.py's twin_decode), under autocast, over positions 16 on"""
    import torch

    from bench.c_generate import tokens_of, twin_decode
    from pytfm import checkpoint

    model, _, _ = checkpoint.load(path)
    cfg = model.cfg
    twin = torch_twin().TorchGPT.from_pytfm(model).eval()
    del model
    ids, H, D = tokens_of(cfg.vocab, tokens), cfg.n_head, cfg.d_model // cfg.n_head
    times = []
    with torch.no_grad(), autocast():
        for _ in range(reps):
            caches = [(torch.zeros(1, tokens, H, D), torch.zeros(1, tokens, H, D))
                      for _ in range(cfg.n_layer)]
            for t in range(tokens):
                t0 = time.perf_counter()
                twin_decode(twin, torch.tensor([[ids[t]]]), caches, t)
                if t >= 16:
                    times.append(time.perf_counter() - t0)
    return statistics.median(times)


GROUPS = {
    "sgemm": ("pytfm", "numpy"),
    "ew": ("pytfm", "numpy"),
    "attention": ("pytfm", "torch"),
    "train": ("pytfm", "torch"),
    "breakdown": ("pytfm",),  # bench/breakdown.py: where a pytfm training step's time goes
    "bf16": ("pytfm", "torch"),  # pytfm in BF16 and FP32, torch under bf16 autocast
}


def main():
    lib, threads, groups = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if lib == "pytfm":
        import pytfm

        pytfm.set_num_threads(threads)
    elif lib == "torch":
        import torch

        torch.set_num_threads(threads)
    cases = []
    for g in groups:
        if lib not in GROUPS[g]:
            continue
        if g == "sgemm":
            cases += gemm_cases(lib)
        elif g == "ew":
            cases += ew_cases(lib)
        elif g == "attention":
            cases += attention_cases(lib)
        elif g == "train":
            cases += train_cases(lib, threads)
        elif g == "bf16":
            cases += bf16_gemm_cases(lib) + bf16_train_cases(lib)
    figures = {name: timeit(f) for name, f in cases}
    if "bf16" in groups:
        figures.update(bf16_decode_figures(lib, threads))
        if lib == "pytfm":
            import pytfm

            figures["bf16/path"] = pytfm.bf16_path()  # not a time: what ran
    if lib == "pytfm" and "breakdown" in groups:
        import breakdown

        figures.update(breakdown.figures(TRAIN))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
