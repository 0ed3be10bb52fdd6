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
#include "core/checks.h" /* internal.h, and the argument checks shared with csrc/ */
}
#include "device.h" /* stream scratch (the workspaces), defined in device.cu */

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

/* The most blocks an elementwise or row kernel launches; each then walks its share in a
 * grid-stride loop. The emulator caps at 3, so that the tests' small inputs walk those loops
 * too (on the GPU they are walked only by inputs of millions of elements). */
#ifdef PYTFM_EMULATE
enum { PYTFM_MAX_BLOCKS = 3 };
#else
enum { PYTFM_MAX_BLOCKS = 65535 };
#endif

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

/* ---- rows in registers: one read of each input, one write of each output ------------- */

/* #pragma unroll for nvcc (the host compiler of the emulator warns on it) */
#ifdef __CUDACC__
#define PYTFM_UNROLL _Pragma("unroll")
#define PYTFM_UNROLL4 _Pragma("unroll 4")
#else
#define PYTFM_UNROLL
#define PYTFM_UNROLL4
#endif

/* A column class: a team (warp or block, as above) whose threads each hold N floats of a row
 * in registers (float v[N], indexed only by unrolled loops, so it never goes to local memory),
 * for rows of up to max_cols columns, in blocks of `threads`. pytfm__with_row_class picks the
 * smallest class that holds a row; past the largest (PYTFM_ROW_REGS_MAX columns) the kernels
 * keep their plain multi-pass code, which re-reads the row from L1/L2. The block classes hold
 * 4 floats a thread (one float4) in blocks of 512 or 1024: more floats a thread in fewer
 * threads would cost registers, and with them blocks (and rows) in flight per SM. */
template <int kN, int kThreads, bool kWarpRow> struct pytfm__row_class {
    static_assert(kN % 4 == 0 && kThreads % PYTFM_WARP == 0, "whole float4s, whole warps");
    static constexpr int N = kN, threads = kThreads;
    static constexpr bool warp = kWarpRow;
    static constexpr int64_t max_cols = (int64_t)kN * (kWarpRow ? PYTFM_WARP : kThreads);
    static constexpr int64_t rows_per_block = kWarpRow ? kThreads / PYTFM_WARP : 1;
};

enum { PYTFM_ROW_REGS_MAX = 4096 };

/* f(class) for the smallest class that holds cols columns, plain() past the largest: a warp
 * per row up to 1024 columns (4, 8, 16, 32 floats a lane, blocks of 8 warps), a block per row
 * up to 4096 (4 floats a thread: 512 threads up to 2048 columns, 1024 up to 4096). */
template <class F, class Plain>
static pytfm_status pytfm__with_row_class(int64_t cols, F f, Plain plain) {
    if (cols <= 128) return f(pytfm__row_class<4, PYTFM_ROW_THREADS, true>());
    if (cols <= 256) return f(pytfm__row_class<8, PYTFM_ROW_THREADS, true>());
    if (cols <= 512) return f(pytfm__row_class<16, PYTFM_ROW_THREADS, true>());
    if (cols <= 1024) return f(pytfm__row_class<32, PYTFM_ROW_THREADS, true>());
    if (cols <= 2048) return f(pytfm__row_class<4, 512, false>());
    if (cols <= PYTFM_ROW_REGS_MAX) return f(pytfm__row_class<4, 1024, false>());
    static_assert(pytfm__row_class<4, 1024, false>::max_cols == PYTFM_ROW_REGS_MAX, "classes");
    return plain();
}

/* Whether rows of cols columns at these pointers may take the float4 path (host side): cols a
 * multiple of 4 and every pointer 16-byte aligned, so that every row's start is too. A CuPy
 * view such as x[1:] is contiguous but 4 bytes off: 32-bit accesses there. */
template <typename... T> static inline bool pytfm__rows_vec4(int64_t cols, const T *...p) {
    return cols % 4 == 0 && ((((uintptr_t)p & 15u) == 0) && ...);
}

/* The column of a thread's register k. With vec (cols % 4 == 0 and every pointer of the row
 * 16-byte aligned) registers 4i..4i+3 hold the float4 at column 4·(rank + i·size): a team's
 * loads are consecutive 16-byte words, 128-bit accesses; without, register k holds column
 * rank + k·size (32-bit accesses, consecutive too). Columns ≥ cols are not there. */
