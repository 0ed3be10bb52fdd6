/*
 * regex.h — the regex engine of tokenizer.json's Split pre-tokenizer (csrc/model/regex.c).
 *
 * It reads the syntax of Oniguruma (the engine of Hugging Face tokenizers) and matches as it
 * does: leftmost-first backtracking, over UTF-8, with Oniguruma's Unicode classes. The
 * constructs Split patterns use are implemented; any other is refused when the pattern is
 * compiled, by name, so that no pattern is ever run with a meaning tokenizers would not give
 * it. docs/tokenizer.md lists both.
 */
#ifndef PYTFM_REGEX_H
#define PYTFM_REGEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct pytfm__regex pytfm__regex;

/* Compile pattern[0..n) (UTF-8). literal: the pattern is the text to find (a Split's
 * "String"), not a regex. NULL when it cannot be run: err[0..cap) says why (the construct
 * pytfm does not implement, or the pattern's error, with its byte offset; or out of memory). */
pytfm__regex *pytfm__regex_compile(const char *pattern, size_t n, int literal, char *err,
                                   size_t cap);
void pytfm__regex_free(pytfm__regex *re);

/* Splitting a text as tokenizers' Split with behavior "Isolated" does: each match (found left
 * to right, as Oniguruma's find_iter finds them) and each gap between matches is a piece;
 * empty pieces are dropped. ^ and \A are the text's start, $ and \z its end. */
typedef struct pytfm__regex_split {
    const pytfm__regex *re;
    const unsigned char *text;
    size_t size;
    size_t search;       /* where the next search starts */
    size_t prev;         /* where the next piece starts */
    size_t last_match;   /* the end of the last match (have_last) */
    size_t match_end;    /* pending: a match [prev, match_end) comes next */
    int have_last, pending, done;
    uint64_t steps, limit; /* the backtracking budget: steps taken, steps allowed */
    struct pytfm__regex_frame *stack;
    size_t n_stack, cap_stack;
    size_t *slots;
} pytfm__regex_split;

/* Start splitting text[0..size) (no allocation: pytfm__regex_split_next allocates). */
void pytfm__regex_split_start(pytfm__regex_split *s, const pytfm__regex *re,
                              const unsigned char *text, size_t size);

/* The end (an offset in the text) of the next piece in *end: 1; 0 when the text is done; -1
 * when matching took more steps than the budget (a pattern that backtracks exponentially, or
 * quadratically on a long text); -2 when memory ran out. On 0, -1 and -2 the memory is freed. */
int pytfm__regex_split_next(pytfm__regex_split *s, size_t *end);

/* Free what a split holds (when it is left before pytfm__regex_split_next returned 0). */
void pytfm__regex_split_free(pytfm__regex_split *s);

#endif /* PYTFM_REGEX_H */
