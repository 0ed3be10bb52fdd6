/*
 * layernorm.c — LayerNorm over the last axis, with weight and bias.
 *
 *   x, y [rows, cols]; w, b [cols]; mean, rstd [rows] (saved for the backward)
 *   forward:  μ = mean(x), σ² = mean((x − μ)²)  (biased), rstd = 1/sqrt(σ² + eps)
 *             x̂ = (x − μ) · rstd,  y = x̂ ∘ w + b
 *   backward: with g = dy ∘ w (the gradient reaching x̂),
 *             dx = rstd · (g − mean(g) − x̂ · mean(g ∘ x̂))      (written)
 *             dw += Σ_rows dy ∘ x̂,  db += Σ_rows dy            (accumulated)
 * Two passes over each row (mean, then centred variance), so the variance does not cancel
 * when |μ| ≫ σ. The plain version sums in double (pytfm__layernorm_forward_row, below); the
 * fast one (fast_impl.h) in float, over x − x[0], whose small differences keep the digits of
 * x − μ that a float sum of x rounds away, and falls back to the plain row where the float sums
 * overflow (values past ~1e19, whose squares pass FLT_MAX) or underflow (spread under ~1e-15
 * with eps = 0): a check per row, the fallback as rare as such rows.
 */
#include <stdlib.h>
#include <string.h>

#include "core/checks.h"
#include "fast.h"

/* The plain row: summed in double, which holds the squares of any float's difference. */
void pytfm__layernorm_forward_row(float *y, float *mean, float *rstd, const float *x,
                                  const float *w, const float *b, int64_t cols, float eps) {
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++) sum += x[j];
    const double mu = sum / (double)cols;
    double ss = 0.0;
    for (int64_t j = 0; j < cols; j++) ss += (x[j] - mu) * (x[j] - mu);
    const double rs = 1.0 / sqrt(ss / (double)cols + eps);
    for (int64_t j = 0; j < cols; j++) y[j] = (float)((x[j] - mu) * rs) * w[j] + b[j];
    *mean = (float)mu;
    *rstd = (float)rs;
}

pytfm_status pytfm_layernorm_forward(float *y, float *mean, float *rstd, const float *x,
                                     const float *w, const float *b, int64_t rows, int64_t cols,
                                     float eps) {
    PYTFM_TRY(pytfm__check_layernorm_forward(__func__, y, mean, rstd, x, w, b, rows, cols, eps));
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k && pytfm__one_task(rows, cols)) { // no parallel region for one task
        for (int64_t r = 0; r < rows; r++)
            k->layernorm_forward(y + r * cols, mean + r, rstd + r, x + r * cols, w, b, cols, eps);
        return PYTFM_STATUS_OK;
    }
    if (k) {
        PYTFM_PARALLEL_ROWS(rows, cols)
        for (int64_t r = 0; r < rows; r++)
            k->layernorm_forward(y + r * cols, mean + r, rstd + r, x + r * cols, w, b, cols, eps);
        return PYTFM_STATUS_OK;
    }
    for (int64_t r = 0; r < rows; r++) // the plain reference
        pytfm__layernorm_forward_row(y + r * cols, mean + r, rstd + r, x + r * cols, w, b, cols,
                                     eps);
    return PYTFM_STATUS_OK;
}

/* The fast backward: rows split into LN_CHUNKS fixed chunks (not one per thread, so the sums
 * do not depend on the thread count), each summing its own partial dw, db; the partials are
 * then added into dw, db in chunk order. They are scratch: 2·min(rows, LN_CHUNKS)·cols floats. */
enum { LN_CHUNKS = 16 };

static pytfm_status backward_fast(const char *func, const pytfm__fast_kernels *k, float *dx,
                                  float *dw, float *db, const float *dy, const float *x,
                                  const float *w, const float *mean, const float *rstd,
                                  int64_t rows, int64_t cols) {
    const int64_t chunks = PYTFM_MIN(rows, (int64_t)LN_CHUNKS);
    float *part = pytfm__scratch(func, 2 * chunks * cols, sizeof(float)); // (chunks, 2, cols)
    if (!part) return PYTFM_STATUS_OUT_OF_MEMORY;
    PYTFM_PARALLEL_FOR_IF(rows * cols > PYTFM_TASK_ELEMS)
    for (int64_t c = 0; c < chunks; c++) {
        float *pdw = part + 2 * c * cols, *pdb = pdw + cols;
        memset(pdw, 0, (size_t)(2 * cols) * sizeof(float));
        for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; r++)
            k->layernorm_backward(dx + r * cols, pdw, pdb, dy + r * cols, x + r * cols, w,
                                  mean[r], rstd[r], cols);
    }
    for (int64_t c = 0; c < chunks; c++)
        for (int64_t j = 0; j < cols; j++) {
            dw[j] += part[2 * c * cols + j];
            db[j] += part[(2 * c + 1) * cols + j];
        }
    free(part);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_layernorm_backward(float *dx, float *dw, float *db, const float *dy,
                                      const float *x, const float *w, const float *mean,
                                      const float *rstd, int64_t rows, int64_t cols) {
    PYTFM_TRY(pytfm__check_layernorm_backward(__func__, dx, dw, db, dy, x, w, mean, rstd, rows,
                                              cols));
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k) return backward_fast(__func__, k, dx, dw, db, dy, x, w, mean, rstd, rows, cols);
    for (int64_t r = 0; r < rows; r++) { // the plain reference
        const float *dyr = dy + r * cols, *xr = x + r * cols;
        float *dxr = dx + r * cols;
        const float mu = mean[r], rs = rstd[r];
        double g_sum = 0.0, gx_sum = 0.0;
        for (int64_t j = 0; j < cols; j++) {
            const float xhat = (xr[j] - mu) * rs;
            const float g = dyr[j] * w[j];
            g_sum += g;
            gx_sum += (double)g * xhat;
            dw[j] += dyr[j] * xhat;
            db[j] += dyr[j];
        }
        const float g_mean = (float)(g_sum / (double)cols);
        const float gx_mean = (float)(gx_sum / (double)cols);
        for (int64_t j = 0; j < cols; j++) {
            const float xhat = (xr[j] - mu) * rs;
            dxr[j] = rs * (dyr[j] * w[j] - g_mean - xhat * gx_mean);
        }
    }
    return PYTFM_STATUS_OK;
}
