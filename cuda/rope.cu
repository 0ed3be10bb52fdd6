/*
 * rope.cu — rotary position embedding, rotate-half pairing, on the GPU, and the split of the
 * fused QKV projection with RoPE on q and k; the twin of csrc/kernels/rope.c.
 *
 *   x, y [B, T, H, D], half = D/2; θ_i = pos[b·pos_stride + t] · base^(−2i/D), i in [0, half)
 *     y_i = x_i cos θ_i − x_{i+half} sin θ_i,   y_{i+half} = x_{i+half} cos θ_i + x_i sin θ_i
 *   backward: the rotation by −θ (its transpose).
 * The angles first: a small kernel fills a table of cos θ_i and sin θ_i, one row of half
 * floats each per distinct position row (T rows when the batches share positions,
 * pos_stride = 0, else B·T), computed in double and rounded to float as csrc/kernels/rope.c
 * does (the same expression: the same bits as computing them per pair), into stream scratch
 * (the stream's workspace, else cudaMallocAsync). Then a thread per 4 pairs (b, t, h,
 * i..i+3) where half is a multiple of 4 and the data is 16-byte aligned (two float4 loads,
 * two float4 table loads, two float4 stores), else per pair. A thread reads its pairs before writing them, so in place (y == x)
 * is safe, __restrict__ included: no element is read after another thread wrote it.
 *
 * QKV split: qkv [B, T, 3, H, D] (per token q, k, v, each H·D floats) -> q, k, v [B, T, H, D],
 *   q = R(θ) qkv[:, :, 0], k = R(θ) qkv[:, :, 1], v = qkv[:, :, 2]  (R the identity when rope
 *   is off); backward dqkv[:, :, 0] = R(−θ) dq, dqkv[:, :, 1] = R(−θ) dk, dqkv[:, :, 2] = dv.
 * With rope, the same kernel as RoPE with three "parts" (row bt of H·D floats read at
 * in[p] + bt·in_stride, written at out[p] + bt·out_stride, as csrc/kernels/rope.c's streams): it
 * rotates q's and k's pairs by the table and copies v's, so q and k are the same bits as
 * pytfm_rope_forward_cuda on the slices. Without rope (D may be odd) a thread per float4 (or
 * float) of a row copies it in each part.
 * Index arithmetic is 32-bit when every offset fits (the divisions per thread cost a third as
 * much as 64-bit ones), 64-bit otherwise.
 *
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "pytfm_cuda.cuh"

/* cos, sin of θ_i = sign · p · base^(−2i/D) for each row r of positions (p = pos[r] when the
 * batches share them, else pos[(r / T)·pos_stride + r % T]): [rows, half] each, computed in
 * double and rounded to float, the expression of csrc/kernels/rope.c */
static __global__ void rope_table_kernel(float *__restrict__ cs, float *__restrict__ sn,
                                         const int64_t *__restrict__ pos, int64_t rows, int64_t T,
                                         int64_t pos_stride, int64_t D, double base, double sign) {
    const int64_t half = D / 2;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * half;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / half, i = e % half;
        const int64_t p = pos_stride == 0 ? pos[r] : pos[r / T * pos_stride + r % T];
        const double theta = sign * (double)p * pow(base, -2.0 * (double)i / (double)D);
        cs[e] = (float)cos(theta), sn[e] = (float)sin(theta);
    }
}

/* The parts: row bt of H·D floats read at in[p] + bt·in_stride, written at
 * out[p] + bt·out_stride. With kParts = 1 (RoPE) part 0 is rotated; with 3 (the QKV split)
 * parts 0 and 1 are rotated and part 2 copied. */
template <int kParts> struct rope_parts {
    float *out[kParts];
    const float *in[kParts];
    int64_t out_stride, in_stride;
};

/* the pair (i, i + half) of one head's D floats, rotated; reads both before writing */
template <class I>
static __device__ __forceinline__ void
rotate_pair(float *__restrict__ out, const float *__restrict__ in, I i, I half, float c, float s) {
    const float x0 = in[i], x1 = in[i + half];
    out[i] = x0 * c - x1 * s;
    out[i + half] = x1 * c + x0 * s;
}

/* the pairs (i..i+3, i+half..i+half+3), rotated: each float as rotate_pair computes it */
template <class I>
static __device__ __forceinline__ void rotate_pair4(float *__restrict__ out,
                                                    const float *__restrict__ in, I i, I half,
                                                    float4 c, float4 s) {
    const float4 x0 = pytfm__load4(in + i), x1 = pytfm__load4(in + i + half);
    pytfm__store4(out + i, make_float4(x0.x * c.x - x1.x * s.x, x0.y * c.y - x1.y * s.y,
                                       x0.z * c.z - x1.z * s.z, x0.w * c.w - x1.w * s.w));
    pytfm__store4(out + i + half, make_float4(x1.x * c.x + x0.x * s.x, x1.y * c.y + x0.y * s.y,
                                              x1.z * c.z + x0.z * s.z, x1.w * c.w + x0.w * s.w));
}

