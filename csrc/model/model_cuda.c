/*
 * model_cuda.c — the GPU as model.c's device (PYTFM_DEVICE_CUDA): its table
 * (model_device.h) holds the CUDA twins of the kernels model.c runs on the CPU, and device
 * memory: the parameters and KV caches in cudaMalloc'd memory, the activations of a call in
 * stream scratch, copies and streams (cuda/device.h). model.c's forward pass runs on it as on
 * the CPU; its logits agree with the CPU model's to float32 rounding (the twins sum in other
 * orders than the C kernels), not bit for bit. The twins compute in float32 only, so a model
 * here has no BF16 precision. Compiled in a CUDA build only (csrc/core/cuda_stub.c answers
 * pytfm__cuda_model_device otherwise).
 */
#include "core/checks.h"
#include "device.h"
#include "model_device.h"

static pytfm_status to_device(const char *func, void *dst, const void *src, int64_t bytes,
                              void *stream) {
    return pytfm__cuda_copy(func, dst, src, bytes, PYTFM__TO_DEVICE, stream);
}

static pytfm_status to_host(const char *func, void *dst, const void *src, int64_t bytes,
                            void *stream) {
    return pytfm__cuda_copy(func, dst, src, bytes, PYTFM__TO_HOST, stream);
}

/* the model never makes BF16 copies on the GPU (model.c refuses the precision): w16 is NULL */
static pytfm_status linear(float *y, const float *x, const float *w, const uint16_t *w16,
                           const float *b, int64_t rows, int64_t in, int64_t out, void *stream) {
    (void)w16;
    return pytfm_linear_forward_cuda(y, x, w, b, rows, in, out, stream);
}

/* attention as pytfm.ops calls it: the multi-head kernel with Hkv = H and no window */
static pytfm_status attention(float *o, float *lse, const float *q, const float *k,
                              const float *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                              int64_t D, float scale, int32_t causal, int64_t window,
                              void *stream) {
    if (Hkv == H && window == 0)
        return pytfm_attention_forward_cuda(o, lse, q, k, v, B, T, H, D, scale, causal, stream);
    return pytfm_attention_gqa_forward_cuda(o, lse, q, k, v, B, T, H, Hkv, D, scale, causal,
                                            window, stream);
}

static pytfm_status decode(float *o, float *lse, const float *q, const float *k_cache,
                           const float *v_cache, int64_t B, int64_t n_new, int64_t H,
                           int64_t Hkv, int64_t D, int64_t Tmax, int64_t start, float scale,
                           int64_t window, void *stream) {
    if (Hkv == H && window == 0)
        return pytfm_attention_decode_cuda(o, lse, q, k_cache, v_cache, B, n_new, H, D, Tmax,
                                           start, scale, stream);
    return pytfm_attention_gqa_decode_cuda(o, lse, q, k_cache, v_cache, B, n_new, H, Hkv, D,
                                           Tmax, start, scale, window, stream);
}

static const pytfm__model_device gpu = {
    .host = 0,
    .alloc = pytfm__cuda_malloc,
    .release = pytfm__cuda_free,
    .scratch = pytfm__stream_scratch_bytes,
    .scratch_free = pytfm__stream_scratch_free,
    .to_device = to_device,
    .to_host = to_host,
    .stream_open = pytfm__cuda_stream_open,
    .stream_close = pytfm__cuda_stream_close,
    .sync = pytfm__cuda_sync,
    .layernorm = pytfm_layernorm_forward_cuda,
    .linear = linear,
    .qkv_split = pytfm_qkv_split_forward_cuda,
    .attention = attention,
    .cache_append = pytfm_attention_cache_append_cuda,
    .decode = decode,
    .gelu = pytfm_gelu_forward_cuda,
    .embedding = pytfm_embedding_forward_cuda,
    .rmsnorm = pytfm_rmsnorm_forward_cuda,
    .swiglu = pytfm_swiglu_forward_cuda,
    .rope_freq = pytfm_rope_freq_forward_cuda,
    .copy_cols = pytfm__cuda_copy_cols,
    .add_rows = pytfm__cuda_add_rows,
};

pytfm_status pytfm__cuda_model_device(const pytfm__model_device **device, const char *func) {
    int32_t devices = 0;
    PYTFM_TRY(pytfm_cuda_device_count(&devices));
    if (devices > 0) {
        *device = &gpu;
        return PYTFM_STATUS_OK;
    }
    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                       "%s: device PYTFM_DEVICE_CUDA: no CUDA GPU was found (no device, or no "
                       "NVIDIA driver)",
                       func);
}
