"""Plant known bugs in the kernels, one at a time, and check that the test suite catches each.

    python dev/mutate.py                      # every mutation below
    python dev/mutate.py softmax_no_max ...   # some of them
    python dev/mutate.py --list

Each mutation is planted (plant(): a short text, found once in the function it names, wherever
that function now is) in a fresh copy of the committed tree (git archive HEAD), which is built in
place (setup.py build_ext --inplace: needs setuptools, cffi and cmake, as any build
does) and tested with the named test files under the derandomised `ci` hypothesis profile. A mutation the
tests do not catch is a hole in the tests. The build is CPU-only (PYTFM_CUDA=0): the cuda_*
mutations are caught by tests/cuda/test_cuda_emu.py, which runs the CUDA kernels on the
emulator. Most of the kernels' checks iterate tests/ops_registry.py: the files named here are
where those iterations run. Exit status 1 if any mutation survives.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (file, scope, text, replacement, test files that must catch it). The scope is the function,
# macro or struct (Python: def or class; "A::b" in C, "A.b" in Python: b inside A; None: the
# whole file) where the text occurs once; see plant() below.
# the plain kernels run where the fast ones cannot (and under PYTFM_MAX_ISA=plain):
# tests/kernels/test_fast.py is what compares them
OPS = ["tests/kernels/test_ops.py", "tests/kernels/test_properties.py", "tests/kernels/test_errors.py", "tests/kernels/test_fast.py"]
# attention against the reference: tests/kernels/test_ops.py (the registry's check) and
# test_attention.py (its own sizes, properties)
ATT = ["tests/kernels/test_ops.py", "tests/kernels/test_attention.py", "tests/kernels/test_fast.py"]
# the tensor-core attention on the emulator
TC_ATT = ["tests/cuda/test_cuda_tc_attention.py"]
FAST = ["tests/kernels/test_fast.py"]
EMU = ["tests/cuda/test_cuda_emu.py"]  # the CUDA kernels, run on the CPU by cuda/emu
SGEMM = ["tests/cuda/test_cuda_sgemm.py"]  # the GPU SGEMM, fast and plain (the oracle), on cuda/emu
# the emulator's mma and eager cp.async, the tensor-core SGEMM and the linear _ex twins on it
TC = ["tests/cuda/test_cuda_tensor_core.py"]
# the product on BF16 operands in memory and the bf16 route through it (cuda/sgemm_tc.cu)
TC16 = ["tests/cuda/test_cuda_bf16_gemm.py"]
# the row and column kernels (rows in registers, the plain ones past 4096 columns, the two-stage
# column sums), by their own tests and the general ones
ROWS = ["tests/cuda/test_cuda_rows.py", "tests/cuda/test_cuda_emu.py"]
LIMITS = ["tests/kernels/test_limits.py"]  # overflowing sizes, in subprocesses
EXTREMES = ["tests/kernels/test_extremes.py"]  # float extremes and overlaps
THREADS = ["tests/kernels/test_threads.py", "tests/c_api/test_sanitizers.py"]  # the thread count
MUTATIONS = {
    "softmax_no_max": ("csrc/kernels/softmax.c", "pytfm_softmax_forward", "expf(xr[j] - max);", "expf(xr[j]);", OPS),
    "layernorm_dx_no_rstd": ("csrc/kernels/layernorm.c", "pytfm_layernorm_backward", "dxr[j] = rs *", "dxr[j] =", OPS),
    "layernorm_unbiased_var": ("csrc/kernels/layernorm.c", "pytfm__layernorm_forward_row",
                               "sqrt(ss / (double)cols", "sqrt(ss / (double)(cols > 1 ? cols - 1 : 1)", OPS),
    "linear_dw_written": ("csrc/kernels/linear.c", "backward", "rows, 1, 0, 1.0f,", "rows, 1, 0, 0.0f,", OPS),
    "rope_backward_same_sign": ("csrc/kernels/rope.c", "pytfm_rope_backward", "pos_stride, base, -1.0);", "pos_stride, base, +1.0);", OPS),
    "gelu_backward_missing_term": ("csrc/kernels/gelu.c", "pytfm_gelu_backward", "+ 2.0f * vt * s * (1.0f - s) * du);", ");", OPS),
    # the BF16-only weights: a widened block's product with the first block's bias, and ids
    # read unchecked (tests/kernels/test_bf16_weights.py: its path thresholds, its bad ids)
    "linear_bf16w_block_bias": ("csrc/kernels/linear.c", "product_bf16_weights", "{b ? b + o0 : NULL, NULL, NULL}",
                                "{b, NULL, NULL}", ["tests/kernels/test_bf16_weights.py"]),
    "embedding_bf16w_ids_unchecked": ("csrc/kernels/embedding.c", "pytfm_embedding_forward_bf16w",
                                      "PYTFM_TRY(pytfm__check_indices(", "(void)(pytfm__check_indices(",
                                      ["tests/kernels/test_bf16_weights.py"]),
    "embedding_backward_assign": ("csrc/kernels/embedding.c", "pytfm_embedding_backward", "j++) row[j] +=", "j++) row[j] =", OPS),
    "ce_no_onehot": ("csrc/kernels/cross_entropy.c", "backward",
                     "drow[j] -= off; drow[targets[i]] -= on;", "drow[j] -= off;", OPS),
    # label smoothing: the uniform share left out of the gradient, the row's sum taken for its mean
    "ce_smoothed_no_uniform": ("csrc/kernels/cross_entropy.c", "backward",
                               "drow[j] -= off; drow[targets[i]] -= on;", "drow[targets[i]] -= on;", OPS),
    "ce_smoothed_sum_for_mean": ("csrc/kernels/cross_entropy.c", "row_mean", "return sum / (double)vocab;",
                                 "return sum;", OPS),
    "adamw_no_bias_correction": ("csrc/kernels/adamw.c", "pytfm_adamw_step", "(float)(lr / (1.0 - pow(beta1, (double)step)));", "(float)lr;", OPS),
    "sgemm_avx512_skips_last_p": ("csrc/kernels/sgemm.c", "micro_avx512",
                                  "(int64_t p = 0; p <", "(int64_t p = 0; p + 1 <", ["tests/kernels/test_sgemm.py"]),
    "sgemm_avx2_edge_store_too_wide": ("csrc/kernels/sgemm.c", "AVX2_STORE",
                                       "_mm256_maskstore_ps(cr + 8, m1,", "_mm256_maskstore_ps(cr + 8, m0,", ["tests/kernels/test_sgemm.py"]),
    "sgemm_slices_overwrite": ("csrc/kernels/sgemm.c", "rows_times_panel", "pc == 0 ? g->beta : 1.0f;", "g->beta;", ["tests/kernels/test_sgemm.py"]),
    "sgemm_avx512_mask_one_wide": ("csrc/kernels/sgemm.c", "micro_avx512", "(cols - 16))", "(cols - 15))", ["tests/kernels/test_sgemm.py"]),
    "fast_ln_partials_per_thread": ("csrc/kernels/layernorm.c", "backward_fast",
                                    "= PYTFM_MIN(rows, (int64_t)LN_CHUNKS);", "= PYTFM_MIN(rows, (int64_t)pytfm_get_num_threads());", FAST),
    "fast_exp_coefficient": ("csrc/kernels/vecmath.h", "pytfm__expf", "PYTFM_FMA(p, r, 1.6666665459e-1f);", "PYTFM_FMA(p, r, 1.6e-1f);", FAST),
    "fast_softmax_tail_dropped": ("csrc/kernels/fast_impl.h", "softmax_backward", "for (; j < cols; j++) tail += dy[j] * y[j];", "", FAST),
    # a rescale happens past the forward's 256-key tile: test_attention_across_the_key_tiles
    "attn_fast_no_rescale": ("csrc/kernels/attention.c", "forward_head_fast", "(alpha != 1.0f)", "(0)", ATT),
    "attn_fast_dq_overwrites": ("csrc/kernels/attention.c", "backward_head_fast", "D, nk, 1.0f,", "D, nk, 0.0f,", FAST),
    "attn_no_rescale": ("csrc/kernels/attention.c", "forward_head", "for (int64_t d = 0; d < D; d++) orow[d] *= alpha;", "", ATT),
    "attn_causal_sees_next": ("csrc/kernels/attention.c", "forward_head", "i0 + r - j0 + 1)", "i0 + r - j0 + 2)", ATT),
    "attn_bwd_no_delta": ("csrc/kernels/attention.c", "backward_head", "D) - delta[r])", "D))", ATT),
    "attn_decode_ignores_start": ("csrc/kernels/attention.c", "pytfm_attention_decode", "H, H, D, start,", "H, H, D, 0,", ATT),
    # grouped-query heads and the sliding window: the window one key wider, query heads on the
    # key/value heads interleaved (h % Hkv) instead of repeated (h / G), dk and dv of the last
    # head of a group only
    "attn_window_one_wider": ("csrc/kernels/attention.c", "first_key", "pos - window + 1 > 0 ? pos - window + 1 : 0",
                              "pos - window > 0 ? pos - window : 0", ATT),
    "attn_gqa_interleaved": ("csrc/kernels/attention.c", "head_of", "g = h / (p->H / p->Hkv);", "g = h % p->Hkv;", ATT),
    "attn_gqa_last_head_only": ("csrc/kernels/attention.c", "backward_group", "for (int64_t h = kv * G; h < (kv + 1) * G; h++)\n        backward_head_fast",
                                "for (int64_t h = (kv + 1) * G - 1; h < (kv + 1) * G; h++)\n        backward_head_fast", ATT),
    "attn_no_max_shift": ("csrc/kernels/attention.c", "forward_head", "= expf(s[c] -", "= expf(s[c]) * expf(-", ATT),
    # the plain CUDA SGEMM (pytfm_sgemm_plain_cuda, the oracle of the fast one)
    "cuda_sgemm_no_barrier_before_compute": ("cuda/sgemm.cu", "sgemm_plain_kernel", "__syncthreads(); for (int", "for (int", SGEMM),
    "cuda_sgemm_no_barrier_after_compute": ("cuda/sgemm.cu", "sgemm_plain_kernel",
                                            "__syncthreads(); // the tiles are overwritten next slice", "", SGEMM),
    "cuda_sgemm_k_edge_off_by_one": ("cuda/sgemm.cu", "sgemm_plain_kernel", "gj < n && gp < k", "gj < n && gp <= k", SGEMM),
    "cuda_sgemm_store_off_by_one": ("cuda/sgemm.cu", "sgemm_plain_kernel", "if (gi < m && gj", "if (gi <= m && gj", SGEMM),
    # the emulator's mma: a wrong fragment layout (TF32 a1 and a2 swapped; BF16 b's halves
    # swapped), the eager cp.async mode landing copies at the wait after all; its ldmatrix:
    # .trans's or the plain form's halves swapped, its bank-conflict count blind. The
    # tensor-core SGEMM: its ldmatrix rows for A in the wrong matrix order, no barrier in a
    # slice (each precision's loop), TF32 truncated instead of rounded, a tile's row edge or k
    # edge off by one, the edge-free copy path taken one chunk past k; a swizzle on the write
    # only (TF32, BF16) or on the read only (TF32, BF16 .trans), a staging buffer or a rounded
    # tile off by one slice, the cp.async wait missing (each loop) or one group too lax,
    # .trans missing (A) or where it is not wanted (B)
    "cuda_mma_tf32_layout_a_swapped": ("cuda/emu/emu.cpp", "mma_layout", "row / 8 + 2 * (col / 4),", "2 * (row / 8) + col / 4,", TC),
    "cuda_mma_bf16_halves_swapped": ("cuda/emu/emu.cpp", "mma_layout", "2, row / 8, row", "2, row / 8, 1 - row", TC),
    "cuda_emu_eager_cp_async_at_the_wait": ("cuda/emu/emu.cpp", "cp_async", "if (cp_async_eager) {", "if (!cp_async_eager) {", TC),
    "cuda_ldmatrix_trans_halves_swapped": ("cuda/emu/emu.cpp", "ldmatrix_slot", "row / 2, 0, row", "row / 2, 0, 1 - row", TC),
    "cuda_ldmatrix_halves_swapped": ("cuda/emu/emu.cpp", "ldmatrix_slot", "col / 2, 0, col", "col / 2, 0, 1 - col", TC),
    "cuda_ldmatrix_blind_to_conflicts": ("cuda/emu/emu.cpp", "ldmatrix_wavefronts", "worst = per_bank[bank];", "worst = 1;", TC),
    "cuda_sgemm_tc_fragment_gather": ("cuda/sgemm_tc.cu", "load_a",
                                      "8 * (q % 2); row = (const float *)F + r * TBK + pytfm__swz<4>(r, kk / 4 + q / 2)",
                                      "8 * (q / 2); row = (const float *)F + r * TBK + pytfm__swz<4>(r, kk / 4 + q % 2)", TC),
    "cuda_sgemm_tc_tf32_no_barrier_in_a_slice": ("cuda/sgemm_tc.cu", "products_f32", "__syncthreads(); issue(s +", "issue(s +", TC),
    "cuda_sgemm_tc_bf16_no_barrier_in_a_slice": ("cuda/sgemm_tc.cu", "products_f32", "__syncthreads(); if (s", "if (s", TC),
    "cuda_sgemm_tc_truncates_tf32": ("cuda/mma.cuh", "pytfm__tf32",
                                     "return pytfm_emu::cvt_rna_tf32(x); }", "uint32_t u;\nmemcpy(&u, &x, 4);\nreturn u;\n}", TC),
    # (a row read past the edge lands in C's masked rows: the off-by-one that shows drops one)
    "cuda_sgemm_tc_row_edge_off_by_one": ("cuda/sgemm_tc.cu", "Chunks::Chunks", "across |= (gr + r * RS < rows)", "across |= (gr + r * RS + 1 < rows)", TC),
    "cuda_sgemm_tc_k_edge_off_by_one": ("cuda/sgemm_tc.cu", "left", "kext - kp < W ? (int)(kext - kp) : W;", "kext - kp < W ? (int)(kext - kp) - 1 : W;", TC),
    "cuda_sgemm_tc_fast_path_past_k": ("cuda/sgemm_tc.cu", "whole_along", "- s * KD >= KD;", "- s * KD >= KD - 4;", TC),
    "cuda_sgemm_tc_tf32_swizzle_write_only": ("cuda/sgemm_tc.cu", "tf32_at", "pytfm__swz<4>(row, col / 4) * 4 + col % 4", "col", TC),
    "cuda_sgemm_tc_bf16_swizzle_write_only": ("cuda/sgemm_tc.cu", "round_slice", "pytfm__swz<L / 8>(row, col / 8) * 8 + col % 8;", "col;", TC),
    "cuda_sgemm_tc_tf32_swizzle_read_only": ("cuda/sgemm_tc.cu", "load_b", "TBK + pytfm__swz<4>(r,", "TBK + (", TC),
    "cuda_sgemm_tc_bf16_swizzle_read_only": ("cuda/sgemm_tc.cu", "load_a", "TBM + pytfm__swz<16>(p,", "TBM + (", TC),
    "cuda_sgemm_tc_stage_off_by_one": ("cuda/sgemm_tc.cu", "products_f32", "la.issue(As + s", "la.issue(As + (s + 1)", TC),
    "cuda_sgemm_tc_rounded_tile_off_by_one": ("cuda/sgemm_tc.cu", "products_f32", "BK>(acc, Fa + s", "BK>(acc, Fa + (s + 1)", TC),
    "cuda_sgemm_tc_tf32_no_cp_async_wait": ("cuda/sgemm_tc.cu", "products_f32",
                                            "pytfm__cp_async_wait<STAGES - 2>(); __syncthreads(); issue(s + STAGES - 1);",
                                            "__syncthreads();\nissue(s + STAGES - 1);", TC),
    "cuda_sgemm_tc_bf16_no_cp_async_wait": ("cuda/sgemm_tc.cu", "products_f32",
                                            "pytfm__cp_async_wait<STAGES - 2>(); __syncthreads(); if (s + 1 < slices) round_tile(s + 1);",
                                            "__syncthreads();\nif (s + 1 < slices) round_tile(s + 1);", TC),
    "cuda_sgemm_tc_cp_async_wait_one_late": ("cuda/sgemm_tc.cu", "products_f32",
                                             "pytfm__cp_async_wait<STAGES - 2>(); __syncthreads(); issue(s",
                                             "pytfm__cp_async_wait<STAGES - 1>(); __syncthreads(); issue(s", TC),
    "cuda_sgemm_tc_a_without_trans": ("cuda/sgemm_tc.cu", "load_a", "P == BF16 && !AK>(fa[i],", "false>(fa[i],", TC),
    "cuda_sgemm_tc_b_trans_always": ("cuda/sgemm_tc.cu", "load_b", "BF16 && !BK>(r4,", "BF16>(r4,", TC),
    # BF16 operands in memory: the copies' swizzle not the fragment loads', a chunk's k within
    # its row dropped, a transposed operand's second k step reading the first's rows, the
    # conversion flushing subnormals (the CPU's BF16, not cvt.rn's), 16-byte copies where rows
    # are not a multiple of 8 elements, the 2-byte loads dropping an edge's last element
    "cuda_gemm_bf16_copy_swizzle_write_only": ("cuda/sgemm_tc.cu", "TileLoad16::slot", "pytfm__swz<L / 8>(row, e % (L / 8))", "e % (L / 8)", TC16),
    "cuda_gemm_bf16_chunk_offset": ("cuda/sgemm_tc.cu", "Chunks::Chunks", "threadIdx.x % (L / W) * W;", "threadIdx.x % (L / W) * (W / 2);", TC16),
    "cuda_gemm_bf16_trans_a_k_step": ("cuda/sgemm_tc.cu", "load_a", "const int p = kk +", "const int p =", TC16),
    "cuda_gemm_bf16_conversion_flushes": ("cuda/sgemm_tc.cu", "to_bf16_kernel",
                                          "pytfm__bf16x2(x[2 * q],",
                                          "pytfm__bf16x2(fabsf(x[2 * q]) < 1.17549435e-38f ? 0.0f : x[2 * q],\nfabsf(x[2 * q + 1]) < 1.17549435e-38f ? 0.0f :", TC16),
    "cuda_gemm_bf16_wide_copies_on_odd_rows": ("cuda/sgemm_tc.cu", "tc_copy", "16) && ld % 8 == 0", "16)", TC16),
    "cuda_gemm_bf16_narrow_edge_short": ("cuda/sgemm_tc.cu", "TileLoad16::issue", "q++) d[q] = q <", "q++) d[q] = q + 1 <", TC16),
    "cuda_block_sum_no_barrier": ("cuda/pytfm_cuda.cuh", "pytfm__block_sum", "__syncthreads(); v =", "v =", EMU),
    "cuda_softmax_row_off_by_one": ("cuda/softmax.cu", "softmax_forward_kernel", "team.rank; j < cols;", "team.rank; j <= cols;", ROWS),
    "cuda_column_sum_no_barrier": ("cuda/pytfm_cuda.cuh", "pytfm__column_partials_kernel", "= s[k]; __syncthreads();", "= s[k];", EMU),
    "cuda_column_sum_early_return": ("cuda/pytfm_cuda.cuh", "pytfm__column_partials_kernel",
                                     "if (j < cols)", "if (j >= cols) return;\nif (j < cols)", EMU),
    "cuda_rope_pair_index": ("cuda/rope.cu", "rope_kernel", "units, bth = e", "units, bth = (e + 1)", EMU),
    "cuda_ce_count_ignores_ignore_index": ("cuda/cross_entropy.cu", "cross_entropy_count_kernel",
                                           "targets[i] != ignore_index;", "targets[i] != ignore_index || rows > 0;", EMU),
    "cuda_gelu_no_grid_stride": ("cuda/gelu.cu", "gelu_forward_kernel", "y[i] = pytfm__gelu(x[i]);", "y[i] = pytfm__gelu(x[i]), i = count;", EMU),
    "cuda_embedding_backward_assign": ("cuda/embedding.cu", "embedding_backward_plain_kernel",
                                       "dtable[id * dim + j] +=", "dtable[id * dim + j] =", EMU),
    "cuda_adamw_no_bias_correction": ("cuda/adamw.cu", "scalars_of", "(float)(lr / (1.0 - pow(beta1, (double)step)));", "(float)lr;", EMU),
    # per-output tolerances (tests/kernels/test_fast.py): the centred square expanded as
    # x² − 2xμ + μ² cancels when |μ| ≫ σ: rstd off by ~1e-4 at offset −100, which one tolerance
    # shared by all outputs (≈ 0.02 there) lets through
    "fast_ln_variance_expanded": ("csrc/kernels/fast_impl.h", "layernorm_forward",
                                  "(x[j + l] - x0 - d) * (x[j + l] - x0 -",
                                  "x[j + l] * x[j + l] - 2.0f * x[j + l] * (x0 + d) + (x0 + d) * (x0 +", FAST),
    # LayerNorm's fast mean summed without the shift by the row's first value: when |μ| ≫ σ the
    # float sum rounds away the digits x − μ needs (y off by 1e-3 relative at offset −20, σ 1e-3)
    "fast_ln_no_shift": ("csrc/kernels/fast_impl.h", "layernorm_forward", "float x0 = x[0];", "float x0 = 0.0f;", OPS),
    # linear's backward with one allocation per product, dx's first: it writes the caller's dx
    # and then fails on dW's larger scratch (tests/kernels/test_memory.py watches dx, dw, db)
    "linear_bwd_two_allocations": ("csrc/kernels/linear.c", "backward",
                                   "PYTFM_TRY(pytfm__sgemm_all(func, products, dx ? 2 :",
                                   "if (dx) PYTFM_TRY(pytfm__sgemm_all(func, products + 1, 1));\nPYTFM_TRY(pytfm__sgemm_all(func, products,", ["tests/kernels/test_memory.py"]),
    "cuda_ln_no_shift": ("cuda/layernorm.cu", "layernorm_forward_regs_kernel", "float x0 = xr[0];", "float x0 = 0.0f;", EMU),
    # e^x flushed to 0 below e^-17 instead of FLT_MIN: probabilities under 3e-8 vanish, under
    # fixed absolute tolerances such as 1e-7 (softmax) and 4.8e-7 (cross-entropy's gradient)
    "fast_exp_flushes_early": ("csrc/kernels/vecmath.h", "pytfm__expf", "lo = -86.98f,", "lo = -17.0f,", FAST),
    # the out-of-memory path (tests/kernels/test_memory.py): attention's forward writes through a NULL
    # workspace
    "attn_fast_no_alloc_check": ("csrc/kernels/attention.c", "forward_fast",
                                 "if (!ws) return PYTFM_STATUS_OUT_OF_MEMORY;", "", ["tests/kernels/test_memory.py"]),
    # model tests, each named with the test that must catch it: gradients 0.5–1% off (a finite-difference bound of
    # 2% of |g| lets them through), positions leaking into a model without any, a decode between forward and backward
    "nn_attn_backward_scale_off": ("pytfm/nn.py", "CausalSelfAttention.backward",
                                   "lse, causal=True, precision=self._precision(q))",
                                   "lse, causal=True, scale=1.005 / math.sqrt(self.hd),\nprecision=self._precision(q))", ["tests/model/test_model.py::test_model_gradients_match_finite_differences"]),
    "nn_mlp_grad_one_percent": ("pytfm/nn.py", "MLP.backward",
                                "return self.c_fc.backward(ops.gelu_backward(self.c_proj.backward(dy), h))",
                                "return self.c_fc.backward(ops.gelu_backward(1.01 * self.c_proj.backward(dy), h))", ["tests/model/test_model.py::test_model_gradients_match_finite_differences"]),
    "nn_none_leaks_positions": ("pytfm/nn.py", "GPT.__init__",
                                "cfg.d_model) if sinusoidal",
                                'cfg.d_model) * (1 if sinusoidal else 1e-3) if cfg.pos != "rope"', ["tests/model/test_model.py::test_without_positions_one_layer_cannot_see_the_order_of_what_came_before"]),
    "nn_decode_writes_saved": ("pytfm/nn.py", "Block.forward",
                               "= self.attn.forward(self.ln_1.forward(x, save),",
                               "= self.attn.forward(self.ln_1.forward(x),", ["tests/model/test_model.py::test_decoding_between_forward_and_backward_leaves_the_gradients_alone"]),
    # CUDA: the row max and Σexp of softmax's plain path (rows past 4096 columns)
    "cuda_row_max_not_shared": ("cuda/pytfm_cuda.cuh", "pytfm__row_max_sumexp", "max = team.max(max, scratch);", "", ROWS),
    # C core: the CUDA entry points of a CPU-only build (generated by cmake/cuda_stubs.cmake)
    "stub_wrong_status": ("cmake/cuda_stubs.cmake", None,
                          "pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,", "pytfm__fail(PYTFM_STATUS_INTERNAL,", ["tests/packaging/test_build.py"]),
    "stub_device_count_one": ("csrc/core/cuda_stub.c", "pytfm_cuda_device_count",
                              "*count = 0; return PYTFM_STATUS_OK;", "*count = 1;\nreturn PYTFM_STATUS_OK;", ["tests/packaging/test_build.py"]),
    # the QKV split, the flat buffers' optimizer step and clipping norm
    "qkv_split_v_from_k": ("csrc/kernels/rope.c", "pytfm_qkv_split_forward",
                           "{v, qkv + 2 * hd,", "{v, qkv + hd,", ["tests/kernels/test_qkv_split.py"]),
    "qkv_split_backward_same_sign": ("csrc/kernels/rope.c", "pytfm_qkv_split_backward",
                                     "pos_stride, base, -1.0);", "pos_stride, base, +1.0);", ["tests/kernels/test_qkv_split.py"]),
    "sum_squares_drops_last_block": ("csrc/kernels/adamw.c", "pytfm_sum_squares",
                                     "for (int64_t c = 0; c < blocks; c++) total",
                                     "for (int64_t c = 0; c + 1 < blocks; c++) total", ["tests/model/test_flat.py"]),
    "flat_adamw_decays_vectors": ("pytfm/optim.py", "step",
                                  "zip(self.spans, (self.weight_decay, 0.0)):",
                                  "zip(self.spans, (self.weight_decay, self.weight_decay)):", ["tests/model/test_flat.py"]),
    "epilogue_before_last_slice": ("csrc/kernels/sgemm.c", "rows_times_panel", "pc + kc == g->k", "pc == 0", ["tests/kernels/test_linear_fused.py"]),
    "epilogue_skips_last_row": ("csrc/kernels/sgemm.c", "pytfm__product_finish",
                                "(int64_t r = 0; r <", "(int64_t r = 0; r + 1 <", ["tests/kernels/test_linear_fused.py"]),
    # sizes: an element count multiplied unchecked (m·n = 2^64 wraps to 0), the bound
    # one past PTRDIFF_MAX bytes, start + n_new and RoPE's pos extent unchecked
    "size_product_unchecked": ("csrc/core/checks.h", "pytfm__check_count",
                               "if (pytfm__mul_within(c, sizes[i], limit, &c))", "c *= sizes[i];", LIMITS),
    "size_bound_one_past": ("csrc/core/internal.h", "pytfm__mul_within", "b > limit / a)", "b > limit / a + 1)", LIMITS),
    "cache_end_wraps": ("csrc/core/checks.h", "pytfm__check_cache_positions",
                        "PYTFM_CHECK(pytfm__add_within(start, n_new, INT64_MAX, &end),", "end = start + n_new;\nPYTFM_CHECK(1,", LIMITS),
    "rope_pos_stride_unchecked": ("csrc/core/checks.h", "pytfm__check_positions",
                                  "PYTFM_CHECK(pytfm__mul_within(B - 1, pos_stride, limit, n_pos)",
                                  "PYTFM_CHECK((*n_pos = (B - 1) * pos_stride, 1)", LIMITS),
    # overlaps: an accumulator not counted as an output, overlaps seen in one direction
    # only, a partial overlap let through where the exact in-place form is allowed
    "linear_dw_may_alias": ("csrc/core/checks.h", "pytfm__check_linear_backward",
                            "PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE,", "PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE,", EXTREMES),
    "layernorm_dw_may_alias": ("csrc/core/checks.h", "pytfm__check_layernorm_backward",
                               "PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE,", "PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE,", EXTREMES),
    "embedding_dtable_may_alias": ("csrc/core/checks.h", "pytfm__check_embedding_backward",
                                   "PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE,", "PYTFM_CHECK_DISJOINT(func, 0, PYTFM_NO_INPLACE,", EXTREMES),
    "adamw_may_alias": ("csrc/core/checks.h", "pytfm__check_adamw",
                        "PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE,",
                        "PYTFM_CHECK_DISJOINT(func, 0, PYTFM_NO_INPLACE,", ["tests/kernels/test_errors.py", "tests/kernels/test_extremes.py"]),
    "overlap_one_direction": ("csrc/core/internal.h", "pytfm__overlap", "b0 + (uint64_t)b.bytes", "= b0", EXTREMES),
    "inplace_partial_allowed": ("csrc/core/checks.h", "pytfm__check_disjoint",
                                "&& spans[i].p == spans[j].p && spans[i].bytes == spans[j].bytes)", ")", EXTREMES),
    # threads: no clamp, another clamp than documented, attention's region re-reading
    # the count its workspaces were not sized for
    "threads_unclamped": ("csrc/core/status.c", "pytfm_get_num_threads", "> most ? most : threads;", ";", THREADS),
    "threads_clamp_per_core": ("csrc/core/status.c", None, "PYTFM_THREADS_PER_CORE = 4", "PYTFM_THREADS_PER_CORE = 8", THREADS),
    "attn_workspace_count_reread": ("csrc/kernels/attention.c", "forward_fast",
                                    "PYTFM_PARALLEL_FOR_THREADS(threads) for (int64_t bh", "PYTFM_PARALLEL_FOR\nfor (int64_t bh", THREADS),
    "sgemm_team_count_reread": ("csrc/kernels/sgemm.c", "gemm_blocked",
                                "num_threads(pytfm__team_within(bl->threads)) if (bl->threads > 1)", "num_threads(pytfm_get_num_threads())", THREADS),
    # float extremes
    "fast_exp_saturates": ("csrc/kernels/vecmath.h", "pytfm__expf", "-86.98f, hi = 89.0f;", "-86.98f, hi = 88.37f;", EXTREMES),
    # 2^n directly instead of 2^(n-1)·2: overflows to inf for x just below log(FLT_MAX)
    "fast_exp_no_doubling": ("csrc/kernels/vecmath.h", "pytfm__expf",
                             "+ r, PYTFM_FMA(r, p, 1.0f), 2.0f); uint32_t bits; memcpy(&bits, &t, sizeof bits); bits = (bits << 23) + (126u",
                             ", PYTFM_FMA(r, p, 1.0f), 1.0f);\nuint32_t bits;\nmemcpy(&bits, &t, sizeof bits);\nbits = (bits << 23) + (127u", EXTREMES),
    "gelu_term_unclamped": ("csrc/core/internal.h", "PYTFM_GELU_TERM_V",
                            "((v) > 16.0f && (v) <= FLT_MAX ? 16.0f : (v) < -16.0f && (v) >= -FLT_MAX ? -16.0f : (v))", "(v)", EXTREMES),
    "gelu_term_clamped_early": ("csrc/core/internal.h", "PYTFM_GELU_TERM_V",
                                "16.0f && (v) <= FLT_MAX ? 16.0f", "4.0f && (v) <= FLT_MAX ? 4.0f", EXTREMES),
    "gelu_inf_clamped_too": ("csrc/core/internal.h", "PYTFM_GELU_TERM_V", "&& (v) <= FLT_MAX", "", EXTREMES),
    "fast_ln_no_fallback": ("csrc/kernels/fast_impl.h", "layernorm_forward", "(!PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps))", "(0)", EXTREMES),
    "ln_fallback_ignores_underflow": ("csrc/core/internal.h", "PYTFM_LN_FLOAT_SUMS_OK", "&& (ss) / (float)(cols) + (eps) >= 1e-30f)", ")", EXTREMES),
    "cuda_ln_no_fallback": ("cuda/layernorm.cu", "layernorm_forward_regs_kernel", "(!PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps))", "(0)", EXTREMES),
    "reference_gelu_cancels": ("pytfm/reference.py", "_gelu_halves",
                               "np.where(u < 0, e / (1.0 + e), 0.5 * (1.0 + t)),", "0.5 * (1.0 + t),", EXTREMES),
    # the default thread count, checkpoints and the example scripts' flags
    "threads_default_ignores_neighbours": ("csrc/core/free_cores.c", "pytfm__default_threads",
                                           "return PYTFM_MIN(omp_get_max_threads(), atomic_load(&free_cores));",
                                           "return omp_get_max_threads();", ["tests/kernels/test_busy.py"]),
    "free_cores_counts_own_threads": ("csrc/core/free_cores.c", "sample", "machine - own;", "machine;", ["tests/kernels/test_busy.py"]),
    "last_error_shared": ("csrc/core/status.c", None, "static _Thread_local char", "static char", ["tests/kernels/test_threads.py"]),
    "ckpt_offsets_may_overlap": ("csrc/model/safetensors.c", "check_layout", "if (e->begin !=", "if (e->begin >", ["tests/model/test_checkpoint.py"]),
    "tiny_no_write_probe": ("pytfm/cli/train.py", "check_out",
                            'fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=out) os.close(fd) os.unlink(probe)',
                            "pass", ["tests/model/test_cli.py"]),
    # the CUDA twins of the QKV split, the linear layer + GELU and the sum of squares
    "cuda_qkv_v_from_k": ("cuda/rope.cu", "rope_kernel", "*v_in = parts.in[2]", "*v_in = parts.in[1]", EMU),
    "cuda_qkv_backward_same_sign": ("cuda/rope.cu", "pytfm_qkv_split_backward_cuda", "base, rope, -1.0,", "base, rope, +1.0,", EMU),
    "cuda_qkv_pos_index_swapped": ("cuda/rope.cu", "rope_table_kernel", "/ T * pos_stride + r %", "% T * pos_stride + r /", EMU),
    "cuda_qkv_copy_skips_v": ("cuda/rope.cu", "qkv_copy_kernel", "(int p = 0; p < 3;", "(int p = 0; p < 2;", EMU),
    "cuda_linear_gelu_outputs_swapped": ("cuda/linear.cu", "bias_gelu_kernel", "h[e] = v; } y[e]", "y[e] = v;\n}\nh[e]", EMU),
    "cuda_linear_gelu_h_without_bias": ("cuda/linear.cu", "bias_gelu_kernel", "v += b[e % out]; h[e] = v;", "v += b[e % out];", EMU),
    "cuda_sum_squares_drops_last_partial": ("cuda/adamw.cu", "sum_partials_kernel", "threadIdx.x; i <", "threadIdx.x; i + 1 <", EMU),
    "cuda_sum_squares_no_grid_stride": ("cuda/adamw.cu", "sum_squares_kernel", "(int64_t)gridDim.x * blockDim.x)", "count)", EMU),
    # the GPU attention (cuda/attention.cu), run by tests/cuda/test_cuda_attention.py on the emulator
    "cuda_attn_no_barrier_before_pv": ("cuda/attention.cu", "attention_forward_kernel",
                                       "__syncthreads(); // P is whole", "", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_causal_bound": ("cuda/attention.cu", "attention_forward_kernel",
                               "(a.causal && j0 + c > pos) ||", "(a.causal && j0 + c > pos + 1) ||", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_no_rescale": ("cuda/attention.cu", "attention_forward_kernel",
                             "acc[i][d] *= alpha;", "acc[i][d] *= 1.0f;", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_dq_skips_first_tile": ("cuda/attention.cu", "attention_dq_kernel",
                                      "(int64_t j0 = first_key(a.window, i0);", "(int64_t j0 = first_key(a.window, i0) + BK;", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_dkdv_wrong_delta": ("cuda/attention.cu", "attention_dkdv_kernel", "delta[i0 + t]", "delta[i0]", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_window_bound": ("cuda/attention.cu", "attention_forward_kernel",
                               "j0 + c <= pos - a.window)))", "j0 + c < pos - a.window)))", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_dkdv_one_head": ("cuda/attention.cu", "attention_dkdv_kernel",
                                "for (int64_t h = g * G; h < (g + 1) * G; h++)", "for (int64_t h = g * G; h < g * G + 1; h++)",
                                ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_merge_unweighted": ("cuda/attention.cu", "attention_merge_kernel",
                                   "acc += w * po[s", "acc += po[s", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_vector_load_unaligned": ("cuda/attention.cu", "attention_forward_kernel",
                                        "vec && pytfm__aligned4(a.v);", "vec;", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_no_shared_optin": ("cuda/pytfm_cuda.cuh", "pytfm__allow_shared", "if (bytes <= 48 * 1024)", "", ["tests/cuda/test_cuda_attention.py"]),
    # attention on the tensor cores (cuda/attention_tc.cu), by tests/cuda/test_cuda_tc_attention.py:
    # P re-packed from the accumulator layout into the A layout the plain way (TF32: columns 2t,
    # 2t + 1 where the mma reads t, t + 4; BF16: the two key fragments' halves crossed), the
    # online softmax without the accumulator's rescale, the causal diagonal tile taken as whole,
    # the dK/dV walk starting a tile past the diagonal, the first tiles read before every warp
    # stored its part, V fed to the mma without its rounding (TF32: the hardware truncates) and
    # the BF16 tiles truncated, not rounded, as they are stored; each single-buffer pass's
    # barrier before a tile is stored over (forward K/V, the dK/dV pass's query tile, dQ's key
    # tile: D = 128) and each double-buffered pass's one barrier a tile (D <= 64), caught in the
    # emulator's order 2, where a warp runs a whole tile ahead of the others; the prefetched
    # tile stored into the buffer being read; the swizzle left out of the BF16 tiles' stores
    # only or of their ldmatrix reads only; ldmatrix without .trans for the P·V-shaped B
    # fragments; a ragged tile's loads reading the row past T
    "cuda_tc_attn_no_barrier_before_kv_store": ("cuda/attention_tc.cu", "tc_forward_kernel",
                                                "__syncthreads(); // one buffer: every warp is done with this tile's K and V", "", TC_ATT),
    "cuda_tc_attn_no_barrier_before_query_store": ("cuda/attention_tc.cu", "tc_dkdv_kernel",
                                                   "__syncthreads(); // one buffer: every warp is done with this query tile", "", TC_ATT),
    "cuda_tc_attn_no_barrier_before_key_store": ("cuda/attention_tc.cu", "tc_dq_kernel",
                                                 "__syncthreads(); // one buffer: every warp is done with this key tile", "", TC_ATT),
    # grouped-query heads and the window on the tensor cores: dK/dV of a group's first head only,
    # a key seen one query row past its window
    "cuda_tc_attn_dkdv_one_head": ("cuda/attention_tc.cu", "tc_dkdv_kernel", "GROUPED ? hn < G :", "GROUPED ? hn < 1 :", TC_ATT),
    "cuda_tc_attn_window_bound": ("cuda/attention_tc.cu", "tc_dkdv_kernel", "- 8 * (e >> 1) < hi) continue;", "- 8 * (e >> 1) <= hi) continue;", TC_ATT),
    "cuda_tc_attn_tf32_p_repack": ("cuda/attention_tc.cu", "tc_accumulate",
                                   "pytfm__tf32(s[j][2]), pytfm__tf32(s[j][1]),", "pytfm__tf32(s[j][1]), pytfm__tf32(s[j][2]),", TC_ATT),
    "cuda_tc_attn_bf16_p_repack": ("cuda/attention_tc.cu", "tc_pack_bf16",
                                   "pa[c][1] = pytfm__bf16x2(s[2 * c][2], s[2 * c][3]); pa[c][2] = pytfm__bf16x2(s[2 * c + 1][0], s[2 * c + 1][1]);",
                                   "pa[c][1] = pytfm__bf16x2(s[2 * c + 1][0], s[2 * c + 1][1]); pa[c][2] = pytfm__bf16x2(s[2 * c][2], s[2 * c][3]);", TC_ATT),
    "cuda_tc_attn_no_rescale": ("cuda/attention_tc.cu", "tc_forward_kernel",
                                "acc[n][0] *= alpha[0]; acc[n][1] *= alpha[0]; acc[n][2] *= alpha[1]; acc[n][3] *= alpha[1];", "", TC_ATT),
    "cuda_tc_attn_causal_tile_off_by_one": ("cuda/attention_tc.cu", "tc_forward_kernel", "+ TC_KEYS - 1", "", TC_ATT),
    "cuda_tc_attn_dkdv_skips_diagonal": ("cuda/attention_tc.cu", "tc_dkdv_kernel", "a.causal ? (int)j0 :", "a.causal ? (int)j0 + TC_KEYS :", TC_ATT),
    "cuda_tc_attn_no_barrier_after_load": ("cuda/attention_tc.cu", "tc_forward_kernel",
                                           "__syncthreads(); // Q and the first K and V tiles are whole", "", TC_ATT),
    "cuda_tc_attn_tf32_v_truncated": ("cuda/attention_tc.cu", "tc_accumulate",
                                      "const uint32_t b[2] = {pytfm__tf32(x0[8 * n + g]), pytfm__tf32(x1[8 * n + g])};",
                                      "uint32_t b[2];\nmemcpy(&b[0], &x0[8 * n + g], 4);\nmemcpy(&b[1], &x1[8 * n + g], 4);", TC_ATT),
    "cuda_tc_attn_bf16_tile_truncated": ("cuda/attention_tc.cu", "put",
                                         "pytfm__store2(tile + half / 2, pytfm__bf16x2(v.x, v.y), pytfm__bf16x2(v.z, v.w));",
                                         "uint32_t w[4];\nmemcpy(w, &v, sizeof w);\npytfm__store2(tile + half / 2, (w[0] >> 16) | (w[1] & 0xffff0000u), (w[2] >> 16) | (w[3] & 0xffff0000u));", TC_ATT),
    "cuda_tc_attn_no_barrier_fwd_buffer_swap": ("cuda/attention_tc.cu", "tc_forward_kernel",
                                                "stored over them) __syncthreads();", "stored over them)", TC_ATT),
    "cuda_tc_attn_no_barrier_dkdv_buffer_swap": ("cuda/attention_tc.cu", "tc_dkdv_kernel",
                                                 "after next is stored over it) __syncthreads();", "after next is stored over it)", TC_ATT),
    "cuda_tc_attn_no_barrier_dq_buffer_swap": ("cuda/attention_tc.cu", "tc_dq_kernel",
                                               "after next is stored over it) __syncthreads();", "after next is stored over it)", TC_ATT),
    "cuda_tc_attn_prefetch_into_read_buffer": ("cuda/attention_tc.cu", "tc_forward_kernel",
                                               "Buffers<PF>::next(buf) * W); vx.store(Vs + Buffers<PF>::next(buf)",
                                               "buf * W);\nvx.store(Vs + buf", TC_ATT),
    "cuda_tc_attn_swizzle_on_store_only": ("cuda/attention_tc.cu", "put", "pytfm__swz<D / 8>(r, d / 8)", "d / 8", TC_ATT),
    "cuda_tc_attn_swizzle_on_read_only": ("cuda/attention_tc.cu", "tc_chunk", "pytfm__swz<D / 8>(r, c)", "c", TC_ATT),
    "cuda_tc_attn_v_without_trans": ("cuda/attention_tc.cu", "tc_accumulate_bf16",
                                     "pytfm__ldmatrix<4, true>(r4, tc_chunk<D>(X,", "pytfm__ldmatrix<4, false>(r4, tc_chunk<D>(X,", TC_ATT),
    # the delta pass both backward passes share (cuda/attention.cu), its dy not rounded to the
    # tensor-core precision: delta then is not Σ_s P_ts dP_ts of the rounded products
    "cuda_tc_attn_delta_unrounded": ("cuda/attention.cu", "delta_round", "if (PREC == PYTFM_PRECISION_FP32)", "", TC_ATT),
    "cuda_tc_attn_ragged_reads_past_T": ("cuda/attention_tc.cu", "fetch", "if (r >= n) return", "if (r > n) return", TC_ATT),
    # the fast CUDA SGEMM (cuda/sgemm.cu), run by tests/cuda/test_cuda_sgemm.py on the
    # emulator: a slice read before its cp.async wait, the next slice written into the buffer
    # others still read, edges (the k-slice past k loaded; C's row m stored), float4s on an
    # operand offset by a float, the staged loader's chunks mapped one way and stored another
    "cuda_sgemm_fast_no_cp_async_wait": ("cuda/sgemm.cu", "sgemm_fast_kernel",
                                         "pytfm__cp_async_wait<0>(); __syncthreads(); //", "__syncthreads(); //", SGEMM),
    "cuda_sgemm_fast_no_barrier_between_buffers": ("cuda/sgemm.cu", "sgemm_fast_kernel",
                                                   "__syncthreads(); // the next slice is in for everyone, and buffer cur free again", "", SGEMM),
    "cuda_sgemm_fast_k_edge_off_by_one": ("cuda/sgemm.cu", "issue", "in = p0 + p < k;", "in = p0 + p <= k;", SGEMM),
    "cuda_sgemm_fast_row_mask_off_by_one": ("cuda/sgemm.cu", "sgemm_fast_kernel", "if (di >= rows_in)", "if (di > rows_in)", SGEMM),
    "cuda_sgemm_fast_unaligned_a_vectorised": ("cuda/sgemm.cu", "launch_fast", "= (aligned16(a) &&", "= (", SGEMM),
    "cuda_sgemm_fast_staged_transpose_index": ("cuda/sgemm.cu", "Staged::start", "= e / C, p = e % C", "= e % X, p = e / X", SGEMM),
    # rows in registers (a column class per row length), float4 where aligned, the
    # LayerNorm backward's dw/db partials in the same pass, the column sums in two stages
    "cuda_rows_edge_mask": ("cuda/pytfm_cuda.cuh", "pytfm__row_load", "v[k] = j < cols ?", "v[k] = j < cols && k + 1 < N ?", ROWS),
    "cuda_rows_vector_unaligned_w": ("cuda/layernorm.cu", "pytfm_layernorm_backward_cuda", "dx, dy, x, w);", "dx, dy, x);", ROWS),
    "cuda_rows_stage2_skips_last_chunk": ("cuda/pytfm_cuda.cuh", "pytfm__column_total_kernel",
                                          "(int64_t c = 0; c <", "(int64_t c = 0; c + 1 <", ROWS),
    "cuda_rows_block_sum2_no_barrier": ("cuda/pytfm_cuda.cuh", "pytfm__team_sum2", "__syncthreads(); const bool", "const bool", ROWS),
    "cuda_rows_ln_dw_without_xhat": ("cuda/layernorm.cu", "layernorm_backward_regs_kernel", "dw_sum[k] += g[k] * xh[k];", "dw_sum[k] += g[k];", ROWS),
    "cuda_rows_ln_warp_sums_no_barrier": ("cuda/layernorm.cu", "layernorm_backward_regs_kernel", "__syncthreads(); } } else {", "} } else {", ROWS),
    # the memory-bound kernels at speed (cuda/cross_entropy.cu, embedding.cu, rope.cu,
    # gelu.cu): the online max/sum, the float4 paths and their alignment, the sorted embedding
    # backward, RoPE's table of angles
    "cuda_ce_online_no_rescale": ("cuda/cross_entropy.cu", "raise", "sum *= expf(max - m);", "", EMU),
    "cuda_ce_merge_unscaled": ("cuda/cross_entropy.cu", "merge",
                               "max == m ? 1.0f : expf(max - m), b = o.max == m ? 1.0f : expf(o.max - m);", "1.0f, b = 1.0f;", EMU),
    "cuda_ce_block_merge_skips_warps": ("cuda/cross_entropy.cu", "ce_team_merge", "blockDim.x / PYTFM_WARP;", "2;", EMU),
    "cuda_ce_vector_unaligned": ("cuda/cross_entropy.cu", "ce_head", "15u)) & 15u) / 4", "15u)) & 15u) / 8", EMU),
    "cuda_ce_backward_other_offset": ("cuda/cross_entropy.cu", "cross_entropy_backward_kernel",
                                      "(((uintptr_t)logits ^ (uintptr_t)dlogits) & 15u) == 0;", "true;", EMU),
    "cuda_ce_tail_dropped": ("cuda/cross_entropy.cu", "ce_row_online",
                             "j < cols; j += team.size) { acc.add(row[j]);", "j < cols; j += team.size) {", EMU),
    "cuda_ce_smoothed_sum_for_mean": ("cuda/cross_entropy.cu", "cross_entropy_lse_kernel",
                                      "mean[r] = total / (double)vocab;", "mean[r] = total;", EMU),
    "cuda_ce_smoothed_uniform_unscaled": ("cuda/cross_entropy.cu", "cross_entropy_backward_kernel",
                                          "scale * label_smoothing / (float)vocab", "scale * label_smoothing", EMU),
    "cuda_embedding_sort_unstable": ("cuda/embedding.cu", "embedding_sort_tiles_kernel", "if ((a > b) ==", "if (((a >> 32) > (b >> 32)) ==", EMU),
    "cuda_embedding_group_boundary_off_by_one": ("cuda/embedding.cu", "embedding_accumulate_kernel",
                                                 "if (k > 0 && key_id(keys[k", "if (k > 1 && key_id(keys[k", EMU),
    "cuda_embedding_group_stops_early": ("cuda/embedding.cu", "embedding_accumulate_kernel", "if (key_id(kk[GROUP_UNROLL - 1]) != id)", "", EMU),
    "cuda_embedding_last_merge_skipped": ("cuda/embedding.cu", "embedding_backward_sorted",
                                          "PYTFM_STATUS_OK && width", "PYTFM_STATUS_OK && 2 * width", EMU),
    "cuda_embedding_vector_unaligned": ("cuda/embedding.cu", "embedding_vec",
                                        "15u) == 0 && ((uintptr_t)b & 15u)", "3u) == 0 && ((uintptr_t)b & 3u)", EMU),
    "cuda_rope_table_wrong_row": ("cuda/rope.cu", "rope_kernel", "(per_batch ? bt :", "(per_batch ? bt % T :", EMU),
    "cuda_rope_table_pair_index": ("cuda/rope.cu", "rope_table_kernel", "e / half, i = e", "e / half, i = (e + 1)", EMU),
    "cuda_rope_vector_unaligned": ("cuda/rope.cu", "rotate_parts", "&& parts_aligned(parts) &&", "&&", EMU),
    "cuda_gelu_vector_past_end": ("cuda/gelu.cu", "gelu_forward_kernel",
                                  "count / 4 : 0; // float4s; the rest one by one", "(count + 3) / 4 : 0;", EMU),
    "cuda_gelu_vector_unaligned": ("cuda/gelu.cu", "pytfm_gelu_backward_cuda", "(uintptr_t)dy | (uintptr_t)x)", "(uintptr_t)x)", EMU),
    "rmsnorm_no_mean": ("csrc/kernels/rmsnorm.c", "pytfm__rmsnorm_forward_row", "sqrt(ss / (double)cols + eps)", "sqrt(ss + eps)", OPS),
    "rope_freq_backward_same_sign": ("csrc/kernels/rope_half.c", "pytfm_rope_freq_backward", "pos_stride, -1.0f);", "pos_stride, 1.0f);", OPS),
    "swiglu_backward_no_gate_term": ("csrc/kernels/swiglu.c", "backward_plain", "(1.0f + g[i] * (1.0f - s))", "1.0f", OPS),
}


# ---- where a mutation lands ------------------------------------------------------------------
# An entry names a scope and a short text in it, not a line: the scope is found by name wherever
# it moved, and the text is matched whatever its spacing and line breaks (each run of whitespace
# in it matches any, or none), so a refactor breaks an entry only when it changes the scope's name
# or the few tokens of the text itself. A text must occur exactly once in its scope.

_C_SKIPPED = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_C_AFTER_PARAMS = re.compile(r"(?:\s|const\b|noexcept\b|override\b|->\s*[\w:<>*& ]+)*")


class Stale(Exception):
    """An entry that no longer finds its scope or its text."""


def _matching(code, i):
    """The index just past the bracket that closes the one at code[i]."""
    pairs = {"(": ")", "{": "}"}
    depth = 0
    for j in range(i, len(code)):
        if code[j] == code[i]:
            depth += 1
        elif code[j] == pairs[code[i]]:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def _c_scopes(code, name, lo, hi):
    """Spans of code[lo:hi] (comments and literals blanked) that define `name`: a function (C,
    C++, CUDA; with its body), a struct, class or union, or a #define (with its continuations)."""
    n = re.escape(name)
    spans = []
    for m in re.compile(r"^[ \t]*#[ \t]*define[ \t]+" + n + r"\b(?:\\\n|[^\n])*", re.M).finditer(
            code, lo, hi):
        spans.append((m.start(), m.end()))
    for m in re.compile(r"\b(?:struct|class|union)\s+" + n + r"\b[^;{()]*\{").finditer(code, lo, hi):
        spans.append((m.start(), _matching(code, m.end() - 1)))
    for m in re.compile(r"(?<![\w.>])" + n + r"\s*\(").finditer(code, lo, hi):
        body = _C_AFTER_PARAMS.match(code, _matching(code, m.end() - 1)).end()
        if body < hi and code[body] == "{":  # a definition, not a call or a declaration
            spans.append((m.start(), _matching(code, body)))
    return spans


