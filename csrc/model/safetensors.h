/*
 * safetensors.h — the safetensors reader's insides, for the layers built on it (internal, not
 * exported): csrc/model/checkpoint.c (pytfm's metadata and parameters) and any other layout of
 * tensors read from a safetensors file.
 *
 * An open pytfm_safetensors (pytfm_model.h) has passed every check of the format: the header
 * length, strict UTF-8 JSON, a __metadata__ of strings, each entry's dtype, shape and
 * data_offsets, and offsets that tile the data exactly. What it holds is read-only from then
 * on, so any number of threads may read one.
 */
#ifndef PYTFM_SAFETENSORS_H
#define PYTFM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "pytfm.h"

/* bytes of a value from the file that a message shows, at most */
enum { PYTFM__SHOW = 48 };

/* One tensor of the header, checked. */
typedef struct pytfm__st_entry {
    const char *name; /* unescaped UTF-8, name_len bytes then a NUL, in the handle's text */
    size_t name_len;
    pytfm__json shape;  /* its JSON array: ints >= 0 that fit in int64 */
    int64_t begin, end; /* data_offsets: bytes [begin, end) of the data */
    int32_t dtype;      /* a pytfm_dtype */
    int32_t ndim;
} pytfm__st_entry;

/* One member of __metadata__. */
typedef struct pytfm__st_meta {
    pytfm__json raw;         /* the value as the header writes it (a JSON string), for messages */
    const char *key, *value; /* unescaped UTF-8, each then a NUL, in the handle's text */
    size_t key_len, value_len;
} pytfm__st_meta;

struct pytfm_safetensors {
    char *source;               /* names the file in messages; NULL: messages name nothing */
    int fd;                     /* the file, or -1 when its bytes are in memory */
    int own_fd;                 /* pytfm_safetensors_close closes fd */
    const unsigned char *bytes; /* in memory: the whole file (the caller's) */
    char *header_copy;          /* from a file: the header, read into memory */
    const char *header;         /* the header's JSON text, header_size bytes */
    size_t header_size;
    int64_t data_start;       /* 8 + header_size: where the data starts in the file */
    int64_t body;             /* bytes of data */
    pytfm__st_entry *entries; /* in header order */
    size_t n_entries;
    const pytfm__st_entry **by_name; /* the entries in name order (bytes, then length) */
    pytfm__st_meta *meta;            /* in header order */
    size_t n_meta;
    char *text; /* the names and the metadata's keys and values, unescaped */
    int half;   /* BF16 and F16 tensors are taken too (pytfm__st_openat_half) */
};

/* "<source>: <message>" (the message alone when st has no source) as this thread's last
 * error; returns status. A long source keeps its end, so that the message still fits. */
pytfm_status pytfm__st_fail(const pytfm_safetensors *st, pytfm_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The same, naming source (NULL: nothing), for the layers that read several files. */
pytfm_status pytfm__fail_at(const char *source, pytfm_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The entry named name[0..len), or NULL. */
/* pytfm_safetensors_open on the file name in the folder open as dirfd (AT_FDCWD: the working
 * folder), so that a reader of several files of one folder reads them all from that folder
 * even when another takes its place meanwhile; messages name path. */
pytfm_status pytfm__st_openat(pytfm_safetensors **out, int dirfd, const char *name,
                              const char *path);

/* The same, taking BF16 and F16 tensors too when half is 1 (the public openers take F32 and
 * I64 only): for the folder readers that convert 16-bit floats as they read them. */
pytfm_status pytfm__st_openat_half(pytfm_safetensors **out, int dirfd, const char *name,
                                   const char *path, int half);

/* The header's name of a pytfm_dtype ("F32", "BF16"), "?" for another number. */
const char *pytfm__st_dtype_name(int32_t dtype);

const pytfm__st_entry *pytfm__st_find(const pytfm_safetensors *st, const char *name, size_t len);

/* st's largest tensor (the first of them), NULL when it has none: what an out-of-memory
 * message names, the tensor that made the allocation huge */
const pytfm__st_entry *pytfm__st_largest(const pytfm_safetensors *st);

/* Bytes [offset, offset + size) of entry e's data into out (0 <= offset, offset + size <= its
 * bytes: the caller's promise), as pytfm_safetensors_read reads a whole tensor: pread, a file
 * that has shrunk an error naming the tensor, errno as that function leaves it. */
pytfm_status pytfm__st_read_part(const pytfm_safetensors *st, const pytfm__st_entry *e,
                                 int64_t offset, void *out, int64_t size);

/* The member of __metadata__ whose key is the NUL-terminated key, or NULL. */
const pytfm__st_meta *pytfm__st_meta_get(const pytfm_safetensors *st, const char *key);

/* 'name' for a message: at most PYTFM__SHOW bytes of it (buf holds that many), cut on a
 * character boundary, control bytes as '?'. */
const char *pytfm__st_show_name(const char *name, size_t len, char *buf);

#endif /* PYTFM_SAFETENSORS_H */
