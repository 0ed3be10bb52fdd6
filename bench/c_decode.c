/*
 * c_decode.c — pytfm's decoding timed from C, with no Python in the loop, and the machine's
 * read bandwidth beside it: the C side of bench/c_generate.py, bench/gpt2_decode.py and the
 * bf16 group of bench/run.py.
 *
 *   c_decode CHECKPOINT REPS THREADS [PRECISION [TOKENS]]
 *       Each rep resets one session and feeds TOKENS tokens (default and at most max_seq) one
 *       at a time (fixed pseudo-random ids), timing each pytfm_session_feed (which writes the
 *       logits, as a generator needs them), with the model in PRECISION (fp32, the default,
 *       bf16 or int8: pytfm_model_set_precision). Prints one line per position t: "t median_ns min_ns"
 *       over the reps.
 *   c_decode --generate MODEL REPS THREADS PRECISION PROMPT TOKENS
 *       MODEL: whatever pytfm_model_open opens (a pytfm checkpoint, a GPT-2 folder). Each rep
 *       resets the session, feeds a prompt of PROMPT tokens in one call, then decodes
 *       TOKENS tokens greedily (each the argmax of the logits before it, fed alone). Prints one
 *       line per rep: "prompt_ns decode_ns", the decode's the sum over its TOKENS feeds.
 *   c_decode --bandwidth MIB THREADS REPS [small|huge]
 *       The STREAM-like read: a buffer of MIB MiB of floats, written once, then summed REPS
 *       times by THREADS threads (contiguous shares, one per thread). Prints one line per rep:
 *       "bytes ns". A decoded token reads every weight once, so bytes / ns is the rate that
 *       bounds decoding. huge (the default) asks Linux for transparent huge pages for the
 *       buffer, as pytfm does for a model's weights (csrc/core/weights.c); small leaves it in
 *       the default pages.
 */
#define _DEFAULT_SOURCE /* clock_gettime, madvise */

#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <pthread.h>
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

/* fixed pseudo-random token ids below vocab (an LCG: the ids do not change the work) */
static void lcg_tokens(int64_t *tokens, int64_t count, int64_t vocab) {
    uint64_t x = 12345;
    for (int64_t t = 0; t < count; t++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        tokens[t] = (int64_t)((x >> 33) % (uint64_t)vocab);
    }
}

/* ---- the read bandwidth ------------------------------------------------------------------- */

typedef struct share {
    const float *p;
    int64_t count;
    float sum; /* written by the thread: kept, so that the reads cannot be optimised away */
} share;

/* Σ p[0 .. count) over 64 partial sums: independent chains, so the loads, not the adds, set
 * the pace (the compiler vectorises them) */
static void *sum_share(void *arg) {
    share *s = arg;
    float acc[64] = {0};
    int64_t i = 0;
    for (; i + 64 <= s->count; i += 64)
        for (int l = 0; l < 64; l++) acc[l] += s->p[i + l];
    for (; i < s->count; i++) acc[0] += s->p[i];
    float t = 0.0f;
    for (int l = 0; l < 64; l++) t += acc[l];
    s->sum = t;
    return NULL;
}

static int bandwidth(int64_t mib, int threads, int reps, int huge) {
    enum { MAX_THREADS = 64, HUGE_PAGE = 2 << 20 };
    if (mib < 1 || threads < 1 || threads > MAX_THREADS || reps < 1) return 2;
    const int64_t count = mib * (1 << 20) / (int64_t)sizeof(float);
    float *buf = aligned_alloc(HUGE_PAGE, (size_t)mib << 20); // a whole number of 2 MiB
    if (!buf) return 1;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (huge) (void)madvise(buf, (size_t)mib << 20, MADV_HUGEPAGE); // before the first touch
#else
    (void)huge;
#endif
    for (int64_t i = 0; i < count; i++) buf[i] = (float)(i & 1023); // every page touched
    share shares[MAX_THREADS];
    const int64_t per = (count / threads + 15) / 16 * 16; // 64-byte multiples
    for (int t = 0; t < threads; t++) {
        const int64_t lo = t * per < count ? t * per : count;
        const int64_t hi = lo + per < count ? lo + per : count;
        shares[t] = (share){buf + lo, hi - lo, 0.0f};
    }
    float total = 0.0f;
    for (int r = 0; r < reps; r++) {
        pthread_t ids[MAX_THREADS];
        const int64_t t0 = now_ns();
        for (int t = 1; t < threads; t++) pthread_create(&ids[t], NULL, sum_share, &shares[t]);
        sum_share(&shares[0]);
        for (int t = 1; t < threads; t++) pthread_join(ids[t], NULL);
        const int64_t ns = now_ns() - t0;
        for (int t = 0; t < threads; t++) total += shares[t].sum;
        printf("%lld %lld\n", (long long)(count * (int64_t)sizeof(float)), (long long)ns);
    }
    fprintf(stderr, "checksum %g\n", (double)total);
    free(buf);
    return 0;
}

