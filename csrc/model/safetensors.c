/*
 * safetensors.c — layer 1 of the checkpoint reader: a safetensors file, trusting no byte of it
 * (the rules are pytfm_model.h's, "Safetensors files").
 *
 * Opening checks, in this order, and stops at the first fault: the 8-byte header length (at
 * most the file less 8, at most PYTFM_SAFETENSORS_MAX_HEADER); the header's UTF-8 and JSON
 * (json.c); an object; its __metadata__, if any, an object of strings; each other member an
 * entry {dtype, shape, data_offsets} checked on its own, in header order; the entries' data,
 * in offset order, tiling the data exactly. Only the header is read (one allocation of at most
 * the file's size); the handle then keeps it, the entries (pointers into it), the names and
 * the metadata unescaped, and an index of the entries by name. A tensor's bytes are read when
 * asked for: with pread from a file, so that nothing is shared between readers of a handle.
 * Every size is an int64 formed through pytfm__mul_within / pytfm__add_within.
 */
#if defined(__linux__) || defined(__unix__) || defined(__APPLE__)
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64
#endif

#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"

enum { SHOW = PYTFM__SHOW, MAX_NDIM = PYTFM_SAFETENSORS_MAX_NDIM };
_Static_assert(sizeof((pytfm_tensor_info *)0)->shape == MAX_NDIM * sizeof(int64_t),
               "pytfm_tensor_info.shape holds PYTFM_SAFETENSORS_MAX_NDIM sizes");

/* the dtypes the reader takes: the header's name, the enum, the item size; the first
 * N_DTYPES always, the 16-bit floats after them only in a handle opened for them
 * (pytfm__st_openat_half: the Hugging Face Llama-family folders) */
static const struct {
    const char *name;
    int32_t dtype;
    int64_t size;
} DTYPES[] = {{"F32", PYTFM_DTYPE_F32, 4},
              {"I64", PYTFM_DTYPE_I64, 8},
              {"BF16", PYTFM_DTYPE_BF16, 2},
              {"F16", PYTFM_DTYPE_F16, 2}};
enum { N_DTYPES = 2, N_ALL_DTYPES = sizeof DTYPES / sizeof DTYPES[0] };

const char *pytfm__st_dtype_name(int32_t dtype) {
    for (size_t k = 0; k < N_ALL_DTYPES; k++)
        if (DTYPES[k].dtype == dtype) return DTYPES[k].name;
    return "?";
}

/* ---- messages ----------------------------------------------------------------------------- */

static pytfm_status vfail(const char *source, pytfm_status status, const char *fmt, va_list args) {
    char message[512];
    vsnprintf(message, sizeof message, fmt, args);
    if (!source) return pytfm__fail(status, "%s", message);
    /* a long path keeps its end (the file name) and leaves room for what is wrong */
    const size_t len = strlen(source);
    const char *cut = "";
    if (len > 160) {
        source += len - 157;
        while ((*source & 0xC0) == 0x80) source++;
        cut = "...";
    }
    return pytfm__fail(status, "%s%s: %s", cut, source, message);
}

pytfm_status pytfm__fail_at(const char *source, pytfm_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    const pytfm_status result = vfail(source, status, fmt, args);
    va_end(args);
    return result;
}

pytfm_status pytfm__st_fail(const pytfm_safetensors *st, pytfm_status status, const char *fmt,
                            ...) {
    va_list args;
    va_start(args, fmt);
    const pytfm_status result = vfail(st->source, status, fmt, args);
    va_end(args);
    return result;
}

#define BAD(st, ...) pytfm__st_fail(st, PYTFM_STATUS_INVALID_ARGUMENT, __VA_ARGS__)
#define NO_MEMORY(st, ...) pytfm__st_fail(st, PYTFM_STATUS_OUT_OF_MEMORY, __VA_ARGS__)

