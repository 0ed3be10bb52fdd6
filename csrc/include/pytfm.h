/*
 * pytfm.h — the public C API of libpytfm: transformer kernels, forward and backward.
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
 *     size product ever wraps (every function: tests/test_limits.py, tests/c/hostile_sizes.c).
 *     Pointers may be NULL only where a comment says so, or where the buffer they point to has
 *     zero elements.
 *   - No output shares memory with another argument: every buffer a function writes or
 *     accumulates into (gradients of parameters included) must not overlap, by address range,
 *     any other buffer of the call, else PYTFM_STATUS_INVALID_ARGUMENT ("<function>: dw and x
 *     must not share memory"). The only exceptions are exact in-place forms, where an output is
 *     the very same buffer as an input, allowed where a comment says "may equal": GELU's y == x
 *     and dx == dy, RoPE's y == x and dx == dy. Inputs may overlap each other. (Tests:
 *     tests/test_extremes.py, with the float extremes of GELU, LayerNorm, softmax and exp.)
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
 * Everything between the PYTFM_CDEF markers is read verbatim by the cffi builder
 * (pytfm/_build_ffi.py), so it must stay plain declarations: no macros but PYTFM_API.
 */
#ifndef PYTFM_H
#define PYTFM_H

#include <stddef.h>
#include <stdint.h>

#define PYTFM_VERSION_MAJOR 0
#define PYTFM_VERSION_MINOR 1
#define PYTFM_VERSION_PATCH 0
#define PYTFM_VERSION "0.1.0"
/* The ABI number: raised when a function's signature, a struct's layout or an enum's values
 * change incompatibly (new functions do not raise it). The CMake build names the shared
 * library's SONAME after it (libpytfm.so.1); pytfm_abi_version() is the library's own, so a
 * program can check at run time that it was compiled against a compatible header. */
#define PYTFM_ABI_VERSION 1

#if defined(PYTFM_BUILDING) && defined(__GNUC__)
#define PYTFM_API __attribute__((visibility("default")))
#else
#define PYTFM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* PYTFM_CDEF_BEGIN */

/* ---- Status, errors, version, build information ------------------------------------- */
/* Lives in: csrc/status.c (statuses, errors, scratch, thread count, build info), csrc/isa.c
 * (the instruction-set cap), csrc/free_cores.c (the default thread count); Python
 * pytfm/_core.py; tests: tests/test_errors.py, test_build.py, test_sgemm.py (the cap),
 * test_threads.py, test_busy.py and c/thread_flips.c (the thread count); bench/busy.py. */

typedef enum pytfm_status {
    PYTFM_STATUS_OK = 0,
    PYTFM_STATUS_INVALID_ARGUMENT = 1, /* NULL pointer, bad size or bad scalar option */
    PYTFM_STATUS_OUT_OF_RANGE = 2,     /* an index array holds a value outside its range */
    PYTFM_STATUS_NOT_SUPPORTED = 3,    /* the operation is not available in this build */
    PYTFM_STATUS_CUDA_ERROR = 4,       /* the CUDA runtime reported an error */
    PYTFM_STATUS_INTERNAL = 5,         /* a bug in pytfm: please report it */
    PYTFM_STATUS_OUT_OF_MEMORY = 6     /* a scratch buffer could not be allocated */
} pytfm_status;

/* A static, human-readable name for a status, e.g. "invalid argument". Never NULL. */
PYTFM_API const char *pytfm_status_string(pytfm_status status);

/* The message of the most recent failure in the calling thread ("" if none yet), e.g.
 * "pytfm_layernorm_forward: cols must be >= 1, got 0". Valid until the next pytfm call in this
 * thread. Successful calls leave it unchanged. */
PYTFM_API const char *pytfm_last_error(void);

/* The library version, "MAJOR.MINOR.PATCH" (PYTFM_VERSION of the header it was built with). */
PYTFM_API const char *pytfm_version(void);

/* The library's PYTFM_ABI_VERSION (of the header it was built with). */
PYTFM_API int32_t pytfm_abi_version(void);

