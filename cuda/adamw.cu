/*
 * adamw.cu — one fused in-place AdamW step on the GPU; the twin of csrc/kernels/adamw.c.
 *
 *   param ← param · (1 − lr·wd);  m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2) g²
 *   param ← param − (lr / (1 − β1ᵗ)) · m / (sqrt(v) / sqrt(1 − β2ᵗ) + eps)
 * The scalars are computed once on the host in double, exactly as the CPU twin does; each
 * thread then does the float32 work of one element (grid-stride loop). In a CUDA graph, whose
 * kernels keep the arguments they were captured with, pytfm_adamw_step_scalars_cuda reads the
 * same eight scalars from device memory instead (pytfm_cuda_adamw_scalars computes them, the
 * caller copies them there before each replay): the same bits, step after step.
 *
 * pytfm_sum_squares_cuda, Σ x² in double for gradient clipping, without atomics so the bits
 * are the same on every run: a bounded grid of G blocks, thread t of block g summing
 * x[i]² for i = g·256 + t, + G·256, ... in order, each block's threads combined by the fixed
 * tree of pytfm__block_sum into partial[g]; then one block sums partial[0..G) the same way
 * into *out. G depends only on count (and the build), so the order does too. G = 1 (count
 * up to 256) writes *out directly; otherwise the G doubles are stream scratch (the stream's
 * workspace, else cudaMallocAsync), given back once the second kernel is queued. The order
 * differs from the CPU's (csrc/kernels/adamw.c: blocks of 16384 in index order): the two agree
 * to double rounding.
 */
#include <string.h>

#include "pytfm_cuda.cuh"

struct adamw_scalars {
    float decay, step_size, bc2_sqrt, b1, c1, b2, c2, eps;
};
static_assert(sizeof(adamw_scalars) == 8 * sizeof(float), "the 8 floats of the public API");

/* one element's update, the same float32 work for both kernels below */
static __device__ __forceinline__ void adamw_element(float *param, float *m, float *v,
                                                     const float *grad, int64_t i,
                                                     const adamw_scalars &s) {
    const float g = grad[i];
    const float mi = s.b1 * m[i] + s.c1 * g;
    const float vi = s.b2 * v[i] + s.c2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * s.decay - s.step_size * mi / (sqrtf(vi) / s.bc2_sqrt + s.eps);
}

static __global__ void adamw_kernel(float *param, float *m, float *v, const float *grad,
                                    int64_t count, adamw_scalars s) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        adamw_element(param, m, v, grad, i, s);
}

/* the scalars read from device memory: a step whose lr and t change between the replays of a
 * CUDA graph that holds it */
static __global__ void adamw_device_scalars_kernel(float *param, float *m, float *v,
                                                   const float *grad, int64_t count,
                                                   const float *scalars) {
    const adamw_scalars s = {scalars[0], scalars[1], scalars[2], scalars[3],
                             scalars[4], scalars[5], scalars[6], scalars[7]};
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        adamw_element(param, m, v, grad, i, s);
}

/* as csrc/kernels/adamw.c computes them: in double, each rounded to float once */
static adamw_scalars scalars_of(int64_t step, double lr, double beta1, double beta2, double eps,
                                double weight_decay) {
    adamw_scalars s;
    s.decay = (float)(1.0 - lr * weight_decay);
    s.step_size = (float)(lr / (1.0 - pow(beta1, (double)step)));
    s.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
    s.b1 = (float)beta1, s.c1 = (float)(1.0 - beta1); // 1 − β in double, then rounded
    s.b2 = (float)beta2, s.c2 = (float)(1.0 - beta2);
    s.eps = (float)eps;
    return s;
}

