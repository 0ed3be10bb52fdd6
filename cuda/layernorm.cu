/*
 * layernorm.cu — LayerNorm over the last axis on the GPU; the twin of csrc/kernels/layernorm.c.
 *
 *   x, y [rows, cols]; w, b [cols]; mean, rstd [rows] (saved for the backward)
 *   forward:  μ = mean(x), σ² = mean((x − μ)²), rstd = 1/sqrt(σ² + eps), y = (x − μ)·rstd·w + b
 *   backward: g = dy ∘ w;  dx = rstd · (g − mean(g) − x̂ · mean(g ∘ x̂))   (written)
 *             dw += Σ_rows dy ∘ x̂,  db += Σ_rows dy                      (accumulated)
 * Rows of up to 4096 columns are held in registers (pytfm_cuda.cuh's column classes: a warp
 * per row up to 1024 columns, a block of 512 or 1024 threads per row up to 4096), read once,
 * written once, float4 accesses where cols % 4 == 0 and the pointers are 16-byte aligned.
 * Two reductions over the held row (mean, then the centred variance), both over x − x0 (x0
 * the row's first value), as csrc/kernels/fast_impl.h does: when |μ| ≫ σ those differences
 * are small and exact, so no digits of x − μ are lost. A row whose float sums overflow or underflow
 * (PYTFM_LN_FLOAT_SUMS_OK: values past ~1e19, or a tiny spread with eps = 0) is summed again in
 * double, as the CPU kernels do.
 * The backward is one pass over the rows (as llm.c's): each team computes dx for its rows and
 * keeps its columns' dy ∘ x̂ and dy summed over those rows in registers; a block adds its warps'
 * sums in warp order (shared memory) and writes them to scratch, a row of partials per block;
 * then pytfm__column_total_kernel adds the blocks' partials in block order into dw, db. No
 * atomics: the same bits on every run. Rows past 4096 columns take the plain kernels: passes
 * that re-read the row from L1/L2, and dw/db by the two-stage column sum of pytfm_cuda.cuh.
 *
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "pytfm_cuda.cuh"

#ifdef PYTFM_EMULATE
enum { LN_BWD_BLOCKS = PYTFM_MAX_BLOCKS }; // several blocks' partials in the tests
#else
// the backward's blocks, each summing its rows' dw/db partials: 4 an SM of an H200, so that
// the partials (a row of dw and db per block) stay a few per cent of the rows' bytes. A
// constant, not the device's SM count: the order of the sums, so the bits, must not depend on
// the GPU.
enum { LN_BWD_BLOCKS = 4 * 132 };
#endif

/* the row again with double sums, as pytfm__layernorm_forward_row (csrc/kernels/layernorm.c)
 * on the CPU */
template <bool kWarp>
static __device__ void
layernorm_row_double(const pytfm__row_team<kWarp> &team, float *__restrict__ yr,
                     float *__restrict__ mean, float *__restrict__ rstd,
                     const float *__restrict__ xr, const float *__restrict__ w,
                     const float *__restrict__ b, int64_t cols, float eps, double *scratch) {
    double sum = 0.0;
    for (int64_t j = team.rank; j < cols; j += team.size) sum += xr[j];
    const double mu = team.sum(sum, scratch) / (double)cols;
    double ss = 0.0;
    for (int64_t j = team.rank; j < cols; j += team.size) ss += (xr[j] - mu) * (xr[j] - mu);
    const double rs = 1.0 / sqrt(team.sum(ss, scratch) / (double)cols + eps);
    for (int64_t j = team.rank; j < cols; j += team.size)
        yr[j] = (float)((xr[j] - mu) * rs) * w[j] + b[j];
    if (team.rank == 0) {
        *mean = (float)mu;
        *rstd = (float)rs;
    }
}

/* yr[j] = (x − μ)[j]·rs·w[j] + b[j] for the columns a thread holds in v (x − μ), w and b read
 * a float4 (or a float) at a time as each output is made: held as whole rows beside v they
 * would take 2·N more registers, and the 32-floats-a-lane class would spill */
