/*
 * regex.c — a backtracking regex engine for tokenizer.json's Split patterns (regex.h).
 *
 * pattern --parse--> tree of nodes --compile--> program --run--> leftmost-first match
 *
 * The syntax and the semantics are Oniguruma's (Ruby syntax, as Hugging Face tokenizers uses
 * it): ^ and $ are line anchors, . is any character but \n, \s \d \w and \p{..} are Unicode
 * classes, (?i) applies to the rest of its group (alternatives included), a{,n} is a{0,n}, a
 * '{' that begins no interval is a literal. Alternatives are tried in order and the first
 * match found is the match; quantifiers are greedy, lazy (??) or possessive (*+).
 *
 * The run keeps its choice points on an explicit stack, never recursing per character: a
 * quantifier over one character counts its characters in a loop and, when backtracked into,
 * gives them back one at a time from one stack entry. Only lookaheads and atomic groups
 * recurse, as deep as they nest in the pattern. Every step counts against a budget (regex.h),
 * so that a pattern that backtracks exponentially fails with an error instead of hanging.
 *
 * Case-insensitivity is implemented for ASCII letters, with Oniguruma's two non-ASCII
 * foldings onto them (U+017F long s -> s, U+212A Kelvin sign -> k); a case-insensitive
 * construct that could match other cased characters, or a literal "ss", "st", "ff", "fi" or
 * "fl" (which Oniguruma also matches to one ligature or sharp s), is refused.
 */
#include "regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode_tables.h"
#include "utf8.h"

enum {
    MAX_DEPTH = 64,          /* groups and classes nested in a pattern */
    MAX_PROGRAM = 1 << 18,   /* instructions, after counted repeats are expanded */
    MAX_REPEAT = 100000,     /* Oniguruma's largest {n,m} */
    STEPS_BASE = 100000000,  /* the step budget: STEPS_BASE + STEPS_PER_BYTE * text bytes */
    STEPS_PER_BYTE = 1024
};

#define GC(x) (1u << PYTFM__GC_##x)
#define GC_L (GC(Lu) | GC(Ll) | GC(Lt) | GC(Lm) | GC(Lo))
#define GC_M (GC(Mn) | GC(Mc) | GC(Me))
#define GC_N (GC(Nd) | GC(Nl) | GC(No))
#define GC_P (GC(Pc) | GC(Pd) | GC(Ps) | GC(Pe) | GC(Pi) | GC(Pf) | GC(Po))
#define GC_S (GC(Sm) | GC(Sc) | GC(Sk) | GC(So))
#define GC_Z (GC(Zs) | GC(Zl) | GC(Zp))
#define GC_C (GC(Cc) | GC(Cf) | GC(Cs) | GC(Co) | GC(Cn))
/* categories holding a character with a case partner: refused under (?i) */
#define GC_CASED (GC_L | GC(Mn) | GC(Nl) | GC(So))

/* ---- UTF-8 and the classes ------------------------------------------------------------------ */


/* The character of text at pos (pos < size), *len its bytes: a byte that begins no valid
 * sequence is one character, U+DC00 + the byte (Python's surrogateescape; category Cs). */
static uint32_t char_at(const unsigned char *text, size_t size, size_t pos, size_t *len) {
    uint32_t cp = 0;
    const int k = pytfm__utf8_at(text + pos, size - pos, &cp);
    *len = k ? (size_t)k : 1;
    return k ? cp : 0xDC00u + text[pos];
}

/* The start of the character that ends at q (lo < q), no earlier than lo (a character
 * boundary), as char_at reads characters forward from lo. */
static size_t char_before(const unsigned char *text, size_t lo, size_t q) {
    size_t c = q - 1;
    while (c > lo && q - c < 4 && (text[c] & 0xC0) == 0x80) c--;
    uint32_t cp = 0;
    return pytfm__utf8_at(text + c, q - c, &cp) == (int)(q - c) ? c : q - 1;
}

static int gc_of(uint32_t cp) {
    size_t lo = 0, hi = PYTFM__GC_RANGES;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (cp < pytfm__gc_table[mid].first) hi = mid;
        else if (cp > pytfm__gc_table[mid].last) lo = mid + 1;
        else return pytfm__gc_table[mid].gc;
    }
    return PYTFM__GC_Cn;
}

/* \s: Oniguruma's (and Unicode's White_Space): \t..\r, U+0085 and the separators */
static int is_space(uint32_t cp, uint32_t gc_bit) {
    return (cp >= 9 && cp <= 13) || cp == 0x85 || (gc_bit & GC_Z);
}

/* \w as Oniguruma's: letters, marks, Nd, Nl, Pc, the circled and squared Latin letters, and
 * outside a class (latin1 set) the Latin-1 superscripts and fractions, which Oniguruma's \w
 * matches and its [\w] does not */
static int is_word(uint32_t cp, uint32_t gc_bit, int latin1) {
    static const uint32_t extra[][2] = {{0x24B6, 0x24E9}, {0x1F130, 0x1F149},
                                        {0x1F150, 0x1F169}, {0x1F170, 0x1F189}};
    if (gc_bit & (GC_L | GC_M | GC(Nd) | GC(Nl) | GC(Pc))) return 1;
    if (latin1 && (cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || (cp >= 0xBC && cp <= 0xBE)))
        return 1;
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (cp >= extra[i][0] && cp <= extra[i][1]) return 1;
    return 0;
}

static int is_hex(uint32_t cp) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'f') || (cp >= 'A' && cp <= 'F');
}

/* ---- the compiled pattern ------------------------------------------------------------------- */

/* A set of characters: the union of its items, negated when neg. An item is a range, some
 * general categories, a class escape or a nested set, itself negated when its neg is set. */
enum { IT_RANGE, IT_GC, IT_SPACE, IT_WORD, IT_HEX, IT_SET };
typedef struct item {
    uint8_t kind, neg;
    uint32_t a, b;   /* IT_RANGE: first, last; IT_GC: a category mask; IT_SET: a set; IT_WORD:
                      * b = 1 in a class (is_word's latin1 = 0) */
    int32_t next;    /* the set's next item, or -1 */
} item;

typedef struct cset {
    int32_t first; /* its first item, or -1 */
    uint8_t neg;
    uint32_t ascii[4]; /* membership of U+0000..U+007F, precomputed */
} cset;

enum { OP_SET, OP_STAR, OP_SPLIT, OP_JMP, OP_MARK, OP_CHECK, OP_ASSERT, OP_LOOK, OP_ATOMIC,
       OP_SUCCEED };
