/*
 * linear.c — fully connected layer, y = x·Wᵀ + b.
 *
 *   x [rows, in], W [out, in] (torch.nn.Linear layout), b [out], y [rows, out]
 *   forward:  y[r, o] = b[o] + Σ_i x[r, i] W[o, i]                     y  = x·Wᵀ (+ b)
 *   backward: dx[r, i] = Σ_o dy[r, o] W[o, i]          (written)       dx = dy·W
 *             dW[o, i] += Σ_r dy[r, o] x[r, i]         (accumulated)   dW += dyᵀ·x
 *             db[o] += Σ_r dy[r, o]                    (accumulated)
 * Nothing is saved: the backward needs x and W, which the caller still has.
 * With GELU after it (the MLP's first layer): h = x·Wᵀ + b, y = gelu(h) (gelu.c), h saved for
 * GELU's backward. The bias and the GELU are the product's epilogue (internal.h): each block
 * of h gets them as soon as its sum is complete, while it is in L2, instead of in passes of
 * their own over h in memory. The products go
 * through sgemm.c (transposes are handled by its packing, not by copies); the backward's two
 * share one scratch allocation, so that its failure leaves dx, dW and db as they were.
 * One row (a token decoded through a KV cache) is a matrix-vector product: packing W for the
 * micro-kernel would copy every weight to use it once, and the micro-kernel would compute MR
 * rows for one. The fast kernels (isa above PLAIN) take it as out dot products along W's
 * contiguous rows (fast_impl.h gemv), blocks of GEMV_BLOCK outputs to threads. A W larger
 * than STREAM_FLOATS is not in the caches: it is read from memory, and gemv_rows reads it as
 * one sequential stream (a row at a time), which is what the hardware prefetcher keeps up
 * with. A few rows (a short prompt: up to FEW_ROWS_CACHED, or FEW_ROWS for a W that streams)
 * take gemv_rows too: W read once for all of them, where the packed product would pack it for
 * few rows; each of their rows is the bits the one-row product gives it (the same sums in the
 * same order), so that a prompt fed at once gets a token's bits in the linear layers. A W in
 * the caches is no stream to share: from 5 rows on there the micro-kernel is faster. The
 * figures are in docs/performance.md.
 * In BF16, W may be given as BF16 only (pytfm_linear_forward_bf16w, and the C model of a BF16
 * file: w NULL, w16 set): the one-row kernels read w16 as they read a BF16 copy, and the
 * packed product takes it as product_bf16_weights says, each way the bits of W's float32
 * widening. forward() reads w on no branch a BF16 product takes but the packed product's on
 * float32 weights, which w NULL leaves for product_bf16_weights.
 */
#include <stdlib.h>
#include <string.h>

#include "core/checks.h"
#include "fast.h"

enum {
    GEMV_BLOCK = 64,        /* outputs per parallel task of a one-row or few-row product */
    FEW_ROWS = 7,           /* the most rows gemv_rows takes instead of the packed product */
    FEW_ROWS_CACHED = 4,    /* ... when W is at most STREAM_FLOATS */
    STREAM_FLOATS = 1 << 18, /* a W above this many floats (1 MiB: a core's L2) streams */
    WIDEN_FLOATS = 1 << 18   /* a block of a BF16-only W widened at once (product_bf16_weights) */
};

/* whether the FP32 product of rows rows and a W [out, in] takes few_rows (the fast ISAs) */
static int few_rows_take(int64_t rows, int64_t in, int64_t out) {
    const int streams = out * in > STREAM_FLOATS;
    return rows == 1 ? streams : rows >= 2 && rows <= (streams ? FEW_ROWS : FEW_ROWS_CACHED);
}

/* y = x·Wᵀ + b for rows <= FEW_ROWS by the fast table's gemv_rows, output blocks to threads
 * where there is work to share */
static void few_rows(const pytfm__fast_kernels *k, float *h, const float *x, const float *w,
                     const float *b, int64_t rows, int64_t in, int64_t out) {
    if (rows * out * in <= 4 * PYTFM_TASK_ELEMS) { // no parallel region (internal.h)
        k->gemv_rows(h, out, x, in, rows, w, in, b, in, out);
        return;
    }
    PYTFM_PARALLEL_FOR
    for (int64_t o = 0; o < out; o += GEMV_BLOCK)
        k->gemv_rows(h + o, out, x, in, rows, w + o * in, in, b ? b + o : NULL, in,
                     PYTFM_MIN(GEMV_BLOCK, out - o));
}

