/*
 * safetensors.c — pytfm checkpoints read in C (checkpoint.h), trusting no byte of them.
 *
 * The rules are pytfm/checkpoint.py's, checked in its order, so that C and Python refuse the
 * same files and say why in the same words:
 *   1. the safetensors layer (_read_header): an 8-byte little-endian header length N, at most
 *      the file less 8 and at most MAX_HEADER; N bytes of strict UTF-8 JSON (json.c), an object
 *      whose __metadata__ maps str to str; each other member a tensor entry {dtype F32 | I64,
 *      shape [ints >= 0] (at most 32 of them, bytes within int64), data_offsets [begin, end]
 *      with 0 <= begin <= end <= the data and end − begin the shape's bytes}; the entries'
 *      data, in offset order, tiling the data exactly (_check_layout).
 *   2. the pytfm layer (_check_pytfm_metadata): format "pytfm"; config a JSON object with
 *      exactly GPTConfig's fields, each checked as GPTConfig.__post_init__ does; step and
 *      optim.t non-negative int64s in decimal; extra JSON.
 *   3. the tensors (_check_tensors): exactly the float32 parameters param_shapes(cfg) names,
 *      with both AdamW moments of each when optim.t is there; a sinusoidal table no larger than
 *      max(stored parameters, _MAX_TABLE). The expected names are generated one at a time and
 *      looked up, so a config claiming 2^60 layers fails at the first missing tensor.
 * Only then are the parameters copied (the memory reader) or read with pread (the file
 * reader) into one 64-byte aligned allocation, in param_shapes order. Every size is an int64
 * formed through pytfm__mul_within / pytfm__add_within.
 */
#if defined(__linux__) || defined(__unix__) || defined(__APPLE__)
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "core/internal.h"
#include "json.h"

enum {
    MAX_NDIM = 32,        /* _MAX_NDIM: NumPy 1.x's limit */
    MAX_TABLE = 1 << 24,  /* _MAX_TABLE: sinusoidal floats allowed beyond the parameters */
    MAX_STEP_DIGITS = 19, /* _count_field: [0-9]{1,19} */
    SHOW = 48             /* bytes of a value from the file shown in a message */
};
#define MAX_HEADER 100000000u /* bytes: the reference implementation's limit */

enum { DTYPE_F32, DTYPE_I64 };

/* One tensor entry of the header, checked on its own (check_entry). */
typedef struct entry {
    const char *name; /* unescaped UTF-8, in reader.names */
    size_t name_len;
    pytfm__json shape; /* its JSON array: ints that fit in int64 once checked */
    int64_t begin, end;
    size_t index; /* in header order */
    int dtype;
    int ndim;
    int matched; /* one of the expected tensors */
} entry;

/* A metadata field: its string value, present or not. */
typedef struct field {
    int present;
    pytfm__json value;
} field;

typedef struct reader {
    const char *source; /* names the file in messages */
    const char *header; /* the header's JSON text, header_size bytes */
    size_t header_size;
    int64_t body; /* bytes of data after the header */
    entry *entries;
    size_t n_entries;
    char *names; /* the entries' names, unescaped */
    field format, config, step, optim_t, extra;
    char *text;             /* the config, then extra, unescaped: their JSON texts */
    pytfm_model_config cfg; /* as checked */
    char seed_shown[SHOW];  /* the config's seed, for messages */
    int with_optimizer;     /* optim.t is there */
    const entry **plan;     /* the parameters' entries, in param_shapes order */
    size_t n_plan;
} reader;

/* "<source>: <message>" as this thread's last error */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static pytfm_status
fail(const reader *r, pytfm_status status, const char *fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    /* a long path keeps its end (the file name) and leaves room for what is wrong */
    const char *source = r->source;
    const size_t len = strlen(source);
    const char *cut = "";
    if (len > 160) {
        source += len - 157;
        while ((*source & 0xC0) == 0x80) source++;
        cut = "...";
    }
    return pytfm__fail(status, "%s%s: %s", cut, source, message);
}
#define BAD(r, ...) fail(r, PYTFM_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

/* 'name', cut to SHOW bytes on a character boundary, control bytes as '?' (as Python's repr
 * shows a name, within reason) */
static const char *show_name(const char *name, size_t len, char *buf) {
    size_t n = len;
    int cut = 0;
    if (n > SHOW - 6) {
        n = SHOW - 6;
        while (n > 0 && ((unsigned char)name[n] & 0xC0) == 0x80) n--;
        cut = 1;
    }
    buf[0] = '\'';
    for (size_t i = 0; i < n; i++) buf[1 + i] = (unsigned char)name[i] < 0x20 ? '?' : name[i];
    snprintf(buf + 1 + n, 5, "%s'", cut ? "..." : "");
    return buf;
}

static const char *show(pytfm__json v, char *buf) { return pytfm__json_show(v, buf, SHOW); }

/* ---- 1. the safetensors layer ------------------------------------------------------------- */

