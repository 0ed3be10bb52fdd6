"""The model API misused as a hostile user would, and what it must answer: the public entry
points of pytfm.nn, pytfm.generate and pytfm.optim name the argument and what it should be for
token ids (and arrays) of the wrong type, dtype or rank (one table, as the kernels' error tests);
decode checks its caches; non-finite logits are an error in Python as in C; one model trained
from two threads at once is refused; non-finite gradients are reported; AdamW's hyper-parameters
have a meaningful range; a save keeps the mode of the file it replaces; a text takes its own
size in memory, not eight times that."""

import os
import signal
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers import ROOT, run_python
from pytfm import checkpoint, data, gpt2
from pytfm.generate import generate, sample_next
from pytfm.kvcache import KVCache
from pytfm.nn import GPT, GPTConfig
from pytfm.optim import AdamW, clip_grad_norm

CFG = GPTConfig(vocab=16, d_model=8, n_layer=3, n_head=2, max_seq=8, seed=1)
IDS = np.array([[1, 2, 3], [4, 5, 6]], np.int64)  # (B, T) = (2, 3)


@pytest.fixture(scope="module")
def model():
    return GPT(CFG)


def calls(m):
    """The public entry points given bad ids or arrays: (id, call, exception, message regex)."""
    opt = AdamW(m.params, m.grads)
    rng = np.random.default_rng(0)
    logits = np.zeros((2, 16), np.float32)
    cases = []
    for where, call in (
            ("forward", lambda a: m.forward(a)),
            ("forward/targets", lambda a: m.forward(IDS, a)),
            ("decode", lambda a: m.decode(a, m.new_caches(2))),
            ("attention_probs", lambda a: m.attention_probs(a))):
        arg = "targets" if where == "forward/targets" else "idx"
        want = rf"GPT\.{where.split('/')[0]}: {arg} must be a numpy\.ndarray of int64 token ids, " \
               r"of shape \(B, T\)"
        cases += [
            (f"{where}-list", lambda c=call: c([[1, 2]]), TypeError, want + ", got list"),
            (f"{where}-int", lambda c=call: c(5), TypeError, want + ", got int"),
            (f"{where}-rank1", lambda c=call: c(np.array([1, 2], np.int64)), ValueError,
             want + r", got shape \(2,\)"),
            (f"{where}-rank3", lambda c=call: c(np.zeros((1, 2, 3), np.int64)), ValueError,
             want + r", got shape \(1, 2, 3\)"),
            (f"{where}-int32", lambda c=call: c(IDS.astype(np.int32)), TypeError,
             want + r", got dtype int32 \(" + arg + r"\.astype\(np\.int64\)\)"),
            (f"{where}-float", lambda c=call: c(IDS.astype(np.float64)), TypeError,
             want + ", got dtype float64"),
            (f"{where}-uint8", lambda c=call: c(IDS.astype(np.uint8)), TypeError,
             want + ", got dtype uint8"),
            (f"{where}-strided", lambda c=call: c(IDS[:, ::2]), ValueError,
             rf"GPT\.{where.split('/')[0]}: {arg} must be C-contiguous "
             rf"\(np\.ascontiguousarray\({arg}\)\), got strides \(24, 16\)"),
        ]
    cases += [
        ("forward/targets-shape", lambda: m.forward(IDS, IDS[:, :2].copy()), ValueError,
         r"targets must have idx's shape \(2, 3\) \(one target per token, -1 to ignore\), got "
         r"\(2, 2\)"),
        ("GPT-cfg", lambda: GPT({"d_model": 8}), TypeError,
         "cfg must be a pytfm.nn.GPTConfig, got dict"),
        ("forward-save", lambda: m.forward(IDS, IDS, save=1), TypeError,
         r"save must be a bool \(True or False\), got int"),
        ("generate-model", lambda: generate("gpt", IDS, 1), TypeError,
         "model must be a pytfm.nn.GPT, got str"),
        ("generate-rank1", lambda: generate(m, np.array([1, 2]), 1), ValueError,
         r"prompt must have shape \(B, T\) with T >= 1, got \(2,\)"),
        ("generate-float", lambda: generate(m, IDS.astype(np.float32), 1), TypeError,
         "prompt must hold integer token ids, got dtype float32"),
        ("sample_next-list", lambda: sample_next([[0.0, 1.0]], rng), TypeError,
         r"logits must be a numpy\.ndarray of floats, of shape \(B, vocab\); got list"),
        ("sample_next-ints", lambda: sample_next(IDS, rng), TypeError,
         r"logits must be a numpy\.ndarray of floats, of shape \(B, vocab\); got dtype int64"),
        ("sample_next-rank1", lambda: sample_next(logits[0], rng), ValueError,
         r"logits must have shape \(B, vocab\) with vocab >= 1, got \(16,\)"),
        ("sample_next-empty", lambda: sample_next(logits[:, :0], rng), ValueError,
         r"logits must have shape \(B, vocab\) with vocab >= 1, got \(2, 0\)"),
        ("sample_next-rng", lambda: sample_next(logits, 42), TypeError,
         r"rng must be a numpy\.random\.Generator \(np\.random\.default_rng\(seed\)\), got int"),
        ("AdamW-params", lambda: AdamW([np.zeros(3, np.float32)], {}), TypeError,
         r"params must be a dict of float32 arrays by name \(model\.params\), got list"),
        ("AdamW-grads", lambda: AdamW({"w": np.zeros(3, np.float32)}, None), TypeError,
         r"grads must be a dict of float32 arrays by name \(model\.grads\), got NoneType"),
        ("AdamW-dtype", lambda: AdamW({"w": np.zeros(3)}, {"w": np.zeros(3)}), TypeError,
         r"params\['w'\] must be a float32 array, got dtype float64"),
        ("AdamW-names", lambda: AdamW({"w": np.zeros(3, np.float32)},
                                      {"v": np.zeros(3, np.float32)}), ValueError,
         r"grads must have the parameters' names: missing \['w'\], extra \['v'\]"),
        ("AdamW-shape", lambda: AdamW({"w": np.zeros(3, np.float32)},
                                      {"w": np.zeros(4, np.float32)}), ValueError,
         r"grads\['w'\] must have its parameter's shape \(3,\), got \(4,\)"),
        ("AdamW-list", lambda: AdamW({"w": np.zeros(3, np.float32)}, {"w": [0.0] * 3}),
         TypeError, r"grads\['w'\] must be a float32 array, got list"),
        ("step-lr", lambda: opt.step(lr=2.0), ValueError,
         r"lr must be at most 1 \(an AdamW step moves a parameter by about lr\), got 2\.0"),
        ("clip-list", lambda: clip_grad_norm([np.zeros(3, np.float32)], 1.0), TypeError,
         r"grads must be a dict of float32 arrays by name \(model\.grads\), got list"),
        ("clip-dtype", lambda: clip_grad_norm({"w": np.zeros(3)}, 1.0), TypeError,
         r"grads\['w'\] must be a float32 array, got dtype float64"),
        ("clip-flag", lambda: clip_grad_norm(m.grads, 1.0, error_if_nonfinite=None), TypeError,
         r"error_if_nonfinite must be a bool \(True or False\), got NoneType"),
    ]
    return cases


