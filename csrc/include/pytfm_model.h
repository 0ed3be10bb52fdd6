/*
 * pytfm_model.h — a GPT in C: the checkpoint reader (safetensors files, pytfm checkpoints,
 * Hugging Face GPT-2 folders), a model read from a checkpoint or a folder, its forward pass,
 * decoding sessions with a KV cache, and sampling.
 *
 * Everything between this header's PYTFM_CDEF markers is read verbatim by the cffi builder
 * (pytfm/_build_ffi.py), so it must stay plain declarations: no macros but PYTFM_API.
 */
#ifndef PYTFM_MODEL_H
#define PYTFM_MODEL_H

#include "pytfm_core.h"

/* The model's constants (pytfm.nn's model's too: pytfm.ops takes them as its defaults, from
 * here): LayerNorm's eps, and RoPE's base (pair i of a head of D dims turns by
 * t·base^(−2i/D) at position t). Python reads each as a float, pytfm._pytfm_cffi.lib.<name>
 * (the cffi builder declares every floating-point PYTFM_ macro of the public headers). */
#define PYTFM_LAYERNORM_EPS 1e-5
#define PYTFM_ROPE_BASE 10000.0

#ifdef __cplusplus
extern "C" {
#endif

/* PYTFM_CDEF_BEGIN */

/* ---- Safetensors files: the one checkpoint reader --------------------------------------- */
/*
 * The reader trusts no byte of a file. It has two layers, each a call of its own:
 *   1. pytfm_safetensors_open*: the safetensors format (https://github.com/huggingface/
 *      safetensors): an 8-byte little-endian header length N (at most the file less 8 and at
 *      most PYTFM_SAFETENSORS_MAX_HEADER), N bytes of strict UTF-8 JSON (pytfm_json_check), an
 *      object whose "__metadata__" (optional) maps strings to strings and whose every other
 *      member is a tensor {"dtype": "F32" | "I64", "shape": [ints >= 0] (at most
 *      PYTFM_SAFETENSORS_MAX_NDIM of them, its bytes within int64), "data_offsets": [begin,
 *      end]} with 0 <= begin <= end <= the data and end − begin its bytes; the tensors' data,
 *      in offset order, tiling the data after the header exactly (no gap, no overlap, no byte
 *      left over). Any layout of tensors passes: what they must be is the next layer's rule.
 *      A file whose header length runs past its end is "truncated?" when a JSON object starts
 *      at byte 8, else "not a safetensors file" (a text, an image, a pickle).
 *   2. pytfm_checkpoint_check: a pytfm checkpoint (pytfm.checkpoint.save) on top of that.
 * Opening reads the header alone (one allocation of at most the file's size) and keeps a
 * table of it (the entries, their names and the metadata unescaped: proportional to the
 * header); a tensor's bytes are read only when asked for (pytfm_safetensors_read).
 *
 * A failure is PYTFM_STATUS_INVALID_ARGUMENT (PYTFM_STATUS_OUT_OF_MEMORY when memory ran out)
 * with a message in pytfm_last_error(): "<source>: <what is wrong>", naming the field or the
 * tensor. Where a system call failed (open, fstat, read) the open and read functions leave
 * errno at its error number; after any other failure of those and of pytfm_checkpoint_check
 * (the file's content is at fault) errno is 0. */

/* The limits of the format as the reader takes it. */
enum {
    PYTFM_SAFETENSORS_MAX_HEADER = 100000000, /* bytes of header: the reference's limit */
    PYTFM_SAFETENSORS_MAX_NDIM = 32,          /* dimensions of a tensor (NumPy 1.x's limit) */
    PYTFM_JSON_MAX_DEPTH = 64                 /* JSON containers open at once, at most */
};

/* A tensor's element type, as the header names it ("F32", "I64"); little-endian in the file.
 * The safetensors functions take F32 and I64 only; the Llama-family folder reader
 * (pytfm_llama_open) takes BF16 and F16 weights too, converting them to float32 as it reads. */
typedef enum pytfm_dtype {
    PYTFM_DTYPE_F32 = 0, /* float32 */
    PYTFM_DTYPE_I64 = 1, /* int64 */
    PYTFM_DTYPE_BF16 = 2, /* bfloat16 */
    PYTFM_DTYPE_F16 = 3   /* IEEE half */
} pytfm_dtype;

typedef struct pytfm_safetensors pytfm_safetensors;

/* One tensor of an open file, as its header says (checked). */
typedef struct pytfm_tensor_info {
    const char *name; /* UTF-8, name_len bytes then a NUL (an escaped \u0000 may sit inside);
                         valid until the file is closed */
    int64_t name_len;
    int32_t dtype;       /* a pytfm_dtype */
    int32_t ndim;        /* 0 .. PYTFM_SAFETENSORS_MAX_NDIM */
    int64_t shape[32];   /* [ndim] sizes, row-major; the rest 0 */
    int64_t nbytes;      /* its bytes: end − begin, the product of the shape and the item size */
    int64_t begin, end;  /* its data_offsets, within the data */
    int64_t file_offset; /* where its bytes start in the file: 8 + header length + begin */
} pytfm_tensor_info;

/* One member of __metadata__ (unescaped UTF-8, each then a NUL; valid until close). */
typedef struct pytfm_metadata_item {
    const char *key;
    int64_t key_len;
    const char *value;
    int64_t value_len;
} pytfm_metadata_item;

/* Open the file at path and check its header (layer 1). Opened O_NONBLOCK, so that a FIFO is
 * refused at once ("not a regular file") instead of waiting for a writer, and O_NOCTTY; the
 * file stays open until pytfm_safetensors_close. Messages name path. On failure *st is NULL.
 *   st  receives the handle */
PYTFM_API pytfm_status pytfm_safetensors_open(pytfm_safetensors **st, const char *path);

/* The same on a file the caller opened for reading (O_NONBLOCK|O_NOCTTY recommended, as
 * above): anything but a regular file is refused; O_NONBLOCK is cleared. fd stays the
 * caller's: it must stay open while st is, and pytfm_safetensors_close does not close it.
 *   source  names the file in messages ("<source>: ..."); NULL: messages name nothing (the
 *           caller adds the name) */
PYTFM_API pytfm_status pytfm_safetensors_open_fd(pytfm_safetensors **st, int32_t fd,
                                                 const char *source);

/* The same on size bytes of a file in memory, which stay the caller's and must outlive st
 * (nothing is copied but the names and metadata). source as pytfm_safetensors_open_fd. */
PYTFM_API pytfm_status pytfm_safetensors_open_memory(pytfm_safetensors **st, const void *data,
                                                     int64_t size, const char *source);

/* Free st (NULL: nothing to do), closing the file pytfm_safetensors_open opened. */
PYTFM_API pytfm_status pytfm_safetensors_close(pytfm_safetensors *st);

/* The number of tensors; they are numbered 0 .. count − 1 in the header's order. */
PYTFM_API pytfm_status pytfm_safetensors_tensor_count(const pytfm_safetensors *st,
                                                      int64_t *count);

/* Fill *info with tensor index (0 <= index < count, else PYTFM_STATUS_OUT_OF_RANGE). */
PYTFM_API pytfm_status pytfm_safetensors_tensor(const pytfm_safetensors *st, int64_t index,
                                                pytfm_tensor_info *info);

/* *index = the tensor named name (NUL-terminated UTF-8), or −1 when there is none. */
PYTFM_API pytfm_status pytfm_safetensors_find(const pytfm_safetensors *st, const char *name,
                                              int64_t *index);

/* Copy tensor index's bytes, as stored (little-endian), into out, which holds size bytes:
 * size must be its nbytes. From a file with pread (st may be read from several threads at
 * once); a file that has shrunk since the open is an error naming the tensor. */
PYTFM_API pytfm_status pytfm_safetensors_read(const pytfm_safetensors *st, int64_t index,
                                              void *out, int64_t size);

/* The number of members of __metadata__ (0 without one), numbered in the header's order. */
PYTFM_API pytfm_status pytfm_safetensors_metadata_count(const pytfm_safetensors *st,
                                                        int64_t *count);

/* Fill *item with member index of __metadata__ (else PYTFM_STATUS_OUT_OF_RANGE). */
PYTFM_API pytfm_status pytfm_safetensors_metadata(const pytfm_safetensors *st, int64_t index,
                                                  pytfm_metadata_item *item);

/* *value = the metadata value of key (NUL-terminated), *length its bytes; *value is NULL and
 * *length 0 when there is none. length may be NULL. */
PYTFM_API pytfm_status pytfm_safetensors_metadata_get(const pytfm_safetensors *st,
                                                      const char *key, const char **value,
                                                      int64_t *length);

/* PYTFM_STATUS_OK when text[0..size) is one strict JSON value (RFC 8259), whitespace around it
 * allowed: strict UTF-8; no duplicate keys (compared unescaped); no key holding a lone
 * surrogate (\ud800 unpaired: not valid Unicode); no NaN or Infinity; no integer of more than
 * 4300 digits (Python's limit); no more than PYTFM_JSON_MAX_DEPTH containers open at once.
 * Else PYTFM_STATUS_INVALID_ARGUMENT, "not valid JSON (<what>: byte <offset>)" or "not UTF-8
 * (byte <offset>: <why>)" in pytfm_last_error(). The checkpoint reader holds the header and
 * the JSON texts of its metadata to this; pytfm.checkpoint.save holds extra to it. */
PYTFM_API pytfm_status pytfm_json_check(const char *text, int64_t size);

/* ---- Model: a GPT from a pytfm checkpoint or a GPT-2 folder, in C ----------------------- */

typedef struct pytfm_model pytfm_model;
typedef struct pytfm_session pytfm_session;

/* Where a model runs: the CPU, or the GPU (a CUDA build with a device: the parameters copied to
 * the GPU once, the forward and the sessions on the CUDA twins of pytfm_cuda.h, the logits
 * copied back to host memory; PYTFM_STATUS_NOT_SUPPORTED in a CPU-only build or without a
 * device). The model API is the same on both: host pointers in and out. */
typedef enum pytfm_device {
    PYTFM_DEVICE_CPU = 0,
    PYTFM_DEVICE_CUDA = 1
} pytfm_device;

/* pytfm.nn.GPTConfig.pos */
typedef enum pytfm_pos {
    PYTFM_POS_ROPE = 0,       /* rotary embeddings on q and k */
    PYTFM_POS_SINUSOIDAL = 1, /* a fixed sin/cos table added to the token embeddings */
    PYTFM_POS_NONE = 2,       /* no positions */
    PYTFM_POS_LEARNED = 3     /* GPT-2's: a table transformer.wpe.weight [max_seq, d_model], a
                                 parameter, added to the token embeddings */
} pytfm_pos;

/* pytfm.nn.GPTConfig.arch: the family a model's block belongs to */
typedef enum pytfm_arch {
    PYTFM_ARCH_GPT = 0,  /* GPT-2's block: LayerNorm with biases, one fused QKV projection,
                            a GELU MLP of 4·d_model, biases on every Linear */
    PYTFM_ARCH_LLAMA = 1 /* the Llama family's (Llama, Qwen 2 and 3, Mistral): RMSNorm without
                            bias, q/k/v projections of n_head and n_kv_head heads of head_dim,
                            no biases (but qkv_bias), a SwiGLU MLP of d_ff, RoPE rotate-half
                            with rope_theta (pytfm_rope_freq_forward), the q/k norm of qk_norm */
} pytfm_arch;

/* A model's shape, from the checkpoint's __metadata__ (GPTConfig and the training step). The
 * fields from arch on are the Llama family's: all 0 for PYTFM_ARCH_GPT, so that a config
 * zeroed and filled with GPT's fields is a GPT's. */
typedef struct pytfm_model_config {
    int64_t vocab;
    int64_t d_model;
    int64_t n_layer;
    int64_t n_head;
    int64_t max_seq;        /* the longest sequence: forward's T and a session's length */
    int32_t pos;            /* a pytfm_pos */
    int32_t tie_embeddings; /* 1: the LM head is the token embedding table */
    int64_t n_params;       /* floats of parameters (a tied table counted once) */
    int64_t step;           /* the training step the checkpoint was saved at */
    int32_t arch;           /* a pytfm_arch */
    int32_t qkv_bias;       /* 1: q_proj, k_proj and v_proj have biases (Qwen 2) */
    int32_t qk_norm;        /* 1: RMSNorm of each head of q and of k, weights [head_dim], before
                               RoPE (Qwen 3) */
    int32_t rope_scaling;   /* a pytfm_rope_scaling (pytfm_kernels.h) */
    int64_t n_kv_head;      /* key/value heads (grouped-query attention); divides n_head */
    int64_t head_dim;       /* each head's width, even; need not be d_model / n_head */
    int64_t d_ff;           /* SwiGLU's hidden width (intermediate_size) */
    int64_t sliding_window; /* 0: none; w: position t attends to keys t − w < s <= t */
    double norm_eps;        /* RMSNorm's eps (rms_norm_eps) */
    double rope_theta;      /* RoPE's base */
    double rope_factor;     /* PYTFM_ROPE_SCALING_LLAMA3's four numbers (pytfm_rope_inv_freq) */
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    double rope_original_max_pos;
} pytfm_model_config;

/* Check a model's shape: the rules pytfm.nn.GPTConfig, the checkpoint reader and the folder
 * readers hold a config to (its one home). vocab, d_model, n_layer, n_head and max_seq >= 1;
 * pos a pytfm_pos; tie_embeddings 0 or 1; arch a pytfm_arch.
 * PYTFM_ARCH_GPT: d_model a multiple of n_head; PYTFM_POS_ROPE: an even head dim (d_model /
 * n_head); PYTFM_POS_SINUSOIDAL: an even d_model; every Llama field 0.
 * PYTFM_ARCH_LLAMA: pos PYTFM_POS_ROPE; n_kv_head >= 1 dividing n_head; head_dim >= 2 and even;
 * d_ff >= 1; n_head·head_dim, (n_head + 2·n_kv_head)·head_dim and 2·d_ff below 2^63;
 * sliding_window >= 0; qkv_bias, qk_norm 0 or 1; norm_eps finite and > 0; rope_theta finite
 * and > 0; rope_scaling a pytfm_rope_scaling, its four numbers as pytfm_rope_inv_freq takes
 * them with LLAMA3 and 0 without.
 * n_params and step are not looked at. Else PYTFM_STATUS_INVALID_ARGUMENT, the message naming
 * the field as GPTConfig does ("GPTConfig.n_head must be a positive int (below 2**63), got 0")
 * or the rule ("d_model (24) must be a multiple of n_head (5)"). */
PYTFM_API pytfm_status pytfm_model_config_check(const pytfm_model_config *config);

/* One parameter of a model's layout: see pytfm_model_param. */
typedef struct pytfm_param_info {
    char name[64];     /* pytfm's name: "transformer.h.3.attn.c_attn.weight" */
    int32_t ndim;      /* 1 or 2 */
    int32_t factor[2]; /* shape[d] = factor[d] · base[d] (the product may pass int64: a config */
    int64_t base[2];   /*   is checked before its sizes are multiplied out) */
    int64_t layer;     /* where it is: −1 the embeddings, 0 .. n_layer − 1 a block, n_layer the */
    int32_t part;      /*   final norm and the untied head; part, its place in that group */
} pytfm_param_info;

/* The layout of a model's parameters, its one home: the order pytfm checkpoints store them in,
 * pytfm.nn.param_shapes yields them and the model (CPU and GPU) lays them out in one buffer;
 * the folder readers map each to Hugging Face's name. The part-th parameter of group layer of
 * config (which pytfm_model_config_check accepts). PYTFM_ARCH_GPT: group −1 holds
 * transformer.wte.weight [vocab, d_model] and, for learned positions, transformer.wpe.weight
 * [max_seq, d_model]; each block i (0 .. n_layer − 1) transformer.h.i.ln_1.weight, .bias [C],
 * attn.c_attn.weight [3C, C], .bias [3C], attn.c_proj.weight [C, C], .bias [C], ln_2.weight,
 * .bias [C], mlp.c_fc.weight [4C, C], .bias [4C], mlp.c_proj.weight [C, 4C], .bias [C] (C =
 * d_model; a Linear's weight is [out, in]); group n_layer transformer.ln_f.weight, .bias [C]
 * and, untied, lm_head.weight [vocab, C].
 * PYTFM_ARCH_LLAMA, under transformers' LlamaForCausalLM names (so a folder's names are the
 * layout's): group −1 model.embed_tokens.weight [vocab, C]; each block i
 * model.layers.i.input_layernorm.weight [C], self_attn.q_proj.weight [H·hd, C],
 * k_proj.weight [Hkv·hd, C], v_proj.weight [Hkv·hd, C], with qkv_bias q_proj.bias [H·hd],
 * k_proj.bias, v_proj.bias [Hkv·hd], then o_proj.weight [C, H·hd], with qk_norm
 * self_attn.q_norm.weight, k_norm.weight [hd], post_attention_layernorm.weight [C],
 * mlp.gate_proj.weight [F, C], up_proj.weight [F, C], down_proj.weight [C, F] (hd head_dim,
 * H n_head, Hkv n_kv_head, F d_ff); group n_layer model.norm.weight [C] and, untied,
 * lm_head.weight [vocab, C]. q, k and v's weights (and biases) are adjacent, one
 * [(H + 2·Hkv)·hd, C] matrix; gate's and up's too, one [2F, C]: the model may multiply by each
 * pair in one product.
 * Fills *param and returns 1, or returns 0 where (layer, part) names no parameter (or an
 * argument is NULL). */
PYTFM_API int32_t pytfm_model_param(const pytfm_model_config *config, int64_t layer,
                                    int32_t part, pytfm_param_info *param);

/* Swap the entries at paths a and b (both must exist; folders or files) in one step, as
 * renameat2(RENAME_EXCHANGE) does: the step by which pytfm saves a folder as a whole
 * (pytfm._atomic.Folder). Where the system or the file system cannot (not Linux, NFS),
 * PYTFM_STATUS_NOT_SUPPORTED; any other failure PYTFM_STATUS_INVALID_ARGUMENT; errno is left
 * at the call's error number (0 on success). */
PYTFM_API pytfm_status pytfm_rename_exchange(const char *a, const char *b);

/* ---- pytfm checkpoints: layer 2 of the reader -------------------------------------------- */

/* What a pytfm checkpoint holds besides its tensors. */
typedef struct pytfm_checkpoint_info {
    pytfm_model_config config; /* every field, n_params and step included */
    int32_t has_optimizer;     /* 1: optim.t is there, and AdamW's moments of every parameter,
                                  optim.m.<name> and optim.v.<name>, float32 of its shape */
    int64_t optim_t;           /* AdamW's step count (0 without optimizer state) */
} pytfm_checkpoint_info;

/* Check that the open file st is a pytfm checkpoint (layer 2), and fill *info: __metadata__
 * "format" is "pytfm"; "config" is a JSON object (pytfm_json_check) with exactly the fields
 * of pytfm.nn.GPTConfig, each of GPTConfig's type (vocab, d_model, n_layer, n_head, max_seq
 * ints below 2^63; seed an int >= 0, of any size; pos "rope", "sinusoidal", "none" or
 * "learned"; tie_embeddings a bool), the values by pytfm_model_config_check; "step" and "optim.t" (optional) non-negative int64s in ASCII
 * decimal, at most 19 digits; "extra" (optional) JSON. The tensors are exactly the parameters
 * the config implies (the order of pytfm.nn.param_shapes, the learned positions' table
 * transformer.wpe.weight [max_seq, d_model] included; a Linear's weight is [out, in]), float32
 * of their shapes, with both AdamW moments of each when optim.t is there, and nothing else; a
 * sinusoidal table (max_seq·d_model floats, made at load, not stored) is at most
 * max(the stored parameters, 2^24) floats. The expected names are made one at a time, so a
 * config of 2^60 layers fails at once. Once this passes, "config" and "extra"
 * (pytfm_safetensors_metadata_get) are valid JSON texts. */
PYTFM_API pytfm_status pytfm_checkpoint_check(const pytfm_safetensors *st,
                                              pytfm_checkpoint_info *info);

/* ---- Hugging Face GPT-2 folders: the other layer on the reader --------------------------- */
/*
 * A folder as transformers' save_pretrained writes a GPT2LMHeadModel or GPT2Model (safetensors
 * weights): config.json, and model.safetensors or model.safetensors.index.json with the shards
 * its weight_map names. The rules (pytfm.gpt2 maps this reader and documents them for Python):
 *   config.json: at most 16 MiB of strict JSON (pytfm_json_check), an object. vocab_size,
 *     n_positions, n_embd, n_layer, n_head must be there, ints in [1, 2^63); n_ctx, if there,
 *     equal to n_positions. The fields that change the maths must have GPT-2's value:
 *     activation_function "gelu_new" (or "gelu_pytorch_tanh", the same function), n_inner null
 *     or 4·n_embd, layer_norm_epsilon 1e-5, scale_attn_weights true,
 *     scale_attn_by_inverse_layer_idx false, add_cross_attention false, pruned_heads {} or
 *     null, model_type "gpt2", tie_word_embeddings a bool (false: lm_head.weight stored). The
 *     fields pytfm_gpt2_ignored_field lists and any whose name starts with "_" are ignored
 *     (none changes the forward pass); any other field is refused. The shape then passes
 *     pytfm_model_config_check (n_embd a multiple of n_head).
 *   weights: the index's weight_map maps names to file names of the folder (no "/", ending in
 *     .safetensors); each file holds exactly the tensors the index puts there, a tensor in one
 *     file only. Every parameter is stored under GPT2LMHeadModel's names
 *     (transformer.h.0.attn.c_attn.weight, ...) or GPT2Model's (h.0.attn.c_attn.weight, ...;
 *     "transformer." on any name makes the folder the first), float32 of the shape the config
 *     implies, the four Conv1D weights of each block [in, out]. By rule h.N.attn.bias
 *     (float32 [1, 1, n_positions, n_positions]), h.N.attn.masked_bias (float32 []) and, in a
 *     tied model, lm_head.weight ([vocab, n_embd], equal to the embedding: checked by
 *     pytfm_gpt2_read) may be there and are not parameters; any other tensor is refused.
 * Everything but the tied head's values is checked by pytfm_gpt2_open from the headers alone,
 * before anything proportional to the parameters is allocated. Messages: "<file>: <what>",
 * naming config.json, the index, a shard, or (for the tensors' rules) the one weights file or
 * the index, and the field or the tensor. Failures as the safetensors reader's (errno set only
 * where a system call failed). */

typedef struct pytfm_gpt2 pytfm_gpt2;

/* The name of ignored config.json field index (0, 1, ...), or NULL past the last. */
PYTFM_API const char *pytfm_gpt2_ignored_field(int64_t index);

/* Check text[0..size) as a config.json (the rules above) and fill *config: vocab, d_model,
 * n_layer, n_head, max_seq from it, pos PYTFM_POS_LEARNED, tie_embeddings; n_params and step 0.
 * source names the text in messages (NULL: nothing). */
PYTFM_API pytfm_status pytfm_gpt2_config_parse(pytfm_model_config *config, const char *text,
                                               int64_t size, const char *source);

/* The same on folder/config.json (the folder must be one; a config.json that is missing or not
 * a regular file is "missing"). */
PYTFM_API pytfm_status pytfm_gpt2_read_config(pytfm_model_config *config, const char *folder);

/* Open the GPT-2 folder at folder: its config and every weight file checked (the rules above);
 * the files stay open until pytfm_gpt2_close. Each is opened relative to the folder, opened
 * once: a save that replaces the folder as a whole meanwhile (pytfm.gpt2.save) never mixes
 * its files with the old ones' (a read that failed because the folder was replaced is tried
 * again). On failure *gpt2 is NULL. */
PYTFM_API pytfm_status pytfm_gpt2_open(pytfm_gpt2 **gpt2, const char *folder);

/* Free gpt2 (NULL: nothing to do), closing its files. */
PYTFM_API pytfm_status pytfm_gpt2_close(pytfm_gpt2 *gpt2);

/* Fill *config with the folder's shape; n_params the floats of the parameters. */
PYTFM_API pytfm_status pytfm_gpt2_get_config(const pytfm_gpt2 *gpt2, pytfm_model_config *config);

/* Copy the parameters into params [count], count = n_params, in the order of
 * pytfm.nn.param_shapes (the layout pytfm_model_open's checkpoints have), host byte order,
 * each Conv1D weight transposed to [out, in]; then a stored tied lm_head.weight is compared
 * with the embedding (an error naming its file when they differ, as NumPy's array_equal
 * compares). With pread: a file that has shrunk since the open is an error naming the tensor.
 * Scratch: 128·n_embd floats (a band of 32 rows of a Conv1D weight). params written
 * (partly, on failure). Any number of threads may read one handle at once. */
PYTFM_API pytfm_status pytfm_gpt2_read(const pytfm_gpt2 *gpt2, float *params, int64_t count);

/* ---- Hugging Face Llama-family folders: Llama, Qwen 2 and 3, Mistral --------------------- */
/*
 * A folder as transformers' save_pretrained writes a LlamaForCausalLM, Qwen2ForCausalLM,
 * Qwen3ForCausalLM or MistralForCausalLM (safetensors weights): config.json, and
 * model.safetensors or model.safetensors.index.json with the shards its weight_map names (the
 * same file rules as GPT-2 folders'). The rules (pytfm.llama maps this reader):
 *   config.json: at most 16 MiB of strict JSON, an object. model_type "llama", "qwen2", "qwen3"
 *     or "mistral"; architectures, if there, [its XForCausalLM]. vocab_size, hidden_size,
 *     intermediate_size, num_hidden_layers, num_attention_heads must be there, ints in
 *     [1, 2^63). Absent, these take transformers' default for the family:
 *     num_key_value_heads (Llama: num_attention_heads; Qwen: 32; Mistral: 8; null:
 *     num_attention_heads), head_dim (Qwen 3: 128; the others, and null for Llama and Mistral:
 *     hidden_size / num_attention_heads, which must then divide), max_position_embeddings
 *     (Llama 2048, Qwen 32768, Mistral 131072), rms_norm_eps (1e-6), tie_word_embeddings
 *     (false), rope_theta (10000). RoPE: rope_parameters (transformers 5), or rope_theta and
 *     rope_scaling (before it; not both dicts), each null or {rope_type (or type): "default"
 *     | "llama3", rope_theta, and for llama3 factor, low_freq_factor, high_freq_factor and
 *     original_max_position_embeddings (absent: max_position_embeddings)}; another rope_type
 *     is refused by name, as is any other key. Fields at the one value pytfm runs:
 *     hidden_act "silu", attention_bias false (Llama, Qwen 3: true adds an o_proj bias),
 *     mlp_bias false, pretraining_tp 1 (Llama). The sliding window: Mistral's sliding_window
 *     (absent 4096, null none) on every layer; Qwen's sliding_window (absent 4096) only with
 *     use_sliding_window true, on the layers layer_types marks "sliding_attention" (absent:
 *     those from max_window_layers, default 28, on): pytfm runs one kind of attention in every
 *     layer, so a mix is refused; layer_types, if there, is num_hidden_layers strings, all
 *     "full_attention", or all "sliding_attention" with a window. Qwen 2 has q, k, v biases
 *     (qkv_bias), Qwen 3 the q/k norm (qk_norm). The fields pytfm_llama_ignored_field lists and
 *     any whose name starts with "_" are ignored; any other field (of that family) is refused.
 *     The result is a PYTFM_ARCH_LLAMA config that pytfm_model_config_check accepts.
 *   weights: every parameter of pytfm_model_param's layout, under its (transformers') names,
 *     float32, bfloat16 or float16 (each tensor its own) of the shape the config implies. By
 *     rule a tied model's lm_head.weight ([vocab, hidden_size], equal to the embedding once
 *     converted: checked by pytfm_llama_read) and model.layers.N.self_attn.rotary_emb.inv_freq
 *     ([head_dim / 2], transformers recomputes it) may be there and are not parameters; any
 *     other tensor, and any other dtype (int8, float64: refused by the safetensors layer), is
 *     refused.
 * Everything but the tied head's values is checked by pytfm_llama_open from the headers alone,
 * before anything proportional to the parameters is allocated. Messages: "<file>: <what>", as
 * the GPT-2 reader's. Failures as the safetensors reader's (errno set only where a system call
 * failed). */

typedef struct pytfm_llama pytfm_llama;

/* The name of ignored config.json field index (0, 1, ...), or NULL past the last. */
PYTFM_API const char *pytfm_llama_ignored_field(int64_t index);

/* Check text[0..size) as a config.json (the rules above) and fill *config: arch
 * PYTFM_ARCH_LLAMA, pos PYTFM_POS_ROPE, vocab, d_model, n_layer, n_head, max_seq, n_kv_head,
 * head_dim, d_ff, norm_eps, rope_theta, rope_scaling and its numbers, qkv_bias, qk_norm,
 * sliding_window, tie_embeddings; n_params and step 0. source names the text in messages
 * (NULL: nothing). */
PYTFM_API pytfm_status pytfm_llama_config_parse(pytfm_model_config *config, const char *text,
                                                int64_t size, const char *source);

/* The same on folder/config.json (the folder must be one; a config.json that is missing or not
 * a regular file is "missing"). */
PYTFM_API pytfm_status pytfm_llama_read_config(pytfm_model_config *config, const char *folder);

/* Open the Llama-family folder at folder: its config and every weight file checked (the rules
 * above); the files stay open until pytfm_llama_close. Each is opened relative to the folder,
 * opened once, as pytfm_gpt2_open does (a read that failed because a save replaced the folder
 * is tried again). On failure *llama is NULL. */
PYTFM_API pytfm_status pytfm_llama_open(pytfm_llama **llama, const char *folder);

/* Free llama (NULL: nothing to do), closing its files. */
PYTFM_API pytfm_status pytfm_llama_close(pytfm_llama *llama);

/* Fill *config with the folder's shape; n_params the floats of the parameters. */
PYTFM_API pytfm_status pytfm_llama_get_config(const pytfm_llama *llama,
                                              pytfm_model_config *config);

/* Copy the parameters into params [count], count = n_params, in pytfm_model_param's order,
 * float32 in host byte order (bfloat16 and float16 converted exactly); then a stored tied
 * lm_head.weight is compared with the embedding (an error naming its file when they differ,
 * as NumPy's array_equal compares). With pread: a file that has shrunk since the open is an
 * error naming the tensor. Scratch: 96 KiB. params written (partly, on failure). Any number
 * of threads may read one handle at once. */
PYTFM_API pytfm_status pytfm_llama_read(const pytfm_llama *llama, float *params, int64_t count);

/* Whether every matrix (2-D parameter) of llama's folder is stored as bfloat16: *all 1 or 0;
 * and the matrices' values, all dtypes together, into *n_matrices. */
PYTFM_API pytfm_status pytfm_llama_bf16_matrices(const pytfm_llama *llama, int32_t *all,
                                                 int64_t *n_matrices);

/* pytfm_llama_read for a folder whose matrices are all bfloat16 (pytfm_llama_bf16_matrices),
 * keeping them so: every matrix's values as the file holds them, BF16 bits in host byte order,
 * into matrices [n_matrices], one after another in pytfm_model_param's order; every other
 * parameter (the vectors) converted to float32 into vectors [n_vectors = n_params -
 * n_matrices], in the same order. No float32 copy of a matrix is made. A stored tied head is
 * compared with the embedding as pytfm_llama_read compares it. A folder with a matrix of
 * another dtype is an error naming it. Scratch: 96 KiB. */
PYTFM_API pytfm_status pytfm_llama_read_bf16(const pytfm_llama *llama, uint16_t *matrices,
                                             int64_t n_matrices, float *vectors,
                                             int64_t n_vectors);

/* The family of the Hugging Face folder at folder, as pytfm_model_open and pytfm.folders tell
 * it: *arch = PYTFM_ARCH_GPT (GPT-2's reader) when config.json's model_type is "gpt2" or
 * absent, or when config.json cannot be read as a JSON object (GPT-2's reader then says what
 * is wrong, in its words); else PYTFM_ARCH_LLAMA (the Llama family's reader, which refuses a
 * model_type it does not know, naming it). Returns PYTFM_STATUS_OK for any folder path. */
PYTFM_API pytfm_status pytfm_folder_arch(const char *folder, int32_t *arch);

/* Open the model at path and read its parameters into memory (its files are closed when this
 * returns). A folder is a Hugging Face folder of the family pytfm_folder_arch says: GPT-2's
 * (pytfm_gpt2_open, then pytfm_gpt2_read into one allocation: a model with learned positions)
 * or the Llama family's (pytfm_llama_open, pytfm_llama_read); anything else a pytfm checkpoint:
 * pytfm_safetensors_open, pytfm_checkpoint_check, then the parameters read into
 * one allocation (AdamW's moments, when there, are left unread). A Llama-family folder whose
 * weight matrices (every 2-D tensor: q/k/v/o, gate/up/down, embed_tokens, an untied lm_head)
 * are all bfloat16 opens in PYTFM_PRECISION_BF16 holding those matrices in BF16 only, read
 * as the file has them (no float32 copy is made: the memory is about the file's size), the
 * vectors (norms, biases) in float32; its logits are those of the float32 widening of the file
 * in BF16 (pytfm.llama.load(folder, precision="bf16")'s bits). Every other model opens in
 * PYTFM_PRECISION_FP32, its parameters in float32 (a float16 or mixed-dtype folder widened).
 * On PYTFM_DEVICE_CUDA the parameters are then copied to the GPU, in float32 (a BF16 folder
 * widened on the way, 16 MiB at a time), in one device allocation (the host copy freed); the
 * model computes in FP32. A file either layer
 * refuses is PYTFM_STATUS_INVALID_ARGUMENT with its message ("<path>: ...");
 * PYTFM_STATUS_NOT_SUPPORTED for PYTFM_DEVICE_CUDA where no GPU can be used (saying why) and
 * for an unknown device; PYTFM_STATUS_OUT_OF_MEMORY. On failure *model is set to NULL.
 *   model   receives the handle (pytfm_model_close frees it)
 *   device  a pytfm_device */
PYTFM_API pytfm_status pytfm_model_open(pytfm_model **model, const char *path, int32_t device);

/* As pytfm_model_open, from size bytes of a checkpoint in memory (messages name "<memory>";
 * the parameters are copied: data may be freed once this returns). */
PYTFM_API pytfm_status pytfm_model_open_memory(pytfm_model **model, const void *data,
                                               size_t size, int32_t device);

/* Free a model (NULL: nothing to do). Its sessions must be closed first. */
PYTFM_API pytfm_status pytfm_model_close(pytfm_model *model);

/* Fill *config with the model's shape. */
PYTFM_API pytfm_status pytfm_model_get_config(const pytfm_model *model,
                                              pytfm_model_config *config);

/* The precision of the model's linear layers from now on (a pytfm_precision; a model opens in
 * PYTFM_PRECISION_FP32, but for a bfloat16 Llama-family folder, see pytfm_model_open): in
 * PYTFM_PRECISION_BF16 every product is the one
 * pytfm_linear_forward_ex computes in BF16, as pytfm.nn.GPT(cfg, precision="bf16") runs it, so
 * the logits are its bits (at the same thread count and instruction-set cap). BF16 converts
 * each weight matrix once, here, into a BF16 copy that decoding a token at a time
 * (pytfm_session_feed of one token) reads instead of the float32 weights: half the bytes per
 * token, the same values. The copy takes 2 bytes per weight (n_layer·12·d_model² + vocab·
 * d_model of them) besides the float32 parameters, which stay (the embedding, LayerNorm and
 * the products of several rows read them); FP32 frees it. A model of a bfloat16 folder has no
 * float32 matrices to copy: its FP32 widens them into a float32 allocation of 4 bytes per
 * weight (then the logits are pytfm.llama.load(folder)'s, FP32's bits), which BF16 frees
 * again.
 * PYTFM_PRECISION_INT8, for inference: every weight matrix (each block's q/k/v or GPT's fused
 * c_attn, the output projection, the MLP's (GPT's c_fc and c_proj, Llama's gate, up and
 * down), the embedding and the LM head, tied or not) is quantised once, here, into blocks of
 * 32 int8 values along its input dimension with an fp16 scale each (pytfm_quantize_q8; from
 * the BF16 matrices of a model that keeps BF16, pytfm_quantize_q8_bf16), and every product is
 * then pytfm_linear_forward_q8w's, the embedding lookup pytfm_embedding_forward_q8w's, as
 * pytfm.nn.GPT.set_precision("int8") runs them, so the logits are its bits (at the same thread
 * count and instruction-set cap). GPT-2's learned positions stay float32: they are added, not
 * multiplied. The float32 (and BF16) matrices are freed, so that the model takes about 1.06
 * bytes per matrix value (a quarter of FP32's, plus 2 bytes of scale per 32 values): INT8 is
 * one way, and set_precision to another precision afterwards is PYTFM_STATUS_INVALID_ARGUMENT
 * (open the model again). A matrix whose input dimension is not a multiple of 32 is refused
 * (PYTFM_STATUS_INVALID_ARGUMENT naming it and its shape; such a model runs in FP32 or BF16),
 * as is a weight that is not finite (pytfm_quantize_q8's error, with the matrix's name); any
 * refusal leaves the model as it was. Memory: the blocks (1 + 1/16 bytes per quantised
 * value) and a float32 allocation of the other parameters are made beside the float32 (or
 * BF16) ones, which are freed once every matrix is quantised: the peak is their sum.
 * Not while another thread uses the model or one of its sessions.
 * PYTFM_STATUS_OUT_OF_MEMORY leaves the model as it was. A model opened on PYTFM_DEVICE_CUDA
 * computes in FP32 only: BF16 and INT8 are PYTFM_STATUS_NOT_SUPPORTED. */
PYTFM_API pytfm_status pytfm_model_set_precision(pytfm_model *model, int32_t precision);

/* *precision = the model's pytfm_precision. */
PYTFM_API pytfm_status pytfm_model_get_precision(const pytfm_model *model, int32_t *precision);

/* The logits of every position of B sequences of T tokens, as pytfm.nn.GPT.forward(tokens).
 *   logits [B, T, vocab] written;  tokens [B, T], each in [0, vocab) (else
 *   PYTFM_STATUS_OUT_OF_RANGE);  1 <= T <= max_seq;  B >= 0 (0: nothing to do)
 * Scratch: the activations of one layer for B·T tokens, B·T·(12·d_model + n_head + 2) + 2·T
 * floats, plus what the kernels take (pytfm_linear_forward's, pytfm_attention_forward's); on
 * the GPU the same on the device, and B·T·vocab more floats for the logits, on a stream made for
 * the call, which returns once they are copied back. */
PYTFM_API pytfm_status pytfm_model_forward(const pytfm_model *model, float *logits,
                                           const int64_t *tokens, int64_t B, int64_t T);

/* A decoding session of one sequence: KV caches for max_len positions (1 <= max_len <=
 * max_seq; 0: max_seq), allocated here, 2·n_layer·max_len·d_model floats (on the GPU for a
 * model there, with a stream of the session's own). On failure *session is set to NULL. */
PYTFM_API pytfm_status pytfm_session_open(pytfm_session **session, const pytfm_model *model,
                                          int64_t max_len);

/* pytfm_session_open with the KV caches in kv_precision: PYTFM_PRECISION_FP32 (what
 * pytfm_session_open does) or PYTFM_PRECISION_BF16, anything else
 * PYTFM_STATUS_INVALID_ARGUMENT. BF16 keeps each key and value as its BF16 bits (rounded to
 * nearest even as it is cached): 2·n_layer·max_len·(n_kv_head·head_dim) uint16_t, half the
 * FP32 caches' bytes, and the logits are exactly those of FP32 caches holding the rounded keys
 * and values (pytfm_attention_gqa_decode_bf16kv), as pytfm.nn.GPT.decode on
 * new_caches(1, precision="bf16"). The CPU only: a model on PYTFM_DEVICE_CUDA is
 * PYTFM_STATUS_NOT_SUPPORTED for BF16. Independent of the model's weight precision. */
PYTFM_API pytfm_status pytfm_session_open_ex(pytfm_session **session, const pytfm_model *model,
                                             int64_t max_len, int32_t kv_precision);

/* Free a session (NULL: nothing to do). */
PYTFM_API pytfm_status pytfm_session_close(pytfm_session *session);

/* Append n >= 1 tokens to the sequence (a prompt at once, or one token at a time) and write
 * the logits [vocab] that follow the last of them, as pytfm.nn.GPT.decode; logits may be NULL
 * to only fill the caches. Each token costs O(length · d_model) beyond its projections: no
 * recomputation of the earlier ones. length + n > max_len is PYTFM_STATUS_INVALID_ARGUMENT and
 * changes nothing (as does any failure: the length stays, and with it what the next feed sees).
 *   logits [vocab] written;  tokens [n], each in [0, vocab) (else PYTFM_STATUS_OUT_OF_RANGE)
 * Scratch: as pytfm_model_forward with B = 1, T = n, plus n·vocab floats when n > 1 and logits
 * is not NULL (the LM head runs on every new token, as in Python, so that the last one's
 * logits are the bits GPT.decode gives). */
PYTFM_API pytfm_status pytfm_session_feed(pytfm_session *session, float *logits,
                                          const int64_t *tokens, int64_t n);

/* The number of tokens fed since the session opened or was last reset. */
PYTFM_API pytfm_status pytfm_session_length(const pytfm_session *session, int64_t *length);

/* Forget every token (the caches are kept for reuse). */
PYTFM_API pytfm_status pytfm_session_reset(pytfm_session *session);

/* The random number generator of sampling: xoshiro256** (Blackman and Vigna, 2018), its
 * state seeded by SplitMix64 from a 64-bit seed: state[i] = the i-th SplitMix64 output,
 * i = 0..3, starting from x = seed (x += 0x9e3779b97f4a7c15; z = x;
 * z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
 * output z ^ (z >> 31)). The stream is part of the API: the same seed gives the same numbers
 * on every machine and in every version with this ABI number. The state may be copied. */
typedef struct pytfm_rng {
    uint64_t state[4];
} pytfm_rng;

/* Seed *rng as above. */
PYTFM_API pytfm_status pytfm_rng_seed(pytfm_rng *rng, uint64_t seed);

/* The next 64-bit number of the stream. */
PYTFM_API pytfm_status pytfm_rng_next(pytfm_rng *rng, uint64_t *value);

/* Draw the next token from logits [vocab], as pytfm.generate.sample_next:
 *   temperature == 0: the index of the largest logit (the first of equals; no random number
 *   is drawn); temperature > 0 (finite; a double, as Python's float, so that 0.8 is Python's
 *   0.8 and not the float nearest it): softmax((logits − max) / temperature) in double,
 *   restricted to the logits >= the top_k-th largest (top_k <= 0 or >= vocab: all), then the
 *   first index whose cumulative probability reaches u = (next >> 11) · 2^-53, one number of
 *   rng's stream per draw (vocab − 1 if rounding leaves u above the total).
 *   logits must be finite (else PYTFM_STATUS_INVALID_ARGUMENT). rng may be NULL when
 *   temperature == 0.
 * The sum of the probabilities is taken in NumPy's pairwise order, so that given the same u the
 * token is Python's (but for a last-bit difference of exp, which moves a token only when u lies
 * within about 1e-16 of a cumulative probability). No scratch. */
PYTFM_API pytfm_status pytfm_sample(int64_t *token, const float *logits, int64_t vocab,
                                    double temperature, int64_t top_k, pytfm_rng *rng);

/* PYTFM_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PYTFM_MODEL_H */
