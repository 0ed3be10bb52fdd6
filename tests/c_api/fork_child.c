/*
 * A C program that forks after its kernels ran on 2 threads (tests/c_api/test_c_fork.py): the
 * child, and a child of the child, must compute the parent's bits instead of waiting forever
 * in libgomp for threads fork() did not copy. Each child gets CHILD_SECONDS; one still running
 * then is killed, and the program says it hung. Exit status 0 when every process agrees.
 * Built against the installed libpytfm, as a user's program is.
 */
#define _POSIX_C_SOURCE 200809L /* fork, waitpid, kill, nanosleep */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "pytfm.h"

enum { ROWS = 256, IN = 256, OUT = 192, CHILD_SECONDS = 60 };

static float x[ROWS * IN], w[OUT * IN], b[OUT], parent_y[ROWS * OUT], y[ROWS * OUT];

/* y = x·wᵀ + b and LayerNorm's forward on it, into y; 0, or 1 with the failure printed */
static int compute(float *out) {
    static float mean[ROWS], rstd[ROWS], ln[ROWS * OUT];
    CHECK(pytfm_linear_forward(out, x, w, b, ROWS, IN, OUT));
    CHECK(pytfm_layernorm_forward(ln, mean, rstd, out, b, b, ROWS, OUT, 1e-5f));
    memcpy(out, ln, sizeof ln);
    return 0;
}

/* compute() in this process, compared with the parent's: 0 when the bits agree */
static int same_as_parent(void) {
    if (compute(y)) return 1;
    if (memcmp(y, parent_y, sizeof y) != 0) {
        fprintf(stderr, "pid %d: other bits than the parent's\n", (int)getpid());
        return 1;
    }
    return 0;
}

/* body() in a forked child -> its exit status; 124 when it ran past CHILD_SECONDS (killed) */
static int in_child(int (*body)(void)) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) _exit(body());
    const struct timespec tick = {0, 10 * 1000 * 1000};
    for (int i = 0; i < CHILD_SECONDS * 100; i++) {
        int status;
        const pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
        nanosleep(&tick, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fprintf(stderr, "pid %d: a child hung (killed after %d s)\n", (int)getpid(), CHILD_SECONDS);
    return 124;
}

static int child(void) {
    if (same_as_parent()) return 1;
    if (pytfm_get_num_threads() != 1) {
        fprintf(stderr, "the child runs %d threads\n", (int)pytfm_get_num_threads());
        return 1;
    }
    return in_child(same_as_parent); /* a grandchild */
}

int main(void) {
    srand(25);
    for (int i = 0; i < ROWS * IN; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < OUT * IN; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < OUT; i++) b[i] = (float)rand() / RAND_MAX;
    CHECK(pytfm_set_num_threads(2));
    if (compute(parent_y)) return 1;
    const int status = in_child(child);
    if (status != 0) return status;
    if (same_as_parent()) return 1; /* the parent keeps its threads and its bits */
    printf("forked children computed the parent's bits (parent on %d threads)\n",
           (int)pytfm_get_num_threads());
    return 0;
}