/* Threads used by the kernels (when built with OpenMP). The default, and the value after
 * pytfm_set_num_threads(0), is OpenMP's own (OMP_NUM_THREADS, else the available cores), but
 * no more than the cores that other processes leave free (csrc/free_cores.c; on Linux, when
 * the process may run on every online CPU: the machine's runnable tasks less this process's,
 * from /proc, sampled at most every 100 ms). A team of threads runs at the pace of its slowest
 * one, so with one of two cores busy elsewhere, two threads were three times slower than one
 * (bench/busy.py). A count set here or by PYTFM_NUM_THREADS is not lowered for neighbours,
 * only clamped: whatever the source (this setting, PYTFM_NUM_THREADS in Python,
 * OMP_NUM_THREADS), the kernels use at most 4 threads per available core (4 ×
 * omp_get_num_procs(), the cores of the process's CPU affinity, counted once): a larger value
 * is accepted and clamped to that.
 * One of the library's two process-wide settings (with the instruction-set cap below), like
 * a BLAS's thread setting: it changes speed only, never results, which are the same bits at
 * any thread count. Each parallel region reads it once, and so does a call that sizes
 * per-thread scratch for all of its regions: a change from another thread meanwhile is safe
 * (it takes effect from the next call).
 * threads must be >= 0. Without OpenMP the setting is accepted and the kernels run on one
 * thread. */
PYTFM_API pytfm_status pytfm_set_num_threads(int32_t threads);

/* The number of threads the next kernel will use, after the clamp above (1 without OpenMP). */
PYTFM_API int32_t pytfm_get_num_threads(void);

/* CPU features, as a bit mask in pytfm_build_info.cpu_features (detected at run time). */
typedef enum pytfm_cpu_feature {
    PYTFM_CPU_SSE2 = 1,
    PYTFM_CPU_AVX = 2,
    PYTFM_CPU_AVX2 = 4,
    PYTFM_CPU_FMA = 8,
    PYTFM_CPU_AVX512F = 16,
    PYTFM_CPU_NEON = 32
} pytfm_cpu_feature;

/* Instruction sets the kernels are written for. By default every kernel runs the fastest
 * version this CPU has; pytfm_set_max_isa caps that (tests compare the versions with it,
 * benchmarks time them). PLAIN runs the plain reference loops (the obviously-correct version
 * of each kernel); PORTABLE the vectorised kernels built for the baseline target (SSE2, NEON).
 * Versions agree to float32 rounding, not bit for bit: the fast ones sum in other orders. */
typedef enum pytfm_isa {
    PYTFM_ISA_AUTO = 0,     /* no cap: the best this CPU has */
    PYTFM_ISA_PLAIN = 1,    /* reference loops */
    PYTFM_ISA_PORTABLE = 2, /* vectorised for the baseline target */
    PYTFM_ISA_AVX2 = 3,     /* x86-64 AVX2 + FMA */
    PYTFM_ISA_AVX512 = 4    /* x86-64 AVX-512F */
} pytfm_isa;

/* Use no instruction set above isa (PYTFM_ISA_AUTO: no cap). Process-wide, like the thread
 * count; it changes which kernel versions run, and so the last bits of results. */
PYTFM_API pytfm_status pytfm_set_max_isa(int32_t isa);

/* The pytfm_isa the kernels use now: the best this CPU has, under the cap. */
PYTFM_API int32_t pytfm_get_isa(void);

typedef struct pytfm_build_info {
    const char *version;   /* as pytfm_version() */
    const char *compiler;  /* compiler that built the library, e.g. "gcc 12.2.0" */
    const char *flags;     /* compile flags of the C kernels */
    const char *arch;      /* target architecture, e.g. "x86_64" */
    uint64_t cpu_features; /* pytfm_cpu_feature bits of the CPU running now */
    int32_t cuda;          /* 1 if CUDA kernels were compiled in, else 0 */
    int32_t cuda_version;  /* CUDA toolkit version as 1000*major + 10*minor, 0 without CUDA */
} pytfm_build_info;

/* Fill *info. The strings are static. */
PYTFM_API pytfm_status pytfm_get_build_info(pytfm_build_info *info);

