/*
 * embedding.cu — table lookup on the GPU; the twin of csrc/kernels/embedding.c.
 *
 *   ids [rows], table [vocab, dim], y [rows, dim]
 *   forward:  y[i, :] = table[ids[i], :]       (a thread per float4 of y where aligned, else
 *                                               per float)
 *   backward: dtable[ids[i], :] += dy[i, :]     (a scatter-add; rows of repeated ids add up, in
 *                                               order of i: the same bits as the CPU twin)
 * ids are device memory and not checked on the host: an id outside [0, vocab) gives a NaN row
 * in the forward and is skipped by the backward.
 *
 * Backward, the sorted path (rows > PLAIN_ROWS): the ids are grouped by value, then each
 * group's rows of dy are added into its row of dtable in order of position. No atomics, and
 * no two threads touch one element of dtable, so the bits are the CPU's on every run.
 *   1. keys: key_i = id_i · 2^32 + i (an id outside [0, vocab) counts as vocab, sorted last),
 *      unique, so sorting them orders by id and, within an id, by position: no stability
 *      needed. Each block sorts a tile of SORT_TILE keys in shared memory (a bitonic network).
 *   2. merge passes: runs of w keys, pairwise into runs of 2w; each key's place is its index
 *      in its run plus the number of keys of the other run below it (a binary search), so
 *      every key is placed independently (log2(rows / SORT_TILE) passes, ping-pong buffers).
 *   3. accumulate: a thread per (sorted slot k, float4 of a row); the thread whose slot starts a
 *      group (k = 0 or another id at k − 1) loads dtable's row chunk, adds the group's dy
 *      chunks in order (the keys and dy loads of 8 slots issued before their additions), and
 *      stores it; the other threads return at once.
 * Scratch: 2·rows keys of 8 bytes (the stream's workspace, else cudaMallocAsync). The plain
 * path, a thread per column walking every id in order (the plain kernel), serves rows ≤
 * PLAIN_ROWS (one or two launches fewer; a few dependent steps) and sizes whose keys do not
 * fit 64 bits (rows or vocab ≥ 2^31).
 *
 * Its expected speed on an H200 (an estimate, with its method): docs/performance.md.
 */
#include "pytfm_cuda.cuh"

enum { EMB_THREADS = 256, PLAIN_ROWS = 16, GROUP_UNROLL = 8 };

/* keys a block sorts in shared memory (8 bytes each; 32 KiB on the GPU); the emulator sorts
 * 256 so that the tests' few hundred rows walk several tiles and merge passes */
#ifdef PYTFM_EMULATE
enum { SORT_TILE = 256 };
#else
enum { SORT_TILE = 4096 };
#endif
enum { SORT_THREADS = SORT_TILE / 4 }; // each compares two pairs per step

template <bool kVec>
static __global__ void embedding_forward_kernel(float *__restrict__ y,
                                                const int64_t *__restrict__ ids,
                                                const float *__restrict__ table, int64_t rows,
                                                int64_t vocab, int64_t dim) {
    const int64_t width = kVec ? dim / 4 : dim; // units (float4s or floats) of a row
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * width;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / width, c = kVec ? 4 * (e % width) : e % width, id = ids[i];
        const bool ok = id >= 0 && id < vocab;
        if constexpr (kVec)
            pytfm__store4(y + i * dim + c, ok ? pytfm__load4(table + id * dim + c)
                                              : make_float4(NAN, NAN, NAN, NAN));
        else
            y[i * dim + c] = ok ? table[id * dim + c] : NAN;
    }
}

/* float4 for rows that start on 16-byte boundaries: dim a multiple of 4, the bases aligned */
static bool embedding_vec(const float *a, const float *b, int64_t dim) {
    return dim % 4 == 0 && ((uintptr_t)a & 15u) == 0 && ((uintptr_t)b & 15u) == 0;
}

extern "C" pytfm_status pytfm_embedding_forward_cuda(float *y, const int64_t *ids,
                                                     const float *table, int64_t rows,
                                                     int64_t vocab, int64_t dim, void *stream) {
    PYTFM_TRY(pytfm__check_embedding_forward(__func__, y, ids, table, rows, vocab, dim));
    if (rows == 0) return PYTFM_STATUS_OK;
    const bool vec = embedding_vec(y, table, dim);
    return PYTFM_LAUNCH(
        vec ? embedding_forward_kernel<true> : embedding_forward_kernel<false>,
        dim3(pytfm__blocks(rows * (vec ? dim / 4 : dim), EMB_THREADS, PYTFM_MAX_BLOCKS)),
        dim3(EMB_THREADS), 0, stream, y, ids, table, rows, vocab, dim);
}

