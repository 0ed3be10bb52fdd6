/*
 * open_checkpoints.c — every file named on the command line read by the checkpoint reader
 * (csrc/model/safetensors.c) both ways: pytfm__weights_read_file on the path and
 * pytfm__weights_read_memory on an exactly-sized heap copy of its bytes (so that ASan sees a
 * read one byte past the end), then pytfm_model_open and pytfm_model_open_memory on top. Built
 * with the library sources under ASan and UBSan by tests/c_api/test_c_checkpoint.py, on the hostile
 * files it writes and on tests/c_api/fuzz/regressions/.
 *
 *   open_checkpoints FILE...   one line per file, "ok" or "rejected: <message>"; then
 *                              "<N> files: <A> accepted, <R> rejected, every way agreed"
 *   open_checkpoints --serve   reads paths from stdin, one a line, and answers each with one
 *                              line: "json-ok " or "json-bad " (is the whole file one JSON
 *                              text, by json.c's check?), then "ok <vocab> <d_model> <n_layer>
 * <n_head> <max_seq> <pos> <tie> <n_params> <step> <the parameters' bytes in hex>" or "rejected
 * <status> <message>" (for the agreement tests)
 *
 * Exit status 1 when the ways disagree (status, config or parameters), when a failed read
 * leaves parameters behind, when a rejection's message does not start with its source, or when
 * a status is not one the reader may return; 2 for a usage error.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/checkpoint.h"
#include "model/json.h"
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

static int same_config(const pytfm_model_config *a, const pytfm_model_config *b) {
    return a->vocab == b->vocab && a->d_model == b->d_model && a->n_layer == b->n_layer &&
           a->n_head == b->n_head && a->max_seq == b->max_seq && a->pos == b->pos &&
           a->tie_embeddings == b->tie_embeddings && a->n_params == b->n_params &&
           a->step == b->step;
}

static int starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Read path every way. 0: they agree (*status and *w from the file reader, w->params owned
 * by the caller); 1: they do not (said on stderr). */
static int read_every_way(const char *path, pytfm_status *status, pytfm__weights *w, char *message,
                          size_t cap) {
    unsigned char *data = NULL;
    size_t size = 0;
    *status = pytfm__weights_read_file(w, path);
    snprintf(message, cap, "%s", pytfm_last_error());
    if (!slurp(path, &data, &size)) { /* missing, unreadable, a folder: the reader says so */
        free(data);
        if (*status == PYTFM_STATUS_INVALID_ARGUMENT && !w->params && starts_with(message, path))
            return 0;
        fprintf(stderr, "%s: cannot read the file, yet the reader says %d: %s\n", path, *status,
                message);
        return 1;
    }
    int bad = 0;
    pytfm__weights m;
    const pytfm_status ms = pytfm__weights_read_memory(&m, data, size, "<memory>");
    const char *mmessage = pytfm_last_error();
    if (ms != *status) {
        fprintf(stderr, "%s: the file reader says %d (%s), the memory reader %d (%s)\n", path,
                *status, message, ms, mmessage);
        bad = 1;
    } else if (ms != PYTFM_STATUS_OK) {
        if (w->params || m.params) {
            fprintf(stderr, "%s: a failed read left parameters behind\n", path);
            bad = 1;
        }
        if (!starts_with(message, path) || !starts_with(mmessage, "<memory>: ")) {
            fprintf(stderr, "%s: a message does not name its source: '%s' / '%s'\n", path, message,
                    mmessage);
            bad = 1;
        }
        if (ms != PYTFM_STATUS_INVALID_ARGUMENT && ms != PYTFM_STATUS_OUT_OF_MEMORY) {
            fprintf(stderr, "%s: unexpected status %d: %s\n", path, ms, mmessage);
            bad = 1;
        }
    } else {
        const size_t bytes = (size_t)w->config.n_params * sizeof(float);
        if (!same_config(&w->config, &m.config) || memcmp(w->params, m.params, bytes) != 0) {
            fprintf(stderr, "%s: the file and memory readers read different models\n", path);
            bad = 1;
        }
        if ((uintptr_t)w->params % 64 || (uintptr_t)m.params % 64) {
            fprintf(stderr, "%s: parameters not 64-byte aligned\n", path);
            bad = 1;
        }
    }
    free(m.params);

    /* the public API, on top of the reader: the same verdict */
    for (int way = 0; way < 2; way++) {
        pytfm_model *model = NULL;
        const pytfm_status ps = way ? pytfm_model_open_memory(&model, data, size, PYTFM_DEVICE_CPU)
                                    : pytfm_model_open(&model, path, PYTFM_DEVICE_CPU);
        pytfm_model_config c;
        if (ps != *status) {
            fprintf(stderr, "%s: %s says %d, the reader %d: %s\n", path,
                    way ? "pytfm_model_open_memory" : "pytfm_model_open", ps, *status,
                    pytfm_last_error());
            bad = 1;
        } else if (ps == PYTFM_STATUS_OK && (pytfm_model_get_config(model, &c) != PYTFM_STATUS_OK ||
                                             !same_config(&c, &w->config))) {
            fprintf(stderr, "%s: the model's config is not the reader's\n", path);
            bad = 1;
        } else if (ps != PYTFM_STATUS_OK && model) {
            fprintf(stderr, "%s: a failed open left a model behind\n", path);
            bad = 1;
        }
        pytfm_model_close(model);
    }
    free(data);
    return bad;
}

