/*
 * model_cpu.c — the CPU as model.c's device (PYTFM_DEVICE_CPU): its table (model_device.h)
 * holds the public kernels, each called with the arguments model.c gives its twin on the GPU
 * (the stream, which the CPU has none of, dropped), and host memory: allocations and copies
 * are malloc and memcpy, streams nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "model_device.h"

static pytfm_status alloc(const char *func, void **p, int64_t bytes) {
    *p = pytfm__scratch(func, bytes, 1);
    return *p ? PYTFM_STATUS_OK : PYTFM_STATUS_OUT_OF_MEMORY;
}

static pytfm_status scratch(const char *func, void **p, int64_t bytes, void *stream) {
    (void)stream;
    return alloc(func, p, bytes);
}

static pytfm_status scratch_free(const char *func, void *p, pytfm_status st, void *stream) {
    (void)func, (void)stream;
    free(p);
    return st;
}

static pytfm_status copy(const char *func, void *dst, const void *src, int64_t bytes,
                         void *stream) {
    (void)func, (void)stream;
    memcpy(dst, src, (size_t)bytes);
    return PYTFM_STATUS_OK;
}

static pytfm_status stream_open(const char *func, void **stream) {
    (void)func;
    *stream = NULL;
    return PYTFM_STATUS_OK;
}

/* a stream's close, and waiting for one */
static pytfm_status stream_done(const char *func, void *stream) {
    (void)func, (void)stream;
    return PYTFM_STATUS_OK;
}

static pytfm_status layernorm(float *y, float *mean, float *rstd, const float *x,
                              const float *w, const float *b, int64_t rows, int64_t cols,
                              float eps, void *stream) {
    (void)stream;
    return pytfm_layernorm_forward(y, mean, rstd, x, w, b, rows, cols, eps);
}

/* as pytfm.nn.Linear.forward in the model's precision (w16 there exactly in BF16) */
static pytfm_status linear(float *y, const float *x, const float *w, const uint16_t *w16,
                           const float *b, int64_t rows, int64_t in, int64_t out,
                           void *stream) {
    (void)stream;
    if (!w16) return pytfm_linear_forward(y, x, w, b, rows, in, out);
    return pytfm__linear_forward_bf16("pytfm_linear_forward_ex", y, x, w, w16, b, rows, in, out);
}

static pytfm_status linear_q8(float *y, const float *x, const int8_t *q, const uint16_t *scales,
                              const float *b, int64_t rows, int64_t in, int64_t out,
                              void *stream) {
    (void)stream;
    return pytfm_linear_forward_q8w(y, x, q, scales, b, rows, in, out);
}

static pytfm_status qkv_split(float *q, float *k, float *v, const float *qkv,
                              const int64_t *pos, int64_t B, int64_t T, int64_t H, int64_t D,
                              int64_t pos_stride, double base, int32_t rope, void *stream) {
    (void)stream;
    return pytfm_qkv_split_forward(q, k, v, qkv, pos, B, T, H, D, pos_stride, base, rope);
}

static pytfm_status attention(float *o, float *lse, const float *q, const float *k,
                              const float *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                              int64_t D, float scale, int32_t causal, int64_t window,
                              void *stream) {
    (void)stream;
    if (Hkv == H && window == 0)
        return pytfm_attention_forward(o, lse, q, k, v, B, T, H, D, scale, causal);
    return pytfm_attention_gqa_forward(o, lse, q, k, v, B, T, H, Hkv, D, scale, causal, window);
}

static pytfm_status cache_append(float *k_cache, float *v_cache, const float *k,
                                 const float *v, int64_t B, int64_t n_new, int64_t H,
                                 int64_t D, int64_t Tmax, int64_t start, void *stream) {
    (void)stream;
    return pytfm_attention_cache_append(k_cache, v_cache, k, v, B, n_new, H, D, Tmax, start);
}

static pytfm_status decode(float *o, float *lse, const float *q, const float *k_cache,
                           const float *v_cache, int64_t B, int64_t n_new, int64_t H,
                           int64_t Hkv, int64_t D, int64_t Tmax, int64_t start, float scale,
                           int64_t window, void *stream) {
    (void)stream;
    if (Hkv == H && window == 0)
        return pytfm_attention_decode(o, lse, q, k_cache, v_cache, B, n_new, H, D, Tmax, start,
                                      scale);
    return pytfm_attention_gqa_decode(o, lse, q, k_cache, v_cache, B, n_new, H, Hkv, D, Tmax,
                                      start, scale, window);
}

