/*
 * The thread count changed from another thread while the kernels that size scratch per thread
 * run: attention's tiled forward and backward, the packed sgemm and LayerNorm's fast
 * backward. Built with -fopenmp and -fsanitize=address,undefined by tests/c_api/test_sanitizers.py: a
 * kernel that sized its workspaces from one read of the count and ran its parallel region with
 * another writes past them, which ASan reports (in Python the write lands in some other heap
 * block and passes unseen). Every result must also be the serial one, bit for bit.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "pytfm.h"

enum { B = 2, T = 80, H = 3, D = 32, N = B * T * H * D, M = 150, K = 200, NN = 96 };
enum { ROWS = 67, COLS = 300, WIDE = 2000, KW = 64 };

static float q[N], k[N], v[N], dy[N], a[M * K], b[K * NN], x[ROWS * COLS], w[COLS], g[ROWS * COLS];
static float bw[KW * WIDE];

typedef struct {
    float o[N], lse[B * H * T], dq[N], dk[N], dv[N];
    float c[M * NN], ct[M * NN], cw[4 * WIDE]; // sgemm: packed B only; A packed per thread;
                                               // split by columns, B packed per thread
    float y[ROWS * COLS], mean[ROWS], rstd[ROWS], dx[ROWS * COLS], dw[COLS], db[COLS];
} results;

static atomic_int stop;

static void *flipper(void *arg) {
    (void)arg;
    const int32_t counts[] = {1, 2, 3, 0, 100000, 7, 64, 2147483647};
    while (!atomic_load(&stop))
        for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
            pytfm_set_num_threads(counts[i]);
    return NULL;
}

static int run(results *r) {
    memset(r, 0, sizeof *r);
    CHECK(pytfm_attention_forward(r->o, r->lse, q, k, v, B, T, H, D, 0.2f, 1));
    CHECK(pytfm_attention_backward(r->dq, r->dk, r->dv, dy, q, k, v, r->o, r->lse, B, T, H, D,
                                   0.2f, 1));
    CHECK(pytfm_sgemm(r->c, a, b, M, NN, K, 0, 0, 0.0f));
    CHECK(pytfm_sgemm(r->ct, a, b, M, NN, K, 1, 0, 0.0f)); // a read as [K, M]
    CHECK(pytfm_sgemm(r->cw, a, bw, 4, WIDE, KW, 0, 0, 0.0f));
    CHECK(pytfm_layernorm_forward(r->y, r->mean, r->rstd, x, w, w, ROWS, COLS, 1e-5f));
    CHECK(pytfm_layernorm_backward(r->dx, r->dw, r->db, g, x, w, r->mean, r->rstd, ROWS, COLS));
    return 0;
}

static void fill(float *p, size_t count, unsigned seed) {
    for (size_t i = 0; i < count; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
}

int main(void) {
    fill(q, N, 1), fill(k, N, 2), fill(v, N, 3), fill(dy, N, 4), fill(a, M * K, 5);
    fill(b, K * NN, 6), fill(x, ROWS * COLS, 7), fill(w, COLS, 8), fill(g, ROWS * COLS, 9);
    fill(bw, KW * WIDE, 10);
    static results serial, got;
    pytfm_set_num_threads(1);
    if (run(&serial)) return 1;
    pthread_t thread;
    pthread_create(&thread, NULL, flipper, NULL);
    int runs = 0, failed = 0;
    const time_t end = time(NULL) + 3;
    while (!failed && time(NULL) < end) {
        failed = run(&got);
        if (!failed && memcmp(&got, &serial, sizeof got) != 0) {
            fprintf(stderr, "run %d differs from the serial results\n", runs);
            failed = 1;
        }
        runs++;
    }
    atomic_store(&stop, 1);
    pthread_join(thread, NULL);
    if (failed) return 1;
    printf("%d runs while the thread count changed, all equal to the serial one\n", runs);
    return 0;
}
