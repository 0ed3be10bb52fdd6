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

#include "core/internal.h"

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

/* e^x to within 3 ulp (2.81 measured over every float) for results of at least 2^-125.5
 * (x >= -86.98): e^x = 2^n · e^r with n = round(x·log2 e) and |r| <= ln2/2, e^r by a degree-5
 * polynomial (Cephes's expf coefficients less the last), 2^n built in the exponent field as
 * 2^(n−1) · 2, so that n may reach 128: the product overflows to +inf exactly where e^x passes
 * FLT_MAX, as expf does (x > 88.7228; +inf for x = +inf). Smaller results flush to 0 (e^-inf = 0,
 * as a mask needs), where expf goes on through the subnormals down to x ≈ -103.97: they differ
 * there by under 1.7e-38; gradual underflow (2^n as two normal factors) would slow every call
 * down for the sake of results under FLT_MIN (docs/performance.md). NaN stays NaN.
 * Written for the multiply-add units, the bottleneck of every loop that calls it (on Zen 4 one
 * 512-bit FMA or multiply a cycle; adds, integer and mask operations go elsewhere): 10 of them.
 * n is rounded by adding 1.5·2^23, which leaves 2^22 + n in the low mantissa bits of the sum t:
 * shifted left by 23 they are n's exponent field (2^22 and t's own exponent shift out), so
 * 2^(n−1) is an integer shift and add, not a conversion; the doubling rides on the polynomial's
 * last step (2 + 2r·(1 + r·p), 2r an add), not on a multiply of its own; x below lo needs no
 * clamp, only the final select (whatever n became there, the result is 0). */
static inline float pytfm__expf(float x) {
    const float lo = -86.98f, hi = 89.0f; // n in [-125, 128]
    const float xc = hi < x ? hi : x;     // (NaN stays NaN); below lo the result is 0, whatever
    const float t = PYTFM_FMA(xc, 1.44269504088896341f, 12582912.0f);
    const float n = t - 12582912.0f;
    const float r = PYTFM_FMA(n, 2.12194440e-4f, PYTFM_FMA(n, -0.693359375f, xc)); // x − n·ln2
    float p = 1.3981999507e-3f;
    p = PYTFM_FMA(p, r, 8.3334519073e-3f);
    p = PYTFM_FMA(p, r, 4.1665795894e-2f);
    p = PYTFM_FMA(p, r, 1.6666665459e-1f);
    p = PYTFM_FMA(p, r, 5.0000001201e-1f);
    // 2·e^r = 2 + 2r·(1 + r·p): the doubling of 2^(n−1) · 2 folded in, on the adder
    p = PYTFM_FMA(r + r, PYTFM_FMA(r, p, 1.0f), 2.0f);
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits << 23) + (126u << 23); // 2^(n−1): the field n + 126 is in [1, 254]
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < lo ? 0.0f : p * scale;
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