enum { GREEDY, LAZY, POSSESSIVE };
enum { A_LINE_START, A_LINE_END, A_TEXT_START, A_TEXT_END, A_TEXT_END_NL, A_WORD, A_NOT_WORD };

/* OP_SET a: one character of set a. OP_STAR a, x, y, mode: x to y (-1: no limit) characters
 * of set a. OP_SPLIT x, y: go on at x, else at y. OP_JMP x. OP_MARK a: slot a = the position.
 * OP_CHECK a, x: go to x unless the position is slot a's (an iteration that matched nothing
 * ends its loop, as Oniguruma's empty check). OP_ASSERT a: an anchor. OP_LOOK a, x: the
 * program after it up to its OP_SUCCEED must match here (a = 0) or must not (a = 1), then x.
 * OP_ATOMIC x: its first match is taken, then x. OP_SUCCEED: the (sub)program matched. */
typedef struct inst {
    uint8_t op, mode;
    int32_t a, x, y;
} inst;

struct pytfm__regex {
    item *items;
    cset *sets;
    inst *prog;
    int32_t n_items, n_sets, n_prog, n_slots;
    int32_t cap_items, cap_sets, cap_prog;
};

static int set_has(const pytfm__regex *re, int32_t s, uint32_t cp);

static int item_has(const pytfm__regex *re, const item *it, uint32_t cp, uint32_t *gc_bit) {
    int r;
    if (it->kind == IT_RANGE) return cp >= it->a && cp <= it->b; /* neg unused for ranges */
    if (it->kind == IT_SET) return set_has(re, (int32_t)it->a, cp);
    if (it->kind == IT_HEX) return is_hex(cp) != it->neg;
    if (*gc_bit == 0) *gc_bit = 1u << gc_of(cp);
    if (it->kind == IT_GC) r = (*gc_bit & it->a) != 0;
    else if (it->kind == IT_SPACE) r = is_space(cp, *gc_bit);
    else r = is_word(cp, *gc_bit, !it->b);
    return r != it->neg;
}

static int set_has(const pytfm__regex *re, int32_t s, uint32_t cp) {
    const cset *c = &re->sets[s];
    if (cp < 128) return (c->ascii[cp >> 5] >> (cp & 31)) & 1;
    uint32_t gc_bit = 0;
    int hit = 0;
    for (int32_t i = c->first; i >= 0 && !hit; i = re->items[i].next)
        hit = item_has(re, &re->items[i], cp, &gc_bit);
    return hit != c->neg;
}

/* ---- parsing ---------------------------------------------------------------------------------
 * A tree of nodes: N_SET a (one character), N_CAT and N_ALT (children from child, linked by
 * next), N_REPEAT (child, a..b times, b = -1: no limit, mode), N_LOOK (child, a: negative),
 * N_ATOMIC (child), N_ASSERT a, N_EMPTY. */
enum { N_EMPTY, N_SET, N_CAT, N_ALT, N_REPEAT, N_LOOK, N_ATOMIC, N_ASSERT };
typedef struct node {
    uint8_t type, mode;
    int32_t a, b, child, next;
    int32_t lit; /* N_SET of a literal ASCII letter under (?i): the letter, lower case; else 0 */
} node;

typedef struct parser {
    pytfm__regex *re;
    const unsigned char *start, *p, *end;
    node *nodes;
    int32_t n_nodes, cap_nodes;
    int depth, literal;
    char *err;
    size_t cap;
    int failed;
} parser;

