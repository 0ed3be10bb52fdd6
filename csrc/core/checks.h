/*
 * checks.h — the argument checks of each op direction, shared by its C kernel (csrc/) and its
 * CUDA twin (cuda/), so that both reject the same arguments with the same message. Each takes
 * the public function's name (func, for the message) and its arguments, under their public
 * names, and returns the first failure. Index arrays are checked only by the C kernels
 * (pytfm__check_indices): on the GPU they live in device memory.
 *
 * Every check goes in the same order, and none reads or writes through a pointer:
 *   1. scalar options and the sign of each size;
 *   2. the element count of every array, a product of sizes checked for overflow
 *      (PYTFM_CHECK_COUNT): an array whose byte count would not fit in a ptrdiff_t is an
 *      INVALID_ARGUMENT naming the sizes, so no kernel ever forms a product that wraps;
 *   3. NULL pointers (allowed for arrays of no elements);
 *   4. overlaps (PYTFM_CHECK_DISJOINT): what a call writes or accumulates into must not share
 *      memory with any other buffer of the call, except the exact in-place forms pytfm.h
 *      allows (GELU's and RoPE's output may be their input).
 */
#ifndef PYTFM_CHECKS_H
#define PYTFM_CHECKS_H

#include <stdio.h>

#include "internal.h"

/* ---- the shared steps ---------------------------------------------------------------------- */

/* *count = the product of sizes[0..n) (each >= 0, checked before): the elements of an array
 * of elem_bytes-byte elements; INVALID_ARGUMENT, naming func and the sizes (names, as
 * "rows, cols"), when the array's byte count would not fit in a ptrdiff_t. */
static inline pytfm_status pytfm__check_count(const char *func, const char *names,
                                              size_t elem_bytes, const int64_t *sizes, int n,
                                              int64_t *count) {
    const int64_t limit = pytfm__max_elems(elem_bytes);
    int64_t c = 1;
    for (int i = 0; i < n; i++) {
        if (pytfm__mul_within(c, sizes[i], limit, &c)) continue;
        char values[128] = "";
        for (int j = 0, len = 0; j < n && len < (int)sizeof values; j++)
            len += snprintf(values + len, sizeof values - (size_t)len, "%s%lld", j ? ", " : "",
                            (long long)sizes[j]);
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: %s = %s is too large: an array of that many %zu-byte elements "
                           "would pass PTRDIFF_MAX bytes (at most %lld elements)",
                           func, names, values, elem_bytes, (long long)limit);
    }
    *count = c;
    return PYTFM_STATUS_OK;
}

/* *count = the product of the sizes after `type`: the element count of an array of type,
 * checked by pytfm__check_count, whose message names the sizes as written here:
 *   PYTFM_CHECK_COUNT(func, &n_x, float, rows, cols);   (message: "rows, cols = ...") */
#define PYTFM_CHECK_COUNT(func, count, type, ...)                                              \
    do {                                                                                       \
        const int64_t sizes_[] = {__VA_ARGS__};                                                \
        PYTFM_TRY(pytfm__check_count(func, #__VA_ARGS__, sizeof(type), sizes_,                 \
                                     (int)(sizeof sizes_ / sizeof sizes_[0]), count));          \
    } while (0)

/* The buffer p of count elements of type, under its own name, for PYTFM_CHECK_DISJOINT */
#define PYTFM_SPAN(p, count, type) {#p, (const void *)(p), (int64_t)(count) * (int64_t)sizeof(type)}

/* spans[0..outputs) are written (or accumulated into) by the call, the others only read: no
 * output may share a byte with another buffer of the call (two inputs may), except that the
 * output spans[same_out] may be the very same buffer as the input spans[same_in] (the op's
 * in-place form; -1, -1: it has none). Else INVALID_ARGUMENT: "<func>: a and b must not share
 * memory", a the first output that overlaps, b the first buffer after it that it overlaps. */
static inline pytfm_status pytfm__check_disjoint(const char *func, const pytfm__span *spans,
                                                 int count, int outputs, int same_out,
                                                 int same_in) {
    for (int i = 0; i < outputs; i++)
        for (int j = i + 1; j < count; j++) {
            if (!pytfm__overlap(spans[i], spans[j])) continue;
            const int pair = i == same_out && j == same_in;
            if (pair && spans[i].p == spans[j].p && spans[i].bytes == spans[j].bytes) continue;
            return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                               pair ? "%s: %s and %s must be the same buffer or not share memory"
                                    : "%s: %s and %s must not share memory",
                               func, spans[i].name, spans[j].name);
        }
    return PYTFM_STATUS_OK;
}

/* PYTFM_CHECK_DISJOINT(func, outputs, same_out, same_in, PYTFM_SPAN(...), ...): the outputs
 * first, as pytfm__check_disjoint takes them */
#define PYTFM_CHECK_DISJOINT(func, outputs, same_out, same_in, ...)                            \
    do {                                                                                       \
        const pytfm__span spans_[] = {__VA_ARGS__};                                            \
        PYTFM_TRY(pytfm__check_disjoint(func, spans_,                                          \
                                        (int)(sizeof spans_ / sizeof spans_[0]), outputs,      \
                                        same_out, same_in));                                   \
    } while (0)

enum { PYTFM_NO_INPLACE = -1 };

/* ---- the precision of a product ------------------------------------------------------------ */

/* a scalar option of the functions with a precision argument (the _ex ones) */
static inline pytfm_status pytfm__check_precision(const char *func, int32_t precision) {
    PYTFM_CHECK(precision != PYTFM_PRECISION_INT8,
                "%s: precision PYTFM_PRECISION_INT8 (3) is a model's (pytfm_model_set_precision), "
                "not a product's: a product on int8 weights is pytfm_linear_forward_q8w, on "
                "weights pytfm_quantize_q8 made; use 0: FP32 or 1: BF16 here",
                func);
    PYTFM_CHECK(precision == PYTFM_PRECISION_FP32 || precision == PYTFM_PRECISION_BF16,
                "%s: precision must be a pytfm_precision (0: FP32, 1: BF16), got %d", func,
                (int)precision);
    return PYTFM_STATUS_OK;
}

/* the same for the CUDA twins (cuda/), which also compute in TF32 on the tensor cores (and
 * have no int8 products) */
static inline pytfm_status pytfm__check_precision_cuda(const char *func, int32_t precision) {
    PYTFM_CHECK(precision != PYTFM_PRECISION_INT8,
                "%s: precision PYTFM_PRECISION_INT8 (3) runs on the CPU only (int8 weights, "
                "pytfm_linear_forward_q8w); use 0: FP32, 1: BF16 or 2: TF32 on the GPU",
                func);
    PYTFM_CHECK(precision == PYTFM_PRECISION_FP32 || precision == PYTFM_PRECISION_BF16 ||
                    precision == PYTFM_PRECISION_TF32,
                "%s: precision must be a pytfm_precision (0: FP32, 1: BF16, 2: TF32), got %d",
                func, (int)precision);
    return PYTFM_STATUS_OK;
}

/* an elementwise map y = f(x): y [count] written, x [count]; y may be x itself, but no other
 * overlap */
