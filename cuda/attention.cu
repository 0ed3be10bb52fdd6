/*
 * attention.cu — multi-head scaled dot-product attention on the GPU, FlashAttention-2's
 * structure in float32 on the CUDA cores, with grouped-query heads and a sliding window; the
 * twin of csrc/kernels/attention.c.
 *
 *   q, o [B, T, H, D] (row (b, t, h) at ((b·T + t)·H + h)·D; the next t is H·D on), k, v
 *   [B, T, Hkv, D] (the next t Hkv·D on); query head h reads key/value head h / (H / Hkv)
 *   S = scale · q kᵀ per (b, h),  P = softmax(S) row-wise (causal: keys s <= t; a window w > 0:
 *   also s > t − w),  O = P v,  lse_t = log Σ_s exp(S_ts)  ([B, H, T], saved for the backward)
 *
 * Forward: a block per (batch·head, tile of BQ queries), batch·head in gridDim.x (y stops at
 * 65535, x does not). The block keeps its Q tile in shared memory and streams the K and V tiles
 * of BK keys through it; per query row a running max m and sum l (the online softmax):
 *   m' = max(m, max_s S_ts),  l ← l·e^(m−m') + Σ_s e^(S_ts−m'),  O_t ← O_t·e^(m−m') + Σ_s e^(S_ts−m') v_s
 * and one division O_t / l at the end; scores are kept in base 2 (q is scaled by
 * scale·log2 e as it is loaded, exp2f), lse = (m + log2 l)·ln 2. A row that saw no key (l = 0:
 * an empty split of the decode) gives o = 0 and lse = −inf, not NaN. Causal tiles above the
 * diagonal are never loaded; on the diagonal the keys past a row's position are masked.
 *
 * Register tiling, as in an SGEMM: the TX = 8 lanes of a row group share a score row; thread
 * (tx, ty) owns score rows ty + TY·i (i < RM) and key columns tx + 8·j (j < 8), so S = Q·Kᵀ is
 * RM×8 outputs per thread from RM + 8 float4 shared loads per 4 steps of d, and O += P·V is
 * RM rows × the float4 chunks tx·4 + 32·jj of d (jj < DP/32) per thread. Row max and sum are
 * shuffles among the 8 lanes. Shared rows are padded (DP + 4 floats for Q, K, V; BK + 8 for
 * P) so that the 8 lanes' float4 reads of 8 consecutive rows, and the row groups' reads of
 * P, fall in distinct banks. Head dims are padded to a class DP of 32, 64 or 128 (D = 80 runs
 * in the 128 one; products stop at D rounded up to 4, loads zero-pad the rest), D > 128 is
 * an error. Global loads are float4 where D % 4 == 0 and the pointer is 16-byte aligned, a
 * scalar path otherwise (a CuPy view such as x[1:] is contiguous but offset by a float).
 * Memory: shared tiles only; nothing depends on T.
 *
 * Backward (dy the gradient of O), P recomputed from q, k and lse:
 *   delta_t = Σ_d dy_td O_td          (first, into scratch [B, H, T] on the stream)
 *   dP_ts = dy_t · v_s,  dS_ts = P_ts (dP_ts − delta_t)
 *   dV_s = Σ_t P_ts dy_t,  dK_s = scale · Σ_t dS_ts q_t,  dQ_t = scale · Σ_s dS_ts k_s
 * dK and dV: a block per (batch·key/value head, tile of BK keys) walks, for each query head of
 * the group in turn, the query tiles (from the diagonal when causal, up to the last row whose
 * window holds the tile's keys), Pᵀ and dSᵀ computed with the keys as rows: the group's sum
 * stays in registers, in one order. dQ: a second kernel, a
 * block per query tile walking the key tiles, recomputes P and dS once more and sums dS·K. No
 * atomics anywhere: every sum has one order, the same bits on every run.
 *
 * Decode: n_new queries at positions [start, start + n_new) against the cache [B, Tmax, H, D],
 * keys [0, start + n_new): the forward kernel with a query offset and the cache's row count.
 * When batch·heads × query tiles cannot fill the GPU, the keys are split over gridDim.z; each
 * split writes its own (o, lse) into scratch and a merge kernel combines them:
 *   lse = log Σ_s e^(lse_s),  o = Σ_s e^(lse_s − lse) o_s
 * cache_append is a grid-stride copy.
 *
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "mma.cuh"

#include <string.h>

enum {
    BK = 64,                  // keys per tile (and query rows per backward tile)
    TX = 8,                   // lanes that share a score row
    LDP = BK + 8,             // the row stride of the P and dS tiles in shared memory
    FWD_THREADS = 128,        // forward: TY = 16 row groups (RM = 4: 64 queries, 1: 16)
    BWD_THREADS = 256,        // backward: TY = 32 row groups, RM = 2: 64 rows
    BWD_RM = BK / (BWD_THREADS / TX),
};

static constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

#ifdef PYTFM_EMULATE
// a small "GPU", so that the tests' few heads take the decode's split path
enum { ATTN_SMS = 4, SPLIT_MIN_KEYS = BK };
#else
// an H200 has 132 SMs (a smaller GPU runs the same splits in more waves)
enum { ATTN_SMS = 132, SPLIT_MIN_KEYS = 4 * BK };
#endif

// ---- tiles in shared memory ----------------------------------------------------------------

/* Rows [0, ROWS) of a tile into dst [ROWS][DP + 4]: row r is src + r·stride (r < n), its D
 * floats times mul; zero past n rows and D columns, so the products need no bounds test.
 * vec: D % 4 == 0 and src 16-byte aligned (then every row is), one float4 per 4 floats. */
template <int ROWS, int DP, int NT>
static __device__ void load_rows(float *dst, const float *src, int64_t stride, int n, int D,
                                 bool vec, float mul) {
    constexpr int C = DP / 4;
    for (int e = threadIdx.x; e < ROWS * C; e += NT) {
        const int r = e / C, d = e % C * 4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < n && d < D) {
            const float *p = src + r * stride + d;
            if (vec) {
                x = pytfm__load4(p);
            } else {
                x.x = p[0];
                if (d + 1 < D) x.y = p[1];
                if (d + 2 < D) x.z = p[2];
                if (d + 3 < D) x.w = p[3];
            }
            x.x *= mul;
            x.y *= mul;
            x.z *= mul;
            x.w *= mul;
        }
        pytfm__store4(dst + r * (DP + 4) + d, x);
    }
}

/* s[i][j] = Σ_{d < D4} A[ty + TY·i][d] · Bm[tx + 8·j][d]  (A, Bm row stride LD; D4 = D rounded
 * up to 4: past D both are 0) */
