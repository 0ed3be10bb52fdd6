/*
 * sgemm.c — C = β·C + op(A)·op(B) in float32, row-major: the three products of a linear layer.
 *
 *   op(A) [m, k]: A stored [m, k], or [k, m] when trans_a (then op(A) = Aᵀ)
 *   op(B) [k, n]: B stored [k, n], or [n, k] when trans_b
 *   C [m, n]; β = 0 writes C without reading it, β = 1 accumulates
 *   linear forward y = x·Wᵀ: (x, W, trans_b);  dx = dy·W: (dy, W);
 *   dW += dyᵀ·x: (dy, x, trans_a, β = 1)
 *
 * The plain kernel is the obviously-correct loop, kept as the oracle and as the path for CPUs
 * without AVX2. The fast ones follow BLIS (Van Zee & van de Geijn, "BLIS: A Framework for
 * Rapidly Instantiating BLAS Functionality", 2015): each thread owns a band of C's rows or of
 * its columns (whichever side is longer), and for each NC-wide panel of its columns of B and
 * each KC-deep slice of k it copies ("packs") that part of op(B) into micro-panels of NR
 * columns, then for each MC-row block of op(A) (packed into micro-panels of MR rows when that
 * pays, see pack_a_pays; else read in place) runs an MR×NR register micro-kernel over every
 * (rows of A, micro-panel of B) pair. The micro-kernel keeps its MR×NR tile of C in registers
 * for the whole KC slice: MR·NR/8 (AVX2) or MR·NR/16 (AVX-512) accumulators, the broadcast A
 * value fused into the FMA. Packing turns the transposes into copies and zero-pads ragged
 * edges; the tile's ragged edge is written through a mask. An optional epilogue (the linear
 * layer's bias and GELU, internal.h) runs on each MC×NC block of C after its last k slice,
 * while the block is in L2, a row of up to NC floats per call: per 8×32 tile instead, GELU's
 * row kernel would run on 32 floats at a time, too few to pay for its call.
 * The blocking, chosen by timing pytfm_sgemm on a 2-core Zen 4 EPYC (32 KiB L1d and 1 MiB L2
 * per core, 32 MiB L3; the figures are in docs/performance.md):
 *  - MC × KC × NC = 144 × 384 × 2048: the MC×KC block of A (216 KiB) sits in L2, the KC×NR
 *    micro-panel of B (48 KiB for AVX-512) in L1 and L2, the KC×NC panel of B (3 MiB) in L3,
 *    from where each micro-panel is read once per MC rows; the deep k slice means C is read
 *    and written seldom.
 *  - C's tile is prefetched when the micro-kernel starts (prefetch_c): it is read and written
 *    once per k slice, rows n floats apart, from L3 at large n.
 *  - the packing copies are fixed-size inline copies (not memcpy calls), 8×8 AVX2 transposes
 *    for the transposing ones (op(B) of y = x·Wᵀ, op(A) when packed untransposed), and fetch
 *    the next rows ahead (prefetch_row).
 *  - each thread packs its own panels (blocking, below), so the threads share no barrier that
 *    a busy neighbour on one core could stall the other on.
 * The packing buffers are scratch, allocated once per call (pytfm__scratch): per thread, 216
 * KiB for A when it is packed and one KC×NC slice of B (less for a narrow C): at most 3.2 MiB.
 * Every element of C is summed by one thread in one fixed order (the k slices in turn, each in
 * p order), so the result does not depend on the thread count.
 */
#include <stdlib.h>
#include <string.h>

#include "core/checks.h"
#include "tile_avx512.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define PYTFM_HAVE_X86_KERNELS 1
#include <immintrin.h>
#endif

/* element (i, p) of op(A) and (p, j) of op(B) */
#define OPA(i, p) (trans_a ? a[(p) * m + (i)] : a[(i) * k + (p)])
#define OPB(p, j) (trans_b ? b[(j) * k + (p)] : b[(p) * n + (j)])

static void sgemm_plain(float *c, const float *a, const float *b, int64_t m, int64_t n,
                        int64_t k, int trans_a, int trans_b, float beta) {
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
}

/* The BF16 product's plain loop: sgemm_plain's loops and operations, each element of A and B
 * rounded to BF16 as it is read (so the same bits as sgemm_plain on rounded copies) */
