/*
 * model.c — pytfm.nn.GPT in C: a model read from a checkpoint, its forward pass, and KV-cache
 * sessions that decode one sequence token by token, on the CPU or on the GPU.
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
 * The ops run through the table of the model's device (model_device.h): the CPU's (model_cpu.c),
 * the public kernels on host memory; on PYTFM_DEVICE_CUDA the GPU's (model_cuda.c), their CUDA
 * twins on device memory, the parameters copied there once, at open, the tokens copied in and
 * the logits back on each call (each forward on a stream of its own, a session on its own).
 *
 * In PYTFM_PRECISION_BF16 (pytfm_model_set_precision, the CPU only) every product is the one
 * pytfm_linear_forward_ex computes in BF16, which pytfm.nn calls for a model of that precision,
 * so the logits are again Python's bits; the one-row products of decoding read a BF16 copy of
 * each weight matrix (made once, by set_precision) instead of the float32 weights: the same
 * values, half the bytes, and a decoded token reads every weight once.
 *
 * The model is read-only once opened (the parameters, per-layer pointers into them, the
 * position table, the precision and the BF16 copies): any number of threads may share it,
 * as long as none changes its precision meanwhile. Each call allocates its own activations
 * (scratch, freed on every path); a session owns its caches.
 */
#define _POSIX_C_SOURCE 200809L /* stat */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "gpt2.h"
#include "core/checks.h"
#include "model_device.h"

/* ---- the model ------------------------------------------------------------------------------ */

/* one block's parameters: pointers into the model's one allocation, on its device */
typedef struct layer {
    union {
        const float *part[PYTFM__LAYER_PARTS]; /* in the layout's order (pytfm_model_param) */
        struct {
            const float *ln_1_w, *ln_1_b;
            const float *attn_w, *attn_b;   /* c_attn [3C, C], [3C] */
            const float *aproj_w, *aproj_b; /* attn.c_proj [C, C], [C] */
            const float *ln_2_w, *ln_2_b;
            const float *fc_w, *fc_b;       /* mlp.c_fc [4C, C], [4C] */
            const float *mproj_w, *mproj_b; /* mlp.c_proj [C, 4C], [C] */
        };
    };
    /* the BF16 copies of the four weight matrices (PYTFM_PRECISION_BF16), else NULL */
    const uint16_t *attn_w16, *aproj_w16, *fc_w16, *mproj_w16;
} layer;

struct pytfm_model {
    pytfm_model_config config;
    int64_t C, H, D, V;
    float scale;  /* attention's: 1/sqrt(D) in double, then float, as pytfm.ops passes it */
    const pytfm__model_device *dev; /* the ops and memory of its device */
    float *params;  /* owned: the reader's allocation, in checkpoint.h's order (host), or NULL */
    float *pe;      /* owned: [max_seq, C] the sinusoidal positions (host), or NULL */
    float *on_device; /* owned: the parameters, then pe, copied to a GPU (dev->alloc), or NULL */
    /* where the forward reads them: into params and pe, or into on_device */
    const float *wte, *ln_f_w, *ln_f_b, *lm_head;
    const float *positions; /* [max_seq, C] added to the embeddings: pe or wpe, or NULL */
    layer *layers;          /* [n_layer] */
    int32_t precision;          /* a pytfm_precision of the products */
    uint16_t *w16;              /* owned: every BF16 copy in one allocation (BF16), or NULL */
    const uint16_t *lm_head16;  /* the LM head's BF16 copy (BF16), or NULL */
};

/* The parameters' pointers, walking the layout (pytfm_model_param) from p, its first float, and
 * pe, the sinusoidal table (or NULL), both on the model's device; -> the floats walked. */
static int64_t walk(pytfm_model *m, const float *p, const float *pe) {
    const pytfm_model_config *c = &m->config;
    const float *start = p;
    m->positions = pe;
    m->lm_head = NULL;
    int64_t shape[2];
    for (pytfm_param_info x = {.layer = -1, .part = -1}; pytfm__param_next(c, &x);
         p += shape[0] * shape[1]) {
        pytfm__param_shape(&x, shape); /* the checked config's: within int64 */
        if (x.layer >= 0 && x.layer < c->n_layer)
            m->layers[x.layer].part[x.part] = p;
        else if (x.layer < 0 && x.part == 0)
            m->wte = p;
        else if (x.layer < 0)
            m->positions = p; /* learned */
        else if (x.part == 0)
            m->ln_f_w = p;
        else if (x.part == 1)
            m->ln_f_b = p;
        else
            m->lm_head = p; /* untied */
    }
    if (c->tie_embeddings) m->lm_head = m->wte;
    return p - start;
}

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

