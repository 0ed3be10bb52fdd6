/*
 * q8.h — the 8-bit weights' kernels behind q8.c (pytfm_linear_forward_q8w): the plain loops
 * (q8.c) and the vectorised ones (q8_avx2.c, q8_avxvnni.c, q8_avx512vnni.c), one table each.
 *
 * A row of x is quantised once per call into a pytfm__q8x (x's blocks as int8 with a float32
 * scale each, plus what the kernel's dot product needs besides, `aux`), then each row of W is
 * dotted with it. Every table computes the same bits (the contract in pytfm_kernels.h): the
 * integer lane sums are exact whatever the instructions, and the float combination is the one
 * order of the header, which each kernel's vectors follow.
 */
#ifndef PYTFM_Q8_H
#define PYTFM_Q8_H

#include <stdint.h>
#include <string.h>

#include "core/internal.h"

/* One row of x quantised for the product, in pytfm__q8x_bytes(in) bytes of scratch:
 *   qx  [in]        round(x / dx) per block, in [−127, 127]
 *   aux [in]        the kernel's own: |qx| (AVX2: vpmaddubsw takes an unsigned operand), or
 *                   int32 [in / 4] −128·Σ of each 4 neighbours of qx (the VNNI kernels
 *                   multiply q + 128 as unsigned and start each lane at this correction)
 *   dx  [in / 32]   the blocks' scales, amax / 127 in float32 (0 for a block of zeros)
 * finite: 0 when x's row holds inf or NaN (then the product takes the float32 sum instead) */
typedef struct pytfm__q8x {
    int8_t *qx;
    void *aux;
    float *dx;
    int finite;
} pytfm__q8x;

/* the bytes of one row's pytfm__q8x and its `finite` (q8.c), a multiple of 64 */
static inline int64_t pytfm__q8x_bytes(int64_t in) {
    return (2 * in + 4 * (in / 32) + 4 + 63) & ~(int64_t)63;
}

typedef struct pytfm__q8_kernels {
    const char *name;
    /* x's row [in] into xq (its arrays set by the caller) */
    void (*quantize_x)(pytfm__q8x *xq, const float *x, int64_t in);
    /* y[o] = the contract's sum of x (as xq) with W's row o (+ b[o]) for o < out (b may be
     * NULL); q, scales: W's first row to take; xq->finite is 1 */
    void (*gemv)(float *y, const pytfm__q8x *xq, const int8_t *q, const uint16_t *scales,
                 const float *b, int64_t in, int64_t out);
} pytfm__q8_kernels;

extern const pytfm__q8_kernels pytfm__q8_plain, pytfm__q8_avx2, pytfm__q8_avxvnni,
    pytfm__q8_avx512vnni;

/* the table for the ISA cap and the CPU (q8.c; pytfm_kernels.h lists the paths) */
const pytfm__q8_kernels *pytfm__q8(void);

/* isa.c: the cap pytfm_set_max_isa set (PYTFM_ISA_AUTO: none), and the CPU's features the
 * kernels here need beyond pytfm_cpu_feature's (each with the registers' state saved by the
 * OS) */
int32_t pytfm__isa_cap(void);
enum { PYTFM__CPU_F16C = 1, PYTFM__CPU_AVX_VNNI = 2, PYTFM__CPU_AVX512_VNNI = 4 /* with BW, VL */ };
uint64_t pytfm__cpu_q8_features(void);

/* ---- fp16 ----------------------------------------------------------------------------------- */

/* the float32 value of fp16 bits h, exactly (subnormals, ±0, ±inf, NaN) */
static inline float pytfm__half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t u;
    if (e == 0) { // ±0 and subnormals: m · 2^-24, exact in float
        const float v = (float)m * 0x1p-24f;
        memcpy(&u, &v, sizeof u);
        u |= sign;
    } else if (e == 31) {
        u = sign | 0x7F800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* the fp16 bits of a finite float f rounded to nearest, ties to even; f at or past 65520 in
 * magnitude gives ±inf's bits (0x7C00 with f's sign). Subnormal results by the float add of
 * 0.5, which rounds |f| < 2^-14 to a multiple of 2^-24 (float's ulp at 0.5) with the FPU's
 * ties to even; normal ones by adding the rounding bias to the bits before the shift. */
static inline uint16_t pytfm__half_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint32_t h;
    if (u >= 0x47800000u) { // >= 65536: inf
        h = 0x7C00u;
    } else if (u < 0x38800000u) { // < 2^-14: subnormal or zero
        float a;
        memcpy(&a, &u, sizeof a);
        a += 0.5f;
        memcpy(&h, &a, sizeof h);
        h -= 0x3F000000u;
    } else {
        const uint32_t odd = (u >> 13) & 1u;
        u += 0xC8000FFFu + odd; // exponent rebiased (−112 << 23), then half an ulp less 1
        h = u >> 13;            // [65520, 65536) carries into the exponent: inf
    }
    return (uint16_t)(h | (sign >> 16));
}

#endif /* PYTFM_Q8_H */
