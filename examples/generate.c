/*
 * generate.c — text from a model in C, through libpytfm's model API: a checkpoint written by
 * examples/train_tiny.py (its tokens are bytes), a Hugging Face GPT-2 folder (config.json,
 * model.safetensors, its tokenizer) or a Llama-family folder (Llama, Qwen 2 and 3, Mistral:
 * config.json, safetensors weights, tokenizer.json), with no conversion step:
 *   cc -std=c11 -O2 examples/generate.c $(pkg-config --cflags --libs pytfm) -o generate
 *   ./generate gpt2-folder --prompt "Hello, my name is" --tokens 50
 * The prompt is encoded as transformers' tokenizer encodes it (special tokens in it matched, the
 * post-processor's BOS put first) and fed in one call; each new token is drawn (pytfm_sample)
 * among the tokenizer's ids (a vocabulary padded past them never gives the others), fed back
 * through the KV cache and written to stdout as it comes (a write that fails, a closed pipe,
 * stops it: status 1); stderr gets the tokens/s. A folder is greedy unless --temperature says
 * otherwise. A Llama-family folder stops at its end-of-sequence token, and its text is
 * transformers' decode of the new tokens (U+FFFD for bytes that are not UTF-8; with
 * SentencePiece's byte fallback, the file's decoder), held back only while a character (a run
 * of <0xNN> byte tokens) is not yet whole. Flags: sample.py's and --threads (docs/c-api.md);
 * a bad one: status 2.
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
#define MAX_EOS 16 /* end-of-sequence ids kept, at most */
#define MAX_JSON (16 << 20) /* bytes of a folder's JSON file read, at most (config.json's) */
#define FFFD "\xEF\xBF\xBD" /* U+FFFD, what transformers' decode makes of bytes not UTF-8 */
#define USAGE                                                                                  \
    "usage: generate CHECKPOINT|FOLDER [--prompt TEXT] [--tokens N] [--temperature T] "         \
    "[--top-k K] [--seed S] [--threads N] [--precision {fp32,bf16,int8}] "                     \
    "[--kv-cache {fp32,bf16}]\n"
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
    int32_t kv_cache; /* the KV cache's pytfm_precision: FP32 or BF16 (half its bytes) */
} options;

/* argv into *o: 0, or the exit status of a bad command line (-1: --help was printed) */
static int parse(int argc, char **argv, options *o) {
    static const struct { const char *name, *range; long long max; } flags[] = {
        {"--prompt", "", 0}, {"--temperature", "", 0}, {"--precision", "", 0},
        {"--kv-cache", "", 0},
        {"--tokens", "must be >= 0", INT64_MAX},
        {"--top-k", "must be >= 0 (0: no top-k cut)", INT64_MAX},
        {"--seed", "must be an integer in [0, 4294967295]", 4294967295LL}, /* sample.py's */
        {"--threads", "must be an integer in [0, 2147483647] (0: the default)", INT32_MAX}};
    *o = (options){NULL, "def ", -1.0, 100, 40, 0, 0, PYTFM_PRECISION_FP32,
                   PYTFM_PRECISION_FP32};
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i], *eq = strchr(arg, '='), *value, *end;
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) return puts(USAGE HELP), -1;
        if (strncmp(arg, "--", 2) != 0 || !strcmp(arg, "--")) {
            if (o->checkpoint) return fail("unrecognized argument: %s", arg);
            o->checkpoint = arg;
            continue;
        }
        int f = 0, len = eq ? (int)(eq - arg) : (int)strlen(arg); /* --flag VALUE, --flag=VALUE */
        while (f < 8 && (strlen(flags[f].name) != (size_t)len || strncmp(arg, flags[f].name, len)))
            f++;
        if (f == 8) return fail("unrecognized argument: %.*s", len, arg);
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
            if (strcmp(value, "fp32") && strcmp(value, "bf16") && strcmp(value, "int8"))
                return fail("argument --precision: invalid choice: '%s' (choose from 'fp32', "
                            "'bf16', 'int8')", value);
            o->precision = !strcmp(value, "bf16")   ? PYTFM_PRECISION_BF16
                           : !strcmp(value, "int8") ? PYTFM_PRECISION_INT8
                                                    : PYTFM_PRECISION_FP32;
        } else if (f == 3) {
            if (strcmp(value, "fp32") && strcmp(value, "bf16"))
                return fail("argument --kv-cache: invalid choice: '%s' (choose from 'fp32', "
                            "'bf16')", value);
            o->kv_cache = !strcmp(value, "bf16") ? PYTFM_PRECISION_BF16 : PYTFM_PRECISION_FP32;
        } else if (!integer && f < 6) {
            return fail("argument %s: invalid int value: '%s'", flags[f].name, value);
        } else if (!integer || v < 0 || v > flags[f].max) {
            return fail("%s %s, got %s", flags[f].name, flags[f].range, value);
        } else {
            *(f == 4 ? &o->tokens : f == 5 ? &o->top_k : f == 6 ? &o->seed : &o->threads) = v;
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

/* The top-level field "eos_token_id" of the JSON object s (strict JSON, NUL-terminated): its
 * id, or its list's ids (the first MAX_EOS), into eos[0..*n); absent or null: none. */
static void json_eos(const char *s, int64_t *eos, int *n) {
    int depth = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '{' || *p == '[') depth++;
        else if (*p == '}' || *p == ']') depth--;
        if (*p != '"') continue;
        const char *key = ++p; /* a string: a key where a colon follows */
        while (*p != '"') p += *p == '\\' ? 2 : 1;
        const char *q = p + 1 + strspn(p + 1, " \t\r\n");
        if (depth != 1 || *q != ':' || p - key != 12 || strncmp(key, "eos_token_id", 12))
            continue;
        q += 1 + strspn(q + 1, " \t\r\n[");
        for (char *end; *q >= '0' && *q <= '9'; q += strspn(q, " \t\r\n,")) {
            const long long id = strtoll(q, &end, 10);
            if (*n < MAX_EOS) eos[(*n)++] = id;
            q = end;
        }
        return;
    }
}

