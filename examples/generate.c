/*
 * generate.c — text from a model in C, through libpytfm's model API: a checkpoint written by
 * examples/train_tiny.py (its tokens are bytes) or a Hugging Face GPT-2 folder (config.json,
 * model.safetensors, its tokenizer), with no conversion step:
 *   cc -std=c11 -O2 examples/generate.c $(pkg-config --cflags --libs pytfm) -o generate
 *   ./generate gpt2-folder --prompt "Hello, my name is" --tokens 50
 * The prompt is fed in one call; each new token is drawn (pytfm_sample) among the tokenizer's
 * ids (a vocabulary padded past them never gives the others), fed back through the KV cache and
 * written to stdout as it comes (a write that fails, a closed pipe, stops it: status 1); stderr
 * gets the tokens/s. Flags: sample.py's and --threads (docs/c-api.md); a bad one: status 2.
 */
#define _POSIX_C_SOURCE 200809L /* stat, clock_gettime */

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "pytfm.h"
#define BYTES 256 /* a checkpoint's model: one token per byte */
#define USAGE                                                                                  \
    "usage: generate CHECKPOINT|FOLDER [--prompt TEXT] [--tokens N] [--temperature T] "         \
    "[--top-k K] [--seed S] [--threads N] [--precision {fp32,bf16}]\n"
#define HELP "\nsample.py's flags, in C, plus --threads (0: the library's default): docs/c-api.md"

/* the usage and "generate: error: <message>" on stderr; exit status 2, as argparse */
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs(USAGE "generate: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    return fputc('\n', stderr), 2;
}

typedef struct options {
    const char *checkpoint, *prompt;
    double temperature; /* < 0: not given, the model's kind decides */
    long long tokens, top_k, seed, threads, precision; /* precision: a pytfm_precision */
} options;

/* argv into *o: 0, or the exit status of a bad command line (-1: --help was printed) */
static int parse(int argc, char **argv, options *o) {
    static const struct { const char *name, *range; long long max; } flags[] = {
        {"--prompt", "", 0}, {"--temperature", "", 0}, {"--precision", "", 0},
        {"--tokens", "must be >= 0", INT64_MAX},
        {"--top-k", "must be >= 0 (0: no top-k cut)", INT64_MAX},
        {"--seed", "must be an integer in [0, 4294967295]", 4294967295LL}, /* sample.py's */
        {"--threads", "must be an integer in [0, 2147483647] (0: the default)", INT32_MAX}};
    *o = (options){NULL, "def ", -1.0, 100, 40, 0, 0, PYTFM_PRECISION_FP32};
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i], *eq = strchr(arg, '='), *value, *end;
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) return puts(USAGE HELP), -1;
        if (strncmp(arg, "--", 2) != 0 || !strcmp(arg, "--")) {
            if (o->checkpoint) return fail("unrecognized argument: %s", arg);
            o->checkpoint = arg;
            continue;
        }
        int f = 0, len = eq ? (int)(eq - arg) : (int)strlen(arg); /* --flag VALUE, --flag=VALUE */
        while (f < 7 && (strlen(flags[f].name) != (size_t)len || strncmp(arg, flags[f].name, len)))
            f++;
        if (f == 7) return fail("unrecognized argument: %.*s", len, arg);
        if (!eq && i + 1 == argc) return fail("argument %s: expected one argument", flags[f].name);
        value = eq ? eq + 1 : argv[++i];
        errno = 0;
        const long long v = strtoll(value, &end, 10); /* a number is the whole word */
        const int integer = end != value && *end == '\0' && errno != ERANGE;
        if (f == 0) o->prompt = value;
        else if (f == 1) {
            o->temperature = strtod(value, &end);
            if (end == value || *end != '\0')
                return fail("argument --temperature: invalid float value: '%s'", value);
            if (!(o->temperature >= 0.0 && o->temperature < INFINITY))
                return fail("--temperature must be finite and >= 0 (0: greedy), got %s", value);
        } else if (f == 2) {
            if (strcmp(value, "fp32") && strcmp(value, "bf16"))
                return fail("argument --precision: invalid choice: '%s' (choose from 'fp32', "
                            "'bf16')", value);
            o->precision = strcmp(value, "bf16") ? PYTFM_PRECISION_FP32 : PYTFM_PRECISION_BF16;
        } else if (!integer && f < 5) {
            return fail("argument %s: invalid int value: '%s'", flags[f].name, value);
        } else if (!integer || v < 0 || v > flags[f].max) {
            return fail("%s %s, got %s", flags[f].name, flags[f].range, value);
        } else {
            *(f == 3 ? &o->tokens : f == 4 ? &o->top_k : f == 5 ? &o->seed : &o->threads) = v;
        }
    }
    if (!o->checkpoint) return fail("the following arguments are required: checkpoint");
    if (!o->prompt[0])
        return fail("--prompt must not be empty: generation continues at least one byte");
    return 0;
}

