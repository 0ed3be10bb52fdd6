/*
 * json.h — a small strict JSON reader for safetensors headers (internal, not exported; its
 * public face is pytfm_json_check in pytfm_model.h).
 *
 * pytfm__json_check validates a whole text first: RFC 8259 JSON, strict UTF-8, no duplicate
 * keys (compared after unescaping), no key holding a lone surrogate, no NaN or Infinity, no
 * integer of more than PYTFM__JSON_MAX_INT_DIGITS digits (Python's int conversion limit, so
 * that every text passed is one json.loads reads), no more than PYTFM_JSON_MAX_DEPTH
 * containers open at once. Only then are values read, through cursors into the checked text
 * that allocate nothing: pytfm__json_next walks an object's members or an array's items, and
 * the readers of strings and numbers below assume a checked text.
 *
 * Nothing here is global; the check allocates only a list of the keys of the objects open at
 * once (for the duplicate check), never more than the text has keys.
 */
#ifndef PYTFM_JSON_H
#define PYTFM_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "pytfm.h"

enum { PYTFM__JSON_MAX_INT_DIGITS = 4300 };

/* Where and why a text is not JSON: offset is a byte offset into the text checked. */
typedef struct pytfm__json_error {
    size_t offset;
    char what[160];
} pytfm__json_error;

/* The first byte of text[0..size) that is not strict UTF-8 (size when all is): overlong forms,
 * surrogates (U+D800..U+DFFF), code points past U+10FFFF and truncated sequences are not.
 * *why says how, in the words of Python's UnicodeDecodeError ("invalid start byte", "invalid
 * continuation byte", "unexpected end of data"). */
size_t pytfm__utf8_check(const char *text, size_t size, const char **why);

/* PYTFM_STATUS_OK when text[0..size) is one JSON value, with whitespace around it, as above;
 * else PYTFM_STATUS_INVALID_ARGUMENT, or PYTFM_STATUS_OUT_OF_MEMORY for the list of keys, with
 * *err filled in (pytfm_last_error() is not touched: the caller says whose text it was). */
pytfm_status pytfm__json_check(const char *text, size_t size, pytfm__json_error *err);

/* ---- reading a checked text ---------------------------------------------------------------- */

typedef enum pytfm__json_kind {
    PYTFM__JSON_OBJECT,
    PYTFM__JSON_ARRAY,
    PYTFM__JSON_STRING,
    PYTFM__JSON_NUMBER,
    PYTFM__JSON_BOOL,
    PYTFM__JSON_NULL
} pytfm__json_kind;

/* One value: its text p[0..n), from its first byte to its last (no whitespace around). */
typedef struct pytfm__json {
    const char *p;
    size_t n;
} pytfm__json;

/* The value of a checked text. */
pytfm__json pytfm__json_root(const char *text, size_t size);

pytfm__json_kind pytfm__json_kind_of(pytfm__json v);

/* "object", "array", "string", "number", "boolean", "null" */
const char *pytfm__json_kind_name(pytfm__json_kind kind);

/* A walk over the members of an object or the items of an array. */
typedef struct pytfm__json_iter {
    const char *p, *end;
    int object;
} pytfm__json_iter;

pytfm__json_iter pytfm__json_iter_of(pytfm__json container);

/* The next member (key and value) or item (value; key may be NULL): 1, or 0 past the last. */
int pytfm__json_next(pytfm__json_iter *it, pytfm__json *key, pytfm__json *value);

/* The number of members or items of a container. */
size_t pytfm__json_count(pytfm__json container);

/* 1 when the string value s, unescaped, is the ASCII text lit. */
int pytfm__json_string_is(pytfm__json s, const char *lit);

/* <0, 0 or >0 as the string values a and b, unescaped, compare code point by code point (a
 * prefix first): the order of Python's str. */
int pytfm__json_string_compare(pytfm__json a, pytfm__json b);

/* Unescape the string value s into out, which must hold s.n bytes (the unescaped text is never
 * longer than the escaped one); its length in bytes. *lone (may be NULL) is set to 1 when s
 * holds a lone surrogate (an escape such as \ud800 unpaired: Python keeps it in a str that
 * cannot be encoded), which is written in the three bytes UTF-8 would use, else 0. */
size_t pytfm__json_string_utf8(pytfm__json s, char *out, int *lone);

/* 1 when the string value s holds a lone surrogate (see pytfm__json_string_utf8). */
int pytfm__json_string_lone(pytfm__json s);

/* A number value read as an integer. */
typedef struct pytfm__json_int {
    int integer;   /* 1: integer syntax (no fraction, no exponent): json.loads reads an int */
    int negative;  /* a minus sign ("-0" is 0 and negative) */
    int fits;      /* the value fits in an int64_t (integer only) */
    int64_t value; /* the value, when it fits */
} pytfm__json_int;

pytfm__json_int pytfm__json_integer(pytfm__json number);

/* A number value as a double, as json.loads reads it (float(text): a value past the double
 * range is ±inf, one below it 0); *ok = 0 (and 0 returned) when v is no number or memory for a
 * long text runs out. errno is left as it was. */
double pytfm__json_number(pytfm__json v, int *ok);

/* The text of v, for a message: at most cap − 1 bytes of it, cut on a character boundary and
 * ended by "..." when longer, control bytes (whitespace) as spaces, NUL-terminated. cap >= 8. */
const char *pytfm__json_show(pytfm__json v, char *buf, size_t cap);

#endif /* PYTFM_JSON_H */