/* The model on the checked weights w (taken over: freed here on failure), in host memory. */
static pytfm_status build(pytfm_model **model, pytfm__weights *w, const char *func) {
    const pytfm_model_config *c = &w->config;
    if (c->arch != PYTFM_ARCH_GPT) {
        free(w->params);
        return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                           "%s: the C model runs GPT blocks (arch 'gpt') only, not the Llama "
                           "family's", func);
    }
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
    m->dev = &pytfm__cpu_model_device;
    m->params = w->params;
    m->layers = layers;
    pytfm_status st = PYTFM_STATUS_OK;
    if (c->pos == PYTFM_POS_SINUSOIDAL) st = sinusoidal_table(&m->pe, func, c->max_seq, m->C);
    const int64_t walked = walk(m, m->params, m->pe);
    if (st == PYTFM_STATUS_OK && walked != c->n_params) // the reader's promise, checked once
        st = pytfm__fail(PYTFM_STATUS_INTERNAL,
                         "%s: the checkpoint reader returned %lld floats of parameters where "
                         "the config implies %lld",
                         func, (long long)c->n_params, (long long)walked);
    if (st != PYTFM_STATUS_OK) {
        pytfm_model_close(m);
        return st;
    }
    *model = m;
    return PYTFM_STATUS_OK;
}

/* The host model m onto the device dev: its parameters and sinusoidal table copied there, in
 * one allocation, and walked anew; the host copies freed. */
static pytfm_status to_device(pytfm_model *m, const pytfm__model_device *dev,
                              const char *func) {
    const int64_t n = m->config.n_params, n_pe = m->pe ? m->config.max_seq * m->C : 0;
    float *p = NULL;
    void *stream = NULL;
    pytfm_status st = dev->alloc(func, (void **)&p, (n + n_pe) * (int64_t)sizeof(float));
    if (st == PYTFM_STATUS_OK) st = dev->stream_open(func, &stream);
    if (st == PYTFM_STATUS_OK)
        st = dev->to_device(func, p, m->params, n * (int64_t)sizeof(float), stream);
    if (st == PYTFM_STATUS_OK && m->pe)
        st = dev->to_device(func, p + n, m->pe, n_pe * (int64_t)sizeof(float), stream);
    const pytfm_status closed = dev->stream_close(func, stream);
    if (st == PYTFM_STATUS_OK) st = closed;
    if (st != PYTFM_STATUS_OK) {
        dev->release(p);
        return st;
    }
    walk(m, p, m->pe ? p + n : NULL);
    free(m->params), free(m->pe);
    m->params = m->pe = NULL;
    m->on_device = p, m->dev = dev;
    return PYTFM_STATUS_OK;
}

/* The device's table, or a status saying why a model cannot be opened there. */
static pytfm_status device_of(const pytfm__model_device **dev, int32_t device, const char *func) {
    if (device == PYTFM_DEVICE_CPU) {
        *dev = &pytfm__cpu_model_device;
        return PYTFM_STATUS_OK;
    }
    if (device == PYTFM_DEVICE_CUDA) return pytfm__cuda_model_device(dev, func);
    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                       "%s: device must be PYTFM_DEVICE_CPU (0) or PYTFM_DEVICE_CUDA (1), got %d",
                       func, (int)device);
}

/* The model on the weights a reader returned with status (taken over), on the device dev. */
static pytfm_status open_on(pytfm_model **model, pytfm__weights *w, pytfm_status status,
                            const pytfm__model_device *dev, const char *func) {
    PYTFM_TRY(status);
    PYTFM_TRY(build(model, w, func));
    if (dev->host) return PYTFM_STATUS_OK; // the reader's memory is the model's
    const pytfm_status st = to_device(*model, dev, func);
    if (st != PYTFM_STATUS_OK) {
        pytfm_model_close(*model);
        *model = NULL;
    }
    return st;
}

/* The model in the checkpoint open as st (closed here, whatever happens), on the device dev. */
static pytfm_status open_from(pytfm_model **model, pytfm_safetensors *st,
                              const pytfm__model_device *dev, const char *func) {
    pytfm__weights w;
    const pytfm_status status = pytfm__checkpoint_weights(st, &w);
    pytfm_safetensors_close(st);
    return open_on(model, &w, status, dev, func);
}

