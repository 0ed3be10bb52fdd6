/*
 * free_cores.c — the default thread count: OpenMP's (OMP_NUM_THREADS, else this process's
 * cores), but no more than the cores that other processes leave free; and the team a parallel
 * loop runs under an explicit count within this process's cores, capped the same way.
 *
 * Why: every parallel region ends at a barrier, so a team runs at the pace of its slowest
 * thread. When another process keeps a core busy, the thread that shares that core gets a
 * fraction of it, and the team's spinning waiters take still more: two threads can run slower
 * than one (bench/busy.py measures it; docs/performance.md). Results do not depend on the
 * thread count, so the default count may follow the load.
 *
 * How: the number of runnable tasks on the machine (/proc/loadavg's fourth field) minus this
 * process's own runnable threads (/proc/self/task/<tid>/stat) is what others run; the free cores
 * are this process's cores minus that, at least one. Sampled at most every 100 ms (a sample
 * costs tens of microseconds) by whichever thread asks first, into atomics; a neighbour counts
 * once two samples in a row have seen it, so a short-lived process does not halve the team. Only
 * on Linux, and only when this process may run on every online CPU: with a narrower affinity
 * the others' tasks may be on cores that are not ours, so the answer is all of ours.
 */
#if defined(__linux__)
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#endif

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "internal.h"

#if defined(__linux__) && defined(_OPENMP)

enum { SAMPLE_NS = 100 * 1000 * 1000 };

static atomic_llong next_sample_ns; /* monotonic time of the next sample */
static atomic_int last_others = -1; /* other processes' runnable tasks at the last sample;
                                     * -1 before the first */
static atomic_int free_cores = 1;   /* this process's cores less the others' tasks, at least 1 */
static atomic_int own_cores = 1;    /* this process's cores (its affinity), at the last sample */
static atomic_int free_cores_sure = 1; /* free_cores, but free in the last two samples */

static long long monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* where /proc is: the environment variable PYTFM_PROC_ROOT, read at each sample, lets the
 * tests (tests/kernels/test_busy.py) show the sampling a machine of their making */
static const char *proc_root(void) {
    const char *root = getenv("PYTFM_PROC_ROOT");
    return root && *root ? root : "/proc";
}

/* runnable tasks on the machine, the caller included; -1 when unknown */
static int machine_running(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/loadavg", proc_root());
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int running = -1;
    if (fscanf(f, "%*f %*f %*f %d/%*d", &running) != 1) running = -1;
    fclose(f);
    return running;
}

/* this process's runnable threads, the caller included; -1 when unknown */
static int own_running(void) {
    char tasks[4096];
    snprintf(tasks, sizeof tasks, "%s/self/task", proc_root());
    DIR *dir = opendir(tasks);
    if (!dir) return -1;
    int running = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        char path[4200], line[512];
        snprintf(path, sizeof path, "%s/%.20s/stat", tasks, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* the thread has just exited */
        const size_t n = fread(line, 1, sizeof line - 1, f);
        fclose(f);
        line[n] = '\0';
        const char *close = strrchr(line, ')'); /* "tid (name) S ...": the name may hold ')' */
        if (close && close[1] == ' ' && close[2] == 'R') running++;
    }
    closedir(dir);
    return running;
}

static void sample(void) {
    const int machine = machine_running(), own = own_running();
    int others = machine < 0 || own < 0 ? 0 : machine - own;
    others = others > 0 ? others : 0;
    const int last = atomic_exchange(&last_others, others);
    /* the default: seen twice in a row, a blip is not a neighbour. The first sample is taken
     * as it is: a program's first kernels would otherwise run a full team beside a busy
     * neighbour for the first 100 ms, longer than a short C program's whole prompt takes. An
     * explicit count's cap is the other way round: a core counts as free once two samples in a
     * row have seen it free, so that on a machine whose load comes and goes a team of the
     * count runs only while it stays away (the count's promise is never to be slower than one
     * thread there; a fixed team beside a busy core runs at a tenth of one) */
    const int sure = last > others ? last : others; // (last is -1 before the first sample)
    if (last >= 0) others = PYTFM_MIN(others, last);
    /* this process's cores (its affinity), read here because reading them is a system call;
     * with fewer than all online CPUs the others' tasks may be on cores that are not ours */
    const int cores = omp_get_num_procs();
    const int narrow = cores < sysconf(_SC_NPROCESSORS_ONLN);
    const int free = narrow ? cores : cores - others, free_sure = narrow ? cores : cores - sure;
    atomic_store(&free_cores, free > 1 ? free : 1);
    atomic_store(&free_cores_sure, free_sure > 1 ? free_sure : 1);
    atomic_store(&own_cores, cores > 1 ? cores : 1);
}

/* a new sample when the last is SAMPLE_NS old */
static void resample(void) {
    const long long now = monotonic_ns();
    long long next = atomic_load(&next_sample_ns);
    if (now >= next && atomic_compare_exchange_strong(&next_sample_ns, &next, now + SAMPLE_NS))
        sample();
}

int pytfm__default_threads(void) {
    resample();
    return PYTFM_MIN(omp_get_max_threads(), atomic_load(&free_cores));
}

/* An explicit count gets the default's rule too, within this process's cores: every parallel
 * region ends at a barrier, and a team member on a core another process keeps busy makes the
 * whole team wait for the scheduler to give it that core back (with libgomp's default wait,
 * its teammates spin meanwhile, holding theirs): two threads beside one busy core decoded at a
 * fraction of one thread's speed. The team takes the cores free in the last two samples (for
 * the default count too: a team of it runs once they have stayed free). Above this process's
 * cores the count was asked for as it is (the tests' oversubscribed teams). */
int pytfm__team_threads(void) {
    const int threads = pytfm_get_num_threads();
    if (threads <= 1) return threads;
    resample();
    const int free = atomic_load(&free_cores_sure);
    return threads > atomic_load(&own_cores) ? threads : PYTFM_MIN(threads, free);
}

#elif defined(_OPENMP)

int pytfm__default_threads(void) { return omp_get_max_threads(); }

int pytfm__team_threads(void) { return pytfm_get_num_threads(); }

#else

int pytfm__default_threads(void) { return 1; }

int pytfm__team_threads(void) { return 1; }

#endif
