/*
 * sgemm_tc.cu — C = β·C + op(A)·op(B) on the tensor cores, in TF32 or BF16 with FP32 sums;
 * the engine of pytfm_sgemm_ex_cuda and of the linear layer's _ex twins at those precisions
 * (PYTFM_PRECISION_FP32 stays on sgemm.cu's SIMT kernel, the oracle), and of
 * pytfm_gemm_bf16_cuda, whose operands are BF16 in memory. Shapes as sgemm.cu:
 *
 *   c [m, n]; a [m, k] ([k, m] with trans_a); b [k, n] ([n, k] with trans_b), FP32 in memory,
 *   or BF16 (raw uint16_t bits) for pytfm_gemm_bf16_cuda
 *
 * Each input is rounded as the products read it: TF32 by cvt.rna.tf32.f32 (to nearest, ties
 * away: pytfm__tf32) as it becomes a fragment register, BF16 by cvt.rn.bf16x2.f32 (to nearest
 * even: pytfm_round_bf16's rounding, but subnormals kept where the CPU flushes them) once per
 * block, into a BF16 tile; the products are exact in FP32 and summed in FP32 by the mma
 * instructions (cuda/mma.cuh), so C = Σ_p r(op(A)[i, p])·r(op(B)[p, j]) in FP32 with a
 * γ_k-type bound (the tests: tests/cuda/test_cuda_tensor_core.py). β = 0 does not read C.
 *
 * The bf16 precision keeps FP32 in memory (pytfm/nn.py: weights, activations and gradients
 * are float32 arrays, the product rounds its inputs). Its product takes one of two routes with
 * the same bits: small products round each FP32 slice in the block into BF16 tiles (their
 * fragments load half the ldmatrix bytes of FP32 ones, each element converted once per block
 * instead of once per warp that reads it); larger ones first round each operand into stream
 * scratch (to_bf16_kernel: cvt.rn.bf16x2.f32 as the block does, rows padded to 8 elements)
 * and run the BF16-operand kernel on that, whose shared memory carries half the bytes and no
 * rounding pass (bf16_convert_first says where that pays; docs/performance.md has the
 * estimate). Either way one m16n8k16 does the work of two m16n8k8, in the same order of k, on
 * the same rounded values, zeros past the edges: hence the same bits.
 *
 *  - A block of 128 threads (4 warps, 2 × 2) owns a 128 × 128 tile of C; a warp 64 × 64 of
 *    it: 4 × 8 fragments of m16n8, 128 FP32 accumulators per thread. One block per tile, all
 *    in gridDim.x, GROUP tile rows at a time down their columns (as sgemm.cu: L2 reuse).
 *    Why these sizes on an H200 (132 SMs, 227 KiB of shared memory and 64 K registers an SM):
 *    the shared-memory bytes the fragments cost per product fall with the warp's tile (64 × 64
 *    loads 64 + 64 rows per 64·64 products, 64 × 32 loads 64 + 32 per half as many), and
 *    shared-memory bandwidth is what bounds the FP32-operand kernels (docs/performance.md;
 *    the tensor cores bound the BF16-operand one); 128 × 128 per block keeps two blocks an SM
 *    (at most 255 registers × 128 threads each, the ptxas report in cuda_build.log; 68, 80 or
 *    64 KiB of shared memory each: TF32, BF16, BF16 operands), one to compute while the other
 *    waits at its barrier; at 4096² that is 1024 tiles, 3.9 waves of 264.
 *  - k goes in slices of 16 through a ring of STAGES = 4 staging buffers per operand filled by
 *    cp.async (3 slices in flight behind the one being used); one barrier per slice orders
 *    everything (see the loops). BF16 rounds each slice into one of two BF16 tiles one slice
 *    ahead of its products; TF32 multiplies from the staging buffers themselves (a rounding
 *    pass would cost two more shared-memory passes over FP32 to save a cvt a register). BF16
 *    operands in memory go in slices of 32 (products_b16 says why) straight into a ring of 4
 *    swizzled BF16 tiles per operand (64 KiB a block), multiplied from there.
 *  - The layouts (16-byte cp.async chunks, so a swizzle by chunks is free to the copies):
 *      TF32, rows k long (A, or Bᵀ with trans_b): [128][16] floats, XOR-swizzled (pytfm__swz, cuda/mma.cuh), read
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
 *      BF16 operands in memory: [128][32] halves (rows k long, pytfm__swz<4>) or [32][128] (rows
 *        along m or n, pytfm__swz<16>, ldmatrix.trans), written by the 16-byte copies themselves (a
 *        warp's cover 512 contiguous bytes, permuted within rows: 4 wavefronts, the least).
 *    The swizzle (pytfm__swz) puts the 8 rows of one ldmatrix matrix, which share a logical chunk,
 *    in 8 distinct 16-byte bank groups: one wavefront per matrix, which the emulator counts
 *    (pytfm_emu_ldmatrix_counts; tests/cuda/test_cuda_tensor_core.py).
 *  - 16-byte cp.async where the operand's base is 16-byte aligned and its row length a
 *    multiple of 4 (BF16: of 8), 4-byte ones otherwise (a view offset by a float; BF16: where
 *    base and rows are even), and for BF16 operands whose rows start at odd elements plain
 *    2-byte loads (cp.async copies 4 bytes at the least); past the edges the copies read
 *    nothing and zero-fill, so ragged m, n and k need no test in the products, and the stores
 *    are masked.
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include <type_traits>

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
    TBK16 = 32,          // the k slice of BF16 operands in memory (their tiles: 8 KiB each)
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

/* BF16 operands in memory: STAGES tiles per operand of 128 × 32 halves, the fragments' own
 * (swizzled) layout, 64 KiB a block */
