/*
 * pytfm_tokenizer.h — BPE tokenizers in C: GPT-2's vocab.json + merges.txt, and Hugging Face
 * tokenizer.json files of a byte-level BPE (GPT-2, Llama 3, Qwen) or of a BPE with byte
 * fallback (SentencePiece's: Llama 2, Mistral, Gemma). Open a vocabulary (or a model's folder),
 * encode bytes to token ids, decode ids to bytes, the special token <|endoftext|>.
 * pytfm.tokenizer.Tokenizer is this tokenizer, from Python.
 *
 * What encode does (token for token what Hugging Face tokenizers gives; docs/tokenizer.md):
 * 1. The added tokens (tokenizer.json's added_tokens; GPT-2's vocab.json: <|endoftext|>) are
 *    found in the text as tokenizers' AddedVocabulary finds them: leftmost-longest, those with
 *    normalized false first, then the others in the pieces left, normalized; lstrip and rstrip
 *    take the white space beside a match into it, single_word keeps a match only between
 *    non-word characters. A special token is matched only with PYTFM_TOKENIZER_SPECIAL
 *    (without it, a match of one is dropped, as tokenizers' encode_special_tokens does). Each
 *    piece between is tokenized alone.
 * 2. A piece is cut into words. Byte-level files: by GPT-2's pre-tokenizer pattern
 *      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *    (hand-coded: the leftmost alternative that matches wins, \s+(?!\S) leaves the last white
 *    space of a run before a non-space to the next word), or Llama 3's or Qwen 2's Split regex.
 *    \p{L} is a letter (categories L*), \p{N} a number (N*), \s Unicode's White_Space, from
 *    tables of the Unicode version pytfm_tokenizer_unicode_version() names. Files with byte
 *    fallback: the piece is one word (pre_tokenizer null), Metaspace's words (spaces made the
 *    replacement, which is put first as prepend_scheme says, each word from one), or a Split
 *    at a string's occurrences (behavior as tokenizers has it).
 *    Bytes are read as UTF-8; a byte that does not begin a valid UTF-8 sequence (overlong forms,
 *    surrogates, code points past U+10FFFF and truncated sequences are not valid) is one "other"
 *    character of its own, as Python's surrogateescape reads it. So every byte string has one
 *    tokenization, and (byte-level) decode of encode gives the bytes back.
 * 3. Each word's symbols (byte-level: its bytes; byte fallback: its characters, each the token
 *    of its text or else its bytes' <0xNN> tokens) are merged by rank (the line of the merge in
 *    merges.txt), lowest first, each occurrence left to right, until no adjacent pair has a
 *    merge.
 *
 * Files are checked before anything is built: strict UTF-8 JSON (pytfm_json_check), at most
 * PYTFM_TOKENIZER_MAX_FILE bytes, a vocabulary {token: id} of 256 to PYTFM_TOKENIZER_MAX_TOKENS
 * tokens whose ids are 0 .. n-1 each once and that holds the 256 byte tokens (byte fallback:
 * <0x00> .. <0xFF>); every merge's parts are tokens, every result a token, no pair twice, and
 * (byte-level, unless the model takes whole words first, ignore_merges) every token a byte, a
 * merge's result or an added token. A failure is INVALID_ARGUMENT (or OUT_OF_MEMORY) with
 * pytfm_last_error() naming the file and what is wrong; nothing is left allocated and *out is
 * NULL. Messages name tokens as the files write them ('Ġth'), merges by
 * rank (from 0) and lines of merges.txt as the file's lines, from 1 ("#version" is line 1).
 * errno after a failed open: a failed system call's error number (open, stat, read: "cannot
 * open (No such file or directory)" leaves ENOENT), ENOENT for a folder without a tokenizer,
 * 0 for any other failure (the files' content is at fault).
 *
 * Threads: a tokenizer is read-only once open, except for a cache of words already merged,
 * which one encode at a time uses (another encode running at the same time merges without it),
 * so any number of threads may encode and decode with one tokenizer at once.
 *
 * Everything between this header's PYTFM_CDEF markers is read verbatim by the cffi builder
 * (pytfm/_build_ffi.py), so it must stay plain declarations: no macros but PYTFM_API.
 */
#ifndef PYTFM_TOKENIZER_H
#define PYTFM_TOKENIZER_H

#include "pytfm_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PYTFM_CDEF_BEGIN */

