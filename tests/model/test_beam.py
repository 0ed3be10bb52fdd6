"""pytfm.beam: greedy decoding and beam search, on a toy model of the decoding protocol and on
the encoder–decoder (pytfm.seq2seq).

The toy's next-token logits are a fixed random function of (the source's first token, the
whole prefix so far), so a beam whose rows are mixed up by a wrong reorder gets other logits
than the exhaustive search that the tests compare it with. The exhaustive search enumerates
every hypothesis (every sequence ending at its first EOS within max_len tokens, and every
max_len-token sequence without EOS) and scores it as beam_search's docstring says."""

import hashlib
import itertools
import sys

import numpy as np
import pytest

from pytfm.beam import beam_search, greedy_decode
from pytfm.seq2seq import Seq2SeqConfig, Transformer


class ToyState:
    def __init__(self, keys, max_len):
        self.keys = np.asarray(keys, np.int64)  # (rows,): which table each row reads
        self.prefix = [[] for _ in self.keys]  # the tokens fed so far, per row
        self.max_len = max_len

    def reorder(self, index):
        index = np.asarray(index)
        assert index.dtype == np.int64 and index.ndim == 1
        assert ((0 <= index) & (index < len(self.keys))).all()
        self.keys = self.keys[index]
        self.prefix = [list(self.prefix[i]) for i in index]


class ToyModel:
    """The decoding protocol over a vocabulary of V tokens; logits float32, from a hash of
    (src[b, 0], the fed tokens). eos_bias makes EOS likelier (hypotheses of every length).
    cfg.tgt_vocab says V, as pytfm.seq2seq's does (say_vocab=False: a model that does not)."""

    def __init__(self, V, seed=0, eos=1, eos_bias=0.0, scale=2.0, say_vocab=True):
        self.V, self.seed, self.eos, self.eos_bias, self.scale = V, seed, eos, eos_bias, scale
        self.cfg = type("Cfg", (), {"tgt_vocab": V})() if say_vocab else None
        self.steps = []  # rows per decode_step call

    def logits(self, key, fed):
        h = hashlib.sha256(repr((self.seed, int(key), [int(t) for t in fed])).encode())
        rng = np.random.default_rng(int.from_bytes(h.digest()[:8], "little"))
        z = rng.normal(size=self.V) * self.scale
        z[self.eos] += self.eos_bias
        return z.astype(np.float32)

    def start_decode(self, src, src_lens=None, max_len=None):
        self.steps = []
        return ToyState(np.asarray(src)[:, 0], max_len)

    def decode_step(self, state, tokens):
        tokens = np.asarray(tokens)
        assert tokens.dtype == np.int64 and tokens.shape == (len(state.keys),)
        assert ((0 <= tokens) & (tokens < self.V)).all()
        for p, t in zip(state.prefix, tokens):
            p.append(int(t))
            assert len(p) <= state.max_len  # never past the cache start_decode sized
        self.steps.append(len(tokens))
        return np.stack([self.logits(k, p) for k, p in zip(state.keys, state.prefix)])


def log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def exhaustive(model, key, bos, eos, max_len, alpha):
    """Every hypothesis of the sentence whose source starts with key, as (score, ids), best
    first (ties: shorter first, then by ids)."""
    hyps = []

    def walk(ids, raw):
        logp = log_softmax(model.logits(key, [bos] + ids))
        for y in range(model.V):
            seq, s = ids + [y], raw + logp[y]
            if y == eos or len(seq) == max_len:
                hyps.append((s / ((5 + len(seq)) / 6) ** alpha, seq))
            else:
                walk(seq, s)

    walk([], 0.0)
    return sorted(hyps, key=lambda h: (-h[0], len(h[1]), h[1]))