/* ---- decoding ----------------------------------------------------------------------------- */

/* the model at checkpoint path on `threads` threads in precision "fp32", "bf16" or "int8" */
static int open_model(pytfm_model **model, const char *path, const char *threads,
                      const char *precision) {
    const int32_t code = !strcmp(precision, "fp32")   ? PYTFM_PRECISION_FP32
                         : !strcmp(precision, "bf16") ? PYTFM_PRECISION_BF16
                         : !strcmp(precision, "int8") ? PYTFM_PRECISION_INT8
                                                      : -1;
    if (code < 0) return 2;
    if (pytfm_set_num_threads(atoi(threads)) != PYTFM_STATUS_OK) return fail("threads");
    if (pytfm_model_open(model, path, PYTFM_DEVICE_CPU) != PYTFM_STATUS_OK) return fail("open");
    // always set: a bfloat16 Llama folder opens in BF16
    if (pytfm_model_set_precision(*model, code) != PYTFM_STATUS_OK) return fail("precision");
    return 0;
}

static int64_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* --generate: a prompt in one feed, then greedy decoding, per rep */
static int generate(int argc, char **argv) {
    if (argc != 8) return 2;
    const int reps = atoi(argv[3]);
    const int64_t prompt = atoll(argv[6]), count = atoll(argv[7]);
    if (reps < 1 || prompt < 1 || count < 1) return 2;
    pytfm_model *model;
    const int rc = open_model(&model, argv[2], argv[4], argv[5]);
    if (rc) return rc;
    pytfm_model_config cfg;
    pytfm_model_get_config(model, &cfg);
    if (prompt + count > cfg.max_seq) return 2;
    pytfm_session *session;
    if (pytfm_session_open(&session, model, prompt + count) != PYTFM_STATUS_OK)
        return fail("session");
    float *logits = malloc((size_t)cfg.vocab * sizeof *logits);
    int64_t *tokens = malloc((size_t)prompt * sizeof *tokens);
    if (!logits || !tokens) return 1;
    lcg_tokens(tokens, prompt, cfg.vocab);
    for (int r = 0; r < reps; r++) {
        pytfm_session_reset(session);
        const int64_t t0 = now_ns();
        if (pytfm_session_feed(session, logits, tokens, prompt) != PYTFM_STATUS_OK)
            return fail("feed");
        const int64_t t1 = now_ns();
        for (int64_t t = 0; t < count; t++) {
            const int64_t next = argmax(logits, cfg.vocab);
            if (pytfm_session_feed(session, logits, &next, 1) != PYTFM_STATUS_OK)
                return fail("feed");
        }
        printf("%lld %lld\n", (long long)(t1 - t0), (long long)(now_ns() - t1));
    }
    free(tokens);
    free(logits);
    pytfm_session_close(session);
    pytfm_model_close(model);
    return 0;
}

/* the default mode: each position's feed timed alone */
static int positions(int argc, char **argv) {
    if (argc < 4 || argc > 6) return 2;
    const int reps = atoi(argv[2]);
    if (reps < 1) return 2;
    pytfm_model *model;
    const int rc = open_model(&model, argv[1], argv[3], argc > 4 ? argv[4] : "fp32");
    if (rc) return rc;
    pytfm_model_config cfg;
    pytfm_model_get_config(model, &cfg);
    int64_t T = cfg.max_seq;
    if (argc > 5 && atoll(argv[5]) >= 1 && atoll(argv[5]) < T) T = atoll(argv[5]);
    pytfm_session *session;
    if (pytfm_session_open(&session, model, 0) != PYTFM_STATUS_OK) return fail("session");
    float *logits = malloc((size_t)cfg.vocab * sizeof *logits);
    int64_t *tokens = malloc((size_t)T * sizeof *tokens);
    int64_t *ns = malloc((size_t)(T * reps) * sizeof *ns); /* [T, reps] */
    if (!logits || !tokens || !ns) return 1;
    lcg_tokens(tokens, T, cfg.vocab);
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

int main(int argc, char **argv) {
    int rc;
    if (argc > 1 && strcmp(argv[1], "--bandwidth") == 0)
        rc = argc == 5 || (argc == 6 && (strcmp(argv[5], "small") == 0 ||
                                         strcmp(argv[5], "huge") == 0))
                 ? bandwidth(atoll(argv[2]), atoi(argv[3]), atoi(argv[4]),
                             argc == 5 || strcmp(argv[5], "huge") == 0)
                 : 2;
    else if (argc > 1 && strcmp(argv[1], "--generate") == 0)
        rc = generate(argc, argv);
    else
        rc = positions(argc, argv);
    if (rc == 2)
        fprintf(stderr, "usage: c_decode CHECKPOINT REPS THREADS [fp32|bf16|int8 [TOKENS]]\n"
                        "       c_decode --generate MODEL REPS THREADS fp32|bf16|int8 PROMPT "
                        "TOKENS\n"
                        "       c_decode --bandwidth MIB THREADS REPS [small|huge]\n");
    return rc;
}