template <int RM, int TY, int LD>
static __device__ __forceinline__ void scores(float (&s)[RM][8], const float *A, const float *Bm,
                                              int D4, int tx, int ty) {
    PYTFM_UNROLL
    for (int i = 0; i < RM; i++)
        PYTFM_UNROLL
        for (int j = 0; j < 8; j++) s[i][j] = 0.0f;
    for (int d = 0; d < D4; d += 4) {
        float4 a[RM], b[8];
        PYTFM_UNROLL
        for (int i = 0; i < RM; i++) a[i] = pytfm__load4(A + (ty + TY * i) * LD + d);
        PYTFM_UNROLL
        for (int j = 0; j < 8; j++) b[j] = pytfm__load4(Bm + (tx + 8 * j) * LD + d);
        PYTFM_UNROLL
        for (int i = 0; i < RM; i++)
            PYTFM_UNROLL
            for (int j = 0; j < 8; j++) {
                float t = fmaf(a[i].x, b[j].x, s[i][j]);
                t = fmaf(a[i].y, b[j].y, t);
                t = fmaf(a[i].z, b[j].z, t);
                s[i][j] = fmaf(a[i].w, b[j].w, t);
            }
    }
}

/* acc[i][4·jj + e] += Σ_{c < n4} P[ty + TY·i][c] · V[c][tx·4 + 32·jj + e]  (P row stride LDP,
 * V row stride DP + 4; n4 a multiple of 4 whose P columns past the real ones are 0 and V rows
 * 0); the chunks of d at or past D are skipped */
template <int RM, int TY, int DP>
static __device__ __forceinline__ void accumulate(float (&acc)[RM][DP / 8], const float *P,
                                                  const float *V, int n4, int D, int tx, int ty) {
    constexpr int LD = DP + 4;
    for (int c = 0; c < n4; c += 4) {
        float4 p[RM];
        PYTFM_UNROLL
        for (int i = 0; i < RM; i++) p[i] = pytfm__load4(P + (ty + TY * i) * LDP + c);
        PYTFM_UNROLL
        for (int jj = 0; jj < DP / 32; jj++) {
            const int d = tx * 4 + 32 * jj;
            if (d >= D) continue;
            const float4 v0 = pytfm__load4(V + c * LD + d), v1 = pytfm__load4(V + (c + 1) * LD + d),
                         v2 = pytfm__load4(V + (c + 2) * LD + d),
                         v3 = pytfm__load4(V + (c + 3) * LD + d);
            PYTFM_UNROLL
            for (int i = 0; i < RM; i++) {
                float *o = acc[i] + 4 * jj;
                o[0] = fmaf(p[i].w, v3.x, fmaf(p[i].z, v2.x, fmaf(p[i].y, v1.x, fmaf(p[i].x, v0.x, o[0]))));
                o[1] = fmaf(p[i].w, v3.y, fmaf(p[i].z, v2.y, fmaf(p[i].y, v1.y, fmaf(p[i].x, v0.y, o[1]))));
                o[2] = fmaf(p[i].w, v3.z, fmaf(p[i].z, v2.z, fmaf(p[i].y, v1.z, fmaf(p[i].x, v0.z, o[2]))));
                o[3] = fmaf(p[i].w, v3.w, fmaf(p[i].z, v2.w, fmaf(p[i].y, v1.w, fmaf(p[i].x, v0.w, o[3]))));
            }
        }
    }
}

/* Row r of a [.., D] output at dst (row stride HD) from this thread's chunks of acc[i]·mul */
template <int DP>
static __device__ __forceinline__ void store_row(float *dst, const float *acc, float mul, int D,
                                                 bool vec, int tx) {
    PYTFM_UNROLL
    for (int jj = 0; jj < DP / 32; jj++) {
        const int d = tx * 4 + 32 * jj;
        if (d >= D) continue;
        const float4 x = make_float4(acc[4 * jj] * mul, acc[4 * jj + 1] * mul,
                                     acc[4 * jj + 2] * mul, acc[4 * jj + 3] * mul);
        if (vec) {
            pytfm__store4(dst + d, x);
        } else {
            dst[d] = x.x;
            if (d + 1 < D) dst[d + 1] = x.y;
            if (d + 2 < D) dst[d + 2] = x.z;
            if (d + 3 < D) dst[d + 3] = x.w;
        }
    }
}