#define RA(i, p) pytfm__bf16_round(OPA(i, p))
static void sgemm_plain_bf16(float *c, const float *a, const float *b, int64_t m, int64_t n,
                             int64_t k, int trans_a, int trans_b, float beta) {
    PYTFM_PARALLEL_FOR
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * n; // (n)
        if (trans_b) {
            for (int64_t j = 0; j < n; j++) {
                float acc = 0.0f;
                for (int64_t p = 0; p < k; p++) acc += RA(i, p) * pytfm__bf16_round(b[j * k + p]);
                ci[j] = beta == 0.0f ? acc : beta * ci[j] + acc;
            }
        } else {
            for (int64_t j = 0; j < n; j++) ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
            for (int64_t p = 0; p < k; p++) {
                const float aip = RA(i, p), *bp = b + p * n;
                for (int64_t j = 0; j < n; j++) ci[j] += aip * pytfm__bf16_round(bp[j]);
            }
        }
    }
}
#undef RA

/* ---- the blocked driver, shared by the micro-kernels ------------------------------------- */

enum { MC = 144, KC = 384, NC = 2048 };

/* count floats from src to dst. For the micro-tile widths the size is a constant, which the
 * compiler turns into a few vector moves: a call to memcpy for 32 bytes costs more than the
 * copy. */
static inline void copy_floats(float *dst, const float *src, int count) {
    switch (count) {
    case 6: memcpy(dst, src, 6 * sizeof(float)); break;
    case 8: memcpy(dst, src, 8 * sizeof(float)); break;
    case 16: memcpy(dst, src, 16 * sizeof(float)); break;
    case 32: memcpy(dst, src, 32 * sizeof(float)); break;
    default: memcpy(dst, src, (size_t)count * sizeof(float));
    }
}

/* The copies below read short pieces of rows a row apart (n or m floats: 2 KiB at n = 512), a
 * stride the hardware prefetchers follow late or not at all: fetch the piece PF_AHEAD rows on
 * while copying this one (within the k slice). */
enum { PF_AHEAD = 16 };
static inline void prefetch_row(const float *p, int count) {
    __builtin_prefetch(p);
    __builtin_prefetch(p + count - 1);
}

/* dst[p·ldd + r] = src[r·lds + p] for r, p < 8: the transposing copies of the packing, eight
 * rows at a time (a scalar loop would write each float to its own place, a column apart) */
