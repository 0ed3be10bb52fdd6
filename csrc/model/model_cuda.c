/*
 * model_cuda.c — model.c's GPT on the GPU (PYTFM_DEVICE_CUDA): the parameters copied to the
 * device once, at open; each forward and each session feed the ops of model.c's forward, in
 * the same order and with the same arguments, on their CUDA twins (pytfm_cuda.h) and device
 * pointers; the tokens copied in, the logits copied back to the caller's host memory.
 *
 *   x = wte[tokens] (+ pe[positions]);  per block: x += attn(ln_1(x)); x += mlp(ln_2(x))
 *   logits = ln_f(x)·Wᵀ                                   (model.c's header has it op by op)
 *
 * The residual adds and the position table, loops over host memory in model.c, are a row add
 * on the device (cuda/device.h). The logits agree with the CPU model's to float32 rounding (the
 * twins sum in other orders than the C kernels), not bit for bit.
 *
 * Each forward runs on a stream of its own, made for the call, its activations in one
 * stream-ordered allocation: any number of threads may share the model, as on the CPU. A
 * session owns its stream and its caches on the device; a feed allocates its activations on
 * that stream. Every call returns after its work is done (the logits are the caller's to
 * read), a fault raised by a kernel included (PYTFM_STATUS_CUDA_ERROR). Compiled in a CUDA
 * build only (csrc/core/cuda_stub.c stands in for it otherwise).
 */
#include <math.h>
#include <stdlib.h>

#include "acts.h"
#include "core/checks.h"
#include "device.h"
#include "model_cuda.h"

#define LN_EPS 1e-5f      /* as model.c: pytfm.ops.layernorm_forward's default */
#define ROPE_BASE 10000.0 /* pytfm.ops.rope_forward's default */

/* one block's parameters: device pointers into the model's one allocation */
typedef struct layer {
    const float *ln_1_w, *ln_1_b;
    const float *attn_w, *attn_b;   /* c_attn [3C, C], [3C] */
    const float *aproj_w, *aproj_b; /* attn.c_proj [C, C], [C] */
    const float *ln_2_w, *ln_2_b;
    const float *fc_w, *fc_b;       /* mlp.c_fc [4C, C], [4C] */
    const float *mproj_w, *mproj_b; /* mlp.c_proj [C, 4C], [C] */
} layer;

struct pytfm__cuda_model {
    pytfm_model_config config;
    int64_t C, H, D, V;
    float scale;   /* attention's: 1/sqrt(D) in double, then float, as model.c */
    float *params; /* device: the parameters, then the sinusoidal table when there is one */
    const float *wte, *ln_f_w, *ln_f_b, *lm_head;
    const float *pe; /* [max_seq, C] on the device: sinusoidal, or learned (in params), or NULL */
    layer *layers;   /* [n_layer], host memory holding device pointers */
};

struct pytfm__cuda_session {
    const pytfm__cuda_model *model;
    int64_t max_len;
    void *stream;
    float *caches; /* device: n_layer × (k, v), each [max_len, C] = [1, max_len, H, D] */
};

pytfm_status pytfm__cuda_model_check(const char *func) {
    int32_t devices = 0;
    PYTFM_TRY(pytfm_cuda_device_count(&devices));
    if (devices > 0) return PYTFM_STATUS_OK;
    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                       "%s: device PYTFM_DEVICE_CUDA: no CUDA GPU was found (no device, or no "
                       "NVIDIA driver)",
                       func);
}

