/*
 * pytfm_kernels.h — the CPU kernels of a transformer, forward and backward.
 *
 * Conventions (they hold for every function below):
 *   - float32, row-major, contiguous. "[rows, cols]" means rows of cols floats each.
 *   - The caller allocates every input and output; no function keeps a pointer after it
 *     returns. A few functions allocate scratch space for the length of one call (their
 *     entries say "Scratch:", with its size); when that fails they return
 *     PYTFM_STATUS_OUT_OF_MEMORY and have written nothing. Two threads may call any function at
 *     once on disjoint buffers.
 *   - Argument order: outputs, what the forward saves for the backward, const inputs, then
 *     sizes (int64_t), then scalar options.
 *   - Gradient rule: gradients of parameters (weights, biases, embedding tables) are
 *     ACCUMULATED (+=) into the buffer, so zero it first; gradients of activations (dx) are
 *     WRITTEN (=).
 *   - Every function returns a pytfm_status. On failure nothing has been written to any output
 *     (arguments, including index arrays, are validated before the first write), and
 *     pytfm_last_error() describes the failure in this thread.
 *   - Sizes must be >= 0; a size that makes the op meaningless (0 features, 0 classes) is an
 *     error, a zero row count is a no-op. Sizes whose array would not fit in memory (its byte
 *     count, a product of sizes, past PTRDIFF_MAX; a cache position start + n_new past
 *     INT64_MAX) are PYTFM_STATUS_INVALID_ARGUMENT, found before any pointer is read, so no
 *     size product ever wraps (every function: tests/kernels/test_limits.py,
 *     tests/c_api/hostile_sizes.c).
 *     Pointers may be NULL only where a comment says so, or where the buffer they point to has
 *     zero elements.
 *   - No output shares memory with another argument: every buffer a function writes or
 *     accumulates into (gradients of parameters included) must not overlap, by address range,
 *     any other buffer of the call, else PYTFM_STATUS_INVALID_ARGUMENT ("<function>: dw and x
 *     must not share memory"). The only exceptions are exact in-place forms, where an output is
 *     the very same buffer as an input, allowed where a comment says "may equal": GELU's y == x
 *     and dx == dy, RoPE's y == x and dx == dy. Inputs may overlap each other. (Tests:
 *     tests/kernels/test_extremes.py, with the float extremes of GELU, LayerNorm, softmax and exp.)
 *   - No function ends the process: failures are statuses, never a call to end the program.
 *   - Process-wide settings: two, the thread count (pytfm_set_num_threads) and the
 *     instruction-set cap (pytfm_set_max_isa). Both change speed; the cap also changes the last
 *     bits of results. Besides them and each thread's last error message, nothing is kept between
 *     calls.
 *
 * Vocabulary (one word per thing, in C, CUDA, Python and the README alike):
 *   rows, cols   a row-wise op sees its input as [rows, cols]: softmax, LayerNorm,
 *                cross-entropy (cols = vocab) and the linear layer ([rows, in] -> [rows, out])
 *                act on each row; every leading dimension of a Python array is folded into rows
 *   in, out      the linear layer's input and output features
 *   count        the number of elements of a flat array (GELU, AdamW)
 *   vocab        the vocabulary size: rows of the embedding table, classes of cross-entropy
 *   dim          the width of an embedding row
 *   B, T, H, D   batch, time (sequence length), heads, head dim: attention and RoPE tensors
 *                are [B, T, H, D]
 *   Tmax, start, n_new
 *                a KV cache holds Tmax positions; decoding appends n_new tokens at positions
 *                [start, start + n_new)
 *   m, n, k      the matrix product only, as in BLAS: C [m, n] += A [m, k] · B [k, n]
 *   dy           the gradient arriving from above: of the op's output, whatever the output is
 *                called (y, o); dloss when that output is the scalar loss
 *   d<name>      the gradient of <name> (dx, dw, db, dq, dtable, dlogits)
 *   lse          a saved log-sum-exp (attention's per query row, cross-entropy's per row)
 *
 * Everything between this header's PYTFM_CDEF markers is read verbatim by the cffi builder
 * (pytfm/_build_ffi.py), so it must stay plain declarations: no macros but PYTFM_API.
 */
#ifndef PYTFM_KERNELS_H
#define PYTFM_KERNELS_H

#include "pytfm_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PYTFM_CDEF_BEGIN */

/* ---- Linear: y = x·Wᵀ + b ------------------------------------------------------------ */
/* W is stored [out, in], as torch.nn.Linear.weight, so weights map one-to-one.
 *   y  [rows, out]  written
 *   x  [rows, in]
 *   w  [out, in]
 *   b  [out]        may be NULL: no bias
 * Scratch: as pytfm_sgemm, for the product x·Wᵀ; none for one row (rows = 1) above
 * PYTFM_ISA_PLAIN, which is a matrix-vector product (a token decoded through a KV cache).
 */
PYTFM_API pytfm_status pytfm_linear_forward(float *y, const float *x, const float *w,
                                            const float *b, int64_t rows, int64_t in,
                                            int64_t out);

/* The linear layer followed by GELU (an MLP's first layer), in one pass over the output:
 *   y  [rows, out]  written: gelu(h), exactly pytfm_gelu_forward's result on h
 *   h  [rows, out]  written: x·Wᵀ + b, exactly pytfm_linear_forward's result (the
 *                   pre-activation, which pytfm_gelu_backward takes as its x)
 *   x, w, b         as pytfm_linear_forward (b may be NULL: no bias)
 * y and h must not share memory with each other or with the inputs.
 * Scratch: as pytfm_linear_forward. */
PYTFM_API pytfm_status pytfm_linear_gelu_forward(float *y, float *h, const float *x,
                                                 const float *w, const float *b, int64_t rows,
                                                 int64_t in, int64_t out);

/*   dx [rows, in]  written: dy·W; may be NULL when not needed
 *   dw [out, in]   accumulated: += dyᵀ·x
 *   db [out]       accumulated: += column sums of dy; may be NULL (no bias)
 *   dy [rows, out], x [rows, in], w [out, in] as in the forward
 * Scratch: as pytfm_sgemm, one allocation for both products (dyᵀ·x and dy·W).
 */
PYTFM_API pytfm_status pytfm_linear_backward(float *dx, float *dw, float *db, const float *dy,
                                             const float *x, const float *w, int64_t rows,
                                             int64_t in, int64_t out);

