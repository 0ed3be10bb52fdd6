/*
 * softmax.cu — softmax over the last axis on the GPU; the twin of csrc/kernels/softmax.c.
 *
 *   x, y [rows, cols]
 *   forward:  y = exp(x − max x) / Σ exp(x − max x)
 *   backward: with s = Σ_j dy_j y_j,  dx_i = y_i (dy_i − s)
 * Rows of up to 4096 columns are held in registers (pytfm_cuda.cuh's column classes: a warp
 * per row up to 1024 columns, 4 to 32 floats a lane; a block of 512 or 1024 threads per row up
 * to 4096, 4 floats a thread): each input is read once and each output written once, with
 * float4 accesses where cols % 4 == 0 and the pointers are 16-byte aligned, 32-bit ones
 * otherwise (a CuPy view such as x[1:]). Longer rows take the plain kernels: three passes over
 * the row (the max, Σ exp, then y: the row max and Σexp the cross-entropy shares), each
 * re-reading it from L1/L2. Sums are float, in a fixed order: the same bits on every run.
 *
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "pytfm_cuda.cuh"

/* a row in registers: C::N floats per thread of the team (C a column class, pytfm_cuda.cuh) */
template <class C, bool kVec>
static __global__ void __launch_bounds__(C::threads)
    softmax_forward_regs_kernel(float *__restrict__ y, const float *__restrict__ x, int64_t rows,
                                int cols) {
    __shared__ float scratch[PYTFM_WARP];
    const pytfm__row_team<C::warp> team;
    constexpr bool vec = kVec; // cols % 4 == 0, pointers aligned (pytfm__rows_vec4)
    for (int64_t r = team.first; r < rows; r += team.step) {
        float v[C::N];
        pytfm__row_load(v, x + r * cols, cols, vec, team, -INFINITY); // exp(−∞) adds nothing
        float max = -INFINITY;
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) max = fmaxf(max, v[k]);
        max = team.max(max, scratch);
        float sum = 0.0f;
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) {
            v[k] = expf(v[k] - max);
            sum += v[k];
        }
        const float inv = 1.0f / team.sum(sum, scratch);
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) v[k] *= inv;
        pytfm__row_store(y + r * cols, v, cols, vec, team);
    }
}

/* the plain kernel, for rows past the register classes: three passes over the row */
template <bool kWarp>
static __global__ void softmax_forward_kernel(float *__restrict__ y, const float *__restrict__ x,
                                              int64_t rows, int64_t cols) {
    __shared__ float scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        const pytfm__max_sumexp row = pytfm__row_max_sumexp(team, xr, cols, scratch);
        const float inv = 1.0f / row.sumexp;
        for (int64_t j = team.rank; j < cols; j += team.size) yr[j] = expf(xr[j] - row.max) * inv;
    }
}

extern "C" pytfm_status pytfm_softmax_forward_cuda(float *y, const float *x, int64_t rows,
                                                   int64_t cols, void *stream) {
    PYTFM_TRY(pytfm__check_softmax_forward(__func__, y, x, rows, cols));
    if (rows == 0) return PYTFM_STATUS_OK;
    const char *func = __func__; // the lambdas' own __func__ is operator()
    const bool vec = pytfm__rows_vec4(cols, y, x);
    return pytfm__with_row_class(
        cols,
        [&](auto c) {
            using C = decltype(c);
            return pytfm__launch_row_class(func, c,
                                           vec ? softmax_forward_regs_kernel<C, true>
                                               : softmax_forward_regs_kernel<C, false>,
                                           rows, PYTFM_MAX_BLOCKS, stream, y, x, rows, (int)cols);
        },
        [&] {
            return pytfm__launch_rows(func, softmax_forward_kernel<true>,
                                      softmax_forward_kernel<false>, rows, cols, PYTFM_MAX_BLOCKS,
                                      stream, y, x, rows, cols);
        });
}

template <class C, bool kVec>
static __global__ void __launch_bounds__(C::threads)
    softmax_backward_regs_kernel(float *__restrict__ dx, const float *__restrict__ dy,
                                 const float *__restrict__ y, int64_t rows, int cols) {
    __shared__ float scratch[PYTFM_WARP];
    const pytfm__row_team<C::warp> team;
    constexpr bool vec = kVec; // cols % 4 == 0, pointers aligned (pytfm__rows_vec4)
    for (int64_t r = team.first; r < rows; r += team.step) {
        float g[C::N], p[C::N];
        pytfm__row_load(g, dy + r * cols, cols, vec, team, 0.0f);
        pytfm__row_load(p, y + r * cols, cols, vec, team, 0.0f);
        float s = 0.0f;
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) s += g[k] * p[k];
        s = team.sum(s, scratch);
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) g[k] = p[k] * (g[k] - s);
        pytfm__row_store(dx + r * cols, g, cols, vec, team);
    }
}

template <bool kWarp>
static __global__ void softmax_backward_kernel(float *__restrict__ dx, const float *__restrict__ dy,
                                               const float *__restrict__ y, int64_t rows,
                                               int64_t cols) {
    __shared__ float scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *dyr = dy + r * cols, *yr = y + r * cols;
        float *dxr = dx + r * cols;
        float s = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size) s += dyr[j] * yr[j];
        s = team.sum(s, scratch);
        for (int64_t j = team.rank; j < cols; j += team.size) dxr[j] = yr[j] * (dyr[j] - s);
    }
}

extern "C" pytfm_status pytfm_softmax_backward_cuda(float *dx, const float *dy, const float *y,
                                                    int64_t rows, int64_t cols, void *stream) {
    PYTFM_TRY(pytfm__check_softmax_backward(__func__, dx, dy, y, rows, cols));
    if (rows == 0) return PYTFM_STATUS_OK;
    const char *func = __func__; // the lambdas' own __func__ is operator()
    const bool vec = pytfm__rows_vec4(cols, dx, dy, y);
    return pytfm__with_row_class(
        cols,
        [&](auto c) {
            using C = decltype(c);
            return pytfm__launch_row_class(func, c,
                                           vec ? softmax_backward_regs_kernel<C, true>
                                               : softmax_backward_regs_kernel<C, false>,
                                           rows, PYTFM_MAX_BLOCKS, stream, dx, dy, y, rows,
                                           (int)cols);
        },
        [&] {
            return pytfm__launch_rows(func, softmax_backward_kernel<true>,
                                      softmax_backward_kernel<false>, rows, cols, PYTFM_MAX_BLOCKS,
                                      stream, dx, dy, y, rows, cols);
        });
}
