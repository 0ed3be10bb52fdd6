/*
 * attention.c — multi-head scaled dot-product attention, flash-style, in linear memory, with
 * grouped-query heads and a sliding window.
 *
 *   q, o [B, T, H, D], k, v [B, T, Hkv, D] (row (b, t, h) holds D floats; the next t is H·D
 *   further on in q and o, Hkv·D in k and v); query head h reads key/value head h / (H / Hkv)
 *   (Hkv = H: multi-head; Hkv = 1: multi-query; transformers' repeat_kv)
 *   S = scale · q kᵀ (per batch and head, [T, T]),  P = softmax(S) row-wise (causal: keys ≤ t;
 *   with a window w > 0 too, keys s with t − w < s ≤ t: transformers' sliding window),
 *   O = P v,  lse_t = log Σ_s exp(S_ts)  ([B, H, T], saved for the backward)
 * D is whatever q's last axis holds (any D >= 1: nothing here assumes D = C / H).
 *
 * The T×T matrices S and P are never stored. The forward walks the keys in tiles of BK and
 * keeps, per query row, a running max m and sum l (the online softmax):
 *   m' = max(m, max_s S_ts),  l ← l·e^(m−m') + Σ_s e^(S_ts−m'),
 *   O_t ← O_t·e^(m−m') + Σ_s e^(S_ts−m') v_s
 * and divides O_t by l once at the end. Causal tiles above the diagonal are never visited, and
 * in a diagonal tile only the keys s ≤ t are.
 *
 * The backward gets dy, the gradient of O, and recomputes P_ts = exp(S_ts − lse_t) pair by pair:
 *   delta_t = Σ_d dy_td O_td                 (= Σ_s P_ts dP_ts)
 *   dV_s += P_ts dy_t,  dP_ts = dy_t · v_s,  dS_ts = P_ts (dP_ts − delta_t)
 *   dQ_t += scale · dS_ts k_s,  dK_s += scale · dS_ts q_t
 * One thread owns a whole (b, key/value head): the heads of its group one after another, so
 * dK and dV sum over the group in one fixed order, and the result is the same bits whatever
 * the number of threads. A window starts each row's keys at t − w + 1 (tiles wholly before
 * it are not visited) and ends each key's query rows at s + w − 1.
 *
 * Decoding: n_new queries at positions [start, start + n_new) attend to the keys
 * [0, start + n_new) of a cache [B, Tmax, H, D]; the same forward code runs with a query
 * offset and the cache's stride, so a new token costs O((start + n_new)·D). Fewer than
 * FAST_MIN_ROWS queries (a token, a short prompt's forward or feed) go one row at a time on the
 * vectorised row kernels (decode_rows), whether decoding or not: a prompt's forward is then
 * the bits of decoding it token by token.
 *
 * The plain version (first below) takes one query row and one key at a time. Its extra memory
 * is on the stack, whatever T is: BK scores and the running m and l of BQ query rows (forward),
 * delta of BQ rows (backward). The fast version (after it; used where sgemm has a
 * micro-kernel, for at least FAST_MIN_ROWS queries) runs the same algorithm on tiles, TQ×TK
 * forward (a row's keys in one tile up to Tk = TK: no rescaling at all there) and TQB×TKB
 * backward, with every product a call of sgemm's register micro-kernels straight on the
 * caller's rows (q, k, v, dy, dq, dk, dv, o through their row stride H·D) and on the tile of
 * scores: S = Q Kᵀ, O += P V forward; S, then dV += Pᵀ dY, dP = dY Vᵀ, dK += dSᵀ Q,
 * dQ += dS K backward (FlashAttention-2's loop order: key tiles outside, so dK and dV of a
 * tile stay hot). On the causal diagonal each product skips, micro-tile by micro-tile, what no
 * row of the micro-tile sees (scores_gemm, rows_gemm, cols_gemm): at the model's T = 128 the
 * diagonal is most of the work, and half of a full diagonal tile is masked away. Only
 * Kᵀ (and Vᵀ for the backward) are copied, once per head, so that the micro-kernel reads them
 * along contiguous rows. Its scratch, one workspace per thread, allocated once per call, is
 * linear in T (Tk = T, or start + n_new when decoding):
 *   forward:  Kᵀ, the TQ×TK scores, m and l:        D·Tk + TQ·LDS + 2·TQ floats
 *   backward: Kᵀ, Vᵀ, the scores, dP and delta:     2·D·T + 2·TQB·LDSB + T floats
 * (LDS = TK + 16, LDSB = TKB + 16: a row of scores has room for a window's row kernel call
 * that starts mid-row and writes whole vectors of 16.)
 */
#include <stdlib.h>
#include <string.h>

#include "core/checks.h"
#include "fast.h"

enum { BQ = 32, BK = 32 }; /* query rows and keys per tile */

/* One forward problem: queries [B, Tq, H, D] at positions start.., keys/values [0, Tk) of
 * arrays [B, Ts, Hkv, D] (Ts = Tk for attention_forward, Tmax for a cache); window 0 or the
 * sliding window (causal). Sequence b has its first q_len[b] queries and k_len[b] keys (NULL:
 * all Tq, all Tk); its rows past q_len[b], and a row that sees no key, get o = 0, lse = −inf. */
typedef struct {
    float *o, *lse;
    const float *q, *k, *v;
    const int64_t *q_len, *k_len;
    int64_t B, Tq, Tk, Ts, H, Hkv, D, start, window;
    float scale;
    int causal;
} problem;

/* sequence b's query rows and keys */
static inline int64_t rows_of(const problem *p, int64_t b) { return p->q_len ? p->q_len[b] : p->Tq; }
static inline int64_t keys_of(const problem *p, int64_t b) { return p->k_len ? p->k_len[b] : p->Tk; }