static inline pytfm_status pytfm__check_map(const char *func, const float *y, const float *x,
                                            int64_t count) {
    PYTFM_CHECK_MIN_IN(func, count, 0);
    int64_t n = 0;
    PYTFM_CHECK_COUNT(func, &n, float, count);
    PYTFM_CHECK_PTR_IN(func, y, n);
    PYTFM_CHECK_PTR_IN(func, x, n);
    PYTFM_CHECK_DISJOINT(func, 1, 0, 1, PYTFM_SPAN(y, n, float), PYTFM_SPAN(x, n, float));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_round_bf16(const char *func, const float *y,
                                                   const float *x, int64_t count) {
    return pytfm__check_map(func, y, x, count);
}

/* ---- sgemm -------------------------------------------------------------------------------- */

static inline pytfm_status pytfm__check_sgemm(const char *func, const float *c, const float *a,
                                              const float *b, int64_t m, int64_t n, int64_t k,
                                              float beta) {
    PYTFM_CHECK(m >= 0 && n >= 0 && k >= 0, "%s: m, n, k must be >= 0, got %lld, %lld, %lld",
                func, (long long)m, (long long)n, (long long)k);
    PYTFM_CHECK(isfinite(beta), "%s: beta must be finite, got %g", func, (double)beta);
    int64_t n_c = 0, n_a = 0, n_b = 0;
    PYTFM_CHECK_COUNT(func, &n_c, float, m, n);
    PYTFM_CHECK_COUNT(func, &n_a, float, m, k);
    PYTFM_CHECK_COUNT(func, &n_b, float, k, n);
    PYTFM_CHECK_PTR_IN(func, c, n_c);
    PYTFM_CHECK_PTR_IN(func, a, n_a);
    PYTFM_CHECK_PTR_IN(func, b, n_b);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(c, n_c, float),
                         PYTFM_SPAN(a, n_a, float), PYTFM_SPAN(b, n_b, float));
    return PYTFM_STATUS_OK;
}

/* ---- the linear layer --------------------------------------------------------------------- */

/* its arrays' element counts: x, dx [rows, in], y, dy [rows, out], w, dw [out, in] */
typedef struct pytfm__linear_counts {
    int64_t x, y, w;
} pytfm__linear_counts;

static inline pytfm_status pytfm__check_linear_sizes(const char *func, int64_t rows, int64_t in,
                                                     int64_t out, pytfm__linear_counts *n) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, in, 1);
    PYTFM_CHECK_MIN_IN(func, out, 1);
    PYTFM_CHECK_COUNT(func, &n->x, float, rows, in);
    PYTFM_CHECK_COUNT(func, &n->y, float, rows, out);
    PYTFM_CHECK_COUNT(func, &n->w, float, out, in);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_linear_forward(const char *func, const float *y,
                                                       const float *x, const float *w,
                                                       const float *b, int64_t rows, int64_t in,
                                                       int64_t out) {
    pytfm__linear_counts n = {0, 0, 0};
    PYTFM_TRY(pytfm__check_linear_sizes(func, rows, in, out, &n));
    PYTFM_CHECK_PTR_IN(func, y, n.y);
    PYTFM_CHECK_PTR_IN(func, x, n.x);
    PYTFM_CHECK_PTR_IN(func, w, n.w);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n.y, float),
                         PYTFM_SPAN(x, n.x, float), PYTFM_SPAN(w, n.w, float),
                         PYTFM_SPAN(b, out, float));
    return PYTFM_STATUS_OK;
}

/* W given as BF16 only: w16 [out, in] of 2-byte values, counted as such */
static inline pytfm_status pytfm__check_linear_forward_bf16w(const char *func, const float *y,
                                                             const float *x,
                                                             const uint16_t *w16,
                                                             const float *b, int64_t rows,
                                                             int64_t in, int64_t out) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, in, 1);
    PYTFM_CHECK_MIN_IN(func, out, 1);
    int64_t n_x = 0, n_y = 0, n_w = 0;
    PYTFM_CHECK_COUNT(func, &n_x, float, rows, in);
    PYTFM_CHECK_COUNT(func, &n_y, float, rows, out);
    PYTFM_CHECK_COUNT(func, &n_w, uint16_t, out, in);
    PYTFM_CHECK_PTR_IN(func, y, n_y);
    PYTFM_CHECK_PTR_IN(func, x, n_x);
    PYTFM_CHECK_PTR_IN(func, w16, n_w);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n_y, float),
                         PYTFM_SPAN(x, n_x, float), PYTFM_SPAN(w16, n_w, uint16_t),
                         PYTFM_SPAN(b, out, float));
    return PYTFM_STATUS_OK;
}

/* y (the GELU) and h (the pre-activation) are both outputs */
static inline pytfm_status pytfm__check_linear_gelu_forward(const char *func, const float *y,
                                                            const float *h, const float *x,
                                                            const float *w, const float *b,
                                                            int64_t rows, int64_t in,
                                                            int64_t out) {
    pytfm__linear_counts n = {0, 0, 0};
    PYTFM_TRY(pytfm__check_linear_sizes(func, rows, in, out, &n));
    PYTFM_CHECK_PTR_IN(func, y, n.y);
    PYTFM_CHECK_PTR_IN(func, h, n.y);
    PYTFM_CHECK_PTR_IN(func, x, n.x);
    PYTFM_CHECK_PTR_IN(func, w, n.w);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n.y, float),
                         PYTFM_SPAN(h, n.y, float), PYTFM_SPAN(x, n.x, float),
                         PYTFM_SPAN(w, n.w, float), PYTFM_SPAN(b, out, float));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_linear_backward(const char *func, const float *dx,
                                                        const float *dw, const float *db,
                                                        const float *dy, const float *x,
                                                        const float *w, int64_t rows, int64_t in,
                                                        int64_t out) {
    pytfm__linear_counts n = {0, 0, 0};
    PYTFM_TRY(pytfm__check_linear_sizes(func, rows, in, out, &n));
    PYTFM_CHECK_PTR_IN(func, dw, n.w);
    PYTFM_CHECK_PTR_IN(func, dy, n.y);
    PYTFM_CHECK_PTR_IN(func, x, n.x);
    PYTFM_CHECK_PTR_IN(func, w, dx ? n.w : 0);
    PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dx, n.x, float),
                         PYTFM_SPAN(dw, n.w, float), PYTFM_SPAN(db, out, float),
                         PYTFM_SPAN(dy, n.y, float), PYTFM_SPAN(x, n.x, float),
                         PYTFM_SPAN(w, n.w, float));
    return PYTFM_STATUS_OK;
}

/* ---- softmax ------------------------------------------------------------------------------ */

/* softmax and LayerNorm: *count = rows·cols */
static inline pytfm_status pytfm__check_rows_cols(const char *func, int64_t rows, int64_t cols,
                                                  int64_t *count) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, cols, 1);
    PYTFM_CHECK_COUNT(func, count, float, rows, cols);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_softmax_forward(const char *func, const float *y,
                                                        const float *x, int64_t rows,
                                                        int64_t cols) {
    int64_t n = 0;
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols, &n));
    PYTFM_CHECK_PTR_IN(func, y, n);
    PYTFM_CHECK_PTR_IN(func, x, n);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n, float),
                         PYTFM_SPAN(x, n, float));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_softmax_backward(const char *func, const float *dx,
                                                         const float *dy, const float *y,
                                                         int64_t rows, int64_t cols) {
    int64_t n = 0;
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols, &n));
    PYTFM_CHECK_PTR_IN(func, dx, n);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, y, n);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dx, n, float),
                         PYTFM_SPAN(dy, n, float), PYTFM_SPAN(y, n, float));
    return PYTFM_STATUS_OK;
}

/* ---- LayerNorm ---------------------------------------------------------------------------- */

