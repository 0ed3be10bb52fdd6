/*
 * fast_impl.h — the vectorised element-wise kernels, included (once each) by fast_portable.c,
 * fast_avx2.c and fast_avx512.c, which set the target and PYTFM_FAST_TABLE. Each loop is
 * written for the vectoriser: unit stride, no calls but the inline maths of vecmath.h, and sums
 * over PYTFM_LANES partial results (see vecmath.h), so the AVX2 and AVX-512 builds give the
 * same bits (the portable one differs in rounding only: it has no fused multiply-add). The
 * maths of each op is at the top of its own file (softmax.c, ...); these are the same
 * formulas in float, where the plain versions sum in double.
 */
#include "fast.h"
#include "vecmath.h"

#define LANES PYTFM_LANES

/* The largest of x[0 .. count) that is not NaN (-inf if none), compared as integers: a float's
 * bits, with the magnitude bits flipped when it is negative, order as the floats do (−0 just
 * below +0), and GCC vectorises an integer maximum, where a float `x > m ? x : m` it leaves as
 * sixteen scalar maxss (not a max it may reorder: NaN and the sign of zero). NaN is mapped
 * below every key, so it is ignored as the float comparison ignores it. */
static inline int32_t max_key_(float v) {
    int32_t b;
    memcpy(&b, &v, sizeof b);
    const int32_t key = b ^ ((b >> 31) & INT32_MAX);
    // NaN: below -inf's key, by masks (as a select, GCC makes it a branch and no vector)
    const int32_t nan = -(int32_t)((b & INT32_MAX) > 0x7f800000);
    return (key & ~nan) | (INT32_MIN & nan);
}

static float max_(const float *x, int64_t count) {
    int32_t s[LANES];
    for (int l = 0; l < LANES; l++) s[l] = INT32_MIN;
    int64_t j = 0;
    for (; j + LANES <= count; j += LANES)
        for (int l = 0; l < LANES; l++) {
            const int32_t k = max_key_(x[j + l]);
            s[l] = k > s[l] ? k : s[l];
        }
    int32_t m = s[0];
    for (int l = 1; l < LANES; l++) m = s[l] > m ? s[l] : m;
    for (; j < count; j++) {
        const int32_t k = max_key_(x[j]);
        m = k > m ? k : m;
    }
    if (m == INT32_MIN) return -INFINITY; // empty, or all NaN
    m ^= (m >> 31) & INT32_MAX; // the key back to the float's bits (the map is its own inverse)
    float f;
    memcpy(&f, &m, sizeof f);
    return f;
}

/* y = e^(x − c), returning Σ y. y and x are distinct (restrict): GCC then vectorises the loop
 * without an overlap check per vector and keeps the sums in registers (with a possible
 * overlap it does neither, and reloads the constants in the loop). */
static float exp_shifted_(float *restrict y, const float *restrict x, float c, int64_t count) {
    float s[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= count; j += LANES)
        for (int l = 0; l < LANES; l++) {
            const float e = pytfm__expf(x[j + l] - c);
            y[j + l] = e;
            s[l] += e;
        }
    float tail = 0.0f;
    for (; j < count; j++) {
        y[j] = pytfm__expf(x[j] - c);
        tail += y[j];
    }
    return pytfm__lanes_sum(s) + tail;
}

static void softmax_forward(float *restrict y, const float *restrict x, int64_t cols) {
    const float sum = exp_shifted_(y, x, max_(x, cols), cols);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < cols; j++) y[j] *= inv;
}

static void softmax_backward(float *restrict dx, const float *restrict dy,
                             const float *restrict y, int64_t cols) {
    float s[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= cols; j += LANES)
        for (int l = 0; l < LANES; l++) s[l] += dy[j + l] * y[j + l];
    float tail = 0.0f;
    for (; j < cols; j++) tail += dy[j] * y[j];
    const float dot = pytfm__lanes_sum(s) + tail;
    for (j = 0; j < cols; j++) dx[j] = y[j] * (dy[j] - dot);
}

static void layernorm_forward(float *restrict y, float *restrict mean, float *restrict rstd,
                              const float *restrict x, const float *restrict w,
                              const float *restrict b, int64_t cols, float eps) {
    // The sums run over x − x0, x0 the row's first value: when |μ| ≫ σ the differences are
    // small and exact (x and x0 within a factor 2 of each other), so neither μ nor x − μ loses
    // the digits a float sum of x would round away at |μ|.
    const float x0 = x[0];
    float s[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= cols; j += LANES)
        for (int l = 0; l < LANES; l++) s[l] += x[j + l] - x0;
    float tail = 0.0f;
    for (; j < cols; j++) tail += x[j] - x0;
    const float d = (pytfm__lanes_sum(s) + tail) / (float)cols; // μ − x0
    float v[LANES] = {0}; // two-pass variance: Σ (x − μ)², x − μ as (x − x0) − d
    for (j = 0; j + LANES <= cols; j += LANES)
        for (int l = 0; l < LANES; l++) v[l] += (x[j + l] - x0 - d) * (x[j + l] - x0 - d);
    tail = 0.0f;
    for (; j < cols; j++) tail += (x[j] - x0 - d) * (x[j] - x0 - d);
    const float ss = pytfm__lanes_sum(v) + tail;
    if (!PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps)) { // squares past FLT_MAX or lost to underflow
        pytfm__layernorm_forward_row(y, mean, rstd, x, w, b, cols, eps);
        return;
    }
    const float rs = 1.0f / sqrtf(ss / (float)cols + eps);
    for (j = 0; j < cols; j++) y[j] = ((x[j] - x0 - d) * rs) * w[j] + b[j];
    *mean = x0 + d;
    *rstd = rs;
}