/* a thread per unit (b, t, h, i): 4 pairs (kVec) or 1; I the index type (uint32_t or int64_t);
 * per_batch: the table has a row per (b, t), else per t */
template <int kParts, bool kVec, class I>
static __global__ void rope_kernel(rope_parts<kParts> parts, const float *__restrict__ cs,
                                   const float *__restrict__ sn, I BT, I T, I H, I D,
                                   bool per_batch) {
    const I half = D / 2, units = kVec ? half / 4 : half, n = BT * H * units;
    const I out_stride = (I)parts.out_stride, in_stride = (I)parts.in_stride;
    for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (I)gridDim.x * blockDim.x) {
        const I u = e % units, bth = e / units; // bth = (b·T + t)·H + h
        const I bt = bth / H, h = bth - bt * H, i = kVec ? 4 * u : u;
        const I a = (per_batch ? bt : bt % T) * half + i; // the angles' index in the table
        const I out_off = bt * out_stride + h * D, in_off = bt * in_stride + h * D;
        for (int p = 0; p < (kParts == 1 ? 1 : 2); p++) {
            if constexpr (kVec)
                rotate_pair4(parts.out[p] + out_off, parts.in[p] + in_off, i, half,
                             pytfm__load4(cs + a), pytfm__load4(sn + a));
            else
                rotate_pair(parts.out[p] + out_off, parts.in[p] + in_off, i, half, cs[a], sn[a]);
        }
        if constexpr (kParts == 3) { // v: copied
            float *v_out = parts.out[2] + out_off;
            const float *v_in = parts.in[2] + in_off;
            if constexpr (kVec) {
                pytfm__store4(v_out + i, pytfm__load4(v_in + i));
                pytfm__store4(v_out + i + half, pytfm__load4(v_in + i + half));
            } else {
                v_out[i] = v_in[i];
                v_out[i + half] = v_in[i + half];
            }
        }
    }
}

/* rope off: a thread per unit (float4 or float) c of row bt of a part copies it in all three
 * (the parts indexed by constants: a runtime index would put them in local memory) */
template <bool kVec, class I>
static __global__ void qkv_copy_kernel(rope_parts<3> parts, I rows, I hd) {
    const I units = kVec ? hd / 4 : hd, out_stride = (I)parts.out_stride,
            in_stride = (I)parts.in_stride;
    for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < rows * units;
         e += (I)gridDim.x * blockDim.x) {
        const I bt = e / units, c = kVec ? 4 * (e % units) : e % units;
        for (int p = 0; p < 3; p++) {
            if constexpr (kVec)
                pytfm__store4(parts.out[p] + bt * out_stride + c,
                              pytfm__load4(parts.in[p] + bt * in_stride + c));
            else
                parts.out[p][bt * out_stride + c] = parts.in[p][bt * in_stride + c];
        }
    }
}

/* every pointer of the parts 16-byte aligned and the strides multiples of 4 floats */
template <int kParts> static bool parts_aligned(const rope_parts<kParts> &parts) {
    uintptr_t bits = (uintptr_t)(parts.out_stride | parts.in_stride) * 4u;
    for (int p = 0; p < kParts; p++) bits |= (uintptr_t)parts.out[p] | (uintptr_t)parts.in[p];
    return (bits & 15u) == 0;
}

/* offsets within 2^31 (with the grid's stride on top): 32-bit indices */
static bool fits32(int64_t elements) { return elements < (1ll << 31) - (1ll << 26); }

template <bool kVec, class I>
static pytfm_status launch_copy(const char *func, const rope_parts<3> &parts, int64_t rows,
                                int64_t hd, void *stream) {
    const int64_t units = rows * (kVec ? hd / 4 : hd);
    return pytfm__launch(func, qkv_copy_kernel<kVec, I>,
                         dim3(pytfm__blocks(units, 256, PYTFM_MAX_BLOCKS)), dim3(256), 0, stream,
                         parts, (I)rows, (I)hd);
}

template <int kParts, bool kVec, class I>
static pytfm_status launch_rotate(const char *func, const rope_parts<kParts> &parts,
                                  const float *cs, const float *sn, int64_t B, int64_t T, int64_t H,
                                  int64_t D, bool per_batch, void *stream) {
    const int64_t units = B * T * H * (kVec ? D / 8 : D / 2);
    return pytfm__launch(func, rope_kernel<kParts, kVec, I>,
                         dim3(pytfm__blocks(units, 256, PYTFM_MAX_BLOCKS)), dim3(256), 0, stream,
                         parts, cs, sn, (I)(B * T), (I)T, (I)H, (I)D, per_batch);
}

/* the parts rotated by sign·θ (+1 forward, −1 backward): the table into scratch, then the
 * rotation; checked arguments, B·T·H > 0 */
