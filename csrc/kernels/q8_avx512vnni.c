/* q8_avx512vnni.c — the 8-bit weights' product on AVX512-VNNI (vpdpbusd on 512 bits; AVX512-BW
 * and AVX512-VL for the byte masks and 256-bit forms). pytfm__q8() takes this table only on a
 * CPU with all three (isa.c).
 *
 * vpdpbusd multiplies unsigned bytes by signed ones. W's bytes are made unsigned by adding 128
 * (an xor of the sign bit) and x's stay signed: Σ (q + 128)·qx = Σ q·qx + 128·Σ qx, and the
 * second term depends on x alone, so each lane starts at −128·Σ qx of its 4 neighbours
 * (quantize_x's aux) and the sum comes out exact, for any q in [−128, 127], at one xor a
 * vector. (llama.cpp's alternative, |x| and x's sign moved onto W, costs two operations a
 * vector on 512 bits, which have no vpsignb.) One vector holds two blocks: lanes 0..7 the even
 * block's 8 sums, 8..15 the odd one's, which is the contract's accumulator layout, so each
 * vector takes one fused multiply-add by [dw·dx of the even block ×8, of the odd block ×8]. */
#include "q8.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
/* the instruction set of every function below: GCC's target pragma; Clang ignores that
 * pragma and takes the same as an attribute pushed onto each function (the intrinsics'
 * header first, so that its own functions keep their attributes) */
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")
#endif

/* 1 where any lane of v is inf or NaN */
static int any_nonfinite(__m512 v) {
    const __m512i e = _mm512_set1_epi32(0x7F800000);
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), e), e) != 0;
}

static void quantize_x(pytfm__q8x *xq, const float *x, int64_t in) {
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    const __m256i b128 = _mm256_set1_epi8((char)0x80);
    int32_t *corr = xq->aux;
    xq->finite = 1;
    for (int64_t blk = 0; blk < in / 32; blk++) {
        const __m512 x0 = _mm512_loadu_ps(x + 32 * blk), x1 = _mm512_loadu_ps(x + 32 * blk + 16);
        if (any_nonfinite(x0) || any_nonfinite(x1)) xq->finite = 0;
        const float amax = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float d = amax / 127.0f;
        __m256i qb = _mm256_setzero_si256();
        if (d > 0.0f && xq->finite) {
            const __m512 vd = _mm512_set1_ps(d);
            const __m512i q0 = _mm512_min_epi32(
                _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_div_ps(x0, vd)), lo), hi);
            const __m512i q1 = _mm512_min_epi32(
                _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_div_ps(x1, vd)), lo), hi);
            qb = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(q0)),
                                         _mm512_cvtepi32_epi8(q1), 1);
        }
        _mm256_storeu_si256((__m256i *)(void *)(xq->qx + 32 * blk), qb);
        // −128·Σ of each 4 neighbours: 0 − Σ 128·qx
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), b128, qb);
        _mm256_storeu_si256((__m256i *)(void *)(corr + 8 * blk),
                            _mm256_sub_epi32(_mm256_setzero_si256(), s));
        xq->dx[blk] = d;
    }
}

/* the contract's last steps on the 16 accumulators: halves added, three times */
static float combine16(__m512 a) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(a), hi);
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
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const int32_t *corr = xq->aux;
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nb; g += 16) { // 16 blocks: one vector of scales
        const int nbg = (int)PYTFM_MIN(16, nb - g);
        const __mmask16 m16 = (__mmask16)((1u << nbg) - 1u);
        const __m512 dx = _mm512_maskz_loadu_ps(m16, xq->dx + g);
        __m512 sc[4];
        for (int r = 0; r < R; r++)
            sc[r] = _mm512_mul_ps(
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m16, scales + r * nb + g)), dx);
        for (int p = 0; p < nbg; p += 2) { // a pair of blocks
            const int64_t at = (g + p) * 32;
            const int two = p + 1 < nbg;
            const __mmask64 mb = two ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu;
            const __m512i xv = _mm512_maskz_loadu_epi8(mb, xq->qx + at);
            const __m512i cv = _mm512_maskz_loadu_epi32(two ? 0xFFFF : 0xFF, corr + at / 4);
            const __m512i idx = _mm512_set_epi32(p + 1, p + 1, p + 1, p + 1, p + 1, p + 1, p + 1,
                                                 p + 1, p, p, p, p, p, p, p, p);
            for (int r = 0; r < R; r++) {
                const int8_t *w = q + r * in + at;
                if (prefetch) _mm_prefetch((const char *)(w + 4 * in), _MM_HINT_T0);
                const __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mb, w), flip);
                const __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cv, wv, xv));
                const __m512 scale = _mm512_permutexvar_ps(idx, sc[r]);
                acc[r] = two ? _mm512_fmadd_ps(scale, s, acc[r])
                             : _mm512_mask3_fmadd_ps(scale, s, acc[r], 0xFF);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        y[r] = combine16(acc[r]);
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

const pytfm__q8_kernels pytfm__q8_avx512vnni = {"avx512vnni", quantize_x, gemv};
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
const pytfm__q8_kernels pytfm__q8_avx512vnni = {0};
#endif
