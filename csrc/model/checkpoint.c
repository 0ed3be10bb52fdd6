/*
 * checkpoint.c — layer 2 of the checkpoint reader: a pytfm checkpoint (pytfm.checkpoint.save's
 * layout) on an open safetensors file (safetensors.c), checked in this order:
 *   1. __metadata__: format "pytfm"; config a JSON object with GPTConfig's fields (the Llama
 *      family's optional: 0 when absent) and no others, of GPTConfig's types, their values by
 *      pytfm_model_config_check (config.c); step and
 *      optim.t non-negative int64s in decimal; extra JSON.
 *   2. the tensors: exactly the float32 parameters param_shapes(cfg) names, with both AdamW
 *      moments of each when optim.t is there; a sinusoidal table no larger than
 *      max(stored parameters, MAX_TABLE). The expected names are generated one at a time and
 *      looked up, so a config claiming 2^60 layers fails at the first missing tensor.
 * Then (pytfm__checkpoint_weights) the parameters are read into one 64-byte aligned allocation,
 * in param_shapes order: the order checkpoint.h draws.
 */
#include "checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "safetensors.h"

enum {
    SHOW = PYTFM__SHOW,
    MAX_TABLE = 1 << 24,  /* sinusoidal floats allowed beyond the stored parameters */
    MAX_STEP_DIGITS = 19, /* a step or optim.t: [0-9]{1,19} */
    CONFIG_SHOWN = 1024   /* show_config's text */
};

#define BAD(st, ...) pytfm__st_fail(st, PYTFM_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

typedef struct checker {
    const pytfm_safetensors *st;
    pytfm_model_config cfg; /* as checked */
    char seed_shown[SHOW];  /* the config's seed, for messages */
    int with_optimizer;     /* optim.t is there */
    int64_t optim_t;
} checker;

static const char *show(pytfm__json v, char *buf) { return pytfm__json_show(v, buf, SHOW); }

/* ---- 1. __metadata__ ---------------------------------------------------------------------- */

/* a non-negative int64 written in ASCII decimal, [0-9]{1,19} */
static pytfm_status count_field(const checker *c, const pytfm__st_meta *m, int64_t *value) {
    char shown[SHOW];
    const size_t n = m->value_len;
    int ok = n >= 1 && n <= MAX_STEP_DIGITS;
    uint64_t v = 0;
    for (size_t i = 0; ok && i < n; i++) {
        ok = m->value[i] >= '0' && m->value[i] <= '9';
        v = v * 10 + (uint64_t)(m->value[i] - '0'); /* 19 digits fit in a uint64_t */
    }
    if (!ok || v > (uint64_t)INT64_MAX)
        return BAD(c->st, "%s is %s, not a non-negative int64", m->key, show(m->raw, shown));
    *value = (int64_t)v;
    return PYTFM_STATUS_OK;
}

/* a metadata value that is a JSON text, checked; *root its value */
static pytfm_status json_field(const checker *c, const pytfm__st_meta *m, pytfm__json *root) {
    pytfm__json_error err;
    const pytfm_status status = pytfm__json_check(m->value, m->value_len, &err);
    if (status == PYTFM_STATUS_OUT_OF_MEMORY)
        return pytfm__st_fail(c->st, status, "cannot check %s: %s", m->key, err.what);
    if (status != PYTFM_STATUS_OK)
        return BAD(c->st, "%s is not valid JSON (%s: byte %zu)", m->key, err.what, err.offset);
    *root = pytfm__json_root(m->value, m->value_len);
    return PYTFM_STATUS_OK;
}

/* GPTConfig's fields: the eight every checkpoint has, then the Llama family's, which a GPT's
 * leaves out (pytfm.nn.config_dict) and which default to 0 when absent */
static const char *const CONFIG_FIELDS[] = {
    "vocab",          "d_model",        "n_layer",   "n_head",     "max_seq",
    "pos",            "tie_embeddings", "seed",      "arch",       "n_kv_head",
    "head_dim",       "d_ff",           "sliding_window",          "norm_eps",
    "rope_theta",     "rope_factor",    "rope_low_freq_factor",    "rope_high_freq_factor",
    "rope_original_max_pos",            "rope_scaling",            "qkv_bias",
    "qk_norm"};
