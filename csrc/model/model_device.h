/*
 * model_device.h — what model.c needs of the device a model runs on (internal, not exported):
 * a table of the ops of its forward pass and of the memory they run in. model.c runs the one
 * forward pass, and its sessions, through a table: model_cpu.c holds the CPU's (the public
 * kernels of pytfm_kernels.h, host memory), model_cuda.c the GPU's (their CUDA twins of
 * pytfm_cuda.h, device memory). Every op takes the public kernel's arguments, in its order,
 * then the stream (the CPU has none: NULL); func names the public function the user called.
 */
#ifndef PYTFM_MODEL_DEVICE_H
#define PYTFM_MODEL_DEVICE_H

#include "pytfm.h"

typedef struct pytfm__model_device {
    int host; /* 1: the device computes in host memory (the caller's tokens and logits in place) */
    /* memory that outlives a call (parameters, KV caches): *p = bytes, or a status */
    pytfm_status (*alloc)(const char *func, void **p, int64_t bytes);
    void (*release)(void *p); /* NULL: nothing */
    /* the scratch of one call, on stream; scratch_free returns st, else its own failure */
    pytfm_status (*scratch)(const char *func, void **p, int64_t bytes, void *stream);
    pytfm_status (*scratch_free)(const char *func, void *p, pytfm_status st, void *stream);
    /* bytes from host memory to the device, and back, queued on stream */
    pytfm_status (*to_device)(const char *func, void *dst, const void *src, int64_t bytes,
                              void *stream);
    pytfm_status (*to_host)(const char *func, void *dst, const void *src, int64_t bytes,
                            void *stream);
    pytfm_status (*stream_open)(const char *func, void **stream);
    pytfm_status (*stream_close)(const char *func, void *stream);
    pytfm_status (*sync)(const char *func, void *stream); /* the work queued on stream done */

    /* the ops: pytfm_layernorm_forward, ... with a stream */
    pytfm_status (*layernorm)(float *y, float *mean, float *rstd, const float *x, const float *w,
                              const float *b, int64_t rows, int64_t cols, float eps,
                              void *stream);
    /* pytfm_linear_forward, or, where w16 (w's BF16 copy) is not NULL, its BF16 form
     * (pytfm_linear_forward_ex in PYTFM_PRECISION_BF16) reading w16 for one-row products; w
     * NULL with w16 set: the weights in BF16 only (the CPU: a model that keeps BF16) */
    pytfm_status (*linear)(float *y, const float *x, const float *w, const uint16_t *w16,
                           const float *b, int64_t rows, int64_t in, int64_t out, void *stream);
    /* pytfm_linear_forward_q8w: W given as int8 blocks q [out, in] and their fp16 scales (a
     * model in PYTFM_PRECISION_INT8; the CPU only: NULL on the GPU, whose model refuses INT8) */
    pytfm_status (*linear_q8)(float *y, const float *x, const int8_t *q, const uint16_t *scales,
                              const float *b, int64_t rows, int64_t in, int64_t out,
                              void *stream);
    pytfm_status (*qkv_split)(float *q, float *k, float *v, const float *qkv,
                              const int64_t *pos, int64_t B, int64_t T, int64_t H, int64_t D,
                              int64_t pos_stride, double base, int32_t rope, void *stream);
    /* attention: pytfm_attention_gqa_forward's arguments; with Hkv = H and window 0,
     * pytfm_attention_forward (as pytfm.ops calls it) */
    pytfm_status (*attention)(float *o, float *lse, const float *q, const float *k,
                              const float *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                              int64_t D, float scale, int32_t causal, int64_t window,
                              void *stream);
    pytfm_status (*cache_append)(float *k_cache, float *v_cache, const float *k, const float *v,
                                 int64_t B, int64_t n_new, int64_t H, int64_t D, int64_t Tmax,
                                 int64_t start, void *stream);
    /* pytfm_attention_gqa_decode's arguments, as attention */
    pytfm_status (*decode)(float *o, float *lse, const float *q, const float *k_cache,
                           const float *v_cache, int64_t B, int64_t n_new, int64_t H,
                           int64_t Hkv, int64_t D, int64_t Tmax, int64_t start, float scale,
                           int64_t window, void *stream);
    /* pytfm_attention_cache_append_bf16 and pytfm_attention_gqa_decode_bf16kv: a session's
     * BF16 KV cache (the CPU only: NULL on the GPU, whose sessions refuse it) */
    pytfm_status (*cache_append_bf16)(uint16_t *k_cache, uint16_t *v_cache, const float *k,
                                      const float *v, int64_t B, int64_t n_new, int64_t H,
                                      int64_t D, int64_t Tmax, int64_t start, void *stream);
    pytfm_status (*decode_bf16)(float *o, float *lse, const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, int64_t B, int64_t n_new, int64_t H,
                                int64_t Hkv, int64_t D, int64_t Tmax, int64_t start, float scale,
                                int64_t window, void *stream);
    pytfm_status (*gelu)(float *y, const float *x, int64_t count, void *stream);
    pytfm_status (*embedding)(float *y, const int64_t *ids, const float *table, int64_t rows,
                              int64_t vocab, int64_t dim, void *stream);
    /* pytfm_embedding_forward_q8w: the table in int8 blocks (INT8; the CPU only, as linear_q8) */
    pytfm_status (*embedding_q8)(float *y, const int64_t *ids, const int8_t *q,
                                 const uint16_t *scales, int64_t rows, int64_t vocab, int64_t dim,
                                 void *stream);
    pytfm_status (*rmsnorm)(float *y, float *rstd, const float *x, const float *w, int64_t rows,
                            int64_t cols, float eps, void *stream);
    pytfm_status (*swiglu)(float *h, const float *g, const float *u, int64_t count,
                           void *stream);
    pytfm_status (*rope_freq)(float *y, const float *x, const int64_t *pos,
                              const float *inv_freq, int64_t B, int64_t T, int64_t H, int64_t D,
                              int64_t pos_stride, void *stream);
    /* dst[r, j] = src[r, offset + j] for r < rows, j < cols, src of src_cols columns: a block of
     * columns made contiguous (the Llama family's q, k and v out of their joint product) */
    pytfm_status (*copy_cols)(const char *func, float *dst, const float *src, int64_t rows,
                              int64_t src_cols, int64_t offset, int64_t cols, void *stream);
    /* x[r, j] += y[(offset + r % period), j] for r < rows, j < cols: the residual adds (period
     * rows, offset 0) and a position table added to the embeddings (period T, offset start) */
    pytfm_status (*add_rows)(const char *func, float *x, const float *y, int64_t rows,
                             int64_t cols, int64_t period, int64_t offset, void *stream);
} pytfm__model_device;

/* The CPU's table (model_cpu.c). */
extern const pytfm__model_device pytfm__cpu_model_device;

/* The GPU's table into *device when a model can be opened there (a CUDA build and a device);
 * else PYTFM_STATUS_NOT_SUPPORTED, "<func>: device PYTFM_DEVICE_CUDA: <why not>". Defined in
 * model_cuda.c in a CUDA build, in csrc/core/cuda_stub.c otherwise. */
pytfm_status pytfm__cuda_model_device(const pytfm__model_device **device, const char *func);

#endif /* PYTFM_MODEL_DEVICE_H */
