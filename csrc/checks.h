/*
 * checks.h — the argument checks of each op direction, shared by its C kernel (csrc/) and its
 * CUDA twin (cuda/), so that both reject the same arguments with the same message. Each takes
 * the public function's name (func, for the message) and its arguments, under their public
 * names, and returns the first failure. Index arrays are checked only by the C kernels
 * (pytfm__check_indices): on the GPU they live in device memory.
 */
#ifndef PYTFM_CHECKS_H
#define PYTFM_CHECKS_H

#include "internal.h"

static inline pytfm_status pytfm__check_sgemm(const char *func, const float *c, const float *a,
                                              const float *b, int64_t m, int64_t n, int64_t k,
                                              float beta) {
    PYTFM_CHECK(m >= 0 && n >= 0 && k >= 0, "%s: m, n, k must be >= 0, got %lld, %lld, %lld",
                func, (long long)m, (long long)n, (long long)k);
    PYTFM_CHECK(isfinite(beta), "%s: beta must be finite, got %g", func, (double)beta);
    PYTFM_CHECK(c != NULL || m * n == 0, "%s: c must not be NULL", func);
    PYTFM_CHECK(a != NULL || m * k == 0, "%s: a must not be NULL", func);
    PYTFM_CHECK(b != NULL || k * n == 0, "%s: b must not be NULL", func);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_linear_forward(const char *func, const float *y,
                                                       const float *x, const float *w,
                                                       int64_t n, int64_t in, int64_t out) {
    PYTFM_CHECK_MIN_IN(func, n, 0);
    PYTFM_CHECK_MIN_IN(func, in, 1);
    PYTFM_CHECK_MIN_IN(func, out, 1);
    PYTFM_CHECK_PTR_IN(func, y, n);
    PYTFM_CHECK_PTR_IN(func, x, n);
    PYTFM_CHECK_PTR_IN(func, w, 1);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_linear_backward(const char *func, const float *dx,
                                                        const float *dw, const float *dy,
                                                        const float *x, const float *w,
                                                        int64_t n, int64_t in, int64_t out) {
    PYTFM_CHECK_MIN_IN(func, n, 0);
    PYTFM_CHECK_MIN_IN(func, in, 1);
    PYTFM_CHECK_MIN_IN(func, out, 1);
    PYTFM_CHECK_PTR_IN(func, dw, 1);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, x, n);
    PYTFM_CHECK_PTR_IN(func, w, dx ? 1 : 0);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_softmax_forward(const char *func, const float *y,
                                                        const float *x, int64_t rows,
                                                        int64_t cols) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, cols, 1);
    PYTFM_CHECK_PTR_IN(func, y, rows);
    PYTFM_CHECK_PTR_IN(func, x, rows);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_softmax_backward(const char *func, const float *dx,
                                                         const float *dy, const float *y,
                                                         int64_t rows, int64_t cols) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, cols, 1);
    PYTFM_CHECK_PTR_IN(func, dx, rows);
    PYTFM_CHECK_PTR_IN(func, dy, rows);
    PYTFM_CHECK_PTR_IN(func, y, rows);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_layernorm_forward(const char *func, const float *y,
                                                          const float *mean, const float *rstd,
                                                          const float *x, const float *w,
                                                          const float *b, int64_t rows,
                                                          int64_t cols, float eps) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, cols, 1);
    PYTFM_CHECK_FINITE_IN(func, eps);
    PYTFM_CHECK(eps >= 0.0f, "%s: eps must be >= 0, got %g", func, (double)eps);
    PYTFM_CHECK_PTR_IN(func, y, rows);
    PYTFM_CHECK_PTR_IN(func, mean, rows);
    PYTFM_CHECK_PTR_IN(func, rstd, rows);
    PYTFM_CHECK_PTR_IN(func, x, rows);
    PYTFM_CHECK_PTR_IN(func, w, 1);
    PYTFM_CHECK_PTR_IN(func, b, 1);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status
pytfm__check_layernorm_backward(const char *func, const float *dx, const float *dw,
                                const float *db, const float *dy, const float *x, const float *w,
                                const float *mean, const float *rstd, int64_t rows, int64_t cols) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, cols, 1);
    PYTFM_CHECK_PTR_IN(func, dx, rows);
    PYTFM_CHECK_PTR_IN(func, dw, 1);
    PYTFM_CHECK_PTR_IN(func, db, 1);
    PYTFM_CHECK_PTR_IN(func, dy, rows);
    PYTFM_CHECK_PTR_IN(func, x, rows);
    PYTFM_CHECK_PTR_IN(func, w, 1);
    PYTFM_CHECK_PTR_IN(func, mean, rows);
    PYTFM_CHECK_PTR_IN(func, rstd, rows);
    return PYTFM_STATUS_OK;
}

