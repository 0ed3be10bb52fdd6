/*
 * rmsnorm.cu — RMSNorm over the last axis on the GPU; the twin of csrc/kernels/rmsnorm.c.
 *
 *   x, y [rows, cols]; w [cols]; rstd [rows] (saved for the backward)
 *   forward:  rstd = 1/sqrt(mean(x²) + eps),  y = (x · rstd) ∘ w
 *   backward: g = dy ∘ w;  dx = rstd · (g − x̂ · mean(g ∘ x̂))   (written)
 *             dw += Σ_rows dy ∘ x̂                          (accumulated)
 * A team per row (pytfm_cuda.cuh: a warp up to 1024 columns, else a block), strided over the
 * row; Σ x² in float, again in double where it over- or underflows (PYTFM_LN_FLOAT_SUMS_OK), as
 * the fast CPU kernel does. dw by the two-stage column sum of pytfm_cuda.cuh (no atomics: the
 * same bits on every run).
 */
#include "pytfm_cuda.cuh"

template <bool kWarp>
static __global__ void rmsnorm_forward_kernel(float *__restrict__ y, float *__restrict__ rstd,
                                              const float *__restrict__ x,
                                              const float *__restrict__ w, int64_t rows,
                                              int64_t cols, float eps) {
    __shared__ double scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float ss = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size) ss += xr[j] * xr[j];
        ss = team.sum(ss, (float *)scratch);
        float rs;
        if (PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps)) {
            rs = 1.0f / sqrtf(ss / (float)cols + eps);
        } else { // past FLT_MAX or lost to underflow: the sum in double
            double sd = 0.0;
            for (int64_t j = team.rank; j < cols; j += team.size) sd += (double)xr[j] * xr[j];
            rs = (float)(1.0 / sqrt(team.sum(sd, scratch) / (double)cols + eps));
        }
        for (int64_t j = team.rank; j < cols; j += team.size) yr[j] = (xr[j] * rs) * w[j];
        if (team.rank == 0) rstd[r] = rs;
    }
}

extern "C" pytfm_status pytfm_rmsnorm_forward_cuda(float *y, float *rstd, const float *x,
                                                   const float *w, int64_t rows, int64_t cols,
                                                   float eps, void *stream) {
    PYTFM_TRY(pytfm__check_rmsnorm_forward(__func__, y, rstd, x, w, rows, cols, eps));
    if (rows == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH_ROWS(rmsnorm_forward_kernel<true>, rmsnorm_forward_kernel<false>, rows,
                             cols, PYTFM_MAX_BLOCKS, stream, y, rstd, x, w, rows, cols, eps);
}

template <bool kWarp>
static __global__ void rmsnorm_dx_kernel(float *__restrict__ dx, const float *__restrict__ dy,
                                         const float *__restrict__ x, const float *__restrict__ w,
                                         const float *__restrict__ rstd, int64_t rows,
                                         int64_t cols) {
    __shared__ float scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *dyr = dy + r * cols, *xr = x + r * cols;
        float *dxr = dx + r * cols;
        const float rs = rstd[r];
        float gx_sum = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size)
            gx_sum += dyr[j] * w[j] * (xr[j] * rs);
        const float gx_mean = team.sum(gx_sum, scratch) / (float)cols;
        for (int64_t j = team.rank; j < cols; j += team.size)
            dxr[j] = rs * (dyr[j] * w[j] - xr[j] * rs * gx_mean);
    }
}

/* dw[j] += Σ_r dy[r, j] x̂[r, j] */
struct rms_dw_term {
    enum { K = 1 };
    float *__restrict__ sums[K]; // dw
    const float *__restrict__ dy, *__restrict__ x, *__restrict__ rstd;
    int64_t cols;
    __device__ void operator()(float *t, int64_t r, int64_t j) const {
        t[0] = dy[r * cols + j] * (x[r * cols + j] * rstd[r]);
    }
};

extern "C" pytfm_status pytfm_rmsnorm_backward_cuda(float *dx, float *dw, const float *dy,
                                                    const float *x, const float *w,
                                                    const float *rstd, int64_t rows,
                                                    int64_t cols, void *stream) {
    PYTFM_TRY(pytfm__check_rmsnorm_backward(__func__, dx, dw, dy, x, w, rstd, rows, cols));
    if (rows == 0) return PYTFM_STATUS_OK;
    PYTFM_TRY(PYTFM_LAUNCH_ROWS(rmsnorm_dx_kernel<true>, rmsnorm_dx_kernel<false>, rows, cols,
                                PYTFM_MAX_BLOCKS, stream, dx, dy, x, w, rstd, rows, cols));
    return PYTFM_LAUNCH_COLUMN_SUM(rms_dw_term{{dw}, dy, x, rstd, cols}, rows, cols, stream);
}
