/*
 * emu_selftest.cu — kernels that check the CUDA emulator itself (tests/cuda/test_cuda_emu.py):
 * the four shuffles against their definitions, a missing barrier over static and dynamic shared
 * memory (both filled with NaN before the block), a barrier that not every thread reaches, a
 * shuffle waiting for a lane that left, lanes of a warp at different shuffles, bad launch
 * configurations (48 KiB of dynamic shared memory unless cudaFuncSetAttribute raised the
 * kernel's limit, 227 KiB at most), float4 accesses (16-byte aligned or a launch error),
 * cudaMallocAsync scratch, cp.async (performed only by the wait that covers its group), a
 * launch that a graph capture records (emu_scale), the two mma instructions against a plain
 * product (emu_mma) and the roundings that feed them (emu_round_tc), a write after read that
 * only the eager cp.async mode shows (emu_cp_async_war), ldmatrix in each variant against
 * the PTX ISA's layout (emu_ldmatrix).
 * Built only into the emulator's test library, never into libpytfm.
 */
#include "mma.cuh" /* includes pytfm_cuda.cuh */

#define EXPORT extern "C" __attribute__((visibility("default")))

/* out[4][n]: per thread t, the value 1000 + t' of the thread t' it reads with shfl idx(src),
 * up(delta), down(delta), xor(lane_mask) */
static __global__ void shuffles_kernel(int *out, int n, int src, int delta, int lane_mask,
                                       int width) {
    const int t = threadIdx.x, v = 1000 + t;
    out[0 * n + t] = __shfl_sync(0xffffffffu, v, src, width);
    out[1 * n + t] = __shfl_up_sync(0xffffffffu, v, (unsigned)delta, width);
    out[2 * n + t] = __shfl_down_sync(0xffffffffu, v, (unsigned)delta, width);
    out[3 * n + t] = __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
}

EXPORT pytfm_status emu_shuffles(int *out, int n, int src, int delta, int lane_mask, int width) {
    return PYTFM_LAUNCH(shuffles_kernel, dim3(1), dim3(n), 0, nullptr, out, n, src, delta,
                        lane_mask, width);
}

/* out[i] = in[n − 1 − i] through shared memory, static or (dynamic = 1) n floats of dynamic;
 * with_barrier = 0 leaves out __syncthreads() */