/* max and sum over the TX = 8 lanes of a score row (lanes 8g .. 8g + 7 of the warp) */
static __device__ __forceinline__ float row_max(float v) {
    for (int o = 1; o < TX; o <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ float row_sum(float v) {
    for (int o = 1; o < TX; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- forward (and decode) ------------------------------------------------------------------

struct forward_args {
    float *o, *lse;             // o rows ((b·Tq + t)·H + h)·D, lse [B, H, Tq]
    const float *q, *k, *v;     // q like o; k, v rows ((b·Ts + s)·Hkv + g)·D
    int64_t Tq, Tk, Ts, H, Hkv; // queries, keys seen, key rows per batch, heads, kv heads
    int64_t start;              // query t sits at position start + t (causal: sees keys <= it)
    int64_t window;             // 0, or query position p sees keys > p − window only
    int64_t key0;               // the splits cover the keys [key0, Tk)
    const int64_t *q_len, *k_len; // [B] rows and keys of each sequence (device), or NULL: all
    int64_t split_keys;         // keys per split (blockIdx.z), a multiple of BK
    int64_t o_split, lse_split; // floats between two splits' o and lse (the decode's scratch)
    int D;
    float scale2; // scale · log2 e: scores in base 2
    int causal;
};

/* the rows (or keys) of sequence b: len[b] clamped to [0, T], or T where len is NULL */
static __device__ __forceinline__ int64_t seq_len(const int64_t *len, int64_t b, int64_t T) {
    if (!len) return T;
    const int64_t n = len[b];
    return n < 0 ? 0 : n > T ? T : n;
}

/* the first key the query at position pos sees: pos − window + 1 with a window, else 0 */
static __device__ __forceinline__ int64_t first_key(int64_t window, int64_t pos) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

template <int DP, int RM> static constexpr size_t forward_shared() {
    return sizeof(float) * ((size_t)(RM * (FWD_THREADS / TX) + 2 * BK) * (DP + 4) +
                            (size_t)RM * (FWD_THREADS / TX) * LDP);
}

template <int DP, int RM>
static __global__ void __launch_bounds__(FWD_THREADS, 3) attention_forward_kernel(forward_args a) {
    constexpr int TY = FWD_THREADS / TX, BQ = RM * TY, LD = DP + 4;
    PYTFM_DYNAMIC_SHARED(float4, smem);
    float *Qs = (float *)smem, *Ks = Qs + BQ * LD, *Vs = Ks + BK * LD, *Ps = Vs + BK * LD;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX, D = a.D, D4 = (D + 3) & ~3;
    const int64_t H = a.H, HD = H * D, b = blockIdx.x / H, h = blockIdx.x % H;
    const int64_t KD = a.Hkv * D, g = h / (H / a.Hkv); // h's key/value head
    // the last query tiles see the most keys when causal: they go first (no long tail)
    const int64_t i0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * BQ;
    const int nq = (int)PYTFM_MIN((int64_t)BQ, a.Tq - i0);
    // sequence b's rows and keys, clamped (the caller checks them; a bad one reads nothing
    // out of bounds); nv of the tile's rows are not padding (the rest: o = 0, lse = -inf)
    const int64_t qn = seq_len(a.q_len, b, a.Tq), kn = seq_len(a.k_len, b, a.Tk);
    const int nv = qn > i0 ? (int)PYTFM_MIN((int64_t)nq, qn - i0) : 0;
    // the keys of this block: its split's, up to its last row's position when causal, from
    // its first row's first key with a window
    const int64_t split_begin = a.key0 + (int64_t)blockIdx.z * a.split_keys;
    const int64_t first = first_key(a.window, a.start + i0);
    const int64_t j_begin = split_begin > first ? split_begin : first;
    int64_t j_end = PYTFM_MIN(kn, split_begin + a.split_keys);
    if (a.causal) j_end = PYTFM_MIN(j_end, a.start + i0 + nv);
    if (nv == 0) j_end = j_begin; // padding rows only: no key at all
    const float *k = a.k + (b * a.Ts * a.Hkv + g) * D, *v = a.v + (b * a.Ts * a.Hkv + g) * D;
    const bool vec = (D & 3) == 0, vk = vec && pytfm__aligned4(a.k), vv = vec && pytfm__aligned4(a.v);
    load_rows<BQ, DP, FWD_THREADS>(Qs, a.q + ((b * a.Tq + i0) * H + h) * D, HD, nq, D,
                                   vec && pytfm__aligned4(a.q), a.scale2);
    float m[RM], l[RM], acc[RM][DP / 8] = {};
    PYTFM_UNROLL
    for (int i = 0; i < RM; i++) m[i] = -INFINITY, l[i] = 0.0f;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += BK) {
        const int nk = (int)PYTFM_MIN((int64_t)BK, j_end - j0);
        __syncthreads(); // every thread is done with the last tile's Ks, Vs and Ps
        load_rows<BK, DP, FWD_THREADS>(Ks, k + j0 * KD, KD, nk, D, vk, 1.0f);
        load_rows<BK, DP, FWD_THREADS>(Vs, v + j0 * KD, KD, nk, D, vv, 1.0f);
        __syncthreads();
        float s[RM][8];
        scores<RM, TY, LD>(s, Qs, Ks, D4, tx, ty);
        // keys past the tile's end, past a row's position, or before its window, do not count
        const bool edge = nk < BK || (a.causal && j0 + BK - 1 > a.start + i0) ||
                          (a.window > 0 && j0 < a.start + i0 + BQ - a.window);
        PYTFM_UNROLL
        for (int i = 0; i < RM; i++) {
            const int64_t pos = a.start + i0 + ty + TY * i;
            float mx = m[i];
            PYTFM_UNROLL
            for (int j = 0; j < 8; j++) {
                const int c = tx + 8 * j;
                if (edge && (c >= nk || (a.causal && j0 + c > pos) ||
                             (a.window > 0 && j0 + c <= pos - a.window)))
                    s[i][j] = -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            mx = row_max(mx);
            const float base = mx == -INFINITY ? 0.0f : mx; // no key yet: every p is 0
            const float alpha = exp2f(m[i] - base);         // 0 on a row's first keys
            float sum = 0.0f;
            PYTFM_UNROLL
            for (int j = 0; j < 8; j++) {
                s[i][j] = exp2f(s[i][j] - base);
                sum += s[i][j];
            }
            l[i] = l[i] * alpha + row_sum(sum);
            m[i] = mx;
            PYTFM_UNROLL
            for (int d = 0; d < DP / 8; d++) acc[i][d] *= alpha;
            PYTFM_UNROLL
            for (int j = 0; j < 8; j++) Ps[(ty + TY * i) * LDP + tx + 8 * j] = s[i][j];
        }
        __syncthreads(); // P is whole
        accumulate<RM, TY, DP>(acc, Ps, Vs, (nk + 3) & ~3, D, tx, ty);
    }
    float *o = a.o + blockIdx.z * a.o_split + ((b * a.Tq + i0) * H + h) * D;
    float *lse = a.lse + blockIdx.z * a.lse_split + (b * H + h) * a.Tq + i0;
    const bool vo = vec && pytfm__aligned4(a.o);
    PYTFM_UNROLL
    for (int i = 0; i < RM; i++) {
        const int r = ty + TY * i;
        if (r >= nq) continue;
        if (r >= nv) { // padding: its products with the keys are not its output
            l[i] = 0.0f;
            PYTFM_UNROLL
            for (int d = 0; d < DP / 8; d++) acc[i][d] = 0.0f;
        }
        if (tx == 0) lse[r] = l[i] > 0.0f ? (m[i] + log2f(l[i])) * LN2 : -INFINITY;
        store_row<DP>(o + r * HD, acc[i], l[i] > 0.0f ? 1.0f / l[i] : 0.0f, D, vo, tx);
    }
}

/* o[b, t, h, :] and lse[b, h, t] from the splits' partial results (po like o, plse like lse,
 * split s at s·o_split, s·lse_split): w_s = e^(lse_s − max lse), o = Σ_s w_s o_s / Σ_s w_s,
 * lse = max + log Σ_s w_s; a thread per element of o, splits in order. */
static __global__ void attention_merge_kernel(float *o, float *lse, const float *po,
                                              const float *plse, int64_t Tq, int64_t H, int D,
                                              int64_t count, int splits, int64_t o_split,
                                              int64_t lse_split) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < count;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = e / D, h = row % H, t = row / H % Tq, b = row / (H * Tq);
        const int64_t at = (b * H + h) * Tq + t;
        float mx = -INFINITY;
        for (int s = 0; s < splits; s++) mx = fmaxf(mx, plse[s * lse_split + at]);
        float wsum = 0.0f, acc = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float w = mx == -INFINITY ? 0.0f : expf(plse[s * lse_split + at] - mx);
            wsum += w;
            acc += w * po[s * o_split + e];
        }
        o[e] = wsum > 0.0f ? acc / wsum : 0.0f;
        if (e % D == 0) lse[at] = wsum > 0.0f ? mx + logf(wsum) : -INFINITY;
    }
}

// ---- backward ------------------------------------------------------------------------------

/* x as precision PREC rounds a tensor-core fragment's input: FP32 not at all, TF32 by
 * cvt.rna.tf32.f32, BF16 by cvt.rn.bf16x2.f32 (cuda/mma.cuh) */
template <int32_t PREC> static __device__ __forceinline__ float delta_round(float x) {
    if (PREC == PYTFM_PRECISION_FP32) return x;
    uint32_t u = PREC == PYTFM_PRECISION_TF32 ? pytfm__tf32(x) : pytfm__bf16x2(x, 0.0f) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* delta[b, h, t] = Σ_d r(dy[b, t, h, d]) · o[b, t, h, d], r delta_round: a warp per row
 * (b, t, h) */
template <int32_t PREC>
static __global__ void attention_delta_kernel(float *delta, const float *dy, const float *o,
                                              int64_t rows, int64_t T, int64_t H, int D) {
    const pytfm__row_team<true> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        float s = 0.0f;
        for (int d = (int)team.rank; d < D; d += PYTFM_WARP)
            s += delta_round<PREC>(dy[r * D + d]) * o[r * D + d];
        s = pytfm__warp_sum(s);
        const int64_t h = r % H, t = r / H % T, b = r / (H * T);
        if (team.rank == 0) delta[(b * H + h) * T + t] = s;
    }
}

pytfm_status pytfm__attention_delta_cuda(const char *func, float *delta, const float *dy,
                                         const float *o, int64_t rows, int64_t T, int64_t H,
                                         int64_t D, int32_t precision, void *stream) {
    void (*kernel)(float *, const float *, const float *, int64_t, int64_t, int64_t, int) =
        precision == PYTFM_PRECISION_TF32   ? attention_delta_kernel<PYTFM_PRECISION_TF32>
        : precision == PYTFM_PRECISION_BF16 ? attention_delta_kernel<PYTFM_PRECISION_BF16>
                                            : attention_delta_kernel<PYTFM_PRECISION_FP32>;
    return pytfm__launch(func, kernel,
                         dim3(pytfm__blocks(rows, PYTFM_ROW_THREADS / PYTFM_WARP,
                                            PYTFM_MAX_BLOCKS)),
                         dim3(PYTFM_ROW_THREADS), 0, stream, delta, dy, o, rows, T, H, (int)D);
}

struct backward_args {
    float *dq, *dk, *dv;                       // dq like q; dk, dv like k
    const float *dy, *q, *k, *v, *lse, *delta; // delta [B, H, Tq] from attention_delta_kernel
    const int64_t *q_len, *k_len;              // [B] (device), or NULL: all Tq rows, Tk keys
    int64_t Tq, Tk, H, Hkv, window;
    int D;
    float scale, scale2; // scale, and scale · log2 e
    int causal;
};

template <int DP> static constexpr size_t dkdv_shared() {
    return sizeof(float) * ((size_t)4 * BK * (DP + 4) + (size_t)BK * LDP + 2 * BK);
}

/* dK and dV of a tile of BK keys (rows ty + TY·i of the thread) of key/value head g, walking
 * for each query head of g's group the query tiles of BK rows (the columns tx + 8·j) that see
 * them: Sᵀ = K·Qᵀ, dPᵀ = V·dYᵀ, then dV += Pᵀ·dY and dK += dSᵀ·Q through one shared tile (P
 * first, then dS). */
template <int DP>
static __global__ void __launch_bounds__(BWD_THREADS) attention_dkdv_kernel(backward_args a) {
    constexpr int TY = BWD_THREADS / TX, RM = BWD_RM, LD = DP + 4;
    PYTFM_DYNAMIC_SHARED(float4, smem);
    float *Ks = (float *)smem, *Vs = Ks + BK * LD, *Qs = Vs + BK * LD, *dYs = Qs + BK * LD;
    float *Ps = dYs + BK * LD, *lse2 = Ps + BK * LDP, *dlt = lse2 + BK;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX, D = a.D, D4 = (D + 3) & ~3;
    const int64_t Tq = a.Tq, H = a.H, HD = H * D, Hkv = a.Hkv, KD = Hkv * D, G = H / Hkv;
    const int64_t b = blockIdx.x / Hkv, g = blockIdx.x % Hkv;
    const int64_t j0 = (int64_t)blockIdx.y * BK, kbase = (b * a.Tk * Hkv + g) * D; // (b,0,g,0)
    const int nk = (int)PYTFM_MIN((int64_t)BK, a.Tk - j0);
    // sequence b's rows and keys (clamped, as the forward); keys from kn on get dK = dV = 0
    const int64_t qn = seq_len(a.q_len, b, Tq), kn = seq_len(a.k_len, b, a.Tk);
    // with a window, the rows past j0 + nk − 1 + window − 1 see none of these keys
    int64_t i_end = a.window > 0 ? PYTFM_MIN(qn, j0 + nk - 1 + a.window) : qn;
    if (j0 >= kn) i_end = 0; // no row sees a key of this tile
    const bool vec = (D & 3) == 0, vq = vec && pytfm__aligned4(a.q),
               vdy = vec && pytfm__aligned4(a.dy);
    load_rows<BK, DP, BWD_THREADS>(Ks, a.k + kbase + j0 * KD, KD, nk, D,
                                   vec && pytfm__aligned4(a.k), 1.0f);
    load_rows<BK, DP, BWD_THREADS>(Vs, a.v + kbase + j0 * KD, KD, nk, D,
                                   vec && pytfm__aligned4(a.v), 1.0f);
    float dk[RM][DP / 8] = {}, dv[RM][DP / 8] = {};
    for (int64_t h = g * G; h < (g + 1) * G; h++) {
        const int64_t base = (b * Tq * H + h) * D; // (b, 0, h, 0)
        const float *lse = a.lse + (b * H + h) * Tq, *delta = a.delta + (b * H + h) * Tq;
        // causal: the query rows before j0 see none of these keys (BK rows per query tile too)
        for (int64_t i0 = a.causal ? j0 : 0; i0 < i_end; i0 += BK) {
            // the rows past qn are not loaded: zero q and dy, and unseen below
            const int nq = (int)PYTFM_MIN((int64_t)BK, qn - i0);
            __syncthreads(); // every thread is done with the last query tile
            load_rows<BK, DP, BWD_THREADS>(Qs, a.q + base + i0 * HD, HD, nq, D, vq, 1.0f);
            load_rows<BK, DP, BWD_THREADS>(dYs, a.dy + base + i0 * HD, HD, nq, D, vdy, 1.0f);
            for (int t = threadIdx.x; t < BK; t += BWD_THREADS) {
                lse2[t] = t < nq ? lse[i0 + t] * LOG2E : 0.0f;
                dlt[t] = t < nq ? delta[i0 + t] : 0.0f;
            }
            __syncthreads();
            float p[RM][8], ds[RM][8];
            scores<RM, TY, LD>(p, Ks, Qs, D4, tx, ty);  // Sᵀ: keys × queries
            scores<RM, TY, LD>(ds, Vs, dYs, D4, tx, ty); // dPᵀ
            PYTFM_UNROLL
            for (int i = 0; i < RM; i++) {
                const int64_t key = j0 + ty + TY * i;
                PYTFM_UNROLL
                for (int j = 0; j < 8; j++) {
                    const int r = tx + 8 * j;
                    const bool seen = r < nq && key < kn && (!a.causal || key <= i0 + r) &&
                                      (a.window == 0 || key > i0 + r - a.window);
                    p[i][j] = seen ? exp2f(p[i][j] * a.scale2 - lse2[r]) : 0.0f;
                    ds[i][j] = p[i][j] * (ds[i][j] - dlt[r]);
                    Ps[(ty + TY * i) * LDP + r] = p[i][j];
                }
            }
            __syncthreads(); // Pᵀ is whole
            accumulate<RM, TY, DP>(dv, Ps, dYs, (nq + 3) & ~3, D, tx, ty); // dV += Pᵀ·dY
            __syncthreads(); // every thread is done with Pᵀ
            PYTFM_UNROLL
            for (int i = 0; i < RM; i++)
                PYTFM_UNROLL
                for (int j = 0; j < 8; j++) Ps[(ty + TY * i) * LDP + tx + 8 * j] = ds[i][j];
            __syncthreads(); // dSᵀ is whole
            accumulate<RM, TY, DP>(dk, Ps, Qs, (nq + 3) & ~3, D, tx, ty); // dK += dSᵀ·Q
        }
    }
    const bool vdk = vec && pytfm__aligned4(a.dk), vdv = vec && pytfm__aligned4(a.dv);
    PYTFM_UNROLL
    for (int i = 0; i < RM; i++) {
        const int c = ty + TY * i;
        if (c >= nk) continue;
        store_row<DP>(a.dk + kbase + (j0 + c) * KD, dk[i], a.scale, D, vdk, tx);
        store_row<DP>(a.dv + kbase + (j0 + c) * KD, dv[i], 1.0f, D, vdv, tx);
    }
}

template <int DP> static constexpr size_t dq_shared() {
    return sizeof(float) * ((size_t)4 * BK * (DP + 4) + (size_t)BK * LDP);
}

/* dQ of a tile of BK query rows (ty + TY·i), walking the key tiles (columns tx + 8·j) up to
 * the diagonal when causal: S = Q·Kᵀ, dP = dY·Vᵀ, dS through shared memory, dQ += dS·K. */
template <int DP>
static __global__ void __launch_bounds__(BWD_THREADS) attention_dq_kernel(backward_args a) {
    constexpr int TY = BWD_THREADS / TX, RM = BWD_RM, LD = DP + 4;
    PYTFM_DYNAMIC_SHARED(float4, smem);
    float *Qs = (float *)smem, *dYs = Qs + BK * LD, *Ks = dYs + BK * LD, *Vs = Ks + BK * LD;
    float *dSs = Vs + BK * LD;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX, D = a.D, D4 = (D + 3) & ~3;
    const int64_t Tq = a.Tq, H = a.H, HD = H * D, b = blockIdx.x / H, h = blockIdx.x % H;
    const int64_t KD = a.Hkv * D, kbase = (b * a.Tk * a.Hkv + h / (H / a.Hkv)) * D; // kv head
    // the last query tiles walk the most keys when causal: they go first
    const int64_t i0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * BK, base = (b * Tq * H + h) * D;
    const int nq = (int)PYTFM_MIN((int64_t)BK, Tq - i0);
    // sequence b's rows and keys (clamped, as the forward): nv of the tile's rows are not
    // padding; the others are not loaded (zero q, dy, delta: dS = 0) and get dQ = 0
    const int64_t qn = seq_len(a.q_len, b, Tq), kn = seq_len(a.k_len, b, a.Tk);
    const int nv = qn > i0 ? (int)PYTFM_MIN((int64_t)nq, qn - i0) : 0;
    const bool vec = (D & 3) == 0, vk = vec && pytfm__aligned4(a.k),
               vv = vec && pytfm__aligned4(a.v);
    load_rows<BK, DP, BWD_THREADS>(Qs, a.q + base + i0 * HD, HD, nv, D,
                                   vec && pytfm__aligned4(a.q), 1.0f);
    load_rows<BK, DP, BWD_THREADS>(dYs, a.dy + base + i0 * HD, HD, nv, D,
                                   vec && pytfm__aligned4(a.dy), 1.0f);
    float lse2[RM], dlt[RM], dq[RM][DP / 8] = {};
    PYTFM_UNROLL
    for (int i = 0; i < RM; i++) {
        const int r = ty + TY * i;
        lse2[i] = r < nv ? a.lse[(b * H + h) * Tq + i0 + r] * LOG2E : 0.0f;
        dlt[i] = r < nv ? a.delta[(b * H + h) * Tq + i0 + r] : 0.0f;
    }
    int64_t j_end = a.causal ? PYTFM_MIN(i0 + nv, kn) : kn;
    if (nv == 0) j_end = 0;
    // from the first key of the tile's first row (a window's later rows start later)
    for (int64_t j0 = first_key(a.window, i0); j0 < j_end; j0 += BK) {
        const int nk = (int)PYTFM_MIN((int64_t)BK, j_end - j0);
        __syncthreads(); // every thread is done with the last key tile
        load_rows<BK, DP, BWD_THREADS>(Ks, a.k + kbase + j0 * KD, KD, nk, D, vk, 1.0f);
        load_rows<BK, DP, BWD_THREADS>(Vs, a.v + kbase + j0 * KD, KD, nk, D, vv, 1.0f);
        __syncthreads();
        float s[RM][8], dp[RM][8];
        scores<RM, TY, LD>(s, Qs, Ks, D4, tx, ty);
        scores<RM, TY, LD>(dp, dYs, Vs, D4, tx, ty);
        PYTFM_UNROLL
        for (int i = 0; i < RM; i++) {
            const int r = ty + TY * i;
            PYTFM_UNROLL
            for (int j = 0; j < 8; j++) {
                const int c = tx + 8 * j;
                // no r < nv test: a row past nv has zero q, dy and delta, so its dS is 0
                const bool seen = c < nk && (!a.causal || j0 + c <= i0 + r) &&
                                  (a.window == 0 || j0 + c > i0 + r - a.window);
                const float p = seen ? exp2f(s[i][j] * a.scale2 - lse2[i]) : 0.0f;
                dSs[r * LDP + c] = p * (dp[i][j] - dlt[i]);
            }
        }
        __syncthreads(); // dS is whole
        accumulate<RM, TY, DP>(dq, dSs, Ks, (nk + 3) & ~3, D, tx, ty);
    }
    const bool vdq = vec && pytfm__aligned4(a.dq);
    PYTFM_UNROLL
    for (int i = 0; i < RM; i++) {
        const int r = ty + TY * i;
        if (r < nq) store_row<DP>(a.dq + base + (i0 + r) * HD, dq[i], a.scale, D, vdq, tx);
    }
}

// ---- cache append --------------------------------------------------------------------------

/* cache[b, start + t, h, d] = new[b, t, h, d] for k and v: e walks the new elements, whose
 * per_batch = n_new·H·D are consecutive in the cache too (at b·cache_batch + offset) */
static __global__ void attention_cache_append_kernel(float *k_cache, float *v_cache,
                                                     const float *k, const float *v,
                                                     int64_t count, int64_t per_batch,
                                                     int64_t cache_batch, int64_t offset) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < count;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t dst = e / per_batch * cache_batch + offset + e % per_batch;
        k_cache[dst] = k[e];
        v_cache[dst] = v[e];
    }
}

