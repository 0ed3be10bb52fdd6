/*
 * Every entry point with sizes whose arithmetic would overflow: products near 2^31, 2^32, 2^61
 * (the most float32 elements a ptrdiff_t byte count allows), 2^62 and INT64_MAX, RoPE position
 * strides past them, and KV-cache positions start + n_new that wrap. The calls are generated
 * from tests/ops_registry.py (each op's Limits) into hostile_calls.h, by
 * tests/c_api/test_sanitizers.py, which builds this with -fsanitize=address,undefined (or by
 * hand: python tests/ops_registry.py hostile > hostile_calls.h). Each call must return
 * PYTFM_STATUS_INVALID_ARGUMENT, saying "too large" or "cache overflow", without touching its
 * buffers (one float, double, int64 or uint16 each, on the heap: ASan reports any access past them)
 * and without a signed overflow anywhere in the checks (UBSan reports it).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pytfm.h"

enum { BUFFERS = 16 };
static float *f[BUFFERS]; /* one float each, 7.0f */
static double *d;         /* one double, 5.0 */
static int64_t *ids;      /* one int64, 3 */
static uint16_t *h;       /* one BF16 value's bits, 0x3F80 (1.0) */
static int8_t *i8;        /* one int8 (8-bit weights), 5 */
static int calls;

/* call number i: rejected as too large, or the program reports it and fails */
#define REJECT(i, call)                                                                        \
    do {                                                                                       \
        const pytfm_status st_ = (call);                                                       \
        const char *msg_ = pytfm_last_error();                                                 \
        if (st_ != PYTFM_STATUS_INVALID_ARGUMENT ||                                           \
            (!strstr(msg_, "too large") && !strstr(msg_, "cache overflow"))) {                 \
            fprintf(stderr, "call %d: %s returned %d: %s\n", i, #call, (int)st_, msg_);        \
            return 1;                                                                          \
        }                                                                                      \
        calls++;                                                                               \
    } while (0)

#include "hostile_calls.h"

int main(void) {
    for (int b = 0; b < BUFFERS; b++) {
        f[b] = malloc(sizeof(float));
        *f[b] = 7.0f;
    }
    d = malloc(sizeof(double));
    *d = 5.0;
    ids = malloc(sizeof(int64_t));
    *ids = 3;
    h = malloc(sizeof(uint16_t));
    *h = 0x3F80;
    i8 = malloc(sizeof(int8_t));
    *i8 = 5;
    int failed = hostile_calls();
    for (int b = 0; b < BUFFERS && !failed; b++)
        if (*f[b] != 7.0f) {
            fprintf(stderr, "buffer %d was written\n", b);
            failed = 1;
        }
    if (!failed && (*d != 5.0 || *ids != 3 || *h != 0x3F80 || *i8 != 5)) {
        fprintf(stderr, "the double, the ids, the BF16 bits or the int8 were written\n");
        failed = 1;
    }
    for (int b = 0; b < BUFFERS; b++) free(f[b]);
    free(d);
    free(ids);
    free(h);
    free(i8);
    if (failed) return 1;
    printf("%d hostile calls rejected\n", calls);
    return 0;
}