static void layernorm_backward(float *restrict dx, float *restrict dw, float *restrict db,
                               const float *restrict dy, const float *restrict x,
                               const float *restrict w, float mu, float rs, int64_t cols) {
    float sg[LANES] = {0}, sgx[LANES] = {0}; // Σ g and Σ g·x̂, g = dy·w
    int64_t j = 0;
    for (; j + LANES <= cols; j += LANES)
        for (int l = 0; l < LANES; l++) {
            const float xhat = (x[j + l] - mu) * rs, g = dy[j + l] * w[j + l];
            sg[l] += g;
            sgx[l] += g * xhat;
            dw[j + l] += dy[j + l] * xhat;
            db[j + l] += dy[j + l];
        }
    float tg = 0.0f, tgx = 0.0f;
    for (; j < cols; j++) {
        const float xhat = (x[j] - mu) * rs, g = dy[j] * w[j];
        tg += g;
        tgx += g * xhat;
        dw[j] += dy[j] * xhat;
        db[j] += dy[j];
    }
    const float g_mean = (pytfm__lanes_sum(sg) + tg) / (float)cols;
    const float gx_mean = (pytfm__lanes_sum(sgx) + tgx) / (float)cols;
    for (j = 0; j < cols; j++) {
        const float xhat = (x[j] - mu) * rs;
        dx[j] = rs * (dy[j] * w[j] - g_mean - xhat * gx_mean);
    }
}

/* e^(−2u), u = k(v + a·v³): ½(1 + tanh(u)) = 1 / (1 + e^(−2u)) */
static inline float gelu_e_(float v) {
    return pytfm__expf(-2.0f * PYTFM_GELU_K * (v + PYTFM_GELU_A * v * v * v));
}

static void gelu_forward(float *y, const float *x, int64_t count) {
    for (int64_t i = 0; i < count; i++) y[i] = x[i] / (1.0f + gelu_e_(x[i]));
}

static void gelu_backward(float *dx, const float *dy, const float *x, int64_t count) {
    for (int64_t i = 0; i < count; i++) { // dx may alias dy: each element is read before written
        const float v = x[i], s = 1.0f / (1.0f + gelu_e_(v)), vt = PYTFM_GELU_TERM_V(v);
        const float du = PYTFM_GELU_K * (1.0f + 3.0f * PYTFM_GELU_A * vt * vt);
        dx[i] = dy[i] * (s + 2.0f * vt * s * (1.0f - s) * du);
    }
}

/* log Σ e^x[j] in one pass over the row from memory: blocks of LSE_BLOCK floats (8 KB), each
 * block's maximum first, then its exponentials while it is in L1, shifted by the running
 * maximum m; when a block raises m, the sum so far is scaled by e^(m − m'). A row of at most
 * LSE_BLOCK floats is the two-pass max + log Σ e^(x − max) exactly (the same bits). While m is
 * -inf (every value so far -inf or NaN) the shift is 0: the sum is then 0, or NaN if a NaN was
 * seen, and stays so when scaled; a row without a finite maximum gives NaN, as the plain
 * kernel's e^(-inf − (-inf)) does. */
enum { LSE_BLOCK = 2048 };

static float logsumexp(const float *restrict x, int64_t cols) {
    float m = -INFINITY, s[LANES] = {0}, tail = 0.0f;
    for (int64_t j0 = 0; j0 < cols; j0 += LSE_BLOCK) {
        const float *xb = x + j0;
        const int64_t n = PYTFM_MIN((int64_t)LSE_BLOCK, cols - j0);
        const float bm = max_(xb, n);
        if (bm > m) {
            const float f = pytfm__expf(m - bm); // 0 for the first block (m = -inf)
            for (int l = 0; l < LANES; l++) s[l] *= f;
            tail *= f;
            m = bm;
        }
        const float c = m > -INFINITY ? m : 0.0f;
        int64_t j = 0;
        for (; j + LANES <= n; j += LANES)
            for (int l = 0; l < LANES; l++) s[l] += pytfm__expf(xb[j + l] - c);
        for (; j < n; j++) tail += pytfm__expf(xb[j] - c);
    }
    if (!(m > -INFINITY)) return NAN;
    return m + logf(pytfm__lanes_sum(s) + tail);
}

static void scaled_exp(float *restrict d, const float *restrict x, float lse, float scale,
                       int64_t cols) {
    for (int64_t j = 0; j < cols; j++) d[j] = scale * pytfm__expf(x[j] - lse);
}

