/* fast_portable.c — the element-wise kernels of fast_impl.h for the baseline target (SSE2 on
 * x86-64, NEON on AArch64): what runs on a CPU without AVX2; and the choice among the tables by
 * instruction set. */
#define PYTFM_FAST_TABLE pytfm__fast_portable
#include "fast_impl.h"

const pytfm__fast_kernels *pytfm__fast_for(int32_t isa) {
    switch (isa) {
    case PYTFM_ISA_AVX512: return &pytfm__fast_avx512;
    case PYTFM_ISA_AVX2: return &pytfm__fast_avx2;
    case PYTFM_ISA_PORTABLE: return &pytfm__fast_portable;
    default: return NULL;
    }
}

const pytfm__fast_kernels *pytfm__fast(void) { return pytfm__fast_for(pytfm_get_isa()); }
