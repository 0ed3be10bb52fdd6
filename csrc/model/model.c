/*
 * model.c — pytfm.nn.GPT in C: a model read from a checkpoint, its forward pass, and KV-cache
 * sessions that decode one sequence token by token.
 *
 *   x = wte[tokens] (+ pe[positions]: sinusoidal, or learned wpe)       [N, C], N = B·T
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
 * In PYTFM_PRECISION_BF16 (pytfm_model_set_precision) every product is the one
 * pytfm_linear_forward_ex computes in BF16, which pytfm.nn calls for a model of that precision,
 * so the logits are again Python's bits; the one-row products of decoding read a BF16 copy of
 * each weight matrix (made once, by set_precision) instead of the float32 weights: the same
 * values, half the bytes, and a decoded token reads every weight once.
 *
 * The model is read-only once opened (the parameters, per-layer pointers into them, the
 * position table, the precision and the BF16 copies): any number of threads may share it,
 * as long as none changes its precision meanwhile. Each call allocates its own activations
 * (scratch, freed on every path); a session owns its caches. A model opened on
 * PYTFM_DEVICE_CUDA hands its forwards and sessions to model_cuda.c (the hooks marked "GPU").
 */
#define _POSIX_C_SOURCE 200809L /* stat */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "acts.h"
#include "checkpoint.h"
#include "gpt2.h"
#include "core/checks.h"
#include "model_cuda.h"

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
    /* the BF16 copies of the four weight matrices (PYTFM_PRECISION_BF16), else NULL */
    const uint16_t *attn_w16, *aproj_w16, *fc_w16, *mproj_w16;
} layer;

struct pytfm_model {
    pytfm_model_config config;
    int64_t C, H, D, V;
    float scale;  /* attention's: 1/sqrt(D) in double, then float, as pytfm.ops passes it */
    float *params; /* owned: the reader's allocation, in checkpoint.h's order */
    const float *wte, *ln_f_w, *ln_f_b, *lm_head;
    layer *layers; /* [n_layer] */
    float *pe;        /* [max_seq, C] sinusoidal positions (owned), or NULL */
    const float *wpe; /* [max_seq, C] learned positions (in params), or NULL */
    int32_t precision;          /* a pytfm_precision of the products */
    uint16_t *w16;              /* owned: every BF16 copy in one allocation (BF16), or NULL */
    const uint16_t *lm_head16;  /* the LM head's BF16 copy (BF16), or NULL */
    pytfm__cuda_model *cuda;    /* GPU: the copy on the device (PYTFM_DEVICE_CUDA), or NULL */
};

/* pytfm.nn.sinusoidal_positions(max_seq, C), by the same function (pytfm_sinusoidal_positions,
 * positions.c). The reader has checked its size (a table at most max(n_params, 2^24) floats:
 * pytfm_checkpoint_check) and that C is even. */
static pytfm_status sinusoidal_table(float **pe, const char *func, int64_t max_seq, int64_t C) {
    int64_t count = 0;
    PYTFM_CHECK_COUNT(func, &count, float, max_seq, C);
    float *t = pytfm__scratch(func, count, sizeof(float));
    if (!t) return PYTFM_STATUS_OUT_OF_MEMORY;
    const pytfm_status st = pytfm_sinusoidal_positions(t, max_seq, C);
    if (st != PYTFM_STATUS_OK) {
        free(t);
        return st;
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
    if (c->pos == PYTFM_POS_LEARNED) m->wpe = p, p += c->max_seq * C;
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
    if (device == PYTFM_DEVICE_CUDA) return pytfm__cuda_model_check(func); // GPU
    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                       "%s: device must be PYTFM_DEVICE_CPU (0) or PYTFM_DEVICE_CUDA (1), got %d",
                       func, (int)device);
}

/* The model on the weights a reader returned with status (taken over), on device. */
static pytfm_status open_on(pytfm_model **model, pytfm__weights *w, pytfm_status status,
                            int32_t device, const char *func) {
    PYTFM_TRY(status);
    PYTFM_TRY(build(model, w, func));
    if (device != PYTFM_DEVICE_CUDA) return PYTFM_STATUS_OK;
    pytfm_model *m = *model; // GPU: the parameters and the table copied to the device
    const pytfm_status up = pytfm__cuda_model_open(&m->cuda, &m->config, m->params, m->pe, func);
    if (up != PYTFM_STATUS_OK) {
        pytfm_model_close(m);
        *model = NULL;
    }
    return up;
}

