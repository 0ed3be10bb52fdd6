/*
 * model_cuda.h — the model of model.c on the GPU (internal, not exported): model.c hands a
 * model opened with PYTFM_DEVICE_CUDA, and its sessions, to these. Defined in model_cuda.c in a
 * CUDA build; in a CPU-only build csrc/core/cuda_stub.c defines them, each returning
 * PYTFM_STATUS_NOT_SUPPORTED (and pytfm__cuda_model_check says why, so none of the others is
 * reached). Arguments reach them checked by model.c; func names the public function called.
 */
#ifndef PYTFM_MODEL_CUDA_H
#define PYTFM_MODEL_CUDA_H

#include "pytfm.h"

typedef struct pytfm__cuda_model pytfm__cuda_model;
typedef struct pytfm__cuda_session pytfm__cuda_session;

/* PYTFM_STATUS_OK when a model can be opened on the GPU: a CUDA build and a device; else
 * PYTFM_STATUS_NOT_SUPPORTED, "<func>: device PYTFM_DEVICE_CUDA: <why not>" */
pytfm_status pytfm__cuda_model_check(const char *func);

/* The model's parameters, params [config->n_params] in checkpoint.h's order, and its
 * sinusoidal table pe [max_seq, d_model] (NULL for other positions), both in host memory,
 * copied to the GPU once (one allocation). On failure *model is NULL. */
pytfm_status pytfm__cuda_model_open(pytfm__cuda_model **model, const pytfm_model_config *config,
                                    const float *params, const float *pe, const char *func);

/* Free what pytfm__cuda_model_open allocated (NULL: nothing). */
void pytfm__cuda_model_close(pytfm__cuda_model *model);

/* pytfm_model_forward on the GPU: tokens [B, T] (host, checked) to the device, the ops of
 * model.c's forward on their CUDA twins, logits [B, T, vocab] back to host memory; B >= 1. */
pytfm_status pytfm__cuda_model_forward(const pytfm__cuda_model *model, float *logits,
                                       const int64_t *tokens, int64_t B, int64_t T,
                                       const char *func);

/* A session's KV caches on the GPU, for max_len positions. On failure *session is NULL. */
pytfm_status pytfm__cuda_session_open(pytfm__cuda_session **session,
                                      const pytfm__cuda_model *model, int64_t max_len,
                                      const char *func);

/* Free a session's caches (NULL: nothing). */
void pytfm__cuda_session_close(pytfm__cuda_session *session);

/* pytfm_session_feed on the GPU: n tokens (host, checked) at positions [length, length + n)
 * appended to the caches, the logits of the last [vocab] copied to host memory (logits NULL:
 * none). */
pytfm_status pytfm__cuda_session_feed(pytfm__cuda_session *session, float *logits,
                                      const int64_t *tokens, int64_t n, int64_t length,
                                      const char *func);

#endif /* PYTFM_MODEL_CUDA_H */
