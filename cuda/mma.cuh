/*
 * mma.cuh — the warp-level matrix instructions the tensor-core kernels use, one wrapper each:
 * inline PTX on the GPU (sm_80 and newer), the emulator's version (cuda/emu) on the CPU.
 *
 *   pytfm__tf32(x)              cvt.rna.tf32.f32: x rounded to TF32 (10 mantissa bits, to
 *                               nearest, ties away from zero), as a .b32 register
 *   pytfm__bf16x2(lo, hi)       cvt.rn.bf16x2.f32: both rounded to BF16 (nearest even, as
 *                               pytfm_round_bf16 but subnormals kept), lo in the lower
 *                               16 bits
 *   pytfm__mma_tf32(d, a, b)    mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, d += a·b
 *   pytfm__mma_bf16(d, a, b)    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d += a·b
 *
 * Each mma is a warp collective: all 32 lanes of the warp call it together. Fragments: a[4]
 * (16 × K of A, row-major), b[2] (K × 8 of B), d[4] (16 × 8 FP32 accumulators), by the PTX
 * ISA's layouts, which emu.h's pytfm_emu::mma_layout states (g = lane / 4, t = lane % 4):
 *   TF32 a: (g, t) (g + 8, t) (g, t + 4) (g + 8, t + 4)   b: (t, g) (t + 4, g)
 *   BF16 a: pairs of k (g, 2t) (g + 8, 2t) (g, 2t + 8) (g + 8, 2t + 8)
 *        b: pairs of k (2t, g) (2t + 8, g)
 *   d:      (g, 2t) (g, 2t + 1) (g + 8, 2t) (g + 8, 2t + 1)
 * A TF32 operand not made by pytfm__tf32 is truncated by the hardware (its low 13 bits are
 * ignored): the kernels round with pytfm__tf32 first, and the emulator truncates the same way.
 */
#ifndef PYTFM_MMA_CUH
#define PYTFM_MMA_CUH

#include "pytfm_cuda.cuh"

/* PYTFM_MAX_REGS(threads, regs): a kernel of at most `threads` threads a block that gets at most
 * `regs` registers a thread (__maxnreg__, CUDA 12.4 and newer; __launch_bounds__(threads, 1)
 * before that, which leaves ptxas all 255). ptxas fills what a kernel may have with cached
 * addresses and hoisted loads, so a register count at the limit says what the kernel was
 * given, not what it needs. A budget under 255 is a margin the build log shows: a kernel that
 * needs more than its budget spills (tests/cuda/test_cuda_build_log.py fails on a spill), and
 * the registers between the budget and 255 are still there to give it. The emulator has no
 * registers. */
#if defined(PYTFM_EMULATE)
#define PYTFM_MAX_REGS(threads, regs)
#elif defined(__CUDACC_VER_MAJOR__) &&                                                             \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define PYTFM_MAX_REGS(threads, regs) __maxnreg__(regs)
#else
#define PYTFM_MAX_REGS(threads, regs) __launch_bounds__(threads, 1)
#endif

#if defined(PYTFM_EMULATE)

static __device__ __forceinline__ uint32_t pytfm__tf32(float x) {
    return pytfm_emu::cvt_rna_tf32(x);
}
static __device__ __forceinline__ uint32_t pytfm__bf16x2(float lo, float hi) {
    return pytfm_emu::cvt_rn_bf16x2(hi, lo);
}
static __device__ __forceinline__ void pytfm__mma_tf32(float d[4], const uint32_t a[4],
                                                       const uint32_t b[2]) {
    pytfm_emu::mma(pytfm_emu::MMA_TF32_M16N8K8, d, a, b, d);
}
static __device__ __forceinline__ void pytfm__mma_bf16(float d[4], const uint32_t a[4],
                                                       const uint32_t b[2]) {
    pytfm_emu::mma(pytfm_emu::MMA_BF16_M16N8K16, d, a, b, d);
}

#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

