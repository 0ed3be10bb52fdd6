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
    // dx in blocks of RB rows, dW in blocks of OB output features: each row of W (of x) is
    // read once per block rather than once per row (per feature)
    enum { RB = 4, OB = 8 };
    if (dx) {
        PYTFM_PARALLEL_FOR
        for (int64_t r0 = 0; r0 < n; r0 += RB) {
            const int64_t nb = n - r0 < RB ? n - r0 : RB;
            for (int64_t i = 0; i < nb * in; i++) dx[r0 * in + i] = 0.0f;
            for (int64_t o = 0; o < out; o++)
                for (int64_t j = 0; j < nb; j++)
                    pytfm__axpy(dx + (r0 + j) * in, dy[(r0 + j) * out + o], w + o * in, in);
        }
    }
    PYTFM_PARALLEL_FOR
    for (int64_t o0 = 0; o0 < out; o0 += OB) {
        const int64_t nb = out - o0 < OB ? out - o0 : OB;
        for (int64_t r = 0; r < n; r++) {
            const float *xr = x + r * in, *g = dy + r * out + o0;
            for (int64_t j = 0; j < nb; j++) pytfm__axpy(dw + (o0 + j) * in, g[j], xr, in);
        }
    }
    if (db) {
        for (int64_t r = 0; r < n; r++)
            for (int64_t o = 0; o < out; o++) db[o] += dy[r * out + o];
    }
    return PYTFM_STATUS_OK;
}