/* ---- Linear: y = x·Wᵀ + b ------------------------------------------------------------ */
/* Lives in: csrc/linear.c (its products through sgemm.c's plain or packed kernels), checks
 * csrc/checks.h pytfm__check_linear_*, CUDA cuda/linear.cu, Python pytfm/ops.py
 * linear_forward/backward and linear_gelu_forward, reference pytfm/reference.py;
 * tests in tests/: test_ops.py, test_linear_fused.py, test_properties.py, test_reference.py,
 * test_fast.py, test_memory.py, test_errors.py, test_sanitizers.py, test_cuda_emu.py,
 * test_cuda_dispatch.py, test_cuda_gpu.py. */
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

/* ---- SGEMM: C = β·C + op(A)·op(B) --------------------------------------------------- */
/* Lives in: csrc/sgemm.c (plain loop sgemm_plain; fast: gemm_blocked and the micro_avx2 /
 * micro_avx512 register kernels), checks csrc/checks.h pytfm__check_sgemm, CUDA cuda/sgemm.cu, no
 * Python wrapper (ops.linear_* use it; tests call it through cffi); tests in tests/: test_sgemm.py,
 * test_memory.py, test_cuda_sgemm.py (the CUDA kernels on the emulator), test_cuda_gpu.py. */
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

/* ---- Softmax over the last axis ------------------------------------------------------ */
/* Lives in: csrc/softmax.c (plain loop; fast: fast_impl.h softmax_forward/backward), checks
 * csrc/checks.h pytfm__check_softmax_*, CUDA cuda/softmax.cu, Python pytfm/ops.py
 * softmax_forward/backward, reference pytfm/reference.py; tests in tests/: test_ops.py,
 * test_properties.py, test_reference.py, test_fast.py, test_errors.py, test_sanitizers.py,
 * test_cuda_emu.py, test_cuda_dispatch.py, test_cuda_gpu.py. */
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
/* Lives in: csrc/layernorm.c (plain loop; fast: fast_impl.h layernorm_forward/backward), checks
 * csrc/checks.h pytfm__check_layernorm_*, CUDA cuda/layernorm.cu, Python pytfm/ops.py
 * layernorm_forward/backward, reference pytfm/reference.py; tests in tests/: test_ops.py,
 * test_properties.py, test_reference.py, test_fast.py, test_memory.py, test_errors.py,
 * test_sanitizers.py, test_cuda_emu.py, test_cuda_dispatch.py, test_cuda_gpu.py. */
/* y = (x − mean) · rstd · w + b, rstd = 1/sqrt(var + eps), var the biased variance; accurate
 * to float32 rounding of the row's spread however far from zero the row lies (the fast and CUDA
 * kernels sum x − x[0], the plain one sums in double), and for rows of any finite values: a row
 * whose float sums over- or underflow (values past about 1e19, whose squares pass FLT_MAX; a
 * spread under about 1e-15 with eps = 0) is summed in double by the fast and CUDA kernels too.
 * A row holding inf or NaN gives y and rstd NaN, as the reference does.
 *   y    [rows, cols] written
 *   mean [rows]       written, saved for the backward
 *   rstd [rows]       written, saved for the backward
 *   x [rows, cols], w [cols], b [cols]; cols >= 1, eps >= 0 and finite
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
/* Lives in: csrc/rope.c (plain loop rotate; fast: rotate_tabled, in the same file), checks
 * csrc/checks.h pytfm__check_rope, CUDA cuda/rope.cu, Python pytfm/ops.py rope_forward/backward,
 * reference pytfm/reference.py; tests in tests/: test_ops.py, test_properties.py,
 * test_reference.py, test_attention.py, test_fast.py, test_memory.py, test_errors.py,
 * test_sanitizers.py, test_cuda_emu.py, test_cuda_dispatch.py, test_cuda_gpu.py. */
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
 *   base > 0 (10000 is the usual value)
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
/* Lives in: csrc/rope.c (the same plain and fast paths as RoPE), checks csrc/checks.h
 * pytfm__check_qkv_split, CUDA cuda/rope.cu, Python pytfm/ops.py qkv_split_forward/backward
 * (pytfm/nn.py CausalSelfAttention), tests in tests/: test_qkv_split.py, test_model.py,
 * test_cuda_emu.py, test_cuda_dispatch.py. */
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
/* Lives in: csrc/positions.c (one version, parallel over rows), no CUDA twin, Python
 * pytfm/ops.py sinusoidal_positions (pytfm.nn.sinusoidal_positions calls it; so does the C
 * model, csrc/model.c, for pos = PYTFM_POS_SINUSOIDAL), reference pytfm/reference.py
 * sinusoidal_positions; tests in tests/: test_positions.py, test_c_model.py, test_limits.py,
 * test_sanitizers.py (c/hostile_sizes.c). */
