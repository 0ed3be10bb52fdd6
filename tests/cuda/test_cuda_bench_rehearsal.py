"""bench/cuda_ops.py rehearsed without a GPU: every section of the H200 run, at tiny sizes
(--sizes tiny), on the stand-in CuPy of the tests (tests/fake_cupy.py, completed here with
what the bench asks of CuPy beyond pytfm.ops: random arrays, matmul, events, the device's
properties) with pytfm's kernels answered by the CUDA emulator (tests/cuda_emu.py), and torch
on the CPU, its CUDA events and memory counters stood in for. The figures mean nothing; what
is checked is what the H200 call depends on: every section runs and writes its rows as it
finishes (bench.txt line by line, bench.json rewritten atomically at each section's start and
end), a run killed after its first section (SIGKILL) or stopped by SIGTERM keeps the earlier
sections' rows in valid files, a budget of 0 skips the sections and says so, and runs into
one file (as scripts/gpu_check.sh's three bench steps make) add to it.

The bench runs in a subprocess (so that it can be killed): this file is also its driver,
`python tests/cuda/test_cuda_bench_rehearsal.py EMU_LIBRARY BENCH_ARGS...`.
"""

import json
import os
import signal
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
L2_BYTES = 2048  # the stand-in GPU's L2: the bandwidth rows' inputs are 4x it


# ---- the driver (in the subprocess) --------------------------------------------------------------
def stand_in_cupy(emu):
    """fake_cupy's module, with what bench/cuda_ops.py asks beyond pytfm.ops: each result one
    of the stand-in's arrays (host memory the emulator reads as device memory)."""
    import numpy as np

    import fake_cupy

    cp = fake_cupy.new(emu=emu)
    rng = np.random.default_rng(0)
    plain = np.asarray
    cp.__version__ = "stand-in"
    cp.float32, cp.int64, cp.uint16 = np.float32, np.int64, np.uint16
    cp.random = types.SimpleNamespace(
        standard_normal=lambda shape, dtype=np.float64: cp.asarray(
            rng.standard_normal(shape).astype(dtype)),
        randint=lambda low, high, size=None, dtype=np.int64: cp.asarray(
            rng.integers(low, high, size=size, dtype=dtype)))
    cp.matmul = lambda a, b: cp.asarray(np.matmul(plain(a), plain(b)))
    cp.abs = lambda a: cp.asarray(np.abs(plain(a)))
    cp.unique = lambda a: cp.asarray(np.unique(plain(a)))
    cp.from_dlpack = lambda t: cp.asarray(t.detach().cpu().contiguous().numpy())
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None,
                                                               total_bytes=lambda: 0)

    class Event(cp.cuda.Event):  # the stand-in's event (it orders streams), and a host clock:
        def record(self, stream=None):  # the emulator runs each kernel as it is launched
            super().record(stream)
            self.t = time.perf_counter()

        def elapsed_time(self, end):  # torch's: milliseconds to `end`
            return (end.t - self.t) * 1e3

    cp.cuda.Event = Event
    cp.cuda.get_elapsed_time = lambda start, stop: start.elapsed_time(stop)
    cp.cuda.runtime.getDeviceProperties = lambda device: {
        "name": b"emulated GPU (stand-in)", "multiProcessorCount": 1, "l2CacheSize": L2_BYTES,
        "totalGlobalMem": 1 << 30, "major": 9, "minor": 0}
    cp.cuda.runtime.runtimeGetVersion = lambda: 0
    cp.cuda.runtime.driverGetVersion = lambda: 0
    return cp, Event


def stand_in_torch(event):
    """torch on the CPU, its CUDA events and memory counters answered on the host"""
    import torch

    torch.cuda.Event = lambda enable_timing=False: event()
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.reset_peak_memory_stats = lambda *a: None
    torch.cuda.memory_allocated = lambda *a: 0
    torch.cuda.max_memory_allocated = lambda *a: 0


def drive(emu_library, argv):
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    import cuda_emu
    import fake_cupy
    import pytfm._core

    emu = cuda_emu.Emu(emu_library)
    cp, event = stand_in_cupy(emu)
    sys.modules["cupy"] = cp
    pytfm._core.lib = fake_cupy.EmulatedLib(emu)
    stand_in_torch(event)
    from bench import cuda_ops

    return cuda_ops.main(["--sizes", "tiny", *argv])


if __name__ == "__main__":
    sys.exit(drive(sys.argv[1], sys.argv[2:]))


# ---- the tests -----------------------------------------------------------------------------------
import pytest  # noqa: E402 - the driver above runs without pytest

from helpers import subprocess_env  # noqa: E402

pytest.importorskip("torch")  # the sections that compare with torch need it (on the CPU)


