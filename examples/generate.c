/*
 * generate.c — generate text in C, through libpytfm's model API and nothing else: from a
 * checkpoint written by examples/train_tiny.py (the same model as examples/sample.py), or from
 * a Hugging Face GPT-2 folder (config.json, model.safetensors, and its tokenizer: vocab.json +
 * merges.txt, or tokenizer.json), with no conversion step.
 *
 *   cc -std=c11 -O2 examples/generate.c $(pkg-config --cflags --libs pytfm) -o generate
 *   ./generate out/model.safetensors --prompt "def " --tokens 100
 *   ./generate gpt2-folder --prompt "Hello, my name is" --tokens 50
 *
 * A checkpoint's model reads bytes: the prompt's bytes are its token ids (a vocabulary of 256).
 * A folder's prompt is encoded by GPT-2's BPE in C (pytfm_tokenizer_encode; <|endoftext|> in it
 * is the special token, as sample.py has it), fed in one call, then each new token is decoded
 * with the KV cache (pytfm_session_feed of one token) and its bytes written as it comes: a
 * UTF-8 character that spans tokens is held back until its last byte is there, so the text
 * goes out whole characters at a time (the bytes of the tokens, in order, whatever they are).
 * stdout gets the prompt and the generated text, then a newline; stderr the prompt's and the
 * decoding's tokens/s, separately. The flags and their defaults are sample.py's (--precision
 * too), plus --threads; the random numbers are the library's documented generator (pytfm_rng),
 * so a seed gives the same text on every machine, but not the text sample.py gives for it
 * (NumPy's generator differs); --temperature 0 (greedy) gives exactly sample.py's, in either
 * --precision (fp32, or bf16: products of BF16-rounded inputs, the weights read from a BF16
 * copy; pytfm_model_set_precision), and on a GPT-2 folder transformers' greedy continuation,
 * which is a folder's default (sample.py's too), as it is transformers'.
 * --temperature takes what Python's float() takes, as sample.py does (underscores between
 * digits, Unicode digits and spaces, "inf" and "nan"; no hexadecimal), and refuses what
 * sample.py refuses. A bad flag, checkpoint or folder (one without a tokenizer, a prompt longer
 * than the context) stops it with its usage and one line naming the problem, exit status 2; a
 * failure while generating, or stdout closed before the text is written (a pipe whose reader
 * left), status 1 and a message.
 */
#define _POSIX_C_SOURCE 200809L /* stat, clock_gettime */

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "pytfm.h"

#define SEED_MAX 4294967295u /* 2^32 − 1, as sample.py and train_tiny.py */
#define BYTES 256            /* one token per byte */

static const char *usage_line =
    "usage: generate CHECKPOINT|FOLDER [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] "
    "[--seed S] [--threads N] [--precision {fp32,bf16}]";

static void usage(FILE *f) {
    fprintf(f, "%s\n", usage_line);
}

static void help(void) {
    usage(stdout);
    printf("\nSample text from a checkpoint written by train_tiny.py, or from a Hugging Face "
           "GPT-2 folder (in C).\n\n"
           "  CHECKPOINT         a model.safetensors written by train_tiny.py\n"
           "  FOLDER             a GPT-2 folder: config.json, model.safetensors (or its shards),\n"
           "                     vocab.json + merges.txt or tokenizer.json\n"
           "  --prompt TEXT      text to continue, at least one byte (default \"def \")\n"
           "  --tokens N         tokens to generate, >= 0 (cut to what the model's context "
           "leaves; default 100)\n"
           "  --temperature T    finite, >= 0; 0: greedy (default 0.8; 0 on a GPT-2 folder,\n"
           "                     as transformers' generate has it)\n"
           "  --top-k K          sample among the K likeliest; 0: all (default 40)\n"
           "  --seed S           0 .. %u (default 0)\n"
           "  --threads N        threads of the kernels; 0: the library's default (default 0)\n"
           "  --precision P      of the products: fp32, or bf16 (BF16-rounded inputs, float32 "
           "sums; default fp32)\n",
           SEED_MAX);
}

/* the usage and "generate: error: <message>" on stderr; exit status 2, as argparse */
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    usage(stderr);
    fputs("generate: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

/* text as a whole integer in [lo, hi]: 1, or 0 when it is not one */
static int parse_int(const char *text, long long lo, long long hi, long long *value) {
    char *end;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE || v < lo || v > hi) return 0;
    *value = v;
    return 1;
}