/* The table added to the token embeddings of a sinusoidal GPT: for t in [0, T), i in
 * [0, dim/2), with inv_i = 10000^(−2i/dim), computed in double and each value then rounded
 * to float:
 *   pe[t, 2i] = sin(t · inv_i),   pe[t, 2i + 1] = cos(t · inv_i)
 *   pe [T, dim] written;  T >= 0;  dim even and >= 2
 * The one implementation, so that Python and the C model use the same bits; the same at any
 * thread count. */
PYTFM_API pytfm_status pytfm_sinusoidal_positions(float *pe, int64_t T, int64_t dim);

/* ---- GELU, tanh approximation (as GPT-2) --------------------------------------------- */
/* Lives in: csrc/gelu.c (plain loop; fast: fast_impl.h gelu_forward/backward), checks csrc/checks.h
 * pytfm__check_gelu_*, CUDA cuda/gelu.cu, Python pytfm/ops.py gelu_forward/backward, reference
 * pytfm/reference.py; tests in tests/: test_ops.py, test_reference.py, test_fast.py,
 * test_errors.py, test_sanitizers.py, test_cuda_emu.py, test_cuda_dispatch.py, test_cuda_gpu.py. */
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
/* Lives in: csrc/embedding.c (one version: a copy and a scatter-add), checks csrc/checks.h
 * pytfm__check_embedding_*, CUDA cuda/embedding.cu, Python pytfm/ops.py embedding_forward/backward,
 * reference pytfm/reference.py; tests in tests/: test_ops.py, test_properties.py,
 * test_reference.py, test_fast.py, test_errors.py, test_sanitizers.py, test_cuda_emu.py,
 * test_cuda_dispatch.py, test_cuda_gpu.py. */
/* y[i, :] = table[ids[i], :]
 *   y     [rows, dim] written
 *   ids   [rows], each in [0, vocab); one outside gives PYTFM_STATUS_OUT_OF_RANGE
 *   table [vocab, dim]; vocab >= 1, dim >= 1
 */
PYTFM_API pytfm_status pytfm_embedding_forward(float *y, const int64_t *ids, const float *table,
                                               int64_t rows, int64_t vocab, int64_t dim);

/*   dtable [vocab, dim] accumulated: dtable[ids[i], :] += dy[i, :] (repeated ids add up)
 *   dy [rows, dim], ids [rows] as in the forward
 */
PYTFM_API pytfm_status pytfm_embedding_backward(float *dtable, const float *dy,
                                                const int64_t *ids, int64_t rows, int64_t vocab,
                                                int64_t dim);

/* ---- Softmax cross-entropy ----------------------------------------------------------- */
/* Lives in: csrc/cross_entropy.c (plain loop; fast: fast_impl.h logsumexp, scaled_exp), checks
 * csrc/checks.h pytfm__check_cross_entropy_*, CUDA cuda/cross_entropy.cu, Python pytfm/ops.py
 * cross_entropy_forward/backward, reference pytfm/reference.py; tests in tests/: test_ops.py,
 * test_properties.py, test_reference.py, test_fast.py, test_errors.py, test_sanitizers.py,
 * test_cuda_emu.py, test_cuda_dispatch.py, test_cuda_gpu.py. */
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

