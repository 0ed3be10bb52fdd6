/*
 * attention_tc.cu — attention forward and backward on the tensor cores, TF32 or BF16 inputs
 * with FP32 sums: the engine of pytfm_attention_gqa_forward_ex_cuda and _backward_ex_cuda (and
 * of pytfm_attention_forward_ex_cuda and _backward_ex_cuda, the case Hkv = H, window = 0) at
 * those precisions (PYTFM_PRECISION_FP32, and head dims other than 16, 32, 64 and 128, stay on
 * attention.cu's FP32 kernels). Shapes, scale, causality, window and lse as attention.cu:
 *
 *   q, o [B, T, H, D] (row (b, t, h) at ((b·T + t)·H + h)·D), k, v [B, T, Hkv, D] (query head
 *   h reads key/value head h / (H / Hkv)), lse [B, H, T]
 *   S = scale · q kᵀ,  P = softmax(S) (causal: keys s <= t; a window w: also s > t − w),
 *   O = P v,  lse = log Σ_s e^S
 *
 * FlashAttention-2's structure: a block of 4 warps per (batch·head, tile of 64 queries), a
 * warp per 16 query rows; K and V tiles of 64 keys go through shared memory (the tiles below);
 * S = Q·Kᵀ is 8 m16n8 fragments per warp (mma.sync m16n8k8 TF32 or m16n8k16 BF16), scaled by
 * scale·log2 e in FP32 after the product (scores in base 2, exp2f), the online softmax in FP32
 * on the fragments (a row's max and sum over the 4 lanes that hold it):
 *   m' = max(m, max_s S_ts),  l ← l·e^(m−m') + Σ_s e^(S_ts−m'),  O_t ← O_t·e^(m−m') + Σ_s e^(S_ts−m') v_s
 * and P stays in registers: the accumulator fragment of S becomes the A fragment of P·V
 * without a shuffle. BF16: the d layout's pairs (g, 2t..2t+1) of key fragments 2c and 2c + 1
 * are exactly the a layout's pairs of k = 16c..16c + 15. TF32: the a layout wants columns t
 * and t + 4 where a lane holds 2t and 2t + 1, so k = t stands for key 2t and k = t + 4 for key
 * 2t + 1, and V's fragment reads its rows in the same order (a sum over keys does not care
 * which k carries which key). Causal: key tiles past a tile's last query are never loaded;
 * the tiles that cross the diagonal mask the keys past a row's position.
 *
 * Rounding: each input is rounded as it becomes a fragment, TF32 by cvt.rna.tf32.f32 (to
 * nearest, ties away), BF16 by cvt.rn.bf16x2.f32 (to nearest even, subnormals kept): q, k, v;
 * P (and, backward, dy, Pᵀ and dS) likewise. l, m, the scaling and the exponentials are FP32,
 * P's row sum l from the unrounded P. Every product is exact in FP32, every sum FP32 (the bound
 * the tests hold it to: tests/cuda/test_cuda_tc_attention.py).
 *
 * Backward (dy the gradient of O), P recomputed from q, k and lse, no atomics (the same bits on
 * every run):
 *   delta_t = Σ_d r(dy_td)·O_td       (first, into scratch [B, H, T] on the stream; r the
 *                                     precision's rounding, so that delta = Σ_s P_ts dP_ts;
 *                                     attention.cu's delta pass, pytfm__attention_delta_cuda)
 *   dP_ts = dy_t · v_s,  dS_ts = P_ts (dP_ts − delta_t)
 *   dV_s = Σ_t P_ts dy_t,  dK_s = scale · Σ_t dS_ts q_t,  dQ_t = scale · Σ_s dS_ts k_s
 * dK and dV: a block per (batch·key/value head, tile of 64 keys), a warp per 16 keys, walking
 * for each query head of the group the query tiles (from the diagonal when causal, to the last
 * row whose window holds a key of the tile) as one sequence of steps: Sᵀ = K·Qᵀ and
 * dPᵀ = V·dYᵀ as fragments, Pᵀ and dSᵀ made in place and multiplied by dY and Q as P·V is.
 * dQ: a second kernel, a block per query tile walking the key tiles, S and dP again,
 * dQ += dS·K. Nothing goes through shared memory but the four input tiles.
 *
 * Shared tiles (Tile): every operand, the block's fixed one (forward: Q; dK/dV: K, V; dQ: Q,
 * dY) once and each streamed tile (K, V; Q, dY) once, as the fragments read it:
 *  - BF16: [64][D] halves, rounded by cvt.rn.bf16x2.f32 as they are stored (the Rounding
 *    paragraph's r(x), whether applied as a value is stored or as it is read: the fragments
 *    and the bound are the same; each element converted once a block, not once a warp that
 *    reads it, and half the bytes),
 *    XOR-swizzled by 16-byte chunks (pytfm__swz, cuda/mma.cuh) so that the 8 rows of an ldmatrix matrix fall in 8
 *    distinct bank groups: one wavefront a matrix, which the emulator counts
 *    (tests/cuda/test_cuda_tc_attention.py). Fragments by ldmatrix.x4: rows k long (A, and the
 *    B of Q·Kᵀ-shaped scores, whose rows are D long) as they lie; the B of P·V-shaped products,
 *    which runs across the stored rows, with .trans.
 *  - TF32: [64][D + 4] floats, FP32 as they lie, read by 32-bit loads (ldmatrix cannot
 *    transpose 32-bit elements, which P·V needs): the fragment reads (row g, column t) and the
 *    permuted V reads (rows 2t, 2t + 1, column g) fall in 32 distinct banks.
 * Global loads are float4 where the array is 16-byte aligned (D is a multiple of 16, so every
 * row then is), scalar otherwise; rows past T are zero and never read.
 * Double buffering (Tile::PREFETCH): the next streamed tile's global loads are issued before
 * this tile's products into registers (TileRegs, D floats a thread for two tiles), converted
 * and stored into the other buffer after them; one barrier a tile orders it all (the loops
 * say how). Register staging rather than cp.async: cp.async cannot convert, so with FP32 in
 * global memory and BF16 in shared it would need an FP32 staging tile (twice the BF16 tile's
 * bytes, written by the copies and read back by a conversion pass: about 5× the shared-memory
 * wavefronts of storing the converted registers, 80 against 16 per warp and product tile, on
 * kernels bound by shared memory), and 64 KB more shared memory a block; its advantage, no
 * registers held, matters only where the registers run out, and there neither way fits:
 * where the accumulators leave no room for the staged tile within TC_REGS (the forward at
 * D = 128, dQ's at D = 128 and, in TF32, at 64; dK/dV's, with twice the accumulators, past
 * D = 32 in BF16 and 16 in TF32), a pass keeps one buffer and loads the next tile after its
 * products (a barrier before the store), and the SM's other block hides the loads. The
 * forward keeps Q's fragments in registers across the key tiles at D <= 64 (no A reads from
 * shared memory); the dQ and dK/dV passes, two score products a tile, read theirs a k step at
 * a time (holding both would spill).
 * Registers and occupancy (the ptxas report in pytfm/lib/cuda_build.log): at most TC_REGS =
 * 240 registers a thread, no spills on sm_80 and sm_90 (tests/cuda/test_cuda_build_log.py
 * holds both): two blocks (8 warps) an SM; shared memory at D = 64 BF16 40 / 32.5 / 48 KiB
 * (forward / dK/dV / dQ), TF32 85 / 68.5 / 68 KiB (two blocks on sm_90's 227 KiB; on sm_80's
 * 163 one forward block). Nothing depends on T.
 *
 * Decode (pytfm_attention_decode_cuda) stays on attention.cu's FP32 kernel in every precision:
 * one or a few query rows read each cached key and value once for 4 FLOPs per 8 bytes (0.5
 * FLOP/byte), far below the ~14 FLOP/byte where an H200's FP32 CUDA cores (67 TFLOP/s) outrun its
 * memory (4.8 TB/s): it is bound by the cache's bandwidth, which tensor cores do not change (an
 * estimate from those figures; no GPU measured it).
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "mma.cuh"

#include <string.h>

namespace {

enum {
    TC_ROWS = 64,    // queries per block (forward, dQ) and keys per block (dK/dV)
    TC_KEYS = 64,    // keys per tile (forward, dQ) and queries per tile (dK/dV)
    TC_THREADS = 128, // 4 warps, 16 rows each
    TC_FRAGS = TC_KEYS / 8,
    // Registers a thread (PYTFM_MAX_REGS, cuda/mma.cuh): every pass at every head dim fits
    // in 240 without a spill on sm_80 and sm_90 (tests/cuda/test_cuda_build_log.py holds
    // both), two blocks an SM (2 · 128 threads · 240 <= 64 K), and 15 of the 255 a thread can
    // have are left: a change that needs more spills here first, with room to raise this.
    TC_REGS = 240,
};
static_assert(TC_ROWS == TC_KEYS, "one tile shape for the fixed and the streamed operands");

constexpr float TC_LOG2E = 1.4426950408889634f, TC_LN2 = 0.6931471805599453f;

enum Prec { TF32, BF16 };

/* The shape of one shared tile of 64 rows of D: TF32 [64][D + 4] floats (FP32 as the rows lie,
 * padded: the 32-bit fragment reads of the opening comment fall in 32 distinct banks); BF16
 * [64][D] halves, rounded once as stored, XOR-swizzled by pytfm__swz for ldmatrix. WORDS: its
 * 32-bit words (a multiple of 4: every tile starts 16-byte aligned). KS: the mma k steps over
 * D (m16n8k8: D / 8; m16n8k16: D / 16). PREFETCH: whether the next tile's global loads are
 * issued before this tile's products (register-staged double buffering, D floats a thread for
 * two tiles); at D = 128 that would be 128 registers more than the accumulators leave, so the
 * loads go after the products there (the other blocks of the SM hide them). */