/* the device pointers of checkpoint.h's order, walked from p; -> the floats walked */
static int64_t walk(pytfm__cuda_model *m, const float *p) {
    const int64_t C = m->C;
    const float *start = p;
    m->wte = p, p += m->V * C;
    if (m->config.pos == PYTFM_POS_LEARNED) m->pe = p, p += m->config.max_seq * C;
    for (int64_t i = 0; i < m->config.n_layer; i++) {
        layer *l = &m->layers[i];
        l->ln_1_w = p, p += C, l->ln_1_b = p, p += C;
        l->attn_w = p, p += 3 * C * C, l->attn_b = p, p += 3 * C;
        l->aproj_w = p, p += C * C, l->aproj_b = p, p += C;
        l->ln_2_w = p, p += C, l->ln_2_b = p, p += C;
        l->fc_w = p, p += 4 * C * C, l->fc_b = p, p += 4 * C;
        l->mproj_w = p, p += 4 * C * C, l->mproj_b = p, p += C;
    }
    m->ln_f_w = p, p += C, m->ln_f_b = p, p += C;
    m->lm_head = m->config.tie_embeddings ? m->wte : p;
    if (!m->config.tie_embeddings) p += m->V * C;
    return p - start;
}

pytfm_status pytfm__cuda_model_open(pytfm__cuda_model **model, const pytfm_model_config *config,
                                    const float *params, const float *pe, const char *func) {
    *model = NULL;
    pytfm__cuda_model *m = calloc(1, sizeof *m);
    layer *layers = m ? calloc((size_t)config->n_layer, sizeof *layers) : NULL;
    if (!layers) {
        free(m);
        return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate the model", func);
    }
    m->config = *config;
    m->C = config->d_model, m->H = config->n_head, m->D = config->d_model / config->n_head;
    m->V = config->vocab;
    m->scale = (float)(1.0 / sqrt((double)m->D));
    m->layers = layers;
    const int64_t n_pe = pe ? config->max_seq * m->C : 0; // the reader checked its size
    pytfm_status st = pytfm__cuda_malloc(func, (void **)&m->params,
                                         (config->n_params + n_pe) * (int64_t)sizeof(float));
    void *stream = NULL;
    if (st == PYTFM_STATUS_OK) st = pytfm__cuda_stream_open(func, &stream);
    if (st == PYTFM_STATUS_OK)
        st = pytfm__cuda_copy(func, m->params, params, config->n_params * (int64_t)sizeof(float),
                              PYTFM__TO_DEVICE, stream);
    if (st == PYTFM_STATUS_OK && pe) {
        m->pe = m->params + config->n_params;
        st = pytfm__cuda_copy(func, m->params + config->n_params, pe,
                              n_pe * (int64_t)sizeof(float), PYTFM__TO_DEVICE, stream);
    }
    const pytfm_status closed = pytfm__cuda_stream_close(func, stream);
    if (st == PYTFM_STATUS_OK) st = closed;
    if (st == PYTFM_STATUS_OK && walk(m, m->params) != config->n_params)
        st = pytfm__fail(PYTFM_STATUS_INTERNAL, "%s: the parameters do not fill the config's "
                         "layout", func);
    if (st != PYTFM_STATUS_OK) {
        pytfm__cuda_model_close(m);
        return st;
    }
    *model = m;
    return PYTFM_STATUS_OK;
}

void pytfm__cuda_model_close(pytfm__cuda_model *model) {
    if (!model) return;
    pytfm__cuda_free(model->params);
    free(model->layers);
    free(model);
}

/* ---- the forward pass, shared by forwards and feeds ----------------------------------------- */

/* The activations of one call on the device (acts.h), the tokens' copy among them */
typedef pytfm__acts acts;