static inline pytfm_status pytfm__check_layernorm_forward(const char *func, const float *y,
                                                          const float *mean, const float *rstd,
                                                          const float *x, const float *w,
                                                          const float *b, int64_t rows,
                                                          int64_t cols, float eps) {
    int64_t n = 0;
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols, &n));
    PYTFM_CHECK_FINITE_IN(func, eps);
    PYTFM_CHECK(eps >= 0.0f, "%s: eps must be >= 0, got %g", func, (double)eps);
    PYTFM_CHECK_PTR_IN(func, y, n);
    PYTFM_CHECK_PTR_IN(func, mean, rows);
    PYTFM_CHECK_PTR_IN(func, rstd, rows);
    PYTFM_CHECK_PTR_IN(func, x, n);
    PYTFM_CHECK_PTR_IN(func, w, cols);
    PYTFM_CHECK_PTR_IN(func, b, cols);
    PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n, float),
                         PYTFM_SPAN(mean, rows, float), PYTFM_SPAN(rstd, rows, float),
                         PYTFM_SPAN(x, n, float), PYTFM_SPAN(w, cols, float),
                         PYTFM_SPAN(b, cols, float));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status
pytfm__check_layernorm_backward(const char *func, const float *dx, const float *dw,
                                const float *db, const float *dy, const float *x, const float *w,
                                const float *mean, const float *rstd, int64_t rows, int64_t cols) {
    int64_t n = 0;
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols, &n));
    PYTFM_CHECK_PTR_IN(func, dx, n);
    PYTFM_CHECK_PTR_IN(func, dw, cols);
    PYTFM_CHECK_PTR_IN(func, db, cols);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, x, n);
    PYTFM_CHECK_PTR_IN(func, w, cols);
    PYTFM_CHECK_PTR_IN(func, mean, rows);
    PYTFM_CHECK_PTR_IN(func, rstd, rows);
    PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dx, n, float),
                         PYTFM_SPAN(dw, cols, float), PYTFM_SPAN(db, cols, float),
                         PYTFM_SPAN(dy, n, float), PYTFM_SPAN(x, n, float),
                         PYTFM_SPAN(w, cols, float), PYTFM_SPAN(mean, rows, float),
                         PYTFM_SPAN(rstd, rows, float));
    return PYTFM_STATUS_OK;
}

/* ---- RoPE --------------------------------------------------------------------------------- */

/* out, in: y, x (forward) or dx, dy (backward) [B, T, H, D]; out may be in itself */
/* RoPE's positions pos[b·pos_stride + t] (b < B, t < T): their count, (B − 1)·pos_stride + T,
 * in *n_pos; its base; D even */
static inline pytfm_status pytfm__check_positions(const char *func, int64_t B, int64_t T,
                                                  int64_t D, int64_t pos_stride, double base,
                                                  int64_t *n_pos) {
    PYTFM_CHECK(D >= 2 && D % 2 == 0, "%s: D must be even and >= 2, got %lld", func,
                (long long)D);
    PYTFM_CHECK(pos_stride >= 0, "%s: pos_stride must be >= 0, got %lld", func,
                (long long)pos_stride);
    PYTFM_CHECK(isfinite(base) && base > 0.0, "%s: base must be finite and > 0, got %g", func,
                base);
    *n_pos = 0;
    if (B > 0 && T > 0) {
        const int64_t limit = pytfm__max_elems(sizeof(int64_t));
        PYTFM_CHECK(pytfm__mul_within(B - 1, pos_stride, limit, n_pos) &&
                        pytfm__add_within(*n_pos, T, limit, n_pos),
                    "%s: pos_stride = %lld is too large for B = %lld, T = %lld: the positions "
                    "(B − 1)·pos_stride + T would pass PTRDIFF_MAX bytes",
                    func, (long long)pos_stride, (long long)B, (long long)T);
    }
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_rope(const char *func, const float *out, const float *in,
                                             const int64_t *pos, int64_t B, int64_t T, int64_t H,
                                             int64_t D, int64_t pos_stride, double base) {
    PYTFM_CHECK(B >= 0 && T >= 0 && H >= 0, "%s: B, T, H must be >= 0, got %lld, %lld, %lld",
                func, (long long)B, (long long)T, (long long)H);
    int64_t n = 0, n_pos = 0;
    PYTFM_TRY(pytfm__check_positions(func, B, T, D, pos_stride, base, &n_pos));
    PYTFM_CHECK_COUNT(func, &n, float, B, T, H, D);
    PYTFM_CHECK(out != NULL || n == 0, "%s: output must not be NULL", func);
    PYTFM_CHECK(in != NULL || n == 0, "%s: input must not be NULL", func);
    PYTFM_CHECK(pos != NULL || n_pos == 0, "%s: pos must not be NULL", func);
    const pytfm__span output = {"output", out, n * (int64_t)sizeof(float)};
    const pytfm__span input = {"input", in, n * (int64_t)sizeof(float)};
    PYTFM_CHECK_DISJOINT(func, 1, 0, 1, output, input, PYTFM_SPAN(pos, n_pos, int64_t));
    return PYTFM_STATUS_OK;
}

/* The split of a fused QKV projection (rope.c): parts q, k, v (or dq, dk, dv) [B, T, H, D],
 * fused qkv (or dqkv) [B, T, 3, H, D]; forward writes the parts, backward the fused array. The
 * sizes and positions follow RoPE's rules (D even only when rope is on). */
static inline pytfm_status pytfm__check_qkv_split(const char *func, const float *q,
                                                  const float *k, const float *v,
                                                  const float *qkv, const int64_t *pos,
                                                  int64_t B, int64_t T, int64_t H, int64_t D,
                                                  int64_t pos_stride, double base, int32_t rope,
                                                  int backward) {
    PYTFM_CHECK(B >= 0 && T >= 0 && H >= 0 && D >= 1,
                "%s: B, T, H must be >= 0 and D >= 1, got %lld, %lld, %lld, %lld", func,
                (long long)B, (long long)T, (long long)H, (long long)D);
    int64_t n = 0, n3 = 0, n_pos = 0;
    if (rope) PYTFM_TRY(pytfm__check_positions(func, B, T, D, pos_stride, base, &n_pos));
    PYTFM_CHECK_COUNT(func, &n3, float, B, T, 3, H, D);
    n = n3 / 3;
    PYTFM_CHECK(pos != NULL || n_pos == 0, "%s: pos must not be NULL", func);
    const char *part = backward ? "dq, dk, dv" : "q, k, v", *fused = backward ? "dqkv" : "qkv";
    PYTFM_CHECK((q != NULL && k != NULL && v != NULL) || n == 0, "%s: %s must not be NULL", func,
                part);
    PYTFM_CHECK(qkv != NULL || n == 0, "%s: %s must not be NULL", func, fused);
    if (backward) {
        PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,
                             PYTFM_SPAN(qkv, n3, float), PYTFM_SPAN(q, n, float),
                             PYTFM_SPAN(k, n, float), PYTFM_SPAN(v, n, float),
                             PYTFM_SPAN(pos, n_pos, int64_t));
    } else {
        PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,
                             PYTFM_SPAN(q, n, float), PYTFM_SPAN(k, n, float),
                             PYTFM_SPAN(v, n, float), PYTFM_SPAN(qkv, n3, float),
                             PYTFM_SPAN(pos, n_pos, int64_t));
    }
    return PYTFM_STATUS_OK;
}

/* ---- the sum of squares ----------------------------------------------------------------- */

/* out: one double (written); x [count] */
static inline pytfm_status pytfm__check_sum_squares(const char *func, const double *out,
                                                    const float *x, int64_t count) {
    PYTFM_CHECK_MIN_IN(func, count, 0);
    int64_t n = 0;
    PYTFM_CHECK_COUNT(func, &n, float, count);
    PYTFM_CHECK_PTR_IN(func, out, 1);
    PYTFM_CHECK_PTR_IN(func, x, n);
    return PYTFM_STATUS_OK;
}

/* ---- GELU --------------------------------------------------------------------------------- */

static inline pytfm_status pytfm__check_gelu_forward(const char *func, const float *y,
                                                     const float *x, int64_t count) {
    return pytfm__check_map(func, y, x, count);
}

