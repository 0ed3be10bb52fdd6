/*
 * tile_avx512.h — the store of an 8×32 AVX-512 register tile of C, shared by the FP32
 * (sgemm.c) and the BF16 (sgemm_bf16.c) micro-kernels, which differ only in how they sum.
 *
 * PYTFM__AVX512_STORE_ROW(r), expanded in a function compiled for AVX-512, writes row r of the
 * tile when r < rows: C's row r (c + r·ldc) = acc<r>0 | acc<r>1, the 32 sums of that row, plus
 * bt·C when bt != 0 (beta holds bt in every lane; C is not read otherwise); lanes past the
 * tile's columns are masked off by m0 (columns 0..15) and m1 (16..31), neither read nor
 * written.
 */
#ifndef PYTFM_TILE_AVX512_H
#define PYTFM_TILE_AVX512_H

#define PYTFM__AVX512_STORE_ROW(r)                                                             \
    if (r < rows) {                                                                            \
        float *cr = c + r * ldc;                                                               \
        if (bt != 0.0f) {                                                                      \
            acc##r##0 = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m0, cr), acc##r##0);       \
            acc##r##1 = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m1, cr + 16), acc##r##1);  \
        }                                                                                      \
        _mm512_mask_storeu_ps(cr, m0, acc##r##0);                                              \
        _mm512_mask_storeu_ps(cr + 16, m1, acc##r##1);                                         \
    }

#endif /* PYTFM_TILE_AVX512_H */
