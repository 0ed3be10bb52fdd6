/*
 * attention_bf16kv.c — a KV cache of BF16 bits: half the float32 cache's bytes, the same
 * attention on the keys and values it holds.
 *
 *   append:  cache[b, start + i] = bf16(k[b, i]) (round to nearest even, pytfm__bf16_round_bits)
 *   decode:  o, lse = attention_gqa_decode(q, widen(k_cache), widen(v_cache)),
 *            widen(u) = the float32 whose upper 16 bits are u (exact)
 *
 * The contract is bits, not a bound: decoding on a BF16 cache gives what the float32 decode
 * gives on a cache of the rounded values, so that a BF16 cache costs exactly the rounding of k
 * and v and nothing else. Both decodes therefore run the same arithmetic in the same order
 * (attention.c): a token (n_new = 1, a row kernel available) runs decode_head_rows' loop here,
 * the same fast.h row kernels on the same tiles of RK keys, each tile of the key/value head
 * widened once into a per-thread buffer and read by every query head of its group; anything
 * else (a prompt, a few tokens, PYTFM_ISA_PLAIN) widens each batch row's keys and values that
 * the queries see into float scratch and calls pytfm_attention_gqa_decode on it, so that the
 * tiled fast path and the plain loop are attention.c's own. The widened range starts at the
 * first key the first query sees: attention.c's tiles count from each row's first key, so a
 * shift of every position by that much changes no tile.
 */
#include <stdlib.h>
#include <string.h>

#include "core/checks.h"
#include "fast.h"

enum { RK = 64 }; /* keys per tile: decode_head_rows' RK (attention.c) */

static inline float widen(uint16_t u) {
    const uint32_t w = (uint32_t)u << 16;
    float x;
    memcpy(&x, &w, sizeof x);
    return x;
}

/* rows [0, n) of D values (source row stride ld) into dst [n, D] */
static void widen_rows(float *dst, const uint16_t *src, int64_t n, int64_t D, int64_t ld) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t d = 0; d < D; d++) dst[t * D + d] = widen(src[t * ld + d]);
}

pytfm_status pytfm_attention_cache_append_bf16(uint16_t *k_cache, uint16_t *v_cache,
                                               const float *k, const float *v, int64_t B,
                                               int64_t n_new, int64_t H, int64_t D, int64_t Tmax,
                                               int64_t start) {
    PYTFM_TRY(pytfm__check_attention_cache_append_bf16(__func__, k_cache, v_cache, k, v, B, n_new,
                                                       H, D, Tmax, start));
    const int64_t n = n_new * H * D; // the n_new new rows of a batch are consecutive
    for (int64_t b = 0; b < B; b++) {
        uint16_t *kc = k_cache + (b * Tmax + start) * H * D, *vc = v_cache + (kc - k_cache);
        const float *kb = k + b * n, *vb = v + b * n;
        for (int64_t i = 0; i < n; i++) {
            uint32_t uk, uv;
            memcpy(&uk, kb + i, sizeof uk);
            memcpy(&uv, vb + i, sizeof uv);
            kc[i] = (uint16_t)(pytfm__bf16_round_bits(uk) >> 16);
            vc[i] = (uint16_t)(pytfm__bf16_round_bits(uv) >> 16);
        }
    }
    return PYTFM_STATUS_OK;
}

/* One token's decode (n_new = 1) problem; caches [B, Tmax, Hkv, D] */
typedef struct {
    float *o, *lse;
    const float *q;
    const uint16_t *k, *v;
    int64_t B, H, Hkv, D, Tmax, start, window;
    float scale;
} token;

/* Key/value head g of batch row b and the H / Hkv query heads of its group, the token at
 * position start: decode_head_rows' loop (attention.c) for each head, the tiles of keys
 * widened once into kt, vt [RK, D] for all of them; m, l [group]: the heads' running max and
 * sum. Each head's row sees the same tiles, in the same order, through the same kernels. */
static void token_group(const token *p, const pytfm__fast_kernels *fk, float *kt, float *vt,
                        float *m, float *l, int64_t b, int64_t g) {
    const int64_t D = p->D, KD = p->Hkv * D, G = p->H / p->Hkv, pos = p->start;
    const uint16_t *kb = p->k + (b * p->Tmax * p->Hkv + g) * D; // key s at kb + s·KD
    const uint16_t *vb = p->v + (b * p->Tmax * p->Hkv + g) * D;
    const int64_t kbeg = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
    float s[RK];
    for (int64_t i = 0; i < G; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        memset(p->o + (b * p->H + g * G + i) * D, 0, (size_t)D * sizeof(float));
    }
    for (int64_t j0 = kbeg; j0 <= pos; j0 += RK) {
        const int64_t nk = PYTFM_MIN(RK, pos + 1 - j0);
        widen_rows(kt, kb + j0 * KD, nk, D, KD);
        widen_rows(vt, vb + j0 * KD, nk, D, KD);
        for (int64_t i = 0; i < G; i++) {
            const int64_t h = g * G + i;
            float *orow = p->o + (b * p->H + h) * D;
            fk->gemv(s, p->q + (b * p->H + h) * D, kt, D, NULL, D, nk);
            const float alpha = fk->attn_softmax_row(s, nk, nk, p->scale, m + i, l + i);
            fk->attn_pv_row(orow, s, vt, D, nk, D, alpha);
        }
    }
    for (int64_t i = 0; i < G; i++) {
        float *orow = p->o + (b * p->H + g * G + i) * D;
        const float inv = 1.0f / l[i];
        for (int64_t d = 0; d < D; d++) orow[d] *= inv;
        p->lse[b * p->H + g * G + i] = m[i] + logf(l[i]);
    }
}