static __device__ __forceinline__ uint32_t pytfm__tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
static __device__ __forceinline__ uint32_t pytfm__bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
static __device__ __forceinline__ void pytfm__mma_tf32(float d[4], const uint32_t a[4],
                                                       const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ void pytfm__mma_bf16(float d[4], const uint32_t a[4],
                                                       const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#else /* nvcc's host pass, or a GPU without tensor cores for these types: never launched */

static __device__ __forceinline__ uint32_t pytfm__tf32(float x) { return __float_as_uint(x); }
static __device__ __forceinline__ uint32_t pytfm__bf16x2(float, float) { return 0; }
static __device__ __forceinline__ void pytfm__mma_tf32(float *, const uint32_t *,
                                                       const uint32_t *) {}
static __device__ __forceinline__ void pytfm__mma_bf16(float *, const uint32_t *,
                                                       const uint32_t *) {}

#endif

/* ---- ldmatrix (the tensor-core SGEMM's shared-memory loads) --------------------------------
 *   pytfm__ldmatrix<N, T>(r, row)   ldmatrix.sync.aligned.m8n8.xN{.trans if T}.shared.b16:
 *                                   N (1, 2, 4) 8 × 8 matrices of 16-bit elements; lane i
 *                                   gives row (16 bytes, 16-byte aligned, shared memory) i % 8
 *                                   of matrix i / 8 (lanes past 8·N give none) and receives r[q]
 *                                   of matrix q: elements (i / 4, 2(i % 4)) in the lower half,
 *                                   (i / 4, 2(i % 4) + 1) in the upper; .trans transposed:
 *                                   (2(i % 4), i / 4) and (2(i % 4) + 1, i / 4).
 * A warp collective, as the mma: every lane of the warp calls it with the same N and T. A row
 * of 4 FP32 values is a row of 8 16-bit halves, so without .trans it also hands lane i the
 * 32-bit element (i / 4, i % 4) of an 8 × 4 FP32 matrix: TF32's fragment order. */
#if defined(PYTFM_EMULATE)

template <int N, bool T>
static __device__ __forceinline__ void pytfm__ldmatrix(uint32_t r[N], const void *row) {
    static_assert(N == 1 || N == 2 || N == 4, "x1, x2 or x4");
    pytfm_emu::ldmatrix(r, N, T, row);
}

#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

template <int N, bool T>
static __device__ __forceinline__ void pytfm__ldmatrix(uint32_t r[N], const void *row) {
    static_assert(N == 1 || N == 2 || N == 4, "x1, x2 or x4");
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (N == 1 && !T)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                     : "=r"(r[0]) : "r"(a));
    if (N == 1 && T)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                     : "=r"(r[0]) : "r"(a));
    if (N == 2 && !T)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[N > 1 ? 1 : 0]) : "r"(a));
    if (N == 2 && T)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[N > 1 ? 1 : 0]) : "r"(a));
    if (N == 4 && !T)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[N > 1 ? 1 : 0]), "=r"(r[N > 2 ? 2 : 0]),
                       "=r"(r[N > 2 ? 3 : 0])
                     : "r"(a));
    if (N == 4 && T)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[N > 1 ? 1 : 0]), "=r"(r[N > 2 ? 2 : 0]),
                       "=r"(r[N > 2 ? 3 : 0])
                     : "r"(a));
}

#else /* nvcc's host pass, or a GPU without it: never launched */

template <int N, bool T>
static __device__ __forceinline__ void pytfm__ldmatrix(uint32_t r[N], const void *) {
    for (int q = 0; q < N; q++) r[q] = 0;
}

#endif

/* ---- the shared-memory layout the ldmatrix loads read ----------------------------------------
 *   pytfm__swz<CHUNKS>(r, c)    the physical 16-byte chunk of logical chunk c in row r of a
 *                               tile whose rows are CHUNKS chunks long, so that the 8
 *                               consecutive rows of one ldmatrix matrix, which share a logical
 *                               chunk, land in 8 distinct 16-byte bank groups of the 8 in 128
 *                               bytes (one wavefront a matrix). Rows of 8+ chunks: c ^ r % 8;
 *                               of 4 (two rows per 128 bytes): c ^ r / 2 % 4; of 2 (32 bytes):
 *                               c ^ r / 4 % 2.
 *   pytfm__store2(p, lo, hi)    p[0] = lo, p[1] = hi as one 8-byte shared store (p 8-byte
 *                               aligned): a warp's 32 such stores of 256 contiguous bytes, in
 *                               any order, take the least wavefronts (2) */
template <int CHUNKS> static __device__ __forceinline__ int pytfm__swz(int r, int c) {
    // (c & ~7) | (c ^ r) & 7 is c ^ (r & 7), written so that c's high bits (a constant in the
    // unrolled loops) stay an immediate offset: fewer addresses to keep in registers
    return CHUNKS >= 8 ? (c & ~7) | ((c ^ r) & 7) : c ^ (r / (8 / CHUNKS) & (CHUNKS - 1));
}

static __device__ __forceinline__ void pytfm__store2(uint32_t *p, uint32_t lo, uint32_t hi) {
#ifdef PYTFM_EMULATE
    p[0] = lo;
    p[1] = hi;
#else
    *reinterpret_cast<uint2 *>(p) = make_uint2(lo, hi);
#endif
}

#endif /* PYTFM_MMA_CUH */
