/*
 * sgemm.cu — C = β·C + op(A)·op(B) on the GPU, row-major float32; the twin of csrc/sgemm.c,
 * and the engine of the linear layer.
 *
 *   c [m, n]; a [m, k] ([k, m] with trans_a); b [k, n] ([n, k] with trans_b)
 * Tiled: a block of 256 threads owns a 64×64 tile of C. For each slice of 16 along k, the
 * threads copy the 64×16 piece of op(A) and the 16×64 piece of op(B) into shared memory
 * (zero past the edges, so no bounds test in the inner loop), wait, then each thread
 * accumulates its 4×4 outputs in registers from 4 + 4 shared loads per step of k (register
 * blocking: 16 FMAs per 8 loads). Thread (tx, ty) owns rows ty + 16i and columns tx + 16j, so
 * a warp reads Bs rows without bank conflicts and writes C in 64-byte runs.
 * β = 0 does not read C (NaN in C does not leak). This is the plain tiled kernel; part 2 of
 * the CUDA work tunes it (vector loads, double buffering, larger tiles).
 */
#include "pytfm_cuda.cuh"

enum { BM = 64, BN = 64, BK = 16, TM = 4, TN = 4, THREADS = (BM / TM) * (BN / TN) };

static __global__ void __launch_bounds__(THREADS)
sgemm_kernel(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
             int32_t trans_a, int32_t trans_b, float beta) {
    __shared__ float As[BK][BM], Bs[BK][BN];
    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    const int64_t bm = (int64_t)blockIdx.x * BM, bn = (int64_t)blockIdx.y * BN;
    float acc[TM][TN] = {};
    for (int64_t p0 = 0; p0 < k; p0 += BK) {
        for (int e = threadIdx.x; e < BM * BK; e += THREADS) {
            // consecutive threads read consecutive addresses in either layout
            const int i = trans_a ? e % BM : e / BK, p = trans_a ? e / BM : e % BK;
            const int64_t gi = bm + i, gp = p0 + p;
            As[p][i] = gi < m && gp < k ? (trans_a ? a[gp * m + gi] : a[gi * k + gp]) : 0.0f;
        }
        for (int e = threadIdx.x; e < BK * BN; e += THREADS) {
            const int j = trans_b ? e / BK : e % BN, p = trans_b ? e % BK : e / BN;
            const int64_t gj = bn + j, gp = p0 + p;
            Bs[p][j] = gj < n && gp < k ? (trans_b ? b[gj * k + gp] : b[gp * n + gj]) : 0.0f;
        }
        __syncthreads();
        for (int p = 0; p < BK; p++) {
            float ra[TM], rb[TN];
            for (int i = 0; i < TM; i++) ra[i] = As[p][ty + i * (BM / TM)];
            for (int j = 0; j < TN; j++) rb[j] = Bs[p][tx + j * (BN / TN)];
            for (int i = 0; i < TM; i++)
                for (int j = 0; j < TN; j++) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
        }
        __syncthreads(); // the tiles are overwritten next slice
    }
    for (int i = 0; i < TM; i++) {
        const int64_t gi = bm + ty + i * (BM / TM);
        for (int j = 0; j < TN; j++) {
            const int64_t gj = bn + tx + j * (BN / TN);
            if (gi < m && gj < n) {
                float *out = c + gi * n + gj;
                *out = beta == 0.0f ? acc[i][j] : beta * *out + acc[i][j];
            }
        }
    }
}

extern "C" pytfm_status pytfm_sgemm_cuda(float *c, const float *a, const float *b, int64_t m,
                                         int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                                         float beta, void *stream) {
    PYTFM_TRY(pytfm__check_sgemm(__func__, c, a, b, m, n, k, beta));
    PYTFM_CHECK((n + BN - 1) / BN <= 65535, "%s: n must be <= %d, got %lld", __func__,
                65535 * BN, (long long)n);
    static_assert(THREADS == 256 && BM * BK % THREADS == 0 && BK * BN % THREADS == 0,
                  "each thread copies whole tiles' worth");
    if (m == 0 || n == 0) return PYTFM_STATUS_OK;
    const dim3 grid(pytfm__blocks(m, BM, 2147483647), pytfm__blocks(n, BN, 65535));
    return PYTFM_LAUNCH(sgemm_kernel, grid, dim3(THREADS), 0, stream, c, a, b, m, n, k, trans_a,
                        trans_b, beta);
}
