/*
 * rope.c — rotary position embedding (RoPE), rotate-half (GPT-NeoX) pairing.
 *
 *   x, y [B, T, H, D], D even, half = D/2; pos[b·pos_stride + t] the position of token (b, t)
 *   θ_i = pos · base^(−2i/D) for i in [0, half); the pair (x_i, x_{i+half}) is rotated by θ_i:
 *     y_i = x_i cos θ_i − x_{i+half} sin θ_i,   y_{i+half} = x_{i+half} cos θ_i + x_i sin θ_i
 *   backward: a rotation is orthogonal, so dx = R(θ)ᵀ dy = R(−θ) dy.
 * Both directions run the same code (rope(), below), with the sign of the angle as argument.
 * The plain version, rotate(), computes the angle of each (b, t, i) once, in double precision,
 * and applies it to every head; the fast one (rotate_tabled) computes the H-independent part
 * once: cos and sin of θ_i for each distinct position row (T of them when all batches share
 * positions, pos_stride = 0, else B·T), a table of P·D floats of scratch for P such rows, and
 * applies it on all threads in loops that vectorise. Same expressions, so the same bits as
 * the plain version.
 */
#include <stdlib.h>

#include "checks.h"

static void rotate(float *out, const float *in, const int64_t *pos, int64_t B, int64_t T,
                   int64_t H, int64_t D, int64_t pos_stride, double base, double sign) {
    const int64_t half = D / 2;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const double p = (double)pos[b * pos_stride + t];
            for (int64_t i = 0; i < half; i++) {
                const double theta = sign * p * pow(base, -2.0 * (double)i / (double)D);
                const float c = (float)cos(theta), s = (float)sin(theta);
                for (int64_t h = 0; h < H; h++) {
                    const int64_t off = ((b * T + t) * H + h) * D; // (b, t, h, :)
                    const float x0 = in[off + i], x1 = in[off + i + half];
                    out[off + i] = x0 * c - x1 * s;
                    out[off + i + half] = x1 * c + x0 * s;
                }
            }
        }
    }
}

/* cos, sin of θ at position p: [half] each */
static void angle_row(float *cs, float *sn, double p, int64_t D, double base, double sign) {
    for (int64_t i = 0; i < D / 2; i++) {
        const double theta = sign * p * pow(base, -2.0 * (double)i / (double)D);
        cs[i] = (float)cos(theta);
        sn[i] = (float)sin(theta);
    }
}

/* cos, sin of θ for the position rows [0, count) of pos (row r = batch r / T, time r % T):
 * [count, half] each */
static void angle_table(float *cs, float *sn, const int64_t *pos, int64_t count, int64_t T,
                        int64_t pos_stride, int64_t D, double base, double sign) {
    const int64_t half = D / 2;
    if (pytfm__one_task(count, half * 8)) { // no parallel region for one task
        for (int64_t r = 0; r < count; r++)
            angle_row(cs + r * half, sn + r * half, (double)pos[r / T * pos_stride + r % T], D,
                      base, sign);
        return;
    }
    PYTFM_PARALLEL_FOR
    for (int64_t r = 0; r < count; r++)
        angle_row(cs + r * half, sn + r * half, (double)pos[r / T * pos_stride + r % T], D, base,
                  sign);
}

/* the (b, t) row bt of H·D floats, rotated by the angles c, s [half] */
static void rotate_row(float *out, const float *in, const float *c, const float *s, int64_t bt,
                       int64_t H, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < H; h++) {
        const float *x = in + (bt * H + h) * D; // (b, t, h, :)
        float *y = out + (bt * H + h) * D;
        for (int64_t i = 0; i < half; i++) {
            const float x0 = x[i], x1 = x[i + half];
            y[i] = x0 * c[i] - x1 * s[i];
            y[i + half] = x1 * c[i] + x0 * s[i];
        }
    }
}

static pytfm_status rotate_tabled(const char *func, float *out, const float *in,
                                  const int64_t *pos, int64_t B, int64_t T, int64_t H, int64_t D,
                                  int64_t pos_stride, double base, double sign) {
    // distinct position rows: T when the batches share one row of positions, else B·T
    const int64_t half = D / 2, pos_rows = pos_stride == 0 ? T : B * T;
    float *cs = pytfm__scratch(func, 2 * pos_rows * half, sizeof(float));
    if (!cs) return PYTFM_STATUS_OUT_OF_MEMORY;
    float *sn = cs + pos_rows * half;
    angle_table(cs, sn, pos, pos_rows, T, pos_stride, D, base, sign);
    if (pytfm__one_task(B * T, H * D)) { // no parallel region for one task
        for (int64_t bt = 0; bt < B * T; bt++) {
            const float *c = cs + (pos_stride == 0 ? bt % T : bt) * half;
            rotate_row(out, in, c, sn + (c - cs), bt, H, D);
        }
    } else {
        PYTFM_PARALLEL_ROWS(B * T, H * D)
        for (int64_t bt = 0; bt < B * T; bt++) {
            const float *c = cs + (pos_stride == 0 ? bt % T : bt) * half;
            rotate_row(out, in, c, sn + (c - cs), bt, H, D);
        }
    }
    free(cs);
    return PYTFM_STATUS_OK;
}

/* both directions: sign +1 rotates by θ (forward), −1 by −θ (backward) */
static pytfm_status rope(const char *func, float *out, const float *in, const int64_t *pos,
                         int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                         double base, double sign) {
    PYTFM_TRY(pytfm__check_rope(func, out, in, pos, B, T, H, D, pos_stride, base));
    if (B * T * H == 0) return PYTFM_STATUS_OK; // pos may then be NULL: nothing to read
    if (pytfm_get_isa() != PYTFM_ISA_PLAIN)
        return rotate_tabled(func, out, in, pos, B, T, H, D, pos_stride, base, sign);
    rotate(out, in, pos, B, T, H, D, pos_stride, base, sign);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_rope_forward(float *y, const float *x, const int64_t *pos, int64_t B,
                                int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                                double base) {
    return rope(__func__, y, x, pos, B, T, H, D, pos_stride, base, +1.0);
}

pytfm_status pytfm_rope_backward(float *dx, const float *dy, const int64_t *pos, int64_t B,
                                 int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                                 double base) {
    return rope(__func__, dx, dy, pos, B, T, H, D, pos_stride, base, -1.0);
}
