/*
 * sgemm_tc.cu — C = β·C + op(A)·op(B) on the tensor cores, in TF32 or BF16 with FP32 sums;
 * the engine of pytfm_sgemm_ex_cuda and of the linear layer's _ex twins at those precisions
 * (PYTFM_PRECISION_FP32 stays on sgemm.cu's SIMT kernel, the oracle). Shapes as sgemm.cu:
 *
 *   c [m, n]; a [m, k] ([k, m] with trans_a); b [k, n] ([n, k] with trans_b), FP32 in memory
 *
 * Each input is rounded once, as it goes from its FP32 staging tile into the tile the
 * fragments are loaded from: TF32 by cvt.rna.tf32.f32 (to nearest, ties away: pytfm__tf32),
 * BF16 by cvt.rn.bf16x2.f32 (to nearest even: pytfm_round_bf16's rounding, but subnormals kept
 * where the CPU flushes them); the products are exact in FP32 and summed in FP32 by the mma
 * instructions (cuda/mma.cuh), so C = Σ_p r(op(A)[i, p])·r(op(B)[p, j]) in FP32 with a
 * γ_k-type bound (the tests: tests/cuda/test_cuda_tensor_core.py). β = 0 does not read C.
 *
 * The bf16 precision keeps FP32 in memory (pytfm/nn.py: master weights, activations and
 * gradients are float32 arrays; the product rounds its inputs), so the global reads are FP32;
 * what BF16 saves is inside the block: the rounded tiles are BF16 (half the shared bytes, half
 * the ldmatrix traffic of TF32's), each element is converted once per block instead of once
 * per warp that reads it, and one m16n8k16 does the work of two m16n8k8.
 *
 *  - A block of 256 threads (8 warps, 2 × 4) owns a 128 × 128 tile of C; a warp 64 × 32 of
 *    it: 4 × 4 fragments of m16n8, 64 FP32 accumulators per thread. One block per tile, all
 *    in gridDim.x, GROUP tile rows at a time down their columns (as sgemm.cu: L2 reuse).
 *    Why these sizes on an H200 (132 SMs, 227 KiB of shared memory and 64 K registers per SM):
 *    128 × 128 reads 2·128·16·4 bytes per 2·128·128·16 flops (32 flops a byte, 64 for BF16's
 *    ...per BF16 byte of shared tile) with 64 accumulators, which leaves registers for two
 *    blocks per SM (≤ 128 a thread: the ptxas report, cuda_build.log); at 4096² that is 1024
 *    tiles, 3.9 waves of 264 resident blocks. 256 × 128 would halve the waves' tail but need
 *    128 accumulators a thread: one block per SM, no other block to hide its barrier behind.
 *  - k goes in slices of 16 through a ring of STAGES = 4 FP32 staging buffers per operand,
 *    filled by cp.async (STAGES slices in flight: about 3 slices of ~0.5 µs of L2 latency
 *    covered), each slice converted into one of two rounded tiles (TF32 or BF16) one slice
 *    ahead of the products, so one barrier per slice orders everything (see the loop).
 *  - The staging tiles lie as the operands lie in memory (no padding: a warp's 16-byte copies
 *    and reads of them cover 512 contiguous bytes, conflict free). The rounded tiles:
 *      TF32, both operands: [128][16] words, k contiguous (a transposed operand is transposed
 *        by the conversion), read by ldmatrix (no .trans: a row of 4 words is a row of 8
 *        halves, and lane i receives word (i / 4, i % 4): TF32's fragment order);
 *      BF16, rows k long (A, or Bᵀ with trans_b): [128][16] halves, by ldmatrix;
 *      BF16, rows along m or n (Aᵀ with trans_a, B): [16][128] halves, by ldmatrix.trans.
 *    Each is XOR-swizzled by 16-byte chunks (swz below) so that the 8 rows of one ldmatrix
 *    matrix, which share a logical chunk, fall in 8 distinct 16-byte bank groups: one
 *    wavefront per matrix (the emulator counts them: pytfm_emu_ldmatrix_counts). The
 *    conversion's stores are 16 (TF32) or 8 (BF16) bytes a thread over 512 or 256 contiguous
 *    bytes a warp (a permutation of them), so they take the minimum of 4 or 2 wavefronts; the
 *    transposing TF32 one reads 4 words down a column (32 lanes along a row: 1 wavefront each)
 *    and stores 16 bytes into 32 rows of one chunk, again 4 wavefronts by the swizzle.
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
    STAGES = 4,          // FP32 staging buffers per operand (cp.async ring)
    STAGE = TBM * TBK,   // floats per staging buffer
    TGROUP = 8,
};
static_assert(TBM == TBN, "one tile shape for both operands");

enum Prec { TF32, BF16 };

/* 32-bit words per rounded tile, and the dynamic shared memory of a block: A's and B's
 * staging rings, then their two rounded tiles each */