// ---- launchers -----------------------------------------------------------------------------

/* the padded head dim a D runs in (D <= PYTFM_CUDA_ATTENTION_MAX_D, checked) */
static int head_class(int64_t D) { return D <= 32 ? 32 : D <= 64 ? 64 : 128; }

static pytfm_status check_head_dim(const char *func, int64_t D) {
    PYTFM_CHECK(D <= PYTFM_CUDA_ATTENTION_MAX_D,
                "%s: D must be <= %d (PYTFM_CUDA_ATTENTION_MAX_D, the largest head dim the GPU "
                "kernels take), got %lld",
                func, PYTFM_CUDA_ATTENTION_MAX_D, (long long)D);
    return PYTFM_STATUS_OK;
}

/* batch·heads in gridDim.x (up to 2^31 − 1), `tiles` of rows in gridDim.y (up to 65535) */
static pytfm_status check_grid(const char *func, int64_t BH, int64_t rows, int64_t tile,
                               const char *what) {
    PYTFM_CHECK(BH <= 2147483647, "%s: B·H must be <= 2147483647 (blocks in gridDim.x), got %lld",
                func, (long long)BH);
    PYTFM_CHECK((rows + tile - 1) / tile <= 65535,
                "%s: %s must be <= %lld (65535 tiles of %lld in gridDim.y), got %lld", func, what,
                65535LL * tile, (long long)tile, (long long)rows);
    return PYTFM_STATUS_OK;
}