/* out, in: y, x (forward) or dx, dy (backward) [B, T, H, D] */
static inline pytfm_status pytfm__check_rope(const char *func, const float *out, const float *in,
                                             const int64_t *pos, int64_t B, int64_t T, int64_t H,
                                             int64_t D, int64_t pos_stride, double base) {
    PYTFM_CHECK(B >= 0 && T >= 0 && H >= 0, "%s: B, T, H must be >= 0, got %lld, %lld, %lld",
                func, (long long)B, (long long)T, (long long)H);
    PYTFM_CHECK(D >= 2 && D % 2 == 0, "%s: D must be even and >= 2, got %lld", func,
                (long long)D);
    PYTFM_CHECK(pos_stride >= 0, "%s: pos_stride must be >= 0, got %lld", func,
                (long long)pos_stride);
    PYTFM_CHECK(isfinite(base) && base > 0.0, "%s: base must be finite and > 0, got %g", func,
                base);
    const int64_t count = B * T * H;
    PYTFM_CHECK(out != NULL || count == 0, "%s: output must not be NULL", func);
    PYTFM_CHECK(in != NULL || count == 0, "%s: input must not be NULL", func);
    PYTFM_CHECK(pos != NULL || B * T == 0, "%s: pos must not be NULL", func);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_gelu_forward(const char *func, const float *y,
                                                     const float *x, int64_t n) {
    PYTFM_CHECK_MIN_IN(func, n, 0);
    PYTFM_CHECK_PTR_IN(func, y, n);
    PYTFM_CHECK_PTR_IN(func, x, n);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_gelu_backward(const char *func, const float *dx,
                                                      const float *dy, const float *x,
                                                      int64_t n) {
    PYTFM_CHECK_MIN_IN(func, n, 0);
    PYTFM_CHECK_PTR_IN(func, dx, n);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, x, n);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_embedding_forward(const char *func, const float *y,
                                                          const int64_t *ids,
                                                          const float *table, int64_t n,
                                                          int64_t vocab, int64_t dim) {
    PYTFM_CHECK_MIN_IN(func, n, 0);
    PYTFM_CHECK_MIN_IN(func, vocab, 1);
    PYTFM_CHECK_MIN_IN(func, dim, 1);
    PYTFM_CHECK_PTR_IN(func, y, n);
    PYTFM_CHECK_PTR_IN(func, ids, n);
    PYTFM_CHECK_PTR_IN(func, table, 1);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_embedding_backward(const char *func, const float *dtable,
                                                           const float *dy, const int64_t *ids,
                                                           int64_t n, int64_t vocab,
                                                           int64_t dim) {
    PYTFM_CHECK_MIN_IN(func, n, 0);
    PYTFM_CHECK_MIN_IN(func, vocab, 1);
    PYTFM_CHECK_MIN_IN(func, dim, 1);
    PYTFM_CHECK_PTR_IN(func, dtable, 1);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, ids, n);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_cross_entropy_forward(const char *func, const float *loss,
                                                              const float *lse,
                                                              const float *logits,
                                                              const int64_t *targets, int64_t n,
                                                              int64_t V) {
    PYTFM_CHECK_MIN_IN(func, n, 0);
    PYTFM_CHECK_MIN_IN(func, V, 1);
    PYTFM_CHECK_PTR_IN(func, loss, 1);
    PYTFM_CHECK_PTR_IN(func, lse, n);
    PYTFM_CHECK_PTR_IN(func, logits, n);
    PYTFM_CHECK_PTR_IN(func, targets, n);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status
pytfm__check_cross_entropy_backward(const char *func, const float *dlogits, const float *logits,
                                    const int64_t *targets, const float *lse, int64_t n,
                                    int64_t V, float dloss) {
    PYTFM_CHECK_MIN_IN(func, n, 0);
    PYTFM_CHECK_MIN_IN(func, V, 1);
    PYTFM_CHECK_FINITE_IN(func, dloss);
    PYTFM_CHECK_PTR_IN(func, dlogits, n);
    PYTFM_CHECK_PTR_IN(func, logits, n);
    PYTFM_CHECK_PTR_IN(func, targets, n);
    PYTFM_CHECK_PTR_IN(func, lse, n);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_adamw(const char *func, const float *param,
                                              const float *m, const float *v, const float *grad,
                                              int64_t n, int64_t step, double lr, double beta1,
                                              double beta2, double eps, double weight_decay) {
    PYTFM_CHECK_MIN_IN(func, n, 0);
    PYTFM_CHECK_MIN_IN(func, step, 1);
    PYTFM_CHECK(isfinite(lr) && lr >= 0.0, "%s: lr must be finite and >= 0, got %g", func, lr);
    PYTFM_CHECK(beta1 >= 0.0 && beta1 < 1.0, "%s: beta1 must be in [0, 1), got %g", func, beta1);
    PYTFM_CHECK(beta2 >= 0.0 && beta2 < 1.0, "%s: beta2 must be in [0, 1), got %g", func, beta2);
    PYTFM_CHECK(isfinite(eps) && eps > 0.0, "%s: eps must be finite and > 0, got %g", func, eps);
    PYTFM_CHECK(isfinite(weight_decay) && weight_decay >= 0.0,
                "%s: weight_decay must be finite and >= 0, got %g", func, weight_decay);
    PYTFM_CHECK_PTR_IN(func, param, n);
    PYTFM_CHECK_PTR_IN(func, m, n);
    PYTFM_CHECK_PTR_IN(func, v, n);
    PYTFM_CHECK_PTR_IN(func, grad, n);
    return PYTFM_STATUS_OK;
}

#endif /* PYTFM_CHECKS_H */
