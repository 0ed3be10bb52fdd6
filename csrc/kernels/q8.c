/*
 * q8.c — 8-bit weights: W [out, in] as blocks of 32 int8 along each row with an fp16 scale
 * each (llama.cpp's Q8_0), their quantisation, the linear layer's forward on them and the
 * embedding lookup of a table held so.
 *
 *   quantise:   d = fp16(amax/127), q = clamp(round_half_away(w/d), ±127)     per block
 *   dequantise: w = q·d
 *   forward:    y[r, o] = b[o] + Σ_blk dw[o, blk]·dx[r, blk]·Σ_{i in blk} qx[r, i]·q[o, i]
 *               with x's row quantised per block as the weights are (float32 scale, ties to
 *               even), the inner sums exact in int32, the outer in the order pytfm_kernels.h
 *               writes down, which every path follows (the same bits on each).
 * The plain loops here are that contract written out; the vectorised kernels (q8.h) compute
 * the same sums. The product splits W's rows among threads in blocks of Q8_BLOCK_ROWS and
 * quantises x's rows first, once per call: for one row (a decoded token) into a buffer on the
 * stack, so that decoding allocates nothing.
 */
#include <stdlib.h>

#include "core/checks.h"
#include "q8.h"

enum {
    Q8_BLOCK_ROWS = 64,   /* W's rows per parallel task */
    Q8_STACK_IN = 16384,  /* the largest in whose one quantised row of x lives on the stack */
    Q8_SERIAL = 1 << 16   /* a product of at most this many weights runs on one thread */
};

/* ---- quantisation --------------------------------------------------------------------------- */

/* one block of 32 weights into q and *scale; 0 when a weight is not finite or d overflows */
static int quantize_block(int8_t *q, uint16_t *scale, const float *w) {
    float amax = 0.0f;
    for (int i = 0; i < PYTFM_Q8_BLOCK; i++) {
        if (!isfinite(w[i])) return 0;
        amax = fmaxf(amax, fabsf(w[i]));
    }
    const uint16_t h = pytfm__half_bits(amax / 127.0f);
    if ((h & 0x7FFFu) == 0x7C00u) return 0;
    const float d = pytfm__half_to_float(h);
    for (int i = 0; i < PYTFM_Q8_BLOCK; i++) {
        const float v = d > 0.0f ? roundf(w[i] / d) : 0.0f; // roundf: half away from zero
        q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v);
    }
    *scale = h;
    return 1;
}

/* rows [0, out) of w (float32, or BF16 bits when w16) into q and scales; every block checked
 * before the first write, so a bad one leaves q and scales as they were */
static pytfm_status quantize(const char *func, int8_t *q, uint16_t *scales, const float *w,
                             const uint16_t *w16, int64_t out, int64_t in) {
    const int64_t nb = in / PYTFM_Q8_BLOCK;
    int8_t qb[PYTFM_Q8_BLOCK];
    float wb[PYTFM_Q8_BLOCK];
    for (int pass = 0; pass < 2; pass++)
        for (int64_t o = 0; o < out; o++)
            for (int64_t blk = 0; blk < nb; blk++) {
                const int64_t at = o * in + blk * PYTFM_Q8_BLOCK;
                if (w16) {
                    for (int i = 0; i < PYTFM_Q8_BLOCK; i++) {
                        const uint32_t u = (uint32_t)w16[at + i] << 16;
                        memcpy(wb + i, &u, sizeof u);
                    }
                } else {
                    memcpy(wb, w + at, sizeof wb);
                }
                uint16_t h = 0;
                if (!quantize_block(qb, &h, wb))
                    return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                                       "%s: row %lld, block %lld (columns %lld..%lld) of %s "
                                       "cannot be quantised: it holds inf or NaN, or its scale "
                                       "max|w|/127 overflows fp16 (max|w| >= 65520·127)",
                                       func, (long long)o, (long long)blk,
                                       (long long)(blk * PYTFM_Q8_BLOCK),
                                       (long long)(blk * PYTFM_Q8_BLOCK + PYTFM_Q8_BLOCK - 1),
                                       w16 ? "w16" : "w");
                if (pass == 1) {
                    memcpy(q + at, qb, sizeof qb);
                    scales[o * nb + blk] = h;
                }
            }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_quantize_q8(int8_t *q, uint16_t *scales, const float *w, int64_t out,
                               int64_t in) {
    PYTFM_TRY(pytfm__check_quantize_q8(__func__, q, scales, w, sizeof(float), out, in));
    return quantize(__func__, q, scales, w, NULL, out, in);
}

pytfm_status pytfm_quantize_q8_bf16(int8_t *q, uint16_t *scales, const uint16_t *w16,
                                    int64_t out, int64_t in) {
    PYTFM_TRY(pytfm__check_quantize_q8(__func__, q, scales, w16, sizeof(uint16_t), out, in));
    return quantize(__func__, q, scales, NULL, w16, out, in);
}

