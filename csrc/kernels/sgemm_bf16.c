/*
 * sgemm_bf16.c — the BF16 products on AVX512-BF16 (PYTFM_ISA_AVX512_BF16):
 *
 *   C = β·C + Σ_p bf16(op(A)[i, p]) · bf16(op(B)[p, j])        (pytfm_sgemm_ex, BF16)
 *   y[o] = Σ_i bf16(x[i]) · bf16(W[o, i]) (+ b[o])              (the linear layer on one row)
 *
 * bf16() is pytfm__bf16_round_bits (internal.h). One instruction does the work:
 *   vdpbf16ps acc, a, b:  acc[l] += a[2l+1]·b[2l+1] + a[2l]·b[2l]  for the 16 float lanes l,
 * a and b holding 32 BF16 values as 16 pairs; each product is exact in float32 and each add
 * rounds to nearest (MXCSR is not read; subnormal inputs count as zero, which the rounding
 * never makes, and subnormal sums are flushed to zero). Per lane that is twice the FP32 FMA's
 * work, at the FMA's rate.
 *
 * The driver is sgemm.c's (BLIS: each thread owns a band of C's rows or columns and packs its
 * own panels; an MR×NR register tile summed over a KC-deep slice of k), with the panels holding
 * BF16 pairs instead of floats, rounded as they are packed:
 *   op(B) micro-panel, NR = 32 columns:  word (q, j) = bf16(B[2q+1, j]) << 16 | bf16(B[2q, j])
 *   op(A) micro-panel, MR = 8 rows:      word (q, r) = bf16(A[r, 2q+1]) << 16 | bf16(A[r, 2q])
 * so that one B load is a vdpbf16ps operand for 16 columns and one A word, broadcast, the
 * operand for a row. An odd k slice ends in a pair whose second half is 0 in both panels, and
 * ragged rows and columns are zero-filled: a product 0·0 = +0 changes no sum. The blocking is
 * the FP32 kernel's in bytes: KC = 768 values of k (384 pairs) keeps the MC×KC block of A at
 * 216 KiB (L2), a KC×NR micro-panel of B at 48 KiB and a KC×NC panel at 3 MiB (L3). The same
 * bits at any thread count: every element of C is summed by one thread in one fixed order.
 * Scratch, per thread: 144·384 words for A and 384·min(NC, the thread's columns) for B: the
 * FP32 kernel's 3.2 MiB at most.
 */
#include <stdlib.h>

#include "core/checks.h"
#include "tile_avx512.h"

#if PYTFM_HAVE_BF16_KERNELS
#include <immintrin.h>

#if defined(_OPENMP)
#include <omp.h>
#endif

#define TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,avx2")))

enum { MC = 144, KC = 768, NC = 2048, MR = 8, NR = 32 };

/* ---- rounding -------------------------------------------------------------------------- */
/* vcvtne2ps2bf16 rounds 32 floats to BF16 exactly as pytfm__bf16_round_bits does (round to
 * nearest even, NaN kept and made quiet, float32 subnormals to zero: the instruction's
 * definition in the Intel SDM, and what test_bf16.py checks through every packing). */

/* count <= 16 floats at p, the rest read as 0 */
TARGET static inline __m512 load16(const float *p, int count) {
    return _mm512_maskz_loadu_ps(count >= 16 ? 0xFFFF : (__mmask16)((1u << count) - 1), p);
}

/* 16 pairs (count <= 32 consecutive floats at p, the rest 0): word q = bf16(p[2q+1]) << 16 |
 * bf16(p[2q]), which is the 32 rounded values in order */
