/*
 * device.h — what C code (csrc/model/model_cuda.c) and the kernels' launchers need of the
 * CUDA runtime beyond the twins, without its headers: stream scratch (from a workspace),
 * device memory, copies, streams, and one kernel the twins do not have (a row add).
 * Internal: defined in cuda/device.cu, compiled only in a CUDA build (and for the emulator).
 * Each returns a pytfm_status whose message names func, the public function the user called.
 */
#ifndef PYTFM_CUDA_DEVICE_H
#define PYTFM_CUDA_DEVICE_H

#include <stdint.h>

#include "pytfm_core.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { PYTFM__TO_DEVICE = 0, PYTFM__TO_HOST = 1, PYTFM__ON_DEVICE = 2 };

/* *p = bytes of scratch for one call on stream, NULL when bytes is 0: the start of the
 * workspace bound to stream (pytfm_cuda_workspace_set) when it holds them, else
 * cudaMallocAsync; a status naming func (OUT_OF_MEMORY when the device has none left). A call
 * holds one scratch region at a time (every call may then start at the workspace's first
 * byte). */
pytfm_status pytfm__stream_scratch_bytes(const char *func, void **p, int64_t bytes,
                                         void *stream);
/* Give scratch back in stream order, after the kernels that use it: the workspace's stays
 * bound, an allocation is freed (cudaFreeAsync); the status st of the work before it, else
 * of the free. */
pytfm_status pytfm__stream_scratch_free(const char *func, void *p, pytfm_status st,
                                        void *stream);

/* *p = bytes of device memory (cudaMalloc), or NULL and PYTFM_STATUS_OUT_OF_MEMORY */
pytfm_status pytfm__cuda_malloc(const char *func, void **p, int64_t bytes);
/* cudaFree (NULL: nothing); an error is dropped: there is nothing left to do about it */
void pytfm__cuda_free(void *p);
/* bytes from src to dst on stream (kind: PYTFM__TO_DEVICE, _TO_HOST, _ON_DEVICE), queued */
pytfm_status pytfm__cuda_copy(const char *func, void *dst, const void *src, int64_t bytes,
                              int32_t kind, void *stream);
/* a non-blocking stream of its own, and its end (after the work queued on it) */
pytfm_status pytfm__cuda_stream_open(const char *func, void **stream);
pytfm_status pytfm__cuda_stream_close(const char *func, void *stream);
/* wait for the work queued on stream; a fault of a kernel surfaces here */
pytfm_status pytfm__cuda_sync(const char *func, void *stream);
/* x[r, j] += y[(offset + r % period), j] for r < rows, j < cols: the residual adds (period =
 * rows, offset 0) and the sinusoidal table added to the embeddings (period T, offset start) */
pytfm_status pytfm__cuda_add_rows(const char *func, float *x, const float *y, int64_t rows,
                                  int64_t cols, int64_t period, int64_t offset, void *stream);
/* dst[r, j] = src[r, offset + j] for r < rows, j < cols, src of src_cols columns */
pytfm_status pytfm__cuda_copy_cols(const char *func, float *dst, const float *src, int64_t rows,
                                   int64_t src_cols, int64_t offset, int64_t cols,
                                   void *stream);

#ifdef __cplusplus
}
#endif

#endif /* PYTFM_CUDA_DEVICE_H */