/* ---- AdamW, one fused in-place step (as torch.optim.AdamW) -------------------------- */
/* Lives in: csrc/adamw.c (plain loop; fast: fast_impl.h adamw), checks csrc/checks.h
 * pytfm__check_adamw, CUDA cuda/adamw.cu, Python pytfm/ops.py adamw_step (pytfm/optim.py drives
 * it), reference pytfm/reference.py adamw_step; tests in tests/: test_ops.py, test_properties.py,
 * test_fast.py, test_errors.py, test_sanitizers.py, test_cuda_emu.py, test_cuda_dispatch.py,
 * test_cuda_gpu.py. */
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
 * clip_grad_norm over the model's one gradient buffer). Lives in csrc/adamw.c, CUDA
 * cuda/adamw.cu; Python pytfm/ops.py sum_squares; tests in tests/: test_flat.py,
 * test_cuda_emu.py, test_cuda_dispatch.py.
 *   *out = Σ_i x[i]² in double: blocks of 16384 elements each summed in order, then the block
 *   sums in order (the same bits at any thread count); x [count], count >= 0
 * Scratch: one double per block, when there are more than 64 blocks.
 */
PYTFM_API pytfm_status pytfm_sum_squares(double *out, const float *x, int64_t count);

/* ---- Attention: multi-head scaled dot-product, flash-style ------------------------- */
/* Lives in: csrc/attention.c (plain: forward_head/backward_head; fast: *_head_fast on sgemm's
 * micro-kernels), checks csrc/checks.h pytfm__check_attention_*, CUDA twin cuda/attention.cu
 * (the *_cuda functions at the end of this header), Python pytfm/ops.py attention_* (CuPy
 * arrays run the twin; KV cache class: pytfm/kvcache.py), reference pytfm/reference.py; tests
 * in tests/: test_attention.py (properties, decoding), test_reference.py, test_fast.py,
 * test_memory.py, test_sanitizers.py, test_model.py, test_cuda_attention.py (the twin under
 * the emulator), test_cuda_gpu.py (on a GPU). */
/* O = softmax(scale · q kᵀ [+ causal mask]) v for every batch b and head h, computed tile by
 * tile with an online softmax: the [T, T] score matrix is never stored. With causal != 0,
 * position t attends to keys 0..t only, and tiles above the diagonal are skipped. Parallel
 * over B·H when built with OpenMP; the result does not depend on the number of threads.
 *   o     [B, T, H, D] written
 *   lse   [B, H, T]    written: log Σ_s exp(scores[t, s]), saved for the backward
 *   q, k, v [B, T, H, D] (the layout a fused QKV projection produces, no permute needed)
 *   D >= 1; scale finite, usually 1/sqrt(D)
 * Scratch (the fast version: isa AVX2 or above, T >= 8): per thread, a copy of one head's
 * keys transposed and a 64×256 tile of scores, D·T + 16512 floats (linear in T). The plain
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
 * two 64×64 tiles and a row of T sums, 2·D·T + T + 8192 floats. The plain version: none.
 */
PYTFM_API pytfm_status pytfm_attention_backward(float *dq, float *dk, float *dv, const float *dy,
                                                const float *q, const float *k, const float *v,
                                                const float *o, const float *lse, int64_t B,
                                                int64_t T, int64_t H, int64_t D, float scale,
                                                int32_t causal);

/* Write n_new new keys and values into a KV cache at positions [start, start + n_new).
 *   k_cache, v_cache [B, Tmax, H, D] updated; k, v [B, n_new, H, D]
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

/* ---- Model: a GPT from a pytfm checkpoint, in C ----------------------------------------- */
/* Lives in: csrc/json.c and csrc/safetensors.c (the checkpoint reader, internal header
 * csrc/checkpoint.h), csrc/model.c (models and sessions), csrc/sample.c (the generator and
 * sampling); example examples/generate.c; tests tests/test_c_model.py (against pytfm.nn),
 * tests/test_c_checkpoint.py (malformed files), tests/c/open_checkpoints.c (the same under
 * ASan), tests/fuzz/ (libFuzzer).
 *
 * The model pytfm.nn.GPT runs, read from a checkpoint written by pytfm.checkpoint.save (or
 * examples/train_tiny.py): the forward pass on token sequences, and a session that decodes
 * token by token through a KV cache, through the same kernels Python uses, in the same order,
 * so that logits agree with Python's to float32 rounding (the same bits, where the thread
 * count and instruction-set cap are the same).
 *
 * Handles are opaque. A model is read-only once opened: any number of threads may call
 * pytfm_model_forward and use their own sessions of one model at once. A session belongs to one
 * thread at a time. Close sessions before their model. Nothing is global: two models, or two
 * sessions, share no state. */

