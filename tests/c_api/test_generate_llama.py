"""examples/generate.c on Llama-family folders: a random-weight transformers model of each
family (Llama, Qwen 2, Qwen 3, Mistral) of a real tokenizer's full vocabulary (Llama 3's and
Qwen 3's byte-level BPE, Llama 2's and Gemma 3's SentencePiece BPE with byte fallback), saved
with save_pretrained and the tokenizer.json beside it; built as the README says (pkg-config of
the installed package). Greedy by default, its stdout is the prompt, then transformers' greedy
continuation as its text-generation pipeline gives it (the decode of the prompt's ids and the
new ones past the decode of the prompt's: for byte-level files that is the decode of the new
ids; SentencePiece's decoder strips the leading space of a text, not of a continuation), byte
for byte, stopping at the end-of-sequence token as generate() does. Hostile folders and prompts
are refused with a message and status 2. The real tokenizer files come from
scripts/fetch_llama_tokenizers.sh: without them the tests skip, and under CI they fail."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT, TESTS
from pytfm.tokenizer import bytes_to_unicode

sys.path.insert(0, os.path.join(TESTS, "model"))
from gpt2_oracle import tokenizers, transformers  # noqa: E402
from test_tokenizer_llama import real_path  # noqa: E402

pytestmark = [pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, "examples")),
                                 reason="needs the checkout"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")]

CLASSES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
           "mistral": "MistralConfig"}
# (family, tokenizer, its BOS and EOS tokens: what a real folder of the pair names)
CASES = [("llama", "llama3", "<|begin_of_text|>", "<|end_of_text|>"),
         ("qwen2", "qwen3", None, "<|endoftext|>"),
         ("qwen3", "qwen3", None, "<|endoftext|>"),
         ("mistral", "llama2", "<s>", "</s>"),
         ("llama", "llama2", "<s>", "</s>"),
         ("llama", "gemma3", "<bos>", "<eos>")]
IDS = [f"{c[0]}-{c[1]}" for c in CASES]
# accents, CJK, emoji, and characters no SentencePiece vocabulary here has (byte fallback)
PROMPTS = ["Hello, my name is", "Grüße aus Zürich: naïve café, 日本語のテキスト 🙂👍🏽 ☃ 𝄞 𠮷",
           "  leading spaces\nand\ttabs 𝄞"]
CONTEXT = 96


def hf_model(family, vocab_size, bos, eos, seed=0, favour=()):
    """A random-weight transformers model of family, small but of vocab_size (eager attention,
    eval mode); favour: token ids whose LM-head rows are made 40 times larger, so that greedy
    picks among them (byte tokens: runs that are and are not UTF-8)."""
    tf = transformers()
    import torch

    cls = getattr(tf, CLASSES[family])
    config = cls(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 max_position_embeddings=CONTEXT, tie_word_embeddings=False,
                 bos_token_id=bos, eos_token_id=eos, pad_token_id=None)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # logits far enough apart that greedy picks do not tie in float32
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for i in favour:
            model.lm_head.weight[i] *= 40.0
    return model.eval()


def make_folder(path, family, name, favour=(), seed=0):
    """A folder of family with name's real tokenizer.json -> (path, model, tokenizers')."""
    tok_path = real_path(name)  # a skip (a failure under CI) without it
    hf = tokenizers().Tokenizer.from_file(tok_path)
    _, _, bos, eos = next(c for c in CASES if c[1] == name)
    model = hf_model(family, hf.get_vocab_size(), bos and hf.token_to_id(bos),
                     hf.token_to_id(eos), seed=seed, favour=[hf.token_to_id(t) for t in favour])
    model.save_pretrained(str(path), safe_serialization=True)
    shutil.copyfile(tok_path, path / "tokenizer.json")
    return str(path), model, hf


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def folder(request, tmp_path_factory):
    family, name = request.param[:2]
    return make_folder(tmp_path_factory.mktemp(f"{family}-{name}") / "model", family, name)


def transformers_text(model, hf, prompt, n):
    """What transformers' greedy generate(), stopping at the model's EOS, continues prompt
    with, as its text-generation pipeline returns the full text -> (the text's UTF-8, the
    prompt's ids, the new ids)."""
    import torch

    ids = hf.encode(prompt).ids  # add_special_tokens: the post-processor's BOS
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                             do_sample=False, pad_token_id=0)[0].tolist()
    assert out[:len(ids)] == ids
    new = out[len(ids):]
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if new and new[-1] in eos:  # the stop, not text
        new = new[:-1]
    assert not eos & set(new)
    full = hf.decode(ids + new, skip_special_tokens=False)
    base = hf.decode(ids, skip_special_tokens=False)  # the pipeline cuts characters off
    return (prompt + full[len(base):]).encode(), ids, new


def run(exe, *args):
    return subprocess.run([exe, *map(str, args)], capture_output=True, timeout=300)


