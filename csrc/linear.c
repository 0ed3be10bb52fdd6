/*
 * linear.c — fully connected layer, y = x·Wᵀ + b.
 *
 *   x [n, in], W [out, in] (torch.nn.Linear layout), b [out], y [n, out]
 *   forward:  y[r, o] = b[o] + Σ_i x[r, i] W[o, i]
 *   backward: dx = dy·W          dx[r, i]  = Σ_o dy[r, o] W[o, i]     (written)
 *             dW += dyᵀ·x        dW[o, i] += Σ_r dy[r, o] x[r, i]     (accumulated)
 *             db += Σ_r dy[r, :]                                       (accumulated)
 * Nothing is cached: the backward needs x and W, which the caller still has.
 * These are plain loops, written so the innermost loop walks contiguous memory, with rows
 * (or output features) spread over threads: each output element is computed by one thread in
 * a fixed order, so the result does not depend on the thread count. The blocked SGEMM is a
 * later, separate kernel tested against these.
 */
#include "internal.h"

pytfm_status pytfm_linear_forward(float *y, const float *x, const float *w, const float *b,
                                  int64_t n, int64_t in, int64_t out) {
    PYTFM_CHECK_MIN(n, 0);
    PYTFM_CHECK_MIN(in, 1);
    PYTFM_CHECK_MIN(out, 1);
    PYTFM_CHECK_PTR(y, n);
    PYTFM_CHECK_PTR(x, n);
    PYTFM_CHECK_PTR(w, 1);
    PYTFM_PARALLEL_FOR
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * in; // (in)
        float *yr = y + r * out;      // (out)
        for (int64_t o = 0; o < out; o++) {
            const float acc = pytfm__dot(xr, w + o * in, in);
            yr[o] = b ? acc + b[o] : acc;
        }
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_linear_backward(float *dx, float *dw, float *db, const float *dy,
                                   const float *x, const float *w, int64_t n, int64_t in,
                                   int64_t out) {
    PYTFM_CHECK_MIN(n, 0);
    PYTFM_CHECK_MIN(in, 1);
    PYTFM_CHECK_MIN(out, 1);
    PYTFM_CHECK_PTR(dw, 1);
    PYTFM_CHECK_PTR(dy, n);
    PYTFM_CHECK_PTR(x, n);
    PYTFM_CHECK_PTR(w, dx ? 1 : 0);
    if (dx) {
        PYTFM_PARALLEL_FOR
        for (int64_t r = 0; r < n; r++) {
            float *dxr = dx + r * in;
            for (int64_t i = 0; i < in; i++) dxr[i] = 0.0f;
            for (int64_t o = 0; o < out; o++) {
                const float g = dy[r * out + o];
                const float *wo = w + o * in;
                for (int64_t i = 0; i < in; i++) dxr[i] += g * wo[i];
            }
        }
    }
    PYTFM_PARALLEL_FOR
    for (int64_t o = 0; o < out; o++) {
        float *dwo = dw + o * in;
        for (int64_t r = 0; r < n; r++) {
            const float g = dy[r * out + o];
            const float *xr = x + r * in;
            for (int64_t i = 0; i < in; i++) dwo[i] += g * xr[i];
        }
    }
    if (db) {
        for (int64_t r = 0; r < n; r++)
            for (int64_t o = 0; o < out; o++) db[o] += dy[r * out + o];
    }
    return PYTFM_STATUS_OK;
}