/* rows [from, to) of a head's o (row stride HD) and lse: no key seen, o = 0, lse = −inf */
static void clear_rows(float *o, float *lse, int64_t from, int64_t to, int64_t HD, int64_t D) {
    for (int64_t r = from; r < to; r++) {
        memset(o + r * HD, 0, (size_t)D * sizeof(float));
        lse[r] = -INFINITY;
    }
}

/* The end of a row: o /= l, lse = m + log l; or, for a row that saw no key (l = 0: a key seen
 * adds e^(s − max) = 1 at least), o = 0 and lse = −inf */
static inline void finish_row(float *orow, float *lse, float m, float l, int64_t D) {
    if (l == 0.0f) {
        clear_rows(orow, lse, 0, 1, D, D);
        return;
    }
    const float inv = 1.0f / l;
    for (int64_t d = 0; d < D; d++) orow[d] *= inv;
    *lse = m + logf(l);
}

/* Head (b, h) of a problem: its rows of q and o (row t at q + t·H·D), of its key/value head's
 * k and v (row s at k + s·Hkv·D), and its lse [Tq] (b, h, :). */
typedef struct {
    const float *q, *k, *v;
    float *o, *lse;
} head;

static head head_of(const problem *p, int64_t b, int64_t h) {
    const int64_t D = p->D, g = h / (p->H / p->Hkv); // the key/value head of h's group
    return (head){p->q + (b * p->Tq * p->H + h) * D, p->k + (b * p->Ts * p->Hkv + g) * D,
                  p->v + (b * p->Ts * p->Hkv + g) * D, p->o + (b * p->Tq * p->H + h) * D,
                  p->lse + (b * p->H + h) * p->Tq};
}

