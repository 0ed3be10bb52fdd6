/*
 * pytfm_cuda.h — the GPU twins of the kernels of pytfm_kernels.h (and the device count), on
 * device pointers and a CUDA stream; no CUDA header is needed to include it.
 *
 * Everything between this header's PYTFM_CDEF markers is read verbatim by the cffi builder
 * (pytfm/_build_ffi.py), so it must stay plain declarations: no macros but PYTFM_API.
 */
#ifndef PYTFM_CUDA_H
#define PYTFM_CUDA_H

#include "pytfm_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PYTFM_CDEF_BEGIN */

/* ---- CUDA: the GPU twins of the kernels above ---------------------------------------- */
/* Each pytfm_<op>_<direction>_cuda takes the arguments of its CPU twin, in the same order and
 * with the same shapes and rules, as DEVICE pointers, plus `stream` last: a cudaStream_t
 * (NULL: the legacy default stream), passed as void * so that this header needs no CUDA
 * headers. They are asynchronous: they return once the work is queued on the stream. The
 * status covers the arguments and the launch; a fault while the kernel runs surfaces at the
 * next synchronisation (pytfm_cuda_stream_synchronize). Differences from the CPU twins:
 *   - index arrays (ids, targets) live on the device and are not checked: checking would need
 *     a copy to the host. An id outside [0, vocab) makes its row of y NaN and is skipped by
 *     the backward; a target outside [0, vocab) (and not ignore_index) makes the loss NaN.
 *   - results agree with the CPU kernels to float32 rounding, not bit for bit (sums are
 *     combined in another order); each CUDA kernel gives the same bits on every run.
 *   - scratch ("stream scratch" below) comes from the workspace bound to the stream when one
 *     is (pytfm_cuda_workspace_set) and holds it, else from cudaMallocAsync on the stream,
 *     given back (cudaFreeAsync) in stream order before the call returns. With a workspace
 *     large enough, a twin allocates nothing and calls nothing that waits: a training step
 *     can then be captured as a CUDA graph. No twin synchronises the stream or the device.
 * In a build without CUDA (nvcc was not found, or PYTFM_CUDA=0) every _cuda function and
 * every pytfm_cuda_ one but pytfm_cuda_device_count return PYTFM_STATUS_NOT_SUPPORTED and say
 * so in pytfm_last_error() (the build generates them from this header);
 * pytfm_get_build_info() tells which build this is.
 */

/* The number of CUDA devices this process can use: 0, not an error, where there is no device
 * or no driver, and in a build without CUDA. */
PYTFM_API pytfm_status pytfm_cuda_device_count(int32_t *count);

/* Wait for the work queued on stream (NULL: the default stream); a fault raised by a kernel
 * comes back here as PYTFM_STATUS_CUDA_ERROR with the CUDA runtime's message. */
PYTFM_API pytfm_status pytfm_cuda_stream_synchronize(void *stream);

/* Bind the device buffer [bytes] (256-byte aligned, as cudaMalloc and CuPy give) to stream:
 * from now on each twin called on stream takes its stream scratch from the start of buffer
 * when it holds it (the scratch of one call is released before the call returns, so every
 * call may use it all), and allocates it as without a workspace when it does not. buffer NULL
 * with bytes 0: a binding that holds nothing and only measures (pytfm_cuda_workspace_get).
 * Binding again replaces the binding and its counts; the buffer stays the caller's (it must
 * outlive the binding and the work queued on stream). Like a cuBLAS handle's workspace, it
 * serves one host thread at a time: threads that call twins at once use streams of their own.
 * At most 64 streams have a binding at a time (more is PYTFM_STATUS_INVALID_ARGUMENT).
 * pytfm.nn.TrainStep sizes one from a first step and binds it to its stream. */
PYTFM_API pytfm_status pytfm_cuda_workspace_set(void *stream, void *buffer, int64_t bytes);

/* Remove stream's binding, if any: its twins allocate their scratch again. */
PYTFM_API pytfm_status pytfm_cuda_workspace_clear(void *stream);