def plain_beam(model, key, bos, eos, k, max_len, alpha):
    """beam_search's docstring, one sentence, written plainly and without stopping early: every
    step to max_len (or until nothing is alive). -> (score, ids) best first."""
    alive, finished = [(0.0, [])], []
    for t in range(1, max_len + 1):
        cands = []
        for row, (s, ids) in enumerate(alive):
            logp = log_softmax(model.logits(key, [bos] + ids))
            cands += [(s + logp[y], row, y, ids + [y]) for y in range(model.V)]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        finished += [(c[0] / ((5 + t) / 6) ** alpha, c[3]) for c in cands[:k]
                     if c[2] == eos or t == max_len]
        alive = [(c[0], c[3]) for c in cands if c[2] != eos][:k]
        if not alive:
            break
    return sorted(finished, key=lambda h: -h[0])[:k]  # stable: the first found first


def assert_hypotheses_equal(got, want):
    """got: beam_search's list for one sentence; want: (score, ids) best first."""
    assert [ids for ids, _ in got] == [ids for _, ids in want]
    np.testing.assert_allclose([s for _, s in got], [s for s, _ in want], rtol=1e-12, atol=0)


SRC = np.array([[3, 0], [7, 2], [3, 1], [11, 5]], np.int64)  # rows 0 and 2 are the same key


@pytest.mark.parametrize("V,max_len", [(4, 2), (3, 4), (4, 3), (2, 6)])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.5, -0.7])
def test_a_beam_keeping_every_prefix_finds_the_exhaustive_ranking(V, max_len, alpha):
    """beam = V ** (max_len - 1) drops no prefix: the whole returned list (not only the best)
    is the exhaustive ranking's top `beam`."""
    model = ToyModel(V, seed=V * 10 + max_len, eos=1, eos_bias=1.0)
    k = V ** (max_len - 1)
    got = beam_search(model, SRC, bos=0, eos=1, beam=k, max_len=max_len, length_penalty=alpha)
    assert len(got) == len(SRC)
    for b, hyps in enumerate(got):
        want = exhaustive(model, SRC[b, 0], 0, 1, max_len, alpha)
        assert_hypotheses_equal(hyps, want[:k])
    assert all(rows <= len(SRC) * k for rows in model.steps)  # one call per step for the batch
    assert len(model.steps) <= max_len


@pytest.mark.parametrize("beam", [1, 2, 3, 6])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5, -0.5])
@pytest.mark.parametrize("seed", range(3))
def test_a_narrow_beam_is_the_plain_search_and_stopping_early_changes_nothing(beam, alpha, seed):
    """Beams narrower than the tree (prefixes are dropped), against plain_beam, which runs to
    max_len: same hypotheses in the same order, so the early stop lost nothing."""
    model = ToyModel(5, seed=100 + seed, eos=2, eos_bias=0.5 * seed)
    got = beam_search(model, SRC, bos=0, eos=2, beam=beam, max_len=8, length_penalty=alpha)
    for b, hyps in enumerate(got):
        assert_hypotheses_equal(hyps, plain_beam(model, SRC[b, 0], 0, 2, beam, 8, alpha))
    if alpha == 0.0 and seed == 2 and beam <= 3:  # EOS likely: all settle before max_len
        assert len(model.steps) < 8


def test_length_penalty_changes_the_winner_and_the_search_follows():
    """The toy is chosen so that alpha = 0 and alpha = 2 prefer hypotheses of different
    lengths: the exhaustive test above is then not passing by always picking one length."""
    for seed in range(40):
        model = ToyModel(4, seed=seed, eos=1, eos_bias=0.5)
        bests = [exhaustive(model, 3, 0, 1, 3, a)[0][1] for a in (0.0, 2.0)]
        if len(bests[0]) != len(bests[1]):
            break
    else:
        pytest.fail("no seed in 0..39 where the length penalty changes the winner's length")
    for a, best in zip((0.0, 2.0), bests):
        got = beam_search(model, SRC[:1], bos=0, eos=1, beam=16, max_len=3, length_penalty=a)
        assert got[0][0][0] == best


