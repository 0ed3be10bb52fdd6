/*
 * checkpoint.h — the checkpoint reader's interface to the model (internal, not exported).
 *
 * csrc/model/safetensors.c (with csrc/model/json.c) reads a checkpoint written by pytfm.checkpoint.save and
 * checks every byte of it before trusting any (the rules are pytfm_model_open's, in pytfm.h);
 * csrc/model/model.c builds the model on what it returns.
 *
 * The parameters come back in one allocation, in the order of pytfm.nn.param_shapes(cfg), each
 * a contiguous float32 array of its shape, one after the other with no gaps (C = d_model,
 * V = vocab; a Linear's weight is [out, in]):
 *
 *   transformer.wte.weight                 [V, C]
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

typedef struct pytfm__weights {
    pytfm_model_config config; /* every field filled, n_params and step included */
    float *params;             /* config.n_params floats, 64-byte aligned; free with free() */
} pytfm__weights;

/* Read and check the size bytes at data; source names them in messages ("<memory>" or a
 * path). On success *w holds the config and a new allocation of the parameters; on failure
 * w->params is NULL, a status says why and pytfm_last_error() explains, naming source. */
pytfm_status pytfm__weights_read_memory(pytfm__weights *w, const void *data, size_t size,
                                        const char *source);

/* The same from the file at path: the header is read and checked first, then the parameters'
 * bytes straight into their allocation (the file is never held whole in memory twice). A file
 * shorter than its header says, or one that cannot be opened or read, is an error naming the
 * path. */
pytfm_status pytfm__weights_read_file(pytfm__weights *w, const char *path);

#endif /* PYTFM_CHECKPOINT_H */