template <Prec P, int D> struct Tile {
    static constexpr int LD = D + 4;
    static constexpr int WORDS = P == TF32 ? TC_KEYS * LD : TC_KEYS * D / 2;
    static constexpr int KS = P == TF32 ? D / 8 : D / 16;
    static constexpr bool PREFETCH = D <= 64;
    // the dK/dV pass: its dK and dV accumulators (D floats a thread) and two score blocks (64)
    // leave no room for two staged tiles (D floats more) past D = 32
    static constexpr bool PREFETCH_DKDV = P == BF16 ? D <= 32 : D <= 16;
    // the dQ pass: its two score blocks (64), dQ (D / 2) and two staged tiles (D) fit in
    // TC_REGS at D = 64 in BF16, whose fragment loads (ldmatrix) hold fewer registers than
    // TF32's 32-bit ones; TF32 prefetches to D = 32
    static constexpr bool PREFETCH_DQ = P == BF16 ? D <= 64 : D <= 32;
    static_assert(WORDS % 4 == 0, "16-byte aligned tiles");
};

/* the address of logical chunk c (halves 8c .. 8c + 7) of row r of a BF16 tile */
template <int D>
static __device__ __forceinline__ const uint16_t *tc_chunk(const uint32_t *tile, int r, int c) {
    return (const uint16_t *)tile + r * D + pytfm__swz<D / 8>(r, c) * 8;
}

/* One tile's rows [0, 64) in registers on their way to shared memory: row r is src + r·stride
 * (r < n), zero past n; each thread D / 8 chunks of 4 floats (chunk e = threadIdx.x + 128i:
 * row e / (D / 4), column e % (D / 4) · 4, so a warp covers 2-8 whole rows). load reads global
 * memory (vec: src 16-byte aligned, and then every row is: D % 16 == 0; else scalar loads);
 * store writes the tile: TF32 as FP32, BF16 rounded by cvt.rn.bf16x2.f32 (the rounding the
 * fragments of an FP32 tile would get) into its swizzled chunk, 8 bytes a thread: a warp's
 * stores cover 256 contiguous bytes, a permutation of them (2 wavefronts, the least). */
template <Prec P, int D> struct TileRegs {
    static constexpr int N = TC_KEYS * D / 4 / TC_THREADS;
    float4 x[N];

    /* chunk i of this thread from global memory */
    static __device__ __forceinline__ float4 fetch(int i, const float *src, int64_t stride,
                                                   int n, bool vec) {
        const int e = threadIdx.x + i * TC_THREADS, r = e / (D / 4), d = e % (D / 4) * 4;
        if (r >= n) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float *p = src + r * stride + d;
        return vec ? pytfm__load4(p) : make_float4(p[0], p[1], p[2], p[3]);
    }

    /* chunk i of this thread into the tile */
    static __device__ __forceinline__ void put(uint32_t *tile, int i, float4 v) {
        const int e = threadIdx.x + i * TC_THREADS, r = e / (D / 4), d = e % (D / 4) * 4;
        if (P == TF32) {
            pytfm__store4((float *)tile + r * Tile<P, D>::LD + d, v);
        } else {
            const int half = r * D + pytfm__swz<D / 8>(r, d / 8) * 8 + d % 8;
            pytfm__store2(tile + half / 2, pytfm__bf16x2(v.x, v.y), pytfm__bf16x2(v.z, v.w));
        }
    }

    __device__ __forceinline__ void load(const float *src, int64_t stride, int n, bool vec) {
        PYTFM_UNROLL
        for (int i = 0; i < N; i++) x[i] = fetch(i, src, stride, n, vec);
    }

    __device__ __forceinline__ void store(uint32_t *tile) const {
        PYTFM_UNROLL
        for (int i = 0; i < N; i++) put(tile, i, x[i]);
    }
};

/* a whole tile straight into shared memory, 4 chunks at a time (not the whole tile in
 * registers, which the unrolled loop would let the compiler batch) */
