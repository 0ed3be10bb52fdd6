/*
 * pytfm_cuda.cuh — what every .cu file in cuda/ includes: the CUDA runtime under nvcc, the CPU
 * emulator (cuda/emu/emu.h) under a host C++ compiler, and between them one way to launch a
 * kernel and turn its error into a pytfm_status, so both compilers see the same source.
 *
 *   PYTFM_TRY(PYTFM_LAUNCH(kernel, grid, block, shared_bytes, stream, args...));
 *
 * launches kernel<<<grid, block, shared_bytes, stream>>>(args...) (the emulator: runs it) and
 * returns PYTFM_STATUS_CUDA_ERROR, with cudaGetErrorString() in pytfm_last_error(), if the
 * launch failed. Errors raised later by the kernel itself surface at the next synchronisation.
 */
#ifndef PYTFM_CUDA_CUH
#define PYTFM_CUDA_CUH

#include <math.h> /* before internal.h's extern "C" block: <math.h> is C++ under g++ */
#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#define PYTFM_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#else
#include "emu/emu.h"
#define PYTFM_DYNAMIC_SHARED(type, name) type *name = (type *)::pytfm_emu::dynamic_shared()
#endif

extern "C" {
#include "checks.h" /* internal.h, and the argument checks shared with csrc/ */
}

/* The status of the last launch (or runtime call) on this thread, named after func. */
static inline pytfm_status pytfm__cuda_status(const char *func, cudaError_t err) {
    if (err == cudaSuccess) return PYTFM_STATUS_OK;
    return pytfm__fail(PYTFM_STATUS_CUDA_ERROR, "%s: %s (%s)", func, cudaGetErrorString(err),
                       cudaGetErrorName(err));
}

template <typename... P, typename... A>
static pytfm_status pytfm__launch(const char *func, void (*kernel)(P...), dim3 grid, dim3 block,
                                  size_t shared_bytes, void *stream, A... args) {
#ifdef __CUDACC__
    kernel<<<grid, block, shared_bytes, (cudaStream_t)stream>>>(args...);
#else
    (void)stream;
    // the kernel's address keys its shared memory limit (cudaFuncSetAttribute)
    pytfm_emu::launch(grid, block, shared_bytes, [=] { kernel(args...); },
                      reinterpret_cast<const void *>(kernel));
#endif
    return pytfm__cuda_status(func, cudaGetLastError());
}

#define PYTFM_LAUNCH(...) pytfm__launch(__func__, __VA_ARGS__)

/* Let kernel's launches ask for `bytes` of dynamic shared memory: beyond 48 KiB the GPU needs
 * the opt-in (up to 227 KiB on sm_90, 163 KiB on sm_80); below, it is a no-op. Call it before
 * each PYTFM_LAUNCH that needs it (a host call of a microsecond; per device, so no caching). */
template <typename... P>
static pytfm_status pytfm__allow_shared(const char *func, void (*kernel)(P...), size_t bytes) {
    if (bytes <= 48 * 1024) return PYTFM_STATUS_OK;
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess) (void)cudaGetLastError(); // not left for the next launch to report
    return pytfm__cuda_status(func, err);
}

#define PYTFM_ALLOW_SHARED(...) pytfm__allow_shared(__func__, __VA_ARGS__)

/* ---- float4 accesses ----------------------------------------------------------------- */

/* 4 floats at p, which must be 16-byte aligned: one 128-bit access on the GPU. The emulator
 * checks the alignment and fails the launch, naming the thread, where the GPU would fault
 * with a misaligned address; a kernel tests pytfm__aligned4 on its inputs (a CuPy view such as
 * x[1:] is contiguous but offset by a float) and keeps a scalar path for the rest. */
