/* fast_avx512.c — the element-wise kernels of fast_impl.h compiled for AVX-512 (16 floats a
 * vector). Only called on CPUs that have it; elsewhere the table points at the portable build. */
#include "fast.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#pragma GCC target("avx512f,fma,prefer-vector-width=512")
#include "vecmath.h" /* after the switch: PYTFM_FMA fuses where the target has FMA */
#define PYTFM_FAST_TABLE pytfm__fast_avx512
#include "fast_impl.h"
#else
const pytfm__fast_kernels pytfm__fast_avx512 = {0};
#endif