template <Prec P> struct Sizes {
    static constexpr int WORDS = P == TF32 ? TBM * TBK : TBM * TBK / 2;
    static constexpr size_t SHARED = (2 * STAGES * STAGE + 2 * 2 * WORDS) * sizeof(float);
};
static_assert(Sizes<TF32>::SHARED <= 163 * 1024, "within sm_80's opt-in shared memory");

/* The physical 16-byte chunk of logical chunk c in row r of a tile whose rows are `chunks`
 * chunks long: the 8 consecutive rows of one ldmatrix matrix land in 8 distinct 16-byte bank
 * groups (of the 8 in 128 bytes). Rows of 8+ chunks: c ^ r % 8; of 4 (64 bytes: two rows per
 * 128): c ^ r / 2 % 4; of 2 (32 bytes): c ^ r / 4 % 2. */
template <int CHUNKS> static __device__ __forceinline__ int swz(int r, int c) {
    return CHUNKS >= 8 ? c ^ (r & 7) : c ^ (r / (8 / CHUNKS) & (CHUNKS - 1));
}

/* One operand's slices: the global matrix g [rows, cols] (row stride ld) whose tile at
 * (row0, col0) goes into a staging buffer [R][L], L floats a row. KROWS: the tile's rows are
 * its m or n (R = 128, L = 16 along k), else its k (R = 16, L = 128). */