/* A Llama-family folder's end-of-sequence ids, where transformers' generate() finds them:
 * generation_config.json's eos_token_id when the folder has that file, else config.json's.
 * 0, or the exit status of a file that cannot be read or is not JSON (the problem reported). */
static int read_eos(const char *folder, int64_t *eos, int *n) {
    const char *name = is_file(folder, "generation_config.json") ? "generation_config.json"
                                                                 : "config.json";
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    FILE *f = fopen(path, "rb");
    char *text = malloc(MAX_JSON + 1);
    const size_t size = f && text ? fread(text, 1, MAX_JSON + 1, f) : 0;
    const int bad = !f || !text || ferror(f) || size > MAX_JSON;
    if (f) fclose(f);
    if (!bad) text[size] = '\0';
    const int code = bad ? fail("checkpoint: %s: %s", path, !text ? "out of memory" : !f ?
                                strerror(errno) : size > MAX_JSON ? "larger than 16 MiB" :
                                "cannot be read")
                   : pytfm_json_check(text, (int64_t)size) != PYTFM_STATUS_OK
                   ? fail("checkpoint: %s: %s", path, pytfm_last_error()) : 0;
    *n = 0;
    if (!code) json_eos(text, eos, n);
    free(text);
    return code;
}

static double seconds(void) {
    struct timespec ts;
    return clock_gettime(CLOCK_MONOTONIC, &ts), (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* How the new tokens become stdout's bytes. BYTES: a checkpoint's bytes, a GPT-2 folder's
 * tokens' bytes. LOSSY: a byte-level Llama-family tokenizer's, as transformers' decode gives
 * them (each maximal part of a character that is not UTF-8 one U+FFFD). DECODER: tokens that
 * are text (byte fallback), through the file's decoder, as transformers' decode gives them. */
enum { BYTES_OUT, LOSSY_OUT, DECODER_OUT };
typedef struct writer {
    const pytfm_tokenizer *tok;
    int mode;
    int open;                 /* BYTES: the bytes still to come of the last character */
    unsigned char part[4];    /* LOSSY: the bytes of a character not yet whole */
    int len;
    int32_t *ids;             /* DECODER: the prompt's ids, then the new ones: n of them */
    int64_t n, from, done;    /* ids[from, done) decoded: chars characters, written or the */
    int64_t chars;            /* prompt's; ids[done, n) held back (a run of byte tokens) */
    char *text;               /* decode's bytes, cap of them */
    int64_t cap;
} writer;

/* The bytes of a character led by c (0: c leads none), and whether c is byte i (1..3) of one
 * led by lead: UTF-8 as Unicode's table 3-7 has it (no overlong forms, surrogates or code
 * points past U+10FFFF), the rule of transformers' (Rust's from_utf8_lossy) U+FFFD. */
static int utf8_len(unsigned c) {
    return c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
}
static int utf8_next(unsigned lead, int i, unsigned c) {
    const unsigned lo = i == 1 && lead == 0xE0 ? 0xA0 : i == 1 && lead == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = i == 1 && lead == 0xED ? 0x9F : i == 1 && lead == 0xF4 ? 0x8F : 0xBF;
    return c >= lo && c <= hi;
}

static void put_lossy(writer *w, unsigned char c) {
    if (w->len && !utf8_next(w->part[0], w->len, c)) w->len = 0, fputs(FFFD, stdout);
    if (!w->len && !utf8_len(c)) {
        fputs(FFFD, stdout);
        return;
    }
    w->part[w->len++] = c;
    if (w->len == utf8_len(w->part[0])) fwrite(w->part, 1, (size_t)w->len, stdout), w->len = 0;
}

/* 1 when token id is a byte token of byte fallback, <0xNN> */
static int byte_token(const pytfm_tokenizer *tok, int32_t id) {
    const char *name;
    int64_t size;
    return pytfm_tokenizer_token(tok, id, &name, &size) == PYTFM_STATUS_OK && size == 6 &&
           !strncmp(name, "<0x", 3) && name[5] == '>';
}

/* The decoder's text of w->ids[a, b) into w->text: its size (*st set) */
static int64_t decode(writer *w, int64_t a, int64_t b, pytfm_status *st) {
    int64_t size = 0;
    *st = pytfm_tokenizer_decode(w->tok, w->ids + a, b - a, NULL, 0, &size);
    if (*st == PYTFM_STATUS_OK && size > w->cap) {
        char *text = realloc(w->text, (size_t)size);
        *st = text ? PYTFM_STATUS_OK : PYTFM_STATUS_OUT_OF_MEMORY;
        if (text) w->text = text, w->cap = size;
    }
    if (*st == PYTFM_STATUS_OK)
        *st = pytfm_tokenizer_decode(w->tok, w->ids + a, b - a, w->text, w->cap, &size);
    return size;
}

static int64_t characters(const char *s, int64_t size) {
    int64_t n = 0;
    for (int64_t i = 0; i < size; i++) n += (s[i] & 0xC0) != 0x80;
    return n;
}

/* DECODER: write what the decode of all ids has past the characters already accounted for.
 * transformers' decode of a sequence is its decode up to a cut, then more, for any cut after a
 * token that is no byte token: the decoders' rules that look at a token's place (Strip of the
 * leading space, Metaspace's first '▁') touch only the first token, and ByteFallback makes a
 * run of byte tokens one string, or U+FFFD for each of its bytes when they are not UTF-8 (so
 * a trailing run is held back until a token ends it, or the text does: final). So a call
 * decodes only the window ids[from, k), from the cut before the last one: its first token
 * takes the first-token rules in both decodes, and the characters of ids[from, done) are
 * already written (or the prompt's). */
static pytfm_status put_decoded(writer *w, int final) {
    int64_t k = w->n, size, i = 0, c = 0;
    while (!final && k > w->done && byte_token(w->tok, w->ids[k - 1])) k--;
    if (k == w->done) return PYTFM_STATUS_OK;
    pytfm_status st;
    size = decode(w, w->from, k, &st);
    if (st != PYTFM_STATUS_OK) return st;
    while (i < size && !((w->text[i] & 0xC0) != 0x80 && c++ == w->chars)) i++;
    if (fwrite(w->text + i, 1, (size_t)(size - i), stdout)) fflush(stdout);
    if (!byte_token(w->tok, w->ids[w->done - 1])) { /* no run of byte tokens crosses it */
        w->from = w->done;
        size = decode(w, w->from, k, &st);
    }
    w->chars = st == PYTFM_STATUS_OK ? characters(w->text, size) : 0;
    w->done = k;
    return st;
}

/* Write token id to stdout as w's mode has it (id -1: the end of the text), flushed where a
 * character ends: a reader of the pipe never sees half a character, and a write that fails
 * sets ferror(stdout) at once. */
static pytfm_status put_token(writer *w, int64_t id) {
    const char byte = (char)id, *bytes = &byte;
    int64_t size = id >= 0;
    if (w->mode == DECODER_OUT) {
        if (id >= 0) w->ids[w->n++] = (int32_t)id;
        return put_decoded(w, id < 0);
    }
    pytfm_status st = w->tok && id >= 0 ? pytfm_tokenizer_token(w->tok, (int32_t)id, &bytes,
                                                                &size) : PYTFM_STATUS_OK;
    for (int64_t i = 0; st == PYTFM_STATUS_OK && i < size; i++) {
        const unsigned char c = (unsigned char)bytes[i];
        if (w->mode == LOSSY_OUT) put_lossy(w, c);
        w->open = (c & 0xC0) == 0x80 ? w->open - 1 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0;
    }
    if (w->mode == LOSSY_OUT && id < 0 && w->len) fputs(FFFD, stdout), w->len = 0;
    if (w->mode == BYTES_OUT && st == PYTFM_STATUS_OK) fwrite(bytes, 1, (size_t)size, stdout);
    if (st == PYTFM_STATUS_OK && (w->mode == LOSSY_OUT ? w->len == 0 : w->open <= 0))
        fflush(stdout);
    return st;
}

/* The prompt fed at once, then up to n[1] tokens drawn among the first n_tok ids (the model's
 * vocab, or its tokenizer's fewer), each fed back and written as it comes, until a write fails
 * or one of eos[0..n_eos) is drawn (not written; *stop := it): n[1] := the tokens made, that
 * one counted; t[0], t[1] the seconds of the model's work on the prompt and on them */
static pytfm_status generate(pytfm_session *session, const int64_t *prompt, int64_t n[2],
                             const options *o, int64_t vocab, int64_t n_tok, writer *w,
                             const int64_t *eos, int n_eos, int64_t *stop, double t[2]) {
    float *logits = malloc((size_t)vocab * sizeof *logits);
    pytfm_rng rng;
    pytfm_rng_seed(&rng, (uint64_t)o->seed);
    double t0 = seconds();
    pytfm_status st = logits ? pytfm_session_feed(session, logits, prompt, n[0])
                             : PYTFM_STATUS_OUT_OF_MEMORY;
    t[0] = seconds() - t0;
    const int64_t want = n[1];
    int end = 0;
    for (n[1] = 0; n[1] < want && !end && st == PYTFM_STATUS_OK && !ferror(stdout); n[1]++) {
        int64_t token;
        t0 = seconds();
        st = pytfm_sample(&token, logits, n_tok, o->temperature, o->top_k < n_tok ? o->top_k : 0,
                          &rng);
        for (int i = 0; i < n_eos; i++) end |= st == PYTFM_STATUS_OK && token == eos[i];
        if (end) *stop = token;
        if (st == PYTFM_STATUS_OK && n[1] + 1 < want && !end)
            st = pytfm_session_feed(session, logits, &token, 1);
        t[1] += seconds() - t0;
        if (st == PYTFM_STATUS_OK && !end) st = put_token(w, token);
    }
    if (st == PYTFM_STATUS_OK) st = put_token(w, -1);
    free(logits);
    return st;
}

/* the prompt's token ids into *ids (allocated, *n of them): its bytes, or the tokenizer's
 * encoding as transformers' has it (special tokens in it matched: <|endoftext|> as sample.py
 * has it; the post-processor's template, such as a BOS, around it) */
static pytfm_status encode(const char *prompt, const pytfm_tokenizer *tok, int64_t **ids,
                           int64_t *n) {
    const int64_t len = (int64_t)strlen(prompt);
    const int32_t flags = PYTFM_TOKENIZER_SPECIAL | PYTFM_TOKENIZER_TEMPLATE;
    pytfm_status st = tok ? pytfm_tokenizer_encode(tok, prompt, len, flags, NULL, 0, n)
                          : PYTFM_STATUS_OK;
    if (!tok) *n = len;
    int32_t *ids32 = malloc((size_t)(*n ? *n : 1) * sizeof *ids32);
    *ids = malloc((size_t)(*n ? *n : 1) * sizeof **ids);
    if (st == PYTFM_STATUS_OK && (!ids32 || !*ids)) st = PYTFM_STATUS_OUT_OF_MEMORY;
    if (st == PYTFM_STATUS_OK && tok)
        st = pytfm_tokenizer_encode(tok, prompt, len, flags, ids32, *n, n);
    for (int64_t i = 0; st == PYTFM_STATUS_OK && i < *n; i++)
        (*ids)[i] = tok ? ids32[i] : (unsigned char)prompt[i];
    free(ids32);
    return st;
}

/* the model's checks against the tokenizer and the prompt, then the text: the exit status */
static int run(const options *o, pytfm_model *model, const pytfm_tokenizer *tok,
               const int64_t *eos, int n_eos) {
    pytfm_model_config cfg;
    pytfm_model_get_config(model, &cfg);
    int64_t n[2] = {0, 0}, n_tok = tok ? pytfm_tokenizer_vocab_size(tok) : BYTES; /* n: T0, new */
    if (tok ? n_tok > cfg.vocab : cfg.vocab != BYTES) /* more ids than the model: nothing */
        return fail("checkpoint: its model has a vocabulary of %lld tokens, %s %lld %s",
                    (long long)cfg.vocab, tok ? "fewer than the" : "not the", (long long)n_tok,
                    tok ? "of its tokenizer" : "bytes generate encodes text into");
    int64_t *prompt = NULL;
    pytfm_status st = encode(o->prompt, tok, &prompt, &n[0]);
    if (st != PYTFM_STATUS_OK) {
        free(prompt);
        return fprintf(stderr, "generate: error: cannot encode the prompt: %s\n",
                       st == PYTFM_STATUS_OUT_OF_MEMORY ? "out of memory" : pytfm_last_error()),
               1;
    }
    if (n[0] > cfg.max_seq) {
        free(prompt);
        return fail("--prompt is %lld %s, longer than the model's context of %lld",
                    (long long)n[0], tok ? "tokens" : "bytes", (long long)cfg.max_seq);
    }
    n[1] = o->tokens < cfg.max_seq - n[0] ? o->tokens : cfg.max_seq - n[0];
    if (n[1] < o->tokens)
        fprintf(stderr, "note: --tokens %lld cut to %lld: the model's context is %lld and the "
                "prompt takes %lld\n", o->tokens, (long long)n[1], (long long)cfg.max_seq,
                (long long)n[0]);
    const int llama = tok && cfg.arch == PYTFM_ARCH_LLAMA;
    writer w = {0};
    w.tok = tok;
    w.mode = !llama ? BYTES_OUT : pytfm_tokenizer_text_tokens(tok) ? DECODER_OUT : LOSSY_OUT;
    if (w.mode == DECODER_OUT) { /* the prompt's ids decoded: its characters are not written */
        w.ids = malloc((size_t)(n[0] + n[1]) * sizeof *w.ids);
        for (int64_t i = 0; w.ids && i < n[0]; i++) w.ids[i] = (int32_t)prompt[i];
        st = w.ids ? PYTFM_STATUS_OK : PYTFM_STATUS_OUT_OF_MEMORY;
        w.n = w.done = n[0];
        const int64_t size = st == PYTFM_STATUS_OK ? decode(&w, 0, n[0], &st) : 0;
        w.chars = st == PYTFM_STATUS_OK ? characters(w.text, size) : 0;
    }
    pytfm_session *session = NULL; /* it checks that n[0] + n[1] positions fit in memory */
    double t[2] = {0.0, 0.0};
    int64_t stop = -1;
    if (st == PYTFM_STATUS_OK) st = pytfm_model_set_precision(model, (int32_t)o->precision);
    if (st == PYTFM_STATUS_OK)
        st = pytfm_session_open_ex(&session, model, n[0] + n[1], o->kv_cache);
    if (st == PYTFM_STATUS_OK && fputs(o->prompt, stdout) >= 0)
        st = generate(session, prompt, n, o, cfg.vocab, n_tok, &w, eos, n_eos, &stop, t);
    pytfm_session_close(session);
    free(prompt);
    free(w.ids);
    free(w.text);
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
            o->precision == PYTFM_PRECISION_FP32   ? "fp32"
            : o->precision == PYTFM_PRECISION_INT8 ? "int8 (int8 blocks of 32, fp16 scales)"
            : pytfm_get_bf16_isa() == PYTFM_ISA_AVX512_BF16 ? "bf16 (AVX512-BF16: vdpbf16ps)"
                                                            : "bf16 (rounded inputs)");
    if (stop >= 0)
        fprintf(stderr, "generate: stopped at the end-of-sequence token %lld\n", (long long)stop);
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
    if (o.temperature < 0) o.temperature = tok ? 0.0 : 0.8; /* a folder: greedy, as transformers */
    pytfm_model_config cfg;
    int64_t eos[MAX_EOS];
    int n_eos = 0, code = !model;
    if (model) pytfm_model_get_config(model, &cfg);
    if (model && tok && cfg.arch == PYTFM_ARCH_LLAMA) code = read_eos(o.checkpoint, eos, &n_eos);
    code = code ? 2 : run(&o, model, tok, eos, n_eos);
    pytfm_model_close(model);
    pytfm_tokenizer_close(tok);
    return code;
}