/* The model in the checkpoint open as st (closed here, whatever happens), on device. */
static pytfm_status open_from(pytfm_model **model, pytfm_safetensors *st, int32_t device,
                              const char *func) {
    pytfm__weights w;
    const pytfm_status status = pytfm__checkpoint_weights(st, &w);
    pytfm_safetensors_close(st);
    return open_on(model, &w, status, device, func);
}

pytfm_status pytfm_model_open(pytfm_model **model, const char *path, int32_t device) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    *model = NULL;
    PYTFM_CHECK(path != NULL, "%s: path must not be NULL", __func__);
    PYTFM_TRY(check_device(__func__, device));
    struct stat s;
    if (stat(path, &s) == 0 && S_ISDIR(s.st_mode)) { // a Hugging Face GPT-2 folder
        pytfm__weights w;
        const pytfm_status status = pytfm__gpt2_weights(path, &w);
        return open_on(model, &w, status, device, __func__);
    }
    pytfm_safetensors *st;
    PYTFM_TRY(pytfm_safetensors_open(&st, path));
    return open_from(model, st, device, __func__);
}

pytfm_status pytfm_model_open_memory(pytfm_model **model, const void *data, size_t size,
                                     int32_t device) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    *model = NULL;
    PYTFM_CHECK(data != NULL || size == 0, "%s: data must not be NULL", __func__);
    PYTFM_CHECK(size <= (size_t)INT64_MAX, "%s: size must be below 2**63, got %zu", __func__, size);
    PYTFM_TRY(check_device(__func__, device));
    pytfm_safetensors *st;
    PYTFM_TRY(pytfm_safetensors_open_memory(&st, data, (int64_t)size, "<memory>"));
    return open_from(model, st, device, __func__);
}

pytfm_status pytfm_model_close(pytfm_model *model) {
    if (!model) return PYTFM_STATUS_OK;
    pytfm__cuda_model_close(model->cuda); // GPU
    free(model->w16);
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

/* ---- the precision ----------------------------------------------------------------------- */

/* dst[i] = the top half of src[i] rounded to BF16 (pytfm__bf16_round_bits), i < count */
static uint16_t *to_bf16(uint16_t *dst, const float *src, int64_t count) {
    PYTFM_PARALLEL_FOR_IF(count > 4 * PYTFM_TASK_ELEMS)
    for (int64_t i0 = 0; i0 < count; i0 += PYTFM_TASK_ELEMS)
        for (int64_t i = i0; i < PYTFM_MIN(count, i0 + PYTFM_TASK_ELEMS); i++) {
            uint32_t u;
            memcpy(&u, src + i, sizeof u);
            dst[i] = (uint16_t)(pytfm__bf16_round_bits(u) >> 16);
        }
    return dst + count;
}

pytfm_status pytfm_model_set_precision(pytfm_model *model, int32_t precision) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    PYTFM_TRY(pytfm__check_precision(__func__, precision));
    if (precision == model->precision) return PYTFM_STATUS_OK;
    if (model->cuda) // GPU: the CUDA twins compute in float32 only
        return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                           "%s: a model on PYTFM_DEVICE_CUDA computes in PYTFM_PRECISION_FP32 only",
                           __func__);
    const int64_t C = model->C, L = model->config.n_layer;
    if (precision == PYTFM_PRECISION_FP32) {
        free(model->w16);
        model->w16 = NULL, model->lm_head16 = NULL;
        for (int64_t i = 0; i < L; i++) {
            layer *l = &model->layers[i];
            l->attn_w16 = l->aproj_w16 = l->fc_w16 = l->mproj_w16 = NULL;
        }
        model->precision = precision;
        return PYTFM_STATUS_OK;
    }
    // 12·C² weights a layer and the LM head's V·C: within the parameters the reader checked
    const int64_t count = L * 12 * C * C + model->V * C;
    uint16_t *w16 = pytfm__weights_alloc((size_t)count * sizeof(uint16_t));
    if (!w16)
        return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                           "%s: cannot allocate %lld bytes of BF16 weights", __func__,
                           (long long)count * 2);
    uint16_t *p = w16;
    for (int64_t i = 0; i < L; i++) {
        layer *l = &model->layers[i];
        l->attn_w16 = p, p = to_bf16(p, l->attn_w, 3 * C * C);
        l->aproj_w16 = p, p = to_bf16(p, l->aproj_w, C * C);
        l->fc_w16 = p, p = to_bf16(p, l->fc_w, 4 * C * C);
        l->mproj_w16 = p, p = to_bf16(p, l->mproj_w, 4 * C * C);
    }
    model->lm_head16 = p, p = to_bf16(p, model->lm_head, model->V * C);
    model->w16 = w16;
    model->precision = precision;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_model_get_precision(const pytfm_model *model, int32_t *precision) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    PYTFM_CHECK(precision != NULL, "%s: precision must not be NULL", __func__);
    *precision = model->precision;
    return PYTFM_STATUS_OK;
}

