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
 *
 * The attention block's split of its fused QKV projection runs here too: qkv [B, T, 3, H, D]
 * (the c_attn output, q, k, v interleaved per token) -> q, k, v [B, T, H, D] with q and k
 * rotated, in one pass over qkv; its backward rotates dq, dk back and writes them with dv into
 * dqkv in the fused layout, in place of three strided copies, two RoPE passes and a stack.
 * Both kinds of call are a list of "streams" (rows of H·D floats read with one row stride,
 * written with another, rotated or copied), which the plain and the fast paths below walk the
 * same way.
 */
#include <stdlib.h>
#include <string.h>

#include "core/checks.h"
#include "rope.h"

/* One operand: row r (r = b·T + t) of H·D floats is read at in + r·in_stride and written at
 * out + r·out_stride, rotated (rotate != 0) or copied. */
typedef struct stream {
    float *out;
    const float *in;
    int64_t out_stride, in_stride;
    int rotate;
} stream;

/* the plain version: each angle computed where it is used, in double */
static void rotate(const stream *st, const int64_t *pos, int64_t B, int64_t T, int64_t H,
                   int64_t D, int64_t pos_stride, double base, double sign) {
    const int64_t half = D / 2;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            const float *in = st->in + (b * T + t) * st->in_stride; // (b, t, :, :)
            float *out = st->out + (b * T + t) * st->out_stride;
            if (!st->rotate) {
                for (int64_t j = 0; j < H * D; j++) out[j] = in[j];
                continue;
            }
            const double p = (double)pos[b * pos_stride + t];
            for (int64_t i = 0; i < half; i++) {
                const double theta = sign * p * pow(base, -2.0 * (double)i / (double)D);
                const float c = (float)cos(theta), s = (float)sin(theta);
                for (int64_t h = 0; h < H; h++) {
                    const float x0 = in[h * D + i], x1 = in[h * D + i + half];
                    out[h * D + i] = x0 * c - x1 * s;
                    out[h * D + i + half] = x1 * c + x0 * s;
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

void pytfm__rope_rotate_row(float *out, const float *in, const float *c, const float *s,
                            int64_t H, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < H; h++) {
        const float *x = in + h * D; // (h, :)
        float *y = out + h * D;
        for (int64_t i = 0; i < half; i++) {
            const float x0 = x[i], x1 = x[i + half];
            y[i] = x0 * c[i] - x1 * s[i];
            y[i + half] = x1 * c[i] + x0 * s[i];
        }
    }
}

/* row bt of each of the n streams; c, s: the angles of its position */
static void stream_rows(const stream *st, int n, int64_t bt, const float *c, const float *s,
                        int64_t H, int64_t D) {
    for (int i = 0; i < n; i++) {
        float *out = st[i].out + bt * st[i].out_stride;
        const float *in = st[i].in + bt * st[i].in_stride;
        if (st[i].rotate)
            pytfm__rope_rotate_row(out, in, c, s, H, D);
        else
            memcpy(out, in, (size_t)(H * D) * sizeof(float));
    }
}

static pytfm_status rotate_tabled(const char *func, const stream *st, int n, const int64_t *pos,
                                  int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                                  double base, double sign) {
    // distinct position rows: T when the batches share one row of positions, else B·T; none
    // when nothing is rotated (pos may then be NULL)
    int rotated = 0;
    for (int i = 0; i < n; i++) rotated |= st[i].rotate;
    const int64_t half = D / 2, pos_rows = !rotated ? 1 : pos_stride == 0 ? T : B * T;
    float *cs = pytfm__scratch(func, 2 * pos_rows * half, sizeof(float));
    if (!cs) return PYTFM_STATUS_OUT_OF_MEMORY;
    float *sn = cs + pos_rows * half;
    if (rotated) angle_table(cs, sn, pos, pos_rows, T, pos_stride, D, base, sign);
    if (pytfm__one_task(B * T, n * H * D)) { // no parallel region for one task
        for (int64_t bt = 0; bt < B * T; bt++) {
            const float *c = cs + (!rotated ? 0 : pos_stride == 0 ? bt % T : bt) * half;
            stream_rows(st, n, bt, c, sn + (c - cs), H, D);
        }
    } else {
        PYTFM_PARALLEL_ROWS(B * T, n * H * D)
        for (int64_t bt = 0; bt < B * T; bt++) {
            const float *c = cs + (!rotated ? 0 : pos_stride == 0 ? bt % T : bt) * half;
            stream_rows(st, n, bt, c, sn + (c - cs), H, D);
        }
    }
    free(cs);
    return PYTFM_STATUS_OK;
}

/* the n streams, rotated by sign·θ (+1 forward, −1 backward): checked arguments */
static pytfm_status run_streams(const char *func, const stream *st, int n, const int64_t *pos,
                                int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                                double base, double sign) {
    if (B * T * H == 0) return PYTFM_STATUS_OK; // pos may then be NULL: nothing to read
    if (pytfm_get_isa() != PYTFM_ISA_PLAIN)
        return rotate_tabled(func, st, n, pos, B, T, H, D, pos_stride, base, sign);
    for (int i = 0; i < n; i++) rotate(&st[i], pos, B, T, H, D, pos_stride, base, sign);
    return PYTFM_STATUS_OK;
}

/* both directions: sign +1 rotates by θ (forward), −1 by −θ (backward) */
static pytfm_status rope(const char *func, float *out, const float *in, const int64_t *pos,
                         int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos_stride,
                         double base, double sign) {
    PYTFM_TRY(pytfm__check_rope(func, out, in, pos, B, T, H, D, pos_stride, base));
    const stream st = {out, in, H * D, H * D, 1};
    return run_streams(func, &st, 1, pos, B, T, H, D, pos_stride, base, sign);
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

/* ---- the fused QKV projection's split -------------------------------------------------- */

pytfm_status pytfm_qkv_split_forward(float *q, float *k, float *v, const float *qkv,
                                     const int64_t *pos, int64_t B, int64_t T, int64_t H,
                                     int64_t D, int64_t pos_stride, double base, int32_t rope) {
    PYTFM_TRY(pytfm__check_qkv_split(__func__, q, k, v, qkv, pos, B, T, H, D, pos_stride, base,
                                     rope, 0));
    const int64_t hd = H * D;
    const stream st[3] = {{q, qkv, hd, 3 * hd, rope != 0},
                          {k, qkv + hd, hd, 3 * hd, rope != 0},
                          {v, qkv + 2 * hd, hd, 3 * hd, 0}};
    return run_streams(__func__, st, 3, pos, B, T, H, D, pos_stride, base, +1.0);
}

pytfm_status pytfm_qkv_split_backward(float *dqkv, const float *dq, const float *dk,
                                      const float *dv, const int64_t *pos, int64_t B, int64_t T,
                                      int64_t H, int64_t D, int64_t pos_stride, double base,
                                      int32_t rope) {
    PYTFM_TRY(pytfm__check_qkv_split(__func__, dq, dk, dv, dqkv, pos, B, T, H, D, pos_stride,
                                     base, rope, 1));
    const int64_t hd = H * D;
    const stream st[3] = {{dqkv, dq, 3 * hd, hd, rope != 0},
                          {dqkv + hd, dk, 3 * hd, hd, rope != 0},
                          {dqkv + 2 * hd, dv, 3 * hd, hd, 0}};
    return run_streams(__func__, st, 3, pos, B, T, H, D, pos_stride, base, -1.0);
}
