/*
 * bpe.c — GPT-2's byte-level BPE tokenizer (pytfm_tokenizer.h, and pytfm.tokenizer's engine):
 * the files' checks and the folder rule, the pre-tokenizer as a hand-written scanner over
 * UTF-8, merges by rank, a cache of words.
 *
 * A token is held as its bytes (GPT-2's vocabulary names byte b by the printable character
 * bytes_to_unicode gives it; that naming is undone once, at open). Merges are a hash map from
 * a pair of ids to (rank, the id it makes). A word is merged with a linked list of its symbols
 * and a min-heap of (rank, position) of the adjacent pairs that have a merge: the heap gives
 * the lowest rank first and, among equal ranks (the same pair), the leftmost occurrence first,
 * which is GPT-2's order (every occurrence of the best pair, left to right, then the next best:
 * a merge only makes pairs of higher rank, since a merge's parts come from earlier merges).
 * Stale heap entries are skipped when popped: the pair at their position no longer has their
 * rank (ranks are unique per pair).
 */
#if defined(__linux__) || defined(__unix__) || defined(__APPLE__)
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "json.h"
#include "unicode_tables.h"

#define ENDOFTEXT "<|endoftext|>"
enum { ENDOFTEXT_LEN = 13 };

/* ---- the cache of words ----------------------------------------------------------------------
 * word bytes -> its ids, for words of at most CACHE_WORD bytes. Open addressing over
 * CACHE_SLOTS slots; the keys and ids live in two arenas. When a table or an arena is full it
 * starts again, empty (as pytfm.tokenizer's cache does). */
enum {
    CACHE_SLOTS = 1 << 18,
    CACHE_ENTRIES = CACHE_SLOTS / 2,
    CACHE_KEY_BYTES = 1 << 22,
    CACHE_IDS = 1 << 21,
    CACHE_WORD = 128
};

typedef struct cache_entry {
    uint64_t hash;
    uint32_t key_off, ids_off;
    uint16_t key_len, n_ids;
} cache_entry;

typedef struct word_cache {
    atomic_flag busy; /* set while one encode uses the cache; another runs without it */
    uint32_t *slots;  /* entry index + 1, 0: empty */
    cache_entry *entries;
    unsigned char *keys;
    int32_t *ids;
    uint32_t n_entries, key_used, ids_used;
} word_cache;

struct pytfm_tokenizer {
    int64_t n_tokens, n_merges;
    int32_t eot;
    int32_t byte_id[256];
    int64_t *tok_off;         /* token i's bytes: tok_bytes[tok_off[i] .. tok_off[i+1]) */
    unsigned char *tok_bytes;
    uint64_t *pair_key;       /* (a << 32 | b) + 1, 0: empty */
    int32_t *pair_rank, *pair_made;
    uint64_t pair_mask;
    word_cache *cache;        /* NULL when it could not be allocated: encode merges without it */
};

/* ---- hashing ------------------------------------------------------------------------------- */

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 32);
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
}

/* The merge of the pair (a, b): its rank, *made the id it makes; -1 when there is none. */
static int32_t pair_rank(const pytfm_tokenizer *t, int32_t a, int32_t b, int32_t *made) {
    const uint64_t key = pair_key(a, b);
    for (uint64_t i = hash_pair(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        if (t->pair_key[i] == key) {
            *made = t->pair_made[i];
            return t->pair_rank[i];
        }
        if (t->pair_key[i] == 0) return -1;
    }
}

/* ---- GPT-2's byte naming ------------------------------------------------------------------- */

/* byte -> the code point that names it, and code point (< 324) -> byte or -1 */
static void byte_names(uint32_t name[256], int16_t byte_of[324]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        name[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
    for (int c = 0; c < 324; c++) byte_of[c] = -1;
    for (int b = 0; b < 256; b++) byte_of[name[b]] = (int16_t)b;
}

/* ---- UTF-8 and the character classes -------------------------------------------------------- */

enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3 };

/* The length of the valid UTF-8 sequence at p[0..n) (n >= 1) and its code point in *cp, or 0
 * when p[0] does not begin one (overlong, surrogate, past U+10FFFF, truncated). */
static int utf8_at(const unsigned char *p, size_t n, uint32_t *cp) {
    const unsigned c = p[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        if (n < 2 || (p[1] & 0xC0) != 0x80) return 0;
        *cp = (c & 0x1Fu) << 6 | (p[1] & 0x3Fu);
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F)) return 0;
        *cp = (c & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu);
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] > 0x8F)) return 0;
        *cp = (c & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
        return 4;
    }
    return 0;
}

static int class_of(uint32_t cp) {
    size_t lo = 0, hi = PYTFM__UCLASS_RANGES;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (cp < pytfm__uclass_table[mid].first) hi = mid;
        else if (cp > pytfm__uclass_table[mid].last) lo = mid + 1;
        else return pytfm__uclass_table[mid].kind;
    }
    return C_OTHER;
}

/* The class of the character at p[0..n) (n >= 1), *len its bytes: a byte that begins no valid
 * UTF-8 sequence is one "other" character (as Python's surrogateescape reads it, whose
 * U+DC80..U+DCFF are category Cs). */
static int char_at(const unsigned char *p, size_t n, size_t *len) {
    if (p[0] < 0x80) {
        *len = 1;
        return pytfm__uclass_ascii[p[0]];
    }
    uint32_t cp = 0;
    const int k = utf8_at(p, n, &cp);
    if (k == 0) {
        *len = 1;
        return C_OTHER;
    }
    *len = (size_t)k;
    return class_of(cp);
}

/* The end of GPT-2's word starting at p[0] (p < end): the pattern's alternatives in order. */
static const unsigned char *word_end(const unsigned char *p, const unsigned char *end) {
    const size_t left = (size_t)(end - p);
    if (p[0] == '\'' && left >= 2) {
        const unsigned char c = p[1];
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return p + 2;
        if (left >= 3 && ((c == 'r' && p[2] == 'e') || (c == 'v' && p[2] == 'e') ||
                          (c == 'l' && p[2] == 'l')))
            return p + 3;
    }
    size_t len;
    int kind = char_at(p, left, &len);
    const unsigned char *q = p + len;
    if (p[0] == ' ' && q < end) { /* " ?X+": the space joins a run that follows it */
        size_t len2;
        const int next = char_at(q, (size_t)(end - q), &len2);
        if (next != C_SPACE) {
            kind = next;
            q += len2;
        }
    }
    if (kind != C_SPACE) { /* \p{L}+, \p{N}+ or [^\s\p{L}\p{N}]+ */
        while (q < end) {
            size_t l;
            if (char_at(q, (size_t)(end - q), &l) != kind) break;
            q += l;
        }
        return q;
    }
    /* \s+(?!\S) | \s+: a run of white space; before a non-space its last character is left
     * to the next word, unless it is the run's only one */
    const unsigned char *last = p;
    while (q < end) {
        size_t l;
        if (char_at(q, (size_t)(end - q), &l) != C_SPACE) break;
        last = q;
        q += l;
    }
    if (q == end || last == p) return q;
    return last;
}