/* ---- The linear layer in a chosen precision ------------------------------------------- */
/* pytfm_linear_forward, pytfm_linear_gelu_forward and pytfm_linear_backward with a
 * pytfm_precision last (else PYTFM_STATUS_INVALID_ARGUMENT). PYTFM_PRECISION_FP32 computes
 * exactly what the function without _ex does, bit for bit. PYTFM_PRECISION_BF16: each product
 * (x·Wᵀ; dy·W and dyᵀ·x) multiplies its inputs rounded to BF16 (pytfm_round_bf16) and sums in
 * float32, as pytfm_sgemm_ex; the bias, the GELU, db (the column sums of dy, unrounded) and
 * every output stay float32. Nothing is stored in BF16: the rounding happens while the
 * products pack their panels (or, for one row, as the row kernel reads x and W), so the
 * arguments, shapes and gradient rule (dw, db accumulated) are the functions' without _ex. On
 * each path of pytfm_get_bf16_isa() the same bits at any thread count.
 * Scratch: as the function without _ex, its products' as pytfm_sgemm_ex's; none for one row
 * (rows = 1) above PYTFM_ISA_PLAIN. */
PYTFM_API pytfm_status pytfm_linear_forward_ex(float *y, const float *x, const float *w,
                                               const float *b, int64_t rows, int64_t in,
                                               int64_t out, int32_t precision);

PYTFM_API pytfm_status pytfm_linear_gelu_forward_ex(float *y, float *h, const float *x,
                                                    const float *w, const float *b,
                                                    int64_t rows, int64_t in, int64_t out,
                                                    int32_t precision);

PYTFM_API pytfm_status pytfm_linear_backward_ex(float *dx, float *dw, float *db,
                                                const float *dy, const float *x, const float *w,
                                                int64_t rows, int64_t in, int64_t out,
                                                int32_t precision);

/* ---- The linear layer on BF16 weights (inference) ------------------------------------- */
/* y = x·Wᵀ + b in BF16 precision where W is held in BF16 only, as a model kept in BF16 for
 * inference holds it (half the bytes of float32; nothing is widened but the blocks a product
 * packs):
 *   y   [rows, out]  written
 *   x   [rows, in]   float32, rounded to BF16 as the product reads it
 *   w16 [out, in]    W's BF16 values: the upper 16 bits of each float32 W[o, i] (its value
 *                    rounded to BF16 first: pytfm_round_bf16), in host byte order
 *   b   [out]        float32; may be NULL: no bias
 * Exactly the bits of pytfm_linear_forward_ex(y, x, W, b, rows, in, out, PYTFM_PRECISION_BF16)
 * on W the float32 widening of w16 (W[o, i]'s bits = w16[o, i] << 16), on every path of
 * pytfm_get_bf16_isa() and at any thread count: the one-row and few-row kernels read w16 as
 * that function reads W, the packed product packs w16 as it would pack W's rounding. A BF16
 * subnormal in w16 counts as a zero of its sign, as pytfm_round_bf16 makes of its widening.
 * Scratch: none for one row above PYTFM_ISA_PLAIN, nor for the few rows the row kernels take
 * (pytfm_linear_forward_ex's paths); the packed product's otherwise: on AVX512_BF16 as
 * pytfm_sgemm_ex's, elsewhere a block of W widened (2^18 floats at most, or one row of W when
 * longer) and rows × the block's rows floats, besides pytfm_sgemm_ex's for the block. */
PYTFM_API pytfm_status pytfm_linear_forward_bf16w(float *y, const float *x, const uint16_t *w16,
                                                  const float *b, int64_t rows, int64_t in,
                                                  int64_t out);

/* ---- 8-bit weights (inference) --------------------------------------------------------- */
/* W [out, in] held as blocks of PYTFM_Q8_BLOCK int8 values along each row with one fp16 scale
 * a block (llama.cpp's Q8_0 in two arrays: a quarter of float32's bytes, and 2/32 more):
 *   q      [out, in]        int8, in [−127, 127]
 *   scales [out, in / 32]   the scale d of each block, as IEEE binary16 bits (host byte order;
 *                           numpy's float16 views them)
 * W[o, i] is represented by q[o, i]·d with d = scales[o, i / 32] widened to float (exactly).
 * in must be a multiple of PYTFM_Q8_BLOCK, else PYTFM_STATUS_INVALID_ARGUMENT. */
enum { PYTFM_Q8_BLOCK = 32 };

/* Quantise w [out, in] (float32) into q [out, in] and scales [out, in / 32], block by block:
 *   amax = max |w| over the block's 32 values
 *   d    = fp16(amax / 127): the float32 quotient rounded to fp16 (nearest, ties to even)
 *   q    = clamp(round_half_away(w / d), −127, 127), w / d the float32 quotient by d widened;
 *          d = 0 (an all-zero block, or amax/127 under fp16's least subnormal) gives q = 0
 * so q·d is the dequantised value: |w − q·d| <= d/2, except where the clamp binds (d rounded
 * down, 127·d < amax), there amax − 127·d. A non-finite weight, or a block whose d overflows
 * fp16 (amax >= 65520·127), is PYTFM_STATUS_INVALID_ARGUMENT naming the row and the block, and
 * nothing is written. Scratch: none. */
PYTFM_API pytfm_status pytfm_quantize_q8(int8_t *q, uint16_t *scales, const float *w,
                                         int64_t out, int64_t in);

/* pytfm_quantize_q8 of W given in BF16 (w16 [out, in]: the upper halves of float32s), exactly
 * as of their float32 widening. */
PYTFM_API pytfm_status pytfm_quantize_q8_bf16(int8_t *q, uint16_t *scales, const uint16_t *w16,
                                              int64_t out, int64_t in);

/* w [out, in] = q·d, float32 (exact: a 7-bit integer times an 11-bit fp16). A non-finite
 * scale gives non-finite values (IEEE products). Scratch: none. */
PYTFM_API pytfm_status pytfm_dequantize_q8(float *w, const int8_t *q, const uint16_t *scales,
                                           int64_t out, int64_t in);