def _py_scopes(text, name, lo, hi):
    """Spans of text[lo:hi] that define `name` (def or class), each to its last indented line."""
    spans = []
    head = re.compile(r"^([ \t]*)(?:async[ \t]+)?(?:def|class)[ \t]+" + re.escape(name) + r"\b", re.M)
    for m in head.finditer(text, lo, hi):
        end = m.end()
        for line in re.compile(r"^([ \t]*)(\S)", re.M).finditer(text, text.find("\n", end) + 1, hi):
            if len(line.group(1)) <= len(m.group(1)) and line.group(2) not in ")]}":
                end = line.start()
                break
        else:
            end = hi
        spans.append((m.start(), end))
    return spans


def scopes(path, text, where):
    """The spans of `text` (the file at path) that `where` names: None, the whole file; a
    function, macro, struct or class name (Python: def or class); "A::b" (C) or "A.b" (Python):
    b inside A."""
    if where is None:
        return [(0, len(text))]
    python = path.endswith(".py")
    code = text if python else _C_SKIPPED.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    spans = [(0, len(text))]
    for name in where.split("." if python else "::"):
        spans = [s for lo, hi in spans
                 for s in (_py_scopes if python else _c_scopes)(code, name, lo, hi)]
    return spans


def plant(path, text, where, old, new):
    """text (the file at path) with `old`, found once in `where`, replaced by `new`; Stale when
    `where` is not in the file or `old` is not once in it."""
    spans = scopes(path, text, where)
    if not spans:
        raise Stale(f"{path} has no {where}")
    found = re.compile(r"\s*".join(map(re.escape, old.split())))
    hits = [m for lo, hi in spans for m in found.finditer(text, lo, hi)]
    if len(hits) != 1:
        raise Stale(f"{old!r} occurs {len(hits)} times in {where or path}, not once")
    return text[:hits[0].start()] + new + text[hits[0].end():]