#ifdef PYTFM_HAVE_X86_KERNELS
__attribute__((target("avx2"))) static void transpose8(float *dst, int64_t ldd, const float *src,
                                                       int64_t lds) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i += 2) { // pairs of rows interleaved
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { // quads of rows: 4 floats of one column in each half
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) { // the two quads' halves: whole columns
        _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
#else
static void transpose8(float *dst, int64_t ldd, const float *src, int64_t lds) {
    for (int p = 0; p < 8; p++)
        for (int r = 0; r < 8; r++) dst[p * ldd + r] = src[r * lds + p];
}
#endif

/* dst[p·ldd + r] = src[r·lds + p] for r < rows, p < kc; 0 for rows <= r < width (a multiple of
 * 8 or not: the tail goes one float at a time) */
static void pack_transposed(float *dst, int64_t ldd, const float *src, int64_t lds, int rows,
                            int width, int64_t kc) {
    int r = 0;
    for (; r + 8 <= rows; r += 8) {
        int64_t p = 0;
        for (; p + 8 <= kc; p += 8) transpose8(dst + p * ldd + r, ldd, src + r * lds + p, lds);
        for (; p < kc; p++)
            for (int i = r; i < r + 8; i++) dst[p * ldd + i] = src[i * lds + p];
    }
    for (int64_t p = 0; p < kc; p++)
        for (int i = r; i < width; i++) dst[p * ldd + i] = i < rows ? src[i * lds + p] : 0.0f;
}

/* rows [i0, i0+mc) × k slice [p0, p0+kc) of op(A) into micro-panels of mr rows: panel q holds,
 * for each p, the mr values op(A)[i0 + q·mr .. +mr, p0 + p] (zeros past mc). */
static void pack_a(float *dst, const pytfm__product *g, int mr, int64_t i0, int64_t mc,
                   int64_t p0, int64_t kc) {
    const float *a = g->a;
    const int64_t m = g->m, k = g->k;
    for (int64_t ir = 0; ir < mc; ir += mr, dst += mr * kc) {
        const int rows = (int)PYTFM_MIN(mr, mc - ir);
        if (g->trans_a && rows == mr) // the mr values for one p are contiguous in a
            for (int64_t p = 0; p < kc; p++) {
                if (p + PF_AHEAD < kc) prefetch_row(a + (p0 + p + PF_AHEAD) * m + i0 + ir, mr);
                copy_floats(dst + p * mr, a + (p0 + p) * m + i0 + ir, mr);
            }
        else if (g->trans_a)
            for (int64_t p = 0; p < kc; p++) {
                const float *src = a + (p0 + p) * m + i0 + ir;
                for (int r = 0; r < mr; r++) dst[p * mr + r] = r < rows ? src[r] : 0.0f;
            }
        else // each row of a is contiguous: a transposing copy
            pack_transposed(dst, mr, a + (i0 + ir) * k + p0, k, rows, mr, kc);
    }
}

/* Whether to pack op(A). The micro-kernel can read A's rows in place, which saves the copy
 * (up to a quarter of the time at n = 128, where each packed panel serves only n/nr
 * micro-tiles); but a transposed A would be read with a stride of m floats per step, and at
 * m = 1024 those all fall into one L1 set: pack it, and whenever n is wide enough to pay for
 * the copy. B is always packed: its panel serves every row of the thread's band. A BF16
 * product packs A always: its values are rounded in the packed copy. */
static int pack_a_pays(const pytfm__product *g) {
    return g->trans_a || g->n >= 512 || g->precision == PYTFM_PRECISION_BF16;
}

/* The BF16 products where the CPU has no BF16 instructions: a packed panel of count floats
 * rounded to BF16 in place, so that the FP32 micro-kernels multiply the rounded values
 * (products of two BF16 values are exact in float32: the result is the same product). The
 * packed kernels run on AVX2 and up. */
#ifdef PYTFM_HAVE_X86_KERNELS
__attribute__((target("avx2")))
#endif
static void round_panel(float *p, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        uint32_t u;
        memcpy(&u, p + i, sizeof u);
        u = pytfm__bf16_round_bits(u);
        memcpy(p + i, &u, sizeof u);
    }
}

/* k slice [p0, p0+kc) × columns [j0, j0+nc) of op(B) into micro-panels of nr columns */
static void pack_b(float *dst, const pytfm__product *g, int nr, int64_t p0, int64_t kc,
                   int64_t j0, int64_t nc) {
    const float *b = g->b;
    const int64_t n = g->n, k = g->k;
    for (int64_t jr = 0; jr < nc; jr += nr, dst += nr * kc) {
        const int cols = (int)PYTFM_MIN(nr, nc - jr);
        if (g->trans_b) // column j of op(B) is row j of b: a transposing copy
            pack_transposed(dst, nr, b + (j0 + jr) * k + p0, k, cols, nr, kc);
        else if (cols == nr) // a row of the panel is nr contiguous floats of b
            for (int64_t p = 0; p < kc; p++) {
                if (p + PF_AHEAD < kc) prefetch_row(b + (p0 + p + PF_AHEAD) * n + j0 + jr, nr);
                copy_floats(dst + p * nr, b + (p0 + p) * n + j0 + jr, nr);
            }
        else
            for (int64_t p = 0; p < kc; p++) {
                const float *src = b + (p0 + p) * n + j0 + jr;
                for (int j = 0; j < nr; j++) dst[p * nr + j] = j < cols ? src[j] : 0.0f;
            }
    }
}

void pytfm__product_finish(const pytfm__product *g, float *c, int64_t i0, int64_t j0,
                           int64_t rows, int64_t cols) {
    const pytfm__epilogue *e = g->epilogue;
    for (int64_t r = 0; r < rows; r++) {
        float *cr = c + r * g->n;
        if (e->bias)
            for (int64_t j = 0; j < cols; j++) cr[j] += e->bias[j0 + j];
        if (e->act) e->gelu_row(e->act + (i0 + r) * g->n + j0, cr, cols);
    }
}

/* rows [i0, i1) of C against the packed slice pb of op(B) (columns [jc, jc+nc), k slice
 * [pc, pc+kc)); pa is this thread's buffer for packed panels of op(A), NULL to read A in place */
static void rows_times_panel(const pytfm__product *g, const pytfm__micro *uk, float *pa,
                             const float *pb, int64_t i0, int64_t i1, int64_t jc, int64_t nc,
                             int64_t pc, int64_t kc) {
    const int mr = uk->mr, nr = uk->nr;
    const float bt = pc == 0 ? g->beta : 1.0f; // later slices add to what is there
    const int last = pc + kc == g->k && g->epilogue; // the tiles are finished: the epilogue
    for (int64_t ic = i0; ic < i1; ic += MC) {
        const int64_t mc = PYTFM_MIN(MC, i1 - ic);
        // op(A) element (i, p) at a[i·a_sr + p·a_sp]: A's own rows, or packed panels
        const float *a = g->a + ic * g->k + pc;
        int64_t a_sp = 1, a_sr = g->k, a_panel = 0;
        if (pa) {
            pack_a(pa, g, mr, ic, mc, pc, kc);
            if (g->precision == PYTFM_PRECISION_BF16)
                round_panel(pa, (mc + mr - 1) / mr * mr * kc);
            a = pa, a_sp = mr, a_sr = 1, a_panel = mr * kc;
        }
        for (int64_t jr = 0; jr < nc; jr += nr)
            for (int64_t ir = 0; ir < mc; ir += mr) {
                float *c = g->c + (ic + ir) * g->n + jc + jr;
                const int rows = (int)PYTFM_MIN(mr, mc - ir), cols = (int)PYTFM_MIN(nr, nc - jr);
                uk->run(c, g->n, a + (a_panel ? ir / mr * a_panel : ir * a_sr), a_sp, a_sr,
                        pb + jr * kc, nr, kc, rows, cols, bt);
            }
        if (last) pytfm__product_finish(g, g->c + ic * g->n + jc, ic, jc, mc, nc);
    }
}

/* How gemm_blocked splits one product among threads, and the packing buffers that takes. C
 * goes to threads in whole micro-tiles, by rows or by columns, whichever side is longer; each
 * thread packs the slices of op(B) and the blocks of op(A) it uses into buffers of its own,
 * so the threads never wait for each other (the panels they would share cost a barrier or
 * two per k slice, and the cores' L2 caches are private anyway); what is packed twice is the
 * op(B) (split by rows) or op(A) (by columns) of the other side, under 1/(mc) of the work. */
typedef struct blocking {
    int64_t threads; // that share this product
    int by_rows;
    int64_t a_size; // floats of packed op(A) per thread: MC·KC, or 0 when A is read in place
    int64_t b_size; // floats of one packed KC×NC slice of op(B) per thread (less for narrow C)
} blocking;

static blocking plan(const pytfm__product *g, const pytfm__micro *uk, int64_t threads) {
    const int64_t row_tiles = (g->m + uk->mr - 1) / uk->mr;
    const int64_t col_tiles = (g->n + uk->nr - 1) / uk->nr;
    blocking bl;
    bl.by_rows = g->m >= g->n;
    bl.threads = PYTFM_MIN(threads, bl.by_rows ? row_tiles : col_tiles);
    const int64_t cols = bl.by_rows ? col_tiles : (col_tiles + bl.threads - 1) / bl.threads;
    bl.a_size = pack_a_pays(g) ? (int64_t)MC * KC : 0;
    bl.b_size = (int64_t)KC * PYTFM_MIN(NC, cols * uk->nr);
    return bl;
}

/* the packing buffers' floats: at most (216 KiB + 3 MiB) / 4 per thread */
static int64_t scratch_floats(const blocking *bl) {
    return bl->threads * (bl->a_size + bl->b_size);
}

/* the product, split among threads as bl says, with buf (scratch_floats(bl) floats) holding
 * the packing buffers; the team may be smaller than bl->threads (pytfm__team_within: no
 * member on a core another process keeps busy), and the split follows the team it gets, each
 * element of C summed in one order whatever the split */
static void gemm_blocked(const pytfm__product *g, const pytfm__micro *uk, const blocking *bl,
                         float *buf) {
    const int64_t mr = uk->mr, nr = uk->nr;
    const int64_t row_tiles = (g->m + mr - 1) / mr, col_tiles = (g->n + nr - 1) / nr;
#if defined(_OPENMP)
#pragma omp parallel num_threads(pytfm__team_within(bl->threads)) if (bl->threads > 1)
#endif
    {
#if defined(_OPENMP)
        const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
#else
        const int64_t t = 0, team = 1;
#endif
        float *pa = buf + t * (bl->a_size + bl->b_size), *pb = pa + bl->a_size;
        const int64_t tiles = bl->by_rows ? row_tiles : col_tiles;
        const int64_t lo = tiles * t / team, hi = tiles * (t + 1) / team;
        int64_t i0 = 0, i1 = g->m, j0 = 0, j1 = g->n; // this thread's block of C
        if (bl->by_rows)
            i0 = lo * mr, i1 = PYTFM_MIN(hi * mr, g->m);
        else
            j0 = lo * nr, j1 = PYTFM_MIN(hi * nr, g->n);
        for (int64_t jc = j0; jc < j1; jc += NC) {
            const int64_t nc = PYTFM_MIN(NC, j1 - jc);
            for (int64_t pc = 0; pc < g->k; pc += KC) {
                const int64_t kc = PYTFM_MIN(KC, g->k - pc);
                pack_b(pb, g, (int)nr, pc, kc, jc, nc);
                if (g->precision == PYTFM_PRECISION_BF16)
                    round_panel(pb, (nc + nr - 1) / nr * nr * kc);
                rows_times_panel(g, uk, bl->a_size ? pa : NULL, pb, i0, i1, jc, nc, pc, kc);
            }
        }
    }
}

/* ---- micro-kernels ------------------------------------------------------------------------ */
/* Both take A and B through strides (see pytfm__micro_fn in internal.h): the packed panels of
 * the driver above are the case a_sp = MR, a_sr = 1, ldb = NR; attention passes its tiles and
 * the caller's rows as they lie. A's rows past `rows` re-read the last row (never memory
 * past it); B's lanes past `cols` are masked off, as are C's. */

#ifdef PYTFM_HAVE_X86_KERNELS

/* C's tile is read (β ≠ 0) and written only after the k loop, by which time it may have left
 * the caches, its rows ldc apart where no hardware prefetcher follows: fetch its lines now (the
 * first and last element of each row), while the loop runs */
static inline void prefetch_c(const float *c, int64_t ldc, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        __builtin_prefetch(c + r * ldc, 1, 3);
        __builtin_prefetch(c + r * ldc + cols - 1, 1, 3);
    }
}