pytfm_status pytfm_model_open(pytfm_model **model, const char *path, int32_t device) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    *model = NULL;
    PYTFM_CHECK(path != NULL, "%s: path must not be NULL", __func__);
    const pytfm__model_device *dev;
    PYTFM_TRY(device_of(&dev, device, __func__));
    struct stat s;
    if (stat(path, &s) == 0 && S_ISDIR(s.st_mode)) { // a Hugging Face GPT-2 folder
        pytfm__weights w;
        const pytfm_status status = pytfm__gpt2_weights(path, &w);
        return open_on(model, &w, status, dev, __func__);
    }
    pytfm_safetensors *st;
    PYTFM_TRY(pytfm_safetensors_open(&st, path));
    return open_from(model, st, dev, __func__);
}

pytfm_status pytfm_model_open_memory(pytfm_model **model, const void *data, size_t size,
                                     int32_t device) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    *model = NULL;
    PYTFM_CHECK(data != NULL || size == 0, "%s: data must not be NULL", __func__);
    PYTFM_CHECK(size <= (size_t)INT64_MAX, "%s: size must be below 2**63, got %zu", __func__, size);
    const pytfm__model_device *dev;
    PYTFM_TRY(device_of(&dev, device, __func__));
    pytfm_safetensors *st;
    PYTFM_TRY(pytfm_safetensors_open_memory(&st, data, (int64_t)size, "<memory>"));
    return open_from(model, st, dev, __func__);
}

