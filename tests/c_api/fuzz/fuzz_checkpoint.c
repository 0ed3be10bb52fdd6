/*
 * fuzz_checkpoint.c — libFuzzer target of the checkpoint reader (csrc/model/safetensors.c, json.c).
 *
 * Each input is read as a whole checkpoint by pytfm__weights_read_memory, and, when the input
 * is one strict JSON text by json.c's check, walked by json.c's readers and, if an object,
 * read again as the header of a checkpoint (length field and zero data made to fit). Beyond what
 * ASan and UBSan see, the reader's promises are checked and a broken one traps: a status is OK,
 * INVALID_ARGUMENT or OUT_OF_MEMORY; a failure leaves no parameters and a message naming the
 * source; a success gives n_params floats, 64-byte aligned, of a config pytfm.nn would accept.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Icsrc/include -Icsrc \
 *       tests/c_api/fuzz/fuzz_checkpoint.c csrc/[a-z]*.c -lm -o fuzz_checkpoint
 *   ./fuzz_checkpoint -dict=tests/c_api/fuzz/checkpoint.dict corpus/ tests/c_api/fuzz/seeds/
 * (tests/c_api/test_c_checkpoint.py builds and runs it for a bounded time; tests/c_api/fuzz/README.md.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/checkpoint.h"
#include "model/json.h"
#include "pytfm.h"

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

/* every value of a checked text read back: kinds, strings, numbers, counts */
static void walk(pytfm__json v, int depth, char *scratch) {
    EXPECT(depth <= PYTFM__JSON_MAX_DEPTH && v.n > 0);
    switch (pytfm__json_kind_of(v)) {
    case PYTFM__JSON_OBJECT:
    case PYTFM__JSON_ARRAY: {
        pytfm__json_iter it = pytfm__json_iter_of(v);
        pytfm__json key, value;
        size_t count = 0;
        while (pytfm__json_next(&it, &key, &value)) {
            if (key.p) walk(key, depth + 1, scratch);
            walk(value, depth + 1, scratch);
            count++;
        }
        EXPECT(count == pytfm__json_count(v));
        EXPECT(v.p[v.n - 1] == (v.p[0] == '{' ? '}' : ']'));
        break;
    }
    case PYTFM__JSON_STRING: {
        int lone = 0;
        const size_t len = pytfm__json_string_utf8(v, scratch, &lone);
        EXPECT(len + 2 <= v.n && lone == pytfm__json_string_lone(v));
        if (!lone) {
            const char *why;
            EXPECT(pytfm__utf8_check(scratch, len, &why) == len);
        }
        break;
    }
    case PYTFM__JSON_NUMBER: {
        const pytfm__json_int i = pytfm__json_integer(v);
        EXPECT(!i.fits || i.integer);
        break;
    }
    default: break;
    }
}

/* Read one checkpoint and hold the reader to its promises. */
static void read_checkpoint(const uint8_t *data, size_t size) {
    pytfm__weights w;
    const pytfm_status st = pytfm__weights_read_memory(&w, data, size, "<fuzz>");
    if (st == PYTFM_STATUS_OK) {
        const pytfm_model_config *c = &w.config;
        EXPECT(w.params && (uintptr_t)w.params % 64 == 0);
        EXPECT(c->vocab >= 1 && c->d_model >= 1 && c->n_layer >= 1 && c->n_head >= 1);
        EXPECT(c->max_seq >= 1 && c->d_model % c->n_head == 0 && c->step >= 0);
        EXPECT(c->pos >= PYTFM_POS_ROPE && c->pos <= PYTFM_POS_NONE);
        EXPECT((size_t)c->n_params <= size / sizeof(float));
        volatile float sink = 0;
        for (int64_t i = 0; i < c->n_params; i++) sink += w.params[i]; /* all of it is there */
        (void)sink;
        free(w.params);
    } else {
        EXPECT(st == PYTFM_STATUS_INVALID_ARGUMENT || st == PYTFM_STATUS_OUT_OF_MEMORY);
        EXPECT(w.params == NULL);
        EXPECT(strncmp(pytfm_last_error(), "<fuzz>: ", 8) == 0);
    }
}

/* The largest end of a data_offsets pair among the entries of a header object (at most
 * 1 MiB, else 0): the data a checkpoint with this header holds. */
static size_t data_size(pytfm__json header) {
    size_t most = 0;
    pytfm__json_iter it = pytfm__json_iter_of(header);
    pytfm__json name, info, key, value, begin, end;
    while (pytfm__json_next(&it, &name, &info)) {
        pytfm__json_iter fields = pytfm__json_iter_of(info);
        while (pytfm__json_next(&fields, &key, &value)) {
            if (!pytfm__json_string_is(key, "data_offsets")) continue;
            pytfm__json_iter pair = pytfm__json_iter_of(value);
            if (!pytfm__json_next(&pair, NULL, &begin) || !pytfm__json_next(&pair, NULL, &end))
                continue;
            const pytfm__json_int e = pytfm__json_integer(end);
            if (e.fits && e.value >= 0 && e.value <= (1 << 20) && (size_t)e.value > most)
                most = (size_t)e.value;
        }
    }
    return most;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    read_checkpoint(data, size);

    /* the input as one JSON text */
    pytfm__json_error err;
    const char *text = (const char *)data;
    if (pytfm__json_check(text, size, &err) == PYTFM_STATUS_OK) {
        const pytfm__json root = pytfm__json_root(text, size);
        EXPECT(root.p >= text && root.p + root.n <= text + size);
        char *scratch = malloc(size ? size : 1);
        if (scratch) walk(root, 0, scratch);
        free(scratch);
        /* a JSON object is also read as the header of a checkpoint whose length field and
         * data (zeros, as many as its offsets reach) fit it: byte noise rarely keeps them
         * consistent, so this is how mutations of a header reach the pytfm checks */
        if (pytfm__json_kind_of(root) == PYTFM__JSON_OBJECT) {
            const size_t body = data_size(root);
            uint8_t *file = calloc(8 + size + body, 1);
            if (file) {
                for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)size >> (8 * i));
                memcpy(file + 8, data, size);
                read_checkpoint(file, 8 + size + body);
            }
            free(file);
        }
    } else {
        EXPECT(err.offset <= size && err.what[0]);
    }
    return 0;
}
