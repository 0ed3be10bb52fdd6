/*
 * embedding.c — table lookup, the token embedding.
 *
 *   ids [rows] in [0, vocab), table [vocab, dim], y [rows, dim]
 *   forward:  y[i, :] = table[ids[i], :]
 *   backward: dtable[ids[i], :] += dy[i, :]  (a scatter-add: rows of repeated ids add up; run
 *             in order of i, so the sum is the same every time)
 * All ids are checked before the first write, so a bad id changes nothing. A table given in
 * BF16 (pytfm_embedding_forward_bf16w; the C model of a BF16 file) is read widened: the same
 * rows as its float32 widening gives.
 */
#include <string.h>

#include "core/checks.h"

pytfm_status pytfm_embedding_forward(float *y, const int64_t *ids, const float *table,
                                     int64_t rows, int64_t vocab, int64_t dim) {
    PYTFM_TRY(pytfm__check_embedding_forward(__func__, y, ids, table, rows, vocab, dim));
    PYTFM_TRY(pytfm__check_indices(__func__, "ids", ids, rows, vocab, 0, 0));
    if (pytfm__one_task(rows, dim)) { // no parallel region for one task
        for (int64_t i = 0; i < rows; i++)
            memcpy(y + i * dim, table + ids[i] * dim, (size_t)dim * sizeof(float));
        return PYTFM_STATUS_OK;
    }
    PYTFM_PARALLEL_ROWS(rows, dim)
    for (int64_t i = 0; i < rows; i++)
        memcpy(y + i * dim, table + ids[i] * dim, (size_t)dim * sizeof(float));
    return PYTFM_STATUS_OK;
}

/* the rows of a BF16 table, widened: y[i, j] = the float whose top half is table[ids[i], j] */
static void rows_bf16(float *y, const int64_t *ids, const uint16_t *table, int64_t i0,
                      int64_t i1, int64_t dim) {
    for (int64_t i = i0; i < i1; i++) {
        const uint16_t *row = table + ids[i] * dim;
        for (int64_t j = 0; j < dim; j++) {
            const uint32_t u = (uint32_t)row[j] << 16;
            memcpy(y + i * dim + j, &u, sizeof u);
        }
    }
}

pytfm_status pytfm__embedding_forward_bf16(float *y, const int64_t *ids, const uint16_t *table,
                                           int64_t rows, int64_t vocab, int64_t dim) {
    (void)vocab; // the caller checked the ids against it
    if (pytfm__one_task(rows, dim)) { // no parallel region for one task
        rows_bf16(y, ids, table, 0, rows, dim);
        return PYTFM_STATUS_OK;
    }
    PYTFM_PARALLEL_ROWS(rows, dim)
    for (int64_t i = 0; i < rows; i++) rows_bf16(y, ids, table, i, i + 1, dim);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_embedding_forward_bf16w(float *y, const int64_t *ids, const uint16_t *table,
                                           int64_t rows, int64_t vocab, int64_t dim) {
    PYTFM_TRY(pytfm__check_embedding_forward_bf16w(__func__, y, ids, table, rows, vocab, dim));
    PYTFM_TRY(pytfm__check_indices(__func__, "ids", ids, rows, vocab, 0, 0));
    return pytfm__embedding_forward_bf16(y, ids, table, rows, vocab, dim);
}

pytfm_status pytfm_embedding_backward(float *dtable, const float *dy, const int64_t *ids,
                                      int64_t rows, int64_t vocab, int64_t dim) {
    PYTFM_TRY(pytfm__check_embedding_backward(__func__, dtable, dy, ids, rows, vocab, dim));
    PYTFM_TRY(pytfm__check_indices(__func__, "ids", ids, rows, vocab, 0, 0));
    // threads own column blocks and scan every id in order: repeated ids add up in the same
    // order as on one thread, with no two threads writing one element
    enum { COLS = 64 };
    PYTFM_PARALLEL_FOR_IF(rows * dim > PYTFM_TASK_ELEMS && dim > COLS)
    for (int64_t j0 = 0; j0 < dim; j0 += COLS)
        for (int64_t i = 0; i < rows; i++) {
            float *row = dtable + ids[i] * dim;
            const float *g = dy + i * dim;
            for (int64_t j = j0; j < PYTFM_MIN(dim, j0 + COLS); j++) row[j] += g[j];
        }
    return PYTFM_STATUS_OK;
}
