/*
 * emu.h — run CUDA kernels on the CPU, for tests on machines without a GPU.
 *
 * The .cu sources in cuda/ compile unchanged with a host C++17 compiler when this header stands in
 * for cuda_runtime.h (cuda/pytfm_cuda.cuh chooses). A launch runs its blocks one after another
 * on the calling OS thread; within a block every CUDA thread is a cooperative fiber (emu.cpp),
 * and a fiber runs until it reaches __syncthreads(), a shuffle or its end. So:
 *   - __syncthreads() releases the block when every thread of it waits there;
 *   - a shuffle (__shfl_sync, __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync) completes
 *     when every lane named in its mask has reached it, and each lane reads what the others
 *     deposited, as on the GPU;
 *   - a thread that exits, or waits at another barrier, while others wait for it is reported
 *     as a launch error (cudaGetLastError) that names the threads: never a hang;
 *   - __shared__ variables are statics in one section, so all fibers of a block share them;
 *     that section and the dynamic shared memory are refilled with 0xff bytes (NaN, -1) before
 *     every block, so a kernel that reads shared memory before writing it sees garbage, as it
 *     could on a GPU. One launch runs at a time in a process (a mutex serialises them).
 * "Device pointers" are host pointers. A launch runs at once, whatever its stream: in the order
 * the host queues the work, one order a GPU could run it in. Whether a GPU would have to (two
 * streams touching one buffer with an event or a synchronisation between) is checked where the
 * streams and events are, by the stand-in CuPy's hazard detector (tests/fake_cupy.py), which
 * sees each twin called through it run on its stream argument; the C code that calls the
 * runtime here (the C model, device.cu) keeps to one stream of its own and synchronises it
 * before the host reads, and uses no events, so the emulator keeps no clocks. Launch
 * configurations are checked
 * as the GPU would: at most 1024 threads per block, no empty grid, and 48 KiB of dynamic shared
 * memory unless cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
 * bytes) raised that kernel's limit first (to at most 227 KiB, 232448 bytes: sm_90's opt-in
 * maximum; more is cudaErrorInvalidValue). The launch names the kernel by its address
 * (pytfm__launch in cuda/pytfm_cuda.cuh passes it), so the raised limit is that kernel's only.
 * Vector accesses (float4, through pytfm__load4 / pytfm__store4 of pytfm_cuda.cuh) must be
 * 16-byte aligned, as on the GPU: a misaligned one fails the launch naming the thread
 * (fail_launch), where the GPU would raise a misaligned address error.
 * cp.async (pytfm__cp_async16 / pytfm__cp_async4, pytfm__cp_async_commit and
 * pytfm__cp_async_wait<N> of pytfm_cuda.cuh) is asynchronous here too, at its latest: each
 * thread's copies are queued, commit closes the thread's open group, and only wait<N> performs
 * them (every committed group but the newest N, in issue order; copies not yet committed stay
 * queued, as on the GPU), reading the source then. A copy never waited for is dropped at the
 * thread's end. So a read of the destination before its wait, or by another thread without a
 * barrier after the wait, sees the 0xff fill (NaN) or the previous tile's data. The destination
 * must be shared memory, both addresses aligned to the copy's size (16 or 4), else the launch
 * fails naming the thread. The eager mode (PYTFM_EMU_CP_ASYNC=eager in the environment when
 * the library loads, or pytfm_emu_set_cp_async(1)) lands each copy at its issue instead, at
 * its earliest: a copy into a buffer that another thread still reads, with no barrier between
 * that read and the issue (a write after read), overwrites it under the reader. A kernel must
 * give the same results in both modes; the tests run the tensor-core kernels in both.
 *
 * The warp-level matrix instructions (pytfm_emu::mma, reached through cuda/mma.cuh):
 * mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 and
 * mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 are warp collectives like the shuffles:
 * the operation completes when all 32 lanes of the warp have reached it (the .aligned form:
 * every lane executes the same mma), a lane that exits or waits elsewhere fails the launch
 * naming the thread. The lanes' fragments are gathered by the PTX ISA's layouts ("Matrix
 * Fragments for mma.m16n8k8" and "for mma.m16n8k16", the layouts of mma_layout below), the
 * product D = A·B + C computed and each lane's four D elements handed back. Inputs as the
 * hardware reads them: a TF32 operand is the register's top 19 bits (the low 13 bits of an
 * FP32 value that was not converted with cvt.rna.tf32.f32 are ignored: truncation); a BF16
 * operand the 16-bit halves of the packed registers (lower half: the lower k). Each product is
 * exact in float32 and the k of one instruction are added in order, from C, each sum rounded
 * to float32 (fmaf): the hardware's order inside one instruction is unspecified, so the tests'
 * bounds allow any order of those k additions.
 * ldmatrix.sync.aligned.m8n8.x1/x2/x4(.trans).shared.b16 (pytfm_emu::ldmatrix) is one too:
 * lane i gives the address of row i % 8 of matrix i / 8 (16 bytes of shared memory, 16-byte
 * aligned, else the launch fails naming the lane), and each lane receives its two 16-bit
 * elements of each matrix by the PTX ISA's figure (ldmatrix_slot below). Its shared-memory
 * wavefronts are counted per matrix (pytfm_emu_ldmatrix_counts in emu.cpp): one when the 8 rows
 * fall in 8 distinct 16-byte bank groups, n when n distinct words share a bank, so a test can
 * hold a kernel's fragment loads to conflict-free.
 *
 * It provides what the kernels of cuda/ use (threadIdx, blockIdx, blockDim, gridDim, static
 * and dynamic __shared__ memory (PYTFM_DYNAMIC_SHARED, sized by PYTFM_LAUNCH's shared_bytes),
 * __launch_bounds__ (ignored), __syncthreads, the four shuffles, float4 and make_float4,
 * rsqrtf, cp.async (cp_async below), and the runtime calls cudaGetLastError,
 * cudaGetErrorString/Name, cudaGetDeviceCount, cudaStreamSynchronize,
 * cudaMallocAsync/cudaFreeAsync for scratch, cudaMalloc/cudaFree, cudaMemcpyAsync,
 * cudaStreamCreateWithFlags/cudaStreamDestroy (device.cu) and cudaFuncSetAttribute).
 * Each is checked in tests/cuda/emu_selftest.cu. No atomics or votes: a kernel that needs one
 * adds it here, with a check of it there.
 *
 * Counters (pytfm_emu_counters): every allocation, free, copy, synchronisation and kernel
 * run, so that a test can assert that a training step allocates and waits for nothing. A
 * graph capture (pytfm_emu_capture_begin .. _end) records each launch, its arguments as
 * captured, instead of running it, as CUDA's stream capture does, and a replay
 * (pytfm_emu_graph_launch) runs them again in order; one capture at a time, whatever the
 * stream. During a capture an allocation, a free, a copy or a synchronisation fails
 * (cudaErrorStreamCaptureUnsupported): a step captured here needs none of them.
 */