TARGET static inline __m512i pairs_along(const float *p, int count) {
    const __m512 lo = load16(p, count < 16 ? count : 16);
    const __m512 hi = count > 16 ? load16(p + 16, count - 16) : _mm512_setzero_ps();
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* 32 BF16 values (count <= 32 at p, the rest 0) as pairs_along makes them from their float32
 * widening: each as pytfm__bf16_round_bits rounds it, which keeps a BF16 value but for a
 * subnormal (a zero of its sign) and a NaN (made quiet) */
TARGET static inline __m512i pairs_of_bf16(const uint16_t *p, int count) {
    const __m512i v =
        _mm512_maskz_loadu_epi16(count >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << count) - 1), p);
    const __mmask32 tiny = _mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x7F80));
    const __mmask32 nan = _mm512_cmpgt_epu16_mask(_mm512_and_si512(v, _mm512_set1_epi16(0x7FFF)),
                                                  _mm512_set1_epi16(0x7F80));
    const __m512i zero = _mm512_and_si512(v, _mm512_set1_epi16((short)0x8000));
    const __m512i quiet = _mm512_or_si512(v, _mm512_set1_epi16(0x0040));
    return _mm512_mask_mov_epi16(_mm512_mask_mov_epi16(v, tiny, zero), nan, quiet);
}

/* 16 pairs across two rows (count <= 16 values of each, the rest 0): word j = bf16(b[j]) << 16
 * | bf16(a[j]) */
TARGET static inline __m512i pairs_across(const float *a, const float *b, int count) {
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b ? load16(b, count) : _mm512_setzero_ps(),
                                                      load16(a, count)); // a's 16, b's 16
    const __m512i mix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    return _mm512_permutexvar_epi16(mix, both);
}

/* ---- packing ---------------------------------------------------------------------------- */