/* stream's binding: *bytes the buffer's size (-1: no binding), *need the most stream scratch
 * one call on stream asked for since the binding, *misses the calls whose scratch the buffer
 * could not hold (they allocated it); 0 and 0 without a binding. */
PYTFM_API pytfm_status pytfm_cuda_workspace_get(void *stream, int64_t *bytes, int64_t *need,
                                                int64_t *misses);

/* As pytfm_sgemm, on the GPU (cuda/sgemm.cu): 128×128 tiles of C per block (64×64 when those
 * cannot fill the GPU), 8×8 outputs per thread in registers, float4 loads where a base is
 * 16-byte aligned and its rows a multiple of 4 floats long (scalar ones otherwise), double
 * buffered shared tiles (cp.async on sm_80+); any m, n, k >= 0 and every transpose, with no
 * transposing copy and no scratch. Sums k in order with fmaf, as pytfm_sgemm_plain_cuda. */
PYTFM_API pytfm_status pytfm_sgemm_cuda(float *c, const float *a, const float *b, int64_t m,
                                        int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                                        float beta, void *stream);

/* The plain tiled kernel (64×64 tiles, 4×4 outputs per thread, n <= 65535·64), kept as the
 * oracle pytfm_sgemm_cuda is tested against, as pytfm_sgemm_plain is on the CPU; same
 * arguments. Tests: tests/cuda/test_cuda_sgemm.py. */
PYTFM_API pytfm_status pytfm_sgemm_plain_cuda(float *c, const float *a, const float *b,
                                              int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                              int32_t trans_b, float beta, void *stream);

PYTFM_API pytfm_status pytfm_linear_forward_cuda(float *y, const float *x, const float *w,
                                                 const float *b, int64_t rows, int64_t in,
                                                 int64_t out, void *stream);

/* As pytfm_sgemm_ex, on the GPU. PYTFM_PRECISION_FP32: pytfm_sgemm_cuda, its bits.
 * PYTFM_PRECISION_TF32 and PYTFM_PRECISION_BF16 (cuda/sgemm_tc.cu): on the tensor cores
 * (mma.sync m16n8k8 TF32, m16n8k16 BF16; sm_80 and newer), C = β·C + Σ_p r(op(A)[i, p])·
 * r(op(B)[p, j]) with r the rounding of the precision (TF32: to nearest, ties away from zero,
 * cvt.rna; BF16: pytfm_round_bf16's, to nearest even, but float32 subnormals kept, not
 * flushed) applied as the inputs are read (A and B stay float32 and unchanged), each product
 * exact in float32 and the sums float32 (in the order of the mma instructions: not
 * pytfm_sgemm_ex's bits). 128×128 tiles per block, cp.async tiles, any m, n, k >= 0, every
 * transpose, any float alignment. Scratch: none, but for the larger BF16 products, which round
 * A and B into BF16 copies in stream scratch first (2·(m·k + k·n) bytes, each row padded to a
 * multiple of 8 elements) and multiply those as pytfm_gemm_bf16_cuda does: the same bits as
 * rounding in the block, whichever is taken (cuda/sgemm_tc.cu says where it pays). */
PYTFM_API pytfm_status pytfm_sgemm_ex_cuda(float *c, const float *a, const float *b, int64_t m,
                                           int64_t n, int64_t k, int32_t trans_a,
                                           int32_t trans_b, float beta, int32_t precision,
                                           void *stream);

/* C [m, n] = β·C + op(A)·op(B) on BF16 operands, the like of cuBLAS's BF16 GEMM with FP32 C
 * and FP32 sums (cuda/sgemm_tc.cu, the tensor cores, sm_80 and newer): a [m, k] ([k, m] with
 * trans_a) and b [k, n] ([n, k] with trans_b) hold BF16 values as their raw bits (the upper
 * half of a float32's; a NaN stays a NaN), C is float32, accumulated into (β = 0: C is only
 * written, never read). C = β·C + Σ_p A[i, p]·B[p, j], each product exact in float32 and summed
 * in float32 in the order of the mma instructions: for BF16 values the bits of
 * pytfm_sgemm_ex_cuda at PYTFM_PRECISION_BF16 on their float32 widening. Any m, n, k >= 0,
 * every transpose; 16-byte cp.async where a base is 16-byte aligned and its rows a multiple of
 * 8 elements, 4-byte ones where both are even, 2-byte loads otherwise (a view offset by one
 * element); no scratch. C must not overlap a or b. */
