/*
 * fuzz_checkpoint.c — libFuzzer target of the checkpoint reader (csrc/model/safetensors.c,
 * checkpoint.c, json.c).
 *
 * Each input is opened as a whole safetensors file from memory (pytfm_safetensors_open_memory):
 * every metadata member and tensor walked, every tensor read into an exactly-sized buffer,
 * then pytfm_checkpoint_check, then pytfm_model_open_memory, which must give the same verdict.
 * When the input is one strict JSON text by json.c's check (and pytfm_json_check, which must
 * agree), it is walked by json.c's readers and, if an object, read again as the header of a
 * checkpoint (length field and zero data made to fit). Beyond what ASan and UBSan see, the
 * reader's promises are checked and a broken one traps: a status is OK, INVALID_ARGUMENT or
 * OUT_OF_MEMORY; a failure leaves no handle or model and a message naming the source; a tensor
 * keeps the format's rules (its bytes its shape's, within the data); a checkpoint's config is
 * one pytfm.nn would accept, with n_params floats of parameters.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Icsrc/include -Icsrc \
 *       tests/c_api/fuzz/fuzz_checkpoint.c $(find csrc -name '*.c') -lm -o fuzz_checkpoint
 *   ./fuzz_checkpoint -dict=tests/c_api/fuzz/checkpoint.dict corpus/ tests/c_api/fuzz/seeds/
 * (tests/c_api/test_c_checkpoint.py builds and runs it for a bounded time; README.md here.)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/json.h"
#include "pytfm.h"

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

/* every value of a checked text read back: kinds, strings, numbers, counts */
static void walk(pytfm__json v, int depth, char *scratch) {
    EXPECT(depth <= PYTFM_JSON_MAX_DEPTH && v.n > 0);
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

static int named(const char *source) {
    return strncmp(pytfm_last_error(), source, strlen(source)) == 0 &&
           strncmp(pytfm_last_error() + strlen(source), ": ", 2) == 0;
}

/* every member and tensor of st read, each tensor held to the format's rules */
static pytfm_status walk_file(const pytfm_safetensors *st, size_t size) {
    int64_t count = 0;
    pytfm_metadata_item item;
    EXPECT(pytfm_safetensors_metadata_count(st, &count) == PYTFM_STATUS_OK);
    for (int64_t i = 0; i < count; i++) {
        EXPECT(pytfm_safetensors_metadata(st, i, &item) == PYTFM_STATUS_OK);
        EXPECT(item.key[item.key_len] == 0 && item.value[item.value_len] == 0);
    }
    EXPECT(pytfm_safetensors_tensor_count(st, &count) == PYTFM_STATUS_OK);
    pytfm_tensor_info info;
    for (int64_t i = 0; i < count; i++) {
        EXPECT(pytfm_safetensors_tensor(st, i, &info) == PYTFM_STATUS_OK);
        EXPECT(info.ndim >= 0 && info.ndim <= PYTFM_SAFETENSORS_MAX_NDIM);
        EXPECT(info.nbytes == info.end - info.begin && info.begin >= 0);
        EXPECT((uint64_t)info.file_offset + (uint64_t)info.nbytes <= size);
        int64_t index = -2;
        EXPECT(pytfm_safetensors_find(st, info.name, &index) == PYTFM_STATUS_OK);
        EXPECT(index == i || strlen(info.name) < (size_t)info.name_len);
        unsigned char *data = malloc(info.nbytes ? (size_t)info.nbytes : 1);
        if (!data) return PYTFM_STATUS_OUT_OF_MEMORY;
        EXPECT(pytfm_safetensors_read(st, i, data, info.nbytes) == PYTFM_STATUS_OK);
        free(data);
    }
    return PYTFM_STATUS_OK;
}

/* Read one checkpoint every way and hold the reader to its promises. */
static void read_checkpoint(const uint8_t *data, size_t size) {
    pytfm_safetensors *st = NULL;
    pytfm_status status = pytfm_safetensors_open_memory(&st, data, (int64_t)size, "<fuzz>");
    pytfm_checkpoint_info info;
    if (status == PYTFM_STATUS_OK) {
        EXPECT(st != NULL);
        status = walk_file(st, size);
        if (status == PYTFM_STATUS_OK) status = pytfm_checkpoint_check(st, &info);
        if (status != PYTFM_STATUS_OK) EXPECT(named("<fuzz>"));
        pytfm_safetensors_close(st);
    } else {
        EXPECT(st == NULL && named("<fuzz>"));
    }
    EXPECT(status == PYTFM_STATUS_OK || status == PYTFM_STATUS_INVALID_ARGUMENT ||
           status == PYTFM_STATUS_OUT_OF_MEMORY);
    char message[2048] = ""; /* as the library's last error */
    if (status != PYTFM_STATUS_OK) snprintf(message, sizeof message, "%s", pytfm_last_error() + 8);
    if (status == PYTFM_STATUS_OK) {
        const pytfm_model_config *c = &info.config;
        EXPECT(c->vocab >= 1 && c->d_model >= 1 && c->n_layer >= 1 && c->n_head >= 1);
        EXPECT(c->max_seq >= 1 && c->step >= 0); /* the Llama family's head_dim is its own: */
        EXPECT(c->arch == PYTFM_ARCH_LLAMA || c->d_model % c->n_head == 0);
        EXPECT(c->pos >= PYTFM_POS_ROPE && c->pos <= PYTFM_POS_LEARNED);
        EXPECT((size_t)c->n_params <= size / sizeof(float));
        EXPECT(info.has_optimizer || info.optim_t == 0);
    }
    /* the model API on the same bytes: the same verdict */
    pytfm_model *model = NULL;
    const pytfm_status opened = pytfm_model_open_memory(&model, data, size, PYTFM_DEVICE_CPU);
    EXPECT(opened == status || opened == PYTFM_STATUS_OUT_OF_MEMORY ||
           status == PYTFM_STATUS_OUT_OF_MEMORY);
    if (opened == PYTFM_STATUS_OK) {
        pytfm_model_config c;
        EXPECT(pytfm_model_get_config(model, &c) == PYTFM_STATUS_OK);
        EXPECT(c.n_params == info.config.n_params && c.step == info.config.step);
        pytfm_model_close(model);
    } else {
        EXPECT(model == NULL && named("<memory>"));
        EXPECT(opened != status || strcmp(pytfm_last_error() + 10, message) == 0);
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
    const pytfm_status json = pytfm__json_check(text, size, &err);
    const pytfm_status public = pytfm_json_check(text, (int64_t)size);
    EXPECT((json == PYTFM_STATUS_OK) == (public == PYTFM_STATUS_OK) ||
           json == PYTFM_STATUS_OUT_OF_MEMORY || public == PYTFM_STATUS_OUT_OF_MEMORY);
    if (json == PYTFM_STATUS_OK) {
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
