/*
 * adamw.c — AdamW (Loshchilov & Hutter), one fused in-place step, as torch.optim.AdamW.
 *
 *   param, m, v, grad [count]; t = step >= 1
 *   param ← param · (1 − lr·wd)                          (decoupled weight decay)
 *   m ← β1 m + (1 − β1) g,  v ← β2 v + (1 − β2) g²
 *   param ← param − (lr / (1 − β1ᵗ)) · m / (sqrt(v) / sqrt(1 − β2ᵗ) + eps)
 * The last line is torch's arrangement of the bias correction, so the two agree to rounding.
 * Scalars are computed once in double; the loop over elements is float32.
 *
 * pytfm_sum_squares, Σ x², is gradient clipping's norm over one flat gradient buffer: each
 * block of CHUNK elements is summed in double in index order, then the block sums in block
 * order, so the result is the same at any thread count (and closer than a float sum: a
 * million squares summed in float lose about 1e-4 of relative accuracy).
 */
#include <stdlib.h>

#include "core/checks.h"
#include "fast.h"

enum { CHUNK = 16384 };

pytfm_status pytfm_adamw_step(float *param, float *m, float *v, const float *grad,
                              int64_t count, int64_t step, double lr, double beta1, double beta2,
                              double eps, double weight_decay) {
    PYTFM_TRY(pytfm__check_adamw(__func__, param, m, v, grad, count, step, lr, beta1, beta2, eps,
                                 weight_decay));
    const float decay = (float)(1.0 - lr * weight_decay);
    const float step_size = (float)(lr / (1.0 - pow(beta1, (double)step)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
    // 1 − β in double, then rounded: (1 − (float)0.999) is off by 1e-5 relative
    const float b1 = (float)beta1, c1 = (float)(1.0 - beta1);
    const float b2 = (float)beta2, c2 = (float)(1.0 - beta2);
    const float e = (float)eps;
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k) {
        const pytfm__adamw_consts c = {decay, step_size, bc2_sqrt, b1, c1, b2, c2, e};
        PYTFM_PARALLEL_FOR_IF(count > CHUNK)
        for (int64_t i = 0; i < count; i += CHUNK)
            k->adamw(param + i, m + i, v + i, grad + i, PYTFM_MIN(CHUNK, count - i), &c);
        return PYTFM_STATUS_OK;
    }
    for (int64_t i = 0; i < count; i++) { // the plain reference
        const float g = grad[i];
        m[i] = b1 * m[i] + c1 * g;
        v[i] = b2 * v[i] + c2 * g * g;
        param[i] = param[i] * decay - step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + e);
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_sum_squares(double *out, const float *x, int64_t count) {
    PYTFM_TRY(pytfm__check_sum_squares(__func__, out, x, count));
    const int64_t blocks = (count + CHUNK - 1) / CHUNK;
    double stack[64], *sums = blocks <= 64 ? stack : pytfm__scratch(__func__, blocks, sizeof(double));
    if (!sums) return PYTFM_STATUS_OUT_OF_MEMORY;
    PYTFM_PARALLEL_FOR_IF(blocks > 1)
    for (int64_t c = 0; c < blocks; c++) {
        const float *xc = x + c * CHUNK;
        double acc = 0.0;
        for (int64_t i = 0; i < PYTFM_MIN(CHUNK, count - c * CHUNK); i++)
            acc += (double)xc[i] * (double)xc[i];
        sums[c] = acc;
    }
    double total = 0.0;
    for (int64_t c = 0; c < blocks; c++) total += sums[c];
    *out = total;
    if (sums != stack) free(sums);
    return PYTFM_STATUS_OK;
}