/* the length N of the header in the first 8 bytes of a file of size bytes */
static pytfm_status check_length(reader *r, const unsigned char *head, size_t got, uint64_t size,
                                 uint64_t *n) {
    if (got < 8) return BAD(r, "%zu bytes is too short for a safetensors file", got);
    uint64_t length = 0;
    for (int i = 7; i >= 0; i--) length = length << 8 | head[i];
    if (size < 8 || length > size - 8)
        return BAD(r, "header of %llu bytes runs past the end of the file (%llu bytes): truncated?",
                   (unsigned long long)length, (unsigned long long)size);
    if (length > MAX_HEADER)
        return BAD(r, "header of %llu bytes is over the %u-byte limit", (unsigned long long)length,
                   MAX_HEADER);
    *n = length;
    return PYTFM_STATUS_OK;
}

static pytfm_status check_metadata(reader *r, const pytfm__json *meta) {
    if (!meta) return PYTFM_STATUS_OK; /* no __metadata__: {} */
    char a[SHOW], b[SHOW];
    if (pytfm__json_kind_of(*meta) != PYTFM__JSON_OBJECT)
        return BAD(r, "__metadata__ is a JSON %s, not an object of strings",
                   pytfm__json_kind_name(pytfm__json_kind_of(*meta)));
    static const char *const keys[] = {"format", "config", "step", "optim.t", "extra"};
    field *fields[] = {&r->format, &r->config, &r->step, &r->optim_t, &r->extra};
    pytfm__json_iter it = pytfm__json_iter_of(*meta);
    pytfm__json key, value;
    while (pytfm__json_next(&it, &key, &value)) {
        if (pytfm__json_kind_of(value) != PYTFM__JSON_STRING || pytfm__json_string_lone(value))
            return BAD(r, "__metadata__[%s] is %s, not a string", show(key, a), show(value, b));
        for (size_t k = 0; k < 5; k++)
            if (pytfm__json_string_is(key, keys[k])) *fields[k] = (field){1, value};
    }
    return PYTFM_STATUS_OK;
}

/* 1 when v is a JSON integer >= 0 ("-0" included); *fits, *value as pytfm__json_integer */
static int non_negative_int(pytfm__json v, int *fits, int64_t *value) {
    if (pytfm__json_kind_of(v) != PYTFM__JSON_NUMBER) return 0;
    const pytfm__json_int i = pytfm__json_integer(v);
    if (!i.integer || (i.negative && !(i.fits && i.value == 0))) return 0;
    *fits = i.fits;
    *value = i.fits ? i.value : 0;
    return 1;
}