pytfm_status pytfm_model_close(pytfm_model *model) {
    if (!model) return PYTFM_STATUS_OK;
    if (model->on_device) model->dev->release(model->on_device);
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
    if (!model->dev->host) // the GPU: the CUDA twins compute in float32 only
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

/* ---- the forward pass, shared by pytfm_model_forward and pytfm_session_feed ----------------- */

/*
 * The activations of one call, N = B·T tokens at T positions, carved from one scratch buffer
 * of floats on the model's device:
 *   pos     [T] int64 positions (2·T floats, at the buffer's aligned start)
 *   tokens  [N] int64 token ids (2·N floats; only off the host: the device's copy of them)
 *   x       [N, C] the residual stream
 *   a       [N, C] a LayerNorm's output, then attention's
 *   qkv     [N, 3C] c_attn's output; its first N·C floats then hold each c_proj's output
 *   q, k, v [B, T, H, D] each, adjacent (k = q + N·C)
 *   h       [N, 4C] c_fc's output, GELU in place
 *   mean, rstd, lse  [N], [N], [B, H, T]: what the kernels save, unused here
 *   head    [N, vocab] every row's logits (only where asked), else NULL
 */
typedef struct acts {
    int64_t *pos, *tokens;
    float *x, *a, *qkv, *q, *k, *v, *h, *mean, *rstd, *lse, *head;
} acts;

/* The floats of the buffer (tokens, head_vocab: room for the token ids, for every row's logits
 * of that vocabulary (0: none)) into *floats; 0 when that is more than memory can address. */
static int acts_floats(int64_t N, int64_t T, int64_t C, int64_t H, int tokens,
                       int64_t head_vocab, int64_t *floats) {
    const int64_t per_token = 12 * C + 2 + H + (tokens ? 2 : 0) + head_vocab;
    return pytfm__mul_within(N, per_token, pytfm__max_elems(sizeof(float)), floats) &&
           pytfm__add_within(*floats, 2 * T, pytfm__max_elems(sizeof(float)), floats);
}

/* The arrays in buf, laid out as above (tokens, head as in acts_floats). */
static acts acts_carve(float *buf, int64_t N, int64_t T, int64_t C, int64_t H, int tokens,
                       int head) {
    acts s;
    float *p = buf;
    s.pos = (int64_t *)(void *)p, p += 2 * T;
    s.tokens = tokens ? (int64_t *)(void *)p : NULL, p += tokens ? 2 * N : 0;
    s.x = p, p += N * C;
    s.a = p, p += N * C;
    s.qkv = p, p += N * 3 * C;
    s.q = p, p += N * C;
    s.k = p, p += N * C;
    s.v = p, p += N * C;
    s.h = p, p += N * 4 * C;
    s.mean = p, p += N;
    s.rstd = p, p += N;
    s.lse = p, p += N * H;
    s.head = head ? p : NULL;
    return s;
}

/* one block, as pytfm.nn.Block.forward; caches: this layer's k and v caches [max_len, C]
 * (a session), or NULL (the whole sequence) */
static pytfm_status block(const pytfm_model *m, const layer *L, const acts *s, int64_t B,
                          int64_t T, int64_t start, float *k_cache, float *v_cache,
                          int64_t max_len, void *stream, const char *func) {
    const pytfm__model_device *dev = m->dev;
    const int64_t C = m->C, H = m->H, D = m->D, N = B * T;
    // x + attn(ln_1(x))
    PYTFM_TRY(dev->layernorm(s->a, s->mean, s->rstd, s->x, L->ln_1_w, L->ln_1_b, N, C,
                             PYTFM_LAYERNORM_EPS, stream));
    PYTFM_TRY(dev->linear(s->qkv, s->a, L->attn_w, L->attn_w16, L->attn_b, N, C, 3 * C, stream));
    // qkv (B, T, 3, H, D) -> q, k, v (B, T, H, D), q and k rotated: as pytfm.nn does it
    PYTFM_TRY(dev->qkv_split(s->q, s->k, s->v, s->qkv, s->pos, B, T, H, D, 0, PYTFM_ROPE_BASE,
                             m->config.pos == PYTFM_POS_ROPE, stream));
    if (k_cache) { // KVCache.attend: append, then attend to everything cached
        PYTFM_TRY(dev->cache_append(k_cache, v_cache, s->k, s->v, 1, T, H, D, max_len, start,
                                    stream));
        PYTFM_TRY(dev->decode(s->a, s->lse, s->q, k_cache, v_cache, 1, T, H, D, max_len, start,
                              m->scale, stream));
    } else {
        PYTFM_TRY(dev->attention(s->a, s->lse, s->q, s->k, s->v, B, T, H, D, m->scale, 1,
                                 stream));
    }
    float *proj = s->qkv; // [N, C]
    PYTFM_TRY(dev->linear(proj, s->a, L->aproj_w, L->aproj_w16, L->aproj_b, N, C, C, stream));
    PYTFM_TRY(dev->add_rows(func, s->x, proj, N, C, N, 0, stream));
    // x + mlp(ln_2(x))
    PYTFM_TRY(dev->layernorm(s->a, s->mean, s->rstd, s->x, L->ln_2_w, L->ln_2_b, N, C,
                             PYTFM_LAYERNORM_EPS, stream));
    PYTFM_TRY(dev->linear(s->h, s->a, L->fc_w, L->fc_w16, L->fc_b, N, C, 4 * C, stream));
    PYTFM_TRY(dev->gelu(s->h, s->h, N * 4 * C, stream));
    PYTFM_TRY(dev->linear(proj, s->h, L->mproj_w, L->mproj_w16, L->mproj_b, N, 4 * C, C,
                          stream));
    return dev->add_rows(func, s->x, proj, N, C, N, 0, stream);
}

/* pytfm.nn.GPT._logits of tokens [B, T] (on the device) at positions [start, start + T), the
 * positions in s: every row's logits into out [B, T, vocab] (NULL: none). caches: a session's
 * n_layer pairs of [max_len, C] caches (B = 1), or NULL. */
static pytfm_status logits_of(const pytfm_model *m, const acts *s, float *out,
                              const int64_t *tokens, int64_t B, int64_t T, int64_t start,
                              float *caches, int64_t max_len, void *stream, const char *func) {
    const pytfm__model_device *dev = m->dev;
    const int64_t C = m->C, V = m->V, N = B * T;
    PYTFM_TRY(dev->embedding(s->x, tokens, m->wte, N, V, C, stream));
    if (m->positions) // x += positions[start : start + T], broadcast over the batch
        PYTFM_TRY(dev->add_rows(func, s->x, m->positions, N, C, T, start, stream));
    for (int64_t i = 0; i < m->config.n_layer; i++) {
        float *k_cache = caches ? caches + 2 * i * max_len * C : NULL;
        float *v_cache = caches ? k_cache + max_len * C : NULL;
        PYTFM_TRY(block(m, &m->layers[i], s, B, T, start, k_cache, v_cache, max_len, stream,
                        func));
    }
    if (!out) return PYTFM_STATUS_OK;
    // the LM head on every row, as Python: one linear over N rows gives each row the bits it
    // gets in GPT.decode, whose product has N rows too
    PYTFM_TRY(dev->layernorm(s->a, s->mean, s->rstd, s->x, m->ln_f_w, m->ln_f_b, N, C,
                             PYTFM_LAYERNORM_EPS, stream));
    return dev->linear(out, s->a, m->lm_head, m->lm_head16, NULL, N, C, V, stream);
}

/* The logits of tokens [B, T] (host memory, checked) at positions [start, start + T), on
 * stream: into logits [B, T, vocab] (a forward: caches NULL) or, for a session (B = 1, caches:
 * its n_layer pairs of [max_len, C] caches), those of the last token into logits [vocab] (NULL:
 * none), both host memory. The activations allocated and given back; returns once the stream's
 * work is done. */
static pytfm_status run(const char *func, const pytfm_model *m, float *logits,
                        const int64_t *tokens, int64_t B, int64_t T, int64_t start,
                        float *caches, int64_t max_len, void *stream) {
    const pytfm__model_device *dev = m->dev;
    const int64_t N = B * T, C = m->C, H = m->H, V = m->V;
    // the LM head writes into logits where it can (host memory, and every row wanted), else
    // every row into the scratch, from which the wanted ones are copied
    const int in_place = dev->host && !(caches && N > 1);
    const int head = logits && !in_place;
    int64_t floats = 0;
    if (!acts_floats(N, T, C, H, !dev->host, head ? V : 0, &floats))
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: %lld tokens need more scratch than memory can address", func,
                           (long long)N);
    int64_t *pos = pytfm__scratch(func, T, sizeof *pos);
    if (!pos) return PYTFM_STATUS_OUT_OF_MEMORY;
    for (int64_t t = 0; t < T; t++) pos[t] = start + t;
    float *buf = NULL;
    pytfm_status st = dev->scratch(func, (void **)&buf, floats * (int64_t)sizeof(float), stream);
    if (st == PYTFM_STATUS_OK) {
        const acts s = acts_carve(buf, N, T, C, H, !dev->host, head);
        st = dev->to_device(func, s.pos, pos, T * (int64_t)sizeof *pos, stream);
        if (st == PYTFM_STATUS_OK && s.tokens)
            st = dev->to_device(func, s.tokens, tokens, N * (int64_t)sizeof *tokens, stream);
        if (st == PYTFM_STATUS_OK)
            st = logits_of(m, &s, head ? s.head : logits, s.tokens ? s.tokens : tokens, B, T,
                           start, caches, max_len, stream, func);
        if (st == PYTFM_STATUS_OK && head) { // every row, or a session's last
            const int64_t rows = caches ? 1 : N;
            st = dev->to_host(func, logits, s.head + (N - rows) * V,
                              rows * V * (int64_t)sizeof(float), stream);
        }
        st = dev->scratch_free(func, buf, st, stream);
    }
    const pytfm_status done = dev->sync(func, stream); // the logits are the caller's now
    free(pos);
    return st != PYTFM_STATUS_OK ? st : done;
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
    const pytfm__model_device *dev = model->dev;
    void *stream = NULL; // one of the call's own: threads may share the model
    PYTFM_TRY(dev->stream_open(__func__, &stream));
    const pytfm_status st = run(__func__, model, logits, tokens, B, T, 0, NULL, 0, stream);
    const pytfm_status closed = dev->stream_close(__func__, stream);
    return st != PYTFM_STATUS_OK ? st : closed;
}

