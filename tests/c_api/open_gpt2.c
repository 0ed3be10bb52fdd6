/*
 * open_gpt2.c — every folder named on the command line read both ways the GPT-2 folder reader
 * (csrc/model/gpt2.c) offers: pytfm_gpt2_open, its config, and pytfm_gpt2_read into an
 * exactly-sized heap buffer (so that ASan sees a write one float past the end); then
 * pytfm_model_open on the same path. Built with the library sources under ASan and UBSan by
 * tests/c_api/test_c_gpt2.py, on the hostile folders it writes and on good ones. A folder
 * whose model_type is the Llama family's goes to that family's reader in pytfm_model_open
 * (pytfm_folder_arch): both ways refuse it, each in its reader's words.
 *
 *   open_gpt2 FOLDER...   one line per folder, "<path>: ok <n_params>" or "rejected: <message>"
 *
 * Exit status 1 when the two ways disagree (status, or message where both are GPT-2's reader's),
 * when a failure leaves a handle
 * or a model behind, or when a message does not name a file of the folder; 2 for a usage error.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pytfm.h"

/* pytfm_gpt2_open, then every parameter read: the status, *n_params, the message in msg */
static pytfm_status read_folder(const char *path, int64_t *n_params, char *msg, size_t cap) {
    pytfm_gpt2 *g = (pytfm_gpt2 *)1;
    pytfm_status st = pytfm_gpt2_open(&g, path);
    if (st != PYTFM_STATUS_OK) {
        snprintf(msg, cap, "%s", pytfm_last_error());
        return g == NULL ? st : PYTFM_STATUS_INTERNAL; /* a failure leaves no handle */
    }
    pytfm_model_config c;
    st = pytfm_gpt2_get_config(g, &c);
    float *params = st == PYTFM_STATUS_OK ? malloc((size_t)c.n_params * sizeof *params + 1) : NULL;
    if (params) st = pytfm_gpt2_read(g, params, c.n_params);
    if (st != PYTFM_STATUS_OK) snprintf(msg, cap, "%s", pytfm_last_error());
    *n_params = c.n_params;
    free(params);
    pytfm_gpt2_close(g);
    return params ? st : PYTFM_STATUS_OUT_OF_MEMORY;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: open_gpt2 FOLDER...\n");
        return 2;
    }
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        char a[2048] = "", b[2048] = "";
        int64_t n = 0;
        const pytfm_status st = read_folder(argv[i], &n, a, sizeof a);
        pytfm_model *m = (pytfm_model *)1;
        const pytfm_status sm = pytfm_model_open(&m, argv[i], PYTFM_DEVICE_CPU);
        if (sm != PYTFM_STATUS_OK) snprintf(b, sizeof b, "%s", pytfm_last_error());
        int32_t arch = PYTFM_ARCH_GPT;
        pytfm_folder_arch(argv[i], &arch);
        if (st != sm || (arch == PYTFM_ARCH_GPT && strcmp(a, b)) ||
            (sm != PYTFM_STATUS_OK && m != NULL)) {
            printf("%s: the ways disagree: %d '%s' / %d '%s'\n", argv[i], (int)st, a, (int)sm, b);
            bad = 1;
        } else if (st == PYTFM_STATUS_OK) {
            printf("%s: ok %lld\n", argv[i], (long long)n);
        } else {
            printf("rejected: %s\n", a);
            if (strncmp(a, argv[i], strlen(argv[i]))) bad = 1; /* names a file of the folder */
        }
        if (sm == PYTFM_STATUS_OK) pytfm_model_close(m);
    }
    return bad;
}