def start(emu_library, tmp_path, *args):
    """The bench under the driver, writing tmp_path/bench.txt and bench.json -> Popen"""
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), emu_library, "--out",
         str(tmp_path / "bench.txt"), "--json", str(tmp_path / "bench.json"), *args],
        cwd=ROOT, env=subprocess_env(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


def load(tmp_path):
    with open(tmp_path / "bench.json", encoding="utf-8") as f:
        return json.load(f)


def until(proc, tmp_path, ready, timeout=60):
    """Read bench.json until ready(its contents) holds (every version read must be whole
    JSON: the file is replaced, never written in place) -> the contents, or fail."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if (tmp_path / "bench.json").exists():
            doc = load(tmp_path)
            if ready(doc):
                return doc
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"never ready; the bench said:\n{proc.communicate()[0][-3000:]}")


def rows_of(doc, title):
    return [r for r in doc["rows"] if r["section"] == title]


def test_every_section_runs_and_writes_its_rows_as_it_finishes(emu_library, tmp_path,
                                                               monkeypatch):
    monkeypatch.syspath_prepend(ROOT)  # bench/ is in the checkout, not the installed package
    from bench import cuda_ops

    t0 = time.monotonic()
    proc = start(emu_library, tmp_path, "--cpu-threads", "1")
    seen = []  # bench.json as it was while the run went on: whole, and growing
    while proc.poll() is None:
        if (tmp_path / "bench.json").exists():
            doc = load(tmp_path)
            state = [(s["key"], s["status"]) for s in doc["sections"]]
            if not seen or seen[-1][0] != state:
                seen.append((state, len(doc["rows"]), doc["complete"]))
        time.sleep(0.005)
    out = proc.communicate()[0]
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, out[-4000:]
    doc = load(tmp_path)
    assert doc["complete"] and doc["sizes"] == "tiny"
    keys = [k for k, _, _ in cuda_ops.SECTIONS]
    assert [s["key"] for s in doc["sections"]] == keys, doc["sections"]
    # the order: the tensor cores, then the model's step, then the rest
    assert keys[:4] == ["tc-products", "tc-attention", "bf16-operands", "steps"]
    text = (tmp_path / "bench.txt").read_text()
    for s in doc["sections"]:
        assert s["status"] == "ok", s
        rows = rows_of(doc, s["title"])
        assert rows, f"{s['key']} wrote no row"
        for r in rows:  # each row in the table, its figure a number
            assert r["name"] in text and r["rate"] > 0, r
        assert f"-- {s['title']}" in text
    assert doc["rows"][0]["section"] == doc["sections"][0]["title"]
    # while it ran: sections ended one after the other, each one's rows there when it did
    assert len(seen) >= 3, seen
    for (state, nrows, complete), (_, later_rows, _) in zip(seen[:-1], seen[1:]):
        done = [k for k, status in state if status == "ok"]
        assert done == keys[:len(done)] and not complete and nrows <= later_rows, state
    assert seen[-1][2] is True or seen[-1][0][-1][1] == "ok"
    assert elapsed < 50, f"the rehearsal took {elapsed:.0f} s"


def test_a_kill_after_the_first_section_keeps_its_rows(emu_library, tmp_path):
    proc = start(emu_library, tmp_path, "--sections", "tc-products,tc-attention,steps")
    until(proc, tmp_path, lambda d: d["sections"] and d["sections"][0]["status"] == "ok")
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    doc = load(tmp_path)
    first = doc["sections"][0]
    assert first["key"] == "tc-products" and not doc["complete"]
    assert len(rows_of(doc, first["title"])) == 12  # 2 sizes x 2 precisions x 3 products
    assert all(s["status"] in ("ok", "running") for s in doc["sections"]), doc["sections"]
    text = (tmp_path / "bench.txt").read_text()
    assert all(r["name"] in text for r in doc["rows"])


def test_sigterm_stops_the_running_section_and_says_so(emu_library, tmp_path):
    proc = start(emu_library, tmp_path, "--sections", "tc-attention,steps")
    until(proc, tmp_path, lambda d: [s["status"] for s in d["sections"]] == ["ok", "running"])
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 1, out[-3000:]
    doc = load(tmp_path)
    assert [s["status"] for s in doc["sections"]] == ["ok", "STOPPED (a signal)"]
    assert not doc["complete"] and "clocks_after" in doc
    assert len(rows_of(doc, doc["sections"][0]["title"])) == 4  # 2 T x 2 precisions
    assert "stopped by signal 15 during steps" in (tmp_path / "bench.txt").read_text()


def test_steps_into_one_file_add_up_and_a_spent_budget_skips(emu_library, tmp_path):
    """gpu_check.sh's bench steps: one run, then one with no budget left"""
    first = start(emu_library, tmp_path, "--sections", "bw-decode")
    assert first.wait(timeout=60) == 0, first.communicate()[0][-3000:]
    late = start(emu_library, tmp_path, "--sections", "rest", "--budget", "0")
    out = late.communicate(timeout=60)[0]
    assert late.returncode == 0, out[-3000:]
    doc = load(tmp_path)
    assert doc["sections"][0] == dict(doc["sections"][0], key="bw-decode", status="ok")
    skipped = doc["sections"][1:]
    assert len(skipped) == 11 and all(s["status"].startswith("SKIPPED (past the budget")
                                      for s in skipped), skipped
    assert len(doc["runs"]) == 2 and all(r["complete"] for r in doc["runs"])
    assert [r["section"] for r in doc["rows"]] == [doc["sections"][0]["title"]]
    assert "SKIPPED (past the budget of 0 s)" in (tmp_path / "bench.txt").read_text()
