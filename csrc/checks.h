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

/* ---- one size check per op, shared by its forward and backward ---------------------------- */

/* softmax and LayerNorm */
static inline pytfm_status pytfm__check_rows_cols(const char *func, int64_t rows, int64_t cols) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, cols, 1);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_linear_sizes(const char *func, int64_t rows, int64_t in,
                                                     int64_t out) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, in, 1);
    PYTFM_CHECK_MIN_IN(func, out, 1);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_cross_entropy_sizes(const char *func, int64_t rows,
                                                            int64_t vocab) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, vocab, 1);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_embedding_sizes(const char *func, int64_t rows,
                                                        int64_t vocab, int64_t dim) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, vocab, 1);
    PYTFM_CHECK_MIN_IN(func, dim, 1);
    return PYTFM_STATUS_OK;
}

/* attention's [B, T, H, D] tensors (T: n_new for the decoding functions, named so) */
static inline pytfm_status pytfm__check_attention_sizes(const char *func, const char *t_name,
                                                        int64_t B, int64_t T, int64_t H,
                                                        int64_t D) {
    PYTFM_CHECK(B >= 0 && T >= 0 && H >= 0, "%s: B, %s, H must be >= 0, got %lld, %lld, %lld",
                func, t_name, (long long)B, (long long)T, (long long)H);
    PYTFM_CHECK(D >= 1, "%s: D must be >= 1, got %lld", func, (long long)D);
    return PYTFM_STATUS_OK;
}

/* n_new tokens at positions [start, start + n_new) of a KV cache of Tmax positions */
static inline pytfm_status pytfm__check_cache_positions(const char *func, int64_t n_new,
                                                        int64_t Tmax, int64_t start) {
    PYTFM_CHECK(start >= 0, "%s: start must be >= 0, got %lld", func, (long long)start);
    PYTFM_CHECK(Tmax >= 1, "%s: Tmax must be >= 1, got %lld", func, (long long)Tmax);
    PYTFM_CHECK(start + n_new <= Tmax,
                "%s: cache overflow: positions [%lld, %lld) do not fit in Tmax = %lld", func,
                (long long)start, (long long)(start + n_new), (long long)Tmax);
    return PYTFM_STATUS_OK;
}

/* ---- each op direction ------------------------------------------------------------------ */

