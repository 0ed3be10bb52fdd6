/*
 * sgemm.c — C = β·C + op(A)·op(B) in float32, row-major: the three products of a linear layer.
 *
 *   op(A) [m, k]: A stored [m, k], or [k, m] when trans_a (then op(A) = Aᵀ)
 *   op(B) [k, n]: B stored [k, n], or [n, k] when trans_b
 *   C [m, n]; β = 0 writes C without reading it, β = 1 accumulates
 *   linear forward y = x·Wᵀ: (x, W, trans_b);  dx = dy·W: (dy, W);  dW += dyᵀ·x: (dy, x, trans_a, β=1)
 *
 * pytfm_sgemm_plain is the obviously-correct triple loop, kept as the oracle and as the path
 * for CPUs without AVX2. pytfm_sgemm is the fast one (BLIS's structure): for each block of MC
 * rows of C (one thread each), for each KC slice of k, copy ("pack") the A block and then
 * each NC-wide panel of B into the order the micro-kernel reads them, and let a 6×16 AVX2-FMA
 * micro-kernel keep a 6×16 tile of C in twelve registers for the whole KC slice. Packing turns
 * the transposes into copies, and zero-pads ragged edges so the micro-kernel never branches.
 * Every element of C is summed by one thread in one fixed order (k slices in turn), so the
 * result does not depend on the thread count. The packing buffers live on the stack (112 KiB).
 */
#include <string.h>

#include "internal.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define PYTFM_HAVE_AVX2_KERNEL 1
#include <immintrin.h>
#endif

/* element (i, p) of op(A) and (p, j) of op(B) */
#define OPA(i, p) (trans_a ? a[(p) * m + (i)] : a[(i) * k + (p)])
#define OPB(p, j) (trans_b ? b[(j) * k + (p)] : b[(p) * n + (j)])

static pytfm_status check(const char *func, float *c, const float *a, const float *b, int64_t m,
                          int64_t n, int64_t k, float beta) {
    PYTFM_CHECK(m >= 0 && n >= 0 && k >= 0, "%s: m, n, k must be >= 0, got %lld, %lld, %lld",
                func, (long long)m, (long long)n, (long long)k);
    PYTFM_CHECK(isfinite(beta), "%s: beta must be finite, got %g", func, (double)beta);
    PYTFM_CHECK(c != NULL || m * n == 0, "%s: c must not be NULL", func);
    PYTFM_CHECK(a != NULL || m * k == 0, "%s: a must not be NULL", func);
    PYTFM_CHECK(b != NULL || k * n == 0, "%s: b must not be NULL", func);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_sgemm_plain(float *c, const float *a, const float *b, int64_t m, int64_t n,
                               int64_t k, int32_t trans_a, int32_t trans_b, float beta) {
    PYTFM_TRY(check(__func__, c, a, b, m, n, k, beta));
    // one row of C per iteration (rows go to threads), the inner loop on contiguous memory
    PYTFM_PARALLEL_FOR
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * n; // (n)
        if (trans_b) {         // op(B)[:, j] is row j of b: dot products
            for (int64_t j = 0; j < n; j++) {
                float acc = 0.0f;
                for (int64_t p = 0; p < k; p++) acc += OPA(i, p) * b[j * k + p];
                ci[j] = beta == 0.0f ? acc : beta * ci[j] + acc;
            }
        } else { // C[i, :] = β·C[i, :] + Σ_p op(A)[i, p]·B[p, :]
            for (int64_t j = 0; j < n; j++) ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
            for (int64_t p = 0; p < k; p++) pytfm__axpy(ci, OPA(i, p), b + p * n, n);
        }
    }
    return PYTFM_STATUS_OK;
}

#ifdef PYTFM_HAVE_AVX2_KERNEL

enum { MR = 6, NR = 16, MC = 8 * MR, KC = 256, NC = 4 * NR };

/* A block rows [i0, i0+mc) × k slice [p0, p0+kc) into micro-panels of MR rows: panel r holds,
 * for each p, the MR values op(A)[i0 + r·MR .. +MR, p0 + p] (zeros past mc). */
static void pack_a(float *dst, const float *a, int64_t m, int64_t k, int trans_a, int64_t i0,
                   int64_t mc, int64_t p0, int64_t kc) {
    for (int64_t ir = 0; ir < mc; ir += MR)
        for (int64_t p = 0; p < kc; p++)
            for (int64_t r = 0; r < MR; r++)
                *dst++ = ir + r < mc ? OPA(i0 + ir + r, p0 + p) : 0.0f;
}