def unpack_and_build(tree, mutation=None):
    """HEAD's tree in `tree`, with the mutation (a MUTATIONS entry) planted when given, built in
    place. -> None, or what went wrong."""
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", "HEAD"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    if mutation is not None:
        path, where, old, new, _ = mutation
        src = os.path.join(tree, path)
        with open(src, encoding="utf-8") as f:
            text = f.read()
        try:
            text = plant(path, text, where, old, new)
        except Stale as e:
            return f"STALE ({e}: update dev/mutate.py)"
        with open(src, "w", encoding="utf-8") as f:
            f.write(text)
    # PYTFM_CUDA=0: the CUDA mutations are caught by the emulator tests, which compile cuda/
    # themselves; nvcc would only add minutes to every build
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                           capture_output=True, text=True, env=dict(os.environ, PYTFM_CUDA="0"))
    return "BUILD FAILED: " + build.stderr[-300:] if build.returncode else None


def pytest(tree, *args):
    env = dict(os.environ, HYPOTHESIS_PROFILE="ci", PYTHONPATH=tree)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=tree, capture_output=True, text=True, env=env)


class Baseline:
    """The unmutated tree, built once when first needed: a test that fails there too (one that
    needs pytfm pip-installed, say, which these in-place trees are not) catches nothing."""

    def __init__(self, workdir):
        self.tree, self.verdicts = os.path.join(workdir, "_baseline"), {}

    def fails(self, test):
        if test not in self.verdicts:
            if not os.path.isdir(self.tree):
                problem = unpack_and_build(self.tree)
                if problem:
                    sys.exit(f"the unmutated tree does not build: {problem}")
            self.verdicts[test] = pytest(self.tree, test).returncode != 0
        return self.verdicts[test]