template <int DP, int RM>
static pytfm_status forward_launch(const char *func, const forward_args &a, int64_t BH,
                                   int64_t splits, void *stream) {
    constexpr int BQ = RM * (FWD_THREADS / TX);
    constexpr size_t bytes = forward_shared<DP, RM>();
    static_assert(DP % 32 == 0 && bytes <= 163 * 1024, "within sm_80's shared memory");
    PYTFM_TRY(pytfm__allow_shared(func, attention_forward_kernel<DP, RM>, bytes));
    const dim3 grid((unsigned)BH, (unsigned)((a.Tq + BQ - 1) / BQ), (unsigned)splits);
    return pytfm__launch(func, attention_forward_kernel<DP, RM>, grid, dim3(FWD_THREADS), bytes,
                         stream, a);
}

/* the forward over every (b, h) and query tile, 64 queries a tile, or 16 (rm = 1) */
static pytfm_status forward_any(const char *func, const forward_args &a, int64_t BH,
                                int64_t splits, int rm, void *stream) {
    switch (head_class(a.D) * 10 + rm) {
    case 321: return forward_launch<32, 1>(func, a, BH, splits, stream);
    case 324: return forward_launch<32, 4>(func, a, BH, splits, stream);
    case 641: return forward_launch<64, 1>(func, a, BH, splits, stream);
    case 644: return forward_launch<64, 4>(func, a, BH, splits, stream);
    case 1281: return forward_launch<128, 1>(func, a, BH, splits, stream);
    default: return forward_launch<128, 4>(func, a, BH, splits, stream);
    }
}