template <int N, bool kWarp>
static __device__ __forceinline__ void
layernorm_affine_store(float *__restrict__ yr, const float (&v)[N], float rs,
                       const float *__restrict__ w, const float *__restrict__ b, int cols, bool vec,
                       const pytfm__row_team<kWarp> &team) {
    if (vec) {
        PYTFM_UNROLL
        for (int k = 0; k < N; k += 4) {
            const int j = pytfm__row_col(team, true, k);
            if (j >= cols) continue;
            const float4 wv = pytfm__load4(w + j), bv = pytfm__load4(b + j);
            pytfm__store4(yr + j, make_float4(v[k] * rs * wv.x + bv.x, v[k + 1] * rs * wv.y + bv.y,
                                              v[k + 2] * rs * wv.z + bv.z,
                                              v[k + 3] * rs * wv.w + bv.w));
        }
    } else {
        PYTFM_UNROLL
        for (int k = 0; k < N; k++) {
            const int j = pytfm__row_col(team, false, k);
            if (j < cols) yr[j] = v[k] * rs * w[j] + b[j];
        }
    }
}

/* the forward of a row in registers: C::N floats per thread of the team (C a column class) */
template <class C, bool kVec>
static __global__ void __launch_bounds__(C::threads)
    layernorm_forward_regs_kernel(float *__restrict__ y, float *__restrict__ mean,
                                  float *__restrict__ rstd, const float *__restrict__ x,
                                  const float *__restrict__ w, const float *__restrict__ b,
                                  int64_t rows, int cols, float eps) {
    __shared__ float scratch[PYTFM_WARP];
    __shared__ double wide_scratch[PYTFM_WARP];
    const pytfm__row_team<C::warp> team;
    constexpr bool vec = kVec; // cols % 4 == 0, pointers aligned (pytfm__rows_vec4)
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *xr = x + r * cols;
        float v[C::N];
        pytfm__row_load(v, xr, cols, vec, team, 0.0f);
        const float x0 = xr[0];
        float sum = 0.0f;
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) {
            v[k] = pytfm__row_col(team, vec, k) < cols ? v[k] - x0 : 0.0f;
            sum += v[k];
        }
        const float d = team.sum(sum, scratch) / (float)cols; // μ − x0
        float ss = 0.0f;
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) {
            v[k] = pytfm__row_col(team, vec, k) < cols ? v[k] - d : 0.0f; // x − μ
            ss += v[k] * v[k];
        }
        ss = team.sum(ss, scratch); // the same total in every thread: one branch for the team
        if (!PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps)) {
            layernorm_row_double(team, y + r * cols, mean + r, rstd + r, xr, w, b, cols, eps,
                                 wide_scratch);
            continue;
        }
        const float rs = rsqrtf(ss / (float)cols + eps);
        layernorm_affine_store<C::N>(y + r * cols, v, rs, w, b, cols, vec, team);
        if (team.rank == 0) {
            mean[r] = x0 + d;
            rstd[r] = rs;
        }
    }
}

/* the plain forward, for rows past the register classes: x re-read by each pass */
template <bool kWarp>
static __global__ void
layernorm_forward_kernel(float *__restrict__ y, float *__restrict__ mean, float *__restrict__ rstd,
                         const float *__restrict__ x, const float *__restrict__ w,
                         const float *__restrict__ b, int64_t rows, int64_t cols, float eps) {
    __shared__ float scratch[32];
    __shared__ double wide_scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        const float x0 = xr[0];
        float sum = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size) sum += xr[j] - x0;
        const float d = team.sum(sum, scratch) / (float)cols; // μ − x0
        float ss = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size)
            ss += (xr[j] - x0 - d) * (xr[j] - x0 - d);
        ss = team.sum(ss, scratch); // the same total in every thread: one branch for the team
        if (!PYTFM_LN_FLOAT_SUMS_OK(ss, cols, eps)) {
            layernorm_row_double(team, yr, mean + r, rstd + r, xr, w, b, cols, eps, wide_scratch);
            continue;
        }
        const float rs = rsqrtf(ss / (float)cols + eps);
        for (int64_t j = team.rank; j < cols; j += team.size)
            yr[j] = (xr[j] - x0 - d) * rs * w[j] + b[j];
        if (team.rank == 0) {
            mean[r] = x0 + d;
            rstd[r] = rs;
        }
    }
}