/* y = x·Wᵀ + b with W in 8 bits, llama.cpp's way (integer dot products of 8-bit operands):
 *   y [rows, out] written;  x [rows, in] float32;  q, scales: W as above;
 *   b [out] float32, or NULL: no bias
 * Each row of x is quantised per block of 32 with a float32 scale of its own: dx = amax/127
 * (float32), qx = the nearest integer to x/dx (ties to even; float32 quotient; 0 where dx is 0).
 * The products of a block are summed exactly in int32 in 8 lanes of 4 neighbours,
 *   s[blk, j] = Σ_{k<4} qx[32 blk + 4j + k] · q[o, 32 blk + 4j + k]        (j < 8)
 * and combined in float32 in 16 accumulators, lane 8·(blk mod 2) + j taking the blocks of its
 * parity in order by one fused multiply-add each,
 *   A[8 (blk mod 2) + j] = fma(dw[blk]·dx[blk], (float)s[blk, j], A[...])     (A starting at +0)
 * then y = ((A[0..8) + A[8..16)) halved twice more, pairwise: A[j] + A[j + 4], A[j] + A[j + 2],
 * A[0] + A[1]), and b[o] added last. Every path (PYTFM_ISA_PLAIN's loops, the AVX2, AVX-VNNI
 * and AVX512-VNNI kernels) follows that order: the same bits on every path and at any thread
 * count. A row of x holding inf or NaN is summed instead as Σ_i x[i]·(q[o, i]·dw) in float32,
 * in order of i (IEEE propagation, the same on every path).
 * Error against x·Wᵀ on W's dequantised values: per block at most Σ|q·dw|·dx/2 from x's
 * rounding, plus float32 rounding of the combination (at most (blocks/2 + 6)·u·Σ_blk,j |dw·dx·s|
 * and 2u·|b|, u = 2^-24).
 * q outside [−127, 127] (−128) may give different results on different paths; scales must be
 * finite (a non-finite one gives a non-finite result on every path).
 * Why integers: the decode-shaped product (one row) reads every weight once; its cost is the
 * weights' bytes, and the int8 dot products (vpdpbusd) take a quarter of the instructions
 * of widening each weight to float (docs/performance.md, "8-bit weights").
 * Paths by pytfm_set_max_isa's cap: PYTFM_ISA_AVX512_BF16 (or none: AVX-512 with its
 * extensions) the AVX512-VNNI kernel where the CPU has AVX512-VNNI and AVX512-BW;
 * PYTFM_ISA_AVX512 (AVX-512F without extensions) the AVX-VNNI kernel (256-bit vpdpbusd, VEX)
 * where the CPU has AVX-VNNI; PYTFM_ISA_AVX2 the AVX2 one (vpmaddubsw + vpmaddwd); each falls
 * to the next where the CPU lacks it; PYTFM_ISA_PORTABLE and PYTFM_ISA_PLAIN the plain loops.
 * Scratch: x's quantised rows, about rows·(2·in + in/8) bytes; none (the stack) for one row
 * with in <= 16384. */
PYTFM_API pytfm_status pytfm_linear_forward_q8w(float *y, const float *x, const int8_t *q,
                                                const uint16_t *scales, const float *b,
                                                int64_t rows, int64_t in, int64_t out);

/* pytfm_embedding_forward of a table held in 8 bits: y[i, :] = the dequantised row ids[i]
 * (q·d, as pytfm_dequantize_q8)
 *   y [rows, dim] written, float32;  ids [rows], each in [0, vocab) (else
 *   PYTFM_STATUS_OUT_OF_RANGE, nothing written);  q [vocab, dim], scales [vocab, dim / 32];
 *   dim a multiple of PYTFM_Q8_BLOCK. Scratch: none. */
PYTFM_API pytfm_status pytfm_embedding_forward_q8w(float *y, const int64_t *ids, const int8_t *q,
                                                   const uint16_t *scales, int64_t rows,
                                                   int64_t vocab, int64_t dim);

/* ---- SGEMM: C = β·C + op(A)·op(B) --------------------------------------------------- */
/* Row-major float32 matrix product; the linear layer's products go through it.
 *   c [m, n]  written (β = 0: C is not read) or updated (β = 1 accumulates)
 *   a [m, k], or [k, m] with trans_a != 0 (then op(A) = Aᵀ)
 *   b [k, n], or [n, k] with trans_b != 0
 * pytfm_sgemm runs, on all threads, a packed and blocked kernel with an AVX-512 or AVX2+FMA
 * register micro-kernel (pytfm_get_isa() says which), or the plain loop below AVX2;
 * pytfm_sgemm_plain is always the plain loop, kept as the reference the fast ones are tested
 * against. Each gives the same bits at any thread count.
 * Scratch (the packed kernels only, for m, n, k >= 1): packing buffers, at most 3.2 MiB per
 * thread: 216 KiB for op(A) when it is packed (trans_a, or n >= 512), and a slice of op(B),
 * 384 × min(w, 2048) floats, w the columns of C the thread computes (all n when the threads
 * split C by rows, m >= n; n / threads when by columns), rounded up to the micro-kernel's
 * width. pytfm_sgemm_plain allocates nothing.
 */
PYTFM_API pytfm_status pytfm_sgemm(float *c, const float *a, const float *b, int64_t m,
                                   int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                                   float beta);

PYTFM_API pytfm_status pytfm_sgemm_plain(float *c, const float *a, const float *b, int64_t m,
                                         int64_t n, int64_t k, int32_t trans_a,
                                         int32_t trans_b, float beta);

/* pytfm_sgemm in a pytfm_precision (last; else PYTFM_STATUS_INVALID_ARGUMENT). FP32: exactly
 * pytfm_sgemm. BF16: C = β·C + Σ_p bf16(op(A)[i, p])·bf16(op(B)[p, j]), bf16 the rounding of
 * pytfm_round_bf16, applied as the panels are packed (A and B are not changed); each product
 * is exact in float32, the sums float32 in the order of the path pytfm_get_bf16_isa() says:
 * the vdpbf16ps micro-kernel (8×32 tiles, pairs of k per instruction; partial sums below
 * 2^-126 may be flushed to zero), the FP32 micro-kernels on rounded panels (their order: the
 * same bits as pytfm_sgemm on rounded copies of A and B), or the plain loop (the same bits as
 * pytfm_sgemm_plain on rounded copies). β·C is float32. Scratch: as pytfm_sgemm's, for
 * m, n, k >= 1 on the packed paths (op(A) is always packed: 216 KiB per thread), none on the
 * plain loop. */
PYTFM_API pytfm_status pytfm_sgemm_ex(float *c, const float *a, const float *b, int64_t m,
                                      int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                                      float beta, int32_t precision);

/* ---- BF16 rounding ---------------------------------------------------------------------- */
/* y[i] = x[i] rounded to BF16 (a float32 whose low 16 bits are zero: 8 significant bits), as
 * every BF16 product rounds its inputs: to nearest, ties to even; NaN stays NaN (made quiet);
 * ±inf stays; a finite x of magnitude at least the largest BF16 plus half its ulp
 * ((2 − 2^-8)·2^127) becomes ±inf; a float32 subnormal (|x| < 2^-126) becomes a zero of its
 * sign, as the AVX512-BF16 instructions take subnormals (torch's conversion keeps them as BF16
 * subnormals: the one difference).
 *   y [count] written (may equal x), x [count]; count >= 0 */