/* B slice [p0, p0+kc) × columns [j0, j0+nc) into micro-panels of NR columns (zeros past nc) */
static void pack_b(float *dst, const float *b, int64_t n, int64_t k, int trans_b, int64_t p0,
                   int64_t kc, int64_t j0, int64_t nc) {
    for (int64_t jr = 0; jr < nc; jr += NR)
        for (int64_t p = 0; p < kc; p++)
            for (int64_t j = 0; j < NR; j++)
                *dst++ = jr + j < nc ? OPB(p0 + p, j0 + jr + j) : 0.0f;
}

/* tile[6][16] = Σ_p pa[p][0..6) ⊗ pb[p][0..16), over one KC slice */
__attribute__((target("avx2,fma"))) static void micro_kernel(float *tile, const float *pa,
                                                             const float *pb, int64_t kc) {
    __m256 c[MR][2];
    for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = _mm256_setzero_ps();
    for (int64_t p = 0; p < kc; p++, pa += MR, pb += NR) {
        const __m256 b0 = _mm256_loadu_ps(pb), b1 = _mm256_loadu_ps(pb + 8);
        for (int r = 0; r < MR; r++) {
            const __m256 ar = _mm256_broadcast_ss(pa + r);
            c[r][0] = _mm256_fmadd_ps(ar, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(ar, b1, c[r][1]);
        }
    }
    for (int r = 0; r < MR; r++) {
        _mm256_storeu_ps(tile + r * NR, c[r][0]);
        _mm256_storeu_ps(tile + r * NR + 8, c[r][1]);
    }
}

/* rows [i0, i0+mc) of C: all of the work one thread does */
static void row_block(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                      int trans_a, int trans_b, float beta, int64_t i0, int64_t mc) {
    _Alignas(32) float pa[MC * KC], pb[KC * NC], tile[MR * NR];
    for (int64_t p0 = 0; p0 < k; p0 += KC) {
        const int64_t kc = k - p0 < KC ? k - p0 : KC;
        // the first slice applies beta; later slices add to what is there
        const float bt = p0 == 0 ? beta : 1.0f;
        pack_a(pa, a, m, k, trans_a, i0, mc, p0, kc);
        for (int64_t j0 = 0; j0 < n; j0 += NC) {
            const int64_t nc = n - j0 < NC ? n - j0 : NC;
            pack_b(pb, b, n, k, trans_b, p0, kc, j0, nc);
            for (int64_t jr = 0; jr < nc; jr += NR) {
                for (int64_t ir = 0; ir < mc; ir += MR) {
                    micro_kernel(tile, pa + ir * kc, pb + jr * kc, kc);
                    const int64_t rows = mc - ir < MR ? mc - ir : MR;
                    const int64_t cols = nc - jr < NR ? nc - jr : NR;
                    for (int64_t r = 0; r < rows; r++) {
                        float *cr = c + (i0 + ir + r) * n + j0 + jr;
                        const float *t = tile + r * NR;
                        if (bt == 0.0f)
                            for (int64_t j = 0; j < cols; j++) cr[j] = t[j];
                        else if (bt == 1.0f)
                            for (int64_t j = 0; j < cols; j++) cr[j] += t[j];
                        else
                            for (int64_t j = 0; j < cols; j++) cr[j] = bt * cr[j] + t[j];
                    }
                }
            }
        }
    }
}

#endif /* PYTFM_HAVE_AVX2_KERNEL */

int pytfm__sgemm_fast_available(void) {
#ifdef PYTFM_HAVE_AVX2_KERNEL
    __builtin_cpu_init(); // idempotent; needed if we run before libgcc's own constructor
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

pytfm_status pytfm_sgemm(float *c, const float *a, const float *b, int64_t m, int64_t n,
                         int64_t k, int32_t trans_a, int32_t trans_b, float beta) {
    PYTFM_TRY(check(__func__, c, a, b, m, n, k, beta));
    if (!pytfm__sgemm_fast_available())
        return pytfm_sgemm_plain(c, a, b, m, n, k, trans_a, trans_b, beta);
#ifdef PYTFM_HAVE_AVX2_KERNEL
    if (k == 0) { // no products: C = β·C
        for (int64_t i = 0; i < m * n; i++) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
        return PYTFM_STATUS_OK;
    }
    PYTFM_PARALLEL_FOR
    for (int64_t i0 = 0; i0 < m; i0 += MC)
        row_block(c, a, b, m, n, k, trans_a != 0, trans_b != 0, beta, i0,
                  m - i0 < MC ? m - i0 : MC);
#endif
    return PYTFM_STATUS_OK;
}
