/*
 * linear.cu — fully connected layer on the GPU, y = x·Wᵀ + b; the twin of csrc/linear.c.
 *
 *   x [rows, in], W [out, in], b [out], y [rows, out]
 *   forward:  y = x·Wᵀ (pytfm_sgemm_cuda, trans_b), then y[r, :] += b
 *   backward: dx = dy·W (written), dW += dyᵀ·x (β = 1), db += column sums of dy
 * The bias column sums are a reduction in a fixed order (a block takes 32 columns, its 8 rows
 * of threads stride over the rows and are then summed in order): no atomics, same bits each run.
 */
#include "pytfm_cuda.cuh"

static __global__ void add_bias_kernel(float *y, const float *b, int64_t rows, int64_t out) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * out;
         e += (int64_t)gridDim.x * blockDim.x)
        y[e] += b[e % out];
}

extern "C" pytfm_status pytfm_linear_forward_cuda(float *y, const float *x, const float *w,
                                                  const float *b, int64_t rows, int64_t in,
                                                  int64_t out, void *stream) {
    PYTFM_TRY(pytfm__check_linear_forward(__func__, y, x, w, rows, in, out));
    PYTFM_TRY(pytfm_sgemm_cuda(y, x, w, rows, out, in, 0, 1, 0.0f, stream));
    if (!b || rows == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(add_bias_kernel, dim3(pytfm__blocks(rows * out, 256, PYTFM_MAX_BLOCKS)),
                        dim3(256), stream, y, b, rows, out);
}

enum { COLS_PER_BLOCK = 32, ROW_LANES = 8 };

/* db[j] += Σ_r dy[r, j]: block (32, 8), 32 columns a block */
static __global__ void column_sum_kernel(float *db, const float *dy, int64_t rows, int64_t out) {
    __shared__ float part[ROW_LANES][COLS_PER_BLOCK];
    const int64_t j = (int64_t)blockIdx.x * COLS_PER_BLOCK + threadIdx.x;
    float s = 0.0f;
    if (j < out)
        for (int64_t r = threadIdx.y; r < rows; r += ROW_LANES) s += dy[r * out + j];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < out) {
        for (int i = 1; i < ROW_LANES; i++) s += part[i][threadIdx.x];
        db[j] += s;
    }
}

extern "C" pytfm_status pytfm_linear_backward_cuda(float *dx, float *dw, float *db,
                                                   const float *dy, const float *x,
                                                   const float *w, int64_t rows, int64_t in,
                                                   int64_t out, void *stream) {
    PYTFM_TRY(pytfm__check_linear_backward(__func__, dx, dw, dy, x, w, rows, in, out));
    if (dx) PYTFM_TRY(pytfm_sgemm_cuda(dx, dy, w, rows, in, out, 0, 0, 0.0f, stream));
    PYTFM_TRY(pytfm_sgemm_cuda(dw, dy, x, out, in, rows, 1, 0, 1.0f, stream)); // dy is op(A)ᵀ
    if (!db || rows == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(column_sum_kernel, dim3(pytfm__blocks(out, COLS_PER_BLOCK, 1u << 30)),
                        dim3(COLS_PER_BLOCK, ROW_LANES), stream, db, dy, rows, out);
}