/* ---- merging a word -------------------------------------------------------------------------- */

typedef struct heap_item {
    int32_t rank;
    int64_t pos;
} heap_item;

typedef struct scratch {
    int32_t *id;
    int64_t *next, *prev;
    heap_item *heap;
    int64_t cap;
} scratch;

static int heap_less(heap_item a, heap_item b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(heap_item *h, int64_t *n, heap_item x) {
    int64_t i = (*n)++;
    while (i > 0) {
        const int64_t up = (i - 1) / 2;
        if (!heap_less(x, h[up])) break;
        h[i] = h[up];
        i = up;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, int64_t *n) {
    const heap_item top = h[0], x = h[--*n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = x;
    return top;
}

static int scratch_reserve(scratch *s, int64_t n) {
    if (n <= s->cap) return 1;
    int64_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    /* at most 2n heap entries live at once: n - 1 at the start, then at most 2 per merge, of
     * which there are at most n - 1, each after a pop */
    if ((uint64_t)cap > (uint64_t)PTRDIFF_MAX / (2 * sizeof(heap_item))) return 0;
    int32_t *id = realloc(s->id, (size_t)cap * sizeof *id);
    if (id) s->id = id;
    int64_t *next = realloc(s->next, (size_t)cap * sizeof *next);
    if (next) s->next = next;
    int64_t *prev = realloc(s->prev, (size_t)cap * sizeof *prev);
    if (prev) s->prev = prev;
    heap_item *heap = realloc(s->heap, (size_t)cap * 2 * sizeof *heap);
    if (heap) s->heap = heap;
    if (!id || !next || !prev || !heap) return 0;
    s->cap = cap;
    return 1;
}

/* The ids of word w[0..n) (n >= 1) in s->id, in order; their number. */
static int64_t merge_word(const pytfm_tokenizer *t, const unsigned char *w, int64_t n,
                          scratch *s) {
    int32_t *id = s->id;
    int64_t *next = s->next, *prev = s->prev, heap_n = 0;
    for (int64_t k = 0; k < n; k++) {
        id[k] = t->byte_id[w[k]];
        next[k] = k + 1;
        prev[k] = k - 1;
    }
    int32_t made;
    for (int64_t k = 0; k + 1 < n; k++) {
        const int32_t r = pair_rank(t, id[k], id[k + 1], &made);
        if (r >= 0) heap_push(s->heap, &heap_n, (heap_item){r, k});
    }
    int64_t count = n;
    while (heap_n > 0) {
        const heap_item top = heap_pop(s->heap, &heap_n);
        const int64_t k = top.pos, j = next[k];
        if (id[k] < 0 || j >= n || pair_rank(t, id[k], id[j], &made) != top.rank) continue;
        id[k] = made;
        id[j] = -1;
        next[k] = next[j];
        if (next[k] < n) prev[next[k]] = k;
        count--;
        if (prev[k] >= 0) {
            const int32_t r = pair_rank(t, id[prev[k]], id[k], &made);
            if (r >= 0) heap_push(s->heap, &heap_n, (heap_item){r, prev[k]});
        }
        if (next[k] < n) {
            const int32_t r = pair_rank(t, id[k], id[next[k]], &made);
            if (r >= 0) heap_push(s->heap, &heap_n, (heap_item){r, k});
        }
    }
    int64_t out = 0;
    for (int64_t k = 0; k < n; k = next[k]) id[out++] = id[k];
    return count;
}

/* ---- encode ---------------------------------------------------------------------------------- */

typedef struct sink {
    int32_t *ids;
    int64_t cap, count;
} sink;

static void emit(sink *o, const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++, o->count++)
        if (o->count < o->cap) o->ids[o->count] = ids[i];
}

static void cache_clear(word_cache *c) {
    memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
    c->n_entries = c->key_used = c->ids_used = 0;
}

/* The ids of word w[0..n) from the cache (NULL when it is not there) */
static const int32_t *cache_find(const word_cache *c, const unsigned char *w, size_t n,
                                 uint64_t h, int64_t *count) {
    for (uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const uint32_t e = c->slots[i];
        if (e == 0) return NULL;
        const cache_entry *x = &c->entries[e - 1];
        if (x->hash == h && x->key_len == n && memcmp(c->keys + x->key_off, w, n) == 0) {
            *count = x->n_ids;
            return c->ids + x->ids_off;
        }
    }
}

static void cache_add(word_cache *c, const unsigned char *w, size_t n, uint64_t h,
                      const int32_t *ids, int64_t count) {
    if (c->n_entries >= CACHE_ENTRIES || c->key_used + n > CACHE_KEY_BYTES ||
        c->ids_used + (uint64_t)count > CACHE_IDS)
        cache_clear(c);
    uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
    while (c->slots[i] != 0) i = (i + 1) & (CACHE_SLOTS - 1);
    cache_entry *x = &c->entries[c->n_entries];
    *x = (cache_entry){h, c->key_used, c->ids_used, (uint16_t)n, (uint16_t)count};
    memcpy(c->keys + c->key_used, w, n);
    memcpy(c->ids + c->ids_used, ids, (size_t)count * sizeof *ids);
    c->key_used += (uint32_t)n;
    c->ids_used += (uint32_t)count;
    c->slots[i] = ++c->n_entries;
}

/* Tokenize the piece p[0..end) (no special token in it) into o. */
static pytfm_status encode_piece(const pytfm_tokenizer *t, const unsigned char *p,
                                 const unsigned char *end, word_cache *cache, scratch *s,
                                 sink *o) {
    while (p < end) {
        const unsigned char *q = word_end(p, end);
        const int64_t n = q - p;
        if (n == 1) {
            emit(o, &t->byte_id[p[0]], 1);
        } else {
            const uint64_t h = cache && n <= CACHE_WORD ? hash_bytes(p, (size_t)n) : 0;
            int64_t count = 0;
            const int32_t *hit = h ? cache_find(cache, p, (size_t)n, h, &count) : NULL;
            if (hit) {
                emit(o, hit, count);
            } else {
                if (!scratch_reserve(s, n))
                    return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                                       "pytfm_tokenizer_encode: cannot allocate for a word of "
                                       "%lld bytes", (long long)n);
                count = merge_word(t, p, n, s);
                if (h) cache_add(cache, p, (size_t)n, h, s->id, count);
                emit(o, s->id, count);
            }
        }
        p = q;
    }
    return PYTFM_STATUS_OK;
}

static const unsigned char *find_eot(const unsigned char *p, const unsigned char *end) {
    while (end - p >= ENDOFTEXT_LEN) {
        const unsigned char *lt = memchr(p, '<', (size_t)(end - p - ENDOFTEXT_LEN + 1));
        if (!lt) return NULL;
        if (memcmp(lt, ENDOFTEXT, ENDOFTEXT_LEN) == 0) return lt;
        p = lt + 1;
    }
    return NULL;
}

pytfm_status pytfm_tokenizer_encode(const pytfm_tokenizer *tok, const char *text, int64_t size,
                                    int32_t special, int32_t *ids, int64_t capacity,
                                    int64_t *count) {
    PYTFM_CHECK(tok != NULL, "%s: tok must not be NULL", __func__);
    PYTFM_CHECK(count != NULL, "%s: count must not be NULL", __func__);
    PYTFM_CHECK_MIN(size, 0);
    PYTFM_CHECK_MIN(capacity, 0);
    PYTFM_CHECK_PTR(text, size);
    PYTFM_CHECK_PTR(ids, capacity);
    word_cache *cache = tok->cache;
    if (cache && atomic_flag_test_and_set_explicit(&cache->busy, memory_order_acquire))
        cache = NULL; /* another thread's encode has it */
    scratch s = {0};
    sink o = {ids, capacity, 0};
    pytfm_status status = PYTFM_STATUS_OK;
    const unsigned char *p = (const unsigned char *)text, *end = p + size;
    while (status == PYTFM_STATUS_OK && p < end) {
        const unsigned char *eot = special && tok->eot >= 0 ? find_eot(p, end) : NULL;
        status = encode_piece(tok, p, eot ? eot : end, cache, &s, &o);
        if (!eot) break;
        emit(&o, &tok->eot, 1);
        p = eot + ENDOFTEXT_LEN;
    }
    if (cache) atomic_flag_clear_explicit(&cache->busy, memory_order_release);
    free(s.id);
    free(s.next);
    free(s.prev);
    free(s.heap);
    if (status != PYTFM_STATUS_OK) return status;
    *count = o.count;
    if (o.count > capacity && (ids != NULL || capacity != 0))
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: the text needs %lld ids, capacity is %lld", __func__,
                           (long long)o.count, (long long)capacity);
    return PYTFM_STATUS_OK;
}