extern "C" pytfm_status pytfm_adamw_step_cuda(float *param, float *m, float *v, const float *grad,
                                              int64_t count, int64_t step, double lr,
                                              double beta1, double beta2, double eps,
                                              double weight_decay, void *stream) {
    PYTFM_TRY(pytfm__check_adamw(__func__, param, m, v, grad, count, step, lr, beta1, beta2,
                                 eps, weight_decay));
    if (count == 0) return PYTFM_STATUS_OK;
    const adamw_scalars s = scalars_of(step, lr, beta1, beta2, eps, weight_decay);
    return PYTFM_LAUNCH(adamw_kernel, dim3(pytfm__blocks(count, 256, PYTFM_MAX_BLOCKS)),
                        dim3(256), 0, stream, param, m, v, grad, count, s);
}

extern "C" pytfm_status pytfm_cuda_adamw_scalars(float *scalars, int64_t step, double lr,
                                                 double beta1, double beta2, double eps,
                                                 double weight_decay) {
    PYTFM_CHECK_PTR(scalars, 1);
    PYTFM_TRY(pytfm__check_adamw(__func__, NULL, NULL, NULL, NULL, 0, step, lr, beta1, beta2,
                                 eps, weight_decay));
    const adamw_scalars s = scalars_of(step, lr, beta1, beta2, eps, weight_decay);
    memcpy(scalars, &s, sizeof s);
    return PYTFM_STATUS_OK;
}

extern "C" pytfm_status pytfm_adamw_step_scalars_cuda(float *param, float *m, float *v,
                                                      const float *grad, int64_t count,
                                                      const float *scalars, void *stream) {
    // the buffers' checks of pytfm_adamw_step_cuda, with hyper-parameters it accepts
    PYTFM_TRY(pytfm__check_adamw(__func__, param, m, v, grad, count, 1, 0.0, 0.0, 0.0, 1.0,
                                 0.0));
    PYTFM_CHECK_PTR(scalars, count > 0);
    if (count == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(adamw_device_scalars_kernel,
                        dim3(pytfm__blocks(count, 256, PYTFM_MAX_BLOCKS)), dim3(256), 0, stream,
                        param, m, v, grad, count, scalars);
}

/* ---- Σ x², in double ------------------------------------------------------------------- */

enum { SUM_THREADS = 256, SUM_BLOCKS = 1024 }; // at most 1024 partial sums: 8 KiB of scratch

/* partial[blockIdx.x] = this block's grid-stride share of Σ x[i]² */
static __global__ void __launch_bounds__(SUM_THREADS)
sum_squares_kernel(double *partial, const float *x, int64_t count) {
    __shared__ double scratch[PYTFM_WARP];
    double acc = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        acc += (double)x[i] * (double)x[i];
    acc = pytfm__block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* *out = Σ partial[0..n), by one block */
static __global__ void __launch_bounds__(SUM_THREADS)
sum_partials_kernel(double *out, const double *partial, int64_t n) {
    __shared__ double scratch[PYTFM_WARP];
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = pytfm__block_sum(acc, scratch);
    if (threadIdx.x == 0) *out = acc;
}

extern "C" pytfm_status pytfm_sum_squares_cuda(double *out, const float *x, int64_t count,
                                               void *stream) {
    PYTFM_TRY(pytfm__check_sum_squares(__func__, out, x, count));
    const int64_t cap = PYTFM_MIN((int64_t)PYTFM_MAX_BLOCKS, (int64_t)SUM_BLOCKS);
    const unsigned blocks = count == 0 ? 1u : pytfm__blocks(count, SUM_THREADS, cap);
    if (blocks == 1) // count <= 256 (0 included: writes 0)
        return PYTFM_LAUNCH(sum_squares_kernel, dim3(1), dim3(SUM_THREADS), 0, stream, out, x,
                            count);
    double *partial = NULL;
    PYTFM_TRY(pytfm__stream_scratch(__func__, &partial, blocks, stream));
    pytfm_status st = PYTFM_LAUNCH(sum_squares_kernel, dim3(blocks), dim3(SUM_THREADS), 0,
                                   stream, partial, x, count);
    if (st == PYTFM_STATUS_OK)
        st = PYTFM_LAUNCH(sum_partials_kernel, dim3(1), dim3(SUM_THREADS), 0, stream, out,
                          (const double *)partial, (int64_t)blocks);
    return pytfm__stream_scratch_free(__func__, partial, st, stream);
}