/* one block, as model.c's block(): caches NULL (a forward) or this layer's [max_len, C] pair */
static pytfm_status block(const pytfm__cuda_model *m, const layer *L, const acts *s, int64_t B,
                          int64_t T, int64_t start, float *k_cache, float *v_cache,
                          int64_t max_len, void *stream, const char *func) {
    const int64_t C = m->C, H = m->H, D = m->D, N = B * T;
    PYTFM_TRY(pytfm_layernorm_forward_cuda(s->a, s->mean, s->rstd, s->x, L->ln_1_w, L->ln_1_b,
                                           N, C, LN_EPS, stream));
    PYTFM_TRY(pytfm_linear_forward_cuda(s->qkv, s->a, L->attn_w, L->attn_b, N, C, 3 * C,
                                        stream));
    PYTFM_TRY(pytfm_qkv_split_forward_cuda(s->q, s->k, s->v, s->qkv, s->pos, B, T, H, D, 0,
                                           ROPE_BASE, m->config.pos == PYTFM_POS_ROPE, stream));
    if (k_cache) {
        PYTFM_TRY(pytfm_attention_cache_append_cuda(k_cache, v_cache, s->k, s->v, 1, T, H, D,
                                                    max_len, start, stream));
        PYTFM_TRY(pytfm_attention_decode_cuda(s->a, s->lse, s->q, k_cache, v_cache, 1, T, H, D,
                                              max_len, start, m->scale, stream));
    } else {
        PYTFM_TRY(pytfm_attention_forward_cuda(s->a, s->lse, s->q, s->k, s->v, B, T, H, D,
                                               m->scale, 1, stream));
    }
    float *proj = s->qkv; // [N, C]
    PYTFM_TRY(pytfm_linear_forward_cuda(proj, s->a, L->aproj_w, L->aproj_b, N, C, C, stream));
    PYTFM_TRY(pytfm__cuda_add_rows(func, s->x, proj, N, C, N, 0, stream));
    PYTFM_TRY(pytfm_layernorm_forward_cuda(s->a, s->mean, s->rstd, s->x, L->ln_2_w, L->ln_2_b,
                                           N, C, LN_EPS, stream));
    PYTFM_TRY(pytfm_linear_forward_cuda(s->h, s->a, L->fc_w, L->fc_b, N, C, 4 * C, stream));
    PYTFM_TRY(pytfm_gelu_forward_cuda(s->h, s->h, N * 4 * C, stream));
    PYTFM_TRY(pytfm_linear_forward_cuda(proj, s->h, L->mproj_w, L->mproj_b, N, 4 * C, C,
                                        stream));
    return pytfm__cuda_add_rows(func, s->x, proj, N, C, N, 0, stream);
}

/* model.c's logits_of on the device: tokens and positions in s already; the logits of every
 * row into s->head when it is not NULL */
static pytfm_status logits_of(const pytfm__cuda_model *m, const acts *s, int64_t B, int64_t T,
                              int64_t start, float *caches, int64_t max_len, void *stream,
                              const char *func) {
    const int64_t C = m->C, V = m->V, N = B * T;
    PYTFM_TRY(pytfm_embedding_forward_cuda(s->x, s->tokens, m->wte, N, V, C, stream));
    if (m->pe) PYTFM_TRY(pytfm__cuda_add_rows(func, s->x, m->pe, N, C, T, start, stream));
    for (int64_t i = 0; i < m->config.n_layer; i++) {
        float *k_cache = caches ? caches + 2 * i * max_len * C : NULL;
        float *v_cache = caches ? k_cache + max_len * C : NULL;
        PYTFM_TRY(block(m, &m->layers[i], s, B, T, start, k_cache, v_cache, max_len, stream,
                        func));
    }
    if (!s->head) return PYTFM_STATUS_OK;
    PYTFM_TRY(pytfm_layernorm_forward_cuda(s->a, s->mean, s->rstd, s->x, m->ln_f_w, m->ln_f_b,
                                           N, C, LN_EPS, stream));
    return pytfm_linear_forward_cuda(s->head, s->a, m->lm_head, NULL, N, C, V, stream);
}

/* The activations of N = B·T tokens at positions [start, start + T) on stream, the tokens
 * and positions copied in, logits_of, then the logits of every row (last_row 0) or of the last
 * one into logits (NULL: none), the activations given back, the stream waited for. */
