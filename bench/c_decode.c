/*
 * c_decode.c — the C side of bench/c_generate.py: the time of each token's decode step in a
 * pytfm session, with no Python in the loop.
 *
 *   c_decode CHECKPOINT REPS THREADS [PRECISION [TOKENS]]
 *
 * Each rep resets one session and feeds TOKENS tokens (default and at most max_seq) one at a
 * time (fixed pseudo-random ids), timing each pytfm_session_feed (which writes the logits, as a
 * generator needs them), with the model in PRECISION (fp32, the default, or bf16:
 * pytfm_model_set_precision). Prints one line per position t: "t median_ns min_ns" over the
 * reps.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pytfm.h"

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int fail(const char *what) {
    fprintf(stderr, "c_decode: %s: %s\n", what, pytfm_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: c_decode CHECKPOINT REPS THREADS [fp32|bf16 [TOKENS]]\n");
        return 2;
    }
    const int bf16 = argc > 4 && strcmp(argv[4], "bf16") == 0;
    if (argc > 4 && !bf16 && strcmp(argv[4], "fp32") != 0) return 2;
    const int reps = atoi(argv[2]);
    if (reps < 1) return 2;
    if (pytfm_set_num_threads(atoi(argv[3])) != PYTFM_STATUS_OK) return fail("threads");
    pytfm_model *model;
    if (pytfm_model_open(&model, argv[1], PYTFM_DEVICE_CPU) != PYTFM_STATUS_OK)
        return fail("open");
    if (bf16 && pytfm_model_set_precision(model, PYTFM_PRECISION_BF16) != PYTFM_STATUS_OK)
        return fail("precision");
    pytfm_model_config cfg;
    pytfm_model_get_config(model, &cfg);
    int64_t T = cfg.max_seq;
    if (argc > 5 && atoll(argv[5]) >= 1 && atoll(argv[5]) < T) T = atoll(argv[5]);
    pytfm_session *session;
    if (pytfm_session_open(&session, model, 0) != PYTFM_STATUS_OK) return fail("session");
    float *logits = malloc((size_t)cfg.vocab * sizeof *logits);
    int64_t *tokens = malloc((size_t)T * sizeof *tokens);
    int64_t *ns = malloc((size_t)(T * reps) * sizeof *ns); /* [T, reps] */
    uint64_t x = 12345;
    for (int64_t t = 0; t < T; t++) { /* an LCG: the ids do not change the work */
        x = x * 6364136223846793005u + 1442695040888963407u;
        tokens[t] = (int64_t)((x >> 33) % (uint64_t)cfg.vocab);
    }
    for (int r = 0; r < reps; r++) {
        pytfm_session_reset(session);
        for (int64_t t = 0; t < T; t++) {
            const int64_t t0 = now_ns();
            if (pytfm_session_feed(session, logits, tokens + t, 1) != PYTFM_STATUS_OK)
                return fail("feed");
            ns[t * reps + r] = now_ns() - t0;
        }
    }
    for (int64_t t = 0; t < T; t++) {
        qsort(ns + t * reps, (size_t)reps, sizeof *ns, cmp);
        printf("%lld %lld %lld\n", (long long)t, (long long)ns[t * reps + reps / 2],
               (long long)ns[t * reps]);
    }
    free(ns);
    free(tokens);
    free(logits);
    pytfm_session_close(session);
    pytfm_model_close(model);
    return 0;
}