CASE_IDS = [c[0] for c in calls(GPT(CFG))]


@pytest.mark.parametrize("case", CASE_IDS)
def test_every_public_entry_point_names_the_argument_and_what_it_should_be(model, case):
    _, call, kind, message = next(c for c in calls(model) if c[0] == case)
    with pytest.raises(kind, match=message):
        call()


def test_empty_ids_still_run(model):
    """The checks refuse what cannot be token ids, not what the kernels take: no tokens."""
    logits, loss = model.forward(np.zeros((2, 0), np.int64), np.zeros((2, 0), np.int64),
                                 save=False)
    assert logits.shape == (2, 0, CFG.vocab) and float(loss) == 0.0


# ---- GPT.decode's caches -----------------------------------------------------------------------


def test_decode_with_its_caches_equals_the_forward_pass(model):
    full, _ = model.forward(IDS)
    caches = model.new_caches(2)
    first, then = np.ascontiguousarray(IDS[:, :2]), np.ascontiguousarray(IDS[:, 2:])
    got = np.concatenate([model.decode(first, caches), model.decode(then, caches)], 1)
    np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad, kind, message", [
    (lambda m: m.new_caches(2)[:1], ValueError,
     r"caches must be a list of 3 KVCaches, one per block \(GPT\.new_caches\), got 1"),
    (lambda m: m.new_caches(2) * 2, ValueError, r"caches must be a list of 3 KVCaches.*got 6"),
    (lambda m: m.new_caches(2)[0], TypeError, "caches must be a list of 3 KVCaches.*got KVCache"),
    (lambda m: m.new_caches(2)[:2] + [None], TypeError, "caches.2. must be a KVCache, got None"),
    (lambda m: m.new_caches(1), ValueError,
     r"caches\[0\] holds \(batch, n_head, head_dim\) = \(1, 2, 4\), but idx's batch and this "
     r"model's heads need \(2, 2, 4\) \(GPT\.new_caches\(2\)\)"),
    (lambda m: m.new_caches(2)[:2] + [KVCache(2, 8, 4, 2)], ValueError,
     r"caches\[2\] holds \(batch, n_head, head_dim\) = \(2, 4, 2\)"),
    (lambda m: m.new_caches(2, max_len=2), ValueError,
     r"caches\[0\] has room for 2 positions; 0 are filled, 3 new ones do not fit"),
])
def test_decode_refuses_caches_that_are_not_the_models_before_writing(model, bad, kind, message):
    caches = bad(model)
    with pytest.raises(kind, match="GPT.decode: " + message):
        model.decode(IDS, caches)
    for cache in caches if isinstance(caches, list) else [caches]:
        assert cache is None or len(cache) == 0  # nothing appended


