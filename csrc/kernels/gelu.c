/*
 * gelu.c — GELU, tanh approximation (as GPT-2 and torch's approximate="tanh").
 *
 *   forward:  u = k (x + a x³), k = sqrt(2/π), a = 0.044715;  y = ½ x (1 + tanh u)
 *   backward: dy/dx = ½ (1 + tanh u) + ½ x (1 − tanh² u) · k (1 + 3 a x²);  dx = dy · dy/dx
 * Computed through s = ½ (1 + tanh u) = 1 / (1 + e^(−2u)), an identity, so one expf replaces
 * the much slower tanhf; then ½ (1 − tanh² u) = 2 s (1 − s). The backward recomputes s from
 * x; nothing is saved beyond the input. Blocks of CHUNK elements go to threads.
 * Every finite x gives a finite result, up to ±FLT_MAX: x³ may overflow to ±inf, which only
 * sends e^(−2u) to 0 or +inf (s to 1 or 0, y to x or −0), and the backward's term in v·v is
 * taken at v clamped to ±16 (PYTFM_GELU_TERM_V), past which it is 0. Non-finite x give what the
 * reference gives: gelu(+inf) = +inf, gelu(−inf) = NaN (−inf · 0), gelu'(±inf) = NaN, NaN → NaN.
 */
#include "core/checks.h"
#include "fast.h"

enum { CHUNK = 16384 };

static inline float half_one_plus_tanh(float v) { // ½ (1 + tanh(k (v + a v³)))
    return 1.0f / (1.0f + expf(-2.0f * PYTFM_GELU_K * (v + PYTFM_GELU_A * v * v * v)));
}

pytfm_status pytfm_gelu_forward(float *y, const float *x, int64_t count) {
    PYTFM_TRY(pytfm__check_gelu_forward(__func__, y, x, count));
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k && count <= CHUNK) { // one chunk: no parallel region (see pytfm__one_task)
        k->gelu_forward(y, x, count);
        return PYTFM_STATUS_OK;
    }
    if (k) {
        PYTFM_PARALLEL_FOR
        for (int64_t c = 0; c < count; c += CHUNK)
            k->gelu_forward(y + c, x + c, PYTFM_MIN(CHUNK, count - c));
        return PYTFM_STATUS_OK;
    }
    PYTFM_PARALLEL_FOR // the plain reference
    for (int64_t c = 0; c < count; c += CHUNK) {
        const int64_t end = PYTFM_MIN(count, c + CHUNK);
        for (int64_t i = c; i < end; i++) y[i] = x[i] * half_one_plus_tanh(x[i]);
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_gelu_backward(float *dx, const float *dy, const float *x, int64_t count) {
    PYTFM_TRY(pytfm__check_gelu_backward(__func__, dx, dy, x, count));
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k && count <= CHUNK) { // one chunk: no parallel region
        k->gelu_backward(dx, dy, x, count);
        return PYTFM_STATUS_OK;
    }
    if (k) {
        PYTFM_PARALLEL_FOR
        for (int64_t c = 0; c < count; c += CHUNK)
            k->gelu_backward(dx + c, dy + c, x + c, PYTFM_MIN(CHUNK, count - c));
        return PYTFM_STATUS_OK;
    }
    PYTFM_PARALLEL_FOR // the plain reference
    for (int64_t c = 0; c < count; c += CHUNK) {
        const int64_t end = PYTFM_MIN(count, c + CHUNK);
        for (int64_t i = c; i < end; i++) {
            const float v = x[i], s = half_one_plus_tanh(v), vt = PYTFM_GELU_TERM_V(v);
            const float du = PYTFM_GELU_K * (1.0f + 3.0f * PYTFM_GELU_A * vt * vt);
            dx[i] = dy[i] * (s + 2.0f * vt * s * (1.0f - s) * du);
        }
    }
    return PYTFM_STATUS_OK;
}
