/*
 * json.c — the strict JSON reader of checkpoint headers (json.h).
 *
 * The check walks the text once, iteratively: an explicit stack of the containers open (at
 * most PYTFM_JSON_MAX_DEPTH, on the C stack: no recursion, so "[[[[..." costs a counter, not
 * a stack frame per bracket). Each object's keys are listed as they are read; when the object
 * closes they are sorted by (hash, unescaped text) and neighbours compared, so that a header
 * of a million names costs O(n log n), not O(n²), and the list is cut back to the enclosing
 * object's keys. The readers after it trust the checked text: they only skip and decode.
 */
#include "json.h"

#include "core/internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned char uchar;

static int is_space(uchar c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(uchar c) { return c >= '0' && c <= '9'; }

static int hex_digit(uchar c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* the four hex digits at s[i..i+4) of s[0..n) as a number, or -1 */
static int32_t hex4(const uchar *s, size_t n, size_t i) {
    if (i > n || n - i < 4) return -1;
    int32_t v = 0;
    for (size_t k = 0; k < 4; k++) {
        int d = hex_digit(s[i + k]);
        if (d < 0) return -1;
        v = v << 4 | d;
    }
    return v;
}

static int is_high(int32_t cp) { return cp >= 0xD800 && cp <= 0xDBFF; }
static int is_low(int32_t cp) { return cp >= 0xDC00 && cp <= 0xDFFF; }

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* The length of the well-formed UTF-8 sequence at s[0..n), n >= 1 (the table of Unicode's
 * chapter 3: no overlong forms, no surrogates, nothing past U+10FFFF), or 0 and *why. */
static size_t utf8_length(const uchar *s, size_t n, const char **why) {
    const uchar c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uchar lo = 0x80, hi = 0xBF; /* the range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80; /* E0 80..9F: overlong */
        hi = c == 0xED ? 0x9F : 0xBF; /* ED A0..BF: surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        lo = c == 0xF0 ? 0x90 : 0x80; /* F0 80..8F: overlong */
        hi = c == 0xF4 ? 0x8F : 0xBF; /* F4 90..: past U+10FFFF */
    } else {
        *why = "invalid start byte";
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        if (i >= n) {
            *why = "unexpected end of data";
            return 0;
        }
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF)) {
            *why = "invalid continuation byte";
            return 0;
        }
    }
    return len;
}

size_t pytfm__utf8_check(const char *text, size_t size, const char **why) {
    const uchar *s = (const uchar *)text;
    size_t i = 0;
    *why = "";
    while (i < size) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len = utf8_length(s + i, size - i, why);
        if (!len) return i;
        i += len;
    }
    return size;
}

/* ---- decoding a checked string ------------------------------------------------------------ */

/* The next code point of a checked string, *pp past its opening quote, as Python's scanner
 * reads it (an escaped high surrogate followed by an escaped low one is one code point; any
 * other surrogate stays alone); -1 at the closing quote. */
static int32_t next_code_point(const uchar **pp) {
    const uchar *p = *pp;
    int32_t cp;
    if (*p == '"') return -1;
    if (*p != '\\') {
        const size_t len = p[0] < 0x80 ? 1 : p[0] < 0xE0 ? 2 : p[0] < 0xF0 ? 3 : 4;
        cp = len == 1 ? p[0] : p[0] & (0x7F >> len);
        for (size_t i = 1; i < len; i++) cp = cp << 6 | (p[i] & 0x3F);
        *pp = p + len;
        return cp;
    }
    switch (p[1]) {
    case 'b': cp = '\b'; break;
    case 'f': cp = '\f'; break;
    case 'n': cp = '\n'; break;
    case 'r': cp = '\r'; break;
    case 't': cp = '\t'; break;
    case 'u':
        cp = hex4(p, 6, 2);
        p += 6;
        if (is_high(cp) && p[0] == '\\' && p[1] == 'u') {
            const int32_t low = hex4(p, 6, 2);
            if (is_low(low)) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                p += 6;
            }
        }
        *pp = p;
        return cp;
    default: cp = p[1]; break; /* " \ / */
    }
    *pp = p + 2;
    return cp;
}

