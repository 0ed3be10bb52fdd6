/*
 * isa.c — which instruction set the kernels use: the best this CPU has (detected at run time),
 * capped by pytfm_set_max_isa (or PYTFM_MAX_ISA: environment.c). The cap is process-wide, like
 * the thread count.
 */
#include "internal.h"
#include "kernels/q8.h"

#if defined(__STDC_NO_ATOMICS__)
static volatile int32_t max_isa = PYTFM_ISA_AUTO;
#define LOAD(v) (v)
#define STORE(v, x) ((v) = (x))
#else
#include <stdatomic.h>
static _Atomic int32_t max_isa = PYTFM_ISA_AUTO;
#define LOAD(v) atomic_load_explicit(&(v), memory_order_relaxed)
#define STORE(v, x) atomic_store_explicit(&(v), (x), memory_order_relaxed)
#endif

int pytfm__cpu_has(pytfm_isa isa) {
    const uint64_t f = pytfm__cpu_features(), avx2 = PYTFM_CPU_AVX2 | PYTFM_CPU_FMA;
    switch (isa) {
    case PYTFM_ISA_PLAIN:
    case PYTFM_ISA_PORTABLE: return 1;
    case PYTFM_ISA_AVX2: return (f & avx2) == avx2;
    case PYTFM_ISA_AVX512: return (f & PYTFM_CPU_AVX512F) != 0;
    case PYTFM_ISA_AVX512_BF16:
        return PYTFM_HAVE_BF16_KERNELS && (f & PYTFM_CPU_AVX512F) && (f & PYTFM_CPU_AVX512_BF16);
    default: return 0;
    }
}

void pytfm__store_max_isa(int32_t isa) { STORE(max_isa, isa); }

pytfm_status pytfm_set_max_isa(int32_t isa) {
    PYTFM_CHECK(isa >= PYTFM_ISA_AUTO && isa <= PYTFM_ISA_AVX512_BF16,
                "%s: isa must be a pytfm_isa value (0..5), got %d", __func__, (int)isa);
    pytfm__read_environment(); /* before the store: the environment is an earlier setting */
    STORE(max_isa, isa);
    return PYTFM_STATUS_OK;
}

/* the best ISA in [PLAIN, top] this CPU has under the cap */
static int32_t best_up_to(int32_t top) {
    pytfm__read_environment();
    const int32_t cap = LOAD(max_isa);
    for (int32_t isa = top; isa > PYTFM_ISA_PLAIN; isa--)
        if ((cap == PYTFM_ISA_AUTO || isa <= cap) && pytfm__cpu_has((pytfm_isa)isa)) return isa;
    return PYTFM_ISA_PLAIN;
}

int32_t pytfm_get_isa(void) { return best_up_to(PYTFM_ISA_AVX512); }

int32_t pytfm_get_bf16_isa(void) { return best_up_to(PYTFM_ISA_AVX512_BF16); }

/* ---- VNNI, for the 8-bit weights' kernels (kernels/q8.h) ----------------------------------- */

int32_t pytfm__isa_cap(void) {
    pytfm__read_environment();
    return LOAD(max_isa);
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>

/* CPUID (Intel SDM vol. 2A): F16C is leaf 1 ECX bit 29; leaf 7 sub-leaf 0 has AVX512BW and
 * AVX512VL in EBX bits 30 and 31 and AVX512_VNNI in ECX bit 11, sub-leaf 1 AVX-VNNI in EAX
 * bit 4. Each counts only where the OS saves its registers, which __builtin_cpu_supports checks for AVX-512 (avx512f)
 * and for the ymm registers (avx2). */
static uint64_t read_q8_features(void) {
    unsigned eax, ebx, ecx, edx;
    uint64_t f = 0;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || __get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid(1, eax, ebx, ecx, edx);
    if (ecx & (1u << 29)) f |= PYTFM__CPU_F16C;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    if (__builtin_cpu_supports("avx512f") && (ebx & (1u << 30)) && (ebx & (1u << 31)) &&
        (ecx & (1u << 11)))
        f |= PYTFM__CPU_AVX512_VNNI;
    if (eax >= 1) { // sub-leaf 1 exists
        __cpuid_count(7, 1, eax, ebx, ecx, edx);
        if (eax & (1u << 4)) f |= PYTFM__CPU_AVX_VNNI;
    }
    return f;
}
#else
static uint64_t read_q8_features(void) { return 0; }
#endif

/* read_q8_features(), asked once (CPUID may trap to a hypervisor; racing first calls agree) */
uint64_t pytfm__cpu_q8_features(void) {
    const uint64_t KNOWN = (uint64_t)1 << 63;
#if defined(__STDC_NO_ATOMICS__)
    static volatile uint64_t cached;
    uint64_t f = cached;
    if (!f) cached = f = read_q8_features() | KNOWN;
#else
    static _Atomic uint64_t cached;
    uint64_t f = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!f) {
        f = read_q8_features() | KNOWN;
        atomic_store_explicit(&cached, f, memory_order_relaxed);
    }
#endif
    return f & ~KNOWN;
}
