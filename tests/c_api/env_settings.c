/* env_settings.c — for test_c_settings.py: the library's two process-wide settings as a C
 * program finds them, which PYTFM_NUM_THREADS and PYTFM_MAX_ISA decide at the first use.
 *   env_settings          prints "threads T isa I", sets 3 threads and no cap, prints again
 *   env_settings first    sets 3 threads and no cap before anything reads them, then prints */
#include <stdio.h>
#include <string.h>

#include "pytfm.h"

static int set(void) {
    return pytfm_set_num_threads(3) != PYTFM_STATUS_OK ||
           pytfm_set_max_isa(PYTFM_ISA_AUTO) != PYTFM_STATUS_OK;
}

static void print(void) {
    printf("threads %d isa %d\n", (int)pytfm_get_num_threads(), (int)pytfm_get_isa());
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "first")) {
        if (set()) return 1;
        print();
        return 0;
    }
    print();
    if (set()) return 1;
    print();
    return 0;
}