/* one tensor entry {dtype, shape, data_offsets}, on its own (_check_entry) */
static pytfm_status check_entry(reader *r, pytfm__json key, pytfm__json info, entry *e,
                                char **names) {
    char where[SHOW], a[SHOW], b[SHOW];
    e->name = *names;
    e->name_len = pytfm__json_string_utf8(key, *names, NULL);
    *names += e->name_len;
    show_name(e->name, e->name_len, where);
    if (pytfm__json_kind_of(info) != PYTFM__JSON_OBJECT)
        return BAD(r, "tensor %s: its entry is a JSON %s, not an object", where,
                   pytfm__json_kind_name(pytfm__json_kind_of(info)));
    pytfm__json dtype = {0}, shape = {0}, offsets = {0}, k, v, unknown = {0};
    int have_dtype = 0, have_shape = 0, have_offsets = 0;
    pytfm__json_iter it = pytfm__json_iter_of(info);
    while (pytfm__json_next(&it, &k, &v)) {
        if (pytfm__json_string_is(k, "dtype"))
            dtype = v, have_dtype = 1;
        else if (pytfm__json_string_is(k, "shape"))
            shape = v, have_shape = 1;
        else if (pytfm__json_string_is(k, "data_offsets"))
            offsets = v, have_offsets = 1;
        else if (!unknown.p || pytfm__json_string_compare(k, unknown) < 0)
            unknown = k; /* the first in code point order, as Python's sorted() names it */
    }
    if (!have_offsets) return BAD(r, "tensor %s: its entry has no data_offsets", where);
    if (!have_dtype) return BAD(r, "tensor %s: its entry has no dtype", where);
    if (!have_shape) return BAD(r, "tensor %s: its entry has no shape", where);
    if (unknown.p)
        return BAD(r, "tensor %s: its entry has an unknown key %s", where, show(unknown, a));

    if (pytfm__json_string_is(dtype, "F32"))
        e->dtype = DTYPE_F32;
    else if (pytfm__json_string_is(dtype, "I64"))
        e->dtype = DTYPE_I64;
    else
        return BAD(r, "tensor %s: unsupported dtype %s (pytfm reads F32, I64)", where,
                   show(dtype, a));

    /* the shape's ints; its bytes, as NumPy would count them (_nbytes): the product of the
     * non-zero dimensions and the item size must fit in int64, even for an empty array */
    int ok = pytfm__json_kind_of(shape) == PYTFM__JSON_ARRAY, empty = 0, fits_all = 1;
    int64_t nbytes = e->dtype == DTYPE_F32 ? 4 : 8;
    size_t ndim = 0;
    it = pytfm__json_iter_of(shape);
    while (ok && pytfm__json_next(&it, NULL, &v)) {
        int fits = 0;
        int64_t d = 0;
        ok = non_negative_int(v, &fits, &d);
        ndim++;
        if (!ok) break;
        empty |= fits && d == 0;
        if (!fits || !pytfm__mul_within(nbytes, d ? d : 1, INT64_MAX, &nbytes)) fits_all = 0;
    }
    if (!ok)
        return BAD(r, "tensor %s: shape %s is not a list of non-negative ints", where,
                   show(shape, a));
    if (ndim > MAX_NDIM)
        return BAD(r, "tensor %s: %zu dimensions, NumPy allows %d", where, ndim, MAX_NDIM);
    e->shape = shape;
    e->ndim = (int)ndim;

    pytfm__json begin_v, end_v;
    pytfm__json_iter pair = pytfm__json_iter_of(offsets);
    pytfm__json_int begin = {0}, end = {0};
    int pair_ok =
        pytfm__json_kind_of(offsets) == PYTFM__JSON_ARRAY && pytfm__json_count(offsets) == 2;
    if (pair_ok) {
        pytfm__json_next(&pair, NULL, &begin_v);
        pytfm__json_next(&pair, NULL, &end_v);
        pair_ok = pytfm__json_kind_of(begin_v) == PYTFM__JSON_NUMBER &&
                  pytfm__json_kind_of(end_v) == PYTFM__JSON_NUMBER;
    }
    if (pair_ok) {
        begin = pytfm__json_integer(begin_v);
        end = pytfm__json_integer(end_v);
        pair_ok = begin.integer && end.integer;
    }
    if (!pair_ok)
        return BAD(r, "tensor %s: data_offsets %s is not a pair of ints", where, show(offsets, a));
    /* 0 <= begin <= end, on ints of any size: a negative one, or a begin past int64 with an
     * end within it, fails here; an end past int64 runs past the data below */
    const int begin_neg = begin.negative && !(begin.fits && begin.value == 0);
    const int end_neg = end.negative && !(end.fits && end.value == 0);
    if (begin_neg || end_neg || (end.fits && (!begin.fits || begin.value > end.value)))
        return BAD(r, "tensor %s: data_offsets %s are negative or reversed", where,
                   show(offsets, a));
    if (!end.fits || end.value > r->body)
        return BAD(r,
                   "tensor %s: data_offsets %s run past the end of the data (%lld bytes): "
                   "truncated file?",
                   where, show(offsets, a), (long long)r->body);
    if (!fits_all)
        return BAD(r, "tensor %s: shape %s is too large for NumPy", where, show(shape, a));
    if (empty) nbytes = 0;
    e->begin = begin.value;
    e->end = end.value;
    if (nbytes != e->end - e->begin)
        return BAD(r, "tensor %s: %s%s is %lld bytes, but its data_offsets %s hold %lld", where,
                   e->dtype == DTYPE_F32 ? "F32" : "I64", show(shape, a), (long long)nbytes,
                   show(offsets, b), (long long)(e->end - e->begin));
    return PYTFM_STATUS_OK;
}

static int by_offsets(const void *x, const void *y) {
    const entry *a = x, *b = y;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index; /* Python's sort is stable */
}

/* the entries' data, in offset order, tile the data exactly (_check_layout) */
static pytfm_status check_layout(reader *r) {
    if (r->n_entries > 1) qsort(r->entries, r->n_entries, sizeof *r->entries, by_offsets);
    int64_t at = 0;
    const entry *previous = NULL;
    char a[SHOW], b[SHOW + 8];
    for (size_t i = 0; i < r->n_entries; i++) {
        const entry *e = &r->entries[i];
        if (e->begin != at) {
            char after[SHOW + 16] = "the start of the data";
            if (previous)
                snprintf(after, sizeof after, "tensor %s",
                         show_name(previous->name, previous->name_len, b));
            if (e->begin < at)
                return BAD(r,
                           "tensor %s (data_offsets [%lld, %lld]) overlaps %s, which ends at %lld",
                           show_name(e->name, e->name_len, a), (long long)e->begin,
                           (long long)e->end, after, (long long)at);
            return BAD(r,
                       "tensor %s (data_offsets [%lld, %lld]) leaves a gap of %lld bytes after "
                       "%s, which ends at %lld",
                       show_name(e->name, e->name_len, a), (long long)e->begin, (long long)e->end,
                       (long long)(e->begin - at), after, (long long)at);
        }
        at = e->end;
        previous = e;
    }
    if (at != r->body)
        return BAD(r, "the last %lld of the %lld data bytes belong to no tensor",
                   (long long)(r->body - at), (long long)r->body);
    return PYTFM_STATUS_OK;
}

