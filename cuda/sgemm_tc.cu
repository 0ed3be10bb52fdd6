/*
 * sgemm_tc.cu — C = β·C + op(A)·op(B) on the tensor cores, in TF32 or BF16 with FP32 sums;
 * the engine of pytfm_sgemm_ex_cuda and of the linear layer's _ex twins at those precisions
 * (PYTFM_PRECISION_FP32 stays on sgemm.cu's SIMT kernel, the oracle). Shapes as sgemm.cu:
 *
 *   c [m, n]; a [m, k] ([k, m] with trans_a); b [k, n] ([n, k] with trans_b), FP32 in memory
 *
 * Each input is rounded as the products read it: TF32 by cvt.rna.tf32.f32 (to nearest, ties
 * away: pytfm__tf32) as it becomes a fragment register, BF16 by cvt.rn.bf16x2.f32 (to nearest
 * even: pytfm_round_bf16's rounding, but subnormals kept where the CPU flushes them) once per
 * block, into a BF16 tile; the products are exact in FP32 and summed in FP32 by the mma
 * instructions (cuda/mma.cuh), so C = Σ_p r(op(A)[i, p])·r(op(B)[p, j]) in FP32 with a
 * γ_k-type bound (the tests: tests/cuda/test_cuda_tensor_core.py). β = 0 does not read C.
 *
 * The bf16 precision keeps FP32 in memory (pytfm/nn.py: weights, activations and gradients
 * are float32 arrays, the product rounds its inputs), so the global reads are FP32 in both
 * precisions; what BF16 saves is inside the block: its fragments load from BF16 tiles (half
 * the ldmatrix bytes of FP32 ones, each element converted once per block instead of once per
 * warp that reads it) and one m16n8k16 does the work of two m16n8k8. Reading BF16 from global
 * memory would need the operands stored BF16 (a change of what the model keeps) or a
 * conversion pass over them first: docs/performance.md weighs both.
 *
 *  - A block of 128 threads (4 warps, 2 × 2) owns a 128 × 128 tile of C; a warp 64 × 64 of
 *    it: 4 × 8 fragments of m16n8, 128 FP32 accumulators per thread. One block per tile, all
 *    in gridDim.x, GROUP tile rows at a time down their columns (as sgemm.cu: L2 reuse).
 *    Why these sizes on an H200 (132 SMs, 227 KiB of shared memory and 64 K registers an SM):
 *    the shared-memory bytes the fragments cost per product fall with the warp's tile (64 × 64
 *    loads 64 + 64 rows per 64·64 products, 64 × 32 loads 64 + 32 per half as many), and
 *    shared-memory bandwidth is what bounds these kernels (docs/performance.md); 128 × 128
 *    per block keeps two blocks an SM (255 registers × 128 threads each, the ptxas report in
 *    cuda_build.log; 68 or 80 KiB of shared memory each), one to compute while the other
 *    waits at its barrier; at 4096² that is 1024 tiles, 3.9 waves of 264.
 *  - k goes in slices of 16 through a ring of STAGES = 4 staging buffers per operand filled by
 *    cp.async (3 slices in flight behind the one being used); one barrier per slice orders
 *    everything (see the loops). BF16 rounds each slice into one of two BF16 tiles one slice
 *    ahead of its products; TF32 multiplies from the staging buffers themselves (a rounding
 *    pass would cost two more shared-memory passes over FP32 to save a cvt a register).
 *  - The layouts (16-byte cp.async chunks, so a swizzle by chunks is free to the copies):
 *      TF32, rows k long (A, or Bᵀ with trans_b): [128][16] floats, XOR-swizzled (swz), read
 *        by ldmatrix (no .trans: a row of 4 words is a row of 8 halves, and lane i receives
 *        word (i / 4, i % 4): TF32's fragment order);
 *      TF32, rows along m or n (Aᵀ with trans_a, B): [16][128 + 8] floats, read by 32-bit
 *        loads (ldmatrix cannot transpose 32-bit elements), conflict-free by the padding
 *        (tf32_at says why padding there);
 *      BF16: staging buffers as the operand lies, unpadded (a warp's copies, and the rounding
 *        pass's 16-byte reads, cover 512 contiguous bytes: conflict-free), rounded into
 *        [128][16] halves (rows k long, read by ldmatrix) or [16][128] halves (rows along m
 *        or n, read by ldmatrix.trans), both XOR-swizzled; the rounding pass's 8-byte stores
 *        cover 256 contiguous bytes a warp (a permutation of them): 2 wavefronts, the least.
 *    The swizzle (swz) puts the 8 rows of one ldmatrix matrix, which share a logical chunk,
 *    in 8 distinct 16-byte bank groups: one wavefront per matrix, which the emulator counts
 *    (pytfm_emu_ldmatrix_counts; tests/cuda/test_cuda_tensor_core.py).
 *  - 16-byte cp.async where the operand's base is 16-byte aligned and its row length a
 *    multiple of 4, 4-byte ones otherwise (a view offset by a float); past the edges the
 *    copies read nothing and zero-fill, so ragged m, n and k need no test in the products,
 *    and the stores are masked.
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "mma.cuh"

namespace {

enum {
    TBM = 128, TBN = 128, TBK = 16, // the block's tile of C, the k slice
    TWM = 64, TWN = 64,             // a warp's tile of C
    MI = TWM / 16, NI = TWN / 8,    // its fragments
    TTHREADS = 128,
    STAGES = 4,          // staging buffers per operand (a cp.async ring)
    XLD = TBM + 8,       // row stride of a TF32 staging buffer whose rows run along m or n
    TGROUP = 8,
};
static_assert(TBM == TBN, "one tile shape for both operands");

enum Prec { TF32, BF16 };

/* Floats per staging buffer, 32-bit words per rounded tile (BF16 only: TF32 reads its staging
 * buffers), and the dynamic shared memory of a block: A's and B's staging rings, then their
 * two rounded tiles each (TF32 68 KiB, BF16 80 KiB: two blocks an SM on sm_90's 227 KiB and
 * on sm_80's 163) */
