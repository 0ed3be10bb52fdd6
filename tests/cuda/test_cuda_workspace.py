"""Scratch without an allocation, on the emulator: the workspaces a stream binds
(pytfm_cuda_workspace_set, cuda/device.cu), every twin taking its scratch from one (no
cudaMallocAsync, the same bits as without), AdamW's scalars read from device memory (the same
bits as pytfm_adamw_step_cuda), and the emulator's counters and graph capture, which the
training-step tests (tests/cuda/test_cuda_step.py) stand on.
"""

import numpy as np
import pytest

from cuda_emu import EmuError, run_on_device
from ops_registry import case_id, checked, fresh

INVALID_VALUE = 1  # cudaErrorInvalidValue


def ptr(emu, a):
    return emu.ffi.cast("void *", a.ctypes.data)


def aligned(nbytes):
    """A host buffer of nbytes that starts on a 256-byte boundary (as CuPy's allocations)."""
    raw = np.zeros(nbytes + 256, np.uint8)
    start = -raw.ctypes.data % 256
    return raw[start:start + nbytes]


def binding(emu, stream):
    got = emu.ffi.new("int64_t[3]")
    emu.call("pytfm_cuda_workspace_get", stream, got, got + 1, got + 2, stream=False)
    return tuple(got)


def test_a_binding_holds_a_buffer_and_counts_what_the_calls_need(emu):
    s = emu.ffi.cast("void *", 0x40)
    assert binding(emu, s) == (-1, 0, 0)  # no binding
    emu.call("pytfm_cuda_workspace_set", s, emu.ffi.NULL, 0, stream=False)  # one that measures
    assert binding(emu, s) == (0, 0, 0)
    buf = aligned(4096)
    emu.call("pytfm_cuda_workspace_set", s, ptr(emu, buf), 4096, stream=False)
    assert binding(emu, s) == (4096, 0, 0)
    emu.call("pytfm_cuda_workspace_clear", s, stream=False)
    assert binding(emu, s) == (-1, 0, 0)
    emu.call("pytfm_cuda_workspace_clear", s, stream=False)  # none: nothing to do
    with pytest.raises(EmuError, match="pytfm_cuda_workspace_set: bytes must be >= 0, got -1"):
        emu.call("pytfm_cuda_workspace_set", s, ptr(emu, buf), -1, stream=False)
    with pytest.raises(EmuError, match="buffer must not be NULL when bytes > 0"):
        emu.call("pytfm_cuda_workspace_set", s, emu.ffi.NULL, 16, stream=False)
    with pytest.raises(EmuError, match="buffer must be 256-byte aligned"):
        emu.call("pytfm_cuda_workspace_set", s, emu.ffi.cast("void *", buf.ctypes.data + 16),
                 16, stream=False)
    with pytest.raises(EmuError, match="bytes must not be NULL"):
        emu.call("pytfm_cuda_workspace_get", s, emu.ffi.NULL, emu.ffi.NULL, emu.ffi.NULL,
                 stream=False)


def test_at_most_64_streams_have_a_workspace(emu):
    streams = [emu.ffi.cast("void *", 0x1000 + 16 * i) for i in range(65)]
    try:
        for s in streams[:64]:
            emu.call("pytfm_cuda_workspace_set", s, emu.ffi.NULL, 0, stream=False)
        with pytest.raises(EmuError, match="64 streams have a workspace already"):
            emu.call("pytfm_cuda_workspace_set", streams[64], emu.ffi.NULL, 0, stream=False)
        emu.call("pytfm_cuda_workspace_set", streams[3], emu.ffi.NULL, 0, stream=False)  # again
    finally:
        for s in streams:
            emu.call("pytfm_cuda_workspace_clear", s, stream=False)


# ---- every twin: its scratch from the stream's workspace -----------------------------------

FIRST = [(op, op.check.emu[0]) for op in checked(cuda=True)]


