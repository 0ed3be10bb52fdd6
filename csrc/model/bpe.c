/*
 * bpe.c — the BPE tokenizer of Hugging Face tokenizer.json files and GPT-2's vocabulary
 * (pytfm_tokenizer.h, and pytfm.tokenizer's engine): the files' checks and the folder rule,
 * the normalizer, the pre-tokenizer as a hand-written scanner over UTF-8, merges by rank, a
 * cache of words, the decoder.
 *
 * Byte-level files (GPT-2's, Llama 3's, Qwen's): a token is held as its bytes (GPT-2's
 * vocabulary names byte b by the printable character bytes_to_unicode gives it; that naming is
 * undone once, at open) and a word starts from its bytes. Files with model.byte_fallback
 * (SentencePiece's: Llama 2's, Gemma's) hold their tokens as text: a token is held as its
 * name's UTF-8 ("\u2581the"), a word starts from its characters, each the token of its text or,
 * when there is none, its bytes' tokens <0xNN>; normalizer, pre-tokenizer and decoder are the
 * file's steps, run as tokenizers runs them (text_step).
 *
 * Merges are a hash map from a pair of ids to (rank, the id it makes). A word is merged as
 * Hugging Face tokenizers' BPE merges it: a linked list of its symbols and a min-heap of (rank,
 * position, the id made) of the adjacent pairs that have a merge, the lowest rank first and,
 * among equal ranks, the leftmost first. For GPT-2's merges (each part made by an earlier
 * merge, one pair per token) that is GPT-2's order; Llama 3's merges (a token made by several
 * pairs, parts made by later merges) need the heap's exact rule: an entry is stale when popped,
 * and skipped, when the pair at its position now makes another id (a pair making the same id
 * at another rank is merged at the entry's rank, as tokenizers does). Llama 3's and Qwen 2's
 * pre-tokenizer (a Split regex) is a second scanner beside GPT-2's; any other Split regex runs
 * on regex.c. model.ignore_merges takes a word that is a token whole. */
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
#include "regex.h"
#include "unicode_tables.h"
#include "utf8.h"

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

/* A token of tokenizer.json's added_tokens (GPT-2's vocab.json: <|endoftext|>), matched in
 * the text before the pre-tokenizer as Hugging Face tokenizers' AddedVocabulary does: its
 * content is the bytes of its id. pass 0 holds the tokens with normalized false, pass 1 the
 * others (matched in what pass 0 leaves; with no normalizer the text is the same). */
typedef struct added_token {
    int32_t id;
    unsigned char special, lstrip, rstrip, single_word, pass;
} added_token;

/* The added tokens' contents as a trie: (node, byte) -> child in a hash map; end[node] is the
 * added token whose content ends there, or -1. first[p][c]: a token of pass p begins with c. */
typedef struct added_trie {
    uint64_t *key; /* (node << 8 | byte) + 1, 0: empty */
    int32_t *child, *end;
    uint64_t mask;
    int32_t n_nodes;
    unsigned char first[2][256];
} added_trie;

/* A step of a normalizer or a decoder of a file whose tokens are text (model.byte_fallback),
 * or of its pre-tokenizer. a, b: strings the step owns. */
typedef struct text_step {
    int kind;                /* a STEP_ value */
    unsigned char *a, *b;    /* Prepend: a; Replace: a -> b; Strip, Metaspace: a, the character */
    size_t na, nb;
    int64_t start, stop;     /* Strip: characters cut at the start, at the end; Metaspace's
                              * decoder: start 1 when it drops the first token's a (its
                              * prepend_scheme is not "never") */
} text_step;

enum {
    STEP_NFC, STEP_PREPEND, STEP_REPLACE, /* normalizers */
    STEP_BYTE_FALLBACK, STEP_FUSE, STEP_STRIP, STEP_METASPACE /* decoders (and Replace) */
};

/* Split behaviors, as tokenizers' SplitDelimiterBehavior */
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_PREVIOUS, SPLIT_NEXT, SPLIT_CONTIGUOUS };

/* Metaspace's prepend_scheme */
enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };

/* A step of a byte-level Sequence pre-tokenizer: split every piece by re's matches (invert:
 * the text between them is what matches), folded by behavior (a SPLIT_ value) */
typedef struct {
    pytfm__regex *re;
    int behavior, invert;
} pre_step;

