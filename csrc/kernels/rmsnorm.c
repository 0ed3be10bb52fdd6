/*
 * rmsnorm.c — RMSNorm over the last axis, with a weight (the Llama family's norm).
 *
 *   x, y [rows, cols]; w [cols]; rstd [rows] (saved for the backward)
 *   forward:  rstd = 1/sqrt(mean(x²) + eps),  x̂ = x · rstd,  y = x̂ ∘ w
 *   backward: with g = dy ∘ w (the gradient reaching x̂),
 *             dx = rstd · (g − x̂ · mean(g ∘ x̂))        (written)
 *             dw += Σ_rows dy ∘ x̂                       (accumulated)
 * LayerNorm without the mean and the bias. The plain version sums in double
 * (pytfm__rmsnorm_forward_row, below); the fast one (fast_impl.h) in float over 16 lanes, and
 * falls back to the plain row where that sum overflows (values past ~1e19) or underflows (a
 * row under ~1e-15 with eps = 0), as LayerNorm's does. The fast backward sums dw over 16 fixed
 * chunks of rows, so its bits do not depend on the thread count.
 */
#include <stdlib.h>
#include <string.h>

#include "core/checks.h"
#include "fast.h"

/* The plain row: summed in double, which holds the square of any float. */
void pytfm__rmsnorm_forward_row(float *y, float *rstd, const float *x, const float *w,
                                int64_t cols, float eps) {
    double ss = 0.0;
    for (int64_t j = 0; j < cols; j++) ss += (double)x[j] * x[j];
    const double rs = 1.0 / sqrt(ss / (double)cols + eps);
    for (int64_t j = 0; j < cols; j++) y[j] = (float)(x[j] * rs) * w[j];
    *rstd = (float)rs;
}

pytfm_status pytfm_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w,
                                   int64_t rows, int64_t cols, float eps) {
    PYTFM_TRY(pytfm__check_rmsnorm_forward(__func__, y, rstd, x, w, rows, cols, eps));
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k && pytfm__one_task(rows, cols)) { // no parallel region for one task
        for (int64_t r = 0; r < rows; r++)
            k->rmsnorm_forward(y + r * cols, rstd + r, x + r * cols, w, cols, eps);
        return PYTFM_STATUS_OK;
    }
    if (k) {
        PYTFM_PARALLEL_ROWS(rows, cols)
        for (int64_t r = 0; r < rows; r++)
            k->rmsnorm_forward(y + r * cols, rstd + r, x + r * cols, w, cols, eps);
        return PYTFM_STATUS_OK;
    }
    for (int64_t r = 0; r < rows; r++) // the plain reference
        pytfm__rmsnorm_forward_row(y + r * cols, rstd + r, x + r * cols, w, cols, eps);
    return PYTFM_STATUS_OK;
}

/* The fast backward: rows split into RMS_CHUNKS fixed chunks, each summing its own partial dw
 * (scratch: min(rows, RMS_CHUNKS)·cols floats), then added into dw in chunk order. */
enum { RMS_CHUNKS = 16 };

static pytfm_status backward_fast(const char *func, const pytfm__fast_kernels *k, float *dx,
                                  float *dw, const float *dy, const float *x, const float *w,
                                  const float *rstd, int64_t rows, int64_t cols) {
    const int64_t chunks = PYTFM_MIN(rows, (int64_t)RMS_CHUNKS);
    float *part = pytfm__scratch(func, chunks * cols, sizeof(float)); // (chunks, cols)
    if (!part) return PYTFM_STATUS_OUT_OF_MEMORY;
    PYTFM_PARALLEL_FOR_IF(rows * cols > PYTFM_TASK_ELEMS)
    for (int64_t c = 0; c < chunks; c++) {
        float *pdw = part + c * cols;
        memset(pdw, 0, (size_t)cols * sizeof(float));
        for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; r++)
            k->rmsnorm_backward(dx + r * cols, pdw, dy + r * cols, x + r * cols, w, rstd[r],
                                cols);
    }
    for (int64_t c = 0; c < chunks; c++)
        for (int64_t j = 0; j < cols; j++) dw[j] += part[c * cols + j];
    free(part);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x,
                                    const float *w, const float *rstd, int64_t rows,
                                    int64_t cols) {
    PYTFM_TRY(pytfm__check_rmsnorm_backward(__func__, dx, dw, dy, x, w, rstd, rows, cols));
    if (rows == 0) return PYTFM_STATUS_OK;
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k) return backward_fast(__func__, k, dx, dw, dy, x, w, rstd, rows, cols);
    for (int64_t r = 0; r < rows; r++) { // the plain reference
        const float *dyr = dy + r * cols, *xr = x + r * cols;
        float *dxr = dx + r * cols;
        const float rs = rstd[r];
        double gx_sum = 0.0;
        for (int64_t j = 0; j < cols; j++) {
            const float xhat = xr[j] * rs;
            gx_sum += (double)(dyr[j] * w[j]) * xhat;
            dw[j] += dyr[j] * xhat;
        }
        const float gx_mean = (float)(gx_sum / (double)cols);
        for (int64_t j = 0; j < cols; j++)
            dxr[j] = rs * (dyr[j] * w[j] - xr[j] * rs * gx_mean);
    }
    return PYTFM_STATUS_OK;
}