enum {
    N_FIELDS = 22,
    N_REQUIRED = 8,
    POS = 5,
    TIE = 6,
    SEED = 7,
    ARCH = 8,
    FIRST_LLAMA_INT = 9, /* n_kv_head .. sliding_window */
    FIRST_LLAMA_FLOAT = 13, /* norm_eps .. rope_original_max_pos */
    ROPE_SCALING = 19,
    QKV_BIAS = 20,
    QK_NORM = 21
};

/* the ints of the config: sizes within int64, a seed >= 0 of any size */
static pytfm_status check_ints(checker *c, const pytfm__json *values, int64_t *ints) {
    char a[SHOW];
    for (size_t k = 0; k < N_REQUIRED; k++) {
        if (k == POS || k == TIE) continue;
        const pytfm__json v = values[k];
        const pytfm__json_int i = pytfm__json_kind_of(v) == PYTFM__JSON_NUMBER
                                      ? pytfm__json_integer(v)
                                      : (pytfm__json_int){0, 0, 0, 0};
        if (!i.integer)
            return BAD(c->st, "config: GPTConfig.%s must be an int, got %s", CONFIG_FIELDS[k],
                       show(v, a));
        if (k == SEED) {
            if (i.negative && !(i.fits && i.value == 0))
                return BAD(c->st, "config: GPTConfig.seed must be a non-negative int, got %s",
                           show(v, a));
            if (i.fits)
                snprintf(c->seed_shown, sizeof c->seed_shown, "%lld", (long long)i.value);
            else
                show(v, c->seed_shown);
        } else if (!i.fits) { /* the rest is pytfm_model_config_check's */
            return BAD(c->st, "config: GPTConfig.%s must be a positive int (below 2**63), got %s",
                       CONFIG_FIELDS[k], show(v, a));
        }
        ints[k] = i.value;
    }
    return PYTFM_STATUS_OK;
}

/* the Llama family's fields that are there, by GPTConfig's types (an absent one stays 0) */
static pytfm_status check_llama_fields(checker *c, const pytfm__json *values) {
    char a[SHOW];
    pytfm_model_config *g = &c->cfg;
    const pytfm__json arch = values[ARCH];
    if (arch.p) {
        if (pytfm__json_kind_of(arch) != PYTFM__JSON_STRING)
            return BAD(c->st, "config: GPTConfig.arch must be a str, got %s", show(arch, a));
        if (pytfm__json_string_is(arch, "llama"))
            g->arch = PYTFM_ARCH_LLAMA;
        else if (!pytfm__json_string_is(arch, "gpt"))
            return BAD(c->st, "config: GPTConfig.arch must be one of ('gpt', 'llama'), got %s",
                       show(arch, a));
    }
    int64_t *const ints[] = {&g->n_kv_head, &g->head_dim, &g->d_ff, &g->sliding_window};
    for (size_t k = 0; k < 4; k++) {
        const pytfm__json v = values[FIRST_LLAMA_INT + k];
        if (!v.p) continue;
        const pytfm__json_int i = pytfm__json_kind_of(v) == PYTFM__JSON_NUMBER
                                      ? pytfm__json_integer(v)
                                      : (pytfm__json_int){0, 0, 0, 0};
        if (!i.integer)
            return BAD(c->st, "config: GPTConfig.%s must be an int, got %s",
                       CONFIG_FIELDS[FIRST_LLAMA_INT + k], show(v, a));
        if (!i.fits)
            return BAD(c->st, "config: GPTConfig.%s must be below 2**63 in size, got %s",
                       CONFIG_FIELDS[FIRST_LLAMA_INT + k], show(v, a));
        *ints[k] = i.value;
    }
    double *const floats[] = {&g->norm_eps,           &g->rope_theta,
                              &g->rope_factor,        &g->rope_low_freq_factor,
                              &g->rope_high_freq_factor, &g->rope_original_max_pos};
    for (size_t k = 0; k < 6; k++) {
        const pytfm__json v = values[FIRST_LLAMA_FLOAT + k];
        int ok = 0;
        if (!v.p) continue;
        *floats[k] = pytfm__json_number(v, &ok);
        if (!ok)
            return BAD(c->st, "config: GPTConfig.%s must be a float, got %s",
                       CONFIG_FIELDS[FIRST_LLAMA_FLOAT + k], show(v, a));
    }
    const pytfm__json scaling = values[ROPE_SCALING];
    if (scaling.p && pytfm__json_kind_of(scaling) != PYTFM__JSON_NULL) {
        if (!pytfm__json_string_is(scaling, "llama3"))
            return BAD(c->st, "config: GPTConfig.rope_scaling must be one of (None, 'llama3'), "
                       "got %s", show(scaling, a));
        g->rope_scaling = PYTFM_ROPE_SCALING_LLAMA3;
    }
    int32_t *const flags[] = {&g->qkv_bias, &g->qk_norm};
    for (size_t k = 0; k < 2; k++) {
        const pytfm__json v = values[QKV_BIAS + k];
        if (!v.p) continue;
        if (pytfm__json_kind_of(v) != PYTFM__JSON_BOOL)
            return BAD(c->st, "config: GPTConfig.%s must be a bool, got %s",
                       CONFIG_FIELDS[QKV_BIAS + k], show(v, a));
        *flags[k] = v.p[0] == 't';
    }
    return PYTFM_STATUS_OK;
}