/* the header: JSON, __metadata__, each entry, the layout (_read_header) */
static pytfm_status check_header(reader *r) {
    const char *why = "";
    const size_t bad = pytfm__utf8_check(r->header, r->header_size, &why);
    if (bad < r->header_size) return BAD(r, "the header is not UTF-8 (byte %zu: %s)", 8 + bad, why);
    pytfm__json_error err;
    const pytfm_status st = pytfm__json_check(r->header, r->header_size, &err);
    if (st == PYTFM_STATUS_OUT_OF_MEMORY)
        return fail(r, st, "cannot check the header: %s", err.what);
    if (st != PYTFM_STATUS_OK)
        return BAD(r, "the header is not valid JSON (%s: byte %zu)", err.what, 8 + err.offset);
    const pytfm__json root = pytfm__json_root(r->header, r->header_size);
    if (pytfm__json_kind_of(root) != PYTFM__JSON_OBJECT)
        return BAD(r, "the header is a JSON %s, not an object",
                   pytfm__json_kind_name(pytfm__json_kind_of(root)));

    /* __metadata__ first, wherever it is (Python pops it before it looks at the entries) */
    pytfm__json key, value, meta = {0};
    size_t names = 0;
    pytfm__json_iter it = pytfm__json_iter_of(root);
    while (pytfm__json_next(&it, &key, &value)) {
        if (pytfm__json_string_is(key, "__metadata__"))
            meta = value;
        else
            names += key.n; /* its unescaped name is no longer */
    }
    PYTFM_TRY(check_metadata(r, meta.p ? &meta : NULL));

    /* the list of entries grows as they pass: a header of a million bare "k": 1 members is
     * refused at the first, before a list of a million entries is made */
    size_t cap = 0;
    r->names = malloc(names ? names : 1);
    if (!r->names)
        return fail(r, PYTFM_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes of names", names);
    char *name = r->names;
    it = pytfm__json_iter_of(root);
    while (pytfm__json_next(&it, &key, &value)) {
        if (pytfm__json_string_is(key, "__metadata__")) continue;
        if (r->n_entries == cap) {
            cap = cap ? 2 * cap : 64;
            entry *grown =
                cap <= SIZE_MAX / sizeof *grown ? realloc(r->entries, cap * sizeof *grown) : NULL;
            if (!grown)
                return fail(r, PYTFM_STATUS_OUT_OF_MEMORY, "cannot allocate a list of %zu tensors",
                            cap);
            r->entries = grown;
        }
        entry *e = &r->entries[r->n_entries];
        *e = (entry){.index = r->n_entries};
        PYTFM_TRY(check_entry(r, key, value, e, &name));
        r->n_entries++;
    }
    return check_layout(r);
}

/* ---- 2. the pytfm layer ------------------------------------------------------------------- */

/* the value of a metadata field, unescaped into r->text at *at: its JSON text */
static const char *unescape(reader *r, field f, size_t *at, size_t *len) {
    char *out = r->text + *at;
    *len = pytfm__json_string_utf8(f.value, out, NULL);
    *at += *len;
    return out;
}

/* a non-negative int64 written in decimal (_count_field: [0-9]{1,19}, ASCII digits) */
static pytfm_status count_field(reader *r, const char *key, field f, int64_t *value) {
    char shown[SHOW], digits[6 * MAX_STEP_DIGITS + 2]; /* each digit may be escaped: \u0031 */
    size_t n = 0;
    if (f.value.n <= sizeof digits) n = pytfm__json_string_utf8(f.value, digits, NULL);
    int ok = n >= 1 && n <= MAX_STEP_DIGITS;
    uint64_t v = 0;
    for (size_t i = 0; ok && i < n; i++) {
        ok = digits[i] >= '0' && digits[i] <= '9';
        v = v * 10 + (uint64_t)(digits[i] - '0'); /* 19 digits fit in a uint64_t */
    }
    if (!ok || v > (uint64_t)INT64_MAX)
        return BAD(r, "%s is %s, not a non-negative int64", key, show(f.value, shown));
    *value = (int64_t)v;
    return PYTFM_STATUS_OK;
}

/* a metadata field's JSON text, checked; *root its value */
static pytfm_status json_field(reader *r, const char *key, field f, size_t *at, pytfm__json *root) {
    size_t len = 0;
    const char *text = unescape(r, f, at, &len);
    pytfm__json_error err;
    const pytfm_status st = pytfm__json_check(text, len, &err);
    if (st == PYTFM_STATUS_OUT_OF_MEMORY) return fail(r, st, "cannot check %s: %s", key, err.what);
    if (st != PYTFM_STATUS_OK)
        return BAD(r, "%s is not valid JSON (%s: byte %zu)", key, err.what, err.offset);
    *root = pytfm__json_root(text, len);
    return PYTFM_STATUS_OK;
}

static const char *const CONFIG_FIELDS[] = {"vocab",   "d_model", "n_layer",        "n_head",
                                            "max_seq", "pos",     "tie_embeddings", "seed"};
enum { N_FIELDS = 8, POS = 5, TIE = 6, SEED = 7 };

/* the config as GPTConfig(**config) checks it (__post_init__) */
static pytfm_status check_config(reader *r, const pytfm__json *values) {
    char a[SHOW];
    int64_t ints[N_FIELDS] = {0};
    for (size_t k = 0; k < N_FIELDS; k++) {
        if (k == POS || k == TIE) continue;
        const pytfm__json v = values[k];
        const pytfm__json_int i = pytfm__json_kind_of(v) == PYTFM__JSON_NUMBER
                                      ? pytfm__json_integer(v)
                                      : (pytfm__json_int){0, 0, 0, 0};
        if (!i.integer)
            return BAD(r, "config: GPTConfig.%s must be an int, got %s", CONFIG_FIELDS[k],
                       show(v, a));
        if (k == SEED) {
            if (i.negative && !(i.fits && i.value == 0))
                return BAD(r, "config: GPTConfig.seed must be a non-negative int, got %s",
                           show(v, a));
            if (i.fits)
                snprintf(r->seed_shown, sizeof r->seed_shown, "%lld", (long long)i.value);
            else
                show(v, r->seed_shown);
        } else if (!i.fits || i.value < 1) {
            return BAD(r, "config: GPTConfig.%s must be a positive int (below 2**63), got %s",
                       CONFIG_FIELDS[k], show(v, a));
        }
        ints[k] = i.value;
    }
    const pytfm__json pos = values[POS], tie = values[TIE];
    if (pytfm__json_kind_of(pos) != PYTFM__JSON_STRING)
        return BAD(r, "config: GPTConfig.pos must be a str, got %s", show(pos, a));
    if (pytfm__json_string_is(pos, "rope"))
        r->cfg.pos = PYTFM_POS_ROPE;
    else if (pytfm__json_string_is(pos, "sinusoidal"))
        r->cfg.pos = PYTFM_POS_SINUSOIDAL;
    else if (pytfm__json_string_is(pos, "none"))
        r->cfg.pos = PYTFM_POS_NONE;
    else
        return BAD(r, "config: GPTConfig.pos must be one of ('rope', 'sinusoidal', 'none'), got %s",
                   show(pos, a));
    if (pytfm__json_kind_of(tie) != PYTFM__JSON_BOOL)
        return BAD(r, "config: GPTConfig.tie_embeddings must be a bool, got %s", show(tie, a));
    r->cfg.tie_embeddings = tie.p[0] == 't';
    r->cfg.vocab = ints[0];
    r->cfg.d_model = ints[1];
    r->cfg.n_layer = ints[2];
    r->cfg.n_head = ints[3];
    r->cfg.max_seq = ints[4];
    const int64_t C = r->cfg.d_model, H = r->cfg.n_head;
    if (C % H)
        return BAD(r, "config: d_model (%lld) must be a multiple of n_head (%lld)", (long long)C,
                   (long long)H);
    if (r->cfg.pos == PYTFM_POS_ROPE && (C / H) % 2)
        return BAD(r, "config: rope needs an even head dim, got %lld", (long long)(C / H));
    if (r->cfg.pos == PYTFM_POS_SINUSOIDAL && C % 2)
        return BAD(r, "config: sinusoidal positions need an even d_model, got %lld", (long long)C);
    return PYTFM_STATUS_OK;
}

/* __metadata__'s pytfm fields (_check_pytfm_metadata) */
static pytfm_status check_pytfm(reader *r) {
    if (!r->format.present || !pytfm__json_string_is(r->format.value, "pytfm") ||
        !r->config.present)
        return BAD(r, "not a pytfm checkpoint (no pytfm config in __metadata__)");
    r->text = malloc(r->config.value.n + (r->extra.present ? r->extra.value.n : 0) + 1);
    if (!r->text) return fail(r, PYTFM_STATUS_OUT_OF_MEMORY, "cannot allocate the config's text");
    size_t at = 0;
    pytfm__json config, key, value;
    PYTFM_TRY(json_field(r, "config", r->config, &at, &config));
    if (pytfm__json_kind_of(config) != PYTFM__JSON_OBJECT)
        return BAD(r, "config is a JSON %s, not an object",
                   pytfm__json_kind_name(pytfm__json_kind_of(config)));
    pytfm__json values[N_FIELDS] = {{0}};
    pytfm__json unknown = {0};
    pytfm__json_iter it = pytfm__json_iter_of(config);
    while (pytfm__json_next(&it, &key, &value)) {
        size_t k = 0;
        while (k < N_FIELDS && !pytfm__json_string_is(key, CONFIG_FIELDS[k])) k++;
        if (k < N_FIELDS)
            values[k] = value;
        else if (!unknown.p)
            unknown = key;
    }
    for (size_t k = 0; k < N_FIELDS; k++)
        if (!values[k].p) return BAD(r, "config has no %s", CONFIG_FIELDS[k]);
    char a[SHOW];
    if (unknown.p) return BAD(r, "config has an unknown field %s", show(unknown, a));
    PYTFM_TRY(check_config(r, values));

    if (!r->step.present) return BAD(r, "__metadata__ has no step");
    PYTFM_TRY(count_field(r, "step", r->step, &r->cfg.step));
    if (r->optim_t.present) {
        int64_t t = 0;
        PYTFM_TRY(count_field(r, "optim.t", r->optim_t, &t));
        r->with_optimizer = 1;
    }
    if (r->extra.present) PYTFM_TRY(json_field(r, "extra", r->extra, &at, &value));
    return PYTFM_STATUS_OK;
}

/* ---- 3. the tensors ----------------------------------------------------------------------- */

/* The parameters of param_shapes(cfg), one at a time: layer −1 is the token embedding; layers
 * 0 .. n_layer − 1 have 12 slots each; layer n_layer, the tail, has the final LayerNorm's two
 * and, untied, the LM head. */
typedef struct walk {
    int64_t layer;
    int slot;
} walk;

typedef struct expected {
    char name[96];
    int ndim;
    int64_t shape[2];
    int valid; /* the shape's sizes fit in int64 (else no stored tensor can have them) */
} expected;

/* the parameter at w, or 0 past the last */
static int expected_at(const pytfm_model_config *cfg, walk w, expected *x) {
    static const char *const parts[12] = {
        "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
        "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    /* each part's shape in units of C: [rows·C] or [rows·C, cols·C] (a Linear's [out, in]) */
    static const int rows[12] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1};
    static const int cols[12] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 0};
    const int64_t C = cfg->d_model;
    x->valid = 1;
    x->shape[1] = C;
    if (w.layer < 0) {
        snprintf(x->name, sizeof x->name, "transformer.wte.weight");
        x->ndim = 2, x->shape[0] = cfg->vocab;
        return 1;
    }
    if (w.layer < cfg->n_layer) {
        snprintf(x->name, sizeof x->name, "transformer.h.%lld.%s", (long long)w.layer,
                 parts[w.slot]);
        x->ndim = cols[w.slot] ? 2 : 1;
        x->valid = pytfm__mul_within(rows[w.slot], C, INT64_MAX, &x->shape[0]) &&
                   pytfm__mul_within(cols[w.slot] ? cols[w.slot] : 1, C, INT64_MAX, &x->shape[1]);
        return 1;
    }
    if (w.slot < 2) {
        snprintf(x->name, sizeof x->name, "transformer.ln_f.%s", w.slot ? "bias" : "weight");
        x->ndim = 1, x->shape[0] = C;
        return 1;
    }
    if (w.slot == 2 && !cfg->tie_embeddings) {
        snprintf(x->name, sizeof x->name, "lm_head.weight");
        x->ndim = 2, x->shape[0] = cfg->vocab;
        return 1;
    }
    return 0;
}