constexpr size_t SHARED16 = 2 * STAGES * TBM * TBK16 * sizeof(uint16_t);
static_assert(SHARED16 <= 163 * 1024 / 2, "two blocks an SM even on sm_80");

/* The float offset of (row, col) in a TF32 staging buffer, which the fragments read directly:
 * rows k long ([128][16]) by pytfm__swz<4>, for ldmatrix; rows along m or n ([16][128]), which
 * ldmatrix cannot transpose (its elements are 16-bit), read by 32-bit loads of (k = t,
 * x = g) (g = lane / 4, t = lane % 4): padded to XLD = 136 ≡ 8 banks a row, bank 8t + g, 32
 * distinct. Padding rather than an XOR here: the address is then a per-thread base plus a
 * constant per fragment (the loads take immediate offsets), where an XOR of t into the column
 * would cost address arithmetic per load. */
template <bool KROWS> static __device__ __forceinline__ int tf32_at(int row, int col) {
    return KROWS ? row * TBK + pytfm__swz<4>(row, col / 4) * 4 + col % 4 : row * XLD + col;
}

/* The 16-byte chunks of one operand's tiles that this thread copies: the global matrix g
 * [rows, cols] of T (W = 16 / sizeof(T) elements a chunk, row stride ld) whose tiles [R][L] at
 * (row0, col0) + slice·KD along k go into shared memory. KROWS: the tile's rows are its m or n
 * (L along k), else its k (R along k). What does not move with k is worked out once, so a
 * slice costs a chunk a multiply-add and its copy where no edge is near, and a compare or two
 * more where one is.
 * A thread's chunks share a column of the tile and lie RS rows apart (TTHREADS is a multiple
 * of the L / W chunks of a row), so they are kept as one source (chunk 0's at slice 0) and
 * one stride, not a pointer each: the register budget of the kernels (cuda_build.log, held
 * by tests/cuda/test_cuda_build_log.py) has no room for CHUNKS 64-bit pointers per operand. */
