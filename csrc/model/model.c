/*
 * model.c — pytfm.nn.GPT in C: a model read from a checkpoint or a Hugging Face folder, its
 * forward pass, and KV-cache sessions that decode one sequence token by token, on the CPU or on
 * the GPU. GPT blocks (arch 'gpt': pytfm's own models, GPT-2):
 *
 *   x = wte[tokens] (+ pe[positions]: sinusoidal, or learned wpe)       [N, C], N = B·T
 *   per block:  a = ln_1(x);  q, k, v = split(a·W_attnᵀ + b)            [B, T, H, D] each
 *               q, k = rope(q), rope(k) at the positions (pos = rope)
 *               o = causal attention(q, k, v), scale (float)(1/sqrt(D))
 *               x = x + o·W_projᵀ + b
 *               x = x + gelu(ln_2(x)·W_fcᵀ + b)·W_mlp_projᵀ + b
 *   logits = ln_f(x)·Wᵀ, W = wte (tied) or lm_head.weight               [N, vocab]
 *
 * The Llama family's blocks (arch 'llama': Llama, Qwen 2 and 3, Mistral), D = head_dim:
 *
 *   x = embed_tokens[tokens]                                            [N, C]
 *   per block:  a = rmsnorm(x);  q, k, v = split(a·[Wq; Wk; Wv]ᵀ (+ b))  [B, T, H or Hkv, D]
 *               q, k = rmsnorm(q), rmsnorm(k) per head (qk_norm)
 *               q, k = rope(q), rope(k): rotate-half, angles pos · inv_freq
 *               o = causal attention(q, k, v): query head h reads k/v head h / (H / Hkv),
 *                   within the sliding window (if any)
 *               x = x + o·Woᵀ
 *               a = rmsnorm(x);  x = x + (silu(a·Wgateᵀ) ∘ (a·Wupᵀ))·Wdownᵀ
 *   logits = rmsnorm(x)·Wᵀ, W = embed_tokens (tied) or lm_head.weight  [N, vocab]
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
 * A Llama-family folder whose matrices are all bfloat16 opens in BF16 holding those matrices
 * in BF16 only, as the file has them (the model "keeps BF16"): the products read them as the
 * rounding of their float32 widening, the embedding widens its rows, so the logits are those
 * of the float32 widening in BF16, without the float32 copy. Its FP32 widens the matrices into
 * a float32 allocation of their own (freed again by BF16); on the GPU they are widened as they
 * are copied there, and the model is an FP32 one.
 *
 * In PYTFM_PRECISION_INT8 (the CPU only) every weight matrix (the blocks', the embedding and
 * the LM head, tied or not) is held as blocks of 32 int8 values with an fp16 scale each,
 * quantised once by set_precision (pytfm_quantize_q8, or _bf16 from a model that keeps BF16),
 * and every product is pytfm_linear_forward_q8w's, the embedding pytfm_embedding_forward_q8w's,
 * as pytfm.nn.GPT.set_precision("int8") runs them: the logits are its bits again. The float32
 * and BF16 matrices are freed (the vectors and GPT-2's learned positions move into a float32
 * allocation of their own), so INT8 is one way: a model keeps a quarter of FP32's bytes per
 * matrix value and a little more (the scales), and going back is refused.
 *
 * The model is read-only once opened (the parameters, per-layer pointers into them, the
 * position table, the precision and the BF16 copies): any number of threads may share it,
 * as long as none changes its precision meanwhile. Each call allocates its own activations
 * (scratch, freed on every path); a session owns its caches.
 */
#define _POSIX_C_SOURCE 200809L /* stat */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "gpt2.h"
#include "core/checks.h"
#include "model_device.h"

/* ---- the model ------------------------------------------------------------------------------ */

/* The matrices of a block, the same four roles in either family: attention's input and output
 * projections, the MLP's (GPT: c_fc; Llama: gate_proj, with up_proj beside it) and its output
 * projection (c_proj; down_proj). */
enum { ATTN_IN, ATTN_OUT, MLP_IN, MLP_UP, MLP_OUT, MATRICES };

/* the parts of a block in either family's layout (GPT's 12, the Llama family's enum) */
enum {
    PARTS = (int)PYTFM__LAYER_PARTS > (int)PYTFM__LLAMA_PARTS ? (int)PYTFM__LAYER_PARTS
                                                            : (int)PYTFM__LLAMA_PARTS
};

/* one block's parameters: pointers into the model's one allocation, on its device */
typedef struct layer {
    union {
        const float *part[PYTFM__LAYER_PARTS]; /* GPT: in the layout's order (pytfm_model_param) */
        struct {
            const float *ln_1_w, *ln_1_b;
            const float *attn_w, *attn_b;   /* c_attn [3C, C], [3C] */
            const float *aproj_w, *aproj_b; /* attn.c_proj [C, C], [C] */
            const float *ln_2_w, *ln_2_b;
            const float *fc_w, *fc_b;       /* mlp.c_fc [4C, C], [4C] */
            const float *mproj_w, *mproj_b; /* mlp.c_proj [C, 4C], [C] */
        };
    };
    /* the Llama family's (enum pytfm__llama_part; NULL where the config has none) */
    const float *llama[PYTFM__LLAMA_PARTS];
    /* the Llama family's matrices in BF16 (a model that keeps BF16), else NULL */
    const uint16_t *llama16[PYTFM__LLAMA_PARTS];
    /* in PYTFM_PRECISION_INT8, each matrix part's int8 values and fp16 scales (indexed by
     * part: GPT's layout order, or enum pytfm__llama_part), else NULL */
    const int8_t *q8part[PARTS];
    const uint16_t *s8part[PARTS];
    /* each matrix of the roles above [out, in] (Llama's ATTN_IN: q, k and v as one) in float32
     * (NULL: none, or a model that keeps BF16 in BF16, or one in INT8), in BF16 (the copy
     * set_precision makes, or the kept matrix; NULL: none), in int8 blocks with their scales
     * (INT8; else NULL), and its bias (NULL: none) */
    const float *w[MATRICES];
    const uint16_t *w16[MATRICES];
    const int8_t *q8[MATRICES];
    const uint16_t *s8[MATRICES];
    const float *b[MATRICES];
    int64_t rows[MATRICES], cols[MATRICES];
} layer;