/* ---- backward, plain: a thread per column walks the ids in order ------------------------ */

static __global__ void embedding_backward_plain_kernel(float *__restrict__ dtable,
                                                       const float *__restrict__ dy,
                                                       const int64_t *__restrict__ ids,
                                                       int64_t rows, int64_t vocab, int64_t dim) {
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < dim;
         j += (int64_t)gridDim.x * blockDim.x)
        for (int64_t i = 0; i < rows; i++) {
            const int64_t id = ids[i];
            if (id >= 0 && id < vocab) dtable[id * dim + j] += dy[i * dim + j];
        }
}

/* ---- backward, sorted: group the ids, then add each group in order ---------------------- */

typedef unsigned long long emb_key; // id · 2^32 + position

static __device__ __forceinline__ int64_t key_id(emb_key k) { return (int64_t)(k >> 32); }
static __device__ __forceinline__ int64_t key_pos(emb_key k) { return (int64_t)(k & 0xffffffffu); }

/* keys [b·SORT_TILE, ...) of the ids, sorted within the tile of block b */
static __global__ void __launch_bounds__(SORT_THREADS)
    embedding_sort_tiles_kernel(emb_key *__restrict__ keys, const int64_t *__restrict__ ids,
                                int64_t rows, int64_t vocab) {
    __shared__ emb_key s[SORT_TILE];
    const int64_t base = (int64_t)blockIdx.x * SORT_TILE;
    for (int i = threadIdx.x; i < SORT_TILE; i += blockDim.x) {
        const int64_t p = base + i;
        const int64_t id = p < rows ? ids[p] : 0;
        // past the end: the largest key (sorted last, never written back)
        s[i] = p >= rows ? ~0ull : (emb_key)(id >= 0 && id < vocab ? id : vocab) << 32 | (emb_key)p;
    }
    __syncthreads();
    // the bitonic network: in step (k, j), i and i + j (i with bit j clear) are ordered
    // ascending where bit k of i is clear, descending where it is set
    for (int k = 2; k <= SORT_TILE; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int p = threadIdx.x; p < SORT_TILE / 2; p += blockDim.x) {
                const int i = 2 * p - (p & (j - 1)), l = i + j;
                const emb_key a = s[i], b = s[l];
                if ((a > b) == ((i & k) == 0)) s[i] = b, s[l] = a;
            }
            __syncthreads();
        }
    for (int i = threadIdx.x; i < SORT_TILE && base + i < rows; i += blockDim.x)
        keys[base + i] = s[i];
}

/* runs of `width` sorted keys of in, merged pairwise into out (runs of 2·width): a key's
 * place is its index in its run plus the count of the partner run's keys below it */
static __global__ void embedding_merge_kernel(emb_key *__restrict__ out,
                                              const emb_key *__restrict__ in, int64_t n,
                                              int64_t width) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t run = e / width, start = run * width, left = run & 1 ? start - width : start;
        const int64_t other = run & 1 ? start - width : start + width; // the partner run
        const emb_key key = in[e];
        // the first partner key above key (none: the last run, unpaired, has hi ≤ lo, rank 0)
        int64_t lo = other, hi = other + width < n ? other + width : n;
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (in[mid] < key)
                lo = mid + 1;
            else
                hi = mid;
        }
        out[left + (e - start) + (lo - other)] = key;
    }
}

/* a thread per (sorted slot k, unit c of a row): the first slot of each id's group adds the
 * group's dy rows into dtable's row in order of position */
