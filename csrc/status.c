/*
 * status.c — status names, the thread-local last error, version and build information.
 *
 * The error message lives in thread-local storage: each thread sees its own last failure. The
 * thread count is the library's only process-wide setting (it changes speed, not results).
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "internal.h"

static _Thread_local char last_error[512];
static atomic_int num_threads; /* 0: OpenMP's default */

pytfm_status pytfm__fail(pytfm_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, args);
    va_end(args);
    return status;
}

pytfm_status pytfm__check_indices(const char *func, const char *name, const int64_t *ids,
                                  int64_t n, int64_t limit, int allow_ignore, int64_t ignore) {
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        if (allow_ignore && id == ignore) continue;
        if (id < 0 || id >= limit) {
            return pytfm__fail(PYTFM_STATUS_OUT_OF_RANGE, "%s: %s[%lld] = %lld is outside [0, %lld)",
                               func, name, (long long)i, (long long)id, (long long)limit);
        }
    }
    return PYTFM_STATUS_OK;
}

const char *pytfm_status_string(pytfm_status status) {
    switch (status) {
    case PYTFM_STATUS_OK: return "ok";
    case PYTFM_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case PYTFM_STATUS_OUT_OF_RANGE: return "index out of range";
    case PYTFM_STATUS_NOT_SUPPORTED: return "not supported in this build";
    case PYTFM_STATUS_CUDA_ERROR: return "CUDA error";
    case PYTFM_STATUS_INTERNAL: return "internal error";
    case PYTFM_STATUS_OUT_OF_MEMORY: return "out of memory";
    }
    return "unknown status";
}

const char *pytfm_last_error(void) { return last_error; }

const char *pytfm_version(void) { return PYTFM_VERSION; }

pytfm_status pytfm_set_num_threads(int32_t n) {
    PYTFM_CHECK(n >= 0, "%s: n must be >= 0 (0: the default), got %d", __func__, (int)n);
    atomic_store(&num_threads, n);
    return PYTFM_STATUS_OK;
}

int32_t pytfm_get_num_threads(void) {
#if defined(_OPENMP)
    const int n = atomic_load(&num_threads);
    return n > 0 ? n : omp_get_max_threads();
#else
    return 1;
#endif
}

/* set by setup.py when it compiles the kernels in cuda/ with nvcc */
#ifndef PYTFM_CUDA
#define PYTFM_CUDA 0
#endif
#ifndef PYTFM_CUDA_VERSION
#define PYTFM_CUDA_VERSION 0
#endif

#ifndef PYTFM_BUILD_FLAGS
#define PYTFM_BUILD_FLAGS "unknown"
#endif

#if defined(__clang__)
#define PYTFM_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define PYTFM_COMPILER "gcc " __VERSION__
#else
#define PYTFM_COMPILER "unknown"
#endif

#if defined(__x86_64__)
#define PYTFM_ARCH "x86_64"
#elif defined(__i386__)
#define PYTFM_ARCH "x86"
#elif defined(__aarch64__)
#define PYTFM_ARCH "aarch64"
#else
#define PYTFM_ARCH "unknown"
#endif

uint64_t pytfm__cpu_features(void) {
    uint64_t f = 0;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse2")) f |= PYTFM_CPU_SSE2;
    if (__builtin_cpu_supports("avx")) f |= PYTFM_CPU_AVX;
    if (__builtin_cpu_supports("avx2")) f |= PYTFM_CPU_AVX2;
    if (__builtin_cpu_supports("fma")) f |= PYTFM_CPU_FMA;
    if (__builtin_cpu_supports("avx512f")) f |= PYTFM_CPU_AVX512F;
#elif defined(__aarch64__)
    f |= PYTFM_CPU_NEON; /* Advanced SIMD is mandatory on AArch64 */
#endif
    return f;
}

pytfm_status pytfm_get_build_info(pytfm_build_info *info) {
    PYTFM_CHECK_PTR(info, 1);
    info->version = PYTFM_VERSION;
    info->compiler = PYTFM_COMPILER;
    info->flags = PYTFM_BUILD_FLAGS;
    info->arch = PYTFM_ARCH;
    info->cpu_features = pytfm__cpu_features();
    info->cuda = PYTFM_CUDA;
    info->cuda_version = PYTFM_CUDA_VERSION;
    return PYTFM_STATUS_OK;
}
