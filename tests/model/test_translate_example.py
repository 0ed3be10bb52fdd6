"""examples/translate.py: its task (English number words -> German, units before tens), its
held-out split, bad flags, and a --quick run as a user runs it (a fresh interpreter: progress
lines, the greedy and beam accuracy lines, translations, the picture or the word that it was
skipped). The accuracy of the default run is not tested here (minutes): the example's
docstring gives it, and the run is its check."""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT, subprocess_env

EXAMPLES = os.path.join(ROOT, "examples")
pytestmark = pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="needs the checkout")


def load():
    spec = importlib.util.spec_from_file_location("translate", os.path.join(EXAMPLES,
                                                                            "translate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args, cwd, block_matplotlib=False):
    """The script in a fresh interpreter, from cwd (block_matplotlib: `import matplotlib`
    fails there) -> stdout; the exit status must be 0."""
    path = [ROOT]
    if block_matplotlib:
        blocker = os.path.join(cwd, "no-matplotlib", "matplotlib")
        os.makedirs(blocker, exist_ok=True)
        with open(os.path.join(blocker, "__init__.py"), "w") as f:
            f.write("raise ImportError('matplotlib is blocked for this test')\n")
        path.insert(0, os.path.dirname(blocker))
    command = [sys.executable, os.path.join(EXAMPLES, "translate.py"), *map(str, args)]
    r = subprocess.run(command, capture_output=True, text=True, cwd=cwd,
                       env=subprocess_env(*path), timeout=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


CASES = [
    (0, "zero", "null"),
    (1, "one", "eins"),
    (13, "thirteen", "dreizehn"),
    (21, "twenty one", "ein und zwanzig"),
    (42, "forty two", "zwei und vierzig"),
    (101, "one hundred one", "ein hundert eins"),
    (242, "two hundred forty two", "zwei hundert zwei und vierzig"),
    (1000, "one thousand", "ein tausend"),
    (71001, "seventy one thousand one", "ein und siebzig tausend eins"),
    (913060, "nine hundred thirteen thousand sixty", "neun hundert dreizehn tausend sechzig"),
    (999999, "nine hundred ninety nine thousand nine hundred ninety nine",
     "neun hundert neun und neunzig tausend neun hundert neun und neunzig"),
]


@pytest.mark.parametrize("n,en,de", CASES, ids=[str(c[0]) for c in CASES])
def test_the_task_writes_numbers_in_english_and_german(n, en, de):
    t = load()
    assert " ".join(t.english(n)) == en and " ".join(t.german(n)) == de


def test_every_number_is_in_the_vocabularies_and_fits_the_decoding_limit():
    t = load()
    for n in range(0, 10 ** 6, 37):
        assert all(w in t.SRC_ID for w in t.english(n))
        assert all(w in t.TGT_ID for w in t.german(n))
        assert len(t.german(n)) + 1 <= t.MAX_WORDS  # EOS too
    src, src_lens, tgt_in, tgt_out, tgt_lens = t.batch([5, 242042])
    assert src[0, 0] == t.SRC_ID["five"] and src[1, 6] == t.SRC_ID["two"]
    assert src_lens.tolist() == [1, 7] and tgt_lens.tolist() == [2, 10]
    assert tgt_in[1, 0] == t.TGT_ID[t.BOS] and tgt_out[1, 9] == t.TGT_ID[t.EOS]
    np.testing.assert_array_equal(tgt_in[1, 1:], tgt_out[1, :-1])


def test_training_never_draws_a_held_out_number():
    t = load()
    test = t.draw_numbers(np.random.default_rng(1), 300, digits=(2, 3))
    train = t.draw_numbers(np.random.default_rng(2), 3000, digits=(2, 3),
                           exclude=frozenset(test))
    assert len(set(test)) > 200 and not set(test) & set(train)


@pytest.mark.parametrize("argv,words", [
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--beam", "-1"], "--beam must be >= 1, got -1"),
    (["--d-model", "30"], "--d-model must be a multiple of the 4 heads, got 30"),
    (["--seed", "-2"], "--seed must be >= 0, got -2"),
    (["--plot", "nowhere/a.png"], "--plot: no folder nowhere"),
])
def test_a_bad_flag_stops_before_training(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_:
        load().main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and words in err.splitlines()[-1] and out == ""


def check_quick_output(out):
    steps = re.findall(r"^step +(\d+) +loss ([\d.]+) +lr ([\d.e+-]+) +([\d,]+) tokens/s$", out,
                       re.M)
    assert len(steps) == 20 and steps[-1][0] == "20", out
    assert re.search(r"^held-out exact match \(40 numbers", out, re.M), out
    assert re.search(r"^  greedy +\d+\.\d%$", out, re.M), out
    assert re.search(r"^  beam 4 +\d+\.\d%$", out, re.M), out
    shown = re.findall(r"^  (a held-out sentence|a mistake \(\d+ in all\)):$", out, re.M)
    assert shown[:3] == ["a held-out sentence"] * 3 and 3 <= len(shown) <= 6, out
    for label in ("source", "reference", "greedy", "beam"):
        assert len(re.findall(rf"^  {label:<11}(?! )", out, re.M)) == len(shown)
    t = load()
    test = t.draw_numbers(np.random.default_rng(12345), 40, digits=(3, 6))
    assert f"  source     {' '.join(t.english(test[0]))}\n" in out  # the held-out set's
    assert f"  reference  {' '.join(t.german(test[0]))}\n" in out


def test_quick_run_prints_progress_accuracy_translations_and_draws(tmp_path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("the picture needs matplotlib (the run without it is tested below)")
    out = run("--quick", cwd=tmp_path)
    check_quick_output(out)
    assert "wrote translate_attention.png" in out
    with open(tmp_path / "translate_attention.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_quick_run_without_matplotlib_says_it_skipped_the_picture(tmp_path):
    out = run("--quick", "--beam", "4", cwd=tmp_path, block_matplotlib=True)
    check_quick_output(out)
    assert "skipped the attention picture" in out
    assert not (tmp_path / "translate_attention.png").exists()