static walk next_slot(const pytfm_model_config *cfg, walk w) {
    if (w.layer < 0) return (walk){0, 0};
    if (w.layer < cfg->n_layer && w.slot == 11) return (walk){w.layer + 1, 0};
    return (walk){w.layer, w.slot + 1};
}

static int by_name(const void *x, const void *y) {
    const entry *a = x, *b = y;
    const int order = memcmp(a->name, b->name, PYTFM_MIN(a->name_len, b->name_len));
    if (order) return order;
    return a->name_len < b->name_len ? -1 : a->name_len > b->name_len;
}

static entry *lookup(const reader *r, const char *name) {
    const entry key = {.name = name, .name_len = strlen(name)};
    if (!r->n_entries) return NULL; /* no list to search (nor to pass to bsearch) */
    return bsearch(&key, r->entries, r->n_entries, sizeof *r->entries, by_name);
}

/* Python's repr of asdict(cfg) */
static const char *show_config(const reader *r, char *buf, size_t cap) {
    static const char *const pos[] = {"rope", "sinusoidal", "none"};
    const pytfm_model_config *c = &r->cfg;
    snprintf(buf, cap,
             "{'vocab': %lld, 'd_model': %lld, 'n_layer': %lld, 'n_head': %lld, 'max_seq': %lld, "
             "'pos': '%s', 'tie_embeddings': %s, 'seed': %s}",
             (long long)c->vocab, (long long)c->d_model, (long long)c->n_layer,
             (long long)c->n_head, (long long)c->max_seq, pos[c->pos],
             c->tie_embeddings ? "True" : "False", r->seed_shown);
    return buf;
}

