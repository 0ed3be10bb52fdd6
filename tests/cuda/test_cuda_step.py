"""pytfm.train_step.TrainStep on the emulator: the training step with no allocation and no
host work in it. Its calls give the bits of the loop they replace (zero_grad, forward, backward,
the clip, AdamW), whether it records, replays its plan eagerly or replays the CUDA graph it
captured; and after the first call a step allocates nothing, frees nothing, copies nothing back,
synchronises nothing and asks CuPy for the current stream once (the caller's) and for the
device never, counted at both levels: the emulator's CUDA runtime (cudaMalloc*, cudaFree*,
cudaMemcpy*, synchronisations) and the stand-in CuPy (its arrays made, read back, waited for,
looked up). The stand-in's hazard detector watches every test here: the step runs on a stream
of its own, and a loss or a parameter read on the caller's stream before the step's work is
ordered before it fails the test (tests/cuda/test_cuda_streams.py holds the detector to that).
The counts of a train_tiny-shaped step are printed (-s): the launches and host operations a
step costs.
"""

import math

import numpy as np
import pytest

import fake_cupy
from pytfm import _arrays
from pytfm import device as devices
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm
from pytfm.train_step import TrainStep

CONFIGS = {
    "rope-tied": GPTConfig(vocab=32, d_model=32, n_layer=2, n_head=2, max_seq=12),
    "sinusoidal-untied": GPTConfig(vocab=32, d_model=32, n_layer=2, n_head=2, max_seq=12,
                                   pos="sinusoidal", tie_embeddings=False, seed=1),
    "none-odd-head-dim": GPTConfig(vocab=29, d_model=30, n_layer=2, n_head=2, max_seq=12,
                                   pos="none", seed=2),
    "learned-tied": GPTConfig(vocab=32, d_model=32, n_layer=2, n_head=2, max_seq=12,
                              pos="learned", seed=3),
}
TINY = CONFIGS["rope-tied"]
LR = (3e-2, 1e-2, 2e-2, 5e-3, 1e-2, 2.5e-2, 1e-3)


@pytest.fixture
def cp(emu, monkeypatch):
    return fake_cupy.install(monkeypatch, emu, strict=True)


def batch(cfg, i, B=2, T=12):
    rng = np.random.default_rng(100 + i)
    x, y = rng.integers(0, cfg.vocab, (B, T)), rng.integers(0, cfg.vocab, (B, T))
    y[0, i % T] = -1
    return x, y


def host_bits(a):
    return fake_cupy._asnumpy(a).reshape(-1).view(np.uint8)


def models(cfg):
    """Two GPU models from one seed, each with its AdamW: one for the loop, one for TrainStep."""
    out = []
    for _ in range(2):
        m = GPT(cfg, device="cuda")
        out.append((m, AdamW(m.params, m.grads, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)))
    return out


def loop_step(cp, model, opt, x, y, lr, max_norm):
    model.zero_grad()
    _, loss = model.forward(cp.asarray(x), cp.asarray(y))
    model.backward()
    norm = clip_grad_norm(model.grads, max_norm) if max_norm is not None else None
    opt.step(lr)
    return loss, norm


def assert_same_state(label, a, opt_a, b, opt_b):
    for name, x, y in (("params", a.params, b.params), ("grads", a.grads, b.grads),
                       ("m", opt_a.m, opt_b.m), ("v", opt_a.v, opt_b.v)):
        assert np.array_equal(host_bits(x.buffer), host_bits(y.buffer)), (label, name)
    assert opt_a.t == opt_b.t, label


