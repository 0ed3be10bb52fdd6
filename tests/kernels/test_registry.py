"""tests/ops_registry.py against the public headers: every function they declare is an op
there or one of its NON_OPS, each op's C calls match its declaration, and each op says where
each of the cross-cutting tests finds what it needs (see CONTRIBUTING.md, "Adding an op")."""

import os
import re

import pytest

import ops_registry
from helpers import INCLUDE, ROOT, header_text
from ops_registry import NON_OPS, OPS, Check, Fast, Scratch
from pytfm import ops
from pytfm import reference as ref

WHERE = "tests/ops_registry.py (CONTRIBUTING.md says how)"


def declarations(text):
    """{name: [parameter declarations]} of every function declared in `text`."""
    found = {}
    for m in re.finditer(r"PYTFM_API\s+[\w\s\*]*?\b(pytfm_\w+)\s*\(([^)]*)\)\s*;", text):
        params = [p.strip() for p in m.group(2).split(",")]
        found[m.group(1)] = [] if params == ["void"] else params
    return found


DECLARED = declarations(header_text())


def header_of(name):
    for header in ("pytfm_core.h", "pytfm_kernels.h", "pytfm_model.h", "pytfm_cuda.h"):
        with open(os.path.join(INCLUDE, header), encoding="utf-8") as f:
            if re.search(rf"\b{name}\s*\(", f.read()):
                return header
    return "a public header"


def test_every_declared_function_is_an_op_or_listed_as_none():
    ours = {op.c for op in OPS} | {op.twin for op in OPS if op.cuda}
    ours |= {name for names in NON_OPS.values() for name in names}
    missing = sorted(set(DECLARED) - ours)
    assert not missing, "\n".join(
        f"{name} is declared in csrc/include/{header_of(name)} but not registered: add an Op "
        f"for {name.removeprefix('pytfm_').removesuffix('_cuda')} to OPS in {WHERE}, or, if it "
        "is no kernel, its name to NON_OPS there" for name in missing)
    gone = sorted(ours - set(DECLARED))
    assert not gone, f"registered in {WHERE} but declared in no public header: {gone}"


def test_non_ops_are_in_the_header_they_are_listed_under():
    for header, names in NON_OPS.items():
        with open(os.path.join(INCLUDE, header), encoding="utf-8") as f:
            text = f.read()
        for name in names:
            assert re.search(rf"\b{name}\s*\(", text), f"{name} is not declared in {header}"


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_the_op_has_its_wrapper_reference_and_twin(op):
    assert op.c in DECLARED, f"{op.c} is not declared in pytfm_kernels.h"
    with open(os.path.join(INCLUDE, "pytfm_kernels.h"), encoding="utf-8") as f:
        assert re.search(rf"\b{op.c}\s*\(", f.read()), f"{op.c} is not in pytfm_kernels.h"
    assert hasattr(ops, op.name) == op.wrapper, f"pytfm.ops.{op.name}: wrapper={op.wrapper}"
    assert hasattr(ref, op.name) == op.reference, \
        f"pytfm.reference.{op.name}: reference={op.reference} in {WHERE}"
    if op.cuda:
        assert DECLARED.get(op.twin) == DECLARED[op.c] + ["void *stream"], \
            f"{op.twin} must take {op.c}'s arguments and a void *stream last"
    else:
        assert op.c + "_cuda" not in DECLARED, f"{op.c}_cuda exists: cuda=True in {WHERE}"


def _kind(param):
    """F, D, I, H, B (a float, double, int64_t, uint16_t or int8_t buffer), "p" another
    pointer, or the scalar type"""
    if "*" in param:
        base = param.replace("const", "").split("*")[0].strip()
        return {"float": "F", "double": "D", "int64_t": "I", "uint16_t": "H",
                "int8_t": "B"}.get(base, "p")
    return param.split()[0]