/* dx may be dy itself */
static inline pytfm_status pytfm__check_gelu_backward(const char *func, const float *dx,
                                                      const float *dy, const float *x,
                                                      int64_t count) {
    PYTFM_CHECK_MIN_IN(func, count, 0);
    int64_t n = 0;
    PYTFM_CHECK_COUNT(func, &n, float, count);
    PYTFM_CHECK_PTR_IN(func, dx, n);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, x, n);
    PYTFM_CHECK_DISJOINT(func, 1, 0, 1, PYTFM_SPAN(dx, n, float), PYTFM_SPAN(dy, n, float),
                         PYTFM_SPAN(x, n, float));
    return PYTFM_STATUS_OK;
}

/* ---- RMSNorm, SwiGLU, RoPE from a table of frequencies (the Llama family) ----------------- */

static inline pytfm_status pytfm__check_rmsnorm_forward(const char *func, const float *y,
                                                        const float *rstd, const float *x,
                                                        const float *w, int64_t rows,
                                                        int64_t cols, float eps) {
    int64_t n = 0;
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols, &n));
    PYTFM_CHECK_FINITE_IN(func, eps);
    PYTFM_CHECK(eps >= 0.0f, "%s: eps must be >= 0, got %g", func, (double)eps);
    PYTFM_CHECK_PTR_IN(func, y, n);
    PYTFM_CHECK_PTR_IN(func, rstd, rows);
    PYTFM_CHECK_PTR_IN(func, x, n);
    PYTFM_CHECK_PTR_IN(func, w, cols);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n, float),
                         PYTFM_SPAN(rstd, rows, float), PYTFM_SPAN(x, n, float),
                         PYTFM_SPAN(w, cols, float));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_rmsnorm_backward(const char *func, const float *dx,
                                                         const float *dw, const float *dy,
                                                         const float *x, const float *w,
                                                         const float *rstd, int64_t rows,
                                                         int64_t cols) {
    int64_t n = 0;
    PYTFM_TRY(pytfm__check_rows_cols(func, rows, cols, &n));
    PYTFM_CHECK_PTR_IN(func, dx, n);
    PYTFM_CHECK_PTR_IN(func, dw, cols);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, x, n);
    PYTFM_CHECK_PTR_IN(func, w, cols);
    PYTFM_CHECK_PTR_IN(func, rstd, rows);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dx, n, float),
                         PYTFM_SPAN(dw, cols, float), PYTFM_SPAN(dy, n, float),
                         PYTFM_SPAN(x, n, float), PYTFM_SPAN(w, cols, float),
                         PYTFM_SPAN(rstd, rows, float));
    return PYTFM_STATUS_OK;
}

/* h [count] written; g, u [count]; no in-place form */
static inline pytfm_status pytfm__check_swiglu_forward(const char *func, const float *h,
                                                       const float *g, const float *u,
                                                       int64_t count) {
    PYTFM_CHECK_MIN_IN(func, count, 0);
    int64_t n = 0;
    PYTFM_CHECK_COUNT(func, &n, float, count);
    PYTFM_CHECK_PTR_IN(func, h, n);
    PYTFM_CHECK_PTR_IN(func, g, n);
    PYTFM_CHECK_PTR_IN(func, u, n);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(h, n, float),
                         PYTFM_SPAN(g, n, float), PYTFM_SPAN(u, n, float));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_swiglu_backward(const char *func, const float *dg,
                                                        const float *du, const float *dh,
                                                        const float *g, const float *u,
                                                        int64_t count) {
    PYTFM_CHECK_MIN_IN(func, count, 0);
    int64_t n = 0;
    PYTFM_CHECK_COUNT(func, &n, float, count);
    PYTFM_CHECK_PTR_IN(func, dg, n);
    PYTFM_CHECK_PTR_IN(func, du, n);
    PYTFM_CHECK_PTR_IN(func, dh, n);
    PYTFM_CHECK_PTR_IN(func, g, n);
    PYTFM_CHECK_PTR_IN(func, u, n);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dg, n, float),
                         PYTFM_SPAN(du, n, float), PYTFM_SPAN(dh, n, float),
                         PYTFM_SPAN(g, n, float), PYTFM_SPAN(u, n, float));
    return PYTFM_STATUS_OK;
}

/* RoPE from a table: out, in [B, T, H, D] (out may be in itself), pos as RoPE's, inv_freq
 * [D/2] (its values are not read here: any float is a frequency) */
static inline pytfm_status pytfm__check_rope_freq(const char *func, const float *out,
                                                  const float *in, const int64_t *pos,
                                                  const float *inv_freq, int64_t B, int64_t T,
                                                  int64_t H, int64_t D, int64_t pos_stride) {
    PYTFM_TRY(pytfm__check_rope(func, out, in, pos, B, T, H, D, pos_stride, 1.0));
    PYTFM_CHECK_PTR_IN(func, inv_freq, D / 2);
    const int64_t n = B * T * H * D; // checked by pytfm__check_rope
    const pytfm__span output = {"output", out, n * (int64_t)sizeof(float)};
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, output,
                         PYTFM_SPAN(inv_freq, D / 2, float));
    return PYTFM_STATUS_OK;
}

/* pytfm_rope_inv_freq's arguments */
static inline pytfm_status pytfm__check_rope_inv_freq(const char *func, const float *inv_freq,
                                                      int64_t D, double theta, int32_t scaling,
                                                      double factor, double low_freq_factor,
                                                      double high_freq_factor,
                                                      double original_max_pos) {
    PYTFM_CHECK(D >= 2 && D % 2 == 0, "%s: D must be even and >= 2, got %lld", func,
                (long long)D);
    PYTFM_CHECK(isfinite(theta) && theta > 0.0, "%s: theta must be finite and > 0, got %g",
                func, theta);
    PYTFM_CHECK(scaling == PYTFM_ROPE_SCALING_NONE || scaling == PYTFM_ROPE_SCALING_LLAMA3,
                "%s: scaling must be a pytfm_rope_scaling (0: none, 1: llama3), got %d", func,
                (int)scaling);
    if (scaling == PYTFM_ROPE_SCALING_LLAMA3) {
        PYTFM_CHECK(isfinite(factor) && factor > 0.0, "%s: factor must be finite and > 0, got %g",
                    func, factor);
        PYTFM_CHECK(isfinite(low_freq_factor) && low_freq_factor > 0.0,
                    "%s: low_freq_factor must be finite and > 0, got %g", func, low_freq_factor);
        PYTFM_CHECK(isfinite(high_freq_factor) && high_freq_factor > low_freq_factor,
                    "%s: high_freq_factor must be finite and > low_freq_factor = %g, got %g",
                    func, low_freq_factor, high_freq_factor);
        PYTFM_CHECK(isfinite(original_max_pos) && original_max_pos > 0.0,
                    "%s: original_max_pos must be finite and > 0, got %g", func,
                    original_max_pos);
    }
    int64_t n = 0;
    PYTFM_CHECK_COUNT(func, &n, float, D / 2);
    PYTFM_CHECK_PTR_IN(func, inv_freq, n);
    return PYTFM_STATUS_OK;
}

/* ---- embedding ---------------------------------------------------------------------------- */

