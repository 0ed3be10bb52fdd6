/* A program that uses an installed libpytfm and nothing else: tests/packaging/test_cmake.py builds it
 * through find_package(pytfm) (CMakeLists.txt here: pytfm::pytfm and pytfm::pytfm_static) and
 * through pkg-config, against a CMake install and against pip's pytfm.pc. It checks that the
 * library is the one its header describes, then runs softmax on two rows; it prints what it
 * found and exits non-zero on the first mismatch. */
#include <stdio.h>
#include <string.h>

#include "pytfm.h"

#define STR(x) #x
#define XSTR(x) STR(x)

static int fail(const char *what) {
    fprintf(stderr, "consumer: %s\n", what);
    return 1;
}

int main(void) {
    const char *numbers =
        XSTR(PYTFM_VERSION_MAJOR) "." XSTR(PYTFM_VERSION_MINOR) "." XSTR(PYTFM_VERSION_PATCH);
    if (strcmp(PYTFM_VERSION, numbers) != 0) return fail("PYTFM_VERSION != MAJOR.MINOR.PATCH");
    if (strcmp(pytfm_version(), PYTFM_VERSION) != 0) return fail("pytfm_version() differs");
    if (pytfm_abi_version() != PYTFM_ABI_VERSION) return fail("pytfm_abi_version() differs");
#ifdef EXPECTED_ABI /* the CMake package's pytfm_ABI_VERSION */
    if (EXPECTED_ABI != PYTFM_ABI_VERSION) return fail("pytfm_ABI_VERSION != PYTFM_ABI_VERSION");
#endif

    /* softmax([1, 2, 3]) and a row whose small entries underflow to exactly 0 */
    const float x[6] = {1.0f, 2.0f, 3.0f, -1.0f, 0.0f, 1000.0f};
    const double want[6] = {0.0900305731703805, 0.2447284710547976, 0.6652409557748219, 0, 0, 1};
    float y[6];
    pytfm_status st = pytfm_softmax_forward(y, x, 2, 3);
    if (st != PYTFM_STATUS_OK) {
        fprintf(stderr, "consumer: softmax: %s: %s\n", pytfm_status_string(st), pytfm_last_error());
        return 1;
    }
    for (int i = 0; i < 6; i++) {
        double err = y[i] - want[i];
        if (err > 1e-7 + 1e-6 * want[i] || -err > 1e-7 + 1e-6 * want[i]) {
            fprintf(stderr, "consumer: softmax y[%d] = %.9g, want %.9g\n", i, y[i], want[i]);
            return 1;
        }
    }
    /* a status, not a crash, for a bad argument */
    if (pytfm_softmax_forward(y, x, 2, 0) != PYTFM_STATUS_INVALID_ARGUMENT || !*pytfm_last_error())
        return fail("softmax with cols = 0 is not PYTFM_STATUS_INVALID_ARGUMENT");

    pytfm_build_info info;
    if (pytfm_get_build_info(&info) != PYTFM_STATUS_OK) return fail("pytfm_get_build_info");
    printf("pytfm %s abi %d\n", pytfm_version(), (int)pytfm_abi_version());
    printf("flags: %s\n", info.flags);
    printf("cuda: %d\n", (int)info.cuda);
    printf("softmax ok\n");
    return 0;
}