static void adamw(float *p, float *m, float *v, const float *g, int64_t count,
                  const pytfm__adamw_consts *consts) {
    const pytfm__adamw_consts c = *consts;
    for (int64_t i = 0; i < count; i++) {
        const float mi = c.b1 * m[i] + c.c1 * g[i];
        const float vi = c.b2 * v[i] + c.c2 * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * c.decay - c.step_size * mi / (sqrtf(vi) / c.bc2_sqrt + c.eps);
    }
}

/* The attention row kernels work in whole vectors of LANES: a row's last, partial vector is
 * computed in all its lanes, and the lanes past vis are then replaced by 0 (a select, so that
 * whatever s holds there, even NaN, is dropped); s has room for vis rounded up to LANES
 * floats (fast.h). A causal row's vis is seldom a multiple of LANES, and a scalar tail of up
 * to fifteen exponentials per row costs as much as the vectors before it. */
static inline int64_t lanes_up_(int64_t count) { return (count + LANES - 1) / LANES * LANES; }

static float attn_softmax_row(float *s, int64_t vis, int64_t nk, float scale, float *m,
                              float *l) {
    const int64_t padded = lanes_up_(vis);
    int32_t k[LANES];
    for (int i = 0; i < LANES; i++) k[i] = INT32_MIN;
    for (int64_t j = 0; j < padded; j += LANES) // the scaled scores and their max (as max_)
        for (int i = 0; i < LANES; i++) {
            const float x = s[j + i] * scale;
            s[j + i] = x;
            const int32_t key = j + i < vis ? max_key_(x) : INT32_MIN;
            k[i] = key > k[i] ? key : k[i];
        }
    int32_t mk = k[0];
    for (int i = 1; i < LANES; i++) mk = k[i] > mk ? k[i] : mk;
    float mx_tile = -INFINITY; // empty, or all NaN
    if (mk != INT32_MIN) {
        mk ^= (mk >> 31) & INT32_MAX;
        memcpy(&mx_tile, &mk, sizeof mx_tile);
    }
    const float mx = mx_tile > *m ? mx_tile : *m;
    const float alpha = pytfm__expf(*m - mx); // 0 on a row's first tile (m = -inf)
    float t[LANES] = {0};
    for (int64_t j = 0; j < padded; j += LANES)
        for (int i = 0; i < LANES; i++) {
            const float e = pytfm__expf(s[j + i] - mx);
            s[j + i] = j + i < vis ? e : 0.0f;
            t[i] += s[j + i];
        }
    for (int64_t j = padded; j < nk; j++) s[j] = 0.0f;
    *l = *l * alpha + pytfm__lanes_sum(t);
    *m = mx;
    return alpha;
}

static void attn_p_row(float *s, int64_t vis, int64_t nk, float scale, float lse) {
    const int64_t padded = lanes_up_(vis);
    for (int64_t j = 0; j < padded; j += LANES)
        for (int i = 0; i < LANES; i++) {
            const float e = pytfm__expf(scale * s[j + i] - lse);
            s[j + i] = j + i < vis ? e : 0.0f;
        }
    for (int64_t j = padded; j < nk; j++) s[j] = 0.0f;
}

static void attn_ds_row(float *dp, const float *p, int64_t vis, int64_t nk, float delta,
                        float scale) {
    for (int64_t j = 0; j < vis; j++) dp[j] = p[j] * (dp[j] - delta) * scale;
    for (int64_t j = vis; j < nk; j++) dp[j] = 0.0f;
}

/* one output of gemv: Σ x·w over LANES partial sums and a tail, combined as every row op */
static inline float gemv_sum(const float s[LANES], float tail) {
    return pytfm__lanes_sum(s) + tail;
}

/* Four rows of w at once: x is loaded once for all of them, and the 4·LANES accumulators keep
 * the fused multiply-adds in flight. They are four named arrays: as one [4][LANES] array, GCC
 * keeps them on the stack. Each row gets the bits it gets alone (the loop after). The next
 * four rows are prefetched meanwhile: w is usually read from L3 (a model's weights pass L2);
 * four rows ahead is what bench/c_generate.py chose (docs/performance.md). */
/* d[r] = the lanes of sr summed by pytfm__lanes_sum's tree, plus tr, for four rows side by side
 * so that the tree vectorises across them (one row at a time, it is a chain of scalar shuffles
 * and adds) */
static inline void sums4_(float d[4], const float *s0, const float *s1, const float *s2,
                          const float *s3, float t0, float t1, float t2, float t3) {
    float u[4][8], v[4][4];
    for (int l = 0; l < 8; l++) {
        u[0][l] = s0[l] + s0[l + 8], u[1][l] = s1[l] + s1[l + 8];
        u[2][l] = s2[l] + s2[l + 8], u[3][l] = s3[l] + s3[l + 8];
    }
    for (int r = 0; r < 4; r++)
        for (int l = 0; l < 4; l++) v[r][l] = u[r][l] + u[r][l + 4];
    const float t[4] = {t0, t1, t2, t3};
    for (int r = 0; r < 4; r++) d[r] = ((v[r][0] + v[r][2]) + (v[r][1] + v[r][3])) + t[r];
}