/* count values of W from q and scales (count a multiple of the block) */
static void dequantize(float *w, const int8_t *q, const uint16_t *scales, int64_t count) {
    for (int64_t blk = 0; blk < count / PYTFM_Q8_BLOCK; blk++) {
        const float d = pytfm__half_to_float(scales[blk]);
        for (int i = 0; i < PYTFM_Q8_BLOCK; i++)
            w[blk * PYTFM_Q8_BLOCK + i] = (float)q[blk * PYTFM_Q8_BLOCK + i] * d;
    }
}

pytfm_status pytfm_dequantize_q8(float *w, const int8_t *q, const uint16_t *scales, int64_t out,
                                 int64_t in) {
    PYTFM_TRY(pytfm__check_dequantize_q8(__func__, w, q, scales, out, in));
    const int64_t nb = in / PYTFM_Q8_BLOCK;
    PYTFM_PARALLEL_FOR_IF(out * in > Q8_SERIAL)
    for (int64_t o = 0; o < out; o++) dequantize(w + o * in, q + o * in, scales + o * nb, in);
    return PYTFM_STATUS_OK;
}

/* ---- the product: the plain loops ----------------------------------------------------------- */

/* x's row quantised per block (the plain kernel's aux: nothing) */
static void quantize_x_plain(pytfm__q8x *xq, const float *x, int64_t in) {
    xq->finite = 1;
    for (int64_t blk = 0; blk < in / PYTFM_Q8_BLOCK; blk++) {
        const float *xb = x + blk * PYTFM_Q8_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < PYTFM_Q8_BLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        if (!isfinite(amax) || xb[0] != xb[0]) xq->finite = 0; // fmaxf drops NaNs
        for (int i = 0; i < PYTFM_Q8_BLOCK; i++)
            if (xb[i] != xb[i]) xq->finite = 0;
        const float d = amax / 127.0f;
        for (int i = 0; i < PYTFM_Q8_BLOCK; i++) {
            const float v = d > 0.0f && xq->finite ? nearbyintf(xb[i] / d) : 0.0f;
            xq->qx[blk * PYTFM_Q8_BLOCK + i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127
                                                                                        : (int)v);
        }
        xq->dx[blk] = d;
    }
}

/* the 16 accumulators combined as the contract says: halves added pairwise, three times */
static float combine16(const float *a) {
    float h[8];
    for (int j = 0; j < 8; j++) h[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) h[j] += h[j + 4];
    for (int j = 0; j < 2; j++) h[j] += h[j + 2];
    return h[0] + h[1];
}

static void gemv_plain(float *y, const pytfm__q8x *xq, const int8_t *q, const uint16_t *scales,
                       const float *b, int64_t in, int64_t out) {
    const int64_t nb = in / PYTFM_Q8_BLOCK;
    for (int64_t o = 0; o < out; o++) {
        float acc[16] = {0};
        for (int64_t blk = 0; blk < nb; blk++) {
            const float scale = pytfm__half_to_float(scales[o * nb + blk]) * xq->dx[blk];
            const int8_t *qw = q + o * in + blk * PYTFM_Q8_BLOCK;
            const int8_t *qx = xq->qx + blk * PYTFM_Q8_BLOCK;
            for (int j = 0; j < 8; j++) {
                int32_t s = 0;
                for (int k = 0; k < 4; k++) s += (int32_t)qx[4 * j + k] * qw[4 * j + k];
                float *a = acc + 8 * (blk & 1) + j;
                *a = fmaf(scale, (float)s, *a);
            }
        }
        y[o] = combine16(acc);
        if (b) y[o] += b[o];
    }
}

const pytfm__q8_kernels pytfm__q8_plain = {"plain", quantize_x_plain, gemv_plain};

/* a row of x holding inf or NaN: y[o] = Σ_i x[i]·(q[o, i]·dw) in float32, in order of i */
static void gemv_float(float *y, const float *x, const int8_t *q, const uint16_t *scales,
                       const float *b, int64_t in, int64_t out) {
    const int64_t nb = in / PYTFM_Q8_BLOCK;
    for (int64_t o = 0; o < out; o++) {
        float s = 0.0f;
        for (int64_t i = 0; i < in; i++)
            s += x[i] * ((float)q[o * in + i] * pytfm__half_to_float(scales[o * nb + i / 32]));
        y[o] = b ? s + b[o] : s;
    }
}

/* ---- the product ----------------------------------------------------------------------------- */

static int allowed(int32_t cap, int32_t isa) { return cap == PYTFM_ISA_AUTO || isa <= cap; }