enum {
    PYTFM_TOKENIZER_MAX_FILE = 268435456,  /* bytes of a tokenizer file, at most (256 MiB) */
    PYTFM_TOKENIZER_MAX_TOKENS = 16777216  /* tokens of a vocabulary, at most */
};

/* pytfm_tokenizer_encode's flags */
enum {
    PYTFM_TOKENIZER_SPECIAL = 1, /* special added tokens in the text are matched (else text) */
    PYTFM_TOKENIZER_TEMPLATE = 2 /* the post-processor's template ids around the text */
};

typedef struct pytfm_tokenizer pytfm_tokenizer;

/* Open GPT-2's vocab.json (encoder.json) and merges.txt (vocab.bpe: an optional "#version"
 * first line, then "a b" per line, a final newline allowed). *out: the tokenizer, to be freed
 * with pytfm_tokenizer_close; NULL on failure. */
PYTFM_API pytfm_status pytfm_tokenizer_open(const char *vocab_path, const char *merges_path,
                                            pytfm_tokenizer **out);

/* The same from texts in memory: vocab[0..vocab_size), merges[0..merges_size) (not kept). */
PYTFM_API pytfm_status pytfm_tokenizer_open_memory(const char *vocab, int64_t vocab_size,
                                                   const char *merges, int64_t merges_size,
                                                   pytfm_tokenizer **out);

/* Open Hugging Face's tokenizer.json of a BPE (model.type "BPE", no dropout, prefix or
 * suffix; model.merges as "a b" strings or [a, b] pairs; ignore_merges true or false),
 * truncation and padding null; any number of added_tokens (each id must be the one tokenizers
 * gives it: the vocabulary's, or the next after the vocabulary in the file's order);
 * post_processor null, ByteLevel, TemplateProcessing (its "single" template: special tokens
 * around $A, their ids from the file; "pair" unused) or a Sequence of those. Byte-level (no
 * unk_token, fuse_unk or byte_fallback): normalizer null or NFC, pre_tokenizer ByteLevel
 * (add_prefix_space false, use_regex true) or a Sequence of Llama 3's or Qwen 2's Split and a
 * ByteLevel, decoder ByteLevel or null. With byte_fallback true (all 256 <0xNN> tokens in the
 * vocabulary; unk_token, fuse_unk allowed, never used): normalizer null, NFC, Prepend, Replace
 * of a String or a Sequence of them; pre_tokenizer null, Metaspace or a Split of a String;
 * decoder null, Replace of a String, ByteFallback, Fuse, Strip, Metaspace or a Sequence of
 * them. Anything else is refused, naming the field (docs/tokenizer.md). */
PYTFM_API pytfm_status pytfm_tokenizer_open_json(const char *path, pytfm_tokenizer **out);

/* The same from the text[0..size) of a tokenizer.json in memory (not kept). */
PYTFM_API pytfm_status pytfm_tokenizer_open_json_memory(const char *text, int64_t size,
                                                        pytfm_tokenizer **out);

/* Open the tokenizer of a model's folder: vocab.json and merges.txt when both are there (what
 * transformers' GPT-2 tokenizers write), else tokenizer.json. Without either it is refused:
 * "the folder F has no tokenizer (vocab.json and merges.txt, or tokenizer.json)", or, with one
 * of vocab.json and merges.txt alone, "the folder F has vocab.json but no merges.txt (and no
 * tokenizer.json)" (errno ENOENT). A file that is there but cannot be read is its open's
 * failure, not a reason to try the other files. */
PYTFM_API pytfm_status pytfm_tokenizer_open_folder(const char *folder, pytfm_tokenizer **out);

/* Free a tokenizer (NULL is ignored). */
PYTFM_API void pytfm_tokenizer_close(pytfm_tokenizer *tok);

/* The number of tokens of the vocabulary (ids are 0 .. size-1); 0 for NULL. */
PYTFM_API int64_t pytfm_tokenizer_vocab_size(const pytfm_tokenizer *tok);

/* The id of the added token <|endoftext|> (GPT-2's vocab.json always has one: the next id when
 * its vocabulary lacks it, as transformers' GPT2TokenizerFast adds it), or -1 (or tok NULL). */
PYTFM_API int32_t pytfm_tokenizer_eot(const pytfm_tokenizer *tok);

/* 1 when the tokens are text (a tokenizer.json with model.byte_fallback: SentencePiece's
 * U+2581 for a space, <0xNN> tokens for the bytes of a character that is no token): then
 * pytfm_tokenizer_token gives a token's name ("\u2581the", "<0x0A>") and decode runs the file's
 * decoder. 0 when they are bytes (byte-level BPE), or tok is NULL. */