typedef struct pytfm_model pytfm_model;
typedef struct pytfm_session pytfm_session;

/* Where a model runs. Only the CPU for now; PYTFM_DEVICE_CUDA is NOT_SUPPORTED (reserved). */
typedef enum pytfm_device {
    PYTFM_DEVICE_CPU = 0,
    PYTFM_DEVICE_CUDA = 1
} pytfm_device;

/* pytfm.nn.GPTConfig.pos */
typedef enum pytfm_pos {
    PYTFM_POS_ROPE = 0,       /* rotary embeddings on q and k */
    PYTFM_POS_SINUSOIDAL = 1, /* a fixed sin/cos table added to the token embeddings */
    PYTFM_POS_NONE = 2        /* no positions */
} pytfm_pos;

/* A model's shape, from the checkpoint's __metadata__ (GPTConfig and the training step). */
typedef struct pytfm_model_config {
    int64_t vocab;
    int64_t d_model;
    int64_t n_layer;
    int64_t n_head;
    int64_t max_seq;        /* the longest sequence: forward's T and a session's length */
    int32_t pos;            /* a pytfm_pos */
    int32_t tie_embeddings; /* 1: the LM head is the token embedding table */
    int64_t n_params;       /* floats of parameters (a tied table counted once) */
    int64_t step;           /* the training step the checkpoint was saved at */
} pytfm_model_config;

/* Open the checkpoint at path and read its parameters into memory (the file is closed when
 * this returns). Every byte is checked before any is trusted: the safetensors header (length,
 * strict UTF-8 JSON, dtypes, shapes, offsets that tile the data exactly), the pytfm
 * __metadata__ (format, a GPTConfig that pytfm.nn accepts, step), and that the tensors are
 * exactly the parameters that config implies, by name, dtype and shape (AdamW's moments,
 * optim.m.<name> / optim.v.<name>, may be there too and are skipped). A file Python's
 * pytfm.checkpoint.load rejects is rejected here too: PYTFM_STATUS_INVALID_ARGUMENT with a
 * message naming the file and what is wrong; PYTFM_STATUS_NOT_SUPPORTED for a device other
 * than PYTFM_DEVICE_CPU; PYTFM_STATUS_OUT_OF_MEMORY. On failure *model is set to NULL.
 *   model   receives the handle (pytfm_model_close frees it)
 *   device  a pytfm_device */
PYTFM_API pytfm_status pytfm_model_open(pytfm_model **model, const char *path, int32_t device);

/* As pytfm_model_open, from size bytes of a checkpoint in memory (copied: data may be freed
 * once this returns). */
PYTFM_API pytfm_status pytfm_model_open_memory(pytfm_model **model, const void *data,
                                               size_t size, int32_t device);

/* Free a model (NULL: nothing to do). Its sessions must be closed first. */
PYTFM_API pytfm_status pytfm_model_close(pytfm_model *model);

/* Fill *config with the model's shape. */
PYTFM_API pytfm_status pytfm_model_get_config(const pytfm_model *model,
                                              pytfm_model_config *config);

/* The logits of every position of B sequences of T tokens, as pytfm.nn.GPT.forward(tokens).
 *   logits [B, T, vocab] written;  tokens [B, T], each in [0, vocab) (else
 *   PYTFM_STATUS_OUT_OF_RANGE);  1 <= T <= max_seq;  B >= 0 (0: nothing to do)
 * Scratch: the activations of one layer for B·T tokens, B·T·(12·d_model + n_head + 2) + 2·T
 * floats, plus what the kernels take (pytfm_linear_forward's, pytfm_attention_forward's). */