@pytest.mark.parametrize("max_norm", [0.5, None, math.inf], ids=["clip", "no-clip", "inf"])
@pytest.mark.parametrize("name", CONFIGS)
def test_each_call_gives_the_loops_bits(cp, name, max_norm):
    cfg = CONFIGS[name]
    (ref, ref_opt), (model, opt) = models(cfg)
    step = TrainStep(model, opt, max_norm=max_norm)
    modes = []
    for i, lr in enumerate(LR):
        x, y = batch(cfg, i)
        want, want_norm = loop_step(cp, ref, ref_opt, x, y, lr, max_norm)
        got = step(x, y, lr)
        modes.append(step.mode)
        assert type(got) is cp.ndarray and got.shape == () and got.dtype == np.float32
        assert host_bits(got).tobytes() == host_bits(want).tobytes(), (i, step.mode)
        if max_norm is not None:
            assert host_bits(step.norm).tobytes() == host_bits(want_norm).tobytes(), i
        assert_same_state(f"call {i} ({step.mode})", model, opt, ref, ref_opt)
    assert modes == ["record", "replay"] + ["graph"] * (len(LR) - 2), step.graph_error
    assert step.graph_error is None


def test_the_clip_scales_as_clip_grad_norm_at_its_edges(cp):
    """A norm just above max_norm (clipped), at it (not: the test is norm > max_norm), and a
    gradient that is all zeros (norm 0): each the bits of optim.clip_grad_norm."""
    (ref, ref_opt), (model, opt) = models(TINY)
    x, y = batch(TINY, 0)
    ref.zero_grad()
    ref.forward(cp.asarray(x), cp.asarray(y))
    ref.backward()
    norm = float(clip_grad_norm(ref.grads, math.inf))
    for max_norm in (norm * (1 - 1e-12), norm, norm * 2, 0.0):
        (ref, ref_opt), (model, opt) = models(TINY)
        step = TrainStep(model, opt, max_norm=max_norm)
        loop_step(cp, ref, ref_opt, x, y, 1e-2, max_norm)
        step(x, y, 1e-2)
        assert_same_state(f"max_norm {max_norm!r}", model, opt, ref, ref_opt)


COUNTED = ("malloc", "free", "malloc_async", "free_async", "memcpy", "sync")


def counts(emu, cp):
    c = emu.counters()
    return dict(c, arrays=cp.allocations(), reads=cp.reads(), waits=cp.syncs(),
                lookups=cp.lookups())


def diff(after, before):
    return {k: after[k] - before[k] for k in after}


