/* q8_avx_impl.h — the 8-bit weights' product on 256-bit vectors, included by q8_avx2.c and
 * q8_avxvnni.c under their target pragmas, which differ only in Q8_DOT, the exact sums of 4
 * neighbours' products (s[blk, j] of pytfm_kernels.h) of a block of W and one of x:
 *   Q8_DOT(w, x, aux): w the block of W (32 signed bytes), x the block of qx, aux the block's
 *   32 bytes of the pytfm__q8x aux that Q8_AUX(x) made (int8 x in, 8 int32 lanes out).
 * A vector holds one block, so the even blocks go to one accumulator and the odd ones to
 * another: together the contract's 16 lanes, in its order. Defines the table Q8_TABLE. */
#include <immintrin.h>

static int any_nonfinite(__m256 v) {
    const __m256i e = _mm256_set1_epi32(0x7F800000);
    return !_mm256_testz_si256(
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), e), e),
        _mm256_set1_epi32(-1));
}

/* one block of x (8 floats at a time) into 32 int8 by d, in [−127, 127] */
static __m256i quantize_block(const float *x, float d) {
    const __m256 vd = _mm256_set1_ps(d);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_min_epi32(
            _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + 8 * k), vd)),
                             lo),
            hi);
    // packs interleave the 128-bit halves: [q0 lo, q1 lo, q0 hi, q1 hi] as 16-bit, then bytes
    const __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p = _mm256_packs_epi16(p01, p23);
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void quantize_x(pytfm__q8x *xq, const float *x, int64_t in) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    unsigned char *aux = xq->aux;
    xq->finite = 1;
    for (int64_t blk = 0; blk < in / 32; blk++) {
        const float *xb = x + 32 * blk;
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            const __m256 v = _mm256_loadu_ps(xb + 8 * k);
            if (any_nonfinite(v)) xq->finite = 0;
            m = _mm256_max_ps(m, _mm256_and_ps(v, abs_mask));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        const float d = amax / 127.0f;
        const __m256i qb = d > 0.0f && xq->finite ? quantize_block(xb, d) : _mm256_setzero_si256();
        _mm256_storeu_si256((__m256i *)(void *)(xq->qx + 32 * blk), qb);
        _mm256_storeu_si256((__m256i *)(void *)(aux + 32 * blk), Q8_AUX(qb));
        xq->dx[blk] = d;
    }
}

/* the contract's last steps: A[0..8) + A[8..16), then halves added twice more */
static float combine(__m256 even, __m256 odd) {
    const __m256 h8 = _mm256_add_ps(even, odd);
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

/* R (1 or 4) rows of W from q (row stride in) into y[0..R) */
static inline __attribute__((always_inline)) void rows_r(float *y, const pytfm__q8x *xq,
                                                          const int8_t *q,
                                                          const uint16_t *scales,
                                                          const float *b, int64_t in, int R,
                                                          int prefetch) {
    const int64_t nb = in / 32;
    const unsigned char *aux = xq->aux;
    __m256 acc[4][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < nb; g += 8) { // 8 blocks: one vector of scales
        const int nbg = (int)PYTFM_MIN(8, nb - g);
        float dx8[8] = {0}, sc[4][8];
        memcpy(dx8, xq->dx + g, (size_t)nbg * sizeof(float));
        for (int r = 0; r < R; r++) {
            uint16_t h[8] = {0};
            memcpy(h, scales + r * nb + g, (size_t)nbg * sizeof(uint16_t));
            _mm256_storeu_ps(sc[r], _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((void *)h)),
                                                  _mm256_loadu_ps(dx8)));
        }
        for (int p = 0; p < nbg; p++) {
            const int64_t at = (g + p) * 32;
            const __m256i xv = _mm256_loadu_si256((const void *)(xq->qx + at));
            const __m256i av = _mm256_loadu_si256((const void *)(aux + at));
            for (int r = 0; r < R; r++) {
                const int8_t *w = q + r * in + at;
                if (prefetch && (p & 1) == 0) _mm_prefetch((const char *)(w + 4 * in), _MM_HINT_T0);
                const __m256i wv = _mm256_loadu_si256((const void *)w);
                const __m256 s = _mm256_cvtepi32_ps(Q8_DOT(wv, xv, av));
                acc[r][p & 1] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[r][p]), s, acc[r][p & 1]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        y[r] = combine(acc[r][0], acc[r][1]);
        if (b) y[r] += b[r];
    }
}

static void gemv(float *y, const pytfm__q8x *xq, const int8_t *q, const uint16_t *scales,
                 const float *b, int64_t in, int64_t out) {
    const int64_t nb = in / 32;
    int64_t o = 0;
    for (; o + 4 <= out; o += 4)
        rows_r(y + o, xq, q + o * in, scales + o * nb, b ? b + o : NULL, in, 4, o + 8 <= out);
    for (; o < out; o++)
        rows_r(y + o, xq, q + o * in, scales + o * nb, b ? b + o : NULL, in, 1, 0);
}

const pytfm__q8_kernels Q8_TABLE = {Q8_NAME, quantize_x, gemv};