struct pytfm_model {
    pytfm_model_config config;
    int llama;    /* 1: the Llama family's blocks (arch 'llama') */
    int64_t C, H, D, V;
    int64_t Hkv, F; /* key/value heads (GPT: H); the MLP's hidden width (GPT: 4C) */
    int64_t qw, kvw; /* the widths of q (H·D) and of k and v (Hkv·D) */
    float scale;  /* attention's: 1/sqrt(D) in double, then float, as pytfm.ops passes it */
    float eps;    /* RMSNorm's (Llama), the config's norm_eps as pytfm.ops passes it */
    const pytfm__model_device *dev; /* the ops and memory of its device */
    float *params;  /* owned: the reader's allocation, in checkpoint.h's order (host), or NULL */
    /* owned: the table the model computes from its config (host), or NULL: [max_seq, C] the
     * sinusoidal positions, or [D/2] RoPE's inv_freq (Llama) */
    float *table;
    int64_t n_table;
    float *on_device; /* owned: the parameters, then the table, copied to a GPU, or NULL */
    /* where the forward reads them: into params and table, or into on_device */
    const float *wte, *ln_f_w, *ln_f_b, *lm_head;
    const float *positions; /* [max_seq, C] added to the embeddings: pe or wpe, or NULL */
    const float *inv_freq;  /* [D/2] (Llama), or NULL */
    layer *layers;          /* [n_layer] */
    int32_t precision;          /* a pytfm_precision of the products */
    /* owned: every BF16 copy in one allocation (BF16), or the kept matrices (keeps_bf16: in
     * the layout's order, checkpoint.h's pytfm__weights.w16), or NULL */
    uint16_t *w16;
    int keeps_bf16;             /* 1: the matrices are w16's, in BF16 only (host memory) */
    int64_t n_w16;              /* the kept matrices' values */
    float *w32;                 /* owned: the kept matrices widened (keeps_bf16 in FP32), or NULL */
    const uint16_t *lm_head16;  /* the LM head in BF16: its copy (BF16) or kept, or NULL */
    const uint16_t *wte16;      /* the embedding, kept (keeps_bf16), or NULL */
    /* owned (PYTFM_PRECISION_INT8, else NULL): every quantised matrix's int8 values, and their
     * fp16 scales, one per block of 32, each in the layout's order; params then holds the
     * other parameters only (the vectors, and GPT-2's learned positions), in that order */
    int8_t *q8;
    uint16_t *s8;
    const int8_t *wte_q8, *lm_head_q8; /* INT8: the embedding's and the LM head's (tied: the */
    const uint16_t *wte_s8, *lm_head_s8; /* same), else NULL */
};

/* Each block's matrices by role (layer.w, .b, .rows, .cols), from its parts. */
static void roles(pytfm_model *m, layer *l) {
    const int64_t C = m->C;
    if (m->llama) {
        const float *const *p = l->llama;
        const float *w[MATRICES] = {p[PYTFM__LLAMA_Q_W], p[PYTFM__LLAMA_O_W],
                                    p[PYTFM__LLAMA_GATE], p[PYTFM__LLAMA_UP],
                                    p[PYTFM__LLAMA_DOWN]};
        const int64_t rows[MATRICES] = {m->qw + 2 * m->kvw, C, m->F, m->F, C};
        const int64_t cols[MATRICES] = {C, m->qw, C, C, m->F};
        const uint16_t *const *k = l->llama16;
        const uint16_t *w16[MATRICES] = {k[PYTFM__LLAMA_Q_W], k[PYTFM__LLAMA_O_W],
                                         k[PYTFM__LLAMA_GATE], k[PYTFM__LLAMA_UP],
                                         k[PYTFM__LLAMA_DOWN]};
        const int part[MATRICES] = {PYTFM__LLAMA_Q_W, PYTFM__LLAMA_O_W, PYTFM__LLAMA_GATE,
                                    PYTFM__LLAMA_UP, PYTFM__LLAMA_DOWN};
        for (int r = 0; r < MATRICES; r++)
            l->w[r] = w[r], l->w16[r] = w16[r], l->b[r] = NULL, l->rows[r] = rows[r],
            l->cols[r] = cols[r], l->q8[r] = l->q8part[part[r]], l->s8[r] = l->s8part[part[r]];
        l->b[ATTN_IN] = p[PYTFM__LLAMA_Q_B]; /* q, k and v's, adjacent; NULL without qkv_bias */
        return;
    }
    const float *w[MATRICES] = {l->attn_w, l->aproj_w, l->fc_w, NULL, l->mproj_w};
    const float *b[MATRICES] = {l->attn_b, l->aproj_b, l->fc_b, NULL, l->mproj_b};
    const int64_t rows[MATRICES] = {3 * C, C, 4 * C, 0, C}, cols[MATRICES] = {C, C, C, 0, 4 * C};
    const int part[MATRICES] = {2, 4, 8, -1, 10}; /* c_attn, attn.c_proj, c_fc, mlp.c_proj */
    for (int r = 0; r < MATRICES; r++) {
        l->w[r] = w[r], l->b[r] = b[r], l->rows[r] = rows[r], l->cols[r] = cols[r];
        l->q8[r] = part[r] < 0 ? NULL : l->q8part[part[r]];
        l->s8[r] = part[r] < 0 ? NULL : l->s8part[part[r]];
    }
}

/* Whether parameter x is held in int8 blocks in PYTFM_PRECISION_INT8: every matrix but GPT-2's
 * learned positions, which are added to the embeddings, never multiplied (quantising them
 * would only add error; they are max_seq·C values, 0.6 % of GPT-2-124M's, 2.4 % of its bytes
 * in INT8 when kept in float32) */
static int quantised(const pytfm_model *m, const pytfm_param_info *x) {
    return x->ndim == 2 && !(!m->llama && x->layer < 0 && x->part == 1);
}

/* The parameters' pointers, walking the layout (pytfm_model_param) from p, its first float, and
 * table, the model's table (or NULL), both on the model's device; p16: NULL, or a model that
 * keeps BF16 (Llama, host memory): its matrices are in p16 instead, in the layout's order, p
 * holding the rest; q8: NULL, or a model in INT8 (host memory): the quantised matrices
 * (quantised()) are in q8 and their scales in s8 instead, in the layout's order, p holding the
 * rest. -> the values walked. */