struct pytfm_tokenizer {
    int64_t n_tokens, n_merges;
    int32_t eot;
    int32_t n_added;
    added_token *added;
    added_trie trie;
    int32_t *tmpl;                /* the post-processor's ids: n_before before the text, then
                                   * n_after after it */
    int64_t n_before, n_after;
    int32_t byte_id[256];
    int64_t *tok_off;         /* token i's bytes: tok_bytes[tok_off[i] .. tok_off[i+1]) */
    unsigned char *tok_bytes;
    uint64_t *pair_key;       /* (a << 32 | b) + 1, 0: empty */
    int32_t *pair_rank, *pair_made;
    uint64_t pair_mask;
    word_cache *cache;        /* NULL when it could not be allocated: encode merges without it */
    int pretok;               /* the pre-tokenizer: a PRE_ value */
    pytfm__regex *split;      /* PRE_REGEX: the Split's pattern, run by regex.c */
    pre_step *steps;          /* PRE_STEPS: the split steps, n_steps of them, in order */
    int n_steps;
    int ignore_merges;        /* model.ignore_merges: a word that is a token is taken whole */
    text_step *norm;          /* the normalizer's steps, n_norm of them (none: no normalizer) */
    int n_norm;
    int32_t *map;             /* with ignore_merges or text tokens: the vocabulary's tokens,
                               * bytes -> id + 1 per slot (0: empty), open addressing by
                               * hash_bytes */
    uint64_t map_mask;
    int64_t n_model;          /* the vocabulary's tokens (ids below it); added ones follow */
    /* model.byte_fallback: tokens are named by their text (SentencePiece's: U+2581 for a
     * space), a character that is no token is its bytes' tokens <0xNN> (byte_id) */
    int text_tokens;
    int32_t ascii_id[128];    /* text tokens: the id of an ASCII character's token, or -1 */
    /* text tokens' pre-tokenizer (pretok PRE_NONE, PRE_METASPACE or PRE_SPLIT): the
     * Metaspace replacement or the Split string, pre_str[0..pre_len) */
    unsigned char *pre_str;
    size_t pre_len;
    int pre_prepend, pre_split; /* Metaspace: a PREPEND_ value; split (MergedWithNext) */
    int split_behavior, split_invert; /* Split: a SPLIT_ value; invert */
    text_step *dec;           /* text tokens' decoder: its steps, n_dec of them; has_dec 0:
                               * no decoder (tokens joined by a space, as tokenizers does) */
    int n_dec, has_dec;
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
    const int k = pytfm__utf8_at(p, n, &cp);
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

/* The Split regexes scanned by hand, recognised by their text: GPT-2's (word_end), Llama 3's
 * and Qwen 2's (split_end; the same but for the digits, GPT-4's cl100k pattern less its
 * case-insensitive letter classes). Any other Split regex is PRE_REGEX, run by regex.c, which
 * tests/model/test_tokenizer_regex.py holds to these scanners. The others are the
 * pre-tokenizers of SentencePiece files: none, Metaspace, a Split of a String. */
enum { PRE_GPT2 = 0, PRE_LLAMA3 = 1, PRE_QWEN2 = 2, PRE_NONE = 3, PRE_METASPACE = 4,
       PRE_SPLIT = 5, PRE_REGEX = 6, PRE_STEPS = 7 };
static const char *const split_regex[3] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

static int ascii_lower(unsigned char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* The end of the word starting at p[0] (p < end) of the Split regexes above, the alternatives
 * in order as a backtracking engine takes the first that matches; digits: the most digits of
 * a number word (3: Llama 3's \p{N}{1,3}, 1: Qwen's \p{N}). (?i:'s) matches "'s", "'S" and
 * "'\u017F" (long s, whose case folding is s), as the Oniguruma engine of tokenizers does. */
static const unsigned char *split_end(const unsigned char *p, const unsigned char *end,
                                      int digits) {
    const size_t left = (size_t)(end - p);
    if (p[0] == '\'' && left >= 2) { /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
        const int c = ascii_lower(p[1]);
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return p + 2;
        if (left >= 3 && p[1] == 0xC5 && p[2] == 0xBF) return p + 3;
        if (left >= 3) {
            const int c2 = ascii_lower(p[2]);
            if ((c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l'))
                return p + 3;
        }
    }
    size_t len, l;
    const int kind = char_at(p, left, &len);
    const unsigned char *q = p + len;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (kind == C_LETTER || (kind != C_NUMBER && p[0] != '\r' && p[0] != '\n' && q < end &&
                             char_at(q, (size_t)(end - q), &l) == C_LETTER)) {
        while (q < end && char_at(q, (size_t)(end - q), &l) == C_LETTER) q += l;
        return q;
    }
    if (kind == C_NUMBER) { /* \p{N}{1,digits} */
        for (int n = 1; n < digits && q < end && char_at(q, (size_t)(end - q), &l) == C_NUMBER;
             n++)
            q += l;
        return q;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    const unsigned char *r = kind == C_OTHER ? q : NULL;
    if (p[0] == ' ' && q < end && char_at(q, (size_t)(end - q), &l) == C_OTHER) r = q + l;
    if (r) {
        while (r < end && char_at(r, (size_t)(end - r), &l) == C_OTHER) r += l;
        while (r < end && (*r == '\r' || *r == '\n')) r++;
        return r;
    }
    /* white space: \s*[\r\n]+ ends after the run's last line end; else \s+(?!\S) | \s+ as
     * GPT-2's pattern (before a non-space the run's last character is left to the next word,
     * unless it is the run's only one) */
    const unsigned char *last = p, *line_end = (p[0] == '\r' || p[0] == '\n') ? q : NULL;
    while (q < end) {
        if (char_at(q, (size_t)(end - q), &l) != C_SPACE) break;
        last = q;
        q += l;
        if (*last == '\r' || *last == '\n') line_end = q;
    }
    if (line_end) return line_end;
    if (q == end || last == p) return q;
    return last;
}

/* ---- NFC (the normalizer of Qwen's tokenizer.json) ------------------------------------------
 * Unicode's algorithm over the tables of unicode_tables.h: full canonical decomposition
 * (Hangul computed), the canonical order (a stable sort of each run of non-zero combining
 * classes), then canonical composition (a character joins the last starter when nothing
 * between them blocks it). A byte of no valid UTF-8 sequence (C callers' text; Python's is
 * valid) is kept as it is, a starter that joins nothing: it is held as NFC_BYTE + the byte. */

enum {
    NFC_BYTE = 0x110000,
    HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
    HANGUL_L_COUNT = 19, HANGUL_V_COUNT = 21, HANGUL_T_COUNT = 28,
    HANGUL_N = HANGUL_V_COUNT * HANGUL_T_COUNT, HANGUL_COUNT = HANGUL_L_COUNT * HANGUL_N
};

static int ccc_of(uint32_t cp) {
    if (cp < PYTFM__CCC_MIN) return 0;
    size_t lo = 0, hi = PYTFM__CCC_RANGES;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (cp < pytfm__ccc_table[mid].first) hi = mid;
        else if (cp > pytfm__ccc_table[mid].last) lo = mid + 1;
        else return pytfm__ccc_table[mid].ccc;
    }
    return 0;
}

/* cp's canonical decomposition (one level), or NULL */
static const uint32_t *decomposition_of(uint32_t cp) {
    if (cp < PYTFM__DECOMPOSES_MIN) return NULL;
    size_t lo = 0, hi = PYTFM__DECOMPOSITIONS;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (cp < pytfm__decomposition[mid][0]) hi = mid;
        else if (cp > pytfm__decomposition[mid][0]) lo = mid + 1;
        else return pytfm__decomposition[mid] + 1;
    }
    return NULL;
}

/* the primary composite of a then b, or 0 */
static uint32_t composite_of(uint32_t a, uint32_t b) {
    if (b < PYTFM__COMPOSE_SECOND_MIN) return 0;
    if (a - HANGUL_L < HANGUL_L_COUNT && b - HANGUL_V < HANGUL_V_COUNT)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_V_COUNT + (b - HANGUL_V)) * HANGUL_T_COUNT;
    if (a - HANGUL_S < HANGUL_COUNT && (a - HANGUL_S) % HANGUL_T_COUNT == 0 && b > HANGUL_T &&
        b - HANGUL_T < HANGUL_T_COUNT)
        return a + (b - HANGUL_T);
    const uint64_t key = (uint64_t)a << 32 | b;
    size_t lo = 0, hi = PYTFM__COMPOSITIONS;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const uint64_t k = (uint64_t)pytfm__composition[mid][0] << 32 | pytfm__composition[mid][1];
        if (key < k) hi = mid;
        else if (key > k) lo = mid + 1;
        else return pytfm__composition[mid][2];
    }
    return 0;
}

typedef struct nfc_buf {
    uint32_t *cp;
    unsigned char *ccc;
    size_t n, cap;
} nfc_buf;

static int nfc_push(nfc_buf *o, uint32_t cp) {
    if (o->n == o->cap) {
        const size_t cap = 2 * o->cap + 64;
        uint32_t *c = realloc(o->cp, cap * sizeof *c);
        if (!c) return 0;
        o->cp = c;
        unsigned char *k = realloc(o->ccc, cap);
        if (!k) return 0;
        o->ccc = k;
        o->cap = cap;
    }
    o->cp[o->n] = cp;
    o->ccc[o->n++] = (unsigned char)(cp >= NFC_BYTE ? 0 : ccc_of(cp));
    return 1;
}

/* cp fully decomposed onto o (decompositions nest at most a few levels) */
static int nfc_decompose(nfc_buf *o, uint32_t cp) {
    if (cp - HANGUL_S < HANGUL_COUNT) {
        const uint32_t s = cp - HANGUL_S, t = s % HANGUL_T_COUNT;
        if (!nfc_push(o, HANGUL_L + s / HANGUL_N) ||
            !nfc_push(o, HANGUL_V + (s % HANGUL_N) / HANGUL_T_COUNT))
            return 0;
        return t == 0 || nfc_push(o, HANGUL_T + t);
    }
    const uint32_t *d = decomposition_of(cp);
    if (!d) return nfc_push(o, cp);
    return nfc_decompose(o, d[0]) && (d[1] == 0 || nfc_decompose(o, d[1]));
}

/* The run o[i..j) of non-zero classes in canonical order: a stable sort by class (insertion
 * for short runs, counting for long ones, so a long run costs its length). */
static int nfc_order(nfc_buf *o, size_t i, size_t j) {
    if (j - i <= 16) {
        for (size_t a = i + 1; a < j; a++)
            for (size_t b = a; b > i && o->ccc[b - 1] > o->ccc[b]; b--) {
                const uint32_t c = o->cp[b];
                const unsigned char k = o->ccc[b];
                o->cp[b] = o->cp[b - 1];
                o->ccc[b] = o->ccc[b - 1];
                o->cp[b - 1] = c;
                o->ccc[b - 1] = k;
            }
        return 1;
    }
    uint32_t *tmp = malloc((j - i) * sizeof *tmp);
    if (!tmp) return 0;
    size_t start[257] = {0};
    for (size_t a = i; a < j; a++) start[o->ccc[a] + 1]++;
    for (int k = 1; k < 257; k++) start[k] += start[k - 1];
    for (size_t a = i; a < j; a++) tmp[start[o->ccc[a]]++] = o->cp[a];
    memcpy(o->cp + i, tmp, (j - i) * sizeof *tmp);
    free(tmp);
    for (size_t a = i; a < j; a++) o->ccc[a] = (unsigned char)ccc_of(o->cp[a]);
    return 1;
}

/* The NFC form of p[0..n): 1 and *out (malloc'd, *out_n bytes) when it differs from the text
 * or may, 0 when the text is its own NFC form for sure (every byte below 0xCC: code points
 * below U+0300, none of which decomposes into, or joins, anything else), -1 out of memory. */
static int nfc(const unsigned char *p, size_t n, unsigned char **out, size_t *out_n) {
    size_t i = 0;
    while (i < n && p[i] < 0xCC) i++;
    if (i == n) return 0;
    nfc_buf o = {0};
    int ok = 1;
    for (i = 0; ok && i < n;) {
        uint32_t cp = 0;
        const int k = pytfm__utf8_at(p + i, n - i, &cp);
        ok = k ? nfc_decompose(&o, cp) : nfc_push(&o, NFC_BYTE + p[i]);
        i += k ? (size_t)k : 1;
    }
    for (size_t a = 0; ok && a < o.n;) {
        if (o.ccc[a] == 0) {
            a++;
            continue;
        }
        size_t b = a;
        while (b < o.n && o.ccc[b] != 0) b++;
        ok = nfc_order(&o, a, b);
        a = b;
    }
    unsigned char *u = ok ? malloc(4 * o.n + 1) : NULL;
    if (!u) {
        free(o.cp);
        free(o.ccc);
        return -1;
    }
    /* composition in place: w is the output's length, starter the last starter's index */
    size_t w = 0, starter = SIZE_MAX;
    int last_ccc = 0;
    for (size_t a = 0; a < o.n; a++) {
        const uint32_t c = o.cp[a];
        const int k = o.ccc[a];
        if (starter != SIZE_MAX && o.cp[starter] < NFC_BYTE && c < NFC_BYTE &&
            (w == starter + 1 || (last_ccc != 0 && last_ccc < k))) {
            const uint32_t joined = composite_of(o.cp[starter], c);
            if (joined) {
                o.cp[starter] = joined;
                continue;
            }
        }
        if (k == 0) starter = w;
        last_ccc = k;
        o.cp[w++] = c;
    }
    size_t m = 0;
    for (size_t a = 0; a < w; a++) {
        const uint32_t c = o.cp[a];
        if (c >= NFC_BYTE) {
            u[m++] = (unsigned char)(c - NFC_BYTE);
        } else if (c < 0x80) {
            u[m++] = (unsigned char)c;
        } else if (c < 0x800) {
            u[m++] = (unsigned char)(0xC0 | c >> 6);
            u[m++] = (unsigned char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            u[m++] = (unsigned char)(0xE0 | c >> 12);
            u[m++] = (unsigned char)(0x80 | (c >> 6 & 0x3F));
            u[m++] = (unsigned char)(0x80 | (c & 0x3F));
        } else {
            u[m++] = (unsigned char)(0xF0 | c >> 18);
            u[m++] = (unsigned char)(0x80 | (c >> 12 & 0x3F));
            u[m++] = (unsigned char)(0x80 | (c >> 6 & 0x3F));
            u[m++] = (unsigned char)(0x80 | (c & 0x3F));
        }
    }
    free(o.cp);
    free(o.ccc);
    *out = u;
    *out_n = m;
    return 1;
}

/* ---- merging a word -------------------------------------------------------------------------- */

typedef struct heap_item {
    int32_t rank, made; /* the pair's merge when it was pushed: its rank, the id it makes */
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

/* The id of the vocabulary's token whose bytes are p[0..n), or -1 (t->map must be set) */
static int32_t vocab_id(const pytfm_tokenizer *t, const unsigned char *p, size_t n) {
    for (uint64_t i = hash_bytes(p, n) & t->map_mask;; i = (i + 1) & t->map_mask) {
        const int32_t e = t->map[i];
        if (e == 0) return -1;
        const int64_t off = t->tok_off[e - 1];
        if ((size_t)(t->tok_off[e] - off) == n && memcmp(t->tok_bytes + off, p, n) == 0)
            return e - 1;
    }
}

/* The symbols word w[0..n) (n >= 1) starts from, into s->id: its number. Byte-level: one per
 * byte. Text tokens (tokenizers' BPE with byte_fallback): one per character that is a token,
 * else one per byte of it (<0xNN>); a byte of no valid UTF-8 sequence is a character that is
 * no token. */
static int64_t word_symbols(const pytfm_tokenizer *t, const unsigned char *w, int64_t n,
                            scratch *s) {
    int32_t *id = s->id;
    if (!t->text_tokens) {
        for (int64_t k = 0; k < n; k++) id[k] = t->byte_id[w[k]];
        return n;
    }
    int64_t m = 0;
    for (int64_t k = 0; k < n;) {
        uint32_t cp = 0;
        const int valid = pytfm__utf8_at(w + k, (size_t)(n - k), &cp);
        const int len = valid ? valid : 1;
        const int32_t tok = w[k] < 0x80 ? t->ascii_id[w[k]]
                          : valid     ? vocab_id(t, w + k, (size_t)len)
                                      : -1;
        if (tok >= 0) id[m++] = tok;
        else
            for (int j = 0; j < len; j++) id[m++] = t->byte_id[w[k + j]];
        k += len;
    }
    return m;
}

/* The ids of the symbols s->id[0..n) (n >= 1) merged, in s->id, in order; their number. */
static int64_t merge_word(const pytfm_tokenizer *t, int64_t n, scratch *s) {
    int32_t *id = s->id;
    int64_t *next = s->next, *prev = s->prev, heap_n = 0;
    for (int64_t k = 0; k < n; k++) {
        next[k] = k + 1;
        prev[k] = k - 1;
    }
    int32_t made;
    for (int64_t k = 0; k + 1 < n; k++) {
        const int32_t r = pair_rank(t, id[k], id[k + 1], &made);
        if (r >= 0) heap_push(s->heap, &heap_n, (heap_item){r, made, k});
    }
    int64_t count = n;
    while (heap_n > 0) {
        const heap_item top = heap_pop(s->heap, &heap_n);
        const int64_t k = top.pos, j = next[k];
        /* stale when the pair there now makes another id (tokenizers' test: a pair of the same
         * result but another rank is merged at this entry's rank) */
        if (id[k] < 0 || j >= n || pair_rank(t, id[k], id[j], &made) < 0 || made != top.made)
            continue;
        id[k] = made;
        id[j] = -1;
        next[k] = next[j];
        if (next[k] < n) prev[next[k]] = k;
        count--;
        if (prev[k] >= 0) {
            const int32_t r = pair_rank(t, id[prev[k]], id[k], &made);
            if (r >= 0) heap_push(s->heap, &heap_n, (heap_item){r, made, prev[k]});
        }
        if (next[k] < n) {
            const int32_t r = pair_rank(t, id[k], id[next[k]], &made);
            if (r >= 0) heap_push(s->heap, &heap_n, (heap_item){r, made, k});
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

/* Tokenize the word p[0..p + n) (n >= 1) into o: whole (ignore_merges), from the cache, or
 * merged. */
static pytfm_status encode_word(const pytfm_tokenizer *t, const unsigned char *p, int64_t n,
                                word_cache *cache, scratch *s, sink *o) {
    const int32_t whole = t->ignore_merges && (n > 1 || t->text_tokens)
                              ? vocab_id(t, p, (size_t)n) : -1;
    if (n == 1 && !t->text_tokens) {
        emit(o, &t->byte_id[p[0]], 1);
    } else if (whole >= 0) {
        emit(o, &whole, 1);
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
            count = merge_word(t, word_symbols(t, p, n, s), s);
            if (h) cache_add(cache, p, (size_t)n, h, s->id, count);
            emit(o, s->id, count);
        }
    }
    return PYTFM_STATUS_OK;
}

/* The first occurrence of pat[0..np) (np >= 1) in p[0..end), or NULL */
static const unsigned char *find_str(const unsigned char *p, const unsigned char *end,
                                     const unsigned char *pat, size_t np) {
    while ((size_t)(end - p) >= np) {
        const unsigned char *q = memchr(p, pat[0], (size_t)(end - p) - np + 1);
        if (!q) return NULL;
        if (memcmp(q, pat, np) == 0) return q;
        p = q + 1;
    }
    return NULL;
}

/* p[0..n) with every occurrence of a[0..na) (na >= 1, left to right, not overlapping)
 * replaced by b[0..nb): 1 and *out (malloc'd, *out_n bytes), 0 when a does not occur, -1 out
 * of memory. */
/* The most bytes the normalizer's steps may make of a text of n bytes, and the decoder's of the
 * tokens' names: GROWTH times n, and GROWTH_SLACK more. Chained Replace steps multiply a text's
 * size by each one's factor, to any size from a few bytes of a hostile file (four steps that
 * each make 100 bytes of one turn 1 byte into 100 MB); the real files' steps make at most 3
 * bytes of one (Llama 2's Prepend and Replace of a space by U+2581, Gemma's Replace). */
enum { GROWTH = 8, GROWTH_SLACK = 4096 };

static size_t most_grown(size_t n) {
    return n > (SIZE_MAX - GROWTH_SLACK) / GROWTH ? SIZE_MAX : GROWTH * n + GROWTH_SLACK;
}

/* The occurrences of a[0..na) in p[0..n), left to right, none overlapping */
static size_t occurrences(const unsigned char *p, size_t n, const unsigned char *a, size_t na) {
    const unsigned char *end = p + n;
    size_t count = 0;
    for (const unsigned char *q = find_str(p, end, a, na); q; q = find_str(q + na, end, a, na))
        count++;
    return count;
}

/* The bytes n bytes make when count occurrences of na bytes each become nb (SIZE_MAX past it) */
static size_t replaced_size(size_t n, size_t count, size_t na, size_t nb) {
    if (nb > na && count > (SIZE_MAX - n) / (nb - na)) return SIZE_MAX;
    return n - count * na + count * nb;
}

/* p[0..n) with each of its count occurrences of a (occurrences()) replaced by b: 1 and *out
 * (malloc'd, *out_n bytes), 0 when count is 0, -1 out of memory */
static int replace_all(const unsigned char *p, size_t n, const unsigned char *a, size_t na,
                       const unsigned char *b, size_t nb, size_t count, unsigned char **out,
                       size_t *out_n) {
    if (count == 0) return 0;
    const unsigned char *end = p + n, *q = find_str(p, end, a, na);
    unsigned char *u = malloc(replaced_size(n, count, na, nb) + 1);
    if (!u) return -1;
    size_t k = 0;
    for (; q; q = find_str(p, end, a, na)) {
        memcpy(u + k, p, (size_t)(q - p));
        k += (size_t)(q - p);
        memcpy(u + k, b, nb);
        k += nb;
        p = q + na;
    }
    memcpy(u + k, p, (size_t)(end - p));
    *out = u;
    *out_n = k + (size_t)(end - p);
    return 1;
}

/* Fold the segments seg[2i] .. seg[2i + 1] (i < n; match[i]: the pattern's match, else the
 * text between) by behavior (a SPLIT_ value) as tokenizers' NormalizedString::split does: the
 * pieces are written over the segments, their count returned (empty ones left to the caller). */
static size_t fold_splits(const unsigned char **seg, const unsigned char *match, size_t n,
                          int behavior) {
    size_t k = 0;
    if (behavior == SPLIT_NEXT) { /* folded from the end */
        int previous = 0;
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            if (match[i] && !previous && w < n) {
                seg[2 * w] = seg[2 * i];
            } else {
                w--;
                seg[2 * w] = seg[2 * i];
                seg[2 * w + 1] = seg[2 * i + 1];
            }
            previous = match[i];
        }
        memmove(seg, seg + 2 * w, (n - w) * 2 * sizeof *seg);
        return n - w;
    }
    int previous = 0;
    for (size_t i = 0; i < n; i++) {
        const int extend = behavior == SPLIT_PREVIOUS     ? match[i] && !previous
                           : behavior == SPLIT_CONTIGUOUS ? match[i] == previous
                                                          : 0;
        if (behavior == SPLIT_REMOVED && match[i]) {
            /* dropped */
        } else if (extend && k > 0) {
            seg[2 * k - 1] = seg[2 * i + 1];
        } else {
            seg[2 * k] = seg[2 * i];
            seg[2 * k + 1] = seg[2 * i + 1];
            k++;
        }
        previous = match[i];
    }
    return k;
}

/* tokenizers' split of p[0..end) at the occurrences of pat[0..np) (left to right, not
 * overlapping; invert: the text between them is what matches), by behavior (a SPLIT_ value):
 * each non-empty piece to encode_word. The segments alternate text and matches; a behavior
 * folds them as tokenizers' NormalizedString::split does. */
static pytfm_status split_words(const pytfm_tokenizer *t, const unsigned char *p,
                                const unsigned char *end, const unsigned char *pat, size_t np,
                                int behavior, int invert, word_cache *cache, scratch *s,
                                sink *o) {
    /* the segments: (start, end, is a match), at most 2 per occurrence + 1 */
    size_t cap = 16, n = 0;
    const unsigned char **seg = malloc(cap * 2 * sizeof *seg);
    unsigned char *match = malloc(cap);
    pytfm_status status = seg && match ? PYTFM_STATUS_OK : PYTFM_STATUS_OUT_OF_MEMORY;
    for (const unsigned char *at = p; status == PYTFM_STATUS_OK && at < end;) {
        const unsigned char *q = find_str(at, end, pat, np);
        if (n + 2 > cap) {
            cap *= 2;
            const unsigned char **s2 = realloc(seg, cap * 2 * sizeof *seg);
            if (s2) seg = s2;
            unsigned char *m2 = realloc(match, cap);
            if (m2) match = m2;
            if (!s2 || !m2) {
                status = PYTFM_STATUS_OUT_OF_MEMORY;
                break;
            }
        }
        const unsigned char *stop = q ? q : end;
        if (stop > at) {
            seg[2 * n] = at, seg[2 * n + 1] = stop, match[n++] = (unsigned char)invert;
        }
        if (!q) break;
        seg[2 * n] = q, seg[2 * n + 1] = q + np, match[n++] = (unsigned char)!invert;
        at = q + np;
    }
    const size_t k = status == PYTFM_STATUS_OK ? fold_splits(seg, match, n, behavior) : 0;
    if (status != PYTFM_STATUS_OK) {
        free(seg);
        free(match);
        return pytfm__fail(status, "pytfm_tokenizer_encode: cannot allocate for a split");
    }
    for (size_t i = 0; status == PYTFM_STATUS_OK && i < k; i++)
        status = encode_word(t, seg[2 * i], seg[2 * i + 1] - seg[2 * i], cache, s, o);
    free(seg);
    free(match);
    return status;
}

/* The words of p[0..end) by the Split regex t->split (PRE_REGEX), each tokenized into o */
static pytfm_status regex_words(const pytfm_tokenizer *t, const unsigned char *p,
                                const unsigned char *end, word_cache *cache, scratch *s,
                                sink *o) {
    pytfm__regex_split split;
    pytfm__regex_split_start(&split, t->split, p, (size_t)(end - p));
    size_t at = 0, e = 0;
    int r;
    while ((r = pytfm__regex_split_next(&split, &e)) == 1) {
        const pytfm_status status = encode_word(t, p + at, (int64_t)(e - at), cache, s, o);
        if (status != PYTFM_STATUS_OK) {
            pytfm__regex_split_free(&split);
            return status;
        }
        at = e;
    }
    if (r == -2)
        return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                           "pytfm_tokenizer_encode: out of memory in the Split regex");
    if (r < 0)
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "pytfm_tokenizer_encode: the Split regex backtracks too much on this "
                           "text (a piece of %lld bytes); pytfm stops it rather than hang",
                           (long long)(end - p));
    return PYTFM_STATUS_OK;
}

/* Segments with their match flags, as a step gathers them: segment i is seg[2i] .. seg[2i + 1] */
typedef struct {
    const unsigned char **seg;
    unsigned char *match;
    size_t n, cap;
} seg_list;

static int seg_add(seg_list *l, const unsigned char *a, const unsigned char *b, int is_match) {
    if (l->n == l->cap) {
        const size_t cap = l->cap ? 2 * l->cap : 16;
        const unsigned char **s2 = realloc(l->seg, cap * 2 * sizeof *s2);
        if (!s2) return 0;
        l->seg = s2;
        unsigned char *m2 = realloc(l->match, cap);
        if (!m2) return 0;
        l->match = m2;
        l->cap = cap;
    }
    l->seg[2 * l->n] = a;
    l->seg[2 * l->n + 1] = b;
    l->match[l->n++] = (unsigned char)is_match;
    return 1;
}

/* The segments of p[0..end) by re, as tokenizers' Pattern::find_matches gives them: each match
 * (empty ones too: they part the text around them in every behavior) and the text between;
 * invert flips the flags. regex.c's split (regex.h's fields) has returned a gap when a match is
 * pending after it or the text is done, else a match when the piece ends where the last
 * non-empty match did, else a gap followed by an empty match. An empty match where no gap ends
 * (the text's start) is left out: it parts nothing in any behavior. 0 done, -1 too many steps,
 * -2 out of memory. */
static int regex_segments(const pytfm__regex *re, const unsigned char *p,
                          const unsigned char *end, int invert, seg_list *l) {
    pytfm__regex_split split;
    pytfm__regex_split_start(&split, re, p, (size_t)(end - p));
    size_t at = 0, e = 0;
    for (;;) {
        const int r = pytfm__regex_split_next(&split, &e);
        if (r != 1) return r;
        const int gap = split.pending || split.done || split.match_end != e;
        int ok = seg_add(l, p + at, p + e, gap ? invert : !invert);
        if (ok && gap && !split.pending && !split.done) ok = seg_add(l, p + e, p + e, !invert);
        if (!ok) {
            pytfm__regex_split_free(&split);
            return -2;
        }
        at = e;
    }
}

/* The words of p[0..end) by t->steps (PRE_STEPS), each tokenized into o. Each step splits
 * every piece the previous one left, as tokenizers' Sequence does; the pieces of a step are
 * kept in a list (not a recursion per piece), so memory is O(pieces) whatever the steps. */
static pytfm_status step_words(const pytfm_tokenizer *t, const unsigned char *p,
                               const unsigned char *end, word_cache *cache, scratch *s,
                               sink *o) {
    seg_list cur = {0}, next = {0}, tmp = {0};
    pytfm_status status = PYTFM_STATUS_OK;
    int r = seg_add(&cur, p, end, 0) ? 0 : -2;
    size_t failed = 0; /* the bytes of the piece a regex gave up on */
    for (int k = 0; r == 0 && k < t->n_steps; k++) {
        const pre_step *st = &t->steps[k];
        next.n = 0;
        for (size_t i = 0; r == 0 && i < cur.n; i++) {
            tmp.n = 0;
            r = regex_segments(st->re, cur.seg[2 * i], cur.seg[2 * i + 1], st->invert, &tmp);
            if (r == -1) failed = (size_t)(cur.seg[2 * i + 1] - cur.seg[2 * i]);
            const size_t m = r == 0 ? fold_splits(tmp.seg, tmp.match, tmp.n, st->behavior) : 0;
            for (size_t j = 0; r == 0 && j < m; j++)
                if (tmp.seg[2 * j + 1] > tmp.seg[2 * j] &&
                    !seg_add(&next, tmp.seg[2 * j], tmp.seg[2 * j + 1], 0))
                    r = -2;
        }
        const seg_list swap = cur;
        cur = next;
        next = swap;
    }
    if (r == -2)
        status = pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                             "pytfm_tokenizer_encode: out of memory in the pre_tokenizer's "
                             "Sequence");
    else if (r == -1)
        status = pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                             "pytfm_tokenizer_encode: a Split regex backtracks too much on this "
                             "text (a piece of %zu bytes); pytfm stops it rather than hang",
                             failed);
    for (size_t i = 0; status == PYTFM_STATUS_OK && i < cur.n; i++)
        status = encode_word(t, cur.seg[2 * i], cur.seg[2 * i + 1] - cur.seg[2 * i], cache, s,
                             o);
    free(cur.seg);
    free(cur.match);
    free(next.seg);
    free(next.match);
    free(tmp.seg);
    free(tmp.match);
    return status;
}

/* Tokenize the piece p[0..end) (no added token in it; normalized) into o. first: the piece
 * begins the text (Metaspace's prepend_scheme "first"). */
static pytfm_status encode_piece(const pytfm_tokenizer *t, const unsigned char *p,
                                 const unsigned char *end, int first, word_cache *cache,
                                 scratch *s, sink *o) {
    if (p == end) return PYTFM_STATUS_OK; /* tokenizers drops empty pieces */
    if (t->pretok == PRE_NONE) return encode_word(t, p, end - p, cache, s, o);
    if (t->pretok == PRE_SPLIT)
        return split_words(t, p, end, t->pre_str, t->pre_len, t->split_behavior,
                           t->split_invert, cache, s, o);
    if (t->pretok == PRE_METASPACE) {
        /* spaces become the replacement; it is put first (when the scheme says so and the
         * piece does not begin with it); then split before each one (MergedWithNext) */
        const unsigned char *r = t->pre_str;
        const size_t nr = t->pre_len, n = (size_t)(end - p);
        unsigned char *u = NULL;
        size_t un = 0;
        const unsigned char *space = (const unsigned char *)" ";
        const int changed = replace_all(p, n, space, 1, r, nr, occurrences(p, n, space, 1), &u,
                                        &un);
        if (changed < 0) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "pytfm_tokenizer_"
                                            "encode: cannot allocate for a piece of %zu bytes", n);
        if (!changed) {
            u = malloc(n + 1);
            if (!u) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "pytfm_tokenizer_encode: "
                                       "cannot allocate for a piece of %zu bytes", n);
            memcpy(u, p, n);
            un = n;
        }
        const int prepend = (t->pre_prepend == PREPEND_ALWAYS ||
                             (t->pre_prepend == PREPEND_FIRST && first)) &&
                            !(un >= nr && memcmp(u, r, nr) == 0);
        if (prepend) {
            unsigned char *v = realloc(u, un + nr + 1);
            if (!v) {
                free(u);
                return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "pytfm_tokenizer_encode: "
                                   "cannot allocate for a piece of %zu bytes", n);
            }
            u = v;
            memmove(u + nr, u, un);
            memcpy(u, r, nr);
            un += nr;
        }
        const pytfm_status status =
            t->pre_split ? split_words(t, u, u + un, r, nr, SPLIT_NEXT, 0, cache, s, o)
                         : encode_word(t, u, (int64_t)un, cache, s, o);
        free(u);
        return status;
    }
    if (t->pretok == PRE_REGEX) return regex_words(t, p, end, cache, s, o);
    if (t->pretok == PRE_STEPS) return step_words(t, p, end, cache, s, o);
    while (p < end) {
        const unsigned char *q = t->pretok == PRE_GPT2 ? word_end(p, end)
                                                       : split_end(p, end, t->pretok ==
                                                                   PRE_LLAMA3 ? 3 : 1);
        PYTFM_TRY(encode_word(t, p, q - p, cache, s, o));
        p = q;
    }
    return PYTFM_STATUS_OK;
}

