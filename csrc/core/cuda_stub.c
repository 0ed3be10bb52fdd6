/*
 * cuda_stub.c — the CUDA entry points of a build without CUDA (nvcc was not found, or
 * PYTFM_CUDA=0) that are not plain stubs. The build generates the plain ones, in the build
 * folder, from the declarations in the public headers: every pytfm_*_cuda and pytfm_cuda_*
 * function this file does not define returns PYTFM_STATUS_NOT_SUPPORTED with a message that
 * says why, so a program linked against either build sees the same symbols. The build leaves
 * this file out when it compiles the kernels in cuda/ (and csrc/model/model_cuda.c, whose
 * internal hooks of the model on the GPU are answered here otherwise).
 */
#include "internal.h"
#include "model/model_cuda.h"

/* No CUDA, so no device: a count, not an error, as in a CUDA build on a machine without one. */
pytfm_status pytfm_cuda_device_count(int32_t *count) {
    PYTFM_CHECK_PTR(count, 1);
    *count = 0;
    return PYTFM_STATUS_OK;
}

/* ---- the model on the GPU (model/model_cuda.h): never opened in this build ------------------ */

static pytfm_status no_cuda_model(const char *func) {
    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                       "%s: device PYTFM_DEVICE_CUDA: pytfm was built without CUDA (nvcc not "
                       "found, or PYTFM_CUDA=0)",
                       func);
}

pytfm_status pytfm__cuda_model_check(const char *func) { return no_cuda_model(func); }

pytfm_status pytfm__cuda_model_open(pytfm__cuda_model **model, const pytfm_model_config *config,
                                    const float *params, const float *pe, const char *func) {
    (void)config, (void)params, (void)pe;
    *model = NULL;
    return no_cuda_model(func);
}

void pytfm__cuda_model_close(pytfm__cuda_model *model) { (void)model; }

pytfm_status pytfm__cuda_model_forward(const pytfm__cuda_model *model, float *logits,
                                       const int64_t *tokens, int64_t B, int64_t T,
                                       const char *func) {
    (void)model, (void)logits, (void)tokens, (void)B, (void)T;
    return no_cuda_model(func);
}

pytfm_status pytfm__cuda_session_open(pytfm__cuda_session **session,
                                      const pytfm__cuda_model *model, int64_t max_len,
                                      const char *func) {
    (void)model, (void)max_len;
    *session = NULL;
    return no_cuda_model(func);
}

void pytfm__cuda_session_close(pytfm__cuda_session *session) { (void)session; }

pytfm_status pytfm__cuda_session_feed(pytfm__cuda_session *session, float *logits,
                                      const int64_t *tokens, int64_t n, int64_t length,
                                      const char *func) {
    (void)session, (void)logits, (void)tokens, (void)n, (void)length;
    return no_cuda_model(func);
}