static int fail(parser *ps, const char *fmt, ...) {
    if (ps->failed) return -1;
    ps->failed = 1;
    int k = snprintf(ps->err, ps->cap, "at byte %zu: ", (size_t)(ps->p - ps->start));
    if (k < 0 || (size_t)k >= ps->cap) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err + k, ps->cap - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static void *grow(parser *ps, void *p, int32_t *cap, int32_t need, size_t size) {
    if (need <= *cap) return p;
    const int32_t c = need > 2 * *cap + 16 ? need : 2 * *cap + 16;
    void *q = realloc(p, (size_t)c * size);
    if (!q) {
        fail(ps, "out of memory");
        return NULL;
    }
    *cap = c;
    return q;
}

static int32_t new_node(parser *ps, int type) {
    node *n = grow(ps, ps->nodes, &ps->cap_nodes, ps->n_nodes + 1, sizeof *n);
    if (!n) return -1;
    ps->nodes = n;
    n[ps->n_nodes] = (node){(uint8_t)type, 0, 0, 0, -1, -1, 0};
    return ps->n_nodes++;
}

static int32_t new_set(parser *ps, int neg) {
    pytfm__regex *re = ps->re;
    cset *s = grow(ps, re->sets, &re->cap_sets, re->n_sets + 1, sizeof *s);
    if (!s) return -1;
    re->sets = s;
    s[re->n_sets] = (cset){-1, (uint8_t)neg, {0, 0, 0, 0}};
    return re->n_sets++;
}

static int add_item(parser *ps, int32_t set, int kind, int neg, uint32_t a, uint32_t b) {
    pytfm__regex *re = ps->re;
    item *it = grow(ps, re->items, &re->cap_items, re->n_items + 1, sizeof *it);
    if (!it) return -1;
    re->items = it;
    it[re->n_items] = (item){(uint8_t)kind, (uint8_t)neg, a, b, re->sets[set].first};
    re->sets[set].first = re->n_items++;
    return 0;
}

/* the ASCII bitmap of set s (its items complete) */
static void set_finish(pytfm__regex *re, int32_t s) {
    cset *c = &re->sets[s];
    memset(c->ascii, 0, sizeof c->ascii);
    for (uint32_t cp = 0; cp < 128; cp++) {
        uint32_t gc_bit = 0;
        int hit = 0;
        for (int32_t i = c->first; i >= 0 && !hit; i = re->items[i].next)
            hit = item_has(re, &re->items[i], cp, &gc_bit);
        if (hit != c->neg) c->ascii[cp >> 5] |= 1u << (cp & 31);
    }
}

/* Under (?i): refuse what could match a cased character other than an ASCII letter */
static int check_caseless(parser *ps, uint32_t lo, uint32_t hi) {
    if (hi < 128) return 0;
    for (uint32_t cp = lo < 128 ? 128 : lo; cp <= hi; cp++)
        if ((1u << gc_of(cp)) & GC_CASED)
            return fail(ps, "case-insensitive U+%04X (pytfm folds ASCII letters only)",
                        (unsigned)cp);
    return 0;
}

/* Under (?i): add to set s the case partners of the ASCII letters it holds (s's items as
 * parsed, before its negation), and U+017F and U+212A, which Oniguruma folds onto s and k. */
static int fold_set(parser *ps, int32_t s) {
    pytfm__regex *re = ps->re;
    const uint8_t neg = re->sets[s].neg;
    re->sets[s].neg = 0;
    set_finish(re, s);
    uint32_t add[4] = {0, 0, 0, 0};
    for (uint32_t c = 'a'; c <= 'z'; c++) {
        const uint32_t u = c - 32;
        const int has = ((re->sets[s].ascii[c >> 5] >> (c & 31)) & 1) ||
                        ((re->sets[s].ascii[u >> 5] >> (u & 31)) & 1);
        if (has) {
            add[c >> 5] |= 1u << (c & 31);
            add[u >> 5] |= 1u << (u & 31);
        }
    }
    for (uint32_t c = 0; c < 128; c++)
        if ((add[c >> 5] >> (c & 31)) & 1)
            if (add_item(ps, s, IT_RANGE, 0, c, c) < 0) return -1;
    if ((add['s' >> 5] >> ('s' & 31)) & 1)
        if (add_item(ps, s, IT_RANGE, 0, 0x17F, 0x17F) < 0) return -1;
    if ((add['k' >> 5] >> ('k' & 31)) & 1)
        if (add_item(ps, s, IT_RANGE, 0, 0x212A, 0x212A) < 0) return -1;
    re->sets[s].neg = neg;
    return 0;
}

/* a property name as Oniguruma compares them: case, spaces, '_' and '-' ignored */
static int name_is(const unsigned char *p, size_t n, const char *want) {
    size_t i = 0;
    for (; *want; want++) {
        while (i < n && (p[i] == ' ' || p[i] == '_' || p[i] == '-')) i++;
        if (i == n) return 0;
        unsigned char c = p[i++];
        if (c >= 'A' && c <= 'Z') c += 32;
        if (c != (unsigned char)*want) return 0;
    }
    while (i < n && (p[i] == ' ' || p[i] == '_' || p[i] == '-')) i++;
    return i == n;
}

/* the category mask of a \p{name}, 0 when pytfm does not know it */
static uint32_t property_mask(const unsigned char *p, size_t n) {
    static const struct {
        const char *s, *l;
        uint32_t mask;
    } props[] = {
        {"l", "letter", GC_L}, {"lu", "uppercaseletter", GC(Lu)},
        {"ll", "lowercaseletter", GC(Ll)}, {"lt", "titlecaseletter", GC(Lt)},
        {"lm", "modifierletter", GC(Lm)}, {"lo", "otherletter", GC(Lo)},
        {"lc", "casedletter", GC(Lu) | GC(Ll) | GC(Lt)},
        {"m", "mark", GC_M}, {"mn", "nonspacingmark", GC(Mn)},
        {"mc", "spacingmark", GC(Mc)}, {"me", "enclosingmark", GC(Me)},
        {"n", "number", GC_N}, {"nd", "decimalnumber", GC(Nd)},
        {"nl", "letternumber", GC(Nl)}, {"no", "othernumber", GC(No)},
        {"p", "punctuation", GC_P}, {"pc", "connectorpunctuation", GC(Pc)},
        {"pd", "dashpunctuation", GC(Pd)}, {"ps", "openpunctuation", GC(Ps)},
        {"pe", "closepunctuation", GC(Pe)}, {"pi", "initialpunctuation", GC(Pi)},
        {"pf", "finalpunctuation", GC(Pf)}, {"po", "otherpunctuation", GC(Po)},
        {"s", "symbol", GC_S}, {"sm", "mathsymbol", GC(Sm)}, {"sc", "currencysymbol", GC(Sc)},
        {"sk", "modifiersymbol", GC(Sk)}, {"so", "othersymbol", GC(So)},
        {"z", "separator", GC_Z}, {"zs", "spaceseparator", GC(Zs)},
        {"zl", "lineseparator", GC(Zl)}, {"zp", "paragraphseparator", GC(Zp)},
        {"c", "other", GC_C}, {"cc", "control", GC(Cc)}, {"cf", "format", GC(Cf)},
        {"cs", "surrogate", GC(Cs)}, {"co", "privateuse", GC(Co)},
        {"cn", "unassigned", GC(Cn)}, {"any", "any", (1u << 30) - 1},
    };
    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++)
        if (name_is(p, n, props[i].s) || name_is(p, n, props[i].l)) return props[i].mask;
    return 0;
}

/* After "\p" or "\P": {name}, {^name} or one letter; adds the item to set s */
static int parse_property(parser *ps, int32_t s, int neg, int icase) {
    const unsigned char *name = ps->p;
    size_t n = 1;
    if (ps->p < ps->end && *ps->p == '{') {
        const unsigned char *close = memchr(ps->p, '}', (size_t)(ps->end - ps->p));
        if (!close) return fail(ps, "\\p{ without its }");
        name = ps->p + 1;
        n = (size_t)(close - name);
        ps->p = close + 1;
        if (n > 0 && name[0] == '^') {
            neg = !neg;
            name++;
            n--;
        }
    } else if (ps->p == ps->end) {
        return fail(ps, "\\p at the end of the pattern");
    } else {
        ps->p++;
    }
    const uint32_t mask = property_mask(name, n);
    if (mask == 0)
        return fail(ps, "\\p{%.*s} (pytfm implements the general categories only)", (int)n,
                    (const char *)name);
    if (icase && (mask & GC_CASED) && mask != (1u << 30) - 1)
        return fail(ps, "case-insensitive \\p{%.*s} (pytfm folds ASCII letters only)", (int)n,
                    (const char *)name);
    return add_item(ps, s, IT_GC, neg, mask, 0);
}

static int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* After a backslash, outside or inside a class: a character escape's code point in *cp (1),
 * a class escape added to set s (2: \s \d \w \h \p and their negations), or -1. An anchor or
 * other construct is the caller's before it calls this. */