/* The added token of pass p that is the longest prefix of p[0..end): its index, *len its
 * bytes; -1 when none is. */
static int32_t longest_added(const pytfm_tokenizer *t, int pass, const unsigned char *p,
                             const unsigned char *end, int64_t *len) {
    const added_trie *tr = &t->trie;
    int32_t node = 0, best = -1;
    for (const unsigned char *q = p; q < end; q++) {
        const uint64_t key = ((uint64_t)node << 8 | *q) + 1;
        uint64_t i = hash_pair(key) & tr->mask;
        while (tr->key[i] != 0 && tr->key[i] != key) i = (i + 1) & tr->mask;
        if (tr->key[i] == 0) break;
        node = tr->child[i];
        const int32_t e = tr->end[node];
        if (e >= 0 && t->added[e].pass == pass) {
            best = e;
            *len = q + 1 - p;
        }
    }
    return best;
}

/* The class of the character that ends at q (q > start), as char_at reads it; *len its bytes */
static int char_before(const unsigned char *start, const unsigned char *q, size_t *len) {
    const unsigned char *c = q - 1;
    while (c > start && q - c < 4 && (*c & 0xC0) == 0x80) c--;
    size_t n;
    const int kind = char_at(c, (size_t)(q - c), &n);
    if (c + n == q) {
        *len = n;
        return kind;
    }
    *len = 1; /* q - 1 is a byte of no valid sequence ending at q: one "other" character */
    return C_OTHER;
}