/* The one-row product y = x·Wᵀ + b in BF16 (w16: W's BF16 copy, or NULL): the AVX512-BF16
 * kernel, else the fast table's, as forward() splits the FP32 one among threads; each reads
 * four rows of W at a time, the next four prefetched, whether W is in the caches or comes from
 * memory (a W from memory a row at a time, as the FP32 product takes it, measured a third of
 * the rate: docs/performance.md) */
static void one_row_bf16(const pytfm__fast_kernels *k, float *h, const float *x, const float *w,
                         const uint16_t *w16, const float *b, int64_t in, int64_t out) {
    const int dp = pytfm_get_bf16_isa() == PYTFM_ISA_AVX512_BF16;
    if (out * in <= 4 * PYTFM_TASK_ELEMS) { // no parallel region (internal.h)
        if (dp)
            pytfm__gemv_bf16(h, x, w, w16, in, b, in, out);
        else
            k->gemv_bf16(h, x, w, w16, in, b, in, out);
        return;
    }
    PYTFM_PARALLEL_FOR
    for (int64_t o = 0; o < out; o += GEMV_BLOCK) {
        const int64_t n = PYTFM_MIN(GEMV_BLOCK, out - o);
        const uint16_t *w16o = w16 ? w16 + o * in : NULL;
        const float *wo = w16 ? NULL : w + o * in; // w is NULL where w16 holds the weights
        if (dp)
            pytfm__gemv_bf16(h + o, x, wo, w16o, in, b ? b + o : NULL, in, n);
        else
            k->gemv_bf16(h + o, x, wo, w16o, in, b ? b + o : NULL, in, n);
    }
}

/* The packed BF16 product h = x·Wᵀ + b of a W given in BF16 only (w16 [out, in]), the bits of
 * the product on W's float32 widening: on AVX512-BF16 the BF16 driver packs w16's pairs as
 * they are (pairs_of_bf16: what it makes of the widening); elsewhere W is widened WIDEN_FLOATS
 * at a time, a block of its rows, and each block's product computed into a scratch of the
 * block's columns of h, then copied there. That is the whole product's bits: every element of
 * h is summed on its own (a lane of a micro-kernel, or the plain loop's dot product) over the
 * same k slices in the same order, whatever the columns around it. Scratch: the packing's, or
 * WIDEN_FLOATS + rows × the block's columns floats. */
static pytfm_status product_bf16_weights(const char *func, float *h, const float *x,
                                         const uint16_t *w16, const float *b, int64_t rows,
                                         int64_t in, int64_t out) {
    if (rows == 0 || out == 0) return PYTFM_STATUS_OK;
    const pytfm__epilogue e = {b, NULL, NULL};
    if (pytfm_get_bf16_isa() == PYTFM_ISA_AVX512_BF16 && in > 0) {
        const int64_t threads = pytfm_get_num_threads();
        const pytfm__product g = {h,    x, NULL, rows, out, in, 0, 1, 0.0f, b ? &e : NULL,
                                  PYTFM_PRECISION_BF16, w16};
        uint32_t *buf = pytfm__scratch(func, pytfm__gemm_bf16_scratch(&g, threads), 4);
        if (!buf) return PYTFM_STATUS_OUT_OF_MEMORY;
        pytfm__gemm_bf16(&g, threads, buf);
        free(buf);
        return PYTFM_STATUS_OK;
    }
    const int64_t per_block = in > 0 && in < WIDEN_FLOATS ? WIDEN_FLOATS / in : 1;
    const int64_t block = PYTFM_MIN(out, per_block); // rows of W
    float *wb = pytfm__scratch(func, block * in + rows * block, sizeof(float));
    if (!wb) return PYTFM_STATUS_OUT_OF_MEMORY;
    float *hb = wb + block * in;
    pytfm_status st = PYTFM_STATUS_OK;
    for (int64_t o0 = 0; o0 < out && st == PYTFM_STATUS_OK; o0 += block) {
        const int64_t n = PYTFM_MIN(block, out - o0);
        for (int64_t i = 0; i < n * in; i++) { // exactly: a BF16 value is a float's top half
            const uint32_t u = (uint32_t)w16[o0 * in + i] << 16;
            memcpy(wb + i, &u, sizeof u);
        }
        const pytfm__epilogue eb = {b ? b + o0 : NULL, NULL, NULL};
        const pytfm__product g = {hb, x, wb, rows, n, in, 0, 1, 0.0f, b ? &eb : NULL,
                                  PYTFM_PRECISION_BF16, NULL};
        st = pytfm__sgemm_all(func, &g, 1);
        for (int64_t r = 0; st == PYTFM_STATUS_OK && r < rows; r++)
            memcpy(h + r * out + o0, hb + r * n, (size_t)n * sizeof(float));
    }
    free(wb);
    return st;
}