/* ---- decode ---------------------------------------------------------------------------------- */

pytfm_status pytfm_tokenizer_decode(const pytfm_tokenizer *tok, const int32_t *ids, int64_t n,
                                    char *out, int64_t capacity, int64_t *size) {
    PYTFM_CHECK(tok != NULL, "%s: tok must not be NULL", __func__);
    PYTFM_CHECK(size != NULL, "%s: size must not be NULL", __func__);
    PYTFM_CHECK_MIN(n, 0);
    PYTFM_CHECK_MIN(capacity, 0);
    PYTFM_CHECK_PTR(ids, n);
    PYTFM_CHECK_PTR(out, capacity);
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_tokens)
            return pytfm__fail(PYTFM_STATUS_OUT_OF_RANGE,
                               "%s: ids[%lld] is %d, outside the vocabulary [0, %lld)", __func__,
                               (long long)i, (int)ids[i], (long long)tok->n_tokens);
        const int64_t len = tok->tok_off[ids[i] + 1] - tok->tok_off[ids[i]];
        if (total < capacity) {
            const int64_t k = PYTFM_MIN(len, capacity - total);
            memcpy(out + total, tok->tok_bytes + tok->tok_off[ids[i]], (size_t)k);
        }
        total += len; /* a token has at most PYTFM_TOKENIZER_MAX_FILE bytes: no overflow */
    }
    *size = total;
    if (total > capacity && (out != NULL || capacity != 0))
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: the ids need %lld bytes, capacity is %lld", __func__,
                           (long long)total, (long long)capacity);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_tokenizer_token(const pytfm_tokenizer *tok, int32_t id, const char **bytes,
                                   int64_t *size) {
    PYTFM_CHECK(tok != NULL, "%s: tok must not be NULL", __func__);
    PYTFM_CHECK(bytes != NULL && size != NULL, "%s: bytes and size must not be NULL", __func__);
    if (id < 0 || id >= tok->n_tokens)
        return pytfm__fail(PYTFM_STATUS_OUT_OF_RANGE, "%s: id %d is outside the vocabulary "
                           "[0, %lld)", __func__, (int)id, (long long)tok->n_tokens);
    *bytes = (const char *)tok->tok_bytes + tok->tok_off[id];
    *size = tok->tok_off[id + 1] - tok->tok_off[id];
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_tokenizer_merges(const pytfm_tokenizer *tok, int32_t *pairs, int64_t n) {
    PYTFM_CHECK(tok != NULL, "%s: tok must not be NULL", __func__);
    PYTFM_CHECK(n == tok->n_merges, "%s: n must be the merge count, %lld, got %lld", __func__,
                (long long)tok->n_merges, (long long)n);
    PYTFM_CHECK_PTR(pairs, n);
    for (uint64_t i = 0; n > 0 && i <= tok->pair_mask; i++) {
        const uint64_t key = tok->pair_key[i];
        if (key == 0) continue;
        const int32_t rank = tok->pair_rank[i];
        pairs[2 * (int64_t)rank] = (int32_t)((key - 1) >> 32);
        pairs[2 * (int64_t)rank + 1] = (int32_t)(uint32_t)(key - 1);
    }
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_tokenizer_split(const char *text, int64_t size, int64_t *ends,
                                   int64_t capacity, int64_t *count) {
    PYTFM_CHECK(count != NULL, "%s: count must not be NULL", __func__);
    PYTFM_CHECK_MIN(size, 0);
    PYTFM_CHECK_MIN(capacity, 0);
    PYTFM_CHECK_PTR(text, size);
    PYTFM_CHECK_PTR(ends, capacity);
    const unsigned char *start = (const unsigned char *)text, *p = start, *end = p + size;
    int64_t n = 0;
    for (; p < end; n++) {
        p = word_end(p, end);
        if (n < capacity) ends[n] = p - start;
    }
    *count = n;
    if (n > capacity && (ends != NULL || capacity != 0))
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: the text has %lld words, capacity is %lld", __func__,
                           (long long)n, (long long)capacity);
    return PYTFM_STATUS_OK;
}

int64_t pytfm_tokenizer_vocab_size(const pytfm_tokenizer *tok) { return tok ? tok->n_tokens : 0; }

int32_t pytfm_tokenizer_eot(const pytfm_tokenizer *tok) { return tok ? tok->eot : -1; }

int64_t pytfm_tokenizer_merge_count(const pytfm_tokenizer *tok) {
    return tok ? tok->n_merges : 0;
}

const char *pytfm_tokenizer_unicode_version(void) { return PYTFM__UNICODE_VERSION; }

void pytfm_tokenizer_close(pytfm_tokenizer *tok) {
    if (!tok) return;
    if (tok->cache) {
        free(tok->cache->slots);
        free(tok->cache->entries);
        free(tok->cache->keys);
        free(tok->cache->ids);
        free(tok->cache);
    }
    free(tok->tok_off);
    free(tok->tok_bytes);
    free(tok->pair_key);
    free(tok->pair_rank);
    free(tok->pair_made);
    free(tok);
}

/* ---- building a tokenizer from its files ----------------------------------------------------- */

/* What open needs while it checks: the token map (bytes -> id), the merge state. */
typedef struct builder {
    pytfm_tokenizer *t;
    const char *source;         /* the file(s), for messages on what they say together */
    const char *merges_name;    /* for messages on its text alone */
    uint32_t name[256];
    int16_t byte_of[324];
    int32_t *map;               /* id + 1 per slot, 0: empty */
    uint64_t map_mask;
    unsigned char *made;        /* per id: a byte or a merge's result */
    unsigned char *buf;         /* a merge's two parts, as bytes, then the result */
    size_t buf_cap;
} builder;

#define BAD(b, ...) bad_(b, __VA_ARGS__)
static pytfm_status bad_(const builder *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static pytfm_status bad_(const builder *b, const char *fmt, ...) {
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: %s", b->source, what);
}

static pytfm_status no_memory(const builder *b, const char *what) {
    return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %s", b->source, what);
}

/* The bytes of a name in GPT-2's byte alphabet u[0..n) (UTF-8) into out (>= n bytes): their
 * number, or -1 when a character is not one of the 256 (*bad: its code point). */
static int64_t unname(const builder *b, const unsigned char *u, size_t n, unsigned char *out,
                      uint32_t *bad) {
    int64_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        const int len = utf8_at(u + i, n - i, &cp);
        if (len == 0) cp = 0xDC00 | u[i]; /* a lone surrogate from a JSON escape */
        if (len == 0 || cp >= 324 || b->byte_of[cp] < 0) {
            *bad = cp;
            return -1;
        }
        out[k++] = (unsigned char)b->byte_of[cp];
        i += (size_t)len;
    }
    return k;
}

static int32_t map_find(const builder *b, const unsigned char *p, size_t n) {
    const pytfm_tokenizer *t = b->t;
    for (uint64_t i = hash_bytes(p, n) & b->map_mask;; i = (i + 1) & b->map_mask) {
        const int32_t e = b->map[i];
        if (e == 0) return -1;
        const int64_t off = t->tok_off[e - 1], len = t->tok_off[e] - off;
        if ((size_t)len == n && memcmp(t->tok_bytes + off, p, n) == 0) return e - 1;
    }
}

/* A message's rendering of a token's name u[0..n) (UTF-8, as its file writes it): in single
 * quotes when quote is set, control characters as \xHH, cut on a character boundary and ended
 * by "..." past about cap - 8 bytes. cap >= 16. */
static const char *show_name(const unsigned char *u, size_t n, int quote, char *buf,
                             size_t cap) {
    size_t k = 0;
    if (quote) buf[k++] = '\'';
    for (size_t i = 0; i < n; i++) {
        if (k + 8 >= cap) {
            while (k > 1 && ((unsigned char)buf[k - 1] & 0xC0) == 0x80) k--;
            if (k > 1 && (unsigned char)buf[k - 1] >= 0xC0) k--; /* a cut character's lead */
            memcpy(buf + k, "...", 3);
            k += 3;
            break;
        }
        if (u[i] < 0x20 || u[i] == 0x7F) k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", u[i]);
        else buf[k++] = (char)u[i];
    }
    if (quote) buf[k++] = '\'';
    buf[k] = 0;
    return buf;
}

/* The name of token bytes p[0..n) (GPT-2's byte alphabet), quoted, for a message. cap <= 96. */
static const char *show_token(const builder *b, const unsigned char *p, size_t n, char *buf,
                              size_t cap) {
    unsigned char u[96];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 2 <= sizeof u; i++) { /* names are below U+0800 */
        const uint32_t c = b->name[p[i]];
        if (c < 0x80) {
            u[k++] = (unsigned char)c;
        } else {
            u[k++] = (unsigned char)(0xC0 | c >> 6);
            u[k++] = (unsigned char)(0x80 | (c & 0x3F));
        }
    }
    return show_name(u, k, 1, buf, cap);
}