/* AVX2+FMA, 6×16: twelve ymm accumulators (named variables, as below), two B loads and six
 * broadcasts per p; AVX2 masked loads are slow, so full-width tiles take a loop of their own */
enum { MR_AVX2 = 6, NR_AVX2 = 16 };

#define AVX2_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define AVX2_DECLARE(r)                                                                        \
    __m256 acc##r##0 = _mm256_setzero_ps(), acc##r##1 = _mm256_setzero_ps();                   \
    const int64_t off##r = (r < rows ? r : rows - 1) * a_sr;
#define AVX2_STEP(r)                                                                           \
    {                                                                                          \
        const __m256 x = _mm256_broadcast_ss(a + off##r);                                      \
        acc##r##0 = _mm256_fmadd_ps(x, b0, acc##r##0);                                         \
        acc##r##1 = _mm256_fmadd_ps(x, b1, acc##r##1);                                         \
    }
#define AVX2_STORE(r)                                                                          \
    if (r < rows) {                                                                            \
        float *cr = c + r * ldc;                                                               \
        if (bt != 0.0f) {                                                                      \
            acc##r##0 = _mm256_fmadd_ps(beta, _mm256_maskload_ps(cr, m0), acc##r##0);          \
            acc##r##1 = _mm256_fmadd_ps(beta, _mm256_maskload_ps(cr + 8, m1), acc##r##1);      \
        }                                                                                      \
        _mm256_maskstore_ps(cr, m0, acc##r##0);                                                \
        _mm256_maskstore_ps(cr + 8, m1, acc##r##1);                                            \
    }

__attribute__((target("avx2,fma"))) static void micro_avx2(float *c, int64_t ldc, const float *a,
                                                           int64_t a_sp, int64_t a_sr,
                                                           const float *b, int64_t ldb,
                                                           int64_t kc, int rows, int cols,
                                                           float bt) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - 8), lane);
    AVX2_ROWS(AVX2_DECLARE)
    prefetch_c(c, ldc, rows, cols);
    if (cols == NR_AVX2)
        for (int64_t p = 0; p < kc; p++, a += a_sp, b += ldb) {
            const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
            AVX2_ROWS(AVX2_STEP)
        }
    else
        for (int64_t p = 0; p < kc; p++, a += a_sp, b += ldb) {
            const __m256 b0 = _mm256_maskload_ps(b, m0), b1 = _mm256_maskload_ps(b + 8, m1);
            AVX2_ROWS(AVX2_STEP)
        }
    const __m256 beta = _mm256_set1_ps(bt);
    AVX2_ROWS(AVX2_STORE)
}