template <class T, bool KROWS, int R, int L, int KD> struct Chunks {
    static constexpr int W = 16 / (int)sizeof(T), CHUNKS = R * L / W / TTHREADS;
    static constexpr int RS = TTHREADS / (L / W); // rows from one chunk of a thread to the next
    static_assert(R * L / W % TTHREADS == 0, "whole chunks per thread");
    static_assert(TTHREADS % (L / W) == 0, "a thread's chunks share a column");
    const T *g;
    const T *src;   // chunk 0's first element at slice 0 (chunk r's: src + r·rstride)
    int64_t rstride; // RS·ld
    int kpos;       // chunk 0's k at slice 0 (chunk r's: kpos + r·RS where R is along k)
    int across;     // KROWS: bit r set if chunk r's row is inside; else elements inside, 0..W
    int64_t kext, step; // the operand's k; elements from one slice to the next

    __device__ __forceinline__ Chunks(const T *g_, int64_t ld, int64_t rows, int64_t cols,
                                      int64_t row0, int64_t col0)
        : g(g_), rstride(RS * ld), kext(KROWS ? cols : rows),
          step(KROWS ? (int64_t)KD : KD * ld) {
        const int row = threadIdx.x / (L / W), col = threadIdx.x % (L / W) * W;
        const int64_t gr = row0 + row, gc = col0 + col;
        if (KROWS) {
            across = 0;
            PYTFM_UNROLL
            for (int r = 0; r < CHUNKS; r++) across |= (gr + r * RS < rows) << r;
            kpos = col;
        } else {
            const int64_t over = cols - gc;
            across = over <= 0 ? 0 : over < W ? (int)over : W;
            kpos = row;
        }
        src = g + gr * ld + gc;
    }

    /* whether chunk r's row (KROWS) or column (else) is inside the operand */
    __device__ __forceinline__ bool inside_across(int r) const {
        return KROWS ? (across >> r & 1) != 0 : across != 0;
    }

    /* whether every chunk of this thread is whole across k: only k's edge is left */
    __device__ __forceinline__ bool whole_across() const {
        return KROWS ? across == (1 << CHUNKS) - 1 : across == W;
    }

    /* whether slice s is whole along k */
    __device__ __forceinline__ bool whole_along(int64_t s) const { return kext - s * KD >= KD; }

    /* the elements of chunk r inside the operand at slice s, 0..W */
    __device__ __forceinline__ int left(int r, int64_t s) const {
        if (KROWS) {
            const int64_t kp = s * KD + kpos;
            return !inside_across(r) || kp >= kext ? 0 : kext - kp < W ? (int)(kext - kp) : W;
        }
        return s * KD + kpos + r * RS < kext ? across : 0;
    }

    /* chunk r's source at slice s, every chunk of the thread inside */
    __device__ __forceinline__ const T *whole(int r, int64_t s) const {
        return src + r * rstride + s * step;
    }

    /* chunk r's source at slice s (g where nothing of it is inside: a valid address, unread) */
    __device__ __forceinline__ const T *at(int r, int64_t s, int left) const {
        return left ? whole(r, s) : g;
    }
};

/* One FP32 operand's slices of 16 along k into staging buffers [R][L], L floats a row:
 * R = 128, L = 16 where the tile's rows are its m or n (KROWS), else R = 16, L = 128. */
template <bool KROWS, bool SWZ>
struct TileLoad : Chunks<float, KROWS, KROWS ? TBM : TBK, KROWS ? TBK : TBM, TBK> {
    using Base = Chunks<float, KROWS, KROWS ? TBM : TBK, KROWS ? TBK : TBM, TBK>;
    using Base::CHUNKS;
    using Base::g;
    static constexpr int L = KROWS ? TBK : TBM;
    bool vec;
    bool inside; // vec, and every chunk of this thread whole across k: only k's edge is left

    __device__ __forceinline__ TileLoad(const float *g_, int64_t ld, int64_t rows, int64_t cols,
                                        int64_t row0, int64_t col0, bool vec_)
        : Base(g_, ld, rows, cols, row0, col0), vec(vec_) {
        inside = vec && Base::whole_across();
    }

    /* where chunk e (4 floats) of a slice goes: in order, or (SWZ: TF32) by tf32_at */
    static __device__ __forceinline__ int slot(int e) {
        return SWZ ? tf32_at<KROWS>(e / (L / 4), e % (L / 4) * 4) : 4 * e;
    }

