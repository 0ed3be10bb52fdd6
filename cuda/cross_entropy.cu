/*
 * cross_entropy.cu — softmax cross-entropy from logits on the GPU; the twin of
 * csrc/kernels/cross_entropy.c.
 *
 *   logits [rows, vocab], targets [rows], lse [rows] (saved), loss [1] (device memory),
 *   label smoothing ε (0: none)
 *   forward:  lse_i  = max_i + log Σ_j exp(logits_ij − max_i)           (a row kernel)
 *             mean_i = (1/vocab) Σ_j logits_ij, in double, ε != 0 only  (the same row kernel)
 *             loss   = (1/kept) Σ_{i kept} (1 − ε)(lse_i − logits_{i, t_i}) + ε(lse_i − mean_i)
 *                      (one block, fixed order; with ε = 0 the term is lse_i − logits_{i, t_i})
 *   backward: dlogits_ij = s · exp(logits_ij − lse_i) − s·ε/vocab − [j = t_i] · s·(1 − ε),
 *             s = dloss/kept; 0 if the row is ignored; kept = the number of rows not ignored.
 * A warp per row up to 1024 columns, a block of 256 threads per row beyond; the grid walks
 * the rows (up to 65535 blocks, enough to fill the GPU several times).
 *
 * Forward: the max and Σ exp (and Σ x when smoothing) come from ONE read of the row, by an
 * online max/sum (ce_online):
 * each thread keeps (m, s = Σ exp(x − m)) over its share and rescales s by exp(m − m') when a
 * larger value m' arrives; the team then merges the threads' pairs in a fixed tree (the same
 * bits on every run). A row is read as float4 where it is 16-byte aligned: its first 0–3
 * floats up to the boundary ("head") and the last 0–3 ("tail") are read one by one, the rest
 * four at a time, so any vocabulary (50257 too) and any offset view take the vector loads.
 * Backward: one pass per row, read logits once and write dlogits once, float4 where the two
 * rows share their offset from a 16-byte boundary (otherwise float by float). kept is counted
 * once by one block into 8 bytes of stream scratch (the stream's workspace, else
 * cudaMallocAsync) before the row kernel.
 *
 * A target outside [0, vocab) that is not ignore_index is not checked on the host (it is
 * device memory): the loss becomes NaN.
 *
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "pytfm_cuda.cuh"

// 6 blocks of 256 threads an SM (1536 threads): at most 40 registers a thread, no spills; the
// smoothed kernels (a double sum, or two more constants, live in the row loop) 5: at most 48
enum { CE_THREADS = 256, CE_MIN_BLOCKS = 6, CE_SMOOTH_MIN_BLOCKS = 5, CE_WARP_VOCAB = 1024 };

/* ---- the online max/sum ------------------------------------------------------------------ */

/* max and sum = Σ exp(x − max) over the values added so far. A larger value rescales the sum
 * first, so the row is read once; -inf values add 0, a +inf or NaN value makes the sum NaN, as
 * the CPU's two passes do (exp(inf − inf), exp(NaN)). */
struct ce_online {
    // {-INFINITY, 0} before the first value; an aggregate (no constructor): it lives in
    // shared memory too
    float max, sum;