def _matches(token, kind):
    """A template token (a limits or an exact one) fits a parameter of this kind."""
    buffer = token.partition(":")[0]
    if kind in ("F", "D", "I", "H", "B"):
        return buffer in (kind, "N")
    if kind == "p":
        return buffer == "N"
    if buffer in ("F", "D", "I", "H", "B", "N"):
        return False
    is_float = re.fullmatch(r"-?(\d+\.\d*|\d+(\.\d*)?e-?\d+)", token) is not None
    return is_float == (kind in ("float", "double"))


def _calls(op):
    yield from (t.format(*op.limits.sizes[0]) for t in op.limits.calls)
    yield from op.exact


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_the_c_call_templates_match_the_declaration(op):
    kinds = [_kind(p) for p in DECLARED[op.c]]
    assert op.limits.calls and op.limits.sizes and op.exact, f"{op.name}: limits and exact calls"
    for template in _calls(op):
        toks = template.split()
        assert len(toks) == len(kinds), \
            f"{op.name}: {template!r} has {len(toks)} arguments, {op.c} takes {len(kinds)}"
        for i, (token, kind) in enumerate(zip(toks, kinds)):
            assert _matches(token, kind), \
                f"{op.name}: argument {i} of {template!r} is {token!r}, {op.c} takes {kind}"
    for template in op.limits.calls:
        n = len(re.findall(r"\{\d+\}", template))
        assert all(len(sizes) == n for sizes in op.limits.sizes), op.name


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_the_op_says_where_each_test_finds_it(op):
    if op.wrapper and op.cuda:
        assert isinstance(op.check, Check) and op.check.emu, \
            f"{op.name}: a Check, with sizes for its CUDA twin (emu), in {WHERE}"
    if op.check is None:
        assert op.tested_in, f"{op.name}: no Check, so tested_in must name its tests"
    else:
        c = op.check
        assert len(c.outputs) == len(c.run(ops_registry.fresh(c.make(**c.emu[0])))) \
            if c.emu else True
    assert isinstance(op.fast, str) and op.fast or op.fast and all(
        isinstance(f, Fast) for f in op.fast), \
        f"{op.name}: fast cases, or a sentence saying why there are none"
    if op.wrapper:
        assert op.bad, f"{op.name}: bad-input cases for tests/kernels/test_errors.py"
        ids = [bad.name() for bad in op.bad]
        assert len(ids) == len(set(ids)), f"{op.name}: two bad-input cases named alike: {ids}"


def kernel_entries():
    """{function: its entry} of pytfm_kernels.h: the comment before each declaration."""
    with open(os.path.join(INCLUDE, "pytfm_kernels.h"), encoding="utf-8") as f:
        text = f.read().split("PYTFM_CDEF_BEGIN */", 1)[1]
    entries = {}
    for chunk in text.split(";"):
        m = re.search(r"PYTFM_API\s+pytfm_status\s+(pytfm_\w+)\s*\(", chunk)
        if m:
            entries[m.group(1)] = chunk[:m.start()]
    return entries


def test_every_op_whose_entry_says_scratch_has_its_out_of_memory_case():
    entries = kernel_entries()
    assert len(entries) == len(OPS)
    for op in OPS:
        if "Scratch" in entries[op.c]:
            assert isinstance(op.scratch, (Scratch, str)) and op.scratch, \
                (f"{op.c}'s entry in pytfm_kernels.h says it allocates scratch: give its op in "
                 f"{WHERE} a Scratch case (tests/kernels/test_memory.py), or a sentence saying "
                 "why its running out is not tested")


def test_the_named_tests_exist():
    missing = []
    for op in OPS:
        for node in op.tested_in:
            path, _, name = node.partition("::")
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                if not re.search(rf"^def {name}\(", f.read(), re.M):
                    missing.append(f"{op.name}: {node}")
    assert not missing, f"tested_in names tests that do not exist: {missing}"


def test_the_generated_c_calls_cover_every_op():
    count, text = ops_registry.hostile_calls()
    assert count == sum(len(op.limits.calls) * len(op.limits.sizes) for op in OPS)
    exact = ops_registry.exact_calls()
    for op in OPS:
        assert f"{op.c}(" in text and f"{op.c}(" in exact, op.name