static int parse_escape(parser *ps, int32_t s, uint32_t *cp, int icase, int in_class) {
    if (ps->p == ps->end) return fail(ps, "a \\ at the end of the pattern");
    const unsigned char c = *ps->p++;
    switch (c) {
    case 't': *cp = '\t'; return 1;
    case 'n': *cp = '\n'; return 1;
    case 'r': *cp = '\r'; return 1;
    case 'f': *cp = '\f'; return 1;
    case 'v': *cp = '\v'; return 1;
    case 'a': *cp = 7; return 1;
    case 'e': *cp = 27; return 1;
    case 's': case 'S': return add_item(ps, s, IT_SPACE, c == 'S', 0, 0) < 0 ? -1 : 2;
    case 'w': case 'W':
        return add_item(ps, s, IT_WORD, c == 'W', 0, (uint32_t)in_class) < 0 ? -1 : 2;
    case 'h': case 'H': return add_item(ps, s, IT_HEX, c == 'H', 0, 0) < 0 ? -1 : 2;
    case 'd': case 'D': return add_item(ps, s, IT_GC, c == 'D', GC(Nd), 0) < 0 ? -1 : 2;
    case 'p': case 'P': return parse_property(ps, s, c == 'P', icase) < 0 ? -1 : 2;
    case 'b':
        if (in_class) {
            *cp = 8;
            return 1;
        }
        break;
    case 'x': case 'u': {
        uint32_t v = 0;
        int digits = 0;
        if (c == 'x' && ps->p < ps->end && *ps->p == '{') {
            ps->p++;
            while (ps->p < ps->end && hex_value(*ps->p) >= 0 && digits < 8) {
                v = v * 16 + (uint32_t)hex_value(*ps->p++);
                digits++;
            }
            if (digits == 0 || ps->p == ps->end || *ps->p != '}')
                return fail(ps, "\\x{ must hold hex digits and end with }");
            ps->p++;
        } else {
            const int most = c == 'x' ? 2 : 4;
            while (ps->p < ps->end && hex_value(*ps->p) >= 0 && digits < most) {
                v = v * 16 + (uint32_t)hex_value(*ps->p++);
                digits++;
            }
            if (digits == 0 || (c == 'u' && digits != 4))
                return fail(ps, c == 'x' ? "\\x without hex digits" : "\\u needs 4 hex digits");
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || (c == 'x' && digits == 2 && v > 0x7F))
            return fail(ps, "\\%c: U+%04X is no character pytfm reads (a byte above 0x7F or a "
                        "surrogate)", c, (unsigned)v);
        *cp = v;
        return 1;
    }
    case '0': {
        uint32_t v = 0;
        for (int i = 0; i < 2 && ps->p < ps->end && *ps->p >= '0' && *ps->p <= '7'; i++)
            v = v * 8 + (uint32_t)(*ps->p++ - '0');
        *cp = v;
        return 1;
    }
    default: break;
    }
    if (c >= '1' && c <= '9') return fail(ps, "backreference \\%c", c);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return fail(ps, "\\%c (pytfm does not implement it)", c);
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    ps->p--;
    size_t len;
    *cp = char_at(ps->p, (size_t)(ps->end - ps->p), 0, &len);
    ps->p += len;
    return 1;
}

/* a literal character of the pattern (UTF-8) */
static int literal_char(parser *ps, uint32_t *cp) {
    uint32_t v;
    const int k = pytfm__utf8_at(ps->p, (size_t)(ps->end - ps->p), &v);
    if (k == 0) return fail(ps, "the pattern is not UTF-8");
    ps->p += k;
    *cp = v;
    return 0;
}

/* After '[' (and after '^' when neg): the class up to its ']', as a new set (its index) */
static int32_t parse_class(parser *ps, int icase) {
    int neg = 0;
    if (ps->p < ps->end && *ps->p == '^') {
        neg = 1;
        ps->p++;
    }
    if (++ps->depth > MAX_DEPTH) return fail(ps, "classes nested too deep");
    const int32_t s = new_set(ps, neg);
    if (s < 0) return -1;
    int first = 1;
    for (;;) {
        if (ps->p == ps->end) return fail(ps, "a [ without its ]");
        const unsigned char c = *ps->p;
        if (c == ']' && !first) {
            ps->p++;
            break;
        }
        first = 0;
        if (c == '[') {
            if (ps->p + 1 < ps->end && ps->p[1] == ':') return fail(ps, "POSIX bracket [:");
            ps->p++;
            const int32_t sub = parse_class(ps, icase);
            if (sub < 0 || add_item(ps, s, IT_SET, 0, (uint32_t)sub, 0) < 0) return -1;
            continue;
        }
        if (c == '&' && ps->p + 1 < ps->end && ps->p[1] == '&')
            return fail(ps, "class intersection &&");
        uint32_t lo = 0;
        if (c == '\\') {
            ps->p++;
            const int k = parse_escape(ps, s, &lo, icase, 1);
            if (k < 0) return -1;
            if (k == 2) continue;
        } else if (literal_char(ps, &lo) < 0) {
            return -1;
        }
        uint32_t hi = lo;
        if (ps->p + 1 < ps->end && ps->p[0] == '-' && ps->p[1] != ']') {
            ps->p++;
            if (*ps->p == '\\') {
                ps->p++;
                const int k = parse_escape(ps, s, &hi, icase, 1);
                if (k < 0) return -1;
                if (k == 2) return fail(ps, "a range ending in a class escape");
            } else if (*ps->p == '[') {
                return fail(ps, "a range ending in a class");
            } else if (literal_char(ps, &hi) < 0) {
                return -1;
            }
            if (hi < lo) return fail(ps, "the range U+%04X-U+%04X is empty", lo, hi);
        }
        if (icase && check_caseless(ps, lo, hi) < 0) return -1;
        if (add_item(ps, s, IT_RANGE, 0, lo, hi) < 0) return -1;
    }
    ps->depth--;
    if (icase && fold_set(ps, s) < 0) return -1;
    set_finish(ps->re, s);
    return s;
}

/* a node of one character: cp, folded under (?i) */
static int32_t char_node(parser *ps, uint32_t cp, int icase) {
    const int32_t s = new_set(ps, 0);
    if (s < 0) return -1;
    if (add_item(ps, s, IT_RANGE, 0, cp, cp) < 0) return -1;
    if (icase) {
        if (check_caseless(ps, cp, cp) < 0 || fold_set(ps, s) < 0) return -1;
    }
    set_finish(ps->re, s);
    const int32_t n = new_node(ps, N_SET);
    if (n < 0) return -1;
    ps->nodes[n].a = s;
    const uint32_t low = cp | 32;
    if (icase && low >= 'a' && low <= 'z') ps->nodes[n].lit = (int32_t)low;
    return n;
}

static int32_t set_node(parser *ps, int32_t s) {
    set_finish(ps->re, s);
    const int32_t n = new_node(ps, N_SET);
    if (n >= 0) ps->nodes[n].a = s;
    return n;
}

static int32_t parse_alt(parser *ps, int icase);

