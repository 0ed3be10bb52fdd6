/* fast_avx512.c — the element-wise kernels of fast_impl.h compiled for AVX-512 (16 floats a
 * vector). pytfm__fast() returns this table only when pytfm_get_isa() is PYTFM_ISA_AVX512,
 * which needs a CPU with AVX-512F (isa.c). A build for another architecture (or by a compiler
 * without GCC's target pragmas) gets an empty table of NULL pointers instead, never used
 * there: its CPU features never include AVX-512F, so the ISA stays at PORTABLE or PLAIN. */
#include "fast.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#pragma GCC target("avx512f,fma,prefer-vector-width=512")
#include "vecmath.h" /* after the switch: PYTFM_FMA fuses where the target has FMA */
#define PYTFM_FAST_TABLE pytfm__fast_avx512
#include "fast_impl.h"
#else
const pytfm__fast_kernels pytfm__fast_avx512 = {0};
#endif