/* dst[q·ldd + r] = src[r·lds + q] for r, q < 8: eight words of eight rows, transposed */
TARGET static void transpose8(uint32_t *dst, int64_t ldd, const uint32_t *src, int64_t lds) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps((const float *)(const void *)(src + i * lds));
    for (int i = 0; i < 8; i += 2) { // the shuffles move bits, whatever the words hold
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps((float *)(void *)(dst + i * ldd),
                         _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps((float *)(void *)(dst + (i + 4) * ldd),
                         _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

/* A micro-panel of width w (MR or NR) from w rows of pairs along them: dst[q·w + r] = the pair
 * (src[r·lds + 2q], src[r·lds + 2q + 1]) for r < rows (0 for rows <= r < w), q < (kc + 1) / 2
 * (a value at 2q + 1 >= kc is 0). Used for op(A) = A's rows and for op(B) = the rows of a
 * transposed B: 16 pairs of each row at a time into a [w][16] block, then transposed 8×8.
 * src16, when not NULL, holds the rows in BF16 instead of src (pairs_of_bf16). */
TARGET static void pack_along(uint32_t *dst, int w, const float *src, const uint16_t *src16,
                              int64_t lds, int rows, int64_t kc) {
    const int64_t kc2 = (kc + 1) / 2;
    uint32_t blk[NR][16];
    for (int64_t q0 = 0; q0 < kc2; q0 += 16) {
        const int count = (int)PYTFM_MIN(32, kc - 2 * q0); // floats of each row in this block
        for (int r = 0; r < w; r++) {
            const __m512i v = r >= rows ? _mm512_setzero_si512()
                              : src16   ? pairs_of_bf16(src16 + r * lds + 2 * q0, count)
                                        : pairs_along(src + r * lds + 2 * q0, count);
            _mm512_storeu_si512(blk[r], v);
        }
        const int64_t pairs = PYTFM_MIN(16, kc2 - q0);
        int64_t q = 0;
        for (; q + 8 <= pairs; q += 8)
            for (int r = 0; r < w; r += 8)
                transpose8(dst + (q0 + q) * w + r, w, &blk[r][q], 16);
        for (; q < pairs; q++)
            for (int r = 0; r < w; r++) dst[(q0 + q) * w + r] = blk[r][q];
    }
}

/* A micro-panel of width w from pairs of rows: dst[q·w + j] = the pair (src[2q·lds + j],
 * src[(2q + 1)·lds + j]) for j < cols (0 for cols <= j < w), q < (kc + 1) / 2 (row 2q + 1 >= kc
 * is 0). Used for op(B) = B's rows and for op(A) = the rows of a transposed A. */
TARGET static void pack_across(uint32_t *dst, int w, const float *src, int64_t lds, int cols,
                               int64_t kc) {
    const int64_t kc2 = (kc + 1) / 2;
    for (int64_t q = 0; q < kc2; q++) {
        const float *lo = src + 2 * q * lds, *hi = 2 * q + 1 < kc ? lo + lds : NULL;
        if (2 * q + 16 < kc) { // the rows 16 on: fetched while these are copied
            _mm_prefetch((const char *)(lo + 16 * lds), _MM_HINT_T0);
            _mm_prefetch((const char *)(lo + 16 * lds + w - 1), _MM_HINT_T0);
        }
        for (int j = 0; j < w; j += 16) {
            const int n = (int)PYTFM_MIN(16, cols - j > 0 ? cols - j : 0);
            const int lanes = PYTFM_MIN(16, w - j);
            const __m512i v = pairs_across(lo + j, hi ? hi + j : NULL, n);
            _mm512_mask_storeu_epi32(dst + q * w + j, (__mmask16)((1u << lanes) - 1), v);
        }
    }
}

/* rows [i0, i0+mc) × k slice [p0, p0+kc) of op(A) into micro-panels of MR rows */
TARGET static void pack_a(uint32_t *dst, const pytfm__product *g, int64_t i0, int64_t mc,
                          int64_t p0, int64_t kc) {
    const int64_t kc2 = (kc + 1) / 2, m = g->m, k = g->k;
    for (int64_t ir = 0; ir < mc; ir += MR, dst += MR * kc2) {
        const int rows = (int)PYTFM_MIN(MR, mc - ir);
        if (g->trans_a) // op(A)[i, p] = a[p·m + i]: MR values of a row of a, rows p and p+1
            pack_across(dst, MR, g->a + p0 * m + i0 + ir, m, rows, kc);
        else
            pack_along(dst, MR, g->a + (i0 + ir) * k + p0, NULL, k, rows, kc);
    }
}

/* k slice [p0, p0+kc) × columns [j0, j0+nc) of op(B) into micro-panels of NR columns (B in
 * BF16: transposed, rows of g->b16) */
TARGET static void pack_b(uint32_t *dst, const pytfm__product *g, int64_t p0, int64_t kc,
                          int64_t j0, int64_t nc) {
    const int64_t kc2 = (kc + 1) / 2, n = g->n, k = g->k;
    for (int64_t jr = 0; jr < nc; jr += NR, dst += NR * kc2) {
        const int cols = (int)PYTFM_MIN(NR, nc - jr);
        if (g->b16) // column j of op(B) is row j of b16
            pack_along(dst, NR, NULL, g->b16 + (j0 + jr) * k + p0, k, cols, kc);
        else if (g->trans_b) // column j of op(B) is row j of b
            pack_along(dst, NR, g->b + (j0 + jr) * k + p0, NULL, k, cols, kc);
        else
            pack_across(dst, NR, g->b + p0 * n + j0 + jr, n, cols, kc);
    }
}

/* ---- the micro-kernel ------------------------------------------------------------------- */

/* C[0..rows)[0..cols) (row stride ldc) = bt·C + the MR×NR tile of a (kc2 pair-words per row of
 * the A micro-panel) times b (the B micro-panel); bt = 0 writes C without reading it. Sixteen
 * named accumulators, as in sgemm.c's AVX-512 kernel; rows past `rows` hold zeros from the
 * packing, and C's lanes past cols are masked off. */
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define DECLARE(r) __m512 acc##r##0 = _mm512_setzero_ps(), acc##r##1 = _mm512_setzero_ps();
#define STEP(r)                                                                                \
    {                                                                                          \
        const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[r]);                            \
        acc##r##0 = _mm512_dpbf16_ps(acc##r##0, x, b0);                                        \
        acc##r##1 = _mm512_dpbf16_ps(acc##r##1, x, b1);                                        \
    }

TARGET static void micro(float *c, int64_t ldc, const uint32_t *a, const uint32_t *b,
                         int64_t kc2, int rows, int cols, float bt) {
    const __mmask16 m0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    const __mmask16 m1 = cols >= 32 ? 0xFFFF : cols > 16 ? (__mmask16)((1u << (cols - 16)) - 1) : 0;
    ROWS(DECLARE)
    for (int r = 0; r < rows; r++) { // C's tile is read and written after the loop
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + cols - 1), _MM_HINT_T0);
    }
    for (int64_t q = 0; q < kc2; q++, a += MR, b += NR) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
        ROWS(STEP)
    }
    const __m512 beta = _mm512_set1_ps(bt);
    ROWS(PYTFM__AVX512_STORE_ROW)
}

