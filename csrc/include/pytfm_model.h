/*
 * pytfm_model.h — a GPT in C: a model read from a checkpoint, its forward pass, decoding
 * sessions with a KV cache, and sampling.
 *
 * Everything between this header's PYTFM_CDEF markers is read verbatim by the cffi builder
 * (pytfm/_build_ffi.py), so it must stay plain declarations: no macros but PYTFM_API.
 */
#ifndef PYTFM_MODEL_H
#define PYTFM_MODEL_H

#include "pytfm_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PYTFM_CDEF_BEGIN */

/* ---- Model: a GPT from a pytfm checkpoint, in C ----------------------------------------- */

typedef struct pytfm_model pytfm_model;
typedef struct pytfm_session pytfm_session;

/* Where a model runs. Only the CPU for now; PYTFM_DEVICE_CUDA is NOT_SUPPORTED (reserved). */
typedef enum pytfm_device {
    PYTFM_DEVICE_CPU = 0,
    PYTFM_DEVICE_CUDA = 1
} pytfm_device;

/* pytfm.nn.GPTConfig.pos */
typedef enum pytfm_pos {
    PYTFM_POS_ROPE = 0,       /* rotary embeddings on q and k */
    PYTFM_POS_SINUSOIDAL = 1, /* a fixed sin/cos table added to the token embeddings */
    PYTFM_POS_NONE = 2        /* no positions */
} pytfm_pos;

/* A model's shape, from the checkpoint's __metadata__ (GPTConfig and the training step). */
typedef struct pytfm_model_config {
    int64_t vocab;
    int64_t d_model;
    int64_t n_layer;
    int64_t n_head;
    int64_t max_seq;        /* the longest sequence: forward's T and a session's length */
    int32_t pos;            /* a pytfm_pos */
    int32_t tie_embeddings; /* 1: the LM head is the token embedding table */
    int64_t n_params;       /* floats of parameters (a tied table counted once) */
    int64_t step;           /* the training step the checkpoint was saved at */
} pytfm_model_config;

/* Open the checkpoint at path and read its parameters into memory (the file is closed when
 * this returns). Every byte is checked before any is trusted: the safetensors header (length,
 * strict UTF-8 JSON, dtypes, shapes, offsets that tile the data exactly), the pytfm
 * __metadata__ (format, a GPTConfig that pytfm.nn accepts, step), and that the tensors are
 * exactly the parameters that config implies, by name, dtype and shape (AdamW's moments,
 * optim.m.<name> / optim.v.<name>, may be there too and are skipped). A file Python's
 * pytfm.checkpoint.load rejects is rejected here too: PYTFM_STATUS_INVALID_ARGUMENT with a
 * message naming the file and what is wrong; PYTFM_STATUS_NOT_SUPPORTED for a device other
 * than PYTFM_DEVICE_CPU; PYTFM_STATUS_OUT_OF_MEMORY. On failure *model is set to NULL.
 *   model   receives the handle (pytfm_model_close frees it)
 *   device  a pytfm_device */
PYTFM_API pytfm_status pytfm_model_open(pytfm_model **model, const char *path, int32_t device);

/* As pytfm_model_open, from size bytes of a checkpoint in memory (copied: data may be freed
 * once this returns). */
PYTFM_API pytfm_status pytfm_model_open_memory(pytfm_model **model, const void *data,
                                               size_t size, int32_t device);

/* Free a model (NULL: nothing to do). Its sessions must be closed first. */
PYTFM_API pytfm_status pytfm_model_close(pytfm_model *model);

/* Fill *config with the model's shape. */
PYTFM_API pytfm_status pytfm_model_get_config(const pytfm_model *model,
                                              pytfm_model_config *config);

/* The logits of every position of B sequences of T tokens, as pytfm.nn.GPT.forward(tokens).
 *   logits [B, T, vocab] written;  tokens [B, T], each in [0, vocab) (else
 *   PYTFM_STATUS_OUT_OF_RANGE);  1 <= T <= max_seq;  B >= 0 (0: nothing to do)
 * Scratch: the activations of one layer for B·T tokens, B·T·(12·d_model + n_head + 2) + 2·T
 * floats, plus what the kernels take (pytfm_linear_forward's, pytfm_attention_forward's). */
