/*
 * cuda_stub.c — the CUDA entry points of a build without CUDA (nvcc was not found, or
 * PYTFM_CUDA=0) that are not plain stubs. The build generates the plain ones, in the build
 * folder, from the declarations in the public headers: every pytfm_*_cuda and pytfm_cuda_*
 * function this file does not define returns PYTFM_STATUS_NOT_SUPPORTED with a message that
 * says why, so a program linked against either build sees the same symbols. The build leaves
 * this file out when it compiles the kernels in cuda/.
 */
#include "internal.h"

/* No CUDA, so no device: a count, not an error, as in a CUDA build on a machine without one. */
pytfm_status pytfm_cuda_device_count(int32_t *count) {
    PYTFM_CHECK_PTR(count, 1);
    *count = 0;
    return PYTFM_STATUS_OK;
}
