"""scripts/cuda_small_run.py, the workload compute-sanitizer runs on a GPU (scripts/gpu_check.sh),
calls every CUDA kernel the library has: its kernel sections (KERNELS) run here under the CPU
emulator with the CuPy stand-in (tests/fake_cupy.py), every call into the library recorded,
and what they called is held to what the library has, derived, not listed by hand:

  - every CUDA function of csrc/include/pytfm_cuda.h (a name ending in _cuda: each op's twin
    and the functions of no C op), and every twin the op registry (tests/ops_registry.py)
    names, called at least once;
  - each function that takes a precision, in every pytfm_precision (PYTFM_PRECISION_*) but
    INT8 (8-bit weights: a model's precision, on the CPU only; the twins refuse it);
  - the tensor-core attention (_ex, in BF16 and TF32) at each head dim cuda/attention_tc.cu's
    launchers take (their `case D:`), the grouped-query functions with a group or a window
    (the dK/dV pass's grouped instance);
  - each function with trans_a and trans_b in each of the four layouts, in each precision.

A kernel added to the library without a call in the script fails here. The script's one large
product (CONVERT_FIRST, where the BF16 product rounds its operands into BF16 copies first) is
made small here: the emulator runs every GPU thread on the CPU.
"""

import importlib.util
import os
import re
from collections import defaultdict

import pytest

import fake_cupy
import ops_registry
from cuda_emu import CUDA
from helpers import ROOT

pytestmark = pytest.mark.skipif(not os.path.isdir(CUDA), reason="needs the source checkout")

SCRIPT = os.path.join(ROOT, "scripts", "cuda_small_run.py")
CUDA_HEADER = os.path.join(ROOT, "csrc", "include", "pytfm_cuda.h")
ATTENTION_TC = os.path.join(CUDA, "attention_tc.cu")


def cuda_functions():
    """{name: [its parameters' names]} of the functions of pytfm_cuda.h ending in _cuda (the
    pytfm_cuda_* ones are the device's housekeeping: device count, synchronisation, workspaces,
    AdamW's scalars computed on the host)"""
    with open(CUDA_HEADER, encoding="utf-8") as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    found = {}
    for name, params in re.findall(r"\b(pytfm_\w+_cuda)\s*\(([^)]*)\)", text):
        found[name] = [re.findall(r"\w+", p)[-1] for p in params.split(",")]
    assert "pytfm_attention_forward_ex_cuda" in found, "the header's declarations were not read"
    return found


def registry_twins():
    """the CUDA functions the op registry names: each op's twin, and pytfm_cuda.h's functions
    of no C op"""
    twins = {op.twin for op in ops_registry.OPS if op.cuda}
    extra = {n for n in ops_registry.NON_OPS["pytfm_cuda.h"] if n.endswith("_cuda")}
    return twins | extra


def tensor_core_head_dims():
    """the head dims cuda/attention_tc.cu's launchers take (each its own kernels)"""
    with open(ATTENTION_TC, encoding="utf-8") as f:
        dims = {int(d) for d in re.findall(r"case (\d+): return tc_\w+_launch", f.read())}
    assert dims, "no `case D: return tc_..._launch` in cuda/attention_tc.cu"
    return dims


class Recorder:
    """pytfm._core.lib with every call of a _cuda function recorded: (name, arguments)"""

    def __init__(self, lib):
        self.lib, self.calls = lib, []

    def __getattr__(self, name):
        fn = getattr(self.lib, name)
        if not (name.endswith("_cuda") and callable(fn)):
            return fn

        def call(*args):
            self.calls.append((name, args))
            return fn(*args)

        return call