static const char *show_shape(const expected *x, char *buf, size_t cap) {
    if (!x->valid) return snprintf(buf, cap, "[more than int64 holds]"), buf;
    if (x->ndim == 1)
        snprintf(buf, cap, "[%lld]", (long long)x->shape[0]);
    else
        snprintf(buf, cap, "[%lld, %lld]", (long long)x->shape[0], (long long)x->shape[1]);
    return buf;
}

/* the stored tensor key is float32 of x's shape */
static pytfm_status check_one(reader *r, const char *key, const expected *x, const entry **found) {
    char config[320], want[64], got[SHOW];
    entry *e = lookup(r, key);
    if (!e)
        return BAD(r, "tensor %s is missing: config %s needs float32%s", key,
                   show_config(r, config, sizeof config), show_shape(x, want, sizeof want));
    int same = x->valid && e->dtype == DTYPE_F32 && e->ndim == x->ndim;
    pytfm__json_iter it = pytfm__json_iter_of(e->shape);
    pytfm__json dim;
    for (int d = 0; same && pytfm__json_next(&it, NULL, &dim); d++)
        same = pytfm__json_integer(dim).value == x->shape[d];
    if (!same)
        return BAD(r, "%s is %s%s, config %s needs float32%s", key,
                   e->dtype == DTYPE_F32 ? "float32" : "int64", show(e->shape, got),
                   show_config(r, config, sizeof config), show_shape(x, want, sizeof want));
    e->matched = 1;
    *found = e;
    return PYTFM_STATUS_OK;
}