/* ---- --temperature as Python's float() reads a str (sample.py: argparse's type=float) ---- */

/* The zero of each run of ten decimal digits (Unicode's Nd) in Unicode 14.0, Python 3.11's:
 * float() reads each as its digit. Then the code points above ASCII that float() takes for
 * spaces (str.isspace). */
static const uint32_t unicode_zeros[] = {
    0x30,    0x660,   0x6F0,   0x7C0,   0x966,   0x9E6,   0xA66,   0xAE6,   0xB66,   0xBE6,
    0xC66,   0xCE6,   0xD66,   0xDE6,   0xE50,   0xED0,   0xF20,   0x1040,  0x1090,  0x17E0,
    0x1810,  0x1946,  0x19D0,  0x1A80,  0x1A90,  0x1B50,  0x1BB0,  0x1C40,  0x1C50,  0xA620,
    0xA8D0,  0xA900,  0xA9D0,  0xA9F0,  0xAA50,  0xABF0,  0xFF10,  0x104A0, 0x10D30, 0x11066,
    0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0,
    0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2,
    0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0};
static const uint32_t unicode_spaces[] = {0x85,   0xA0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003,
                                          0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A,
                                          0x2028, 0x2029, 0x202F, 0x205F, 0x3000};

/* the code point of the UTF-8 sequence at *s, *s moved past it; -1 for bytes that are not
 * UTF-8 (Python gets them as lone surrogates: neither digit nor space) */
static long next_code_point(const unsigned char **s) {
    const unsigned char *p = *s, lead = p[0];
    const int n = lead < 0x80 ? 1 : lead < 0xC2 ? 0 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3
                : lead < 0xF5 ? 4 : 0; /* the sequence's length from its first byte */
    if (n == 0) return -1;
    long cp = n == 1 ? lead : lead & (0x3F >> (n - 1));
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    static const long least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return -1;
    *s = p + n;
    return cp;
}

/* the value 0-9 of a decimal digit, ASCII or not; -1 for any other code point */
static int unicode_digit(long cp) {
    for (size_t i = 0; i < sizeof unicode_zeros / sizeof *unicode_zeros; i++)
        if (cp >= (long)unicode_zeros[i] && cp < (long)unicode_zeros[i] + 10)
            return (int)(cp - (long)unicode_zeros[i]);
    return -1;
}

/* cp as float() sees it: its ASCII self below 127, ' ' for a space, '0'-'9' for a digit;
 * 0 for anything else (which float() refuses) */
static char python_ascii(long cp) {
    if (cp >= 0 && cp < 127) return (char)cp;
    for (size_t i = 0; i < sizeof unicode_spaces / sizeof *unicode_spaces; i++)
        if ((long)unicode_spaces[i] == cp) return ' ';
    const int d = unicode_digit(cp);
    return d < 0 ? 0 : (char)('0' + d);
}

/* Whether argparse takes the word for an option, not for the value of the flag before it
 * (sample.py's flags then fail with "expected one argument"): it starts with '-', is not "-"
 * alone, holds no space, and is not a negative number as argparse sees one (-5, -.5, -1.25;
 * its \d takes any decimal digit, its $ a final newline). */
static int looks_like_option(const char *word) {
    if (word[0] != '-' || word[1] == '\0' || strchr(word, ' ')) return 0;
    const unsigned char *s = (const unsigned char *)word + 1;
    int before = 0, after = 0, point = 0;
    for (long cp; *s && !(s[0] == '\n' && s[1] == '\0');) {
        if ((cp = next_code_point(&s)) == '.' && !point) point = 1;
        else if (unicode_digit(cp) >= 0) *(point ? &after : &before) += 1;
        else return 1;
    }
    return point ? after == 0 : before == 0;
}

static int digit(char c) { return c >= '0' && c <= '9'; }

/* [+-]? digits [. digits?] | [+-]? . digits, then [eE] [+-]? digits: what Python's strtod
 * takes, with no spaces around (no hexadecimal, no "nan(...)") */