/* y = x·Wᵀ + b over rows, as pytfm.nn.Linear.forward in the model's precision: the public
 * kernel (FP32), or its BF16 form with the BF16 copy w16 for the one-row products */
static pytfm_status linear(const pytfm_model *m, float *y, const float *x, const float *w,
                           const uint16_t *w16, const float *b, int64_t rows, int64_t in,
                           int64_t out) {
    if (m->precision == PYTFM_PRECISION_FP32)
        return pytfm_linear_forward(y, x, w, b, rows, in, out);
    return pytfm__linear_forward_bf16("pytfm_linear_forward_ex", y, x, w, w16, b, rows, in, out);
}

/* ---- the forward pass, shared by pytfm_model_forward and pytfm_session_feed ----------------- */

/* The activations of one call (acts.h): host memory, no copy of the tokens. */
typedef pytfm__acts acts;

/* one block, as pytfm.nn.Block.forward; caches: this layer's k and v caches [max_len, C]
 * (a session), or NULL (the whole sequence) */
static pytfm_status block(const pytfm_model *m, const layer *L, const acts *s, int64_t B,
                          int64_t T, int64_t start, float *k_cache, float *v_cache,
                          int64_t max_len) {
    const int64_t C = m->C, H = m->H, D = m->D, N = B * T;
    // x + attn(ln_1(x))
    PYTFM_TRY(pytfm_layernorm_forward(s->a, s->mean, s->rstd, s->x, L->ln_1_w, L->ln_1_b, N, C,
                                      LN_EPS));
    PYTFM_TRY(linear(m, s->qkv, s->a, L->attn_w, L->attn_w16, L->attn_b, N, C, 3 * C));
    // qkv (B, T, 3, H, D) -> q, k, v (B, T, H, D), q and k rotated: as pytfm.nn does it
    PYTFM_TRY(pytfm_qkv_split_forward(s->q, s->k, s->v, s->qkv, s->pos, B, T, H, D, 0,
                                      ROPE_BASE, m->config.pos == PYTFM_POS_ROPE));
    if (k_cache) { // KVCache.attend: append, then attend to everything cached
        PYTFM_TRY(pytfm_attention_cache_append(k_cache, v_cache, s->k, s->v, 1, T, H, D,
                                               max_len, start));
        PYTFM_TRY(pytfm_attention_decode(s->a, s->lse, s->q, k_cache, v_cache, 1, T, H, D,
                                         max_len, start, m->scale));
    } else {
        PYTFM_TRY(pytfm_attention_forward(s->a, s->lse, s->q, s->k, s->v, B, T, H, D, m->scale,
                                          1));
    }
    float *proj = s->qkv; // [N, C]
    PYTFM_TRY(linear(m, proj, s->a, L->aproj_w, L->aproj_w16, L->aproj_b, N, C, C));
    for (int64_t i = 0; i < N * C; i++) s->x[i] += proj[i];
    // x + mlp(ln_2(x))
    PYTFM_TRY(pytfm_layernorm_forward(s->a, s->mean, s->rstd, s->x, L->ln_2_w, L->ln_2_b, N, C,
                                      LN_EPS));
    PYTFM_TRY(linear(m, s->h, s->a, L->fc_w, L->fc_w16, L->fc_b, N, C, 4 * C));
    PYTFM_TRY(pytfm_gelu_forward(s->h, s->h, N * 4 * C));
    PYTFM_TRY(linear(m, proj, s->h, L->mproj_w, L->mproj_w16, L->mproj_b, N, 4 * C, C));
    for (int64_t i = 0; i < N * C; i++) s->x[i] += proj[i];
    return PYTFM_STATUS_OK;
}

