/*
 * swiglu.c — SwiGLU's element-wise step, h = silu(g) ∘ u (the Llama family's MLP).
 *
 *   g = x·W_gateᵀ, u = x·W_upᵀ (two linear products, outside this op); h, g, u [count]
 *   forward:  silu(g) = g · σ(g) = g / (1 + e^(−g)),  h = silu(g) · u
 *   backward: silu'(g) = σ(g) · (1 + g · (1 − σ(g))),  dg = dh · u · silu'(g),  du = dh · silu(g)
 * Written with e^(−g), which may overflow to +inf but never gives NaN for a finite g: σ is then
 * 0 and silu −0 (its true value is under 1e-36 in size). Nothing is saved beyond g and u.
 * Blocks of CHUNK elements go to threads; the fast kernels (fast_impl.h) use the vectorised
 * e^x of vecmath.h (3 ulp), the plain loops libm's expf.
 */
#include "core/checks.h"
#include "fast.h"

enum { CHUNK = 16384 };

static inline float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

static void forward_plain(float *h, const float *g, const float *u, int64_t count) {
    for (int64_t i = 0; i < count; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void backward_plain(float *dg, float *du, const float *dh, const float *g,
                           const float *u, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        const float s = sigmoid(g[i]);
        dg[i] = dh[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
        du[i] = dh[i] * (g[i] * s);
    }
}

pytfm_status pytfm_swiglu_forward(float *h, const float *g, const float *u, int64_t count) {
    PYTFM_TRY(pytfm__check_swiglu_forward(__func__, h, g, u, count));
    const pytfm__fast_kernels *k = pytfm__fast();
    if (count <= CHUNK) { // one chunk: no parallel region (see pytfm__one_task)
        if (k) k->swiglu_forward(h, g, u, count);
        else forward_plain(h, g, u, count);
        return PYTFM_STATUS_OK;
    }
    PYTFM_PARALLEL_FOR
    for (int64_t c = 0; c < count; c += CHUNK) {
        const int64_t n = PYTFM_MIN(CHUNK, count - c);
        if (k) k->swiglu_forward(h + c, g + c, u + c, n);
        else forward_plain(h + c, g + c, u + c, n);
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_swiglu_backward(float *dg, float *du, const float *dh, const float *g,
                                   const float *u, int64_t count) {
    PYTFM_TRY(pytfm__check_swiglu_backward(__func__, dg, du, dh, g, u, count));
    const pytfm__fast_kernels *k = pytfm__fast();
    if (count <= CHUNK) {
        if (k) k->swiglu_backward(dg, du, dh, g, u, count);
        else backward_plain(dg, du, dh, g, u, count);
        return PYTFM_STATUS_OK;
    }
    PYTFM_PARALLEL_FOR
    for (int64_t c = 0; c < count; c += CHUNK) {
        const int64_t n = PYTFM_MIN(CHUNK, count - c);
        if (k) k->swiglu_backward(dg + c, du + c, dh + c, g + c, u + c, n);
        else backward_plain(dg + c, du + c, dh + c, g + c, u + c, n);
    }
    return PYTFM_STATUS_OK;
}