PYTFM_API pytfm_status pytfm_gemm_bf16_cuda(float *c, const uint16_t *a, const uint16_t *b,
                                            int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                            int32_t trans_b, float beta, void *stream);

/* As pytfm_linear_forward_ex, pytfm_linear_gelu_forward_ex and pytfm_linear_backward_ex, on
 * the GPU: PYTFM_PRECISION_FP32 gives the bits of the twins without _ex; TF32 and BF16 run
 * each product (x·Wᵀ; dy·W and dyᵀ·x) as pytfm_sgemm_ex_cuda does, the bias, the GELU and
 * db (the column sums of dy, unrounded) as the twins without _ex. Scratch: theirs, and that
 * of their BF16 products (pytfm_sgemm_ex_cuda's). */
PYTFM_API pytfm_status pytfm_linear_forward_ex_cuda(float *y, const float *x, const float *w,
                                                    const float *b, int64_t rows, int64_t in,
                                                    int64_t out, int32_t precision,
                                                    void *stream);

PYTFM_API pytfm_status pytfm_linear_gelu_forward_ex_cuda(float *y, float *h, const float *x,
                                                         const float *w, const float *b,
                                                         int64_t rows, int64_t in, int64_t out,
                                                         int32_t precision, void *stream);

PYTFM_API pytfm_status pytfm_linear_backward_ex_cuda(float *dx, float *dw, float *db,
                                                     const float *dy, const float *x,
                                                     const float *w, int64_t rows, int64_t in,
                                                     int64_t out, int32_t precision,
                                                     void *stream);

/* db, when not NULL, is the two-stage column sum of pytfm_cuda.cuh (partials in stream
 * scratch). */
PYTFM_API pytfm_status pytfm_linear_backward_cuda(float *dx, float *dw, float *db,
                                                  const float *dy, const float *x,
                                                  const float *w, int64_t rows, int64_t in,
                                                  int64_t out, void *stream);

PYTFM_API pytfm_status pytfm_softmax_forward_cuda(float *y, const float *x, int64_t rows,
                                                  int64_t cols, void *stream);

PYTFM_API pytfm_status pytfm_softmax_backward_cuda(float *dx, const float *dy, const float *y,
                                                   int64_t rows, int64_t cols, void *stream);

PYTFM_API pytfm_status pytfm_layernorm_forward_cuda(float *y, float *mean, float *rstd,
                                                    const float *x, const float *w,
                                                    const float *b, int64_t rows, int64_t cols,
                                                    float eps, void *stream);

/* dw and db are accumulated by a column reduction in a fixed order (its partial sums in stream
 * scratch): no atomics, same bits on every run. */
PYTFM_API pytfm_status pytfm_layernorm_backward_cuda(float *dx, float *dw, float *db,
                                                     const float *dy, const float *x,
                                                     const float *w, const float *mean,
                                                     const float *rstd, int64_t rows,
                                                     int64_t cols, void *stream);

/* The angles come from a table of cos and sin per position row (T rows for pos [T], B·T for
 * [B, T]) made on the device in double and rounded to float, as the CPU does, in 4·rows·D
 * bytes of stream scratch. */
PYTFM_API pytfm_status pytfm_rope_forward_cuda(float *y, const float *x, const int64_t *pos,
                                               int64_t B, int64_t T, int64_t H, int64_t D,
                                               int64_t pos_stride, double base, void *stream);

PYTFM_API pytfm_status pytfm_rope_backward_cuda(float *dx, const float *dy, const int64_t *pos,
                                                int64_t B, int64_t T, int64_t H, int64_t D,
                                                int64_t pos_stride, double base, void *stream);

PYTFM_API pytfm_status pytfm_gelu_forward_cuda(float *y, const float *x, int64_t count,
                                               void *stream);

PYTFM_API pytfm_status pytfm_gelu_backward_cuda(float *dx, const float *dy, const float *x,
                                                int64_t count, void *stream);