template <Prec P> struct Sizes {
    static constexpr int STAGE = P == TF32 ? TBK * XLD : TBM * TBK; // floats a staging buffer
    static constexpr int WORDS = P == TF32 ? 0 : TBM * TBK / 2;
    static constexpr size_t SHARED = (2 * STAGES * STAGE + 2 * 2 * WORDS) * sizeof(float);
};
static_assert(Sizes<BF16>::SHARED <= 163 * 1024 / 2, "two blocks an SM even on sm_80");

/* The physical 16-byte chunk of logical chunk c in row r of a tile whose rows are `chunks`
 * chunks long: the 8 consecutive rows of one ldmatrix matrix land in 8 distinct 16-byte bank
 * groups (of the 8 in 128 bytes). Rows of 8+ chunks: c ^ r % 8; of 4 (64 bytes: two rows per
 * 128): c ^ r / 2 % 4; of 2 (32 bytes): c ^ r / 4 % 2. */
template <int CHUNKS> static __device__ __forceinline__ int swz(int r, int c) {
    return CHUNKS >= 8 ? c ^ (r & 7) : c ^ (r / (8 / CHUNKS) & (CHUNKS - 1));
}

/* The float offset of (row, col) in a TF32 staging buffer, which the fragments read directly:
 * rows k long ([128][16]) by swz<4>, for ldmatrix; rows along m or n ([16][128]), which
 * ldmatrix cannot transpose (its elements are 16-bit), read by 32-bit loads of (k = t,
 * x = g) (g = lane / 4, t = lane % 4): padded to XLD = 136 ≡ 8 banks a row, bank 8t + g, 32
 * distinct. Padding rather than an XOR here: the address is then a per-thread base plus a
 * constant per fragment (the loads take immediate offsets), where an XOR of t into the column
 * would cost address arithmetic per load. */
template <bool KROWS> static __device__ __forceinline__ int tf32_at(int row, int col) {
    return KROWS ? row * TBK + swz<4>(row, col / 4) * 4 + col % 4 : row * XLD + col;
}

/* One operand's slices: the global matrix g [rows, cols] (row stride ld) whose tiles at
 * (row0, col0) + slice·16 along k go into staging buffers [R][L], L floats a row. KROWS: the
 * tile's rows are its m or n (R = 128, L = 16 along k), else its k (R = 16, L = 128). What
 * does not move with k is worked out once (each chunk's source at slice 0, and how much of it
 * the edge across k leaves), so a slice costs a chunk a multiply-add and its copy where no
 * edge is near, and a compare or two more where one is. */