static uint64_t table_size(int64_t n) {
    uint64_t size = 16;
    while (size < (uint64_t)n * 2) size *= 2;
    return size;
}

/* The vocabulary: a JSON object {token: id} of a checked text. */
static pytfm_status read_vocab(builder *b, pytfm__json vocab) {
    pytfm_tokenizer *t = b->t;
    if (pytfm__json_kind_of(vocab) != PYTFM__JSON_OBJECT)
        return BAD(b, "the vocabulary must be a JSON object {token: id}, got a JSON %s",
                   pytfm__json_kind_name(pytfm__json_kind_of(vocab)));
    const size_t count = pytfm__json_count(vocab);
    if (count < 256 || count > PYTFM_TOKENIZER_MAX_TOKENS)
        return BAD(b, "a byte-level vocabulary has 256 to %d tokens, got %zu",
                   PYTFM_TOKENIZER_MAX_TOKENS, count);
    const int64_t n = (int64_t)count;
    t->n_tokens = n;
    size_t text = 0;
    pytfm__json_iter it = pytfm__json_iter_of(vocab);
    pytfm__json key, value;
    while (pytfm__json_next(&it, &key, &value)) text += key.n;
    int64_t *len = calloc((size_t)n, sizeof *len);
    int64_t *at = calloc((size_t)n, sizeof *at);
    unsigned char *raw = malloc(text + 1), *tmp = malloc(text + 1);
    t->tok_off = calloc((size_t)n + 1, sizeof *t->tok_off);
    t->tok_bytes = malloc(text + 1);
    b->made = calloc((size_t)n, 1);
    b->map_mask = table_size(n) - 1;
    b->map = calloc(b->map_mask + 1, sizeof *b->map);
    pytfm_status status = PYTFM_STATUS_OK;
    if (!len || !at || !raw || !tmp || !t->tok_off || !t->tok_bytes || !b->made || !b->map) {
        status = no_memory(b, "the vocabulary's tables");
        goto done;
    }
    /* each token's bytes, at the place of its id */
    it = pytfm__json_iter_of(vocab);
    size_t used = 0;
    char shown[96];
    while (pytfm__json_next(&it, &key, &value)) {
        const pytfm__json_int v = pytfm__json_kind_of(value) == PYTFM__JSON_NUMBER
                                      ? pytfm__json_integer(value)
                                      : (pytfm__json_int){0, 0, 0, 0};
        int lone = 0;
        const size_t u = pytfm__json_string_utf8(key, (char *)tmp, &lone);
        if (!v.integer || !v.fits || v.value < 0 || v.value >= n) {
            status = BAD(b, "token %s has id %s: ids are the integers 0 .. %lld",
                         show_name(tmp, u, 1, shown, 48), pytfm__json_show(value, shown + 48, 48),
                         (long long)(n - 1));
            goto done;
        }
        const int64_t id = v.value;
        if (len[id] != 0) {
            status = BAD(b, "id %lld is given to two tokens", (long long)id);
            goto done;
        }
        uint32_t bad = 0;
        const int64_t k = lone ? -1 : unname(b, tmp, u, raw + used, &bad);
        if (lone) bad = 0xD800;
        if (k < 0 || u == 0) {
            status = u == 0 ? BAD(b, "a token is the empty string")
                            : BAD(b, "token %s holds U+%04X, which is not one of the 256 byte "
                                     "characters", show_name(tmp, u, 1, shown, 64), bad);
            goto done;
        }
        at[id] = (int64_t)used;
        len[id] = k;
        used += (size_t)k;
    }
    for (int64_t i = 0, off = 0; i < n; i++) {
        memcpy(t->tok_bytes + off, raw + at[i], (size_t)len[i]);
        off += len[i];
        t->tok_off[i + 1] = off;
    }
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *p = t->tok_bytes + t->tok_off[i];
        const size_t k = (size_t)(t->tok_off[i + 1] - t->tok_off[i]);
        uint64_t s = hash_bytes(p, k) & b->map_mask;
        for (; b->map[s] != 0; s = (s + 1) & b->map_mask) {
            const int32_t e = b->map[s] - 1;
            if ((size_t)(t->tok_off[e + 1] - t->tok_off[e]) == k &&
                memcmp(t->tok_bytes + t->tok_off[e], p, k) == 0) {
                status = BAD(b, "token %s appears twice", show_token(b, p, k, shown, sizeof shown));
                goto done;
            }
        }
        b->map[s] = (int32_t)(i + 1);
    }
    for (int c = 0; c < 256; c++) {
        const unsigned char byte = (unsigned char)c;
        const int32_t id = map_find(b, &byte, 1);
        if (id < 0) {
            status = BAD(b, "byte token %s (byte 0x%02x) is missing: a byte-level "
                            "vocabulary has all 256", show_token(b, &byte, 1, shown, 16), c);
            goto done;
        }
        t->byte_id[c] = id;
        b->made[id] = 1;
    }
    t->eot = map_find(b, (const unsigned char *)ENDOFTEXT, ENDOFTEXT_LEN);