PYTFM_API pytfm_status pytfm_round_bf16(float *y, const float *x, int64_t count);

/* ---- Softmax over the last axis ------------------------------------------------------ */
/* y[r, :] = exp(x[r, :] - max(x[r, :])) / sum(...). Stable for any finite input; a row that
 * is all -inf gives NaN (as PyTorch).
 *   y [rows, cols] written, x [rows, cols]; cols >= 1
 */
PYTFM_API pytfm_status pytfm_softmax_forward(float *y, const float *x, int64_t rows,
                                             int64_t cols);

/* dx = y ∘ (dy − rowsum(dy ∘ y)).
 *   dx [rows, cols] written, dy [rows, cols], y [rows, cols] the forward's output
 */
PYTFM_API pytfm_status pytfm_softmax_backward(float *dx, const float *dy, const float *y,
                                              int64_t rows, int64_t cols);

/* ---- LayerNorm over the last axis ---------------------------------------------------- */
/* y = (x − mean) · rstd · w + b, rstd = 1/sqrt(var + eps), var the biased variance; accurate
 * to float32 rounding of the row's spread however far from zero the row lies (the fast and CUDA
 * kernels sum x − x[0], the plain one sums in double), and for rows of any finite values: a row
 * whose float sums over- or underflow (values past about 1e19, whose squares pass FLT_MAX; a
 * spread under about 1e-15 with eps = 0) is summed in double by the fast and CUDA kernels too.
 * A row holding inf or NaN gives y and rstd NaN, as the reference does.
 *   y    [rows, cols] written
 *   mean [rows]       written, saved for the backward
 *   rstd [rows]       written, saved for the backward
 *   x [rows, cols], w [cols], b [cols]; cols >= 1, eps >= 0 and finite (the model's is
 *   PYTFM_LAYERNORM_EPS, pytfm_model.h)
 */
PYTFM_API pytfm_status pytfm_layernorm_forward(float *y, float *mean, float *rstd,
                                               const float *x, const float *w, const float *b,
                                               int64_t rows, int64_t cols, float eps);

/* With x̂ = (x − mean) · rstd and g = dy ∘ w, per row:
 *   dx [rows, cols] written: rstd · (g − mean(g) − x̂ · mean(g ∘ x̂))
 *   dw [cols]       accumulated: += sum over rows of dy ∘ x̂
 *   db [cols]       accumulated: += sum over rows of dy
 *   dy, x [rows, cols]; w [cols]; mean, rstd [rows] from the forward
 * x̂ is rebuilt from the saved float32 mean, whose rounding (eps·|mean|/2) moves it by that
 * much times rstd: rows far from zero relative to their spread lose that accuracy in dx, dw.
 * x − mean is formed in float32: rows whose values lie more than FLT_MAX from their mean (of
 * both signs near ±FLT_MAX) give inf and NaN here.
 * Scratch (the fast kernels, isa above PLAIN): the partial sums of dw and db over 16 fixed
 * chunks of rows, 2 · min(rows, 16) · cols floats.
 */
PYTFM_API pytfm_status pytfm_layernorm_backward(float *dx, float *dw, float *db,
                                                const float *dy, const float *x, const float *w,
                                                const float *mean, const float *rstd,
                                                int64_t rows, int64_t cols);

/* ---- RoPE: rotary position embedding, rotate-half (GPT-NeoX) pairing ---------------- */
/* For each (b, t, h) and i in [0, D/2), with θ_i = pos[b, t] · base^(−2i/D), the pair
 * (x[i], x[i + D/2]) is rotated by θ_i:
 *   y[i]       = x[i] cos θ_i − x[i + D/2] sin θ_i
 *   y[i + D/2] = x[i + D/2] cos θ_i + x[i] sin θ_i
 * Angles are computed in double precision.
 *   y   [B, T, H, D] written (may equal x: in place is allowed)
 *   x   [B, T, H, D]; D even and >= 2
 *   pos positions: pos[b * pos_stride + t] for batch b, time t; pos_stride = T for a [B, T]
 *       array, 0 to share one [T] row across the batch. Any int64 value is allowed (decoding
 *       at offset p passes p, p+1, ...).
 *   base > 0 (the model's is PYTFM_ROPE_BASE, pytfm_model.h)
 * Scratch (the fast version, isa above PLAIN): the table of cos θ and sin θ, P · D floats
 * for P distinct position rows (P = T when pos_stride = 0, else B · T).
 */
PYTFM_API pytfm_status pytfm_rope_forward(float *y, const float *x, const int64_t *pos,
                                          int64_t B, int64_t T, int64_t H, int64_t D,
                                          int64_t pos_stride, double base);

/* The rotation by −θ_i (the transpose of the forward's rotation):
 *   dx [B, T, H, D] written (may equal dy), dy [B, T, H, D]; other arguments as the forward
 * Scratch: as the forward.
 */
PYTFM_API pytfm_status pytfm_rope_backward(float *dx, const float *dy, const int64_t *pos,
                                           int64_t B, int64_t T, int64_t H, int64_t D,
                                           int64_t pos_stride, double base);

/* ---- The fused QKV projection's split, with RoPE on q and k ------------------------- */
/* The attention block's c_attn output holds q, k, v interleaved per token; the attention
 * kernels take each as its own [B, T, H, D] array. In one pass over the fused array:
 *   q [b, t] = R(θ) qkv[b, t, 0],  k [b, t] = R(θ) qkv[b, t, 1],  v [b, t] = qkv[b, t, 2]
 * with R(θ) pytfm_rope_forward's rotation at position pos[b * pos_stride + t] when rope != 0,
 * the identity (a copy) when rope == 0 (pos and base then unused; pos may be NULL).
 *   q, k, v [B, T, H, D] written;  qkv [B, T, 3, H, D];  D >= 1, even when rope != 0
 *   pos, pos_stride, base: as pytfm_rope_forward
 * The same bits as slicing qkv and calling pytfm_rope_forward on q and k. No buffer may share
 * memory with another. Scratch: as pytfm_rope_forward (when rope != 0).
 */
PYTFM_API pytfm_status pytfm_qkv_split_forward(float *q, float *k, float *v, const float *qkv,
                                               const int64_t *pos, int64_t B, int64_t T,
                                               int64_t H, int64_t D, int64_t pos_stride,
                                               double base, int32_t rope);

/* Its backward, back into the fused layout (the gradient c_attn's backward takes):
 *   dqkv [b, t, 0] = R(−θ) dq [b, t],  dqkv [b, t, 1] = R(−θ) dk [b, t],  dqkv [b, t, 2] = dv [b, t]
 *   dqkv [B, T, 3, H, D] written;  dq, dk, dv [B, T, H, D]; the rest as the forward
 */
