"""A GPT-2 folder's files as one: the tokenizer files a save leaves agree with the saved
tokenizer, for pytfm and for transformers' AutoTokenizer (which reads tokenizer.json first);
a save without a tokenizer keeps an old one only when it fits the model; load_snapshot reads
the model and the tokenizer of one save while saves replace the folder."""

import os
import shutil
import threading

import pytest
from gpt2_oracle import transformers

from pytfm import gpt2
from pytfm.nn import GPT, GPTConfig
from pytfm.tokenizer import Tokenizer
from pytfm.tokenizer import train as train_tokenizer

TEXT = bytes(range(32, 127)) * 8


def model_of(vocab, fill=0.0):
    m = GPT(GPTConfig(vocab=vocab, d_model=8, n_layer=1, n_head=2, max_seq=8, pos="learned"))
    m.params.buffer[...] = fill
    return m


@pytest.fixture
def hf_folder(tmp_path, gpt2_vocab_folder):
    """A folder as the hub has GPT-2's tokenizer: vocab.json and merges.txt, and
    tokenizer.json and tokenizer_config.json as transformers saves them."""
    tf = transformers()
    folder = tmp_path / "g2"
    tf.GPT2TokenizerFast.from_pretrained(str(gpt2_vocab_folder)).save_pretrained(str(folder))
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(gpt2_vocab_folder / name, folder / name)
    assert (folder / "tokenizer.json").is_file()
    return folder


def test_a_save_with_a_tokenizer_leaves_no_stale_tokenizer_file(hf_folder):
    tf = transformers()
    (hf_folder / "special_tokens_map.json").write_text('{"eos_token": "<|endoftext|>"}')
    (hf_folder / "added_tokens.json").write_text('{"<|extra|>": 50257}')
    tok = train_tokenizer(TEXT, 400)
    gpt2.save(model_of(len(tok)), str(hf_folder), tokenizer=tok)
    assert not set(gpt2.HF_TOKENIZER_FILES) & set(os.listdir(hf_folder))
    auto = tf.AutoTokenizer.from_pretrained(str(hf_folder))
    assert len(auto) == len(tok) == len(gpt2.load_tokenizer(str(hf_folder)))
    text = "Hello, world! It's 2024 -- 'quotes' <|endoftext|> and   spaces\n"
    assert auto(text)["input_ids"] == list(tok.encode(text))
    assert auto.decode(tok.encode(text)) == text


def test_a_save_with_a_tokenizer_replaces_a_folder_that_had_only_tokenizer_json(hf_folder):
    for name in ("vocab.json", "merges.txt"):
        (hf_folder / name).unlink()
    assert len(gpt2.load_tokenizer(str(hf_folder))) == 50257  # tokenizer.json's
    tok = train_tokenizer(TEXT, 300)
    gpt2.save(model_of(len(tok)), str(hf_folder), tokenizer=tok)
    assert len(gpt2.load_tokenizer(str(hf_folder))) == len(tok)
    assert not (hf_folder / "tokenizer.json").exists()


def test_a_save_without_a_tokenizer_keeps_one_that_fits_and_refuses_one_that_does_not(
        hf_folder):
    """GPT-2's 50,257 tokens beside a model of 1,000: refused before anything is written,
    naming the file; beside a model of 50,257 they are kept, every file of them."""
    before = {n: (hf_folder / n).read_bytes() for n in os.listdir(hf_folder)}
    with pytest.raises(ValueError, match=rf"{hf_folder}/vocab.json: the folder's tokenizer has "
                       r"50257 tokens, more than the model's vocabulary of 1000"):
        gpt2.save(model_of(1000), str(hf_folder))
    assert {n: (hf_folder / n).read_bytes() for n in os.listdir(hf_folder)} == before
    (hf_folder / "vocab.json").rename(hf_folder / "vocab.json.bak")  # tokenizer.json's turn
    with pytest.raises(ValueError, match=r"tokenizer.json: the folder's tokenizer has 50257"):
        gpt2.save(model_of(1000), str(hf_folder))
    (hf_folder / "vocab.json.bak").rename(hf_folder / "vocab.json")
    gpt2.save(model_of(50257), str(hf_folder))
    assert all((hf_folder / n).read_bytes() == b for n, b in before.items())
    assert gpt2.load(str(hf_folder)).cfg.vocab == 50257


def test_a_save_without_a_tokenizer_keeps_tokenizer_files_pytfm_cannot_read(tmp_path):
    folder = tmp_path / "g2"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"model": {"type": "Unigram"}}')
    gpt2.save(model_of(10), str(folder))
    assert (folder / "tokenizer.json").read_text() == '{"model": {"type": "Unigram"}}'


def test_load_snapshot_reads_the_model_and_the_tokenizer_of_one_save(tmp_path):
    """A thread saves two versions in turn (each version's model and tokenizer differ in
    size); each load_snapshot meanwhile returns a matching pair."""
    folder = str(tmp_path / "g2")
    made = []
    for v in range(2):
        tok = train_tokenizer(TEXT, 300 + 20 * v)
        made.append((model_of(len(tok) + 7, fill=v), tok))
    gpt2.save(made[0][0], folder, tokenizer=made[0][1])
    stop, errors = threading.Event(), []

    def saver():
        try:
            step = 0
            while not stop.is_set():
                step += 1
                gpt2.save(made[step % 2][0], folder, tokenizer=made[step % 2][1])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=saver)
    t.start()
    try:
        for _ in range(60):
            model, tok = gpt2.load_snapshot(folder)
            assert model.cfg.vocab == len(tok) + 7
            assert float(model.params.buffer[0]) == made.index(
                next(m for m in made if len(m[1]) == len(tok)))
    finally:
        stop.set()
        t.join()
    assert not errors


def test_load_snapshot_refuses_as_load_does(tmp_path):
    from pytfm.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="not a folder"):
        gpt2.load_snapshot(str(tmp_path / "nowhere"))
    tok = train_tokenizer(TEXT, 300)
    gpt2.save(model_of(len(tok)), str(tmp_path / "g2"))
    with pytest.raises(Exception, match="vocab.json|tokenizer"):
        gpt2.load_snapshot(str(tmp_path / "g2"))  # no tokenizer there
    shutil.rmtree(tmp_path / "g2")


def test_load_snapshot_gives_up_naming_the_folder_when_every_read_sees_a_new_one(
        tmp_path, monkeypatch):
    folder = str(tmp_path / "g2")
    tok = train_tokenizer(TEXT, 300)
    gpt2.save(model_of(len(tok)), folder, tokenizer=tok)
    real = Tokenizer.from_folder

    def replaced_meanwhile(path):
        gpt2.save(model_of(len(tok)), folder, tokenizer=tok)
        return real(path)

    monkeypatch.setattr(gpt2.Tokenizer, "from_folder", replaced_meanwhile)
    with pytest.raises(OSError, match=rf"{folder}: replaced by a save during each of 3 reads"):
        gpt2.load_snapshot(folder, tries=3)