/* a system call failed: its message, and its errno kept in *io for the caller to leave */
static pytfm_status io_fail(const pytfm_safetensors *st, int *io, const char *what) {
    const int e = errno;
    char why[128] = "unknown error";
    strerror_r(e, why, sizeof why);
    *io = e;
    return BAD(st, "%s: %s", what, why);
}

const char *pytfm__st_show_name(const char *name, size_t len, char *buf) {
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

/* ---- the header length -------------------------------------------------------------------- */

/* The header length N from the first got bytes of a file of size bytes (head holds at least
 * 9 of them when the file has 9). A length past the end is a cut file when a JSON object
 * starts where the header would (byte 8), else a file of another kind. */
static pytfm_status check_length(const pytfm_safetensors *st, const unsigned char *head, size_t got,
                                 uint64_t size, uint64_t *n) {
    if (got < 8) return BAD(st, "%zu bytes is too short for a safetensors file", got);
    uint64_t length = 0;
    for (int i = 7; i >= 0; i--) length = length << 8 | head[i];
    if (size < 8 || length > size - 8) {
        if (got > 8 && head[8] != '{')
            return BAD(st, "not a safetensors file (it does not start with a header length and "
                           "a JSON object)");
        return BAD(st,
                   "header of %llu bytes runs past the end of the file (%llu bytes): truncated?",
                   (unsigned long long)length, (unsigned long long)size);
    }
    if (length > PYTFM_SAFETENSORS_MAX_HEADER)
        return BAD(st, "header of %llu bytes is over the %d-byte limit", (unsigned long long)length,
                   PYTFM_SAFETENSORS_MAX_HEADER);
    *n = length;
    return PYTFM_STATUS_OK;
}

/* ---- the header --------------------------------------------------------------------------- */

/* unescape the JSON string s into *text, NUL-terminated: -> its start; *len its bytes */
static const char *unescape_into(pytfm__json s, char **text, size_t *len) {
    char *out = *text;
    *len = pytfm__json_string_utf8(s, out, NULL);
    out[*len] = 0;
    *text += *len + 1;
    return out;
}

/* __metadata__: an object whose values are strings holding valid Unicode; kept unescaped */
static pytfm_status check_metadata(pytfm_safetensors *st, pytfm__json meta, char **text) {
    char a[SHOW], b[SHOW];
    if (pytfm__json_kind_of(meta) != PYTFM__JSON_OBJECT)
        return BAD(st, "__metadata__ is a JSON %s, not an object of strings",
                   pytfm__json_kind_name(pytfm__json_kind_of(meta)));
    pytfm__json_iter it = pytfm__json_iter_of(meta);
    pytfm__json key, value;
    size_t count = 0;
    while (pytfm__json_next(&it, &key, &value)) {
        if (pytfm__json_kind_of(value) != PYTFM__JSON_STRING || pytfm__json_string_lone(value))
            return BAD(st, "__metadata__[%s] is %s, not a string", show(key, a), show(value, b));
        count++;
    }
    st->meta = calloc(count ? count : 1, sizeof *st->meta);
    if (!st->meta) return NO_MEMORY(st, "cannot allocate a list of %zu metadata", count);
    it = pytfm__json_iter_of(meta);
    while (pytfm__json_next(&it, &key, &value)) {
        pytfm__st_meta *m = &st->meta[st->n_meta++];
        m->raw = value;
        m->key = unescape_into(key, text, &m->key_len);
        m->value = unescape_into(value, text, &m->value_len);
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

/* the entry's dtype, shape and their bytes (as NumPy would count them: the product of the
 * non-zero dimensions and the item size must fit in int64, even for an empty array) */
static pytfm_status check_dtype_shape(pytfm_safetensors *st, const char *where, pytfm__json dtype,
                                      pytfm__json shape, pytfm__st_entry *e, int *fits_all,
                                      int64_t *nbytes) {
    char a[SHOW];
    const size_t n_dtypes = st->half ? N_ALL_DTYPES : N_DTYPES;
    size_t k = 0;
    while (k < n_dtypes && !pytfm__json_string_is(dtype, DTYPES[k].name)) k++;
    if (k == n_dtypes) {
        char names[64] = "";
        for (size_t j = 0; j < n_dtypes; j++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", j ? ", " : "",
                     DTYPES[j].name);
        return BAD(st, "tensor %s: unsupported dtype %s (pytfm reads %s)", where, show(dtype, a),
                   names);
    }
    e->dtype = DTYPES[k].dtype;
    int ok = pytfm__json_kind_of(shape) == PYTFM__JSON_ARRAY, empty = 0;
    int64_t bytes = DTYPES[k].size;
    size_t ndim = 0;
    pytfm__json_iter it = pytfm__json_iter_of(shape);
    pytfm__json v;
    *fits_all = 1;
    while (ok && pytfm__json_next(&it, NULL, &v)) {
        int fits = 0;
        int64_t d = 0;
        ok = non_negative_int(v, &fits, &d);
        ndim++;
        if (!ok) break;
        empty |= fits && d == 0;
        if (!fits || !pytfm__mul_within(bytes, d ? d : 1, INT64_MAX, &bytes)) *fits_all = 0;
    }
    if (!ok)
        return BAD(st, "tensor %s: shape %s is not a list of non-negative ints", where,
                   show(shape, a));
    if (ndim > MAX_NDIM)
        return BAD(st, "tensor %s: %zu dimensions, NumPy allows %d", where, ndim, MAX_NDIM);
    e->shape = shape;
    e->ndim = (int32_t)ndim;
    *nbytes = empty ? 0 : bytes;
    return PYTFM_STATUS_OK;
}

/* the entry's data_offsets: a pair of ints 0 <= begin <= end <= the data, end − begin its
 * bytes */
static pytfm_status check_offsets(pytfm_safetensors *st, const char *where, pytfm__json offsets,
                                  pytfm__st_entry *e, int fits_all, int64_t nbytes) {
    char a[SHOW], b[SHOW];
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
        return BAD(st, "tensor %s: data_offsets %s is not a pair of ints", where, show(offsets, a));
    /* 0 <= begin <= end, on ints of any size: a negative one, or a begin past int64 with an
     * end within it, fails here; an end past int64 runs past the data below */
    const int begin_neg = begin.negative && !(begin.fits && begin.value == 0);
    const int end_neg = end.negative && !(end.fits && end.value == 0);
    if (begin_neg || end_neg || (end.fits && (!begin.fits || begin.value > end.value)))
        return BAD(st, "tensor %s: data_offsets %s are negative or reversed", where,
                   show(offsets, a));
    if (!end.fits || end.value > st->body)
        return BAD(st,
                   "tensor %s: data_offsets %s run past the end of the data (%lld bytes): "
                   "truncated file?",
                   where, show(offsets, a), (long long)st->body);
    if (!fits_all)
        return BAD(st, "tensor %s: shape %s is too large for NumPy", where, show(e->shape, a));
    e->begin = begin.value;
    e->end = end.value;
    if (nbytes != e->end - e->begin) {
        char shape[SHOW];
        return BAD(st, "tensor %s: %s%s is %lld bytes, but its data_offsets %s hold %lld", where,
                   pytfm__st_dtype_name(e->dtype), show(e->shape, shape),
                   (long long)nbytes, show(offsets, b), (long long)(e->end - e->begin));
    }
    return PYTFM_STATUS_OK;
}

/* one tensor entry {dtype, shape, data_offsets}, on its own; its name unescaped into *text */
static pytfm_status check_entry(pytfm_safetensors *st, pytfm__json key, pytfm__json info,
                                pytfm__st_entry *e, char **text) {
    char where[SHOW], a[SHOW];
    e->name = unescape_into(key, text, &e->name_len);
    pytfm__st_show_name(e->name, e->name_len, where);
    if (pytfm__json_kind_of(info) != PYTFM__JSON_OBJECT)
        return BAD(st, "tensor %s: its entry is a JSON %s, not an object", where,
                   pytfm__json_kind_name(pytfm__json_kind_of(info)));
    pytfm__json dtype = {0}, shape = {0}, offsets = {0}, k, v, unknown = {0};
    pytfm__json_iter it = pytfm__json_iter_of(info);
    while (pytfm__json_next(&it, &k, &v)) {
        if (pytfm__json_string_is(k, "dtype"))
            dtype = v;
        else if (pytfm__json_string_is(k, "shape"))
            shape = v;
        else if (pytfm__json_string_is(k, "data_offsets"))
            offsets = v;
        else if (!unknown.p || pytfm__json_string_compare(k, unknown) < 0)
            unknown = k; /* the first in code point order */
    }
    if (!offsets.p) return BAD(st, "tensor %s: its entry has no data_offsets", where);
    if (!dtype.p) return BAD(st, "tensor %s: its entry has no dtype", where);
    if (!shape.p) return BAD(st, "tensor %s: its entry has no shape", where);
    if (unknown.p)
        return BAD(st, "tensor %s: its entry has an unknown key %s", where, show(unknown, a));
    int fits_all = 0;
    int64_t nbytes = 0;
    PYTFM_TRY(check_dtype_shape(st, where, dtype, shape, e, &fits_all, &nbytes));
    return check_offsets(st, where, offsets, e, fits_all, nbytes);
}

static int by_offsets(const void *x, const void *y) {
    const pytfm__st_entry *a = *(const pytfm__st_entry *const *)x;
    const pytfm__st_entry *b = *(const pytfm__st_entry *const *)y;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return a < b ? -1 : a > b; /* equal offsets: in header order */
}

static int compare_names(const char *a, size_t a_len, const char *b, size_t b_len) {
    const int order = memcmp(a, b, PYTFM_MIN(a_len, b_len));
    if (order) return order;
    return a_len < b_len ? -1 : a_len > b_len;
}

static int by_name(const void *x, const void *y) {
    const pytfm__st_entry *a = *(const pytfm__st_entry *const *)x;
    const pytfm__st_entry *b = *(const pytfm__st_entry *const *)y;
    return compare_names(a->name, a->name_len, b->name, b->name_len);
}

/* The entries' data, in offset order, tile the data exactly; then the index by name, which
 * the same list of pointers becomes. */
static pytfm_status check_layout(pytfm_safetensors *st) {
    const size_t n = st->n_entries;
    const pytfm__st_entry **order = malloc((n ? n : 1) * sizeof *order);
    if (!order) return NO_MEMORY(st, "cannot allocate a list of %zu tensors", n);
    st->by_name = order;
    for (size_t i = 0; i < n; i++) order[i] = &st->entries[i];
    if (n > 1) qsort(order, n, sizeof *order, by_offsets);
    int64_t at = 0;
    const pytfm__st_entry *previous = NULL;
    char a[SHOW], b[SHOW];
    for (size_t i = 0; i < n; i++) {
        const pytfm__st_entry *e = order[i];
        if (e->begin != at) {
            char after[SHOW + 16] = "the start of the data";
            if (previous)
                snprintf(after, sizeof after, "tensor %s",
                         pytfm__st_show_name(previous->name, previous->name_len, b));
            pytfm__st_show_name(e->name, e->name_len, a);
            if (e->begin < at)
                return BAD(st,
                           "tensor %s (data_offsets [%lld, %lld]) overlaps %s, which ends at %lld",
                           a, (long long)e->begin, (long long)e->end, after, (long long)at);
            return BAD(st,
                       "tensor %s (data_offsets [%lld, %lld]) leaves a gap of %lld bytes after "
                       "%s, which ends at %lld",
                       a, (long long)e->begin, (long long)e->end, (long long)(e->begin - at), after,
                       (long long)at);
        }
        at = e->end;
        previous = e;
    }
    if (at != st->body)
        return BAD(st, "the last %lld of the %lld data bytes belong to no tensor",
                   (long long)(st->body - at), (long long)st->body);
    if (n > 1) qsort(order, n, sizeof *order, by_name);
    return PYTFM_STATUS_OK;
}

/* the JSON text of the header, st->header: everything after the length */
static pytfm_status check_header(pytfm_safetensors *st) {
    const char *why = "";
    const size_t bad = pytfm__utf8_check(st->header, st->header_size, &why);
    if (bad < st->header_size)
        return BAD(st, "the header is not UTF-8 (byte %zu: %s)", 8 + bad, why);
    pytfm__json_error err;
    const pytfm_status status = pytfm__json_check(st->header, st->header_size, &err);
    if (status == PYTFM_STATUS_OUT_OF_MEMORY)
        return NO_MEMORY(st, "cannot check the header: %s", err.what);
    if (status != PYTFM_STATUS_OK)
        return BAD(st, "the header is not valid JSON (%s: byte %zu)", err.what, 8 + err.offset);
    const pytfm__json root = pytfm__json_root(st->header, st->header_size);
    if (pytfm__json_kind_of(root) != PYTFM__JSON_OBJECT)
        return BAD(st, "the header is a JSON %s, not an object",
                   pytfm__json_kind_name(pytfm__json_kind_of(root)));

    /* the unescaped texts: each no longer than its JSON string, which has two quotes, so
     * with its NUL within the string's bytes; __metadata__ is checked first, wherever it is */
    pytfm__json key, value, meta = {0};
    size_t text = 1;
    pytfm__json_iter it = pytfm__json_iter_of(root);
    while (pytfm__json_next(&it, &key, &value)) {
        if (pytfm__json_string_is(key, "__metadata__"))
            meta = value;
        else
            text += key.n;
    }
    if (meta.p) text += meta.n;
    st->text = malloc(text);
    if (!st->text) return NO_MEMORY(st, "cannot allocate %zu bytes of names", text);
    char *out = st->text;
    if (meta.p) PYTFM_TRY(check_metadata(st, meta, &out));

    /* the list of entries grows as they pass: a header of a million bare "k": 1 members is
     * refused at the first, before a list of a million entries is made */
    size_t cap = 0;
    it = pytfm__json_iter_of(root);
    while (pytfm__json_next(&it, &key, &value)) {
        if (pytfm__json_string_is(key, "__metadata__")) continue;
        if (st->n_entries == cap) {
            cap = cap ? 2 * cap : 64;
            pytfm__st_entry *grown =
                cap <= SIZE_MAX / sizeof *grown ? realloc(st->entries, cap * sizeof *grown) : NULL;
            if (!grown) return NO_MEMORY(st, "cannot allocate a list of %zu tensors", cap);
            st->entries = grown;
        }
        pytfm__st_entry *e = &st->entries[st->n_entries];
        *e = (pytfm__st_entry){0};
        PYTFM_TRY(check_entry(st, key, value, e, &out));
        st->n_entries++;
    }
    return check_layout(st);
}

/* ---- opening ------------------------------------------------------------------------------ */

static pytfm_safetensors *new_handle(const char *source) {
    pytfm_safetensors *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->fd = -1;
    if (source) {
        st->source = malloc(strlen(source) + 1);
        if (!st->source) {
            free(st);
            return NULL;
        }
        memcpy(st->source, source, strlen(source) + 1);
    }
    return st;
}

pytfm_status pytfm_safetensors_close(pytfm_safetensors *st) {
    if (!st) return PYTFM_STATUS_OK;
    if (st->own_fd) close(st->fd);
    free(st->source);
    free(st->header_copy);
    free(st->entries);
    free(st->by_name);
    free(st->meta);
    free(st->text);
    free(st);
    return PYTFM_STATUS_OK;
}

/* st (not yet checked) made the caller's, or freed with the status of what failed */
static pytfm_status finish(pytfm_safetensors **out, pytfm_safetensors *st, pytfm_status status,
                           int io) {
    if (status == PYTFM_STATUS_OK) {
        *out = st;
    } else {
        pytfm_safetensors_close(st);
    }
    errno = status == PYTFM_STATUS_OK ? 0 : io;
    return status;
}

pytfm_status pytfm_safetensors_open_memory(pytfm_safetensors **out, const void *data, int64_t size,
                                           const char *source) {
    errno = 0; /* until a system call fails */
    PYTFM_CHECK(out != NULL, "%s: st must not be NULL", __func__);
    *out = NULL;
    PYTFM_CHECK(size >= 0, "%s: size must be >= 0, got %lld", __func__, (long long)size);
    PYTFM_CHECK(data != NULL || size == 0, "%s: data must not be NULL", __func__);
    pytfm_safetensors *st = new_handle(source);
    if (!st) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", __func__);
    st->bytes = data;
    uint64_t n = 0;
    pytfm_status status = check_length(st, data, size < 9 ? (size_t)size : 9, (uint64_t)size, &n);
    if (status == PYTFM_STATUS_OK) {
        st->header = (const char *)st->bytes + 8;
        st->header_size = (size_t)n;
        st->data_start = 8 + (int64_t)n;
        st->body = size - st->data_start;
        status = check_header(st);
    }
    return finish(out, st, status, 0);
}

/* len bytes at offset of fd into buf, *got of them before the end of the file */
static pytfm_status read_at(const pytfm_safetensors *st, int *io, int fd, void *buf, size_t len,
                            int64_t offset, size_t *got) {
    *got = 0;
    while (*got < len) {
        const size_t chunk = PYTFM_MIN(len - *got, (size_t)1 << 30);
        const ssize_t k = pread(fd, (char *)buf + *got, chunk, (off_t)offset + (off_t)*got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return io_fail(st, io, "cannot read");
        if (k == 0) break;
        *got += (size_t)k;
    }
    return PYTFM_STATUS_OK;
}

/* the checks of the file open as st->fd */
static pytfm_status open_file(pytfm_safetensors *st, int *io) {
    struct stat sb;
    if (fstat(st->fd, &sb) != 0) return io_fail(st, io, "cannot stat");
    if (!S_ISREG(sb.st_mode)) return BAD(st, "not a regular file");
    /* opened O_NONBLOCK (a FIFO must not block the open); a regular file reads the same
     * either way, but clear it so that every read below is an ordinary blocking one */
    const int flags = fcntl(st->fd, F_GETFL);
    if (flags == -1 || fcntl(st->fd, F_SETFL, flags & ~O_NONBLOCK) == -1)
        return io_fail(st, io, "cannot clear O_NONBLOCK");
    const uint64_t size = (uint64_t)sb.st_size;
    unsigned char head[9];
    size_t got = 0;
    uint64_t n = 0;
    PYTFM_TRY(read_at(st, io, st->fd, head, sizeof head, 0, &got));
    PYTFM_TRY(check_length(st, head, got, size, &n));
    st->header_copy = malloc(n ? (size_t)n : 1);
    if (!st->header_copy)
        return NO_MEMORY(st, "cannot allocate %llu bytes for the header", (unsigned long long)n);
    PYTFM_TRY(read_at(st, io, st->fd, st->header_copy, (size_t)n, 8, &got));
    if (got < n) return BAD(st, "the file shrank while it was being read");
    st->header = st->header_copy;
    st->header_size = (size_t)n;
    st->data_start = 8 + (int64_t)n;
    st->body = (int64_t)(size - 8 - n);
    return check_header(st);
}

pytfm_status pytfm_safetensors_open_fd(pytfm_safetensors **out, int32_t fd, const char *source) {
    errno = 0; /* until a system call fails */
    PYTFM_CHECK(out != NULL, "%s: st must not be NULL", __func__);
    *out = NULL;
    PYTFM_CHECK(fd >= 0, "%s: fd must be >= 0, got %d", __func__, (int)fd);
    pytfm_safetensors *st = new_handle(source);
    if (!st) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", __func__);
    st->fd = fd;
    int io = 0;
    const pytfm_status status = open_file(st, &io);
    return finish(out, st, status, io);
}

pytfm_status pytfm_safetensors_open(pytfm_safetensors **out, const char *path) {
    errno = 0; /* until a system call fails */
    PYTFM_CHECK(out != NULL, "%s: st must not be NULL", __func__);
    *out = NULL;
    PYTFM_CHECK(path != NULL, "%s: path must not be NULL", __func__);
    return pytfm__st_openat(out, AT_FDCWD, path, path);
}

pytfm_status pytfm__st_openat(pytfm_safetensors **out, int dirfd, const char *name,
                              const char *path) {
    return pytfm__st_openat_half(out, dirfd, name, path, 0);
}

pytfm_status pytfm__st_openat_half(pytfm_safetensors **out, int dirfd, const char *name,
                                   const char *path, int half) {
    errno = 0;
    *out = NULL;
    pytfm_safetensors *st = new_handle(path);
    if (!st) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", __func__);
    st->half = half;
    int io = 0;
    pytfm_status status;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait, forever, for a writer,
     * before open_file's fstat could refuse it as not a regular file; O_NOCTTY: a terminal
     * named by path must not become the process's controlling terminal */
    st->fd = openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (st->fd < 0) {
        status = io_fail(st, &io, "cannot open");
    } else {
        st->own_fd = 1;
        status = open_file(st, &io);
    }
    return finish(out, st, status, io);
}

/* ---- what an open file holds -------------------------------------------------------------- */

const pytfm__st_entry *pytfm__st_find(const pytfm_safetensors *st, const char *name, size_t len) {
    size_t lo = 0, hi = st->n_entries;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const pytfm__st_entry *e = st->by_name[mid];
        const int order = compare_names(e->name, e->name_len, name, len);
        if (order == 0) return e;
        if (order < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const pytfm__st_meta *pytfm__st_meta_get(const pytfm_safetensors *st, const char *key) {
    const size_t len = strlen(key);
    for (size_t i = 0; i < st->n_meta; i++)
        if (st->meta[i].key_len == len && memcmp(st->meta[i].key, key, len) == 0)
            return &st->meta[i];
    return NULL;
}

pytfm_status pytfm_safetensors_tensor_count(const pytfm_safetensors *st, int64_t *count) {
    PYTFM_CHECK(st != NULL, "%s: st must not be NULL", __func__);
    PYTFM_CHECK(count != NULL, "%s: count must not be NULL", __func__);
    *count = (int64_t)st->n_entries;
    return PYTFM_STATUS_OK;
}

static pytfm_status check_index(const char *func, int64_t index, size_t count) {
    if (index < 0 || (uint64_t)index >= count)
        return pytfm__fail(PYTFM_STATUS_OUT_OF_RANGE, "%s: index must be in [0, %zu), got %lld",
                           func, count, (long long)index);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_safetensors_tensor(const pytfm_safetensors *st, int64_t index,
                                      pytfm_tensor_info *info) {
    PYTFM_CHECK(st != NULL, "%s: st must not be NULL", __func__);
    PYTFM_CHECK(info != NULL, "%s: info must not be NULL", __func__);
    PYTFM_TRY(check_index(__func__, index, st->n_entries));
    const pytfm__st_entry *e = &st->entries[index];
    memset(info, 0, sizeof *info);
    info->name = e->name;
    info->name_len = (int64_t)e->name_len;
    info->dtype = e->dtype;
    info->ndim = e->ndim;
    pytfm__json_iter it = pytfm__json_iter_of(e->shape);
    pytfm__json dim;
    for (int d = 0; pytfm__json_next(&it, NULL, &dim); d++)
        info->shape[d] = pytfm__json_integer(dim).value; /* checked: each fits */
    info->nbytes = e->end - e->begin;
    info->begin = e->begin;
    info->end = e->end;
    info->file_offset = st->data_start + e->begin;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_safetensors_find(const pytfm_safetensors *st, const char *name, int64_t *index) {
    PYTFM_CHECK(st != NULL, "%s: st must not be NULL", __func__);
    PYTFM_CHECK(name != NULL, "%s: name must not be NULL", __func__);
    PYTFM_CHECK(index != NULL, "%s: index must not be NULL", __func__);
    const pytfm__st_entry *e = pytfm__st_find(st, name, strlen(name));
    *index = e ? (int64_t)(e - st->entries) : -1;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_safetensors_read(const pytfm_safetensors *st, int64_t index, void *out,
                                    int64_t size) {
    errno = 0; /* until a system call fails */
    PYTFM_CHECK(st != NULL, "%s: st must not be NULL", __func__);
    PYTFM_TRY(check_index(__func__, index, st->n_entries));
    const pytfm__st_entry *e = &st->entries[index];
    const int64_t nbytes = e->end - e->begin;
    PYTFM_CHECK(size == nbytes, "%s: size must be the tensor's %lld bytes, got %lld", __func__,
                (long long)nbytes, (long long)size);
    PYTFM_CHECK(out != NULL || size == 0, "%s: out must not be NULL", __func__);
    return pytfm__st_read_part(st, e, 0, out, size);
}

pytfm_status pytfm__st_read_part(const pytfm_safetensors *st, const pytfm__st_entry *e,
                                 int64_t offset, void *out, int64_t size) {
    errno = 0;
    if (!size) return PYTFM_STATUS_OK;
    if (st->fd < 0) {
        memcpy(out, st->bytes + st->data_start + e->begin + offset, (size_t)size);
        return PYTFM_STATUS_OK;
    }
    int io = 0;
    size_t got = 0;
    pytfm_status status =
        read_at(st, &io, st->fd, out, (size_t)size, st->data_start + e->begin + offset, &got);
    if (status == PYTFM_STATUS_OK && got < (size_t)size) {
        char name[SHOW];
        status = BAD(st, "the file ended inside tensor %s (it shrank while it was being read)",
                     pytfm__st_show_name(e->name, e->name_len, name));
    }
    errno = status == PYTFM_STATUS_OK ? 0 : io;
    return status;
}

pytfm_status pytfm_safetensors_metadata_count(const pytfm_safetensors *st, int64_t *count) {
    PYTFM_CHECK(st != NULL, "%s: st must not be NULL", __func__);
    PYTFM_CHECK(count != NULL, "%s: count must not be NULL", __func__);
    *count = (int64_t)st->n_meta;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_safetensors_metadata(const pytfm_safetensors *st, int64_t index,
                                        pytfm_metadata_item *item) {
    PYTFM_CHECK(st != NULL, "%s: st must not be NULL", __func__);
    PYTFM_CHECK(item != NULL, "%s: item must not be NULL", __func__);
    PYTFM_TRY(check_index(__func__, index, st->n_meta));
    const pytfm__st_meta *m = &st->meta[index];
    *item = (pytfm_metadata_item){m->key, (int64_t)m->key_len, m->value, (int64_t)m->value_len};
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_safetensors_metadata_get(const pytfm_safetensors *st, const char *key,
                                            const char **value, int64_t *length) {
    PYTFM_CHECK(st != NULL, "%s: st must not be NULL", __func__);
    PYTFM_CHECK(key != NULL, "%s: key must not be NULL", __func__);
    PYTFM_CHECK(value != NULL, "%s: value must not be NULL", __func__);
    const pytfm__st_meta *m = pytfm__st_meta_get(st, key);
    *value = m ? m->value : NULL;
    if (length) *length = m ? (int64_t)m->value_len : 0;
    return PYTFM_STATUS_OK;
}

const pytfm__st_entry *pytfm__st_largest(const pytfm_safetensors *st) {
    const pytfm__st_entry *big = NULL;
    for (size_t i = 0; i < st->n_entries; i++)
        if (!big || st->entries[i].end - st->entries[i].begin > big->end - big->begin)
            big = &st->entries[i];
    return big;
}
