/* q8_avxvnni.c — the 8-bit weights' product on AVX-VNNI (q8_avx_impl.h): the VEX-encoded
 * 256-bit vpdpbusd of CPUs without AVX-512 (Alder Lake and later) and of those with both.
 * As on AVX512-VNNI (q8_avx512vnni.c), W's bytes enter unsigned (q + 128: an xor of the sign
 * bit) and each lane starts at −128·Σ qx of its 4 neighbours (the aux, int32), which makes the
 * sum exact for any q at one xor and one vpdpbusd a vector. pytfm__q8() takes this table on a
 * CPU with AVX2, FMA, F16C and AVX-VNNI. GCC 11 and Clang 12 brought the intrinsic. */
#include "q8.h"

#if (defined(__x86_64__) || defined(__i386__)) &&                                              \
    ((defined(__clang__) && __clang_major__ >= 12) ||                                          \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
/* the instruction set of every function below: GCC's target pragma; Clang ignores that
 * pragma and takes the same as an attribute pushed onto each function (the intrinsics'
 * header first, so that its own functions keep their attributes) */
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif
#define Q8_AUX(x)                                                                              \
    _mm256_sub_epi32(_mm256_setzero_si256(),                                                   \
                     _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(),                           \
                                             _mm256_set1_epi8((char)0x80), (x)))
#define Q8_DOT(w, x, aux)                                                                      \
    _mm256_dpbusd_avx_epi32((aux), _mm256_xor_si256((w), _mm256_set1_epi8((char)0x80)), (x))
#define Q8_TABLE pytfm__q8_avxvnni
#define Q8_NAME "avxvnni"
#include "q8_avx_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
const pytfm__q8_kernels pytfm__q8_avxvnni = {0};
#endif