static void gemv(float *y, const float *x, const float *w, int64_t ldw, const float *b,
                 int64_t in, int64_t out) {
    int64_t o = 0;
    for (; o + 4 <= out; o += 4) {
        const float *w0 = w + o * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        float s0[LANES] = {0}, s1[LANES] = {0}, s2[LANES] = {0}, s3[LANES] = {0};
        float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
        const float *next = o + 8 <= out ? w0 + 4 * ldw : w0; // the last block: itself
        int64_t j = 0;
        for (; j + LANES <= in; j += LANES) {
            for (int r = 0; r < 4; r++) PYTFM_PREFETCH(next + r * ldw + j);
            for (int l = 0; l < LANES; l++) {
                const float xj = x[j + l];
                s0[l] = PYTFM_FMA(xj, w0[j + l], s0[l]);
                s1[l] = PYTFM_FMA(xj, w1[j + l], s1[l]);
                s2[l] = PYTFM_FMA(xj, w2[j + l], s2[l]);
                s3[l] = PYTFM_FMA(xj, w3[j + l], s3[l]);
            }
        }
        for (; j < in; j++) {
            t0 = PYTFM_FMA(x[j], w0[j], t0);
            t1 = PYTFM_FMA(x[j], w1[j], t1);
            t2 = PYTFM_FMA(x[j], w2[j], t2);
            t3 = PYTFM_FMA(x[j], w3[j], t3);
        }
        float d[4];
        sums4_(d, s0, s1, s2, s3, t0, t1, t2, t3);
        for (int r = 0; r < 4; r++) y[o + r] = b ? d[r] + b[o + r] : d[r];
    }
    for (; o < out; o++) {
        const float *wo = w + o * ldw;
        float s[LANES] = {0}, t = 0.0f;
        int64_t j = 0;
        for (; j + LANES <= in; j += LANES)
            for (int l = 0; l < LANES; l++) s[l] = PYTFM_FMA(x[j + l], wo[j + l], s[l]);
        for (; j < in; j++) t = PYTFM_FMA(x[j], wo[j], t);
        y[o] = b ? gemv_sum(s, t) + b[o] : gemv_sum(s, t);
    }
}

/* Four rows of x against one row of w, each sum as gemv's: the x rows are loaded where gemv
 * loads four rows of w, and the same tree sums the lanes side by side. */
static void dots4_(float d[4], const float *const xs[4], const float *w, int64_t in) {
    const float *x0 = xs[0], *x1 = xs[1], *x2 = xs[2], *x3 = xs[3];
    float s0[LANES] = {0}, s1[LANES] = {0}, s2[LANES] = {0}, s3[LANES] = {0};
    float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
    int64_t j = 0;
    for (; j + LANES <= in; j += LANES)
        for (int l = 0; l < LANES; l++) {
            const float wj = w[j + l];
            s0[l] = PYTFM_FMA(x0[j + l], wj, s0[l]);
            s1[l] = PYTFM_FMA(x1[j + l], wj, s1[l]);
            s2[l] = PYTFM_FMA(x2[j + l], wj, s2[l]);
            s3[l] = PYTFM_FMA(x3[j + l], wj, s3[l]);
        }
    for (; j < in; j++) {
        t0 = PYTFM_FMA(x0[j], w[j], t0);
        t1 = PYTFM_FMA(x1[j], w[j], t1);
        t2 = PYTFM_FMA(x2[j], w[j], t2);
        t3 = PYTFM_FMA(x3[j], w[j], t3);
    }
    sums4_(d, s0, s1, s2, s3, t0, t1, t2, t3);
}

/* One row of w streamed per output, no prefetch: a single sequential read is what the
 * hardware prefetcher follows best, where gemv's four rows at once are four streams (the
 * figures are in docs/performance.md). One x row: a single chain of fused multiply-adds,
 * which keeps up with memory. More: four x rows at a time share each vector of w, the last
 * group padded with copies of the last row (four chains cost what one does, and a copy's sum
 * is the row's own, written once). */
static void gemv_rows(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t R,
                      const float *w, int64_t ldw, const float *b, int64_t in, int64_t out) {
    for (int64_t o = 0; o < out; o++) {
        const float *wo = w + o * ldw;
        if (R == 1) {
            float s[LANES] = {0}, t = 0.0f;
            int64_t j = 0;
            for (; j + LANES <= in; j += LANES) {
                // not unrolled: then GCC keeps s in vectors (unrolled, its sixteen lanes become
                // scalar chains, at a sixteenth of the rate)
                PYTFM_PRAGMA(GCC unroll 1)
                for (int l = 0; l < LANES; l++) s[l] = PYTFM_FMA(x[j + l], wo[j + l], s[l]);
            }
            for (; j < in; j++) t = PYTFM_FMA(x[j], wo[j], t);
            y[o] = b ? gemv_sum(s, t) + b[o] : gemv_sum(s, t);
            continue;
        }
        for (int64_t r = 0; r < R; r += 4) {
            const float *xs[4];
            for (int i = 0; i < 4; i++) xs[i] = x + PYTFM_MIN(r + i, R - 1) * ldx;
            float d[4];
            dots4_(d, xs, wo, in);
            for (int i = 0; i < 4 && r + i < R; i++) y[(r + i) * ldy + o] = b ? d[i] + b[o] : d[i];
        }
    }
}