/* "(?" then option letters and ':' or ')': the options, *scoped 1 for ':'; -1 when the group
 * is no option group (p unmoved) or an error */
static int parse_options(parser *ps, int icase, int *scoped) {
    const unsigned char *q = ps->p + 2;
    int on = 1, result = icase;
    for (; q < ps->end; q++) {
        if (*q == '-') on = 0;
        else if (*q == 'i') result = on;
        else if (*q == 'm' || *q == 'x' || *q == 's' || *q == 'a' || *q == 'u' || *q == 'd' ||
                 *q == 'l' || *q == 'W' || *q == 'D' || *q == 'S' || *q == 'P' || *q == 'I') {
            ps->p = q;
            return fail(ps, "the option (?%c) (pytfm implements (?i) only)", *q);
        } else break;
    }
    if (q == ps->end || (*q != ':' && *q != ')')) return -2;
    *scoped = *q == ':';
    ps->p = q + 1;
    return result;
}

/* After '(': the group's node (its ')' read) */
static int32_t parse_group(parser *ps, int icase) {
    int type = N_EMPTY, neg = 0;
    if (ps->p < ps->end && *ps->p == '?') {
        const unsigned char c = ps->p + 1 < ps->end ? ps->p[1] : 0;
        if (c == ':') {
            ps->p += 2;
        } else if (c == '=' || c == '!') {
            type = N_LOOK;
            neg = c == '!';
            ps->p += 2;
        } else if (c == '>') {
            type = N_ATOMIC;
            ps->p += 2;
        } else if (c == '<' && ps->p + 2 < ps->end && (ps->p[2] == '=' || ps->p[2] == '!')) {
            return fail(ps, "lookbehind (?<%c", ps->p[2]);
        } else if (c == '<' || c == '\'') { /* a named group: a group */
            const unsigned char close = c == '<' ? '>' : '\'';
            const unsigned char *q = ps->p + 2;
            while (q < ps->end && *q != close) q++;
            if (q == ps->end) return fail(ps, "a group name without its end");
            ps->p = q + 1;
        } else if (c == '#') {
            return fail(ps, "a comment group (?#");
        } else {
            return fail(ps, "the group (?%c", c ? c : ' ');
        }
    }
    if (++ps->depth > MAX_DEPTH) return fail(ps, "groups nested too deep");
    const int32_t body = parse_alt(ps, icase);
    if (body < 0) return -1;
    if (ps->p == ps->end || *ps->p != ')') return fail(ps, "a ( without its )");
    ps->p++;
    ps->depth--;
    if (type == N_EMPTY) return body;
    const int32_t n = new_node(ps, type);
    if (n < 0) return -1;
    ps->nodes[n].child = body;
    ps->nodes[n].a = neg;
    return n;
}

/* One atom: a character, a class, a group, an anchor (*anchor set). -1 on error. */
static int32_t parse_atom(parser *ps, int icase, int *anchor) {
    *anchor = 0;
    uint32_t cp = 0;
    if (ps->literal) {
        if (literal_char(ps, &cp) < 0) return -1;
        return char_node(ps, cp, 0);
    }
    const unsigned char c = *ps->p;
    int kind = -1;
    if (c == '(') {
        ps->p++;
        return parse_group(ps, icase);
    }
    if (c == '[') {
        ps->p++;
        const int32_t s = parse_class(ps, icase);
        if (s < 0) return -1;
        const int32_t n = new_node(ps, N_SET);
        if (n >= 0) ps->nodes[n].a = s;
        return n;
    }
    if (c == '*' || c == '+' || c == '?') return fail(ps, "%c repeats nothing", c);
    if (c == '.') {
        ps->p++;
        const int32_t s = new_set(ps, 1);
        if (s < 0 || add_item(ps, s, IT_RANGE, 0, '\n', '\n') < 0) return -1;
        return set_node(ps, s);
    }
    if (c == '^') kind = A_LINE_START;
    if (c == '$') kind = A_LINE_END;
    if (c == '\\' && ps->p + 1 < ps->end) {
        switch (ps->p[1]) {
        case 'A': kind = A_TEXT_START; break;
        case 'z': kind = A_TEXT_END; break;
        case 'Z': kind = A_TEXT_END_NL; break;
        case 'b': kind = A_WORD; break;
        case 'B': kind = A_NOT_WORD; break;
        default: break;
        }
        if (kind >= 0) ps->p++;
    }
    if (kind >= 0) {
        ps->p++;
        *anchor = 1;
        const int32_t n = new_node(ps, N_ASSERT);
        if (n >= 0) ps->nodes[n].a = kind;
        return n;
    }
    if (c == '\\') {
        ps->p++;
        const int32_t s = new_set(ps, 0);
        if (s < 0) return -1;
        const int k = parse_escape(ps, s, &cp, icase, 0);
        if (k < 0) return -1;
        if (k == 2) return set_node(ps, s);
        return char_node(ps, cp, icase);
    }
    if (literal_char(ps, &cp) < 0) return -1;
    return char_node(ps, cp, icase);
}

/* A decimal number of at most 6 digits at ps->p: its value, or -1 (p unmoved) */
static long parse_count(parser *ps) {
    long v = 0;
    int digits = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9' && digits < 7) {
        v = v * 10 + (*ps->p++ - '0');
        digits++;
    }
    return digits ? v : -1;
}

/* "{n}", "{n,}", "{n,m}" or "{,m}" at ps->p: 1 and the counts, or 0 (p unmoved): a literal */
static int parse_interval(parser *ps, long *lo, long *hi) {
    const unsigned char *save = ps->p;
    ps->p++;
    long a = parse_count(ps), b;
    if (ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        b = parse_count(ps);
        if (a < 0 && b < 0) goto literal;
        if (a < 0) a = 0;
    } else {
        if (a < 0) goto literal;
        b = a;
    }
    if (ps->p == ps->end || *ps->p != '}') goto literal;
    ps->p++;
    *lo = a;
    *hi = b;
    return 1;
literal:
    ps->p = save;
    return 0;
}

