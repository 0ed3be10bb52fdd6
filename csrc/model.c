/*
 * model.c — pytfm.nn.GPT in C: a model read from a checkpoint, its forward pass, and KV-cache
 * sessions that decode one sequence token by token.
 *
 *   x = wte[tokens] (+ pe[positions])                                   [N, C], N = B·T
 *   per block:  a = ln_1(x);  q, k, v = split(a·W_attnᵀ + b)            [B, T, H, D] each
 *               q, k = rope(q), rope(k) at the positions (pos = rope)
 *               o = causal attention(q, k, v), scale (float)(1/sqrt(D))
 *               x = x + o·W_projᵀ + b
 *               x = x + gelu(ln_2(x)·W_fcᵀ + b)·W_mlp_projᵀ + b
 *   logits = ln_f(x)·Wᵀ, W = wte (tied) or lm_head.weight               [N, vocab]
 *
 * Every op is the public kernel pytfm.nn calls for it, with the same arguments (row counts
 * included), in the same order: so the logits are the bits Python gets at the same thread count
 * and instruction-set cap. A session runs the same ops on the new tokens only, at positions
 * [length, length + n), through attention_cache_append and attention_decode, as GPT.decode.
 *
 * The model is read-only once opened (the parameters, per-layer pointers into them, the
 * sinusoidal table): any number of threads may share it. Each call allocates its own
 * activations (scratch, freed on every path); a session owns its caches.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "checks.h"

#define LN_EPS 1e-5f      /* pytfm.ops.layernorm_forward's default */
#define ROPE_BASE 10000.0 /* pytfm.ops.rope_forward's default */

/* one block's parameters: pointers into the model's one allocation */
typedef struct layer {
    const float *ln_1_w, *ln_1_b;
    const float *attn_w, *attn_b;   /* c_attn [3C, C], [3C] */
    const float *aproj_w, *aproj_b; /* attn.c_proj [C, C], [C] */
    const float *ln_2_w, *ln_2_b;
    const float *fc_w, *fc_b;       /* mlp.c_fc [4C, C], [4C] */
    const float *mproj_w, *mproj_b; /* mlp.c_proj [C, 4C], [C] */
} layer;

struct pytfm_model {
    pytfm_model_config config;
    int64_t C, H, D, V;
    float scale;  /* attention's: 1/sqrt(D) in double, then float, as pytfm.ops passes it */
    float *params; /* owned: the reader's allocation, in checkpoint.h's order */
    const float *wte, *ln_f_w, *ln_f_b, *lm_head;
    layer *layers; /* [n_layer] */
    float *pe;     /* [max_seq, C] sinusoidal positions, or NULL */
};

/* pytfm.nn.sinusoidal_positions(max_seq, C): computed in double as NumPy does, then cast to
 * float: pe[t, 2i] = sin(t·inv_i), pe[t, 2i + 1] = cos(t·inv_i), inv_i = 10000^(−2i/C). The
 * reader has checked its size (a table at most max(n_params, 2^24) floats, as
 * pytfm.checkpoint.load). */
static pytfm_status sinusoidal_table(float **pe, const char *func, int64_t max_seq, int64_t C) {
    int64_t count = 0;
    PYTFM_CHECK_COUNT(func, &count, float, max_seq, C);
    float *t = pytfm__scratch(func, count, sizeof(float));
    if (!t) return PYTFM_STATUS_OUT_OF_MEMORY;
    for (int64_t i = 0; 2 * i < C; i++) {
        const double inv = pow(10000.0, -(double)(2 * i) / (double)C);
        for (int64_t p = 0; p < max_seq; p++) {
            const double angle = (double)p * inv;
            t[p * C + 2 * i] = (float)sin(angle);
            t[p * C + 2 * i + 1] = (float)cos(angle);
        }
    }
    *pe = t;
    return PYTFM_STATUS_OK;
}

