/*
 * attention.c — multi-head scaled dot-product attention, flash-style, in linear memory.
 *
 *   q, k, v, o [B, T, H, D] (row (b, t, h) holds D floats; the next t is H·D further on)
 *   S = scale · q kᵀ (per batch and head, [T, T]),  P = softmax(S) row-wise (causal: keys ≤ t),
 *   O = P v,  lse_t = log Σ_s exp(S_ts)  ([B, H, T], saved for the backward)
 *
 * The T×T matrices S and P are never stored. The forward walks the keys in tiles of BK and
 * keeps, per query row, a running max m and sum l (the online softmax):
 *   m' = max(m, max_s S_ts),  l ← l·e^(m−m') + Σ_s e^(S_ts−m'),  O_t ← O_t·e^(m−m') + Σ e^(S_ts−m') v_s
 * and divides O_t by l once at the end. Causal tiles above the diagonal are never visited, and
 * in a diagonal tile only the keys s ≤ t are.
 *
 * The backward recomputes P_ts = exp(S_ts − lse_t) pair by pair:
 *   Dt = Σ_d dO_td O_td                      (= Σ_s P_ts dP_ts)
 *   dV_s += P_ts dO_t,  dP_ts = dO_t · v_s,  dS_ts = P_ts (dP_ts − Dt)
 *   dQ_t += scale · dS_ts k_s,  dK_s += scale · dS_ts q_t
 * One thread owns a whole (b, h): every accumulation happens in one fixed order, so the result
 * is the same bits whatever the number of threads. Extra memory: one row of BK scores per
 * query row, on the stack, whatever T is.
 *
 * Decoding: queries at positions [start, start + n) attend to the keys [0, start + n) of a
 * cache [B, Tmax, H, D]; the same forward code runs with a query offset and the cache's stride,
 * so a new token costs O(start·D).
 */
#include <string.h>

#include "internal.h"

enum { BQ = 32, BK = 32 }; /* query rows and keys per tile */

/* One forward problem: queries [B, Tq, H, D] at positions start.., keys/values [0, Tk) of
 * arrays [B, Ts, H, D] (Ts = T for attention_forward, Tmax for a cache). */
typedef struct {
    float *o, *lse;
    const float *q, *k, *v;
    int64_t B, Tq, Tk, Ts, H, D, start;
    float scale;
    int causal;
} problem;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void forward_head(const problem *p, int64_t b, int64_t h) {
    const int64_t D = p->D, HD = p->H * D;
    const float *qb = p->q + (b * p->Tq * p->H + h) * D; // row t at qb + t·HD
    const float *kb = p->k + (b * p->Ts * p->H + h) * D;
    const float *vb = p->v + (b * p->Ts * p->H + h) * D;
    float *ob = p->o + (b * p->Tq * p->H + h) * D;
    float *lse = p->lse + (b * p->H + h) * p->Tq; // (b, h, :)
    float s[BK], m[BQ], l[BQ];

    for (int64_t i0 = 0; i0 < p->Tq; i0 += BQ) {
        const int64_t nq = min64(BQ, p->Tq - i0);
        const int64_t kend = p->causal ? min64(p->Tk, p->start + i0 + nq) : p->Tk;
        for (int64_t r = 0; r < nq; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            memset(ob + (i0 + r) * HD, 0, (size_t)D * sizeof(float));
        }
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
            const int64_t nk = min64(BK, kend - j0);
            for (int64_t r = 0; r < nq; r++) {
                // keys of this tile row r may see: all, or those at positions <= its own
                const int64_t vis = p->causal ? min64(nk, p->start + i0 + r - j0 + 1) : nk;
                if (vis <= 0) continue;
                const float *qr = qb + (i0 + r) * HD;
                float *orow = ob + (i0 + r) * HD;
                float mx = m[r];
                for (int64_t c = 0; c < vis; c++) {
                    s[c] = p->scale * pytfm__dot(qr, kb + (j0 + c) * HD, D);
                    mx = s[c] > mx ? s[c] : mx;
                }
                const float alpha = expf(m[r] - mx); // 0 on the first visit (m = -inf)
                l[r] *= alpha;
                for (int64_t d = 0; d < D; d++) orow[d] *= alpha;
                for (int64_t c = 0; c < vis; c++) {
                    const float e = expf(s[c] - mx);
                    l[r] += e;
                    pytfm__axpy(orow, e, vb + (j0 + c) * HD, D);
                }
                m[r] = mx;
            }
        }
        for (int64_t r = 0; r < nq; r++) {
            float *orow = ob + (i0 + r) * HD;
            const float inv = 1.0f / l[r];
            for (int64_t d = 0; d < D; d++) orow[d] *= inv;
            lse[i0 + r] = m[r] + logf(l[r]);
        }
    }
}