static inline pytfm_status pytfm__check_linear_forward(const char *func, const float *y,
                                                       const float *x, const float *w,
                                                       int64_t rows, int64_t in, int64_t out) {
    PYTFM_TRY(pytfm__check_linear_sizes(func, rows, in, out));
    PYTFM_CHECK_PTR_IN(func, y, rows);
    PYTFM_CHECK_PTR_IN(func, x, rows);
    PYTFM_CHECK_PTR_IN(func, w, 1);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_linear_backward(const char *func, const float *dx,
                                                        const float *dw, const float *dy,
                                                        const float *x, const float *w,
                                                        int64_t rows, int64_t in, int64_t out) {
    PYTFM_TRY(pytfm__check_linear_sizes(func, rows, in, out));
    PYTFM_CHECK_PTR_IN(func, dw, 1);
    PYTFM_CHECK_PTR_IN(func, dy, rows);
    PYTFM_CHECK_PTR_IN(func, x, rows);
    PYTFM_CHECK_PTR_IN(func, w, dx ? 1 : 0);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_softmax_forward(const char *func, const float *y,
                                                        const float *x, int64_t rows,
                                                        int64_t cols) {
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols));
    PYTFM_CHECK_PTR_IN(func, y, rows);
    PYTFM_CHECK_PTR_IN(func, x, rows);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_softmax_backward(const char *func, const float *dx,
                                                         const float *dy, const float *y,
                                                         int64_t rows, int64_t cols) {
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols));
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
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols));
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
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols));
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
    const int64_t vectors = B * T * H; // of D floats each
    PYTFM_CHECK(out != NULL || vectors == 0, "%s: output must not be NULL", func);
    PYTFM_CHECK(in != NULL || vectors == 0, "%s: input must not be NULL", func);
    PYTFM_CHECK(pos != NULL || B * T == 0, "%s: pos must not be NULL", func);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_gelu_forward(const char *func, const float *y,
                                                     const float *x, int64_t count) {
    PYTFM_CHECK_MIN_IN(func, count, 0);
    PYTFM_CHECK_PTR_IN(func, y, count);
    PYTFM_CHECK_PTR_IN(func, x, count);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_gelu_backward(const char *func, const float *dx,
                                                      const float *dy, const float *x,
                                                      int64_t count) {
    PYTFM_CHECK_MIN_IN(func, count, 0);
    PYTFM_CHECK_PTR_IN(func, dx, count);
    PYTFM_CHECK_PTR_IN(func, dy, count);
    PYTFM_CHECK_PTR_IN(func, x, count);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_embedding_forward(const char *func, const float *y,
                                                          const int64_t *ids,
                                                          const float *table, int64_t rows,
                                                          int64_t vocab, int64_t dim) {
    PYTFM_TRY(pytfm__check_embedding_sizes(func, rows, vocab, dim));
    PYTFM_CHECK_PTR_IN(func, y, rows);
    PYTFM_CHECK_PTR_IN(func, ids, rows);
    PYTFM_CHECK_PTR_IN(func, table, 1);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_embedding_backward(const char *func, const float *dtable,
                                                           const float *dy, const int64_t *ids,
                                                           int64_t rows, int64_t vocab,
                                                           int64_t dim) {
    PYTFM_TRY(pytfm__check_embedding_sizes(func, rows, vocab, dim));
    PYTFM_CHECK_PTR_IN(func, dtable, 1);
    PYTFM_CHECK_PTR_IN(func, dy, rows);
    PYTFM_CHECK_PTR_IN(func, ids, rows);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_cross_entropy_forward(const char *func, const float *loss,
                                                              const float *lse,
                                                              const float *logits,
                                                              const int64_t *targets,
                                                              int64_t rows, int64_t vocab) {
    PYTFM_TRY(pytfm__check_cross_entropy_sizes(func, rows, vocab));
    PYTFM_CHECK_PTR_IN(func, loss, 1);
    PYTFM_CHECK_PTR_IN(func, lse, rows);
    PYTFM_CHECK_PTR_IN(func, logits, rows);
    PYTFM_CHECK_PTR_IN(func, targets, rows);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status
pytfm__check_cross_entropy_backward(const char *func, const float *dlogits, const float *logits,
                                    const int64_t *targets, const float *lse, int64_t rows,
                                    int64_t vocab, float dloss) {
    PYTFM_TRY(pytfm__check_cross_entropy_sizes(func, rows, vocab));
    PYTFM_CHECK_FINITE_IN(func, dloss);
    PYTFM_CHECK_PTR_IN(func, dlogits, rows);
    PYTFM_CHECK_PTR_IN(func, logits, rows);
    PYTFM_CHECK_PTR_IN(func, targets, rows);
    PYTFM_CHECK_PTR_IN(func, lse, rows);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_adamw(const char *func, const float *param,
                                              const float *m, const float *v, const float *grad,
                                              int64_t count, int64_t step, double lr,
                                              double beta1, double beta2, double eps,
                                              double weight_decay) {
    PYTFM_CHECK_MIN_IN(func, count, 0);
    PYTFM_CHECK_MIN_IN(func, step, 1);
    PYTFM_CHECK(isfinite(lr) && lr >= 0.0, "%s: lr must be finite and >= 0, got %g", func, lr);
    PYTFM_CHECK(beta1 >= 0.0 && beta1 < 1.0, "%s: beta1 must be in [0, 1), got %g", func, beta1);
    PYTFM_CHECK(beta2 >= 0.0 && beta2 < 1.0, "%s: beta2 must be in [0, 1), got %g", func, beta2);
    PYTFM_CHECK(isfinite(eps) && eps > 0.0, "%s: eps must be finite and > 0, got %g", func, eps);
    PYTFM_CHECK(isfinite(weight_decay) && weight_decay >= 0.0,
                "%s: weight_decay must be finite and >= 0, got %g", func, weight_decay);
    PYTFM_CHECK_PTR_IN(func, param, count);
    PYTFM_CHECK_PTR_IN(func, m, count);
    PYTFM_CHECK_PTR_IN(func, v, count);
    PYTFM_CHECK_PTR_IN(func, grad, count);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_attention_forward(const char *func, const float *o,
                                                          const float *lse, const float *q,
                                                          const float *k, const float *v,
                                                          int64_t B, int64_t T, int64_t H,
                                                          int64_t D, float scale) {
    PYTFM_TRY(pytfm__check_attention_sizes(func, "T", B, T, H, D));
    PYTFM_CHECK_FINITE_IN(func, scale);
    const int64_t vectors = B * T * H; // of D floats each; lse has one per vector
    PYTFM_CHECK_PTR_IN(func, o, vectors);
    PYTFM_CHECK_PTR_IN(func, lse, vectors);
    PYTFM_CHECK_PTR_IN(func, q, vectors);
    PYTFM_CHECK_PTR_IN(func, k, vectors);
    PYTFM_CHECK_PTR_IN(func, v, vectors);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status
pytfm__check_attention_backward(const char *func, const float *dq, const float *dk,
                                const float *dv, const float *dy, const float *q, const float *k,
                                const float *v, const float *o, const float *lse, int64_t B,
                                int64_t T, int64_t H, int64_t D, float scale) {
    PYTFM_TRY(pytfm__check_attention_sizes(func, "T", B, T, H, D));
    PYTFM_CHECK_FINITE_IN(func, scale);
    const int64_t vectors = B * T * H;
    PYTFM_CHECK_PTR_IN(func, dq, vectors);
    PYTFM_CHECK_PTR_IN(func, dk, vectors);
    PYTFM_CHECK_PTR_IN(func, dv, vectors);
    PYTFM_CHECK_PTR_IN(func, dy, vectors);
    PYTFM_CHECK_PTR_IN(func, q, vectors);
    PYTFM_CHECK_PTR_IN(func, k, vectors);
    PYTFM_CHECK_PTR_IN(func, v, vectors);
    PYTFM_CHECK_PTR_IN(func, o, vectors);
    PYTFM_CHECK_PTR_IN(func, lse, vectors);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_attention_cache_append(const char *func,
                                                               const float *k_cache,
                                                               const float *v_cache,
                                                               const float *k, const float *v,
                                                               int64_t B, int64_t n_new,
                                                               int64_t H, int64_t D,
                                                               int64_t Tmax, int64_t start) {
    PYTFM_TRY(pytfm__check_attention_sizes(func, "n_new", B, n_new, H, D));
    PYTFM_TRY(pytfm__check_cache_positions(func, n_new, Tmax, start));
    PYTFM_CHECK_PTR_IN(func, k_cache, B * H);
    PYTFM_CHECK_PTR_IN(func, v_cache, B * H);
    PYTFM_CHECK_PTR_IN(func, k, B * n_new * H);
    PYTFM_CHECK_PTR_IN(func, v, B * n_new * H);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status
pytfm__check_attention_decode(const char *func, const float *o, const float *lse, const float *q,
                              const float *k_cache, const float *v_cache, int64_t B,
                              int64_t n_new, int64_t H, int64_t D, int64_t Tmax, int64_t start,
                              float scale) {
    PYTFM_TRY(pytfm__check_attention_sizes(func, "n_new", B, n_new, H, D));
    PYTFM_TRY(pytfm__check_cache_positions(func, n_new, Tmax, start));
    PYTFM_CHECK_FINITE_IN(func, scale);
    const int64_t vectors = B * n_new * H;
    PYTFM_CHECK_PTR_IN(func, o, vectors);
    PYTFM_CHECK_PTR_IN(func, lse, vectors);
    PYTFM_CHECK_PTR_IN(func, q, vectors);
    PYTFM_CHECK_PTR_IN(func, k_cache, B * H);
    PYTFM_CHECK_PTR_IN(func, v_cache, B * H);
    return PYTFM_STATUS_OK;
}

#endif /* PYTFM_CHECKS_H */
