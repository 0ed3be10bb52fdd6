/*
 * linear.c — fully connected layer, y = x·Wᵀ + b.
 *
 *   x [rows, in], W [out, in] (torch.nn.Linear layout), b [out], y [rows, out]
 *   forward:  y[r, o] = b[o] + Σ_i x[r, i] W[o, i]                     y  = x·Wᵀ (+ b)
 *   backward: dx[r, i] = Σ_o dy[r, o] W[o, i]          (written)       dx = dy·W
 *             dW[o, i] += Σ_r dy[r, o] x[r, i]         (accumulated)   dW += dyᵀ·x
 *             db[o] += Σ_r dy[r, o]                    (accumulated)
 * Nothing is saved: the backward needs x and W, which the caller still has. The products go
 * through sgemm.c (transposes are handled by its packing, not by copies); the backward's two
 * share one scratch allocation, so that its failure leaves dx, dW and db as they were.
 */
#include "checks.h"

pytfm_status pytfm_linear_forward(float *y, const float *x, const float *w, const float *b,
                                  int64_t rows, int64_t in, int64_t out) {
    PYTFM_TRY(pytfm__check_linear_forward(__func__, y, x, w, b, rows, in, out));
    const pytfm__product y_xwt = {y, x, w, rows, out, in, 0, 1, 0.0f};
    PYTFM_TRY(pytfm__sgemm_all(__func__, &y_xwt, 1));
    if (b) {
        PYTFM_PARALLEL_ROWS(rows, out)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t o = 0; o < out; o++) y[r * out + o] += b[o];
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_linear_backward(float *dx, float *dw, float *db, const float *dy,
                                   const float *x, const float *w, int64_t rows, int64_t in,
                                   int64_t out) {
    PYTFM_TRY(pytfm__check_linear_backward(__func__, dx, dw, db, dy, x, w, rows, in, out));
    const pytfm__product products[2] = {
        {dw, dy, x, out, in, rows, 1, 0, 1.0f}, // dW += dyᵀ·x: dy stored [rows, out] = op(A)ᵀ
        {dx, dy, w, rows, in, out, 0, 0, 0.0f}, // dx = dy·W, when dx is wanted
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