/* Whether the character at p (p < end) is a word character as tokenizers' single_word reads
 * it (Rust's regex \w: Alphabetic, marks, decimal digits, connector punctuation, joiners):
 * 1 or 0, or -1 where the library's classes cannot tell (a non-ASCII character neither a
 * letter, which is always \w, nor white space, which never is). */
static int word_char(int kind, const unsigned char *p) {
    if (p[0] < 0x80) return (p[0] >= '0' && p[0] <= '9') || p[0] == '_' || kind == C_LETTER;
    return kind == C_LETTER ? 1 : kind == C_SPACE ? 0 : -1;
}

typedef struct encoder {
    const pytfm_tokenizer *t;
    int special;
    word_cache *cache;
    scratch *s;
    sink *o;
} encoder;

static pytfm_status single_word_unknown(const encoder *x, int32_t tok, const unsigned char *p,
                                        size_t n) {
    uint32_t cp = 0;
    if (pytfm__utf8_at(p, n, &cp) == 0) cp = p[0];
    return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "pytfm_tokenizer_encode: the added token "
                       "of id %d is single_word, and whether U+%04X next to it is a word "
                       "character (Rust's \\w) is known to pytfm for ASCII, letters and white "
                       "space only", (int)x->t->added[tok].id, (unsigned)cp);
}

static pytfm_status next_pass(const encoder *x, int pass, const unsigned char *s,
                              const unsigned char *e, int first);

/* The text p[0..end) through pass `pass` of the added tokens (tokenizers' find_matches: the
 * leftmost-longest match, non-overlapping, each match's flags), the pieces between matches on
 * to the next pass, and after the last pass to the pre-tokenizer and the merges. first: the
 * text begins the whole text. */
static pytfm_status encode_pass(const encoder *x, int pass, const unsigned char *s,
                                const unsigned char *e, int first) {
    const pytfm_tokenizer *t = x->t;
    if (pass == 0 && t->n_added == 0) return next_pass(x, 0, s, e, first);
    if (pass == 2 || t->n_added == 0)
        return encode_piece(t, s, e, first, x->cache, x->s, x->o);
    const unsigned char *starts = t->trie.first[pass], *from = s, *at = s;
    const unsigned char *ws_from = NULL, *ws_end = NULL; /* the last run of white space seen */
    while (at < e) {
        int64_t len = 0;
        int32_t k = -1;
        const unsigned char *q = at;
        for (; q < e; q++)
            if (starts[*q] && (k = longest_added(t, pass, q, e, &len)) >= 0) break;
        if (k < 0) break;
        const added_token *a = &t->added[k];
        const unsigned char *start = q, *stop = q + len;
        at = stop; /* the next match is searched after this one, kept or not */
        if (a->special && !x->special) continue;
        if (a->single_word) {
            size_t n;
            int before = 0, after = 0;
            if (start > s) {
                const int kind = char_before(s, start, &n);
                before = word_char(kind, start - n);
                if (before < 0) return single_word_unknown(x, k, start - n, n);
            }
            if (stop < e) {
                const int kind = char_at(stop, (size_t)(e - stop), &n);
                after = word_char(kind, stop);
                if (after < 0) return single_word_unknown(x, k, stop, n);
            }
            if (before || after) continue;
        }
        if (a->lstrip) { /* the white space before it, not before the last piece's end */
            size_t n;
            while (start > from && char_before(from, start, &n) == C_SPACE) start -= n;
        }
        if (a->rstrip) { /* the white space after it */
            if (ws_from && stop >= ws_from && stop <= ws_end) {
                stop = ws_end;
            } else {
                ws_from = stop;
                size_t n;
                while (stop < e && char_at(stop, (size_t)(e - stop), &n) == C_SPACE) stop += n;
                ws_end = stop;
            }
        }
        if (from < start) PYTFM_TRY(next_pass(x, pass, from, start, first && from == s));
        emit(x->o, &a->id, 1);
        from = stop;
    }
    return from < e ? next_pass(x, pass, from, e, first && from == s) : PYTFM_STATUS_OK;
}

/* The text p[0..n) through the normalizer's steps: 1 and *out (malloc'd, *out_n bytes) when
 * they may change it, 0 when they do not, -1 out of memory, -2 when a step would make more than
 * most_grown(n) bytes (*out_n: how many; nothing allocated for them). */
static int normalize(const pytfm_tokenizer *t, const unsigned char *p, size_t n,
                     unsigned char **out, size_t *out_n) {
    unsigned char *cur = NULL;
    const size_t most = most_grown(n);
    for (int i = 0; i < t->n_norm; i++) {
        const text_step *st = &t->norm[i];
        const unsigned char *src = cur ? cur : p;
        unsigned char *next = NULL;
        size_t nn = 0;
        int changed = 0;
        const size_t count = st->kind == STEP_REPLACE ? occurrences(src, n, st->a, st->na) : 0;
        const size_t will = st->kind == STEP_PREPEND ? n + st->na
                            : st->kind == STEP_REPLACE ? replaced_size(n, count, st->na, st->nb)
                                                       : 0; /* NFC: at most 3 times (Unicode) */
        if (will > most) {
            free(cur);
            *out_n = will;
            return -2;
        }
        if (st->kind == STEP_NFC) {
            changed = nfc(src, n, &next, &nn);
        } else if (st->kind == STEP_PREPEND && n > 0) { /* tokenizers: not to an empty text */
            next = malloc(st->na + n + 1);
            changed = next ? 1 : -1;
            if (next) {
                memcpy(next, st->a, st->na);
                memcpy(next + st->na, src, n);
                nn = st->na + n;
            }
        } else if (st->kind == STEP_REPLACE) {
            changed = replace_all(src, n, st->a, st->na, st->b, st->nb, count, &next, &nn);
        }
        if (changed < 0) {
            free(cur);
            return -1;
        }
        if (changed) {
            free(cur);
            cur = next;
            n = nn;
        }
    }
    if (!cur) return 0;
    *out = cur;
    *out_n = n;
    return 1;
}

/* A piece of text pass `pass` leaves, on to the next pass: normalized (when there is a
 * normalizer) between pass 0 and pass 1, as tokenizers normalizes what the added tokens of
 * normalized false leave, each piece by itself. */
static pytfm_status next_pass(const encoder *x, int pass, const unsigned char *s,
                              const unsigned char *e, int first) {
    if (pass == 0 && x->t->n_norm > 0) {
        unsigned char *u = NULL;
        size_t n = 0;
        const int changed = normalize(x->t, s, (size_t)(e - s), &u, &n);
        if (changed == -2)
            return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "pytfm_tokenizer_encode: the "
                               "normalizer's steps would make %zu bytes of a text of %lld, more "
                               "than %d times it; pytfm stops them rather than exhaust memory",
                               n, (long long)(e - s), GROWTH);
        if (changed < 0)
            return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "pytfm_tokenizer_encode: cannot "
                               "allocate to normalize %lld bytes", (long long)(e - s));
        if (changed) {
            const pytfm_status status = n ? encode_pass(x, 1, u, u + n, first) : PYTFM_STATUS_OK;
            free(u);
            return status;
        }
    }
    return encode_pass(x, pass + 1, s, e, first);
}

