/*
 * cuda_stub.c — the CUDA entry points of a build without CUDA (nvcc was not found, or
 * PYTFM_CUDA=0). Each returns PYTFM_STATUS_NOT_SUPPORTED with a message that says why, so a
 * program linked against either build sees the same symbols. setup.py leaves this file out
 * when it compiles the kernels in cuda/.
 */
#include "internal.h"

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-parameter" /* a stub ignores its arguments */
#endif

static pytfm_status no_cuda(const char *func) {
    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                       "%s: pytfm was built without CUDA (nvcc not found, or PYTFM_CUDA=0)", func);
}

pytfm_status pytfm_cuda_device_count(int32_t *count) {
    PYTFM_CHECK_PTR(count, 1);
    *count = 0;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_cuda_stream_synchronize(void *stream) { return no_cuda(__func__); }

pytfm_status pytfm_sgemm_cuda(float *c, const float *a, const float *b, int64_t m, int64_t n,
                              int64_t k, int32_t trans_a, int32_t trans_b, float beta,
                              void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_linear_forward_cuda(float *y, const float *x, const float *w, const float *b,
                                       int64_t n, int64_t in, int64_t out, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_linear_backward_cuda(float *dx, float *dw, float *db, const float *dy,
                                        const float *x, const float *w, int64_t n, int64_t in,
                                        int64_t out, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_softmax_forward_cuda(float *y, const float *x, int64_t rows, int64_t cols,
                                        void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_softmax_backward_cuda(float *dx, const float *dy, const float *y,
                                         int64_t rows, int64_t cols, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_layernorm_forward_cuda(float *y, float *mean, float *rstd, const float *x,
                                          const float *w, const float *b, int64_t rows,
                                          int64_t cols, float eps, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_layernorm_backward_cuda(float *dx, float *dw, float *db, const float *dy,
                                           const float *x, const float *w, const float *mean,
                                           const float *rstd, int64_t rows, int64_t cols,
                                           void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_rope_forward_cuda(float *y, const float *x, const int64_t *pos, int64_t B,
                                     int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                                     double base, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_rope_backward_cuda(float *dx, const float *dy, const int64_t *pos, int64_t B,
                                      int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                                      double base, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_gelu_forward_cuda(float *y, const float *x, int64_t n, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_gelu_backward_cuda(float *dx, const float *dy, const float *x, int64_t n,
                                      void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_embedding_forward_cuda(float *y, const int64_t *ids, const float *table,
                                          int64_t n, int64_t vocab, int64_t dim, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_embedding_backward_cuda(float *dtable, const float *dy, const int64_t *ids,
                                           int64_t n, int64_t vocab, int64_t dim,
                                           void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_cross_entropy_forward_cuda(float *loss, float *lse, const float *logits,
                                              const int64_t *targets, int64_t n, int64_t V,
                                              int64_t ignore_index, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_cross_entropy_backward_cuda(float *dlogits, const float *logits,
                                               const int64_t *targets, const float *lse,
                                               int64_t n, int64_t V, int64_t ignore_index,
                                               float dloss, void *stream) {
    return no_cuda(__func__);
}

pytfm_status pytfm_adamw_step_cuda(float *param, float *m, float *v, const float *grad,
                                   int64_t n, int64_t step, double lr, double beta1,
                                   double beta2, double eps, double weight_decay, void *stream) {
    return no_cuda(__func__);
}