def bits(outputs):
    return [None if o is None else np.asarray(o).reshape(-1).view(np.uint8).copy()
            for o in outputs]


@pytest.mark.parametrize("op,values", FIRST,
                         ids=[f"{op.name}-{case_id(values)}" for op, values in FIRST])
def test_every_twin_takes_its_scratch_from_the_workspace(emu, cp, op, values):
    """Each twin through pytfm.ops on the stand-in's current stream (the null stream): with a
    binding that measures, what its scratch needs; with a workspace that size bound, no
    cudaMallocAsync and no cudaFreeAsync, and the bits it gives without one."""
    null = emu.ffi.NULL
    a = op.check.make(**values)
    before = emu.counters()
    plain = bits(run_on_device(cp, op, fresh(a)))
    allocated = emu.counters()["malloc_async"] - before["malloc_async"]
    try:
        emu.call("pytfm_cuda_workspace_set", null, null, 0, stream=False)
        run_on_device(cp, op, fresh(a))
        _, need, misses = binding(emu, null)
        assert misses == allocated and (need > 0) == (allocated > 0), (need, misses, allocated)
        buf = aligned(max(need, 1))
        emu.call("pytfm_cuda_workspace_set", null, ptr(emu, buf), buf.size, stream=False)
        before = emu.counters()
        got = bits(run_on_device(cp, op, fresh(a)))
        after = emu.counters()
        assert binding(emu, null) == (buf.size, need, 0)
    finally:
        emu.call("pytfm_cuda_workspace_clear", null, stream=False)
    assert after["malloc_async"] == before["malloc_async"]
    assert after["free_async"] == before["free_async"]
    for name, g, p in zip(op.check.outputs, got, plain, strict=True):
        assert (g is None) == (p is None) and (g is None or np.array_equal(g, p)), name


def test_a_workspace_too_small_is_a_miss_that_allocates(emu, cp):
    from pytfm import ops

    null = emu.ffi.NULL
    x = cp.asarray(np.random.default_rng(0).standard_normal((2, 5, 3, 8)).astype(np.float32))
    pos = cp.arange(5, dtype=np.int64)
    buf = aligned(256)  # RoPE's table of 5 positions of 4 pairs: 160 bytes; then 24 of 16
    try:
        emu.call("pytfm_cuda_workspace_set", null, ptr(emu, buf), buf.size, stream=False)
        before = emu.counters()
        small = ops.rope_forward(x, pos)
        assert emu.counters()["malloc_async"] == before["malloc_async"]
        big = cp.asarray(np.random.default_rng(1).standard_normal((1, 24, 1, 32)).astype(
            np.float32))
        ops.rope_forward(big, cp.arange(24, dtype=np.int64))  # 24 · 16 · 2 floats: 3 KiB
        assert emu.counters()["malloc_async"] == before["malloc_async"] + 1
        assert binding(emu, null) == (256, 24 * 16 * 2 * 4, 1)
    finally:
        emu.call("pytfm_cuda_workspace_clear", null, stream=False)
    assert small.shape == x.shape


# ---- AdamW's scalars in device memory --------------------------------------------------------


