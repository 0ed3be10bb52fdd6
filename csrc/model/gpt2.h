/*
 * gpt2.h — what the model gets from the Hugging Face folder readers (internal, not exported):
 * csrc/model/gpt2.c checks a GPT-2 folder (pytfm_gpt2_open), csrc/model/llama.c a Llama-family
 * one (pytfm_llama_open), and each reads its parameters in checkpoint.h's order;
 * csrc/model/model.c builds the model on them.
 */
#ifndef PYTFM_GPT2_H
#define PYTFM_GPT2_H

#include "checkpoint.h"

/* pytfm_gpt2_open on folder, then its parameters read into a new 64-byte aligned allocation
 * (free with free()), in checkpoint.h's order, the Conv1D weights transposed to [out, in]; the
 * folder's files are closed when this returns. On failure w->params is NULL, and a status and
 * pytfm_last_error() say why, naming the file. */
pytfm_status pytfm__gpt2_weights(const char *folder, pytfm__weights *w);

/* The same for a Llama-family folder (pytfm_llama_open, pytfm_llama_read: every tensor converted
 * to float32), but for a folder whose matrices are all bfloat16: those are kept in BF16, in
 * w->w16 (checkpoint.h), no float32 copy of them made. */
pytfm_status pytfm__llama_weights(const char *folder, pytfm__weights *w);

#endif /* PYTFM_GPT2_H */