static __global__ void reverse_kernel(float *out, const float *in, int dynamic, int with_barrier) {
    __shared__ float fixed[256];
    PYTFM_DYNAMIC_SHARED(float, sized);
    float *s = dynamic ? sized : fixed;
    s[threadIdx.x] = in[threadIdx.x];
    if (with_barrier) __syncthreads();
    out[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

EXPORT pytfm_status emu_reverse(float *out, const float *in, int n, int dynamic,
                                int with_barrier) {
    return PYTFM_LAUNCH(reverse_kernel, dim3(1), dim3(n), dynamic ? n * sizeof(float) : 0, nullptr,
                        out, in, dynamic, with_barrier);
}

/* threads at or past `stop` return before the block's barrier */
static __global__ void early_exit_kernel(float *out, int stop) {
    __shared__ float s[256];
    if ((int)threadIdx.x >= stop) return;
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[0];
}

EXPORT pytfm_status emu_early_exit(float *out, int n, int stop) {
    return PYTFM_LAUNCH(early_exit_kernel, dim3(2), dim3(n), 0, nullptr, out, stop);
}

/* lane 31 leaves before the warp's shuffle */
static __global__ void shuffle_exit_kernel(float *out) {
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = pytfm__warp_sum(1.0f);
}

EXPORT pytfm_status emu_shuffle_exit(float *out) {
    return PYTFM_LAUNCH(shuffle_exit_kernel, dim3(1), dim3(32), 0, nullptr, out);
}

/* the even lanes of the warp shuffle with __shfl_xor_sync, the odd ones with __shfl_down_sync */
static __global__ void mixed_shuffle_kernel(int *out) {
    const int t = threadIdx.x;
    out[t] = t % 2 ? __shfl_down_sync(0xffffffffu, t, 1) : __shfl_xor_sync(0xffffffffu, t, 1);
}

EXPORT pytfm_status emu_mixed_shuffle(int *out) {
    return PYTFM_LAUNCH(mixed_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out);
}

/* the block sum of pytfm_cuda.cuh, a total per block, its scratch in dynamic shared memory */
static __global__ void block_sum_kernel(float *out, const float *in) {
    PYTFM_DYNAMIC_SHARED(float, scratch);
    out[blockIdx.x] = pytfm__block_sum(in[blockIdx.x * blockDim.x + threadIdx.x], scratch);
}

EXPORT pytfm_status emu_block_sum(float *out, const float *in, int blocks, int threads,
                                  int shared_bytes) {
    return PYTFM_LAUNCH(block_sum_kernel, dim3(blocks), dim3(threads), (size_t)shared_bytes,
                        nullptr, out, in);
}

/* out[i] = in[offset + i] for i < 4·n, a float4 per thread through pytfm__load4/pytfm__store4:
 * in + offset is misaligned unless offset is a multiple of 4 */
static __global__ void vector_copy_kernel(float *out, const float *in) {
    pytfm__store4(out + 4 * threadIdx.x, pytfm__load4(in + 4 * threadIdx.x));
}

EXPORT pytfm_status emu_vector_copy(float *out, const float *in, int n, int offset) {
    return PYTFM_LAUNCH(vector_copy_kernel, dim3(1), dim3(n), 0, nullptr, out, in + offset);
}

/* 64 threads write the last 64 floats of `bytes` of dynamic shared memory and read them back
 * reversed: out[t] = 63 − t. With limit >= 0, cudaFuncSetAttribute sets the kernel's limit
 * first (its status returned if it fails). */
static __global__ void big_shared_kernel(float *out, int count) {
    PYTFM_DYNAMIC_SHARED(float, s);
    s[count - 64 + threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[count - 1 - threadIdx.x];
}

EXPORT pytfm_status emu_big_shared(float *out, int bytes, int limit) {
    if (limit >= 0) {
        const cudaError_t err = cudaFuncSetAttribute(
            big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
        if (err != cudaSuccess) return pytfm__cuda_status("emu_big_shared", err);
    }
    return PYTFM_LAUNCH(big_shared_kernel, dim3(1), dim3(64), (size_t)bytes, nullptr, out,
                        bytes / 4);
}

/* out[i] = 2·in[i] through n floats of scratch from cudaMallocAsync, freed by cudaFreeAsync */
static __global__ void scale_kernel(float *out, const float *in, int n, float by) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = by * in[i];
}

EXPORT pytfm_status emu_malloc_async(float *out, const float *in, int n) {
    float *scratch = nullptr;
    PYTFM_TRY(pytfm__cuda_status("cudaMallocAsync",
                                 cudaMallocAsync((void **)&scratch, n * sizeof(float), nullptr)));
    pytfm_status st = PYTFM_LAUNCH(scale_kernel, dim3(1), dim3(64), 0, nullptr, scratch, in, n, 2.0f);
    if (st == PYTFM_STATUS_OK)
        st = PYTFM_LAUNCH(scale_kernel, dim3(1), dim3(64), 0, nullptr, out, scratch, n, 1.0f);
    const cudaError_t err = cudaFreeAsync(scratch, nullptr);
    return st != PYTFM_STATUS_OK ? st : pytfm__cuda_status("cudaFreeAsync", err);
}

/* x[i] *= by in place (one block): the launch a graph capture records and a replay repeats */
EXPORT pytfm_status emu_scale(float *x, int n, float by) {
    return PYTFM_LAUNCH(scale_kernel, dim3(1), dim3(64), 0, nullptr, x, (const float *)x, n, by);
}

/* cp.async (pytfm__cp_async16/4, commit, wait<N>): thread t of n copies, per group g < groups,
 * the 4 floats in[g·4n + 4t + q] (q < 4) to s[g][4t + q] in shared memory (one 16-byte copy
 * reading src_bytes of them, or with size = 4 four 4-byte ones), committing each group but,
 * with leave_open, the last; then waits with wait_group `pending`, passes a barrier if
 * with_barrier, and writes out[g·4n + 4t + q] from the slot of thread n − 1 − t (another
 * thread's copy: it needs both). global = 1 aims the copies at out instead (not shared). */
static __global__ void cp_async_kernel(float *out, const float *in, int groups, int pending,
                                       int with_barrier, int size, int src_bytes, int leave_open,
                                       int global) {
    __shared__ float s[3][4 * 64];
    const int n = blockDim.x, t = threadIdx.x;
    for (int g = 0; g < groups; g++) {
        float *d = global ? out + g * 4 * n + 4 * t : s[g] + 4 * t;
        const float *src = in + g * 4 * n + 4 * t;
        if (size == 16) {
            pytfm__cp_async16(d, src, src_bytes);
        } else {
            for (int q = 0; q < 4; q++) pytfm__cp_async4(d + q, src + q, 4 * q < src_bytes ? 4 : 0);
        }
        if (g < groups - 1 || !leave_open) pytfm__cp_async_commit();
    }
    switch (pending) {
    case 0: pytfm__cp_async_wait<0>(); break;
    case 1: pytfm__cp_async_wait<1>(); break;
    default: pytfm__cp_async_wait<2>(); break;
    }
    if (with_barrier) __syncthreads();
    for (int g = 0; g < groups; g++)
        for (int q = 0; q < 4; q++) out[g * 4 * n + 4 * t + q] = s[g][4 * (n - 1 - t) + q];
}

EXPORT pytfm_status emu_cp_async(float *out, const float *in, int n, int groups, int pending,
                                 int with_barrier, int size, int src_bytes, int leave_open,
                                 int global) {
    return PYTFM_LAUNCH(cp_async_kernel, dim3(1), dim3(n), 0, nullptr, out, in, groups, pending,
                        with_barrier, size, src_bytes, leave_open, global);
}

/* ---- the warp-level matrix instructions (cuda/mma.cuh) ----------------------------------- */

/* One warp: d [16][8] = a [16][K] · b [K][8] + c [16][8], all row-major, through one
 * pytfm__mma_tf32 (K = 8; a and b passed as raw float32 bits, so the instruction's own
 * truncation applies) or pytfm__mma_bf16 (K = 16; a and b rounded by pytfm__bf16x2). Each lane
 * gathers its fragments by the PTX ISA's layouts, written out here apart from the emulator's
 * (g = lane / 4, t = lane % 4); missing: a lane (0..31) that returns before the mma, or -1. */
static __global__ void mma_kernel(float *d, const float *a, const float *b, const float *c,
                                  int bf16, int missing) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    if (lane == missing) return;
    uint32_t fa[4], fb[2];
    float fd[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                   c[(g + 8) * 8 + 2 * t + 1]};
    if (!bf16) {
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {t, t, t + 4, t + 4};
        for (int r = 0; r < 4; r++) memcpy(&fa[r], &a[rows[r] * 8 + cols[r]], 4);
        memcpy(&fb[0], &b[t * 8 + g], 4);
        memcpy(&fb[1], &b[(t + 4) * 8 + g], 4);
        pytfm__mma_tf32(fd, fa, fb);
    } else {
        const int rows[4] = {g, g + 8, g, g + 8};
        const int cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int r = 0; r < 4; r++)
            fa[r] = pytfm__bf16x2(a[rows[r] * 16 + cols[r]], a[rows[r] * 16 + cols[r] + 1]);
        fb[0] = pytfm__bf16x2(b[2 * t * 8 + g], b[(2 * t + 1) * 8 + g]);
        fb[1] = pytfm__bf16x2(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
        pytfm__mma_bf16(fd, fa, fb);
    }
    d[g * 8 + 2 * t] = fd[0];
    d[g * 8 + 2 * t + 1] = fd[1];
    d[(g + 8) * 8 + 2 * t] = fd[2];
    d[(g + 8) * 8 + 2 * t + 1] = fd[3];
}

EXPORT pytfm_status emu_mma(float *d, const float *a, const float *b, const float *c, int bf16,
                            int missing) {
    return PYTFM_LAUNCH(mma_kernel, dim3(1), dim3(32), 0, nullptr, d, a, b, c, bf16, missing);
}

/* tf32[i], bf16[i]: x[i] by pytfm__tf32 (cvt.rna.tf32.f32) and the low half of
 * pytfm__bf16x2(x[i], 0) (cvt.rn.bf16x2.f32), as bits */
static __global__ void round_tc_kernel(int *tf32, int *bf16, const float *x, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        tf32[i] = (int)pytfm__tf32(x[i]);
        bf16[i] = (int)(pytfm__bf16x2(x[i], 0.0f) & 0xffffu);
    }
}

EXPORT pytfm_status emu_round_tc(int *tf32, int *bf16, const float *x, int n) {
    return PYTFM_LAUNCH(round_tc_kernel, dim3(1), dim3(64), 0, nullptr, tf32, bf16, x, n);
}

/* A write after read on one shared buffer: 64 threads each copy 4 floats of tile 0 into s by
 * cp.async, wait, pass a barrier and read their neighbour's 4 (out[0..256)); then each copies
 * tile 1 into its own slot, the wait for it after a barrier, and reads the neighbour's again
 * (out[256..512)). Without with_barrier nothing keeps a thread's second copy from landing
 * before its neighbour's first read: the eager cp.async mode shows it, the "at the wait" mode
 * (which lands the copy after the barrier) cannot. */
static __global__ void cp_async_war_kernel(float *out, const float *in, int with_barrier) {
    __shared__ float s[4 * 64];
    const int n = blockDim.x, t = threadIdx.x, next = (t + 1) % n;
    pytfm__cp_async16(s + 4 * t, in + 4 * t, 16);
    pytfm__cp_async_commit();
    pytfm__cp_async_wait<0>();
    __syncthreads();
    for (int q = 0; q < 4; q++) out[4 * t + q] = s[4 * next + q];
    if (with_barrier) __syncthreads(); // every read of tile 0 before any copy of tile 1
    pytfm__cp_async16(s + 4 * t, in + 4 * n + 4 * t, 16);
    pytfm__cp_async_commit();
    __syncthreads();
    pytfm__cp_async_wait<0>();
    __syncthreads();
    for (int q = 0; q < 4; q++) out[4 * n + 4 * t + q] = s[4 * next + q];
}

EXPORT pytfm_status emu_cp_async_war(float *out, const float *in, int with_barrier) {
    return PYTFM_LAUNCH(cp_async_war_kernel, dim3(1), dim3(64), 0, nullptr, out, in,
                        with_barrier);
}

/* ldmatrix (pytfm__ldmatrix of cuda/mma.cuh): one warp copies in[128 × 8] 16-bit elements
 * into shared memory (128 rows of 16 bytes), then lane i gives the address of row rows[i]
 * (lanes past 8·num give a misaligned one, which the instruction must not read) to one
 * ldmatrix x<num> (.trans if trans); out[i·4 + q] = lane i's register q (0 past num); missing:
 * a lane (0..31) that returns before the ldmatrix, or -1. */
template <int N, bool T> static __device__ void ldmatrix_into(uint32_t *out, const void *row) {
    uint32_t r[N];
    pytfm__ldmatrix<N, T>(r, row);
    for (int q = 0; q < 4; q++) out[q] = q < N ? r[q] : 0u;
}

static __global__ void ldmatrix_kernel(int *out, const int *in, const int *rows, int num,
                                       int trans, int missing) {
    __shared__ uint16_t tile[128 * 8];
    const int lane = threadIdx.x;
    for (int i = lane; i < 128 * 8; i += 32) tile[i] = (uint16_t)in[i];
    __syncthreads();
    if (lane == missing) return;
    const void *row = lane < 8 * num ? (const void *)(tile + 8 * rows[lane])
                                     : (const void *)((const char *)tile + 2);
    uint32_t *o = (uint32_t *)out + 4 * lane;
    switch (num * 2 + trans) {
    case 2: ldmatrix_into<1, false>(o, row); break;
    case 3: ldmatrix_into<1, true>(o, row); break;
    case 4: ldmatrix_into<2, false>(o, row); break;
    case 5: ldmatrix_into<2, true>(o, row); break;
    case 8: ldmatrix_into<4, false>(o, row); break;
    default: ldmatrix_into<4, true>(o, row); break;
    }
}

EXPORT pytfm_status emu_ldmatrix(int *out, const int *in, const int *rows, int num, int trans,
                                 int missing) {
    return PYTFM_LAUNCH(ldmatrix_kernel, dim3(1), dim3(32), 0, nullptr, out, in, rows, num,
                        trans, missing);
}
