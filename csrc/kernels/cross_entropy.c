/*
 * cross_entropy.c — softmax cross-entropy from logits, mean over the targets not ignored, with
 * label smoothing ε (0: none).
 *
 *   logits [rows, vocab], targets [rows], lse [rows] (saved), loss [1]
 *   forward:  lse_i  = log Σ_j exp(logits_ij)  (computed as max + log Σ exp(· − max))
 *             mean_i = (1/vocab) Σ_j logits_ij  (in double; only with ε != 0)
 *             loss   = (1/kept) Σ_{i kept} (1 − ε)(lse_i − logits_{i, t_i}) + ε(lse_i − mean_i)
 *                      kept = #rows not ignored; with ε = 0 the term is lse_i − logits_{i, t_i}
 *   backward: dlogits_ij = dloss/kept · (exp(logits_ij − lse_i) − (1 − ε)[j = t_i] − ε/vocab),
 *             0 if ignored
 * The smoothed target (1 − ε)·onehot + ε/vocab sums to 1, so each kept row's gradient sums to 0.
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

/* (1/vocab) Σ_j row[j] in double: eight partial sums, added in a fixed order (the same bits
 * in the plain and the fast kernels), so that the adds pipeline instead of waiting on one */
static double row_mean(const float *row, int64_t vocab) {
    double part[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    int64_t j = 0;
    for (; j + 8 <= vocab; j += 8)
        for (int u = 0; u < 8; u++) part[u] += row[j + u];
    for (int u = 0; j < vocab; j++, u++) part[u] += row[j];
    const double sum = ((part[0] + part[1]) + (part[2] + part[3])) +
                       ((part[4] + part[5]) + (part[6] + part[7]));
    return sum / (double)vocab;
}

/* a kept row's loss from its lse l, target logit and mean (unread with eps = 0) */
static double row_loss(double l, float target_logit, double mean, double eps) {
    if (eps == 0.0) return l - target_logit;
    return (1.0 - eps) * (l - target_logit) + eps * (l - mean);
}

/* rows per parallel pass of the smoothed fast forward: their means wait on the stack for the
 * sum in row order */
enum { CE_ROW_BLOCK = 256 };

/* both forwards, their errors naming func */
static pytfm_status forward(const char *func, float *loss, float *lse, const float *logits,
                            const int64_t *targets, int64_t rows, int64_t vocab,
                            int64_t ignore_index, float label_smoothing) {
    PYTFM_TRY(pytfm__check_cross_entropy_forward(func, loss, lse, logits, targets, rows, vocab));
    PYTFM_TRY(pytfm__check_label_smoothing(func, label_smoothing));
    PYTFM_TRY(pytfm__check_indices(func, "targets", targets, rows, vocab, 1, ignore_index));
    const int64_t kept = count_kept(targets, rows, ignore_index);
    const double eps = label_smoothing;
    const pytfm__fast_kernels *k = pytfm__fast();
    if (k && eps == 0.0) {
        PYTFM_PARALLEL_ROWS(rows, vocab)
        for (int64_t i = 0; i < rows; i++) lse[i] = k->logsumexp(logits + i * vocab, vocab);
        double total = 0.0; // in row order, after the parallel part: the same at any thread count
        for (int64_t i = 0; i < rows; i++)
            if (targets[i] != ignore_index)
                total += (double)lse[i] - logits[i * vocab + targets[i]];
        *loss = kept ? (float)(total / (double)kept) : 0.0f;
        return PYTFM_STATUS_OK;
    }
    if (k) {
        double total = 0.0;
        for (int64_t i0 = 0; i0 < rows; i0 += CE_ROW_BLOCK) {
            const int64_t n = rows - i0 < CE_ROW_BLOCK ? rows - i0 : CE_ROW_BLOCK;
            double mean[CE_ROW_BLOCK];
            PYTFM_PARALLEL_ROWS(n, vocab)
            for (int64_t r = 0; r < n; r++) {
                const float *row = logits + (i0 + r) * vocab;
                lse[i0 + r] = k->logsumexp(row, vocab);
                mean[r] = targets[i0 + r] != ignore_index ? row_mean(row, vocab) : 0.0;
            }
            for (int64_t r = 0; r < n; r++) { // in row order, as above
                const int64_t i = i0 + r;
                if (targets[i] != ignore_index)
                    total += row_loss(lse[i], logits[i * vocab + targets[i]], mean[r], eps);
            }
        }
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
        if (targets[i] != ignore_index) {
            const double mean = eps != 0.0 ? row_mean(row, vocab) : 0.0;
            total += row_loss(l, row[targets[i]], mean, eps);
        }
    }
    *loss = kept ? (float)(total / (double)kept) : 0.0f;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_cross_entropy_smoothed_forward(float *loss, float *lse, const float *logits,
                                                  const int64_t *targets, int64_t rows,
                                                  int64_t vocab, int64_t ignore_index,
                                                  float label_smoothing) {
    return forward(__func__, loss, lse, logits, targets, rows, vocab, ignore_index,
                   label_smoothing);
}

pytfm_status pytfm_cross_entropy_forward(float *loss, float *lse, const float *logits,
                                         const int64_t *targets, int64_t rows, int64_t vocab,
                                         int64_t ignore_index) {
    return forward(__func__, loss, lse, logits, targets, rows, vocab, ignore_index, 0.0f);
}

/* both backwards, their errors naming func */
static pytfm_status backward(const char *func, float *dlogits, const float *logits,
                             const int64_t *targets, const float *lse, int64_t rows,
                             int64_t vocab, int64_t ignore_index, float label_smoothing,
                             float dloss) {
    PYTFM_TRY(pytfm__check_cross_entropy_backward(func, dlogits, logits, targets, lse, rows, vocab,
                                                  dloss));
    PYTFM_TRY(pytfm__check_label_smoothing(func, label_smoothing));
    PYTFM_TRY(pytfm__check_indices(func, "targets", targets, rows, vocab, 1, ignore_index));
    const int64_t kept = count_kept(targets, rows, ignore_index);
    const float scale = kept ? dloss / (float)kept : 0.0f;
    // what the target and every class take off the softmax: scale·(1 − ε) and scale·ε/vocab
    // (with ε = 0, scale and 0: the unsmoothed bits)
    const float on = scale * (1.0f - label_smoothing);
    const float off = scale * label_smoothing / (float)vocab;
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
            if (off != 0.0f)
                for (int64_t j = 0; j < vocab; j++) drow[j] -= off;
            drow[targets[i]] -= on;
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
        for (int64_t j = 0; j < vocab; j++) drow[j] = scale * expf(row[j] - lse[i]) - off;
        drow[targets[i]] -= on;
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_cross_entropy_smoothed_backward(float *dlogits, const float *logits,
                                                   const int64_t *targets, const float *lse,
                                                   int64_t rows, int64_t vocab,
                                                   int64_t ignore_index, float label_smoothing,
                                                   float dloss) {
    return backward(__func__, dlogits, logits, targets, lse, rows, vocab, ignore_index,
                    label_smoothing, dloss);
}

pytfm_status pytfm_cross_entropy_backward(float *dlogits, const float *logits,
                                          const int64_t *targets, const float *lse, int64_t rows,
                                          int64_t vocab, int64_t ignore_index, float dloss) {
    return backward(__func__, dlogits, logits, targets, lse, rows, vocab, ignore_index, 0.0f,
                    dloss);
}
