/*
 * Every kernel, forward and backward, on exactly-sized heap buffers and awkward sizes. The calls
 * are generated from tests/ops_registry.py (each op's exact calls) into exact_calls.h by
 * tests/c_api/test_sanitizers.py, which builds this with -fsanitize=address,undefined (or by
 * hand: python tests/ops_registry.py exact > exact_calls.h): a read or write one element past
 * a buffer, or undefined behaviour in the index arithmetic, aborts the program there.
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

static double *doubles(int64_t count) {
    double *p = malloc((size_t)(count ? count : 1) * sizeof(double));
    for (int64_t i = 0; i < count; i++) p[i] = (double)next() / 16777216.0 - 0.5;
    return p;
}

static int64_t *indices(int64_t count, int64_t limit) { // each in [0, limit)
    int64_t *p = malloc((size_t)(count ? count : 1) * sizeof(int64_t));
    for (int64_t i = 0; i < count; i++) p[i] = (int64_t)next() % limit;
    return p;
}

static uint16_t *halves(int64_t count) { // the BF16 bits of finite values (the upper halves)
    uint16_t *p = malloc((size_t)(count ? count : 1) * sizeof(uint16_t));
    for (int64_t i = 0; i < count; i++) p[i] = (uint16_t)(0x3E00u + next() % 0x0200u) |
                                               (uint16_t)((next() & 1u) << 15);
    return p;
}

static int8_t *bytes8(int64_t count) { // 8-bit weights, in [-127, 127]
    int8_t *p = malloc((size_t)(count ? count : 1));
    for (int64_t i = 0; i < count; i++) p[i] = (int8_t)((int)(next() % 255u) - 127);
    return p;
}

/* static int run(int64_t r, int64_t a, int64_t b): every exact call at rows (or T) r and the
 * other sizes a and b */
#include "exact_calls.h"

int main(void) {
    const int64_t sizes[] = {1, 2, 3, 7, 17, 33};
    const int k = sizeof sizes / sizeof *sizes;
    int runs = 0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++)
            for (int l = 0; l < k; l++, runs++)
                if (run(sizes[i] - (i == 0), sizes[j], sizes[l])) return 1; // r = 0 once
    printf("%d size combinations ran clean\n", runs);
    return 0;
}
