"""What the benchmarks share: their worker processes' environment, the attention calls they
time, the training step they time, and the model's PyTorch twin (tests/torch_twin.py)."""

import os
import platform
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")  # where the PyTorch twin lives: it is the tests' oracle


def cpu_name():
    """The CPU's model name ("AMD EPYC ..."): a figure names the CPU it was taken on."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def worker_env(threads, **extra):
    """The environment of a worker process at `threads` threads (plus `extra` variables) that
    imports this checkout's pytfm, the one setup.py built and mirrored into it, and not some
    other installed copy."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **{k: str(v) for k, v in extra.items()})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def torch_twin():
    """The module tests/torch_twin.py (needs torch)."""
    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)
    import torch_twin

    return torch_twin


def attention_calls(lib, q, k, v, dy):
    """(forward, forward + backward) of causal attention on q, k, v, dy [B, T, H, D] float32,
    by "pytfm" (pytfm.ops) or "torch" (its fused scaled_dot_product_attention, on [B, H, T, D]
    views of the same memory; backward from the gradient dy), each a function to time."""
    if lib == "pytfm":
        from pytfm import ops

        def fwd():
            return ops.attention_forward(q, k, v, causal=True)

        def fwd_bwd():
            o, lse = ops.attention_forward(q, k, v, causal=True)
            return ops.attention_backward(dy, q, k, v, o, lse, causal=True)

        return fwd, fwd_bwd
    import torch

    tq, tk, tv, tdy = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v, dy))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def fwd():
        with torch.no_grad():
            return sdpa(tq, tk, tv, is_causal=True)

    def fwd_bwd():
        a, b, c = (t.detach().requires_grad_() for t in (tq, tk, tv))
        sdpa(a, b, c, is_causal=True).backward(tdy)
        return a.grad, b.grad, c.grad

    return fwd, fwd_bwd


def train_model(d, n_layer, n_head, context, batch):
    """(model, x, y): pytfm's GPT of that size (seed 0) and one batch of the stdlib corpus."""
    from pytfm import data
    from pytfm.nn import GPT, GPTConfig

    model = GPT(GPTConfig(d_model=d, n_layer=n_layer, n_head=n_head, max_seq=context, seed=0))
    x, y = data.Batches(data.stdlib_corpus(), context, batch, seed=0).batch("train", 0)
    return model, x, y


def pytfm_step(model, x, y):
    """One training step of model on (x, y) as a function: zero the gradients, forward,
    backward, clip the gradient norm to 1, AdamW. The train group times it against the twin,
    the breakdown group splits its time."""
    from pytfm.optim import AdamW, clip_grad_norm

    opt = AdamW(model.params, model.grads, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)

    def step():
        model.zero_grad()
        model.forward(x, y)
        model.backward()
        clip_grad_norm(model.grads, 1.0)
        opt.step(1e-4)

    return step


def stdlib_texts():
    """Every .py file of the running Python's standard library (site-packages left out) that is
    UTF-8, as str, in a sorted walk: the tokenizer benchmarks' corpus."""
    import sysconfig

    root = sysconfig.get_paths()["stdlib"]
    texts = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "site-packages")
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(d, name), "rb") as f:
                    raw = f.read()
                try:
                    texts.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    pass
    return texts