    /* slice s into the staging buffer S: past the edges the copies read nothing, zero-fill */
    __device__ __forceinline__ void issue(float *S, int64_t s) const {
        if (inside && Base::whole_along(s)) { // no edge: what nearly every slice takes
            PYTFM_UNROLL
            for (int r = 0; r < CHUNKS; r++)
                pytfm__cp_async16(S + slot(threadIdx.x + r * TTHREADS), Base::whole(r, s), 16);
            return;
        }
        PYTFM_UNROLL
        for (int r = 0; r < CHUNKS; r++) {
            const int left = Base::left(r, s);
            float *d = S + slot(threadIdx.x + r * TTHREADS);
            const float *p = Base::at(r, s, left);
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

/* How a BF16 operand in memory is copied: 16-byte cp.async where its base is 16-byte aligned
 * and its row length a multiple of 8 halves, 4-byte ones where both are even (a view offset by
 * a pair), else plain 2-byte loads and shared stores (a view offset by one half: cp.async
 * copies 4, 8 or 16 bytes, never 2). A plain store into a tile needs nothing more than a copy
 * does: it goes to the staging tile whose readers finished before the barrier it follows, and
 * is read after the barriers that the copies wait for. */
enum Copy16 { COPY2 = 0, COPY4 = 1, COPY16 = 2 };

/* One BF16 operand's slices of 32 along k, straight into the tiles the fragments load from:
 * [R][L] halves, XOR-swizzled by 16-byte chunks as the fragment loads read them (rows k long,
 * [128][32]: pytfm__swz<4>; rows along m or n, [32][128]: pytfm__swz<16>). A chunk is 8 halves. */
template <bool KROWS>
struct TileLoad16 : Chunks<uint16_t, KROWS, KROWS ? TBM : TBK16, KROWS ? TBK16 : TBM, TBK16> {
    using Base = Chunks<uint16_t, KROWS, KROWS ? TBM : TBK16, KROWS ? TBK16 : TBM, TBK16>;
    using Base::CHUNKS;
    using Base::g;
    static constexpr int L = KROWS ? TBK16 : TBM;
    int copy;    // a Copy16
    bool inside; // 16-byte copies, and every chunk of this thread whole across k

    __device__ __forceinline__ TileLoad16(const uint16_t *g_, int64_t ld, int64_t rows,
                                          int64_t cols, int64_t row0, int64_t col0, int copy_)
        : Base(g_, ld, rows, cols, row0, col0), copy(copy_) {
        inside = copy == COPY16 && Base::whole_across();
    }

    /* where chunk e (8 halves) of a slice goes in the tile */
    static __device__ __forceinline__ int slot(int e) {
        const int row = e / (L / 8);
        return row * L + pytfm__swz<L / 8>(row, e % (L / 8)) * 8;
    }

    /* slice s into the tile S: past the edges nothing is read and the tile holds zeros */
    __device__ __forceinline__ void issue(uint16_t *S, int64_t s) const {
        if (inside && Base::whole_along(s)) { // no edge: what nearly every slice takes
            PYTFM_UNROLL
            for (int r = 0; r < CHUNKS; r++)
                pytfm__cp_async16((float *)(S + slot(threadIdx.x + r * TTHREADS)),
                                  (const float *)Base::whole(r, s), 16);
            return;
        }
        PYTFM_UNROLL
        for (int r = 0; r < CHUNKS; r++) {
            const int left = Base::left(r, s);
            uint16_t *d = S + slot(threadIdx.x + r * TTHREADS);
            const uint16_t *p = Base::at(r, s, left);
            if (copy == COPY16) {
                pytfm__cp_async16((float *)d, (const float *)p, 2 * left);
            } else if (copy == COPY4) {
                PYTFM_UNROLL
                for (int q = 0; q < 4; q++) {
                    const int have = 2 * (left - 2 * q), bytes = have < 0 ? 0 : have < 4 ? have : 4;
                    pytfm__cp_async4((float *)(d + 2 * q), (const float *)(bytes ? p + 2 * q : g),
                                     bytes);
                }
            } else {
                PYTFM_UNROLL
                for (int q = 0; q < 8; q++) d[q] = q < left ? p[q] : (uint16_t)0;
            }
        }
    }
};

static __device__ __forceinline__ float word_float(uint32_t w) {
    float f;
    memcpy(&f, &w, 4);
    return f;
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
        const int half = row * L + pytfm__swz<L / 8>(row, col / 8) * 8 + col % 8;
        pytfm__store2(F + half / 2, pytfm__bf16x2(v.x, v.y), pytfm__bf16x2(v.z, v.w));
    }
}

static __device__ __forceinline__ uint32_t tf32_of(uint32_t bits) {
    return pytfm__tf32(word_float(bits));
}

/* The fragments of A at rows wr + 16i and of B at columns wc + 8j, k from kk (TF32: 8 of them,
 * BF16: 16), by ldmatrix from the rounded tiles; lane l gives row l % 8 of matrix l / 8. */
template <Prec P, bool AK, int KD>
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
            row = (const float *)F + r * TBK + pytfm__swz<4>(r, kk / 4 + q / 2) * 4;
        } else if (AK) { // halves [128][KD]: (r0, kk), (r0 + 8, kk), (r0, kk + 8), (r0 + 8, kk + 8)
            const int r = r0 + i8 + 8 * (q % 2);
            row = (const uint16_t *)F + r * KD + pytfm__swz<KD / 8>(r, kk / 8 + q / 2) * 8;
        } else { // [KD][m], transposed on the way: k rows kk + 0..7 or + 8..15, m chunk r0 / 8 (+1)
            const int p = kk + i8 + 8 * (q / 2);
            row = (const uint16_t *)F + p * TBM + pytfm__swz<16>(p, r0 / 8 + q % 2) * 8;
        }
        pytfm__ldmatrix<4, P == BF16 && !AK>(fa[i], row);
        if (P == TF32)
            PYTFM_UNROLL
            for (int w = 0; w < 4; w++) fa[i][w] = tf32_of(fa[i][w]);
    }
}