PYTFM_API pytfm_status pytfm_model_forward(const pytfm_model *model, float *logits,
                                           const int64_t *tokens, int64_t B, int64_t T);

/* A decoding session of one sequence: KV caches for max_len positions (1 <= max_len <=
 * max_seq; 0: max_seq), allocated here, 2·n_layer·max_len·d_model floats. On failure
 * *session is set to NULL. */
PYTFM_API pytfm_status pytfm_session_open(pytfm_session **session, const pytfm_model *model,
                                          int64_t max_len);

/* Free a session (NULL: nothing to do). */
PYTFM_API pytfm_status pytfm_session_close(pytfm_session *session);

/* Append n >= 1 tokens to the sequence (a prompt at once, or one token at a time) and write
 * the logits [vocab] that follow the last of them, as pytfm.nn.GPT.decode; logits may be NULL
 * to only fill the caches. Each token costs O(length · d_model) beyond its projections: no
 * recomputation of the earlier ones. length + n > max_len is PYTFM_STATUS_INVALID_ARGUMENT and
 * changes nothing (as does any failure: the length stays, and with it what the next feed sees).
 *   logits [vocab] written;  tokens [n], each in [0, vocab) (else PYTFM_STATUS_OUT_OF_RANGE)
 * Scratch: as pytfm_model_forward with B = 1, T = n, plus n·vocab floats when n > 1 and logits
 * is not NULL (the LM head runs on every new token, as in Python, so that the last one's
 * logits are the bits GPT.decode gives). */
PYTFM_API pytfm_status pytfm_session_feed(pytfm_session *session, float *logits,
                                          const int64_t *tokens, int64_t n);

/* The number of tokens fed since the session opened or was last reset. */
PYTFM_API pytfm_status pytfm_session_length(const pytfm_session *session, int64_t *length);

/* Forget every token (the caches are kept for reuse). */
PYTFM_API pytfm_status pytfm_session_reset(pytfm_session *session);

/* The random number generator of sampling: xoshiro256** (Blackman and Vigna, 2018), its
 * state seeded by SplitMix64 from a 64-bit seed: state[i] = the i-th SplitMix64 output,
 * i = 0..3, starting from x = seed (x += 0x9e3779b97f4a7c15; z = x;
 * z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
 * output z ^ (z >> 31)). The stream is part of the API: the same seed gives the same numbers
 * on every machine and in every version with this ABI number. The state may be copied. */
typedef struct pytfm_rng {
    uint64_t state[4];
} pytfm_rng;

/* Seed *rng as above. */
PYTFM_API pytfm_status pytfm_rng_seed(pytfm_rng *rng, uint64_t seed);

/* The next 64-bit number of the stream. */
PYTFM_API pytfm_status pytfm_rng_next(pytfm_rng *rng, uint64_t *value);

/* Draw the next token from logits [vocab], as pytfm.generate.sample_next:
 *   temperature == 0: the index of the largest logit (the first of equals; no random number
 *   is drawn); temperature > 0 (finite; a double, as Python's float, so that 0.8 is Python's
 *   0.8 and not the float nearest it): softmax((logits − max) / temperature) in double,
 *   restricted to the logits >= the top_k-th largest (top_k <= 0 or >= vocab: all), then the
 *   first index whose cumulative probability reaches u = (next >> 11) · 2^-53, one number of
 *   rng's stream per draw (vocab − 1 if rounding leaves u above the total).
 *   logits must be finite (else PYTFM_STATUS_INVALID_ARGUMENT). rng may be NULL when
 *   temperature == 0.
 * The sum of the probabilities is taken in NumPy's pairwise order, so that given the same u the
 * token is Python's (but for a last-bit difference of exp, which moves a token only when u lies
 * within about 1e-16 of a cumulative probability). No scratch. */
