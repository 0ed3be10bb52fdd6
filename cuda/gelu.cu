/*
 * gelu.cu — GELU, tanh approximation, on the GPU; the twin of csrc/kernels/gelu.c.
 *
 *   forward:  u = k (x + a x³), k = sqrt(2/π), a = 0.044715;  y = ½ x (1 + tanh u)
 *   backward: dx = dy · (s + 2 x s (1 − s) · k (1 + 3 a x²)),  s = ½ (1 + tanh u) = 1/(1 + e^(−2u))
 * Element-wise in a grid-stride loop: a thread per float4 where every array is 16-byte aligned
 * (the last count % 4 elements one by one), else per float; each element computed by the same
 * function either way (the same bits). The grid: enough 256-thread blocks for every unit, up to
 * 65535 (an H200 holds 132 × 6 of them at once), so any count of more than about 800k floats
 * fills the GPU. In place (y == x, dx == dy) is allowed, __restrict__ included: every element
 * is read once, by the thread that then writes it. Finite and non-finite x as on the CPU
 * (csrc/kernels/gelu.c): the backward's term at v clamped to ±16.
 *
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "gelu.cuh" /* half_one_plus_tanh, pytfm__gelu: shared with linear.cu's linear + GELU */

// at least 6 blocks of 256 an SM (1536 of its 2048 threads): at most 40 registers a thread;
// at 8 blocks (32 registers) the float4 kernels spill
enum { GELU_THREADS = 256, GELU_MIN_BLOCKS = 6 };

/* dy · gelu'(v), as csrc/kernels/gelu.c computes it */
static __device__ __forceinline__ float gelu_grad(float g, float v) {
    const float s = half_one_plus_tanh(v), vt = PYTFM_GELU_TERM_V(v);
    const float du = PYTFM_GELU_K * (1.0f + 3.0f * PYTFM_GELU_A * vt * vt);
    return g * (s + 2.0f * vt * s * (1.0f - s) * du);
}

/* the grid's thread index and count: the grid-stride loop over units */
static __device__ __forceinline__ int64_t gelu_thread() {
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
static __device__ __forceinline__ int64_t gelu_threads() { return (int64_t)gridDim.x * blockDim.x; }

template <bool kVec>
static __global__ void __launch_bounds__(GELU_THREADS, GELU_MIN_BLOCKS)
    gelu_forward_kernel(float *__restrict__ y, const float *__restrict__ x, int64_t count) {
    const int64_t nv = kVec ? count / 4 : 0; // float4s; the rest one by one
    for (int64_t q = gelu_thread(); q < nv; q += gelu_threads()) {
        const float4 v = pytfm__load4(x + 4 * q);
        pytfm__store4(y + 4 * q, make_float4(pytfm__gelu(v.x), pytfm__gelu(v.y), pytfm__gelu(v.z),
                                             pytfm__gelu(v.w)));
    }
    for (int64_t i = 4 * nv + gelu_thread(); i < count; i += gelu_threads())
        y[i] = pytfm__gelu(x[i]);
}

/* blocks for count elements, 4 a thread when vec */
static unsigned gelu_blocks(int64_t count, bool vec) {
    return pytfm__blocks(vec ? (count + 3) / 4 : count, GELU_THREADS, PYTFM_MAX_BLOCKS);
}

extern "C" pytfm_status pytfm_gelu_forward_cuda(float *y, const float *x, int64_t count,
                                                void *stream) {
    PYTFM_TRY(pytfm__check_gelu_forward(__func__, y, x, count));
    if (count == 0) return PYTFM_STATUS_OK;
    const bool vec = (((uintptr_t)y | (uintptr_t)x) & 15u) == 0;
    return PYTFM_LAUNCH(vec ? gelu_forward_kernel<true> : gelu_forward_kernel<false>,
                        dim3(gelu_blocks(count, vec)), dim3(GELU_THREADS), 0, stream, y, x, count);
}

template <bool kVec>
static __global__ void __launch_bounds__(GELU_THREADS, GELU_MIN_BLOCKS)
    gelu_backward_kernel(float *__restrict__ dx, const float *__restrict__ dy,
                         const float *__restrict__ x, int64_t count) {
    const int64_t nv = kVec ? count / 4 : 0;
    for (int64_t q = gelu_thread(); q < nv; q += gelu_threads()) {
        const float4 v = pytfm__load4(x + 4 * q), g = pytfm__load4(dy + 4 * q);
        pytfm__store4(dx + 4 * q, make_float4(gelu_grad(g.x, v.x), gelu_grad(g.y, v.y),
                                              gelu_grad(g.z, v.z), gelu_grad(g.w, v.w)));
    }
    for (int64_t i = 4 * nv + gelu_thread(); i < count; i += gelu_threads())
        dx[i] = gelu_grad(dy[i], x[i]);
}

extern "C" pytfm_status pytfm_gelu_backward_cuda(float *dx, const float *dy, const float *x,
                                                 int64_t count, void *stream) {
    PYTFM_TRY(pytfm__check_gelu_backward(__func__, dx, dy, x, count));
    if (count == 0) return PYTFM_STATUS_OK;
    const bool vec = (((uintptr_t)dx | (uintptr_t)dy | (uintptr_t)x) & 15u) == 0;
    return PYTFM_LAUNCH(vec ? gelu_backward_kernel<true> : gelu_backward_kernel<false>,
                        dim3(gelu_blocks(count, vec)), dim3(GELU_THREADS), 0, stream, dx, dy, x,
                        count);
}
