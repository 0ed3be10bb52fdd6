"""examples/train_tiny.py and examples/sample.py given bad flags and paths, run as a user runs
them: argparse's usage and one line naming the problem on stderr, exit status 2, no traceback,
and nothing trained (the checks come first, so each case takes about an interpreter start).
Then what a new user meets first: every example's --help shows the defaults and no flag is
taken by a prefix of its name; a trained model is not replaced unless asked; the save line
names its files and says when the plot is skipped; the sample starts from the text trained on;
`import pytfm` gives every public module."""

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import ROOT, subprocess_env
from pytfm import checkpoint, device
from pytfm.cli import train as cli
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW

EXAMPLES = os.path.join(ROOT, "examples")
pytestmark = pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="needs the checkout")

# the model every case asks for; --steps is large so that a case that got past the checks
# would train for minutes instead of passing
MODEL = ["--d-model", "32", "--n-layer", "2", "--n-head", "2", "--context", "32", "--batch", "4"]
CONFIG = GPTConfig(d_model=32, n_layer=2, n_head=2, max_seq=32)


def unprivileged():
    """A command prefix under which file permissions hold: none for a normal user; for root,
    setpriv dropping the capabilities that bypass them, where setpriv exists (else None)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]


def run(script, *args, cwd, prefix=(), path=()):
    """The example in a fresh interpreter, from cwd; path: folders put before the checkout on
    its PYTHONPATH."""
    env = subprocess_env(*path, ROOT)
    start = time.perf_counter()
    command = [*prefix, sys.executable, os.path.join(EXAMPLES, script), *map(str, args)]
    r = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    return r, time.perf_counter() - start


def assert_usage_error(script, r, seconds, *words):
    """Status 2; stderr is argparse's usage then exactly one 'script: error: ...' line holding
    every one of words; no traceback; no training."""
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert lines and lines[-1].startswith(f"{script}: error: "), r.stderr
    assert all(line.startswith(("usage:", " ")) for line in lines[:-1]), r.stderr
    for word in words:
        assert word in lines[-1], (word, lines[-1])
    assert "step " not in r.stdout and "saved" not in r.stdout, r.stdout
    assert seconds < 30, f"{seconds:.1f} s: the checks should come before any work"


@pytest.fixture
def files(tmp_path):
    """A working folder with a good corpus (not UTF-8 everywhere: bytes are tokens), an empty
    file, a 3-byte file, a plain file to put paths under, and a checkpoint of CONFIG at step 4
    with its optimizer state in run/."""
    rng = np.random.default_rng(0)
    text = b"def f(x):\n    return x + 1\n" * 150 + bytes(rng.integers(128, 256, 400).tolist())
    (tmp_path / "corpus.txt").write_bytes(text)  # 4,450 bytes: --context at most 2224
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "short.txt").write_bytes(b"hi\n")
    (tmp_path / "plain").write_text("a file, not a folder\n")
    (tmp_path / "run").mkdir()
    model = GPT(CONFIG)
    checkpoint.save(str(tmp_path / "run" / "model.safetensors"), model, 4,
                    AdamW(model.params, model.grads))
    (tmp_path / "bad").mkdir()
    good = (tmp_path / "run" / "model.safetensors").read_bytes()
    (tmp_path / "bad" / "model.safetensors").write_bytes(good[:100])  # truncated
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "model.safetensors").write_bytes(b"\x02" + b"\x00" * 7 + b"[]")
    (tmp_path / "small").mkdir()  # a good checkpoint, of a model whose tokens are not bytes
    checkpoint.save(str(tmp_path / "small" / "model.safetensors"),
                    GPT(dataclasses.replace(CONFIG, vocab=50)))
    return tmp_path


# (arguments after the good ones, words the error line must hold, whether --out may exist after)
TRAIN_CASES = [
    (["--text", "missing.txt"], ["--text", "no file missing.txt"], False),
    (["--text", "."], ["--text", "is a folder"], False),
    (["--text", "empty.txt"], ["--text", "empty.txt is empty"], False),
    (["--text", ""], ["--text", "empty"], False),
    (["--text", "short.txt"], ["--context 32 is too long", "3 bytes of short.txt"], False),
    (["--context", "5000"], ["--context 5000 is too long", "4,450 bytes", "2224 or less"], False),
    (["--context", "1"], ["--context must be >= 2, got 1"], False),
    (["--steps", "0"], ["--steps must be >= 1, got 0"], False),
    (["--steps", "-5"], ["--steps must be >= 1, got -5"], False),
    (["--steps", str(2**63)], ["--steps must be <= 2**63 - 1"], False),
    (["--steps", "many"], ["--steps", "invalid int value"], False),
    (["--batch", "0"], ["--batch must be >= 1, got 0"], False),
    (["--d-model", "0"], ["--d-model must be >= 1"], False),
    (["--n-layer", "0"], ["--n-layer must be >= 1"], False),
    (["--n-head", "0"], ["--n-head must be >= 1"], False),
    (["--n-head", "3"], ["--d-model (32) must be a multiple of --n-head (3)"], False),
    (["--d-model", "6", "--n-head", "2"], ["--pos rope needs an even head dim, got 3"], False),
    (["--pos", "sinusoidal", "--d-model", "33", "--n-head", "1"],
     ["--pos sinusoidal positions need an even --d-model, got 33"], False),
    (["--d-model", "100000"], ["--d-model 100000", "GiB", "memory"], False),
    (["--eval-every", "0"], ["--eval-every must be >= 1, got 0"], False),
    (["--log-every", "0"], ["--log-every must be >= 1, got 0"], False),
    (["--lr", "nan"], ["--lr must be finite and > 0, got nan"], False),
    (["--lr", "inf"], ["--lr must be finite and > 0, got inf"], False),
    (["--lr", "0"], ["--lr must be finite and > 0, got 0.0"], False),
    (["--warmup", "-1"], ["--warmup must be >= 0, got -1"], False),
    (["--sample-tokens", "-1"], ["--sample-tokens must be >= 0, got -1"], False),
    (["--seed", "-1"], ["--seed must be >= 0, got -1"], False),
    (["--seed", str(2**32)], ["--seed must be <= 4294967295"], False),
    (["--device", "cuda"], ["--device cuda: ", "(--device cpu trains on the CPU)"], False),
    (["--out", "plain"], ["--out", "plain exists and is not a folder"], True),
    (["--out", "plain/sub"], ["--out", "cannot create the folder plain/sub"], True),
    (["--out", ""], ["--out", "empty"], True),
    (["--resume", "--out", "fresh"], ["--resume", "no checkpoint at fresh/model.safetensors"],
     False),
    (["--resume", "--out", "bad"], ["--resume", "truncated?"], True),
    (["--resume", "--out", "junk"], ["--resume", "junk/model.safetensors", "not an object"],
     True),
    (["--resume", "--out", "run", "--d-model", "16", "--pos", "none"],
     ["--resume", "was trained with --d-model 32, --pos rope"], True),
    (["--resume", "--out", "run", "--steps", "3"],
     ["--steps 3 is below the step of the checkpoint to resume (4"], True),
    (["--out", "run"], ["--out: run/model.safetensors exists", "--resume", "--force"], True),
    (["--out", "run", "--resume", "--force"], ["--force: not allowed with argument --resume"],
     True),
    (["--step", "10"], ["unrecognized arguments: --step 10"], False),  # not --steps
    (["--prompt", ""], ["--prompt must not be empty"], False),
    (["--prompt", "x" * 32], ["--prompt is 32 bytes", "shorter than --context 32"], False),
    (["--lr", "1e308"], ["--lr must be at most 1", "got 1e+308"], False),
    (["--max-text-bytes", "1000"], ["--text: corpus.txt is 4,450 bytes, more than",
                                    "--max-text-bytes 1,000 allows"], False),
    (["--max-text-bytes", "1"], ["--max-text-bytes must be >= 2, got 1"], False),
    (["--collective-timeout", "0"], ["--collective-timeout must be finite and > 0"], False),
    (["--collective-timeout", "inf"], ["--collective-timeout must be finite and > 0"], False),
]


@pytest.mark.parametrize("more,words,out_may_exist", TRAIN_CASES,
                         ids=[" ".join(c[0])[:40] for c in TRAIN_CASES])
def test_train_tiny_rejects_a_bad_flag_in_one_line(files, more, words, out_may_exist):
    if "cuda" in more and device.cuda_problem() is None:
        pytest.skip("the GPU can be used here: --device cuda is no error")
    r, seconds = run("train_tiny.py", "--text", "corpus.txt", "--out", "out", *MODEL,
                     "--steps", "100000", *more, cwd=files)
    assert_usage_error("train_tiny.py", r, seconds, *words)
    out = "out"  # the folder the case names last
    for name, value in zip(more, more[1:]):
        out = value if name == "--out" else out
    if not out_may_exist:  # a flag's problem is found before --out is created
        assert not (files / out).exists()


def test_train_tiny_reports_a_text_it_cannot_read(files):
    # nobody, root included, can open a socket as a file
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(files / "socket"))
        r, seconds = run("train_tiny.py", "--text", "socket", *MODEL, cwd=files)
    finally:
        sock.close()
    assert_usage_error("train_tiny.py", r, seconds, "--text", "cannot read socket")
    prefix = unprivileged()
    if prefix is not None:  # and a file without read permission
        (files / "secret.txt").write_bytes(b"x" * 1000)
        (files / "secret.txt").chmod(0)
        r, seconds = run("train_tiny.py", "--text", "secret.txt", *MODEL, cwd=files,
                         prefix=prefix)
        assert_usage_error("train_tiny.py", r, seconds, "--text", "cannot read secret.txt",
                           "Permission denied")


def test_train_tiny_refuses_an_out_it_cannot_write_before_training(files):
    # a path under a regular file stops everyone, root included
    r, seconds = run("train_tiny.py", "--text", "corpus.txt", "--out", "plain/out", *MODEL,
                     "--steps", "100000", cwd=files)
    assert_usage_error("train_tiny.py", r, seconds, "--out", "cannot create the folder plain/out",
                       "Not a directory")
    prefix = unprivileged()
    if prefix is None:  # root without setpriv: chmod would not stop it; the case above stands
        return
    ro = files / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for out, words in ((ro, [f"--out: cannot write in {ro}", "Permission denied"]),
                           (ro / "sub", ["--out: cannot create the folder", "Permission denied"])):
            r, seconds = run("train_tiny.py", "--text", "corpus.txt", "--out", out, *MODEL,
                             "--steps", "100000", cwd=files, prefix=prefix)
            assert_usage_error("train_tiny.py", r, seconds, *words)
        assert list(ro.iterdir()) == []  # the write probe left nothing behind
    finally:
        ro.chmod(0o755)


def test_train_tiny_refuses_an_out_whose_files_it_cannot_replace(files):
    (files / "out" / "model.safetensors").mkdir(parents=True)
    r, seconds = run("train_tiny.py", "--text", "corpus.txt", "--out", "out", *MODEL, cwd=files)
    assert_usage_error("train_tiny.py", r, seconds, "--out", "model.safetensors is a folder")


def test_train_tiny_accepts_what_the_checks_let_through(files):
    """The control: the good flags train, on a text that is not all UTF-8, with the smallest
    context (a 1-byte prompt for the sample)."""
    r, _ = run("train_tiny.py", "--text", "corpus.txt", "--out", "ok", *MODEL, "--steps", "2",
               "--context", "2", "--eval-every", "1", "--sample-tokens", "3", cwd=files)
    assert r.returncode == 0, r.stderr
    assert "step     2/2" in r.stdout and "sample" in r.stdout
    r, _ = run("train_tiny.py", "--text", "corpus.txt", "--out", "run", *MODEL, "--steps", "5",
               "--resume", "--sample-tokens", "0", cwd=files)
    assert r.returncode == 0, r.stderr
    assert "resumed" in r.stdout and "sample" not in r.stdout


SAMPLE_CASES = [
    (["missing.safetensors"], ["checkpoint", "no file missing.safetensors"]),
    (["run"], ["checkpoint", "run is a folder", "did you mean run/model.safetensors?"]),
    (["bad/model.safetensors"], ["checkpoint", "truncated?"]),
    (["junk/model.safetensors"], ["checkpoint", "not an object"]),
    (["corpus.txt"], ["checkpoint", "corpus.txt"]),
    (["small/model.safetensors"], ["checkpoint", "vocabulary of 50 tokens", "256 bytes"]),
    (["run/model.safetensors", "--prompt", ""], ["--prompt must not be empty"]),
    (["run/model.safetensors", "--prompt", "x" * 40],
     ["--prompt is 40 bytes, longer than the model's context of 32"]),
    (["run/model.safetensors", "--tokens", "-1"], ["--tokens must be >= 0, got -1"]),
    (["run/model.safetensors", "--tokens", "ten"], ["--tokens", "invalid int value"]),
    (["run/model.safetensors", "--temperature", "nan"], ["--temperature must be finite"]),
    (["run/model.safetensors", "--temperature", "-1"], ["--temperature", ">= 0", "-1.0"]),
    (["run/model.safetensors", "--temperature", "inf"], ["--temperature must be finite"]),
    (["run/model.safetensors", "--top-k", "-1"], ["--top-k must be >= 0"]),
    (["run/model.safetensors", "--seed", "-1"], ["--seed must be in [0, 4294967295]"]),
]


@pytest.mark.parametrize("args,words", SAMPLE_CASES,
                         ids=[" ".join(c[0])[:40] for c in SAMPLE_CASES])
def test_sample_rejects_a_bad_flag_or_checkpoint_in_one_line(files, args, words):
    r, seconds = run("sample.py", *args, cwd=files)
    assert_usage_error("sample.py", r, seconds, *words)


def test_sample_accepts_the_edges(files):
    r, _ = run("sample.py", "run/model.safetensors", "--prompt", "x" * 32, "--tokens", "5",
               cwd=files)  # a prompt filling the context: no new token, and a note saying so
    assert r.returncode == 0, r.stderr
    assert r.stdout == "x" * 32 + "\n"
    assert "--tokens 5 cut to 0" in r.stderr
    r, _ = run("sample.py", "run/model.safetensors", "--prompt", "def ", "--tokens", "4",
               "--temperature", "0", "--top-k", str(2**70), cwd=files)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def ") and "note" not in r.stderr


def test_sample_shows_the_checkpoint_reader_s_own_message(files):
    """A file that is not a checkpoint at all (this repository's README): the usage line holds
    what pytfm.checkpoint.load says about it, whatever words the reader chooses."""
    readme = os.path.join(ROOT, "README.md")
    with pytest.raises(checkpoint.CheckpointError) as raised:
        checkpoint.load(readme)
    r, seconds = run("sample.py", readme, cwd=files)
    assert_usage_error("sample.py", r, seconds, f"checkpoint: {raised.value}")


# ---- what a new user meets first ----------------------------------------------------------------

# each example, the arguments it needs besides --help, a flag it takes, and a prefix of that flag
EXAMPLE_FLAGS = [("train_tiny.py", [], "--steps", "--step"),
                 ("sample.py", ["run/model.safetensors"], "--tokens", "--tok"),
                 ("attention_maps.py", ["run/model.safetensors", "--text", "hi"], "--npy", "--np"),
                 ("induction.py", [], "--eval-every", "--eval"),
                 ("scaling.py", [], "--val-tokens", "--val")]


@pytest.mark.parametrize("script,needs,name,prefix", EXAMPLE_FLAGS,
                         ids=[c[0] for c in EXAMPLE_FLAGS])
def test_every_example_shows_its_defaults_and_takes_no_prefix_of_a_flag(files, script, needs,
                                                                       name, prefix):
    r, _ = run(script, "--help", cwd=files)
    assert r.returncode == 0 and "(default: " in r.stdout, (r.stdout, r.stderr)
    r, seconds = run(script, *needs, prefix, "1", cwd=files)  # argparse would take it for name
    assert_usage_error(script, r, seconds, f"unrecognized arguments: {prefix} 1")


def test_train_tiny_help_gives_each_default():
    """--help names the default of every option that has one, and says nothing of the options
    whose default is absence (--text None, --resume False)."""
    help_text = " ".join(cli.parser().format_help().split())
    for words in ("optimizer steps in all (default: 800)", "(default: out)",
                  "features per token (default: 128)", "positions (default: rope)"):
        assert words in help_text, (words, help_text)
    assert "(default: None)" not in help_text and "(default: False)" not in help_text


def test_the_example_and_python_m_pytfm_train_are_one_command(files):
    """examples/train_tiny.py and `python -m pytfm train`, given the same flags: the same
    losses, bit for bit, the same lines (but for the times), the same refusal, each under its
    own name."""
    env = subprocess_env(ROOT)
    flags = ["--text", "corpus.txt", *MODEL, "--steps", "6", "--eval-every", "3", "--log-every",
             "2", "--sample-tokens", "8"]
    commands = {"example": [sys.executable, os.path.join(EXAMPLES, "train_tiny.py")],
                "library": [sys.executable, "-m", "pytfm", "train"]}
    runs = {name: subprocess.run([*cmd, *flags, "--out", name], capture_output=True, text=True,
                                 cwd=files, env=env, timeout=300)
            for name, cmd in commands.items()}
    for r in runs.values():
        assert r.returncode == 0, r.stderr

    def lines(name):  # each line but its speed and times, and the file names (--out differs)
        out = runs[name].stdout.replace(name + "/", "OUT/")
        return [line.split("|")[:2] if line.startswith("step") else line
                for line in out.splitlines()]

    assert lines("example") == lines("library")
    logs = [[row.split(",")[:4] for row in (files / name / "loss.csv").read_text().splitlines()]
            for name in commands]
    assert logs[0] == logs[1] and len(logs[0]) == 7
    for name, cmd in commands.items():
        r = subprocess.run([*cmd, *flags, "--out", name], capture_output=True, text=True,
                           cwd=files, env=env, timeout=120)
        prog = "train_tiny.py" if name == "example" else "python -m pytfm train"
        assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
            f"{prog}: error: --out: {name}/model.safetensors exists: --resume continues its run, "
            "--force trains anew over it, or give another --out"), r.stderr


def test_train_tiny_replaces_a_trained_model_only_when_forced(files):
    """run/ holds a model at step 4: without --resume or --force a run refuses (the TRAIN_CASES
    above) and leaves it; --force trains anew and replaces it."""
    before = (files / "run" / "model.safetensors").read_bytes()
    r, seconds = run("train_tiny.py", "--text", "corpus.txt", "--out", "run", *MODEL,
                     "--steps", "100000", cwd=files)
    assert_usage_error("train_tiny.py", r, seconds, "run/model.safetensors exists")
    assert (files / "run" / "model.safetensors").read_bytes() == before
    r, _ = run("train_tiny.py", "--text", "corpus.txt", "--out", "run", *MODEL, "--steps", "2",
               "--sample-tokens", "0", "--force", cwd=files)
    assert r.returncode == 0, r.stderr
    _, step, _ = checkpoint.load(str(files / "run" / "model.safetensors"))
    assert step == 2


def blocked_matplotlib(folder):
    """A folder whose matplotlib package fails to import: put first on PYTHONPATH, it is as if
    matplotlib were not installed."""
    os.makedirs(folder / "matplotlib", exist_ok=True)
    (folder / "matplotlib" / "__init__.py").write_text(
        "raise ImportError('matplotlib is blocked for this test')\n")
    return folder


def test_train_tiny_names_what_it_saved_and_the_sample_starts_from_the_text(files):
    """The save line names each file with its folder; without matplotlib one more line says the
    plot was skipped and how to get it. The sample continues the text's first 16 bytes (not
    'def ', which only the stdlib corpus starts its samples with), or --prompt."""
    (files / "story.txt").write_bytes(b"Once upon a time, a byte met another. " * 40)
    train = ("train_tiny.py", "--text", "story.txt", *MODEL, "--steps", "1",
             "--sample-tokens", "4")
    r, _ = run(*train, "--out", "plain-run", cwd=files,
               path=[blocked_matplotlib(files / "no-matplotlib")])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    at = lines.index("saved plain-run/model.safetensors and plain-run/loss.csv")
    assert lines[at + 1] == ('skipped the plot plain-run/loss.png: matplotlib is not installed '
                             '(pip install ".[plot]")')
    assert lines[at + 3].startswith("Once upon a time") and lines[at + 2].startswith("sample")
    assert not (files / "plain-run" / "loss.png").exists()
    r, _ = run(*train, "--out", "prompted", "--prompt", "Twice", cwd=files)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    sample = lines.index("sample (temperature 0.8, top-k 40):")
    assert lines[sample + 1].startswith("Twice")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI installs matplotlib (pip install '.[plot]'): the plot must be saved")
        return
    assert lines[sample - 1] == ("saved prompted/model.safetensors, prompted/loss.csv and "
                                 "prompted/loss.png")
    assert (files / "prompted" / "loss.png").stat().st_size > 0


def test_import_pytfm_gives_every_public_module():
    """In a fresh interpreter: each public module is an attribute of the package after `import
    pytfm` alone, and none of them imports CuPy or mpi4py on the way."""
    modules = ["checkpoint", "cli", "data", "device", "distributed", "generate", "interpret",
               "kvcache", "nn", "ops", "optim", "reference", "train_step"]
    code = ("import sys, types, pytfm\n"
            f"for name in {modules!r}:\n"
            "    assert isinstance(getattr(pytfm, name), types.ModuleType), name\n"
            "    assert name in dir(pytfm) and name in pytfm.__all__, name\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('cupy', 'mpi4py')]\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=subprocess_env(ROOT), timeout=120)
    assert r.returncode == 0 and r.stdout == "ok\n", (r.stdout, r.stderr)


# ---- inputs a hostile user gives: a pipe, an endless device, a text larger than memory ---------


def test_train_tiny_reads_a_text_from_a_pipe_once(files):
    """A FIFO is opened once and read once: a writer that writes the text and leaves is read
    whole (opened twice, the second open waited for a writer that never came)."""
    fifo = files / "fifo"
    os.mkfifo(fifo)
    text = (files / "corpus.txt").read_bytes()

    def write():
        with open(fifo, "wb") as f:
            f.write(text)

    import threading
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    r, _ = run("train_tiny.py", "--text", "fifo", "--out", "piped", *MODEL, "--steps", "1",
               "--sample-tokens", "0", cwd=files)
    assert r.returncode == 0, r.stderr
    assert f"{len(text):,} bytes of text from fifo" in r.stdout


def test_train_tiny_refuses_an_endless_or_too_large_text_in_one_line(files):
    """/dev/zero once it passes the limit; a sparse file larger than the memory available by
    its size, before reading a byte."""
    r, seconds = run("train_tiny.py", "--text", "/dev/zero", "--max-text-bytes", "1000000",
                     *MODEL, cwd=files)
    assert_usage_error("train_tiny.py", r, seconds, "--text: /dev/zero gives more than "
                       "1,000,000 bytes, more than --max-text-bytes 1,000,000 allows",
                       "(an endless input?)")
    huge = files / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(2**40)  # a tebibyte of holes
    r, seconds = run("train_tiny.py", "--text", "huge.txt", *MODEL, cwd=files)
    assert_usage_error("train_tiny.py", r, seconds, "--text: huge.txt is "
                       "1,099,511,627,776 bytes, more than the memory available for it (",
                       "GiB available, training needs about", "--max-text-bytes sets the limit")


def test_the_memory_message_tells_the_sizes_apart():
    assert cli.gib(24.3 * 2**30, 23.6 * 2**30) == ["24.3 GiB", "23.6 GiB"]
    assert cli.gib(2**40, 2**30) == ["1,024 GiB", "1 GiB"]
    assert cli.gib(int(1.0004 * 2**30), 2**30) == ["1.000 GiB", "1.000 GiB"]  # 3 decimals at most


def test_train_tiny_stops_at_the_step_whose_gradients_are_not_finite(files):
    """A NaN injected into the gradients of step 3 (the loss of step 3 is still finite): the
    run stops when it next reads its losses, naming step 3 and the gradients, exit status 1;
    the checkpoint of step 2 is left as it was."""
    train = os.path.join(ROOT, "tests", "model", "mpi", "train.py")
    env = dict(os.environ, PYTHONPATH=ROOT, PYTFM_TEST_FAULT="nan-grad",
               PYTFM_TEST_FAULT_RANK="0", PYTFM_TEST_FAULT_STEP="3")
    r = subprocess.run([sys.executable, train, "--text", "corpus.txt", "--out", "nan", *MODEL,
                        "--steps", "100000", "--eval-every", "2", "--log-every", "100"],
                       capture_output=True, text=True, cwd=files, env=env, timeout=120)
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    assert "step 3: the gradients' norm became nan; stopping. The last good checkpoint " \
           "(nan/model.safetensors) is left as it was." in r.stderr, r.stderr
    assert checkpoint.load(str(files / "nan" / "model.safetensors"))[1] == 2