    __device__ __forceinline__ void raise(float m) { // max ← m if larger, sum rescaled
        if (m > max) {
            sum *= expf(max - m);
            max = m;
        }
    }
    __device__ __forceinline__ void add(float x) {
        raise(x);
        sum += expf(x - max);
    }
    __device__ __forceinline__ void add4(float4 v) {
        raise(fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
        sum += expf(v.x - max);
        sum += expf(v.y - max);
        sum += expf(v.z - max);
        sum += expf(v.w - max);
    }
    /* this ∪ o. Symmetric to the bit (a + b == b + a), so both lanes of a butterfly agree;
     * a side with max == the new max is not rescaled (keeps −inf − −inf out). */
    __device__ __forceinline__ void merge(const ce_online &o) {
        const float m = fmaxf(max, o.max);
        const float a = max == m ? 1.0f : expf(max - m), b = o.max == m ? 1.0f : expf(o.max - m);
        sum = sum * a + o.sum * b;
        max = m;
    }
};

/* The team's merged (max, sum): every lane of a warp team; thread 0 of a block team. */
template <bool kWarp>
static __device__ ce_online ce_team_merge(ce_online acc, ce_online *scratch /* [32] */) {
    for (int o = PYTFM_WARP / 2; o > 0; o >>= 1) {
        ce_online other;
        other.max = __shfl_xor_sync(0xffffffffu, acc.max, o);
        other.sum = __shfl_xor_sync(0xffffffffu, acc.sum, o);
        acc.merge(other);
    }
    if constexpr (!kWarp) {
        if (threadIdx.x % PYTFM_WARP == 0) scratch[threadIdx.x / PYTFM_WARP] = acc;
        __syncthreads();
        if (threadIdx.x == 0)
            for (unsigned w = 1; w < blockDim.x / PYTFM_WARP; w++) acc.merge(scratch[w]);
        __syncthreads(); // scratch is free for the next row
    }
    return acc;
}

/* The floats of row before its first 16-byte boundary (0–3; the whole row when shorter), or
 * the whole row when it cannot be read as float4 at all. */
static __device__ __forceinline__ int64_t ce_head(const float *row, int64_t cols, bool vec) {
    const int64_t head = vec ? (int64_t)((16u - ((uintptr_t)row & 15u)) & 15u) / 4 : cols;
    return head < cols ? head : cols;
}

/* Σ of a float4 in double (label smoothing's row mean) */
static __device__ __forceinline__ double ce_sum4(float4 v) {
    return ((double)v.x + (double)v.y) + ((double)v.z + (double)v.w);
}

/* The row's (max, Σ exp(x − max)) for the team, from one read: float4s of [head, head + 4·nv)
 * four at a time (four loads in flight per thread), the 0–3 floats either side one by one.
 * kSum: also *total = Σ x in double (every rank of the team gets it; dscratch: 32 doubles of
 * shared memory for a block team), from the same read. */
template <bool kWarp, bool kSum>
static __device__ ce_online ce_row_online(const pytfm__row_team<kWarp> &team,
                                          const float *__restrict__ row, int64_t cols, bool vec,
                                          ce_online *scratch, double *total, double *dscratch) {
    const int64_t head = ce_head(row, cols, vec), nv = (cols - head) / 4;
    const float *body = row + head;
    ce_online acc = {-INFINITY, 0.0f};
    double sum = 0.0;
    int64_t v = team.rank;
    for (; v + 3 * (int64_t)team.size < nv; v += 4 * (int64_t)team.size) {
        const float4 a = pytfm__load4(body + 4 * v), b = pytfm__load4(body + 4 * (v + team.size)),
                     c = pytfm__load4(body + 4 * (v + 2 * team.size)),
                     d = pytfm__load4(body + 4 * (v + 3 * team.size));
        acc.add4(a);
        acc.add4(b);
        acc.add4(c);
        acc.add4(d);
        if constexpr (kSum) sum += (ce_sum4(a) + ce_sum4(b)) + (ce_sum4(c) + ce_sum4(d));
    }
    for (; v < nv; v += team.size) {
        const float4 a = pytfm__load4(body + 4 * v);
        acc.add4(a);
        if constexpr (kSum) sum += ce_sum4(a);
    }
    for (int64_t j = team.rank; j < head; j += team.size) {
        acc.add(row[j]);
        if constexpr (kSum) sum += row[j];
    }
    for (int64_t j = head + 4 * nv + team.rank; j < cols; j += team.size) {
        acc.add(row[j]);
        if constexpr (kSum) sum += row[j];
    }
    if constexpr (kSum) *total = team.sum(sum, dscratch);
    (void)total, (void)dscratch;
    return ce_team_merge<kWarp>(acc, scratch);
}

/* lse [rows]; kSum: mean [rows] too (label smoothing), else mean unwritten (NULL) */
template <bool kWarp, bool kSum>
static __global__ void __launch_bounds__(CE_THREADS, kSum ? CE_SMOOTH_MIN_BLOCKS : CE_MIN_BLOCKS)
    cross_entropy_lse_kernel(float *__restrict__ lse, double *__restrict__ mean,
                             const float *__restrict__ logits, int64_t rows, int64_t vocab) {
    __shared__ ce_online scratch[32];
    __shared__ double dscratch[kSum ? 32 : 1];
    const pytfm__row_team<kWarp> team;
    const bool vec = ((uintptr_t)logits & 3u) == 0; // floats (always, from CuPy): float4 inside
    for (int64_t r = team.first; r < rows; r += team.step) {
        double total = 0.0;
        const ce_online row = ce_row_online<kWarp, kSum>(team, logits + r * vocab, vocab, vec,
                                                         scratch, &total, dscratch);
        if (team.rank == 0) {
            lse[r] = row.max + logf(row.sum);
            if constexpr (kSum) mean[r] = total / (double)vocab;
        }
    }
}

/* a kept row's loss from its lse l, target logit and mean (unread with eps = 0), as the CPU */
static __device__ __forceinline__ double ce_row_loss(double l, double target_logit,
                                                     const double *mean, int64_t i, double eps) {
    if (eps == 0.0) return l - target_logit;
    return (1.0 - eps) * (l - target_logit) + eps * (l - mean[i]);
}

/* one block: the mean of the kept rows' losses in a fixed order; mean [rows] the rows' means
 * (label_smoothing != 0 only, else NULL) */
static __global__ void cross_entropy_loss_kernel(float *__restrict__ loss,
                                                 const float *__restrict__ lse,
                                                 const double *__restrict__ mean,
                                                 const float *__restrict__ logits,
                                                 const int64_t *__restrict__ targets, int64_t rows,
                                                 int64_t vocab, int64_t ignore_index,
                                                 float label_smoothing) {
    __shared__ double scratch[32];
    double total = 0.0, kept = 0.0;
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
        const int64_t t = targets[i];
        if (t == ignore_index) continue;
        total += t >= 0 && t < vocab ? ce_row_loss(lse[i], logits[i * vocab + t], mean, i,
                                                   label_smoothing)
                                     : (double)NAN;
        kept += 1.0;
    }
    total = pytfm__block_sum(total, scratch);
    kept = pytfm__block_sum(kept, scratch);
    if (threadIdx.x == 0) *loss = kept > 0.0 ? (float)(total / kept) : 0.0f;
}

