/*
 * linear.cu — fully connected layer on the GPU, y = x·Wᵀ + b; the twin of csrc/kernels/linear.c.
 *
 *   x [rows, in], W [out, in], b [out], y [rows, out]
 *   forward:  y = x·Wᵀ (pytfm_sgemm_cuda, trans_b), then y[r, :] += b
 *   backward: dx = dy·W (written), dW += dyᵀ·x (β = 1), db += column sums of dy
 *   linear + GELU: h = x·Wᵀ (the same SGEMM), then one pass h[r, :] += b, y = gelu(h):
 *     the same float operations as the forward then gelu.cu's forward, one pass fewer over h.
 * The _ex twins take a pytfm_precision last: FP32 is the functions above, bit for bit; TF32
 * and BF16 run each product on the tensor cores (pytfm__sgemm_ex_cuda, cuda/sgemm_tc.cu), the
 * bias, the GELU and db as above, in FP32.
 * The bias column sums are the two-stage fixed-order column reduction of pytfm_cuda.cuh
 * (blocks over column tiles × row chunks, then the chunks added in order): no atomics, the
 * same bits on every run.
 */
#include "gelu.cuh" /* pytfm__gelu, as gelu.cu computes it; includes pytfm_cuda.cuh */

static __global__ void add_bias_kernel(float *y, const float *b, int64_t rows, int64_t out) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * out;
         e += (int64_t)gridDim.x * blockDim.x)
        y[e] += b[e % out];
}

/* the product of the forward in a precision (FP32: pytfm_sgemm_cuda, the twins' bits) */
static pytfm_status product(const char *func, float *c, const float *a, const float *b,
                            int64_t m, int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                            float beta, int32_t precision, void *stream) {
    if (precision == PYTFM_PRECISION_FP32)
        return pytfm_sgemm_cuda(c, a, b, m, n, k, trans_a, trans_b, beta, stream);
    return pytfm__sgemm_ex_cuda(func, c, a, b, m, n, k, trans_a, trans_b, beta, precision,
                                stream);
}

static pytfm_status forward(const char *func, float *y, const float *x, const float *w,
                            const float *b, int64_t rows, int64_t in, int64_t out,
                            int32_t precision, void *stream) {
    PYTFM_TRY(product(func, y, x, w, rows, out, in, 0, 1, 0.0f, precision, stream));
    if (!b || rows == 0) return PYTFM_STATUS_OK;
    return pytfm__launch(func, add_bias_kernel,
                         dim3(pytfm__blocks(rows * out, 256, PYTFM_MAX_BLOCKS)), dim3(256), 0,
                         stream, y, b, rows, out);
}

extern "C" pytfm_status pytfm_linear_forward_cuda(float *y, const float *x, const float *w,
                                                  const float *b, int64_t rows, int64_t in,
                                                  int64_t out, void *stream) {
    PYTFM_TRY(pytfm__check_linear_forward(__func__, y, x, w, b, rows, in, out));
    return forward(__func__, y, x, w, b, rows, in, out, PYTFM_PRECISION_FP32, stream);
}

extern "C" pytfm_status pytfm_linear_forward_ex_cuda(float *y, const float *x, const float *w,
                                                     const float *b, int64_t rows, int64_t in,
                                                     int64_t out, int32_t precision,
                                                     void *stream) {
    PYTFM_TRY(pytfm__check_linear_forward(__func__, y, x, w, b, rows, in, out));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    return forward(__func__, y, x, w, b, rows, in, out, precision, stream);
}

/* h[r, j] += b[j] (b may be NULL), y[r, j] = gelu(h[r, j]): add_bias_kernel then
 * gelu_forward_kernel in one pass (without a bias, h is only read) */
static __global__ void bias_gelu_kernel(float *y, float *h, const float *b, int64_t rows,
                                        int64_t out) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * out;
         e += (int64_t)gridDim.x * blockDim.x) {
        float v = h[e];
        if (b) {
            v += b[e % out];
            h[e] = v;
        }
        y[e] = pytfm__gelu(v);
    }
}

