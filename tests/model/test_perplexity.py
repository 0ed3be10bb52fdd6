"""pytfm.perplexity and `python -m pytfm perplexity`: the definition (non-overlapping windows,
each token after a window's first predicted), held to transformers' float64 log-softmax of
the same windows for a Llama-family and a GPT-2 folder; batching that changes no bit; the bytes
the predicted tokens stand for; the command on a checkpoint and on a folder, its bad inputs
(exit 2, naming the argument), and a BF16-only model in --precision bf16."""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from gpt2_oracle import missing, random_gpt2
from gpt2_oracle import transformers as load_transformers

from helpers import ROOT, subprocess_env
from pytfm import checkpoint, folders
from pytfm import perplexity as ppl
from pytfm.__main__ import main as pytfm_main
from pytfm.nn import GPT, GPTConfig
from pytfm.tokenizer import Tokenizer
from pytfm.tokenizer import train as train_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

TEXT = ("The quick brown fox jumps over the lazy dog. A transformer attends to every token "
        "before it; each window of the text is read from its first token.\n") * 12
SUMMARY = re.compile(r"perplexity (\d+\.\d{4}) \| bits/byte (\d+\.\d{4}) \| (\d+) tokens "
                     r"predicted in (\d+) windows of (\d+) \| (fp32|bf16) \| \d+\.\d s\n")
JSON_KEYS = {"nll", "tokens", "perplexity", "windows", "context", "bits_per_byte", "bytes",
             "text_tokens", "precision", "device", "seconds"}
PPL_RTOL = 1e-4  # the perplexity's bound against transformers, relative


def qwen3(seed=0, dtype="float32", vocab=96, max_seq=64):
    """A random-weight transformers Qwen 3 (GQA, q/k norm), norms and biases moved off their
    initial constants."""
    tf = load_transformers()
    import torch

    config = tf.Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, max_position_embeddings=max_seq,
                            tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.to(getattr(torch, dtype)).eval()


def saved(tmp_path, model, name):
    path = str(tmp_path / name)
    model.save_pretrained(path, safe_serialization=True)
    return path


def oracle_nll(hf, ids, context):
    """(the NLL in nats, the tokens predicted) of transformers' model hf on ids by the
    definition, written out: each window of context tokens run alone, float64 log-softmax of
    its float32 logits, every token after the window's first."""
    import torch

    nll, n = 0.0, 0
    for s in range(0, len(ids), context):
        w = ids[s:s + context]
        if len(w) < 2:
            continue
        with torch.no_grad():
            logits = hf(torch.from_numpy(w[None].astype(np.int64))).logits[0].double()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        nll -= float(logp[torch.arange(len(w) - 1), torch.from_numpy(w[1:])].sum())
        n += len(w) - 1
    return nll, n