PYTFM_API int32_t pytfm_tokenizer_text_tokens(const pytfm_tokenizer *tok);

/* The number of merges (their ranks are 0 .. count-1); 0 for NULL. */
PYTFM_API int64_t pytfm_tokenizer_merge_count(const pytfm_tokenizer *tok);

/* The merges, by rank: pairs[2r] and pairs[2r+1] are the ids of merge r's two parts (it makes
 * the token of their bytes joined); pairs holds 2n ids, n = pytfm_tokenizer_merge_count(tok). */
PYTFM_API pytfm_status pytfm_tokenizer_merges(const pytfm_tokenizer *tok, int32_t *pairs,
                                              int64_t n);

/* The Unicode version of the pre-tokenizer's character classes, e.g. "14.0.0". */
PYTFM_API const char *pytfm_tokenizer_unicode_version(void);

/* Encode text[0..size) (any bytes; text may be NULL when size is 0). flags:
 * PYTFM_TOKENIZER_SPECIAL, the special added tokens in the text are those tokens (else text);
 * PYTFM_TOKENIZER_TEMPLATE, the post-processor's template ids go around the text (what
 * transformers' encode adds by default; GPT-2 has none). *count: the number of ids, always set
 * on OK and when the ids do not fit. ids: capacity int32 ids written (ids may be NULL when
 * capacity is 0); without a normalizer or a Metaspace pre-tokenizer a text never has more ids
 * than bytes plus the template's (the count of the empty text), so that capacity always fits
 * (NFC may make a text up to 3 times longer, Prepend, Replace and Metaspace longer still: ask
 * the count first there). capacity 0 with ids NULL asks the count only and
 * returns OK; a capacity below the count otherwise is INVALID_ARGUMENT ("needs N ids"), ids
 * holding the first capacity of them. A single_word token next to a character whose word
 * class the library cannot tell (docs/tokenizer.md) is INVALID_ARGUMENT; so is a normalizer
 * whose steps would make more than 8 times a text's bytes and 4 KiB more (chained Replaces
 * multiply its size: stopped before they allocate it). */
PYTFM_API pytfm_status pytfm_tokenizer_encode(const pytfm_tokenizer *tok, const char *text,
                                              int64_t size, int32_t flags, int32_t *ids,
                                              int64_t capacity, int64_t *count);

/* Decode ids[0..n) into the bytes they stand for (<|endoftext|> as its 13 characters; with
 * byte fallback, the UTF-8 of what the file's decoder makes of the tokens' names, as tokenizers'
 * decode with skip_special_tokens false gives it: a run of <0xNN> tokens that is not UTF-8 is
 * one U+FFFD a byte; no decoder: the names joined by spaces): *size,
 * their number, always set on OK and when they do not fit; out: capacity bytes written (NULL
 * allowed when capacity is 0; not NUL-terminated). capacity 0 with out NULL asks the size only
 * and returns OK; a capacity below it otherwise is INVALID_ARGUMENT, out holding the first
 * capacity bytes. An id outside 0 .. vocab_size-1 is OUT_OF_RANGE, naming its index; a
 * decoder whose Replace steps would make more than 8 times the names' bytes and 4 KiB more is
 * INVALID_ARGUMENT. */
PYTFM_API pytfm_status pytfm_tokenizer_decode(const pytfm_tokenizer *tok, const int32_t *ids,
                                              int64_t n, char *out, int64_t capacity,
                                              int64_t *size);

/* The bytes of token id: *bytes points into the tokenizer (valid until it is closed), *size
 * their number. An id outside the vocabulary is OUT_OF_RANGE. */
PYTFM_API pytfm_status pytfm_tokenizer_token(const pytfm_tokenizer *tok, int32_t id,
                                             const char **bytes, int64_t *size);

/* GPT-2's pre-tokenizer alone (step 2 above; <|endoftext|> is text here): the words of
 * text[0..size), each given by the offset of its end, ends[0..*count) in order (the last is
 * size). The size contract is encode's: a text never has more words than bytes. */
PYTFM_API pytfm_status pytfm_tokenizer_split(const char *text, int64_t size, int64_t *ends,
                                             int64_t capacity, int64_t *count);

/* PYTFM_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PYTFM_TOKENIZER_H */