/* q, o [B, Tq, H, D], k, v [B, Tk, Hkv, D], lse [B, H, Tq]; q_len, k_len [B] or NULL (device
 * memory: their values are the caller's to check, the kernels clamp them) */
static pytfm_status check_padded_forward(const char *func, const float *o, const float *lse,
                                         const float *q, const float *k, const float *v,
                                         const int64_t *q_len, const int64_t *k_len, int64_t B,
                                         int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv,
                                         int64_t D, float scale, int32_t causal,
                                         int64_t window) {
    PYTFM_TRY(pytfm__check_attention_signs(func, "Tq", B, Tq, H, D));
    PYTFM_CHECK(Tk >= 0, "%s: Tk must be >= 0, got %lld", func, (long long)Tk);
    PYTFM_TRY(pytfm__check_attention_groups(func, H, Hkv, window, causal));
    PYTFM_CHECK_FINITE_IN(func, scale);
    int64_t n = 0, n_kv = 0, n_lse = 0;
    PYTFM_CHECK_COUNT(func, &n, float, B, Tq, H, D);
    PYTFM_CHECK_COUNT(func, &n_kv, float, B, Tk, Hkv, D);
    PYTFM_CHECK_COUNT(func, &n_lse, float, B, H, Tq);
    PYTFM_CHECK_PTR_IN(func, o, n);
    PYTFM_CHECK_PTR_IN(func, lse, n_lse);
    PYTFM_CHECK_PTR_IN(func, q, n);
    PYTFM_CHECK_PTR_IN(func, k, n_kv);
    PYTFM_CHECK_PTR_IN(func, v, n_kv);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(o, n, float),
                         PYTFM_SPAN(lse, n_lse, float), PYTFM_SPAN(q, n, float),
                         PYTFM_SPAN(k, n_kv, float), PYTFM_SPAN(v, n_kv, float),
                         PYTFM_SPAN(q_len, B, int64_t), PYTFM_SPAN(k_len, B, int64_t));
    return PYTFM_STATUS_OK;
}

/* the padded forward once its arguments are checked (func: the public function, for errors);
 * t_name names Tq in the grid's error ("T" where Tq = Tk) */
static pytfm_status padded_forward(const char *func, const char *t_name, float *o, float *lse,
                                   const float *q, const float *k, const float *v,
                                   const int64_t *q_len, const int64_t *k_len, int64_t B,
                                   int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
                                   float scale, int32_t causal, int64_t window, void *stream) {
    PYTFM_TRY(check_head_dim(func, D));
    if (B * Tq * H == 0) return PYTFM_STATUS_OK;
    // a few queries (a decoding step against an encoder's keys): tiles of 16 rows, not 64
    const int rm = Tq <= FWD_THREADS / TX ? 1 : 4;
    PYTFM_TRY(check_grid(func, B * H, Tq, rm * (FWD_THREADS / TX), t_name));
    forward_args a = {};
    a.o = o, a.lse = lse, a.q = q, a.k = k, a.v = v, a.q_len = q_len, a.k_len = k_len;
    a.Tq = Tq, a.Tk = Tk, a.Ts = Tk, a.H = H, a.Hkv = Hkv, a.window = window;
    a.split_keys = Tk, a.D = (int)D, a.scale2 = scale * LOG2E, a.causal = causal != 0;
    return forward_any(func, a, B * H, 1, rm, stream);
}

extern "C" pytfm_status pytfm_attention_padded_forward_cuda(
    float *o, float *lse, const float *q, const float *k, const float *v, const int64_t *q_len,
    const int64_t *k_len, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
    float scale, int32_t causal, int64_t window, void *stream) {
    PYTFM_TRY(check_padded_forward(__func__, o, lse, q, k, v, q_len, k_len, B, Tq, Tk, H, Hkv, D,
                                   scale, causal, window));
    return padded_forward(__func__, "Tq", o, lse, q, k, v, q_len, k_len, B, Tq, Tk, H, Hkv, D,
                          scale, causal, window, stream);
}

extern "C" pytfm_status pytfm_attention_gqa_forward_cuda(float *o, float *lse, const float *q,
                                                         const float *k, const float *v,
                                                         int64_t B, int64_t T, int64_t H,
                                                         int64_t Hkv, int64_t D, float scale,
                                                         int32_t causal, int64_t window,
                                                         void *stream) {
    PYTFM_TRY(pytfm__check_attention_forward(__func__, o, lse, q, k, v, B, T, H, Hkv, D, scale,
                                             causal, window));
    return padded_forward(__func__, "T", o, lse, q, k, v, nullptr, nullptr, B, T, T, H, Hkv, D,
                          scale, causal, window, stream);
}