PYTFM_API pytfm_status pytfm_model_forward(const pytfm_model *model, float *logits,
                                           const int64_t *tokens, int64_t B, int64_t T);

/* A decoding session of one sequence: KV caches for max_len positions (1 <= max_len <=
 * max_seq; 0: max_seq), allocated here, 2·n_layer·max_len·d_model floats. On failure
 * *session is set to NULL. */
PYTFM_API pytfm_status pytfm_session_open(pytfm_session **session, const pytfm_model *model,
                                          int64_t max_len);

/* Free a session (NULL: nothing to do). */
PYTFM_API pytfm_status pytfm_session_close(pytfm_session *session);

/* Append n >= 1 tokens to the sequence (a prompt at once, or one token at a time) and write
 * the logits [vocab] that follow the last of them, as pytfm.nn.GPT.decode; logits may be NULL
 * to only fill the caches. Each token costs O(length · d_model) beyond its projections: no
 * recomputation of the earlier ones. length + n > max_len is PYTFM_STATUS_INVALID_ARGUMENT and
 * changes nothing (as does any failure: the length stays, and with it what the next feed sees).
 *   logits [vocab] written;  tokens [n], each in [0, vocab) (else PYTFM_STATUS_OUT_OF_RANGE)
 * Scratch: as pytfm_model_forward with B = 1, T = n, plus n·vocab floats when n > 1 and logits
 * is not NULL (the LM head runs on every new token, as in Python, so that the last one's
 * logits are the bits GPT.decode gives). */
PYTFM_API pytfm_status pytfm_session_feed(pytfm_session *session, float *logits,
                                          const int64_t *tokens, int64_t n);

/* The number of tokens fed since the session opened or was last reset. */
PYTFM_API pytfm_status pytfm_session_length(const pytfm_session *session, int64_t *length);

/* Forget every token (the caches are kept for reuse). */
PYTFM_API pytfm_status pytfm_session_reset(pytfm_session *session);

/* The random number generator of sampling: xoshiro256** (Blackman and Vigna, 2018), its
 * state seeded by SplitMix64 from a 64-bit seed: state[i] = the i-th SplitMix64 output,
 * i = 0..3, starting from x = seed (x += 0x9e3779b97f4a7c15; z = x;
 * z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
 * output z ^ (z >> 31)). The stream is part of the API: the same seed gives the same numbers
 * on every machine and in every version with this ABI number. The state may be copied. */
typedef struct pytfm_rng {
    uint64_t state[4];
} pytfm_rng;

/* Seed *rng as above. */
PYTFM_API pytfm_status pytfm_rng_seed(pytfm_rng *rng, uint64_t seed);

/* The next 64-bit number of the stream. */
PYTFM_API pytfm_status pytfm_rng_next(pytfm_rng *rng, uint64_t *value);

/* Draw the next token from logits [vocab], as pytfm.generate.sample_next:
 *   temperature == 0: the index of the largest logit (the first of equals; no random number
 *   is drawn); temperature > 0 (finite; a double, as Python's float, so that 0.8 is Python's
 *   0.8 and not the float nearest it): softmax((logits − max) / temperature) in double,
 *   restricted to the logits >= the top_k-th largest (top_k <= 0 or >= vocab: all), then the
 *   first index whose cumulative probability reaches u = (next >> 11) · 2^-53, one number of
 *   rng's stream per draw (vocab − 1 if rounding leaves u above the total).
 *   logits must be finite (else PYTFM_STATUS_INVALID_ARGUMENT). rng may be NULL when
 *   temperature == 0.
 * The sum of the probabilities is taken in NumPy's pairwise order, so that given the same u the
 * token is Python's (but for a last-bit difference of exp, which moves a token only when u lies
 * within about 1e-16 of a cumulative probability). No scratch. */
PYTFM_API pytfm_status pytfm_sample(int64_t *token, const float *logits, int64_t vocab,
                                    double temperature, int64_t top_k, pytfm_rng *rng);

/* PYTFM_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PYTFM_MODEL_H */