def test_decode_refuses_caches_filled_unevenly(model):
    caches = model.new_caches(2)
    model.decode(IDS[:, :1].copy(), caches)
    caches[1].reset()
    with pytest.raises(ValueError, match=r"caches\[1\] holds 0 positions but caches\[0\] holds 1"):
        model.decode(IDS[:, 1:2].copy(), caches)


# ---- non-finite logits ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_non_finite_logits_are_an_error_as_in_c(value, temperature):
    logits = np.zeros((2, 5), np.float32)
    logits[1, 3] = value
    with pytest.raises(ValueError, match=rf"logits must be finite, got logits\[1, 3\] = {value}"):
        sample_next(logits, np.random.default_rng(0), temperature)


def test_generate_from_a_model_with_nan_parameters_says_so():
    m = GPT(CFG)
    m.params["transformer.ln_f.bias"][0] = np.nan
    with pytest.raises(ValueError, match=r"generate: the model's logits for new token 0 \(of 2\)"
                       r": logits must be finite.*are its parameters finite\?"):
        generate(m, IDS, 2, temperature=0.0)


# ---- one model, two threads ---------------------------------------------------------------------


def train_step(m, x):
    m.zero_grad()
    m.forward(x, x)
    m.backward()
    return m.grads.buffer.copy()


