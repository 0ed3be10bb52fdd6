/*
 * open_checkpoints.c — every file named on the command line read every way the checkpoint
 * reader (csrc/model/safetensors.c, checkpoint.c) offers: pytfm_safetensors_open on the path,
 * pytfm_safetensors_open_fd on a descriptor opened as Python opens it (no source: messages
 * name nothing), pytfm_safetensors_open_memory on an exactly-sized heap copy of its bytes (so
 * that ASan sees a read one byte past the end); on each handle every metadata member and
 * tensor walked and read into an exactly-sized buffer, then pytfm_checkpoint_check; then
 * pytfm_model_open and pytfm_model_open_memory on top. Built with the library sources under
 * ASan and UBSan by tests/c_api/test_c_checkpoint.py, on the hostile files it writes and on
 * tests/c_api/fuzz/regressions/.
 *
 *   open_checkpoints FILE...   one line per file, "<path>: ok" or "rejected: <message>"; then
 *                              "<N> files: <A> accepted, <R> rejected, every way agreed"
 *
 * Exit status 1 when the ways disagree (status, message after its source, what was read, the
 * config), when a failure leaves a handle or a model behind, when a message does not start
 * with its source, when a status is not one the reader may return, or when what a handle
 * reports breaks the format's rules (shape, bytes, offsets); 2 for a usage error.
 */
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pytfm.h"

/* the whole file, in a buffer of exactly its size (NULL and 0 for an empty file) */
static int slurp(const char *path, unsigned char **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    *data = NULL;
    *size = 0;
    if (!f) return 0;
    unsigned char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        unsigned char *grown = realloc(*data, *size + got);
        if (!grown) {
            fclose(f);
            return 0;
        }
        *data = grown;
        memcpy(*data + *size, chunk, got);
        *size += got;
    }
    const int ok = !ferror(f);
    fclose(f);
    return ok;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3u;
    return h;
}

/* What one way read: the verdict, the message after its source, a hash of everything read. */
typedef struct verdict {
    pytfm_status status;
    char message[2048]; /* as the library's last error */
    uint64_t hash;
    pytfm_checkpoint_info info;
} verdict;

static int bad = 0;

#define FAULT(...)                                                                                 \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        bad = 1;                                                                                   \
    } while (0)

/* the failure's message with its source cut off (and checked to be there) */
static void record_failure(verdict *v, pytfm_status status, const char *source, const char *way,
                           const char *path) {
    const char *message = pytfm_last_error();
    const size_t n = source ? strlen(source) : 0;
    v->status = status;
    if (source && (strncmp(message, source, n) != 0 || strncmp(message + n, ": ", 2) != 0)) {
        FAULT("%s (%s): the message does not name its source: %s", path, way, message);
        snprintf(v->message, sizeof v->message, "%s", message);
        return;
    }
    snprintf(v->message, sizeof v->message, "%s", source ? message + n + 2 : message);
    if (status != PYTFM_STATUS_INVALID_ARGUMENT && status != PYTFM_STATUS_OUT_OF_MEMORY)
        FAULT("%s (%s): unexpected status %d: %s", path, way, status, message);
}

/* every metadata member and tensor of st, each tensor read; its rules checked */
static pytfm_status walk(const pytfm_safetensors *st, verdict *v, const char *path) {
    int64_t count = 0;
    pytfm_metadata_item item;
    pytfm_safetensors_metadata_count(st, &count);
    for (int64_t i = 0; i < count; i++) {
        if (pytfm_safetensors_metadata(st, i, &item) != PYTFM_STATUS_OK)
            FAULT("%s: metadata", path);
        v->hash = fnv(v->hash, item.key, (size_t)item.key_len + 1);
        v->hash = fnv(v->hash, item.value, (size_t)item.value_len + 1);
        const char *value = NULL;
        int64_t len = -1;
        pytfm_safetensors_metadata_get(st, item.key, &value, &len);
        if (strlen(item.key) == (size_t)item.key_len &&
            (value != item.value || len != item.value_len))
            FAULT("%s: metadata_get does not find member %lld", path, (long long)i);
    }
    pytfm_safetensors_tensor_count(st, &count);
    pytfm_tensor_info info;
    for (int64_t i = 0; i < count; i++) {
        if (pytfm_safetensors_tensor(st, i, &info) != PYTFM_STATUS_OK) FAULT("%s: tensor", path);
        int64_t bytes = info.dtype == PYTFM_DTYPE_F32 ? 4 : 8, empty = 0;
        for (int d = 0; d < info.ndim; d++) {
            empty |= info.shape[d] == 0;
            if (info.shape[d] && bytes <= INT64_MAX / info.shape[d]) bytes *= info.shape[d];
        }
        if (info.ndim < 0 || info.ndim > PYTFM_SAFETENSORS_MAX_NDIM ||
            info.nbytes != (empty ? 0 : bytes) || info.nbytes != info.end - info.begin ||
            info.begin < 0 || info.file_offset < 8 + info.begin)
            FAULT("%s: tensor %lld breaks the format's rules", path, (long long)i);
        int64_t found = -2;
        pytfm_safetensors_find(st, info.name, &found);
        if (strlen(info.name) == (size_t)info.name_len && found != i)
            FAULT("%s: find does not find tensor %lld", path, (long long)i);
        void *data = malloc(info.nbytes ? (size_t)info.nbytes : 1);
        if (!data) return PYTFM_STATUS_OUT_OF_MEMORY;
        const pytfm_status status = pytfm_safetensors_read(st, i, data, info.nbytes);
        if (status != PYTFM_STATUS_OK) {
            free(data);
            return status;
        }
        v->hash = fnv(v->hash, info.name, (size_t)info.name_len + 1);
        v->hash = fnv(v->hash, data, (size_t)info.nbytes);
        free(data);
    }
    return PYTFM_STATUS_OK;
}