done:
    free(len);
    free(at);
    free(raw);
    free(tmp);
    return status;
}

/* Prepare for n merges (at most the tokens less the bytes: each makes a new token). */
static pytfm_status start_merges(builder *b, int64_t n) {
    pytfm_tokenizer *t = b->t;
    if (n > t->n_tokens - 256)
        return BAD(b, "%lld merges for %lld tokens: each merge makes a token, and 256 are "
                      "bytes", (long long)n, (long long)t->n_tokens);
    const uint64_t size = table_size(n);
    t->pair_mask = size - 1;
    t->pair_key = calloc(size, sizeof *t->pair_key);
    t->pair_rank = malloc(size * sizeof *t->pair_rank);
    t->pair_made = malloc(size * sizeof *t->pair_made);
    b->buf_cap = 0;
    if (!t->pair_key || !t->pair_rank || !t->pair_made) return no_memory(b, "the merges' table");
    return PYTFM_STATUS_OK;
}

/* The merge of rank t->n_merges: its parts' names a[0..na), c[0..nc) (UTF-8 byte alphabet). */
static pytfm_status add_merge(builder *b, const unsigned char *a, size_t na,
                              const unsigned char *c, size_t nc) {
    pytfm_tokenizer *t = b->t;
    const int64_t rank = t->n_merges;
    if (rank >= t->n_tokens - 256)
        return BAD(b, "more merges than the %lld tokens less the 256 bytes can make",
                   (long long)t->n_tokens);
    if (na + nc > b->buf_cap) {
        size_t cap = 2 * (na + nc) + 64;
        unsigned char *p = realloc(b->buf, 2 * cap);
        if (!p) return no_memory(b, "a merge");
        b->buf = p;
        b->buf_cap = cap;
    }
    unsigned char *out = b->buf;
    /* the messages name the merge and its tokens as the file writes them: (a c), 'a', 'ac' */
    char sa[48], sc[48], part[64];
    show_name(a, na, 0, sa, sizeof sa);
    show_name(c, nc, 0, sc, sizeof sc);
    int32_t ids[2];
    int64_t lens[2];
    const unsigned char *parts[2] = {a, c};
    const size_t sizes[2] = {na, nc};
    for (int k = 0; k < 2; k++) {
        uint32_t bad = 0;
        unsigned char *dst = k == 0 ? out : out + lens[0];
        lens[k] = unname(b, parts[k], sizes[k], dst, &bad);
        ids[k] = lens[k] > 0 ? map_find(b, dst, (size_t)lens[k]) : -1;
        show_name(parts[k], sizes[k], 1, part, sizeof part);
        if (ids[k] < 0)
            return BAD(b, "merge %lld (%s %s): %s is not a token of the vocabulary",
                       (long long)rank, sa, sc, part);
        if (!b->made[ids[k]])
            return BAD(b, "merge %lld (%s %s): %s is neither a byte nor made by an earlier "
                          "merge", (long long)rank, sa, sc, part);
    }
    const size_t total = (size_t)(lens[0] + lens[1]);
    const int32_t made = map_find(b, out, total);
    if (made < 0 || b->made[made]) {
        unsigned char joined[96];
        const size_t ka = PYTFM_MIN(na, sizeof joined), kc = PYTFM_MIN(nc, sizeof joined - ka);
        memcpy(joined, a, ka);
        memcpy(joined + ka, c, kc);
        show_name(joined, ka + kc, 1, part, sizeof part);
        return BAD(b, "merge %lld (%s %s) makes %s, which %s", (long long)rank, sa, sc, part,
                   made < 0 ? "is not in the vocabulary"
                            : "a byte or an earlier merge already made");
    }
    b->made[made] = 1;
    const uint64_t key = pair_key(ids[0], ids[1]);
    uint64_t i = hash_pair(key) & t->pair_mask;
    while (t->pair_key[i] != 0) i = (i + 1) & t->pair_mask;
    t->pair_key[i] = key;
    t->pair_rank[i] = (int32_t)rank;
    t->pair_made[i] = made;
    t->n_merges++;
    return PYTFM_STATUS_OK;
}