template <Prec P, int D>
static __device__ __forceinline__ void tc_load(uint32_t *tile, const float *src, int64_t stride,
                                               int n, bool vec) {
    PYTFM_UNROLL4
    for (int i = 0; i < TileRegs<P, D>::N; i++)
        TileRegs<P, D>::put(tile, i, TileRegs<P, D>::fetch(i, src, stride, n, vec));
}

/* The A fragment of rows r0 .. r0 + 15 of a tile at k step ks: TF32 by 32-bit reads (rounded
 * by cvt.rna.tf32.f32), BF16 by ldmatrix.x4 (matrices (r0, 2ks), (r0 + 8, 2ks), (r0, 2ks + 1),
 * (r0 + 8, 2ks + 1) in chunks: the a layout's registers in order). */
template <Prec P, int D>
static __device__ __forceinline__ void tc_frag_a(uint32_t (&a)[4], const uint32_t *tile, int r0,
                                                 int ks, int lane) {
    const int g = lane / 4, t = lane % 4, q = lane / 8, i8 = lane % 8;
    if (P == TF32) {
        constexpr int LD = Tile<P, D>::LD;
        const float *A = (const float *)tile + r0 * LD + 8 * ks;
        a[0] = pytfm__tf32(A[g * LD + t]);
        a[1] = pytfm__tf32(A[(g + 8) * LD + t]);
        a[2] = pytfm__tf32(A[g * LD + t + 4]);
        a[3] = pytfm__tf32(A[(g + 8) * LD + t + 4]);
    } else {
        pytfm__ldmatrix<4, false>(a, tc_chunk<D>(tile, r0 + i8 + 8 * (q % 2), 2 * ks + q / 2));
    }
}

/* every k step's A fragments of rows r0 .. r0 + 15 (to hold them across the tiles) */
template <Prec P, int D>
static __device__ __forceinline__ void tc_rows(uint32_t (&a)[Tile<P, D>::KS][4],
                                               const uint32_t *tile, int r0, int lane) {
    PYTFM_UNROLL
    for (int ks = 0; ks < Tile<P, D>::KS; ks++) tc_frag_a<P, D>(a[ks], tile, r0, ks, lane);
}

/* s[j] = A·Bᵀ for the warp's 16 rows r0 .. r0 + 15 of the tile At and rows 8j .. 8j + 7 of the
 * tile Bm (j < TC_FRAGS): the m16n8 fragments of a 16 × 64 block of scores, summed over d < D.
 * HELD: A's fragments are a (from tc_rows), else read from At a k step at a time. BF16's B
 * fragments by ldmatrix.x4, two key fragments a load (matrices: keys 16p .. 16p + 7 at chunks
 * 2ks, 2ks + 1, then keys 16p + 8 .. 16p + 15). */