PYTFM_API pytfm_status pytfm_embedding_forward_cuda(float *y, const int64_t *ids,
                                                    const float *table, int64_t rows,
                                                    int64_t vocab, int64_t dim, void *stream);

/* Repeated ids add up in order of i, as on the CPU: the same bits. The ids are grouped by a
 * sort on the device (16·rows bytes of stream scratch), each group then added by one thread
 * per column chunk; up to 16 rows, one thread per column walks them. */
PYTFM_API pytfm_status pytfm_embedding_backward_cuda(float *dtable, const float *dy,
                                                     const int64_t *ids, int64_t rows,
                                                     int64_t vocab, int64_t dim, void *stream);

/* loss is written on the device. */
PYTFM_API pytfm_status pytfm_cross_entropy_forward_cuda(float *loss, float *lse,
                                                        const float *logits,
                                                        const int64_t *targets, int64_t rows,
                                                        int64_t vocab, int64_t ignore_index,
                                                        void *stream);

/* kept is counted on the device into 8 bytes of stream scratch. */
PYTFM_API pytfm_status pytfm_cross_entropy_backward_cuda(float *dlogits, const float *logits,
                                                         const int64_t *targets,
                                                         const float *lse, int64_t rows,
                                                         int64_t vocab, int64_t ignore_index,
                                                         float dloss, void *stream);

/* loss is written on the device. With ε != 0 the rows' means are summed by the log-sum-exp
 * kernel in the same read of the logits, into 8·rows bytes of stream scratch; ε = 0 is
 * pytfm_cross_entropy_forward_cuda, the same launches and bits. */
PYTFM_API pytfm_status pytfm_cross_entropy_smoothed_forward_cuda(float *loss, float *lse,
                                                                 const float *logits,
                                                                 const int64_t *targets,
                                                                 int64_t rows, int64_t vocab,
                                                                 int64_t ignore_index,
                                                                 float label_smoothing,
                                                                 void *stream);

/* kept is counted on the device into 8 bytes of stream scratch; ε = 0 is
 * pytfm_cross_entropy_backward_cuda, the same bits. */
PYTFM_API pytfm_status pytfm_cross_entropy_smoothed_backward_cuda(float *dlogits,
                                                                  const float *logits,
                                                                  const int64_t *targets,
                                                                  const float *lse, int64_t rows,
                                                                  int64_t vocab,
                                                                  int64_t ignore_index,
                                                                  float label_smoothing,
                                                                  float dloss, void *stream);

PYTFM_API pytfm_status pytfm_adamw_step_cuda(float *param, float *m, float *v, const float *grad,
                                             int64_t count, int64_t step, double lr,
                                             double beta1, double beta2, double eps,
                                             double weight_decay, void *stream);

/* The eight float32 scalars of one AdamW step, computed on the host in double and rounded once,
 * as pytfm_adamw_step and its twin compute them (same checks): scalars[8] (host memory)
 * written: 1 − lr·wd, lr/(1 − β1ᵗ), sqrt(1 − β2ᵗ), β1, 1 − β1, β2, 1 − β2, eps. */
PYTFM_API pytfm_status pytfm_cuda_adamw_scalars(float *scalars, int64_t step, double lr,
                                                double beta1, double beta2, double eps,
                                                double weight_decay);

/* As pytfm_adamw_step_cuda, the scalars read on the device from scalars[8] (DEVICE memory, as
 * pytfm_cuda_adamw_scalars writes them): the same bits. A kernel captured in a CUDA graph keeps
 * its arguments; this one takes each step's lr and t from memory the caller rewrites before
 * each replay. */
PYTFM_API pytfm_status pytfm_adamw_step_scalars_cuda(float *param, float *m, float *v,
                                                     const float *grad, int64_t count,
                                                     const float *scalars, void *stream);

/* The fused split of the QKV projection (RoPE on q and k), as pytfm_qkv_split_*: with RoPE, its
 * table of angles and kernel (q and k the bits of pytfm_rope_forward_cuda on the slices); without,
 * a copy. pos lives on the device and is not checked. */
