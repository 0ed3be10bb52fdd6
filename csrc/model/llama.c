/*
 * llama.c — a Hugging Face folder of a Llama-family model (LlamaForCausalLM, Qwen2ForCausalLM,
 * Qwen3ForCausalLM, MistralForCausalLM: config.json + model.safetensors, or the shards that
 * model.safetensors.index.json lists), read without trusting a byte of it: the one home of the
 * folder's rules (pytfm/llama.py maps what this returns). Checked in this order:
 *   1. config.json (hf_folder.c: at most 16 MiB of strict JSON), an object: model_type one of
 *      the four families, architectures (if there) its XForCausalLM; the sizes; each field
 *      that changes the maths at a value pytfm runs (transformers' default where absent, read
 *      from each family's config class); the ignored ones; nothing else. The result is a
 *      PYTFM_ARCH_LLAMA config that pytfm_model_config_check accepts;
 *   2. the weight files (hf_folder.c, shared with gpt2.c), safetensors headers taking BF16 and
 *      F16 tensors as well as F32;
 *   3. the tensors against the config: every parameter of pytfm_model_param's layout (its
 *      names are transformers'), float32, bfloat16 or float16 of the shape the config implies;
 *      by rule a tied model's lm_head.weight [V, C] and the rotary buffers
 *      model.layers.N.self_attn.rotary_emb.inv_freq [head_dim / 2]; nothing else.
 * All of that reads headers only: nothing proportional to the parameters is allocated before
 * it passes. pytfm_llama_read then copies the parameters with pread, converting 16-bit floats
 * to float32 (exactly: every bfloat16 and float16 is a float32), and checks a stored tied head
 * against the embedding. For the C model (pytfm__llama_weights), a folder whose matrices are
 * all bfloat16 keeps them so: their bytes read as they lie, the vectors converted to float32.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "core/internal.h"
#include "hf_folder.h"
#include "gpt2.h"
#include "safetensors.h"

enum {
    SHOW = PYTFM__SHOW,
    CHUNK = 1 << 14 /* 16-bit values converted at once */
};

static const char KIND[] = "Llama-family";

#define BAD PYTFM__HF_BAD
#define NO_MEMORY PYTFM__HF_NO_MEMORY

/* ---- 1. config.json ------------------------------------------------------------------------ */

/* The four families, with transformers' defaults for what config.json may leave out */
enum { LLAMA, QWEN2, QWEN3, MISTRAL, N_FAMILIES };
static const struct {
    const char *model_type, *architecture;
    int64_t kv_heads;     /* num_key_value_heads absent; 0: num_attention_heads */
    int64_t head_dim;     /* head_dim absent; 0: hidden_size / num_attention_heads */
    int64_t max_pos;      /* max_position_embeddings absent */
    int64_t window;       /* sliding_window absent (Qwen: when use_sliding_window) */
} FAMILIES[N_FAMILIES] = {
    {"llama", "LlamaForCausalLM", 0, 0, 2048, 0},
    {"qwen2", "Qwen2ForCausalLM", 32, 0, 32768, 4096},
    {"qwen3", "Qwen3ForCausalLM", 32, 128, 32768, 4096},
    {"mistral", "MistralForCausalLM", 8, 0, 131072, 4096},
};

/* config.json fields that do not change the forward pass: ignored (pytfm.llama.IGNORED), with
 * hf_folder's list of PretrainedConfig's */
static const char *const IGNORED[] = {"attention_dropout", NULL};

const char *pytfm_llama_ignored_field(int64_t index) {
    const int64_t own = (int64_t)(sizeof IGNORED / sizeof *IGNORED) - 1;
    if (index >= 0 && index < own) return IGNORED[index];
    return index >= own ? pytfm__hf_common_ignored(index - own) : NULL;
}

/* the fields the rules read, and the families each belongs to (a bit per family) */
static const struct {
    const char *name;
    unsigned families;
} FIELDS[] = {
    {"model_type", 15},         {"architectures", 15},          {"vocab_size", 15},
    {"hidden_size", 15},        {"intermediate_size", 15},      {"num_hidden_layers", 15},
    {"num_attention_heads", 15}, {"num_key_value_heads", 15},   {"head_dim", 15},
    {"max_position_embeddings", 15}, {"rms_norm_eps", 15},      {"hidden_act", 15},
    {"tie_word_embeddings", 15}, {"rope_theta", 15},            {"rope_scaling", 15},
    {"rope_parameters", 15},    {"attention_bias", 1 | 4},      {"mlp_bias", 1},
    {"pretraining_tp", 1},      {"sliding_window", 2 | 4 | 8},  {"use_sliding_window", 2 | 4},
    {"max_window_layers", 2 | 4}, {"layer_types", 2 | 4 | 8},
};

static int known_key_in(pytfm__json key, int family) {
    for (size_t k = 0; k < sizeof FIELDS / sizeof *FIELDS; k++)
        if (pytfm__json_string_is(key, FIELDS[k].name))
            return (FIELDS[k].families >> family) & 1;
    for (int64_t k = 0; pytfm_llama_ignored_field(k); k++)
        if (pytfm__json_string_is(key, pytfm_llama_ignored_field(k))) return 1;
    return 0;
}

