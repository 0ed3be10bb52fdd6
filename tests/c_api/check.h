/* check.h — the C test programs' one error check: a failed pytfm call prints what failed and
 * why (pytfm_last_error) and makes the enclosing function return 1. */
#ifndef PYTFM_TEST_CHECK_H
#define PYTFM_TEST_CHECK_H

#include <stdio.h>

#include "pytfm.h"

#define CHECK(call)                                                                            \
    do {                                                                                       \
        if ((call) != PYTFM_STATUS_OK) {                                                       \
            fprintf(stderr, "%s failed: %s\n", #call, pytfm_last_error());                     \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

#endif
