/*
 * pytfm.h — the public C API of libpytfm, in one include: the kernels of a transformer (CPU),
 * their CUDA twins, and a GPT model that runs from a checkpoint. Each part is its own header;
 * a program may include only the one it uses.
 *
 *   pytfm_core.h     statuses and errors, version, thread count, instruction-set cap, build info
 *   pytfm_kernels.h  the CPU kernels, forward and backward, and the conventions they all follow
 *   pytfm_model.h    the model API: open a checkpoint, forward, decoding sessions, sampling
 *   pytfm_tokenizer.h  GPT-2's byte-level BPE tokenizer: open a vocabulary, encode, decode
 *   pytfm_cuda.h     the CUDA twins of the kernels, on device pointers and a stream
 *
 * The cffi binding (pytfm/_build_ffi.py) reads the headers included below, in this order.
 */
#ifndef PYTFM_H
#define PYTFM_H

#include "pytfm_core.h"
#include "pytfm_kernels.h"
#include "pytfm_model.h"
#include "pytfm_tokenizer.h"
#include "pytfm_cuda.h"

#endif /* PYTFM_H */