PYTFM_API pytfm_status pytfm_qkv_split_backward(float *dqkv, const float *dq, const float *dk,
                                                const float *dv, const int64_t *pos, int64_t B,
                                                int64_t T, int64_t H, int64_t D,
                                                int64_t pos_stride, double base, int32_t rope);

/* ---- Sinusoidal positions (Vaswani et al., 2017) ------------------------------------ */
/* The table added to the token embeddings of a sinusoidal GPT: for t in [0, T), i in
 * [0, dim/2), with inv_i = 10000^(−2i/dim), computed in double and each value then rounded
 * to float:
 *   pe[t, 2i] = sin(t · inv_i),   pe[t, 2i + 1] = cos(t · inv_i)
 *   pe [T, dim] written;  T >= 0;  dim even and >= 2
 * The one implementation, so that Python and the C model use the same bits; the same at any
 * thread count. */
PYTFM_API pytfm_status pytfm_sinusoidal_positions(float *pe, int64_t T, int64_t dim);

/* ---- GELU, tanh approximation (as GPT-2) --------------------------------------------- */
/* y = 0.5 x (1 + tanh(u)), u = sqrt(2/π) (x + 0.044715 x³), computed as x / (1 + e^(−2u))
 * (the same function, with one exp instead of a tanh). Forward and backward are finite for
 * every finite x, up to ±FLT_MAX; x = +inf gives y = +inf, x = −inf y = NaN (−inf · 0), and
 * gelu'(±inf) and anything of NaN are NaN: what the reference (and PyTorch's formula) gives.
 *   y [count] written (may equal x), x [count]
 */
PYTFM_API pytfm_status pytfm_gelu_forward(float *y, const float *x, int64_t count);

/*   dx [count] written: dy · gelu'(x) (may equal dy), dy [count], x [count] the forward's
 *   input; with s = 1 / (1 + e^(−2u)): gelu'(x) = s + 2 x s (1 − s) · sqrt(2/π)(1 + 3·0.044715 x²)
 */
PYTFM_API pytfm_status pytfm_gelu_backward(float *dx, const float *dy, const float *x,
                                           int64_t count);

/* ---- Embedding lookup ---------------------------------------------------------------- */
/* y[i, :] = table[ids[i], :]
 *   y     [rows, dim] written
 *   ids   [rows], each in [0, vocab); one outside gives PYTFM_STATUS_OUT_OF_RANGE
 *   table [vocab, dim]; vocab >= 1, dim >= 1
 */
PYTFM_API pytfm_status pytfm_embedding_forward(float *y, const int64_t *ids, const float *table,
                                               int64_t rows, int64_t vocab, int64_t dim);

/* pytfm_embedding_forward of a table held in BF16 (a model kept in BF16 for inference):
 * y[i, :] = the float32 widening of table[ids[i], :], exactly (a BF16 value is the upper half
 * of a float32: subnormals, signed zeros, inf and NaN bits included)
 *   y     [rows, dim] written, float32
 *   ids   [rows], each in [0, vocab); one outside gives PYTFM_STATUS_OUT_OF_RANGE
 *   table [vocab, dim] BF16 values (the upper 16 bits of float32s, host byte order);
 *         vocab >= 1, dim >= 1
 */
PYTFM_API pytfm_status pytfm_embedding_forward_bf16w(float *y, const int64_t *ids,
                                                     const uint16_t *table, int64_t rows,
                                                     int64_t vocab, int64_t dim);

/*   dtable [vocab, dim] accumulated: dtable[ids[i], :] += dy[i, :] (repeated ids add up)
 *   dy [rows, dim], ids [rows] as in the forward
 */
PYTFM_API pytfm_status pytfm_embedding_backward(float *dtable, const float *dy,
                                                const int64_t *ids, int64_t rows, int64_t vocab,
                                                int64_t dim);

/* ---- Softmax cross-entropy ----------------------------------------------------------- */
/* loss = mean over rows i with targets[i] != ignore_index of (lse[i] − logits[i, targets[i]]),
 * lse[i] = log sum_j exp(logits[i, j]). With no such row the loss is 0 (PyTorch gives NaN).
 *   loss    [1] written
 *   lse     [rows] written, saved for the backward (also for ignored rows)
 *   logits  [rows, vocab]; vocab >= 1
 *   targets [rows], each in [0, vocab) or equal to ignore_index (else
 *           PYTFM_STATUS_OUT_OF_RANGE)
 */
PYTFM_API pytfm_status pytfm_cross_entropy_forward(float *loss, float *lse, const float *logits,
                                                   const int64_t *targets, int64_t rows,
                                                   int64_t vocab, int64_t ignore_index);

/* dlogits[i, :] = dloss / kept · (softmax(logits[i, :]) − onehot(targets[i])), zero for
 * ignored rows; kept is the number of rows not ignored. The softmax is recomputed as
 * exp(logits − lse), so each probability carries an absolute error of about 6e-8·|lse| from
 * lse's float32 rounding (negligible for the logits of a trained model, |lse| < 100).
 *   dlogits [rows, vocab] written; logits, targets as the forward; lse [rows] from the forward
 *   dloss   the gradient of the loss (1 for a loss that is minimised directly)
 */
PYTFM_API pytfm_status pytfm_cross_entropy_backward(float *dlogits, const float *logits,
                                                    const int64_t *targets, const float *lse,
                                                    int64_t rows, int64_t vocab,
                                                    int64_t ignore_index, float dloss);

/* Label smoothing (the paper's ε, torch.nn.functional.cross_entropy's label_smoothing): the
 * target of each kept row is (1 − ε)·onehot(targets[i]) + ε/vocab on every class, so
 *   loss = mean over kept rows i of (1 − ε)·(lse[i] − logits[i, targets[i]])
 *                                   + ε·(lse[i] − mean_j logits[i, j])
 * (mean_j summed in double); ε = 0 is pytfm_cross_entropy_forward, which calls this: the
 * same bits. Arguments as pytfm_cross_entropy_forward, and
 *   label_smoothing  ε, finite and in [0, 1], else PYTFM_STATUS_INVALID_ARGUMENT
 */
PYTFM_API pytfm_status pytfm_cross_entropy_smoothed_forward(float *loss, float *lse,
                                                            const float *logits,
                                                            const int64_t *targets, int64_t rows,
                                                            int64_t vocab, int64_t ignore_index,
                                                            float label_smoothing);

