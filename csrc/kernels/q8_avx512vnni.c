#include "q8.h"

const pytfm__q8_kernels pytfm__q8_avx512vnni = {0};
