"""dev/mutate.py's planted bugs stay current: each names a scope (a function, macro, struct or
class) that its file still defines and a text that occurs once in it, so that `python
dev/mutate.py` plants every bug instead of reporting STALE for the ones whose code changed.
(Running the list, which builds and tests a copy of the tree per bug, is a separate, slow job.)"""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mutate_module():
    path = os.path.join(ROOT, "dev", "mutate.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("pytfm_dev_mutate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MUTATE = mutate_module()
MUTATIONS = MUTATE.MUTATIONS if MUTATE else {}


@pytest.mark.skipif(not MUTATIONS, reason="needs the source checkout (dev/mutate.py)")
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_planted_bug_still_finds_its_place(name):
    path, where, old, new, tests = MUTATIONS[name]
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    try:
        planted = MUTATE.plant(path, text, where, old, new)
    except MUTATE.Stale as e:
        pytest.fail(f"{name}: {e}: update dev/mutate.py")
    assert planted != text, f"{name}: the replacement changes nothing"
    for t in tests:
        assert os.path.exists(os.path.join(ROOT, t.split("::")[0])), f"{name}: no test file {t}"


@pytest.mark.skipif(not MUTATIONS, reason="needs the source checkout (dev/mutate.py)")
def test_a_text_is_found_in_its_scope_only_and_whatever_its_spacing():
    c = ("static int f(int a) {\n    return a\n        + 1; // one\n}\n"
         "int g(int a) { if (f(a)) { return a + 1; } return 0; }\n")
    assert MUTATE.plant("x.c", c, "f", "a + 1;", "a + 2;") == c.replace("a\n        + 1;", "a + 2;")
    planted = MUTATE.plant("x.c", c, "g", "a + 1;", "a;")
    assert planted == c.replace("{ return a + 1; }", "{ return a; }")
    for where, old in (("h", "a + 1;"), ("f", "a + 3;"), (None, "a + 1;")):
        with pytest.raises(MUTATE.Stale):
            MUTATE.plant("x.c", c, where, old, "")
    py = ("class A:\n    def run(self):\n        return 1\n\n\n"
          "class B:\n    def run(self):\n        return 1\n")
    assert MUTATE.plant("x.py", py, "B.run", "return 1", "return 2").endswith("return 2\n")
    with pytest.raises(MUTATE.Stale):
        MUTATE.plant("x.py", py, "run", "return 1", "return 2")