def hand_nll(model, ids, context):
    """The same by hand on a pytfm model: NumPy float64 log-softmax of its logits, each window
    one forward of its own."""
    nll = 0.0
    for s in range(0, len(ids), context):
        w = ids[s:s + context]
        if len(w) < 2:
            continue
        logits = model.forward(w[None].astype(np.int64))[0][0].astype(np.float64)
        top = logits.max(axis=-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
        nll -= logp[np.arange(len(w) - 1), w[1:]].sum()
    return nll


# ---- against transformers -----------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_perplexity_is_transformers_of_the_same_windows(tmp_path, family):
    """A random folder of each family: pytfm's perplexity of 150 random ids in windows of 64
    (64, 64, 22: 147 predicted) and of 50 (50, 50, 50: 147) is transformers' float64
    log-softmax NLL of the same windows within PPL_RTOL, and the counts are the same."""
    if family == "qwen3":
        hf = qwen3()
    else:
        hf = random_gpt2(0, vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    path = saved(tmp_path, hf, family)
    model = folders.load(path)
    ids = np.random.default_rng(1).integers(0, 96, 150)
    for context, windows in ((64, 3), (50, 3)):
        nll, n = oracle_nll(hf, ids, context)
        r = ppl.perplexity(model, ids, context=context, batch=2)
        assert (r["tokens"], r["windows"], r["context"]) == (n, windows, context) == \
            (147, windows, context)
        assert r["perplexity"] == pytest.approx(math.exp(nll / n), rel=PPL_RTOL)
        assert r["nll"] == pytest.approx(nll, rel=PPL_RTOL)
    assert ppl.perplexity(model, ids)["windows"] == 3  # default context: max_seq 64


# ---- the definition -----------------------------------------------------------------------


def tiny(seed=0):
    return GPT(GPTConfig(vocab=256, d_model=32, n_layer=2, n_head=4, max_seq=16, seed=seed))


def test_ten_tokens_in_windows_of_four_predict_seven():
    """10 tokens, context 4: windows of 4, 4 and 2, so 3 + 3 + 1 = 7 tokens predicted, their
    NLL the hand-computed one (float64 log-softmax of the same float32 logits: the kernel's
    float32 log-sum-exp differs by a few ulps of each token's |lse| ~ ln 256)."""
    model, ids = tiny(), np.arange(10) * 17 % 256
    r = ppl.perplexity(model, ids, context=4)
    assert (r["tokens"], r["windows"], r["context"]) == (7, 3, 4)
    assert r["nll"] == pytest.approx(hand_nll(model, ids, 4), rel=1e-6)
    assert r["perplexity"] == math.exp(r["nll"] / 7)
    assert ppl.windows_of(10, 4) == [(0, 4), (4, 4), (8, 2)]


def test_batching_changes_no_bit():
    """Any batch gives the NLL bit for bit: each row of a product sums over k in one fixed order
    whatever the number of rows (the kernels give the same bits at any thread count), the
    windows of a forward do not see each other, and math.fsum's total does not depend on the
    order of its terms. 23 windows of 9 and one of 2, in fp32 and bf16."""
    model = tiny(1)
    ids = np.random.default_rng(2).integers(0, 256, 23 * 9 + 2)
    for precision in ("fp32", "bf16"):
        model.set_precision(precision)
        one = ppl.perplexity(model, ids, context=9, batch=1)
        for batch in (3, 7, 24, 100):
            assert ppl.perplexity(model, ids, context=9, batch=batch) == one, (precision, batch)


def test_a_window_of_one_token_predicts_nothing():
    """9 tokens in windows of 4: the third window is one token, which adds nothing: the figures
    of the first 8, but 3 windows."""
    model, ids = tiny(), np.arange(9) * 31 % 256
    r9, r8 = ppl.perplexity(model, ids, context=4), ppl.perplexity(model, ids[:8], context=4)
    assert r9 == {**r8, "windows": 3} and r8["windows"] == 2 and r9["tokens"] == 6
    calls = []
    ppl.perplexity(model, ids, context=4, batch=1, progress=lambda *a: calls.append(a))
    assert [c[:2] for c in calls] == [(1, 3), (2, 3)]  # two forwards, of 3 windows
    assert calls[-1][2:] == (r9["nll"], 6)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(ids=[5]), ValueError, "ids must hold at least 2 tokens"),
    (dict(ids=[]), ValueError, "ids must hold at least 2 tokens"),
    (dict(ids=[1, 256]), ValueError, r"ids must be in \[0, 256\)"),
    (dict(ids=[1, -1]), ValueError, r"ids must be in \[0, 256\)"),
    (dict(ids=[[1, 2]]), ValueError, "ids must be one sequence"),
    (dict(ids=[1.0, 2.0]), TypeError, "ids must be integer token ids"),
    (dict(context=1), ValueError, r"context must be in \[2, 16\]"),
    (dict(context=17), ValueError, r"context must be in \[2, 16\]"),
    (dict(context=4.0), TypeError, "context must be an int"),
    (dict(batch=0), ValueError, "batch must be >= 1"),
    (dict(progress=3), TypeError, "progress must be callable"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, error, message):
    kwargs = {"ids": [1, 2, 3], **kwargs}
    with pytest.raises(error, match=message):
        ppl.perplexity(tiny(), **kwargs)


def test_predicted_bytes_leave_out_each_windows_first_token():
    """Bytes: one a token for a byte-level model; for a BPE, the bytes of every token but each
    window's first, which with the first tokens' are the text's bytes (the tokenizer gives the
    text back)."""
    assert ppl.predicted_bytes(np.arange(10), 4) == 7
    raw = TEXT.encode()
    tok = train_tokenizer(raw, 300)
    ids = tok.encode_array(raw, special=False, template=False)
    firsts = sum(len(tok.token_bytes(int(i))) for i in ids[::16])
    assert ppl.predicted_bytes(ids, 16, tok) == len(raw) - firsts
    assert len(ids) < len(raw) - firsts  # a BPE's tokens are not its bytes
    assert ppl.bits_per_byte(math.log(2) * 10, 5) == 2.0
    with pytest.raises(ValueError, match="n_bytes must be > 0"):
        ppl.bits_per_byte(1.0, 0)


LLAMA_TOKENIZERS = os.environ.get("PYTFM_LLAMA_TOKENIZERS") or os.path.join(
    os.path.expanduser("~"), ".cache", "pytfm", "llama-tokenizers")


@pytest.mark.parametrize("name, prepended", [("llama2", 1), ("gemma3", 0), ("llama3", 0),
                                             ("qwen3", 0)])
def test_token_bytes_of_real_tokenizers_add_up_to_the_text(name, prepended):
    """The real files (scripts/fetch_llama_tokenizers.sh): the bytes of a text's tokens are the
    text's own (Llama 2's file prepends a space to the text, in its first token, which no
    window predicts); text tokens count <0xNN> as one byte and U+2581 as a space."""
    folder = os.path.join(LLAMA_TOKENIZERS, name)
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        missing(f"needs {name}'s tokenizer.json in {folder}: bash "
                "scripts/fetch_llama_tokenizers.sh")
    tok = Tokenizer.from_folder(folder)
    lengths = ppl.token_byte_lengths(tok, len(tok))
    with open(os.path.join(ROOT, "README.md"), "rb") as f:
        readme = f.read()
    for raw in (readme, "日本語のテキスト 😀👍🏽 \U00020000 x  y\n\n\tz café".encode()):
        ids = tok.encode_array(raw, special=False, template=False)
        assert tok.decode_bytes(ids) == raw  # these texts round-trip
        assert lengths[ids].sum() == len(raw) + prepended
        assert lengths[ids[1:]].sum() == ppl.predicted_bytes(ids, len(ids), tok)


# ---- the command --------------------------------------------------------------------------


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "pytfm", "perplexity", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, env=subprocess_env(ROOT),
                          timeout=timeout)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A random byte-level checkpoint (context 32) and the text file TEXT."""
    folder = tmp_path_factory.mktemp("ppl")
    ckpt = str(folder / "model.safetensors")
    cfg = GPTConfig(vocab=256, d_model=32, n_layer=2, n_head=4, max_seq=32)
    checkpoint.save(ckpt, GPT(cfg))
    text = folder / "text.txt"
    text.write_bytes(TEXT.encode())
    return ckpt, str(text)


def test_the_command_on_a_checkpoint_prints_the_apis_figures(files):
    """`python -m pytfm perplexity` as a user runs it: exit 0, the summary line's figures are
    the API's (rounded as printed), --json's are the API's exactly, progress on stderr."""
    ckpt, text = files
    model = checkpoint.load(ckpt)[0]
    ids = np.frombuffer(TEXT.encode(), np.uint8).astype(np.int64)
    r = ppl.perplexity(model, ids, context=20)
    bpb = ppl.bits_per_byte(r["nll"], ppl.predicted_bytes(ids, 20))
    got = run(ckpt, text, "--context", 20, "--batch", 4)
    assert got.returncode == 0, got.stderr
    m = SUMMARY.fullmatch(got.stdout)
    assert m, got.stdout
    assert m.groups() == (f"{r['perplexity']:.4f}", f"{bpb:.4f}", str(r["tokens"]),
                          str(r["windows"]), "20", "fp32")
    assert re.search(rf"window {r['windows']}/{r['windows']} \| perplexity ", got.stderr)
    got = run(ckpt, text, "--json")
    assert got.returncode == 0, got.stderr
    figures = json.loads(got.stdout)
    assert set(figures) == JSON_KEYS
    r = ppl.perplexity(model, ids)  # context: max_seq
    assert {k: figures[k] for k in r} == r
    assert (figures["bytes"], figures["text_tokens"]) == (r["tokens"], len(ids))
    assert figures["bits_per_byte"] == r["nll"] / math.log(2) / r["tokens"]
    assert (figures["precision"], figures["device"], figures["context"]) == ("fp32", "cpu", 32)


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    """A random Qwen 3 folder whose tokenizer.json (a byte-level BPE trained on TEXT) puts a
    BOS first by its template -> (folder, tokenizers.Tokenizer)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|bos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A",
                                                       special_tokens=[("<|bos|>", bos)])
    path = saved(tmp_path_factory.mktemp("qwen"), qwen3(vocab=tok.get_vocab_size()), "q")
    tok.save(os.path.join(path, "tokenizer.json"))
    return path, tok


def test_the_command_on_a_folder_reads_the_plain_texts_tokens(qwen_folder, files):
    """A Llama-family folder: the text's own tokens (no template BOS), transformers' figures."""
    path, hf_tok = qwen_folder
    text = files[1]
    got = run(path, text, "--json", "--context", 40)
    assert got.returncode == 0, got.stderr
    figures = json.loads(got.stdout)
    ids = np.array(hf_tok.encode(TEXT, add_special_tokens=False).ids)
    assert hf_tok.encode(TEXT).ids[0] == hf_tok.token_to_id("<|bos|>") != ids[0]
    assert figures["text_tokens"] == len(ids)
    hf = load_transformers().AutoModelForCausalLM.from_pretrained(path).eval()
    nll, n = oracle_nll(hf, ids, 40)
    assert (figures["tokens"], figures["bytes"]) == (n, len(TEXT) - sum(
        len(hf_tok.decode([int(i)]).encode()) for i in ids[::40]))
    assert figures["perplexity"] == pytest.approx(math.exp(nll / n), rel=PPL_RTOL)


@pytest.mark.parametrize("args, message", [
    (["{ckpt}", "{dir}/none.txt"], "TEXT_FILE: there is no file"),
    (["{ckpt}", "{dir}"], "TEXT_FILE: .* is a folder"),
    (["{ckpt}", "{dir}/empty.txt"], "TEXT_FILE: .* is empty"),
    (["{ckpt}", "{dir}/one.txt"], "TEXT_FILE: .* is 1 token, and perplexity needs at least 2"),
    (["{ckpt}", "{text}", "--context", "1"], "--context must be >= 2"),
    (["{ckpt}", "{text}", "--context", "33"], "--context must be at most the model's max_seq "
     "of 32, got 33"),
    (["{ckpt}", "{text}", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["{dir}/none.safetensors", "{text}"], "checkpoint: there is no file"),
    (["{ckpt}", "{text}", "--precision", "fp16"], "argument --precision: invalid choice"),
])
def test_bad_input_is_a_usage_error_naming_the_argument(files, capsys, args, message):
    ckpt, text = files
    folder = os.path.dirname(ckpt)
    open(os.path.join(folder, "empty.txt"), "wb").close()
    with open(os.path.join(folder, "one.txt"), "wb") as f:
        f.write(b"x")
    argv = [a.format(ckpt=ckpt, text=text, dir=folder) for a in args]
    with pytest.raises(SystemExit) as e:
        pytfm_main(["perplexity", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m pytfm perplexity")
    assert re.search(f"error: {message}", err), err


# ---- BF16 ---------------------------------------------------------------------------------


def test_a_bfloat16_folder_in_bf16_is_held_in_bf16_and_close_to_fp32(tmp_path):
    """A bfloat16 Qwen 3 folder loaded in bf16 holds its matrices as BF16 bits only, and its
    perplexity, finite, is the float32 model's (the same BF16 values in float32) within a loose
    sanity bound of 1% (0.01 nats a token: bf16 rounds each product's activations to 8
    significant bits, 0.4% at most per value, errors that mostly cancel over a sum; the
    bound is not derived)."""
    path = saved(tmp_path, qwen3(seed=3, dtype="bfloat16"), "q16")
    ids = np.random.default_rng(4).integers(0, 96, 300)
    model16 = folders.load(path, precision="bf16")
    assert model16.kept and model16.precision == "bf16"
    assert all(a.dtype == np.uint16 for a in model16.params16.values())
    r16 = ppl.perplexity(model16, ids, context=64, batch=3)
    r32 = ppl.perplexity(folders.load(path), ids, context=64, batch=3)
    assert math.isfinite(r16["perplexity"]) and r16["nll"] != r32["nll"]
    assert r16["tokens"] == r32["tokens"] == 300 - 5
    assert abs(r16["nll"] - r32["nll"]) / r16["tokens"] < 0.01


@pytest.fixture(scope="module")
def qwen16_folder(qwen_folder, tmp_path_factory):
    """qwen_folder's model in bfloat16, with its tokenizer."""
    path, tok = qwen_folder
    hf = load_transformers().AutoModelForCausalLM.from_pretrained(path)
    import torch

    out = saved(tmp_path_factory.mktemp("qwen16"), hf.to(torch.bfloat16), "q16")
    tok.save(os.path.join(out, "tokenizer.json"))
    return out, tok


