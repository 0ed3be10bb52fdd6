/*
 * gpt2.c — a Hugging Face GPT-2 folder (config.json + model.safetensors, or the shards that
 * model.safetensors.index.json lists), read without trusting a byte of it: the one home of
 * the folder's rules (pytfm/gpt2.py maps what this returns). Checked in this order:
 *   1. the folder is one; config.json (at most 16 MiB, strict JSON, an object):
 *      GPT2Config's sizes, the fields that change the maths at GPT-2's values, the ignored
 *      ones (IGNORED), nothing else;
 *   2. the weight files (hf_folder.c, which the Llama-family reader shares):
 *      model.safetensors, else the index's weight_map (file names of the folder, each a
 *      .safetensors), each file's header checked by safetensors.c, every tensor in the file
 *      the index names and in no other;
 *   3. the tensors against the config: each parameter stored under GPT2LMHeadModel's name
 *      (transformer.h.0.attn.c_attn.weight) or GPT2Model's (h.0.attn.c_attn.weight), one
 *      layout per folder, float32 of the shape the config implies (the Conv1D weights [in,
 *      out]); by rule the buffers h.N.attn.bias [1, 1, P, P] and h.N.attn.masked_bias [] and
 *      a tied model's lm_head.weight [V, C]; nothing else.
 * All of that reads headers only: nothing proportional to the parameters is allocated before
 * it passes. pytfm_gpt2_read then copies the parameters with pread (safetensors.c: a file that
 * shrinks is an error, never a SIGBUS), transposing each Conv1D weight once into pytfm's
 * [out, in], and checks a stored tied head against the embedding.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "core/internal.h"
#include "gpt2.h"
#include "hf_folder.h"
#include "safetensors.h"

enum {
    MAX_NAME = 96, /* bytes of an expected tensor's name, NUL included */
    SHOW = PYTFM__SHOW,
    BLOCK = 32     /* rows of a Conv1D weight read and transposed at once */
};

static const char KIND[] = "GPT-2";

#define BAD PYTFM__HF_BAD
#define NO_MEMORY PYTFM__HF_NO_MEMORY

/* config.json fields that do not change the forward pass: ignored (pytfm.gpt2.IGNORED), with
 * hf_folder's list of PretrainedConfig's */
static const char *const IGNORED[] = {
    "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout", /* dropout */
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_hidden_size", /* GPT2DoubleHeadsModel's head */
    "architectures",
    "reorder_and_upcast_attn", /* the order of float32 operations within attention */
    NULL};

