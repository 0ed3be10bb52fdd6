/*
 * sgemm.cu — C = β·C + op(A)·op(B) on the GPU, row-major float32; the twin of csrc/kernels/sgemm.c,
 * and the engine of the linear layer.
 *
 *   c [m, n]; a [m, k] ([k, m] with trans_a); b [k, n] ([n, k] with trans_b)
 *
 * β = 0 does not read C (NaN in C does not leak); k = 0 gives β·C. Two kernels:
 *
 * pytfm_sgemm_plain_cuda, the plain tiled kernel, kept as the oracle the fast one is tested
 * against (as pytfm_sgemm_plain is on the CPU): a block of 256 threads owns a 64×64 tile of C.
 * For each slice of 16 along k, the threads copy the 64×16 piece of op(A) and the 16×64 piece
 * of op(B) into shared memory (zero past the edges, so no bounds test in the inner loop), wait,
 * then each thread accumulates its 4×4 outputs in registers from 4 + 4 shared loads per step of
 * k (register blocking: 16 FMAs per 8 loads). Thread (tx, ty) owns rows ty + 16i and columns
 * tx + 16j, so a warp reads Bs rows without bank conflicts and writes C in 64-byte runs.
 *
 * pytfm_sgemm_cuda, the fast one (siboehm's SGEMM_CUDA kernels 5–10 and llm.c's matmul in
 * outline): 2-D block tiling with 8×8 outputs per thread in registers, warp tiling, 128-bit
 * loads, double buffering with cp.async.
 *  - Tiles per size class: 128×128 (256 threads, 8×8 each, a warp 32×64) when there are at
 *    least two per SM (the two blocks an SM holds at once), else 64×64 (128 threads, 4×8 each)
 *    so that a product such as 1024×1024 (64 big tiles for 132 SMs) still fills the GPU.
 *    A block per tile, all in gridDim.x (any m and n: no 65535 cap), GROUP tile rows at a time
 *    down their columns (neighbouring blocks share rows of A and columns of B in L2).
 *  - Shared tiles are k-major, As [FK][BM + 4] and Bs [FK][BN + 4] (FK = 8), twice (double
 *    buffering): per step of k a thread reads its rows and columns as TM/4 + TN/4 float4s (a
 *    warp: 4 broadcast A reads, 8 consecutive B reads, no bank conflicts) for TM·TN FMAs:
 *    8×8 outputs, 64 FMAs per 4 shared loads (the plain kernel: 16 per 8).
 *  - Loads without transposing copies, whatever the layout: an operand whose rows in memory are
 *    k (Aᵀ when trans_a, B when not) lies in the shared tile as in memory and goes there by
 *    cp.async (sm_80+: no registers, no wait until the slice is needed); one whose rows are k
 *    long (A when not trans_a, Bᵀ when trans_b) is read as float4s along k into registers
 *    while the current slice's products run, and stored transposed after them (the + 4 pad
 *    spreads those stores over all 32 banks). The linear layer's products: y = x·Wᵀ
 *    (trans_b) both staged, dx = dy·W one of each, dW = dyᵀ·x (trans_a) both by cp.async.
 *  - float4 (16-byte cp.async, LDG.128, STG.128) where the operand's base is 16-byte aligned
 *    and its row length a multiple of 4; 4-byte cp.async and scalar loads otherwise (a CuPy
 *    view offset by a float). Edges are zero-filled (cp.async's src-size 0), stores masked.
 *  - One barrier per slice: after it the next slice is in (cp.async.wait_group 0 before it)
 *    and the buffer just read is free for the slice after.
 * The sum over k runs in order with fmaf from 0, as in the plain kernel: the two give the same
 * bits (β = 0).
 *
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "pytfm_cuda.cuh"

/* ---- the plain kernel: the oracle ----------------------------------------------------- */

enum { BM = 64, BN = 64, BK = 16, TM = 4, TN = 4, THREADS = (BM / TM) * (BN / TN) };