/* FNV-1a over the code points of a checked string (p at its opening quote) */
static uint64_t string_hash(const uchar *p) {
    uint64_t h = 0xcbf29ce484222325u;
    p++;
    for (int32_t cp; (cp = next_code_point(&p)) >= 0;) {
        h ^= (uint64_t)cp;
        h *= 0x100000001b3u;
    }
    return h;
}

/* <0, 0, >0 as the unescaped strings at a and b (their opening quotes) compare */
static int string_compare(const uchar *a, const uchar *b) {
    a++;
    b++;
    for (;;) {
        const int32_t x = next_code_point(&a), y = next_code_point(&b);
        if (x != y) return x < y ? -1 : 1;
        if (x < 0) return 0;
    }
}

/* ---- skipping through a checked text ------------------------------------------------------ */

/* past the string at p (its opening quote) */
static const uchar *skip_string_end(const uchar *p, const uchar *end) {
    for (p++; p < end; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return end;
}

/* past the value at p */
static const uchar *skip_value(const uchar *p, const uchar *end) {
    if (p >= end) return end;
    if (*p == '"') return skip_string_end(p, end);
    if (*p == '{' || *p == '[') {
        size_t depth = 0;
        while (p < end) {
            const uchar b = *p;
            if (b == '"') {
                p = skip_string_end(p, end);
                continue;
            }
            if (b == '{' || b == '[')
                depth++;
            else if ((b == '}' || b == ']') && --depth == 0)
                return p + 1;
            p++;
        }
        return end;
    }
    while (p < end && *p && (is_digit(*p) || strchr("+-.eEtruefalsn", *p))) p++; /* a number */
    return p;
}

static const uchar *skip_space_to(const uchar *p, const uchar *end) {
    while (p < end && is_space(*p)) p++;
    return p;
}

/* ---- the check ----------------------------------------------------------------------------- */

/* a key of an open object: where it is (its opening quote) and the hash of its text */
typedef struct open_key {
    const uchar *p;
    uint64_t hash;
} open_key;

typedef struct checker {
    const uchar *s;
    size_t n, pos;
    pytfm__json_error *err;
    open_key *keys; /* of the objects open, outermost first */
    size_t n_keys, cap_keys;
} checker;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static pytfm_status
fail(checker *c, size_t offset, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(c->err->what, sizeof c->err->what, fmt, args);
    va_end(args);
    c->err->offset = offset;
    return PYTFM_STATUS_INVALID_ARGUMENT;
}

static void skip_space(checker *c) {
    while (c->pos < c->n && is_space(c->s[c->pos])) c->pos++;
}

/* the string at c->pos (its opening quote); *lone: it holds a lone surrogate */
static pytfm_status scan_string(checker *c, int *lone) {
    const uchar *s = c->s;
    const size_t n = c->n, start = c->pos;
    size_t i = start + 1;
    *lone = 0;
    for (;;) {
        if (i >= n) return fail(c, start, "unterminated string");
        const uchar b = s[i];
        if (b == '"') break;
        if (b < 0x20) return fail(c, i, "invalid control character 0x%02x in a string", b);
        if (b >= 0x80) {
            const char *why = "";
            const size_t len = utf8_length(s + i, n - i, &why);
            if (!len) return fail(c, i, "not UTF-8 (%s)", why);
            i += len;
            continue;
        }
        if (b != '\\') {
            i++;
            continue;
        }
        if (i + 1 >= n) return fail(c, start, "unterminated string");
        switch (s[i + 1]) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't': i += 2; continue;
        case 'u': break;
        default:
            if (s[i + 1] >= 0x20 && s[i + 1] < 0x7F)
                return fail(c, i, "invalid escape \\%c", s[i + 1]);
            return fail(c, i, "invalid escape: backslash then byte 0x%02x", s[i + 1]);
        }
        const int32_t cp = hex4(s, n, i + 2);
        if (cp < 0) return fail(c, i, "invalid \\uXXXX escape");
        i += 6;
        if (is_high(cp)) {
            const int32_t low =
                i + 1 < n && s[i] == '\\' && s[i + 1] == 'u' ? hex4(s, n, i + 2) : -1;
            if (is_low(low))
                i += 6;
            else
                *lone = 1;
        } else if (is_low(cp)) {
            *lone = 1;
        }
    }
    c->pos = i + 1;
    return PYTFM_STATUS_OK;
}

