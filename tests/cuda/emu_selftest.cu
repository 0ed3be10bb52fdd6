/*
 * emu_selftest.cu — kernels that check the CUDA emulator itself (tests/test_cuda_emu.py):
 * __shfl_xor_sync against its definition, a missing barrier, a barrier that not every
 * thread reaches, a shuffle waiting for a lane that left, a bad launch configuration.
 * Built only into the emulator's test library, never into libpytfm.
 */
#include "pytfm_cuda.cuh"

#define EXPORT extern "C" __attribute__((visibility("default")))

/* out[t] = the value 1000 + t' of the thread t' that thread t reads with __shfl_xor_sync */
static __global__ void shfl_xor_kernel(int *out, int lane_mask, int width) {
    const int t = threadIdx.x;
    out[t] = __shfl_xor_sync(0xffffffffu, 1000 + t, lane_mask, width);
}

EXPORT pytfm_status emu_shfl_xor(int *out, int threads, int lane_mask, int width) {
    return PYTFM_LAUNCH(shfl_xor_kernel, dim3(1), dim3(threads), nullptr, out, lane_mask, width);
}

/* out[i] = in[n − 1 − i] through shared memory; with_barrier = 0 leaves out __syncthreads() */
static __global__ void reverse_kernel(float *out, const float *in, int with_barrier) {
    __shared__ float s[256];
    s[threadIdx.x] = in[threadIdx.x];
    if (with_barrier) __syncthreads();
    out[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

EXPORT pytfm_status emu_reverse(float *out, const float *in, int n, int with_barrier) {
    return PYTFM_LAUNCH(reverse_kernel, dim3(1), dim3(n), nullptr, out, in, with_barrier);
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
    return PYTFM_LAUNCH(early_exit_kernel, dim3(2), dim3(n), nullptr, out, stop);
}

/* lane 31 leaves before the warp's shuffle */
static __global__ void shuffle_exit_kernel(float *out) {
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = pytfm__warp_sum(1.0f);
}

EXPORT pytfm_status emu_shuffle_exit(float *out) {
    return PYTFM_LAUNCH(shuffle_exit_kernel, dim3(1), dim3(32), nullptr, out);
}

/* the block sum of pytfm_cuda.cuh, a total per block */
static __global__ void block_sum_kernel(float *out, const float *in) {
    __shared__ float scratch[32];
    out[blockIdx.x] = pytfm__block_sum(in[blockIdx.x * blockDim.x + threadIdx.x], scratch);
}

EXPORT pytfm_status emu_block_sum(float *out, const float *in, int blocks, int threads) {
    return PYTFM_LAUNCH(block_sum_kernel, dim3(blocks), dim3(threads), nullptr, out, in);
}