static int64_t walk(pytfm_model *m, const float *p, const uint16_t *p16, const int8_t *q8,
                    const uint16_t *s8, const float *table) {
    const pytfm_model_config *c = &m->config;
    const float *start = p;
    const uint16_t *start16 = p16;
    const int8_t *start8 = q8;
    m->positions = m->llama ? NULL : table;
    m->inv_freq = m->llama ? table : NULL;
    m->wte = m->lm_head = m->ln_f_b = NULL;
    m->wte16 = m->lm_head16 = NULL;
    m->wte_q8 = m->lm_head_q8 = NULL, m->wte_s8 = m->lm_head_s8 = NULL;
    int64_t shape[2];
    for (pytfm_param_info x = {.layer = -1, .part = -1}; pytfm__param_next(c, &x);) {
        pytfm__param_shape(&x, shape); /* the checked config's: within int64 */
        const int64_t n = shape[0] * shape[1];
        const int8_t *x8 = q8 && quantised(m, &x) ? q8 : NULL; /* this one's in int8 */
        const uint16_t *xs = x8 ? s8 : NULL;
        const uint16_t *q16 = !x8 && p16 && x.ndim == 2 ? p16 : NULL; /* this one's in BF16 */
        const float *q = q16 || x8 ? NULL : p;
        if (x8) q8 += n, s8 += n / PYTFM_Q8_BLOCK;
        else if (q16) p16 += n;
        else p += n;
        if (x.layer >= 0 && x.layer < c->n_layer && m->llama) {
            const int part = pytfm__llama_part(c, x.part);
            m->layers[x.layer].llama[part] = q;
            m->layers[x.layer].llama16[part] = q16;
            m->layers[x.layer].q8part[part] = x8, m->layers[x.layer].s8part[part] = xs;
        } else if (x.layer >= 0 && x.layer < c->n_layer) {
            m->layers[x.layer].part[x.part] = q;
            m->layers[x.layer].q8part[x.part] = x8, m->layers[x.layer].s8part[x.part] = xs;
        } else if (x.layer < 0 && x.part == 0) {
            m->wte = q, m->wte16 = q16, m->wte_q8 = x8, m->wte_s8 = xs;
        } else if (x.layer < 0) {
            m->positions = q; /* learned */
        } else if (x.part == 0) {
            m->ln_f_w = q;
        } else if (x.part == 1 && !m->llama) {
            m->ln_f_b = q;
        } else { /* untied */
            m->lm_head = q, m->lm_head16 = q16, m->lm_head_q8 = x8, m->lm_head_s8 = xs;
        }
    }
    if (c->tie_embeddings)
        m->lm_head = m->wte, m->lm_head16 = m->wte16, m->lm_head_q8 = m->wte_q8,
        m->lm_head_s8 = m->wte_s8;
    for (int64_t i = 0; i < c->n_layer; i++) roles(m, &m->layers[i]);
    return (p - start) + (p16 - start16) + (q8 - start8);
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

/* RoPE's table of a Llama-family config, as pytfm.nn.GPT makes it (ops.rope_inv_freq) */
static pytfm_status inv_freq_table(float **table, const char *func, const pytfm_model_config *c) {
    float *t = pytfm__scratch(func, c->head_dim / 2, sizeof(float));
    if (!t) return PYTFM_STATUS_OUT_OF_MEMORY;
    const int llama3 = c->rope_scaling == PYTFM_ROPE_SCALING_LLAMA3;
    const pytfm_status st = pytfm_rope_inv_freq(
        t, c->head_dim, c->rope_theta, c->rope_scaling, llama3 ? c->rope_factor : 1.0,
        llama3 ? c->rope_low_freq_factor : 1.0, llama3 ? c->rope_high_freq_factor : 2.0,
        llama3 ? c->rope_original_max_pos : 1.0);
    if (st != PYTFM_STATUS_OK) {
        free(t);
        return st;
    }
    *table = t;
    return PYTFM_STATUS_OK;
}

/* The model on the checked weights w (taken over: freed here on failure), in host memory. */
static pytfm_status build(pytfm_model **model, pytfm__weights *w, const char *func) {
    const pytfm_model_config *c = &w->config;
    pytfm_model *m = calloc(1, sizeof *m);
    layer *layers = m ? calloc((size_t)c->n_layer, sizeof *layers) : NULL;
    if (!layers) {
        free(m);
        free(w->params), free(w->w16);
        return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate the model", func);
    }
    m->config = *c;
    m->llama = c->arch == PYTFM_ARCH_LLAMA;
    m->C = c->d_model, m->H = c->n_head, m->V = c->vocab;
    m->D = m->llama ? c->head_dim : c->d_model / c->n_head;
    m->Hkv = m->llama ? c->n_kv_head : m->H;
    m->F = m->llama ? c->d_ff : 4 * m->C;
    m->qw = m->H * m->D, m->kvw = m->Hkv * m->D; /* within int64: the config's check */
    m->scale = (float)(1.0 / sqrt((double)m->D));
    m->eps = (float)c->norm_eps;
    m->dev = &pytfm__cpu_model_device;
    m->params = w->params;
    m->layers = layers;
    m->w16 = w->w16, m->n_w16 = w->n_w16;
    m->keeps_bf16 = w->w16 != NULL;
    m->precision = m->keeps_bf16 ? PYTFM_PRECISION_BF16 : PYTFM_PRECISION_FP32;
    pytfm_status st = PYTFM_STATUS_OK;
    if (m->llama) {
        st = inv_freq_table(&m->table, func, c);
        m->n_table = c->head_dim / 2;
    } else if (c->pos == PYTFM_POS_SINUSOIDAL) {
        st = sinusoidal_table(&m->table, func, c->max_seq, m->C);
        m->n_table = c->max_seq * m->C;
    }
    const int64_t walked = walk(m, m->params, m->w16, NULL, NULL, m->table);
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

/* A model that keeps BF16: its parameters in float32 into dst (device memory, the layout's
 * order) on stream, the matrices widened on the host STAGE floats at a time (the host holds
 * the BF16 matrices and one such piece, never a float32 copy), each piece's copy waited for
 * before the next is widened into the same buffer. */
enum { STAGE = 1 << 22 };
static pytfm_status widen_to_device(const pytfm_model *m, const pytfm__model_device *dev,
                                    float *dst, void *stream, const char *func) {
    const int64_t n16 = m->n_w16, stage = PYTFM_MIN(STAGE, n16);
    float *buf = pytfm__scratch(func, stage > 0 ? stage : 1, sizeof(float));
    if (!buf) return PYTFM_STATUS_OUT_OF_MEMORY;
    const float *p = m->params;
    const uint16_t *p16 = m->w16;
    pytfm_status st = PYTFM_STATUS_OK;
    int64_t shape[2];
    for (pytfm_param_info x = {.layer = -1, .part = -1};
         st == PYTFM_STATUS_OK && pytfm__param_next(&m->config, &x);) {
        pytfm__param_shape(&x, shape);
        const int64_t count = shape[0] * shape[1];
        if (x.ndim != 2) {
            st = dev->to_device(func, dst, p, count * (int64_t)sizeof(float), stream);
            p += count, dst += count;
            continue;
        }
        for (int64_t i0 = 0; st == PYTFM_STATUS_OK && i0 < count; i0 += stage) {
            const int64_t piece = PYTFM_MIN(stage, count - i0);
            for (int64_t i = 0; i < piece; i++) { // exactly: the top half of a float
                const uint32_t u = (uint32_t)p16[i0 + i] << 16;
                memcpy(buf + i, &u, sizeof u);
            }
            st = dev->to_device(func, dst + i0, buf, piece * (int64_t)sizeof(float), stream);
            if (st == PYTFM_STATUS_OK) st = dev->sync(func, stream);
        }
        p16 += count, dst += count;
    }
    free(buf);
    return st;
}

/* The host model m onto the device dev: its parameters (in float32: a model that keeps BF16
 * is widened) and table copied there, in one allocation, and walked anew; the host copies
 * freed. */
static pytfm_status to_device(pytfm_model *m, const pytfm__model_device *dev,
                              const char *func) {
    const int64_t n = m->config.n_params, n_pe = m->n_table;
    float *p = NULL;
    void *stream = NULL;
    pytfm_status st = dev->alloc(func, (void **)&p, (n + n_pe) * (int64_t)sizeof(float));
    if (st == PYTFM_STATUS_OK) st = dev->stream_open(func, &stream);
    if (st == PYTFM_STATUS_OK && m->keeps_bf16)
        st = widen_to_device(m, dev, p, stream, func);
    else if (st == PYTFM_STATUS_OK)
        st = dev->to_device(func, p, m->params, n * (int64_t)sizeof(float), stream);
    if (st == PYTFM_STATUS_OK && m->table)
        st = dev->to_device(func, p + n, m->table, n_pe * (int64_t)sizeof(float), stream);
    const pytfm_status closed = dev->stream_close(func, stream);
    if (st == PYTFM_STATUS_OK) st = closed;
    if (st != PYTFM_STATUS_OK) {
        dev->release(p);
        return st;
    }
    walk(m, p, NULL, NULL, NULL, m->table ? p + n : NULL);
    free(m->params), free(m->table), free(m->w16);
    m->params = m->table = NULL;
    m->w16 = NULL, m->keeps_bf16 = 0, m->n_w16 = 0;
    m->precision = PYTFM_PRECISION_FP32; // the CUDA twins compute in float32 only
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
    if (stat(path, &s) == 0 && S_ISDIR(s.st_mode)) { // a Hugging Face folder
        int32_t arch;
        PYTFM_TRY(pytfm_folder_arch(path, &arch));
        pytfm__weights w;
        const pytfm_status status = arch == PYTFM_ARCH_LLAMA ? pytfm__llama_weights(path, &w)
                                                             : pytfm__gpt2_weights(path, &w);
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
    free(model->w32);
    free(model->q8);
    free(model->s8);
    free(model->table);
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

/* dst[i] = the float whose top half is src[i] (exactly), i < count */
static void widen(float *dst, const uint16_t *src, int64_t count) {
    PYTFM_PARALLEL_FOR_IF(count > 4 * PYTFM_TASK_ELEMS)
    for (int64_t i0 = 0; i0 < count; i0 += PYTFM_TASK_ELEMS)
        for (int64_t i = i0; i < PYTFM_MIN(count, i0 + PYTFM_TASK_ELEMS); i++) {
            const uint32_t u = (uint32_t)src[i] << 16;
            memcpy(dst + i, &u, sizeof u);
        }
}

/* A model that keeps BF16 into precision: FP32 widens the kept matrices into an allocation of
 * their own, in the same order, and points the float32 weights there; BF16 frees it (the
 * products read the kept matrices again). */
static pytfm_status keeper_precision(pytfm_model *m, int32_t precision, const char *func) {
    float *w32 = NULL;
    if (precision == PYTFM_PRECISION_FP32) {
        w32 = pytfm__weights_alloc((size_t)m->n_w16 * sizeof(float));
        if (!w32)
            return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                               "%s: cannot allocate %lld bytes of float32 weights", func,
                               (long long)m->n_w16 * 4);
        widen(w32, m->w16, m->n_w16);
    }
    for (int64_t i = 0; i < m->config.n_layer; i++) {
        layer *l = &m->layers[i];
        for (int r = 0; r < MATRICES; r++)
            if (l->w16[r]) l->w[r] = w32 ? w32 + (l->w16[r] - m->w16) : NULL;
    }
    m->wte = w32 ? w32 + (m->wte16 - m->w16) : NULL;
    m->lm_head = w32 ? w32 + (m->lm_head16 - m->w16) : NULL;
    free(m->w32);
    m->w32 = w32;
    m->precision = precision;
    return PYTFM_STATUS_OK;
}

/* The model into PYTFM_PRECISION_INT8: every matrix quantised() (pytfm_quantize_q8, or
 * pytfm_quantize_q8_bf16 from the matrices a model that keeps BF16 holds) into one allocation
 * of int8 values and one of scales, the other parameters copied into a float32 allocation of
 * their own, then every float32 and BF16 copy of the matrices freed and the model walked anew.
 * A matrix whose input dimension is not a multiple of the block is refused, naming it, before
 * anything is allocated; on any failure the model is left as it was. */
static pytfm_status to_int8(pytfm_model *m, const char *func) {
    const pytfm_model_config *c = &m->config;
    int64_t n8 = 0, shape[2];
    for (pytfm_param_info x = {.layer = -1, .part = -1}; pytfm__param_next(c, &x);) {
        pytfm__param_shape(&x, shape);
        if (!quantised(m, &x)) continue;
        if (shape[1] % PYTFM_Q8_BLOCK != 0)
            return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                               "%s: PYTFM_PRECISION_INT8 quantises each weight matrix [out, in] in "
                               "blocks of %d along in, and %s is [%lld, %lld]: %lld is not a "
                               "multiple of %d (run this model in FP32 or BF16)",
                               func, PYTFM_Q8_BLOCK, x.name, (long long)shape[0],
                               (long long)shape[1], (long long)shape[1], PYTFM_Q8_BLOCK);
        n8 += shape[0] * shape[1];
    }
    const int64_t n32 = c->n_params - n8;
    int8_t *q8 = pytfm__weights_alloc((size_t)n8);
    uint16_t *s8 = pytfm__weights_alloc((size_t)(n8 / PYTFM_Q8_BLOCK) * sizeof(uint16_t));
    float *vectors = pytfm__weights_alloc((size_t)(n32 > 0 ? n32 : 1) * sizeof(float));
    if (!q8 || !s8 || !vectors) {
        free(q8), free(s8), free(vectors);
        return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                           "%s: cannot allocate %lld bytes of int8 weights and their scales", func,
                           (long long)(n8 + n8 / PYTFM_Q8_BLOCK * 2 + n32 * 4));
    }
    // walk the parameters where they are now: the matrices of a model that keeps BF16 in w16
    const float *p = m->params;
    const uint16_t *p16 = m->keeps_bf16 ? m->w16 : NULL;
    int8_t *q = q8;
    uint16_t *sc = s8;
    float *v = vectors;
    pytfm_status st = PYTFM_STATUS_OK;
    for (pytfm_param_info x = {.layer = -1, .part = -1};
         st == PYTFM_STATUS_OK && pytfm__param_next(c, &x);) {
        pytfm__param_shape(&x, shape);
        const int64_t n = shape[0] * shape[1];
        const uint16_t *src16 = p16 && x.ndim == 2 ? p16 : NULL;
        const float *src = src16 ? NULL : p;
        if (src16) p16 += n;
        else p += n;
        if (!quantised(m, &x)) { // a kept model's matrices are all quantised: src is float32
            memcpy(v, src, (size_t)n * sizeof(float));
            v += n;
            continue;
        }
        st = src16 ? pytfm_quantize_q8_bf16(q, sc, src16, shape[0], shape[1])
                   : pytfm_quantize_q8(q, sc, src, shape[0], shape[1]);
        if (st != PYTFM_STATUS_OK) { // the kernel's words, with the matrix's name
            char why[512];
            snprintf(why, sizeof why, "%s", pytfm_last_error());
            st = pytfm__fail(st, "%s: quantising %s: %s", func, x.name, why);
        }
        q += n, sc += n / PYTFM_Q8_BLOCK;
    }
    if (st != PYTFM_STATUS_OK) {
        free(q8), free(s8), free(vectors);
        return st;
    }
    free(m->params), free(m->w16), free(m->w32);
    m->params = vectors, m->w16 = NULL, m->w32 = NULL;
    m->keeps_bf16 = 0, m->n_w16 = 0;
    m->q8 = q8, m->s8 = s8;
    for (int64_t i = 0; i < c->n_layer; i++)
        for (int r = 0; r < MATRICES; r++) m->layers[i].w16[r] = NULL; /* GPT's BF16 copies */
    walk(m, vectors, NULL, q8, s8, m->table); // n32 + n8 values: the layout's, counted above
    m->precision = PYTFM_PRECISION_INT8;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_model_set_precision(pytfm_model *model, int32_t precision) {
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", __func__);
    PYTFM_CHECK(precision == PYTFM_PRECISION_FP32 || precision == PYTFM_PRECISION_BF16 ||
                    precision == PYTFM_PRECISION_INT8,
                "%s: precision must be a pytfm_precision (0: FP32, 1: BF16) or "
                "PYTFM_PRECISION_INT8 (3), got %d",
                __func__, (int)precision);
    if (precision == model->precision) return PYTFM_STATUS_OK;
    if (!model->dev->host) // the GPU: the CUDA twins compute in float32 only
        return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                           "%s: a model on PYTFM_DEVICE_CUDA computes in PYTFM_PRECISION_FP32 only%s",
                           __func__,
                           precision == PYTFM_PRECISION_INT8
                               ? " (PYTFM_PRECISION_INT8 runs on the CPU: open the model on "
                                 "PYTFM_DEVICE_CPU)"
                               : "");
    if (model->precision == PYTFM_PRECISION_INT8)
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: the model is in PYTFM_PRECISION_INT8, which holds its weight "
                           "matrices as int8 blocks only (their float32 and BF16 values were freed "
                           "when it was quantised): open the model again for precision %d",
                           __func__, (int)precision);
    if (precision == PYTFM_PRECISION_INT8) return to_int8(model, __func__);
    if (model->keeps_bf16) return keeper_precision(model, precision, __func__);
    const int64_t C = model->C, L = model->config.n_layer;
    if (precision == PYTFM_PRECISION_FP32) {
        free(model->w16);
        model->w16 = NULL, model->lm_head16 = NULL;
        for (int64_t i = 0; i < L; i++)
            for (int r = 0; r < MATRICES; r++) model->layers[i].w16[r] = NULL;
        model->precision = precision;
        return PYTFM_STATUS_OK;
    }
    // every block's matrices and the LM head's V·C: within the parameters the reader checked
    int64_t count = model->V * C;
    for (int64_t i = 0; i < L; i++)
        for (int r = 0; r < MATRICES; r++)
            if (model->layers[i].w[r])
                count += model->layers[i].rows[r] * model->layers[i].cols[r];
    uint16_t *w16 = pytfm__weights_alloc((size_t)count * sizeof(uint16_t));
    if (!w16)
        return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                           "%s: cannot allocate %lld bytes of BF16 weights", __func__,
                           (long long)count * 2);
    uint16_t *p = w16;
    for (int64_t i = 0; i < L; i++) {
        layer *l = &model->layers[i];
        for (int r = 0; r < MATRICES; r++)
            if (l->w[r]) l->w16[r] = p, p = to_bf16(p, l->w[r], l->rows[r] * l->cols[r]);
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

/* the bytes of one cached key or value: a float, or its BF16 bits */
static int64_t kv_bytes(int32_t kv_precision) {
    return kv_precision == PYTFM_PRECISION_BF16 ? (int64_t)sizeof(uint16_t)
                                                : (int64_t)sizeof(float);
}

/*
 * The activations of one call, N = B·T tokens at T positions, carved from one scratch buffer
 * of floats on the model's device (widths: C the model's, qw = H·D and kvw = Hkv·D those of q
 * and of k and v, F the MLP's hidden width):
 *   pos     [T] int64 positions (2·T floats, at the buffer's aligned start)
 *   tokens  [N] int64 token ids (2·N floats; only off the host: the device's copy of them)
 *   x       [N, C] the residual stream
 *   a       [N, max(C, qw)] a norm's output, then attention's (and Llama's normed q or k)
 *   qkv     [N, qw + 2·kvw] the attention's input projection
 *   q, k, v [B, T, H, D], [B, T, Hkv, D] twice, adjacent
 *   h       [N, F] the MLP's hidden layer (GPT: c_fc's output, GELU in place; Llama: gate's)
 *   u, s    [N, F] each, Llama only: up's output, and silu(h) ∘ u
 *   proj    [N, C] an output projection's, added to x
 *   mean, rstd, lse, rstd_h  [N], [N], [B, H, T], [N, H]: what the kernels save, unused here
 *   head    [N, vocab] every row's logits (only where asked), else NULL
 */
typedef struct acts {
    int64_t *pos, *tokens;
    float *x, *a, *qkv, *q, *k, *v, *h, *u, *s, *proj, *mean, *rstd, *lse, *rstd_h, *head;
    int32_t kv_precision; /* a session's caches: float (PYTFM_PRECISION_FP32) or BF16 bits */
} acts;

/* The floats of the buffer (tokens, head_vocab: room for the token ids, for every row's logits
 * of that vocabulary (0: none)) into *floats; 0 when that is more than memory can address. */
static int acts_floats(const pytfm_model *m, int64_t N, int64_t T, int tokens,
                       int64_t head_vocab, int64_t *floats) {
    const int64_t C = m->C, qkv = m->qw + 2 * m->kvw, F = m->F;
    const int64_t per_token = 2 * C + (C > m->qw ? C : m->qw) + 2 * qkv + (m->llama ? 3 : 1) * F +
                              2 + 2 * m->H + (tokens ? 2 : 0) + head_vocab;
    return pytfm__mul_within(N, per_token, pytfm__max_elems(sizeof(float)), floats) &&
           pytfm__add_within(*floats, 2 * T, pytfm__max_elems(sizeof(float)), floats);
}

/* The arrays in buf, laid out as above (tokens, head as in acts_floats). */
static acts acts_carve(const pytfm_model *m, float *buf, int64_t N, int64_t T, int tokens,
                       int head) {
    const int64_t C = m->C, F = m->F;
    acts s;
    float *p = buf;
    s.pos = (int64_t *)(void *)p, p += 2 * T;
    s.tokens = tokens ? (int64_t *)(void *)p : NULL, p += tokens ? 2 * N : 0;
    s.x = p, p += N * C;
    s.a = p, p += N * (C > m->qw ? C : m->qw);
    s.qkv = p, p += N * (m->qw + 2 * m->kvw);
    s.q = p, p += N * m->qw;
    s.k = p, p += N * m->kvw;
    s.v = p, p += N * m->kvw;
    s.h = p, p += N * F;
    s.u = m->llama ? p : NULL, p += m->llama ? N * F : 0;
    s.s = m->llama ? p : NULL, p += m->llama ? N * F : 0;
    s.proj = p, p += N * C;
    s.mean = p, p += N;
    s.rstd = p, p += N;
    s.lse = p, p += N * m->H;
    s.rstd_h = p, p += N * m->H;
    s.head = head ? p : NULL;
    return s;
}

/* a linear layer of role r of block L: y [N, rows] = x [N, cols]·wᵀ + b */
static pytfm_status matmul(const pytfm_model *m, const layer *L, int r, float *y, const float *x,
                           int64_t N, void *stream) {
    if (m->precision == PYTFM_PRECISION_INT8)
        return m->dev->linear_q8(y, x, L->q8[r], L->s8[r], L->b[r], N, L->cols[r], L->rows[r],
                                 stream);
    const uint16_t *w16 = m->precision == PYTFM_PRECISION_BF16 ? L->w16[r] : NULL;
    return m->dev->linear(y, x, L->w[r], w16, L->b[r], N, L->cols[r], L->rows[r], stream);
}

/* attention of q [B, T, H, D] to k, v [B, T, Hkv, D] into o, as GroupedQueryAttention's (and
 * CausalSelfAttention's) forward: through a session's caches (this layer's [max_len, Hkv·D]
 * pair, the new keys appended at start) or over the whole sequence (k_cache NULL) */
static pytfm_status attend(const pytfm_model *m, const acts *s, float *o, int64_t B, int64_t T,
                           int64_t start, void *k_cache, void *v_cache, int64_t max_len,
                           void *stream) {
    const pytfm__model_device *dev = m->dev;
    const int64_t window = m->llama ? m->config.sliding_window : 0;
    if (!k_cache)
        return dev->attention(o, s->lse, s->q, s->k, s->v, B, T, m->H, m->Hkv, m->D, m->scale,
                              1, window, stream);
    // KVCache.attend: append, then attend to everything cached
    if (s->kv_precision == PYTFM_PRECISION_BF16) { // the CPU's only (session_open_ex refuses)
        PYTFM_TRY(dev->cache_append_bf16(k_cache, v_cache, s->k, s->v, 1, T, m->Hkv, m->D,
                                         max_len, start, stream));
        return dev->decode_bf16(o, s->lse, s->q, k_cache, v_cache, 1, T, m->H, m->Hkv, m->D,
                                max_len, start, m->scale, window, stream);
    }
    PYTFM_TRY(dev->cache_append(k_cache, v_cache, s->k, s->v, 1, T, m->Hkv, m->D, max_len,
                                start, stream));
    return dev->decode(o, s->lse, s->q, k_cache, v_cache, 1, T, m->H, m->Hkv, m->D, max_len,
                       start, m->scale, window, stream);
}

/* one GPT block, as pytfm.nn.Block.forward; caches as attend's */
static pytfm_status block(const pytfm_model *m, const layer *L, const acts *s, int64_t B,
                          int64_t T, int64_t start, void *k_cache, void *v_cache,
                          int64_t max_len, void *stream, const char *func) {
    const pytfm__model_device *dev = m->dev;
    const int64_t C = m->C, H = m->H, D = m->D, N = B * T;
    // x + attn(ln_1(x))
    PYTFM_TRY(dev->layernorm(s->a, s->mean, s->rstd, s->x, L->ln_1_w, L->ln_1_b, N, C,
                             PYTFM_LAYERNORM_EPS, stream));
    PYTFM_TRY(matmul(m, L, ATTN_IN, s->qkv, s->a, N, stream));
    // qkv (B, T, 3, H, D) -> q, k, v (B, T, H, D), q and k rotated: as pytfm.nn does it
    PYTFM_TRY(dev->qkv_split(s->q, s->k, s->v, s->qkv, s->pos, B, T, H, D, 0, PYTFM_ROPE_BASE,
                             m->config.pos == PYTFM_POS_ROPE, stream));
    PYTFM_TRY(attend(m, s, s->a, B, T, start, k_cache, v_cache, max_len, stream));
    PYTFM_TRY(matmul(m, L, ATTN_OUT, s->proj, s->a, N, stream));
    PYTFM_TRY(dev->add_rows(func, s->x, s->proj, N, C, N, 0, stream));
    // x + mlp(ln_2(x))
    PYTFM_TRY(dev->layernorm(s->a, s->mean, s->rstd, s->x, L->ln_2_w, L->ln_2_b, N, C,
                             PYTFM_LAYERNORM_EPS, stream));
    PYTFM_TRY(matmul(m, L, MLP_IN, s->h, s->a, N, stream));
    PYTFM_TRY(dev->gelu(s->h, s->h, N * m->F, stream));
    PYTFM_TRY(matmul(m, L, MLP_OUT, s->proj, s->h, N, stream));
    return dev->add_rows(func, s->x, s->proj, N, C, N, 0, stream);
}

/* one Llama-family block, as pytfm.nn.Block.forward of GroupedQueryAttention and SwiGLU;
 * caches as attend's */
static pytfm_status llama_block(const pytfm_model *m, const layer *L, const acts *s, int64_t B,
                                int64_t T, int64_t start, void *k_cache, void *v_cache,
                                int64_t max_len, void *stream, const char *func) {
    const pytfm__model_device *dev = m->dev;
    const int64_t C = m->C, D = m->D, N = B * T, qw = m->qw, kvw = m->kvw, F = m->F;
    const float *const *p = L->llama;
    // x + attn(rmsnorm(x))
    PYTFM_TRY(dev->rmsnorm(s->a, s->rstd, s->x, p[PYTFM__LLAMA_LN_1], N, C, m->eps, stream));
    PYTFM_TRY(matmul(m, L, ATTN_IN, s->qkv, s->a, N, stream));
    // q, k, v: qkv's column blocks, each made contiguous ((B, T, heads, D) for the kernels)
    const int64_t width = qw + 2 * kvw;
    PYTFM_TRY(dev->copy_cols(func, s->q, s->qkv, N, width, 0, qw, stream));
    PYTFM_TRY(dev->copy_cols(func, s->k, s->qkv, N, width, qw, kvw, stream));
    PYTFM_TRY(dev->copy_cols(func, s->v, s->qkv, N, width, qw + kvw, kvw, stream));
    float *qk[2] = {s->q, s->k};
    const int64_t heads[2] = {m->H, m->Hkv};
    for (int i = 0; i < 2; i++) { // q and k: normed per head (Qwen 3), then rotated
        const float *in = qk[i];
        if (p[PYTFM__LLAMA_Q_NORM]) {
            PYTFM_TRY(dev->rmsnorm(s->a, s->rstd_h, qk[i], p[PYTFM__LLAMA_Q_NORM + i],
                                   N * heads[i], D, m->eps, stream));
            in = s->a;
        }
        PYTFM_TRY(dev->rope_freq(qk[i], in, s->pos, m->inv_freq, B, T, heads[i], D, 0,
                                 stream));
    }
    PYTFM_TRY(attend(m, s, s->a, B, T, start, k_cache, v_cache, max_len, stream));
    PYTFM_TRY(matmul(m, L, ATTN_OUT, s->proj, s->a, N, stream));
    PYTFM_TRY(dev->add_rows(func, s->x, s->proj, N, C, N, 0, stream));
    // x + down(silu(gate(a)) ∘ up(a)), a = rmsnorm(x)
    PYTFM_TRY(dev->rmsnorm(s->a, s->rstd, s->x, p[PYTFM__LLAMA_LN_2], N, C, m->eps, stream));
    PYTFM_TRY(matmul(m, L, MLP_IN, s->h, s->a, N, stream));
    PYTFM_TRY(matmul(m, L, MLP_UP, s->u, s->a, N, stream));
    PYTFM_TRY(dev->swiglu(s->s, s->h, s->u, N * F, stream));
    PYTFM_TRY(matmul(m, L, MLP_OUT, s->proj, s->s, N, stream));
    return dev->add_rows(func, s->x, s->proj, N, C, N, 0, stream);
}

/* pytfm.nn.GPT._logits of tokens [B, T] (on the device) at positions [start, start + T), the
 * positions in s: every row's logits into out [B, T, vocab] (NULL: none). caches: a session's
 * n_layer pairs of [max_len, Hkv·D] caches (B = 1), or NULL. */
static pytfm_status logits_of(const pytfm_model *m, const acts *s, float *out,
                              const int64_t *tokens, int64_t B, int64_t T, int64_t start,
                              void *caches, int64_t max_len, void *stream, const char *func) {
    const pytfm__model_device *dev = m->dev;
    const int64_t C = m->C, V = m->V, N = B * T;
    if (m->wte)
        PYTFM_TRY(dev->embedding(s->x, tokens, m->wte, N, V, C, stream));
    else if (m->wte_q8) // INT8 (host memory)
        PYTFM_TRY(dev->embedding_q8(s->x, tokens, m->wte_q8, m->wte_s8, N, V, C, stream));
    else // a model that keeps BF16, in BF16 (host memory)
        PYTFM_TRY(pytfm__embedding_forward_bf16(s->x, tokens, m->wte16, N, V, C));
    if (m->positions) // x += positions[start : start + T], broadcast over the batch
        PYTFM_TRY(dev->add_rows(func, s->x, m->positions, N, C, T, start, stream));
    for (int64_t i = 0; i < m->config.n_layer; i++) {
        const int64_t bytes = max_len * m->kvw * kv_bytes(s->kv_precision); // one cache
        void *k_cache = caches ? (char *)caches + 2 * i * bytes : NULL;
        void *v_cache = caches ? (char *)k_cache + bytes : NULL;
        PYTFM_TRY((m->llama ? llama_block : block)(m, &m->layers[i], s, B, T, start, k_cache,
                                                   v_cache, max_len, stream, func));
    }
    if (!out) return PYTFM_STATUS_OK;
    // the LM head on every row, as Python: one linear over N rows gives each row the bits it
    // gets in GPT.decode, whose product has N rows too
    if (m->llama)
        PYTFM_TRY(dev->rmsnorm(s->a, s->rstd, s->x, m->ln_f_w, N, C, m->eps, stream));
    else
        PYTFM_TRY(dev->layernorm(s->a, s->mean, s->rstd, s->x, m->ln_f_w, m->ln_f_b, N, C,
                                 PYTFM_LAYERNORM_EPS, stream));
    if (m->precision == PYTFM_PRECISION_INT8)
        return dev->linear_q8(out, s->a, m->lm_head_q8, m->lm_head_s8, NULL, N, C, V, stream);
    const uint16_t *head16 = m->precision == PYTFM_PRECISION_BF16 ? m->lm_head16 : NULL;
    return dev->linear(out, s->a, m->lm_head, head16, NULL, N, C, V, stream);
}

/* The logits of tokens [B, T] (host memory, checked) at positions [start, start + T), on
 * stream: into logits [B, T, vocab] (a forward: caches NULL) or, for a session (B = 1, caches:
 * its n_layer pairs of [max_len, C] caches), those of the last token into logits [vocab] (NULL:
 * none), both host memory. The activations allocated and given back; returns once the stream's
 * work is done. */
static pytfm_status run(const char *func, const pytfm_model *m, float *logits,
                        const int64_t *tokens, int64_t B, int64_t T, int64_t start,
                        void *caches, int32_t kv_precision, int64_t max_len, void *stream) {
    const pytfm__model_device *dev = m->dev;
    const int64_t N = B * T, V = m->V;
    // the LM head writes into logits where it can (host memory, and every row wanted), else
    // every row into the scratch, from which the wanted ones are copied
    const int in_place = dev->host && !(caches && N > 1);
    const int head = logits && !in_place;
    int64_t floats = 0;
    if (!acts_floats(m, N, T, !dev->host, head ? V : 0, &floats))
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: %lld tokens need more scratch than memory can address", func,
                           (long long)N);
    int64_t *pos = pytfm__scratch(func, T, sizeof *pos);
    if (!pos) return PYTFM_STATUS_OUT_OF_MEMORY;
    for (int64_t t = 0; t < T; t++) pos[t] = start + t;
    float *buf = NULL;
    pytfm_status st = dev->scratch(func, (void **)&buf, floats * (int64_t)sizeof(float), stream);
    if (st == PYTFM_STATUS_OK) {
        acts s = acts_carve(m, buf, N, T, !dev->host, head);
        s.kv_precision = kv_precision;
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
    const pytfm_status st =
        run(__func__, model, logits, tokens, B, T, 0, NULL, PYTFM_PRECISION_FP32, 0, stream);
    const pytfm_status closed = dev->stream_close(__func__, stream);
    return st != PYTFM_STATUS_OK ? st : closed;
}

/* ---- sessions ------------------------------------------------------------------------------ */

struct pytfm_session {
    const pytfm_model *model;
    int64_t max_len;
    int64_t length; /* positions [0, length) of the caches hold the tokens fed */
    void *caches;   /* on the model's device: n_layer × (k, v), each [max_len, Hkv·D] =
                       [1, max_len, Hkv, D] floats, or BF16 bits (kv_precision BF16):
                       grouped-query heads store Hkv heads only */
    int32_t kv_precision;
    void *stream;   /* the session's own, on the model's device */
};

/* pytfm_session_open_ex, its messages named after func (the function the user called) */
static pytfm_status session_open(const char *func, pytfm_session **session,
                                 const pytfm_model *model, int64_t max_len,
                                 int32_t kv_precision) {
    PYTFM_CHECK(session != NULL, "%s: session must not be NULL", func);
    *session = NULL;
    PYTFM_CHECK(model != NULL, "%s: model must not be NULL", func);
    PYTFM_CHECK(kv_precision == PYTFM_PRECISION_FP32 || kv_precision == PYTFM_PRECISION_BF16,
                "%s: kv_precision must be PYTFM_PRECISION_FP32 or PYTFM_PRECISION_BF16, got %d",
                func, (int)kv_precision);
    if (kv_precision == PYTFM_PRECISION_BF16 && !model->dev->decode_bf16)
        return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                           "%s: kv_precision PYTFM_PRECISION_BF16 (a BF16 KV cache) runs on the "
                           "CPU only; this model's device has no BF16 cache: use "
                           "PYTFM_PRECISION_FP32", func);
    const int64_t max_seq = model->config.max_seq;
    PYTFM_CHECK(max_len >= 0 && max_len <= max_seq,
                "%s: max_len must be in [1, max_seq = %lld], or 0 for max_seq; got %lld",
                func, (long long)max_seq, (long long)max_len);
    if (max_len == 0) max_len = max_seq;
    const int64_t n_layer = model->config.n_layer, kvw = model->kvw;
    int64_t count = 0;
    if (kv_precision == PYTFM_PRECISION_BF16)
        PYTFM_CHECK_COUNT(func, &count, uint16_t, n_layer, 2, max_len, kvw);
    else
        PYTFM_CHECK_COUNT(func, &count, float, n_layer, 2, max_len, kvw);
    pytfm_session *s = calloc(1, sizeof *s);
    if (!s) return pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate a session",
                               func);
    s->model = model;
    s->max_len = max_len;
    s->kv_precision = kv_precision;
    const pytfm__model_device *dev = model->dev;
    pytfm_status st = dev->alloc(func, &s->caches, count * kv_bytes(kv_precision));
    if (st == PYTFM_STATUS_OUT_OF_MEMORY)
        st = pytfm__fail(st, "%s: cannot allocate KV caches of %lld positions (%lld values)",
                         func, (long long)max_len, (long long)count);
    if (st == PYTFM_STATUS_OK) st = dev->stream_open(func, &s->stream);
    if (st != PYTFM_STATUS_OK) {
        pytfm_session_close(s);
        return st;
    }
    *session = s;
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_session_open(pytfm_session **session, const pytfm_model *model,
                                int64_t max_len) {
    return session_open(__func__, session, model, max_len, PYTFM_PRECISION_FP32);
}

pytfm_status pytfm_session_open_ex(pytfm_session **session, const pytfm_model *model,
                                   int64_t max_len, int32_t kv_precision) {
    return session_open(__func__, session, model, max_len, kv_precision);
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
    PYTFM_TRY(run(__func__, m, logits, tokens, 1, n, length, session->caches,
                  session->kv_precision, max_len, session->stream));
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
