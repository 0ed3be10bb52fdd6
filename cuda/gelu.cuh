/*
 * gelu.cuh — GELU's forward as a device function, shared by gelu.cu (whose forward kernel
 * writes x · half_one_plus_tanh(x), which is pytfm__gelu(x)) and linear.cu (the fused linear +
 * GELU), so that both compute gelu(h) with the same operations: the same bits.
 *
 *   gelu(v) = ½ v (1 + tanh u), u = k (v + a v³), k = sqrt(2/π), a = 0.044715
 * with ½ (1 + tanh u) written as 1/(1 + e^(−2u)), as csrc/kernels/gelu.c does.
 */
#ifndef PYTFM_GELU_CUH
#define PYTFM_GELU_CUH

#include "pytfm_cuda.cuh"

// ½ (1 + tanh(k (v + a v³)))
static __device__ __forceinline__ float half_one_plus_tanh(float v) {
    return 1.0f / (1.0f + expf(-2.0f * PYTFM_GELU_K * (v + PYTFM_GELU_A * v * v * v)));
}

static __device__ __forceinline__ float pytfm__gelu(float v) { return v * half_one_plus_tanh(v); }

#endif /* PYTFM_GELU_CUH */