/* blocks for rows: 8 rows a block (a warp each) up to CE_WARP_VOCAB columns, else one */
static unsigned ce_blocks(int64_t rows, int64_t vocab) {
    return pytfm__blocks(rows, vocab <= CE_WARP_VOCAB ? CE_THREADS / PYTFM_WARP : 1,
                         PYTFM_MAX_BLOCKS);
}

/* both forwards after their checks, errors naming func: with label_smoothing != 0 the rows'
 * means go to stream scratch between the two kernels */
static pytfm_status ce_forward(const char *func, float *loss, float *lse, const float *logits,
                               const int64_t *targets, int64_t rows, int64_t vocab,
                               int64_t ignore_index, float label_smoothing, void *stream) {
    const dim3 grid(ce_blocks(rows, vocab)), block(CE_THREADS);
    const bool warp = vocab <= CE_WARP_VOCAB;
    if (rows == 0 || label_smoothing == 0.0f) {
        if (rows > 0)
            PYTFM_TRY(pytfm__launch(func,
                                    warp ? cross_entropy_lse_kernel<true, false>
                                         : cross_entropy_lse_kernel<false, false>,
                                    grid, block, 0, stream, lse, (double *)nullptr, logits, rows,
                                    vocab));
        return pytfm__launch(func, cross_entropy_loss_kernel, dim3(1), block, 0, stream, loss,
                             (const float *)lse, (const double *)nullptr, logits, targets, rows,
                             vocab, ignore_index, label_smoothing);
    }
    double *mean = nullptr;
    PYTFM_TRY(pytfm__stream_scratch(func, &mean, rows, stream));
    pytfm_status st = pytfm__launch(func,
                                    warp ? cross_entropy_lse_kernel<true, true>
                                         : cross_entropy_lse_kernel<false, true>,
                                    grid, block, 0, stream, lse, mean, logits, rows, vocab);
    if (st == PYTFM_STATUS_OK)
        st = pytfm__launch(func, cross_entropy_loss_kernel, dim3(1), block, 0, stream, loss,
                           (const float *)lse, (const double *)mean, logits, targets, rows, vocab,
                           ignore_index, label_smoothing);
    return pytfm__stream_scratch_free(func, mean, st, stream);
}

