/*
 * sgemm_tc.cu — C = β·C + op(A)·op(B) on the tensor cores, in TF32 or BF16 with FP32 sums;
 * the engine of pytfm_sgemm_ex_cuda and of the linear layer's _ex twins at those precisions
 * (PYTFM_PRECISION_FP32 stays on sgemm.cu's SIMT kernel, the oracle). Shapes as sgemm.cu:
 *
 *   c [m, n]; a [m, k] ([k, m] with trans_a); b [k, n] ([n, k] with trans_b), FP32 in memory
 *
 * Each input is rounded as it goes from shared memory into a fragment register: TF32 by
 * cvt.rna.tf32.f32 (to nearest, ties away: pytfm__tf32), BF16 by cvt.rn.bf16x2.f32 (to nearest
 * even: pytfm_round_bf16's rounding, but subnormals kept where the CPU flushes them); the
 * products are exact in FP32 and summed in FP32 by the mma instructions (cuda/mma.cuh), so
 * C = Σ_p r(op(A)[i, p])·r(op(B)[p, j]) in FP32 with a γ_k-type bound (the tests:
 * tests/cuda/test_cuda_tensor_core.py). β = 0 does not read C.
 *
 *  - A block of 256 threads (8 warps, 2 × 4) owns a 128 × 128 tile of C; a warp 64 × 32 of
 *    it: 4 × 4 fragments of m16n8, 64 FP32 accumulators per thread. One block per tile, all
 *    in gridDim.x, GROUP tile rows at a time down their columns (as sgemm.cu: L2 reuse).
 *  - k goes in slices of 16 (two m16n8k8 TF32 steps or one m16n8k16 BF16 step per fragment),
 *    both operands by cp.async into shared tiles, twice (double buffering): while slice s is
 *    multiplied, slice s + 1 is on its way into the other buffer; one barrier per slice.
 *  - The tiles lie as the operands lie in memory, so no transposing copy: an operand whose
 *    rows are k long (A, or Bᵀ with trans_b) as [128][16 + 4] (row stride ≡ 20 floats: the
 *    TF32 fragment reads (g, t) fall in 32 distinct banks), one whose rows run along m or n
 *    (Aᵀ with trans_a, B) as [16][128 + 8] (stride ≡ 8 banks: (t, g) in 32 distinct banks).
 *    BF16 reads pairs of k: 2-way conflicts on both layouts.
 *  - 16-byte cp.async where the operand's base is 16-byte aligned and its row length a
 *    multiple of 4, 4-byte ones otherwise (a view offset by a float); past the edges the
 *    copies read nothing and zero-fill, so ragged m, n and k need no test in the inner loop,
 *    and the stores are masked.
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "mma.cuh"

#ifdef __CUDACC__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

namespace {

enum {
    TBM = 128, TBN = 128, TBK = 16, // the block's tile of C, the k slice
    TWM = 64, TWN = 32,             // a warp's tile of C
    MI = TWM / 16, NI = TWN / 8,    // its fragments
    TTHREADS = 256,
    KLD = TBK + 4,  // row stride of a tile whose rows are k long
    XLD = TBM + 8,  // row stride of a tile whose rows run along m or n
    TILE = TBM * KLD > TBK * XLD ? TBM * KLD : TBK * XLD, // floats per buffer per operand
    TGROUP = 8,
};
static_assert(TBM == TBN, "one XLD for both operands");
constexpr size_t TC_SHARED = 2 * 2 * TILE * sizeof(float); // A and B, two buffers each

enum Prec { TF32, BF16 };

/* One operand's slices: the global matrix g [rows, cols] (row stride ld) whose tile at
 * (row0, col0) goes into a shared tile [R][L] of row stride LS. KROWS: the tile's rows are
 * its m or n (R = 128, L = 16 along k), else its k (R = 16, L = 128). */
template <bool KROWS> struct TileLoad {
    static constexpr int R = KROWS ? TBM : TBK, L = KROWS ? TBK : TBM, LS = KROWS ? KLD : XLD;
    static constexpr int CHUNKS = R * L / 4 / TTHREADS;
    static_assert(R * L / 4 % TTHREADS == 0, "whole chunks per thread");
    const float *g;
    int64_t ld, rows, cols;
    bool vec;

    __device__ __forceinline__ void issue(float *S, int64_t row0, int64_t col0) const {
        UNROLL
        for (int r = 0; r < CHUNKS; r++) {
            const int e = threadIdx.x + r * TTHREADS, row = e / (L / 4), col = e % (L / 4) * 4;
            const int64_t gr = row0 + row, gc = col0 + col;
            const int64_t over = cols - gc; // may be <= 0 past the edge
            const int64_t left = gr >= rows || over <= 0 ? 0 : over < 4 ? over : 4;
            float *d = S + row * LS + col;
            const float *src = left ? g + gr * ld + gc : g;
            if (vec) {
                pytfm__cp_async16(d, src, 4 * (int)left);
            } else {
                UNROLL
                for (int q = 0; q < 4; q++)
                    pytfm__cp_async4(d + q, q < left ? src + q : g, q < left ? 4 : 0);
            }
        }
    }
};

