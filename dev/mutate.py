"""Plant known bugs in the kernels, one at a time, and check that the test suite catches each.

    python dev/mutate.py                      # every mutation below
    python dev/mutate.py softmax_no_max ...   # some of them
    python dev/mutate.py --list

Each mutation is applied to a fresh copy of the committed tree (git archive HEAD), which is
built in place (setup.py build_ext --inplace: needs setuptools, cffi and cmake, as any build
does) and tested with the named test files under the derandomised `ci` hypothesis profile. A mutation the
tests do not catch is a hole in the tests. The build is CPU-only (PYTFM_CUDA=0): the cuda_*
mutations are caught by tests/cuda/test_cuda_emu.py, which runs the CUDA kernels on the
emulator. Most of the kernels' checks iterate tests/ops_registry.py: the files named here are
where those iterations run. Exit status 1 if any mutation survives.
"""

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (file, text to find, replacement, test files that must catch it)
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
    "softmax_no_max": ("csrc/kernels/softmax.c", "yr[j] = expf(xr[j] - max);", "yr[j] = expf(xr[j]);", OPS),
    "layernorm_dx_no_rstd": ("csrc/kernels/layernorm.c", "dxr[j] = rs * (dyr[j]", "dxr[j] = (dyr[j]", OPS),
    "layernorm_unbiased_var": ("csrc/kernels/layernorm.c", "ss / (double)cols + eps",
                               "ss / (double)(cols > 1 ? cols - 1 : 1) + eps", OPS),
    "linear_dw_written": ("csrc/kernels/linear.c", "{dw, dy, x, out, in, rows, 1, 0, 1.0f, NULL, precision},",
                          "{dw, dy, x, out, in, rows, 1, 0, 0.0f, NULL, precision},", OPS),
    "rope_backward_same_sign": ("csrc/kernels/rope.c", "base, -1.0);", "base, +1.0);", OPS),
    "gelu_backward_missing_term": ("csrc/kernels/gelu.c", " + 2.0f * vt * s * (1.0f - s) * du", "", OPS),
    "embedding_backward_assign": ("csrc/kernels/embedding.c", "row[j] += g[j];", "row[j] = g[j];", OPS),
    "ce_no_onehot": ("csrc/kernels/cross_entropy.c", "drow[targets[i]] -= scale;", "", OPS),
    "adamw_no_bias_correction": ("csrc/kernels/adamw.c", "(float)(lr / (1.0 - pow(beta1, (double)step)))",
                                 "(float)lr", OPS),
    "sgemm_avx512_skips_last_p": ("csrc/kernels/sgemm.c", "p < kc; p++, a += a_sp, b += ldb) {\n        const __m512 b0",
                                  "p + 1 < kc; p++, a += a_sp, b += ldb) {\n        const __m512 b0",
                                  ["tests/kernels/test_sgemm.py"]),
    "sgemm_avx2_edge_store_too_wide": ("csrc/kernels/sgemm.c", "_mm256_maskstore_ps(cr + 8, m1, acc##r##1);",
                                       "_mm256_maskstore_ps(cr + 8, m0, acc##r##1);", ["tests/kernels/test_sgemm.py"]),
    "sgemm_slices_overwrite": ("csrc/kernels/sgemm.c", "const float bt = pc == 0 ? g->beta : 1.0f;",
                               "const float bt = g->beta;", ["tests/kernels/test_sgemm.py"]),
    "sgemm_avx512_mask_one_wide": ("csrc/kernels/sgemm.c", "(__mmask16)((1u << (cols - 16)) - 1)",
                                   "(__mmask16)((1u << (cols - 15)) - 1)", ["tests/kernels/test_sgemm.py"]),
    "fast_ln_partials_per_thread": ("csrc/kernels/layernorm.c", "const int64_t chunks = PYTFM_MIN(rows, (int64_t)LN_CHUNKS);",
                                    "const int64_t chunks = PYTFM_MIN(rows, (int64_t)pytfm_get_num_threads());", FAST),
    "fast_exp_coefficient": ("csrc/kernels/vecmath.h", "p = PYTFM_FMA(p, r, 1.6666665459e-1f);",
                             "p = PYTFM_FMA(p, r, 1.6e-1f);", FAST),
    "fast_softmax_tail_dropped": ("csrc/kernels/fast_impl.h", "for (; j < cols; j++) tail += dy[j] * y[j];", "", FAST),
    # a rescale happens past the forward's 256-key tile: test_attention_across_the_key_tiles
    "attn_fast_no_rescale": ("csrc/kernels/attention.c", "if (alpha != 1.0f)", "if (0)", ATT),
    "attn_fast_dq_overwrites": ("csrc/kernels/attention.c", "k + j0 * HD, HD, nq, D, nk, 1.0f, diag);",
                                "k + j0 * HD, HD, nq, D, nk, 0.0f, diag);", FAST),
    "attn_no_rescale": ("csrc/kernels/attention.c", "for (int64_t d = 0; d < D; d++) orow[d] *= alpha;", "", ATT),
    "attn_causal_sees_next": ("csrc/kernels/attention.c", "p->start + i0 + r - j0 + 1) : nk;",
                              "p->start + i0 + r - j0 + 2) : nk;", ATT),
    "attn_bwd_no_delta": ("csrc/kernels/attention.c", " - delta[r]) * scale;", ") * scale;", ATT),
    "attn_decode_ignores_start": ("csrc/kernels/attention.c", "D, start, scale, 1};", "D, 0, scale, 1};", ATT),
    "attn_no_max_shift": ("csrc/kernels/attention.c", "const float e = expf(s[c] - mx);",
                          "const float e = expf(s[c]) * expf(-mx);", ATT),
    # the plain CUDA SGEMM (pytfm_sgemm_plain_cuda, the oracle of the fast one)
    "cuda_sgemm_no_barrier_before_compute": ("cuda/sgemm.cu", "        __syncthreads();\n        for (int p = 0; p < BK; p++) {",
                                             "        for (int p = 0; p < BK; p++) {", SGEMM),
    "cuda_sgemm_no_barrier_after_compute": ("cuda/sgemm.cu", "        __syncthreads(); // the tiles are overwritten next slice", "", SGEMM),
    "cuda_sgemm_k_edge_off_by_one": ("cuda/sgemm.cu", "Bs[p][j] = gj < n && gp < k ?", "Bs[p][j] = gj < n && gp <= k ?", SGEMM),
    "cuda_sgemm_store_off_by_one": ("cuda/sgemm.cu", "if (gi < m && gj < n) {", "if (gi <= m && gj < n) {", SGEMM),
    # the emulator's mma: a wrong fragment layout (TF32 a1 and a2 swapped; BF16 b's halves
    # swapped), the eager cp.async mode landing copies at the wait after all; its ldmatrix:
    # .trans's or the plain form's halves swapped, its bank-conflict count blind. The
    # tensor-core SGEMM: its ldmatrix rows for A in the wrong matrix order, no barrier in a
    # slice (each precision's loop), TF32 truncated instead of rounded, a tile's row edge or k
    # edge off by one, the edge-free copy path taken one chunk past k; a swizzle on the write
    # only (TF32, BF16) or on the read only (TF32, BF16 .trans), a staging buffer or a rounded
    # tile off by one slice, the cp.async wait missing (each loop) or one group too lax,
    # .trans missing (A) or where it is not wanted (B)
    "cuda_mma_tf32_layout_a_swapped": ("cuda/emu/emu.cpp", "return {row % 8 * 4 + col % 4, row / 8 + 2 * (col / 4), 0};",
                                       "return {row % 8 * 4 + col % 4, 2 * (row / 8) + col / 4, 0};", TC),
    "cuda_mma_bf16_halves_swapped": ("cuda/emu/emu.cpp", "return {col * 4 + row % 8 / 2, row / 8, row % 2};",
                                     "return {col * 4 + row % 8 / 2, row / 8, 1 - row % 2};", TC),
    "cuda_emu_eager_cp_async_at_the_wait": ("cuda/emu/emu.cpp", "if (cp_async_eager) { // at its earliest",
                                            "if (!cp_async_eager) { // at its earliest", TC),
    "cuda_ldmatrix_trans_halves_swapped": ("cuda/emu/emu.cpp", "if (trans) return {col * 4 + row / 2, 0, row % 2};",
                                           "if (trans) return {col * 4 + row / 2, 0, 1 - row % 2};", TC),
    "cuda_ldmatrix_halves_swapped": ("cuda/emu/emu.cpp", "return {row * 4 + col / 2, 0, col % 2};",
                                     "return {row * 4 + col / 2, 0, 1 - col % 2};", TC),
    "cuda_ldmatrix_blind_to_conflicts": ("cuda/emu/emu.cpp", "if (per_bank[bank] > worst) worst = per_bank[bank];",
                                         "if (per_bank[bank] > worst) worst = 1;", TC),
    "cuda_sgemm_tc_fragment_gather": ("cuda/sgemm_tc.cu", "const int r = r0 + i8 + 8 * (q % 2);\n            row = (const float *)F + r * TBK + pytfm__swz<4>(r, kk / 4 + q / 2) * 4;",
                                      "const int r = r0 + i8 + 8 * (q / 2);\n            row = (const float *)F + r * TBK + pytfm__swz<4>(r, kk / 4 + q % 2) * 4;", TC),
    "cuda_sgemm_tc_tf32_no_barrier_in_a_slice": ("cuda/sgemm_tc.cu", "            __syncthreads();\n            issue(s + STAGES - 1);",
                                                 "            issue(s + STAGES - 1);", TC),
    "cuda_sgemm_tc_bf16_no_barrier_in_a_slice": ("cuda/sgemm_tc.cu", "            __syncthreads();\n            if (s + 1 < slices) round_tile(s + 1);",
                                                 "            if (s + 1 < slices) round_tile(s + 1);", TC),
    "cuda_sgemm_tc_truncates_tf32": ("cuda/mma.cuh", "    return pytfm_emu::cvt_rna_tf32(x);",
                                     "    uint32_t u;\n    memcpy(&u, &x, 4);\n    return u;", TC),
    # (a row read past the edge lands in C's masked rows: the off-by-one that shows drops one)
    "cuda_sgemm_tc_row_edge_off_by_one": ("cuda/sgemm_tc.cu", "across[r] = gr < rows;", "across[r] = gr + 1 < rows;", TC),
    "cuda_sgemm_tc_k_edge_off_by_one": ("cuda/sgemm_tc.cu", "return kp < kext ? across[r] : 0;",
                                        "return kp <= kext ? across[r] : 0;", TC),
    "cuda_sgemm_tc_fast_path_past_k": ("cuda/sgemm_tc.cu", "return kext - s * KD >= KD; }",
                                       "return kext - s * KD >= KD - 4; }", TC),
    "cuda_sgemm_tc_tf32_swizzle_write_only": ("cuda/sgemm_tc.cu", "return KROWS ? row * TBK + pytfm__swz<4>(row, col / 4) * 4 + col % 4 : row * XLD + col;",
                                              "return KROWS ? row * TBK + col : row * XLD + col;", TC),
    "cuda_sgemm_tc_bf16_swizzle_write_only": ("cuda/sgemm_tc.cu", "const int half = row * L + pytfm__swz<L / 8>(row, col / 8) * 8 + col % 8;",
                                              "const int half = row * L + col;", TC),
    "cuda_sgemm_tc_tf32_swizzle_read_only": ("cuda/sgemm_tc.cu", "row = (const float *)F + r * TBK + pytfm__swz<4>(r, kk / 4 + q % 2) * 4;",
                                             "row = (const float *)F + r * TBK + (kk / 4 + q % 2) * 4;", TC),
    "cuda_sgemm_tc_bf16_swizzle_read_only": ("cuda/sgemm_tc.cu", "row = (const uint16_t *)F + p * TBM + pytfm__swz<16>(p, r0 / 8 + q % 2) * 8;",
                                             "row = (const uint16_t *)F + p * TBM + (r0 / 8 + q % 2) * 8;", TC),
    "cuda_sgemm_tc_stage_off_by_one": ("cuda/sgemm_tc.cu", "la.issue(As + s % STAGES * STAGE, s);",
                                       "la.issue(As + (s + 1) % STAGES * STAGE, s);", TC),
    "cuda_sgemm_tc_rounded_tile_off_by_one": ("cuda/sgemm_tc.cu", "slice_products<P, AK, BK>(acc, Fa + s % 2 * FW,",
                                              "slice_products<P, AK, BK>(acc, Fa + (s + 1) % 2 * FW,", TC),
    "cuda_sgemm_tc_tf32_no_cp_async_wait": ("cuda/sgemm_tc.cu", "            pytfm__cp_async_wait<STAGES - 2>();\n            __syncthreads();\n            issue(s + STAGES - 1);",
                                            "            __syncthreads();\n            issue(s + STAGES - 1);", TC),
    "cuda_sgemm_tc_bf16_no_cp_async_wait": ("cuda/sgemm_tc.cu", "            pytfm__cp_async_wait<STAGES - 2>();\n            __syncthreads();\n            if (s + 1",
                                            "            __syncthreads();\n            if (s + 1", TC),
    "cuda_sgemm_tc_cp_async_wait_one_late": ("cuda/sgemm_tc.cu", "            pytfm__cp_async_wait<STAGES - 2>();\n            __syncthreads();\n            issue(s + STAGES - 1);",
                                             "            pytfm__cp_async_wait<STAGES - 1>();\n            __syncthreads();\n            issue(s + STAGES - 1);", TC),
    "cuda_sgemm_tc_a_without_trans": ("cuda/sgemm_tc.cu", "pytfm__ldmatrix<4, P == BF16 && !AK>(fa[i], row);",
                                      "pytfm__ldmatrix<4, false>(fa[i], row);", TC),
    "cuda_sgemm_tc_b_trans_always": ("cuda/sgemm_tc.cu", "pytfm__ldmatrix<4, P == BF16 && !BK>(r4, row);",
                                     "pytfm__ldmatrix<4, P == BF16>(r4, row);", TC),
    # BF16 operands in memory: the copies' swizzle not the fragment loads', a chunk's k within
    # its row dropped, a transposed operand's second k step reading the first's rows, the
    # conversion flushing subnormals (the CPU's BF16, not cvt.rn's), 16-byte copies where rows
    # are not a multiple of 8 elements, the 2-byte loads dropping an edge's last element
    "cuda_gemm_bf16_copy_swizzle_write_only": ("cuda/sgemm_tc.cu", "return row * L + pytfm__swz<L / 8>(row, e % (L / 8)) * 8;",
                                               "return row * L + e % (L / 8) * 8;", TC16),
    "cuda_gemm_bf16_chunk_offset": ("cuda/sgemm_tc.cu", "row = e / (L / W), col = e % (L / W) * W;",
                                    "row = e / (L / W), col = e % (L / W) * (W / 2);", TC16),
    "cuda_gemm_bf16_trans_a_k_step": ("cuda/sgemm_tc.cu", "const int p = kk + i8 + 8 * (q / 2);",
                                      "const int p = i8 + 8 * (q / 2);", TC16),
    "cuda_gemm_bf16_conversion_flushes": ("cuda/sgemm_tc.cu", "w[q] = pytfm__bf16x2(x[2 * q], x[2 * q + 1]);",
                                          "w[q] = pytfm__bf16x2(fabsf(x[2 * q]) < 1.17549435e-38f ? 0.0f : x[2 * q],\n"
                                          "                             fabsf(x[2 * q + 1]) < 1.17549435e-38f ? 0.0f : x[2 * q + 1]);", TC16),
    "cuda_gemm_bf16_wide_copies_on_odd_rows": ("cuda/sgemm_tc.cu", "return tc_aligned(p, 16) && ld % 8 == 0  ? COPY16",
                                               "return tc_aligned(p, 16) ? COPY16", TC16),
    "cuda_gemm_bf16_narrow_edge_short": ("cuda/sgemm_tc.cu", "d[q] = q < left ? p[q] : (uint16_t)0;",
                                         "d[q] = q + 1 < left ? p[q] : (uint16_t)0;", TC16),
    "cuda_block_sum_no_barrier": ("cuda/pytfm_cuda.cuh", "    if (lane == 0) scratch[warp] = v;\n    __syncthreads();\n    v = lane < blockDim.x / PYTFM_WARP ? scratch[lane] : (T)0;",
                                  "    if (lane == 0) scratch[warp] = v;\n    v = lane < blockDim.x / PYTFM_WARP ? scratch[lane] : (T)0;", EMU),
    "cuda_softmax_row_off_by_one": ("cuda/softmax.cu", "for (int64_t j = team.rank; j < cols; j += team.size) yr[j] = expf(",
                                    "for (int64_t j = team.rank; j <= cols; j += team.size) yr[j] = expf(", ROWS),
    "cuda_column_sum_no_barrier": ("cuda/pytfm_cuda.cuh", "part[k][threadIdx.y][threadIdx.x] = s[k];\n    __syncthreads();",
                                   "part[k][threadIdx.y][threadIdx.x] = s[k];", EMU),
    "cuda_column_sum_early_return": ("cuda/pytfm_cuda.cuh", "    float s[Term::K] = {}, t[Term::K];\n    if (j < cols)",
                                     "    float s[Term::K] = {}, t[Term::K];\n    if (j >= cols) return;\n    if (j < cols)", EMU),
    "cuda_rope_pair_index": ("cuda/rope.cu", "const I u = e % units, bth = e / units;",
                             "const I u = e % units, bth = (e + 1) / units;", EMU),
    "cuda_ce_count_ignores_ignore_index": ("cuda/cross_entropy.cu", "kept += targets[i] != ignore_index;",
                                           "kept += targets[i] != ignore_index || rows > 0;", EMU),
    "cuda_gelu_no_grid_stride": ("cuda/gelu.cu", "        y[i] = pytfm__gelu(x[i]);", "        y[i] = pytfm__gelu(x[i]), i = count;", EMU),
    "cuda_embedding_backward_assign": ("cuda/embedding.cu", "dtable[id * dim + j] += dy[i * dim + j];",
                                       "dtable[id * dim + j] = dy[i * dim + j];", EMU),
    "cuda_adamw_no_bias_correction": ("cuda/adamw.cu", "(float)(lr / (1.0 - pow(beta1, (double)step)))", "(float)lr", EMU),
    # per-output tolerances (tests/kernels/test_fast.py): the centred square expanded as
    # x² − 2xμ + μ² cancels when |μ| ≫ σ: rstd off by ~1e-4 at offset −100, which one tolerance
    # shared by all outputs (≈ 0.02 there) lets through
    "fast_ln_variance_expanded": ("csrc/kernels/fast_impl.h", "v[l] += (x[j + l] - x0 - d) * (x[j + l] - x0 - d);",
                                  "v[l] += x[j + l] * x[j + l] - 2.0f * x[j + l] * (x0 + d) + (x0 + d) * (x0 + d);", FAST),
    # LayerNorm's fast mean summed without the shift by the row's first value: when |μ| ≫ σ the
    # float sum rounds away the digits x − μ needs (y off by 1e-3 relative at offset −20, σ 1e-3)
    "fast_ln_no_shift": ("csrc/kernels/fast_impl.h", "const float x0 = x[0];", "const float x0 = 0.0f;", OPS),
    # linear's backward with one allocation per product, dx's first: it writes the caller's dx
    # and then fails on dW's larger scratch (tests/kernels/test_memory.py watches dx, dw, db)
    "linear_bwd_two_allocations": ("csrc/kernels/linear.c", "PYTFM_TRY(pytfm__sgemm_all(func, products, dx ? 2 : 1));",
                                   "if (dx) PYTFM_TRY(pytfm__sgemm_all(func, products + 1, 1));\n    PYTFM_TRY(pytfm__sgemm_all(func, products, 1));",
                                   ["tests/kernels/test_memory.py"]),
    "cuda_ln_no_shift": ("cuda/layernorm.cu", "const float x0 = xr[0];", "const float x0 = 0.0f;", EMU),
    # e^x flushed to 0 below e^-17 instead of FLT_MIN: probabilities under 3e-8 vanish, under
    # fixed absolute tolerances such as 1e-7 (softmax) and 4.8e-7 (cross-entropy's gradient)
    "fast_exp_flushes_early": ("csrc/kernels/vecmath.h", "const float lo = -86.98f, hi = 89.0f;",
                               "const float lo = -17.0f, hi = 89.0f;", FAST),
    # the out-of-memory path (tests/kernels/test_memory.py): attention's forward writes through a NULL
    # workspace
    "attn_fast_no_alloc_check": ("csrc/kernels/attention.c", "    if (!ws) return PYTFM_STATUS_OUT_OF_MEMORY;\n    PYTFM_PARALLEL_FOR_THREADS(threads)\n    for (int64_t bh = 0; bh < p->B * p->H; bh++)",
                                 "    PYTFM_PARALLEL_FOR_THREADS(threads)\n    for (int64_t bh = 0; bh < p->B * p->H; bh++)", ["tests/kernels/test_memory.py"]),
    # model tests, each named with the test that must catch it: gradients 0.5–1% off (a finite-difference bound of
    # 2% of |g| lets them through), positions leaking into a model without any, a decode between forward and backward
    "nn_attn_backward_scale_off": ("pytfm/nn.py", "dq, dk, dv = ops.attention_backward(do, q, k, v, o, lse, causal=True,\n",
                                   "dq, dk, dv = ops.attention_backward(do, q, k, v, o, lse, causal=True, scale=1.005 / math.sqrt(self.hd),\n", ["tests/model/test_model.py::test_model_gradients_match_finite_differences"]),
    "nn_mlp_grad_one_percent": ("pytfm/nn.py", "return self.c_fc.backward(ops.gelu_backward(self.c_proj.backward(dy), h))",
                                "return self.c_fc.backward(ops.gelu_backward(1.01 * self.c_proj.backward(dy), h))", ["tests/model/test_model.py::test_model_gradients_match_finite_differences"]),
    "nn_none_leaks_positions": ("pytfm/nn.py", "self.pe = sinusoidal_positions(cfg.max_seq, cfg.d_model) if sinusoidal else None",
                                "self.pe = sinusoidal_positions(cfg.max_seq, cfg.d_model) * (1 if sinusoidal else 1e-3) if cfg.pos != \"rope\" else None", ["tests/model/test_model.py::test_without_positions_one_layer_cannot_see_the_order_of_what_came_before"]),
    "nn_decode_writes_saved": ("pytfm/nn.py", "h = self.attn.forward(self.ln_1.forward(x, save), pos, save, cache)",
                               "h = self.attn.forward(self.ln_1.forward(x), pos, save, cache)", ["tests/model/test_model.py::test_decoding_between_forward_and_backward_leaves_the_gradients_alone"]),
    # CUDA: the row max and Σexp of softmax's plain path (rows past 4096 columns)
    "cuda_row_max_not_shared": ("cuda/pytfm_cuda.cuh", "    max = team.max(max, scratch);\n", "", ROWS),
    # C core: the CUDA entry points of a CPU-only build (generated by cmake/cuda_stubs.cmake)
    "stub_wrong_status": ("cmake/cuda_stubs.cmake", "return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED,",
                          "return pytfm__fail(PYTFM_STATUS_INTERNAL,", ["tests/packaging/test_build.py"]),
    "stub_device_count_one": ("csrc/core/cuda_stub.c", "*count = 0;", "*count = 1;", ["tests/packaging/test_build.py"]),
    # the QKV split, the flat buffers' optimizer step and clipping norm
    "qkv_split_v_from_k": ("csrc/kernels/rope.c", "{v, qkv + 2 * hd, hd, 3 * hd, 0}}", "{v, qkv + hd, hd, 3 * hd, 0}}",
                           ["tests/kernels/test_qkv_split.py"]),
    "qkv_split_backward_same_sign": ("csrc/kernels/rope.c", "return run_streams(__func__, st, 3, pos, B, T, H, D, pos_stride, base, -1.0);",
                                     "return run_streams(__func__, st, 3, pos, B, T, H, D, pos_stride, base, +1.0);",
                                     ["tests/kernels/test_qkv_split.py"]),
    "sum_squares_drops_last_block": ("csrc/kernels/adamw.c", "for (int64_t c = 0; c < blocks; c++) total += sums[c];",
                                     "for (int64_t c = 0; c + 1 < blocks; c++) total += sums[c];", ["tests/model/test_flat.py"]),
    "flat_adamw_decays_vectors": ("pytfm/optim.py", "zip(self.spans, (self.weight_decay, 0.0))",
                                  "zip(self.spans, (self.weight_decay, self.weight_decay))", ["tests/model/test_flat.py"]),
    "epilogue_before_last_slice": ("csrc/kernels/sgemm.c", "const int last = pc + kc == g->k && g->epilogue;",
                                   "const int last = pc == 0 && g->epilogue;", ["tests/kernels/test_linear_fused.py"]),
    "epilogue_skips_last_row": ("csrc/kernels/sgemm.c", "    for (int64_t r = 0; r < rows; r++) {\n        float *cr = c + r * g->n;",
                                "    for (int64_t r = 0; r + 1 < rows; r++) {\n        float *cr = c + r * g->n;",
                                ["tests/kernels/test_linear_fused.py"]),
    # sizes: an element count multiplied unchecked (m·n = 2^64 wraps to 0), the bound
    # one past PTRDIFF_MAX bytes, start + n_new and RoPE's pos extent unchecked
    "size_product_unchecked": ("csrc/core/checks.h", "if (pytfm__mul_within(c, sizes[i], limit, &c)) continue;",
                               "c *= sizes[i];\n        continue;", LIMITS),
    "size_bound_one_past": ("csrc/core/internal.h", "if (a != 0 && b > limit / a) return 0;",
                            "if (a != 0 && b > limit / a + 1) return 0;", LIMITS),
    "cache_end_wraps": ("csrc/core/checks.h", "PYTFM_CHECK(pytfm__add_within(start, n_new, INT64_MAX, &end),",
                        "end = start + n_new;\n    PYTFM_CHECK(1,", LIMITS),
    "rope_pos_stride_unchecked": ("csrc/core/checks.h", "PYTFM_CHECK(pytfm__mul_within(B - 1, pos_stride, limit, n_pos) &&",
                                  "PYTFM_CHECK((*n_pos = (B - 1) * pos_stride, 1) &&", LIMITS),
    # overlaps: an accumulator not counted as an output, overlaps seen in one direction
    # only, a partial overlap let through where the exact in-place form is allowed
    "linear_dw_may_alias": ("csrc/core/checks.h", "PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dx, n.x, float),",
                            "PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dx, n.x, float),", EXTREMES),
    "layernorm_dw_may_alias": ("csrc/core/checks.h", "PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dx, n, float),",
                               "PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(dx, n, float),", EXTREMES),
    "embedding_dtable_may_alias": ("csrc/core/checks.h", "PYTFM_CHECK_DISJOINT(func, 1, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,\n                         PYTFM_SPAN(dtable",
                                   "PYTFM_CHECK_DISJOINT(func, 0, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,\n                         PYTFM_SPAN(dtable", EXTREMES),
    "adamw_may_alias": ("csrc/core/checks.h", "PYTFM_CHECK_DISJOINT(func, 3, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(param, n, float),",
                        "PYTFM_CHECK_DISJOINT(func, 0, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE, PYTFM_SPAN(param, n, float),",
                        ["tests/kernels/test_errors.py", "tests/kernels/test_extremes.py"]),
    "overlap_one_direction": ("csrc/core/internal.h", "return a0 < b0 + (uint64_t)b.bytes && b0 < a0 + (uint64_t)a.bytes;",
                              "return a0 <= b0 && b0 < a0 + (uint64_t)a.bytes;", EXTREMES),
    "inplace_partial_allowed": ("csrc/core/checks.h", "if (pair && spans[i].p == spans[j].p && spans[i].bytes == spans[j].bytes) continue;",
                                "if (pair) continue;", EXTREMES),
    # threads: no clamp, another clamp than documented, attention's region re-reading
    # the count its workspaces were not sized for
    "threads_unclamped": ("csrc/core/status.c", "const int count = threads < 1 ? 1 : threads > most ? most : threads;",
                          "const int count = threads < 1 ? 1 : threads;", THREADS),
    "threads_clamp_per_core": ("csrc/core/status.c", "enum { PYTFM_THREADS_PER_CORE = 4 };",
                               "enum { PYTFM_THREADS_PER_CORE = 8 };", THREADS),
    "attn_workspace_count_reread": ("csrc/kernels/attention.c", "    PYTFM_PARALLEL_FOR_THREADS(threads)\n    for (int64_t bh = 0; bh < p->B * p->H; bh++)\n        forward_head_fast",
                                    "    PYTFM_PARALLEL_FOR\n    for (int64_t bh = 0; bh < p->B * p->H; bh++)\n        forward_head_fast", THREADS),
    "sgemm_team_count_reread": ("csrc/kernels/sgemm.c", "#pragma omp parallel num_threads((int)bl->threads) if (bl->threads > 1)",
                                "#pragma omp parallel num_threads(pytfm_get_num_threads())", THREADS),
    # float extremes
    "fast_exp_saturates": ("csrc/kernels/vecmath.h", "const float lo = -86.98f, hi = 89.0f;",
                           "const float lo = -86.98f, hi = 88.37f;", EXTREMES),
    # 2^n directly instead of 2^(n-1)·2: overflows to inf for x just below log(FLT_MAX)
    "fast_exp_no_doubling": ("csrc/kernels/vecmath.h", "p = PYTFM_FMA(r + r, PYTFM_FMA(r, p, 1.0f), 2.0f);\n    uint32_t bits;\n    memcpy(&bits, &t, sizeof bits);\n    bits = (bits << 23) + (126u << 23);",
                             "p = PYTFM_FMA(r, PYTFM_FMA(r, p, 1.0f), 1.0f);\n    uint32_t bits;\n    memcpy(&bits, &t, sizeof bits);\n    bits = (bits << 23) + (127u << 23);", EXTREMES),
    "gelu_term_unclamped": ("csrc/core/internal.h", "((v) > 16.0f && (v) <= FLT_MAX ? 16.0f : (v) < -16.0f && (v) >= -FLT_MAX ? -16.0f : (v))",
                            "(v)", EXTREMES),
    "gelu_term_clamped_early": ("csrc/core/internal.h", "((v) > 16.0f && (v) <= FLT_MAX ? 16.0f :", "((v) > 4.0f && (v) <= FLT_MAX ? 4.0f :", EXTREMES),
    "gelu_inf_clamped_too": ("csrc/core/internal.h", "((v) > 16.0f && (v) <= FLT_MAX ? 16.0f :", "((v) > 16.0f ? 16.0f :", EXTREMES),
    "fast_ln_no_fallback": ("csrc/kernels/fast_impl.h", "if (!PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps)) {", "if (0) {", EXTREMES),
    "ln_fallback_ignores_underflow": ("csrc/core/internal.h", "((ss) <= FLT_MAX && (ss) / (float)(cols) + (eps) >= 1e-30f)",
                                      "((ss) <= FLT_MAX)", EXTREMES),
    "cuda_ln_no_fallback": ("cuda/layernorm.cu", "if (!PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps)) {", "if (0) {", EXTREMES),
    "reference_gelu_cancels": ("pytfm/reference.py", "np.where(u < 0, e / (1.0 + e), 0.5 * (1.0 + t))", "0.5 * (1.0 + t)", EXTREMES),
    # the default thread count, checkpoints and the example scripts' flags
    "threads_default_ignores_neighbours": ("csrc/core/free_cores.c", "return PYTFM_MIN(omp_get_max_threads(), atomic_load(&free_cores));",
                                           "return omp_get_max_threads();", ["tests/kernels/test_busy.py"]),
    "free_cores_counts_own_threads": ("csrc/core/free_cores.c", "int others = machine < 0 || own < 0 ? 0 : machine - own;",
                                      "int others = machine < 0 || own < 0 ? 0 : machine;", ["tests/kernels/test_busy.py"]),
    "last_error_shared": ("csrc/core/status.c", "static _Thread_local char last_error[512];",
                          "static char last_error[512];", ["tests/kernels/test_threads.py"]),
    "ckpt_offsets_may_overlap": ("csrc/model/safetensors.c", "        if (e->begin != at) {\n", "        if (e->begin > at) {\n",
                                 ["tests/model/test_checkpoint.py"]),
    "tiny_no_write_probe": ("pytfm/cli/train.py", "fd, probe = tempfile.mkstemp(prefix=\".write-test-\", dir=out)\n        os.close(fd)\n        os.unlink(probe)",
                            "pass", ["tests/model/test_cli.py"]),
    # the CUDA twins of the QKV split, the linear layer + GELU and the sum of squares
    "cuda_qkv_v_from_k": ("cuda/rope.cu", "const float *v_in = parts.in[2] + in_off;",
                          "const float *v_in = parts.in[1] + in_off;", EMU),
    "cuda_qkv_backward_same_sign": ("cuda/rope.cu", "pos_stride, base, rope, -1.0, stream);",
                                    "pos_stride, base, rope, +1.0, stream);", EMU),
    "cuda_qkv_pos_index_swapped": ("cuda/rope.cu", "pos[r / T * pos_stride + r % T];", "pos[r % T * pos_stride + r / T];", EMU),
    "cuda_qkv_copy_skips_v": ("cuda/rope.cu", "for (int p = 0; p < 3; p++)", "for (int p = 0; p < 2; p++)", EMU),
    "cuda_linear_gelu_outputs_swapped": ("cuda/linear.cu", "            h[e] = v;\n        }\n        y[e] = pytfm__gelu(v);",
                                         "            y[e] = v;\n        }\n        h[e] = pytfm__gelu(v);", EMU),
    "cuda_linear_gelu_h_without_bias": ("cuda/linear.cu", "            h[e] = v;\n", "", EMU),
    "cuda_sum_squares_drops_last_partial": ("cuda/adamw.cu", "i < n; i += blockDim.x) acc += partial[i];",
                                            "i + 1 < n; i += blockDim.x) acc += partial[i];", EMU),
    "cuda_sum_squares_no_grid_stride": ("cuda/adamw.cu", "i += (int64_t)gridDim.x * blockDim.x)\n        acc += (double)x[i]",
                                        "i += count)\n        acc += (double)x[i]", EMU),
    # the GPU attention (cuda/attention.cu), run by tests/cuda/test_cuda_attention.py on the emulator
    "cuda_attn_no_barrier_before_pv": ("cuda/attention.cu", "        __syncthreads(); // P is whole\n", "", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_causal_bound": ("cuda/attention.cu", "(a.causal && j0 + c > pos)", "(a.causal && j0 + c > pos + 1)",
                               ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_no_rescale": ("cuda/attention.cu", "acc[i][d] *= alpha;", "acc[i][d] *= 1.0f;", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_dq_skips_first_tile": ("cuda/attention.cu", "for (int64_t j0 = 0; j0 < j_end; j0 += BK) {",
                                      "for (int64_t j0 = BK; j0 < j_end; j0 += BK) {", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_dkdv_wrong_delta": ("cuda/attention.cu", "dlt[t] = t < nq ? delta[i0 + t] : 0.0f;",
                                   "dlt[t] = t < nq ? delta[i0] : 0.0f;", ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_merge_unweighted": ("cuda/attention.cu", "acc += w * po[s * o_split + e];", "acc += po[s * o_split + e];",
                                   ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_vector_load_unaligned": ("cuda/attention.cu", "vv = vec && pytfm__aligned4(a.v);", "vv = vec;",
                                        ["tests/cuda/test_cuda_attention.py"]),
    "cuda_attn_no_shared_optin": ("cuda/pytfm_cuda.cuh", "    if (bytes <= 48 * 1024) return PYTFM_STATUS_OK;\n",
                                  "    return PYTFM_STATUS_OK;\n", ["tests/cuda/test_cuda_attention.py"]),
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
    "cuda_tc_attn_no_barrier_before_kv_store": ("cuda/attention_tc.cu", "            __syncthreads(); // one buffer: every warp is done with this tile's K and V\n", "", TC_ATT),
    "cuda_tc_attn_no_barrier_before_query_store": ("cuda/attention_tc.cu", "            __syncthreads(); // one buffer: every warp is done with this query tile\n", "", TC_ATT),
    "cuda_tc_attn_no_barrier_before_key_store": ("cuda/attention_tc.cu", "            __syncthreads(); // one buffer: every warp is done with this key tile\n", "", TC_ATT),
    "cuda_tc_attn_tf32_p_repack": ("cuda/attention_tc.cu", "{pytfm__tf32(s[j][0]), pytfm__tf32(s[j][2]),\n                                   pytfm__tf32(s[j][1]), pytfm__tf32(s[j][3])}",
                                   "{pytfm__tf32(s[j][0]), pytfm__tf32(s[j][1]),\n                                   pytfm__tf32(s[j][2]), pytfm__tf32(s[j][3])}", TC_ATT),
    "cuda_tc_attn_bf16_p_repack": ("cuda/attention_tc.cu", "pytfm__bf16x2(s[2 * c][2], s[2 * c][3]),\n                                   pytfm__bf16x2(s[2 * c + 1][0], s[2 * c + 1][1]),",
                                   "pytfm__bf16x2(s[2 * c + 1][0], s[2 * c + 1][1]),\n                                   pytfm__bf16x2(s[2 * c][2], s[2 * c][3]),", TC_ATT),
    "cuda_tc_attn_no_rescale": ("cuda/attention_tc.cu", "            acc[n][0] *= alpha[0];\n            acc[n][1] *= alpha[0];\n            acc[n][2] *= alpha[1];\n            acc[n][3] *= alpha[1];\n",
                                "", TC_ATT),
    "cuda_tc_attn_causal_tile_off_by_one": ("cuda/attention_tc.cu", "(a.causal && j0 + TC_KEYS - 1 > i0)", "(a.causal && j0 > i0)", TC_ATT),
    "cuda_tc_attn_dkdv_skips_diagonal": ("cuda/attention_tc.cu", "const int64_t i_first = a.causal ? j0 : 0;",
                                         "const int64_t i_first = a.causal ? j0 + TC_KEYS : 0;", TC_ATT),
    "cuda_tc_attn_no_barrier_after_load": ("cuda/attention_tc.cu", "    __syncthreads(); // Q and the first K and V tiles are whole\n", "", TC_ATT),
    "cuda_tc_attn_tf32_v_truncated": ("cuda/attention_tc.cu", "const uint32_t b[2] = {pytfm__tf32(x0[8 * n + g]), pytfm__tf32(x1[8 * n + g])};",
                                      "uint32_t b[2];\n                memcpy(&b[0], &x0[8 * n + g], 4);\n                memcpy(&b[1], &x1[8 * n + g], 4);", TC_ATT),
    "cuda_tc_attn_bf16_tile_truncated": ("cuda/attention_tc.cu", "pytfm__store2(tile + half / 2, pytfm__bf16x2(v.x, v.y), pytfm__bf16x2(v.z, v.w));",
                                         "uint32_t w[4];\n            memcpy(w, &v, sizeof w);\n            pytfm__store2(tile + half / 2, (w[0] >> 16) | (w[1] & 0xffff0000u), (w[2] >> 16) | (w[3] & 0xffff0000u));", TC_ATT),
    "cuda_tc_attn_no_barrier_fwd_buffer_swap": ("cuda/attention_tc.cu", "        // after next is stored over them)\n        __syncthreads();\n", "        // after next is stored over them)\n", TC_ATT),
    "cuda_tc_attn_no_barrier_dkdv_buffer_swap": ("cuda/attention_tc.cu", "        // the next query tile is whole, and every warp is done with this one (PF: the tile\n        // after next is stored over it)\n        __syncthreads();\n", "", TC_ATT),
    "cuda_tc_attn_no_barrier_dq_buffer_swap": ("cuda/attention_tc.cu", "        // the next key tile is whole, and every warp is done with this one (PF: the tile\n        // after next is stored over it)\n        __syncthreads();\n", "", TC_ATT),
    "cuda_tc_attn_prefetch_into_read_buffer": ("cuda/attention_tc.cu", "            kx.store(Ks + Buffers<PF>::next(buf) * W);\n            vx.store(Vs + Buffers<PF>::next(buf) * W);\n        } else if (nn > 0) {\n            __syncthreads(); // one buffer: every warp is done with this tile's K and V",
                                               "            kx.store(Ks + buf * W);\n            vx.store(Vs + buf * W);\n        } else if (nn > 0) {\n            __syncthreads(); // one buffer: every warp is done with this tile's K and V", TC_ATT),
    "cuda_tc_attn_swizzle_on_store_only": ("cuda/attention_tc.cu", "const int half = r * D + pytfm__swz<D / 8>(r, d / 8) * 8 + d % 8;", "const int half = r * D + d / 8 * 8 + d % 8;", TC_ATT),
    "cuda_tc_attn_swizzle_on_read_only": ("cuda/attention_tc.cu", "return (const uint16_t *)tile + r * D + pytfm__swz<D / 8>(r, c) * 8;", "return (const uint16_t *)tile + r * D + c * 8;", TC_ATT),
    "cuda_tc_attn_v_without_trans": ("cuda/attention_tc.cu", "pytfm__ldmatrix<4, true>(r4, tc_chunk<D>(X,", "pytfm__ldmatrix<4, false>(r4, tc_chunk<D>(X,", TC_ATT),
    # the delta pass both backward passes share (cuda/attention.cu), its dy not rounded to the
    # tensor-core precision: delta then is not Σ_s P_ts dP_ts of the rounded products
    "cuda_tc_attn_delta_unrounded": ("cuda/attention.cu", "    if (PREC == PYTFM_PRECISION_FP32) return x;\n", "    return x;\n", TC_ATT),
    "cuda_tc_attn_ragged_reads_past_T": ("cuda/attention_tc.cu", "if (r >= n) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);", "if (r > n) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);", TC_ATT),
    # the fast CUDA SGEMM (cuda/sgemm.cu), run by tests/cuda/test_cuda_sgemm.py on the
    # emulator: a slice read before its cp.async wait, the next slice written into the buffer
    # others still read, edges (the k-slice past k loaded; C's row m stored), float4s on an
    # operand offset by a float, the staged loader's chunks mapped one way and stored another
    "cuda_sgemm_fast_no_cp_async_wait": ("cuda/sgemm.cu", "        pytfm__cp_async_wait<0>();\n        __syncthreads(); // the next slice",
                                         "        __syncthreads(); // the next slice", SGEMM),
    "cuda_sgemm_fast_no_barrier_between_buffers": ("cuda/sgemm.cu", "        __syncthreads(); // the next slice is in for everyone, and buffer cur free again\n",
                                                   "", SGEMM),
    "cuda_sgemm_fast_k_edge_off_by_one": ("cuda/sgemm.cu", "const bool in = p0 + p < k;", "const bool in = p0 + p <= k;", SGEMM),
    "cuda_sgemm_fast_row_mask_off_by_one": ("cuda/sgemm.cu", "if (di >= rows_in) continue;", "if (di > rows_in) continue;", SGEMM),
    "cuda_sgemm_fast_unaligned_a_vectorised": ("cuda/sgemm.cu", "const int vec = (aligned16(a) && (trans_a ? m : k) % 4 == 0) |",
                                               "const int vec = ((trans_a ? m : k) % 4 == 0) |", SGEMM),
    "cuda_sgemm_fast_staged_transpose_index": ("cuda/sgemm.cu", "const int e = threadIdx.x + r * NT, x = e / C, p = e % C * 4;",
                                               "const int e = threadIdx.x + r * NT, x = e % X, p = e / X * 4;", SGEMM),
    # rows in registers (a column class per row length), float4 where aligned, the
    # LayerNorm backward's dw/db partials in the same pass, the column sums in two stages
    "cuda_rows_edge_mask": ("cuda/pytfm_cuda.cuh", "            v[k] = j < cols ? p[j] : fill;",
                            "            v[k] = j < cols && k + 1 < N ? p[j] : fill;", ROWS),
    "cuda_rows_vector_unaligned_w": ("cuda/layernorm.cu", "pytfm__rows_vec4(cols, dx, dy, x, w);",
                                     "pytfm__rows_vec4(cols, dx, dy, x);", ROWS),
    "cuda_rows_stage2_skips_last_chunk": ("cuda/pytfm_cuda.cuh", "for (int64_t c = 0; c < chunks; c++) s += partial",
                                          "for (int64_t c = 0; c + 1 < chunks; c++) s += partial", ROWS),
    "cuda_rows_block_sum2_no_barrier": ("cuda/pytfm_cuda.cuh", "scratch[PYTFM_WARP + warp] = b;\n        __syncthreads();\n",
                                        "scratch[PYTFM_WARP + warp] = b;\n", ROWS),
    "cuda_rows_ln_dw_without_xhat": ("cuda/layernorm.cu", "dw_sum[k] += g[k] * xh[k];", "dw_sum[k] += g[k];", ROWS),
    "cuda_rows_ln_warp_sums_no_barrier": ("cuda/layernorm.cu", "            }\n            __syncthreads();\n        }\n    } else {",
                                          "            }\n        }\n    } else {", ROWS),
    # the memory-bound kernels at speed (cuda/cross_entropy.cu, embedding.cu, rope.cu,
    # gelu.cu): the online max/sum, the float4 paths and their alignment, the sorted embedding
    # backward, RoPE's table of angles
    "cuda_ce_online_no_rescale": ("cuda/cross_entropy.cu", "            sum *= expf(max - m);\n", "", EMU),
    "cuda_ce_merge_unscaled": ("cuda/cross_entropy.cu", "const float a = max == m ? 1.0f : expf(max - m), b = o.max == m ? 1.0f : expf(o.max - m);",
                               "const float a = 1.0f, b = 1.0f;", EMU),
    "cuda_ce_block_merge_skips_warps": ("cuda/cross_entropy.cu", "for (unsigned w = 1; w < blockDim.x / PYTFM_WARP; w++)",
                                        "for (unsigned w = 1; w < 2; w++)", EMU),
    "cuda_ce_vector_unaligned": ("cuda/cross_entropy.cu", "const int64_t head = vec ? (int64_t)((16u - ((uintptr_t)row & 15u)) & 15u) / 4 : cols;",
                                 "const int64_t head = vec ? (int64_t)((16u - ((uintptr_t)row & 15u)) & 15u) / 8 : cols;", EMU),
    "cuda_ce_backward_other_offset": ("cuda/cross_entropy.cu", "(((uintptr_t)logits ^ (uintptr_t)dlogits) & 15u) == 0;", "true;", EMU),
    "cuda_ce_tail_dropped": ("cuda/cross_entropy.cu", "    for (int64_t j = head + 4 * nv + team.rank; j < cols; j += team.size) acc.add(row[j]);\n", "", EMU),
    "cuda_embedding_sort_unstable": ("cuda/embedding.cu", "if ((a > b) == ((i & k) == 0)) s[i] = b, s[l] = a;",
                                     "if (((a >> 32) > (b >> 32)) == ((i & k) == 0)) s[i] = b, s[l] = a;", EMU),
    "cuda_embedding_group_boundary_off_by_one": ("cuda/embedding.cu", "if (k > 0 && key_id(keys[k - 1]) == id) continue;",
                                                 "if (k > 1 && key_id(keys[k - 1]) == id) continue;", EMU),
    "cuda_embedding_group_stops_early": ("cuda/embedding.cu", "if (key_id(kk[GROUP_UNROLL - 1]) != id) break;", "break;", EMU),
    "cuda_embedding_last_merge_skipped": ("cuda/embedding.cu", "width < rows; width *= 2) {", "2 * width < rows; width *= 2) {", EMU),
    "cuda_embedding_vector_unaligned": ("cuda/embedding.cu", "return dim % 4 == 0 && ((uintptr_t)a & 15u) == 0 && ((uintptr_t)b & 15u) == 0;",
                                        "return dim % 4 == 0 && ((uintptr_t)a & 3u) == 0 && ((uintptr_t)b & 3u) == 0;", EMU),
    "cuda_rope_table_wrong_row": ("cuda/rope.cu", "(per_batch ? bt : bt % T) * half + i;", "(per_batch ? bt % T : bt % T) * half + i;", EMU),
    "cuda_rope_table_pair_index": ("cuda/rope.cu", "const int64_t r = e / half, i = e % half;", "const int64_t r = e / half, i = (e + 1) % half;", EMU),
    "cuda_rope_vector_unaligned": ("cuda/rope.cu", "const bool vec = half % 4 == 0 && parts_aligned(parts) &&", "const bool vec = half % 4 == 0 &&", EMU),
    "cuda_gelu_vector_past_end": ("cuda/gelu.cu", "const int64_t nv = kVec ? count / 4 : 0; // float4s; the rest one by one",
                                  "const int64_t nv = kVec ? (count + 3) / 4 : 0;", EMU),
    "cuda_gelu_vector_unaligned": ("cuda/gelu.cu", "const bool vec = (((uintptr_t)dx | (uintptr_t)dy | (uintptr_t)x) & 15u) == 0;",
                                   "const bool vec = (((uintptr_t)dx | (uintptr_t)x) & 15u) == 0;", EMU),
}


def unpack_and_build(tree, path=None, old=None, new=None):
    """HEAD's tree in `tree`, with old replaced by new in path when given, built in place.
    -> None, or what went wrong."""
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", "HEAD"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    if path is not None:
        src = os.path.join(tree, path)
        with open(src) as f:
            text = f.read()
        if old not in text:
            return "STALE (the text to replace is gone: update dev/mutate.py)"
        with open(src, "w") as f:
            f.write(text.replace(old, new, 1))
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
    path, old, new, tests = MUTATIONS[name]
    tree = os.path.join(workdir, name)
    problem = unpack_and_build(tree, path, old, new)
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