template <bool kVec>
static __global__ void __launch_bounds__(EMB_THREADS)
    embedding_accumulate_kernel(float *__restrict__ dtable, const float *__restrict__ dy,
                                const emb_key *__restrict__ keys, int64_t rows, int64_t vocab,
                                int64_t dim) {
    const int64_t width = kVec ? dim / 4 : dim;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * width;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = e / width, c = kVec ? 4 * (e % width) : e % width;
        const int64_t id = key_id(keys[k]);
        if (id >= vocab) continue;                        // a bad id (all sorted last)
        if (k > 0 && key_id(keys[k - 1]) == id) continue; // not the first of its group
        float *out = dtable + id * dim + c;
        float4 acc = kVec ? pytfm__load4(out) : make_float4(*out, 0.0f, 0.0f, 0.0f);
        for (int64_t m = k;; m += GROUP_UNROLL) {
            // the next GROUP_UNROLL slots: keys, then their loads, then the adds in order
            emb_key kk[GROUP_UNROLL];
            float4 v[GROUP_UNROLL];
            for (int u = 0; u < GROUP_UNROLL; u++) kk[u] = m + u < rows ? keys[m + u] : ~0ull;
            for (int u = 0; u < GROUP_UNROLL; u++) {
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (key_id(kk[u]) != id) continue;
                const float *src = dy + key_pos(kk[u]) * dim + c;
                v[u] = kVec ? pytfm__load4(src) : make_float4(*src, 0.0f, 0.0f, 0.0f);
            }
            for (int u = 0; u < GROUP_UNROLL; u++)
                if (key_id(kk[u]) == id) { // the group's slots are consecutive: a prefix
                    acc.x += v[u].x;
                    acc.y += v[u].y;
                    acc.z += v[u].z;
                    acc.w += v[u].w;
                }
            if (key_id(kk[GROUP_UNROLL - 1]) != id) break;
        }
        if constexpr (kVec)
            pytfm__store4(out, acc);
        else
            *out = acc.x;
    }
}

static pytfm_status embedding_backward_sorted(const char *func, float *dtable, const float *dy,
                                              const int64_t *ids, int64_t rows, int64_t vocab,
                                              int64_t dim, void *stream) {
    emb_key *keys = NULL;
    PYTFM_TRY(pytfm__stream_scratch(func, &keys, 2 * rows, stream));
    emb_key *in = keys, *out = keys + rows;
    pytfm_status st = pytfm__launch(func, embedding_sort_tiles_kernel,
                                    dim3(pytfm__blocks(rows, SORT_TILE, 1u << 30)),
                                    dim3(SORT_THREADS), 0, stream, in, ids, rows, vocab);
    for (int64_t width = SORT_TILE; st == PYTFM_STATUS_OK && width < rows; width *= 2) {
        st = pytfm__launch(func, embedding_merge_kernel,
                           dim3(pytfm__blocks(rows, EMB_THREADS, PYTFM_MAX_BLOCKS)),
                           dim3(EMB_THREADS), 0, stream, out, (const emb_key *)in, rows, width);
        emb_key *t = in;
        in = out, out = t;
    }
    const bool vec = embedding_vec(dtable, dy, dim);
    if (st == PYTFM_STATUS_OK)
        st = pytfm__launch(
            func, vec ? embedding_accumulate_kernel<true> : embedding_accumulate_kernel<false>,
            dim3(pytfm__blocks(rows * (vec ? dim / 4 : dim), EMB_THREADS, PYTFM_MAX_BLOCKS)),
            dim3(EMB_THREADS), 0, stream, dtable, dy, (const emb_key *)in, rows, vocab, dim);
    return pytfm__stream_scratch_free(func, keys, st, stream);
}

extern "C" pytfm_status pytfm_embedding_backward_cuda(float *dtable, const float *dy,
                                                      const int64_t *ids, int64_t rows,
                                                      int64_t vocab, int64_t dim, void *stream) {
    PYTFM_TRY(pytfm__check_embedding_backward(__func__, dtable, dy, ids, rows, vocab, dim));
    if (rows == 0) return PYTFM_STATUS_OK;
    // keys hold id (or vocab, for a bad id) and position in 32 bits each
    if (rows > PLAIN_ROWS && rows < (1ll << 31) && vocab < (1ll << 31))
        return embedding_backward_sorted(__func__, dtable, dy, ids, rows, vocab, dim, stream);
    return PYTFM_LAUNCH(embedding_backward_plain_kernel,
                        dim3(pytfm__blocks(dim, 64, PYTFM_MAX_BLOCKS)), dim3(64), 0, stream, dtable,
                        dy, ids, rows, vocab, dim);
}