template <Prec P, int D, bool HELD>
static __device__ __forceinline__ void tc_scores(float (&s)[TC_FRAGS][4],
                                                 const uint32_t (&a)[Tile<P, D>::KS][4],
                                                 const uint32_t *At, int r0, const uint32_t *Bm,
                                                 int lane) {
    const int g = lane / 4, t = lane % 4, q = lane / 8, i8 = lane % 8;
    PYTFM_UNROLL
    for (int j = 0; j < TC_FRAGS; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    PYTFM_UNROLL
    for (int ks = 0; ks < Tile<P, D>::KS; ks++) {
        uint32_t ak[4];
        if (HELD) {
            PYTFM_UNROLL
            for (int w = 0; w < 4; w++) ak[w] = a[ks][w];
        } else {
            tc_frag_a<P, D>(ak, At, r0, ks, lane);
        }
        if (P == TF32) {
            PYTFM_UNROLL
            for (int j = 0; j < TC_FRAGS; j++) {
                const float *row = (const float *)Bm + (8 * j + g) * Tile<P, D>::LD + 8 * ks;
                const uint32_t b[2] = {pytfm__tf32(row[t]), pytfm__tf32(row[t + 4])};
                pytfm__mma_tf32(s[j], ak, b);
            }
        } else {
            PYTFM_UNROLL
            for (int p = 0; p < TC_FRAGS / 2; p++) {
                uint32_t r4[4];
                pytfm__ldmatrix<4, false>(r4, tc_chunk<D>(Bm, 16 * p + i8 + 8 * (q / 2),
                                                           2 * ks + q % 2));
                const uint32_t b0[2] = {r4[0], r4[1]}, b1[2] = {r4[2], r4[3]};
                pytfm__mma_bf16(s[2 * p], ak, b0);
                pytfm__mma_bf16(s[2 * p + 1], ak, b1);
            }
        }
    }
}

/* R's A fragments in BF16 (the a layout's pairs of k = 16c .. 16c + 15, the opening
 * comment's order), rounded by cvt.rn.bf16x2.f32: half the registers of R in FP32 */
static __device__ __forceinline__ void tc_pack_bf16(uint32_t (&pa)[TC_FRAGS / 2][4],
                                                    const float (&s)[TC_FRAGS][4]) {
    PYTFM_UNROLL
    for (int c = 0; c < TC_FRAGS / 2; c++) {
        pa[c][0] = pytfm__bf16x2(s[2 * c][0], s[2 * c][1]);
        pa[c][1] = pytfm__bf16x2(s[2 * c][2], s[2 * c][3]);
        pa[c][2] = pytfm__bf16x2(s[2 * c + 1][0], s[2 * c + 1][1]);
        pa[c][3] = pytfm__bf16x2(s[2 * c + 1][2], s[2 * c + 1][3]);
    }
}

/* acc[n] += R·X in BF16, R as tc_pack_bf16 packed it: tc_accumulate's BF16 way, whose B
 * fragments run across X's rows, by ldmatrix.x4.trans, two column fragments a load (matrices:
 * rows 16c .. 16c + 7 and 16c + 8 .. 16c + 15 at chunk 2p, then at chunk 2p + 1) */
template <int D>
static __device__ __forceinline__ void tc_accumulate_bf16(float (&acc)[D / 8][4],
                                                          const uint32_t (&pa)[TC_FRAGS / 2][4],
                                                          const uint32_t *X, int lane) {
    const int q = lane / 8, i8 = lane % 8;
    PYTFM_UNROLL
    for (int c = 0; c < TC_FRAGS / 2; c++) {
        PYTFM_UNROLL
        for (int p = 0; p < D / 16; p++) {
            uint32_t r4[4];
            pytfm__ldmatrix<4, true>(r4, tc_chunk<D>(X, 16 * c + i8 + 8 * (q % 2), 2 * p + q / 2));
            const uint32_t b0[2] = {r4[0], r4[1]};
            pytfm__mma_bf16(acc[2 * p], pa[c], b0);
            const uint32_t b1[2] = {r4[2], r4[3]};
            pytfm__mma_bf16(acc[2 * p + 1], pa[c], b1);
        }
    }
}

/* acc[n] += R·X: R the 16 × 64 block held as s's fragments (columns 8j + 2t, 8j + 2t + 1 of
 * rows g and g + 8), X a tile of 64 rows, acc the m16n8 fragments of the 16 × D result
 * (columns 8n .. 8n + 7). R goes from the accumulator layout into the A layout in registers
 * (see the opening comment for the order of k); BF16 by tc_pack_bf16 and tc_accumulate_bf16. */
template <Prec P, int D>
static __device__ __forceinline__ void tc_accumulate(float (&acc)[D / 8][4],
                                                     const float (&s)[TC_FRAGS][4],
                                                     const uint32_t *X, int lane) {
    const int g = lane / 4, t = lane % 4;
    if (P == TF32) {
        constexpr int LD = Tile<P, D>::LD;
        PYTFM_UNROLL
        for (int j = 0; j < TC_FRAGS; j++) {
            // k = t is column 2t, k = t + 4 column 2t + 1
            const uint32_t a[4] = {pytfm__tf32(s[j][0]), pytfm__tf32(s[j][2]),
                                   pytfm__tf32(s[j][1]), pytfm__tf32(s[j][3])};
            const float *x0 = (const float *)X + (8 * j + 2 * t) * LD, *x1 = x0 + LD;
            PYTFM_UNROLL
            for (int n = 0; n < D / 8; n++) {
                const uint32_t b[2] = {pytfm__tf32(x0[8 * n + g]), pytfm__tf32(x1[8 * n + g])};
                pytfm__mma_tf32(acc[n], a, b);
            }
        }
    } else {
        uint32_t pa[TC_FRAGS / 2][4];
        tc_pack_bf16(pa, s);
        tc_accumulate_bf16<D>(acc, pa, X, lane);
    }
}

/* the max and sum of a row over the 4 lanes of a quad that hold it */
static __device__ __forceinline__ float tc_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

static __device__ __forceinline__ float tc_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* Rows g and g + 8 of the 16 × D fragments acc, times mul[0] and mul[1], to rows row0 and
 * row0 + 8 (< rows) of an output with row stride HD */
template <int D>
static __device__ __forceinline__ void tc_store(float *out, const float (&acc)[D / 8][4],
                                                const float mul[2], int64_t row0, int64_t rows,
                                                int64_t HD, int t) {
    PYTFM_UNROLL
    for (int half = 0; half < 2; half++) {
        const int64_t r = row0 + 8 * half;
        if (r >= rows) continue;
        float *o = out + r * HD + 2 * t;
        PYTFM_UNROLL
        for (int n = 0; n < D / 8; n++) {
            o[8 * n] = acc[n][2 * half] * mul[half];
            o[8 * n + 1] = acc[n][2 * half + 1] * mul[half];
        }
    }
}

/* The streamed tiles' buffers: two (double buffering) where the next tile is prefetched, one
 * otherwise; and the buffer the tile after buffer b's goes to */
template <bool PF> struct Buffers {
    static constexpr int N = PF ? 2 : 1;
    static __device__ __forceinline__ int next(int b) { return PF ? b ^ 1 : 0; }
};

// ---- forward -------------------------------------------------------------------------------

struct tc_forward_args {
    float *o, *lse;
    const float *q, *k, *v; // q, o [B, T, H, D]; k, v [B, T, Hkv, D]
    int64_t T, H, Hkv;
    int64_t window; // 0, or row t sees keys > t − window only (causal)
    float scale2;   // scale · log2 e
    int causal;
};

/* the first key row t sees: t − window + 1 with a window, else 0 */
static __device__ __forceinline__ int64_t tc_first_key(int64_t window, int64_t t) {
    return window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
}

/* a difference of positions clamped to ±TC_FAR: past that, no tile's key is near the row */
enum { TC_FAR = 1 << 30 };
static __device__ __forceinline__ int tc_clamp(int64_t x) {
    return x < -TC_FAR ? -TC_FAR : x > TC_FAR ? TC_FAR : (int)x;
}

/* Q, then K's and V's buffers */
template <Prec P, int D> constexpr size_t tc_forward_shared() {
    return sizeof(uint32_t) * (size_t)(1 + 2 * Buffers<Tile<P, D>::PREFETCH>::N) *
           Tile<P, D>::WORDS;
}

template <Prec P, int D>
static __global__ void PYTFM_MAX_REGS(TC_THREADS, TC_REGS) tc_forward_kernel(tc_forward_args a) {
    using TL = Tile<P, D>;
    constexpr bool PF = TL::PREFETCH;
    constexpr int W = TL::WORDS;
    PYTFM_DYNAMIC_SHARED(float4, smem);
    uint32_t *Qs = (uint32_t *)smem, *Ks = Qs + W, *Vs = Ks + Buffers<PF>::N * W;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t T = a.T, H = a.H, HD = H * D, b = blockIdx.x / H, h = blockIdx.x % H;
    const int64_t KD = a.Hkv * D; // k and v rows: h's key/value head h / (H / Hkv)
    // the last query tiles see the most keys when causal: they go first (no long tail)
    const int64_t i0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * TC_ROWS;
    const int nq = (int)PYTFM_MIN((int64_t)TC_ROWS, T - i0);
    const int64_t base = (b * T * H + h) * D; // (b, 0, h, 0)
    const int64_t j_end = a.causal ? i0 + nq : T, j_begin = tc_first_key(a.window, i0);
    const bool vk = pytfm__aligned4(a.k), vv = pytfm__aligned4(a.v);
    // k, v: h's key/value head from the first key of the tile's first row on
    const int64_t kv = (b * T * a.Hkv + h / (H / a.Hkv)) * D + j_begin * KD;
    const float *k = a.k + kv, *v = a.v + kv;
    tc_load<P, D>(Qs, a.q + base + i0 * HD, HD, nq, pytfm__aligned4(a.q));
    tc_load<P, D>(Ks, k, KD, (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - j_begin), vk);
    tc_load<P, D>(Vs, v, KD, (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - j_begin), vv);
    TileRegs<P, D> kx, vx; // PF: the next K and V tiles on their way in
    __syncthreads(); // Q and the first K and V tiles are whole
    uint32_t qa[TL::KS][4]; // Q's fragments: across the key tiles where registers allow (PF)
    if (PF) tc_rows<P, D>(qa, Qs, 16 * warp, lane);
    const int64_t row0 = i0 + 16 * warp + g; // this thread's rows: row0 and row0 + 8
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[D / 8][4] = {};
    int buf = 0;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += TC_KEYS, buf = Buffers<PF>::next(buf)) {
        const int nk = (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - j0);
        const int64_t jn = j0 + TC_KEYS; // the next tile: nn keys, none if nn <= 0
        const int nn = (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - jn);
        if (PF && nn > 0) { // its global loads in flight under this tile's products
            kx.load(k + (jn - j_begin) * KD, KD, nn, vk);
            vx.load(v + (jn - j_begin) * KD, KD, nn, vv);
        }
        float s[TC_FRAGS][4];
        tc_scores<P, D, PF>(s, qa, Qs, 16 * warp, Ks + buf * W, lane);
        // keys past the tile's end, past a row's position, or before its window, do not count
        const bool edge = nk < TC_KEYS || (a.causal && j0 + TC_KEYS - 1 > i0) ||
                          (a.window > 0 && j0 < i0 + TC_ROWS - a.window);
        // key j0 + c is seen by row row0 + d (d = 0, 8) when lo <= d − c < hi: 32-bit bounds
        // (|d − c| < 64), as 64-bit ones per element would cost registers here
        const int lo = a.causal ? tc_clamp(j0 - row0) : -TC_FAR;
        const int hi = a.window > 0 ? tc_clamp(j0 - row0 + a.window) : TC_FAR;
        float mx[2] = {m[0], m[1]};
        PYTFM_UNROLL
        for (int j = 0; j < TC_FRAGS; j++)
            PYTFM_UNROLL
            for (int e = 0; e < 4; e++) {
                const int c = 8 * j + 2 * t + (e & 1), dc = 8 * (e >> 1) - c;
                float x = s[j][e] * a.scale2;
                if (edge && (c >= nk || dc < lo || dc >= hi)) x = -INFINITY;
                s[j][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float sum[2] = {0.0f, 0.0f}, alpha[2];
        PYTFM_UNROLL
        for (int r = 0; r < 2; r++) {
            mx[r] = tc_quad_max(mx[r]);
            const float at = mx[r] == -INFINITY ? 0.0f : mx[r]; // no key yet: every p is 0
            alpha[r] = exp2f(m[r] - at);                         // 0 on a row's first keys
            m[r] = mx[r];
            mx[r] = at;
        }
        PYTFM_UNROLL
        for (int j = 0; j < TC_FRAGS; j++)
            PYTFM_UNROLL
            for (int e = 0; e < 4; e++) {
                s[j][e] = exp2f(s[j][e] - mx[e >> 1]);
                sum[e >> 1] += s[j][e];
            }
        PYTFM_UNROLL
        for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + tc_quad_sum(sum[r]);
        PYTFM_UNROLL
        for (int n = 0; n < D / 8; n++) {
            acc[n][0] *= alpha[0];
            acc[n][1] *= alpha[0];
            acc[n][2] *= alpha[1];
            acc[n][3] *= alpha[1];
        }
        tc_accumulate<P, D>(acc, s, Vs + buf * W, lane);
        if (nn > 0 && PF) {
            kx.store(Ks + Buffers<PF>::next(buf) * W);
            vx.store(Vs + Buffers<PF>::next(buf) * W);
        } else if (nn > 0) {
            __syncthreads(); // one buffer: every warp is done with this tile's K and V
            tc_load<P, D>(Ks, k + (jn - j_begin) * KD, KD, nn, vk);
            tc_load<P, D>(Vs, v + (jn - j_begin) * KD, KD, nn, vv);
        }
        // the next K and V tiles are whole, and every warp is done with these (PF: the tile
        // after next is stored over them)
        __syncthreads();
    }
    const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
    tc_store<D>(a.o + base, acc, inv, row0, T, HD, t);
    if (t == 0) {
        float *lse = a.lse + (b * H + h) * T;
        PYTFM_UNROLL
        for (int r = 0; r < 2; r++)
            if (row0 + 8 * r < T)
                lse[row0 + 8 * r] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * TC_LN2 : -INFINITY;
    }
}

// ---- backward ------------------------------------------------------------------------------

struct tc_backward_args {
    float *dq, *dk, *dv;                       // dq like q; dk, dv like k [B, T, Hkv, D]
    const float *dy, *q, *k, *v, *lse, *delta; // delta [B, H, T]: pytfm__attention_delta_cuda
    int64_t T, H, Hkv;
    float scale, scale2; // scale, and scale · log2 e
    int causal;
    int window; // 0, or min(window, T) (as wide in effect): row t sees keys > t − window only
    int group;  // H / Hkv: the query heads of a key/value head
};

/* dK/dV: K and V, then Q's and dY's buffers, then the query tiles' lse · log2 e and delta
 * (64 floats each a buffer); dQ: Q and dY, then K's and V's buffers */
template <Prec P, int D> constexpr size_t tc_dkdv_shared() {
    constexpr int NB = Buffers<Tile<P, D>::PREFETCH_DKDV>::N;
    return sizeof(uint32_t) * ((size_t)(2 + 2 * NB) * Tile<P, D>::WORDS + 2 * NB * TC_KEYS);
}
template <Prec P, int D> constexpr size_t tc_dq_shared() {
    return sizeof(uint32_t) * (size_t)(2 + 2 * Buffers<Tile<P, D>::PREFETCH_DQ>::N) *
           Tile<P, D>::WORDS;
}

/* dK and dV of a tile of 64 keys (a warp's 16 rows) of key/value head gk, walking for each
 * query head of gk's group in turn the query tiles (columns) that see them, the next tile
 * prefetched across a change of head too (PF): Sᵀ = K·Qᵀ, dPᵀ = V·dYᵀ, then dV += Pᵀ·dY and
 * dK += dSᵀ·Q from the registers. GROUPED: any Hkv dividing H and any window. Without it
 * Hkv = H and no window are compile-time facts: one head, no window pass, and the registers
 * the group's walk holds stay with the accumulators, which take all but a few of the 255 at
 * D = 128 (the launcher picks this instance for the plain case). */
template <Prec P, int D, bool GROUPED>
static __global__ void PYTFM_MAX_REGS(TC_THREADS, TC_REGS) tc_dkdv_kernel(tc_backward_args a) {
    using TL = Tile<P, D>;
    constexpr bool PF = Tile<P, D>::PREFETCH_DKDV;
    constexpr int W = TL::WORDS, NB = Buffers<PF>::N;
    PYTFM_DYNAMIC_SHARED(float4, smem);
    uint32_t *Ks = (uint32_t *)smem, *Vs = Ks + W, *Qs = Vs + W, *dYs = Qs + NB * W;
    float *lse2 = (float *)(dYs + NB * W), *dlt = lse2 + NB * TC_KEYS;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t T = a.T, H = a.H, HD = H * D, Hkv = GROUPED ? a.Hkv : H, KD = Hkv * D;
    const int G = GROUPED ? a.group : 1; // query heads a key/value head serves
    const int64_t b = blockIdx.x / Hkv, gk = blockIdx.x % Hkv;
    const int64_t j0 = (int64_t)blockIdx.y * TC_ROWS, kbase = (b * T * Hkv + gk) * D;
    const int nk = (int)PYTFM_MIN((int64_t)TC_ROWS, T - j0);
    const bool vq = pytfm__aligned4(a.q), vdy = pytfm__aligned4(a.dy);
    tc_load<P, D>(Ks, a.k + kbase + j0 * KD, KD, nk, pytfm__aligned4(a.k));
    tc_load<P, D>(Vs, a.v + kbase + j0 * KD, KD, nk, pytfm__aligned4(a.v));
    // query head gk·G + hq of the group: its q and dy rows at base + hq·D, lse and delta at
    // bhT + hq·T
    const int64_t base = (b * T * H + gk * G) * D, bhT = (b * H + gk * G) * T;
    // int positions: T < 2^22 (tc_check_grid), and 64-bit ones would cost registers here.
    // The query rows that see these keys: causal, none before j0 (64 rows per tile both
    // ways); a window w (causal), none from j0 + nk − 1 + w on (w past T is no window)
    const int window = GROUPED ? a.window : 0;
    const int i_first = a.causal ? (int)j0 : 0;
    const int i_end = window > 0 ? (int)PYTFM_MIN(T, j0 + nk - 1 + window) : (int)T;
    // the next query tile on its way in: Q, dY, and (threads < 64) one row's lse and delta
    TileRegs<P, D> qx, yx;
    float lz = 0.0f, dz = 0.0f;
    auto load = [&](int hq, int64_t i) {
        const int64_t at = base + hq * D + i * HD, lt = bhT + hq * T + i;
        const int n = (int)PYTFM_MIN((int64_t)TC_KEYS, T - i);
        qx.load(a.q + at, HD, n, vq);
        yx.load(a.dy + at, HD, n, vdy);
        const int r = threadIdx.x;
        if (r < TC_KEYS) {
            lz = r < n ? a.lse[lt + r] * TC_LOG2E : 0.0f;
            dz = r < n ? a.delta[lt + r] : 0.0f;
        }
    };
    auto store = [&](int to) {
        qx.store(Qs + to * W);
        yx.store(dYs + to * W);
        if (threadIdx.x < TC_KEYS) {
            lse2[to * TC_KEYS + threadIdx.x] = lz;
            dlt[to * TC_KEYS + threadIdx.x] = dz;
        }
    };
    auto fill = [&](int hq, int64_t i) { // head hq's query tile i straight into buffer 0
        const int64_t at = base + hq * D + i * HD, lt = bhT + hq * T + i;
        const int n = (int)PYTFM_MIN((int64_t)TC_KEYS, T - i), r = threadIdx.x;
        tc_load<P, D>(Qs, a.q + at, HD, n, vq);
        tc_load<P, D>(dYs, a.dy + at, HD, n, vdy);
        if (r < TC_KEYS) {
            lse2[r] = r < n ? a.lse[lt + r] * TC_LOG2E : 0.0f;
            dlt[r] = r < n ? a.delta[lt + r] : 0.0f;
        }
    };
    fill(0, i_first);
    __syncthreads(); // K, V and the first query tile are whole
    const int key0 = (int)j0 + 16 * warp + g; // this thread's keys: key0 and key0 + 8 (T < 2^22)
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    int buf = 0;
    // the walk: head hq's query tile at row i0; next this head's next tile, else the next
    // head's first, while there is one
    for (int hq = 0, i0 = i_first;; buf = Buffers<PF>::next(buf)) {
        int hn = hq, in = i0 + TC_KEYS;
        if (GROUPED && in >= i_end) hn++, in = i_first;
        const bool more = GROUPED ? hn < G : in < i_end;
        if (PF && more) load(hn, in);
        const uint32_t *Q = Qs + buf * W, *dY = dYs + buf * W;
        const float *l2 = lse2 + buf * TC_KEYS, *dl = dlt + buf * TC_KEYS;
        const int lag = key0 - i0; // causal: key0 + 8r is seen by columns c >= lag + 8r
        float p[TC_FRAGS][4], ds[TC_FRAGS][4];
        uint32_t none[TL::KS][4]; // K's and V's fragments are read a k step at a time
        tc_scores<P, D, false>(p, none, Ks, 16 * warp, Q, lane);   // Sᵀ: keys × queries
        tc_scores<P, D, false>(ds, none, Vs, 16 * warp, dY, lane); // dPᵀ
        PYTFM_UNROLL
        for (int j = 0; j < TC_FRAGS; j++)
            PYTFM_UNROLL
            for (int e = 0; e < 4; e++) {
                const int c = 8 * j + 2 * t + (e & 1), dc = c - 8 * (e >> 1);
                // no c < nq test: a column past nq has zero q, dy, lse and delta, so p
                // there multiplies a zero row of dY and its dS (p · (0 − 0)) is 0
                const bool seen = !a.causal || lag <= dc;
                p[j][e] = seen ? exp2f(p[j][e] * a.scale2 - l2[c]) : 0.0f;
                ds[j][e] = p[j][e] * (ds[j][e] - dl[c]);
            }
        // a window: key0 + 8r is seen by the columns c < lag + 8r + window only (the row
        // i0 + c > key0 + 8r − window). A pass of its own, over the tiles that reach past the
        // window of the block's first key only: a second bound in the loop above makes ptxas
        // spill (sm_80, D = 128 BF16 and TF32)
        if (window > 0 && i0 + TC_KEYS - 1 >= (int)j0 + window) {
            const int hi = lag + window;
            PYTFM_UNROLL
            for (int j = 0; j < TC_FRAGS; j++)
                PYTFM_UNROLL
                for (int e = 0; e < 4; e++) {
                    if (8 * j + 2 * t + (e & 1) - 8 * (e >> 1) < hi) continue;
                    p[j][e] = 0.0f;
                    ds[j][e] = 0.0f;
                }
        }
        if (P == BF16) { // Pᵀ and dSᵀ packed before both products: 32 registers, not 64
            uint32_t pp[TC_FRAGS / 2][4], pds[TC_FRAGS / 2][4];
            tc_pack_bf16(pp, p);
            tc_pack_bf16(pds, ds);
            tc_accumulate_bf16<D>(dv, pp, dY, lane); // dV += Pᵀ·dY
            tc_accumulate_bf16<D>(dk, pds, Q, lane); // dK += dSᵀ·Q
        } else {
            tc_accumulate<P, D>(dv, p, dY, lane);
            tc_accumulate<P, D>(dk, ds, Q, lane);
        }
        if (more && PF) {
            store(Buffers<PF>::next(buf));
        } else if (more) {
            __syncthreads(); // one buffer: every warp is done with this query tile
            fill(hn, in);
        }
        // the next query tile is whole, and every warp is done with this one (PF: the tile
        // after next is stored over it)
        __syncthreads();
        if (!more) break;
        hq = hn, i0 = in;
    }
    const float scale[2] = {a.scale, a.scale}, one[2] = {1.0f, 1.0f};
    tc_store<D>(a.dk + kbase, dk, scale, key0, T, KD, t);
    tc_store<D>(a.dv + kbase, dv, one, key0, T, KD, t);
}

/* dQ of a tile of 64 queries (a warp's 16 rows), walking the key tiles up to the diagonal when
 * causal: S = Q·Kᵀ, dP = dY·Vᵀ, dS in registers, dQ += dS·K. */
template <Prec P, int D>
static __global__ void PYTFM_MAX_REGS(TC_THREADS, TC_REGS) tc_dq_kernel(tc_backward_args a) {
    using TL = Tile<P, D>;
    constexpr bool PF = TL::PREFETCH_DQ;
    constexpr int W = TL::WORDS, NB = Buffers<PF>::N;
    PYTFM_DYNAMIC_SHARED(float4, smem);
    uint32_t *Qs = (uint32_t *)smem, *dYs = Qs + W, *Ks = dYs + W, *Vs = Ks + NB * W;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t T = a.T, H = a.H, HD = H * D, b = blockIdx.x / H, h = blockIdx.x % H;
    const int64_t KD = a.Hkv * D; // k and v rows: h's key/value head h / (H / Hkv)
    // the last query tiles walk the most keys when causal: they go first
    const int64_t i0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * TC_ROWS, base = (b * T * H + h) * D;
    const int nq = (int)PYTFM_MIN((int64_t)TC_ROWS, T - i0);
    const bool vk = pytfm__aligned4(a.k), vv = pytfm__aligned4(a.v);
    const int64_t j_end = a.causal ? i0 + nq : T, j_begin = tc_first_key(a.window, i0);
    // k, v: h's key/value head from the first key of the tile's first row on
    const int64_t kv = (b * T * a.Hkv + h / (H / a.Hkv)) * D + j_begin * KD;
    const float *k = a.k + kv, *v = a.v + kv;
    tc_load<P, D>(Qs, a.q + base + i0 * HD, HD, nq, pytfm__aligned4(a.q));
    tc_load<P, D>(dYs, a.dy + base + i0 * HD, HD, nq, pytfm__aligned4(a.dy));
    tc_load<P, D>(Ks, k, KD, (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - j_begin), vk);
    tc_load<P, D>(Vs, v, KD, (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - j_begin), vv);
    TileRegs<P, D> kx, vx; // PF: the next K and V tiles on their way in
    __syncthreads(); // Q, dY and the first K and V tiles are whole
    uint32_t none[TL::KS][4]; // Q's and dY's fragments are read a k step at a time: no room
    const int64_t row0 = i0 + 16 * warp + g;
    float lse2[2], dlt[2], dq[D / 8][4] = {};
    PYTFM_UNROLL
    for (int r = 0; r < 2; r++) {
        const int64_t row = row0 + 8 * r;
        lse2[r] = row < T ? a.lse[(b * H + h) * T + row] * TC_LOG2E : 0.0f;
        dlt[r] = row < T ? a.delta[(b * H + h) * T + row] : 0.0f;
    }
    int buf = 0;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += TC_KEYS, buf = Buffers<PF>::next(buf)) {
        const int nk = (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - j0);
        const int64_t jn = j0 + TC_KEYS; // the next tile: nn keys, none if nn <= 0
        const int nn = (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - jn);
        if (PF && nn > 0) {
            kx.load(k + (jn - j_begin) * KD, KD, nn, vk);
            vx.load(v + (jn - j_begin) * KD, KD, nn, vv);
        }
        const uint32_t *K = Ks + buf * W, *V = Vs + buf * W;
        float s[TC_FRAGS][4], ds[TC_FRAGS][4];
        tc_scores<P, D, false>(s, none, Qs, 16 * warp, K, lane);
        tc_scores<P, D, false>(ds, none, dYs, 16 * warp, V, lane); // dP
        // key j0 + c is seen by row row0 + 8r when lo <= 8r − c < hi: the forward's 32-bit
        // bounds, as 64-bit positions per element do not fit in TC_REGS at D = 64
        const int lo = a.causal ? tc_clamp(j0 - row0) : -TC_FAR;
        const int hi = a.window > 0 ? tc_clamp(j0 - row0 + a.window) : TC_FAR;
        PYTFM_UNROLL
        for (int j = 0; j < TC_FRAGS; j++)
            PYTFM_UNROLL
            for (int e = 0; e < 4; e++) {
                const int c = 8 * j + 2 * t + (e & 1), r = e >> 1, dc = 8 * r - c;
                const bool seen = c < nk && lo <= dc && dc < hi;
                const float pv = seen ? exp2f(s[j][e] * a.scale2 - lse2[r]) : 0.0f;
                ds[j][e] = pv * (ds[j][e] - dlt[r]);
            }
        tc_accumulate<P, D>(dq, ds, K, lane);
        if (nn > 0 && PF) {
            kx.store(Ks + Buffers<PF>::next(buf) * W);
            vx.store(Vs + Buffers<PF>::next(buf) * W);
        } else if (nn > 0) {
            __syncthreads(); // one buffer: every warp is done with this key tile
            tc_load<P, D>(Ks, k + (jn - j_begin) * KD, KD, nn, vk);
            tc_load<P, D>(Vs, v + (jn - j_begin) * KD, KD, nn, vv);
        }
        // the next key tile is whole, and every warp is done with this one (PF: the tile
        // after next is stored over it)
        __syncthreads();
    }
    const float scale[2] = {a.scale, a.scale};
    tc_store<D>(a.dq + base, dq, scale, row0, T, HD, t);
}

// ---- launchers -----------------------------------------------------------------------------

/* the head dims the tensor-core kernels take (others run attention.cu's FP32 kernels) */
bool tc_head_dim(int64_t D) { return D == 16 || D == 32 || D == 64 || D == 128; }

pytfm_status tc_check_head_dim(const char *func, int64_t D) {
    PYTFM_CHECK(D <= PYTFM_CUDA_ATTENTION_MAX_D,
                "%s: D must be <= %d (PYTFM_CUDA_ATTENTION_MAX_D, the largest head dim the GPU "
                "kernels take), got %lld",
                func, PYTFM_CUDA_ATTENTION_MAX_D, (long long)D);
    return PYTFM_STATUS_OK;
}

pytfm_status tc_check_grid(const char *func, int64_t BH, int64_t T) {
    PYTFM_CHECK(BH <= 2147483647, "%s: B·H must be <= 2147483647 (blocks in gridDim.x), got %lld",
                func, (long long)BH);
    PYTFM_CHECK((T + TC_ROWS - 1) / TC_ROWS <= 65535,
                "%s: T must be <= %lld (65535 tiles of %d in gridDim.y), got %lld", func,
                65535LL * TC_ROWS, (int)TC_ROWS, (long long)T);
    return PYTFM_STATUS_OK;
}

template <Prec P, int D>
pytfm_status tc_forward_launch(const char *func, const tc_forward_args &a, int64_t BH,
                               void *stream) {
    constexpr size_t bytes = tc_forward_shared<P, D>();
    static_assert(D % 16 == 0 && bytes <= 163 * 1024, "within sm_80's shared memory");
    PYTFM_TRY(pytfm__allow_shared(func, tc_forward_kernel<P, D>, bytes));
    const dim3 grid((unsigned)BH, (unsigned)((a.T + TC_ROWS - 1) / TC_ROWS));
    return pytfm__launch(func, tc_forward_kernel<P, D>, grid, dim3(TC_THREADS), bytes, stream, a);
}

template <Prec P>
pytfm_status tc_forward_any(const char *func, const tc_forward_args &a, int64_t BH, int64_t D,
                            void *stream) {
    switch (D) {
    case 16: return tc_forward_launch<P, 16>(func, a, BH, stream);
    case 32: return tc_forward_launch<P, 32>(func, a, BH, stream);
    case 64: return tc_forward_launch<P, 64>(func, a, BH, stream);
    default: return tc_forward_launch<P, 128>(func, a, BH, stream);
    }
}

template <Prec P, int D>
pytfm_status tc_backward_launch(const char *func, const tc_backward_args &a, int64_t B,
                                void *stream) {
    constexpr size_t bytes = tc_dkdv_shared<P, D>(), bytes_dq = tc_dq_shared<P, D>();
    static_assert(D % 16 == 0 && bytes <= 163 * 1024 && bytes_dq <= 163 * 1024,
                  "within sm_80's shared memory");
    const unsigned tiles = (unsigned)((a.T + TC_ROWS - 1) / TC_ROWS);
    // dK, dV: a block per (b, key/value head, key tile); dQ: per (b, head, query tile).
    // Hkv = H without a window, the common case, takes the instance without the group loop
    void (*dkdv)(tc_backward_args) = a.Hkv != a.H || a.window > 0
                                         ? tc_dkdv_kernel<P, D, true>
                                         : tc_dkdv_kernel<P, D, false>;
    PYTFM_TRY(pytfm__allow_shared(func, dkdv, bytes));
    PYTFM_TRY(pytfm__launch(func, dkdv, dim3((unsigned)(B * a.Hkv), tiles), dim3(TC_THREADS),
                            bytes, stream, a));
    PYTFM_TRY(pytfm__allow_shared(func, tc_dq_kernel<P, D>, bytes_dq));
    return pytfm__launch(func, tc_dq_kernel<P, D>, dim3((unsigned)(B * a.H), tiles),
                         dim3(TC_THREADS), bytes_dq, stream, a);
}

template <Prec P>
pytfm_status tc_backward_any(const char *func, float *delta, const tc_backward_args &a,
                             const float *o, int64_t B, int64_t D, void *stream) {
    PYTFM_TRY(pytfm__attention_delta_cuda(func, delta, a.dy, o, B * a.T * a.H, a.T, a.H, D,
                                          P == TF32 ? PYTFM_PRECISION_TF32 : PYTFM_PRECISION_BF16,
                                          stream));
    switch (D) {
    case 16: return tc_backward_launch<P, 16>(func, a, B, stream);
    case 32: return tc_backward_launch<P, 32>(func, a, B, stream);
    case 64: return tc_backward_launch<P, 64>(func, a, B, stream);
    default: return tc_backward_launch<P, 128>(func, a, B, stream);
    }
}

} // namespace

