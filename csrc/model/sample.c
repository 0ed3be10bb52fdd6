/*
 * sample.c — the random numbers of sampling, and drawing a token from logits.
 *
 * The generator is xoshiro256** (Blackman and Vigna, "Scrambled linear pseudorandom number
 * generators", 2018, and their reference code at prng.di.unimi.it), its 256-bit state seeded
 * by four outputs of SplitMix64, as its authors recommend. The stream is part of the API
 * (pytfm.h): the same seed gives the same numbers everywhere.
 *
 * pytfm_sample mirrors pytfm.generate.sample_next for one row, in double precision:
 *   z = (logits − max) / temperature;  z_i = −inf where z_i < the top_k-th largest z
 *   p = exp(z) / Σ exp(z)  (the sum in NumPy's pairwise order);  c = cumsum(p)
 *   token = min(#{i : c_i < u}, vocab − 1),  u = (next >> 11) · 2^-53 (numpy's random())
 * so that, given the same u, it picks the token Python picks. The top_k-th largest z is found
 * among the logits (z is a non-decreasing function of them, so it is f(the top_k-th largest
 * logit)) by a radix select on their bits: four counting passes, no scratch, no bad cases.
 *
 * Only logits[0, vocab) are read: a model whose vocabulary is padded past its tokenizer's
 * (nanoGPT's 50,304 beside GPT-2's 50,257) samples among the tokenizer's ids with vocab = the
 * tokenizer's size on its longer row, never drawing an id that has no bytes (generate.c does;
 * pytfm.generate's sample_vocab is the same cut).
 */
#include <math.h>
#include <string.h>

#include "core/checks.h"

/* ---- the generator -------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256**'s next, as the reference code: never all-zero state from the seeding above
 * (SplitMix64's outputs of four distinct inputs cannot all be 0) */
static uint64_t xoshiro256ss(uint64_t s[4]) {
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

pytfm_status pytfm_rng_seed(pytfm_rng *rng, uint64_t seed) {
    PYTFM_CHECK(rng != NULL, "%s: rng must not be NULL", __func__);
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->state[i] = splitmix64(&x);
    return PYTFM_STATUS_OK;
}

pytfm_status pytfm_rng_next(pytfm_rng *rng, uint64_t *value) {
    PYTFM_CHECK(rng != NULL, "%s: rng must not be NULL", __func__);
    PYTFM_CHECK(value != NULL, "%s: value must not be NULL", __func__);
    *value = xoshiro256ss(rng->state);
    return PYTFM_STATUS_OK;
}

/* ---- sampling ------------------------------------------------------------------------------- */

/* a float's bits as an unsigned key in the order of the values (−0 just below +0) */
static inline uint32_t order_key(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

static inline float key_value(uint32_t key) {
    const uint32_t u = key & 0x80000000u ? key & 0x7fffffffu : ~key;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* the k-th largest of x[0..n) (1 <= k <= n): the key is fixed a byte at a time, from the top,
 * by counting the values that share the bytes fixed so far */
static float kth_largest(const float *x, int64_t n, int64_t k) {
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t count[256] = {0};
        for (int64_t i = 0; i < n; i++) {
            const uint32_t key = order_key(x[i]);
            if ((key & mask) == prefix) count[(key >> shift) & 0xff]++;
        }
        int byte = 255;
        for (; byte > 0 && count[byte] < k; byte--) k -= count[byte];
        prefix |= (uint32_t)byte << shift;
        mask |= 0xffu << shift;
    }
    return key_value(prefix);
}

/* what sample_next computes per logit: z = (logit − max) / temperature in double, and
 * e^z for the kept ones (z >= zk), 0 for the others (e^-inf) */
typedef struct softmax_terms {
    const float *logits;
    double max, temperature, zk;
} softmax_terms;

static inline double term(const softmax_terms *s, int64_t i) {
    const double z = ((double)s->logits[i] - s->max) / s->temperature;
    return z >= s->zk ? exp(z) : 0.0;
}

/* Σ term(i) for i in [i0, i0 + n), in the order of NumPy's pairwise summation
 * (numpy/_core/src/umath/loops_utils.h.src, pairwise_sum, blocks of 128, 8 partial sums), as
 * p.sum(axis=-1) adds a contiguous row (of up to NumPy's buffer size, 8192 elements) */
static double pairwise_sum(const softmax_terms *s, int64_t i0, int64_t n) {
    if (n < 8) {
        double res = 0.0;
        for (int64_t i = 0; i < n; i++) res += term(s, i0 + i);
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = term(s, i0 + j);
        int64_t i = 8;
        for (; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; j++) r[j] += term(s, i0 + i + j);
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += term(s, i0 + i);
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(s, i0, n2) + pairwise_sum(s, i0 + n2, n - n2);
}

pytfm_status pytfm_sample(int64_t *token, const float *logits, int64_t vocab,
                          double temperature, int64_t top_k, pytfm_rng *rng) {
    PYTFM_CHECK(vocab >= 1, "%s: vocab must be >= 1, got %lld", __func__, (long long)vocab);
    PYTFM_CHECK(isfinite(temperature) && temperature >= 0.0,
                "%s: temperature must be finite and >= 0 (0: greedy), got %g", __func__,
                temperature);
    int64_t n = 0;
    PYTFM_CHECK_COUNT(__func__, &n, float, vocab);
    PYTFM_CHECK(token != NULL, "%s: token must not be NULL", __func__);
    PYTFM_CHECK(logits != NULL, "%s: logits must not be NULL", __func__);
    PYTFM_CHECK(rng != NULL || temperature == 0.0,
                "%s: rng must not be NULL when temperature > 0", __func__);
    PYTFM_CHECK_DISJOINT(__func__, 2, PYTFM_NO_INPLACE, PYTFM_NO_INPLACE,
                         PYTFM_SPAN(token, 1, int64_t),
                         PYTFM_SPAN(rng, rng ? 1 : 0, pytfm_rng),
                         PYTFM_SPAN(logits, n, float));
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(logits[i]))
            return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT,
                               "%s: logits must be finite, got logits[%lld] = %g", __func__,
                               (long long)i, (double)logits[i]);
        if (logits[i] > logits[best]) best = i; // the first of equals, as argmax
    }
    if (temperature == 0.0) {
        *token = best;
        return PYTFM_STATUS_OK;
    }
    softmax_terms s = {logits, logits[best], temperature, -INFINITY};
    if (top_k > 0 && top_k < n) {
        const double zk = ((double)kth_largest(logits, n, top_k) - s.max) / s.temperature;
        s.zk = zk;
    }
    const double total = pairwise_sum(&s, 0, n);
    const double u = (double)(xoshiro256ss(rng->state) >> 11) * 0x1.0p-53;
    double c = 0.0; // cumsum(p / total): the first index where it reaches u
    int64_t i = 0;
    for (; i < n; i++) {
        c += term(&s, i) / total;
        if (!(c < u)) break;
    }
    *token = PYTFM_MIN(i, n - 1);
    return PYTFM_STATUS_OK;
}
