/*
 * fuzz_tokenizer.c — a libFuzzer target for the BPE tokenizer (csrc/model/bpe.c, through
 * pytfm_tokenizer.h). The first byte of an input chooses what the rest is:
 *   0: text, encoded (with and without the special token) by a tokenizer opened once: GPT-2's
 *      vocabulary when $PYTFM_FUZZ_VOCAB names a folder with encoder.json and vocab.bpe (or
 *      vocab.json and merges.txt), else
 *      a small built-in one; decode of encode must give the text back, every id must be in the
 *      vocabulary, a capacity one short must be refused with the count, and the count query
 *      must agree.
 *   1: a vocab.json and a merges.txt, split at the first NUL byte, opened from memory;
 *   2: a tokenizer.json, opened from memory.
 * An opened file's tokenizer then encodes the input and a fixed text, round trip checked, and
 * is closed. Besides ASan and UBSan (leaks included), the target traps on a broken promise: a
 * status other than OK, INVALID_ARGUMENT or OUT_OF_MEMORY from an opener, a handle left behind
 * by a failure, an empty message.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pytfm.h"

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "fuzz_tokenizer: %s failed at line %d (%s)\n", #cond, __LINE__,    \
                    pytfm_last_error());                                                       \
            __builtin_trap();                                                                  \
        }                                                                                      \
    } while (0)

static pytfm_tokenizer *fixed;

/* GPT-2's byte names: byte b -> code point */
static unsigned name_of(int b) {
    static unsigned name[256];
    static int ready;
    if (!ready) {
        int n = 0;
        for (int c = 0; c < 256; c++) {
            const int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
            name[c] = printable ? (unsigned)c : (unsigned)(256 + n++);
        }
        ready = 1;
    }
    return name[b];
}

static size_t put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* a vocabulary of the 256 bytes, " t", " th", "he", "in", "<|endoftext|>" and its merges */
static pytfm_tokenizer *small_tokenizer(void) {
    static char vocab[8192];
    size_t k = 0;
    vocab[k++] = '{';
    for (int b = 0; b < 256; b++) {
        char name[4];
        const size_t n = put_utf8(name, name_of(b));
        if (b == '"' || b == '\\') {
            k += (size_t)snprintf(vocab + k, sizeof vocab - k, "\"\\%c\": %d, ", b, b);
            continue;
        }
        vocab[k++] = '"';
        memcpy(vocab + k, name, n);
        k += n;
        k += (size_t)snprintf(vocab + k, sizeof vocab - k, "\": %d, ", b);
    }
    /* ids follow the bytes' order in the table above, not GPT-2's: fine for a fuzz target */
    k += (size_t)snprintf(vocab + k, sizeof vocab - k,
                          "\"\xc4\xa0t\": 256, \"\xc4\xa0th\": 257, \"he\": 258, \"in\": 259, "
                          "\"<|endoftext|>\": 260}");
    static const char merges[] = "#version: 0.2\n\xc4\xa0 t\n\xc4\xa0t h\nh e\ni n\n";
    pytfm_tokenizer *tok = NULL;
    CHECK(pytfm_tokenizer_open_memory(vocab, (int64_t)k, merges, (int64_t)strlen(merges), &tok) ==
          PYTFM_STATUS_OK);
    return tok;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("PYTFM_FUZZ_VOCAB");
    if (dir && *dir) {
        char v[4096], m[4096];
        snprintf(v, sizeof v, "%s/encoder.json", dir);
        snprintf(m, sizeof m, "%s/vocab.bpe", dir);
        if (pytfm_tokenizer_open(v, m, &fixed) != PYTFM_STATUS_OK) {
            snprintf(v, sizeof v, "%s/vocab.json", dir);
            snprintf(m, sizeof m, "%s/merges.txt", dir);
            CHECK(pytfm_tokenizer_open(v, m, &fixed) == PYTFM_STATUS_OK);
        }
    } else {
        fixed = small_tokenizer();
    }
    return 0;
}

/* encode text, check the round trip and the size contract */
static void round_trip(const pytfm_tokenizer *tok, const char *text, size_t n) {
    for (int special = 0; special < 2; special++) {
        int64_t count = -1;
        CHECK(pytfm_tokenizer_encode(tok, text, (int64_t)n, special, NULL, 0, &count) ==
              PYTFM_STATUS_OK);
        CHECK(count >= 0 && (size_t)count <= n);
        int32_t *ids = malloc(((size_t)count + 1) * sizeof *ids);
        CHECK(ids != NULL);
        int64_t again = -1;
        CHECK(pytfm_tokenizer_encode(tok, text, (int64_t)n, special, ids, count, &again) ==
              PYTFM_STATUS_OK);
        CHECK(again == count);
        const int64_t vocab = pytfm_tokenizer_vocab_size(tok);
        for (int64_t i = 0; i < count; i++) CHECK(ids[i] >= 0 && ids[i] < vocab);
        if (count > 0) {
            int64_t short_count = -1;
            CHECK(pytfm_tokenizer_encode(tok, text, (int64_t)n, special, ids, count - 1,
                                         &short_count) == PYTFM_STATUS_INVALID_ARGUMENT);
            CHECK(short_count == count);
        }
        int64_t size = -1;
        CHECK(pytfm_tokenizer_decode(tok, ids, count, NULL, 0, &size) == PYTFM_STATUS_OK);
        CHECK(size == (int64_t)n);
        char *back = malloc(n + 1);
        CHECK(back != NULL);
        CHECK(pytfm_tokenizer_decode(tok, ids, count, back, (int64_t)n, &size) ==
              PYTFM_STATUS_OK);
        CHECK(memcmp(back, text, n) == 0);
        free(back);
        free(ids);
    }
}

static void opened(pytfm_status status, pytfm_tokenizer *tok, const char *data, size_t n) {
    CHECK(status == PYTFM_STATUS_OK || status == PYTFM_STATUS_INVALID_ARGUMENT ||
          status == PYTFM_STATUS_OUT_OF_MEMORY);
    if (status != PYTFM_STATUS_OK) {
        CHECK(tok == NULL);
        CHECK(pytfm_last_error()[0] != '\0');
        return;
    }
    CHECK(tok != NULL && pytfm_tokenizer_vocab_size(tok) >= 256);
    static const char text[] = "Hello, world! It's 2026 <|endoftext|> \xe6\x97\xa5\xff  \n\n x";
    round_trip(tok, text, sizeof text - 1);
    round_trip(tok, data, n < 4096 ? n : 4096);
    pytfm_tokenizer_close(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const char *p = (const char *)data + 1;
    const size_t n = size - 1;
    pytfm_tokenizer *tok = NULL;
    switch (data[0] % 3) {
    case 0: round_trip(fixed, p, n); break;
    case 1: {
        const char *nul = memchr(p, 0, n);
        const size_t nv = nul ? (size_t)(nul - p) : n;
        const size_t nm = nul ? n - nv - 1 : 0;
        opened(pytfm_tokenizer_open_memory(p, (int64_t)nv, nul ? nul + 1 : "", (int64_t)nm,
                                           &tok), tok, p, n);
        break;
    }
    default: opened(pytfm_tokenizer_open_json_memory(p, (int64_t)n, &tok), tok, p, n);
    }
    return 0;
}