extern "C" pytfm_status pytfm_attention_gqa_forward_ex_cuda(
    float *o, float *lse, const float *q, const float *k, const float *v, int64_t B, int64_t T,
    int64_t H, int64_t Hkv, int64_t D, float scale, int32_t causal, int64_t window,
    int32_t precision, void *stream) {
    PYTFM_TRY(pytfm__check_attention_forward(__func__, o, lse, q, k, v, B, T, H, Hkv, D, scale,
                                             causal, window));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    PYTFM_TRY(tc_check_head_dim(__func__, D));
    if (precision == PYTFM_PRECISION_FP32 || !tc_head_dim(D))
        return pytfm_attention_gqa_forward_cuda(o, lse, q, k, v, B, T, H, Hkv, D, scale, causal,
                                                window, stream);
    if (B * T * H == 0) return PYTFM_STATUS_OK;
    PYTFM_TRY(tc_check_grid(__func__, B * H, T));
    const tc_forward_args a = {o, lse, q, k, v, T, H, Hkv, window, scale * TC_LOG2E, causal != 0};
    return precision == PYTFM_PRECISION_TF32 ? tc_forward_any<TF32>(__func__, a, B * H, D, stream)
                                             : tc_forward_any<BF16>(__func__, a, B * H, D, stream);
}