/* A BF16 weight h as the BF16 one-row product multiplies it: widened to float32 (exactly: h is
 * the float's top half) and rounded as pytfm__bf16_round_bits rounds, which keeps every value
 * but a subnormal (made a zero of its sign) and a NaN (made quiet). A shift and two selects,
 * which vectorise (vpmovzxwd, vpslld and masks) inside the product loop. */
static inline float bf16_widen_(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    u = (u & 0x7FFFFFFFu) > 0x7F800000u ? u | 0x00400000u : u;
    u = (u & 0x7F800000u) == 0 ? u & 0x80000000u : u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* w[i] as the BF16 one-row product multiplies it: rounded to BF16 (w16 NULL), or the BF16
 * weight w16[i] widened (bf16_widen_): the same value for the same weight */
static inline float bf16_weight_(const float *w, const uint16_t *w16, int64_t i) {
    return w16 ? bf16_widen_(w16[i]) : pytfm__bf16_round(w[i]);
}

/* 16 lanes of four rows' sums from BF16 weights, x's rounding xr: w0..w3 the rows, j0 the
 * first of the n values (a multiple of LANES) summed into s0..s3 (lane l takes the values
 * j ≡ l mod LANES, as gemv). Each weight widened as bf16_widen_ widens it, but for a NaN, left
 * as it is: every product quiets it, as the rounding would, so the sums are the same bits.
 * next: the rows four ahead, prefetched. Written with intrinsics on AVX-512, AVX2 and SSE2:
 * the vectoriser does the widening in 256-bit halves and keeps the sums on the stack. */
#if defined(__AVX512F__)
#include <immintrin.h>
/* 16 weights widened: the 16-bit words zero-extended and shifted into the top halves, the
 * subnormals (a zero exponent) masked to +0 (a zero's sign changes no sum that starts at +0) */
static inline __m512 widen16_(const uint16_t *p) {
    const __m512i u = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p)), 16);
    const __mmask16 normal = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7F800000));
    return _mm512_castsi512_ps(_mm512_maskz_mov_epi32(normal, u));
}

static inline void bf16w_lanes4_(float *s0, float *s1, float *s2, float *s3, const float *xr,
                                 const uint16_t *w0, const uint16_t *w1, const uint16_t *w2,
                                 const uint16_t *w3, const uint16_t *next, int64_t ldw,
                                 int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < n; j += LANES) {
        if (j % 32 == 0) // a 64-byte line holds 32 weights
            for (int r = 0; r < 4; r++) PYTFM_PREFETCH(next + r * ldw + j);
        const __m512 xj = _mm512_loadu_ps(xr + j);
        a0 = _mm512_fmadd_ps(xj, widen16_(w0 + j), a0);
        a1 = _mm512_fmadd_ps(xj, widen16_(w1 + j), a1);
        a2 = _mm512_fmadd_ps(xj, widen16_(w2 + j), a2);
        a3 = _mm512_fmadd_ps(xj, widen16_(w3 + j), a3);
    }
    _mm512_storeu_ps(s0, a0), _mm512_storeu_ps(s1, a1);
    _mm512_storeu_ps(s2, a2), _mm512_storeu_ps(s3, a3);
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* 16 weights: the subnormals masked to +0 in their 16-bit words (one vector for 16 weights),
 * then widened by unpacking with zero words, which puts them in the order [0..3, 8..11] (*lo)
 * and [4..7, 12..15] (*hi): x is taken in the same order, and the sums put back in order */
static inline void widen16_(__m256 *lo, __m256 *hi, const uint16_t *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    const __m256i z = _mm256_setzero_si256();
    const __m256i tiny = _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F80)), z);
    const __m256i f = _mm256_andnot_si256(tiny, h);
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, f));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, f));
}

/* the lanes in order from the unpacked halves: [a0..a3, b0..b3], [a4..a7, b4..b7] */
static inline void store_lanes_(float *s, __m256 a, __m256 b) {
    _mm256_storeu_ps(s, _mm256_permute2f128_ps(a, b, 0x20));
    _mm256_storeu_ps(s + 8, _mm256_permute2f128_ps(a, b, 0x31));
}