template <Prec P, bool BK, int KD>
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
        row = (const float *)F + r * TBK + pytfm__swz<4>(r, kk / 4 + q % 2) * 4;
    } else if (BK) { // halves [128][KD]: (c0, kk), (c0, kk + 8), (c0 + 8, kk), (c0 + 8, kk + 8)
        const int r = c0 + i8 + 8 * (q / 2);
        row = (const uint16_t *)F + r * KD + pytfm__swz<KD / 8>(r, kk / 8 + q % 2) * 8;
    } else { // [KD][n]: k rows kk + 0..7, + 8..15 at n chunk c0 / 8, then the same at c0 / 8 + 1
        const int p = kk + i8 + 8 * (q % 2);
        row = (const uint16_t *)F + p * TBN + pytfm__swz<16>(p, c0 / 8 + q / 2) * 8;
    }
    uint32_t r4[4];
    pytfm__ldmatrix<4, P == BF16 && !BK>(r4, row);
    PYTFM_UNROLL
    for (int w = 0; w < 4; w++) fb[w / 2][w % 2] = P == TF32 ? tf32_of(r4[w]) : r4[w];
}

/* the products of one slice of KD along k into acc (the warp's fragments at wr, wc): from its
 * rounded tiles (BF16), its BF16 tiles as copied (BF16 in memory, KD = 32) or its staging
 * buffers (TF32); B two fragments at a time, which keeps 4 of its registers live instead of 8.
 * The mma instructions go in order of k whatever KD: a slice of 32 is two of 16, the same
 * sums in the same order. */
