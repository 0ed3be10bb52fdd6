/*
 * cross_entropy.cu — softmax cross-entropy from logits on the GPU; the twin of
 * csrc/cross_entropy.c.
 *
 *   logits [rows, vocab], targets [rows], lse [rows] (saved), loss [1] (device memory)
 *   forward:  lse_i = max_i + log Σ_j exp(logits_ij − max_i)            (a row kernel)
 *             loss  = (1/kept) Σ_{i kept} (lse_i − logits_{i, t_i})    (one block, fixed order)
 *   backward: dlogits_ij = dloss/kept · (exp(logits_ij − lse_i) − [j = t_i]), 0 if ignored
 * kept, the number of rows not ignored, is what the backward needs before it can write a
 * row; each block counts the targets itself (a block reduction) and then walks its rows, and
 * the grid is capped at 256 blocks so that counting costs about 256·rows reads in all.
 * A target outside [0, vocab) that is not ignore_index is not checked on the host (it is
 * device memory): the loss becomes NaN.
 */
#include "pytfm_cuda.cuh"

template <bool kWarp>
static __global__ void cross_entropy_lse_kernel(float *lse, const float *logits, int64_t rows,
                                                int64_t vocab) {
    __shared__ float scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const pytfm__max_sumexp row = pytfm__row_max_sumexp(team, logits + r * vocab, vocab,
                                                            scratch);
        if (team.rank == 0) lse[r] = row.max + logf(row.sumexp);
    }
}

/* one block: the mean of lse_i − logits[i, t_i] over the rows not ignored */
static __global__ void cross_entropy_loss_kernel(float *loss, const float *lse,
                                                 const float *logits, const int64_t *targets,
                                                 int64_t rows, int64_t vocab,
                                                 int64_t ignore_index) {
    __shared__ double scratch[32];
    double total = 0.0, kept = 0.0;
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
        const int64_t t = targets[i];
        if (t == ignore_index) continue;
        total += t >= 0 && t < vocab ? (double)lse[i] - (double)logits[i * vocab + t]
                                     : (double)NAN;
        kept += 1.0;
    }
    total = pytfm__block_sum(total, scratch);
    kept = pytfm__block_sum(kept, scratch);
    if (threadIdx.x == 0) *loss = kept > 0.0 ? (float)(total / kept) : 0.0f;
}

extern "C" pytfm_status pytfm_cross_entropy_forward_cuda(float *loss, float *lse,
                                                         const float *logits,
                                                         const int64_t *targets, int64_t rows,
                                                         int64_t vocab, int64_t ignore_index,
                                                         void *stream) {
    PYTFM_TRY(pytfm__check_cross_entropy_forward(__func__, loss, lse, logits, targets, rows,
                                                 vocab));
    if (rows > 0)
        PYTFM_TRY(PYTFM_LAUNCH_ROWS(cross_entropy_lse_kernel<true>,
                                    cross_entropy_lse_kernel<false>, rows, vocab,
                                    PYTFM_MAX_BLOCKS, stream, lse, logits, rows, vocab));
    return PYTFM_LAUNCH(cross_entropy_loss_kernel, dim3(1), dim3(PYTFM_ROW_THREADS), 0, stream,
                        loss, lse, logits, targets, rows, vocab, ignore_index);
}

enum { BACKWARD_BLOCKS = PYTFM_MAX_BLOCKS < 256 ? PYTFM_MAX_BLOCKS : 256 };

template <bool kWarp>
static __global__ void cross_entropy_backward_kernel(float *dlogits, const float *logits,
                                                     const int64_t *targets, const float *lse,
                                                     int64_t rows, int64_t vocab,
                                                     int64_t ignore_index, float dloss) {
    __shared__ long long kept_scratch[32];
    long long kept = 0;
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) kept += targets[i] != ignore_index;
    kept = pytfm__block_sum(kept, kept_scratch);
    const float scale = kept ? dloss / (float)kept : 0.0f;
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *row = logits + r * vocab;
        float *drow = dlogits + r * vocab;
        const int64_t t = targets[r];
        const float l = lse[r];
        for (int64_t j = team.rank; j < vocab; j += team.size)
            drow[j] = t == ignore_index ? 0.0f : scale * (expf(row[j] - l) - (float)(j == t));
    }
}

extern "C" pytfm_status pytfm_cross_entropy_backward_cuda(float *dlogits, const float *logits,
                                                          const int64_t *targets,
                                                          const float *lse, int64_t rows,
                                                          int64_t vocab, int64_t ignore_index,
                                                          float dloss, void *stream) {
    PYTFM_TRY(pytfm__check_cross_entropy_backward(__func__, dlogits, logits, targets, lse, rows,
                                                  vocab, dloss));
    if (rows == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH_ROWS(cross_entropy_backward_kernel<true>,
                             cross_entropy_backward_kernel<false>, rows, vocab, BACKWARD_BLOCKS,
                             stream, dlogits, logits, targets, lse, rows, vocab, ignore_index,
                             dloss);
}
