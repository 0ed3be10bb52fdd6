/*
 * attention_tc.cu — attention forward and backward on the tensor cores, TF32 or BF16 inputs
 * with FP32 sums: the engine of pytfm_attention_forward_ex_cuda and _backward_ex_cuda at those
 * precisions (PYTFM_PRECISION_FP32, and head dims other than 16, 32, 64 and 128, stay on
 * attention.cu's FP32 kernels). Shapes, scale, causality and lse as attention.cu:
 *
 *   q, k, v, o [B, T, H, D] (row (b, t, h) at ((b·T + t)·H + h)·D), lse [B, H, T]
 *   S = scale · q kᵀ,  P = softmax(S) (causal: keys s <= t),  O = P v,  lse = log Σ_s e^S
 *
 * FlashAttention-2's structure: a block of 4 warps per (batch·head, tile of 64 queries), a
 * warp per 16 query rows; K and V tiles of 64 keys go through shared memory (FP32, as they lie);
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
 *                                     precision's rounding, so that delta = Σ_s P_ts dP_ts)
 *   dP_ts = dy_t · v_s,  dS_ts = P_ts (dP_ts − delta_t)
 *   dV_s = Σ_t P_ts dy_t,  dK_s = scale · Σ_t dS_ts q_t,  dQ_t = scale · Σ_s dS_ts k_s
 * dK and dV: a block per (batch·head, tile of 64 keys), a warp per 16 keys, walking the query
 * tiles (from the diagonal when causal): Sᵀ = K·Qᵀ and dPᵀ = V·dYᵀ as fragments, Pᵀ and dSᵀ
 * made in place and multiplied by dY and Q as P·V is. dQ: a second kernel, a block per query
 * tile walking the key tiles, S and dP again, dQ += dS·K. Nothing goes through shared memory
 * but the four input tiles.
 *
 * Shared tiles are [64][D + 4] floats: the fragment reads (row g, column t) and the permuted
 * V reads (rows 2t, 2t + 1, column g) fall in 32 distinct banks (BF16's pairs: 2-way). Loads are
 * float4 where the array is 16-byte aligned (D is a multiple of 16, so every row then is),
 * scalar otherwise; rows past T are zero. Memory: shared tiles and the backward's delta; nothing
 * depends on T.
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
};

constexpr float TC_LOG2E = 1.4426950408889634f, TC_LN2 = 0.6931471805599453f;

enum Prec { TF32, BF16 };

static __device__ __forceinline__ float tc_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* x rounded as precision P rounds a fragment's input (an FP32 value) */
template <Prec P> static __device__ __forceinline__ float tc_round(float x) {
    return P == TF32 ? tc_bits(pytfm__tf32(x)) : tc_bits(pytfm__bf16x2(x, 0.0f) << 16);
}

/* Rows [0, ROWS) of a tile into dst [ROWS][D + 4]: row r is src + r·stride (r < n), zero past
 * n. vec: src 16-byte aligned (then every row is: D % 16 == 0). */
template <int ROWS, int D>
static __device__ void tc_load(float *dst, const float *src, int64_t stride, int n, bool vec) {
    constexpr int C = D / 4;
    for (int e = threadIdx.x; e < ROWS * C; e += TC_THREADS) {
        const int r = e / C, d = e % C * 4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < n) {
            const float *p = src + r * stride + d;
            if (vec) x = pytfm__load4(p);
            else x = make_float4(p[0], p[1], p[2], p[3]);
        }
        pytfm__store4(dst + r * (D + 4) + d, x);
    }
}

/* s[j] = A·Bᵀ for the warp's 16 rows of A (row stride D + 4) and rows 8j .. 8j + 7 of Bm
 * (j < TC_FRAGS): the m16n8 fragments of a 16 × 64 block of scores, summed over d < D */
