/* fast_avx2.c — the element-wise kernels of fast_impl.h compiled for AVX2 (8 floats a vector).
 * Only called on CPUs that have it; elsewhere the table points at the portable build. */
#include "fast.h"
#include "vecmath.h" /* before the target switch: its inline maths is inlined into each build */

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#pragma GCC target("avx2,fma")
#define PYTFM_FAST_TABLE pytfm__fast_avx2
#include "fast_impl.h"
#else
const pytfm__fast_kernels pytfm__fast_avx2 = {0};
#endif
