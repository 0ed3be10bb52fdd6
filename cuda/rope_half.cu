/*
 * rope_half.cu — RoPE from a table of frequencies on the GPU; the twin of
 * csrc/kernels/rope_half.c.
 *
 *   x, y [B, T, H, D], half = D/2; θ_i = fl(fl(pos[b, t]) · inv_freq[i])
 *   y_i = x_i cos θ_i − x_{i+half} sin θ_i,  y_{i+half} = x_{i+half} cos θ_i + x_i sin θ_i
 *   backward: the rotation by −θ (sin negated)
 * A thread per (b, t, h, i) pair in a grid-stride loop; each computes its angle as the C kernel
 * does (the float product, cos and sin in double, rounded to float): the C kernel's bits. In
 * place (y == x) is allowed: each pair is read and written by one thread.
 */
#include "pytfm_cuda.cuh"

enum { ROPE_FREQ_THREADS = 256 };

static __global__ void rope_freq_kernel(float *y, const float *x, const int64_t *__restrict__ pos,
                                        const float *__restrict__ inv_freq, int64_t B, int64_t T,
                                        int64_t H, int64_t D, int64_t pos_stride, float sign) {
    const int64_t half = D / 2, pairs = B * T * H * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < pairs;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e % half, bth = e / half, bt = bth / H;
        const int64_t b = bt / T, t = bt % T;
        const float theta = (float)pos[b * pos_stride + t] * inv_freq[i];
        const float c = (float)cos((double)theta), s = sign * (float)sin((double)theta);
        float *yr = y + bth * D;
        const float *xr = x + bth * D;
        const float x0 = xr[i], x1 = xr[i + half];
        yr[i] = x0 * c - x1 * s;
        yr[i + half] = x1 * c + x0 * s;
    }
}

static pytfm_status rope_freq(const char *func, float *out, const float *in, const int64_t *pos,
                              const float *inv_freq, int64_t B, int64_t T, int64_t H, int64_t D,
                              int64_t pos_stride, float sign, void *stream) {
    PYTFM_TRY(pytfm__check_rope_freq(func, out, in, pos, inv_freq, B, T, H, D, pos_stride));
    const int64_t pairs = B * T * H * (D / 2);
    if (pairs == 0) return PYTFM_STATUS_OK;
    return pytfm__launch(func, rope_freq_kernel,
                         dim3(pytfm__blocks(pairs, ROPE_FREQ_THREADS, PYTFM_MAX_BLOCKS)),
                         dim3(ROPE_FREQ_THREADS), 0, stream, out, in, pos, inv_freq, B, T, H, D,
                         pos_stride, sign);
}

extern "C" pytfm_status pytfm_rope_freq_forward_cuda(float *y, const float *x, const int64_t *pos,
                                                     const float *inv_freq, int64_t B, int64_t T,
                                                     int64_t H, int64_t D, int64_t pos_stride,
                                                     void *stream) {
    return rope_freq(__func__, y, x, pos, inv_freq, B, T, H, D, pos_stride, 1.0f, stream);
}

extern "C" pytfm_status pytfm_rope_freq_backward_cuda(float *dx, const float *dy,
                                                      const int64_t *pos, const float *inv_freq,
                                                      int64_t B, int64_t T, int64_t H, int64_t D,
                                                      int64_t pos_stride, void *stream) {
    return rope_freq(__func__, dx, dy, pos, inv_freq, B, T, H, D, pos_stride, -1.0f, stream);
}
