/*
 * rope.cu — rotary position embedding, rotate-half pairing, on the GPU, and the split of the
 * fused QKV projection with RoPE on q and k; the twin of csrc/rope.c.
 *
 *   x, y [B, T, H, D], half = D/2; θ_i = pos[b·pos_stride + t] · base^(−2i/D), i in [0, half)
 *     y_i = x_i cos θ_i − x_{i+half} sin θ_i,   y_{i+half} = x_{i+half} cos θ_i + x_i sin θ_i
 *   backward: the rotation by −θ (its transpose).
 * One thread per pair (b, t, h, i), consecutive threads on consecutive i; the angle is
 * computed in double as on the CPU. A thread reads its pair before writing it, so in place
 * (y == x) is safe.
 *
 * QKV split: qkv [B, T, 3, H, D] (per token q, k, v, each H·D floats) -> q, k, v [B, T, H, D],
 *   q = R(θ) qkv[:, :, 0], k = R(θ) qkv[:, :, 1], v = qkv[:, :, 2]  (R the identity when rope
 *   is off); backward dqkv[:, :, 0] = R(−θ) dq, dqkv[:, :, 1] = R(−θ) dk, dqkv[:, :, 2] = dv.
 * With rope, a thread per pair (b, t, h, i) computes its angle once, with the same code as
 * rope_kernel (rope_cos_sin, rotate_pair), and rotates q's and k's pair and copies v's: q and
 * k are the same bits as pytfm_rope_forward_cuda on the slices. Without rope (D may be odd) a
 * thread per element (b, t, h, d) copies it in each part. Both directions walk three "parts"
 * (row bt of H·D floats read at in[p] + bt·in_stride, written at out[p] + bt·out_stride), as
 * csrc/rope.c's streams.
 */
#include "pytfm_cuda.cuh"

/* cos θ_i, sin θ_i for position p, rounded to float from double as csrc/rope.c does */
static __device__ __forceinline__ void rope_cos_sin(float *c, float *s, int64_t p, int64_t i,
                                                    int64_t D, double base, double sign) {
    const double theta = sign * (double)p * pow(base, -2.0 * (double)i / (double)D);
    *c = (float)cos(theta), *s = (float)sin(theta);
}

/* the pair (i, i + half) of one head's D floats, rotated; reads both before writing */
static __device__ __forceinline__ void rotate_pair(float *out, const float *in, int64_t i,
                                                   int64_t half, float c, float s) {
    const float x0 = in[i], x1 = in[i + half];
    out[i] = x0 * c - x1 * s;
    out[i + half] = x1 * c + x0 * s;
}

static __global__ void rope_kernel(float *out, const float *in, const int64_t *pos, int64_t B,
                                   int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                                   double base, double sign) {
    const int64_t half = D / 2, pairs = B * T * H * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < pairs;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e % half, bth = e / half; // bth = (b·T + t)·H + h
        const int64_t bt = bth / H, b = bt / T, t = bt % T;
        float c, s;
        rope_cos_sin(&c, &s, pos[b * pos_stride + t], i, D, base, sign);
        rotate_pair(out + bth * D, in + bth * D, i, half, c, s); // (b, t, h, :)
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

/* ---- the fused QKV projection's split ---------------------------------------------------- */

/* q, k, v (0, 1, 2): row bt of H·D floats read at in[p] + bt·in_stride, written at
 * out[p] + bt·out_stride. Parts 0 and 1 are rotated when rope is on, part 2 never. */
struct qkv_parts {
    float *out[3];
    const float *in[3];
    int64_t out_stride, in_stride;
};

static __global__ void qkv_rope_kernel(qkv_parts parts, const int64_t *pos, int64_t B, int64_t T,
                                       int64_t H, int64_t D, int64_t pos_stride, double base,
                                       double sign) {
    const int64_t half = D / 2, pairs = B * T * H * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < pairs;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e % half, bth = e / half; // bth = (b·T + t)·H + h
        const int64_t bt = bth / H, b = bt / T, t = bt % T, h = bth % H;
        float c, s;
        rope_cos_sin(&c, &s, pos[b * pos_stride + t], i, D, base, sign);
        const int64_t out_off = bt * parts.out_stride + h * D,
                      in_off = bt * parts.in_stride + h * D;
        for (int p = 0; p < 2; p++)
            rotate_pair(parts.out[p] + out_off, parts.in[p] + in_off, i, half, c, s);
        float *v_out = parts.out[2] + out_off;
        const float *v_in = parts.in[2] + in_off;
        v_out[i] = v_in[i];
        v_out[i + half] = v_in[i + half];
    }
}

/* rope off: a thread per element (bt, j) of a part copies it in all three (the parts indexed
 * by constants: a runtime index would put them in local memory) */
static __global__ void qkv_copy_kernel(qkv_parts parts, int64_t rows, int64_t hd) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * hd;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = e % hd, bt = e / hd;
        for (int p = 0; p < 3; p++)
            parts.out[p][bt * parts.out_stride + j] = parts.in[p][bt * parts.in_stride + j];
    }
}

static pytfm_status qkv_split(const char *func, const qkv_parts &parts, const int64_t *pos,
                              int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                              double base, int32_t rope, double sign, void *stream) {
    if (B * T * H == 0) return PYTFM_STATUS_OK; // pos may then be NULL: nothing to read
    if (!rope) {
        const int64_t n = B * T * H * D;
        return pytfm__launch(func, qkv_copy_kernel,
                             dim3(pytfm__blocks(n, 256, PYTFM_MAX_BLOCKS)), dim3(256), 0, stream,
                             parts, B * T, H * D);
    }
    const int64_t pairs = B * T * H * (D / 2);
    return pytfm__launch(func, qkv_rope_kernel, dim3(pytfm__blocks(pairs, 256, PYTFM_MAX_BLOCKS)),
                         dim3(256), 0, stream, parts, pos, B, T, H, D, pos_stride, base, sign);
}

extern "C" pytfm_status pytfm_qkv_split_forward_cuda(float *q, float *k, float *v,
                                                     const float *qkv, const int64_t *pos,
                                                     int64_t B, int64_t T, int64_t H, int64_t D,
                                                     int64_t pos_stride, double base,
                                                     int32_t rope, void *stream) {
    PYTFM_TRY(pytfm__check_qkv_split(__func__, q, k, v, qkv, pos, B, T, H, D, pos_stride, base,
                                     rope, 0));
    const int64_t hd = H * D;
    const qkv_parts parts = {{q, k, v}, {qkv, qkv + hd, qkv + 2 * hd}, hd, 3 * hd};
    return qkv_split(__func__, parts, pos, B, T, H, D, pos_stride, base, rope, +1.0, stream);
}

extern "C" pytfm_status pytfm_qkv_split_backward_cuda(float *dqkv, const float *dq,
                                                      const float *dk, const float *dv,
                                                      const int64_t *pos, int64_t B, int64_t T,
                                                      int64_t H, int64_t D, int64_t pos_stride,
                                                      double base, int32_t rope, void *stream) {
    PYTFM_TRY(pytfm__check_qkv_split(__func__, dq, dk, dv, dqkv, pos, B, T, H, D, pos_stride,
                                     base, rope, 1));
    const int64_t hd = H * D;
    const qkv_parts parts = {{dqkv, dqkv + hd, dqkv + 2 * hd}, {dq, dk, dv}, 3 * hd, hd};
    return qkv_split(__func__, parts, pos, B, T, H, D, pos_stride, base, rope, -1.0, stream);
}