/* h = x·Wᵀ + b, and y = gelu(h) when y is not NULL: both forwards, in either precision (w16:
 * W's BF16 copy for the one-row BF16 product, or NULL). The bias and the GELU are the
 * product's epilogue (sgemm.c applies it to each block of h while the block is in L2); the
 * plain ISA, which has no row kernel for GELU to lend the epilogue, and the one-row and few-row
 * products take the GELU as pytfm_gelu_forward's own pass, whose bits the epilogue's equal. */
static pytfm_status forward(const char *func, float *y, float *h, const float *x, const float *w,
                            const uint16_t *w16, const float *b, int64_t rows, int64_t in,
                            int64_t out, int precision) {
    const pytfm__fast_kernels *k = pytfm__fast();
    // BF16 on a few rows without AVX512-BF16: each row by the fallback row kernel, which is
    // the FP32 one-row product on the rounded copies, so that a few rows stay the FP32 few-row
    // product's bits on them, as one row is (AVX512-BF16 takes the packed product instead)
    const int bf16_rows = rows == 1 || (few_rows_take(rows, in, out) &&
                                        pytfm_get_bf16_isa() != PYTFM_ISA_AVX512_BF16);
    if (k && precision == PYTFM_PRECISION_BF16 && bf16_rows) {
        for (int64_t r = 0; r < rows; r++)
            one_row_bf16(k, h + r * out, x + r * in, w, w16, b, in, out);
    } else if (k && precision == PYTFM_PRECISION_FP32 && few_rows_take(rows, in, out)) {
        few_rows(k, h, x, w, b, rows, in, out);
    } else if (rows == 1 && k && out * in <= 4 * PYTFM_TASK_ELEMS) { // no parallel region
        k->gemv(h, x, w, in, b, in, out);
    } else if (rows == 1 && k) {
        PYTFM_PARALLEL_FOR
        for (int64_t o = 0; o < out; o += GEMV_BLOCK)
            k->gemv(h + o, x, w + o * in, in, b ? b + o : NULL, in,
                    PYTFM_MIN(GEMV_BLOCK, out - o));
    } else if (!w) { // BF16 weights only (pytfm__linear_forward_bf16), no GELU
        return product_bf16_weights(func, h, x, w16, b, rows, in, out);
    } else {
        const pytfm__epilogue e = {b, k ? y : NULL, k ? k->gelu_forward : NULL};
        const pytfm__product h_xwt = {h, x, w, rows, out, in, 0, 1, 0.0f,
                                      b || e.act ? &e : NULL, precision, NULL};
        PYTFM_TRY(pytfm__sgemm_all(func, &h_xwt, 1));
        if (e.act) return PYTFM_STATUS_OK;
    }
    return y ? pytfm_gelu_forward(y, h, rows * out) : PYTFM_STATUS_OK;
}

pytfm_status pytfm_linear_forward(float *y, const float *x, const float *w, const float *b,
                                  int64_t rows, int64_t in, int64_t out) {
    PYTFM_TRY(pytfm__check_linear_forward(__func__, y, x, w, b, rows, in, out));
    return forward(__func__, NULL, y, x, w, NULL, b, rows, in, out, PYTFM_PRECISION_FP32);
}

pytfm_status pytfm_linear_forward_ex(float *y, const float *x, const float *w, const float *b,
                                     int64_t rows, int64_t in, int64_t out, int32_t precision) {
    PYTFM_TRY(pytfm__check_precision(__func__, precision));
    PYTFM_TRY(pytfm__check_linear_forward(__func__, y, x, w, b, rows, in, out));
    return forward(__func__, NULL, y, x, w, NULL, b, rows, in, out, precision);
}