/* After the merges: every token a byte, a merge's result or <|endoftext|>. */
static pytfm_status finish_checks(builder *b) {
    const pytfm_tokenizer *t = b->t;
    for (int64_t i = 0; i < t->n_tokens; i++) {
        if (b->made[i] || i == t->eot) continue;
        char shown[64];
        return BAD(b, "token %s (id %lld) is made by no merge",
                   show_token(b, t->tok_bytes + t->tok_off[i],
                        (size_t)(t->tok_off[i + 1] - t->tok_off[i]), shown, sizeof shown),
                   (long long)i);
    }
    return PYTFM_STATUS_OK;
}

/* source: the file(s) or text(s), for messages; merges_name: the merges.txt among them */
static pytfm_status new_builder(builder *b, const char *merges_name, const char *source) {
    memset(b, 0, sizeof *b);
    b->source = source;
    b->merges_name = merges_name;
    byte_names(b->name, b->byte_of);
    b->t = calloc(1, sizeof *b->t);
    if (!b->t) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", source);
    b->t->eot = -1;
    return PYTFM_STATUS_OK;
}

/* The end of open: the cache (none when it cannot be allocated), *out, the builder freed. */
static pytfm_status finish_builder(builder *b, pytfm_status status, pytfm_tokenizer **out) {
    if (status == PYTFM_STATUS_OK) status = finish_checks(b);
    free(b->map);
    free(b->made);
    free(b->buf);
    if (status != PYTFM_STATUS_OK) {
        pytfm_tokenizer_close(b->t);
        return status;
    }
    word_cache *c = calloc(1, sizeof *c);
    if (c) {
        atomic_flag_clear(&c->busy);
        c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
        c->entries = malloc(CACHE_ENTRIES * sizeof *c->entries);
        c->keys = malloc(CACHE_KEY_BYTES);
        c->ids = malloc(CACHE_IDS * sizeof *c->ids);
        if (!c->slots || !c->entries || !c->keys || !c->ids) {
            free(c->slots);
            free(c->entries);
            free(c->keys);
            free(c->ids);
            free(c);
            c = NULL;
        }
    }
    b->t->cache = c;
    *out = b->t;
    return PYTFM_STATUS_OK;
}

/* ---- merges.txt ------------------------------------------------------------------------------ */

static pytfm_status read_merges_txt(builder *b, const char *text, size_t size) {
    const char *why = "";
    const size_t bad = pytfm__utf8_check(text, size, &why);
    if (bad < size)
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: not UTF-8 (byte %zu: %s)",
                           b->merges_name, bad, why);
    const char *p = text, *end = text + size;
    /* the lines: split at '\n'; a "#version" first line and a final empty line dropped.
     * Messages count the file's lines from 1, the "#version" line included. */
    int64_t line = 1;
    if (end - p >= 8 && memcmp(p, "#version", 8) == 0) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl + 1 : end;
        if (!nl) return start_merges(b, 0);
        line = 2;
    }
    int64_t lines = 0;
    for (const char *q = p; q < end; lines++) {
        const char *nl = memchr(q, '\n', (size_t)(end - q));
        q = nl ? nl + 1 : end;
    }
    PYTFM_TRY(start_merges(b, lines));
    for (; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *stop = nl ? nl : end;
        const char *space = memchr(p, ' ', (size_t)(stop - p));
        if (!space || space == p || space + 1 == stop ||
            memchr(space + 1, ' ', (size_t)(stop - space - 1))) {
            char shown[64];
            return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: line %lld: %s is not a merge "
                               "('a b': two tokens and one space)", b->merges_name,
                               (long long)line, show_name((const unsigned char *)p,
                                                          (size_t)(stop - p), 1, shown,
                                                          sizeof shown));
        }
        PYTFM_TRY(add_merge(b, (const unsigned char *)p, (size_t)(space - p),
                            (const unsigned char *)space + 1, (size_t)(stop - space - 1)));
        p = nl ? nl + 1 : end;
    }
    return PYTFM_STATUS_OK;
}

/* ---- JSON texts ------------------------------------------------------------------------------ */

/* The JSON text of the file name: strict UTF-8, valid JSON. */
static pytfm_status check_json(const builder *b, const char *name, const char *text,
                               size_t size) {
    const char *why = "";
    const size_t bad = pytfm__utf8_check(text, size, &why);
    if (bad < size)
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: not UTF-8 (byte %zu: %s)", name,
                           bad, why);
    pytfm__json_error err;
    const pytfm_status status = pytfm__json_check(text, size, &err);
    if (status == PYTFM_STATUS_OUT_OF_MEMORY) return no_memory(b, "the JSON check");
    if (status != PYTFM_STATUS_OK)
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: not valid JSON (%s: byte %zu)",
                           name, err.what, err.offset);
    return PYTFM_STATUS_OK;
}

/* The member key of object obj: 1 and *value, or 0 when it has none. */
static int member(pytfm__json obj, const char *key, pytfm__json *value) {
    if (pytfm__json_kind_of(obj) != PYTFM__JSON_OBJECT) return 0;
    pytfm__json_iter it = pytfm__json_iter_of(obj);
    pytfm__json k, v;
    while (pytfm__json_next(&it, &k, &v))
        if (pytfm__json_string_is(k, key)) {
            *value = v;
            return 1;
        }
    return 0;
}

/* the member is absent, null, or one of: "" (string_ok), false (false_ok) */
static int absent_or(pytfm__json obj, const char *key, int string_ok, int false_ok) {
    pytfm__json v;
    if (!member(obj, key, &v)) return 1;
    const pytfm__json_kind kind = pytfm__json_kind_of(v);
    return kind == PYTFM__JSON_NULL || (string_ok && v.n == 2 && v.p[0] == '"') ||
           (false_ok && kind == PYTFM__JSON_BOOL && v.p[0] == 'f');
}

static int is_type(pytfm__json obj, const char *type) {
    pytfm__json v;
    return member(obj, "type", &v) && pytfm__json_string_is(v, type);
}