def test_the_command_in_bf16_runs_the_bf16_model(qwen16_folder, files):
    path, hf_tok = qwen16_folder
    got = run(path, files[1], "--json", "--precision", "bf16", "--context", 40, "--batch", 2)
    assert got.returncode == 0, got.stderr
    figures = json.loads(got.stdout)
    ids = np.array(hf_tok.encode(TEXT, add_special_tokens=False).ids)
    r = ppl.perplexity(folders.load(path, precision="bf16"), ids, context=40)
    assert {k: figures[k] for k in r} == r and figures["precision"] == "bf16"
    assert "precision bf16, the BF16 products' path" in got.stderr


def test_on_the_gpu_path_the_figures_are_the_cpus(emu, monkeypatch):
    """The model on the GPU path (the stand-in cupy, strict: a NumPy array in device code is a
    TypeError; the CUDA kernels under the emulator): the same tokens and windows, and an NLL
    within float32 rounding of the CPU's (the kernels sum in other orders)."""
    import fake_cupy

    fake_cupy.install(monkeypatch, emu, strict=True)
    cpu = tiny(5)
    gpu = GPT(cpu.cfg)
    gpu.params.copy_from(cpu.params)
    gpu.to("cuda")
    ids = np.random.default_rng(6).integers(0, 256, 40)
    r_cpu = ppl.perplexity(cpu, ids, context=16, batch=2)
    r_gpu = ppl.perplexity(gpu, ids, context=16, batch=2)
    assert {k: r_gpu[k] for k in ("tokens", "windows", "context")} == \
        {k: r_cpu[k] for k in ("tokens", "windows", "context")}
    assert r_gpu["nll"] == pytest.approx(r_cpu["nll"], rel=1e-5)