static pytfm_status check_tensors(reader *r) {
    if (r->n_entries > 1) qsort(r->entries, r->n_entries, sizeof *r->entries, by_name);
    r->plan = malloc((r->n_entries ? r->n_entries : 1) * sizeof *r->plan);
    if (!r->plan) return fail(r, PYTFM_STATUS_OUT_OF_MEMORY, "cannot allocate a tensor list");
    int64_t count = 0;
    expected x;
    for (walk w = {-1, 0}; expected_at(&r->cfg, w, &x); w = next_slot(&r->cfg, w)) {
        char key[128];
        const entry *e = NULL, *moment = NULL;
        PYTFM_TRY(check_one(r, x.name, &x, &e));
        for (int m = 0; r->with_optimizer && m < 2; m++) {
            snprintf(key, sizeof key, "optim.%c.%s", m ? 'v' : 'm', x.name);
            PYTFM_TRY(check_one(r, key, &x, &moment));
        }
        r->plan[r->n_plan++] = e; /* each stored tensor is matched once: n_plan <= n_entries */
        /* its bytes are within the data, so its floats (and their sum) are within int64 */
        int64_t numel = x.shape[0];
        if (x.ndim == 2) pytfm__mul_within(numel, x.shape[1], INT64_MAX, &numel);
        pytfm__add_within(count, numel, INT64_MAX, &count);
    }
    size_t unexpected = 0;
    const entry *first[3] = {NULL, NULL, NULL};
    for (size_t i = 0; i < r->n_entries; i++) {
        const entry *e = &r->entries[i];
        if (e->matched) continue;
        unexpected++;
        /* the first three in header order */
        for (int k = 0; k < 3; k++) {
            if (!first[k] || e->index < first[k]->index) {
                for (int j = 2; j > k; j--) first[j] = first[j - 1];
                first[k] = e;
                break;
            }
        }
    }
    if (unexpected) {
        char names[3][SHOW], config[320], more[48] = "";
        if (unexpected > 3) snprintf(more, sizeof more, " and %zu more", unexpected - 3);
        for (int k = 0; k < 3; k++)
            if (first[k]) show_name(first[k]->name, first[k]->name_len, names[k]);
        return BAD(r, "unexpected tensors %s%s%s%s%s%s (config %s%s)", names[0],
                   first[1] ? ", " : "", first[1] ? names[1] : "", first[2] ? ", " : "",
                   first[2] ? names[2] : "", more, show_config(r, config, sizeof config),
                   r->with_optimizer ? "" : ", no optim.t");
    }
    if (r->cfg.pos == PYTFM_POS_SINUSOIDAL) {
        int64_t table = 0;
        const int fits = pytfm__mul_within(r->cfg.max_seq, r->cfg.d_model, INT64_MAX, &table);
        if (!fits || table > (count > MAX_TABLE ? count : MAX_TABLE)) {
            char config[320], size[32] = "more than 2**63";
            if (fits) snprintf(size, sizeof size, "%lld", (long long)table);
            return BAD(r,
                       "config %s needs a sinusoidal table of %s floats for %lld stored "
                       "parameters",
                       show_config(r, config, sizeof config), size, (long long)count);
        }
    }
    r->cfg.n_params = count;
    return PYTFM_STATUS_OK;
}

/* ---- reading the parameters --------------------------------------------------------------- */

/* the data is little-endian: a big-endian host swaps each float's bytes */
static void to_host_order(float *p, int64_t count) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    if (first == 1) return;
    unsigned char *b = (unsigned char *)p;
    for (int64_t i = 0; i < count; i++, b += 4) {
        unsigned char t = b[0];
        b[0] = b[3], b[3] = t;
        t = b[1], b[1] = b[2], b[2] = t;
    }
}

static pytfm_status alloc_params(reader *r, float **params) {
    enum { ALIGN = 64 };
    /* n_params floats lie in the data, which is in memory or in a file: the product fits */
    const int64_t bytes = r->cfg.n_params * (int64_t)sizeof(float);
    if ((uint64_t)bytes > SIZE_MAX - ALIGN)
        return fail(r, PYTFM_STATUS_OUT_OF_MEMORY, "cannot allocate %lld bytes of parameters",
                    (long long)bytes);
    *params = aligned_alloc(ALIGN, ((size_t)bytes + ALIGN - 1) / ALIGN * ALIGN);
    if (!*params)
        return fail(r, PYTFM_STATUS_OUT_OF_MEMORY, "cannot allocate %lld bytes of parameters",
                    (long long)bytes);
    return PYTFM_STATUS_OK;
}

static void free_reader(reader *r) {
    free(r->entries);
    free(r->names);
    free(r->text);
    free(r->plan);
}

/* every check, in order, on a header already in r; then the parameters' allocation */
static pytfm_status check_all(reader *r, float **params) {
    PYTFM_TRY(check_header(r));
    PYTFM_TRY(check_pytfm(r));
    PYTFM_TRY(check_tensors(r));
    return alloc_params(r, params);
}

