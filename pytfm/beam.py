"""pytfm.beam — greedy decoding and beam search for an encoder–decoder.

Both use only the decoding protocol of pytfm.seq2seq.Transformer, so any object with these
three calls works (the tests use a toy model):

    state = model.start_decode(src, src_lens, max_len)   # encodes once; B rows
    logits = model.decode_step(state, tokens)            # tokens int64 (rows,) -> (rows, V)
    state.reorder(index)                                 # int64 (rows',): keep these rows

Every step is one decode_step for the whole batch: greedy feeds the B sentences' rows, beam
search B·beam rows (sentence b's beams are rows b·beam .. b·beam + beam - 1; its first step,
where every beam would be [bos], runs B rows). A sentence that is done is dropped from the
state with reorder, so later steps cost only what is still being decoded. Log-probabilities
are log_softmax(logits) in float64 on the host (a model on the GPU returns CuPy logits: they
are read back each step; the tokens fed go to the device of src).

Hypotheses, for both: a sequence y_1 .. y_n of generated tokens (BOS, the first input, is not
part of it). A hypothesis is finished when y_n == eos (n <= max_len), or when n == max_len
(truncated: no EOS). The returned ids hold y_1 .. y_n: no BOS, and the EOS when the hypothesis
ended with one, so a list without a final eos was cut by max_len.
"""

import math

import numpy as np

from ._arrays import as_float, as_int, is_cupy


def _host(a):
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if is_cupy(a) else np.asarray(a)


def _tokens_like(src, tokens):
    """tokens (int64 NumPy) on src's device: a model on the GPU takes CuPy ids."""
    if is_cupy(src):
        import cupy

        return cupy.asarray(tokens)
    return tokens


def _sentences(src):
    """B, the number of sentences in src (B, Ts)."""
    shape = getattr(src, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"src must be a 2-D array of token ids (B, Ts), got "
                         f"{'shape ' + str(tuple(shape)) if shape is not None else type(src)}")
    return int(shape[0])


def _target_vocab(model):
    """The model's target vocabulary when it says (cfg.tgt_vocab), else None: the first step's
    logits tell it."""
    return getattr(getattr(model, "cfg", None), "tgt_vocab", None)


def _check_ids(bos, eos, vocab):
    for name, v in (("bos", bos), ("eos", eos)):
        if not 0 <= v < (vocab if vocab is not None else math.inf):
            want = f"[0, {vocab})" if vocab is not None else ">= 0"
            raise ValueError(f"{name} must be a target token id in {want}, got {v}")


def _check_args(model, bos, eos, max_len):
    bos, eos, max_len = as_int("bos", bos), as_int("eos", eos), as_int("max_len", max_len)
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1 (the most tokens generated, EOS included), "
                         f"got {max_len}")
    _check_ids(bos, eos, _target_vocab(model))
    return bos, eos, max_len


def _log_probs(logits, rows, vocab, bos, eos):
    """log_softmax of the step's logits (rows, V) in float64, checked: the shape, one V for
    every step, no NaN. -> (log-probs, V)."""
    z = _host(logits)
    if z.ndim != 2 or z.shape[0] != rows or (vocab is not None and z.shape[1] != vocab):
        want = f"({rows}, {vocab if vocab is not None else 'V'})"
        raise ValueError(f"model.decode_step must return logits of shape {want}, "
                         f"got {z.shape}")
    if vocab is None:
        _check_ids(bos, eos, z.shape[1])
    z = z.astype(np.float64)
    if np.isnan(z).any():
        raise ValueError("model.decode_step returned NaN logits")
    m = z.max(axis=-1, keepdims=True)
    m[~np.isfinite(m)] = 0.0
    z = z - m
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    logp[np.isnan(logp)] = -np.inf  # a row of -inf only: nothing there is possible
    return logp, z.shape[1]