PYTFM_API pytfm_status pytfm_qkv_split_forward_cuda(float *q, float *k, float *v,
                                                    const float *qkv, const int64_t *pos,
                                                    int64_t B, int64_t T, int64_t H, int64_t D,
                                                    int64_t pos_stride, double base,
                                                    int32_t rope, void *stream);

PYTFM_API pytfm_status pytfm_qkv_split_backward_cuda(float *dqkv, const float *dq,
                                                     const float *dk, const float *dv,
                                                     const int64_t *pos, int64_t B, int64_t T,
                                                     int64_t H, int64_t D, int64_t pos_stride,
                                                     double base, int32_t rope, void *stream);

/* As pytfm_linear_gelu_forward: h = x·Wᵀ + b and y = gelu(h), the same values as
 * pytfm_linear_forward_cuda then pytfm_gelu_forward_cuda. */
PYTFM_API pytfm_status pytfm_linear_gelu_forward_cuda(float *y, float *h, const float *x,
                                                      const float *w, const float *b,
                                                      int64_t rows, int64_t in, int64_t out,
                                                      void *stream);

/* As pytfm_sum_squares, with out a DEVICE pointer to one double (written): gradient clipping
 * without a copy to the host. A fixed order (partial sums in stream scratch past 256
 * elements): the same bits on every run. */
PYTFM_API pytfm_status pytfm_sum_squares_cuda(double *out, const float *x, int64_t count,
                                              void *stream);

/* ---- the Llama family's ops (cuda/rmsnorm.cu, swiglu.cu, rope_half.cu) ---------------------
 * As pytfm_rmsnorm_*, pytfm_swiglu_*, pytfm_rope_freq_*. RMSNorm: a warp per row up to 1024
 * columns, else a block; Σ x² in float, again in double where it over- or underflows; dw
 * accumulated by the column reduction of LayerNorm's (partial sums in stream scratch, a fixed
 * order: the same bits on every run). RoPE: a thread per pair, its angle computed as the C
 * kernel does (float product, cos and sin in double, rounded): the C kernel's bits. */
PYTFM_API pytfm_status pytfm_rmsnorm_forward_cuda(float *y, float *rstd, const float *x,
                                                  const float *w, int64_t rows, int64_t cols,
                                                  float eps, void *stream);

PYTFM_API pytfm_status pytfm_rmsnorm_backward_cuda(float *dx, float *dw, const float *dy,
                                                   const float *x, const float *w,
                                                   const float *rstd, int64_t rows,
                                                   int64_t cols, void *stream);

PYTFM_API pytfm_status pytfm_swiglu_forward_cuda(float *h, const float *g, const float *u,
                                                 int64_t count, void *stream);

PYTFM_API pytfm_status pytfm_swiglu_backward_cuda(float *dg, float *du, const float *dh,
                                                  const float *g, const float *u, int64_t count,
                                                  void *stream);

PYTFM_API pytfm_status pytfm_rope_freq_forward_cuda(float *y, const float *x, const int64_t *pos,
                                                    const float *inv_freq, int64_t B, int64_t T,
                                                    int64_t H, int64_t D, int64_t pos_stride,
                                                    void *stream);

PYTFM_API pytfm_status pytfm_rope_freq_backward_cuda(float *dx, const float *dy,
                                                     const int64_t *pos, const float *inv_freq,
                                                     int64_t B, int64_t T, int64_t H, int64_t D,
                                                     int64_t pos_stride, void *stream);

/* Attention on the GPU, FlashAttention-2's structure in float32: the same arguments, shapes,
 * rules and results (to float32 rounding) as pytfm_attention_forward/backward/cache_append/
 * decode. Memory linear in T; head dims 1 <= D <= PYTFM_CUDA_ATTENTION_MAX_D (a larger D is
 * PYTFM_STATUS_INVALID_ARGUMENT); the backward is deterministic (no atomics: the same bits on
 * every run). Scratch (the backward's row sums, B·H·T floats; the decode's split results) is
 * stream scratch. */
#define PYTFM_CUDA_ATTENTION_MAX_D 128