/* the config's JSON types and ranges, then its values by pytfm_model_config_check: as
 * GPTConfig(**config) checks it */
static pytfm_status check_config(checker *c, const pytfm__json *values) {
    char a[SHOW];
    int64_t ints[N_FIELDS] = {0};
    PYTFM_TRY(check_ints(c, values, ints));
    const pytfm__json pos = values[POS], tie = values[TIE];
    if (pytfm__json_kind_of(pos) != PYTFM__JSON_STRING)
        return BAD(c->st, "config: GPTConfig.pos must be a str, got %s", show(pos, a));
    if (pytfm__json_string_is(pos, "rope"))
        c->cfg.pos = PYTFM_POS_ROPE;
    else if (pytfm__json_string_is(pos, "sinusoidal"))
        c->cfg.pos = PYTFM_POS_SINUSOIDAL;
    else if (pytfm__json_string_is(pos, "none"))
        c->cfg.pos = PYTFM_POS_NONE;
    else if (pytfm__json_string_is(pos, "learned"))
        c->cfg.pos = PYTFM_POS_LEARNED;
    else
        return BAD(c->st,
                   "config: GPTConfig.pos must be one of ('rope', 'sinusoidal', 'none', "
                   "'learned'), got %s",
                   show(pos, a));
    if (pytfm__json_kind_of(tie) != PYTFM__JSON_BOOL)
        return BAD(c->st, "config: GPTConfig.tie_embeddings must be a bool, got %s", show(tie, a));
    c->cfg.tie_embeddings = tie.p[0] == 't';
    c->cfg.vocab = ints[0];
    c->cfg.d_model = ints[1];
    c->cfg.n_layer = ints[2];
    c->cfg.n_head = ints[3];
    c->cfg.max_seq = ints[4];
    PYTFM_TRY(check_llama_fields(c, values));
    return pytfm__model_config_check_at(&c->cfg, c->st->source, "config: ");
}

/* __metadata__'s pytfm fields */
static pytfm_status check_metadata(checker *c) {
    const pytfm_safetensors *st = c->st;
    const pytfm__st_meta *format = pytfm__st_meta_get(st, "format");
    const pytfm__st_meta *config_text = pytfm__st_meta_get(st, "config");
    if (!format || format->value_len != 5 || memcmp(format->value, "pytfm", 5) || !config_text)
        return BAD(st, "not a pytfm checkpoint (no pytfm config in __metadata__)");
    pytfm__json config, key, value;
    PYTFM_TRY(json_field(c, config_text, &config));
    if (pytfm__json_kind_of(config) != PYTFM__JSON_OBJECT)
        return BAD(st, "config is a JSON %s, not an object",
                   pytfm__json_kind_name(pytfm__json_kind_of(config)));
    pytfm__json values[N_FIELDS] = {{0}};
    pytfm__json unknown = {0};
    pytfm__json_iter it = pytfm__json_iter_of(config);
    while (pytfm__json_next(&it, &key, &value)) {
        size_t k = 0;
        while (k < N_FIELDS && !pytfm__json_string_is(key, CONFIG_FIELDS[k])) k++;
        if (k < N_FIELDS)
            values[k] = value;
        else if (!unknown.p)
            unknown = key;
    }
    for (size_t k = 0; k < N_REQUIRED; k++)
        if (!values[k].p) return BAD(st, "config has no %s", CONFIG_FIELDS[k]);
    char a[SHOW];
    if (unknown.p) return BAD(st, "config has an unknown field %s", show(unknown, a));
    PYTFM_TRY(check_config(c, values));

    const pytfm__st_meta *step = pytfm__st_meta_get(st, "step");
    const pytfm__st_meta *optim_t = pytfm__st_meta_get(st, "optim.t");
    const pytfm__st_meta *extra = pytfm__st_meta_get(st, "extra");
    if (!step) return BAD(st, "__metadata__ has no step");
    PYTFM_TRY(count_field(c, step, &c->cfg.step));
    if (optim_t) {
        PYTFM_TRY(count_field(c, optim_t, &c->optim_t));
        c->with_optimizer = 1;
    }
    if (extra) PYTFM_TRY(json_field(c, extra, &value));
    return PYTFM_STATUS_OK;
}