def test_nothing_allocates_or_waits_inside_a_step(emu, cp, capsys):
    """train_tiny's model shape (4 layers, d = 128, 4 heads) at a batch of 2 × 16: the first call
    records, and then no call allocates (cudaMalloc, cudaMallocAsync, a CuPy array), frees,
    copies (but the batch and AdamW's scalars, set through CuPy), reads back, synchronises or
    looks up the device, and each asks CuPy once for the current stream (the caller's, which
    the step orders itself with); the graph's replay runs the kernels the eager replay
    launched, one launch from Python."""
    cfg = GPTConfig(d_model=128, n_layer=4, n_head=4, max_seq=16)
    model = GPT(cfg, device="cuda")
    opt = AdamW(model.params, model.grads, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    step = TrainStep(model, opt, max_norm=1.0)
    seen = {}
    for i in range(4):
        x, y = batch(cfg, i, B=2, T=16)
        before = counts(emu, cp)
        step(x, y)
        seen[step.mode if step.mode != "graph" or "graph" not in seen else "graph again"] = \
            diff(counts(emu, cp), before)
    assert list(seen) == ["record", "replay", "graph", "graph again"]
    for mode in ("replay", "graph", "graph again"):
        for what in (*COUNTED, "arrays", "reads", "waits"):
            assert seen[mode][what] == 0, (mode, what, seen[mode])
        assert seen[mode]["lookups"] == 1, (mode, seen[mode])
    launched = seen["replay"]["launches"]
    assert seen["graph"]["captured"] == launched and seen["graph again"]["launches"] == launched
    assert seen["record"]["malloc_async"] == seen["record"]["free_async"] > 0
    bound, need, misses = step.workspace()
    assert bound >= need > 0 and misses == 0
    with capsys.disabled():
        print(f"\ntrain_tiny's shape, B=2 T=16: {launched} kernels a step; the loop's first "
              f"step {seen['record']['malloc_async']} cudaMallocAsync/cudaFreeAsync pairs and "
              f"{seen['record']['arrays']} CuPy arrays; a TrainStep call after it none of them "
              f"({need} bytes of scratch in its workspace)")


def test_ops_outside_a_step_ask_for_the_device_and_the_stream_once_each(cp):
    from pytfm import ops

    x = cp.asarray(np.ones((3, 4), np.float32))
    before = cp.lookups()
    ops.softmax_forward(x)
    assert cp.lookups() == before + 2  # Device() and get_current_stream(): the user's may change


def test_the_pool_is_told_to_keep_its_memory(cp, monkeypatch):
    monkeypatch.setattr(devices, "_KEPT", {})  # once a process: as if this were the first use
    GPT(TINY, device="cuda")
    pool = cp.cuda.runtime.deviceGetDefaultMemPool(0)
    assert cp.pool_attributes[(pool, 4)] == 2**64 - 1  # cudaMemPoolAttrReleaseThreshold
    assert devices.keep_pool_memory(cp) is None


def test_a_batch_of_another_shape_records_again(cp):
    (ref, ref_opt), (model, opt) = models(TINY)
    step = TrainStep(model, opt, max_norm=1.0)
    for i, (B, T) in enumerate(((2, 12), (2, 12), (2, 12), (1, 7), (1, 7), (2, 12))):
        x, y = batch(TINY, i, B, T)
        want, _ = loop_step(cp, ref, ref_opt, x, y, 1e-2, 1.0)
        got = step(x, y, 1e-2)
        assert host_bits(got).tobytes() == host_bits(want).tobytes(), i
        assert step.mode == ("record", "replay", "graph", "record", "replay", "record")[i]
    assert_same_state("after the shapes", model, opt, ref, ref_opt)


def test_without_a_graph_the_calls_replay_eagerly(cp, monkeypatch):
    (ref, ref_opt), (model, opt) = models(TINY)
    eager = TrainStep(model, opt, graph=False)
    for i in range(4):
        x, y = batch(TINY, i)
        loop_step(cp, ref, ref_opt, x, y, None, None)
        eager(x, y)
        assert eager.mode == ("record", "replay", "replay", "replay")[i]
    assert eager.graph_error == "graph=False"
    assert_same_state("graph=False", model, opt, ref, ref_opt)
    # a capture that fails: said, and the step still runs (eagerly)
    (ref, ref_opt), (model, opt) = models(TINY)
    failing = TrainStep(model, opt)

    def refuse(mode=None):
        raise RuntimeError("no capture today")

    monkeypatch.setattr(failing.stream, "begin_capture", refuse)
    for i in range(4):
        x, y = batch(TINY, i)
        loop_step(cp, ref, ref_opt, x, y, None, None)
        failing(x, y)
    assert failing.mode == "replay" and failing.graph_error == "RuntimeError: no capture today"
    assert_same_state("capture refused", model, opt, ref, ref_opt)


def test_device_inputs_and_the_checks_of_the_ids(cp):
    _, (model, opt) = models(TINY)
    step = TrainStep(model, opt)
    x, y = batch(TINY, 0)
    before = cp.reads()
    loss = step(x, y)  # host ids: checked on the host, nothing read
    assert cp.reads() == before
    loss2 = step(cp.asarray(x), cp.asarray(y))  # device ids: one read, for their check
    assert cp.reads() == before + 1
    unchecked = TrainStep(*models(TINY)[1], check_ids=False)
    before = cp.reads()
    unchecked(cp.asarray(x), cp.asarray(y))
    assert cp.reads() == before
    bad = x.copy()
    bad[1, 2] = TINY.vocab
    with pytest.raises(ValueError, match=rf"idx\[14\] = {TINY.vocab} is outside \[0, 32\)"):
        step(bad, y)
    with pytest.raises(ValueError, match=r"targets\[0\] = -2 is outside"):
        step(cp.asarray(x), cp.asarray(np.full_like(y, -2)))
    assert math.isfinite(float(loss)) and math.isfinite(float(loss2))


def test_each_call_fills_the_next_of_keep_loss_slots(cp):
    (ref, ref_opt), (model, opt) = models(TINY)
    step = TrainStep(model, opt, keep=3)
    got, want = [], []
    for i in range(5):
        x, y = batch(TINY, i)
        want.append(float(loop_step(cp, ref, ref_opt, x, y, None, None)[0]))
        got.append(step(x, y))
    assert [float(g) for g in got[2:]] == want[2:]  # the last 3 slots hold the last 3 losses
    assert float(got[0]) == want[3] and float(got[1]) == want[4]  # 0 and 1 were refilled


def test_bad_arguments_say_what_is_expected(cp):
    cpu = GPT(TINY)
    with pytest.raises(ValueError, match="model must be a GPT on the GPU"):
        TrainStep(cpu, AdamW(cpu.params, cpu.grads))
    model = GPT(TINY, device="cuda")
    other = GPT(TINY, device="cuda")
    with pytest.raises(ValueError, match=r"opt must be AdamW\(model.params, model.grads\)"):
        TrainStep(model, AdamW(other.params, other.grads))
    opt = AdamW(model.params, model.grads)
    with pytest.raises(ValueError, match="max_norm must be >= 0"):
        TrainStep(model, opt, max_norm=-1.0)
    with pytest.raises(ValueError, match="keep must be an int >= 1, got 0"):
        TrainStep(model, opt, keep=0)
    step = TrainStep(model, opt)
    x, y = batch(TINY, 0)
    with pytest.raises(TypeError, match=r"x must be an int64 array of shape \(B, T\)"):
        step(x.astype(np.int32), y)
    with pytest.raises(ValueError, match=r"y must have x's shape \(2, 12\), got \(2, 11\)"):
        step(x, y[:, :11])
    with pytest.raises(ValueError, match="sequence of 13 tokens is longer than max_seq = 12"):
        step(np.zeros((1, 13), np.int64), np.zeros((1, 13), np.int64))
    with pytest.raises(ValueError, match="lr must be finite and >= 0"):
        step(x, y, -1.0)
    assert opt.t == 0  # nothing ran
    model.to("cpu")
    with pytest.raises(RuntimeError, match="the model was moved"):
        step(x, y)


def test_a_plan_hands_out_its_arrays_in_order_or_says_what_changed():
    plan = _arrays.Plan()
    plan.start()
    a, b = plan.take(np, (2, 3), np.float32), plan.take(np, 4, np.int64)
    plan.finish()
    plan.start()
    assert plan.take(np, (2, 3), np.float32) is a and plan.take(np, (4,), np.int64) is b
    plan.finish()
    plan.start()
    with pytest.raises(_arrays.PlanMismatch, match=r"array 0 of shape \(3, 2\), float32, where "
                                                    r"its first run made \(2, 3\) float32"):
        plan.take(np, (3, 2), np.float32)
    plan.start()
    plan.take(np, (2, 3), np.float32)
    with pytest.raises(_arrays.PlanMismatch, match="used 1 of the 2 arrays"):
        plan.finish()
    plan.start()
    plan.take(np, (2, 3), np.float32)
    plan.take(np, (4,), np.int64)
    with pytest.raises(_arrays.PlanMismatch, match=r"array 2 of shape \(1,\), float32, where "
                                                    "its first run made nothing"):
        plan.take(np, 1, np.float32)
    assert plan.constant("k", lambda: a) is a and plan.constant("k", lambda: b) is a