/* per thread: kt, vt [RK, D], m, l [H / Hkv] */
static pytfm_status decode_token(const char *func, const token *p,
                                 const pytfm__fast_kernels *fk) {
    const int64_t G = p->H / p->Hkv, per = 2 * RK * p->D + 2 * G;
    const int64_t BG = p->B * p->Hkv, threads = BG > 1 ? pytfm_get_num_threads() : 1;
    int64_t floats;
    if (!pytfm__mul_within(threads, per, INT64_MAX, &floats)) {
        return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                           "%s: cannot allocate %lld workspaces of %lld floats", func,
                           (long long)threads, (long long)per);
    }
    float *ws = pytfm__scratch(func, floats, sizeof(float));
    if (!ws) return PYTFM_STATUS_OUT_OF_MEMORY;
    PYTFM_PARALLEL_FOR_THREADS(threads)
    for (int64_t bg = 0; bg < BG; bg++) {
        float *w = ws + (threads > 1 ? pytfm__thread_id() : 0) * per;
        token_group(p, fk, w, w + RK * p->D, w + 2 * RK * p->D, w + 2 * RK * p->D + G,
                    bg / p->Hkv, bg % p->Hkv);
    }
    free(ws);
    return PYTFM_STATUS_OK;
}

/* Batch row by batch row: its keys and values [k0, start + n_new) widened into kw, vw
 * [Tk, Hkv, D], then pytfm_attention_gqa_decode at position start − k0 (k0: the first key of
 * the first query; the window, counted from each query's position, keeps every row's keys) */
static pytfm_status decode_widened(const char *func, float *o, float *lse, const float *q,
                                   const uint16_t *k_cache, const uint16_t *v_cache, int64_t B,
                                   int64_t n_new, int64_t H, int64_t Hkv, int64_t D,
                                   int64_t Tmax, int64_t start, float scale, int64_t window) {
    const int64_t k0 = window > 0 && start - window + 1 > 0 ? start - window + 1 : 0;
    const int64_t Tk = start + n_new - k0, KD = Hkv * D;
    float *kw = pytfm__scratch(func, 2 * Tk * KD, sizeof(float)); // fits: the cache does
    if (!kw) return PYTFM_STATUS_OUT_OF_MEMORY;
    float *vw = kw + Tk * KD;
    pytfm_status st = PYTFM_STATUS_OK;
    for (int64_t b = 0; b < B && st == PYTFM_STATUS_OK; b++) {
        const int64_t off = (b * Tmax + k0) * KD;
        widen_rows(kw, k_cache + off, Tk * Hkv, D, D);
        widen_rows(vw, v_cache + off, Tk * Hkv, D, D);
        st = pytfm_attention_gqa_decode(o + b * n_new * H * D, lse + b * H * n_new,
                                        q + b * n_new * H * D, kw, vw, 1, n_new, H, Hkv, D, Tk,
                                        start - k0, scale, window);
    }
    free(kw);
    return st;
}

pytfm_status pytfm_attention_gqa_decode_bf16kv(float *o, float *lse, const float *q,
                                               const uint16_t *k_cache, const uint16_t *v_cache,
                                               int64_t B, int64_t n_new, int64_t H, int64_t Hkv,
                                               int64_t D, int64_t Tmax, int64_t start,
                                               float scale, int64_t window) {
    PYTFM_TRY(pytfm__check_attention_decode_bf16kv(__func__, o, lse, q, k_cache, v_cache, B,
                                                   n_new, H, Hkv, D, Tmax, start, scale,
                                                   window));
    if (B * n_new * H == 0) return PYTFM_STATUS_OK;
    const pytfm__fast_kernels *fk = pytfm__fast_for(pytfm_get_isa());
    if (n_new == 1 && fk) {
        const token p = {o, lse, q, k_cache, v_cache, B, H, Hkv, D, Tmax, start, window, scale};
        return decode_token(__func__, &p, fk);
    }
    return decode_widened(__func__, o, lse, q, k_cache, v_cache, B, n_new, H, Hkv, D, Tmax,
                          start, scale, window);
}