static __device__ __forceinline__ bool pytfm__aligned4(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

static __device__ __forceinline__ float4 pytfm__load4(const float *p) {
#ifdef PYTFM_EMULATE
    if (!pytfm__aligned4(p))
        pytfm_emu::fail_launch("pytfm__load4 of %p, which is not 16-byte aligned", (const void *)p);
    float4 v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    return *reinterpret_cast<const float4 *>(p);
#endif
}

static __device__ __forceinline__ void pytfm__store4(float *p, float4 v) {
#ifdef PYTFM_EMULATE
    if (!pytfm__aligned4(p))
        pytfm_emu::fail_launch("pytfm__store4 to %p, which is not 16-byte aligned", (void *)p);
    memcpy(p, &v, sizeof v);
#else
    *reinterpret_cast<float4 *>(p) = v;
#endif
}

/* ---- cp.async: global → shared memory without a trip through registers (sm_80+) -------- */

/* pytfm__cp_async16(dst, src, src_bytes) starts a copy of 16 bytes to shared dst, of which the
 * first src_bytes (0..16) come from global src and the rest are zeroed (src_bytes 0: a tile's
 * edge, nothing read; src must still be a valid address); pytfm__cp_async4 the same for 4
 * bytes (src_bytes 0 or 4). Both addresses aligned to the copy's size. Copies join the
 * thread's open group; pytfm__cp_async_commit closes it; pytfm__cp_async_wait<N> waits until
 * at most the newest N committed groups are still in flight (cp.async.wait_group N). The wait
 * covers the calling thread's copies only: other threads read the data after a
 * __syncthreads() that follows the wait. Below sm_80 (and in nvcc's host pass) the copy is a
 * plain synchronous one. The emulator queues each thread's copies and performs them only at
 * the wait that covers their group, so a missing wait or barrier reads the 0xff fill. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
static __device__ __forceinline__ void pytfm__cp_async16(float *dst, const float *src,
                                                         int src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void pytfm__cp_async4(float *dst, const float *src,
                                                        int src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void pytfm__cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void pytfm__cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#elif defined(PYTFM_EMULATE)
static __device__ __forceinline__ void pytfm__cp_async16(float *dst, const float *src,
                                                         int src_bytes) {
    pytfm_emu::cp_async(dst, src, 16, src_bytes);
}
static __device__ __forceinline__ void pytfm__cp_async4(float *dst, const float *src,
                                                        int src_bytes) {
    pytfm_emu::cp_async(dst, src, 4, src_bytes);
}
static __device__ __forceinline__ void pytfm__cp_async_commit() { pytfm_emu::cp_async_commit(); }
template <int N> static __device__ __forceinline__ void pytfm__cp_async_wait() {
    pytfm_emu::cp_async_wait(N);
}
#else
static __device__ __forceinline__ void pytfm__cp_async16(float *dst, const float *src,
                                                         int src_bytes) {
    for (int i = 0; i < 4; i++) dst[i] = 4 * i < src_bytes ? src[i] : 0.0f;
}
static __device__ __forceinline__ void pytfm__cp_async4(float *dst, const float *src,
                                                        int src_bytes) {
    *dst = src_bytes ? *src : 0.0f;
}
static __device__ __forceinline__ void pytfm__cp_async_commit() {}
template <int N> static __device__ __forceinline__ void pytfm__cp_async_wait() {}
#endif

/* Blocks for `items` work items of `per_block` each, capped (kernels loop over the rest). */
static inline unsigned pytfm__blocks(int64_t items, int64_t per_block, int64_t cap) {
    const int64_t b = (items + per_block - 1) / per_block;
    return (unsigned)(b < cap ? b : cap);
}

enum { PYTFM_WARP = 32, PYTFM_ROW_THREADS = 256 };

/* ---- reductions ---------------------------------------------------------------------- */

template <class T> static __device__ __forceinline__ T pytfm__warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float pytfm__warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Every thread of the block gets the block's total; blockDim.x is a multiple of 32, scratch
 * holds 32 values in shared memory. The order of the additions is fixed: deterministic. */
template <class T> static __device__ T pytfm__block_sum(T v, T *scratch) {
    const unsigned lane = threadIdx.x % PYTFM_WARP, warp = threadIdx.x / PYTFM_WARP;
    v = pytfm__warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < blockDim.x / PYTFM_WARP ? scratch[lane] : (T)0;
    v = pytfm__warp_sum(v);
    __syncthreads(); // scratch is free again
    return v;
}

static __device__ float pytfm__block_max(float v, float *scratch) {
    const unsigned lane = threadIdx.x % PYTFM_WARP, warp = threadIdx.x / PYTFM_WARP;
    v = pytfm__warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < blockDim.x / PYTFM_WARP ? scratch[lane] : -INFINITY;
    v = pytfm__warp_max(v);
    __syncthreads();
    return v;
}

/* ---- rows: a warp per row when rows are short, a block per row when they are long ------ */

/* The team of threads that handles one row at a time: with kWarp a warp (rows of up to
 * PYTFM_WARP_ROW_MAX columns), otherwise the whole block. first/step walk the rows. */
enum { PYTFM_WARP_ROW_MAX = 1024 };

template <bool kWarp> struct pytfm__row_team {
    int64_t first, step;
    unsigned rank, size;
    __device__ pytfm__row_team()
        : first(kWarp ? (int64_t)blockIdx.x * (blockDim.x / PYTFM_WARP) + threadIdx.x / PYTFM_WARP
                      : (int64_t)blockIdx.x),
          step(kWarp ? (int64_t)gridDim.x * (blockDim.x / PYTFM_WARP) : (int64_t)gridDim.x),
          rank(kWarp ? threadIdx.x % PYTFM_WARP : threadIdx.x),
          size(kWarp ? (unsigned)PYTFM_WARP : blockDim.x) {}
    template <class T> __device__ T sum(T v, T *scratch) const {
        if constexpr (kWarp) return pytfm__warp_sum(v);
        else return pytfm__block_sum(v, scratch);
    }
    __device__ float max(float v, float *scratch) const {
        if constexpr (kWarp) return pytfm__warp_max(v);
        else return pytfm__block_max(v, scratch);
    }
};

/* Launch kernel<true> (a warp per row) or kernel<false> (a block per row) over rows of cols;
 * at most max_blocks blocks (each then walks several rows). */
template <typename... P, typename... A>
static pytfm_status pytfm__launch_rows(const char *func, void (*warp_kernel)(P...),
                                       void (*block_kernel)(P...), int64_t rows, int64_t cols,
                                       int64_t max_blocks, void *stream, A... args) {
    const int64_t rows_per_block = PYTFM_ROW_THREADS / PYTFM_WARP;
    if (cols <= PYTFM_WARP_ROW_MAX)
        return pytfm__launch(func, warp_kernel,
                             dim3(pytfm__blocks(rows, rows_per_block, max_blocks)),
                             dim3(PYTFM_ROW_THREADS), 0, stream, args...);
    return pytfm__launch(func, block_kernel, dim3(pytfm__blocks(rows, 1, max_blocks)),
                         dim3(PYTFM_ROW_THREADS), 0, stream, args...);
}

#define PYTFM_LAUNCH_ROWS(...) pytfm__launch_rows(__func__, __VA_ARGS__)

/* A row's max m and Σ_j exp(x_j − m), both for every thread of the team (softmax, the
 * cross-entropy's log-sum-exp m + log Σ). */
struct pytfm__max_sumexp {
    float max, sumexp;
};

template <bool kWarp>
static __device__ pytfm__max_sumexp pytfm__row_max_sumexp(const pytfm__row_team<kWarp> &team,
                                                           const float *x, int64_t cols,
                                                           float *scratch) {
    float max = -INFINITY;
    for (int64_t j = team.rank; j < cols; j += team.size) max = fmaxf(max, x[j]);
    max = team.max(max, scratch);
    float sum = 0.0f;
    for (int64_t j = team.rank; j < cols; j += team.size) sum += expf(x[j] - max);
    return {max, team.sum(sum, scratch)};
}

/* ---- columns: sums[j] += Σ_r term(r, j), the same bits on every run ------------------ */

/* One kernel for every column sum (the linear layer's db, LayerNorm's dw and db): a block
 * takes PYTFM_COLUMNS columns; its PYTFM_COLUMN_LANES rows of threads ("lanes") walk the rows
 * r = lane, lane + PYTFM_COLUMN_LANES, ..., and lane 0 then adds the others' partial sums in
 * lane order. No atomics: a fixed order, the same bits on every run. A block per 32 columns,
 * up to 2^30 blocks (no loop over columns). Term says what is summed:
 *
 *   struct term {
 *       enum { K = 2 };  // how many sums (outputs) at once
 *       float *sums[K];  // accumulated into: sums[k][j] += Σ_r t[k]
 *       __device__ void operator()(float *t, int64_t r, int64_t j) const; // t[0..K) of (r, j)
 *   };
 */
enum { PYTFM_COLUMNS = 32, PYTFM_COLUMN_LANES = 8 };

template <class Term>
static __global__ void pytfm__column_sum_kernel(Term term, int64_t rows, int64_t cols) {
    __shared__ float part[Term::K][PYTFM_COLUMN_LANES][PYTFM_COLUMNS];
    const int64_t j = (int64_t)blockIdx.x * PYTFM_COLUMNS + threadIdx.x;
    float s[Term::K] = {}, t[Term::K];
    if (j < cols)
        for (int64_t r = threadIdx.y; r < rows; r += PYTFM_COLUMN_LANES) {
            term(t, r, j);
            for (int k = 0; k < Term::K; k++) s[k] += t[k];
        }
    for (int k = 0; k < Term::K; k++) part[k][threadIdx.y][threadIdx.x] = s[k];
    __syncthreads();
    if (threadIdx.y == 0 && j < cols)
        for (int k = 0; k < Term::K; k++) {
            for (int i = 1; i < PYTFM_COLUMN_LANES; i++) s[k] += part[k][i][threadIdx.x];
            term.sums[k][j] += s[k];
        }
}

/* Launch the column sum of term over [rows, cols] (a block per PYTFM_COLUMNS columns). */
template <class Term>
static pytfm_status pytfm__launch_column_sum(const char *func, Term term, int64_t rows,
                                             int64_t cols, void *stream) {
    static_assert(PYTFM_COLUMNS * PYTFM_COLUMN_LANES <= 1024, "one block");
    return pytfm__launch(func, pytfm__column_sum_kernel<Term>,
                         dim3(pytfm__blocks(cols, PYTFM_COLUMNS, 1u << 30)),
                         dim3(PYTFM_COLUMNS, PYTFM_COLUMN_LANES), 0, stream, term, rows, cols);
}

#define PYTFM_LAUNCH_COLUMN_SUM(...) pytfm__launch_column_sum(__func__, __VA_ARGS__)

/* The most blocks an elementwise or row kernel launches; each then walks its share in a
 * grid-stride loop. The emulator caps at 3, so that the tests' small inputs walk those loops
 * too (on the GPU they are walked only by inputs of millions of elements). */
#ifdef PYTFM_EMULATE
enum { PYTFM_MAX_BLOCKS = 3 };
#else
enum { PYTFM_MAX_BLOCKS = 65535 };
#endif

#endif /* PYTFM_CUDA_CUH */