PYTFM_API pytfm_status pytfm_attention_forward_cuda(float *o, float *lse, const float *q,
                                                    const float *k, const float *v, int64_t B,
                                                    int64_t T, int64_t H, int64_t D,
                                                    float scale, int32_t causal, void *stream);

PYTFM_API pytfm_status pytfm_attention_backward_cuda(float *dq, float *dk, float *dv,
                                                     const float *dy, const float *q,
                                                     const float *k, const float *v,
                                                     const float *o, const float *lse,
                                                     int64_t B, int64_t T, int64_t H, int64_t D,
                                                     float scale, int32_t causal, void *stream);

PYTFM_API pytfm_status pytfm_attention_cache_append_cuda(float *k_cache, float *v_cache,
                                                         const float *k, const float *v,
                                                         int64_t B, int64_t n_new, int64_t H,
                                                         int64_t D, int64_t Tmax,
                                                         int64_t start, void *stream);

PYTFM_API pytfm_status pytfm_attention_decode_cuda(float *o, float *lse, const float *q,
                                                   const float *k_cache, const float *v_cache,
                                                   int64_t B, int64_t n_new, int64_t H,
                                                   int64_t D, int64_t Tmax, int64_t start,
                                                   float scale, void *stream);

/* Grouped-query heads and a sliding window on the GPU in float32: the same arguments, shapes,
 * rules and results (to float32 rounding) as pytfm_attention_gqa_forward/backward/decode, and
 * the limits of the functions above (1 <= D <= PYTFM_CUDA_ATTENTION_MAX_D: any D in that range,
 * not only powers of two). The backward's dK and dV: a block per (b, key/value head, key tile)
 * sums the group's query heads in order, deterministic as above. On the tensor cores:
 * pytfm_attention_gqa_forward_ex_cuda and _backward_ex_cuda below. */
PYTFM_API pytfm_status pytfm_attention_gqa_forward_cuda(float *o, float *lse, const float *q,
                                                        const float *k, const float *v,
                                                        int64_t B, int64_t T, int64_t H,
                                                        int64_t Hkv, int64_t D, float scale,
                                                        int32_t causal, int64_t window,
                                                        void *stream);

PYTFM_API pytfm_status pytfm_attention_gqa_backward_cuda(float *dq, float *dk, float *dv,
                                                         const float *dy, const float *q,
                                                         const float *k, const float *v,
                                                         const float *o, const float *lse,
                                                         int64_t B, int64_t T, int64_t H,
                                                         int64_t Hkv, int64_t D, float scale,
                                                         int32_t causal, int64_t window,
                                                         void *stream);

PYTFM_API pytfm_status pytfm_attention_gqa_decode_cuda(float *o, float *lse, const float *q,
                                                       const float *k_cache,
                                                       const float *v_cache, int64_t B,
                                                       int64_t n_new, int64_t H, int64_t Hkv,
                                                       int64_t D, int64_t Tmax, int64_t start,
                                                       float scale, int64_t window,
                                                       void *stream);

/* Queries and keys of different counts (Tq != Tk: cross-attention) and padded sequences on the
 * GPU in float32: the same arguments, shapes, rules and results (to float32 rounding) as
 * pytfm_attention_padded_forward/backward, every pointer a device pointer, q_len and k_len
 * too (or NULL: all Tq rows, all Tk keys), and the limits of the functions above. q, o, dq, dy
 * [B, Tq, H, D]; k, v, dk, dv [B, Tk, Hkv, D]; lse [B, H, Tq]. Query row i of sequence b sees
 * key s iff i < q_len[b], s < k_len[b], and with causal s <= i (top-left aligned), and with a
 * window w > 0 s > i - w. A row that sees no key gets o = 0, lse = -inf, dq = 0 and adds
 * nothing to dk, dv; keys no row sees get dk = dv = 0. The lengths live on the device, where
 * these functions cannot read them before launching: the caller checks 0 <= q_len[b] <= Tq and
 * 0 <= k_len[b] <= Tk (pytfm.ops does); the kernels clamp each to [0, T], so that a bad one
 * never reads or writes out of bounds. With NULL lengths and Tq = Tk they are the gqa
 * functions above (which call the same kernels). A decoding step of a cross-attention, a
 * query row against an encoder's cached keys, is the forward with Tq = 1. Scratch: the
 * backward's row sums, B·H·Tq floats of stream scratch. The tensor-core functions below
 * (_ex) take neither lengths nor Tq != Tk. */