static int decimal_syntax(const char *s) {
    s += *s == '+' || *s == '-';
    int digits = 0;
    for (; digit(*s); s++) digits++;
    if (*s == '.')
        for (s++; digit(*s); s++) digits++;
    if (!digits) return 0;
    if (*s == 'e' || *s == 'E') {
        s++;
        s += *s == '+' || *s == '-';
        if (!digit(*s)) return 0;
        while (digit(*s)) s++;
    }
    return *s == '\0';
}

/* "inf", "infinity" or "nan" in any case, signed or not: 1 with *value, else 0 */
static int special_value(const char *s, double *value) {
    const double sign = *s == '-' ? -1.0 : 1.0;
    s += *s == '+' || *s == '-';
    char lower[9] = {0};
    for (size_t i = 0; s[i]; i++) {
        if (i == sizeof lower - 1) return 0;
        lower[i] = (char)tolower((unsigned char)s[i]);
    }
    if (!strcmp(lower, "inf") || !strcmp(lower, "infinity")) *value = sign * INFINITY;
    else if (!strcmp(lower, "nan")) *value = NAN;
    else return 0;
    return 1;
}

/* text as Python's float(text): 1 with *value, or 0 where float() raises ValueError. Its steps:
 * each code point to ASCII (python_ascii); underscores dropped where each sits between two
 * digits, refused elsewhere; ASCII spaces (" \t\n\v\f\r") stripped at both ends; then
 * inf / nan, or a decimal number, whose overflow is ±inf and underflow 0, as Python's. */
static int parse_python_float(const char *text, double *value) {
    char *ascii = malloc(strlen(text) + 1);
    if (!ascii) return 0;
    size_t n = 0;
    char prev = 0;
    int ok = 1;
    for (const unsigned char *s = (const unsigned char *)text; *s && ok;) {
        const char c = python_ascii(next_code_point(&s));
        if (c == 0 || (c == '_' && !digit(prev)) || (prev == '_' && !digit(c))) ok = 0;
        if (c != '_') ascii[n++] = c;
        prev = c;
    }
    ascii[n] = '\0';
    ok = ok && prev != '_';
    char *start = ascii, *end = ascii + n;
    while (start < end && strchr(" \t\n\v\f\r", *start)) start++;
    while (end > start && strchr(" \t\n\v\f\r", end[-1])) end--;
    *end = '\0';
    if (ok && !special_value(start, value)) {
        ok = decimal_syntax(start);
        if (ok) *value = strtod(start, NULL); /* correctly rounded; ERANGE gives ±inf or 0 */
    }
    free(ascii);
    return ok;
}

/* x as Python's repr(x) writes it (sample.py's messages show it): the shortest digits that
 * read back as x, positional when the decimal exponent is in [-4, 16), else d.ddde±XX */
