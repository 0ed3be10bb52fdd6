"""pytfm._atomic under kill -9 and concurrent saves, through dev/probe_folder_kills.py (a
smaller run than the probe's 100 kills), and the modes a folder save keeps."""

import os
import stat
import subprocess
import sys
import threading

import pytest

from helpers import ROOT
from pytfm import _atomic, gpt2
from pytfm.nn import GPT, GPTConfig

PROBE = os.path.join(ROOT, "dev", "probe_folder_kills.py")


def test_saves_killed_at_random_moments_leave_one_version_whole():
    r = subprocess.run([sys.executable, PROBE, "8", "--seed", "1"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for kind, line in zip(("folder", "checkpoint"), lines):
        assert line.startswith(f"{kind}: kills 8, whole 8, torn 0, missing 0, midway "), line
        assert line.endswith("next save cleared the temporaries: True"), line
    assert " midway 0;" not in lines[0], "no kill landed while a folder save was midway"


def test_a_folder_save_keeps_each_files_mode(tmp_path):
    folder = tmp_path / "g2"
    model = GPT(GPTConfig(vocab=10, d_model=8, n_layer=1, n_head=2, max_seq=4, pos="learned"))
    gpt2.save(model, str(folder))
    os.chmod(folder / "config.json", 0o600)
    os.chmod(folder / "model.safetensors", 0o440)
    gpt2.save(model, str(folder))
    assert stat.S_IMODE(os.stat(folder / "config.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(folder / "model.safetensors").st_mode) == 0o440


def test_a_removed_entry_is_left_out_and_a_name_is_taken_once(tmp_path):
    folder = tmp_path / "f"
    with _atomic.Folder(str(folder)) as f:
        f.write("a", b"1")
        f.write("b", b"2")
    with _atomic.Folder(str(folder)) as f:
        f.remove("a")
        f.remove("missing")  # nothing to leave out: fine
        f.write("b", b"3")
        with pytest.raises(ValueError, match="a is written or removed twice"):
            f.write("a", b"x")
        with pytest.raises(ValueError, match="b is written or removed twice"):
            f.remove("b")
    assert sorted(os.listdir(folder)) == ["b"] and (folder / "b").read_bytes() == b"3"


def test_a_thread_whose_save_fails_says_which_folder_and_why(tmp_path):
    (tmp_path / "g2").write_text("a file, not a folder")
    model = GPT(GPTConfig(vocab=10, d_model=8, n_layer=1, n_head=2, max_seq=4, pos="learned"))
    errors = []

    def save():
        try:
            gpt2.save(model, str(tmp_path / "g2"))
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=save) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 2
    assert all(isinstance(e, NotADirectoryError) and e.filename == str(tmp_path / "g2")
               for e in errors), errors
