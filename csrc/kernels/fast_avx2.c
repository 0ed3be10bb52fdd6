/* fast_avx2.c — the element-wise kernels of fast_impl.h compiled for AVX2 (8 floats a vector).
 * pytfm__fast() returns this table only when pytfm_get_isa() is PYTFM_ISA_AVX2, which needs a
 * CPU with AVX2 and FMA (isa.c). A build for another architecture (or by a compiler without
 * GCC's target pragmas) gets an empty table of NULL pointers instead, never used there: its
 * CPU features never include AVX2, so the ISA stays at PORTABLE or PLAIN. */
#include "fast.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#pragma GCC target("avx2,fma")
#include "vecmath.h" /* after the switch: PYTFM_FMA fuses where the target has FMA */
#define PYTFM_FAST_TABLE pytfm__fast_avx2
#include "fast_impl.h"
#else
const pytfm__fast_kernels pytfm__fast_avx2 = {0};
#endif
