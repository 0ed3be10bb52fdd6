/*
 * gelu.cu — GELU, tanh approximation, on the GPU; the twin of csrc/gelu.c.
 *
 *   forward:  u = k (x + a x³), k = sqrt(2/π), a = 0.044715;  y = ½ x (1 + tanh u)
 *   backward: dx = dy · (s + 2 x s (1 − s) · k (1 + 3 a x²)),  s = ½ (1 + tanh u) = 1/(1 + e^(−2u))
 * One thread per element in a grid-stride loop; in place (y == x, dx == dy) is allowed. Finite
 * and non-finite x as on the CPU (csrc/gelu.c): the backward's term at v clamped to ±16.
 */
#include "gelu.cuh" /* half_one_plus_tanh, pytfm__gelu: shared with linear.cu's linear + GELU */

static __global__ void gelu_forward_kernel(float *y, const float *x, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[i] * half_one_plus_tanh(x[i]);
}

extern "C" pytfm_status pytfm_gelu_forward_cuda(float *y, const float *x, int64_t count,
                                                void *stream) {
    PYTFM_TRY(pytfm__check_gelu_forward(__func__, y, x, count));
    if (count == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(gelu_forward_kernel, dim3(pytfm__blocks(count, 256, PYTFM_MAX_BLOCKS)),
                        dim3(256), 0, stream, y, x, count);
}

static __global__ void gelu_backward_kernel(float *dx, const float *dy, const float *x,
                                            int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i], s = half_one_plus_tanh(v), vt = PYTFM_GELU_TERM_V(v);
        const float du = PYTFM_GELU_K * (1.0f + 3.0f * PYTFM_GELU_A * vt * vt);
        dx[i] = dy[i] * (s + 2.0f * vt * s * (1.0f - s) * du);
    }
}

extern "C" pytfm_status pytfm_gelu_backward_cuda(float *dx, const float *dy, const float *x,
                                                 int64_t count, void *stream) {
    PYTFM_TRY(pytfm__check_gelu_backward(__func__, dx, dy, x, count));
    if (count == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(gelu_backward_kernel, dim3(pytfm__blocks(count, 256, PYTFM_MAX_BLOCKS)),
                        dim3(256), 0, stream, dx, dy, x, count);
}