/* ---- the driver ------------------------------------------------------------------------- */

/* How a product is split among threads, as sgemm.c's plan: by rows or by columns of C in
 * whole micro-tiles (whichever side is longer), each thread with its own packing buffers. */
typedef struct blocking {
    int64_t threads;
    int by_rows;
    int64_t a_words, b_words; // per thread: a packed MC×KC block of op(A), a KC×NC slice of op(B)
} blocking;

static blocking plan(const pytfm__product *g, int64_t threads) {
    const int64_t row_tiles = (g->m + MR - 1) / MR, col_tiles = (g->n + NR - 1) / NR;
    blocking bl;
    bl.by_rows = g->m >= g->n;
    bl.threads = PYTFM_MIN(threads, bl.by_rows ? row_tiles : col_tiles);
    const int64_t cols = bl.by_rows ? col_tiles : (col_tiles + bl.threads - 1) / bl.threads;
    bl.a_words = (int64_t)MC * (KC / 2);
    bl.b_words = (int64_t)(KC / 2) * PYTFM_MIN(NC, cols * NR);
    return bl;
}

int64_t pytfm__gemm_bf16_scratch(const pytfm__product *g, int64_t threads) {
    const blocking bl = plan(g, threads);
    return bl.threads * (bl.a_words + bl.b_words);
}

/* rows [i0, i1) of C against the packed slice pb (columns [jc, jc+nc), k slice [pc, pc+kc)) */
static void rows_times_panel(const pytfm__product *g, uint32_t *pa, const uint32_t *pb,
                             int64_t i0, int64_t i1, int64_t jc, int64_t nc, int64_t pc,
                             int64_t kc) {
    const int64_t kc2 = (kc + 1) / 2;
    const float bt = pc == 0 ? g->beta : 1.0f; // later slices add to what is there
    const int last = pc + kc == g->k && g->epilogue;
    for (int64_t ic = i0; ic < i1; ic += MC) {
        const int64_t mc = PYTFM_MIN(MC, i1 - ic);
        pack_a(pa, g, ic, mc, pc, kc);
        for (int64_t jr = 0; jr < nc; jr += NR)
            for (int64_t ir = 0; ir < mc; ir += MR) {
                float *c = g->c + (ic + ir) * g->n + jc + jr;
                const int rows = (int)PYTFM_MIN(MR, mc - ir), cols = (int)PYTFM_MIN(NR, nc - jr);
                micro(c, g->n, pa + ir * kc2, pb + jr * kc2, kc2, rows, cols, bt);
            }
        if (last) pytfm__product_finish(g, g->c + ic * g->n + jc, ic, jc, mc, nc);
    }
}