/* way 0: the path, 1: a descriptor, 2: memory */
static void read_one_way(int way, const char *path, const unsigned char *data, size_t size,
                         verdict *v) {
    static const char *const ways[] = {"pytfm_safetensors_open", "pytfm_safetensors_open_fd",
                                       "pytfm_safetensors_open_memory"};
    const char *source = way == 0 ? path : way == 1 ? NULL : "<memory>";
    pytfm_safetensors *st = (pytfm_safetensors *)&bad; /* must be overwritten */
    pytfm_status status = PYTFM_STATUS_OK;
    int fd = -1;
    memset(v, 0, sizeof *v);
    v->hash = 0xcbf29ce484222325u;
    if (way == 0) {
        status = pytfm_safetensors_open(&st, path);
    } else if (way == 1) {
        fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) {
            v->status = PYTFM_STATUS_INVALID_ARGUMENT; /* as the path's open says */
            snprintf(v->message, sizeof v->message, "cannot open");
            return;
        }
        status = pytfm_safetensors_open_fd(&st, fd, NULL);
    } else {
        status = pytfm_safetensors_open_memory(&st, data, (int64_t)size, "<memory>");
    }
    if (status != PYTFM_STATUS_OK) {
        if (st) FAULT("%s (%s): a failed open left a handle behind", path, ways[way]);
        record_failure(v, status, source, ways[way], path);
    } else {
        status = walk(st, v, path);
        if (status == PYTFM_STATUS_OK) status = pytfm_checkpoint_check(st, &v->info);
        if (status != PYTFM_STATUS_OK) record_failure(v, status, source, ways[way], path);
        pytfm_safetensors_close(st);
    }
    if (fd >= 0) close(fd);
}

static int same_config(const pytfm_model_config *a, const pytfm_model_config *b) {
    return a->vocab == b->vocab && a->d_model == b->d_model && a->n_layer == b->n_layer &&
           a->n_head == b->n_head && a->max_seq == b->max_seq && a->pos == b->pos &&
           a->tie_embeddings == b->tie_embeddings && a->n_params == b->n_params &&
           a->step == b->step;
}

/* Read path every way: -> the path's verdict, the others compared with it. */
static void read_every_way(const char *path, verdict *v) {
    unsigned char *data = NULL;
    size_t size = 0;
    read_one_way(0, path, NULL, 0, v);
    if (!slurp(path, &data, &size)) { /* missing, unreadable, a folder: the reader says so */
        free(data);
        if (v->status != PYTFM_STATUS_INVALID_ARGUMENT)
            FAULT("%s: cannot read the file, yet the reader says %d", path, v->status);
        return;
    }
    for (int way = 1; way < 3; way++) {
        verdict w;
        read_one_way(way, path, data, size, &w);
        if (w.status != v->status || strcmp(w.message, v->message) != 0 || w.hash != v->hash ||
            (w.status == PYTFM_STATUS_OK &&
             (!same_config(&w.info.config, &v->info.config) || w.info.optim_t != v->info.optim_t)))
            FAULT("%s: way %d says %d (%s), the path %d (%s)", path, way, w.status, w.message,
                  v->status, v->message);
    }

    /* the public model API, on top of the reader: the same verdict */
    for (int way = 0; way < 2; way++) {
        pytfm_model *model = (pytfm_model *)&bad;
        const pytfm_status status = way ? pytfm_model_open_memory(&model, data, size, 0)
                                        : pytfm_model_open(&model, path, PYTFM_DEVICE_CPU);
        const char *source = way ? "<memory>" : path;
        const char *message = pytfm_last_error();
        pytfm_model_config c;
        if (status != v->status) {
            FAULT("%s: the model API (%d) says %d, the reader %d: %s", path, way, status, v->status,
                  message);
        } else if (status == PYTFM_STATUS_OK) {
            if (pytfm_model_get_config(model, &c) != PYTFM_STATUS_OK ||
                !same_config(&c, &v->info.config))
                FAULT("%s: the model's config is not the reader's", path);
            pytfm_model_close(model);
        } else {
            const size_t n = strlen(source);
            if (model) FAULT("%s: a failed open left a model behind", path);
            if (strncmp(message, source, n) != 0 || strcmp(message + n + 2, v->message) != 0)
                FAULT("%s: the model API (%d) says '%s', the reader '%s'", path, way, message,
                      v->message);
        }
    }
    free(data);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE...\n", argv[0]);
        return 2;
    }
    int accepted = 0;
    for (int i = 1; i < argc; i++) {
        verdict v;
        read_every_way(argv[i], &v);
        accepted += v.status == PYTFM_STATUS_OK;
        if (v.status == PYTFM_STATUS_OK) {
            printf("%s: ok\n", argv[i]);
        } else {
            for (char *p = v.message; *p; p++) /* one line (a path may hold any byte) */
                if ((unsigned char)*p < 0x20) *p = ' ';
            printf("rejected: %s\n", v.message);
        }
    }
    if (bad) return 1;
    printf("%d files: %d accepted, %d rejected, every way agreed\n", argc - 1, accepted,
           argc - 1 - accepted);
    return 0;
}