def greedy_decode(model, src, src_lens=None, *, bos, eos, max_len):
    """The most likely next token at each step, for each sentence of src (B, Ts).

    Sentence b's decoding starts from bos and stops at the first eos or after max_len tokens;
    the search stops when every sentence has stopped. Returns a list of B lists of int ids
    (y_1 .. y_n: no BOS; the EOS when one was produced). It is beam_search with beam=1 and
    length_penalty=0, with the same ids.

    bos, eos: target ids in [0, V); max_len >= 1: ValueError naming the argument otherwise
    (a model without cfg.tgt_vocab tells V with its first logits)."""
    bos, eos, max_len = _check_args(model, bos, eos, max_len)
    B = _sentences(src)
    out = [[] for _ in range(B)]
    if B == 0:
        return out
    state = model.start_decode(src, src_lens, max_len)
    active = np.arange(B)  # the sentences still decoding, in the state's row order
    tokens = np.full(B, bos, np.int64)
    vocab = _target_vocab(model)
    for t in range(1, max_len + 1):
        logits = model.decode_step(state, _tokens_like(src, tokens))
        logp, vocab = _log_probs(logits, len(active), vocab, bos, eos)
        tokens = logp.argmax(axis=-1).astype(np.int64)  # the first of equal maxima
        for b, y in zip(active, tokens):
            out[b].append(int(y))
        going = tokens != eos
        if t == max_len or not going.any():
            break
        if not going.all():
            keep = np.flatnonzero(going)
            state.reorder(keep)
            active, tokens = active[keep], tokens[keep]
    return out