def test_adamw_with_its_scalars_in_memory_gives_the_twins_bits(emu):
    rng = np.random.default_rng(3)
    n = 1000
    p, g, m = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(n)).astype(np.float32)
    for step, lr, wd in ((1, 1e-3, 0.1), (7, 3e-4, 0.0), (1000, 2.5e-2, 0.5)):
        hyper = (step, lr, 0.9, 0.95, 1e-8, wd)
        scalars = np.zeros(8, np.float32)
        emu.call("pytfm_cuda_adamw_scalars", scalars, *hyper, stream=False)
        assert scalars[3] == np.float32(0.9) and scalars[4] == np.float32(1.0 - 0.9)
        assert scalars[0] == np.float32(1.0 - lr * wd) and scalars[7] == np.float32(1e-8)
        want = [a.copy() for a in (p, m, v)]
        emu.call("pytfm_adamw_step_cuda", want[0], want[1], want[2], g, n, *hyper)
        got = [a.copy() for a in (p, m, v)]
        emu.call("pytfm_adamw_step_scalars_cuda", got[0], got[1], got[2], g, n, scalars)
        for name, a, b in zip(("param", "m", "v"), got, want):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (step, name)
    with pytest.raises(EmuError, match="pytfm_adamw_step_scalars_cuda: scalars must not be NULL"):
        emu.call("pytfm_adamw_step_scalars_cuda", p, m, v, g, n, None)
    with pytest.raises(EmuError, match="pytfm_cuda_adamw_scalars: step must be >= 1"):
        emu.call("pytfm_cuda_adamw_scalars", scalars, 0, 1e-3, 0.9, 0.95, 1e-8, 0.0,
                 stream=False)
    with pytest.raises(EmuError, match="pytfm_adamw_step_scalars_cuda: param and m"):
        emu.call("pytfm_adamw_step_scalars_cuda", p, p, v, g, n, scalars)
    emu.call("pytfm_adamw_step_scalars_cuda", None, None, None, None, 0, None)  # nothing to do


# ---- the emulator: counters and graphs --------------------------------------------------------


def test_emulator_counts_allocations_copies_syncs_and_launches(emu):
    before = emu.counters()
    x = np.arange(100, dtype=np.float32)
    emu.call("emu_malloc_async", np.zeros_like(x), x, 100, stream=False)
    emu.call("pytfm_cuda_stream_synchronize", stream=True)
    after = emu.counters()
    assert {k: after[k] - before[k] for k in after} == dict(
        malloc=0, free=0, malloc_async=1, free_async=1, memcpy=0, sync=1, launches=2,
        captured=0)


def test_emulator_capture_records_launches_and_a_replay_runs_them(emu):
    x = np.arange(1, 9, dtype=np.float32)
    assert emu.lib.pytfm_emu_capture_length() == -1  # none open
    assert emu.lib.pytfm_emu_capture_begin() == 0
    try:
        assert emu.lib.pytfm_emu_capture_begin() == -1  # one at a time
        before = emu.counters()
        emu.call("emu_scale", x, 8, 2.0, stream=False)
        emu.call("emu_scale", x, 8, 3.0, stream=False)
        assert emu.lib.pytfm_emu_capture_length() == 2
        np.testing.assert_array_equal(x, np.arange(1, 9))  # recorded, not run
        # what a captured step must not do: allocate, free, copy, wait
        status = emu.lib.pytfm_cuda_stream_synchronize(emu.ffi.NULL)
        assert status != 0 and "cudaStreamSynchronize during a graph capture" in emu.error()
        with pytest.raises(EmuError, match="cudaMallocAsync during a graph capture"):
            emu.call("emu_malloc_async", np.zeros_like(x), x, 8, stream=False)
    finally:
        graph = emu.lib.pytfm_emu_capture_end()
    assert graph >= 0 and emu.lib.pytfm_emu_capture_end() == -1
    assert emu.counters()["captured"] == before["captured"] + 2
    assert emu.counters()["launches"] == before["launches"]
    assert emu.lib.pytfm_emu_graph_launch(graph, 0, -1) == 0
    np.testing.assert_array_equal(x, 6 * np.arange(1, 9))  # both, with their arguments
    assert emu.lib.pytfm_emu_graph_launch(graph, 1, 2) == 0  # the second alone
    np.testing.assert_array_equal(x, 18 * np.arange(1, 9))
    assert emu.lib.pytfm_emu_graph_launch(graph, 2, 1) == INVALID_VALUE  # an empty range
    emu.lib.pytfm_emu_graph_free(graph)
    assert emu.lib.pytfm_emu_graph_launch(graph, 0, -1) != 0  # freed