static inline void bf16w_lanes4_(float *s0, float *s1, float *s2, float *s3, const float *xr,
                                 const uint16_t *w0, const uint16_t *w1, const uint16_t *w2,
                                 const uint16_t *w3, const uint16_t *next, int64_t ldw,
                                 int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0; // lanes 0-3, 8-11
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                   // lanes 4-7, 12-15
    for (int64_t j = 0; j < n; j += LANES) {
        if (j % 32 == 0)
            for (int r = 0; r < 4; r++) PYTFM_PREFETCH(next + r * ldw + j);
        const __m256 x0 = _mm256_loadu_ps(xr + j), x1 = _mm256_loadu_ps(xr + j + 8);
        const __m256 xa = _mm256_permute2f128_ps(x0, x1, 0x20); // x[0..3], x[8..11]
        const __m256 xb = _mm256_permute2f128_ps(x0, x1, 0x31); // x[4..7], x[12..15]
        __m256 lo, hi;
        widen16_(&lo, &hi, w0 + j);
        a0 = _mm256_fmadd_ps(xa, lo, a0), b0 = _mm256_fmadd_ps(xb, hi, b0);
        widen16_(&lo, &hi, w1 + j);
        a1 = _mm256_fmadd_ps(xa, lo, a1), b1 = _mm256_fmadd_ps(xb, hi, b1);
        widen16_(&lo, &hi, w2 + j);
        a2 = _mm256_fmadd_ps(xa, lo, a2), b2 = _mm256_fmadd_ps(xb, hi, b2);
        widen16_(&lo, &hi, w3 + j);
        a3 = _mm256_fmadd_ps(xa, lo, a3), b3 = _mm256_fmadd_ps(xb, hi, b3);
    }
    store_lanes_(s0, a0, b0), store_lanes_(s1, a1, b1);
    store_lanes_(s2, a2, b2), store_lanes_(s3, a3, b3);
}
#elif defined(__SSE2__)
#include <emmintrin.h>
/* 8 weights with the subnormals masked to +0 in their 16-bit words, then widened into two
 * vectors of 4 by unpacking with zero words (in order) */
static inline __m128i flush_tiny_(const uint16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    const __m128i tiny = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7F80)),
                                         _mm_setzero_si128());
    return _mm_andnot_si128(tiny, h);
}

/* two rows at a time: their 8 vectors of sums, x's 4 and the temporaries fill SSE2's 16
 * registers; no FMA here, a product and an add as PYTFM_FMA is in this build */
static inline void bf16w_lanes2_(float *s0, float *s1, const float *xr, const uint16_t *w0,
                                 const uint16_t *w1, const uint16_t *next, int64_t ldw,
                                 int64_t n) {
    __m128 a[4], b[4];
    for (int q = 0; q < 4; q++) a[q] = b[q] = _mm_setzero_ps();
    const __m128i z = _mm_setzero_si128();
    for (int64_t j = 0; j < n; j += LANES) {
        if (j % 32 == 0)
            for (int r = 0; r < 2; r++) PYTFM_PREFETCH(next + r * ldw + j);
        for (int h = 0; h < 2; h++) { // the lanes 8h .. 8h + 7
            const __m128i u0 = flush_tiny_(w0 + j + 8 * h), u1 = flush_tiny_(w1 + j + 8 * h);
            const __m128 xl = _mm_loadu_ps(xr + j + 8 * h), xh = _mm_loadu_ps(xr + j + 8 * h + 4);
            const __m128 l0 = _mm_castsi128_ps(_mm_unpacklo_epi16(z, u0));
            const __m128 h0 = _mm_castsi128_ps(_mm_unpackhi_epi16(z, u0));
            const __m128 l1 = _mm_castsi128_ps(_mm_unpacklo_epi16(z, u1));
            const __m128 h1 = _mm_castsi128_ps(_mm_unpackhi_epi16(z, u1));
            a[2 * h] = _mm_add_ps(a[2 * h], _mm_mul_ps(xl, l0));
            a[2 * h + 1] = _mm_add_ps(a[2 * h + 1], _mm_mul_ps(xh, h0));
            b[2 * h] = _mm_add_ps(b[2 * h], _mm_mul_ps(xl, l1));
            b[2 * h + 1] = _mm_add_ps(b[2 * h + 1], _mm_mul_ps(xh, h1));
        }
    }
    for (int q = 0; q < 4; q++) _mm_storeu_ps(s0 + 4 * q, a[q]), _mm_storeu_ps(s1 + 4 * q, b[q]);
}

static inline void bf16w_lanes4_(float *s0, float *s1, float *s2, float *s3, const float *xr,
                                 const uint16_t *w0, const uint16_t *w1, const uint16_t *w2,
                                 const uint16_t *w3, const uint16_t *next, int64_t ldw,
                                 int64_t n) {
    bf16w_lanes2_(s0, s1, xr, w0, w1, next, ldw, n);
    bf16w_lanes2_(s2, s3, xr, w2, w3, next + 2 * ldw, ldw, n);
}
#else
static inline void bf16w_lanes4_(float *s0, float *s1, float *s2, float *s3, const float *xr,
                                 const uint16_t *w0, const uint16_t *w1, const uint16_t *w2,
                                 const uint16_t *w3, const uint16_t *next, int64_t ldw,
                                 int64_t n) {
    float a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0};
    for (int64_t j = 0; j < n; j += LANES) {
        if (j % 32 == 0)
            for (int r = 0; r < 4; r++) PYTFM_PREFETCH(next + r * ldw + j);
        for (int l = 0; l < LANES; l++) {
            const float xj = xr[j + l];
            a0[l] = PYTFM_FMA(xj, bf16_widen_(w0[j + l]), a0[l]);
            a1[l] = PYTFM_FMA(xj, bf16_widen_(w1[j + l]), a1[l]);
            a2[l] = PYTFM_FMA(xj, bf16_widen_(w2[j + l]), a2[l]);
            a3[l] = PYTFM_FMA(xj, bf16_widen_(w3[j + l]), a3[l]);
        }
    }
    memcpy(s0, a0, sizeof a0), memcpy(s1, a1, sizeof a1);
    memcpy(s2, a2, sizeof a2), memcpy(s3, a3, sizeof a3);
}
#endif

