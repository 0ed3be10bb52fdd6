/*
 * internal.h — helpers shared by the kernel files; not part of the public API. The library is
 * built with -fvisibility=hidden, so nothing declared here is exported.
 */
#ifndef PYTFM_INTERNAL_H
#define PYTFM_INTERNAL_H

#include <float.h>
#include <math.h>
#include <string.h>

#include "pytfm.h"

/* The smaller of a and b (each evaluated twice: pass plain expressions). */
#define PYTFM_MIN(a, b) ((a) < (b) ? (a) : (b))

/* GELU's tanh approximation, y = ½ x (1 + tanh(K (x + A x³))): the constants of GPT-2 and of
 * torch's approximate="tanh", shared by the plain (gelu.c), vectorised (fast_impl.h) and CUDA
 * (cuda/gelu.cu) kernels. */
#define PYTFM_GELU_K 0.7978845608028654f /* sqrt(2/π) */
#define PYTFM_GELU_A 0.044715f
/* The backward's v used in the term 2 v s (1 − s) · k (1 + 3 a v²), s = ½ (1 + tanh u): past
 * |v| = 16, e^(∓2u) is 0 or +inf in float, s is exactly 0 or 1 and the term is 0, so v is
 * clamped to ±16 there and v·v cannot overflow into 0·inf = NaN for any finite v; ±inf is
 * left as it is (NaN, as in the reference). */
#define PYTFM_GELU_TERM_V(v)                                                                   \
    ((v) > 16.0f && (v) <= FLT_MAX ? 16.0f : (v) < -16.0f && (v) >= -FLT_MAX ? -16.0f : (v))

/* LayerNorm's float sums are used when Σ (x − μ)² is finite and var + eps is well above
 * float's underflow (its small squares then keep their digits); a row of huge values (1e20:
 * squares past FLT_MAX) or, with eps = 0, of tiny spread is summed again in double (the fast
 * kernels and the CUDA one; the plain one always sums in double). */
#define PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps)                                                  \
    ((ss) <= FLT_MAX && (ss) / (float)(cols) + (eps) >= 1e-30f)

/* Record a formatted message as this thread's last error and return status. */
pytfm_status pytfm__fail(pytfm_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Argument checks, used at the top of every public function, before anything is written.
 * Each failure names the function and the argument, and says what was expected. */
#define PYTFM_CHECK(cond, ...)                                                                 \
    do {                                                                                       \
        if (!(cond)) return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, __VA_ARGS__);          \
    } while (0)

/* Return the status of call if it is not OK (for helpers that check arguments). */
#define PYTFM_TRY(call)                                                                        \
    do {                                                                                       \
        pytfm_status st_ = (call);                                                             \
        if (st_ != PYTFM_STATUS_OK) return st_;                                                \
    } while (0)