/* one known_key per family: pytfm__hf_unknown_key takes a plain function */
static int known_llama(pytfm__json key) { return known_key_in(key, LLAMA); }
static int known_qwen2(pytfm__json key) { return known_key_in(key, QWEN2); }
static int known_qwen3(pytfm__json key) { return known_key_in(key, QWEN3); }
static int known_mistral(pytfm__json key) { return known_key_in(key, MISTRAL); }
static int (*const KNOWN[N_FAMILIES])(pytfm__json) = {known_llama, known_qwen2, known_qwen3,
                                                      known_mistral};

/* what a parse has so far: the text's root, its source, the family */
typedef struct parser {
    pytfm__json root;
    const char *source;
    int family;
    char a[SHOW], b[SHOW]; /* for messages */
} parser;

/* field name, absent: *value = fallback; else a positive int below 2^63 (null too when
 * null_ok, giving null_value) */
static pytfm_status positive(parser *p, const char *name, int64_t fallback, int null_ok,
                             int64_t null_value, int64_t *value) {
    const pytfm__json v = pytfm__hf_member(p->root, name);
    if (!v.p) {
        *value = fallback;
        return PYTFM_STATUS_OK;
    }
    if (null_ok && pytfm__json_kind_of(v) == PYTFM__JSON_NULL) {
        *value = null_value;
        return PYTFM_STATUS_OK;
    }
    const pytfm__json_int i = pytfm__hf_is_int(v) ? pytfm__json_integer(v) : (pytfm__json_int){0};
    if (!i.integer || !i.fits || i.value < 1)
        return BAD(p->source, "%s must be a positive int%s, got %s", name,
                   null_ok ? " or null" : "", pytfm__hf_py_repr(v, p->a));
    *value = i.value;
    return PYTFM_STATUS_OK;
}

/* field name: absent, or a bool equal to want; field ok: *found the value */
static pytfm_status boolean(parser *p, const char *name, int fallback, int *value) {
    const pytfm__json v = pytfm__hf_member(p->root, name);
    *value = fallback;
    if (!v.p) return PYTFM_STATUS_OK;
    if (pytfm__json_kind_of(v) != PYTFM__JSON_BOOL)
        return BAD(p->source, "%s must be true or false, got %s", name,
                   pytfm__hf_py_repr(v, p->a));
    *value = v.p[0] == 't';
    return PYTFM_STATUS_OK;
}

/* a finite number > 0 from v (Python's float of it, as transformers reads it) */
static pytfm_status number(parser *p, pytfm__json v, const char *name, double *value) {
    int ok = 0;
    const double d = pytfm__json_kind_of(v) == PYTFM__JSON_NUMBER ? pytfm__json_number(v, &ok) : 0;
    if (!ok || !isfinite(d) || d <= 0)
        return BAD(p->source, "%s must be a finite number > 0, got %s", name,
                   pytfm__hf_py_repr(v, p->a));
    *value = d;
    return PYTFM_STATUS_OK;
}

/* the family, from model_type (required) and architectures (if there) */
static pytfm_status family(parser *p) {
    const pytfm__json type = pytfm__hf_member(p->root, "model_type");
    if (!type.p)
        return BAD(p->source, "has no model_type (pytfm reads 'llama', 'qwen2', 'qwen3' and "
                   "'mistral' folders)");
    p->family = -1;
    for (int f = 0; f < N_FAMILIES; f++)
        if (pytfm__json_string_is(type, FAMILIES[f].model_type)) p->family = f;
    if (p->family < 0)
        return BAD(p->source,
                   "model_type is %s: pytfm reads the Llama family's 'llama', 'qwen2', 'qwen3' "
                   "and 'mistral'%s",
                   pytfm__hf_py_repr(type, p->a),
                   pytfm__json_string_is(type, "gpt2") ? " here (GPT-2: pytfm.gpt2)" : "");
    const pytfm__json arch = pytfm__hf_member(p->root, "architectures");
    if (!arch.p || pytfm__json_kind_of(arch) == PYTFM__JSON_NULL) return PYTFM_STATUS_OK;
    pytfm__json first = {NULL, 0};
    pytfm__json_iter it = pytfm__json_iter_of(arch);
    const int list = pytfm__json_kind_of(arch) == PYTFM__JSON_ARRAY;
    if (list && pytfm__json_count(arch) == 1) pytfm__json_next(&it, NULL, &first);
    if (!first.p || !pytfm__json_string_is(first, FAMILIES[p->family].architecture))
        return BAD(p->source, "architectures is %s: pytfm reads ['%s'] for model_type '%s'",
                   pytfm__hf_py_repr(arch, p->a), FAMILIES[p->family].architecture,
                   FAMILIES[p->family].model_type);
    return PYTFM_STATUS_OK;
}

/* the RoPE fields: transformers 5's rope_parameters {rope_type, rope_theta, ...}, or the
 * rope_theta and rope_scaling of the configs before it (rope_scaling wins over
 * rope_parameters, the dict's rope_theta over the top-level one, which must then agree);
 * rope_type "default" or "llama3" with its four numbers (original_max_position_embeddings
 * absent: max_position_embeddings) */
