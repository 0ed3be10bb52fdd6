/*
 * cross_entropy.c — softmax cross-entropy from logits, mean over the targets not ignored.
 *
 *   logits [n, V], targets [n], lse [n] (saved), loss [1]
 *   forward:  lse_i = log Σ_j exp(logits_ij)  (computed as max + log Σ exp(· − max))
 *             loss  = (1/count) Σ_{i kept} (lse_i − logits_{i, t_i}),  count = #kept rows
 *   backward: dlogits_ij = dloss/count · (exp(logits_ij − lse_i) − [j = t_i]), 0 if ignored
 * With count = 0 the loss is 0 and the gradient is 0 (nothing to learn from).
 */
#include <string.h>

#include "checks.h"
#include "fast.h"

static int64_t count_kept(const int64_t *targets, int64_t n, int64_t ignore_index) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) count += targets[i] != ignore_index;
    return count;
}

pytfm_status pytfm_cross_entropy_forward(float *loss, float *lse, const float *logits,
                                         const int64_t *targets, int64_t n, int64_t V,
                                         int64_t ignore_index) {
    PYTFM_TRY(pytfm__check_cross_entropy_forward(__func__, loss, lse, logits, targets, n, V));
    PYTFM_TRY(pytfm__check_indices(__func__, "targets", targets, n, V, 1, ignore_index));
    const int64_t count = count_kept(targets, n, ignore_index);
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k) {
        PYTFM_PARALLEL_ROWS(i, n, V) lse[i] = k->logsumexp(logits + i * V, V);
        double total = 0.0; // in row order, after the parallel part: the same at any thread count
        for (int64_t i = 0; i < n; i++)
            if (targets[i] != ignore_index) total += (double)lse[i] - logits[i * V + targets[i]];
        *loss = count ? (float)(total / (double)count) : 0.0f;
        return PYTFM_STATUS_OK;
    }
    double total = 0.0; // the plain reference
    for (int64_t i = 0; i < n; i++) {
        const float *row = logits + i * V;
        float max = -INFINITY;
        for (int64_t j = 0; j < V; j++) max = row[j] > max ? row[j] : max;
        double sum = 0.0;
        for (int64_t j = 0; j < V; j++) sum += expf(row[j] - max);
        const double l = (double)max + log(sum);
        lse[i] = (float)l;
        if (targets[i] != ignore_index) total += l - row[targets[i]];
    }
    *loss = count ? (float)(total / (double)count) : 0.0f;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_cross_entropy_backward(float *dlogits, const float *logits,
                                          const int64_t *targets, const float *lse, int64_t n,
                                          int64_t V, int64_t ignore_index, float dloss) {
    PYTFM_TRY(pytfm__check_cross_entropy_backward(__func__, dlogits, logits, targets, lse, n, V,
                                                  dloss));
    PYTFM_TRY(pytfm__check_indices(__func__, "targets", targets, n, V, 1, ignore_index));
    const int64_t count = count_kept(targets, n, ignore_index);
    const float scale = count ? dloss / (float)count : 0.0f;
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k) {
        PYTFM_PARALLEL_ROWS(i, n, V) {
            float *drow = dlogits + i * V;
            if (targets[i] == ignore_index) {
                memset(drow, 0, (size_t)V * sizeof(float));
                continue;
            }
            k->scaled_exp(drow, logits + i * V, lse[i], scale, V);
            drow[targets[i]] -= scale;
        }
        return PYTFM_STATUS_OK;
    }
    for (int64_t i = 0; i < n; i++) { // the plain reference
        const float *row = logits + i * V;
        float *drow = dlogits + i * V;
        if (targets[i] == ignore_index) {
            for (int64_t j = 0; j < V; j++) drow[j] = 0.0f;
            continue;
        }
        for (int64_t j = 0; j < V; j++) drow[j] = scale * expf(row[j] - lse[i]);
        drow[targets[i]] -= scale;
    }
    return PYTFM_STATUS_OK;
}
