"""examples/generate.c as sample.py's twin on the command line: --temperature accepts and
refuses what sample.py does on the numbers people type (C's strtod, the whole word, finite and
>= 0, where sample.py has Python's float()) and reads the same double; what only float() takes
(underscores, digits beyond ASCII, spaces after) is refused by name; a closed stdout is an error
with a message, not a silent SIGPIPE."""

import contextlib
import io
import math
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT
from pytfm import checkpoint
from pytfm.nn import GPT, GPTConfig

EXAMPLES = os.path.join(ROOT, "examples")
pytestmark = pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="needs the checkout")

# what a user might type, on which both programs agree: plain, signed, exponents, overflow
# (inf) and underflow (0), inf and nan, empty, junk after the number, values argparse takes for
# options (a '-' not followed by a number), and values past float32 (1e39) that a double holds
TEMPERATURES = [
    "0", "0.8", "1e39", "1.5e308", "1e400", "1e-400", "-1e-400", "-0", "-0.0", " 1", "", " ",
    "inf", "-inf", "+inf", "Infinity", "nan", "-nan", "+NaN", "nan(1)", "in_f", "1e", "1e+",
    ".", ".5", "5.", "+.5e-3", "-1", "-.5", "-5.", "-1e5", "-1.5e-7", "-123456789012345678",
    "-1e16", "-0.0001", "--", "-x", "- 1", "abc", "1.5abc", "1 0",
]
# what Python's float() takes beyond C's strtod: generate.c refuses it, naming the value
ONLY_PYTHON = ["1_0", "1 ", "\t2\n", "\u0661.\u0665", "\uff11.\uff15", "\u00a01"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """A model whose logits spread over several nats (its embedding, tied to the LM head, 10
    times its initial size), so that the temperature shows in the sampled text."""
    path = tmp_path_factory.mktemp("gen") / "model.safetensors"
    model = GPT(GPTConfig(d_model=16, n_layer=1, n_head=2, max_seq=32, seed=3))
    model.params["transformer.wte.weight"] *= 10
    checkpoint.save(str(path), model)
    return str(path)


def sample_py(argv):
    """examples/sample.py's main(argv) in this process -> (status, its last stderr line)."""
    sys.path.insert(0, EXAMPLES)
    try:
        import sample
    finally:
        sys.path.remove(EXAMPLES)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = sample.main(argv)
        except SystemExit as e:
            status = e.code
    lines = err.getvalue().splitlines()
    return status, lines[-1] if lines else ""


def generate_c(exe, argv):
    r = subprocess.run([exe, *argv], capture_output=True)
    lines = r.stderr.decode("utf-8", "replace").splitlines()
    return r.returncode, lines[-1] if r.returncode else ""


@pytest.mark.parametrize("form", ["separate", "joined"])
def test_temperature_takes_and_refuses_what_sample_py_does(generate_exe, model_path, form):
    """Every entry of TEMPERATURES, as --temperature VALUE and as --temperature=VALUE: the
    same status (0 or 2) from both programs; a refusal is one error line naming the flag.
    generate.c takes the word after a flag for its value, always: the words argparse takes for
    options instead (-x, -1e5: a '-', no space, not -N or -N.N) are compared joined only."""
    differ = []
    for value in TEMPERATURES:
        if form == "joined" and value == "--":
            continue  # argparse (3.11) gives sample.py [] for --temperature=--, not a str
        if form == "separate" and re.fullmatch(r"-[^ ]+", value) and not re.fullmatch(
                r"-\d+|-\d*\.\d+", value):
            continue
        flag = ["--temperature", value] if form == "separate" else [f"--temperature={value}"]
        argv = [model_path, *flag, "--tokens", "0"]
        want, got = sample_py(argv), generate_c(generate_exe, argv)
        if got[0] != want[0] or (got[0] and "--temperature" not in got[1]
                                 and "expected one argument" not in got[1]):
            differ.append((value, want, got))
    assert not differ, "\n".join(map(repr, differ))


@pytest.mark.parametrize("value", ONLY_PYTHON)
def test_temperature_refuses_what_only_python_reads(generate_exe, model_path, value):
    assert sample_py([model_path, f"--temperature={value}", "--tokens", "0"])[0] == 0
    r = subprocess.run([generate_exe, model_path, f"--temperature={value}"], capture_output=True)
    assert r.returncode == 2
    assert r.stderr.decode().endswith("generate: error: argument --temperature: invalid float "
                                      f"value: '{value}'\n")


@pytest.mark.parametrize("value, same_as", [(".5", "0.5"), ("5e-1", "0.5"), ("2", "2.0"),
                                            ("1e39", "1e+39")])
def test_temperature_reads_the_value_python_reads(generate_exe, model_path, value, same_as):
    """The same seed and the same double give the same text (and a different double other
    text: the control)."""
    def text(t):
        r = subprocess.run([generate_exe, model_path, f"--temperature={t}", "--tokens", "25",
                            "--top-k", "0", "--seed", "5"], capture_output=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert float(value) == float(same_as)
    assert text(value) == text(same_as)
    if math.isfinite(float(value) * 1.1) and float(value) < 1e6:
        assert text(value) != text(repr(float(value) * 1.5))


def test_a_closed_stdout_is_an_error_with_a_message(generate_exe, model_path):
    """The reader of the pipe left before generate wrote: exit status 1 and a message, not a
    silent death by SIGPIPE (status -13) as the default signal handling (restored for the
    child, as a shell does) would give."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([generate_exe, model_path, "--tokens", "10"], stdout=write,
                           stderr=subprocess.PIPE, restore_signals=True)
    finally:
        os.close(write)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert b"generate: error: cannot write the text to stdout: Broken pipe" in r.stderr


def test_a_closed_stdout_stops_the_generation_at_the_first_failed_write(generate_exe,
                                                                        model_path):
    """`generate ... | head -c 10`: once the reader has gone, no further token is made: the
    first token's write (flushed with it) fails, and the tokens/s line counts that one."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([generate_exe, model_path, "--tokens", "25"], stdout=write,
                           stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert b"cannot write the text to stdout: Broken pipe" in r.stderr
    assert b"; 1 new tokens in " in r.stderr, r.stderr