/* dlogits[i, :] = dloss / kept · (softmax(logits[i, :]) − (1 − ε)·onehot(targets[i]) − ε/vocab),
 * zero for ignored rows; each kept row sums to 0 up to rounding. ε = 0 is
 * pytfm_cross_entropy_backward, which calls this: the same bits. Arguments as
 * pytfm_cross_entropy_backward; label_smoothing as the forward (the forward's ε: lse does not
 * depend on it).
 */
PYTFM_API pytfm_status pytfm_cross_entropy_smoothed_backward(float *dlogits, const float *logits,
                                                             const int64_t *targets,
                                                             const float *lse, int64_t rows,
                                                             int64_t vocab, int64_t ignore_index,
                                                             float label_smoothing, float dloss);

/* ---- AdamW, one fused in-place step (as torch.optim.AdamW) -------------------------- */
/* With t = step (the first step is 1), in torch's arrangement of the bias corrections:
 *   param ← param · (1 − lr·weight_decay)
 *   m ← β1 m + (1 − β1) g;     v ← β2 v + (1 − β2) g²
 *   param ← param − (lr / (1 − β1ᵗ)) · m / (sqrt(v) / sqrt(1 − β2ᵗ) + eps)
 *   param, m, v [count] updated in place; grad [count]
 *   step >= 1; lr >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0, all finite
 * The hyperparameters are double, as Python floats are: the bias corrections βᵗ are computed
 * in double (float32 β would move 1 − 0.999¹⁰⁰⁰ by 1e-5), the per-element work in float32.
 */
PYTFM_API pytfm_status pytfm_adamw_step(float *param, float *m, float *v, const float *grad,
                                        int64_t count, int64_t step, double lr, double beta1,
                                        double beta2, double eps, double weight_decay);

/* The sum of squares of a flat array, for gradient clipping's global norm (pytfm/optim.py
 * clip_grad_norm over the model's one gradient buffer).
 *   *out = Σ_i x[i]² in double: blocks of 16384 elements each summed in order, then the block
 *   sums in order (the same bits at any thread count); x [count], count >= 0
 * Scratch: one double per block, when there are more than 64 blocks.
 */
PYTFM_API pytfm_status pytfm_sum_squares(double *out, const float *x, int64_t count);

/* ---- RMSNorm over the last axis (the Llama family's norm) ---------------------------- */
/* y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps), per row (as transformers' LlamaRMSNorm, in
 * float32: the weight multiplies the normalised row). Rows of any length: the model's hidden
 * rows, and Qwen 3's per-head q/k norm (rows of head_dim: [B·T·H, D]). Sums in double (plain)
 * or in float, redone in double where the float sum over- or underflows (fast, CUDA).
 *   y    [rows, cols] written
 *   rstd [rows]       written, saved for the backward
 *   x [rows, cols], w [cols]; cols >= 1, eps >= 0 and finite (a config's rms_norm_eps)
 */
PYTFM_API pytfm_status pytfm_rmsnorm_forward(float *y, float *rstd, const float *x,
                                             const float *w, int64_t rows, int64_t cols,
                                             float eps);

/* With x̂ = x · rstd and g = dy ∘ w, per row:
 *   dx [rows, cols] written: rstd · (g − x̂ · mean(g ∘ x̂))
 *   dw [cols]       accumulated: += sum over rows of dy ∘ x̂
 *   dy, x [rows, cols]; w [cols]; rstd [rows] from the forward
 * Scratch (the fast kernels, isa above PLAIN): the partial sums of dw over 16 fixed chunks of
 * rows, min(rows, 16) · cols floats.
 */
PYTFM_API pytfm_status pytfm_rmsnorm_backward(float *dx, float *dw, const float *dy,
                                              const float *x, const float *w, const float *rstd,
                                              int64_t rows, int64_t cols);

/* ---- SwiGLU: the gated MLP's activation, h = silu(g) ∘ u ----------------------------- */
/* g = x·W_gateᵀ and u = x·W_upᵀ come from two linear products (pytfm_linear_forward); this
 * is the element-wise step between them and the down projection. silu(g) = g · σ(g) =
 * g / (1 + e^(−g)): every finite g gives a finite result (e^(−g) overflowing to +inf gives
 * −0), silu(+inf) = +inf, silu(−inf) = NaN (as torch's).
 *   h [count] written;  g, u [count]
 */
PYTFM_API pytfm_status pytfm_swiglu_forward(float *h, const float *g, const float *u,
                                            int64_t count);

/* dg = dh ∘ u ∘ silu'(g), silu'(g) = σ(g) (1 + g (1 − σ(g)));  du = dh ∘ silu(g)
 *   dg, du [count] written;  dh, g, u [count] (g, u the forward's inputs)
 */
PYTFM_API pytfm_status pytfm_swiglu_backward(float *dg, float *du, const float *dh,
                                             const float *g, const float *u, int64_t count);

/* ---- RoPE from a table of frequencies, rotate-half pairing (the Llama family) -------- */
/* pytfm_rope_forward's rotation, the pair (x[i], x[i + D/2]) turned by θ_i, with the angles
 * taken from a table instead of a base: θ_i = pos[b, t] · inv_freq[i], as transformers'
 * LlamaRotaryEmbedding computes them: the product of float32 pos and inv_freq[i], rounded to
 * float32 (so long positions turn as they do there), then cos and sin of that float in double,
 * rounded to float32. Both RoPEs pair i with i + D/2 (Hugging Face's rotate_half, GPT-NeoX);
 * neither is the interleaved (2i, 2i + 1) layout of Meta's original Llama code, whose q and k
 * weights transformers' conversion permutes into this one.
 * The table comes from pytfm_rope_inv_freq, once per model: a frequency scaling (llama3) is a
 * different table, not a different kernel.
 *   y        [B, T, H, D] written (may equal x)
 *   x        [B, T, H, D]; D even and >= 2
 *   pos, pos_stride as pytfm_rope_forward
 *   inv_freq [D/2]
 */
PYTFM_API pytfm_status pytfm_rope_freq_forward(float *y, const float *x, const int64_t *pos,
                                               const float *inv_freq, int64_t B, int64_t T,
                                               int64_t H, int64_t D, int64_t pos_stride);

/* The rotation by −θ_i: dx [B, T, H, D] written (may equal dy), dy [B, T, H, D]; the rest as
 * the forward */
PYTFM_API pytfm_status pytfm_rope_freq_backward(float *dx, const float *dy, const int64_t *pos,
                                                const float *inv_freq, int64_t B, int64_t T,
                                                int64_t H, int64_t D, int64_t pos_stride);