@pytest.mark.parametrize("prompt", PROMPTS, ids=range(len(PROMPTS)))
def test_greedy_text_is_transformers_greedy_continuation(generate_exe, folder, prompt):
    path, model, hf = folder
    want, ids, new = transformers_text(model, hf, prompt, 32)
    r = run(generate_exe, path, "--prompt", prompt, "--tokens", 32, "--threads", 1)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + b"\n"
    assert f"prompt of {len(ids)} tokens".encode() in r.stderr, r.stderr
    if not hf.get_vocab().get("<0x41>"):  # byte-level: the decode of the new ids alone
        assert want == prompt.encode() + hf.decode(new, skip_special_tokens=False).encode()


# (family, tokenizer, the tokens greedy is made to pick among: byte tokens that make characters
# whole, split, or not UTF-8 at all, and a word; the seed)
FAVOURED = [("llama", "llama2", ["<0xE6>", "<0x97>", "<0xA5>", "<0xF0>", "<0x80>", "▁the"], 3),
            ("qwen3", "qwen3", [bytes_to_unicode()[b] for b in (0xE6, 0x97, 0xA5, 0xF0, 0x80)]
             + ["Ġthe"], 0)]


@pytest.mark.parametrize("family, name, favour, seed", FAVOURED, ids=["llama2", "qwen3"])
def test_bytes_that_are_not_whole_characters_decode_as_transformers(generate_exe, tmp_path,
                                                                      family, name, favour,
                                                                      seed):
    """Byte tokens drawn in runs that are characters, parts of one and not UTF-8: the text is
    transformers' decode (each maximal invalid part U+FFFD; with byte fallback a run that is
    not UTF-8 all U+FFFD, even one the prompt's last bytes begin), though each token is
    written as it comes."""
    path, model, hf = make_folder(tmp_path / "model", family, name, favour, seed)
    prompt = "日本 🙂 𝄞"  # Llama 2's ids end with 𝄞's byte tokens: the new ones go on the run
    want, ids, new = transformers_text(model, hf, prompt, 40)
    assert "\ufffd" in want.decode() and len(new) == 40  # runs that are not UTF-8
    if name == "llama2":
        assert [hf.id_to_token(i)[:3] for i in ids[-1:] + new[:1]] == ["<0x", "<0x"]
        # 𝄞's 4 bytes and 2 new ones: 6 U+FFFD, the prompt's characters cut off as before
        assert want.decode()[len(prompt):].startswith("\ufffd" * 5 + " the")
    r = run(generate_exe, path, "--prompt", prompt, "--tokens", 40)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + b"\n"


@pytest.mark.parametrize("name", ["llama2", "qwen3"])
def test_it_stops_at_the_end_of_sequence_token(generate_exe, tmp_path, name):
    """generation_config.json's eos_token_id (a list here; config.json names another) ends the
    text where transformers' generate() ends it, the token itself not written."""
    path, model, hf = make_folder(tmp_path / "model", "llama", name)
    prompt = "Once upon a time"
    _, _, new = transformers_text(model, hf, prompt, 12)
    stop = new[6]
    model.generation_config.eos_token_id = [hf.get_vocab_size() - 1, stop]
    model.generation_config.save_pretrained(path)
    assert json.loads(open(os.path.join(path, "config.json")).read())["eos_token_id"] != stop
    want, _, made = transformers_text(model, hf, prompt, 12)
    assert len(made) == new.index(stop) < 12
    r = run(generate_exe, path, "--prompt", prompt, "--tokens", 12)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + b"\n"
    assert f"{len(made) + 1} new tokens".encode() in r.stderr, r.stderr
    assert f"stopped at the end-of-sequence token {stop}\n".encode() in r.stderr, r.stderr


def test_bad_folders_and_prompts_are_refused_with_a_message(generate_exe, tmp_path):
    path, _, _ = make_folder(tmp_path / "model", "qwen3", "qwen3")
    cases = [([path, "--prompt", "word " * CONTEXT],
              f"tokens, longer than the model's context of {CONTEXT}")]
    bare = tmp_path / "no-tokenizer"
    shutil.copytree(path, bare)
    os.remove(bare / "tokenizer.json")
    cases.append(([bare], "has no tokenizer (vocab.json and merges.txt, or tokenizer.json)"))
    broken = tmp_path / "broken-generation-config"
    shutil.copytree(path, broken)
    (broken / "generation_config.json").write_text('{"eos_token_id": [1, 2')
    cases.append(([broken], "generation_config.json: "))
    small = tmp_path / "small-vocab"
    shutil.copytree(path, small)
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] = 1000
    (small / "config.json").write_text(json.dumps(config))
    cases.append(([small], "model.safetensors"))
    for args, message in cases:
        r = run(generate_exe, *args, "--tokens", 5)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert message.encode() in r.stderr, (args, r.stderr)
        assert r.stdout == b"", args
