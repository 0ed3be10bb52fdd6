/*
 * cross_entropy.c — softmax cross-entropy from logits, mean over the targets not ignored.
 *
 *   logits [rows, vocab], targets [rows], lse [rows] (saved), loss [1]
 *   forward:  lse_i = log Σ_j exp(logits_ij)  (computed as max + log Σ exp(· − max))
 *             loss  = (1/kept) Σ_{i kept} (lse_i − logits_{i, t_i}),  kept = #rows not ignored
 *   backward: dlogits_ij = dloss/kept · (exp(logits_ij − lse_i) − [j = t_i]), 0 if ignored
 * With kept = 0 the loss is 0 and the gradient is 0 (nothing to learn from).
 */
#include <string.h>

#include "core/checks.h"
#include "fast.h"

static int64_t count_kept(const int64_t *targets, int64_t rows, int64_t ignore_index) {
    int64_t kept = 0;
    for (int64_t i = 0; i < rows; i++) kept += targets[i] != ignore_index;
    return kept;
}

pytfm_status pytfm_cross_entropy_forward(float *loss, float *lse, const float *logits,
                                         const int64_t *targets, int64_t rows, int64_t vocab,
                                         int64_t ignore_index) {
    PYTFM_TRY(pytfm__check_cross_entropy_forward(__func__, loss, lse, logits, targets, rows,
                                                 vocab));
    PYTFM_TRY(pytfm__check_indices(__func__, "targets", targets, rows, vocab, 1, ignore_index));
    const int64_t kept = count_kept(targets, rows, ignore_index);
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k) {
        PYTFM_PARALLEL_ROWS(rows, vocab)
        for (int64_t i = 0; i < rows; i++) lse[i] = k->logsumexp(logits + i * vocab, vocab);
        double total = 0.0; // in row order, after the parallel part: the same at any thread count
        for (int64_t i = 0; i < rows; i++)
            if (targets[i] != ignore_index)
                total += (double)lse[i] - logits[i * vocab + targets[i]];
        *loss = kept ? (float)(total / (double)kept) : 0.0f;
        return PYTFM_STATUS_OK;
    }
    double total = 0.0; // the plain reference
    for (int64_t i = 0; i < rows; i++) {
        const float *row = logits + i * vocab;
        float max = -INFINITY;
        for (int64_t j = 0; j < vocab; j++) max = row[j] > max ? row[j] : max;
        double sum = 0.0;
        for (int64_t j = 0; j < vocab; j++) sum += expf(row[j] - max);
        const double l = (double)max + log(sum);
        lse[i] = (float)l;
        if (targets[i] != ignore_index) total += l - row[targets[i]];
    }
    *loss = kept ? (float)(total / (double)kept) : 0.0f;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_cross_entropy_backward(float *dlogits, const float *logits,
                                          const int64_t *targets, const float *lse, int64_t rows,
                                          int64_t vocab, int64_t ignore_index, float dloss) {
    PYTFM_TRY(pytfm__check_cross_entropy_backward(__func__, dlogits, logits, targets, lse, rows,
                                                  vocab, dloss));
    PYTFM_TRY(pytfm__check_indices(__func__, "targets", targets, rows, vocab, 1, ignore_index));
    const int64_t kept = count_kept(targets, rows, ignore_index);
    const float scale = kept ? dloss / (float)kept : 0.0f;
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k) {
        PYTFM_PARALLEL_ROWS(rows, vocab)
        for (int64_t i = 0; i < rows; i++) {
            float *drow = dlogits + i * vocab;
            if (targets[i] == ignore_index) {
                memset(drow, 0, (size_t)vocab * sizeof(float));
                continue;
            }
            k->scaled_exp(drow, logits + i * vocab, lse[i], scale, vocab);
            drow[targets[i]] -= scale;
        }
        return PYTFM_STATUS_OK;
    }
    for (int64_t i = 0; i < rows; i++) { // the plain reference
        const float *row = logits + i * vocab;
        float *drow = dlogits + i * vocab;
        if (targets[i] == ignore_index) {
            for (int64_t j = 0; j < vocab; j++) drow[j] = 0.0f;
            continue;
        }
        for (int64_t j = 0; j < vocab; j++) drow[j] = scale * expf(row[j] - lse[i]);
        drow[targets[i]] -= scale;
    }
    return PYTFM_STATUS_OK;
}