static pytfm_status run(const char *func, const pytfm__cuda_model *m, float *logits,
                        const int64_t *tokens, int64_t B, int64_t T, int64_t start,
                        float *caches, int64_t max_len, int last_row, void *stream) {
    const int64_t N = B * T, C = m->C, H = m->H, V = m->V;
    int64_t floats = 0;
    if (!pytfm__acts_floats(N, T, C, H, 1, logits ? V : 0, &floats))
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: %lld tokens need more memory than can be addressed", func,
                           (long long)N);
    int64_t *pos = pytfm__scratch(func, T, sizeof *pos);
    if (!pos) return PYTFM_STATUS_OUT_OF_MEMORY;
    for (int64_t t = 0; t < T; t++) pos[t] = start + t;
    float *buf = NULL;
    pytfm_status st =
        pytfm__stream_scratch_bytes(func, (void **)&buf, floats * (int64_t)sizeof(float), stream);
    if (st == PYTFM_STATUS_OK) {
        const acts s = pytfm__acts_carve(buf, N, T, C, H, 1, logits != NULL);
        st = pytfm__cuda_copy(func, s.pos, pos, T * (int64_t)sizeof *pos, PYTFM__TO_DEVICE,
                              stream);
        if (st == PYTFM_STATUS_OK)
            st = pytfm__cuda_copy(func, s.tokens, tokens, N * (int64_t)sizeof *tokens,
                                  PYTFM__TO_DEVICE, stream);
        if (st == PYTFM_STATUS_OK)
            st = logits_of(m, &s, B, T, start, caches, max_len, stream, func);
        if (st == PYTFM_STATUS_OK && logits) {
            const float *rows = last_row ? s.head + (N - 1) * V : s.head;
            const int64_t count = last_row ? V : N * V;
            st = pytfm__cuda_copy(func, logits, rows, count * (int64_t)sizeof(float),
                                  PYTFM__TO_HOST, stream);
        }
        st = pytfm__stream_scratch_free(func, buf, st, stream);
    }
    const pytfm_status done = pytfm__cuda_sync(func, stream); // the logits are the caller's now
    free(pos);
    return st != PYTFM_STATUS_OK ? st : done;
}

pytfm_status pytfm__cuda_model_forward(const pytfm__cuda_model *model, float *logits,
                                       const int64_t *tokens, int64_t B, int64_t T,
                                       const char *func) {
    void *stream = NULL;
    PYTFM_TRY(pytfm__cuda_stream_open(func, &stream));
    const pytfm_status st = run(func, model, logits, tokens, B, T, 0, NULL, 0, 0, stream);
    const pytfm_status closed = pytfm__cuda_stream_close(func, stream);
    return st != PYTFM_STATUS_OK ? st : closed;
}

/* ---- sessions ------------------------------------------------------------------------------ */

pytfm_status pytfm__cuda_session_open(pytfm__cuda_session **session,
                                      const pytfm__cuda_model *model, int64_t max_len,
                                      const char *func) {
    *session = NULL;
    pytfm__cuda_session *s = calloc(1, sizeof *s);
    if (!s) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate a session", func);
    s->model = model;
    s->max_len = max_len;
    // model.c checked n_layer · 2 · max_len · C floats against the address space
    const int64_t floats = model->config.n_layer * 2 * max_len * model->C;
    pytfm_status st = pytfm__cuda_malloc(func, (void **)&s->caches,
                                         floats * (int64_t)sizeof(float));
    if (st == PYTFM_STATUS_OK) st = pytfm__cuda_stream_open(func, &s->stream);
    if (st != PYTFM_STATUS_OK) {
        pytfm__cuda_session_close(s);
        return st;
    }
    *session = s;
    return PYTFM_STATUS_OK;
}

void pytfm__cuda_session_close(pytfm__cuda_session *session) {
    if (!session) return;
    (void)pytfm__cuda_stream_close("pytfm_session_close", session->stream);
    pytfm__cuda_free(session->caches);
    free(session);
}

pytfm_status pytfm__cuda_session_feed(pytfm__cuda_session *session, float *logits,
                                      const int64_t *tokens, int64_t n, int64_t length,
                                      const char *func) {
    return run(func, session->model, logits, tokens, 1, n, length, session->caches,
               session->max_len, 1, session->stream);
}