#ifndef PYTFM_EMU_H
#define PYTFM_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <type_traits>

#define PYTFM_EMULATE 1

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef struct pytfm_emu_stream *cudaStream_t;

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
};
typedef enum cudaError cudaError_t;

cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
/* Stream-ordered scratch: host memory here (malloc and free; launches run at once). */
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
/* Device memory is host memory (malloc, free); a copy is a memcpy, done at once. */
cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
};
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
/* Streams are distinct handles; the work queued on them runs at once (see the top) */
enum { cudaStreamNonBlocking = 1 };
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);

/* What the counters of pytfm_emu_counters count, in its order */
enum {
    PYTFM_EMU_MALLOC,       /* cudaMalloc */
    PYTFM_EMU_FREE,         /* cudaFree */
    PYTFM_EMU_MALLOC_ASYNC, /* cudaMallocAsync */
    PYTFM_EMU_FREE_ASYNC,   /* cudaFreeAsync */
    PYTFM_EMU_MEMCPY,       /* cudaMemcpyAsync */
    PYTFM_EMU_SYNC,         /* cudaStreamSynchronize, and a stream's destruction */
    PYTFM_EMU_LAUNCHES,     /* kernels run (a replayed graph's included; captured ones not) */
    PYTFM_EMU_CAPTURED,     /* kernels recorded by a capture */
    PYTFM_EMU_COUNTERS
};

/* The one function attribute the kernels set: the most dynamic shared memory a launch of that
 * kernel may ask for (48 KiB unless raised; at most PYTFM_EMU_MAX_OPTIN_SHARED). */
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum { PYTFM_EMU_DEFAULT_SHARED = 48 * 1024, PYTFM_EMU_MAX_OPTIN_SHARED = 232448 };
cudaError_t pytfm_emu_func_set_attribute(const void *func, enum cudaFuncAttribute attr,
                                         int value);
template <class F> cudaError_t cudaFuncSetAttribute(F *func, enum cudaFuncAttribute attr,
                                                    int value) {
    return pytfm_emu_func_set_attribute(reinterpret_cast<const void *>(func), attr, value);
}

/* 16-byte vectors; only as a whole (x, y, z, w), as the kernels use them */
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace pytfm_emu {

enum WarpOp {
    SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR, MMA_TF32_M16N8K8, MMA_BF16_M16N8K16,
    /* ldmatrix.sync.aligned.m8n8.x1/x2/x4.shared.b16, then the same with .trans */
    LDMATRIX_X1, LDMATRIX_X2, LDMATRIX_X4, LDMATRIX_X1_TRANS, LDMATRIX_X2_TRANS,
    LDMATRIX_X4_TRANS
};

/* Where element (row, col) of an mma operand lives: lane and register (index into the lane's
 * fragment array). op MMA_TF32_M16N8K8 or MMA_BF16_M16N8K16; which 'a' (16 × K, row-major),
 * 'b' (K × 8, column-major) or 'c' (16 × 8, the accumulators and D). For BF16, a and b
 * registers hold two elements: half 0 the lower 16 bits. As the PTX ISA's figures (g = lane /
 * 4, t = lane % 4):
 *   TF32 m16n8k8  a: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
 *                 b: b0 (t, g), b1 (t + 4, g)
 *   BF16 m16n8k16 a: a0 (g, 2t, 2t+1), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..)
 *                 b: b0 (2t..2t+1, g), b1 (2t + 8..2t + 9, g)
 *   both          c: c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1) */
struct MmaSlot {
    int lane, reg, half;
};
MmaSlot mma_layout(WarpOp op, char which, int row, int col);

const dim3 &thread_idx();
const dim3 &block_idx();
const dim3 &block_dim();
const dim3 &grid_dim();
void *dynamic_shared();
void syncthreads();
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width);
/* Run body as the kernel `key` (its address: the key of its shared memory limit) */
void launch(dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body,
            const void *key);
