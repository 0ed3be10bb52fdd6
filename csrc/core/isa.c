/*
 * isa.c — which instruction set the kernels use: the best this CPU has (detected at run time),
 * capped by pytfm_set_max_isa (or PYTFM_MAX_ISA: environment.c). The cap is process-wide, like
 * the thread count.
 */
#include "internal.h"

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