/* the first key the query at position pos sees: pos − window + 1 with a window, else 0 */
static inline int64_t first_key(int64_t window, int64_t pos) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* the first key of the tile starting at key j0 that the query at position pos sees (0: the
 * tile's first, past the tile: none of them) */
static inline int64_t tile_first(int64_t window, int64_t pos, int64_t j0) {
    const int64_t c0 = first_key(window, pos) - j0;
    return c0 > 0 ? c0 : 0;
}

static void forward_head(const problem *p, int64_t b, int64_t h) {
    const int64_t D = p->D, HD = p->H * D, KD = p->Hkv * D, Tq = rows_of(p, b);
    const int64_t Tk = keys_of(p, b);
    const head hd = head_of(p, b, h);
    const float *qb = hd.q, *kb = hd.k, *vb = hd.v; // row t at qb + t·HD, kb + t·KD
    float *ob = hd.o, *lse = hd.lse;
    float s[BK], m[BQ], l[BQ];

    clear_rows(ob, lse, Tq, p->Tq, HD, D);
    for (int64_t i0 = 0; i0 < Tq; i0 += BQ) {
        const int64_t nq = PYTFM_MIN(BQ, Tq - i0);
        const int64_t kend = p->causal ? PYTFM_MIN(Tk, p->start + i0 + nq) : Tk;
        for (int64_t r = 0; r < nq; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            memset(ob + (i0 + r) * HD, 0, (size_t)D * sizeof(float));
        }
        // from the first key of the tile's first row (a window's rows start later down the tile)
        for (int64_t j0 = first_key(p->window, p->start + i0); j0 < kend; j0 += BK) {
            const int64_t nk = PYTFM_MIN(BK, kend - j0);
            for (int64_t r = 0; r < nq; r++) {
                // keys [c0, vis) of this tile row r sees: all, or those at positions <= its
                // own, and with a window those after its position − window
                const int64_t vis = p->causal ? PYTFM_MIN(nk, p->start + i0 + r - j0 + 1) : nk;
                const int64_t c0 = tile_first(p->window, p->start + i0 + r, j0);
                if (vis <= c0) continue;
                const float *qr = qb + (i0 + r) * HD;
                float *orow = ob + (i0 + r) * HD;
                float mx = m[r];
                for (int64_t c = c0; c < vis; c++) {
                    s[c] = p->scale * pytfm__dot(qr, kb + (j0 + c) * KD, D);
                    mx = s[c] > mx ? s[c] : mx;
                }
                const float alpha = expf(m[r] - mx); // 0 on the first visit (m = -inf)
                l[r] *= alpha;
                for (int64_t d = 0; d < D; d++) orow[d] *= alpha;
                for (int64_t c = c0; c < vis; c++) {
                    const float e = expf(s[c] - mx);
                    l[r] += e;
                    pytfm__axpy(orow, e, vb + (j0 + c) * KD, D);
                }
                m[r] = mx;
            }
        }
        for (int64_t r = 0; r < nq; r++) finish_row(ob + (i0 + r) * HD, lse + i0 + r, m[r], l[r], D);
    }
}

static void forward_all(const problem *p) {
    PYTFM_PARALLEL_FOR
    for (int64_t bh = 0; bh < p->B * p->H; bh++) forward_head(p, bh / p->H, bh % p->H);
}

/* ---- decoding a few queries: one row at a time, on the vectorised row kernels -------------- */

enum { RK = 64 }; /* keys per tile */

/* The forward's online softmax for each query row of (b, h) alone, tiles of RK keys: the
 * scores as dot products along the keys' rows (fast.h gemv: no Kᵀ to build for one query),
 * the tile's softmax step (attn_softmax_row), then o = alpha·o + P·V (attn_pv_row). */
static void decode_head_rows(const problem *p, const pytfm__fast_kernels *fk, int64_t b,
                             int64_t h) {
    const int64_t D = p->D, HD = p->H * D, KD = p->Hkv * D, Tq = rows_of(p, b);
    const int64_t Tk = keys_of(p, b);
    const head hd = head_of(p, b, h);
    const float *qb = hd.q, *kb = hd.k, *vb = hd.v; // row t at qb + t·HD, kb + t·KD
    float *ob = hd.o, *lse = hd.lse;
    float s[RK];
    clear_rows(ob, lse, Tq, p->Tq, HD, D);
    for (int64_t r = 0; r < Tq; r++) {
        const float *qr = qb + r * HD;
        float *orow = ob + r * HD;
        const int64_t kend = p->causal ? PYTFM_MIN(Tk, p->start + r + 1) : Tk;
        float m = -INFINITY, l = 0.0f;
        memset(orow, 0, (size_t)D * sizeof(float));
        for (int64_t j0 = first_key(p->window, p->start + r); j0 < kend; j0 += RK) {
            const int64_t nk = PYTFM_MIN(RK, kend - j0);
            fk->gemv(s, qr, kb + j0 * KD, KD, NULL, D, nk);
            const float alpha = fk->attn_softmax_row(s, nk, nk, p->scale, &m, &l);
            fk->attn_pv_row(orow, s, vb + j0 * KD, KD, nk, D, alpha);
        }
        finish_row(orow, lse + r, m, l, D);
    }
}

/* A token or a few (queries of them per head, below FAST_MIN_ROWS) row by row, heads to
 * threads when there is work to share (the product is at most the cache's elements): the
 * decoding of attention_decode, and attention_forward's of a prompt that short, so that a
 * prompt's forward is the bits of decoding it a token at a time. */
static pytfm_status decode_rows(const problem *p, const pytfm__fast_kernels *fk,
                                int64_t queries) {
    const int64_t BH = p->B * p->H, work = BH * p->Tk * p->D;
    if (BH == 1 || work <= PYTFM_TASK_ELEMS / queries) { // no parallel region
        for (int64_t bh = 0; bh < BH; bh++) decode_head_rows(p, fk, bh / p->H, bh % p->H);
        return PYTFM_STATUS_OK;
    }
    PYTFM_PARALLEL_FOR
    for (int64_t bh = 0; bh < BH; bh++) decode_head_rows(p, fk, bh / p->H, bh % p->H);
    return PYTFM_STATUS_OK;
}

/* ---- the fast version: tiles through the sgemm micro-kernels ------------------------------ */

/* Query rows and keys per tile: forward TQ×TK (one key tile covers a whole row when Tk <= TK,
 * so the online softmax rescales nothing), backward TQB×TKB. */
enum { TQ = 64, TK = 256, TQB = 64, TKB = 64, FAST_MIN_ROWS = 8 };
/* row strides of the score tiles: a window's row kernel call starts at the row's first key c0
 * and may write whole vectors up to c0 + (vis − c0) rounded up to 16, at most 15 past TK */
enum { LDS = TK + 16, LDSB = TKB + 16 };
_Static_assert(TK % 16 == 0 && TKB % 16 == 0 && RK % 16 == 0,
               "attn_softmax_row and attn_p_row may write a row up to vis rounded up to 16");

/* In a tile of query rows i0.. and keys j0.., row r sees the keys c <= r + diag (causal:
 * diag = start + i0 − j0; otherwise diag = the tile's key count, so every key). The products
 * below skip what no row of a micro-tile sees, so that a tile on the diagonal costs about half
 * a full one instead of all of it. */

/* the keys [0, lim) that the block of mr rows holding row r reads (the row of that block seen
 * last: the block runs from r rounded down to a multiple of mr, and stops at m); n at most */
static inline int64_t block_keys(int64_t r, int mr, int64_t m, int64_t n, int64_t diag) {
    const int64_t lim = PYTFM_MIN(r / mr * mr + mr, m) + diag;
    return lim < 0 ? 0 : PYTFM_MIN(n, lim);
}

/* Scores C[m, n] (row stride ldc) = A·Bᵀ over kc = D, A's rows a + r·lda (q or dy as they lie),
 * B's transposed bt_ [kc, ldb] (Kᵀ or Vᵀ): the micro-tiles that some row of theirs sees; the
 * rest of C is left as it was (the row kernels read a row only up to what it sees). */
static void scores_gemm(const pytfm__micro *uk, float *c, int64_t ldc, const float *a,
                        int64_t lda, const float *bt_, int64_t ldb, int64_t m, int64_t n,
                        int64_t kc, int64_t diag) {
    for (int64_t j = 0; j < n; j += uk->nr)
        for (int64_t i = 0; i < m; i += uk->mr)
            if (block_keys(i, uk->mr, m, n, diag) > j)
                uk->run(c + i * ldc + j, ldc, a + i * lda, 1, lda, bt_ + j, ldb, kc,
                        (int)PYTFM_MIN(uk->mr, m - i), (int)PYTFM_MIN(uk->nr, n - j), 0.0f);
}

/* C[m, n] = bt·C + A·B, A [m, kc] the rows of P or dS (row stride lda), B's rows b + p·ldb (v
 * or k as they lie): each block of rows sums only the keys it sees (its P is 0 past them);
 * bt = 0 writes every row, even one that sees nothing */
static void rows_gemm(const pytfm__micro *uk, float *c, int64_t ldc, const float *a, int64_t lda,
                      const float *b, int64_t ldb, int64_t m, int64_t n, int64_t kc, float bt,
                      int64_t diag) {
    for (int64_t j = 0; j < n; j += uk->nr)
        for (int64_t i = 0; i < m; i += uk->mr) {
            const int64_t lim = block_keys(i, uk->mr, m, kc, diag);
            if (lim > 0 || bt == 0.0f)
                uk->run(c + i * ldc + j, ldc, a + i * lda, 1, lda, b + j, ldb, lim,
                        (int)PYTFM_MIN(uk->mr, m - i), (int)PYTFM_MIN(uk->nr, n - j), bt);
        }
}

/* C[m, n] += Aᵀ·B over the kc query rows: C's rows are keys, A [kc, lda] is P or dS (read down
 * its columns), B's rows b + p·ldb (dy or q as they lie); a block of keys starts its sum at
 * the first query row that sees its first key (the rows above have P = 0 there) */
static void cols_gemm(const pytfm__micro *uk, float *c, int64_t ldc, const float *a, int64_t lda,
                      const float *b, int64_t ldb, int64_t m, int64_t n, int64_t kc,
                      int64_t diag) {
    for (int64_t j = 0; j < n; j += uk->nr)
        for (int64_t i = 0; i < m; i += uk->mr) {
            const int64_t p0 = i - diag > 0 ? i - diag : 0; // key i is seen from row i − diag on
            if (p0 < kc)
                uk->run(c + i * ldc + j, ldc, a + p0 * lda + i, lda, 1, b + p0 * ldb + j, ldb,
                        kc - p0, (int)PYTFM_MIN(uk->mr, m - i), (int)PYTFM_MIN(uk->nr, n - j),
                        1.0f);
        }
}

/* dst [D, rows] = the transpose of rows rows of D floats, row stride HD: eight rows at a time,
 * a fixed count that the compiler keeps in registers (each of the eight is read along d, each
 * row of dst written eight floats at a time) */
static void transpose_rows(float *dst, const float *src, int64_t rows, int64_t D, int64_t HD) {
    int64_t t0 = 0;
    for (; t0 + 8 <= rows; t0 += 8) {
        const float *s = src + t0 * HD;
        for (int64_t d = 0; d < D; d++)
            for (int i = 0; i < 8; i++) dst[d * rows + t0 + i] = s[i * HD + d];
    }
    for (; t0 < rows; t0++)
        for (int64_t d = 0; d < D; d++) dst[d * rows + t0] = src[t0 * HD + d];
}

typedef struct {
    const pytfm__micro *uk;
    const pytfm__fast_kernels *fk;
} fast_path;

/* the scratch floats of one thread (see the top of the file); D·Tk and D·T are at most the
 * floats of k, which the checks let through only when they fit */
static int64_t forward_ws_floats(const problem *p) { return p->D * p->Tk + TQ * LDS + 2 * TQ; }
static int64_t backward_ws_floats(int64_t Tq, int64_t Tk, int64_t D) {
    return 2 * D * Tk + 2 * TQB * LDSB + Tq;
}

/* the scores row s [nk] of a query whose keys in the tile are [c0, vis) (vis <= c0: none),
 * lim of them read by the product after it: P there, 0 elsewhere in [0, lim), through the
 * forward's online-softmax step (m, l of the row updated); returns the factor the row's output
 * so far must be scaled by, or 1 where the tile has no key for the row */
static float softmax_part(const fast_path *f, float *s, int64_t c0, int64_t vis, int64_t lim,
                          float scale, float *m, float *l) {
    if (vis <= c0) { // no key of this tile is visible: P = 0, nothing to rescale
        memset(s, 0, (size_t)lim * sizeof(float));
        return 1.0f;
    }
    memset(s, 0, (size_t)c0 * sizeof(float));
    return f->fk->attn_softmax_row(s + c0, vis - c0, lim - c0, scale, m, l);
}

static void forward_head_fast(const problem *p, const fast_path *f, float *ws, int64_t b,
                              int64_t h) {
    const int64_t D = p->D, HD = p->H * D, KD = p->Hkv * D, Tq = rows_of(p, b);
    const int64_t Tk = keys_of(p, b);
    const int mr = f->uk->mr;
    const head hd = head_of(p, b, h);
    const float *qb = hd.q, *kb = hd.k, *vb = hd.v; // row t at qb + t·HD, kb + t·KD
    float *ob = hd.o, *lse = hd.lse;
    // kt [D, nkt]: the keys [k0, Tk) transposed, k0 the first query's first key (a window's
    // later queries start later still; none when that is past the sequence's keys)
    const int64_t k0 = PYTFM_MIN(first_key(p->window, p->start), Tk), nkt = Tk - k0;
    float *kt = ws, *s = kt + D * p->Tk, *m = s + TQ * LDS, *l = m + TQ; // s [TQ, LDS]
    transpose_rows(kt, kb + k0 * KD, nkt, D, KD);
    clear_rows(ob, lse, Tq, p->Tq, HD, D);
    for (int64_t i0 = 0; i0 < Tq; i0 += TQ) {
        const int64_t nq = PYTFM_MIN(TQ, Tq - i0);
        const int64_t kend = p->causal ? PYTFM_MIN(Tk, p->start + i0 + nq) : Tk;
        const int64_t jbeg = first_key(p->window, p->start + i0);
        for (int64_t r = 0; r < nq; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        for (int64_t j0 = jbeg; j0 < kend; j0 += TK) {
            const int64_t nk = PYTFM_MIN(TK, kend - j0);
            const int64_t diag = p->causal ? p->start + i0 - j0 : nk;
            // S = Q_i K_jᵀ [nq, nk]
            scores_gemm(f->uk, s, LDS, qb + i0 * HD, HD, kt + (j0 - k0), nkt, nq, nk, D, diag);
            for (int64_t r = 0; r < nq; r++) {
                const int64_t lim = block_keys(r, mr, nq, nk, diag); // what O += P V reads
                const int64_t vis = p->causal ? PYTFM_MIN(nk, p->start + i0 + r - j0 + 1) : nk;
                const int64_t c0 = tile_first(p->window, p->start + i0 + r, j0);
                const float alpha =
                    softmax_part(f, s + r * LDS, c0, vis, lim, p->scale, m + r, l + r);
                if (j0 == jbeg) continue; // O is written, not rescaled, by the first tile's P V
                if (alpha != 1.0f)
                    for (int64_t d = 0; d < D; d++) ob[(i0 + r) * HD + d] *= alpha;
            }
            // O_i = P V_j on the first key tile, O_i += P V_j after it
            rows_gemm(f->uk, ob + i0 * HD, HD, s, LDS, vb + j0 * KD, KD, nq, D, nk,
                      j0 == jbeg ? 0.0f : 1.0f, diag);
        }
        for (int64_t r = 0; r < nq; r++) finish_row(ob + (i0 + r) * HD, lse + i0 + r, m[r], l[r], D);
    }
}

/* the fast path, or 0 where the plain one runs (no micro-kernel, or too few query rows) */
static int fast_path_for(fast_path *f, int64_t queries) {
    const int32_t isa = pytfm_get_isa(); // read once: both kernels for the same ISA
    f->uk = pytfm__micro_for(isa);
    f->fk = pytfm__fast_for(isa);
    return f->uk && f->fk && queries >= FAST_MIN_ROWS;
}

/* one workspace of per floats for each of threads threads (NULL, with func's error recorded,
 * when that cannot be allocated: threads·per may even pass INT64_MAX) */
static float *workspaces(const char *func, int64_t threads, int64_t per) {
    int64_t floats;
    if (!pytfm__mul_within(threads, per, INT64_MAX, &floats)) {
        pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                    "%s: cannot allocate %lld workspaces of %lld floats (more than memory holds)",
                    func, (long long)threads, (long long)per);
        return NULL;
    }
    return pytfm__scratch(func, floats, sizeof(float));
}

static pytfm_status forward_fast(const char *func, const problem *p, const fast_path *f) {
    const int64_t per = forward_ws_floats(p), threads = pytfm_get_num_threads();
    float *ws = workspaces(func, threads, per);
    if (!ws) return PYTFM_STATUS_OUT_OF_MEMORY;
    PYTFM_PARALLEL_FOR_THREADS(threads)
    for (int64_t bh = 0; bh < p->B * p->H; bh++)
        forward_head_fast(p, f, ws + pytfm__thread_id() * per, bh / p->H, bh % p->H);
    free(ws);
    return PYTFM_STATUS_OK;
}

/* One backward problem: dq, dy, q, o [B, Tq, H, D], dk, dv, k, v [B, Tk, Hkv, D], lse
 * [B, H, Tq]; sequence b's first q_len[b] queries and k_len[b] keys (NULL: all), as the
 * forward's */
typedef struct {
    float *dq, *dk, *dv;
    const float *dy, *q, *k, *v, *o, *lse;
    const int64_t *q_len, *k_len;
    int64_t B, Tq, Tk, H, Hkv, D, window;
    float scale;
    int causal;
} grad_problem;

static inline int64_t grad_rows(const grad_problem *p, int64_t b) {
    return p->q_len ? p->q_len[b] : p->Tq;
}
static inline int64_t grad_keys(const grad_problem *p, int64_t b) {
    return p->k_len ? p->k_len[b] : p->Tk;
}

/* Head h's rows of dq, dy, q, o (row t at + t·H·D), its group's rows of k, v, dk, dv (row s at
 * + s·Hkv·D) and its lse [Tq] */
typedef struct {
    float *dq, *dk, *dv;
    const float *dy, *q, *k, *v, *o, *lse;
} grad_head;

static grad_head grad_head_of(const grad_problem *p, int64_t b, int64_t h) {
    const int64_t D = p->D, g = h / (p->H / p->Hkv);
    const int64_t qo = (b * p->Tq * p->H + h) * D, ko = (b * p->Tk * p->Hkv + g) * D;
    return (grad_head){p->dq + qo, p->dk + ko, p->dv + ko,          p->dy + qo, p->q + qo,
                       p->k + ko,  p->v + ko,  p->o + qo, p->lse + (b * p->H + h) * p->Tq};
}

/* the last query row + 1 (of the Tq rows of a sequence) that sees a key of the tile ending at
 * key j_last: with a window, the rows t <= j_last + window − 1 */
static inline int64_t last_row_end(const grad_problem *p, int64_t Tq, int64_t j_last) {
    return p->window > 0 ? PYTFM_MIN(Tq, j_last + p->window) : Tq;
}

/* Head h's part of the backward, kt and vt [D, Tk] its group's keys and values transposed
 * (Tk: the sequence's keys): dq of h written (0 past the sequence's rows), dk and dv of the
 * group accumulated (+=) */
static void backward_head_fast(const grad_problem *p, const fast_path *f, float *ws,
                               const float *kt, const float *vt, int64_t b, int64_t h) {
    const int64_t Tq = grad_rows(p, b), Tk = grad_keys(p, b), D = p->D, HD = p->H * D;
    const int64_t KD = p->Hkv * D;
    const float scale = p->scale;
    const int causal = p->causal;
    const grad_head g = grad_head_of(p, b, h);
    float *s = ws, *dp = s + TQB * LDSB, *delta = dp + TQB * LDSB;
    for (int64_t t = 0; t < p->Tq; t++) memset(g.dq + t * HD, 0, (size_t)D * sizeof(float));
    for (int64_t t = 0; t < Tq; t++) delta[t] = pytfm__dot(g.dy + t * HD, g.o + t * HD, D);
    for (int64_t j0 = 0; j0 < Tk; j0 += TKB) {
        const int64_t nk = PYTFM_MIN(TKB, Tk - j0), iend = last_row_end(p, Tq, j0 + nk - 1);
        for (int64_t i0 = causal ? j0 / TQB * TQB : 0; i0 < iend; i0 += TQB) {
            const int64_t nq = PYTFM_MIN(TQB, Tq - i0), diag = causal ? i0 - j0 : nk;
            // forward: S = scale · Q_i K_jᵀ, P = exp(S − lse) (0 where not seen, to the tile's
            // end: dV and dK read P and dS down their columns)
            scores_gemm(f->uk, s, LDSB, g.q + i0 * HD, HD, kt + j0, Tk, nq, nk, D, diag);
            for (int64_t r = 0; r < nq; r++) {
                const int64_t vis = causal ? PYTFM_MIN(nk, i0 + r - j0 + 1) : nk;
                const int64_t c0 = tile_first(p->window, i0 + r, j0);
                float *sr = s + r * LDSB;
                if (vis <= c0) {
                    memset(sr, 0, (size_t)nk * sizeof(float));
                } else {
                    memset(sr, 0, (size_t)c0 * sizeof(float));
                    f->fk->attn_p_row(sr + c0, vis - c0, nk - c0, scale, g.lse[i0 + r]);
                }
            }
            // dV_j += Pᵀ dY_i;  dP = dY_i V_jᵀ;  dS = P (dP − delta) scale (0 where P is)
            cols_gemm(f->uk, g.dv + j0 * KD, KD, s, LDSB, g.dy + i0 * HD, HD, nk, D, nq, diag);
            scores_gemm(f->uk, dp, LDSB, g.dy + i0 * HD, HD, vt + j0, Tk, nq, nk, D, diag);
            for (int64_t r = 0; r < nq; r++) {
                const int64_t vis = causal ? PYTFM_MIN(nk, i0 + r - j0 + 1) : nk;
                f->fk->attn_ds_row(dp + r * LDSB, s + r * LDSB, vis < 0 ? 0 : vis, nk,
                                   delta[i0 + r], scale);
            }
            // dK_j += dSᵀ Q_i;  dQ_i += dS K_j
            cols_gemm(f->uk, g.dk + j0 * KD, KD, dp, LDSB, g.q + i0 * HD, HD, nk, D, nq, diag);
            rows_gemm(f->uk, g.dq + i0 * HD, HD, dp, LDSB, g.k + j0 * KD, KD, nq, D, nk, 1.0f,
                      diag);
        }
    }
}

/* Head h's part of the backward, one query row and one key at a time: dq of h written (0 past
 * the sequence's rows), dk and dv of its group accumulated (+=) */
static void backward_head(const grad_problem *p, int64_t b, int64_t h) {
    const int64_t Tq = grad_rows(p, b), Tk = grad_keys(p, b), D = p->D, HD = p->H * D;
    const int64_t KD = p->Hkv * D;
    const float scale = p->scale;
    const int causal = p->causal;
    const grad_head g = grad_head_of(p, b, h);
    float delta[BQ];
    for (int64_t t = Tq; t < p->Tq; t++) memset(g.dq + t * HD, 0, (size_t)D * sizeof(float));
    for (int64_t i0 = 0; i0 < Tq; i0 += BQ) {
        const int64_t nq = PYTFM_MIN(BQ, Tq - i0);
        const int64_t kend = causal ? PYTFM_MIN(Tk, i0 + nq) : Tk;
        for (int64_t r = 0; r < nq; r++) {
            delta[r] = pytfm__dot(g.dy + (i0 + r) * HD, g.o + (i0 + r) * HD, D);
            memset(g.dq + (i0 + r) * HD, 0, (size_t)D * sizeof(float));
        }
        for (int64_t j0 = first_key(p->window, i0); j0 < kend; j0 += BK) {
            const int64_t nk = PYTFM_MIN(BK, kend - j0);
            for (int64_t r = 0; r < nq; r++) {
                const int64_t vis = causal ? PYTFM_MIN(nk, i0 + r - j0 + 1) : nk;
                const int64_t t = i0 + r;
                const float *qt = g.q + t * HD, *dyt = g.dy + t * HD;
                for (int64_t c = tile_first(p->window, t, j0); c < vis; c++) {
                    const int64_t s = j0 + c;
                    // forward: P_ts = exp(scale · q_t·k_s − lse_t); O_t = Σ_s P_ts v_s
                    const float P = expf(scale * pytfm__dot(qt, g.k + s * KD, D) - g.lse[t]);
                    pytfm__axpy(g.dv + s * KD, P, dyt, D);
                    const float dS = P * (pytfm__dot(dyt, g.v + s * KD, D) - delta[r]) * scale;
                    pytfm__axpy(g.dq + t * HD, dS, g.k + s * KD, D);
                    pytfm__axpy(g.dk + s * KD, dS, qt, D);
                }
            }
        }
    }
}

/* The backward of key/value head kv of batch b: its dk and dv zeroed, then the heads of its
 * group in order (f NULL: the plain version; else ws is this thread's workspace) */
static void backward_group(const grad_problem *p, const fast_path *f, float *ws, int64_t b,
                           int64_t kv) {
    const int64_t Tk = p->Tk, D = p->D, KD = p->Hkv * D, G = p->H / p->Hkv;
    const int64_t ko = (b * Tk * p->Hkv + kv) * D; // (b, 0, kv, 0)
    for (int64_t t = 0; t < Tk; t++) {
        memset(p->dk + ko + t * KD, 0, (size_t)D * sizeof(float));
        memset(p->dv + ko + t * KD, 0, (size_t)D * sizeof(float));
    }
    if (!f) {
        for (int64_t h = kv * G; h < (kv + 1) * G; h++) backward_head(p, b, h);
        return;
    }
    const int64_t nk = grad_keys(p, b); // the sequence's keys: kt, vt [D, nk]
    float *kt = ws, *vt = kt + D * Tk;
    transpose_rows(kt, p->k + ko, nk, D, KD);
    transpose_rows(vt, p->v + ko, nk, D, KD);
    for (int64_t h = kv * G; h < (kv + 1) * G; h++)
        backward_head_fast(p, f, vt + D * Tk, kt, vt, b, h);
}

static pytfm_status backward_fast(const char *func, const grad_problem *p, const fast_path *f) {
    const int64_t per = backward_ws_floats(p->Tq, p->Tk, p->D);
    const int64_t threads = pytfm_get_num_threads();
    float *ws = workspaces(func, threads, per);
    if (!ws) return PYTFM_STATUS_OUT_OF_MEMORY;
    PYTFM_PARALLEL_FOR_THREADS(threads)
    for (int64_t bg = 0; bg < p->B * p->Hkv; bg++)
        backward_group(p, f, ws + pytfm__thread_id() * per, bg / p->Hkv, bg % p->Hkv);
    free(ws);
    return PYTFM_STATUS_OK;
}

/* the forward of p (checked), its scratch's failure named after func */
static pytfm_status run_forward(const char *func, const problem *p) {
    if (p->B * p->Tq * p->H == 0) return PYTFM_STATUS_OK; // nothing to do: no workspace either
    if (p->Tk == 0) { // no keys at all (k may be NULL): every row sees none
        for (int64_t bh = 0; bh < p->B * p->H; bh++)
            clear_rows(p->o + (bh / p->H * p->Tq * p->H + bh % p->H) * p->D,
                       p->lse + bh * p->Tq, 0, p->Tq, p->H * p->D, p->D);
        return PYTFM_STATUS_OK;
    }
    fast_path f;
    if (fast_path_for(&f, p->Tq)) return forward_fast(func, p, &f);
    if (f.fk) return decode_rows(p, f.fk, p->Tq);
    forward_all(p);
    return PYTFM_STATUS_OK;
}

/* the backward of p (checked), its scratch's failure named after func */
static pytfm_status run_backward(const char *func, const grad_problem *p) {
    if (p->B * p->H == 0) return PYTFM_STATUS_OK; // nothing to do: no workspace either
    if (p->Tq == 0 || p->Tk == 0) { // no row sees a key (q or k may be NULL): all zeros
        const int64_t n_q = p->B * p->Tq * p->H * p->D, n_kv = p->B * p->Tk * p->Hkv * p->D;
        if (n_q) memset(p->dq, 0, (size_t)n_q * sizeof(float));
        if (n_kv) memset(p->dk, 0, (size_t)n_kv * sizeof(float));
        if (n_kv) memset(p->dv, 0, (size_t)n_kv * sizeof(float));
        return PYTFM_STATUS_OK;
    }
    fast_path f;
    if (fast_path_for(&f, p->Tq)) return backward_fast(func, p, &f);
    PYTFM_PARALLEL_FOR
    for (int64_t bg = 0; bg < p->B * p->Hkv; bg++)
        backward_group(p, NULL, NULL, bg / p->Hkv, bg % p->Hkv);
    return PYTFM_STATUS_OK;
}

/* The one forward of attention_forward, _gqa_forward and _padded_forward (checked by the
 * caller, func) */
static pytfm_status padded_forward(const char *func, float *o, float *lse, const float *q,
                                   const float *k, const float *v, const int64_t *q_len,
                                   const int64_t *k_len, int64_t B, int64_t Tq, int64_t Tk,
                                   int64_t H, int64_t Hkv, int64_t D, float scale,
                                   int32_t causal, int64_t window) {
    const problem p = {.o = o, .lse = lse, .q = q, .k = k, .v = v, .q_len = q_len,
                       .k_len = k_len, .B = B, .Tq = Tq, .Tk = Tk, .Ts = Tk, .H = H, .Hkv = Hkv,
                       .D = D, .start = 0, .window = window, .scale = scale,
                       .causal = causal != 0};
    return run_forward(func, &p);
}

/* The one backward of attention_backward, _gqa_backward and _padded_backward (checked) */
static pytfm_status padded_backward(const char *func, float *dq, float *dk, float *dv,
                                    const float *dy, const float *q, const float *k,
                                    const float *v, const float *o, const float *lse,
                                    const int64_t *q_len, const int64_t *k_len, int64_t B,
                                    int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
                                    float scale, int32_t causal, int64_t window) {
    const grad_problem p = {.dq = dq, .dk = dk, .dv = dv, .dy = dy, .q = q, .k = k, .v = v,
                            .o = o, .lse = lse, .q_len = q_len, .k_len = k_len, .B = B,
                            .Tq = Tq, .Tk = Tk, .H = H, .Hkv = Hkv, .D = D, .window = window,
                            .scale = scale, .causal = causal != 0};
    return run_backward(func, &p);
}

pytfm_status pytfm_attention_padded_forward(float *o, float *lse, const float *q,
                                            const float *k, const float *v, const int64_t *q_len,
                                            const int64_t *k_len, int64_t B, int64_t Tq,
                                            int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
                                            float scale, int32_t causal, int64_t window) {
    PYTFM_TRY(pytfm__check_attention_padded_forward(__func__, o, lse, q, k, v, q_len, k_len, B,
                                                    Tq, Tk, H, Hkv, D, scale, causal, window));
    PYTFM_TRY(pytfm__check_attention_lengths(__func__, q_len, k_len, B, Tq, Tk));
    return padded_forward(__func__, o, lse, q, k, v, q_len, k_len, B, Tq, Tk, H, Hkv, D, scale,
                          causal, window);
}

pytfm_status pytfm_attention_gqa_forward(float *o, float *lse, const float *q, const float *k,
                                         const float *v, int64_t B, int64_t T, int64_t H,
                                         int64_t Hkv, int64_t D, float scale, int32_t causal,
                                         int64_t window) {
    PYTFM_TRY(pytfm__check_attention_forward(__func__, o, lse, q, k, v, B, T, H, Hkv, D, scale,
                                             causal, window));
    return padded_forward(__func__, o, lse, q, k, v, NULL, NULL, B, T, T, H, Hkv, D, scale,
                          causal, window);
}

pytfm_status pytfm_attention_forward(float *o, float *lse, const float *q, const float *k,
                                     const float *v, int64_t B, int64_t T, int64_t H, int64_t D,
                                     float scale, int32_t causal) {
    PYTFM_TRY(pytfm__check_attention_forward(__func__, o, lse, q, k, v, B, T, H, H, D, scale,
                                             causal, 0));
    return padded_forward(__func__, o, lse, q, k, v, NULL, NULL, B, T, T, H, H, D, scale, causal,
                          0);
}

pytfm_status pytfm_attention_padded_backward(float *dq, float *dk, float *dv, const float *dy,
                                             const float *q, const float *k, const float *v,
                                             const float *o, const float *lse,
                                             const int64_t *q_len, const int64_t *k_len,
                                             int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                                             int64_t Hkv, int64_t D, float scale, int32_t causal,
                                             int64_t window) {
    PYTFM_TRY(pytfm__check_attention_padded_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse,
                                                     q_len, k_len, B, Tq, Tk, H, Hkv, D, scale,
                                                     causal, window));
    PYTFM_TRY(pytfm__check_attention_lengths(__func__, q_len, k_len, B, Tq, Tk));
    return padded_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, q_len, k_len, B, Tq, Tk,
                           H, Hkv, D, scale, causal, window);
}