const pytfm__q8_kernels *pytfm__q8(void) {
    const int32_t cap = pytfm__isa_cap();
    const uint64_t f = pytfm__cpu_q8_features();
    const int avx2 = pytfm__cpu_has(PYTFM_ISA_AVX2) && (f & PYTFM__CPU_F16C);
    if (allowed(cap, PYTFM_ISA_AVX512_BF16) && pytfm__cpu_has(PYTFM_ISA_AVX512) &&
        (f & PYTFM__CPU_AVX512_VNNI) && pytfm__q8_avx512vnni.gemv)
        return &pytfm__q8_avx512vnni;
    if (allowed(cap, PYTFM_ISA_AVX512) && avx2 && (f & PYTFM__CPU_AVX_VNNI) &&
        pytfm__q8_avxvnni.gemv)
        return &pytfm__q8_avxvnni;
    if (allowed(cap, PYTFM_ISA_AVX2) && avx2 && pytfm__q8_avx2.gemv) return &pytfm__q8_avx2;
    return &pytfm__q8_plain;
}

/* xq's arrays in buf, the row's bytes (pytfm__q8x_bytes): qx, aux, dx, then the int32
 * `finite` that quantize_row leaves there */
static pytfm__q8x q8x_at(unsigned char *buf, int64_t in) {
    pytfm__q8x xq = {(int8_t *)buf, buf + in, (float *)(void *)(buf + 2 * in), 1};
    memcpy(&xq.finite, buf + 2 * in + 4 * (in / PYTFM_Q8_BLOCK), sizeof xq.finite);
    return xq;
}

/* x's row quantised by k into buf (pytfm__q8x_bytes(in)) */
static void quantize_row(const pytfm__q8_kernels *k, unsigned char *buf, const float *x,
                         int64_t in) {
    pytfm__q8x xq = q8x_at(buf, in);
    k->quantize_x(&xq, x, in);
    memcpy(buf + 2 * in + 4 * (in / PYTFM_Q8_BLOCK), &xq.finite, sizeof xq.finite);
}

/* W's rows [o0, o0 + n) for every row of x */
static void product_rows(const pytfm__q8_kernels *k, float *y, const float *x,
                         unsigned char *buf, const int8_t *q, const uint16_t *scales,
                         const float *b, int64_t rows, int64_t in, int64_t out, int64_t o0,
                         int64_t n) {
    const int64_t nb = in / PYTFM_Q8_BLOCK, row_bytes = pytfm__q8x_bytes(in);
    for (int64_t r = 0; r < rows; r++) {
        const pytfm__q8x xq = q8x_at(buf + r * row_bytes, in);
        if (xq.finite)
            k->gemv(y + r * out + o0, &xq, q + o0 * in, scales + o0 * nb, b ? b + o0 : NULL, in,
                    n);
        else
            gemv_float(y + r * out + o0, x + r * in, q + o0 * in, scales + o0 * nb,
                       b ? b + o0 : NULL, in, n);
    }
}

pytfm_status pytfm_linear_forward_q8w(float *y, const float *x, const int8_t *q,
                                      const uint16_t *scales, const float *b, int64_t rows,
                                      int64_t in, int64_t out) {
    PYTFM_TRY(pytfm__check_linear_forward_q8w(__func__, y, x, q, scales, b, rows, in, out));
    if (rows == 0) return PYTFM_STATUS_OK;
    const pytfm__q8_kernels *k = pytfm__q8();
    const int64_t row_bytes = pytfm__q8x_bytes(in);
    _Alignas(64) unsigned char stack[2 * Q8_STACK_IN + 4 * (Q8_STACK_IN / 32) + 64];
    unsigned char *buf = stack;
    if (rows > 1 || in > Q8_STACK_IN) {
        buf = pytfm__scratch(__func__, rows * row_bytes, 1);
        if (!buf) return PYTFM_STATUS_OUT_OF_MEMORY;
    }
    for (int64_t r = 0; r < rows; r++) quantize_row(k, buf + r * row_bytes, x + r * in, in);
    if (rows * out * in <= Q8_SERIAL) {
        product_rows(k, y, x, buf, q, scales, b, rows, in, out, 0, out);
    } else {
        PYTFM_PARALLEL_FOR
        for (int64_t o0 = 0; o0 < out; o0 += Q8_BLOCK_ROWS)
            product_rows(k, y, x, buf, q, scales, b, rows, in, out, o0,
                         PYTFM_MIN(Q8_BLOCK_ROWS, out - o0));
    }
    if (buf != stack) free(buf);
    return PYTFM_STATUS_OK;
}

/* ---- the embedding --------------------------------------------------------------------------- */

pytfm_status pytfm_embedding_forward_q8w(float *y, const int64_t *ids, const int8_t *q,
                                         const uint16_t *scales, int64_t rows, int64_t vocab,
                                         int64_t dim) {
    PYTFM_TRY(pytfm__check_embedding_forward_q8w(__func__, y, ids, q, scales, rows, vocab, dim));
    PYTFM_TRY(pytfm__check_indices(__func__, "ids", ids, rows, vocab, 0, 0));
    const int64_t nb = dim / PYTFM_Q8_BLOCK;
    PYTFM_PARALLEL_FOR_IF(rows * dim > Q8_SERIAL)
    for (int64_t i = 0; i < rows; i++)
        dequantize(y + i * dim, q + ids[i] * dim, scales + ids[i] * nb, dim);
    return PYTFM_STATUS_OK;
}
