/*
 * swiglu.cu — SwiGLU's element-wise step on the GPU; the twin of csrc/kernels/swiglu.c.
 *
 *   forward:  h = silu(g) · u,  silu(g) = g / (1 + e^(−g))
 *   backward: s = σ(g);  dg = dh · u · s (1 + g (1 − s)),  du = dh · g · s
 * A grid-stride loop, a thread per element; every finite g gives a finite result (e^(−g) may
 * overflow to +inf: σ is then 0), as on the CPU.
 */
#include "pytfm_cuda.cuh"

enum { SWIGLU_THREADS = 256 };

static __device__ __forceinline__ float swiglu_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

static __global__ void swiglu_forward_kernel(float *__restrict__ h, const float *__restrict__ g,
                                             const float *__restrict__ u, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

extern "C" pytfm_status pytfm_swiglu_forward_cuda(float *h, const float *g, const float *u,
                                                  int64_t count, void *stream) {
    PYTFM_TRY(pytfm__check_swiglu_forward(__func__, h, g, u, count));
    if (count == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(swiglu_forward_kernel,
                        dim3(pytfm__blocks(count, SWIGLU_THREADS, PYTFM_MAX_BLOCKS)),
                        dim3(SWIGLU_THREADS), 0, stream, h, g, u, count);
}

static __global__ void swiglu_backward_kernel(float *__restrict__ dg, float *__restrict__ du,
                                              const float *__restrict__ dh,
                                              const float *__restrict__ g,
                                              const float *__restrict__ u, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float s = swiglu_sigmoid(g[i]);
        dg[i] = dh[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
        du[i] = dh[i] * (g[i] * s);
    }
}

extern "C" pytfm_status pytfm_swiglu_backward_cuda(float *dg, float *du, const float *dh,
                                                   const float *g, const float *u, int64_t count,
                                                   void *stream) {
    PYTFM_TRY(pytfm__check_swiglu_backward(__func__, dg, du, dh, g, u, count));
    if (count == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(swiglu_backward_kernel,
                        dim3(pytfm__blocks(count, SWIGLU_THREADS, PYTFM_MAX_BLOCKS)),
                        dim3(SWIGLU_THREADS), 0, stream, dg, du, dh, g, u, count);
}
