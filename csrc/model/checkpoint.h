/*
 * checkpoint.h — what the model gets from layer 2 of the checkpoint reader (internal, not
 * exported): csrc/model/checkpoint.c checks a pytfm checkpoint (pytfm_checkpoint_check) and
 * reads its parameters; csrc/model/model.c builds the model on them.
 *
 * The parameters come back in one allocation, in the layout pytfm_model_param states
 * (pytfm_model.h), each a contiguous float32 array of its shape, one after the other with no
 * gaps.
 *
 * config.n_params is the number of floats of that array.
 */
#ifndef PYTFM_CHECKPOINT_H
#define PYTFM_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "pytfm.h"

/* The layout above is pytfm_model_param's (config.c), the one walk of it: every reader and the
 * model step through it with pytfm__param_next. A block has PYTFM__LAYER_PARTS parameters. */
enum { PYTFM__LAYER_PARTS = 12 };

/* A Llama-family block's parameters, each of the layout's parts (pytfm_model_param) one of
 * these, in this order; the biases only with qkv_bias, the norms only with qk_norm. q, k and v
 * (weights, then biases) are adjacent: one [(H + 2·Hkv)·head_dim, C] matrix, as pytfm.nn reads
 * them. */
enum pytfm__llama_part {
    PYTFM__LLAMA_LN_1, PYTFM__LLAMA_Q_W, PYTFM__LLAMA_K_W, PYTFM__LLAMA_V_W,
    PYTFM__LLAMA_Q_B, PYTFM__LLAMA_K_B, PYTFM__LLAMA_V_B, PYTFM__LLAMA_O_W,
    PYTFM__LLAMA_Q_NORM, PYTFM__LLAMA_K_NORM, PYTFM__LLAMA_LN_2, PYTFM__LLAMA_GATE,
    PYTFM__LLAMA_UP, PYTFM__LLAMA_DOWN, PYTFM__LLAMA_PARTS
};

/* Which of those the layout's part number part of a block of c is, or -1 past the last. */
int pytfm__llama_part(const pytfm_model_config *c, int32_t part);

/* The parameter after *p in the layout of c (start with p->layer = −1, p->part = −1): fills *p
 * and returns 1, or 0 after the last. */
int pytfm__param_next(const pytfm_model_config *c, pytfm_param_info *p);

/* p's shape multiplied out into shape[0..2) (shape[1] 1 for a vector): 1, or 0 where a size
 * passes int64. */
int pytfm__param_shape(const pytfm_param_info *p, int64_t shape[2]);

typedef struct pytfm__weights {
    pytfm_model_config config; /* every field filled, n_params and step included */
    float *params;             /* config.n_params floats, 64-byte aligned; free with free() */
    /* A BF16 file's matrices (pytfm__llama_weights: a Llama-family folder whose 2-D parameters
     * are all bfloat16), or NULL: n_w16 values, every 2-D parameter in the layout's order, each
     * as the top halves of its float32 values; params then holds the other parameters only
     * (n_params - n_w16 floats, in the layout's order). Free with free(). */
    uint16_t *w16;
    int64_t n_w16;
} pytfm__weights;

/* pytfm_checkpoint_check on st, then its parameters read into a new allocation, in host byte
 * order. On failure w->params is NULL, and a status and pytfm_last_error() say why, naming st's
 * source. */
pytfm_status pytfm__checkpoint_weights(const pytfm_safetensors *st, pytfm__weights *w);

/* pytfm_model_config_check, its message "<source>: <what><the rule>" (source NULL: no
 * "<source>: "), for the readers that hold a file's config to the rules. */
pytfm_status pytfm__model_config_check_at(const pytfm_model_config *c, const char *source,
                                          const char *what);

/* p[0..count) read from a file (little-endian) in host byte order: a big-endian host swaps
 * each float's bytes. */
void pytfm__to_host_order(float *p, int64_t count);

#endif /* PYTFM_CHECKPOINT_H */
