/*
 * checkpoint.h — what the model gets from layer 2 of the checkpoint reader (internal, not
 * exported): csrc/model/checkpoint.c checks a pytfm checkpoint (pytfm_checkpoint_check) and
 * reads its parameters; csrc/model/model.c builds the model on them.
 *
 * The parameters come back in one allocation, in the order of pytfm.nn.param_shapes(cfg), each
 * a contiguous float32 array of its shape, one after the other with no gaps (C = d_model,
 * V = vocab; a Linear's weight is [out, in]):
 *
 *   transformer.wte.weight                 [V, C]
 *   transformer.wpe.weight                 [max_seq, C]   only when pos is learned
 *   for each layer i = 0 .. n_layer − 1:
 *     transformer.h.i.ln_1.weight, .bias   [C], [C]
 *     transformer.h.i.attn.c_attn.weight   [3C, C]   then .bias [3C]
 *     transformer.h.i.attn.c_proj.weight   [C, C]    then .bias [C]
 *     transformer.h.i.ln_2.weight, .bias   [C], [C]
 *     transformer.h.i.mlp.c_fc.weight      [4C, C]   then .bias [4C]
 *     transformer.h.i.mlp.c_proj.weight    [C, 4C]   then .bias [C]
 *   transformer.ln_f.weight, .bias         [C], [C]
 *   lm_head.weight                         [V, C]    only when tie_embeddings is 0
 *
 * config.n_params is the number of floats of that array.
 */
#ifndef PYTFM_CHECKPOINT_H
#define PYTFM_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "pytfm.h"

/* A layer's parameters, in the order above: each name after "transformer.h.i.", and its shape
 * in units of C, [rows·C] (cols 0) or [rows·C, cols·C] (a Linear's [out, in]). The pytfm
 * checkpoint's reader and the GPT-2 folder's (csrc/model/gpt2.c: Conv1D stores the weights
 * transposed, [cols·C, rows·C]) both walk this table. */
enum { PYTFM__LAYER_PARTS = 12 };
extern const char *const pytfm__layer_parts[PYTFM__LAYER_PARTS];
extern const int pytfm__layer_rows[PYTFM__LAYER_PARTS], pytfm__layer_cols[PYTFM__LAYER_PARTS];

typedef struct pytfm__weights {
    pytfm_model_config config; /* every field filled, n_params and step included */
    float *params;             /* config.n_params floats, 64-byte aligned; free with free() */
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