extern "C" pytfm_status pytfm_attention_forward_cuda(float *o, float *lse, const float *q,
                                                     const float *k, const float *v, int64_t B,
                                                     int64_t T, int64_t H, int64_t D,
                                                     float scale, int32_t causal, void *stream) {
    PYTFM_TRY(pytfm__check_attention_forward(__func__, o, lse, q, k, v, B, T, H, H, D, scale,
                                             causal, 0));
    return padded_forward(__func__, "T", o, lse, q, k, v, nullptr, nullptr, B, T, T, H, H, D,
                          scale, causal, 0, stream);
}

/* dq, dy, q, o [B, Tq, H, D], dk, dv, k, v [B, Tk, Hkv, D], lse [B, H, Tq]; q_len, k_len as
 * check_padded_forward's */
static pytfm_status check_padded_backward(const char *func, const float *dq, const float *dk,
                                          const float *dv, const float *dy, const float *q,
                                          const float *k, const float *v, const float *o,
                                          const float *lse, const int64_t *q_len,
                                          const int64_t *k_len, int64_t B, int64_t Tq,
                                          int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
                                          float scale, int32_t causal, int64_t window) {
    PYTFM_TRY(pytfm__check_attention_signs(func, "Tq", B, Tq, H, D));
    PYTFM_CHECK(Tk >= 0, "%s: Tk must be >= 0, got %lld", func, (long long)Tk);
    PYTFM_TRY(pytfm__check_attention_groups(func, H, Hkv, window, causal));
    PYTFM_CHECK_FINITE_IN(func, scale);
    int64_t n = 0, n_kv = 0, n_lse = 0;
    PYTFM_CHECK_COUNT(func, &n, float, B, Tq, H, D);
    PYTFM_CHECK_COUNT(func, &n_kv, float, B, Tk, Hkv, D);
    PYTFM_CHECK_COUNT(func, &n_lse, float, B, H, Tq);
    PYTFM_CHECK_PTR_IN(func, dq, n);
    PYTFM_CHECK_PTR_IN(func, dk, n_kv);
    PYTFM_CHECK_PTR_IN(func, dv, n_kv);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, q, n);
    PYTFM_CHECK_PTR_IN(func, k, n_kv);
    PYTFM_CHECK_PTR_IN(func, v, n_kv);
    PYTFM_CHECK_PTR_IN(func, o, n);
    PYTFM_CHECK_PTR_IN(func, lse, n_lse);
    PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dq, n, float),
                         PYTFM_SPAN(dk, n_kv, float), PYTFM_SPAN(dv, n_kv, float),
                         PYTFM_SPAN(dy, n, float), PYTFM_SPAN(q, n, float),
                         PYTFM_SPAN(k, n_kv, float), PYTFM_SPAN(v, n_kv, float),
                         PYTFM_SPAN(o, n, float), PYTFM_SPAN(lse, n_lse, float),
                         PYTFM_SPAN(q_len, B, int64_t), PYTFM_SPAN(k_len, B, int64_t));
    return PYTFM_STATUS_OK;
}

template <int DP>
static pytfm_status backward_launch(const char *func, const backward_args &a, int64_t B,
                                    void *stream) {
    constexpr size_t kv_bytes = dkdv_shared<DP>(), q_bytes = dq_shared<DP>();
    static_assert(DP % 32 == 0 && kv_bytes <= 163 * 1024 && q_bytes <= 163 * 1024,
                  "within sm_80's shared memory");
    const unsigned k_tiles = (unsigned)((a.Tk + BK - 1) / BK);
    const unsigned q_tiles = (unsigned)((a.Tq + BK - 1) / BK);
    // dK, dV: a block per (b, key/value head, key tile); dQ: per (b, head, query tile); none
    // where there are no keys (no rows): the other pass writes its zeros
    if (k_tiles) {
        PYTFM_TRY(pytfm__allow_shared(func, attention_dkdv_kernel<DP>, kv_bytes));
        PYTFM_TRY(pytfm__launch(func, attention_dkdv_kernel<DP>,
                                dim3((unsigned)(B * a.Hkv), k_tiles), dim3(BWD_THREADS),
                                kv_bytes, stream, a));
    }
    if (!q_tiles) return PYTFM_STATUS_OK;
    PYTFM_TRY(pytfm__allow_shared(func, attention_dq_kernel<DP>, q_bytes));
    return pytfm__launch(func, attention_dq_kernel<DP>, dim3((unsigned)(B * a.H), q_tiles),
                         dim3(BWD_THREADS), q_bytes, stream, a);
}

/* the padded backward once its arguments are checked (func, t_name: as padded_forward) */
static pytfm_status padded_backward(const char *func, const char *t_name, float *dq, float *dk,
                                    float *dv, const float *dy, const float *q, const float *k,
                                    const float *v, const float *o, const float *lse,
                                    const int64_t *q_len, const int64_t *k_len, int64_t B,
                                    int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
                                    float scale, int32_t causal, int64_t window, void *stream) {
    PYTFM_TRY(check_head_dim(func, D));
    if (B * H == 0 || Tq + Tk == 0) return PYTFM_STATUS_OK;
    PYTFM_TRY(check_grid(func, B * H, Tq, BK, t_name));
    if (Tk != Tq) PYTFM_TRY(check_grid(func, B * H, Tk, BK, "Tk"));
    float *delta = nullptr;
    PYTFM_TRY(pytfm__stream_scratch(func, &delta, B * H * Tq, stream));
    const int64_t rows = B * Tq * H;
    pytfm_status st = rows == 0 ? PYTFM_STATUS_OK
                                : pytfm__attention_delta_cuda(func, delta, dy, o, rows, Tq, H, D,
                                                              PYTFM_PRECISION_FP32, stream);
    if (st == PYTFM_STATUS_OK) {
        backward_args a = {};
        a.dq = dq, a.dk = dk, a.dv = dv, a.dy = dy, a.q = q, a.k = k, a.v = v, a.lse = lse;
        a.delta = delta, a.q_len = q_len, a.k_len = k_len, a.Tq = Tq, a.Tk = Tk, a.H = H;
        a.Hkv = Hkv, a.window = window, a.D = (int)D, a.scale = scale;
        a.scale2 = scale * LOG2E, a.causal = causal != 0;
        switch (head_class(D)) {
        case 32: st = backward_launch<32>(func, a, B, stream); break;
        case 64: st = backward_launch<64>(func, a, B, stream); break;
        default: st = backward_launch<128>(func, a, B, stream); break;
        }
    }
    return pytfm__stream_scratch_free(func, delta, st, stream);
}

