/*
 * cuda_stub.c — the CUDA entry points of a build without CUDA (nvcc was not found, or
 * PYTFM_CUDA=0) that are not plain stubs. The build generates the plain ones, in the build
 * folder, from the declarations in the public headers: every pytfm_*_cuda and pytfm_cuda_*
 * function this file does not define returns PYTFM_STATUS_NOT_SUPPORTED with a message that
 * says why, so a program linked against either build sees the same symbols. The build leaves
 * this file out when it compiles the kernels in cuda/ (and csrc/model/model_cuda.c, whose
 * table of the GPU for the model is refused here otherwise).
 */
#include "internal.h"
#include "model/model_device.h"

/* No CUDA, so no device: a count, not an error, as in a CUDA build on a machine without one. */
pytfm_status pytfm_cuda_device_count(int32_t *count) {
    PYTFM_CHECK_PTR(count, 1);
    *count = 0;
    return PYTFM_STATUS_OK;
}

/* ---- the model on the GPU (model/model_device.h): never opened in this build ---------------- */

pytfm_status pytfm__cuda_model_device(const pytfm__model_device **device, const char *func) {
    *device = NULL;
    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,
                       "%s: device PYTFM_DEVICE_CUDA: pytfm was built without CUDA (nvcc not "
                       "found, or PYTFM_CUDA=0)",
                       func);
}
