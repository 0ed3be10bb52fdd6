/*
 * rope.cu — rotary position embedding, rotate-half pairing, on the GPU; the twin of
 * csrc/rope.c.
 *
 *   x, y [B, T, H, D], half = D/2; θ_i = pos[b·pos_stride + t] · base^(−2i/D), i in [0, half)
 *     y_i = x_i cos θ_i − x_{i+half} sin θ_i,   y_{i+half} = x_{i+half} cos θ_i + x_i sin θ_i
 *   backward: the rotation by −θ (its transpose).
 * One thread per pair (b, t, h, i), consecutive threads on consecutive i; the angle is
 * computed in double as on the CPU. A thread reads its pair before writing it, so in place
 * (y == x) is safe.
 */
#include "pytfm_cuda.cuh"

static __global__ void rope_kernel(float *out, const float *in, const int64_t *pos, int64_t B,
                                   int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                                   double base, double sign) {
    const int64_t half = D / 2, pairs = B * T * H * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < pairs;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e % half, bth = e / half; // bth = (b·T + t)·H + h
        const int64_t bt = bth / H, b = bt / T, t = bt % T;
        const double theta = sign * (double)pos[b * pos_stride + t] *
                             pow(base, -2.0 * (double)i / (double)D);
        const float c = (float)cos(theta), s = (float)sin(theta);
        const int64_t off = bth * D; // (b, t, h, :)
        const float x0 = in[off + i], x1 = in[off + i + half];
        out[off + i] = x0 * c - x1 * s;
        out[off + i + half] = x1 * c + x0 * s;
    }
}

static pytfm_status rope(const char *func, float *out, const float *in, const int64_t *pos,
                         int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                         double base, double sign, void *stream) {
    PYTFM_TRY(pytfm__check_rope(func, out, in, pos, B, T, H, D, pos_stride, base));
    const int64_t pairs = B * T * H * (D / 2);
    if (pairs == 0) return PYTFM_STATUS_OK;
    return pytfm__launch(func, rope_kernel, dim3(pytfm__blocks(pairs, 256, PYTFM_MAX_BLOCKS)),
                         dim3(256), 0, stream, out, in, pos, B, T, H, D, pos_stride, base, sign);
}

extern "C" pytfm_status pytfm_rope_forward_cuda(float *y, const float *x, const int64_t *pos,
                                                int64_t B, int64_t T, int64_t H, int64_t D,
                                                int64_t pos_stride, double base, void *stream) {
    return rope(__func__, y, x, pos, B, T, H, D, pos_stride, base, +1.0, stream);
}

extern "C" pytfm_status pytfm_rope_backward_cuda(float *dx, const float *dy, const int64_t *pos,
                                                 int64_t B, int64_t T, int64_t H, int64_t D,
                                                 int64_t pos_stride, double base, void *stream) {
    return rope(__func__, dx, dy, pos, B, T, H, D, pos_stride, base, -1.0, stream);
}
