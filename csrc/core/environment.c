/*
 * environment.c — PYTFM_NUM_THREADS and PYTFM_MAX_ISA: the environment's say in the library's
 * two process-wide settings, read once, at the first use of either (a get or a set of the
 * thread count or the ISA cap, which all call pytfm__read_environment first), so that a C
 * program gets what `import pytfm` gives a Python one. A set call later wins, as in Python.
 * The values mean what pytfm_set_num_threads and pytfm_set_max_isa take, read as Python's
 * pytfm reads them (pytfm/_core.py), surrounding spaces ignored, empty as unset:
 *   PYTFM_NUM_THREADS  an integer in [0, 2^31) (0: the default)
 *   PYTFM_MAX_ISA      auto, plain, portable, avx2, avx512 or avx512_bf16 (pytfm_isa's order)
 * A value that is none of those is ignored. pytfm_read_environment, which reads them at once,
 * returns that as an error (`import pytfm` calls it first, and raises ValueError); where the
 * first reading is implicit instead, the problem belongs to no call that could return it, and
 * one line on stderr names the variable, its value and what it should be, as libgomp does for
 * a bad OMP_NUM_THREADS.
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *const isa_names[] = {"auto", "plain", "portable", "avx2", "avx512",
                                        "avx512_bf16"}; /* pytfm_isa's values, in order */

/* name's value without surrounding spaces into buf (NULL: unset or empty) */
static const char *value_of(const char *name, char *buf, size_t size) {
    const char *v = getenv(name);
    if (!v) return NULL;
    while (isspace((unsigned char)*v)) v++;
    size_t n = strlen(v);
    while (n > 0 && isspace((unsigned char)v[n - 1])) n--;
    if (n == 0) return NULL;
    snprintf(buf, size, "%.*s", (int)(n < size ? n : size - 1), v);
    return buf;
}

/* the first bad variable: its name, value and what it must be (name NULL: none) */
static struct {
    const char *name, *wanted;
    char value[64];
} bad;
static atomic_int asked; /* pytfm_read_environment was called: it reports, not stderr */
static pthread_once_t once = PTHREAD_ONCE_INIT, told = PTHREAD_ONCE_INIT;

static void ignored(const char *name, const char *value, const char *wanted) {
    if (bad.name) return;
    bad.name = name, bad.wanted = wanted;
    snprintf(bad.value, sizeof bad.value, "%s", value);
}

static void tell(void) {
    if (bad.name)
        fprintf(stderr, "pytfm: %s=%s ignored: it must be %s\n", bad.name, bad.value, bad.wanted);
}

static void read_environment(void) {
    char buf[64], *end;
    const char *threads = value_of("PYTFM_NUM_THREADS", buf, sizeof buf);
    if (threads) {
        errno = 0;
        const long long n = strtoll(threads, &end, 10);
        if (*end != '\0' || errno == ERANGE || n < 0 || n > INT32_MAX)
            ignored("PYTFM_NUM_THREADS", threads, "an integer in [0, 2147483647] (0: the default)");
        else
            pytfm__store_num_threads((int32_t)n);
    }
    const char *isa = value_of("PYTFM_MAX_ISA", buf, sizeof buf);
    if (isa) {
        int32_t i = PYTFM_ISA_AVX512_BF16;
        while (i >= PYTFM_ISA_AUTO && strcmp(isa, isa_names[i])) i--;
        if (i < PYTFM_ISA_AUTO)
            ignored("PYTFM_MAX_ISA", isa,
                    "one of auto, plain, portable, avx2, avx512, avx512_bf16");
        else
            pytfm__store_max_isa(i);
    }
}

void pytfm__read_environment(void) {
    pthread_once(&once, read_environment);
    if (!atomic_load(&asked)) pthread_once(&told, tell);
}

pytfm_status pytfm_read_environment(void) {
    atomic_store(&asked, 1);
    pthread_once(&once, read_environment);
    if (!bad.name) return PYTFM_STATUS_OK;
    return pytfm__fail(PYTFM_STATUS_INVALID_ARGUMENT, "%s='%s': it must be %s",
                       bad.name, bad.value, bad.wanted);
}
