/*
 * pytfm_core.h — what every part of libpytfm shares: statuses and the last error, the
 * version, the two process-wide settings (the thread count and the instruction-set cap), the
 * precisions of the matrix products, and how the library was built. The other headers include
 * it.
 *
 * Everything between this header's PYTFM_CDEF markers is read verbatim by the cffi builder
 * (pytfm/_build_ffi.py), so it must stay plain declarations: no macros but PYTFM_API.
 */
#ifndef PYTFM_CORE_H
#define PYTFM_CORE_H

#include <stddef.h>
#include <stdint.h>

#define PYTFM_VERSION_MAJOR 0
#define PYTFM_VERSION_MINOR 1
#define PYTFM_VERSION_PATCH 0
#define PYTFM_VERSION "0.1.0"
/* The ABI number: raised when a function's signature, a struct's layout or an enum's values
 * change incompatibly (new functions do not raise it). The CMake build names the shared
 * library's SONAME after it (libpytfm.so.1); pytfm_abi_version() is the library's own, so a
 * program can check at run time that it was compiled against a compatible header. */
#define PYTFM_ABI_VERSION 1

#if defined(PYTFM_BUILDING) && defined(__GNUC__)
#define PYTFM_API __attribute__((visibility("default")))
#else
#define PYTFM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* PYTFM_CDEF_BEGIN */

/* ---- Status, errors, version, build information ------------------------------------- */

typedef enum pytfm_status {
    PYTFM_STATUS_OK = 0,
    PYTFM_STATUS_INVALID_ARGUMENT = 1, /* NULL pointer, bad size or bad scalar option */
    PYTFM_STATUS_OUT_OF_RANGE = 2,     /* an index array holds a value outside its range */
    PYTFM_STATUS_NOT_SUPPORTED = 3,    /* the operation is not available in this build */
    PYTFM_STATUS_CUDA_ERROR = 4,       /* the CUDA runtime reported an error */
    PYTFM_STATUS_INTERNAL = 5,         /* a bug in pytfm: please report it */
    PYTFM_STATUS_OUT_OF_MEMORY = 6     /* a scratch buffer could not be allocated */
} pytfm_status;

/* A static, human-readable name for a status, e.g. "invalid argument". Never NULL. */
PYTFM_API const char *pytfm_status_string(pytfm_status status);

/* The message of the most recent failure in the calling thread ("" if none yet), e.g.
 * "pytfm_layernorm_forward: cols must be >= 1, got 0". Valid until the next pytfm call in this
 * thread. Successful calls leave it unchanged. */
PYTFM_API const char *pytfm_last_error(void);

/* The library version, "MAJOR.MINOR.PATCH" (PYTFM_VERSION of the header it was built with). */
PYTFM_API const char *pytfm_version(void);

/* The library's PYTFM_ABI_VERSION (of the header it was built with). */
PYTFM_API int32_t pytfm_abi_version(void);

/* Threads used by the kernels (when built with OpenMP); threads >= 0. Process-wide, like a
 * BLAS's thread setting: it changes speed only, the results are the same bits at any count.
 *   0, the default: OpenMP's count (OMP_NUM_THREADS, else the available cores), lowered to the
 *      cores that other processes leave free (on Linux; csrc/core/free_cores.c says how).
 *   n: at most n threads: up to the process's cores, each parallel region's team is n lowered to
 *      the cores the last two samples both saw free (a team member on a core another process
 *      keeps busy holds the whole team at every barrier); above them, n as it is.
 * The environment variable PYTFM_NUM_THREADS sets it (read once, at the first get or set of the
 * thread count or the ISA cap, or at pytfm_read_environment; a set call wins; a bad value is
 * ignored: csrc/core/environment.c).
 * Whatever the source, the kernels use at most 4 threads per core of the process's CPU
 * affinity: a larger value is accepted and clamped. A change from another thread while
 * kernels run is safe and takes effect from the next call. Without OpenMP the setting is
 * accepted and the kernels run on one thread. After fork(): OpenMP's threads are not copied
 * into a child, so in a process forked from one that had already used more than one thread,
 * the kernels run on one thread whatever the setting (a child forked before keeps it). Why the
 * default follows the load: docs/python-api.md, "Threads". */
PYTFM_API pytfm_status pytfm_set_num_threads(int32_t threads);

/* The number of threads the next kernel will use, after the clamp above (1 without OpenMP, and
 * in a forked child as said above). */
PYTFM_API int32_t pytfm_get_num_threads(void);

/* CPU features, as a bit mask in pytfm_build_info.cpu_features (detected at run time). */
typedef enum pytfm_cpu_feature {
    PYTFM_CPU_SSE2 = 1,
    PYTFM_CPU_AVX = 2,
    PYTFM_CPU_AVX2 = 4,
    PYTFM_CPU_FMA = 8,
    PYTFM_CPU_AVX512F = 16,
    PYTFM_CPU_NEON = 32,
    PYTFM_CPU_AVX512_BF16 = 64, /* vdpbf16ps, vcvtne2ps2bf16 (with AVX-512F usable) */
    PYTFM_CPU_AMX_BF16 = 128    /* AMX tiles with BF16 products: detected, not used (no AMX
                                   kernel yet; such a CPU runs the AVX512-BF16 ones) */
} pytfm_cpu_feature;

/* Instruction sets the kernels are written for. By default every kernel runs the fastest
 * version this CPU has; pytfm_set_max_isa caps that (tests compare the versions with it,
 * benchmarks time them). PLAIN runs the plain reference loops (the obviously-correct version
 * of each kernel); PORTABLE the vectorised kernels built for the baseline target (SSE2, NEON).
 * Versions agree to float32 rounding, not bit for bit: the fast ones sum in other orders.
 * AVX512_BF16 serves the BF16 products alone (pytfm_get_bf16_isa); every other kernel runs
 * its AVX512 version there. */
