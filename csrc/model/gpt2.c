/*
 * gpt2.c — a Hugging Face GPT-2 folder (config.json + model.safetensors, or the shards that
 * model.safetensors.index.json lists), read without trusting a byte of it: the one home of
 * the folder's rules (pytfm/gpt2.py maps what this returns). Checked in this order:
 *   1. the folder is one; config.json (at most MAX_JSON bytes, strict JSON, an object):
 *      GPT2Config's sizes, the fields that change the maths at GPT-2's values, the ignored
 *      ones (IGNORED), nothing else;
 *   2. the weight files: model.safetensors, else the index's weight_map (file names of the
 *      folder, each a .safetensors), each file's header checked by safetensors.c, every
 *      tensor in the file the index names and in no other;
 *   3. the tensors against the config: each parameter stored under GPT2LMHeadModel's name
 *      (transformer.h.0.attn.c_attn.weight) or GPT2Model's (h.0.attn.c_attn.weight), one
 *      layout per folder, float32 of the shape the config implies (the Conv1D weights [in,
 *      out]); by rule the buffers h.N.attn.bias [1, 1, P, P] and h.N.attn.masked_bias [] and
 *      a tied model's lm_head.weight [V, C]; nothing else.
 * All of that reads headers only: nothing proportional to the parameters is allocated before
 * it passes. pytfm_gpt2_read then copies the parameters with pread (safetensors.c: a file that
 * shrinks is an error, never a SIGBUS), transposing each Conv1D weight once into pytfm's
 * [out, in], and checks a stored tied head against the embedding.
 */
#define _POSIX_C_SOURCE 200809L /* open flags, fstat */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "core/internal.h"
#include "gpt2.h"
#include "safetensors.h"

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

enum {
    MAX_JSON = 1 << 24, /* bytes of a config.json or an index, at most (pytfm.gpt2.MAX_CONFIG) */
    MAX_NAME = 96,      /* bytes of an expected tensor's name, NUL included */
    SHOW = PYTFM__SHOW,
    BLOCK = 32         /* rows of a Conv1D weight read and transposed at once */
};

static const char CONFIG[] = "config.json", WEIGHTS[] = "model.safetensors",
                  INDEX[] = "model.safetensors.index.json";

#define BAD(source, ...) pytfm__fail_at(source, PYTFM_STATUS_INVALID_ARGUMENT, __VA_ARGS__)
#define NO_MEMORY(source, ...) pytfm__fail_at(source, PYTFM_STATUS_OUT_OF_MEMORY, __VA_ARGS__)

/* config.json fields that do not change the forward pass: ignored (pytfm.gpt2.IGNORED) */
static const char *const IGNORED[] = {
    "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout", /* dropout */
    "initializer_range", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_hidden_size", /* GPT2DoubleHeadsModel's head */
    "use_cache", "task_specific_params", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "num_beam_groups", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "diversity_penalty", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", /* generation defaults */
    "architectures", "finetuning_task", "id2label", "label2id", "num_labels", "problem_type",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "tokenizer_class", "prefix", "transformers_version", "torch_dtype", "dtype",
    "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_bfloat16",
    "chunk_size_feed_forward", "is_decoder", "is_encoder_decoder", "tie_encoder_decoder",
    "cross_attention_hidden_size",
    "reorder_and_upcast_attn", /* the order of float32 operations within attention */
    NULL};