/* "json-ok" when the whole file is one JSON text by json.c's check, else "json-bad" */
static const char *json_verdict(const char *path) {
    unsigned char *data = NULL;
    size_t size = 0;
    pytfm__json_error err;
    const int ok = slurp(path, &data, &size) &&
                   pytfm__json_check((const char *)data, size, &err) == PYTFM_STATUS_OK;
    free(data);
    return ok ? "json-ok" : "json-bad";
}

static int serve(void) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int bad = 0;
    while ((len = getline(&line, &cap, stdin)) > 0) {
        if (line[len - 1] == '\n') line[len - 1] = 0;
        pytfm_status status;
        pytfm__weights w;
        char message[512];
        bad |= read_every_way(line, &status, &w, message, sizeof message);
        printf("%s ", json_verdict(line));
        if (status != PYTFM_STATUS_OK) {
            for (char *p = message; *p; p++) /* one line (a path may hold any byte) */
                if ((unsigned char)*p < 0x20) *p = ' ';
            printf("rejected %d %s\n", status, message);
        } else {
            const pytfm_model_config *c = &w.config;
            printf("ok %lld %lld %lld %lld %lld %d %d %lld %lld ", (long long)c->vocab,
                   (long long)c->d_model, (long long)c->n_layer, (long long)c->n_head,
                   (long long)c->max_seq, c->pos, c->tie_embeddings, (long long)c->n_params,
                   (long long)c->step);
            const unsigned char *b = (const unsigned char *)w.params;
            for (size_t i = 0; i < (size_t)c->n_params * sizeof(float); i++) printf("%02x", b[i]);
            printf("\n");
        }
        free(w.params);
        fflush(stdout);
    }
    free(line);
    return bad;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--serve") == 0) return serve();
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE... | --serve\n", argv[0]);
        return 2;
    }
    int bad = 0, accepted = 0;
    for (int i = 1; i < argc; i++) {
        pytfm_status status;
        pytfm__weights w;
        char message[512];
        bad |= read_every_way(argv[i], &status, &w, message, sizeof message);
        accepted += status == PYTFM_STATUS_OK;
        if (status == PYTFM_STATUS_OK)
            printf("%s: ok\n", argv[i]);
        else
            printf("rejected: %s\n", message);
        free(w.params);
    }
    if (bad) return 1;
    printf("%d files: %d accepted, %d rejected, every way agreed\n", argc - 1, accepted,
           argc - 1 - accepted);
    return 0;
}