@pytest.mark.parametrize("beam", [1, 2, 3, 5])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_scores_are_best_first_and_match_the_ids(beam, alpha):
    """Each returned score is the formula's value for its ids (recomputed from the toy's
    logits), the list is non-increasing, at most `beam` long, ids distinct."""
    model = ToyModel(6, seed=1, eos=2, eos_bias=0.8)
    got = beam_search(model, SRC, bos=0, eos=2, beam=beam, max_len=7, length_penalty=alpha)
    for b, hyps in enumerate(got):
        assert 1 <= len(hyps) <= beam
        scores = [s for _, s in hyps]
        assert all(x >= y for x, y in zip(scores, scores[1:])), scores
        assert len({tuple(ids) for ids, _ in hyps}) == len(hyps)
        for ids, s in hyps:
            assert 1 <= len(ids) <= 7 and 2 not in ids[:-1]
            assert ids[-1] == 2 or len(ids) == 7
            raw = sum(log_softmax(model.logits(SRC[b, 0], [0] + ids[:t]))[y]
                      for t, y in enumerate(ids))
            assert s == pytest.approx(raw / ((5 + len(ids)) / 6) ** alpha, rel=1e-12)


@pytest.mark.parametrize("beam,alpha", [(1, 0.0), (3, 0.0), (3, 0.6), (4, 1.0)])
def test_a_batch_gives_what_each_sentence_gives_alone(beam, alpha):
    model = ToyModel(7, seed=2, eos=3, eos_bias=0.3)
    kw = dict(bos=0, eos=3, beam=beam, max_len=6, length_penalty=alpha)
    batched = beam_search(model, SRC, **kw)
    alone = [beam_search(model, SRC[b:b + 1], **kw)[0] for b in range(len(SRC))]
    assert batched == alone
    assert batched[0] == batched[2]  # the same key, the same result
    greedy = greedy_decode(model, SRC, bos=0, eos=3, max_len=6)
    assert greedy == [greedy_decode(model, SRC[b:b + 1], bos=0, eos=3, max_len=6)[0]
                      for b in range(len(SRC))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_len", [1, 2, 5, 9])
def test_greedy_is_beam_one_without_length_penalty(seed, max_len):
    model = ToyModel(5, seed=seed, eos=4, eos_bias=0.4 * seed - 1.0)
    greedy = greedy_decode(model, SRC, bos=0, eos=4, max_len=max_len)
    beam = beam_search(model, SRC, bos=0, eos=4, beam=1, max_len=max_len, length_penalty=0)
    assert [h[0][0] for h in beam] == greedy
    for b, ids in enumerate(greedy):  # each token the argmax after its prefix
        for t, y in enumerate(ids):
            assert y == int(np.argmax(model.logits(SRC[b, 0], [0] + ids[:t])))
        assert (ids[-1] == 4 and 4 not in ids[:-1]) or (len(ids) == max_len and 4 not in ids)


def test_finished_sentences_leave_the_batch():
    """A sentence whose hypotheses are settled stops costing rows: the rows per step fall."""
    model = ToyModel(6, seed=3, eos=1, eos_bias=0.0)
    src = np.array([[k, 0] for k in range(8)], np.int64)
    greedy_decode(model, src, bos=0, eos=1, max_len=30)
    assert model.steps[0] == 8 and model.steps[-1] < 8
    assert model.steps == sorted(model.steps, reverse=True)
    beam_search(model, src, bos=0, eos=1, beam=3, max_len=30, length_penalty=0.0)
    assert model.steps[:2] == [8, 24] and model.steps[-1] < 24 and len(model.steps) < 30


def test_an_empty_batch_decodes_nothing():
    model = ToyModel(4)
    src = np.zeros((0, 3), np.int64)
    assert greedy_decode(model, src, bos=0, eos=1, max_len=4) == []
    assert beam_search(model, src, bos=0, eos=1, max_len=4) == []


@pytest.mark.parametrize("kw,words", [
    (dict(beam=0), ["beam must be >= 1, got 0"]),
    (dict(beam=-2), ["beam must be >= 1, got -2"]),
    (dict(beam=2.0), ["beam must be an integer"]),
    (dict(max_len=0), ["max_len must be >= 1", "got 0"]),
    (dict(max_len=-1), ["max_len must be >= 1", "got -1"]),
    (dict(bos=-1), ["bos must be a target token id", "got -1"]),
    (dict(bos=4), ["bos must be a target token id in [0, 4), got 4"]),
    (dict(eos=9), ["eos must be a target token id in [0, 4), got 9"]),
    (dict(eos=-3), ["eos must be a target token id", "got -3"]),
    (dict(length_penalty=float("nan")), ["length_penalty"]),
    (dict(length_penalty=float("inf")), ["length_penalty must be finite"]),
])
def test_bad_arguments_raise_naming_them(kw, words):
    args = dict(bos=0, eos=1, beam=2, max_len=3, length_penalty=0.6) | kw
    cls = TypeError if words == ["beam must be an integer"] else ValueError
    for decode in (beam_search, greedy_decode):
        if decode is greedy_decode:
            if "beam" in kw or "length_penalty" in kw:
                continue
            args = {k: v for k, v in args.items() if k not in ("beam", "length_penalty")}
        with pytest.raises(cls) as e:
            decode(ToyModel(4), SRC, **args)
        for word in words:
            assert word in str(e.value)


def test_ids_are_checked_before_any_step_or_at_the_first_without_cfg():
    """A model with cfg.tgt_vocab: before start_decode. Without: the first logits give V, and
    an eos past it is refused then (a bos past it reaches the model first: its own check)."""
    model = ToyModel(4)
    with pytest.raises(ValueError, match=r"bos must be a target token id in \[0, 4\), got 4"):
        greedy_decode(model, SRC, bos=4, eos=1, max_len=3)
    assert model.steps == []
    model = ToyModel(4, say_vocab=False)
    for decode in (greedy_decode, beam_search):
        with pytest.raises(ValueError, match=r"eos must be a target token id in \[0, 4\), got 4"):
            decode(model, SRC, bos=0, eos=4, max_len=3)
        assert model.steps == [len(SRC)]


def test_logits_of_the_wrong_shape_or_nan_are_refused():
    class Bad(ToyModel):
        def __init__(self, fault):
            super().__init__(4)
            self.fault = fault

        def decode_step(self, state, tokens):
            z = super().decode_step(state, tokens)
            if self.fault == "nan":
                z[0, 1] = np.nan
            return z[:, :3] if len(self.steps) == 2 and self.fault == "shape" else z

    with pytest.raises(ValueError, match=r"logits of shape \(\d+, 4\), got \(\d+, 3\)"):
        greedy_decode(Bad("shape"), SRC, bos=0, eos=3, max_len=5)
    with pytest.raises(ValueError, match="NaN"):
        beam_search(Bad("nan"), SRC, bos=0, eos=1, max_len=5)


class DeviceArray(np.ndarray):
    """A NumPy array that says it is CuPy's (its type's module is cupy), with CuPy's .get()."""

    reads = 0

    def get(self):
        DeviceArray.reads += 1
        return np.asarray(self).copy()


DeviceArray.__module__ = "cupy"


class DeviceToy(ToyModel):
    """The toy on a 'GPU': it takes device tokens only and gives device logits."""

    def decode_step(self, state, tokens):
        assert type(tokens) is DeviceArray, type(tokens)
        return super().decode_step(state, np.asarray(tokens)).view(DeviceArray)


def test_a_model_on_the_gpu_gets_device_tokens_and_its_logits_are_read_back(monkeypatch):
    """src on the device: each step's tokens go there (cupy.asarray), the logits come back
    with .get(); the results are the host's."""
    fake = type(sys)("cupy")
    fake.asarray = lambda a: np.array(a).view(DeviceArray)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    kw = dict(bos=0, eos=1, max_len=6)
    model, device = ToyModel(5, seed=4, eos_bias=0.5), DeviceToy(5, seed=4, eos_bias=0.5)
    src = SRC.view(DeviceArray)
    monkeypatch.setattr(DeviceArray, "reads", 0)
    assert greedy_decode(device, src, **kw) == greedy_decode(model, SRC, **kw)
    assert DeviceArray.reads == len(device.steps)  # one read of the logits per step
    assert beam_search(device, src, beam=3, **kw) == beam_search(model, SRC, beam=3, **kw)


# ---- the encoder–decoder ----------------------------------------------------------------------


def tiny_seq2seq(seed=0):
    cfg = Seq2SeqConfig(src_vocab=7, tgt_vocab=4, d_model=16, n_head=2, n_enc_layers=1,
                                n_dec_layers=2, d_ff=32, max_len=16)
    return Transformer(cfg, seed=seed)


def model_exhaustive(model, src, src_lens, bos, eos, max_len, alpha):
    """Every hypothesis of one sentence, scored from model.forward's logits of the whole
    sequence (teacher forcing: a different path through the model than decode_step)."""
    V = model.cfg.tgt_vocab
    hyps = []
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(V), repeat=n):
            if eos in seq[:-1] or (seq[-1] != eos and n < max_len):
                continue
            tgt_in = np.array([[bos, *seq[:-1]]], np.int64)
            z = model.forward(src, tgt_in, src_lens)[0].astype(np.float64)
            raw = sum(log_softmax(z[t])[y] for t, y in enumerate(seq))
            hyps.append((raw / ((5 + n) / 6) ** alpha, list(seq)))
    return sorted(hyps, key=lambda h: (-h[0], len(h[1]), h[1]))


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_seq2seq_beam_keeping_every_prefix_is_exhaustive(alpha):
    """V = 4, max_len = 3, beam = 16: the best hypothesis and its score are the exhaustive
    search's over the model's own teacher-forced logits (float32 paths differ: the score to
    1e-4, and the winner is checked to lead the runner-up by more than that)."""
    model = tiny_seq2seq()
    src = np.array([[1, 5, 2, 6, 3], [4, 4, 1, 0, 0]], np.int64)
    lens = [5, 3]
    got = beam_search(model, src, lens, bos=0, eos=1, beam=16, max_len=3, length_penalty=alpha)
    for b in range(2):
        want = model_exhaustive(model, src[b:b + 1], lens[b:b + 1], 0, 1, 3, alpha)
        assert want[0][0] - want[1][0] > 1e-4  # a clear winner
        assert got[b][0][0] == want[0][1]
        assert got[b][0][1] == pytest.approx(want[0][0], abs=1e-4)
        exact = {tuple(ids): s for s, ids in want}
        for ids, s in got[b]:  # every returned hypothesis scored as the formula says
            assert s == pytest.approx(exact[tuple(ids)], abs=1e-4)