/* y, dy [rows, dim], table [vocab, dim] (element counts), ids [rows] */
static inline pytfm_status pytfm__check_embedding_sizes(const char *func, int64_t rows,
                                                        int64_t vocab, int64_t dim,
                                                        int64_t *n_y, int64_t *n_table) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, vocab, 1);
    PYTFM_CHECK_MIN_IN(func, dim, 1);
    PYTFM_CHECK_COUNT(func, n_y, float, rows, dim);
    PYTFM_CHECK_COUNT(func, n_table, float, vocab, dim);
    int64_t n_ids = 0;
    PYTFM_CHECK_COUNT(func, &n_ids, int64_t, rows);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_embedding_forward(const char *func, const float *y,
                                                          const int64_t *ids,
                                                          const float *table, int64_t rows,
                                                          int64_t vocab, int64_t dim) {
    int64_t n_y = 0, n_table = 0;
    PYTFM_TRY(pytfm__check_embedding_sizes(func, rows, vocab, dim, &n_y, &n_table));
    PYTFM_CHECK_PTR_IN(func, y, n_y);
    PYTFM_CHECK_PTR_IN(func, ids, rows);
    PYTFM_CHECK_PTR_IN(func, table, n_table);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n_y, float),
                         PYTFM_SPAN(ids, rows, int64_t), PYTFM_SPAN(table, n_table, float));
    return PYTFM_STATUS_OK;
}

/* the table given in BF16: table [vocab, dim] of 2-byte values, counted as such */
static inline pytfm_status pytfm__check_embedding_forward_bf16w(const char *func, const float *y,
                                                                const int64_t *ids,
                                                                const uint16_t *table,
                                                                int64_t rows, int64_t vocab,
                                                                int64_t dim) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, vocab, 1);
    PYTFM_CHECK_MIN_IN(func, dim, 1);
    int64_t n_y = 0, n_table = 0, n_ids = 0;
    PYTFM_CHECK_COUNT(func, &n_y, float, rows, dim);
    PYTFM_CHECK_COUNT(func, &n_table, uint16_t, vocab, dim);
    PYTFM_CHECK_COUNT(func, &n_ids, int64_t, rows);
    PYTFM_CHECK_PTR_IN(func, y, n_y);
    PYTFM_CHECK_PTR_IN(func, ids, rows);
    PYTFM_CHECK_PTR_IN(func, table, n_table);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n_y, float),
                         PYTFM_SPAN(ids, rows, int64_t), PYTFM_SPAN(table, n_table, uint16_t));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_embedding_backward(const char *func, const float *dtable,
                                                           const float *dy, const int64_t *ids,
                                                           int64_t rows, int64_t vocab,
                                                           int64_t dim) {
    int64_t n_dy = 0, n_table = 0;
    PYTFM_TRY(pytfm__check_embedding_sizes(func, rows, vocab, dim, &n_dy, &n_table));
    PYTFM_CHECK_PTR_IN(func, dtable, n_table);
    PYTFM_CHECK_PTR_IN(func, dy, n_dy);
    PYTFM_CHECK_PTR_IN(func, ids, rows);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,
                         PYTFM_SPAN(dtable, n_table, float), PYTFM_SPAN(dy, n_dy, float),
                         PYTFM_SPAN(ids, rows, int64_t));
    return PYTFM_STATUS_OK;
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

/* logits [rows, vocab] (its element count), targets and lse [rows] */
static inline pytfm_status pytfm__check_cross_entropy_sizes(const char *func, int64_t rows,
                                                            int64_t vocab, int64_t *n_logits) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, vocab, 1);
    PYTFM_CHECK_COUNT(func, n_logits, float, rows, vocab);
    int64_t n_targets = 0;
    PYTFM_CHECK_COUNT(func, &n_targets, int64_t, rows);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_cross_entropy_forward(const char *func, const float *loss,
                                                              const float *lse,
                                                              const float *logits,
                                                              const int64_t *targets,
                                                              int64_t rows, int64_t vocab) {
    int64_t n = 0;
    PYTFM_TRY(pytfm__check_cross_entropy_sizes(func, rows, vocab, &n));
    PYTFM_CHECK_PTR_IN(func, loss, 1);
    PYTFM_CHECK_PTR_IN(func, lse, rows);
    PYTFM_CHECK_PTR_IN(func, logits, n);
    PYTFM_CHECK_PTR_IN(func, targets, rows);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(loss, 1, float),
                         PYTFM_SPAN(lse, rows, float), PYTFM_SPAN(logits, n, float),
                         PYTFM_SPAN(targets, rows, int64_t));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status
pytfm__check_cross_entropy_backward(const char *func, const float *dlogits, const float *logits,
                                    const int64_t *targets, const float *lse, int64_t rows,
                                    int64_t vocab, float dloss) {
    int64_t n = 0;
    PYTFM_TRY(pytfm__check_cross_entropy_sizes(func, rows, vocab, &n));
    PYTFM_CHECK_FINITE_IN(func, dloss);
    PYTFM_CHECK_PTR_IN(func, dlogits, n);
    PYTFM_CHECK_PTR_IN(func, logits, n);
    PYTFM_CHECK_PTR_IN(func, targets, rows);
    PYTFM_CHECK_PTR_IN(func, lse, rows);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,
                         PYTFM_SPAN(dlogits, n, float), PYTFM_SPAN(logits, n, float),
                         PYTFM_SPAN(targets, rows, int64_t), PYTFM_SPAN(lse, rows, float));
    return PYTFM_STATUS_OK;
}

/* label smoothing ε: the share of the target spread over every class, a probability */
static inline pytfm_status pytfm__check_label_smoothing(const char *func, float label_smoothing) {
    PYTFM_CHECK(isfinite(label_smoothing) && label_smoothing >= 0.0f && label_smoothing <= 1.0f,
                "%s: label_smoothing must be finite and in [0, 1], got %g", func,
                (double)label_smoothing);
    return PYTFM_STATUS_OK;
}

/* ---- AdamW -------------------------------------------------------------------------------- */

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
    int64_t n = 0;
    PYTFM_CHECK_COUNT(func, &n, float, count);
    PYTFM_CHECK_PTR_IN(func, param, n);
    PYTFM_CHECK_PTR_IN(func, m, n);
    PYTFM_CHECK_PTR_IN(func, v, n);
    PYTFM_CHECK_PTR_IN(func, grad, n);
    PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(param, n, float),
                         PYTFM_SPAN(m, n, float), PYTFM_SPAN(v, n, float),
                         PYTFM_SPAN(grad, n, float));
    return PYTFM_STATUS_OK;
}

/* ---- attention ---------------------------------------------------------------------------- */

/* the signs of attention's sizes (T: n_new for the decoding functions, named so) */
static inline pytfm_status pytfm__check_attention_signs(const char *func, const char *t_name,
                                                        int64_t B, int64_t T, int64_t H,
                                                        int64_t D) {
    PYTFM_CHECK(B >= 0 && T >= 0 && H >= 0, "%s: B, %s, H must be >= 0, got %lld, %lld, %lld",
                func, t_name, (long long)B, (long long)T, (long long)H);
    PYTFM_CHECK(D >= 1, "%s: D must be >= 1, got %lld", func, (long long)D);
    return PYTFM_STATUS_OK;
}

/* the key/value heads Hkv of H query heads (grouped-query attention: Hkv divides H; Hkv = 0
 * only with H = 0) and the sliding window (>= 0, 0 = none; a window needs causal) */
static inline pytfm_status pytfm__check_attention_groups(const char *func, int64_t H,
                                                         int64_t Hkv, int64_t window,
                                                         int32_t causal) {
    PYTFM_CHECK((H == 0 && Hkv == 0) || (Hkv >= 1 && Hkv <= H && H % Hkv == 0),
                "%s: Hkv must divide H (1 <= Hkv <= H, H %% Hkv == 0), got H = %lld, Hkv = %lld",
                func, (long long)H, (long long)Hkv);
    PYTFM_CHECK(window >= 0, "%s: window must be >= 0 (0: no window), got %lld", func,
                (long long)window);
    PYTFM_CHECK(window == 0 || causal,
                "%s: window = %lld needs causal attention (causal != 0), got causal = 0", func,
                (long long)window);
    return PYTFM_STATUS_OK;
}