/* AVX-512, 8×32: sixteen zmm accumulators, two B loads and eight broadcasts per p. The
 * accumulators are sixteen named variables: as an array, GCC 12 spills them every iteration. */
enum { MR_AVX512 = 8, NR_AVX512 = 32 };

#define AVX512_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define AVX512_DECLARE(r)                                                                      \
    __m512 acc##r##0 = _mm512_setzero_ps(), acc##r##1 = _mm512_setzero_ps();                   \
    const int64_t off##r = (r < rows ? r : rows - 1) * a_sr;
#define AVX512_STEP(r)                                                                         \
    {                                                                                          \
        const __m512 x = _mm512_set1_ps(a[off##r]);                                            \
        acc##r##0 = _mm512_fmadd_ps(x, b0, acc##r##0);                                         \
        acc##r##1 = _mm512_fmadd_ps(x, b1, acc##r##1);                                         \
    }

__attribute__((target("avx512f"))) static void micro_avx512(float *c, int64_t ldc,
                                                            const float *a, int64_t a_sp,
                                                            int64_t a_sr, const float *b,
                                                            int64_t ldb, int64_t kc, int rows,
                                                            int cols, float bt) {
    // lanes past cols are masked off: neither read nor written
    const __mmask16 m0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    const __mmask16 m1 = cols >= 32 ? 0xFFFF : cols > 16 ? (__mmask16)((1u << (cols - 16)) - 1) : 0;
    AVX512_ROWS(AVX512_DECLARE)
    prefetch_c(c, ldc, rows, cols);
    for (int64_t p = 0; p < kc; p++, a += a_sp, b += ldb) {
        const __m512 b0 = _mm512_maskz_loadu_ps(m0, b), b1 = _mm512_maskz_loadu_ps(m1, b + 16);
        AVX512_ROWS(AVX512_STEP)
    }
    const __m512 beta = _mm512_set1_ps(bt);
    AVX512_ROWS(PYTFM__AVX512_STORE_ROW)
}

static const pytfm__micro micro_for_avx2 = {MR_AVX2, NR_AVX2, micro_avx2};
static const pytfm__micro micro_for_avx512 = {MR_AVX512, NR_AVX512, micro_avx512};

#endif /* PYTFM_HAVE_X86_KERNELS */

const pytfm__micro *pytfm__micro_for(int32_t isa) {
#ifdef PYTFM_HAVE_X86_KERNELS
    if (isa == PYTFM_ISA_AVX512) return &micro_for_avx512;
    if (isa == PYTFM_ISA_AVX2) return &micro_for_avx2;
#else
    (void)isa;
#endif
    return NULL;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

/* The blocked kernels run where the CPU has a micro-kernel (AVX2 and up), for products with
 * something to sum (k > 0) into a non-empty C; the plain loop does the rest. A BF16 product
 * runs sgemm_bf16.c's kernels where the BF16 ISA is AVX512_BF16 (bf16 != 0), else these. */
static int blocked(const pytfm__product *p, const pytfm__micro *uk) {
    return uk && p->m > 0 && p->n > 0 && p->k > 0;
}

static int bf16_blocked(const pytfm__product *p, int bf16) {
    return bf16 && p->precision == PYTFM_PRECISION_BF16 && p->m > 0 && p->n > 0 && p->k > 0;
}

pytfm_status pytfm__sgemm_all(const char *func, const pytfm__product *products, int count) {
    // the ISA and the thread count are read once: another thread may change them meanwhile
    const int32_t isa = pytfm_get_isa();
    const int bf16 = pytfm_get_bf16_isa() == PYTFM_ISA_AVX512_BF16;
    const int64_t threads = pytfm_get_num_threads();
    const pytfm__micro *uk = pytfm__micro_for(isa);
    if (isa >= PYTFM_ISA_AVX2 && !uk)
        return pytfm__fail(PYTFM_STATUS_INTERNAL, "%s: no sgemm kernel for isa %d", func, isa);
    int64_t words = -1; // 4-byte words: the most any one product needs (they run in turn)
    for (int i = 0; i < count; i++) {
        const pytfm__product *g = &products[i];
        int64_t w = -1;
        if (bf16_blocked(g, bf16)) {
            w = pytfm__gemm_bf16_scratch(g, threads);
        } else if (blocked(g, uk)) {
            const blocking bl = plan(g, uk, threads);
            w = scratch_floats(&bl);
        }
        if (w > words) words = w;
    }
    float *buf = NULL; // only the blocked kernels need scratch
    if (words >= 0 && !(buf = pytfm__scratch(func, words, sizeof(float))))
        return PYTFM_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < count; i++) {
        const pytfm__product *g = &products[i];
        if (bf16_blocked(g, bf16)) {
            pytfm__gemm_bf16(g, threads, (uint32_t *)(void *)buf);
        } else if (blocked(g, uk)) {
            const blocking bl = plan(g, uk, threads);
            gemm_blocked(g, uk, &bl, buf);
        } else if (g->m > 0 && g->n > 0) { // k = 0 too: no products, C = β·C
            if (g->precision == PYTFM_PRECISION_BF16)
                sgemm_plain_bf16(g->c, g->a, g->b, g->m, g->n, g->k, g->trans_a != 0,
                                 g->trans_b != 0, g->beta);
            else
                sgemm_plain(g->c, g->a, g->b, g->m, g->n, g->k, g->trans_a != 0,
                            g->trans_b != 0, g->beta);
            if (g->epilogue) {
                PYTFM_PARALLEL_ROWS(g->m, g->n)
                for (int64_t r = 0; r < g->m; r++)
                    pytfm__product_finish(g, g->c + r * g->n, r, 0, 1, g->n);
            }
        }
    }
    free(buf);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_sgemm(float *c, const float *a, const float *b, int64_t m, int64_t n,
                         int64_t k, int32_t trans_a, int32_t trans_b, float beta) {
    PYTFM_TRY(pytfm__check_sgemm(__func__, c, a, b, m, n, k, beta));
    const pytfm__product p = {c, a, b, m, n, k, trans_a, trans_b, beta, NULL,
                              PYTFM_PRECISION_FP32, NULL};
    return pytfm__sgemm_all(__func__, &p, 1);
}

pytfm_status pytfm_sgemm_ex(float *c, const float *a, const float *b, int64_t m, int64_t n,
                            int64_t k, int32_t trans_a, int32_t trans_b, float beta,
                            int32_t precision) {
    PYTFM_TRY(pytfm__check_precision(__func__, precision));
    PYTFM_TRY(pytfm__check_sgemm(__func__, c, a, b, m, n, k, beta));
    const pytfm__product p = {c, a, b, m, n, k, trans_a, trans_b, beta, NULL, precision,
                              NULL};
    return pytfm__sgemm_all(__func__, &p, 1);
}

pytfm_status pytfm_sgemm_plain(float *c, const float *a, const float *b, int64_t m, int64_t n,
                               int64_t k, int32_t trans_a, int32_t trans_b, float beta) {
    PYTFM_TRY(pytfm__check_sgemm(__func__, c, a, b, m, n, k, beta));
    sgemm_plain(c, a, b, m, n, k, trans_a != 0, trans_b != 0, beta);
    return PYTFM_STATUS_OK;
}
