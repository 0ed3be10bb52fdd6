/*
 * Every kernel, forward and backward, on exactly-sized heap buffers and awkward sizes. Built
 * with -fsanitize=address,undefined by tests/c_api/test_sanitizers.py: a read or write one element
 * past a buffer, or undefined behaviour in the index arithmetic, aborts the program there.
 */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "pytfm.h"

static uint32_t lcg = 12345u;

static uint32_t next(void) { return (lcg = lcg * 1664525u + 1013904223u) >> 8; } // 24 bits

static float *floats(int64_t count) { // exactly count floats (at least one, so never NULL)
    float *p = malloc((size_t)(count ? count : 1) * sizeof(float));
    for (int64_t i = 0; i < count; i++) p[i] = (float)next() / 16777216.0f - 0.5f;
    return p;
}

static int64_t *indices(int64_t count, int64_t limit) {
    int64_t *p = malloc((size_t)(count ? count : 1) * sizeof(int64_t));
    for (int64_t i = 0; i < count; i++) p[i] = (int64_t)next() % limit;
    return p;
}

/* rows: the row count of the row-wise ops, T of attention and RoPE; a and b: the other sizes */
static int run(int64_t rows, int64_t a, int64_t b) {
    float *x = floats(rows * a), *w = floats(b * a), *bias = floats(b), *y = floats(rows * b);
    float *dy = floats(rows * b), *dx = floats(rows * a), *dw = floats(b * a), *db = floats(b);
    CHECK(pytfm_linear_forward(y, x, w, bias, rows, a, b));
    CHECK(pytfm_linear_backward(dx, dw, db, dy, x, w, rows, a, b));
    float *s = floats(rows * a), *ds = floats(rows * a);
    float *mean = floats(rows), *rstd = floats(rows);
    float *g = floats(a), *gb = floats(a), *dg = floats(a), *dgb = floats(a);
    CHECK(pytfm_softmax_forward(s, x, rows, a));
    CHECK(pytfm_softmax_backward(ds, dx, s, rows, a));
    CHECK(pytfm_layernorm_forward(s, mean, rstd, x, g, gb, rows, a, 1e-5f));
    CHECK(pytfm_layernorm_backward(ds, dg, dgb, dx, x, g, mean, rstd, rows, a));
    CHECK(pytfm_gelu_forward(s, x, rows * a));
    CHECK(pytfm_gelu_backward(ds, dx, x, rows * a));
    int64_t *ids = indices(rows, b), *pos = indices(rows * 2, 1000);
    float *table = floats(b * a), *dtable = floats(b * a), *lse = floats(rows), loss;
    CHECK(pytfm_embedding_forward(s, ids, table, rows, b, a));
    CHECK(pytfm_embedding_backward(dtable, dx, ids, rows, b, a));
    CHECK(pytfm_cross_entropy_forward(&loss, lse, y, ids, rows, b, -1));
    CHECK(pytfm_cross_entropy_backward(dy, y, ids, lse, rows, b, -1, 1.0f));
    CHECK(pytfm_adamw_step(w, dw, table, dtable, b * a, 3, 1e-3, 0.9, 0.999, 1e-8, 0.1));
    // RoPE on [2, rows, b, 2a]: batched positions [2, rows], then one shared row
    float *q = floats(2 * rows * b * 2 * a), *rq = floats(2 * rows * b * 2 * a);
    CHECK(pytfm_rope_forward(rq, q, pos, 2, rows, b, 2 * a, rows, 10000.0));
    CHECK(pytfm_rope_backward(q, rq, pos, 2, rows, b, 2 * a, 0, 10000.0));
    // attention on [2, rows, b, a] (T = rows, H = b, D = a), causal and not; decode through
    // a cache: rows new tokens at start = 1
    const int64_t hd = 2 * rows * b * a;
    float *aq = floats(hd), *k = floats(hd), *v = floats(hd), *o = floats(hd), *ady = floats(hd);
    float *alse = floats(2 * b * rows);
    float *dq = floats(hd), *dk = floats(hd), *dv = floats(hd);
    float *kc = floats(2 * (rows + 1) * b * a), *vc = floats(2 * (rows + 1) * b * a);
    for (int causal = 0; causal < 2; causal++) {
        CHECK(pytfm_attention_forward(o, alse, aq, k, v, 2, rows, b, a, 0.5f, causal));
        CHECK(pytfm_attention_backward(dq, dk, dv, ady, aq, k, v, o, alse, 2, rows, b, a, 0.5f,
                                       causal));
    }
    CHECK(pytfm_attention_cache_append(kc, vc, k, v, 2, rows, b, a, rows + 1, 1));
    CHECK(pytfm_attention_decode(o, alse, aq, kc, vc, 2, rows, b, a, rows + 1, 1, 0.5f));
    void *all[] = {x, w, bias, y, dy, dx, dw, db, s, ds, mean, rstd, g, gb, dg, dgb, ids, pos,
                   table, dtable, lse, q, rq, aq, k, v, o, ady, alse, dq, dk, dv, kc, vc};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    return 0;
}

int main(void) {
    const int64_t sizes[] = {1, 2, 3, 7, 17, 33};
    const int k = sizeof sizes / sizeof *sizes;
    int runs = 0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++)
            for (int l = 0; l < k; l++, runs++)
                if (run(sizes[i] - (i == 0), sizes[j], sizes[l])) return 1; // rows = 0 once
    printf("%d size combinations ran clean\n", runs);
    return 0;
}
