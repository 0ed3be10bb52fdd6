/*
 * config.c — the rules of a model's shape, the one home of what pytfm.nn.GPTConfig, the
 * checkpoint reader (checkpoint.c) and the GPT-2 folder reader (gpt2.c) require of a config.
 * Types (an int, a str) are the caller's: Python's for GPTConfig, JSON's for the readers;
 * what the values must be is here. And the layout of the parameters a config implies
 * (pytfm_model_param), which the readers, the model and pytfm.nn.param_shapes walk.
 */
#include <stdarg.h>
#include <stdio.h>

#include "checkpoint.h"
#include "core/internal.h"
#include "safetensors.h"

#define BAD(source, ...) pytfm__fail_at(source, PYTFM_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

pytfm_status pytfm__model_config_check_at(const pytfm_model_config *c, const char *source,
                                          const char *what) {
    const char *const names[] = {"vocab", "d_model", "n_layer", "n_head", "max_seq"};
    const int64_t sizes[] = {c->vocab, c->d_model, c->n_layer, c->n_head, c->max_seq};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        if (sizes[k] < 1)
            return BAD(source, "%sGPTConfig.%s must be a positive int (below 2**63), got %lld",
                       what, names[k], (long long)sizes[k]);
    if (c->pos < PYTFM_POS_ROPE || c->pos > PYTFM_POS_LEARNED)
        return BAD(source,
                   "%sGPTConfig.pos must be one of ('rope', 'sinusoidal', 'none', 'learned'), "
                   "got %d",
                   what, (int)c->pos);
    if (c->tie_embeddings != 0 && c->tie_embeddings != 1)
        return BAD(source, "%sGPTConfig.tie_embeddings must be 0 or 1, got %d", what,
                   (int)c->tie_embeddings);
    const int64_t C = c->d_model, H = c->n_head;
    if (C % H)
        return BAD(source, "%sd_model (%lld) must be a multiple of n_head (%lld)", what,
                   (long long)C, (long long)H);
    if (c->pos == PYTFM_POS_ROPE && (C / H) % 2)
        return BAD(source, "%srope needs an even head dim, got %lld", what, (long long)(C / H));
    if (c->pos == PYTFM_POS_SINUSOIDAL && C % 2)
        return BAD(source, "%ssinusoidal positions need an even d_model, got %lld", what,
                   (long long)C);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_model_config_check(const pytfm_model_config *config) {
    PYTFM_CHECK(config != NULL, "%s: config must not be NULL", __func__);
    return pytfm__model_config_check_at(config, NULL, "");
}

/* A block's parameters, in layout order: each name after "transformer.h.i.", and its shape in
 * units of C, [rows·C] (cols 0) or [rows·C, cols·C] */
static const struct {
    const char *name;
    int rows, cols;
} block_parts[PYTFM__LAYER_PARTS] = {
    {"ln_1.weight", 1, 0},        {"ln_1.bias", 1, 0},       {"attn.c_attn.weight", 3, 1},
    {"attn.c_attn.bias", 3, 0},   {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
    {"ln_2.weight", 1, 0},        {"ln_2.bias", 1, 0},       {"mlp.c_fc.weight", 4, 1},
    {"mlp.c_fc.bias", 4, 0},      {"mlp.c_proj.weight", 1, 4}, {"mlp.c_proj.bias", 1, 0}};

static int32_t param_is(pytfm_param_info *p, int ndim, int64_t base0, int factor0,
                        int64_t base1, int factor1, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static int32_t param_is(pytfm_param_info *p, int ndim, int64_t base0, int factor0,
                        int64_t base1, int factor1, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = ndim;
    p->base[0] = base0, p->factor[0] = factor0;
    p->base[1] = ndim == 2 ? base1 : 1, p->factor[1] = ndim == 2 ? factor1 : 1;
    return 1;
}

int32_t pytfm_model_param(const pytfm_model_config *c, int64_t layer, int32_t part,
                          pytfm_param_info *p) {
    if (!c || !p || part < 0 || layer < -1 || layer > c->n_layer) return 0;
    const int64_t C = c->d_model;
    p->layer = layer, p->part = part;
    if (layer < 0) {
        if (part == 0) return param_is(p, 2, c->vocab, 1, C, 1, "transformer.wte.weight");
        if (part == 1 && c->pos == PYTFM_POS_LEARNED)
            return param_is(p, 2, c->max_seq, 1, C, 1, "transformer.wpe.weight");
        return 0;
    }
    if (layer < c->n_layer) {
        if (part >= PYTFM__LAYER_PARTS) return 0;
        const int rows = block_parts[part].rows, cols = block_parts[part].cols;
        return param_is(p, cols ? 2 : 1, C, rows, C, cols, "transformer.h.%lld.%s",
                        (long long)layer, block_parts[part].name);
    }
    if (part < 2) return param_is(p, 1, C, 1, 0, 0, "transformer.ln_f.%s", part ? "bias" : "weight");
    if (part == 2 && !c->tie_embeddings) return param_is(p, 2, c->vocab, 1, C, 1, "lm_head.weight");
    return 0;
}

int pytfm__param_next(const pytfm_model_config *c, pytfm_param_info *p) {
    const int64_t layer = p->layer;
    if (pytfm_model_param(c, layer, p->part + 1, p)) return 1;
    return layer < c->n_layer && pytfm_model_param(c, layer + 1, 0, p);
}

int pytfm__param_shape(const pytfm_param_info *p, int64_t shape[2]) {
    return pytfm__mul_within(p->base[0], p->factor[0], INT64_MAX, &shape[0]) &&
           pytfm__mul_within(p->base[1], p->factor[1], INT64_MAX, &shape[1]);
}