/* The quantifiers after atom n (if any): the node that repeats it */
static int32_t parse_quantifier(parser *ps, int32_t n, int anchor) {
    if (ps->literal || ps->p == ps->end) return n;
    long lo, hi;
    const unsigned char c = *ps->p;
    int interval = 0;
    if (c == '*') lo = 0, hi = -1;
    else if (c == '+') lo = 1, hi = -1;
    else if (c == '?') lo = 0, hi = 1;
    else if (c == '{' && parse_interval(ps, &lo, &hi)) interval = 1;
    else return n;
    if (!interval) ps->p++;
    if (anchor) return fail(ps, "a quantifier on an anchor");
    if (lo > MAX_REPEAT || hi > MAX_REPEAT) return fail(ps, "a count above %d", MAX_REPEAT);
    if (hi >= 0 && hi < lo) return fail(ps, "{%ld,%ld} counts down", lo, hi);
    int mode = GREEDY;
    if (ps->p < ps->end && *ps->p == '?') {
        if (interval && lo == hi)
            return fail(ps, "{n}? (Oniguruma reads it as an optional {n})");
        mode = LAZY;
        ps->p++;
    } else if (ps->p < ps->end && *ps->p == '+') {
        if (interval) return fail(ps, "{n,m}+ (Oniguruma reads it as a repeated {n,m})");
        mode = POSSESSIVE;
        ps->p++;
    }
    if (ps->p < ps->end) {
        long x, y;
        const unsigned char d = *ps->p;
        if (d == '*' || d == '+' || d == '?' || (d == '{' && parse_interval(ps, &x, &y)))
            return fail(ps, "a quantifier of a quantifier");
    }
    const int32_t r = new_node(ps, N_REPEAT);
    if (r < 0) return -1;
    ps->nodes[r].child = n;
    ps->nodes[r].a = (int32_t)lo;
    ps->nodes[r].b = (int32_t)hi;
    ps->nodes[r].mode = (uint8_t)mode;
    return r;
}

/* A sequence up to '|', ')' or the end. An option group "(?i)" takes the rest of the
 * sequence's group, its alternatives included, as Oniguruma reads it. */
static int32_t parse_seq(parser *ps, int icase) {
    const int32_t cat = new_node(ps, N_CAT);
    if (cat < 0) return -1;
    int32_t last = -1, prev_lit = 0;
    while (ps->p < ps->end && (ps->literal || (*ps->p != '|' && *ps->p != ')'))) {
        int32_t n;
        int scoped = 0, opts = -2, anchor = 0;
        if (!ps->literal && ps->p + 1 < ps->end && ps->p[0] == '(' && ps->p[1] == '?')
            opts = parse_options(ps, icase, &scoped);
        if (ps->failed) return -1;
        if (opts >= 0 && !scoped) {
            n = parse_alt(ps, opts);
            if (n < 0) return -1;
        } else {
            if (opts >= 0) {
                if (++ps->depth > MAX_DEPTH) return fail(ps, "groups nested too deep");
                n = parse_alt(ps, opts);
                if (n < 0) return -1;
                if (ps->p == ps->end || *ps->p != ')') return fail(ps, "a ( without its )");
                ps->p++;
                ps->depth--;
            } else {
                n = parse_atom(ps, icase, &anchor);
                if (n < 0) return -1;
            }
            const int32_t lit = ps->nodes[n].type == N_SET ? ps->nodes[n].lit : 0;
            const int32_t q = parse_quantifier(ps, n, anchor);
            if (q < 0) return -1;
            if (q == n && lit && prev_lit) {
                static const char *const multi[] = {"ss", "st", "ff", "fi", "fl"};
                for (int i = 0; i < 5; i++)
                    if (multi[i][0] == prev_lit && multi[i][1] == lit)
                        return fail(ps, "case-insensitive \"%s\" (Oniguruma also matches one "
                                    "character for it)", multi[i]);
            }
            prev_lit = q == n ? lit : 0;
            n = q;
        }
        if (last < 0) ps->nodes[cat].child = n;
        else ps->nodes[last].next = n;
        last = n;
        if (opts >= 0 && !scoped) break;
    }
    return cat;
}

static int32_t parse_alt(parser *ps, int icase) {
    const int32_t first = parse_seq(ps, icase);
    if (first < 0 || ps->p == ps->end || *ps->p != '|' || ps->literal) return first;
    const int32_t alt = new_node(ps, N_ALT);
    if (alt < 0) return -1;
    ps->nodes[alt].child = first;
    int32_t last = first;
    while (ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        const int32_t n = parse_seq(ps, icase);
        if (n < 0) return -1;
        ps->nodes[last].next = n;
        last = n;
    }
    return alt;
}

/* ---- compiling ------------------------------------------------------------------------------ */

static int nullable(const parser *ps, int32_t n) {
    const node *x = &ps->nodes[n];
    switch (x->type) {
    case N_SET: return 0;
    case N_CAT:
        for (int32_t c = x->child; c >= 0; c = ps->nodes[c].next)
            if (!nullable(ps, c)) return 0;
        return 1;
    case N_ALT:
        for (int32_t c = x->child; c >= 0; c = ps->nodes[c].next)
            if (nullable(ps, c)) return 1;
        return 0;
    case N_REPEAT: return x->a == 0 || nullable(ps, x->child);
    case N_ATOMIC: return nullable(ps, x->child);
    default: return 1;
    }
}

static int32_t emit(parser *ps, int op, int32_t a, int32_t x, int32_t y, int mode) {
    pytfm__regex *re = ps->re;
    if (re->n_prog >= MAX_PROGRAM) return fail(ps, "the pattern is too large once its counted "
                                                   "repeats are written out");
    inst *p = grow(ps, re->prog, &re->cap_prog, re->n_prog + 1, sizeof *p);
    if (!p) return -1;
    re->prog = p;
    p[re->n_prog] = (inst){(uint8_t)op, (uint8_t)mode, a, x, y};
    return re->n_prog++;
}

static int compile(parser *ps, int32_t n);

/* x{lo,hi} of node n with mode GREEDY or LAZY (possessive is an atomic greedy repeat) */
static int compile_repeat(parser *ps, const node *x) {
    pytfm__regex *re = ps->re;
    for (int32_t i = 0; i < x->a; i++)
        if (compile(ps, x->child) < 0) return -1;
    const int lazy = x->mode == LAZY;
    if (x->b < 0) {
        const int empty = nullable(ps, x->child);
        const int32_t head = emit(ps, OP_SPLIT, 0, 0, 0, 0);
        if (head < 0) return -1;
        const int32_t slot = re->n_slots;
        if (empty && (re->n_slots++, emit(ps, OP_MARK, slot, 0, 0, 0) < 0)) return -1;
        if (compile(ps, x->child) < 0) return -1;
        if (emit(ps, empty ? OP_CHECK : OP_JMP, slot, head, 0, 0) < 0) return -1;
        re->prog[head].x = lazy ? re->n_prog : head + 1;
        re->prog[head].y = lazy ? head + 1 : re->n_prog;
        return 0;
    }
    /* the optional copies: SPLIT copy, end; each SPLIT's y chains to the one before it until
     * the end is known (an optional copy that does not match ends the repeat) */
    int32_t splits = -1;
    for (int32_t i = x->a; i < x->b; i++) {
        const int32_t split = emit(ps, OP_SPLIT, 0, 0, splits, 0);
        if (split < 0 || compile(ps, x->child) < 0) return -1;
        splits = split;
    }
    while (splits >= 0) {
        const int32_t before = re->prog[splits].y;
        re->prog[splits].x = lazy ? re->n_prog : splits + 1;
        re->prog[splits].y = lazy ? splits + 1 : re->n_prog;
        splits = before;
    }
    return 0;
}