PYTFM_API pytfm_status pytfm_sample(int64_t *token, const float *logits, int64_t vocab,
                                    double temperature, int64_t top_k, pytfm_rng *rng);

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
 * In a build without CUDA (nvcc was not found, or PYTFM_CUDA=0) every _cuda function and
 * pytfm_cuda_stream_synchronize return PYTFM_STATUS_NOT_SUPPORTED and say so in
 * pytfm_last_error() (setup.py generates them from this header); pytfm_get_build_info()
 * tells which build this is.
 */

/* The number of CUDA devices this process can use: 0, not an error, where there is no device
 * or no driver, and in a build without CUDA. */
PYTFM_API pytfm_status pytfm_cuda_device_count(int32_t *count);

/* Wait for the work queued on stream (NULL: the default stream); a fault raised by a kernel
 * comes back here as PYTFM_STATUS_CUDA_ERROR with the CUDA runtime's message. */
PYTFM_API pytfm_status pytfm_cuda_stream_synchronize(void *stream);

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
 * arguments. Tests: tests/test_cuda_sgemm.py. */
PYTFM_API pytfm_status pytfm_sgemm_plain_cuda(float *c, const float *a, const float *b,
                                              int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                              int32_t trans_b, float beta, void *stream);

PYTFM_API pytfm_status pytfm_linear_forward_cuda(float *y, const float *x, const float *w,
                                                 const float *b, int64_t rows, int64_t in,
                                                 int64_t out, void *stream);

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

/* dw and db are accumulated by a column reduction in a fixed order: no atomics, same bits on
 * every run. */
PYTFM_API pytfm_status pytfm_layernorm_backward_cuda(float *dx, float *dw, float *db,
                                                     const float *dy, const float *x,
                                                     const float *w, const float *mean,
                                                     const float *rstd, int64_t rows,
                                                     int64_t cols, void *stream);

/* The angles come from a table of cos and sin per position row (T rows for pos [T], B·T for
 * [B, T]) made on the device in double and rounded to float, as the CPU does, in stream-ordered
 * scratch (cudaMallocAsync) of 4·rows·D bytes. */
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
 * sort on the device (16·rows bytes of stream-ordered scratch, cudaMallocAsync), each group
 * then added by one thread per column chunk; up to 16 rows, one thread per column walks them. */
PYTFM_API pytfm_status pytfm_embedding_backward_cuda(float *dtable, const float *dy,
                                                     const int64_t *ids, int64_t rows,
                                                     int64_t vocab, int64_t dim, void *stream);

/* loss is written on the device. */
PYTFM_API pytfm_status pytfm_cross_entropy_forward_cuda(float *loss, float *lse,
                                                        const float *logits,
                                                        const int64_t *targets, int64_t rows,
                                                        int64_t vocab, int64_t ignore_index,
                                                        void *stream);

/* kept is counted on the device into 8 bytes of stream-ordered scratch (cudaMallocAsync). */
PYTFM_API pytfm_status pytfm_cross_entropy_backward_cuda(float *dlogits, const float *logits,
                                                         const int64_t *targets,
                                                         const float *lse, int64_t rows,
                                                         int64_t vocab, int64_t ignore_index,
                                                         float dloss, void *stream);

PYTFM_API pytfm_status pytfm_adamw_step_cuda(float *param, float *m, float *v, const float *grad,
                                             int64_t count, int64_t step, double lr,
                                             double beta1, double beta2, double eps,
                                             double weight_decay, void *stream);

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
 * without a copy to the host. A fixed order: the same bits on every run. */
PYTFM_API pytfm_status pytfm_sum_squares_cuda(double *out, const float *x, int64_t count,
                                              void *stream);

/* Attention on the GPU, FlashAttention-2's structure in float32: the same arguments, shapes,
 * rules and results (to float32 rounding) as pytfm_attention_forward/backward/cache_append/
 * decode. Memory linear in T; head dims 1 <= D <= PYTFM_CUDA_ATTENTION_MAX_D (a larger D is
 * PYTFM_STATUS_INVALID_ARGUMENT); the backward is deterministic (no atomics: the same bits on
 * every run). Any scratch is allocated on the stream and freed after use. */
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

/* PYTFM_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PYTFM_H */