static pytfm_status scan_number(checker *c) {
    const uchar *s = c->s;
    const size_t n = c->n, start = c->pos;
    size_t i = start + (s[start] == '-');
    if (i >= n || !is_digit(s[i])) {
        if (n - i >= 8 && memcmp(s + i, "Infinity", 8) == 0)
            return fail(c, start, "-Infinity is not JSON");
        return fail(c, start, "expecting a value");
    }
    const size_t first = i;
    if (s[i] == '0')
        i++;
    else
        while (i < n && is_digit(s[i])) i++;
    const size_t digits = i - first;
    int integer = 1;
    if (i + 1 < n && s[i] == '.' && is_digit(s[i + 1])) {
        integer = 0;
        for (i += 2; i < n && is_digit(s[i]);) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        if (j < n && is_digit(s[j])) {
            integer = 0;
            for (i = j + 1; i < n && is_digit(s[i]);) i++;
        }
    }
    if (integer && digits > PYTFM__JSON_MAX_INT_DIGITS)
        return fail(c, start, "an integer of %zu digits (Python reads at most %d)", digits,
                    PYTFM__JSON_MAX_INT_DIGITS);
    c->pos = i;
    return PYTFM_STATUS_OK;
}

static pytfm_status scan_literal(checker *c) {
    static const char *const ok[] = {"true", "false", "null"};
    static const char *const refused[] = {"NaN", "Infinity"};
    const size_t left = c->n - c->pos;
    for (size_t k = 0; k < 3; k++) {
        const size_t len = strlen(ok[k]);
        if (left >= len && memcmp(c->s + c->pos, ok[k], len) == 0) {
            c->pos += len;
            return PYTFM_STATUS_OK;
        }
    }
    for (size_t k = 0; k < 2; k++) {
        const size_t len = strlen(refused[k]);
        if (left >= len && memcmp(c->s + c->pos, refused[k], len) == 0)
            return fail(c, c->pos, "%s is not JSON", refused[k]);
    }
    return fail(c, c->pos, "expecting a value");
}

/* a key at c->pos, then the colon: the key joins the open object's list */
static pytfm_status scan_key(checker *c) {
    const size_t start = c->pos;
    if (start >= c->n || c->s[start] != '"')
        return fail(c, start, "expecting a property name in double quotes");
    int lone = 0;
    PYTFM_TRY(scan_string(c, &lone));
    if (lone) {
        char shown[64];
        pytfm__json_show((pytfm__json){(const char *)c->s + start, c->pos - start}, shown,
                         sizeof shown);
        return fail(c, start, "key %s holds a lone surrogate (not valid Unicode)", shown);
    }
    if (c->n_keys == c->cap_keys) {
        const size_t cap = c->cap_keys ? 2 * c->cap_keys : 16;
        open_key *keys =
            cap <= SIZE_MAX / sizeof *keys ? realloc(c->keys, cap * sizeof *keys) : NULL;
        if (!keys) {
            snprintf(c->err->what, sizeof c->err->what, "cannot allocate a list of %zu keys", cap);
            c->err->offset = start;
            return PYTFM_STATUS_OUT_OF_MEMORY;
        }
        c->keys = keys;
        c->cap_keys = cap;
    }
    c->keys[c->n_keys++] = (open_key){c->s + start, string_hash(c->s + start)};
    skip_space(c);
    if (c->pos >= c->n || c->s[c->pos] != ':') return fail(c, c->pos, "expecting ':' delimiter");
    c->pos++;
    skip_space(c);
    return PYTFM_STATUS_OK;
}