pytfm_status pytfm_tokenizer_encode(const pytfm_tokenizer *tok, const char *text, int64_t size,
                                    int32_t flags, int32_t *ids, int64_t capacity,
                                    int64_t *count) {
    PYTFM_CHECK(tok != NULL, "%s: tok must not be NULL", __func__);
    PYTFM_CHECK(count != NULL, "%s: count must not be NULL", __func__);
    PYTFM_CHECK_MIN(size, 0);
    PYTFM_CHECK_MIN(capacity, 0);
    PYTFM_CHECK_PTR(text, size);
    PYTFM_CHECK_PTR(ids, capacity);
    PYTFM_CHECK((flags & ~(PYTFM_TOKENIZER_SPECIAL | PYTFM_TOKENIZER_TEMPLATE)) == 0,
                "%s: flags must be PYTFM_TOKENIZER_SPECIAL and/or PYTFM_TOKENIZER_TEMPLATE, "
                "got %d", __func__, (int)flags);
    word_cache *cache = tok->cache;
    if (cache && atomic_flag_test_and_set_explicit(&cache->busy, memory_order_acquire))
        cache = NULL; /* another thread's encode has it */
    scratch s = {0};
    sink o = {ids, capacity, 0};
    const encoder x = {tok, flags & PYTFM_TOKENIZER_SPECIAL, cache, &s, &o};
    const int tmpl = (flags & PYTFM_TOKENIZER_TEMPLATE) != 0;
    const unsigned char *p = (const unsigned char *)text;
    if (tmpl) emit(&o, tok->tmpl, tok->n_before);
    pytfm_status status = p ? encode_pass(&x, 0, p, p + size, 1) : PYTFM_STATUS_OK;
    if (tmpl) emit(&o, tok->tmpl + tok->n_before, tok->n_after);
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

/* A list of strings: string i is b[off[i] .. off[i+1]), back to back, so the list's
 * concatenation is b[0 .. off[n]). */
typedef struct strs {
    unsigned char *b;
    int64_t *off;
    int64_t n, cap_n, cap_b;
    int oom;
} strs;

/* Room for more bytes in the last string (the list must have one): 0 out of memory */
static int strs_room(strs *l, int64_t more) {
    const int64_t need = l->off[l->n] + more;
    if (need <= l->cap_b) return 1;
    int64_t cap = l->cap_b ? l->cap_b : 256;
    while (cap < need) cap *= 2;
    unsigned char *b = realloc(l->b, (size_t)cap);
    if (!b) return !(l->oom = 1);
    l->b = b;
    l->cap_b = cap;
    return 1;
}

/* A new, empty string at the end */
static void strs_new(strs *l) {
    if (l->oom) return;
    if (l->n + 2 > l->cap_n) {
        const int64_t cap = l->cap_n ? 2 * l->cap_n : 64;
        int64_t *off = realloc(l->off, (size_t)cap * sizeof *off);
        if (!off) {
            l->oom = 1;
            return;
        }
        if (!l->off) off[0] = 0;
        l->off = off;
        l->cap_n = cap;
    }
    l->off[l->n + 1] = l->off[l->n];
    l->n++;
}

/* p[0..n) appended to the last string */
static void strs_add(strs *l, const void *p, int64_t n) {
    if (l->oom || n == 0 || !strs_room(l, n)) return;
    memcpy(l->b + l->off[l->n], p, (size_t)n);
    l->off[l->n] += n;
}

static void strs_free(strs *l) {
    free(l->b);
    free(l->off);
}

/* The byte of a ByteFallback token <0xHH> (tokenizers: 6 bytes, "<0x", two hex digits as
 * Rust's u8::from_str_radix reads them, ">"), or -1 */
static int fallback_byte(const unsigned char *p, int64_t n) {
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        const int c = p[i];
        if (i == 3 && c == '+') continue; /* from_str_radix takes a sign */
        const int d = c >= '0' && c <= '9' ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The characters c[0..nc) that begin (at_end: end) p[0..n), at most max of them: their bytes */
static int64_t strip_count(const unsigned char *p, int64_t n, const unsigned char *c,
                           size_t nc, int64_t max, int at_end) {
    int64_t k = 0;
    for (int64_t i = 0; i < max && (k + (int64_t)nc) <= n; i++) {
        const unsigned char *q = at_end ? p + n - k - (int64_t)nc : p + k;
        if (memcmp(q, c, nc) != 0) break;
        k += (int64_t)nc;
    }
    return k;
}

/* One decoder step over the list in, into out (tokenizers' decode_chain of that decoder) */
static void decode_step(const text_step *st, const strs *in, strs *out) {
    static const unsigned char fffd[3] = {0xEF, 0xBF, 0xBD};
    if (st->kind == STEP_FUSE) {
        strs_new(out);
        strs_add(out, in->b, in->n ? in->off[in->n] : 0);
        return;
    }
    unsigned char pending[64];
    int64_t n_pending = 0, start = 0; /* ByteFallback: the run of byte tokens, from token start */
    for (int64_t i = 0; i <= in->n; i++) {
        const unsigned char *p = i < in->n ? in->b + in->off[i] : NULL;
        const int64_t n = i < in->n ? in->off[i + 1] - in->off[i] : 0;
        if (st->kind == STEP_BYTE_FALLBACK) {
            const int byte = i < in->n ? fallback_byte(p, n) : -1;
            if (byte >= 0 && n_pending == 0) start = i;
            if (byte >= 0) {
                n_pending++;
                continue;
            }
            if (n_pending > 0) { /* the run as UTF-8 when it is valid, else U+FFFD a byte */
                const char *why = "";
                int64_t k = 0;
                unsigned char *run = n_pending <= (int64_t)sizeof pending
                                         ? pending : malloc((size_t)n_pending);
                if (!run) {
                    out->oom = 1;
                    return;
                }
                for (int64_t j = start; j < start + n_pending; j++)
                    run[k++] = (unsigned char)fallback_byte(in->b + in->off[j], 6);
                strs_new(out);
                if (pytfm__utf8_check((const char *)run, (size_t)k, &why) == (size_t)k) {
                    strs_add(out, run, k);
                } else {
                    strs_add(out, fffd, 3);
                    for (int64_t j = 1; j < k; j++) {
                        strs_new(out);
                        strs_add(out, fffd, 3);
                    }
                }
                if (run != pending) free(run);
                n_pending = 0;
            }
            if (i < in->n) {
                strs_new(out);
                strs_add(out, p, n);
            }
            continue;
        }
        if (i == in->n) break;
        strs_new(out);
        if (st->kind == STEP_STRIP) {
            const int64_t a = strip_count(p, n, st->a, st->na, st->start, 0);
            const int64_t z = strip_count(p + a, n - a, st->a, st->na, st->stop, 1);
            strs_add(out, p + a, n - a - z);
        } else { /* Replace, Metaspace: each occurrence of a */
            const int drop = st->kind == STEP_METASPACE && i == 0 && st->start;
            const unsigned char *to = st->kind == STEP_METASPACE ? (const unsigned char *)" "
                                                                 : st->b;
            const size_t nto = drop ? 0 : st->kind == STEP_METASPACE ? 1 : st->nb;
            const unsigned char *end = p + n;
            for (const unsigned char *q; (q = find_str(p, end, st->a, st->na)) != NULL;
                 p = q + st->na) {
                strs_add(out, p, q - p);
                strs_add(out, to, (int64_t)nto);
            }
            strs_add(out, p, end - p);
        }
    }
}

/* Text tokens' decode: ids[0..n) (checked) as tokenizers' decode gives them (its decoder's
 * steps over the tokens' names; no decoder: the names joined by spaces), into *text (malloc'd),
 * *size bytes. 1 done, 0 out of memory, -1 when a Replace step would make more than
 * most_grown(the names' bytes) (*size: how many; nothing allocated for them). */
static int decode_text(const pytfm_tokenizer *t, const int32_t *ids, int64_t n,
                       unsigned char **text, int64_t *size) {
    strs cur = {0};
    for (int64_t i = 0; i < n; i++) {
        strs_new(&cur);
        if (!t->has_dec && i > 0) strs_add(&cur, " ", 1);
        strs_add(&cur, t->tok_bytes + t->tok_off[ids[i]],
                 t->tok_off[ids[i] + 1] - t->tok_off[ids[i]]);
    }
    const size_t most = most_grown(cur.n ? (size_t)cur.off[cur.n] : 0);
    for (int k = 0; k < t->n_dec && !cur.oom; k++) {
        const text_step *st = &t->dec[k];
        size_t will = 0; /* a growing Replace's output; no other step makes a string longer */
        const int grows = st->kind == STEP_REPLACE && st->nb > st->na;
        for (int64_t i = 0; grows && i < cur.n && will <= most; i++) {
            const unsigned char *p = cur.b + cur.off[i];
            const size_t n = (size_t)(cur.off[i + 1] - cur.off[i]);
            const size_t piece = replaced_size(n, occurrences(p, n, st->a, st->na), st->na,
                                               st->nb);
            will = piece > SIZE_MAX - will ? SIZE_MAX : will + piece;
        }
        if (will > most) {
            strs_free(&cur);
            *size = will > INT64_MAX ? INT64_MAX : (int64_t)will;
            return -1;
        }
        strs next = {0};
        decode_step(st, &cur, &next);
        strs_free(&cur);
        cur = next;
    }
    if (cur.oom) {
        strs_free(&cur);
        return 0;
    }
    *size = cur.n ? cur.off[cur.n] : 0;
    *text = cur.b;
    free(cur.off);
    return 1;
}

pytfm_status pytfm_tokenizer_decode(const pytfm_tokenizer *tok, const int32_t *ids, int64_t n,
                                    char *out, int64_t capacity, int64_t *size) {
    PYTFM_CHECK(tok != NULL, "%s: tok must not be NULL", __func__);
    PYTFM_CHECK(size != NULL, "%s: size must not be NULL", __func__);
    PYTFM_CHECK_MIN(n, 0);
    PYTFM_CHECK_MIN(capacity, 0);
    PYTFM_CHECK_PTR(ids, n);
    PYTFM_CHECK_PTR(out, capacity);
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_tokens)
            return pytfm__fail(PYTFM_STATUS_OUT_OF_RANGE,
                               "%s: ids[%lld] is %d, outside the vocabulary [0, %lld)", __func__,
                               (long long)i, (int)ids[i], (long long)tok->n_tokens);
    unsigned char *text = NULL;
    if (tok->text_tokens) {
        const int done = decode_text(tok, ids, n, &text, &total);
        if (done < 0)
            return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s: the decoder's Replace steps "
                               "would make %lld bytes of %lld ids, more than %d times their "
                               "names; pytfm stops them rather than exhaust memory", __func__,
                               (long long)total, (long long)n, GROWTH);
        if (!done)
            return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate to decode "
                               "%lld ids", __func__, (long long)n);
        if (total > 0 && capacity > 0) memcpy(out, text, (size_t)PYTFM_MIN(total, capacity));
        free(text);
    }
    for (int64_t i = 0; i < n && !tok->text_tokens; i++) {
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

int32_t pytfm_tokenizer_text_tokens(const pytfm_tokenizer *tok) {
    return tok ? tok->text_tokens : 0;
}

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
    free(tok->added);
    free(tok->trie.key);
    free(tok->trie.child);
    free(tok->trie.end);
    free(tok->tmpl);
    free(tok->map);
    for (int i = 0; i < tok->n_norm; i++) {
        free(tok->norm[i].a);
        free(tok->norm[i].b);
    }
    free(tok->norm);
    for (int i = 0; i < tok->n_dec; i++) {
        free(tok->dec[i].a);
        free(tok->dec[i].b);
    }
    free(tok->dec);
    free(tok->pre_str);
    pytfm__regex_free(tok->split);
    for (int i = 0; i < tok->n_steps; i++) pytfm__regex_free(tok->steps[i].re);
    free(tok->steps);
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
    int64_t n_model;            /* the vocabulary's tokens; added ones follow */
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
    if (b->t->text_tokens) { /* a text token's name is its bytes */
        memcpy(out, u, n);
        return (int64_t)n;
    }
    int64_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        const int len = pytfm__utf8_at(u + i, n - i, &cp);
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
    if (b->t->text_tokens) return show_name(p, n, 1, buf, cap);
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
    for (int c = 0; c < 128 && t->text_tokens; c++) {
        const unsigned char ch = (unsigned char)c;
        t->ascii_id[c] = map_find(b, &ch, 1);
    }
    for (int c = 0; c < 256 && t->text_tokens; c++) { /* tokenizers' "<{b:#04X}>" */
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", (unsigned)c);
        const int32_t id = map_find(b, (const unsigned char *)name, 6);
        if (id < 0) {
            status = BAD(b, "model.byte_fallback is true, but the vocabulary has no token %s: "
                            "pytfm implements byte fallback with all 256 byte tokens", name);
            goto done;
        }
        t->byte_id[c] = id;
    }
    for (int c = 0; c < 256 && !t->text_tokens; c++) {
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
    b->n_model = n;
done:
    free(len);
    free(at);
    free(raw);
    free(tmp);
    return status;
}

/* Prepare for n merges. Two merges may make the same token (Llama 3's make one token from
 * several pairs of its parts), as tokenizers allows; no pair may be merged twice. */
static pytfm_status start_merges(builder *b, int64_t n) {
    pytfm_tokenizer *t = b->t;
    if (n >= INT32_MAX) return BAD(b, "%lld merges: ranks are int32", (long long)n);
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
    }
    const size_t total = (size_t)(lens[0] + lens[1]);
    const int32_t made = map_find(b, out, total);
    int32_t again = -1;
    if (made >= 0 && pair_rank(t, ids[0], ids[1], &again) >= 0)
        return BAD(b, "merge %lld (%s %s) repeats merge %d", (long long)rank, sa, sc,
                   (int)pair_rank(t, ids[0], ids[1], &again));
    if (made < 0) {
        unsigned char joined[96];
        const size_t ka = PYTFM_MIN(na, sizeof joined), kc = PYTFM_MIN(nc, sizeof joined - ka);
        memcpy(joined, a, ka);
        memcpy(joined + ka, c, kc);
        show_name(joined, ka + kc, 1, part, sizeof part);
        return BAD(b, "merge %lld (%s %s) makes %s, which is not in the vocabulary",
                   (long long)rank, sa, sc, part);
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

/* After the merges and the added tokens: every token of the vocabulary a byte, a merge's
 * result or an added token. */
static pytfm_status finish_checks(builder *b) {
    const pytfm_tokenizer *t = b->t;
    for (int64_t i = 0; i < b->n_model; i++) {
        if (b->made[i]) continue;
        char shown[64];
        return BAD(b, "token %s (id %lld) is made by no merge",
                   show_token(b, t->tok_bytes + t->tok_off[i],
                        (size_t)(t->tok_off[i + 1] - t->tok_off[i]), shown, sizeof shown),
                   (long long)i);
    }
    return PYTFM_STATUS_OK;
}

/* ---- added tokens ---------------------------------------------------------------------- */

/* Room for n added tokens of at most `bytes` bytes of content in all. */
static pytfm_status start_added(builder *b, int64_t n, size_t bytes) {
    pytfm_tokenizer *t = b->t;
    added_trie *tr = &t->trie;
    const uint64_t size = table_size((int64_t)bytes + 1);
    t->added = malloc((size_t)(n > 0 ? n : 1) * sizeof *t->added);
    tr->key = calloc(size, sizeof *tr->key);
    tr->child = malloc(size * sizeof *tr->child);
    tr->end = malloc((bytes + 1) * sizeof *tr->end);
    int64_t *off = realloc(t->tok_off, (size_t)(t->n_tokens + n + 1) * sizeof *off);
    if (off) t->tok_off = off;
    unsigned char *tb = realloc(t->tok_bytes, (size_t)t->tok_off[t->n_tokens] + bytes + 1);
    if (tb) t->tok_bytes = tb;
    if (!t->added || !tr->key || !tr->child || !tr->end || !off || !tb)
        return no_memory(b, "the added tokens");
    tr->mask = size - 1;
    tr->n_nodes = 1;
    tr->end[0] = -1;
    return PYTFM_STATUS_OK;
}

/* Added token number t->n_added, its content u[0..n) (UTF-8, n >= 1), want: the id its file
 * gives it (-1: none). Its id is the one tokenizers gives it: the vocabulary's, when the
 * content is a token's name there (that token's bytes must be the content's: its name is
 * plain ASCII), else the next id after the vocabulary and the added tokens before it. */
static pytfm_status add_added(builder *b, const unsigned char *u, size_t n, int64_t want,
                              added_token a) {
    pytfm_tokenizer *t = b->t;
    added_trie *tr = &t->trie;
    const int64_t k = t->n_added;
    char shown[64];
    show_name(u, n, 1, shown, sizeof shown);
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t key = ((uint64_t)node << 8 | u[i]) + 1;
        uint64_t s = hash_pair(key) & tr->mask;
        while (tr->key[s] != 0 && tr->key[s] != key) s = (s + 1) & tr->mask;
        if (tr->key[s] == 0) {
            tr->key[s] = key;
            tr->child[s] = tr->n_nodes;
            tr->end[tr->n_nodes] = -1;
            tr->n_nodes++;
        }
        node = tr->child[s];
    }
    if (tr->end[node] >= 0)
        return BAD(b, "added_tokens[%lld]: %s appears twice", (long long)k, shown);
    if (t->n_norm > 0 && a.pass == 1) { /* tokenizers matches its normalized form */
        unsigned char *f = NULL;
        size_t fn = 0;
        const int changed = normalize(t, u, n, &f, &fn);
        const int same = changed == 0 || (changed > 0 && fn == n && memcmp(f, u, n) == 0);
        free(f);
        if (changed == -2)
            return BAD(b, "added_tokens[%lld]: %s is normalized, and the normalizer's steps make "
                          "%zu bytes of it, more than %d times it (pytfm stops them)", (long long)k,
                       shown, fn, GROWTH);
        if (changed < 0) return no_memory(b, "an added token");
        if (!same && t->n_norm == 1 && t->norm[0].kind == STEP_NFC)
            return BAD(b, "added_tokens[%lld]: %s is normalized but not in NFC (pytfm does not "
                          "implement that)", (long long)k, shown);
        if (!same)
            return BAD(b, "added_tokens[%lld]: %s is normalized, and the normalizer changes it "
                          "(pytfm does not implement that)", (long long)k, shown);
    }
    unsigned char *raw = b->buf;
    if (n > b->buf_cap) {
        raw = realloc(b->buf, 2 * n);
        if (!raw) return no_memory(b, "an added token");
        b->buf = raw;
        b->buf_cap = n;
    }
    uint32_t bad = 0;
    const int64_t len = unname(b, u, n, raw, &bad);
    int32_t id = len > 0 ? map_find(b, raw, (size_t)len) : -1;
    if (id >= 0 && id < b->n_model && ((size_t)len != n || memcmp(raw, u, n) != 0))
        return BAD(b, "added_tokens[%lld]: %s is a token of the vocabulary by its byte-level "
                      "name, standing for other bytes (pytfm does not implement that)",
                   (long long)k, shown);
    if (id < 0 || id >= b->n_model) {
        id = (int32_t)t->n_tokens;
        const int64_t off = t->tok_off[t->n_tokens];
        memcpy(t->tok_bytes + off, u, n);
        t->tok_off[++t->n_tokens] = off + (int64_t)n;
    } else {
        b->made[id] = 1;
    }
    if (want >= 0 && want != id)
        return BAD(b, "added_tokens[%lld]: %s has id %lld, but tokenizers gives it %d (%s)",
                   (long long)k, shown, (long long)want, (int)id,
                   id < b->n_model ? "the vocabulary's id"
                                   : "the ids after the vocabulary's, in the file's order");
    a.id = id;
    t->added[k] = a;
    tr->end[node] = (int32_t)k;
    tr->first[a.pass][u[0]] = 1;
    t->n_added++;
    if (n == ENDOFTEXT_LEN && memcmp(u, ENDOFTEXT, n) == 0) t->eot = id;
    return PYTFM_STATUS_OK;
}

/* GPT-2's vocab.json and merges.txt: <|endoftext|>, special, as transformers'
 * GPT2TokenizerFast adds it (its id the vocabulary's, or the next one when it has none). */
static pytfm_status add_endoftext(builder *b) {
    PYTFM_TRY(start_added(b, 1, ENDOFTEXT_LEN));
    const added_token a = {0, 1, 0, 0, 0, 0};
    return add_added(b, (const unsigned char *)ENDOFTEXT, ENDOFTEXT_LEN, -1, a);
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
    /* text tokens: a character of the vocabulary is a token made by no merge */
    if (status == PYTFM_STATUS_OK && !b->t->ignore_merges && !b->t->text_tokens)
        status = finish_checks(b);
    b->t->n_model = b->n_model;
    if (status == PYTFM_STATUS_OK && (b->t->ignore_merges || b->t->text_tokens)) {
        b->t->map = b->map; /* the tokenizer's now */
        b->t->map_mask = b->map_mask;
        b->map = NULL;
    }
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

/* a boolean member: 1 true, 0 false or absent (absent: def), -1 anything else */
static int flag(pytfm__json obj, const char *key, int def) {
    pytfm__json v;
    if (!member(obj, key, &v)) return def;
    if (pytfm__json_kind_of(v) != PYTFM__JSON_BOOL) return -1;
    return v.p[0] == 't';
}

/* added_tokens: [{id, content, single_word, lstrip, rstrip, normalized, special}] */
static pytfm_status read_added_tokens(builder *b, pytfm__json doc) {
    pytfm__json list, item, v;
    if (!member(doc, "added_tokens", &list) || pytfm__json_kind_of(list) == PYTFM__JSON_NULL)
        return start_added(b, 0, 0);
    if (pytfm__json_kind_of(list) != PYTFM__JSON_ARRAY)
        return BAD(b, "added_tokens must be a list");
    size_t bytes = 0;
    pytfm__json_iter it = pytfm__json_iter_of(list);
    while (pytfm__json_next(&it, NULL, &item))
        if (member(item, "content", &v)) bytes += v.n;
    PYTFM_TRY(start_added(b, (int64_t)pytfm__json_count(list), bytes));
    unsigned char *u = malloc(bytes + 1);
    if (!u) return no_memory(b, "the added tokens");
    pytfm_status status = PYTFM_STATUS_OK;
    it = pytfm__json_iter_of(list);
    for (long long k = 0; status == PYTFM_STATUS_OK && pytfm__json_next(&it, NULL, &item); k++) {
        static const char *const names[5] = {"special", "lstrip", "rstrip", "single_word",
                                             "normalized"};
        int f[5];
        for (int i = 0; i < 5; i++) f[i] = flag(item, names[i], i == 4);
        pytfm__json id;
        const pytfm__json_int want = member(item, "id", &id) &&
                                             pytfm__json_kind_of(id) == PYTFM__JSON_NUMBER
                                         ? pytfm__json_integer(id)
                                         : (pytfm__json_int){0, 0, 0, 0};
        int lone = 0;
        size_t n = 0;
        if (pytfm__json_kind_of(item) != PYTFM__JSON_OBJECT || !member(item, "content", &v) ||
            pytfm__json_kind_of(v) != PYTFM__JSON_STRING ||
            (n = pytfm__json_string_utf8(v, (char *)u, &lone)) == 0 || lone) {
            status = BAD(b, "added_tokens[%lld] must be an object whose content is a non-empty "
                            "string of Unicode", k);
        } else if (!want.integer || !want.fits || want.value < 0) {
            status = BAD(b, "added_tokens[%lld] must have an id, an integer >= 0", k);
        } else {
            int i = 0;
            while (i < 5 && f[i] >= 0) i++;
            if (i < 5) {
                status = BAD(b, "added_tokens[%lld].%s must be true or false", k, names[i]);
            } else {
                const added_token a = {0, (unsigned char)f[0], (unsigned char)f[1],
                                       (unsigned char)f[2], (unsigned char)f[3],
                                       (unsigned char)f[4]};
                status = add_added(b, u, n, want.value, a);
            }
        }
    }
    free(u);
    return status;
}

/* One TemplateProcessing: its "single" template, special tokens around one $A. */
static pytfm_status read_template(builder *b, pytfm__json proc) {
    pytfm_tokenizer *t = b->t;
    pytfm__json single, specials, item, v, w;
    if (t->tmpl) return BAD(b, "post_processor: more than one TemplateProcessing");
    if (!member(proc, "single", &single) || pytfm__json_kind_of(single) != PYTFM__JSON_ARRAY)
        return BAD(b, "post_processor: TemplateProcessing's single must be a list");
    if (!member(proc, "special_tokens", &specials) ||
        pytfm__json_kind_of(specials) != PYTFM__JSON_OBJECT)
        return BAD(b, "post_processor: TemplateProcessing's special_tokens must be an object");
    int64_t count = 0, seq = -1, cap = 16;
    t->tmpl = malloc((size_t)cap * sizeof *t->tmpl);
    if (!t->tmpl) return no_memory(b, "the post-processor's template");
    pytfm__json key;
    pytfm__json_iter it = pytfm__json_iter_of(single);
    for (long long k = 0; pytfm__json_next(&it, NULL, &item); k++) {
        pytfm__json body, name;
        if (member(item, "Sequence", &body)) {
            if (seq >= 0 || pytfm__json_count(item) != 1 || !member(body, "id", &name) ||
                !pytfm__json_string_is(name, "A"))
                return BAD(b, "post_processor: TemplateProcessing's single must hold $A once "
                              "(item %lld)", k);
            seq = count;
            continue;
        }
        if (pytfm__json_count(item) != 1 || !member(item, "SpecialToken", &body) ||
            !member(body, "id", &name) || pytfm__json_kind_of(name) != PYTFM__JSON_STRING)
            return BAD(b, "post_processor: TemplateProcessing's single[%lld] is neither a "
                          "Sequence nor a SpecialToken", k);
        pytfm__json_iter si = pytfm__json_iter_of(specials);
        int found = 0;
        while (!found && pytfm__json_next(&si, &key, &v))
            found = pytfm__json_string_compare(key, name) == 0;
        if (!found || !member(v, "ids", &w) || pytfm__json_kind_of(w) != PYTFM__JSON_ARRAY)
            return BAD(b, "post_processor: TemplateProcessing's single[%lld] names a special "
                          "token that special_tokens has no ids for", k);
        pytfm__json_iter ii = pytfm__json_iter_of(w);
        pytfm__json x;
        while (pytfm__json_next(&ii, NULL, &x)) {
            const pytfm__json_int id = pytfm__json_kind_of(x) == PYTFM__JSON_NUMBER
                                           ? pytfm__json_integer(x)
                                           : (pytfm__json_int){0, 0, 0, 0};
            if (!id.integer || !id.fits || id.value < 0 || id.value >= t->n_tokens)
                return BAD(b, "post_processor: TemplateProcessing's special token of "
                              "single[%lld] has an id outside the vocabulary [0, %lld)", k,
                           (long long)t->n_tokens);
            if (count == cap) {
                int32_t *more = realloc(t->tmpl, (size_t)(cap *= 2) * sizeof *more);
                if (!more) return no_memory(b, "the post-processor's template");
                t->tmpl = more;
            }
            t->tmpl[count++] = (int32_t)id.value;
        }
    }
    if (seq < 0) return BAD(b, "post_processor: TemplateProcessing's single must hold $A once");
    t->n_before = seq;
    t->n_after = count - seq;
    return PYTFM_STATUS_OK;
}

/* post_processor: null, ByteLevel (it adds no ids), TemplateProcessing, or a Sequence of them */
static pytfm_status read_post_processor(builder *b, pytfm__json doc) {
    pytfm__json proc, list, item;
    if (absent_or(doc, "post_processor", 0, 0) ||
        (member(doc, "post_processor", &proc) && is_type(proc, "ByteLevel")))
        return PYTFM_STATUS_OK;
    if (is_type(proc, "TemplateProcessing")) return read_template(b, proc);
    if (is_type(proc, "Sequence") && member(proc, "processors", &list) &&
        pytfm__json_kind_of(list) == PYTFM__JSON_ARRAY) {
        pytfm__json_iter it = pytfm__json_iter_of(list);
        while (pytfm__json_next(&it, NULL, &item)) {
            if (is_type(item, "TemplateProcessing")) PYTFM_TRY(read_template(b, item));
            else if (!is_type(item, "ByteLevel")) break;
        }
        if (!pytfm__json_next(&it, NULL, &item)) return PYTFM_STATUS_OK;
    }
    return BAD(b, "post_processor must be null, ByteLevel, TemplateProcessing or a Sequence "
                  "of them (pytfm implements no other)");
}

/* Compile the pattern of a Split (item, at where): its Regex or String, into *re; *kind the
 * PRE_ value of a hand-scanned Regex, else PRE_REGEX. */
static pytfm_status split_pattern(builder *b, pytfm__json item, const char *where,
                                  pytfm__regex **re, int *kind) {
    pytfm__json v, regex;
    int literal = 0;
    *re = NULL;
    if (!member(item, "pattern", &v) || pytfm__json_kind_of(v) != PYTFM__JSON_OBJECT ||
        pytfm__json_count(v) != 1 ||
        !(member(v, "Regex", &regex) || (literal = member(v, "String", &regex))) ||
        pytfm__json_kind_of(regex) != PYTFM__JSON_STRING)
        return BAD(b, "%s.pattern must be {\"Regex\": pattern} or {\"String\": text}", where);
    *kind = PRE_REGEX;
    for (int k = PRE_GPT2; k <= PRE_QWEN2 && !literal; k++)
        if (pytfm__json_string_is(regex, split_regex[k])) *kind = k;
    char *text = malloc(regex.n + 1), err[200];
    if (!text) return BAD(b, "out of memory");
    int lone = 0;
    const size_t n = pytfm__json_string_utf8(regex, text, &lone);
    *re = lone ? NULL : pytfm__regex_compile(text, n, literal, err, sizeof err);
    free(text);
    if (lone) return BAD(b, "%s.pattern holds a lone surrogate", where);
    if (!*re) return BAD(b, "%s.pattern %s: %s", where, literal ? "String" : "Regex", err);
    return PYTFM_STATUS_OK;
}

/* Compile the regex text (a fixed pattern of pytfm's) into step st */
static pytfm_status fixed_step(builder *b, pre_step *st, const char *text, int behavior) {
    char err[200];
    st->re = pytfm__regex_compile(text, strlen(text), 0, err, sizeof err);
    st->behavior = behavior;
    st->invert = 0;
    return st->re ? PYTFM_STATUS_OK : BAD(b, "pre_tokenizer: %s", err);
}

/* Step st of a Sequence's item i (a Split, Digits or Punctuation) */
static pytfm_status read_step_item(builder *b, pytfm__json item, int64_t i, pre_step *st) {
    static const char *const behaviors[5] = {"Removed", "Isolated", "MergedWithPrevious",
                                             "MergedWithNext", "Contiguous"};
    char where[64];
    snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%lld]: %s", (long long)i,
             is_type(item, "Punctuation") ? "Punctuation" : "Split");
    pytfm__json v;
    if (is_type(item, "Digits")) {
        const int each = flag(item, "individual_digits", 0);
        if (each < 0)
            return BAD(b, "pre_tokenizer.pretokenizers[%lld]: Digits.individual_digits must be "
                          "true or false", (long long)i);
        /* Rust's char::is_numeric: the general categories N*; each digit a match */
        return fixed_step(b, st, "\\p{N}", each ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS);
    }
    int behavior = -1;
    if (is_type(item, "Punctuation") || is_type(item, "Split")) {
        if (member(item, "behavior", &v))
            for (int k = 0; k < 5; k++)
                if (pytfm__json_string_is(v, behaviors[k])) behavior = k;
        if (is_type(item, "Punctuation") && !member(item, "behavior", &v))
            behavior = SPLIT_ISOLATED;
        if (behavior < 0)
            return BAD(b, "%s.behavior must be Removed, Isolated, MergedWithPrevious, "
                          "MergedWithNext or Contiguous", where);
    }
    if (is_type(item, "Punctuation")) {
        /* tokenizers' is_punc: Rust's is_ascii_punctuation or a general category P* */
        return fixed_step(b, st, "[\\p{P}!-/:-@\\[-`{-~]", behavior);
    }
    if (!is_type(item, "Split"))
        return BAD(b, "pre_tokenizer.pretokenizers[%lld]: pytfm implements Split, Digits, "
                      "Punctuation and a last ByteLevel in a byte-level Sequence", (long long)i);
    const int invert = flag(item, "invert", 0);
    if (invert < 0) return BAD(b, "%s.invert must be true or false", where);
    int kind;
    PYTFM_TRY(split_pattern(b, item, where, &st->re, &kind));
    st->behavior = behavior;
    st->invert = invert;
    return PYTFM_STATUS_OK;
}

