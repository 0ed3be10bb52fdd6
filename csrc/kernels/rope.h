/*
 * rope.h — what the two RoPE files share (internal): rope.c's angles from a base, rope_half.c's
 * from a table of frequencies, one rotation.
 */
#ifndef PYTFM_KERNELS_ROPE_H
#define PYTFM_KERNELS_ROPE_H

#include <stdint.h>

/* One (b, t) row of H heads of D floats, in -> out (may be the same), each head's pairs
 * (i, i + D/2) rotated by the angles whose cosines are c [D/2] and sines s [D/2]. */
void pytfm__rope_rotate_row(float *out, const float *in, const float *c, const float *s,
                            int64_t H, int64_t D);

#endif /* PYTFM_KERNELS_ROPE_H */