def load_script(path=SCRIPT):
    spec = importlib.util.spec_from_file_location("cuda_small_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_kernels(monkeypatch, emu, path=SCRIPT):
    """the script's kernel sections under the emulator -> {name: [{parameter: argument}]} of
    every _cuda call they made (integer arguments only)"""
    import pytfm._core

    fake_cupy.install(monkeypatch, emu, strict=True)
    recorder = Recorder(pytfm._core.lib)
    monkeypatch.setattr(pytfm._core, "lib", recorder)
    script = load_script(path)
    monkeypatch.setattr(script, "CONVERT_FIRST", (40, 33, 17))
    for section in script.KERNELS:
        section()
    params = cuda_functions()
    calls = defaultdict(list)
    for name, args in recorder.calls:
        names = params.get(name, [])
        calls[name].append({p: a for p, a in zip(names, args) if isinstance(a, int)})
    return calls


def missing(calls, lib):
    """what the library has and calls left out, one line each"""
    # every precision a product takes (INT8 is a model's, on the CPU: the twins refuse it)
    precisions = {getattr(lib, n) for n in dir(lib) if n.startswith("PYTFM_PRECISION_")} - {
        lib.PYTFM_PRECISION_INT8}
    tensor = precisions - {lib.PYTFM_PRECISION_FP32}
    dims = tensor_core_head_dims()
    out = []
    for name, params in sorted(cuda_functions().items()):
        made = calls.get(name, [])
        if not made:
            out.append(f"{name}: never called")
            continue
        if "precision" in params:
            for want in sorted(precisions - {c["precision"] for c in made}):
                out.append(f"{name}: never called in precision {want}")
        if "trans_a" in params and "trans_b" in params:
            by = {c.get("precision") for c in made}
            for precision in by:
                seen = {(c["trans_a"], c["trans_b"]) for c in made
                        if c.get("precision") == precision}
                for ta, tb in sorted({(0, 0), (0, 1), (1, 0), (1, 1)} - seen):
                    out.append(f"{name}: precision {precision}, never trans_a={ta} trans_b={tb}")
        if re.fullmatch(r"pytfm_attention_\w*(forward|backward)_ex_cuda", name):
            grouped = "Hkv" in params
            for precision in sorted(tensor):
                seen = {c["D"] for c in made if c["precision"] == precision and (
                    not grouped or c["Hkv"] != c["H"] or c["window"] > 0)}
                for D in sorted(dims - seen):
                    out.append(f"{name}: precision {precision}, never at D = {D}"
                               f"{' with a group or a window' if grouped else ''}")
    return out


def test_the_header_and_the_registry_name_the_same_cuda_functions():
    """The coverage below is the header's; the registry's twins must all be there too (a twin
    the registry names but the header lacks would go unchecked)."""
    assert registry_twins() <= set(cuda_functions()), registry_twins() - set(cuda_functions())


def test_the_kernel_sections_call_every_cuda_kernel(monkeypatch, emu):
    import pytfm._core

    calls = run_kernels(monkeypatch, emu)
    left_out = missing(calls, pytfm._core.lib)
    assert not left_out, "scripts/cuda_small_run.py leaves out:\n" + "\n".join(left_out)
    assert registry_twins() <= set(calls)


def test_a_function_left_out_is_named(monkeypatch, emu):
    """The check itself: calls without one function, without a precision, a layout or a head
    dim are each named."""
    import pytfm._core

    lib = pytfm._core.lib
    every = [dict(precision=p, trans_a=a, trans_b=b, D=d, H=2, Hkv=1, window=0)
             for p in (0, 1, 2) for a in (0, 1) for b in (0, 1) for d in tensor_core_head_dims()]
    calls = {name: [{k: v for k, v in c.items() if k in params} for c in every]
             for name, params in cuda_functions().items()}
    assert missing(calls, lib) == []
    del calls["pytfm_softmax_forward_cuda"]
    calls["pytfm_sgemm_ex_cuda"] = [c for c in calls["pytfm_sgemm_ex_cuda"]
                                    if c["precision"] != lib.PYTFM_PRECISION_TF32]
    calls["pytfm_gemm_bf16_cuda"] = [c for c in calls["pytfm_gemm_bf16_cuda"]
                                     if (c["trans_a"], c["trans_b"]) != (1, 0)]
    calls["pytfm_attention_backward_ex_cuda"] = [
        c for c in calls["pytfm_attention_backward_ex_cuda"] if c["D"] != 64]
    calls["pytfm_attention_gqa_forward_ex_cuda"] = [
        dict(c, Hkv=2) for c in calls["pytfm_attention_gqa_forward_ex_cuda"]]
    got = missing(calls, lib)
    assert "pytfm_softmax_forward_cuda: never called" in got
    assert f"pytfm_sgemm_ex_cuda: never called in precision {lib.PYTFM_PRECISION_TF32}" in got
    assert "pytfm_gemm_bf16_cuda: precision None, never trans_a=1 trans_b=0" in got
    assert (f"pytfm_attention_backward_ex_cuda: precision {lib.PYTFM_PRECISION_BF16}, never "
            "at D = 64") in got
    assert any(g.startswith("pytfm_attention_gqa_forward_ex_cuda") and "with a group" in g
               for g in got)