template <bool KROWS> struct TileLoad {
    static constexpr int R = KROWS ? TBM : TBK, L = KROWS ? TBK : TBM;
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
            float *d = S + row * L + col;
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

static __device__ __forceinline__ float word_float(uint32_t w) {
    float f;
    memcpy(&f, &w, 4);
    return f;
}

static __device__ __forceinline__ void store2(uint32_t *p, uint32_t lo, uint32_t hi) {
#ifdef PYTFM_EMULATE
    p[0] = lo;
    p[1] = hi;
#else
    *reinterpret_cast<uint2 *>(p) = make_uint2(lo, hi);
#endif
}

/* One staging buffer (as TileLoad laid it) rounded into a tile the fragments load from, the
 * layouts of the file's comment; each thread 8 of the 2048 elements. */
template <Prec P, bool KROWS>
static __device__ __forceinline__ void round_slice(uint32_t *F, const float *S) {
    UNROLL
    for (int r = 0; r < STAGE / 4 / TTHREADS; r++) {
        const int e = threadIdx.x + r * TTHREADS; // a chunk of 4 floats
        if (P == TF32 && !KROWS) { // transpose: column x, k = p0..p0+3 -> row x of F
            const int x = e % TBM, p0 = e / TBM * 4;
            const float4 v = make_float4(S[p0 * TBM + x], S[(p0 + 1) * TBM + x],
                                         S[(p0 + 2) * TBM + x], S[(p0 + 3) * TBM + x]);
            pytfm__store4((float *)F + x * TBK + swz<4>(x, p0 / 4) * 4,
                          make_float4(word_float(pytfm__tf32(v.x)), word_float(pytfm__tf32(v.y)),
                                      word_float(pytfm__tf32(v.z)), word_float(pytfm__tf32(v.w))));
        } else if (P == TF32) { // row e / 4, k chunk e % 4
            const int row = e / 4, c = e % 4;
            const float4 v = pytfm__load4(S + 4 * e);
            pytfm__store4((float *)F + row * TBK + swz<4>(row, c) * 4,
                          make_float4(word_float(pytfm__tf32(v.x)), word_float(pytfm__tf32(v.y)),
                                      word_float(pytfm__tf32(v.z)), word_float(pytfm__tf32(v.w))));
        } else { // BF16 in the staging layout: 4 halves at (row, col) of [R][L]
            constexpr int L = KROWS ? TBK : TBM;
            const int row = e / (L / 4), col = e % (L / 4) * 4;
            const float4 v = pytfm__load4(S + 4 * e);
            const int half = row * L + swz<L / 8>(row, col / 8) * 8 + col % 8;
            store2(F + half / 2, pytfm__bf16x2(v.x, v.y), pytfm__bf16x2(v.z, v.w));
        }
    }
}

/* The fragments of A at rows wr + 16i and of B at columns wc + 8j, k from kk (TF32: 8 of them,
 * BF16: 16), by ldmatrix from the rounded tiles; lane l gives row l % 8 of matrix l / 8. */
template <Prec P, bool AK>
static __device__ __forceinline__ void load_a(uint32_t fa[MI][4], const uint32_t *F, int wr,
                                              int kk, int lane) {
    const int q = lane / 8, i8 = lane % 8;
    UNROLL
    for (int i = 0; i < MI; i++) {
        const int r0 = wr + 16 * i;
        const void *row;
        if (P == TF32) { // matrices (r0, kk), (r0 + 8, kk), (r0, kk + 4), (r0 + 8, kk + 4)
            const int r = r0 + i8 + 8 * (q % 2);
            row = F + r * TBK + swz<4>(r, kk / 4 + q / 2) * 4;
        } else if (AK) { // halves: (r0, 0), (r0 + 8, 0), (r0, 8), (r0 + 8, 8)
            const int r = r0 + i8 + 8 * (q % 2);
            row = (const uint16_t *)F + r * TBK + swz<2>(r, q / 2) * 8;
        } else { // [k][m], transposed on the way: k rows 0..7 or 8..15, m chunk r0 / 8 (+1)
            const int p = i8 + 8 * (q / 2);
            row = (const uint16_t *)F + p * TBM + swz<16>(p, r0 / 8 + q % 2) * 8;
        }
        pytfm__ldmatrix<4, P == BF16 && !AK>(fa[i], row);
    }
}

template <Prec P, bool BK>
static __device__ __forceinline__ void load_b(uint32_t fb[NI][2], const uint32_t *F, int wc,
                                              int kk, int lane) {
    const int q = lane / 8, i8 = lane % 8;
    UNROLL
    for (int j = 0; j < NI; j += 2) { // fragments j and j + 1: b0, b1 of each
        const int c0 = wc + 8 * j;
        const void *row;
        if (P == TF32) { // (c0, kk), (c0, kk + 4), (c0 + 8, kk), (c0 + 8, kk + 4)
            const int r = c0 + i8 + 8 * (q / 2);
            row = F + r * TBK + swz<4>(r, kk / 4 + q % 2) * 4;
        } else if (BK) {
            const int r = c0 + i8 + 8 * (q / 2);
            row = (const uint16_t *)F + r * TBK + swz<2>(r, q % 2) * 8;
        } else { // [k][n]: k rows 0..7, 8..15 at n chunk c0 / 8, then the same at c0 / 8 + 1
            const int p = i8 + 8 * (q % 2);
            row = (const uint16_t *)F + p * TBN + swz<16>(p, c0 / 8 + q / 2) * 8;
        }
        uint32_t r4[4];
        pytfm__ldmatrix<4, P == BF16 && !BK>(r4, row);
        fb[j][0] = r4[0];
        fb[j][1] = r4[1];
        fb[j + 1][0] = r4[2];
        fb[j + 1][1] = r4[3];
    }
}

/* the products of one rounded slice into acc (the warp's fragments at wr, wc) */
template <Prec P, bool AK, bool BK>
static __device__ __forceinline__ void slice_products(float acc[MI][NI][4], const uint32_t *Fa,
                                                      const uint32_t *Fb, int wr, int wc,
                                                      int lane) {
    UNROLL
    for (int kk = 0; kk < TBK; kk += P == TF32 ? 8 : 16) {
        uint32_t fa[MI][4], fb[NI][2];
        load_a<P, AK>(fa, Fa, wr, kk, lane);
        load_b<P, BK>(fb, Fb, wc, kk, lane);
        UNROLL
        for (int i = 0; i < MI; i++)
            UNROLL
            for (int j = 0; j < NI; j++) {
                if (P == TF32) pytfm__mma_tf32(acc[i][j], fa[i], fb[j]);
                else pytfm__mma_bf16(acc[i][j], fa[i], fb[j]);
            }
    }
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

/* C = β·C + op(A)·op(B) in precision P, a 128 × 128 tile per block. vec: bit 0 A, bit 1 B
 * take 16-byte copies. */
template <Prec P, bool TA, bool TB>
static __global__ void __launch_bounds__(TTHREADS, 2)
sgemm_tc_kernel(float *__restrict__ c, const float *__restrict__ a,
                const float *__restrict__ b, int64_t m, int64_t n, int64_t k, float beta,
                int vec) {
    constexpr bool AK = !TA, BK = TB; // whether each operand's tile rows are k long
    constexpr int FW = Sizes<P>::WORDS;
    PYTFM_DYNAMIC_SHARED(float, smem);
    float *const As = smem, *const Bs = smem + STAGES * STAGE; // [STAGES][STAGE] each
    uint32_t *const Fa = (uint32_t *)(smem + 2 * STAGES * STAGE), *const Fb = Fa + 2 * FW;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
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
    // slice s goes to staging buffer s % STAGES as cp.async group s (one group per slice,
    // empty ones past the last, so that group and slice numbers agree)
    auto issue = [&](int64_t s) {
        if (s < slices) {
            const int64_t p0 = s * TBK;
            float *An = As + s % STAGES * STAGE, *Bn = Bs + s % STAGES * STAGE;
            if (TA) la.issue(An, p0, bm);
            else la.issue(An, bm, p0);
            if (TB) lb.issue(Bn, bn, p0);
            else lb.issue(Bn, p0, bn);
        }
        pytfm__cp_async_commit();
    };
    auto round_tile = [&](int64_t s) { // staging buffer of slice s -> rounded tile s % 2
        round_slice<P, AK>(Fa + s % 2 * FW, As + s % STAGES * STAGE);
        round_slice<P, BK>(Fb + s % 2 * FW, Bs + s % STAGES * STAGE);
    };
    if (slices > 0) {
        for (int s = 0; s < STAGES; s++) issue(s);
        pytfm__cp_async_wait<STAGES - 1>(); // slice 0 (this thread's copies of it)
        __syncthreads();                    // ... and everyone's
        round_tile(0);
    }
    // Iteration s: slice s + 1 in (the wait, then the barrier: everyone's copies of it), its
    // rounding into tile (s + 1) % 2, whose last reader was slice s − 1's products, before
    // this barrier; slice s + STAGES into the staging buffer of slice s, rounded before this
    // barrier; slice s's products from tile s % 2, rounded before it. One barrier a slice.
    for (int64_t s = 0; s < slices; s++) {
        pytfm__cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (s + 1 < slices) round_tile(s + 1);
        issue(s + STAGES);
        slice_products<P, AK, BK>(acc, Fa + s % 2 * FW, Fb + s % 2 * FW, wr, wc, lane);
    }

    const int g = lane / 4, t = lane % 4;
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
    PYTFM_TRY(pytfm__allow_shared(func, kernel, Sizes<P>::SHARED));
    return pytfm__launch(func, kernel, dim3((unsigned)tiles), dim3(TTHREADS), Sizes<P>::SHARED,
                         stream, c, a, b, m, n, k, beta, vec);
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
