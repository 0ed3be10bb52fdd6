/*
 * device.cu — CUDA device queries and stream synchronisation, as pytfm statuses; the
 * workspaces the kernels take their scratch from; device memory, copies and a row add for the
 * C model on the GPU (csrc/model/model_cuda.c, through cuda/device.h).
 *
 * A workspace is a device buffer bound to a stream (pytfm_cuda_workspace_set): every twin
 * called on that stream takes its scratch (RoPE's angles, attention's row sums, partial column
 * sums, sort keys, ...) from the start of it instead of cudaMallocAsync and cudaFreeAsync. One
 * call holds one scratch region, released before it returns, and the calls on one stream run
 * in its order, so every call may use the workspace from its first byte: as a cuBLAS handle's
 * workspace, it serves the calls of one host thread at a time. The table of bindings is small,
 * process-wide and locked: streams without a binding are not slowed down by it.
 */
#include <mutex>

#include "device.h"
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

/* ---- workspaces -------------------------------------------------------------------------- */

enum { WORKSPACE_STREAMS = 64, WORKSPACE_ALIGN = 256 };

struct workspace {
    bool bound;
    void *stream;
    char *base;      // NULL with bytes 0: a binding that only measures
    int64_t bytes;   // what it holds
    int64_t need;    // the most scratch one call asked for since the binding
    int64_t misses;  // calls whose scratch did not fit, allocated on the stream instead
};

static std::mutex workspaces_lock;
static workspace workspaces[WORKSPACE_STREAMS];

static workspace *binding_of(void *stream) { // under the lock
    for (workspace &w : workspaces)
        if (w.bound && w.stream == stream) return &w;
    return nullptr;
}

extern "C" pytfm_status pytfm_cuda_workspace_set(void *stream, void *buffer, int64_t bytes) {
    PYTFM_CHECK_MIN(bytes, 0);
    PYTFM_CHECK(buffer != NULL || bytes == 0,
                "%s: buffer must not be NULL when bytes > 0 (bytes = 0 with NULL: a binding "
                "that only measures)",
                __func__);
    PYTFM_CHECK((uintptr_t)buffer % WORKSPACE_ALIGN == 0,
                "%s: buffer must be %d-byte aligned (cudaMalloc's and CuPy's are), got %p",
                __func__, (int)WORKSPACE_ALIGN, buffer);
    std::lock_guard<std::mutex> lock(workspaces_lock);
    workspace *w = binding_of(stream);
    for (int i = 0; !w && i < WORKSPACE_STREAMS; i++)
        if (!workspaces[i].bound) w = &workspaces[i];
    if (!w)
        return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                           "%s: %d streams have a workspace already, the most there may be: "
                           "clear one first (pytfm_cuda_workspace_clear)",
                           __func__, (int)WORKSPACE_STREAMS);
    *w = workspace{true, stream, (char *)buffer, bytes, 0, 0};
    return PYTFM_STATUS_OK;
}

extern "C" pytfm_status pytfm_cuda_workspace_clear(void *stream) {
    std::lock_guard<std::mutex> lock(workspaces_lock);
    workspace *w = binding_of(stream);
    if (w) *w = workspace{};
    return PYTFM_STATUS_OK;
}

extern "C" pytfm_status pytfm_cuda_workspace_get(void *stream, int64_t *bytes, int64_t *need,
                                                 int64_t *misses) {
    PYTFM_CHECK_PTR(bytes, 1);
    PYTFM_CHECK_PTR(need, 1);
    PYTFM_CHECK_PTR(misses, 1);
    std::lock_guard<std::mutex> lock(workspaces_lock);
    const workspace *w = binding_of(stream);
    *bytes = w ? w->bytes : -1;
    *need = w ? w->need : 0;
    *misses = w ? w->misses : 0;
    return PYTFM_STATUS_OK;
}

extern "C" pytfm_status pytfm__stream_scratch_bytes(const char *func, void **p, int64_t bytes,
                                                    void *stream) {
    *p = nullptr;
    {
        std::lock_guard<std::mutex> lock(workspaces_lock);
        workspace *w = binding_of(stream);
        if (w) {
            if (bytes > w->need) w->need = bytes;
            if (bytes <= w->bytes) {
                *p = w->base;
                return PYTFM_STATUS_OK;
            }
            w->misses++;
        }
    }
    if (bytes == 0) return PYTFM_STATUS_OK;
    const cudaError_t err = cudaMallocAsync(p, (size_t)bytes, (cudaStream_t)stream);
    if (err == cudaSuccess) return PYTFM_STATUS_OK;
    *p = nullptr;
    (void)cudaGetLastError(); // not left behind for the next launch to report
    return pytfm__fail(
        err == cudaErrorMemoryAllocation ? PYTFM_STATUS_OUT_OF_MEMORY : PYTFM_STATUS_CUDA_ERROR,
        "%s: no scratch of %lld bytes on the stream: %s", func, (long long)bytes,
        cudaGetErrorString(err));
}