template <Prec P, bool AK, bool BK, int KD = TBK>
static __device__ __forceinline__ void slice_products(float acc[MI][NI][4], const uint32_t *Fa,
                                                      const uint32_t *Fb, int wr, int wc,
                                                      int lane) {
    PYTFM_UNROLL
    for (int kk = 0; kk < KD; kk += P == TF32 ? 8 : 16) {
        uint32_t fa[MI][4];
        load_a<P, AK, KD>(fa, Fa, wr, kk, lane);
        PYTFM_UNROLL
        for (int j = 0; j < NI; j += 2) {
            uint32_t fb[2][2];
            load_b<P, BK, KD>(fb, Fb, wc + 8 * j, kk, lane);
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

/* The products of the FP32 operands' slices into acc: slices of 16 through the staging ring,
 * TF32 multiplied from the staging buffers, BF16 rounded into two tiles first (the file's
 * comment). vec: bit 0 A, bit 1 B take 16-byte copies. */
template <Prec P, bool TA, bool TB>
static __device__ __forceinline__ void products_f32(float acc[MI][NI][4], float *smem,
                                                    const float *a, const float *b, int64_t m,
                                                    int64_t n, int64_t k, int64_t lda,
                                                    int64_t ldb, int64_t bm, int64_t bn,
                                                    int vec, int wr, int wc, int lane) {
    constexpr bool AK = !TA, BK = TB; // whether each operand's tile rows are k long
    constexpr int FW = Sizes<P>::WORDS, STAGE = Sizes<P>::STAGE;
    float *const As = smem, *const Bs = smem + STAGES * STAGE; // [STAGES][STAGE] each
    uint32_t *const Fa = (uint32_t *)(smem + 2 * STAGES * STAGE), *const Fb = Fa + 2 * FW;
    // A's tile at (bm, slice) or, transposed, (slice, bm); B's at (slice, bn) or (bn, slice)
    const TileLoad<AK, P == TF32> la(a, lda, TA ? k : m, TA ? m : k, TA ? 0 : bm, TA ? bm : 0,
                                     (vec & 1) != 0);
    const TileLoad<BK, P == TF32> lb(b, ldb, TB ? n : k, TB ? k : n, TB ? bn : 0, TB ? 0 : bn,
                                     (vec & 2) != 0);
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
}

/* The products of BF16 operands in memory (uint16_t bits) into acc: slices of 32 along k,
 * copied straight into the swizzled tiles the fragments load from (TileLoad16), a ring of
 * STAGES of them per operand; the loop of TF32's (products from the tiles as they came), one
 * barrier per slice of 32. copy: A's Copy16 in bits 0-1, B's in bits 2-3. Why 32: a slice of
 * BF16 is half the bytes of one of FP32, so 32 along k fills the ring's 64 KiB as 16 of FP32
 * fill TF32's, and halves the barriers and the loop's fixed cost per k; 4 stages keep 3 slices
 * (96 of k, 48 KiB) in flight, and 64 KiB a block still gives two blocks an SM on sm_80 and
 * sm_90 (what the 255 registers a thread allow in any case). */
template <bool TA, bool TB>
static __device__ __forceinline__ void products_b16(float acc[MI][NI][4], float *smem,
                                                    const uint16_t *a, const uint16_t *b,
                                                    int64_t m, int64_t n, int64_t k,
                                                    int64_t lda, int64_t ldb, int64_t bm,
                                                    int64_t bn, int copy, int wr, int wc,
                                                    int lane) {
    constexpr bool AK = !TA, BK = TB;
    constexpr int TILE = TBM * TBK16; // halves
    uint16_t *const As = (uint16_t *)smem, *const Bs = As + STAGES * TILE;
    const TileLoad16<AK> la(a, lda, TA ? k : m, TA ? m : k, TA ? 0 : bm, TA ? bm : 0, copy & 3);
    const TileLoad16<BK> lb(b, ldb, TB ? n : k, TB ? k : n, TB ? bn : 0, TB ? 0 : bn,
                            copy >> 2 & 3);
    const int64_t slices = (k + TBK16 - 1) / TBK16;
    auto issue = [&](int64_t s) { // slice s into tile s % STAGES as cp.async group s
        if (s < slices) {
            la.issue(As + s % STAGES * TILE, s);
            lb.issue(Bs + s % STAGES * TILE, s);
        }
        pytfm__cp_async_commit();
    };
    for (int s = 0; s < STAGES - 1; s++) issue(s);
    // Iteration s: slice s in (the wait, then the barrier); slice s + STAGES − 1 into the
    // tile of slice s − 1, whose products every thread finished before this barrier; slice
    // s's products from its tile.
    for (int64_t s = 0; s < slices; s++) {
        pytfm__cp_async_wait<STAGES - 2>();
        __syncthreads();
        issue(s + STAGES - 1);
        slice_products<BF16, AK, BK, TBK16>(acc, (const uint32_t *)(As + s % STAGES * TILE),
                                            (const uint32_t *)(Bs + s % STAGES * TILE), wr, wc,
                                            lane);
    }
}

/* C = β·C + op(A)·op(B) in precision P, a 128 × 128 tile per block, A and B of element type
 * T: float (rounded as the file's comment says) or uint16_t (BF16 bits; P is BF16), their
 * rows lda and ldb elements apart. copy: how each operand is copied (products_f32's vec or
 * products_b16's copy). */
template <Prec P, class T, bool TA, bool TB>
static __global__ void __launch_bounds__(TTHREADS, 2)
sgemm_tc_kernel(float *__restrict__ c, const T *__restrict__ a, const T *__restrict__ b,
                int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, float beta,
                int copy) {
    constexpr bool MEM16 = std::is_same<T, uint16_t>::value;
    static_assert(!MEM16 || P == BF16, "BF16 operands multiply in BF16");
    PYTFM_DYNAMIC_SHARED(float, smem);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wr = warp / (TBN / TWN) * TWM, wc = warp % (TBN / TWN) * TWN;
    int64_t bm, bn;
    tc_tile_origin<TBM, TBN>(blockIdx.x, (m + TBM - 1) / TBM, (n + TBN - 1) / TBN, &bm, &bn);
    float acc[MI][NI][4];
    PYTFM_UNROLL
    for (int i = 0; i < MI; i++)
        PYTFM_UNROLL
        for (int j = 0; j < NI; j++)
            PYTFM_UNROLL
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
    if constexpr (MEM16)
        products_b16<TA, TB>(acc, smem, a, b, m, n, k, lda, ldb, bm, bn, copy, wr, wc, lane);
    else
        products_f32<P, TA, TB>(acc, smem, a, b, m, n, k, lda, ldb, bm, bn, copy, wr, wc, lane);

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

bool tc_aligned(const void *p, unsigned bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }

/* how an operand at p, rows ld elements apart, is copied: products_f32's 1 (16-byte copies)
 * or 0 (4-byte), products_b16's Copy16 */
int tc_copy(const float *p, int64_t ld) { return tc_aligned(p, 16) && ld % 4 == 0; }
int tc_copy(const uint16_t *p, int64_t ld) {
    return tc_aligned(p, 16) && ld % 8 == 0  ? COPY16
           : tc_aligned(p, 4) && ld % 2 == 0 ? COPY4
                                             : COPY2;
}

template <Prec P, class T>
pytfm_status launch_tc(const char *func, float *c, const T *a, const T *b, int64_t m, int64_t n,
                       int64_t k, int64_t lda, int64_t ldb, bool trans_a, bool trans_b,
                       float beta, void *stream) {
    constexpr size_t shared = std::is_same<T, uint16_t>::value ? SHARED16 : Sizes<P>::SHARED;
    const int copy = tc_copy(a, lda) | tc_copy(b, ldb) << (std::is_same<T, uint16_t>::value ? 2 : 1);
    const int64_t tiles = ((m + TBM - 1) / TBM) * ((n + TBN - 1) / TBN);
    PYTFM_CHECK(tiles <= 2147483647, "%s: m·n must be under 2^31 tiles of %d×%d, got %lld×%lld",
                func, TBM, TBN, (long long)m, (long long)n);
    void (*kernel)(float *, const T *, const T *, int64_t, int64_t, int64_t, int64_t, int64_t,
                   float, int) = trans_a ? trans_b ? sgemm_tc_kernel<P, T, true, true>
                                                   : sgemm_tc_kernel<P, T, true, false>
                                         : trans_b ? sgemm_tc_kernel<P, T, false, true>
                                                   : sgemm_tc_kernel<P, T, false, false>;
    PYTFM_TRY(pytfm__allow_shared(func, kernel, shared));
    return pytfm__launch(func, kernel, dim3((unsigned)tiles), dim3(TTHREADS), shared, stream, c,
                         a, b, m, n, k, lda, ldb, beta, copy);
}

/* dst [rows, ld] halves: src [rows, cols] (rows cols floats apart) rounded by cvt.rn.bf16x2.f32,
 * the rounding the in-block path applies (pytfm__bf16x2: subnormals kept), each row padded with
 * zeros to ld (a multiple of 8, so that every row starts 16-byte aligned); a thread per 16-byte
 * chunk of dst, float4 loads where vec (src 16-byte aligned and cols a multiple of 4) */
static __global__ void to_bf16_kernel(uint16_t *__restrict__ dst, const float *__restrict__ src,
                                      int64_t rows, int64_t cols, int64_t ld, int vec) {
    const int64_t per_row = ld / 8, chunks = rows * per_row;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < chunks;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / per_row, j = e % per_row * 8;
        const float *row = src + r * cols;
        float x[8];
        if (vec && j + 8 <= cols) {
            const float4 lo = pytfm__load4(row + j), hi = pytfm__load4(row + j + 4);
            x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w;
            x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
        } else {
            PYTFM_UNROLL
            for (int q = 0; q < 8; q++) x[q] = j + q < cols ? row[j + q] : 0.0f;
        }
        uint32_t w[4];
        PYTFM_UNROLL
        for (int q = 0; q < 4; q++) w[q] = pytfm__bf16x2(x[2 * q], x[2 * q + 1]);
        float4 out;
        memcpy(&out, w, sizeof out);
        pytfm__store4((float *)(dst + r * ld + j), out);
    }
}

pytfm_status to_bf16(const char *func, uint16_t *dst, const float *src, int64_t rows,
                     int64_t cols, int64_t ld, void *stream) {
    if (rows * ld == 0) return PYTFM_STATUS_OK;
    return pytfm__launch(func, to_bf16_kernel,
                         dim3(pytfm__blocks(rows * ld / 8, PYTFM_ROW_THREADS, PYTFM_MAX_BLOCKS)),
                         dim3(PYTFM_ROW_THREADS), 0, stream, dst, src, rows, cols, ld,
                         (int)(tc_aligned(src, 16) && cols % 4 == 0));
}

/* The emulator's tests run both routes of a bf16 product on one shape (their bits must agree):
 * -1 chooses by the estimate, 0 rounds in the block, 1 converts first. */
int bf16_route = -1;

/* Whether the bf16 product of FP32 operands converts them into stream scratch first and then
 * multiplies BF16 operands, rather than rounding each slice in the block. Both give the same
 * bits (the same roundings of the same values, the same mma instructions in the same order),
 * so this is a choice of speed only, by the estimate of docs/performance.md on an H200: the
 * in-block path at ~305 TFLOP/s (bound by shared memory), the BF16-operand kernel at ~545
 * (bound by the tensor cores), the conversion memory-bound, 6 bytes an element (4 read, 2
 * written) of the k·(m + n) the operands hold at ~4.3 TB/s, plus ~2 µs for its two launches.
 * Converting pays where 2mnk·(1/305 − 1/545) > 6k(m + n)/4300 + 2000 (ns, TFLOP/s and GB/s in
 * the units): roughly where 2mn/(m + n) > 970 and the product is past a few GFLOP. */
bool bf16_convert_first(int64_t m, int64_t n, int64_t k) {
    if (bf16_route >= 0) return bf16_route != 0;
    const double flops = 2.0 * (double)m * (double)n * (double)k;
    const double saved_ns = flops / 305e3 - flops / 545e3;
    const double cost_ns = 6.0 * (double)k * (double)(m + n) / 4.3e3 + 2000.0;
    return saved_ns > cost_ns;
}

/* the bf16 product of FP32 operands through BF16 copies of them in stream scratch */
pytfm_status bf16_converted(const char *func, float *c, const float *a, const float *b, int64_t m,
                            int64_t n, int64_t k, bool trans_a, bool trans_b, float beta,
                            void *stream) {
    const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
    const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    const int64_t lda = (a_cols + 7) / 8 * 8, ldb = (b_cols + 7) / 8 * 8;
    uint16_t *scratch = nullptr;
    PYTFM_TRY(pytfm__stream_scratch(func, &scratch, a_rows * lda + b_rows * ldb, stream));
    uint16_t *const a16 = scratch, *const b16 = scratch + a_rows * lda;
    pytfm_status st = to_bf16(func, a16, a, a_rows, a_cols, lda, stream);
    if (st == PYTFM_STATUS_OK) st = to_bf16(func, b16, b, b_rows, b_cols, ldb, stream);
    if (st == PYTFM_STATUS_OK)
        st = launch_tc<BF16, uint16_t>(func, c, a16, b16, m, n, k, lda, ldb, trans_a, trans_b,
                                       beta, stream);
    return pytfm__stream_scratch_free(func, scratch, st, stream);
}

/* pytfm_gemm_bf16_cuda's checks: pytfm__check_sgemm's, on BF16 operands */
pytfm_status check_gemm_bf16(const char *func, const float *c, const uint16_t *a,
                             const uint16_t *b, int64_t m, int64_t n, int64_t k, float beta) {
    PYTFM_CHECK(m >= 0 && n >= 0 && k >= 0, "%s: m, n, k must be >= 0, got %lld, %lld, %lld",
                func, (long long)m, (long long)n, (long long)k);
    PYTFM_CHECK(isfinite(beta), "%s: beta must be finite, got %g", func, (double)beta);
    int64_t n_c = 0, n_a = 0, n_b = 0;
    PYTFM_CHECK_COUNT(func, &n_c, float, m, n);
    PYTFM_CHECK_COUNT(func, &n_a, uint16_t, m, k);
    PYTFM_CHECK_COUNT(func, &n_b, uint16_t, k, n);
    PYTFM_CHECK_PTR_IN(func, c, n_c);
    PYTFM_CHECK_PTR_IN(func, a, n_a);
    PYTFM_CHECK_PTR_IN(func, b, n_b);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(c, n_c, float),
                         PYTFM_SPAN(a, n_a, uint16_t), PYTFM_SPAN(b, n_b, uint16_t));
    return PYTFM_STATUS_OK;
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
    const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
    if (precision == PYTFM_PRECISION_TF32)
        return launch_tc<TF32, float>(func, c, a, b, m, n, k, lda, ldb, trans_a != 0,
                                      trans_b != 0, beta, stream);
    if (bf16_convert_first(m, n, k))
        return bf16_converted(func, c, a, b, m, n, k, trans_a != 0, trans_b != 0, beta, stream);
    return launch_tc<BF16, float>(func, c, a, b, m, n, k, lda, ldb, trans_a != 0, trans_b != 0,
                                  beta, stream);
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

extern "C" pytfm_status pytfm_gemm_bf16_cuda(float *c, const uint16_t *a, const uint16_t *b,
                                             int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                             int32_t trans_b, float beta, void *stream) {
    PYTFM_TRY(check_gemm_bf16(__func__, c, a, b, m, n, k, beta));
    if (m == 0 || n == 0) return PYTFM_STATUS_OK;
    return launch_tc<BF16, uint16_t>(__func__, c, a, b, m, n, k, trans_a ? m : k,
                                     trans_b ? k : n, trans_a != 0, trans_b != 0, beta, stream);
}

#ifdef PYTFM_EMULATE
/* for the emulator's tests only: force a route of the bf16 product (bf16_route) */
extern "C" __attribute__((visibility("default"))) void pytfm__emu_sgemm_bf16_route(int route) {
    bf16_route = route;
}
#endif