/* pre_tokenizer: GPT-2's ByteLevel (add_prefix_space false, use_regex true), or a Sequence of
 * Splits (a Regex regex.c compiles or a String; any behavior, invert), Digits and Punctuation,
 * then a ByteLevel with add_prefix_space false (use_regex true: GPT-2's regex splits last).
 * [Split (Isolated, invert false), ByteLevel (use_regex false)] keeps its fast paths (one of
 * split_regex is scanned by hand, another regex runs alone); the rest runs as PRE_STEPS, each
 * step splitting every piece the one before left, as tokenizers' Sequence does. */
static pytfm_status read_pre_tokenizer(builder *b, pytfm__json doc) {
    pytfm__json part, list, item, level, v;
    if (!member(doc, "pre_tokenizer", &part))
        return BAD(b, "pre_tokenizer must be ByteLevel, or a Sequence of Split and ByteLevel");
    if (is_type(part, "ByteLevel")) {
        if (flag(part, "add_prefix_space", -1) != 0 || flag(part, "use_regex", 1) != 1)
            return BAD(b, "pre_tokenizer: GPT-2's has add_prefix_space false and use_regex "
                          "true");
        b->t->pretok = PRE_GPT2;
        return PYTFM_STATUS_OK;
    }
    if (!is_type(part, "Sequence"))
        return BAD(b, "pre_tokenizer must be ByteLevel, or a Sequence of Split and ByteLevel");
    if (!member(part, "pretokenizers", &list) || pytfm__json_kind_of(list) != PYTFM__JSON_ARRAY ||
        pytfm__json_count(list) < 1)
        return BAD(b, "pre_tokenizer.pretokenizers must be a list ending with ByteLevel");
    const int64_t n = pytfm__json_count(list);
    pytfm__json_iter it = pytfm__json_iter_of(list);
    for (int64_t i = 0; i < n; i++) pytfm__json_next(&it, NULL, &level);
    if (!is_type(level, "ByteLevel"))
        return BAD(b, "pre_tokenizer.pretokenizers must end with ByteLevel (a byte-level BPE)");
    const int use_regex = flag(level, "use_regex", 1);
    if (flag(level, "add_prefix_space", -1) != 0 || use_regex < 0)
        return BAD(b, "pre_tokenizer: the ByteLevel ending a Sequence must have "
                      "add_prefix_space false and use_regex true or false");
    it = pytfm__json_iter_of(list);
    pytfm__json_next(&it, NULL, &item);
    if (n == 2 && use_regex == 0 && is_type(item, "Split") && member(item, "behavior", &v) &&
        pytfm__json_string_is(v, "Isolated") && flag(item, "invert", 0) == 0) {
        int kind;
        PYTFM_TRY(split_pattern(b, item, "pre_tokenizer: Split", &b->t->split, &kind));
        if (kind != PRE_REGEX) {
            pytfm__regex_free(b->t->split);
            b->t->split = NULL;
        }
        b->t->pretok = kind;
        return PYTFM_STATUS_OK;
    }
    if (n == 1 && use_regex) { /* [ByteLevel] alone: GPT-2's */
        b->t->pretok = PRE_GPT2;
        return PYTFM_STATUS_OK;
    }
    const int64_t n_steps = n - 1 + use_regex;
    if (n_steps > 64) return BAD(b, "pre_tokenizer.pretokenizers: more than 64 (pytfm's limit)");
    b->t->steps = calloc((size_t)(n_steps ? n_steps : 1), sizeof *b->t->steps);
    if (!b->t->steps) return BAD(b, "out of memory");
    b->t->pretok = PRE_STEPS;
    it = pytfm__json_iter_of(list);
    for (int64_t i = 0; i < n - 1; i++) {
        pytfm__json_next(&it, NULL, &item);
        b->t->n_steps++; /* counted first: close frees a step's NULL regex too */
        PYTFM_TRY(read_step_item(b, item, i, &b->t->steps[i]));
    }
    if (use_regex) {
        b->t->n_steps++;
        PYTFM_TRY(fixed_step(b, &b->t->steps[n - 1], split_regex[PRE_GPT2], SPLIT_ISOLATED));
    }
    return PYTFM_STATUS_OK;
}