def test_a_model_trained_from_two_threads_at_once_is_refused():
    """Thread A trains (and lives on); thread B's first training call is refused, naming both,
    while forward(save=False), decode and generate run in B; A's gradients are A's alone."""
    m = GPT(CFG)
    alone = train_step(GPT(CFG), IDS)
    a_started, b_done, errors, reads = threading.Event(), threading.Event(), [], []

    def a():
        train_step(m, IDS)
        a_started.set()
        b_done.wait(60)
        reads.append(train_step(m, IDS))

    def b():
        a_started.wait(60)
        reads.append(m.forward(IDS, save=False)[0].shape)
        reads.append(generate(m, IDS[:, :1], 2, temperature=0.0).shape)
        for call in (m.zero_grad, lambda: m.forward(IDS, IDS), m.backward):
            try:
                call()
            except RuntimeError as e:
                errors.append(str(e))
        b_done.set()

    threads = [threading.Thread(target=a, name="A"), threading.Thread(target=b, name="B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(errors) == 3, errors
    for error, what in zip(errors, ("zero_grad", "forward", "backward")):
        assert error.startswith(f"GPT.{what}() in thread 'B': this model is being trained by "
                                "thread 'A'"), error
    assert reads[:2] == [(2, 3, CFG.vocab), (2, 3)]
    np.testing.assert_array_equal(reads[2], alone)


def test_training_is_handed_over_when_the_thread_ends_or_releases_it():
    m = GPT(CFG)
    alone = train_step(GPT(CFG), IDS)
    train_step(m, IDS)  # this thread trains it now
    got = []
    t = threading.Thread(target=lambda: got.append(pytest.raises(RuntimeError, m.zero_grad)))
    t.start()
    t.join(60)
    assert got and "is being trained by thread 'MainThread'" in str(got[0].value)
    m.release_thread()
    t = threading.Thread(target=lambda: got.append(train_step(m, IDS)))
    t.start()
    t.join(60)
    np.testing.assert_array_equal(got[1], alone)  # and that thread has ended: ours again
    np.testing.assert_array_equal(train_step(m, IDS), alone)


def test_two_threads_racing_to_train_one_model_never_give_wrong_gradients():
    """Both threads loop over whole steps; each step either is refused or gives the gradients
    of its own batch, never a mixture (unchecked, about half the snapshots were wrong)."""
    m, ref = GPT(CFG), GPT(CFG)
    batches = [IDS, (IDS + 7) % CFG.vocab]
    want = [train_step(ref, x) for x in batches]
    wrong, refused, done = [], [], []
    tried = threading.Barrier(2)  # both made a first step's try: they overlap

    def worker(i):
        for step in range(40):
            try:
                got = train_step(m, batches[i])
            except RuntimeError:
                refused.append(i)
            else:
                done.append(i)
                if not np.array_equal(got, want[i]):
                    wrong.append(i)
            if step == 0:
                tried.wait(60)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not wrong and refused and done, (len(wrong), len(refused), len(done))


# ---- gradients that are not finite, and AdamW's hyper-parameters --------------------------------


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_clip_grad_norm_reports_non_finite_gradients_and_leaves_them_be(value):
    m = GPT(CFG)
    train_step(m, IDS)
    name = "transformer.h.1.mlp.c_fc.weight"
    m.grads[name][2, 3] = value
    before = m.grads.buffer.copy()
    with pytest.raises(RuntimeError, match=rf"the gradients' total norm is {value}: '{name}' "
                       r"holds NaN or inf \(error_if_nonfinite=True\)"):
        clip_grad_norm(m.grads, 1e-3, error_if_nonfinite=True)
    np.testing.assert_array_equal(m.grads.buffer, before)  # nothing scaled
    norm = clip_grad_norm(m.grads, 1e-3)  # the default reports it in the norm
    assert str(float(norm)) == str(value)
    np.testing.assert_array_equal(m.grads.buffer, before)  # an inf is not turned into NaN
    plain = {k: v.copy() for k, v in m.grads.items()}  # a dict, not a FlatDict: the same
    assert str(float(clip_grad_norm(plain, 1e-3))) == str(value)
    with pytest.raises(RuntimeError, match=f"'{name}' holds NaN or inf"):
        clip_grad_norm(plain, 1e-3, error_if_nonfinite=True)


def test_clip_grad_norm_of_finite_gradients_is_unchanged():
    m = GPT(CFG)
    train_step(m, IDS)
    g = m.grads.buffer.astype(np.float64)
    norm = clip_grad_norm(m.grads, 1e-3, error_if_nonfinite=True)
    assert float(norm) == pytest.approx(np.sqrt((g * g).sum()), rel=1e-12)
    scale = np.float32(1e-3 / (float(norm) + 1e-6))
    np.testing.assert_array_equal(m.grads.buffer, (g.astype(np.float32) * scale))


@pytest.mark.parametrize("kwargs, message", [
    (dict(lr=1e308), r"lr must be at most 1 \(an AdamW step moves a parameter by about lr\), "
                     r"got 1e\+308"),
    (dict(lr=1.5), r"lr must be at most 1 .*got 1\.5"),
    (dict(lr=float("inf")), r"lr must be finite and >= 0, got inf"),
    (dict(lr=-1e-3), r"lr must be finite and >= 0, got -0\.001"),
    (dict(lr=0.5, weight_decay=3.0), r"lr \* weight_decay must be <= 1 \(each step multiplies "
                                     r"the parameters by 1 - lr \* weight_decay\), got 0\.5 \* 3"),
    (dict(betas=(1.0, 0.9)), r"betas\[0\] must be in \[0, 1\), got 1\.0"),
    (dict(betas=(0.9, -0.1)), r"betas\[1\] must be in \[0, 1\), got -0\.1"),
    (dict(betas=(0.9, float("nan"))), r"betas\[1\] must be in \[0, 1\), got nan"),
    (dict(eps=0.0), r"eps must be finite and > 0, got 0\.0"),
    (dict(eps=float("inf")), r"eps must be finite and > 0, got inf"),
    (dict(weight_decay=-0.1), r"weight_decay must be finite and >= 0, got -0\.1"),
    (dict(weight_decay=float("nan")), r"weight_decay must be finite and >= 0, got nan"),
])
def test_adamw_refuses_hyper_parameters_out_of_their_range(kwargs, message):
    m = GPT(CFG)
    with pytest.raises(ValueError, match=message):
        AdamW(m.params, m.grads, **kwargs)


def test_adamw_takes_the_edges_of_its_ranges_and_stays_finite():
    m = GPT(CFG)
    opt = AdamW(m.params, m.grads, lr=1.0, betas=(0.0, 0.0), eps=1e-30, weight_decay=1.0)
    train_step(m, IDS)
    opt.step()
    opt.step(lr=0.0)
    assert np.isfinite(m.params.buffer).all()
    with pytest.raises(ValueError, match="lr must be at most 1"):
        opt.step(lr=1e308)


# ---- a save keeps the mode of the file it replaces ----------------------------------------------


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("kept", [0o600, 0o444, 0o640, 0o755])
def test_a_save_keeps_the_mode_of_the_checkpoint_it_replaces(tmp_path, kept):
    path = str(tmp_path / "m.safetensors")
    checkpoint.save(path, GPT(CFG), 1)
    os.chmod(path, kept)
    checkpoint.save(path, GPT(CFG), 2)
    assert mode(path) == kept and checkpoint.load(path)[1] == 2


@pytest.mark.parametrize("umask, want", [(0o022, 0o644), (0o077, 0o600), (0o027, 0o640)])
def test_a_new_checkpoint_honours_the_umask(tmp_path, umask, want):
    old = os.umask(umask)
    try:
        checkpoint.save(str(tmp_path / "m.safetensors"), GPT(CFG))
    finally:
        os.umask(old)
    assert mode(tmp_path / "m.safetensors") == want


def test_a_save_over_a_symlink_replaces_the_link_with_a_file_of_the_targets_mode(tmp_path):
    target, link = tmp_path / "private.safetensors", tmp_path / "m.safetensors"
    checkpoint.save(str(target), GPT(CFG), 1)
    os.chmod(target, 0o600)
    link.symlink_to(target)
    checkpoint.save(str(link), GPT(CFG), 2)
    assert not link.is_symlink() and mode(link) == 0o600
    assert checkpoint.load(str(target))[1] == 1 and checkpoint.load(str(link))[1] == 2
    dangling = tmp_path / "dangling.safetensors"
    dangling.symlink_to(tmp_path / "nowhere")
    checkpoint.save(str(dangling), GPT(CFG), 3)  # a new file: the umask's mode
    assert not dangling.is_symlink() and checkpoint.load(str(dangling))[1] == 3


# ---- a folder saved as a whole ------------------------------------------------------------------

# Version v of a GPT-2 folder differs in each of its files: config.json (vocab 300 + v), the
# weights (every parameter v + 1), vocab.json and merges.txt (a tokenizer of 257 + v tokens).
VERSIONS = """
import numpy as np
from pytfm import gpt2
from pytfm.nn import GPT, GPTConfig
from pytfm.tokenizer import train

TEXT = bytes(range(32, 127)) * 4

def version(v):
    model = GPT(GPTConfig(vocab=300 + v, d_model=8, n_layer=1, n_head=2, max_seq=8,
                          pos="learned"))
    model.params.buffer[...] = v + 1
    return model, train(TEXT, 257 + v)
"""


def versions():
    scope = {}
    exec(VERSIONS, scope)
    return scope["version"]


def version_in(folder, tokenizer=True):
    """The version the folder holds, failing on a mix of two."""
    from pytfm import gpt2

    model = gpt2.load(folder)  # config.json and the weights, read from one folder
    v = model.cfg.vocab - 300
    assert all((a == v + 1).all() for a in model.params.values())
    if tokenizer:
        assert len(gpt2.load_tokenizer(folder)) == 257 + v
    return v


def leftovers(parent):
    return sorted(f for f in os.listdir(parent) if f.startswith(".tmp-"))


def python(script, *args):
    from helpers import python_path

    env = dict(os.environ, PYTHONPATH=python_path(os.path.dirname(os.path.dirname(
        checkpoint.__file__))))
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, cwd="/",
                            stdout=subprocess.PIPE, text=True)


SAVER = VERSIONS + """
import sys
folder, first = sys.argv[1], int(sys.argv[2])
models = [version(first), version(first + 1)]
for step in range(10**9):
    gpt2.save(models[step % 2][0], folder, tokenizer=models[step % 2][1])
    print(step, flush=True)
"""


def test_a_folder_save_killed_at_any_moment_leaves_the_old_folder_or_the_new(tmp_path):
    folder = str(tmp_path / "g2")
    model, tok = versions()(0)
    gpt2.save(model, folder, tokenizer=tok)
    (tmp_path / "g2" / "README.md").write_text("kept")
    caught, rng = 0, np.random.default_rng(0)
    for _ in range(12):
        saver = python(SAVER, folder, "0")
        saver.stdout.readline()  # it is saving
        time.sleep(rng.uniform(0, 0.05))
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        saver.stdout.close()
        caught += bool(leftovers(tmp_path))  # killed midway: its temporary folder is there
        assert version_in(folder) in (0, 1)
        assert (tmp_path / "g2" / "README.md").read_text() == "kept"
        if caught >= 3:
            break
    assert caught, "no kill landed while a save was midway"
    gpt2.save(model, folder, tokenizer=tok)  # the next save removes what killed ones left
    assert leftovers(tmp_path) == [] and version_in(folder) == 0
    assert sorted(os.listdir(folder)) == ["README.md", "config.json", "merges.txt",
                                          "model.safetensors", "vocab.json"]


def test_two_threads_saving_one_folder_never_mix_it(tmp_path):
    folder = str(tmp_path / "g2")
    made = [versions()(v) for v in range(2)]
    gpt2.save(made[0][0], folder, tokenizer=made[0][1])
    errors, seen = [], set()

    def save(v):
        try:
            for _ in range(8):
                gpt2.save(made[v][0], folder, tokenizer=made[v][1])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=save, args=(v,)) for v in range(2)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen.add(version_in(folder, tokenizer=False))  # a reader meanwhile: never a mix
    for t in threads:
        t.join()
    assert not errors and seen <= {0, 1}
    assert version_in(folder) in (0, 1) and leftovers(tmp_path) == []