template <bool kWarp>
static __device__ __forceinline__ int pytfm__row_col(const pytfm__row_team<kWarp> &team, bool vec,
                                                     int k) {
    return vec ? 4 * ((int)team.rank + (k / 4) * (int)team.size) + k % 4
               : (int)team.rank + k * (int)team.size;
}

/* v[k] = p[column of k], or fill where that column is past the row's end */
template <int N, bool kWarp>
static __device__ __forceinline__ void
pytfm__row_load(float (&v)[N], const float *__restrict__ p, int cols, bool vec,
                const pytfm__row_team<kWarp> &team, float fill) {
    if (vec) {
        PYTFM_UNROLL
        for (int k = 0; k < N; k += 4) {
            const int j = pytfm__row_col(team, true, k);
            const float4 f = j < cols ? pytfm__load4(p + j) : make_float4(fill, fill, fill, fill);
            v[k] = f.x, v[k + 1] = f.y, v[k + 2] = f.z, v[k + 3] = f.w;
        }
    } else {
        PYTFM_UNROLL
        for (int k = 0; k < N; k++) {
            const int j = pytfm__row_col(team, false, k);
            v[k] = j < cols ? p[j] : fill;
        }
    }
}

/* p[column of k] = v[k] for the columns of the row */
template <int N, bool kWarp>
static __device__ __forceinline__ void pytfm__row_store(float *__restrict__ p, const float (&v)[N],
                                                        int cols, bool vec,
                                                        const pytfm__row_team<kWarp> &team) {
    if (vec) {
        PYTFM_UNROLL
        for (int k = 0; k < N; k += 4) {
            const int j = pytfm__row_col(team, true, k);
            if (j < cols) pytfm__store4(p + j, make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]));
        }
    } else {
        PYTFM_UNROLL
        for (int k = 0; k < N; k++) {
            const int j = pytfm__row_col(team, false, k);
            if (j < cols) p[j] = v[k];
        }
    }
}

/* Two sums over the team at once (one pair of barriers for a block, not two): every thread
 * gets both totals. The block's order is fixed as in pytfm__block_sum: deterministic. */
struct pytfm__sum2 {
    float a, b;
};

template <bool kWarp>
static __device__ __forceinline__ pytfm__sum2 pytfm__team_sum2(const pytfm__row_team<kWarp> &team,
                                                               float a, float b, float *scratch) {
    a = pytfm__warp_sum(a);
    b = pytfm__warp_sum(b);
    if constexpr (!kWarp) { // scratch: 64 floats, the warps' a then their b
        const unsigned lane = threadIdx.x % PYTFM_WARP, warp = threadIdx.x / PYTFM_WARP;
        if (lane == 0) scratch[warp] = a, scratch[PYTFM_WARP + warp] = b;
        __syncthreads();
        const bool in = lane < blockDim.x / PYTFM_WARP;
        a = pytfm__warp_sum(in ? scratch[lane] : 0.0f);
        b = pytfm__warp_sum(in ? scratch[PYTFM_WARP + lane] : 0.0f);
        __syncthreads(); // scratch is free again
    }
    (void)team;
    return {a, b};
}

/* Launch kernel (a row class's) over rows: a team per row, at most max_blocks blocks. */
template <class Class, typename... P, typename... A>
static pytfm_status pytfm__launch_row_class(const char *func, Class, void (*kernel)(P...),
                                            int64_t rows, int64_t max_blocks, void *stream,
                                            A... args) {
    return pytfm__launch(func, kernel, dim3(pytfm__blocks(rows, Class::rows_per_block, max_blocks)),
                         dim3(Class::threads), 0, stream, args...);
}

/* ---- columns: sums[j] += Σ_r term(r, j), the same bits on every run ------------------ */

