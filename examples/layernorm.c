/* A C program that uses libpytfm through its public header: LayerNorm over two rows.
 *
 *   cc examples/layernorm.c $(python -m pytfm --cflags --libs) -o layernorm && ./layernorm
 */
#include <stdio.h>

#include "pytfm.h"

#define ROWS 2
#define COLS 4

int main(void) {
    const float x[ROWS * COLS] = {1.0f, 2.0f, 3.0f, 4.0f, -1.0f, 0.5f, 0.0f, 2.5f};
    const float w[COLS] = {1.0f, 1.0f, 2.0f, 0.5f};
    const float b[COLS] = {0.0f, 0.1f, 0.0f, -0.1f};
    float y[ROWS * COLS], mean[ROWS], rstd[ROWS];

    pytfm_status st = pytfm_layernorm_forward(y, mean, rstd, x, w, b, ROWS, COLS, 1e-5f);
    if (st != PYTFM_STATUS_OK) {
        fprintf(stderr, "layernorm failed: %s: %s\n", pytfm_status_string(st), pytfm_last_error());
        return 1;
    }
    printf("pytfm %s\n", pytfm_version());
    for (int r = 0; r < ROWS; r++) {
        printf("row %d (mean %.6f, rstd %.6f):", r, mean[r], rstd[r]);
        for (int c = 0; c < COLS; c++) printf(" %.6f", y[r * COLS + c]);
        printf("\n");
    }
    return 0;
}