/* ---- 2. the tensors ----------------------------------------------------------------------- */

/* A parameter the config implies (pytfm_model_param) and its shape multiplied out */
typedef struct expected {
    pytfm_param_info p;
    int64_t shape[2];
    int valid; /* the shape's sizes fit in int64 (else no stored tensor can have them) */
} expected;

/* the parameter after x's (x->p.layer = −1, x->p.part = −1: the first), or 0 past the last */
static int next_expected(const pytfm_model_config *cfg, expected *x) {
    if (!pytfm__param_next(cfg, &x->p)) return 0;
    x->valid = pytfm__param_shape(&x->p, x->shape);
    return 1;
}

/* Python's repr of the finite float d: its shortest round-tripping digits, written fixed for
 * decimal exponents -4 .. 15 (with ".0" when whole), else as 1.5e-05 / 1e+16 */
static const char *float_repr(double d, char *buf, size_t cap) {
    char e[40];
    for (int digits = 0; digits <= 16; digits++) { /* %.*e: digits after the first */
        snprintf(e, sizeof e, "%.*e", digits, d);
        if (strtod(e, NULL) == d) break;
    }
    char *x = strchr(e, 'e');
    const int exp10 = atoi(x + 1);
    *x = 0;
    char mant[24] = "";
    size_t n = 0;
    for (const char *p = e; *p; p++)
        if (*p >= '0' && *p <= '9') mant[n++] = *p; /* the digits, sign and point dropped */
    mant[n] = 0;
    const char *sign = d < 0 ? "-" : "";
    if (exp10 < -4 || exp10 >= 16) {
        snprintf(buf, cap, "%s%c%s%s%se%c%02d", sign, mant[0], n > 1 ? "." : "", mant + 1, "",
                 exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (exp10 < 0) {
        snprintf(buf, cap, "%s0.%.*s%s", sign, -exp10 - 1, "0000", mant);
    } else if ((size_t)exp10 + 1 >= n) {
        snprintf(buf, cap, "%s%s%.*s.0", sign, mant, (int)((size_t)exp10 + 1 - n),
                 "0000000000000000");
    } else {
        snprintf(buf, cap, "%s%.*s.%s", sign, exp10 + 1, mant, mant + exp10 + 1);
    }
    return buf;
}

/* Python's repr of pytfm.nn.config_dict(cfg) */
static const char *show_config(const checker *c, char *buf, size_t cap) {
    static const char *const pos[] = {"rope", "sinusoidal", "none", "learned"};
    const pytfm_model_config *g = &c->cfg;
    int n = snprintf(buf, cap,
                     "{'vocab': %lld, 'd_model': %lld, 'n_layer': %lld, 'n_head': %lld, "
                     "'max_seq': %lld, 'pos': '%s', 'tie_embeddings': %s, 'seed': %s",
                     (long long)g->vocab, (long long)g->d_model, (long long)g->n_layer,
                     (long long)g->n_head, (long long)g->max_seq, pos[g->pos],
                     g->tie_embeddings ? "True" : "False", c->seed_shown);
    if (g->arch == PYTFM_ARCH_LLAMA && n > 0 && (size_t)n < cap) {
        const int saved = errno;
        char f[6][64];
        const double floats[] = {g->norm_eps,           g->rope_theta,
                                 g->rope_factor,        g->rope_low_freq_factor,
                                 g->rope_high_freq_factor, g->rope_original_max_pos};
        for (size_t k = 0; k < 6; k++) float_repr(floats[k], f[k], sizeof f[k]);
        errno = saved;
        n += snprintf(buf + n, cap - (size_t)n,
                      ", 'arch': 'llama', 'n_kv_head': %lld, 'head_dim': %lld, 'd_ff': %lld, "
                      "'norm_eps': %s, 'rope_theta': %s, 'rope_scaling': %s, 'rope_factor': %s, "
                      "'rope_low_freq_factor': %s, 'rope_high_freq_factor': %s, "
                      "'rope_original_max_pos': %s, 'qkv_bias': %s, 'qk_norm': %s, "
                      "'sliding_window': %lld",
                      (long long)g->n_kv_head, (long long)g->head_dim, (long long)g->d_ff, f[0],
                      f[1], g->rope_scaling ? "'llama3'" : "None", f[2], f[3], f[4], f[5],
                      g->qkv_bias ? "True" : "False", g->qk_norm ? "True" : "False",
                      (long long)g->sliding_window);
    }
    if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "}");
    return buf;
}

static const char *show_shape(const expected *x, char *buf, size_t cap) {
    if (!x->valid) return snprintf(buf, cap, "[more than int64 holds]"), buf;
    if (x->p.ndim == 1)
        snprintf(buf, cap, "[%lld]", (long long)x->shape[0]);
    else
        snprintf(buf, cap, "[%lld, %lld]", (long long)x->shape[0], (long long)x->shape[1]);
    return buf;
}

/* the stored tensor key is float32 of x's shape: -> its entry, marked in matched */
static pytfm_status check_one(const checker *c, const char *key, const expected *x,
                              unsigned char *matched, const pytfm__st_entry **found) {
    char config[CONFIG_SHOWN], want[64], got[SHOW];
    const pytfm__st_entry *e = pytfm__st_find(c->st, key, strlen(key));
    if (!e)
        return BAD(c->st, "tensor %s is missing: config %s needs float32%s", key,
                   show_config(c, config, sizeof config), show_shape(x, want, sizeof want));
    int same = x->valid && e->dtype == PYTFM_DTYPE_F32 && e->ndim == x->p.ndim;
    pytfm__json_iter it = pytfm__json_iter_of(e->shape);
    pytfm__json dim;
    for (int d = 0; same && pytfm__json_next(&it, NULL, &dim); d++)
        same = pytfm__json_integer(dim).value == x->shape[d];
    if (!same)
        return BAD(c->st, "%s is %s%s, config %s needs float32%s", key,
                   e->dtype == PYTFM_DTYPE_F32 ? "float32" : "int64", show(e->shape, got),
                   show_config(c, config, sizeof config), show_shape(x, want, sizeof want));
    matched[e - c->st->entries] = 1;
    *found = e;
    return PYTFM_STATUS_OK;
}

/* every expected tensor there; -> the floats of the parameters */
static pytfm_status check_expected(const checker *c, unsigned char *matched, int64_t *count) {
    expected x = {.p = {.layer = -1, .part = -1}};
    *count = 0;
    while (next_expected(&c->cfg, &x)) {
        char key[sizeof x.p.name + 16];
        const pytfm__st_entry *e = NULL;
        PYTFM_TRY(check_one(c, x.p.name, &x, matched, &e));
        for (int m = 0; c->with_optimizer && m < 2; m++) {
            snprintf(key, sizeof key, "optim.%c.%s", m ? 'v' : 'm', x.p.name);
            PYTFM_TRY(check_one(c, key, &x, matched, &e));
        }
        /* its bytes are within the data, so its floats (and their sum) are within int64 */
        int64_t numel = x.shape[0];
        pytfm__mul_within(numel, x.shape[1], INT64_MAX, &numel);
        pytfm__add_within(*count, numel, INT64_MAX, count);
    }
    return PYTFM_STATUS_OK;
}

/* nothing but the expected tensors: the first three others, in header order, named */
static pytfm_status check_unexpected(const checker *c, const unsigned char *matched) {
    const pytfm_safetensors *st = c->st;
    size_t unexpected = 0;
    const pytfm__st_entry *first[3] = {NULL, NULL, NULL};
    for (size_t i = 0; i < st->n_entries; i++) {
        if (matched[i]) continue;
        if (unexpected < 3) first[unexpected] = &st->entries[i];
        unexpected++;
    }
    if (!unexpected) return PYTFM_STATUS_OK;
    char names[3][SHOW], config[CONFIG_SHOWN], more[48] = "";
    if (unexpected > 3) snprintf(more, sizeof more, " and %zu more", unexpected - 3);
    for (int k = 0; k < 3; k++)
        if (first[k]) pytfm__st_show_name(first[k]->name, first[k]->name_len, names[k]);
    return BAD(st, "unexpected tensors %s%s%s%s%s%s (config %s%s)", names[0], first[1] ? ", " : "",
               first[1] ? names[1] : "", first[2] ? ", " : "", first[2] ? names[2] : "", more,
               show_config(c, config, sizeof config), c->with_optimizer ? "" : ", no optim.t");
}

static pytfm_status check_tensors(checker *c) {
    unsigned char *matched = calloc(c->st->n_entries ? c->st->n_entries : 1, 1);
    if (!matched)
        return pytfm__st_fail(c->st, PYTFM_STATUS_OUT_OF_MEMORY, "cannot allocate a tensor list");
    int64_t count = 0;
    pytfm_status status = check_expected(c, matched, &count);
    if (status == PYTFM_STATUS_OK) status = check_unexpected(c, matched);
    free(matched);
    PYTFM_TRY(status);
    if (c->cfg.pos == PYTFM_POS_SINUSOIDAL) {
        int64_t table = 0;
        const int fits = pytfm__mul_within(c->cfg.max_seq, c->cfg.d_model, INT64_MAX, &table);
        if (!fits || table > (count > MAX_TABLE ? count : MAX_TABLE)) {
            char config[CONFIG_SHOWN], size[32] = "more than 2**63";
            if (fits) snprintf(size, sizeof size, "%lld", (long long)table);
            return BAD(c->st,
                       "config %s needs a sinusoidal table of %s floats for %lld stored "
                       "parameters",
                       show_config(c, config, sizeof config), size, (long long)count);
        }
    }
    c->cfg.n_params = count;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_checkpoint_check(const pytfm_safetensors *st, pytfm_checkpoint_info *info) {
    errno = 0; /* no system call here: a failure is the content's */
    PYTFM_CHECK(st != NULL, "%s: st must not be NULL", __func__);
    PYTFM_CHECK(info != NULL, "%s: info must not be NULL", __func__);
    memset(info, 0, sizeof *info);
    checker c = {.st = st};
    PYTFM_TRY(check_metadata(&c));
    PYTFM_TRY(check_tensors(&c));
    info->config = c.cfg;
    info->has_optimizer = c.with_optimizer;
    info->optim_t = c.optim_t;
    return PYTFM_STATUS_OK;
}

/* ---- reading the parameters --------------------------------------------------------------- */

/* the data is little-endian: a big-endian host swaps each float's bytes */
void pytfm__to_host_order(float *p, int64_t count) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    if (first == 1) return;
    unsigned char *b = (unsigned char *)p;
    for (int64_t i = 0; i < count; i++, b += 4) {
        unsigned char t = b[0];
        b[0] = b[3], b[3] = t;
        t = b[1], b[1] = b[2], b[2] = t;
    }
}

/* the checked parameters of cfg, in param_shapes order, into params */
static pytfm_status read_params(const pytfm_safetensors *st, const pytfm_model_config *cfg,
                                float *params) {
    pytfm_param_info x = {.layer = -1, .part = -1};
    int64_t at = 0;
    while (pytfm__param_next(cfg, &x)) {
        const pytfm__st_entry *e = pytfm__st_find(st, x.name, strlen(x.name));
        const int64_t bytes = e->end - e->begin;
        PYTFM_TRY(pytfm_safetensors_read(st, e - st->entries, params + at, bytes));
        at += bytes / (int64_t)sizeof(float);
    }
    pytfm__to_host_order(params, cfg->n_params);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm__checkpoint_weights(const pytfm_safetensors *st, pytfm__weights *w) {
    enum { ALIGN = 64 };
    memset(w, 0, sizeof *w);
    pytfm_checkpoint_info info;
    PYTFM_TRY(pytfm_checkpoint_check(st, &info));
    /* n_params floats lie in the file's data: the product fits */
    const int64_t bytes = info.config.n_params * (int64_t)sizeof(float);
    float *params = (uint64_t)bytes <= SIZE_MAX - ALIGN ? pytfm__weights_alloc((size_t)bytes)
                                                         : NULL;
    if (!params)
        return pytfm__st_fail(st, PYTFM_STATUS_OUT_OF_MEMORY,
                              "cannot allocate %lld bytes of parameters", (long long)bytes);
    const pytfm_status status = read_params(st, &info.config, params);
    if (status != PYTFM_STATUS_OK) {
        free(params);
        return status;
    }
    w->config = info.config;
    w->params = params;
    return PYTFM_STATUS_OK;
}
