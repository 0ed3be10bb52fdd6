/*
 * embedding.cu — table lookup on the GPU; the twin of csrc/embedding.c.
 *
 *   ids [rows], table [vocab, dim], y [rows, dim]
 *   forward:  y[i, :] = table[ids[i], :]       (one thread per element of y)
 *   backward: dtable[ids[i], :] += dy[i, :]     (a scatter-add; rows of repeated ids add up)
 * The backward gives each column j of the table to one thread, which walks i = 0 … rows−1: no
 * two threads ever touch one element, so no atomics, and the sums come in the order of i, the
 * same bits as the CPU twin. ids are device memory and not checked on the host: an id outside
 * [0, vocab) gives a NaN row in the forward and is skipped by the backward.
 */
#include "pytfm_cuda.cuh"

static __global__ void embedding_forward_kernel(float *y, const int64_t *ids, const float *table,
                                                int64_t rows, int64_t vocab, int64_t dim) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * dim;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t id = ids[e / dim];
        y[e] = id >= 0 && id < vocab ? table[id * dim + e % dim] : NAN;
    }
}

extern "C" pytfm_status pytfm_embedding_forward_cuda(float *y, const int64_t *ids,
                                                     const float *table, int64_t rows,
                                                     int64_t vocab, int64_t dim, void *stream) {
    PYTFM_TRY(pytfm__check_embedding_forward(__func__, y, ids, table, rows, vocab, dim));
    if (rows == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(embedding_forward_kernel,
                        dim3(pytfm__blocks(rows * dim, 256, PYTFM_MAX_BLOCKS)), dim3(256), 0,
                        stream, y, ids, table, rows, vocab, dim);
}

static __global__ void embedding_backward_kernel(float *dtable, const float *dy,
                                                 const int64_t *ids, int64_t rows, int64_t vocab,
                                                 int64_t dim) {
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < dim;
         j += (int64_t)gridDim.x * blockDim.x)
        for (int64_t i = 0; i < rows; i++) {
            const int64_t id = ids[i];
            if (id >= 0 && id < vocab) dtable[id * dim + j] += dy[i * dim + j];
        }
}

extern "C" pytfm_status pytfm_embedding_backward_cuda(float *dtable, const float *dy,
                                                      const int64_t *ids, int64_t rows,
                                                      int64_t vocab, int64_t dim, void *stream) {
    PYTFM_TRY(pytfm__check_embedding_backward(__func__, dtable, dy, ids, rows, vocab, dim));
    if (rows == 0) return PYTFM_STATUS_OK;
    return PYTFM_LAUNCH(embedding_backward_kernel, dim3(pytfm__blocks(dim, 64, PYTFM_MAX_BLOCKS)),
                        dim3(64), 0, stream, dtable, dy, ids, rows, vocab, dim);
}