extern "C" pytfm_status pytfm_attention_padded_backward_cuda(
    float *dq, float *dk, float *dv, const float *dy, const float *q, const float *k,
    const float *v, const float *o, const float *lse, const int64_t *q_len, const int64_t *k_len,
    int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D, float scale,
    int32_t causal, int64_t window, void *stream) {
    PYTFM_TRY(check_padded_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, q_len, k_len, B,
                                    Tq, Tk, H, Hkv, D, scale, causal, window));
    return padded_backward(__func__, "Tq", dq, dk, dv, dy, q, k, v, o, lse, q_len, k_len, B, Tq,
                           Tk, H, Hkv, D, scale, causal, window, stream);
}

extern "C" pytfm_status pytfm_attention_gqa_backward_cuda(float *dq, float *dk, float *dv,
                                                          const float *dy, const float *q,
                                                          const float *k, const float *v,
                                                          const float *o, const float *lse,
                                                          int64_t B, int64_t T, int64_t H,
                                                          int64_t Hkv, int64_t D, float scale,
                                                          int32_t causal, int64_t window,
                                                          void *stream) {
    PYTFM_TRY(pytfm__check_attention_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, B, T, H,
                                              Hkv, D, scale, causal, window));
    return padded_backward(__func__, "T", dq, dk, dv, dy, q, k, v, o, lse, nullptr, nullptr, B, T,
                           T, H, Hkv, D, scale, causal, window, stream);
}

extern "C" pytfm_status pytfm_attention_backward_cuda(float *dq, float *dk, float *dv,
                                                      const float *dy, const float *q,
                                                      const float *k, const float *v,
                                                      const float *o, const float *lse,
                                                      int64_t B, int64_t T, int64_t H, int64_t D,
                                                      float scale, int32_t causal,
                                                      void *stream) {
    PYTFM_TRY(pytfm__check_attention_backward(__func__, dq, dk, dv, dy, q, k, v, o, lse, B, T, H,
                                              H, D, scale, causal, 0));
    return padded_backward(__func__, "T", dq, dk, dv, dy, q, k, v, o, lse, nullptr, nullptr, B, T,
                           T, H, H, D, scale, causal, 0, stream);
}

extern "C" pytfm_status pytfm_attention_cache_append_cuda(float *k_cache, float *v_cache,
                                                          const float *k, const float *v,
                                                          int64_t B, int64_t n_new, int64_t H,
                                                          int64_t D, int64_t Tmax,
                                                          int64_t start, void *stream) {
    PYTFM_TRY(pytfm__check_attention_cache_append(__func__, k_cache, v_cache, k, v, B, n_new, H,
                                                  D, Tmax, start));
    const int64_t count = B * n_new * H * D;
    if (count == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(attention_cache_append_kernel,
                        dim3(pytfm__blocks(count, PYTFM_ROW_THREADS, PYTFM_MAX_BLOCKS)),
                        dim3(PYTFM_ROW_THREADS), 0, stream, k_cache, v_cache, k, v, count,
                        n_new * H * D, Tmax * H * D, start * H * D);
}

extern "C" pytfm_status pytfm_attention_gqa_decode_cuda(float *o, float *lse, const float *q,
                                                        const float *k_cache,
                                                        const float *v_cache, int64_t B,
                                                        int64_t n_new, int64_t H, int64_t Hkv,
                                                        int64_t D, int64_t Tmax, int64_t start,
                                                        float scale, int64_t window,
                                                        void *stream) {
    PYTFM_TRY(pytfm__check_attention_decode(__func__, o, lse, q, k_cache, v_cache, B, n_new, H,
                                            Hkv, D, Tmax, start, scale, window));
    PYTFM_TRY(check_head_dim(__func__, D));
    if (B * n_new * H == 0) return PYTFM_STATUS_OK;
    const int rm = n_new <= FWD_THREADS / TX ? 1 : 4; // a token or a few: tiles of 16 queries
    const int64_t BQ = rm * (FWD_THREADS / TX), Tk = start + n_new;
    PYTFM_TRY(check_grid(__func__, B * H, n_new, BQ, "n_new"));
    // the keys any query sees: from the first query's first key (its window's) on
    const int64_t key0 = window > 0 && start - window + 1 > 0 ? start - window + 1 : 0;
    const int64_t keys = Tk - key0;
    forward_args a = {};
    a.o = o, a.lse = lse, a.q = q, a.k = k_cache, a.v = v_cache, a.Tq = n_new, a.Tk = Tk;
    a.Ts = Tmax, a.H = H, a.Hkv = Hkv, a.start = start, a.window = window, a.key0 = key0;
    a.split_keys = keys, a.D = (int)D, a.scale2 = scale * LOG2E, a.causal = 1;
    // too few blocks to fill the GPU: split the keys too, about two blocks per SM in all
    const int64_t blocks = B * H * ((n_new + BQ - 1) / BQ);
    int64_t splits = 1;
    if (blocks < ATTN_SMS) {
        splits = PYTFM_MIN((2 * ATTN_SMS + blocks - 1) / blocks,
                           (keys + SPLIT_MIN_KEYS - 1) / SPLIT_MIN_KEYS);
        a.split_keys = ((keys + splits - 1) / splits + BK - 1) / BK * BK;
        splits = (keys + a.split_keys - 1) / a.split_keys;
    }
    if (splits == 1) {
        a.split_keys = keys;
        return forward_any(__func__, a, B * H, 1, rm, stream);
    }
    // each split's o and lse, laid out like o and lse, then merged
    const int64_t count = B * n_new * H * D, n_lse = B * H * n_new;
    float *scratch = nullptr;
    PYTFM_TRY(pytfm__stream_scratch(__func__, &scratch, splits * (count + n_lse), stream));
    a.o = scratch;
    a.lse = scratch + splits * count;
    a.o_split = count;
    a.lse_split = n_lse;
    pytfm_status st = forward_any(__func__, a, B * H, splits, rm, stream);
    if (st == PYTFM_STATUS_OK)
        st = pytfm__launch(__func__, attention_merge_kernel,
                           dim3(pytfm__blocks(count, PYTFM_ROW_THREADS, PYTFM_MAX_BLOCKS)),
                           dim3(PYTFM_ROW_THREADS), 0, stream, o, lse, (const float *)a.o,
                           (const float *)a.lse, n_new, H, (int)D, count, (int)splits, count,
                           n_lse);
    return pytfm__stream_scratch_free(__func__, scratch, st, stream);
}

extern "C" pytfm_status pytfm_attention_decode_cuda(float *o, float *lse, const float *q,
                                                    const float *k_cache, const float *v_cache,
                                                    int64_t B, int64_t n_new, int64_t H,
                                                    int64_t D, int64_t Tmax, int64_t start,
                                                    float scale, void *stream) {
    PYTFM_TRY(pytfm__check_attention_decode(__func__, o, lse, q, k_cache, v_cache, B, n_new, H, H,
                                            D, Tmax, start, scale, 0));
    PYTFM_TRY(check_head_dim(__func__, D));
    return pytfm_attention_gqa_decode_cuda(o, lse, q, k_cache, v_cache, B, n_new, H, H, D, Tmax,
                                           start, scale, 0, stream);
}