pytfm_status pytfm__linear_forward_bf16(const char *func, float *y, const float *x,
                                        const float *w, const uint16_t *w16, const float *b,
                                        int64_t rows, int64_t in, int64_t out) {
    return forward(func, NULL, y, x, w, w16, b, rows, in, out, PYTFM_PRECISION_BF16);
}

pytfm_status pytfm_linear_forward_bf16w(float *y, const float *x, const uint16_t *w16,
                                        const float *b, int64_t rows, int64_t in, int64_t out) {
    PYTFM_TRY(pytfm__check_linear_forward_bf16w(__func__, y, x, w16, b, rows, in, out));
    return forward(__func__, NULL, y, x, NULL, w16, b, rows, in, out, PYTFM_PRECISION_BF16);
}

pytfm_status pytfm_linear_gelu_forward(float *y, float *h, const float *x, const float *w,
                                       const float *b, int64_t rows, int64_t in, int64_t out) {
    PYTFM_TRY(pytfm__check_linear_gelu_forward(__func__, y, h, x, w, b, rows, in, out));
    return forward(__func__, y, h, x, w, NULL, b, rows, in, out, PYTFM_PRECISION_FP32);
}

pytfm_status pytfm_linear_gelu_forward_ex(float *y, float *h, const float *x, const float *w,
                                          const float *b, int64_t rows, int64_t in, int64_t out,
                                          int32_t precision) {
    PYTFM_TRY(pytfm__check_precision(__func__, precision));
    PYTFM_TRY(pytfm__check_linear_gelu_forward(__func__, y, h, x, w, b, rows, in, out));
    return forward(__func__, y, h, x, w, NULL, b, rows, in, out, precision);
}

/* dW += dyᵀ·x and dx = dy·W (when dx is wanted) in one scratch allocation, then db += the
 * column sums of dy (in float32 whatever the precision: a sum, not a product) */
static pytfm_status backward(const char *func, float *dx, float *dw, float *db, const float *dy,
                             const float *x, const float *w, int64_t rows, int64_t in,
                             int64_t out, int precision) {
    const pytfm__product products[2] = {
        // dW += dyᵀ·x: dy [rows, out] = op(A)ᵀ
        {dw, dy, x, out, in, rows, 1, 0, 1.0f, NULL, precision, NULL},
        {dx, dy, w, rows, in, out, 0, 0, 0.0f, NULL, precision, NULL}, // dx = dy·W, if wanted
    };
    PYTFM_TRY(pytfm__sgemm_all(func, products, dx ? 2 : 1));
    if (db) { // column blocks to threads; each column summed over the rows in order
        enum { COLS = 64 };
        PYTFM_PARALLEL_FOR_IF(rows * out > PYTFM_TASK_ELEMS && out > COLS)
        for (int64_t o0 = 0; o0 < out; o0 += COLS) {
            // the block's sums in a local array: db[o] += dy[r, o] for r in order, as on db
            // itself, but the compiler may keep them in vectors (db could alias dy otherwise)
            const int64_t n = PYTFM_MIN(COLS, out - o0);
            float sum[COLS];
            memcpy(sum, db + o0, (size_t)n * sizeof(float));
            for (int64_t r = 0; r < rows; r++) {
                const float *row = dy + r * out + o0;
                for (int64_t o = 0; o < n; o++) sum[o] += row[o];
            }
            memcpy(db + o0, sum, (size_t)n * sizeof(float));
        }
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_linear_backward(float *dx, float *dw, float *db, const float *dy,
                                   const float *x, const float *w, int64_t rows, int64_t in,
                                   int64_t out) {
    PYTFM_TRY(pytfm__check_linear_backward(__func__, dx, dw, db, dy, x, w, rows, in, out));
    return backward(__func__, dx, dw, db, dy, x, w, rows, in, out, PYTFM_PRECISION_FP32);
}

pytfm_status pytfm_linear_backward_ex(float *dx, float *dw, float *db, const float *dy,
                                      const float *x, const float *w, int64_t rows, int64_t in,
                                      int64_t out, int32_t precision) {
    PYTFM_TRY(pytfm__check_precision(__func__, precision));
    PYTFM_TRY(pytfm__check_linear_backward(__func__, dx, dw, db, dy, x, w, rows, in, out));
    return backward(__func__, dx, dw, db, dy, x, w, rows, in, out, precision);
}