/* ---- files whose tokens are text (model.byte_fallback) ------------------------------------ */

/* The string member key of obj, unescaped into *out (malloc'd, NUL after it), *n its bytes:
 * 1; 0 when it is absent or not a string of Unicode; -1 out of memory. */
static int string_member(pytfm__json obj, const char *key, unsigned char **out, size_t *n) {
    pytfm__json v;
    if (!member(obj, key, &v) || pytfm__json_kind_of(v) != PYTFM__JSON_STRING) return 0;
    unsigned char *u = malloc(v.n + 1);
    if (!u) return -1;
    int lone = 0;
    const size_t k = pytfm__json_string_utf8(v, (char *)u, &lone);
    if (lone) {
        free(u);
        return 0;
    }
    u[k] = 0;
    *out = u;
    *n = k;
    return 1;
}

/* A String pattern, {"String": s} with s not empty, of obj's member key: as string_member */
static int pattern_member(pytfm__json obj, const char *key, unsigned char **out, size_t *n) {
    pytfm__json v;
    if (!member(obj, key, &v) || pytfm__json_count(v) != 1) return 0;
    const int r = string_member(v, "String", out, n);
    if (r == 1 && *n == 0) {
        free(*out);
        *out = NULL;
        return 0;
    }
    return r;
}

/* 1 when u[0..n) is one character */
static int one_char(const unsigned char *u, size_t n) {
    uint32_t cp = 0;
    return n > 0 && (size_t)pytfm__utf8_at(u, n, &cp) == n;
}

/* Metaspace's prepend_scheme ("always" when absent): a PREPEND_ value, -1 for anything else.
 * Older files' add_prefix_space is read as tokenizers reads it: the scheme decides, and
 * add_prefix_space false with a scheme other than "never" is refused (tokenizers refuses it). */