extern "C" pytfm_status pytfm_cross_entropy_smoothed_forward_cuda(
    float *loss, float *lse, const float *logits, const int64_t *targets, int64_t rows,
    int64_t vocab, int64_t ignore_index, float label_smoothing, void *stream) {
    PYTFM_TRY(
        pytfm__check_cross_entropy_forward(__func__, loss, lse, logits, targets, rows, vocab));
    PYTFM_TRY(pytfm__check_label_smoothing(__func__, label_smoothing));
    return ce_forward(__func__, loss, lse, logits, targets, rows, vocab, ignore_index,
                      label_smoothing, stream);
}

extern "C" pytfm_status pytfm_cross_entropy_forward_cuda(float *loss, float *lse,
                                                         const float *logits,
                                                         const int64_t *targets, int64_t rows,
                                                         int64_t vocab, int64_t ignore_index,
                                                         void *stream) {
    PYTFM_TRY(
        pytfm__check_cross_entropy_forward(__func__, loss, lse, logits, targets, rows, vocab));
    return ce_forward(__func__, loss, lse, logits, targets, rows, vocab, ignore_index, 0.0f,
                      stream);
}

/* ---- backward ------------------------------------------------------------------------------ */

/* one block: *kept = the number of targets that are not ignore_index (integers: exact) */
static __global__ void cross_entropy_count_kernel(long long *__restrict__ kept_out,
                                                  const int64_t *__restrict__ targets, int64_t rows,
                                                  int64_t ignore_index) {
    __shared__ long long scratch[32];
    long long kept = 0;
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) kept += targets[i] != ignore_index;
    kept = pytfm__block_sum(kept, scratch);
    if (threadIdx.x == 0) *kept_out = kept;
}

/* dlogits of one element: scale · exp(x − l), less off (kSmooth), less on at the target, as
 * the CPU computes (on = scale·(1 − ε), off = scale·ε/vocab; without smoothing on = scale) */
template <bool kSmooth>
static __device__ __forceinline__ float ce_grad(float x, int64_t j, int64_t t, float l,
                                                float scale, float on, float off) {
    float g = scale * expf(x - l);
    if constexpr (kSmooth) g -= off;
    (void)off;
    return j == t ? g - on : g;
}

/* kSmooth: label_smoothing != 0 (else it is unread) */
template <bool kWarp, bool kSmooth>
static __global__ void __launch_bounds__(CE_THREADS,
                                         kSmooth ? CE_SMOOTH_MIN_BLOCKS : CE_MIN_BLOCKS)
    cross_entropy_backward_kernel(float *__restrict__ dlogits, const float *__restrict__ logits,
                                  const int64_t *__restrict__ targets,
                                  const float *__restrict__ lse, const long long *__restrict__ kept,
                                  int64_t rows, int64_t vocab, int64_t ignore_index,
                                  float label_smoothing, float dloss) {
    const float scale = *kept ? dloss / (float)*kept : 0.0f;
    const float on = kSmooth ? scale * (1.0f - label_smoothing) : scale;
    const float off = kSmooth ? scale * label_smoothing / (float)vocab : 0.0f;
    // float4 needs the two rows at one offset from a 16-byte boundary (then every row is)
    const bool vec = (((uintptr_t)logits | (uintptr_t)dlogits) & 3u) == 0 &&
                     (((uintptr_t)logits ^ (uintptr_t)dlogits) & 15u) == 0;
    const pytfm__row_team<kWarp> team;
    for (int64_t r = team.first; r < rows; r += team.step) {
        const float *row = logits + r * vocab;
        float *drow = dlogits + r * vocab;
        const int64_t t = targets[r], head = ce_head(row, vocab, vec), nv = (vocab - head) / 4;
        const float *body = row + head;
        float *dbody = drow + head;
        if (t == ignore_index) { // nothing to learn from this row: zeros, logits unread
            const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int64_t v = team.rank; v < nv; v += team.size) pytfm__store4(dbody + 4 * v, zero);
            for (int64_t j = team.rank; j < head; j += team.size) drow[j] = 0.0f;
            for (int64_t j = head + 4 * nv + team.rank; j < vocab; j += team.size) drow[j] = 0.0f;
            continue;
        }
        const float l = lse[r];
        for (int64_t v = team.rank; v < nv; v += team.size) {
            const float4 x = pytfm__load4(body + 4 * v);
            const int64_t j = head + 4 * v;
            pytfm__store4(dbody + 4 * v,
                          make_float4(ce_grad<kSmooth>(x.x, j, t, l, scale, on, off),
                                      ce_grad<kSmooth>(x.y, j + 1, t, l, scale, on, off),
                                      ce_grad<kSmooth>(x.z, j + 2, t, l, scale, on, off),
                                      ce_grad<kSmooth>(x.w, j + 3, t, l, scale, on, off)));
        }
        for (int64_t j = team.rank; j < head; j += team.size)
            drow[j] = ce_grad<kSmooth>(row[j], j, t, l, scale, on, off);
        for (int64_t j = head + 4 * nv + team.rank; j < vocab; j += team.size)
            drow[j] = ce_grad<kSmooth>(row[j], j, t, l, scale, on, off);
    }
}

