/* fast_portable.c — the element-wise kernels of fast_impl.h for the baseline target (SSE2 on
 * x86-64, NEON on AArch64): what runs on a CPU without AVX2. */
#define PYTFM_FAST_TABLE pytfm__fast_portable
#include "fast_impl.h"