def test_two_processes_saving_one_folder_never_mix_it(tmp_path):
    folder = str(tmp_path / "g2")
    model, tok = versions()(0)
    gpt2.save(model, folder, tokenizer=tok)
    savers = [python(SAVER, folder, str(first)) for first in (0, 2)]
    try:
        for saver in savers:
            saver.stdout.readline()
        seen = {version_in(folder, tokenizer=False) for _ in range(30)}
    finally:
        for saver in savers:
            saver.send_signal(signal.SIGKILL)
            saver.wait()
            saver.stdout.close()
    assert seen <= {0, 1, 2, 3} and version_in(folder) in (0, 1, 2, 3)


def test_a_folder_save_keeps_the_modes_and_the_files_it_does_not_write(tmp_path, monkeypatch):
    folder = tmp_path / "g2"
    model, tok = versions()(0)
    gpt2.save(model, str(folder), tokenizer=tok)
    (folder / "README.md").write_text("kept")
    (folder / "extra").mkdir()
    (folder / "extra" / "notes.txt").write_text("kept too")
    os.chmod(folder, 0o750)
    os.chmod(folder / "vocab.json", 0o600)
    os.chmod(folder / "README.md", 0o640)
    link = tmp_path / "link"
    link.symlink_to(folder)
    model, tok = versions()(1)
    gpt2.save(model, str(link), tokenizer=tok)  # saved where the link points
    assert link.is_symlink() and version_in(str(folder)) == 1
    assert mode(folder) == 0o750 and mode(folder / "vocab.json") == 0o600
    assert mode(folder / "README.md") == 0o640 and (folder / "README.md").read_text() == "kept"
    assert (folder / "extra" / "notes.txt").read_text() == "kept too"
    old = os.umask(0o077)
    try:
        tok.save(str(tmp_path / "new"))  # a new folder and files: the umask's modes
    finally:
        os.umask(old)
    assert mode(tmp_path / "new") == 0o700 and mode(tmp_path / "new" / "merges.txt") == 0o600
    monkeypatch.chdir(folder)
    versions()(0)[1].save(".")  # the working folder: this process follows it to the new one
    assert os.path.samefile(".", folder) and len(gpt2.load_tokenizer(".")) == 257
    assert leftovers(tmp_path) == []


