/*
 * positions.c — the sinusoidal position table (Vaswani et al., 2017), the one implementation
 * of it: pytfm.nn.sinusoidal_positions calls it through pytfm.ops, and the C model (model.c)
 * calls it too, so that both add the same bits to the token embeddings.
 *
 *   pe[t, 2i] = sin(t · inv_i),  pe[t, 2i + 1] = cos(t · inv_i),  inv_i = 10000^(−2i/dim)
 *
 * in double, each value rounded to float once. Rows are independent and each is computed the
 * same way on any thread: the bits do not depend on the thread count.
 */
#include "core/checks.h"

/* row t of the table: dim floats */
static void position_row(float *row, int64_t t, int64_t dim) {
    for (int64_t i = 0; 2 * i < dim; i++) {
        const double inv = pow(10000.0, -(double)(2 * i) / (double)dim);
        const double angle = (double)t * inv;
        row[2 * i] = (float)sin(angle);
        row[2 * i + 1] = (float)cos(angle);
    }
}

pytfm_status pytfm_sinusoidal_positions(float *pe, int64_t T, int64_t dim) {
    const char *func = __func__;
    PYTFM_CHECK_MIN_IN(func, T, 0);
    PYTFM_CHECK(dim >= 2 && dim % 2 == 0, "%s: dim must be even and >= 2, got %lld", func,
                (long long)dim);
    int64_t count = 0;
    PYTFM_CHECK_COUNT(func, &count, float, T, dim);
    PYTFM_CHECK_PTR_IN(func, pe, count);
    if (pytfm__one_task(T, dim)) { // no parallel region for one task
        for (int64_t t = 0; t < T; t++) position_row(pe + t * dim, t, dim);
        return PYTFM_STATUS_OK;
    }
    PYTFM_PARALLEL_ROWS(T, dim)
    for (int64_t t = 0; t < T; t++) position_row(pe + t * dim, t, dim);
    return PYTFM_STATUS_OK;
}
