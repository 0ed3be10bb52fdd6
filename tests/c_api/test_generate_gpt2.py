"""examples/generate.c on a Hugging Face GPT-2 folder: a random GPT-2 made with transformers,
GPT-2's real vocabulary beside it; built as the README says (pkg-config of the installed
package); greedy, its stdout is transformers' greedy continuation, byte for byte; bad prompts
and folders are refused with a message and status 2, never a crash."""

import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT, TESTS
from helpers import library_flags as flags  # noqa: F401  (for the tests that import it here)
from pytfm.tokenizer import bytes_to_unicode

sys.path.insert(0, os.path.join(TESTS, "model"))
from gpt2_oracle import greedy, random_gpt2, vocab_files  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "examples")),
                                reason="needs the checkout")
CONFIG = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A random GPT-2 of GPT-2's vocabulary, saved by transformers with the vocabulary files
    (vocab.json + merges.txt) beside it -> (the folder, the model, GPT2TokenizerFast)."""
    vocab, merges = vocab_files()  # a skip (a failure under CI) without them
    path = tmp_path_factory.mktemp("gpt2") / "random-gpt2"
    model = random_gpt2(7, scale=3.0, **CONFIG)
    model.save_pretrained(str(path))
    shutil.copyfile(vocab, path / "vocab.json")
    shutil.copyfile(merges, path / "merges.txt")
    from gpt2_oracle import transformers

    tok = transformers().GPT2TokenizerFast.from_pretrained(str(path))
    return str(path), model, tok


def token_bytes(tok, ids):
    """The bytes transformers' tokenizer has for ids (its byte-level alphabet undone)."""
    back = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(back[c] for c in "".join(tok.convert_ids_to_tokens(ids)))


def run(exe, *args):
    return subprocess.run([exe, *map(str, args)], capture_output=True, timeout=300)


@pytest.mark.parametrize("prompt", ["Hello, my name is", "Grüße aus Zürich: 日本語 🙂 ☃",
                                    "<|endoftext|>The"])
def test_greedy_text_is_transformers_greedy_continuation(generate_exe, folder, prompt):
    path, model, tok = folder
    ids = tok(prompt)["input_ids"]
    n = 40
    want = greedy(model, [ids], n)[0].tolist()
    assert want[:len(ids)] == ids
    r = run(generate_exe, path, "--prompt", prompt, "--tokens", n, "--temperature", 0,
            "--threads", 1)
    assert r.returncode == 0, r.stderr
    assert r.stdout == prompt.encode() + token_bytes(tok, want[len(ids):]) + b"\n"
    err = r.stderr.decode()
    assert f"prompt of {len(ids)} tokens" in err and f"{n} new tokens" in err
    assert err.count("tokens/s") == 2


def test_a_folder_is_greedy_by_default_as_transformers_is(generate_exe, folder):
    """No --temperature on a GPT-2 folder: transformers' generate() decodes greedily unless the
    generation config asks for sampling, and so does generate.c, as README's command runs it."""
    path, model, tok = folder
    prompt, n = "Hello", 20
    ids = tok(prompt)["input_ids"]
    want = greedy(model, [ids], n)[0].tolist()
    r = run(generate_exe, path, "--prompt", prompt, "--tokens", n)
    assert r.returncode == 0, r.stderr
    assert r.stdout == prompt.encode() + token_bytes(tok, want[len(ids):]) + b"\n"


def test_a_character_split_over_tokens_is_streamed_whole(generate_exe, folder):
    """Tokens that end inside a UTF-8 character: the text is still each token's bytes in
    order (the stream holds a partial character back until the next token completes it)."""
    path, model, tok = folder
    prompt = "🙂🙂 ☃"  # each emoji is several byte-level tokens in GPT-2's vocabulary
    ids = tok(prompt)["input_ids"]
    assert any(b"\xf0" == token_bytes(tok, [i])[:1] and len(token_bytes(tok, [i])) < 4
               for i in ids)
    want = greedy(model, [ids], 10)[0].tolist()
    r = run(generate_exe, path, "--prompt", prompt, "--tokens", 10, "--temperature", 0)
    assert r.returncode == 0, r.stderr
    assert r.stdout == token_bytes(tok, want) + b"\n"


def test_bad_prompts_and_folders_are_refused_with_a_message(generate_exe, folder, tmp_path):
    path, _, _ = folder
    long = "word " * 100  # 100+ tokens, more than the context of 64
    cases = [
        ([path, "--prompt", long], "tokens, longer than the model's context of 64"),
        ([path, "--prompt", ""], "--prompt must not be empty"),
    ]
    bare = tmp_path / "no-tokenizer"
    shutil.copytree(path, bare)
    os.remove(bare / "vocab.json")
    cases.append(([bare], "has merges.txt but no vocab.json (and no tokenizer.json)"))
    broken = tmp_path / "broken-vocab"
    shutil.copytree(path, broken)
    (broken / "vocab.json").write_text("{not json")
    cases.append(([broken], "vocab.json"))
    no_weights = tmp_path / "no-weights"
    shutil.copytree(path, no_weights)
    os.remove(no_weights / "model.safetensors")
    cases.append(([no_weights], "model.safetensors: missing"))
    for args, message in cases:
        r = run(generate_exe, *args, "--tokens", 5)
        assert r.returncode in (1, 2), (args, r.returncode, r.stderr)
        assert message in r.stderr.decode(), (args, r.stderr)


def test_a_tokenizer_json_serves_as_well(generate_exe, folder, tmp_path):
    path, model, tok = folder
    other = tmp_path / "tokenizer-json"
    shutil.copytree(path, other)
    os.remove(other / "vocab.json")
    os.remove(other / "merges.txt")
    tok.backend_tokenizer.save(str(other / "tokenizer.json"))
    ids = tok("Hello")["input_ids"]
    want = greedy(model, [ids], 20)[0].tolist()
    r = run(generate_exe, other, "--prompt", "Hello", "--tokens", 20, "--temperature", 0)
    assert r.returncode == 0, r.stderr
    assert r.stdout == token_bytes(tok, want) + b"\n"