/* Fail the running launch with a message (printf format) that names the calling thread and
 * its block; the thread goes on (the launch stops after this block). */
void fail_launch(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* cp.async: queue a copy of `size` bytes (16 or 4) from global src to shared dst, of which the
 * first src_bytes (0..size) are read and the rest zeroed; close the open group; perform every
 * committed group of this thread but the newest `pending` (cp.async.wait_group pending). */
void cp_async(void *dst, const void *src, int size, int src_bytes);
void cp_async_commit();
void cp_async_wait(int pending);
/* d[4] = a·b + c for the calling lane's fragments (d may be c): op as MmaSlot's */
void mma(WarpOp op, float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);

/* ldmatrix.sync.aligned.m8n8.x<num>{.trans}.shared.b16 r, [row]: num (1, 2 or 4) 8 × 8
 * matrices of 16-bit elements, lane i giving the address of row i % 8 of matrix i / 8 (16
 * contiguous bytes, 16-byte aligned, in shared memory; the lanes past 8·num give none), each
 * lane receiving r[q] of matrix q as ldmatrix_slot states. */
void ldmatrix(uint32_t *r, int num, bool trans, const void *row);
/* Where element (row, col) of an ldmatrix matrix (row: the 16-byte row a lane addressed, col:
 * its 16-bit element) lands, as the PTX ISA's figure for ldmatrix: lane row·4 + col / 2, half
 * col % 2 (0: the lower 16 bits); with .trans the matrix is transposed on the way, so element
 * (row, col) lands where (col, row) would: lane col·4 + row / 2, half row % 2. */
MmaSlot ldmatrix_slot(bool trans, int row, int col);

/* cvt.rna.tf32.f32: x rounded to TF32 (10 stored mantissa bits), to nearest, ties away from
 * zero, returned as float32 bits with the low 13 bits zero; NaN stays a NaN, a value that
 * rounds past the largest finite one becomes infinity. */
inline uint32_t cvt_rna_tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) // inf stays, NaN stays a (quiet) NaN
        return (u & 0x007fffffu) ? (u | 0x00400000u) & 0xffffe000u : u;
    return (u + 0x1000u) & 0xffffe000u;
}

/* cvt.rn.bf16x2.f32 d, hi, lo: both rounded to BF16, to nearest even (pytfm_round_bf16's
 * rounding), lo in the lower 16 bits; NaN stays a quiet NaN */
inline uint32_t bf16_rn(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
    return (u + 0x7fffu + (u >> 16 & 1u)) >> 16;
}
inline uint32_t cvt_rn_bf16x2(float hi, float lo) { return bf16_rn(hi) << 16 | bf16_rn(lo); }

template <class T> T shfl(WarpOp op, unsigned mask, T v, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a word");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = warp_op(op, mask, bits, arg, width);
    memcpy(&v, &bits, sizeof v);
    return v;
}

} // namespace pytfm_emu

#define threadIdx (::pytfm_emu::thread_idx())
#define blockIdx (::pytfm_emu::block_idx())
#define blockDim (::pytfm_emu::block_dim())
#define gridDim (::pytfm_emu::grid_dim())

#define __global__
#define __device__
#define __forceinline__ inline
/* __shared__ variables are placed in one section, which the emulator refills with 0xff bytes
 * (NaN for floats, -1 for integers) before every block, as the GPU leaves shared memory
 * undefined: a kernel that reads a value no thread of this block wrote sees garbage. */
#define __shared__ static __attribute__((section("pytfm_emu_shared"), aligned(16)))
#define __launch_bounds__(...)

inline void __syncthreads() { pytfm_emu::syncthreads(); }
template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return pytfm_emu::shfl(pytfm_emu::SHFL_IDX, mask, v, src, width);
}
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return pytfm_emu::shfl(pytfm_emu::SHFL_UP, mask, v, (int)delta, width);
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return pytfm_emu::shfl(pytfm_emu::SHFL_DOWN, mask, v, (int)delta, width);
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return pytfm_emu::shfl(pytfm_emu::SHFL_XOR, mask, v, lane_mask, width);
}

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

#endif /* PYTFM_EMU_H */