template <int kParts>
static pytfm_status rotate_parts(const char *func, const rope_parts<kParts> &parts,
                                 const int64_t *pos, int64_t B, int64_t T, int64_t H, int64_t D,
                                 int64_t pos_stride, double base, double sign, void *stream) {
    const int64_t half = D / 2, rows = pos_stride == 0 ? T : B * T; // distinct position rows
    if (half == 0) return PYTFM_STATUS_OK;
    float *cs = NULL;
    PYTFM_TRY(pytfm__stream_scratch(func, &cs, 2 * rows * half, stream));
    float *sn = cs + rows * half;
    pytfm_status st = pytfm__launch(
        func, rope_table_kernel, dim3(pytfm__blocks(rows * half, 256, PYTFM_MAX_BLOCKS)), dim3(256),
        0, stream, cs, sn, pos, rows, T, pos_stride, D, base, sign);
    if (st == PYTFM_STATUS_OK) {
        // float4: 4 pairs at i % 4 == 0 of every head, the table's rows on 16-byte boundaries
        const bool vec = half % 4 == 0 && parts_aligned(parts) && ((uintptr_t)cs & 15u) == 0;
        const bool small = fits32(B * T * kParts * H * D);
        const bool per_batch = pos_stride != 0;
        st = vec ? small ? launch_rotate<kParts, true, uint32_t>(func, parts, cs, sn, B, T, H, D,
                                                                 per_batch, stream)
                         : launch_rotate<kParts, true, int64_t>(func, parts, cs, sn, B, T, H, D,
                                                                per_batch, stream)
             : small ? launch_rotate<kParts, false, uint32_t>(func, parts, cs, sn, B, T, H, D,
                                                              per_batch, stream)
                     : launch_rotate<kParts, false, int64_t>(func, parts, cs, sn, B, T, H, D,
                                                             per_batch, stream);
    }
    return pytfm__stream_scratch_free(func, cs, st, stream);
}

static pytfm_status rope(const char *func, float *out, const float *in, const int64_t *pos,
                         int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                         double base, double sign, void *stream) {
    PYTFM_TRY(pytfm__check_rope(func, out, in, pos, B, T, H, D, pos_stride, base));
    if (B * T * H * (D / 2) == 0) return PYTFM_STATUS_OK;
    const rope_parts<1> parts = {{out}, {in}, H * D, H * D};
    return rotate_parts(func, parts, pos, B, T, H, D, pos_stride, base, sign, stream);
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

static pytfm_status qkv_split(const char *func, const rope_parts<3> &parts, const int64_t *pos,
                              int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                              double base, int32_t rope, double sign, void *stream) {
    if (B * T * H == 0) return PYTFM_STATUS_OK; // pos may then be NULL: nothing to read
    if (rope) return rotate_parts(func, parts, pos, B, T, H, D, pos_stride, base, sign, stream);
    const int64_t hd = H * D;
    const bool vec = hd % 4 == 0 && parts_aligned(parts), small = fits32(B * T * 3 * hd);
    return vec     ? small ? launch_copy<true, uint32_t>(func, parts, B * T, hd, stream)
                           : launch_copy<true, int64_t>(func, parts, B * T, hd, stream)
               : small ? launch_copy<false, uint32_t>(func, parts, B * T, hd, stream)
                   : launch_copy<false, int64_t>(func, parts, B * T, hd, stream);
}

extern "C" pytfm_status pytfm_qkv_split_forward_cuda(float *q, float *k, float *v, const float *qkv,
                                                     const int64_t *pos, int64_t B, int64_t T,
                                                     int64_t H, int64_t D, int64_t pos_stride,
                                                     double base, int32_t rope, void *stream) {
    PYTFM_TRY(
        pytfm__check_qkv_split(__func__, q, k, v, qkv, pos, B, T, H, D, pos_stride, base, rope, 0));
    const int64_t hd = H * D;
    const rope_parts<3> parts = {{q, k, v}, {qkv, qkv + hd, qkv + 2 * hd}, hd, 3 * hd};
    return qkv_split(__func__, parts, pos, B, T, H, D, pos_stride, base, rope, +1.0, stream);
}

extern "C" pytfm_status pytfm_qkv_split_backward_cuda(float *dqkv, const float *dq, const float *dk,
                                                      const float *dv, const int64_t *pos,
                                                      int64_t B, int64_t T, int64_t H, int64_t D,
                                                      int64_t pos_stride, double base, int32_t rope,
                                                      void *stream) {
    PYTFM_TRY(pytfm__check_qkv_split(__func__, dq, dk, dv, dqkv, pos, B, T, H, D, pos_stride, base,
                                     rope, 1));
    const int64_t hd = H * D;
    const rope_parts<3> parts = {{dqkv, dqkv + hd, dqkv + 2 * hd}, {dq, dk, dv}, 3 * hd, hd};
    return qkv_split(__func__, parts, pos, B, T, H, D, pos_stride, base, rope, -1.0, stream);
}