/* n_new tokens at positions [start, start + n_new) of a KV cache of Tmax positions, whose
 * arrays [B, Tmax, H, D] hold *n_cache floats */
static inline pytfm_status pytfm__check_cache_positions(const char *func, int64_t B,
                                                        int64_t n_new, int64_t H, int64_t D,
                                                        int64_t Tmax, int64_t start,
                                                        int64_t *n_cache) {
    PYTFM_CHECK(start >= 0, "%s: start must be >= 0, got %lld", func, (long long)start);
    PYTFM_CHECK(Tmax >= 1, "%s: Tmax must be >= 1, got %lld", func, (long long)Tmax);
    int64_t end = 0;
    PYTFM_CHECK(pytfm__add_within(start, n_new, INT64_MAX, &end),
                "%s: cache overflow: start = %lld plus n_new = %lld passes INT64_MAX", func,
                (long long)start, (long long)n_new);
    PYTFM_CHECK(end <= Tmax, "%s: cache overflow: positions [%lld, %lld) do not fit in Tmax = %lld",
                func, (long long)start, (long long)end, (long long)Tmax);
    PYTFM_CHECK_COUNT(func, n_cache, float, B, Tmax, H, D);
    return PYTFM_STATUS_OK;
}

/* q, o [B, T, H, D], k, v [B, T, Hkv, D], lse [B, H, T] */
static inline pytfm_status pytfm__check_attention_forward(const char *func, const float *o,
                                                          const float *lse, const float *q,
                                                          const float *k, const float *v,
                                                          int64_t B, int64_t T, int64_t H,
                                                          int64_t Hkv, int64_t D, float scale,
                                                          int32_t causal, int64_t window) {
    PYTFM_TRY(pytfm__check_attention_signs(func, "T", B, T, H, D));
    PYTFM_TRY(pytfm__check_attention_groups(func, H, Hkv, window, causal));
    PYTFM_CHECK_FINITE_IN(func, scale);
    int64_t n = 0, n_kv = 0, n_lse = 0;
    PYTFM_CHECK_COUNT(func, &n, float, B, T, H, D);
    PYTFM_CHECK_COUNT(func, &n_kv, float, B, T, Hkv, D);
    PYTFM_CHECK_COUNT(func, &n_lse, float, B, H, T);
    PYTFM_CHECK_PTR_IN(func, o, n);
    PYTFM_CHECK_PTR_IN(func, lse, n_lse);
    PYTFM_CHECK_PTR_IN(func, q, n);
    PYTFM_CHECK_PTR_IN(func, k, n_kv);
    PYTFM_CHECK_PTR_IN(func, v, n_kv);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(o, n, float),
                         PYTFM_SPAN(lse, n_lse, float), PYTFM_SPAN(q, n, float),
                         PYTFM_SPAN(k, n_kv, float), PYTFM_SPAN(v, n_kv, float));
    return PYTFM_STATUS_OK;
}

/* dq, dy, q, o [B, T, H, D], dk, dv, k, v [B, T, Hkv, D], lse [B, H, T] */
static inline pytfm_status
pytfm__check_attention_backward(const char *func, const float *dq, const float *dk,
                                const float *dv, const float *dy, const float *q, const float *k,
                                const float *v, const float *o, const float *lse, int64_t B,
                                int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale,
                                int32_t causal, int64_t window) {
    PYTFM_TRY(pytfm__check_attention_signs(func, "T", B, T, H, D));
    PYTFM_TRY(pytfm__check_attention_groups(func, H, Hkv, window, causal));
    PYTFM_CHECK_FINITE_IN(func, scale);
    int64_t n = 0, n_kv = 0, n_lse = 0;
    PYTFM_CHECK_COUNT(func, &n, float, B, T, H, D);
    PYTFM_CHECK_COUNT(func, &n_kv, float, B, T, Hkv, D);
    PYTFM_CHECK_COUNT(func, &n_lse, float, B, H, T);
    PYTFM_CHECK_PTR_IN(func, dq, n);
    PYTFM_CHECK_PTR_IN(func, dk, n_kv);
    PYTFM_CHECK_PTR_IN(func, dv, n_kv);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, q, n);
    PYTFM_CHECK_PTR_IN(func, k, n_kv);
    PYTFM_CHECK_PTR_IN(func, v, n_kv);
    PYTFM_CHECK_PTR_IN(func, o, n);
    PYTFM_CHECK_PTR_IN(func, lse, n_lse);
    PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dq, n, float),
                         PYTFM_SPAN(dk, n_kv, float), PYTFM_SPAN(dv, n_kv, float),
                         PYTFM_SPAN(dy, n, float), PYTFM_SPAN(q, n, float),
                         PYTFM_SPAN(k, n_kv, float), PYTFM_SPAN(v, n_kv, float),
                         PYTFM_SPAN(o, n, float), PYTFM_SPAN(lse, n_lse, float));
    return PYTFM_STATUS_OK;
}

/* the padded functions: q, o [B, Tq, H, D], k, v [B, Tk, Hkv, D], lse [B, H, Tq], q_len and
 * k_len [B] int64 or NULL (their values are pytfm__check_attention_lengths's: this one reads
 * through no pointer, so that the CUDA twins share it) */
static inline pytfm_status pytfm__check_attention_padded_forward(
    const char *func, const float *o, const float *lse, const float *q, const float *k,
    const float *v, const int64_t *q_len, const int64_t *k_len, int64_t B, int64_t Tq,
    int64_t Tk, int64_t H, int64_t Hkv, int64_t D, float scale, int32_t causal, int64_t window) {
    PYTFM_CHECK(B >= 0 && Tq >= 0 && Tk >= 0 && H >= 0,
                "%s: B, Tq, Tk, H must be >= 0, got %lld, %lld, %lld, %lld", func, (long long)B,
                (long long)Tq, (long long)Tk, (long long)H);
    PYTFM_CHECK(D >= 1, "%s: D must be >= 1, got %lld", func, (long long)D);
    PYTFM_TRY(pytfm__check_attention_groups(func, H, Hkv, window, causal));
    PYTFM_CHECK_FINITE_IN(func, scale);
    int64_t n = 0, n_kv = 0, n_lse = 0;
    PYTFM_CHECK_COUNT(func, &n, float, B, Tq, H, D);
    PYTFM_CHECK_COUNT(func, &n_kv, float, B, Tk, Hkv, D);
    PYTFM_CHECK_COUNT(func, &n_lse, float, B, H, Tq);
    PYTFM_CHECK_PTR_IN(func, o, n);
    PYTFM_CHECK_PTR_IN(func, lse, n_lse);
    PYTFM_CHECK_PTR_IN(func, q, n);
    PYTFM_CHECK_PTR_IN(func, k, n_kv);
    PYTFM_CHECK_PTR_IN(func, v, n_kv);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(o, n, float),
                         PYTFM_SPAN(lse, n_lse, float), PYTFM_SPAN(q, n, float),
                         PYTFM_SPAN(k, n_kv, float), PYTFM_SPAN(v, n_kv, float),
                         PYTFM_SPAN(q_len, B, int64_t), PYTFM_SPAN(k_len, B, int64_t));
    return PYTFM_STATUS_OK;
}

/* dq, dy, q, o [B, Tq, H, D], dk, dv, k, v [B, Tk, Hkv, D], lse [B, H, Tq], q_len and k_len as
 * the forward's */
