"""A model whose vocabulary is padded past its tokenizer's (nanoGPT pads GPT-2's 50,257 tokens
to 50,304, a multiple of 64; Qwen's configs do the same): the padding's ids have no bytes, so
they are never drawn, in Python (pytfm.generate's sample_vocab, examples/sample.py) and in C
(examples/generate.c: pytfm_sample on the first ids of the row). The model here makes them the
likeliest ids (their LM-head rows 30 times the others), so that drawing them unmasked is all but
certain, greedy and sampled."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT, TESTS

sys.path.insert(0, os.path.join(TESTS, "model"))
sys.path.insert(0, os.path.join(TESTS, "c_api"))
from gpt2_oracle import random_gpt2, vocab_files  # noqa: E402
from test_generate_gpt2 import token_bytes  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "examples")),
                                reason="needs the checkout")
TOKENS = 50257  # GPT-2's tokenizer
PAD = 47  # the model's vocabulary: TOKENS + PAD = 50,304, nanoGPT's


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A random GPT-2 of vocabulary TOKENS + PAD, GPT-2's tokenizer beside it -> (its folder,
    GPT2TokenizerFast)."""
    vocab, merges = vocab_files()
    import torch

    path = tmp_path_factory.mktemp("padded") / "gpt2-padded"
    model = random_gpt2(11, scale=3.0, vocab_size=TOKENS + PAD, n_positions=64, n_embd=32,
                        n_layer=2, n_head=4, bos_token_id=TOKENS - 1, eos_token_id=TOKENS - 1)
    with torch.no_grad():  # the LM head is tied to the embedding
        model.transformer.wte.weight[TOKENS:] *= 30.0
    model.save_pretrained(str(path))
    shutil.copyfile(vocab, path / "vocab.json")
    shutil.copyfile(merges, path / "merges.txt")
    from gpt2_oracle import transformers

    return str(path), transformers().GPT2TokenizerFast.from_pretrained(str(path))


def test_the_padding_would_win_unmasked(folder):
    """The control: the model's own argmax is a padding id at the prompt's end."""
    from pytfm import gpt2

    model = gpt2.load(folder[0])
    assert model.cfg.vocab == TOKENS + PAD
    ids = np.array([folder[1]("Hello, my name is")["input_ids"]])
    assert model.forward(ids)[0][0, -1].argmax() >= TOKENS


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_python_never_draws_the_padding(folder, temperature):
    from pytfm import gpt2
    from pytfm.generate import generate

    model = gpt2.load(folder[0])
    ids = np.array([folder[1]("Hello, my name is")["input_ids"]])
    out = generate(model, ids, 30, temperature, None, 3, sample_vocab=TOKENS)
    assert out.shape == (1, ids.shape[1] + 30) and out[0, ids.shape[1]:].max() < TOKENS
    with pytest.raises(ValueError, match="sample_vocab must be in"):
        generate(model, ids, 1, sample_vocab=TOKENS + PAD + 1)


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_sample_py_generates_from_a_padded_model(folder, temperature, capsys):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import sample
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    prompt = "Hello, my name is"
    assert sample.main([folder[0], "--prompt", prompt, "--tokens", "20", "--temperature",
                        temperature, "--top-k", "0"]) == 0
    assert capsys.readouterr().out.startswith(prompt)


def test_generate_c_greedy_is_python_greedy_among_the_tokenizer_ids(generate_exe, folder):
    from pytfm import gpt2
    from pytfm.generate import generate

    path, tok = folder
    prompt = "Hello, my name is"
    ids = tok(prompt)["input_ids"]
    want = generate(gpt2.load(path), np.array([ids]), 30, 0.0, sample_vocab=TOKENS)[0]
    r = subprocess.run([generate_exe, path, "--prompt", prompt, "--tokens", "30",
                        "--temperature", "0"], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == prompt.encode() + token_bytes(tok, want[len(ids):].tolist()) + b"\n"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generate_c_samples_from_a_padded_model(generate_exe, folder, seed):
    path, _ = folder
    r = subprocess.run([generate_exe, path, "--prompt", "Hello", "--tokens", "30",
                        "--temperature", "1", "--top-k", "0", "--seed", str(seed)],
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(b"Hello") and b"; 30 new tokens" in r.stderr, r.stderr
