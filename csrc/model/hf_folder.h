/*
 * hf_folder.h — a Hugging Face model folder's files, the part the GPT-2 reader (gpt2.c) and the
 * Llama-family reader (llama.c) share (internal, not exported): the folder opened once and
 * every file opened relative to it, config.json and the index read as strict JSON of at most
 * PYTFM__HF_MAX_JSON bytes, the weights (model.safetensors, or the shards the index's
 * weight_map names, each tensor in the file the index puts it in and in no other), and the
 * open retried when a save replaced the folder meanwhile. What the config and the tensors must
 * be is each reader's.
 */
#ifndef PYTFM_HF_FOLDER_H
#define PYTFM_HF_FOLDER_H

#include <stddef.h>

#include "safetensors.h"

enum { PYTFM__HF_MAX_JSON = 1 << 24 }; /* bytes of a config.json or an index, at most */

extern const char PYTFM__HF_CONFIG[], PYTFM__HF_WEIGHTS[], PYTFM__HF_INDEX[];

typedef struct pytfm__hf_shard {
    char *path; /* folder/file, for messages */
    pytfm_safetensors *st;
} pytfm__hf_shard;

/* A folder's weight files, open. */
typedef struct pytfm__hf_files {
    char *source;   /* messages about the tensors: the one file, or the index */
    int own_source; /* source is the index's path, freed with the files */
    pytfm__hf_shard *files;
    size_t n_files;
} pytfm__hf_files;

/* "<source>: ..." as this thread's last error; PYTFM_STATUS_INVALID_ARGUMENT, OUT_OF_MEMORY */
#define PYTFM__HF_BAD(source, ...) \
    pytfm__fail_at(source, PYTFM_STATUS_INVALID_ARGUMENT, __VA_ARGS__)
#define PYTFM__HF_NO_MEMORY(source, ...) \
    pytfm__fail_at(source, PYTFM_STATUS_OUT_OF_MEMORY, __VA_ARGS__)

/* folder/name (one '/' between them, as os.path.join writes it), malloc'd; NULL: no memory */
char *pytfm__hf_join(const char *folder, const char *name);

/* Open folder as *dir (O_DIRECTORY); a path that is no folder is refused naming what a folder
 * of kind ("GPT-2", "Llama-family") holds. */
pytfm_status pytfm__hf_open_folder(const char *folder, const char *kind, int *dir);

/* folder/config.json (in the folder open as dir), at most PYTFM__HF_MAX_JSON bytes of strict
 * JSON: -> *text (malloc'd, NUL-terminated; NULL on failure), *size, *path (malloc'd, its path
 * for messages; the caller frees both, also on failure). Missing: refused naming what a folder
 * of kind holds. */
pytfm_status pytfm__hf_read_config(int dir, const char *folder, const char *kind, char **text,
                                   size_t *size, char **path);

/* The weight files of the folder open as dir, opened and checked against the index (each
 * safetensors header by safetensors.c; half: BF16 and F16 tensors taken too). On failure the
 * files opened so far stay in *h (zeroed before) for pytfm__hf_close_files. */
pytfm_status pytfm__hf_open_files(pytfm__hf_files *h, int dir, const char *folder, int half);

/* Close and free what *h holds (it may be partly filled; zeroed: nothing to do). */
void pytfm__hf_close_files(pytfm__hf_files *h);

/* The entry named name[0..len) in any of h's files (*file its index; file may be NULL), or
 * NULL. */
const pytfm__st_entry *pytfm__hf_find(const pytfm__hf_files *h, const char *name, size_t len,
                                      size_t *file);

/* used[f][i] (calloc'd, one byte per tensor of each file): which tensors a reader has matched
 * to a parameter; pytfm__hf_free_used frees it. NULL, with the error set: no memory. */
unsigned char **pytfm__hf_new_used(const pytfm__hf_files *h);
void pytfm__hf_free_used(const pytfm__hf_files *h, unsigned char **used);

/* The open of a folder, tried again (up to 4 times) when it failed on a folder that a save
 * replaced meanwhile (pytfm._atomic.Folder swaps a new one in and removes the old one's
 * files): open_in(out, dir, folder) does one try on the folder open as dir. */
pytfm_status pytfm__hf_open_retry(const char *folder, const char *kind,
                                  pytfm_status (*open_in)(void *out, int dir,
                                                          const char *folder),
                                  void *out);

/* count float32 parameters could not be allocated: PYTFM_STATUS_OUT_OF_MEMORY, the message
 * naming the file of the largest tensor and that tensor (the one a hostile config made huge) */
pytfm_status pytfm__hf_no_memory(const pytfm__hf_files *h, int64_t count);

/* ---- config.json's values ------------------------------------------------------------------ */

/* The index-th of PretrainedConfig's fields that no model's forward pass reads (token ids,
 * generation defaults, bookkeeping), which both readers ignore; NULL past the last. */
const char *pytfm__hf_common_ignored(int64_t index);

/* the member of object named key, or {NULL, 0} */
pytfm__json pytfm__hf_member(pytfm__json object, const char *key);

/* whether v is a JSON integer */
int pytfm__hf_is_int(pytfm__json v);

/* v as Python's repr of json.loads(v) shows it, near enough for a message: strings quoted
 * '...', true/false/null as True/False/None, the rest as written; buf holds PYTFM__SHOW */
const char *pytfm__hf_py_repr(pytfm__json v, char *buf);

/* the smallest key (Python's str order) of object that known(key) does not know and that does
 * not start with "_" -> *first, or {NULL, 0} */
pytfm_status pytfm__hf_unknown_key(pytfm__json object, const char *source,
                                   int (*known)(pytfm__json key), pytfm__json *first);

/* a tensor's name for a message, as Python's messages write it (unquoted): at most
 * PYTFM__SHOW − 2 bytes of it; buf holds PYTFM__SHOW */
const char *pytfm__hf_show_name(const char *name, size_t len, char *buf);

/* a stored shape as "[2, 3]" */
const char *pytfm__hf_show_shape(const pytfm_tensor_info *t, char *buf, size_t cap);

#endif /* PYTFM_HF_FOLDER_H */