static int key_order(const void *a, const void *b) {
    const open_key *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    const int order = string_compare(x->p, y->p);
    if (order) return order;
    return x->p < y->p ? -1 : x->p > y->p; /* equal keys: in the order written */
}

/* the object whose keys start at c->keys[first] has closed: refuse a duplicate, drop them */
static pytfm_status close_object(checker *c, size_t first) {
    open_key *keys = c->keys + first;
    const size_t count = c->n_keys - first;
    if (count >= 2) {
        qsort(keys, count, sizeof *keys, key_order);
        for (size_t k = 1; k < count; k++) {
            if (keys[k].hash == keys[k - 1].hash && string_compare(keys[k].p, keys[k - 1].p) == 0) {
                char shown[64];
                const size_t len = (size_t)(skip_string_end(keys[k].p, c->s + c->n) - keys[k].p);
                pytfm__json_show((pytfm__json){(const char *)keys[k].p, len}, shown, sizeof shown);
                return fail(c, (size_t)(keys[k].p - c->s), "duplicate key %s", shown);
            }
        }
    }
    c->n_keys = first;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm__json_check(const char *text, size_t size, pytfm__json_error *err) {
    checker c = {(const uchar *)text, size, 0, err, NULL, 0, 0};
    uchar kinds[PYTFM_JSON_MAX_DEPTH];   /* '{' or '[' of each open container */
    size_t firsts[PYTFM_JSON_MAX_DEPTH]; /* where each open object's keys start in c.keys */
    size_t depth = 0;
    pytfm_status st = PYTFM_STATUS_OK;
    skip_space(&c);
    for (;;) {
        /* a value starts at c.pos */
        if (c.pos >= c.n) {
            st = fail(&c, c.pos, "expecting a value");
            break;
        }
        const uchar b = c.s[c.pos];
        if (b == '{' || b == '[') {
            if (depth == PYTFM_JSON_MAX_DEPTH) {
                st = fail(&c, c.pos, "nested more than %d levels deep", PYTFM_JSON_MAX_DEPTH);
                break;
            }
            kinds[depth] = b;
            firsts[depth] = c.n_keys;
            depth++;
            c.pos++;
            skip_space(&c);
            if (c.pos < c.n && c.s[c.pos] == (b == '{' ? '}' : ']')) {
                c.pos++;
                depth--;
            } else {
                if (b == '{' && (st = scan_key(&c)) != PYTFM_STATUS_OK) break;
                continue;
            }
        } else if (b == '"') {
            int lone = 0;
            if ((st = scan_string(&c, &lone)) != PYTFM_STATUS_OK) break;
        } else if (b == '-' || is_digit(b)) {
            if ((st = scan_number(&c)) != PYTFM_STATUS_OK) break;
        } else if ((st = scan_literal(&c)) != PYTFM_STATUS_OK) {
            break;
        }
        /* a value has ended: close the containers it ends, up to where the next value starts */
        int next = 0;
        while (!next && st == PYTFM_STATUS_OK) {
            skip_space(&c);
            if (depth == 0) {
                if (c.pos != c.n) st = fail(&c, c.pos, "extra data after the value");
                break;
            }
            const uchar kind = kinds[depth - 1], close = kind == '{' ? '}' : ']';
            const uchar at = c.pos < c.n ? c.s[c.pos] : 0;
            if (at == ',') {
                c.pos++;
                skip_space(&c);
                if (kind == '{') st = scan_key(&c);
                next = 1;
            } else if (at == close) {
                c.pos++;
                if (kind == '{') st = close_object(&c, firsts[depth - 1]);
                depth--;
            } else {
                st = fail(&c, c.pos, "expecting ',' delimiter or '%c'", close);
            }
        }
        if (!next || st != PYTFM_STATUS_OK) break;
    }
    free(c.keys);
    return st;
}

/* ---- reading a checked text ---------------------------------------------------------------- */

pytfm__json pytfm__json_root(const char *text, size_t size) {
    const uchar *end = (const uchar *)text + size;
    const uchar *p = skip_space_to((const uchar *)text, end);
    return (pytfm__json){(const char *)p, (size_t)(skip_value(p, end) - p)};
}

pytfm__json_kind pytfm__json_kind_of(pytfm__json v) {
    switch (v.n ? v.p[0] : 'n') {
    case '{': return PYTFM__JSON_OBJECT;
    case '[': return PYTFM__JSON_ARRAY;
    case '"': return PYTFM__JSON_STRING;
    case 't':
    case 'f': return PYTFM__JSON_BOOL;
    case 'n': return PYTFM__JSON_NULL;
    default: return PYTFM__JSON_NUMBER;
    }
}

const char *pytfm__json_kind_name(pytfm__json_kind kind) {
    static const char *const names[] = {"object", "array", "string", "number", "boolean", "null"};
    return (unsigned)kind < 6 ? names[kind] : "value";
}

pytfm__json_iter pytfm__json_iter_of(pytfm__json container) {
    /* between the brackets; an empty iteration for anything else */
    const int ok = container.n >= 2 && (container.p[0] == '{' || container.p[0] == '[');
    return (pytfm__json_iter){ok ? container.p + 1 : container.p,
                              ok ? container.p + container.n - 1 : container.p,
                              ok && container.p[0] == '{'};
}

int pytfm__json_next(pytfm__json_iter *it, pytfm__json *key, pytfm__json *value) {
    const uchar *end = (const uchar *)it->end;
    const uchar *p = skip_space_to((const uchar *)it->p, end);
    if (p < end && *p == ',') p = skip_space_to(p + 1, end);
    if (p >= end) {
        it->p = it->end;
        return 0;
    }
    if (it->object) {
        const uchar *k = p;
        p = skip_string_end(p, end);
        if (key) *key = (pytfm__json){(const char *)k, (size_t)(p - k)};
        p = skip_space_to(p, end);
        p = skip_space_to(p + (p < end), end); /* the colon */
    } else if (key) {
        *key = (pytfm__json){NULL, 0};
    }
    const uchar *v = p;
    p = skip_value(p, end);
    *value = (pytfm__json){(const char *)v, (size_t)(p - v)};
    it->p = (const char *)p;
    return 1;
}

size_t pytfm__json_count(pytfm__json container) {
    pytfm__json_iter it = pytfm__json_iter_of(container);
    pytfm__json value;
    size_t count = 0;
    while (pytfm__json_next(&it, NULL, &value)) count++;
    return count;
}

int pytfm__json_string_is(pytfm__json s, const char *lit) {
    if (s.n < 2 || s.p[0] != '"') return 0;
    const uchar *p = (const uchar *)s.p + 1;
    for (const uchar *q = (const uchar *)lit;; q++) {
        const int32_t cp = next_code_point(&p);
        if (cp != (*q ? (int32_t)*q : -1)) return 0;
        if (cp < 0) return 1;
    }
}

int pytfm__json_string_compare(pytfm__json a, pytfm__json b) {
    return string_compare((const uchar *)a.p, (const uchar *)b.p);
}

size_t pytfm__json_string_utf8(pytfm__json s, char *out, int *lone) {
    uchar *o = (uchar *)out;
    if (lone) *lone = 0;
    if (s.n < 2 || s.p[0] != '"') return 0;
    const uchar *p = (const uchar *)s.p + 1;
    for (int32_t cp; (cp = next_code_point(&p)) >= 0;) {
        if (cp < 0x80) {
            *o++ = (uchar)cp;
        } else if (cp < 0x800) {
            *o++ = (uchar)(0xC0 | cp >> 6);
            *o++ = (uchar)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            if (lone && cp >= 0xD800 && cp <= 0xDFFF) *lone = 1;
            *o++ = (uchar)(0xE0 | cp >> 12);
            *o++ = (uchar)(0x80 | (cp >> 6 & 0x3F));
            *o++ = (uchar)(0x80 | (cp & 0x3F));
        } else {
            *o++ = (uchar)(0xF0 | cp >> 18);
            *o++ = (uchar)(0x80 | (cp >> 12 & 0x3F));
            *o++ = (uchar)(0x80 | (cp >> 6 & 0x3F));
            *o++ = (uchar)(0x80 | (cp & 0x3F));
        }
    }
    return (size_t)(o - (uchar *)out);
}

int pytfm__json_string_lone(pytfm__json s) {
    if (s.n < 2 || s.p[0] != '"') return 0;
    const uchar *p = (const uchar *)s.p + 1;
    for (int32_t cp; (cp = next_code_point(&p)) >= 0;)
        if (cp >= 0xD800 && cp <= 0xDFFF) return 1;
    return 0;
}

double pytfm__json_number(pytfm__json v, int *ok) {
    *ok = 0;
    if (pytfm__json_kind_of(v) != PYTFM__JSON_NUMBER) return 0;
    char small[64], *text = v.n < sizeof small ? small : malloc(v.n + 1);
    if (!text) return 0;
    memcpy(text, v.p, v.n);
    text[v.n] = 0;
    const int saved = errno; /* an overflow's ERANGE is no error of the caller's */
    const double d = strtod(text, NULL);
    errno = saved;
    if (text != small) free(text);
    *ok = 1;
    return d;
}

pytfm__json_int pytfm__json_integer(pytfm__json number) {
    pytfm__json_int r = {0, 0, 0, 0};
    const uchar *p = (const uchar *)number.p, *end = p + number.n;
    if (p < end && *p == '-') {
        r.negative = 1;
        p++;
    }
    if (p >= end || !is_digit(*p)) return r;
    uint64_t magnitude = 0;
    int overflow = 0;
    for (; p < end && is_digit(*p); p++) {
        const uint64_t d = (uint64_t)(*p - '0');
        if (magnitude > (UINT64_MAX - d) / 10)
            overflow = 1;
        else
            magnitude = magnitude * 10 + d;
    }
    r.integer = p == end;
    if (!r.integer || overflow) return r;
    if (!r.negative && magnitude <= (uint64_t)INT64_MAX) {
        r.fits = 1;
        r.value = (int64_t)magnitude;
    } else if (r.negative && magnitude <= (uint64_t)INT64_MAX + 1) {
        r.fits = 1;
        r.value = magnitude == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)magnitude;
    }
    return r;
}