extern "C" pytfm_status pytfm__stream_scratch_free(const char *func, void *p, pytfm_status st,
                                                   void *stream) {
    if (!p) return st;
    {
        std::lock_guard<std::mutex> lock(workspaces_lock);
        const workspace *w = binding_of(stream);
        if (w && w->base == p) return st; // the workspace's: it stays bound
    }
    const cudaError_t freed = cudaFreeAsync(p, (cudaStream_t)stream);
    if (freed != cudaSuccess) (void)cudaGetLastError();
    return st != PYTFM_STATUS_OK ? st : pytfm__cuda_status(func, freed);
}

/* ---- for C code: device memory, copies, a row add (device.h) ------------------------------ */

extern "C" pytfm_status pytfm__cuda_malloc(const char *func, void **p, int64_t bytes) {
    *p = nullptr;
    const cudaError_t err = cudaMalloc(p, (size_t)(bytes > 0 ? bytes : 1));
    if (err == cudaSuccess) return PYTFM_STATUS_OK;
    *p = nullptr;
    (void)cudaGetLastError();
    return pytfm__fail(
        err == cudaErrorMemoryAllocation ? PYTFM_STATUS_OUT_OF_MEMORY : PYTFM_STATUS_CUDA_ERROR,
        "%s: cannot allocate %lld bytes on the GPU: %s", func, (long long)bytes,
        cudaGetErrorString(err));
}

extern "C" void pytfm__cuda_free(void *p) {
    if (p && cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" pytfm_status pytfm__cuda_copy(const char *func, void *dst, const void *src,
                                         int64_t bytes, int32_t kind, void *stream) {
    if (bytes == 0) return PYTFM_STATUS_OK;
    const cudaMemcpyKind k = kind == PYTFM__TO_DEVICE ? cudaMemcpyHostToDevice
                             : kind == PYTFM__TO_HOST ? cudaMemcpyDeviceToHost
                                                      : cudaMemcpyDeviceToDevice;
    return pytfm__cuda_status(func, cudaMemcpyAsync(dst, src, (size_t)bytes, k,
                                                    (cudaStream_t)stream));
}

extern "C" pytfm_status pytfm__cuda_stream_open(const char *func, void **stream) {
    cudaStream_t s = nullptr;
    const pytfm_status st =
        pytfm__cuda_status(func, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = st == PYTFM_STATUS_OK ? (void *)s : nullptr;
    return st;
}

extern "C" pytfm_status pytfm__cuda_stream_close(const char *func, void *stream) {
    if (!stream) return PYTFM_STATUS_OK;
    const cudaError_t sync = cudaStreamSynchronize((cudaStream_t)stream);
    const cudaError_t destroyed = cudaStreamDestroy((cudaStream_t)stream);
    return pytfm__cuda_status(func, sync != cudaSuccess ? sync : destroyed);
}

extern "C" pytfm_status pytfm__cuda_sync(const char *func, void *stream) {
    return pytfm__cuda_status(func, cudaStreamSynchronize((cudaStream_t)stream));
}

/* x[r, j] += y[(offset + r % period), j] for r < rows, j < cols (a thread per element) */
static __global__ void add_rows_kernel(float *__restrict__ x, const float *__restrict__ y,
                                       int64_t rows, int64_t cols, int64_t period,
                                       int64_t offset) {
    const int64_t count = rows * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, j = i % cols;
        x[i] += y[(offset + r % period) * cols + j];
    }
}

extern "C" pytfm_status pytfm__cuda_add_rows(const char *func, float *x, const float *y,
                                             int64_t rows, int64_t cols, int64_t period,
                                             int64_t offset, void *stream) {
    if (rows * cols == 0) return PYTFM_STATUS_OK;
    return pytfm__launch(func, add_rows_kernel,
                         dim3(pytfm__blocks(rows * cols, PYTFM_ROW_THREADS, PYTFM_MAX_BLOCKS)),
                         dim3(PYTFM_ROW_THREADS), 0, stream, x, y, rows, cols, period, offset);
}

/* dst[r, j] = src[r, offset + j] for r < rows, j < cols (a thread per element) */
static __global__ void copy_cols_kernel(float *__restrict__ dst, const float *__restrict__ src,
                                        int64_t rows, int64_t src_cols, int64_t offset,
                                        int64_t cols) {
    const int64_t count = rows * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, j = i % cols;
        dst[i] = src[r * src_cols + offset + j];
    }
}

extern "C" pytfm_status pytfm__cuda_copy_cols(const char *func, float *dst, const float *src,
                                              int64_t rows, int64_t src_cols, int64_t offset,
                                              int64_t cols, void *stream) {
    if (rows * cols == 0) return PYTFM_STATUS_OK;
    return pytfm__launch(func, copy_cols_kernel,
                         dim3(pytfm__blocks(rows * cols, PYTFM_ROW_THREADS, PYTFM_MAX_BLOCKS)),
                         dim3(PYTFM_ROW_THREADS), 0, stream, dst, src, rows, src_cols, offset,
                         cols);
}