static inline pytfm_status pytfm__check_attention_padded_backward(
    const char *func, const float *dq, const float *dk, const float *dv, const float *dy,
    const float *q, const float *k, const float *v, const float *o, const float *lse,
    const int64_t *q_len, const int64_t *k_len, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
    int64_t Hkv, int64_t D, float scale, int32_t causal, int64_t window) {
    PYTFM_CHECK(B >= 0 && Tq >= 0 && Tk >= 0 && H >= 0,
                "%s: B, Tq, Tk, H must be >= 0, got %lld, %lld, %lld, %lld", func, (long long)B,
                (long long)Tq, (long long)Tk, (long long)H);
    PYTFM_CHECK(D >= 1, "%s: D must be >= 1, got %lld", func, (long long)D);
    PYTFM_TRY(pytfm__check_attention_groups(func, H, Hkv, window, causal));
    PYTFM_CHECK_FINITE_IN(func, scale);
    int64_t n = 0, n_kv = 0, n_lse = 0;
    PYTFM_CHECK_COUNT(func, &n, float, B, Tq, H, D);
    PYTFM_CHECK_COUNT(func, &n_kv, float, B, Tk, Hkv, D);
    PYTFM_CHECK_COUNT(func, &n_lse, float, B, H, Tq);
    PYTFM_CHECK_PTR_IN(func, dq, n);
    PYTFM_CHECK_PTR_IN(func, dk, n_kv);
    PYTFM_CHECK_PTR_IN(func, dv, n_kv);
    PYTFM_CHECK_PTR_IN(func, dy, n);
    PYTFM_CHECK_PTR_IN(func, q, n);
    PYTFM_CHECK_PTR_IN(func, k, n_kv);
    PYTFM_CHECK_PTR_IN(func, v, n_kv);
    PYTFM_CHECK_PTR_IN(func, o, n);
    PYTFM_CHECK_PTR_IN(func, lse, n_lse);
    PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dq, n, float),
                         PYTFM_SPAN(dk, n_kv, float), PYTFM_SPAN(dv, n_kv, float),
                         PYTFM_SPAN(dy, n, float), PYTFM_SPAN(q, n, float),
                         PYTFM_SPAN(k, n_kv, float), PYTFM_SPAN(v, n_kv, float),
                         PYTFM_SPAN(o, n, float), PYTFM_SPAN(lse, n_lse, float),
                         PYTFM_SPAN(q_len, B, int64_t), PYTFM_SPAN(k_len, B, int64_t));
    return PYTFM_STATUS_OK;
}

/* The values of q_len and k_len [B] (NULL: none to check): 0 <= q_len[b] <= Tq and
 * 0 <= k_len[b] <= Tk. The one attention check that reads through a pointer, run after the
 * shape checks above: the CPU functions only (on the GPU the lengths are in device memory). */
static inline pytfm_status pytfm__check_attention_lengths(const char *func, const int64_t *q_len,
                                                          const int64_t *k_len, int64_t B,
                                                          int64_t Tq, int64_t Tk) {
    for (int64_t b = 0; q_len && b < B; b++)
        PYTFM_CHECK(q_len[b] >= 0 && q_len[b] <= Tq,
                    "%s: q_len[%lld] must be in [0, Tq] = [0, %lld], got %lld", func,
                    (long long)b, (long long)Tq, (long long)q_len[b]);
    for (int64_t b = 0; k_len && b < B; b++)
        PYTFM_CHECK(k_len[b] >= 0 && k_len[b] <= Tk,
                    "%s: k_len[%lld] must be in [0, Tk] = [0, %lld], got %lld", func,
                    (long long)b, (long long)Tk, (long long)k_len[b]);
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_attention_cache_append(const char *func,
                                                               const float *k_cache,
                                                               const float *v_cache,
                                                               const float *k, const float *v,
                                                               int64_t B, int64_t n_new,
                                                               int64_t H, int64_t D,
                                                               int64_t Tmax, int64_t start) {
    PYTFM_TRY(pytfm__check_attention_signs(func, "n_new", B, n_new, H, D));
    int64_t n_cache = 0, n = 0;
    PYTFM_TRY(pytfm__check_cache_positions(func, B, n_new, H, D, Tmax, start, &n_cache));
    PYTFM_CHECK_COUNT(func, &n, float, B, n_new, H, D);
    PYTFM_CHECK_PTR_IN(func, k_cache, n_cache);
    PYTFM_CHECK_PTR_IN(func, v_cache, n_cache);
    PYTFM_CHECK_PTR_IN(func, k, n);
    PYTFM_CHECK_PTR_IN(func, v, n);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,
                         PYTFM_SPAN(k_cache, n_cache, float), PYTFM_SPAN(v_cache, n_cache, float),
                         PYTFM_SPAN(k, n, float), PYTFM_SPAN(v, n, float));
    return PYTFM_STATUS_OK;
}

/* q, o [B, n_new, H, D], the caches [B, Tmax, Hkv, D], lse [B, H, n_new] */
static inline pytfm_status
pytfm__check_attention_decode(const char *func, const float *o, const float *lse, const float *q,
                              const float *k_cache, const float *v_cache, int64_t B,
                              int64_t n_new, int64_t H, int64_t Hkv, int64_t D, int64_t Tmax,
                              int64_t start, float scale, int64_t window) {
    PYTFM_TRY(pytfm__check_attention_signs(func, "n_new", B, n_new, H, D));
    PYTFM_TRY(pytfm__check_attention_groups(func, H, Hkv, window, 1));
    int64_t n_cache = 0, n = 0, n_lse = 0;
    PYTFM_TRY(pytfm__check_cache_positions(func, B, n_new, Hkv, D, Tmax, start, &n_cache));
    PYTFM_CHECK_FINITE_IN(func, scale);
    PYTFM_CHECK_COUNT(func, &n, float, B, n_new, H, D);
    PYTFM_CHECK_COUNT(func, &n_lse, float, B, H, n_new);
    PYTFM_CHECK_PTR_IN(func, o, n);
    PYTFM_CHECK_PTR_IN(func, lse, n_lse);
    PYTFM_CHECK_PTR_IN(func, q, n);
    PYTFM_CHECK_PTR_IN(func, k_cache, n_cache);
    PYTFM_CHECK_PTR_IN(func, v_cache, n_cache);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(o, n, float),
                         PYTFM_SPAN(lse, n_lse, float), PYTFM_SPAN(q, n, float),
                         PYTFM_SPAN(k_cache, n_cache, float),
                         PYTFM_SPAN(v_cache, n_cache, float));
    return PYTFM_STATUS_OK;
}

/* ---- a BF16 KV cache (attention_bf16kv.c): the checks above, the caches uint16_t ---------- */
static inline pytfm_status pytfm__check_attention_cache_append_bf16(
    const char *func, const uint16_t *k_cache, const uint16_t *v_cache, const float *k,
    const float *v, int64_t B, int64_t n_new, int64_t H, int64_t D, int64_t Tmax, int64_t start) {
    PYTFM_TRY(pytfm__check_attention_signs(func, "n_new", B, n_new, H, D));
    int64_t n_cache = 0, n = 0;
    PYTFM_TRY(pytfm__check_cache_positions(func, B, n_new, H, D, Tmax, start, &n_cache));
    PYTFM_CHECK_COUNT(func, &n, float, B, n_new, H, D);
    PYTFM_CHECK_PTR_IN(func, k_cache, n_cache);
    PYTFM_CHECK_PTR_IN(func, v_cache, n_cache);
    PYTFM_CHECK_PTR_IN(func, k, n);
    PYTFM_CHECK_PTR_IN(func, v, n);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,
                         PYTFM_SPAN(k_cache, n_cache, uint16_t),
                         PYTFM_SPAN(v_cache, n_cache, uint16_t), PYTFM_SPAN(k, n, float),
                         PYTFM_SPAN(v, n, float));
    return PYTFM_STATUS_OK;
}

