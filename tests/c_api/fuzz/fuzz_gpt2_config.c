/*
 * fuzz_gpt2_config.c — libFuzzer target of the GPT-2 folder reader's config.json rules
 * (csrc/model/gpt2.c's pytfm_gpt2_config_parse, on json.c).
 *
 * Each input is parsed as a config.json. Beyond what ASan and UBSan see, the parser's promises
 * are checked and a broken one traps: a status is OK, INVALID_ARGUMENT or OUT_OF_MEMORY; a
 * failure leaves a message naming the source; a config it takes is one GPT-2 has (sizes
 * >= 1, n_embd a multiple of n_head, learned positions) and is taken again, the same, from the
 * same text.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Icsrc/include -Icsrc \
 *       tests/c_api/fuzz/fuzz_gpt2_config.c $(find csrc -name '*.c') -lm -o fuzz_gpt2_config
 * (tests/c_api/test_c_gpt2.py builds and runs it for a bounded time.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pytfm.h"

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pytfm_model_config c, again;
    const char *text = (const char *)data;
    const pytfm_status st = pytfm_gpt2_config_parse(&c, text, (int64_t)size, "config.json");
    EXPECT(st == PYTFM_STATUS_OK || st == PYTFM_STATUS_INVALID_ARGUMENT ||
           st == PYTFM_STATUS_OUT_OF_MEMORY);
    if (st != PYTFM_STATUS_OK) {
        EXPECT(!strncmp(pytfm_last_error(), "config.json: ", 13));
        return 0;
    }
    EXPECT(c.vocab >= 1 && c.d_model >= 1 && c.n_layer >= 1 && c.n_head >= 1 && c.max_seq >= 1);
    EXPECT(c.d_model % c.n_head == 0 && c.pos == PYTFM_POS_LEARNED);
    EXPECT(c.tie_embeddings == 0 || c.tie_embeddings == 1);
    EXPECT(pytfm_gpt2_config_parse(&again, text, (int64_t)size, NULL) == PYTFM_STATUS_OK);
    EXPECT(!memcmp(&c, &again, sizeof c));
    return 0;
}