extern "C" pytfm_status pytfm_attention_forward_ex_cuda(float *o, float *lse, const float *q,
                                                        const float *k, const float *v,
                                                        int64_t B, int64_t T, int64_t H,
                                                        int64_t D, float scale, int32_t causal,
                                                        int32_t precision, void *stream) {
    PYTFM_TRY(pytfm__check_attention_forward(__func__, o, lse, q, k, v, B, T, H, H, D, scale,
                                             causal, 0));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    PYTFM_TRY(tc_check_head_dim(__func__, D));
    return pytfm_attention_gqa_forward_ex_cuda(o, lse, q, k, v, B, T, H, H, D, scale, causal, 0,
                                               precision, stream);
}

extern "C" pytfm_status pytfm_attention_gqa_backward_ex_cuda(
    float *dq, float *dk, float *dv, const float *dy, const float *q, const float *k,
    const float *v, const float *o, const float *lse, int64_t B, int64_t T, int64_t H,
    int64_t Hkv, int64_t D, float scale, int32_t causal, int64_t window, int32_t precision,
    void *stream) {
    PYTFM_TRY(pytfm__check_attention_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, B, T, H,
                                              Hkv, D, scale, causal, window));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    PYTFM_TRY(tc_check_head_dim(__func__, D));
    if (precision == PYTFM_PRECISION_FP32 || !tc_head_dim(D))
        return pytfm_attention_gqa_backward_cuda(dq, dk, dv, dy, q, k, v, o, lse, B, T, H, Hkv, D,
                                                 scale, causal, window, stream);
    if (B * T * H == 0) return PYTFM_STATUS_OK;
    PYTFM_TRY(tc_check_grid(__func__, B * H, T));
    float *delta = nullptr;
    PYTFM_TRY(pytfm__stream_scratch(__func__, &delta, B * H * T, stream));
    const tc_backward_args a = {dq, dk, dv, dy, q, k, v, lse, delta, T, H, Hkv, scale,
                                scale * TC_LOG2E, causal != 0, (int)PYTFM_MIN(window, T),
                                (int)(H / Hkv)};
    const pytfm_status st =
        precision == PYTFM_PRECISION_TF32
            ? tc_backward_any<TF32>(__func__, delta, a, o, B, D, stream)
            : tc_backward_any<BF16>(__func__, delta, a, o, B, D, stream);
    return pytfm__stream_scratch_free(__func__, delta, st, stream);
}

extern "C" pytfm_status pytfm_attention_backward_ex_cuda(float *dq, float *dk, float *dv,
                                                         const float *dy, const float *q,
                                                         const float *k, const float *v,
                                                         const float *o, const float *lse,
                                                         int64_t B, int64_t T, int64_t H,
                                                         int64_t D, float scale, int32_t causal,
                                                         int32_t precision, void *stream) {
    PYTFM_TRY(pytfm__check_attention_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, B, T, H,
                                              H, D, scale, causal, 0));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    PYTFM_TRY(tc_check_head_dim(__func__, D));
    return pytfm_attention_gqa_backward_ex_cuda(dq, dk, dv, dy, q, k, v, o, lse, B, T, H, H, D,
                                                scale, causal, 0, precision, stream);
}