static pytfm_status cache_append_bf16(uint16_t *k_cache, uint16_t *v_cache, const float *k,
                                      const float *v, int64_t B, int64_t n_new, int64_t H,
                                      int64_t D, int64_t Tmax, int64_t start, void *stream) {
    (void)stream;
    return pytfm_attention_cache_append_bf16(k_cache, v_cache, k, v, B, n_new, H, D, Tmax,
                                             start);
}

static pytfm_status decode_bf16(float *o, float *lse, const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, int64_t B, int64_t n_new, int64_t H,
                                int64_t Hkv, int64_t D, int64_t Tmax, int64_t start, float scale,
                                int64_t window, void *stream) {
    (void)stream;
    return pytfm_attention_gqa_decode_bf16kv(o, lse, q, k_cache, v_cache, B, n_new, H, Hkv, D,
                                             Tmax, start, scale, window);
}

static pytfm_status gelu(float *y, const float *x, int64_t count, void *stream) {
    (void)stream;
    return pytfm_gelu_forward(y, x, count);
}

static pytfm_status embedding(float *y, const int64_t *ids, const float *table,
                              int64_t rows, int64_t vocab, int64_t dim, void *stream) {
    (void)stream;
    return pytfm_embedding_forward(y, ids, table, rows, vocab, dim);
}

static pytfm_status embedding_q8(float *y, const int64_t *ids, const int8_t *q,
                                 const uint16_t *scales, int64_t rows, int64_t vocab, int64_t dim,
                                 void *stream) {
    (void)stream;
    return pytfm_embedding_forward_q8w(y, ids, q, scales, rows, vocab, dim);
}

static pytfm_status rmsnorm(float *y, float *rstd, const float *x, const float *w, int64_t rows,
                            int64_t cols, float eps, void *stream) {
    (void)stream;
    return pytfm_rmsnorm_forward(y, rstd, x, w, rows, cols, eps);
}

static pytfm_status swiglu(float *h, const float *g, const float *u, int64_t count,
                           void *stream) {
    (void)stream;
    return pytfm_swiglu_forward(h, g, u, count);
}

static pytfm_status rope_freq(float *y, const float *x, const int64_t *pos,
                              const float *inv_freq, int64_t B, int64_t T, int64_t H, int64_t D,
                              int64_t pos_stride, void *stream) {
    (void)stream;
    return pytfm_rope_freq_forward(y, x, pos, inv_freq, B, T, H, D, pos_stride);
}

static pytfm_status copy_cols(const char *func, float *dst, const float *src, int64_t rows,
                              int64_t src_cols, int64_t offset, int64_t cols, void *stream) {
    (void)func, (void)stream;
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * cols, src + r * src_cols + offset, (size_t)cols * sizeof(float));
    return PYTFM_STATUS_OK;
}

static pytfm_status add_rows(const char *func, float *x, const float *y, int64_t rows,
                             int64_t cols, int64_t period, int64_t offset, void *stream) {
    (void)func, (void)stream;
    for (int64_t r = 0; r < rows; r++) {
        const float *add = y + (offset + r % period) * cols;
        for (int64_t j = 0; j < cols; j++) x[r * cols + j] += add[j];
    }
    return PYTFM_STATUS_OK;
}

const pytfm__model_device pytfm__cpu_model_device = {
    .host = 1,
    .alloc = alloc,
    .release = free,
    .scratch = scratch,
    .scratch_free = scratch_free,
    .to_device = copy,
    .to_host = copy,
    .stream_open = stream_open,
    .stream_close = stream_done,
    .sync = stream_done,
    .layernorm = layernorm,
    .linear = linear,
    .linear_q8 = linear_q8,
    .qkv_split = qkv_split,
    .attention = attention,
    .cache_append = cache_append,
    .decode = decode,
    .cache_append_bf16 = cache_append_bf16,
    .decode_bf16 = decode_bf16,
    .gelu = gelu,
    .embedding = embedding,
    .embedding_q8 = embedding_q8,
    .rmsnorm = rmsnorm,
    .swiglu = swiglu,
    .rope_freq = rope_freq,
    .copy_cols = copy_cols,
    .add_rows = add_rows,
};