def run(name, workdir, baseline):
    tests = MUTATIONS[name][-1]
    tree = os.path.join(workdir, name)
    problem = unpack_and_build(tree, MUTATIONS[name])
    if problem:
        return problem
    left_out = []
    while True:
        r = pytest(tree, "-x", *tests, *(f"--deselect={t}" for t in left_out))
        lines = r.stdout.splitlines()
        failed = [line.split(" - ")[0][7:] for line in lines if line.startswith("FAILED")]
        errors = [line.split(" - ")[0][6:] for line in lines if line.startswith("ERROR")]
        already = [t for t in failed if baseline.fails(t)]
        if not already:
            break
        left_out += already
    note = f" (left out, failing without the mutation too: {', '.join(left_out)})" if left_out else ""
    if r.returncode and not failed and errors:  # a fixture broke (e.g. a -Werror build): no test ran
        return f"ERRORED, not caught: {', '.join(errors)}{note}"
    return (f"caught by {', '.join(failed) or 'a crash'}" if r.returncode else "SURVIVED") + note


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="mutations to run (default: all)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        print("\n".join(MUTATIONS))
        return 0
    unknown = set(args.names) - set(MUTATIONS)
    if unknown:
        sys.exit(f"unknown mutations: {sorted(unknown)}; see --list")
    survived = 0
    with tempfile.TemporaryDirectory() as workdir:
        baseline = Baseline(workdir)
        for name in args.names or MUTATIONS:
            verdict = run(name, workdir, baseline)
            survived += not verdict.startswith("caught")
            print(f"{name:28s} {verdict}", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
