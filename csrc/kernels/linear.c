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
 * contiguous rows (fast_impl.h gemv), blocks of GEMV_BLOCK outputs to threads (the decode
 * figures are in docs/performance.md).
 */
#include "core/checks.h"
#include "fast.h"

enum { GEMV_BLOCK = 64 }; /* outputs per parallel task of a one-row product */

/* h = x·Wᵀ + b, and y = gelu(h) when y is not NULL: both forwards. The bias and the GELU are
 * the product's epilogue (sgemm.c applies it to each block of h while the block is in L2); the
 * plain ISA, which has no row kernel for GELU to lend the epilogue, and the one-row product
 * take the GELU as pytfm_gelu_forward's own pass, whose bits the epilogue's equal. */
static pytfm_status forward(const char *func, float *y, float *h, const float *x, const float *w,
                            const float *b, int64_t rows, int64_t in, int64_t out) {
    const pytfm__fast_kernels *k = pytfm__fast();
    if (rows == 1 && k && out * in <= 4 * PYTFM_TASK_ELEMS) { // no parallel region (internal.h)
        k->gemv(h, x, w, in, b, in, out);
    } else if (rows == 1 && k) {
        PYTFM_PARALLEL_FOR
        for (int64_t o = 0; o < out; o += GEMV_BLOCK)
            k->gemv(h + o, x, w + o * in, in, b ? b + o : NULL, in,
                    PYTFM_MIN(GEMV_BLOCK, out - o));
    } else {
        const pytfm__epilogue e = {b, k ? y : NULL, k ? k->gelu_forward : NULL};
        const pytfm__product h_xwt = {h, x, w, rows, out, in, 0, 1, 0.0f,
                                      b || e.act ? &e : NULL};
        PYTFM_TRY(pytfm__sgemm_all(func, &h_xwt, 1));
        if (e.act) return PYTFM_STATUS_OK;
    }
    return y ? pytfm_gelu_forward(y, h, rows * out) : PYTFM_STATUS_OK;
}

pytfm_status pytfm_linear_forward(float *y, const float *x, const float *w, const float *b,
                                  int64_t rows, int64_t in, int64_t out) {
    PYTFM_TRY(pytfm__check_linear_forward(__func__, y, x, w, b, rows, in, out));
    return forward(__func__, NULL, y, x, w, b, rows, in, out);
}

pytfm_status pytfm_linear_gelu_forward(float *y, float *h, const float *x, const float *w,
                                       const float *b, int64_t rows, int64_t in, int64_t out) {
    PYTFM_TRY(pytfm__check_linear_gelu_forward(__func__, y, h, x, w, b, rows, in, out));
    return forward(__func__, y, h, x, w, b, rows, in, out);
}

pytfm_status pytfm_linear_backward(float *dx, float *dw, float *db, const float *dy,
                                   const float *x, const float *w, int64_t rows, int64_t in,
                                   int64_t out) {
    PYTFM_TRY(pytfm__check_linear_backward(__func__, dx, dw, db, dy, x, w, rows, in, out));
    const pytfm__product products[2] = {
        {dw, dy, x, out, in, rows, 1, 0, 1.0f, NULL}, // dW += dyᵀ·x: dy [rows, out] = op(A)ᵀ
        {dx, dy, w, rows, in, out, 0, 0, 0.0f, NULL}, // dx = dy·W, when dx is wanted
    };
    PYTFM_TRY(pytfm__sgemm_all(__func__, products, dx ? 2 : 1));
    if (db) { // column blocks to threads; each column summed over the rows in order
        enum { COLS = 64 };
        PYTFM_PARALLEL_FOR_IF(rows * out > PYTFM_TASK_ELEMS && out > COLS)
        for (int64_t o0 = 0; o0 < out; o0 += COLS)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t o = o0; o < PYTFM_MIN(out, o0 + COLS); o++) db[o] += dy[r * out + o];
    }
    return PYTFM_STATUS_OK;
}