/* ---- sessions ------------------------------------------------------------------------------ */

struct pytfm_session {
    const pytfm_model *model;
    int64_t max_len;
    int64_t length; /* positions [0, length) of the caches hold the tokens fed */
    float *caches;  /* on the model's device: n_layer × (k, v), each [max_len, C] =
                       [1, max_len, H, D] */
    void *stream;   /* the session's own, on the model's device */
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
    if (!s) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate a session",
                               __func__);
    s->model = model;
    s->max_len = max_len;
    const pytfm__model_device *dev = model->dev;
    pytfm_status st = dev->alloc(__func__, (void **)&s->caches, count * (int64_t)sizeof(float));
    if (st == PYTFM_STATUS_OUT_OF_MEMORY)
        st = pytfm__fail(st, "%s: cannot allocate KV caches of %lld positions (%lld floats)",
                         __func__, (long long)max_len, (long long)count);
    if (st == PYTFM_STATUS_OK) st = dev->stream_open(__func__, &s->stream);
    if (st != PYTFM_STATUS_OK) {
        pytfm_session_close(s);
        return st;
    }
    *session = s;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_session_close(pytfm_session *session) {
    if (!session) return PYTFM_STATUS_OK;
    const pytfm__model_device *dev = session->model->dev;
    (void)dev->stream_close(__func__, session->stream);
    dev->release(session->caches);
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
    PYTFM_TRY(run(__func__, m, logits, tokens, 1, n, length, session->caches, max_len,
                  session->stream));
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