static int compile(parser *ps, int32_t n) {
    pytfm__regex *re = ps->re;
    const node x = ps->nodes[n];
    switch (x.type) {
    case N_EMPTY: return 0;
    case N_SET: return emit(ps, OP_SET, x.a, 0, 0, 0) < 0 ? -1 : 0;
    case N_ASSERT: return emit(ps, OP_ASSERT, x.a, 0, 0, 0) < 0 ? -1 : 0;
    case N_CAT:
        for (int32_t c = x.child; c >= 0; c = ps->nodes[c].next)
            if (compile(ps, c) < 0) return -1;
        return 0;
    case N_ALT: {
        /* SPLIT next-alternative; body; JMP end (the jumps patched once end is known) */
        int32_t jumps = -1;
        for (int32_t c = x.child; c >= 0; c = ps->nodes[c].next) {
            int32_t split = -1;
            if (ps->nodes[c].next >= 0 && (split = emit(ps, OP_SPLIT, 0, 0, 0, 0)) < 0)
                return -1;
            if (split >= 0) re->prog[split].x = split + 1;
            if (compile(ps, c) < 0) return -1;
            if (ps->nodes[c].next >= 0) {
                const int32_t j = emit(ps, OP_JMP, 0, jumps, 0, 0);
                if (j < 0) return -1;
                jumps = j;
                re->prog[split].y = re->n_prog;
            }
        }
        while (jumps >= 0) {
            const int32_t next = re->prog[jumps].x;
            re->prog[jumps].x = re->n_prog;
            jumps = next;
        }
        return 0;
    }
    case N_REPEAT: {
        const node *child = &ps->nodes[x.child];
        if (child->type == N_SET) /* one character: counted in place, no loop */
            return emit(ps, OP_STAR, child->a, x.a, x.b, x.mode) < 0 ? -1 : 0;
        if (x.mode != POSSESSIVE) return compile_repeat(ps, &x);
        const int32_t at = emit(ps, OP_ATOMIC, 0, 0, 0, 0);
        node greedy = x;
        greedy.mode = GREEDY;
        if (at < 0 || compile_repeat(ps, &greedy) < 0 || emit(ps, OP_SUCCEED, 0, 0, 0, 0) < 0)
            return -1;
        re->prog[at].x = re->n_prog;
        return 0;
    }
    case N_LOOK: case N_ATOMIC: {
        const int32_t at = emit(ps, x.type == N_LOOK ? OP_LOOK : OP_ATOMIC, x.a, 0, 0, 0);
        if (at < 0 || compile(ps, x.child) < 0 || emit(ps, OP_SUCCEED, 0, 0, 0, 0) < 0)
            return -1;
        re->prog[at].x = re->n_prog;
        return 0;
    }
    default: return fail(ps, "internal error: node type %d", x.type);
    }
}

void pytfm__regex_free(pytfm__regex *re) {
    if (!re) return;
    free(re->items);
    free(re->sets);
    free(re->prog);
    free(re);
}

pytfm__regex *pytfm__regex_compile(const char *pattern, size_t n, int literal, char *err,
                                   size_t cap) {
    pytfm__regex *re = calloc(1, sizeof *re);
    if (!re) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)pattern;
    parser ps = {re, p, p, p + n, NULL, 0, 0, 0, literal, err, cap, 0};
    const int32_t root = parse_alt(&ps, 0);
    if (root >= 0 && ps.p != ps.end) fail(&ps, "a ) without its (");
    if (!ps.failed && (compile(&ps, root) < 0 || emit(&ps, OP_SUCCEED, 0, 0, 0, 0) < 0))
        ps.failed = 1;
    free(ps.nodes);
    if (ps.failed) {
        pytfm__regex_free(re);
        return NULL;
    }
    return re;
}

/* ---- matching ------------------------------------------------------------------------------- */

/* A choice point. F_BRANCH: go on at pc, pos. F_SLOT: slot pc was pos before a MARK.
 * F_GREEDY: OP_STAR pc took characters up to pos, of which those past low may be given back.
 * F_LAZY: OP_STAR pc took count characters up to pos and may take more. */
enum { F_BRANCH, F_SLOT, F_GREEDY, F_LAZY };
typedef struct pytfm__regex_frame {
    int32_t kind, pc;
    size_t pos, aux;
} frame;

static int push(pytfm__regex_split *m, int kind, int32_t pc, size_t pos, size_t aux) {
    if (m->n_stack == m->cap_stack) {
        const size_t c = 2 * m->cap_stack + 64;
        frame *f = realloc(m->stack, c * sizeof *f);
        if (!f) return 0;
        m->stack = f;
        m->cap_stack = c;
    }
    m->stack[m->n_stack++] = (frame){kind, pc, pos, aux};
    return 1;
}

static int word_before(const pytfm__regex_split *m, size_t pos) {
    if (pos == 0) return 0;
    size_t len;
    const uint32_t cp = char_at(m->text, m->size, char_before(m->text, 0, pos), &len);
    return is_word(cp, 1u << gc_of(cp), 1);
}

static int word_after(const pytfm__regex_split *m, size_t pos) {
    if (pos == m->size) return 0;
    size_t len;
    const uint32_t cp = char_at(m->text, m->size, pos, &len);
    return is_word(cp, 1u << gc_of(cp), 1);
}

static int anchor_holds(const pytfm__regex_split *m, int kind, size_t pos) {
    const unsigned char *t = m->text;
    switch (kind) {
    case A_LINE_START: return pos == 0 || t[pos - 1] == '\n';
    case A_LINE_END: return pos == m->size || t[pos] == '\n';
    case A_TEXT_START: return pos == 0;
    case A_TEXT_END: return pos == m->size;
    case A_TEXT_END_NL: return pos == m->size || (pos + 1 == m->size && t[pos] == '\n');
    case A_WORD: return word_before(m, pos) != word_after(m, pos);
    default: return word_before(m, pos) == word_after(m, pos);
    }
}