static pytfm_status rope(parser *p, pytfm_model_config *c) {
    const pytfm__json params = pytfm__hf_member(p->root, "rope_parameters"),
                      scaling = pytfm__hf_member(p->root, "rope_scaling"),
                      theta = pytfm__hf_member(p->root, "rope_theta");
    const int has_params = params.p && pytfm__json_kind_of(params) != PYTFM__JSON_NULL;
    const int has_scaling = scaling.p && pytfm__json_kind_of(scaling) != PYTFM__JSON_NULL;
    if (has_params && has_scaling)
        return BAD(p->source, "has both rope_parameters and rope_scaling: which one holds?");
    const char *name = has_scaling ? "rope_scaling" : "rope_parameters";
    const pytfm__json dict = has_scaling ? scaling : has_params ? params : (pytfm__json){0};
    if (dict.p && pytfm__json_kind_of(dict) != PYTFM__JSON_OBJECT)
        return BAD(p->source, "%s must be an object or null, got %s", name,
                   pytfm__hf_py_repr(dict, p->a));
    c->rope_theta = 10000.0; /* transformers' default_theta, the four families' */
    if (theta.p) PYTFM_TRY(number(p, theta, "rope_theta", &c->rope_theta));
    if (!dict.p) return PYTFM_STATUS_OK;
    pytfm__json type = pytfm__hf_member(dict, "rope_type");
    const pytfm__json old_type = pytfm__hf_member(dict, "type");
    if (!type.p) type = old_type;
    int llama3 = 0;
    if (type.p && !pytfm__json_string_is(type, "default")) {
        if (!pytfm__json_string_is(type, "llama3"))
            return BAD(p->source,
                       "%s rope_type is %s: pytfm runs 'default' and 'llama3' RoPE only", name,
                       pytfm__hf_py_repr(type, p->a));
        llama3 = 1;
    }
    static const char *const LLAMA3[] = {"factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings"};
    double *const numbers[] = {&c->rope_factor, &c->rope_low_freq_factor,
                               &c->rope_high_freq_factor, &c->rope_original_max_pos};
    pytfm__json k, v;
    pytfm__json_iter it = pytfm__json_iter_of(dict);
    while (pytfm__json_next(&it, &k, &v)) {
        int known = pytfm__json_string_is(k, "rope_type") || pytfm__json_string_is(k, "type") ||
                    pytfm__json_string_is(k, "rope_theta");
        for (size_t j = 0; j < 4 && llama3; j++) known |= pytfm__json_string_is(k, LLAMA3[j]);
        if (!known)
            return BAD(p->source, "%s has an unknown field %s (for rope_type '%s')", name,
                       pytfm__hf_py_repr(k, p->a), llama3 ? "llama3" : "default");
    }
    if (type.p && old_type.p && type.p != old_type.p &&
        !(old_type.n == type.n && !memcmp(old_type.p, type.p, type.n)))
        return BAD(p->source, "%s has both rope_type and type, and they differ", name);
    const pytfm__json inner = pytfm__hf_member(dict, "rope_theta");
    if (inner.p) {
        double d = 0;
        PYTFM_TRY(number(p, inner, "rope_theta", &d));
        if (theta.p && d != c->rope_theta)
            return BAD(p->source, "rope_theta (%s) and %s's (%s) disagree",
                       pytfm__hf_py_repr(theta, p->a), name, pytfm__hf_py_repr(inner, p->b));
        c->rope_theta = d;
    }
    if (!llama3) return PYTFM_STATUS_OK;
    c->rope_scaling = PYTFM_ROPE_SCALING_LLAMA3;
    c->rope_original_max_pos = (double)c->max_seq;
    for (size_t j = 0; j < 4; j++) {
        const pytfm__json x = pytfm__hf_member(dict, LLAMA3[j]);
        if (!x.p && j == 3) continue;
        if (!x.p) return BAD(p->source, "%s (llama3) has no %s", name, LLAMA3[j]);
        char what[80];
        snprintf(what, sizeof what, "%s %s", name, LLAMA3[j]);
        PYTFM_TRY(number(p, x, what, numbers[j]));
    }
    return PYTFM_STATUS_OK;
}

/* layer_types, if there: n_layer strings "full_attention" or "sliding_attention"; -> *types
 * 0 absent, 1 all full, 2 all sliding */
static pytfm_status layer_types(parser *p, int64_t n_layer, int *types) {
    const pytfm__json v = pytfm__hf_member(p->root, "layer_types");
    *types = 0;
    if (!v.p || pytfm__json_kind_of(v) == PYTFM__JSON_NULL) return PYTFM_STATUS_OK;
    int ok = pytfm__json_kind_of(v) == PYTFM__JSON_ARRAY &&
             (int64_t)pytfm__json_count(v) == n_layer;
    int64_t full = 0, sliding = 0;
    pytfm__json x;
    pytfm__json_iter it = pytfm__json_iter_of(v);
    while (ok && pytfm__json_next(&it, NULL, &x)) {
        const int is_full = pytfm__json_string_is(x, "full_attention");
        const int is_sliding = pytfm__json_string_is(x, "sliding_attention");
        full += is_full, sliding += is_sliding;
        ok = is_full || is_sliding;
    }
    if (!ok)
        return BAD(p->source,
                   "layer_types must be a list of num_hidden_layers (%lld) 'full_attention' or "
                   "'sliding_attention', got %s",
                   (long long)n_layer, pytfm__hf_py_repr(v, p->a));
    if (full && sliding)
        return BAD(p->source,
                   "layer_types mixes full_attention and sliding_attention layers: pytfm runs "
                   "one kind of attention in every layer");
    *types = full ? 1 : 2;
    return PYTFM_STATUS_OK;
}

/* the sliding window: Mistral's sliding_window (every layer), or Qwen's, where
 * use_sliding_window gives the window to the layers that layer_types (else those from
 * max_window_layers on) mark sliding_attention; pytfm runs one kind in every layer */