static pytfm_status read_tokenizer_json(builder *b, const char *text, size_t size) {
    PYTFM_TRY(check_json(b, b->source, text, size));
    const pytfm__json doc = pytfm__json_root(text, size);
    pytfm__json model, part, merges, vocab;
    if (pytfm__json_kind_of(doc) != PYTFM__JSON_OBJECT) return BAD(b, "not a JSON object");
    if (!member(doc, "model", &model) || !is_type(model, "BPE"))
        return BAD(b, "model.type must be \"BPE\"");
    static const struct {
        const char *key;
        int string_ok, false_ok;
    } settings[] = {{"dropout", 0, 0},       {"unk_token", 0, 0},
                    {"continuing_subword_prefix", 1, 0}, {"end_of_word_suffix", 1, 0},
                    {"fuse_unk", 0, 1},      {"byte_fallback", 0, 1},
                    {"ignore_merges", 0, 1}};
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
        if (!absent_or(model, settings[i].key, settings[i].string_ok, settings[i].false_ok))
            return BAD(b, "model.%s must be absent%s (GPT-2's BPE has none)", settings[i].key,
                       settings[i].string_ok  ? ", null or \"\""
                       : settings[i].false_ok ? ", null or false" : " or null");
    if (!absent_or(doc, "normalizer", 0, 0))
        return BAD(b, "normalizer must be null (GPT-2 has none)");
    if (!member(doc, "pre_tokenizer", &part) || !is_type(part, "ByteLevel"))
        return BAD(b, "pre_tokenizer must be ByteLevel");
    pytfm__json v;
    if (!member(part, "add_prefix_space", &v) || !(v.n == 5 && memcmp(v.p, "false", 5) == 0) ||
        (member(part, "use_regex", &v) && !(v.n == 4 && memcmp(v.p, "true", 4) == 0)))
        return BAD(b, "pre_tokenizer: GPT-2's has add_prefix_space false and use_regex true");
    if (member(doc, "decoder", &part) && pytfm__json_kind_of(part) != PYTFM__JSON_NULL &&
        !is_type(part, "ByteLevel"))
        return BAD(b, "decoder must be ByteLevel or null");
    if (member(doc, "added_tokens", &part) && pytfm__json_kind_of(part) != PYTFM__JSON_NULL) {
        if (pytfm__json_kind_of(part) != PYTFM__JSON_ARRAY)
            return BAD(b, "added_tokens must be a list");
        pytfm__json_iter it = pytfm__json_iter_of(part);
        pytfm__json item;
        while (pytfm__json_next(&it, NULL, &item))
            if (!member(item, "content", &v) || !pytfm__json_string_is(v, ENDOFTEXT))
                return BAD(b, "added tokens: the only special token known is " ENDOFTEXT);
    }
    if (!member(model, "vocab", &vocab)) return BAD(b, "model.vocab is missing");
    if (!member(model, "merges", &merges) || pytfm__json_kind_of(merges) != PYTFM__JSON_ARRAY)
        return BAD(b, "model.merges must be a list");
    PYTFM_TRY(read_vocab(b, vocab));
    PYTFM_TRY(start_merges(b, (int64_t)pytfm__json_count(merges)));
    /* each merge: "a b" or [a, b]; unescaped into one buffer of the merge's text size */
    pytfm__json_iter it = pytfm__json_iter_of(merges);
    pytfm__json m;
    unsigned char *u = NULL;
    size_t u_cap = 0;
    pytfm_status status = PYTFM_STATUS_OK;
    for (int64_t rank = 0; status == PYTFM_STATUS_OK && pytfm__json_next(&it, NULL, &m);
         rank++) {
        if (m.n + 1 > u_cap) {
            u_cap = 2 * m.n + 64;
            unsigned char *p = realloc(u, u_cap);
            if (!p) {
                status = no_memory(b, "a merge");
                break;
            }
            u = p;
        }
        size_t na = 0, nc = 0;
        const unsigned char *a = u, *c = NULL;
        int lone = 0, ok = 0;
        if (pytfm__json_kind_of(m) == PYTFM__JSON_STRING) {
            const size_t n = pytfm__json_string_utf8(m, (char *)u, &lone);
            const unsigned char *sp = memchr(u, ' ', n);
            ok = sp && !memchr(sp + 1, ' ', n - (size_t)(sp - u) - 1);
            if (ok) {
                na = (size_t)(sp - u);
                c = sp + 1;
                nc = n - na - 1;
            }
        } else if (pytfm__json_kind_of(m) == PYTFM__JSON_ARRAY && pytfm__json_count(m) == 2) {
            pytfm__json_iter pi = pytfm__json_iter_of(m);
            pytfm__json x, y;
            pytfm__json_next(&pi, NULL, &x);
            pytfm__json_next(&pi, NULL, &y);
            if (pytfm__json_kind_of(x) == PYTFM__JSON_STRING &&
                pytfm__json_kind_of(y) == PYTFM__JSON_STRING) {
                int lone2 = 0;
                na = pytfm__json_string_utf8(x, (char *)u, &lone);
                c = u + na;
                nc = pytfm__json_string_utf8(y, (char *)u + na, &lone2);
                lone |= lone2;
                ok = 1;
            }
        }
        if (!ok) {
            char shown[64];
            status = BAD(b, "model.merges[%lld]: %s is not a merge ('a b' or [a, b])",
                         (long long)rank, pytfm__json_show(m, shown, sizeof shown));
        } else if (na == 0 || nc == 0) {
            status = BAD(b, "model.merges[%lld]: a part is empty", (long long)rank);
        } else {
            status = add_merge(b, a, na, c, nc);
        }
    }
    free(u);
    return status;
}

/* ---- files ----------------------------------------------------------------------------------- */

/* The whole file at path, at most PYTFM_TOKENIZER_MAX_FILE bytes: *text (free it), *size.
 * *err: errno of a system call that failed, else 0. */
static pytfm_status read_file(const char *path, char **text, size_t *size, int *err) {
    *text = NULL;
    *size = 0;
    *err = 0;
    /* O_NONBLOCK: a FIFO must not block the open (fstat then refuses it) */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        *err = errno;
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: cannot open (%s)", path,
                           strerror(*err));
    }
    struct stat sb;
    pytfm_status status = PYTFM_STATUS_OK;
    char *buf = NULL;
    size_t got = 0;
    if (fstat(fd, &sb) != 0) {
        *err = errno;
        status = pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: cannot stat (%s)", path,
                             strerror(*err));
    } else if (!S_ISREG(sb.st_mode)) {
        status = pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: not a regular file", path);
    } else if (sb.st_size > PYTFM_TOKENIZER_MAX_FILE) {
        status = pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: %lld bytes, more than the %d "
                             "a tokenizer file may have", path, (long long)sb.st_size,
                             PYTFM_TOKENIZER_MAX_FILE);
    } else {
        const int flags = fcntl(fd, F_GETFL);
        if (flags != -1) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        const size_t want = (size_t)sb.st_size + 1; /* one more: a file that grew is seen */
        buf = malloc(want);
        if (!buf) {
            status = pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes",
                                 path, want);
        }
        while (buf && status == PYTFM_STATUS_OK && got < want) {
            const ssize_t k = read(fd, buf + got, want - got);
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) {
                *err = errno;
                status = pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: cannot read (%s)",
                                     path, strerror(*err));
            }
            if (k <= 0) break;
            got += (size_t)k;
        }
        if (status == PYTFM_STATUS_OK && got == want)
            status = pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: the file grew while it "
                                 "was being read", path);
    }
    close(fd);
    if (status != PYTFM_STATUS_OK) {
        free(buf);
        return status;
    }
    *text = buf;
    *size = got;
    return status;
}

