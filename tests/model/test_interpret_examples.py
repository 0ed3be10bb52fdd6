"""examples/attention_maps.py, induction.py and scaling.py.

A bad flag or checkpoint stops each with argparse's usage and one line naming the problem, exit
status 2, before any work (checked in-process: fast). Run as a user runs them, on tiny
configurations, each writes a valid PNG; these picture tests need matplotlib (pip install
".[plot]"): they fail, saying so, where the environment variable CI is set, and skip elsewhere.
Without matplotlib each script still prints its numbers, says how to get the picture and exits
with status 0 (checked with an import of matplotlib made to fail, wherever it is installed)."""

import dataclasses
import importlib.util
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT, subprocess_env
from pytfm import checkpoint
from pytfm.nn import GPT, GPTConfig

EXAMPLES = os.path.join(ROOT, "examples")
pytestmark = pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="needs the checkout")
CONFIG = GPTConfig(d_model=32, n_layer=2, n_head=2, max_seq=32)


def load_example(name):
    """The example script as a module (examples/ on sys.path: attention_maps imports sample)."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_usage_error(monkeypatch, capsys, script, argv, *words):
    """main(argv) exits with status 2; stderr is the usage, then one 'script.py: error: ...'
    line holding every one of words; nothing on stdout (no work done)."""
    monkeypatch.setattr(sys, "argv", [f"{script}.py"])  # argparse names the program after it
    with pytest.raises(SystemExit) as exit_:
        load_example(script).main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, (out, err)
    lines = err.splitlines()
    assert lines and lines[-1].startswith(f"{script}.py: error: "), err
    assert all(line.startswith(("usage:", " ")) for line in lines[:-1]), err
    for word in words:
        assert word in lines[-1], (word, lines[-1])
    assert out == "", out


def run(script, *args, cwd, block_matplotlib=False):
    """The script in a fresh interpreter, from cwd; block_matplotlib makes `import matplotlib`
    fail there, as if it were not installed."""
    path = [ROOT]
    if block_matplotlib:
        blocker = os.path.join(cwd, "no-matplotlib")
        os.makedirs(os.path.join(blocker, "matplotlib"), exist_ok=True)
        with open(os.path.join(blocker, "matplotlib", "__init__.py"), "w") as f:
            f.write("raise ImportError('matplotlib is blocked for this test')\n")
        path.insert(0, blocker)
    env = subprocess_env(*path)
    command = [sys.executable, os.path.join(EXAMPLES, f"{script}.py"), *map(str, args)]
    r = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


def need_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("matplotlib is not installed, and CI must run the picture tests: "
                        "install pytfm with its plot extra, pip install '.[plot]'")
        pytest.skip("the picture tests need matplotlib: pip install '.[plot]'")


def assert_png(path):
    """A whole PNG: the signature, an IHDR chunk first, and matplotlib reads back an image of
    the size IHDR states that is not all one colour. -> (width, height)"""
    import matplotlib.image

    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head[:8]
    assert head[12:16] == b"IHDR", head[12:16]
    width, height = struct.unpack(">II", head[16:24])
    assert 200 <= width <= 8000 and 200 <= height <= 8000, (width, height)
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (height, width)
    assert image[..., :3].std() > 0.01  # something is drawn
    return width, height


@pytest.fixture
def files(tmp_path):
    """Checkpoints: run (CONFIG), small (vocabulary 50), long (context 8192: its maps for a
    5000-byte text are too large), bad (truncated); a folder; a plain file."""
    for name, cfg in (("run", CONFIG), ("small", dataclasses.replace(CONFIG, vocab=50)),
                      ("long", GPTConfig(d_model=16, n_layer=2, n_head=2, max_seq=8192))):
        checkpoint.save(str(tmp_path / f"{name}.safetensors"), GPT(cfg))
    (tmp_path / "bad.safetensors").write_bytes((tmp_path / "run.safetensors").read_bytes()[:100])
    (tmp_path / "folder").mkdir()
    (tmp_path / "plain").write_text("a file, not a folder\n")
    return tmp_path


ATTENTION_CASES = [
    (["missing.safetensors", "--text", "hi"], ["checkpoint", "no file missing.safetensors"]),
    (["folder", "--text", "hi"], ["checkpoint", "folder is a folder"]),
    (["bad.safetensors", "--text", "hi"], ["checkpoint", "truncated?"]),
    (["plain", "--text", "hi"], ["checkpoint", "plain"]),
    (["small.safetensors", "--text", "hi"], ["checkpoint", "vocabulary of 50 tokens", "256"]),
    (["run.safetensors"], ["the following arguments are required: --text"]),
    (["run.safetensors", "--text", ""], ["--text must not be empty"]),
    (["run.safetensors", "--text", "x" * 33],
     ["--text is 33 bytes, longer than the model's context of 32"]),
    (["long.safetensors", "--text", "x" * 5000],
     ["--text", "T = 5000 take 381 MiB", "at most T = 4096"]),
    (["run.safetensors", "--text", "hi", "--out", "nowhere/maps.png"],
     ["--out", "no folder nowhere"]),
    (["run.safetensors", "--text", "hi", "--out", "folder"], ["--out", "folder is a folder"]),
    (["run.safetensors", "--text", "hi", "--out", ""], ["--out", "the path is empty"]),
    (["run.safetensors", "--text", "hi", "--npy", "nowhere/maps.npy"],
     ["--npy", "no folder nowhere"]),
]


@pytest.mark.parametrize("argv,words", ATTENTION_CASES,
                         ids=[" ".join(c[0])[:40] for c in ATTENTION_CASES])
def test_attention_maps_rejects_a_bad_flag_in_one_line(files, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(files)
    assert_usage_error(monkeypatch, capsys, "attention_maps", argv, *words)
    assert not (files / "out").exists()  # the default's folder is made only to write in


INDUCTION_CASES = [
    (["--steps", "0"], ["--steps must be >= 1, got 0"]),
    (["--eval-every", "0"], ["--eval-every must be >= 1, got 0"]),
    (["--batch", "0"], ["--batch must be >= 1, got 0"]),
    (["--seed", "-1"], ["--seed must be >= 0, got -1"]),
    (["--lr", "nan"], ["--lr must be finite and > 0, got nan"]),
    (["--out", "plain"], ["--out", "plain exists and is not a folder"]),
    (["--out", ""], ["--out", "the path is empty"]),
]

SCALING_CASES = [
    (["--sizes", "32x2"], ["--sizes", "'32x2': not DxLxH", "64x4x4"]),
    (["--sizes", "32x2x3,8x1x1,16x1x1"], ["--sizes", "d_model (32) must be a multiple of n_head"]),
    (["--sizes", "20x2x4,8x1x1,16x1x1"], ["--sizes", "rope needs an even head dim, got 5"]),
    (["--sizes", "8x1x1,16x1x2"], ["--sizes", "at least 3 sizes, got 2"]),
    (["--budgets", "1e12,-1"], ["--budgets must be finite and > 0"]),
    (["--budgets", "lots"], ["--budgets", "not a comma-separated list of numbers"]),
    (["--context", "1"], ["--context must be >= 2, got 1"]),
    (["--val-tokens", "-1"], ["--val-tokens must be >= 0, got -1"]),
    (["--lr", "0"], ["--lr must be finite and > 0, got 0.0"]),
    (["--out", "plain"], ["--out", "plain exists and is not a folder"]),
]


@pytest.mark.parametrize("script,argv,words",
                         [("induction", *c) for c in INDUCTION_CASES]
                         + [("scaling", *c) for c in SCALING_CASES],
                         ids=[f"induction {' '.join(c[0])}" for c in INDUCTION_CASES]
                         + [f"scaling {' '.join(c[0])}" for c in SCALING_CASES])
def test_the_experiments_reject_a_bad_flag_in_one_line(files, monkeypatch, capsys, script, argv,
                                                       words):
    monkeypatch.chdir(files)
    assert_usage_error(monkeypatch, capsys, script, ["--quick", *argv], *words)
    assert not (files / "out").exists()  # a bad flag is found before --out is created


def test_attention_maps_prints_every_head_s_scores_and_saves_the_weights(files):
    """The --npy file holds GPT.attention_probs of the text, [n_layer, n_head, T, T]."""
    text = "abcabcab\n"
    out = run("attention_maps", "run.safetensors", "--text", text, "--npy", "maps.npy",
              cwd=files, block_matplotlib=True)
    lines = [line for line in out.splitlines() if line.startswith("layer ")]
    assert len(lines) == 4 and lines[3].startswith("layer 1 head 1: mean distance")
    assert all("induction" in line and "previous-token" in line for line in lines)
    model, _, _ = checkpoint.load(str(files / "run.safetensors"))
    tokens = np.frombuffer(text.encode(), np.uint8).astype(np.int64)[None, :]
    want = model.attention_probs(tokens)
    saved = np.load(files / "maps.npy")
    assert saved.shape == (2, 2, 9, 9) and saved.dtype == np.float32
    np.testing.assert_array_equal(saved, np.stack([want[0][0], want[1][0]]))
    assert "matplotlib is not installed" in out and not (files / "out").exists()


def test_attention_maps_draws_a_png(files):
    need_matplotlib()
    out = run("attention_maps", "run.safetensors", "--text", "def f(x):\n\treturn f(x)",
              "--out", "maps.png", cwd=files)
    assert "wrote maps.png" in out
    assert_png(files / "maps.png")


def test_attention_maps_writes_into_out_by_default(files):
    """Beside train_tiny.py's files, as the other examples write: out/attention.png, out/ made
    when missing; not the current folder."""
    need_matplotlib()
    out = run("attention_maps", "run.safetensors", "--text", "abcab", cwd=files)
    assert f"wrote {os.path.join('out', 'attention.png')}" in out
    assert_png(files / "out" / "attention.png")
    assert not (files / "attention.png").exists()
    run("attention_maps", "run.safetensors", "--text", "abcab", cwd=files)  # out/ there now


def test_induction_quick_run_writes_its_numbers_and_png(tmp_path):
    need_matplotlib()
    out = run("induction", "--quick", "--out", "ind", cwd=tmp_path)
    assert "pos=rope:" in out and "pos=none:" in out and "uniform attention" in out
    rows = (tmp_path / "ind" / "induction.csv").read_text().splitlines()
    assert rows[0].startswith("pos,step,loss_second_copy,loss_rest,induction_l1_h0")
    assert len(rows) == 1 + 2 * 4  # steps 0, 10, 20, 30 for each pos
    assert_png(tmp_path / "ind" / "induction.png")


def test_scaling_quick_sweep_writes_a_png_and_resumes(tmp_path):
    need_matplotlib()
    out = run("scaling", "--quick", "--out", "sw", cwd=tmp_path)
    results = tmp_path / "sw" / "scaling.jsonl"
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(records) == 6 and "skipped" not in out
    assert {r["budget"] for r in records} == {2e8, 6e8}
    for r in records:  # D = C / 6N within one step's tokens
        assert abs(r["tokens"] - r["budget"] / (6 * r["params"])) <= 8 * 16
    assert "isoFLOP parabolas" in out and "loss surface" in out
    assert_png(tmp_path / "sw" / "scaling.png")

    # a rerun trains nothing; a killed run (the last record gone, half a line left) is redone
    (tmp_path / "sw" / "scaling.png").unlink()
    out = run("scaling", "--quick", "--out", "sw", cwd=tmp_path)
    assert out.count("skipped") == 6
    assert_png(tmp_path / "sw" / "scaling.png")
    lines = results.read_text().splitlines()
    results.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "scaling.py"), "--quick", "--out",
                        "sw"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env=subprocess_env(ROOT))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("skipped") == 5 and "line 6 is not a whole record" in r.stderr
    redone = json.loads(results.read_text().splitlines()[-1])
    assert {k: v for k, v in redone.items() if k != "seconds"} == \
        {k: v for k, v in records[-1].items() if k != "seconds"}  # the same run, the same loss


def test_without_matplotlib_the_experiments_print_their_numbers_and_say_how(tmp_path):
    out = run("induction", "--quick", "--out", "ind", cwd=tmp_path, block_matplotlib=True)
    assert "pos=none:" in out and "pip install matplotlib" in out
    assert (tmp_path / "ind" / "induction.csv").exists()
    assert not (tmp_path / "ind" / "induction.png").exists()
    out = run("scaling", "--quick", "--out", "sw", cwd=tmp_path, block_matplotlib=True)
    assert "validation loss" in out and "pip install matplotlib" in out
    assert not (tmp_path / "sw" / "scaling.png").exists()
