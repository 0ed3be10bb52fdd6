/*
 * config.c — the rules of a model's shape, the one home of what pytfm.nn.GPTConfig, the
 * checkpoint reader (checkpoint.c) and the GPT-2 folder reader (gpt2.c) require of a config.
 * Types (an int, a str) are the caller's: Python's for GPTConfig, JSON's for the readers;
 * what the values must be is here.
 */
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
