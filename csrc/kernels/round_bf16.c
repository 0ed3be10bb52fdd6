/*
 * round_bf16.c — y = x rounded to BF16, as the BF16 products round their inputs
 * (pytfm__bf16_round_bits, internal.h): round to nearest, ties to even; NaN stays NaN (quiet),
 * ±inf stays, a float32 subnormal becomes a zero of its sign, a value half a BF16 ulp or more
 * past the largest BF16 becomes ±inf. Element by element, so the same bits on every path and
 * at any thread count; the tests hold the BF16 products to the reference on inputs rounded by
 * it (and by pytfm.reference.round_bf16, which it must match bit for bit).
 */
#include "core/checks.h"

pytfm_status pytfm_round_bf16(float *y, const float *x, int64_t count) {
    PYTFM_TRY(pytfm__check_round_bf16(__func__, y, x, count));
    enum { CHUNK = PYTFM_TASK_ELEMS };
    PYTFM_PARALLEL_FOR_IF(count > 4 * CHUNK)
    for (int64_t i0 = 0; i0 < count; i0 += CHUNK) {
        const int64_t i1 = PYTFM_MIN(count, i0 + CHUNK);
        for (int64_t i = i0; i < i1; i++) y[i] = pytfm__bf16_round(x[i]);
    }
    return PYTFM_STATUS_OK;
}