static __global__ void __launch_bounds__(THREADS)
sgemm_plain_kernel(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
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

/* ---- the fast kernel ------------------------------------------------------------------ */

#ifdef PYTFM_EMULATE
// a one-SM "GPU", so that the tests' small products take the big tiles too
enum { SGEMM_SMS = 1 };
#else
// an H200 has 132 SMs (a smaller GPU runs the same tiles in more waves)
enum { SGEMM_SMS = 132 };
#endif

enum {
    FK = 8,    // the k-slice of a shared tile (one barrier per FK steps of k)
    PAD = 4,   // floats past each shared row: a float4 apart, so the transposing stores of the
               // staged loads fall in 32 distinct banks (row stride ≡ 4 banks mod 32)
    GROUP = 8, // tile rows walked together (see the tile order below)
};

/* A class of tiles: each thread TM×TN outputs (TM, TN ∈ {4, 8}: one or two float4 in a row
 * and a column), a warp 4 × 8 threads (4·TM rows × 8·TN columns), a block WM × WN warps. */
template <int TM_, int TN_, int WM_, int WN_, int MIN_BLOCKS_> struct Tile {
    static constexpr int TM = TM_, TN = TN_, WM = WM_, WN = WN_, MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr int BM = WM * 4 * TM, BN = WN * 8 * TN, THREADS = WM * WN * 32;
    static constexpr int LDA = BM + PAD, LDB = BN + PAD; // shared row strides
    static constexpr size_t SHARED = 2 * FK * (LDA + LDB) * sizeof(float); // both buffers
};
using Big = Tile<8, 8, 4, 2, 2>;   // 128×128, 256 threads, 2 blocks per SM (≤ 128 registers)
using Small = Tile<4, 8, 4, 1, 4>; // 64×64, 128 threads: when the big tiles cannot fill the GPU

/* op(A)'s rows of k when trans_a (a [k, m]), op(B)'s when not (b [k, n]): rows p of k, columns
 * x < extent, row stride extent. Each slice [p0, p0 + FK) × [x0, x0 + X) goes with cp.async
 * into S [FK][X + PAD] as it lies (no transpose, no registers); zero past the edges. vec: the
 * base 16-byte aligned and extent % 4 == 0 (then every float4 is aligned and wholly in or out);
 * otherwise 4-byte copies (a CuPy view offset by a float). */
template <int X, int NT> struct AsyncLoader {
    static constexpr int C = X / 4, N = FK * C / NT;
    static_assert(FK * C % NT == 0, "whole chunks per thread");
    const float *src[N]; // this thread's chunk r of the next slice
    int cols[N];         // how many of its 4 floats lie inside the operand

    __device__ __forceinline__ void start(const float *g, int64_t extent, int64_t x0) {
        PYTFM_UNROLL
        for (int r = 0; r < N; r++) {
            const int e = threadIdx.x + r * NT, p = e / C, x = e % C * 4;
            const int64_t left = extent - x0 - x;
            src[r] = g + p * extent + x0 + x;
            cols[r] = left < 0 ? 0 : left < 4 ? (int)left : 4;
        }
    }

    /* the slice at p0 into S (g: a valid address for the copies that read nothing), then on
     * to the next one, FK rows (stride floats) down */
    __device__ __forceinline__ void issue(float *S, const float *g, int64_t k, int64_t p0,
                                          int64_t stride, bool vec) {
        PYTFM_UNROLL
        for (int r = 0; r < N; r++) {
            const int e = threadIdx.x + r * NT, p = e / C, x = e % C * 4;
            float *d = S + p * (X + PAD) + x;
            const bool in = p0 + p < k;
            if (vec) {
                const int bytes = in ? 4 * cols[r] : 0;
                pytfm__cp_async16(d, bytes ? src[r] : g, bytes);
            } else {
                PYTFM_UNROLL
                for (int q = 0; q < 4; q++) {
                    const bool ok = in && q < cols[r];
                    pytfm__cp_async4(d + q, ok ? src[r] + q : g, ok ? 4 : 0);
                }
            }
            src[r] += stride;
        }
    }
};

/* op(A) when not trans_a (a [m, k]), op(B) when trans_b (b [n, k]): rows x < extent, k along
 * the row. Each slice [x0, x0 + X) × [p0, p0 + FK) is loaded into registers (a float4 of 4
 * consecutive k per chunk, coalesced: two threads read a row's 32 bytes) and stored transposed
 * into S [FK][X + PAD] after the current slice's products, so those hide the loads' latency.
 * vec: the base 16-byte aligned and k % 4 == 0; otherwise scalar loads. */
template <int X, int NT> struct Staged {
    static constexpr int C = FK / 4, N = X * C / NT;
    static_assert(X * C % NT == 0, "whole chunks per thread");
    float4 v[N];
    const float *src[N]; // this thread's chunk r of the next slice
    bool row[N];         // whether its row lies inside the operand

    __device__ __forceinline__ void start(const float *g, int64_t extent, int64_t k,
                                          int64_t x0) {
        PYTFM_UNROLL
        for (int r = 0; r < N; r++) {
            const int e = threadIdx.x + r * NT, x = e / C, p = e % C * 4;
            src[r] = g + (x0 + x) * k + p;
            row[r] = x0 + x < extent;
        }
    }

    /* the slice at p0 into registers, then on to the next one, FK floats along */
    __device__ __forceinline__ void load(int64_t k, int64_t p0, bool vec) {
        PYTFM_UNROLL
        for (int r = 0; r < N; r++) {
            const int e = threadIdx.x + r * NT, p = e % C * 4;
            const int64_t gp = p0 + p;
            const float *s = src[r];
            float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (row[r]) {
                if (vec) {
                    if (gp < k) t = pytfm__load4(s);
                } else {
                    if (gp < k) t.x = s[0];
                    if (gp + 1 < k) t.y = s[1];
                    if (gp + 2 < k) t.z = s[2];
                    if (gp + 3 < k) t.w = s[3];
                }
            }
            v[r] = t;
            src[r] += FK;
        }
    }

    __device__ __forceinline__ void store(float *S) const {
        PYTFM_UNROLL
        for (int r = 0; r < N; r++) {
            const int e = threadIdx.x + r * NT, x = e / C, p = e % C * 4;
            S[(p + 0) * (X + PAD) + x] = v[r].x;
            S[(p + 1) * (X + PAD) + x] = v[r].y;
            S[(p + 2) * (X + PAD) + x] = v[r].z;
            S[(p + 3) * (X + PAD) + x] = v[r].w;
        }
    }
};

/* The first row and column of C's tile t: GROUP tile rows at a time, down their columns, so
 * that the blocks running together share rows of A and columns of B in L2. */
template <int BM, int BN>
static __device__ __forceinline__ void tile_origin(int64_t t, int64_t tiles_m, int64_t tiles_n,
                                                   int64_t *bm, int64_t *bn) {
    const int64_t span = GROUP * tiles_n, first = t / span * GROUP;
    const int64_t rows = PYTFM_MIN(tiles_m - first, (int64_t)GROUP);
    *bm = (first + t % span % rows) * BM;
    *bn = t % span / rows * BN;
}

/* C = β·C + op(A)·op(B), a T::BM × T::BN tile of C per block (tile_origin(blockIdx.x)).
 * vec: bit 0 A, bit 1 B, bit 2 C take float4s. */
template <class T, bool TA, bool TB>
static __global__ void __launch_bounds__(T::THREADS, T::MIN_BLOCKS)
sgemm_fast_kernel(float *__restrict__ c, const float *__restrict__ a,
                  const float *__restrict__ b, int64_t m, int64_t n, int64_t k, float beta,
                  int vec) {
    constexpr int TM = T::TM, TN = T::TN, BM = T::BM, BN = T::BN, NT = T::THREADS;
    constexpr int LDA = T::LDA, LDB = T::LDB;
    PYTFM_DYNAMIC_SHARED(float, smem);
    float *const As = smem, *const Bs = smem + 2 * FK * LDA; // [2][FK][LDA], [2][FK][LDB]
    const bool va = vec & 1, vb = vec & 2, vc = vec & 4;
    // thread (lane / 8, lane % 8) of warp (wm, wn): rows r0 + 16g + q (g < TM/4), columns
    // c0 + 32g + q (g < TN/4), q < 4: a warp's float4 reads of a B row are 8 distinct
    // consecutive ones, of an A row 4 broadcast ones (no bank conflicts); its stores of C are
    // 128-byte runs
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int r0 = warp / T::WN * 4 * TM + lane / 8 * 4, c0 = warp % T::WN * 8 * TN + lane % 8 * 4;
    int64_t bm, bn; // the tile's first row and column
    tile_origin<BM, BN>(blockIdx.x, (m + BM - 1) / BM, (n + BN - 1) / BN, &bm, &bn);
    const int64_t slices = (k + FK - 1) / FK;
    AsyncLoader<BM, NT> la;
    AsyncLoader<BN, NT> lb;
    Staged<BM, NT> sa;
    Staged<BN, NT> sb;
    float acc[TM][TN];
    PYTFM_UNROLL
    for (int i = 0; i < TM; i++)
        PYTFM_UNROLL
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;

    if (TA) la.start(a, m, bm);
    else sa.start(a, m, k, bm);
    if (!TB) lb.start(b, n, bn);
    else sb.start(b, n, k, bn);
    if (slices > 0) { // slice 0 into buffer 0
        if (TA) la.issue(As, a, k, 0, FK * m, va);
        else sa.load(k, 0, va), sa.store(As);
        if (!TB) lb.issue(Bs, b, k, 0, FK * n, vb);
        else sb.load(k, 0, vb), sb.store(Bs);
        pytfm__cp_async_commit();
        pytfm__cp_async_wait<0>();
        __syncthreads();
    }
    for (int64_t s = 0; s < slices; s++) {
        const int cur = (int)(s & 1); // the buffer of this slice
        const float *Ac = As + cur * FK * LDA, *Bc = Bs + cur * FK * LDB;
        float *An = As + (cur ^ 1) * FK * LDA, *Bn = Bs + (cur ^ 1) * FK * LDB;
        const bool next = s + 1 < slices;
        if (next) { // the next slice starts on its way into the other buffer
            const int64_t p1 = (s + 1) * FK;
            if (TA) la.issue(An, a, k, p1, FK * m, va);
            else sa.load(k, p1, va);
            if (!TB) lb.issue(Bn, b, k, p1, FK * n, vb);
            else sb.load(k, p1, vb);
            pytfm__cp_async_commit();
        }
        PYTFM_UNROLL
        for (int p = 0; p < FK; p++) { // TM·TN FMAs per TM/4 + TN/4 float4 shared loads
            float ra[TM], rb[TN];
            PYTFM_UNROLL
            for (int g = 0; g < TM / 4; g++) {
                const float4 v = pytfm__load4(Ac + p * LDA + r0 + 16 * g);
                ra[4 * g] = v.x, ra[4 * g + 1] = v.y, ra[4 * g + 2] = v.z, ra[4 * g + 3] = v.w;
            }
            PYTFM_UNROLL
            for (int g = 0; g < TN / 4; g++) {
                const float4 v = pytfm__load4(Bc + p * LDB + c0 + 32 * g);
                rb[4 * g] = v.x, rb[4 * g + 1] = v.y, rb[4 * g + 2] = v.z, rb[4 * g + 3] = v.w;
            }
            PYTFM_UNROLL
            for (int i = 0; i < TM; i++)
                PYTFM_UNROLL
                for (int j = 0; j < TN; j++) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
        }
        if (next) {
            if (!TA) sa.store(An);
            if (TB) sb.store(Bn);
        }
        pytfm__cp_async_wait<0>();
        __syncthreads(); // the next slice is in for everyone, and buffer cur free again
    }

    float *const corner = c + (bm + r0) * n + bn + c0; // this thread's first output
    const int64_t rows_in = m - bm - r0, cols_in = n - bn - c0; // may be <= 0
    PYTFM_UNROLL
    for (int i = 0; i < TM; i++) {
        const int di = 16 * (i / 4) + i % 4;
        if (di >= rows_in) continue;
        float *crow = corner + di * n;
        PYTFM_UNROLL
        for (int g = 0; g < TN / 4; g++) {
            const int dj = 32 * g;
            const float *v = &acc[i][4 * g];
            if (vc && dj + 3 < cols_in) {
                float4 o = make_float4(v[0], v[1], v[2], v[3]);
                if (beta != 0.0f) {
                    const float4 old = pytfm__load4(crow + dj);
                    o.x = beta * old.x + v[0];
                    o.y = beta * old.y + v[1];
                    o.z = beta * old.z + v[2];
                    o.w = beta * old.w + v[3];
                }
                pytfm__store4(crow + dj, o);
            } else {
                PYTFM_UNROLL
                for (int q = 0; q < 4; q++)
                    if (dj + q < cols_in)
                        crow[dj + q] = beta == 0.0f ? v[q] : beta * crow[dj + q] + v[q];
            }
        }
    }
}

/* ---- host launchers ------------------------------------------------------------------- */

extern "C" pytfm_status pytfm_sgemm_plain_cuda(float *c, const float *a, const float *b,
                                               int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                               int32_t trans_b, float beta, void *stream) {
    PYTFM_TRY(pytfm__check_sgemm(__func__, c, a, b, m, n, k, beta));
    PYTFM_CHECK((n + BN - 1) / BN <= 65535, "%s: n must be <= %d, got %lld", __func__,
                65535 * BN, (long long)n);
    static_assert(THREADS == 256 && BM * BK % THREADS == 0 && BK * BN % THREADS == 0,
                  "each thread copies whole tiles' worth");
    if (m == 0 || n == 0) return PYTFM_STATUS_OK;
    const dim3 grid(pytfm__blocks(m, BM, 2147483647), pytfm__blocks(n, BN, 65535));
    return PYTFM_LAUNCH(sgemm_plain_kernel, grid, dim3(THREADS), 0, stream, c, a, b, m, n, k,
                        trans_a, trans_b, beta);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <class T>
static pytfm_status launch_fast(const char *func, float *c, const float *a, const float *b,
                                int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                                float beta, void *stream) {
    static_assert(T::SHARED <= 48 * 1024, "no opt-in needed");
    // vectorised along each operand's contiguous axis where its base allows
    const int vec = (aligned16(a) && (trans_a ? m : k) % 4 == 0) |
                    (aligned16(b) && (trans_b ? k : n) % 4 == 0) << 1 |
                    (aligned16(c) && n % 4 == 0) << 2;
    // a block per tile in gridDim.x: 2^31 − 1 of them are 35 TB of C at the least
    const int64_t tiles = ((m + T::BM - 1) / T::BM) * ((n + T::BN - 1) / T::BN);
    PYTFM_CHECK(tiles <= 2147483647, "%s: m·n must be under 2^31 tiles of %d×%d, got %lld×%lld",
                func, T::BM, T::BN, (long long)m, (long long)n);
    const dim3 grid((unsigned)tiles), block(T::THREADS);
    void (*kernel)(float *, const float *, const float *, int64_t, int64_t, int64_t, float,
                   int) = trans_a ? trans_b ? sgemm_fast_kernel<T, true, true>
                                            : sgemm_fast_kernel<T, true, false>
                                  : trans_b ? sgemm_fast_kernel<T, false, true>
                                            : sgemm_fast_kernel<T, false, false>;
    return pytfm__launch(func, kernel, grid, block, T::SHARED, stream, c, a, b, m, n, k, beta,
                         vec);
}

extern "C" pytfm_status pytfm_sgemm_cuda(float *c, const float *a, const float *b, int64_t m,
                                         int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                                         float beta, void *stream) {
    PYTFM_TRY(pytfm__check_sgemm(__func__, c, a, b, m, n, k, beta));
    if (m == 0 || n == 0) return PYTFM_STATUS_OK;
    // the big tiles when they give every SM the two blocks it holds at once, else 4× as many
    // small ones (m = n = 1024: 64 big tiles, 256 small)
    const int64_t big = ((m + Big::BM - 1) / Big::BM) * ((n + Big::BN - 1) / Big::BN);
    if (big >= (int64_t)Big::MIN_BLOCKS * SGEMM_SMS)
        return launch_fast<Big>(__func__, c, a, b, m, n, k, trans_a != 0, trans_b != 0, beta,
                                stream);
    return launch_fast<Small>(__func__, c, a, b, m, n, k, trans_a != 0, trans_b != 0, beta,
                              stream);
}
