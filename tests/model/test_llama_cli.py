"""A Llama-family folder from the command line, as a user runs it: examples/sample.py generates
transformers' greedy text from it, and `python -m pytfm train --init-from` fine-tunes it (fp32
and bf16) into a folder that transformers and pytfm both read, with its tokenizer.json."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT, subprocess_env
from pytfm import folders, llama
from pytfm.tokenizer import Tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

# Llama 3's Split pattern: the tokenizer runs it as the real files do
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXT = ("The quick brown fox jumps over the lazy dog. A transformer attends to every token "
        "before it; the keys and values of each head are cached while it decodes.\n") * 40


def byte_level_tokenizer(vocab_size=320):
    """A byte-level BPE trained on TEXT, Llama 3's pre-tokenizer, <|begin_of_text|> put first
    by its TemplateProcessing: a tokenizers.Tokenizer."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|begin_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    return tok


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A random Qwen 3 (GQA, q/k norm) saved by transformers, a tokenizer.json beside it ->
    (the folder, the transformers model, the tokenizers.Tokenizer)."""
    tok = byte_level_tokenizer()
    config = transformers.Qwen3Config(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # logits far enough apart that greedy picks do not tie in float32
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    path = str(tmp_path_factory.mktemp("qwen3") / "model")
    model.save_pretrained(path, safe_serialization=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    return path, model, tok


def run(*args, timeout=600):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=subprocess_env(ROOT), timeout=timeout)


def test_sample_py_continues_a_prompt_as_transformers_greedy_generate(folder):
    path, model, tok = folder
    prompt = "The quick brown"
    r = run(os.path.join(ROOT, "examples", "sample.py"), path, "--prompt", prompt,
            "--tokens", 24)
    assert r.returncode == 0, r.stderr
    ids = tok.encode(prompt).ids
    assert ids[0] == tok.token_to_id("<|begin_of_text|>")  # the template's BOS, as HF's
    with torch.no_grad():
        x = torch.tensor([ids])  # the mask given: HF would infer one from pad_token_id
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24,
                             do_sample=False, pad_token_id=0)
    assert r.stdout == tok.decode(out[0].tolist(), skip_special_tokens=False) + "\n"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fine_tuning_saves_a_folder_transformers_and_pytfm_read_alike(folder, tmp_path,
                                                                       precision):
    path = folder[0]
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "out"
    r = run("-m", "pytfm", "train", "--init-from", path, "--text", text, "--out", out,
            "--steps", 4, "--batch", 2, "--context", 32, "--lr", "3e-4", "--eval-every", 4,
            "--precision", precision)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    names = set(os.listdir(out))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not {"vocab.json", "merges.txt"} & names
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"
    assert (out / "tokenizer.json").read_bytes() == open(
        os.path.join(path, "tokenizer.json"), "rb").read()
    before, after = llama.read_params(path)[1], llama.read_params(str(out))[1]
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # it trained
    model = folders.load(str(out))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out),
                                                           attn_implementation="eager")
    ids = np.array([Tokenizer.from_folder(str(out)).encode(TEXT[:120])], np.int64)
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    got, _ = model.forward(ids)
    assert np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want)


def test_a_folder_of_another_model_type_is_refused_naming_it(tmp_path):
    """sample.py on a Gemma folder says which model types pytfm reads, not which GPT-2 field is
    missing."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "vocab_size": 10}))
    r = run(os.path.join(ROOT, "examples", "sample.py"), tmp_path, "--prompt", "x")
    assert r.returncode == 2
    assert "model_type is 'gemma': pytfm reads the Llama family's" in r.stderr, r.stderr
    assert folders.family(str(tmp_path)) is llama
    (tmp_path / "config.json").write_text(json.dumps({"n_embd": 8}))  # GPT-2's, no model_type
    assert folders.family(str(tmp_path)) is folders.gpt2
