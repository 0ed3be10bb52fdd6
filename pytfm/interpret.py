"""pytfm.interpret — numbers that say what an attention head does.

Each function takes the attention weights of one layer, P [B, H, T, T] as
GPT.attention_probs returns them (P[b, h, t, s]: the weight query position t gives key position
s; zero for s > t; each row sums to 1), and returns one number per head, [H], averaged over
the batch and the query positions that the score is defined on:

  mean_distance   Σ_s P[t, s]·(t − s): how many tokens back the head looks, on average.
                  0: each token looks at itself; t/2 for uniform attention over the prefix.
  entropy         −Σ_s P[t, s]·log P[t, s], in nats: 0 when all the weight is on one key,
                  log(t + 1) when it is spread evenly over the t + 1 keys a query may see.
  previous_token  P[t, t − 1]: the weight on the token just before. 1 for a head that always
                  looks one back.
  induction       for a query t whose token occurred before (tokens[s] == tokens[t] for some
                  s < t), the weight on the positions right after those earlier occurrences,
                  Σ_{s < t, tokens[s] == tokens[t]} P[t, s + 1]. An induction head, seeing
                  "... A B ... A", attends to the B after the earlier A (and copies it: it
                  predicts B next). 1 for a perfect one; near 0 for a head that spreads its
                  weight over a long prefix. (When tokens[t − 1] == tokens[t], the position
                  after the earlier occurrence is t itself.)

The first three average over the query positions t >= 1 (t = 0 sees only itself: distance 0,
entropy 0, no previous token); induction over the queries whose token occurred before. A score
with no position to average over (T = 1; no repeated token) is NaN.
"""

import numpy as np


def _mean_over_queries(values, queries):  # [B, H, T], bool [B, T] -> [H]
    """The mean of values over the batch and the query positions marked in queries."""
    count = queries.sum()
    if count == 0:
        return np.full(values.shape[1], np.nan)
    return (values * queries[:, None, :]).sum(axis=(0, 2)) / count


def _from_second(P):  # bool [B, T]: the query positions t >= 1
    B, _, T, _ = P.shape
    return np.broadcast_to(np.arange(T) >= 1, (B, T))


def mean_distance(P):  # [B, H, T, T] -> [H]
    T = P.shape[-1]
    back = np.arange(T)[:, None] - np.arange(T)[None, :]  # t − s
    return _mean_over_queries((P * back).sum(axis=-1), _from_second(P))


def entropy(P):  # [B, H, T, T] -> [H], nats
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(P > 0, -P * np.log(P), 0.0)  # 0·log 0 = 0
    return _mean_over_queries(terms.sum(axis=-1), _from_second(P))


def previous_token(P):  # [B, H, T, T] -> [H]
    B, H, T, _ = P.shape
    back_one = np.zeros((B, H, T))
    back_one[..., 1:] = np.diagonal(P, offset=-1, axis1=-2, axis2=-1)  # P[t, t − 1]
    return _mean_over_queries(back_one, _from_second(P))


def induction_targets(tokens):  # int [B, T] -> bool [B, T, T]
    """after[b, t, u]: u = s + 1 for an earlier occurrence s < t of the token at t."""
    tokens = np.asarray(tokens)
    T = tokens.shape[1]
    same = tokens[:, :, None] == tokens[:, None, :]  # same[b, t, s]: tokens[s] == tokens[t]
    earlier = same & np.tril(np.ones((T, T), bool), k=-1)  # and s < t
    after = np.zeros_like(earlier)
    after[:, :, 1:] = earlier[:, :, :-1]  # the mark moves from s to s + 1
    return after


def induction(P, tokens):  # [B, H, T, T], int [B, T] -> [H]
    after = induction_targets(tokens)
    return _mean_over_queries((P * after[:, None]).sum(axis=-1), after.any(axis=-1))


def head_scores(P, tokens):  # [B, H, T, T], int [B, T] -> {name: [H]}
    """All four scores of every head of one layer."""
    if P.ndim != 4 or P.shape[-1] != P.shape[-2]:
        raise ValueError(f"P must be [B, H, T, T], got shape {P.shape}")
    if np.shape(tokens) != (P.shape[0], P.shape[2]):
        raise ValueError(f"tokens must be [B, T] = {[P.shape[0], P.shape[2]]}, "
                         f"got shape {list(np.shape(tokens))}")
    return {"mean_distance": mean_distance(P), "entropy": entropy(P),
            "previous_token": previous_token(P), "induction": induction(P, tokens)}
