/* q8_arith.c — which arithmetic the 8-bit one-row product should use, measured:
 *   (a) integer: x quantised per block, int8 dot products (the library's
 *       pytfm_linear_forward_q8w, AVX512-VNNI on this CPU);
 *   (b) float: each weight widened, Σ x_i·q_i per block in float32 then times its scale
 *       (written here, AVX-512F, 4 rows of W at a time, the same split among threads).
 * Decode-shaped: one row of x, the weight shapes of GPT-2 124M and Qwen3-0.6B; medians of
 * interleaved repetitions. Build and run (from the repository root, after pip install -e .):
 *   cc -O3 -march=native -fopenmp dev/q8_arith.c -Icsrc/include -Lpytfm/lib \
 *      -l:libpytfm.so.1 -Wl,-rpath,$PWD/pytfm/lib -lm -o /tmp/q8_arith && /tmp/q8_arith
 */
#include <immintrin.h>
#include <omp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pytfm.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* (b): y[o] = Σ_blk d[o, blk]·Σ_{i in blk} x_i·q[o, i], R rows of W at a time */
static void rows_float(float *y, const float *x, const int8_t *q, const uint16_t *s, int64_t in,
                       int R) {
    const int64_t nb = in / 32;
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        const __m512 x0 = _mm512_loadu_ps(x + 32 * blk), x1 = _mm512_loadu_ps(x + 32 * blk + 16);
        for (int r = 0; r < R; r++) {
            const int8_t *w = q + r * in + 32 * blk;
            const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((void *)w)));
            const __m512 w1 =
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((void *)(w + 16))));
            const __m512 t = _mm512_fmadd_ps(x1, w1, _mm512_mul_ps(x0, w0));
            const float d = _cvtsh_ss(s[r * nb + blk]);
            acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(d), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = _mm512_reduce_add_ps(acc[r]);
}

static void gemv_float(float *y, const float *x, const int8_t *q, const uint16_t *s, int64_t in,
                       int64_t out) {
    const int64_t nb = in / 32;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t o0 = 0; o0 < out; o0 += 64) {
        const int64_t end = o0 + 64 < out ? o0 + 64 : out;
        int64_t o = o0;
        for (; o + 4 <= end; o += 4) rows_float(y + o, x, q + o * in, s + o * nb, in, 4);
        for (; o < end; o++) rows_float(y + o, x, q + o * in, s + o * nb, in, 1);
    }
}

static int cmp(const void *a, const void *b) {
    const double u = *(const double *)a, v = *(const double *)b;
    return (u > v) - (u < v);
}

int main(void) {
    const int64_t shapes[][2] = {{2304, 768}, {3072, 768}, {768, 3072}, {50257, 768},
                                 {3072, 1024}, {1024, 3072}, {151936, 1024}};
    double load[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(f);
    }
    printf("load average %.2f %.2f %.2f\n", load[0], load[1], load[2]);
    printf("%-14s %3s %10s %10s %8s %8s %6s\n", "W [out, in]", "thr", "(a) us", "(b) us",
           "(a) GB/s", "(b) GB/s", "b/a");
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t out = shapes[k][0], in = shapes[k][1], nb = in / 32;
        float *w = malloc(sizeof(float) * out * in), *x = malloc(sizeof(float) * in);
        float *ya = malloc(sizeof(float) * out), *yb = malloc(sizeof(float) * out);
        int8_t *q = malloc(out * in);
        uint16_t *s = malloc(2 * out * nb);
        srand(1);
        for (int64_t i = 0; i < out * in; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
        for (int64_t i = 0; i < in; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
        if (pytfm_quantize_q8(q, s, w, out, in)) return 1;
        free(w);
        const double bytes = (double)out * in + 2.0 * out * nb;
        const int reps = (int)(2e9 / bytes) < 200 ? ((int)(2e9 / bytes) > 10 ? (int)(2e9 / bytes) : 10) : 200;
        for (int threads = 1; threads <= 2; threads++) {
            pytfm_set_num_threads(threads);
            omp_set_num_threads(threads);
            double ta[200], tb[200];
            for (int r = 0; r < reps; r++) { // interleaved
                double t0 = now();
                pytfm_linear_forward_q8w(ya, x, q, s, NULL, 1, in, out);
                ta[r] = now() - t0;
                t0 = now();
                gemv_float(yb, x, q, s, in, out);
                tb[r] = now() - t0;
            }
            qsort(ta, reps, sizeof(double), cmp);
            qsort(tb, reps, sizeof(double), cmp);
            const double a = ta[reps / 2], b = tb[reps / 2];
            printf("%6lld x %-6lld %3d %10.1f %10.1f %8.1f %8.1f %6.2f\n", (long long)out,
                   (long long)in, threads, 1e6 * a, 1e6 * b, bytes / a / 1e9, bytes / b / 1e9,
                   b / a);
        }
        double err = 0, mag = 0;
        for (int64_t o = 0; o < out; o++) {
            err = fmax(err, fabs(ya[o] - yb[o]));
            mag = fmax(mag, fabs(yb[o]));
        }
        if (err > 0.05 * mag + 1e-3) printf("  (a) and (b) disagree: %g of %g\n", err, mag);
        free(x), free(ya), free(yb), free(q), free(s);
    }
    return 0;
}