template <bool KROWS, bool SWZ> struct TileLoad {
    static constexpr int R = KROWS ? TBM : TBK, L = KROWS ? TBK : TBM;
    static constexpr int CHUNKS = R * L / 4 / TTHREADS;
    static_assert(R * L / 4 % TTHREADS == 0, "whole chunks per thread");
    const float *g;
    const float *src[CHUNKS]; // chunk r's first float at slice 0
    int kpos[CHUNKS];         // its k at slice 0
    int across[CHUNKS];       // KROWS: 1 if its row is inside, else 0; else: floats inside, 0..4
    int64_t kext, step;       // the operand's k; floats from one slice to the next
    bool vec;
    bool inside; // vec, and every chunk of this thread inside across k: only k's edge is left

    __device__ __forceinline__ TileLoad(const float *g_, int64_t ld, int64_t rows, int64_t cols,
                                        int64_t row0, int64_t col0, bool vec_)
        : g(g_), kext(KROWS ? cols : rows), step(KROWS ? (int64_t)TBK : TBK * ld), vec(vec_) {
        PYTFM_UNROLL
        for (int r = 0; r < CHUNKS; r++) {
            const int e = threadIdx.x + r * TTHREADS, row = e / (L / 4), col = e % (L / 4) * 4;
            const int64_t gr = row0 + row, gc = col0 + col;
            if (KROWS) {
                across[r] = gr < rows;
                kpos[r] = col;
            } else {
                const int64_t over = cols - gc;
                across[r] = over <= 0 ? 0 : over < 4 ? (int)over : 4;
                kpos[r] = row;
            }
            src[r] = across[r] ? g + gr * ld + gc : g;
        }
        inside = vec;
        PYTFM_UNROLL
        for (int r = 0; r < CHUNKS; r++) inside = inside && across[r] == (KROWS ? 1 : 4);
    }

    /* where chunk e (4 floats) of a slice goes: in order, or (SWZ: TF32) by tf32_at */
    static __device__ __forceinline__ int slot(int e) {
        return SWZ ? tf32_at<KROWS>(e / (L / 4), e % (L / 4) * 4) : 4 * e;
    }

    /* slice s into the staging buffer S: past the edges the copies read nothing, zero-fill */
    __device__ __forceinline__ void issue(float *S, int64_t s) const {
        if (inside && kext - s * TBK >= TBK) { // no edge: what nearly every slice takes
            PYTFM_UNROLL
            for (int r = 0; r < CHUNKS; r++)
                pytfm__cp_async16(S + slot(threadIdx.x + r * TTHREADS), src[r] + s * step, 16);
            return;
        }
        PYTFM_UNROLL
        for (int r = 0; r < CHUNKS; r++) {
            const int e = threadIdx.x + r * TTHREADS;
            const int64_t kp = s * TBK + kpos[r];
            int left;
            if (KROWS) left = !across[r] || kp >= kext ? 0 : kext - kp < 4 ? (int)(kext - kp) : 4;
            else left = kp < kext ? across[r] : 0;
            float *d = S + slot(e);
            const float *p = left ? src[r] + s * step : g;
            if (vec) {
                pytfm__cp_async16(d, p, 4 * left);
            } else {
                PYTFM_UNROLL
                for (int q = 0; q < 4; q++)
                    pytfm__cp_async4(d + q, q < left ? p + q : g, q < left ? 4 : 0);
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

/* One BF16 staging buffer (as TileLoad laid it) rounded into the tile the fragments load
 * from (the layouts of the file's comment); each thread 8 of the 2048 elements. */
template <bool KROWS>
static __device__ __forceinline__ void round_slice(uint32_t *F, const float *S) {
    constexpr int L = KROWS ? TBK : TBM;
    PYTFM_UNROLL
    for (int r = 0; r < TBM * TBK / 4 / TTHREADS; r++) {
        const int e = threadIdx.x + r * TTHREADS; // a chunk of 4 floats at (row, col) of [R][L]
        const int row = e / (L / 4), col = e % (L / 4) * 4;
        const float4 v = pytfm__load4(S + 4 * e);
        const int half = row * L + swz<L / 8>(row, col / 8) * 8 + col % 8;
        store2(F + half / 2, pytfm__bf16x2(v.x, v.y), pytfm__bf16x2(v.z, v.w));
    }
}

static __device__ __forceinline__ uint32_t tf32_of(uint32_t bits) {
    return pytfm__tf32(word_float(bits));
}

/* The fragments of A at rows wr + 16i and of B at columns wc + 8j, k from kk (TF32: 8 of them,
 * BF16: 16), by ldmatrix from the rounded tiles; lane l gives row l % 8 of matrix l / 8. */
template <Prec P, bool AK>
static __device__ __forceinline__ void load_a(uint32_t fa[MI][4], const uint32_t *F, int wr,
                                              int kk, int lane) {
    const int q = lane / 8, i8 = lane % 8, g = lane / 4, t = lane % 4;
    PYTFM_UNROLL
    for (int i = 0; i < MI; i++) {
        const int r0 = wr + 16 * i;
        const void *row;
        if (P == TF32 && !AK) { // [k][m]: 32-bit loads, (g, t) (g + 8, t) (g, t + 4) (g + 8, t + 4)
            const float *S = (const float *)F;
            fa[i][0] = pytfm__tf32(S[tf32_at<false>(kk + t, r0 + g)]);
            fa[i][1] = pytfm__tf32(S[tf32_at<false>(kk + t, r0 + g + 8)]);
            fa[i][2] = pytfm__tf32(S[tf32_at<false>(kk + t + 4, r0 + g)]);
            fa[i][3] = pytfm__tf32(S[tf32_at<false>(kk + t + 4, r0 + g + 8)]);
            continue;
        }
        if (P == TF32) { // matrices (r0, kk), (r0 + 8, kk), (r0, kk + 4), (r0 + 8, kk + 4)
            const int r = r0 + i8 + 8 * (q % 2);
            row = (const float *)F + r * TBK + swz<4>(r, kk / 4 + q / 2) * 4;
        } else if (AK) { // halves: (r0, 0), (r0 + 8, 0), (r0, 8), (r0 + 8, 8)
            const int r = r0 + i8 + 8 * (q % 2);
            row = (const uint16_t *)F + r * TBK + swz<2>(r, q / 2) * 8;
        } else { // [k][m], transposed on the way: k rows 0..7 or 8..15, m chunk r0 / 8 (+1)
            const int p = i8 + 8 * (q / 2);
            row = (const uint16_t *)F + p * TBM + swz<16>(p, r0 / 8 + q % 2) * 8;
        }
        pytfm__ldmatrix<4, P == BF16 && !AK>(fa[i], row);
        if (P == TF32)
            PYTFM_UNROLL
            for (int w = 0; w < 4; w++) fa[i][w] = tf32_of(fa[i][w]);
    }
}

template <Prec P, bool BK>
static __device__ __forceinline__ void load_b(uint32_t fb[2][2], const uint32_t *F, int c0,
                                              int kk, int lane) {
    const int q = lane / 8, i8 = lane % 8, g = lane / 4, t = lane % 4;
    if (P == TF32 && !BK) { // [k][n]: 32-bit loads, (t, g) (t + 4, g)
        const float *S = (const float *)F;
        PYTFM_UNROLL
        for (int h = 0; h < 2; h++) {
            fb[h][0] = pytfm__tf32(S[tf32_at<false>(kk + t, c0 + 8 * h + g)]);
            fb[h][1] = pytfm__tf32(S[tf32_at<false>(kk + t + 4, c0 + 8 * h + g)]);
        }
        return;
    }
    const void *row;
    if (P == TF32) { // (c0, kk), (c0, kk + 4), (c0 + 8, kk), (c0 + 8, kk + 4)
        const int r = c0 + i8 + 8 * (q / 2);
        row = (const float *)F + r * TBK + swz<4>(r, kk / 4 + q % 2) * 4;
    } else if (BK) {
        const int r = c0 + i8 + 8 * (q / 2);
        row = (const uint16_t *)F + r * TBK + swz<2>(r, q % 2) * 8;
    } else { // [k][n]: k rows 0..7, 8..15 at n chunk c0 / 8, then the same at c0 / 8 + 1
        const int p = i8 + 8 * (q % 2);
        row = (const uint16_t *)F + p * TBN + swz<16>(p, c0 / 8 + q / 2) * 8;
    }
    uint32_t r4[4];
    pytfm__ldmatrix<4, P == BF16 && !BK>(r4, row);
    PYTFM_UNROLL
    for (int w = 0; w < 4; w++) fb[w / 2][w % 2] = P == TF32 ? tf32_of(r4[w]) : r4[w];
}

/* the products of one slice into acc (the warp's fragments at wr, wc): from its rounded tiles
 * (BF16) or its staging buffers (TF32); B two fragments at a time, which keeps 4 of its
 * registers live instead of 8 */
template <Prec P, bool AK, bool BK>
static __device__ __forceinline__ void slice_products(float acc[MI][NI][4], const uint32_t *Fa,
                                                      const uint32_t *Fb, int wr, int wc,
                                                      int lane) {
    PYTFM_UNROLL
    for (int kk = 0; kk < TBK; kk += P == TF32 ? 8 : 16) {
        uint32_t fa[MI][4];
        load_a<P, AK>(fa, Fa, wr, kk, lane);
        PYTFM_UNROLL
        for (int j = 0; j < NI; j += 2) {
            uint32_t fb[2][2];
            load_b<P, BK>(fb, Fb, wc + 8 * j, kk, lane);
            PYTFM_UNROLL
            for (int i = 0; i < MI; i++)
                PYTFM_UNROLL
                for (int h = 0; h < 2; h++) {
                    if (P == TF32) pytfm__mma_tf32(acc[i][j + h], fa[i], fb[h]);
                    else pytfm__mma_bf16(acc[i][j + h], fa[i], fb[h]);
                }
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
    constexpr int FW = Sizes<P>::WORDS, STAGE = Sizes<P>::STAGE;
    PYTFM_DYNAMIC_SHARED(float, smem);
    float *const As = smem, *const Bs = smem + STAGES * STAGE; // [STAGES][STAGE] each
    uint32_t *const Fa = (uint32_t *)(smem + 2 * STAGES * STAGE), *const Fb = Fa + 2 * FW;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wr = warp / (TBN / TWN) * TWM, wc = warp % (TBN / TWN) * TWN;
    int64_t bm, bn;
    tc_tile_origin<TBM, TBN>(blockIdx.x, (m + TBM - 1) / TBM, (n + TBN - 1) / TBN, &bm, &bn);
    // A's tile at (bm, slice) or, transposed, (slice, bm); B's at (slice, bn) or (bn, slice)
    const TileLoad<AK, P == TF32> la(a, TA ? m : k, TA ? k : m, TA ? m : k, TA ? 0 : bm, TA ? bm : 0,
                          (vec & 1) != 0);
    const TileLoad<BK, P == TF32> lb(b, TB ? k : n, TB ? n : k, TB ? k : n, TB ? bn : 0, TB ? 0 : bn,
                          (vec & 2) != 0);
    float acc[MI][NI][4];
    PYTFM_UNROLL
    for (int i = 0; i < MI; i++)
        PYTFM_UNROLL
        for (int j = 0; j < NI; j++)
            PYTFM_UNROLL
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;

    const int64_t slices = (k + TBK - 1) / TBK;
    // slice s goes to staging buffer s % STAGES as cp.async group s (one group per slice,
    // empty ones past the last, so that group and slice numbers agree)
    auto issue = [&](int64_t s) {
        if (s < slices) {
            la.issue(As + s % STAGES * STAGE, s);
            lb.issue(Bs + s % STAGES * STAGE, s);
        }
        pytfm__cp_async_commit();
    };
    if (P == TF32) {
        for (int s = 0; s < STAGES - 1; s++) issue(s);
        // Iteration s: slice s in (the wait, then the barrier: everyone's copies of it); slice
        // s + STAGES − 1 into the staging buffer of slice s − 1, whose products every thread
        // finished before this barrier; slice s's products from its staging buffer. One
        // barrier a slice; STAGES − 1 slices in flight behind the one being multiplied.
        for (int64_t s = 0; s < slices; s++) {
            pytfm__cp_async_wait<STAGES - 2>();
            __syncthreads();
            issue(s + STAGES - 1);
            slice_products<P, AK, BK>(acc, (const uint32_t *)(As + s % STAGES * STAGE),
                                      (const uint32_t *)(Bs + s % STAGES * STAGE), wr, wc, lane);
        }
    } else if (slices > 0) {
        auto round_tile = [&](int64_t s) { // staging buffer of slice s -> rounded tile s % 2
            round_slice<AK>(Fa + s % 2 * FW, As + s % STAGES * STAGE);
            round_slice<BK>(Fb + s % 2 * FW, Bs + s % STAGES * STAGE);
        };
        for (int s = 0; s < STAGES; s++) issue(s);
        pytfm__cp_async_wait<STAGES - 1>(); // slice 0 (this thread's copies of it)
        __syncthreads();                    // ... and everyone's
        round_tile(0);
        // Iteration s: slice s + 1 in (the wait, then the barrier: everyone's copies of it),
        // its rounding into tile (s + 1) % 2, whose last reader was slice s − 1's products,
        // before this barrier; slice s + STAGES into the staging buffer of slice s, rounded
        // before this barrier; slice s's products from tile s % 2, rounded before it. One
        // barrier a slice.
        for (int64_t s = 0; s < slices; s++) {
            pytfm__cp_async_wait<STAGES - 2>();
            __syncthreads();
            if (s + 1 < slices) round_tile(s + 1);
            issue(s + STAGES);
            slice_products<P, AK, BK>(acc, Fa + s % 2 * FW, Fb + s % 2 * FW, wr, wc, lane);
        }
    }

    const int g = lane / 4, t = lane % 4;
    PYTFM_UNROLL
    for (int i = 0; i < MI; i++)
        PYTFM_UNROLL
        for (int j = 0; j < NI; j++)
            PYTFM_UNROLL
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