static void forward_all(const problem *p) {
    PYTFM_PARALLEL_FOR
    for (int64_t bh = 0; bh < p->B * p->H; bh++) forward_head(p, bh / p->H, bh % p->H);
}

static pytfm_status check_sizes(const char *func, int64_t B, int64_t T, int64_t H, int64_t D,
                                float scale) {
    PYTFM_CHECK(B >= 0 && T >= 0 && H >= 0, "%s: B, T, H must be >= 0, got %lld, %lld, %lld",
                func, (long long)B, (long long)T, (long long)H);
    PYTFM_CHECK(D >= 1, "%s: D must be >= 1, got %lld", func, (long long)D);
    PYTFM_CHECK(isfinite(scale), "%s: scale must be finite, got %g", func, (double)scale);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_attention_forward(float *o, float *lse, const float *q, const float *k,
                                     const float *v, int64_t B, int64_t T, int64_t H, int64_t D,
                                     float scale, int32_t causal) {
    PYTFM_TRY(check_sizes(__func__, B, T, H, D, scale));
    const int64_t rows = B * T * H;
    PYTFM_CHECK_PTR(o, rows);
    PYTFM_CHECK_PTR(lse, rows);
    PYTFM_CHECK_PTR(q, rows);
    PYTFM_CHECK_PTR(k, rows);
    PYTFM_CHECK_PTR(v, rows);
    const problem p = {o, lse, q, k, v, B, T, T, T, H, D, 0, scale, causal != 0};
    forward_all(&p);
    return PYTFM_STATUS_OK;
}

static void backward_head(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, const float *o, const float *lse,
                          int64_t T, int64_t H, int64_t D, float scale, int causal) {
    // all pointers here are already offset to (b, 0, h, 0) / (b, h, 0); row t is t·HD further
    const int64_t HD = H * D;
    float Dt[BQ];
    for (int64_t t = 0; t < T; t++) {
        memset(dk + t * HD, 0, (size_t)D * sizeof(float));
        memset(dv + t * HD, 0, (size_t)D * sizeof(float));
    }
    for (int64_t i0 = 0; i0 < T; i0 += BQ) {
        const int64_t nq = min64(BQ, T - i0);
        const int64_t kend = causal ? i0 + nq : T;
        for (int64_t r = 0; r < nq; r++) {
            Dt[r] = pytfm__dot(dout + (i0 + r) * HD, o + (i0 + r) * HD, D);
            memset(dq + (i0 + r) * HD, 0, (size_t)D * sizeof(float));
        }
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
            const int64_t nk = min64(BK, kend - j0);
            for (int64_t r = 0; r < nq; r++) {
                const int64_t vis = causal ? min64(nk, i0 + r - j0 + 1) : nk;
                const int64_t t = i0 + r;
                const float *qt = q + t * HD, *dOt = dout + t * HD;
                for (int64_t c = 0; c < vis; c++) {
                    const int64_t s = j0 + c;
                    // forward: P_ts = exp(scale · q_t·k_s − lse_t); O_t = Σ_s P_ts v_s
                    const float P = expf(scale * pytfm__dot(qt, k + s * HD, D) - lse[t]);
                    pytfm__axpy(dv + s * HD, P, dOt, D);
                    const float dS = P * (pytfm__dot(dOt, v + s * HD, D) - Dt[r]) * scale;
                    pytfm__axpy(dq + t * HD, dS, k + s * HD, D);
                    pytfm__axpy(dk + s * HD, dS, qt, D);
                }
            }
        }
    }
}

