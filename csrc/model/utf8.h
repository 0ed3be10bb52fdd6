/*
 * utf8.h — the one UTF-8 decoder of the tokenizer (bpe.c) and its Split regex engine
 * (regex.c), so that both read a text's characters, and its invalid bytes, alike.
 */
#ifndef PYTFM_UTF8_H
#define PYTFM_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length of the valid UTF-8 sequence at p[0..n) (n >= 1) and its code point in *cp, or 0
 * when p[0] does not begin one (overlong, surrogate, past U+10FFFF, truncated). */
static inline int pytfm__utf8_at(const unsigned char *p, size_t n, uint32_t *cp) {
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

#endif /* PYTFM_UTF8_H */
