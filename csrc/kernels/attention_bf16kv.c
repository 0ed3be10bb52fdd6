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
 * else (a prompt, a few tokens, PYTFM_ISA_PLAIN) widens the keys and values the queries see,
 * a block of key/value heads at a time, into float scratch and calls
 * pytfm_attention_gqa_decode on it, so that the tiled fast path and the plain loop are
 * attention.c's own. The widened range starts at the first key the first query sees:
 * attention.c's tiles count from each row's first key, so a shift of every position by that
 * much changes no tile.
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

/* Batch row by batch row, a block of c key/value heads at a time (c·G query heads, G = H /
 * Hkv; c the fewest that give every thread a query head, up to Hkv): their keys and values
 * [k0, start + n_new) widened into kw, vw [Tk, c, D], their queries gathered into qc
 * [n_new, c·G, D], then pytfm_attention_gqa_decode at position start − k0 (k0: the first key
 * of the first query; the window, counted from each query's position, keeps every row's
 * keys), its o and lse scattered back. Each query head's arithmetic is the one it gets in a
 * single call over all heads (attention.c computes head by head; the strides only address),
 * and the widened block stays small: 2·Tk·c·D floats, not the batch row's 2·Tk·Hkv·D. */
static pytfm_status decode_widened(const char *func, float *o, float *lse, const float *q,
                                   const uint16_t *k_cache, const uint16_t *v_cache, int64_t B,
                                   int64_t n_new, int64_t H, int64_t Hkv, int64_t D,
                                   int64_t Tmax, int64_t start, float scale, int64_t window) {
    const int64_t k0 = window > 0 && start - window + 1 > 0 ? start - window + 1 : 0;
    const int64_t Tk = start + n_new - k0, KD = Hkv * D, G = H / Hkv;
    const int64_t threads = pytfm_get_num_threads();
    const int64_t c = PYTFM_MIN(Hkv, (threads + G - 1) / G), cD = c * D, qD = c * G * D;
    // kw, vw [Tk, c, D], qc, oc [n_new, c·G, D], lc [c·G, n_new]: within the cache's and q's
    // counts (checked), so no overflow
    float *kw = pytfm__scratch(func, 2 * Tk * cD + 2 * n_new * qD + c * G * n_new,
                               sizeof(float));
    if (!kw) return PYTFM_STATUS_OUT_OF_MEMORY;
    float *vw = kw + Tk * cD, *qc = vw + Tk * cD, *oc = qc + n_new * qD, *lc = oc + n_new * qD;
    pytfm_status st = PYTFM_STATUS_OK;
    for (int64_t b = 0; b < B && st == PYTFM_STATUS_OK; b++) {
        for (int64_t g0 = 0; g0 < Hkv && st == PYTFM_STATUS_OK; g0 += c) {
            const int64_t nc = PYTFM_MIN(c, Hkv - g0), nq = nc * G * D; // this block's
            const int64_t off = (b * Tmax + k0) * KD + g0 * D;
            widen_rows(kw, k_cache + off, Tk, nc * D, KD);
            widen_rows(vw, v_cache + off, Tk, nc * D, KD);
            for (int64_t t = 0; t < n_new; t++) // the block's query heads are adjacent in q
                memcpy(qc + t * nq, q + (b * n_new + t) * H * D + g0 * G * D,
                       (size_t)nq * sizeof(float));
            st = pytfm_attention_gqa_decode(oc, lc, qc, kw, vw, 1, n_new, nc * G, nc, D, Tk,
                                            start - k0, scale, window);
            for (int64_t t = 0; t < n_new && st == PYTFM_STATUS_OK; t++)
                memcpy(o + (b * n_new + t) * H * D + g0 * G * D, oc + t * nq,
                       (size_t)nq * sizeof(float));
            if (st == PYTFM_STATUS_OK) // lse [B, H, n_new]: the block's heads are adjacent
                memcpy(lse + (b * H + g0 * G) * n_new, lc,
                       (size_t)(nc * G * n_new) * sizeof(float));
        }
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