/* Rows [0, out) of gemv_bf16 four at a time from the BF16 weights w16, x's rounding xr: each
 * weight widened in the product loop, so that W is read once, at two bytes a weight, and
 * nothing is written but y. The sums are gemv's (LANES lanes per row, then sums4_'s tree), the
 * next four rows prefetched as gemv does. Returns the rows done (out less out % 4). */
static int64_t gemv_bf16w4_(float *y, const float *xr, const uint16_t *w16, int64_t ldw,
                            const float *b, int64_t in, int64_t out) {
    const int64_t whole = in / LANES * LANES; // the lanes' part of a row; then the tail
    int64_t o = 0;
    for (; o + 4 <= out; o += 4) {
        const uint16_t *w0 = w16 + o * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        const uint16_t *next = o + 8 <= out ? w0 + 4 * ldw : w0; // the last block: itself
        float s0[LANES], s1[LANES], s2[LANES], s3[LANES];
        bf16w_lanes4_(s0, s1, s2, s3, xr, w0, w1, w2, w3, next, ldw, whole);
        float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
        for (int64_t j = whole; j < in; j++) {
            t0 = PYTFM_FMA(xr[j], bf16_widen_(w0[j]), t0);
            t1 = PYTFM_FMA(xr[j], bf16_widen_(w1[j]), t1);
            t2 = PYTFM_FMA(xr[j], bf16_widen_(w2[j]), t2);
            t3 = PYTFM_FMA(xr[j], bf16_widen_(w3[j]), t3);
        }
        float d[4];
        sums4_(d, s0, s1, s2, s3, t0, t1, t2, t3);
        for (int r = 0; r < 4; r++) y[o + r] = b ? d[r] + b[o + r] : d[r];
    }
    return o;
}

/* The same from float32 weights w, each rounded to BF16 in the product loop */
static int64_t gemv_bf16f4_(float *y, const float *xr, const float *w, int64_t ldw,
                            const float *b, int64_t in, int64_t out) {
    int64_t o = 0;
    for (; o + 4 <= out; o += 4) {
        const float *w0 = w + o * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        const float *next = o + 8 <= out ? w0 + 4 * ldw : w0;
        float s0[LANES] = {0}, s1[LANES] = {0}, s2[LANES] = {0}, s3[LANES] = {0};
        float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
        int64_t j = 0;
        for (; j + LANES <= in; j += LANES) {
            for (int r = 0; r < 4; r++) PYTFM_PREFETCH(next + r * ldw + j);
            for (int l = 0; l < LANES; l++) {
                const float xj = xr[j + l];
                s0[l] = PYTFM_FMA(xj, pytfm__bf16_round(w0[j + l]), s0[l]);
                s1[l] = PYTFM_FMA(xj, pytfm__bf16_round(w1[j + l]), s1[l]);
                s2[l] = PYTFM_FMA(xj, pytfm__bf16_round(w2[j + l]), s2[l]);
                s3[l] = PYTFM_FMA(xj, pytfm__bf16_round(w3[j + l]), s3[l]);
            }
        }
        for (; j < in; j++) {
            t0 = PYTFM_FMA(xr[j], pytfm__bf16_round(w0[j]), t0);
            t1 = PYTFM_FMA(xr[j], pytfm__bf16_round(w1[j]), t1);
            t2 = PYTFM_FMA(xr[j], pytfm__bf16_round(w2[j]), t2);
            t3 = PYTFM_FMA(xr[j], pytfm__bf16_round(w3[j]), t3);
        }
        float d[4];
        sums4_(d, s0, s1, s2, s3, t0, t1, t2, t3);
        for (int r = 0; r < 4; r++) y[o + r] = b ? d[r] + b[o + r] : d[r];
    }
    return o;
}

/* gemv on BF16-rounded x and w (w16, when not NULL, the BF16 copy of w, read instead): the
 * BF16 linear layer on one row where the CPU has no AVX512-BF16. A product of two BF16 values
 * is exact in float32, so the FMA of the rounded x with the widened weight is the product
 * vdpbf16ps makes; the sums are gemv's, in gemv's order (gemv's bits on the rounded values).
 * x is rounded once (rows of up to XR values; longer ones per weight), W read four rows at a
 * time with each weight widened (or rounded) in the product loop: from w16 that is half the
 * bytes of the FP32 product, with no pass over a buffer. */