/* pytfm.nn.GPT._logits of tokens [B, T] at positions [start, start + T), the arguments
 * checked: into logits [B, T, vocab] (caches NULL), or, for a session (B = 1, caches: its
 * n_layer pairs of [max_len, C] caches), the logits of the last token into logits [vocab]
 * (NULL: none). s holds the scratch. */
static pytfm_status logits_of(const pytfm_model *m, const acts *s, float *logits,
                              const int64_t *tokens, int64_t B, int64_t T, int64_t start,
                              float *caches, int64_t max_len) {
    const int64_t C = m->C, V = m->V, N = B * T;
    for (int64_t t = 0; t < T; t++) s->pos[t] = start + t;
    PYTFM_TRY(pytfm_embedding_forward(s->x, tokens, m->wte, N, V, C));
    const float *table = m->pe ? m->pe : m->wpe;
    if (table) // x += table[start : start + T], broadcast over the batch
        for (int64_t r = 0; r < N; r++) {
            const float *pe = table + (start + r % T) * C;
            for (int64_t c = 0; c < C; c++) s->x[r * C + c] += pe[c];
        }
    for (int64_t i = 0; i < m->config.n_layer; i++) {
        float *k_cache = caches ? caches + 2 * i * max_len * C : NULL;
        float *v_cache = caches ? k_cache + max_len * C : NULL;
        PYTFM_TRY(block(m, &m->layers[i], s, B, T, start, k_cache, v_cache, max_len));
    }
    if (!logits) return PYTFM_STATUS_OK;
    // the LM head on every row, as Python: one linear over N rows gives each row the bits it
    // gets in GPT.decode, whose product has N rows too
    PYTFM_TRY(pytfm_layernorm_forward(s->a, s->mean, s->rstd, s->x, m->ln_f_w, m->ln_f_b, N, C,
                                      LN_EPS));
    float *out = caches && N > 1 ? s->head : logits;
    PYTFM_TRY(linear(m, out, s->a, m->lm_head, m->lm_head16, NULL, N, C, V));
    if (out != logits) memcpy(logits, out + (N - 1) * V, (size_t)V * sizeof(float));
    return PYTFM_STATUS_OK;
}

/* Allocate the scratch of N = B·T tokens (head: room for every token's logits), run
 * logits_of, free the scratch. */
static pytfm_status run(const char *func, const pytfm_model *m, float *logits,
                        const int64_t *tokens, int64_t B, int64_t T, int64_t start,
                        float *caches, int64_t max_len) {
    const int64_t N = B * T, C = m->C, H = m->H;
    const int head = caches && logits && N > 1;
    int64_t floats = 0;
    if (!pytfm__acts_floats(N, T, C, H, 0, head ? m->V : 0, &floats))
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: %lld tokens need more scratch than memory can address", func,
                           (long long)N);
    float *buf = pytfm__scratch(func, floats, sizeof(float));
    if (!buf) return PYTFM_STATUS_OUT_OF_MEMORY;
    const acts s = pytfm__acts_carve(buf, N, T, C, H, 0, head); // pos at the aligned start
    const pytfm_status st = logits_of(m, &s, logits, tokens, B, T, start, caches, max_len);
    free(buf);
    return st;
}

pytfm_status pytfm_model_forward(const pytfm_model *model, float *logits,
                                 const int64_t *tokens, int64_t B, int64_t T) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    const int64_t vocab = model->V, max_seq = model->config.max_seq;
    PYTFM_CHECK_MIN(B, 0);
    PYTFM_CHECK(T >= 1 && T <= max_seq, "%s: T must be in [1, max_seq = %lld], got %lld",
                __func__, (long long)max_seq, (long long)T);
    int64_t n_logits = 0, n_tokens = 0;
    PYTFM_CHECK_COUNT(__func__, &n_logits, float, B, T, vocab);
    PYTFM_CHECK_COUNT(__func__, &n_tokens, int64_t, B, T);
    PYTFM_CHECK_PTR(logits, n_logits);
    PYTFM_CHECK_PTR(tokens, n_tokens);
    PYTFM_CHECK_DISJOINT(__func__, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,
                         PYTFM_SPAN(logits, n_logits, float),
                         PYTFM_SPAN(tokens, n_tokens, int64_t));
    PYTFM_TRY(pytfm__check_indices(__func__, "tokens", tokens, n_tokens, vocab, 0, 0));
    if (B == 0) return PYTFM_STATUS_OK;
    if (model->cuda) return pytfm__cuda_model_forward(model->cuda, logits, tokens, B, T, __func__);
    return run(__func__, model, logits, tokens, B, T, 0, NULL, 0);
}