/* A config's rope_scaling, as pytfm_rope_inv_freq takes it */
typedef enum pytfm_rope_scaling {
    PYTFM_ROPE_SCALING_NONE = 0,   /* inv_freq[i] = theta^(−2i/D) */
    PYTFM_ROPE_SCALING_LLAMA3 = 1, /* Llama 3.1's: long wavelengths slowed down by factor */
} pytfm_rope_scaling;

/* The table of pytfm_rope_freq_*: inv_freq[i] = theta^(−2i/D) for i < D/2 (rope_theta: Llama 3
 * 500000, Qwen 2.5 1000000), then, with PYTFM_ROPE_SCALING_LLAMA3, transformers'
 * _compute_llama3_parameters: with wavelen = 2π/inv_freq, lo = original_max_pos /
 * low_freq_factor and hi = original_max_pos / high_freq_factor,
 *   wavelen < hi:   unchanged;   wavelen > lo:   inv_freq / factor;
 *   between:        (1 − s) · inv_freq / factor + s · inv_freq,
 *                   s = (original_max_pos / wavelen − low_freq_factor) /
 *                       (high_freq_factor − low_freq_factor).
 * Computed in double, rounded to float32 once (transformers rounds each step to float32: the
 * two tables agree to about an ulp). The scaling's four numbers are read only with LLAMA3.
 *   inv_freq [D/2] written; D even and >= 2; theta finite, > 0; factor, low_freq_factor > 0,
 *   high_freq_factor > low_freq_factor, original_max_pos > 0 (original_max_position_embeddings)
 */
PYTFM_API pytfm_status pytfm_rope_inv_freq(float *inv_freq, int64_t D, double theta,
                                           int32_t scaling, double factor,
                                           double low_freq_factor, double high_freq_factor,
                                           double original_max_pos);

/* ---- Attention: multi-head scaled dot-product, flash-style ------------------------- */
/* O = softmax(scale · q kᵀ [+ causal mask]) v for every batch b and head h, computed tile by
 * tile with an online softmax: the [T, T] score matrix is never stored. With causal != 0,
 * position t attends to keys 0..t only, and tiles above the diagonal are skipped. Parallel
 * over B·H when built with OpenMP; the result does not depend on the number of threads.
 *   o     [B, T, H, D] written
 *   lse   [B, H, T]    written: log Σ_s exp(scores[t, s]), saved for the backward
 *   q, k, v [B, T, H, D] (the layout a fused QKV projection produces, no permute needed)
 *   D >= 1; scale finite, usually 1/sqrt(D)
 * Scratch (the fast version: isa AVX2 or above, T >= 8): per thread, a copy of one head's
 * keys transposed and a 64×272 tile of scores, D·T + 17536 floats (linear in T). The plain
 * version allocates nothing: under 1 KiB of stack per thread.
 */
PYTFM_API pytfm_status pytfm_attention_forward(float *o, float *lse, const float *q,
                                               const float *k, const float *v, int64_t B,
                                               int64_t T, int64_t H, int64_t D, float scale,
                                               int32_t causal);

/* Recomputes the probabilities from q, k and lse, tile by tile; deterministic.
 *   dq, dk, dv [B, T, H, D] written
 *   dy [B, T, H, D] the gradient of o; q, k, v, o, lse, scale, causal as in the forward
 * Scratch (fast version, as the forward): per thread, one head's keys and values transposed,
 * two 64×80 tiles and a row of T sums, 2·D·T + T + 10240 floats. The plain version: none.
 */
PYTFM_API pytfm_status pytfm_attention_backward(float *dq, float *dk, float *dv, const float *dy,
                                                const float *q, const float *k, const float *v,
                                                const float *o, const float *lse, int64_t B,
                                                int64_t T, int64_t H, int64_t D, float scale,
                                                int32_t causal);

/* ---- Attention with grouped-query heads and a sliding window (Llama, Qwen, Mistral) ---- */
/* pytfm_attention_forward/backward/decode generalised; with Hkv = H and window = 0 they are
 * those functions, their bits (those are these, called so):
 *   Hkv     key/value heads: 1 <= Hkv <= H and Hkv divides H (Hkv = 0 only with H = 0); query
 *           head h reads key/value head h / (H / Hkv), as transformers' repeat_kv (Hkv = H:
 *           multi-head, Hkv = 1: multi-query). A KV cache holds Hkv heads.
 *   window  0: none; w > 0 (causal only, else PYTFM_STATUS_INVALID_ARGUMENT): query position t
 *           attends to keys s with t − w < s <= t, transformers' sliding window (Mistral,
 *           Qwen 2's use_sliding_window); tiles of keys before a row's window are skipped.
 *   D       any head dim >= 1, independent of the model width (q's last axis).
 *   o, q    [B, T, H, D];  k, v [B, T, Hkv, D];  lse [B, H, T]
 *   backward: dq, dy [B, T, H, D] (dq written);  dk, dv [B, T, Hkv, D] written, each the sum
 *           over the H / Hkv query heads of its group (in head order: deterministic)
 *   decode: o, q [B, n_new, H, D];  k_cache, v_cache [B, Tmax, Hkv, D] (append with
 *           pytfm_attention_cache_append, H = Hkv);  lse [B, H, n_new]
 * Parallel over B·H (forward, decode) and B·Hkv (backward: one thread sums a group's dk, dv).
 * Scratch: as the functions they generalise, the score tiles' rows 16 floats longer. */
PYTFM_API pytfm_status pytfm_attention_gqa_forward(float *o, float *lse, const float *q,
                                                   const float *k, const float *v, int64_t B,
                                                   int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                                   float scale, int32_t causal, int64_t window);

PYTFM_API pytfm_status pytfm_attention_gqa_backward(float *dq, float *dk, float *dv,
                                                    const float *dy, const float *q,
                                                    const float *k, const float *v,
                                                    const float *o, const float *lse, int64_t B,
                                                    int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                                    float scale, int32_t causal, int64_t window);

