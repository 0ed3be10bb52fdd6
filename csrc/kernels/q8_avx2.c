/* q8_avx2.c — the 8-bit weights' product on AVX2 (q8_avx_impl.h): vpmaddubsw multiplies
 * unsigned bytes by signed ones into 16-bit sums of pairs, so x enters as |qx| (the aux) and
 * its sign moves onto W (vpsignb, llama.cpp's trick); a pair's sum is at most 2·127·127, under
 * the 16-bit saturation, for q in [−127, 127] (q = −128 with a negative qx would give −128·|qx|,
 * pytfm_kernels.h's caveat). vpmaddwd by ones then adds the pairs into the 4 neighbours' lane.
 * pytfm__q8() takes this table on a CPU with AVX2, FMA and F16C. */
#include "q8.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
/* the instruction set of every function below: GCC's target pragma; Clang ignores that
 * pragma and takes the same as an attribute pushed onto each function (the intrinsics'
 * header first, so that its own functions keep their attributes) */
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#define Q8_AUX(x) _mm256_abs_epi8(x)
#define Q8_DOT(w, x, aux)                                                                      \
    _mm256_madd_epi16(_mm256_maddubs_epi16((aux), _mm256_sign_epi8((w), (x))),                 \
                      _mm256_set1_epi16(1))
#define Q8_TABLE pytfm__q8_avx2
#define Q8_NAME "avx2"
#include "q8_avx_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
const pytfm__q8_kernels pytfm__q8_avx2 = {0};
#endif
