/*
 * config.c — the rules of a model's shape, the one home of what pytfm.nn.GPTConfig, the
 * checkpoint reader (checkpoint.c) and the folder readers (gpt2.c) require of a config.
 * Types (an int, a str) are the caller's: Python's for GPTConfig, JSON's for the readers;
 * what the values must be is here. And the layout of the parameters a config implies
 * (pytfm_model_param), which the readers, the model and pytfm.nn.param_shapes walk.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "checkpoint.h"
#include "core/internal.h"
#include "safetensors.h"

#define BAD(source, ...) pytfm__fail_at(source, PYTFM_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

/* the rules of a PYTFM_ARCH_LLAMA config past the sizes every arch shares */
static pytfm_status llama_check(const pytfm_model_config *c, const char *source,
                                const char *what) {
    if (c->pos != PYTFM_POS_ROPE)
        return BAD(source, "%sthe Llama family (arch 'llama') uses pos 'rope', got %s", what,
                   c->pos == PYTFM_POS_SINUSOIDAL ? "'sinusoidal'"
                   : c->pos == PYTFM_POS_NONE     ? "'none'"
                                                  : "'learned'");
    const char *const names[] = {"n_kv_head", "head_dim", "d_ff"};
    const int64_t sizes[] = {c->n_kv_head, c->head_dim, c->d_ff};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        if (sizes[k] < 1)
            return BAD(source, "%sGPTConfig.%s must be a positive int (below 2**63), got %lld",
                       what, names[k], (long long)sizes[k]);
    if (c->n_head % c->n_kv_head)
        return BAD(source, "%sn_head (%lld) must be a multiple of n_kv_head (%lld)", what,
                   (long long)c->n_head, (long long)c->n_kv_head);
    if (c->head_dim % 2)
        return BAD(source, "%srope needs an even head_dim, got %lld", what,
                   (long long)c->head_dim);
    int64_t heads = 0, width = 0, ff2 = 0;
    if (!pytfm__mul_within(c->n_head / c->n_kv_head + 2, c->n_kv_head, INT64_MAX, &heads) ||
        !pytfm__mul_within(heads, c->head_dim, INT64_MAX, &width) ||
        !pytfm__mul_within(2, c->d_ff, INT64_MAX, &ff2))
        return BAD(source, "%s(n_head + 2·n_kv_head)·head_dim and 2·d_ff must be below 2**63",
                   what);
    if (c->sliding_window < 0)
        return BAD(source, "%sGPTConfig.sliding_window must be an int >= 0 (0: none), got %lld",
                   what, (long long)c->sliding_window);
    if ((c->qkv_bias != 0 && c->qkv_bias != 1) || (c->qk_norm != 0 && c->qk_norm != 1))
        return BAD(source, "%sGPTConfig.qkv_bias and qk_norm must be 0 or 1, got %d and %d",
                   what, (int)c->qkv_bias, (int)c->qk_norm);
    if (!isfinite(c->norm_eps) || c->norm_eps <= 0.0)
        return BAD(source, "%sGPTConfig.norm_eps must be finite and > 0, got %g", what,
                   c->norm_eps);
    if (!isfinite(c->rope_theta) || c->rope_theta <= 0.0)
        return BAD(source, "%sGPTConfig.rope_theta must be finite and > 0, got %g", what,
                   c->rope_theta);
    const double *const scaling[] = {&c->rope_factor, &c->rope_low_freq_factor,
                                     &c->rope_high_freq_factor, &c->rope_original_max_pos};
    if (c->rope_scaling == PYTFM_ROPE_SCALING_NONE) {
        for (size_t k = 0; k < 4; k++)
            if (*scaling[k] != 0.0)
                return BAD(source, "%sthe rope scaling's numbers are 0 without a scaling", what);
    } else if (c->rope_scaling == PYTFM_ROPE_SCALING_LLAMA3) {
        if (!isfinite(c->rope_factor) || c->rope_factor <= 0.0)
            return BAD(source, "%srope_scaling factor must be finite and > 0, got %g", what,
                       c->rope_factor);
        if (!isfinite(c->rope_low_freq_factor) || c->rope_low_freq_factor <= 0.0)
            return BAD(source, "%srope_scaling low_freq_factor must be finite and > 0, got %g",
                       what, c->rope_low_freq_factor);
        if (!isfinite(c->rope_high_freq_factor) ||
            !(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return BAD(source,
                       "%srope_scaling high_freq_factor must be finite and > low_freq_factor "
                       "(%g), got %g",
                       what, c->rope_low_freq_factor, c->rope_high_freq_factor);
        if (!isfinite(c->rope_original_max_pos) || c->rope_original_max_pos <= 0.0)
            return BAD(source,
                       "%srope_scaling original_max_position_embeddings must be finite and > 0, "
                       "got %g",
                       what, c->rope_original_max_pos);
    } else {
        return BAD(source, "%sGPTConfig.rope_scaling must be None or 'llama3', got %d", what,
                   (int)c->rope_scaling);
    }
    return PYTFM_STATUS_OK;
}

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
    if (c->arch != PYTFM_ARCH_GPT && c->arch != PYTFM_ARCH_LLAMA)
        return BAD(source, "%sGPTConfig.arch must be one of ('gpt', 'llama'), got %d", what,
                   (int)c->arch);
    if (c->arch == PYTFM_ARCH_LLAMA) return llama_check(c, source, what);
    if (c->qkv_bias || c->qk_norm || c->rope_scaling || c->n_kv_head || c->head_dim || c->d_ff ||
        c->sliding_window || c->norm_eps != 0.0 || c->rope_theta != 0.0 || c->rope_factor != 0.0 ||
        c->rope_low_freq_factor != 0.0 || c->rope_high_freq_factor != 0.0 ||
        c->rope_original_max_pos != 0.0)
        return BAD(source, "%sa GPT config (arch 'gpt') has none of the Llama family's fields "
                   "(n_kv_head, head_dim, d_ff, norm_eps, rope_theta, rope_scaling, qkv_bias, "
                   "qk_norm, sliding_window)", what);
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

/* A Llama-family block's parameters, in layout order (enum pytfm__llama_part): each name
 * after "model.layers.i.", and its shape in the config's sizes */
static const char *const llama_names[PYTFM__LLAMA_PARTS] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.q_proj.bias",   "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",   "self_attn.o_proj.weight", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight",      "mlp.down_proj.weight"};

/* whether part k is in c's blocks (the biases with qkv_bias, the norms with qk_norm), and its
 * shape into rows, cols (cols 0: a vector) */
static int llama_part_is(const pytfm_model_config *c, int k, int64_t *rows, int64_t *cols) {
    const int64_t C = c->d_model, hd = c->head_dim, F = c->d_ff;
    const int64_t qw = c->n_head * hd, kvw = c->n_kv_head * hd; /* below 2^63: checked */
    const int64_t shapes[PYTFM__LLAMA_PARTS][2] = {
        {C, 0},   {qw, C}, {kvw, C}, {kvw, C}, {qw, 0}, {kvw, 0}, {kvw, 0},
        {C, qw},  {hd, 0}, {hd, 0},  {C, 0},   {F, C},  {F, C},   {C, F}};
    *rows = shapes[k][0], *cols = shapes[k][1];
    if (k >= PYTFM__LLAMA_Q_B && k <= PYTFM__LLAMA_V_B) return c->qkv_bias;
    if (k == PYTFM__LLAMA_Q_NORM || k == PYTFM__LLAMA_K_NORM) return c->qk_norm;
    return 1;
}

int pytfm__llama_part(const pytfm_model_config *c, int32_t part) {
    int64_t rows, cols;
    for (int k = 0, seen = 0; k < PYTFM__LLAMA_PARTS; k++)
        if (llama_part_is(c, k, &rows, &cols) && seen++ == part) return k;
    return -1;
}

/* pytfm_model_param for PYTFM_ARCH_LLAMA: a block's parts are taken in order, each skipped
 * when its option is off, so part numbers stay dense */
static int32_t llama_param(const pytfm_model_config *c, int64_t layer, int32_t part,
                           pytfm_param_info *p) {
    const int64_t C = c->d_model;
    if (layer < 0)
        return part == 0 && param_is(p, 2, c->vocab, 1, C, 1, "model.embed_tokens.weight");
    if (layer == c->n_layer) {
        if (part == 0) return param_is(p, 1, C, 1, 0, 0, "model.norm.weight");
        if (part == 1 && !c->tie_embeddings)
            return param_is(p, 2, c->vocab, 1, C, 1, "lm_head.weight");
        return 0;
    }
    const int k = pytfm__llama_part(c, part);
    int64_t rows, cols;
    if (k < 0 || !llama_part_is(c, k, &rows, &cols)) return 0;
    return param_is(p, cols ? 2 : 1, rows, 1, cols, 1, "model.layers.%lld.%s", (long long)layer,
                    llama_names[k]);
}

int32_t pytfm_model_param(const pytfm_model_config *c, int64_t layer, int32_t part,
                          pytfm_param_info *p) {
    if (!c || !p || part < 0 || layer < -1 || layer > c->n_layer) return 0;
    const int64_t C = c->d_model;
    p->layer = layer, p->part = part;
    if (c->arch == PYTFM_ARCH_LLAMA) return llama_param(c, layer, part, p);
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
