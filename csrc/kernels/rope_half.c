/*
 * rope_half.c — RoPE from a table of frequencies, rotate-half pairing (the Llama family), and
 * that table.
 *
 *   x, y [B, T, H, D], half = D/2; pos[b·pos_stride + t]; inv_freq [half]
 *   θ_i = fl(fl(pos) · inv_freq[i])  (float32, as transformers' LlamaRotaryEmbedding)
 *     y_i = x_i cos θ_i − x_{i+half} sin θ_i,   y_{i+half} = x_{i+half} cos θ_i + x_i sin θ_i
 *   backward: dx = R(−θ) dy (sin θ negated: the same bits of cos and |sin|)
 * The maths of rope.c, with the angle a table lookup and a float product instead of
 * pow(base, ·) in double: a frequency scaling (llama3) is then only another table
 * (pytfm_rope_inv_freq, below). The plain version computes cos and sin of each (b, t, i) once
 * and applies them to every head; the fast one fills a table of cos, sin per distinct position
 * row first (P·D floats of scratch for P rows) and rotates the rows on all threads: the same
 * expressions, the same bits.
 */
#include <stdlib.h>

#include "core/checks.h"
#include "rope.h"

/* cos and sin of the angles of position p: [half] each; sign −1 negates sin (backward) */
static void angles(float *cs, float *sn, int64_t p, const float *inv_freq, int64_t half,
                   float sign) {
    const float pf = (float)p;
    for (int64_t i = 0; i < half; i++) {
        const float theta = pf * inv_freq[i];
        cs[i] = (float)cos((double)theta);
        sn[i] = sign * (float)sin((double)theta);
    }
}

/* the plain version: each (b, t) row's angles, then its heads; no scratch */
static void rope_plain(float *out, const float *in, const int64_t *pos, const float *inv_freq,
                       int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                       float sign) {
    const int64_t half = D / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const int64_t p = pos[b * pos_stride + t];
            for (int64_t i = 0; i < half; i++) { // one pair index at a time: no buffer
                float c, s;
                angles(&c, &s, p, inv_freq + i, 1, sign);
                const int64_t row = (b * T + t) * H * D; // (b, t, :, :)
                for (int64_t h = 0; h < H; h++) {
                    const float x0 = in[row + h * D + i], x1 = in[row + h * D + i + half];
                    out[row + h * D + i] = x0 * c - x1 * s;
                    out[row + h * D + i + half] = x1 * c + x0 * s;
                }
            }
        }
}

/* the fast version: the angles of the P distinct position rows (T when the batch shares one
 * row of positions, else B·T) into scratch, then every (b, t) row on all threads */
static pytfm_status rope_tabled(const char *func, float *out, const float *in,
                                const int64_t *pos, const float *inv_freq, int64_t B, int64_t T,
                                int64_t H, int64_t D, int64_t pos_stride, float sign) {
    const int64_t half = D / 2, rows = pos_stride == 0 ? T : B * T;
    float *cs = pytfm__scratch(func, 2 * rows * half, sizeof(float));
    if (!cs) return PYTFM_STATUS_OUT_OF_MEMORY;
    float *sn = cs + rows * half;
    PYTFM_PARALLEL_FOR_IF(!pytfm__one_task(rows, half * 8))
    for (int64_t r = 0; r < rows; r++)
        angles(cs + r * half, sn + r * half, pos[r / T * pos_stride + r % T], inv_freq, half,
               sign);
    PYTFM_PARALLEL_FOR_IF(!pytfm__one_task(B * T, H * D))
    for (int64_t bt = 0; bt < B * T; bt++) {
        const int64_t r = pos_stride == 0 ? bt % T : bt;
        pytfm__rope_rotate_row(out + bt * H * D, in + bt * H * D, cs + r * half, sn + r * half,
                               H, D);
    }
    free(cs);
    return PYTFM_STATUS_OK;
}

static pytfm_status rope_freq(const char *func, float *out, const float *in, const int64_t *pos,
                              const float *inv_freq, int64_t B, int64_t T, int64_t H, int64_t D,
                              int64_t pos_stride, float sign) {
    PYTFM_TRY(pytfm__check_rope_freq(func, out, in, pos, inv_freq, B, T, H, D, pos_stride));
    if (B * T * H == 0) return PYTFM_STATUS_OK; // pos may then be NULL: nothing to read
    if (pytfm_get_isa() != PYTFM_ISA_PLAIN)
        return rope_tabled(func, out, in, pos, inv_freq, B, T, H, D, pos_stride, sign);
    rope_plain(out, in, pos, inv_freq, B, T, H, D, pos_stride, sign);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_rope_freq_forward(float *y, const float *x, const int64_t *pos,
                                     const float *inv_freq, int64_t B, int64_t T, int64_t H,
                                     int64_t D, int64_t pos_stride) {
    return rope_freq(__func__, y, x, pos, inv_freq, B, T, H, D, pos_stride, 1.0f);
}

pytfm_status pytfm_rope_freq_backward(float *dx, const float *dy, const int64_t *pos,
                                      const float *inv_freq, int64_t B, int64_t T, int64_t H,
                                      int64_t D, int64_t pos_stride) {
    return rope_freq(__func__, dx, dy, pos, inv_freq, B, T, H, D, pos_stride, -1.0f);
}

/* ---- the table ------------------------------------------------------------------------- */

/* transformers' _compute_llama3_parameters, one frequency, in double */
static double llama3(double f, double factor, double low_freq_factor, double high_freq_factor,
                     double original_max_pos) {
    const double wavelen = 6.283185307179586 / f; // 2π / f
    const double lo = original_max_pos / low_freq_factor, hi = original_max_pos / high_freq_factor;
    if (wavelen < hi) return f;
    if (wavelen > lo) return f / factor;
    const double s = (original_max_pos / wavelen - low_freq_factor) /
                     (high_freq_factor - low_freq_factor);
    return (1.0 - s) * f / factor + s * f;
}

pytfm_status pytfm_rope_inv_freq(float *inv_freq, int64_t D, double theta, int32_t scaling,
                                 double factor, double low_freq_factor, double high_freq_factor,
                                 double original_max_pos) {
    PYTFM_TRY(pytfm__check_rope_inv_freq(__func__, inv_freq, D, theta, scaling, factor,
                                         low_freq_factor, high_freq_factor, original_max_pos));
    for (int64_t i = 0; i < D / 2; i++) {
        double f = 1.0 / pow(theta, (double)(2 * i) / (double)D);
        if (scaling == PYTFM_ROPE_SCALING_LLAMA3)
            f = llama3(f, factor, low_freq_factor, high_freq_factor, original_max_pos);
        inv_freq[i] = (float)f;
    }
    return PYTFM_STATUS_OK;
}