extern "C" pytfm_status pytfm_layernorm_forward_cuda(float *y, float *mean, float *rstd,
                                                     const float *x, const float *w, const float *b,
                                                     int64_t rows, int64_t cols, float eps,
                                                     void *stream) {
    PYTFM_TRY(pytfm__check_layernorm_forward(__func__, y, mean, rstd, x, w, b, rows, cols, eps));
    if (rows == 0) return PYTFM_STATUS_OK;
    const char *func = __func__; // the lambdas' own __func__ is operator()
    const bool vec = pytfm__rows_vec4(cols, y, x, w, b);
    return pytfm__with_row_class(
        cols,
        [&](auto c) {
            using C = decltype(c);
            return pytfm__launch_row_class(func, c,
                                           vec ? layernorm_forward_regs_kernel<C, true>
                                               : layernorm_forward_regs_kernel<C, false>,
                                           rows, PYTFM_MAX_BLOCKS, stream, y, mean, rstd, x, w, b,
                                           rows, (int)cols, eps);
        },
        [&] {
            return pytfm__launch_rows(func, layernorm_forward_kernel<true>,
                                      layernorm_forward_kernel<false>, rows, cols, PYTFM_MAX_BLOCKS,
                                      stream, y, mean, rstd, x, w, b, rows, cols, eps);
        });
}

/* The backward of rows in registers, dx and the dw/db partials in one pass: partial[blockIdx.x]
 * = (Σ dy ∘ x̂, Σ dy) over the block's rows, [gridDim.x][2][cols]. A thread's registers hold
 * the same columns in every row it takes, so its running sums stay in registers too. */
template <class C, bool kVec>
static __global__ void __launch_bounds__(C::threads)
    layernorm_backward_regs_kernel(float *__restrict__ dx, float *__restrict__ partial,
                                   const float *__restrict__ dy, const float *__restrict__ x,
                                   const float *__restrict__ w, const float *__restrict__ mean,
                                   const float *__restrict__ rstd, int64_t rows, int cols) {
    __shared__ float scratch[2 * PYTFM_WARP];
    // a warp's share of the block's sums, added warp after warp (C::warp only)
    __shared__ float block_sums[C::warp ? 2 : 1][C::warp ? C::N * PYTFM_WARP : 1];
    const pytfm__row_team<C::warp> team;
    constexpr bool vec = kVec; // cols % 4 == 0, pointers aligned (pytfm__rows_vec4)
    float dw_sum[C::N] = {}, db_sum[C::N] = {};
    for (int64_t r = team.first; r < rows; r += team.step) {
        float g[C::N], xh[C::N], wv[C::N];
        pytfm__row_load(g, dy + r * cols, cols, vec, team, 0.0f);
        pytfm__row_load(xh, x + r * cols, cols, vec, team, 0.0f);
        pytfm__row_load(wv, w, cols, vec, team, 0.0f);
        const float mu = mean[r], rs = rstd[r];
        float g_sum = 0.0f, gx_sum = 0.0f;
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) {
            xh[k] = pytfm__row_col(team, vec, k) < cols ? (xh[k] - mu) * rs : 0.0f; // x̂
            dw_sum[k] += g[k] * xh[k];
            db_sum[k] += g[k];
            g[k] *= wv[k]; // dy ∘ w
            g_sum += g[k];
            gx_sum += g[k] * xh[k];
        }
        const pytfm__sum2 t = pytfm__team_sum2(team, g_sum, gx_sum, scratch);
        const float g_mean = t.a / (float)cols, gx_mean = t.b / (float)cols;
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) g[k] = rs * (g[k] - g_mean - xh[k] * gx_mean);
        pytfm__row_store(dx + r * cols, g, cols, vec, team);
    }
    float *pdw = partial + (int64_t)blockIdx.x * 2 * cols, *pdb = pdw + cols;
    if constexpr (C::warp) {
        // the warps' sums in warp order: warp 0 writes, each next one adds, the last stores
        const unsigned warp = threadIdx.x / PYTFM_WARP, warps = blockDim.x / PYTFM_WARP;
        for (unsigned i = 0; i < warps; i++) {
            if (warp == i) PYTFM_UNROLL
            for (int k = 0; k < C::N; k++) {
                const int j = pytfm__row_col(team, vec, k);
                if (j >= cols) continue;
                const float sw = i == 0 ? dw_sum[k] : block_sums[0][j] + dw_sum[k];
                const float sb = i == 0 ? db_sum[k] : block_sums[1][j] + db_sum[k];
                if (i + 1 < warps) {
                    block_sums[0][j] = sw;
                    block_sums[1][j] = sb;
                } else {
                    pdw[j] = sw;
                    pdb[j] = sb;
                }
            }
            __syncthreads();
        }
    } else {
        PYTFM_UNROLL
        for (int k = 0; k < C::N; k++) {
            const int j = pytfm__row_col(team, vec, k);
            if (j < cols) {
                pdw[j] = dw_sum[k];
                pdb[j] = db_sum[k];
            }
        }
    }
}