pytfm_status pytfm_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                      const float *q, const float *k, const float *v,
                                      const float *o, const float *lse, int64_t B, int64_t T,
                                      int64_t H, int64_t D, float scale, int32_t causal) {
    PYTFM_TRY(check_sizes(__func__, B, T, H, D, scale));
    const int64_t rows = B * T * H;
    PYTFM_CHECK_PTR(dq, rows);
    PYTFM_CHECK_PTR(dk, rows);
    PYTFM_CHECK_PTR(dv, rows);
    PYTFM_CHECK_PTR(dout, rows);
    PYTFM_CHECK_PTR(q, rows);
    PYTFM_CHECK_PTR(k, rows);
    PYTFM_CHECK_PTR(v, rows);
    PYTFM_CHECK_PTR(o, rows);
    PYTFM_CHECK_PTR(lse, rows);
    PYTFM_PARALLEL_FOR
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H;
        const int64_t off = (b * T * H + h) * D; // (b, 0, h, 0)
        backward_head(dq + off, dk + off, dv + off, dout + off, q + off, k + off, v + off,
                      o + off, lse + bh * T, T, H, D, scale, causal != 0);
    }
    return PYTFM_STATUS_OK;
}

static pytfm_status check_cache(const char *func, int64_t n, int64_t Tmax, int64_t start) {
    PYTFM_CHECK(start >= 0, "%s: start must be >= 0, got %lld", func, (long long)start);
    PYTFM_CHECK(Tmax >= 1, "%s: Tmax must be >= 1, got %lld", func, (long long)Tmax);
    PYTFM_CHECK(start + n <= Tmax,
                "%s: cache overflow: positions [%lld, %lld) do not fit in Tmax = %lld", func,
                (long long)start, (long long)(start + n), (long long)Tmax);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_attention_cache_append(float *k_cache, float *v_cache, const float *k,
                                          const float *v, int64_t B, int64_t n, int64_t H,
                                          int64_t D, int64_t Tmax, int64_t start) {
    PYTFM_TRY(check_sizes(__func__, B, n, H, D, 1.0f));
    PYTFM_TRY(check_cache(__func__, n, Tmax, start));
    PYTFM_CHECK_PTR(k_cache, B * H);
    PYTFM_CHECK_PTR(v_cache, B * H);
    PYTFM_CHECK_PTR(k, B * n * H);
    PYTFM_CHECK_PTR(v, B * n * H);
    const size_t bytes = (size_t)(n * H * D) * sizeof(float); // n consecutive rows of a batch
    for (int64_t b = 0; b < B && n > 0; b++) {
        memcpy(k_cache + (b * Tmax + start) * H * D, k + b * n * H * D, bytes);
        memcpy(v_cache + (b * Tmax + start) * H * D, v + b * n * H * D, bytes);
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_attention_decode(float *o, float *lse, const float *q, const float *k_cache,
                                    const float *v_cache, int64_t B, int64_t n, int64_t H,
                                    int64_t D, int64_t Tmax, int64_t start, float scale) {
    PYTFM_TRY(check_sizes(__func__, B, n, H, D, scale));
    PYTFM_TRY(check_cache(__func__, n, Tmax, start));
    PYTFM_CHECK_PTR(o, B * n * H);
    PYTFM_CHECK_PTR(lse, B * n * H);
    PYTFM_CHECK_PTR(q, B * n * H);
    PYTFM_CHECK_PTR(k_cache, B * H);
    PYTFM_CHECK_PTR(v_cache, B * H);
    const problem p = {o, lse, q, k_cache, v_cache, B, n, start + n, Tmax, H, D, start, scale, 1};
    forward_all(&p);
    return PYTFM_STATUS_OK;
}