/* both backwards after their checks, errors naming func */
static pytfm_status ce_backward(const char *func, float *dlogits, const float *logits,
                                const int64_t *targets, const float *lse, int64_t rows,
                                int64_t vocab, int64_t ignore_index, float label_smoothing,
                                float dloss, void *stream) {
    if (rows == 0) return PYTFM_STATUS_OK;
    long long *kept = NULL;
    PYTFM_TRY(pytfm__stream_scratch(func, &kept, 1, stream));
    pytfm_status st = pytfm__launch(func, cross_entropy_count_kernel, dim3(1), dim3(1024), 0,
                                    stream, kept, targets, rows, ignore_index);
    if (st == PYTFM_STATUS_OK) {
        const long long *k = kept;
        const bool warp = vocab <= CE_WARP_VOCAB, smooth = label_smoothing != 0.0f;
        st = pytfm__launch(func,
                           warp ? (smooth ? cross_entropy_backward_kernel<true, true>
                                          : cross_entropy_backward_kernel<true, false>)
                                : (smooth ? cross_entropy_backward_kernel<false, true>
                                          : cross_entropy_backward_kernel<false, false>),
                           dim3(ce_blocks(rows, vocab)), dim3(CE_THREADS), 0, stream, dlogits,
                           logits, targets, lse, k, rows, vocab, ignore_index, label_smoothing,
                           dloss);
    }
    return pytfm__stream_scratch_free(func, kept, st, stream);
}

extern "C" pytfm_status pytfm_cross_entropy_smoothed_backward_cuda(
    float *dlogits, const float *logits, const int64_t *targets, const float *lse, int64_t rows,
    int64_t vocab, int64_t ignore_index, float label_smoothing, float dloss, void *stream) {
    PYTFM_TRY(pytfm__check_cross_entropy_backward(__func__, dlogits, logits, targets, lse, rows,
                                                  vocab, dloss));
    PYTFM_TRY(pytfm__check_label_smoothing(__func__, label_smoothing));
    return ce_backward(__func__, dlogits, logits, targets, lse, rows, vocab, ignore_index,
                       label_smoothing, dloss, stream);
}

extern "C" pytfm_status pytfm_cross_entropy_backward_cuda(float *dlogits, const float *logits,
                                                          const int64_t *targets, const float *lse,
                                                          int64_t rows, int64_t vocab,
                                                          int64_t ignore_index, float dloss,
                                                          void *stream) {
    PYTFM_TRY(pytfm__check_cross_entropy_backward(__func__, dlogits, logits, targets, lse, rows,
                                                  vocab, dloss));
    return ce_backward(__func__, dlogits, logits, targets, lse, rows, vocab, ignore_index, 0.0f,
                       dloss, stream);
}