/* the plain dx, for rows past the register classes; dw/db then by the column sum */
template <bool kWarp>
static __global__ void layernorm_dx_kernel(float *__restrict__ dx, const float *__restrict__ dy,
                                           const float *__restrict__ x, const float *__restrict__ w,
                                           const float *__restrict__ mean,
                                           const float *__restrict__ rstd, int64_t rows,
                                           int64_t cols) {
    __shared__ float scratch[32];
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *dyr = dy + r * cols, *xr = x + r * cols;
        float *dxr = dx + r * cols;
        const float mu = mean[r], rs = rstd[r];
        float g_sum = 0.0f, gx_sum = 0.0f;
        for (int64_t j = team.rank; j < cols; j += team.size) {
            const float g = dyr[j] * w[j];
            g_sum += g;
            gx_sum += g * (xr[j] - mu) * rs;
        }
        const float g_mean = team.sum(g_sum, scratch) / (float)cols;
        const float gx_mean = team.sum(gx_sum, scratch) / (float)cols;
        for (int64_t j = team.rank; j < cols; j += team.size)
            dxr[j] = rs * (dyr[j] * w[j] - g_mean - (xr[j] - mu) * rs * gx_mean);
    }
}

/* dw[j] += Σ_r dy[r, j] x̂[r, j],  db[j] += Σ_r dy[r, j] */
struct dwdb_term {
    enum { K = 2 };
    float *__restrict__ sums[K]; // dw, db
    const float *__restrict__ dy, *__restrict__ x, *__restrict__ mean, *__restrict__ rstd;
    int64_t cols;
    __device__ void operator()(float *t, int64_t r, int64_t j) const {
        const float g = dy[r * cols + j];
        t[0] = g * (x[r * cols + j] - mean[r]) * rstd[r];
        t[1] = g;
    }
};

extern "C" pytfm_status pytfm_layernorm_backward_cuda(float *dx, float *dw, float *db,
                                                      const float *dy, const float *x,
                                                      const float *w, const float *mean,
                                                      const float *rstd, int64_t rows, int64_t cols,
                                                      void *stream) {
    PYTFM_TRY(
        pytfm__check_layernorm_backward(__func__, dx, dw, db, dy, x, w, mean, rstd, rows, cols));
    if (rows == 0) return PYTFM_STATUS_OK;
    const char *func = __func__; // the lambdas' own __func__ is operator()
    const bool vec = pytfm__rows_vec4(cols, dx, dy, x, w);
    return pytfm__with_row_class(
        cols,
        [&](auto c) {
            using C = decltype(c);
            const int64_t blocks = pytfm__blocks(rows, C::rows_per_block, LN_BWD_BLOCKS);
            float *partial;
            PYTFM_TRY(pytfm__stream_scratch(func, &partial, blocks * 2 * cols, stream));
            pytfm_status st = pytfm__launch_row_class(
                func, c,
                vec ? layernorm_backward_regs_kernel<C, true>
                    : layernorm_backward_regs_kernel<C, false>,
                rows, LN_BWD_BLOCKS, stream, dx, partial, dy, x, w, mean, rstd, rows, (int)cols);
            if (st == PYTFM_STATUS_OK)
                st = pytfm__launch_column_total<2>(func, {{dw, db}}, partial, blocks, cols, stream);
            return pytfm__stream_scratch_free(func, partial, st, stream);
        },
        [&] {
            PYTFM_TRY(pytfm__launch_rows(func, layernorm_dx_kernel<true>,
                                         layernorm_dx_kernel<false>, rows, cols, PYTFM_MAX_BLOCKS,
                                         stream, dx, dy, x, w, mean, rstd, rows, cols));
            return pytfm__launch_column_sum(func, dwdb_term{{dw, db}, dy, x, mean, rstd, cols},
                                            rows, cols, stream);
        });
}