pytfm_status pytfm__weights_read_memory(pytfm__weights *w, const void *data, size_t size,
                                        const char *source) {
    if (!w) return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: w must not be NULL", __func__);
    memset(w, 0, sizeof *w);
    reader r = {.source = source ? source : "<memory>"};
    if (!data && size) return BAD(&r, "data is NULL but size is %zu", size);
    const unsigned char *bytes = data;
    uint64_t n = 0;
    PYTFM_TRY(check_length(&r, bytes, size < 8 ? size : 8, size, &n));
    if (size - 8 - n > (uint64_t)INT64_MAX) return BAD(&r, "%zu bytes is too large", size);
    r.header = (const char *)bytes + 8;
    r.header_size = (size_t)n;
    r.body = (int64_t)(size - 8 - n);
    float *params = NULL;
    pytfm_status st = check_all(&r, &params);
    if (st == PYTFM_STATUS_OK) {
        const unsigned char *body = bytes + 8 + n;
        int64_t at = 0;
        for (size_t i = 0; i < r.n_plan; i++) {
            const entry *e = r.plan[i];
            memcpy(params + at, body + e->begin, (size_t)(e->end - e->begin));
            at += (e->end - e->begin) / (int64_t)sizeof(float);
        }
        to_host_order(params, r.cfg.n_params);
        w->config = r.cfg;
        w->params = params;
    }
    free_reader(&r);
    return st;
}

/* len bytes at offset of fd into buf, *got of them before the end of the file */
static pytfm_status read_at(const reader *r, int fd, void *buf, size_t len, int64_t offset,
                            size_t *got) {
    *got = 0;
    while (*got < len) {
        const size_t chunk = PYTFM_MIN(len - *got, (size_t)1 << 30);
        const ssize_t k = pread(fd, (char *)buf + *got, chunk, (off_t)offset + (off_t)*got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            char why[128] = "unknown error";
            strerror_r(errno, why, sizeof why);
            return BAD(r, "cannot read: %s", why);
        }
        if (k == 0) break;
        *got += (size_t)k;
    }
    return PYTFM_STATUS_OK;
}

/* the checks of the file open as fd, then its parameters read into *params */
static pytfm_status read_fd(reader *r, int fd, char **header, float **params) {
    struct stat sb;
    char why[128] = "unknown error";
    if (fstat(fd, &sb) != 0) {
        strerror_r(errno, why, sizeof why);
        return BAD(r, "cannot stat: %s", why);
    }
    if (!S_ISREG(sb.st_mode)) return BAD(r, "not a regular file");
    /* opened O_NONBLOCK (see pytfm__weights_read_file); a regular file reads the same either
     * way, but clear it so that every read below is an ordinary blocking one */
    const int flags = fcntl(fd, F_GETFL);
    if (flags == -1 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == -1) {
        strerror_r(errno, why, sizeof why);
        return BAD(r, "cannot clear O_NONBLOCK: %s", why);
    }
    const uint64_t size = (uint64_t)sb.st_size;
    unsigned char head[8];
    size_t got = 0;
    uint64_t n = 0;
    PYTFM_TRY(read_at(r, fd, head, 8, 0, &got));
    PYTFM_TRY(check_length(r, head, got, size, &n));
    *header = malloc(n ? (size_t)n : 1);
    if (!*header)
        return fail(r, PYTFM_STATUS_OUT_OF_MEMORY, "cannot allocate %llu bytes for the header",
                    (unsigned long long)n);
    PYTFM_TRY(read_at(r, fd, *header, (size_t)n, 8, &got));
    if (got < n) return BAD(r, "the file shrank while it was being read");
    r->header = *header;
    r->header_size = (size_t)n;
    r->body = (int64_t)(size - 8 - n);
    PYTFM_TRY(check_all(r, params));
    int64_t at = 0;
    for (size_t i = 0; i < r->n_plan; i++) {
        const entry *e = r->plan[i];
        const size_t len = (size_t)(e->end - e->begin);
        PYTFM_TRY(read_at(r, fd, *params + at, len, 8 + (int64_t)n + e->begin, &got));
        if (got < len) {
            char name[SHOW];
            return BAD(r, "the file ended inside tensor %s (it shrank while it was being read)",
                       show_name(e->name, e->name_len, name));
        }
        at += (int64_t)(len / sizeof(float));
    }
    to_host_order(*params, r->cfg.n_params);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm__weights_read_file(pytfm__weights *w, const char *path) {
    if (!w) return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: w must not be NULL", __func__);
    memset(w, 0, sizeof *w);
    if (!path)
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: path must not be NULL", __func__);
    reader r = {.source = path};
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait, forever, for a writer,
     * before read_fd's fstat could refuse it as not a regular file; O_NOCTTY: a terminal
     * named by path must not become the process's controlling terminal */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        char why[128] = "unknown error";
        strerror_r(errno, why, sizeof why);
        return BAD(&r, "cannot open: %s", why);
    }
    char *header = NULL;
    float *params = NULL;
    const pytfm_status st = read_fd(&r, fd, &header, &params);
    close(fd);
    free(header);
    free_reader(&r);
    if (st != PYTFM_STATUS_OK) {
        free(params);
        return st;
    }
    w->config = r.cfg;
    w->params = params;
    return PYTFM_STATUS_OK;
}
