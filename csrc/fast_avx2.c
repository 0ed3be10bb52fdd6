/* fast_avx2.c — the element-wise kernels of fast_impl.h compiled for AVX2 (8 floats a vector).
 * Only called on CPUs that have it; elsewhere the table points at the portable build. */
#include "fast.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#pragma GCC target("avx2,fma")
#include "vecmath.h" /* after the switch: PYTFM_FMA fuses where the target has FMA */
#define PYTFM_FAST_TABLE pytfm__fast_avx2
#include "fast_impl.h"
#else
const pytfm__fast_kernels pytfm__fast_avx2 = {0};
#endif