/* q, o [B, n_new, H, D], the caches [B, Tmax, Hkv, D] of BF16 bits, lse [B, H, n_new] */
static inline pytfm_status pytfm__check_attention_decode_bf16kv(
    const char *func, const float *o, const float *lse, const float *q, const uint16_t *k_cache,
    const uint16_t *v_cache, int64_t B, int64_t n_new, int64_t H, int64_t Hkv, int64_t D,
    int64_t Tmax, int64_t start, float scale, int64_t window) {
    PYTFM_TRY(pytfm__check_attention_signs(func, "n_new", B, n_new, H, D));
    PYTFM_TRY(pytfm__check_attention_groups(func, H, Hkv, window, 1));
    int64_t n_cache = 0, n = 0, n_lse = 0;
    PYTFM_TRY(pytfm__check_cache_positions(func, B, n_new, Hkv, D, Tmax, start, &n_cache));
    PYTFM_CHECK_FINITE_IN(func, scale);
    PYTFM_CHECK_COUNT(func, &n, float, B, n_new, H, D);
    PYTFM_CHECK_COUNT(func, &n_lse, float, B, H, n_new);
    PYTFM_CHECK_PTR_IN(func, o, n);
    PYTFM_CHECK_PTR_IN(func, lse, n_lse);
    PYTFM_CHECK_PTR_IN(func, q, n);
    PYTFM_CHECK_PTR_IN(func, k_cache, n_cache);
    PYTFM_CHECK_PTR_IN(func, v_cache, n_cache);
    PYTFM_CHECK_DISJOINT(func, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(o, n, float),
                         PYTFM_SPAN(lse, n_lse, float), PYTFM_SPAN(q, n, float),
                         PYTFM_SPAN(k_cache, n_cache, uint16_t),
                         PYTFM_SPAN(v_cache, n_cache, uint16_t));
    return PYTFM_STATUS_OK;
}

/* ---- 8-bit weights (q8.c) -------------------------------------------------------------------
 * q [out, in] int8 and scales [out, in / PYTFM_Q8_BLOCK] fp16 bits; cols (the size named
 * `cols_name`: in, or the embedding's dim) >= 1 and a multiple of PYTFM_Q8_BLOCK */
static inline pytfm_status pytfm__check_q8_sizes(const char *func, const char *cols_name,
                                                 int64_t out, int64_t cols, int64_t *n_q,
                                                 int64_t *n_scales) {
    PYTFM_CHECK(cols >= 1 && cols % PYTFM_Q8_BLOCK == 0,
                "%s: %s must be a positive multiple of PYTFM_Q8_BLOCK (%d), got %lld", func,
                cols_name, (int)PYTFM_Q8_BLOCK, (long long)cols);
    PYTFM_CHECK_COUNT(func, n_q, int8_t, out, cols);
    PYTFM_CHECK_COUNT(func, n_scales, uint16_t, out, cols / PYTFM_Q8_BLOCK);
    return PYTFM_STATUS_OK;
}

/* w [out, in] of elem_bytes-byte values (float32, or BF16's 2) into q and scales */
static inline pytfm_status pytfm__check_quantize_q8(const char *func, const int8_t *q,
                                                    const uint16_t *scales, const void *w,
                                                    size_t elem_bytes, int64_t out, int64_t in) {
    PYTFM_CHECK_MIN_IN(func, out, 0);
    int64_t n_q = 0, n_scales = 0, n_w = 0;
    PYTFM_TRY(pytfm__check_q8_sizes(func, "in", out, in, &n_q, &n_scales));
    if (elem_bytes == sizeof(float))
        PYTFM_CHECK_COUNT(func, &n_w, float, out, in);
    else
        PYTFM_CHECK_COUNT(func, &n_w, uint16_t, out, in);
    PYTFM_CHECK_PTR_IN(func, q, n_q);
    PYTFM_CHECK_PTR_IN(func, scales, n_scales);
    PYTFM_CHECK(w != NULL || n_w == 0, "%s: %s must not be NULL", func,
                elem_bytes == sizeof(float) ? "w" : "w16");
    const pytfm__span w_span = {elem_bytes == sizeof(float) ? "w" : "w16", w,
                                n_w * (int64_t)elem_bytes};
    const pytfm__span spans[] = {PYTFM_SPAN(q, n_q, int8_t), PYTFM_SPAN(scales, n_scales, uint16_t),
                                 w_span};
    return pytfm__check_disjoint(func, spans, 3, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE);
}

static inline pytfm_status pytfm__check_dequantize_q8(const char *func, const float *w,
                                                      const int8_t *q, const uint16_t *scales,
                                                      int64_t out, int64_t in) {
    PYTFM_CHECK_MIN_IN(func, out, 0);
    int64_t n_q = 0, n_scales = 0, n_w = 0;
    PYTFM_TRY(pytfm__check_q8_sizes(func, "in", out, in, &n_q, &n_scales));
    PYTFM_CHECK_COUNT(func, &n_w, float, out, in);
    PYTFM_CHECK_PTR_IN(func, w, n_w);
    PYTFM_CHECK_PTR_IN(func, q, n_q);
    PYTFM_CHECK_PTR_IN(func, scales, n_scales);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(w, n_w, float),
                         PYTFM_SPAN(q, n_q, int8_t), PYTFM_SPAN(scales, n_scales, uint16_t));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_linear_forward_q8w(const char *func, const float *y,
                                                           const float *x, const int8_t *q,
                                                           const uint16_t *scales,
                                                           const float *b, int64_t rows,
                                                           int64_t in, int64_t out) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, out, 1);
    int64_t n_q = 0, n_scales = 0, n_x = 0, n_y = 0;
    PYTFM_TRY(pytfm__check_q8_sizes(func, "in", out, in, &n_q, &n_scales));
    PYTFM_CHECK_COUNT(func, &n_x, float, rows, in);
    PYTFM_CHECK_COUNT(func, &n_y, float, rows, out);
    PYTFM_CHECK_PTR_IN(func, y, n_y);
    PYTFM_CHECK_PTR_IN(func, x, n_x);
    PYTFM_CHECK_PTR_IN(func, q, n_q);
    PYTFM_CHECK_PTR_IN(func, scales, n_scales);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n_y, float),
                         PYTFM_SPAN(x, n_x, float), PYTFM_SPAN(q, n_q, int8_t),
                         PYTFM_SPAN(scales, n_scales, uint16_t), PYTFM_SPAN(b, out, float));
    return PYTFM_STATUS_OK;
}

static inline pytfm_status pytfm__check_embedding_forward_q8w(const char *func, const float *y,
                                                              const int64_t *ids,
                                                              const int8_t *q,
                                                              const uint16_t *scales,
                                                              int64_t rows, int64_t vocab,
                                                              int64_t dim) {
    PYTFM_CHECK_MIN_IN(func, rows, 0);
    PYTFM_CHECK_MIN_IN(func, vocab, 1);
    int64_t n_q = 0, n_scales = 0, n_y = 0, n_ids = 0;
    PYTFM_TRY(pytfm__check_q8_sizes(func, "dim", vocab, dim, &n_q, &n_scales));
    PYTFM_CHECK_COUNT(func, &n_y, float, rows, dim);
    PYTFM_CHECK_COUNT(func, &n_ids, int64_t, rows);
    PYTFM_CHECK_PTR_IN(func, y, n_y);
    PYTFM_CHECK_PTR_IN(func, ids, rows);
    PYTFM_CHECK_PTR_IN(func, q, n_q);
    PYTFM_CHECK_PTR_IN(func, scales, n_scales);
    PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(y, n_y, float),
                         PYTFM_SPAN(ids, rows, int64_t), PYTFM_SPAN(q, n_q, int8_t),
                         PYTFM_SPAN(scales, n_scales, uint16_t));
    return PYTFM_STATUS_OK;
}

#endif /* PYTFM_CHECKS_H */