static int is_file(const char *folder, const char *name) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", folder, name);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* the model at path: a checkpoint file, or a GPT-2 folder (config.json, its weights and its
 * tokenizer: into *tok, NULL on entry); NULL with the problem reported (status 2; *tok to close) */
static pytfm_model *load(const char *path, pytfm_tokenizer **tok) {
    struct stat st;
    pytfm_model *model = NULL;
    if (stat(path, &st) != 0) return fail("checkpoint: there is no file %s", path), NULL;
    const int hint = is_file(path, "model.safetensors"); /* a folder without config.json */
    if (S_ISDIR(st.st_mode) && !is_file(path, "config.json"))
        return fail("checkpoint: %s is a folder%s%s%s", path, hint ? " (did you mean " : "",
                    hint ? path : "", hint ? "/model.safetensors?)" : ""), NULL;
    if (S_ISDIR(st.st_mode) && pytfm_tokenizer_open_folder(path, tok) != PYTFM_STATUS_OK)
        return fail("checkpoint: %s", pytfm_last_error()), NULL;
    if (pytfm_model_open(&model, path, PYTFM_DEVICE_CPU) != PYTFM_STATUS_OK)
        fail("checkpoint: %s", pytfm_last_error());
    return model;
}

static double seconds(void) {
    struct timespec ts;
    return clock_gettime(CLOCK_MONOTONIC, &ts), (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Write token id's bytes (the tokenizer's, or the byte itself) to stdout, flushed where they
 * end a UTF-8 character (*open: the bytes still to come of the last one): a reader of the pipe
 * never sees half a character, and a write that fails sets ferror(stdout) at once. */
static pytfm_status put_token(const pytfm_tokenizer *tok, int64_t id, int *open) {
    const char byte = (char)id, *bytes = &byte;
    int64_t size = 1;
    pytfm_status st = tok ? pytfm_tokenizer_token(tok, (int32_t)id, &bytes, &size)
                          : PYTFM_STATUS_OK;
    for (int64_t i = 0; st == PYTFM_STATUS_OK && i < size; i++) {
        const unsigned char c = (unsigned char)bytes[i];
        *open = (c & 0xC0) == 0x80 ? *open - 1 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0;
    }
    if (st == PYTFM_STATUS_OK && fwrite(bytes, 1, (size_t)size, stdout) && *open <= 0)
        fflush(stdout);
    return st;
}

/* The prompt fed at once, then up to n[1] tokens drawn among the first n_tok ids (the model's
 * vocab, or its tokenizer's fewer), each fed back and written as it comes, until a write fails:
 * n[1] := the tokens made; t[0], t[1] the seconds of the model's work on the prompt and on them */
static pytfm_status generate(pytfm_session *session, const int64_t *prompt, int64_t n[2],
                             const options *o, int64_t vocab, int64_t n_tok,
                             const pytfm_tokenizer *tok, double t[2]) {
    float *logits = malloc((size_t)vocab * sizeof *logits);
    int open = 0;
    pytfm_rng rng;
    pytfm_rng_seed(&rng, (uint64_t)o->seed);
    double t0 = seconds();
    pytfm_status st = logits ? pytfm_session_feed(session, logits, prompt, n[0])
                             : PYTFM_STATUS_OUT_OF_MEMORY;
    t[0] = seconds() - t0;
    const int64_t want = n[1];
    for (n[1] = 0; n[1] < want && st == PYTFM_STATUS_OK && !ferror(stdout); n[1]++) {
        int64_t token;
        t0 = seconds();
        st = pytfm_sample(&token, logits, n_tok, o->temperature, o->top_k < n_tok ? o->top_k : 0,
                          &rng);
        if (st == PYTFM_STATUS_OK && n[1] + 1 < want)
            st = pytfm_session_feed(session, logits, &token, 1);
        t[1] += seconds() - t0;
        if (st == PYTFM_STATUS_OK) st = put_token(tok, token, &open);
    }
    free(logits);
    return st;
}

/* the prompt's token ids into ids[0, *n) (room for one a byte): its bytes, or the tokenizer's
 * encoding (<|endoftext|> in it the special token, as sample.py has it) */
static pytfm_status encode(const char *prompt, const pytfm_tokenizer *tok, int64_t *ids,
                           int64_t *n) {
    const int64_t len = (int64_t)strlen(prompt);
    int32_t *ids32 = malloc((size_t)len * sizeof *ids32);
    pytfm_status st = ids32 ? PYTFM_STATUS_OK : PYTFM_STATUS_OUT_OF_MEMORY;
    *n = len;
    if (st == PYTFM_STATUS_OK && tok)
        st = pytfm_tokenizer_encode(tok, prompt, len, 1, ids32, len, n);
    for (int64_t i = 0; st == PYTFM_STATUS_OK && i < *n; i++)
        ids[i] = tok ? ids32[i] : (unsigned char)prompt[i];
    free(ids32);
    return st;
}

/* the model's checks against the tokenizer and the prompt, then the text: the exit status */
static int run(const options *o, pytfm_model *model, const pytfm_tokenizer *tok, int64_t *prompt) {
    pytfm_model_config cfg;
    pytfm_model_get_config(model, &cfg);
    int64_t n[2] = {0, 0}, n_tok = tok ? pytfm_tokenizer_vocab_size(tok) : BYTES; /* n: T0, new */
    if (tok ? n_tok > cfg.vocab : cfg.vocab != BYTES) /* more ids than the model: nothing */
        return fail("checkpoint: its model has a vocabulary of %lld tokens, %s %lld %s",
                    (long long)cfg.vocab, tok ? "fewer than the" : "not the", (long long)n_tok,
                    tok ? "of its tokenizer" : "bytes generate encodes text into");
    pytfm_status st = encode(o->prompt, tok, prompt, &n[0]);
    if (st != PYTFM_STATUS_OK)
        return fprintf(stderr, "generate: error: cannot encode the prompt: %s\n",
                       pytfm_last_error()), 1;
    if (n[0] > cfg.max_seq)
        return fail("--prompt is %lld %s, longer than the model's context of %lld",
                    (long long)n[0], tok ? "tokens" : "bytes", (long long)cfg.max_seq);
    n[1] = o->tokens < cfg.max_seq - n[0] ? o->tokens : cfg.max_seq - n[0];
    if (n[1] < o->tokens)
        fprintf(stderr, "note: --tokens %lld cut to %lld: the model's context is %lld and the "
                "prompt takes %lld\n", o->tokens, (long long)n[1], (long long)cfg.max_seq,
                (long long)n[0]);
    pytfm_session *session = NULL; /* it checks that n[0] + n[1] positions fit in memory */
    double t[2] = {0.0, 0.0};
    st = pytfm_model_set_precision(model, (int32_t)o->precision);
    if (st == PYTFM_STATUS_OK) st = pytfm_session_open(&session, model, n[0] + n[1]);
    if (st == PYTFM_STATUS_OK && fputs(o->prompt, stdout) >= 0)
        st = generate(session, prompt, n, o, cfg.vocab, n_tok, tok, t);
    pytfm_session_close(session);
    if (st != PYTFM_STATUS_OK)
        return fprintf(stderr, "generate: error: %s\n", st == PYTFM_STATUS_OUT_OF_MEMORY ?
                       "out of memory" : pytfm_last_error()), 1;
    const int failed = putchar('\n') == EOF || fflush(stdout) || ferror(stdout); /* disk full */
    if (failed) fprintf(stderr, "generate: error: cannot write the text to stdout: %s\n",
                        strerror(errno));
    fprintf(stderr, "generate: prompt of %lld tokens in %.2f ms: %.0f tokens/s; %lld new tokens "
            "in %.2f ms: %.0f tokens/s, threads: %d, precision: %s\n", (long long)n[0],
            1e3 * t[0], t[0] > 0 ? n[0] / t[0] : 0.0, (long long)n[1], 1e3 * t[1],
            t[1] > 0 ? n[1] / t[1] : 0.0, (int)pytfm_get_num_threads(),
            o->precision == PYTFM_PRECISION_FP32 ? "fp32" : pytfm_get_bf16_isa() ==
            PYTFM_ISA_AVX512_BF16 ? "bf16 (AVX512-BF16: vdpbf16ps)" : "bf16 (rounded inputs)");
    return failed;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); /* a closed stdout is then a write error, said in run() */
    options o;
    const int bad = parse(argc, argv, &o);
    if (bad) return bad < 0 ? 0 : bad;
    if (o.threads && pytfm_set_num_threads((int32_t)o.threads) != PYTFM_STATUS_OK) /* 0: keep */
        return fail("--threads: %s", pytfm_last_error());
    pytfm_tokenizer *tok = NULL;
    pytfm_model *model = load(o.checkpoint, &tok);
    int64_t *prompt = malloc(strlen(o.prompt) * sizeof *prompt); /* a token a byte at most */
    if (o.temperature < 0) o.temperature = tok ? 0.0 : 0.8; /* a folder: greedy, as transformers */
    const int code = !model ? 2 : !prompt ? fprintf(stderr, "generate: error: out of memory\n"), 1
                                          : run(&o, model, tok, prompt);
    free(prompt);
    pytfm_model_close(model);
    pytfm_tokenizer_close(tok);
    return code;
}