/* Every column sum (the linear layer's db, LayerNorm's dw and db past the register classes)
 * is two kernels in a fixed order, no atomics, the same bits on every run:
 *   stage 1, pytfm__column_partials_kernel: a grid of (column tiles × row chunks) blocks; a
 *     block takes PYTFM_COLUMNS columns of one chunk of rows, its PYTFM_COLUMN_LANES rows of
 *     threads ("lanes") walk the chunk's rows r = lane, lane + PYTFM_COLUMN_LANES, ..., lane 0
 *     adds the others' sums in lane order and writes the chunk's partial sums to scratch;
 *   stage 2, pytfm__column_total_kernel: a thread per output column adds the chunks' partials
 *     in chunk order and accumulates that into the output (+=).
 * The chunks are sized from rows and cols alone (never the device), to fill about
 * PYTFM_COLUMN_BLOCKS blocks: for C = 768, rows = 8192, 24 tiles × 43 chunks of 192 rows.
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 * Term says what is summed:
 *
 *   struct term {
 *       enum { K = 2 };  // how many sums (outputs) at once
 *       float *sums[K];  // accumulated into: sums[k][j] += Σ_r t[k]
 *       __device__ void operator()(float *t, int64_t r, int64_t j) const; // t[0..K) of (r, j)
 *   };
 */
enum { PYTFM_COLUMNS = 32, PYTFM_COLUMN_LANES = 8 };
#ifdef PYTFM_EMULATE
// a few blocks of few rows, so that the tests' small inputs span several chunks
enum { PYTFM_COLUMN_BLOCKS = 8, PYTFM_COLUMN_MIN_ROWS = 8 };
#else
// 132 SMs × 8 blocks of 256 threads: one full wave of an H200 (more than that of an A100)
enum { PYTFM_COLUMN_BLOCKS = 132 * 8, PYTFM_COLUMN_MIN_ROWS = 64 };
#endif

template <class Term>
static __global__ void __launch_bounds__(PYTFM_COLUMNS *PYTFM_COLUMN_LANES)
    pytfm__column_partials_kernel(Term term, float *__restrict__ partial, int64_t rows,
                                  int64_t cols, int64_t chunk_rows) {
    __shared__ float part[Term::K][PYTFM_COLUMN_LANES][PYTFM_COLUMNS];
    const int64_t j = (int64_t)blockIdx.x * PYTFM_COLUMNS + threadIdx.x;
    const int64_t r0 = (int64_t)blockIdx.y * chunk_rows;
    const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
    float s[Term::K] = {}, t[Term::K];
    if (j < cols) {
        PYTFM_UNROLL4
        for (int64_t r = r0 + threadIdx.y; r < r1; r += PYTFM_COLUMN_LANES) {
            term(t, r, j);
            for (int k = 0; k < Term::K; k++) s[k] += t[k];
        }
    }
    for (int k = 0; k < Term::K; k++) part[k][threadIdx.y][threadIdx.x] = s[k];
    __syncthreads();
    if (threadIdx.y == 0 && j < cols)
        for (int k = 0; k < Term::K; k++) {
            for (int i = 1; i < PYTFM_COLUMN_LANES; i++) s[k] += part[k][i][threadIdx.x];
            partial[((int64_t)blockIdx.y * Term::K + k) * cols + j] = s[k];
        }
}

/* The outputs of a column sum, by value into the kernel */
template <int K> struct pytfm__column_outputs { float *__restrict__ sums[K]; };

/* sums[k][j] += Σ_c partial[c][k][j], c = 0, 1, ..., chunks − 1 in that order */
template <int K>
static __global__ void __launch_bounds__(PYTFM_ROW_THREADS)
    pytfm__column_total_kernel(pytfm__column_outputs<K> out, const float *__restrict__ partial,
                               int64_t chunks, int64_t cols) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < K * cols;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = e / cols, j = e % cols;
        float s = 0.0f;
        for (int64_t c = 0; c < chunks; c++) s += partial[(c * K + k) * cols + j];
        float *sum = out.sums[0]; // chosen by an unrolled loop: out stays in parameter space
        PYTFM_UNROLL
        for (int i = 1; i < K; i++)
            if (k == i) sum = out.sums[i];
        sum[j] += s;
    }
}

/* ---- scratch: the stream's workspace, else stream-ordered allocations (device.h) ------- */

/* count elements of T of stream scratch, as pytfm__stream_scratch_bytes (device.h) */
template <class T>
static inline pytfm_status pytfm__stream_scratch(const char *func, T **p, int64_t count,
                                                 void *stream) {
    void *bytes = nullptr;
    const pytfm_status st =
        pytfm__stream_scratch_bytes(func, &bytes, count * (int64_t)sizeof(T), stream);
    *p = static_cast<T *>(bytes);
    return st;
}

