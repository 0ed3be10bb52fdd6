/*
 * open_tokenizer.c — every folder named on the command line opened by the folder rule
 * (pytfm_tokenizer_open_folder), as a C program gets it. Built against the installed library by
 * tests/c_api/test_c_tokenizer.py and run on the hostile folders of
 * tests/model/tokenizer_cases.py, whose messages Python must give too.
 *
 *   open_tokenizer FOLDER...   one line per folder: "ok <tokens> <merges> <ids of ' the'>" or
 *                              "rejected <errno>: <message>"
 *
 * Exit status 1 when a failure leaves a handle behind or an empty message; 2 for a usage error.
 */
#include <errno.h>
#include <stdio.h>

#include "pytfm.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: open_tokenizer FOLDER...\n");
        return 2;
    }
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        pytfm_tokenizer *tok = (pytfm_tokenizer *)1;
        errno = 0;
        if (pytfm_tokenizer_open_folder(argv[i], &tok) != PYTFM_STATUS_OK) {
            const int err = errno;
            printf("rejected %d: %s\n", err, pytfm_last_error());
            bad |= tok != NULL || !pytfm_last_error()[0];
            continue;
        }
        int32_t ids[8];
        int64_t n = 0;
        if (pytfm_tokenizer_encode(tok, " the", 4, 1, ids, 8, &n) != PYTFM_STATUS_OK) bad = 1;
        printf("ok %lld %lld", (long long)pytfm_tokenizer_vocab_size(tok),
               (long long)pytfm_tokenizer_merge_count(tok));
        for (int64_t k = 0; k < n; k++) printf(" %d", (int)ids[k]);
        printf("\n");
        pytfm_tokenizer_close(tok);
    }
    return bad;
}
