/*
 * softmax.c — softmax over the last axis.
 *
 *   x, y [rows, cols]
 *   forward:  y = exp(x − max x) / Σ exp(x − max x)      (subtracting the row max keeps every
 *             exponent ≤ 0, so no overflow however large x is)
 *   backward: with s = Σ_j dy_j y_j,  dx_i = y_i (dy_i − s)
 * The forward's output y is what the backward needs; nothing else is saved.
 */
#include "core/checks.h"
#include "fast.h"

pytfm_status pytfm_softmax_forward(float *y, const float *x, int64_t rows, int64_t cols) {
    PYTFM_TRY(pytfm__check_softmax_forward(__func__, y, x, rows, cols));
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k) {
        PYTFM_PARALLEL_ROWS(rows, cols)
        for (int64_t r = 0; r < rows; r++) k->softmax_forward(y + r * cols, x + r * cols, cols);
        return PYTFM_STATUS_OK;
    }
    for (int64_t r = 0; r < rows; r++) { // the plain reference
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float max = -INFINITY;
        for (int64_t j = 0; j < cols; j++) max = xr[j] > max ? xr[j] : max;
        double sum = 0.0;
        for (int64_t j = 0; j < cols; j++) {
            yr[j] = expf(xr[j] - max);
            sum += yr[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < cols; j++) yr[j] *= inv;
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_softmax_backward(float *dx, const float *dy, const float *y, int64_t rows,
                                    int64_t cols) {
    PYTFM_TRY(pytfm__check_softmax_backward(__func__, dx, dy, y, rows, cols));
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k) {
        PYTFM_PARALLEL_ROWS(rows, cols)
        for (int64_t r = 0; r < rows; r++)
            k->softmax_backward(dx + r * cols, dy + r * cols, y + r * cols, cols);
        return PYTFM_STATUS_OK;
    }
    for (int64_t r = 0; r < rows; r++) { // the plain reference
        const float *dyr = dy + r * cols, *yr = y + r * cols;
        float *dxr = dx + r * cols;
        double s = 0.0;
        for (int64_t j = 0; j < cols; j++) s += (double)dyr[j] * yr[j];
        for (int64_t j = 0; j < cols; j++) dxr[j] = yr[j] * (dyr[j] - (float)s);
    }
    return PYTFM_STATUS_OK;
}