static int prepend_scheme(pytfm__json obj) {
    pytfm__json v;
    int scheme = PREPEND_ALWAYS;
    if (member(obj, "prepend_scheme", &v) && pytfm__json_kind_of(v) != PYTFM__JSON_NULL)
        scheme = pytfm__json_string_is(v, "always") ? PREPEND_ALWAYS
               : pytfm__json_string_is(v, "first")  ? PREPEND_FIRST
               : pytfm__json_string_is(v, "never")  ? PREPEND_NEVER : -1;
    const int f = absent_or(obj, "add_prefix_space", 0, 0) ? 1 : flag(obj, "add_prefix_space", 1);
    return f < 0 || (f == 0 && scheme != PREPEND_NEVER) ? -1 : scheme;
}

/* A member that is an integer >= 0: its value, or -1 */
static int64_t count_member(pytfm__json obj, const char *key) {
    pytfm__json v;
    if (!member(obj, key, &v) || pytfm__json_kind_of(v) != PYTFM__JSON_NUMBER) return -1;
    const pytfm__json_int x = pytfm__json_integer(v);
    return x.integer && x.fits && x.value >= 0 ? x.value : -1;
}

/* One step of a normalizer (decoder 0: NFC, Prepend, Replace of a String) or a decoder
 * (decoder 1: Replace of a String, ByteFallback, Fuse, Strip, Metaspace) into *st; where:
 * its place, for messages. */
static pytfm_status read_step(builder *b, pytfm__json item, int decoder, const char *where,
                              text_step *st) {
    static const char *const norms = "NFC, Prepend, Replace of a String, or a Sequence of them";
    static const char *const decs = "Replace of a String, ByteFallback, Fuse, Strip, Metaspace, "
                                    "or a Sequence of them";
    pytfm__json type;
    char shown[48];
    int r = 1;
    memset(st, 0, sizeof *st);
    if (!decoder && is_type(item, "NFC")) {
        st->kind = STEP_NFC;
    } else if (!decoder && is_type(item, "Prepend")) {
        st->kind = STEP_PREPEND;
        r = string_member(item, "prepend", &st->a, &st->na);
        if (r == 0) return BAD(b, "%s: Prepend's prepend must be a string", where);
    } else if (is_type(item, "Replace")) {
        st->kind = STEP_REPLACE;
        r = pattern_member(item, "pattern", &st->a, &st->na);
        if (r == 1) r = string_member(item, "content", &st->b, &st->nb);
        if (r == 0)
            return BAD(b, "%s: Replace must have a pattern {\"String\": a non-empty string} and "
                          "a content string (pytfm implements no Regex pattern)", where);
    } else if (decoder && is_type(item, "ByteFallback")) {
        st->kind = STEP_BYTE_FALLBACK;
    } else if (decoder && is_type(item, "Fuse")) {
        st->kind = STEP_FUSE;
    } else if (decoder && is_type(item, "Strip")) {
        st->kind = STEP_STRIP;
        r = string_member(item, "content", &st->a, &st->na);
        st->start = count_member(item, "start");
        st->stop = count_member(item, "stop");
        if (r == 0 || (r == 1 && (!one_char(st->a, st->na) || st->start < 0 || st->stop < 0)))
            return BAD(b, "%s: Strip must have a content of one character and a start and a "
                          "stop, integers >= 0", where);
    } else if (decoder && is_type(item, "Metaspace")) {
        st->kind = STEP_METASPACE;
        r = string_member(item, "replacement", &st->a, &st->na);
        const int scheme = prepend_scheme(item);
        if (r == 0 || (r == 1 && (!one_char(st->a, st->na) || scheme < 0)))
            return BAD(b, "%s: Metaspace must have a replacement of one character and a "
                          "prepend_scheme \"always\", \"first\" or \"never\" (\"never\" "
                          "where add_prefix_space is false)", where);
        st->start = scheme != PREPEND_NEVER;
    } else {
        return BAD(b, "%s: %s is not a %s pytfm implements (%s)", where,
                   member(item, "type", &type) ? pytfm__json_show(type, shown, sizeof shown)
                                               : "a step without a type",
                   decoder ? "decoder" : "normalizer", decoder ? decs : norms);
    }
    return r < 0 ? no_memory(b, where) : PYTFM_STATUS_OK;
}

/* The normalizer (decoder 0) or the decoder (1) of a file whose tokens are text: null, a step
 * or a Sequence of steps, into *steps (*count of them) */
static pytfm_status read_steps(builder *b, pytfm__json doc, int decoder, text_step **steps,
                               int *count) {
    const char *name = decoder ? "decoder" : "normalizer";
    pytfm__json part, list, item;
    if (absent_or(doc, name, 0, 0)) return PYTFM_STATUS_OK;
    member(doc, name, &part);
    const int seq = is_type(part, "Sequence");
    if (seq && (!member(part, decoder ? "decoders" : "normalizers", &list) ||
                pytfm__json_kind_of(list) != PYTFM__JSON_ARRAY))
        return BAD(b, "%s: a Sequence must have a list of %ss", name, name);
    const size_t n = seq ? pytfm__json_count(list) : 1;
    if (n > 64) return BAD(b, "%s: %zu steps, more than the 64 pytfm takes", name, n);
    *steps = calloc(n ? n : 1, sizeof **steps);
    if (!*steps) return no_memory(b, name);
    pytfm__json_iter it;
    if (seq) it = pytfm__json_iter_of(list);
    for (size_t k = 0; k < n; k++) {
        if (seq) pytfm__json_next(&it, NULL, &item);
        else item = part;
        char where[48];
        if (seq) snprintf(where, sizeof where, "%s.%ss[%zu]", name, name, k);
        else snprintf(where, sizeof where, "%s", name);
        const pytfm_status status = read_step(b, item, decoder, where, &(*steps)[k]);
        *count = (int)k + 1; /* freed with the tokenizer, whole or not */
        PYTFM_TRY(status);
    }
    return PYTFM_STATUS_OK;
}

/* The pre-tokenizer of a file whose tokens are text: null (the piece is one word), Metaspace
 * (replacement, prepend_scheme, split) or a Split of a String (any behavior, invert) */
static pytfm_status read_text_pre_tokenizer(builder *b, pytfm__json doc) {
    static const char *const behaviors[5] = {"Removed", "Isolated", "MergedWithPrevious",
                                             "MergedWithNext", "Contiguous"};
    pytfm_tokenizer *t = b->t;
    pytfm__json part, v;
    t->pretok = PRE_NONE;
    if (absent_or(doc, "pre_tokenizer", 0, 0)) return PYTFM_STATUS_OK;
    member(doc, "pre_tokenizer", &part);
    int r;
    if (is_type(part, "Metaspace")) {
        t->pretok = PRE_METASPACE;
        r = string_member(part, "replacement", &t->pre_str, &t->pre_len);
        if (r == 0 || (r == 1 && !one_char(t->pre_str, t->pre_len)))
            return BAD(b, "pre_tokenizer: Metaspace's replacement must be one character");
        t->pre_prepend = prepend_scheme(part);
        if (t->pre_prepend < 0)
            return BAD(b, "pre_tokenizer: Metaspace's prepend_scheme must be \"always\", "
                          "\"first\" or \"never\" (\"never\" where add_prefix_space is "
                          "false)");
        t->pre_split = flag(part, "split", 1);
        if (t->pre_split < 0)
            return BAD(b, "pre_tokenizer: Metaspace's split must be true or false");
    } else if (is_type(part, "Split")) {
        t->pretok = PRE_SPLIT;
        r = pattern_member(part, "pattern", &t->pre_str, &t->pre_len);
        if (r == 0)
            return BAD(b, "pre_tokenizer: Split.pattern must be {\"String\": a non-empty "
                          "string} (pytfm implements no Regex here)");
        t->split_behavior = -1;
        for (int k = 0; k < 5; k++)
            if (member(part, "behavior", &v) && pytfm__json_string_is(v, behaviors[k]))
                t->split_behavior = k;
        t->split_invert = flag(part, "invert", 0);
        if (t->split_behavior < 0 || t->split_invert < 0)
            return BAD(b, "pre_tokenizer: Split must have a behavior (Removed, Isolated, "
                          "MergedWithPrevious, MergedWithNext or Contiguous) and invert true "
                          "or false");
    } else {
        char shown[48];
        return BAD(b, "pre_tokenizer: with model.byte_fallback, pytfm implements null, "
                      "Metaspace or a Split of a String, not %s",
                   member(part, "type", &v) ? pytfm__json_show(v, shown, sizeof shown)
                                            : "this");
    }
    return r < 0 ? no_memory(b, "the pre-tokenizer") : PYTFM_STATUS_OK;
}

/* model's settings with byte_fallback true: unk_token a string or null (never used: every
 * byte has its token), fuse_unk any, no dropout, prefix or suffix */
static pytfm_status read_text_model(builder *b, pytfm__json model) {
    pytfm__json v;
    if (!absent_or(model, "dropout", 0, 0))
        return BAD(b, "model.dropout must be absent or null (pytfm's BPE is exact)");
    if (!absent_or(model, "continuing_subword_prefix", 1, 0) ||
        !absent_or(model, "end_of_word_suffix", 1, 0))
        return BAD(b, "model.continuing_subword_prefix and model.end_of_word_suffix must be "
                      "absent, null or \"\" (pytfm implements neither)");
    if (!absent_or(model, "unk_token", 0, 0) &&
        (!member(model, "unk_token", &v) || pytfm__json_kind_of(v) != PYTFM__JSON_STRING))
        return BAD(b, "model.unk_token must be a string or null");
    if (!absent_or(model, "fuse_unk", 0, 1) && flag(model, "fuse_unk", 0) < 0)
        return BAD(b, "model.fuse_unk must be true, false or null");
    return PYTFM_STATUS_OK;
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
                    {"fuse_unk", 0, 1}};
    const int fallback = absent_or(model, "byte_fallback", 0, 0) ? 0
                                                                  : flag(model, "byte_fallback", 0);
    if (fallback < 0) return BAD(b, "model.byte_fallback must be true, false or null");
    b->t->text_tokens = fallback;
    if (fallback) {
        PYTFM_TRY(read_text_model(b, model));
        PYTFM_TRY(read_steps(b, doc, 0, &b->t->norm, &b->t->n_norm));
        PYTFM_TRY(read_text_pre_tokenizer(b, doc));
        b->t->has_dec = !absent_or(doc, "decoder", 0, 0);
        PYTFM_TRY(read_steps(b, doc, 1, &b->t->dec, &b->t->n_dec));
    }
    for (size_t i = 0; i < sizeof settings / sizeof settings[0] && !fallback; i++)
        if (!absent_or(model, settings[i].key, settings[i].string_ok, settings[i].false_ok))
            return BAD(b, "model.%s must be absent%s (GPT-2's BPE has none)", settings[i].key,
                       settings[i].string_ok  ? ", null or \"\""
                       : settings[i].false_ok ? ", null or false" : " or null");
    if (!fallback && member(doc, "normalizer", &part) &&
        pytfm__json_kind_of(part) != PYTFM__JSON_NULL) {
        if (!is_type(part, "NFC"))
            return BAD(b, "normalizer must be null or NFC (pytfm implements no other)");
        b->t->norm = calloc(1, sizeof *b->t->norm);
        if (!b->t->norm) return no_memory(b, "the normalizer");
        b->t->n_norm = 1; /* STEP_NFC */
    }
    const int ignore =
        absent_or(model, "ignore_merges", 0, 1) ? 0 : flag(model, "ignore_merges", 0);
    if (ignore < 0) return BAD(b, "model.ignore_merges must be true, false or absent");
    b->t->ignore_merges = ignore;
    if (!fallback) PYTFM_TRY(read_pre_tokenizer(b, doc));
    if (!fallback && member(doc, "decoder", &part) &&
        pytfm__json_kind_of(part) != PYTFM__JSON_NULL && !is_type(part, "ByteLevel"))
        return BAD(b, "decoder must be ByteLevel or null");
    if (!absent_or(doc, "truncation", 0, 0))
        return BAD(b, "truncation must be null (pytfm encodes whole texts)");
    if (!absent_or(doc, "padding", 0, 0))
        return BAD(b, "padding must be null (pytfm encodes whole texts)");
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
    if (status == PYTFM_STATUS_OK) status = read_added_tokens(b, doc);
    if (status == PYTFM_STATUS_OK) status = read_post_processor(b, doc);
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
        if (status == PYTFM_STATUS_OK) status = add_endoftext(&b);
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