static pytfm_status window(parser *p, pytfm_model_config *c) {
    if (p->family == LLAMA) return PYTFM_STATUS_OK;
    int64_t w = 0;
    PYTFM_TRY(positive(p, "sliding_window", FAMILIES[p->family].window, 1, 0, &w));
    int types = 0;
    PYTFM_TRY(layer_types(p, c->n_layer, &types));
    if (p->family == MISTRAL) {
        if (types && (types == 2) != (w > 0))
            return BAD(p->source, "layer_types says %s attention, sliding_window %s",
                       types == 2 ? "sliding" : "full", w ? "a window" : "none");
        c->sliding_window = w;
        return PYTFM_STATUS_OK;
    }
    int use = 0;
    PYTFM_TRY(boolean(p, "use_sliding_window", 0, &use));
    const pytfm__json mwl = pytfm__hf_member(p->root, "max_window_layers");
    int64_t from = 28;
    if (mwl.p) {
        const pytfm__json_int i = pytfm__hf_is_int(mwl) ? pytfm__json_integer(mwl)
                                                        : (pytfm__json_int){0};
        if (!i.integer || !i.fits || i.value < 0)
            return BAD(p->source, "max_window_layers must be an int >= 0, got %s",
                       pytfm__hf_py_repr(mwl, p->a));
        from = i.value;
    }
    if (!use) w = 0; /* transformers drops the window */
    if (!types) /* transformers' default layer_types: sliding from max_window_layers on */
        types = !w || from >= c->n_layer ? 1 : from == 0 ? 2 : 3;
    if (types == 3)
        return BAD(p->source,
                   "use_sliding_window with max_window_layers %lld of %lld layers mixes full and "
                   "sliding attention: pytfm runs one kind in every layer",
                   (long long)from, (long long)c->n_layer);
    if (types == 2 && !w)
        return BAD(p->source, "layer_types says sliding_attention, but there is no window "
                   "(use_sliding_window false or sliding_window null)");
    c->sliding_window = types == 2 ? w : 0;
    return PYTFM_STATUS_OK;
}

/* the fields that must have one value: attention_bias (Qwen 2: q/k/v biases always), mlp_bias,
 * pretraining_tp, hidden_act */
static pytfm_status fixed(parser *p, pytfm_model_config *c) {
    int bias = 0;
    PYTFM_TRY(boolean(p, "attention_bias", 0, &bias));
    if (bias)
        return BAD(p->source, "attention_bias is True: pytfm runs q, k, v biases (Qwen 2) but "
                   "no o_proj bias");
    PYTFM_TRY(boolean(p, "mlp_bias", 0, &bias));
    if (bias) return BAD(p->source, "mlp_bias is True: pytfm's SwiGLU has no biases");
    const pytfm__json tp = pytfm__hf_member(p->root, "pretraining_tp");
    const pytfm__json_int i = tp.p && pytfm__hf_is_int(tp) ? pytfm__json_integer(tp)
                                                          : (pytfm__json_int){0};
    if (tp.p && !(i.integer && i.fits && i.value == 1))
        return BAD(p->source, "pretraining_tp is %s: pytfm runs 1 only",
                   pytfm__hf_py_repr(tp, p->a));
    const pytfm__json act = pytfm__hf_member(p->root, "hidden_act");
    if (act.p && !pytfm__json_string_is(act, "silu"))
        return BAD(p->source, "hidden_act is %s: pytfm runs 'silu' (SwiGLU) only",
                   pytfm__hf_py_repr(act, p->a));
    c->qkv_bias = p->family == QWEN2;
    c->qk_norm = p->family == QWEN3;
    return PYTFM_STATUS_OK;
}