template <Prec P, int D>
static __device__ __forceinline__ void tc_scores(float (&s)[TC_FRAGS][4], const float *A,
                                                 const float *Bm, int g, int t) {
    constexpr int LD = D + 4;
    PYTFM_UNROLL
    for (int j = 0; j < TC_FRAGS; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    if (P == TF32) {
        PYTFM_UNROLL
        for (int kk = 0; kk < D; kk += 8) {
            const uint32_t a[4] = {pytfm__tf32(A[g * LD + kk + t]),
                                   pytfm__tf32(A[(g + 8) * LD + kk + t]),
                                   pytfm__tf32(A[g * LD + kk + t + 4]),
                                   pytfm__tf32(A[(g + 8) * LD + kk + t + 4])};
            PYTFM_UNROLL
            for (int j = 0; j < TC_FRAGS; j++) {
                const float *row = Bm + (8 * j + g) * LD + kk;
                const uint32_t b[2] = {pytfm__tf32(row[t]), pytfm__tf32(row[t + 4])};
                pytfm__mma_tf32(s[j], a, b);
            }
        }
    } else {
        PYTFM_UNROLL
        for (int kk = 0; kk < D; kk += 16) {
            const float *r0 = A + g * LD + kk, *r1 = A + (g + 8) * LD + kk;
            const uint32_t a[4] = {pytfm__bf16x2(r0[2 * t], r0[2 * t + 1]),
                                   pytfm__bf16x2(r1[2 * t], r1[2 * t + 1]),
                                   pytfm__bf16x2(r0[2 * t + 8], r0[2 * t + 9]),
                                   pytfm__bf16x2(r1[2 * t + 8], r1[2 * t + 9])};
            PYTFM_UNROLL
            for (int j = 0; j < TC_FRAGS; j++) {
                const float *row = Bm + (8 * j + g) * LD + kk;
                const uint32_t b[2] = {pytfm__bf16x2(row[2 * t], row[2 * t + 1]),
                                       pytfm__bf16x2(row[2 * t + 8], row[2 * t + 9])};
                pytfm__mma_bf16(s[j], a, b);
            }
        }
    }
}

/* acc[n] += R·X: R the 16 × 64 block held as s's fragments (columns 8j + 2t, 8j + 2t + 1 of
 * rows g and g + 8), X [64][D + 4] in shared memory, acc the m16n8 fragments of the 16 × D
 * result (columns 8n .. 8n + 7). R goes from the accumulator layout into the A layout in
 * registers (see the opening comment for the order of k). */
template <Prec P, int D>
static __device__ __forceinline__ void tc_accumulate(float (&acc)[D / 8][4],
                                                     const float (&s)[TC_FRAGS][4],
                                                     const float *X, int g, int t) {
    constexpr int LD = D + 4;
    if (P == TF32) {
        PYTFM_UNROLL
        for (int j = 0; j < TC_FRAGS; j++) {
            // k = t is column 2t, k = t + 4 column 2t + 1
            const uint32_t a[4] = {pytfm__tf32(s[j][0]), pytfm__tf32(s[j][2]),
                                   pytfm__tf32(s[j][1]), pytfm__tf32(s[j][3])};
            const float *x0 = X + (8 * j + 2 * t) * LD, *x1 = x0 + LD;
            PYTFM_UNROLL
            for (int n = 0; n < D / 8; n++) {
                const uint32_t b[2] = {pytfm__tf32(x0[8 * n + g]), pytfm__tf32(x1[8 * n + g])};
                pytfm__mma_tf32(acc[n], a, b);
            }
        }
    } else {
        PYTFM_UNROLL
        for (int c = 0; c < TC_FRAGS / 2; c++) {
            const uint32_t a[4] = {pytfm__bf16x2(s[2 * c][0], s[2 * c][1]),
                                   pytfm__bf16x2(s[2 * c][2], s[2 * c][3]),
                                   pytfm__bf16x2(s[2 * c + 1][0], s[2 * c + 1][1]),
                                   pytfm__bf16x2(s[2 * c + 1][2], s[2 * c + 1][3])};
            const float *x0 = X + (16 * c + 2 * t) * LD;
            PYTFM_UNROLL
            for (int n = 0; n < D / 8; n++) {
                const float *x = x0 + 8 * n + g;
                const uint32_t b[2] = {pytfm__bf16x2(x[0], x[LD]),
                                       pytfm__bf16x2(x[8 * LD], x[9 * LD])};
                pytfm__mma_bf16(acc[n], a, b);
            }
        }
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

// ---- forward -------------------------------------------------------------------------------

struct tc_forward_args {
    float *o, *lse;
    const float *q, *k, *v;
    int64_t T, H;
    float scale2; // scale · log2 e
    int causal;
};

template <int D> constexpr size_t tc_forward_shared() {
    return sizeof(float) * (size_t)(TC_ROWS + 2 * TC_KEYS) * (D + 4);
}

template <Prec P, int D>
static __global__ void __launch_bounds__(TC_THREADS) tc_forward_kernel(tc_forward_args a) {
    constexpr int LD = D + 4;
    PYTFM_DYNAMIC_SHARED(float4, smem);
    float *Qs = (float *)smem, *Ks = Qs + TC_ROWS * LD, *Vs = Ks + TC_KEYS * LD;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t T = a.T, H = a.H, HD = H * D, b = blockIdx.x / H, h = blockIdx.x % H;
    // the last query tiles see the most keys when causal: they go first (no long tail)
    const int64_t i0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * TC_ROWS;
    const int nq = (int)PYTFM_MIN((int64_t)TC_ROWS, T - i0);
    const int64_t base = (b * T * H + h) * D; // (b, 0, h, 0)
    const int64_t j_end = a.causal ? i0 + nq : T;
    const bool vk = pytfm__aligned4(a.k), vv = pytfm__aligned4(a.v);
    tc_load<TC_ROWS, D>(Qs, a.q + base + i0 * HD, HD, nq, pytfm__aligned4(a.q));
    const int64_t row0 = i0 + 16 * warp + g; // this thread's rows: row0 and row0 + 8
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[D / 8][4] = {};
    for (int64_t j0 = 0; j0 < j_end; j0 += TC_KEYS) {
        const int nk = (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - j0);
        __syncthreads(); // every warp is done with the last tile's K and V
        tc_load<TC_KEYS, D>(Ks, a.k + base + j0 * HD, HD, nk, vk);
        tc_load<TC_KEYS, D>(Vs, a.v + base + j0 * HD, HD, nk, vv);
        __syncthreads(); // the K and V tiles are whole
        float s[TC_FRAGS][4];
        tc_scores<P, D>(s, Qs + 16 * warp * LD, Ks, g, t);
        // keys past the tile's end, or past a row's position, do not count
        const bool edge = nk < TC_KEYS || (a.causal && j0 + TC_KEYS - 1 > i0);
        float mx[2] = {m[0], m[1]};
        PYTFM_UNROLL
        for (int j = 0; j < TC_FRAGS; j++)
            PYTFM_UNROLL
            for (int e = 0; e < 4; e++) {
                const int c = 8 * j + 2 * t + (e & 1);
                float x = s[j][e] * a.scale2;
                if (edge && (c >= nk || (a.causal && j0 + c > row0 + 8 * (e >> 1))))
                    x = -INFINITY;
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
        tc_accumulate<P, D>(acc, s, Vs, g, t);
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

/* delta[b, h, t] = Σ_d r(dy[b, t, h, d]) · o[b, t, h, d]: a warp per row (b, t, h) */
template <Prec P>
static __global__ void tc_delta_kernel(float *delta, const float *dy, const float *o,
                                       int64_t rows, int64_t T, int64_t H, int D) {
    const pytfm__row_team<true> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        float s = 0.0f;
        for (int d = (int)team.rank; d < D; d += PYTFM_WARP)
            s += tc_round<P>(dy[r * D + d]) * o[r * D + d];
        s = pytfm__warp_sum(s);
        const int64_t h = r % H, t = r / H % T, b = r / (H * T);
        if (team.rank == 0) delta[(b * H + h) * T + t] = s;
    }
}

struct tc_backward_args {
    float *dq, *dk, *dv;
    const float *dy, *q, *k, *v, *lse, *delta; // delta [B, H, T] from tc_delta_kernel
    int64_t T, H;
    float scale, scale2; // scale, and scale · log2 e
    int causal;
};

template <int D> constexpr size_t tc_backward_shared() {
    return sizeof(float) * ((size_t)4 * TC_ROWS * (D + 4) + 2 * TC_KEYS);
}

/* dK and dV of a tile of 64 keys (a warp's 16 rows), walking the query tiles (columns):
 * Sᵀ = K·Qᵀ, dPᵀ = V·dYᵀ, then dV += Pᵀ·dY and dK += dSᵀ·Q from the registers. */
template <Prec P, int D>
static __global__ void __launch_bounds__(TC_THREADS) tc_dkdv_kernel(tc_backward_args a) {
    constexpr int LD = D + 4;
    PYTFM_DYNAMIC_SHARED(float4, smem);
    float *Ks = (float *)smem, *Vs = Ks + TC_ROWS * LD, *Qs = Vs + TC_ROWS * LD;
    float *dYs = Qs + TC_KEYS * LD, *lse2 = dYs + TC_KEYS * LD, *dlt = lse2 + TC_KEYS;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t T = a.T, H = a.H, HD = H * D, b = blockIdx.x / H, h = blockIdx.x % H;
    const int64_t j0 = (int64_t)blockIdx.y * TC_ROWS, base = (b * T * H + h) * D;
    const int nk = (int)PYTFM_MIN((int64_t)TC_ROWS, T - j0);
    const bool vq = pytfm__aligned4(a.q), vdy = pytfm__aligned4(a.dy);
    tc_load<TC_ROWS, D>(Ks, a.k + base + j0 * HD, HD, nk, pytfm__aligned4(a.k));
    tc_load<TC_ROWS, D>(Vs, a.v + base + j0 * HD, HD, nk, pytfm__aligned4(a.v));
    const float *lse = a.lse + (b * H + h) * T, *delta = a.delta + (b * H + h) * T;
    const int64_t key0 = j0 + 16 * warp + g; // this thread's keys: key0 and key0 + 8
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    // causal: the query rows before j0 see none of these keys (64 rows per tile both ways)
    for (int64_t i0 = a.causal ? j0 : 0; i0 < T; i0 += TC_KEYS) {
        const int nq = (int)PYTFM_MIN((int64_t)TC_KEYS, T - i0);
        __syncthreads(); // every warp is done with the last query tile
        tc_load<TC_KEYS, D>(Qs, a.q + base + i0 * HD, HD, nq, vq);
        tc_load<TC_KEYS, D>(dYs, a.dy + base + i0 * HD, HD, nq, vdy);
        for (int r = threadIdx.x; r < TC_KEYS; r += TC_THREADS) {
            lse2[r] = r < nq ? lse[i0 + r] * TC_LOG2E : 0.0f;
            dlt[r] = r < nq ? delta[i0 + r] : 0.0f;
        }
        __syncthreads();
        float p[TC_FRAGS][4], ds[TC_FRAGS][4];
        tc_scores<P, D>(p, Ks + 16 * warp * LD, Qs, g, t);  // Sᵀ: keys × queries
        tc_scores<P, D>(ds, Vs + 16 * warp * LD, dYs, g, t); // dPᵀ
        PYTFM_UNROLL
        for (int j = 0; j < TC_FRAGS; j++)
            PYTFM_UNROLL
            for (int e = 0; e < 4; e++) {
                const int c = 8 * j + 2 * t + (e & 1);
                const bool seen = c < nq && (!a.causal || key0 + 8 * (e >> 1) <= i0 + c);
                p[j][e] = seen ? exp2f(p[j][e] * a.scale2 - lse2[c]) : 0.0f;
                ds[j][e] = p[j][e] * (ds[j][e] - dlt[c]);
            }
        tc_accumulate<P, D>(dv, p, dYs, g, t); // dV += Pᵀ·dY
        tc_accumulate<P, D>(dk, ds, Qs, g, t); // dK += dSᵀ·Q
    }
    const float scale[2] = {a.scale, a.scale}, one[2] = {1.0f, 1.0f};
    tc_store<D>(a.dk + base, dk, scale, key0, T, HD, t);
    tc_store<D>(a.dv + base, dv, one, key0, T, HD, t);
}

/* dQ of a tile of 64 queries (a warp's 16 rows), walking the key tiles up to the diagonal when
 * causal: S = Q·Kᵀ, dP = dY·Vᵀ, dS in registers, dQ += dS·K. */
template <Prec P, int D>
static __global__ void __launch_bounds__(TC_THREADS) tc_dq_kernel(tc_backward_args a) {
    constexpr int LD = D + 4;
    PYTFM_DYNAMIC_SHARED(float4, smem);
    float *Qs = (float *)smem, *dYs = Qs + TC_ROWS * LD, *Ks = dYs + TC_ROWS * LD;
    float *Vs = Ks + TC_KEYS * LD;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int64_t T = a.T, H = a.H, HD = H * D, b = blockIdx.x / H, h = blockIdx.x % H;
    // the last query tiles walk the most keys when causal: they go first
    const int64_t i0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * TC_ROWS, base = (b * T * H + h) * D;
    const int nq = (int)PYTFM_MIN((int64_t)TC_ROWS, T - i0);
    const bool vk = pytfm__aligned4(a.k), vv = pytfm__aligned4(a.v);
    tc_load<TC_ROWS, D>(Qs, a.q + base + i0 * HD, HD, nq, pytfm__aligned4(a.q));
    tc_load<TC_ROWS, D>(dYs, a.dy + base + i0 * HD, HD, nq, pytfm__aligned4(a.dy));
    const int64_t row0 = i0 + 16 * warp + g;
    float lse2[2], dlt[2], dq[D / 8][4] = {};
    PYTFM_UNROLL
    for (int r = 0; r < 2; r++) {
        const int64_t row = row0 + 8 * r;
        lse2[r] = row < T ? a.lse[(b * H + h) * T + row] * TC_LOG2E : 0.0f;
        dlt[r] = row < T ? a.delta[(b * H + h) * T + row] : 0.0f;
    }
    const int64_t j_end = a.causal ? i0 + nq : T;
    for (int64_t j0 = 0; j0 < j_end; j0 += TC_KEYS) {
        const int nk = (int)PYTFM_MIN((int64_t)TC_KEYS, j_end - j0);
        __syncthreads(); // every warp is done with the last key tile
        tc_load<TC_KEYS, D>(Ks, a.k + base + j0 * HD, HD, nk, vk);
        tc_load<TC_KEYS, D>(Vs, a.v + base + j0 * HD, HD, nk, vv);
        __syncthreads(); // the key tile is whole
        float s[TC_FRAGS][4], ds[TC_FRAGS][4];
        tc_scores<P, D>(s, Qs + 16 * warp * LD, Ks, g, t);
        tc_scores<P, D>(ds, dYs + 16 * warp * LD, Vs, g, t); // dP
        PYTFM_UNROLL
        for (int j = 0; j < TC_FRAGS; j++)
            PYTFM_UNROLL
            for (int e = 0; e < 4; e++) {
                const int c = 8 * j + 2 * t + (e & 1), r = e >> 1;
                const bool seen = c < nk && (!a.causal || j0 + c <= row0 + 8 * r);
                const float pv = seen ? exp2f(s[j][e] * a.scale2 - lse2[r]) : 0.0f;
                ds[j][e] = pv * (ds[j][e] - dlt[r]);
            }
        tc_accumulate<P, D>(dq, ds, Ks, g, t);
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
    constexpr size_t bytes = tc_forward_shared<D>();
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
pytfm_status tc_backward_launch(const char *func, const tc_backward_args &a, int64_t BH,
                                void *stream) {
    constexpr size_t bytes = tc_backward_shared<D>();
    static_assert(D % 16 == 0 && bytes <= 163 * 1024, "within sm_80's shared memory");
    const dim3 grid((unsigned)BH, (unsigned)((a.T + TC_ROWS - 1) / TC_ROWS));
    PYTFM_TRY(pytfm__allow_shared(func, tc_dkdv_kernel<P, D>, bytes));
    PYTFM_TRY(pytfm__launch(func, tc_dkdv_kernel<P, D>, grid, dim3(TC_THREADS), bytes, stream,
                            a));
    PYTFM_TRY(pytfm__allow_shared(func, tc_dq_kernel<P, D>, bytes));
    return pytfm__launch(func, tc_dq_kernel<P, D>, grid, dim3(TC_THREADS), bytes, stream, a);
}

template <Prec P>
pytfm_status tc_backward_any(const char *func, float *delta, const tc_backward_args &a,
                             const float *o, int64_t B, int64_t D, void *stream) {
    const int64_t rows = B * a.T * a.H;
    PYTFM_TRY(pytfm__launch(func, tc_delta_kernel<P>,
                            dim3(pytfm__blocks(rows, PYTFM_ROW_THREADS / PYTFM_WARP,
                                               PYTFM_MAX_BLOCKS)),
                            dim3(PYTFM_ROW_THREADS), 0, stream, delta, a.dy, o, rows, a.T, a.H,
                            (int)D));
    switch (D) {
    case 16: return tc_backward_launch<P, 16>(func, a, B * a.H, stream);
    case 32: return tc_backward_launch<P, 32>(func, a, B * a.H, stream);
    case 64: return tc_backward_launch<P, 64>(func, a, B * a.H, stream);
    default: return tc_backward_launch<P, 128>(func, a, B * a.H, stream);
    }
}

} // namespace

extern "C" pytfm_status pytfm_attention_forward_ex_cuda(float *o, float *lse, const float *q,
                                                        const float *k, const float *v,
                                                        int64_t B, int64_t T, int64_t H,
                                                        int64_t D, float scale, int32_t causal,
                                                        int32_t precision, void *stream) {
    PYTFM_TRY(pytfm__check_attention_forward(__func__, o, lse, q, k, v, B, T, H, D, scale));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    PYTFM_TRY(tc_check_head_dim(__func__, D));
    if (precision == PYTFM_PRECISION_FP32 || !tc_head_dim(D))
        return pytfm_attention_forward_cuda(o, lse, q, k, v, B, T, H, D, scale, causal, stream);
    if (B * T * H == 0) return PYTFM_STATUS_OK;
    PYTFM_TRY(tc_check_grid(__func__, B * H, T));
    const tc_forward_args a = {o, lse, q, k, v, T, H, scale * TC_LOG2E, causal != 0};
    return precision == PYTFM_PRECISION_TF32 ? tc_forward_any<TF32>(__func__, a, B * H, D, stream)
                                             : tc_forward_any<BF16>(__func__, a, B * H, D, stream);
}

extern "C" pytfm_status pytfm_attention_backward_ex_cuda(float *dq, float *dk, float *dv,
                                                         const float *dy, const float *q,
                                                         const float *k, const float *v,
                                                         const float *o, const float *lse,
                                                         int64_t B, int64_t T, int64_t H,
                                                         int64_t D, float scale, int32_t causal,
                                                         int32_t precision, void *stream) {
    PYTFM_TRY(pytfm__check_attention_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, B, T, H,
                                              D, scale));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    PYTFM_TRY(tc_check_head_dim(__func__, D));
    if (precision == PYTFM_PRECISION_FP32 || !tc_head_dim(D))
        return pytfm_attention_backward_cuda(dq, dk, dv, dy, q, k, v, o, lse, B, T, H, D, scale,
                                             causal, stream);
    if (B * T * H == 0) return PYTFM_STATUS_OK;
    PYTFM_TRY(tc_check_grid(__func__, B * H, T));
    float *delta = nullptr;
    PYTFM_TRY(pytfm__stream_scratch(__func__, &delta, B * H * T, stream));
    const tc_backward_args a = {dq, dk, dv, dy, q, k, v, lse, delta, T, H, scale,
                                scale * TC_LOG2E, causal != 0};
    const pytfm_status st =
        precision == PYTFM_PRECISION_TF32
            ? tc_backward_any<TF32>(__func__, delta, a, o, B, D, stream)
            : tc_backward_any<BF16>(__func__, delta, a, o, B, D, stream);
    return pytfm__stream_scratch_free(__func__, delta, st, stream);
}