def test_rename_exchange_swaps_two_folders_at_once(tmp_path):
    import errno

    from pytfm._core import ffi, lib

    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "name").write_text(folder.name)
    assert lib.pytfm_rename_exchange(bytes(a), bytes(b)) == lib.PYTFM_STATUS_OK
    assert (a / "name").read_text() == "b" and (b / "name").read_text() == "a"
    status = lib.pytfm_rename_exchange(bytes(a), bytes(tmp_path / "missing"))
    assert status == lib.PYTFM_STATUS_INVALID_ARGUMENT and ffi.errno == errno.ENOENT
    assert "cannot exchange" in ffi.string(lib.pytfm_last_error()).decode()


def test_without_rename_exchange_a_folder_is_set_aside_and_put_back_if_killed(tmp_path,
                                                                            monkeypatch):
    """Where the file system cannot exchange two folders, the old one is renamed aside and the
    new one into place; a save killed between the two leaves the old one aside, and the next
    save puts it back before it carries its files over."""
    from pytfm import _atomic
    from pytfm._core import lib

    class NoExchange:
        def __getattr__(self, name):
            return getattr(lib, name)

        def pytfm_rename_exchange(self, a, b):
            return lib.PYTFM_STATUS_NOT_SUPPORTED

    monkeypatch.setattr(_atomic, "lib", NoExchange())
    folder = tmp_path / "g2"
    made = [versions()(v) for v in range(2)]
    gpt2.save(made[0][0], str(folder), tokenizer=made[0][1])
    (folder / "README.md").write_text("kept")
    gpt2.save(made[1][0], str(folder), tokenizer=made[1][1])
    assert version_in(str(folder)) == 1 and (folder / "README.md").read_text() == "kept"
    os.rename(folder, tmp_path / ".tmp-g2.old-0123456789abcdef")  # killed between the renames
    gpt2.save(made[0][0], str(folder))  # the model only: the tokenizer is the old folder's
    assert version_in(str(folder), tokenizer=False) == 0
    assert len(gpt2.load_tokenizer(str(folder))) == 258
    assert (folder / "README.md").read_text() == "kept" and leftovers(tmp_path) == []


