/*
 * vecmath.h — float maths written so that the compiler vectorises a loop that calls it: no
 * branches (only selects), no library calls, a fixed order of operations. -std=c11 means no
 * implicit FMA contraction; PYTFM_FMA(a, b, c) = a·b + c is one fused operation in builds for
 * CPUs with FMA (the AVX2 and AVX-512 ones: they give the same bits) and two elsewhere.
 */
#ifndef PYTFM_VECMATH_H
#define PYTFM_VECMATH_H

#include <stdint.h>
#include <string.h>

#include "internal.h"

#if defined(__FMA__)
#define PYTFM_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define PYTFM_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* a hint to fetch the cache line of p ahead of its use (nothing where there is no builtin) */
#if defined(__GNUC__)
#define PYTFM_PREFETCH(p) __builtin_prefetch(p)
#else
#define PYTFM_PREFETCH(p) ((void)(p))
#endif

/* 2^k for an integer-valued k in [-126, 127] (k = -127 gives 0), by building the float's
 * exponent field */
static inline float pytfm__exp2i(float k) {
    const uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* e^x to within 3 ulp for results of at least 2^-125.5 (x >= -86.98): e^x = 2^n · e^r with
 * n = round(x·log2 e) and |r| <= ln2/2, e^r by a degree-5 polynomial (Cephes's expf
 * coefficients less the last), 2^n built in the exponent field as 2^(n−1) · 2, so that n may
 * reach 128: the last doubling overflows to +inf exactly where e^x passes FLT_MAX, as expf does
 * (x > 88.7228; +inf for x = +inf). Smaller results flush to 0 (e^-inf = 0, as a mask needs),
 * where expf goes on through the subnormals down to x ≈ -103.97: they differ there by under
 * 1.7e-38. The doubling costs ~5% on GELU's forward and 2–5% on softmax ([4096, 768], one
 * thread); gradual underflow too (2^n as two normal factors) measured 17% (AVX-512) and 32%
 * (AVX2) slower in a GELU-shaped loop, for results under FLT_MIN. NaN stays NaN. */
static inline float pytfm__expf(float x) {
    const float lo = -86.98f, hi = 89.0f; // n in [-125, 128]
    const float xc = x < lo ? lo : (x > hi ? hi : x);
    // round to nearest without a library call: adding 1.5·2^23 leaves no fraction bits
    const float n = PYTFM_FMA(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
    const float r = PYTFM_FMA(n, 2.12194440e-4f, PYTFM_FMA(n, -0.693359375f, xc)); // x − n·ln2
    float p = 1.3981999507e-3f;
    p = PYTFM_FMA(p, r, 8.3334519073e-3f);
    p = PYTFM_FMA(p, r, 4.1665795894e-2f);
    p = PYTFM_FMA(p, r, 1.6666665459e-1f);
    p = PYTFM_FMA(p, r, 5.0000001201e-1f);
    p = PYTFM_FMA(p * r, r, r) + 1.0f;
    return x < lo ? 0.0f : p * pytfm__exp2i(n - 1.0f) * 2.0f;
}

/* Sums and maxima over a vector use PYTFM_LANES independent partial results, combined in a
 * fixed tree: they vectorise, and give the same bits at any vector width. */
#define PYTFM_LANES 16

static inline float pytfm__lanes_sum(const float s[PYTFM_LANES]) {
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = s[l] + s[l + 8];
    for (int l = 0; l < 4; l++) t[l] += t[l + 4];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

static inline float pytfm__lanes_max(const float s[PYTFM_LANES]) {
    float m = s[0];
    for (int l = 1; l < PYTFM_LANES; l++) m = s[l] > m ? s[l] : m;
    return m;
}

#endif /* PYTFM_VECMATH_H */