const char *pytfm__json_show(pytfm__json v, char *buf, size_t cap) {
    size_t len = v.n;
    if (len >= cap) {
        len = cap - 4;
        while (len > 0 && ((uchar)v.p[len] & 0xC0) == 0x80) len--; /* a character boundary */
    }
    /* whitespace between tokens (the only control bytes a checked text has) as spaces: a
     * message is one line */
    for (size_t i = 0; i < len; i++) buf[i] = (uchar)v.p[i] < 0x20 ? ' ' : v.p[i];
    memcpy(buf + len, v.n >= cap ? "..." : "", v.n >= cap ? 4 : 1);
    return buf;
}

pytfm_status pytfm_json_check(const char *text, int64_t size) {
    PYTFM_CHECK(size >= 0, "%s: size must be >= 0, got %lld", __func__, (long long)size);
    PYTFM_CHECK(text != NULL || size == 0, "%s: text must not be NULL", __func__);
    const char *why = "";
    const size_t bad = pytfm__utf8_check(text, (size_t)size, &why);
    if (bad < (size_t)size)
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "not UTF-8 (byte %zu: %s)", bad, why);
    pytfm__json_error err;
    const pytfm_status status = pytfm__json_check(text ? text : "", (size_t)size, &err);
    if (status == PYTFM_STATUS_OK) return status;
    return pytfm__fail(status, "%s (%s: byte %zu)",
                       status == PYTFM_STATUS_INVALID_ARGUMENT ? "not valid JSON"
                                                               : "cannot check the JSON",
                       err.what, err.offset);
}