/* element (i, p) of op(A)'s tile, (p, j) of op(B)'s: the shared tiles as TileLoad lays them */
template <bool KROWS> static __device__ __forceinline__ float at(const float *S, int x, int p) {
    return KROWS ? S[x * KLD + p] : S[p * XLD + x];
}

template <int BM, int BN>
static __device__ __forceinline__ void tc_tile_origin(int64_t t, int64_t tiles_m,
                                                      int64_t tiles_n, int64_t *bm,
                                                      int64_t *bn) {
    const int64_t span = TGROUP * tiles_n, first = t / span * TGROUP;
    const int64_t rows = PYTFM_MIN(tiles_m - first, (int64_t)TGROUP);
    *bm = (first + t % span % rows) * BM;
    *bn = t % span / rows * BN;
}

/* the products of one slice in shared memory into acc (the warp's fragments at wr, wc) */
template <Prec P, bool AK, bool BK>
static __device__ __forceinline__ void slice_products(float acc[MI][NI][4], const float *As,
                                                      const float *Bs, int wr, int wc, int g,
                                                      int t) {
    if (P == TF32) {
        UNROLL
        for (int kk = 0; kk < TBK; kk += 8) {
            uint32_t fa[MI][4], fb[NI][2];
            UNROLL
            for (int i = 0; i < MI; i++) {
                const int r = wr + 16 * i + g;
                fa[i][0] = pytfm__tf32(at<AK>(As, r, kk + t));
                fa[i][1] = pytfm__tf32(at<AK>(As, r + 8, kk + t));
                fa[i][2] = pytfm__tf32(at<AK>(As, r, kk + t + 4));
                fa[i][3] = pytfm__tf32(at<AK>(As, r + 8, kk + t + 4));
            }
            UNROLL
            for (int j = 0; j < NI; j++) {
                const int cidx = wc + 8 * j + g;
                fb[j][0] = pytfm__tf32(at<BK>(Bs, cidx, kk + t));
                fb[j][1] = pytfm__tf32(at<BK>(Bs, cidx, kk + t + 4));
            }
            UNROLL
            for (int i = 0; i < MI; i++)
                UNROLL
                for (int j = 0; j < NI; j++) pytfm__mma_tf32(acc[i][j], fa[i], fb[j]);
        }
    } else {
        uint32_t fa[MI][4], fb[NI][2];
        UNROLL
        for (int i = 0; i < MI; i++) {
            const int r = wr + 16 * i + g;
            fa[i][0] = pytfm__bf16x2(at<AK>(As, r, 2 * t), at<AK>(As, r, 2 * t + 1));
            fa[i][1] = pytfm__bf16x2(at<AK>(As, r + 8, 2 * t), at<AK>(As, r + 8, 2 * t + 1));
            fa[i][2] = pytfm__bf16x2(at<AK>(As, r, 2 * t + 8), at<AK>(As, r, 2 * t + 9));
            fa[i][3] = pytfm__bf16x2(at<AK>(As, r + 8, 2 * t + 8), at<AK>(As, r + 8, 2 * t + 9));
        }
        UNROLL
        for (int j = 0; j < NI; j++) {
            const int cidx = wc + 8 * j + g;
            fb[j][0] = pytfm__bf16x2(at<BK>(Bs, cidx, 2 * t), at<BK>(Bs, cidx, 2 * t + 1));
            fb[j][1] = pytfm__bf16x2(at<BK>(Bs, cidx, 2 * t + 8), at<BK>(Bs, cidx, 2 * t + 9));
        }
        UNROLL
        for (int i = 0; i < MI; i++)
            UNROLL
            for (int j = 0; j < NI; j++) pytfm__mma_bf16(acc[i][j], fa[i], fb[j]);
    }
}

/* C = β·C + op(A)·op(B) in precision P, a 128 × 128 tile per block. vec: bit 0 A, bit 1 B
 * take 16-byte copies. */