/* one character of set s at pos: its end, or 0 (pos < end is checked) */
static size_t step_set(const pytfm__regex_split *m, int32_t s, size_t pos) {
    if (pos >= m->size) return 0;
    size_t len;
    const uint32_t cp = char_at(m->text, m->size, pos, &len);
    return set_has(m->re, s, cp) ? pos + len : 0;
}

/* Run the program from pc at pos: 1 (the end of the first match in *out), 0 (no match), -1
 * (the budget ran out) or -2 (no memory). The frames it pushes are gone when it returns. */
static int run(pytfm__regex_split *m, int32_t pc, size_t pos, size_t *out) {
    const pytfm__regex *re = m->re;
    const size_t base = m->n_stack;
    for (;;) {
        int ok = 1;
        if (++m->steps > m->limit) return -1;
        const inst *in = &re->prog[pc];
        switch (in->op) {
        case OP_SET: {
            const size_t q = step_set(m, in->a, pos);
            if (q) pos = q, pc++;
            else ok = 0;
            break;
        }
        case OP_STAR: {
            size_t q = pos, low = pos, next;
            int64_t count = 0;
            const int64_t most = in->y < 0 ? INT64_MAX : in->y;
            const int64_t least = in->mode == LAZY ? in->x : most;
            while (count < least && (next = step_set(m, in->a, q)) != 0) {
                q = next;
                if (++count == in->x) low = q;
            }
            m->steps += (uint64_t)count;
            if (count < in->x) {
                ok = 0;
                break;
            }
            if (in->mode == GREEDY && q > low && !push(m, F_GREEDY, pc, q, low)) return -2;
            if (in->mode == LAZY && count < most && !push(m, F_LAZY, pc, q, (size_t)count))
                return -2;
            pos = q;
            pc++;
            break;
        }
        case OP_SPLIT:
            if (!push(m, F_BRANCH, in->y, pos, 0)) return -2;
            pc = in->x;
            break;
        case OP_JMP: pc = in->x; break;
        case OP_MARK:
            if (!push(m, F_SLOT, in->a, m->slots[in->a], 0)) return -2;
            m->slots[in->a] = pos;
            pc++;
            break;
        case OP_CHECK: pc = pos != m->slots[in->a] ? in->x : pc + 1; break;
        case OP_ASSERT:
            if (anchor_holds(m, in->a, pos)) pc++;
            else ok = 0;
            break;
        case OP_LOOK: case OP_ATOMIC: {
            size_t e;
            const int r = run(m, pc + 1, pos, &e);
            if (r < 0) return r;
            if (in->op == OP_ATOMIC && r) pos = e;
            if (r == (in->op == OP_ATOMIC || in->a == 0)) pc = in->x;
            else ok = 0;
            break;
        }
        default: /* OP_SUCCEED */
            m->n_stack = base;
            *out = pos;
            return 1;
        }
        while (!ok) { /* back to the last choice point */
            if (m->n_stack == base) return 0;
            frame *f = &m->stack[--m->n_stack];
            ++m->steps;
            if (f->kind == F_SLOT) {
                m->slots[f->pc] = f->pos;
            } else if (f->kind == F_BRANCH) {
                pc = f->pc;
                pos = f->pos;
                ok = 1;
            } else if (f->kind == F_GREEDY) {
                const size_t q = char_before(m->text, f->aux, f->pos);
                if (q > f->aux) {
                    f->pos = q;
                    m->n_stack++;
                }
                pc = f->pc + 1;
                pos = q;
                ok = 1;
            } else {
                const inst *star = &re->prog[f->pc];
                const size_t q = step_set(m, star->a, f->pos);
                if (q) {
                    f->pos = q;
                    f->aux++;
                    if (star->y < 0 || f->aux < (size_t)star->y) m->n_stack++;
                    pc = f->pc + 1;
                    pos = q;
                    ok = 1;
                }
            }
        }
    }
}

void pytfm__regex_split_start(pytfm__regex_split *s, const pytfm__regex *re,
                              const unsigned char *text, size_t size) {
    memset(s, 0, sizeof *s);
    s->re = re;
    s->text = text;
    s->size = size;
    s->limit = STEPS_BASE + (uint64_t)STEPS_PER_BYTE * size;
}

void pytfm__regex_split_free(pytfm__regex_split *s) {
    free(s->stack);
    free(s->slots);
    s->stack = NULL;
    s->slots = NULL;
    s->n_stack = s->cap_stack = 0;
}

/* The leftmost match at or after from: 1 with [*ms, *me), 0 none, or run's -1 / -2 */
static int search(pytfm__regex_split *s, size_t from, size_t *ms, size_t *me) {
    for (size_t at = from;;) {
        s->n_stack = 0;
        const int r = run(s, 0, at, me);
        if (r != 0) {
            *ms = at;
            return r;
        }
        if (at >= s->size) return 0;
        size_t len;
        char_at(s->text, s->size, at, &len);
        at += len;
    }
}

int pytfm__regex_split_next(pytfm__regex_split *s, size_t *end) {
    if (!s->slots && s->re->n_slots > 0) {
        s->slots = calloc((size_t)s->re->n_slots, sizeof *s->slots);
        if (!s->slots) return -2;
    }
    for (;;) {
        if (s->pending) {
            s->pending = 0;
            s->prev = s->match_end;
            *end = s->match_end;
            return 1;
        }
        if (s->done) {
            if (s->prev < s->size) {
                s->prev = s->size;
                *end = s->size;
                return 1;
            }
            pytfm__regex_split_free(s);
            return 0;
        }
        if (s->search > s->size) {
            s->done = 1;
            continue;
        }
        size_t ms = 0, me = 0;
        const int r = search(s, s->search, &ms, &me);
        if (r < 0) {
            pytfm__regex_split_free(s);
            return r;
        }
        if (r == 0) {
            s->done = 1;
            continue;
        }
        if (ms == me) { /* an empty match: the next search starts a character later */
            size_t len = 1;
            if (me < s->size) char_at(s->text, s->size, me, &len);
            s->search = me + len;
            if (s->have_last && s->last_match == me) continue;
        } else {
            s->search = me;
        }
        s->have_last = 1;
        s->last_match = me;
        if (ms != me) {
            s->pending = 1;
            s->match_end = me;
        }
        if (s->prev != ms) {
            *end = ms;
            s->prev = ms;
            return 1;
        }
    }
}