/* A pointer may be NULL only when its buffer holds no elements. */
#define PYTFM_CHECK_PTR(p, count) PYTFM_CHECK_PTR_IN(__func__, p, count)
#define PYTFM_CHECK_PTR_IN(func, p, count)                                                     \
    PYTFM_CHECK((p) != NULL || (count) == 0, "%s: %s must not be NULL", func, #p)

#define PYTFM_CHECK_MIN(v, lo) PYTFM_CHECK_MIN_IN(__func__, v, lo)
#define PYTFM_CHECK_MIN_IN(func, v, lo)                                                        \
    PYTFM_CHECK((v) >= (lo), "%s: %s must be >= %lld, got %lld", func, #v, (long long)(lo),  \
                (long long)(v))

#define PYTFM_CHECK_FINITE(v) PYTFM_CHECK_FINITE_IN(__func__, v)
#define PYTFM_CHECK_FINITE_IN(func, v)                                                         \
    PYTFM_CHECK(isfinite(v), "%s: %s must be finite, got %g", func, #v, (double)(v))

/* ---- sizes and overlaps ------------------------------------------------------------------
 * Every product of sizes and sum of offsets in the argument checks (checks.h) goes through
 * pytfm__mul_within and pytfm__add_within, so that a size whose arithmetic would wrap is
 * rejected instead of wrapping; once an array's element count has passed them, every index
 * into it, and every product of its sizes a kernel forms, fits in an int64_t. */

/* The most elements of elem_bytes bytes each one array may have: its byte count must fit in
 * a ptrdiff_t (for float32, 2^61 − 1 on a 64-bit machine). */
static inline int64_t pytfm__max_elems(size_t elem_bytes) {
    return (int64_t)(PTRDIFF_MAX / (ptrdiff_t)elem_bytes);
}

/* *out = a·b for a, b >= 0, and 1; or 0, *out untouched, when a·b would exceed limit */
static inline int pytfm__mul_within(int64_t a, int64_t b, int64_t limit, int64_t *out) {
    if (a != 0 && b > limit / a) return 0;
    *out = a * b;
    return 1;
}

/* *out = a + b for a, b >= 0, and 1; or 0, *out untouched, when a + b would exceed limit */
static inline int pytfm__add_within(int64_t a, int64_t b, int64_t limit, int64_t *out) {
    if (b > limit - a) return 0;
    *out = a + b;
    return 1;
}

/* One buffer of a call, for the overlap check (pytfm__check_disjoint, checks.h): its public
 * name, address and size in bytes (0, or a NULL p: it holds nothing and overlaps nothing). */
typedef struct pytfm__span {
    const char *name;
    const void *p;
    int64_t bytes;
} pytfm__span;

/* 1 when a and b share at least one byte */
static inline int pytfm__overlap(pytfm__span a, pytfm__span b) {
    if (!a.p || !b.p || a.bytes == 0 || b.bytes == 0) return 0;
    const uintptr_t a0 = (uintptr_t)a.p, b0 = (uintptr_t)b.p;
    return a0 < b0 + (uint64_t)b.bytes && b0 < a0 + (uint64_t)a.bytes;
}

/* Check that every index in ids[0..count) is in [0, limit), allowing `ignore` when
 * allow_ignore. Returns PYTFM_STATUS_OUT_OF_RANGE naming the first bad one. */
pytfm_status pytfm__check_indices(const char *func, const char *name, const int64_t *ids,
                                  int64_t count, int64_t limit, int allow_ignore, int64_t ignore);

/* Scratch space for one call: count elements of size bytes, 64-byte aligned (free() it). On
 * failure, an overflowing count·size included, it records "<func>: cannot allocate N bytes of
 * scratch" as this thread's error and returns NULL, so that the caller (func, the public
 * function the user called) just returns PYTFM_STATUS_OUT_OF_MEMORY. A count of 0 still gives
 * a valid pointer. */
void *pytfm__scratch(const char *func, int64_t count, size_t size);

/* bytes for a model's weights (free() releases them), or NULL: aligned to 2 MiB and in huge
 * pages where the system grants them, when that large (weights.c: a decoded token streams
 * every weight, and small pages halve the rate of that stream); else as pytfm__scratch. Sets
 * no error: the caller names what it allocates. */
void *pytfm__weights_alloc(size_t bytes);

/* PYTFM_NUM_THREADS and PYTFM_MAX_ISA applied, once (environment.c): every get and set of the
 * thread count and the ISA cap calls it first; the two stores below apply a value without it */
void pytfm__read_environment(void);
void pytfm__store_num_threads(int32_t threads);
void pytfm__store_max_isa(int32_t isa);

/* the thread count when none is set: OpenMP's, but no more than the cores other processes
 * leave free (free_cores.c), so that a busy neighbour does not slow the kernels down */
int pytfm__default_threads(void);

/* the team a parallel loop runs: pytfm_get_num_threads(), and for a count set within this
 * process's cores, no more than the cores other processes leave free (free_cores.c): an
 * explicit count is then the most threads, never a team on a core another process keeps
 * busy. A count above the cores (asked for on purpose) is the team as it is. */
int pytfm__team_threads(void);

/* Parallel loops. Each macro is only an OpenMP pragma, written on the line above an ordinary
 * `for` that it hands to pytfm_get_num_threads() threads; without OpenMP it is nothing and the
 * loop runs on the calling thread. Only loops whose iterations write disjoint memory use them,
 * so results do not depend on the number of threads. */
#define PYTFM_PRAGMA(x) _Pragma(#x)
#if defined(_OPENMP)
/* one iteration at a time to each free thread */
#define PYTFM_PARALLEL_FOR                                                                     \
    PYTFM_PRAGMA(omp parallel for schedule(dynamic, 1) num_threads(pytfm__team_threads()))
/* the same, on the calling thread alone unless cond: small inputs skip waking the others */
#define PYTFM_PARALLEL_FOR_IF(cond)                                                            \
    PYTFM_PRAGMA(omp parallel for schedule(dynamic, 1) num_threads(pytfm__team_threads())     \
                     if (cond))
/* the same, on at most `threads` threads: for loops whose per-thread workspaces were sized
 * for that many (read pytfm_get_num_threads() once: another thread may change it meanwhile) */
#define PYTFM_PARALLEL_FOR_THREADS(threads)                                                    \
    PYTFM_PRAGMA(omp parallel for schedule(dynamic, 1)                                         \
                     num_threads(pytfm__team_within(threads)))
/* above `for (int64_t r = 0; r < rows; r++)` over rows of cols floats each: blocks of
 * pytfm__rows_per_task(cols) rows go to the threads; a single block runs on the calling
 * thread alone */
#define PYTFM_PARALLEL_ROWS(rows, cols)                                                        \
    PYTFM_PRAGMA(omp parallel for schedule(dynamic, pytfm__rows_per_task(cols))                \
                     num_threads(pytfm__team_threads()) if ((rows) > pytfm__rows_per_task(cols)))
#else
#define PYTFM_PARALLEL_FOR
#define PYTFM_PARALLEL_FOR_IF(cond)
#define PYTFM_PARALLEL_FOR_THREADS(threads)
#define PYTFM_PARALLEL_ROWS(rows, cols)
#endif

/* pytfm__team_threads(), but at most threads (a count read once, that workspaces were sized
 * for) */
static inline int pytfm__team_within(int64_t threads) {
    const int team = pytfm__team_threads();
    return threads < team ? (int)threads : team;
}

/* The calling thread's index in the current parallel loop (0 outside one): per-thread
 * workspaces are indexed by it, in loops under PYTFM_PARALLEL_FOR_THREADS(threads), whose
 * team never has more than `threads` threads. */
#if defined(_OPENMP)
#include <omp.h>
static inline int64_t pytfm__thread_id(void) { return omp_get_thread_num(); }
#else
static inline int64_t pytfm__thread_id(void) { return 0; }
#endif

/* Rows per parallel task for row-wise ops: about PYTFM_TASK_ELEMS floats each */
enum { PYTFM_TASK_ELEMS = 16384 };
static inline int64_t pytfm__rows_per_task(int64_t cols) {
    return cols >= PYTFM_TASK_ELEMS ? 1 : PYTFM_TASK_ELEMS / (cols > 0 ? cols : 1);
}

/* 1 when rows of cols floats make at most one task: then the loop runs as a plain loop, not
 * under a parallel pragma whose `if` is false, because entering an OpenMP region costs about
 * 0.35 µs (libgomp builds a team of one and wakes a futex) even when it runs on the calling
 * thread alone; a decoded token calls some fifty kernels on rows of one token
 * (bench/c_generate.py). */
static inline int pytfm__one_task(int64_t rows, int64_t cols) {
    return rows <= pytfm__rows_per_task(cols);
}

/* Σ a[i]·b[i] with eight independent partial sums (so the additions pipeline instead of
 * waiting on each other), combined in a fixed order: the same inputs give the same bits. */
static inline float pytfm__dot(const float *a, const float *b, int64_t count) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= count; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    for (; i < count; i++) s[i & 7] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* y[i] += alpha · x[i] */
static inline void pytfm__axpy(float *y, float alpha, const float *x, int64_t count) {
    for (int64_t i = 0; i < count; i++) y[i] += alpha * x[i];
}

/* What a product does to each element of C once its sum is complete (the linear layer's
 * output pass): C[i, j] += bias[j] when bias, then act[i, j] = gelu(C[i, j]) when act, through
 * gelu_row (a row kernel, y[0..count) = gelu(x[0..count)), element by element: it is called on
 * pieces of rows, so its result must not depend on where a piece starts or ends). The blocked
 * driver applies it to each MC×NC block of C after the block's last k slice, while the block
 * is still in L2; the plain path in a separate pass over C. Same bits either way. */
typedef struct pytfm__epilogue {
    const float *bias; // [n], or NULL
    float *act;        // [m, n], as C, or NULL
    void (*gelu_row)(float *y, const float *x, int64_t count);
} pytfm__epilogue;

/* One product C = β·C + op(A)·op(B), with the arguments of pytfm_sgemm, then the epilogue
 * (NULL: none), in a pytfm_precision: FP32, or BF16 (A and B rounded to BF16 as they are
 * read, pytfm__bf16_round_bits). b16, when not NULL, is B given in BF16 only (b NULL; BF16,
 * trans_b, on AVX512-BF16 only: pytfm__gemm_bf16): the top halves of B's values, read as the
 * rounding of their float32 widening (the same products). */
typedef struct pytfm__product {
    float *c;
    const float *a, *b;
    int64_t m, n, k;
    int trans_a, trans_b;
    float beta;
    const pytfm__epilogue *epilogue;
    int precision;
    const uint16_t *b16;
} pytfm__product;

/* The products in order, each as pytfm_sgemm (FP32) or pytfm_sgemm_ex (BF16) computes it
 * (sgemm.c, sgemm_bf16.c), and its epilogue, for kernels built on them (linear.c). One scratch
 * allocation, made before the first write, serves them all: when it fails, func's
 * PYTFM_STATUS_OUT_OF_MEMORY is returned and no output has changed. The arguments are not
 * checked here. */
pytfm_status pytfm__sgemm_all(const char *func, const pytfm__product *products, int count);

/* g's epilogue on the finished rows × cols block of C at c (row stride g->n), whose first
 * element is C[i0, j0] (sgemm.c) */
void pytfm__product_finish(const pytfm__product *g, float *c, int64_t i0, int64_t j0,
                           int64_t rows, int64_t cols);

/* ---- BF16 -----------------------------------------------------------------------------------
 * BF16 is the top half of a float32: 1 sign, 8 exponent and 7 fraction bits (8 significant
 * bits, unit roundoff 2^-9), float32's range. A BF16 value is kept here as a float whose low
 * 16 bits are zero, or as those top 16 bits (uint16_t); a product of two is exact in float32
 * (8 + 8 significant bits <= 24). */

/* 1 where the compiler can build the AVX512-BF16 kernels (sgemm_bf16.c): GCC 10 and Clang 9
 * brought the intrinsics */
#if (defined(__x86_64__) || defined(__i386__)) &&                                              \
    ((defined(__clang__) && __clang_major__ >= 9) ||                                           \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define PYTFM_HAVE_BF16_KERNELS 1
#else
#define PYTFM_HAVE_BF16_KERNELS 0
#endif

/* The bits u of a float rounded to BF16 as every BF16 product rounds its inputs (and
 * pytfm_round_bf16): round to nearest, ties to even, on the bits. Adding 0x7FFF plus the lowest
 * kept bit carries into the kept half exactly when the dropped half is above one half, or is
 * one half and the kept half odd; a finite float within half a BF16 ulp of 2^128 carries into
 * the exponent and becomes inf, as round-to-nearest does. A NaN keeps its top half with the
 * quiet bit set (the add could carry it into inf); a subnormal (exponent bits 0, |x| < 2^-126)
 * becomes a zero of its sign, as the AVX512-BF16 conversions and products take them, so that
 * every path multiplies the same values. The result's low 16 bits are zero. */
static inline uint32_t pytfm__bf16_round_bits(uint32_t u) {
    // selections, not branches: loops over arrays of these vectorise
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    r = (u & 0x7FFFFFFFu) > 0x7F800000u ? (u | 0x00400000u) & 0xFFFF0000u : r; // NaN
    return (u & 0x7F800000u) == 0 ? u & 0x80000000u : r;                     // subnormal, 0
}

/* x rounded to BF16 (pytfm__bf16_round_bits), as a float */
static inline float pytfm__bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = pytfm__bf16_round_bits(u);
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The BF16 products on AVX512-BF16, for pytfm__sgemm_all (sgemm_bf16.c): the 4-byte words of
 * packing scratch that product g takes on `threads` threads, and the product itself with buf
 * holding them. Only where pytfm_get_bf16_isa() is PYTFM_ISA_AVX512_BF16. */
int64_t pytfm__gemm_bf16_scratch(const pytfm__product *g, int64_t threads);
void pytfm__gemm_bf16(const pytfm__product *g, int64_t threads, uint32_t *buf);

/* pytfm_linear_forward_ex at PYTFM_PRECISION_BF16 (linear.c), the arguments checked by the
 * caller, with w16 (or NULL) W's BF16 copy: the one-row product reads it instead of W, for
 * the same bits (the C model's decoding, which keeps both). w may be NULL where w16 is not:
 * W is then w16's values (a model of BF16 weights only), and every product reads those,
 * rounded as W's float32 widening would be (so the bits of w = that widening). */
pytfm_status pytfm__linear_forward_bf16(const char *func, float *y, const float *x,
                                        const float *w, const uint16_t *w16, const float *b,
                                        int64_t rows, int64_t in, int64_t out);

/* pytfm_embedding_forward of a table given in BF16 (the top halves of its floats): the rows
 * widened exactly (embedding.c), the arguments checked by the caller (ids included). */
pytfm_status pytfm__embedding_forward_bf16(float *y, const int64_t *ids, const uint16_t *table,
                                           int64_t rows, int64_t vocab, int64_t dim);

/* y[o] = Σ_i bf16(x[i])·bf16(w[o·ldw + i]) (+ b[o]) for o < out, on AVX512-BF16: the BF16
 * linear layer on one row (sgemm_bf16.c). w16, when not NULL, holds the same weights already
 * rounded (the top halves, row stride ldw) and is read instead of w: the same bits, half the
 * bytes (the C model's decoding). W's rows are read four at a time, the next four prefetched
 * meanwhile, whether W is in the caches or comes from memory. */
void pytfm__gemv_bf16(float *y, const float *x, const float *w, const uint16_t *w16,
                      int64_t ldw, const float *b, int64_t in, int64_t out);

/* An mr×nr register micro-kernel of sgemm.c, also used by attention.c:
 *   C[0..rows)[0..cols) (row stride ldc) = bt·C + Σ_{p<kc} A(p, r)·B(p, j)
 * with A(p, r) = a[p·a_sp + r·a_sr] and B(p, j) = b[p·ldb + j] (j < cols contiguous);
 * bt = 0 writes C without reading it. rows <= mr, cols <= nr. */
typedef void (*pytfm__micro_fn)(float *c, int64_t ldc, const float *a, int64_t a_sp,
                                int64_t a_sr, const float *b, int64_t ldb, int64_t kc, int rows,
                                int cols, float bt);
typedef struct pytfm__micro {
    int mr, nr;
    pytfm__micro_fn run;
} pytfm__micro;

/* the micro-kernel for isa, or NULL where there is none (below AVX2) */
const pytfm__micro *pytfm__micro_for(int32_t isa);

/* the pytfm_cpu_feature bits of the CPU running now */
uint64_t pytfm__cpu_features(void);

/* 1 when this CPU (and build) can run kernels written for isa */
int pytfm__cpu_has(pytfm_isa isa);

#endif /* PYTFM_INTERNAL_H */
