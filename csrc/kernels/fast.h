/*
 * fast.h — the vectorised row kernels behind the element-wise ops. fast_impl.h holds them once,
 * in plain C loops that the compiler vectorises; fast_portable.c, fast_avx2.c and
 * fast_avx512.c compile that same text for the baseline target, AVX2 and AVX-512, and
 * pytfm__fast() picks the table for the ISA in use (NULL when it is PYTFM_ISA_PLAIN: the op
 * then runs its plain reference loop). Each op file splits its rows among threads and calls
 * one of these per row (or per chunk of a flat array).
 */
#ifndef PYTFM_FAST_H
#define PYTFM_FAST_H

#include <stdint.h>
#include <string.h>

#include "core/internal.h"

typedef struct pytfm__adamw_consts {
    float decay, step_size, bc2_sqrt, b1, c1, b2, c2, eps;
} pytfm__adamw_consts;

typedef struct pytfm__fast_kernels {
    void (*softmax_forward)(float *y, const float *x, int64_t cols);
    void (*softmax_backward)(float *dx, const float *dy, const float *y, int64_t cols);
    void (*layernorm_forward)(float *y, float *mean, float *rstd, const float *x,
                              const float *w, const float *b, int64_t cols, float eps);
    /* dx written; dw, db accumulated (per-chunk partial sums) */
    void (*layernorm_backward)(float *dx, float *dw, float *db, const float *dy, const float *x,
                               const float *w, float mean, float rstd, int64_t cols);
    /* a chunk of count elements of a flat array */
    void (*gelu_forward)(float *y, const float *x, int64_t count);
    void (*gelu_backward)(float *dx, const float *dy, const float *x, int64_t count);
    /* cross-entropy, one row of logits: its lse, and d[j] = scale · exp(x[j] − lse) */
    float (*logsumexp)(const float *x, int64_t cols);
    void (*scaled_exp)(float *d, const float *x, float lse, float scale, int64_t cols);
    void (*adamw)(float *p, float *m, float *v, const float *g, int64_t count,
                  const pytfm__adamw_consts *c);
    /* Attention, one query row of a key tile of nk keys of which the first vis are visible:
     * the forward's online-softmax step turns s (raw scores q·k) into P = e^(scale·s − m')
     * (0 past vis), updates the running max m and sum l, and returns e^(m − m'), the factor
     * the row's output so far must be scaled by. This one and attn_p_row work in whole
     * vectors: s must have room for vis rounded up to 16 floats, whatever it holds past vis. */
    float (*attn_softmax_row)(float *s, int64_t vis, int64_t nk, float scale, float *m,
                              float *l);
    /* backward: s (raw scores) -> P = e^(scale·s − lse), 0 past vis */
    void (*attn_p_row)(float *s, int64_t vis, int64_t nk, float scale, float lse);
    /* backward: dp (dP) -> dS = P·(dP − delta)·scale, delta = dy_t · o_t of the query row;
     * 0 past vis (dp there may be anything: it is not read) */
    void (*attn_ds_row)(float *dp, const float *p, int64_t vis, int64_t nk, float delta,
                        float scale);
    /* decoding, one query row: o = alpha·o + Σ_c p[c]·v_c over nk keys (row stride ldv) */
    void (*attn_pv_row)(float *o, const float *p, const float *v, int64_t ldv, int64_t nk,
                        int64_t D, float alpha);
    /* y[o] = Σ_i x[i]·w[o·ldw + i] (+ b[o]) for o < out (b may be NULL), each sum over 16
     * lanes as the row ops above: the linear layer's forward on one row (ldw = in), and a
     * query's scores against a tile of keys (ldw = H·D) */
    void (*gemv)(float *y, const float *x, const float *w, int64_t ldw, const float *b,
                 int64_t in, int64_t out);
    /* rows [0, R) of y (row stride ldy) = x (row stride ldx)·Wᵀ (+ b[o]) for o < out, W's
     * rows (stride ldw) taken one at a time, each read once for all R rows: a matrix too large
     * for the caches streams from memory in one sequential pass (the one-row product of such
     * a matrix, and the few-row products of a short prompt). Row r of y is the bits gemv gives
     * x's row r alone (the same sums in the same order). */
    void (*gemv_rows)(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t R,
                      const float *w, int64_t ldw, const float *b, int64_t in, int64_t out);
    /* gemv in BF16: x and w rounded to BF16 as read (w16, when not NULL, the BF16 copy of w,
     * read instead: the same values), the products summed in float as gemv sums */
    void (*gemv_bf16)(float *y, const float *x, const float *w, const uint16_t *w16,
                      int64_t ldw, const float *b, int64_t in, int64_t out);
    /* RMSNorm, one row (rmsnorm.c): y, rstd written; the backward's dx written, dw
     * accumulated (a chunk's partial sums) */
    void (*rmsnorm_forward)(float *y, float *rstd, const float *x, const float *w, int64_t cols,
                            float eps);
    void (*rmsnorm_backward)(float *dx, float *dw, const float *dy, const float *x,
                             const float *w, float rstd, int64_t cols);
    /* SwiGLU (swiglu.c), a chunk of count elements */
    void (*swiglu_forward)(float *h, const float *g, const float *u, int64_t count);
    void (*swiglu_backward)(float *dg, float *du, const float *dh, const float *g,
                            const float *u, int64_t count);
} pytfm__fast_kernels;

extern const pytfm__fast_kernels pytfm__fast_portable, pytfm__fast_avx2, pytfm__fast_avx512;

/* One row of LayerNorm's forward, summed in double: the plain kernel's row (layernorm.c), and
 * the fast kernels' fallback for the rare row whose float sums overflow or underflow
 * (PYTFM_LN_FLOAT_SUMS_OK). */
void pytfm__layernorm_forward_row(float *y, float *mean, float *rstd, const float *x,
                                  const float *w, const float *b, int64_t cols, float eps);

/* One row of RMSNorm's forward, summed in double: the plain kernel's row (rmsnorm.c), and the
 * fast kernels' fallback for a row whose float sum overflows or underflows. */
void pytfm__rmsnorm_forward_row(float *y, float *rstd, const float *x, const float *w,
                                int64_t cols, float eps);

/* the kernels for isa, or NULL for PYTFM_ISA_PLAIN (the plain reference loops) */
const pytfm__fast_kernels *pytfm__fast_for(int32_t isa);

/* the kernels for the ISA in use: pytfm__fast_for(pytfm_get_isa()) */
const pytfm__fast_kernels *pytfm__fast(void);

#endif /* PYTFM_FAST_H */
