/*
 * Every entry point with sizes whose arithmetic would overflow: products near 2^31,
 * 2^32, 2^61 (the most float32 elements a ptrdiff_t byte count allows), 2^62 and INT64_MAX,
 * RoPE position strides past them, and KV-cache positions start + n_new that wrap. Built with
 * -fsanitize=address,undefined by tests/c_api/test_sanitizers.py: each call must return
 * PYTFM_STATUS_INVALID_ARGUMENT, saying "too large" or "cache overflow", without touching its
 * buffers (one float or one int64 each, on the heap: ASan reports any access past them) and
 * without a signed overflow anywhere in the checks (UBSan reports it).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pytfm.h"

#define MAX INT64_MAX
#define P31 ((int64_t)1 << 31)
#define P32 ((int64_t)1 << 32)
#define P61 ((int64_t)1 << 61)
#define P62 ((int64_t)1 << 62)
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

enum { BUFFERS = 9 };
static float *f[BUFFERS]; /* one float each, 7.0f */
static int64_t *ids;      /* one int64, 3 */
static int calls;

#define REJECT(call)                                                                           \
    do {                                                                                       \
        const pytfm_status st_ = (call);                                                       \
        const char *msg_ = pytfm_last_error();                                                 \
        if (st_ != PYTFM_STATUS_INVALID_ARGUMENT ||                                           \
            (!strstr(msg_, "too large") && !strstr(msg_, "cache overflow"))) {                 \
            fprintf(stderr, "case %zu: %s returned %d: %s\n", i, #call, (int)st_, msg_);       \
            return 1;                                                                          \
        }                                                                                      \
        calls++;                                                                               \
    } while (0)

static const int64_t rc[][2] = {{P32, P32}, {P62, 4},        {4, P62}, {P31 + 1, P31 - 1},
                                {P61, 1},   {MAX, 1},        {1, MAX}, {3, P61 / 2}};
static const int64_t lin[][3] = {{P32, P32, 1}, {P62, 1, 1},  {1, P62, 1},     {1, 1, P62},
                                 {P31, 2, P31}, {1, P31, P31}, {MAX, 1, 1},    {P61, 1, 4}};
static const int64_t mnk[][3] = {{P32, P32, 0}, {P32, P32, P32}, {P62, 1, 1}, {1, P62, 1},
                                 {1, 1, P62},   {P31, P31, 1},   {MAX, 1, 1}, {P61, 1, 0}};
static const int64_t counts[] = {P61, P62, MAX, P61 + 1};
static const int64_t emb[][3] = {{P62, 1, 4},  {1, P62, 4},  {P32, 2, P32},
                                 {P61, 1, 1},  {MAX, 1, 1},  {2, 1, MAX}};
static const int64_t heads[][4] = {{P62, 1, 1, 1}, {1, P62, 1, 1}, {1, 1, P62, 1},
                                   {1, 1, 1, P62}, {1 << 16, 1 << 16, 1 << 16, 1 << 16},
                                   {P31, P31, 1, 1}, {MAX, 1, 1, 1}, {1, 1, 1, MAX}};
static const int64_t rope[][5] = {{P31, P31, 1, 2, 0},  {1, P62, 1, 2, 0},   {1, 1, P62, 2, 0},
                                  {1, 1, 1, P62, 0},    {2, 4, 1, 2, MAX},   {P32, 1, 1, 2, P32},
                                  {3, 1, 1, 2, P62},    {MAX, 1, 1, 2, 0},
                                  {1 << 16, 1 << 16, 1 << 16, 1 << 16, 0}};
static const int64_t positions[][2] = {{P62, 2}, {2, P62},  {P31, P32},       {P61, 2},
                                       {MAX, 2}, {3, P61},  {1, MAX - 1}};
static const int64_t cache[][6] = { /* B, n_new, H, D, Tmax, start */
    {1, 1, 1, 1, 4, MAX},   {1, 2, 1, 1, MAX, MAX - 1}, {1, MAX, 1, 1, 4, 1},
    {P32, 1, P32, 1, 4, 0}, {1, 1, 1, 1, P62, 0},       {1, 1, 1, MAX, 4, 0},
    {1 << 16, 1, 1 << 16, 1 << 16, 1 << 16, 0}};

static int hostile(void) {
    float loss;
    for (size_t i = 0; i < COUNT(mnk); i++) {
        const int64_t *s = mnk[i];
        REJECT(pytfm_sgemm(f[0], f[1], f[2], s[0], s[1], s[2], 0, 0, 0.0f));
        REJECT(pytfm_sgemm(f[0], f[1], f[2], s[0], s[1], s[2], 1, 1, 1.0f));
        REJECT(pytfm_sgemm_plain(f[0], f[1], f[2], s[0], s[1], s[2], 0, 1, 0.0f));
    }
    for (size_t i = 0; i < COUNT(lin); i++) {
        const int64_t *s = lin[i];
        REJECT(pytfm_linear_forward(f[0], f[1], f[2], f[3], s[0], s[1], s[2]));
        REJECT(pytfm_linear_backward(f[0], f[1], f[2], f[3], f[4], f[5], s[0], s[1], s[2]));
        REJECT(pytfm_linear_backward(NULL, f[1], NULL, f[3], f[4], NULL, s[0], s[1], s[2]));
    }
    for (size_t i = 0; i < COUNT(rc); i++) {
        const int64_t rows = rc[i][0], cols = rc[i][1];
        REJECT(pytfm_softmax_forward(f[0], f[1], rows, cols));
        REJECT(pytfm_softmax_backward(f[0], f[1], f[2], rows, cols));
        REJECT(pytfm_layernorm_forward(f[0], f[1], f[2], f[3], f[4], f[5], rows, cols, 1e-5f));
        REJECT(pytfm_layernorm_backward(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], rows,
                                        cols));
        REJECT(pytfm_cross_entropy_forward(&loss, f[1], f[2], ids, rows, cols, -1));
        REJECT(pytfm_cross_entropy_backward(f[0], f[1], ids, f[2], rows, cols, -1, 1.0f));
    }
    for (size_t i = 0; i < COUNT(rope); i++) {
        const int64_t *s = rope[i];
        REJECT(pytfm_rope_forward(f[0], f[1], ids, s[0], s[1], s[2], s[3], s[4], 10000.0));
        REJECT(pytfm_rope_backward(f[0], f[1], ids, s[0], s[1], s[2], s[3], s[4], 10000.0));
    }
    for (size_t i = 0; i < COUNT(positions); i++)
        REJECT(pytfm_sinusoidal_positions(f[0], positions[i][0], positions[i][1]));
    for (size_t i = 0; i < COUNT(counts); i++) {
        REJECT(pytfm_gelu_forward(f[0], f[1], counts[i]));
        REJECT(pytfm_gelu_backward(f[0], f[1], f[2], counts[i]));
        REJECT(pytfm_adamw_step(f[0], f[1], f[2], f[3], counts[i], 1, 1e-3, 0.9, 0.999, 1e-8,
                                0.0));
    }
    for (size_t i = 0; i < COUNT(emb); i++) {
        const int64_t *s = emb[i];
        REJECT(pytfm_embedding_forward(f[0], ids, f[1], s[0], s[1], s[2]));
        REJECT(pytfm_embedding_backward(f[0], f[1], ids, s[0], s[1], s[2]));
    }
    for (size_t i = 0; i < COUNT(heads); i++) {
        const int64_t *s = heads[i];
        for (int causal = 0; causal < 2; causal++) {
            REJECT(pytfm_attention_forward(f[0], f[1], f[2], f[3], f[4], s[0], s[1], s[2], s[3],
                                           0.5f, causal));
            REJECT(pytfm_attention_backward(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8],
                                            s[0], s[1], s[2], s[3], 0.5f, causal));
        }
    }
    for (size_t i = 0; i < COUNT(cache); i++) {
        const int64_t *s = cache[i];
        REJECT(pytfm_attention_cache_append(f[0], f[1], f[2], f[3], s[0], s[1], s[2], s[3], s[4],
                                            s[5]));
        REJECT(pytfm_attention_decode(f[0], f[1], f[2], f[3], f[4], s[0], s[1], s[2], s[3], s[4],
                                      s[5], 0.5f));
    }
    return 0;
}

int main(void) {
    for (int b = 0; b < BUFFERS; b++) {
        f[b] = malloc(sizeof(float));
        *f[b] = 7.0f;
    }
    ids = malloc(sizeof(int64_t));
    *ids = 3;
    int failed = hostile();
    for (int b = 0; b < BUFFERS && !failed; b++)
        if (*f[b] != 7.0f) {
            fprintf(stderr, "buffer %d was written\n", b);
            failed = 1;
        }
    if (!failed && *ids != 3) {
        fprintf(stderr, "ids was written\n");
        failed = 1;
    }
    for (int b = 0; b < BUFFERS; b++) free(f[b]);
    free(ids);
    if (failed) return 1;
    printf("%d hostile calls rejected\n", calls);
    return 0;
}