void pytfm__gemm_bf16(const pytfm__product *g, int64_t threads, uint32_t *buf) {
    const blocking bl = plan(g, threads);
    const int64_t row_tiles = (g->m + MR - 1) / MR, col_tiles = (g->n + NR - 1) / NR;
#if defined(_OPENMP)
#pragma omp parallel num_threads(pytfm__team_within(bl.threads)) if (bl.threads > 1)
#endif
    {
#if defined(_OPENMP)
        const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
#else
        const int64_t t = 0, team = 1;
#endif
        uint32_t *pa = buf + t * (bl.a_words + bl.b_words), *pb = pa + bl.a_words;
        const int64_t tiles = bl.by_rows ? row_tiles : col_tiles;
        // the blocks of C are those of bl.threads threads, whatever the team's size (the
        // buffers are sized for them): a smaller team (beside a busy neighbour:
        // pytfm__team_threads) takes several each
        for (int64_t part = t; part < bl.threads; part += team) {
            const int64_t lo = tiles * part / bl.threads, hi = tiles * (part + 1) / bl.threads;
            int64_t i0 = 0, i1 = g->m, j0 = 0, j1 = g->n; // this part's block of C
            if (bl.by_rows)
                i0 = lo * MR, i1 = PYTFM_MIN(hi * MR, g->m);
            else
                j0 = lo * NR, j1 = PYTFM_MIN(hi * NR, g->n);
            for (int64_t jc = j0; jc < j1; jc += NC) {
                const int64_t nc = PYTFM_MIN(NC, j1 - jc);
                for (int64_t pc = 0; pc < g->k; pc += KC) {
                    const int64_t kc = PYTFM_MIN(KC, g->k - pc);
                    pack_b(pb, g, pc, kc, jc, nc);
                    rows_times_panel(g, pa, pb, i0, i1, jc, nc, pc, kc);
                }
            }
        }
    }
}

/* ---- one row: y = x·Wᵀ (+ b) ------------------------------------------------------------- */

/* 32 weights from element at of W as 16 pairs: from the BF16 copy (as stored: vdpbf16ps takes
 * a subnormal as the zero the rounding makes of it), or rounded from W */
TARGET static inline __m512i weights(const float *w, const uint16_t *w16, int64_t at,
                                     int count) {
    if (w16) {
        const __mmask32 m = count >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << count) - 1);
        return _mm512_maskz_loadu_epi16(m, w16 + at);
    }
    return pairs_along(w + at, count);
}

/* Σ over the 16 lanes of s, always in this tree (halves, then quarters, then pairs): the
 * four-row form below adds the same pairs, across rows */
TARGET static inline float lanes_sum(__m512 s) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), hi);
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));      // [q0 + q2, q1 + q3]
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p))); // (q0 + q2) + (q1 + q3)
}

/* x's pairs for rows of up to XMAX values are made once per call, into a buffer on the stack;
 * longer rows make them per block of rows (the same words either way) */
enum { XMAX = 8192 };