/* ---- sessions ------------------------------------------------------------------------------ */

struct pytfm_session {
    const pytfm_model *model;
    int64_t max_len;
    int64_t length; /* positions [0, length) of the caches hold the tokens fed */
    float *caches;  /* n_layer × (k, v), each [max_len, C] = [1, max_len, H, D] */
    pytfm__cuda_session *cuda; /* GPU: the caches on the device instead (caches NULL) */
};

pytfm_status pytfm_session_open(pytfm_session **session, const pytfm_model *model,
                                int64_t max_len) {
    PYTFM_CHECK(session != NULL, "%s: session must not be NULL", __func__);
    *session = NULL;
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    const int64_t max_seq = model->config.max_seq;
    PYTFM_CHECK(max_len >= 0 && max_len <= max_seq,
                "%s: max_len must be in [1, max_seq = %lld], or 0 for max_seq; got %lld",
                __func__, (long long)max_seq, (long long)max_len);
    if (max_len == 0) max_len = max_seq;
    const int64_t n_layer = model->config.n_layer, C = model->C;
    int64_t count = 0;
    PYTFM_CHECK_COUNT(__func__, &count, float, n_layer, 2, max_len, C);
    pytfm_session *s = calloc(1, sizeof *s);
    if (s && model->cuda) { // GPU
        const pytfm_status st = pytfm__cuda_session_open(&s->cuda, model->cuda, max_len, __func__);
        if (st != PYTFM_STATUS_OK) {
            free(s);
            return st;
        }
    }
    float *caches = s && !s->cuda ? pytfm__scratch(__func__, count, sizeof(float)) : NULL;
    if (!caches && !(s && s->cuda)) {
        free(s);
        return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                           "%s: cannot allocate KV caches of %lld positions (%lld floats)",
                           __func__, (long long)max_len, (long long)count);
    }
    s->model = model;
    s->max_len = max_len;
    s->caches = caches;
    *session = s;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_session_close(pytfm_session *session) {
    if (!session) return PYTFM_STATUS_OK;
    pytfm__cuda_session_close(session->cuda); // GPU
    free(session->caches);
    free(session);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_session_feed(pytfm_session *session, float *logits, const int64_t *tokens,
                                int64_t n) {
    PYTFM_CHECK(session != NULL, "%s: session must not be NULL", __func__);
    const pytfm_model *m = session->model;
    const int64_t vocab = m->V, length = session->length, max_len = session->max_len;
    PYTFM_CHECK(n >= 1, "%s: n must be >= 1, got %lld", __func__, (long long)n);
    PYTFM_CHECK(n <= max_len - length,
                "%s: n = %lld tokens do not fit: the session holds %lld of max_len = %lld "
                "(pytfm_session_reset, or open a longer session)",
                __func__, (long long)n, (long long)length, (long long)max_len);
    PYTFM_CHECK(tokens != NULL, "%s: tokens must not be NULL", __func__);
    PYTFM_CHECK_DISJOINT(__func__, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,
                         PYTFM_SPAN(logits, logits ? vocab : 0, float),
                         PYTFM_SPAN(tokens, n, int64_t));
    PYTFM_TRY(pytfm__check_indices(__func__, "tokens", tokens, n, vocab, 0, 0));
    PYTFM_TRY(session->cuda // GPU
                  ? pytfm__cuda_session_feed(session->cuda, logits, tokens, n, length, __func__)
                  : run(__func__, m, logits, tokens, 1, n, length, session->caches, max_len));
    session->length = length + n;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_session_length(const pytfm_session *session, int64_t *length) {
    PYTFM_CHECK(session != NULL, "%s: session must not be NULL", __func__);
    PYTFM_CHECK(length != NULL, "%s: length must not be NULL", __func__);
    *length = session->length;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_session_reset(pytfm_session *session) {
    PYTFM_CHECK(session != NULL, "%s: session must not be NULL", __func__);
    session->length = 0;
    return PYTFM_STATUS_OK;
}