template <Prec P, bool TA, bool TB>
static __global__ void __launch_bounds__(TTHREADS)
sgemm_tc_kernel(float *__restrict__ c, const float *__restrict__ a,
                const float *__restrict__ b, int64_t m, int64_t n, int64_t k, float beta,
                int vec) {
    constexpr bool AK = !TA, BK = TB; // whether each operand's tile rows are k long
    PYTFM_DYNAMIC_SHARED(float, smem);
    float *const As = smem, *const Bs = smem + 2 * TILE; // [2][TILE] each
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int wr = warp / (TBN / TWN) * TWM, wc = warp % (TBN / TWN) * TWN;
    int64_t bm, bn;
    tc_tile_origin<TBM, TBN>(blockIdx.x, (m + TBM - 1) / TBM, (n + TBN - 1) / TBN, &bm, &bn);
    const TileLoad<AK> la{a, TA ? m : k, TA ? k : m, TA ? m : k, (vec & 1) != 0};
    const TileLoad<BK> lb{b, TB ? k : n, TB ? n : k, TB ? k : n, (vec & 2) != 0};
    float acc[MI][NI][4];
    UNROLL
    for (int i = 0; i < MI; i++)
        UNROLL
        for (int j = 0; j < NI; j++)
            UNROLL
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;

    const int64_t slices = (k + TBK - 1) / TBK;
    if (slices > 0) { // slice 0 into buffer 0
        if (TA) la.issue(As, 0, bm);
        else la.issue(As, bm, 0);
        if (TB) lb.issue(Bs, bn, 0);
        else lb.issue(Bs, 0, bn);
        pytfm__cp_async_commit();
        pytfm__cp_async_wait<0>();
        __syncthreads();
    }
    for (int64_t s = 0; s < slices; s++) {
        const int cur = (int)(s & 1);
        if (s + 1 < slices) { // the next slice on its way into the other buffer
            const int64_t p1 = (s + 1) * TBK;
            float *An = As + (cur ^ 1) * TILE, *Bn = Bs + (cur ^ 1) * TILE;
            if (TA) la.issue(An, p1, bm);
            else la.issue(An, bm, p1);
            if (TB) lb.issue(Bn, bn, p1);
            else lb.issue(Bn, p1, bn);
            pytfm__cp_async_commit();
        }
        slice_products<P, AK, BK>(acc, As + cur * TILE, Bs + cur * TILE, wr, wc, g, t);
        pytfm__cp_async_wait<0>();
        __syncthreads(); // the next slice is in for everyone, and buffer cur free again
    }

    UNROLL
    for (int i = 0; i < MI; i++)
        UNROLL
        for (int j = 0; j < NI; j++)
            UNROLL
            for (int q = 0; q < 4; q++) {
                const int64_t row = bm + wr + 16 * i + g + 8 * (q / 2);
                const int64_t col = bn + wc + 8 * j + 2 * t + q % 2;
                if (row < m && col < n) {
                    float *out = c + row * n + col;
                    *out = beta == 0.0f ? acc[i][j][q] : beta * *out + acc[i][j][q];
                }
            }
}

bool tc_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <Prec P>
pytfm_status launch_tc(const char *func, float *c, const float *a, const float *b, int64_t m,
                       int64_t n, int64_t k, bool trans_a, bool trans_b, float beta,
                       void *stream) {
    static_assert(TC_SHARED <= 48 * 1024, "no opt-in needed");
    const int vec = (tc_aligned16(a) && (trans_a ? m : k) % 4 == 0) |
                    (tc_aligned16(b) && (trans_b ? k : n) % 4 == 0) << 1;
    const int64_t tiles = ((m + TBM - 1) / TBM) * ((n + TBN - 1) / TBN);
    PYTFM_CHECK(tiles <= 2147483647, "%s: m·n must be under 2^31 tiles of %d×%d, got %lld×%lld",
                func, TBM, TBN, (long long)m, (long long)n);
    void (*kernel)(float *, const float *, const float *, int64_t, int64_t, int64_t, float,
                   int) = trans_a ? trans_b ? sgemm_tc_kernel<P, true, true>
                                            : sgemm_tc_kernel<P, true, false>
                                  : trans_b ? sgemm_tc_kernel<P, false, true>
                                            : sgemm_tc_kernel<P, false, false>;
    return pytfm__launch(func, kernel, dim3((unsigned)tiles), dim3(TTHREADS), TC_SHARED, stream,
                         c, a, b, m, n, k, beta, vec);
}

} // namespace

/* the product of pytfm_sgemm_ex_cuda after its checks (func names the public caller) */
pytfm_status pytfm__sgemm_ex_cuda(const char *func, float *c, const float *a, const float *b,
                                  int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                  int32_t trans_b, float beta, int32_t precision,
                                  void *stream) {
    if (m == 0 || n == 0) return PYTFM_STATUS_OK;
    if (precision == PYTFM_PRECISION_FP32)
        return pytfm_sgemm_cuda(c, a, b, m, n, k, trans_a, trans_b, beta, stream);
    if (precision == PYTFM_PRECISION_TF32)
        return launch_tc<TF32>(func, c, a, b, m, n, k, trans_a != 0, trans_b != 0, beta, stream);
    return launch_tc<BF16>(func, c, a, b, m, n, k, trans_a != 0, trans_b != 0, beta, stream);
}

extern "C" pytfm_status pytfm_sgemm_ex_cuda(float *c, const float *a, const float *b, int64_t m,
                                            int64_t n, int64_t k, int32_t trans_a,
                                            int32_t trans_b, float beta, int32_t precision,
                                            void *stream) {
    PYTFM_TRY(pytfm__check_sgemm(__func__, c, a, b, m, n, k, beta));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    return pytfm__sgemm_ex_cuda(__func__, c, a, b, m, n, k, trans_a, trans_b, beta, precision,
                                stream);
}
