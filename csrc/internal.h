/*
 * internal.h — helpers shared by the kernel files; not part of the public API. The library is
 * built with -fvisibility=hidden, so nothing declared here is exported.
 */
#ifndef PYTFM_INTERNAL_H
#define PYTFM_INTERNAL_H

#include <math.h>

#include "pytfm.h"

/* Record a formatted message as this thread's last error and return status. */
pytfm_status pytfm__fail(pytfm_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Argument checks, used at the top of every public function, before anything is written.
 * Each failure names the function and the argument, and says what was expected. */
#define PYTFM_CHECK(cond, ...)                                                                 \
    do {                                                                                       \
        if (!(cond)) return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, __VA_ARGS__);          \
    } while (0)

/* A pointer may be NULL only when its buffer holds no elements. */
#define PYTFM_CHECK_PTR(p, count)                                                              \
    PYTFM_CHECK((p) != NULL || (count) == 0, "%s: %s must not be NULL", __func__, #p)

#define PYTFM_CHECK_MIN(v, lo)                                                                 \
    PYTFM_CHECK((v) >= (lo), "%s: %s must be >= %lld, got %lld", __func__, #v,               \
                (long long)(lo), (long long)(v))

#define PYTFM_CHECK_FINITE(v)                                                                  \
    PYTFM_CHECK(isfinite(v), "%s: %s must be finite, got %g", __func__, #v, (double)(v))

/* Check that every index in ids[0..n) is in [0, limit), allowing `ignore` when allow_ignore.
 * Returns PYTFM_STATUS_OUT_OF_RANGE naming the first bad one. */
pytfm_status pytfm__check_indices(const char *func, const char *name, const int64_t *ids,
                                  int64_t n, int64_t limit, int allow_ignore, int64_t ignore);

#endif /* PYTFM_INTERNAL_H */