/* ---- Attention with Tq != Tk and padded sequences (the encoder-decoder's) ---- */
/* pytfm_attention_gqa_forward/backward generalised to Tq queries on Tk keys (cross-attention)
 * and to sequences of their own lengths in one batch (padding masks); with Tq = Tk and
 * q_len = k_len = NULL they are those functions, their bits (those are these, called so):
 *   q_len, k_len [B] int64: sequence b has the queries [0, q_len[b]) and the keys
 *           [0, k_len[b]); NULL: all Tq, all Tk. 0 <= q_len[b] <= Tq and 0 <= k_len[b] <= Tk,
 *           else PYTFM_STATUS_INVALID_ARGUMENT naming q_len or k_len and b.
 *   Query row i of sequence b sees key s iff i < q_len[b] and s < k_len[b], and with
 *           causal != 0 also s <= i (top-left aligned: torch's is_causal, tril(ones(Tq, Tk))),
 *           and with a window w > 0 (causal only) also s > i - w.
 *   A row that sees no key (a padded query, or every key masked) gets o = 0 and
 *           lse = -INFINITY; the backward gives it dq = 0 and it adds nothing to dk, dv. Keys
 *           no row sees get dk = dv = 0. Nothing past a sequence's lengths is read (its
 *           padding may hold anything, NaN included): a sequence's results are the same bits
 *           whatever its padding holds and whatever the other sequences are.
 *   o, q    [B, Tq, H, D];  k, v [B, Tk, Hkv, D];  lse [B, H, Tq]
 *   backward: dq, dy [B, Tq, H, D] (dq written);  dk, dv [B, Tk, Hkv, D] written, as
 *           pytfm_attention_gqa_backward's; o and lse from the forward with the same lengths.
 *   Hkv, window, D, scale, causal: as pytfm_attention_gqa_forward.
 * Parallel over B·H (forward) and B·Hkv (backward); the same bits at any thread count.
 * Scratch (the fast version, isa AVX2 or above, Tq >= 8): per thread, forward
 * D·Tk + 17536 floats, backward 2·D·Tk + Tq + 10240 floats; the plain version none. */
PYTFM_API pytfm_status pytfm_attention_padded_forward(float *o, float *lse, const float *q,
                                                      const float *k, const float *v,
                                                      const int64_t *q_len, const int64_t *k_len,
                                                      int64_t B, int64_t Tq, int64_t Tk,
                                                      int64_t H, int64_t Hkv, int64_t D,
                                                      float scale, int32_t causal,
                                                      int64_t window);

PYTFM_API pytfm_status pytfm_attention_padded_backward(float *dq, float *dk, float *dv,
                                                       const float *dy, const float *q,
                                                       const float *k, const float *v,
                                                       const float *o, const float *lse,
                                                       const int64_t *q_len,
                                                       const int64_t *k_len, int64_t B,
                                                       int64_t Tq, int64_t Tk, int64_t H,
                                                       int64_t Hkv, int64_t D, float scale,
                                                       int32_t causal, int64_t window);

PYTFM_API pytfm_status pytfm_attention_gqa_decode(float *o, float *lse, const float *q,
                                                  const float *k_cache, const float *v_cache,
                                                  int64_t B, int64_t n_new, int64_t H,
                                                  int64_t Hkv, int64_t D, int64_t Tmax,
                                                  int64_t start, float scale, int64_t window);

/* Write n_new new keys and values into a KV cache at positions [start, start + n_new).
 *   k_cache, v_cache [B, Tmax, H, D] updated; k, v [B, n_new, H, D] (H: the cache's heads,
 *   Hkv of pytfm_attention_gqa_decode)
 *   start >= 0 and start + n_new <= Tmax (else PYTFM_STATUS_INVALID_ARGUMENT: cache overflow,
 *   also when start + n_new would pass INT64_MAX)
 */
PYTFM_API pytfm_status pytfm_attention_cache_append(float *k_cache, float *v_cache,
                                                    const float *k, const float *v, int64_t B,
                                                    int64_t n_new, int64_t H, int64_t D,
                                                    int64_t Tmax, int64_t start);

/* Causal attention of n_new new queries at positions [start, start + n_new) to the cached keys
 * and values at positions [0, start + n_new) (append them first): query start + i sees keys
 * 0..start + i. Costs O((start + n_new)·D) per query: no [T, T] work.
 *   o   [B, n_new, H, D] written;  lse [B, H, n_new] written
 *   q   [B, n_new, H, D];  k_cache, v_cache [B, Tmax, H, D];  start + n_new <= Tmax
 * Scratch: as pytfm_attention_forward with T = start + n_new, for n_new >= 8 (the tiled fast
 * version); fewer queries run one row at a time (vectorised above PYTFM_ISA_PLAIN) and take
 * none.
 */
PYTFM_API pytfm_status pytfm_attention_decode(float *o, float *lse, const float *q,
                                              const float *k_cache, const float *v_cache,
                                              int64_t B, int64_t n_new, int64_t H, int64_t D,
                                              int64_t Tmax, int64_t start, float scale);

/* ---- A BF16 KV cache: half the bytes of the float32 one ---- */
/* The cache holds each key and value as BF16 bits (the upper 16 bits of the float32 rounded to
 * nearest even, as pytfm_round_bf16), and decoding reads their float32 widening: the results
 * are the bits pytfm_attention_cache_append + pytfm_attention_gqa_decode give when k and v are
 * rounded with pytfm_round_bf16 before they are appended, on every ISA path and thread count.
 *   k_cache, v_cache [B, Tmax, Hkv, D] uint16_t;  everything else, every rule and every status
 *   as the float32 functions (cache overflow, Hkv dividing H, window >= 0, ...).
 * The append rounds as it writes, element by element. */
PYTFM_API pytfm_status pytfm_attention_cache_append_bf16(uint16_t *k_cache, uint16_t *v_cache,
                                                         const float *k, const float *v,
                                                         int64_t B, int64_t n_new, int64_t H,
                                                         int64_t D, int64_t Tmax, int64_t start);

/* Decoding on the BF16 cache: pytfm_attention_gqa_decode's bits on its widening.
 * Scratch: one token (n_new = 1, above PYTFM_ISA_PLAIN) widens a tile of 64 keys and 64
 * values at a time, 2·64·D + 2·(H / Hkv) floats per thread; otherwise (a prompt, a few tokens,
 * the plain path) the keys and values [first, start + n_new) of a block of c key/value heads
 * at a time are widened, and their queries gathered, into 2·Tk·c·D + (2·D + 1)·n_new·c·G
 * floats (G = H / Hkv; c the fewest heads whose c·G query heads give each thread one, at most
 * Hkv; first: the first key a query sees, 0 without a window; Tk = start + n_new − first),
 * and pytfm_attention_gqa_decode runs on them (its own scratch too). */
PYTFM_API pytfm_status pytfm_attention_gqa_decode_bf16kv(float *o, float *lse, const float *q,
                                                         const uint16_t *k_cache,
                                                         const uint16_t *v_cache, int64_t B,
                                                         int64_t n_new, int64_t H, int64_t Hkv,
                                                         int64_t D, int64_t Tmax, int64_t start,
                                                         float scale, int64_t window);

/* PYTFM_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PYTFM_KERNELS_H */