/* The model on the checked weights w (taken over: freed here on failure). */
static pytfm_status build(pytfm_model **model, pytfm__weights *w, const char *func) {
    const pytfm_model_config *c = &w->config;
    pytfm_model *m = calloc(1, sizeof *m);
    layer *layers = m ? calloc((size_t)c->n_layer, sizeof *layers) : NULL;
    if (!layers) {
        free(m);
        free(w->params);
        return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate the model", func);
    }
    m->config = *c;
    m->C = c->d_model, m->H = c->n_head, m->D = c->d_model / c->n_head, m->V = c->vocab;
    m->scale = (float)(1.0 / sqrt((double)m->D));
    m->params = w->params;
    m->layers = layers;
    const int64_t C = m->C;
    const float *p = w->params; // walked in checkpoint.h's order
    m->wte = p, p += m->V * C;
    for (int64_t i = 0; i < c->n_layer; i++) {
        layer *l = &layers[i];
        l->ln_1_w = p, p += C, l->ln_1_b = p, p += C;
        l->attn_w = p, p += 3 * C * C, l->attn_b = p, p += 3 * C;
        l->aproj_w = p, p += C * C, l->aproj_b = p, p += C;
        l->ln_2_w = p, p += C, l->ln_2_b = p, p += C;
        l->fc_w = p, p += 4 * C * C, l->fc_b = p, p += 4 * C;
        l->mproj_w = p, p += 4 * C * C, l->mproj_b = p, p += C;
    }
    m->ln_f_w = p, p += C, m->ln_f_b = p, p += C;
    m->lm_head = c->tie_embeddings ? m->wte : p;
    if (!c->tie_embeddings) p += m->V * C;
    if (p - w->params != c->n_params) { // the reader's promise, checked once
        pytfm_model_close(m);
        return pytfm__fail(PYTFM_STATUS_INTERNAL,
                           "%s: the checkpoint reader returned %lld floats of parameters where "
                           "the config implies %lld",
                           func, (long long)c->n_params, (long long)(p - w->params));
    }
    if (c->pos == PYTFM_POS_SINUSOIDAL) {
        const pytfm_status st = sinusoidal_table(&m->pe, func, c->max_seq, C);
        if (st != PYTFM_STATUS_OK) {
            pytfm_model_close(m);
            return st;
        }
    }
    *model = m;
    return PYTFM_STATUS_OK;
}

static pytfm_status check_device(const char *func, int32_t device) {
    if (device == PYTFM_DEVICE_CPU) return PYTFM_STATUS_OK;
    if (device == PYTFM_DEVICE_CUDA)
        return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                           "%s: device PYTFM_DEVICE_CUDA is not supported yet: models run on "
                           "the CPU only (PYTFM_DEVICE_CPU)",
                           func);
    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                       "%s: device must be PYTFM_DEVICE_CPU (0), got %d", func, (int)device);
}

pytfm_status pytfm_model_open(pytfm_model **model, const char *path, int32_t device) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    *model = NULL;
    PYTFM_CHECK(path != NULL, "%s: path must not be NULL", __func__);
    PYTFM_TRY(check_device(__func__, device));
    pytfm__weights w;
    PYTFM_TRY(pytfm__weights_read_file(&w, path));
    return build(model, &w, __func__);
}

pytfm_status pytfm_model_open_memory(pytfm_model **model, const void *data, size_t size,
                                     int32_t device) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    *model = NULL;
    PYTFM_CHECK(data != NULL || size == 0, "%s: data must not be NULL", __func__);
    PYTFM_TRY(check_device(__func__, device));
    pytfm__weights w;
    PYTFM_TRY(pytfm__weights_read_memory(&w, data, size, "<memory>"));
    return build(model, &w, __func__);
}

pytfm_status pytfm_model_close(pytfm_model *model) {
    if (!model) return PYTFM_STATUS_OK;
    free(model->pe);
    free(model->layers);
    free(model->params);
    free(model);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_model_get_config(const pytfm_model *model, pytfm_model_config *config) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    PYTFM_CHECK(config != NULL, "%s: config must not be NULL", __func__);
    *config = model->config;
    return PYTFM_STATUS_OK;
}