static pytfm_status gelu_forward(const char *func, float *y, float *h, const float *x,
                                 const float *w, const float *b, int64_t rows, int64_t in,
                                 int64_t out, int32_t precision, void *stream) {
    PYTFM_TRY(product(func, h, x, w, rows, out, in, 0, 1, 0.0f, precision, stream));
    if (rows == 0) return PYTFM_STATUS_OK;
    return pytfm__launch(func, bias_gelu_kernel,
                         dim3(pytfm__blocks(rows * out, 256, PYTFM_MAX_BLOCKS)), dim3(256), 0,
                         stream, y, h, b, rows, out);
}

extern "C" pytfm_status pytfm_linear_gelu_forward_cuda(float *y, float *h, const float *x,
                                                       const float *w, const float *b,
                                                       int64_t rows, int64_t in, int64_t out,
                                                       void *stream) {
    PYTFM_TRY(pytfm__check_linear_gelu_forward(__func__, y, h, x, w, b, rows, in, out));
    return gelu_forward(__func__, y, h, x, w, b, rows, in, out, PYTFM_PRECISION_FP32, stream);
}

extern "C" pytfm_status pytfm_linear_gelu_forward_ex_cuda(float *y, float *h, const float *x,
                                                          const float *w, const float *b,
                                                          int64_t rows, int64_t in, int64_t out,
                                                          int32_t precision, void *stream) {
    PYTFM_TRY(pytfm__check_linear_gelu_forward(__func__, y, h, x, w, b, rows, in, out));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    return gelu_forward(__func__, y, h, x, w, b, rows, in, out, precision, stream);
}

/* db[j] += Σ_r dy[r, j] */
struct bias_term {
    enum { K = 1 };
    float *__restrict__ sums[K]; // db
    const float *__restrict__ dy;
    int64_t out;
    __device__ void operator()(float *t, int64_t r, int64_t j) const { t[0] = dy[r * out + j]; }
};

static pytfm_status backward(const char *func, float *dx, float *dw, float *db,
                             const float *dy, const float *x, const float *w, int64_t rows,
                             int64_t in, int64_t out, int32_t precision, void *stream) {
    if (dx) PYTFM_TRY(product(func, dx, dy, w, rows, in, out, 0, 0, 0.0f, precision, stream));
    // dy is op(A)ᵀ
    PYTFM_TRY(product(func, dw, dy, x, out, in, rows, 1, 0, 1.0f, precision, stream));
    if (!db || rows == 0) return PYTFM_STATUS_OK;
    return pytfm__launch_column_sum(func, bias_term{{db}, dy, out}, rows, out, stream);
}

extern "C" pytfm_status pytfm_linear_backward_cuda(float *dx, float *dw, float *db,
                                                   const float *dy, const float *x,
                                                   const float *w, int64_t rows, int64_t in,
                                                   int64_t out, void *stream) {
    PYTFM_TRY(pytfm__check_linear_backward(__func__, dx, dw, db, dy, x, w, rows, in, out));
    return backward(__func__, dx, dw, db, dy, x, w, rows, in, out, PYTFM_PRECISION_FP32, stream);
}

extern "C" pytfm_status pytfm_linear_backward_ex_cuda(float *dx, float *dw, float *db,
                                                      const float *dy, const float *x,
                                                      const float *w, int64_t rows, int64_t in,
                                                      int64_t out, int32_t precision,
                                                      void *stream) {
    PYTFM_TRY(pytfm__check_linear_backward(__func__, dx, dw, db, dy, x, w, rows, in, out));
    PYTFM_TRY(pytfm__check_precision_cuda(__func__, precision));
    return backward(__func__, dx, dw, db, dy, x, w, rows, in, out, precision, stream);
}
