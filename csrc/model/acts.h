/*
 * acts.h — the activations of one forward pass of the model runtime, N = B·T tokens at T
 * positions, carved from one scratch buffer of floats: the layout model.c (host memory) and
 * model_cuda.c (device memory) share. Internal, not exported.
 *
 *   pos     [T] int64 positions (2·T floats, at the buffer's aligned start)
 *   tokens  [N] int64 token ids (2·N floats; only where asked: the device's copy of them)
 *   x       [N, C] the residual stream
 *   a       [N, C] a LayerNorm's output, then attention's
 *   qkv     [N, 3C] c_attn's output; its first N·C floats then hold each c_proj's output
 *   q, k, v [B, T, H, D] each, adjacent (k = q + N·C)
 *   h       [N, 4C] c_fc's output, GELU in place
 *   mean, rstd, lse  [N], [N], [B, H, T]: what the kernels save, unused here
 *   head    [N, vocab] every row's logits (only where asked), else NULL
 */
#ifndef PYTFM_MODEL_ACTS_H
#define PYTFM_MODEL_ACTS_H

#include <stdint.h>

#include "core/checks.h"

typedef struct pytfm__acts {
    int64_t *pos, *tokens;
    float *x, *a, *qkv, *q, *k, *v, *h, *mean, *rstd, *lse, *head;
} pytfm__acts;

/* The floats of the buffer (tokens, head_vocab: room for the token ids, for every row's
 * logits of that vocabulary (0: none)) into *floats; 0 when that is more than memory can
 * address. */
static inline int pytfm__acts_floats(int64_t N, int64_t T, int64_t C, int64_t H, int tokens,
                                     int64_t head_vocab, int64_t *floats) {
    const int64_t per_token = 12 * C + 2 + H + (tokens ? 2 : 0) + head_vocab;
    return pytfm__mul_within(N, per_token, pytfm__max_elems(sizeof(float)), floats) &&
           pytfm__add_within(*floats, 2 * T, pytfm__max_elems(sizeof(float)), floats);
}

/* The arrays in buf, laid out as above (tokens, head as in pytfm__acts_floats). */
static inline pytfm__acts pytfm__acts_carve(float *buf, int64_t N, int64_t T, int64_t C,
                                            int64_t H, int tokens, int head) {
    pytfm__acts s;
    float *p = buf;
    s.pos = (int64_t *)(void *)p, p += 2 * T;
    s.tokens = tokens ? (int64_t *)(void *)p : NULL, p += tokens ? 2 * N : 0;
    s.x = p, p += N * C;
    s.a = p, p += N * C;
    s.qkv = p, p += N * 3 * C;
    s.q = p, p += N * C;
    s.k = p, p += N * C;
    s.v = p, p += N * C;
    s.h = p, p += N * 4 * C;
    s.mean = p, p += N;
    s.rstd = p, p += N;
    s.lse = p, p += N * H;
    s.head = head ? p : NULL;
    return s;
}

#endif /* PYTFM_MODEL_ACTS_H */