/* GPT2Config's sizes, in the order they are checked */
static const char *const SIZES[] = {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head"};
enum { N_SIZES = 5 };

/* the fields that change the maths, in the order they are checked: GPT-2's value (Python's
 * repr, for messages) */
static const char *const MATHS[][2] = {
    {"activation_function", "'gelu_new'"},
    {"n_inner", "None"},
    {"layer_norm_epsilon", "1e-05"},
    {"scale_attn_weights", "True"},
    {"scale_attn_by_inverse_layer_idx", "False"},
    {"add_cross_attention", "False"},
    {"pruned_heads", "{}"},
    {"model_type", "'gpt2'"},
    {"tie_word_embeddings", "True"}};
enum { N_MATHS = 9, TIE = 8 };

const char *pytfm_gpt2_ignored_field(int64_t index) {
    const int64_t own = (int64_t)(sizeof IGNORED / sizeof *IGNORED) - 1;
    if (index >= 0 && index < own) return IGNORED[index];
    return index >= own ? pytfm__hf_common_ignored(index - own) : NULL;
}

/* ---- 1. config.json ------------------------------------------------------------------------ */

/* whether field k of MATHS has an allowed value v; n_embd for n_inner */
static int maths_ok(size_t k, pytfm__json v, int64_t n_embd) {
    const pytfm__json_kind kind = pytfm__json_kind_of(v);
    int ok = 0;
    switch (k) {
    case 0: /* gelu_pytorch_tanh is the same function */
        return pytfm__json_string_is(v, "gelu_new") || pytfm__json_string_is(v, "gelu_pytorch_tanh");
    case 1: {
        if (kind == PYTFM__JSON_NULL) return 1;
        const pytfm__json_int i =
            pytfm__hf_is_int(v) ? pytfm__json_integer(v) : (pytfm__json_int){0};
        int64_t four = 0;
        return i.integer && i.fits && pytfm__mul_within(4, n_embd, INT64_MAX, &four) &&
               i.value == four;
    }
    case 2: {
        const double d = pytfm__json_number(v, &ok);
        return ok && d == PYTFM_LAYERNORM_EPS; // the model's
    }
    case 3: return kind == PYTFM__JSON_BOOL && v.p[0] == 't';
    case 4:
    case 5: return kind == PYTFM__JSON_BOOL && v.p[0] == 'f';
    case 6: return kind == PYTFM__JSON_NULL || (kind == PYTFM__JSON_OBJECT && !pytfm__json_count(v));
    case 7: return pytfm__json_string_is(v, "gpt2");
    default: return kind == PYTFM__JSON_BOOL;
    }
}

/* a key the rules know: a size, n_ctx, a maths field, an ignored one */
static int known_key(pytfm__json key) {
    if (pytfm__json_string_is(key, "n_ctx")) return 1;
    for (size_t k = 0; k < N_SIZES; k++)
        if (pytfm__json_string_is(key, SIZES[k])) return 1;
    for (size_t k = 0; k < N_MATHS; k++)
        if (pytfm__json_string_is(key, MATHS[k][0])) return 1;
    for (int64_t k = 0; pytfm_gpt2_ignored_field(k); k++)
        if (pytfm__json_string_is(key, pytfm_gpt2_ignored_field(k))) return 1;
    return 0;
}

pytfm_status pytfm_gpt2_config_parse(pytfm_model_config *config, const char *text, int64_t size,
                                     const char *source) {
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
    const pytfm__json c = pytfm__json_root(text, (size_t)size);
    if (pytfm__json_kind_of(c) != PYTFM__JSON_OBJECT)
        return BAD(source, "a JSON %s, not an object",
                   pytfm__json_kind_name(pytfm__json_kind_of(c)));
    char a[SHOW], b[SHOW];
    int64_t sizes[N_SIZES];
    for (size_t k = 0; k < N_SIZES; k++) {
        const pytfm__json v = pytfm__hf_member(c, SIZES[k]);
        if (!v.p) return BAD(source, "has no %s", SIZES[k]);
        const pytfm__json_int i =
            pytfm__hf_is_int(v) ? pytfm__json_integer(v) : (pytfm__json_int){0};
        if (!i.integer || !i.fits || i.value < 1)
            return BAD(source, "%s must be a positive int, got %s", SIZES[k],
                       pytfm__hf_py_repr(v, a));
        sizes[k] = i.value;
    }
    const pytfm__json n_ctx = pytfm__hf_member(c, "n_ctx");
    if (n_ctx.p) { /* Python's !=: 40.0 equals 40 */
        int ok = 0;
        const pytfm__json_int i =
            pytfm__hf_is_int(n_ctx) ? pytfm__json_integer(n_ctx) : (pytfm__json_int){0};
        const int same = i.integer ? i.fits && i.value == sizes[1]
                                   : pytfm__json_number(n_ctx, &ok) == (double)sizes[1] && ok;
        if (!same)
            return BAD(source, "n_ctx (%s) and n_positions (%lld) disagree",
                       pytfm__hf_py_repr(n_ctx, a),
                       (long long)sizes[1]);
    }
    for (size_t k = 0; k < N_MATHS; k++) {
        const pytfm__json v = pytfm__hf_member(c, MATHS[k][0]);
        if (v.p && !maths_ok(k, v, sizes[2]))
            return BAD(source, "%s is %s: pytfm runs GPT-2's %s only%s", MATHS[k][0],
                       pytfm__hf_py_repr(v, a), MATHS[k][1],
                       k == TIE ? " (or false, with lm_head.weight stored)" : "");
    }
    pytfm__json unknown;
    PYTFM_TRY(pytfm__hf_unknown_key(c, source, known_key, &unknown));
    if (unknown.p)
        return BAD(source,
                   "unknown field %s: pytfm cannot tell whether it changes the model (it ignores "
                   "only the fields pytfm.gpt2.IGNORED lists)",
                   pytfm__hf_py_repr(unknown, b));
    const pytfm__json tie = pytfm__hf_member(c, "tie_word_embeddings");
    const pytfm_model_config parsed = {.vocab = sizes[0],
                                       .max_seq = sizes[1],
                                       .d_model = sizes[2],
                                       .n_layer = sizes[3],
                                       .n_head = sizes[4],
                                       .pos = PYTFM_POS_LEARNED,
                                       .tie_embeddings = !tie.p || tie.p[0] == 't'};
    PYTFM_TRY(pytfm__model_config_check_at(&parsed, source, ""));
    *config = parsed;
    return PYTFM_STATUS_OK;
}

/* folder/config.json, read and parsed */
static pytfm_status read_config(int dir, const char *folder, pytfm_model_config *config) {
    char *text, *path;
    size_t size;
    pytfm_status status = pytfm__hf_read_config(dir, folder, KIND, &text, &size, &path);
    if (status == PYTFM_STATUS_OK)
        status = pytfm_gpt2_config_parse(config, text, (int64_t)size, path);
    free(text);
    free(path);
    return status;
}

pytfm_status pytfm_gpt2_read_config(pytfm_model_config *config, const char *folder) {
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

/* ---- 2. the weight files (hf_folder.c) ----------------------------------------------------- */

struct pytfm_gpt2 {
    pytfm_model_config config;
    pytfm__hf_files h;               /* the weight files; h.source names them in messages */
    int prefixed;                    /* GPT2LMHeadModel's names (transformer.) */
    const pytfm__st_entry *lm_head;  /* a tied model's stored head, or NULL */
    size_t lm_head_file;
};

/* ---- 3. the tensors -------------------------------------------------------------------------- */

/* One expected parameter, in the layout's order (pytfm_model_param, walked in p): its name as
 * stored and its stored shape, each size factor·base (the product may not fit in int64). */
typedef struct want {
    pytfm_param_info p;
    char name[MAX_NAME];
    int ndim;
    int64_t base[2];
    int factor[2];
    int conv; /* a Conv1D weight: stored [in, out], pytfm's [out, in] */
} want;

/* the parameter after x's (x->p.layer = −1, x->p.part = −1: the first), or 0 past the last */
static int next_want(const pytfm_gpt2 *g, want *x) {
    if (!pytfm__param_next(&g->config, &x->p)) return 0;
    const pytfm_param_info *p = &x->p;
    const size_t skip = strlen("transformer.");
    const int strip = !g->prefixed && !strncmp(p->name, "transformer.", skip);
    snprintf(x->name, sizeof x->name, "%s", p->name + (strip ? skip : 0));
    x->ndim = p->ndim;
    x->conv = p->ndim == 2 && p->layer >= 0 && p->layer < g->config.n_layer; /* a block's */
    for (int d = 0; d < 2; d++)
        x->base[d] = p->base[d ^ x->conv], x->factor[d] = p->factor[d ^ x->conv];
    return 1;
}

/* factor·base in decimal, exactly (it may pass int64) */
static void show_product(int64_t base, int factor, char *out, size_t cap) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%lld", (long long)base), carry = 0;
    char result[40];
    int r = (int)sizeof result - 1;
    result[r] = 0;
    for (int i = n - 1; i >= 0 || carry; i--) {
        const int d = (i >= 0 ? digits[i] - '0' : 0) * factor + carry;
        result[--r] = (char)('0' + d % 10);
        carry = d / 10;
    }
    snprintf(out, cap, "%s", result + r);
}

static const char *show_want(const want *x, char *buf, size_t cap) {
    char a[40], b[40];
    show_product(x->base[0], x->factor[0], a, sizeof a);
    if (x->ndim == 1) {
        snprintf(buf, cap, "[%s]", a);
    } else {
        show_product(x->base[1], x->factor[1], b, sizeof b);
        snprintf(buf, cap, "[%s, %s]", a, b);
    }
    return buf;
}

/* the stored entry e (of file f) is float32 of x's shape */
static pytfm_status expect(const pytfm_gpt2 *g, const pytfm__st_entry *e, size_t f,
                           const want *x) {
    pytfm_tensor_info t;
    PYTFM_TRY(pytfm_safetensors_tensor(g->h.files[f].st, e - g->h.files[f].st->entries, &t));
    int same = t.dtype == PYTFM_DTYPE_F32 && t.ndim == x->ndim;
    for (int d = 0; same && d < t.ndim; d++) {
        int64_t size = 0;
        same = pytfm__mul_within(x->base[d], x->factor[d], INT64_MAX, &size) && size == t.shape[d];
    }
    if (same) return PYTFM_STATUS_OK;
    char name[SHOW], got[256], need[96];
    return BAD(g->h.source, "%s is %s%s, config.json needs float32%s",
               pytfm__hf_show_name(e->name, e->name_len, name),
               t.dtype == PYTFM_DTYPE_F32 ? "float32" : "int64",
               pytfm__hf_show_shape(&t, got, sizeof got),
               show_want(x, need, sizeof need));
}

/* every parameter there, of its shape; each marked in used[f][i] */
static pytfm_status check_expected(pytfm_gpt2 *g, unsigned char **used) {
    want x = {.p = {.layer = -1, .part = -1}};
    int64_t count = 0;
    const int64_t L = g->config.n_layer;
    while (next_want(g, &x)) {
        size_t f = 0;
        const pytfm__st_entry *e = pytfm__hf_find(&g->h, x.name, strlen(x.name), &f);
        char need[96];
        if (!e)
            return BAD(g->h.source,
                       "tensor %s is missing: config.json's {'n_layer': %lld, 'n_embd': %lld} "
                       "needs float32%s",
                       x.name, (long long)L, (long long)g->config.d_model,
                       show_want(&x, need, sizeof need));
        PYTFM_TRY(expect(g, e, f, &x));
        used[f][e - g->h.files[f].st->entries] = 1;
        /* its bytes lie in the file: its floats, and their sum, fit in int64 */
        count += (e->end - e->begin) / (int64_t)sizeof(float);
    }
    g->config.n_params = count;
    return PYTFM_STATUS_OK;
}

/* rest is "h.<i>.<tail>" with i written as Python's str(int) writes it and i < n_layer */
static int layer_buffer(const char *rest, size_t n, const char *tail, int64_t n_layer) {
    if (n < 3 || memcmp(rest, "h.", 2)) return 0;
    size_t i = 2;
    int64_t layer = 0;
    while (i < n && rest[i] >= '0' && rest[i] <= '9' && i < 20) { /* 18 digits: no overflow */
        layer = layer * 10 + (rest[i] - '0');
        i++;
    }
    if (i == 2 || (rest[2] == '0' && i > 3) || layer >= n_layer) return 0;
    return n - i == strlen(tail) && !memcmp(rest + i, tail, n - i);
}

/* what is not a parameter: the buffers by rule, a tied head, else refused */
static pytfm_status check_others(pytfm_gpt2 *g, unsigned char **used) {
    const pytfm_model_config *c = &g->config;
    const size_t skip = g->prefixed ? strlen("transformer.") : 0;
    for (size_t f = 0; f < g->h.n_files; f++) {
        const pytfm_safetensors *st = g->h.files[f].st;
        for (size_t i = 0; i < st->n_entries; i++) {
            if (used[f][i]) continue;
            const pytfm__st_entry *e = &st->entries[i];
            const int in_prefix = !skip || (e->name_len >= skip &&
                                            !memcmp(e->name, "transformer.", skip));
            const char *rest = e->name + skip;
            const size_t n = e->name_len - skip;
            pytfm_tensor_info t;
            PYTFM_TRY(pytfm_safetensors_tensor(st, (int64_t)i, &t));
            char name[SHOW], got[256];
            const int64_t P = c->max_seq;
            if (in_prefix && layer_buffer(rest, n, ".attn.bias", c->n_layer)) {
                if (t.dtype != PYTFM_DTYPE_F32 || t.ndim != 4 || t.shape[0] != 1 ||
                    t.shape[1] != 1 || t.shape[2] != P || t.shape[3] != P)
                    return BAD(g->h.source,
                               "%s is %s%s, config.json needs float32[1, 1, %lld, %lld]",
                               pytfm__hf_show_name(e->name, e->name_len, name),
                               t.dtype == PYTFM_DTYPE_F32 ? "float32" : "int64",
                               pytfm__hf_show_shape(&t, got, sizeof got), (long long)P,
                               (long long)P);
            } else if (in_prefix && layer_buffer(rest, n, ".attn.masked_bias", c->n_layer)) {
                if (t.dtype != PYTFM_DTYPE_F32 || t.ndim != 0)
                    return BAD(g->h.source, "%s is %s%s, config.json needs float32[]",
                               pytfm__hf_show_name(e->name, e->name_len, name),
                               t.dtype == PYTFM_DTYPE_F32 ? "float32" : "int64",
                               pytfm__hf_show_shape(&t, got, sizeof got));
            } else if (c->tie_embeddings && e->name_len == 14 &&
                       !memcmp(e->name, "lm_head.weight", 14)) {
                want head = {.ndim = 2, .base = {c->vocab, c->d_model}, .factor = {1, 1}};
                PYTFM_TRY(expect(g, e, f, &head));
                g->lm_head = e, g->lm_head_file = f;
            } else {
                return BAD(g->h.source, "unexpected tensor %s (for a %lld-layer GPT-2, names %sh.N..., %s)",
                           pytfm__hf_show_name(e->name, e->name_len, name), (long long)c->n_layer,
                           g->prefixed ? "transformer." : "without a prefix, ",
                           c->tie_embeddings ? "tied" : "lm_head.weight");
            }
        }
    }
    return PYTFM_STATUS_OK;
}

static pytfm_status check_tensors(pytfm_gpt2 *g) {
    for (size_t f = 0; f < g->h.n_files && !g->prefixed; f++) {
        const pytfm_safetensors *st = g->h.files[f].st;
        for (size_t i = 0; i < st->n_entries && !g->prefixed; i++)
            g->prefixed = st->entries[i].name_len >= 12 &&
                          !memcmp(st->entries[i].name, "transformer.", 12);
    }
    unsigned char **used = pytfm__hf_new_used(&g->h);
    if (!used) return PYTFM_STATUS_OUT_OF_MEMORY;
    pytfm_status status = check_expected(g, used);
    if (status == PYTFM_STATUS_OK) status = check_others(g, used);
    pytfm__hf_free_used(&g->h, used);
    return status;
}

/* ---- the handle ------------------------------------------------------------------------------ */

/* one try of pytfm_gpt2_open, on the folder open as dir: *(pytfm_gpt2 **)out */
static pytfm_status open_in(void *out, int dir, const char *folder) {
    pytfm_gpt2 *g = calloc(1, sizeof *g);
    if (!g) return NO_MEMORY(folder, "cannot allocate a GPT-2 folder's handle");
    pytfm_status status = read_config(dir, folder, &g->config);
    if (status == PYTFM_STATUS_OK) status = pytfm__hf_open_files(&g->h, dir, folder, 0);
    if (status == PYTFM_STATUS_OK) status = check_tensors(g);
    if (status != PYTFM_STATUS_OK) {
        const int e = errno; /* a system call's error number survives the close */
        pytfm_gpt2_close(g);
        errno = e;
        return status;
    }
    *(pytfm_gpt2 **)out = g;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_gpt2_open(pytfm_gpt2 **gpt2, const char *folder) {
    PYTFM_CHECK(gpt2 != NULL, "%s: gpt2 must not be NULL", __func__);
    *gpt2 = NULL;
    PYTFM_CHECK(folder != NULL, "%s: folder must not be NULL", __func__);
    return pytfm__hf_open_retry(folder, KIND, open_in, gpt2);
}

pytfm_status pytfm_gpt2_close(pytfm_gpt2 *gpt2) {
    if (!gpt2) return PYTFM_STATUS_OK;
    pytfm__hf_close_files(&gpt2->h);
    free(gpt2);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_gpt2_get_config(const pytfm_gpt2 *gpt2, pytfm_model_config *config) {
    PYTFM_CHECK(gpt2 != NULL, "%s: gpt2 must not be NULL", __func__);
    PYTFM_CHECK(config != NULL, "%s: config must not be NULL", __func__);
    *config = gpt2->config;
    return PYTFM_STATUS_OK;
}

/* dst[c·rows + r] = src[(r − r0)·cols + c] for the rows [r0, r0 + n) of a [rows, cols]
 * matrix held in src: that band of rows transposed into dst [cols, rows] */
static void transpose_band(float *dst, const float *src, int64_t r0, int64_t n, int64_t rows,
                           int64_t cols) {
    for (int64_t c0 = 0; c0 < cols; c0 += BLOCK)
        for (int64_t c = c0; c < PYTFM_MIN(cols, c0 + BLOCK); c++)
            for (int64_t r = 0; r < n; r++) dst[c * rows + r0 + r] = src[r * cols + c];
}

/* Conv1D weight e ([rows, cols] = [in, out] stored) into dst [cols, rows]: a band of BLOCK
 * rows at a time read into buf (BLOCK·cols floats, so that the band stays in cache while it
 * is transposed), then transposed into place: one pass over the weight, not a copy and then
 * another. On the calling thread: reading is memory-bound (the copy out of the page cache and
 * the first touch of the parameters' pages), which more threads do not speed up on a busy
 * machine. */
static pytfm_status read_transposed(const pytfm_gpt2 *g, size_t f, const pytfm__st_entry *e,
                                    float *dst, float *buf, int64_t rows, int64_t cols) {
    const pytfm_safetensors *st = g->h.files[f].st;
    for (int64_t r0 = 0; r0 < rows; r0 += BLOCK) {
        const int64_t n = PYTFM_MIN(BLOCK, rows - r0), floats = n * cols;
        PYTFM_TRY(pytfm__st_read_part(st, e, r0 * cols * (int64_t)sizeof(float), buf,
                                      floats * (int64_t)sizeof(float)));
        pytfm__to_host_order(buf, floats);
        transpose_band(dst, buf, r0, n, rows, cols);
    }
    return PYTFM_STATUS_OK;
}

/* the entry's floats into out, in host order */
static pytfm_status read_floats(const pytfm_gpt2 *g, size_t f, const pytfm__st_entry *e,
                                float *out) {
    const pytfm_safetensors *st = g->h.files[f].st;
    const int64_t bytes = e->end - e->begin;
    PYTFM_TRY(pytfm__st_read_part(st, e, 0, out, bytes));
    pytfm__to_host_order(out, bytes / (int64_t)sizeof(float));
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_gpt2_read(const pytfm_gpt2 *gpt2, float *params, int64_t count) {
    PYTFM_CHECK(gpt2 != NULL, "%s: gpt2 must not be NULL", __func__);
    PYTFM_CHECK(params != NULL, "%s: params must not be NULL", __func__);
    PYTFM_CHECK(count == gpt2->config.n_params,
                "%s: count must be the config's n_params (%lld), got %lld", __func__,
                (long long)gpt2->config.n_params, (long long)count);
    const int64_t C = gpt2->config.d_model, V = gpt2->config.vocab;
    /* a band of BLOCK rows of the widest Conv1D weight, BLOCK·4C floats (C is within the
     * file); a stored tied head is compared a band at a time too */
    const int64_t scratch = BLOCK * 4 * C;
    float *buf = pytfm__scratch(__func__, scratch, sizeof(float));
    if (!buf) return PYTFM_STATUS_OUT_OF_MEMORY;
    pytfm_status status = PYTFM_STATUS_OK;
    want x = {.p = {.layer = -1, .part = -1}};
    int64_t at = 0;
    while (status == PYTFM_STATUS_OK && next_want(gpt2, &x)) {
        size_t f = 0;
        const pytfm__st_entry *e = pytfm__hf_find(&gpt2->h, x.name, strlen(x.name), &f);
        const int64_t floats = (e->end - e->begin) / (int64_t)sizeof(float);
        if (x.conv) {
            status = read_transposed(gpt2, f, e, params + at, buf, x.factor[0] * C,
                                     x.factor[1] * C);
        } else {
            status = read_floats(gpt2, f, e, params + at);
        }
        at += floats;
    }
    const pytfm_safetensors *head = gpt2->lm_head ? gpt2->h.files[gpt2->lm_head_file].st : NULL;
    for (int64_t i0 = 0; head && status == PYTFM_STATUS_OK && i0 < V * C; i0 += scratch) {
        const int64_t n = PYTFM_MIN(scratch, V * C - i0);
        status = pytfm__st_read_part(head, gpt2->lm_head, i0 * (int64_t)sizeof(float), buf,
                                     n * (int64_t)sizeof(float));
        if (status == PYTFM_STATUS_OK) pytfm__to_host_order(buf, n);
        for (int64_t i = 0; status == PYTFM_STATUS_OK && i < n; i++)
            if (buf[i] != params[i0 + i]) /* wte is first; as NumPy's array_equal compares */
                status = BAD(gpt2->h.files[gpt2->lm_head_file].path,
                             "lm_head.weight differs from the embedding, but config.json ties "
                             "them (tie_word_embeddings)");
    }
    free(buf);
    if (status != PYTFM_STATUS_OK) return status;
    errno = 0;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm__gpt2_weights(const char *folder, pytfm__weights *w) {
    memset(w, 0, sizeof *w);
    pytfm_gpt2 *g;
    PYTFM_TRY(pytfm_gpt2_open(&g, folder));
    const int64_t count = g->config.n_params;
    // in huge pages where granted (core/weights.c); count floats lie in the file: no overflow
    float *params = pytfm__weights_alloc((size_t)count * sizeof(float));
    pytfm_status status =
        params ? pytfm_gpt2_read(g, params, count) : pytfm__hf_no_memory(&g->h, count);
    if (status == PYTFM_STATUS_OK) {
        w->config = g->config;
        w->params = params;
    } else {
        free(params);
    }
    pytfm_gpt2_close(g);
    return status;
}