pytfm_status pytfm_attention_gqa_backward(float *dq, float *dk, float *dv, const float *dy,
                                          const float *q, const float *k, const float *v,
                                          const float *o, const float *lse, int64_t B,
                                          int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                          float scale, int32_t causal, int64_t window) {
    PYTFM_TRY(pytfm__check_attention_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, B, T, H,
                                              Hkv, D, scale, causal, window));
    return padded_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, NULL, NULL, B, T, T, H,
                           Hkv, D, scale, causal, window);
}

pytfm_status pytfm_attention_backward(float *dq, float *dk, float *dv, const float *dy,
                                      const float *q, const float *k, const float *v,
                                      const float *o, const float *lse, int64_t B, int64_t T,
                                      int64_t H, int64_t D, float scale, int32_t causal) {
    PYTFM_TRY(pytfm__check_attention_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, B, T, H,
                                              H, D, scale, causal, 0));
    return padded_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, NULL, NULL, B, T, T, H, H,
                           D, scale, causal, 0);
}

pytfm_status pytfm_attention_cache_append(float *k_cache, float *v_cache, const float *k,
                                          const float *v, int64_t B, int64_t n_new, int64_t H,
                                          int64_t D, int64_t Tmax, int64_t start) {
    PYTFM_TRY(pytfm__check_attention_cache_append(__func__, k_cache, v_cache, k, v, B, n_new, H,
                                                  D, Tmax, start));
    // the n_new new rows of a batch are consecutive, in k and v as in the cache
    const size_t bytes = (size_t)(n_new * H * D) * sizeof(float);
    for (int64_t b = 0; b < B && n_new > 0; b++) {
        memcpy(k_cache + (b * Tmax + start) * H * D, k + b * n_new * H * D, bytes);
        memcpy(v_cache + (b * Tmax + start) * H * D, v + b * n_new * H * D, bytes);
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_attention_gqa_decode(float *o, float *lse, const float *q,
                                        const float *k_cache, const float *v_cache, int64_t B,
                                        int64_t n_new, int64_t H, int64_t Hkv, int64_t D,
                                        int64_t Tmax, int64_t start, float scale,
                                        int64_t window) {
    PYTFM_TRY(pytfm__check_attention_decode(__func__, o, lse, q, k_cache, v_cache, B, n_new, H,
                                            Hkv, D, Tmax, start, scale, window));
    const problem p = {.o = o, .lse = lse, .q = q, .k = k_cache, .v = v_cache, .B = B,
                       .Tq = n_new, .Tk = start + n_new, .Ts = Tmax, .H = H, .Hkv = Hkv, .D = D,
                       .start = start, .window = window, .scale = scale, .causal = 1};
    return run_forward(__func__, &p);
}

pytfm_status pytfm_attention_decode(float *o, float *lse, const float *q, const float *k_cache,
                                    const float *v_cache, int64_t B, int64_t n_new, int64_t H,
                                    int64_t D, int64_t Tmax, int64_t start, float scale) {
    PYTFM_TRY(pytfm__check_attention_decode(__func__, o, lse, q, k_cache, v_cache, B, n_new, H, H,
                                            D, Tmax, start, scale, 0));
    const problem p = {.o = o, .lse = lse, .q = q, .k = k_cache, .v = v_cache, .B = B,
                       .Tq = n_new, .Tk = start + n_new, .Ts = Tmax, .H = H, .Hkv = H, .D = D,
                       .start = start, .window = 0, .scale = scale, .causal = 1};
    return run_forward(__func__, &p);
}