/* the sizes: -> c */
static pytfm_status sizes(parser *p, pytfm_model_config *c) {
    static const char *const REQUIRED[] = {"vocab_size", "hidden_size", "intermediate_size",
                                           "num_hidden_layers", "num_attention_heads"};
    int64_t *const out[] = {&c->vocab, &c->d_model, &c->d_ff, &c->n_layer, &c->n_head};
    for (size_t k = 0; k < 5; k++) {
        if (!pytfm__hf_member(p->root, REQUIRED[k]).p)
            return BAD(p->source, "has no %s", REQUIRED[k]);
        PYTFM_TRY(positive(p, REQUIRED[k], 0, 0, 0, out[k]));
    }
    const int f = p->family;
    PYTFM_TRY(positive(p, "num_key_value_heads",
                       FAMILIES[f].kv_heads ? FAMILIES[f].kv_heads : c->n_head, 1, c->n_head,
                       &c->n_kv_head));
    /* head_dim absent or (Llama, Mistral) null: hidden_size // num_attention_heads */
    const int64_t split = c->d_model / c->n_head;
    const int null_ok = f == LLAMA || f == MISTRAL;
    PYTFM_TRY(positive(p, "head_dim", FAMILIES[f].head_dim ? FAMILIES[f].head_dim : split,
                       null_ok, split, &c->head_dim));
    const pytfm__json hd = pytfm__hf_member(p->root, "head_dim");
    const int derived = f != QWEN3 && (!hd.p || pytfm__json_kind_of(hd) == PYTFM__JSON_NULL);
    if (derived && c->d_model % c->n_head)
        return BAD(p->source,
                   "hidden_size (%lld) must be a multiple of num_attention_heads (%lld) when "
                   "head_dim is not given",
                   (long long)c->d_model, (long long)c->n_head);
    PYTFM_TRY(positive(p, "max_position_embeddings", FAMILIES[f].max_pos, 0, 0, &c->max_seq));
    c->norm_eps = 1e-6; /* the four families' default */
    const pytfm__json eps = pytfm__hf_member(p->root, "rms_norm_eps");
    if (eps.p) PYTFM_TRY(number(p, eps, "rms_norm_eps", &c->norm_eps));
    int tie = 0;
    PYTFM_TRY(boolean(p, "tie_word_embeddings", 0, &tie));
    c->tie_embeddings = tie;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_llama_config_parse(pytfm_model_config *config, const char *text,
                                      int64_t size, const char *source) {
    PYTFM_CHECK(config != NULL, "%s: config must not be NULL", __func__);
    PYTFM_CHECK(text != NULL || size == 0, "%s: text must not be NULL", __func__);
    PYTFM_CHECK(size >= 0, "%s: size must be >= 0, got %lld", __func__, (long long)size);
    memset(config, 0, sizeof *config);
    errno = 0;
    if (pytfm_json_check(text, size) != PYTFM_STATUS_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", pytfm_last_error());
        return BAD(source, "%s", why);
    }
    parser p = {.root = pytfm__json_root(text, (size_t)size), .source = source};
    if (pytfm__json_kind_of(p.root) != PYTFM__JSON_OBJECT)
        return BAD(source, "a JSON %s, not an object",
                   pytfm__json_kind_name(pytfm__json_kind_of(p.root)));
    PYTFM_TRY(family(&p));
    pytfm__json unknown;
    PYTFM_TRY(pytfm__hf_unknown_key(p.root, source, KNOWN[p.family], &unknown));
    if (unknown.p)
        return BAD(source,
                   "unknown field %s for model_type '%s': pytfm cannot tell whether it changes "
                   "the model (it ignores only the fields pytfm.llama.IGNORED lists)",
                   pytfm__hf_py_repr(unknown, p.a), FAMILIES[p.family].model_type);
    pytfm_model_config c = {.arch = PYTFM_ARCH_LLAMA, .pos = PYTFM_POS_ROPE};
    PYTFM_TRY(sizes(&p, &c));
    PYTFM_TRY(fixed(&p, &c));
    PYTFM_TRY(rope(&p, &c));
    PYTFM_TRY(window(&p, &c));
    PYTFM_TRY(pytfm__model_config_check_at(&c, source, ""));
    *config = c;
    return PYTFM_STATUS_OK;
}

/* folder/config.json, read and parsed */
static pytfm_status read_config(int dir, const char *folder, pytfm_model_config *config) {
    char *text, *path;
    size_t size;
    pytfm_status status = pytfm__hf_read_config(dir, folder, KIND, &text, &size, &path);
    if (status == PYTFM_STATUS_OK)
        status = pytfm_llama_config_parse(config, text, (int64_t)size, path);
    free(text);
    free(path);
    return status;
}

pytfm_status pytfm_llama_read_config(pytfm_model_config *config, const char *folder) {
    PYTFM_CHECK(config != NULL, "%s: config must not be NULL", __func__);
    PYTFM_CHECK(folder != NULL, "%s: folder must not be NULL", __func__);
    memset(config, 0, sizeof *config);
    int dir;
    PYTFM_TRY(pytfm__hf_open_folder(folder, KIND, &dir));
    const pytfm_status status = read_config(dir, folder, config);
    const int e = errno;
    close(dir);
    errno = e;
    return status;
}

/* ---- 3. the tensors -------------------------------------------------------------------------- */

struct pytfm_llama {
    pytfm_model_config config;
    pytfm__hf_files h;              /* the weight files; h.source names them in messages */
    const pytfm__st_entry *lm_head; /* a tied model's stored head, or NULL */
    size_t lm_head_file;
};

static const char *dtype_name(int32_t dtype) {
    switch (dtype) {
    case PYTFM_DTYPE_F32: return "float32";
    case PYTFM_DTYPE_BF16: return "bfloat16";
    case PYTFM_DTYPE_F16: return "float16";
    default: return "int64";
    }
}

/* entry e of file f is a float (32 or 16 bits) of shape [rows] (cols 0) or [rows, cols] */
static pytfm_status expect(const pytfm_llama *g, const pytfm__st_entry *e, size_t f,
                           int64_t rows, int64_t cols) {
    pytfm_tensor_info t;
    PYTFM_TRY(pytfm_safetensors_tensor(g->h.files[f].st, e - g->h.files[f].st->entries, &t));
    const int ndim = cols ? 2 : 1;
    if (t.dtype != PYTFM_DTYPE_I64 && t.ndim == ndim && t.shape[0] == rows &&
        (!cols || t.shape[1] == cols))
        return PYTFM_STATUS_OK;
    char name[SHOW], got[256], need[64];
    if (cols) snprintf(need, sizeof need, "[%lld, %lld]", (long long)rows, (long long)cols);
    else snprintf(need, sizeof need, "[%lld]", (long long)rows);
    return BAD(g->h.source, "%s is %s%s, config.json needs float32, bfloat16 or float16%s",
               pytfm__hf_show_name(e->name, e->name_len, name), dtype_name(t.dtype),
               pytfm__hf_show_shape(&t, got, sizeof got), need);
}

/* every parameter there, of its shape; each marked in used[f][i] */
static pytfm_status check_expected(pytfm_llama *g, unsigned char **used) {
    pytfm_param_info x = {.layer = -1, .part = -1};
    int64_t count = 0;
    const pytfm_model_config *c = &g->config;
    while (pytfm__param_next(c, &x)) {
        size_t f = 0;
        const int64_t rows = x.base[0], cols = x.ndim == 2 ? x.base[1] : 0; /* factors 1 */
        const pytfm__st_entry *e = pytfm__hf_find(&g->h, x.name, strlen(x.name), &f);
        if (!e) {
            char need[64];
            if (cols) snprintf(need, sizeof need, "[%lld, %lld]", (long long)rows, (long long)cols);
            else snprintf(need, sizeof need, "[%lld]", (long long)rows);
            return BAD(g->h.source,
                       "tensor %s is missing: config.json's {'num_hidden_layers': %lld, "
                       "'hidden_size': %lld} needs a float%s",
                       x.name, (long long)c->n_layer, (long long)c->d_model, need);
        }
        PYTFM_TRY(expect(g, e, f, rows, cols));
        used[f][e - g->h.files[f].st->entries] = 1;
        /* its elements lie in the file: their count, and the sum, fit in int64 */
        count += rows * (cols ? cols : 1);
    }
    g->config.n_params = count;
    return PYTFM_STATUS_OK;
}

/* name[0..n) is "model.layers.<i>.self_attn.rotary_emb.inv_freq", i < n_layer written as
 * Python's str(int) writes it */
static int rotary_buffer(const char *name, size_t n, int64_t n_layer) {
    static const char head[] = "model.layers.", tail[] = ".self_attn.rotary_emb.inv_freq";
    const size_t h = sizeof head - 1, t = sizeof tail - 1;
    if (n <= h + t || memcmp(name, head, h) || memcmp(name + n - t, tail, t)) return 0;
    const size_t digits = n - h - t;
    if (digits > 18 || (digits > 1 && name[h] == '0')) return 0;
    int64_t layer = 0;
    for (size_t i = h; i < h + digits; i++) {
        if (name[i] < '0' || name[i] > '9') return 0;
        layer = layer * 10 + (name[i] - '0');
    }
    return layer < n_layer;
}

/* what is not a parameter: a tied head, the rotary buffers, else refused */
static pytfm_status check_others(pytfm_llama *g, unsigned char **used) {
    const pytfm_model_config *c = &g->config;
    for (size_t f = 0; f < g->h.n_files; f++) {
        const pytfm_safetensors *st = g->h.files[f].st;
        for (size_t i = 0; i < st->n_entries; i++) {
            if (used[f][i]) continue;
            const pytfm__st_entry *e = &st->entries[i];
            char name[SHOW];
            if (c->tie_embeddings && e->name_len == 14 && !memcmp(e->name, "lm_head.weight", 14)) {
                PYTFM_TRY(expect(g, e, f, c->vocab, c->d_model));
                g->lm_head = e, g->lm_head_file = f;
            } else if (rotary_buffer(e->name, e->name_len, c->n_layer)) {
                PYTFM_TRY(expect(g, e, f, c->head_dim / 2, 0));
            } else {
                return BAD(g->h.source,
                           "unexpected tensor %s (a %lld-layer model of this config.json has "
                           "model.embed_tokens, model.layers.N..., model.norm%s)",
                           pytfm__hf_show_name(e->name, e->name_len, name),
                           (long long)c->n_layer, c->tie_embeddings ? ", tied" : ", lm_head");
            }
        }
    }
    return PYTFM_STATUS_OK;
}

static pytfm_status check_tensors(pytfm_llama *g) {
    unsigned char **used = pytfm__hf_new_used(&g->h);
    if (!used) return PYTFM_STATUS_OUT_OF_MEMORY;
    pytfm_status status = check_expected(g, used);
    if (status == PYTFM_STATUS_OK) status = check_others(g, used);
    pytfm__hf_free_used(&g->h, used);
    return status;
}

/* ---- the handle ------------------------------------------------------------------------------ */

/* one try of pytfm_llama_open, on the folder open as dir: *(pytfm_llama **)out */
static pytfm_status open_in(void *out, int dir, const char *folder) {
    pytfm_llama *g = calloc(1, sizeof *g);
    if (!g) return NO_MEMORY(folder, "cannot allocate a Llama-family folder's handle");
    pytfm_status status = read_config(dir, folder, &g->config);
    if (status == PYTFM_STATUS_OK) status = pytfm__hf_open_files(&g->h, dir, folder, 1);
    if (status == PYTFM_STATUS_OK) status = check_tensors(g);
    if (status != PYTFM_STATUS_OK) {
        const int e = errno; /* a system call's error number survives the close */
        pytfm_llama_close(g);
        errno = e;
        return status;
    }
    *(pytfm_llama **)out = g;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_llama_open(pytfm_llama **llama, const char *folder) {
    PYTFM_CHECK(llama != NULL, "%s: llama must not be NULL", __func__);
    *llama = NULL;
    PYTFM_CHECK(folder != NULL, "%s: folder must not be NULL", __func__);
    return pytfm__hf_open_retry(folder, KIND, open_in, llama);
}

pytfm_status pytfm_llama_close(pytfm_llama *llama) {
    if (!llama) return PYTFM_STATUS_OK;
    pytfm__hf_close_files(&llama->h);
    free(llama);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_llama_get_config(const pytfm_llama *llama, pytfm_model_config *config) {
    PYTFM_CHECK(llama != NULL, "%s: llama must not be NULL", __func__);
    PYTFM_CHECK(config != NULL, "%s: config must not be NULL", __func__);
    *config = llama->config;
    return PYTFM_STATUS_OK;
}

/* ---- reading --------------------------------------------------------------------------------- */

/* bfloat16 bits -> float32: its top half, exactly */
static float from_bf16(uint32_t h) {
    const uint32_t u = h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE half bits -> float32, exactly (subnormals normalised, inf and NaN kept) */
static float from_f16(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (!mant) {
        u = sign;
    } else { /* mant · 2^-24: shift its leading one to bit 10 */
        uint32_t e = 113;
        while (!(mant & 0x400u)) mant <<= 1, e--;
        u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* elements [at, at + n) of entry e (of st) as float32 into out; buf holds CHUNK 16-bit values */
static pytfm_status read_part(const pytfm_safetensors *st, const pytfm__st_entry *e, int64_t at,
                              int64_t n, float *out, unsigned char *buf) {
    if (e->dtype == PYTFM_DTYPE_F32) {
        PYTFM_TRY(pytfm__st_read_part(st, e, at * 4, out, n * 4));
        pytfm__to_host_order(out, n);
        return PYTFM_STATUS_OK;
    }
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        const int64_t m = PYTFM_MIN(CHUNK, n - i0);
        PYTFM_TRY(pytfm__st_read_part(st, e, (at + i0) * 2, buf, m * 2));
        for (int64_t i = 0; i < m; i++) { /* little-endian in the file */
            const uint32_t bits = (uint32_t)buf[2 * i] | (uint32_t)buf[2 * i + 1] << 8;
            out[i0 + i] = e->dtype == PYTFM_DTYPE_BF16 ? from_bf16(bits) : from_f16(bits);
        }
    }
    return PYTFM_STATUS_OK;
}

static int64_t elements(const pytfm__st_entry *e) {
    return (e->end - e->begin) / (e->dtype == PYTFM_DTYPE_F32 ? 4 : 2);
}

/* a tied model's stored head (if any) equals the embedding, whose value i embed(i) gives (from
 * float32 or BF16): as array_equal compares their float32 values; buf as read_part's, then
 * CHUNK floats */
static pytfm_status check_head(const pytfm_llama *llama, const float *embed,
                               const uint16_t *embed16, unsigned char *buf) {
    const pytfm__st_entry *lm = llama->lm_head;
    const pytfm__hf_files *h = &llama->h;
    float *head = (float *)(void *)(buf + 2 * CHUNK);
    const int64_t n = lm ? elements(lm) : 0; /* vocab · d_model, checked at the open */
    pytfm_status status = PYTFM_STATUS_OK;
    for (int64_t i0 = 0; lm && status == PYTFM_STATUS_OK && i0 < n; i0 += CHUNK) {
        const int64_t m = PYTFM_MIN(CHUNK, n - i0);
        status = read_part(h->files[llama->lm_head_file].st, lm, i0, m, head, buf);
        for (int64_t i = 0; status == PYTFM_STATUS_OK && i < m; i++)
            if (head[i] != (embed ? embed[i0 + i] : from_bf16(embed16[i0 + i])))
                status = BAD(h->files[llama->lm_head_file].path,
                             "lm_head.weight differs from model.embed_tokens.weight, but "
                             "config.json ties them (tie_word_embeddings)");
    }
    return status;
}

pytfm_status pytfm_llama_read(const pytfm_llama *llama, float *params, int64_t count) {
    PYTFM_CHECK(llama != NULL, "%s: llama must not be NULL", __func__);
    PYTFM_CHECK(params != NULL, "%s: params must not be NULL", __func__);
    PYTFM_CHECK(count == llama->config.n_params,
                "%s: count must be the config's n_params (%lld), got %lld", __func__,
                (long long)llama->config.n_params, (long long)count);
    const pytfm__hf_files *h = &llama->h;
    /* CHUNK 16-bit values, then CHUNK floats of a stored tied head to compare */
    unsigned char *buf = pytfm__scratch(__func__, CHUNK * 6, 1);
    if (!buf) return PYTFM_STATUS_OUT_OF_MEMORY;
    pytfm_status status = PYTFM_STATUS_OK;
    pytfm_param_info x = {.layer = -1, .part = -1};
    int64_t at = 0;
    while (status == PYTFM_STATUS_OK && pytfm__param_next(&llama->config, &x)) {
        size_t f = 0;
        const pytfm__st_entry *e = pytfm__hf_find(h, x.name, strlen(x.name), &f);
        status = read_part(h->files[f].st, e, 0, elements(e), params + at, buf);
        at += elements(e);
    }
    if (status == PYTFM_STATUS_OK) /* the embedding is first */
        status = check_head(llama, params, NULL, buf);
    free(buf);
    if (status != PYTFM_STATUS_OK) return status;
    errno = 0;
    return PYTFM_STATUS_OK;
}

/* the entry of parameter x, and its file's index in *f */
static const pytfm__st_entry *entry_of(const pytfm_llama *g, const pytfm_param_info *x,
                                       size_t *f) {
    *f = 0;
    return pytfm__hf_find(&g->h, x->name, strlen(x->name), f);
}

/* whether every matrix (a 2-D parameter) of g's folder is bfloat16; their values into
 * *n_matrix */
static int matrices_bf16(const pytfm_llama *g, int64_t *n_matrix) {
    int all = 1;
    *n_matrix = 0;
    for (pytfm_param_info x = {.layer = -1, .part = -1}; pytfm__param_next(&g->config, &x);) {
        if (x.ndim != 2) continue;
        size_t f;
        const pytfm__st_entry *e = entry_of(g, &x, &f);
        all &= e->dtype == PYTFM_DTYPE_BF16;
        *n_matrix += elements(e);
    }
    return all;
}

/* p[0..count) 16-bit values read from a file (little-endian) in host byte order */
static void halves_to_host_order(uint16_t *p, int64_t count) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    if (first == 1) return;
    for (int64_t i = 0; i < count; i++) p[i] = (uint16_t)(p[i] >> 8 | p[i] << 8);
}

/* The parameters of g, whose matrices are all bfloat16, the matrices' bytes as they lie into
 * w16 (n_matrix values), the vectors as float32 into params, each in the layout's order. */
static pytfm_status read_keeping_bf16(const pytfm_llama *g, float *params, uint16_t *w16) {
    const pytfm__hf_files *h = &g->h;
    unsigned char *buf = pytfm__scratch("pytfm_model_open", CHUNK * 6, 1);
    if (!buf) return PYTFM_STATUS_OUT_OF_MEMORY;
    pytfm_status status = PYTFM_STATUS_OK;
    int64_t at = 0, at16 = 0;
    pytfm_param_info x = {.layer = -1, .part = -1};
    while (status == PYTFM_STATUS_OK && pytfm__param_next(&g->config, &x)) {
        size_t f;
        const pytfm__st_entry *e = entry_of(g, &x, &f);
        const int64_t n = elements(e);
        if (x.ndim == 2) {
            status = pytfm__st_read_part(h->files[f].st, e, 0, w16 + at16, 2 * n);
            halves_to_host_order(w16 + at16, n);
            at16 += n;
        } else {
            status = read_part(h->files[f].st, e, 0, n, params + at, buf);
            at += n;
        }
    }
    if (status == PYTFM_STATUS_OK) status = check_head(g, NULL, w16, buf);
    free(buf);
    return status;
}

pytfm_status pytfm_llama_bf16_matrices(const pytfm_llama *llama, int32_t *all,
                                       int64_t *n_matrices) {
    PYTFM_CHECK(llama != NULL, "%s: llama must not be NULL", __func__);
    PYTFM_CHECK(all != NULL, "%s: all must not be NULL", __func__);
    PYTFM_CHECK(n_matrices != NULL, "%s: n_matrices must not be NULL", __func__);
    *all = matrices_bf16(llama, n_matrices);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_llama_read_bf16(const pytfm_llama *llama, uint16_t *matrices,
                                   int64_t n_matrices, float *vectors, int64_t n_vectors) {
    PYTFM_CHECK(llama != NULL, "%s: llama must not be NULL", __func__);
    PYTFM_CHECK(matrices != NULL, "%s: matrices must not be NULL", __func__);
    PYTFM_CHECK(vectors != NULL || n_vectors == 0, "%s: vectors must not be NULL", __func__);
    int64_t n_matrix;
    const int all = matrices_bf16(llama, &n_matrix);
    PYTFM_CHECK(n_matrices == n_matrix,
                "%s: n_matrices must be the matrices' values (%lld), got %lld", __func__,
                (long long)n_matrix, (long long)n_matrices);
    const int64_t n_vector = llama->config.n_params - n_matrix;
    PYTFM_CHECK(n_vectors == n_vector,
                "%s: n_vectors must be n_params less the matrices' values (%lld), got %lld",
                __func__, (long long)n_vector, (long long)n_vectors);
    if (!all) {
        for (pytfm_param_info x = {.layer = -1, .part = -1};
             pytfm__param_next(&llama->config, &x);) {
            size_t f;
            const pytfm__st_entry *e = entry_of(llama, &x, &f);
            if (x.ndim == 2 && e->dtype != PYTFM_DTYPE_BF16)
                return BAD(llama->h.source, "%s is %s: a read keeping the matrices in BF16 "
                           "needs every matrix in bfloat16 (pytfm_llama_read converts any)",
                           x.name, dtype_name(e->dtype));
        }
    }
    PYTFM_TRY(read_keeping_bf16(llama, vectors, matrices));
    errno = 0;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm__llama_weights(const char *folder, pytfm__weights *w) {
    memset(w, 0, sizeof *w);
    pytfm_llama *g;
    PYTFM_TRY(pytfm_llama_open(&g, folder));
    const int64_t count = g->config.n_params;
    int64_t n_matrix = 0;
    const int keep = matrices_bf16(g, &n_matrix);
    const int64_t floats = keep ? count - n_matrix : count;
    // in huge pages where granted (core/weights.c); they lie in the files: no overflow
    float *params = pytfm__weights_alloc((size_t)floats * sizeof(float));
    uint16_t *w16 = keep && params ? pytfm__weights_alloc((size_t)n_matrix * 2) : NULL;
    pytfm_status status;
    if (!params || (keep && !w16))
        status = pytfm__hf_no_memory(&g->h, count);
    else if (keep)
        status = read_keeping_bf16(g, params, w16);
    else
        status = pytfm_llama_read(g, params, count);
    if (status == PYTFM_STATUS_OK) {
        w->config = g->config;
        w->params = params;
        w->w16 = w16, w->n_w16 = keep ? n_matrix : 0;
        errno = 0;
    } else {
        free(params), free(w16);
    }
    pytfm_llama_close(g);
    return status;
}