# ---- a text's memory -----------------------------------------------------------------------------


def test_a_byte_corpus_is_its_bytes_and_batches_are_int64_windows():
    text = b"def f(x):\n    return x + 1\n" * 40
    tokens = np.frombuffer(text, np.uint8)
    assert data.stdlib_corpus(10_000).dtype == np.uint8
    wide = data.Batches(tokens.astype(np.int64), 16, 4, seed=3)
    narrow = data.Batches(tokens, 16, 4, seed=3)
    for split, step in (("train", 0), ("train", 7), ("val", 2)):
        for a, b in zip(narrow.batch(split, step), wide.batch(split, step)):
            assert a.dtype == np.int64 and a.flags.c_contiguous
            np.testing.assert_array_equal(a, b)


def test_text_corpus_reads_a_file_or_an_open_file_once(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"hello, world\n" * 10)
    assert data.text_corpus(str(path)).tobytes() == path.read_bytes()
    with open(path, "rb") as f:
        f.read(5)
        assert data.text_corpus(f).tobytes() == path.read_bytes()[5:]
    with pytest.raises(ValueError, match="needs at least 2 bytes of text, got 1"):
        (tmp_path / "one").write_bytes(b"x")
        data.text_corpus(str(tmp_path / "one"))


def test_a_text_over_its_limit_is_refused_before_it_is_read(tmp_path):
    """A regular file by its size, without reading a byte (a sparse terabyte here); an input
    of unknown size once it passes the limit (an endless one: /dev/zero)."""
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(2**40)
    with pytest.raises(data.TextTooLarge, match="is 1,099,511,627,776 bytes, more than the "
                       "1,000,000 allowed"):
        data.text_corpus(str(huge), max_bytes=10**6)
    with pytest.raises(data.TextTooLarge, match="/dev/zero gives more than the 3,000,000 bytes "
                       r"allowed \(an endless input\?\)"):
        data.text_corpus("/dev/zero", max_bytes=3 * 10**6)
    r, w = os.pipe()
    os.write(w, b"0123456789")
    os.close(w)
    with open(r, "rb", buffering=0) as f:
        assert data.text_corpus(f, max_bytes=10).tobytes() == b"0123456789"