def beam_search(model, src, src_lens=None, *, bos, eos, beam=4, max_len, length_penalty=0.6):
    """The `beam` best hypotheses of each sentence of src (B, Ts) that a beam search finds.

    Score of a finished hypothesis y_1 .. y_n (see the module's docstring):
        score = (sum over t = 1..n of log p(y_t | y_<t, src)) / ((5 + n) / 6) ** length_penalty
    n counts the generated tokens, EOS included (GNMT's length penalty; length_penalty = 0:
    the plain sum of log-probabilities, > 0 favours longer hypotheses).

    Each sentence keeps `beam` alive (unfinished) prefixes, at first only [bos]. Step t
    extends every alive prefix by every token (beam·V candidates, ranked by their summed
    log-probability, higher first, then by (beam row, token) for ties). Of the `beam` best
    candidates, those ending in eos become finished hypotheses; the `beam` best candidates not
    ending in eos are the next alive prefixes. At step max_len every one of the `beam` best
    candidates is finished (the ones without EOS truncated). A sentence keeps its `beam` best
    finished hypotheses by score (first found first, on ties).

    A sentence is done after step max_len, when it has no alive prefix, or when it has `beam`
    finished hypotheses and none can be beaten: the worst of them scores at least as much as
    any finished hypothesis an alive prefix could still give (its summed log-probability can
    only fall, and the penalty's largest divisor over the lengths still possible bounds it), so
    stopping early returns exactly what running to max_len would. The search stops when every
    sentence is done.

    With beam >= V ** (max_len - 1) no prefix is ever dropped and the result is the exact
    ranking of every hypothesis. beam=1 with length_penalty=0 is greedy_decode.

    Returns a list of B lists of (ids, score), best first: ids a list of ints (no BOS; the
    EOS when the hypothesis has one), score a float (as above); at most `beam` entries, fewer
    only when fewer candidates existed.

    bos, eos: target ids in [0, V); beam >= 1; max_len >= 1; length_penalty finite:
    ValueError naming the argument otherwise."""
    bos, eos, max_len = _check_args(model, bos, eos, max_len)
    k = as_int("beam", beam)
    if k < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    alpha = as_float("length_penalty", length_penalty, "float64")
    if not math.isfinite(alpha):
        raise ValueError(f"length_penalty must be finite (0: no penalty), got {alpha}")
    B = _sentences(src)
    finished = [[] for _ in range(B)]  # per sentence: (score, ids), best first
    if B == 0:
        return finished

    def penalty(n):
        return ((5.0 + n) / 6.0) ** alpha

    state = model.start_decode(src, src_lens, max_len)  # one row per sentence: [bos] only
    active = np.arange(B)  # the sentences still searching, in the state's order
    score = np.full((B, k), -np.inf)  # summed log-probs of the alive prefixes
    score[:, 0] = 0.0
    alive = np.zeros((B, k), bool)  # which rows hold a prefix (at first only row 0: [bos])
    alive[:, 0] = True
    prefix = np.zeros((B, k, 0), np.int64)  # (sentences, k, t - 1)
    tokens = np.full(B, bos, np.int64)
    vocab = _target_vocab(model)
    for t in range(1, max_len + 1):
        n = len(active)
        rows = 1 if t == 1 else k  # the state's rows per sentence
        logits = model.decode_step(state, _tokens_like(src, tokens))
        logp, vocab = _log_probs(logits, n * rows, vocab, bos, eos)
        V = vocab
        # at step 1 each sentence's one row is its one prefix: rows 1 .. k-1 hold none
        logp = np.pad(logp.reshape(n, rows, V), ((0, 0), (0, k - rows), (0, 0)))
        cand = (score[:, :, None] + logp).reshape(n, k * V)
        real = np.repeat(alive, V, axis=1)  # candidates that extend a prefix
        index = np.broadcast_to(np.arange(k * V), (n, k * V))
        order = np.lexsort((index, -cand, ~real), axis=-1)  # real first, best, lowest index
        ranked_real = np.take_along_axis(real, order, axis=-1)
        ranked_token = order % V

        # the k best candidates: those ending in eos (all of them at the last step) finish
        top = order[:, :k]
        ends = ranked_real[:, :k] & ((ranked_token[:, :k] == eos) | (t == max_len))
        for i, j in zip(*np.nonzero(ends)):  # in rank order within each sentence
            c = top[i, j]
            ids = prefix[i, c // V].tolist() + [int(c % V)]
            finished[active[i]].append((float(cand[i, c]) / penalty(t), ids))
        for i in np.unique(np.nonzero(ends)[0]):
            hyps = finished[active[i]]
            hyps.sort(key=lambda h: -h[0])  # stable: the first found first among equals
            del hyps[k:]
        if t == max_len:
            break

        # the k best candidates not ending in eos are the next prefixes
        going = ranked_real & (ranked_token != eos)
        pick = np.argsort(~going, axis=-1, kind="stable")[:, :k]
        chosen = np.take_along_axis(order, pick, axis=-1)  # (n, k) into the k·V candidates
        alive = np.take_along_axis(going, pick, axis=-1)
        score = np.where(alive, np.take_along_axis(cand, chosen, axis=-1), -np.inf)
        parent, token = chosen // V, chosen % V
        prefix = np.concatenate([np.take_along_axis(prefix, parent[:, :, None], axis=1),
                                 token[:, :, None]], axis=2)

        # done: nothing alive, or k finished that no alive prefix can beat
        best_alive = np.where(alive, score, -np.inf).max(axis=1)  # <= 0: log-probs
        bound = best_alive / max(penalty(t + 1), penalty(max_len))
        done = np.array([not alive[i].any()
                         or (len(finished[b]) == k and finished[b][-1][0] >= bound[i])
                         for i, b in enumerate(active)])
        if done.all():
            break
        keep = np.flatnonzero(~done)
        from_rows = keep[:, None] * rows + np.where(rows == 1, 0, parent[keep])
        state.reorder(from_rows.reshape(-1).astype(np.int64))  # k rows per sentence now
        active, score, alive, prefix = active[keep], score[keep], alive[keep], prefix[keep]
        tokens = token[keep].reshape(-1).astype(np.int64)
        tokens[~alive.reshape(-1)] = bos  # a row without a prefix runs on, its output unused
    return [[(ids, s) for s, ids in hyps] for hyps in finished]
