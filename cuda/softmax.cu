/*
 * softmax.cu — softmax over the last axis on the GPU; the twin of csrc/softmax.c.
 *
 *   x, y [rows, cols]
 *   forward:  y = exp(x − max x) / Σ exp(x − max x)
 *   backward: with s = Σ_j dy_j y_j,  dx_i = y_i (dy_i − s)
 * A warp per row for rows of up to 1024 columns (8 rows per block, reductions by shuffles), a
 * block of 256 threads per row beyond (reductions through shared memory). Three passes over
 * the row, each re-reading it from global memory (L1/L2 hold it): the max, Σ exp (the helper
 * the cross-entropy shares, pytfm_cuda.cuh), then y; sums are float, in a fixed order.
 */
#include "pytfm_cuda.cuh"

template <bool kWarp>
static __global__ void softmax_forward_kernel(float *y, const float *x, int64_t rows,
                                              int64_t cols) {
    __shared__ float scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        const pytfm__max_sumexp row = pytfm__row_max_sumexp(team, xr, cols, scratch);
        const float inv = 1.0f / row.sumexp;
        for (int64_t j = team.rank; j < cols; j += team.size) yr[j] = expf(xr[j] - row.max) * inv;
    }
}

extern "C" pytfm_status pytfm_softmax_forward_cuda(float *y, const float *x, int64_t rows,
                                                   int64_t cols, void *stream) {
    PYTFM_TRY(pytfm__check_softmax_forward(__func__, y, x, rows, cols));
    if (rows == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH_ROWS(softmax_forward_kernel<true>, softmax_forward_kernel<false>, rows,
                             cols, PYTFM_MAX_BLOCKS, stream, y, x, rows, cols);
}

template <bool kWarp>
static __global__ void softmax_backward_kernel(float *dx, const float *dy, const float *y,
                                               int64_t rows, int64_t cols) {
    __shared__ float scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *dyr = dy + r * cols, *yr = y + r * cols;
        float *dxr = dx + r * cols;
        float s = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size) s += dyr[j] * yr[j];
        s = team.sum(s, scratch);
        for (int64_t j = team.rank; j < cols; j += team.size) dxr[j] = yr[j] * (dyr[j] - s);
    }
}

extern "C" pytfm_status pytfm_softmax_backward_cuda(float *dx, const float *dy, const float *y,
                                                    int64_t rows, int64_t cols, void *stream) {
    PYTFM_TRY(pytfm__check_softmax_backward(__func__, dx, dy, y, rows, cols));
    if (rows == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH_ROWS(softmax_backward_kernel<true>, softmax_backward_kernel<false>, rows,
                             cols, PYTFM_MAX_BLOCKS, stream, dx, dy, y, rows, cols);
}