/* rows [o0, o1) of W against x's pairs xp (NULL: made from x as they are needed) */
TARGET static void gemv_rows(float *y, const float *x, const uint32_t *xp, const float *w,
                             const uint16_t *w16, int64_t ldw, const float *b, int64_t in,
                             int64_t o0, int64_t o1) {
    const int64_t bytes = w16 ? 2 : 4, row = ldw * bytes; // of a weight as read, of a row
    const char *base = w16 ? (const char *)(const void *)w16 : (const char *)(const void *)w;
    int64_t o = o0;
    // Four rows at once: x's pairs loaded once for the four, the next four rows fetched
    // meanwhile (as fast_impl.h's gemv). Each row's sum is the one it gets alone, in the loop
    // after: 16 lanes, each over the pairs 16 apart, then lanes_sum's tree.
    for (; o + 4 <= o1; o += 4) {
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        const char *next = base + (o + 4) * row;
        const int64_t at = o * ldw; // W's row o
        for (int64_t j = 0; j < in; j += 32) {
            const int count = (int)PYTFM_MIN(32, in - j);
            if (o + 8 <= o1)
                for (int r = 0; r < 4; r++)
                    for (int64_t off = 0; off < 32 * bytes; off += 64)
                        _mm_prefetch(next + r * row + j * bytes + off, _MM_HINT_T0);
            const __m512bh xv = (__m512bh)(xp ? _mm512_loadu_si512(xp + j / 2)
                                              : pairs_along(x + j, count));
            s0 = _mm512_dpbf16_ps(s0, xv, (__m512bh)weights(w, w16, at + j, count));
            s1 = _mm512_dpbf16_ps(s1, xv, (__m512bh)weights(w, w16, at + ldw + j, count));
            s2 = _mm512_dpbf16_ps(s2, xv, (__m512bh)weights(w, w16, at + 2 * ldw + j, count));
            s3 = _mm512_dpbf16_ps(s3, xv, (__m512bh)weights(w, w16, at + 3 * ldw + j, count));
        }
        // lanes_sum of the four side by side: the halves of s0..s3, then ...
        const __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(s0, s1, 0x44),
                                         _mm512_shuffle_f32x4(s0, s1, 0xEE));
        const __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(s2, s3, 0x44),
                                         _mm512_shuffle_f32x4(s2, s3, 0xEE));
        // a01 = [s0 lo+hi (8 lanes) | s1 lo+hi], a23 likewise: now the quarters
        const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0x88),
                                       _mm512_shuffle_f32x4(a01, a23, 0xDD));
        // q = [row 0's 4 | row 1's 4 | row 2's 4 | row 3's 4]: [q0 + q2, q1 + q3], then the two
        const __m512 p = _mm512_add_ps(q, _mm512_permute_ps(q, 0x4E));
        const __m512 e = _mm512_add_ps(p, _mm512_movehdup_ps(p)); // lane 4r: row r's sum
        float sums[16];
        _mm512_storeu_ps(sums, e);
        for (int r = 0; r < 4; r++) y[o + r] = b ? sums[4 * r] + b[o + r] : sums[4 * r];
    }
    for (; o < o1; o++) {
        __m512 s = _mm512_setzero_ps();
        for (int64_t j = 0; j < in; j += 32) {
            const int count = (int)PYTFM_MIN(32, in - j);
            const __m512bh xv = (__m512bh)(xp ? _mm512_loadu_si512(xp + j / 2)
                                              : pairs_along(x + j, count));
            s = _mm512_dpbf16_ps(s, xv, (__m512bh)weights(w, w16, o * ldw + j, count));
        }
        const float d = lanes_sum(s);
        y[o] = b ? d + b[o] : d;
    }
}

/* Four rows at a time also for a W that comes from memory: a row at a time (one sequential
 * read, one chain of vdpbf16ps) measured a third of the rate (docs/performance.md) */
TARGET void pytfm__gemv_bf16(float *y, const float *x, const float *w, const uint16_t *w16,
                             int64_t ldw, const float *b, int64_t in, int64_t out) {
    if (in > XMAX) {
        gemv_rows(y, x, NULL, w, w16, ldw, b, in, 0, out);
        return;
    }
    uint32_t xp[XMAX / 2 + 16]; // x's pairs, and a zero tail to the end of the last vector
    for (int64_t j = 0; j < in; j += 32)
        _mm512_storeu_si512(xp + j / 2, pairs_along(x + j, (int)PYTFM_MIN(32, in - j)));
    gemv_rows(y, x, xp, w, w16, ldw, b, in, 0, out);
}

#else /* no AVX512-BF16 kernels in this build: pytfm_get_bf16_isa() never selects them */

int64_t pytfm__gemm_bf16_scratch(const pytfm__product *g, int64_t threads) {
    (void)g, (void)threads;
    return 0;
}

void pytfm__gemm_bf16(const pytfm__product *g, int64_t threads, uint32_t *buf) {
    (void)g, (void)threads, (void)buf;
}

void pytfm__gemv_bf16(float *y, const float *x, const float *w, const uint16_t *w16,
                      int64_t ldw, const float *b, int64_t in, int64_t out) {
    (void)y, (void)x, (void)w, (void)w16, (void)ldw, (void)b, (void)in, (void)out;
}

#endif /* PYTFM_HAVE_BF16_KERNELS */