PYTFM_API pytfm_status pytfm_attention_padded_forward_cuda(
    float *o, float *lse, const float *q, const float *k, const float *v, const int64_t *q_len,
    const int64_t *k_len, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
    float scale, int32_t causal, int64_t window, void *stream);

PYTFM_API pytfm_status pytfm_attention_padded_backward_cuda(
    float *dq, float *dk, float *dv, const float *dy, const float *q, const float *k,
    const float *v, const float *o, const float *lse, const int64_t *q_len, const int64_t *k_len,
    int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D, float scale,
    int32_t causal, int64_t window, void *stream);

/* ---- attention on the tensor cores (cuda/attention_tc.cu) ---------------------------------
 * As pytfm_attention_forward_cuda and pytfm_attention_backward_cuda, plus the precision.
 * PYTFM_PRECISION_FP32: those functions, their bits. PYTFM_PRECISION_TF32 and _BF16 at head
 * dims D of 16, 32, 64 or 128: Q·Kᵀ and P·V (backward: Kᵀ·Q, V·dYᵀ, Pᵀ·dY, dSᵀ·Q, dS·K) on the
 * tensor cores (mma.sync m16n8k8 TF32, m16n8k16 BF16; sm_80 and newer), each input of a
 * product rounded in registers to the precision (TF32: to nearest, ties away from zero; BF16:
 * to nearest even, float32 subnormals kept) as it is read, q, k, v, dy staying float32 and
 * unchanged; each product exact in float32, every sum, the softmax (its max, exponentials and
 * row sums, from the unrounded P), lse and the backward's row sums delta = Σ_d r(dy)·o in
 * float32; the same bits on every run (no atomics). Any other D runs the FP32 kernels in every
 * precision. Scratch: the backward's delta, B·H·T floats of stream scratch. The decode
 * (pytfm_attention_decode_cuda) has no precision: it is bound by the cache's bandwidth and
 * stays float32 (attention_tc.cu says why). */
PYTFM_API pytfm_status pytfm_attention_forward_ex_cuda(float *o, float *lse, const float *q,
                                                       const float *k, const float *v,
                                                       int64_t B, int64_t T, int64_t H,
                                                       int64_t D, float scale, int32_t causal,
                                                       int32_t precision, void *stream);

PYTFM_API pytfm_status pytfm_attention_backward_ex_cuda(float *dq, float *dk, float *dv,
                                                        const float *dy, const float *q,
                                                        const float *k, const float *v,
                                                        const float *o, const float *lse,
                                                        int64_t B, int64_t T, int64_t H,
                                                        int64_t D, float scale, int32_t causal,
                                                        int32_t precision, void *stream);

/* As pytfm_attention_gqa_forward_cuda and pytfm_attention_gqa_backward_cuda, plus the precision:
 * grouped-query heads and the sliding window on the tensor cores, with the rounding, bounds and
 * head dims of the two above (they are these with Hkv = H, window = 0). The dK/dV pass walks,
 * per key tile, every query head of the group in turn, in one order (no atomics). */
PYTFM_API pytfm_status pytfm_attention_gqa_forward_ex_cuda(float *o, float *lse, const float *q,
                                                           const float *k, const float *v,
                                                           int64_t B, int64_t T, int64_t H,
                                                           int64_t Hkv, int64_t D, float scale,
                                                           int32_t causal, int64_t window,
                                                           int32_t precision, void *stream);

PYTFM_API pytfm_status pytfm_attention_gqa_backward_ex_cuda(
    float *dq, float *dk, float *dv, const float *dy, const float *q, const float *k,
    const float *v, const float *o, const float *lse, int64_t B, int64_t T, int64_t H,
    int64_t Hkv, int64_t D, float scale, int32_t causal, int64_t window, int32_t precision,
    void *stream);
/* ---- end of attention on the tensor cores ---- */

/* PYTFM_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PYTFM_CUDA_H */