/* Stage 2 over partial[chunks][K][cols] into out (a thread per output column) */
template <int K>
static pytfm_status pytfm__launch_column_total(const char *func, pytfm__column_outputs<K> out,
                                               const float *partial, int64_t chunks, int64_t cols,
                                               void *stream) {
    return pytfm__launch(func, pytfm__column_total_kernel<K>,
                         dim3(pytfm__blocks(K * cols, PYTFM_ROW_THREADS, PYTFM_MAX_BLOCKS)),
                         dim3(PYTFM_ROW_THREADS), 0, stream, out, partial, chunks, cols);
}

/* Rows per chunk of stage 1: a multiple of the lanes, at least PYTFM_COLUMN_MIN_ROWS, so that
 * tiles × chunks comes to about PYTFM_COLUMN_BLOCKS */
static inline int64_t pytfm__column_chunk_rows(int64_t rows, int64_t cols) {
    const int64_t tiles = (cols + PYTFM_COLUMNS - 1) / PYTFM_COLUMNS;
    const int64_t want = (PYTFM_COLUMN_BLOCKS + tiles - 1) / tiles; // chunks wanted
    int64_t chunk = (rows + want - 1) / want;
    chunk = (chunk + PYTFM_COLUMN_LANES - 1) / PYTFM_COLUMN_LANES * PYTFM_COLUMN_LANES;
    return chunk > PYTFM_COLUMN_MIN_ROWS ? chunk : (int64_t)PYTFM_COLUMN_MIN_ROWS;
}

/* The column sum of term over [rows, cols] (rows ≥ 1): stage 1, then stage 2. */
template <class Term>
static pytfm_status pytfm__launch_column_sum(const char *func, Term term, int64_t rows,
                                             int64_t cols, void *stream) {
    static_assert(PYTFM_COLUMNS * PYTFM_COLUMN_LANES <= 1024, "one block");
    const int64_t chunk = pytfm__column_chunk_rows(rows, cols);
    const int64_t chunks = (rows + chunk - 1) / chunk; // ≤ PYTFM_COLUMN_BLOCKS: fits grid.y
    float *partial;
    PYTFM_TRY(pytfm__stream_scratch(func, &partial, chunks * Term::K * cols, stream));
    pytfm_status st = pytfm__launch(
        func, pytfm__column_partials_kernel<Term>,
        dim3(pytfm__blocks(cols, PYTFM_COLUMNS, 1u << 30), (unsigned)chunks),
        dim3(PYTFM_COLUMNS, PYTFM_COLUMN_LANES), 0, stream, term, partial, rows, cols, chunk);
    pytfm__column_outputs<Term::K> out;
    for (int k = 0; k < Term::K; k++) out.sums[k] = term.sums[k];
    if (st == PYTFM_STATUS_OK)
        st = pytfm__launch_column_total<Term::K>(func, out, partial, chunks, cols, stream);
    return pytfm__stream_scratch_free(func, partial, st, stream);
}

#define PYTFM_LAUNCH_COLUMN_SUM(...) pytfm__launch_column_sum(__func__, __VA_ARGS__)

/* pytfm_sgemm_ex_cuda's product after its checks, its errors naming func (cuda/sgemm_tc.cu):
 * FP32 on pytfm_sgemm_cuda, TF32 and BF16 on the tensor cores */
pytfm_status pytfm__sgemm_ex_cuda(const char *func, float *c, const float *a, const float *b,
                                  int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                  int32_t trans_b, float beta, int32_t precision, void *stream);

/* delta[b, h, t] = Σ_d r(dy[b, t, h, d]) · o[b, t, h, d] for rows = B·T·H rows of D (dy, o
 * [B, T, H, D], delta [B, H, T], written) on the stream, r the rounding precision's tensor-core
 * products give their inputs (none for FP32): the first pass of attention's backward, of
 * cuda/attention.cu's and cuda/attention_tc.cu's, defined in cuda/attention.cu */
pytfm_status pytfm__attention_delta_cuda(const char *func, float *delta, const float *dy,
                                         const float *o, int64_t rows, int64_t T, int64_t H,
                                         int64_t D, int32_t precision, void *stream);

#endif /* PYTFM_CUDA_CUH */
