"""dev/mutate.py's planted bugs stay current: each names text that its file still holds, so that
`python dev/mutate.py` plants every bug instead of reporting STALE for the ones whose code moved.
(It plants each at the text's first occurrence; running the list, which builds and tests a copy
of the tree per bug, is a separate, slow job.)"""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mutations():
    path = os.path.join(ROOT, "dev", "mutate.py")
    if not os.path.exists(path):
        return {}
    spec = importlib.util.spec_from_file_location("pytfm_dev_mutate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTATIONS


MUTATIONS = mutations()


@pytest.mark.skipif(not MUTATIONS, reason="needs the source checkout (dev/mutate.py)")
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_planted_bug_names_text_its_file_holds(name):
    path, old, new, tests = MUTATIONS[name]
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    assert old in text, f"{name}: {path} no longer holds the text it replaces: update dev/mutate.py"
    assert old != new, f"{name}: the replacement changes nothing"
    for t in tests:
        assert os.path.exists(os.path.join(ROOT, t.split("::")[0])), f"{name}: no test file {t}"
