/*
 * status.c — status names, the thread-local last error, scratch allocation, the thread count,
 * version and build information.
 *
 * The error message lives in thread-local storage: each thread sees its own last failure. The
 * thread count is one of the library's two process-wide settings (it changes speed, not
 * results); the other, the instruction-set cap, lives in isa.c. Whatever sets the thread count
 * (pytfm_set_num_threads, PYTFM_NUM_THREADS: environment.c, or OMP_NUM_THREADS through
 * OpenMP's default), the kernels use at most PYTFM_THREADS_PER_CORE threads per core: 100000
 * threads would each get a workspace, and 2^31 − 1 make libgomp end the process when it cannot
 * create them.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(_OPENMP)
#include <omp.h>
#include <pthread.h>
#endif

#include "internal.h"

/* room for the longest message a reader writes: a Llama-family config shown whole (checkpoint.c
 * CONFIG_SHOWN), a tensor's name and shape, and a path */
static _Thread_local char last_error[2048];
static atomic_int num_threads; /* as set: 0 for OpenMP's default; clamped when read */

pytfm_status pytfm__fail(pytfm_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, args);
    va_end(args);
    return status;
}

pytfm_status pytfm__check_indices(const char *func, const char *name, const int64_t *ids,
                                  int64_t count, int64_t limit, int allow_ignore, int64_t ignore) {
    for (int64_t i = 0; i < count; i++) {
        int64_t id = ids[i];
        if (allow_ignore && id == ignore) continue;
        if (id < 0 || id >= limit) {
            return pytfm__fail(PYTFM_STATUS_OUT_OF_RANGE,
                               "%s: %s[%lld] = %lld is outside [0, %lld)", func, name,
                               (long long)i, (long long)id, (long long)limit);
        }
    }
    return PYTFM_STATUS_OK;
}

void *pytfm__scratch(const char *func, int64_t count, size_t size) {
    enum { ALIGN = 64 }; // a cache line; aligned_alloc wants a whole number of them
    if (count < 0 || (size > 0 && (uint64_t)count > (SIZE_MAX - ALIGN) / size)) {
        pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY,
                    "%s: cannot allocate %lld × %zu bytes of scratch (more than memory can hold)",
                    func, (long long)count, size);
        return NULL;
    }
    const size_t bytes = (size_t)count * size;
    void *p = aligned_alloc(ALIGN, bytes == 0 ? ALIGN : (bytes + ALIGN - 1) / ALIGN * ALIGN);
    if (!p)
        pytfm__fail(PYTFM_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of scratch", func,
                    bytes);
    return p;
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

int32_t pytfm_abi_version(void) { return PYTFM_ABI_VERSION; }

void pytfm__store_num_threads(int32_t threads) { atomic_store(&num_threads, threads); }

pytfm_status pytfm_set_num_threads(int32_t threads) {
    PYTFM_CHECK(threads >= 0, "%s: threads must be >= 0 (0: the default), got %d", __func__,
                (int)threads);
    pytfm__read_environment(); /* before the store: the environment is an earlier setting */
    atomic_store(&num_threads, threads);
    return PYTFM_STATUS_OK;
}

#if defined(_OPENMP)
enum { PYTFM_THREADS_PER_CORE = 4 };

/* PYTFM_THREADS_PER_CORE × the cores OpenMP may use (omp_get_num_procs: those of the process's
 * CPU affinity), counted once: libgomp asks the kernel each time */
static int max_threads(void) {
    static atomic_int cached; /* 0 until the first call; racing first calls store one value */
    int most = atomic_load_explicit(&cached, memory_order_relaxed);
    if (most == 0) {
        const int procs = omp_get_num_procs();
        most = PYTFM_THREADS_PER_CORE * (procs > 0 && procs < (1 << 20) ? procs : 1);
        atomic_store_explicit(&cached, most, memory_order_relaxed);
    }
    return most;
}
#endif

#if defined(_OPENMP)
/* Fork: libgomp keeps a team's threads in a pool that fork() does not copy, and a child that
 * starts a team after its parent has run one waits forever for threads it does not have. So a
 * child forked once this process has handed out a count above 1 (a team may have run) runs
 * every kernel on its calling thread: the same results, as at any count. A child forked before
 * that has a fresh libgomp and keeps the count. The handler is registered when the first count
 * above 1 is handed out, before its team starts. */
static atomic_int teams_asked;  /* 1 once a count above 1 was handed out; inherited by children */
static atomic_int forked_child; /* 1 in a process forked after that: one thread */
static pthread_once_t fork_watch = PTHREAD_ONCE_INIT;

static void in_forked_child(void) { atomic_store(&forked_child, atomic_load(&teams_asked)); }

static void watch_forks(void) { pthread_atfork(NULL, NULL, in_forked_child); }
#endif

int32_t pytfm_get_num_threads(void) {
    pytfm__read_environment();
#if defined(_OPENMP)
    if (atomic_load_explicit(&forked_child, memory_order_relaxed)) return 1;
    const int set = atomic_load(&num_threads), threads = set > 0 ? set : pytfm__default_threads();
    const int most = max_threads();
    const int count = threads < 1 ? 1 : threads > most ? most : threads;
    if (count > 1 && !atomic_load_explicit(&teams_asked, memory_order_relaxed)) {
        pthread_once(&fork_watch, watch_forks);
        atomic_store(&teams_asked, 1);
    }
    return count;
#else
    return 1;
#endif
}

/* set by the build when it compiles the kernels in cuda/ with nvcc */
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

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>

/* The BF16 features of CPUID leaf 7 (Intel SDM vol. 2A, CPUID): AVX512_BF16 is EAX bit 5 of
 * sub-leaf 1, AMX-BF16 EDX bit 22 of sub-leaf 0. Read here rather than through
 * __builtin_cpu_supports, whose names for them vary between compilers. Either counts only
 * where the OS saves the AVX-512 state, which __builtin_cpu_supports("avx512f") checks. */
static uint64_t read_bf16_features(void) {
    unsigned eax, ebx, ecx, edx;
    uint64_t f = 0;
    if (__get_cpuid_max(0, NULL) < 7 || !__builtin_cpu_supports("avx512f")) return 0;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    if (edx & (1u << 22)) f |= PYTFM_CPU_AMX_BF16;
    if (eax >= 1) { // sub-leaf 1 exists
        __cpuid_count(7, 1, eax, ebx, ecx, edx);
        if (eax & (1u << 5)) f |= PYTFM_CPU_AVX512_BF16;
    }
    return f;
}

/* read_bf16_features(), asked once: CPUID traps to the hypervisor in a virtual machine (a
 * microsecond or more), and every kernel call reads the features through pytfm_get_isa */
static uint64_t bf16_features(void) {
    const uint64_t KNOWN = (uint64_t)1 << 63;
    static atomic_uint_fast64_t cached; /* 0 until the first call; racing first calls agree */
    uint64_t f = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!f) {
        f = read_bf16_features() | KNOWN;
        atomic_store_explicit(&cached, f, memory_order_relaxed);
    }
    return f & ~KNOWN;
}
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
    f |= bf16_features();
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
