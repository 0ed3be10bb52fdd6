/*
 * embedding.c — table lookup, the token embedding.
 *
 *   ids [n] in [0, vocab), table [vocab, dim], y [n, dim]
 *   forward:  y[i, :] = table[ids[i], :]
 *   backward: dtable[ids[i], :] += dy[i, :]  (a scatter-add: rows of repeated ids add up; run
 *             in order of i, so the sum is the same every time)
 * All ids are checked before the first write, so a bad id changes nothing.
 */
#include <string.h>

#include "internal.h"

pytfm_status pytfm_embedding_forward(float *y, const int64_t *ids, const float *table,
                                     int64_t n, int64_t vocab, int64_t dim) {
    PYTFM_CHECK_MIN(n, 0);
    PYTFM_CHECK_MIN(vocab, 1);
    PYTFM_CHECK_MIN(dim, 1);
    PYTFM_CHECK_PTR(y, n);
    PYTFM_CHECK_PTR(ids, n);
    PYTFM_CHECK_PTR(table, 1);
    PYTFM_TRY(pytfm__check_indices(__func__, "ids", ids, n, vocab, 0, 0));
    for (int64_t i = 0; i < n; i++)
        memcpy(y + i * dim, table + ids[i] * dim, (size_t)dim * sizeof(float));
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_embedding_backward(float *dtable, const float *dy, const int64_t *ids,
                                      int64_t n, int64_t vocab, int64_t dim) {
    PYTFM_CHECK_MIN(n, 0);
    PYTFM_CHECK_MIN(vocab, 1);
    PYTFM_CHECK_MIN(dim, 1);
    PYTFM_CHECK_PTR(dtable, 1);
    PYTFM_CHECK_PTR(dy, n);
    PYTFM_CHECK_PTR(ids, n);
    PYTFM_TRY(pytfm__check_indices(__func__, "ids", ids, n, vocab, 0, 0));
    for (int64_t i = 0; i < n; i++) {
        float *row = dtable + ids[i] * dim;
        const float *g = dy + i * dim;
        for (int64_t j = 0; j < dim; j++) row[j] += g[j];
    }
    return PYTFM_STATUS_OK;
}