static void python_repr(double x, char *out, size_t size) {
    if (isnan(x) || isinf(x)) {
        snprintf(out, size, "%s", isnan(x) ? "nan" : x < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int precision = 0; precision <= 16; precision++) {
        snprintf(e, sizeof e, "%.*e", precision, x);
        if (strtod(e, NULL) == x) break;
    }
    char digits[20], text[48];
    int n = 0, at = 0;
    const char *p = e + (e[0] == '-');
    for (; *p != 'e'; p++)
        if (digit(*p)) digits[n++] = *p;
    const int exp10 = atoi(p + 1);
    if (e[0] == '-') text[at++] = '-';
    if (exp10 < -4 || exp10 >= 16) {
        text[at++] = digits[0];
        if (n > 1) text[at++] = '.';
        for (int i = 1; i < n; i++) text[at++] = digits[i];
        snprintf(text + at, sizeof text - (size_t)at, "e%c%02d", exp10 < 0 ? '-' : '+',
                 abs(exp10));
    } else { /* exp10 + 1 digits before the point (zeros where there are none), one at least */
        const int point = exp10 + 1;
        if (point <= 0) {
            text[at++] = '0';
            text[at++] = '.';
            for (int i = 0; i < -point; i++) text[at++] = '0';
            for (int i = 0; i < n; i++) text[at++] = digits[i];
        } else {
            for (int i = 0; i < point; i++) text[at++] = i < n ? digits[i] : '0';
            text[at++] = '.';
            if (point >= n) text[at++] = '0';
            for (int i = point; i < n; i++) text[at++] = digits[i];
        }
        text[at] = '\0';
    }
    snprintf(out, size, "%s", text);
}

typedef struct options {
    const char *checkpoint, *prompt;
    long long tokens, top_k, seed, threads;
    double temperature;
    int32_t precision; /* a pytfm_precision */
} options;

/* argv into *o; 0, or the exit status of a bad command line (-1: --help was printed) */
static int parse(int argc, char **argv, options *o) {
    // temperature -1: not given; the model decides (default_temperature)
    *o = (options){NULL, "def ", 100, 40, 0, 0, -1.0, PYTFM_PRECISION_FP32};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            help();
            return -1;
        }
        if (strncmp(arg, "--", 2) != 0 || !strcmp(arg, "--")) {
            if (o->checkpoint) return fail("unrecognized argument: %s", arg);
            o->checkpoint = arg;
            continue;
        }
        // --flag VALUE or --flag=VALUE
        static const char *const flags[] = {"--prompt", "--tokens",  "--temperature", "--top-k",
                                            "--seed",   "--threads", "--precision"};
        const char *eq = strchr(arg, '='), *value = NULL;
        const size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        int flag = -1;
        for (int f = 0; f < 7; f++)
            if (strlen(flags[f]) == len && !strncmp(arg, flags[f], len)) flag = f;
        if (flag < 0) return fail("unrecognized argument: %.*s", (int)len, arg);
        if (eq)
            value = eq + 1;
        else if (i + 1 < argc && !looks_like_option(argv[i + 1]))
            value = argv[++i];
        else
            return fail("argument %s: expected one argument", flags[flag]);
        long long v = 0;
        switch (flag) {
        case 0: o->prompt = value; break;
        case 1:
            if (!parse_int(value, LLONG_MIN, LLONG_MAX, &v))
                return fail("argument --tokens: invalid int value: '%s'", value);
            if (v < 0) return fail("--tokens must be >= 0, got %lld", v);
            o->tokens = v;
            break;
        case 2: {
            double t;
            if (!parse_python_float(value, &t))
                return fail("argument --temperature: invalid float value: '%s'", value);
            if (!(t >= 0.0 && t < INFINITY)) {
                char shown[40];
                python_repr(t, shown, sizeof shown);
                return fail("--temperature must be finite and >= 0 (0: greedy), got %s", shown);
            }
            o->temperature = t;
            break;
        }
        case 3:
            if (!parse_int(value, LLONG_MIN, LLONG_MAX, &v))
                return fail("argument --top-k: invalid int value: '%s'", value);
            if (v < 0) return fail("--top-k must be >= 0 (0: no top-k cut), got %lld", v);
            o->top_k = v;
            break;
        case 4:
            if (!parse_int(value, 0, SEED_MAX, &v))
                return fail("--seed must be an integer in [0, %u], got '%s'", SEED_MAX, value);
            o->seed = v;
            break;
        case 6:
            if (strcmp(value, "fp32") && strcmp(value, "bf16"))
                return fail("argument --precision: invalid choice: '%s' (choose from 'fp32', "
                            "'bf16')",
                            value);
            o->precision = strcmp(value, "bf16") ? PYTFM_PRECISION_FP32 : PYTFM_PRECISION_BF16;
            break;
        default:
            if (!parse_int(value, 0, INT32_MAX, &v))
                return fail("--threads must be an integer in [0, %d] (0: the default), got '%s'",
                            (int)INT32_MAX, value);
            o->threads = v;
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

/* the tokenizer of the GPT-2 folder at path (vocab.json + merges.txt, else tokenizer.json), or
 * NULL with the problem reported (status 2) */
static pytfm_tokenizer *load_tokenizer(const char *path) {
    pytfm_tokenizer *tok = NULL;
    if (pytfm_tokenizer_open_folder(path, &tok) != PYTFM_STATUS_OK)
        fail("checkpoint: %s", pytfm_last_error());
    return tok;
}

/* --temperature when none is given: 0.8 for a checkpoint (sample.py's default); greedy for a
 * GPT-2 folder, as transformers' generate() decodes when the model's generation config does
 * not ask for sampling (GPT-2's does not) */
static double default_temperature(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 0.0 : 0.8;
}

/* the model at path: a checkpoint file, or a GPT-2 folder (config.json, its weights and its
 * tokenizer: *tok, else NULL); NULL with the problem reported (status 2) */
static pytfm_model *load(const char *path, pytfm_tokenizer **tok) {
    struct stat st;
    *tok = NULL;
    if (stat(path, &st) != 0) {
        fail("checkpoint: there is no file %s", path);
        return NULL;
    }
    if (S_ISDIR(st.st_mode) && !is_file(path, "config.json")) {
        char inside[4096];
        snprintf(inside, sizeof inside, "%s/model.safetensors", path);
        const int hint = is_file(path, "model.safetensors");
        fail("checkpoint: %s is a folder%s%s%s", path, hint ? " (did you mean " : "",
             hint ? inside : "", hint ? "?)" : "");
        return NULL;
    }
    if (S_ISDIR(st.st_mode) && !(*tok = load_tokenizer(path))) return NULL;
    pytfm_model *model = NULL;
    if (pytfm_model_open(&model, path, PYTFM_DEVICE_CPU) != PYTFM_STATUS_OK) {
        fail("checkpoint: %s", pytfm_last_error());
        pytfm_tokenizer_close(*tok);
        *tok = NULL;
        return NULL;
    }
    return model;
}

/* "fp32", or "bf16 (<the BF16 products' instruction set>)" */
static const char *precision_name(int32_t precision) {
    if (precision == PYTFM_PRECISION_FP32) return "fp32";
    switch (pytfm_get_bf16_isa()) {
    case PYTFM_ISA_AVX512_BF16: return "bf16 (AVX512-BF16: vdpbf16ps)";
    case PYTFM_ISA_AVX512: return "bf16 (rounded inputs, AVX-512 FP32 kernels)";
    case PYTFM_ISA_AVX2: return "bf16 (rounded inputs, AVX2 FP32 kernels)";
    default: return "bf16 (rounded inputs, plain loops)";
    }
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the text, streamed ----------------------------------------------------------------- */

/* Bytes on their way to stdout: each token's bytes are written as it comes, but for the end
 * of a UTF-8 character that the next token completes (GPT-2's tokens are bytes, and one
 * character may span several): so a reader of the pipe never sees half a character at a
 * flush. What is held at the end is written as it is. */
typedef struct stream {
    char *buf;
    size_t n, cap;
} stream;

/* the bytes at the end of buf[0..n) that begin a UTF-8 character they do not complete */
static size_t incomplete_tail(const unsigned char *buf, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const unsigned char c = buf[n - k];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

/* append bytes[0..n) and write out all but an incomplete character (all when last); 0, or -1
 * when memory ran out */
static int stream_put(stream *s, const char *bytes, size_t n, int last) {
    if (s->n + n > s->cap) {
        const size_t cap = 2 * (s->n + n) + 16;
        char *grown = realloc(s->buf, cap);
        if (!grown) return -1;
        s->buf = grown, s->cap = cap;
    }
    if (n) memcpy(s->buf + s->n, bytes, n);
    s->n += n;
    const size_t keep = last ? 0 : incomplete_tail((const unsigned char *)s->buf, s->n);
    fwrite(s->buf, 1, s->n - keep, stdout);
    memmove(s->buf, s->buf + s->n - keep, keep);
    s->n = keep;
    fflush(stdout);
    return 0;
}

/* the bytes of token id: the tokenizer's, or (no tokenizer) the byte id itself */
static pytfm_status token_bytes(const pytfm_tokenizer *tok, int64_t id, const char **bytes,
                                int64_t *size) {
    static char all[BYTES];
    if (tok) return pytfm_tokenizer_token(tok, (int32_t)id, bytes, size);
    for (int i = 0; i < BYTES; i++) all[i] = (char)i;
    *bytes = all + id, *size = 1;
    return PYTFM_STATUS_OK;
}

/* The prompt out[0, n_prompt) fed at once, then n_new tokens sampled, each fed back, its bytes
 * streamed to stdout as it comes: *t_prompt, *t_new the seconds of the model's work (the feeds
 * and the draws, not the writes). */
static pytfm_status generate(pytfm_session *session, int64_t *out, float *logits,
                             int64_t n_prompt, int64_t n_new, const options *o, int64_t vocab,
                             const pytfm_tokenizer *tok, stream *text, double *t_prompt,
                             double *t_new) {
    pytfm_rng rng;
    pytfm_rng_seed(&rng, (uint64_t)o->seed);
    const int64_t top_k = o->top_k < vocab ? o->top_k : 0;
    double t0 = seconds();
    pytfm_status st = pytfm_session_feed(session, logits, out, n_prompt);
    *t_prompt = seconds() - t0;
    *t_new = 0.0;
    for (int64_t i = 0; i < n_new && st == PYTFM_STATUS_OK; i++) {
        int64_t *token = out + n_prompt + i;
        t0 = seconds();
        st = pytfm_sample(token, logits, vocab, o->temperature, top_k, &rng);
        if (st == PYTFM_STATUS_OK && i + 1 < n_new)
            st = pytfm_session_feed(session, logits, token, 1);
        *t_new += seconds() - t0;
        const char *bytes;
        int64_t size;
        if (st == PYTFM_STATUS_OK) st = token_bytes(tok, *token, &bytes, &size);
        if (st == PYTFM_STATUS_OK && stream_put(text, bytes, (size_t)size, 0))
            st = PYTFM_STATUS_OUT_OF_MEMORY;
    }
    return st;
}

/* the prompt's token ids into *ids (malloc'd), *n of them: its bytes, or the tokenizer's
 * encoding (<|endoftext|> in it the special token, as sample.py has it); 0, or the exit
 * status of a prompt that cannot be */
static int encode_prompt(const char *prompt, const pytfm_tokenizer *tok, int64_t **ids,
                         int64_t *n) {
    const size_t len = strlen(prompt);
    int32_t *tmp = malloc((len ? len : 1) * sizeof *tmp);
    int64_t *out = malloc((len ? len : 1) * sizeof *out), count = (int64_t)len;
    pytfm_status st = tmp && out ? PYTFM_STATUS_OK : PYTFM_STATUS_OUT_OF_MEMORY;
    if (st == PYTFM_STATUS_OK && tok)
        st = pytfm_tokenizer_encode(tok, prompt, (int64_t)len, 1, tmp, (int64_t)len, &count);
    for (int64_t i = 0; st == PYTFM_STATUS_OK && i < count; i++)
        out[i] = tok ? tmp[i] : (unsigned char)prompt[i];
    free(tmp);
    if (st != PYTFM_STATUS_OK) {
        free(out);
        fprintf(stderr, "generate: error: cannot encode the prompt: %s\n",
                st == PYTFM_STATUS_OUT_OF_MEMORY && !tok ? "out of memory" : pytfm_last_error());
        return 1;
    }
    if (count == 0) { /* a byte-level BPE gives every byte a token: only for a tokenizer's bug */
        free(out);
        return fail("--prompt encodes to no tokens: generation continues at least one");
    }
    *ids = out, *n = count;
    return 0;
}

/* the checks of the model against the tokenizer and the prompt: 0, or the exit status */
static int check_fit(const pytfm_model_config *cfg, const pytfm_tokenizer *tok, int64_t n_prompt) {
    if (!tok && cfg->vocab != BYTES)
        return fail("checkpoint: its model has a vocabulary of %lld tokens, not the %d bytes "
                    "generate encodes text into",
                    (long long)cfg->vocab, BYTES);
    if (tok && pytfm_tokenizer_vocab_size(tok) > cfg->vocab)
        return fail("checkpoint: its tokenizer has %lld tokens, more than the model's "
                    "vocabulary of %lld",
                    (long long)pytfm_tokenizer_vocab_size(tok), (long long)cfg->vocab);
    if (n_prompt > cfg->max_seq)
        return fail("--prompt is %lld %s, longer than the model's context of %lld",
                    (long long)n_prompt, tok ? "tokens" : "bytes", (long long)cfg->max_seq);
    return 0;
}

static void cleanup(int64_t *out, float *logits, int64_t *prompt, pytfm_session *session,
                    pytfm_model *model, pytfm_tokenizer *tok, stream *text) {
    free(out);
    free(logits);
    free(prompt);
    free(text->buf);
    pytfm_session_close(session);
    pytfm_model_close(model);
    pytfm_tokenizer_close(tok);
}

int main(int argc, char **argv) {
    /* a closed stdout (a pipe whose reader left) is then a write error, said below, instead
     * of SIGPIPE ending the program without a word */
    signal(SIGPIPE, SIG_IGN);
    options o;
    const int bad = parse(argc, argv, &o);
    if (bad) return bad < 0 ? 0 : bad;
    if (pytfm_set_num_threads((int32_t)o.threads) != PYTFM_STATUS_OK)
        return fail("--threads: %s", pytfm_last_error());
    pytfm_tokenizer *tok = NULL;
    pytfm_model *model = load(o.checkpoint, &tok);
    if (!model) return 2;
    if (o.temperature < 0) o.temperature = default_temperature(o.checkpoint);
    stream text = {NULL, 0, 0};
    int64_t *prompt = NULL, n_prompt = 0;
    if (pytfm_model_set_precision(model, o.precision) != PYTFM_STATUS_OK) {
        fprintf(stderr, "generate: error: %s\n", pytfm_last_error());
        cleanup(NULL, NULL, NULL, NULL, model, tok, &text);
        return 1;
    }
    pytfm_model_config cfg;
    pytfm_model_get_config(model, &cfg);
    int code = check_fit(&cfg, tok, 0);
    if (!code) code = encode_prompt(o.prompt, tok, &prompt, &n_prompt);
    if (!code) code = check_fit(&cfg, tok, n_prompt);
    if (code) {
        cleanup(NULL, NULL, prompt, NULL, model, tok, &text);
        return code;
    }
    int64_t n_new = o.tokens < cfg.max_seq - n_prompt ? o.tokens : cfg.max_seq - n_prompt;
    if (n_new < o.tokens)
        fprintf(stderr,
                "note: --tokens %lld cut to %lld: the model's context is %lld and the prompt "
                "takes %lld\n",
                o.tokens, (long long)n_new, (long long)cfg.max_seq, (long long)n_prompt);
    // the session first: it checks that its caches, n_prompt + n_new positions, fit in memory,
    // so the token buffer's size below cannot wrap (a context of 2^62 is a legal checkpoint)
    pytfm_session *session = NULL;
    pytfm_status st = pytfm_session_open(&session, model, n_prompt + n_new);
    if (st != PYTFM_STATUS_OK) {
        fprintf(stderr, "generate: error: %s\n", pytfm_last_error());
        cleanup(NULL, NULL, prompt, NULL, model, tok, &text);
        return 1;
    }
    const uint64_t n_out = (uint64_t)(n_prompt + n_new);
    int64_t *out = n_out <= SIZE_MAX / sizeof *out ? malloc((size_t)n_out * sizeof *out) : NULL;
    float *logits = malloc((size_t)cfg.vocab * sizeof *logits);
    if (!out || !logits) {
        fprintf(stderr, "generate: error: cannot allocate %llu tokens and their logits\n",
                (unsigned long long)n_out);
        cleanup(out, logits, prompt, session, model, tok, &text);
        return 1;
    }
    memcpy(out, prompt, (size_t)n_prompt * sizeof *out);
    double t_prompt = 0.0, t_new = 0.0;
    st = stream_put(&text, o.prompt, strlen(o.prompt), 0) ? PYTFM_STATUS_OUT_OF_MEMORY
                                                          : PYTFM_STATUS_OK;
    if (st == PYTFM_STATUS_OK)
        st = generate(session, out, logits, n_prompt, n_new, &o, cfg.vocab, tok, &text,
                      &t_prompt, &t_new);
    if (st == PYTFM_STATUS_OK) {
        stream_put(&text, "\n", 1, 1);
        if (fflush(stdout) != 0 || ferror(stdout)) { // a full disk, a closed pipe: say so
            fprintf(stderr, "generate: error: cannot write the text to stdout: %s\n",
                    strerror(errno));
            code = 1;
        }
        fprintf(stderr,
                "generate: prompt of %lld tokens in %.2f ms: %.0f tokens/s; %lld new tokens in "
                "%.2f ms: %.0f tokens/s, threads: %d, precision: %s\n",
                (long long)n_prompt, 1e3 * t_prompt,
                t_prompt > 0 ? (double)n_prompt / t_prompt : 0.0, (long long)n_new, 1e3 * t_new,
                t_new > 0 ? (double)n_new / t_new : 0.0, (int)pytfm_get_num_threads(),
                precision_name(o.precision));
    } else {
        fprintf(stderr, "generate: error: %s\n",
                st == PYTFM_STATUS_OUT_OF_MEMORY ? "out of memory" : pytfm_last_error());
        code = 1;
    }
    cleanup(out, logits, prompt, session, model, tok, &text);
    return code;
}