/* status, with errno set as the header says: err after a failed system call, else 0 */
static pytfm_status with_errno(pytfm_status status, int err) {
    if (status != PYTFM_STATUS_OK) errno = err;
    return status;
}

/* ---- opening ------------------------------------------------------------------------------- */

static pytfm_status open_texts(const char *vocab, size_t vocab_size, const char *merges,
                               size_t merges_size, const char *vocab_name,
                               const char *merges_name, pytfm_tokenizer **out) {
    const size_t n = strlen(vocab_name) + strlen(merges_name) + 8;
    char *source = malloc(n);
    if (!source) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", vocab_name);
    snprintf(source, n, "%s and %s", vocab_name, merges_name);
    builder b;
    pytfm_status status = new_builder(&b, merges_name, source);
    if (status == PYTFM_STATUS_OK) {
        status = check_json(&b, vocab_name, vocab, vocab_size);
        if (status == PYTFM_STATUS_OK)
            status = read_vocab(&b, pytfm__json_root(vocab, vocab_size));
        if (status == PYTFM_STATUS_OK) status = read_merges_txt(&b, merges, merges_size);
        status = finish_builder(&b, status, out);
    }
    free(source);
    return status;
}

static pytfm_status open_json_text(const char *text, size_t size, const char *name,
                                   pytfm_tokenizer **out) {
    builder b;
    PYTFM_TRY(new_builder(&b, NULL, name));
    return finish_builder(&b, read_tokenizer_json(&b, text, size), out);
}

pytfm_status pytfm_tokenizer_open_memory(const char *vocab, int64_t vocab_size,
                                         const char *merges, int64_t merges_size,
                                         pytfm_tokenizer **out) {
    PYTFM_CHECK(out != NULL, "%s: out must not be NULL", __func__);
    *out = NULL;
    PYTFM_CHECK(vocab_size >= 0 && vocab_size <= PYTFM_TOKENIZER_MAX_FILE,
                "%s: vocab_size must be in [0, %d], got %lld", __func__,
                PYTFM_TOKENIZER_MAX_FILE, (long long)vocab_size);
    PYTFM_CHECK(merges_size >= 0 && merges_size <= PYTFM_TOKENIZER_MAX_FILE,
                "%s: merges_size must be in [0, %d], got %lld", __func__,
                PYTFM_TOKENIZER_MAX_FILE, (long long)merges_size);
    PYTFM_CHECK_PTR(vocab, vocab_size);
    PYTFM_CHECK_PTR(merges, merges_size);
    return with_errno(open_texts(vocab ? vocab : "", (size_t)vocab_size, merges ? merges : "",
                                 (size_t)merges_size, "the vocabulary", "the merges", out),
                      0);
}

pytfm_status pytfm_tokenizer_open_json_memory(const char *text, int64_t size,
                                              pytfm_tokenizer **out) {
    PYTFM_CHECK(out != NULL, "%s: out must not be NULL", __func__);
    *out = NULL;
    PYTFM_CHECK(size >= 0 && size <= PYTFM_TOKENIZER_MAX_FILE,
                "%s: size must be in [0, %d], got %lld", __func__, PYTFM_TOKENIZER_MAX_FILE,
                (long long)size);
    PYTFM_CHECK_PTR(text, size);
    return with_errno(open_json_text(text ? text : "", (size_t)size, "tokenizer.json", out), 0);
}

pytfm_status pytfm_tokenizer_open(const char *vocab_path, const char *merges_path,
                                  pytfm_tokenizer **out) {
    PYTFM_CHECK(out != NULL, "%s: out must not be NULL", __func__);
    *out = NULL;
    PYTFM_CHECK(vocab_path != NULL && merges_path != NULL,
                "%s: vocab_path and merges_path must not be NULL", __func__);
    char *vocab = NULL, *merges = NULL;
    size_t vocab_size = 0, merges_size = 0;
    int err = 0;
    pytfm_status status = read_file(vocab_path, &vocab, &vocab_size, &err);
    if (status == PYTFM_STATUS_OK) status = read_file(merges_path, &merges, &merges_size, &err);
    if (status == PYTFM_STATUS_OK)
        status = open_texts(vocab, vocab_size, merges, merges_size, vocab_path, merges_path, out);
    free(vocab);
    free(merges);
    return with_errno(status, err);
}

pytfm_status pytfm_tokenizer_open_json(const char *path, pytfm_tokenizer **out) {
    PYTFM_CHECK(out != NULL, "%s: out must not be NULL", __func__);
    *out = NULL;
    PYTFM_CHECK(path != NULL, "%s: path must not be NULL", __func__);
    char *text = NULL;
    size_t size = 0;
    int err = 0;
    pytfm_status status = read_file(path, &text, &size, &err);
    if (status == PYTFM_STATUS_OK) status = open_json_text(text, size, path, out);
    free(text);
    return with_errno(status, err);
}

pytfm_status pytfm_tokenizer_open_folder(const char *folder, pytfm_tokenizer **out) {
    PYTFM_CHECK(out != NULL, "%s: out must not be NULL", __func__);
    *out = NULL;
    PYTFM_CHECK(folder != NULL, "%s: folder must not be NULL", __func__);
    static const char *const names[3] = {"vocab.json", "merges.txt", "tokenizer.json"};
    char *paths[3] = {NULL, NULL, NULL};
    int there[3];
    pytfm_status status = PYTFM_STATUS_OK;
    for (int i = 0; i < 3; i++) {
        const size_t n = strlen(folder) + strlen(names[i]) + 2;
        paths[i] = malloc(n);
        if (!paths[i]) {
            status = pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate", folder);
            break;
        }
        snprintf(paths[i], n, "%s/%s", folder, names[i]);
        struct stat sb;
        there[i] = stat(paths[i], &sb) == 0;
    }
    if (status != PYTFM_STATUS_OK) {
        /* paths[] freed below */
    } else if (there[0] && there[1]) {
        status = pytfm_tokenizer_open(paths[0], paths[1], out);
    } else if (there[2]) {
        status = pytfm_tokenizer_open_json(paths[2], out);
    } else if (there[0] || there[1]) {
        status = with_errno(pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                                        "the folder %s has %s but no %s (and no tokenizer.json)",
                                        folder, names[there[0] ? 0 : 1], names[there[0] ? 1 : 0]),
                            ENOENT);
    } else {
        status = with_errno(pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "the folder %s has no "
                                        "tokenizer (vocab.json and merges.txt, or "
                                        "tokenizer.json)", folder),
                            ENOENT);
    }
    const int err = errno; /* free() may not change it, but keep it plain */
    for (int i = 0; i < 3; i++) free(paths[i]);
    errno = err;
    return status;
}
