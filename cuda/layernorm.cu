/*
 * layernorm.cu — LayerNorm over the last axis on the GPU; the twin of csrc/layernorm.c.
 *
 *   x, y [rows, cols]; w, b [cols]; mean, rstd [rows] (saved for the backward)
 *   forward:  μ = mean(x), σ² = mean((x − μ)²), rstd = 1/sqrt(σ² + eps), y = (x − μ)·rstd·w + b
 *   backward: g = dy ∘ w;  dx = rstd · (g − mean(g) − x̂ · mean(g ∘ x̂))   (written)
 *             dw += Σ_rows dy ∘ x̂,  db += Σ_rows dy                      (accumulated)
 * Rows: a warp per row up to 1024 columns, a block per row beyond; two passes (mean, then the
 * centred variance), both over x − x0 (x0 the row's first value), as csrc/fast_impl.h does: when
 * |μ| ≫ σ those differences are small and exact, so no digits of x − μ are lost. A row whose
 * float sums overflow or underflow (PYTFM_LN_FLOAT_SUMS_OK: values past ~1e19, or a tiny
 * spread with eps = 0) is summed again in double, as the CPU kernels do. The dw/db column sums
 * are a second kernel, the fixed-order column reduction of pytfm_cuda.cuh: no atomics, the
 * same bits on every run.
 */
#include "pytfm_cuda.cuh"

/* the row again with double sums, as pytfm__layernorm_forward_row (csrc/fast.h) on the CPU */
template <bool kWarp>
static __device__ void layernorm_row_double(const pytfm__row_team<kWarp> &team, float *yr,
                                            float *mean, float *rstd, const float *xr,
                                            const float *w, const float *b, int64_t cols,
                                            float eps, double *scratch) {
    double sum = 0.0;
    for (int64_t j = team.rank; j < cols; j += team.size) sum += xr[j];
    const double mu = team.sum(sum, scratch) / (double)cols;
    double ss = 0.0;
    for (int64_t j = team.rank; j < cols; j += team.size) ss += (xr[j] - mu) * (xr[j] - mu);
    const double rs = 1.0 / sqrt(team.sum(ss, scratch) / (double)cols + eps);
    for (int64_t j = team.rank; j < cols; j += team.size)
        yr[j] = (float)((xr[j] - mu) * rs) * w[j] + b[j];
    if (team.rank == 0) {
        *mean = (float)mu;
        *rstd = (float)rs;
    }
}

template <bool kWarp>
static __global__ void layernorm_forward_kernel(float *y, float *mean, float *rstd,
                                                const float *x, const float *w, const float *b,
                                                int64_t rows, int64_t cols, float eps) {
    __shared__ float scratch[32];
    __shared__ double wide_scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        const float x0 = xr[0];
        float sum = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size) sum += xr[j] - x0;
        const float d = team.sum(sum, scratch) / (float)cols; // μ − x0
        float ss = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size)
            ss += (xr[j] - x0 - d) * (xr[j] - x0 - d);
        ss = team.sum(ss, scratch); // the same total in every thread: one branch for the team
        if (!PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps)) {
            layernorm_row_double(team, yr, mean + r, rstd + r, xr, w, b, cols, eps, wide_scratch);
            continue;
        }
        const float rs = rsqrtf(ss / (float)cols + eps);
        for (int64_t j = team.rank; j < cols; j += team.size)
            yr[j] = (xr[j] - x0 - d) * rs * w[j] + b[j];
        if (team.rank == 0) {
            mean[r] = x0 + d;
            rstd[r] = rs;
        }
    }
}

extern "C" pytfm_status pytfm_layernorm_forward_cuda(float *y, float *mean, float *rstd,
                                                     const float *x, const float *w,
                                                     const float *b, int64_t rows, int64_t cols,
                                                     float eps, void *stream) {
    PYTFM_TRY(pytfm__check_layernorm_forward(__func__, y, mean, rstd, x, w, b, rows, cols, eps));
    if (rows == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH_ROWS(layernorm_forward_kernel<true>, layernorm_forward_kernel<false>,
                             rows, cols, PYTFM_MAX_BLOCKS, stream, y, mean, rstd, x, w, b, rows,
                             cols, eps);
}

template <bool kWarp>
static __global__ void layernorm_dx_kernel(float *dx, const float *dy, const float *x,
                                           const float *w, const float *mean, const float *rstd,
                                           int64_t rows, int64_t cols) {
    __shared__ float scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *dyr = dy + r * cols, *xr = x + r * cols;
        float *dxr = dx + r * cols;
        const float mu = mean[r], rs = rstd[r];
        float g_sum = 0.0f, gx_sum = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size) {
            const float g = dyr[j] * w[j];
            g_sum += g;
            gx_sum += g * (xr[j] - mu) * rs;
        }
        const float g_mean = team.sum(g_sum, scratch) / (float)cols;
        const float gx_mean = team.sum(gx_sum, scratch) / (float)cols;
        for (int64_t j = team.rank; j < cols; j += team.size)
            dxr[j] = rs * (dyr[j] * w[j] - g_mean - (xr[j] - mu) * rs * gx_mean);
    }
}

/* dw[j] += Σ_r dy[r, j] x̂[r, j],  db[j] += Σ_r dy[r, j] */
struct dwdb_term {
    enum { K = 2 };
    float *sums[K]; // dw, db
    const float *dy, *x, *mean, *rstd;
    int64_t cols;
    __device__ void operator()(float *t, int64_t r, int64_t j) const {
        const float g = dy[r * cols + j];
        t[0] = g * (x[r * cols + j] - mean[r]) * rstd[r];
        t[1] = g;
    }
};

extern "C" pytfm_status pytfm_layernorm_backward_cuda(float *dx, float *dw, float *db,
                                                      const float *dy, const float *x,
                                                      const float *w, const float *mean,
                                                      const float *rstd, int64_t rows,
                                                      int64_t cols, void *stream) {
    PYTFM_TRY(pytfm__check_layernorm_backward(__func__, dx, dw, db, dy, x, w, mean, rstd, rows,
                                              cols));
    if (rows == 0) return PYTFM_STATUS_OK;
    PYTFM_TRY(PYTFM_LAUNCH_ROWS(layernorm_dx_kernel<true>, layernorm_dx_kernel<false>, rows,
                                cols, PYTFM_MAX_BLOCKS, stream, dx, dy, x, w, mean, rstd, rows,
                                cols));
    return PYTFM_LAUNCH_COLUMN_SUM(dwdb_term{{dw, db}, dy, x, mean, rstd, cols}, rows, cols,
                                   stream);
}