def test_seq2seq_greedy_is_beam_one():
    model = tiny_seq2seq(seed=1)
    src = np.array([[1, 5, 2, 6, 3], [4, 4, 1, 0, 0], [6, 6, 6, 2, 0]], np.int64)
    lens = [5, 3, 4]
    greedy = greedy_decode(model, src, lens, bos=0, eos=1, max_len=8)
    beam = beam_search(model, src, lens, bos=0, eos=1, beam=1, max_len=8, length_penalty=0)
    assert [h[0][0] for h in beam] == greedy


def test_seq2seq_a_padded_batch_gives_what_each_sentence_gives_alone():
    """Each sentence alone, cut to its length (no padding), against the padded batch: the
    decoder's cross-attention sees only the real source positions, and the beams' rows stay
    with their sentences through reorder."""
    model = tiny_seq2seq(seed=2)
    src = np.array([[1, 5, 2, 6, 3], [4, 4, 1, 0, 0], [6, 2, 0, 0, 0]], np.int64)
    lens = [5, 3, 2]
    kw = dict(bos=0, eos=1, beam=3, max_len=6, length_penalty=0.6)
    batched = beam_search(model, src, lens, **kw)
    for b, n in enumerate(lens):
        alone = beam_search(model, src[b:b + 1, :n], None, **kw)[0]
        assert [ids for ids, _ in batched[b]] == [ids for ids, _ in alone]
        np.testing.assert_allclose([s for _, s in batched[b]], [s for _, s in alone],
                                   rtol=1e-5, atol=1e-6)
