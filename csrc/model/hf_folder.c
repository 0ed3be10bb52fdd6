/*
 * hf_folder.c — a Hugging Face model folder's files (hf_folder.h): the folder opened once and
 * each file relative to it, config.json and the index as strict JSON, the weight files checked
 * against the index, and the helpers both folder readers (gpt2.c, llama.c) use on config.json.
 */
#define _POSIX_C_SOURCE 200809L /* open flags, fstat, openat */

#include "hf_folder.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

#define BAD PYTFM__HF_BAD
#define NO_MEMORY PYTFM__HF_NO_MEMORY

enum { SHOW = PYTFM__SHOW };

const char PYTFM__HF_CONFIG[] = "config.json", PYTFM__HF_WEIGHTS[] = "model.safetensors",
           PYTFM__HF_INDEX[] = "model.safetensors.index.json";

/* one member of the index's weight_map: a tensor name and its file, unescaped */
typedef struct placed {
    const char *name, *file;
    size_t name_len, file_len;
} placed;

const char *pytfm__hf_show_name(const char *name, size_t len, char *buf) {
    pytfm__st_show_name(name, len, buf);
    buf[strlen(buf) - 1] = 0; /* its closing quote */
    return buf + 1;           /* past its opening one */
}

const char *pytfm__hf_show_shape(const pytfm_tensor_info *t, char *buf, size_t cap) {
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", d ? ", " : "",
                               (long long)t->shape[d]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

/* ---- reading a small file ------------------------------------------------------------------ */

/* Every file is opened relative to the folder, open as dir (openat), and named by its path
 * in messages: a folder saved as a whole (pytfm._atomic.Folder swaps a new one in) is read
 * from one version, never config.json from the old and the weights from the new. */
static const char *name_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int is_regular(int dir, const char *path) {
    struct stat s;
    return fstatat(dir, name_of(path), &s, 0) == 0 && S_ISREG(s.st_mode);
}

char *pytfm__hf_join(const char *folder, const char *name) {
    const size_t a = strlen(folder), b = strlen(name), slash = a && folder[a - 1] != '/';
    char *p = malloc(a + slash + b + 1);
    if (!p) return NULL;
    memcpy(p, folder, a);
    if (slash) p[a] = '/';
    memcpy(p + a + slash, name, b + 1);
    return p;
}

/* a system call on path failed: its message, errno kept */
static pytfm_status io_fail(const char *path, const char *what) {
    const int e = errno;
    char why[128] = "unknown error";
    strerror_r(e, why, sizeof why);
    const pytfm_status status = BAD(path, "%s: %s", what, why);
    errno = e;
    return status;
}

/* the file at path, at most PYTFM__HF_MAX_JSON bytes, strict JSON: -> *text (malloc'd), *size */
static pytfm_status read_json(int dir, const char *path, const char *what, char **text,
                              size_t *size) {
    *text = NULL;
    const int fd = openat(dir, name_of(path), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return io_fail(path, "cannot open");
    struct stat s;
    if (fstat(fd, &s) != 0) {
        const pytfm_status st = io_fail(path, "cannot stat");
        close(fd);
        return st;
    }
    if (!S_ISREG(s.st_mode)) {
        close(fd);
        errno = 0;
        return BAD(path, "not a regular file");
    }
    /* read one byte more than the size, to see a file that grows past the limit */
    const size_t cap =
        (s.st_size > PYTFM__HF_MAX_JSON ? PYTFM__HF_MAX_JSON : (size_t)s.st_size) + 1;
    char *buf = s.st_size > PYTFM__HF_MAX_JSON ? NULL : malloc(cap + 1);
    size_t got = 0;
    while (buf && got < cap) {
        const ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            const pytfm_status st = io_fail(path, "cannot read");
            free(buf);
            close(fd);
            return st;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    errno = 0;
    if (s.st_size > PYTFM__HF_MAX_JSON || got > PYTFM__HF_MAX_JSON) {
        free(buf);
        return BAD(path, "%s of more than 16,777,216 bytes", what);
    }
    if (!buf) return NO_MEMORY(path, "cannot allocate %zu bytes for %s", cap, what);
    buf[got] = 0;
    if (pytfm_json_check(buf, (int64_t)got) != PYTFM_STATUS_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", pytfm_last_error());
        free(buf);
        errno = 0;
        return BAD(path, "%s", why);
    }
    *text = buf, *size = got;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm__hf_read_config(int dir, const char *folder, const char *kind, char **text,
                                   size_t *size, char **path) {
    *text = NULL, *path = pytfm__hf_join(folder, PYTFM__HF_CONFIG);
    if (!*path) return NO_MEMORY(folder, "cannot allocate a path");
    if (!is_regular(dir, *path)) {
        const pytfm_status status = BAD(*path, "missing (a %s folder holds %s)", kind,
                                        PYTFM__HF_CONFIG);
        errno = 0;
        return status;
    }
    return read_json(dir, *path, "a config", text, size);
}

pytfm_status pytfm__hf_open_folder(const char *folder, const char *kind, int *dir) {
    *dir = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*dir < 0 && errno != ENOENT && errno != ENOTDIR) return io_fail(folder, "cannot open");
    if (*dir < 0) {
        errno = 0;
        return BAD(folder, "not a folder (a %s folder holds %s and %s)", kind, PYTFM__HF_CONFIG,
                   PYTFM__HF_WEIGHTS);
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_folder_arch(const char *folder, int32_t *arch) {
    PYTFM_CHECK(folder != NULL, "%s: folder must not be NULL", __func__);
    PYTFM_CHECK(arch != NULL, "%s: arch must not be NULL", __func__);
    *arch = PYTFM_ARCH_GPT;
    int dir;
    if (pytfm__hf_open_folder(folder, "GPT-2", &dir) != PYTFM_STATUS_OK) return PYTFM_STATUS_OK;
    char *text = NULL, *path = NULL;
    size_t size = 0;
    const pytfm_status read = pytfm__hf_read_config(dir, folder, "GPT-2", &text, &size, &path);
    close(dir);
    if (read == PYTFM_STATUS_OK) {
        const pytfm__json root = pytfm__json_root(text, size);
        const pytfm__json type = pytfm__json_kind_of(root) == PYTFM__JSON_OBJECT
                                     ? pytfm__hf_member(root, "model_type")
                                     : (pytfm__json){NULL, 0};
        if (type.p && !pytfm__json_string_is(type, "gpt2")) *arch = PYTFM_ARCH_LLAMA;
    }
    free(text), free(path);
    errno = 0;
    return PYTFM_STATUS_OK; // a folder that cannot be read is GPT-2's reader's to refuse
}

/* ---- config.json's values ------------------------------------------------------------------ */

/* PretrainedConfig's fields that no model's forward pass reads: ignored by both readers */
static const char *const COMMON_IGNORED[] = {
    "initializer_range", "use_cache", "task_specific_params", /* training, inference */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "diversity_penalty", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", /* generation defaults */
    "finetuning_task", "id2label", "label2id", "num_labels", "problem_type", /* other heads */
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "tokenizer_class", "prefix", /* the tokenizer's */
    "transformers_version", "torch_dtype", "dtype", "output_attentions", "output_hidden_states",
    "return_dict", "torchscript", "use_bfloat16", "chunk_size_feed_forward", "is_decoder",
    "is_encoder_decoder", "tie_encoder_decoder", "cross_attention_hidden_size", NULL};

const char *pytfm__hf_common_ignored(int64_t index) {
    const int64_t n = (int64_t)(sizeof COMMON_IGNORED / sizeof *COMMON_IGNORED) - 1;
    return index >= 0 && index < n ? COMMON_IGNORED[index] : NULL;
}

const char *pytfm__hf_py_repr(pytfm__json v, char *buf) {
    switch (pytfm__json_kind_of(v)) {
    case PYTFM__JSON_BOOL: return strcpy(buf, v.p[0] == 't' ? "True" : "False");
    case PYTFM__JSON_NULL: return strcpy(buf, "None");
    case PYTFM__JSON_STRING: {
        char inner[SHOW - 2];
        pytfm__json_show((pytfm__json){v.p + 1, v.n - 2}, inner, SHOW - 2);
        snprintf(buf, SHOW, "'%s'", inner);
        return buf;
    }
    default: return pytfm__json_show(v, buf, SHOW);
    }
}

int pytfm__hf_is_int(pytfm__json v) {
    return pytfm__json_kind_of(v) == PYTFM__JSON_NUMBER && pytfm__json_integer(v).integer;
}

pytfm__json pytfm__hf_member(pytfm__json object, const char *key) {
    pytfm__json k, v;
    pytfm__json_iter it = pytfm__json_iter_of(object);
    while (pytfm__json_next(&it, &k, &v))
        if (pytfm__json_string_is(k, key)) return v;
    return (pytfm__json){NULL, 0};
}

pytfm_status pytfm__hf_unknown_key(pytfm__json object, const char *source,
                                   int (*known)(pytfm__json key), pytfm__json *first) {
    *first = (pytfm__json){NULL, 0};
    pytfm__json k, v;
    pytfm__json_iter it = pytfm__json_iter_of(object);
    char *buf = NULL;
    size_t cap = 0;
    while (pytfm__json_next(&it, &k, &v)) {
        if (known(k)) continue;
        if (k.n > cap) {
            free(buf);
            buf = malloc(cap = k.n);
            if (!buf) return NO_MEMORY(source, "cannot allocate %zu bytes for a key", k.n);
        }
        if (pytfm__json_string_utf8(k, buf, NULL) > 0 && buf[0] == '_') continue;
        if (!first->p || pytfm__json_string_compare(k, *first) < 0) *first = k;
    }
    free(buf);
    return PYTFM_STATUS_OK;
}

/* ---- the weight files ---------------------------------------------------------------------- */

static int bytes_compare(const char *a, size_t an, const char *b, size_t bn) {
    const int c = memcmp(a, b, an < bn ? an : bn);
    return c ? c : (an > bn) - (an < bn);
}

static int by_name(const void *x, const void *y) {
    const placed *a = x, *b = y;
    return bytes_compare(a->name, a->name_len, b->name, b->name_len);
}

static int by_file(const void *x, const void *y) {
    const placed *a = x, *b = y;
    return bytes_compare(a->file, a->file_len, b->file, b->file_len);
}

static int ends_with(const char *s, size_t n, const char *tail) {
    const size_t t = strlen(tail);
    return n >= t && !memcmp(s + n - t, tail, t);
}

/* the index's weight_map, checked, unescaped into *text: -> *map [*count], in name order */
static pytfm_status read_index(int dir, const char *index, placed **map, size_t *count,
                               char **text) {
    char *doc;
    size_t size;
    PYTFM_TRY(read_json(dir, index, "an index", &doc, &size));
    const pytfm__json root = pytfm__json_root(doc, size);
    pytfm__json wmap = {NULL, 0}, k, v;
    if (pytfm__json_kind_of(root) == PYTFM__JSON_OBJECT)
        wmap = pytfm__hf_member(root, "weight_map");
    int ok = wmap.p && pytfm__json_kind_of(wmap) == PYTFM__JSON_OBJECT;
    pytfm__json_iter it = pytfm__json_iter_of(wmap);
    while (ok && pytfm__json_next(&it, &k, &v)) ok = pytfm__json_kind_of(v) == PYTFM__JSON_STRING;
    if (!ok) {
        free(doc);
        return BAD(index, "needs a weight_map {tensor name: file name}");
    }
    const size_t n = pytfm__json_count(wmap);
    placed *p = calloc(n ? n : 1, sizeof *p);
    char *out = malloc(size + 1), *at = out;
    if (!p || !out) {
        free(p), free(out), free(doc);
        return NO_MEMORY(index, "cannot allocate the weight_map");
    }
    size_t i = 0;
    it = pytfm__json_iter_of(wmap);
    pytfm_status status = PYTFM_STATUS_OK;
    while (pytfm__json_next(&it, &k, &v)) {
        placed *e = &p[i++];
        e->name = at, e->name_len = pytfm__json_string_utf8(k, at, NULL), at += e->name_len;
        *at++ = 0;
        e->file = at, e->file_len = pytfm__json_string_utf8(v, at, NULL), at += e->file_len;
        *at++ = 0;
        const int bad = memchr(e->file, '/', e->file_len) || memchr(e->file, 0, e->file_len) ||
                        !strcmp(e->file, ".") || !strcmp(e->file, "..") ||
                        !ends_with(e->file, e->file_len, ".safetensors");
        if (bad && status == PYTFM_STATUS_OK) {
            char name[SHOW], file[SHOW];
            status = BAD(index, "%s is in %s, not a .safetensors file of the folder",
                         pytfm__hf_show_name(e->name, e->name_len, name),
                         pytfm__hf_py_repr(v, file));
        }
    }
    free(doc);
    if (status == PYTFM_STATUS_OK && !n) status = BAD(index, "its weight_map names no file");
    if (status != PYTFM_STATUS_OK) {
        free(p), free(out);
        return status;
    }
    qsort(p, n, sizeof *p, by_name);
    *map = p, *count = n, *text = out;
    return PYTFM_STATUS_OK;
}

/* the file the index puts name[0..len) in, or NULL */
static const placed *placed_of(const placed *map, size_t n, const char *name, size_t len) {
    const placed key = {name, NULL, len, 0};
    return bsearch(&key, map, n, sizeof *map, by_name);
}

const pytfm__st_entry *pytfm__hf_find(const pytfm__hf_files *h, const char *name, size_t len,
                                      size_t *file) {
    for (size_t f = 0; f < h->n_files; f++) {
        const pytfm__st_entry *e = pytfm__st_find(h->files[f].st, name, len);
        if (e) {
            if (file) *file = f;
            return e;
        }
    }
    return NULL;
}

/* open file path (taken over) as h's next shard; map (NULL: the one file) says which tensors
 * belong there */
static pytfm_status open_shard(pytfm__hf_files *h, int dir, char *path, const placed *map,
                               size_t n_map, int half) {
    pytfm__hf_shard *s = &h->files[h->n_files];
    const pytfm_status opened = pytfm__st_openat_half(&s->st, dir, name_of(path), path, half);
    if (opened != PYTFM_STATUS_OK) {
        const int e = errno;
        free(path);
        errno = e;
        return opened;
    }
    s->path = path;
    h->n_files++;
    const char *file = name_of(path);
    char a[SHOW];
    for (size_t i = 0; i < s->st->n_entries; i++) {
        const pytfm__st_entry *e = &s->st->entries[i];
        size_t other;
        const pytfm__st_entry *before = NULL;
        for (other = 0; other + 1 < h->n_files && !before; other++)
            before = pytfm__st_find(h->files[other].st, e->name, e->name_len);
        if (before)
            return BAD(path, "tensor %s is also in %s",
                       pytfm__hf_show_name(e->name, e->name_len, a), h->files[other - 1].path);
        const placed *p = map ? placed_of(map, n_map, e->name, e->name_len) : NULL;
        if (map && (!p || strcmp(p->file, file)))
            return BAD(path, "holds %s, which %s does not put there",
                       pytfm__hf_show_name(e->name, e->name_len, a), PYTFM__HF_INDEX);
    }
    for (size_t i = 0; map && i < n_map; i++) /* in name order: the first missing one named */
        if (!strcmp(map[i].file, file) && !pytfm__st_find(s->st, map[i].name, map[i].name_len))
            return BAD(path, "%s puts %s there, but it is not", PYTFM__HF_INDEX,
                       pytfm__hf_show_name(map[i].name, map[i].name_len, a));
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm__hf_open_files(pytfm__hf_files *h, int dir, const char *folder, int half) {
    char *single = pytfm__hf_join(folder, PYTFM__HF_WEIGHTS);
    char *index = pytfm__hf_join(folder, PYTFM__HF_INDEX);
    pytfm_status status = PYTFM_STATUS_OK;
    if (!single || !index) {
        status = NO_MEMORY(folder, "cannot allocate a path");
    } else if (is_regular(dir, single)) {
        h->files = calloc(1, sizeof *h->files);
        if (!h->files) status = NO_MEMORY(single, "cannot allocate a file list");
        else status = open_shard(h, dir, single, NULL, 0, half), single = NULL;
        h->source = h->n_files ? h->files[0].path : NULL;
    } else if (!is_regular(dir, index)) {
        static const char *const others[] = {"pytorch_model.bin", "tf_model.h5",
                                             "flax_model.msgpack"};
        char hint[96] = "";
        for (size_t k = 0; k < 3 && !hint[0]; k++) {
            struct stat s;
            if (fstatat(dir, others[k], &s, 0) == 0)
                snprintf(hint, sizeof hint, " (it has %s: pytfm reads safetensors only)",
                         others[k]);
        }
        errno = 0;
        status = BAD(single, "missing, and no %s either%s", PYTFM__HF_INDEX, hint);
    } else {
        placed *map = NULL;
        size_t n = 0;
        char *text = NULL;
        status = read_index(dir, index, &map, &n, &text);
        placed *files = status == PYTFM_STATUS_OK ? malloc(n * sizeof *files) : NULL;
        if (status == PYTFM_STATUS_OK && !files) status = NO_MEMORY(index, "cannot allocate");
        size_t n_files = 0;
        if (files) { /* the distinct files, in name order */
            memcpy(files, map, n * sizeof *files);
            qsort(files, n, sizeof *files, by_file);
            for (size_t i = 0; i < n; i++)
                if (!n_files || by_file(&files[n_files - 1], &files[i]))
                    files[n_files++] = files[i];
            h->files = calloc(n_files, sizeof *h->files);
            if (!h->files) status = NO_MEMORY(index, "cannot allocate a file list");
        }
        for (size_t f = 0; status == PYTFM_STATUS_OK && f < n_files; f++) {
            char *path = pytfm__hf_join(folder, files[f].file);
            if (!path) status = NO_MEMORY(index, "cannot allocate a path");
            else status = open_shard(h, dir, path, map, n, half);
        }
        free(files), free(map), free(text);
        h->source = index, h->own_source = 1, index = NULL;
    }
    free(single), free(index);
    return status;
}

void pytfm__hf_close_files(pytfm__hf_files *h) {
    for (size_t f = 0; f < h->n_files; f++) {
        pytfm_safetensors_close(h->files[f].st);
        free(h->files[f].path);
    }
    if (h->own_source) free(h->source);
    free(h->files);
    memset(h, 0, sizeof *h);
}

unsigned char **pytfm__hf_new_used(const pytfm__hf_files *h) {
    unsigned char **used = calloc(h->n_files ? h->n_files : 1, sizeof *used);
    for (size_t f = 0; used && f < h->n_files; f++) {
        const size_t n = h->files[f].st->n_entries;
        used[f] = calloc(n ? n : 1, 1);
        if (!used[f]) {
            pytfm__hf_free_used(h, used);
            used = NULL;
        }
    }
    if (!used) NO_MEMORY(h->source, "cannot allocate a tensor list");
    return used;
}

void pytfm__hf_free_used(const pytfm__hf_files *h, unsigned char **used) {
    for (size_t f = 0; used && f < h->n_files; f++) free(used[f]);
    free(used);
}

pytfm_status pytfm__hf_no_memory(const pytfm__hf_files *h, int64_t count) {
    const pytfm__st_entry *big = NULL;
    size_t at = 0;
    for (size_t f = 0; f < h->n_files; f++) {
        const pytfm__st_entry *e = pytfm__st_largest(h->files[f].st);
        if (e && (!big || e->end - e->begin > big->end - big->begin)) big = e, at = f;
    }
    char buf[SHOW] = "";
    const char *name = big ? pytfm__hf_show_name(big->name, big->name_len, buf) : "";
    return NO_MEMORY(h->n_files ? h->files[at].path : h->source,
                     "cannot allocate %lld bytes for the model's %lld parameters (tensor %s "
                     "alone is %lld bytes)", (long long)count * 4, (long long)count, name,
                     big ? (long long)(big->end - big->begin) : 0LL);
}

/* ---- the open, tried again ------------------------------------------------------------------- */

/* whether folder is no longer the folder open as dir: a save has swapped a new one in */
static int replaced(int dir, const char *folder) {
    struct stat a, b;
    return fstat(dir, &a) == 0 &&
           (stat(folder, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev);
}

pytfm_status pytfm__hf_open_retry(const char *folder, const char *kind,
                                  pytfm_status (*open_in)(void *out, int dir,
                                                          const char *folder),
                                  void *out) {
    for (int attempt = 1;; attempt++) {
        int dir;
        PYTFM_TRY(pytfm__hf_open_folder(folder, kind, &dir));
        const pytfm_status status = open_in(out, dir, folder);
        const int e = status == PYTFM_STATUS_OK ? 0 : errno;
        const int again = status != PYTFM_STATUS_OK && attempt < 4 && replaced(dir, folder);
        close(dir);
        errno = e;
        if (!again) return status;
    }
}
