/*
 * gelu.c — GELU, tanh approximation (as GPT-2 and torch's approximate="tanh").
 *
 *   forward:  u = k (x + a x³), k = sqrt(2/π), a = 0.044715;  y = ½ x (1 + tanh u)
 *   backward: dy/dx = ½ (1 + tanh u) + ½ x (1 − tanh² u) · k (1 + 3 a x²);  dx = dy · dy/dx
 * The backward recomputes tanh u from x; nothing is cached beyond the input.
 */
#include "internal.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/π) */
#define GELU_A 0.044715f

pytfm_status pytfm_gelu_forward(float *y, const float *x, int64_t n) {
    PYTFM_CHECK_MIN(n, 0);
    PYTFM_CHECK_PTR(y, n);
    PYTFM_CHECK_PTR(x, n);
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v)));
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_gelu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    PYTFM_CHECK_MIN(n, 0);
    PYTFM_CHECK_PTR(dx, n);
    PYTFM_CHECK_PTR(dy, n);
    PYTFM_CHECK_PTR(x, n);
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        const float t = tanhf(GELU_K * (v + GELU_A * v * v * v));
        const float du = GELU_K * (1.0f + 3.0f * GELU_A * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
    return PYTFM_STATUS_OK;
}