typedef enum pytfm_isa {
    PYTFM_ISA_AUTO = 0,       /* no cap: the best this CPU has */
    PYTFM_ISA_PLAIN = 1,      /* reference loops */
    PYTFM_ISA_PORTABLE = 2,   /* vectorised for the baseline target */
    PYTFM_ISA_AVX2 = 3,       /* x86-64 AVX2 + FMA */
    PYTFM_ISA_AVX512 = 4,     /* x86-64 AVX-512F */
    PYTFM_ISA_AVX512_BF16 = 5 /* AVX-512F + AVX512_BF16 (vdpbf16ps): the BF16 products */
} pytfm_isa;

/* Use no instruction set above isa (PYTFM_ISA_AUTO: no cap). Process-wide, like the thread
 * count; it changes which kernel versions run, and so the last bits of results. A cap of
 * PYTFM_ISA_AVX512 keeps the BF16 products off the AVX512_BF16 instructions (they then run
 * as on a CPU without them: BF16-rounded inputs through the AVX-512 FP32 kernels). The
 * environment variable PYTFM_MAX_ISA (auto, plain, portable, avx2, avx512, avx512_bf16) sets
 * it, read as PYTFM_NUM_THREADS is. */
PYTFM_API pytfm_status pytfm_set_max_isa(int32_t isa);

/* Read PYTFM_NUM_THREADS and PYTFM_MAX_ISA now (once a process: a later call returns what the
 * first found): PYTFM_STATUS_OK, or PYTFM_STATUS_INVALID_ARGUMENT naming the first variable
 * whose value is bad ("PYTFM_NUM_THREADS='many': it must be ..."), which is then ignored. A
 * program that never calls it gets them read at the first get or set of either setting, and a
 * bad value told on stderr instead (no call there can return it). `import pytfm` calls it. */
PYTFM_API pytfm_status pytfm_read_environment(void);

/* The pytfm_isa the FP32 kernels use now: the best this CPU has, under the cap, at most
 * PYTFM_ISA_AVX512 (no FP32 kernel is written for more). */
PYTFM_API int32_t pytfm_get_isa(void);

/* The pytfm_isa the BF16 products (PYTFM_PRECISION_BF16) run on now:
 *   PYTFM_ISA_AVX512_BF16  vdpbf16ps micro-kernels on panels packed as BF16 pairs
 *   PYTFM_ISA_AVX512, PYTFM_ISA_AVX2
 *                          the FP32 kernels of that ISA on panels rounded to BF16 as they are
 *                          packed (the same products, summed in the FP32 kernels' order)
 *   PYTFM_ISA_PORTABLE, PYTFM_ISA_PLAIN
 *                          the plain loop on inputs rounded as they are read
 * Every path multiplies the same BF16 values and sums in float32: results differ between
 * paths only by the order of the sums. A CPU with AMX gets PYTFM_ISA_AVX512_BF16 (AMX tiles
 * are not used). */
PYTFM_API int32_t pytfm_get_bf16_isa(void);

/* The precision of the matrix products (the linear layer's and pytfm_sgemm_ex's).
 *   FP32  float32 inputs, float32 sums: the default, and what the functions without a
 *         precision argument compute
 *   BF16  each input rounded to BF16 (pytfm_round_bf16: 8 significant bits, round to nearest
 *         even) as it is read, the products (exact in float32) summed in float32; outputs,
 *         biases, activations and every other op stay float32
 *   TF32  the GPU's tensor-core format, for the _cuda twins only (pytfm_cuda.h): each input
 *         rounded to TF32 (11 significant bits, to nearest, ties away from zero: the GPU's
 *         cvt.rna.tf32.f32) as it is read, the products (exact in float32) summed in float32.
 *         The CPU functions refuse it (PYTFM_STATUS_INVALID_ARGUMENT): its CPU twin would be
 *         the FP32 kernels on rounded inputs, which no caller needs yet.
 *   INT8  a model's precision, for inference on the CPU (pytfm_model_set_precision): every
 *         weight matrix held as blocks of 32 int8 values with an fp16 scale each (Q8_0), its
 *         products pytfm_linear_forward_q8w's. It is no precision of a single product: the
 *         functions with a precision argument refuse it (PYTFM_STATUS_INVALID_ARGUMENT), as
 *         the _cuda twins do; the weights must be quantised first (pytfm_quantize_q8). */
typedef enum pytfm_precision {
    PYTFM_PRECISION_FP32 = 0,
    PYTFM_PRECISION_BF16 = 1,
    PYTFM_PRECISION_TF32 = 2,
    PYTFM_PRECISION_INT8 = 3
} pytfm_precision;

typedef struct pytfm_build_info {
    const char *version;   /* as pytfm_version() */
    const char *compiler;  /* compiler that built the library, e.g. "gcc 12.2.0" */
    const char *flags;     /* compile flags of the C kernels */
    const char *arch;      /* target architecture, e.g. "x86_64" */
    uint64_t cpu_features; /* pytfm_cpu_feature bits of the CPU running now */
    int32_t cuda;          /* 1 if CUDA kernels were compiled in, else 0 */
    int32_t cuda_version;  /* CUDA toolkit version as 1000*major + 10*minor, 0 without CUDA */
} pytfm_build_info;

/* Fill *info. The strings are static. */
PYTFM_API pytfm_status pytfm_get_build_info(pytfm_build_info *info);

/* PYTFM_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PYTFM_CORE_H */