def peak_rss(text_path, tmp_path, name):
    """train_tiny's peak resident memory (bytes) for one step on the text (Linux's ru_maxrss
    is in KiB), in a process of its own."""
    code = (f"import resource, runpy, sys; sys.argv = {['train_tiny.py', '--text', text_path]!r}"
            f" + sys.argv[1:]; sys.path.insert(0, {os.path.join(ROOT, 'examples')!r})\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print('peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    r = subprocess.run([sys.executable, "-c", code, "--out", str(tmp_path / name), "--steps", "1",
                        "--d-model", "16", "--n-layer", "1", "--n-head", "2", "--context", "16",
                        "--batch", "2", "--sample-tokens", "0", "--force"],
                       capture_output=True, text=True, cwd=os.path.join(ROOT, "examples"),
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return int(r.stdout.split("peak")[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB: Linux")
def test_training_on_a_text_takes_about_the_texts_size_in_memory(tmp_path):
    """What each byte of text adds to train_tiny's peak RSS, between a 64 MiB and a 128 MiB
    text (both large enough for the text to make the peak): at most 1.5 bytes. The text's
    bytes once, and windows per batch; an int64 copy of the text alone would be 8."""
    size, line = 64 * 2**20, b"def f(x):\n    return x + 1  # a line of Python, 48 bytes long\n"
    peaks = []
    for n in (1, 2):
        path = tmp_path / f"text{n}.txt"
        with open(path, "wb") as f:
            f.write(line * (n * size // len(line)))
        peaks.append(peak_rss(str(path), tmp_path, f"out{n}"))
        path.unlink()
    per_byte = (peaks[1] - peaks[0]) / (size // len(line) * len(line))
    assert per_byte <= 1.5, f"{per_byte:.2f} bytes of memory per byte of text ({peaks})"


# ---- the thread count from the environment ------------------------------------------------------


@pytest.mark.parametrize("value, message", [
    (value, f"PYTFM_NUM_THREADS='{value}': it must be an integer in [0, 2147483647] (0: the "
            "default)") for value in ("2147483648", "-1", "3x")] + [
    ("4", None)])
def test_a_thread_count_out_of_range_gets_a_true_message(value, message):
    r = run_python("import pytfm", PYTFM_NUM_THREADS=value)
    if message is None:
        assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    else:  # the C library's one reading, raised as ValueError, with no stderr line of its own
        assert r.returncode != 0 and message in r.stderr and "ignored" not in r.stderr, \
            r.stderr[-2000:]