enum { XR = 8192 };
static void gemv_bf16(float *y, const float *x, const float *w, const uint16_t *w16,
                      int64_t ldw, const float *b, int64_t in, int64_t out) {
    float xr[XR];
    const int rounded = in <= XR;
    for (int64_t j = 0; rounded && j < in; j++) xr[j] = pytfm__bf16_round(x[j]);
    int64_t o = 0;
    if (rounded)
        o = w16 ? gemv_bf16w4_(y, xr, w16, ldw, b, in, out)
                : gemv_bf16f4_(y, xr, w, ldw, b, in, out);
    for (; o < out; o++) {
        const float *wo = w16 ? NULL : w + o * ldw; // w is NULL where w16 holds the weights
        const uint16_t *w16o = w16 ? w16 + o * ldw : NULL;
        float s[LANES] = {0}, t = 0.0f;
        int64_t j = 0;
        for (; j + LANES <= in; j += LANES)
            for (int l = 0; l < LANES; l++)
                s[l] = PYTFM_FMA(rounded ? xr[j + l] : pytfm__bf16_round(x[j + l]),
                                 bf16_weight_(wo, w16o, j + l), s[l]);
        for (; j < in; j++)
            t = PYTFM_FMA(rounded ? xr[j] : pytfm__bf16_round(x[j]), bf16_weight_(wo, w16o, j),
                          t);
        y[o] = b ? gemv_sum(s, t) + b[o] : gemv_sum(s, t);
    }
}

/* o = alpha·o + Σ_c p[c]·v[c·ldv ..] over nk keys, in order of c: four keys per pass, nested
 * as the one-at-a-time sum would be (the same bits), so that o is loaded and stored once per
 * four keys */
static void attn_pv_row(float *o, const float *p, const float *v, int64_t ldv, int64_t nk,
                        int64_t D, float alpha) {
    for (int64_t d = 0; d < D; d++) o[d] *= alpha;
    int64_t c = 0;
    for (; c + 4 <= nk; c += 4) {
        const float *v0 = v + c * ldv, *v1 = v0 + ldv, *v2 = v1 + ldv, *v3 = v2 + ldv;
        const float p0 = p[c], p1 = p[c + 1], p2 = p[c + 2], p3 = p[c + 3];
        for (int64_t d = 0; d < D; d++) {
            const float o1 = PYTFM_FMA(p1, v1[d], PYTFM_FMA(p0, v0[d], o[d]));
            o[d] = PYTFM_FMA(p3, v3[d], PYTFM_FMA(p2, v2[d], o1));
        }
    }
    for (; c < nk; c++)
        for (int64_t d = 0; d < D; d++) o[d] = PYTFM_FMA(p[c], v[c * ldv + d], o[d]);
}

/* RMSNorm (rmsnorm.c): Σ x² over 16 lanes in float; the plain row in double where that sum
 * over- or underflows */
static void rmsnorm_forward(float *restrict y, float *restrict rstd, const float *restrict x,
                            const float *restrict w, int64_t cols, float eps) {
    float s[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= cols; j += LANES)
        for (int l = 0; l < LANES; l++) s[l] += x[j + l] * x[j + l];
    float tail = 0.0f;
    for (; j < cols; j++) tail += x[j] * x[j];
    const float ss = pytfm__lanes_sum(s) + tail;
    if (!PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps)) {
        pytfm__rmsnorm_forward_row(y, rstd, x, w, cols, eps);
        return;
    }
    const float rs = 1.0f / sqrtf(ss / (float)cols + eps);
    for (j = 0; j < cols; j++) y[j] = (x[j] * rs) * w[j];
    *rstd = rs;
}

static void rmsnorm_backward(float *restrict dx, float *restrict dw, const float *restrict dy,
                             const float *restrict x, const float *restrict w, float rs,
                             int64_t cols) {
    float sgx[LANES] = {0}; // Σ g·x̂, g = dy·w
    int64_t j = 0;
    for (; j + LANES <= cols; j += LANES)
        for (int l = 0; l < LANES; l++) {
            const float xhat = x[j + l] * rs;
            sgx[l] += dy[j + l] * w[j + l] * xhat;
            dw[j + l] += dy[j + l] * xhat;
        }
    float tgx = 0.0f;
    for (; j < cols; j++) {
        const float xhat = x[j] * rs;
        tgx += dy[j] * w[j] * xhat;
        dw[j] += dy[j] * xhat;
    }
    const float gx_mean = (pytfm__lanes_sum(sgx) + tgx) / (float)cols;
    for (j = 0; j < cols; j++) dx[j] = rs * (dy[j] * w[j] - x[j] * rs * gx_mean);
}

/* SwiGLU (swiglu.c): silu(g) = g / (1 + e^(−g)) */
static void swiglu_forward(float *restrict h, const float *restrict g, const float *restrict u,
                           int64_t count) {
    for (int64_t i = 0; i < count; i++) h[i] = g[i] / (1.0f + pytfm__expf(-g[i])) * u[i];
}

static void swiglu_backward(float *restrict dg, float *restrict du, const float *restrict dh,
                            const float *restrict g, const float *restrict u, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        const float s = 1.0f / (1.0f + pytfm__expf(-g[i]));
        dg[i] = dh[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
        du[i] = dh[i] * (g[i] * s);
    }
}

const pytfm__fast_kernels PYTFM_FAST_TABLE = {
    softmax_forward, softmax_backward, layernorm_forward, layernorm_backward, gelu_forward,
    gelu_backward, logsumexp, scaled_exp, adamw, attn_softmax_row, attn_p_row, attn_ds_row,
    attn_pv_row, gemv, gemv_rows, gemv_bf16,
    rmsnorm_forward, rmsnorm_backward, swiglu_forward, swiglu_backward,
};
