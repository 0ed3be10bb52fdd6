/*
 * device.cu — CUDA device queries and stream synchronisation, as pytfm statuses.
 */
#include "pytfm_cuda.cuh"

extern "C" pytfm_status pytfm_cuda_device_count(int32_t *count) {
    PYTFM_CHECK_PTR(count, 1);
    int devices = 0;
    const cudaError_t err = cudaGetDeviceCount(&devices);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        cudaGetLastError(); // no device, or no driver to ask: zero devices, not a failure
        devices = 0;
    } else if (err != cudaSuccess) {
        return pytfm__cuda_status(__func__, err);
    }
    *count = devices;
    return PYTFM_STATUS_OK;
}

extern "C" pytfm_status pytfm_cuda_stream_synchronize(void *stream) {
    return pytfm__cuda_status(__func__, cudaStreamSynchronize((cudaStream_t)stream));
}