/* GPT2Config's sizes, in the order they are checked */
static const char *const SIZES[] = {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head"};
enum { N_SIZES = 5 };

/* the fields that change the maths, in the order they are checked: GPT-2's value (Python's
 * repr, for messages) */
static const char *const MATHS[][2] = {
    {"activation_function", "'gelu_new'"},
    {"n_inner", "None"},
    {"layer_norm_epsilon", "1e-05"},
    {"scale_attn_weights", "True"},
    {"scale_attn_by_inverse_layer_idx", "False"},
    {"add_cross_attention", "False"},
    {"pruned_heads", "{}"},
    {"model_type", "'gpt2'"},
    {"tie_word_embeddings", "True"}};
enum { N_MATHS = 9, TIE = 8 };

const char *pytfm_gpt2_ignored_field(int64_t index) {
    const int64_t n = (int64_t)(sizeof IGNORED / sizeof *IGNORED) - 1;
    return index >= 0 && index < n ? IGNORED[index] : NULL;
}

/* a tensor's name for a message, as Python's messages write it (unquoted): at most
 * PYTFM__SHOW − 2 bytes of it (pytfm__st_show_name's cut and control bytes) */
static const char *show_name(const char *name, size_t len, char *buf) {
    pytfm__st_show_name(name, len, buf);
    buf[strlen(buf) - 1] = 0; /* its closing quote */
    return buf + 1;           /* past its opening one */
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

/* folder/name (one '/' between them, as os.path.join writes it), malloc'd */
static char *join(const char *folder, const char *name) {
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

/* the file at path, at most MAX_JSON bytes, strict JSON: -> *text (malloc'd), *size */
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
    const size_t cap = (s.st_size > MAX_JSON ? MAX_JSON : (size_t)s.st_size) + 1;
    char *buf = s.st_size > MAX_JSON ? NULL : malloc(cap + 1);
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
    if (s.st_size > MAX_JSON || got > MAX_JSON) {
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

/* ---- 1. config.json ------------------------------------------------------------------------ */

/* v as Python's repr of json.loads(v) shows it, near enough for a message: strings quoted
 * '...', true/false/null as True/False/None, the rest as written */
static const char *py_repr(pytfm__json v, char *buf) {
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

static int is_int(pytfm__json v) {
    return pytfm__json_kind_of(v) == PYTFM__JSON_NUMBER && pytfm__json_integer(v).integer;
}

/* whether field k of MATHS has an allowed value v; n_embd for n_inner */
static int maths_ok(size_t k, pytfm__json v, int64_t n_embd) {
    const pytfm__json_kind kind = pytfm__json_kind_of(v);
    int ok = 0;
    switch (k) {
    case 0: /* gelu_pytorch_tanh is the same function */
        return pytfm__json_string_is(v, "gelu_new") || pytfm__json_string_is(v, "gelu_pytorch_tanh");
    case 1: {
        if (kind == PYTFM__JSON_NULL) return 1;
        const pytfm__json_int i = is_int(v) ? pytfm__json_integer(v) : (pytfm__json_int){0};
        int64_t four = 0;
        return i.integer && i.fits && pytfm__mul_within(4, n_embd, INT64_MAX, &four) &&
               i.value == four;
    }
    case 2: {
        const double d = pytfm__json_number(v, &ok);
        return ok && d == PYTFM_LAYERNORM_EPS; // the model's
    }
    case 3: return kind == PYTFM__JSON_BOOL && v.p[0] == 't';
    case 4:
    case 5: return kind == PYTFM__JSON_BOOL && v.p[0] == 'f';
    case 6: return kind == PYTFM__JSON_NULL || (kind == PYTFM__JSON_OBJECT && !pytfm__json_count(v));
    case 7: return pytfm__json_string_is(v, "gpt2");
    default: return kind == PYTFM__JSON_BOOL;
    }
}

/* a key the rules know: a size, n_ctx, a maths field, an ignored one */
static int known_key(pytfm__json key) {
    if (pytfm__json_string_is(key, "n_ctx")) return 1;
    for (size_t k = 0; k < N_SIZES; k++)
        if (pytfm__json_string_is(key, SIZES[k])) return 1;
    for (size_t k = 0; k < N_MATHS; k++)
        if (pytfm__json_string_is(key, MATHS[k][0])) return 1;
    for (size_t k = 0; IGNORED[k]; k++)
        if (pytfm__json_string_is(key, IGNORED[k])) return 1;
    return 0;
}

/* the member of object named key, or {NULL, 0} */
static pytfm__json member(pytfm__json object, const char *key) {
    pytfm__json k, v;
    pytfm__json_iter it = pytfm__json_iter_of(object);
    while (pytfm__json_next(&it, &k, &v))
        if (pytfm__json_string_is(k, key)) return v;
    return (pytfm__json){NULL, 0};
}

/* the smallest key (Python's str order) neither known nor starting with "_", or {NULL, 0} */
static pytfm_status unknown_key(pytfm__json object, const char *source, pytfm__json *first) {
    *first = (pytfm__json){NULL, 0};
    pytfm__json k, v;
    pytfm__json_iter it = pytfm__json_iter_of(object);
    char *buf = NULL;
    size_t cap = 0;
    while (pytfm__json_next(&it, &k, &v)) {
        if (known_key(k)) continue;
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

pytfm_status pytfm_gpt2_config_parse(pytfm_model_config *config, const char *text, int64_t size,
                                     const char *source) {
    PYTFM_CHECK(config != NULL, "%s: config must not be NULL", __func__);
    PYTFM_CHECK(text != NULL || size == 0, "%s: text must not be NULL", __func__);
    PYTFM_CHECK(size >= 0, "%s: size must be >= 0, got %lld", __func__, (long long)size);
    memset(config, 0, sizeof *config);
    errno = 0;
    if (pytfm_json_check(text, size) != PYTFM_STATUS_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", pytfm_last_error());
        return BAD(source, "%s", why);
    }
    const pytfm__json c = pytfm__json_root(text, (size_t)size);
    if (pytfm__json_kind_of(c) != PYTFM__JSON_OBJECT)
        return BAD(source, "a JSON %s, not an object",
                   pytfm__json_kind_name(pytfm__json_kind_of(c)));
    char a[SHOW], b[SHOW];
    int64_t sizes[N_SIZES];
    for (size_t k = 0; k < N_SIZES; k++) {
        const pytfm__json v = member(c, SIZES[k]);
        if (!v.p) return BAD(source, "has no %s", SIZES[k]);
        const pytfm__json_int i = is_int(v) ? pytfm__json_integer(v) : (pytfm__json_int){0};
        if (!i.integer || !i.fits || i.value < 1)
            return BAD(source, "%s must be a positive int, got %s", SIZES[k], py_repr(v, a));
        sizes[k] = i.value;
    }
    const pytfm__json n_ctx = member(c, "n_ctx");
    if (n_ctx.p) { /* Python's !=: 40.0 equals 40 */
        int ok = 0;
        const pytfm__json_int i = is_int(n_ctx) ? pytfm__json_integer(n_ctx) : (pytfm__json_int){0};
        const int same = i.integer ? i.fits && i.value == sizes[1]
                                   : pytfm__json_number(n_ctx, &ok) == (double)sizes[1] && ok;
        if (!same)
            return BAD(source, "n_ctx (%s) and n_positions (%lld) disagree", py_repr(n_ctx, a),
                       (long long)sizes[1]);
    }
    for (size_t k = 0; k < N_MATHS; k++) {
        const pytfm__json v = member(c, MATHS[k][0]);
        if (v.p && !maths_ok(k, v, sizes[2]))
            return BAD(source, "%s is %s: pytfm runs GPT-2's %s only%s", MATHS[k][0],
                       py_repr(v, a), MATHS[k][1],
                       k == TIE ? " (or false, with lm_head.weight stored)" : "");
    }
    pytfm__json unknown;
    PYTFM_TRY(unknown_key(c, source, &unknown));
    if (unknown.p)
        return BAD(source,
                   "unknown field %s: pytfm cannot tell whether it changes the model (it ignores "
                   "only the fields pytfm.gpt2.IGNORED lists)",
                   py_repr(unknown, b));
    const pytfm__json tie = member(c, "tie_word_embeddings");
    const pytfm_model_config parsed = {.vocab = sizes[0],
                                       .max_seq = sizes[1],
                                       .d_model = sizes[2],
                                       .n_layer = sizes[3],
                                       .n_head = sizes[4],
                                       .pos = PYTFM_POS_LEARNED,
                                       .tie_embeddings = !tie.p || tie.p[0] == 't'};
    PYTFM_TRY(pytfm__model_config_check_at(&parsed, source, ""));
    *config = parsed;
    return PYTFM_STATUS_OK;
}

/* folder/config.json, read and parsed; path receives its path (malloc'd) */
static pytfm_status read_config(int dir, const char *folder, pytfm_model_config *config) {
    char *path = join(folder, CONFIG);
    if (!path) return NO_MEMORY(folder, "cannot allocate a path");
    if (!is_regular(dir, path)) {
        const pytfm_status st = BAD(path, "missing (a GPT-2 folder holds %s)", CONFIG);
        free(path);
        errno = 0;
        return st;
    }
    char *text;
    size_t size;
    pytfm_status status = read_json(dir, path, "a config", &text, &size);
    if (status == PYTFM_STATUS_OK) {
        status = pytfm_gpt2_config_parse(config, text, (int64_t)size, path);
        free(text);
    }
    free(path);
    return status;
}

/* folder, opened: -> *dir */
static pytfm_status open_folder(const char *folder, int *dir) {
    *dir = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*dir < 0 && errno != ENOENT && errno != ENOTDIR) return io_fail(folder, "cannot open");
    if (*dir < 0) {
        errno = 0;
        return BAD(folder, "not a folder (a GPT-2 folder holds %s and %s)", CONFIG, WEIGHTS);
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_gpt2_read_config(pytfm_model_config *config, const char *folder) {
    PYTFM_CHECK(config != NULL, "%s: config must not be NULL", __func__);
    PYTFM_CHECK(folder != NULL, "%s: folder must not be NULL", __func__);
    memset(config, 0, sizeof *config);
    int dir;
    PYTFM_TRY(open_folder(folder, &dir));
    const pytfm_status status = read_config(dir, folder, config);
    const int e = errno;
    close(dir);
    errno = e;
    return status;
}

/* ---- 2. the weight files --------------------------------------------------------------------- */

typedef struct shard {
    char *path;
    pytfm_safetensors *st;
} shard;

/* one member of the index's weight_map: a tensor name and its file, unescaped */
typedef struct placed {
    const char *name, *file;
    size_t name_len, file_len;
} placed;

struct pytfm_gpt2 {
    pytfm_model_config config;
    char *source; /* messages about the tensors: the one file, or the index */
    int own_source; /* source is the index's path, freed with the handle */
    shard *files;
    size_t n_files;
    int prefixed;                    /* GPT2LMHeadModel's names (transformer.) */
    const pytfm__st_entry *lm_head;  /* a tied model's stored head, or NULL */
    size_t lm_head_file;
};

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
    if (pytfm__json_kind_of(root) == PYTFM__JSON_OBJECT) wmap = member(root, "weight_map");
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
                         show_name(e->name, e->name_len, name), py_repr(v, file));
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

/* the entry named name[0..len) in any open file (*file its index), or NULL */
static const pytfm__st_entry *find(const pytfm_gpt2 *g, const char *name, size_t len,
                                   size_t *file) {
    for (size_t f = 0; f < g->n_files; f++) {
        const pytfm__st_entry *e = pytfm__st_find(g->files[f].st, name, len);
        if (e) {
            if (file) *file = f;
            return e;
        }
    }
    return NULL;
}

/* open file path (taken over) as g's next shard; map (NULL: the one file) says which tensors
 * belong there */
static pytfm_status open_shard(pytfm_gpt2 *g, int dir, char *path, const placed *map,
                               size_t n_map) {
    shard *s = &g->files[g->n_files];
    const pytfm_status opened = pytfm__st_openat(&s->st, dir, name_of(path), path);
    if (opened != PYTFM_STATUS_OK) {
        const int e = errno;
        free(path);
        errno = e;
        return opened;
    }
    s->path = path;
    g->n_files++;
    const char *slash = strrchr(path, '/'), *file = slash ? slash + 1 : path;
    char a[SHOW];
    for (size_t i = 0; i < s->st->n_entries; i++) {
        const pytfm__st_entry *e = &s->st->entries[i];
        size_t other;
        const pytfm__st_entry *before = NULL;
        for (other = 0; other + 1 < g->n_files && !before; other++)
            before = pytfm__st_find(g->files[other].st, e->name, e->name_len);
        if (before)
            return BAD(path, "tensor %s is also in %s",
                       show_name(e->name, e->name_len, a), g->files[other - 1].path);
        const placed *p = map ? placed_of(map, n_map, e->name, e->name_len) : NULL;
        if (map && (!p || strcmp(p->file, file)))
            return BAD(path, "holds %s, which %s does not put there",
                       show_name(e->name, e->name_len, a), INDEX);
    }
    for (size_t i = 0; map && i < n_map; i++) /* in name order: the first missing one named */
        if (!strcmp(map[i].file, file) && !pytfm__st_find(s->st, map[i].name, map[i].name_len))
            return BAD(path, "%s puts %s there, but it is not", INDEX,
                       show_name(map[i].name, map[i].name_len, a));
    return PYTFM_STATUS_OK;
}

static pytfm_status open_files(pytfm_gpt2 *g, int dir, const char *folder) {
    char *single = join(folder, WEIGHTS), *index = join(folder, INDEX);
    pytfm_status status = PYTFM_STATUS_OK;
    if (!single || !index) {
        status = NO_MEMORY(folder, "cannot allocate a path");
    } else if (is_regular(dir, single)) {
        g->files = calloc(1, sizeof *g->files);
        if (!g->files) status = NO_MEMORY(single, "cannot allocate a file list");
        else status = open_shard(g, dir, single, NULL, 0), single = NULL;
        g->source = g->n_files ? g->files[0].path : NULL;
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
        status = BAD(single, "missing, and no %s either%s", INDEX, hint);
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
                if (!n_files || by_file(&files[n_files - 1], &files[i])) files[n_files++] = files[i];
            g->files = calloc(n_files, sizeof *g->files);
            if (!g->files) status = NO_MEMORY(index, "cannot allocate a file list");
        }
        for (size_t f = 0; status == PYTFM_STATUS_OK && f < n_files; f++) {
            char *path = join(folder, files[f].file);
            if (!path) status = NO_MEMORY(index, "cannot allocate a path");
            else status = open_shard(g, dir, path, map, n);
        }
        free(files), free(map), free(text);
        g->source = index, g->own_source = 1, index = NULL;
    }
    free(single), free(index);
    return status;
}

/* ---- 3. the tensors -------------------------------------------------------------------------- */

/* One expected parameter, in the layout's order (pytfm_model_param, walked in p): its name as
 * stored and its stored shape, each size factor·base (the product may not fit in int64). */
typedef struct want {
    pytfm_param_info p;
    char name[MAX_NAME];
    int ndim;
    int64_t base[2];
    int factor[2];
    int conv; /* a Conv1D weight: stored [in, out], pytfm's [out, in] */
} want;

/* the parameter after x's (x->p.layer = −1, x->p.part = −1: the first), or 0 past the last */
static int next_want(const pytfm_gpt2 *g, want *x) {
    if (!pytfm__param_next(&g->config, &x->p)) return 0;
    const pytfm_param_info *p = &x->p;
    const size_t skip = strlen("transformer.");
    const int strip = !g->prefixed && !strncmp(p->name, "transformer.", skip);
    snprintf(x->name, sizeof x->name, "%s", p->name + (strip ? skip : 0));
    x->ndim = p->ndim;
    x->conv = p->ndim == 2 && p->layer >= 0 && p->layer < g->config.n_layer; /* a block's */
    for (int d = 0; d < 2; d++)
        x->base[d] = p->base[d ^ x->conv], x->factor[d] = p->factor[d ^ x->conv];
    return 1;
}

/* factor·base in decimal, exactly (it may pass int64) */
static void show_product(int64_t base, int factor, char *out, size_t cap) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%lld", (long long)base), carry = 0;
    char result[40];
    int r = (int)sizeof result - 1;
    result[r] = 0;
    for (int i = n - 1; i >= 0 || carry; i--) {
        const int d = (i >= 0 ? digits[i] - '0' : 0) * factor + carry;
        result[--r] = (char)('0' + d % 10);
        carry = d / 10;
    }
    snprintf(out, cap, "%s", result + r);
}

static const char *show_want(const want *x, char *buf, size_t cap) {
    char a[40], b[40];
    show_product(x->base[0], x->factor[0], a, sizeof a);
    if (x->ndim == 1) {
        snprintf(buf, cap, "[%s]", a);
    } else {
        show_product(x->base[1], x->factor[1], b, sizeof b);
        snprintf(buf, cap, "[%s, %s]", a, b);
    }
    return buf;
}

static const char *show_shape(const pytfm_tensor_info *t, char *buf, size_t cap) {
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

/* the stored entry e (of file f) is float32 of x's shape */
static pytfm_status expect(const pytfm_gpt2 *g, const pytfm__st_entry *e, size_t f,
                           const want *x) {
    pytfm_tensor_info t;
    PYTFM_TRY(pytfm_safetensors_tensor(g->files[f].st, e - g->files[f].st->entries, &t));
    int same = t.dtype == PYTFM_DTYPE_F32 && t.ndim == x->ndim;
    for (int d = 0; same && d < t.ndim; d++) {
        int64_t size = 0;
        same = pytfm__mul_within(x->base[d], x->factor[d], INT64_MAX, &size) && size == t.shape[d];
    }
    if (same) return PYTFM_STATUS_OK;
    char name[SHOW], got[256], need[96];
    return BAD(g->source, "%s is %s%s, config.json needs float32%s",
               show_name(e->name, e->name_len, name),
               t.dtype == PYTFM_DTYPE_F32 ? "float32" : "int64", show_shape(&t, got, sizeof got),
               show_want(x, need, sizeof need));
}

/* every parameter there, of its shape; each marked in used[f][i] */
static pytfm_status check_expected(pytfm_gpt2 *g, unsigned char **used) {
    want x = {.p = {.layer = -1, .part = -1}};
    int64_t count = 0;
    const int64_t L = g->config.n_layer;
    while (next_want(g, &x)) {
        size_t f = 0;
        const pytfm__st_entry *e = find(g, x.name, strlen(x.name), &f);
        char need[96];
        if (!e)
            return BAD(g->source,
                       "tensor %s is missing: config.json's {'n_layer': %lld, 'n_embd': %lld} "
                       "needs float32%s",
                       x.name, (long long)L, (long long)g->config.d_model,
                       show_want(&x, need, sizeof need));
        PYTFM_TRY(expect(g, e, f, &x));
        used[f][e - g->files[f].st->entries] = 1;
        /* its bytes lie in the file: its floats, and their sum, fit in int64 */
        count += (e->end - e->begin) / (int64_t)sizeof(float);
    }
    g->config.n_params = count;
    return PYTFM_STATUS_OK;
}

/* rest is "h.<i>.<tail>" with i written as Python's str(int) writes it and i < n_layer */
static int layer_buffer(const char *rest, size_t n, const char *tail, int64_t n_layer) {
    if (n < 3 || memcmp(rest, "h.", 2)) return 0;
    size_t i = 2;
    int64_t layer = 0;
    while (i < n && rest[i] >= '0' && rest[i] <= '9' && i < 20) { /* 18 digits: no overflow */
        layer = layer * 10 + (rest[i] - '0');
        i++;
    }
    if (i == 2 || (rest[2] == '0' && i > 3) || layer >= n_layer) return 0;
    return n - i == strlen(tail) && !memcmp(rest + i, tail, n - i);
}

/* what is not a parameter: the buffers by rule, a tied head, else refused */
static pytfm_status check_others(pytfm_gpt2 *g, unsigned char **used) {
    const pytfm_model_config *c = &g->config;
    const size_t skip = g->prefixed ? strlen("transformer.") : 0;
    for (size_t f = 0; f < g->n_files; f++) {
        const pytfm_safetensors *st = g->files[f].st;
        for (size_t i = 0; i < st->n_entries; i++) {
            if (used[f][i]) continue;
            const pytfm__st_entry *e = &st->entries[i];
            const int in_prefix = !skip || (e->name_len >= skip &&
                                            !memcmp(e->name, "transformer.", skip));
            const char *rest = e->name + skip;
            const size_t n = e->name_len - skip;
            pytfm_tensor_info t;
            PYTFM_TRY(pytfm_safetensors_tensor(st, (int64_t)i, &t));
            char name[SHOW], got[256];
            const int64_t P = c->max_seq;
            if (in_prefix && layer_buffer(rest, n, ".attn.bias", c->n_layer)) {
                if (t.dtype != PYTFM_DTYPE_F32 || t.ndim != 4 || t.shape[0] != 1 ||
                    t.shape[1] != 1 || t.shape[2] != P || t.shape[3] != P)
                    return BAD(g->source, "%s is %s%s, config.json needs float32[1, 1, %lld, %lld]",
                               show_name(e->name, e->name_len, name),
                               t.dtype == PYTFM_DTYPE_F32 ? "float32" : "int64",
                               show_shape(&t, got, sizeof got), (long long)P, (long long)P);
            } else if (in_prefix && layer_buffer(rest, n, ".attn.masked_bias", c->n_layer)) {
                if (t.dtype != PYTFM_DTYPE_F32 || t.ndim != 0)
                    return BAD(g->source, "%s is %s%s, config.json needs float32[]",
                               show_name(e->name, e->name_len, name),
                               t.dtype == PYTFM_DTYPE_F32 ? "float32" : "int64",
                               show_shape(&t, got, sizeof got));
            } else if (c->tie_embeddings && e->name_len == 14 &&
                       !memcmp(e->name, "lm_head.weight", 14)) {
                want head = {.ndim = 2, .base = {c->vocab, c->d_model}, .factor = {1, 1}};
                PYTFM_TRY(expect(g, e, f, &head));
                g->lm_head = e, g->lm_head_file = f;
            } else {
                return BAD(g->source, "unexpected tensor %s (for a %lld-layer GPT-2, names %sh.N..., %s)",
                           show_name(e->name, e->name_len, name), (long long)c->n_layer,
                           g->prefixed ? "transformer." : "without a prefix, ",
                           c->tie_embeddings ? "tied" : "lm_head.weight");
            }
        }
    }
    return PYTFM_STATUS_OK;
}

static pytfm_status check_tensors(pytfm_gpt2 *g) {
    for (size_t f = 0; f < g->n_files && !g->prefixed; f++) {
        const pytfm_safetensors *st = g->files[f].st;
        for (size_t i = 0; i < st->n_entries && !g->prefixed; i++)
            g->prefixed = st->entries[i].name_len >= 12 &&
                          !memcmp(st->entries[i].name, "transformer.", 12);
    }
    unsigned char **used = calloc(g->n_files, sizeof *used);
    pytfm_status status = used ? PYTFM_STATUS_OK
                               : NO_MEMORY(g->source, "cannot allocate a tensor list");
    for (size_t f = 0; status == PYTFM_STATUS_OK && f < g->n_files; f++) {
        const size_t n = g->files[f].st->n_entries;
        used[f] = calloc(n ? n : 1, 1);
        if (!used[f]) status = NO_MEMORY(g->source, "cannot allocate a tensor list");
    }
    if (status == PYTFM_STATUS_OK) status = check_expected(g, used);
    if (status == PYTFM_STATUS_OK) status = check_others(g, used);
    for (size_t f = 0; used && f < g->n_files; f++) free(used[f]);
    free(used);
    return status;
}

/* ---- the handle ------------------------------------------------------------------------------ */

/* one try of pytfm_gpt2_open, on the folder open as dir */
static pytfm_status open_in(pytfm_gpt2 **gpt2, int dir, const char *folder) {
    pytfm_gpt2 *g = calloc(1, sizeof *g);
    if (!g) return NO_MEMORY(folder, "cannot allocate a GPT-2 folder's handle");
    pytfm_status status = read_config(dir, folder, &g->config);
    if (status == PYTFM_STATUS_OK) status = open_files(g, dir, folder);
    if (status == PYTFM_STATUS_OK) status = check_tensors(g);
    if (status != PYTFM_STATUS_OK) {
        const int e = errno; /* a system call's error number survives the close */
        pytfm_gpt2_close(g);
        errno = e;
        return status;
    }
    *gpt2 = g;
    return PYTFM_STATUS_OK;
}

/* whether folder is no longer the folder open as dir: a save has swapped a new one in */
static int replaced(int dir, const char *folder) {
    struct stat a, b;
    return fstat(dir, &a) == 0 &&
           (stat(folder, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev);
}

pytfm_status pytfm_gpt2_open(pytfm_gpt2 **gpt2, const char *folder) {
    PYTFM_CHECK(gpt2 != NULL, "%s: gpt2 must not be NULL", __func__);
    *gpt2 = NULL;
    PYTFM_CHECK(folder != NULL, "%s: folder must not be NULL", __func__);
    /* the save that swapped a new folder in removes the old one's files: a read that failed
     * on a folder replaced meanwhile is tried again, on the new one */
    for (int attempt = 1;; attempt++) {
        int dir;
        PYTFM_TRY(open_folder(folder, &dir));
        const pytfm_status status = open_in(gpt2, dir, folder);
        const int e = status == PYTFM_STATUS_OK ? 0 : errno;
        const int again = status != PYTFM_STATUS_OK && attempt < 4 && replaced(dir, folder);
        close(dir);
        errno = e;
        if (!again) return status;
    }
}

pytfm_status pytfm_gpt2_close(pytfm_gpt2 *gpt2) {
    if (!gpt2) return PYTFM_STATUS_OK;
    for (size_t f = 0; f < gpt2->n_files; f++) {
        pytfm_safetensors_close(gpt2->files[f].st);
        free(gpt2->files[f].path);
    }
    if (gpt2->own_source) free(gpt2->source);
    free(gpt2->files);
    free(gpt2);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_gpt2_get_config(const pytfm_gpt2 *gpt2, pytfm_model_config *config) {
    PYTFM_CHECK(gpt2 != NULL, "%s: gpt2 must not be NULL", __func__);
    PYTFM_CHECK(config != NULL, "%s: config must not be NULL", __func__);
    *config = gpt2->config;
    return PYTFM_STATUS_OK;
}

/* dst[c·rows + r] = src[(r − r0)·cols + c] for the rows [r0, r0 + n) of a [rows, cols]
 * matrix held in src: that band of rows transposed into dst [cols, rows] */
static void transpose_band(float *dst, const float *src, int64_t r0, int64_t n, int64_t rows,
                           int64_t cols) {
    for (int64_t c0 = 0; c0 < cols; c0 += BLOCK)
        for (int64_t c = c0; c < PYTFM_MIN(cols, c0 + BLOCK); c++)
            for (int64_t r = 0; r < n; r++) dst[c * rows + r0 + r] = src[r * cols + c];
}

/* Conv1D weight e ([rows, cols] = [in, out] stored) into dst [cols, rows]: a band of BLOCK
 * rows at a time read into buf (BLOCK·cols floats, so that the band stays in cache while it
 * is transposed), then transposed into place: one pass over the weight, not a copy and then
 * another. On the calling thread: reading is memory-bound (the copy out of the page cache and
 * the first touch of the parameters' pages), which more threads do not speed up on a busy
 * machine. */
static pytfm_status read_transposed(const pytfm_gpt2 *g, size_t f, const pytfm__st_entry *e,
                                    float *dst, float *buf, int64_t rows, int64_t cols) {
    const pytfm_safetensors *st = g->files[f].st;
    for (int64_t r0 = 0; r0 < rows; r0 += BLOCK) {
        const int64_t n = PYTFM_MIN(BLOCK, rows - r0), floats = n * cols;
        PYTFM_TRY(pytfm__st_read_part(st, e, r0 * cols * (int64_t)sizeof(float), buf,
                                      floats * (int64_t)sizeof(float)));
        pytfm__to_host_order(buf, floats);
        transpose_band(dst, buf, r0, n, rows, cols);
    }
    return PYTFM_STATUS_OK;
}

/* the entry's floats into out, in host order */
static pytfm_status read_floats(const pytfm_gpt2 *g, size_t f, const pytfm__st_entry *e,
                                float *out) {
    const pytfm_safetensors *st = g->files[f].st;
    const int64_t bytes = e->end - e->begin;
    PYTFM_TRY(pytfm__st_read_part(st, e, 0, out, bytes));
    pytfm__to_host_order(out, bytes / (int64_t)sizeof(float));
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_gpt2_read(const pytfm_gpt2 *gpt2, float *params, int64_t count) {
    PYTFM_CHECK(gpt2 != NULL, "%s: gpt2 must not be NULL", __func__);
    PYTFM_CHECK(params != NULL, "%s: params must not be NULL", __func__);
    PYTFM_CHECK(count == gpt2->config.n_params,
                "%s: count must be the config's n_params (%lld), got %lld", __func__,
                (long long)gpt2->config.n_params, (long long)count);
    const int64_t C = gpt2->config.d_model, V = gpt2->config.vocab;
    /* a band of BLOCK rows of the widest Conv1D weight, BLOCK·4C floats (C is within the
     * file); a stored tied head is compared a band at a time too */
    const int64_t scratch = BLOCK * 4 * C;
    float *buf = pytfm__scratch(__func__, scratch, sizeof(float));
    if (!buf) return PYTFM_STATUS_OUT_OF_MEMORY;
    pytfm_status status = PYTFM_STATUS_OK;
    want x = {.p = {.layer = -1, .part = -1}};
    int64_t at = 0;
    while (status == PYTFM_STATUS_OK && next_want(gpt2, &x)) {
        size_t f = 0;
        const pytfm__st_entry *e = find(gpt2, x.name, strlen(x.name), &f);
        const int64_t floats = (e->end - e->begin) / (int64_t)sizeof(float);
        if (x.conv) {
            status = read_transposed(gpt2, f, e, params + at, buf, x.factor[0] * C,
                                     x.factor[1] * C);
        } else {
            status = read_floats(gpt2, f, e, params + at);
        }
        at += floats;
    }
    const pytfm_safetensors *head = gpt2->lm_head ? gpt2->files[gpt2->lm_head_file].st : NULL;
    for (int64_t i0 = 0; head && status == PYTFM_STATUS_OK && i0 < V * C; i0 += scratch) {
        const int64_t n = PYTFM_MIN(scratch, V * C - i0);
        status = pytfm__st_read_part(head, gpt2->lm_head, i0 * (int64_t)sizeof(float), buf,
                                     n * (int64_t)sizeof(float));
        if (status == PYTFM_STATUS_OK) pytfm__to_host_order(buf, n);
        for (int64_t i = 0; status == PYTFM_STATUS_OK && i < n; i++)
            if (buf[i] != params[i0 + i]) /* wte is first; as NumPy's array_equal compares */
                status = BAD(gpt2->files[gpt2->lm_head_file].path,
                             "lm_head.weight differs from the embedding, but config.json ties "
                             "them (tie_word_embeddings)");
    }
    free(buf);
    if (status != PYTFM_STATUS_OK) return status;
    errno = 0;
    return PYTFM_STATUS_OK;
}

/* count parameters could not be allocated: the message names the file of the largest tensor,
 * and that tensor (the one a hostile config made huge) */
static pytfm_status no_memory(const pytfm_gpt2 *g, int64_t count) {
    const pytfm__st_entry *big = NULL;
    size_t at = 0;
    for (size_t f = 0; f < g->n_files; f++) {
        const pytfm__st_entry *e = pytfm__st_largest(g->files[f].st);
        if (e && (!big || e->end - e->begin > big->end - big->begin)) big = e, at = f;
    }
    char buf[SHOW] = "";
    const char *name = big ? show_name(big->name, big->name_len, buf) : "";
    return NO_MEMORY(g->n_files ? g->files[at].path : g->source,
                     "cannot allocate %lld bytes for the model's %lld parameters (tensor %s "
                     "alone is %lld bytes)", (long long)count * 4, (long long)count, name,
                     big ? (long long)(big->end - big->begin) : 0LL);
}

pytfm_status pytfm__gpt2_weights(const char *folder, pytfm__weights *w) {
    memset(w, 0, sizeof *w);
    pytfm_gpt2 *g;
    PYTFM_TRY(pytfm_gpt2_open(&g, folder));
    const int64_t count = g->config.n_params;
    // in huge pages where granted (core/weights.c); count floats lie in the file: no overflow
    float *params = pytfm__weights_alloc((size_t)count * sizeof(float));
    pytfm_status status = params ? pytfm_gpt2_read(g, params, count) : no_memory(g, count);
    if (status == PYTFM_STATUS_OK) {
        w->config = g->config;
        w->params = params;
    } else {
        free(params);
    }
    pytfm_gpt2_close(g);
    return status;
}
